"""How slow and how strict the local cloud is: one profile for all its servers.

``Realism()`` (the default) adds nothing: no latency, operations done in a few tens of
milliseconds, no rate limits, so tests stay fast. ``Realism.google()`` is what benchmarks
run under: Google-like latency per request, operations that take as long as Google's
usually do, and Compute's and GCS's rate limits. ``localcloud.stack.Options(realism=...)``
hands one profile to every server; ``LocalGcs(realism=...)`` and
``ComputeServer(realism=...)`` and ``TpuServer(realism=...)`` take it directly.

Latency is a sleep in the thread that serves the request, never a lock: concurrent
requests overlap, as they do on Google.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


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

    @classmethod
    def google(cls) -> Realism:
        """The benchmark profile: what Google's APIs usually cost (figures are typical, not promised)."""
        return cls(gcs_latency=0.030, compute_latency=0.100, compute_method_latency={"instances.aggregatedList": 1.5},
                   insert_seconds=20.0, delete_seconds=30.0, bulk_requests_per_second=20, bulk_operations_in_flight=10,
                   gcs_write_interval=1.0, tpu_latency=0.100, tpu_create_seconds=60.0)

    def compute_delay(self, method: str) -> float:
        """Seconds a Compute call of ``method`` (e.g. ``"instances.insert"``) takes on top of its work."""
        return self.compute_method_latency.get(method, self.compute_latency)

    def scaled(self, factor: float) -> Realism:
        """Every latency and operation duration times ``factor`` (a smoke run: 0.01); rate limits and
        GCS's per-object write interval are left as they are."""
        return replace(self, gcs_latency=self.gcs_latency * factor, compute_latency=self.compute_latency * factor,
                       compute_method_latency={k: v * factor for k, v in self.compute_method_latency.items()},
                       insert_seconds=None if self.insert_seconds is None else self.insert_seconds * factor,
                       delete_seconds=None if self.delete_seconds is None else self.delete_seconds * factor,
                       tpu_latency=self.tpu_latency * factor,
                       tpu_create_seconds=None if self.tpu_create_seconds is None else self.tpu_create_seconds * factor)
