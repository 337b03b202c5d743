"""The planner: a pure function of (observed world, now, context) -> actions.

No I/O and no clock. Each job gets a chain of actions whose first write, when there
is one, is a compare-and-swap of its status: that commit is what makes the decision
unique among concurrent passes; the effects follow it and are idempotent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from controller.core import handover, names, transitions as t
from controller.core.durations import format_duration as fmt
from controller.core.actions import (Action, ClaimSlot, CreateInstances, DeleteInstance, DeleteRecord, ReleaseLine,
                                     ReleaseSlot, WriteStatus)
from controller.core.launch import LaunchContext, go_items, requests_for, standby_requests
from controller.core.ports import Instance, InstanceStatus, StopReason
from controller.core.spec import JobSpec
from controller.core.state import Event, JobStatus, Phase
from controller.core.world import JobView, Record, World

# How long VM records under a name with neither spec nor status are kept (``_strays``).
STRAY_GRACE = timedelta(hours=1)
# How long a restart waits for the previous attempt's VM to finish going down.
_SETTLE_LIMIT = timedelta(minutes=10)
# How long a run whose every TPU zone the project may not use waits before it fails: IAM
# grants take minutes to hold, and a deploy may have made them just before.
_DENIED_GRACE = timedelta(minutes=10)
# The VM agent's exit code for an image that cannot run here (deploy/vm/startup.sh): missing, not this
# account's to pull, no container runtime (or none for the GPUs) on the boot image, or not started.
NEVER_RUNS = 94
# Causes of a lost VM that are nobody's fault but the platform's, most telling first.
_PLATFORM = {StopReason.PREEMPTED: "preempted", StopReason.MAINTENANCE: "maintenance",
             StopReason.HOST_ERROR: "host error"}


def plan(world: World, now: datetime, ctx: LaunchContext) -> list[Action]:
    return [action for view in world.jobs.values() for action in plan_job(view, now, ctx)]


def plan_job(view: JobView, now: datetime, ctx: LaunchContext) -> list[Action]:
    """The next step for one job. Instances without the controller's label are dropped
    first, so no rule below can ever touch one."""
    mine = tuple(i for i in view.instances if i.managed and i.job == view.job)
    v = replace(view, instances=mine)
    return [*_seen_ids(_plan_job(v, now, ctx), mine), *_slot_releases(v)]


def _slot_releases(v: JobView) -> list[Action]:
    """A sweep's trial gives its slot back once it is over and none of its VMs is left (seen so:
    every zone and project answered); a trial not over keeps one slot, the lowest, and gives
    back any other it got (two passes that claimed two at once). Last in the chain: a release
    never comes before what the pass decided for the trial."""
    if v.slots is None and not v.other_slots:
        return []  # not a sweep's trial: nothing read (a status's history is parsed only when used)
    st = v.status
    blind = bool(v.unreachable or v.unseen_projects)
    # Slots in a sweep the job is no longer a trial of (its spec moved it, or out of sweeps): given
    # back once no VM of an earlier run is left, the ones the slot was taken for.
    base = _run_base(st) if st is not None and v.other_slots else None
    earlier = [i for i in v.instances if base is None or i.attempt <= base]

    def left(sweep: str) -> bool:
        """Whether the VMs the slot of ``sweep`` was taken for are gone: an earlier run's; or, while
        the run it admitted goes on (its spec moved it to another sweep meanwhile), every VM."""
        admitted = st is not None and st.sweep == sweep and not st.phase.terminal
        return not blind and not (v.instances if admitted else earlier)

    moved = [ReleaseSlot(v.job, s.sweep, k, generation, "the job is no longer a trial of this sweep")
             for s in v.other_slots if left(s.sweep) for k, generation in s.held_by(v.job)]
    if v.slots is None or not (held := v.slots.held_by(v.job)):
        return moved
    over = not v.has_spec or v.cancelled or (st is not None and st.phase.terminal)
    if over and (v.instances or blind):
        return moved  # its VMs (or ones it may have, unseen) still hold quota
    give = held if over else held[1:]
    why = "the trial is over and its VMs are gone" if over else "the trial holds another slot"
    return [*moved, *(ReleaseSlot(v.job, v.slots.sweep, k, generation, why) for k, generation in give)]


def _seen_ids(actions: list[Action], instances: tuple[Instance, ...]) -> list[Action]:
    """Every status the plan writes also records the ids of the run's instances this pass saw,
    in whatever state (an attempt that went from PROVISIONING to its end between two passes was
    never seen RUNNING): their logs are found by id once they are gone. Only in writes the plan
    makes anyway; a gang's ids (its bulkInsert names none) come from here."""
    if not any(i.id or i.host_ids for i in instances):
        return actions

    def recorded(st: JobStatus) -> JobStatus:
        base = _run_base(st)
        # A Compute Engine TPU slice: its hosts' ids, each a VM whose logs are found by id.
        return st.with_ids({name: id_ for i in instances if base < i.attempt <= st.attempt
                            for name, id_ in (i.host_ids or {i.name: i.id}).items() if id_})

    return [replace(a, status=recorded(a.status)) if isinstance(a, WriteStatus) else a for a in actions]


def _run_base(st: JobStatus) -> int:
    """The attempt number a run started after: older attempts are an earlier run's."""
    return st.accepted.attempt if st.accepted else 0


def _plan_job(v: JobView, now: datetime, ctx: LaunchContext) -> list[Action]:
    """Guard clauses in priority order; the first that matches decides."""
    st = v.status
    # The spec is gone: the user deleted it, which cancels the job; VMs left are orphans.
    if not v.has_spec:
        if st and not st.phase.terminal:
            return _end(v, st, Phase.CANCELLED, "spec deleted", now)
        return [*_leftovers(v, orphan=True), *([] if st or v.status_generation else _strays(v, now))]
    if v.cancelled:
        if st is None or not st.phase.terminal:
            return _end(v, st or JobStatus(created_at=now), Phase.CANCELLED, "cancel requested", now)
        return _leftovers(v)
    # An invalid spec fails the job with the reasons, until a corrected spec is written.
    if v.problems:
        if st and st.phase == Phase.FAILED and st.spec_generation == v.spec_generation:
            return _leftovers(v)
        base = st or JobStatus(created_at=now)
        if st is not None and st.phase.terminal and st.spec_generation != v.spec_generation:
            # Written over a finished run, which keeps its outcome (its summary goes into the past
            # runs): the invalid spec is a run of its own, failed before it launched anything.
            base = t.new_run(st, st.attempt, v.spec_generation, now, last=v.checkpoint if v.checkpoint_loaded else None,
                             job=v.job)
        return _end(v, base, Phase.FAILED, "invalid spec: " + "; ".join(v.problems), now,
                    errors=v.problems, spec_generation=v.spec_generation)
    assert v.spec is not None
    # First sight of the job, or a new spec written over a finished run: start a run.
    if st is None or (st.phase.terminal and st.spec_generation != v.spec_generation):
        # Past every number the run before used, a withdrawn standby's too (a request id names it).
        attempt = max([st.attempt if st else 0, st.withdrawn if st else 0, *(i.attempt for i in v.instances)])
        # The run before's latest checkpoint, listed where it wrote them, for its summary.
        last = v.checkpoint if st is not None and v.checkpoint_loaded else None
        return [WriteStatus(v.job, t.new_run(st, attempt, v.spec_generation, now, v.spec, last, job=v.job), "new run",
                            replan=True)]
    if st.phase.terminal:
        return _leftovers(v)
    newest = max((i.attempt for i in v.instances if not _spare(st, i)), default=0)
    if newest > st.attempt and _earlier_runs(v, st, newest):
        # The previous run's VMs, seen only now (their zone did not answer when this run was
        # numbered, its folder deleted whole): this run's attempts go after them, as a new run
        # numbers them when it sees them; they are its leftovers, never its attempt.
        return [WriteStatus(v.job, t.new_run(st, newest, st.spec_generation, now, v.spec, renumbered=True, job=v.job),
                            "run renumbered after "
                            f"attempt {newest}, left by an earlier run", replan=True)]
    if newest > st.attempt:
        # Another pass committed and inserted after our status read (our CAS would fail
        # anyway), or status.json was rolled back by hand: adopt what exists.
        return [WriteStatus(v.job, _adopt(v, st, newest, now), "status behind instances")]
    # A promoted standby's go first (again: a no-op where it landed): a cleanup that fails must
    # never keep a VM waiting at the starting line.
    go = _go(v.job, st) if st.held and st.inserted and not handover.past_line(v, st) and not st.phase.terminal else []
    return [*go, *_cleanup(v, st), *_running_job(v, v.spec, st, now, ctx)]


def _running_job(v: JobView, spec: JobSpec, st: JobStatus, now: datetime, ctx: LaunchContext) -> list[Action]:
    policy = spec.policy
    # A sweep's trial is not under way while it waits for a slot: its deadline counts from its start.
    born = st.started_at if spec.sweep is not None else st.created_at or st.started_at
    # The exit record that decides the attempt: rank 0's exit 0, unless a rank failed first.
    exited = v.deciding_exit(st)
    finished = exited is not None and exited.exit_code == 0
    if policy.max_runtime and born and now - born >= policy.max_runtime and not finished:
        # The records read again first: an exit 0 that landed since the listing is a success.
        return _fresh(v, _end(v, st, Phase.FAILED, f"deadline: max_runtime {fmt(policy.max_runtime)} reached", now))
    # Between attempts the current attempt's records were already acted on (counted
    # in this very status); they are consumed once the next insert is acknowledged.
    if st.phase in (Phase.PENDING, Phase.QUEUED, Phase.RECOVERING):
        if st.phase == Phase.RECOVERING and exited is not None and finished and not _failed_first(st, exited):
            # The trainer finished while its VM was being replaced (a recycle whose delete
            # is slow or failing): the exit 0 wins, the next attempt never starts.
            return _end(v, st, Phase.SUCCEEDED, f"command exited 0 on {exited.instance or st.instances[0]}", now,
                        since=exited.updated, result=_result(exited))
        if st.phase in (Phase.PENDING, Phase.QUEUED):
            return _launch(v, spec, st, "start", now, ctx)
        # Read between attempts from the listing alone (a pass over a job backing off costs no
        # request): an exit 0 that landed since the listing is read before the launch commits.
        return _fresh(v, _launch(v, spec, st, "recover", now, ctx))
    if exited is not None:
        return _exited(v, spec, st, exited, now, ctx)
    if v.marker and v.marker.belongs_to(st):
        cause = _marker_cause(v.marker)
        unsaved = "; its trainer had not finished saving by the deadline" if v.marker.saved is False else ""
        return _restart(v, spec, st, cause, f"{cause} marker from {v.marker.instance or 'a VM'}{unsaved}", now, ctx,
                        since=v.marker.updated)
    if not st.instances:  # hand-edited: an attempt with no VM names; insert the ones it should have
        repaired = st.but(instances=tuple(names.node_names(v.job, st.attempt, spec.nodes)), inserted=False)
        return [WriteStatus(v.job, repaired, "status names no instance")]
    if not st.inserted:
        return _insert(v, spec, st, now, ctx)
    return _watch(v, spec, st, now, ctx)


def _failed_first(st: JobStatus, success: Record) -> bool:
    """This attempt was already failed by a rank's exit record that landed before ``success`` (the
    record itself consumed since): rank 0's exit 0 after it does not make the gang a success."""
    failed = [e for e in st.history if e.attempt == st.attempt and e.event == "failed" and e.since is not None]
    return any(e.since <= success.updated for e in failed)


def _exited(v: JobView, spec: JobSpec, st: JobStatus, exited: Record, now: datetime,
            ctx: LaunchContext) -> list[Action]:
    """The command exited (``exited``: the record that decides, ``JobView.deciding_exit``). For a
    gang, rank 0's exit 0 is the job's success unless a rank failed first; a non-zero exit after
    the platform took a node away is that loss, not the trainer's failure."""
    if exited.exit_code == 0:
        return _end(v, st, Phase.SUCCEEDED, f"command exited 0 on {exited.instance or st.instances[0]}", now,
                    since=exited.updated, result=_result(exited))
    code = "unreadable" if exited.exit_code is None else str(exited.exit_code)
    where = exited.instance or "a VM"
    if exited.node and len(st.instances) == 1:  # a TPU slice: one node, a record per host
        where = f"{where} worker {exited.node}"
    detail = f"command exited with code {code} on {where}"
    if exited.detail:  # the agent says why the command never ran (code download failed...)
        detail = f"the command never ran on {where}: {exited.detail} (exit {code})"
    # A platform loss first: a VM preempted while it pulled may end its pull in words the agent takes
    # for "never" (its network or its docker daemon going down with it); the next attempt says again.
    if cause := _platform_cause(v, st):
        return _restart(v, spec, st, cause, f"{detail} after a node was {cause}", now, ctx)
    if exited.detail and exited.exit_code == NEVER_RUNS:  # the image cannot run here: every next VM alike
        return _end(v, st, Phase.FAILED, f"{detail}; not retried: fix the image, its grant or the boot "
                    "image, then submit again", now)
    if len(st.instances) > 1:
        # A gang: a rank failing because another node went away is that node's loss.
        if st.zone in v.unreachable or st.project in v.unseen_projects:
            return []  # cannot see the other nodes: wait until the zone answers
        mine = _current(v, st)
        if any(i.status.settling for i in mine.values()):
            return []  # a node is on its way down: wait to learn why
        others = [n for n in st.instances if n != exited.instance and (n not in mine or mine[n].status.down)]
        if others and mine:  # a gang is inserted whole or not at all: seen in part means lost in part
            return _lost(v, spec, st, mine, others, now, ctx, also=detail)
    # A record that says the command never ran is no evidence that the trainer ran (the ledger
    # reads an event's ``since`` as such): the attempt was all boot, not of an unknown split.
    return _failure(v, spec, st, detail, now, since=None if exited.detail else exited.updated)


RESULT_MAX_DEPTH = 32  # a result's nesting: the status that keeps it is read back by pydantic (about 200 at most)


def _result(exited: Record) -> Any:
    """The JSON the trainer reported with its exit (RESPAWN_RESULT_FILE), as a value a status keeps
    and reads back: else ``{"unreadable": why}`` (not JSON, nested past RESULT_MAX_DEPTH, NaN or an
    infinity, a lone surrogate), never a status that could not be written or read again."""
    if exited.result is None:
        return None
    try:
        value = json.loads(exited.result)
        if _depth(value) > RESULT_MAX_DEPTH:
            raise ValueError(f"nested deeper than {RESULT_MAX_DEPTH} levels")
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (ValueError, RecursionError, UnicodeError) as e:
        return {"unreadable": f"not JSON a status keeps: {str(e)[:200]}"}
    return value


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > RESULT_MAX_DEPTH:
            break
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _platform_cause(v: JobView, st: JobStatus) -> str | None:
    """'preempted', 'maintenance' or 'host error' when the platform took a node of this attempt."""
    if v.marker and v.marker.belongs_to(st):
        return _marker_cause(v.marker)
    reasons = set(v.stop_reasons.values())
    return next((cause for reason, cause in _PLATFORM.items() if reason in reasons), None)


def _marker_cause(marker: Record) -> str:
    """A marker's reason: a preemption, a terminating maintenance, or a VM that booted a
    second time (reset, stop+start) and refused to train again from a stale checkpoint."""
    return marker.detail if marker.detail in ("maintenance", "rebooted") else "preempted"


def _watch(v: JobView, spec: JobSpec, st: JobStatus, now: datetime, ctx: LaunchContext) -> list[Action]:
    """The current attempt was inserted: is every node alive, working and young enough?"""
    if st.zone in v.denied_zones:  # the project may no longer use the zone: not seen, and said
        return _note(v, st, "blind", f"cannot see {', '.join(st.instances)}: {_denials({st.zone: v.denied_zones[st.zone]}, spec, ctx)}", now)
    if st.zone in v.unreachable or st.project in v.unseen_projects:
        return []  # its zone or project did not answer the list: "not seen" is not "gone"
    mine = _current(v, st)
    lost = [n for n in st.instances if n not in mine or mine[n].status.down]
    if handover.hard_off_passed(st, now):
        # Past the standby's bound a VM still on its way down is off, whatever Compute says yet.
        lost += [n for n in st.instances if n not in lost and mine[n].status.settling]
    done = _finished_workers(v, st, mine, lost)
    if lost and lost != done:
        return _lost(v, spec, st, mine, lost, now, ctx)
    if not lost and (standby := _standby(v, spec, st, mine, now, ctx)):
        return standby
    working = {n: mine[n] for n in st.instances if n not in done}  # every one is there: none lost
    if any(i.status != InstanceStatus.RUNNING for i in working.values()):
        # booting (waiting for capacity, said once), settling, or a status we do not know
        return (_withdraw(v, spec, st, working, now) or _capacity_wait(v, st, working, now)
                or _settling(v, spec, st, mine, now, ctx))
    if st.settling:
        # Back from a state its trainer may not have run in: heartbeats get a new grace.
        back = st.but(t.event(now, st, "resumed", "every node is RUNNING again"), settling=False,
                      settling_since=None, resumed_at=now)
        return [WriteStatus(v.job, back, "resumed")]
    if st.phase == Phase.PROVISIONING:
        waiting = st.held and not handover.past_line(v, st)
        detail = f"{', '.join(st.instances)} running in {st.zone}"
        if waiting:  # a promoted standby: its go is given at every pass until its trainer says it started
            detail = f"{detail}, given the go at its starting line"
        elif st.held:
            detail = f"{', '.join(st.instances)} past the starting line in {st.zone}: its trainer started"
        # (The instances' ids ride on this write as on every other: _seen_ids.)
        # The heartbeat grace starts no earlier than this: a VM can wait long before it runs
        # (a Flex-start VM sits in PENDING until Compute finds capacity, hours at times), and
        # its trainer cannot beat before it runs.
        running = st.but(t.event(now, st, "running", detail, trainer_started=_trainer_started(v, st),
                                 **_progress(v, st)),
                         phase=Phase.RUNNING, message=detail, resumed_at=now, held=waiting)
        return [*(_gang_go(v, st) if st.held and not waiting else []), WriteStatus(v.job, running, "instances running")]
    if st.held and handover.past_line(v, st):
        # Its trainer's first record: the go was received. Said once; the ledger's boot ends there.
        started = _trainer_started(v, st)
        text = "past the starting line: its trainer started" + (
            f" at {started:%H:%M:%S} UTC (its VM's clock)" if started else "")
        return [*_gang_go(v, st), WriteStatus(v.job, st.but(t.event(now, st, "training", text, trainer_started=started,
                                                                    **_progress(v, st)),
                                                 held=False, message=text), "past the starting line", replan=True)]
    if (started := _unsaid_start(v, st)) is not None:
        # Seen RUNNING before its trainer's first record: the start, said once, ends the
        # ledger's boot while the attempt runs, not only when it ends.
        text = f"trainer started at {started:%H:%M:%S} UTC (its VM's clock)"
        return [WriteStatus(v.job, st.but(t.event(now, st, "training", text, trainer_started=started,
                                                  **_progress(v, st))),
                            "trainer started", replan=True)]
    if hung := _hung(spec, st, working, now):
        # The TPU service itself says the runtime does not answer: a hang, as a stale heartbeat is.
        return _fresh(v, _failure(v, spec, st, f"{', '.join(hung)} (hung)", now))
    if _stale_heartbeat(v, spec, st, working, now):
        if st.held:
            # Silent at its line too (no ready record): its agent is gone or hung, and its trainer
            # never started, so never failed. A restart, bounded by max_restarts.
            why = f"no trainer past the starting line {fmt(now - (st.go_at or now))} after the go, nor a word"
            return _fresh(v, _restart(v, spec, st, "lost", why, now, ctx))
        return _fresh(v, _failure(v, spec, st, f"no heartbeat for {fmt(spec.policy.idle_timeout)} (idle or hung)", now))
    oldest = min(i.created_at for i in working.values())
    if spec.policy.max_instance_age and now - oldest >= spec.policy.max_instance_age:
        why = f"instance older than max_instance_age {fmt(spec.policy.max_instance_age)}"
        return _fresh(v, _restart(v, spec, st, "recycled", why, now, ctx))
    return _announced(v, st, working, now)


def _announced(v: JobView, st: JobStatus, working: dict[str, Instance], now: datetime) -> list[Action]:
    """A TPU node's scheduled maintenance, in the status while Google announces it (written
    when it changes, not every pass)."""
    upcoming = next((f"{n}: {i.upcoming_maintenance}" for n, i in working.items() if i.upcoming_maintenance), None)
    if upcoming == st.upcoming_maintenance:
        return []
    text = f"maintenance scheduled on {upcoming}" if upcoming else "scheduled maintenance withdrawn or done"
    return [WriteStatus(v.job, st.but(t.event(now, st, "maintenance-scheduled", text), upcoming_maintenance=upcoming),
                        "upcoming maintenance")]


def _lost(v: JobView, spec: JobSpec, st: JobStatus, mine: dict[str, Instance], lost: list[str],
          now: datetime, ctx: LaunchContext, also: str = "") -> list[Action]:
    """Some node of the current attempt is down or gone: whose fault, and what next."""
    reasons = {n: v.stop_reasons.get(n, StopReason.UNKNOWN) for n in lost}
    detail = ", ".join(f"{n} {_lost_how(mine.get(n), reasons[n])}" for n in lost) + (f"; {also}" if also else "")
    # When Compute recorded the first of them: the loss's time for the ledger (a pass sees it later).
    recorded = min((at for n in lost if (at := v.stopped_at.get(n)) is not None and at <= now), default=None)
    if cause := _platform_cause(replace(v, stop_reasons=reasons), st):
        return _restart(v, spec, st, cause, detail, now, ctx, recorded=recorded)
    if all(r in (StopReason.CRASHED, StopReason.REFUSED) for r in reasons.values()):
        return _failure(v, spec, st, detail, now)  # backs off: the same request again would fail again
    # A node stopped by a person or gone for reasons unknown: the other nodes' crashes
    # are the broken collective's echo, not the trainer's fault.
    return _restart(v, spec, st, "lost", detail, now, ctx, recorded=recorded)


def _withdraw(v: JobView, spec: JobSpec, st: JobStatus, working: dict[str, Instance], now: datetime) -> list[Action]:
    """An attempt still waiting in Google's queue for capacity (a queued TPU, a Flex-start VM in
    PENDING) past ``fallback.wait``, with a model below it to try: withdrawn (deleted) and the
    job steps down, as a create refused for capacity that long would. Not a loss: no restart is
    counted; the next attempt goes on the next model once the withdrawn one is gone."""
    if st.phase != Phase.PROVISIONING or not working or any(i.status != InstanceStatus.PENDING
                                                            for i in working.values()):
        return []
    since = st.inserted_at or st.attempt_started_at
    if since is None or now - since < spec.fallback.wait:
        return []
    why = (f"waiting in Google's queue for {fmt(now - since)} without capacity "
           f"(policy.fallback.wait {fmt(spec.fallback.wait)}); withdrawing {', '.join(working)}")
    down = t.step_down(st, spec, now, why)
    if down is None:
        return []
    # The zone that gave nothing cools for the model left behind, as a stockout would cool it:
    # stepping back up later does not go straight back into the same queue.
    left = t.model_of(spec, st)
    parked = {**down.model_cooldowns,
              left: {**down.model_cooldowns.get(left, {}), st.zone: now + spec.policy.zone_cooldown}} if st.zone else down.model_cooldowns
    recovering = down.but(phase=Phase.RECOVERING, recovering_since=now, model_cooldowns=parked)
    return [WriteStatus(v.job, recovering, "stepped down", replan=True),
            *_delete_current(v, st, "withdrawn: waited past policy.fallback.wait")]


def _capacity_wait(v: JobView, st: JobStatus, working: dict[str, Instance], now: datetime) -> list[Action]:
    """A Flex-start VM in PENDING, or a queued TPU not given its node (read as PENDING): Google is
    still looking for capacity, and bills nothing meanwhile. Said once ("queued") when first
    seen, and once more ("provisioned") if a pass sees the capacity found before RUNNING (the
    "running" event says it otherwise): where the ledger's paid time begins."""
    if st.phase != Phase.PROVISIONING:
        return []
    waiting = [n for n, i in working.items() if i.status == InstanceStatus.PENDING]
    said = next((e.event for e in reversed(st.history) if e.attempt == st.attempt
                 and e.event in ("queued", "provisioned", "launch")), None)
    if waiting and said not in ("queued", "provisioned"):
        text = f"waiting for capacity: {', '.join(waiting)} PENDING in {st.zone} (not billed until it gets some)"
        return [WriteStatus(v.job, st.but(t.event(now, st, "queued", text), message=text), "waiting for capacity")]
    if not waiting and said == "queued":
        text = f"capacity found for {', '.join(st.instances)} in {st.zone}: booting"
        return [WriteStatus(v.job, st.but(t.event(now, st, "provisioned", text), message=text), "capacity found")]
    return []


def _settling(v: JobView, spec: JobSpec, st: JobStatus, mine: dict[str, Instance], now: datetime,
              ctx: LaunchContext) -> list[Action]:
    """Wait; say once in the status which node is in which state (booting is no news).

    Not forever: a node still in such a state after ``idle_timeout`` (``startup_grace`` when
    hang detection is off) is given up as lost."""
    # Once the attempt ran, a node back in a booting state (STAGING...) is as odd as one
    # settling: it is not training, and the heartbeat check does not run meanwhile.
    ran = st.phase == Phase.RUNNING
    odd = [f"{n} is {_state(mine[n])}" for n in st.instances
           if mine[n].status.settling or (ran and mine[n].status != InstanceStatus.RUNNING)]
    if not odd:
        return []
    limit, cause = spec.policy.idle_timeout or spec.policy.startup_grace, "lost"
    if any(mine[n].maintenance for n in st.instances):
        # A TPU under host maintenance: Google may yet bring it back, for so long (0s: not at all).
        limit, cause = spec.policy.maintenance_timeout, "maintenance"
    if st.settling and st.settling_since and (limit or cause == "maintenance") and now - st.settling_since > limit:
        return _restart(v, spec, st, cause, f"{', '.join(odd)} for more than {fmt(limit)}", now, ctx)
    if st.settling:
        return []
    text = f"waiting: {', '.join(odd)}"
    return [WriteStatus(v.job, st.but(t.event(now, st, "settling", text), settling=True, settling_since=now,
                                      message=text), "settling")]


def _finished_workers(v: JobView, st: JobStatus, mine: dict[str, Instance], lost: list[str]) -> list[str]:
    """Gang workers that powered themselves off with no exit record: they finished their part
    (exit 0), and rank 0's exit decides the gang, while rank 0 itself is still watched (its
    heartbeat, its age). A worker that really crashed breaks the collective, and rank 0's
    own non-zero exit, or its stale heartbeat, then says so."""
    leader = st.instances[0]
    if len(st.instances) < 2 or leader not in mine or mine[leader].status.down:
        return []
    done = [n for n in lost if _rank(n) and v.stop_reasons.get(n) == StopReason.CRASHED]
    return done if done == lost else []


def _current(v: JobView, st: JobStatus) -> dict[str, Instance]:
    return {i.name: i for i in v.instances if i.attempt == st.attempt}


def _rank(name: str) -> int:
    parsed = names.parse_instance_name(name)
    return (parsed[2] or 0) if parsed else 0


def _state(instance: Instance) -> str:
    return "under host maintenance (UNHEALTHY_MAINTENANCE)" if instance.maintenance else str(instance.status)


def _lost_how(instance: Instance | None, reason: StopReason) -> str:
    state = "is gone" if instance is None else f"is {instance.status}"
    return f"{state} ({reason.value})"


def _fresh(v: JobView, actions: list[Action]) -> list[Action]:
    """Restarting a VM that looked alive, launching the next attempt, failing at the deadline: ask
    for its exit record to be read again first, so an ``exit 0`` that landed since the listing is
    never lost to a restart or a deadline."""
    # The decision's own write: the first one, which a sweep's trial's claim of its slot comes before.
    first = next((i for i, a in enumerate(actions) if isinstance(a, WriteStatus)), None)
    if v.records_fresh or first is None or any(not isinstance(a, ClaimSlot) for a in actions[:first]):
        return actions
    return [*actions[:first], replace(actions[first], needs=frozenset({"records"})), *actions[first + 1:]]


def _hung(spec: JobSpec, st: JobStatus, mine: dict[str, Instance], now: datetime) -> list[str]:
    """TPU nodes whose health says their runtime is hung, counted as the heartbeat's hang is:
    with hang detection on (``idle_timeout``), once the startup grace is over."""
    hung = [f"{n} health {i.health}" for n, i in mine.items() if i.hung]
    if not hung or spec.policy.idle_timeout is None or st.attempt_started_at is None:
        return []
    return hung if now - _booted(st, mine) >= spec.policy.startup_grace else []


def _booted(st: JobStatus, mine: dict[str, Instance]) -> datetime:
    """When the attempt's startup grace began: Compute's acknowledgement of the insert, or the
    VM's creation if later, or its return from a state it may not have run in."""
    assert st.attempt_started_at is not None
    since = [st.inserted_at or st.attempt_started_at, *(i.created_at for i in mine.values())]
    return max(since + [st.resumed_at] if st.resumed_at else since)


def _stale_heartbeat(v: JobView, spec: JobSpec, st: JobStatus, mine: dict[str, Instance], now: datetime) -> bool:
    """No heartbeat of this attempt for ``idle_timeout``, counting from the end of the startup
    grace, which begins when Compute acknowledged the insert (or the VM was created, if later),
    not when the attempt was committed: a long stockout must not eat the grace."""
    timeout = spec.policy.idle_timeout
    if timeout is None or st.attempt_started_at is None:
        return False
    booted = _booted(st, mine)
    if now - booted < spec.policy.startup_grace:
        return False
    # A held VM's ready records are its agent's beats at the starting line: it lives, and waits for a
    # go that did not reach it yet (the go is given again each pass), never a hang.
    beats = [r.updated for r in (v.heartbeat, v.ready if st.held else None) if r is not None and r.belongs_to(st)]
    last = max([*beats, booted]) if beats else booted + spec.policy.startup_grace
    return now - last > timeout


def _restart(v: JobView, spec: JobSpec, st: JobStatus, cause: str, detail: str, now: datetime,
             ctx: LaunchContext, since: datetime | None = None, recorded: datetime | None = None) -> list[Action]:
    """A loss that is not the trainer's fault: preemption, maintenance, host error, recycling.

    ``since``: when the VM said so (its marker); ``recorded``: when Compute did, where no VM
    said; both for the ledger."""
    lost = _loss_event(now, st, cause, detail, since, _trainer_started(v, st), _progress(v, st), recorded)
    if cause == "recycled":
        st = st.but(recycles=st.recycles + 1)
    else:
        if st.restarts >= spec.policy.max_restarts:
            return _end(v, st.but(lost), Phase.FAILED, f"{detail}; restart budget exhausted "
                        f"(max_restarts {spec.policy.max_restarts})", now)
        st = st.but(restarts=st.restarts + 1, preemptions=st.preemptions + (cause == "preempted"))
    recovering = st.but(lost, phase=Phase.RECOVERING, message=detail, recovering_since=now)
    return _launch(v, spec, recovering, f"{cause}: {detail}", now, ctx)


def _loss_event(now: datetime, st: JobStatus, cause: str, detail: str, since: datetime | None = None,
                trainer_started: datetime | None = None, progress: Mapping[str, int | float] | None = None,
                recorded: datetime | None = None) -> Event:
    """The current attempt lost: where it was, when the VM said so (``since``) or else Compute
    recorded it (``recorded``), when its trainer had started (``_trainer_started``) and how far it
    had got (``_progress``)."""
    return t.event(now, st, cause, detail, since=since, recorded=None if since else recorded, zone=st.zone,
                   instance=st.instances[0] if st.instances else None, trainer_started=trainer_started,
                   **(progress or {}))


def _unsaid_start(v: JobView, st: JobStatus) -> datetime | None:
    """The running attempt's trainer start, where a record gives it and the ledger has none yet.
    Said once: an event of this attempt that carried one (the ledger could not fold it, say) is
    never said again."""
    span = st.ledger.open
    if span is None or span.attempt != st.attempt or span.trainer_started is not None:
        return None
    # A record first: a trainer that reports no start (no agent records) costs no read of the history.
    if (started := _trainer_started(v, st)) is None:
        return None
    if any(e.attempt == st.attempt and e.trainer_started is not None for e in st.history):
        return None
    return started


def _progress(v: JobView, st: JobStatus) -> dict[str, int | float | datetime]:
    """What the current attempt's trainer reported through its agent's records (its own records
    only, by token: a trainer of another attempt or job counts for nothing here), for the ledger:
    the furthest step it finished, its newest save's write and upload times, and its image's pull."""
    mine = sorted((r for r in (*v.records(), v.heartbeat) if r is not None and r.belongs_to(st)),
                  key=lambda r: (r.updated, r.generation))
    found: dict[str, int | float | datetime] = {}
    if pulled := next((r for r in mine if r.pull_started is not None and r.pull_ended is not None), None):
        found.update(pull_started=pulled.pull_started, pull_ended=pulled.pull_ended)  # type: ignore[arg-type]
    if steps := [r.step for r in mine if r.step is not None]:
        found["step"] = max(steps)
    for name in ("save_s", "upload_s"):
        if said := [x for r in mine if (x := getattr(r, name)) is not None]:
            found[name] = said[-1]
    return found


def _trainer_started(v: JobView, st: JobStatus) -> datetime | None:
    """When the current attempt's trainer started, as its agent's records say (the earliest, by
    the VM's clock), for the ledger: the end of its boot, whenever a pass saw it RUNNING."""
    return min((r.trainer_started for r in (*v.records(), v.heartbeat)
                if r is not None and r.trainer_started is not None and r.belongs_to(st)), default=None)


def _failure(v: JobView, spec: JobSpec, st: JobStatus, detail: str, now: datetime,
             since: datetime | None = None) -> list[Action]:
    """The trainer failed: count it, detect a crash loop, back off, or give up. ``since``: when
    its exit record was written, where one decided it."""
    policy = spec.policy
    progressed = v.checkpoint is not None and v.checkpoint != st.stalled_at
    # A checkpoint listing that failed says nothing about progress: not a step to a crash loop.
    stalled = 1 if progressed else st.stalled_failures + (0 if v.checkpoint_error else 1)
    failures, restarts = st.failures + 1, st.restarts + 1
    counted = st.but(failures=failures, stalled_failures=stalled, stalled_at=v.checkpoint or st.stalled_at)
    if failures > policy.max_failures:
        return _end(v, counted, Phase.FAILED, f"{detail}; failure budget exhausted "
                    f"({failures} failures, max_failures {policy.max_failures})", now, since=since)
    if stalled >= policy.crash_loop_failures:
        at = f"checkpoint {v.checkpoint.uri}" if v.checkpoint else "no checkpoint at all"
        return _end(v, counted, Phase.FAILED, f"{detail}; crash loop: {stalled} failures in a row without "
                    f"checkpoint progress ({at})", now, since=since)
    if restarts > policy.max_restarts:
        return _end(v, counted, Phase.FAILED, f"{detail}; restart budget exhausted "
                    f"(max_restarts {policy.max_restarts})", now, since=since)
    delay = t.backoff(spec, stalled)
    text = f"{detail}; failure {failures} of {policy.max_failures}, restarting in {fmt(delay)}"
    nxt = counted.but(_loss_event(now, st, "failed", text, since, _trainer_started(v, st), _progress(v, st)),
                      phase=Phase.RECOVERING,
                      restarts=restarts,
                      not_before=now + delay, message=text, recovering_since=now)
    # Its records stay until the next attempt is inserted (``_insert`` consumes them): a gang
    # worker's failure must still be there to outweigh rank 0's exit 0 landing meanwhile.
    spare: list[Action] = []
    if st.standby is not None:  # a failure restarts after its backoff, never from a standby booted for a preemption
        spare = _delete_standby(v, st, "its attempt failed")
        nxt = handover.withdrawn(nxt, f"attempt {st.attempt} failed: {', '.join(st.standby.instances)} withdrawn", now)
    return [WriteStatus(v.job, nxt, "failure"), *_delete_current(v, st, "attempt failed"), *spare]


def _launch(v: JobView, spec: JobSpec, st: JobStatus, why: str, now: datetime, ctx: LaunchContext) -> list[Action]:
    """Commit and insert the next attempt, once backoff, zone cooldowns and evidence allow."""
    if _blind(v, spec, st):
        return _blind_note(v, spec, st, now)  # an attempt's VMs may live, unseen, in a zone that did not answer
    if st.not_before and now < st.not_before:
        return _delete_current(v, st, why)  # backing off; a VM whose delete failed still goes
    # (A TPU spec's own TPU nodes are waited for below, every one of them, for their quota; a VM
    # left by a spec that moved to a TPU is waited for here, as any VM is.)
    up = [i for i in v.instances if i.attempt == st.attempt and not i.status.down
          and not (spec.tpu is not None and i.tpu) and not _done_going_down(v, st, i, now)]
    since = st.recovering_since or st.created_at or now  # a new run: since it began
    settled = now - since >= _SETTLE_LIMIT or handover.hard_off_passed(st, now)
    if any(i.status.alive for i in up) or (up and not settled):
        # A VM of this attempt is still up: delete it first (its shutdown script gives the
        # trainer the SIGTERM save) and choose the checkpoint once it is gone, so that the
        # save is the one resumed from. One still alive is always waited for (never two
        # live attempts; a delete that keeps failing says so in the status); one stuck on
        # its way down (STOPPING...) is no longer waited for after _SETTLE_LIMIT.
        head = [WriteStatus(v.job, st, why, replan=True)] if st is not v.status else []
        return [*head, *(_delete(v.job, i, why) for i in up)]
    if spec.tpu is not None and (husks := [i for i in v.instances if i.tpu]):
        # A TPU node holds its zone's TPU quota until it is gone, not only until its delete is
        # accepted (it is DELETING for a minute or more): a create beside it fails on quota,
        # which must not read as a stockout. So the next node waits for every node of this job
        # to be gone (one that may yet be READY, always: never two live attempts; REPAIRING, a
        # state Google adds later, a slice's host STOPPING are waited for as one alive is); not
        # forever for one that is down or DELETING (a delete that keeps failing, or slow): after
        # _SETTLE_LIMIT it is created anyway, and a quota error then names the node that holds it.
        if any(not (i.status.down or i.status == InstanceStatus.DEPROVISIONING) for i in husks) \
                or now - since < _SETTLE_LIMIT:
            return _await_husks(v, st, husks, why, now)
        why = f"{why}; {', '.join(i.name for i in husks)} still not gone after {fmt(_SETTLE_LIMIT)}, creating anyway"
    if spec.checkpoint and v.checkpoint_loaded and v.checkpoint_error:
        text = (f"waiting: cannot list checkpoint.uri {spec.checkpoint.uri} ({v.checkpoint_error}); "
                "fix the URI or grant the controller's service account roles/storage.objectViewer on it")
        return [*_note(v, st, "checkpoint", text, now), *_delete_current(v, st, why)]
    if st.standby is not None:
        return _promote(v, spec, st, why, now, ctx)
    if denied := {z: v.denied_zones[z] for z in spec.zones if z in v.denied_zones}:
        if len(denied) == len(spec.zones):
            # Not at once: a grant made just before (respawn deploy's) takes minutes to hold.
            text = f"no zone of the spec can be used: {_denials(denied, spec, ctx)}"
            if now - (st.created_at or now) >= _DENIED_GRACE:
                return _end(v, st, Phase.FAILED, text, now)
            return [*_note(v, st, "denied", f"waiting: {text}", now), *_delete_current(v, st, why)]
        why = f"{why}; skipping {_denials(denied, spec, ctx)}"
    # A refusal holds for one attempt (begin_attempt forgets them). The models the job may use
    # are all candidates, preferred in the spec's order, each with its own cooldowns. A model
    # refused everywhere was refused for the spec of its time: a spec replaced since (another
    # machine type, another list) is tried afresh, never left with no model to wait on.
    claim, queued = _admission(v, spec, st, why, now)
    if queued is not None:
        return [*queued, *_delete_current(v, st, why)]
    fresh = st.but(zone_rejections={}, **({"refused_models": {}} if st.spec_generation != v.spec_generation else {}))
    choice = t.choose(spec, fresh, now, lambda m: v.zone_order(m, now))
    if choice is None:
        return [_waiting(v, spec, st, now), *_delete_current(v, st, why)]
    model, zone = choice
    if model != t.model_of(spec, st):
        fresh = t.switch_model(fresh, spec, model, now)
        why = f"{why}; {fresh.message}"
    nodes = names.node_names(v.job, t.next_attempt(st), spec.nodes)
    nxt = t.begin_attempt(fresh, spec, _project(spec, ctx), zone, nodes, v.checkpoint, now, why,
                          v.spec_generation, ctx.new_token(), model, v.advice_for(model))
    # What is left of the previous attempt is down, or stuck on its way down: its deletes
    # come after the insert, so that one that keeps failing never holds the next attempt.
    return [*claim, WriteStatus(v.job, nxt, why), *_insert(v, spec, nxt, now, ctx), *_delete_current(v, st, why)]


SLOT_EVENT = "waiting-for-slot"  # a trial's wait for its sweep's slot, in its history


def _admission(v: JobView, spec: JobSpec, st: JobStatus, why: str, now: datetime,
               ) -> tuple[list[Action], list[Action] | None]:
    """A sweep's trial launches only holding a slot of its sweep, so that at most ``max_parallel``
    trials hold VMs: (the claim to make first, if any; None, or what to do instead: wait QUEUED).
    A trial waiting here never tried a zone: no stockout, no cooldown, no step down."""
    if spec.sweep is None:
        return [], None
    slots = v.slots
    if slots is not None and (held := slots.held_by(v.job)):
        # Claimed again (create-if-absent, then whose it is): held by this listing, which may be
        # older than a release, is not held now.
        return [ClaimSlot(v.job, slots.sweep, held[0][0], why)], None
    if slots is None or slots.limit is None:
        problem = slots.problem if slots is not None else "not read"
        text = (f"queued: the record of sweep {spec.sweep.name} cannot be read ({problem}); submit the sweep again "
                "with respawn sweep submit")
        return [], _queued(v, st, text, now)
    if free := slots.free():
        # Spread by the trial's number: trials queued together claim different slots in one pass.
        return [ClaimSlot(v.job, slots.sweep, free[spec.sweep.trial % len(free)], why)], None
    text = (f"queued: all {slots.limit} of sweep {slots.sweep}'s slots are held (max_parallel {slots.limit}); "
            "it starts when one of its trials is over")
    return [], _queued(v, st, text, now)


def _queued(v: JobView, st: JobStatus, text: str, now: datetime) -> list[Action]:
    """Wait for a slot, said once. Only a trial that has not started is QUEUED: one between attempts
    (RECOVERING: its slot listing failed this pass, say) keeps its phase, and with it the checks made
    between attempts, and only says why it waits. (Not the "queued" event: that is a capacity wait's,
    which the ledger reads.)"""
    if st.message == text:
        return []  # said once, not a write on every pass
    if st.phase not in (Phase.PENDING, Phase.QUEUED):
        return _note(v, st, SLOT_EVENT, text, now)
    return [WriteStatus(v.job, st.but(t.event(now, st, SLOT_EVENT, text), phase=Phase.QUEUED, message=text),
                        SLOT_EVENT)]


def _done_going_down(v: JobView, st: JobStatus, i: Instance, now: datetime) -> bool:
    """A VM on its way down (STOPPING...) whose own marker says its work is done.

    The shutdown script writes the marker once the trainer has exited (its SIGTERM save
    landed) or at its deadline just before the hard-off: nothing more will come from that
    VM, so the next attempt need not wait for it to be down. Waiting would wait for the next
    tick: nothing else fires when a VM finishes going down. Only the VM that wrote the
    marker: a gang's other nodes may still be saving."""
    return (not i.status.alive and v.marker is not None and v.marker.belongs_to(st)
            and v.marker.instance == i.name
            # A standby starts its trainer within a second of the go: a marker written at the
            # script's deadline leaves its trainer writing until the hard-off, which is waited out.
            and (st.standby is None or handover.saved_or_late(v.marker, now)))


def _await_husks(v: JobView, st: JobStatus, husks: list[Instance], why: str, now: datetime) -> list[Action]:
    """Delete what is left of the job's TPU nodes, and wait until they are gone.

    The deletes come first: one that fails says so in the status (the executor), once, and
    the waiting note is not written over it on every pass."""
    going = [i for i in husks if i.status == InstanceStatus.DEPROVISIONING]  # delete accepted: wait
    deletes = [_delete(v.job, i, why) for i in husks if i not in going]
    if st is not v.status:  # the loss was just decided: commit it first, then come back
        return [WriteStatus(v.job, st, why, replan=True), *deletes]
    text = (f"waiting for {', '.join(i.name for i in husks)} to be gone: a TPU node holds its zone's TPU "
            "quota until its delete is done")
    return [*deletes, *_note(v, st, "husk", text, now)]


_UNDER_WAY = frozenset({InstanceStatus.PROVISIONING, InstanceStatus.STAGING})


def _insert(v: JobView, spec: JobSpec, st: JobStatus, now: datetime, ctx: LaunchContext) -> list[Action]:
    """(Re)issue the current attempt's insert; the request id makes a repeat harmless.

    Before any insert, the attempt's VMs are looked for wherever they can be (every zone its
    status named before an insert): an earlier insert may have been accepted with its status
    write lost (or still running), and a new zone would then mean the same attempt in two
    zones. Found RUNNING, the insert is done; found PROVISIONING or STAGING, under way.
    """
    # Not the other kind's capacity record when the spec moved between VMs and a TPU since (it is
    # dropped at the switch).
    same_kind = st.attempt_tpu == (spec.tpu is not None)
    if same_kind and not any(i.attempt == st.attempt for i in v.instances) and (up := _step_up(v, spec, st, now)):
        # Nothing of this attempt exists: it goes up a model whose capacity is back at every try,
        # not only at a try that lands while its zones cool (a one-minute cooldown and a tick a
        # minute apart never met).
        return [up]
    if st.not_before and now < st.not_before and not _quota_freed(v, st):
        # Cooling or backing off past fallback.wait: step down.
        if same_kind and (down := t.waited_too_long(st, spec, now)) is not None:
            return [WriteStatus(v.job, down, "stepped down", replan=True)]
        return []
    if _blind(v, spec, st):
        return _blind_note(v, spec, st, now)  # an earlier try of this attempt may live, unseen, where no list reached
    found = [i for i in v.instances if i.attempt == st.attempt]
    wanted = tuple(names.node_names(v.job, st.attempt, spec.nodes))
    tpu = spec.tpu is not None
    if found and (any(i.zone != st.zone or i.tpu != tpu for i in found) or st.zone not in spec.zones
                  or {i.name for i in found} != set(st.instances) or st.instances != wanted):
        # Where it is, how much of it is left, or what the spec now asks differs from what
        # the status committed (a status write lost, a node gone, a spec replaced since):
        # adopt what exists, never insert anew; a missing node is then a lost one.
        return [WriteStatus(v.job, _adopt(v, st, st.attempt, now), "attempt found")]
    if found and all(i.status == InstanceStatus.RUNNING for i in found):
        # Every node RUNNING: Compute's insert operation is done, and it succeeded. Asking again
        # would tell only that, at the price of a mutation against the project's rate quota
        # (after a mass preemption, a thousand of them in one minute: bench mass_recovery).
        return [WriteStatus(v.job, t.inserted(st, now), "inserted"), *_consume(v, st)]
    if found and all(i.status in _UNDER_WAY for i in found) and not any(i.tpu_api == "compute" for i in found):
        # Accepted and under way: the operation ends with the VMs RUNNING, or they are gone
        # and the same request id, asked again, tells why. (Not PENDING: a Flex-start VM's
        # insert is done while it waits for capacity, and only its answer says so. Nor a slice in
        # Compute Engine: a MIG without room never ends its create, it keeps trying in BULK mode,
        # and only the create, asked again, reads its stockout and stops it.)
        return _note(v, st, "insert-pending", t.insert_pending_text(st.zone), now)
    switched = not found and st.attempt_tpu != tpu
    if switched:
        # The spec moved between VMs and a TPU after this attempt was committed, and nothing of
        # the attempt exists (an accepted create is listed at once, PROVISIONING or CREATING, and
        # adopted above): it goes on as the new kind.
        st = t.switch_kind(st, spec, now)
    head: list[Action] = []
    if not found:  # else: ask again under the same request id, and Compute tells the outcome
        # The zone the attempt committed to, while it can still be used: an earlier try's
        # outcome may be unknown (a lost answer, a crash), and advice that changed since must
        # never put a second try of one attempt in another zone.
        kept = (st.zone in spec.zones and st.zone not in v.denied_zones and not st.not_before
                and t.usable(st, st.zone, now))
        zone = st.zone if kept else t.pick_zone(spec, st, now, v.zone_order(t.model_of(spec, st), now))
        if zone is None:
            return [_waiting(v, spec, st, now)]
        if zone != st.zone or st.not_before or st.instances != wanted or switched:
            # The status names exactly what is inserted, where, and as which kind (a spec
            # replaced since the attempt began may have changed all three).
            moved = t.retargeted(t.move_zone(st, zone, now), spec) if zone != st.zone or st.not_before else st
            st = moved.but(instances=wanted)
            head = [WriteStatus(v.job, st, "zone chosen")]
    create = CreateInstances(v.job, st.attempt, requests_for(v.job, spec, st, ctx),
                             names.request_id(v.job, st.attempt, st.placement, _run(st)), spec, f"attempt {st.attempt}")
    return [*head, create, WriteStatus(v.job, t.inserted(st, now), "inserted"), *_consume(v, st)]


def _denials(denied: dict[str, str], spec: JobSpec, ctx: LaunchContext) -> str:
    """The zones the TPU API refused to the project, each with Google's words and the fix."""
    project = _project(spec, ctx)
    each = "; ".join(f"{z}: {why[:200]}" for z, why in denied.items())
    return (f"project {project} may not use {each} (the zone must offer Cloud TPU, and the controller's "
            "account needs tpu.nodes.list and tpu.nodes.create there: roles/tpu.admin); "
            "fix the zone or the grant, or remove the zone from the spec")


def _step_up(v: JobView, spec: JobSpec, st: JobStatus, now: datetime) -> WriteStatus | None:
    """The attempt, not created yet, on a model above its own whose capacity is back (a zone not
    cooling on it) now that ``fallback.step_up_after`` has passed: while the job is not running,
    every model it may use is a candidate, the spec's order preferred."""
    choice = t.choose(spec, st, now, lambda m: v.zone_order(m, now))
    if choice is None or choice[0] == t.model_of(spec, st):
        return None
    up = t.switch_model(st, spec, choice[0], now).but(zone=choice[1])
    return WriteStatus(v.job, up, "stepped up", replan=True)


def _waiting(v: JobView, spec: JobSpec, st: JobStatus, now: datetime) -> WriteStatus:
    """Every zone is cooling: go up a model whose capacity is back, or wait, or step down the
    provisioning list and go on at once."""
    if (up := _step_up(v, spec, st, now)) is not None:
        return up
    nxt = t.wait_for_zone(st, spec, now)
    if nxt.provisioning != st.provisioning:
        return WriteStatus(v.job, nxt, "stepped down", replan=True)
    return WriteStatus(v.job, nxt, "zones cooling")


def _blind_note(v: JobView, spec: JobSpec, st: JobStatus, now: datetime) -> list[Action]:
    """Nothing is created while the job's instances cannot all be seen; a project whose list
    failed (no IAM, the TPU API not enabled) says so in the status, once, with Google's words."""
    projects = _unseen(v, spec, st)
    if not projects:
        return []  # a zone that did not answer: passing, and every pass would say it anew
    why = "; ".join(f"{p}: {v.unseen_why.get(p, 'unknown error')}" for p in projects)
    return _note(v, st, "blind", f"waiting: cannot list this job's instances in project {why[:400]}", now)


def _blind(v: JobView, spec: JobSpec, st: JobStatus) -> bool:
    """Whether a zone this job may have VMs in (its spec's, and every zone its history
    names, a previous run's included) did not answer the instance list."""
    if _unseen(v, spec, st):
        return True
    if not v.unreachable:
        return False
    zones = {*spec.zones, st.zone, *(e.zone for e in st.history)}
    return bool(zones & set(v.unreachable))


def _unseen(v: JobView, spec: JobSpec, st: JobStatus) -> list[str]:
    """The job's projects whose list failed this pass: the spec's, and the status's while this
    run has begun an attempt (a new run keeps the previous run's project for its leftovers to
    be found, but a project left behind, dropped from the policy, must not hold a run that
    never went there)."""
    mine = (spec.project, st.project if st.attempt_started_at else None)
    return [p for p in dict.fromkeys(mine) if p and p in v.unseen_projects]


def _run(st: JobStatus) -> str:
    """What tells this run from an earlier one of the same job name: when it began."""
    return st.created_at.isoformat() if st.created_at else ""


def _project(spec: JobSpec, ctx: LaunchContext) -> str:
    """Where VMs go: the spec's project, which the policy checked is one the controller lists."""
    return spec.project or ctx.default_project


def _note(v: JobView, st: JobStatus, name: str, text: str, now: datetime) -> list[Action]:
    """Say why the job waits, once (not a status write on every pass)."""
    if st.message == text:
        return []
    return [WriteStatus(v.job, st.but(t.event(now, st, name, text), message=text), name)]


def _end(v: JobView, st: JobStatus, phase: Phase, detail: str, now: datetime, since: datetime | None = None,
         **changes: object) -> list[Action]:
    # The spec generation this was decided under: a spec replaced during the run
    # (``--replace``) applied to its remaining attempts, not to a run after the end.
    changes.setdefault("spec_generation", v.spec_generation)
    if st.standby is not None:  # its VMs are deleted with the rest (_leftovers); its number never reused
        st = st.but(standby=None, withdrawn=max(st.withdrawn, st.standby.attempt))
    done = t.finish(st, phase, detail, now, since=since, trainer_started=_trainer_started(v, st),
                    progress=_progress(v, st), **changes)
    return [WriteStatus(v.job, done, phase.lower()), *_leftovers(v)]


def _earlier_runs(v: JobView, st: JobStatus, attempt: int) -> bool:
    """Whether ``attempt``'s instances are an earlier run's: this run has begun no attempt, and
    each was created before it began (a pass of this run inserts only after its status)."""
    found = [i for i in v.instances if i.attempt == attempt]
    return (st.phase in (Phase.PENDING, Phase.QUEUED) and st.attempt_started_at is None and st.created_at is not None
            and bool(found) and all(i.created_at < st.created_at for i in found))


def _adopt(v: JobView, st: JobStatus, attempt: int, now: datetime) -> JobStatus:
    found = sorted((i for i in v.instances if i.attempt == attempt), key=lambda i: _rank(i.name))
    first = found[0]
    # Every node the attempt has, not only those still there: a missing one is lost.
    parsed = [names.parse_instance_name(i.name) for i in found]
    ranks = [p[2] for p in parsed if p and p[2] is not None]
    if ranks:
        # This attempt's size is what its status committed; a newer one's, the spec's.
        size = len(st.instances) if attempt == st.attempt else (v.spec.nodes if v.spec else 0)
        count = max(max(ranks) + 1, size)
        names_ = tuple(names.instance_name(v.job, attempt, r) for r in range(count))
    else:
        names_ = (names.instance_name(v.job, attempt),)
    where = f"{', '.join(i.name for i in found if i.zone == first.zone)} in {first.zone}"
    detail = (f"found {where} for attempt {attempt}; adopting it" if attempt == st.attempt
              else f"found {where} newer than status attempt {st.attempt}; adopting it")
    return st.but(t.event(now, st, "adopted", detail), phase=Phase.PROVISIONING, attempt=attempt,
                  instances=names_, project=first.project, zone=first.zone, inserted=True, inserted_at=now,
                  tpu=st.tpu or (first.tpu and first.tpu_api == "tpu"),
                  tpu_compute=st.tpu_compute or (first.tpu and first.tpu_api == "compute"), attempt_tpu=first.tpu,
                  attempt_compute=first.tpu and first.tpu_api == "compute",
                  attempt_token=st.attempt_token if attempt == st.attempt else None,
                  attempt_started_at=st.attempt_started_at or now, started_at=st.started_at or now, message=detail)


def _delete_current(v: JobView, st: JobStatus, why: str) -> list[Action]:
    return [_delete(v.job, i, why) for i in v.instances if i.attempt == st.attempt]


def _cleanup(v: JobView, st: JobStatus) -> list[Action]:
    """Husks of older attempts go at once (a stopped one within a tick's budget: ``_delete``); their
    records only after the new insert is acknowledged."""
    # A husk's delete that fails never holds what follows (DeleteInstance.husk).
    husks = [replace(_delete(v.job, i, f"left over from attempt {i.attempt}"), husk=True)
             for i in v.instances if i.attempt < st.attempt or (_spare(st, i) and not _standing_by(st, i))]
    if not st.inserted:
        return husks
    stale = [r for r in v.records() if not r.belongs_to(st) and not r.belongs_to_standby(st)]
    if v.ready is not None and not v.ready.belongs_to_standby(st) and not (v.ready.belongs_to(st) and st.held):
        stale.append(v.ready)  # its VM is past the line, or it was never one of ours to wait
    return [*husks, *(DeleteRecord(v.job, r.key, r.generation, _why_stale(r, st)) for r in stale)]


def _why_stale(record: Record, st: JobStatus) -> str:
    if record.attempt is None and not record.detail.startswith("unreadable"):
        return f"ignored: {record.detail}"  # judged on its listing alone (Record.unread)
    if record.attempt is None:
        return f"ignored: unreadable ({record.detail})"
    if record.attempt == st.attempt:
        return "ignored: it lacks the attempt's secret (not written by this attempt's VMs)"
    return f"stale: from attempt {record.attempt}"


def _consume(v: JobView, st: JobStatus) -> list[Action]:
    """Delete the records this decision acted on; they come last in the chain. Never one of ``st``'s
    own VMs (a notice its agent wrote before a pass asked Compute again for its insert is news)."""
    return [DeleteRecord(v.job, r.key, r.generation, f"acted on by attempt {st.attempt}")
            for r in v.records() if not r.belongs_to(st)]


def _leftovers(v: JobView, orphan: bool = False) -> list[Action]:
    """A finished, cancelled or spec-less job: delete what it still has.

    Only what this pass saw, and each delete re-checked by the executor (see
    ``DeleteInstance``). Records are cleaned up here for a job the controller ran (it
    has a status); those of a name with neither spec nor status are ``_strays``.
    """
    why = "orphan: its job has no spec" if orphan else "job has ended"
    records = v.records() if v.status else ()
    return [*(_delete(v.job, i, why, orphan) for i in v.instances),
            *(DeleteRecord(v.job, r.key, r.generation, why) for r in records)]


def _strays(v: JobView, now: datetime) -> list[Action]:
    """VM records under a name with neither spec nor status: no attempt can ever own them (each
    attempt's token is new), and anything that can write a VM record could write them by the
    million. Deleted once older than STRAY_GRACE (GCS's ``updated``), which spares the records of
    a job whose spec and status are being written right now (a bucket copied name by name lands
    ``exit`` before ``spec.yaml``); each delete by generation, so a record rewritten meanwhile
    stays, and only while the job still has no status (the executor re-checks). The observer
    hands over a bounded number per pass, oldest first."""
    old = [r for r in (v.marker, *v.exits, v.heartbeat, v.notice, v.ready) if r and now - r.updated >= STRAY_GRACE]
    return [DeleteRecord(v.job, r.key, r.generation, f"stray: no spec or status for {fmt(STRAY_GRACE)}")
            for r in old]


def _delete(job: str, i: Instance, why: str, orphan: bool = False) -> DeleteInstance:
    # A VM that is stopped (TERMINATED: no machine billed, only its disk) may wait for a tick's
    # budget; one in any other state (on its way down, SUSPENDED with its memory billed, a state
    # Google adds later) never does, nor a TPU node: it holds its zone's TPU quota until deleted.
    return DeleteInstance(job, i.project, i.zone, i.name, why, only_if_spec_absent=orphan, tpu=i.tpu, tpu_api=i.tpu_api,
                          deferrable=not i.tpu and i.status.stopped)


# -- zero-gap recovery: the standby and the starting line (controller.core.handover) ------------


def _spare(st: JobStatus, i: Instance) -> bool:
    """An instance numbered past the current attempt that is no attempt of its own: the standby's,
    or a withdrawn standby's (never adopted; a husk)."""
    return _standing_by(st, i) or st.attempt < i.attempt <= st.withdrawn


def _standing_by(st: JobStatus, i: Instance) -> bool:
    return st.standby is not None and i.attempt == st.standby.attempt


def _standby(v: JobView, spec: JobSpec, st: JobStatus, mine: dict[str, Instance], now: datetime,
             ctx: LaunchContext) -> list[Action]:
    """The current attempt is about to be lost to a preemption (or is being lost): boot the next one
    beside it; while it boots, insert it until Compute takes it; withdraw it when no preemption came."""
    sb = st.standby
    if sb is None:
        ahead = handover.preemption_ahead(v, st, mine, now) if handover.may_stand_by(spec, st) else None
        if ahead is None:
            return []
        why, until = ahead
        if now >= until and all(i.status == InstanceStatus.RUNNING for i in mine.values()):
            # Seen only past its bound (a late pass) with every VM still RUNNING: it came to nothing,
            # and is spent as a withdrawn standby's is. Kept, it would stand for a later preemption
            # of the same VM (which gets no second notice) with its bound long past: a go at once,
            # while that VM still saves.
            spent = [DeleteRecord(v.job, v.notice.key, v.notice.generation, "came to nothing")] \
                if v.notice is not None and v.notice.belongs_to(st) else []
            return [*_note(v, st, "notice", f"{why}: no preemption came by {until:%H:%M:%S} UTC", now), *spent]
        return _begin_standby(v, spec, st, why, until, now, ctx)
    if not handover.may_stand_by(spec, st) or sb.spec_generation != v.spec_generation:
        return _stand_down(v, st, f"{', '.join(sb.instances)} no longer fits the job (its spec or budget changed)", now)
    if why := _standby_lost(v, st):
        return _stand_down(v, st, why, now, notice=True)
    if why := handover.came_to_nothing(v, st, mine, now):
        return _stand_down(v, st, why, now, notice=True)
    if not sb.inserted:
        return _insert_standby(v, spec, st, now, ctx)
    return []


def _begin_standby(v: JobView, spec: JobSpec, st: JobStatus, why: str, until: datetime, now: datetime,
                   ctx: LaunchContext) -> list[Action]:
    # On the model a launch would choose now (issue 35, item 19): a job stepped down goes back up at
    # a standby as at a launch after the VM is down; on its own model, the preempting zone last.
    current = t.model_of(spec, st)
    choice = t.choose(spec, st, now, lambda m: handover.standby_order(v, spec, st, now) if m == current
                      else v.zone_order(m, now))
    if choice is None:
        return _note(v, st, "standby", f"{why}: every zone is cooling, so no replacement boots beside it; "
                     "it is launched once the VM is down", now)
    model, zone = choice
    nxt = handover.standby_for(v, spec, st, _project(spec, ctx), zone, ctx.new_token(), why, until, now,
                               v.spec_generation, model)
    return [WriteStatus(v.job, nxt, "standby"), *_insert_standby(v, spec, nxt, now, ctx)]


def _insert_standby(v: JobView, spec: JobSpec, st: JobStatus, now: datetime, ctx: LaunchContext) -> list[Action]:
    """Insert the standby, again if need be: the request id makes a repeat harmless, and Compute
    answers it with the first try's operation (one accepted by an earlier pass whose status write was
    lost, or still under way: then not inserted yet, and its VMs' grace not begun)."""
    sb = st.standby
    assert sb is not None
    create = CreateInstances(v.job, sb.attempt, standby_requests(v.job, spec, st, ctx),
                             names.request_id(v.job, sb.attempt, sb.placement, _run(st)), spec,
                             f"standby attempt {sb.attempt}", standby=True)
    return [create, WriteStatus(v.job, handover.standby_inserted(st, now), "standby inserted")]


def _standby_lost(v: JobView, st: JobStatus) -> str | None:
    """Why the standby is of no use any more: its own VMs got a preemption notice, or are going or gone
    down (or vanished) at their line. None otherwise, and while its zone cannot be seen."""
    sb = st.standby
    assert sb is not None
    if v.notice is not None and v.notice.belongs_to_standby(st):
        return f"{v.notice.instance or sb.instances[0]} got a preemption notice at its starting line"
    if not sb.inserted or sb.zone in v.unreachable:
        return None
    theirs = {i.name: i for i in v.instances if _standing_by(st, i)}
    # Not alive is lost: one STOPPING (Compute preempting it at its line) would take the go and
    # leave the line without starting, a restart for nothing.
    gone = [n for n in sb.instances if n not in theirs or not theirs[n].status.alive]
    return f"{', '.join(gone)} lost at its starting line" if gone else None


def _stand_down(v: JobView, st: JobStatus, why: str, now: datetime, notice: bool = False) -> list[Action]:
    """Give the standby up, and its VMs; ``notice``: the notice that launched it (or one its own VMs
    wrote) is spent too."""
    spent: list[Action] = []
    if notice and v.notice is not None and (v.notice.belongs_to(st) or v.notice.belongs_to_standby(st)):
        spent = [DeleteRecord(v.job, v.notice.key, v.notice.generation, "came to nothing")]
    return [WriteStatus(v.job, handover.withdrawn(st, why, now), "standby withdrawn"), *_delete_standby(v, st, why),
            *spent]


def _delete_standby(v: JobView, st: JobStatus, why: str) -> list[Action]:
    return [_delete(v.job, i, why) for i in v.instances if _standing_by(st, i)]


def _promote(v: JobView, spec: JobSpec, st: JobStatus, why: str, now: datetime, ctx: LaunchContext) -> list[Action]:
    """The current attempt's save is in: the standby becomes the current attempt, from the newest
    complete checkpoint now, and its VMs get the go. A standby the job no longer fits (its spec
    replaced since, or moved to a TPU) is withdrawn, and the next round launches afresh."""
    sb = st.standby
    assert sb is not None
    fits = (spec.tpu is None and sb.provisioning in spec.provisioning and sb.zone in spec.zones
            and sb.zone not in v.denied_zones and sb.spec_generation == v.spec_generation)
    unfit = None if fits else f"{', '.join(sb.instances)} no longer fits the job's spec"
    if unfit := unfit or _standby_lost(v, st):
        gone = handover.withdrawn(st, f"{unfit}: launching afresh", now)
        return [WriteStatus(v.job, gone, why, replan=True), *_delete_standby(v, st, why)]
    fresh = st.but(zone_rejections={}, **({"refused_models": {}} if st.spec_generation != v.spec_generation else {}))
    begun = t.begin_attempt(fresh, spec, sb.project, sb.zone, sb.instances, v.checkpoint, now, why, v.spec_generation,
                            sb.token, sb.provisioning, v.advice_for(sb.provisioning), attempt=sb.attempt,
                            verb="giving the go to")
    nxt = handover.promoted(st, begun, now)
    head: list[Action] = [WriteStatus(v.job, nxt, why)]
    if not nxt.inserted:
        # Its insert is sent again, carrying the go itself (launch._metadata); Compute may answer it
        # with the standby's own first insert (the same request id), whose VMs lack the go: given too.
        return [*head, *_insert(v, spec, nxt, now, ctx), *_go(v.job, nxt), *_delete_current(v, st, why)]
    return [*head, *_go(v.job, nxt), *_consume(v, nxt), *_delete_current(v, st, why)]


def _go(job: str, st: JobStatus) -> list[Action]:
    if st.go_at is None or not st.project or not st.zone:
        return []
    return [ReleaseLine(job, st.attempt, st.project, st.zone, st.instances, go_items(st), f"the go for attempt {st.attempt}")]


def _gang_go(v: JobView, st: JobStatus) -> list[Action]:
    """The go again, before a held gang's line is left behind (``held`` cleared): its rank 0 past the
    line says nothing of the other nodes' go (a setMetadata that failed for one, a pass that died
    between two), and a node without it would wait there for ever, rank 0 with it. What follows
    waits for it (``ReleaseLine.gate``). One VM past its line had its go."""
    return [replace(go, gate=True) for go in _go(v.job, st)] if len(st.instances) > 1 else []


def _quota_freed(v: JobView, st: JobStatus) -> bool:
    """The quota an insert was refused for was held by this job's own VMs, and none of them is up
    now (down, gone, or its marker says its work is done): try again at once."""
    if not st.quota_held_by:
        return False
    up = {i.name for i in v.instances if i.name in st.quota_held_by and not i.status.down}
    done = {v.marker.instance} if v.marker is not None and v.marker.instance else set()
    return not (up - done)
