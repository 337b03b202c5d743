"""A run preempted with notice (SIGTERM mid-run) resumes at the step it saved, with 0 steps lost and the same
losses, bit for bit, as a run that was never interrupted; the save is one respawn's finder picks."""

from __future__ import annotations

import pytest

from tests.frameworks.harness import preempt_and_resume

pytestmark = pytest.mark.timeout(600)


def test_plain_torch_loop_resumes_from_its_sigterm_save(tmp_path) -> None:
    preempt_and_resume("torch_trainer.py", tmp_path, steps=20, sigterm_after=7, fmt="dcp")


def test_lightning_fit_resumes_from_its_sigterm_save(tmp_path) -> None:
    preempt_and_resume("lightning_trainer.py", tmp_path, steps=20, sigterm_after=7, fmt="files")


def test_huggingface_trainer_resumes_from_its_sigterm_save(tmp_path) -> None:
    preempt_and_resume("hf_trainer.py", tmp_path, steps=20, sigterm_after=7, fmt="huggingface")
