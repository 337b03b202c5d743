"""The goodput ledger: what a job's run got for its money, kept in its status.

Folded from the history events each status commit adds (``controller.core.accounting.settle``), so every transition
is accounted exactly once, by the pass whose compare-and-swap wins, whichever rule of the
planner or the executor made it. Pure: no I/O, no clock; times are the events' own.

- an **attempt** (``Span``): where, on which model and shape, how many accelerators, when
  it was launched, accepted by Compute (paid from then), RUNNING, and when and why it ended.
  One seen waiting for capacity (a Flex-start VM in PENDING, a queued TPU not given its node:
  the planner's "queued" event) is paid only from when it got capacity ("provisioned", else
  estimated from its RUNNING less a boot): the time before is **waiting**, unbilled;
- a **loss** (``Loss``): a preemption, maintenance, host error, recycle, lost VM or trainer
  failure; its recovery in three parts (the loss itself, when the VM said so; seen by the
  controller; the replacement's insert issued; the replacement RUNNING) and the work lost:
  from the checkpoint the replacement resumed from to the loss;
- **totals**: accelerator-hours paid, and lost to boots and to redone work; hours waited
  for capacity (not paid, not in goodput); Spot cost against the same hours on demand. Old attempts and losses fold into the totals, so the
  status stays small however long the job runs.

Goodput is useful accelerator-time over paid accelerator-time *whose split is known*;
useful is paid less boots and less redone work (time trained past the last save, lost). An
attempt's boot runs from when it was billed to when its trainer started: the time the VM's
agent puts in its records (``trainer_started``, the VM's clock, clamped to the attempt), else
when a pass saw the VM RUNNING. An attempt that ran and ended between two passes with no
record naming its trainer's start has an **unknown split** (``Span.boot_unknown``): its paid
time is counted as paid and as unknown (``unknown_acc_s``), never guessed into boot and
useful, and it is left out of goodput's ratio on both sides; the report says how much.
Waiting for capacity is in neither: nothing is billed for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from controller.core import prices
from controller.core.durations import Instant, measured

if TYPE_CHECKING:
    from controller.core.spec import JobSpec

SPANS_KEPT = 20
LOSSES_KEPT = 20
MARKS_KEPT = 40
# Losses of the platform's making: what the time between losses (M) of the interval advice counts.
PLATFORM_CAUSES = ("preempted", "maintenance", "host error", "lost", "rebooted")
LOSS_CAUSES = (*PLATFORM_CAUSES, "recycled", "failed")
ENDS = ("succeeded", "failed", "cancelled")
_MOVES = ("failover", "step-down", "respec")
MIN_INTERVAL_S, MAX_INTERVAL_S = 60.0, 6 * 3600.0
DEFAULT_BOOT_S = 120.0  # a boot, before the run has seen one: where a queued attempt's capacity came is estimated


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class Span(_Model):
    """One attempt, as it was paid for."""

    attempt: int
    zone: str | None = None
    model: str | None = None  # provisioning model: spot, standard, flex-start
    tpu: bool = False
    accelerators: float = 0.0  # GPUs or TPU chips across the attempt's nodes
    # What it ran on, from the spec it was launched with: what prices it, whatever the spec says later.
    machine_type: str | None = None
    gpus: tuple[str, int] | None = None  # per node: built into the machine type, or attached
    tpu_type: str | None = None
    nodes: int = 1
    per_hour: float = 0.0  # dollars per hour of the whole attempt on its model
    on_demand_per_hour: float = 0.0
    price_source: str = ""
    start: Instant  # committed (the insert issued)
    inserted: Instant | None = None  # Compute accepted it: billing from here, unless it waits for capacity
    queued: Instant | None = None  # seen waiting for capacity (Flex-start PENDING, a queued TPU): unbilled
    capacity: Instant | None = None  # a queued attempt got its capacity: billing from here
    capacity_estimated: bool = False  # not seen between capacity and RUNNING: RUNNING less a boot
    running: Instant | None = None
    # Not seen RUNNING by any pass (it ran and ended between two), yet it ran (a marker, an exit
    # record): RUNNING from its acceptance plus the run's mean boot. (Ledgers written before
    # trainer_started existed; an attempt is now boot_unknown instead.)
    running_estimated: bool = False
    # When its trainer started, by its VM's clock (the agent's records): the end of its boot,
    # whenever a pass saw it RUNNING; clamped to the attempt where the clocks disagree.
    trainer_started: Instant | None = None
    # An image: job's pull of its image, part of the boot (the agent's records, the VM's clock).
    pull_started: Instant | None = None
    pull_ended: Instant | None = None
    # It ran and ended between two passes, and no record said when its trainer started: how its
    # paid time splits into boot and training is unknown, and said so, never guessed.
    boot_unknown: bool = False
    end: Instant | None = None
    cause: str | None = None  # why it ended: a loss cause, or succeeded / failed / cancelled
    resumed_step: int | None = None  # the checkpoint step it started from
    resumed_saved_at: Instant | None = None
    step: int | None = None  # the furthest step its trainer reported (respawnkit's progress, its records)


class Loss(_Model):
    """One attempt lost, and the recovery that followed."""

    attempt: int
    cause: str
    zone: str | None = None
    accelerators: float = 0.0
    lost_at: Instant | None = None  # when the VM said so (its marker), or else Compute recorded it
    seen_at: Instant  # when the controller acted on it
    issued_at: Instant | None = None  # the replacement's insert issued
    running_at: Instant | None = None  # the replacement RUNNING
    redone_s: float | None = None  # training time lost: from the save resumed from to the loss
    resumed_step: int | None = None
    step: int | None = None  # the step the lost attempt had reached, as its trainer reported it
    # Steps to do again: the step reached less the step resumed from (from scratch: 0); None
    # where either is unknown (no progress reported, a checkpoint without a step).
    steps_lost: int | None = None
    # The replacement ran, but when it began is unknown (it ended between two passes, no
    # trainer start recorded): running_at is its end, and no recovery time is claimed.
    recovery_unknown: bool = False

    @property
    def recovery_s(self) -> float | None:
        """From the loss (or its sighting) to the replacement RUNNING."""
        if self.running_at is None or self.recovery_unknown:
            return None
        return (self.running_at - (self.lost_at or self.seen_at)).total_seconds()


class Mark(_Model):
    at: Instant
    kind: str  # stockout, quota, preempted, maintenance, ...
    zone: str | None = None


class Totals(_Model):
    """Every closed attempt and loss of the run, including those no longer kept in detail."""

    attempts: int = 0
    paid_acc_s: float = 0.0  # accelerator-seconds paid (accepted, or given capacity, to end)
    waiting_s: float = 0.0  # wall time attempts waited for capacity, unbilled (accepted to capacity)
    boot_acc_s: float = 0.0  # accepted to the trainer's start (else to RUNNING)
    unknown_acc_s: float = 0.0  # paid to attempts whose split into boot and training is unknown
    redone_acc_s: float = 0.0  # trained past the last save, then lost
    steps_lost: int = 0  # the same in steps, over the losses whose steps are known (Loss.steps_lost)
    running_s: float = 0.0  # wall time RUNNING: the time between losses counts it
    boots: int = 0  # attempts seen going from accepted to RUNNING,
    boot_s: float = 0.0  # and how long that took them, summed (wall time)
    platform_losses: int = 0
    cost: float = 0.0
    on_demand_cost: float = 0.0
    losses: dict[str, dict[str, int]] = Field(default_factory=dict)  # zone -> cause -> count
    stockouts: dict[str, int] = Field(default_factory=dict)  # zone -> capacity errors
    recoveries: int = 0
    recovery_s: float = 0.0  # summed, for the mean
    price_sources: tuple[str, ...] = ()


class Ledger(_Model):
    spans: tuple[Span, ...] = ()
    losses: tuple[Loss, ...] = ()
    marks: tuple[Mark, ...] = ()
    totals: Totals = Totals()
    checkpoint_cost_s: float | None = None  # the latest save's writing time seen (C), from GCS times: a lower bound
    # The latest save's durations as its trainer reported them (respawnkit's progress file):
    # the write that blocks training, which is the checkpoint cost C wherever it is known, and
    # the upload, which runs in the background while training goes on.
    save_s: float | None = None
    upload_s: float | None = None
    checkpoints: tuple[tuple[Instant, int], ...] = ()  # (saved at, step) of each save resumed from
    # The status's event_count through which its events are accounted here. A ledger read
    # without it (written before it existed) is taken as up to date (JobStatus reads it so).
    folded: int = 0
    skipped: int = 0  # events that could not be accounted
    problem: str | None = None  # why, the last time

    @property
    def open(self) -> Span | None:
        return self.spans[-1] if self.spans and self.spans[-1].end is None else None

    @property
    def pending(self) -> Loss | None:
        """The last loss while its replacement is not RUNNING yet."""
        return self.losses[-1] if self.losses and self.losses[-1].running_at is None else None


SAVE_REPORTED, SAVE_FROM_GCS = "reported by the trainer", "from GCS times"


def save_cost(ledger: Ledger) -> tuple[float | None, str | None]:
    """The checkpoint cost C and where it comes from: the trainer's reported write (what blocks
    training), else the GCS-finalize estimate (a lower bound); (None, None) with neither."""
    if ledger.save_s is not None:
        return ledger.save_s, SAVE_REPORTED
    if ledger.checkpoint_cost_s is not None:
        return ledger.checkpoint_cost_s, SAVE_FROM_GCS
    return None, None


def run_costs(ledger: Ledger) -> tuple[float | None, float | None]:
    """The run's own save cost C and mean boot, where it has measured them: what placement weighs
    a zone's uptime with (``controller.core.placement.worths``)."""
    totals = ledger.totals
    save, boot = save_cost(ledger)[0], totals.boot_s / totals.boots if totals.boots > 0 else None
    # Only what a clock could have measured: a hand edit's NaN or negative boot is no cost at all.
    return (save if save is not None and measured(save) else None,
            boot if boot is not None and measured(boot) else None)


def steps_lost(loss: Loss, from_step: int | None) -> int | None:
    """Steps the loss cost: the step it had reached less ``from_step``, the step its replacement
    resumes from (0 from scratch), never negative; None where either is unknown."""
    if loss.step is None or from_step is None:
        return None
    return max(0, loss.step - from_step)


def began_running(ledger: Ledger, at: datetime, estimated: bool = False) -> Ledger:
    """The current attempt RUNNING from ``at``; the recovery of the loss it replaces ends there."""
    span = ledger.open
    assert span is not None
    totals = ledger.totals
    if span.queued is not None and span.capacity is None:
        # Capacity found and RUNNING between two passes: it waited until a boot before RUNNING.
        span = span.model_copy(update={"capacity": max(span.queued, at - _mean_boot(totals)),
                                       "capacity_estimated": True})
    if not estimated and not span.capacity_estimated and (billed := _billed_from(span)) is not None:
        totals = totals.model_copy(update={"boots": totals.boots + 1,
                                           "boot_s": totals.boot_s + max(0.0, (at - billed).total_seconds())})
    ledger = with_current(ledger.model_copy(update={"totals": totals}),
                           span.model_copy(update={"running": at, "running_estimated": estimated}))
    # Every loss this attempt replaces (a replacement lost before it ran leaves its own loss
    # open too): each one's recovery ends here.
    losses = list(ledger.losses)
    for i, loss in enumerate(losses):
        if loss.running_at is None and loss.issued_at is not None and loss.attempt < span.attempt:
            losses[i] = loss.model_copy(update={"running_at": max(at, loss.issued_at)})
            totals = totals.model_copy(update={"recoveries": totals.recoveries + 1,
                                               "recovery_s": totals.recovery_s + (losses[i].recovery_s or 0.0)})
    return ledger.model_copy(update={"losses": tuple(losses), "totals": totals})


def redone_since(ledger: Ledger, loss: Loss, checkpoint: object) -> float | None:
    """Training time the lost attempt did past the save its replacement resumes from."""
    lost = next((s for s in reversed(ledger.spans) if s.attempt == loss.attempt), None)
    if lost is not None and lost.boot_unknown:
        return None  # when it began training is unknown: its whole paid time is counted unknown
    until = loss.lost_at or loss.seen_at
    up = boot_end(lost, lost.end or until) if lost is not None else None
    if up is None:
        return 0.0  # it never trained
    saved = getattr(checkpoint, "saved_at", None)
    began = max(up, saved) if saved is not None else up
    return max(0.0, (until - began).total_seconds())


def close(ledger: Ledger, at: datetime, cause: str, ran: bool = False) -> Ledger:
    """End the current attempt at ``at``; ``ran``: there is evidence its trainer ran. One never
    seen RUNNING ran from its trainer's start where a record gave it; without one, how its paid
    time splits is unknown (``boot_unknown``), never a guessed boot."""
    span = ledger.open
    assert span is not None
    ran = ran or span.trainer_started is not None
    if ran and span.running is None and span.queued is not None and span.capacity is None and at > span.queued:
        # It ran, so it got capacity, when is unseen: from its last sighting waiting (the most it was paid).
        span = span.model_copy(update={"capacity": span.queued, "capacity_estimated": True})
        ledger = with_current(ledger, span)
    if ran and span.running is None and (billed := _billed_from(span)) is not None and at > billed:
        if span.trainer_started is not None:
            ledger = began_running(ledger, min(max(span.trainer_started, billed), at))
        else:
            ledger = _ran_unseen(ledger, at)
        span = ledger.open
        assert span is not None
    end = max(at, span.start)
    done = span.model_copy(update={"end": end, "cause": cause})
    paid, boot, ran, waited, unknown = _times(done, end)
    totals = ledger.totals
    sources = totals.price_sources if done.price_source in totals.price_sources or not paid else (
        *totals.price_sources, done.price_source)
    totals = totals.model_copy(update={
        "attempts": totals.attempts + 1,
        "paid_acc_s": totals.paid_acc_s + paid * span.accelerators,
        "boot_acc_s": totals.boot_acc_s + boot * span.accelerators,
        "unknown_acc_s": totals.unknown_acc_s + unknown * span.accelerators,
        "running_s": totals.running_s + ran,
        "waiting_s": totals.waiting_s + waited,
        "cost": totals.cost + paid / 3600 * span.per_hour,
        "on_demand_cost": totals.on_demand_cost + paid / 3600 * span.on_demand_per_hour,
        "price_sources": sources,
    })
    return ledger.model_copy(update={"spans": (*ledger.spans[:-1], done), "totals": totals})


def _ran_unseen(ledger: Ledger, at: datetime) -> Ledger:
    """The current attempt ran, never seen RUNNING and with no trainer start on record: its boot
    is unknown, and so is when the recoveries it ends were over (closed at ``at``, none claimed)."""
    span = ledger.open
    assert span is not None
    losses = tuple(loss.model_copy(update={"running_at": max(at, loss.issued_at), "recovery_unknown": True})
                   if loss.running_at is None and loss.issued_at is not None and loss.attempt < span.attempt
                   else loss for loss in ledger.losses)
    return with_current(ledger.model_copy(update={"losses": losses}), span.model_copy(update={"boot_unknown": True}))


def boot_end(span: Span, until: datetime) -> datetime | None:
    """When the attempt's boot ended, up to ``until``: its trainer's start (clamped to its billed
    time: the VM's clock and the controller's may disagree), else when a pass saw it RUNNING."""
    billed = _billed_from(span)
    if span.trainer_started is not None and billed is not None:
        return min(max(span.trainer_started, billed), until)
    return min(span.running, until) if span.running else None


def _billed_from(span: Span) -> datetime | None:
    """When Google began billing the attempt: its acceptance, or, where it was seen waiting for
    capacity, when it got some (None while it waits)."""
    return span.capacity if span.queued is not None else span.inserted


def _mean_boot(totals: Totals) -> timedelta:
    return timedelta(seconds=totals.boot_s / totals.boots if totals.boots else DEFAULT_BOOT_S)


def _times(span: Span, until: datetime) -> tuple[float, float, float, float, float]:
    """(paid, booting, running, waiting, unknown) seconds of ``span`` up to ``until``: waiting
    for capacity is not paid (a Flex-start VM in PENDING, a queued TPU is not billed); an
    attempt whose boot is unknown has its paid time unknown, neither boot nor running."""
    if span.inserted is None or until <= span.inserted:
        return 0.0, 0.0, 0.0, 0.0, 0.0
    billed = _billed_from(span)
    waited = ((min(billed, until) if billed else until) - span.inserted).total_seconds() if span.queued else 0.0
    if billed is None or until <= billed:
        return 0.0, 0.0, 0.0, max(0.0, waited), 0.0
    paid = (until - billed).total_seconds()
    if span.boot_unknown:
        return paid, 0.0, 0.0, max(0.0, waited), paid
    up = boot_end(span, until) or until
    boot = max(0.0, (up - billed).total_seconds())
    ran = max(0.0, (until - up).total_seconds())
    return paid, boot, ran, max(0.0, waited), 0.0


def with_mark(ledger: Ledger, mark: Mark) -> Ledger:
    return ledger.model_copy(update={"marks": (*ledger.marks, mark)[-MARKS_KEPT:]})


def with_current(ledger: Ledger, span: Span) -> Ledger:
    return ledger.model_copy(update={"spans": (*ledger.spans[:-1], span)})


def shape_of(spec: JobSpec) -> str:
    """The shape (``prices.shape``) an attempt of ``spec`` runs on, as capacity advice is asked about it."""
    return prices.shape(machine_type=spec.machine_type, gpus=spec.gpus_per_node,
                        tpu_type=spec.tpu.accelerator if spec.tpu else None)


class Summary(_Model):
    """The ledger's totals with the running attempt counted up to ``now``: what a person reads."""

    accelerator_hours: float  # paid: from acceptance, or from capacity for an attempt that waited for it
    waiting_hours: float  # wall time waiting for capacity (Flex-start PENDING, queued TPU): not paid
    boot_hours: float
    redone_hours: float
    useful_hours: float
    steps_lost: int = 0  # over the losses whose steps are known
    steps_lost_each: tuple[int | None, ...] = ()  # each kept loss's, oldest first (None: unknown)
    step: int | None = None  # the furthest step the latest attempt that reported one reached
    # The checkpoint cost C and its source (``save_cost``), and the upload after it, where reported.
    save_s: float | None = None
    save_source: str | None = None
    upload_s: float | None = None
    goodput: float | None  # useful / paid of known split; None before any such was paid
    cost: float
    on_demand_cost: float
    savings: float  # on-demand cost less the cost paid
    losses: int
    recovery_mean_s: float | None
    time_between_losses_s: float | None  # M: RUNNING time per platform loss
    price_sources: tuple[str, ...]
    unknown_hours: float = 0.0  # paid to attempts whose split into boot and training is unknown


def summary(ledger: Ledger, now: datetime) -> Summary:
    """Never raises: a ledger it cannot sum (a hand-written status) sums to nothing known."""
    try:
        return _summary(ledger, now)
    except (TypeError, ValueError, OverflowError, ArithmeticError):
        return Summary(accelerator_hours=0.0, waiting_hours=0.0, boot_hours=0.0, redone_hours=0.0, useful_hours=0.0, goodput=None,
                       cost=0.0, on_demand_cost=0.0, savings=0.0, losses=0, recovery_mean_s=None,
                       time_between_losses_s=None, price_sources=())


def _summary(ledger: Ledger, now: datetime) -> Summary:
    totals = ledger.totals
    paid, boot, redone, unknown = totals.paid_acc_s, totals.boot_acc_s, totals.redone_acc_s, totals.unknown_acc_s
    cost, on_demand, running = totals.cost, totals.on_demand_cost, totals.running_s
    lost_steps = totals.steps_lost
    sources, waiting = totals.price_sources, totals.waiting_s
    if (span := ledger.open) is not None:
        p, b, r, w, u = _times(span, now)
        paid, boot, running = paid + p * span.accelerators, boot + b * span.accelerators, running + r
        unknown += u * span.accelerators
        waiting += w
        cost, on_demand = cost + p / 3600 * span.per_hour, on_demand + p / 3600 * span.on_demand_per_hour
        if p and span.price_source not in sources:
            sources = (*sources, span.price_source)
    known = paid - unknown  # goodput is of the paid time whose split is known
    useful = max(0.0, known - boot - redone)
    losses = sum(sum(c.values()) for c in totals.losses.values())
    return Summary(
        accelerator_hours=paid / 3600, waiting_hours=waiting / 3600, boot_hours=boot / 3600, redone_hours=redone / 3600, useful_hours=useful / 3600,
        goodput=useful / known if known > 1e-9 else None, cost=cost, on_demand_cost=on_demand, savings=on_demand - cost,
        losses=losses, recovery_mean_s=totals.recovery_s / totals.recoveries if totals.recoveries else None,
        time_between_losses_s=running / totals.platform_losses if totals.platform_losses else None,
        price_sources=sources, unknown_hours=unknown / 3600, steps_lost=lost_steps,
        steps_lost_each=tuple(loss.steps_lost for loss in ledger.losses),
        step=next((s.step for s in reversed(ledger.spans) if s.step is not None), None),
        save_s=save_cost(ledger)[0], save_source=save_cost(ledger)[1], upload_s=ledger.upload_s,
    )


class Lifetime(_Model):
    """M, the mean time between the platform's losses, as the run knows it when an attempt is
    launched (``lifetime``): the estimate, its 80 % credible interval, and what it rests on."""

    mean_s: float
    low_s: float
    high_s: float
    losses: int  # the run's own losses of the platform's
    running_s: float  # the run's own RUNNING time they came in
    prior_s: float | None = None  # the advice's estimatedUptime it started from, worth PRIOR_LOSSES
    set_aside: bool = False  # the advice was set aside: the run's losses came far sooner than it said


# The advice's estimatedUptime counts as this many losses of the run's own (a conjugate prior:
# ``lifetime``). With none (M the run's mean from its first loss), one loss set the interval
# alone: in the simulator's model (Weibull k = 0.8, medians 0.5-8 h) the mean goodput given up
# against the best fixed interval was 1.9-9.5 points after one loss and 0.9-2.9 after two; with
# the advice worth two losses, 0.4-0.9 and 0.3-0.7 (python -m sim.interval).
PRIOR_LOSSES = 2
# ... unless the run's own losses are that unlikely under it (a lower-tail probability of the
# prior's predictive, from the third loss on: one or two early losses are common under Spot's
# decreasing hazard, and setting the advice aside on them gave up more than it saved): advice
# off by 30x or 1,000x is set aside at the third loss, where two losses' weight would hold the
# interval near its 6 h ceiling for hundreds of losses.
PRIOR_CONFLICT = 1e-3
CONFLICT_FROM = 3
_Z80 = 1.2815515655446004  # the standard normal's 90th percentile: an 80 % interval's ends


def lifetime(ledger: Ledger, uptime_s: float | None, running_s: float = 0.0) -> Lifetime | None:
    """M, from the run's own losses and the zone's advice; None with neither.

    The losses are taken as a Poisson process of unknown rate with a Gamma prior worth
    ``PRIOR_LOSSES`` losses in ``PRIOR_LOSSES`` × the advice's uptime (Spot VMs' ``estimatedUptime``
    in the zone, Google's best-effort estimate for the majority of them); after ``n`` losses in
    ``T`` seconds RUNNING, the rate's posterior is Gamma(n + w, T + w·U) and
    M = (T + w·U) / (n + w): the advice alone before the first loss, the run's own mean as
    losses accrue. Under the prior, T / (T + w·U) is Beta(n, w): from the third loss on, a run
    whose losses came so soon that this falls below ``PRIOR_CONFLICT`` sets the advice aside
    (``set_aside``). Without advice, or with it set aside, the run's own mean (n ≥ 1). The
    interval is the posterior's 10th to 90th percentile of 1/rate (Wilson-Hilferty's
    approximation of Gamma quantiles). capacityHistory's ``preemptionRate`` is no time at all (of
    the Spot VMs that stopped, the share preempted) and never enters M."""
    prior = uptime_s if uptime_s is not None and math.isfinite(uptime_s) and uptime_s > 0 else None
    ran = ledger.totals.running_s + running_s
    losses = ledger.totals.platform_losses
    conflict = prior is not None and losses >= CONFLICT_FROM and ran >= 0 and \
        _beta_cdf(ran / (ran + PRIOR_LOSSES * prior), losses, PRIOR_LOSSES) < PRIOR_CONFLICT
    weight = PRIOR_LOSSES if prior is not None and not conflict else 0
    shape, rate = losses + weight, ran + weight * (prior or 0.0)
    if shape <= 0 or not math.isfinite(rate) or rate <= 0:
        return None
    return Lifetime(mean_s=rate / shape, low_s=rate / _gamma_quantile(shape, _Z80),
                    high_s=rate / _gamma_quantile(shape, -_Z80), losses=losses, running_s=ran,
                    prior_s=prior if weight else None, set_aside=conflict)


def _beta_cdf(x: float, a: int, b: int) -> float:
    """The regularized incomplete beta I_x(a, b), for whole a and b: P(at least a of a+b-1 trials succeed)."""
    m = a + b - 1
    return sum(math.comb(m, j) * x ** j * (1 - x) ** (m - j) for j in range(a, m + 1))


def _gamma_quantile(shape: float, z: float) -> float:
    """The Gamma(shape, 1) quantile at the standard normal's ``z`` (Wilson-Hilferty)."""
    return max(1e-9, shape * (1 - 1 / (9 * shape) + z / (3 * math.sqrt(shape))) ** 3)


def checkpoint_every(ledger: Ledger, write_s: float | None, uptime_s: float | None,
                     running_s: float = 0.0) -> float | None:
    """Young/Daly's checkpoint interval, τ ≈ √(2·C·M), in seconds; None without a C or an M.

    C: the latest save's write as its trainer reported it (``Ledger.save_s``), else its writing
    time from GCS (``write_s``, else the ledger's): a lower bound
    (``controller.core.checkpoints.write_time``). M: the mean time between the platform's
    losses (``lifetime``: the zone's advice, weighed against the run's own losses)."""
    cost = ledger.save_s if ledger.save_s is not None else write_s if write_s is not None else ledger.checkpoint_cost_s
    if cost is None:
        return None
    cost = max(cost, 1.0)  # a save whose objects all landed within a second: as cheap as saves get
    known = lifetime(ledger, uptime_s, running_s)
    if known is None:
        return None
    return min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, math.sqrt(2 * cost * known.mean_s)))
