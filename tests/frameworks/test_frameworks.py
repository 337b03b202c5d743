"""respawnkit's hooks in real framework runs, each integration the same four ways (issue 27's proof):

- preempted with notice (SIGTERM mid-run): it saves at the step it stopped at and resumes there, 0 steps lost;
- SIGKILLed in the middle of an upload (hung, deterministically, at its save's last object): respawn's finder
  picks the last fully uploaded save, never the half-uploaded one;
- SIGTERMed with a notice too short for the measured save: the save is skipped, stderr says so, and the resume is
  from the previous save;
- in each, the progress file (RESPAWN_PROGRESS_FILE, what the VM agent puts into its heartbeat) has the step
  reached and the newest uploaded save,

and every resumed run trains the remaining steps with the losses, bit for bit, of a run never interrupted."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest

from tests.frameworks.harness import (JAX_SITE, REPO, SAVE_EVERY, Run, kill_mid_upload_and_resume,
                                      preempt_and_resume, skip_and_resume, uninterrupted)

pytestmark = pytest.mark.timeout(600)

STEPS = 20


@dataclass(frozen=True)
class Framework:
    script: str
    fmt: str  # what respawn's finder calls the saves
    last_object: str  # the object of a save uploaded last, for step {step}
    env: dict[str, str] = field(default_factory=dict)


FRAMEWORKS = {
    "torch": Framework("torch_trainer.py", "dcp", "step-{step:09d}/.metadata"),
    "lightning": Framework("lightning_trainer.py", "files", "step-{step:09d}.ckpt"),
    "huggingface": Framework("hf_trainer.py", "huggingface", "checkpoint-{step}/trainer_state.json"),
    "jax": Framework("jax_trainer.py", "orbax", "{step}/commit_success.txt",
                     {"JAX_PLATFORMS": "cpu", "PYTHONPATH": f"{REPO}{os.pathsep}{JAX_SITE}"}),
}


@pytest.fixture(params=list(FRAMEWORKS))
def framework(request: pytest.FixtureRequest) -> Framework:
    if request.param == "jax":
        assert os.path.isdir(os.path.join(JAX_SITE, "orbax")), f"no jax/orbax under {JAX_SITE}: `make test-frameworks`"
    return FRAMEWORKS[request.param]


@pytest.fixture(scope="session")
def whole_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    return {}


def whole_run(framework: Framework, whole_runs: dict[str, Run], tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The uninterrupted run's losses, once per framework."""
    if framework.script not in whole_runs:
        whole_runs[framework.script] = uninterrupted(framework.script, tmp_path_factory.mktemp("whole"), STEPS,
                                                     **framework.env)
    return whole_runs[framework.script]


@pytest.fixture
def whole(framework: Framework, whole_runs: dict[str, Run], tmp_path_factory: pytest.TempPathFactory) -> Run:
    return whole_run(framework, whole_runs, tmp_path_factory)


def test_preempted_with_notice_resumes_at_the_step_it_saved(framework: Framework, whole: Run, tmp_path) -> None:
    preempt_and_resume(framework.script, tmp_path, STEPS, sigterm_after=7, fmt=framework.fmt, whole=whole,
                       **framework.env)


def test_killed_mid_upload_resumes_from_the_last_whole_save(framework: Framework, whole: Run, tmp_path) -> None:
    kill_mid_upload_and_resume(framework.script, tmp_path, whole, STEPS, framework.fmt,
                               framework.last_object.format(step=2 * SAVE_EVERY), **framework.env)


def test_a_save_that_cannot_meet_the_deadline_is_skipped_and_said(framework: Framework, whole: Run, tmp_path) -> None:
    skip_and_resume(framework.script, tmp_path, whole, STEPS, framework.fmt, **framework.env)


def test_lightning_saves_for_a_sigterm_that_comes_after_the_callbacks_batch_end(
        whole_runs: dict[str, Run], tmp_path_factory: pytest.TempPathFactory, tmp_path) -> None:
    # Lightning raises its SIGTERMException at the end of the step, before the callback's next on_train_batch_end:
    # the notice's save at that step is made in on_exception (it was lost before)
    whole = whole_run(FRAMEWORKS["lightning"], whole_runs, tmp_path_factory)
    preempt_and_resume("lightning_trainer.py", tmp_path, STEPS, sigterm_after=7, fmt="files", whole=whole,
                       self_sigterm=True, SIGTERM_SELF_AT=7)
