"""Run a framework trainer script three ways and compare: uninterrupted, SIGTERMed mid-run, resumed.

A trainer script prints ``step N loss X`` (X as ``repr``: every bit) for each step it trains, saves through a
respawnkit hook into the local "bucket" RESPAWN_CHECKPOINT_URI names, and exits 143 after a SIGTERM save.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field

from tests.kit import finder

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


@dataclass
class Run:
    returncode: int
    losses: dict[int, str] = field(default_factory=dict)
    stderr: str = ""

    @property
    def steps(self) -> list[int]:
        return sorted(self.losses)


def run(script: str, env: dict[str, str], sigterm_after: int | None = None, timeout: float = 300,
        signal_to_send: int = signal.SIGTERM, args: tuple[str, ...] = (), cwd: str = REPO) -> Run:
    """Run ``script`` (under tests/frameworks, or a path) with ``args``; with ``sigterm_after``, SIGTERM it (or
    ``signal_to_send``) once it has printed that step."""
    process = subprocess.Popen([sys.executable, os.path.join(HERE, script), *args], env=env, cwd=cwd,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    result, signalled = Run(0), False
    try:
        for line in process.stdout:
            words = line.split()
            if len(words) == 4 and words[0] == "step" and words[2] == "loss":
                step = int(words[1])
                assert step not in result.losses, f"step {step} trained twice"
                result.losses[step] = words[3]
                if sigterm_after is not None and step >= sigterm_after and not signalled:
                    process.send_signal(signal_to_send)
                    signalled = True
        result.stderr = process.stderr.read()
        result.returncode = process.wait(timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return result


def environment(tmp: str, **extra: object) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RESPAWN_", "RESUME_"))}
    return {**base, "PYTHONPATH": REPO, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1", "WORK": tmp,
            "RESPAWN_CHECKPOINT_URI": os.path.join(tmp, "bucket"), **{k: str(v) for k, v in extra.items()}}


def preempt_and_resume(script: str, tmp_path, steps: int, sigterm_after: int, fmt: str, **extra: object) -> None:
    """The whole story, asserted: 0 steps lost, and the same losses as a run that was never interrupted."""
    whole = run(script, environment(str(tmp_path / "whole"), STEPS=steps, **extra))
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert whole.steps == list(range(1, steps + 1))

    tmp = str(tmp_path / "preempted")
    env = environment(tmp, STEPS=steps, STEP_S=0.2, **extra)
    first = run(script, env, sigterm_after=sigterm_after)
    assert first.returncode == 143, first.stderr[-3000:]
    stopped = first.steps[-1]
    assert sigterm_after <= stopped < steps and first.steps == list(range(1, stopped + 1))
    assert "SIGTERM: saving at the next step boundary" in first.stderr
    found = finder.latest(env["RESPAWN_CHECKPOINT_URI"])
    assert found is not None and found.format == fmt, found
    assert found.step == stopped  # saved at the step it stopped at: 0 steps lost

    second = run(script, {**env, "STEP_S": "0", "RESUME_FROM": finder.local(found, env["RESPAWN_CHECKPOINT_URI"]),
                          "RESUME_STEP": str(found.step)})
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.steps == list(range(stopped + 1, steps + 1))
    assert {**first.losses, **second.losses} == whole.losses


# JAX and Orbax bring their own protobuf and numpy pins, which the project's lock must not take: `make
# test-frameworks` installs them into a folder of their own, added to the JAX trainer's path only.
JAX_SITE = os.environ.get("RESPAWN_JAX_SITE") or os.path.join(REPO, ".venv", "jax-site")


def kill_and_resume(script: str, tmp_path, steps: int, kill_after: int, saved: int, fmt: str) -> None:
    """SIGKILL (no notice) after step ``kill_after``: the run resumes from the periodic save of step ``saved``,
    written asynchronously while training went on, with the same losses as an uninterrupted run."""
    whole = run(script, environment(str(tmp_path / "whole"), STEPS=steps))
    assert whole.returncode == 0, whole.stderr[-3000:]
    env = environment(str(tmp_path / "killed"), STEPS=steps, STEP_S=0.2)
    first = run(script, env, sigterm_after=kill_after, signal_to_send=signal.SIGKILL)
    assert first.returncode == -signal.SIGKILL
    found = finder.latest(env["RESPAWN_CHECKPOINT_URI"])
    assert (found.format, found.step) == (fmt, saved)
    second = run(script, {**env, "STEP_S": "0", "RESUME_FROM": finder.local(found, env["RESPAWN_CHECKPOINT_URI"]),
                          "RESUME_STEP": str(found.step)})
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.steps == list(range(saved + 1, steps + 1))
    assert second.losses == {s: whole.losses[s] for s in second.steps}
