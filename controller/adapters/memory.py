"""In-memory fakes of the two ports, with the real services' semantics.

They hold state and record calls (tests assert on state), enforce the same
preconditions and 404/409 answers, deduplicate insert request ids as Compute does,
and can inject faults: transient errors, stockouts, quota. Thread-safe, so
concurrency tests can run many passes against one fake at once.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import re
import threading
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from controller.core import audit, errors, names
from controller.adapters.pubsub import check_message
from controller.adapters.tpu_compute import SLICE_LABEL
from controller.adapters.webhook import check as check_webhook
from controller.core.clock import Clock, FakeClock
from controller.core.ports import (Blob, BlobInfo, Instance, InstanceList, InstanceRequest, InstanceStatus, Shape, StopReason,
                                  Stopped)
from controller.core.ports import ZoneAdvice
from controller.core.quotas import GPU_METRICS, PREEMPTIBLE, QuotaUse
from controller.core.quotas import metric as quota_metric
from controller.core.spec import built_in_gpus
from controller.core.ports import QUEUED_AS_NODE, NodeHealth, NodeState, QueuedState, TpuList, TpuNode, TpuRequest


class Faults:
    """Errors to raise on the next calls of a named operation."""

    def __init__(self) -> None:
        self._queued: dict[str, list[Exception]] = defaultdict(list)

    def fail_next(self, op: str, error: Exception, times: int = 1) -> None:
        self._queued[op].extend([error] * times)

    def check(self, op: str) -> None:
        if self._queued.get(op):
            raise self._queued[op].pop(0)


class MemoryStore:
    """A fake GCS: generations grow per write, preconditions hold on write *and* delete."""

    def __init__(self, clock: Clock | None = None, buckets: set[str] | None = None) -> None:
        self.clock = clock or FakeClock()
        self.faults = Faults()
        self.calls: list[tuple[str, str]] = []
        self.buckets = buckets  # the buckets there are; None: every bucket named is there
        self._objects: dict[tuple[str, str], Blob] = {}
        self._sorted: dict[str, list[str]] = defaultdict(list)  # bucket -> its names, sorted: listings cost O(k log n)
        self._generations = itertools.count(1_700_000_000_000_001)
        self._lock = threading.RLock()

    def read(self, bucket: str, name: str, *, limit: int | None = None) -> Blob:
        with self._lock:
            self._call("read", name)
            blob = self._objects.get((bucket, name))
            if blob is None:
                raise errors.NotFound(f"gs://{bucket}/{name}")
            if limit is not None and blob.info.size > limit:
                raise errors.TooLarge(f"gs://{bucket}/{name}: {blob.info.size} bytes, over {limit}")
            return blob

    def read_listed(self, info: BlobInfo) -> bytes:
        with self._lock:
            self._call("read", info.name)
            blob = self._objects.get((info.bucket, info.name))
            if blob is None or blob.info.generation != info.generation:
                raise errors.NotFound(f"gs://{info.bucket}/{info.name}#{info.generation}")
            return blob.data

    def stat(self, bucket: str, name: str) -> BlobInfo:
        with self._lock:
            self._call("stat", name)
            blob = self._objects.get((bucket, name))
            if blob is None:
                raise errors.NotFound(f"gs://{bucket}/{name}")
            return blob.info

    def list(self, bucket: str, prefix: str) -> list[BlobInfo]:
        with self._lock:
            self._call("list", prefix)
            if self.buckets is not None and bucket not in self.buckets:
                raise errors.NoSuchBucket(bucket, f"gs://{bucket}/{prefix}*")
            names_ = self._sorted[bucket]
            found = []
            for name in itertools.islice(names_, bisect.bisect_left(names_, prefix), None):
                if not name.startswith(prefix):
                    break
                found.append(self._objects[(bucket, name)].info)
            return found

    def write(self, bucket: str, name: str, data: bytes, *, if_generation_match: int | None = None,
              metadata: Mapping[str, str] | None = None) -> BlobInfo:
        with self._lock:
            self._call("write", name)
            if self.buckets is not None and bucket not in self.buckets:
                raise errors.NotFound(f"gs://{bucket}/{name}")  # as GCS: 404, the bucket not there
            self._precondition(bucket, name, if_generation_match)
            info = BlobInfo(bucket, name, next(self._generations), self.clock.now(), len(data),
                            dict(metadata) if metadata else None)
            if (bucket, name) not in self._objects:
                bisect.insort(self._sorted[bucket], name)
            self._objects[(bucket, name)] = Blob(info, bytes(data))
            return info

    def delete(self, bucket: str, name: str, *, if_generation_match: int | None = None) -> None:
        with self._lock:
            self._call("delete", name)
            if (bucket, name) not in self._objects:
                raise errors.NotFound(f"gs://{bucket}/{name}")
            self._precondition(bucket, name, if_generation_match)
            del self._objects[(bucket, name)]
            names_ = self._sorted[bucket]
            del names_[bisect.bisect_left(names_, name)]

    # -- test helpers -------------------------------------------------------------
    def put(self, bucket: str, name: str, data: bytes | str, metadata: Mapping[str, str] | None = None) -> BlobInfo:
        data = data.encode() if isinstance(data, str) else data
        # Metadata only where given: a test's subclass may override ``write`` without it.
        return self.write(bucket, name, data) if metadata is None else self.write(bucket, name, data, metadata=metadata)

    def exists(self, bucket: str, name: str) -> bool:
        with self._lock:
            return (bucket, name) in self._objects

    def _call(self, op: str, name: str) -> None:
        self.calls.append((op, name))
        self.faults.check(op)

    def _precondition(self, bucket: str, name: str, expected: int | None) -> None:
        if expected is None:
            return
        current = self._objects.get((bucket, name))
        actual = current.info.generation if current else 0
        if actual != expected:
            raise errors.PreconditionFailed(f"gs://{bucket}/{name}: generation {actual}, expected {expected}")


@dataclass
class _Vm:
    instance: Instance
    request: InstanceRequest | None
    causes: list[StopReason] = field(default_factory=list)  # stop causes Compute recorded, in order
    # When each cause was first recorded (a cause a test appends through ``causes_of`` has none).
    causes_at: dict[StopReason, datetime] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)  # the instance's, as its VM reads it (``release``)
    request_id: str = ""  # the insert that created it


@dataclass
class _Pending:
    """An insert whose operation is still RUNNING: its instances exist (PROVISIONING), its outcome is not decided."""

    keys: list[tuple[str, str, str]]
    zone: str
    provisioning: str = "spot"


_Key = tuple[str, str, str]  # (project, zone, name)


class _Vms(dict[_Key, _Vm]):
    """Instances by key, indexed by name and by job label, so that one job's listing and a
    lookup by name cost the same at 10,000 instances as at 10 (the labels never change)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_name: dict[str, set[_Key]] = defaultdict(set)
        self.by_job: dict[str | None, set[_Key]] = defaultdict(set)

    def __setitem__(self, key: _Key, vm: _Vm) -> None:
        if key in self:
            self._unindex(key)
        super().__setitem__(key, vm)
        self.by_name[key[2]].add(key)
        self.by_job[vm.instance.job].add(key)

    def __delitem__(self, key: _Key) -> None:
        self._unindex(key)
        super().__delitem__(key)

    def pop(self, key: _Key) -> _Vm:  # type: ignore[override]
        self._unindex(key)
        return super().pop(key)

    def _unindex(self, key: _Key) -> None:
        self.by_name[key[2]].discard(key)
        self.by_job[self[key].instance.job].discard(key)


# When several causes were recorded, the platform's beats a person's, which beats the
# guest's own shutdown (as the real adapter reads Compute's operations).
_PRECEDENCE = {StopReason.PREEMPTED: 0, StopReason.MAINTENANCE: 0, StopReason.HOST_ERROR: 0,
               StopReason.STOPPED: 1, StopReason.CRASHED: 2}


def _strongest(causes: list[StopReason], at: Mapping[StopReason, datetime]) -> Stopped:
    reason = min(causes, key=_PRECEDENCE.__getitem__, default=StopReason.UNKNOWN)
    return Stopped(reason, at.get(reason))


class MemoryCompute:
    """A fake Compute Engine: instances by (project, zone, name), label-filtered listing.

    ``hold_inserts = True`` models inserts whose operation is still running at the adapter's
    deadline: the instances appear PROVISIONING and ``insert`` raises ``OperationPending``.
    The outcome is decided when the operation finishes (``release_inserts()``, or
    ``hold_inserts`` set back off), with the zone's stockout/quota as they are then:
    a late stockout removes the instances, and the same request id then answers CapacityError.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or FakeClock()
        self.faults = Faults()
        self.calls: list[tuple[str, str]] = []
        self.stockouts: set[str] = set()
        self.spot_stockouts: set[str] = set()  # zones out of Spot capacity only (standard VMs still fit)
        self.standard_stockouts: set[str] = set()  # zones out of on-demand capacity only (Spot still fits)
        self.quota_exhausted: set[str] = set()
        self.unreachable: set[str] = set()
        self.boot_status = InstanceStatus.RUNNING
        self._hold_inserts = False
        # A project not enrolled in the preemption notice's Preview: an insert asking for one is
        # refused at once (400 naming the field), as Compute does, and nothing is created.
        self.refuse_notice = False
        self.failing_projects: set[str] = set()  # projects whose list fails (403)
        self.deleted: list[str] = []
        self._vms = _Vms()
        self._requests: dict[str, Exception | _Pending | None] = {}
        self._made: dict[str, list[tuple[str, str, str]]] = {}  # request id -> the instances it created
        self._ids = itertools.count(4_000_000_000_000_000_001)
        self._gone: dict[tuple[str, str, str], _Vm] = {}  # deleted, as Compute's records keep them
        self._lock = threading.RLock()
        # Compute's System Event audit log: each system event below is also written there, when set.
        self.audit: MemoryAuditLog | None = None

    def list_managed(self, projects: Sequence[str], job: str | None = None,
                     zones: Sequence[str] | None = None, shard: tuple[int, int] | None = None) -> InstanceList:
        with self._lock:
            by_shard = shard is not None and job is None and shard[1] > 1
            self._call("list", (job or "*") + (f" in {','.join(zones)}" if zones is not None else "")
                       + (f" shard {shard[0]}/{shard[1]}" if by_shard else ""))
            if job is not None and (problem := names.job_name_problem(job)):
                raise errors.RequestError(problem)
            failed = {p: "RequestError: permission denied" for p in projects if p in self.failing_projects}
            keys = sorted(self._vms if job is None else self._vms.by_job[job])
            found = [
                self._vms[key].instance for key in keys
                if key[0] in projects and key[0] not in failed and key[1] not in self.unreachable
                and self._vms[key].instance.managed and (zones is None or key[1] in zones)
                and (not by_shard or _selects(self._vms[key].instance, *shard))
            ]
            unreachable = sorted(self.unreachable if zones is None else self.unreachable & set(zones))
            return InstanceList(found, unreachable, failed)

    def insert(self, requests: Sequence[InstanceRequest], request_id: str, wait: float | None = None) -> dict[str, str]:
        # Operations here finish at once, or only when ``hold_inserts`` lets them: ``wait`` changes neither.
        with self._lock:
            self._call("insert", ",".join(r.name for r in requests))
            if len({(r.project, r.zone) for r in requests}) != 1:
                raise errors.RequestError("a gang must be inserted in a single zone of one project")
            zone, model = requests[0].zone, requests[0].provisioning
            if self.refuse_notice and any(r.preemption_notice_s for r in requests):
                raise errors.NoticeRefused(zone, "Invalid value for field 'resource.scheduling.preemptionNoticeDuration'"
                                                 ": the feature is not enabled for this project")
            if request_id not in self._requests:
                if self.hold_inserts:  # accepted; capacity is decided when the operation finishes
                    keys = [self._create(r, InstanceStatus.PROVISIONING, request_id) for r in requests]
                    self._requests[request_id] = _Pending([k for k in keys if k is not None], zone, model)
                elif model == "flex-start" and self._admit(zone, model) is not None:
                    # Flex-start waits for capacity: created, PENDING until Compute finds some.
                    self._requests[request_id] = None
                    keys = [self._create(r, InstanceStatus.PENDING, request_id) for r in requests]
                else:
                    self._requests[request_id] = outcome = self._admit(zone, model)
                    keys = [self._create(r, self.boot_status, request_id) for r in requests] if outcome is None else []
                # What this request created (an existing name is someone else's: no id for it).
                self._made[request_id] = [k for k in keys if k is not None]
            # Compute answers a repeated id with the first request's operation, as it stands now.
            if isinstance(self._requests[request_id], _Pending) and not self.hold_inserts:
                self._finish(request_id)
            outcome = self._requests[request_id]
            if isinstance(outcome, _Pending):
                raise errors.OperationPending(f"insert of {', '.join(r.name for r in requests)} in {zone} still running")
            if outcome is not None:
                raise outcome
            # As Compute's answer: an insert's operation names its instance's id; a bulk one, none.
            made = [self._vms[k].instance for k in self._made.get(request_id, []) if k in self._vms]
            return {made[0].name: made[0].id} if len(requests) == 1 and made else {}

    def delete(self, project: str, zone: str, name: str) -> None:
        with self._lock:
            self._call("delete", name)
            if (project, zone, name) not in self._vms:
                raise errors.NotFound(f"instance {name} in {zone}")
            vm = self._vms.pop((project, zone, name))
            self._record(vm, StopReason.STOPPED)
            self._gone[(project, zone, name)] = vm
            self.deleted.append(name)

    def release(self, project: str, zone: str, name: str, items: Mapping[str, str],
                wait: float | None = None) -> bool:
        with self._lock:
            self._call("release", name)
            vm = self._vms.get((project, zone, name))
            if vm is None:
                raise errors.NotFound(f"instance {name} in {zone}")
            if "respawn-go" in vm.metadata:
                return False  # a go once given is never changed
            vm.metadata.update(items)
            return True

    def stopped(self, project: str, zone: str, name: str) -> Stopped:
        with self._lock:
            self._call("stopped", name)
            vm = self._vms.get((project, zone, name)) or self._gone.get((project, zone, name))
            return _strongest(vm.causes, vm.causes_at) if vm else Stopped()

    def _record(self, vm: _Vm, reason: StopReason) -> None:
        """Compute records a stop cause now (its zone operation)."""
        vm.causes.append(reason)
        vm.causes_at.setdefault(reason, self.clock.now())

    # -- test helpers: what Google, a user or a guest OS would do -----------------
    def live(self, job: str | None = None) -> list[Instance]:
        """Instances booting or running, optionally of one job."""
        with self._lock:
            return [vm.instance for vm in self._vms.values()
                    if vm.instance.status.alive and (job is None or vm.instance.job == job)]

    def all(self) -> list[Instance]:
        with self._lock:
            return [vm.instance for vm in self._vms.values()]

    def causes_of(self, name: str) -> list[StopReason]:
        """The stop causes Compute recorded for the instance, in order (a test appends to say one
        was recorded while the VM is still on its way down: a preemption's soft-off)."""
        with self._lock:
            return self._find(name)[1].causes

    def metadata_of_instance(self, instance: Instance) -> dict[str, str]:
        """``metadata_of`` for exactly this instance (names repeat across zones and runs); {} once gone."""
        with self._lock:
            vm = self._vms.get((instance.project, instance.zone, instance.name))
            return dict(vm.metadata) if vm is not None and vm.instance.id == instance.id else {}

    def made_by(self, instance: Instance) -> str:
        """The request id of the insert that created this instance ("" for one no insert made)."""
        with self._lock:
            vm = self._vms.get((instance.project, instance.zone, instance.name))
            return vm.request_id if vm is not None and vm.instance.id == instance.id else ""

    def metadata_of(self, name: str) -> dict[str, str]:
        """The instance's metadata as its VM reads it now: its insert's, and what ``release`` added."""
        with self._lock:
            _, vm = self._find(name)
            return dict(vm.metadata)

    def request_of(self, name: str) -> InstanceRequest:
        with self._lock:
            _, vm = self._find(name)
            assert vm.request is not None
            return vm.request

    @property
    def hold_inserts(self) -> bool:
        return self._hold_inserts

    @hold_inserts.setter
    def hold_inserts(self, hold: bool) -> None:
        """Off: every held insert operation finishes now, as Compute's run on by themselves
        (nobody need ask again): capacity decided now."""
        with self._lock:
            self._hold_inserts = hold
            if hold:
                return
            for request_id, outcome in list(self._requests.items()):
                if isinstance(outcome, _Pending):
                    self._finish(request_id)

    def release_inserts(self) -> None:
        """Every held insert operation finishes now (``hold_inserts`` off): capacity decided now."""
        self.hold_inserts = False

    def preempt(self, name: str) -> None:
        """Compute reclaims a Spot VM: TERMINATED (or gone, for termination action DELETE)."""
        with self._lock:
            key, vm = self._find(name)
            self._record(vm, StopReason.PREEMPTED)
            self._audit(vm.instance, StopReason.PREEMPTED)
            if vm.request and vm.request.termination_action == "delete":
                self._gone[key] = vm
                del self._vms[key]
            else:
                vm.instance = replace(vm.instance, status=InstanceStatus.TERMINATED)

    def terminate(self, name: str, reason: StopReason = StopReason.CRASHED) -> None:
        """The VM stops for ``reason`` (CRASHED: the guest powered off or crashed; STOPPED: a
        user; MAINTENANCE, HOST_ERROR...); UNKNOWN leaves no record of why."""
        with self._lock:
            _, vm = self._find(name)
            if reason != StopReason.UNKNOWN:
                self._record(vm, reason)
                self._audit(vm.instance, reason)
            vm.instance = replace(vm.instance, status=InstanceStatus.TERMINATED)

    def maintenance(self, name: str) -> None:
        """Terminating host maintenance (a VM with GPUs cannot live-migrate)."""
        self.terminate(name, StopReason.MAINTENANCE)

    def host_error(self, name: str) -> None:
        """The host failed under the VM: ``compute.instances.hostError``, the VM terminates."""
        self.terminate(name, StopReason.HOST_ERROR)

    def set_status(self, name: str, status: InstanceStatus | str) -> None:
        """Any status Compute might send; a value this code does not know reads as UNKNOWN."""
        with self._lock:
            _, vm = self._find(name)
            vm.instance = replace(vm.instance, status=InstanceStatus.of(status))

    def vanish(self, name: str) -> None:
        """The instance disappears without a trace (deleted out of band)."""
        with self._lock:
            key, _ = self._find(name)
            del self._vms[key]

    def add_foreign(self, project: str, zone: str, name: str, labels: dict[str, str], age: timedelta = timedelta()) -> None:
        """An instance the controller did not create (maybe with look-alike labels)."""
        with self._lock:
            created = self.clock.now() - age
            instance = Instance(project, zone, name, InstanceStatus.RUNNING, dict(labels), created, str(next(self._ids)))
            self._vms[(project, zone, name)] = _Vm(instance, None)

    def _find(self, name: str) -> tuple[tuple[str, str, str], _Vm]:
        if not (keys := self._vms.by_name[name]):
            raise KeyError(f"no instance named {name}")
        key = min(keys)
        return key, self._vms[key]

    def _create(self, r: InstanceRequest, status: InstanceStatus, request_id: str = "") -> tuple[str, str, str] | None:
        """The instance, unless one of that name exists (an existing name is success)."""
        key = (r.project, r.zone, r.name)
        if key in self._vms:
            return None
        instance = Instance(r.project, r.zone, r.name, status, dict(r.labels), self.clock.now(), str(next(self._ids)))
        self._vms[key] = _Vm(instance, r, metadata=dict(r.metadata), request_id=request_id)
        return key

    def _finish(self, request_id: str) -> None:
        """A held insert's operation finishes: a late stockout or quota removes what it created."""
        pending = self._requests[request_id]
        assert isinstance(pending, _Pending)
        outcome = self._admit(pending.zone, pending.provisioning)
        for key in pending.keys:
            vm = self._vms.get(key)
            if vm is None or vm.instance.status != InstanceStatus.PROVISIONING:
                continue
            if outcome is None:
                vm.instance = replace(vm.instance, status=self.boot_status)
            else:
                del self._vms[key]
        self._requests[request_id] = outcome

    def _admit(self, zone: str, model: str) -> Exception | None:
        if zone in self.stockouts or (model == "spot" and zone in self.spot_stockouts) or (
                model == "standard" and zone in self.standard_stockouts):
            return errors.CapacityError(zone, "ZONE_RESOURCE_POOL_EXHAUSTED")
        region = zone.rsplit("-", 1)[0]
        if any(z.rsplit("-", 1)[0] == region for z in self.quota_exhausted):  # a GPU quota is the region's
            return errors.QuotaError(zone, f"QUOTA_EXCEEDED (NVIDIA_L4_GPUS, limit 0 in region {region})")
        return None

    def _call(self, op: str, what: str) -> None:
        self.calls.append((op, what))
        self.faults.check(op)

    def _audit(self, instance: Instance, reason: StopReason) -> None:
        method = next((m for m, r in audit.LOSSES.items() if r == reason), None)
        if self.audit is not None and method is not None:  # a person's stop is an Admin Activity entry, not this log's
            self.audit.write(audit.system_event_entry(instance.project, instance.zone, instance.name, instance.id,
                                                      method, self.clock.now()))


class MemoryAdvisor:
    """Compute's capacity advice, derived as the local server derives it (localcloud/advice.py):
    an insert's odds (0 where the fake Compute is stocked out or out of quota) and, for Spot,
    each zone's ``preemptionRate`` as Google defines it (``rates``: of its Spot VMs that
    stopped, the fraction 0 to 1 preempted) and its estimated uptime (``uptimes``, else the
    local model's from the rate: half preempted within ln 2 / -ln(1 - p) days, between an
    hour and 30 days). A rate outside 0..1 is refused, never answered. ``failure``: raised
    instead of answering."""

    def __init__(self, compute: MemoryCompute, regions: Sequence[str] = ("us-central1", "us-east1", "europe-west4")):
        self.compute = compute
        self.regions = set(regions)
        self.rates: dict[str, float] = {}  # zone -> preemptionRate: share of its stopped Spot VMs preempted
        self.uptimes: dict[str, float] = {}  # zone -> estimatedUptime in seconds (else the model's)
        self.spot_prices: dict[str, float] = {}  # machine type -> Spot dollars per VM-hour (priceHistory)
        self.spot_estimates = True  # False: no Spot uptime or preemption rate (obtainability only)
        self.failure: errors.RespawnError | None = None
        self.calls: list[Shape] = []
        self._lock = threading.Lock()

    def preemption_rate(self, zone: str, rate: float) -> None:
        self.rates[zone] = _fraction(rate)

    def spot_uptime(self, zone: str, seconds: float) -> None:
        if not 0 < float(seconds) < math.inf:
            raise ValueError(f"an uptime is a positive duration: {seconds}")
        self.uptimes[zone] = float(seconds)

    def advise(self, shape: Shape) -> dict[str, ZoneAdvice]:
        with self._lock:
            self.calls.append(shape)
            if self.failure is not None:
                raise self.failure
            if shape.region not in self.regions:
                raise errors.RequestError(f"400 Invalid value for field 'region': '{shape.region}'. Unknown region.")
            spot = shape.model == "SPOT"
            blocked = self.compute.stockouts | self.compute.quota_exhausted | (self.compute.spot_stockouts if spot else set())
            out = {}
            for zone in shape.zones:
                rate = _fraction(self.rates.get(zone, 0.0))
                estimates = spot and self.spot_estimates
                out[zone] = ZoneAdvice(
                    obtainability=0.0 if zone in blocked else 0.9,
                    uptime_s=self.uptimes.get(zone, _model_uptime(rate)) if estimates else None,
                    preemption_rate=rate if estimates else None,
                    spot_price_h=self.spot_prices.get(shape.machine_type) if spot else None)
            return out


class MemoryQuotas:
    """Compute's regional quotas (``regions.get``), as the local server answers them
    (localcloud/quotas.py): every GPU metric of ``controller.core.quotas`` and its preemptible
    twin, ``limits[region][metric]`` where a test set one, else ``default_limit``; ``usage`` the
    GPUs of the fake Compute's live VMs in the region (a Spot or Flex-start VM's on the
    preemptible metric). A region one of whose zones is out of quota (``quota_exhausted``) lists
    every limit as 0. ``failure``: raised instead of answering; ``calls``: (project, region) asked."""

    def __init__(self, compute: MemoryCompute | None = None, default_limit: float = 64.0) -> None:
        self.compute = compute
        self.default_limit = default_limit
        self.limits: dict[str, dict[str, float]] = {}
        self.failure: errors.RespawnError | None = None
        self.calls: list[tuple[str, str]] = []

    def region_quotas(self, project: str, region: str) -> dict[str, QuotaUse]:
        self.calls.append((project, region))
        if self.failure is not None:
            raise self.failure
        used: dict[str, float] = {}
        exhausted = False
        if self.compute is not None:
            exhausted = any(z.rsplit("-", 1)[0] == region for z in self.compute.quota_exhausted)
            for instance in self.compute.live():
                if instance.project != project or instance.zone.rsplit("-", 1)[0] != region:
                    continue
                r = self.compute.request_of(instance.name)
                gpus = built_in_gpus(r.machine_type) or ((r.accelerator_type, r.accelerator_count)
                                                        if r.accelerator_type else None)
                if gpus and (name := quota_metric(gpus[0], r.provisioning)):
                    used[name] = used.get(name, 0.0) + gpus[1]
        limits = self.limits.get(region, {})
        names = {*GPU_METRICS.values(), *(PREEMPTIBLE + m for m in GPU_METRICS.values())}
        return {m: QuotaUse(0.0 if exhausted else limits.get(m, self.default_limit), used.get(m, 0.0))
                for m in sorted(names)}


def _fraction(rate: float) -> float:
    rate = float(rate)
    if not 0.0 <= rate <= 1.0:  # NaN too
        raise ValueError(f"a preemption rate is a fraction, 0 to 1: {rate}")
    return rate


def _model_uptime(rate: float) -> float:
    """The local model's Spot uptime for a zone of preemption rate ``rate`` (localcloud.advice.uptime)."""
    if rate <= 0:
        return 30 * 86400.0
    if rate >= 1:
        return 3600.0
    return max(3600.0, min(30 * 86400.0, math.log(2) / -math.log1p(-rate) * 86400))


@dataclass
class _Tpu:
    node: TpuNode
    request: TpuRequest | None
    held: bool = False  # its create operation is still running (``MemoryTpu.hold``)


@dataclass
class _Queued:
    request: TpuRequest
    state: QueuedState
    created_at: datetime


class MemoryTpu:
    """A fake Cloud TPU: nodes and queued resources by (project, zone, name).

    As the v2 API: a create of an existing name is success (409) once the node is past
    CREATING; a stockout fails a node's create (on its operation) but leaves a queued
    resource WAITING_FOR_RESOURCES until ``stockout(zone, False)`` lets the queue give it
    its node; quota is refused at once. ``hold = True`` keeps node create operations
    running: the node shows CREATING and ``create`` raises ``OperationPending``, the same
    request again too while held; once released, capacity is decided then (a late stockout
    takes the node away, and the next create reads it). A queued resource's create is
    accepted at once, as Google's: while held, it waits in the queue.

    A delete is accepted at once and takes ``delete_seconds`` (90, about what Google's take)
    of the clock: meanwhile the node is listed DELETING and still counts against its zone's
    quota. ``quota_limit[(zone, spot)]``: TPU nodes of that kind a zone may hold, every node
    listed there counting (DELETING and PREEMPTED ones too, as on Google); a create past it is
    refused at once, as a quota on TPU chips is.
    """

    stockout_reason = "RESOURCE_EXHAUSTED (no more capacity)"  # a node create's operation, code 8

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or FakeClock()
        self.faults = Faults()  # ops: "list", "create", "delete"
        self.calls: list[tuple[str, str]] = []
        self.stockouts: set[str] = set()
        self.quota_exhausted: set[str] = set()
        self.unreachable: set[str] = set()
        self.failing_projects: set[str] = set()  # projects whose list fails (403)
        # Zones the project may not use: listing or creating there is Google's 403 on the location.
        self.denied_zones: set[str] = set()
        self.hold = False
        self.deleted: list[str] = []
        self.delete_seconds = 90.0
        self.quota_limit: dict[tuple[str, bool], int] = {}
        self._deleting: dict[_Key, datetime] = {}  # accepted deletes -> when the node is gone
        self._nodes: dict[_Key, _Tpu] = {}
        self._queued: dict[_Key, _Queued] = {}
        self._ids = itertools.count(7_000_000_000_000_000_001)
        self._lock = threading.RLock()

    def list_nodes(self, projects: Sequence[str], zones: Sequence[str], job: str | None = None) -> TpuList:
        with self._lock:
            self._call("list", f"{job or '*'} in {','.join(zones)}")
            if job is not None and (problem := names.job_name_problem(job)):
                raise errors.RequestError(problem)
            self._settle_deletes()
            self._provision()
            failed = {p: "RequestError: permission denied" for p in projects if p in self.failing_projects}

            def seen(key: _Key, labels: Mapping[str, str], request: TpuRequest | None) -> bool:
                return (key[0] in projects and key[0] not in failed and key[1] in zones
                        and key[1] not in self.unreachable and self._ours(key, labels, request)
                        and (job is None or labels.get(names.JOB_LABEL) == job))

            found = [replace(tpu.node, queued=self._queued[key].state if key in self._queued else None)
                     for key, tpu in sorted(self._nodes.items()) if seen(key, tpu.node.labels, tpu.request)]
            for key, queued in sorted(self._queued.items()):
                r = queued.request
                if key not in self._nodes and seen(key, r.labels, r):
                    found.append(TpuNode(r.project, r.zone, r.name, QUEUED_AS_NODE.get(queued.state, NodeState.UNKNOWN),
                                         NodeHealth.HEALTH_UNSPECIFIED, dict(r.labels), queued.created_at,
                                         r.accelerator_type, r.spot, queued=queued.state))
            denied = {z: f"Permission denied on 'locations/{z}' (or it may not exist)."
                      for z in zones if z in self.denied_zones}
            found = [n for n in found if n.zone not in denied]
            return TpuList(found, sorted((self.unreachable & set(zones)) - set(denied)), failed, denied)

    def _ours(self, key: _Key, labels: Mapping[str, str], request: TpuRequest | None) -> bool:
        """Whether a node (or a queued resource: ``request`` set) is listed: the managed label's."""
        return labels.get(names.MANAGED_LABEL) == "true"

    def create(self, request: TpuRequest, request_id: str, wait: float | None = None) -> None:
        # Operations here finish at once, or only when ``hold`` lets them: ``wait`` changes neither.
        r = request
        key = (r.project, r.zone, r.name)
        with self._lock:
            self._call("create", r.name)
            if r.zone in self.denied_zones:
                raise errors.RequestError(f"Permission denied on 'locations/{r.zone}' (or it may not exist).")
            self._settle_deletes()
            self._provision()
            if r.queued:
                self._create_queued(key, r)
                return
            if (tpu := self._nodes.get(key)) is not None:  # 409: success once it is past CREATING
                if tpu.held and not self.hold:
                    self._finish(key)  # the first create's operation, finished now: may raise
                if key in self._nodes and self._nodes[key].held:
                    raise errors.OperationPending(f"{r.name} in {r.zone} still CREATING")
                return
            self._check_quota(r)  # refused at once (HTTP 429), nothing created
            if self.hold:
                self._nodes[key] = _Tpu(self._node(r, NodeState.CREATING), r, held=True)
                raise errors.OperationPending(f"create of {r.name} in {r.zone} still running")
            if r.zone in self.stockouts:  # the operation finishes with code 8
                raise errors.CapacityError(r.zone, self.stockout_reason)
            self._nodes[key] = _Tpu(self._node(r, NodeState.READY), r)

    def _create_queued(self, key: _Key, r: TpuRequest) -> None:
        if key in self._queued or key in self._nodes:  # 409 (the name is taken) / the same request id: success
            return
        self._check_quota(r)
        self._queued[key] = _Queued(r, QueuedState.WAITING_FOR_RESOURCES, self.clock.now())
        self._provision()

    def delete(self, project: str, zone: str, name: str) -> None:
        key = (project, zone, name)
        with self._lock:
            self._call("delete", name)
            self._settle_deletes()
            if key not in self._queued and key not in self._nodes:
                raise errors.NotFound(f"TPU node {name} in {zone}")
            if key in self._deleting:  # already going: nothing new
                return
            if self.delete_seconds <= 0:
                self._gone(key)
            else:  # accepted: DELETING, and holding its quota, until the operation is done
                self._deleting[key] = self.clock.now() + timedelta(seconds=self.delete_seconds)
                if key in self._nodes:
                    tpu = self._nodes[key]
                    tpu.node = replace(tpu.node, state=NodeState.DELETING)
                if key in self._queued:
                    self._queued[key].state = QueuedState.DELETING
            self.deleted.append(name)

    def _gone(self, key: _Key) -> None:
        self._queued.pop(key, None)  # force: its node goes with it
        self._nodes.pop(key, None)
        self._deleting.pop(key, None)

    def _settle_deletes(self) -> None:
        """Deletes whose time has come are done: their nodes are gone."""
        now = self.clock.now()
        for key in [k for k, at in self._deleting.items() if at <= now]:
            self._gone(key)

    def _check_quota(self, r: TpuRequest) -> None:
        if r.zone in self.quota_exhausted:
            raise errors.QuotaError(r.zone, "QUOTA_EXCEEDED (TPUV5sLitepodPerProjectPerZoneForTPUAPI)")
        limit = self.quota_limit.get((r.zone, r.spot))
        if limit is None:
            return
        held = {k for k, t in self._nodes.items() if k[1] == r.zone and t.node.spot == r.spot}
        held |= {k for k, q in self._queued.items() if k[1] == r.zone and q.request.spot == r.spot}
        if len(held) >= limit:
            kind = "Preemptible" if r.spot else ""
            raise errors.QuotaError(r.zone, f"QUOTA_EXCEEDED (TPUV5sLitepod{kind}PerProjectPerZoneForTPUAPI)")

    # -- test helpers: what Google, a user or the TPU host would do ---------------------
    def stockout(self, zone: str, on: bool = True) -> None:
        """No capacity in ``zone``; when it returns, waiting queued resources get their nodes."""
        with self._lock:
            (self.stockouts.add if on else self.stockouts.discard)(zone)
            self._provision()

    def quota(self, zone: str, on: bool = True) -> None:
        with self._lock:
            (self.quota_exhausted.add if on else self.quota_exhausted.discard)(zone)

    def hold_operations(self, on: bool = True) -> None:
        """Create operations stay running and the queue stands still (on), or every held
        operation finishes now and the queue moves (off)."""
        with self._lock:
            self.hold = on
            if not on:
                for key in [k for k, tpu in self._nodes.items() if tpu.held]:
                    try:
                        self._finish(key)
                    except errors.CapacityError:
                        pass  # the node is gone; the next create of it reads the stockout
                self._provision()

    def preempt(self, name: str) -> None:
        """Google reclaims a Spot TPU: PREEMPTED, and it cannot be restarted (its queued
        resource, if any, SUSPENDED: the service deleted its TPUs)."""
        with self._lock:
            key, tpu = self._find(name)
            tpu.node = replace(tpu.node, state=NodeState.PREEMPTED)
            if key in self._queued:
                self._queued[key].state = QueuedState.SUSPENDED

    def set_state(self, name: str, state: NodeState | str) -> None:
        """Any state the API might send; a value this code does not know reads as UNKNOWN."""
        with self._lock:
            _, tpu = self._find(name)
            tpu.node = replace(tpu.node, state=NodeState.of(state))

    def set_health(self, name: str, health: NodeHealth | str) -> None:
        with self._lock:
            _, tpu = self._find(name)
            tpu.node = replace(tpu.node, health=NodeHealth.of(health))

    def upcoming_maintenance(self, name: str, on: bool = True, start: str = "2026-11-24T10:00:00Z") -> None:
        """Scheduled maintenance announced on the node (``Node.upcomingMaintenance``), or withdrawn."""
        with self._lock:
            _, tpu = self._find(name)
            tpu.node = replace(tpu.node, upcoming_maintenance=f"SCHEDULED, starts {start}" if on else None)

    def add_foreign(self, project: str, zone: str, name: str, labels: dict[str, str]) -> None:
        """A node the controller did not create (maybe with look-alike labels)."""
        with self._lock:
            node = TpuNode(project, zone, name, NodeState.READY, NodeHealth.HEALTHY, dict(labels), self.clock.now(),
                           "v5litepod-8", id=str(next(self._ids)))
            self._nodes[(project, zone, name)] = _Tpu(node, None)

    def node(self, name: str) -> TpuNode:
        with self._lock:
            return self._find(name)[1].node

    def request_of(self, name: str) -> TpuRequest:
        """What created the node, or what its queued resource waiting in the queue asks for."""
        with self._lock:
            waiting = [q.request for key, q in sorted(self._queued.items()) if key[2] == name and key not in self._nodes]
            if waiting:
                return waiting[0]
            request = self._find(name)[1].request
            assert request is not None
            return request

    def names(self) -> list[str]:
        """The nodes listed now (DELETING ones too, until their delete is done)."""
        with self._lock:
            self._settle_deletes()
            return sorted(key[2] for key in self._nodes)

    def queued_state(self, name: str) -> QueuedState | None:
        with self._lock:
            return next((q.state for key, q in self._queued.items() if key[2] == name), None)

    # -- the service's own work -------------------------------------------------------
    def _node(self, r: TpuRequest, state: NodeState) -> TpuNode:
        return TpuNode(r.project, r.zone, r.name, state,
                       NodeHealth.HEALTHY if state == NodeState.READY else NodeHealth.HEALTH_UNSPECIFIED,
                       dict(r.labels), self.clock.now(), r.accelerator_type, r.spot, str(next(self._ids)),
                       workers=tpu_workers(r.accelerator_type))

    def _finish(self, key: _Key) -> None:
        """A held node create's operation finishes: a stockout now takes the node away."""
        tpu = self._nodes[key]
        if key[1] in self.stockouts:
            del self._nodes[key]
            raise errors.CapacityError(key[1], self.stockout_reason)
        tpu.held = False
        tpu.node = replace(tpu.node, state=NodeState.READY, health=NodeHealth.HEALTHY)

    def _provision(self) -> None:
        """The queue gives every waiting queued resource in a zone with capacity its node."""
        if self.hold:
            return
        for key, queued in self._queued.items():
            if queued.state == QueuedState.WAITING_FOR_RESOURCES and key[1] not in self.stockouts:
                queued.state = QueuedState.ACTIVE
                self._nodes[key] = _Tpu(self._node(queued.request, NodeState.READY), queued.request)

    def _find(self, name: str) -> tuple[_Key, _Tpu]:
        keys = sorted(key for key in self._nodes if key[2] == name)
        if not keys:
            raise KeyError(f"no TPU node named {name}")
        return keys[0], self._nodes[keys[0]]

    def _call(self, op: str, what: str) -> None:
        self.calls.append((op, what))
        self.faults.check(op)


class MemorySlices(MemoryTpu):
    """A fake of Compute Engine's TPU slices (``controller.adapters.tpu_compute``): one instance,
    or a MIG of ``hosts`` instances, listed as one ``TpuNode`` with ``api`` "compute".

    As ``MemoryTpu``, but as Compute Engine behaves and ``ComputeTpu`` reads it (the contract:
    tests/contract/test_tpu_slices_port.py):

    - a listing is aggregated (every zone of the project, whatever zones are asked);
    - a slice is told by its ``respawn-slice`` label naming it (the adapter puts it on every host
      and template, and never ``respawn-managed``, which is the VM listing's): a look-alike without
      it (``add_foreign``), a VM of respawn's included, is never listed, and deleting it is
      ``NotFound``; a slice is listed with its labels, ``respawn-slice`` and ``respawn-managed``
      "true" among them, and always HEALTHY (Compute has no TPU health);
    - a stockout is Compute's ZONE_RESOURCE_POOL_EXHAUSTED;
    - a Spot host preempted (or lost to maintenance, a host error: ``lose``) is the slice
      TERMINATED, and Compute's operations say why (``stop_reason``);
    - a flex-start slice waits for capacity (``queued`` WAITING_FOR_RESOURCES, as the queue's
      waiting node reads, while its hosts are PENDING) instead of failing on a stockout; once it
      runs it is a slice like another (``queued`` None);
    - a delete is accepted at once; until it is done a MIG reads DELETING, a single-host slice as
      its instance does, STOPPING (Compute has no status of its own for an instance being deleted).
    """

    stockout_reason = "ZONE_RESOURCE_POOL_EXHAUSTED"

    def list_nodes(self, projects: Sequence[str], zones: Sequence[str], job: str | None = None) -> TpuList:
        with self._lock:
            every = sorted({k[1] for k in [*self._nodes, *self._queued]} | set(zones))
        found = super().list_nodes(projects, every, job)
        return replace(found, nodes=[replace(
            n, api="compute", health=NodeHealth.HEALTHY, labels={**n.labels, names.MANAGED_LABEL: "true"},
            queued=n.queued if n.queued == QueuedState.WAITING_FOR_RESOURCES else None) for n in found.nodes])

    def _ours(self, key: _Key, labels: Mapping[str, str], request: TpuRequest | None) -> bool:
        return request is not None or labels.get(SLICE_LABEL) == key[2]

    def create(self, request: TpuRequest, request_id: str, wait: float | None = None) -> None:
        if request.api != "compute":
            raise errors.RequestError(f"{request.name}: a Cloud TPU API request sent to Compute Engine's slices")
        super().create(replace(request, queued=request.flex_start), request_id, wait)

    def delete(self, project: str, zone: str, name: str) -> None:
        key = (project, zone, name)
        with self._lock:
            tpu = self._nodes.get(key)
            if key not in self._queued and tpu is not None and not self._ours(key, tpu.node.labels, tpu.request):
                self._call("delete", name)
                raise errors.NotFound(f"no TPU slice {name} of respawn's in {zone} of {project}")
            super().delete(project, zone, name)
            tpu = self._nodes.get(key)
            if tpu is not None and tpu.request is not None and tpu.request.topology is None \
                    and tpu.node.state == NodeState.DELETING:
                tpu.node = replace(tpu.node, state=NodeState.STOPPING)

    def preempt(self, name: str) -> None:
        """Google reclaims a host of the slice: TERMINATED, preempted by Compute's own record."""
        self.lose(name, StopReason.PREEMPTED)

    def lose(self, name: str, why: StopReason) -> None:
        """A host of the slice goes down for ``why`` (a preemption, host maintenance, a host error)."""
        with self._lock:
            key, tpu = self._find(name)
            tpu.node = replace(tpu.node, state=NodeState.TERMINATED, stop_reason=why, stopped_at=self.clock.now())
            if key in self._queued:
                self._queued[key].state = QueuedState.SUSPENDED

    def _node(self, r: TpuRequest, state: NodeState) -> TpuNode:
        node = super()._node(r, state)
        return replace(node, api="compute", workers=r.hosts, labels={**node.labels, SLICE_LABEL: r.name})


def tpu_workers(accelerator_type: str) -> int:
    """TPU VMs (hosts) in a slice, as Google documents them: v2/v3/v4/v5p name TensorCores
    (2 a chip) and hold 4 chips a host (v4-8: 1 host, v4-16: 2); v5e (``v5litepod``) and v6e
    name chips, one host holds up to 8, a bigger slice is built of 4-chip hosts
    (v5litepod-16: 4). Anything else: 1."""
    family, _, size = accelerator_type.rpartition("-")
    if not size.isdigit():
        return 1
    if family in ("v2", "v3", "v4", "v5p"):
        return max(1, int(size) // 2 // 4)
    if family in ("v5litepod", "v6e"):
        return 1 if int(size) <= 8 else int(size) // 4
    return 1


class MemoryAuditLog:
    """Compute's System Event audit log, as the fake Compute writes it: every entry in order. What
    reaches the controller of it is a Pub/Sub message per entry (``functions.on_audit``), which
    only wakes a pass."""

    def __init__(self) -> None:
        self.entries: list[dict[str, object]] = []
        self._lock = threading.Lock()

    def write(self, entry: dict[str, object]) -> None:
        with self._lock:
            self.entries.append(entry)


class MemoryPublisher:
    """A fake Pub/Sub publisher: topics that exist (``create_topic``), and every message
    published, in order, as (topic, data, attributes).

    As ``CloudPublisher``: a message the client or Google would refuse is a ``RequestError``
    before anything is recorded; a topic that does not exist is ``NotFound``; ids are
    decimal strings. ``fail_next(error, times)`` raises ``error`` instead on the next calls."""

    def __init__(self, topics: Sequence[str] = ()) -> None:
        self.topics: set[str] = set(topics)
        self.published: list[tuple[str, bytes, dict[str, str]]] = []
        self.faults = Faults()
        self.calls: list[tuple[str, str]] = []
        self._ids = itertools.count(1_000_000_000_001)
        self._lock = threading.Lock()

    def create_topic(self, topic: str) -> None:
        with self._lock:
            if topic in self.topics:
                raise errors.AlreadyExists(topic)
            self.topics.add(topic)

    def delete_topic(self, topic: str) -> None:
        with self._lock:
            if topic not in self.topics:
                raise errors.NotFound(topic)
            self.topics.discard(topic)

    def fail_next(self, error: Exception, times: int = 1) -> None:
        self.faults.fail_next("publish", error, times)

    def publish(self, topic: str, data: bytes, attributes: Mapping[str, str]) -> str:
        check_message(topic, data, attributes)
        with self._lock:
            self.calls.append(("publish", topic))
            self.faults.check("publish")
            if topic not in self.topics:
                raise errors.NotFound(f"publish to {topic}: Resource not found (resource={topic.rsplit('/', 1)[-1]}).")
            self.published.append((topic, bytes(data), dict(attributes)))
            return str(next(self._ids))

    def messages(self, topic: str) -> list[tuple[bytes, dict[str, str]]]:
        """What was published to ``topic``: (data, attributes), in order."""
        with self._lock:
            return [(data, attrs) for t, data, attrs in self.published if t == topic]


class MemoryWebhook:
    """A fake incoming webhook: every (url, body) posted, in order, the body as JSON would carry
    it. A body that is not JSON, or a URL that is not http(s), is a ``RequestError`` as for
    ``HttpWebhook``; ``fail_next(error, times)`` raises ``error`` instead on the next posts.

    A slow one: each post is answered ``delay`` seconds after it began (real time: the sender's
    thread waits). With ``timeout`` (the client's, as ``HttpWebhook``'s) below ``delay``, a post is
    not answered at all: it fails with a ``TransientError`` after ``timeout`` seconds, unrecorded
    (``delay=math.inf``: a webhook that never answers). ``answer_now()`` answers every post waiting
    and the later ones at once (a test's teardown)."""

    def __init__(self, delay: float = 0.0, timeout: float | None = None) -> None:
        self.posted: list[tuple[str, dict[str, object]]] = []
        self.faults = Faults()
        self.delay = delay
        self.timeout = timeout
        self.begun = 0  # posts begun, answered or not
        self._now = threading.Event()
        self._lock = threading.Lock()

    def fail_next(self, error: Exception, times: int = 1) -> None:
        self.faults.fail_next("post", error, times)

    def answer_now(self) -> None:
        self._now.set()

    def post(self, url: str, body: Mapping[str, object]) -> None:
        data = check_webhook(url, body)
        with self._lock:
            self.begun += 1
        if self.delay > 0:
            unanswered = self.timeout is not None and self.delay > self.timeout
            limit = self.timeout if unanswered else self.delay
            if not self._now.wait(None if limit == float("inf") else limit) and unanswered:
                raise errors.TransientError(f"webhook {url.split('/')[2]}: ReadTimeout")
        with self._lock:
            self.faults.check("post")
            self.posted.append((url, json.loads(data)))

    def bodies(self, url: str | None = None) -> list[dict[str, object]]:
        with self._lock:
            return [body for u, body in self.posted if url is None or u == url]


def _selects(instance: Instance, index: int, shards: int) -> bool:
    """Whether a shard's list (the real adapter's regular expression on the shard label) finds it."""
    label = instance.labels.get(names.SHARD_LABEL)
    return label is not None and re.fullmatch(names.shard_suffix(index, shards), label) is not None
