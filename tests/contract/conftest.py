"""Fixtures the contract modules share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from localcloud.compute import ComputeServer


@pytest.fixture(scope="module")
def compute_server() -> Iterator[ComputeServer]:
    """A local Compute server without VM processes (advice, quotas: what a port reads of it), one a module."""
    with ComputeServer(run_vms=False) as srv:
        yield srv
