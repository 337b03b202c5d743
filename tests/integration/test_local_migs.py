"""TPU slices in the local Compute Engine (issue 38): TPU machine types in their zones, TPU VMs'
metadata, workload policies, instance templates and managed instance groups, driven with
google-cloud-compute's own clients (and gcloud, where it is installed) as the controller and a user
would drive Google's."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from localcloud.compute import ComputeServer
from localcloud.metadata import project_number
from tests.wait import until

PROJECT = "slice-proj"
ZONE = "us-central1-c"  # tpu7x-standard-4t's zone
REGION = "us-central1"
TPU = "tpu7x-standard-4t"
FLAVOR = {"Metadata-Flavor": "Google"}
TELL_HOST = 'echo "$GCE_METADATA_HOST" > md-host'
SAY_BYE = 'echo bye > bye'


@pytest.fixture
def srv() -> Iterator[ComputeServer]:
    with ComputeServer(boot_delay=0.05, shutdown_budget=3.0) as s:
        yield s


class Clients:
    def __init__(self, srv: ComputeServer) -> None:
        kwargs: dict[str, Any] = {"transport": "rest", "credentials": AnonymousCredentials(),
                                  "client_options": ClientOptions(api_endpoint=srv.endpoint)}
        self.instances = compute_v1.InstancesClient(**kwargs)
        self.templates = compute_v1.InstanceTemplatesClient(**kwargs)
        self.policies = compute_v1.ResourcePoliciesClient(**kwargs)
        self.migs = compute_v1.InstanceGroupManagersClient(**kwargs)
        self.machine_types = compute_v1.MachineTypesClient(**kwargs)
        self.zone_ops = compute_v1.ZoneOperationsClient(**kwargs)


@pytest.fixture
def gc(srv: ComputeServer) -> Clients:
    return Clients(srv)


def properties(*, model: str = "SPOT", action: str = "STOP", startup: str = TELL_HOST, shutdown: str = SAY_BYE,
               labels: dict[str, str] | None = None, maintenance: str = "TERMINATE") -> compute_v1.InstanceProperties:
    scheduling = compute_v1.Scheduling(provisioning_model=model, on_host_maintenance=maintenance,
                                       automatic_restart=False)
    if model == "SPOT":
        scheduling.instance_termination_action = action
    return compute_v1.InstanceProperties(
        machine_type=TPU, labels=labels or {"team": "ml"}, scheduling=scheduling,
        metadata=compute_v1.Metadata(items=[compute_v1.Items(key="startup-script", value=startup),
                                            compute_v1.Items(key="shutdown-script", value=shutdown)]),
        disks=[compute_v1.AttachedDisk(boot=True, auto_delete=True, initialize_params=compute_v1.AttachedDiskInitializeParams(
            source_image="projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2404-amd64-tpu-tpu7x"))],
        network_interfaces=[compute_v1.NetworkInterface(network="global/networks/default")],
        service_accounts=[compute_v1.ServiceAccount(email="default", scopes=["https://www.googleapis.com/auth/cloud-platform"])])


def policy(gc: Clients, name: str = "slice-2x2x2", topology: str = "2x2x2", kind: str = "HIGH_THROUGHPUT") -> None:
    gc.policies.insert(project=PROJECT, region=REGION, resource_policy_resource=compute_v1.ResourcePolicy(
        name=name, workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(type_=kind, accelerator_topology=topology)))


def template(gc: Clients, name: str = "tmpl", **kwargs: Any) -> None:
    gc.templates.insert(project=PROJECT, instance_template_resource=compute_v1.InstanceTemplate(
        name=name, properties=properties(**kwargs)))


def mig_body(name: str = "slice", size: int | None = 2, tmpl: str = "tmpl", workload: str | None = "slice-2x2x2",
             action: str = "DO_NOTHING", mode: str = "INDIVIDUAL") -> compute_v1.InstanceGroupManager:
    body = compute_v1.InstanceGroupManager(
        name=name, base_instance_name=f"{name}-w", instance_template=f"global/instanceTemplates/{tmpl}",
        instance_lifecycle_policy=compute_v1.InstanceGroupManagerInstanceLifecyclePolicy(default_action_on_failure=action),
        target_size_policy=compute_v1.InstanceGroupManagerTargetSizePolicy(mode=mode))
    if size is not None:
        body.target_size = size
    if workload:
        body.resource_policies = compute_v1.InstanceGroupManagerResourcePolicies(
            workload_policy=f"projects/{PROJECT}/regions/{REGION}/resourcePolicies/{workload}")
    return body


def make_mig(gc: Clients, body: compute_v1.InstanceGroupManager | None = None, request_id: str | None = None):
    request = compute_v1.InsertInstanceGroupManagerRequest(
        project=PROJECT, zone=ZONE, instance_group_manager_resource=body or mig_body())
    if request_id:
        request.request_id = request_id
    return gc.migs.insert_unary(request=request)


def managed(gc: Clients, name: str = "slice") -> list[compute_v1.ManagedInstance]:
    return list(gc.migs.list_managed_instances(project=PROJECT, zone=ZONE, instance_group_manager=name))


def stable(gc: Clients, name: str = "slice") -> list[compute_v1.ManagedInstance]:
    until(f"{name} stable", lambda: gc.migs.get(project=PROJECT, zone=ZONE, instance_group_manager=name).status.is_stable)
    return managed(gc, name)


def attributes(srv: ComputeServer, name: str) -> dict[str, str]:
    host = until(f"{name}'s metadata host", lambda: _text(srv.workdir_of(name) / "md-host"))
    got = requests.get(f"http://{host}/computeMetadata/v1/instance/attributes/?recursive=true", headers=FLAVOR,
                       timeout=10)
    got.raise_for_status()
    return got.json()


def _text(path: Path) -> str | None:
    return path.read_text().strip() or None if path.exists() else None


def tpu_env(text: str) -> dict[str, str]:
    return {k: v.strip("'") for k, v in (line.split(": ", 1) for line in text.splitlines())}


def instance_body(name: str, zone: str = ZONE, maintenance: str = "TERMINATE") -> compute_v1.Instance:
    props = properties(maintenance=maintenance)
    return compute_v1.Instance(name=name, machine_type=f"zones/{zone}/machineTypes/{TPU}", labels=props.labels,
                               scheduling=props.scheduling, metadata=props.metadata, disks=props.disks,
                               network_interfaces=props.network_interfaces, service_accounts=props.service_accounts)


# -- TPU machine types live in their zones -------------------------------------------------------------
def test_a_tpu_machine_type_exists_only_in_its_zones_as_inserts_and_machine_types_say(srv, gc):
    with pytest.raises(gexc.BadRequest, match=f"Machine type with name '{TPU}' does not exist in zone 'us-central1-a'"):
        gc.instances.insert_unary(project=PROJECT, zone="us-central1-a", instance_resource=instance_body("far", "us-central1-a"))
    assert "far" not in srv.names()
    assert gc.machine_types.get(project=PROJECT, zone=ZONE, machine_type=TPU).name == TPU
    with pytest.raises(gexc.NotFound):
        gc.machine_types.get(project=PROJECT, zone="us-central1-a", machine_type=TPU)
    assert TPU in {m.name for m in gc.machine_types.list(project=PROJECT, zone=ZONE)}
    listed_a = {m.name for m in gc.machine_types.list(project=PROJECT, zone="us-central1-a")}
    assert TPU not in listed_a and "e2-small" in listed_a and "ct5p-hightpu-4t" in listed_a
    # Any other name is a machine type everywhere but where the unknown fault says it is not.
    assert gc.machine_types.get(project=PROJECT, zone=ZONE, machine_type="n2-custom-8-32768").name == "n2-custom-8-32768"
    srv.unknown("machineType", "e2-small")
    with pytest.raises(gexc.NotFound):
        gc.machine_types.get(project=PROJECT, zone=ZONE, machine_type="e2-small")
    # A MIG of a TPU template in a zone without that type is refused the same way.
    policy(gc)
    template(gc)
    with pytest.raises(gexc.BadRequest, match="does not exist in zone 'us-central1-a'"):
        gc.migs.insert_unary(project=PROJECT, zone="us-central1-a", instance_group_manager_resource=mig_body())
    assert srv.mig_names() == set()


def test_a_tpu_vm_cannot_live_migrate_and_host_maintenance_terminates_it(srv, gc):
    with pytest.raises(gexc.BadRequest, match="scheduling.onHostMaintenance"):
        gc.instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=instance_body("mig", maintenance="MIGRATE"))
    body = instance_body("solo")
    body.scheduling = compute_v1.Scheduling(provisioning_model="STANDARD", on_host_maintenance="TERMINATE",
                                            automatic_restart=False)
    gc.instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=body)
    until("solo RUNNING", lambda: srv.instance("solo")["status"] == "RUNNING")
    gc.instances.simulate_maintenance_event_unary(project=PROJECT, zone=ZONE, instance="solo")
    until("solo TERMINATED", lambda: srv.instance("solo")["status"] == "TERMINATED")
    kinds = [op["operationType"] for op in srv.operations() if op.get("targetLink", "").endswith("/solo")]
    assert "compute.instances.terminateOnHostMaintenance" in kinds


def test_a_single_host_tpu_vm_serves_its_slice_in_its_metadata(srv, gc):
    gc.instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=instance_body("one"))
    got = attributes(srv, "one")
    assert got["accelerator-type"] == "tpu7x-4" and got["agent-worker-number"] == "0"
    assert got["worker-network-endpoints"] == "unknown:unknown:127.0.0.1"
    env = tpu_env(got["tpu-env"])
    assert env["WORKER_ID"] == "0" and env["TOPOLOGY"] == "2x2x1" and env["ACCELERATOR_TYPE"] == "tpu7x-4"
    assert env["ZONE"] == ZONE and env["NODE_ID"] == "one" and env["PREEMPTIBLE"] == "true"
    assert got["startup-script"] == TELL_HOST  # the instance's own attributes beside


# -- workload policies and templates ----------------------------------------------------------------
def test_workload_policies_are_regional_resources_with_a_validated_type(srv, gc):
    policy(gc)
    got = gc.policies.get(project=PROJECT, region=REGION, resource_policy="slice-2x2x2")
    assert got.workload_policy.type_ == "HIGH_THROUGHPUT" and got.workload_policy.accelerator_topology == "2x2x2"
    assert got.self_link.endswith(f"/projects/{PROJECT}/regions/{REGION}/resourcePolicies/slice-2x2x2")
    assert [p.name for p in gc.policies.list(project=PROJECT, region=REGION)] == ["slice-2x2x2"]
    with pytest.raises(gexc.Conflict):
        policy(gc)
    bad = requests.post(f"{srv.endpoint}/compute/v1/projects/{PROJECT}/regions/{REGION}/resourcePolicies",
                        json={"name": "bad", "workloadPolicy": {"type": "FASTEST", "acceleratorTopology": "2x2x2"}},
                        timeout=10)
    assert bad.status_code == 400 and "workload_policy.type" in bad.json()["error"]["message"]
    bad = requests.post(f"{srv.endpoint}/compute/v1/projects/{PROJECT}/regions/{REGION}/resourcePolicies",
                        json={"name": "bad", "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": 8}},
                        timeout=10)
    assert bad.status_code == 400 and "accelerator_topology" in bad.json()["error"]["message"]
    gc.policies.delete_unary(project=PROJECT, region=REGION, resource_policy="slice-2x2x2")
    with pytest.raises(gexc.NotFound):
        gc.policies.get(project=PROJECT, region=REGION, resource_policy="slice-2x2x2")


def test_instance_templates_are_global_and_take_a_bare_machine_type(srv, gc):
    template(gc, labels={"respawn-slice": "tmpl"})
    got = gc.templates.get(project=PROJECT, instance_template="tmpl")
    assert got.properties.machine_type == TPU and got.properties.scheduling.provisioning_model == "SPOT"
    assert got.properties.scheduling.instance_termination_action == "STOP"
    assert got.properties.labels["respawn-slice"] == "tmpl"
    assert [t.name for t in gc.templates.list(project=PROJECT)] == ["tmpl"]
    url = compute_v1.InstanceTemplate(name="url", properties=properties())
    url.properties.machine_type = f"zones/{ZONE}/machineTypes/{TPU}"
    with pytest.raises(gexc.BadRequest, match="properties.machineType"):
        gc.templates.insert(project=PROJECT, instance_template_resource=url)
    gc.templates.delete_unary(project=PROJECT, instance_template="tmpl")
    assert list(gc.templates.list(project=PROJECT)) == []


# -- managed instance groups --------------------------------------------------------------------------
def test_a_mig_makes_its_slice_from_the_template_and_each_host_knows_the_slice(srv, gc):
    policy(gc)
    template(gc, labels={"team": "ml", "respawn-slice": "slice"})
    op = make_mig(gc)
    assert op.operation_type == "insert" and op.target_link.endswith(f"/zones/{ZONE}/instanceGroupManagers/slice")
    hosts = stable(gc)
    assert [h.current_action for h in hosts] == ["NONE", "NONE"]
    assert [h.instance_status for h in hosts] == ["RUNNING", "RUNNING"]
    names = [h.name for h in hosts]
    assert all(re.fullmatch(r"slice-w-[a-z0-9]{4}", n) for n in names), names
    got = gc.migs.get(project=PROJECT, zone=ZONE, instance_group_manager="slice")
    assert got.target_size == 2 and got.current_actions.none == 2 and got.current_actions.creating == 0
    assert got.resource_policies.workload_policy.endswith(f"/regions/{REGION}/resourcePolicies/slice-2x2x2")
    assert got.instance_lifecycle_policy.default_action_on_failure == "DO_NOTHING"
    for worker, name in enumerate(names):
        vm = gc.instances.get(project=PROJECT, zone=ZONE, instance=name)
        assert vm.labels["respawn-slice"] == "slice" and vm.machine_type.endswith(f"/zones/{ZONE}/machineTypes/{TPU}")
        items = {i.key: i.value for i in vm.metadata.items}
        assert items["created-by"] == f"projects/{project_number(PROJECT)}/zones/{ZONE}/instanceGroupManagers/slice"
        md = attributes(srv, name)
        assert md["accelerator-type"] == "tpu7x-8" and md["agent-worker-number"] == str(worker)
        ips = [vm_ip(gc, n) for n in names]
        assert md["worker-network-endpoints"] == ",".join(f"unknown:unknown:{ip}" for ip in ips)
        env = tpu_env(md["tpu-env"])
        assert env["WORKER_ID"] == str(worker) and env["TOPOLOGY"] == "2x2x2" and env["NODE_ID"] == "slice"
    assert len(set(ips)) == 2
    # What a MIG uses cannot be deleted from under it.
    with pytest.raises(gexc.BadRequest, match="already being used by") as refused:
        gc.templates.delete_unary(project=PROJECT, instance_template="tmpl")
    assert refused.value.errors[0]["reason"] == "resourceInUseByAnotherResource"
    with pytest.raises(gexc.BadRequest, match="already being used by"):
        gc.policies.delete_unary(project=PROJECT, region=REGION, resource_policy="slice-2x2x2")
    # aggregatedList finds it, with the zones that hold none as warnings.
    found = {scope: listed.instance_group_managers for scope, listed in
             gc.migs.aggregated_list(project=PROJECT) if listed.instance_group_managers}
    assert [m.name for m in found[f"zones/{ZONE}"]] == ["slice"] and len(found) == 1
    assert [m.name for m in gc.migs.list(project=PROJECT, zone=ZONE)] == ["slice"]


def vm_ip(gc: Clients, name: str) -> str:
    return gc.instances.get(project=PROJECT, zone=ZONE, instance=name).network_interfaces[0].network_i_p


@pytest.mark.parametrize("body, field", [
    (mig_body(size=3), "resource.resourcePolicies.workloadPolicy"),  # 2x2x2 is 2 hosts of tpu7x-standard-4t
    (mig_body(size=None), "resource.targetSize"),
    (mig_body(workload=None), "resource.resourcePolicies.workloadPolicy"),  # a multi-host slice needs one
])
def test_a_mig_that_is_no_slice_of_its_template_is_refused_naming_the_field(srv, gc, body, field):
    policy(gc)
    template(gc)
    with pytest.raises(gexc.BadRequest, match=re.escape(field)):
        make_mig(gc, body)
    assert srv.mig_names() == set() and srv.names() == set()


def test_a_mig_needs_its_template_and_its_policy(srv, gc):
    with pytest.raises(gexc.NotFound, match="instanceTemplates/tmpl"):
        make_mig(gc)
    template(gc)
    with pytest.raises(gexc.NotFound, match="resourcePolicies/slice-2x2x2"):
        make_mig(gc)
    policy(gc)
    make_mig(gc)
    assert srv.mig_names() == {"slice"}


@pytest.mark.parametrize("fault, code", [("stockout", "ZONE_RESOURCE_POOL_EXHAUSTED"), ("quota", "QUOTA_EXCEEDED")])
def test_a_slice_mig_in_a_zone_without_room_makes_nothing_and_retries_until_there_is(srv, gc, fault, code):
    policy(gc)
    template(gc)
    getattr(srv, fault)(ZONE)
    make_mig(gc)
    waiting = until("the last attempt's errors", lambda: (m := managed(gc)) and all(
        h.last_attempt.errors.errors for h in m) and m)
    assert [h.current_action for h in waiting] == ["CREATING", "CREATING"]
    assert {e.code for h in waiting for e in h.last_attempt.errors.errors} == {code}
    assert srv.names() == set()  # a zone without room here makes none of the slice's VMs
    assert gc.migs.get(project=PROJECT, zone=ZONE, instance_group_manager="slice").current_actions.creating == 2
    time.sleep(0.3)
    assert srv.names() == set()
    getattr(srv, fault)(ZONE, on=False)
    hosts = stable(gc)
    assert [h.instance_status for h in hosts] == ["RUNNING", "RUNNING"]
    assert not any(h.last_attempt.errors.errors for h in hosts)


def test_deleting_a_mig_runs_every_hosts_shutdown_and_takes_delete_seconds(srv, gc):
    policy(gc)
    template(gc)
    make_mig(gc)
    names = [h.name for h in stable(gc)]
    for n in names:
        attributes(srv, n)  # booted: their startup scripts ran
    srv.slow_operations(delete=1.0)
    started = time.monotonic()
    op = gc.migs.delete_unary(project=PROJECT, zone=ZONE, instance_group_manager="slice")
    assert op.operation_type == "delete"
    deleting = gc.migs.get(project=PROJECT, zone=ZONE, instance_group_manager="slice")
    assert deleting.current_actions.deleting == 2 and not deleting.status.is_stable
    done = gc.zone_ops.wait(project=PROJECT, zone=ZONE, operation=op.name)
    assert done.status == compute_v1.Operation.Status.DONE and time.monotonic() - started >= 1.0
    with pytest.raises(gexc.NotFound):
        gc.migs.get(project=PROJECT, zone=ZONE, instance_group_manager="slice")
    assert srv.names() == set()
    assert all((srv.workdir_of(n) / "bye").exists() for n in names)  # each ran its shutdown script
    gc.templates.delete_unary(project=PROJECT, instance_template="tmpl")  # no longer in use
    gc.policies.delete_unary(project=PROJECT, region=REGION, resource_policy="slice-2x2x2")


def test_a_mig_insert_with_a_request_id_is_answered_again_with_its_operation(srv, gc):
    policy(gc)
    template(gc)
    rid = str(uuid.uuid4())
    first = make_mig(gc, request_id=rid)
    again = make_mig(gc, request_id=rid)
    assert again.name == first.name and srv.mig_names() == {"slice"}
    with pytest.raises(gexc.Conflict):
        make_mig(gc, request_id=str(uuid.uuid4()))


@pytest.mark.parametrize("termination, on_failure, outcome", [
    ("STOP", "DO_NOTHING", "stays TERMINATED"),
    ("DELETE", "DO_NOTHING", "is gone"),
    ("STOP", "REPAIR", "is recreated"),
])
def test_a_preempted_host_is_stopped_or_deleted_then_left_or_repaired(srv, gc, termination, on_failure, outcome):
    policy(gc)
    template(gc, action=termination)
    make_mig(gc, mig_body(action=on_failure))
    hosts = stable(gc)
    victim, first_id = hosts[1].name, hosts[1].id
    attributes(srv, victim)
    srv.preempt(victim)
    kinds = lambda: [op["operationType"] for op in srv.operations() if op.get("targetLink", "").endswith(f"/{victim}")]
    until("the preemption's record", lambda: "compute.instances.preempted" in kinds())
    if outcome == "stays TERMINATED":
        until("TERMINATED", lambda: srv.instance(victim)["status"] == "TERMINATED")
        time.sleep(0.4)
        assert srv.instance(victim)["status"] == "TERMINATED"
        assert [h.instance_status for h in managed(gc)] == ["RUNNING", "TERMINATED"]
    elif outcome == "is gone":
        until("deleted", lambda: victim not in srv.names())
        time.sleep(0.4)
        assert victim not in srv.names() and hosts[0].name in srv.names()
    else:
        until("recreated", lambda: (vm := _get(srv, victim)) and vm["id"] != str(first_id) and vm["status"] == "RUNNING")
        assert until("stable again", lambda: (m := managed(gc)) and all(h.current_action == "NONE" for h in m) and m)
        assert kinds().count("insert") == 2  # a fresh boot, its own insert
        assert attributes(srv, victim)["agent-worker-number"] == "1"


def _get(srv: ComputeServer, name: str) -> dict[str, Any] | None:
    try:
        return srv.instance(name)
    except KeyError:
        return None


# -- gcloud --------------------------------------------------------------------------------------------
def test_gcloud_makes_lists_describes_and_deletes_a_slice(srv, tmp_path):
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        pytest.skip("gcloud is not on PATH: the gcloud walk through a slice was not run")
    env = {**os.environ, "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": f"{srv.endpoint}/compute/v1/",
           "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(tmp_path / "token"), "CLOUDSDK_CORE_PROJECT": PROJECT,
           "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}
    (tmp_path / "token").write_text("local\n")

    def run(*args: str) -> str:
        done = subprocess.run([gcloud, "compute", *args], env=env, capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"{args}: {done.stderr}"
        return done.stdout

    run("resource-policies", "create", "workload-policy", "wp", "--type=HIGH_THROUGHPUT",
        "--accelerator-topology=2x2x2", f"--region={REGION}")
    run("instance-templates", "create", "gt", f"--machine-type={TPU}", "--provisioning-model=SPOT",
        "--instance-termination-action=STOP", "--maintenance-policy=TERMINATE", "--labels=respawn-slice=gs",
        "--metadata=startup-script=true")
    run("instance-groups", "managed", "create", "gs", f"--zone={ZONE}", "--size=2", "--template=gt",
        f"--workload-policy=projects/{PROJECT}/regions/{REGION}/resourcePolicies/wp",
        "--default-action-on-vm-failure=do-nothing")
    until("the slice stable", lambda: srv.mig("gs")["status"]["isStable"])
    assert "gs" in run("instance-groups", "managed", "list", "--format=value(name)").split()
    described = run("instance-groups", "managed", "describe", "gs", f"--zone={ZONE}", "--format=json")
    assert '"targetSize": 2' in described and "DO_NOTHING" in described
    listed = run("instance-groups", "managed", "list-instances", "gs", f"--zone={ZONE}",
                 "--format=value(instance.basename(),instanceStatus)").splitlines()
    assert len(listed) == 2 and all(line.split()[1] == "RUNNING" for line in listed), listed
    names = [line.split()[0] for line in listed]
    assert set(run("instances", "list", "--format=value(name)").split()) == set(names)
    assert "respawn-slice" in run("instances", "describe", names[0], f"--zone={ZONE}", "--format=json")
    run("instance-groups", "managed", "delete", "gs", f"--zone={ZONE}", "--quiet")
    assert srv.mig_names() == set() and srv.names() == set()
    run("instance-templates", "delete", "gt", "--quiet")
    run("resource-policies", "delete", "wp", f"--region={REGION}", "--quiet")


def test_bulk_mode_is_taken_with_a_flex_start_template_and_refused_with_a_spot_one(srv, gc):
    """Google: "Bulk mode in MIGs is only supported with instance templates that specify either a
    reservation-bound or flex-start provisioning model" (Create a MIG that uses the bulk mode)."""
    policy(gc)
    template(gc, name="spot")
    with pytest.raises(gexc.BadRequest, match="targetSizePolicy.mode"):
        make_mig(gc, mig_body(tmpl="spot", mode="BULK"))
    gc.templates.insert(project=PROJECT, instance_template_resource=compute_v1.InstanceTemplate(
        name="flex", properties=flex_properties()))
    make_mig(gc, mig_body(name="bulk", tmpl="flex", mode="BULK"))
    assert gc.migs.get(project=PROJECT, zone=ZONE, instance_group_manager="bulk").target_size_policy.mode == "BULK"


def flex_properties() -> compute_v1.InstanceProperties:
    props = properties(model="FLEX_START")
    props.scheduling.instance_termination_action = "DELETE"
    props.scheduling.max_run_duration = compute_v1.Duration(seconds=3600)
    return props
