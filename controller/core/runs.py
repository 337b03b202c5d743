"""A job's runs: each one's id, where its checkpoints go, and the summary kept of a past one.

A job name is reused: a spec written over a finished (or cancelled) run starts a new run of
the same job (``transitions.new_run``). Each run has an id, the UTC time it began
(``20261127-191742``): stable (it is in its status, written once by compare-and-swap), sortable,
and unique for a job name even after ``respawn rm`` forgot every earlier one.

A new run resumes from the previous run's latest checkpoint, unless its spec says
``checkpoint.fresh``: then its checkpoints go under a prefix of its own,
``<checkpoint.uri>/runs/<job>/<run id>/``, given to its trainer as ``RESPAWN_CHECKPOINT_URI`` and the
only place the controller looks for ``RESUME_FROM``, at every attempt of that run. Nothing is
deleted or moved: the older checkpoints stay where they were. A later run that is not fresh
goes on from where the last run's checkpoints are (its prefix is inherited), so "resume" always
means "from the run before".

The summary of a past run is small and the list of them bounded (``RUNS_KEPT``), like the
ledger's spans: the status stays small however often a job is run again.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from controller.core.durations import Instant

RUNS_KEPT = 20  # past runs remembered in a status, the newest
RUNS_DIR = "runs"  # <checkpoint.uri>/runs/<job>/<run id>/: a fresh run's own checkpoints


def run_id(began: datetime) -> str:
    """The id of a run that began at ``began`` (UTC)."""
    return f"{began:%Y%m%d-%H%M%S}"


def unique_id(began: datetime, taken: set[str | None]) -> str:
    """``run_id(began)``, or with ``-2``, ``-3``... where an earlier run of the job began in the same
    second (a spec refused at once, then a corrected one): a fresh prefix is never an earlier run's."""
    base = run = run_id(began)
    count = 1
    while run in taken:
        count += 1
        run = f"{base}-{count}"
    return run


def fresh_root(uri: str, job: str, run: str) -> str:
    """Where a fresh run's checkpoints go: a prefix of its own under the spec's, named by its job
    too (jobs of a sweep share a ``checkpoint.uri`` and may begin in the same second)."""
    return f"{uri.rstrip('/')}/{RUNS_DIR}/{job}/{run}/"


def checkpoint_root(spec_uri: str, own: str | None) -> str:
    """Where a run's checkpoints are: its own prefix (``own``, a fresh run's or one it inherited)
    while that is under the spec's ``checkpoint.uri``; the spec's otherwise (a spec that moved its
    checkpoints elsewhere is followed, never a prefix it no longer names)."""
    if own and own.startswith(f"{spec_uri.rstrip('/')}/{RUNS_DIR}/"):
        return own
    return spec_uri


class RunSummary(BaseModel):
    """What is kept of a run once another began: enough for ``respawn history``."""

    model_config = ConfigDict(frozen=True)

    run: str
    started: Instant | None = None
    ended: Instant | None = None
    phase: str  # how it ended: SUCCEEDED, FAILED, CANCELLED (or where it stood, for the current run)
    message: str = ""  # why, in words (its last message)
    attempts: int = 0
    preemptions: int = 0
    failures: int = 0
    accelerator_hours: float = 0.0
    goodput: float | None = None  # useful / paid accelerator-time; None when nothing was paid
    cost: float = 0.0
    on_demand_cost: float = 0.0
    checkpoints: str | None = None  # the prefix its checkpoints went under
    checkpoint: str | None = None  # its latest complete checkpoint, as far as known
    checkpoint_step: int | None = None
    checkpoint_tag: str | None = None
    fresh: bool = False  # it began with no checkpoint of an earlier run

    @property
    def checkpoint_label(self) -> str | None:
        """``step 809``, a tag, or the save's name; None when it had none."""
        if self.checkpoint_step is not None:
            return f"step {self.checkpoint_step}"
        if self.checkpoint_tag:
            return self.checkpoint_tag
        return self.checkpoint.rstrip("/").rsplit("/", 1)[-1] if self.checkpoint else None


def kept(past: tuple[RunSummary, ...], run: RunSummary) -> tuple[RunSummary, ...]:
    """``past`` with ``run`` appended, the oldest dropped past ``RUNS_KEPT``."""
    return (*past, run)[-RUNS_KEPT:]
