"""The TPU port's contract, run against the in-memory fake and the real adapter alike.

The real adapter (``CloudTpu`` on ``tpu_v2.TpuClient``, REST) talks to the local TPU
server over HTTP, so a fake that drifts from what the adapter reads fails here for one
backend and not the other. The tests TPU slices in Compute Engine pass alike (test_tpu_slices_port.py)
are tpu_contract.TpuPortContract's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import pytest
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2

from controller.core import errors, names
from controller.adapters.google import tpu_gateway
from controller.adapters.memory import MemoryTpu
from controller.core.clock import SystemClock
from controller.service.config import Settings
from controller.core.ports import NodeHealth, NodeState, QueuedState, TpuNode, TpuRequest
from localcloud.tpu import TpuServer
from tests.contract import tpu_contract
from tests.contract.tpu_contract import (BACKENDS, Port, Shape, TpuPortContract, backend_for, create,
                                          not_found_once_gone, unique)
from tests.wait import until

PROJECT = "contract-proj"
ZONE = "us-central1-a"
DARK = "us-west9-z"  # a zone that does not answer (the local server offers no such location: 403)


@dataclass
class Backend(tpu_contract.Backend):
    """A TPU gateway, and what Google (or a person) would do to the nodes behind it."""

    preempt: Callable[[str], None]
    set_state: Callable[[str, str], None]
    set_health: Callable[[str, str], None]
    maintenance_notice: Callable[[str, bool], None]  # Node.upcomingMaintenance set (True) or cleared
    foreign: Callable[[str, dict[str, str]], None]  # a node someone else created in ZONE
    denied: Callable[[str, bool], None]  # the project may (not) use DARK: Google's 403 on the location


def _memory() -> Backend:
    fake = MemoryTpu(SystemClock())
    fake.delete_seconds = 0.3  # accepted at once, done a moment later, as the local server's
    return Backend(
        "memory", fake, stockout=fake.stockout, quota=fake.quota, preempt=fake.preempt,
        set_state=fake.set_state, set_health=fake.set_health, maintenance_notice=fake.upcoming_maintenance,
        hold=fake.hold_operations, foreign=lambda n, labels: fake.add_foreign(PROJECT, ZONE, n, labels),
        denied=lambda z, on: (fake.denied_zones.add if on else fake.denied_zones.discard)(z),
    )


@pytest.fixture(scope="module")
def server() -> Iterator[TpuServer]:
    with TpuServer(boot_delay=0.05, shutdown_budget=0.5) as srv:
        yield srv


def _local(srv: TpuServer) -> Backend:
    gateway = tpu_gateway(Settings(project=PROJECT, tpu_endpoint=srv.endpoint))
    gateway.operation_timeout = 30.0
    raw = tpu_v2.TpuClient(transport="rest", credentials=AnonymousCredentials(),
                           client_options=ClientOptions(api_endpoint=srv.endpoint))

    def foreign(name: str, labels: dict[str, str]) -> None:
        raw.create_node(parent=f"projects/{PROJECT}/locations/{ZONE}", node_id=name,
                        node=tpu_v2.Node(accelerator_type="v5litepod-1", runtime_version="v2-alpha-tpuv5-lite",
                                         labels=labels))

    def hold(on: bool) -> None:
        gateway.operation_timeout = 0.5 if on else 30.0  # the adapter's wait gives up at its deadline
        srv.hold_operations(on)

    return Backend(
        "local", gateway, stockout=srv.stockout, quota=srv.quota, preempt=srv.preempt, set_state=srv.set_state,
        set_health=srv.set_health, maintenance_notice=srv.upcoming_maintenance, hold=hold, foreign=foreign,
        denied=lambda zone, on: None,  # DARK is never served: Google's 403 for a location one may not use
    )


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    return backend_for(request, _memory, _local)


def request_for(job: str, attempt: int = 1, zone: str = ZONE, *, spot: bool = True, queued: bool = False,
                accelerator_type: str = "v5litepod-8") -> TpuRequest:
    return TpuRequest(
        project=PROJECT, zone=zone, name=names.instance_name(job, attempt), accelerator_type=accelerator_type,
        runtime_version="v2-alpha-tpuv5-lite", spot=spot,
        labels={names.MANAGED_LABEL: "true", names.JOB_LABEL: job, names.ATTEMPT_LABEL: str(attempt)},
        metadata={"respawn-job": job, "startup-script": "#!/bin/bash\nsleep 300\n"},
        service_account="default", scopes=("https://www.googleapis.com/auth/cloud-platform",),
        network="default", subnetwork=None, external_ip=False, tags=("respawn",), queued=queued)


def mine(backend: Backend, job: str, zones: tuple[str, ...] = (ZONE,)) -> dict[str, TpuNode]:
    return {n.name: n for n in backend.tpu.list_nodes([PROJECT], list(zones), job).nodes}


def ready(backend: Backend, job: str) -> TpuNode:
    """The job's first node once READY (the local server boots it after a short delay)."""
    name = names.instance_name(job, 1)
    return until("READY", lambda: (n := mine(backend, job).get(name)) and n.state == NodeState.READY and n)


@pytest.fixture
def port() -> Port:
    return Port(PROJECT, ZONE, mine, ready)


@pytest.fixture
def shape() -> Shape:
    return Shape(request_for, workers=1)  # v5litepod-8: one host


class TestTpuGateway(TpuPortContract):
    def test_create_then_list_shows_the_node_as_requested(self, backend):
        job = unique()
        create(backend, request_for(job))
        node = ready(backend, job)
        assert (node.project, node.zone, node.name) == (PROJECT, ZONE, f"{job}-1")
        assert (node.job, node.attempt, node.managed) == (job, 1, True)
        assert node.labels == {names.MANAGED_LABEL: "true", names.JOB_LABEL: job, names.ATTEMPT_LABEL: "1"}
        assert (node.accelerator_type, node.spot, node.workers) == ("v5litepod-8", True, 1)
        assert node.health == NodeHealth.HEALTHY and node.id and node.created_at.tzinfo is not None
        assert node.queued is None and node.upcoming_maintenance is None

    @pytest.mark.parametrize("accelerator, workers", [("v4-8", 1), ("v4-16", 2), ("v5litepod-16", 4)])
    def test_a_multi_host_slice_has_one_worker_per_host(self, backend, accelerator, workers):
        job = unique()
        create(backend, request_for(job, accelerator_type=accelerator))
        node = ready(backend, job)
        assert (node.accelerator_type, node.workers) == (accelerator, workers)

    def test_list_shows_only_managed_nodes_and_one_jobs_with_job(self, backend):
        job, other = unique("j"), unique("o")
        create(backend, request_for(job))
        create(backend, request_for(other))
        backend.foreign(f"{job}-7", {names.JOB_LABEL: job})  # no managed label
        backend.foreign(f"{job}-8", {names.MANAGED_LABEL: "false", names.JOB_LABEL: job})
        assert list(mine(backend, job)) == [f"{job}-1"]
        everything = backend.tpu.list_nodes([PROJECT], [ZONE]).nodes
        assert {f"{job}-1", f"{other}-1"} <= {n.name for n in everything}
        assert all(n.managed for n in everything)
        assert mine(backend, job, ("us-central1-b",)) == {}  # only the zones asked for

    def test_zones_are_listed_side_by_side(self, backend):
        job = unique()
        create(backend, request_for(job, 1, "us-central1-a"))
        create(backend, request_for(job, 2, "us-central1-b"))
        listed = backend.tpu.list_nodes([PROJECT], ["us-central1-a", "us-central1-b", "us-central1-c"], job)
        assert sorted((n.name, n.zone) for n in listed.nodes) == [(f"{job}-1", "us-central1-a"),
                                                                  (f"{job}-2", "us-central1-b")]
        assert listed.unreachable == [] and listed.failed_projects == {}

    def test_a_zone_or_project_named_twice_lists_each_node_once(self, backend):
        job = unique()
        create(backend, request_for(job))
        listed = backend.tpu.list_nodes([PROJECT, PROJECT], [ZONE, "us-central1-b", ZONE], job)
        assert [n.name for n in listed.nodes] == [f"{job}-1"]

    def test_stockout_is_a_capacity_error_naming_the_zone(self, backend):
        job = unique()
        backend.stockout("us-central1-f", True)
        try:
            with pytest.raises(errors.CapacityError) as e:
                create(backend, request_for(job, zone="us-central1-f"))
            assert e.value.zone == "us-central1-f" and "RESOURCE_EXHAUSTED" in e.value.reason
        finally:
            backend.stockout("us-central1-f", False)
        until("nothing left of the stocked-out node", lambda: mine(backend, job, ("us-central1-f",)) == {})

    @pytest.mark.parametrize("queued", [False, True])
    def test_quota_is_a_quota_error(self, backend, queued):
        job = unique()
        backend.quota("us-central1-c", True)
        try:
            with pytest.raises(errors.QuotaError) as e:
                create(backend, request_for(job, zone="us-central1-c", queued=queued))
            assert e.value.zone == "us-central1-c" and "QUOTA" in e.value.reason
        finally:
            backend.quota("us-central1-c", False)
        assert mine(backend, job, ("us-central1-c",)) == {}

    def test_a_held_create_then_stocked_out_reads_the_stockout(self, backend):
        job = unique()
        r = request_for(job, zone="us-east1-b")
        backend.hold(True)
        try:
            with pytest.raises(errors.OperationPending):
                create(backend, r)
            backend.stockout("us-east1-b", True)  # capacity is decided when the operation finishes
        finally:
            backend.hold(False)
        try:
            until("the stocked-out node to go", lambda: mine(backend, job, ("us-east1-b",)) == {})
            with pytest.raises(errors.CapacityError) as e:
                create(backend, r)
            assert e.value.zone == "us-east1-b"
        finally:
            backend.stockout("us-east1-b", False)

    def test_delete_then_gone_and_a_missing_node_is_not_found(self, backend):
        job = unique()
        create(backend, request_for(job))
        ready(backend, job)
        backend.tpu.delete(PROJECT, ZONE, f"{job}-1")
        until("the node to go", lambda: mine(backend, job) == {})
        not_found_once_gone(backend, PROJECT, ZONE, f"{job}-1")

    def test_preempted_reads_preempted(self, backend):
        job = unique()
        create(backend, request_for(job))
        ready(backend, job)
        backend.preempt(f"{job}-1")
        until("PREEMPTED", lambda: mine(backend, job)[f"{job}-1"].state == NodeState.PREEMPTED)

    @pytest.mark.parametrize("sent, read", [
        ("SOMETHING_NEW", NodeState.UNKNOWN),
        ("REPAIRING", NodeState.REPAIRING),
        ("TERMINATED", NodeState.TERMINATED),
        ("HIDDEN", NodeState.HIDDEN),
    ])
    def test_any_state_the_api_sends_is_read_never_raised(self, backend, sent, read):
        job = unique()
        create(backend, request_for(job))
        ready(backend, job)
        backend.set_state(f"{job}-1", sent)
        assert mine(backend, job)[f"{job}-1"].state is read

    @pytest.mark.parametrize("sent, read", [
        ("SOMETHING_NEW", NodeHealth.UNKNOWN),
        ("UNHEALTHY_MAINTENANCE", NodeHealth.UNHEALTHY_MAINTENANCE),
        ("TIMEOUT", NodeHealth.TIMEOUT),
    ])
    def test_any_health_the_api_sends_is_read_never_raised(self, backend, sent, read):
        job = unique()
        create(backend, request_for(job))
        ready(backend, job)
        backend.set_health(f"{job}-1", sent)
        assert mine(backend, job)[f"{job}-1"].health is read

    def test_upcoming_maintenance_is_read_while_announced(self, backend):
        job = unique()
        create(backend, request_for(job))
        ready(backend, job)
        backend.maintenance_notice(f"{job}-1", True)
        notice = mine(backend, job)[f"{job}-1"].upcoming_maintenance
        assert notice is not None and notice.startswith("SCHEDULED, starts ")
        backend.maintenance_notice(f"{job}-1", False)
        assert mine(backend, job)[f"{job}-1"].upcoming_maintenance is None

    def test_a_zone_the_project_may_not_use_is_reported_denied_and_the_others_still_listed(self, backend):
        job = unique()
        create(backend, request_for(job, 1, "us-central1-a"))
        backend.denied(DARK, True)
        try:
            listed = backend.tpu.list_nodes([PROJECT], ["us-central1-a", DARK], job)
        finally:
            backend.denied(DARK, False)
        assert [n.name for n in listed.nodes] == [f"{job}-1"]
        assert list(listed.denied) == [DARK] and "Permission denied on 'locations/us-west9-z'" in listed.denied[DARK]
        assert listed.unreachable == [] and listed.failed_projects == {}

    @pytest.mark.parametrize("spot", [True, False])
    def test_a_queued_create_waits_out_a_stockout_then_gets_its_node(self, backend, spot):
        job = unique("q")
        zone = "us-east5-a"
        backend.stockout(zone, True)
        try:
            create(backend, request_for(job, zone=zone, spot=spot, queued=True))  # accepted, not refused
            waiting = until("the queued resource waiting", lambda: (n := mine(backend, job, (zone,)).get(f"{job}-1"))
                               and n.queued == QueuedState.WAITING_FOR_RESOURCES and n)
            assert (waiting.state, waiting.spot, waiting.accelerator_type) == (NodeState.CREATING, spot, "v5litepod-8")
            assert waiting.job == job and waiting.managed
            create(backend, request_for(job, zone=zone, spot=spot, queued=True))  # again: no second request
        finally:
            backend.stockout(zone, False)
        node = until("its node", lambda: (n := mine(backend, job, (zone,)).get(f"{job}-1"))
                        and n.state == NodeState.READY and n, timeout=60)
        assert (node.queued, node.spot, node.labels[names.JOB_LABEL]) == (QueuedState.ACTIVE, spot, job)
        assert list(mine(backend, job, (zone,))) == [f"{job}-1"]
        backend.tpu.delete(PROJECT, zone, f"{job}-1")  # the queued resource, and its node with it
        until("both to go", lambda: mine(backend, job, (zone,)) == {})
        with pytest.raises(errors.NotFound):
            backend.tpu.delete(PROJECT, zone, f"{job}-1")

    def test_a_queued_resource_still_waiting_can_be_deleted(self, backend):
        job = unique("q")
        zone = "us-east5-b"
        backend.stockout(zone, True)
        try:
            create(backend, request_for(job, zone=zone, queued=True))
            until("the queued resource", lambda: f"{job}-1" in mine(backend, job, (zone,)))
            backend.tpu.delete(PROJECT, zone, f"{job}-1")
            until("it to go", lambda: mine(backend, job, (zone,)) == {})
        finally:
            backend.stockout(zone, False)


class TestCloudTpuOnTheLocalServer:
    """What the real adapter sends: the request as the TPU API receives it, and its retries."""

    @pytest.fixture
    def local(self, server: TpuServer) -> Backend:
        return _local(server)

    def test_a_node_reaches_the_api_as_requested(self, server, local):
        job = unique()
        r = request_for(job)
        r = replace(r, external_ip=True, subnetwork="regions/us-central1/subnetworks/tpus",
                    service_account="trainer@contract-proj.iam.gserviceaccount.com")
        create(local, r)
        sent = server.node(r.name)
        assert (sent["labels"], sent["metadata"]) == (dict(r.labels), dict(r.metadata))
        assert (sent["acceleratorType"], sent["runtimeVersion"], sent["tags"]) == (
            "v5litepod-8", "v2-alpha-tpuv5-lite", ["respawn"])
        assert sent["schedulingConfig"].get("spot") is True
        assert sent["networkConfig"]["network"] == "default"
        assert sent["networkConfig"]["subnetwork"] == "regions/us-central1/subnetworks/tpus"
        assert sent["networkConfig"]["enableExternalIps"] is True
        assert sent["serviceAccount"] == {"email": r.service_account, "scope": list(r.scopes)}

    def test_the_default_service_account_is_left_to_the_api(self, server, local):
        job = unique()
        create(local, request_for(job, spot=False))
        sent = server.node(f"{job}-1")
        assert sent["serviceAccount"]["email"].endswith("-compute@developer.gserviceaccount.com")  # the API's default
        assert not sent["schedulingConfig"].get("spot")

    @pytest.mark.parametrize("spot, tier", [(True, "spot"), (False, "guaranteed")])
    def test_a_queued_resource_reaches_the_api_in_its_tier(self, server, local, spot, tier):
        job = unique("q")
        create(local, request_for(job, spot=spot, queued=True))
        sent = server.queued_resource(f"{job}-1")
        assert tier in sent and ({"spot", "guaranteed"} - {tier}).isdisjoint(sent)
        [spec] = sent["tpu"]["nodeSpec"]
        assert (spec["parent"], spec["nodeId"]) == (f"projects/{PROJECT}/locations/{ZONE}", f"{job}-1")
        assert spec["node"]["labels"] == request_for(job).labels

    def test_a_transient_failure_of_create_is_retried(self, server, local):
        job = unique()
        server.fail_next("nodes.create", code=503, times=2)
        create(local, request_for(job))
        assert list(mine(local, job)) == [f"{job}-1"]

    def test_a_quota_failing_the_operation_is_a_quota_error(self, server, local):
        job = unique()
        server.quota("us-west1-b", True, mode="operation")
        try:
            with pytest.raises(errors.QuotaError) as e:
                create(local, request_for(job, zone="us-west1-b"))
            assert "PerProjectPerRegionForTPUAPI" in e.value.reason
        finally:
            server.quota("us-west1-b", False)

    def test_delete_leaves_a_foreign_queued_resource_that_shares_the_nodes_name(self, server, local):
        """Queued resource ids are their own namespace: someone's queued resource may be named
        like our node and ask for nodes of theirs. Deleting our node must not force-delete it."""
        job = unique()
        create(local, request_for(job))
        ready(local, job)
        raw = tpu_v2.TpuClient(transport="rest", credentials=AnonymousCredentials(),
                               client_options=ClientOptions(api_endpoint=server.endpoint))
        theirs = unique("theirs")
        spec = tpu_v2.QueuedResource.Tpu.NodeSpec(
            parent=f"projects/{PROJECT}/locations/{ZONE}", node_id=theirs,
            node=tpu_v2.Node(accelerator_type="v5litepod-1", runtime_version="v2-alpha-tpuv5-lite",
                             labels={"team": "research"}))
        raw.create_queued_resource(parent=f"projects/{PROJECT}/locations/{ZONE}", queued_resource_id=f"{job}-1",
                                   queued_resource=tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec])))
        until("their node READY", lambda: theirs in server.names() and server.node(theirs)["state"] == "READY")
        local.tpu.delete(PROJECT, ZONE, f"{job}-1")
        until("our node to go", lambda: f"{job}-1" not in server.names())
        time.sleep(0.3)
        assert theirs in server.names() and server.node(theirs)["state"] == "READY"
        assert server.queued_resource(f"{job}-1")["tpu"]["nodeSpec"][0]["nodeId"] == theirs
