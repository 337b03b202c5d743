"""Zero-gap recovery: the next attempt boots while the current one saves, then starts on a go.

A Spot VM's preemption is known before it happens: its agent's notice record (written the moment
the metadata server's ``instance/preempted`` turns TRUE, up to 120 s before the soft-off), or
Compute's own record that it preempted a VM that is still on its way down. From then on the
current attempt's VM has nothing to do but save; booting its replacement only after the save
(as a recovery did before) costs the boot on top of the save. So the replacement, the
*standby*, is inserted at once, beside it, and its VMs prepare (image, code, data), then wait at
a *starting line* (metadata ``respawn-hold``) until the controller gives the go
(``respawn-go``, by ``instances.setMetadata``: only the controller holds that right). The go
comes when the current attempt's save is in: its marker, or every VM of it down, or the line's
bound (the notice, plus Spot's 30 s shutdown and 5 s of slack: Compute has powered the guest off
by then). The newest complete checkpoint is resolved then, by the same finder as ever, and goes
with the go. Never two trainers of one job past the line at once.

A notice that comes to nothing (the VM still RUNNING past the bound) withdraws the standby: one
VM, never two. Pure: the planner (``controller.core.planner``) turns these into actions.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from controller.core import errors, names, transitions as t
from controller.core.durations import format_duration as fmt
from controller.core.ports import Instance, InstanceStatus, StopReason
from controller.core.spec import JobSpec
from controller.core.state import JobStatus, Phase, Standby
from controller.core.world import JobView, Record

# Spot's shutdown (the soft-off to the hard-off), and slack for clocks and Compute's own lag.
SHUTDOWN = timedelta(seconds=30)
SLACK = timedelta(seconds=5)
# A marker written at the shutdown script's deadline (``saved: false``) comes a margin before the
# hard-off (at most 5 s): its trainer may still be writing until then.
MARKER_MARGIN = timedelta(seconds=6)


def may_stand_by(spec: JobSpec, st: JobStatus) -> bool:
    """A standby is for a Spot VM job (a TPU holds its quota until it is deleted, and its API has
    no metadata to hold a node at a line) whose current attempt was inserted and still runs."""
    return (spec.tpu is None and not st.attempt_tpu and st.provisioning == "spot" and st.inserted
            and st.phase in (Phase.PROVISIONING, Phase.RUNNING) and st.restarts < spec.policy.max_restarts)


def preemption_ahead(v: JobView, st: JobStatus, mine: dict[str, Instance], now: datetime) -> tuple[str, datetime] | None:
    """(why, the line's bound) when the current attempt is about to be lost to a preemption, or is
    being lost (on its way down): its VM's notice record, or Compute's word that it preempted a VM
    of it that is still going down. None otherwise.

    A notice is anchored at GCS's time for its record (the controller's clock, not the VM's): the
    soft-off comes at most the attempt's notice later, the hard-off 30 s after it."""
    notice = v.notice
    if notice is not None and notice.belongs_to(st) and notice.detail == "preempted":
        until = notice.updated + timedelta(seconds=st.notice_s) + SHUTDOWN + SLACK
        why = f"preemption notice from {notice.instance or 'a VM'}"
        if now >= until and any(i.status.settling for i in mine.values()):
            # Seen only past its bound, a VM on its way down: the notice may have come to nothing
            # and this be a later preemption (a VM gets one notice per boot), whose soft-off may be
            # now. Its guest is waited for as if it began now, never taken for off already.
            return why, now + SHUTDOWN + SLACK
        return why, until
    going = [n for n, i in mine.items() if i.status.settling and v.stop_reasons.get(n) == StopReason.PREEMPTED]
    if going:
        # Compute records the preemption at the soft-off: the guest is off within 30 s of it.
        return f"Compute is preempting {', '.join(going)}", now + SHUTDOWN + SLACK
    return None


def standby_for(v: JobView, spec: JobSpec, st: JobStatus, project: str, zone: str, token: str, why: str,
                until: datetime, now: datetime, spec_generation: int | None, model: str | None = None) -> JobStatus:
    """The status that commits a standby in ``zone`` (not inserted yet), on ``model`` (the current
    attempt's when None; one above it when the job steps back up)."""
    attempt = t.next_attempt(st)
    nodes = tuple(names.node_names(v.job, attempt, spec.nodes))
    current = t.model_of(spec, st)
    model = model or current
    sb = Standby(attempt=attempt, project=project, zone=zone, instances=nodes, token=token,
                 provisioning=model, since=now, until=until, cause=why,
                 spec_generation=spec_generation)
    up = f" ({model}: stepping back up from {current})" if model != current else ""
    text = (f"{why}: creating {', '.join(nodes)} in {zone}{up} beside {', '.join(st.instances)}, to wait at the "
            "starting line until its save is in")
    return st.but(t.event(now, st, "standby", text, instance=nodes[0], zone=zone), standby=sb, message=text)


def standby_order(v: JobView, spec: JobSpec, st: JobStatus, now: datetime) -> list[str]:
    """The zones a standby may go to, best first, the preempting zone last: Spot capacity there is
    being reclaimed right now."""
    order = [z for z in v.zone_order(t.model_of(spec, st), now) if z != st.zone]
    return [*order, *([st.zone] if st.zone in spec.zones and st.zone not in v.denied_zones else [])]


def standby_inserted(st: JobStatus, now: datetime) -> JobStatus:
    sb = st.standby
    assert sb is not None
    text = f"Compute accepted {', '.join(sb.instances)} in {sb.zone}: booting, to wait at the starting line"
    return st.but(t.event(now, st, "standby-inserted", text, instance=sb.instances[0], zone=sb.zone),
                  standby=sb.model_copy(update={"inserted": True, "inserted_at": now}), message=text)


def withdrawn(st: JobStatus, why: str, now: datetime) -> JobStatus:
    """The standby given up: its number is never used again (its VMs may still be going down)."""
    sb = st.standby
    assert sb is not None
    # ``since``: when Compute accepted its VMs (None: never): billed from then to now, for nothing.
    return st.but(t.event(now, st, "standby-withdrawn", why, instance=sb.instances[0], zone=sb.zone,
                          since=sb.inserted_at),
                  standby=None, withdrawn=max(st.withdrawn, sb.attempt), message=why)


def came_to_nothing(v: JobView, st: JobStatus, mine: dict[str, Instance], now: datetime) -> str | None:
    """Why the standby is withdrawn now: past its bound, every VM of the current attempt is still
    RUNNING and none wrote a marker (a notice after which no preemption came). None otherwise."""
    sb = st.standby
    if sb is None or now < sb.until or (v.marker is not None and v.marker.belongs_to(st)):
        return None
    if len(mine) != len(st.instances) or any(i.status != InstanceStatus.RUNNING for i in mine.values()):
        return None
    return (f"{', '.join(st.instances)} still RUNNING {fmt(now - sb.since)} after the {sb.cause.split(' from ')[0]}: "
            f"no preemption came; withdrawing {', '.join(sb.instances)}")


def hard_off_passed(st: JobStatus, now: datetime) -> bool:
    """Past the standby's bound the current attempt's guests are powered off, whatever Compute's
    status still says (STOPPING lags): they are no longer waited for."""
    return st.standby is not None and now >= st.standby.until


def saved_or_late(marker: Record, now: datetime) -> bool:
    """A marker's VM is done: its trainer exited (``saved``), or the marker came at the shutdown
    script's deadline and the hard-off has passed since (its trainer may write until then)."""
    return marker.saved is not False or now - marker.updated >= MARKER_MARGIN


def promoted(st: JobStatus, begun: JobStatus, now: datetime) -> JobStatus:
    """``begun`` (``transitions.begin_attempt`` for the standby's number, zone and secret) as the
    current attempt, its VMs held at the line and given the go now, from ``begun.resume_from``."""
    sb = st.standby
    assert sb is not None
    history = begun.history
    if history and history[-1].event == "launch" and sb.inserted_at is not None:
        # Its launch happened at the notice: billed since Compute accepted its VMs (the ledger's
        # span starts paying there, the time at the line counted as its boot).
        history = (*history[:-1], history[-1].model_copy(update={"since": sb.inserted_at}))
    return begun.model_copy(update={"history": history}).but(
        held=True, go_at=now, inserted=sb.inserted, inserted_at=sb.inserted_at, placement=sb.placement, resumed_at=now)


def past_line(v: JobView, st: JobStatus) -> bool:
    """The current attempt's trainer started (a record of its own says so): its go was received."""
    return any(r is not None and r.belongs_to(st) and (r.trainer_started is not None or r is v.heartbeat)
               for r in (v.heartbeat, *v.exits, v.marker))


def after_standby_error(st: JobStatus, spec: JobSpec, error: Exception, now: datetime, order: Sequence[str],
                        held: Sequence[str]) -> JobStatus:
    """The status to record when the standby's insert failed: an insert under way, or no answer,
    changes nothing (the same request goes again next pass); a stockout (or a quota not the job's
    own) cools its zone, as any stockout does, and moves the standby to the next usable zone of
    ``order`` (the preempting zone last); anything else, or no zone left, withdraws it: the
    recovery then goes on the usual way, once the VM is down. ``held``: this job's own VMs that
    hold the quota a refusal names (the current attempt's, still up): never a cooldown, the
    replacement waits."""
    sb = st.standby
    assert sb is not None
    if isinstance(error, (errors.OperationPending, errors.TransientError)):
        # Accepted and under way, or no answer: the same request again next pass (its id tells).
        return st
    if isinstance(error, errors.QuotaError) and held:
        return withdrawn(st, f"quota exceeded in {error.zone} ({error.reason}), held by this job's own "
                         f"{', '.join(held)}: the replacement is launched once it is down", now)
    current = t.model_of(spec, st)
    if isinstance(error, (errors.CapacityError, errors.QuotaError)) and sb.provisioning != current:
        # A standby stepping back up found no room on the model above: that model's zone cools (kept
        # aside, as a step down keeps the model left behind), and the standby goes on the current one.
        off = st.model_cooldowns.get(sb.provisioning, {})
        parked = {**st.model_cooldowns, sb.provisioning: {**off, error.zone: now + spec.policy.zone_cooldown}}
        back = st.but(model_cooldowns=parked)
        nxt = t.pick_zone(spec, back, now, order)
        if nxt is not None:
            text = f"no {sb.provisioning} capacity for {', '.join(sb.instances)} in {error.zone} ({error.reason}); trying {current} in {nxt}"
            moved = sb.model_copy(update={"zone": nxt, "provisioning": current, "placement": sb.placement + 1})
            return back.but(t.event(now, st, "stockout", text, zone=error.zone), standby=moved, message=text)
        return withdrawn(back, f"no capacity for {', '.join(sb.instances)} in any zone ({error.reason} in "
                         f"{error.zone}); the replacement is launched once the VM is down", now)
    if isinstance(error, (errors.CapacityError, errors.QuotaError)):
        cooled = st.but(zone_cooldowns={**t.unexpired(st, now), error.zone: now + spec.policy.zone_cooldown})
        nxt = t.pick_zone(spec, cooled, now, order)
        if nxt is not None:
            text = f"no capacity for {', '.join(sb.instances)} in {error.zone} ({error.reason}); trying {nxt}"
            moved = sb.model_copy(update={"zone": nxt, "placement": sb.placement + 1})
            return cooled.but(t.event(now, st, "stockout", text, zone=error.zone), standby=moved, message=text)
        return withdrawn(cooled, f"no capacity for {', '.join(sb.instances)} in any zone ({error.reason} in "
                         f"{error.zone}); the replacement is launched once the VM is down", now)
    return withdrawn(st, f"could not create {', '.join(sb.instances)} ({type(error).__name__}: {error}); "
                     "the replacement is launched once the VM is down", now)


def notice_refused(st: JobStatus, error: errors.NoticeRefused, now: datetime) -> JobStatus:
    """The project refused ``preemptionNoticeDuration`` (a Preview field): this run asks for no
    notice again, said once; the same insert goes again at once without it."""
    text = (f"Compute refused a {st.notice_s} s preemption notice ({error}): this run goes on with none "
            "(Spot's 30 s shutdown only); `respawn doctor` says how to get it")
    return st.but(t.event(now, st, "notice-refused", text), notice_refused=str(error)[:300], notice_s=0, message=text)
