"""Run a framework trainer script several ways and compare: uninterrupted, preempted (SIGTERM with a notice, a
notice too short for a save, or SIGKILL in the middle of an upload), then resumed from the save respawn's finder
(controller.core.checkpoints) picks in the local "bucket".

A trainer script prints ``step N loss X`` (X as ``repr``: every bit) for each step it trains, saves through a
respawnkit hook into the local "bucket" RESPAWN_CHECKPOINT_URI names (every SAVE_EVERY steps, 5 by default),
exits 143 after a SIGTERM, and calls tests/frameworks/uploads.install() (SLOW_UPLOAD_S, HANG_ON).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.frameworks.uploads import hung_file
from tests.kit import finder

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SAVE_EVERY = 5

# JAX and Orbax bring their own protobuf and numpy pins, which the project's lock must not take: `make
# test-frameworks` installs them into a folder of their own, added to the JAX trainer's path only.
JAX_SITE = os.environ.get("RESPAWN_JAX_SITE") or os.path.join(REPO, ".venv", "jax-site")


@dataclass
class Run:
    returncode: int
    losses: dict[int, str] = field(default_factory=dict)
    stderr: str = ""

    @property
    def steps(self) -> list[int]:
        return sorted(self.losses)


def run(script: str, env: dict[str, str], sigterm_after: int | None = None, timeout: float = 300,
        signal_to_send: int = signal.SIGTERM, args: tuple[str, ...] = (), cwd: str = REPO,
        signal_when: Callable[[int], bool] | None = None, kill_when_exists: str | None = None) -> Run:
    """Run ``script`` (under tests/frameworks, or a path) with ``args``. With ``sigterm_after``, SIGTERM it (or
    ``signal_to_send``) once it has printed that step; with ``signal_when``, once that is true of a step it
    printed; with ``kill_when_exists``, SIGKILL it as soon as that file exists (polled, whatever it prints)."""
    if sigterm_after is not None:
        signal_when = lambda step: step >= sigterm_after  # noqa: E731
    process = subprocess.Popen([sys.executable, os.path.join(HERE, script), *args], env=env, cwd=cwd,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr: list[str] = []
    readers = [threading.Thread(target=lambda: stderr.append(process.stderr.read()), daemon=True)]
    done = threading.Event()
    if kill_when_exists is not None:
        def watch() -> None:
            while not done.wait(0.02):
                if os.path.exists(kill_when_exists):
                    process.kill()
                    return
        readers.append(threading.Thread(target=watch, daemon=True))
    for reader in readers:
        reader.start()
    result, signalled = Run(0), False
    try:
        for line in process.stdout:
            words = line.split()
            if len(words) == 4 and words[0] == "step" and words[2] == "loss":
                step = int(words[1])
                assert step not in result.losses, f"step {step} trained twice"
                result.losses[step] = words[3]
                if signal_when is not None and not signalled and signal_when(step):
                    process.send_signal(signal_to_send)
                    signalled = True
        result.returncode = process.wait(timeout)
    finally:
        done.set()
        if process.poll() is None:
            process.kill()
            process.wait()
        readers[0].join(10)
        result.stderr = "".join(stderr)
    return result


def environment(tmp: str, **extra: object) -> dict[str, str]:
    os.makedirs(tmp, exist_ok=True)  # WORK: the progress file and the hung upload's note go there
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RESPAWN_", "RESUME_"))}
    return {**base, "PYTHONPATH": REPO, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1", "WORK": tmp,
            "RESPAWN_CHECKPOINT_URI": os.path.join(tmp, "bucket"), "RESPAWN_PROGRESS_FILE": os.path.join(tmp, "progress.json"),
            **{k: str(v) for k, v in extra.items()}}


def progress(env: dict[str, str]) -> dict:
    """The progress file the kit keeps for the VM agent's heartbeat ({} before its first write)."""
    try:
        with open(env["RESPAWN_PROGRESS_FILE"]) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def resume(script: str, env: dict[str, str], whole: Run, stopped: int, steps: int) -> finder.checkpoints.Found:
    """Resume from what respawn's finder picks: the rest of the steps, with the uninterrupted run's losses."""
    found = finder.latest(env["RESPAWN_CHECKPOINT_URI"])
    assert found is not None
    second = run(script, {**env, "STEP_S": "0", "SLOW_UPLOAD_S": "0", "HANG_ON": "", "RESPAWN_NOTICE_SECONDS": "30",
                          "RESUME_FROM": finder.local(found, env["RESPAWN_CHECKPOINT_URI"]),
                          "RESUME_STEP": str(found.step)})
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.steps == list(range(found.step + 1, steps + 1))
    assert second.losses == {s: whole.losses[s] for s in second.steps}
    return found


def preempt_and_resume(script: str, tmp_path, steps: int, sigterm_after: int, fmt: str, whole: Run | None = None,
                       self_sigterm: bool = False, **extra: object) -> None:
    """Preempted with notice: it saves at the step it stopped at (0 steps lost, the progress file says so) and the
    resumed run has the same losses, bit for bit, as a run that was never interrupted. ``self_sigterm``: the
    trainer SIGTERMs itself (its ``extra`` say where) instead of this test after step ``sigterm_after``."""
    whole = whole or uninterrupted(script, tmp_path, steps, **extra)
    env = environment(str(tmp_path / "preempted"), STEPS=steps, STEP_S=0.2, **extra)
    first = run(script, env, sigterm_after=None if self_sigterm else sigterm_after)
    assert first.returncode == 143, first.stderr[-3000:]
    stopped = first.steps[-1]
    assert sigterm_after <= stopped < steps and first.steps == list(range(1, stopped + 1))
    assert "SIGTERM: saving at the next step boundary" in first.stderr
    assert "not saving" not in first.stderr, first.stderr[-3000:]
    found = finder.latest(env["RESPAWN_CHECKPOINT_URI"])
    assert found is not None and found.format == fmt, found
    assert found.step == stopped  # saved at the step it stopped at: 0 steps lost
    assert (progress(env)["step"], progress(env)["saved_step"]) == (stopped, stopped)
    resume(script, env, whole, stopped, steps)


def uninterrupted(script: str, tmp_path, steps: int, **extra: object) -> Run:
    whole = run(script, environment(str(tmp_path / "whole"), STEPS=steps, **extra))
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert whole.steps == list(range(1, steps + 1))
    return whole


def kill_mid_upload_and_resume(script: str, tmp_path, whole: Run, steps: int, fmt: str, hang_on: str,
                               **extra: object) -> None:
    """SIGKILL (no notice) while the upload of ``hang_on``, the last object of step 2 * SAVE_EVERY's save, is cut
    half-way: the bucket holds that save's other objects and a partial copy of its last one, the finder picks
    step SAVE_EVERY's save, never the half-uploaded one, and the run resumed from it has the uninterrupted
    run's losses. The progress file, as the last heartbeat would read it, has the step reached and that save."""
    tmp = str(tmp_path / "killed")
    env = environment(tmp, STEPS=steps, STEP_S=0.2, HANG_ON=hang_on, **extra)
    first = run(script, env, kill_when_exists=hung_file(tmp))
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    reached = first.steps[-1]
    assert 2 * SAVE_EVERY <= reached < steps
    bucket = env["RESPAWN_CHECKPOINT_URI"]
    cut = os.path.join(bucket, *hang_on.split("/"))
    assert not os.path.exists(cut)
    assert any(leaf.endswith(".partial") for leaf in os.listdir(os.path.dirname(cut)))  # the copy cut half-way
    found = finder.latest(bucket)
    assert found is not None and (found.format, found.step) == (fmt, SAVE_EVERY), found
    state = progress(env)
    assert state["saved_step"] == SAVE_EVERY and 2 * SAVE_EVERY <= state["step"] <= reached, state
    resume(script, env, whole, reached, steps)


def skip_and_resume(script: str, tmp_path, whole: Run, steps: int, fmt: str, **extra: object) -> None:
    """SIGTERM with a notice too short for a save: every measured upload takes at least 0.3 s (SLOW_UPLOAD_S)
    and a 0.2 s notice leaves at most 0.15 s before the deadline. Sent once step SAVE_EVERY's save is uploaded
    (and before the next one), the save at the step it stops at is skipped and stderr says so; the progress file
    has the step reached, and the resume is from step SAVE_EVERY's save."""
    tmp = str(tmp_path / "skipped")
    env = environment(tmp, STEPS=steps, STEP_S=0.3, SLOW_UPLOAD_S=0.3, RESPAWN_NOTICE_SECONDS=0.2, **extra)
    first = run(script, env, signal_when=lambda step: step > SAVE_EVERY + 1 and
                progress(env).get("saved_step") == SAVE_EVERY)
    assert first.returncode == 143, first.stderr[-3000:]
    stopped = first.steps[-1]
    assert SAVE_EVERY + 1 < stopped < 2 * SAVE_EVERY, (stopped, first.stderr[-3000:])  # the window it was sent in
    assert f"SIGTERM at step {stopped}: not saving: a save needs about" in first.stderr, first.stderr[-3000:]
    assert f"the newest complete save stays step {SAVE_EVERY}" in first.stderr
    found = finder.latest(env["RESPAWN_CHECKPOINT_URI"])
    assert found is not None and (found.format, found.step) == (fmt, SAVE_EVERY), found
    assert (progress(env)["step"], progress(env)["saved_step"]) == (stopped, SAVE_EVERY)
    resume(script, env, whole, stopped, steps)
