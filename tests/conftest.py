"""Isolation for every test: no RESPAWN_* environment leaks in, no engine leaks out."""

from __future__ import annotations

import os

import pytest

from controller.service import bootstrap
from tests.harness import Harness


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("RESPAWN_") or key in ("GOOGLE_CLOUD_PROJECT", "FUNCTION_TARGET"):
            monkeypatch.delenv(key)
    bootstrap.override(None)
    yield
    bootstrap.override(None)


@pytest.fixture
def h() -> Harness:
    return Harness()
