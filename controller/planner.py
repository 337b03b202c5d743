"""The planner: a pure function of (observed world, now, context) -> actions.

No I/O and no clock. Each job gets a chain of actions whose first write, when there
is one, is a compare-and-swap of its status: that commit is what makes the decision
unique among concurrent passes; the effects follow it and are idempotent.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from controller import names, transitions as t
from controller.durations import format_duration as fmt
from controller.actions import Action, CreateInstances, DeleteInstance, DeleteRecord, WriteStatus
from controller.launch import LaunchContext, requests_for
from controller.ports import Instance, InstanceStatus, StopReason
from controller.spec import JobSpec
from controller.state import JobStatus, Phase
from controller.world import JobView, World

# A VM in one of these is on its way down or being repaired: wait for it to settle.
_SETTLING = (InstanceStatus.STOPPING, InstanceStatus.SUSPENDING, InstanceStatus.REPAIRING)


def plan(world: World, now: datetime, ctx: LaunchContext) -> list[Action]:
    return [action for view in world.jobs.values() for action in plan_job(view, now, ctx)]


def plan_job(view: JobView, now: datetime, ctx: LaunchContext) -> list[Action]:
    """The next step for one job. Instances without the controller's label are dropped
    first, so no rule below can ever touch one."""
    mine = tuple(i for i in view.instances if i.managed and i.job == view.job)
    return _plan_job(replace(view, instances=mine), now, ctx)


def _plan_job(v: JobView, now: datetime, ctx: LaunchContext) -> list[Action]:
    """Guard clauses in priority order; the first that matches decides."""
    st = v.status
    # The spec is gone: the user deleted it, which cancels the job; VMs left are orphans.
    if not v.has_spec:
        if st and not st.phase.terminal:
            return _end(v, st, Phase.CANCELLED, "spec deleted", now)
        return _leftovers(v, orphan=True)
    if v.cancelled:
        if st is None or not st.phase.terminal:
            return _end(v, st or JobStatus(created_at=now), Phase.CANCELLED, "cancel requested", now)
        return _leftovers(v)
    # An invalid spec fails the job with the reasons, until a corrected spec is written.
    if v.problems:
        if st and st.phase == Phase.FAILED and st.spec_generation == v.spec_generation:
            return _leftovers(v)
        base = st or JobStatus(created_at=now)
        return _end(v, base, Phase.FAILED, "invalid spec: " + "; ".join(v.problems), now,
                    errors=v.problems, spec_generation=v.spec_generation)
    assert v.spec is not None
    # First sight of the job, or a new spec written over a finished run: start a run.
    if st is None or (st.phase.terminal and st.spec_generation != v.spec_generation):
        attempt = max([st.attempt if st else 0, *(i.attempt for i in v.instances)])
        return [WriteStatus(v.job, t.new_run(st, attempt, v.spec_generation, now), "new run", replan=True)]
    if st.phase.terminal:
        return _leftovers(v)
    newest = max((i.attempt for i in v.instances), default=0)
    if newest > st.attempt:
        # Another pass committed and inserted after our status read (our CAS would fail
        # anyway), or status.json was rolled back by hand: adopt what exists.
        return [WriteStatus(v.job, _adopt(v, st, newest, now), "status behind instances")]
    return [*_cleanup(v, st), *_running_job(v, v.spec, st, now, ctx)]


def _running_job(v: JobView, spec: JobSpec, st: JobStatus, now: datetime, ctx: LaunchContext) -> list[Action]:
    policy = spec.policy
    born = st.created_at or st.started_at
    if policy.max_runtime and born and now - born >= policy.max_runtime:
        return _end(v, st, Phase.FAILED, f"deadline: max_runtime {fmt(policy.max_runtime)} reached", now)
    # Between attempts the current attempt's records were already acted on (counted
    # in this very status); they are consumed once the next insert is acknowledged.
    if st.phase in (Phase.PENDING, Phase.RECOVERING):
        return _launch(v, spec, st, "start" if st.phase == Phase.PENDING else "recover", now, ctx)
    if v.exit and v.exit.belongs_to(st):
        if v.exit.exit_code == 0:
            return _end(v, st, Phase.SUCCEEDED, f"command exited 0 on {v.exit.instance or st.instances[0]}", now)
        code = "unreadable" if v.exit.exit_code is None else str(v.exit.exit_code)
        return _failure(v, spec, st, f"command exited with code {code}", now)
    if v.marker and v.marker.belongs_to(st):
        cause = "maintenance" if v.marker.detail == "maintenance" else "preempted"
        return _restart(v, spec, st, cause, f"{cause} marker from {v.marker.instance or 'a VM'}", now, ctx)
    if not st.inserted:
        return _insert(v, spec, st, now, ctx)
    return _watch(v, spec, st, now, ctx)


def _watch(v: JobView, spec: JobSpec, st: JobStatus, now: datetime, ctx: LaunchContext) -> list[Action]:
    """The current attempt was inserted: is every node alive, working and young enough?"""
    mine = {i.name: i for i in v.instances if i.attempt == st.attempt}
    lost = [n for n in st.instances if n not in mine or not (mine[n].status.alive or mine[n].status in _SETTLING)]
    if lost:
        reasons = {v.stop_reasons.get(n, StopReason.UNKNOWN) for n in lost}
        detail = ", ".join(f"{n} {_lost_how(mine.get(n), v.stop_reasons.get(n))}" for n in lost)
        if StopReason.CRASHED in reasons:
            return _failure(v, spec, st, detail, now)
        cause = "preempted" if StopReason.PREEMPTED in reasons else "lost"
        return _restart(v, spec, st, cause, detail, now, ctx)
    if not all(mine[n].status == InstanceStatus.RUNNING for n in st.instances):
        return []  # booting or settling; the next pass looks again
    if st.phase == Phase.PROVISIONING:
        detail = f"{', '.join(st.instances)} running in {st.zone}"
        ids = {**st.instance_ids, **{n: mine[n].id for n in st.instances}}
        running = st.but(t.event(now, st, "running", detail), phase=Phase.RUNNING, message=detail,
                         instance_ids=dict(list(ids.items())[-50:]))
        return [WriteStatus(v.job, running, "instances running")]
    if _stale_heartbeat(v, spec, st, now):
        return _failure(v, spec, st, f"no heartbeat for {fmt(spec.policy.idle_timeout)} (idle or hung)", now)
    oldest = min(mine[n].created_at for n in st.instances)
    if spec.policy.max_instance_age and now - oldest >= spec.policy.max_instance_age:
        return _restart(v, spec, st, "recycled", f"instance older than max_instance_age {fmt(spec.policy.max_instance_age)}",
                        now, ctx)
    return []


def _lost_how(instance: Instance | None, reason: StopReason | None) -> str:
    state = "is gone" if instance is None else f"is {instance.status}"
    return f"{state} ({(reason or StopReason.UNKNOWN).value})"


def _stale_heartbeat(v: JobView, spec: JobSpec, st: JobStatus, now: datetime) -> bool:
    timeout = spec.policy.idle_timeout
    if timeout is None or st.attempt_started_at is None:
        return False
    if now - st.attempt_started_at < spec.policy.startup_grace:
        return False
    beat = v.heartbeat if v.heartbeat and v.heartbeat.belongs_to(st) else None
    last = beat.updated if beat else st.attempt_started_at + spec.policy.startup_grace
    return now - last > timeout


def _restart(v: JobView, spec: JobSpec, st: JobStatus, cause: str, detail: str, now: datetime,
             ctx: LaunchContext) -> list[Action]:
    """A loss that is not the trainer's fault: preemption, maintenance, recycling."""
    if cause == "recycled":
        st = st.but(recycles=st.recycles + 1)
    else:
        if st.restarts >= spec.policy.max_restarts:
            return _end(v, st, Phase.FAILED, f"{detail}; restart budget exhausted "
                        f"(max_restarts {spec.policy.max_restarts})", now)
        st = st.but(restarts=st.restarts + 1, preemptions=st.preemptions + (cause == "preempted"))
    recovering = st.but(t.event(now, st, cause, detail), phase=Phase.RECOVERING, message=detail)
    return _launch(v, spec, recovering, f"{cause}: {detail}", now, ctx)


def _failure(v: JobView, spec: JobSpec, st: JobStatus, detail: str, now: datetime) -> list[Action]:
    """The trainer failed: count it, detect a crash loop, back off, or give up."""
    policy = spec.policy
    progressed = v.checkpoint is not None and v.checkpoint != st.stalled_at
    stalled = 1 if progressed else st.stalled_failures + 1
    failures, restarts = st.failures + 1, st.restarts + 1
    counted = st.but(failures=failures, stalled_failures=stalled, stalled_at=v.checkpoint or st.stalled_at)
    if failures > policy.max_failures:
        return _end(v, counted, Phase.FAILED, f"{detail}; failure budget exhausted "
                    f"({failures} failures, max_failures {policy.max_failures})", now)
    if stalled >= policy.crash_loop_failures:
        at = f"checkpoint {v.checkpoint.uri}" if v.checkpoint else "no checkpoint at all"
        return _end(v, counted, Phase.FAILED, f"{detail}; crash loop: {stalled} failures in a row without "
                    f"checkpoint progress ({at})", now)
    if restarts > policy.max_restarts:
        return _end(v, counted, Phase.FAILED, f"{detail}; restart budget exhausted "
                    f"(max_restarts {policy.max_restarts})", now)
    delay = t.backoff(spec, stalled)
    text = f"{detail}; failure {failures} of {policy.max_failures}, restarting in {fmt(delay)}"
    nxt = counted.but(t.event(now, st, "failed", text), phase=Phase.RECOVERING, restarts=restarts,
                      not_before=now + delay, message=text)
    return [WriteStatus(v.job, nxt, "failure"), *_delete_current(v, st, "attempt failed"),
            *_consume(v, st)]


def _launch(v: JobView, spec: JobSpec, st: JobStatus, why: str, now: datetime, ctx: LaunchContext) -> list[Action]:
    """Commit and insert the next attempt, once backoff and zone cooldowns allow."""
    if st.not_before and now < st.not_before:
        return _delete_current(v, st, why)  # backing off; a VM whose delete failed still goes
    zone = t.pick_zone(spec, st, now)
    if zone is None:
        return [WriteStatus(v.job, t.wait_for_zone(st, spec, now), "zones cooling"),
                *_delete_current(v, st, why)]
    project = spec.project or ctx.default_project
    nodes = names.node_names(v.job, st.attempt + 1, spec.nodes)
    nxt = t.begin_attempt(st, spec, project, zone, nodes, v.checkpoint, now, why, v.spec_generation)
    return [WriteStatus(v.job, nxt, why), *_delete_current(v, st, why), *_insert(v, spec, nxt, now, ctx)]


def _insert(v: JobView, spec: JobSpec, st: JobStatus, now: datetime, ctx: LaunchContext) -> list[Action]:
    """(Re)issue the current attempt's insert; the request id makes a repeat harmless."""
    if st.not_before and now < st.not_before:
        return []
    head: list[Action] = []
    zone = t.pick_zone(spec, st, now)
    if zone is None:
        return [WriteStatus(v.job, t.wait_for_zone(st, spec, now), "zones cooling")]
    if zone != st.zone or st.not_before:
        st = t.move_zone(st, zone, now)
        head = [WriteStatus(v.job, st, "zone chosen")]
    create = CreateInstances(v.job, st.attempt, requests_for(v.job, spec, st, ctx),
                             names.request_id(v.job, st.attempt, st.placement), spec, f"attempt {st.attempt}")
    return [*head, create, WriteStatus(v.job, t.inserted(st, now), "inserted"), *_consume(v, st)]


def _end(v: JobView, st: JobStatus, phase: Phase, detail: str, now: datetime, **changes: object) -> list[Action]:
    done = t.finish(st, phase, detail, now, **changes)
    return [WriteStatus(v.job, done, phase.lower()), *_leftovers(v)]


def _adopt(v: JobView, st: JobStatus, attempt: int, now: datetime) -> JobStatus:
    found = sorted(i.name for i in v.instances if i.attempt == attempt)
    first = next(i for i in v.instances if i.attempt == attempt)
    detail = f"found {', '.join(found)} newer than status attempt {st.attempt}; adopting it"
    return st.but(t.event(now, st, "adopted", detail), phase=Phase.PROVISIONING, attempt=attempt,
                  instances=tuple(found), project=first.project, zone=first.zone, inserted=True,
                  attempt_started_at=st.attempt_started_at or now, started_at=st.started_at or now, message=detail)


def _delete_current(v: JobView, st: JobStatus, why: str) -> list[Action]:
    return [_delete(v.job, i, why) for i in v.instances if i.attempt == st.attempt]


def _cleanup(v: JobView, st: JobStatus) -> list[Action]:
    """Husks of older attempts go at once; their records only after the new insert is acknowledged."""
    husks = [_delete(v.job, i, f"left over from attempt {i.attempt}") for i in v.instances if i.attempt < st.attempt]
    if not st.inserted:
        return husks
    stale = [r for r in (v.marker, v.exit) if r and not r.belongs_to(st)]
    return [*husks, *(DeleteRecord(v.job, r.key, r.generation, "stale: from an older attempt") for r in stale)]


def _consume(v: JobView, st: JobStatus) -> list[Action]:
    """Delete the records this decision acted on; they come last in the chain."""
    return [DeleteRecord(v.job, r.key, r.generation, f"acted on by attempt {st.attempt}")
            for r in (v.marker, v.exit) if r]


def _leftovers(v: JobView, orphan: bool = False) -> list[Action]:
    """A finished, cancelled or spec-less job: delete what it still has.

    Records are only cleaned up for a job the controller ran (it has a status); a
    stray marker with neither spec nor status is left for a person to look at.
    """
    why = "orphan: its job has no spec" if orphan else "job has ended"
    records = [r for r in (v.marker, v.exit) if r] if v.status else []
    return [*(_delete(v.job, i, why, orphan) for i in v.instances),
            *(DeleteRecord(v.job, r.key, r.generation, why) for r in records)]


def _delete(job: str, i: Instance, why: str, orphan: bool = False) -> DeleteInstance:
    return DeleteInstance(job, i.project, i.zone, i.name, why, only_if_spec_absent=orphan)
