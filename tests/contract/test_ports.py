"""The ports' contract, run against the in-memory fakes and the real adapters alike.

If a fake drifts from what the real adapter does over the local cloud, a test here
fails for one backend and not the other.
"""

from __future__ import annotations

from dataclasses import replace

import time
import uuid
from datetime import UTC, datetime, timedelta
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1
from google.api_core.client_options import ClientOptions

from controller.core import errors, names
from controller.adapters.gcs import GcsStore
from controller.adapters.google import compute_gateway
from controller.adapters.memory import MemoryCompute, MemoryStore
from controller.core.clock import SystemClock
from controller.service.config import Settings
from controller.core.ports import BlobStore, ComputeGateway, InstanceRequest, InstanceStatus, StopReason
from localcloud.compute import ComputeServer
from localcloud.gcs import LocalGcs, client
from tests.wait import until

PROJECT = "contract-proj"
BUCKET = "contract-bucket"


@dataclass
class Backend:
    """A store, a gateway, and what Google or a guest would do to them."""

    name: str
    store: BlobStore
    compute: ComputeGateway
    preempt: Callable[[str], None]
    crash: Callable[[str], None]
    stockout: Callable[[str, bool], None]
    quota: Callable[[str, bool], None]
    foreign: Callable[[str, dict[str, str]], None]
    maintenance: Callable[[str], None]
    host_error: Callable[[str], None]
    set_status: Callable[[str, str], None]
    hold_inserts: Callable[[bool], None]  # True: insert operations stay RUNNING past the wait; False: they finish now


@pytest.fixture(scope="module")
def local() -> Iterator[tuple[LocalGcs, ComputeServer]]:
    with LocalGcs(buckets=(BUCKET,)) as gcs, ComputeServer(boot_delay=0.05, shutdown_budget=0.5, run_vms=True) as srv:
        yield gcs, srv


def _memory() -> Backend:
    clock = SystemClock()
    compute = MemoryCompute(clock)
    return Backend(
        "memory", MemoryStore(clock), compute,
        preempt=compute.preempt,
        crash=lambda n: compute.terminate(n, StopReason.CRASHED),
        stockout=lambda z, on: (compute.stockouts.add if on else compute.stockouts.discard)(z),
        quota=lambda z, on: (compute.quota_exhausted.add if on else compute.quota_exhausted.discard)(z),
        foreign=lambda n, labels: compute.add_foreign(PROJECT, "us-central1-a", n, labels),
        maintenance=compute.maintenance, host_error=compute.host_error, set_status=compute.set_status,
        hold_inserts=lambda on: setattr(compute, "hold_inserts", True) if on else compute.release_inserts(),
    )


def _local(gcs: LocalGcs, srv: ComputeServer) -> Backend:
    settings = Settings(bucket=BUCKET, project=PROJECT, compute_endpoint=srv.endpoint)
    raw = compute_v1.InstancesClient(transport="rest", credentials=AnonymousCredentials(),
                                     client_options=ClientOptions(api_endpoint=srv.endpoint))

    def foreign(name: str, labels: dict[str, str]) -> None:
        body = compute_v1.Instance(**{**_body(name), "labels": labels})
        raw.insert_unary(project=PROJECT, zone="us-central1-a", instance_resource=body)

    gateway = compute_gateway(settings)

    def hold_inserts(on: bool) -> None:
        gateway.operation_timeout = 0.5 if on else 180.0  # the adapter's wait gives up at its deadline
        srv.hold_operations(on)

    return Backend(
        "local", GcsStore(client(gcs.url)), gateway,
        preempt=srv.preempt, crash=srv.crash,
        stockout=lambda z, on: srv.stockout(z, on), quota=lambda z, on: srv.quota(z, on), foreign=foreign,
        maintenance=srv.maintenance, host_error=srv.host_error, set_status=srv.set_status, hold_inserts=hold_inserts,
    )


def _body(name: str) -> dict[str, Any]:
    return {"name": name, "machine_type": "zones/us-central1-a/machineTypes/e2-small",
            "disks": [compute_v1.AttachedDisk(boot=True, initialize_params=compute_v1.AttachedDiskInitializeParams(
                source_image="projects/debian-cloud/global/images/family/debian-12"))],
            "network_interfaces": [compute_v1.NetworkInterface(network="global/networks/default")]}


@pytest.fixture(params=["memory", "local"])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "memory":
        return _memory()
    return _local(*request.getfixturevalue("local"))


def unique(prefix: str = "c") -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def request_for(job: str, attempt: int = 1, zone: str = "us-central1-a", name: str | None = None) -> InstanceRequest:
    return InstanceRequest(
        project=PROJECT, zone=zone, name=name or names.instance_name(job, attempt), machine_type="g2-standard-8",
        provisioning="spot", termination_action="stop", boot_image="projects/debian-cloud/global/images/family/debian-12",
        boot_disk_gb=50, boot_disk_type="pd-balanced", service_account="default",
        scopes=("https://www.googleapis.com/auth/cloud-platform",), network="global/networks/default",
        subnetwork=None, external_ip=False,
        labels={names.MANAGED_LABEL: "true", names.JOB_LABEL: job, names.ATTEMPT_LABEL: str(attempt)},
        metadata={"respawn-job": job, "startup-script": "#!/bin/bash\nsleep 300\n"},
        accelerator_type="nvidia-l4", accelerator_count=1)




def mine(backend: Backend, job: str) -> dict[str, Any]:
    return {i.name: i for i in backend.compute.list_managed([PROJECT], job).instances}


class TestBlobStore:
    def test_stat_and_a_read_over_its_limit_never_download(self, backend):
        key = unique("o/")
        info = backend.store.write(BUCKET, key, b"x" * 2048)
        stat = backend.store.stat(BUCKET, key)
        assert (stat.name, stat.generation, stat.size) == (key, info.generation, 2048)
        with pytest.raises(errors.TooLarge):
            backend.store.read(BUCKET, key, limit=1024)
        assert backend.store.read(BUCKET, key, limit=4096).data == b"x" * 2048
        with pytest.raises(errors.NotFound):
            backend.store.stat(BUCKET, unique("missing/"))

    def test_a_listed_generation_is_read_in_one_request_until_it_is_replaced(self, backend):
        key = unique("o/")
        backend.store.write(BUCKET, key, b"first")
        listed = next(i for i in backend.store.list(BUCKET, key) if i.name == key)
        assert backend.store.read_listed(listed) == b"first"
        backend.store.write(BUCKET, key, b"second")
        with pytest.raises(errors.NotFound):  # never the newer bytes under the older generation
            backend.store.read_listed(listed)
        newer = next(i for i in backend.store.list(BUCKET, key) if i.name == key)
        assert backend.store.read_listed(newer) == b"second"
        backend.store.delete(BUCKET, key)
        with pytest.raises(errors.NotFound):
            backend.store.read_listed(newer)

    def test_create_only_write_succeeds_once(self, backend):
        key = unique("o/")
        info = backend.store.write(BUCKET, key, b"one", if_generation_match=0)
        assert info.generation > 0 and info.name == key
        with pytest.raises(errors.PreconditionFailed):
            backend.store.write(BUCKET, key, b"two", if_generation_match=0)
        assert backend.store.read(BUCKET, key).data == b"one"

    def test_compare_and_swap_on_generation(self, backend):
        key = unique("o/")
        first = backend.store.write(BUCKET, key, b"1", if_generation_match=0)
        second = backend.store.write(BUCKET, key, b"2", if_generation_match=first.generation)
        assert second.generation != first.generation
        with pytest.raises(errors.PreconditionFailed):
            backend.store.write(BUCKET, key, b"3", if_generation_match=first.generation)
        blob = backend.store.read(BUCKET, key)
        assert (blob.data, blob.info.generation) == (b"2", second.generation)
        assert blob.info.updated is not None

    def test_missing_object_is_not_found(self, backend):
        with pytest.raises(errors.NotFound):
            backend.store.read(BUCKET, unique("missing/"))
        with pytest.raises(errors.NotFound):
            backend.store.delete(BUCKET, unique("missing/"))

    def test_conditional_delete(self, backend):
        key = unique("o/")
        info = backend.store.write(BUCKET, key, b"marker")
        with pytest.raises(errors.PreconditionFailed):
            backend.store.delete(BUCKET, key, if_generation_match=info.generation + 1)
        assert backend.store.read(BUCKET, key).data == b"marker"
        backend.store.delete(BUCKET, key, if_generation_match=info.generation)
        with pytest.raises(errors.NotFound):
            backend.store.read(BUCKET, key)

    def test_listing_a_bucket_that_does_not_exist_is_no_such_bucket_naming_it(self, backend):
        if isinstance(backend.store, MemoryStore):
            backend.store.buckets = {BUCKET}  # the fake's buckets, as the local cloud's: this one alone
        with pytest.raises(errors.NoSuchBucket) as caught:
            backend.store.list("no-such-bucket-here", "jobs/")
        assert caught.value.bucket == "no-such-bucket-here"
        assert str(caught.value) == "gs://no-such-bucket-here/jobs/*: bucket gs://no-such-bucket-here does not exist"
        assert backend.store.list(BUCKET, unique("none/") + "/") == []  # an empty prefix is no error

    def test_list_by_prefix_across_pages(self, backend):
        prefix = unique("list/") + "/"
        for i in range(12):
            backend.store.write(BUCKET, f"{prefix}{i:02d}", b"x")
        backend.store.write(BUCKET, prefix.rstrip("/") + "-sibling", b"x")
        if isinstance(backend.store, GcsStore):
            backend.store.page_size = 5  # force paging through the real client's iterator
        listed = backend.store.list(BUCKET, prefix)
        assert [b.name for b in listed] == [f"{prefix}{i:02d}" for i in range(12)]


    def test_custom_metadata_written_with_an_object_comes_back_in_its_listing(self, backend):
        """What a VM agent's heartbeat carries for the controller to judge it without a read."""
        prefix = unique("meta/") + "/"
        meta = {"attempt": "3", "instance": '"job-3"', "token_sha256": "ab" * 32}
        written = backend.store.write(BUCKET, f"{prefix}with", b'{"attempt": 3}', metadata=meta)
        backend.store.write(BUCKET, f"{prefix}without", b"{}")
        listed = {i.name: i for i in backend.store.list(BUCKET, prefix)}
        assert dict(listed[f"{prefix}with"].metadata or {}) == meta == dict(written.metadata or {})
        assert listed[f"{prefix}with"].generation == written.generation
        assert not listed[f"{prefix}without"].metadata


class TestComputeGateway:
    def test_one_jobs_instances_from_zonal_lists(self, backend):
        job, other = unique("z"), unique("o")
        backend.compute.insert([request_for(job, 1, "us-central1-a")], names.request_id(job, 1, 0))
        backend.compute.insert([request_for(job, 2, "us-central1-b")], names.request_id(job, 2, 0))
        backend.compute.insert([request_for(other, 1, "us-central1-a")], names.request_id(other, 1, 0))
        found = backend.compute.list_managed([PROJECT], job, zones=["us-central1-a"])
        assert [(i.name, i.zone) for i in found.instances] == [(f"{job}-1", "us-central1-a")]
        both = backend.compute.list_managed([PROJECT], job, zones=["us-central1-a", "us-central1-b"])
        assert sorted(i.name for i in both.instances) == [f"{job}-1", f"{job}-2"]
        assert both.unreachable == [] and both.failed_projects == {}

    def test_insert_then_list_with_labels(self, backend):
        job = unique("j")
        backend.compute.insert([request_for(job)], names.request_id(job, 1, 0))
        found = mine(backend, job)
        assert list(found) == [f"{job}-1"]
        instance = found[f"{job}-1"]
        assert (instance.job, instance.attempt, instance.managed, instance.zone) == (job, 1, True, "us-central1-a")
        assert instance.status in (InstanceStatus.STAGING, InstanceStatus.RUNNING) and instance.id
        assert mine(backend, unique("other")) == {}

    def test_repeated_request_id_and_existing_name_are_success(self, backend):
        job = unique("j")
        rid = names.request_id(job, 1, 0)
        backend.compute.insert([request_for(job)], rid)
        backend.compute.insert([request_for(job)], rid)
        backend.compute.insert([request_for(job)], names.request_id(job, 1, 1))
        assert list(mine(backend, job)) == [f"{job}-1"]

    def test_an_insert_names_its_instances_id_and_a_gangs_names_none(self, backend):
        job, gang = unique("i"), unique("g")
        rid = names.request_id(job, 1, 0)
        told = backend.compute.insert([request_for(job)], rid)
        listed = mine(backend, job)[f"{job}-1"].id
        assert told == {f"{job}-1": listed} and listed
        assert backend.compute.insert([request_for(job)], rid) == told  # the same request: the same answer
        assert backend.compute.insert([request_for(job)], names.request_id(job, 1, 1)) == {}  # "already exists"
        nodes = [request_for(gang, name=n) for n in names.node_names(gang, 1, 2)]
        assert backend.compute.insert(nodes, names.request_id(gang, 1, 0)) == {}  # bulkInsert names no instance

    def test_delete_then_not_found(self, backend):
        job = unique("j")
        backend.compute.insert([request_for(job)], names.request_id(job, 1, 0))
        backend.compute.delete(PROJECT, "us-central1-a", f"{job}-1")
        until("the instance to go", lambda: mine(backend, job) == {})
        with pytest.raises(errors.NotFound):
            backend.compute.delete(PROJECT, "us-central1-a", f"{job}-1")

    def test_stockout_is_a_capacity_error_naming_the_zone(self, backend):
        job = unique("j")
        backend.stockout("us-central1-b", True)
        try:
            with pytest.raises(errors.CapacityError) as e:
                backend.compute.insert([request_for(job, zone="us-central1-b")], names.request_id(job, 1, 0))
            assert e.value.zone == "us-central1-b" and "ZONE_RESOURCE_POOL_EXHAUSTED" in e.value.reason
        finally:
            backend.stockout("us-central1-b", False)
        assert mine(backend, job) == {}

    def test_quota_is_a_quota_error(self, backend):
        job = unique("j")
        backend.quota("us-central1-c", True)
        try:
            with pytest.raises(errors.QuotaError) as e:
                backend.compute.insert([request_for(job, zone="us-central1-c")], names.request_id(job, 1, 0))
            # Compute names the quota and where it counts: the region's, every zone of it refused.
            assert "NVIDIA_L4_GPUS" in e.value.reason and "in region us-central1" in e.value.reason
            with pytest.raises(errors.QuotaError):
                backend.compute.insert([request_for(job, zone="us-central1-b")], names.request_id(job, 1, 1))
        finally:
            backend.quota("us-central1-c", False)

    def test_gang_lands_in_one_zone(self, backend):
        job = unique("g")
        gang = [request_for(job, name=n) for n in names.node_names(job, 1, 3)]
        backend.compute.insert(gang, names.request_id(job, 1, 0))
        found = mine(backend, job)
        assert sorted(found) == [f"{job}-1-n{r}" for r in range(3)]
        assert {i.zone for i in found.values()} == {"us-central1-a"}

    def test_gang_stockout_in_its_zone_is_a_capacity_error_not_another_zone(self, backend):
        job = unique("g")
        backend.stockout("us-central1-f", True)
        try:
            with pytest.raises(errors.CapacityError) as e:
                backend.compute.insert([request_for(job, zone="us-central1-f", name=n) for n in names.node_names(job, 1, 2)],
                                       names.request_id(job, 1, 0))
            assert e.value.zone == "us-central1-f"
        finally:
            backend.stockout("us-central1-f", False)
        until("nothing left of the gang", lambda: mine(backend, job) == {})

    def test_a_shard_lists_the_managed_vms_its_label_selects_and_no_others(self, backend):
        jobs = [unique("s") for _ in range(8)]
        for job in jobs:
            r = request_for(job)
            r = replace(r, labels={**r.labels, names.SHARD_LABEL: names.shard_label(job)})
            backend.compute.insert([r], names.request_id(job, 1, 0))
        unlabelled, foreign = unique("u"), unique("f")
        backend.compute.insert([request_for(unlabelled)], names.request_id(unlabelled, 1, 0))  # from before sharding
        backend.foreign(f"{foreign}-1", {names.JOB_LABEL: foreign, names.SHARD_LABEL: names.shard_label(foreign)})
        seen: list[str] = []
        for shard in range(4):
            found = backend.compute.list_managed([PROJECT], shard=(shard, 4)).instances
            ours = [i.job for i in found if i.job in jobs]
            assert all(names.shard_of(job, 4) == shard for job in ours)
            assert all(i.managed for i in found) and not {unlabelled, foreign} & {i.job for i in found}
            seen += ours
        assert sorted(seen) == sorted(jobs)
        one = {i.job for i in backend.compute.list_managed([PROJECT], shard=(0, 1)).instances}
        assert {*jobs, unlabelled} <= one  # K = 1: the plain managed list

    def test_unlabelled_instances_are_never_listed(self, backend):
        job = unique("j")
        backend.foreign(f"{job}-1", {names.JOB_LABEL: job})
        backend.foreign(f"{job}-2", {names.MANAGED_LABEL: "false", names.JOB_LABEL: job})
        assert mine(backend, job) == {}
        assert all(i.managed for i in backend.compute.list_managed([PROJECT]).instances)

    def test_preemption_is_told_apart_from_a_crash(self, backend):
        a, b = unique("p"), unique("c")
        for job in (a, b):
            backend.compute.insert([request_for(job)], names.request_id(job, 1, 0))
            until("RUNNING", lambda j=job: mine(backend, j)[f"{j}-1"].status == InstanceStatus.RUNNING)
        backend.preempt(f"{a}-1")
        backend.crash(f"{b}-1")
        for job in (a, b):
            until("TERMINATED", lambda j=job: mine(backend, j)[f"{j}-1"].status == InstanceStatus.TERMINATED)
        assert backend.compute.stopped(PROJECT, "us-central1-a", f"{a}-1").reason == StopReason.PREEMPTED
        assert backend.compute.stopped(PROJECT, "us-central1-a", f"{b}-1").reason == StopReason.CRASHED
        # deleting the husk afterwards does not rewrite why it stopped
        backend.compute.delete(PROJECT, "us-central1-a", f"{a}-1")
        assert backend.compute.stopped(PROJECT, "us-central1-a", f"{a}-1").reason == StopReason.PREEMPTED

    def test_a_preemption_is_timed_by_computes_record_not_by_when_it_is_asked(self, backend):
        job = unique("t")
        backend.compute.insert([request_for(job)], names.request_id(job, 1, 0))
        until("RUNNING", lambda: mine(backend, job)[f"{job}-1"].status == InstanceStatus.RUNNING)
        before = datetime.now(UTC) - timedelta(seconds=1)  # Compute's times are to the millisecond
        backend.preempt(f"{job}-1")
        until("TERMINATED", lambda: mine(backend, job)[f"{job}-1"].status == InstanceStatus.TERMINATED)
        after = datetime.now(UTC) + timedelta(seconds=1)
        first = backend.compute.stopped(PROJECT, "us-central1-a", f"{job}-1")
        assert first.reason == StopReason.PREEMPTED and first.at is not None and before <= first.at <= after
        assert first.at.utcoffset() == timedelta(0)  # Compute writes Pacific time: read as UTC, as every time we keep
        time.sleep(1.1)
        backend.compute.delete(PROJECT, "us-central1-a", f"{job}-1")  # a later stop does not move it
        assert backend.compute.stopped(PROJECT, "us-central1-a", f"{job}-1") == first
        assert backend.compute.stopped(PROJECT, "us-central1-a", unique("never")).at is None

    def test_deleted_by_someone_else_reads_as_stopped(self, backend):
        job = unique("d")
        backend.compute.insert([request_for(job)], names.request_id(job, 1, 0))
        backend.compute.delete(PROJECT, "us-central1-a", f"{job}-1")
        assert backend.compute.stopped(PROJECT, "us-central1-a", f"{job}-1").reason == StopReason.STOPPED
        assert backend.compute.stopped(PROJECT, "us-central1-a", unique("never")).reason == StopReason.UNKNOWN

    @pytest.mark.parametrize("fault, reason", [("maintenance", StopReason.MAINTENANCE),
                                               ("host_error", StopReason.HOST_ERROR)])
    def test_platform_stop_reads_as_its_cause(self, backend, fault, reason):
        job = unique(fault[0])
        backend.compute.insert([request_for(job)], names.request_id(job, 1, 0))
        until("RUNNING", lambda: mine(backend, job)[f"{job}-1"].status == InstanceStatus.RUNNING)
        getattr(backend, fault)(f"{job}-1")
        until("TERMINATED", lambda: mine(backend, job)[f"{job}-1"].status == InstanceStatus.TERMINATED)
        assert backend.compute.stopped(PROJECT, "us-central1-a", f"{job}-1").reason == reason

    def test_a_preempted_guest_shutting_itself_down_still_reads_preempted(self, backend):
        job = unique("p")
        backend.compute.insert([request_for(job)], names.request_id(job, 1, 0))
        until("RUNNING", lambda: mine(backend, job)[f"{job}-1"].status == InstanceStatus.RUNNING)
        backend.preempt(f"{job}-1")
        until("TERMINATED", lambda: mine(backend, job)[f"{job}-1"].status == InstanceStatus.TERMINATED)
        backend.crash(f"{job}-1")  # compute.instances.guestTerminate, recorded after the preemption
        assert backend.compute.stopped(PROJECT, "us-central1-a", f"{job}-1").reason == StopReason.PREEMPTED
        backend.compute.delete(PROJECT, "us-central1-a", f"{job}-1")
        assert backend.compute.stopped(PROJECT, "us-central1-a", f"{job}-1").reason == StopReason.PREEMPTED

    @pytest.mark.parametrize("sent, read", [
        ("SOMETHING_NEW", InstanceStatus.UNKNOWN),
        ("PENDING_STOP", InstanceStatus.PENDING_STOP),
        ("DEPROVISIONING", InstanceStatus.DEPROVISIONING),
    ])
    def test_any_status_compute_sends_is_read_never_raised(self, backend, sent, read):
        job = unique("s")
        backend.compute.insert([request_for(job)], names.request_id(job, 1, 0))
        until("RUNNING", lambda: mine(backend, job)[f"{job}-1"].status == InstanceStatus.RUNNING)
        backend.set_status(f"{job}-1", sent)
        assert mine(backend, job)[f"{job}-1"].status is read
        assert f"{job}-1" in {i.name for i in backend.compute.list_managed([PROJECT]).instances}

    @pytest.mark.parametrize("job", ['x" OR labels.respawn-job = "y', "Upper", "-dash", "a" * 51, "a-"])
    def test_an_invalid_job_name_is_refused_before_any_filter(self, backend, job):
        with pytest.raises(errors.RequestError):
            backend.compute.list_managed([PROJECT], job)

    @pytest.mark.parametrize("nodes", [1, 2])
    def test_insert_still_running_at_the_deadline_is_pending_then_succeeds(self, backend, nodes):
        job = unique("w")
        rid = names.request_id(job, 1, 0)
        requests_ = [request_for(job, name=n) for n in names.node_names(job, 1, nodes)]
        backend.hold_inserts(True)
        try:
            with pytest.raises(errors.OperationPending):
                backend.compute.insert(requests_, rid)
            assert {i.status for i in mine(backend, job).values()} == {InstanceStatus.PROVISIONING}
            assert len(mine(backend, job)) == nodes
        finally:
            backend.hold_inserts(False)
        backend.compute.insert(requests_, rid)  # the same request: Compute answers with its operation, now done
        assert sorted(mine(backend, job)) == [r.name for r in requests_]
        assert all(i.status.alive for i in mine(backend, job).values())

    @pytest.mark.parametrize("nodes", [1, 2])
    def test_insert_pending_at_the_deadline_then_stocked_out_reads_the_stockout(self, backend, nodes):
        job = unique("l")
        rid = names.request_id(job, 1, 0)
        requests_ = [request_for(job, zone="us-east1-b", name=n) for n in names.node_names(job, 1, nodes)]
        backend.hold_inserts(True)
        try:
            with pytest.raises(errors.OperationPending):
                backend.compute.insert(requests_, rid)
            backend.stockout("us-east1-b", True)  # capacity is decided when the operation finishes
        finally:
            backend.hold_inserts(False)
        try:
            with pytest.raises(errors.CapacityError) as e:
                backend.compute.insert(requests_, rid)
            assert e.value.zone == "us-east1-b"
        finally:
            backend.stockout("us-east1-b", False)
        until("the stocked-out instances to go", lambda: mine(backend, job) == {})
        with pytest.raises(errors.CapacityError):  # the same id keeps its first outcome
            backend.compute.insert(requests_, rid)
