"""``respawn demo``: the whole story on one machine, no Google account.

Two stories, told the same way: the local cloud trains the example trainer as a Spot job,
takes its machines away, and the job must still finish with exactly the weights an
uninterrupted run computes.

- **GPU** (``respawn demo``): a Spot VM over two zones, preempted three times: hard, in
  its first seconds, before any checkpoint, with no notice (only Compute's preemption
  record explains the loss: its System Event audit entry reaches ``on_audit`` through the
  Logging sink and Pub/Sub within seconds, and the story says which pass inserted the
  replacement, and when); then with its preemption notice (Spot's 120 s, as short here as
  the shutdown) while a stockout blocks the other zone: the next attempt boots beside it
  at the notice, meets the stockout, moves to the preempting zone, waits at its starting
  line while the old VM saves, and starts from that save (zero-gap recovery); then once
  more with notice, into the other zone. The story says each standby's overlap as it
  goes (``controller.render.handover_view``), and the summary counts the recoveries that
  booted at a notice.
- **TPU** (``respawn demo --tpu``): a Spot Cloud TPU slice (v4-16: two hosts, both
  training, rank 0 saving). The slice is preempted (every worker's shutdown script
  SIGTERMs its trainer, rank 0 checkpoints, then the marker), resumes on a new node from
  the latest checkpoint, then goes through host maintenance (health
  UNHEALTHY_MAINTENANCE, shutdown scripts, then TERMINATED) and resumes again.

``Demo`` holds what both share (the local cloud, the reference run, submitting,
watching the job and the trainer's log, the result); ``GpuDemo`` and ``TpuDemo`` hold
their spec, where the trainer's log is, and the story itself. Each ends by writing
``respawn report``'s page and timeline of its job (``Result.reports``).
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from controller.core import names
from controller.core.ports import BlobInfo
from controller.render import handover_view
from controller.service.config import REPO_ROOT
from controller.core.state import JobStatus, Phase
from localcloud.stack import LocalCloud, Options

JOB = "demo"
STEPS, EVERY, PAUSE = 400, 40, 0.04
MESSAGE_LIMIT = 240  # characters of the controller's message a status line shows (wrapped, not cut)
_STEP = re.compile(r"trainer: step (\d+) ")
_START = re.compile(r"trainer: attempt \d+ starting at step (\d+)")
_FINAL = re.compile(r"trainer: final step (\d+) loss (\S+) weights (\w+)")
# The stages of a standby the story says (handover_view.stage), in order.
SAID = (handover_view.BOOTING, handover_view.AT_LINE, handover_view.STARTED)


@dataclass
class Result:
    phase: str = "?"
    attempts: int = 0
    preemptions: int = 0
    stockouts: int = 0  # creates refused for want of capacity (the ledger's "stockout" marks)
    maintenance: int = 0  # restarts after host maintenance (history events "maintenance")
    host_errors: int = 0  # restarts after a host error (history events "host error")
    failures: int = 0
    steps_lost: int = 0
    final_hash: str | None = None
    reference_hash: str = ""
    final_loss: str = ""
    seconds: float = 0.0
    story: list[str] = field(default_factory=list)
    reports: list[Path] = field(default_factory=list)  # ``respawn report``'s page and picture of the job
    # Recoveries with zero gap: attempts booted at the notice of the one before, and how long after the
    # save each resumed from its trainer started (seconds; None: not known).
    zero_gap: int = 0
    zero_gap_s: list[float | None] = field(default_factory=list)
    # What the story must show: at least this many preemptions, maintenance restarts, stockouts met
    # and recoveries with zero gap.
    want_preemptions: int = 3
    want_maintenance: int = 0
    want_stockouts: int = 0
    want_zero_gap: int = 0
    want_host_errors: int = 0

    @property
    def ok(self) -> bool:
        return (self.phase == Phase.SUCCEEDED and self.preemptions >= self.want_preemptions
                and self.maintenance >= self.want_maintenance and self.stockouts >= self.want_stockouts
                and self.host_errors >= self.want_host_errors
                and self.zero_gap >= self.want_zero_gap and self.failures == 0
                and self.final_hash == self.reference_hash)


class Demo:
    """The machinery both stories share. A story sets ``job``, ``want_*``, and defines
    ``_spec`` (what the job runs on), ``_log_path`` (where rank 0's trainer prints) and
    ``_story`` (what happens to it)."""

    job = JOB
    want_preemptions, want_maintenance, want_stockouts, want_zero_gap, want_host_errors = 3, 0, 0, 0, 0
    finish_timeout = 150.0

    def __init__(self, console: Console, notice: float = 3.0, output: Path | None = None) -> None:
        self.console = console
        self.output = output  # where the report goes (default: a new temporary folder, kept)
        # Spot's 30 s shutdown shortened to ``notice`` seconds, and its 120 s preemption notice to as many.
        self.notice = notice
        self.cloud = LocalCloud(Options(tick_interval=5.0, boot_delay=0.3, shutdown_budget=notice,
                                        notice_scale=notice / 120))
        self.started = time.monotonic()
        self._last: tuple[Any, ...] = ()
        self._overlaps = Overlaps(self.job)

    def say(self, text: str | Text) -> None:
        """One line of the story (``text``: the story's own Rich markup, or a ``Text``), after the time."""
        self.console.print(event_line(time.monotonic() - self.started, text))

    def run(self) -> Result:
        result = Result(want_preemptions=self.want_preemptions, want_maintenance=self.want_maintenance,
                        want_stockouts=self.want_stockouts, want_zero_gap=self.want_zero_gap,
                        want_host_errors=self.want_host_errors)
        with self.cloud:
            self.say(self._endpoints())
            result.reference_hash = self._reference()
            self._submit()
            self._story()
            final = self._until("the job to finish", lambda: (s := self._status()) and s.phase.terminal and s,
                                self.finish_timeout)
            self._collect(final, result)
        result.seconds = time.monotonic() - self.started
        result.reports = self._write_report(final)
        return result

    def _write_report(self, final: JobStatus) -> list[Path]:
        """``respawn report``'s HTML page and timeline picture of the finished job."""
        from controller.render import report

        folder = self.output or Path(tempfile.mkdtemp(prefix=f"respawn-{self.job}-"))
        folder.mkdir(parents=True, exist_ok=True)
        now = datetime.now(UTC)
        return [report.draw(self.job, final, now, folder / f"{self.job}-report.{kind}") for kind in ("html", "png")]

    # -- what a story defines --------------------------------------------------------------
    def _spec(self) -> tuple[dict[str, Any], str]:
        """The spec's placement fields (zones, machine or TPU, provisioning), and how to say it."""
        raise NotImplementedError

    def _log_path(self, attempt: int) -> Path:
        """The serial log of the machine where rank 0 of ``attempt`` runs."""
        raise NotImplementedError

    def _story(self) -> None:
        raise NotImplementedError

    def _endpoints(self) -> str:
        assert self.cloud.compute is not None
        return f"local cloud up: GCS {self.cloud.gcs.url}, Compute {self.cloud.compute.endpoint}"

    # -- shared ------------------------------------------------------------------------------
    def _reference(self) -> str:
        """The uninterrupted run's weights, computed as the VMs compute them: the same trainer.py,
        interpreter and environment (PATH, no inherited OPENBLAS_*/NPY_* settings), in its own process."""
        assert self.cloud.compute is not None
        env = dict(self.cloud.compute.vm_env)
        python = shutil.which("python", path=env.get("PATH")) or "python"
        code = f"import trainer; print(trainer.digest(trainer.train({STEPS})))"
        done = subprocess.run([python, "-c", code], cwd=REPO_ROOT / "examples", env=env, capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)
        if done.returncode != 0 or not re.fullmatch(r"[0-9a-f]{16}\n", done.stdout):
            raise RuntimeError(f"the uninterrupted reference run failed ({python}, exit {done.returncode}): "
                               f"{(done.stdout + done.stderr)[-2000:]}")
        self.say(f"uninterrupted reference ({STEPS} steps, the VMs' python): weights {done.stdout.strip()}")
        return done.stdout.strip()

    def _submit(self) -> None:
        bucket = self.cloud.storage.bucket(self.cloud.options.bucket)
        tarball = io.BytesIO()
        with tarfile.open(fileobj=tarball, mode="w:gz") as tar:
            tar.add(REPO_ROOT / "examples" / "trainer.py", arcname="trainer.py")
        bucket.blob(f"code/{self.job}.tar.gz").upload_from_string(tarball.getvalue())
        placement, described = self._spec()
        spec = {
            **placement,
            "code": f"gs://{bucket.name}/code/{self.job}.tar.gz", "command": "python trainer.py",
            "env": {"TRAIN_STEPS": str(STEPS), "CHECKPOINT_EVERY": str(EVERY), "STEP_SECONDS": str(PAUSE)},
            "checkpoint": {"uri": names.default_checkpoint(bucket.name, self.job)}, "heartbeat_interval": "2s",
            "policy": {"max_restarts": 10, "startup_grace": "1m", "idle_timeout": "2m", "zone_cooldown": "10m"},
        }
        bucket.blob(names.spec_key(self.job)).upload_from_string(yaml.safe_dump(spec))
        self.say(f"submitted [bold]{self.job}[/bold]: {described}; {STEPS} steps, checkpoint every {EVERY}")

    def _collect(self, final: JobStatus, result: Result) -> None:
        result.phase, result.attempts = final.phase, final.attempt
        result.preemptions, result.failures = final.preemptions, final.failures
        result.maintenance = sum(1 for e in final.history if e.event == "maintenance")
        result.stockouts = sum(final.ledger.totals.stockouts.values())  # what the report counts
        hands = handover_view.handovers(self.job, final)
        result.zero_gap, result.zero_gap_s = len(hands), [h.downtime_s() for h in hands]
        for attempt in range(1, final.attempt):
            reached, resumed = self._step(attempt), self._start(attempt + 1)
            result.steps_lost += max(0, reached - resumed)
            result.story.append(f"attempt {attempt}: reached step {reached}; attempt {attempt + 1} resumed at {resumed}")
        match = _FINAL.search(self._log(final.attempt))
        if match:
            result.final_loss, result.final_hash = match.group(2), match.group(3)

    # -- observation -------------------------------------------------------------------
    def _observe(self) -> None:
        """One look around while waiting: what the story reports as it goes."""
        self._status()

    def _status(self) -> JobStatus | None:
        blob = self.cloud.storage.bucket(self.cloud.options.bucket).get_blob(names.status_key(self.job))
        status = JobStatus.from_json(blob.download_as_bytes()) if blob else None
        if status:
            self._report(status)
        return status

    def _report(self, st: JobStatus) -> None:
        key = (st.phase, st.attempt, st.zone)
        if key != self._last:
            self._last = key
            self.say(status_line(st))
        self._overlap(st)

    def _overlap(self, st: JobStatus) -> None:
        sb = st.standby
        ready = self._ready(st) if sb is not None and sb.inserted else None
        if line := self._overlaps.said(st, ready, self._step(st.attempt) if sb is not None else None):
            self.say(Text(line))

    def _ready(self, st: JobStatus) -> handover_view.AtLine | None:
        """What the standby's ready record says (it reached its starting line), if it wrote one."""
        blob = self.cloud.storage.bucket(self.cloud.options.bucket).get_blob(names.ready_key(self.job))
        if blob is None:
            return None
        info = BlobInfo(blob.bucket.name, blob.name, blob.generation or 0, blob.updated or datetime.now(UTC))
        try:
            return handover_view.at_line(info, blob.download_as_bytes(), st)
        except Exception:  # noqa: BLE001 - deleted between the two reads: the next look says it
            return None

    def _log(self, attempt: int) -> str:
        path = self._log_path(attempt)
        return path.read_text(errors="replace") if path.exists() else ""

    def _started(self, attempt: int) -> bool:
        return _START.search(self._log(attempt)) is not None

    def _start(self, attempt: int) -> int:
        match = _START.search(self._log(attempt))
        return int(match.group(1)) if match else 0

    def _step(self, attempt: int) -> int:
        steps = _STEP.findall(self._log(attempt))
        return int(steps[-1]) if steps else self._start(attempt)

    def _until(self, what: str, check: Callable[[], Any], timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._observe()
            if result := check():
                return result
            time.sleep(0.2)
        raise TimeoutError(f"gave up waiting for {what} after {timeout:.0f}s")


class GpuDemo(Demo):
    """A Spot VM with an L4, preempted three times (hard, with no notice; with its notice under a
    stockout; with its notice once more)."""

    want_stockouts = 1  # the stockout is met: the standby's create in the other zone is refused
    want_zero_gap = 2  # the two preemptions with notice: each next attempt booted at the notice
    ZONES = ["us-central1-a", "us-central1-b"]

    def _spec(self) -> tuple[dict[str, Any], str]:
        return ({"zones": self.ZONES, "machine_type": "g2-standard-8",  # its L4 is built in
                 "provisioning": "spot"},
                f"Spot g2-standard-8 + L4 over {', '.join(self.ZONES)}")

    def _log_path(self, attempt: int) -> Path:
        assert self.cloud.compute is not None
        return self.cloud.compute.workdir_of(f"{self.job}-{attempt}") / "serial-port-1.log"

    def _story(self) -> None:
        compute, job = self.cloud.compute, self.job
        assert compute is not None
        self._until("attempt 1 to start training", lambda: self._started(1), 30)
        self.say(f"[red]preempting {job}-1 hard[/red] at step {self._step(1)}, with no notice: no checkpoint yet, "
                 "and the guest never runs its shutdown script (no marker)")
        lost = time.time()
        scale = compute.notice_scale
        compute.scale_notice(0)  # this preemption's notice never comes: the soft-off at once
        compute.preempt(f"{job}-1", graceful=False)
        compute.scale_notice(scale)
        self._until(f"{job}-2 to be inserted", lambda: f"{job}-2" in compute.names(), 60)
        created = datetime.fromisoformat(compute.instance(f"{job}-2")["creationTimestamp"]).timestamp()
        self.say(self._replaced(f"{job}-1", f"{job}-2", lost, created))

        self._until("attempt 2 to pass two checkpoints", lambda: self._started(2) and self._step(2) >= 2 * EVERY + 5, 60)
        here = compute.instance(f"{job}-2")["zone"].rsplit("/", 1)[-1]
        other = next(z for z in self.ZONES if z != here)
        # Unforeseen: capacity advice still scores the zone obtainable (a forecast, as Google's is), so
        # the standby's create goes there first (the preempting zone last) and meets the stockout.
        compute.stockout(other, foreseen=False)
        self.say(f"[yellow]stockout in {other}[/yellow] (capacity advice does not foresee it); [red]preempting "
                 f"{job}-2[/red] at step {self._step(2)} with its notice (Spot's 120 s, {self.notice:g} s here): "
                 f"{job}-3 boots beside it while it saves")
        compute.preempt(f"{job}-2")

        self._until(f"attempt 3 to train in {here}", lambda: self._started(3) and self._step(3) >= self._start(3) + 60, 60)
        compute.stockout(other, on=False)
        self.say(f"stockout over; [red]preempting {job}-3[/red] at step {self._step(3)} with its notice")
        compute.preempt(f"{job}-3")

    def _replaced(self, gone: str, new: str, lost: float, inserted: float) -> str:
        """How ``new`` came to replace ``gone`` (``lost``, ``inserted``: wall-clock times, the second
        Compute's ``creationTimestamp``, to the millisecond): through the audit path (Compute's System
        Event entry, the Logging sink, Pub/Sub's push to on_audit, whose pass inserted it while the
        push was being answered), or, where the push came too late or not at all, by another pass."""
        cloud = self.cloud
        assert cloud.pubsub is not None
        audit_path = cloud.options.audit
        push = self._push_of(gone, lost, wait=5.0) if audit_path else None
        after = f"{new} inserted {inserted - lost:.1f}s after the loss"
        if push and push["started_at"] - 0.001 <= inserted <= push["answered_at"] + 0.001:  # ms timestamps
            return (f"{after}, by on_audit: Compute's System Event entry (compute.instances.preempted) reached it "
                    f"through the Logging sink and a Pub/Sub push {push['started_at'] - lost:.1f}s after the loss")
        if push:
            return (f"{after}, by another pass (on_audit got Compute's entry {push['started_at'] - lost:.1f}s after "
                    "the loss)")
        return f"{after}, by another pass (no audit entry reached on_audit)"

    def _push_of(self, instance: str, since: float, wait: float) -> dict[str, Any] | None:
        """The first answered push to on_audit, after ``since``, of an entry naming ``instance``."""
        import base64
        import json

        cloud = self.cloud
        assert cloud.pubsub is not None
        deadline = time.monotonic() + wait
        while True:
            data = {m["messageId"]: m.get("data", "") for m in cloud.pubsub.published(cloud.audit_topic)}
            for push in list(cloud.pubsub.pushes):
                if push["subscription"] != cloud.audit_subscription or push["started_at"] < since:
                    continue
                try:
                    entry = json.loads(base64.b64decode(data.get(push["messageId"], "")))
                except ValueError:
                    continue
                if str(entry.get("protoPayload", {}).get("resourceName", "")).endswith(f"/instances/{instance}"):
                    return push
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)


class TpuDemo(Demo):
    """A Spot v4-16 slice (two hosts, each training; rank 0 saves), preempted, then
    terminated by host maintenance."""

    job = f"{JOB}-tpu"
    want_preemptions, want_maintenance = 1, 1
    TYPE, ZONES = "v4-16", ["us-central2-b", "us-east5-a"]

    def __init__(self, console: Console, notice: float = 3.0, output: Path | None = None) -> None:
        super().__init__(console, notice, output)
        self._nodes: dict[str, tuple[str, str]] = {}  # node id -> (state, health) last said

    def _spec(self) -> tuple[dict[str, Any], str]:
        return ({"zones": self.ZONES, "tpu": {"type": self.TYPE, "runtime_version": "tpu-ubuntu2204-base"},
                 "provisioning": "spot"},
                f"Spot TPU {self.TYPE} (a slice of 2 hosts) over {', '.join(self.ZONES)}")

    def _endpoints(self) -> str:
        assert self.cloud.tpu is not None
        return f"local cloud up: GCS {self.cloud.gcs.url}, Cloud TPU {self.cloud.tpu.endpoint}"

    def _log_path(self, attempt: int, worker: int = 0) -> Path:
        assert self.cloud.tpu is not None
        return self.cloud.tpu.workdir_of(f"{self.job}-{attempt}", worker) / "serial-port-1.log"

    def _training(self, attempt: int, past: int) -> bool:
        """Both workers of the attempt's slice train, and rank 0 is ``past`` steps beyond its start."""
        on_worker_1 = self._log_path(attempt, 1)
        return (self._started(attempt) and self._step(attempt) >= self._start(attempt) + past
                and on_worker_1.exists() and _START.search(on_worker_1.read_text(errors="replace")) is not None)

    def _story(self) -> None:
        tpu, job = self.cloud.tpu, self.job
        assert tpu is not None
        self._until("the first slice to train on both hosts", lambda: self._training(1, EVERY + 5), 60)
        self.say(f"{job}-1 trains on both hosts (ranks 0 and 1; rank 0 saves); "
                 f"[red]preempting {job}-1[/red] at step {self._step(1)}: every worker's shutdown script "
                 "SIGTERMs its trainer, rank 0 checkpoints, then the marker")
        tpu.preempt(f"{job}-1")

        self._until("the second slice to train", lambda: self._training(2, 60), 60)
        self.say(f"{job}-2 resumed at step {self._start(2)}; [yellow]host maintenance on {job}-2[/yellow] at step "
                 f"{self._step(2)}: health UNHEALTHY_MAINTENANCE, shutdown scripts, then TERMINATED")
        tpu.maintenance(f"{job}-2", outcome="terminated")

        self._until("the third slice to train", lambda: self._training(3, 1), 60)
        self.say(f"{job}-3 resumed at step {self._start(3)}")

    def _collect(self, final: JobStatus, result: Result) -> None:
        super()._collect(final, result)
        # Rank 1 computed the same steps; it ends them too unless the node was deleted first.
        rank_1 = self._log_path(final.attempt, 1)
        match = _FINAL.search(rank_1.read_text(errors="replace")) if rank_1.exists() else None
        if match:
            result.story.append(f"rank 1 of {self.job}-{final.attempt} (not saving) ended with weights {match.group(3)}")

    def _observe(self) -> None:
        super()._observe()
        assert self.cloud.tpu is not None
        seen = {n["name"].rsplit("/", 1)[-1]: (n.get("state", "?"), n.get("health", "")) for n in self.cloud.tpu.nodes()}
        for node_id in self._nodes.keys() - seen.keys():
            if self._nodes[node_id] != ("deleted", ""):
                seen[node_id] = ("deleted", "")
        for node_id, now in seen.items():
            if node_id.startswith(f"{self.job}-") and self._nodes.get(node_id) != now:
                self._nodes[node_id] = now
                self.say(f"  node {node_id}: {now[0]}" + (f", {now[1]}" if now[1] else ""))


class SliceDemo(Demo):
    """A Spot TPU7x slice in Compute Engine (topology 2x2x2: a MIG of two tpu7x-standard-4t hosts, each
    training; rank 0 saves): one host preempted (the slice is broken, deleted whole, its other host's
    shutdown SIGTERMs rank 0, which saves), then rank 0's host lost to a host error with no shutdown
    at all (the next slice resumes from the last periodic save)."""

    job = f"{JOB}-tpu7x"
    want_preemptions, want_host_errors = 1, 1
    MACHINE, TOPOLOGY, ZONES = "tpu7x-standard-4t", "2x2x2", ["us-central1-c"]

    def _spec(self) -> tuple[dict[str, Any], str]:
        return ({"zones": self.ZONES, "tpu": {"machine_type": self.MACHINE, "topology": self.TOPOLOGY},
                 "provisioning": "spot"},
                f"Spot TPU7x slice {self.TOPOLOGY} (a managed instance group of 2 {self.MACHINE} hosts) "
                f"in {', '.join(self.ZONES)}, through Compute Engine")

    def __init__(self, console: Console, notice: float = 3.0, output: Path | None = None) -> None:
        super().__init__(console, notice, output)
        self._seen: dict[int, dict[int, str]] = {}  # attempt -> its hosts as last seen (kept once they are gone)

    def _hosts(self, attempt: int) -> dict[int, str]:
        """The slice's VMs by the worker number each one's metadata gives it (0 first); once they are
        deleted, as they were last seen (their serial logs stay)."""
        compute = self.cloud.compute
        assert compute is not None
        found = {vm.worker: vm.name for vm in compute.slice_hosts(f"{self.job}-{attempt}")}
        if len(found) >= len(self._seen.get(attempt, {})):
            self._seen[attempt] = found
        return self._seen.get(attempt, {})

    def _log_path(self, attempt: int, worker: int = 0) -> Path:
        assert self.cloud.compute is not None
        host = self._hosts(attempt).get(worker)
        return self.cloud.compute.workdir_of(host) / "serial-port-1.log" if host else Path("/nonexistent")

    def _training(self, attempt: int, past: int) -> bool:
        """Both hosts of the attempt's slice train, and rank 0 is ``past`` steps beyond its start."""
        on_worker_1 = self._log_path(attempt, 1)
        return (self._started(attempt) and self._step(attempt) >= self._start(attempt) + past
                and on_worker_1.exists() and _START.search(on_worker_1.read_text(errors="replace")) is not None)

    def _story(self) -> None:
        compute, job = self.cloud.compute, self.job
        assert compute is not None
        self._until("the first slice to train on both hosts", lambda: self._training(1, EVERY + 5), 60)
        hosts = self._hosts(1)
        self.say(f"{job}-1 is a MIG of {', '.join(hosts[w] for w in sorted(hosts))} (ranks 0 and 1; rank 0 saves); "
                 f"[red]preempting {hosts[1]}[/red] (rank 1) at step {self._step(1)}: one host down breaks the "
                 "slice, which respawn deletes whole; the other host's shutdown SIGTERMs rank 0, which saves")
        compute.preempt(hosts[1])

        self._until("the second slice to train", lambda: self._training(2, EVERY + 5), 60)
        hosts = self._hosts(2)
        self.say(f"{job}-2 resumed at step {self._start(2)}; [yellow]host error on {hosts[0]}[/yellow] (rank 0) at "
                 f"step {self._step(2)}: no shutdown, no save; the next slice resumes from the last periodic one")
        compute.host_error(hosts[0])

        self._until("the third slice to train", lambda: self._training(3, 1), 60)
        self.say(f"{job}-3 resumed at step {self._start(3)}")

    def _collect(self, final: JobStatus, result: Result) -> None:
        super()._collect(final, result)
        result.host_errors = sum(1 for e in final.history if e.event == "host error")
        rank_1 = self._log_path(final.attempt, 1)
        match = _FINAL.search(rank_1.read_text(errors="replace")) if rank_1.exists() else None
        if match:
            result.story.append(f"rank 1 of {self.job}-{final.attempt} (not saving) ended with weights {match.group(3)}")


class Overlaps:
    """What the story says of a job's standbys as it sees them go on: each stage once (booting
    beside the attempt its notice condemned, at its starting line, then started from that attempt's
    save), never one it has passed (a stage passed between two looks is not said)."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.furthest: dict[int, int] = {}  # a standby's attempt -> the furthest stage said, by SAID's index

    def said(self, st: JobStatus, ready: handover_view.AtLine | None, step: int | None) -> str | None:
        """The line to say now (``handover_view.line``), or None: nothing new."""
        stage = handover_view.stage(st, ready)
        attempt = st.standby.attempt if st.standby is not None else st.attempt
        if stage not in SAID or SAID.index(stage) <= self.furthest.get(attempt, -1):
            return None
        self.furthest[attempt] = SAID.index(stage)
        return handover_view.line(self.job, st, ready, step)


def status_line(st: JobStatus, limit: int = MESSAGE_LIMIT) -> Text:
    """What the story says of a job's status: phase, attempt, zone, the step a new attempt
    resumes from, and the controller's message, shortened on a word boundary to ``limit``
    characters. The message is the controller's text, never read as markup."""
    where = f" in {st.zone}" if st.zone else ""
    resume = f", resuming from step {st.resume_from.step}" if st.resume_from and st.phase == Phase.PROVISIONING else ""
    return Text.assemble((str(st.phase), "bold"), f" attempt {st.attempt}{where}{resume} — ", shorten(st.message, limit))


def shorten(text: str, limit: int) -> str:
    """``text`` on one line, cut to at most ``limit`` characters after a whole word, with " …"
    when cut (a first word longer than ``limit`` alone is cut inside)."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    head = text[: limit - 2]
    if text[len(head)] != " " and " " in head:
        head = head.rsplit(" ", 1)[0]
    return head.rstrip() + " …"


def event_line(elapsed: float, text: str | Text) -> Table:
    """A line of the story as the console prints it: the seconds since the start, then the
    text (Rich markup, or a ``Text``), wrapped on word boundaries under itself; only a word
    longer than the whole column is folded."""
    line = Table.grid(padding=(0, 1))
    line.add_column(style="dim", no_wrap=True)
    line.add_column(overflow="fold")
    line.add_row(f"{elapsed:6.1f}s", Text.from_markup(text) if isinstance(text, str) else text)
    return line


STORIES: dict[str, type[Demo]] = {"gpu": GpuDemo, "tpu": TpuDemo, "tpu7x": SliceDemo}


def run(console: Console | None = None, notice: float = 3.0, story: str = "gpu", output: Path | None = None) -> Result:
    return STORIES[story](console or Console(), notice, output).run()
