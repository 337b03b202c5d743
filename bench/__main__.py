"""``make bench``: the controller's passes, timed at fleet scale under Google-like latencies.

This first bench runs the real engine (observe, plan, act; the same threads and cache
as deployed) over the in-memory fakes, with every port call delayed as Google's would
be (``Latency``): GCS 30 ms per request, Compute 100 ms per call, the aggregated
instance list 1.5 s. What it does not model yet: operation durations (an insert
here is done when its call returns), rate limits, and HTTP itself; the local cloud's
realism knobs are for that. Figures are printed as a table and written to
``bench/results.json``; a scenario not run is ``null`` there, never a guess.

    python -m bench                    # every scenario, 100 / 1,000 / 10,000 jobs
    python -m bench --sizes 20 --quick # what make test runs, so that this cannot rot
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from controller.core import names
from controller.adapters.memory import MemoryCompute, MemoryStore
from controller.core.clock import FakeClock
from controller.service.engine import Engine
from controller.service.executor import Executor
from controller.core.launch import LaunchContext
from controller.service.observe import Observer
from controller.core.policy import ControllerPolicy

from bench.records import Records

BUCKET, PROJECT = "bench", "bench-proj"
TRAINER = f"respawn-trainer@{PROJECT}.iam.gserviceaccount.com"
SPEC = yaml.safe_dump({"zones": ["us-central1-a", "us-central1-b"], "machine_type": "g2-standard-8",
                       "command": "python train.py", "checkpoint": {"uri": "gs://bench-ckpt/run"},
                       "policy": {"backoff": {"initial": "30m", "max": "1h"}}})
GOOGLE = {"store": 0.030, "compute": 0.100, "list_managed": 1.5}
LATENCY = dict(GOOGLE)  # what this run uses: GOOGLE times --scale


class Latency:
    """A port whose every call first waits as Google's would, and is counted."""

    def __init__(self, target: Any, default: float, per_method: dict[str, float] | None = None) -> None:
        self._target, self._default, self._per = target, default, per_method or {}
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr
        delay = self._per.get(name, self._default)

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls[name] += 1
            time.sleep(delay(*args, **kwargs) if callable(delay) else delay)
            return attr(*args, **kwargs)

        return call


class Fleet(Records):
    """``n`` jobs in the fakes, brought to a steady mix: 70 % running, 20 % finished, 10 % backing off."""

    def __init__(self, n: int, mix: bool = True) -> None:
        self.clock = FakeClock()
        self.store, self.compute = MemoryStore(self.clock), MemoryCompute(self.clock)
        self.policy = ControllerPolicy(default_project=PROJECT, trainer_service_account=TRAINER)
        self.ctx = LaunchContext(BUCKET, PROJECT, "#!/bin/bash\n", "#!/bin/bash\n")
        self.bucket = BUCKET
        self.jobs = [f"job-{i:05d}" for i in range(n)]
        for job in self.jobs:
            self.store.put(BUCKET, names.spec_key(job), SPEC)
        fast = self.engine(workers=1)
        fast.reconcile()  # every job launched
        for i, job in enumerate(self.jobs if mix else ()):
            if i % 10 in (0, 1, 2):  # 0 and 1 succeed, 2 fails and backs off
                self.record(job, names.exit_key(job), {"exit_code": 1 if i % 10 == 2 else 0})
        fast.reconcile()
        self.heartbeats()

    def engine(self, workers: int, latency: dict[str, float] | None = None) -> Engine:
        store: Any = self.store
        compute: Any = self.compute
        if latency:
            store = Latency(self.store, latency["store"])
            # One job's instances come from zonal lists, side by side: one call's time, not an aggregated list's.
            def listing(*args: Any, zones: Any = None, **kwargs: Any) -> float:
                return latency["compute"] if zones is not None else latency["list_managed"]

            compute = Latency(self.compute, latency["compute"], {"list_managed": listing})
        observer = Observer(store, compute, BUCKET, self.policy, workers=workers)
        return Engine(observer, Executor(store, compute, BUCKET), self.ctx, self.clock, workers=workers)


def steady_tick(n: int, workers: int) -> dict[str, Any]:
    """A tick of a warm function instance (its cache filled by the tick before), over ``n`` jobs."""
    fleet = Fleet(n)
    engine = fleet.engine(workers, LATENCY)
    started = time.perf_counter()
    engine.reconcile()  # the tick before: fills the cache, as a deployed instance's earlier ticks have
    first = time.perf_counter() - started
    fleet.heartbeats()  # a minute later every running trainer has beaten again
    store, compute = engine.observer.store, engine.observer.compute
    store.calls.clear()
    compute.calls.clear()
    started = time.perf_counter()
    engine.reconcile()
    seconds = time.perf_counter() - started
    requests = sum(store.calls.values()) + sum(compute.calls.values())
    return {"seconds": seconds, "first_seconds": first, "requests": requests, "requests_per_job": requests / n}


def mass_recovery(n: int, workers: int) -> float:
    """``n`` running jobs preempted at once (markers written): seconds until every replacement insert was issued."""
    fleet = Fleet(n, mix=False)
    running = fleet.running()
    for job in running:
        fleet.compute.preempt(names.instance_name(job, fleet.status(job).attempt))
        fleet.record(job, names.marker_key(job), {"reason": "preempted"})
    engine = fleet.engine(workers, LATENCY)
    before = Counter(op for op, _ in fleet.compute.calls)["insert"]
    started = time.perf_counter()
    engine.reconcile()
    seconds = time.perf_counter() - started
    issued = Counter(op for op, _ in fleet.compute.calls)["insert"] - before
    assert issued >= len(running), f"only {issued} of {len(running)} replacement inserts issued"
    return seconds


def event_path(n: int, events: int) -> list[float]:
    """Marker written -> that job's pass issues its replacement insert, over an ``n``-job fleet, one at a time."""
    fleet = Fleet(n)
    engine = fleet.engine(1, LATENCY)
    running = fleet.running()[:events]
    out = []
    for job in running:
        fleet.compute.preempt(names.instance_name(job, fleet.status(job).attempt))
        fleet.record(job, names.marker_key(job), {"reason": "preempted"})
        started = time.perf_counter()
        engine.reconcile(job)
        out.append(time.perf_counter() - started)
    return out


COLD = """
import time
started = time.perf_counter()
import functions_framework  # noqa: F401 - the platform's own server, loaded before it imports main.py
loaded = time.perf_counter()
import main  # noqa: F401 - the user's code
from controller.service import functions
result, code = functions.tick()
assert code == 200, result
print(loaded - started, time.perf_counter() - loaded)
"""


def cold_start(runs: int = 3) -> tuple[float, float]:
    """A fresh process: import ``main``, then its first tick on an empty bucket (the local GCS and
    Compute, without latency). The medians of ``runs``: (seconds from importing ``main`` to the
    tick's end, seconds importing functions-framework before it). Cloud Functions runs
    functions-framework, which then imports ``main.py``: the first figure is respawn's, the
    second the platform's (``main.py`` imports the same modules, so it is not counted twice)."""
    import os
    import subprocess

    from localcloud.compute import ComputeServer
    from localcloud.gcs import LocalGcs

    with LocalGcs(buckets=(BUCKET,), project=PROJECT) as gcs, ComputeServer() as compute:
        env = {**os.environ, "STORAGE_EMULATOR_HOST": gcs.url, "RESPAWN_COMPUTE_ENDPOINT": compute.endpoint,
               "RESPAWN_BUCKET": BUCKET, "RESPAWN_PROJECT": PROJECT, "RESPAWN_TRAINER_SERVICE_ACCOUNT": TRAINER,
               "RESPAWN_LOG_FORMAT": "text"}
        root = Path(__file__).resolve().parent.parent
        runs_ = [[float(x) for x in subprocess.run([sys.executable, "-c", COLD], cwd=root, env=env, check=True,
                                                   capture_output=True, text=True).stdout.split()[-2:]]
                 for _ in range(runs)]
    framework, ours = (sorted(column)[len(column) // 2] for column in zip(*runs_, strict=True))
    return ours, framework


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--recovery", type=int, default=1000, help="jobs preempted at once")
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--local", type=int, default=0, metavar="N",
                        help="also run the scenarios on the local cloud at Google's latencies, over N jobs (bench/local.py)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every latency (0.01: a smoke run)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, no baseline, nothing written: a smoke run")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.recovery, args.events = min(args.recovery, 20), min(args.events, 5)
    LATENCY.update({k: v * args.scale for k, v in GOOGLE.items()})

    rows: list[tuple[str, str, str]] = []
    results: dict[str, Any] = {"model": "in-memory fakes + Google-like latency per call (bench/__main__.py)",
                               "latency_s": LATENCY, "workers": args.workers,
                               "machine": f"{platform.machine()}, {platform.python_implementation()} "
                                          f"{platform.python_version()}, {_cpus()} CPUs"}
    for n in args.sizes:
        tick = steady_tick(n, args.workers)
        label = {100: "100", 1000: "1k", 10000: "10k"}.get(n, str(n))
        results[f"tick_{label}_s"] = round(tick["seconds"], 3)
        rows.append((f"steady tick, {n:,} jobs", f"{tick['seconds']:.2f} s",
                     f"{tick['requests']:,} requests ({tick['requests_per_job']:.2f}/job); "
                     f"a fresh instance's first tick: {tick['first_seconds']:.2f} s"))
        results[f"tick_{label}_first_s"] = round(tick["first_seconds"], 3)
        if n == max(args.sizes):
            results[f"tick_{label}_requests"] = tick["requests"]
            results[f"tick_{label}_peak_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        if not args.quick and n <= 1000:
            base = steady_tick(n, 1)
            rows.append((f"  baseline: concurrency 1, {n:,} jobs", f"{base['seconds']:.2f} s", ""))
    recovery = mass_recovery(args.recovery, args.workers)
    results["mass_recovery_1k_s" if args.recovery == 1000 else f"mass_recovery_{args.recovery}_s"] = round(recovery, 3)
    rows.append((f"mass recovery, {args.recovery:,} preempted at once", f"{recovery:.2f} s", "one tick issues every insert"))
    if not args.quick:
        small = min(100, args.recovery)
        rows.append((f"  baseline: concurrency 1, {small} preempted", f"{mass_recovery(small, 1):.2f} s", ""))
    background = max(args.sizes)
    latencies = event_path(background, args.events)
    results["event_p50_s"], results["event_p99_s"] = round(percentile(latencies, 50), 3), round(percentile(latencies, 99), 3)
    rows.append((f"event path, {len(latencies)} events over {background:,} jobs",
                 f"p50 {results['event_p50_s']:.2f} s, p99 {results['event_p99_s']:.2f} s", "marker -> insert issued"))
    # A controller that polls every 15 s instead (as the peers do) first waits for its next
    # poll: uniformly 0-15 s, then a whole pass over the fleet. Computed from the tick measured above.
    poll = max(v for k, v in results.items() if k.startswith("tick_") and k.endswith("_s") and "first" not in k)
    rows.append(("  baseline: a 15 s polling loop (computed)", f"p50 {7.5 + poll:.2f} s, p99 {14.85 + poll:.2f} s",
                 "next poll, then a whole tick"))
    if args.local:
        import logging

        from bench import local

        logging.disable(logging.WARNING)  # the controller's own lines: thousands of them
        measured = local.run(args.local, args.workers, args.events, args.scale)
        logging.disable(logging.NOTSET)
        lat = measured["event_latencies_s"]
        jobs = measured["mass_recovery_jobs"]
        results.update({f"local_tick_{args.local}_s": round(measured["tick_s"], 3),
                        f"local_tick_{args.local}_first_s": round(measured["first_tick_s"], 3),
                        f"local_mass_recovery_{jobs}_s": round(measured["mass_recovery_s"], 3),
                        "local_event_p50_s": round(percentile(lat, 50), 3),
                        "local_event_p99_s": round(percentile(lat, 99), 3)})
        rows += [(f"LOCAL CLOUD, Realism.google(): steady tick, {args.local:,} jobs", f"{measured['tick_s']:.2f} s",
                  f"a fresh instance's first tick: {measured['first_tick_s']:.2f} s"),
                 (f"LOCAL CLOUD: mass recovery, {jobs:,} preempted at once", f"{measured['mass_recovery_s']:.2f} s",
                  f"until Compute had all {measured['mass_recovery_issued']:,} inserts"),
                 (f"LOCAL CLOUD: event path, {len(lat)} events over {args.local:,} jobs",
                  f"p50 {percentile(lat, 50):.2f} s, p99 {percentile(lat, 99):.2f} s",
                  "marker landed -> Compute has the insert")]
    ours, framework = cold_start(1 if args.quick else 3)
    results["cold_start_s"], results["cold_start_framework_s"] = round(ours, 3), round(framework, 3)
    rows.append(("cold start: import main + first tick, empty bucket", f"{ours:.2f} s",
                 f"median of 3 fresh processes, local GCS and Compute; before it, the platform's "
                 f"functions-framework import: {framework:.2f} s"))
    results["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)

    width = max(len(r[0]) for r in rows)
    print(f"respawn bench: {results['model']}; {results['machine']}; {args.workers} workers")
    for scenario, figure, note in rows:
        print(f"  {scenario:<{width}}  {figure:<24} {note}")
    print(f"  peak RSS (the fakes' whole cloud included): {results['peak_rss_mib']} MiB")
    if not args.quick:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
        print(f"written: {args.out}")
    return 0


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


if __name__ == "__main__":
    sys.exit(main())
