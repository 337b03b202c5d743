"""One reconcile pass: observe -> plan -> act, for every job or for one.

A job may take a few rounds in one pass when its next step is immediate (a new run
goes on to launch; a stockout goes on to the next zone), bounded so that a pass
always ends. Nothing here waits: anything slower is left to the next event or tick.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from controller import errors
from controller.actions import Action, WriteStatus
from controller.clock import Clock
from controller.executor import Executor, Outcome
from controller.launch import LaunchContext
from controller.observe import Observer
from controller.planner import plan_job
from controller.world import JobView

log = logging.getLogger(__name__)
MAX_ROUNDS = 5


@dataclass
class Summary:
    """What a pass did, as the functions return it and the CLI prints it."""

    jobs: dict[str, list[str]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    transient: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)

    def add(self, outcome: Outcome) -> None:
        self.jobs.setdefault(outcome.job, []).extend(outcome.done)
        if outcome.error:
            self.errors[outcome.job] = outcome.error
        if outcome.transient:
            self.transient.append(outcome.job)

    def as_dict(self) -> dict[str, Any]:
        return {
            "actions": {job: done for job, done in self.jobs.items() if done},
            "errors": self.errors,
            "transient": self.transient,
            "unreachable_zones": self.unreachable,
            "jobs_seen": len(self.jobs),
        }


class Engine:
    def __init__(self, observer: Observer, executor: Executor, ctx: LaunchContext, clock: Clock) -> None:
        self.observer = observer
        self.executor = executor
        self.ctx = ctx
        self.clock = clock

    def reconcile(self, job: str | None = None, dry_run: bool = False) -> Summary:
        """Reconcile every job (``job`` None) or one; ``dry_run`` plans without acting."""
        world = self.observer.world(job)
        summary = Summary(unreachable=list(world.unreachable))
        for view in world.jobs.values():
            try:
                self._reconcile_job(view, summary, dry_run)
            except errors.RespawnError as e:  # e.g. its checkpoint bucket did not answer
                summary.errors[view.job] = f"{type(e).__name__}: {e}"
                summary.transient.append(view.job)
        for name, why in world.failed.items():
            summary.errors[name] = f"observe: {why}"
            summary.transient.append(name)
        return summary

    def plan(self, view: JobView) -> tuple[JobView, list[Action]]:
        """Plan one job, loading its checkpoint first if the plan commits a decision."""
        now = self.clock.now()
        actions = plan_job(view, now, self.ctx)
        needs_checkpoint = any(isinstance(a, WriteStatus) for a in actions) and not view.checkpoint_loaded
        if needs_checkpoint and view.spec and view.spec.checkpoint:
            view = self.observer.with_checkpoint(view)
            actions = plan_job(view, now, self.ctx)
        return view, actions

    def _reconcile_job(self, view: JobView, summary: Summary, dry_run: bool) -> None:
        for _ in range(MAX_ROUNDS):
            view, actions = self.plan(view)
            if dry_run:
                summary.jobs[view.job] = [f"would {type(a).__name__}: {a.reason}" for a in actions]
                return
            outcome = self.executor.apply(view, actions, self.clock.now())
            summary.add(outcome)
            if not outcome.replan:
                return
            view = self.observer.world(view.job).jobs.get(view.job, view)
