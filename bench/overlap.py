"""``overlapping_passes``: ticks that outlive their period, and how many passes over every job overlapped.

Cloud Scheduler calls ``tick`` every minute. A tick that takes longer (a 10,000-job fleet at a third
of a vCPU; a fresh instance's first tick) is still running when the next one comes, on another
function instance. Here a fleet over the costly fakes (bench/fakes.py: GCS's and Compute's
latencies and the clients' CPU, the real engine) gets a tick every ``period`` seconds, half of what
one warm tick takes, ``ticks`` times, whether or not the ticks before have ended; each tick runs on
an idle function instance, a new one (its caches cold) when none is idle. A pass's span runs from
its first read of the fleet (``Observer.parts``) to its last action or read, measured from outside
the lease; a pass overlaps when its span and another's intersect.

- ``overlapping_passes``: passes that overlapped another, the engines as deployed (with the lease):
  must be 0. ``overlap_passes_run`` of ``overlap_ticks`` ran a pass; the others answered "another
  pass holds the lease until ..." (``overlap_ticks_skipped``).
- ``overlapping_passes_without_lease``: the same ticks on engines without the lease, the proof that
  the scenario does make passes overlap.
- ``overlap_tick_s``, ``overlap_period_s``: the warm tick measured first, and the period from it.

``measure(jobs, ...)`` returns those keys, ``scenario(run)`` is ``make bench``'s (300 jobs: the
no-lease control run costs six overlapping passes);
``python -m bench.overlap [--jobs 1000] [--ticks 6] [--scale 1] [--seed 1] [--out FILE]`` prints them
(and writes them to FILE when given).
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from bench.fakes import CostlyCompute, CostlyStore, Google, RealTimer
from bench.run import target
from bench.records import Records
from controller.adapters.memory import MemoryCompute, MemoryStore
from controller.core import names
from controller.core.clock import FakeClock
from controller.core.launch import LaunchContext
from controller.core.policy import ControllerPolicy
from controller.service.config import Settings
from controller.service.engine import Engine, Summary
from controller.service.executor import Executor
from controller.service.lease import Leases
from controller.service.observe import Observer

BUCKET, PROJECT = "bench", "bench-proj"
TRAINER = f"respawn-trainer@{PROJECT}.iam.gserviceaccount.com"
SPEC = yaml.safe_dump({"zones": ["us-central1-a", "us-central1-b"], "machine_type": "g2-standard-8",
                       "command": "python train.py"})
WORKERS = Settings.model_fields["concurrency"].default  # as deployed
OPERATION_WAIT = Settings.model_fields["operation_wait"].default


class Fleet(Records):
    """``n`` running jobs in the memory fakes, launched at no cost, each with a fresh heartbeat."""

    def __init__(self, n: int) -> None:
        self.clock = FakeClock()
        self.store, self.compute = MemoryStore(self.clock), MemoryCompute(self.clock)
        self.bucket, self.jobs, self.workers = BUCKET, [f"job-{i:05d}" for i in range(n)], 8
        self.policy = ControllerPolicy(default_project=PROJECT, trainer_service_account=TRAINER)
        self.ctx = LaunchContext(BUCKET, PROJECT, "#!/bin/bash\n", "#!/bin/bash\n")
        for job in self.jobs:
            self.store.put(BUCKET, names.spec_key(job), SPEC)
        Engine(Observer(self.store, self.compute, BUCKET, self.policy, workers=1),
               Executor(self.store, self.compute, BUCKET), self.ctx, self.clock).reconcile()
        self.heartbeats()

    def engine(self, g: Google, lease: bool) -> Engine:
        """A function instance over the costly fakes: its own clients' caches, and its own lease holder."""
        store, compute = CostlyStore(self.store, g), CostlyCompute(self.compute, g)
        leases = Leases(store, BUCKET, self.clock) if lease else None
        return Engine(Observer(store, compute, BUCKET, self.policy, workers=WORKERS), Executor(store, compute, BUCKET),
                      self.ctx, self.clock, workers=WORKERS, operation_wait=OPERATION_WAIT, lease=leases)


class Spans:
    """Each pass's span, [its first read of the fleet, its last action or read], by ``time.monotonic``."""

    def __init__(self) -> None:
        self.spans: list[list[float]] = []
        self._lock = threading.Lock()

    def watch(self, engine: Engine) -> Engine:
        """Record the spans of ``engine``'s passes (one at a time: a function instance's)."""
        observer, executor = engine.observer, engine.executor
        parts, apply = observer.parts, executor.apply
        span = [0.0, 0.0]

        def end() -> None:
            span[1] = max(span[1], time.monotonic())

        def parts_(job: str | None = None) -> Any:
            nonlocal span
            span = [time.monotonic()] * 2
            with self._lock:
                self.spans.append(span)
            first, rest = parts(job)
            end()

            def rest_() -> Any:
                later = rest()
                end()
                return later

            return first, rest_

        def apply_(*args: Any, **kw: Any) -> Any:
            outcome = apply(*args, **kw)
            end()
            return outcome

        observer.parts, executor.apply = parts_, apply_  # type: ignore[method-assign]
        return engine

    def overlapping(self) -> int:
        """Passes whose span intersects another's."""
        s = self.spans
        return sum(any(j != i and a < d and c < b for j, (c, d) in enumerate(s)) for i, (a, b) in enumerate(s))


def ticks(fleet: Fleet, g: Google, count: int, period: float, lease: bool) -> tuple[Spans, list[Summary]]:
    """``count`` ticks, one every ``period`` seconds, each on an idle instance (a new one if none is)."""
    spans, summaries, idle = Spans(), [], queue.SimpleQueue[Engine]()
    lock = threading.Lock()

    def tick() -> None:
        try:
            engine = idle.get_nowait()
        except queue.Empty:
            engine = spans.watch(fleet.engine(g, lease))
        summary = engine.reconcile()
        idle.put(engine)
        with lock:
            summaries.append(summary)

    started, threads = time.monotonic(), []
    for k in range(count):
        time.sleep(max(0.0, started + k * period - time.monotonic()))
        threads.append(threading.Thread(target=tick, name=f"tick-{k}"))
        threads[-1].start()
    for t in threads:
        t.join(timeout=1800)
    return spans, summaries


def scenario(run: Any) -> dict[str, Any]:
    """``make bench``'s: 300 jobs, 6 ticks (30 jobs, 5 ticks in a smoke run)."""
    jobs, count = (30, 5) if run.quick else (300, 6)
    found = measure(jobs, count, run.scale, run.seed)
    return {**found, "overlapping_passes_target": target(found["overlapping_passes"], equals=0)}


def measure(jobs: int = 1000, count: int = 6, scale: float = 1.0, seed: int = 1) -> dict[str, Any]:
    """The keys of the module's docstring, over a fleet of ``jobs`` running jobs."""
    fleet = Fleet(jobs)
    g = Google(timer=RealTimer(scale), seed=seed, quotas=False)  # quotas: no refusals to blur the timing
    warm = fleet.engine(g, lease=False)  # the pass's own work: no lease request in its time
    warm.reconcile()  # its caches filled
    fleet.heartbeats()  # a minute later every trainer has beaten again
    started = time.monotonic()
    warm.reconcile()
    tick_s = time.monotonic() - started
    period = tick_s / 2  # every tick outlives its period (a fresh instance's first tick, twice over)
    leased, leased_summaries = ticks(fleet, g, count, period, lease=True)
    fleet.heartbeats()
    bare, bare_summaries = ticks(fleet, g, count, period, lease=False)
    return {
        "overlapping_passes": leased.overlapping(),
        "overlap_ticks": count,
        "overlap_passes_run": sum(1 for s in leased_summaries if not s.skipped),
        "overlap_ticks_skipped": sum(1 for s in leased_summaries if s.skipped),
        "overlapping_passes_without_lease": bare.overlapping(),
        "overlap_passes_run_without_lease": len(bare.spans),
        "overlap_tick_s": round(tick_s, 3),
        "overlap_period_s": round(period, 3),
        "overlap_jobs": jobs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overlap", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--ticks", type=int, default=6)
    parser.add_argument("--scale", type=float, default=1.0, help="every latency multiplied by this (1: Google's)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, help="also write the keys to this file (JSON)")
    args = parser.parse_args(argv)
    found = measure(args.jobs, args.ticks, args.scale, args.seed)
    print(json.dumps(found, indent=1))
    if args.out:
        args.out.write_text(json.dumps(found, indent=1) + "\n")
    return 0 if found["overlapping_passes"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
