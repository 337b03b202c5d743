"""One policy over one trace: a discrete-event simulation of a week of the fleet.

Everything happens at simulated times from one heap: the controller's passes (ticks,
events, or a baseline's loop), the VMs' lives (boot, the preemption notice, the hard-off),
the trainers' saves, and the zones' stockouts. The clock is a ``FakeClock`` set to each
entry's time before it runs, so every object the fakes hold is stamped with simulated time.

The VMs live in ``MemoryCompute`` whoever the controller is: respawn's policies run the
real observer, planner and executor (``controller.service.engine.Engine``) over the fakes; the
baselines are modelled here in a few lines each and insert and delete through the same
fake. After every controller step ``sync`` reads what exists in the fake and starts the
simulated VM of each new instance (its lifetime, boot and notice drawn from the job's
stream) and ends the one of each instance that was deleted.

The trainer (``Vm``): trains only once its VM booted; resumes from the step its metadata
names (``respawn-resume-step``; the training seconds done are the step); trains ``τ``,
then saves for ``C`` seconds: the step directory's data object first, its
``commit_success.txt`` ``C`` seconds later (an orbax-style save, complete when the marker
lands), keeping the newest ``keep_checkpoints`` saves. ``τ`` is the policy's: the
controller's advice (``respawn-checkpoint-every-s``), a fixed 30 minutes, or the Young/Daly
interval the sim computes from the zones' mean lifetime and ``C``. At the preemption notice
(``L`` after the VM's creation) training stops; a save under way completes if it can land
before the hard-off (``notice_s`` later) less ``marker_margin_s``, and everything since the
last complete save is lost. From the notice the instance is STOPPING, no longer RUNNING,
but still billed until the hard-off (Google bills a VM until it is STOPPED or TERMINATED). A VM that did not miss the notice and whose agent is up writes the preemption marker
once the trainer exited (at once, or after that last save); the event function, where the
policy has one, runs an event delay later (drawn per event: ``Fleet.event_delay``). At the hard-off a VM still there becomes
TERMINATED (Compute records the preemption).
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from controller.core import errors, names
from controller.adapters.memory import MemoryAdvisor, MemoryCompute, MemoryStore
from controller.service.advice import AdviceCache
from controller.core.clock import FakeClock
from controller.service.engine import Engine, Summary
from controller.service.executor import Executor
from controller.core.launch import LaunchContext
from controller.service.observe import Observer
from controller.core.policy import ControllerPolicy
from controller.core.ports import InstanceRequest, InstanceStatus
from controller.core.state import JobStatus, Phase

from sim.advice import GoogleLikeAdvisor
from sim.model import Params, Trace, best_interval, young_daly

BUCKET, CKPT_BUCKET, PROJECT = "respawn-sim", "sim-ckpts", "sim-proj"
TRAINER = f"trainer@{PROJECT}.iam.gserviceaccount.com"
MACHINE = "a2-highgpu-1g"  # one A100 built in
START = datetime(2026, 1, 5, tzinfo=UTC)
INTERVAL_KEY = "respawn-checkpoint-every-s"
Z99 = 2.3263478740408408  # the standard normal's 99th percentile

# name -> (controller, checkpoint interval source, events on)
POLICIES: dict[str, tuple[str, str, bool]] = {
    "respawn": ("engine", "advice", True),
    "respawn-tick-only": ("engine", "sim", False),
    "respawn-young-daly": ("engine", "sim", True),
    "respawn-fixed-30m": ("engine", "fixed", True),
    "respawn-optimal": ("engine", "optimal", True),
    "poll-15s": ("poll", "sim", False),
    "mig-same-zone": ("mig", "sim", False),
    "mig-regional": ("migregional", "sim", False),
    "skypilot": ("skypilot", "sim", False),
    "ideal": ("ideal", "optimal", False),
    "best-zone-wait": ("bestzone", "optimal", False),
}
# The ceiling's checks: policies that see the trace's truth (each zone's true mean lifetime, live
# stockouts) by construction, whatever the advice. Never in the headline.
REFERENCE_POLICIES = ("ideal", "best-zone-wait")
DESCRIPTIONS = {
    "respawn": "events + 1-min tick, capacity placement; trainer follows the controller's interval",
    "respawn-tick-only": "1-min tick only (no events); trainer on the baselines' Young/Daly interval",
    "respawn-young-daly": "respawn's controller; trainer on the baselines' Young/Daly interval (from the zones' "
                          "published uptime)",
    "respawn-fixed-30m": "events + tick; trainer saves every 30 min",
    "respawn-optimal": "respawn's controller; trainer on each zone's best fixed interval (an oracle: true lifetimes)",
    "poll-15s": "an idealised poller, a floor no poller reaches: reads Compute every 15 s, sees STOPPING at the "
                "notice, relaunches at once with one insert (same zone first, then the others; a minute later when "
                "all are out)",
    "mig-same-zone": "zonal MIG: recreates the VM in its one zone, no failover",
    "skypilot": "SkyPilot's managed jobs as its code has them: a 15 s check that trusts a RUNNING job, the loss "
                "seen when its status fetch times out (30 s), terminate first, then a whole launch (zones in "
                "catalog order, the lost one not excluded), 60-300 s backoff when all are out",
    "mig-regional": "regional MIG (shape ANY): recreates the VM in its zone, else in another zone of the region with "
                    "capacity",
    "ideal": "the ceiling's policy, simulated on the same draws: at the notice, a new VM in the best available zone; "
             "per-zone optimal interval",
    "best-zone-wait": "oracle: only the zone with the longest true mean lifetime, waits out its stockouts; "
                      "its optimal interval (goodput counts no waiting: this is what the bound is about)",
    "ceiling": "upper bound: the best zone's best expected goodput over every save schedule (analytic)",
}


class SimClock(FakeClock):
    def set(self, seconds: float) -> None:
        with self._lock:
            self._now = START + timedelta(seconds=round(seconds, 6))


@dataclass
class Vm:
    """One instance's life, and the trainer on it."""

    job: str
    name: str
    iid: str
    zone: str
    index: int  # the job's n-th VM (its draws)
    created: float
    lifetime: float  # creation -> the preemption notice
    boot: float
    misses_notice: bool
    resume_step: int
    interval: float
    interval_source: str  # controller | sim | fixed
    token: str
    attempt: int
    ended: float | None = None  # no longer paid from here (hard-off, or deleted)
    end_cause: str = ""
    stopped: bool = False  # the notice came: no more training
    started: float | None = None  # the trainer began training
    saving: tuple[int, float] | None = None  # (step, done at) of the save under way
    generation: int = 0  # bumps on every change of plan: stale heap entries are ignored

    @property
    def notice(self) -> float:
        return self.created + self.lifetime


@dataclass
class JobState:
    name: str
    vms: int = 0  # VMs started so far (index of the next draw)
    committed: int = 0  # training seconds in the newest complete save
    saves: list[int] = field(default_factory=list)  # complete saves' steps, oldest first
    partial: set[int] = field(default_factory=set)  # step dirs without their marker
    finished: float | None = None  # when the newest complete save first held train_h of training
    losses: list[float] = field(default_factory=list)  # loss times waiting for a replacement
    recoveries: list[float] = field(default_factory=list)  # loss -> replacement RUNNING
    resumes: list[float] = field(default_factory=list)  # loss -> trainer training again
    pending_resume: list[float] = field(default_factory=list)


@dataclass
class Counters:
    preemptions: int = 0
    markers: int = 0
    missed_notice: int = 0
    no_agent_yet: int = 0
    saves: int = 0
    saves_cut: int = 0
    capacity_errors: int = 0
    vms: int = 0
    deleted_alive: int = 0  # VMs a controller deleted before their notice
    interval_controller: int = 0
    interval_sim: int = 0
    interval_fixed: int = 0
    interval_optimal: int = 0
    passes_tick: int = 0
    passes_skipped: int = 0
    passes_event: int = 0
    pass_errors: int = 0


class Fleet:
    def __init__(self, trace: Trace, policy: str, *, skip_ticks: bool = True, verify_skips: bool = False) -> None:
        self.trace = trace
        self.p: Params = trace.params
        self.policy = policy
        self.kind, self.interval_mode, self.events = POLICIES[policy]
        self.skip_ticks = skip_ticks
        self.verify_skips = verify_skips
        self.clock = SimClock(START)
        self.store = MemoryStore(self.clock)
        self.compute = MemoryCompute(self.clock)
        self.now = 0.0
        self.advisor: MemoryAdvisor | GoogleLikeAdvisor
        if self.p.advice == "as-google-gives":  # the headline: sim/advice.py
            self.advisor = GoogleLikeAdvisor(trace, lambda: self.now)
        else:
            self.advisor = MemoryAdvisor(self.compute, regions=sorted({z.rsplit("-", 1)[0] for z in trace.zones}))
            if self.p.advice == "oracle":
                # "If advice were perfect": each zone's true mean lifetime as its Spot estimated
                # uptime (every Spot VM that stops here is preempted: a preemption rate of 1), and
                # obtainability 0 exactly while the fake is stocked out.
                self.advisor.uptimes.update({n: z.mean_s for n, z in trace.zones.items()})
                self.advisor.rates.update({n: 1.0 for n in trace.zones})
            elif self.p.advice == "obtainability":  # live stockouts only: no Spot uptime or rate
                self.advisor.spot_estimates = False
            else:
                raise ValueError(f"unknown advice: {self.p.advice!r}")
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.vms: dict[tuple[str, str], Vm] = {}
        self.alive: dict[tuple[str, str], Vm] = {}  # not ended yet
        self.jobs = {name: JobState(name) for name in trace.jobs}
        self.n = Counters()
        # The baselines' interval: Young/Daly from the lifetime figure a user has. With advice as
        # Google gives it, that is the mean of the zones' estimatedUptime at the start (a noisy
        # median); only the oracle runs (and the legacy obtainability-only run) get the true mean.
        if isinstance(self.advisor, GoogleLikeAdvisor):
            published = sum(self.advisor.uptime(z, 0.0) for z in trace.zones) / len(trace.zones)
        else:
            published = trace.mean_lifetime_s
        self.sim_interval = young_daly(self.p.checkpoint_cost_s, published)
        self.optimal = {n: best_interval(z, self.p)[0] for n, z in trace.zones.items()} \
            if self.interval_mode == "optimal" else {}
        self.tokens = random.Random(f"tokens-{self.p.seed}")
        self.delays = random.Random(f"event-delays-{self.p.seed}")
        self.errors: list[str] = []
        self.dirty = True
        self.engine: Engine | None = None
        self.baseline: Baseline | None = None

    # -- the heap -------------------------------------------------------------------------------
    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn, args))

    def run(self) -> dict[str, Any]:
        p = self.p
        for zone in self.trace.zones.values():
            for a, b in zone.stockouts:
                if a < p.horizon_s:
                    self.at(max(a, 0.0), self._stockout, zone.name, True)
                    self.at(b, self._stockout, zone.name, False)
        if self.kind == "engine":
            self._start_engine()
        else:
            self.baseline = {"poll": PollLoop, "mig": MigLike, "migregional": MigRegional, "skypilot": SkyPilot,
                             "ideal": Ideal, "bestzone": BestZoneWait}[self.kind](self)
            self.baseline.start()
        while self._heap and self._heap[0][0] <= p.horizon_s:
            t, _, fn, args = heapq.heappop(self._heap)
            self.now = t
            self.clock.set(t)
            fn(*args)
        self.now = p.horizon_s
        self.clock.set(p.horizon_s)
        return self.results()

    # -- zones ----------------------------------------------------------------------------------
    def _stockout(self, zone: str, on: bool) -> None:
        (self.compute.stockouts.add if on else self.compute.stockouts.discard)(zone)
        self.dirty = True

    # -- respawn: the real engine ---------------------------------------------------------------
    def _start_engine(self) -> None:
        policy = ControllerPolicy(default_project=PROJECT, trainer_service_account=TRAINER)
        observer = Observer(self.store, self.compute, BUCKET, policy, advisor=self.advisor)
        observer.advice = AdviceCache(self.advisor, timer=lambda: self.now)  # its TTLs in simulated time
        ctx = LaunchContext(bucket=BUCKET, default_project=PROJECT, startup_script="#!/bin/bash\n",
                            shutdown_script="#!/bin/bash\n",
                            new_token=lambda: f"tok-{self.tokens.getrandbits(64):016x}")
        self.engine = Engine(observer, Executor(self.store, self.compute, BUCKET), ctx, self.clock)
        for job, jt in self.trace.jobs.items():
            doc = {
                "zones": list(jt.zones),
                "machine_type": MACHINE,
                "provisioning": "spot",
                "placement": "capacity",
                "command": "python train.py",
                "checkpoint": {"uri": f"gs://{CKPT_BUCKET}/{job}/run", "format": "orbax"},
                # The sim models no hangs (a trainer here never stops beating unless its VM goes),
                # so hang detection is off and the trainer writes no heartbeats; nothing else
                # in the spec acts on time (no max_instance_age, no max_runtime).
                "policy": {"max_restarts": 1_000_000, "idle_timeout": None},
            }
            self.store.write(BUCKET, names.spec_key(job), json.dumps(doc).encode())
            if self.events:
                self.at(self.event_delay(), self._event, job)
        t = 0.0
        while t <= self.p.horizon_s:
            self.at(t, self._tick)
            t += self.p.tick_s

    def event_delay(self) -> float:
        """One event's delay: lognormal through the bench's measured p50 and p99 (``Params``), drawn
        from the trace's own stream (the same delays, in order, under every policy with events)."""
        p50, p99 = self.p.event_delay_p50_s, self.p.event_delay_p99_s
        sigma = math.log(p99 / p50) / Z99 if p99 > p50 > 0 else 0.0
        return p50 * math.exp(sigma * self.delays.gauss(0.0, 1.0)) if p50 > 0 else 0.0

    def _tick(self) -> None:
        assert self.engine is not None
        if self.skip_ticks and not self.dirty:
            self.n.passes_skipped += 1
            if self.verify_skips:
                dry = self.engine.reconcile(dry_run=True)
                acted = {j: a for j, a in dry.jobs.items() if a}
                if acted or dry.errors:
                    raise AssertionError(f"a skipped tick at {self.now:.0f}s would act: {acted or dry.errors}")
            return
        self.n.passes_tick += 1
        summary = self._pass(None)
        self.dirty = _acted(summary) or not self._steady()

    def _event(self, job: str) -> None:
        self.n.passes_event += 1
        summary = self._pass(job)
        if _acted(summary):
            self.dirty = True

    def _pass(self, job: str | None) -> Summary:
        assert self.engine is not None
        summary = self.engine.reconcile(job)
        for key, why in summary.errors.items():
            if "CapacityError" in why or "QuotaError" in why:
                self.n.capacity_errors += 1  # a stockout met by an insert: the next zone is tried
            else:
                self.n.pass_errors += 1
                if len(self.errors) < 20:
                    self.errors.append(f"{self.now:.0f}s {key}: {why}")
        self.sync()
        self.store.calls.clear()
        self.compute.calls.clear()
        return summary

    def _steady(self) -> bool:
        """Whether a tick could do nothing until the world changes: every job RUNNING, not
        settling nor backing off, with its one VM RUNNING and no record left to read. With
        the sim's spec (no hang detection, no instance age, no deadline) no planner rule then
        acts on time alone; ``verify_skips`` checks that every skipped tick would not act."""
        by_job: dict[str | None, list[Any]] = {}
        for inst in self.compute.all():
            by_job.setdefault(inst.job, []).append(inst)
        for job in self.jobs:
            if self.store.exists(BUCKET, names.marker_key(job)) or self.store.exists(BUCKET, names.exit_key(job)):
                return False
            try:
                st = JobStatus.from_json(self.store.read(BUCKET, names.status_key(job)).data)
            except errors.NotFound:
                return False
            if st.phase != Phase.RUNNING or st.settling or st.not_before is not None:
                return False
            mine = by_job.get(job, [])
            if len(mine) != 1 or mine[0].attempt != st.attempt or mine[0].status != InstanceStatus.RUNNING:
                return False
        return True

    # -- the VMs ----------------------------------------------------------------------------------
    def sync(self) -> None:
        """Start the simulated VM of every new instance; end the one of every deleted instance."""
        present = {}
        for inst in self.compute.all():
            key = (inst.name, inst.id)
            present[key] = inst
            if key not in self.vms:
                self._new_vm(inst)
        for key, vm in list(self.alive.items()):
            if key not in present:
                self._end(vm, "deleted")

    def _new_vm(self, inst: Any) -> None:
        job = inst.job
        js = self.jobs[job]
        meta = dict(self.compute.request_of(inst.name).metadata)
        draw = self.trace.jobs[job].vm(js.vms, self.p)
        zone = self.trace.zones[inst.zone]
        created = (inst.created_at - START).total_seconds()
        interval, source = self._interval(meta, inst.zone)
        step = meta.get("respawn-resume-step", "")
        extra = self.baseline.launch_s if self.baseline is not None else 0.0  # its launch path beyond the boot
        vm = Vm(job, inst.name, inst.id, inst.zone, js.vms, created, zone.lifetime(draw.u, self.p.weibull_k),
                draw.boot_s + extra, draw.misses_notice, int(step) if step else 0, interval, source,
                meta.get("respawn-token", ""), int(meta.get("respawn-attempt") or 0))
        js.vms += 1
        self.n.vms += 1
        self.vms[(inst.name, inst.id)] = vm
        self.alive[(inst.name, inst.id)] = vm
        for lost in js.losses:
            js.recoveries.append(vm.created - lost)
        js.pending_resume.extend(js.losses)
        js.losses.clear()
        self.at(vm.created + vm.boot, self._booted, vm, vm.generation)
        self.at(vm.notice, self._notice, vm)
        self.at(vm.notice + self.p.notice_s, self._hard_off, vm)

    def _interval(self, meta: dict[str, str], zone: str) -> tuple[float, str]:
        if self.interval_mode == "optimal":
            self.n.interval_optimal += 1
            return self.optimal[zone], "optimal"
        if self.interval_mode == "fixed":
            self.n.interval_fixed += 1
            return self.p.fixed_interval_s, "fixed"
        if self.interval_mode == "advice" and (value := meta.get(INTERVAL_KEY, "")):
            try:
                seconds = float(value)
            except ValueError:
                seconds = 0.0
            if seconds > 0:
                self.n.interval_controller += 1
                return seconds, "controller"
        self.n.interval_sim += 1
        return self.sim_interval, "sim"

    def _booted(self, vm: Vm, generation: int) -> None:
        if vm.ended is not None or vm.stopped or generation != vm.generation:
            return
        vm.started = self.now
        js = self.jobs[vm.job]
        for lost in js.pending_resume:
            js.resumes.append(self.now - lost)
        js.pending_resume.clear()
        self._next_save(vm, vm.resume_step, self.now)

    def _next_save(self, vm: Vm, step: int, since: float) -> None:
        """Train ``interval`` from ``since`` (at ``step``), then save."""
        tau = max(1, round(vm.interval))
        self.at(since + tau, self._save_start, vm, step + tau, vm.generation)

    def _save_start(self, vm: Vm, step: int, generation: int) -> None:
        if vm.ended is not None or vm.stopped or generation != vm.generation:
            return
        self.store.write(CKPT_BUCKET, f"{vm.job}/run/{step}/state.bin", b"w" * 64)
        self.jobs[vm.job].partial.add(step)
        done = self.now + self.p.checkpoint_cost_s
        vm.saving = (step, done)
        self.at(done, self._save_done, vm, step, generation)

    def _save_done(self, vm: Vm, step: int, generation: int) -> None:
        if generation != vm.generation or vm.saving is None or vm.saving[0] != step:
            return
        if vm.ended is not None and vm.ended < self.now:
            return
        if vm.stopped and self.now > vm.notice + self.p.notice_s - self.p.marker_margin_s:
            return
        vm.saving = None
        js = self.jobs[vm.job]
        self.store.write(CKPT_BUCKET, f"{vm.job}/run/{step}/commit_success.txt", b"")
        self.n.saves += 1
        js.partial.discard(step)
        js.committed = max(js.committed, step)
        if js.finished is None and js.committed >= self.p.train_h * 3600:
            js.finished = self.now
        if step not in js.saves:
            js.saves.append(step)
            js.saves.sort()
        self._prune(js)
        if not vm.stopped:
            self._next_save(vm, step, self.now)
        else:
            self._marker(vm)  # the trainer waited for this save, and exits now

    def _prune(self, js: JobState) -> None:
        keep = self.p.keep_checkpoints
        old = js.saves[:-keep] if keep > 0 else []
        js.saves = js.saves[-keep:] if keep > 0 else js.saves
        newest = js.saves[-1] if js.saves else 0
        stale = [s for s in js.partial if s < newest]
        for step in [*old, *stale]:
            prefix = f"{js.name}/run/{step}/"
            for info in self.store.list(CKPT_BUCKET, prefix):
                self.store.delete(CKPT_BUCKET, info.name)
            js.partial.discard(step)

    def _notice(self, vm: Vm) -> None:
        """Compute reclaims the VM: the notice (soft-off); the hard-off follows ``notice_s`` later."""
        if vm.ended is not None:
            return
        vm.stopped = True
        js = self.jobs[vm.job]
        js.losses.append(self.now)
        self.n.preemptions += 1
        try:
            self.compute.set_status(vm.name, InstanceStatus.STOPPING)  # no longer RUNNING: no longer paid
        except KeyError:
            pass
        self.dirty = True
        deadline = vm.notice + self.p.notice_s - self.p.marker_margin_s
        if vm.saving is not None and vm.saving[1] > deadline:
            vm.saving = None  # cannot land before the hard-off
            self.n.saves_cut += 1
        if isinstance(self.baseline, Ideal):
            self.baseline.noticed(vm)
        if vm.misses_notice:
            self.n.missed_notice += 1
            return
        if vm.started is None:
            self.n.no_agent_yet += 1  # still booting: the agent is not up to write a marker
            return
        if vm.saving is None:
            self._marker(vm)  # the trainer exits at once (a save of C seconds cannot land in time)

    def _marker(self, vm: Vm) -> None:
        if vm.ended is not None or vm.misses_notice:
            return
        self.n.markers += 1
        body = {"instance": vm.name, "attempt": vm.attempt, "node": 0, "at": self.clock.now().isoformat(),
                "reason": "preempted", "saved": True}
        if vm.token:
            body["token"] = vm.token
        self.store.write(BUCKET, names.marker_key(vm.job), json.dumps(body).encode())
        self.dirty = True
        if self.events and self.kind == "engine":
            self.at(self.now + self.event_delay(), self._event, vm.job)

    def _hard_off(self, vm: Vm) -> None:
        if vm.ended is not None:
            return
        try:
            self.compute.preempt(vm.name)  # TERMINATED, the preemption recorded
        except KeyError:
            pass
        self.dirty = True
        self._end(vm, "preempted")

    def _end(self, vm: Vm, cause: str) -> None:
        vm.ended, vm.end_cause = self.now, cause
        self.alive.pop((vm.name, vm.iid), None)
        vm.generation += 1
        if cause == "deleted" and not vm.stopped:
            self.n.deleted_alive += 1
            vm.stopped = True

    # -- results ----------------------------------------------------------------------------------
    def results(self) -> dict[str, Any]:
        p = self.p
        horizon = p.horizon_s
        paid = sum(self.billed(vm, horizon) for vm in self.vms.values())
        # The fixed amount of training (train_h): when each job's newest complete save first held
        # it, and what its VMs were billed until then. A job that never got there within the
        # horizon counts the horizon (a lower bound: "censored").
        price = p.price_gpu_h * p.gpus_per_vm / 3600
        finish = {job: js.finished for job, js in self.jobs.items()}
        by_job: dict[str, float] = dict.fromkeys(self.jobs, 0.0)
        for vm in self.vms.values():
            by_job[vm.job] += self.billed(vm, finish[vm.job] if finish[vm.job] is not None else horizon)
        unfinished = [job for job, t in finish.items() if t is None]
        times = [t if t is not None else horizon for t in finish.values()]
        useful = float(sum(js.committed for js in self.jobs.values()))
        recoveries = [r for js in self.jobs.values() for r in js.recoveries]
        resumes = [r for js in self.jobs.values() for r in js.resumes]
        paid_h, useful_h = paid / 3600 * p.gpus_per_vm, useful / 3600 * p.gpus_per_vm
        cost = paid_h * p.price_gpu_h
        intervals = [vm.interval for vm in self.vms.values()]
        out = {
            "goodput": useful / paid if paid > 0 else 0.0,
            "recovery_p50_s": quantile(recoveries, 0.5),
            "recovery_p99_s": quantile(recoveries, 0.99),
            "resume_p50_s": quantile(resumes, 0.5),
            "resume_p99_s": quantile(resumes, 0.99),
            "accelerator_hours_paid": paid_h,
            "accelerator_hours_useful": useful_h,
            "accelerator_hours_lost": paid_h - useful_h,
            "cost": cost,
            "cost_per_useful_accelerator_hour": cost / useful_h if useful_h else None,
            "training_share": useful / (horizon * len(self.jobs)),
            "time_to_train_h": sum(times) / len(times) / 3600,
            "usd_per_job": sum(by_job.values()) / len(by_job) * price,
            "jobs_unfinished": len(unfinished),
            "time_to_train_per_job_h": {job: t / 3600 for job, t in zip(finish, times)},
            "losses": sum(len(js.recoveries) + len(js.losses) for js in self.jobs.values()),
            "unrecovered_at_end": sum(len(js.losses) for js in self.jobs.values()),
            "mean_interval_s": sum(intervals) / len(intervals) if intervals else None,
            "counters": dataclasses.asdict(self.n),
            "errors": self.errors[:20],
            # raw, for pooling over seeds
            "paid_s": paid,
            "useful_s": useful,
            "recoveries_s": recoveries,
            "resumes_s": resumes,
        }
        if self.engine is not None:
            out["controller_ledger"] = self._ledger()
        return out

    def billed(self, vm: Vm, until: float) -> float:
        """Seconds Google bills ``vm`` up to ``until``: from its insert (boot included) until it is
        STOPPED or TERMINATED. A preempted VM is billed through its notice to the hard-off, whatever
        a controller does meanwhile; one a controller deleted before any notice, until the delete."""
        if vm.ended is not None and vm.ended < vm.notice:
            end = vm.ended
        else:
            end = vm.notice + self.p.notice_s
        return max(0.0, min(end, until) - vm.created)

    def _ledger(self) -> dict[str, Any] | None:
        """What the controller's own goodput ledger says (where this version has one)."""
        try:
            from controller.core import ledger  # noqa: PLC0415 - optional: the ledger may not exist
        except ImportError:
            return None
        paid = useful = 0.0
        for job in self.jobs:
            try:
                st = JobStatus.from_json(self.store.read(BUCKET, names.status_key(job)).data)
                s = ledger.summary(st.ledger, self.clock.now())
            except Exception as e:  # noqa: BLE001 - a report, never the sim's failure
                return {"error": f"{type(e).__name__}: {e}"}
            paid += s.accelerator_hours
            useful += s.useful_hours
        return {"goodput": useful / paid if paid else None, "accelerator_hours": paid, "useful_hours": useful}


def _acted(summary: Summary) -> bool:
    return any(summary.jobs.values()) or bool(summary.errors)


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


# -- the modelled baselines ------------------------------------------------------------------------

class Baseline:
    """A controller modelled in the sim: it inserts and deletes through the same fake Compute,
    passes the latest complete save to its trainer (which would find it itself) and the sim's
    Young/Daly interval (the best fixed interval a user could compute from the zones' figures).
    A VM counts as lost as soon as it is no longer RUNNING (STOPPING at the notice), which is the
    earliest a status poll could tell."""

    check_s = 60.0
    launch_s = 0.0  # the trainer starts this long after the VM's boot (a launch path of its own)

    def __init__(self, fleet: Fleet) -> None:
        self.f = fleet
        self.attempt = dict.fromkeys(fleet.jobs, 0)
        self.zone = {job: jt.zones[0] for job, jt in fleet.trace.jobs.items()}
        self.live: dict[str, str | None] = dict.fromkeys(fleet.jobs)  # job -> its VM's name
        self.busy: set[str] = set()  # jobs waiting to relaunch

    def start(self) -> None:
        for job in self.f.jobs:
            self.launch(job)
        t = self.check_s
        while t <= self.f.p.horizon_s:
            self.f.at(t, self.check)
            t += self.check_s

    def zones_to_try(self, job: str) -> list[str]:
        raise NotImplementedError

    def check(self) -> None:
        for job, name in self.live.items():
            if name is None or job in self.busy:
                continue
            inst = next((i for i in self.f.compute.live(job) if i.name == name), None)
            if inst is None:
                self.lost(job)

    def lost(self, job: str) -> None:
        raise NotImplementedError

    def launch(self, job: str) -> None:
        f = self.f
        self.busy.discard(job)
        if (old := self.live.get(job)) is not None:
            try:
                zone = next(i.zone for i in f.compute.all() if i.name == old)
                f.compute.delete(PROJECT, zone, old)
            except (StopIteration, errors.NotFound):
                pass
            self.live[job] = None
        for zone in self.zones_to_try(job):
            self.attempt[job] += 1
            name = names.instance_name(job, self.attempt[job])
            try:
                f.compute.insert([self.request(job, name, zone)], f"{name}-{zone}")
            except (errors.CapacityError, errors.QuotaError):
                f.n.capacity_errors += 1
                continue
            self.live[job], self.zone[job] = name, zone
            f.sync()
            return
        self.busy.add(job)
        self.retry(job)

    def retry(self, job: str) -> None:
        """Every zone tried was out of capacity: launch again later."""
        self.f.at(self.f.now + self.f.p.retry_s, self.launch, job)

    def request(self, job: str, name: str, zone: str) -> InstanceRequest:
        f = self.f
        return InstanceRequest(
            project=PROJECT, zone=zone, name=name, machine_type=MACHINE, provisioning="spot",
            termination_action="stop", boot_image="projects/debian-cloud/global/images/family/debian-12",
            boot_disk_gb=100, boot_disk_type="pd-balanced", service_account=TRAINER, scopes=(), network="default",
            subnetwork=None, external_ip=True,
            labels={names.MANAGED_LABEL: "true", names.JOB_LABEL: job, names.ATTEMPT_LABEL: str(self.attempt[job])},
            metadata={"respawn-attempt": str(self.attempt[job]),
                      "respawn-resume-step": str(f.jobs[job].committed) if f.jobs[job].committed else ""})


class PollLoop(Baseline):
    """The peers' managed-jobs loop (SkyPilot's): poll every 15 s; on a lost VM relaunch after
    ``poll_wait_s`` (0: at once, as SkyPilot recovers), the same zone first, then the job's
    other zones; every zone out: try again ``retry_s`` later (SkyPilot's 60 s gap after a
    failed launch)."""

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(fleet)
        self.check_s = fleet.p.poll_s

    def lost(self, job: str) -> None:
        self.busy.add(job)
        self.f.at(self.f.now + self.f.p.poll_wait_s, self.launch, job)

    def zones_to_try(self, job: str) -> list[str]:
        here = self.zone[job]
        return [here, *(z for z in self.f.trace.jobs[job].zones if z != here)]


class MigLike(Baseline):
    """A managed instance group of one Spot VM in one zone: a stopped VM is noticed within a
    minute and recreated there; out of capacity, it tries again a minute later."""

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(fleet)
        self.check_s = fleet.p.mig_check_s

    def lost(self, job: str) -> None:
        self.launch(job)

    def zones_to_try(self, job: str) -> list[str]:
        return [self.f.trace.jobs[job].zones[0]]


class MigRegional(MigLike):
    """A regional managed instance group of one Spot VM, target distribution shape ANY (Google's
    recommendation for batch work: "the group picks zones for creating VM instances ... within
    present resource constraints"), over the zones of the job's first zone's region: a stopped
    VM is noticed within ``mig_check_s`` (Google publishes no repair delay; the sim's choice) and
    recreated in its zone, or where that zone is out of capacity, in another of the region's zones
    that has it (in the spec's order: the group knows no lifetimes); every zone out, it tries again
    ``retry_s`` later. The sim's reading of the shape: Google documents no repair order."""

    def zones_to_try(self, job: str) -> list[str]:
        region = self.zone[job].rsplit("-", 1)[0]
        here = self.zone[job]
        return [here, *(z for z in self.f.trace.jobs[job].zones if z != here and z.rsplit("-", 1)[0] == region)]


class SkyPilot(Baseline):
    """SkyPilot's managed-jobs controller (sky/jobs/controller.py ``_monitor_one_task``,
    sky/jobs/recovery_strategy.py ``EagerFailoverStrategyExecutor``, the default
    EAGER_NEXT_REGION), as its code has it:

    - every ``skypilot_poll_s`` it fetches the job's status from the cluster; a single-node job
      that reports itself running is healthy, and the cloud is not asked. Through the preemption
      notice the guest still answers (the sim's reading: the notice is ACPI shutdown, its job
      running until the hard-off); SkyPilot does nothing at the notice. From the hard-off the VM
      is gone (SkyPilot launches GCP Spot VMs with instanceTerminationAction DELETE: its address no
      longer answers), so the fetch fails at its ``skypilot_fetch_timeout_s`` cap, the cloud is
      asked (not UP: preempted), and recovery starts at once;
    - recovery terminates the cluster first (the VM is already gone), then runs a whole launch:
      the cheapest region (one here), its zones one at a time in the catalog's order, the zone
      just lost not excluded (the exclusion's check is dead code upstream: skypilot issue
      #10021); the trainer starts ``skypilot_launch_s`` after the VM's boot (SSH, runtime and Ray
      start, the job's submission and its 5 s start poll);
    - every zone out: the job waits ``skypilot_retry_s``, x1.6 per further failure up to 300 s,
      each with +-40 % jitter compounding (common_utils.Backoff), and launches again;
    - the relaunched job runs its command from the start: the trainer resumes from its newest
      complete save (SkyPilot has no checkpoint logic: the user's script finds it)."""

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(fleet)
        self.check_s = fleet.p.skypilot_poll_s
        self.launch_s = fleet.p.skypilot_launch_s
        self.backoff: dict[str, float] = {}
        self.jitter = random.Random(f"skypilot-{fleet.p.seed}")

    def check(self) -> None:
        for job, name in self.live.items():
            if name is None or job in self.busy:
                continue
            inst = next((i for i in self.f.compute.all() if i.name == name), None)
            if inst is None or inst.status in (InstanceStatus.TERMINATED, InstanceStatus.STOPPED):
                self.busy.add(job)  # the fetch times out; then the cloud says it is not UP
                self.f.at(self.f.now + self.f.p.skypilot_fetch_timeout_s, self.launch, job)

    def zones_to_try(self, job: str) -> list[str]:
        return sorted(self.f.trace.jobs[job].zones)

    def launch(self, job: str) -> None:
        super().launch(job)
        if self.live.get(job) is not None:
            self.backoff.pop(job, None)  # launched: the next outage starts from the first gap

    def retry(self, job: str) -> None:
        gap = min(300.0, self.backoff.get(job, self.f.p.skypilot_retry_s / 1.6) * 1.6)
        gap *= 1 + self.jitter.uniform(-0.4, 0.4)  # added to the stored value: the jitter compounds
        self.backoff[job] = gap
        self.f.at(self.f.now + gap, self.launch, job)


class Ideal(Baseline):
    """The ceiling's policy on the same draws: told at the notice (missed or not), it deletes the
    VM (once a save under way has landed) and creates the next one at once in the zone with
    the longest mean lifetime that has capacity; its trainer saves on that zone's optimal
    interval. With no zone available it waits for the first to come back."""

    def start(self) -> None:
        for job in self.f.jobs:
            self.launch(job)

    def noticed(self, vm: Vm) -> None:
        landing = vm.saving[1] if vm.saving is not None else self.f.now
        self.f.at(landing, self.launch, vm.job)

    def zones_to_try(self, job: str) -> list[str]:
        zones = self.f.trace.zones
        return sorted((z for z in zones if z not in self.f.compute.stockouts), key=lambda z: -zones[z].mean_s)

    def launch(self, job: str) -> None:
        f = self.f
        if self.zones_to_try(job):
            super().launch(job)
            return
        self._wait_out(job, min(b for z in f.trace.zones.values() for a, b in z.stockouts if a <= f.now < b))

    def _wait_out(self, job: str, back: float) -> None:
        """No zone it may use has capacity: its VM (if any) goes, and it launches again at ``back``."""
        f = self.f
        if (old := self.live.get(job)) is not None:
            zone = next((i.zone for i in f.compute.all() if i.name == old), None)
            if zone is not None:
                f.compute.delete(PROJECT, zone, old)
            self.live[job] = None
            f.sync()
        f.at(back, self.launch, job)


class BestZoneWait(Ideal):
    """The check on the ceiling: an oracle that uses only the zone with the longest true mean
    lifetime, recovers there at once, and waits out its stockouts (waiting is not billed, so it
    costs goodput nothing); its trainer saves on that zone's optimal fixed interval."""

    def best(self) -> str:
        zones = self.f.trace.zones
        return max(zones, key=lambda z: zones[z].mean_s)

    def zones_to_try(self, job: str) -> list[str]:
        best = self.best()
        return [] if best in self.f.compute.stockouts else [best]

    def launch(self, job: str) -> None:
        f = self.f
        if self.zones_to_try(job):
            Baseline.launch(self, job)
            return
        self._wait_out(job, min(b for a, b in f.trace.zones[self.best()].stockouts if a <= f.now < b))


def run_policy(trace: Trace, policy: str, skip_ticks: bool = True, verify_skips: bool = False) -> dict[str, Any]:
    logging.getLogger("controller").setLevel(logging.CRITICAL)
    return Fleet(trace, policy, skip_ticks=skip_ticks, verify_skips=verify_skips).run()
