"""Act: apply one job's chain of actions, idempotently, stopping at the first failure.

- status.json is written only by compare-and-swap on the generation this pass read
  (or last wrote); losing that race means another pass owns the job right now.
- "already exists" on insert and "not found" on delete are success.
- an insert error becomes a status update (``transitions.after_create_error``), so
  every stockout, quota error and rejection is visible in the job's history.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from controller.core import accounting, errors, fleet, handover, ledger, names, notify, placement, transitions
from controller.core.actions import (Action, ClaimSlot, CreateInstances, DeleteInstance, DeleteRecord, ReleaseLine,
                                     ReleaseSlot, WriteStatus)
from controller.service.notifier import Notifier
from controller.service.tpuzones import SLICES_KEY, TpuZones
from controller.service.vmscripts import Shelf
from controller.core.ports import BlobInfo, BlobStore, ComputeGateway, TpuGateway, TpuRequest
from controller.core.spec import JobSpec, Notify
from controller.core.state import JobStatus
from controller.core.world import SLOT_HOLDER, JobView

log = logging.getLogger(__name__)
Tell = Callable[[Notify | None, Sequence[notify.Notice]], object]  # hands a chain's notices to its pass
Acting = Callable[[], bool]  # whether the pass may still act: it holds its lease (controller.service.lease)


class HuskBudget:
    """How many deletes of stopped VMs (``DeleteInstance.deferrable``) may be sent a minute.
    Compute's mutations share one rate quota per project (1,500 a minute by default): a mass
    preemption's inserts need it first, and a TERMINATED VM bills no machine, only its disk,
    until a later pass deletes it. A delete that fails gives its share back (``refund``), so
    one that fails every pass never starves the others. Shared by passes and their threads;
    ``limit`` 0: none at all (an event's pass)."""

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self._clock = limit, clock
        self._minute: int | None = None
        self._left = limit
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            minute = int(self._clock() // 60)
            if minute != self._minute:
                self._minute, self._left = minute, self.limit
            if self._left <= 0:
                return False
            self._left -= 1
            return True

    def refund(self) -> None:
        with self._lock:
            self._left = min(self.limit, self._left + 1)


@dataclass
class Outcome:
    """What became of one job's chain in one round."""

    job: str
    done: list[str] = field(default_factory=list)
    error: str | None = None
    transient: bool = False
    conflict: bool = False  # another pass committed first; it owns this step
    stopped: bool = False  # the pass lost or outlived its lease before an action: nothing more applied
    replan: bool = False
    # What its commits added to the job's ledger (each loss, recovery and stockout, counted once: by
    # the commit that made it), and the status it last committed (None: it committed none).
    changes: list[fleet.Change] = field(default_factory=list)
    status: JobStatus | None = None


class Executor:
    def __init__(self, store: BlobStore, compute: ComputeGateway, bucket: str, tpu: TpuGateway | None = None,
                 notifier: Notifier | None = None, shelf: Shelf | None = None,
                 written: Callable[[BlobInfo, bytes, int], None] | None = None,
                 slices: TpuGateway | None = None) -> None:
        """``shelf``: the VM scripts every insert points to, put in the bucket before the first
        insert of the process (None: the caller's VMs carry whole scripts, as the fakes' do).
        ``written``: told of each status this executor wrote, its bytes, the generation they are and
        the one they replaced (``Observer.remember``: the next pass need not read back what this one
        wrote)."""
        self.store = store
        self.written = written
        self.shelf = shelf
        self.compute = compute
        self.bucket = bucket
        self.tpu = tpu
        self.notifier = notifier  # told of each commit's state changes once the commit succeeded
        self.tpu_zones = TpuZones(store, bucket)  # where TPU nodes may be, for the orphan search
        self.slices = slices  # TPU slices in Compute Engine (instances and MIGs)
        self.slice_zones = TpuZones(store, bucket, SLICES_KEY)

    def _tpu(self, api: str = "tpu") -> TpuGateway:
        gateway = self.slices if api == "compute" else self.tpu
        if gateway is None:
            raise errors.ConfigError(f"this controller was built without a gateway for TPUs through "
                                     f"{'Compute Engine' if api == 'compute' else 'the Cloud TPU API'}")
        return gateway

    def apply(self, view: JobView, actions: list[Action], now: datetime, wait_until: float | None = None,
              tell: Tell | None = None, acting: Acting | None = None, husks: HuskBudget | None = None) -> Outcome:
        """``wait_until``: the ``time.monotonic()`` past which an insert no longer waits for its
        operation (None: the gateway's own limit). ``tell``: where the chain's notices go, the
        pass's ``Sends.add`` (sent side by side, waited for at the pass's end); without it, a
        chain applied outside a pass sends them itself, within the notifier's ``wait``.
        ``acting``: asked before every action and every write of an error, the one place all of
        them pass: once it says no (a pass over every job lost or outlived its lease), nothing
        more is applied and the outcome says ``stopped``. ``husks``: the pass's budget for the
        deletes of husks that no longer run (None: no limit); one past it waits for a later pass."""
        chain = _Chain(view.job, view.status, view.status_generation, view.spec, tell=self.notifier is not None,
                       acting=acting, written=self.written)
        try:
            self._run(chain, view, actions, now, wait_until, husks)
        finally:
            if self.notifier is not None and chain.notices:
                # After the chain: a notification never holds the insert its commit decided (and
                # what was committed is told even if a later action raised).
                mine = view.spec.notify if view.spec is not None else chain.notify
                (tell or self.notifier.deliver)(mine, chain.notices)
        return chain.outcome

    def _run(self, chain: _Chain, view: JobView, actions: list[Action], now: datetime,
             wait_until: float | None, husks: HuskBudget | None = None) -> None:
        pending = False
        for action in actions:
            if pending and not isinstance(action, DeleteInstance):
                continue  # nothing is "inserted", and no record consumed, before Compute says so
            budgeted = husks if isinstance(action, DeleteInstance) and action.deferrable else None
            if budgeted is not None and not budgeted.take():
                _log(action, "left for a later pass: this minute's deletes of stopped VMs are spent",
                     level=logging.DEBUG)
                continue
            if not chain.may_act():
                _log(action, "not applied: this pass no longer holds its lease", level=logging.WARNING)
                break
            try:
                self._apply(chain, action, now, wait_until, budgeted)
            except errors.PreconditionFailed:
                chain.outcome.conflict = True
                _log(action, "skipped: another pass changed the job first")
                break
            except errors.OperationPending as e:
                self._failed(chain, action, e, now, view)
                # The insert was accepted: the previous attempt's husks that follow it still go
                # now, rather than billing until the pass that reads the insert's outcome.
                pending = isinstance(action, CreateInstances)
                if not pending:
                    break
                continue
            except errors.RespawnError as e:
                if isinstance(action, ReleaseLine) and action.gate and not isinstance(e, _Spared):
                    chain.outcome.error = f"{_describe(action)}: {type(e).__name__}: {e}"
                    chain.outcome.transient |= isinstance(e, errors.TransientError)
                    _log(action, f"failed: {e}; what follows waits for the next pass", level=logging.WARNING)
                    break
                if isinstance(action, ReleaseLine) and not isinstance(e, _Spared):
                    # The go is given again at every pass until it took: it never holds the rest
                    # of the chain (the watch of the very attempt waiting for it above all).
                    chain.outcome.error = f"{_describe(action)}: {type(e).__name__}: {e}"
                    chain.outcome.transient |= isinstance(e, errors.TransientError)
                    _log(action, f"failed: {e}", level=logging.WARNING)
                    continue
                if isinstance(action, DeleteInstance) and action.husk:
                    # Said once the chain is done (one status write at most), never holding the rest.
                    chain.husk_errors.append(f"cannot delete {action.name}: {e}; retrying every pass")
                    chain.outcome.error = f"{_describe(action)}: {type(e).__name__}: {e}"
                    chain.outcome.transient |= isinstance(e, errors.TransientError)
                    _log(action, f"failed: {e}", level=logging.WARNING)
                    continue
                self._failed(chain, action, e, now, view)
                break
            chain.outcome.done.append(_describe(action))
            _log(action, "done")
        if chain.husk_errors and not chain.wrote and chain.status is not None and not chain.outcome.conflict \
                and chain.may_act():
            text = "; ".join(chain.husk_errors)
            if chain.status.message != text:
                try:
                    chain.write(self.store, self.bucket,
                                chain.status.but(transitions.event(now, chain.status, "error", text), message=text))
                except errors.RespawnError as e:  # the next pass will see the same trouble again
                    log.warning("could not record error", extra={"json_fields": {"job": chain.job, "error": str(e)}})

    def _apply(self, chain: _Chain, action: Action, now: datetime, wait_until: float | None,
               budget: HuskBudget | None = None) -> None:
        """``budget``: the one whose share this action took, given back if it fails."""
        try:
            self._send(chain, action, now, wait_until)
        except errors.RespawnError:
            if budget is not None:
                budget.refund()
            raise

    def _send(self, chain: _Chain, action: Action, now: datetime, wait_until: float | None) -> None:
        match action:
            case WriteStatus(status=status, replan=replan):
                chain.write(self.store, self.bucket, status)
                chain.outcome.replan |= replan
            case CreateInstances():
                # A late pass must not bring back an attempt another pass has moved past.
                self._unchanged(chain)
                wait = None if wait_until is None else max(0.0, wait_until - time.monotonic())
                if self.shelf is not None:
                    self.shelf.ensure()  # a VM whose scripts are not there would boot into nothing
                first = action.requests[0]
                if isinstance(first, TpuRequest):  # one node, however many hosts it spans
                    # Never a node where a later pass would not look for it (tpuzones).
                    (self.slice_zones if first.api == "compute" else self.tpu_zones).remember(first.project, first.zone)
                    self._tpu(first.api).create(first, action.request_id, wait)
                else:
                    # Existing names are success (port). The ids Compute names are recorded by the
                    # chain's next status write (its "inserted"): no write of their own.
                    chain.ids.update(self.compute.insert(action.requests, action.request_id, wait) or {})
            case DeleteInstance():
                if action.only_if_spec_absent:
                    self._spec_absent(action.job)
                else:
                    self._unchanged(chain)
                try:
                    gateway = self._tpu(action.tpu_api) if action.tpu else self.compute
                    gateway.delete(action.project, action.zone, action.name)
                except errors.NotFound:
                    pass
            case ReleaseLine():
                # A late pass must never start a trainer on VMs the job has moved past.
                self._unchanged(chain)
                wait = None if wait_until is None else max(0.0, wait_until - time.monotonic())
                for name in action.names:
                    try:
                        self.compute.release(action.project, action.zone, name, action.items, wait)
                    except errors.NotFound:
                        pass  # gone: the watch sees it lost
            case DeleteRecord():
                self._unchanged(chain)  # a stale view must not consume the next attempt's record
                try:
                    self.store.delete(self.bucket, action.key, if_generation_match=action.generation)
                except errors.NotFound:
                    pass
            case ClaimSlot():
                self._unchanged(chain)  # a late pass must not take a slot for a trial that has moved on
                key = names.slot_key(action.sweep, action.k)
                body = json.dumps({"job": action.job, "claimed_at": now.isoformat()}).encode()
                try:
                    self.store.write(self.bucket, key, body, if_generation_match=0, metadata={SLOT_HOLDER: action.job})
                except errors.TransientError as e:  # a slot many trials claim at once: GCS's one write a second
                    raise _Spared(f"slot {action.k} of sweep {action.sweep}: {e}; claimed again next pass") from e
                except errors.PreconditionFailed as e:  # there already: this trial's (another pass's claim), or not
                    try:
                        holder = (self.store.stat(self.bucket, key).metadata or {}).get(SLOT_HOLDER)
                    except errors.RespawnError as read:
                        raise _Spared(f"slot {action.k} of sweep {action.sweep} was taken; could not read by whom: "
                                      f"{read}") from e
                    if holder != action.job:
                        raise _Spared(f"slot {action.k} of sweep {action.sweep} was taken by {holder} first") from e
            case ReleaseSlot():
                # A pass that saw the trial over must not give back a slot a newer run of it took since.
                self._unchanged(chain)
                try:
                    self.store.delete(self.bucket, names.slot_key(action.sweep, action.k),
                                      if_generation_match=action.generation)
                except (errors.NotFound, errors.PreconditionFailed):
                    pass  # gone already, or taken again since: another trial's now

    def _failed(self, chain: _Chain, action: Action, error: errors.RespawnError, now: datetime,
                view: JobView) -> None:
        """Record what went wrong where a person will look: the job's history."""
        if isinstance(error, _Spared):
            _log(action, f"skipped: {error}")
            chain.outcome.transient |= isinstance(error.__cause__, errors.TransientError)
            return
        out = chain.outcome
        out.error = f"{_describe(action)}: {type(error).__name__}: {error}"
        out.transient = isinstance(error, errors.TransientError)
        if isinstance(error, errors.OperationPending):
            _log(action, f"under way: {error}")  # accepted: its outcome is read next pass
        else:
            _log(action, f"failed: {error}", level=logging.WARNING)
        if isinstance(action, WriteStatus) or chain.status is None or not chain.may_act():
            return
        if isinstance(action, CreateInstances):
            held = _held(view, action, error)
            if isinstance(error, errors.NoticeRefused):
                # A Preview field the project is not enrolled in: the same insert again at once, without it.
                after = handover.notice_refused(chain.status, error, now)
                out.error, out.replan = None, True
                try:
                    chain.write(self.store, self.bucket, after)
                except errors.RespawnError as e:
                    log.warning("could not record error", extra={"json_fields": {"job": chain.job, "error": str(e)}})
                return
            if action.standby and chain.status.standby is not None:
                order = handover.standby_order(view, action.spec, chain.status, now) if view.spec is not None else []
                after = handover.after_standby_error(chain.status, action.spec, error, now, order, held)
                if after is chain.status:  # under way, or no answer: the same request next pass
                    out.error = None if isinstance(error, errors.OperationPending) else out.error
                    return
                if after.standby is not None:  # moved to the next zone, to be inserted at once
                    out.error, out.replan = None, True
                try:
                    chain.write(self.store, self.bucket, after)
                except errors.RespawnError as e:
                    log.warning("could not record error", extra={"json_fields": {"job": chain.job, "error": str(e)}})
                return
            model = transitions.model_of(action.spec, chain.status)
            order = view.zone_order(model, now) if view.spec is not None else None
            after = transitions.after_create_error(chain.status, action.spec, error, now, order, held)
            # Another zone, or the next model of the provisioning list, to try right away (only a
            # capacity error or a refusal moves either: transitions.after_create_error).
            moved = (after.zone is not None and after.zone != chain.status.zone) or after.provisioning != chain.status.provisioning
            out.replan = not after.phase.terminal and moved
            if isinstance(error, errors.OperationPending):
                out.error = None  # accepted and under way: not an error, and not "inserted" either
                # Not news where this chain has just recorded the launch, and a second write
                # of one object within a second is refused by GCS (429, then the client's
                # backoff holds this thread): a later pass that finds it still under way says so.
                if chain.wrote or chain.status.message == after.message:
                    return
        elif isinstance(action, DeleteInstance):
            text = f"cannot delete {action.name}: {error}; retrying every pass"
            if chain.status.message == text:
                return  # said already: the history keeps its other entries
            after = chain.status.but(transitions.event(now, chain.status, "error", out.error), message=text)
        else:
            after = chain.status.but(transitions.event(now, chain.status, "error", out.error))
        try:
            chain.write(self.store, self.bucket, after)
        except errors.RespawnError as e:  # the next pass will see the same trouble again
            log.warning("could not record error", extra={"json_fields": {"job": chain.job, "error": str(e)}})

    def _spec_absent(self, job: str) -> None:
        if self._generation(names.spec_key(job)):
            raise _Spared("a spec appeared for this job since the listing")

    def _unchanged(self, chain: _Chain) -> None:
        if self._generation(names.status_key(chain.job)) != chain.generation:
            raise _Spared("another pass changed the job's status since this decision")

    def _generation(self, key: str) -> int:
        """The object's generation now, 0 when it is absent (metadata only, never the bytes).

        A read that fails is no answer: the action is called off, and retried next pass.
        """
        try:
            return self.store.stat(self.bucket, key).generation
        except errors.NotFound:
            return 0
        except errors.RespawnError as e:
            raise _Spared(f"could not re-check {key}: {e}") from e


def _held(view: JobView, action: CreateInstances, error: errors.RespawnError) -> list[str]:
    """This job's own instances (not the create's) that may hold the quota ``error`` names, being
    up or on their way down: a TPU node in the error's zone (it holds its zone's TPU quota until its
    delete is done); a VM in the error's region (a GPU quota is a region's). Their quota is theirs,
    not the zone's capacity: never a cooldown, never a step down (``transitions.after_create_error``)."""
    zone = getattr(error, "zone", None)
    if not isinstance(error, errors.QuotaError) or zone is None:
        return []
    made = {r.name for r in action.requests}
    return [i.name for i in view.instances if i.name not in made and not (not i.tpu and i.status.down)
            and (i.zone == zone if i.tpu else placement.region_of(i.zone) == placement.region_of(zone))]


class _Spared(errors.RespawnError):
    """A delete called off because its re-check failed (see ``DeleteInstance``)."""


@dataclass
class _Chain:
    job: str
    status: JobStatus | None
    generation: int
    spec: JobSpec | None = None
    tell: bool = False  # whether its commits' notices are wanted (a notifier is configured)
    acting: Acting | None = None  # whether its pass may still act (None: always)
    written: Callable[[BlobInfo, bytes, int], None] | None = None  # told of each status it wrote (Executor's)
    outcome: Outcome = field(init=False)
    wrote: bool = field(default=False, init=False)  # this chain has written the status
    notices: list[notify.Notice] = field(default_factory=list, init=False)  # what its commits decided, to tell
    ids: dict[str, str] = field(default_factory=dict, init=False)  # instance ids its inserts were told
    husk_errors: list[str] = field(default_factory=list, init=False)  # husk deletes that failed

    def __post_init__(self) -> None:
        self.outcome = Outcome(self.job)

    def may_act(self) -> bool:
        if self.acting is None or self.acting():
            return True
        self.outcome.stopped = True
        return False

    def write(self, store: BlobStore, bucket: str, status: JobStatus) -> None:
        # Every commit accounts the events it adds, and tells of them, once: the pass that wins
        # the swap does; one that loses it decided nothing (PreconditionFailed), and sends nothing.
        status = accounting.settle(status.with_ids(self.ids), self.spec)
        data, replaced = status.to_json(), self.generation
        info = store.write(bucket, names.status_key(self.job), data, if_generation_match=replaced)
        before, self.status, self.generation, self.wrote = self.status, status, info.generation, True
        if self.written is not None:
            try:
                self.written(info, data, replaced)
            except Exception:  # noqa: BLE001 - a cache: the next pass reads the status instead
                log.exception("a written status could not be kept", extra={"json_fields": {"job": self.job}})
        self.outcome.status = status
        made = fleet.changes(self.job, before, status)
        self.outcome.changes += made
        for change in made:  # one entry each: what the log-based metrics count (controller.core.fleet)
            log.info("%s: %s in %s%s", change.kind, change.job, change.zone, f" ({change.cause})" if change.cause else "",
                     extra={"json_fields": {**fleet.change_entry(change), "bucket": bucket}})
        if self.tell:
            self.notices += notify.notices(self.job, bucket, before, status, self.spec)

    @property
    def notify(self) -> Notify | None:
        """The job's own destinations as its status last recorded them (its spec may be gone)."""
        return self.status.notify if self.status is not None else None


def _describe(action: Action) -> str:
    match action:
        case WriteStatus(status=s):
            return f"status {s.phase} attempt {s.attempt} ({action.reason})"
        case CreateInstances(requests=r):
            return f"create {', '.join(x.name for x in r)} in {r[0].zone}"
        case DeleteInstance():
            return f"delete {action.name} ({action.reason})"
        case DeleteRecord():
            return f"delete {action.key} ({action.reason})"
        case ReleaseLine():
            return f"go {', '.join(action.names)} ({action.reason})"
        case ClaimSlot():
            return f"claim slot {action.k} of sweep {action.sweep} ({action.reason})"
        case ReleaseSlot():
            return f"release slot {action.k} of sweep {action.sweep} ({action.reason})"
    raise TypeError(action)


def _log(action: Action, result: str, level: int = logging.INFO) -> None:
    fields: dict[str, object] = {"job": action.job, "action": type(action).__name__, "result": result}
    match action:
        case WriteStatus(status=s):
            fields.update(attempt=s.attempt, phase=str(s.phase), instance=",".join(s.instances) or None)
        case CreateInstances():
            fields.update(attempt=action.attempt, instance=",".join(r.name for r in action.requests),
                          zone=action.requests[0].zone)
        case DeleteInstance():
            fields.update(instance=action.name, zone=action.zone)
        case ReleaseLine():
            fields.update(attempt=action.attempt, instance=",".join(action.names), zone=action.zone)
    log.log(level, "%s: %s", _describe(action), result, extra={"json_fields": fields})
