"""The bench's scenarios on the local cloud at Google's latencies (``python -m bench --local N``).

Real clients over real HTTP: functions' own engine (``bootstrap.build``) against the
local GCS and Compute with ``Realism.google()`` (30 ms per GCS request, 100 ms per
Compute call, 1.5 s aggregated lists, inserts RUNNING 20 s, deletes 30 s, bulk limits).
VMs have no guest processes here (``run_vms=False``): a fleet of N is N instances, not N
trainers, and the records a trainer would write are written by this script. The fleet
is built with realism off; only the measured steps run at Google's speed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from bench.records import Records
from controller import bootstrap, names
from controller.adapters.gcs import GcsStore
from controller.config import Settings
from localcloud.compute import ComputeServer
from localcloud.gcs import LocalGcs, client
from localcloud.realism import Realism

BUCKET, PROJECT = "bench-local", "bench-local"
TRAINER = f"respawn-trainer@{PROJECT}.iam.gserviceaccount.com"
SPEC = json.dumps({"zones": ["us-central1-a", "us-central1-b"], "machine_type": "g2-standard-8",
                   "command": "python train.py", "checkpoint": {"uri": f"gs://{BUCKET}/ckpt"},
                   "policy": {"backoff": {"initial": "30m", "max": "1h"}}})


class LocalFleet(Records):
    def __init__(self, n: int, workers: int) -> None:
        self.n, self.workers = n, workers
        self.gcs = LocalGcs(buckets=(BUCKET,), project=PROJECT).start()
        self.compute = ComputeServer(run_vms=False, shutdown_budget=0.5).start()
        os.environ["STORAGE_EMULATOR_HOST"] = self.gcs.url
        self.store, self.bucket = GcsStore(client(self.gcs.url, PROJECT)), BUCKET
        config = Settings(bucket=BUCKET, project=PROJECT, compute_endpoint=self.compute.endpoint,
                          trainer_service_account=TRAINER, concurrency=workers, log_format="text")
        bootstrap.override(None, config)
        self.engine = bootstrap.build(config)
        self.jobs = [f"job-{i:05d}" for i in range(n)]

    def close(self) -> None:
        bootstrap.override(None)
        self.compute.stop()
        self.gcs.stop()

    def build(self) -> None:
        """Realism off: every job launched, then 20 % finished and 10 % failed (backing off)."""
        self.each(lambda j: self.store.write(BUCKET, names.spec_key(j), SPEC.encode()), self.jobs)
        self.engine.reconcile()
        self.engine.reconcile()
        mix = [(j, i % 10) for i, j in enumerate(self.jobs) if i % 10 in (0, 1, 2)]
        self.each(lambda ji: self.record(ji[0], names.exit_key(ji[0]), {"exit_code": 0 if ji[1] < 2 else 1}), mix)
        self.engine.reconcile()
        self.heartbeats()

    def google(self) -> None:
        realism = Realism.google()
        self.gcs.latency = realism.gcs_latency
        self.compute.realism = realism
        self.compute.faults.insert_seconds = realism.insert_seconds
        self.compute.faults.delete_seconds = realism.delete_seconds

    def inserts(self, attempt: int) -> int:
        suffix = f"-{attempt}"
        return sum(1 for op in self.compute.operations()
                   if op.get("operationType") == "insert" and op.get("targetLink", "").endswith(suffix))


def run(n: int, workers: int, events: int) -> dict[str, Any]:
    fleet = LocalFleet(n, workers)
    try:
        fleet.build()
        fleet.google()
        out: dict[str, Any] = {}
        started = time.perf_counter()
        fleet.engine.reconcile()  # the first tick of this instance at Google's speed: fills its cache
        out["first_tick_s"] = time.perf_counter() - started
        fleet.heartbeats()
        started = time.perf_counter()
        fleet.engine.reconcile()
        out["tick_s"] = time.perf_counter() - started

        # Mass recovery: every running VM preempted, every marker written; one tick.
        running = fleet.running()
        statuses = dict(zip(running, fleet.each(fleet.status, running), strict=True))
        fleet.each(lambda j: fleet.compute.preempt(names.instance_name(j, statuses[j].attempt)), running)
        fleet.each(lambda j: fleet.record(j, names.marker_key(j), {"reason": "preempted"}, statuses[j]), running)
        started = time.perf_counter()
        tick = threading.Thread(target=fleet.engine.reconcile)
        tick.start()
        while fleet.inserts(2) < len(running) and time.perf_counter() - started < 900:
            time.sleep(0.05)
        out["mass_recovery_s"] = time.perf_counter() - started
        out["mass_recovery_jobs"] = len(running)
        out["mass_recovery_issued"] = fleet.inserts(2)
        tick.join()

        # Event path: wait out the 20 s inserts, settle, then one job at a time.
        time.sleep(Realism.google().insert_seconds or 0)
        fleet.engine.reconcile()
        fleet.heartbeats()
        fleet.engine.reconcile()
        latencies = []
        for job in fleet.running()[:events]:
            st = fleet.status(job)
            fleet.compute.preempt(names.instance_name(job, st.attempt))
            before = fleet.inserts(st.attempt + 1)
            fleet.record(job, names.marker_key(job), {"reason": "preempted"}, st)
            started = time.perf_counter()  # the marker has landed: what the event function does
            event = threading.Thread(target=fleet.engine.reconcile, args=(job,))
            event.start()
            while fleet.inserts(st.attempt + 1) <= before and time.perf_counter() - started < 30:
                time.sleep(0.005)
            latencies.append(time.perf_counter() - started)  # Compute has the insert (the pass goes on)
            event.join()
        out["event_latencies_s"] = latencies
        return out
    finally:
        fleet.close()
