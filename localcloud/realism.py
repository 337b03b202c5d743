"""How slow and how strict the local cloud is: one profile for all its servers.

``Realism()`` (the default) adds nothing: no latency, operations done in a few tens of
milliseconds, no rate limits, so tests stay fast. ``Realism.google()`` is what benchmarks
run under: Google-like latency per request, operations that take as long as Google's
usually do, and Compute's and GCS's rate limits. ``localcloud.stack.Options(realism=...)``
hands one profile to every server; ``LocalGcs(realism=...)`` and
``ComputeServer(realism=...)`` and ``TpuServer(realism=...)`` take it directly. ``Realism.from_canary(path)`` is ``google()`` with the
figures a user measured on their own project (``respawn canary``'s file, ``costs_from``) in place
of ours.

Latency is a sleep in the thread that serves the request, never a lock: concurrent
requests overlap, as they do on Google.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

# z of the 99th percentile of a normal distribution: a lognormal's p99 is median * exp(2.326 sigma).
_Z99 = 2.3263


@dataclass(frozen=True)
class Lognormal:
    """A duration drawn around ``median`` whose 99th percentile is ``p99`` (seconds)."""

    median: float
    p99: float

    @property
    def sigma(self) -> float:
        return 0.0 if self.median <= 0 or self.p99 <= self.median else math.log(self.p99 / self.median) / _Z99

    def draw(self, rng: random.Random | None = None, scale: float = 1.0) -> float:
        if self.median <= 0:
            return 0.0
        return scale * self.median * math.exp((rng or random).gauss(0.0, 1.0) * self.sigma)

    def scaled(self, factor: float) -> Lognormal:
        return Lognormal(self.median * factor, self.p99 * factor)


Delay = float | Lognormal  # seconds, fixed or drawn for each use


def seconds(delay: Delay) -> float:
    """A delay's seconds this time: a fixed one as it is, a Lognormal drawn."""
    return delay.draw() if isinstance(delay, Lognormal) else delay


@dataclass(frozen=True)
class Costs:
    """What Google's APIs cost, in one place: the bench's fakes (bench/fakes.py) and the local
    cloud's ``Realism.google()`` both read these figures.

    Documented by Google (named where used):
    - Compute rate quotas: per project, per group, per synchronized minute; a request over the
      limit is refused with 403 ``rateLimitExceeded`` (https://cloud.google.com/compute/api-quota).
      Default limit of the groups used here: 1,500 requests a minute each (``default`` for
      mutations, ``read_requests``, ``list_requests``, ``operation_read_requests``).
    - Page sizes: GCS lists at most 1,000 objects a page (``maxResults``' cap); Compute's lists
      (aggregatedList included) at most 500 items a page.
    - GCS: one write a second to one object name; more answer 429.
    - Spot: 30 s between the preemption notice (ACPI soft off) and the hard off.
    - Cloud Run functions: one request at a time per instance unless concurrency is set
      (``respawn deploy`` sets none); gen2's default maximum instances: 100.
    Not documented anywhere we found (choices, in the range public measurements report, and
    parameters of the bench): every latency's median and p99, operation durations, the
    Eventarc delivery delay (Google publishes no latency figure for it; Cloud Storage says a
    notification adds about 0.1 s to the write), a cold start's duration and how often an
    isolated event finds no warm instance, and how long a trainer takes to save on SIGTERM.
    """

    gcs_request: Lognormal = Lognormal(0.030, 0.120)
    compute_call: Lognormal = Lognormal(0.100, 0.400)
    compute_list_page: Lognormal = Lognormal(0.400, 1.500)  # one page of an aggregatedList (500 items)
    advice_call: Lognormal = Lognormal(0.300, 1.000)  # advice.capacity / capacityHistory
    insert_running: Lognormal = Lognormal(20.0, 60.0)  # insert accepted -> operation DONE (VM RUNNING)
    delete_done: Lognormal = Lognormal(30.0, 45.0)  # a running Spot VM's delete: its shutdown included
    # The client's own CPU per HTTP request (google-cloud-storage / compute_v1, auth, JSON): one
    # steady 10,000-job tick of the deployed function spent 22.5 CPU-s on 11,047 requests
    # (bench/deployed.py, measured on this repo's 2-CPU machine). Under the GIL it does not overlap.
    client_cpu_s: float = 0.002
    gcs_page: int = 1000
    compute_page: int = 500
    quota_per_minute: int = 1500  # each Compute group, per project
    gcs_write_interval: float = 1.0
    notice_s: float = 30.0
    # The shutdown script (deploy/vm/shutdown.sh): SIGTERM, the trainer saves and exits (at
    # most until 25 s into the notice), then the marker's upload (token + one GCS write).
    trainer_exit: Lognormal = Lognormal(2.0, 20.0)
    marker_upload: Lognormal = Lognormal(0.25, 1.0)
    # The shutdown script's end -> Compute says TERMINATED (the guest's halt; the local cloud's
    # ``Realism.google().halt_seconds``). An assumption, not a measurement: Google publishes no
    # figure, and none was taken here (issue 34's canary is to measure STOPPING -> TERMINATED).
    poweroff_after_marker: Lognormal = Lognormal(2.0, 8.0)
    eventarc_delay: Lognormal = Lognormal(1.0, 4.0)  # object finalized -> the function's request
    # A log entry -> its sink's Pub/Sub message (Log Router): Google says "near real-time" and
    # publishes no figure; real System Event entries are received 0.5-1.1 s after their timestamp.
    # The message -> on_audit's request is ``eventarc_delay`` (Eventarc's push subscription).
    sink_delay: Lognormal = Lognormal(1.0, 3.0)
    cold_start: Lognormal = Lognormal(3.0, 6.0)  # a new instance: platform start + import + clients
    cold_fraction: float = 0.3  # isolated events that find no warm instance
    max_instances: int = 100
    tick_s: float = 60.0  # Cloud Scheduler's finest schedule: every minute


COSTS = Costs()


def costs_from(path: Path | str, base: Costs = COSTS) -> Costs:
    """``base`` with the figures a file of measurements gives in place of its own: the file's
    ``"costs"`` object names ``Costs`` fields, a ``Lognormal`` one as ``{"median": s, "p99": s}``,
    a number one as a number (what ``respawn canary`` writes: ``insert_running``,
    ``poweroff_after_marker``, each fitted to what it measured). Fields it does not name keep
    ``base``'s; a name that is no field, or a value of the wrong shape, is a ValueError naming it."""
    doc = json.loads(Path(path).read_text())
    given = doc.get("costs") if isinstance(doc, dict) else None
    if not isinstance(given, dict):
        raise ValueError(f"{path}: no \"costs\" object (a file `respawn canary` wrote has one)")
    known = {f.name: getattr(base, f.name) for f in fields(Costs)}
    changes: dict[str, object] = {}
    for name, value in given.items():
        if name not in known:
            raise ValueError(f"{path}: costs.{name} is not a figure of localcloud.realism.Costs")
        changes[name] = _cost(f"{path}: costs.{name}", known[name], value)
    return replace(base, **changes)


def _cost(where: str, default: object, value: object) -> object:
    def number(x: object) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0

    if isinstance(default, Lognormal):
        if not (isinstance(value, dict) and number(value.get("median")) and number(value.get("p99"))
                and value["p99"] >= value["median"]):
            raise ValueError(f"{where}: expected {{\"median\": seconds, \"p99\": seconds}}, p99 >= median >= 0")
        return Lognormal(float(value["median"]), float(value["p99"]))
    if not number(value) or isinstance(default, int) and value != int(value):
        raise ValueError(f"{where}: expected a number >= 0" + (" (whole)" if isinstance(default, int) else ""))
    return type(default)(value)


def quota_group(method: str) -> str:
    """The Compute rate-quota group a method's requests count against (named as Google names
    the metrics: https://cloud.google.com/compute/api-quota), for ``method`` as the discovery
    document names it (``"instances.insert"``, ``"zoneOperations.wait"``)."""
    resource, _, verb = method.rpartition(".")
    if resource.endswith("Operations"):
        return "list_requests" if verb == "list" else "operation_read_requests"
    if verb in ("list", "aggregatedList"):
        return "list_requests"
    if verb == "get" or resource == "advice" and verb != "capacity":
        return "read_requests"
    return "default"  # mutations (insert, delete, bulkInsert, start, stop...), advice.capacity


@dataclass
class Realism:
    gcs_latency: float = 0.0  # seconds added to every GCS request (the proxy's)
    compute_latency: float = 0.0  # seconds added to every Compute API call...
    # ...unless its method has its own, named as the discovery document does: {"instances.aggregatedList": 1.5}
    compute_method_latency: dict[str, float] = field(default_factory=dict)
    insert_seconds: float | None = None  # insert / bulkInsert / start operations: RUNNING this long (None: quick)
    delete_seconds: float | None = None  # delete operations, the VM's shutdown included (None: quick)
    bulk_requests_per_second: int | None = None  # bulkInsert calls per project per second (None: unlimited)
    bulk_operations_in_flight: int | None = None  # bulkInsert operations RUNNING per project (None: unlimited)
    gcs_write_interval: float | None = None  # GCS: one mutation per object per this many seconds (None: off)
    tpu_latency: float = 0.0  # seconds added to every Cloud TPU API call
    tpu_create_seconds: float | None = None  # TPU node creates: CREATING this long before capacity is decided
    # The audit path's delays (None: the servers' own fixed defaults): a Log Router sink's, and a
    # Pub/Sub push subscription's (Eventarc's, to on_audit).
    sink_delay: Lognormal | None = None
    push_delay: Lognormal | None = None
    # The guest's halt: from the end of its shutdown script (or the soft-off, when none runs) to
    # Compute's TERMINATED (systemd stopping the rest, disks unmounted, the ACPI power-off), drawn
    # per VM; never past the hard-off (the server's shutdown budget after the soft-off: 30 s on
    # Spot). 0: TERMINATED as soon as the script is over. A host error or a guest crash has none.
    halt_seconds: Delay = 0.0

    # Latencies drawn from a lognormal around their medians (the figures above), its p99 this
    # many times the median (0: fixed); seeded, so that a run's p99 is reproducible.
    p99_factor: float = 0.0
    seed: int = 0
    # Compute's rate quotas: requests per group (``quota_group``) per project per synchronized
    # minute; beyond it, 403 rateLimitExceeded (None: unlimited).
    rate_quota_per_minute: int | None = None

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    @classmethod
    def google(cls, costs: Costs = COSTS) -> Realism:
        """The benchmark profile: what Google's APIs usually cost (``Costs``: the same figures as
        the bench's fakes; typical, not promised)."""
        return cls(gcs_latency=costs.gcs_request.median, compute_latency=costs.compute_call.median,
                   compute_method_latency={"instances.aggregatedList": costs.compute_list_page.median},
                   insert_seconds=costs.insert_running.median, delete_seconds=costs.delete_done.median,
                   bulk_requests_per_second=20, bulk_operations_in_flight=10,
                   gcs_write_interval=costs.gcs_write_interval, tpu_latency=costs.compute_call.median,
                   tpu_create_seconds=60.0, p99_factor=costs.gcs_request.p99 / costs.gcs_request.median,
                   sink_delay=costs.sink_delay, push_delay=costs.eventarc_delay,
                   rate_quota_per_minute=costs.quota_per_minute, halt_seconds=costs.poweroff_after_marker)

    @classmethod
    def from_canary(cls, path: Path | str) -> Realism:
        """``google()`` with a user's own measurements (``costs_from``: the file ``respawn canary``
        wrote) in place of our assumptions: insert to RUNNING, and a guest's halt after its marker."""
        return cls.google(costs_from(path))

    def draw(self, median: float) -> float:
        """One request's latency around ``median`` (``p99_factor`` 0: exactly the median)."""
        if median <= 0 or self.p99_factor <= 1:
            return median
        return Lognormal(median, median * self.p99_factor).draw(self._rng)

    def halt(self) -> float:
        """One guest's halt time, in seconds (``halt_seconds``, drawn when it is a Lognormal)."""
        if isinstance(self.halt_seconds, Lognormal):
            return self.halt_seconds.draw(self._rng)
        return self.halt_seconds

    def compute_delay(self, method: str) -> float:
        """Seconds a Compute call of ``method`` (e.g. ``"instances.insert"``) takes on top of its
        work (the median; each call draws its own with ``draw``)."""
        return self.compute_method_latency.get(method, self.compute_latency)

    def scaled(self, factor: float) -> Realism:
        """Every latency and operation duration times ``factor`` (a smoke run: 0.01); rate limits and
        GCS's per-object write interval are left as they are."""
        return replace(self, gcs_latency=self.gcs_latency * factor, compute_latency=self.compute_latency * factor,
                       compute_method_latency={k: v * factor for k, v in self.compute_method_latency.items()},
                       insert_seconds=None if self.insert_seconds is None else self.insert_seconds * factor,
                       delete_seconds=None if self.delete_seconds is None else self.delete_seconds * factor,
                       tpu_latency=self.tpu_latency * factor,
                       tpu_create_seconds=None if self.tpu_create_seconds is None else self.tpu_create_seconds * factor,
                       sink_delay=None if self.sink_delay is None else self.sink_delay.scaled(factor),
                       push_delay=None if self.push_delay is None else self.push_delay.scaled(factor),
                       halt_seconds=self.halt_seconds.scaled(factor) if isinstance(self.halt_seconds, Lognormal)
                       else self.halt_seconds * factor)
