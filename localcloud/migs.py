"""TPU slices in the local Compute Engine: instance templates, workload policies, managed instance
groups (MIGs), machine types, and what a TPU VM's metadata server serves.

A mixin of ``localcloud.compute.ComputeServer`` (as ``localcloud.operations`` is), whose state it
reads (``_vms``, ``_ops``, ``_lock``, ``faults``, ``urls``) and whose VMs it makes: a MIG's VMs are
instances like any other (a ``localcloud.vm.VmProcess`` running the startup-script once RUNNING),
created from the template with the MIG's ``created-by`` metadata, named
``baseInstanceName-xxxx`` (a hyphen and four random characters, or sequential numbers for a
``-###`` base, as compute.v1.json's ``baseInstanceName`` describes).

Since TPU7x a TPU is a Compute Engine machine type (``controller.core.tpus``): a single-host slice
is one instance, a multi-host slice a zonal MIG whose workload policy (a regional resource policy,
``workloadPolicy {type: HIGH_THROUGHPUT, acceleratorTopology}``) names the slice's topology; hosts =
chips(topology) / chips a host ("Create a MIG with multi-host TPU slice",
docs.cloud.google.com/compute/docs/tpus/tpu-resources-in-compute-engine). A TPU machine type exists
only in its catalogue zones; elsewhere an insert (or a MIG of its template) is refused as Google
refuses a machine type the zone does not have.

Decisions where Google's behaviour is not written down, kept simple:

- a MIG insert's operation is DONE once the group exists; its VMs are made afterwards (the group's
  ``currentActions.creating``). With ``targetSizePolicy.mode`` BULK no VM is made until all can be:
  while the zone is stocked out or over quota (the ``stockout`` / ``quota`` faults) each managed
  instance stays CREATING with ``lastAttempt.errors`` ZONE_RESOURCE_POOL_EXHAUSTED (or
  QUOTA_EXCEEDED), and the MIG tries again every ``TICK`` seconds until the fault is lifted (the
  zone is one, so INDIVIDUAL mode decides the same);
- a VM of the group that goes down (preempted, host maintenance) is TERMINATED or deleted as its
  ``instanceTerminationAction`` says, as any VM; then ``defaultActionOnFailure`` REPAIR (the default)
  recreates it under the same name (a fresh boot: its own insert operation, RECREATING until
  RUNNING) and DO_NOTHING leaves it as it is;
- a delete is a zone operation: every VM runs its shutdown script and goes, side by side, each no
  sooner than ``faults.delete_seconds`` (the slow-deletes fault); the group is listed with
  ``currentActions.deleting`` until they are gone, then 404;
- template and policy inserts and deletes are operations DONE at once (global and regional); a
  template or a policy some MIG uses is refused deletion, 400 ``resourceInUseByAnotherResource``.
"""

from __future__ import annotations

import copy
import re
import secrets
import string
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from controller.core import tpus
from localcloud import gce
from localcloud.gce import ApiError
from localcloud.metadata import project_number
from localcloud.tpu_api import tpu_env_text, worker_endpoints

QUICK = 0.05  # seconds a MIG insert's operation runs
TICK = 0.1  # seconds between a MIG's looks at its VMs (repairs, capacity retries)
ACTIONS = ("abandoning", "creating", "creatingWithoutRetries", "deleting", "none", "recreating", "refreshing",
           "restarting", "resuming", "starting", "stopping", "suspending", "verifying")
_NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
_BASE = re.compile(r"[a-z](([-a-z0-9]{0,57})|([-a-z0-9]{0,51}-#{1,10}))")
_POLICY_URL = re.compile(r"(?:.*/)?(?:projects/(?P<project>[^/]+)/)?regions/(?P<region>[^/]+)/resourcePolicies/(?P<name>[^/]+)$")
_TEMPLATE_URL = re.compile(r"(?:.*/)?(?:projects/(?P<project>[^/]+)/)?(?:global/instanceTemplates/)?(?P<name>[^/]+)$")
# Machine types every zone has here (besides the TPU ones, in their zones), listed by machineTypes.list;
# machineTypes.get answers for any other name too, as inserts take any (but ``unknown`` faults).
COMMON_TYPES = {"e2-small": (2, 2048), "e2-standard-4": (4, 16384), "n1-standard-4": (4, 15360),
                "n2-standard-8": (8, 32768), "g2-standard-8": (8, 32768), "a2-highgpu-1g": (12, 87040)}


@dataclass
class Member:
    """One managed instance: its name (kept through repairs), its worker number, and its VM once made."""

    name: str
    worker: int
    ip: str
    vm: Any = None  # localcloud.compute.Vm
    action: str = "CREATING"
    errors: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Mig:
    project: str
    zone: str
    resource: dict[str, Any]  # what does not change; currentActions and status are computed on each read
    template: str  # the template's name (global)
    policy: tuple[str, str] | None  # the workload policy: (region, name)
    topology: str | None
    members: list[Member]
    deleting: bool = False
    deletes: list[dict[str, Any]] = field(default_factory=list)  # delete operations waiting for it to go

    @property
    def name(self) -> str:
        return self.resource["name"]

    @property
    def repair(self) -> bool:
        return (self.resource.get("instanceLifecyclePolicy") or {}).get("defaultActionOnFailure", "REPAIR") != "DO_NOTHING"


class MigsApi:
    """The handlers of instanceTemplates, resourcePolicies, instanceGroupManagers, machineTypes and
    globalOperations, and the TPU attributes of a VM's metadata."""

    def _migs_init(self) -> None:
        self._templates: dict[tuple[str, str], dict[str, Any]] = {}  # (project, name)
        self._policies: dict[tuple[str, str, str], dict[str, Any]] = {}  # (project, region, name)
        self._migs: dict[tuple[str, str, str], Mig] = {}  # (project, zone, name)
        self._slices = 0  # loopback addresses handed to TPU hosts (127.x.y.z, reachable on this machine)

    # -- inspection (tests, the demo) -------------------------------------------------------------
    def mig(self, name: str) -> dict[str, Any]:
        with self._lock:
            found = [m for (_, _, n), m in self._migs.items() if n == name]
            if not found:
                raise KeyError(name)
            return copy.deepcopy(self._mig_resource(found[0]))

    def mig_names(self) -> set[str]:
        with self._lock:
            return {n for _, _, n in self._migs}

    def abandon(self, name: str) -> None:
        """What a person's ``abandonInstances`` of every host, then the MIG's delete, leave: the MIG
        gone, its VMs still running (and billing), no longer anyone's members."""
        with self._lock:
            key = next(k for k in self._migs if k[2] == name)
            mig = self._migs.pop(key)
            for m in mig.members:
                if (vm := self._live(mig, m)) is not None:
                    vm.group = None
            self._done.notify_all()

    def slice_hosts(self, node: str) -> list[Any]:
        """The VMs (``localcloud.compute.Vm``) of TPU slice ``node``: its MIG's, or its one instance."""
        with self._lock:
            return sorted((vm for vm in self._vms.values() if vm.group == node or vm.name == node
                           and tpus.is_tpu_machine(vm.resource["machineType"].rsplit("/", 1)[-1])),
                          key=lambda vm: vm.worker)

    def template_names(self) -> set[str]:
        with self._lock:
            return {n for _, n in self._templates}

    # -- machine types ------------------------------------------------------------------------------
    def _machine_exists(self, name: str, zone: str) -> bool:
        if ("machineType", name) in self.faults.unknown:
            return False
        machine = tpus.machine_of(name)
        return machine is None or zone in machine.zones

    def _machine_type(self, project: str, zone: str, name: str) -> dict[str, Any]:
        machine = tpus.machine_of(name)
        cpus, memory = (machine.chips * 45, machine.chips * 180 * 1024) if machine else COMMON_TYPES.get(name, (4, 16384))
        out: dict[str, Any] = {
            "kind": "compute#machineType", "id": str(project_number(name) % 10**7), "name": name,
            "description": f"{name} machine type", "guestCpus": cpus, "memoryMb": memory, "imageSpaceGb": 0,
            "maximumPersistentDisks": 128, "maximumPersistentDisksSizeGb": "263168", "isSharedCpu": False,
            "zone": zone, "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
            "selfLink": f"{self.urls.zone(project, zone)}/machineTypes/{name}", "architecture": "X86_64"}
        if machine:
            out["accelerators"] = [{"guestAcceleratorType": machine.generation, "guestAcceleratorCount": machine.chips}]
        return out

    def _machineTypes_get(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        zone, name = self._zone(p["zone"]), p["machineType"]
        with self._lock:
            if not self._machine_exists(name, zone):
                raise gce.not_found(f"projects/{p['project']}/zones/{zone}/machineTypes/{name}")
            return self._machine_type(p["project"], zone, name)

    def _machineTypes_list(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        zone = self._zone(p["zone"])
        with self._lock:
            names = sorted(set(COMMON_TYPES) | {m.name for m in tpus.MACHINES.values()})
            items = [self._machine_type(p["project"], zone, n) for n in names if self._machine_exists(n, zone)]
        page, token = gce.page(gce.filtered(items, q.get("filter")), q)
        out = {"kind": "compute#machineTypeList", "id": f"projects/{p['project']}/zones/{zone}/machineTypes",
               "items": page, "selfLink": f"{self.urls.zone(p['project'], zone)}/machineTypes"}
        return {**out, "nextPageToken": token} if token else out

    def _tpu_check(self, body: dict[str, Any], zone: str | None, at: str) -> None:
        """A TPU machine type only in its zones (``zone`` None: a template, checked where a MIG uses
        it); TPU VMs cannot live-migrate (onHostMaintenance TERMINATE)."""
        name = str(body.get("machineType", "")).rsplit("/", 1)[-1]
        if not tpus.is_tpu_machine(name):
            return
        if zone is not None and not self._machine_exists(name, zone):
            raise gce.unknown_machine_type(f"{at}.machineType", body.get("machineType", ""), zone)
        maintenance = (body.get("scheduling") or {}).get("onHostMaintenance", "MIGRATE")
        if maintenance != "TERMINATE":
            raise gce.invalid(f"{at}.scheduling.onHostMaintenance", maintenance,
                              "Instances with TPUs do not support live migration.")

    # -- operations of global and regional scope ----------------------------------------------------
    def _scope_op(self, kind: str, scope: str, key: str | None, target: str, target_id: str) -> dict[str, Any]:
        op = gce.operation(kind, scope, key or "scope", target, target_id, self._user)
        if key is None:
            op.pop("scope")
        gce.finish(op)
        self._ops[(scope, op["name"])] = op
        return op

    def _global(self, project: str) -> str:
        return f"{self.urls.base}projects/{project}/global"

    def _globalOperations_get(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            return self._op(self._global(p["project"]), p["operation"])

    def _globalOperations_wait(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        return self._wait(self._global(p["project"]), p["operation"])

    def _globalOperations_list(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        return self._list_ops(self._global(p["project"]), q)

    # -- instance templates -------------------------------------------------------------------------
    def _instanceTemplates_insert(self, p: dict[str, str], q: Any, body: dict[str, Any]) -> dict[str, Any]:
        project, name = p["project"], body.get("name", "")
        if not _NAME.fullmatch(name or ""):
            raise gce.invalid("resource.name", name, "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'")
        props = body.get("properties")
        if not props:
            raise ApiError(400, "Required field 'resource.properties' not specified", "required")
        machine = props.get("machineType", "")
        if "/" in machine:
            raise gce.invalid("resource.properties.machineType", machine,
                              "An instance template takes a machine type name, not a URL.")
        gce.properties_check(props, None, "resource.properties")
        self._tpu_check(props, None, "resource.properties")
        with self._lock:
            if replay := self._replay(project, q.get("requestId")):
                return replay
            if (project, name) in self._templates:
                raise ApiError(409, f"The resource 'projects/{project}/global/instanceTemplates/{name}' already exists",
                               "alreadyExists")
            link = f"{self._global(project)}/instanceTemplates/{name}"
            properties = copy.deepcopy(props)
            properties.setdefault("scheduling", {})
            properties.setdefault("labels", {})
            properties.setdefault("metadata", {"items": []})
            resource = {"kind": "compute#instanceTemplate", "id": gce.new_id(), "creationTimestamp": gce.now(),
                        "name": name, "description": body.get("description", ""), "properties": properties,
                        "selfLink": link}
            self._templates[(project, name)] = resource
            op = self._scope_op("insert", self._global(project), None, link, resource["id"])
            self._remember(project, q.get("requestId"), op)
            return op

    def _template(self, project: str, name: str) -> dict[str, Any]:
        found = self._templates.get((project, name))
        if found is None:
            raise gce.not_found(f"projects/{project}/global/instanceTemplates/{name}")
        return found

    def _instanceTemplates_get(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            return self._template(p["project"], p["instanceTemplate"])

    def _instanceTemplates_list(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        project = p["project"]
        with self._lock:
            items = [t for (pr, _), t in sorted(self._templates.items()) if pr == project]
        page, token = gce.page(gce.filtered(items, q.get("filter")), q)
        out = {"kind": "compute#instanceTemplateList", "id": f"projects/{project}/global/instanceTemplates",
               "items": page, "selfLink": f"{self._global(project)}/instanceTemplates"}
        return {**out, "nextPageToken": token} if token else out

    def _instanceTemplates_delete(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        project, name = p["project"], p["instanceTemplate"]
        with self._lock:
            if replay := self._replay(project, q.get("requestId")):
                return replay
            template = self._template(project, name)
            user = next((m for (pr, _, _), m in sorted(self._migs.items()) if pr == project and m.template == name), None)
            if user is not None:
                raise _in_use("instance_template", f"projects/{project}/global/instanceTemplates/{name}", user)
            del self._templates[(project, name)]
            op = self._scope_op("delete", self._global(project), None, template["selfLink"], template["id"])
            self._remember(project, q.get("requestId"), op)
            return op

    # -- resource policies (workload policies) ------------------------------------------------------
    def _region(self, project: str, region: str) -> str:
        if not any(gce.region_of(z) == region for z in self.zones):
            raise gce.not_found(f"projects/{project}/regions/{region}")
        return region

    def _resourcePolicies_insert(self, p: dict[str, str], q: Any, body: dict[str, Any]) -> dict[str, Any]:
        project, region, name = p["project"], self._region(p["project"], p["region"]), body.get("name", "")
        if not _NAME.fullmatch(name or ""):
            raise gce.invalid("resource.name", name, "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'")
        workload = body.get("workloadPolicy")
        if workload is not None and not workload.get("type"):
            raise ApiError(400, "Required field 'resource.workloadPolicy.type' not specified", "required")
        with self._lock:
            if replay := self._replay(project, q.get("requestId")):
                return replay
            if (project, region, name) in self._policies:
                raise ApiError(409, f"The resource 'projects/{project}/regions/{region}/resourcePolicies/{name}' "
                                    "already exists", "alreadyExists")
            scope = self.urls.region(project, region)
            resource = {**copy.deepcopy(body), "kind": "compute#resourcePolicy", "id": gce.new_id(),
                        "creationTimestamp": gce.now(), "region": scope, "status": "READY",
                        "selfLink": f"{scope}/resourcePolicies/{name}"}
            self._policies[(project, region, name)] = resource
            op = self._scope_op("insert", scope, "region", resource["selfLink"], resource["id"])
            self._remember(project, q.get("requestId"), op)
            return op

    def _policy(self, project: str, region: str, name: str) -> dict[str, Any]:
        found = self._policies.get((project, region, name))
        if found is None:
            raise gce.not_found(f"projects/{project}/regions/{region}/resourcePolicies/{name}")
        return found

    def _resourcePolicies_get(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            return self._policy(p["project"], self._region(p["project"], p["region"]), p["resourcePolicy"])

    def _resourcePolicies_list(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        project, region = p["project"], self._region(p["project"], p["region"])
        with self._lock:
            items = [r for (pr, rg, _), r in sorted(self._policies.items()) if pr == project and rg == region]
        page, token = gce.page(gce.filtered(items, q.get("filter")), q)
        out = {"kind": "compute#resourcePolicyList", "id": f"projects/{project}/regions/{region}/resourcePolicies",
               "items": page, "selfLink": f"{self.urls.region(project, region)}/resourcePolicies"}
        return {**out, "nextPageToken": token} if token else out

    def _resourcePolicies_delete(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        project, region, name = p["project"], self._region(p["project"], p["region"]), p["resourcePolicy"]
        with self._lock:
            if replay := self._replay(project, q.get("requestId")):
                return replay
            policy = self._policy(project, region, name)
            user = next((m for (pr, _, _), m in sorted(self._migs.items())
                         if pr == project and m.policy == (region, name)), None)
            if user is not None:
                raise _in_use("resource_policy", f"projects/{project}/regions/{region}/resourcePolicies/{name}", user)
            del self._policies[(project, region, name)]
            op = self._scope_op("delete", self.urls.region(project, region), "region",
                                policy["selfLink"], policy["id"])
            self._remember(project, q.get("requestId"), op)
            return op

    # -- managed instance groups --------------------------------------------------------------------
    def _instanceGroupManagers_insert(self, p: dict[str, str], q: Any, body: dict[str, Any]) -> dict[str, Any]:
        project, zone = p["project"], self._zone(p["zone"])
        name = body.get("name", "")
        if not _NAME.fullmatch(name or ""):
            raise gce.invalid("resource.name", name, "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'")
        # Absent (gcloud sends none without --base-instance-name): "the prefix of instance group name"
        # (gcloud's help for the flag), cut to the field's 58 characters.
        base = body.get("baseInstanceName") or name[:58].rstrip("-")
        if not _BASE.fullmatch(base or ""):
            raise gce.invalid("resource.baseInstanceName", base, "Must be a match of regex "
                              "'[a-z](([-a-z0-9]{0,57})|([-a-z0-9]{0,51}-#{1,10}(\\\\[[0-9]{1,10}\\\\])?))'")
        if body.get("targetSize") is None:
            raise ApiError(400, "Required field 'resource.targetSize' not specified", "required")
        size = int(body["targetSize"])
        if size < 0:
            raise gce.invalid("resource.targetSize", size, "Target size must be non-negative.")
        ref = body.get("instanceTemplate") or next((v.get("instanceTemplate") for v in body.get("versions") or []
                                                    if v.get("instanceTemplate")), "")
        if not ref:
            raise ApiError(400, "Required field 'resource.instanceTemplate' not specified", "required")
        found = _TEMPLATE_URL.match(ref)
        template_name = found.group("name") if found else ref
        with self._lock:
            if replay := self._replay(project, q.get("requestId")):
                return replay
            if (project, zone, name) in self._migs:
                raise ApiError(409, f"The resource 'projects/{project}/zones/{zone}/instanceGroupManagers/{name}' "
                                    "already exists", "alreadyExists")
            template = self._template(project, template_name)
            props = template["properties"]
            machine_name = props["machineType"]
            if not self._machine_exists(machine_name, zone):
                raise gce.unknown_machine_type("resource.instanceTemplate", machine_name, zone)
            policy, topology = self._workload(project, zone, body, machine_name, size)
            mode = (body.get("targetSizePolicy") or {}).get("mode", "INDIVIDUAL")
            if mode == "BULK" and _model(props) not in ("FLEX_START", "RESERVATION_BOUND"):
                # "Bulk mode in MIGs is only supported with instance templates that specify either a
                # reservation-bound or flex-start provisioning model" (Create a MIG that uses the bulk mode).
                raise gce.invalid("resource.targetSizePolicy.mode", mode, "Bulk mode is only supported with instance "
                                  "templates that specify a reservation-bound or flex-start provisioning model.")
            scope = self.urls.zone(project, zone)
            link = f"{scope}/instanceGroupManagers/{name}"
            lifecycle = {"defaultActionOnFailure": "REPAIR", "forceUpdateOnRepair": "NO",
                         **(body.get("instanceLifecyclePolicy") or {})}
            resource = {
                "kind": "compute#instanceGroupManager", "id": gce.new_id(), "creationTimestamp": gce.now(),
                "name": name, "description": body.get("description", ""), "zone": scope,
                "instanceTemplate": template["selfLink"],
                "versions": [{"instanceTemplate": template["selfLink"], "targetSize": {"calculated": size}}],
                "instanceGroup": f"{scope}/instanceGroups/{name}", "baseInstanceName": base,
                "fingerprint": gce.metadata_fingerprint([{"key": name}]), "targetSize": size,
                "targetStoppedSize": 0, "targetSuspendedSize": 0, "selfLink": link,
                "instanceLifecyclePolicy": lifecycle,
                "targetSizePolicy": {"mode": "INDIVIDUAL", **(body.get("targetSizePolicy") or {})},
                "updatePolicy": {"type": "OPPORTUNISTIC", "minimalAction": "REPLACE", "maxSurge": {"fixed": 0},
                                 "maxUnavailable": {"fixed": 1}, "replacementMethod": "SUBSTITUTE"},
                "listManagedInstancesResults": "PAGELESS",
            }
            if policy is not None:
                resource["resourcePolicies"] = {
                    "workloadPolicy": f"{self.urls.region(project, policy[0])}/resourcePolicies/{policy[1]}"}
            members = [Member(n, i, self._loopback()) for i, n in enumerate(_member_names(base, size))]
            mig = Mig(project, zone, resource, template_name, policy, topology, members)
            self._migs[(project, zone, name)] = mig
            op = gce.operation("insert", scope, "zone", link, resource["id"], self._user)
            op.update(status="RUNNING", startTime=gce.now())
            self._ops[(scope, op["name"])] = op
            self._remember(project, q.get("requestId"), op)
        self._later(QUICK, self._finish_op, op)
        self._later(0, self._mig_tick, (project, zone, name))
        return op

    def _workload(self, project: str, zone: str, body: dict[str, Any], machine_name: str,
                  size: int) -> tuple[tuple[str, str] | None, str | None]:
        """The MIG's workload policy (region, name) and its topology, checked against the template's
        machine type and the target size: a slice of ``size`` hosts of that type."""
        at = "resource.resourcePolicies.workloadPolicy"
        ref = (body.get("resourcePolicies") or {}).get("workloadPolicy")
        machine = tpus.machine_of(machine_name)
        if not ref:
            if machine is not None and size > 1:
                raise gce.invalid(at, "", f"A multi-host slice of {machine_name} needs a workload policy naming its "
                                          "accelerator topology.")
            return None, None
        found = _POLICY_URL.match(ref)
        if not found:
            raise gce.invalid(at, ref, "Must be a URL of a resource policy.")
        region, name = found.group("region"), found.group("name")
        if (found.group("project") or project) != project:
            raise gce.invalid(at, ref, "The workload policy must be in the project of the managed instance group.")
        if region != gce.region_of(zone):
            raise gce.invalid(at, ref, f"The workload policy must be in region {gce.region_of(zone)}, the MIG's.")
        policy = self._policy(project, region, name)
        workload = policy.get("workloadPolicy")
        if workload is None:
            raise gce.invalid(at, ref, "The resource policy is not a workload policy.")
        topology = workload.get("acceleratorTopology")
        if topology is None:
            return (region, name), None
        if machine is None:
            raise gce.invalid(at, ref, f"An accelerator topology needs a TPU machine type; the template's is "
                                       f"{machine_name}.")
        problem = tpus.topology_problem(machine, topology)
        if problem:
            raise gce.invalid(at, ref, f"Accelerator topology {topology}: {problem}.")
        if machine.hosts(topology) != size:
            raise gce.invalid(at, ref, f"Accelerator topology {topology} of {machine_name} is a slice of "
                                       f"{machine.hosts(topology)} VMs; resource.targetSize is {size}.")
        return (region, name), topology

    def _loopback(self) -> str:
        self._slices += 1
        return f"127.{100 + (self._slices // 65536) % 100}.{(self._slices // 256) % 256}.{self._slices % 256}"

    def _mig(self, project: str, zone: str, name: str) -> Mig:
        self._zone(zone)
        mig = self._migs.get((project, zone, name))
        if mig is None:
            raise gce.not_found(f"projects/{project}/zones/{zone}/instanceGroupManagers/{name}")
        return mig

    def _live(self, mig: Mig, member: Member) -> Any:
        """The member's VM while it is the one the server holds under that name, else None."""
        vm = member.vm
        return vm if vm is not None and self._vms.get((mig.project, mig.zone, member.name)) is vm else None

    def _mig_resource(self, mig: Mig) -> dict[str, Any]:
        counts = dict.fromkeys(ACTIONS, 0)
        for m in mig.members:
            key = m.action.lower()
            counts[key] = counts.get(key, 0) + 1
        stable = not mig.deleting and all(m.action == "NONE" for m in mig.members)
        status: dict[str, Any] = {"isStable": stable, "versionTarget": {"isReached": stable},
                                  "stateful": {"hasStatefulConfig": False,
                                               "perInstanceConfigs": {"allEffective": True}},
                                  "allInstancesConfig": {"effective": True}}
        if mig.topology:
            status["appliedAcceleratorTopologies"] = [{
                "acceleratorTopology": mig.topology,
                "state": "ACTIVATED" if stable else "ACTIVATING"}]
        return {**mig.resource, "currentActions": counts, "status": status}

    def _instanceGroupManagers_get(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            return self._mig_resource(self._mig(p["project"], p["zone"], p["instanceGroupManager"]))

    def _instanceGroupManagers_list(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        project, zone = p["project"], self._zone(p["zone"])
        with self._lock:
            items = [self._mig_resource(m) for (pr, z, _), m in sorted(self._migs.items()) if pr == project and z == zone]
        page, token = gce.page(gce.filtered(items, q.get("filter")), q)
        out = {"kind": "compute#instanceGroupManagerList",
               "id": f"projects/{project}/zones/{zone}/instanceGroupManagers",
               "items": page, "selfLink": f"{self.urls.zone(project, zone)}/instanceGroupManagers"}
        return {**out, "nextPageToken": token} if token else out

    def _instanceGroupManagers_aggregatedList(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        project = p["project"]
        predicate = gce.compile_list_filter(q.get("filter"))
        with self._lock:
            migs = [(m.zone, self._mig_resource(m)) for (pr, _, _), m in sorted(self._migs.items()) if pr == project]
            unreachable = sorted(self.faults.unreachable)
        entries: list[tuple[str, Any]] = []
        for zone in sorted(set(self.zones) | {z for z, _ in migs}):
            if zone in unreachable:
                continue
            found = [r for z, r in migs if z == zone and predicate(r)]
            entries += [(zone, r) for r in found] if found else [(zone, None)]
        paged, token = gce.page(entries, q)
        items: dict[str, Any] = {}
        for zone, resource in paged:
            if resource is not None:
                items.setdefault(f"zones/{zone}", {"instanceGroupManagers": []})["instanceGroupManagers"].append(resource)
            else:
                items[f"zones/{zone}"] = {"warning": {
                    "code": "NO_RESULTS_ON_PAGE", "message": f"There are no results for scope 'zones/{zone}' on this page.",
                    "data": [{"key": "scope", "value": f"zones/{zone}"}]}}
        out: dict[str, Any] = {"kind": "compute#instanceGroupManagerAggregatedList",
                               "id": f"projects/{project}/aggregated/instanceGroupManagers", "items": items,
                               "selfLink": f"{self.urls.base}projects/{project}/aggregated/instanceGroupManagers"}
        if unreachable:
            out["unreachables"] = [f"zones/{z}" for z in unreachable]
        return {**out, "nextPageToken": token} if token else out

    def _instance_group(self, mig: Mig) -> dict[str, Any]:
        """The unmanaged view of a MIG's VMs (``instanceGroups``), which gcloud's listing reads for the size."""
        scope = self.urls.zone(mig.project, mig.zone)
        return {"kind": "compute#instanceGroup", "id": str(int(mig.resource["id"]) + 1),
                "creationTimestamp": mig.resource["creationTimestamp"], "name": mig.name, "zone": scope,
                "size": sum(self._live(mig, m) is not None for m in mig.members),
                "fingerprint": mig.resource["fingerprint"], "selfLink": f"{scope}/instanceGroups/{mig.name}",
                "network": f"{self.urls.base}projects/{mig.project}/global/networks/default"}

    def _instanceGroups_get(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            mig = self._migs.get((p["project"], self._zone(p["zone"]), p["instanceGroup"]))
            if mig is None:
                raise gce.not_found(f"projects/{p['project']}/zones/{p['zone']}/instanceGroups/{p['instanceGroup']}")
            return self._instance_group(mig)

    def _instanceGroups_list(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        project, zone = p["project"], self._zone(p["zone"])
        with self._lock:
            items = [self._instance_group(m) for (pr, z, _), m in sorted(self._migs.items()) if pr == project and z == zone]
        page, token = gce.page(gce.filtered(items, q.get("filter")), q)
        out = {"kind": "compute#instanceGroupList", "id": f"projects/{project}/zones/{zone}/instanceGroups",
               "items": page, "selfLink": f"{self.urls.zone(project, zone)}/instanceGroups"}
        return {**out, "nextPageToken": token} if token else out

    def _autoscalers_list(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        """No autoscaler is ever made here (a slice has a fixed size); gcloud's MIG listing asks."""
        project, zone = p["project"], self._zone(p["zone"])
        return {"kind": "compute#autoscalerList", "id": f"projects/{project}/zones/{zone}/autoscalers", "items": [],
                "selfLink": f"{self.urls.zone(project, zone)}/autoscalers"}

    def _instanceGroupManagers_listManagedInstances(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            mig = self._mig(p["project"], p["zone"], p["instanceGroupManager"])
            listed = []
            for m in mig.members:
                entry: dict[str, Any] = {"instance": self.urls.instance(mig.project, mig.zone, m.name), "name": m.name,
                                         "currentAction": m.action, "targetStatus": "RUNNING"}
                vm = self._live(mig, m)
                if vm is not None:
                    entry.update(id=vm.resource["id"], instanceStatus=vm.resource["status"])
                if m.errors:
                    entry["lastAttempt"] = {"errors": {"errors": copy.deepcopy(m.errors)}}
                listed.append(entry)
        page, token = gce.page(listed, q)
        out: dict[str, Any] = {"managedInstances": page}
        return {**out, "nextPageToken": token} if token else out

    def _instanceGroupManagers_delete(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        project, zone, name = p["project"], p["zone"], p["instanceGroupManager"]
        with self._lock:
            if replay := self._replay(project, q.get("requestId")):
                return replay
            mig = self._mig(project, zone, name)
            scope = self.urls.zone(project, zone)
            op = gce.operation("delete", scope, "zone", mig.resource["selfLink"], mig.resource["id"], self._user)
            op.update(status="RUNNING", startTime=gce.now())
            self._ops[(scope, op["name"])] = op
            self._remember(project, q.get("requestId"), op)
            first = not mig.deleting
            mig.deleting = True
            vms = []
            for m in mig.members:
                m.action = "DELETING"
                vm = self._live(mig, m)
                if vm is not None and first:
                    vms.append(vm)
                    if vm.resource["status"] != "STOPPING":
                        self._set_status(vm, "STOPPING")
            mig.deletes.append(op)
        if not first:
            return op  # the first delete's threads finish this one too
        budget = 0 if q.get("noGracefulShutdown") == "true" else self.shutdown_budget
        not_before = time.monotonic() + self.faults.delete_seconds
        threads = [threading.Thread(target=self._stop_then, args=(vm, "DELETE", None, budget),
                                    kwargs={"not_before": not_before}, daemon=True) for vm in vms]
        for t in threads:
            t.start()
        threading.Thread(target=self._mig_gone, args=(mig, threads, not_before), daemon=True).start()
        return op

    def _mig_gone(self, mig: Mig, threads: list[threading.Thread], not_before: float) -> None:
        for t in threads:
            t.join()
        if self._closed.wait(max(0.0, not_before - time.monotonic())):
            return
        with self._lock:
            if self._migs.get((mig.project, mig.zone, mig.name)) is mig:
                del self._migs[(mig.project, mig.zone, mig.name)]
            for op in mig.deletes:
                gce.finish(op)
            self._done.notify_all()

    # -- what a MIG does by itself ------------------------------------------------------------------
    def _mig_tick(self, key: tuple[str, str, str]) -> None:
        with self._lock:
            mig = self._migs.get(key)
            if mig is None or mig.deleting:
                return
            self._mig_step(mig)
        self._later(TICK, self._mig_tick, key)

    def _mig_step(self, mig: Mig) -> None:
        """One look (under the lock): make what is missing when the zone has room, repair what is down
        (REPAIR), and mark what runs."""
        template = self._templates.get((mig.project, mig.template))
        if template is None:
            return
        props = template["properties"]
        for m in mig.members:
            vm = self._live(mig, m)
            if m.vm is not None and vm is None:  # gone: its create failed, or its termination action deleted it
                if m.action in ("CREATING", "RECREATING") or mig.repair:
                    m.vm = None
                    m.action = "RECREATING" if m.action == "RECREATING" or mig.repair and m.action == "NONE" \
                        else "CREATING"
                else:
                    m.action = "NONE"  # DO_NOTHING: left as it is
            elif vm is not None and vm.resource["status"] == "TERMINATED" and mig.repair:
                self._vms.pop((mig.project, mig.zone, m.name), None)  # the husk: recreated under its name
                m.vm, m.action = None, "RECREATING"
            elif vm is not None and vm.resource["status"] == "RUNNING" and m.action in ("CREATING", "RECREATING"):
                m.action, m.errors = "NONE", []
        need = [m for m in mig.members if m.vm is None and m.action in ("CREATING", "RECREATING")]
        if not need:
            return
        model = _model(props)
        code, error = None, None
        if model != "FLEX_START" and self._stocked(mig.zone, model):
            code, error = "ZONE_RESOURCE_POOL_EXHAUSTED", gce.stockout(mig.project, mig.zone)
        elif self._quota(mig.zone):
            code, error = "QUOTA_EXCEEDED", gce.quota(gce.region_of(mig.zone))
        if error is not None:  # BULK: none until all fit (one zone: INDIVIDUAL decides the same)
            for m in need:
                m.errors = [{"code": code, "message": error.message}]
            return
        created_by = f"projects/{project_number(mig.project)}/zones/{mig.zone}/instanceGroupManagers/{mig.name}"
        for m in need:
            body = copy.deepcopy(props)
            items = [i for i in (body.get("metadata") or {}).get("items") or [] if i.get("key") != "created-by"]
            body.update(name=m.name, machineType=f"zones/{mig.zone}/machineTypes/{props['machineType']}",
                        metadata={"items": items + [{"key": "created-by", "value": created_by}]})
            vm = self._create(mig.project, mig.zone, body)
            vm.group, vm.worker, vm.ip = mig.name, m.worker, m.ip
            for nic in vm.resource["networkInterfaces"][:1]:
                nic["networkIP"] = m.ip
            m.vm = vm
            op = self._zone_op(mig.project, mig.zone, "insert", vm)
            self._later(self.faults.insert_seconds, self._provision, [vm], op)

    # -- a TPU VM's metadata --------------------------------------------------------------------------
    def _tpu_attributes(self, vm: Any) -> dict[str, str]:
        """What a TPU VM's metadata server serves beside an instance's own attributes (under the lock)."""
        machine = tpus.machine_of(vm.resource["machineType"].rsplit("/", 1)[-1])
        if machine is None:
            return {}
        mig = self._migs.get((vm.project, vm.zone, vm.group)) if vm.group else None
        if mig is not None:
            topology, node, ips = mig.topology or machine.topologies[0], mig.name, [m.ip for m in mig.members]
        else:
            topology, node, ips = machine.topologies[0], vm.name, [vm.ip]
        accelerator = machine.accelerator(topology)
        spot = _model(vm.resource) == "SPOT"
        env = {"ACCELERATOR_TYPE": accelerator, "CONSUMER_PROJECT_ID": vm.project,
               "CONSUMER_PROJECT_NUMBER": str(project_number(vm.project)), "NODE_ID": node,
               "PREEMPTIBLE": "true" if spot else "false", "TOPOLOGY": topology, "TYPE": machine.generation,
               "UID": str(vm.resource["id"]), "WORKER_ID": str(vm.worker), "ZONE": vm.zone}
        return {"accelerator-type": accelerator, "agent-worker-number": str(vm.worker),
                "worker-network-endpoints": worker_endpoints(ips), "tpu-env": tpu_env_text(env)}


def _in_use(kind: str, path: str, mig: Mig) -> ApiError:
    user = f"projects/{mig.project}/zones/{mig.zone}/instanceGroupManagers/{mig.name}"
    return ApiError(400, f"The {kind} resource '{path}' is already being used by '{user}'",
                    "resourceInUseByAnotherResource")


def _member_names(base: str, size: int) -> list[str]:
    """Names as the MIG makes them: ``base-xxxx`` (four random [a-z0-9]), or ``vm-001`` for ``vm-###``."""
    if base.endswith("#"):
        width = len(base) - len(base.rstrip("#"))
        return [f"{base[:-width]}{i + 1:0{width}d}" for i in range(size)]
    alphabet, names = string.ascii_lowercase + string.digits, []
    while len(names) < size:
        name = f"{base}-{''.join(secrets.choice(alphabet) for _ in range(4))}"
        if name not in names:
            names.append(name)
    return names


def _model(body: dict[str, Any]) -> str:
    scheduling = body.get("scheduling") or {}
    return scheduling.get("provisioningModel") or ("SPOT" if scheduling.get("preemptible") else "STANDARD")
