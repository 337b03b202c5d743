"""The fleet's figures, as the controller's log entries carry them for Cloud Monitoring.

Two kinds of figures, because Cloud Logging's log-based metrics can read two kinds of entry:

- **what the fleet is now** (a gauge): jobs by phase, accelerators running, goodput, dollars
  spent and what the same hours would have cost on demand, losses and stockouts by zone since
  each run began. The tick adds every job's ledger up once a pass (``figures``) and writes them
  in one entry (``fleet_entry``), plus one small entry per phase (``phase_entries``);
- **what a commit did** (events): each loss, recovery and stockout is counted by the pass whose
  compare-and-swap committed it (``changes``), whichever function ran that pass: the tick, an
  object event or an audit event. Counting them from the tick's before-and-after alone would
  miss the losses the event functions recover between two ticks, which is most of them.

Why entries of their own beside the tick's one entry: a log-based metric reads one number per
entry (a distribution's ``valueExtractor``: ``EXTRACT(jsonPayload.x)``) or counts entries (a
counter), and its labels are extracted from one field each (``labelExtractors``). A map field
such as ``jobs: {"RUNNING": 3}`` can be neither: no extractor takes "each key of a map" as a
label. So each figure a metric is labelled by (phase, zone, cause) is an entry of its own with
the label as a plain field, and every other figure is a plain number in the tick's entry
(``deploy/metrics/*.yaml`` reads them; ``tests/service/test_fleet_metrics.py`` holds the two to
each other). Sizes are bounded by phases, zones and causes, never by jobs: a tick over 10,000
jobs writes one fleet entry of a few KiB and eight phase entries; a commit writes one entry per
loss, recovery or stockout it made.

Pure: statuses in, plain values out; the clock is the caller's.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from controller.core import ledger as ledgers
from controller.core.state import JobStatus, Phase

KIND = "respawn_figures"  # the field every figures entry carries: what a metric's filter selects on
FLEET, PHASE, LOSS, RECOVERY, STOCKOUT = "fleet", "phase", "loss", "recovery", "stockout"
NO_ZONE = "none"  # a loss or a stockout recorded without a zone
LATENCIES_KEPT = 50  # recovery times of one pass listed in the fleet entry (each one has its own entry too)


@dataclass(frozen=True)
class Change:
    """One loss, recovery or stockout a commit made (``kind``: LOSS, RECOVERY, STOCKOUT)."""

    kind: str
    job: str
    zone: str
    cause: str = ""  # a loss's cause (preempted, maintenance, host error, lost, rebooted, recycled, failed)
    attempt: int = 0  # the attempt lost (a recovery: the one it replaced)
    latency_s: float | None = None  # a recovery: from the loss (or its sighting) to the replacement RUNNING


def changes(job: str, before: JobStatus | None, after: JobStatus) -> tuple[Change, ...]:
    """What committing ``after`` over ``before`` (the status it replaced) added to the job's ledger.

    A new run's ledger starts empty: everything in it is this commit's. Each loss is known by
    (attempt, cause, seen), so a commit that changes nothing of the ledger makes no change here."""
    old = before.ledger if before is not None and after.same_run(before) else ledgers.Ledger()
    known = {_key(loss): loss for loss in old.losses}
    found: list[Change] = []
    for loss in after.ledger.losses:
        was = known.get(_key(loss))
        zone = loss.zone or NO_ZONE
        if was is None:
            found.append(Change(LOSS, job, zone, loss.cause, loss.attempt))
        if loss.running_at is not None and (was is None or was.running_at is None):
            found.append(Change(RECOVERY, job, zone, loss.cause, loss.attempt, loss.recovery_s))
    for zone, count in after.ledger.totals.stockouts.items():
        found += [Change(STOCKOUT, job, zone or NO_ZONE)] * max(0, count - old.totals.stockouts.get(zone, 0))
    return tuple(found)


def _key(loss: ledgers.Loss) -> tuple[int, str, datetime]:
    return loss.attempt, loss.cause, loss.seen_at


@dataclass(frozen=True)
class Figures:
    """The fleet as one pass found it, and what that pass's own commits changed."""

    jobs: dict[str, int]  # phase -> jobs, every phase (0 included: a chart falls to 0, not to nothing)
    accelerators_running: float  # GPUs and TPU chips of the RUNNING jobs' current attempts
    accelerator_hours: float  # paid, every job's run so far
    useful_hours: float
    goodput: float | None  # useful over paid hours of known split, over the fleet; None before any
    cost: float  # dollars spent, every job's run so far
    on_demand_cost: float  # what the same hours would have cost on demand
    losses: dict[str, dict[str, int]]  # zone -> cause -> losses, every job's run so far
    stockouts: dict[str, int]  # zone -> capacity errors, every job's run so far
    recoveries: int
    recovery_mean_s: float | None
    unread: int = 0  # jobs the pass could not observe: in no figure
    # This pass's own commits (the event functions' commits are in their own entries only):
    pass_losses: dict[str, dict[str, int]] = field(default_factory=dict)
    pass_stockouts: dict[str, int] = field(default_factory=dict)
    pass_recoveries: int = 0
    pass_recovery_s: tuple[float, ...] = ()  # at most LATENCIES_KEPT, in the order committed
    price_sources: tuple[str, ...] = ()

    @property
    def savings(self) -> float:
        return self.on_demand_cost - self.cost


def figures(statuses: Iterable[JobStatus], now: datetime, made: Sequence[Change] = (), unread: int = 0) -> Figures:
    """Every job's status (the one this pass committed, else the one it read; a job with a spec and
    no status yet as ``JobStatus()``) added up at ``now``; ``made``: the changes this pass committed."""
    tally = Tally(now)
    for st in statuses:
        tally.add(st)
    return tally.figures(made, unread)


class Tally:
    """``figures`` a status at a time: a pass adds each job as it is done with it, holding none."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.phases = Counter({p.value: 0 for p in Phase})
        self.running = self.paid = self.useful = self.known = self.cost = self.on_demand = self.recovery_s = 0.0
        self.recoveries = 0
        self.losses: dict[str, Counter[str]] = defaultdict(Counter)
        self.stockouts: Counter[str] = Counter()
        self.sources: dict[str, None] = {}

    def add(self, st: JobStatus) -> None:
        self.phases[st.phase.value] += 1
        book = st.ledger
        total = ledgers.summary(book, self.now)
        if st.phase == Phase.RUNNING and (span := book.open) is not None:
            self.running += span.accelerators
        self.paid += total.accelerator_hours
        self.useful += total.useful_hours
        self.known += total.accelerator_hours - total.unknown_hours
        self.cost, self.on_demand = self.cost + total.cost, self.on_demand + total.on_demand_cost
        self.recoveries += book.totals.recoveries
        self.recovery_s += book.totals.recovery_s
        for zone, causes in book.totals.losses.items():
            self.losses[zone or NO_ZONE].update(causes)
        self.stockouts.update({zone or NO_ZONE: n for zone, n in book.totals.stockouts.items()})
        self.sources.update(dict.fromkeys(total.price_sources))

    def figures(self, made: Sequence[Change] = (), unread: int = 0) -> Figures:
        pass_losses: dict[str, Counter[str]] = defaultdict(Counter)
        for c in made:
            if c.kind == LOSS:
                pass_losses[c.zone][c.cause] += 1
        latencies = [c.latency_s for c in made if c.kind == RECOVERY and c.latency_s is not None]
        return Figures(
            jobs=dict(self.phases), accelerators_running=self.running, accelerator_hours=self.paid,
            useful_hours=self.useful, goodput=self.useful / self.known if self.known > 1e-9 else None,
            cost=self.cost, on_demand_cost=self.on_demand,
            losses={z: dict(c) for z, c in sorted(self.losses.items())}, stockouts=dict(sorted(self.stockouts.items())),
            recoveries=self.recoveries, recovery_mean_s=self.recovery_s / self.recoveries if self.recoveries else None,
            unread=unread, pass_losses={z: dict(c) for z, c in sorted(pass_losses.items())},
            pass_stockouts=dict(sorted(Counter(c.zone for c in made if c.kind == STOCKOUT).items())),
            pass_recoveries=sum(1 for c in made if c.kind == RECOVERY),
            pass_recovery_s=tuple(round(s, 3) for s in latencies[:LATENCIES_KEPT]), price_sources=tuple(self.sources))


# -- the entries (jsonPayload fields) -------------------------------------------------------------
# Field names are what deploy/metrics/*.yaml extract: renaming one breaks a metric (a test says which).

def fleet_entry(f: Figures) -> dict[str, Any]:
    """The tick's one entry: every figure. Numbers a metric extracts are plain top-level fields
    (``goodput`` only where known: a metric skips an entry without it, never reads a 0)."""
    return {
        KIND: FLEET,
        "jobs": sum(f.jobs.values()), "jobs_by_phase": f.jobs, "jobs_unread": f.unread,
        "accelerators_running": f.accelerators_running,
        "accelerator_hours": round(f.accelerator_hours, 4), "useful_hours": round(f.useful_hours, 4),
        **({"goodput": round(f.goodput, 6)} if f.goodput is not None else {}),
        "cost_dollars": round(f.cost, 4), "on_demand_dollars": round(f.on_demand_cost, 4),
        "saved_dollars": round(f.savings, 4), "price_sources": list(f.price_sources),
        "losses_by_zone": f.losses, "stockouts_by_zone": f.stockouts,
        "recoveries": f.recoveries,
        **({"recovery_mean_s": round(f.recovery_mean_s, 3)} if f.recovery_mean_s is not None else {}),
        "pass": {"losses_by_zone": f.pass_losses, "stockouts_by_zone": f.pass_stockouts,
                 "recoveries": f.pass_recoveries, "recovery_s": list(f.pass_recovery_s)},
    }


def phase_entries(f: Figures) -> list[dict[str, Any]]:
    """One entry per phase, its count a plain number: what ``respawn_jobs`` reads, labelled by phase."""
    return [{KIND: PHASE, "phase": phase, "jobs": count} for phase, count in f.jobs.items()]


def change_entry(c: Change) -> dict[str, Any]:
    """One loss, recovery or stockout: ``respawn_losses`` and ``respawn_stockouts`` count them by zone
    (and cause); ``respawn_recovery_seconds`` reads a recovery's ``latency_s`` (absent where unknown)."""
    entry: dict[str, Any] = {KIND: c.kind, "job": c.job, "zone": c.zone}
    if c.kind != STOCKOUT:
        entry.update(cause=c.cause, attempt=c.attempt)
    if c.kind == RECOVERY and c.latency_s is not None:
        entry["latency_s"] = round(c.latency_s, 3)
    return entry
