"""respawnkit.jax (Orbax, commit_success.txt last) in a real JAX run, preempted and resumed."""

from __future__ import annotations

import os

import pytest

from tests.frameworks.harness import JAX_SITE, REPO, preempt_and_resume

pytestmark = pytest.mark.timeout(600)


def test_jax_orbax_loop_resumes_from_its_sigterm_save(tmp_path) -> None:
    assert os.path.isdir(os.path.join(JAX_SITE, "orbax")), f"no jax/orbax under {JAX_SITE}: `make test-frameworks`"
    preempt_and_resume("jax_trainer.py", tmp_path, steps=20, sigterm_after=7, fmt="orbax", JAX_PLATFORMS="cpu",
                       PYTHONPATH=f"{REPO}{os.pathsep}{JAX_SITE}")
