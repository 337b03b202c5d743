"""The examples (examples/hf-finetune, examples/lightning) as they ship, on CPU with their tiny models: a run
SIGTERMed mid-way saves at the step it stopped at, and the run resumed from that save (as respawn's finder
picks it) trains the remaining steps with the uninterrupted run's losses, bit for bit, and ends with its
weights."""

from __future__ import annotations

import json
import os

import pytest

from tests.frameworks.harness import REPO, environment, run
from tests.kit import finder

pytestmark = pytest.mark.timeout(600)

STEPS, SIGTERM_AFTER = 20, 7


def final_weights(loss_log: str) -> str | None:
    with open(loss_log) as f:
        records = [json.loads(line) for line in f]
    return next((r["final"] for r in records if "final" in r), None)


def attempt(script: str, work: str, env: dict[str, str], **kw: object):  # noqa: ANN201
    os.makedirs(work, exist_ok=True)
    args = ("--device", "cpu", "--steps", str(STEPS), "--save-every", "5", "--loss-log",
            os.path.join(work, "losses.jsonl"), *kw.pop("args", ()))
    return run(script, env, args=args, cwd=work, **kw)


def preempt_and_resume_example(example: str, tmp_path, fmt: str) -> None:
    script = os.path.join(REPO, "examples", example, "train.py")
    whole_dir = str(tmp_path / "whole")
    whole = attempt(script, whole_dir, environment(whole_dir))
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert whole.steps == list(range(1, STEPS + 1))
    reference = final_weights(os.path.join(whole_dir, "losses.jsonl"))
    assert reference is not None

    tmp = str(tmp_path / "preempted")
    env = environment(tmp)
    first = attempt(script, os.path.join(tmp, "attempt-1"), env, sigterm_after=SIGTERM_AFTER, args=("--pause", "0.2"))
    assert first.returncode == 143, first.stderr[-3000:]
    stopped = first.steps[-1]
    assert SIGTERM_AFTER <= stopped < STEPS and first.steps == list(range(1, stopped + 1))
    assert "SIGTERM: saving at the next step boundary" in first.stderr
    found = finder.latest(env["RESPAWN_CHECKPOINT_URI"])
    assert found is not None and found.format == fmt, found
    assert found.step == stopped  # saved at the step it stopped at: 0 steps lost

    # A new "VM": its own empty folder, the checkpoint named as respawn's agent names it
    second_dir = os.path.join(tmp, "attempt-2")
    second = attempt(script, second_dir, {**env, "RESUME_FROM": finder.local(found, env["RESPAWN_CHECKPOINT_URI"]),
                                          "RESUME_STEP": str(found.step)})
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.steps == list(range(stopped + 1, STEPS + 1))
    assert {**first.losses, **second.losses} == whole.losses
    assert final_weights(os.path.join(second_dir, "losses.jsonl")) == reference


def test_huggingface_example_resumes_from_its_sigterm_save_with_the_same_losses_and_weights(tmp_path) -> None:
    preempt_and_resume_example("hf-finetune", tmp_path, "huggingface")


def test_lightning_example_resumes_from_its_sigterm_save_with_the_same_losses_and_weights(tmp_path) -> None:
    preempt_and_resume_example("lightning", tmp_path, "files")
