"""A run preempted with notice (SIGTERM mid-run) resumes at the step it saved, with 0 steps lost and the same
losses, bit for bit, as a run that was never interrupted; the save is one respawn's finder picks."""

from __future__ import annotations

import pytest

from tests.frameworks.harness import kill_and_resume, preempt_and_resume

pytestmark = pytest.mark.timeout(600)


def test_plain_torch_loop_resumes_from_its_sigterm_save(tmp_path) -> None:
    preempt_and_resume("torch_trainer.py", tmp_path, steps=20, sigterm_after=7, fmt="dcp")


def test_plain_torch_loop_resumes_from_a_periodic_async_save_after_a_kill(tmp_path) -> None:
    # saves every 5 steps (SAVE_EVERY); killed after step 12, it resumes from step 10's, written while it trained
    kill_and_resume("torch_trainer.py", tmp_path, steps=20, kill_after=12, saved=10, fmt="dcp")


def test_lightning_fit_resumes_from_its_sigterm_save(tmp_path) -> None:
    preempt_and_resume("lightning_trainer.py", tmp_path, steps=20, sigterm_after=7, fmt="files")


def test_huggingface_trainer_resumes_from_its_sigterm_save(tmp_path) -> None:
    preempt_and_resume("hf_trainer.py", tmp_path, steps=20, sigterm_after=7, fmt="huggingface")
