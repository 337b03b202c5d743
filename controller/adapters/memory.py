"""In-memory fakes of the two ports, with the real services' semantics.

They hold state and record calls (tests assert on state), enforce the same
preconditions and 404/409 answers, deduplicate insert request ids as Compute does,
and can inject faults: transient errors, stockouts, quota. Thread-safe, so
concurrency tests can run many passes against one fake at once.
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta

from controller import errors
from controller.clock import Clock, FakeClock
from controller.ports import Blob, BlobInfo, Instance, InstanceList, InstanceRequest, InstanceStatus, StopReason


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

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or FakeClock()
        self.faults = Faults()
        self.calls: list[tuple[str, str]] = []
        self._objects: dict[tuple[str, str], Blob] = {}
        self._generations = itertools.count(1_700_000_000_000_001)
        self._lock = threading.RLock()

    def read(self, bucket: str, name: str) -> Blob:
        with self._lock:
            self._call("read", name)
            blob = self._objects.get((bucket, name))
            if blob is None:
                raise errors.NotFound(f"gs://{bucket}/{name}")
            return blob

    def list(self, bucket: str, prefix: str) -> list[BlobInfo]:
        with self._lock:
            self._call("list", prefix)
            return [b.info for (bk, n), b in sorted(self._objects.items()) if bk == bucket and n.startswith(prefix)]

    def write(self, bucket: str, name: str, data: bytes, *, if_generation_match: int | None = None) -> BlobInfo:
        with self._lock:
            self._call("write", name)
            self._precondition(bucket, name, if_generation_match)
            info = BlobInfo(bucket, name, next(self._generations), self.clock.now(), len(data))
            self._objects[(bucket, name)] = Blob(info, bytes(data))
            return info

    def delete(self, bucket: str, name: str, *, if_generation_match: int | None = None) -> None:
        with self._lock:
            self._call("delete", name)
            if (bucket, name) not in self._objects:
                raise errors.NotFound(f"gs://{bucket}/{name}")
            self._precondition(bucket, name, if_generation_match)
            del self._objects[(bucket, name)]

    # -- test helpers -------------------------------------------------------------
    def put(self, bucket: str, name: str, data: bytes | str) -> BlobInfo:
        return self.write(bucket, name, data.encode() if isinstance(data, str) else data)

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
    stop_reason: StopReason = StopReason.UNKNOWN


class MemoryCompute:
    """A fake Compute Engine: instances by (project, zone, name), label-filtered listing."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or FakeClock()
        self.faults = Faults()
        self.calls: list[tuple[str, str]] = []
        self.stockouts: set[str] = set()
        self.quota_exhausted: set[str] = set()
        self.unreachable: set[str] = set()
        self.boot_status = InstanceStatus.RUNNING
        self.deleted: list[str] = []
        self._vms: dict[tuple[str, str, str], _Vm] = {}
        self._requests: dict[str, Exception | None] = {}
        self._ids = itertools.count(4_000_000_000_000_000_001)
        self._gone: dict[tuple[str, str, str], StopReason] = {}
        self._lock = threading.RLock()

    def list_managed(self, projects: Sequence[str], job: str | None = None) -> InstanceList:
        with self._lock:
            self._call("list", job or "*")
            found = [
                vm.instance for (p, z, _), vm in sorted(self._vms.items())
                if p in projects and z not in self.unreachable and vm.instance.managed
                and (job is None or vm.instance.job == job)
            ]
            return InstanceList(found, sorted(self.unreachable))

    def insert(self, requests: Sequence[InstanceRequest], request_id: str) -> None:
        with self._lock:
            self._call("insert", ",".join(r.name for r in requests))
            if len({r.zone for r in requests}) != 1:
                raise errors.RequestError("a gang must be inserted in a single zone")
            if request_id in self._requests:  # Compute answers a repeated id with the first outcome
                if (first := self._requests[request_id]) is not None:
                    raise first
                return
            outcome = self._admit(requests[0].zone)
            self._requests[request_id] = outcome
            if outcome is not None:
                raise outcome
            for r in requests:
                key = (r.project, r.zone, r.name)
                if key not in self._vms:
                    self._vms[key] = _Vm(self._new_instance(r), r)

    def delete(self, project: str, zone: str, name: str) -> None:
        with self._lock:
            self._call("delete", name)
            if (project, zone, name) not in self._vms:
                raise errors.NotFound(f"instance {name} in {zone}")
            vm = self._vms.pop((project, zone, name))
            first = vm.stop_reason if vm.stop_reason != StopReason.UNKNOWN else StopReason.STOPPED
            self._gone[(project, zone, name)] = first
            self.deleted.append(name)

    def stop_reason(self, project: str, zone: str, name: str) -> StopReason:
        with self._lock:
            self._call("stop_reason", name)
            vm = self._vms.get((project, zone, name))
            return vm.stop_reason if vm else self._gone.get((project, zone, name), StopReason.UNKNOWN)

    # -- test helpers: what Google, a user or a guest OS would do -----------------
    def live(self, job: str | None = None) -> list[Instance]:
        """Instances booting or running, optionally of one job."""
        with self._lock:
            return [vm.instance for vm in self._vms.values()
                    if vm.instance.status.alive and (job is None or vm.instance.job == job)]

    def all(self) -> list[Instance]:
        with self._lock:
            return [vm.instance for vm in self._vms.values()]

    def request_of(self, name: str) -> InstanceRequest:
        with self._lock:
            vm = next(vm for (_, _, n), vm in self._vms.items() if n == name)
            assert vm.request is not None
            return vm.request

    def preempt(self, name: str) -> None:
        """Compute reclaims a Spot VM: TERMINATED (or gone, for termination action DELETE)."""
        with self._lock:
            key, vm = self._find(name)
            vm.stop_reason = vm.stop_reason if vm.stop_reason != StopReason.UNKNOWN else StopReason.PREEMPTED
            if vm.request and vm.request.termination_action == "delete":
                self._gone[key] = StopReason.PREEMPTED
                del self._vms[key]
            else:
                vm.instance = replace(vm.instance, status=InstanceStatus.TERMINATED)

    def terminate(self, name: str, reason: StopReason = StopReason.CRASHED) -> None:
        """The guest powered off or crashed, or a user stopped the VM."""
        with self._lock:
            _, vm = self._find(name)
            vm.stop_reason = vm.stop_reason if vm.stop_reason != StopReason.UNKNOWN else reason
            vm.instance = replace(vm.instance, status=InstanceStatus.TERMINATED)

    def set_status(self, name: str, status: InstanceStatus) -> None:
        with self._lock:
            _, vm = self._find(name)
            vm.instance = replace(vm.instance, status=status)

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
        return next((k, vm) for k, vm in self._vms.items() if k[2] == name)

    def _admit(self, zone: str) -> Exception | None:
        if zone in self.stockouts:
            return errors.CapacityError(zone, "ZONE_RESOURCE_POOL_EXHAUSTED")
        if zone in self.quota_exhausted:
            return errors.QuotaError(zone, "QUOTA_EXCEEDED")
        return None

    def _new_instance(self, r: InstanceRequest) -> Instance:
        return Instance(r.project, r.zone, r.name, self.boot_status, dict(r.labels), self.clock.now(), str(next(self._ids)))

    def _call(self, op: str, what: str) -> None:
        self.calls.append((op, what))
        self.faults.check(op)

