"""Adapter behaviours that only the real clients have (retries, 412-after-retry, paging),
and the local Compute server's fidelity, checked with the real client and raw HTTP."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1, storage

from controller.core import errors, names
from controller.adapters.compute import ComputeEngine, _raise_for
from controller.adapters.gcs import GcsStore
from controller.adapters.google import compute_gateway
from controller.service.config import Settings
from controller.core.ports import InstanceRequest, InstanceStatus
from localcloud.compute import ComputeServer
from localcloud.gce import ApiError
from localcloud.gcs import LocalGcs, client
from tests.contract.test_ports import PROJECT, request_for
from tests.wait import until

BUCKET = "adapter-bucket"


@pytest.fixture(scope="module")
def gcs() -> Iterator[LocalGcs]:
    with LocalGcs(buckets=(BUCKET,)) as g:
        yield g


@pytest.fixture
def srv() -> Iterator[ComputeServer]:
    with ComputeServer(boot_delay=0.05, shutdown_budget=0.2, run_vms=False) as s:
        yield s


def gateway(srv: ComputeServer, operation_timeout: float | None = None) -> ComputeEngine:
    gw = compute_gateway(Settings(bucket="b", project=PROJECT, compute_endpoint=srv.endpoint))
    if operation_timeout is not None:
        gw.operation_timeout = operation_timeout
    return gw


def gang(job: str, nodes: int = 2, zone: str = "us-central1-a") -> list[InstanceRequest]:
    return [request_for(job, zone=zone, name=n) for n in names.node_names(job, 1, nodes)]


def counting(srv: ComputeServer, handler: str) -> list[int]:
    """Count the calls the server's handler sees (after its injected failures)."""
    calls: list[int] = []
    original = getattr(srv, handler)

    def wrapper(*args: Any) -> Any:
        calls.append(1)
        return original(*args)

    setattr(srv, handler, wrapper)
    return calls


def api(srv: ComputeServer, method: str, path: str, **kw: Any) -> requests.Response:
    return requests.request(method, f"{srv.endpoint}/compute/v1/projects/{PROJECT}/{path}", timeout=30, **kw)


def body(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "machineType": "zones/us-central1-a/machineTypes/e2-small",
            "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
            "networkInterfaces": [{"network": "global/networks/default"}], **extra}


class TestGcsAdapter:
    def test_412_after_the_clients_own_retry_succeeded_is_success(self, gcs, monkeypatch):
        store = GcsStore(client(gcs.url))
        key = f"retry/{uuid.uuid4().hex}"
        real_upload = storage.Blob.upload_from_string

        def first_try_lands_then_retry_gets_412(self: storage.Blob, data: bytes, **kw: Any) -> None:
            real_upload(self, data, **kw)  # the first attempt reached GCS, its answer was lost
            raise gexc.PreconditionFailed("412 on the retry")

        monkeypatch.setattr(storage.Blob, "upload_from_string", first_try_lands_then_retry_gets_412)
        info = store.write(BUCKET, key, b"status v1", if_generation_match=0)
        assert info.generation > 0 and info.name == key
        monkeypatch.undo()
        assert store.read(BUCKET, key).data == b"status v1"

    @pytest.mark.parametrize("pinned", [False, True])
    def test_an_object_replaced_between_its_metadata_and_its_bytes_is_read_again(self, gcs, monkeypatch, pinned):
        """The download names the generation the metadata had (ifGenerationMatch; on Google also the
        generation itself, in mediaLink): a writer in between makes it 412, or 404 when pinned. Either
        way the object exists: it is read again, bytes and generation of one and the same version."""
        store = GcsStore(client(gcs.url))
        key = f"replaced/{uuid.uuid4().hex}"
        store.write(BUCKET, key, b"v1")
        real_download = storage.Blob.download_as_bytes
        replaced: list[int] = []

        def replaced_first(self: storage.Blob, *args: Any, **kw: Any) -> bytes:
            if not replaced:
                replaced.append(1)
                client(gcs.url).bucket(BUCKET).blob(key).upload_from_string(b"v2")
            return real_download(self, *args, **kw)

        monkeypatch.setattr(storage.Blob, "download_as_bytes", replaced_first)
        gcs.pin_generations = pinned
        try:
            blob = store.read(BUCKET, key)
        finally:
            gcs.pin_generations = False
        assert blob.data == b"v2" and blob.info.generation == store.stat(BUCKET, key).generation

    def test_412_from_another_writer_is_still_a_conflict(self, gcs, monkeypatch):
        store = GcsStore(client(gcs.url))
        key = f"retry/{uuid.uuid4().hex}"
        store.write(BUCKET, key, b"theirs")
        with pytest.raises(errors.PreconditionFailed):
            store.write(BUCKET, key, b"mine", if_generation_match=0)


class TestComputeAdapter:
    def test_transient_errors_are_retried(self, srv):
        srv.fail_next("instances.insert", 503, 2)
        srv.fail_next("instances.aggregatedList", 500, 1)
        gw = gateway(srv)
        gw.insert([request_for("t")], names.request_id("t", 1, 0))
        assert [i.name for i in gw.list_managed([PROJECT]).instances] == ["t-1"]

    def test_a_synchronous_stockout_is_not_retried(self, srv):
        srv.stockout("us-central1-a", mode="sync")
        calls = counting(srv, "_instances_insert")
        with pytest.raises(errors.CapacityError):
            gateway(srv).insert([request_for("s")], names.request_id("s", 1, 0))
        assert len(calls) == 1

    def test_bulk_insert_insufficient_capacity_is_a_capacity_error_not_retried(self, srv):
        srv.stockout("us-central1-a", mode="sync")  # bulkInsert refuses with 503 insufficientCapacity
        calls = counting(srv, "_instances_bulkInsert")
        with pytest.raises(errors.CapacityError) as e:
            gateway(srv).insert(gang("ic"), names.request_id("ic", 1, 0))
        assert (e.value.zone, e.value.reason, len(calls)) == ("us-central1-a", "insufficientCapacity", 1)
        assert srv.instances() == []

    def test_rate_limit_exceeded_is_retried(self, srv):
        srv.fail_next("instances.insert", 403, 2, reason="rateLimitExceeded", message="Rate Limit Exceeded")
        srv.fail_next("instances.bulkInsert", 403, 1, reason="rateLimitExceeded", message="Rate Limit Exceeded")
        gw = gateway(srv)
        gw.insert([request_for("rl")], names.request_id("rl", 1, 0))
        gw.insert(gang("rg"), names.request_id("rg", 1, 0))
        assert sorted(i["name"] for i in srv.instances()) == ["rg-1-n0", "rg-1-n1", "rl-1"]

    def test_quota_on_the_operation_is_a_quota_error_read_from_its_details(self, srv):
        srv.quota("us-central1-b", mode="operation")
        with pytest.raises(errors.QuotaError) as e:
            gateway(srv).insert([request_for("q", zone="us-central1-b")], names.request_id("q", 1, 0))
        assert e.value.zone == "us-central1-b" and "nvidia_l4_gpus" in e.value.reason
        op = next(o for o in srv.operations() if o["operationType"] == "insert")
        assert op["error"]["errors"][0]["errorDetails"][0]["quotaInfo"]["limit"] == 0

    def test_quota_exceeded_info_alone_makes_a_quota_error(self):
        """Whatever the code, an operation error carrying QuotaExceededInfo is a quota answer."""
        op = compute_v1.Operation(status=compute_v1.Operation.Status.DONE, http_error_status_code=403, error=compute_v1.Error(
            errors=[compute_v1.Errors(code="SOME_NEW_CODE", message="no", error_details=[compute_v1.ErrorDetails(
                quota_info=compute_v1.QuotaExceededInfo(metric_name="compute.googleapis.com/gpus", limit=8))])]))
        with pytest.raises(errors.QuotaError) as e:
            _raise_for(op, "us-central1-a")
        assert "compute.googleapis.com/gpus" in e.value.reason

    @pytest.mark.parametrize("change, expected", [
        ({"zone": "us-central1-z"}, "zones/us-central1-z"),  # 404
        ({"boot_image": "projects/debian-cloud/global/images/family/debian-99"}, "debian-99"),  # 404
        ({"machine_type": "g9-nonexistent-1"}, "g9-nonexistent-1"),  # 400
    ])
    @pytest.mark.parametrize("nodes", [1, 2])
    def test_an_insert_naming_what_does_not_exist_is_a_request_error(self, srv, change, expected, nodes):
        srv.unknown("image", "projects/debian-cloud/global/images/family/debian-99")
        srv.unknown("machineType", "g9-nonexistent-1")
        requests_ = [replace(r, **change) for r in (gang("nx", nodes) if nodes > 1 else [request_for("nx")])]
        with pytest.raises(errors.RequestError) as e:  # not NotFound, which would be retried forever
            gateway(srv).insert(requests_, names.request_id("nx", 1, 0))
        assert expected in str(e.value)
        assert srv.instances() == []

    def test_an_invalid_job_name_never_reaches_the_server(self, srv):
        calls = counting(srv, "_instances_aggregatedList")
        with pytest.raises(errors.RequestError):
            gateway(srv).list_managed([PROJECT], 'a") OR (labels.x = "y')
        assert calls == []

    def test_rejected_request_is_a_request_error(self, srv):
        bad = request_for("b")
        bad = type(bad)(**{**bad.__dict__, "name": "Not A Name"})
        with pytest.raises(errors.RequestError) as e:
            gateway(srv).insert([bad], names.request_id("b", 1, 0))
        assert "resource.name" in str(e.value)

    def test_unreachable_zones_are_reported(self, srv):
        srv.unreachable("europe-west4-a")
        assert gateway(srv).list_managed([PROJECT]).unreachable == ["europe-west4-a"]

    def test_slow_operation_is_waited_for(self, srv):
        srv.slow_operations(1.0)
        started = time.monotonic()
        gateway(srv).insert([request_for("w")], names.request_id("w", 1, 0))
        assert time.monotonic() - started >= 1.0
        assert srv.instance("w-1")["status"] in ("STAGING", "RUNNING")

    def test_gang_is_one_zonal_bulk_insert(self, srv):
        srv.stockout("us-central1-a", mode="sync")  # a regional request allowed to move would land in -b
        gw = gateway(srv)
        with pytest.raises(errors.CapacityError):
            gw.insert(gang("g", zone="us-central1-a"), names.request_id("g", 1, 0))
        srv.stockout("us-central1-a", on=False)
        gw.insert(gang("g", zone="us-central1-a"), names.request_id("g", 1, 1))
        ops = [o for o in srv.operations() if o["operationType"] == "bulkInsert"]
        assert len(ops) == 1 and ops[0]["zone"].endswith("/zones/us-central1-a") and "region" not in ops[0]
        assert {srv.instance(f"g-1-n{r}")["zone"].rsplit("/", 1)[-1] for r in range(2)} == {"us-central1-a"}

    @pytest.mark.parametrize("nodes", [1, 2])
    def test_insert_running_past_the_deadline_is_pending_and_its_late_stockout_is_read_later(self, srv, nodes):
        srv.slow_operations(1.5)
        gw = gateway(srv, operation_timeout=0.3)
        requests_ = gang("late", nodes) if nodes > 1 else [request_for("late")]
        rid = names.request_id("late", 1, 0)
        started = time.monotonic()
        with pytest.raises(errors.OperationPending):
            gw.insert(requests_, rid)
        assert time.monotonic() - started < 1.2
        assert {i["status"] for i in srv.instances()} == {"PROVISIONING"}
        srv.stockout("us-central1-a")  # decided when the operation finishes
        until("the stocked-out instances to go", lambda: srv.instances() == [])
        srv.slow_operations(0.05)
        srv.stockout("us-central1-a", on=False)
        with pytest.raises(errors.CapacityError):  # the same request id: the original operation's outcome
            gw.insert(requests_, rid)

    def test_insert_pending_then_done_is_success_on_the_next_try(self, srv):
        srv.slow_operations(1.0)
        gw = gateway(srv, operation_timeout=0.2)
        rid = names.request_id("ok", 1, 0)
        with pytest.raises(errors.OperationPending) as e:
            gw.insert([request_for("ok")], rid)
        assert "ok-1" in str(e.value) and "us-central1-a" in str(e.value)
        gw.operation_timeout = 30.0
        gw.insert([request_for("ok")], rid)  # waits on the very same operation
        assert srv.instance("ok-1")["status"] in ("STAGING", "RUNNING")
        assert len([o for o in srv.operations() if o["operationType"] == "insert"]) == 1

    def test_an_insert_told_not_to_wait_is_pending_at_once_and_read_later(self, srv):
        srv.slow_operations(1.0)
        gw = gateway(srv, operation_timeout=30.0)
        rid = names.request_id("nowait", 1, 0)
        started = time.monotonic()
        with pytest.raises(errors.OperationPending):
            gw.insert([request_for("nowait")], rid, wait=0.0)
        assert time.monotonic() - started < 0.8, "waited for an operation it was told not to"
        gw.insert([request_for("nowait")], rid)  # the gateway's own limit: waits the same operation out
        assert srv.instance("nowait-1")["status"] in ("STAGING", "RUNNING")
        assert len([o for o in srv.operations() if o["operationType"] == "insert"]) == 1

    def test_delete_running_past_the_deadline_returns(self, srv):
        gw = gateway(srv)
        gw.insert([request_for("del")], names.request_id("del", 1, 0))
        srv.slow_operations(1.5)
        gw.operation_timeout = 0.3
        started = time.monotonic()
        gw.delete(PROJECT, "us-central1-a", "del-1")
        assert time.monotonic() - started < 1.2
        assert srv.instance("del-1")["status"] == "STOPPING"
        until("the delete to finish", lambda: srv.instances() == [])

    def test_any_status_over_http_is_listed(self, srv):
        gw = gateway(srv)
        gw.insert([request_for("st")], names.request_id("st", 1, 0))
        for sent, read in (("PENDING_STOP", InstanceStatus.PENDING_STOP), ("FLOATING", InstanceStatus.UNKNOWN)):
            assert requests.post(f"{srv.endpoint}/_local/set_status", json={"name": "st-1", "status": sent}, timeout=5).ok
            assert api(srv, "GET", "zones/us-central1-a/instances/st-1").json()["status"] == sent
            assert [i.status for i in gw.list_managed([PROJECT], "st").instances] == [read]

    def test_listings_read_every_page_of_both_kinds_without_the_clients(self, srv):
        """Listings go as GETs of their own (``compute.Listing``), page after page: every managed VM
        of the zone and of the project, a scope with no VMs on a page skipped, and no client built."""
        gw = gateway(srv)
        managed = {names.MANAGED_LABEL: "true", names.JOB_LABEL: "pg"}
        for i in range(5):
            zone = "us-central1-a" if i % 2 else "us-central1-b"
            labels = managed if i != 4 else {"k": "v"}  # pg-4 is no one's
            sent = api(srv, "POST", f"zones/{zone}/instances",
                       json=body(f"pg-{i}", labels=labels, machineType=f"zones/{zone}/machineTypes/e2-small"))
            assert sent.ok, sent.text
        gw.listing.page_size = 1
        pages, zone_pages = counting(srv, "_instances_aggregatedList"), counting(srv, "_instances_list")
        assert sorted(i.name for i in gw.list_managed([PROJECT]).instances) == ["pg-0", "pg-1", "pg-2", "pg-3"]
        assert len(pages) >= 4
        zoned = gw.list_managed([PROJECT], zones=["us-central1-a", "us-central1-b"])
        assert sorted((i.zone, i.name) for i in zoned.instances) == [
            ("us-central1-a", "pg-1"), ("us-central1-a", "pg-3"), ("us-central1-b", "pg-0"), ("us-central1-b", "pg-2")]
        assert len(zone_pages) >= 4  # two VMs a zone, one a page
        assert gw._clients is None  # listing built none of google-cloud-compute's clients

    def test_a_listing_refused_blinds_its_project_alone_and_a_transient_one_is_retried(self, srv):
        gw = gateway(srv)
        gw.insert([request_for("seen")], names.request_id("seen", 1, 0))
        srv.fail_next("instances.aggregatedList", 503)  # retried by RETRY, as the client's calls are
        assert [i.name for i in gw.list_managed([PROJECT]).instances] == ["seen-1"]
        srv.fail_next("instances.aggregatedList", 403, reason="forbidden",
                      message="Required 'compute.instances.list' permission for 'projects/theirs'")
        refused = gw.list_managed(["theirs", PROJECT])  # a refusal is not retried: the first project's
        assert [i.name for i in refused.instances] == ["seen-1"] and list(refused.failed_projects) == ["theirs"]
        assert "compute.instances.list" in refused.failed_projects["theirs"]

    def test_host_error_over_http_is_recorded(self, srv):
        gw = gateway(srv)
        gw.insert([request_for("he")], names.request_id("he", 1, 0))
        until("RUNNING", lambda: srv.instance("he-1")["status"] == "RUNNING")
        assert requests.post(f"{srv.endpoint}/_local/host_error", json={"name": "he-1"}, timeout=5).ok
        until("TERMINATED", lambda: srv.instance("he-1")["status"] == "TERMINATED")
        ops = api(srv, "GET", "zones/us-central1-a/operations",
                  params={"filter": 'operationType = "compute.instances.hostError"'}).json()["items"]
        assert [o["targetLink"].rsplit("/", 1)[-1] for o in ops] == ["he-1"]


class TestNoticeAndGo:
    """The preemption notice's inserts (beta API) and the go (setMetadata): what only the real
    clients do. The behaviours the fake shares are in tests/contract/test_release_port.py."""

    @staticmethod
    def routes(srv: ComputeServer) -> list[tuple[str, str]]:
        """(API version, method) of each call the server answers from now on."""
        seen: list[tuple[str, str]] = []
        original = srv._dispatch

        def dispatch(verb: str, path: str, version: str = "v1") -> Any:
            method = next(m for m in srv._routes[version] if m.pattern.match(path) and m.http_method == verb)
            seen.append((version, f"{method.resource}.{method.name}"))
            return original(verb, path, version)

        srv._dispatch = dispatch  # type: ignore[method-assign]
        return seen

    @pytest.mark.parametrize("nodes", [1, 2])
    def test_a_notice_goes_through_the_beta_api_and_its_operation_is_waited_for_on_v1(self, srv, nodes):
        srv.slow_operations(insert=0.5)
        seen = self.routes(srv)
        job = f"beta{nodes}"
        requests_ = [replace(r, preemption_notice_s=120) for r in
                     ([request_for(job)] if nodes == 1 else gang(job, nodes))]
        gateway(srv).insert(requests_, names.request_id(job, 1, 0))
        method = "instances.insert" if nodes == 1 else "instances.bulkInsert"
        assert ("beta", method) in seen and ("v1", "zoneOperations.wait") in seen and ("v1", method) not in seen
        assert all(srv.instance(r.name)["status"] != "PROVISIONING" for r in requests_)  # the operation was DONE

    @pytest.mark.parametrize("notice, provisioning", [(0, "spot"), (120, "standard")])
    def test_no_notice_or_one_on_a_vm_that_is_not_spot_never_goes_through_beta(self, srv, notice, provisioning):
        seen = self.routes(srv)
        request = replace(request_for("v1only"), preemption_notice_s=notice, provisioning=provisioning)
        gateway(srv).insert([request], names.request_id("v1only", 1, 0))
        assert [v for v, m in seen if m == "instances.insert"] == ["v1"]
        assert "preemptionNoticeDuration" not in srv.instance("v1only-1")["scheduling"]

    def test_a_notice_inserts_stockout_on_its_operation_is_a_capacity_error(self, srv):
        srv.stockout("us-central1-a", mode="operation")
        with pytest.raises(errors.CapacityError) as e:
            gateway(srv).insert([replace(request_for("so"), preemption_notice_s=120)], names.request_id("so", 1, 0))
        assert e.value.zone == "us-central1-a"

    def test_the_beta_client_is_built_once_at_the_first_notice(self, srv):
        gw = gateway(srv)
        assert gw._beta is None  # nothing asked for a notice yet: not even imported for it
        gw.insert([replace(request_for("b1"), preemption_notice_s=120)], names.request_id("b1", 1, 0))
        client = gw._beta
        gw.insert([replace(request_for("b2"), preemption_notice_s=120)], names.request_id("b2", 1, 0))
        assert client is not None and gw._beta is client
        assert type(client).__module__.startswith("google.cloud.compute_v1beta.")

    def test_a_notice_refused_on_the_operation_is_notice_refused_too(self):
        message = "Invalid value for field 'resource.scheduling.preemptionNoticeDuration': '120s'."
        op = compute_v1.Operation(status=compute_v1.Operation.Status.DONE, http_error_status_code=400,
                                  error=compute_v1.Error(errors=[compute_v1.Errors(code="INVALID", message=message)]))
        with pytest.raises(errors.NoticeRefused) as e:
            _raise_for(op, "us-central1-a")
        assert e.value.zone == "us-central1-a" and "preemptionNoticeDuration" in str(e.value)

    def test_a_release_that_keeps_meeting_other_writes_gives_up_as_transient(self, srv):
        gateway(srv).insert([request_for("busy")], names.request_id("busy", 1, 0))
        srv.fail_next("instances.setMetadata", 412, times=20, reason="conditionNotMet",
                      message="Supplied fingerprint does not match current metadata fingerprint.")
        gets = counting(srv, "_instances_get")
        with pytest.raises(errors.TransientError):
            gateway(srv).release(PROJECT, "us-central1-a", "busy-1", {"respawn-go": "1"})
        assert len(gets) == 5  # read again before each of its five writes
        assert "respawn-go" not in {i["key"] for i in srv.instance("busy-1")["metadata"]["items"]}

    def test_a_retried_release_whose_first_answer_was_lost_is_still_its_own_write(self, srv):
        """The write went through but its answer did not come back (a 503 after the fact): the
        client's retry sends the same request id, and Compute answers with the first operation."""
        gateway(srv).insert([request_for("lost")], names.request_id("lost", 1, 0))
        original, answered = srv._instances_setMetadata, []

        def lose_first_answer(*args: Any) -> Any:
            op = original(*args)
            answered.append(op["name"])
            if len(answered) == 1:
                raise ApiError(503, "Internal error. Please try again or contact Google Support.", "backendError")
            return op

        srv._instances_setMetadata = lose_first_answer  # type: ignore[method-assign]
        assert gateway(srv).release(PROJECT, "us-central1-a", "lost-1", {"respawn-go": "1"}) is True
        assert len(answered) == 2 and answered[0] == answered[1]  # the replay: one write


class TestLocalComputeFidelity:
    def test_unknown_field_is_refused_like_google(self, srv):
        r = api(srv, "POST", "zones/us-central1-a/instances", json=body("x", colour="red"))
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["message"] == 'Invalid JSON payload received. Unknown name "colour" at \'resource\': Cannot find field.'
        assert error["errors"][0]["reason"] and error["code"] == 400

    @pytest.mark.parametrize("extra, field", [
        ({"scheduling": {"provisioningModel": "CHEAP"}}, "provisioning_model"),
        ({"guestAccelerators": [{"acceleratorType": "nvidia-l4", "acceleratorCount": 1}]}, "onHostMaintenance"),
        ({"scheduling": {"provisioningModel": "SPOT", "onHostMaintenance": "TERMINATE"}}, "automaticRestart"),
        ({"labels": {"Bad": "x"}}, "labels"),
    ])
    def test_invalid_instances_are_refused(self, srv, extra, field):
        r = api(srv, "POST", "zones/us-central1-a/instances", json=body("x", **extra))
        assert r.status_code == 400 and field in r.json()["error"]["message"]

    def test_request_id_must_be_a_uuid(self, srv):
        r = api(srv, "POST", "zones/us-central1-a/instances", params={"requestId": "job-1"}, json=body("x"))
        assert r.status_code == 400 and "requestId" in r.json()["error"]["message"]

    def test_not_found_and_already_exists_shapes(self, srv):
        r = api(srv, "GET", "zones/us-central1-a/instances/nope")
        assert r.status_code == 404 and r.json()["error"]["errors"][0]["reason"] == "notFound"
        assert "projects/contract-proj/zones/us-central1-a/instances/nope" in r.json()["error"]["message"]
        assert api(srv, "POST", "zones/us-central1-a/instances", json=body("dup")).ok
        r = api(srv, "POST", "zones/us-central1-a/instances", json=body("dup"))
        assert r.status_code == 409 and r.json()["error"]["errors"][0]["reason"] == "alreadyExists"
        assert api(srv, "GET", "zones/mars-north1-a/instances").status_code == 404

    def test_instance_and_operation_lifecycles(self, srv):
        op = api(srv, "POST", "zones/us-central1-a/instances", json=body("life")).json()
        assert op["kind"] == "compute#operation" and op["status"] in ("PENDING", "RUNNING")
        assert op["operationType"] == "insert" and op["targetLink"].endswith("/instances/life")
        seen = set()
        deadline = time.monotonic() + 5
        while "RUNNING" not in seen and time.monotonic() < deadline:
            seen.add(api(srv, "GET", "zones/us-central1-a/instances/life").json()["status"])
        assert seen >= {"RUNNING"} and seen <= {"PROVISIONING", "STAGING", "RUNNING"}
        done = api(srv, "POST", f"zones/us-central1-a/operations/{op['name']}/wait").json()
        assert done["status"] == "DONE" and done["progress"] == 100 and "endTime" in done
        instance = api(srv, "GET", "zones/us-central1-a/instances/life").json()
        assert instance["id"].isdigit() and instance["selfLink"].endswith("/zones/us-central1-a/instances/life")
        assert instance["zone"].endswith("/zones/us-central1-a") and "T" in instance["creationTimestamp"]
        assert instance["machineType"].startswith("http") and instance["kind"] == "compute#instance"

    def test_failed_operation_is_done_with_an_error(self, srv):
        srv.stockout("us-central1-a")
        op = api(srv, "POST", "zones/us-central1-a/instances", json=body("cap")).json()
        done = api(srv, "POST", f"zones/us-central1-a/operations/{op['name']}/wait").json()
        assert done["status"] == "DONE" and done["httpErrorStatusCode"] == 503
        assert done["error"]["errors"][0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
        assert api(srv, "GET", "zones/us-central1-a/instances/cap").status_code == 404

    def test_preemption_with_delete_action_leaves_an_operation_behind(self, srv):
        spot = {"provisioningModel": "SPOT", "automaticRestart": False, "onHostMaintenance": "TERMINATE",
                "instanceTerminationAction": "DELETE"}
        op = api(srv, "POST", "zones/us-central1-a/instances", json=body("gone", scheduling=spot)).json()
        api(srv, "POST", f"zones/us-central1-a/operations/{op['name']}/wait")
        srv.preempt("gone")
        deadline = time.monotonic() + 5
        while api(srv, "GET", "zones/us-central1-a/instances/gone").status_code != 404 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert api(srv, "GET", "zones/us-central1-a/instances/gone").status_code == 404
        ops = api(srv, "GET", "zones/us-central1-a/operations",
                  params={"filter": 'operationType = "compute.instances.preempted"'}).json()["items"]
        assert [o["targetLink"].rsplit("/", 1)[-1] for o in ops] == ["gone"]

    def _regional(self, srv: ComputeServer, job: str, locations: dict[str, str]) -> requests.Response:
        props = {k: v for k, v in body("x").items() if k != "name"}
        props["machineType"] = "e2-small"
        return api(srv, "POST", "regions/us-central1/instances/bulkInsert", json={
            "count": 2, "minCount": 2, "instanceProperties": props,
            "perInstanceProperties": {f"{job}-1-n{r}": {"name": f"{job}-1-n{r}"} for r in range(2)},
            "locationPolicy": {"locations": {f"zones/{z}": {"preference": p} for z, p in locations.items()},
                               "targetShape": "ANY_SINGLE_ZONE"}})

    def _zone_of(self, srv: ComputeServer, op: dict[str, Any], name: str) -> str:
        api(srv, "POST", f"regions/us-central1/operations/{op['name']}/wait")
        return srv.instance(name)["zone"].rsplit("/", 1)[-1]

    def test_regional_bulk_insert_zones_left_out_are_allowed(self, srv):
        """Google's rule: unlisted zones default to ALLOW, so one ALLOW entry does not pin the gang."""
        srv.stockout("us-central1-a", mode="sync")
        r = self._regional(srv, "ra", {"us-central1-a": "ALLOW"})
        assert r.ok, r.text
        assert self._zone_of(srv, r.json(), "ra-1-n0") != "us-central1-a"
        assert self._zone_of(srv, r.json(), "ra-1-n1") == self._zone_of(srv, r.json(), "ra-1-n0")

    def test_regional_bulk_insert_deny_excludes(self, srv):
        r = self._regional(srv, "rd", {"us-central1-a": "DENY", "us-central1-b": "DENY", "us-central1-c": "ALLOW"})
        assert r.ok, r.text
        assert self._zone_of(srv, r.json(), "rd-1-n0") == "us-central1-c"
        everything = {z: "DENY" for z in ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f")}
        assert self._regional(srv, "rn", everything).status_code == 400
        assert self._regional(srv, "ro", {"us-east1-b": "ALLOW"}).status_code == 400

    def test_stop_and_start(self, srv):
        op = api(srv, "POST", "zones/us-central1-a/instances", json=body("ss")).json()
        api(srv, "POST", f"zones/us-central1-a/operations/{op['name']}/wait")
        stop = api(srv, "POST", "zones/us-central1-a/instances/ss/stop").json()
        api(srv, "POST", f"zones/us-central1-a/operations/{stop['name']}/wait")
        assert api(srv, "GET", "zones/us-central1-a/instances/ss").json()["status"] == "TERMINATED"
        start = api(srv, "POST", "zones/us-central1-a/instances/ss/start").json()
        api(srv, "POST", f"zones/us-central1-a/operations/{start['name']}/wait")
        deadline = time.monotonic() + 5
        while api(srv, "GET", "zones/us-central1-a/instances/ss").json()["status"] != "RUNNING":
            assert time.monotonic() < deadline
            time.sleep(0.05)

    def test_list_pages_and_filters_through_the_real_client(self, srv):
        for i in range(7):
            api(srv, "POST", "zones/us-central1-a/instances", json=body(f"p{i}", labels={"k": "odd" if i % 2 else "even"}))
        raw = compute_v1.InstancesClient(transport="rest", credentials=AnonymousCredentials(),
                                         client_options=ClientOptions(api_endpoint=srv.endpoint))
        listed = raw.list(request=compute_v1.ListInstancesRequest(project=PROJECT, zone="us-central1-a", max_results=2))
        assert sorted(i.name for i in listed) == [f"p{i}" for i in range(7)]
        odd = raw.list(request=compute_v1.ListInstancesRequest(project=PROJECT, zone="us-central1-a",
                                                               filter='labels.k = "odd"'))
        assert sorted(i.name for i in odd) == ["p1", "p3", "p5"]
        assert api(srv, "GET", "zones/us-central1-a/instances", params={"filter": "name = (("}).status_code == 400


def test_the_clients_read_the_environment_once_and_still_honour_a_proxy(monkeypatch, tmp_path):
    """requests re-reads proxies, CA bundles and netrc from the environment on every request;
    the clients skip that lookup where it could only find a CA bundle (taken once instead)."""
    from controller.adapters.google import gcs_store

    for variable in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                     "NO_PROXY", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NETRC"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # anonymous: no Google credentials needed
    config = Settings(bucket="b", project=PROJECT, compute_endpoint="http://127.0.0.1:9")
    sessions = lambda: [gcs_store(config).client._http, compute_gateway(config).listing.session,  # noqa: E731
                        *(c._transport._session for c in (compute_gateway(config).instances, compute_gateway(config).zone_ops))]
    assert [s.trust_env for s in sessions()] == [False] * 4
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/corp-ca.pem")
    assert [(s.trust_env, s.verify) for s in sessions()] == [(False, "/etc/corp-ca.pem")] * 4  # taken once
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    assert [s.trust_env for s in sessions()] == [True] * 4
    monkeypatch.delenv("HTTPS_PROXY")
    (tmp_path / ".netrc").write_text("machine storage.googleapis.com login x password y\n")
    assert all(s.trust_env for s in sessions())


def test_a_client_certificate_adapter_the_client_mounted_is_kept():
    """With GOOGLE_API_USE_CLIENT_CERTIFICATE, the clients mount an mTLS adapter on https://;
    sizing the pool must not swap it for a plain one (the certificate would be dropped)."""
    from controller.adapters.google import _tune

    class MutualTls(requests.adapters.HTTPAdapter):
        pass

    session = requests.Session()
    session.mount("https://", MutualTls())
    _tune(session, 32)
    assert type(session.get_adapter("https://storage.googleapis.com/")) is MutualTls
    assert session.get_adapter("http://127.0.0.1/")._pool_maxsize == 32
