"""``respawn demo``: the whole story on one machine, no Google account.

A Spot job over two zones trains the example trainer. It is preempted three times:
hard, in its first seconds, before any checkpoint (no notice reaches the guest, so only
Compute's preemption record explains the loss); then while a stockout blocks the
first zone (the job moves to the second); then once more. It must still finish with
exactly the weights an uninterrupted run computes.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from rich.console import Console

from controller import names
from controller.config import REPO_ROOT
from controller.state import JobStatus, Phase
from localcloud.stack import LocalCloud, Options

JOB = "demo"
STEPS, EVERY, PAUSE = 400, 40, 0.04
_STEP = re.compile(r"trainer: step (\d+) ")
_START = re.compile(r"trainer: attempt \d+ starting at step (\d+)")
_FINAL = re.compile(r"trainer: final step (\d+) loss (\S+) weights (\w+)")


@dataclass
class Result:
    phase: str = "?"
    attempts: int = 0
    preemptions: int = 0
    failures: int = 0
    steps_lost: int = 0
    final_hash: str | None = None
    reference_hash: str = ""
    final_loss: str = ""
    seconds: float = 0.0
    story: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.phase == Phase.SUCCEEDED and self.preemptions >= 3 and self.failures == 0
                and self.final_hash == self.reference_hash)


class Demo:
    def __init__(self, console: Console, notice: float = 3.0) -> None:
        self.console = console
        self.cloud = LocalCloud(Options(tick_interval=5.0, boot_delay=0.3, shutdown_budget=notice))
        self.started = time.monotonic()
        self._last: tuple[Any, ...] = ()

    def say(self, text: str) -> None:
        self.console.print(f"[dim]{time.monotonic() - self.started:6.1f}s[/dim] {text}", highlight=False)

    def run(self) -> Result:
        result = Result()
        with self.cloud:
            self.say(f"local cloud up: GCS {self.cloud.gcs.url}, Compute {self.cloud.compute.endpoint}")
            result.reference_hash = self._reference()
            self._submit()
            self._story()
            final = self._until("the job to finish", lambda: (s := self._status()) and s.phase.terminal and s, 150)
            self._collect(final, result)
        result.seconds = time.monotonic() - self.started
        return result

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
        bucket.blob("code/demo.tar.gz").upload_from_string(tarball.getvalue())
        spec = {
            "zones": ["us-central1-a", "us-central1-b"], "machine_type": "g2-standard-8",  # its L4 is built in
            "provisioning": "spot",
            "code": f"gs://{bucket.name}/code/demo.tar.gz", "command": "python trainer.py",
            "env": {"TRAIN_STEPS": str(STEPS), "CHECKPOINT_EVERY": str(EVERY), "STEP_SECONDS": str(PAUSE)},
            "checkpoint": {"uri": f"gs://{bucket.name}/checkpoints/{JOB}"}, "heartbeat_interval": "2s",
            "policy": {"max_restarts": 10, "startup_grace": "1m", "idle_timeout": "2m", "zone_cooldown": "10m"},
        }
        bucket.blob(names.spec_key(JOB)).upload_from_string(yaml.safe_dump(spec))
        self.say(f"submitted [bold]{JOB}[/bold]: Spot g2-standard-8 + L4 over us-central1-a, us-central1-b; "
                 f"{STEPS} steps, checkpoint every {EVERY}")

    def _story(self) -> None:
        compute = self.cloud.compute
        assert compute is not None
        self._until("attempt 1 to start training", lambda: self._started(1), 30)
        self.say(f"[red]preempting {JOB}-1 hard[/red] at step {self._step(1)}: no checkpoint yet, and the guest "
                 "never runs its shutdown script (no marker)")
        compute.preempt(f"{JOB}-1", graceful=False)

        self._until("attempt 2 to pass two checkpoints", lambda: self._started(2) and self._step(2) >= 2 * EVERY + 5, 60)
        compute.stockout("us-central1-a")
        self.say(f"[yellow]stockout in us-central1-a[/yellow]; [red]preempting {JOB}-2[/red] at step {self._step(2)} "
                 "(30 s notice, shortened here: SIGTERM, checkpoint, marker)")
        compute.preempt(f"{JOB}-2")

        self._until("attempt 3 to train in us-central1-b", lambda: self._started(3) and self._step(3) >= self._start(3) + 60, 60)
        compute.stockout("us-central1-a", on=False)
        self.say(f"stockout over; [red]preempting {JOB}-3[/red] at step {self._step(3)}")
        compute.preempt(f"{JOB}-3")

    def _collect(self, final: JobStatus, result: Result) -> None:
        result.phase, result.attempts = final.phase, final.attempt
        result.preemptions, result.failures = final.preemptions, final.failures
        for attempt in range(1, final.attempt):
            reached, resumed = self._step(attempt), self._start(attempt + 1)
            result.steps_lost += max(0, reached - resumed)
            result.story.append(f"attempt {attempt}: reached step {reached}; attempt {attempt + 1} resumed at {resumed}")
        match = _FINAL.search(self._log(final.attempt))
        if match:
            result.final_loss, result.final_hash = match.group(2), match.group(3)

    # -- observation -------------------------------------------------------------------
    def _status(self) -> JobStatus | None:
        blob = self.cloud.storage.bucket(self.cloud.options.bucket).get_blob(names.status_key(JOB))
        status = JobStatus.from_json(blob.download_as_bytes()) if blob else None
        if status:
            self._report(status)
        return status

    def _report(self, st: JobStatus) -> None:
        key = (st.phase, st.attempt, st.zone)
        if key != self._last:
            self._last = key
            where = f" in {st.zone}" if st.zone else ""
            resume = f", resuming from step {st.resume_from.step}" if st.resume_from and st.phase == Phase.PROVISIONING else ""
            self.say(f"[bold]{st.phase}[/bold] attempt {st.attempt}{where}{resume} — {st.message[:90]}")

    def _log(self, attempt: int) -> str:
        assert self.cloud.compute is not None
        path = self.cloud.compute.workdir_of(f"{JOB}-{attempt}") / "serial-port-1.log"
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
            self._status()
            if result := check():
                return result
            time.sleep(0.2)
        raise TimeoutError(f"gave up waiting for {what} after {timeout:.0f}s")


def run(console: Console | None = None, notice: float = 3.0) -> Result:
    return Demo(console or Console(), notice).run()
