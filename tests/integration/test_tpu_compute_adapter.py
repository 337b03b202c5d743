"""The TPU port over Compute Engine (``tpu_compute.ComputeTpu``, issue 38) against the local Compute
Engine: single-host slices as instances, multi-host slices as MIGs under a workload policy, as
``compute_tpu_gateway`` builds it from settings."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from controller.adapters.google import compute_gateway, compute_tpu_gateway
from controller.adapters import tpu_compute
from controller.adapters.tpu_compute import SLICE_LABEL, ComputeTpu
from controller.core import errors, names
from controller.core.ports import NodeHealth, NodeState, QueuedState, StopReason, TpuNode, TpuRequest
from controller.service.config import Settings
from localcloud.compute import ComputeServer
from tests.wait import until

PROJECT = "tpu-compute-proj"
ZONE = "us-central1-c"
TPU = "tpu7x-standard-4t"


@pytest.fixture
def srv() -> Iterator[ComputeServer]:
    with ComputeServer(boot_delay=0.05, shutdown_budget=1.0) as s:
        yield s


@pytest.fixture
def gw(srv: ComputeServer) -> ComputeTpu:
    gateway = compute_tpu_gateway(Settings(project=PROJECT, compute_endpoint=srv.endpoint))
    gateway.operation_timeout = 30.0
    return gateway


def request(name: str, topology: str | None = None, *, job: str = "train", spot: bool = True,
            flex: bool = False) -> TpuRequest:
    return TpuRequest(
        project=PROJECT, zone=ZONE, name=name, accelerator_type=TPU, runtime_version="", spot=spot,
        labels={names.MANAGED_LABEL: "true", names.JOB_LABEL: job, names.ATTEMPT_LABEL: "1"},
        metadata={"startup-script": "true", "respawn-job": job}, service_account="default",
        scopes=("https://www.googleapis.com/auth/cloud-platform",), network="global/networks/default",
        subnetwork=None, external_ip=False, api="compute", topology=topology,
        hosts=1 if topology is None else 2, flex_start=flex, max_run_seconds=3600 if flex else None,
        boot_image="projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2404-amd64-tpu-tpu7x")


def rid() -> str:
    return str(uuid.uuid4())


def nodes(gw: ComputeTpu, job: str | None = None) -> dict[str, TpuNode]:
    listed = gw.list_nodes([PROJECT], [ZONE], job)
    assert listed.failed_projects == {} and listed.unreachable == []
    return {n.name: n for n in listed.nodes}


def node(gw: ComputeTpu, name: str) -> TpuNode | None:
    return nodes(gw).get(name)


def raw(srv: ComputeServer) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"transport": "rest", "credentials": AnonymousCredentials(),
                              "client_options": ClientOptions(api_endpoint=srv.endpoint)}
    return {"templates": compute_v1.InstanceTemplatesClient(**kwargs), "migs": compute_v1.InstanceGroupManagersClient(**kwargs),
            "policies": compute_v1.ResourcePoliciesClient(**kwargs), "instances": compute_v1.InstancesClient(**kwargs)}


def test_a_single_host_slice_is_one_instance_listed_as_a_node_and_never_as_a_vm(srv, gw):
    gw.create(request("one"), rid())
    vm = srv.instance("one")
    assert vm["labels"][SLICE_LABEL] == "one" and names.MANAGED_LABEL not in vm["labels"]
    assert vm["scheduling"]["provisioningModel"] == "SPOT" and vm["scheduling"]["instanceTerminationAction"] == "STOP"
    assert vm["scheduling"]["onHostMaintenance"] == "TERMINATE" and vm["machineType"].endswith(f"/machineTypes/{TPU}")
    found = until("one READY", lambda: (n := node(gw, "one")) and n.state == NodeState.READY and n)
    assert (found.api, found.workers, found.accelerator_type, found.spot, found.zone) == ("compute", 1, TPU, True, ZONE)
    assert found.labels[names.MANAGED_LABEL] == "true" and found.job == "train" and found.health == NodeHealth.HEALTHY
    assert found.id == vm["id"] and found.stop_reason is None and found.queued is None
    # The VM listing (respawn-managed) never takes a slice's host for a VM of its own.
    vms = compute_gateway(Settings(project=PROJECT, compute_endpoint=srv.endpoint)).list_managed([PROJECT])
    assert vms.instances == []
    srv.preempt("one")
    down = until("one TERMINATED", lambda: (n := node(gw, "one")) and n.state == NodeState.TERMINATED and n)
    assert down.stop_reason == StopReason.PREEMPTED
    assert down.as_instance().stop_reason == StopReason.PREEMPTED
    gw.delete(PROJECT, ZONE, "one")
    until("one gone", lambda: node(gw, "one") is None)
    with pytest.raises(errors.NotFound):
        gw.delete(PROJECT, ZONE, "one")


def test_a_multi_host_slice_is_a_mig_up_when_create_returns_and_broken_when_one_host_is_preempted(srv, gw):
    gw.create(request("big", "2x2x2"), rid())
    mig = srv.mig("big")
    assert mig["targetSize"] == 2 and mig["targetSizePolicy"]["mode"] == "INDIVIDUAL"  # BULK: flex-start only
    assert mig["instanceLifecyclePolicy"]["defaultActionOnFailure"] == "DO_NOTHING"
    assert mig["resourcePolicies"]["workloadPolicy"].endswith("/regions/us-central1/resourcePolicies/respawn-slice-2x2x2")
    hosts = sorted(n for n in srv.names() if n.startswith("big-w-"))
    assert len(hosts) == 2 and all(srv.instance(h)["status"] == "RUNNING" for h in hosts)  # up when create returned
    found = node(gw, "big")
    assert found is not None and found.state == NodeState.READY and found.workers == 2 and found.api == "compute"
    assert found.labels[names.MANAGED_LABEL] == "true" and found.labels[SLICE_LABEL] == "big" and found.spot
    assert found.id == mig["id"]
    srv.preempt(hosts[1])
    down = until("big TERMINATED", lambda: (n := node(gw, "big")) and n.state == NodeState.TERMINATED and n)
    assert down.stop_reason == StopReason.PREEMPTED
    srv.slow_operations(delete=1.0)
    gw.delete(PROJECT, ZONE, "big")
    assert node(gw, "big").state == NodeState.DELETING
    until("big gone", lambda: node(gw, "big") is None and not srv.names())
    assert "big" in srv.template_names()  # in use when the delete was asked: left for a later delete
    gw.delete(PROJECT, ZONE, "big")  # what is left of the slice: its template
    assert "big" not in srv.template_names()
    with pytest.raises(errors.NotFound):
        gw.delete(PROJECT, ZONE, "big")


def test_a_template_its_slice_outlived_is_listed_once_past_its_grace_so_that_it_is_deleted(srv, gw, monkeypatch):
    gw.create(request("left", "2x2x2"), rid())
    srv.slow_operations(delete=0.5)
    gw.delete(PROJECT, ZONE, "left")
    until("left gone", lambda: node(gw, "left") is None and not srv.names())
    assert "left" in srv.template_names() and node(gw, "left") is None, "young: may be a create under way"
    monkeypatch.setattr(tpu_compute, "TEMPLATE_GRACE_S", 0.0)
    found = node(gw, "left")
    assert found is not None and found.state == NodeState.TERMINATED and found.zone == ZONE
    assert found.stop_reason == StopReason.STOPPED and found.labels[names.JOB_LABEL] == "train"
    gw.delete(PROJECT, ZONE, "left")
    assert "left" not in srv.template_names() and node(gw, "left") is None


def test_hosts_whose_mig_is_gone_are_listed_as_their_slice_and_deleted_with_it(srv, gw):
    gw.create(request("orph", "2x2x2"), rid())
    hosts = sorted(n for n in srv.names() if n.startswith("orph-w-"))
    srv.abandon("orph")  # the MIG goes; its hosts stay, billing
    found = until("orph listed from its hosts", lambda: (n := node(gw, "orph")) and n.workers == 2 and n)
    assert found.state == NodeState.READY and found.api == "compute"
    gw.delete(PROJECT, ZONE, "orph")
    until("orph's hosts gone", lambda: not set(hosts) & srv.names())
    assert node(gw, "orph") is None


def test_a_second_slice_of_the_same_shape_shares_the_policy_and_a_retried_create_is_the_same_one(srv, gw):
    first = rid()
    gw.create(request("a1", "2x2x2"), first)
    gw.create(request("a1", "2x2x2"), first)  # a retry with the same request id
    gw.create(request("a1", "2x2x2"), rid())  # another pass: the MIG exists and is up: success
    gw.create(request("a2", "2x2x2"), rid())
    assert srv.mig_names() == {"a1", "a2"} and len(srv.names()) == 4
    policies = list(raw(srv)["policies"].list(project=PROJECT, region="us-central1"))
    assert [p.name for p in policies] == ["respawn-slice-2x2x2"]


@pytest.mark.parametrize("fault, error", [("stockout", errors.CapacityError), ("quota", errors.QuotaError)])
def test_a_slice_without_room_raises_as_an_insert_would_and_leaves_nothing_trying(srv, gw, fault, error):
    getattr(srv, fault)(ZONE)
    with pytest.raises(error):
        gw.create(request("full", "2x2x2"), rid())
    assert srv.mig_names() == set() and "full" not in srv.template_names() and srv.names() == set()
    with pytest.raises(error):
        gw.create(request("solo"), rid())
    assert srv.names() == set()


def test_a_slice_still_coming_up_at_the_wait_is_pending_and_the_next_create_reads_it(srv, gw):
    srv.hold_operations(True)
    with pytest.raises(errors.OperationPending):
        gw.create(request("slow", "2x2x2"), rid(), wait=0.5)
    assert until("listed CREATING", lambda: (n := node(gw, "slow")) and n.state == NodeState.CREATING)
    srv.hold_operations(False)
    gw.create(request("slow", "2x2x2"), rid())
    assert node(gw, "slow").state == NodeState.READY


def test_a_flex_start_slice_waiting_for_capacity_reads_as_queued(srv, gw):
    srv.stockout(ZONE)
    gw.create(request("flex", "2x2x2", spot=False, flex=True), rid())
    waiting = until("flex hosts PENDING", lambda: (n := node(gw, "flex")) and n.queued and n)
    assert waiting.queued == QueuedState.WAITING_FOR_RESOURCES and waiting.state == NodeState.CREATING
    assert waiting.as_instance().status.value == "PENDING"
    srv.stockout(ZONE, on=False)
    until("flex READY", lambda: node(gw, "flex").state == NodeState.READY)


def test_only_slices_of_respawn_are_listed_or_deleted_and_a_job_lists_its_own(srv, gw):
    c = raw(srv)
    props = compute_v1.InstanceProperties(
        machine_type=TPU, labels={"team": "theirs"},
        scheduling=compute_v1.Scheduling(provisioning_model="STANDARD", on_host_maintenance="TERMINATE",
                                         automatic_restart=False),
        disks=[compute_v1.AttachedDisk(boot=True, initialize_params=compute_v1.AttachedDiskInitializeParams(
            source_image="projects/debian-cloud/global/images/family/debian-12"))],
        network_interfaces=[compute_v1.NetworkInterface(network="global/networks/default")])
    c["templates"].insert(project=PROJECT, instance_template_resource=compute_v1.InstanceTemplate(
        name="theirs", properties=props))
    c["policies"].insert(project=PROJECT, region="us-central1", resource_policy_resource=compute_v1.ResourcePolicy(
        name="theirs", workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(type_="HIGH_THROUGHPUT",
                                                                              accelerator_topology="2x2x2")))
    c["migs"].insert(project=PROJECT, zone=ZONE, instance_group_manager_resource=compute_v1.InstanceGroupManager(
        name="theirs", base_instance_name="theirs", target_size=2, instance_template="global/instanceTemplates/theirs",
        resource_policies=compute_v1.InstanceGroupManagerResourcePolicies(
            workload_policy="regions/us-central1/resourcePolicies/theirs")))
    c["instances"].insert(project=PROJECT, zone=ZONE, instance_resource=compute_v1.Instance(
        name="lone", machine_type=f"zones/{ZONE}/machineTypes/{TPU}", labels={"team": "theirs"},
        scheduling=props.scheduling, disks=props.disks, network_interfaces=props.network_interfaces))
    gw.create(request("mine", job="train"), rid())
    gw.create(request("yours", "2x2x2", job="eval"), rid())
    until("their hosts up", lambda: len(srv.names()) == 6)
    assert set(nodes(gw)) == {"mine", "yours"}
    assert set(nodes(gw, "eval")) == {"yours"} and set(nodes(gw, "train")) == {"mine"}
    for name in ("theirs", "lone"):
        with pytest.raises(errors.NotFound):
            gw.delete(PROJECT, ZONE, name)
    assert "theirs" in srv.mig_names() and "lone" in srv.names() and "theirs" in srv.template_names()
    with pytest.raises(errors.RequestError):
        gw.list_nodes([PROJECT], [ZONE], 'x" OR labels.a = "b')


def test_an_instance_that_only_carries_a_slices_label_is_none_of_its_hosts(srv, gw):
    """Anyone may label an instance ``respawn-slice: <ours>``: it never reads as a host of the slice (a
    stranger going down must not break a healthy slice), nor lends it its labels, nor goes with it."""
    gw.create(request("stray-1", "2x2x2"), rid())
    c = raw(srv)
    c["instances"].insert(project=PROJECT, zone=ZONE, instance_resource=compute_v1.Instance(
        name="someone", machine_type=f"zones/{ZONE}/machineTypes/e2-small",
        labels={SLICE_LABEL: "stray-1", names.JOB_LABEL: "train"},
        disks=[compute_v1.AttachedDisk(boot=True, initialize_params=compute_v1.AttachedDiskInitializeParams(
            source_image="projects/debian-cloud/global/images/family/debian-12"))],
        network_interfaces=[compute_v1.NetworkInterface(network="global/networks/default")]))
    until("someone up", lambda: srv.instance("someone")["status"] == "RUNNING")
    srv.crash("someone")
    until("someone down", lambda: srv.instance("someone")["status"] == "TERMINATED")
    found = node(gw, "stray-1")
    assert found is not None and found.state == NodeState.READY and found.workers == 2
    assert found.labels[names.ATTEMPT_LABEL] == "1", "its own hosts' labels"
    gw.delete(PROJECT, ZONE, "stray-1")
    until("the slice gone", lambda: node(gw, "stray-1") is None)
    assert "someone" in srv.names()


def test_a_project_that_refuses_is_failed_and_the_others_are_listed(srv, gw):
    gw.create(request("kept"), rid())
    srv.fail_next("instances.aggregatedList", code=403, reason="forbidden", message="Required 'compute.instances.list'")
    listed = gw.list_nodes(["elsewhere", PROJECT], [ZONE])
    assert set(listed.failed_projects) == {"elsewhere"} and [n.name for n in listed.nodes] == ["kept"]


# -- gcloud on what respawn creates ------------------------------------------------------------------
def test_gcloud_lists_describes_and_deletes_the_slices_respawn_creates(srv, gw, tmp_path):
    """The issue's proof: what ``ComputeTpu`` creates (as the controller does) is what `gcloud compute
    instance-groups managed` and `gcloud compute instances` against the local cloud show and delete."""
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        pytest.skip("gcloud is not on PATH: the gcloud walk through respawn's slices was not run")
    (tmp_path / "token").write_text("local\n")
    env = {**os.environ, "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": f"{srv.endpoint}/compute/v1/",
           "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(tmp_path / "token"), "CLOUDSDK_CORE_PROJECT": PROJECT,
           "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}

    def run(*args: str) -> Any:
        done = subprocess.run([gcloud, "compute", *args, "--format=json"], env=env, capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"{args}: {done.stderr}"
        return json.loads(done.stdout or "null")

    gw.create(request("gbig", "2x2x2", job="gjob"), rid())
    gw.create(request("gsolo", job="gjob"), rid())
    until("both READY", lambda: {n.name: n.state for n in nodes(gw, "gjob").values()}
          == {"gbig": NodeState.READY, "gsolo": NodeState.READY})

    [listed] = [m for m in run("instance-groups", "managed", "list") if m["name"] == "gbig"]
    assert listed["zone"].endswith(f"/zones/{ZONE}") and listed["targetSize"] == 2
    mig = run("instance-groups", "managed", "describe", "gbig", f"--zone={ZONE}")
    assert mig["instanceTemplate"].endswith("/global/instanceTemplates/gbig") and mig["baseInstanceName"] == "gbig-w"
    assert mig["instanceLifecyclePolicy"]["defaultActionOnFailure"] == "DO_NOTHING"
    assert mig["targetSizePolicy"]["mode"] == "INDIVIDUAL"
    policy = mig["resourcePolicies"]["workloadPolicy"]
    assert policy.endswith("/regions/us-central1/resourcePolicies/respawn-slice-2x2x2")
    managed = run("instance-groups", "managed", "list-instances", "gbig", f"--zone={ZONE}")
    hosts = sorted(m["instance"].rsplit("/", 1)[-1] for m in managed)
    assert len(hosts) == 2 and all(h.startswith("gbig-w-") for h in hosts)
    assert all(m["instanceStatus"] == "RUNNING" for m in managed)

    instances = {i["name"]: i for i in run("instances", "list")}
    assert set(instances) == {"gsolo", *hosts}
    for name, i in instances.items():
        slice_name = "gsolo" if name == "gsolo" else "gbig"
        assert i["labels"] == {SLICE_LABEL: slice_name, names.JOB_LABEL: "gjob", names.ATTEMPT_LABEL: "1"}
        assert i["machineType"].endswith(f"/zones/{ZONE}/machineTypes/{TPU}") and i["zone"].endswith(f"/zones/{ZONE}")
        assert i["status"] == "RUNNING" and i["scheduling"]["provisioningModel"] == "SPOT"
    filtered = run("instances", "list", f"--filter=labels.{SLICE_LABEL}=gbig")
    assert sorted(i["name"] for i in filtered) == hosts
    solo = run("instances", "describe", "gsolo", f"--zone={ZONE}")
    assert solo["labels"][SLICE_LABEL] == "gsolo" and solo["id"] == nodes(gw)["gsolo"].id
    assert solo["machineType"].endswith(f"/machineTypes/{TPU}") and solo["zone"].endswith(f"/zones/{ZONE}")
    host = run("instances", "describe", hosts[0], f"--zone={ZONE}")
    created_by = {i["key"]: i["value"] for i in host["metadata"]["items"]}["created-by"]
    assert created_by.endswith(f"/zones/{ZONE}/instanceGroupManagers/gbig")

    run("instance-groups", "managed", "delete", "gbig", f"--zone={ZONE}", "--quiet")
    assert "gbig" not in srv.mig_names() and set(hosts).isdisjoint(srv.names())
    assert set(nodes(gw)) == {"gsolo"}
    run("instances", "delete", "gsolo", f"--zone={ZONE}", "--quiet")
    assert srv.names() == set() and nodes(gw) == {}
    gw.delete(PROJECT, ZONE, "gbig")  # the template gcloud left goes with respawn's next delete
    assert "gbig" not in srv.template_names()
    with pytest.raises(errors.NotFound):
        gw.delete(PROJECT, ZONE, "gbig")


def test_a_slice_a_host_of_which_is_gone_and_not_being_made_again_reads_broken_not_creating(srv, gw):
    """A host deleted by hand (or by its termination action: a Flex-start host at its run's end) from a
    MIG that repairs nothing: the MIG is making nothing, so the host is lost, not on its way."""
    gw.create(request("cut", "2x2x2"), rid())
    hosts = sorted(n for n in srv.names() if n.startswith("cut-w-"))
    raw(srv)["instances"].delete_unary(project=PROJECT, zone=ZONE, instance=hosts[1])
    until("the host gone", lambda: hosts[1] not in srv.names())
    mig = raw(srv)["migs"].get(project=PROJECT, zone=ZONE, instance_group_manager="cut")
    assert mig.current_actions.creating == 0 and mig.current_actions.recreating == 0
    found = node(gw, "cut")
    assert found is not None and found.state == NodeState.TERMINATED and found.workers == 2
    assert found.as_instance().status.down and found.stop_reason == StopReason.UNKNOWN
    raw(srv)["instances"].delete_unary(project=PROJECT, zone=ZONE, instance=hosts[0])
    until("every host gone", lambda: not srv.names())
    assert node(gw, "cut").state == NodeState.TERMINATED, "a stable MIG making nothing, with no host: all lost"
    gw.create(request("young", "2x2x2"), rid())  # one whose hosts are all up reads READY still
    assert node(gw, "young").state == NodeState.READY
