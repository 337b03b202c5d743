"""``GET /metrics``: the fleet's figures in Prometheus' text format, through prometheus_client.

Gauges, all of them: what is now (jobs by phase, accelerators running, goodput, dollars spent
and saved by the jobs the bucket holds) and what the jobs' current runs have seen (preemptions
and stockouts by zone, recoveries and their time), summed over the jobs in the bucket. Those
sums fall when a job is resubmitted (a fresh run) or removed (``respawn rm``), so they are not
counters (no ``_total``): ``rate()`` over one would read each fall as a reset and spike.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import datetime

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controller.core import ledger
from controller.core.state import JobStatus
from controller.dashboard.snapshot import Snapshot
from controller.dashboard.views import PHASES, totals

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class FleetCollector(Collector):
    def __init__(self, snapshot: Snapshot, now: datetime) -> None:
        self.snapshot, self.now = snapshot, now

    def collect(self) -> Iterator[Metric]:
        views = list(self.snapshot.jobs.values())
        statuses = [v.row.status for v in views if v.row.status is not None]
        fleet = totals(statuses, self.now)
        phases = Counter(str(v.row.status.phase) if v.row.status else ("CANCELLED" if v.row.cancelled else "SUBMITTED")
                         for v in views)
        jobs = GaugeMetricFamily("respawn_jobs", "Jobs in the bucket, by phase", labels=["phase"])
        for phase in dict.fromkeys([*PHASES, *phases]):
            jobs.add_metric([phase], phases.get(phase, 0))
        yield jobs
        yield GaugeMetricFamily("respawn_accelerators_running", "GPUs and TPU chips of attempts RUNNING now",
                                value=fleet["accelerators_running"])
        yield from self._zones(fleet["zones"])
        yield from self._recoveries(statuses)
        goodput = GaugeMetricFamily("respawn_goodput_ratio", "Useful accelerator-time over paid (of known split), "
                                    "over every job's current run", value=fleet["goodput"] if fleet["goodput"] is not None
                                    else float("nan"))
        yield goodput
        per_job = GaugeMetricFamily("respawn_job_goodput_ratio", "A job's goodput in its current run", labels=["job"])
        for v in views:
            if v.row.status and (g := ledger.summary(v.row.status.ledger, self.now).goodput) is not None:
                per_job.add_metric([v.row.job], g)
        yield per_job
        yield GaugeMetricFamily("respawn_cost_dollars", "Dollars spent by the jobs' current runs", value=fleet["cost"])
        yield GaugeMetricFamily("respawn_saved_dollars", "Dollars saved against the same hours on demand",
                                value=fleet["saved"])
        yield GaugeMetricFamily("respawn_accelerator_hours_week", "Accelerator-hours paid in the last 7 days",
                                value=fleet["accelerator_hours_week"])

    def _zones(self, zones: dict[str, dict[str, int]]) -> Iterator[Metric]:
        preempted = GaugeMetricFamily("respawn_preemptions", "Preemptions in the jobs' current runs, by zone",
                                      labels=["zone"])
        stockouts = GaugeMetricFamily("respawn_stockouts", "Creates refused for want of capacity in the jobs' "
                                      "current runs, by zone", labels=["zone"])
        for zone, counts in zones.items():
            preempted.add_metric([zone], counts["preemptions"])
            stockouts.add_metric([zone], counts["stockouts"])
        yield preempted
        yield stockouts

    def _recoveries(self, statuses: list[JobStatus]) -> Iterator[Metric]:
        count = sum(s.ledger.totals.recoveries for s in statuses)
        seconds = sum(s.ledger.totals.recovery_s for s in statuses)
        yield GaugeMetricFamily("respawn_recoveries", "Recoveries in the jobs' current runs", value=count)
        yield GaugeMetricFamily("respawn_recovery_seconds", "Seconds from each loss to its replacement RUNNING, "
                                "summed over the jobs' current runs", value=seconds)


def exposition(snapshot: Snapshot, now: datetime) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(snapshot, now))
    return generate_latest(registry)
