"""The goodput ledger's bookkeeping: a status's history events folded into its ledger
(``controller.core.ledger``), each exactly once, by the pass whose compare-and-swap wins.

Above both the ledger and the status (it reads a ``JobStatus`` and writes its ``Ledger``),
so that neither of those two imports the other. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from controller.core import prices
from controller.core.world import MAX_REPORTED_S, MAX_STEP
from controller.core.ledger import (
    ENDS, LOSS_CAUSES, LOSSES_KEPT, PLATFORM_CAUSES, SPANS_KEPT, Ledger, Loss, Mark, Span,
    began_running, close, redone_since, steps_lost, with_current, with_mark,
)

if TYPE_CHECKING:
    from controller.core.spec import JobSpec
    from controller.core.state import Event, JobStatus


def settle(status: JobStatus, spec: JobSpec | None) -> JobStatus:
    """``status`` with its ledger brought up to date with its own history."""
    book = catch_up(status, spec)
    return status if book == status.ledger else status.model_copy(update={"ledger": book})


def catch_up(status: JobStatus, spec: JobSpec | None) -> Ledger:
    """The status's ledger with the events it has not accounted yet (those after ``folded``)
    folded in. A pure function of the events: a status derived from a stale copy (the
    planner's, behind a commit of the same chain) folds the same events to the same ledger.

    Accounting is never worth a recovery: events it cannot fold (a hand-edited status with a
    date without a time zone...) are skipped, and the ledger says so (``skipped``)."""
    book = status.ledger
    fresh = min(status.event_count - book.folded, len(status.history))
    if fresh <= 0:  # nothing new, or a status whose count went back (hand-edited, rolled back)
        return book if book.folded == status.event_count else book.model_copy(update={"folded": status.event_count})
    try:
        book = account(book, status.history[len(status.history) - fresh:], status, spec)
    except Exception as e:  # noqa: BLE001 - a bug or a hostile status: its accounting, not the job, pays
        book = book.model_copy(update={"skipped": book.skipped + fresh,
                                       "problem": f"{type(e).__name__}: {e}"[:200]})
    return book.model_copy(update={"folded": status.event_count})


def account(ledger: Ledger, events: Sequence[Event], status: JobStatus, spec: JobSpec | None) -> Ledger:
    """Fold ``events`` (those one commit adds, in order) into ``ledger``; ``status``: as committed."""
    for e in events:
        ledger = _one(ledger, e, status, spec)
    if (open_ := ledger.open) is not None and open_.attempt == status.attempt and open_.inserted is None:
        # Not created yet: the attempt goes where, and on what, the status says now.
        if (open_.zone, open_.model) != (status.zone, status.provisioning):
            ledger = with_current(ledger, _priced(open_.model_copy(update={"zone": status.zone,
                                                                             "model": status.provisioning}), status, spec))
    return ledger


def _one(ledger: Ledger, e: Event, status: JobStatus, spec: JobSpec | None) -> Ledger:
    name = e.event
    if e.trainer_started is not None and (open_ := ledger.open) is not None and open_.attempt == e.attempt \
            and open_.trainer_started is None:
        # The VM's agent said when its trainer started (a heartbeat, a marker, an exit record):
        # the end of the attempt's boot, whenever a pass saw it RUNNING.
        ledger = with_current(ledger, open_.model_copy(update={"trainer_started": e.trainer_started}))
    if (open_ := ledger.open) is not None and open_.attempt == e.attempt:
        ledger = _reported(ledger, open_, e)
    if name in ("launch", "adopted"):
        if name == "adopted" and ledger.open is not None and ledger.open.attempt == status.attempt:
            # Found where it is (another zone, maybe), and accepted: priced there.
            found = ledger.open.model_copy(update={"inserted": ledger.open.inserted or e.at, "zone": status.zone,
                                                   "model": status.provisioning})
            return with_current(ledger, _priced(found, status, spec))
        return _launched(ledger, e, status, spec)
    if name == "inserted" and (open_ := ledger.open) is not None:
        inserted = open_.model_copy(update={"inserted": open_.inserted or e.at})
        if open_.attempt == status.attempt and status.zone and (status.zone, status.provisioning) != (open_.zone, open_.model):
            # Accepted where a failover took it (the span was opened where the first create was
            # tried): the zone, the model and their price are the accepted ones.
            inserted = _priced(inserted.model_copy(update={"zone": status.zone, "model": status.provisioning}),
                               status, spec)
        return with_current(ledger, inserted)
    if name == "running" and (open_ := ledger.open) is not None and open_.running is None:
        return began_running(ledger, e.at)
    if name == "queued" and (open_ := ledger.open) is not None and open_.queued is None and open_.running is None:
        return with_current(ledger, open_.model_copy(update={"queued": e.at}))
    if name == "provisioned" and (open_ := ledger.open) is not None and open_.queued and open_.capacity is None:
        return with_current(ledger, open_.model_copy(update={"capacity": max(e.at, open_.queued)}))
    if name == "standby-withdrawn":
        return _withdrawn(ledger, e)
    if name in ("stockout", "quota"):
        totals = ledger.totals
        if name == "stockout" and e.zone:
            totals = totals.model_copy(update={"stockouts": {**totals.stockouts,
                                                             e.zone: totals.stockouts.get(e.zone, 0) + 1}})
        return with_mark(ledger.model_copy(update={"totals": totals}), Mark(at=e.at, kind=name, zone=e.zone))
    ended = name in ENDS and (name != "failed" or status.phase == "FAILED")
    if name in LOSS_CAUSES and not ended:
        return _lost(ledger, e, name)
    if ended:
        # An exit record (the event's ``since``: when the VM wrote it) says the trainer ran,
        # seen RUNNING or not; a deadline, a budget or a cancel says nothing of the kind.
        return close(ledger, e.at, name, ran=e.since is not None) if ledger.open is not None else ledger
    return ledger


def _reported(ledger: Ledger, span: Span, e: Event) -> Ledger:
    """What the attempt's trainer reported, carried by an event of that attempt (the planner takes
    it from the attempt's own records only): its furthest step on its span, its latest save's
    durations on the ledger. Written by third-party code: only sane figures count."""
    if e.step is not None and 0 <= e.step <= MAX_STEP and (span.step is None or e.step > span.step):
        span = span.model_copy(update={"step": e.step})
        ledger = with_current(ledger, span)
    if span.pull_started is None and e.pull_started is not None and e.pull_ended is not None \
            and e.pull_started <= e.pull_ended:  # the image's pull, once: by the VM's clock, as its trainer's start
        ledger = with_current(ledger, span.model_copy(update={"pull_started": e.pull_started,
                                                              "pull_ended": e.pull_ended}))
    sane = {name: value for name in ("save_s", "upload_s")
            if isinstance(value := getattr(e, name), float | int) and math.isfinite(value) and 0 <= value <= MAX_REPORTED_S}
    return ledger.model_copy(update=sane) if sane else ledger


def _launched(ledger: Ledger, e: Event, status: JobStatus, spec: JobSpec | None) -> Ledger:
    if (open_ := ledger.open) is not None and open_.attempt == status.attempt and open_.inserted is None \
            and open_.running is None and open_.queued is None:
        # The same attempt launched again (its create was refused: a stockout, a quota): the refused
        # create was never a VM, nor billed; it is no attempt of its own ("ran for 0.0048s").
        ledger = ledger.model_copy(update={"spans": ledger.spans[:-1]})
    if ledger.open is not None:  # adopted past it (another pass's attempt): this one ended unseen
        ledger = close(ledger, e.at, "replaced")
    checkpoint = status.resume_from
    # A standby given the go was launched at the notice, and billed since Compute accepted it (``since``).
    since = e.since if e.since is not None and e.since <= e.at else None
    span = _priced(Span(attempt=status.attempt, zone=status.zone, model=status.provisioning, tpu=status.attempt_tpu,
                        start=since or e.at, inserted=e.at if e.event == "adopted" else since,
                        resumed_step=checkpoint.step if checkpoint else None,
                        resumed_saved_at=checkpoint.saved_at if checkpoint else None), status, spec)
    updates: dict[str, object] = {"spans": (*ledger.spans, span)[-SPANS_KEPT:]}
    if checkpoint is not None and checkpoint.saved_at is not None and checkpoint.step is not None:
        point = (checkpoint.saved_at, checkpoint.step)
        if point not in ledger.checkpoints:
            updates["checkpoints"] = (*ledger.checkpoints, point)[-SPANS_KEPT:]
    if checkpoint is not None and checkpoint.write_s is not None:
        updates["checkpoint_cost_s"] = checkpoint.write_s
    if (loss := ledger.pending) is not None and loss.issued_at is None:
        redone = redone_since(ledger, loss, checkpoint)
        steps = steps_lost(loss, checkpoint.step if checkpoint else 0)
        done = loss.model_copy(update={"issued_at": e.at, "redone_s": redone, "steps_lost": steps,
                                       "resumed_step": checkpoint.step if checkpoint else None})
        updates["losses"] = (*ledger.losses[:-1], done)
        totals = ledger.totals
        updates["totals"] = totals.model_copy(update={"redone_acc_s": totals.redone_acc_s + (redone or 0.0) * loss.accelerators,
                                                      "steps_lost": totals.steps_lost + (steps or 0)})
    return ledger.model_copy(update=updates)


def _lost(ledger: Ledger, e: Event, cause: str) -> Ledger:
    open_ = ledger.open
    if open_ is None:
        return ledger  # a restart decided before the attempt was ever launched (hand-edited)
    told = e.since if e.since and e.since <= e.at else None
    # A marker (``since``) is written by the VM's agent while its trainer runs; Compute's record
    # of a loss no VM told of (``recorded``) says when, not that the trainer ran.
    lost_at = told or (e.recorded if e.recorded and e.recorded <= e.at else None)
    ledger = close(ledger, lost_at or e.at, cause, ran=told is not None)
    totals = ledger.totals
    zone = open_.zone or "?"
    by_zone = {**totals.losses, zone: {**totals.losses.get(zone, {}), cause: totals.losses.get(zone, {}).get(cause, 0) + 1}}
    platform = totals.platform_losses + (cause in PLATFORM_CAUSES)
    loss = Loss(attempt=open_.attempt, cause=cause, zone=open_.zone, accelerators=open_.accelerators,
                lost_at=lost_at, seen_at=e.at, step=open_.step)
    ledger = ledger.model_copy(update={"losses": (*ledger.losses, loss)[-LOSSES_KEPT:],
                                       "totals": totals.model_copy(update={"losses": by_zone,
                                                                           "platform_losses": platform})})
    return with_mark(ledger, Mark(at=lost_at or e.at, kind=cause, zone=open_.zone))


def _withdrawn(ledger: Ledger, e: Event) -> Ledger:
    """A standby given up before its go: its VMs were billed from Compute's acceptance (``since``)
    to now, for no training at all: paid, all of it boot, priced as the attempt it stood beside."""
    open_ = ledger.open
    if open_ is None or e.since is None or e.since > e.at:
        return ledger
    paid = (e.at - e.since).total_seconds()
    totals = ledger.totals
    return ledger.model_copy(update={"totals": totals.model_copy(update={
        "paid_acc_s": totals.paid_acc_s + paid * open_.accelerators,
        "boot_acc_s": totals.boot_acc_s + paid * open_.accelerators,
        "cost": totals.cost + paid / 3600 * open_.per_hour,
        "on_demand_cost": totals.on_demand_cost + paid / 3600 * open_.on_demand_per_hour,
    })})


def _priced(span: Span, status: JobStatus, spec: JobSpec | None) -> Span:
    """``span`` priced by the shape it runs on: the spec's at its launch (kept on the span, so that a
    later spec never reprices it), on its model, in its zone. Capacity advice's Spot price counts
    only where the advice was asked for that very shape (``ZoneScore.shape``)."""
    if spec is None:
        return span
    if span.machine_type is None and span.tpu_type is None:  # a fresh attempt: the spec it is launched with
        span = span.model_copy(update={"machine_type": spec.machine_type, "gpus": spec.gpus_per_node,
                                       "tpu_type": spec.tpu.accelerator if spec.tpu else None,
                                       "nodes": 1 if spec.tpu else spec.nodes})
    score = status.zone_advice.get(span.zone or "")
    shape = prices.shape(machine_type=span.machine_type, gpus=span.gpus, tpu_type=span.tpu_type)
    rate = prices.rate(model=span.model or spec.provisioning[0], nodes=span.nodes, gpus=span.gpus,
                       machine_type=span.machine_type, tpu_type=span.tpu_type,
                       override=dict(spec.policy.prices) if spec.policy.prices else None,
                       spot_price=score.spot_price_h if score and score.shape == shape else None)
    # A machine without accelerators counts its VMs: goodput is then of VM-hours.
    units = rate.accelerators or float(span.nodes)
    return span.model_copy(update={"accelerators": units, "per_hour": rate.per_hour,
                                   "on_demand_per_hour": rate.on_demand_per_hour, "price_source": rate.source})


