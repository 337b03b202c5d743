"""Pure status transitions: each takes a status and returns the next one, with a
history event saying why. The planner chooses which; the executor uses the
error transitions when an insert fails. No I/O, no clock: ``now`` is passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta

from controller.core import accounting, errors, ledger, placement, runlog, runs
from controller.core.durations import format_duration
from controller.core.spec import JobSpec
from controller.core.ports import ZoneAdvice
from controller.core.state import CheckpointRef, Event, JobStatus, Phase, ZoneScore, recorded_notify


def event(now: datetime, status: JobStatus, name: str, detail: str,
          **where: str | datetime | int | float | None) -> Event:
    return Event(at=now, event=name, attempt=status.attempt, detail=detail, **where)


def new_run(prev: JobStatus | None, attempt: int, spec_generation: int | None, now: datetime,
            spec: JobSpec | None = None, last: CheckpointRef | None = None, renumbered: bool = False,
            job: str = "") -> JobStatus:
    """A fresh run of the job: counters reset, attempt numbers keep growing (names stay unique).

    Its id is when it began (controller.core.runs); ``prev``'s run is summed up into the past runs
    it keeps (``last``: that run's latest complete checkpoint, where a listing found it). Its
    checkpoints go where the run before's went, unless ``spec`` asks for a fresh start
    (``checkpoint.fresh``): then under a prefix of its own, which every attempt of it reads from
    status.json. ``renumbered``: the same run begun again after the VMs of an earlier run seen only
    now; it keeps its id, its prefix and its past runs."""
    # No attempt of the new run exists yet: an empty secret, which no record carries, so
    # records the previous run left under the same attempt number belong to nothing.
    # Where the previous run's VMs or TPU nodes were is kept (project, history, the TPU flag):
    # one whose delete failed must still be found, listed and deleted by the new run.
    count = prev.event_count if prev else 0
    if renumbered and prev is not None:
        run, own, fresh, past = prev.run or runs.run_id(now), prev.checkpoint_uri, prev.fresh, prev.runs
    else:
        run = runs.unique_id(now, {r.run for r in prev.runs} | {prev.run} if prev else set())
        fresh = spec is not None and spec.checkpoint is not None and spec.checkpoint.fresh
        own = runs.fresh_root(spec.checkpoint.uri, job, run) if fresh and spec and spec.checkpoint else \
            (prev.checkpoint_uri if prev else None)
        past = runlog.archived(prev, now, last)
    detail = "spec accepted; waiting for a VM"
    if fresh and own:
        detail += f"; run {run} starts fresh: no earlier checkpoint is resumed, its own go under {own}"
    base = JobStatus(history=prev.history if prev else (), attempt_token="", tpu=prev.tpu if prev else False,
                     tpu_compute=prev.tpu_compute if prev else False,
                     project=prev.project if prev else None, event_count=count,
                     ledger=ledger.Ledger(folded=count),  # a run's own ledger: none of the previous run's events
                     run_id=run, checkpoint_uri=own, fresh=fresh, runs=past,
                     sweep=spec.sweep.name if spec is not None and spec.sweep is not None else None)
    return base.but(
        Event(at=now, event="accepted", attempt=attempt, detail=detail),
        phase=Phase.PENDING,
        attempt=attempt,
        spec_generation=spec_generation,
        created_at=now,
        message="spec accepted",
    )


def finish(status: JobStatus, phase: Phase, detail: str, now: datetime, since: datetime | None = None,
           trainer_started: datetime | None = None, progress: Mapping[str, int | float] | None = None,
           **changes: object) -> JobStatus:
    """The run ends; ``since``: when the VM's exit record that decided it was written;
    ``trainer_started``: when its attempt's trainer started, where a record said so;
    ``progress``: what its trainer reported (``Event.step``, ``save_s``, ``upload_s``)."""
    return status.but(
        event(now, status, phase.lower(), detail, since=since, trainer_started=trainer_started, **(progress or {})),
        phase=phase,
        message=detail, not_before=None, **changes
    )


def pick_zone(spec: JobSpec, status: JobStatus, now: datetime, order: Sequence[str] | None = None) -> str | None:
    """The first zone in ``order`` (the spec's, or as placement ranked it) that is not cooling
    down after a capacity error nor refused the instance."""
    return next((z for z in order or spec.zones if usable(status, z, now)), None)


def usable(status: JobStatus, zone: str | None, now: datetime) -> bool:
    cooling = status.zone_cooldowns
    return zone is not None and zone not in status.zone_rejections and (zone not in cooling or cooling[zone] <= now)


def model_of(spec: JobSpec, status: JobStatus) -> str:
    """The current attempt's provisioning model: one of the spec's, never status.json's alone."""
    return status.provisioning if status.provisioning in spec.provisioning else spec.provisioning[0]


def candidates(spec: JobSpec, status: JobStatus, now: datetime) -> list[str]:
    """The models the next try may go on, preferred first (the spec's order): the current one, and
    those above it once ``fallback.step_up_after`` has passed on it (one below only by a step
    down, after ``fallback.wait``); never one Google refused in every zone in this run."""
    models, current = spec.provisioning, model_of(spec, status)
    at = models.index(current)
    after = spec.fallback.step_up_after
    up = after is not None and status.model_since is not None and now - status.model_since >= after
    return [m for i, m in enumerate(models) if (i == at or (i < at and up)) and m not in status.refused_models]


def choose(spec: JobSpec, status: JobStatus, now: datetime,
           order_for: Callable[[str], Sequence[str]]) -> tuple[str, str] | None:
    """The model and zone the next try goes to: the first candidate model (``candidates``) with a
    zone that is not cooling on that model (nor refused this attempt, on the current one), in the
    order placement gives that model's zones (``order_for``). None: every candidate is cooling."""
    current = model_of(spec, status)
    for model in candidates(spec, status, now):
        if model == current:
            zone = pick_zone(spec, status, now, order_for(model))
        else:
            parked = status.model_cooldowns.get(model, {})
            zone = next((z for z in order_for(model) or spec.zones if parked.get(z, now) <= now), None)
        if zone is not None:
            return model, zone
    return None


def switch_model(status: JobStatus, spec: JobSpec, model: str, now: datetime) -> JobStatus:
    """The same attempt on ``model``, a candidate above the current one whose capacity is back
    (``choose``): a step back up. (A step down is ``step_down``.)"""
    current = model_of(spec, status)
    since = format_duration(now - status.model_since) if status.model_since else "a while"
    detail = f"stepping back up from {current} to {model} after {since} on {current}"
    return _afresh(status, now, "step-up", detail, model)


def next_free(spec: JobSpec, status: JobStatus) -> datetime | None:
    return min((status.zone_cooldowns[z] for z in spec.zones if z in status.zone_cooldowns), default=None)


def backoff(spec: JobSpec, failures_in_a_row: int) -> timedelta:
    """Exponential restart delay: initial, 2x, 4x... capped at the spec's max.

    The exponent is capped before multiplying: after hours of stockouts the count is in
    the hundreds, and ``timedelta * 2**n`` would overflow long before ``min`` applies.
    """
    initial, cap = spec.policy.backoff.initial, spec.policy.backoff.max
    exponent = min(max(0, failures_in_a_row - 1), 40)
    return min(cap, timedelta(seconds=initial.total_seconds() * 2.0**exponent))


def begin_attempt(
    status: JobStatus, spec: JobSpec, project: str, zone: str, names: Sequence[str],
    checkpoint: CheckpointRef | None, now: datetime, why: str, spec_generation: int | None, token: str,
    model: str, advice: Mapping[str, ZoneAdvice] | None = None, attempt: int | None = None,
    verb: str = "creating",
) -> JobStatus:
    """Commit the next attempt before inserting it: the status write is what makes it unique.
    ``attempt``: the number a standby took when it was launched (``next_attempt`` otherwise)."""
    attempt = attempt or next_attempt(status)
    resume = f"resuming from {checkpoint.uri}" if checkpoint else "starting from scratch (no complete checkpoint)"
    # A zone seen stocked out since the advice may have been asked is never described by it.
    recent = placement.stocked_out(status.history, now - placement.ADVICE_MAX_AGE)
    lately = recent.get(zone)
    # What placement weighed (world.JobView.zone_order): the same advice, stockouts and run costs.
    worth = placement.worths(spec, model, {z: a for z, a in (advice or {}).items() if z not in recent},
                             *ledger.run_costs(status.ledger))
    where = f"{zone} ({model}; {placement.describe(advice.get(zone), lately, now, worth.get(zone))})" \
        if advice else f"{zone} ({model})"
    what = f" ({spec.tpu.describe()})" if spec.tpu is not None and spec.tpu.api == "compute" else ""
    detail = f"{why}; {verb} {', '.join(names)}{what} in {where}, {resume}"
    # Against the model the status was on (a new spec may have dropped it): its cooldowns and
    # its time on that model are its own, never the new one's.
    switched = model != (status.provisioning or model_of(spec, status))
    shape = ledger.shape_of(spec)  # what the advice was asked about: its price and uptime are that shape's
    scores = {z: ZoneScore(obtainability=a.obtainability, uptime_s=a.uptime_s, preemption_rate=a.preemption_rate,
                           spot_price_h=a.spot_price_h, shape=shape,
                           **({"goodput": w.goodput, "per_dollar": w.per_dollar, "value": w.value}
                              if (w := worth.get(z)) else {}))
              for z, a in (advice or {}).items() if z in spec.zones}
    every, known = _interval(status, spec, (scores.get(zone) or status.zone_advice.get(zone)) if model == "spot" else None,
                             checkpoint)
    return status.but(
        Event(at=now, event="launch", attempt=attempt, detail=detail, instance=names[0], zone=zone),
        phase=Phase.PROVISIONING,
        attempt=attempt,
        project=project,
        zone=zone,
        instances=tuple(names),
        tpu=status.tpu or (spec.tpu is not None and spec.tpu.api == "tpu"),
        tpu_compute=status.tpu_compute or (spec.tpu is not None and spec.tpu.api == "compute"),
        attempt_tpu=spec.tpu is not None,
        attempt_compute=spec.tpu is not None and spec.tpu.api == "compute",
        upcoming_maintenance=None,
        inserted=False,
        inserted_at=None,
        settling=False,
        settling_since=None,
        recovering_since=None,
        resumed_at=None,
        attempt_token=token,
        placement=0,
        provisioning=model,
        model_since=now if switched or status.model_since is None else status.model_since,
        capacity_misses=0,
        capacity_since=None,
        zone_advice=scores if advice else status.zone_advice,
        advice_at=now if advice else status.advice_at,
        resume_from=checkpoint,
        checkpoint_every_s=every,
        lifetime=known,
        standby=None,
        held=False,
        go_at=None,
        notice_s=0 if status.notice_refused else spec.notice_for(model),
        quota_held_by=(),
        notify=recorded_notify(spec.notify),  # its topic: a webhook URL is a secret, never in status.json
        attempt_started_at=now,
        started_at=status.started_at or now,
        not_before=None,
        spec_generation=spec_generation,
        zone_cooldowns=_cooldowns_on(status, model, now)[0] if switched else unexpired(status, now),
        model_cooldowns=_cooldowns_on(status, model, now)[1] if switched else status.model_cooldowns,
        # A zone's refusal holds for one attempt: the next tries every zone again (a 4xx may
        # have been passing, and a replaced spec may ask for something else).
        zone_rejections={},
        message=detail,
    )


def next_attempt(status: JobStatus) -> int:
    """The number the next attempt (or standby) takes: past the current one and past any a
    withdrawn standby took (its VMs may still be going down under that name)."""
    return max(status.attempt, status.withdrawn) + 1


def insert_pending_text(zone: str | None) -> str:
    return f"Google accepted the create in {zone}, but it was still running; its outcome is read next pass"


def inserted(status: JobStatus, now: datetime) -> JobStatus:
    detail = f"Compute accepted {', '.join(status.instances)} in {status.zone}"
    return status.but(
        event(now, status, "inserted", detail, instance=status.instances[0], zone=status.zone),
        inserted=True,
        inserted_at=now,
        capacity_misses=0,
        capacity_since=None,
        message=detail,
    )


def _interval(status: JobStatus, spec: JobSpec, seed: ZoneScore | None,
              checkpoint: CheckpointRef | None) -> tuple[float | None, ledger.Lifetime | None]:
    """Young/Daly's interval for an attempt, and the time between losses it rests on: the run's
    losses so far (this commit's own, the loss that brought a launch, included) and ``seed``, the
    advice of the zone it goes to."""
    seed = seed if seed is not None and seed.shape == ledger.shape_of(spec) else None  # never another machine's uptime
    book, uptime = accounting.catch_up(status, spec), seed.uptime_s if seed else None
    every = ledger.checkpoint_every(book, checkpoint.write_s if checkpoint else None, uptime)
    return every, ledger.lifetime(book, uptime) if every is not None else None


def retargeted(status: JobStatus, spec: JobSpec) -> JobStatus:
    """The current attempt, moved before it was created (a failover, a step down), with its
    interval again for the zone and model it now goes to: never the uptime of a zone it did not get."""
    model = status.provisioning or model_of(spec, status)
    seed = status.zone_advice.get(status.zone) if status.zone and model == "spot" else None
    every, known = _interval(status, spec, seed, status.resume_from)
    return status.but(checkpoint_every_s=every, lifetime=known)


def move_zone(status: JobStatus, zone: str, now: datetime) -> JobStatus:
    detail = f"trying {zone} for attempt {status.attempt}"
    return status.but(
        event(now, status, "failover", detail, zone=zone),
        zone=zone, placement=status.placement + 1, not_before=None, message=detail,
    )


def wait_for_zone(status: JobStatus, spec: JobSpec, now: datetime) -> JobStatus:
    """Every zone is cooling down: wait for the first to cool, or step down the provisioning
    list once capacity was waited for longer than ``fallback.wait``."""
    if (down := waited_too_long(status, spec, now)) is not None:
        return down
    # The first cooldown to end, of this model or of one above it the job may step back up to.
    parked = [t for m in candidates(spec, status, now) if m != model_of(spec, status)
              for z, t in status.model_cooldowns.get(m, {}).items() if z in spec.zones and t > now]
    until = min(filter(None, [next_free(spec, status), *parked]), default=now)
    detail = f"every zone is cooling down after capacity errors; next try at {until:%H:%M:%S} UTC"
    return status.but(event(now, status, "waiting", detail), not_before=until, message=detail)


def waited_too_long(status: JobStatus, spec: JobSpec, now: datetime) -> JobStatus | None:
    """The attempt on the next model, once capacity was waited for past ``fallback.wait``."""
    waited = now - status.capacity_since if status.capacity_since else None
    if waited is None or waited < spec.fallback.wait:
        return None
    why = f"no capacity for {format_duration(waited)} (policy.fallback.wait {format_duration(spec.fallback.wait)})"
    return step_down(status, spec, now, why)


def step_down(status: JobStatus, spec: JobSpec, now: datetime, why: str) -> JobStatus | None:
    """The same attempt on the next model of the spec's provisioning list that Google has not
    refused everywhere (None past its end).

    Its zone is chosen afresh (``zone`` None: the next plan picks, with advice for the new
    model); the old model's cooldowns say nothing about the new one's capacity, nor a zone's
    refusal of the old model's VM (a 400 or 404) about the new one's."""
    models, current = spec.provisioning, model_of(spec, status)
    at = models.index(current)
    lower = next((m for m in models[at + 1:] if m not in status.refused_models), None)
    if lower is None:
        return None
    detail = f"stepping down from {current} to {lower}: {why}"
    return _afresh(status, now, "step-down", detail, lower, zone=None)


def switch_kind(status: JobStatus, spec: JobSpec, now: datetime) -> JobStatus:
    """The current attempt, committed as VMs or a TPU node and created as neither, on the kind
    the spec asks for now: a new request id (none spans the two APIs), the spec's first model."""
    tpu = spec.tpu is not None
    was, now_is = ("a TPU node", "VMs") if status.attempt_tpu else ("VMs", "a TPU node")
    detail = f"the spec moved from {was} to {now_is}: attempt {status.attempt} is created as {now_is}"
    # Nothing a VM's capacity said holds for a TPU's, nor the other way round: every model's
    # cooldowns and refusals are dropped.
    return _afresh(status.but(model_cooldowns={}, refused_models={}, zone_cooldowns={}), now, "respec", detail,
                   spec.provisioning[0], attempt_tpu=tpu, attempt_compute=tpu and spec.tpu is not None
                   and spec.tpu.api == "compute",
                   tpu=status.tpu or (spec.tpu is not None and spec.tpu.api == "tpu"),
                   tpu_compute=status.tpu_compute or (spec.tpu is not None and spec.tpu.api == "compute"))


def _afresh(status: JobStatus, now: datetime, name: str, detail: str, model: str, **changes: object) -> JobStatus:
    """The same attempt on another model (or kind), its capacity record started over: the old
    one's stockouts and refusals (a 400 or 404) say nothing of the new one's. The old model's
    cooldowns are kept aside (``model_cooldowns``) and the new one's own taken back: a zone
    stocked out of Spot a minute ago is still out of Spot when the job steps back up."""
    own, parked = _cooldowns_on(status, model, now)
    return status.but(event(now, status, name, detail), provisioning=model, model_since=now, capacity_misses=0,
                      capacity_since=None, zone_cooldowns=own, model_cooldowns=parked, zone_rejections={},
                      placement=status.placement + 1, not_before=None, message=detail, **changes)


def after_create_error(status: JobStatus, spec: JobSpec, error: Exception, now: datetime,
                       order: Sequence[str] | None = None, held: Sequence[str] = ()) -> JobStatus:
    """The status to record when inserting the current attempt failed; ``order``: the zones
    as placement ranked them for the attempt's model; ``held``: this job's own TPU nodes still
    in the error's zone (TPU nodes) or region (VMs) that are still up or going down, which hold its
    quota until they are gone: the insert is tried again as soon as none of them is up
    (``quota_held_by``), with a backoff as the bound."""
    zone = status.zone
    rate = isinstance(error, errors.QuotaError) and quota_scope(error.reason) == "rate"
    if isinstance(error, errors.QuotaError) and (held or rate):
        # Not the zone's capacity, nor the project's quota: the job's own husk, or a limit on
        # the rate of requests (RATE_LIMIT_EXCEEDED), which passes. Never a cooldown, never a
        # step down; tried again once the husk may be gone, or the rate back under its limit.
        delay = backoff(spec, status.placement + 1)
        whose = "a request rate limit" if rate else f"this job's own {', '.join(held)} until it is down"
        when = f"in {format_duration(delay)}" if rate else f"once it is down (in {format_duration(delay)} at the latest)"
        detail = f"quota exceeded in {error.zone} ({error.reason}), held by {whose}; retrying {when}"
        return status.but(event(now, status, "quota", detail, zone=zone), placement=status.placement + 1,
                          not_before=now + delay, message=detail, quota_held_by=() if rate else tuple(held))
    if isinstance(error, (errors.CapacityError, errors.QuotaError)):
        out, name, what = [error.zone], "stockout", f"no capacity: {error.reason} in {error.zone}"
        if isinstance(error, errors.QuotaError):
            # A quota is per region (Compute's GPUs and CPUs, most TPU quotas), per zone (TPU
            # quotas named ...PerZone...) or for the whole project (GPUS_ALL_REGIONS), and per
            # model (Spot has quotas of its own): the zones it covers are out, as after a
            # stockout, and another region, or the next model, may have room.
            scope = quota_scope(error.reason)
            region = placement.region_of(error.zone)
            out = [z for z in spec.zones if scope == "project" or (scope == "zone" and z == error.zone)
                   or (scope == "region" and placement.region_of(z) == region)] or [error.zone]
            where = {"project": "every region", "zone": f"zone {error.zone}"}.get(scope, f"region {region}")
            name, what = "quota", f"quota exceeded in {where} ({error.reason}, asked in {error.zone})"
        cooldowns = {**unexpired(status, now), **dict.fromkeys(out, now + spec.policy.zone_cooldown)}
        misses, since = status.capacity_misses + 1, status.capacity_since or now
        cooled = status.but(zone_cooldowns=cooldowns, placement=status.placement + 1, capacity_misses=misses,
                            capacity_since=since)
        limit = spec.fallback.stockouts or len(spec.zones)
        if misses >= limit or now - since >= spec.fallback.wait:
            why = f"{misses} capacity errors in a row over {format_duration(now - since)}"
            noted = cooled.but(event(now, status, name, what, zone=error.zone))
            if (down := step_down(noted, spec, now, why)) is not None:
                return down
        nxt = pick_zone(spec, cooled, now, order)
        then = f"trying {nxt} next" if nxt else "no zone left; waiting for the first cooldown to end"
        detail = f"{what}; {then}"
        if nxt is None:
            return cooled.but(event(now, status, name, detail, zone=error.zone), message=detail,
                              not_before=next_free(spec, cooled))
        return retargeted(cooled.but(event(now, status, name, detail, zone=error.zone), message=detail, zone=nxt), spec)
    if isinstance(error, errors.OperationPending):
        detail = insert_pending_text(zone)
        return status.but(event(now, status, "insert-pending", detail, zone=zone), message=detail)
    if isinstance(error, (errors.RequestError, errors.NotFound)):
        # 400 (bad field) or 404 (unknown zone, image, machine type): no retry in this zone
        # can help, but another zone may have the machine type or accelerator. Once every
        # zone said no, nothing can.
        zone = zone or ""
        rejected = {**status.zone_rejections, zone: str(error)[:300]}
        nxt = pick_zone(spec, status.but(zone_rejections=rejected), now, order)
        if nxt is None and all(z in rejected for z in spec.zones):
            # This model is refused everywhere ("SPOT is not supported for this machine type"):
            # the next model of the list may not be; only when every model is, the job fails.
            model = model_of(spec, status)
            why = "; ".join(f"{z}: {m}" for z, m in rejected.items())
            refused = {**status.refused_models, model: why[:600]}
            noted = status.but(event(now, status, "refused", f"Google refused {model} in every zone: {why}", zone=zone),
                               zone_rejections=rejected, refused_models=refused)
            if (down := step_down(noted, spec, now, f"Google refused {model} in every zone")) is not None:
                return down
            each = "; ".join(f"{m}: {w}" for m, w in refused.items())
            return finish(noted, Phase.FAILED, f"Google refused every model of the spec in every zone: {each}", now)
        then = f"trying {nxt} next" if nxt else "waiting for a cooling zone"
        detail = f"Google rejected the request in {zone}: {error}; {then}"
        changes: dict[str, object] = {"zone": nxt, "placement": status.placement + 1} if nxt else {
            "not_before": next_free(spec, status)}
        after = status.but(event(now, status, "rejected", detail, zone=zone), zone_rejections=rejected,
                           message=detail, **changes)
        return retargeted(after, spec) if nxt else after
    # The retry keeps the request id: if the failed call was in fact accepted, Compute
    # answers the same id with that operation instead of creating anything again (a new
    # id could bring back a node deleted meanwhile, beside the rest of its gang).
    detail = f"insert failed ({type(error).__name__}: {error}); will retry"
    return status.but(event(now, status, "error", detail, zone=zone), message=detail)


def _cooldowns_on(status: JobStatus, model: str, now: datetime) -> tuple[dict[str, datetime], dict[str, dict[str, datetime]]]:
    """Moving to ``model``: (its own cooldowns, taken back; every other model's, the current one's
    set aside)."""
    parked = {m: c for m, c in status.model_cooldowns.items() if m != model}
    if status.provisioning and status.provisioning != model and (kept := unexpired(status, now)):
        parked[status.provisioning] = kept
    own = {z: t for z, t in status.model_cooldowns.get(model, {}).items() if t > now}
    return own, parked


def quota_scope(reason: str) -> str:
    """What a quota Compute or Cloud TPU named covers: "zone", "region" or "project" (all regions);
    "rate" for a limit on the rate of requests, which covers no capacity at all."""
    text = reason.lower()
    if "rate_limit" in text or "ratelimit" in text:
        return "rate"
    if "all_regions" in text or "all-regions" in text or "global" in text:
        return "project"
    if "perzone" in text or "per-zone" in text or "in zone" in text:
        return "zone"
    return "region"


def unexpired(status: JobStatus, now: datetime) -> dict[str, datetime]:
    """The zone cooldowns of the current model still running."""
    return {z: t for z, t in status.zone_cooldowns.items() if t > now}


