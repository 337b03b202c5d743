"""Zero-gap recovery's downtime (issue 34), modelled: the real engine over the fakes on a fake clock.

``make bench`` runs it (scenario ``zerogap``: its keys in ``bench/results.json``);
``python -m bench.zerogap [--preemptions 200] [--seed 1]`` runs it alone, into ``bench/runs/``.

A preemption costs a job the time from its trainer's last step that the resumed checkpoint holds to
the replacement's first step. Three designs, each preemption drawn once and played in all three:

- ``serial``: today's design. No notice record, no standby; Compute's word arrives only with
  TERMINATED. SIGTERM at the soft-off, the save, the shutdown script's marker, whose event's pass
  inserts the replacement; it boots, then trains: about boot + save.
- ``notice0``: no 120 s notice. The agent writes its notice record at the soft-off (and Compute
  records the preemption then): the standby boots while the old VM saves; the save is hidden under
  the boot.
- ``notice120``: Google's 120 s notice. The standby boots during the notice and waits at the
  starting line; the trainer saves at the notice, trains on, saves again at SIGTERM; the go comes
  with the marker: the boot is hidden under the notice.

The controller is the real one (observer, planner, executor; an engine for the tick, one for
``on_object``, one for ``on_audit``) over ``controller.adapters.memory``, its clock a ``FakeClock``
that jumps from one event to the next (as tests/chaos/sim.py drives it): minutes of modelled time
cost milliseconds. The VM, the agent and the trainer are modelled (``Recovery``): a GPU VM's boot
drawn at 60-120 s (insert received to the agent ready: Compute's provisioning, the OS, the image,
the code), a trainer that steps at a fixed rate, saves periodically, at the notice (at the next step
boundary, training on) and at SIGTERM (at the next step boundary, then stops), each save landing
``save_s`` after it began, skipped when it would miss the shutdown script's deadline (respawnkit's
rule); the shutdown script's marker once the trainer exited or at its deadline, the guest's halt,
Spot's 30 s from the soft-off to the hard-off. Events wake passes as they do deployed: the notice
record, the standby's ready records (every ``respawn-line-poke-s``), the marker (Eventarc's delay),
Compute's System Event entry (the Log Router's and Eventarc's), and a tick every 60 s at a drawn
phase. Delays are drawn from ``localcloud.realism.COSTS``, the figures of the rest of the bench.

Not modelled (the same in every design, or measured elsewhere): HTTP latency of the controller's
own requests (``notice_to_insert_*``, bench/notice.py, measures that path for real on the local
cloud), the trainer's start (imports, reading the checkpoint), stockouts and quota, a notice after
which no preemption comes. A draw is made per preemption and per kind of delay (``Draws``), so the
three designs meet the same boots, saves, phases and delays.
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import math
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from bench.run import alone, beside, provenance
from controller.adapters.memory import MemoryCompute, MemoryStore
from controller.core import names
from controller.core.clock import FakeClock
from controller.core.launch import LINE_POKE_S, LaunchContext
from controller.core.policy import ControllerPolicy
from controller.core.ports import InstanceStatus, StopReason
from controller.core.state import JobStatus, Phase
from controller.service.engine import Engine
from controller.service.executor import Executor
from controller.service.observe import Observer
from localcloud.realism import COSTS, Costs

DESIGNS = ("serial", "notice0", "notice120")
BUCKET, PROJECT, CKPT = "zerogap", "zerogap-proj", "zerogap-ckpt"
TRAINER = f"respawn-trainer@{PROJECT}.iam.gserviceaccount.com"
JOB = "train"
LIMIT_S = 1800.0  # modelled seconds after the preemption by which a replacement must have stepped


@dataclass(frozen=True)
class Model:
    """The model's parameters (seconds), stated in the results as such."""

    boot: tuple[float, float] = (60.0, 120.0)  # a GPU VM's, uniform: insert received -> agent ready
    # About 25 s: the H200 run of issue 34 took 24.8 s from SIGTERM to the trainer's exit. A save must
    # land by the shutdown script's deadline, 25 s after the soft-off, and respawnkit skips one that it
    # reckons would not: 24 s, plus at most a step to the next boundary, fits.
    save_s: float = 24.0
    step_s: float = 0.5  # the trainer's fixed step time
    every_s: float = 600.0  # its periodic saves
    shutdown_s: float = 30.0  # Spot: the soft-off to the hard-off
    script_margin_s: float = 5.0  # deploy/vm/shutdown.sh: its marker's deadline, before the hard-off
    line_poke_s: float = float(LINE_POKE_S)
    start_s: float = 0.0  # the trainer's start to its first step's beginning (not modelled: 0)
    costs: Costs = COSTS

    @property
    def boot_p50(self) -> float:
        return (self.boot[0] + self.boot[1]) / 2


class Draws:
    """One preemption's random draws: a stream per kind, seeded by (seed, preemption, kind), so that
    the n-th draw of a kind is the same in every design however many draws of other kinds it made."""

    def __init__(self, seed: int, index: int) -> None:
        self.seed, self.index = seed, index
        self._streams: dict[str, random.Random] = {}

    def stream(self, kind: str) -> random.Random:
        if kind not in self._streams:
            self._streams[kind] = random.Random(f"{self.seed}/{self.index}/{kind}")
        return self._streams[kind]


@dataclass
class Trainer:
    """A trainer stepping every ``step_s`` from ``started``, from step ``resumed``."""

    vm: str
    started: float
    resumed: int
    step_s: float
    stopped_at: float | None = None  # the step boundary where SIGTERM stopped it
    uploading_until: float = -math.inf  # when the last queued save lands
    saves: list[tuple[int, float, str]] = field(default_factory=list)  # (step, lands, why)

    def boundary_after(self, t: float) -> float:
        return self.started + math.ceil(round((t - self.started) / self.step_s, 9)) * self.step_s

    def step_at(self, t: float) -> int:
        """The last step finished at ``t``."""
        end = t if self.stopped_at is None else min(t, self.stopped_at)
        return self.resumed + int(math.floor(round((end - self.started) / self.step_s, 9)))

    def time_of(self, step: int) -> float:
        return self.started + (step - self.resumed) * self.step_s


@dataclass
class Outcome:
    design: str
    index: int
    downtime_s: float  # the resumed step's end on the old VM -> the new VM's first step done
    steps_lost: int  # steps the old VM trained past the resumed one
    resumed_step: int
    last_step: int
    boot_s: float  # the replacement's boot
    insert_after_preemption_s: float  # Compute received the replacement's insert, from the notice (or the soft-off)
    sigterm_save: str  # "landed", "skipped" or "cut off" (past the hard-off)
    marker_saved: bool | None
    passes: int


class Compute(MemoryCompute):
    """The memory Compute, noting when each instance's insert was received (the fake clock's)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.received: dict[str, float] = {}
        self.t0 = clock.now()

    def insert(self, requests: Any, request_id: str, wait: float | None = None) -> dict[str, str]:
        try:
            return super().insert(requests, request_id, wait)
        finally:
            at = (self.clock.now() - self.t0).total_seconds()
            for r in requests:
                if r.name not in self.received and r.name in {i.name for i in self.all()}:
                    self.received[r.name] = at


def spec(design: str) -> str:
    return yaml.safe_dump({"zones": ["us-central1-a", "us-central1-b", "us-central1-c"],
                           "machine_type": "g2-standard-8", "command": "python train.py",
                           "checkpoint": {"uri": f"gs://{CKPT}/run"},
                           "preemption_notice": "120s" if design == "notice120" else "0s"})


class Recovery:
    """One preemption of one job under one design, from the trainer's start to the replacement's
    first step: a heap of timed events, each moving the fake clock to its time and calling the
    method of its name."""

    def __init__(self, design: str, index: int, model: Model, seed: int) -> None:
        assert design in DESIGNS
        self.design, self.index, self.m = design, index, model
        self.draws = Draws(seed, index)
        self.notice_s = 120.0 if design == "notice120" else 0.0
        self.clock = FakeClock()
        self.store, self.compute = MemoryStore(self.clock), Compute(self.clock)
        self.compute.boot_status = InstanceStatus.STAGING  # booting until its drawn boot is over
        policy = ControllerPolicy(default_project=PROJECT, trainer_service_account=TRAINER)
        ctx = LaunchContext(BUCKET, PROJECT, "#!/bin/bash\n", "#!/bin/bash\n")
        # One engine per function, as deployed: each instance its own caches.
        self.engines = {kind: Engine(Observer(self.store, self.compute, BUCKET, policy),
                                     Executor(self.store, self.compute, BUCKET), ctx, self.clock)
                        for kind in ("tick", "on_object", "on_audit")}
        self.warm: set[str] = set()  # the functions an instance of which served this preemption already
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq, self.now, self.passes = 0, 0.0, 0
        self.boots: dict[str, float] = {}  # each inserted instance's drawn boot
        self.identity: dict[str, tuple[int, str]] = {}  # each VM's attempt and token, as its agent read them
        self.waiting: set[str] = set()  # held VMs at the starting line
        self.old: Trainer | None = None
        self.new: Trainer | None = None
        self.old_vm = ""
        self.soft_off_at: float | None = None
        self.hard_off: float | None = None
        self.sigterm_save = "skipped"
        self.marker_saved: bool | None = None

    # -- the clock and the events -------------------------------------------------------------
    def at(self, t: float, what: str, data: Any = None) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, what, data))

    def advance(self, t: float) -> None:
        if t > self.now:
            self.clock.advance(timedelta(seconds=t - self.now))
            self.now = t

    def draw(self, kind: str, lognormal: Any) -> float:
        return float(lognormal.draw(self.draws.stream(kind)))

    def run(self) -> Outcome:
        self.setup()
        # The preemption comes between one and two periodic saves into the run; the tick at a phase,
        # from three minutes before it (nothing happens to the job before).
        preempted = self.m.every_s * (1 + self.draws.stream("run").random())
        phase = self.draws.stream("tick").uniform(0, self.m.costs.tick_s)
        tick = self.m.costs.tick_s
        self.at(phase + tick * max(0, math.ceil((preempted - 180 - phase) / tick)), "tick")
        self.at(self.m.every_s, "periodic")
        if self.notice_s:
            self.at(preempted, "notice")
        self.at(preempted + self.notice_s, "soft_off")
        while self.events and (self.new is None):
            t, _, what, data = heapq.heappop(self.events)
            if t > preempted + LIMIT_S:
                break
            self.advance(t)
            getattr(self, what)(*(() if data is None else (data,)))
        return self.outcome(preempted)

    def setup(self) -> None:
        """The job submitted, its first VM RUNNING, its trainer started at 0 from nothing."""
        self.store.put(BUCKET, names.spec_key(JOB), spec(self.design))
        for _ in range(4):
            self.engines["tick"].reconcile()
            for i in self.compute.all():
                if i.status == InstanceStatus.STAGING:
                    self.compute.set_status(i.name, InstanceStatus.RUNNING)
        st = self.status()
        assert st.phase == Phase.RUNNING, st.message
        self.old_vm = st.instances[0]
        self.boots[self.old_vm] = 0.0
        self.old = Trainer(self.old_vm, 0.0, 0, self.m.step_s)
        self.record(names.heartbeat_key(JOB), self.old_vm)

    def status(self) -> JobStatus:
        return JobStatus.from_json(self.store.read(BUCKET, names.status_key(JOB)).data)

    # -- the controller's passes --------------------------------------------------------------
    def tick(self) -> None:
        """Cloud Scheduler's minute (the old trainer's agent beat since the last)."""
        if self.old is not None and self.old.stopped_at is None and not self.gone(self.old_vm):
            self.record(names.heartbeat_key(JOB), self.old_vm)
        self.passes += 1
        self.engines["tick"].reconcile()
        self.after_pass()
        self.at(self.now + self.m.costs.tick_s, "tick")

    def event(self, kind: str, function: str = "on_object") -> None:
        """A record's (or a log entry's) event: delivered after Eventarc's delay (and the Log
        Router's, for an audit entry), to an instance that is cold, as often as ``cold_fraction``
        says, the first time this function serves this preemption (later ones follow within
        seconds: its instance is warm)."""
        delay = self.draw(f"deliver {kind}", self.m.costs.eventarc_delay)
        if function == "on_audit":
            delay += self.draw(f"sink {kind}", self.m.costs.sink_delay)
        if function not in self.warm:
            self.warm.add(function)
            if self.draws.stream(f"cold {function}").random() < self.m.costs.cold_fraction:
                delay += self.draw(f"cold start {function}", self.m.costs.cold_start)
        self.at(self.now + delay, "function", function)

    def function(self, name: str) -> None:
        self.passes += 1
        # on_audit's entry only wakes a pass: the cause is Compute's own record of the VM, which the
        # fake Compute holds from the soft-off on (``soft_off``).
        self.engines[name].reconcile(JOB)
        self.after_pass()

    def after_pass(self) -> None:
        """What Compute and the VMs do with what a pass did: a new instance boots; a VM waiting at
        the line whose go came starts its trainer (the agent's long poll answers at once)."""
        for name, received in self.compute.received.items():
            if name not in self.boots:
                self.boots[name] = self.draws.stream("boot").uniform(*self.m.boot)
                self.at(received + self.boots[name], "booted", name)
        for name in sorted(self.waiting):
            md = {} if self.gone(name) else self.metadata(name)
            if not md or md.get("respawn-go") == md.get("respawn-attempt"):
                self.waiting.discard(name)
                if md:
                    self.start(name)

    # -- the VMs ------------------------------------------------------------------------------
    def gone(self, name: str) -> bool:
        return name not in {i.name for i in self.compute.all()}

    def metadata(self, name: str) -> dict[str, str]:
        return self.compute.metadata_of(name)

    def record(self, key: str, vm: str, **extra: Any) -> None:
        """A record as the VM agent writes it: its attempt's token, copied from its metadata at boot (a
        record written in the background may land after a delete of its VM was accepted)."""
        if vm not in self.identity:
            md = self.metadata(vm)
            self.identity[vm] = (int(md["respawn-attempt"]), md["respawn-token"])
        attempt, token = self.identity[vm]
        body = {"instance": vm, "attempt": attempt, "node": 0, "token": token, "at": self.clock.now().isoformat(),
                **extra}
        self.store.write(BUCKET, key, json.dumps(body).encode())

    def booted(self, name: str) -> None:
        if self.gone(name):
            return  # withdrawn or deleted while it booted
        self.compute.set_status(name, InstanceStatus.RUNNING)
        md = self.metadata(name)
        if md.get("respawn-hold") == "1" and md.get("respawn-go") != md.get("respawn-attempt"):
            self.waiting.add(name)
            self.poke(name)
        else:
            self.start(name)

    def poke(self, name: str) -> None:
        """A held VM's ready record, now and every ``respawn-line-poke-s`` while it waits."""
        if name in self.waiting:
            self.at(self.now + self.draw("ready upload", self.m.costs.marker_upload), "ready", name)
            self.at(self.now + self.m.line_poke_s, "poke", name)

    def ready(self, name: str) -> None:
        if name in self.waiting and not self.gone(name):
            self.record(names.ready_key(JOB), name, waiting_since=self.clock.now().isoformat())
            self.event("ready")

    def start(self, name: str) -> None:
        """The replacement's trainer starts, from the checkpoint its metadata names."""
        md = self.metadata(name)
        self.new = Trainer(name, self.now + self.m.start_s, int(md.get("respawn-resume-step") or 0), self.m.step_s)
        self.record(names.heartbeat_key(JOB), name,
                    trainer_started=self.clock.now().strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z")

    # -- the old VM's trainer -----------------------------------------------------------------
    def save(self, t: Trainer, boundary: float, why: str, deadline: float | None) -> bool:
        """A save at ``boundary`` unless its step is saved already or (before ``deadline``) it would
        not land in time: respawnkit's rule, the upload under way counted."""
        step = t.step_at(boundary)
        if any(s == step for s, _, _ in t.saves):
            return False
        ahead = max(0.0, t.uploading_until - boundary)
        if deadline is not None and self.m.save_s + ahead > deadline - boundary:
            return False
        lands = max(boundary, t.uploading_until) + self.m.save_s
        t.uploading_until = lands
        t.saves.append((step, lands, why))
        self.at(lands, "landed", (step, why))
        return True

    def landed(self, what: tuple[int, str]) -> None:
        step, why = what
        if self.hard_off is not None and self.now > self.hard_off:
            return  # cut off: the guest is off, and this save never reached the bucket
        self.store.put(CKPT, f"run/{step}/state.bin", b"w" * 8)
        self.store.put(CKPT, f"run/{step}/commit_success.txt", b"")
        if why == "sigterm":
            self.sigterm_save = "landed"

    def periodic(self) -> None:
        """respawnkit's ``every_s``: a save once that long has passed since the last began (a
        notice's save included)."""
        t = self.old
        assert t is not None
        if t.stopped_at is not None:
            return
        due = max((t.time_of(s) for s, _, _ in t.saves), default=t.started) + self.m.every_s
        if self.now >= due:
            self.save(t, t.boundary_after(self.now), "periodic", None)
            due = self.now + self.m.every_s
        self.at(due, "periodic")

    # -- the preemption -----------------------------------------------------------------------
    def notice(self) -> None:
        """instance/preempted turns TRUE 120 s before the soft-off: the agent's notice record at
        once, then the notice file, which the trainer reads at its next step boundary (a save that
        must land before the hard-off less the script's margin)."""
        assert self.old is not None
        self.at(self.now + self.draw("notice upload", self.m.costs.marker_upload), "notice_record")
        deadline = self.now + self.notice_s + self.m.shutdown_s - self.m.script_margin_s
        self.save(self.old, self.old.boundary_after(self.now), "notice", deadline)

    def notice_record(self) -> None:
        self.record(names.notice_key(JOB), self.old_vm, reason="preempted", notice_s=int(self.notice_s))
        self.event("notice")

    def soft_off(self) -> None:
        """STOPPING, SIGTERM and the shutdown script; Compute's record of the preemption, for
        today's design only once the guest is off."""
        t = self.old
        assert t is not None
        self.soft_off_at, self.hard_off = self.now, self.now + self.m.shutdown_s
        self.compute.set_status(self.old_vm, InstanceStatus.STOPPING)
        if self.design != "serial":
            self.compute.causes_of(self.old_vm).append(StopReason.PREEMPTED)
            self.event("audit", "on_audit")
            if not self.notice_s:  # no notice came before: instance/preempted turns TRUE now
                self.at(self.now + self.draw("notice upload", self.m.costs.marker_upload), "notice_record")
        script_deadline = self.hard_off - self.m.script_margin_s
        boundary = t.boundary_after(self.now)
        if self.save(t, boundary, "sigterm", script_deadline):
            self.sigterm_save = "cut off" if t.uploading_until > self.hard_off else "uploading"
        t.stopped_at = boundary
        # It flushes what is uploading, until the hard-off at most, then exits.
        exited = min(max(boundary, t.uploading_until), self.hard_off)
        self.marker_saved = exited <= script_deadline
        marker = min(exited, script_deadline) + self.draw("marker upload", self.m.costs.marker_upload)
        self.at(marker, "marker")
        halt = self.draw("halt", self.m.costs.poweroff_after_marker)
        self.at(min(max(marker, exited) + halt, self.hard_off), "terminated")

    def marker(self) -> None:
        self.record(names.marker_key(JOB), self.old_vm, reason="preempted", saved=self.marker_saved)
        self.event("marker")

    def terminated(self) -> None:
        if self.gone(self.old_vm):
            return  # deleted by the controller meanwhile
        self.compute.preempt(self.old_vm)
        if self.design == "serial":  # Compute's System Event entry, with its TERMINATED
            self.soft_off_at = self.now
            self.event("audit", "on_audit")

    def outcome(self, preempted: float) -> Outcome:
        old = self.old
        assert old is not None
        last = old.step_at(old.stopped_at if old.stopped_at is not None else self.now)
        if self.new is None:
            return Outcome(self.design, self.index, math.inf, -1, -1, last, math.inf, math.inf, self.sigterm_save,
                           self.marker_saved, self.passes)
        resumed = self.new.resumed
        first_step = self.new.started + self.m.step_s
        return Outcome(self.design, self.index, first_step - old.time_of(resumed), last - resumed, resumed, last,
                       self.boots[self.new.vm], self.compute.received[self.new.vm] - preempted, self.sigterm_save,
                       self.marker_saved, self.passes)


def measure(preemptions: int = 200, seed: int = 1, model: Model = Model()) -> dict[str, list[Outcome]]:
    """Every design over the same ``preemptions`` draws."""
    logging.disable(logging.WARNING)  # the controller's lines, thousands of them
    try:
        return {d: [Recovery(d, i, model, seed).run() for i in range(preemptions)] for d in DESIGNS}
    finally:
        logging.disable(logging.NOTSET)


def percentile(values: list[float], p: float) -> float:
    """Nearest rank, as bench/__main__.py's figures."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def figures(found: dict[str, list[Outcome]], model: Model, seed: int) -> dict[str, Any]:
    """The keys ``make bench`` writes into bench/results.json."""
    out: dict[str, Any] = {
        "boot_model_p50_s": model.boot_p50, "boot_model_range_s": list(model.boot), "save_model_s": model.save_s}
    detail: dict[str, Any] = {}
    for design, outcomes in found.items():
        down = [o.downtime_s for o in outcomes]
        out[f"downtime_{design}_p50_s"] = round(percentile(down, 50), 2)
        out[f"downtime_{design}_p99_s"] = round(percentile(down, 99), 2)
        out[f"steps_lost_{design}_p50"] = percentile([o.steps_lost for o in outcomes], 50)
        detail[design] = {
            "max_s": round(max(down), 2), "steps_lost_max": max(o.steps_lost for o in outcomes),
            "replacement_insert_after_preemption_p50_s": round(percentile(
                [o.insert_after_preemption_s for o in outcomes], 50), 2),
            "sigterm_save": dict(sorted(Counter(o.sigterm_save for o in outcomes).items())),
            "marker_saved": sum(1 for o in outcomes if o.marker_saved),
            "unfinished": sum(1 for d in down if math.isinf(d)),
            "passes": sum(o.passes for o in outcomes)}
    # Issue 34's targets: without a notice the save hides under the boot (boot + 10 s); with the 120 s
    # notice the boot hides under it and the save is what is left (save + 10 s).
    out = beside(out, {"downtime_notice0_p50_s": model.boot_p50 + 10, "downtime_notice120_p50_s": model.save_s + 10})
    out["downtime_detail"] = detail
    out["downtime_model"] = {
        "preemptions": len(found[DESIGNS[0]]), "seed": seed, "step_s": model.step_s,
        "periodic_save_every_s": model.every_s,
        "shutdown_s": model.shutdown_s, "line_poke_s": model.line_poke_s, "tick_s": model.costs.tick_s,
        "boot_drawn_p50_s": round(percentile([o.boot_s for o in found[DESIGNS[0]]], 50), 2),
        "command": "python -m bench.zerogap"}
    out["downtime_note"] = (
        "Modelled (bench/zerogap.py): the real controller (observer, planner, executor; tick, on_object and on_audit "
        "engines) over the in-memory fakes on a fake clock; each preemption's draws (boot uniform 60-120 s, the tick's "
        "phase, the preemption's place between periodic saves, Eventarc's and the Log Router's delays, a cold instance "
        "for the first event of each function at COSTS.cold_fraction, the records' uploads, the guest's halt) the same "
        "in the three designs. Downtime: from the end of the old VM's step that the resumed checkpoint holds to the "
        "end of the new VM's first step. serial: no notice record, no standby, Compute's word only with TERMINATED; "
        "notice0: the notice record at the soft-off; notice120: at the 120 s notice. Not modelled: the controller's "
        "own HTTP latency (notice_to_insert_* measures that path on the local cloud), the trainer's start (imports, "
        "reading the checkpoint: the same in every design), stockouts and quota, notices that come to nothing. The "
        "SIGTERM save is skipped, as respawnkit does, when a periodic save's upload under way leaves it no time: "
        "downtime_detail.*.sigterm_save; steps lost then count from that periodic save.")
    return out


def scenario(run: Any) -> dict[str, Any]:
    """``make bench``'s: 200 preemptions (4 in a smoke run), the model's own clock."""
    model = Model()
    return figures(measure(4 if run.quick else 200, run.seed, model), model, run.seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.zerogap", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preemptions", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--save-s", type=float, default=Model.save_s, help="the save's duration (write and upload)")
    parser.add_argument("--out", type=Path, help="write the run here (default: bench/runs/zerogap-<UTC>.json)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    head, started = provenance(seeds={"zerogap": args.seed}), time.perf_counter()
    model = Model(save_s=args.save_s)
    found = figures(measure(args.preemptions, args.seed, model), model, args.seed)
    print(json.dumps(found, indent=1))
    if not args.no_write:
        print(f"written: {alone('zerogap', found, head, time.perf_counter() - started, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
