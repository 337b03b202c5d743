"""Fakes that cost what Google costs: the memory fakes, wrapped, charged per HTTP request.

``CostlyStore``, ``CostlyCompute`` and ``CostlyAdvisor`` wrap ``controller.adapters.memory``'s
fakes (which keep the state and answer as Google would) and put on each port call what the
real adapters send over HTTP, request by request:

- lists are paged: GCS 1,000 objects a page, Compute 500 items a page (aggregatedList
  included), each page one request with its own latency, read one after another;
- every request's latency is drawn from a lognormal around the median in
  ``localcloud.realism.COSTS`` (its p99 there too), from one seeded generator;
- an insert's operation runs for a drawn duration (``COSTS.insert_running``): the adapter
  waits for it with ``zoneOperations.wait`` (one request per two minutes of waiting, as
  Compute answers such a wait after about two minutes) until the pass's operation deadline,
  then raises ``OperationPending``; the same request id sent again is answered with that
  operation as it stands;
- Compute's per-minute rate quotas, per group and per synchronized minute: a request over
  the limit is refused (403 ``rateLimitExceeded``, counted) and retried as the adapter's
  ``RETRY`` does (random sleeps up to 0.5 s, doubling to 8 s, for at most 60 s, then a
  ``TransientError``);
- GCS's one write a second per object: a second write within the second is refused (429,
  counted); a conditional write is retried as the storage client retries (1 s, doubling),
  an unconditional one fails (the client does not retry those);
- every request costs the client's own CPU too (``COSTS.client_cpu_s``, measured on the
  deployed function: bench/deployed.py), burnt in the calling thread, under the GIL;
- capacity advice costs one ``advice.capacity`` request and, for Spot, one
  ``advice.capacityHistory`` per zone, one after another (controller/adapters/advice.py).

What is counted is HTTP requests (pages, operation waits, refusals), never port calls.
Time is the ``Timer``'s: real sleeps (``RealTimer``, ``scale`` shrinks every duration for
smoke runs) or a simulated clock that each request advances (``SimTimer``), for loops
that would otherwise sleep for minutes.

Not modelled: OAuth token fetches (one per function instance per hour), TCP/TLS set-up,
server-side 5xx, deletes' operations (a delete returns once accepted, as the adapter
does; the VM is gone at once here), and STAGING (an inserted VM lists PROVISIONING until
its insert operation is done, then RUNNING).
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from controller.core import errors
from controller.core.ports import InstanceList, InstanceRequest, InstanceStatus, Shape, ZoneAdvice
from localcloud.realism import COSTS, Costs, Lognormal, quota_group

# Compute quota groups (https://cloud.google.com/compute/api-quota): the local cloud's mapping.
MUTATION, READ = quota_group("instances.insert"), quota_group("advice.capacityHistory")
LIST, OPERATION_READ = quota_group("instances.list"), quota_group("zoneOperations.wait")
OPERATION_WAIT_CAP = 120.0  # zoneOperations.wait answers after about two minutes if not done


class RealTimer:
    """Wall-clock time; every duration multiplied by ``scale`` (1: Google's own)."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds * self.scale)

    def since(self, start: float) -> float:
        """Seconds since ``start``, in Google's time (unscaled)."""
        return (time.monotonic() - start) / self.scale


class SimTimer:
    """A simulated clock (one loop, one thread): ``sleep`` advances it, nothing waits."""

    scale = 1.0

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.t += seconds

    def since(self, start: float) -> float:
        return self.t - start


class Quotas:
    """Compute's rate quotas: ``limit`` requests per group per synchronized minute (the quota
    refills at the start of the next minute, not 60 s after the first request)."""

    def __init__(self, timer: Any, limit: int, phase: float = 0.0) -> None:
        self.timer, self.limit, self.phase = timer, limit, phase
        self._windows: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def admit(self, group: str) -> bool:
        minute = math.floor((self.timer.now() / self.timer.scale + self.phase) / 60.0)
        with self._lock:
            window, used = self._windows.get(group, (minute, 0))
            if window != minute:
                used = 0
            if used >= self.limit:
                self._windows[group] = (minute, used)
                return False
            self._windows[group] = (minute, used + 1)
            return True


class Google:
    """What the wrapped fakes share: the costs, one seeded generator, the clock, the quotas,
    the HTTP request count and when Compute received each instance's insert."""

    def __init__(self, costs: Costs = COSTS, timer: Any | None = None, seed: int = 1, quota_phase: float | None = None,
                 quotas: bool = True) -> None:
        self.costs, self.timer = costs, timer or RealTimer()
        self.rng = random.Random(seed)
        phase = self.rng.uniform(0, 60) if quota_phase is None else quota_phase
        self.quotas = Quotas(self.timer, costs.quota_per_minute, phase) if quotas else None
        self.requests: Counter[str] = Counter()
        self.received: dict[str, float] = {}  # instance name -> timer time its insert was received
        self.deleting: dict[str, tuple[str, str]] = {}  # a VM not down when deleted: gone once it has halted
        self.deleting_lock = threading.Lock()
        self.operations: dict[str, float] = {}  # insert request id -> when its operation is DONE (any instance's)
        self._lock = threading.Lock()

    def client_cpu(self) -> None:
        """The client library's CPU for one request: burnt in this thread (holding the GIL, as the
        real client's Python does), or, on a simulated clock, its time."""
        seconds = self.costs.client_cpu_s * self.timer.scale
        if seconds <= 0:
            return
        if not isinstance(self.timer, RealTimer):
            self.timer.sleep(seconds)
            return
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    def draw(self, cost: Lognormal) -> float:
        with self._lock:
            return cost.draw(self.rng)

    def count(self, kind: str, n: int = 1) -> None:
        """``n`` HTTP requests sent (answered or refused), each with its client CPU."""
        with self._lock:
            self.requests[kind] += n
        for _ in range(n):
            self.client_cpu()

    @property
    def http_requests(self) -> int:
        return sum(n for kind, n in self.requests.items())

    @property
    def refusals(self) -> int:
        return sum(n for kind, n in self.requests.items() if kind.startswith("refused"))

    def compute(self, kind: str, group: str, cost: Lognormal | None = None) -> None:
        """One Compute request, retried on 403 rateLimitExceeded as the adapter's RETRY does."""
        cost = cost or self.costs.compute_call
        deadline = self.timer.now() + 60.0 * self.timer.scale
        ceiling = 0.5
        while True:
            admitted = self.quotas is None or self.quotas.admit(group)
            self.timer.sleep(self.draw(cost))  # a refusal costs its round trip too
            if admitted:
                self.count(kind)
                return
            self.count(f"refused 403 ({group})")
            with self._lock:
                pause = self.rng.uniform(0.0, ceiling)
            ceiling = min(ceiling * 2, 8.0)
            if self.timer.now() + pause * self.timer.scale > deadline:
                raise errors.TransientError(f"403 rateLimitExceeded ({group}): RETRY gave up after 60 s")
            self.timer.sleep(pause)

    def gcs(self, kind: str) -> None:
        self.timer.sleep(self.draw(self.costs.gcs_request))
        self.count(kind)


class CostlyStore:
    """A ``MemoryStore`` behind GCS's costs (see the module's docstring)."""

    def __init__(self, target: Any, google: Google) -> None:
        self.target, self.g = target, google
        self._writes: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:  # test helpers (put, exists...): free, as a fixture is
        return getattr(self.target, name)

    def read(self, bucket: str, name: str, *, limit: int | None = None) -> Any:
        self.g.gcs("gcs.get")
        return self.target.read(bucket, name, limit=limit)

    def stat(self, bucket: str, name: str) -> Any:
        self.g.gcs("gcs.get")
        return self.target.stat(bucket, name)

    def read_listed(self, info: Any) -> bytes:
        self.g.gcs("gcs.get")
        return self.target.read_listed(info)

    def list(self, bucket: str, prefix: str) -> list[Any]:
        found = self.target.list(bucket, prefix)
        for _ in range(max(1, math.ceil(len(found) / self.g.costs.gcs_page))):
            self.g.gcs("gcs.list page")
        return found

    def delete(self, bucket: str, name: str, *, if_generation_match: int | None = None) -> None:
        self.g.gcs("gcs.delete")
        self.target.delete(bucket, name, if_generation_match=if_generation_match)

    def write(self, bucket: str, name: str, data: bytes, *, if_generation_match: int | None = None) -> Any:
        key, pause = (bucket, name), 1.0
        interval = self.g.costs.gcs_write_interval * self.g.timer.scale
        while True:
            with self._lock:
                last = self._writes.get(key)
                now = self.g.timer.now()
                if last is None or now - last >= interval:
                    self._writes[key] = now
                    break
            self.g.timer.sleep(self.g.draw(self.g.costs.gcs_request))
            self.g.count("refused 429 (one write a second per object)")
            if if_generation_match is None:
                raise errors.TransientError(f"429 gs://{bucket}/{name}: more than one write a second")
            with self.g._lock:
                wait = self.g.rng.uniform(0.0, pause)
            pause = min(pause * 2, 60.0)
            self.g.timer.sleep(wait)
        self.g.gcs("gcs.write")
        return self.target.write(bucket, name, data, if_generation_match=if_generation_match)


class CostlyCompute:
    """A ``MemoryCompute`` behind Compute's costs (see the module's docstring)."""

    def __init__(self, target: Any, google: Google, operation_timeout: float = 180.0) -> None:
        self.target, self.g = target, google
        self.operation_timeout = operation_timeout  # the adapter's own wait when the pass gives none
        self._lock = threading.Lock()
        self._operation_of: dict[str, str] = {}  # instance name -> the request id that inserted it

    def __getattr__(self, name: str) -> Any:  # test helpers (preempt, calls...): free
        return getattr(self.target, name)

    def list_managed(self, projects: Sequence[str], job: str | None = None,
                     zones: Sequence[str] | None = None, shard: tuple[int, int] | None = None) -> InstanceList:
        found = self._booting(self.target.list_managed(projects, job, zones, shard))
        if zones is None:  # one aggregatedList per project, paged by 500 instances
            pages = max(len(projects), math.ceil(len(found.instances) / self.g.costs.compute_page))
            for _ in range(pages):
                self.g.compute("compute.aggregatedList page", LIST, self.g.costs.compute_list_page)
            return found
        # One job's zones: zonal lists sent side by side (the adapter's _ZONE_LISTS threads):
        # the slowest one's time, every one a request against the list quota.
        lists = [(p, z) for p in projects for z in zones]
        slowest = 0.0
        for _ in lists:
            if self.g.quotas is not None and not self.g.quotas.admit(LIST):
                self.g.count(f"refused 403 ({LIST})")
                self.g.compute("compute.instances.list", LIST)  # its retries, in this thread
                continue
            slowest = max(slowest, self.g.draw(self.g.costs.compute_call))
            self.g.count("compute.instances.list")
        self.g.timer.sleep(slowest)
        return found

    def _booting(self, found: InstanceList) -> InstanceList:
        """A VM whose insert operation is not done yet lists PROVISIONING, as Compute's do."""
        now = self.g.timer.now()
        with self._lock:
            booting = {name for name, request_id in self._operation_of.items()
                       if self.g.operations.get(request_id, now) > now}
        if not booting:
            return found
        return replace(found, instances=[
            replace(i, status=InstanceStatus.PROVISIONING) if i.name in booting and i.status == InstanceStatus.RUNNING
            else i for i in found.instances])

    def insert(self, requests: Sequence[InstanceRequest], request_id: str, wait: float | None = None) -> Any:
        kind = "compute.instances.insert" if len(requests) == 1 else "compute.instances.bulkInsert"
        self.g.compute(kind, MUTATION)
        received = self.g.timer.now()
        ids = self.target.insert(requests, request_id, wait)  # capacity, quota: the memory fake decides
        with self._lock:
            for r in requests:
                self.g.received.setdefault(r.name, received)
                self._operation_of.setdefault(r.name, request_id)
            if request_id not in self.g.operations:
                self.g.operations[request_id] = received + self.g.draw(self.g.costs.insert_running) * self.g.timer.scale
            done_at = self.g.operations[request_id]
        budget = (self.operation_timeout if wait is None else wait) * self.g.timer.scale
        left = done_at - self.g.timer.now()
        waited = min(max(left, 0.0), budget)
        if left > 0 and budget > 0:
            # zoneOperations.wait: one request, answered when the operation is done, or cut short at
            # the adapter's deadline (the client's timeout), or after two minutes (then another).
            calls = max(1, math.ceil(waited / (OPERATION_WAIT_CAP * self.g.timer.scale)))
            for _ in range(calls):
                if self.g.quotas is not None and not self.g.quotas.admit(OPERATION_READ):
                    self.g.count(f"refused 403 ({OPERATION_READ})")
                self.g.count("compute.zoneOperations.wait")
            time.sleep(waited) if isinstance(self.g.timer, RealTimer) else self.g.timer.sleep(waited)
        if left > budget:
            raise errors.OperationPending(f"{kind} of {', '.join(r.name for r in requests)} still running")
        return ids

    def delete(self, project: str, zone: str, name: str) -> None:
        """Accepted at once, as the adapter returns; the VM is gone at once if it was down, else
        once it has halted: a running one after its shutdown (``COSTS.delete_done``), one on its
        way down (STOPPING) when its guest powers off (``halted``, called by the bench)."""
        self.g.compute("compute.instances.delete", MUTATION)
        with self.g.deleting_lock:
            if name in self.g.deleting:
                return  # its operation is under way: Compute accepts the same delete again
            try:
                _, vm = self.target._find(name)
            except KeyError:
                vm = None
            if vm is None or vm.instance.status.down:
                self.target.delete(project, zone, name)
                return
            self.g.deleting[name] = (project, zone)
            stopping = vm.instance.status == InstanceStatus.STOPPING
            if not stopping:
                self.target.set_status(name, InstanceStatus.STOPPING)
        if not stopping and isinstance(self.g.timer, RealTimer):
            timer = threading.Timer(self.g.draw(self.g.costs.delete_done) * self.g.timer.scale, self.halted, (name,))
            timer.daemon = True
            timer.start()

    def halted(self, name: str) -> bool:
        """The VM's guest has powered off: if a delete waited for it, it is gone now (True)."""
        with self.g.deleting_lock:
            where = self.g.deleting.pop(name, None)
            if where is None:
                return False
            try:
                self.target.delete(*where, name)
            except errors.NotFound:
                pass
            return True

    def stopped(self, project: str, zone: str, name: str) -> Any:
        self.g.compute("compute.zoneOperations.list", LIST)
        return self.target.stopped(project, zone, name)

    def poll(self, project: str, zone: str, job: str) -> InstanceList:
        """One zonal ``instances.list`` of one job (a polling controller's status read)."""
        self.g.compute("compute.instances.list", LIST)
        return self.target.list_managed([project], job, [zone])


class CostlyAdvisor:
    """A ``MemoryAdvisor`` behind the advice API's costs: ``advice.capacity`` once, and for Spot
    ``advice.capacityHistory`` once per zone, one after another."""

    def __init__(self, target: Any, google: Google) -> None:
        self.target, self.g = target, google

    def advise(self, shape: Shape) -> dict[str, ZoneAdvice]:
        self.g.compute("compute.advice.capacity", MUTATION, self.g.costs.advice_call)
        if shape.model == "SPOT":
            for _ in shape.zones:
                self.g.compute("compute.advice.capacityHistory", READ, self.g.costs.advice_call)
        return self.target.advise(shape)
