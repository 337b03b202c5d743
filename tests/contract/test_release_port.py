"""The go at the starting line (``ComputeGateway.release``) and the preemption notice on insert
(``InstanceRequest.preemption_notice_s``), run against the in-memory fake and the real adapter
over the local Compute alike (issue 34)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest

from controller.adapters.google import compute_gateway
from controller.adapters.memory import MemoryCompute
from controller.core import errors, names
from controller.core.clock import SystemClock
from controller.core.ports import ComputeGateway
from controller.service.config import Settings
from localcloud.compute import ComputeServer
from tests.contract.test_ports import PROJECT, request_for, unique
from tests.wait import until

ZONE = "us-central1-a"


@dataclass
class Backend:
    name: str
    compute: ComputeGateway
    metadata_of: Callable[[str], dict[str, str]]  # the instance's metadata as its VM reads it now
    notice_of: Callable[[str], int]  # the preemption notice the instance was created with (seconds)
    refuse_notice: Callable[[bool], None]  # the project is (not) open to the notice's Preview
    # Another writer's items land in the instance's metadata during the next release, after it
    # read the metadata and before it writes (the fake, whose release is atomic: just before it).
    meanwhile: Callable[[str, dict[str, str]], None]


@pytest.fixture(scope="module")
def local_compute() -> Iterator[ComputeServer]:
    with ComputeServer(boot_delay=0.05, shutdown_budget=0.2, run_vms=False) as srv:
        yield srv


def _memory() -> Backend:
    compute = MemoryCompute(SystemClock())

    def refuse(on: bool) -> None:
        # The fake has no notice of its own to refuse: it raises, on the next insert, what the
        # adapter makes of Compute's 400.
        if on:
            compute.faults.fail_next("insert", errors.NoticeRefused(ZONE, "Invalid value for field "
                                                                          "'resource.scheduling.preemptionNoticeDuration'"))

    return Backend("memory", compute, compute.metadata_of, lambda n: compute.request_of(n).preemption_notice_s,
                   refuse, meanwhile=lambda n, items: compute.release(PROJECT, ZONE, n, items))


def _local(srv: ComputeServer) -> Backend:
    gateway = compute_gateway(Settings(bucket="b", project=PROJECT, compute_endpoint=srv.endpoint))

    def metadata_of(name: str) -> dict[str, str]:
        return {i["key"]: i["value"] for i in srv.instance(name)["metadata"]["items"]}

    def notice_of(name: str) -> int:
        return int((srv.instance(name)["scheduling"].get("preemptionNoticeDuration") or {}).get("seconds") or 0)

    def meanwhile(name: str, items: dict[str, str]) -> None:
        gateway.instances = _WriteAfterRead(gateway.instances, lambda: srv.set_metadata(name, items))

    return Backend("local", gateway, metadata_of, notice_of, srv.refuse_notice, meanwhile)


class _WriteAfterRead:
    """The v1 InstancesClient, but its next ``get`` is followed by someone else's write."""

    def __init__(self, client: Any, write: Callable[[], None]) -> None:
        self._client, self._write = client, write

    def get(self, *args: Any, **kwargs: Any) -> Any:
        got = self._client.get(*args, **kwargs)
        if self._write is not None:
            self._write, write = None, self._write
            write()
        return got

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@pytest.fixture(params=["memory", "local"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "memory":
        yield _memory()
        return
    srv = request.getfixturevalue("local_compute")
    yield _local(srv)
    srv.refuse_notice(False)


def inserted(backend: Backend, notice_s: int = 0) -> str:
    job = unique("r")
    backend.compute.insert([replace(request_for(job), preemption_notice_s=notice_s)], names.request_id(job, 1, 0))
    return names.instance_name(job, 1)


GO = {"respawn-go": "1", "respawn-resume-from": "gs://b/ckpt/step-40", "respawn-resume-step": "40"}


class TestRelease:
    def test_the_go_is_merged_into_the_metadata_the_vm_was_inserted_with(self, backend):
        name = inserted(backend)
        before = backend.metadata_of(name)
        assert backend.compute.release(PROJECT, ZONE, name, GO) is True
        assert backend.metadata_of(name) == {**before, **GO}

    def test_a_go_once_given_is_never_changed(self, backend):
        name = inserted(backend)
        assert backend.compute.release(PROJECT, ZONE, name, GO) is True
        given = backend.metadata_of(name)
        assert backend.compute.release(PROJECT, ZONE, name, {"respawn-go": "2", "respawn-resume-from": ""}) is False
        assert backend.compute.release(PROJECT, ZONE, name, {"other": "x"}) is False  # nothing at all once go is there
        assert backend.metadata_of(name) == given

    def test_releasing_an_instance_that_is_gone_is_not_found(self, backend):
        with pytest.raises(errors.NotFound):
            backend.compute.release(PROJECT, ZONE, unique("never"), GO)
        name = inserted(backend)
        backend.compute.delete(PROJECT, ZONE, name)
        until("the instance gone", lambda: name not in {i.name for i in backend.compute.list_managed([PROJECT]).instances})
        with pytest.raises(errors.NotFound):
            backend.compute.release(PROJECT, ZONE, name, GO)

    def test_a_write_that_came_between_the_read_and_the_write_is_kept_and_the_go_given(self, backend):
        name = inserted(backend)
        backend.meanwhile(name, {"someone-else": "was here"})
        assert backend.compute.release(PROJECT, ZONE, name, GO) is True
        after = backend.metadata_of(name)
        assert after["someone-else"] == "was here" and {k: after[k] for k in GO} == GO

    def test_a_go_given_by_another_writer_between_the_read_and_the_write_is_never_overwritten(self, backend):
        name = inserted(backend)
        backend.meanwhile(name, {"respawn-go": "1", "respawn-resume-from": "gs://b/ckpt/step-30"})
        assert backend.compute.release(PROJECT, ZONE, name, {**GO, "respawn-go": "1"}) is False
        assert backend.metadata_of(name)["respawn-resume-from"] == "gs://b/ckpt/step-30"


class TestPreemptionNotice:
    @pytest.mark.parametrize("notice", [0, 120])
    def test_an_insert_carries_the_notice_it_asks_for(self, backend, notice):
        name = inserted(backend, notice)
        assert backend.notice_of(name) == notice

    def test_a_gang_carries_its_notice_on_every_node(self, backend):
        job = unique("g")
        nodes = [replace(request_for(job, name=n), preemption_notice_s=120) for n in names.node_names(job, 1, 2)]
        backend.compute.insert(nodes, names.request_id(job, 1, 0))
        assert [backend.notice_of(n.name) for n in nodes] == [120, 120]

    def test_a_refused_notice_is_notice_refused_and_the_same_vm_without_one_is_taken(self, backend):
        job = unique("n")
        backend.refuse_notice(True)
        with pytest.raises(errors.NoticeRefused) as refused:
            backend.compute.insert([replace(request_for(job), preemption_notice_s=120)], names.request_id(job, 1, 0))
        assert refused.value.zone == ZONE and "preemptionNoticeDuration" in str(refused.value)
        assert isinstance(refused.value, errors.RequestError)  # terminal for this request, as the port says
        backend.compute.insert([request_for(job)], names.request_id(job, 1, 1))
        assert backend.notice_of(names.instance_name(job, 1)) == 0
