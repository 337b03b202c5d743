"""The local Cloud TPU server, through the real google-cloud-tpu REST client: nodes whose
workers are real processes under TPU VM metadata, Google's operation and error shapes,
preemption, maintenance, health, stockout, quota and queued resources.

Waiting on an operation: ``TpuClient``'s REST transport builds its operations client
(``operations_v1.AbstractOperationsClient`` over ``OperationsRestTransport``) with
``host=self._host``, the client's own ``api_endpoint``, and ``path_prefix="v2"``
(google/cloud/tpu_v2/services/tpu/transports/rest.py, ``operations_client``), so unlike
Compute's ``ExtendedOperation.result()`` (which polls Google's host), ``Operation.result()``
polls this server. Both ways are exercised: ``done`` polls ``client.get_operation``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2
from google.longrunning import operations_pb2

from localcloud import stack
from localcloud.tpu import TpuServer
from tests.wait import until

PROJECT = "tpu-proj"
ZONE = "us-central1-a"
PARENT = f"projects/{PROJECT}/locations/{ZONE}"
MD = 'curl -sf -H "Metadata-Flavor: Google" "http://$GCE_METADATA_HOST/computeMetadata/v1/instance'
# Each worker records who it is and stays up; its pid lets a test see it killed.
WORKER = f"""echo $$ > pid
{MD}/attributes/agent-worker-number" > worker
{MD}/attributes/worker-network-endpoints" > endpoints
{MD}/attributes/tpu-env" > tpu-env
{MD}/name" > name
sleep 60
"""
MARK_PREEMPTED = f'{MD}/preempted" > shutdown-saw-preempted'
MARK_MAINTENANCE = f'{MD}/maintenance-event" > shutdown-saw-maintenance'


@pytest.fixture
def srv() -> Iterator[TpuServer]:
    path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    with TpuServer(vm_env={"PATH": path}, boot_delay=0.05, shutdown_budget=3.0) as s:
        yield s


@pytest.fixture
def client(srv: TpuServer) -> tpu_v2.TpuClient:
    return tpu_v2.TpuClient(transport="rest", client_options=ClientOptions(api_endpoint=srv.endpoint),
                            credentials=AnonymousCredentials())


def spec(accelerator: str = "v4-8", startup: str | None = WORKER, shutdown: str | None = None,
         spot: bool = True) -> tpu_v2.Node:
    metadata = {k: v for k, v in (("startup-script", startup), ("shutdown-script", shutdown)) if v}
    return tpu_v2.Node(accelerator_type=accelerator, runtime_version="tpu-ubuntu2204-base", metadata=metadata,
                       scheduling_config=tpu_v2.SchedulingConfig(spot=spot))


def done(client: tpu_v2.TpuClient, name: str) -> operations_pb2.Operation:
    """The operation once done, polled through the same endpoint."""
    return until(f"operation {name}", lambda: (op := client.get_operation({"name": name})).done and op, timeout=15)


def create(client: tpu_v2.TpuClient, node_id: str, node: tpu_v2.Node) -> tpu_v2.Node:
    op = done(client, client.create_node(parent=PARENT, node_id=node_id, node=node).operation.name)
    assert op.WhichOneof("result") == "response", op.error
    return client.get_node(name=f"{PARENT}/nodes/{node_id}")


def read(srv: TpuServer, node_id: str, worker: int, name: str) -> str:
    path = srv.workdir_of(node_id, worker) / name
    return path.read_text().strip() if path.exists() else ""


def alive(pid_text: str) -> bool:
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    return True


def raw(srv: TpuServer, method: str, path: str, **kwargs: Any) -> requests.Response:
    return requests.request(method, f"{srv.endpoint}/v2/{path}", timeout=10, **kwargs)


def test_create_get_list_delete_with_the_real_client(srv, client):
    op = client.create_node(parent=PARENT, node_id="tpu-a", node=spec(startup=None))
    node = op.result(timeout=15)  # polls this server: see the module docstring
    assert node.name == f"{PARENT}/nodes/tpu-a"
    assert (node.state, node.health) == (tpu_v2.Node.State.READY, tpu_v2.Node.Health.HEALTHY)
    assert node.accelerator_type == "v4-8" and node.scheduling_config.spot
    assert node.accelerator_config.type_ == tpu_v2.AcceleratorConfig.Type.V4
    assert node.accelerator_config.topology == "2x2x1" and node.api_version == tpu_v2.Node.ApiVersion.V2
    assert len(node.network_endpoints) == 1 and node.network_endpoints[0].port == 8470
    assert node.id > 0 and node.create_time.year >= 2024
    # The operation as Google shapes it, read without the client's help.
    shaped = raw(srv, "GET", op.operation.name).json()
    assert shaped["done"] is True and shaped["name"].startswith(f"{PARENT}/operations/operation-")
    assert shaped["metadata"]["@type"] == "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
    assert (shaped["metadata"]["verb"], shaped["metadata"]["target"]) == ("create", node.name)
    assert shaped["response"]["@type"] == "type.googleapis.com/google.cloud.tpu.v2.Node"
    assert [n.name for n in client.list_nodes(parent=PARENT)] == [node.name]
    gone = done(client, client.delete_node(name=node.name).operation.name)
    assert gone.response.type_url == "type.googleapis.com/google.protobuf.Empty"
    assert srv.names() == set() and list(client.list_nodes(parent=PARENT)) == []
    with pytest.raises(gexc.NotFound):
        client.get_node(name=node.name)


def test_every_worker_runs_the_startup_script_under_tpu_vm_metadata(srv, client):
    node = create(client, "slice", spec("v4-32"))  # v4-32: 16 chips, 4 per VM, so 4 workers
    assert len(node.network_endpoints) == 4
    ips = [e.ip_address for e in node.network_endpoints]
    until("every worker's records", lambda: all(read(srv, "slice", w, "name") for w in range(4)))
    assert [read(srv, "slice", w, "worker") for w in range(4)] == ["0", "1", "2", "3"]
    assert read(srv, "slice", 2, "endpoints") == ",".join(f"unknown:unknown:{ip}" for ip in ips)
    assert "NODE_ID: 'slice'" in read(srv, "slice", 3, "tpu-env") and "WORKER_ID: '3'" in read(srv, "slice", 3, "tpu-env")
    assert read(srv, "slice", 1, "name").startswith("t1v-n-") and read(srv, "slice", 1, "name").endswith("-w-1")
    assert all(alive(read(srv, "slice", w, "pid")) for w in range(4))  # four real processes
    assert len({srv.workdir_of("slice", w) for w in range(4)}) == 4


def test_preemption_runs_every_workers_shutdown_script_then_the_node_is_preempted(srv, client):
    create(client, "spot", spec("v4-16", shutdown=MARK_PREEMPTED))
    until("both workers up", lambda: all(read(srv, "spot", w, "pid") for w in range(2)))
    pids = [read(srv, "spot", w, "pid") for w in range(2)]
    srv.preempt("spot")
    until("PREEMPTED", lambda: client.get_node(name=f"{PARENT}/nodes/spot").state == tpu_v2.Node.State.PREEMPTED)
    assert [read(srv, "spot", w, "shutdown-saw-preempted") for w in range(2)] == ["TRUE", "TRUE"]
    assert not any(alive(pid) for pid in pids)
    assert "spot" in srv.names()  # listed until deleted: a Spot TPU is not restarted
    create(client, "standard", spec(startup=None, spot=False))
    with pytest.raises(ValueError, match="neither Spot nor preemptible"):
        srv.preempt("standard")


def test_maintenance_makes_the_node_unhealthy_then_terminated_or_recovered(srv, client):
    create(client, "maint", spec(shutdown=MARK_MAINTENANCE + "; sleep 0.3"))
    until("worker up", lambda: read(srv, "maint", 0, "pid"))
    first = read(srv, "maint", 0, "pid")
    srv.maintenance("maint")
    assert client.get_node(name=f"{PARENT}/nodes/maint").health == tpu_v2.Node.Health.UNHEALTHY_MAINTENANCE
    until("TERMINATED", lambda: srv.node("maint")["state"] == "TERMINATED")
    assert read(srv, "maint", 0, "shutdown-saw-maintenance") == "TERMINATE_ON_HOST_MAINTENANCE"
    assert not alive(first)

    create(client, "survivor", spec())
    until("worker up", lambda: read(srv, "survivor", 0, "pid"))
    before = read(srv, "survivor", 0, "pid")
    srv.maintenance("survivor", outcome="recovered")
    assert srv.node("survivor")["health"] == "UNHEALTHY_MAINTENANCE"
    until("booted again", lambda: (pid := read(srv, "survivor", 0, "pid")) != before and alive(pid))
    assert srv.node("survivor")["health"] == "HEALTHY" and srv.node("survivor")["state"] == "READY"
    with pytest.raises(ValueError):
        srv.maintenance("survivor", outcome="later")


def test_health_and_state_take_any_value_and_the_client_keeps_unknown_ones(srv, client):
    create(client, "h", spec(startup=None))
    srv.set_health("h", "UNHEALTHY_TENSORFLOW")
    assert client.get_node(name=f"{PARENT}/nodes/h").health == tpu_v2.Node.Health.UNHEALTHY_TENSORFLOW
    srv.set_state("h", "SOMETHING_NEW")
    # The client asks for numbers ($alt=json;enum-encoding=int); a value it does not know stays a number.
    with pytest.warns(UserWarning, match="Unrecognized State enum value"):
        state = client.get_node(name=f"{PARENT}/nodes/h").state
    assert isinstance(state, int) and state not in {s.value for s in tpu_v2.Node.State}
    assert raw(srv, "GET", f"{PARENT}/nodes/h").json()["state"] == "SOMETHING_NEW"  # names, asked for nothing
    srv.upcoming_maintenance("h")
    upcoming = raw(srv, "GET", f"{PARENT}/nodes/h").json()["upcomingMaintenance"]
    assert (upcoming["type"], upcoming["maintenanceStatus"]) == ("SCHEDULED", "PENDING")
    # The v2 discovery document has Node.upcomingMaintenance; google-cloud-tpu's v2 Node does
    # not (only v2alpha1's), so the v2 client drops it: read it as JSON or through v2alpha1.
    assert "upcoming_maintenance" not in tpu_v2.Node.meta.fields
    srv.upcoming_maintenance("h", on=False)
    assert "upcomingMaintenance" not in srv.node("h")


def test_a_worker_that_powers_itself_off_breaks_the_slice(srv, client):
    create(client, "self-off", spec("v4-16", startup="echo $$ > pid; poweroff; sleep 60"))
    until("health TIMEOUT", lambda: srv.node("self-off")["health"] == "TIMEOUT", timeout=10)
    assert srv.node("self-off")["state"] == "READY"


def test_stockout_fails_the_create_operation_with_resource_exhausted(srv, client):
    srv.stockout(ZONE)
    op = done(client, client.create_node(parent=PARENT, node_id="none", node=spec(startup=None)).operation.name)
    assert op.error.code == 8
    assert f'There is no more capacity in the zone "{ZONE}"' in op.error.message and "[EID: 0x" in op.error.message
    assert "none" not in srv.names()
    srv.stockout(ZONE, on=False)
    assert create(client, "none", spec(startup=None)).state == tpu_v2.Node.State.READY


def test_quota_is_refused_at_once_or_on_the_operation(srv, client):
    srv.quota(ZONE)
    with pytest.raises(gexc.TooManyRequests, match="Quota limit 'TPUV4PreemptiblePerProjectPerRegionForTPUAPI'"):
        client.create_node(parent=PARENT, node_id="q", node=spec(startup=None))
    srv.quota(ZONE, mode="operation")
    op = done(client, client.create_node(parent=PARENT, node_id="q", node=spec(startup=None)).operation.name)
    assert op.error.code == 8 and "has been exceeded" in op.error.message
    srv.quota(ZONE, on=False)
    assert create(client, "q", spec(startup=None)).state == tpu_v2.Node.State.READY


def test_bad_requests_are_refused_naming_the_field(srv, client):
    good = {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base"}
    r = raw(srv, "POST", f"{PARENT}/nodes", params={"nodeId": "x"}, json={**good, "acceleratorTypo": "v4-8"})
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert 'Unknown name "acceleratorTypo"' in r.json()["error"]["message"]
    r = raw(srv, "POST", f"{PARENT}/nodes", params={"nodeId": "x"}, json={**good, "acceleratorType": "v4-12"})
    assert r.status_code == 400 and 'accelerator type, "v4-12", could not be found' in r.json()["error"]["message"]
    assert r.json()["error"]["details"][0]["fieldViolations"][0]["field"] == "node.accelerator_type"
    r = raw(srv, "POST", f"{PARENT}/nodes", params={"nodeId": "x"}, json={**good, "runtimeVersion": ""})
    assert r.status_code == 400 and r.json()["error"]["details"][0]["fieldViolations"][0]["field"] == "node.runtime_version"
    with pytest.raises(gexc.BadRequest, match="Invalid node id"):
        client.create_node(parent=PARENT, node_id="Not_A_Name", node=spec(startup=None))
    with pytest.raises(gexc.Forbidden, match="locations/us-nowhere1-z"):
        list(client.list_nodes(parent=f"projects/{PROJECT}/locations/us-nowhere1-z"))
    create(client, "taken", spec(startup=None))
    with pytest.raises(gexc.Conflict, match=f"Resource '{PARENT}/nodes/taken' already exists"):
        client.create_node(parent=PARENT, node_id="taken", node=spec(startup=None))
    assert raw(srv, "POST", f"{PARENT}/nodes/taken:stop", json={}).status_code == 501


def test_list_pages_and_faults_over_http(srv, client):
    for i in range(3):
        create(client, f"p{i}", spec(startup=None))
    first = raw(srv, "GET", f"{PARENT}/nodes", params={"pageSize": 2}).json()
    assert len(first["nodes"]) == 2 and first["nextPageToken"]
    assert len(list(client.list_nodes(request={"parent": PARENT, "page_size": 2}))) == 3
    srv.fail_next("nodes.get", code=503)
    with pytest.raises(gexc.ServiceUnavailable):
        client.get_node(name=f"{PARENT}/nodes/p0")
    assert requests.post(f"{srv.endpoint}/_local/set_health", json={"name": "p0", "health": "TIMEOUT"}).ok
    assert srv.node("p0")["health"] == "TIMEOUT"
    assert requests.post(f"{srv.endpoint}/_local/preempt", json={"nom": "p0"}).status_code == 400
    assert requests.post(f"{srv.endpoint}/_local/quota", json={"zone": ZONE, "mode": "later"}).status_code == 400


def test_held_operations_stay_not_done_until_released(srv, client):
    srv.hold_operations()
    name = client.create_node(parent=PARENT, node_id="held", node=spec(startup=None)).operation.name
    time.sleep(0.3)
    assert not client.get_operation({"name": name}).done and srv.node("held")["state"] == "CREATING"
    srv.hold_operations(False)
    assert done(client, name).WhichOneof("result") == "response"


def queued(spot: bool = True) -> tpu_v2.QueuedResource:
    node_spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=PARENT, node_id="qnode", node=spec(startup=WORKER, spot=False))
    resource = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[node_spec]))
    if spot:
        resource.spot = tpu_v2.QueuedResource.Spot()
    return resource


def test_a_spot_queued_resource_waits_out_a_stockout_then_its_node_appears(srv, client):
    srv.stockout(ZONE)
    ask = {"parent": PARENT, "queued_resource_id": "qr", "queued_resource": queued(),
           "request_id": "8f0c9a2e-3d4b-4c5a-9e6f-7a8b9c0d1e2f"}
    op = client.create_queued_resource(request=ask)
    assert done(client, op.operation.name).WhichOneof("result") == "response"
    assert client.create_queued_resource(request=ask).operation.name == op.operation.name  # the same request
    State = tpu_v2.QueuedResourceState.State
    qr_name = f"{PARENT}/queuedResources/qr"
    time.sleep(0.3)
    assert client.get_queued_resource(name=qr_name).state.state == State.WAITING_FOR_RESOURCES
    assert srv.names() == set()
    srv.stockout(ZONE, on=False)
    until("ACTIVE", lambda: client.get_queued_resource(name=qr_name).state.state == State.ACTIVE)
    node = client.get_node(name=f"{PARENT}/nodes/qnode")
    assert node.state == tpu_v2.Node.State.READY and node.queued_resource == qr_name
    assert node.scheduling_config.spot  # the spot tier's capacity
    until("its worker runs", lambda: read(srv, "qnode", 0, "worker") == "0")
    srv.preempt("qnode")
    until("SUSPENDED", lambda: client.get_queued_resource(name=qr_name).state.state == State.SUSPENDED)


def test_a_queued_resource_with_a_node_is_deleted_only_with_force(srv, client):
    client.create_queued_resource(parent=PARENT, queued_resource_id="qr", queued_resource=queued())
    qr_name = f"{PARENT}/queuedResources/qr"
    until("its node READY", lambda: "qnode" in srv.names() and srv.node("qnode")["state"] == "READY")
    until("its worker runs", lambda: read(srv, "qnode", 0, "pid"))
    with pytest.raises(gexc.BadRequest, match="delete it with force") as refused:
        client.delete_queued_resource(name=qr_name)
    assert refused.value.response.json()["error"]["status"] == "FAILED_PRECONDITION"
    op = client.delete_queued_resource(request={"name": qr_name, "force": True})
    assert done(client, op.operation.name).WhichOneof("result") == "response"
    assert srv.names() == set() and list(client.list_queued_resources(parent=PARENT)) == []
    assert not alive(read(srv, "qnode", 0, "pid"))


def test_stop_leaves_no_worker_behind():
    with TpuServer(boot_delay=0.05) as s:
        c = tpu_v2.TpuClient(transport="rest", client_options=ClientOptions(api_endpoint=s.endpoint),
                             credentials=AnonymousCredentials())
        create(c, "left", spec(startup="echo $$ > pid; sleep 60"))
        until("worker up", lambda: read(s, "left", 0, "pid"))
        pid = read(s, "left", 0, "pid")
    until("worker killed", lambda: not alive(pid), timeout=5)


def test_the_local_cloud_serves_tpu_beside_compute_and_tells_the_functions(monkeypatch):
    told: dict[str, str] = {}

    def serve_function(target: str, env: dict[str, str], log_dir: Path | None = None) -> Any:
        told.update(env)
        raise RuntimeError("recorded")

    monkeypatch.setattr(stack, "serve_function", serve_function)
    cloud = stack.LocalCloud(stack.Options(boot_delay=0.2, shutdown_budget=7.0))
    with pytest.raises(RuntimeError, match="recorded"):
        cloud.start()  # GCS, Compute and TPU start, the first function is refused, then all is stopped
    assert cloud.tpu is not None and cloud.compute is not None
    assert told["RESPAWN_TPU_ENDPOINT"] == cloud.tpu.endpoint
    assert told["CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"] == f"{cloud.tpu.endpoint}/"
    assert cloud.tpu.vm_env == cloud.compute.vm_env and (cloud.tpu.boot_delay, cloud.tpu.shutdown_budget) == (0.2, 7.0)
    assert cloud.tpu.realism is cloud.options.realism
