"""What the two TPU ports' contract modules share: test_tpu_port.py (the Cloud TPU API's nodes) and
test_tpu_slices_port.py (TPU slices in Compute Engine). Each runs its tests against its in-memory fake
and its real adapter over a local server (``Backend``, ``backend_for``), names, creates and deletes nodes
alike (``unique``, ``create``, ``not_found_once_gone``), and passes the tests of ``TpuPortContract``,
reached through its own fixtures: ``port`` (where its nodes are, how a job's are read) and ``shape``
(what a node is made of)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from controller.core import errors, names
from controller.core.ports import NodeState, TpuGateway, TpuNode, TpuRequest

BACKENDS = ["memory", "local"]  # a ``backend`` fixture's params
INVALID_JOBS = ['x" OR labels.respawn-job = "y', "Upper", "-dash", "a" * 51, "a-"]
B = TypeVar("B")


@dataclass
class Backend:
    """A TPU gateway, and what Google does to the nodes behind it that both ports' tests ask for (each
    module's Backend adds its own)."""

    name: str
    tpu: TpuGateway
    stockout: Callable[[str, bool], None]
    quota: Callable[[str, bool], None]
    hold: Callable[[bool], None]  # True: creates stay unfinished past the wait; False: they finish now


def backend_for(request: pytest.FixtureRequest, memory: Callable[[], B], local: Callable[[Any], B]) -> B:
    """The backend a ``backend`` fixture's param names: the fake, or the real adapter over the module's ``server``."""
    if request.param == "memory":
        return memory()
    return local(request.getfixturevalue("server"))


def unique(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def create(backend: Backend, r: TpuRequest, retry: int = 0) -> None:
    """``r`` created under the request id of its job, its attempt and ``retry``, as the controller's."""
    backend.tpu.create(r, names.request_id(r.labels[names.JOB_LABEL], int(r.labels[names.ATTEMPT_LABEL]), retry))


def not_found_once_gone(backend: Backend, project: str, zone: str, name: str) -> None:
    """A delete of ``name``, gone, is NotFound; so is one of a name never used."""
    with pytest.raises(errors.NotFound):
        backend.tpu.delete(project, zone, name)
    with pytest.raises(errors.NotFound):
        backend.tpu.delete(project, zone, unique("never"))


@dataclass(frozen=True)
class Port:
    """A port as the shared tests reach it: its project and zone, and a job's nodes there (``mine``: all
    of them by name; ``ready``: its first one, once READY)."""

    project: str
    zone: str
    mine: Callable[[Any, str], dict[str, TpuNode]]  # (a module's Backend, job)
    ready: Callable[[Any, str], TpuNode]


@dataclass(frozen=True)
class Shape:
    """A node the shared tests create: ``request`` (a job, then TpuRequest's fields to change) and the
    workers the node has."""

    request: Callable[..., TpuRequest]
    workers: int


class TpuPortContract:
    """The tests both TPU ports pass alike (the fixtures ``backend``, ``port`` and ``shape`` are each module's)."""

    def test_a_standard_node_is_not_spot(self, backend, port, shape):
        job = unique()
        create(backend, shape.request(job, spot=False))
        assert port.ready(backend, job).spot is False

    def test_create_again_while_being_made_or_once_up_is_success_without_a_duplicate(self, backend, port, shape):
        job = unique()
        create(backend, shape.request(job))
        create(backend, shape.request(job))  # the same request again
        create(backend, shape.request(job), retry=1)  # another request id, the same name
        node = port.ready(backend, job)
        create(backend, shape.request(job))  # again once it is up
        create(backend, shape.request(job), retry=2)
        assert list(port.mine(backend, job)) == [f"{job}-1"] and node.workers == shape.workers

    @pytest.mark.parametrize("job", INVALID_JOBS)
    def test_an_invalid_job_name_is_refused(self, backend, port, job):
        with pytest.raises(errors.RequestError):
            backend.tpu.list_nodes([port.project], [port.zone], job)

    def test_a_held_create_is_pending_then_the_same_request_succeeds_without_a_duplicate(self, backend, port, shape):
        job = unique()
        r = shape.request(job)
        backend.hold(True)
        try:
            with pytest.raises(errors.OperationPending):
                create(backend, r)
            assert [n.state for n in port.mine(backend, job).values()] == [NodeState.CREATING]
            with pytest.raises(errors.OperationPending):  # still running: asking again does not make it done
                create(backend, r)
        finally:
            backend.hold(False)
        create(backend, r)
        node = port.ready(backend, job)
        assert list(port.mine(backend, job)) == [node.name] and node.workers == shape.workers
