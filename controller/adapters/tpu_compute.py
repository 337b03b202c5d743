"""The TpuGateway port for TPU slices in Compute Engine (TPU7x and later), on google-cloud-compute.

A single-host slice is one instance of a TPU machine type; a multi-host slice is a zonal managed
instance group (MIG) of ``hosts`` instances made from an instance template, under a workload policy
(a regional resource policy) naming the slice's accelerator topology ("Cloud TPU resources in
Compute Engine", docs.cloud.google.com/compute/docs/tpus/tpu-resources-in-compute-engine). Names:

- the policy ``respawn-slice-<topology>`` in the zone's region, shared by every slice of that shape
  (one that exists already is taken as it is);
- the template and the MIG under the slice's own name; the MIG's VMs ``<name>-w-xxxx``;
- every instance (and the template) labelled ``respawn-slice: <name>`` and never ``respawn-managed``:
  the VM listing (``compute.ComputeEngine``, which filters on ``respawn-managed``) must not take a
  slice's hosts for VMs of its own. A slice is told by ``respawn-slice``; the TpuNode listed for it
  carries ``respawn-managed: "true"`` as a Cloud TPU node does.

Decisions, each for a reason:

- ``defaultActionOnFailure`` DO_NOTHING: respawn replaces a slice whole. A MIG that recreates one
  host gives a fresh VM in a slice whose collective cannot resume; the down host is what tells the
  planner the slice is lost (state TERMINATED, with Compute's operations' cause).
- ``targetSizePolicy.mode`` BULK for a flex-start slice (all hosts at once or none); Google takes BULK only
  with flex-start or reservation-bound templates ("Create a MIG that uses the bulk mode"), so a Spot or
  standard slice is INDIVIDUAL. A MIG without room does not fail: it keeps trying, each managed instance CREATING with
  ``lastAttempt.errors`` (ZONE_RESOURCE_POOL_EXHAUSTED, QUOTA_EXCEEDED). ``create`` reads those, deletes
  the MIG (and its template) so that nothing keeps trying, and raises ``CapacityError`` / ``QuotaError``
  as an instance insert would, so the planner moves on as it does for a VM.
- Operations are waited for by this adapter on operations clients at the configured endpoint (see
  compute.py: ``ExtendedOperation.result()`` polls Google's host whatever the endpoint).
- Listings use the aggregated lists (every zone, one call a project): a slice left anywhere is found.
  A MIG counts as ours only when its template carries ``respawn-slice`` equal to the MIG's name (the
  templates are listed once a project); a MIG or instance without it is never listed nor deleted.
- ``delete`` does not wait: the MIG's delete runs every host's shutdown. Its template is deleted
  best effort right after (Compute refuses while the MIG still uses it); a later ``delete`` of the same
  name finds the MIG gone and deletes the template then.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import requests

from controller.adapters.compute import (_LIBRARY, RETRY, _done, _raise_for, instance_properties, stopped, translate,
                                        v1)
from controller.adapters.lean import lean
from controller.core import errors, names, tpus
from controller.core.ports import (InstanceStatus, NodeHealth, NodeState, QueuedState, StopReason, Stopped, TpuList,
                                   TpuNode, TpuRequest, slice_state)

SLICE_LABEL = "respawn-slice"
POLICY_PREFIX = "respawn-slice-"
_DOWN = frozenset({InstanceStatus.TERMINATED, InstanceStatus.STOPPED, InstanceStatus.SUSPENDED})
_CAPACITY = ("ZONE_RESOURCE_POOL_EXHAUSTED", "insufficientCapacity", "STOCKOUT")
_QUOTA = ("QUOTA_EXCEEDED", "quotaExceeded")
_POLL_FIRST, _POLL_MAX = 0.2, 3.0  # seconds between looks at a MIG being made
# A template of ours with no MIG and no host older than this is what a slice deleted whole left (its
# template was still in use when the MIG's delete was asked): listed, so that it is deleted too. A
# younger one may be a create between its template and its MIG, and is never listed.
TEMPLATE_GRACE_S = 600.0
_NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")  # Compute's own rule for a resource name
_TEMPLATE_ZONE = re.compile(r"respawn: TPU slice [-a-z0-9]+ in (?P<zone>[a-z]+-[a-z]+[0-9]+-[a-z])")


@dataclass
class Clients:
    """The google-cloud-compute clients this adapter uses, all at one endpoint."""

    instances: Any
    templates: Any
    policies: Any
    migs: Any
    zone_ops: Any
    region_ops: Any
    global_ops: Any


def clients(**kwargs: Any) -> Clients:
    """google-cloud-compute's clients, built with ``kwargs`` (the lean import: see lean.py)."""
    lean("google.cloud.compute_v1")
    from google.cloud.compute_v1.services.global_operations import GlobalOperationsClient
    from google.cloud.compute_v1.services.instance_group_managers import InstanceGroupManagersClient
    from google.cloud.compute_v1.services.instance_templates import InstanceTemplatesClient
    from google.cloud.compute_v1.services.instances import InstancesClient
    from google.cloud.compute_v1.services.region_operations import RegionOperationsClient
    from google.cloud.compute_v1.services.resource_policies import ResourcePoliciesClient
    from google.cloud.compute_v1.services.zone_operations import ZoneOperationsClient

    return Clients(InstancesClient(**kwargs), InstanceTemplatesClient(**kwargs), ResourcePoliciesClient(**kwargs),
                   InstanceGroupManagersClient(**kwargs), ZoneOperationsClient(**kwargs),
                   RegionOperationsClient(**kwargs), GlobalOperationsClient(**kwargs))


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def _step_id(request_id: str, step: str) -> str:
    """A request id of its own for each call of a create (the policy, the template, the MIG), derived
    from the create's: a retried create sends the same ones."""
    return str(uuid.uuid5(uuid.UUID(request_id), step))


class ComputeTpu:
    """The port over Compute Engine; the clients are built at the first call (``clients``)."""

    def __init__(self, factory: Callable[[], Clients], operation_timeout: float = 180.0) -> None:
        self._factory = factory
        self._clients: Clients | None = None
        self._lock = threading.Lock()
        self.operation_timeout = operation_timeout

    @property
    def c(self) -> Clients:
        with self._lock:
            if self._clients is None:
                self._clients = self._factory()
            return self._clients

    # -- create ---------------------------------------------------------------------------------
    def create(self, request: TpuRequest, request_id: str, wait: float | None = None) -> None:
        r = request
        if r.api != "compute":
            raise errors.RequestError(f"{r.name}: a {r.api!r} TPU is not Compute Engine's to create")
        machine = tpus.machine_of(r.accelerator_type)
        if machine is None:
            raise errors.RequestError(f"{r.accelerator_type} is not a TPU machine type this adapter knows")
        wait = self.operation_timeout if wait is None else wait
        deadline = time.monotonic() + wait
        if r.topology is None:
            self._create_instance(r, request_id, deadline, wait)
        else:
            self._create_slice(r, machine, request_id, deadline, wait)

    def _create_instance(self, r: TpuRequest, request_id: str, deadline: float, wait: float) -> None:
        compute_v1 = v1()
        body = compute_v1.Instance(name=r.name, **_properties(r, f"zones/{r.zone}/"))
        try:
            op = self.c.instances.insert_unary(request=compute_v1.InsertInstanceRequest(
                project=r.project, zone=r.zone, request_id=request_id, instance_resource=body), retry=RETRY)
        except _LIBRARY as e:
            error = translate(e, r.zone, creating=True)
            if not isinstance(error, errors.AlreadyExists):
                raise error from e
            self._instance_settled(r, deadline, wait)
            return
        op = self._wait_zone(r.project, r.zone, op, deadline)
        if not _done(op):
            raise errors.OperationPending(f"insert of {r.name} in {r.zone} still running after {wait:g}s "
                                          f"(operation {op.name}); its outcome is read on the next try")
        try:
            _raise_for(op, r.zone)
        except errors.AlreadyExists:
            return

    def _instance_settled(self, r: TpuRequest, deadline: float, wait: float) -> None:
        """An existing instance is success once it is past PROVISIONING and STAGING."""
        pause = _POLL_FIRST
        while True:
            try:
                vm = self.c.instances.get(project=r.project, zone=r.zone, instance=r.name, retry=RETRY)
            except _LIBRARY as e:
                error = translate(e, r.zone)
                if isinstance(error, errors.NotFound):  # its insert failed meanwhile (a late stockout)
                    raise errors.TransientError(f"{r.name} in {r.zone} vanished while being created; create it "
                                                "again") from e
                raise error from e
            if vm.status not in ("PROVISIONING", "STAGING"):
                return
            if (left := deadline - time.monotonic()) <= 0:
                raise errors.OperationPending(f"{r.name} in {r.zone} still {vm.status} after {wait:g}s")
            time.sleep(min(pause, left))
            pause = min(pause * 1.5, _POLL_MAX)

    def _create_slice(self, r: TpuRequest, machine: tpus.TpuMachine, request_id: str, deadline: float,
                      wait: float) -> None:
        compute_v1 = v1()
        assert r.topology is not None
        hosts = machine.hosts(r.topology)
        region = region_of(r.zone)
        policy = f"{POLICY_PREFIX}{r.topology}"
        # 1. The workload policy of this shape in the region (shared: one that exists is fine).
        self._ensure(lambda: self.c.policies.insert_unary(request=compute_v1.InsertResourcePolicyRequest(
            project=r.project, region=region, request_id=_step_id(request_id, "policy"),
            resource_policy_resource=compute_v1.ResourcePolicy(
                name=policy, description="respawn: the accelerator topology of its TPU slices",
                workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(
                    type_="HIGH_THROUGHPUT", accelerator_topology=r.topology))), retry=RETRY),
            lambda op: self._wait_region(r.project, region, op, deadline), r.zone, "workload policy", wait)
        # 2. The template, under the slice's name.
        self._ensure(lambda: self.c.templates.insert_unary(request=compute_v1.InsertInstanceTemplateRequest(
            project=r.project, request_id=_step_id(request_id, "template"),
            instance_template_resource=compute_v1.InstanceTemplate(
                # Its zone in words: a template outliving its MIG is listed in that zone (_leftover).
                name=r.name, description=f"respawn: TPU slice {r.name} in {r.zone}",
                properties=compute_v1.InstanceProperties(**_properties(r, "")))), retry=RETRY),
            lambda op: self._wait_global(r.project, op, deadline), r.zone, "instance template", wait)
        # 3. The MIG: all hosts or none, never repaired one by one.
        mig = compute_v1.InstanceGroupManager(
            name=r.name, base_instance_name=f"{r.name}-w", target_size=hosts,
            instance_template=f"projects/{r.project}/global/instanceTemplates/{r.name}",
            resource_policies=compute_v1.InstanceGroupManagerResourcePolicies(
                workload_policy=f"projects/{r.project}/regions/{region}/resourcePolicies/{policy}"),
            instance_lifecycle_policy=compute_v1.InstanceGroupManagerInstanceLifecyclePolicy(
                default_action_on_failure="DO_NOTHING"))
        if r.flex_start:  # all hosts at once or none; Google takes BULK with flex-start (or reservations) only
            mig.target_size_policy = compute_v1.InstanceGroupManagerTargetSizePolicy(mode="BULK")
        self._ensure(lambda: self.c.migs.insert_unary(request=compute_v1.InsertInstanceGroupManagerRequest(
            project=r.project, zone=r.zone, request_id=request_id, instance_group_manager_resource=mig),
            retry=RETRY), lambda op: self._wait_zone(r.project, r.zone, op, deadline), r.zone, "MIG", wait)
        # 4. Its hosts: up, or refused for want of room (then nothing is left to keep trying).
        pause = _POLL_FIRST
        while True:
            try:
                listed = list(self.c.migs.list_managed_instances(project=r.project, zone=r.zone,
                                                                 instance_group_manager=r.name, retry=RETRY))
            except _LIBRARY as e:
                raise translate(e, r.zone) from e
            refusal = _refusal(listed, r.zone)
            if refusal is not None:
                self._undo(r.project, r.zone, r.name)
                raise refusal
            if len(listed) >= hosts and all(_made(m, r.flex_start) for m in listed):
                return
            if (left := deadline - time.monotonic()) <= 0:
                raise errors.OperationPending(f"the {hosts} hosts of {r.name} in {r.zone} are not all up after "
                                              f"{wait:g}s; the next try reads them again")
            time.sleep(min(pause, left))
            pause = min(pause * 1.5, _POLL_MAX)

    def _ensure(self, insert: Callable[[], Any], waited: Callable[[Any], Any], zone: str, what: str,
                wait: float) -> None:
        """Insert one resource of a slice; one there already (409) is taken as it is."""
        try:
            op = insert()
        except _LIBRARY as e:
            error = translate(e, zone, creating=True)
            if isinstance(error, errors.AlreadyExists):
                return
            raise error from e
        op = waited(op)
        if not _done(op):
            raise errors.OperationPending(f"the insert of the {what} in {zone} still running after {wait:g}s "
                                          f"(operation {op.name})")
        try:
            _raise_for(op, zone)
        except errors.AlreadyExists:
            return

    def _undo(self, project: str, zone: str, name: str) -> None:
        """A MIG refused for want of room: deleted (and its template, once the MIG lets go), so that
        Compute stops trying for it."""
        try:
            op = self.c.migs.delete_unary(project=project, zone=zone, instance_group_manager=name, retry=RETRY)
            op = self._wait_zone(project, zone, op, time.monotonic() + self.operation_timeout)
        except _LIBRARY as e:
            error = translate(e, zone)
            if not isinstance(error, errors.NotFound):
                raise error from e
        self._drop_template(project, name)

    def _drop_template(self, project: str, name: str) -> bool:
        """Delete our template ``name``, best effort: False when it is not ours, not there, or still in use."""
        try:
            template = self.c.templates.get(project=project, instance_template=name, retry=RETRY)
            if template.properties.labels.get(SLICE_LABEL) != name:
                return False
            self.c.templates.delete_unary(project=project, instance_template=name, retry=RETRY)
            return True
        except _LIBRARY:
            return False  # in use (400 resourceInUseByAnotherResource), gone, or unreachable: a later delete

    # -- operations -----------------------------------------------------------------------------
    def _wait_zone(self, project: str, zone: str, op: Any, deadline: float) -> Any:
        return self._wait(op, lambda left: self.c.zone_ops.wait(project=project, zone=zone, operation=op.name,
                                                                retry=RETRY.with_timeout(left), timeout=left),
                          zone, deadline)

    def _wait_region(self, project: str, region: str, op: Any, deadline: float) -> Any:
        return self._wait(op, lambda left: self.c.region_ops.wait(project=project, region=region, operation=op.name,
                                                                  retry=RETRY.with_timeout(left), timeout=left),
                          region, deadline)

    def _wait_global(self, project: str, op: Any, deadline: float) -> Any:
        return self._wait(op, lambda left: self.c.global_ops.wait(project=project, operation=op.name,
                                                                  retry=RETRY.with_timeout(left), timeout=left),
                          "global", deadline)

    @staticmethod
    def _wait(op: Any, poll: Callable[[float], Any], where: str, deadline: float) -> Any:
        """The operation once DONE, or as it stands at ``deadline`` (``*Operations.wait`` answers when
        it is done or after about two minutes; the client-side timeout cuts it at ours)."""
        while not _done(op) and (left := deadline - time.monotonic()) > 0:
            try:
                op = poll(left)
            except requests.exceptions.Timeout:
                continue
            except _LIBRARY as e:
                raise translate(e, where) from e
        return op

    # -- listing --------------------------------------------------------------------------------
    def list_nodes(self, projects: Sequence[str], zones: Sequence[str], job: str | None = None) -> TpuList:
        """Every slice of these projects, wherever it is (``zones`` is not needed: aggregated lists)."""
        if job is not None and (problem := names.job_name_problem(job)):
            raise errors.RequestError(problem)  # never put into a filter expression
        nodes: list[TpuNode] = []
        unreachable: set[str] = set()
        failed: dict[str, str] = {}
        for project in dict.fromkeys(projects):
            try:
                found, blind = self._project(project, job)
            except _LIBRARY as e:  # one project's trouble blinds only its jobs
                failed[project] = str(translate(e, "*"))
                continue
            except errors.RespawnError as e:  # stopped's
                failed[project] = str(e)
                continue
            nodes += found
            unreachable |= blind
        return TpuList(nodes, sorted(unreachable), failed)

    def _project(self, project: str, job: str | None) -> tuple[list[TpuNode], set[str]]:
        compute_v1 = v1()
        expr = f"labels.{SLICE_LABEL}:*"
        if job is not None:
            expr = f'{expr} AND labels.{names.JOB_LABEL} = "{job}"'
        unreachable: set[str] = set()
        hosts: dict[tuple[str, str], list[Any]] = {}  # (zone, slice) -> instances
        pager = self.c.instances.aggregated_list(request=compute_v1.AggregatedListInstancesRequest(
            project=project, filter=expr), retry=RETRY)
        for page in pager.pages:
            unreachable |= {u.removeprefix("zones/") for u in page.unreachables}
            for scope, scoped in page.items.items():
                zone = scope.removeprefix("zones/")
                if scoped.warning and scoped.warning.code == "UNREACHABLE":
                    unreachable.add(zone)
                for i in scoped.instances:
                    hosts.setdefault((zone, i.labels[SLICE_LABEL]), []).append(i)
        templates = {t.name: t for t in self.c.templates.list(request=compute_v1.ListInstanceTemplatesRequest(
            project=project, filter=f"properties.labels.{SLICE_LABEL}:*"), retry=RETRY)
            if t.properties.labels.get(SLICE_LABEL) == t.name}
        migs: dict[tuple[str, str], Any] = {}
        pager = self.c.migs.aggregated_list(request=compute_v1.AggregatedListInstanceGroupManagersRequest(
            project=project), retry=RETRY)
        for page in pager.pages:
            unreachable |= {u.removeprefix("zones/") for u in page.unreachables}
            for scope, scoped in page.items.items():
                zone = scope.removeprefix("zones/")
                if scoped.warning and scoped.warning.code == "UNREACHABLE":
                    unreachable.add(zone)
                for m in scoped.instance_group_managers:
                    template = templates.get(m.instance_template.rsplit("/", 1)[-1])
                    if template is None or template.name != m.name:
                        continue  # not a slice of ours: never listed
                    if job is not None and template.properties.labels.get(names.JOB_LABEL) != job:
                        continue
                    migs[(zone, m.name)] = (m, template)
        nodes = []
        # A slice's hosts by name as well as by label: a MIG's are <base>-xxxx, a single host is the
        # slice's own name. Another instance carrying the label (anyone may write one) is none of
        # the slice's: it never reads as a host, never makes the slice read as broken, never goes with it.
        hosts = {(zone, name): kept for (zone, name), listed in hosts.items()
                 if (kept := [i for i in listed if _host_of(i.name, name)])}
        for (zone, name), (mig, template) in sorted(migs.items()):
            nodes.append(self._node(project, zone, name, hosts.pop((zone, name), []), mig, template))
        for (zone, name), listed in sorted(hosts.items()):
            # A single-host slice; or hosts whose MIG is gone (abandoned, or deleted by hand while they
            # stayed): still billing, so listed as their slice, to be judged and deleted like one.
            nodes.append(self._node(project, zone, name, listed, None, None))
        named = {n.name for n in nodes}
        for name, template in sorted(templates.items()):
            if name not in named and (job is None or template.properties.labels.get(names.JOB_LABEL) == job):
                if (node := _leftover(project, template)) is not None:
                    nodes.append(node)
        return nodes, unreachable

    def _node(self, project: str, zone: str, name: str, hosts: list[Any], mig: Any, template: Any) -> TpuNode:
        hosts = sorted(hosts, key=lambda i: i.name)
        statuses = [InstanceStatus.of(i.status) for i in hosts]
        if mig is not None:
            workers = int(mig.target_size)
            state = NodeState.DELETING if mig.current_actions.deleting else slice_state(statuses, workers)
            if state == NodeState.CREATING and _lost_hosts(mig, statuses, workers):
                state = NodeState.TERMINATED
            props = template.properties
            labels = dict(hosts[0].labels) if hosts else dict(props.labels)
            machine, model = props.machine_type.rsplit("/", 1)[-1], props.scheduling.provisioning_model
            created, ident = mig.creation_timestamp, str(mig.id)
        else:  # one instance (a single-host slice), or the hosts a MIG gone left
            vm = hosts[0]
            workers, state = len(hosts), slice_state(statuses, len(hosts))
            labels = dict(vm.labels)
            machine, model = vm.machine_type.rsplit("/", 1)[-1], vm.scheduling.provisioning_model
            created, ident = vm.creation_timestamp, str(vm.id)
        record: Stopped | None = None
        if state == NodeState.TERMINATED:
            down = next((i for i, s in zip(hosts, statuses) if s in _DOWN), None)
            # A host gone (no down one to ask Compute of): its cause is not on record here.
            record = stopped(self.c.zone_ops, project, zone, down.name) if down is not None else Stopped()
        queued = QueuedState.WAITING_FOR_RESOURCES if model == "FLEX_START" and InstanceStatus.PENDING in statuses \
            else None
        return TpuNode(project=project, zone=zone, name=name, state=state, health=NodeHealth.HEALTHY,
                       labels={**labels, names.MANAGED_LABEL: "true"}, created_at=datetime.fromisoformat(created),
                       accelerator_type=machine, spot=model == "SPOT", id=ident, workers=workers, queued=queued,
                       api="compute", stop_reason=record.reason if record else None,
                       stopped_at=record.at if record else None, host_ids={i.name: str(i.id) for i in hosts if i.id})

    # -- delete ---------------------------------------------------------------------------------
    def delete(self, project: str, zone: str, name: str) -> None:
        """The MIG ``name`` when it is a slice of ours (then its template, best effort), else the
        instance ``name`` when it carries ``respawn-slice``; NotFound when neither. Does not wait."""
        mig = self._get(lambda: self.c.migs.get(project=project, zone=zone, instance_group_manager=name,
                                                retry=RETRY), zone)
        if mig is not None:
            template = self._get(lambda: self.c.templates.get(
                project=project, instance_template=mig.instance_template.rsplit("/", 1)[-1], retry=RETRY), zone)
            if template is not None and template.name == name and \
                    template.properties.labels.get(SLICE_LABEL) == name:
                try:
                    op = self.c.migs.delete_unary(project=project, zone=zone, instance_group_manager=name, retry=RETRY)
                except _LIBRARY as e:
                    raise translate(e, zone) from e
                _raise_for(op, zone)
                self._drop_template(project, name)  # refused while the MIG still uses it: a later delete
                return
        vm = self._get(lambda: self.c.instances.get(project=project, zone=zone, instance=name, retry=RETRY), zone)
        if vm is not None and vm.labels.get(SLICE_LABEL) == name:
            try:
                op = self.c.instances.delete_unary(project=project, zone=zone, instance=name, retry=RETRY)
            except _LIBRARY as e:
                raise translate(e, zone) from e
            _raise_for(op, zone)
            return
        if mig is None and vm is None:
            # Hosts whose MIG is gone (abandoned, or left by a MIG deleted by hand) bill on: each goes.
            left = self._left_hosts(project, zone, name)
            for host in left:
                try:
                    _raise_for(self.c.instances.delete_unary(project=project, zone=zone, instance=host,
                                                             retry=RETRY), zone)
                except _LIBRARY as e:
                    if not isinstance(error := translate(e, zone), errors.NotFound):
                        raise error from e
            # The slice's MIG went before: its template, in use then, goes now.
            if self._drop_template(project, name) or left:
                return
        raise errors.NotFound(f"no TPU slice {name} of respawn's in {zone} of {project}")

    def _left_hosts(self, project: str, zone: str, name: str) -> list[str]:
        """The instances in ``zone`` labelled as hosts of slice ``name`` (``name`` is a checked node name)."""
        compute_v1 = v1()
        if not _NAME.fullmatch(name):
            return []  # never put into a filter expression
        try:
            return [i.name for i in self.c.instances.list(request=compute_v1.ListInstancesRequest(
                project=project, zone=zone, filter=f'labels.{SLICE_LABEL} = "{name}"'), retry=RETRY)
                if i.labels.get(SLICE_LABEL) == name and _host_of(i.name, name)]
        except _LIBRARY as e:
            raise translate(e, zone) from e

    @staticmethod
    def _get(read: Callable[[], Any], zone: str) -> Any:
        try:
            return read()
        except _LIBRARY as e:
            error = translate(e, zone)
            if isinstance(error, errors.NotFound):
                return None
            raise error from e


def _host_of(instance: str, name: str) -> bool:
    """Whether ``instance`` is named as a host of slice ``name``: the slice itself (one host), or a
    VM of its MIG (``<name>-w-`` and the four characters Compute appends)."""
    return instance == name or instance.startswith(f"{name}-w-")


def _leftover(project: str, template: Any) -> TpuNode | None:
    """A template of ours whose slice is gone (no MIG, no host), once past ``TEMPLATE_GRACE_S``: a node
    TERMINATED (stopped: nothing of the slice runs), in the zone its description names, so the
    planner deletes it as it deletes what is left of any attempt. None while young, or zone unknown."""
    found = _TEMPLATE_ZONE.fullmatch(template.description or "")
    created = datetime.fromisoformat(template.creation_timestamp) if template.creation_timestamp else None
    if found is None or created is None or (datetime.now(UTC) - created).total_seconds() < TEMPLATE_GRACE_S:
        return None
    props = template.properties
    return TpuNode(project=project, zone=found["zone"], name=template.name, state=NodeState.TERMINATED,
                   health=NodeHealth.HEALTHY, labels={**props.labels, names.MANAGED_LABEL: "true"},
                   created_at=created, accelerator_type=props.machine_type, spot=props.scheduling.provisioning_model
                   == "SPOT", id=str(template.id), workers=0, api="compute", stop_reason=StopReason.STOPPED)


def _lost_hosts(mig: Any, statuses: Sequence[InstanceStatus], workers: int) -> bool:
    """Whether a MIG with fewer hosts than its target lost some (deleted by hand, or by a Flex-start
    host's termination action at its run's end) rather than is still making them: it makes none
    (no managed instance creating, recreating or being verified; DO_NOTHING repairs nothing)."""
    if len(statuses) >= workers:
        return False
    actions = mig.current_actions
    return actions.creating + actions.creating_without_retries + actions.recreating + actions.verifying == 0


def _made(m: Any, flex_start: bool) -> bool:
    """A managed instance past its creation: RUNNING, down already (an existing slice that a later
    pass judges), or a Flex-start host waiting for capacity in PENDING."""
    status = m.instance_status
    if not status or m.current_action in ("CREATING", "RECREATING") and status != "PENDING":
        return False
    return status == "RUNNING" or InstanceStatus.of(status) in _DOWN or flex_start and status == "PENDING"


def _refusal(listed: Sequence[Any], zone: str) -> errors.RespawnError | None:
    """What the MIG's last attempt says of capacity or quota, as the error an insert would raise."""
    for m in listed:
        if m.instance_status:
            continue
        for e in m.last_attempt.errors.errors:
            if any(c in e.code for c in _CAPACITY):
                return errors.CapacityError(zone, e.code)
            if any(c in e.code for c in _QUOTA):
                return errors.QuotaError(zone, f"{e.code} ({e.message})" if e.message else e.code)
    return None


def _properties(r: TpuRequest, zone_prefix: str) -> dict[str, Any]:
    """An instance's (``zone_prefix`` ``zones/Z/``) or a template's (bare names) properties: a VM's
    (``compute.instance_properties``) of the TPU machine type, labelled as the slice's host."""
    labels = {k: v for k, v in r.labels.items() if k != names.MANAGED_LABEL} | {SLICE_LABEL: r.name}
    # A preempted Spot host stays, TERMINATED, for its cause to be read.
    return instance_properties(r, zone_prefix, machine_type=r.accelerator_type, labels=labels, spot_action="STOP")
