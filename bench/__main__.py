"""``make bench``: the controller's passes, timed at fleet scale, against fakes that cost what Google costs.

The real engine (observe, plan, act; the same threads, caches and operation deadline as
deployed) runs over ``bench/fakes.py``: the in-memory fakes wrapped so that every HTTP
request the real adapters would send is paid for and counted (paged lists, latencies drawn
from a lognormal, insert operations that take their time and are waited for, Compute's
per-minute rate quotas, GCS's one write a second per object, capacity advice with a cold
cache). Its figures (``localcloud.realism.COSTS``) are the local cloud's too, and
``--local N`` runs the calibration scenarios on the local cloud (bench/local.py) beside the
fakes, over the same number of jobs.

Clocks start where the user's loss starts: the preemption notice. What happens before the
controller's pass (the trainer's save and the marker's upload, the guest's power-off,
Eventarc's delivery, a cold function instance) is drawn from ``COSTS``; the passes
themselves run for real, in wall-clock time. The polling baseline (a SkyPilot-style
managed-jobs loop: one job's status read every 15 s and a relaunch at once, and a
variant that waits 60 s before relaunching) runs over the same fakes on a simulated clock that each request
advances (``bench.fakes.SimTimer``): minutes of polling take milliseconds.

One run, one record (bench/run.py): ``python -m bench`` runs every scenario of ``SCENARIOS`` in
one process and writes every key of ``bench/results.json`` once, at the end, with the commit,
whether the work tree differed from it, the start time, the seeds, the machine and each
scenario's wall time; ``--only`` runs some alone and writes them to ``bench/runs/``.

    python -m bench                      # make bench: every scenario -> bench/results.json
    python -m bench --only mass_recovery # one scenario again -> bench/runs/mass_recovery-<UTC>.json
    python -m bench --only fakes --sizes 20 --quick  # what make test runs, so that this cannot rot
"""

from __future__ import annotations

import argparse
import heapq
import importlib
import logging
import math
import queue
import random
import resource
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from bench.fakes import CostlyAdvisor, CostlyCompute, CostlyStore, Google, RealTimer, SimTimer
from bench.records import Records
from bench.run import RESULTS, load, now, provenance, run_file, target, targets, write
from controller.adapters.memory import MemoryAdvisor, MemoryCompute, MemoryStore
from controller.core import errors, names
from controller.core.clock import FakeClock
from controller.core.launch import LaunchContext
from controller.core.policy import ControllerPolicy
from controller.core.ports import InstanceStatus
from controller.service.advice import AdviceCache
from controller.service.config import Settings
from controller.service.engine import Engine
from controller.service.executor import Executor
from controller.service.observe import Observer
from localcloud.realism import COSTS, Costs

BUCKET, PROJECT = "bench", "bench-proj"
TRAINER = f"respawn-trainer@{PROJECT}.iam.gserviceaccount.com"
SPEC = yaml.safe_dump({"zones": ["us-central1-a", "us-central1-b"], "machine_type": "g2-standard-8",
                       "command": "python train.py", "checkpoint": {"uri": "gs://bench-ckpt/run"},
                       "policy": {"backoff": {"initial": "30m", "max": "1h"}}})
OPERATION_WAIT = Settings.model_fields["operation_wait"].default  # as deployed: 2 s of a pass for its inserts
POLL_S = 15.0  # the polling baseline's period (SkyPilot's managed-jobs controller: one job's status a poll)
# SkyPilot's StrategyExecutor.RETRY_INIT_GAP_SECONDS: its backoff after a *failed* launch
# (sky/jobs/recovery_strategy.py; its own tests: "A failed launch backs off
# Backoff(RETRY_INIT_GAP_SECONDS) before the retry"). A recovery relaunches at once: the
# headline baseline has no wait; the variant with a 60 s wait before every relaunch is the
# one issue 24 assumed, kept as ``poll_15s_wait60``.
POLL_RELAUNCH_WAIT_S = 60.0


class Fleet(Records):
    """``n`` jobs in the memory fakes, brought to a steady mix (free: no costs while building):
    70 % running, 20 % finished, 10 % backing off."""

    def __init__(self, n: int, mix: bool = True) -> None:
        self.clock = FakeClock()
        self.store, self.compute = MemoryStore(self.clock), MemoryCompute(self.clock)
        self.advisor = MemoryAdvisor(self.compute)
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
        self.costly: CostlyCompute | None = None

    def engine(self, workers: int, google: Google | None = None) -> Engine:
        """An engine as deployed (one function instance: its own caches); over the costly fakes with ``google``."""
        store: Any = self.store
        compute: Any = self.compute
        advisor: Any = self.advisor
        if google is not None:
            store, advisor = CostlyStore(self.store, google), CostlyAdvisor(self.advisor, google)
            compute = self.costly = CostlyCompute(self.compute, google)
        observer = Observer(store, compute, BUCKET, self.policy, workers=workers, advisor=advisor)
        return Engine(observer, Executor(store, compute, BUCKET), self.ctx, self.clock, workers=workers,
                      operation_wait=OPERATION_WAIT if google is not None else None)

    # -- a preemption, as Compute and the VM's shutdown script make it ---------------------
    def vm(self, job: str) -> str:
        return names.instance_name(job, self.status(job).attempt)

    def notice(self, job: str) -> str:
        """The preemption notice: the VM is STOPPING (its shutdown script runs)."""
        name = self.vm(job)
        self.compute.set_status(name, InstanceStatus.STOPPING)
        return name

    def halt(self, name: str) -> None:
        """The guest has powered off: TERMINATED (preempted), or gone if a delete was waiting for it."""
        if self.costly is not None and self.costly.halted(name):
            return
        try:
            self.compute.preempt(name)
        except KeyError:
            pass  # deleted meanwhile

    def marker(self, job: str) -> None:
        self.record(job, names.marker_key(job), {"reason": "preempted", "saved": True})


@dataclass(frozen=True)
class Preemption:
    """One preemption, in seconds from its notice: what the VM and the platform do before a pass."""

    marker_at: float  # the shutdown script's marker has landed (the trainer saved, then the upload)
    off_at: float  # the guest has powered off: Compute says TERMINATED
    delivered_at: float  # Eventarc's request reaches the event function
    cold_s: float  # a cold instance's start before the pass (0: a warm one)
    tick_phase: float  # where the minute's tick falls, 0..60 s after the notice
    poll_phase: float  # the polling loop's last read, 0..15 s before the notice


def preemptions(n: int, costs: Costs, seed: int, cold_fraction: float | None = None) -> list[Preemption]:
    rng = random.Random(seed)
    deadline = costs.notice_s - min(costs.notice_s / 4, 5.0)  # deploy/vm/shutdown.sh: the marker by 25 s
    fraction = costs.cold_fraction if cold_fraction is None else cold_fraction
    out = []
    for _ in range(n):
        marker = min(costs.trainer_exit.draw(rng), deadline) + costs.marker_upload.draw(rng)
        off = min(marker + costs.poweroff_after_marker.draw(rng), costs.notice_s)
        delivered = marker + costs.eventarc_delay.draw(rng)
        cold = costs.cold_start.draw(rng) if rng.random() < fraction else 0.0
        out.append(Preemption(marker, off, delivered, cold, rng.uniform(0, costs.tick_s), rng.uniform(0, POLL_S)))
    return out


def next_tick(p: Preemption, after: float, costs: Costs) -> float:
    """The first tick at or after ``after`` (seconds from the notice)."""
    return p.tick_phase + max(0, math.ceil((after - p.tick_phase) / costs.tick_s)) * costs.tick_s


def per_kind(g: Google) -> dict[str, int]:
    return dict(sorted(g.requests.items()))


# -- the scenarios ---------------------------------------------------------------------------


def steady_tick(fleet: Fleet, workers: int, scale: float, seed: int) -> dict[str, Any]:
    """A warm tick over the fleet (its instance's caches filled by the tick before), and that first tick."""
    g = Google(timer=RealTimer(scale), seed=seed)
    engine = fleet.engine(workers, g)
    started = g.timer.now()
    engine.reconcile()
    first = g.timer.since(started)
    fleet.heartbeats()  # a minute later every running trainer has beaten again
    g.requests.clear()
    started = g.timer.now()
    engine.reconcile()
    seconds = g.timer.since(started)
    n = len(fleet.jobs)
    return {"seconds": seconds, "first_seconds": first, "requests": g.http_requests, "per_job": g.http_requests / n,
            "refusals": g.refusals, "by_kind": per_kind(g), "engine": engine, "google": g}


def tick_offsets(fleet: Fleet, engine: Engine, g: Google, k: int) -> list[float]:
    """``k`` VMs down with their markers before a tick: seconds from the tick's start to each
    replacement insert received (where in a tick of this fleet a job's insert lands)."""
    jobs = fleet.running()[:k]
    for job in jobs:
        fleet.halt(fleet.notice(job))
        fleet.marker(job)
    new = [names.instance_name(j, fleet.status(j).attempt + 1) for j in jobs]
    started = g.timer.now()
    engine.reconcile()
    return sorted((g.received[n] - started) / g.timer.scale for n in new if n in g.received)


def event_from_notice(fleet: Fleet, jobs: list[str], pre: list[Preemption], offsets: list[float], scale: float,
                      seed: int, workers: int, side_by_side: int = 16) -> tuple[list[float], Counter[str], Google]:
    """Each preemption's notice to its replacement insert received by Compute, through the event
    path: the marker lands, Eventarc delivers it, a warm or cold instance runs that job's pass
    (for real, over the costly fakes, its advice cache cold). If the pass finds the VM still on
    its way down (STOPPING: the guest has not powered off yet) it deletes it and leaves the
    insert to a later pass; no event follows, so the next tick's (at the preemption's tick
    phase, that tick's own insert drawn from ``offsets``, measured on this fleet)."""
    g = Google(timer=RealTimer(scale), seed=seed)
    rng = random.Random(seed)
    warm: queue.SimpleQueue[Engine] = queue.SimpleQueue()
    for _ in range(side_by_side):
        warm.put(fleet.engine(workers, g))
    via: Counter[str] = Counter()
    lock = threading.Lock()

    def one(job: str, p: Preemption) -> float:
        name = fleet.notice(job)
        new = names.instance_name(job, fleet.status(job).attempt + 1)
        fleet.marker(job)
        start = p.delivered_at + p.cold_s  # the pass starts, seconds after the notice
        halting = None
        if p.off_at <= start:
            fleet.halt(name)
        else:
            halting = threading.Timer((p.off_at - start) * scale, fleet.halt, (name,))
            halting.daemon = True
            halting.start()
        engine = fleet.engine(workers, g) if p.cold_s else warm.get()
        engine.observer.advice = AdviceCache(engine.observer.advice.advisor)  # advice: a cold cache
        begun = g.timer.now()
        try:
            engine.reconcile(job)
        finally:
            if not p.cold_s:
                warm.put(engine)
        took = g.timer.since(begun)
        if halting is not None:
            halting.join()
        with lock:
            if new in g.received:
                via["event"] += 1
                return start + (g.received[new] - begun) / scale
            via["tick"] += 1
            return next_tick(p, max(p.off_at, start + took), fleet_costs) + rng.choice(offsets)

    fleet_costs = g.costs
    with ThreadPoolExecutor(side_by_side) as pool:
        latencies = list(pool.map(one, jobs, pre))
    return latencies, via, g


def tick_only(pre: list[Preemption], offsets: list[float], costs: Costs, seed: int) -> list[float]:
    """No event function: the first tick after the VM is down (its marker has landed before) acts."""
    rng = random.Random(seed)
    return [next_tick(p, p.off_at, costs) + rng.choice(offsets) for p in pre]


def polling_baseline(fleet: Fleet, subjects: list[tuple[str, Any]], pre: list[Preemption], wait_s: float,
                     seed: int) -> tuple[list[float], Counter[str], float]:
    """A managed-jobs controller per job, as SkyPilot's (sky/jobs/controller.py): sleep 15 s, read
    that one job's status (one zonal ``instances.list`` of its cluster), and on a preemption
    relaunch after ``wait_s`` (0, as SkyPilot recovers; 60 s for the variant with a wait).
    A real loop over the same costly fakes, on a simulated clock (``SimTimer``): each job's
    controller is its own process, so each runs on its own clock. Never handicapped: the
    STOPPING VM counts as lost from the notice on (its first read after the notice sees it),
    the relaunch is one insert with no provisioning steps before it, and no rate quota applies
    (10,000 jobs polled every 15 s would send 40,000 lists a minute: see the notes)."""
    requests: Counter[str] = Counter()
    out = []
    polled_s = 0.0  # simulated seconds the loops ran, all together
    for i, ((job, old), p) in enumerate(zip(subjects, pre, strict=True)):
        g = Google(timer=SimTimer(-p.poll_phase), seed=seed + i, quotas=False)
        mem = MemoryCompute(fleet.clock)
        mem.insert([old], f"{old.name}-first")
        compute = CostlyCompute(mem, g)
        preempted = False
        while True:
            g.timer.sleep(POLL_S)
            if g.timer.now() >= 0 and not preempted:
                mem.set_status(old.name, InstanceStatus.STOPPING)  # the notice: lost from here on
                preempted = True
            listed = compute.poll(old.project, old.zone, job)
            if not any(v.name == old.name and v.status.alive for v in listed.instances):
                break
        polled_s += g.timer.now() + p.poll_phase  # its polling, up to the read that saw the loss
        g.timer.sleep(wait_s)
        new = replace(old, name=names.instance_name(job, int(old.labels.get(names.ATTEMPT_LABEL, "1")) + 1))
        try:
            compute.insert([new], f"{new.name}-relaunch", wait=0)
        except errors.OperationPending:
            pass
        out.append(g.received[new.name])
        requests.update(g.requests)
    return out, requests, polled_s


def mass_recovery(n: int, workers: int, scale: float, seed: int, costs: Costs = COSTS) -> dict[str, Any]:
    """``n`` running VMs preempted at one moment: each marker lands when its trainer has saved,
    Eventarc delivers each to the event function (up to ``costs.max_instances`` instances, one
    request at a time each, a new one cold), the tick runs every minute at a drawn phase; until
    Compute has received every replacement insert. Rate quotas on: refusals counted."""
    fleet = Fleet(n, mix=False)
    running = fleet.running()
    g = Google(timer=RealTimer(scale), seed=seed)
    tick_engine = fleet.engine(workers, g)
    tick_engine.reconcile()  # the tick's instance is warm: a tick ran a minute before
    g.requests.clear()
    pre = preemptions(len(running), costs, seed, cold_fraction=0.0)
    rng = random.Random(seed + 1)
    tick_phase = rng.uniform(0, costs.tick_s)
    new = {names.instance_name(j, fleet.status(j).attempt + 1) for j in running}
    vms = {j: fleet.vm(j) for j in running}
    events: list[tuple[float, int, str, str]] = []  # (seconds after the preemption, order, what, job)
    for i, (job, p) in enumerate(zip(running, pre, strict=True)):
        events += [(p.marker_at, i, "marker", job), (p.off_at, i, "halt", job), (p.delivered_at, i, "deliver", job)]
    heapq.heapify(events)
    deliveries: queue.SimpleQueue[str | None] = queue.SimpleQueue()
    done = threading.Event()
    passes: Counter[str] = Counter()

    def instance() -> None:
        engine = None
        while (job := deliveries.get()) is not None:
            if engine is None:  # a new instance: its cold start, then its clients and caches
                g.timer.sleep(costs.cold_start.draw(rng))
                engine = fleet.engine(workers, g)
                passes["cold starts"] += 1
            try:
                engine.reconcile(job)
            except Exception:  # noqa: BLE001 - a pass that raises is retried by Eventarc; counted
                passes["event passes that raised"] += 1
            passes["event passes"] += 1

    def ticker(started: float) -> None:
        at = tick_phase
        while not done.is_set():
            delay = started + at * scale - g.timer.now()
            if delay > 0 and done.wait(delay):
                return
            tick_engine.reconcile()
            passes["ticks"] += 1
            at += costs.tick_s

    for job in running:
        fleet.notice(job)
    started = g.timer.now()
    pool = [threading.Thread(target=instance, daemon=True) for _ in range(costs.max_instances)]
    for t in pool:
        t.start()
    tick = threading.Thread(target=ticker, args=(started,), daemon=True)
    tick.start()
    while events:
        at, _, what, job = heapq.heappop(events)
        delay = started + at * scale - g.timer.now()
        if delay > 0:
            time.sleep(delay)
        if what == "marker":
            fleet.marker(job)
        elif what == "halt":
            fleet.halt(vms[job])
        else:
            deliveries.put(job)
    limit = 900.0
    while len(new & g.received.keys()) < len(new) and g.timer.since(started) < limit:
        time.sleep(0.05 * scale if scale < 1 else 0.05)
    arrived = [g.received[x] for x in new if x in g.received]
    seconds = (max(arrived) - started) / scale if len(arrived) == len(new) else math.inf
    done.set()
    for _ in pool:
        deliveries.put(None)
    for t in (*pool, tick):  # their passes end before the scenario does (none outlives it)
        t.join(timeout=600)
    return {"seconds": seconds, "jobs": len(running), "received": len(arrived), "requests": g.http_requests,
            "refusals": g.refusals, "by_kind": per_kind(g), "passes": dict(passes),
            "p50_s": percentile([(a - started) / scale for a in arrived], 50) if arrived else math.inf}


# -- calibration: the local cloud's scenarios (bench/local.py), on the fakes ------------------


def calibration_on_fakes(n: int, workers: int, events: int, scale: float, seed: int) -> dict[str, Any]:
    """bench/local.py's three scenarios over the costly fakes: a warm tick; every running job's
    VM TERMINATED with its marker, then one tick, until every replacement insert is received;
    events one at a time on a warm instance, marker landed -> insert received."""
    fleet = Fleet(n)
    tick = steady_tick(fleet, workers, scale, seed)
    g: Google = tick["google"]
    engine: Engine = tick["engine"]
    running = fleet.running()
    for job in running:
        fleet.halt(fleet.notice(job))
        fleet.marker(job)
    new = {names.instance_name(j, fleet.status(j).attempt + 1) for j in running}
    g.requests.clear()
    started = g.timer.now()
    engine.reconcile()
    got = [g.received[x] for x in new if x in g.received]
    recovery = (max(got) - started) / scale if len(got) == len(new) else math.inf
    recovery_requests = g.http_requests
    # Events: the fleet settled (the inserts' operations done, as the local cloud waits them
    # out), one job at a time, a warm event instance (its first pass ran).
    g.operations.update({k: 0.0 for k in g.operations})
    engine.reconcile()
    fleet.heartbeats()
    engine.reconcile()
    event_engine = fleet.engine(workers, g)
    warm = fleet.running()
    event_engine.reconcile(warm.pop())
    latencies = []
    for job in warm[:events]:
        fleet.halt(fleet.notice(job))
        target = names.instance_name(job, fleet.status(job).attempt + 1)
        fleet.marker(job)
        begun = g.timer.now()
        event_engine.reconcile(job)
        latencies.append((g.received.get(target, math.inf) - begun) / scale)
    return {"tick_s": tick["seconds"], "tick_requests": tick["requests"], "mass_recovery_s": recovery,
            "mass_recovery_jobs": len(running), "mass_recovery_requests": recovery_requests,
            "event_p50_s": percentile(latencies, 50)}


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def r3(x: float) -> float | None:
    return None if x is None or math.isinf(x) else round(x, 3)


# -- the scenarios of a run -------------------------------------------------------------------------


def fakes(run: Any) -> dict[str, Any]:
    """Steady ticks at each of ``run.sizes``; over the largest fleet, the event path from the notice,
    the tick alone and the polling baseline, all on the same preemptions."""
    costs, scale, seed = COSTS, run.scale, run.seed
    rows: list[tuple[str, str, str]] = []
    results: dict[str, Any] = {
        "model": "costly fakes (bench/fakes.py): paged lists, lognormal latencies, operations, rate quotas; "
                 "figures from localcloud.realism.COSTS",
        "costs": {k: (v.__dict__ if hasattr(v, "median") else v) for k, v in costs.__dict__.items()},
        "workers": run.workers, "operation_wait_s": OPERATION_WAIT}
    fleet = tick = None
    for n in sorted(run.sizes):
        fleet = Fleet(n)
        tick = steady_tick(fleet, run.workers, scale, seed)
        label = {100: "100", 1000: "1k", 10000: "10k"}.get(n, str(n))
        results[f"tick_{label}_s"] = r3(tick["seconds"])
        results[f"tick_{label}_first_s"] = r3(tick["first_seconds"])
        results[f"tick_{label}_requests"] = tick["requests"]
        results[f"tick_{label}_requests_by_kind"] = tick["by_kind"]
        rows.append((f"steady tick, {n:,} jobs", f"{tick['seconds']:.2f} s",
                     f"{tick['requests']:,} HTTP requests ({tick['per_job']:.2f}/job, {tick['refusals']} refused); "
                     f"the instance's first tick: {tick['first_seconds']:.2f} s"))
    assert fleet is not None and tick is not None
    background = len(fleet.jobs)
    # Where a job's insert lands in a tick of this fleet (the tick-only path's second half).
    offsets = tick_offsets(fleet, tick["engine"], tick["google"], k=min(50, max(5, background // 20)))
    results[f"tick_{background}_insert_offsets_s"] = {"p50": r3(percentile(offsets, 50)), "max": r3(max(offsets))}

    pool = fleet.running()
    pre = preemptions(min(run.events, len(pool) // 2), costs, seed)
    jobs, spare = pool[-len(pre):], pool[-2 * len(pre):-len(pre)]
    # The same preemptions for every path: these jobs' VMs, as they were before the event path's.
    subjects = [(job, fleet.compute.request_of(fleet.vm(job))) for job in jobs]
    latencies, via, g = event_from_notice(fleet, jobs, pre, offsets, scale, seed, run.workers)
    results.update({"event_from_notice_p50_s": r3(percentile(latencies, 50)),
                    "event_from_notice_p99_s": r3(percentile(latencies, 99)),
                    "event_from_notice_max_s": r3(max(latencies)),
                    "event_from_notice_events": len(latencies), "event_from_notice_via": dict(via),
                    "event_from_notice_cold_events": sum(1 for p in pre if p.cold_s),
                    "marker_after_notice_p50_s": r3(percentile([p.marker_at for p in pre], 50)),
                    "marker_after_notice_p99_s": r3(percentile([p.marker_at for p in pre], 99))})
    from_marker = [x - p.marker_at for x, p in zip(latencies, pre, strict=True)]
    results["event_from_marker_p50_s"] = r3(percentile(from_marker, 50))
    results["event_from_marker_p99_s"] = r3(percentile(from_marker, 99))
    rows.append((f"event path from the notice, {len(latencies)} preemptions over {background:,} jobs",
                 f"p50 {percentile(latencies, 50):.2f} s, p99 {percentile(latencies, 99):.2f} s, max {max(latencies):.2f} s",
                 f"{via['event']} by their event, {via['tick']} left to the tick (VM still STOPPING at the pass); "
                 f"marker p50 {percentile([p.marker_at for p in pre], 50):.2f} s after the notice"))
    # The same preemptions if the guest had powered off before its marker landed (the VM down
    # when the pass lists it): what the event path costs when it does not lose that race.
    down = [replace(p, off_at=p.marker_at) for p in pre]
    if_down, via_down, _ = event_from_notice(fleet, spare, down, offsets, scale, seed, run.workers)
    results.update({"event_from_notice_if_down_p50_s": r3(percentile(if_down, 50)),
                    "event_from_notice_if_down_p99_s": r3(percentile(if_down, 99)),
                    "event_from_notice_if_down_max_s": r3(max(if_down))})
    rows.append(("  the same, had each VM been down when its pass listed it", f"p50 {percentile(if_down, 50):.2f} s, "
                 f"p99 {percentile(if_down, 99):.2f} s, max {max(if_down):.2f} s", f"{via_down['event']} by their event"))
    only = tick_only(pre, offsets, costs, seed)
    results["tick_only_p50_s"], results["tick_only_p99_s"] = r3(percentile(only, 50)), r3(percentile(only, 99))
    rows.append(("  tick only (no event function), same preemptions", f"p50 {percentile(only, 50):.2f} s, "
                 f"p99 {percentile(only, 99):.2f} s", f"the next minute's tick after the VM is down, then its insert"))
    for wait_s, key, label in ((0.0, "poll_15s", "relaunch at once (as SkyPilot)"),
                               (POLL_RELAUNCH_WAIT_S, "poll_15s_wait60", "60 s wait before relaunch")):
        polled, asked, polled_s = polling_baseline(fleet, subjects, pre, wait_s, seed)
        results[f"{key}_p50_s"], results[f"{key}_p99_s"] = r3(percentile(polled, 50)), r3(percentile(polled, 99))
        results[f"{key}_max_s"] = r3(max(polled))
        # Its cost: each job's controller lists its cluster every poll, watched or not.
        results[f"{key}_list_requests_per_job_minute"] = round(asked["compute.instances.list"] / (polled_s / 60), 2)
        rows.append((f"  polling baseline: 15 s, one job a poll, {label}", f"p50 {percentile(polled, 50):.2f} s, "
                     f"p99 {percentile(polled, 99):.2f} s", "simulated clock, same fakes, same preemptions"))
    results["poll_15s_note"] = (
        "poll_15s: the polling baseline relaunching at once, as SkyPilot recovers (its RETRY_INIT_GAP_SECONDS is "
        f"the backoff after a failed launch); poll_15s_wait60: the variant waiting {POLL_RELAUNCH_WAIT_S:g} s before "
        "each relaunch.")
    results["rows"] = rows
    return results


def mass_recovery_scenario(run: Any) -> dict[str, Any]:
    """``run.recovery`` VMs preempted at once (``mass_recovery``), with issue 40's targets at 1,000."""
    recovery = mass_recovery(run.recovery, run.workers, run.scale, run.seed)
    key = "mass_recovery_1k" if run.recovery == 1000 else f"mass_recovery_{run.recovery}"
    results: dict[str, Any] = {f"{key}_s": r3(recovery["seconds"])}
    if run.recovery == 1000:
        results[f"{key}_s_target"] = target(results[f"{key}_s"], at_most=180)
    results.update({f"{key}_p50_s": r3(recovery["p50_s"]), f"{key}_requests": recovery["requests"],
                    f"{key}_refusals_403": recovery["refusals"]})
    if run.recovery == 1000:
        results[f"{key}_refusals_403_target"] = target(recovery["refusals"], equals=0)
    results.update({f"{key}_requests_by_kind": recovery["by_kind"], f"{key}_passes": recovery["passes"]})
    results["rows"] = [(f"mass recovery, {recovery['jobs']:,} preempted at once", f"{recovery['seconds']:.2f} s",
                        f"from the preemption to the last insert received (p50 {recovery['p50_s']:.1f} s); "
                        f"{recovery['requests']:,} HTTP requests, {recovery['refusals']} refused (403/429); "
                        f"{recovery['passes']}")]
    return results


def calibration(run: Any) -> dict[str, Any]:
    """bench/local.py's scenarios over ``run.local`` jobs on the local cloud, and the same on the fakes."""
    from bench import local

    events = min(run.events, 50)
    logging.disable(logging.WARNING)  # the controller's own lines: thousands of them
    try:
        measured = local.run(run.local, run.workers, events, run.scale)
    finally:
        logging.disable(logging.NOTSET)
    fakes_ = calibration_on_fakes(run.local, run.workers, events, run.scale, run.seed)
    lat = measured["event_latencies_s"]
    pairs = {"tick": (fakes_["tick_s"], measured["tick_s"]),
             "mass_recovery": (fakes_["mass_recovery_s"], measured["mass_recovery_s"]),
             "event_p50": (fakes_["event_p50_s"], percentile(lat, 50))}
    found: dict[str, Any] = {"jobs": run.local, "mass_recovery_jobs": measured["mass_recovery_jobs"]}
    rows = []
    for name, (f, loc) in pairs.items():
        ratio = f / loc if loc and not math.isinf(f) else None
        found[name] = {"fakes": r3(f), "local": r3(loc), "ratio": None if ratio is None else round(ratio, 3),
                       "within_25pct": ratio is not None and 0.75 <= ratio <= 1.25}
        rows.append((f"calibration, {run.local:,} jobs: {name}", f"fakes {f:.2f} s, local {loc:.2f} s",
                     f"ratio {ratio:.2f}" if ratio else "no ratio"))
    found["local_rate_refusals_403"] = measured.get("rate_refusals")
    found["local_tick_function_cpu_s"] = r3(measured.get("tick_cpu_s", math.nan))
    found["notes"] = (
        "Same scenarios, same job count, same figures (localcloud.realism.COSTS). The local cloud's servers (its "
        "Python GCS proxy in front of fake-gcs-server, its Python Compute server) run on the same CPUs as the two "
        "function processes and this bench, where Google's run elsewhere: a scenario bound by CPU (the tick: "
        "about one request per job) is slower there by the servers' CPU, which the fakes do not charge; the "
        "fakes charge the client's CPU per request (COSTS.client_cpu_s, measured on the deployed function). "
        "local_tick_function_cpu_s is the tick function's own CPU during the local tick.")
    return {"calibration": found, f"local_tick_{run.local}_s": r3(measured["tick_s"]),
            f"local_mass_recovery_{measured['mass_recovery_jobs']}_s": r3(measured["mass_recovery_s"]),
            "local_event_p50_s": r3(percentile(lat, 50)), "local_event_p99_s": r3(percentile(lat, 99)), "rows": rows}


@dataclass(frozen=True)
class Scenario:
    """A part of ``make bench``: ``measure(run)`` returns its keys (and, under ``rows``, lines for the
    table); a ``"module:function"`` is imported when it runs."""

    name: str
    measure: Any
    about: str

    def __call__(self, run: Any) -> dict[str, Any]:
        measure = self.measure
        if isinstance(measure, str):
            module, _, function = measure.partition(":")
            measure = getattr(importlib.import_module(module), function)
        return measure(run)


# Every scenario of make bench, in the order it runs them. To add one: a function taking the run's
# options (``run``: seed, scale, quick, and the options below) and returning its keys, and a line here.
SCENARIOS: list[Scenario] = [
    Scenario("fakes", fakes, "steady ticks, the event path, the tick alone, the polling baseline (costly fakes)"),
    Scenario("mass_recovery", mass_recovery_scenario, "1,000 VMs preempted at once (costly fakes)"),
    Scenario("calibration", calibration, "three of those scenarios on the local cloud beside the fakes"),
    Scenario("deployed", "bench.deployed:scenario", "the function as deployed at a third of a vCPU (bench/deployed.py)"),
    Scenario("hardpreempt", "bench.hardpreempt:scenario", "hard losses per cause on the local cloud"),
    Scenario("notice", "bench.notice:scenario", "a preemption notice to the standby's insert on the local cloud"),
    Scenario("zerogap", "bench.zerogap:scenario", "zero-gap recovery's downtime, modelled"),
    Scenario("overlap", "bench.overlap:scenario", "ticks that outlive their period: passes over every job that overlap"),
    Scenario("shards", "bench.shards:scenario", "100,000 jobs over K shards: the slowest shard's pass at a third of a vCPU"),
    Scenario("listing", "bench.listing:scenario", "one 500-VM aggregatedList page: bytes and parse CPU, scripts inlined or not"),
]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def r3(x: float) -> float | None:
    return None if x is None or math.isinf(x) else round(x, 3)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=[s.name for s in SCENARIOS], metavar="SCENARIO",
                        help="these scenarios alone, into bench/runs/ (never results.json): "
                             + ", ".join(s.name for s in SCENARIOS))
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000], help="fakes: the steady ticks' fleets")
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--recovery", type=int, default=1000, help="mass_recovery: jobs preempted at once")
    parser.add_argument("--events", type=int, default=200, help="fakes: preemptions on the event path")
    parser.add_argument("--local", type=int, default=1430, metavar="N", help="calibration: jobs on the local cloud")
    parser.add_argument("--deployed", type=int, default=10000, metavar="N", help="deployed: jobs")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every latency and duration (0.01: a smoke run)")
    parser.add_argument("--seed", type=int, default=1, help="every scenario's draws")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, nothing written: a smoke run")
    parser.add_argument("--out", type=Path, help="where the run goes (default: bench/results.json for make bench, "
                                                 "bench/runs/<scenarios>-<UTC>.json with --only)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.quick:
        args.recovery, args.events = min(args.recovery, 20), min(args.events, 10)
        args.local, args.deployed = min(args.local, 10), min(args.deployed, 20)
        if args.scale == 1.0:
            args.scale = 0.02
    chosen = [s for s in SCENARIOS if args.only is None or s.name in args.only]
    head = provenance(seeds={s.name: args.seed for s in chosen}, scale=args.scale)
    found: dict[str, Any] = {}
    walls: dict[str, Any] = {}
    rows: list[tuple[str, str, str]] = []
    started = time.perf_counter()
    for scenario in chosen:
        begun, load_before = time.perf_counter(), load()
        try:
            keys = scenario(args)
        except BaseException as e:
            walls[scenario.name] = {"wall_s": round(time.perf_counter() - begun, 1), "failed": f"{type(e).__name__}: {e}"}
            if not args.quick:  # what was measured stays, in a file of its own; results.json is left as it was
                record = {**head, "finished_at": now(), "incomplete": True, "scenarios": walls, **found}
                print(f"{scenario.name} failed; the run so far: {write(run_file('incomplete', head['started_at']), record)}")
            raise
        rows += keys.pop("rows", [])
        if clash := sorted(found.keys() & keys.keys()):
            raise RuntimeError(f"scenario {scenario.name} writes keys another scenario wrote: {clash}")
        found.update(keys)
        walls[scenario.name] = {"wall_s": round(time.perf_counter() - begun, 1),
                                "load_avg_1m": [load_before, load()], "about": scenario.about}
    results = {**head, "finished_at": now(), "scenarios": walls, "targets": targets(found), **found,
               "bench_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
               "bench_wall_s": round(time.perf_counter() - started, 1)}
    _table(rows, results, args)
    if args.quick:
        return 0
    name = "-".join(args.only) if args.only else None
    out = args.out or (run_file(name, head["started_at"]) if name else RESULTS)
    if name and out.resolve() == RESULTS.resolve():
        raise SystemExit(f"{RESULTS} is written by make bench alone (every scenario); --only goes to bench/runs/")
    print(f"written: {write(out, results)}")
    return 0


def _table(rows: list[tuple[str, str, str]], results: dict[str, Any], args: argparse.Namespace) -> None:
    machine = results["machine"]
    print(f"respawn bench: commit {results['commit']}{' (dirty)' if results['dirty'] else ''}; {machine['arch']}, "
          f"{machine['python']}, {machine['cpus']} CPUs; {args.workers} workers; scale {args.scale:g}")
    width = max((len(r[0]) for r in rows), default=0)
    for scenario, figure, note in rows:
        print(f"  {scenario:<{width}}  {figure:<36} {note}")
    for name, wall in results["scenarios"].items():
        print(f"  {name}: {wall['wall_s']} s (load {wall['load_avg_1m']})")
    print(f"  targets met: {', '.join(results['targets']['met']) or 'none'}; "
          f"missed: {', '.join(results['targets']['missed']) or 'none'}")
    print(f"  bench wall time {results['bench_wall_s']} s")


if __name__ == "__main__":
    sys.exit(main())
