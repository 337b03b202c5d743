"""Adapter behaviours that only the real clients have (retries, 412-after-retry, paging),
and the local Compute server's fidelity, checked with the real client and raw HTTP."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1, storage

from controller import errors, names
from controller.adapters.gcs import GcsStore
from controller.adapters.google import compute_gateway
from controller.config import Settings
from localcloud.compute import ComputeServer
from localcloud.gcs import LocalGcs, client
from tests.contract.test_ports import PROJECT, request_for

BUCKET = "adapter-bucket"


@pytest.fixture(scope="module")
def gcs() -> Iterator[LocalGcs]:
    with LocalGcs(buckets=(BUCKET,)) as g:
        yield g


@pytest.fixture
def srv() -> Iterator[ComputeServer]:
    with ComputeServer(boot_delay=0.05, shutdown_budget=0.2, run_vms=False) as s:
        yield s


def gateway(srv: ComputeServer) -> Any:
    return compute_gateway(Settings(bucket="b", project=PROJECT, compute_endpoint=srv.endpoint))


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
        calls = []
        original = srv._instances_insert  # noqa: SLF001 - counting calls the server sees

        def counting(*args: Any) -> Any:
            calls.append(1)
            return original(*args)

        srv._instances_insert = counting  # noqa: SLF001
        with pytest.raises(errors.CapacityError):
            gateway(srv).insert([request_for("s")], names.request_id("s", 1, 0))
        assert len(calls) == 1

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

    def test_gang_is_one_regional_bulk_insert(self, srv):
        gang = [request_for("g", name=f"g-1-{r}") for r in range(2)]
        gateway(srv).insert(gang, names.request_id("g", 1, 0))
        ops = [o for o in srv.operations() if o["operationType"] == "bulkInsert"]
        assert len(ops) == 1 and ops[0]["region"].endswith("/regions/us-central1")
        assert {srv.instance(f"g-1-{r}")["zone"].rsplit("/", 1)[-1] for r in range(2)} == {"us-central1-a"}


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
