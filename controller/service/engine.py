"""One reconcile pass: observe -> plan -> act, for every job or for one.

A job may take a few rounds in one pass when its next step is immediate (a new run
goes on to launch; a stockout goes on to the next zone), bounded so that a pass
always ends. Nothing here waits: anything slower is left to the next event or tick.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from controller.core import errors, fleet
from controller.service import fanout
from controller.service.lease import Busy, Leases
from controller.core.actions import Action, CreateInstances, WriteStatus
from controller.core.clock import Clock
from controller.service.executor import Acting, Executor, HuskBudget, Outcome
from controller.service.notifier import Notifier, Sends
from controller.core.launch import LaunchContext
from controller.service.observe import Observer
from controller.core.shards import Shard
from controller.core.planner import plan_job
from controller.core.state import JobStatus
from controller.core.world import JobView, World

log = logging.getLogger(__name__)
MAX_ROUNDS = 5
# Deletes of stopped VMs (TERMINATED: their disks bill, no machine) a minute, by the passes over
# every job of one function instance, shared by the K shards: a sixth of Compute's default
# 1,500 mutations a minute, so that a mass preemption's inserts (up to one per job, in the same
# minute) keep the rest. A pass for one job (an event) sends none: its inserts come first, and
# the tick is a minute away.
HUSK_DELETES_PER_MINUTE = 250


@dataclass
class Summary:
    """What a pass did, as the functions return it and the CLI prints it."""

    jobs: dict[str, list[str]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    transient: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    # Notices the pass's budget for its sends did not cover (ids): carried to the next pass, and
    # those whose send was under way (they may still arrive; never sent again).
    notices_carried: list[str] = field(default_factory=list)
    notices_in_flight: list[str] = field(default_factory=list)
    # What the pass's commits added to ledgers, and each job's status as it last committed it; a
    # pass over every job adds the fleet up from them (controller.core.fleet), for the tick's log,
    # and lets each status go once its chunk is added (``Engine._done_with``): a pass for one job keeps it.
    changes: list[fleet.Change] = field(default_factory=list)
    committed: dict[str, JobStatus] = field(default_factory=dict)
    figures: fleet.Figures | None = None
    # A pass over every job: the projects whose Compute refused a Spot VM's preemption notice (a
    # Preview field), as the statuses of jobs still running say (``respawn doctor`` reads it).
    notice_refused: dict[str, str] = field(default_factory=dict)
    # A pass over every job that found the lease another pass's did nothing: why (controller.service.lease).
    skipped: str | None = None
    # One that lost or outlived its lease stopped acting: why, and the jobs it then left alone.
    stopped: str | None = None
    not_acted: list[str] = field(default_factory=list)

    def merge(self, other: Summary) -> None:
        for job, done in other.jobs.items():
            self.jobs.setdefault(job, []).extend(done)
        self.errors.update(other.errors)
        self.transient.extend(other.transient)
        self.not_acted.extend(other.not_acted)
        self.changes.extend(other.changes)
        self.committed.update(other.committed)

    def add(self, outcome: Outcome) -> None:
        self.jobs.setdefault(outcome.job, []).extend(outcome.done)
        if outcome.error:
            self.errors[outcome.job] = outcome.error
        if outcome.transient:
            self.transient.append(outcome.job)
        self.changes.extend(outcome.changes)
        if outcome.status is not None:
            self.committed[outcome.job] = outcome.status
        if outcome.stopped:
            self.not_acted.append(outcome.job)

    def as_dict(self) -> dict[str, Any]:
        return {
            "actions": {job: done for job, done in self.jobs.items() if done},
            "errors": self.errors,
            "transient": self.transient,
            "unreachable_zones": self.unreachable,
            "jobs_seen": len(self.jobs),
            **({"notices_unsent": {"carried": self.notices_carried, "in_flight": self.notices_in_flight}}
               if self.notices_carried or self.notices_in_flight else {}),
            **({"notice_refused": self.notice_refused} if self.notice_refused else {}),
            **({"skipped": self.skipped} if self.skipped else {}),
            **({"stopped": self.stopped, "jobs_not_acted": len(self.not_acted)} if self.stopped else {}),
        }


class Engine:
    def __init__(self, observer: Observer, executor: Executor, ctx: LaunchContext, clock: Clock,
                 workers: int = 1, operation_wait: float | None = None, lease: Leases | None = None) -> None:
        self.observer = observer
        self.executor = executor
        self.ctx = ctx
        self.clock = clock
        self.workers = workers  # jobs reconciled side by side (fanout.each)
        # Seconds of a pass, from when it starts acting, in which an insert waits for its
        # operation (None: each insert waits as long as the gateway does). A pass that
        # launches a few learns their outcome at once (a quick stockout moves on to the next
        # zone in the same pass); in one that launches hundreds, the later inserts are not
        # waited for, so no thread sits out a 20-second operation while others queue behind
        # it: the next pass reads each one's outcome by the same request id.
        self.operation_wait = operation_wait
        self.lease = lease  # one pass over every job at a time (None: passes are not kept apart)
        self._wide_pass_at = float("-inf")  # when a hint asked for a pass over every job (wide_pass_due)
        self._wide_lock = threading.Lock()
        self._husk_budget: HuskBudget | None = None  # shared by this instance's passes over every job

    def wide_pass_due(self, gap: float) -> bool:
        """Whether a hint may have a pass over every job now: none began in this instance within
        ``gap`` seconds (a burst of hints is one pass; the tick is the safety net)."""
        with self._wide_lock:
            now = time.monotonic()
            if now - self._wide_pass_at < gap:
                return False
            self._wide_pass_at = now
            return True

    def reconcile(self, job: str | None = None, dry_run: bool = False, shard: Shard | None = None) -> Summary:
        """Reconcile every job (``job`` None) or one; ``dry_run`` plans without acting.

        A pass over every job first takes the lease (controller.service.lease): one that finds it
        another pass's does nothing and says until when; one that loses or outlives it stops
        acting and says so. A pass for one job (an event) takes none and runs beside a pass over
        every job, as two passes over one job always could: every decision is a compare-and-swap
        of the job's status on the generation the pass read, and every insert, delete, go and
        record consumed after it is re-checked against that generation right before it is sent
        (controller.service.executor), so the pass that loses the swap decides nothing
        (tests/service/test_invariants.py races ticks and events over the same jobs).

        The VM jobs are reconciled first, a chunk at a time, each acted on before the next is
        read (``Observer.parts``); the TPU jobs (and names with neither spec nor status: strays,
        orphans) once the TPU listing answered or its bound passed: a TPU API that does not answer
        never holds a VM job's recovery.

        Notices are never on the path of a recovery: each job's chain hands its notices to the
        pass's sends (``Notifier.begin``), which go out side by side while the pass goes on; the
        pass waits for them only at its very end, after every job's chain, for at most the
        notifier's ``wait``. What did not fit is carried to the next pass, by id in the summary
        and the log (controller.service.notifier).

        ``shard`` (controller.core.shards): a pass over that shard's jobs alone, under that shard's
        own lease (shards run side by side; two deliveries of one shard's message make one pass)."""
        if shard is not None and job is not None:
            raise ValueError("a shard's pass is a pass over every job of the shard")
        if job is not None or dry_run or self.lease is None:
            summary = self._pass(job, dry_run, None, shard)
            if job is None and not dry_run:
                self._keep_snapshot()
            return summary
        lease = self.lease if shard is None else self.lease.keyed(shard.lease_key)
        taken = lease.take()
        if isinstance(taken, Busy):
            log.info("%s: this pass does nothing", taken.describe(),
                     extra={"json_fields": {"lease_holder": taken.holder, "lease_until": taken.until.isoformat()}})
            return Summary(skipped=taken.describe())
        with taken:  # renewed while the pass runs, released at its end
            summary = self._pass(None, False, taken.acting, shard)
            why = taken.why_not()
            if not summary.not_acted and why is None:
                self._keep_snapshot()
        if summary.not_acted or why is not None:
            summary.stopped = why or "its lease was lost"
            log.warning("this pass stopped acting: %s; %d jobs not acted on", summary.stopped,
                        len(summary.not_acted), extra={"json_fields": {"jobs_not_acted": summary.not_acted[:100]}})
        return summary

    def _husks(self, job: str | None, shard: Shard | None) -> HuskBudget:
        """The budget a pass's deletes of stopped VMs draw on: none for a pass for one job; for a
        pass over every job (or a shard's), this instance's, per minute, kept across its passes."""
        if job is not None:
            return HuskBudget(0)
        limit = max(1, HUSK_DELETES_PER_MINUTE // (shard.count if shard else 1))
        with self._wide_lock:
            if self._husk_budget is None or self._husk_budget.limit != limit:
                self._husk_budget = HuskBudget(limit, clock=lambda: self.clock.now().timestamp())
            return self._husk_budget

    def _keep_snapshot(self) -> None:
        """What the pass over every job read, kept for a fresh instance (controller.service.snapshot);
        never the pass's failure."""
        try:
            if written := self.observer.keep_snapshot():
                log.info("snapshot: %d parts written", written, extra={"json_fields": {"snapshot_parts": written}})
        except Exception:  # noqa: BLE001 - a cache for the next instance: never this pass's failure
            log.exception("the snapshot could not be kept")

    def _pass(self, job: str | None, dry_run: bool, acting: Acting | None, shard: Shard | None = None) -> Summary:
        notifier: Notifier | None = getattr(self.executor, "notifier", None)
        sends = notifier.begin(self.workers) if notifier is not None and not dry_run else None
        summary = Summary()
        tally = fleet.Tally(self.clock.now()) if job is None and not dry_run else None
        husks = self._husks(job, shard)
        seen = World({})  # the pass's blind zones and projects and the jobs it could not read
        try:
            chunks, rest = self.observer.parts(job) if shard is None else self.observer.parts(job, shard)
            wait_until = None if self.operation_wait is None else time.monotonic() + self.operation_wait
            # Each chunk is acted on as soon as it was read, before the next is: a chunk's inserts
            # start while the rest of the fleet is still being read, and a pass holds one chunk's
            # views at a time (what it committed, and the figures' running sums, it keeps).
            for world in chunks:
                if acting is not None and not acting():
                    return summary  # its lease is lost: the rest of the fleet is not even read
                self._act(world, summary, dry_run, wait_until, sends, acting, husks, shared=job is None)
                seen = self._done_with(world, seen, summary, tally)
            later = rest()
            self._act(later, summary, dry_run, wait_until, sends, acting, husks)
            seen = self._done_with(later, seen, summary, tally)
            summary.unreachable = [*seen.unreachable, *(f"project {p}" for p in seen.unseen_projects)]
            for project, why in seen.unseen_projects.items():
                summary.errors[f"project {project}"] = f"instance list failed: {why}"
            for name, why in seen.failed.items():
                summary.errors[name] = f"observe: {why}"
                if name in seen.transient:  # a 403, a bug: no retry of the whole function fixes it
                    summary.transient.append(name)
            if tally is not None:
                summary.figures = self._figures(tally, summary, len(seen.failed))
        finally:
            if sends is not None:
                unsent = sends.finish()
                summary.notices_carried, summary.notices_in_flight = unsent.carried, unsent.in_flight
        return summary

    def _act(self, world: World, summary: Summary, dry_run: bool, wait_until: float | None,
             sends: Sends | None, acting: Acting | None = None, husks: HuskBudget | None = None,
             shared: bool = False) -> None:
        """``shared``: a chunk of a pass over every job, fanned out on the process's kept threads."""
        for part in fanout.each(world.jobs.values(),
                                lambda v: self._isolated(v, dry_run, wait_until, sends, acting, husks),
                                self.workers, shared=shared):
            summary.merge(part)

    def _done_with(self, world: World, seen: World, summary: Summary, tally: fleet.Tally | None) -> World:
        """``world``'s part of the pass once acted on: its jobs added to the
        figures (each as the pass last committed it, else as read; a job whose spec has no status
        yet as PENDING) and to the projects whose Compute refused a preemption notice; what it saw
        kept, its views and its commits let go."""
        if tally is not None:
            for name, view in world.jobs.items():
                if not (view.has_spec or view.status is not None):
                    continue
                # Taken out once added: a pass over every job holds its chunk's commits, not the
                # fleet's (a mass recovery commits every job, a status at its history limit ~160 KiB).
                st = summary.committed.pop(name, None) or view.status or JobStatus()
                try:
                    tally.add(st)
                except Exception:  # noqa: BLE001 - figures for people: never a pass's failure
                    log.exception("could not add a job to the fleet's figures", extra={"json_fields": {"job": name}})
                if st.notice_refused and st.project and not st.phase.terminal:
                    summary.notice_refused[st.project] = st.notice_refused
        return seen.joined(replace(world, jobs={}))

    def _figures(self, tally: fleet.Tally, summary: Summary, unread: int) -> fleet.Figures | None:
        """The fleet added up (``_done_with``). Never the pass's failure: None."""
        try:
            return tally.figures(summary.changes, unread=unread)
        except Exception:  # noqa: BLE001 - figures for people: never a pass's failure
            log.exception("could not add up the fleet's figures")
            return None

    def plan(self, view: JobView) -> tuple[JobView, list[Action]]:
        """Plan one job; when the plan commits a decision, load the evidence it must rest on
        (the latest checkpoint; records read again; capacity advice for a launch) and plan
        again with it."""
        now = self.clock.now()
        actions = plan_job(view, now, self.ctx)
        decisions = [a for a in actions if isinstance(a, WriteStatus)]
        if not decisions:
            return view, actions
        loaded = view
        if not view.checkpoint_loaded and view.spec and view.spec.checkpoint:
            loaded = self.observer.with_checkpoint(loaded)
        if any("records" in a.needs for a in decisions) and not view.records_fresh:
            loaded = self.observer.with_fresh_records(loaded)
        if loaded is not view:
            actions = plan_job(loaded, now, self.ctx)
        # Advice only for a plan that still launches once its evidence is in (a checkpoint that
        # cannot be listed holds the launch): asking costs a request, and Compute's client.
        create = next((a for a in actions if isinstance(a, CreateInstances)), None)
        if create and loaded.spec and not loaded.advice_loaded:
            # Where the attempt goes: capacity placement ranks its zones by Compute's advice.
            first = create.requests[0]
            if loaded.spec.placement_for(first.provisioning) == "capacity":
                advised = self.observer.with_advice(loaded, first.provisioning, first.project)
                if advised is not loaded:
                    return advised, plan_job(advised, now, self.ctx)
        return loaded, actions

    def _isolated(self, view: JobView, dry_run: bool, wait_until: float | None = None,
                  sends: Sends | None = None, acting: Acting | None = None, husks: HuskBudget | None = None) -> Summary:
        """One job's rounds, with whatever goes wrong kept to that job's own summary."""
        summary = Summary()
        try:
            self._reconcile_job(view, summary, dry_run, wait_until, sends, acting, husks)
        except errors.RespawnError as e:  # e.g. its bucket objects did not answer
            summary.errors[view.job] = f"{type(e).__name__}: {e}"
            if isinstance(e, errors.TransientError):  # a 403 or a 400 would fail the same way again
                summary.transient.append(view.job)
        except Exception as e:  # noqa: BLE001 - a bug or a surprise: this job only, never the pass
            summary.errors[view.job] = f"unexpected {type(e).__name__}: {e}"
            log.exception("reconciling a job failed", extra={"json_fields": {"job": view.job}})
        return summary

    def _reconcile_job(self, view: JobView, summary: Summary, dry_run: bool, wait_until: float | None = None,
                       sends: Sends | None = None, acting: Acting | None = None,
                       husks: HuskBudget | None = None) -> None:
        given: dict[str, Any] = {"tell": sends.add} if sends is not None else {}
        if husks is not None:
            given["husks"] = husks
        if acting is not None:
            given["acting"] = acting
        for _ in range(MAX_ROUNDS):
            if acting is not None and not acting():  # no plan (nor the reads it would load) once the pass may not act
                summary.jobs.setdefault(view.job, [])
                summary.not_acted.append(view.job)
                return
            view, actions = self.plan(view)
            if dry_run:
                summary.jobs[view.job] = [f"would {type(a).__name__}: {a.reason}" for a in actions]
                return
            outcome = self.executor.apply(view, actions, self.clock.now(), wait_until, **given)
            summary.add(outcome)
            if not outcome.replan or outcome.stopped:
                return
            view = self.observer.world(view.job).jobs.get(view.job, view)
