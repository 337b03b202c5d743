"""A run's summary (``controller.core.runs.RunSummary``) read from its status: what the status keeps
of a run once the next one begins, and what ``respawn history`` shows of the current one.

Above both the ledger and the status (it reads a ``JobStatus`` and its ``Ledger``), as
``accounting`` is. Pure: no I/O, no clock; ``now`` is passed in.
"""

from __future__ import annotations

from datetime import datetime

from controller.core import ledger
from controller.core.runs import RunSummary, kept
from controller.core.state import CheckpointRef, JobStatus


def ended_at(status: JobStatus) -> datetime | None:
    """When a finished run ended: its last event naming its phase (``succeeded``...)."""
    if not status.phase.terminal:
        return None
    end = status.phase.lower()
    return next((e.at for e in reversed(status.history) if e.event == end), None)


def summary_of(status: JobStatus, now: datetime, last: CheckpointRef | None = None) -> RunSummary:
    """The run ``status`` holds, summed up to its end (or ``now`` while it goes on); ``last``: its
    latest complete checkpoint where a listing found it, else the one its last attempt resumed from."""
    ended = ended_at(status)
    book = ledger.summary(status.ledger, ended or now)
    point = last or status.resume_from
    return RunSummary(
        run=status.run or "?", started=status.created_at, ended=ended, phase=str(status.phase),
        message=status.message[:300], attempts=attempts(status), preemptions=status.preemptions, failures=status.failures,
        accelerator_hours=book.accelerator_hours, goodput=book.goodput, cost=book.cost,
        on_demand_cost=book.on_demand_cost, checkpoints=status.checkpoint_uri,
        checkpoint=point.uri if point else None, checkpoint_step=point.step if point else None,
        checkpoint_tag=point.tag if point else None, fresh=status.fresh)


def attempts(status: JobStatus) -> int:
    """How many attempts the run launched: its attempt numbers continue the run before's, so they
    count from its "accepted" event; a run whose history no longer holds that event, by its ledger."""
    if (began := status.accepted) is not None:
        return max(0, status.attempt - began.attempt)
    book = status.ledger
    return book.totals.attempts + (1 if book.open is not None else 0)


def archived(prev: JobStatus | None, now: datetime, last: CheckpointRef | None = None) -> tuple[RunSummary, ...]:
    """The past runs a new run's status keeps: ``prev``'s own, and ``prev`` itself once it ran
    or ended (a status with no run in it, a bare placeholder, adds nothing)."""
    if prev is None:
        return ()
    if prev.created_at is None and not prev.phase.terminal:
        return prev.runs
    return kept(prev.runs, summary_of(prev, now, last))
