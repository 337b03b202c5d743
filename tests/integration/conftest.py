"""Fixtures the VM agent's tests share."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.integration.test_vm_agent import FakeMetadata


@pytest.fixture
def fake_md() -> Iterator[Callable[[dict[str, Any]], FakeMetadata]]:
    """Scripted metadata servers (``FakeMetadata``), closed after the test."""
    servers: list[FakeMetadata] = []

    def make(values: dict[str, Any]) -> FakeMetadata:
        servers.append(FakeMetadata(values))
        return servers[-1]

    yield make
    for s in servers:
        s.close()
