"""The bench's scenarios on the local cloud at Google's latencies (``python -m bench --local N``).

Real clients over real HTTP, deployed as on Google: ``main.py``'s two functions served by
functions-framework, each in a process of its own (a function instance has its own CPU;
Google's servers are not in it), against the local GCS and Compute with ``Realism.google()``:
the figures of ``localcloud.realism.COSTS``, the bench's fakes' too (latencies drawn around
30 ms per GCS request, 100 ms per Compute call, 400 ms per aggregatedList page of 500
instances; inserts RUNNING after 20 s, deletes 30 s; Compute's per-minute rate quotas, 403
past them; one write per second to one object). ``python -m bench --local N`` runs these
scenarios here and on the fakes (bench/__main__.py: ``calibration_on_fakes``) and reports both.
VMs have no guest processes here (``run_vms=False``): a fleet of N is N instances, not N
trainers, and the records a trainer would write are written by this script. The fleet
is built with realism off; only the measured steps run at Google's speed. A tick is a
POST to ``tick`` (what Cloud Scheduler sends), an event a CloudEvent posted to
``on_object`` (what Eventarc sends); both answer when their pass has ended.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import requests

from bench.records import Records
from controller.core import names
from controller.adapters.gcs import GcsStore
from localcloud.compute import ComputeServer
from localcloud.events import finalized
from localcloud.gcs import LocalGcs, client
from localcloud.realism import Realism
from localcloud.stack import serve_function

BUCKET, PROJECT = "bench-local", "bench-local"
# Checkpoints in a bucket of their own, as in the model (bench/__main__.py) and as deployments
# usually keep them. fake-gcs-server's listing reads every object of its bucket (its filesystem
# backend; the memory one makes each write as slow instead): with checkpoints under the state
# bucket, each job's checkpoint listing cost the fake ~0.2 s of CPU at 7,000 objects (66 s of
# its CPU in one 1,000-job recovery). GCS lists by prefix from an index: that is the fake's
# cost, not Google's.
CHECKPOINTS = "bench-local-ckpt"
TRAINER = f"respawn-trainer@{PROJECT}.iam.gserviceaccount.com"
SPEC = json.dumps({"zones": ["us-central1-a", "us-central1-b"], "machine_type": "g2-standard-8",
                   "command": "python train.py", "checkpoint": {"uri": f"gs://{CHECKPOINTS}/run"},
                   "policy": {"backoff": {"initial": "30m", "max": "1h"}}})


class LocalFleet(Records):
    def __init__(self, n: int, workers: int) -> None:
        self.n, self.workers = n, workers
        self.gcs = LocalGcs(buckets=(BUCKET, CHECKPOINTS), project=PROJECT).start()
        self.compute = ComputeServer(run_vms=False, shutdown_budget=0.5).start()
        self.store, self.bucket = GcsStore(client(self.gcs.url, PROJECT)), BUCKET
        env = {**os.environ, "STORAGE_EMULATOR_HOST": self.gcs.url, "RESPAWN_COMPUTE_ENDPOINT": self.compute.endpoint,
               "RESPAWN_BUCKET": BUCKET, "RESPAWN_PROJECT": PROJECT, "RESPAWN_TRAINER_SERVICE_ACCOUNT": TRAINER,
               "RESPAWN_CONCURRENCY": str(workers), "RESPAWN_LOG_FORMAT": "text"}
        self.functions = {target: serve_function(target, env) for target in ("tick", "on_object")}
        self.jobs = [f"job-{i:05d}" for i in range(n)]

    def close(self) -> None:
        for process, _ in self.functions.values():
            process.terminate()
            process.wait(timeout=30)
        self.compute.stop()
        self.gcs.stop()

    def tick(self) -> None:
        """One Scheduler run: the pass over every job, in the tick function's process."""
        port = self.functions["tick"][1]
        requests.post(f"http://127.0.0.1:{port}/", json={}, timeout=900)

    def event(self, name: str, generation: int) -> None:
        """What Eventarc posts for a new object: that job's pass, in the event function's process."""
        blob = SimpleNamespace(name=name, generation=generation, metageneration=1, size=0, content_type=None,
                               time_created=None, updated=None)
        headers, body = finalized(BUCKET, blob)
        requests.post(f"http://127.0.0.1:{self.functions['on_object'][1]}/", headers=headers, data=body, timeout=120)

    def build(self) -> None:
        """Realism off: every job launched, then 20 % finished and 10 % failed (backing off)."""
        self.each(lambda j: self.store.write(BUCKET, names.spec_key(j), SPEC.encode()), self.jobs)
        self.tick()
        self.tick()
        mix = [(j, i % 10) for i, j in enumerate(self.jobs) if i % 10 in (0, 1, 2)]
        self.each(lambda ji: self.record(ji[0], names.exit_key(ji[0]), {"exit_code": 0 if ji[1] < 2 else 1}), mix)
        self.tick()
        self.heartbeats()

    def google(self, scale: float = 1.0) -> Realism:
        realism = Realism.google().scaled(scale)
        self.gcs.latency = realism.gcs_latency
        self.gcs.limit_writes(realism.gcs_write_interval)  # one write per second to one object, as on GCS
        self.compute.realism = realism
        self.compute.faults.insert_seconds = realism.insert_seconds
        self.compute.faults.delete_seconds = realism.delete_seconds
        return realism

    def arrived(self, wanted: set[str]) -> int:
        """How many of these instances Compute has: an insert is there once it was received.

        A set of names, cheap to take, since the poll runs in the process serving Compute
        (copying every operation every few milliseconds slowed the very server measured)."""
        return len(wanted & self.compute.names())


def cpu_seconds(pid: int) -> float:
    """CPU-seconds (user + system) of a process and its children so far (Linux /proc; 0 elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat.parent.name == str(pid) or fields[1] == str(pid):  # fields[1]: the parent's pid
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def run(n: int, workers: int, events: int, scale: float = 1.0) -> dict[str, Any]:
    """The scenarios over ``n`` jobs; ``scale`` multiplies every latency and duration (0.01: a smoke run)."""
    fleet = LocalFleet(n, workers)
    try:
        fleet.build()
        realism = fleet.google(scale)
        out: dict[str, Any] = {}
        started = time.perf_counter()
        fleet.tick()  # the first tick of this instance at Google's speed: fills its cache
        out["first_tick_s"] = time.perf_counter() - started
        fleet.heartbeats()
        pid = fleet.functions["tick"][0].pid
        cpu = cpu_seconds(pid)
        started = time.perf_counter()
        fleet.tick()
        out["tick_s"] = time.perf_counter() - started
        out["tick_cpu_s"] = cpu_seconds(pid) - cpu  # the tick function's processes only, not the servers'

        # Mass recovery: every running VM preempted, every marker written; one tick.
        running = fleet.running()
        statuses = dict(zip(running, fleet.each(fleet.status, running), strict=True))
        fleet.each(lambda j: fleet.compute.preempt(names.instance_name(j, statuses[j].attempt)), running)
        fleet.each(lambda j: fleet.record(j, names.marker_key(j), {"reason": "preempted"}, statuses[j]), running)
        replacements = {names.instance_name(j, statuses[j].attempt + 1) for j in running}
        started = time.perf_counter()
        tick = threading.Thread(target=fleet.tick)
        tick.start()
        while fleet.arrived(replacements) < len(running) and time.perf_counter() - started < 900:
            time.sleep(0.05)
        out["mass_recovery_s"] = time.perf_counter() - started
        out["mass_recovery_jobs"] = len(running)
        out["mass_recovery_issued"] = fleet.arrived(replacements)
        tick.join()

        # Event path: wait out the 20 s inserts, settle, then one job at a time.
        time.sleep(realism.insert_seconds or 0)
        fleet.tick()
        fleet.heartbeats()
        fleet.tick()
        latencies = []
        running = fleet.running()
        warm = running.pop()  # the event function's first pass builds its clients: not an event's latency
        fleet.event(names.spec_key(warm), 1)
        for job in running[:events]:
            st = fleet.status(job)
            fleet.compute.preempt(names.instance_name(job, st.attempt))
            replacement = {names.instance_name(job, st.attempt + 1)}
            marker = fleet.record(job, names.marker_key(job), {"reason": "preempted"}, st)
            started = time.perf_counter()  # the marker has landed: Eventarc posts it to the event function
            event = threading.Thread(target=fleet.event, args=(marker.name, marker.generation))
            event.start()
            while not fleet.arrived(replacement) and time.perf_counter() - started < 30:
                time.sleep(0.005)
            latencies.append(time.perf_counter() - started)  # Compute has the insert (the pass goes on)
            event.join()
        out["event_latencies_s"] = latencies
        out["rate_refusals"] = fleet.compute.rate_refusals  # 403 rateLimitExceeded answered meanwhile
        return out
    finally:
        fleet.close()
