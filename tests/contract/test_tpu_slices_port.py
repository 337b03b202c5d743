"""The TPU port's contract for TPU slices in Compute Engine (issue 38), run against the in-memory fake
(``MemorySlices``) and the real adapter (``ComputeTpu`` on google-cloud-compute, REST) over the local
Compute Engine alike, as test_tpu_port.py runs the Cloud TPU API's (the tests both pass alike are
tpu_contract.TpuPortContract's).

A single-host slice is one instance, a multi-host one a MIG of ``hosts`` instances under a workload
policy; both are one ``TpuNode`` with ``api`` "compute". Compute lists every zone of a project at once
(aggregated lists), reads a slice with a host down as TERMINATED with the cause its operations record,
and a single-host slice being deleted as its instance reads (STOPPING), a MIG being deleted as DELETING.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from dataclasses import dataclass, replace
from functools import partial

import pytest
from google.api_core.client_options import ClientOptions
from google.api_core.exceptions import Conflict
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from controller.adapters.google import compute_tpu_gateway
from controller.adapters.memory import MemorySlices
from controller.adapters.tpu_compute import SLICE_LABEL
from controller.core import errors, names, tpus
from controller.core.clock import SystemClock
from controller.core.ports import InstanceStatus, NodeHealth, NodeState, QueuedState, StopReason, TpuNode
from controller.core.ports import TpuRequest
from controller.service.config import Settings
from localcloud.compute import ComputeServer
from tests.contract import tpu_contract
from tests.contract.tpu_contract import (BACKENDS, Port, Shape, TpuPortContract, backend_for, create,
                                          not_found_once_gone, unique)
from tests.wait import until

PROJECT = "slices-contract"
ZONE = "us-central1-c"  # tpu7x-standard-4t's zone
TPU = "tpu7x-standard-4t"
V6E = "ct6e-standard-4t"  # another TPU machine type, in other zones (us-central1-b, us-east1-d)
MULTI = "2x2x2"  # two hosts of tpu7x-standard-4t
SHAPES = [pytest.param(None, 1, id="single-host"), pytest.param(MULTI, 2, id="multi-host")]
IMAGE = "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2404-amd64-tpu-tpu7x"


@dataclass
class Backend(tpu_contract.Backend):
    """A TPU gateway over Compute Engine, and what Google (or someone else) does to the slices behind it."""

    lose: Callable[[str, StopReason], None]  # a host of the slice goes down for this cause
    foreign_vm: Callable[[str, dict[str, str]], None]  # an instance someone else made in ZONE
    foreign_mig: Callable[[str, dict[str, str]], None]  # a MIG someone else made in ZONE, its template so labelled
    exists: Callable[[str], bool]  # an instance or a MIG of that name is there (ours or not)


def _memory() -> Backend:
    fake = MemorySlices(SystemClock())
    fake.delete_seconds = 0.3  # accepted at once, done a moment later, as the local server's

    def foreign(name: str, labels: dict[str, str]) -> None:
        fake.add_foreign(PROJECT, ZONE, name, labels)

    return Backend("memory", fake, stockout=fake.stockout, quota=fake.quota, lose=fake.lose,
                   hold=fake.hold_operations, foreign_vm=foreign, foreign_mig=foreign,
                   exists=lambda name: name in fake.names())


@pytest.fixture(scope="module")
def server() -> Iterator[ComputeServer]:
    with ComputeServer(run_vms=False, boot_delay=0.05, shutdown_budget=0.5) as srv:
        srv.slow_operations(delete=0.3)  # a delete is seen going before it is done
        yield srv


def _local(srv: ComputeServer) -> Backend:
    gateway = compute_tpu_gateway(Settings(project=PROJECT, compute_endpoint=srv.endpoint))
    gateway.operation_timeout = 30.0
    kwargs = {"transport": "rest", "credentials": AnonymousCredentials(),
              "client_options": ClientOptions(api_endpoint=srv.endpoint)}
    instances, templates = compute_v1.InstancesClient(**kwargs), compute_v1.InstanceTemplatesClient(**kwargs)
    policies, migs = compute_v1.ResourcePoliciesClient(**kwargs), compute_v1.InstanceGroupManagersClient(**kwargs)
    scheduling = compute_v1.Scheduling(provisioning_model="STANDARD", on_host_maintenance="TERMINATE",
                                       automatic_restart=False)
    disks = [compute_v1.AttachedDisk(boot=True, initialize_params=compute_v1.AttachedDiskInitializeParams(
        source_image=IMAGE))]
    nics = [compute_v1.NetworkInterface(network="global/networks/default")]

    def foreign_vm(name: str, labels: dict[str, str]) -> None:
        instances.insert(project=PROJECT, zone=ZONE, instance_resource=compute_v1.Instance(
            name=name, machine_type=f"zones/{ZONE}/machineTypes/{TPU}", labels=labels, scheduling=scheduling,
            disks=disks, network_interfaces=nics))  # (ExtendedOperation.result() would poll Google's own host)
        until(f"{name} made", lambda: name in srv.names())

    def foreign_mig(name: str, labels: dict[str, str]) -> None:
        try:
            policies.insert(project=PROJECT, region="us-central1", resource_policy_resource=compute_v1.ResourcePolicy(
                name="theirs-2x2x2", workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(
                    type_="HIGH_THROUGHPUT", accelerator_topology=MULTI)))
        except Conflict:
            pass  # made by an earlier test
        templates.insert(project=PROJECT, instance_template_resource=compute_v1.InstanceTemplate(
            name=name, properties=compute_v1.InstanceProperties(
                machine_type=TPU, labels=labels, scheduling=scheduling, disks=disks, network_interfaces=nics)))
        migs.insert(project=PROJECT, zone=ZONE, instance_group_manager_resource=compute_v1.InstanceGroupManager(
            name=name, base_instance_name=f"{name}-w", target_size=2,
            instance_template=f"global/instanceTemplates/{name}",
            resource_policies=compute_v1.InstanceGroupManagerResourcePolicies(
                workload_policy="regions/us-central1/resourcePolicies/theirs-2x2x2")))
        until(f"{name}'s hosts", lambda: sum(n.startswith(f"{name}-w-") for n in srv.names()) == 2)

    causes = {StopReason.PREEMPTED: srv.preempt, StopReason.MAINTENANCE: srv.maintenance,
              StopReason.HOST_ERROR: srv.host_error}

    def lose(name: str, why: StopReason) -> None:
        hosts = sorted(i["name"] for i in srv.instances() if (i.get("labels") or {}).get(SLICE_LABEL) == name)
        causes[why](hosts[-1])

    def hold(on: bool) -> None:
        gateway.operation_timeout = 0.5 if on else 30.0  # the adapter's wait gives up at its deadline
        srv.hold_operations(on)

    return Backend("local", gateway, stockout=srv.stockout, quota=srv.quota, lose=lose, hold=hold,
                   foreign_vm=foreign_vm, foreign_mig=foreign_mig,
                   exists=lambda name: name in srv.names() or name in srv.mig_names())


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    return backend_for(request, _memory, _local)


def request_for(job: str, attempt: int = 1, topology: str | None = None, *, zone: str = ZONE, machine: str = TPU,
                spot: bool = True, flex: bool = False, api: str = "compute") -> TpuRequest:
    shape = tpus.machine_of(machine)
    assert shape is not None
    return TpuRequest(
        project=PROJECT, zone=zone, name=names.instance_name(job, attempt), accelerator_type=machine,
        runtime_version="", spot=spot and not flex,
        labels={names.MANAGED_LABEL: "true", names.JOB_LABEL: job, names.ATTEMPT_LABEL: str(attempt)},
        metadata={"respawn-job": job, "startup-script": "#!/bin/bash\nsleep 300\n"},
        service_account="default", scopes=("https://www.googleapis.com/auth/cloud-platform",),
        network="global/networks/default", subnetwork=None, external_ip=False, tags=("respawn",), api=api,
        topology=topology, hosts=shape.hosts(topology), flex_start=flex, max_run_seconds=3600 if flex else None,
        boot_image=f"projects/{tpus.IMAGE_PROJECT}/global/images/family/{shape.image_family}")


def mine(backend: Backend, job: str, zones: tuple[str, ...] = (ZONE,)) -> dict[str, TpuNode]:
    listed = backend.tpu.list_nodes([PROJECT], list(zones), job)
    assert listed.failed_projects == {} and listed.unreachable == []
    return {n.name: n for n in listed.nodes}


def ready(backend: Backend, job: str, zones: tuple[str, ...] = (ZONE,)) -> TpuNode:
    """The job's first slice once READY (the local Compute boots its hosts after a short delay)."""
    name = names.instance_name(job, 1)
    return until("READY", lambda: (n := mine(backend, job, zones).get(name)) and n.state == NodeState.READY and n)


@pytest.fixture
def port() -> Port:
    return Port(PROJECT, ZONE, mine, ready)


@pytest.fixture(params=[pytest.param(p.values, id=p.id) for p in SHAPES])
def shape(request: pytest.FixtureRequest) -> Shape:
    topology, workers = request.param
    return Shape(partial(request_for, topology=topology), workers)


class TestComputeSlices(TpuPortContract):
    @pytest.mark.parametrize("topology, workers", SHAPES)
    def test_create_then_list_shows_the_slice_as_requested(self, backend, topology, workers):
        job = unique()
        create(backend, request_for(job, topology=topology))
        node = ready(backend, job)
        assert (node.project, node.zone, node.name, node.api) == (PROJECT, ZONE, f"{job}-1", "compute")
        assert (node.job, node.attempt, node.managed) == (job, 1, True)
        assert node.labels == {names.MANAGED_LABEL: "true", names.JOB_LABEL: job, names.ATTEMPT_LABEL: "1",
                               SLICE_LABEL: f"{job}-1"}
        assert (node.accelerator_type, node.spot, node.workers) == (TPU, True, workers)
        assert node.health == NodeHealth.HEALTHY and node.id and node.created_at.tzinfo is not None
        assert node.queued is None and node.upcoming_maintenance is None and node.stop_reason is None
        assert node.as_instance().status == InstanceStatus.RUNNING and node.as_instance().tpu_api == "compute"

    def test_another_tpu_machine_type_in_its_own_zone(self, backend):
        job = unique()
        create(backend, request_for(job, topology="4x4", zone="us-east1-d", machine=V6E))
        node = ready(backend, job, ("us-east1-d",))
        assert (node.zone, node.accelerator_type, node.workers) == ("us-east1-d", V6E, 4)

    def test_a_cloud_tpu_request_is_refused(self, backend):
        job = unique()
        with pytest.raises(errors.RequestError):
            create(backend, request_for(job, api="tpu"))
        assert mine(backend, job) == {}

    def test_a_listing_is_of_every_zone_of_the_project_and_of_one_job_with_job(self, backend):
        job, other = unique("j"), unique("o")
        create(backend, request_for(job))
        create(backend, request_for(job, 2, MULTI))
        create(backend, request_for(other))
        ready(backend, job)
        # Compute's aggregated lists: the zones asked for do not narrow them.
        assert sorted(mine(backend, job, ("us-central1-a",))) == [f"{job}-1", f"{job}-2"]
        everything = backend.tpu.list_nodes([PROJECT], [ZONE]).nodes
        assert {f"{job}-1", f"{job}-2", f"{other}-1"} <= {n.name for n in everything}
        assert all(n.managed and n.api == "compute" for n in everything)
        twice = backend.tpu.list_nodes([PROJECT, PROJECT], [ZONE, ZONE], job)
        assert sorted(n.name for n in twice.nodes) == [f"{job}-1", f"{job}-2"]

    def test_look_alikes_of_someone_else_are_never_listed_nor_deleted(self, backend):
        """A VM of respawn's own (respawn-managed, the VM gateway's), or a MIG and an instance labelled
        like a slice's but without ``respawn-slice`` naming them, are not slices of respawn's."""
        job = unique("j")
        create(backend, request_for(job))
        look_alike = {names.MANAGED_LABEL: "true", names.JOB_LABEL: job, names.ATTEMPT_LABEL: "7"}
        backend.foreign_vm(f"{job}-7", look_alike)
        backend.foreign_mig(f"{job}-8", {**look_alike, names.ATTEMPT_LABEL: "8"})
        backend.foreign_vm(f"{job}-9", {**look_alike, SLICE_LABEL: f"{job}-1", names.ATTEMPT_LABEL: "9"})
        ready(backend, job)
        assert list(mine(backend, job)) == [f"{job}-1"]
        assert {f"{job}-7", f"{job}-8", f"{job}-9"}.isdisjoint(n.name for n in backend.tpu.list_nodes([PROJECT],
                                                                                                      [ZONE]).nodes)
        for name in (f"{job}-7", f"{job}-8", f"{job}-9"):
            with pytest.raises(errors.NotFound):
                backend.tpu.delete(PROJECT, ZONE, name)
            assert backend.exists(name)

    @pytest.mark.parametrize("topology, workers", SHAPES)
    @pytest.mark.parametrize("why", [StopReason.PREEMPTED, StopReason.MAINTENANCE, StopReason.HOST_ERROR])
    def test_a_host_lost_is_the_slice_terminated_with_computes_cause(self, backend, topology, workers, why):
        job = unique()
        create(backend, request_for(job, topology=topology))
        ready(backend, job)
        before = datetime.now(timezone.utc) - timedelta(seconds=5)  # the local cloud's clock is this one
        backend.lose(f"{job}-1", why)
        down = until("TERMINATED", lambda: (n := mine(backend, job)[f"{job}-1"]).state == NodeState.TERMINATED and n)
        assert (down.stop_reason, down.workers) == (why, workers)
        # When Compute recorded it: a hard preemption's loss is timed from there, not from the pass.
        assert down.stopped_at is not None and before <= down.stopped_at <= datetime.now(timezone.utc)
        seen = down.as_instance()
        assert (seen.status, seen.stop_reason, seen.stopped_at) == (InstanceStatus.TERMINATED, why, down.stopped_at)

    @pytest.mark.parametrize("topology, going", [pytest.param(None, NodeState.STOPPING, id="single-host"),
                                                 pytest.param(MULTI, NodeState.DELETING, id="multi-host")])
    def test_delete_is_seen_going_then_gone_and_then_not_found(self, backend, topology, going):
        """A single-host slice being deleted reads as its instance does (STOPPING: Compute has no
        other status for an instance being deleted); a MIG being deleted says so (currentActions)."""
        job = unique()
        create(backend, request_for(job, topology=topology))
        ready(backend, job)
        backend.tpu.delete(PROJECT, ZONE, f"{job}-1")
        assert mine(backend, job)[f"{job}-1"].state == going
        backend.tpu.delete(PROJECT, ZONE, f"{job}-1")  # again while it goes: accepted
        until("the slice to go", lambda: mine(backend, job) == {})
        try:  # what a MIG leaves (its template, in use when the delete was asked) goes with one more delete
            backend.tpu.delete(PROJECT, ZONE, f"{job}-1")
        except errors.NotFound:
            pass
        not_found_once_gone(backend, PROJECT, ZONE, f"{job}-1")

    def test_a_slice_with_a_host_down_is_deleted_whole(self, backend):
        job = unique()
        create(backend, request_for(job, topology=MULTI))
        ready(backend, job)
        backend.lose(f"{job}-1", StopReason.PREEMPTED)
        until("TERMINATED", lambda: mine(backend, job)[f"{job}-1"].state == NodeState.TERMINATED)
        backend.tpu.delete(PROJECT, ZONE, f"{job}-1")
        until("the slice to go", lambda: mine(backend, job) == {})
        assert not backend.exists(f"{job}-1")

    @pytest.mark.parametrize("topology, workers", SHAPES)
    def test_stockout_is_a_capacity_error_naming_the_zone_and_leaves_nothing(self, backend, topology, workers):
        job = unique()
        backend.stockout(ZONE, True)
        try:
            with pytest.raises(errors.CapacityError) as e:
                create(backend, request_for(job, topology=topology))
        finally:
            backend.stockout(ZONE, False)
        assert e.value.zone == ZONE and "ZONE_RESOURCE_POOL_EXHAUSTED" in e.value.reason
        until("nothing left of the slice", lambda: mine(backend, job) == {} and not backend.exists(f"{job}-1"))

    @pytest.mark.parametrize("topology, workers", SHAPES)
    def test_quota_is_a_quota_error_naming_the_zone_and_leaves_nothing(self, backend, topology, workers):
        job = unique()
        backend.quota(ZONE, True)
        try:
            with pytest.raises(errors.QuotaError) as e:
                create(backend, request_for(job, topology=topology))
        finally:
            backend.quota(ZONE, False)
        assert e.value.zone == ZONE and e.value.reason.startswith("QUOTA_EXCEEDED")
        until("nothing left of the slice", lambda: mine(backend, job) == {} and not backend.exists(f"{job}-1"))

    @pytest.mark.parametrize("topology, workers", SHAPES)
    def test_a_held_create_then_stocked_out_reads_the_stockout(self, backend, topology, workers):
        job = unique()
        r = request_for(job, topology=topology)
        backend.hold(True)
        try:
            with pytest.raises(errors.OperationPending):
                create(backend, r)
            backend.stockout(ZONE, True)  # capacity is decided when the hosts are made
        finally:
            backend.hold(False)
        try:
            with pytest.raises(errors.CapacityError) as e:
                create(backend, r)
            assert e.value.zone == ZONE
        finally:
            backend.stockout(ZONE, False)
        until("nothing left of the slice", lambda: mine(backend, job) == {} and not backend.exists(f"{job}-1"))

    @pytest.mark.parametrize("topology, workers", SHAPES)
    def test_a_flex_start_slice_waits_out_a_stockout_then_runs(self, backend, topology, workers):
        job = unique("f")
        backend.stockout(ZONE, True)
        try:
            create(backend, request_for(job, topology=topology, flex=True))  # accepted, not refused
            waiting = until("waiting for capacity", lambda: (n := mine(backend, job).get(f"{job}-1"))
                            and n.queued == QueuedState.WAITING_FOR_RESOURCES and n)
            assert (waiting.state, waiting.spot, waiting.as_instance().status) == (
                NodeState.CREATING, False, InstanceStatus.PENDING)
            create(backend, request_for(job, topology=topology, flex=True))  # again: no second slice
        finally:
            backend.stockout(ZONE, False)
        node = ready(backend, job)
        assert (node.queued, node.workers, list(mine(backend, job))) == (None, workers, [f"{job}-1"])
        backend.tpu.delete(PROJECT, ZONE, f"{job}-1")
        until("it to go", lambda: mine(backend, job) == {})


def test_the_request_reaches_compute_as_the_fake_records_it(server):
    """The same request through both: what the fake keeps of it is what Compute was sent."""
    job = unique()
    r = replace(request_for(job, topology=MULTI), labels={names.MANAGED_LABEL: "true", names.JOB_LABEL: job,
                                                         names.ATTEMPT_LABEL: "1", "team": "ml"})
    fake = _memory()
    create(fake, r)
    create(_local(server), r)
    assert fake.tpu.request_of(r.name) == r  # type: ignore[attr-defined]
    mig = server.mig(r.name)
    assert mig["targetSize"] == r.hosts
    hosts = [i for i in server.instances() if (i.get("labels") or {}).get(SLICE_LABEL) == r.name]
    assert len(hosts) == r.hosts
    assert all(h["labels"] == {k: v for k, v in r.labels.items() if k != names.MANAGED_LABEL} | {SLICE_LABEL: r.name}
               for h in hosts)
