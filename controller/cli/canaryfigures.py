"""What ``respawn canary`` makes of what it saw: each preemption's spans, their summaries, the
table it prints and the file it writes. Pure: the times come in, figures come out
(``controller.cli.canary`` gathers them).

Every span is between two times of one source wherever one gives both (Compute's operations and
instance timestamps, GCS's object times, Cloud Logging's entries); the VM agent's own times
(a record's ``at``, ``trainer_started``, ``waiting_since``) are the VM's clock, which Compute keeps
in step with Google's. Only STOPPING and TERMINATED as the canary's polls saw them are this
machine's clock, each against the other.

The file is what ``localcloud.realism.costs_from`` reads: its ``costs`` replace the realism
model's assumptions (``insert_running``, ``poweroff_after_marker``), each a lognormal fitted to
the samples; its ``figures`` and ``preemptions`` keep the rest, to compare with the bench's.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

VERSION = 1
Z99 = 2.3263  # a normal's 99th percentile: a lognormal's p99 is its median * exp(Z99 * sigma)


@dataclass
class Vm:
    """One VM of a canary job, as Compute and its agent told of it."""

    name: str
    zone: str
    inserted: datetime | None = None  # its insert operation's insertTime (Compute received it)
    running: datetime | None = None  # lastStartTimestamp
    agent: datetime | None = None  # its agent's first record: the trainer's start, or the line's wait


@dataclass
class Preemption:
    """One canary job: its VM preempted by simulateMaintenanceEvent, and the standby after it."""

    job: str
    first: Vm
    standby: Vm | None = None
    notice_s: int | None = None  # the notice the controller asked for (its status)
    simulated: datetime | None = None  # the simulateMaintenanceEvent operation's insertTime
    preempted: datetime | None = None  # the notice record's "at": when the agent saw instance/preempted
    recorded: datetime | None = None  # the notice record's GCS time
    decided: datetime | None = None  # the status's "standby" event: the pass that launched it
    soft_off: datetime | None = None  # the compute.instances.preempted operation's insertTime
    stopping_seen: float | None = None  # this machine's clock (time.time()): the first poll that saw it down
    terminated_seen: float | None = None  # ... TERMINATED
    terminated: datetime | None = None  # lastStopTimestamp, read while TERMINATED (before the VM is deleted)
    marker: datetime | None = None  # the shutdown script's marker, its GCS time
    audit_at: datetime | None = None  # the System Event entry's timestamp, as on_audit logged it
    audit_handled: datetime | None = None  # on_audit's "audit event handled" entry's timestamp
    notes: list[str] = field(default_factory=list)  # what could not be seen, and why
    cut_short: bool = False  # the watch ended (its bound, or the job's end) before all was seen

    @property
    def timed(self) -> bool:
        """Preempted, recorded and stood in for, and watched to the end: timed as the canary means to
        (a figure may still be missing, said in ``notes``: a VM deleted before TERMINATED was seen)."""
        return not self.cut_short and self.recorded is not None and self.standby is not None

    @property
    def vms(self) -> tuple[Vm, ...]:
        return (self.first, *((self.standby,) if self.standby else ()))


def span(start: datetime | float | None, end: datetime | float | None) -> float | None:
    if start is None or end is None:
        return None
    if isinstance(start, datetime) and isinstance(end, datetime):
        return (end - start).total_seconds()
    if isinstance(start, float) and isinstance(end, float):
        return end - start
    raise TypeError("a span is between two times of one clock")


@dataclass(frozen=True)
class Figure:
    key: str
    label: str  # as the table says it (at most 34 characters)
    of: Callable[[Preemption], list[float | None]]
    cost: str | None = None  # the localcloud.realism.Costs field it stands for, if one does


def _one(start: Callable[[Preemption], Any], end: Callable[[Preemption], Any]) -> Callable[[Preemption], list[float | None]]:
    return lambda p: [span(start(p), end(p))]


def _each_vm(start: Callable[[Vm], Any], end: Callable[[Vm], Any]) -> Callable[[Preemption], list[float | None]]:
    return lambda p: [span(start(vm), end(vm)) for vm in p.vms]


def _standby_inserted(p: Preemption) -> datetime | None:
    return p.standby.inserted if p.standby else None


def _stopping_to_terminated(p: Preemption) -> float | None:
    """Compute's times (the preemption's operation, lastStopTimestamp), else the polls' own."""
    if p.soft_off is not None and p.terminated is not None:
        return span(p.soft_off, p.terminated)
    return span(p.stopping_seen, p.terminated_seen)


FIGURES = (
    Figure("notice_to_preempted_s", "notice → instance/preempted", _one(lambda p: p.simulated, lambda p: p.preempted)),
    Figure("preempted_to_record_s", "instance/preempted → notice record",
           _one(lambda p: p.preempted, lambda p: p.recorded)),
    Figure("record_to_standby_s", "notice record → standby decided", _one(lambda p: p.recorded, lambda p: p.decided)),
    Figure("record_to_insert_s", "notice record → standby insert", _one(lambda p: p.recorded, _standby_inserted)),
    Figure("notice_to_insert_s", "notice → standby insert (in all)", _one(lambda p: p.simulated, _standby_inserted)),
    Figure("notice_to_soft_off_s", "notice → soft-off (STOPPING)", _one(lambda p: p.simulated, lambda p: p.soft_off)),
    Figure("stopping_to_terminated_s", "STOPPING → TERMINATED", lambda p: [_stopping_to_terminated(p)]),
    Figure("marker_to_terminated_s", "marker → TERMINATED (guest halt)",
           _one(lambda p: p.marker, lambda p: p.terminated), cost="poweroff_after_marker"),
    Figure("insert_to_running_s", "insert → RUNNING", _each_vm(lambda vm: vm.inserted, lambda vm: vm.running),
           cost="insert_running"),
    Figure("running_to_agent_s", "RUNNING → agent started", _each_vm(lambda vm: vm.running, lambda vm: vm.agent)),
    Figure("audit_to_handled_s", "System Event → on_audit handled",
           _one(lambda p: p.audit_at, lambda p: p.audit_handled)),
)


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    p99: float  # of a lognormal fitted to the samples (their largest when one is not positive, or alone)
    max: float

    def as_dict(self) -> dict[str, Any]:
        return {"n": self.n, "median": _r(self.median), "p99": _r(self.p99), "max": _r(self.max)}


def summary(samples: Sequence[float]) -> Summary | None:
    """The samples' median and largest, and the p99 of a lognormal fitted to them (their logs'
    mean and standard deviation): with a few VMs a p99 is an extrapolation, said as such. A
    sample that is not positive (two clocks a few ms apart) fits no lognormal: the largest then."""
    if not samples:
        return None
    median, top = statistics.median(samples), max(samples)
    if len(samples) < 2 or min(samples) <= 0:
        return Summary(len(samples), median, top, top)
    logs = [math.log(x) for x in samples]
    fitted = math.exp(statistics.fmean(logs) + Z99 * statistics.stdev(logs))
    return Summary(len(samples), median, max(fitted, median), top)


def samples(preemptions: Sequence[Preemption], figure: Figure) -> list[float]:
    return [x for p in preemptions for x in figure.of(p) if x is not None]


def summaries(preemptions: Sequence[Preemption]) -> dict[str, Summary | None]:
    return {f.key: summary(samples(preemptions, f)) for f in FIGURES}


def document(preemptions: Sequence[Preemption], *, project: str, zones: Sequence[str], machine_type: str,
             taken_at: datetime) -> dict[str, Any]:
    """The file: ``costs`` (what ``localcloud.realism.costs_from`` reads), ``figures`` (each
    figure's summary, or null when nothing was measured) and each preemption's own spans."""
    sums = summaries(preemptions)
    costs = {f.cost: {"median": _r(s.median), "p99": _r(s.p99)}
             for f in FIGURES if f.cost and (s := sums[f.key]) is not None and s.median > 0}
    notices = sorted({p.notice_s for p in preemptions if p.notice_s is not None})
    return {
        "respawn_canary": VERSION,
        "taken_at": taken_at.isoformat(),
        "project": project,
        "zones": list(zones),
        "machine_type": machine_type,
        "notice_s": notices[0] if len(notices) == 1 else notices,
        "costs": costs,
        "figures": {k: (s.as_dict() if s else None) for k, s in sums.items()},
        "preemptions": [_row(p) for p in preemptions],
    }


def _row(p: Preemption) -> dict[str, Any]:
    spans: dict[str, Any] = {}
    for f in FIGURES:
        values = [None if x is None else _r(x) for x in f.of(p)]
        spans[f.key] = values if len(values) > 1 else values[0]
    return {"job": p.job, "instance": p.first.name, "zone": p.first.zone,
            "standby": p.standby.name if p.standby else None, "standby_zone": p.standby.zone if p.standby else None,
            "notice_s": p.notice_s, "timed": p.timed, "spans": spans, "notes": list(p.notes)}


def table_rows(preemptions: Sequence[Preemption]) -> list[tuple[str, str, str, str, str]]:
    """(figure, n, median, p99, max) per figure; "—" where nothing was measured."""
    rows = []
    for f in FIGURES:
        s = summary(samples(preemptions, f))
        rows.append((f.label, str(s.n), _s(s.median), _s(s.p99), _s(s.max)) if s else (f.label, "0", "—", "—", "—"))
    return rows


def _s(seconds: float) -> str:
    return f"{seconds:.1f} s" if abs(seconds) >= 10 else f"{seconds:.2f} s"


def _r(seconds: float) -> float:
    return round(seconds, 3)
