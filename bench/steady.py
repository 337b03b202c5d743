"""A job's status at its steady size, made by the real controller: what a fleet that has lived holds.

A status grows with its job's life up to its bounds (``state.HISTORY_LIMIT`` events in its
history, ``runs.RUNS_KEPT`` summaries of past runs), and a fleet built from fresh specs has statuses
a few events long: they parse, move and stay in memory at a fraction of what a fleet that has run
for weeks costs. ``past`` gives the status a job has once ``runs`` runs of it are over, each made
by the real observer, planner and executor (over the in-memory fakes, on a fake clock that ends
before ``until``): its spec written (again), launched, RUNNING; its trainer's heartbeats (the step,
its last save's times), numbered checkpoints (``ckpt-<step>.pt`` under the spec's
``checkpoint.uri``), one to three preemptions with their markers and the relaunch that resumes from
the newest checkpoint; its exit 0. Nothing is written into it by hand.

Written into a bucket before the fleet's specs, it is the run before the one the bench's function
then begins: the function's own pass sees a new spec over a finished run (``transitions.new_run``),
sums that run up into the past runs (the oldest dropped past ``RUNS_KEPT``), keeps the history, and
numbers its attempts past the old ones, as for a job resubmitted after twenty runs. ``for_job``
renames the one status made for ``TEMPLATE`` (its instance names, events and summaries name it)
for each job of a fleet, so a fleet of 10,000 costs one job's past.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta
from typing import Any

from bench.records import Records
from controller.adapters.memory import MemoryCompute, MemoryStore
from controller.core import names, runs
from controller.core.clock import FakeClock
from controller.core.launch import LaunchContext
from controller.core.policy import ControllerPolicy
from controller.core.state import JobStatus, Phase
from controller.service.engine import Engine
from controller.service.executor import Executor
from controller.service.observe import Observer

TEMPLATE = "steady-template"
RUNS = runs.RUNS_KEPT + 1  # past runs kept whole, and the one the bench's function archives


class _Job(Records):
    """One job's bucket and VMs in the memory fakes, and what its VM agent writes."""

    def __init__(self, bucket: str, project: str, spec: str, start: datetime) -> None:
        self.clock = FakeClock(start)
        self.store, self.compute = MemoryStore(self.clock), MemoryCompute(self.clock)
        self.bucket, self.jobs, self.spec = bucket, [TEMPLATE], spec
        policy = ControllerPolicy(default_project=project,
                                  trainer_service_account=f"respawn-trainer@{project}.iam.gserviceaccount.com")
        observer = Observer(self.store, self.compute, bucket, policy, workers=1)
        self.engine = Engine(observer, Executor(self.store, self.compute, bucket),
                             LaunchContext(bucket, project, "#!/bin/bash\n", "#!/bin/bash\n"), self.clock, workers=1)
        checkpoint = (json.loads(spec).get("checkpoint") or {}).get("uri", "")
        self.ckpt_bucket, _, self.ckpt_prefix = checkpoint.removeprefix("gs://").partition("/")

    def passes(self, until: Phase, most: int = 6) -> JobStatus:
        """Passes a minute apart (the tick's period) until the job is in phase ``until``."""
        for _ in range(most):
            self.engine.reconcile(TEMPLATE)
            if (st := self.status(TEMPLATE)).phase == until:
                return st
            self.clock.advance(timedelta(minutes=1))
        raise RuntimeError(f"{TEMPLATE} did not reach {until} in {most} passes: {st.phase} ({st.message})")

    def trains(self, hours: float, step: int, rng: random.Random, started: datetime) -> int:
        """``hours`` of training as its agent reports it: a heartbeat and a pass every hour, a checkpoint
        every other; returns the step reached."""
        for hour in range(int(hours)):
            self.clock.advance(timedelta(hours=1))
            step += rng.randint(1800, 2200)
            if hour % 2:
                key = f"{self.ckpt_prefix.rstrip('/')}/ckpt-{step:08d}.pt" if self.ckpt_prefix else f"ckpt-{step:08d}.pt"
                self.store.put(self.ckpt_bucket, key, b"w")
            self.record(TEMPLATE, names.heartbeat_key(TEMPLATE), {
                "trainer_started": f"{started:%Y-%m-%dT%H:%M:%S}Z", "step": step,
                "save_s": round(rng.uniform(8, 30), 2), "upload_s": round(rng.uniform(20, 90), 2), "saved_step": step})
            self.engine.reconcile(TEMPLATE)
        return step

    def run(self, rng: random.Random, step: int) -> int:
        """One run: the spec (again), its launch, 1 to 3 preemptions each resumed, its exit 0."""
        self.store.put(self.bucket, names.spec_key(TEMPLATE), self.spec)
        self.passes(Phase.RUNNING)
        for _ in range(rng.randint(1, 3)):
            step = self.trains(rng.uniform(3, 9), step, rng, self.clock.now())
            st = self.status(TEMPLATE)
            self.compute.preempt(st.instances[0])
            self.record(TEMPLATE, names.marker_key(TEMPLATE), {"reason": "preempted", "saved": True}, st)
            self.clock.advance(timedelta(seconds=40))
            self.passes(Phase.RUNNING)
        step = self.trains(rng.uniform(3, 9), step, rng, self.clock.now())
        self.record(TEMPLATE, names.exit_key(TEMPLATE), {"exit_code": 0})
        self.passes(Phase.SUCCEEDED)
        self.clock.advance(timedelta(hours=rng.uniform(1, 12)))  # until the job is submitted again
        return step


def past(bucket: str, project: str, spec: str, until: datetime, count: int = RUNS, seed: int = 1) -> bytes:
    """``TEMPLATE``'s status.json after ``count`` runs, each ended before ``until``: SUCCEEDED."""
    job = _Job(bucket, project, spec, until - timedelta(days=3 * count))
    rng, step = random.Random(seed), 0
    for _ in range(count):
        step = job.run(rng, step)
    if job.clock.now() >= until:
        raise RuntimeError(f"the past ran past {until:%Y-%m-%d %H:%M}: make its days fewer")
    return job.store.read(bucket, names.status_key(TEMPLATE)).data


def for_job(template: bytes, job: str) -> bytes:
    """The template's status as ``job``'s (every name it holds made from the job's name)."""
    return template.replace(TEMPLATE.encode(), job.encode())


class Sizes:
    """What a fleet's statuses hold, added one stored status.json at a time: its history events, its
    past runs and its bytes (min, median, max). Counted from the object as stored, whatever the
    status model reads of it."""

    def __init__(self) -> None:
        self.values: dict[str, list[int]] = {"history_events": [], "run_summaries": [], "bytes": []}

    def add(self, text: str) -> None:
        st = json.loads(text)
        self.values["history_events"].append(len(st.get("history") or ()))
        self.values["run_summaries"].append(len(st.get("runs") or ()))
        self.values["bytes"].append(len(text.encode()))

    def figures(self) -> dict[str, Any]:
        def spread(values: list[int]) -> dict[str, int]:
            ordered = sorted(values)
            return {"min": ordered[0], "median": ordered[len(ordered) // 2], "max": ordered[-1]} if ordered else {}

        return {"statuses": len(self.values["bytes"]), **{k: spread(v) for k, v in self.values.items()}}
