"""Chaos: seeded randomized runs of the real controller over the in-memory fakes.

Each run builds a small world (1-4 jobs, single VMs and gangs, VMs that are not the
controller's), then takes 40-80 random steps: passes of the real observer + planner +
executor (ticks, events for one job, duplicated, retried and *late* ones that act on
an observation taken several steps earlier), API faults injected by proxies around the
store and Compute (transient errors before a call, "timeouts" after it took effect,
crashes at the k-th mutating call of a pass), capacity and quota trouble, unreachable
zones, odd instance statuses, pending inserts and late stockouts, and the simulated VMs
and people: trainers that heartbeat, checkpoint (sometimes half), exit 0 or not, crash
or hang; preemptions with or without a marker; maintenance, host errors, stops,
vanished VMs; cancel, resubmit and deleted specs; time passing.

A share of the jobs run on Cloud TPU nodes (``tpu:`` specs, sometimes ``queued``, Spot or
``[spot, standard]``) over the fake TPU service, which has its own trouble: preemption
(PREEMPTED), TERMINATED by maintenance, health UNHEALTHY_MAINTENANCE that Google resolves
or not, TIMEOUT / UNHEALTHY_TENSORFLOW (a hung runtime), states and healths this code does
not know, stockouts, quota, held create operations, failing list/create/delete calls, a
project whose TPU list is refused, unreachable zones and nodes that are not the
controller's. Worker 0 of a slice heartbeats and writes the exit record under the node's
name; no worker powers its host off.

Issue 22's trouble: provisioning lists (``[spot, standard]``, ``[spot, standard, flex-start]``,
``[spot, flex-start]``) against Spot running short in every zone and coming back, so jobs step
down and, after ``fallback.step_up_after``, back up; TPU quota a few nodes deep per zone and model
with deletes that take their time (a DELETING node holds its quota); job folders deleted whole
beside a TPU node; webhooks (the controller's and jobs' own) that fail, answer late or never.
Three more invariants: no TPU node left without a job (``orphan_tpu``), no step-down caused by
the job's own node (``own_step_down``), no pass slower than its budget because of a notice
(``slow_pass``, measured with ``time.monotonic``).

Issue 34's trouble: preemption notices (the agent's notice record, token-signed, its event lost,
duplicated or late) followed a few steps later by the preemption (graceful, hard, or Compute's
soft-off seen first: STOPPING with its preemption recorded), or by nothing at all; standbys held at
the starting line, whose trainers start only once the go is in their metadata; ready records. Two
more invariants: never two trainers of one job past the line at once (``two_trainers``), never a go
from older than the newest complete checkpoint at that moment (``stale_start``).

Issue 38's: a share of the TPU jobs run on TPU slices in Compute Engine (``tpu.machine_type``: one
instance, or a MIG of hosts; Spot, standard, a list to step down, Flex-start waiting for capacity) over
the fake slices gateway (``MemorySlices``): a host preempted, in maintenance, in error, stopped or
crashed (the slice TERMINATED with Compute's cause), a host REPAIRING, STOPPING or in a status this code
does not know, the slice deleted by someone else, stockouts, quota limits with slow deletes, held
creates, failing calls and lists, unreachable zones, slices that are not the controller's; specs moved
between the two TPU APIs. The orphan invariant covers slices (found through
respawn/tpu-slice-zones.json once a job folder is gone), and no TPU node is created where that record
(or respawn/tpu-zones.json) does not name its zone.

Every step is followed by the invariant checks; the end of a run lets the world settle
without faults and checks that every job ended or runs, and nothing was leaked.
The controller's actions are deterministic per seed (``random.Random``, a fake clock, passes on
one thread with ``--workers 1``); only notices go out on the notifier's threads, in real time,
so what a slow webhook answers, and when, is kept apart from the stats (``Run.timing``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import random
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from controller.core import audit, errors, names, notify
from controller.service import observe as observe_module
from controller.service import tpuzones
from controller.adapters.memory import (MemoryAdvisor, MemoryAuditLog, MemoryCompute, MemoryPublisher, MemorySlices,
                                       MemoryStore, MemoryTpu, MemoryWebhook)
from controller.core.clock import FakeClock
from controller.service.engine import Engine, Summary
from controller.service.executor import Executor
from controller.core.launch import LaunchContext
from controller.service.notifier import Notifier, Sends
from controller.service.observe import CHUNK, Observer
from controller.core.policy import ControllerPolicy
from controller.core.ports import (QUEUED_AS_NODE, Instance, InstanceStatus, NodeHealth, NodeState, QueuedState,
                              StopReason, TpuNode, TpuRequest)
from controller.core.spec import SpecError
from controller.core.state import JobStatus, Phase
from controller.core.sweep import SweepRecord
from controller.core.world import SLOT_HOLDER, World, listing_metadata

BUCKET = "respawn-chaos"
PROJECT = "chaos-proj"
CKPT_BUCKET = "ckpts"
NOTIFY_TOPIC = f"projects/{PROJECT}/topics/respawn-events"
JOB_TOPIC = f"projects/{PROJECT}/topics/team-alerts"  # a job's own topic (spec ``notify.topic``)
WEBHOOK = "https://hooks.slack.com/services/T000/B000/controller"  # the controller's (policy) webhook
# The sim's RESPAWN_NOTIFY_WAIT (deployed: 10 s): what a pass may wait, at its end, for its sends.
NOTIFY_WAIT = 0.02
# How this run's webhooks answer: at once; failing now and then; slowly (each post answered
# SLOW_DELAY s after it began, always past NOTIFY_WAIT: still under way when the pass ends); never
# (the client gives up after DEAD_TIMEOUT s). Real seconds: the sends run on the notifier's threads.
WEBHOOK_MODES = (("fast", 6), ("failing", 2), ("slow", 1), ("dead", 1))
SLOW_DELAY = 0.1
DEAD_TIMEOUT = 1.0
# "slow_pass": a pass may spend at most NOTIFY_WAIT + NOTICE_SLACK s of its own on notices (its
# sends' finish, and any send made on its own thread), and its whole wall time stays under
# NOTIFY_WAIT + PASS_SLACK. Both margins are generous (thread scheduling, a loaded machine: an
# in-memory pass takes milliseconds), and both are far below what one notice sent on the pass's
# thread to a dead webhook costs (DEAD_TIMEOUT, per notice).
NOTICE_SLACK = 0.5
PASS_SLACK = 5.0
# "orphan_tpu": full passes that could list a spec-less, status-less job's TPU node's zone (no
# injected fault, no failed TPU call, the zone and project answering) before it must be deleted.
ORPHAN_PASSES = 2
ZONES = ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f")
# Zones TPU jobs ask for; us-central1-a is a VM zone too, so a spec moved between VMs and a TPU
# may keep its zone (an attempt of one kind must never be created again as the other).
TPU_ZONES = ("us-central2-b", "us-east5-a", "europe-west4-a", "us-central1-a")
TPU_TYPES = ("v4-8", "v4-16", "v5litepod-8", "v5litepod-16", "v6e-4")
TPU_SHARE = 0.3  # of the generated jobs (and of a resubmit that changes the kind)
# Issue 38: TPU slices in Compute Engine (``tpu.machine_type``), a share of the TPU jobs: machine type
# -> (the zones it is offered in here, its topologies: None or one host's own is a single instance,
# a bigger one a MIG of hosts). us-central1-a/b/c are VM zones too (a spec moved between kinds).
SLICE_SHARE = 0.4
SLICE_MACHINES: dict[str, tuple[tuple[str, ...], tuple[str | None, ...]]] = {
    "tpu7x-standard-4t": (("us-central1-c",), (None, "2x2x1", "2x2x2", "2x2x2", "2x2x4")),
    "ct6e-standard-4t": (("us-central1-b", "us-east1-d"), (None, "4x4", "4x4")),
    "ct5p-hightpu-4t": (("us-central1-a",), ("2x2x2",)),
}
# The kinds on the last line, in its order; "budgets" is reported on the line before it.
KINDS = ("duplicates", "lost", "leaked", "foreign_deletes", "restarted_finished", "stuck", "crashes",
         "notified_twice", "ledger", "orphan_tpu", "own_step_down", "slow_pass", "two_trainers", "stale_start",
         "sweep_limit")
SWEEP = "sweep0"
SWEEP_SHARE = 0.3  # of runs with two jobs or more: its jobs are the trials of one sweep
ALL_KINDS = (*KINDS, "budgets")
# Per-call error rate of a pass, drawn per pass: about a quarter of all passes meet an
# injected fault (transient error, timeout or crash); a pass that fails at its first
# listing tests little, so most passes run clean or nearly so.
FAULT_RATES = (0.0, 0.0, 0.0, 0.02, 0.05, 0.1, 0.2)
# Per-mutation rate of "timeouts": the call took effect, and the caller was told it failed.
TIMEOUT_RATES = (0.0, 0.0, 0.1, 0.3)
MUTATING = frozenset({"write", "delete", "insert", "bulk_insert", "start", "stop", "resume", "reset", "create"})
# Statuses a VM is put in "for a while", and what becomes of it afterwards.
GLITCHES = (
    (InstanceStatus.REPAIRING, "running"),  # repaired in place
    (InstanceStatus.REPAIRING, "host_error"),  # the repair failed
    (InstanceStatus.UNKNOWN, "running"),  # a value this code does not know, then RUNNING again
    (InstanceStatus.PENDING_STOP, "stopped"),  # graceful shutdown, then TERMINATED
    (InstanceStatus.DEPROVISIONING, "vanish"),  # on its way out, then gone
)
# What befalls a READY TPU node "for a while": (field, value set, fate). "running": back to
# READY / HEALTHY with its trainer still at work; "stays": never resolved (the controller's
# maintenance_timeout or idle_timeout decides).
TPU_GLITCHES = (
    ("health", "UNHEALTHY_MAINTENANCE", "running"),  # Google rescheduled it: HEALTHY again
    ("health", "UNHEALTHY_MAINTENANCE", "running"),
    ("health", "UNHEALTHY_MAINTENANCE", "terminated"),  # the maintenance ended the node
    ("health", "UNHEALTHY_MAINTENANCE", "stays"),  # never back within maintenance_timeout
    ("health", "HEALTH_FROM_THE_FUTURE", "running"),  # a health Google adds later: no hang
    ("health", "HEALTH_FROM_THE_FUTURE", "running"),
    ("state", "REPAIRING", "running"),
    ("state", "RESTARTING", "running"),
    ("state", "HIDDEN", "running"),
    ("state", "STATE_FROM_THE_FUTURE", "running"),  # a state Google adds later: waited out
    ("state", "STATE_FROM_THE_FUTURE", "terminated"),
    ("state", "STOPPING", "stopped"),
    ("state", "DELETING", "vanish"),
)
# The same for a slice in Compute Engine, as its adapter reads its hosts (``ports.SLICE_STATE``;
# health always HEALTHY): a host REPAIRING, a status this code does not know, one STOPPING, the MIG
# deleted by someone. Fates: "running", "host_error" / "stopped" (a host TERMINATED, with
# Compute's cause), "vanish".
SLICE_GLITCHES = (
    ("state", "REPAIRING", "running"),
    ("state", "REPAIRING", "host_error"),
    ("state", "STATE_FROM_THE_FUTURE", "running"),
    ("state", "STATE_FROM_THE_FUTURE", "host_error"),
    ("state", "STOPPING", "stopped"),
    ("state", "DELETING", "vanish"),
)


class InjectedCrash(BaseException):
    """The function instance died mid-pass (a BaseException: nothing in the controller catches it)."""


# -- the simulated world ----------------------------------------------------------------------


@dataclass
class JobSim:
    name: str
    doc: dict[str, Any]
    # Attempts the simulation did something to; a status counter may never exceed them.
    preempted: set[int] = field(default_factory=set)
    lost: set[int] = field(default_factory=set)  # any loss that is not the trainer's fault
    failed: set[int] = field(default_factory=set)  # non-zero exit, guest crash, hang
    finished: set[int] = field(default_factory=set)  # every node exited 0 (rank 0 wrote exit 0)
    causes: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))  # what befell each attempt
    succeeded_spec: int | None = None  # spec generation current when SUCCEEDED was written
    succeeded_note: str = ""
    spec_step: int | None = None  # the step the spec was last written at
    successes: int = 0  # SUCCEEDED status writes seen
    step: int = 0  # the trainer's last checkpoint step


@dataclass
class Trainer:
    """The command on one VM, as the VM agent runs it."""

    job: str
    attempt: int
    rank: int
    nodes: int
    name: str
    iid: str
    token: str
    state: str = "running"  # running | hung | done
    end: str = ""  # why it is done: success | failed | crashed | lost | deleted | <VM status>
    tpu: bool = False  # worker 0 of a TPU node (``workers`` hosts), which no worker powers off
    workers: int = 1
    api: str = "tpu"  # a TPU node's API: "compute" for a slice in Compute Engine
    # The insert that made its VM: a gang's nodes break together only with the nodes made beside them
    # (an attempt inserted again in another zone is another gang, whose nodes never met the first's).
    made_by: str = ""


@dataclass
class Glitch:
    name: str
    iid: str
    status: InstanceStatus
    fate: str
    until: int  # the step it ends at
    tpu: str = ""  # a TPU node's glitch: the field set ("state" or "health"), ``value`` its value
    value: str = ""
    api: str = "tpu"  # a TPU node's: the Cloud TPU API's, or a slice in Compute Engine ("compute")


@dataclass(frozen=True)
class TpuSeen:
    """A TPU node, or a queued resource still without one, as the fake holds it (read directly)."""

    inst: Instance  # as the planner reads it (``TpuNode.as_instance``)
    node: TpuNode
    request: TpuRequest | None
    held: bool  # its create operation is still running
    queued: bool  # created through a queued resource (a Flex-start slice in Compute Engine too)
    real: bool  # a node exists (not a queued resource waiting for one)
    api: str = "tpu"  # "tpu": the Cloud TPU API's node (``Run.tpu``); "compute": a slice (``Run.slices``)


@dataclass
class PassFaults:
    """The faults one pass meets: a per-call error rate and maybe a crash at its k-th mutation."""

    rate: float
    timeout: float
    crash_at: int | None
    crash_before: bool
    mutations: int = 0


@dataclass
class RunResult:
    seed: int
    violations: dict[str, str]
    stats: Counter[str]
    steps: int
    timing: Counter[str] = field(default_factory=Counter)  # wall-clock figures (not replayed exactly)


# -- proxies --------------------------------------------------------------------------------------


class FaultyPort:
    """Wraps a port (store or Compute): every public call goes through ``Run.call``."""

    def __init__(self, inner: Any, run: Run, port: str) -> None:
        self._inner = inner
        self._run = run
        self._port = port

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._run.call(self._port, name, attr, args, kwargs)

        return call


class ExecutorSpy:
    """Remembers which job the executor is acting for, so a delete can be judged against it."""

    def __init__(self, inner: Executor, run: Run) -> None:
        self._inner = inner
        self._run = run

    def apply(self, view: Any, actions: Any, now: datetime, wait_until: float | None = None, **kw: Any) -> Any:
        before, self._run.acting_job = self._run.acting_job, view.job
        try:
            return self._inner.apply(view, actions, now, wait_until, **kw)
        finally:
            self._run.acting_job = before

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class StaleObserver:
    """Answers a pass's first observation with one taken earlier: a late pass acting on a stale view."""

    def __init__(self, inner: Observer, world: Any) -> None:
        self._inner = inner
        self._world = world

    def parts(self, job: str | None = None) -> Any:
        if self._world is not None:
            world, self._world = self._world, None
            return iter([world]), lambda: World({})
        return self._inner.parts(job)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class TimedNotifier(Notifier):
    """The real notifier (one per function instance: what it carries outlives a pass), whose
    passes' ``Sends.finish`` is timed: the time a pass spends waiting for its notices."""

    run: Run | None = None

    def begin(self, workers: int = 1) -> Sends:
        sends = super().begin(workers)
        finish, run = sends.finish, self.run

        def timed(wait: float | None = None) -> Any:
            began = time.monotonic()
            try:
                return finish(wait)
            finally:
                if run is not None:
                    run.notice_s += time.monotonic() - began

        sends.finish = timed  # type: ignore[method-assign]
        return sends


class TimedWebhook:
    """The webhook fake as the notifier sees it: a post made on the pass's own thread (never on
    the notifier's) is time the pass spent on a notice."""

    def __init__(self, inner: MemoryWebhook, run: Run) -> None:
        self.inner = inner
        self._run = run

    def post(self, url: str, body: Any) -> None:
        run = self._run
        mine = threading.get_ident() == run.thread
        began = time.monotonic()
        try:
            self.inner.post(url, body)
        finally:
            if mine:
                run.notice_s += time.monotonic() - began


# -- one run ----------------------------------------------------------------------------------------


WORKERS = 1  # threads per pass (--workers): above 1, a seed no longer replays exactly


class Run:
    def __init__(self, seed: int, steps: int | None = None, verbose: bool = False,
                 out: Callable[[str], None] = print) -> None:
        self.seed = seed
        self.rng = random.Random(seed)  # the scenario
        self.frng = random.Random(f"faults-{seed}")  # API faults: consumed per call
        self.trng = random.Random(f"tokens-{seed}")
        self.verbose = verbose
        self.out = out
        self.clock = FakeClock()
        self.start = self.clock.now()
        self.store = MemoryStore(self.clock)
        self.compute = MemoryCompute(self.clock)
        # Compute's System Event audit log: every system event of the fake Compute lands there (and
        # entries a trainer forges), and reaches the controller as an on_audit message (lost,
        # duplicated, late or reordered: ``audit_messages``) that only wakes a pass: no entry may
        # change an outcome, only its speed.
        self.audit = MemoryAuditLog()
        self.compute.audit = self.audit
        self.audit_handed = 0  # entries of the log already turned into messages
        self.audit_queue: list[dict[str, Any]] = []  # messages on their way (delivered in any order)
        self.tpu = MemoryTpu(self.clock)
        # TPU slices in Compute Engine (issue 38), ids apart from the Cloud TPU nodes' (trainers,
        # glitches and orphans are told apart by name and id).
        self.slices = MemorySlices(self.clock)
        self.slices._ids = itertools.count(5_000_000_000_000_000_001)
        self.advisor = MemoryAdvisor(self.compute)
        self.advisor.rates.update({z: self.rng.choice([0.0, 0.05, 0.3, 0.8]) for z in ZONES})
        # Notifications: the controller's topic, sometimes its webhook too, and jobs' own (their
        # specs' ``notify``); a webhook that is fast, failing, slow or never answers (per run).
        self.webhook_mode = self.rng.choices([m for m, _ in WEBHOOK_MODES], [w for _, w in WEBHOOK_MODES])[0]
        self.policy = ControllerPolicy(default_project=PROJECT, notify_topic=NOTIFY_TOPIC,
                                       notify_webhook=WEBHOOK if self.rng.random() < 0.5 else None)
        self.publisher = MemoryPublisher([NOTIFY_TOPIC, JOB_TOPIC])
        self.webhook = MemoryWebhook()
        # A slow or dead webhook is so for a stretch of the run (an outage), from step to step.
        start = self.rng.randint(0, 30)
        self.webhook_outage = (start, start + self.rng.randint(15, 40)) if self.webhook_mode in ("slow", "dead") else (0, 0)
        self.thread = threading.get_ident()  # the passes' own thread (WORKERS 1: every job's chain runs on it)
        self.notice_s = 0.0  # seconds the current pass spent on its notices (TimedNotifier, TimedWebhook)
        self.notifier = self.new_notifier()
        self.ctx = self._launch_context()
        self.stats: Counter[str] = Counter()
        self.violations: dict[str, str] = {}
        self.jobs: dict[str, JobSim] = {}
        self.trainers: dict[tuple[str, str], Trainer] = {}
        self.glitches: list[Glitch] = []
        self.foreign: list[str] = []
        self.foreign_tpu: list[str] = []
        self.foreign_slices: list[str] = []
        self.attempt_nodes: dict[tuple[str, int], int] = {}
        self.tokens: dict[tuple[str, int], str] = {}
        # Which job the executor is acting for, per thread: a pass fanned out over threads (WORKERS)
        # acts for several jobs at once, and one shared value made a delete look like another job's.
        self._acting = threading.local()
        self.pass_faults: PassFaults | None = None
        self.faults_on = True
        self.step_no = 0
        self.n_steps = steps if steps is not None else self.rng.randint(40, 80)
        self.breaks: dict[tuple[str, int, str, str], int] = {}  # gangs whose collective will fail, at that step
        self.noticed: dict[tuple[str, str], tuple[int, str]] = {}  # (name, id) -> (step its fate comes at, the fate)
        self._status_cache: dict[tuple[str, int], JobStatus | None] = {}
        self._depth = 0
        self._last_transient = False
        self._injected = 0
        self._tpu_failed = 0  # TPU list and delete calls that failed (injected or the fake's own)
        self._last_clean = False  # the last guarded pass met no fault at all
        self.orphans: Counter[tuple[str, str, str, str]] = Counter()  # orphan TPU node -> clean full passes seen
        self.own_quota: dict[str, tuple[str, datetime, tuple[str, ...]]] = {}  # job -> its last own-caused quota error
        self.own_misses: set[tuple[str, datetime, str]] = set()  # (job, at, zone): capacity misses its own node caused
        self.written: dict[str, JobStatus] = {}  # each job's status as last written by the controller
        self.timing: Counter[str] = Counter()  # wall-clock figures: never in stats (a seed replays exactly)

    def webhook_weather(self) -> None:
        """A slow webhook answers each post SLOW_DELAY s late; a dead one never (its client gives
        up after DEAD_TIMEOUT s): during the run's outage only."""
        on = self.webhook_outage[0] <= self.step_no < self.webhook_outage[1]
        delay, timeout = {"slow": (SLOW_DELAY, None), "dead": (float("inf"), DEAD_TIMEOUT)}.get(self.webhook_mode, (0.0, None))
        was = self.webhook.delay > 0
        self.webhook.delay, self.webhook.timeout = (delay, timeout) if on else (0.0, None)
        if on != was:
            self.say(f"the webhook is {self.webhook_mode} from now on" if on else "the webhook answers at once again")

    def new_notifier(self) -> TimedNotifier:
        """A function instance's notifier: what it carries to its next pass dies with the instance."""
        notifier = TimedNotifier(self.policy, self.publisher, TimedWebhook(self.webhook, self),  # type: ignore[arg-type]
                                 wait=NOTIFY_WAIT)
        notifier.run = self
        return notifier

    def _launch_context(self) -> LaunchContext:
        kwargs: dict[str, Any] = dict(bucket=BUCKET, default_project=PROJECT,
                                      startup_script="#!/bin/bash\necho startup",
                                      shutdown_script="#!/bin/bash\necho shutdown")
        if "new_token" in {f.name for f in dataclasses.fields(LaunchContext)}:
            kwargs["new_token"] = lambda: f"tok-{self.trng.getrandbits(64):016x}"
        return LaunchContext(**kwargs)

    # -- output and verdicts -------------------------------------------------------------------
    def say(self, text: str) -> None:
        if self.verbose:
            elapsed = self.clock.now() - self.start
            self.out(f"  [{self.step_no:02d} +{_hms(elapsed)}] {'  ' * self._depth}{text}")

    def violate(self, kind: str, message: str) -> None:
        self.stats[f"violation.{kind}"] += 1
        if kind not in self.violations:
            self.violations[kind] = f"step {self.step_no}: {message}"
        if self.verbose and self.stats[f"violation.{kind}"] == 1:
            self.out(f"  !! {kind}: {message}")

    # -- the whole run ---------------------------------------------------------------------------
    def execute(self) -> RunResult:
        self.setup()
        for self.step_no in range(1, self.n_steps + 1):
            self.webhook_weather()
            self.end_glitches()
            self.end_notices()
            self.step()
            self.sync()
            self.check()
        self.step_no = self.n_steps + 1
        self.finale()
        return RunResult(self.seed, dict(self.violations), self.stats, self.n_steps, self.timing)

    def setup(self) -> None:
        rng = self.rng
        count = rng.randint(1, 4)
        job_names = [f"job{i}" for i in range(count)]
        if count > 1 and rng.random() < 0.25:
            job_names[-1] = f"{job_names[0]}-1"  # named like another job's instance
        for job in job_names:
            self.jobs[job] = JobSim(job, self.spec_doc(job, tpu=rng.random() < TPU_SHARE))
        self.sweep_limit = 0
        if count > 1 and rng.random() < SWEEP_SHARE:
            # The jobs are a sweep's trials, fewer slots than trials: at most that many may hold VMs or
            # TPU nodes at any moment, whatever the passes meet (check_sweep).
            self.sweep_limit = rng.randint(1, count - 1)
            record = SweepRecord(name=SWEEP, max_parallel=self.sweep_limit)
            self.store.write(BUCKET, names.sweep_key(SWEEP), record.model_dump_json().encode())
            for n, job in enumerate(job_names, start=1):
                self.jobs[job].doc["sweep"] = {"name": SWEEP, "trial": n, "params": {"seed": str(n)}}
            self.stats["sweep.runs"] += 1
        if rng.random() < 0.3:
            self.compute.boot_status = InstanceStatus.STAGING  # VMs take a while to boot
            self.stats["env.slow_boot"] += 1
        for i in range(rng.randint(1, 3)):
            zone = rng.choice(ZONES)
            job = rng.choice(job_names)
            labels = rng.choice([
                {},
                {"team": "research"},
                {names.JOB_LABEL: job, names.ATTEMPT_LABEL: "1"},
                {names.MANAGED_LABEL: "false", names.JOB_LABEL: job, names.ATTEMPT_LABEL: "2"},
                {names.MANAGED_LABEL: "TRUE", names.JOB_LABEL: job, names.ATTEMPT_LABEL: "1"},
            ])
            name = rng.choice([f"notebook-{i}", f"{job}-dev-{i}", f"{job}-x{i}"])
            self.compute.add_foreign(PROJECT, zone, name, labels, age=timedelta(days=3))
            self.foreign.append(name)
        for fake, api, foreign in ((self.tpu, "tpu", self.foreign_tpu), (self.slices, "compute", self.foreign_slices)):
            self.tpu_trouble(fake, api, foreign, [j for j in job_names if _api(self.jobs[j].doc) == api])
        self.stats[f"notify.webhook_{self.webhook_mode}"] += 1
        shown = ", ".join(f"{j} ({_kind(s.doc)})" for j, s in self.jobs.items())
        self.say(f"setup: jobs {shown}; foreign VMs {', '.join(self.foreign)}"
                 f"{'; foreign TPU nodes ' + ', '.join(self.foreign_tpu) if self.foreign_tpu else ''}"
                 f"{'; foreign TPU slices ' + ', '.join(self.foreign_slices) if self.foreign_slices else ''}")
        for job in job_names:
            self.submit(job, self.jobs[job].doc)

    def tpu_trouble(self, fake: MemoryTpu, api: str, foreign: list[str], tpu_jobs: list[str]) -> None:
        """One TPU API's trouble for the run's jobs on it (the Cloud TPU API's nodes, or Compute
        Engine's slices): nodes that are not the controller's, quota, slow deletes."""
        if not tpu_jobs:
            return
        rng = self.rng
        prefix = "tpu" if api == "tpu" else "slice"
        # TPU nodes that are not the controller's, in zones its TPU jobs list (look-alike labels too;
        # a slice's own label naming it, which in Compute Engine alone never makes it the controller's).
        zones = sorted({z for j in tpu_jobs for z in self.jobs[j].doc["zones"]})
        for i in range(rng.randint(1, 2)):
            job = rng.choice(tpu_jobs)
            labels = rng.choice([
                {},
                {"team": "research"},
                {names.JOB_LABEL: job, names.ATTEMPT_LABEL: "1"},
                {names.MANAGED_LABEL: "false", names.JOB_LABEL: job, names.ATTEMPT_LABEL: "2"},
                {names.MANAGED_LABEL: "TRUE", names.JOB_LABEL: job, names.ATTEMPT_LABEL: "1"},
                *([{"respawn-slice": f"{job}-1", names.JOB_LABEL: job, names.ATTEMPT_LABEL: "1"}]
                  if api == "compute" else []),
            ])
            name = rng.choice([f"tpu-notebook-{i}", f"{job}-dev-{i}", f"{job}-x{i}"])
            fake.add_foreign(PROJECT, rng.choice(zones), name, labels)
            foreign.append(name)
            self.stats[f"{prefix}.foreign"] += 1
        if rng.random() < 0.5:
            # TPU quota a few nodes deep, and deletes that take their time: a node being deleted
            # (DELETING) still holds its zone's quota, the job's own husk included.
            for zone in zones:
                for spot in (True, False):
                    if rng.random() < 0.6:
                        fake.quota_limit[(zone, spot)] = rng.choice([0, 1, 1, 2])  # 0: none of that model here
            fake.delete_seconds = rng.choice([90.0, 90.0, 300.0, 900.0, 1800.0])  # over 600: past the wait for husks
            self.stats[f"{prefix}.env_quota_limits"] += bool(fake.quota_limit)
            self.stats[f"{prefix}.env_slow_deletes"] += fake.delete_seconds > 90

    def spec_doc(self, job: str, tpu: bool = False, api: str | None = None) -> dict[str, Any]:
        """A job's spec: VMs, a Cloud TPU node (``api`` "tpu") or a TPU slice in Compute Engine
        ("compute"; None: either, by SLICE_SHARE)."""
        rng = self.rng
        if tpu and api is None:
            api = "compute" if rng.random() < SLICE_SHARE else "tpu"
        if tpu and api == "compute":
            return self.slice_doc(job)
        zones = rng.sample(TPU_ZONES if tpu else ZONES, rng.randint(1, 3))
        policy = self.policy_doc()
        extra: dict[str, Any] = {}
        if rng.random() < (0.5 if tpu else 0.35):  # step down the list when a model cannot be had, and back up
            # A VM job may end on Flex-start (one VM: PENDING until Compute finds capacity).
            lists = [["spot", "standard"]] * 3 if tpu else [["spot", "standard"], ["spot", "standard"],
                                                            ["spot", "standard", "flex-start"], ["spot", "flex-start"]]
            extra["provisioning"] = rng.choice(lists)
            policy["fallback"] = {"stockouts": rng.randint(1, 3), "wait": rng.choice(["5m", "20m"]),
                                  "step_up_after": rng.choice(["10m", "20m", "30m", "2h"])}
            if "flex-start" in extra["provisioning"]:
                policy["max_run_duration"] = "3d"
        if rng.random() < 0.35:  # the job's own destinations, beside the controller's
            own: dict[str, str] = {}
            if rng.random() < 0.7:
                own["webhook"] = f"https://hooks.slack.com/services/T000/B000/{job}"
            if not own or rng.random() < 0.4:
                own["topic"] = rng.choice([JOB_TOPIC, NOTIFY_TOPIC])  # the controller's own: told once
            extra["notify"] = own
        if tpu:
            if rng.random() < 0.3:
                extra["placement"] = "ordered"  # capacity advice does not cover TPUs
            policy["maintenance_timeout"] = rng.choice(["20m", "40m", "1h"])
            block: dict[str, Any] = {"type": rng.choice(TPU_TYPES), "runtime_version": "tpu-ubuntu2204-base"}
            if rng.random() < 0.35:
                block["queued"] = True  # a stockout waits in Google's queue
            return self.tpu_doc(job, extra, zones, block, policy)
        if rng.random() < 0.3:
            extra["placement"] = rng.choice(["ordered", "capacity"])
        if rng.random() < 0.2 and "spot" in extra.get("provisioning", ("spot",)):
            extra["preemption_notice"] = "0s"  # the soft-off is the notice
        return {
            **extra,
            "zones": zones,
            "machine_type": "g2-standard-8",
            "command": "python train.py",
            "service_account": {"email": f"trainer@{PROJECT}.iam.gserviceaccount.com"},
            "nodes": 1 if rng.random() < 0.55 or "flex-start" in extra.get("provisioning", ()) else rng.randint(2, 3),
            "checkpoint": {"uri": f"gs://{CKPT_BUCKET}/{job}/run"},
            "policy": policy,
        }

    def policy_doc(self, maintenance: bool = False) -> dict[str, Any]:
        """A job's ``policy:`` block; with ``maintenance``, a ``maintenance_timeout`` too (a TPU slice's, drawn
        among the others: a Cloud TPU node's is drawn by spec_doc, later)."""
        rng = self.rng
        policy: dict[str, Any] = {
            "max_restarts": rng.randint(2, 8),
            "max_failures": rng.randint(1, 3),
            "crash_loop_failures": rng.randint(2, 4),
            "idle_timeout": rng.choice(["10m", "15m", "20m"]),
            "startup_grace": rng.choice(["2m", "5m"]),
            "backoff": {"initial": "30s", "max": rng.choice(["1m", "2m", "5m"])},
            "zone_cooldown": rng.choice(["3m", "5m", "10m"]),
            "termination_action": rng.choice(["stop", "delete"]),
        }
        if maintenance:
            policy["maintenance_timeout"] = rng.choice(["20m", "40m", "1h"])
        if rng.random() < 0.15:
            policy["max_instance_age"] = rng.choice(["1h", "2h"])
        if rng.random() < 0.1:
            policy["max_runtime"] = rng.choice(["3h", "6h"])
        return policy

    @staticmethod
    def tpu_doc(job: str, extra: dict[str, Any], zones: list[str], block: dict[str, Any],
                policy: dict[str, Any]) -> dict[str, Any]:
        """A TPU job's spec (a Cloud TPU node's or a slice's: ``block``, its ``tpu:``)."""
        return {
            **extra,
            "zones": zones,
            "tpu": block,
            "command": "python train.py",
            "service_account": {"email": f"trainer@{PROJECT}.iam.gserviceaccount.com"},
            "checkpoint": {"uri": f"gs://{CKPT_BUCKET}/{job}/run"},
            "policy": policy,
        }

    def slice_block(self) -> tuple[dict[str, Any], list[str]]:
        """A ``tpu:`` block for a slice in Compute Engine, and zones it is offered in."""
        rng = self.rng
        machine = rng.choice(sorted(SLICE_MACHINES))
        offered, topologies = SLICE_MACHINES[machine]
        block: dict[str, Any] = {"machine_type": machine}
        if (topology := rng.choice(topologies)) is not None:
            block["topology"] = topology
        return block, rng.sample(offered, rng.randint(1, len(offered)))

    def slice_doc(self, job: str) -> dict[str, Any]:
        """A job on a TPU slice in Compute Engine (issue 38): one instance or a MIG of hosts, Spot or
        standard, a list to step down (and back up), or Flex-start waiting for capacity."""
        rng = self.rng
        block, zones = self.slice_block()
        policy = self.policy_doc(maintenance=True)
        extra: dict[str, Any] = {}
        provisioning = rng.choice([None, None, ["standard"], ["flex-start"], ["spot", "standard"], ["spot", "standard"],
                                   ["spot", "standard", "flex-start"], ["spot", "flex-start"], ["standard", "flex-start"]])
        if provisioning is not None:
            extra["provisioning"] = provisioning
        if provisioning is not None and len(provisioning) > 1:
            policy["fallback"] = {"stockouts": rng.randint(1, 3), "wait": rng.choice(["5m", "20m"]),
                                  "step_up_after": rng.choice(["10m", "20m", "30m", "2h"])}
        if "flex-start" in (provisioning or ()):
            policy["max_run_duration"] = rng.choice(["3d", "2h"])  # Compute deletes it after that (not modelled)
        if rng.random() < 0.3:
            extra["placement"] = "ordered"
        if rng.random() < 0.2:
            extra["notify"] = {"webhook": f"https://hooks.slack.com/services/T000/B000/{job}"}
        return self.tpu_doc(job, extra, zones, block, policy)

    # -- the steps -----------------------------------------------------------------------------------
    STEPS = (("tick", 12), ("event", 12), ("late", 8), ("advance", 12), ("checkpoint", 7), ("exit", 7),
             ("preempt", 6), ("platform", 2), ("glitch", 3), ("zone", 4), ("inserts", 2), ("user", 3),
             ("stale_record", 1), ("tpu_api", 2), ("shortage", 2), ("audit", 5), ("notice", 5))
    INNER = (("tick", 4), ("event", 6), ("advance", 3), ("checkpoint", 3), ("exit", 4), ("preempt", 4),
             ("platform", 1), ("glitch", 1), ("zone", 1), ("inserts", 1), ("user", 2), ("tpu_api", 1), ("audit", 2),
             ("notice", 2))

    def step(self, menu: tuple[tuple[str, int], ...] | None = None) -> None:
        menu = menu or self.STEPS
        kind = self.rng.choices([k for k, _ in menu], [w for _, w in menu])[0]
        self.stats[f"step.{kind}"] += 1
        getattr(self, f"step_{kind}")()
        self.audit_messages()

    def audit_messages(self) -> None:
        """The Logging sink's messages for the entries Compute wrote since: each lost (a quarter),
        or on its way, now and then twice; delivered later, in any order (``step_audit``)."""
        for entry in self.audit.entries[self.audit_handed:]:
            self.audit_handed += 1
            if self.frng.random() < 0.25:
                self.stats["fault.audit_lost"] += 1
                continue
            copies = 2 if self.frng.random() < 0.2 else 1
            self.stats["fault.audit_duplicated"] += copies - 1
            self.audit_queue.extend([entry] * copies)

    def step_audit(self) -> None:
        """One audit message reaches on_audit: the oldest, or (a third of the time) any other."""
        if not self.audit_queue:
            return
        at = 0 if self.rng.random() < 0.66 else self.rng.randrange(len(self.audit_queue))
        self.stats["fault.audit_reordered"] += at > 0
        entry = self.audit_queue.pop(at)
        event = audit.parse_entry(entry)
        self.stats["audit.delivered"] += 1
        if event.job is not None:  # it only wakes a pass: the cause is Compute's own record
            self.run_pass(event.job, label=f"audit {event.method.rsplit('.', 1)[-1]} {event.instance}")

    def step_tick(self) -> None:
        self.run_pass(None)

    def step_event(self) -> None:
        job = self.rng.choice(list(self.jobs))
        self.event(job, p=1.0)

    def event(self, job: str, p: float = 0.5) -> None:
        """The bucket event a VM or a user write causes: maybe lost, maybe duplicated."""
        if self.rng.random() >= p:
            return
        self.run_pass(job)
        if self.rng.random() < 0.25:
            self.stats["fault.duplicate_event"] += 1
            self.run_pass(job, label="duplicate event")

    def step_late(self) -> None:
        """Observe now; let other passes, VMs and people act; then plan and act on that stale view."""
        if self._depth:
            return self.step_tick()
        job = self.rng.choice([None, *self.jobs])
        engine, faults = self.engine(), self.new_pass_faults()
        label = f"late {'tick' if job is None else 'event ' + job}"
        world = self.guarded(label + " (observe)", faults, lambda: engine.observer.world(job))
        if world is None:
            return
        self.say(f"{label}: observed; acting later")
        self._depth += 1
        try:
            for _ in range(self.rng.randint(1, 3)):
                self.end_glitches()
                self.step(self.INNER)
                self.sync()
                self.check()
        finally:
            self._depth -= 1
        stale = Engine(StaleObserver(engine.observer, world), engine.executor, self.ctx, self.clock)
        self.stats["fault.late_pass"] += 1
        summary = self.guarded(label + " (act)", faults, lambda: stale.reconcile(job))
        self.report(label, summary)

    def step_advance(self) -> None:
        r = self.rng.random()
        if self._depth:  # a late pass is late by seconds to a minute or two, not by an hour
            seconds = self.rng.randint(1, 60)
        elif r < 0.6:
            seconds = self.rng.randint(5, 120)
        elif r < 0.9:
            seconds = self.rng.randint(120, 600)
        else:
            seconds = self.rng.randint(600, 2400)
        self.advance(timedelta(seconds=seconds))

    def advance(self, delta: timedelta) -> None:
        self.clock.advance(delta)
        self.say(f"time +{_hms(delta)}")
        self.beat()

    def step_checkpoint(self) -> None:
        # Only a trainer whose VM is still there writes (one deleted since the last sync is gone).
        running = [t for t in self.trainers.values() if t.state == "running" and t.rank == 0
                   and self.instance(t) is not None]
        if running:
            t = self.rng.choice(running)
            self.checkpoint(t.job, complete=self.rng.random() > 0.15)

    def checkpoint(self, job: str, complete: bool) -> None:
        js = self.jobs[job]
        js.step += self.rng.randint(10, 100)
        prefix = f"{job}/run/{js.step}"
        self.store.write(CKPT_BUCKET, f"{prefix}/state.bin", b"w" * 16)
        if complete:
            self.store.write(CKPT_BUCKET, f"{prefix}/commit_success.txt", b"")
        self.stats["vm.checkpoint" if complete else "vm.checkpoint_half"] += 1
        self.say(f"{job}: checkpoint step {js.step}{'' if complete else ' (half written: cut off)'}")

    def step_exit(self) -> None:
        groups = self.running_groups()
        if not groups:
            return
        (job, attempt, _, _), group = self.rng.choice(sorted(groups.items()))
        js = self.jobs[job]
        outcome = self.rng.choices(["success", "nonzero", "crash", "hang"], [6, 2, 1, 1])[0]
        if group[0].tpu:
            return self.tpu_outcome(group[0], outcome)
        self.stats[f"vm.{outcome}"] += 1
        if outcome == "success":
            order = self.rng.sample(group, len(group))
            js.finished.add(attempt)
            self.say(f"{job}: attempt {attempt} finishes: {', '.join(t.name for t in order)} exit 0 in that order")
            for i, t in enumerate(order):
                self.trainer_exit(t, 0)
                if i < len(order) - 1 and self.rng.random() < 0.3:
                    self.stats["fault.pass_between_node_exits"] += 1
                    self.run_pass(self.rng.choice([None, job]), label="pass between node exits")
            self.event(job)
        elif outcome == "nonzero":
            t = self.rng.choice(group)
            js.failed.add(attempt)
            code = self.rng.choice([1, 2, 137, 255])
            js.causes[attempt].append(f"{t.name} exit {code}")
            self.say(f"{t.name}: command exits {code}")
            self.trainer_exit(t, code)
            if t.rank and self.rng.random() < 0.4:
                # Rank 0 exits 0 all the same, after the worker's failure landed: the gang failed.
                self.stats["fault.rank0_exit0_after_worker_failure"] += 1
                if self.rng.random() < 0.3:
                    self.run_pass(self.rng.choice([None, job]), label="pass between the worker's failure and rank 0's exit 0")
                self.advance(timedelta(seconds=self.rng.randint(0, 30)))
                if group[0].state == "running":
                    self.say(f"{group[0].name}: command exits 0 after {t.name} failed")
                    self.trainer_exit(group[0], 0)
            self.event(job)
        elif outcome == "crash":
            t = self.rng.choice(group)
            js.failed.add(attempt)
            js.causes[attempt].append(f"{t.name} guest crash")
            self.say(f"{t.name}: guest crashes (no exit record)")
            t.state, t.end = "done", "crashed"
            inst = self.instance(t)
            self.compute.terminate(t.name, StopReason.CRASHED)
            if inst is not None and self.rng.random() < 0.3:
                # Its trainer wrote a System Event entry of its own first (it may write logs): "preempted",
                # to pass its crash off as the platform's. It wakes a pass; it must never be counted.
                self.stats["fault.forged_audit_entry"] += 1
                self.say(f"{t.name}: its trainer forges a 'preempted' System Event entry")
                self.audit.write(audit.system_event_entry(inst.project, inst.zone, inst.name, inst.id,
                                                          "compute.instances.preempted", self.clock.now()))
        else:
            js.failed.add(attempt)
            js.causes[attempt].append("hang")
            self.say(f"{job}: attempt {attempt} hangs (no more heartbeats)")
            for t in group:
                t.state = "hung"

    def tpu_outcome(self, t: Trainer, outcome: str) -> None:
        """What the command on a TPU slice does. Worker 0 owns the exit record; another worker
        writes only a failure, to its own record; no worker powers off. A host
        that goes down breaks the slice (TIMEOUT); a broken runtime is UNHEALTHY_TENSORFLOW."""
        js = self.jobs[t.job]
        self.stats[f"{'slice' if t.api == 'compute' else 'tpu'}.exit_{outcome}"] += 1
        if outcome == "success":
            js.finished.add(t.attempt)
            self.say(f"{t.name}: every worker of {t.workers} exits 0")
            self.trainer_exit(t, 0)
            self.event(t.job)
            return
        js.failed.add(t.attempt)
        if outcome == "nonzero":
            worker = self.rng.randrange(t.workers)
            code = self.rng.choice([1, 2, 137, 255])
            js.causes[t.attempt].append(f"{t.name} worker {worker} exit {code}")
            self.say(f"{t.name}: worker {worker}'s command exits {code}")
            if worker:
                self.stats["tpu.worker_exit_record"] += 1
                self.record(names.node_exit_key(t.job, worker), t, exit_code=code, node=worker)
            if worker == 0 or self.rng.random() < 0.6:
                self.trainer_exit(t, code if worker == 0 else 134)  # worker 0's collective broke
            else:
                t.state, t.end = "hung", "failed"  # worker 0 waits on the collective, silent
            self.event(t.job)
            return
        t.state = "hung"
        if t.api == "compute":  # a slice's hosts: no health; a host's guest crashes, or the trainer hangs
            if outcome == "crash" or self.rng.random() < 0.5:
                self.stats["slice.host_crash"] += 1
                js.causes[t.attempt].append(f"{t.name} a host's guest crashes")
                self.say(f"{t.name}: a host's guest crashes (TERMINATED, guestTerminate)")
                t.state, t.end = "done", "crashed"
                self.slices.lose(t.name, StopReason.CRASHED)
            else:
                js.causes[t.attempt].append("hang")
                self.say(f"{t.name}: hangs (no more heartbeats)")
            return
        if outcome == "crash" or self.rng.random() < 0.5:
            health = NodeHealth.TIMEOUT if outcome == "crash" else NodeHealth.UNHEALTHY_TENSORFLOW
            self.stats[f"tpu.health_{health.value.lower()}"] += 1
            js.causes[t.attempt].append(f"{t.name} health {health}")
            self.say(f"{t.name}: {'a host goes down' if outcome == 'crash' else 'the runtime breaks'}: health {health}")
            self.tpu.set_health(t.name, health)
        else:
            js.causes[t.attempt].append("hang")
            self.say(f"{t.name}: hangs (no more heartbeats, health HEALTHY)")

    def trainer_exit(self, t: Trainer, code: int) -> None:
        """The VM agent: rank 0 (or any non-zero exit) writes its exit record (rank 0's is the
        job's, a worker's its own), then powers off (a TPU node's workers never do: the
        controller deletes the node)."""
        if t.rank == 0 or code != 0:
            self.record(names.exit_key(t.job) if t.rank == 0 else names.node_exit_key(t.job, t.rank), t, exit_code=code)
        t.state, t.end = "done", "success" if code == 0 else "failed"
        if not t.tpu and self.instance(t) is not None:
            self.compute.terminate(t.name, StopReason.CRASHED)  # guest power-off: guestTerminate

    def victim(self) -> tuple[Instance, Trainer | None] | None:
        """A live VM or READY TPU node for something to befall, and its trainer (started first
        if it is RUNNING)."""
        self.sync()
        candidates = [i for i in self.managed() if i.status.alive]
        candidates += [s.inst for s in self.tpu_seen()
                       if s.real and s.inst.managed and not s.held and s.node.state == NodeState.READY]
        if not candidates:
            return None
        inst = self.rng.choice(candidates)
        return inst, self.trainers.get((inst.name, inst.id))

    def step_preempt(self) -> None:
        if (picked := self.victim()) is None:
            return
        inst, t = picked
        js = self.jobs.get(inst.job or "")
        graceful = self.rng.random() < 0.6
        if graceful:
            if t and t.state == "running" and t.rank == 0 and self.rng.random() < 0.5:
                self.checkpoint(t.job, complete=self.rng.random() < 0.7)  # the SIGTERM save, maybe cut off
            self.record(names.marker_key(inst.job or ""), t or self.vm_identity(inst), reason="preempted")
        self.stats[f"{_prefix(inst)}.preempt_{'graceful' if graceful else 'hard'}"] += 1
        if js:
            js.preempted.add(inst.attempt)
            js.lost.add(inst.attempt)
            js.causes[inst.attempt].append(f"{inst.name} preempted")
        if t:
            t.state, t.end = "done", "lost"
        self.say(f"{inst.name}: preempted ({'marker first' if graceful else 'hard: no marker'}, {inst.status})")
        if inst.tpu:
            # A node PREEMPTED (its queued resource SUSPENDED); a slice's host TERMINATED, preempted.
            self.fake(inst).preempt(inst.name)
        else:
            self.compute.preempt(inst.name)
        if graceful:
            self.event(inst.job or "")

    def step_notice(self) -> None:
        """A Spot VM's preemption notice: its agent writes the notice record at once (token-signed),
        and its trainer saves at the next step; the preemption comes a few steps later (its shutdown
        script's marker, or hard, or Compute's soft-off seen first), or never (``end_notices``)."""
        self.sync()
        running = [t for t in self.trainers.values() if t.state == "running" and not t.tpu
                   and (t.name, t.iid) not in self.noticed]
        if not running:
            return
        t = self.rng.choice(sorted(running, key=lambda t: t.name))
        inst = self.instance(t)
        if inst is not None and self.rng.random() < 0.2:
            # The project at its GPU quota, held by this very VM: a standby beside it is refused for
            # quota, which must never read as the zone's stockout nor step the job down.
            self.compute.quota_exhausted.add(inst.zone)
            self.stats["env.quota_at_notice"] += 1
            self.say(f"{inst.zone}: quota_exhausted (the project's GPUs are this job's)")
        self.record(names.notice_key(t.job), t, reason="preempted", notice_s=120)
        fate = self.rng.choices(["graceful", "hard", "soft_off", "nothing"], [5, 2, 2, 1])[0]
        self.noticed[(t.name, t.iid)] = (self.step_no + self.rng.randint(1, 5), fate)
        self.stats[f"vm.notice_{fate}"] += 1
        self.say(f"{t.name}: preemption notice (then: {fate})")
        if t.rank == 0 and self.rng.random() < 0.7:
            self.checkpoint(t.job, complete=self.rng.random() < 0.9)  # the save the notice asks for
        self.event(t.job)

    def end_notices(self, force: bool = False) -> None:
        """Each noticed VM's fate, once its step has come: preempted (its marker first, or hard, or its
        soft-off seen first: STOPPING with Compute's record of the preemption, TERMINATED a few steps
        later), or nothing (it runs on: the standby must be withdrawn)."""
        for (name, iid), (due, fate) in sorted(self.noticed.items()):
            if not force and due > self.step_no:
                continue
            del self.noticed[(name, iid)]
            inst = self.find(name, iid)
            if inst is None or not inst.status.alive or fate == "nothing":
                continue
            t = self.trainers.get((name, iid))
            js = self.jobs.get(inst.job or "")
            if js:
                js.preempted.add(inst.attempt)
                js.lost.add(inst.attempt)
                js.causes[inst.attempt].append(f"{name} preempted after its notice ({fate})")
            if t:
                t.state, t.end = "done", "lost"
            self.say(f"{name}: preempted after its notice ({fate})")
            if fate == "soft_off":
                self.compute.set_status(name, InstanceStatus.STOPPING)
                self.compute.causes_of(name).append(StopReason.PREEMPTED)
                self.audit.write(audit.system_event_entry(inst.project, inst.zone, name, inst.id,
                                                          "compute.instances.preempted", self.clock.now()))
                self.glitches.append(Glitch(name, iid, InstanceStatus.STOPPING, "preempted",
                                            self.step_no + self.rng.randint(1, 4)))
                if self.rng.random() < 0.5:  # its shutdown script's marker, before the guest is off
                    self.record(names.marker_key(inst.job or ""), t or self.vm_identity(inst), reason="preempted")
                    self.event(inst.job or "")
                continue
            if fate == "graceful":
                if t and t.rank == 0 and self.rng.random() < 0.5:
                    self.checkpoint(t.job, complete=self.rng.random() < 0.8)  # the SIGTERM save
                self.record(names.marker_key(inst.job or ""), t or self.vm_identity(inst), reason="preempted")
            self.compute.preempt(name)
            if fate == "graceful":
                self.event(inst.job or "")

    def step_platform(self) -> None:
        if (picked := self.victim()) is None:
            return
        inst, t = picked
        if inst.tpu:
            return self.tpu_platform(inst, t)
        how = self.rng.choice(["maintenance", "host_error", "stopped", "vanish"])
        self.stats[f"fault.{how}"] += 1
        if js := self.jobs.get(inst.job or ""):
            js.lost.add(inst.attempt)
            js.causes[inst.attempt].append(f"{inst.name} {how}")
        if t:
            t.state, t.end = "done", "lost"
        self.say(f"{inst.name}: {how}")
        if how == "maintenance":
            graceful = self.rng.random() < 0.6
            if graceful:
                self.record(names.marker_key(inst.job or ""), t or self.vm_identity(inst), reason="maintenance")
            self.compute.terminate(inst.name, StopReason.MAINTENANCE)
            if graceful:
                self.event(inst.job or "")
        elif how == "host_error":
            self.compute.terminate(inst.name, StopReason.HOST_ERROR)
        elif how == "stopped":
            self.compute.terminate(inst.name, StopReason.STOPPED)
        else:
            self.compute.vanish(inst.name)

    def tpu_platform(self, inst: Instance, t: Trainer | None) -> None:
        """What the TPU service does to a READY node: maintenance TERMINATES it (the shutdown
        script may write a maintenance marker first), someone deletes it, or maintenance is
        announced (or withdrawn), which costs nothing."""
        if inst.tpu_api == "compute":
            return self.slice_platform(inst, t)
        how = self.rng.choices(["terminated", "vanish", "announce"], [5, 2, 2])[0]
        self.stats[f"tpu.{how}"] += 1
        if how == "announce":
            on = inst.upcoming_maintenance is None
            self.say(f"{inst.name}: maintenance {'announced' if on else 'withdrawn'}")
            self.tpu.upcoming_maintenance(inst.name, on=on)
            return
        js = self.jobs.get(inst.job or "")
        if js:
            js.lost.add(inst.attempt)
            js.causes[inst.attempt].append(f"{inst.name} {how}")
        if t:
            t.state, t.end = "done", "lost"
        self.say(f"{inst.name}: {'TERMINATED (maintenance)' if how == 'terminated' else 'deleted by someone else'}")
        if how == "terminated":
            graceful = self.rng.random() < 0.5
            if graceful:
                self.record(names.marker_key(inst.job or ""), t or self.tpu_identity(inst), reason="maintenance")
            self.tpu.set_state(inst.name, NodeState.TERMINATED)
            if graceful:
                self.event(inst.job or "")
        else:
            self.tpu_vanish(inst)

    def slice_platform(self, inst: Instance, t: Trainer | None) -> None:
        """What Compute Engine does to a host of a running slice: host maintenance or a host error
        TERMINATES it (maintenance: the shutdown script may write its marker first), or a person
        stops it, or deletes the slice (its MIG, or its one instance)."""
        how = self.rng.choices(["maintenance", "host_error", "stopped", "vanish"], [4, 4, 1, 1])[0]
        self.stats[f"slice.{how}"] += 1
        if js := self.jobs.get(inst.job or ""):
            js.lost.add(inst.attempt)
            js.causes[inst.attempt].append(f"{inst.name} a host: {how}")
        if t:
            t.state, t.end = "done", "lost"
        self.say(f"{inst.name}: {'deleted by someone else' if how == 'vanish' else 'a host ' + how}")
        if how == "vanish":
            return self.tpu_vanish(inst)
        graceful = how == "maintenance" and self.rng.random() < 0.5
        if graceful:
            self.record(names.marker_key(inst.job or ""), t or self.tpu_identity(inst), reason="maintenance")
        why = {"maintenance": StopReason.MAINTENANCE, "host_error": StopReason.HOST_ERROR,
               "stopped": StopReason.STOPPED}[how]
        self.slices.lose(inst.name, why)
        if graceful:
            self.event(inst.job or "")

    def tpu_vanish(self, inst: Instance) -> None:
        """The node is gone without a word; a queued resource's is deleted by the service (SUSPENDED)."""
        key = (inst.project, inst.zone, inst.name)
        fake = self.fake(inst)
        with fake._lock:
            fake._nodes.pop(key, None)
            if inst.tpu_api == "compute":  # a slice deleted (its MIG, or its instance): nothing is left
                fake._queued.pop(key, None)
                return
            if (queued := fake._queued.get(key)) is not None:
                queued.state = QueuedState.SUSPENDED
                if js := self.jobs.get(inst.job or ""):
                    js.preempted.add(inst.attempt)  # reads as a preemption (README: SUSPENDED)

    def step_glitch(self) -> None:
        self.sync()  # a VM that is RUNNING has its trainer started before anything befalls it
        glitched = {(g.name, g.iid) for g in self.glitches}
        candidates = [i for i in self.managed() if i.status == InstanceStatus.RUNNING and (i.name, i.id) not in glitched]
        candidates += [s.inst for s in self.tpu_seen() if s.real and s.inst.managed and not s.held
                       and s.node.state == NodeState.READY and s.node.health == NodeHealth.HEALTHY
                       and (s.inst.name, s.inst.id) not in glitched]
        if not candidates:
            return
        inst = self.rng.choice(candidates)
        if inst.tpu:
            return self.tpu_glitch(inst)
        status, fate = self.rng.choice(GLITCHES)
        t = self.trainers.get((inst.name, inst.id))
        if js := self.jobs.get(inst.job or ""):
            # A VM stuck in such a state past its job's idle_timeout is given up as lost.
            js.lost.add(inst.attempt)
        if fate != "running":
            if js := self.jobs.get(inst.job or ""):
                js.lost.add(inst.attempt)  # its fate is sealed now
                js.causes[inst.attempt].append(f"{inst.name} {status} then {fate}")
            if t:
                t.state, t.end = "done", "lost"
        self.stats[f"fault.status_{status.value.lower()}"] += 1
        until = self.step_no + self.rng.randint(1, 6)
        self.glitches.append(Glitch(inst.name, inst.id, status, fate, until))
        self.say(f"{inst.name}: status {status} until step {until}, then {fate}")
        self.compute.set_status(inst.name, status)

    def tpu_glitch(self, inst: Instance) -> None:
        compute = inst.tpu_api == "compute"
        what, value, fate = self.rng.choice(SLICE_GLITCHES if compute else TPU_GLITCHES)
        t = self.trainers.get((inst.name, inst.id))
        js = self.jobs.get(inst.job or "")
        if js and value != "HEALTH_FROM_THE_FUTURE":
            # A node kept in such a state past maintenance_timeout (idle_timeout) is given up.
            js.lost.add(inst.attempt)
            if fate != "running":
                js.causes[inst.attempt].append(f"{inst.name} {what} {value} then {fate}")
        if fate != "running" and t:
            t.state, t.end = "done", "lost"
        self.stats[f"{_prefix(inst)}.{what}_{value.lower()}"] += 1
        self.stats[f"{_prefix(inst)}.fate_{fate}"] += 1
        until = self.step_no + self.rng.randint(1, 8)
        self.glitches.append(Glitch(inst.name, inst.id, inst.status, fate, until, tpu=what, value=value,
                                    api=inst.tpu_api))
        self.say(f"{inst.name}: TPU {'slice ' if compute else ''}{what} {value} until step {until}, then {fate}")
        if what == "state":
            self.fake(inst).set_state(inst.name, value)
        else:
            self.fake(inst).set_health(inst.name, value)

    def end_tpu_glitch(self, g: Glitch) -> None:
        seen = next((s for s in self.tpu_seen()
                     if s.real and (s.inst.name, s.inst.id, s.api) == (g.name, g.iid, g.api)), None)
        now = None if seen is None else seen.node.state if g.tpu == "state" else seen.node.health
        set_to = NodeState.of(g.value) if g.tpu == "state" else NodeHealth.of(g.value)
        if seen is None or now != set_to or g.fate == "stays":
            return
        self.say(f"{g.name}: TPU {g.tpu} {g.value} over: {g.fate}")
        fake = self.fake(seen.inst)
        if g.fate == "running":
            if g.tpu == "state":
                fake.set_state(g.name, NodeState.READY)
            else:
                fake.set_health(g.name, NodeHealth.HEALTHY)
        elif g.fate == "host_error":  # a slice's host: TERMINATED, Compute's record says why
            self.slices.lose(g.name, StopReason.HOST_ERROR)
        elif g.fate == "stopped" and g.api == "compute":
            self.slices.lose(g.name, StopReason.STOPPED)
        elif g.fate == "terminated":
            fake.set_state(g.name, NodeState.TERMINATED)
        elif g.fate == "stopped":
            fake.set_state(g.name, NodeState.STOPPED)
        else:
            self.tpu_vanish(seen.inst)

    def end_glitches(self, force: bool = False) -> None:
        for g in list(self.glitches):
            if not force and g.until > self.step_no:
                continue
            self.glitches.remove(g)
            if g.tpu:
                self.end_tpu_glitch(g)
                continue
            inst = self.find(g.name, g.iid)
            if inst is None or inst.status != g.status:
                continue
            self.say(f"{g.name}: {g.status} over: {g.fate}")
            if g.fate == "running":
                self.compute.set_status(g.name, InstanceStatus.RUNNING)
            elif g.fate == "host_error":
                self.compute.terminate(g.name, StopReason.HOST_ERROR)
            elif g.fate == "stopped":
                self.compute.terminate(g.name, StopReason.STOPPED)
            elif g.fate == "preempted":  # a soft-off's end: the guest is off
                self.compute.terminate(g.name, StopReason.PREEMPTED)
            else:
                self.compute.vanish(g.name)

    def step_zone(self) -> None:
        if self.tpu_jobs() and self.rng.random() < self.tpu_share():
            return self.tpu_zone()
        what = self.rng.choice(["stockouts", "spot_stockouts", "quota_exhausted", "unreachable"])
        zones: set[str] = getattr(self.compute, what)
        if zones and self.rng.random() < 0.5:
            zone = self.rng.choice(sorted(zones))
            zones.discard(zone)
            self.say(f"{zone}: {what} over")
        else:
            zone = self.rng.choice(ZONES)
            zones.add(zone)
            self.stats[f"env.{what}"] += 1
            self.say(f"{zone}: {what}")

    def step_shortage(self) -> None:
        """Spot VMs run short in the whole region (every zone), or are back: a job with a
        provisioning list steps down it, and back up once ``fallback.step_up_after`` has passed."""
        if not any(len(js.doc.get("provisioning", ())) > 1 for js in self.jobs.values()):
            return self.step_advance()
        zones = self.compute.spot_stockouts
        if len(zones) == len(ZONES):
            zones.clear()
            if self.compute.stockouts >= set(ZONES):
                self.compute.stockouts.clear()  # a Flex-start VM PENDING gets its capacity now (sync)
            self.say("Spot capacity is back in every zone")
        else:
            zones.update(ZONES)
            self.stats["env.spot_shortage"] += 1
            full = self.rng.random() < 0.3  # no GPU of any model: Flex-start waits in PENDING
            if full:
                self.compute.stockouts.update(ZONES)
            self.say(f"{'GPUs' if full else 'Spot'} run short in every zone")

    def tpu_zone(self) -> None:
        """Trouble in a TPU zone: a stockout (a queued resource or a Flex-start slice waits it out),
        quota, a zone that does not answer the list; or the project's TPU list refused (403: the
        API off). On the Cloud TPU API's side or on Compute Engine's slices'."""
        fake, api = self.tpu_side()
        prefix = "tpu" if api == "tpu" else "slice"
        what = self.rng.choice(["stockouts", "stockouts", "quota_exhausted", "quota_exhausted", "unreachable",
                                "failing_projects"])
        if what == "failing_projects":
            if PROJECT in fake.failing_projects:
                fake.failing_projects.discard(PROJECT)
                self.say(f"{prefix.upper()} list of the project answers again")
            else:
                fake.failing_projects.add(PROJECT)
                self.stats[f"{prefix}.env_failing_project"] += 1
                self.say(f"{prefix.upper()} list of the project refused (403)")
            return
        zones: set[str] = getattr(fake, what)
        on = not (zones and self.rng.random() < 0.5)
        used = sorted({z for js in self.jobs.values() if _api(js.doc) == api for z in js.doc["zones"]})
        if not on:
            zone = self.rng.choice(sorted(zones))
        else:  # mostly where the TPU jobs are
            zone = self.rng.choice(used if used and self.rng.random() < 0.8 else TPU_ZONES if api == "tpu" else
                                   sorted({z for offered, _ in SLICE_MACHINES.values() for z in offered}))
        if on:
            self.stats[f"{prefix}.env_{what}"] += 1
        self.say(f"{prefix.upper()} {zone}: {what}{'' if on else ' over'}")
        if what == "stockouts":
            fake.stockout(zone, on)  # the queue gives waiting resources their nodes when it ends
        elif what == "quota_exhausted":
            fake.quota(zone, on)
        else:
            (zones.add if on else zones.discard)(zone)

    def tpu_side(self) -> tuple[MemoryTpu, str]:
        """Which TPU API's trouble: the one this run's TPU jobs use (either, when both are)."""
        sides = [(fake, api) for fake, api in ((self.tpu, "tpu"), (self.slices, "compute"))
                 if any(_api(js.doc) == api for js in self.jobs.values())
                 or any(s.inst.managed for s in self.tpu_seen() if s.api == api)]
        if len(sides) == 2:
            return sides[self.rng.random() < 0.5]
        return sides[0] if sides else (self.tpu, "tpu")

    def step_tpu_api(self) -> None:
        """The TPU API's next list, create or delete fails (a transient 503, or a refusal); or a
        queued resource still waiting for capacity FAILS for good (its time constraint expired)."""
        if not self.tpu_jobs():
            return self.step_tick()
        fake, api = self.tpu_side()
        if api == "compute":
            return self.fail_next(fake, "slice", "Compute Engine (slices)")
        waiting = [s for s in self.tpu_seen() if not s.real and s.inst.managed and s.api == "tpu"
                   and s.node.queued == QueuedState.WAITING_FOR_RESOURCES]
        if waiting and self.rng.random() < 0.4:
            inst = self.rng.choice(waiting).inst
            if js := self.jobs.get(inst.job or ""):
                js.failed.add(inst.attempt)  # a failure that backs off (the same request would fail again)
                js.causes[inst.attempt].append(f"{inst.name} queued resource FAILED")
            self.stats["tpu.queued_failed"] += 1
            self.say(f"{inst.name}: its queued resource FAILED (never fulfilled)")
            with self.tpu._lock:
                self.tpu._queued[(inst.project, inst.zone, inst.name)].state = QueuedState.FAILED
            self.event(inst.job or "")
            return
        self.fail_next(fake, "tpu", "TPU API")

    def fail_next(self, fake: MemoryTpu, prefix: str, shown: str) -> None:
        """The API's next list, create or delete fails (a transient 503, or a refusal)."""
        op = self.rng.choice(["list", "list", "create", "delete"])
        error: Exception = self.rng.choice([
            errors.TransientError(f"injected {prefix.upper()} {op}: 503 backend error"),
            errors.TransientError(f"injected {prefix.upper()} {op}: deadline exceeded"),
            errors.RequestError(f"injected {prefix.upper()} {op}: 403 permission denied")
            if op != "create" else errors.RequestError(f"injected {prefix.upper()} create: 400 not offered here"),
        ])
        times = self.rng.randint(1, 2)
        self.stats[f"{prefix}.env_fail_{op}"] += 1
        self.say(f"{shown}: the next {times} {op} call(s) fail: {error}")
        fake.faults.fail_next(op, error, times)

    def step_inserts(self) -> None:
        """Insert operations outlive the adapter's wait (OperationPending), then finish: maybe a late stockout."""
        if self.tpu_jobs() and self.rng.random() < self.tpu_share():
            return self.tpu_hold()
        if not hasattr(self.compute, "hold_inserts"):
            return
        if not self.compute.hold_inserts:
            self.compute.hold_inserts = True
            self.stats["env.hold_inserts"] += 1
            self.say("insert operations now outlive the wait (pending)")
            return
        self.release_inserts()

    def tpu_hold(self) -> None:
        """TPU create operations stay running (the node CREATING, the queue standing still; a slice's
        MIG still making its hosts), then finish."""
        fake, api = self.tpu_side()
        if not fake.hold:
            self.stats[f"{'tpu' if api == 'tpu' else 'slice'}.env_hold"] += 1
            self.say(f"{'TPU' if api == 'tpu' else 'TPU slice'} create operations now outlive the wait (CREATING)")
            fake.hold_operations(True)
            return
        self.release_tpu(fake, api)

    def release_tpu(self, fake: MemoryTpu, api: str) -> None:
        if not fake.hold:
            return
        prefix = "tpu" if api == "tpu" else "slice"
        pending = [s.inst for s in self.tpu_seen() if s.held and s.inst.managed and s.api == api]
        if pending and self.faults_on and self.rng.random() < 0.5:  # capacity ran out while they waited
            zone = self.rng.choice(pending).zone
            fake.stockout(zone)
            self.stats[f"{prefix}.env_stockouts"] += 1
            self.say(f"{prefix.upper()} {zone}: stockouts (while creates were held)")
        fake.hold_operations(False)
        after = {(s.inst.name, s.inst.id) for s in self.tpu_seen() if s.real and s.api == api}
        late = [i for i in pending if (i.name, i.id) not in after]
        self.stats[f"{prefix}.late_stockout"] += bool(late)
        for i in late:  # nodes that existed (CREATING) and then went: to a pass that saw them, a lost attempt
            if js := self.jobs.get(i.job or ""):
                js.lost.add(i.attempt)
                js.causes[i.attempt].append(f"{i.name} removed by a late stockout")
        gone = f"; late stockout removes {', '.join(i.name for i in late)}" if late else ""
        self.say(f"held {prefix.upper()} creates finish{gone}")

    def release_inserts(self) -> None:
        if not getattr(self.compute, "hold_inserts", False):
            return
        pending = [i for i in self.managed() if i.status == InstanceStatus.PROVISIONING]
        if pending and self.faults_on and self.rng.random() < 0.5:  # capacity ran out while they waited
            zone = self.rng.choice(pending).zone
            self.compute.stockouts.add(zone)
            self.stats["env.stockouts"] += 1
            self.say(f"{zone}: stockouts (while inserts were pending)")
        self.compute.release_inserts()
        after = {(i.name, i.id) for i in self.managed()}
        late = [i.name for i in pending if (i.name, i.id) not in after]
        self.stats["fault.late_stockout"] += bool(late)
        for i in pending:  # VMs that existed and then went: to a pass that saw them, a lost attempt
            if (i.name, i.id) not in after and (js := self.jobs.get(i.job or "")):
                js.lost.add(i.attempt)
                js.causes[i.attempt].append(f"{i.name} removed by a late stockout")
        self.say(f"pending inserts finish{'; late stockout removes ' + ', '.join(late) if late else ''}")

    def step_user(self) -> None:
        job = self.rng.choice(list(self.jobs))
        js = self.jobs[job]
        # A job folder deleted whole leaves its TPU node findable only through the zones the
        # controller recorded: TPU jobs are purged more often.
        purge = 4 if any(i.job == job for i in self.tpu_managed()) else 1
        action = self.rng.choices(["cancel", "resubmit", "delete", "purge", "invalid"], [3, 4, 1.5, purge, 1])[0]
        self.stats[f"user.{action}"] += 1
        self.say(f"user: {action} {job}")
        if action == "cancel":
            self.store.write(BUCKET, names.cancel_key(job), b"")
        elif action == "resubmit":
            doc = json.loads(json.dumps(js.doc))
            tpu = "tpu" in doc
            change = self.rng.choices(["same", "size", "termination", "budget", "zones", "kind"], [2, 2, 2, 2, 2, 1])[0]
            if change in ("size", "zones") and _api(doc) == "compute":  # another slice, where it is offered
                if change == "size":
                    doc["tpu"], doc["zones"] = self.slice_block()
                else:
                    offered = SLICE_MACHINES[doc["tpu"]["machine_type"]][0]
                    doc["zones"] = self.rng.sample(offered, self.rng.randint(1, len(offered)))
            elif change == "size" and tpu:
                doc["tpu"]["type"] = self.rng.choice(TPU_TYPES)
            elif change == "size":
                doc["nodes"] = 1 if "flex-start" in doc.get("provisioning", ()) else self.rng.choice([1, 2, 3])
            elif change == "termination":
                doc["policy"]["termination_action"] = self.rng.choice(["stop", "delete"])
            elif change == "budget":
                doc["policy"]["max_restarts"] = self.rng.randint(2, 8)
            elif change == "zones":
                doc["zones"] = self.rng.sample(TPU_ZONES if tpu else ZONES, self.rng.randint(1, 3))
            elif change == "kind" and tpu and self.rng.random() < 0.4:
                # From a Cloud TPU node to a slice in Compute Engine, or back: the other API's node left
                # behind must still go (the status's tpu / tpu_compute keep it listed).
                api = "tpu" if _api(doc) == "compute" else "compute"
                doc = self.spec_doc(job, tpu=True, api=api)
                if "sweep" in js.doc:
                    doc["sweep"] = js.doc["sweep"]
                self.stats[f"slice.user_to_{'slice' if api == 'compute' else 'tpu_api'}"] += 1
            elif change == "kind":  # from VMs to a TPU slice, or back (a node left behind must still go)
                doc = self.spec_doc(job, tpu=not tpu)
                if "sweep" in js.doc:
                    doc["sweep"] = js.doc["sweep"]  # still the sweep's trial: check_sweep counts it
                self.stats[f"tpu.user_{'to_vm' if tpu else 'to_tpu'}"] += 1
            js.doc = doc
            self.say(f"user: {job}'s new spec: {change} ({_kind(doc)} in {', '.join(doc['zones'])})")
            self.submit(job, doc)
        elif action == "delete":
            with contextlib.suppress(errors.NotFound):
                self.store.delete(BUCKET, names.spec_key(job))
        elif action == "purge":  # ``gsutil rm -r gs://BUCKET/jobs/JOB/``: spec, status and records
            for info in self.store.list(BUCKET, f"{names.JOBS_PREFIX}{job}/"):
                with contextlib.suppress(errors.NotFound):
                    self.store.delete(BUCKET, info.name)
            # It takes a person a moment: the next run of this name never begins at the very
            # instant the old one did (the controller tells their insert request ids apart by it;
            # the simulated clock stands still between steps unless advanced).
            self.advance(timedelta(seconds=self.rng.randint(1, 30)))
            self.stats["tpu.user_purge_with_node"] += any(i.job == job for i in self.tpu_managed())
            self.stats["slice.user_purge_with_slice"] += any(i.job == job and i.tpu_api == "compute"
                                                             for i in self.tpu_managed())
            # Its history is gone: the next run counts attempts from 1 again. What befell the old
            # attempts says nothing of the new ones (their trainers are told apart by token).
            self.jobs[job] = JobSim(job, js.doc, spec_step=js.spec_step)
            self.written.pop(job, None)
            for key in [k for k in self.tokens if k[0] == job]:
                del self.tokens[key]
                self.attempt_nodes.pop(key, None)
        else:
            bad = json.loads(json.dumps(js.doc))
            bad["policy"]["max_restart"] = 3  # a typo: unknown field
            self.store.write(BUCKET, names.spec_key(job), json.dumps(bad).encode())
            js.spec_step = self.step_no
        self.event(job)

    def submit(self, job: str, doc: dict[str, Any]) -> None:
        """What ``respawn submit [--replace]`` does: a leftover cancel goes first, then the spec."""
        with contextlib.suppress(errors.NotFound):
            self.store.delete(BUCKET, names.cancel_key(job))
        self.store.write(BUCKET, names.spec_key(job), json.dumps(doc).encode())
        self.jobs[job].spec_step = self.step_no
        self.event(job)

    def step_stale_record(self) -> None:
        """A late shutdown script, or a record of an attempt that is over, lands now."""
        current = {job: st.attempt for job in self.jobs if (st := self.status(job)) is not None}
        live = {(i.job, i.attempt) for i in [*self.managed(), *self.tpu_managed()] if _live(i)}
        # Only attempts that are over: the status has moved past them (a standby inserted beside the
        # current attempt ends nothing), and none of their VMs runs.
        old = sorted(k for k in self.tokens if k[1] < current.get(k[0], 0) and k not in live and k[0] in self.jobs)
        if not old:
            return
        job, attempt = self.rng.choice(old)
        marker = attempt in self.jobs[job].lost and self.rng.random() < 0.6  # a shutdown script runs late
        key = names.marker_key(job) if marker else names.exit_key(job)
        if self.exists(key):
            return  # never over a record the controller has not read yet: that would destroy evidence
        who = Trainer(job, attempt, 0, 1, names.instance_name(job, attempt), "", self.tokens[(job, attempt)])
        if marker:
            self.stats["fault.stale_marker"] += 1
            self.say(f"{job}: late marker of attempt {attempt}")
            self.record(names.marker_key(job), who, reason="preempted")
        else:
            code = self.rng.choice([0, 1])
            self.stats["fault.stale_exit"] += 1
            self.say(f"{job}: late exit record ({code}) of attempt {attempt}")
            self.record(names.exit_key(job), who, exit_code=code)
        self.event(job)

    # -- the VMs ------------------------------------------------------------------------------------
    def sync(self) -> None:
        """Trainers start on VMs that came up; VMs that finished booting come up."""
        for inst in self.managed():
            key = (inst.name, inst.id)
            if key in self.trainers:
                continue
            if inst.status == InstanceStatus.RUNNING:
                t = self.vm_identity(inst)
                meta = self.compute.metadata_of_instance(inst)
                if meta.get("respawn-hold") == "1" and meta.get("respawn-go") != str(inst.attempt):
                    # At the starting line: no trainer before the go; rank 0 pokes now and then.
                    if t.rank == 0 and self.rng.random() < 0.3:
                        self.stats["vm.ready"] += 1
                        self.record(names.ready_key(t.job), t)
                        self.event(t.job, p=0.3)
                    continue
                self.trainers[key] = t
                self.stats["vm.started" if meta.get("respawn-hold") != "1" else "vm.started_at_the_go"] += 1
                if t.rank == 0:
                    self.heartbeat(t)
            elif inst.status == InstanceStatus.STAGING and (not self.faults_on or self.rng.random() < 0.5):
                self.compute.set_status(inst.name, InstanceStatus.RUNNING)
            elif (inst.status == InstanceStatus.PENDING and inst.zone not in self.compute.stockouts
                  and inst.zone not in self.compute.quota_exhausted and (not self.faults_on or self.rng.random() < 0.3)):
                self.stats["vm.flex_capacity_found"] += 1  # Compute found a Flex-start VM its capacity
                self.say(f"{inst.name}: Flex-start capacity found (PENDING -> {self.compute.boot_status})")
                self.compute.set_status(inst.name, self.compute.boot_status)
        tpus = self.tpu_seen()
        for seen in tpus:  # a READY, HEALTHY node: the agent starts on every worker; worker 0 beats
            key = (seen.inst.name, seen.inst.id)
            if seen.real and key not in self.trainers and seen.inst.status == InstanceStatus.RUNNING \
                    and not seen.inst.hung and seen.inst.managed:
                t = self.tpu_identity(seen.inst)
                self.trainers[key] = t
                self.stats[f"{_prefix(seen.inst)}.trainers_started"] += 1
                self.heartbeat(t)
        present = {(i.name, i.id): i for i in [*self.managed(), *(s.inst for s in tpus if s.real)]}
        glitched = {(g.name, g.iid) for g in self.glitches if g.fate == "running"}
        for key, t in self.trainers.items():
            if t.state == "done":
                continue
            inst = present.get(key)
            if inst is None or not (inst.status == InstanceStatus.RUNNING or key in glitched):
                t.state, t.end = "done", "deleted" if inst is None else f"{inst.status}"
        self.break_collectives()

    def break_collectives(self, now: bool = False) -> None:
        """A gang whose node went down for any reason but success: the others' collectives
        fail (an NCCL timeout), and each exits non-zero a little later, writing its exit
        record, unless it is hung or its VM went first."""
        groups: dict[tuple[str, int, str, str], list[Trainer]] = defaultdict(list)
        for t in self.trainers.values():
            if t.nodes > 1:
                groups[(t.job, t.attempt, t.token, t.made_by)].append(t)
        for key, group in groups.items():
            running = [t for t in group if t.state == "running"]
            if running and key not in self.breaks and any(t.state == "done" and t.end != "success" for t in group):
                self.breaks[key] = self.step_no + self.rng.randint(1, 3)
        for key, due in list(self.breaks.items()):
            if due > self.step_no and not now:
                continue
            del self.breaks[key]
            for t in groups.get(key, []):
                if t.state == "running" and self.instance(t) is not None:
                    self.stats["vm.collective_broken"] += 1
                    self.say(f"{t.name}: its collective broke: command exits 134")
                    self.trainer_exit(t, 134)

    def tpu_identity(self, inst: Instance) -> Trainer:
        """Worker 0 of a TPU node: its records name the node (``respawn-node``), not its host."""
        seen = next((s for s in self.tpu_seen() if (s.inst.name, s.inst.id, s.api) == (inst.name, inst.id, inst.tpu_api)),
                    None)
        meta = dict(seen.request.metadata) if seen and seen.request else {}
        workers = seen.node.workers if seen else 1
        return Trainer(inst.job or "", inst.attempt, 0, 1, meta.get("respawn-node", inst.name), inst.id,
                       meta.get("respawn-token", ""), tpu=True, workers=workers, api=inst.tpu_api)

    def vm_identity(self, inst: Instance) -> Trainer:
        try:
            meta = dict(self.compute.request_of(inst.name).metadata)
        except (KeyError, AssertionError):
            meta = {}
        nodes = int(meta.get("respawn-nodes") or 1)
        rank = 0
        if nodes > 1 and "-n" in inst.name:
            rank = int(inst.name.rsplit("-n", 1)[1])
        return Trainer(inst.job or "", inst.attempt, rank, nodes, inst.name, inst.id, meta.get("respawn-token", ""),
                       made_by=self.compute.made_by(inst))

    def beat(self) -> None:
        for t in self.trainers.values():
            if t.state == "running" and t.rank == 0:
                self.heartbeat(t)
        for inst in self.managed():  # a held VM's agent re-writes its ready record while it waits
            meta = self.compute.metadata_of_instance(inst)
            if inst.status == InstanceStatus.RUNNING and meta.get("respawn-hold") == "1" \
                    and meta.get("respawn-go") != str(inst.attempt) and (who := self.vm_identity(inst)).rank == 0:
                self.record(names.ready_key(inst.job or ""), who)

    def heartbeat(self, t: Trainer) -> None:
        self.record(names.heartbeat_key(t.job), t, listed=True)

    def record(self, key: str, t: Trainer, listed: bool = False, **extra: Any) -> None:
        """``listed``: the record's fields also in the object's custom metadata, as the VM agent
        writes a heartbeat (judged from the listing)."""
        body: dict[str, Any] = {"instance": t.name, "attempt": t.attempt, "node": t.rank,
                                "at": self.clock.now().isoformat()}
        if t.token:
            body["token"] = t.token
        body.update(extra)
        self.store.write(BUCKET, key, json.dumps(body).encode(), metadata=listing_metadata(body) if listed else None)

    def running_groups(self) -> dict[tuple[str, int, str, str], list[Trainer]]:
        """Attempts whose every node runs its trainer, by (job, attempt, token): a job whose folder
        was deleted whole starts again from attempt 1, maybe beside its old attempt 1's nodes."""
        groups: dict[tuple[str, int, str, str], list[Trainer]] = defaultdict(list)
        for t in self.trainers.values():
            if t.state == "running":
                groups[(t.job, t.attempt, t.token, t.made_by)].append(t)
        return {k: sorted(g, key=lambda t: t.rank) for k, g in groups.items() if len(g) == g[0].nodes}

    def managed(self) -> list[Instance]:
        return [i for i in self.compute.all() if i.labels.get(names.MANAGED_LABEL) == "true"]

    def tpu_seen(self) -> list[TpuSeen]:
        """Every TPU node, and every queued resource still without one, read straight from the
        fakes (no call recorded, no fault consumed), as the TPU lists would show them: the Cloud
        TPU API's nodes, then Compute Engine's slices (``api`` "compute")."""
        out: list[TpuSeen] = []
        for tpu, api in ((self.tpu, "tpu"), (self.slices, "compute")):
            with tpu._lock:
                for key, held in sorted(tpu._nodes.items()):
                    queued = key in tpu._queued
                    node = dataclasses.replace(held.node, api=api)
                    out.append(TpuSeen(node.as_instance(), node, held.request, held.held, queued, True, api))
                for key, queued in sorted(tpu._queued.items()):
                    if key in tpu._nodes:
                        continue
                    r = queued.request
                    node = TpuNode(r.project, r.zone, r.name, QUEUED_AS_NODE.get(queued.state, NodeState.UNKNOWN),
                                   NodeHealth.HEALTH_UNSPECIFIED, dict(r.labels), queued.created_at, r.accelerator_type,
                                   r.spot, queued=queued.state, api=api)
                    out.append(TpuSeen(node.as_instance(), node, r, False, True, False, api))
        return out

    def fake(self, inst: Instance) -> MemoryTpu:
        """The fake that holds a TPU node: the Cloud TPU API's, or Compute Engine's slices."""
        return self.slices if inst.tpu_api == "compute" else self.tpu

    def tpu_managed(self) -> list[Instance]:
        return [s.inst for s in self.tpu_seen() if s.inst.managed]

    def tpu_share(self) -> float:
        """The share of this run's jobs that are TPU jobs now (at least a third while a node is left)."""
        share = sum("tpu" in js.doc for js in self.jobs.values()) / len(self.jobs)
        return max(share, 1 / 3) if self.tpu_jobs() else 0.0

    def tpu_jobs(self) -> bool:
        """Whether a TPU job runs, ran, or may yet run here (its spec, or a node left)."""
        return any("tpu" in js.doc for js in self.jobs.values()) or bool(self.tpu_managed())

    def find(self, name: str, iid: str) -> Instance | None:
        found = next((i for i in self.compute.all() if i.name == name and i.id == iid), None)
        return found or next((s.inst for s in self.tpu_seen() if s.real and (s.inst.name, s.inst.id) == (name, iid)),
                             None)  # ids: the slices' apart from the nodes' (``Run.__init__``)

    def instance(self, t: Trainer) -> Instance | None:
        return self.find(t.name, t.iid)

    # -- passes ---------------------------------------------------------------------------------------
    def engine(self) -> Engine:
        store, compute = FaultyPort(self.store, self, "store"), FaultyPort(self.compute, self, "compute")
        # Capacity advice from the zones' state and random preemption rates; now and then it fails.
        self.advisor.failure = errors.TransientError("advice: 503") if self.frng.random() < 0.2 else None
        tpu, slices = FaultyPort(self.tpu, self, "tpu"), FaultyPort(self.slices, self, "slices")
        observer = Observer(store, compute, BUCKET, self.policy, workers=WORKERS,  # type: ignore[arg-type]
                            advisor=self.advisor, tpu=tpu, replayable=True,  # type: ignore[arg-type]
                            slices=slices,  # type: ignore[arg-type]
                            # Passes over every job in chunks of every size: a chunk acted on before
                            # the next is read, and a job a concurrent pass committed meanwhile.
                            chunk=self.frng.choice((1, 2, 5, CHUNK)))
        if self.faults_on and self.frng.random() < 0.03:
            times = 1  # a send that failed after the adapter's own retries
            self.publisher.fail_next(errors.TransientError("pubsub: 503"), times=times)
            self.stats["notify.failures_injected"] += times
        if self.faults_on and self.webhook_mode == "failing" and self.frng.random() < 0.2:
            self.webhook.fail_next(self.frng.choice([errors.TransientError("webhook: 503"),
                                                     errors.RequestError("webhook: 404 no_service")]))
            self.stats["notify.webhook_failures_injected"] += 1
        executor = ExecutorSpy(Executor(store, compute, BUCKET, tpu, self.notifier,  # type: ignore[arg-type]
                                        slices=slices), self)  # type: ignore[arg-type]
        return Engine(observer, executor, self.ctx, self.clock, workers=WORKERS)  # type: ignore[arg-type]

    def new_pass_faults(self) -> PassFaults | None:
        if not self.faults_on:
            return None
        f = self.frng
        rate, timeout = f.choice(FAULT_RATES), f.choice(TIMEOUT_RATES)
        crash = f.random() < 0.12
        return PassFaults(rate, timeout, f.randint(1, 4) if crash else None, f.random() < 0.5)

    def run_pass(self, job: str | None, label: str | None = None) -> Summary | None:
        label = label or ("tick" if job is None else f"event {job}")
        engine = self.engine()
        faults = self.new_pass_faults()
        summary = self.guarded(label, faults, lambda: engine.reconcile(job))
        if summary is None and self.faults_on and self._last_transient and self.frng.random() < 0.5:
            self.stats["fault.platform_retry"] += 1  # the platform retries a function that raised
            summary = self.guarded(label + " (retry)", self.new_pass_faults(),
                                   lambda: self.engine().reconcile(job))
        self.report(label, summary)
        if job is None and summary is not None:
            self.check_orphans(label, clean=self._last_clean)
        return summary

    def guarded(self, label: str, faults: PassFaults | None, body: Callable[[], Any]) -> Any:
        """Run (part of) a pass under its faults; an escaping exception is judged here."""
        before, self.pass_faults = self.pass_faults, faults
        self._last_transient = False
        injected, tpu_failed = self._injected, self._tpu_failed
        self.notice_s, began = 0.0, time.monotonic()
        try:
            return body()
        except InjectedCrash as e:
            self.say(f"{label}: CRASH ({e})")
            if carried := self.notifier.carried:  # the instance died: what it carried is lost (its log said so)
                self.stats["notify.carried_lost_in_crash"] += len(carried)
            self.notifier = self.new_notifier()
            return None
        except errors.TransientError as e:  # the function raises; the platform retries
            self.stats["pass.transient_escaped"] += 1
            self._last_transient = True
            self.say(f"{label}: raised {type(e).__name__}: {e}")
            return None
        except Exception as e:  # noqa: BLE001 - a controller bug: judged, never hidden
            where = traceback.extract_tb(e.__traceback__)[-1]
            self.violate("crashes", f"{label}: {type(e).__name__}: {e} (at {where.filename}:{where.lineno})")
            if self.verbose:
                self.out(traceback.format_exc())
            return None
        finally:
            self.pass_faults = before
            self.stats["pass.total"] += 1
            self.stats["pass.faulted"] += self._injected > injected
            self._last_clean = self._injected == injected and self._tpu_failed == tpu_failed
            self.check_pass_time(label, time.monotonic() - began, self.notice_s)

    def report(self, label: str, summary: Summary | None) -> None:
        if summary is None:
            return
        for job, why in summary.errors.items():
            if "unexpected" in why:
                self.violate("crashes", f"{label}: {job}: {why}")
        if self.verbose:
            done = {j: a for j, a in summary.jobs.items() if a}
            text = "; ".join(f"{j}: {' / '.join(a)}" for j, a in done.items()) or "nothing to do"
            errs = "; ".join(f"{j}: {e}" for j, e in summary.errors.items())
            self.say(f"{label}: {text}{' | errors: ' + errs if errs else ''}")

    def call(self, port: str, op: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Every call the controller makes: faults before, the call, hooks, faults after."""
        p = self.pass_faults
        mutating = op in MUTATING
        self.stats["calls.total"] += 1
        k = 0
        if p is not None:
            if mutating:
                p.mutations += 1
                k = p.mutations
                if k == p.crash_at and p.crash_before:
                    self.stats["fault.crash_before_call"] += 1
                    self._injected += 1
                    raise InjectedCrash(f"before {port}.{op} #{k}")
            if self.frng.random() < p.rate:
                self.stats[f"fault.transient.{port}.{op}"] += 1
                self._injected += 1
                raise errors.TransientError(f"injected: {port}.{op} failed (503)")
        tpu = port in ("tpu", "slices")  # the Cloud TPU API's nodes, or Compute Engine's slices
        fake, tp = (self.slices, "slice") if port == "slices" else (self.tpu, "tpu")
        if port == "compute" and op == "insert":
            self.before_insert(*args, **kwargs)
        elif tpu and op == "create":
            self.stats[f"{tp}.creates"] += 1
            self.stats[f"{tp}.queued_creates"] += args[0].queued
            self.stats[f"{tp}.flex_start_creates"] += args[0].flex_start
            self.stats[f"{tp}.multi_host_creates"] += args[0].hosts > 1
            self.check_recorded(args[0])
            self.before_insert([args[0]])
        elif op == "delete" and port in ("compute", "tpu", "slices"):
            self.before_delete(*args, tpu=tpu, api="compute" if port == "slices" else "tpu")
        elif port == "compute" and op == "list_managed" and self.compute.unreachable:
            self.stats["fault.unreachable_listing"] += 1
        elif tpu and op == "list_nodes":
            self.stats[f"{tp}.lists"] += 1
            self.stats[f"{tp}.unreachable_listing"] += bool(fake.unreachable & set(args[1]))
            self.stats[f"{tp}.refused_listing"] += PROJECT in fake.failing_projects
        prefix = f"{tp}." if tpu else "fault."
        try:
            result = fn(*args, **kwargs)
        except errors.CapacityError:
            self.stats[f"{prefix}stockout_hit"] += 1
            raise
        except errors.QuotaError:
            self.stats[f"{prefix}quota_hit"] += 1
            if tpu and op == "create":
                self.note_quota(args[0], fake)
            elif port == "compute" and op == "insert":
                self.note_vm_quota(args[0])
            raise
        except errors.OperationPending:
            self.stats[f"{prefix}pending_insert_hit"] += 1
            if tpu:
                self.after_insert([args[0]])  # accepted: its node exists (CREATING)
            else:
                self.after_insert(*args, **kwargs)  # accepted: its instances exist
            raise
        except errors.RespawnError as e:
            if tpu:
                self.stats[f"{tp}.{op}_failed"] += 1
                self._tpu_failed += op in ("list_nodes", "delete")
                self.say(f"{'TPU' if tp == 'tpu' else 'TPU slice'} {op} failed: {type(e).__name__}: {e}")
            raise
        if port == "compute" and op == "insert":
            self.after_insert(*args, **kwargs)
        elif port == "compute" and op == "release" and result:
            self.after_go(*args, **kwargs)
        elif tpu and op == "create":
            self.after_insert([args[0]])
        elif port == "store" and op == "write":
            self.after_write(*args, **kwargs)
        if p is not None and mutating:
            if k == p.crash_at:
                self.stats["fault.crash_after_call"] += 1
                self._injected += 1
                raise InjectedCrash(f"after {port}.{op} #{k} took effect")
            if self.frng.random() < p.timeout:
                self.stats[f"fault.timeout.{port}.{op}"] += 1
                self._injected += 1
                raise errors.TransientError(f"injected: {port}.{op} timed out (it took effect)")
        return result

    # -- hooks on the controller's mutations -------------------------------------------------------
    def before_insert(self, requests: Any, request_id: str | None = None, wait: float | None = None) -> None:
        first = requests[0]
        job = first.labels.get(names.JOB_LABEL, "")
        js = self.jobs.get(job)
        if js and js.succeeded_spec is not None and self.spec_generation(job) == js.succeeded_spec:
            self.violate("restarted_finished", f"{job}: insert of {', '.join(r.name for r in requests)} after status "
                         f"SUCCEEDED, with the spec unchanged since ({js.succeeded_note})")
        self.stats[f"creates.{getattr(first, 'provisioning', None) or ('spot' if first.spot else 'standard')}"] += 1
        resume = dict(first.metadata).get("respawn-resume-from", "")
        if resume and not self.complete_checkpoint(resume):
            self.violate("lost", f"{job}: {first.name} resumes from {resume}, which is not a complete checkpoint")

    def after_insert(self, requests: Any, request_id: str | None = None, wait: float | None = None) -> None:
        first = requests[0]
        job = first.labels.get(names.JOB_LABEL, "")
        attempt = int(first.labels.get(names.ATTEMPT_LABEL, "0"))
        key = (job, attempt)
        self.attempt_nodes[key] = max(self.attempt_nodes.get(key, 0), len(requests))
        self.tokens.setdefault(key, dict(first.metadata).get("respawn-token", ""))
        self.check_duplicates(f"after inserting {', '.join(r.name for r in requests)}")

    def after_go(self, project: str, zone: str, name: str, items: Any, wait: float | None = None) -> None:
        """The go, written now: it names the newest complete checkpoint of the job (none while it has
        none), never an older one nor one cut off."""
        job = (names.parse_instance_name(name) or ("",))[0]
        resume = dict(items).get("respawn-resume-from", "")
        newest = self.newest_checkpoint(job)
        self.stats["controller.goes"] += 1
        if resume and not self.complete_checkpoint(resume):
            self.violate("stale_start", f"{job}: the go of {name} names {resume}, which is not a complete checkpoint")
        elif resume != (newest or ""):
            self.violate("stale_start", f"{job}: the go of {name} names {resume or 'no checkpoint'}; "
                         f"the newest complete one is {newest}")

    def newest_checkpoint(self, job: str) -> str | None:
        steps = [int(info.name.split("/")[2]) for info in self.store.list(CKPT_BUCKET, f"{job}/run/")
                 if info.name.endswith("/commit_success.txt")]
        return f"gs://{CKPT_BUCKET}/{job}/run/{max(steps)}" if steps else None

    @property
    def acting_job(self) -> str | None:
        return getattr(self._acting, "job", None)

    @acting_job.setter
    def acting_job(self, job: str | None) -> None:
        self._acting.job = job

    def check_recorded(self, request: TpuRequest) -> None:
        """A TPU node is created only where a later pass looks for it once its job folder is gone:
        its (project, zone) already in the controller's record (respawn/tpu-zones.json for the
        Cloud TPU API, respawn/tpu-slice-zones.json for slices in Compute Engine)."""
        key = tpuzones.SLICES_KEY if request.api == "compute" else tpuzones.KEY
        try:
            pairs = tpuzones.parse(self.store.read(BUCKET, key).data)
        except errors.NotFound:
            pairs = set()
        if (request.project, request.zone) not in pairs:
            self.violate("orphan_tpu", f"{request.name} created in {request.zone} of {request.project}, which "
                         f"gs://{BUCKET}/{key} does not record: a node never found once its job folder is gone")

    def before_delete(self, project: str, zone: str, name: str, tpu: bool = False, api: str = "tpu") -> None:
        everything = [s.inst for s in self.tpu_seen() if s.api == api] if tpu else self.compute.all()
        target = next((i for i in everything if (i.project, i.zone, i.name) == (project, zone, name)), None)
        if target is None:
            return
        if target.labels.get(names.MANAGED_LABEL) != "true":
            self.violate("foreign_deletes", f"deleting {name} in {zone} (labels {dict(target.labels)}), "
                         f"not labelled {names.MANAGED_LABEL}=true, while acting for {self.acting_job}")
        elif self.acting_job is not None and target.labels.get(names.JOB_LABEL) != self.acting_job:
            self.violate("foreign_deletes", f"deleting {name} of job {target.labels.get(names.JOB_LABEL)} "
                         f"while acting for job {self.acting_job}")
        self.stats[("slice.deletes" if api == "compute" else "tpu.deletes") if tpu else "controller.deletes"] += 1

    def after_write(self, bucket: str, name: str, data: bytes, **_: Any) -> None:
        ref = names.parse_object_name(name)
        if bucket != BUCKET or ref is None or ref.kind != "status" or ref.job not in self.jobs:
            return
        js = self.jobs[ref.job]
        status = JobStatus.from_json(data)
        before, self.written[ref.job] = self.written.get(ref.job), status
        if status.tpu or status.tpu_compute:
            self.check_step_down(ref.job, status, before)
        if status.phase != Phase.SUCCEEDED:
            return
        js.successes += 1
        # The spec the success was decided on: a spec written after the deciding pass
        # looked (even if before its write landed) is a new submission, and may run.
        js.succeeded_spec = status.spec_generation
        js.succeeded_note = (f"SUCCEEDED written at step {self.step_no} with status spec_generation "
                             f"{status.spec_generation}; the spec object was then at {js.succeeded_spec}"
                             f"{', written at step ' + str(js.spec_step) if js.spec_step is not None else ''}")
        base = _run_base(status)
        if not any(a > base for a in js.finished):
            self.violate("lost", f"{ref.job}: status SUCCEEDED (\"{status.message}\") but no attempt of this run "
                         f"(after attempt {base}) exited 0; attempts that did: {sorted(js.finished) or 'none'}")

    # -- invariants --------------------------------------------------------------------------------------
    def check(self) -> None:
        self.check_duplicates()
        self.check_trainers()
        self.check_budgets()
        self.check_notices()
        self.check_ledgers()
        self.check_sweep()

    def check_sweep(self) -> None:
        """At most ``max_parallel`` of a sweep's trials hold VMs or TPU nodes (any not yet gone), at
        every step, whatever the passes met; and at most that many hold a slot."""
        if not self.sweep_limit:
            return
        trials = {j for j, sim_ in self.jobs.items() if "sweep" in sim_.doc}
        holding = {i.job for i in self.managed() if i.job in trials} | \
            {t.inst.job for t in self.tpu_seen() if t.inst.managed and t.inst.job in trials}
        if len(holding) > self.sweep_limit:
            self.violate("sweep_limit", f"{len(holding)} trials hold VMs ({', '.join(sorted(holding))}); "
                                        f"max_parallel {self.sweep_limit}")
        self.stats["sweep.most_holding"] = max(self.stats["sweep.most_holding"], len(holding))

    def check_slot_leaks(self) -> None:
        """Once the world settled and every trial ended: no slot is still held (each given back once
        its trial was over and its VMs gone, a trial whose folder was deleted whole included)."""
        if not self.sweep_limit:
            return
        held = {(b.metadata or {}).get(SLOT_HOLDER) for b in self.store.list(BUCKET, names.slots_prefix(SWEEP))}
        if held:
            self.violate("sweep_limit", f"slots still held after every trial ended: {', '.join(sorted(map(str, held)))}")

    def check_notices(self) -> None:
        """A transition is told at most once to each destination, however many passes raced,
        repeated or crashed, and whatever a slow webhook still had under way."""
        seen: Counter[tuple[str, str]] = Counter((topic, json.loads(data)["id"])
                                                 for topic, data, _ in self.publisher.published)
        with self.webhook._lock:  # posts land on the notifier's threads, also between passes
            posted = list(self.webhook.posted)
        seen.update((url, body["respawn"]["id"]) for url, body in posted)  # type: ignore[index]
        if twice := sorted(f"{i} to {where}" for (where, i), n in seen.items() if n > 1):
            self.violate("notified_twice", f"notices sent more than once: {', '.join(twice[:5])}")

    def check_pass_time(self, label: str, wall: float, notices: float) -> None:
        """No pass is slower than its budget because of a notice (``slow_pass``): its sends go out
        side by side and it waits for them only at its end, at most NOTIFY_WAIT s in all, whatever
        its webhooks do (see NOTICE_SLACK, PASS_SLACK)."""
        self.timing["passes"] += 1
        self.timing["pass_s"] += wall
        self.timing["notice_s"] += notices
        self.timing["max_pass_ms"] = max(self.timing["max_pass_ms"], round(wall * 1000))
        self.timing["max_notice_ms"] = max(self.timing["max_notice_ms"], round(notices * 1000))
        if notices > NOTIFY_WAIT + NOTICE_SLACK:
            self.violate("slow_pass", f"{label}: spent {notices:.2f} s on its notices (webhook {self.webhook_mode}); "
                         f"its budget is RESPAWN_NOTIFY_WAIT {NOTIFY_WAIT} s")
        elif wall > NOTIFY_WAIT + PASS_SLACK:
            self.violate("slow_pass", f"{label}: took {wall:.2f} s, {notices:.2f} s of it on notices "
                         f"(webhook {self.webhook_mode}); budget {NOTIFY_WAIT + PASS_SLACK:g} s")

    def check_orphans(self, label: str, clean: bool) -> None:
        """No TPU node is left without a job (``orphan_tpu``): a managed node (or queued resource)
        whose job has neither spec nor status is deleted (its delete accepted) within
        ORPHAN_PASSES full passes that could see it: Cloud TPU has no aggregated list, so the
        controller finds it only in the zones it recorded (respawn/tpu-zones.json)."""
        for seen in self.tpu_seen():
            inst, fake = seen.inst, self.fake(seen.inst)
            key = (inst.project, inst.zone, inst.name, seen.node.id)
            job = inst.job or ""
            going = (inst.project, inst.zone, inst.name) in fake._deleting
            if (not inst.managed or not job or going or self.exists(names.spec_key(job))
                    or self.exists(names.status_key(job))):
                if key in self.orphans and going:
                    self.stats[f"{_prefix(inst)}.orphans_deleted"] += 1
                self.orphans.pop(key, None)
                continue
            blind = (inst.zone in fake.unreachable or inst.project in fake.failing_projects
                     or inst.zone in fake.denied_zones)
            if key not in self.orphans:
                self.orphans[key] = 0
                self.stats[f"{_prefix(inst)}.orphans_seen"] += 1
            if not clean or blind:
                continue
            self.orphans[key] += 1
            if self.orphans[key] > ORPHAN_PASSES:
                what = "TPU slice" if inst.tpu_api == "compute" else "TPU node"
                self.violate("orphan_tpu", f"{what} {inst.name} in {inst.zone} ({_shown(inst)}) of job {job}, which "
                             f"has neither spec nor status, still not deleted after {self.orphans[key]} clean full "
                             f"passes ({label})")

    def note_vm_quota(self, requests: Any) -> None:
        """A VM insert refused for quota while the job's own VMs are up in that region (a standby's
        beside the attempt it replaces, or a replacement beside a husk still going down)."""
        first = requests[0]
        made = {r.name for r in requests}
        region = first.zone.rsplit("-", 1)[0]
        if any(i.job == first.labels.get(names.JOB_LABEL) and i.name not in made and not i.status.down
               and i.zone.rsplit("-", 1)[0] == region for i in self.managed()):
            self.stats["vm.own_quota_hit"] += 1

    def note_quota(self, request: TpuRequest, tpu: MemoryTpu) -> None:
        """A TPU create refused on quota: was it the job's own node (a husk being deleted) that held
        the zone's quota? As the fake counts it: every node and queued resource of that model
        listed in the zone; own-caused when the others alone would have left room."""
        job = request.labels.get(names.JOB_LABEL, "")
        self.own_quota.pop(job, None)
        limit = tpu.quota_limit.get((request.zone, request.spot))
        if limit is None or request.zone in tpu.quota_exhausted:
            return
        self.stats[f"{'slice' if request.api == 'compute' else 'tpu'}.quota_limit_hit"] += 1
        with tpu._lock:
            held = {k: t.node.labels for k, t in tpu._nodes.items() if k[1] == request.zone and t.node.spot == request.spot}
            held.update({k: q.request.labels for k, q in tpu._queued.items()
                         if k[1] == request.zone and q.request.spot == request.spot and k not in held})
        own = tuple(sorted(k[2] for k, labels in held.items()
                           if labels.get(names.MANAGED_LABEL) == "true" and labels.get(names.JOB_LABEL) == job))
        if own and len(held) >= limit > len(held) - len(own):
            self.own_quota[job] = (request.zone, self.clock.now(), own)
            self.stats[f"{'slice' if request.api == 'compute' else 'tpu'}.own_quota_hit"] += 1
            self.say(f"TPU create of {request.name} in {request.zone} refused on quota held by {job}'s own {', '.join(own)}")

    def check_step_down(self, job: str, status: JobStatus, before: JobStatus | None) -> None:
        """No step-down caused by the job's own node (``own_step_down``): a quota error that the
        job's own TPU node caused (it holds its zone's quota while DELETING) is not the zone's
        capacity, nor the project's quota, so no step down may count it. ``before``: the job's
        status as last written (writes are generation-matched: one line of them per job)."""
        own = self.own_quota.get(job)
        history = status.history
        old = {(e.at, e.event, e.detail) for e in before.history} if before is not None else set()
        if own is not None and own[1] == self.clock.now():
            zone, at, husks = own
            noted = [e for e in history if e.at == at and e.zone == zone and e.event in ("stockout", "quota")
                     and (e.at, e.event, e.detail) not in old]
            counted = before is not None and status.capacity_misses > before.capacity_misses
            downs = [e for e in history if e.event == "step-down" and e.at == at and (e.at, e.event, e.detail) not in old]
            for e in noted if counted or downs else ():
                self.own_misses.add((job, e.at, zone))
                self.stats["tpu.own_quota_counted"] += 1
                self.say(f"{job}: a quota error {', '.join(husks)} caused counted as a capacity miss: {e.detail}")
        for i, e in enumerate(history):
            if e.event != "step-down" or (e.at, e.event, e.detail) in old:
                continue
            counted_misses = []
            for earlier in reversed(history[:i]):
                if earlier.event in ("launch", "inserted", "respec", "step-down", "step-up"):
                    break
                if (job, earlier.at, earlier.zone or "") in self.own_misses:
                    counted_misses.append(earlier)
            if counted_misses:
                c = counted_misses[0]
                self.violate("own_step_down", f"{job}: {e.detail} (attempt {e.attempt}), counting a quota error in "
                             f"{c.zone} at {c.at:%H:%M:%S} that the job's own TPU node caused (it held the zone's "
                             f"quota while being deleted): {c.detail}")

    def count_notices(self) -> None:
        """How many of the state changes the final statuses record were told: a commit whose
        write "timed out" after taking effect, or whose send failed, is not told again."""
        sent = {(n["job"], datetime.fromisoformat(n["at"]), n["attempt"])
                for n in (json.loads(d) for _, d, _ in self.publisher.published)}
        self.stats["notify.sent"] += len(self.publisher.published)
        with self.webhook._lock:  # slow posts land on other threads: a wall-clock figure
            self.timing["webhook_posted"] += len(self.webhook.posted)
            self.timing["webhook_begun"] += self.webhook.begun
        for job in self.jobs:
            st = self.status(job)
            for e in st.history if st else ():
                if e.event in notify.KINDS:
                    self.stats["notify.told" if (job, e.at, e.attempt) in sent else "notify.missed"] += 1

    def check_ledgers(self) -> None:
        """Each status's ledger is consistent: attempts in order, times in order, totals sane."""
        for job in self.jobs:
            st = self.status(job)
            if st is None:
                continue
            book = st.ledger
            attempts = [s.attempt for s in book.spans]
            problems = []
            if attempts != sorted(set(attempts)):
                problems.append(f"attempts out of order or twice: {attempts}")
            if any(s.end is not None and s.end < s.start for s in book.spans):
                problems.append("an attempt ends before it starts")
            if any(s.end is None for s in book.spans[:-1]):
                problems.append("an attempt other than the last is still open")
            if st.phase.terminal and book.open is not None:
                problems.append(f"the job is {st.phase} with attempt {book.open.attempt} still open")
            t = book.totals
            if min(t.paid_acc_s, t.boot_acc_s, t.redone_acc_s, t.running_s, t.cost, t.unknown_acc_s) < 0 \
                    or t.boot_acc_s + t.unknown_acc_s > t.paid_acc_s + 1e-6:
                problems.append(f"totals out of range: {t}")
            if problems:
                self.violate("ledger", f"{job}: {'; '.join(problems)} ({_last(st)})")

    def check_trainers(self) -> None:
        """Never two trainers of one job past the starting line at once (a standby's VMs may boot
        beside the current attempt's, but start nothing before the go)."""
        running: dict[str, set[tuple[int, str]]] = defaultdict(set)
        for t in self.trainers.values():
            if t.state == "running" and self.instance(t) is not None:
                running[t.job].add((t.attempt, t.token))
        for job, attempts in running.items():
            if len(attempts) > 1:
                self.violate("two_trainers", f"{job}: trainers of attempts {sorted(a for a, _ in attempts)} run at once")

    def check_duplicates(self, when: str = "") -> None:
        alive: dict[str, dict[int, list[Instance]]] = defaultdict(lambda: defaultdict(list))
        held: dict[str, set[int]] = defaultdict(set)
        for inst in [*self.managed(), *self.tpu_managed()]:
            if _live(inst) and inst.job:
                meta = {} if inst.tpu else self.compute.metadata_of_instance(inst)
                if meta.get("respawn-hold") == "1" and meta.get("respawn-go") != str(inst.attempt):
                    held[inst.job].add(inst.attempt)  # a standby at the line: booting beside, starting nothing
                    continue
                alive[inst.job][inst.attempt].append(inst)
        for job, attempts in held.items():
            if len(attempts) > 1:
                self.violate("duplicates", f"{job}: {len(attempts)} standbys at the line at once: {sorted(attempts)}")
        suffix = f" ({when})" if when else ""
        for job, attempts in alive.items():
            if len(attempts) > 1:
                shown = "; ".join(f"attempt {a}: {', '.join(f'{i.name}@{i.zone} {_shown(i)}' for i in v)}"
                                  for a, v in sorted(attempts.items()))
                self.violate("duplicates", f"{job}: {len(attempts)} attempts alive at once: {shown}{suffix}")
            for attempt, instances in attempts.items():
                zones = sorted({i.zone for i in instances})
                nodes = self.attempt_nodes.get((job, attempt))
                if len(zones) > 1 or (nodes is not None and len(instances) > nodes):
                    shown = ", ".join(f"{i.name}@{i.zone} {_shown(i)}" for i in instances)
                    self.violate("duplicates", f"{job}: attempt {attempt} has {len(instances)} live instances "
                                 f"in {', '.join(zones)} (nodes {nodes}): {shown}{suffix}")

    def check_budgets(self) -> None:
        for job, js in self.jobs.items():
            st = self.status(job)
            if st is None:
                continue
            base = _run_base(st)
            what = "; ".join(f"attempt {a}: {', '.join(c)}" for a, c in sorted(js.causes.items()) if a > base)
            unreachable = sorted(self.compute.unreachable | {f"{z} (TPU)" for z in self.tpu.unreachable}
                                 | {f"{z} (TPU slices)" for z in self.slices.unreachable})
            context = (f"what befell this run: {what or 'nothing'}"
                       f"{'; unreachable now: ' + ', '.join(unreachable) if unreachable else ''}; {_last(st)}")
            preempted = len({a for a in js.preempted if a > base})
            failed = len({a for a in js.failed if a > base})
            lost = len({a for a in js.lost | js.failed if a > base})
            if st.preemptions > preempted:
                self.violate("budgets", f"{job}: status counts {st.preemptions} preemptions; attempts after {base} "
                             f"preempted: {sorted(a for a in js.preempted if a > base)} ({context})")
            if st.failures > failed:
                self.violate("budgets", f"{job}: status counts {st.failures} failures; attempts after {base} whose "
                             f"trainer failed: {sorted(a for a in js.failed if a > base)} ({context})")
            if st.restarts > lost:
                self.violate("budgets", f"{job}: status counts {st.restarts} restarts; attempts after {base} lost "
                             f"or failed: {sorted(a for a in js.lost | js.failed if a > base)} ({context})")

    # -- the end of a run -----------------------------------------------------------------------------------
    def finale(self) -> None:
        self.say("finale: no more faults; letting the world settle")
        self.faults_on = False
        self.pass_faults = None
        for zones in (self.compute.stockouts, self.compute.spot_stockouts, self.compute.quota_exhausted,
                      self.compute.unreachable, self.tpu.quota_exhausted, self.tpu.unreachable,
                      self.tpu.failing_projects, self.slices.quota_exhausted, self.slices.unreachable,
                      self.slices.failing_projects):
            zones.clear()
        for fake in (self.tpu, self.slices):
            for zone in sorted(fake.stockouts):
                fake.stockout(zone, False)
            fake.quota_limit.clear()
            fake.faults._queued.clear()  # failures queued by step_tpu_api and not met yet
        self.webhook_outage = (0, 0)
        self.webhook_weather()
        self.webhook.answer_now()  # posts still waiting on a slow or dead webhook are answered now
        self.release_inserts()
        self.release_tpu(self.tpu, "tpu")
        self.release_tpu(self.slices, "compute")
        self.end_notices(force=True)
        self.end_glitches(force=True)
        self.advance(timedelta(minutes=5))  # past every starting line's bound: a notice that came to nothing is seen so
        self.settle()
        for job in self.jobs:
            if problem := self.unsettled(job, require_message=True):
                self.violate("lost" if self.had_loss(job) else "stuck", f"{job}: after the world settled: {problem}")
        # Every job still running finishes: all nodes exit 0 (rank 0 writes its record first).
        finishing: dict[str, int] = {}
        for (job, attempt, _, _), group in sorted(self.running_groups().items()):
            st = self.status(job)
            if st is None or st.phase.terminal or st.attempt != attempt:
                continue
            finishing[job] = self.jobs[job].successes
            self.jobs[job].finished.add(attempt)
            self.say(f"finale: {job} attempt {attempt} exits 0")
            for t in group:
                self.trainer_exit(t, 0)
        self.settle()
        for job, successes in finishing.items():
            st = self.status(job)
            if self.jobs[job].successes == successes:
                where = f"{st.phase} attempt {st.attempt}: {st.message}" if st else "no status"
                self.violate("stuck", f"{job}: every node exited 0 but the status never said SUCCEEDED ({where})")
        self.count_notices()
        if all((st := self.status(j)) is None or st.phase.terminal for j in self.jobs):
            self.settle()  # a slot is given back on the pass after its trial's last VM is gone
            self.check_slot_leaks()
        for job in self.jobs:
            st = self.status(job)
            self.stats[f"outcome.{st.phase if st else 'no status'}"] += 1
            if "tpu" in self.jobs[job].doc:
                self.stats[f"{'slice' if _api(self.jobs[job].doc) == 'compute' else 'tpu'}.outcome_"
                           f"{st.phase if st else 'no_status'}"] += 1
            for e in st.history if st else ():
                if e.event in ("step-down", "stockout"):
                    self.stats[f"placement.{e.event}"] += 1
                elif e.event in ("standby", "standby-withdrawn", "notice-refused") or "giving the go to" in e.detail:
                    self.stats[f"zero_gap.{e.event if 'giving the go' not in e.detail else 'promoted'}"] += 1
                elif e.event == "step-up" or "stepping back up" in e.detail:  # its own event, or said in a launch
                    self.stats["placement.step-up"] += 1
                if st.tpu and e.event in ("maintenance", "maintenance-scheduled", "preempted", "settling", "resumed",
                                          "husk"):
                    self.stats[f"tpu.history_{e.event.replace('-', '_')}"] += 1
                if st.tpu_compute and e.event in ("maintenance", "preempted", "host error", "husk", "step-down"):
                    self.stats[f"slice.history_{e.event.replace('-', '_').replace(' ', '_')}"] += 1
        # A VM is leaked while it is alive; a TPU node in any state (a PREEMPTED one may hold quota).
        for inst in [*self.managed(), *self.tpu_managed()]:
            if not (inst.tpu or inst.status.alive) or not inst.job:
                continue
            st = self.status(inst.job)
            why = None
            if not self.exists(names.spec_key(inst.job)):
                why = "its job has no spec"
            elif self.exists(names.cancel_key(inst.job)):
                why = "its job is cancelled"
            elif st is None:
                why = "its job has no status"
            elif st.phase.terminal:
                why = f"its job is {st.phase}"
            elif inst.attempt != st.attempt:
                why = f"it is attempt {inst.attempt}, the job's is {st.attempt}"
            if why:
                self.violate("leaked", f"{'TPU node ' if inst.tpu else ''}{inst.name} in {inst.zone} is {_shown(inst)} "
                             f"after the world settled: {why}")

    def settle(self, rounds: int = 30) -> None:
        for _ in range(rounds):
            self.sync()
            self.break_collectives(now=True)
            summary = self.run_pass(None, label="clean tick")
            self.sync()
            self.check()
            quiet = summary is not None and not any(summary.jobs.values()) and not summary.errors
            if quiet and not any(self.unsettled(job) for job in self.jobs):
                return
            self.advance(timedelta(minutes=10))

    def unsettled(self, job: str, require_message: bool = False) -> str | None:
        """Why the job is neither ended nor fully running, or None."""
        st = self.status(job)
        if st is None:
            return "a spec but no status" if self.exists(names.spec_key(job)) else None
        if st.phase.terminal:
            return f"{st.phase} without a message" if require_message and not st.message.strip() else None
        if st.phase == Phase.QUEUED and self.sweep_limit:
            # Settled when every slot is held by a trial that is not over: it starts as one ends
            # (the finale ends them, and check_finale_queue then wants it started).
            holders = {(b.metadata or {}).get(SLOT_HOLDER) for b in self.store.list(BUCKET, names.slots_prefix(SWEEP))}
            busy = {h for h in holders if h and (hs := self.status(h)) is not None and not hs.phase.terminal}
            if len(busy) >= self.sweep_limit:
                return None
            return f"QUEUED with {len(busy)} of {self.sweep_limit} slots held by trials not over: {st.message}"
        nodes = {i.name: i for i in [*self.managed(), *self.tpu_managed()] if i.job == job and i.attempt == st.attempt}
        down = [n for n in st.instances if n not in nodes or nodes[n].status != InstanceStatus.RUNNING]
        hung = [t.name for t in self.trainers.values() if t.job == job and t.attempt == st.attempt and t.state == "hung"]
        hung += [f"{n} health {i.health}" for n, i in nodes.items() if i.hung]
        if not st.instances or down:
            shown = ", ".join(f"{n} {_shown(nodes[n]) if n in nodes else 'missing'}" for n in down) or "no instances"
            return f"{st.phase} attempt {st.attempt} ({shown}): {st.message}"
        if hung:
            return f"{st.phase} attempt {st.attempt} hung ({', '.join(hung)})"
        return None

    def had_loss(self, job: str) -> bool:
        js = self.jobs[job]
        return bool(js.lost or js.failed)

    # -- reading the world directly (never through the faulty proxies) -------------------------------
    def status(self, job: str) -> JobStatus | None:
        try:
            blob = self.store.read(BUCKET, names.status_key(job))
        except errors.NotFound:
            return None
        key = (job, blob.info.generation)
        if key not in self._status_cache:
            try:
                self._status_cache[key] = JobStatus.from_json(blob.data)
            except ValueError:
                self._status_cache[key] = None
        return self._status_cache[key]

    def exists(self, key: str) -> bool:
        return self.store.exists(BUCKET, key)

    def spec_generation(self, job: str) -> int:
        try:
            return self.store.read(BUCKET, names.spec_key(job)).info.generation
        except errors.NotFound:
            return 0

    def complete_checkpoint(self, uri: str) -> bool:
        bucket, _, path = uri.removeprefix("gs://").partition("/")
        return any(self.store.exists(bucket, f"{path.rstrip('/')}/{leaf}") for leaf in ("commit_success.txt",))


def _live(inst: Instance) -> bool:
    """A VM booting or running; a TPU node unless it is down: PREEMPTED or TERMINATED (its queued
    resource SUSPENDED or FAILED), or STOPPED (it runs nothing, as a stopped VM; no one but a
    person starts it again), or DELETING (a delete was accepted: it only goes, as a VM that is
    STOPPING does, and it never comes back). One in any other state (REPAIRING, HIDDEN, under
    maintenance, a state Google adds later...) may yet be READY."""
    if inst.tpu:
        return not inst.status.down and inst.status != InstanceStatus.DEPROVISIONING
    return inst.status.alive


def _shown(inst: Instance) -> str:
    if not inst.tpu:
        return str(inst.status)
    health = f" health {inst.health}" if inst.health not in (None, NodeHealth.HEALTHY) else ""
    return f"TPU {inst.status}{' (' + inst.stop_reason.value + ')' if inst.stop_reason else ''}{health}"


def _kind(doc: dict[str, Any]) -> str:
    if "tpu" in doc and _api(doc) == "compute":
        block = doc["tpu"]
        return f"TPU slice {block['machine_type']}{' ' + block['topology'] if 'topology' in block else ''}"
    if "tpu" in doc:
        return f"TPU {doc['tpu']['type']}{' queued' if doc['tpu'].get('queued') else ''}"
    return f"nodes {doc['nodes']}"


def _prefix(inst: Instance) -> str:
    """Where a node's stats go: "slice" (Compute Engine's TPU slices), "tpu" (Cloud TPU nodes), "fault" (VMs)."""
    return "slice" if inst.tpu and inst.tpu_api == "compute" else "tpu" if inst.tpu else "fault"


def _api(doc: dict[str, Any]) -> str | None:
    """Which API a spec's TPU is served by ("tpu": the Cloud TPU API; "compute": a slice), or None (VMs)."""
    if "tpu" not in doc:
        return None
    return "compute" if "machine_type" in doc["tpu"] else "tpu"


def _run_base(status: JobStatus) -> int:
    """The attempt number a run started from: the attempts of this run are above it."""
    for event in reversed(status.history):
        if event.event == "accepted":
            return event.attempt
    return 0


def _last(status: JobStatus) -> str:
    return f"status {status.phase} attempt {status.attempt}: {status.message}"


def _hms(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


# -- many runs ----------------------------------------------------------------------------------------------


@dataclass
class Totals:
    runs: int = 0
    counts: Counter[str] = field(default_factory=Counter)  # runs with at least one violation, per kind
    stats: Counter[str] = field(default_factory=Counter)
    timing: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[tuple[int, str]]] = field(default_factory=lambda: defaultdict(list))
    seeds: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))

    @property
    def failed(self) -> bool:
        return any(self.counts[k] for k in ALL_KINDS)

    def last_line(self) -> str:
        return "chaos: " + " ".join([f"runs={self.runs}", *(f"{k}={self.counts[k]}" for k in KINDS)])


@contextlib.contextmanager
def quiet_and_fast() -> Iterator[None]:
    """Logging off (the controller logs every action) and spec parsing memoized.

    ``parse_spec`` is a pure function of (bytes, job); memoizing it only spares the pure-Python
    YAML parser, which would otherwise take most of the time of a run.
    """
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    original = getattr(observe_module, "parse_spec", None)
    cache: dict[tuple[Any, str], tuple[bool, Any]] = {}

    def parse(raw: Any, job: str) -> Any:
        key = (bytes(raw) if isinstance(raw, (bytes, bytearray, memoryview)) else raw, job)
        hit = cache.get(key)
        if hit is None:
            try:
                hit = (True, original(raw, job))  # type: ignore[misc]
            except SpecError as e:
                hit = (False, list(e.problems))
            cache[key] = hit
        if hit[0]:
            return hit[1]
        raise SpecError(list(hit[1]))

    if original is not None:
        observe_module.parse_spec = parse  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if original is not None:
            observe_module.parse_spec = original  # type: ignore[attr-defined]
        logging.disable(previous)


def run_one(seed: int, steps: int | None = None, verbose: bool = False,
            out: Callable[[str], None] = print) -> RunResult:
    with quiet_and_fast():
        return Run(seed, steps, verbose, out).execute()


def run_many(seed: int, runs: int, steps: int | None = None, verbose: bool = False,
             out: Callable[[str], None] = print, max_examples: int = 5) -> Totals:
    totals = Totals()
    with quiet_and_fast():
        for s in range(seed, seed + runs):
            if verbose:
                out(f"run seed={s}")
            result = Run(s, steps, verbose, out).execute()
            totals.runs += 1
            totals.stats.update({k: v for k, v in result.stats.items() if not k.startswith("_")})
            for k, v in result.timing.items():
                totals.timing[k] = max(totals.timing[k], v) if k.startswith("max_") else totals.timing[k] + v
            for kind, message in result.violations.items():
                totals.counts[kind] += 1
                totals.seeds[kind].append(s)
                if len(totals.examples[kind]) < max_examples or verbose:
                    totals.examples[kind].append((s, message))
                    out(f"seed {s}: {kind}: {message}")
                    out(f"  replay: .venv/bin/python -m tests.chaos --seed {s} --runs 1 -v")
    return totals


def fault_line(totals: Totals) -> str:
    s = totals.stats
    transient = sum(v for k, v in s.items() if k.startswith("fault.transient."))
    timeouts = sum(v for k, v in s.items() if k.startswith("fault.timeout."))
    crashes = s["fault.crash_before_call"] + s["fault.crash_after_call"]
    parts = {
        "passes": s["pass.total"], "faulted_passes": s["pass.faulted"], "calls": s["calls.total"], "transient": transient, "timeouts": timeouts, "crashes": crashes,
        "late_passes": s["fault.late_pass"], "dup_events": s["fault.duplicate_event"],
        "audit_delivered": s["audit.delivered"], "audit_lost": s["fault.audit_lost"],
        "audit_dup": s["fault.audit_duplicated"], "audit_reordered": s["fault.audit_reordered"],
        "stockouts": s["fault.stockout_hit"], "quota": s["fault.quota_hit"],
        "unreachable": s["fault.unreachable_listing"], "pending": s["fault.pending_insert_hit"],
        "late_stockouts": s["fault.late_stockout"],
        "odd_status": sum(v for k, v in s.items() if k.startswith("fault.status_")),
        "preempt": s["fault.preempt_graceful"] + s["fault.preempt_hard"],
        "preempt_hard": s["fault.preempt_hard"],
        "platform": s["fault.maintenance"] + s["fault.host_error"] + s["fault.stopped"] + s["fault.vanish"],
        "stale_records": s["fault.stale_marker"] + s["fault.stale_exit"],
        "exits0": s["vm.success"], "nonzero": s["vm.nonzero"], "guest_crash": s["vm.crash"], "hang": s["vm.hang"],
        "vms": s["vm.started"], "user": sum(v for k, v in s.items() if k.startswith("user.")),
    }
    return "chaos faults: " + " ".join(f"{k}={v}" for k, v in parts.items())


def tpu_line(totals: Totals) -> str:
    """The TPU side: jobs, what befell their nodes, what the controller met, how they ended."""
    s = totals.stats
    parts = {
        "jobs": sum(v for k, v in s.items() if k.startswith("tpu.outcome_")),
        "nodes": s["tpu.trainers_started"], "creates": s["tpu.creates"], "deletes": s["tpu.deletes"],
        "lists": s["tpu.lists"],
        "preempt": s["tpu.preempt_graceful"] + s["tpu.preempt_hard"], "preempt_hard": s["tpu.preempt_hard"],
        "terminated": s["tpu.terminated"], "vanish": s["tpu.vanish"], "announced": s["tpu.announce"],
        "maintenance": s["tpu.health_unhealthy_maintenance"],
        "hung_health": s["tpu.health_timeout"] + s["tpu.health_unhealthy_tensorflow"],
        "odd_state": sum(v for k, v in s.items() if k.startswith("tpu.state_")),
        "odd_health": s["tpu.health_health_from_the_future"],
        "stockouts": s["tpu.stockout_hit"], "quota": s["tpu.quota_hit"], "pending": s["tpu.pending_insert_hit"],
        "late_stockouts": s["tpu.late_stockout"],
        "unreachable": s["tpu.unreachable_listing"], "refused_lists": s["tpu.refused_listing"],
        "failed_calls": s["tpu.list_nodes_failed"] + s["tpu.create_failed"] + s["tpu.delete_failed"],
        "queued_failed": s["tpu.queued_failed"],
        "exits0": s["tpu.exit_success"], "nonzero": s["tpu.exit_nonzero"], "foreign": s["tpu.foreign"],
        "kind_changes": s["tpu.user_to_tpu"] + s["tpu.user_to_vm"],
    }
    outcomes = {k.removeprefix("tpu.outcome_"): v for k, v in sorted(s.items()) if k.startswith("tpu.outcome_")}
    return ("chaos tpu (faults met, outcomes): " + " ".join(f"{k}={v}" for k, v in parts.items()) + " "
            + " ".join(f"{k.replace(' ', '_')}={v}" for k, v in outcomes.items())).rstrip()


def slice_line(totals: Totals) -> str:
    """Issue 38: TPU slices in Compute Engine (instances and MIGs), what befell them, how they ended."""
    s = totals.stats
    parts = {
        "jobs": sum(v for k, v in s.items() if k.startswith("slice.outcome_")),
        "creates": s["slice.creates"], "multi_host": s["slice.multi_host_creates"],
        "flex_start": s["slice.flex_start_creates"], "deletes": s["slice.deletes"], "lists": s["slice.lists"],
        "preempt": s["slice.preempt_graceful"] + s["slice.preempt_hard"],
        "maintenance": s["slice.maintenance"], "host_error": s["slice.host_error"] + s["slice.fate_host_error"],
        "stopped": s["slice.stopped"], "vanish": s["slice.vanish"], "host_crash": s["slice.host_crash"],
        "odd_state": sum(v for k, v in s.items() if k.startswith("slice.state_")),
        "stockouts": s["slice.stockout_hit"], "quota": s["slice.quota_hit"],
        "quota_limits_met": s["slice.quota_limit_hit"], "own_husk_quota": s["slice.own_quota_hit"],
        "slow_delete_runs": s["slice.env_slow_deletes"], "pending": s["slice.pending_insert_hit"],
        "late_stockouts": s["slice.late_stockout"], "unreachable": s["slice.unreachable_listing"],
        "refused_lists": s["slice.refused_listing"],
        "failed_calls": s["slice.list_nodes_failed"] + s["slice.create_failed"] + s["slice.delete_failed"],
        "foreign": s["slice.foreign"], "orphans_seen": s["slice.orphans_seen"],
        "orphans_deleted": s["slice.orphans_deleted"], "purges_with_slice": s["slice.user_purge_with_slice"],
        "api_changes": s["slice.user_to_slice"] + s["slice.user_to_tpu_api"],
        "exits0": s["slice.exit_success"], "nonzero": s["slice.exit_nonzero"],
    }
    outcomes = {k.removeprefix("slice.outcome_"): v for k, v in sorted(s.items()) if k.startswith("slice.outcome_")}
    return ("chaos tpu slices (issue 38: faults met, outcomes): " + " ".join(f"{k}={v}" for k, v in parts.items())
            + " " + " ".join(f"{k.replace(' ', '_')}={v}" for k, v in outcomes.items())).rstrip()


def issue22_line(totals: Totals) -> str:
    """Provisioning lists, TPU quota with slow deletes, orphans and slow notification destinations."""
    s, t = totals.stats, totals.timing
    parts = {
        "step_downs": s["placement.step-down"], "step_ups": s["placement.step-up"],
        "creates_by_model": "/".join(str(s[f"creates.{m}"]) for m in ("spot", "standard", "flex-start")),
        "flex_capacity_found": s["vm.flex_capacity_found"],
        "tpu_quota_runs": s["tpu.env_quota_limits"], "quota_limits_met": s["tpu.quota_limit_hit"],
        "slow_delete_runs": s["tpu.env_slow_deletes"], "waits_for_husks": s["tpu.history_husk"],
        "own_husk_quota_errors": s["tpu.own_quota_hit"] + s["vm.own_quota_hit"],
        "purges_with_node": s["tpu.user_purge_with_node"], "orphans_seen": s["tpu.orphans_seen"],
        "orphans_deleted": s["tpu.orphans_deleted"],
        **{f"webhook_{m}_runs": s[f"notify.webhook_{m}"] for m, _ in WEBHOOK_MODES},
        "webhook_failures": s["notify.webhook_failures_injected"],
        "webhook_posts_begun": t["webhook_begun"], "webhook_posts_answered": t["webhook_posted"],
        "max_pass_ms": t["max_pass_ms"], "max_notice_wait_ms": t["max_notice_ms"],
        "notice_wait_s": round(t["notice_s"], 1), "pass_s": round(t["pass_s"], 1),
    }
    return "chaos issue 22 (faults met; wall-clock figures vary): " + " ".join(f"{k}={v}" for k, v in parts.items())


def issue34_line(totals: Totals) -> str:
    """Preemption notices and what became of them; standbys launched, promoted and withdrawn."""
    s = totals.stats
    parts = {
        **{f"notices_{fate}": s[f"vm.notice_{fate}"] for fate in ("graceful", "hard", "soft_off", "nothing")},
        "standbys": s["zero_gap.standby"], "promoted": s["zero_gap.promoted"], "withdrawn": s["zero_gap.standby-withdrawn"],
        "goes": s["controller.goes"], "ready_records": s["vm.ready"], "trainers_started_at_the_go": s["vm.started_at_the_go"],
    }
    return "chaos issue 34 (notices, standbys, goes): " + " ".join(f"{k}={v}" for k, v in parts.items())


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0, help="seed of the first run; run i uses seed+i")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: 40-80, by seed)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every step and every pass's actions")
    parser.add_argument("--workers", type=int, default=1,
                        help="threads per pass, as deployed (default 1: a seed replays exactly; above, it does not)")
    args = parser.parse_args(argv)
    global WORKERS
    WORKERS = args.workers

    def out(line: str) -> None:
        print(line, flush=False)

    totals = run_many(args.seed, args.runs, args.steps, args.verbose, out)
    for kind in ALL_KINDS:
        if totals.counts[kind] > len(totals.examples[kind]):
            seeds = totals.seeds[kind]
            shown = " ".join(map(str, seeds[:30])) + (" ..." if len(seeds) > 30 else "")
            print(f"{kind}: {totals.counts[kind]} runs, seeds {shown}")
    if args.verbose:
        for key, value in sorted(totals.stats.items()):
            print(f"  {key} = {value}")
    print(fault_line(totals))
    outcomes = {k.removeprefix("outcome."): v for k, v in sorted(totals.stats.items()) if k.startswith("outcome.")}
    moves = {k.removeprefix("placement."): v for k, v in sorted(totals.stats.items()) if k.startswith("placement.")}
    print("chaos placement (history events): " + " ".join(f"{k.replace('-', '_')}={v}" for k, v in moves.items()))
    print(tpu_line(totals))
    print(slice_line(totals))
    print(issue22_line(totals))
    print(issue34_line(totals))
    print("chaos outcomes (jobs at the end): " + " ".join(f"{k.replace(' ', '_')}={v}" for k, v in outcomes.items()))
    print(f"chaos notifications: sent={totals.stats['notify.sent']} send_failures={totals.stats['notify.failures_injected']} "
          f"transitions_told={totals.stats['notify.told']} "
          f"not_told={totals.stats['notify.missed']} (a status write that failed after taking effect, or a send that "
          f"failed, is not told again)")
    print(f"chaos: budgets={totals.counts['budgets']}")
    print(totals.last_line())
    sys.stdout.flush()
    return 1 if totals.failed else 0
