"""The kit's tests: the trainer's side of the contract, standard library only."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAINER = os.path.join(REPO, "tests", "kit", "trainer.py")


@pytest.fixture(autouse=True)
def _no_agent_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("RESUME_FROM", "RESUME_STEP", "RESUME_TAG", "NODE_RANK", "RESPAWN_NOTICE_FILE", "RESPAWN_NOTICE_SECONDS",
                "RESPAWN_NOTICE_DEADLINE"):
        monkeypatch.delenv(key, raising=False)


def trainer_env(bucket: str, **extra: object) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_") and not k.startswith("RESUME_")}
    return {**base, "RESPAWN_CHECKPOINT_URI": bucket, "PYTHONUNBUFFERED": "1",
            **{k: str(v) for k, v in extra.items()}}


@pytest.fixture
def spawn() -> Iterator:
    """Start tests/kit/trainer.py; every process started is killed at the end."""
    started: list[subprocess.Popen] = []

    def start(env: dict[str, str]) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, TRAINER], env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()
