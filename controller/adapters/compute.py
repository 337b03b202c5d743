"""The ComputeGateway port on google-cloud-compute (REST transport).

Surprises handled here, each checked against the installed client:
- ``ExtendedOperation.result()`` polls through a ZoneOperationsClient built without
  the client's ``api_endpoint``, i.e. against Google's host whatever endpoint we set.
  So inserts and deletes use the ``*_unary`` methods and this adapter waits for the
  operation itself, with operations clients pointed at the same endpoint.
- An operation can finish DONE and still have failed (``error.errors[].code`` plus
  ``httpErrorStatusCode``); capacity errors also come back synchronously (HTTP 503).
- There is no ``return_partial_success`` on aggregated list in google-cloud-compute >=
  1.55: zones that did not answer are read from each page's ``unreachables``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import requests
from google.api_core import exceptions as gexc
from google.api_core import retry as retries
from google.cloud import compute_v1

from controller import errors
from controller.ports import Instance, InstanceList, InstanceRequest, InstanceStatus, StopReason

MANAGED_FILTER = 'labels.respawn-managed = "true"'
_CAPACITY = ("ZONE_RESOURCE_POOL_EXHAUSTED", "STOCKOUT", "does not have enough resources")
_QUOTA = ("QUOTA_EXCEEDED", "quotaExceeded", "Quota '")
_RATE = ("rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED")
_LIBRARY = (gexc.GoogleAPICallError, requests.exceptions.ConnectionError)
_TRANSIENT = (gexc.TooManyRequests, gexc.InternalServerError, gexc.BadGateway, gexc.ServiceUnavailable,
              gexc.GatewayTimeout, gexc.DeadlineExceeded)
# Compute's own records of why an instance stopped (zone operation types).
_REASONS = {
    "compute.instances.preempted": StopReason.PREEMPTED,
    "compute.instances.guestTerminate": StopReason.CRASHED,
    "compute.instances.hostError": StopReason.STOPPED,
    "compute.instances.terminateOnHostMaintenance": StopReason.STOPPED,
    "stop": StopReason.STOPPED,
    "suspend": StopReason.STOPPED,
    "delete": StopReason.STOPPED,
}


def _text(e: gexc.GoogleAPICallError) -> str:
    reasons = " ".join(str(x.get("reason", "")) + " " + str(x.get("message", "")) for x in (e.errors or []))
    return f"{e.message} {reasons}"


def _retryable(e: Exception) -> bool:
    """Transient, and not a stockout or quota answer in disguise (those are decisions, not noise)."""
    if isinstance(e, requests.exceptions.ConnectionError):
        return True
    if isinstance(e, gexc.Forbidden):
        return any(r in _text(e) for r in _RATE)
    if not isinstance(e, _TRANSIENT):
        return False
    text = _text(e)
    return not any(m in text for m in _CAPACITY + _QUOTA)


RETRY = retries.Retry(predicate=_retryable, initial=0.5, maximum=8.0, multiplier=2.0, timeout=60.0)


def translate(e: Exception, zone: str) -> errors.RespawnError:
    if not isinstance(e, gexc.GoogleAPICallError):  # a connection error
        return errors.TransientError(str(e))
    text = _text(e)
    if any(m in text for m in _CAPACITY):
        return errors.CapacityError(zone, next(m for m in _CAPACITY if m in text))
    if any(m in text for m in _QUOTA):
        return errors.QuotaError(zone, "QUOTA_EXCEEDED")
    if isinstance(e, gexc.NotFound):
        return errors.NotFound(e.message)
    if isinstance(e, gexc.Conflict):
        return errors.AlreadyExists(e.message)
    if _retryable(e):
        return errors.TransientError(e.message)
    return errors.RequestError(e.message)


class ComputeEngine:
    def __init__(self, instances: compute_v1.InstancesClient, region_instances: compute_v1.RegionInstancesClient,
                 zone_ops: compute_v1.ZoneOperationsClient, region_ops: compute_v1.RegionOperationsClient,
                 operation_timeout: float = 180.0) -> None:
        self.instances = instances
        self.region_instances = region_instances
        self.zone_ops = zone_ops
        self.region_ops = region_ops
        self.operation_timeout = operation_timeout

    def list_managed(self, projects: Sequence[str], job: str | None = None) -> InstanceList:
        expr = MANAGED_FILTER if job is None else f'({MANAGED_FILTER}) AND (labels.respawn-job = "{job}")'
        found: list[Instance] = []
        unreachable: list[str] = []
        for project in projects:
            request = compute_v1.AggregatedListInstancesRequest(project=project, filter=expr)
            try:
                pager = self.instances.aggregated_list(request=request, retry=RETRY)
                for page in pager.pages:
                    unreachable += [u.removeprefix("zones/") for u in page.unreachables]
                    for scope, scoped in page.items.items():
                        if scoped.warning and scoped.warning.code == "NO_RESULTS_ON_PAGE":
                            continue
                        found += [_instance(project, scope.removeprefix("zones/"), i) for i in scoped.instances]
            except _LIBRARY as e:
                raise translate(e, "*") from e
        return InstanceList(found, sorted(set(unreachable)))

    def insert(self, requests_: Sequence[InstanceRequest], request_id: str) -> None:
        first = requests_[0]
        try:
            if len(requests_) == 1:
                op = self.instances.insert_unary(request=compute_v1.InsertInstanceRequest(
                    project=first.project, zone=first.zone, request_id=request_id,
                    instance_resource=instance_body(first)), retry=RETRY)
                self._wait_zone(first.project, first.zone, op)
            else:
                region = first.zone.rsplit("-", 1)[0]
                # Sic: the regional request's field is ``bulk_insert_instance_resource_resource``
                # (the zonal one has a single ``_resource``), a quirk of the generated client.
                op = self.region_instances.bulk_insert_unary(request=compute_v1.BulkInsertRegionInstanceRequest(
                    project=first.project, region=region, request_id=request_id,
                    bulk_insert_instance_resource_resource=bulk_body(requests_)), retry=RETRY)
                self._wait_region(first.project, region, op, first.zone)
        except errors.AlreadyExists:
            return
        except _LIBRARY as e:
            error = translate(e, first.zone)
            if isinstance(error, errors.AlreadyExists):
                return  # an earlier try with this very request got there: success
            raise error from e

    def delete(self, project: str, zone: str, name: str) -> None:
        try:
            op = self.instances.delete_unary(project=project, zone=zone, instance=name, retry=RETRY)
            self._wait_zone(project, zone, op)
        except _LIBRARY as e:
            raise translate(e, zone) from e

    def stop_reason(self, project: str, zone: str, name: str) -> StopReason:
        """Compute's own record of what stopped this instance: the first stop-causing
        operation since it last started (a preempted husk we then delete was preempted)."""
        request = compute_v1.ListZoneOperationsRequest(project=project, zone=zone,
                                                       filter=f'targetLink eq ".*/instances/{name}"')
        try:
            ops = list(self.zone_ops.list(request=request, retry=RETRY))
        except _LIBRARY as e:
            raise translate(e, zone) from e
        ops = sorted((op for op in ops if op.target_link.endswith(f"/instances/{name}")), key=lambda op: op.insert_time)
        starts = [i for i, op in enumerate(ops) if op.operation_type in ("insert", "start", "bulkInsert")]
        since = ops[starts[-1] + 1 :] if starts else ops
        return next((_REASONS[op.operation_type] for op in since if op.operation_type in _REASONS), StopReason.UNKNOWN)

    # -- operations -----------------------------------------------------------------
    def _wait_zone(self, project: str, zone: str, op: compute_v1.Operation) -> None:
        deadline = time.monotonic() + self.operation_timeout
        while op.status != compute_v1.Operation.Status.DONE and time.monotonic() < deadline:
            op = self.zone_ops.wait(project=project, zone=zone, operation=op.name, retry=RETRY)
        _raise_for(op, zone)

    def _wait_region(self, project: str, region: str, op: compute_v1.Operation, zone: str) -> None:
        deadline = time.monotonic() + self.operation_timeout
        while op.status != compute_v1.Operation.Status.DONE and time.monotonic() < deadline:
            op = self.region_ops.wait(project=project, region=region, operation=op.name, retry=RETRY)
        _raise_for(op, zone)


def _raise_for(op: compute_v1.Operation, zone: str) -> None:
    """A DONE operation that failed, as one of the project's errors; nothing if it succeeded.

    An operation still running at the deadline is left to finish on its own: the next
    pass observes its result.
    """
    if op.status != compute_v1.Operation.Status.DONE or not op.error.errors:
        return
    codes = [e.code for e in op.error.errors]
    message = "; ".join(f"{e.code}: {e.message}" for e in op.error.errors)
    if any(any(m in c for m in _CAPACITY) for c in codes):
        raise errors.CapacityError(zone, next(c for c in codes if any(m in c for m in _CAPACITY)))
    if any("QUOTA" in c for c in codes):
        raise errors.QuotaError(zone, next(c for c in codes if "QUOTA" in c))
    if any(c in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS") for c in codes):
        raise errors.AlreadyExists(message)
    status = op.http_error_status_code
    if status == 429 or status >= 500:
        raise errors.TransientError(message)
    raise errors.RequestError(message)


def _instance(project: str, zone: str, i: compute_v1.Instance) -> Instance:
    return Instance(project=project, zone=zone, name=i.name, status=InstanceStatus(i.status), labels=dict(i.labels),
                    created_at=datetime.fromisoformat(i.creation_timestamp), id=str(i.id))


def _scheduling(r: InstanceRequest) -> compute_v1.Scheduling:
    # GPUs cannot live-migrate; and respawn, not Compute, decides when to bring a VM back.
    scheduling = compute_v1.Scheduling(on_host_maintenance="TERMINATE", automatic_restart=False,
                                       provisioning_model="SPOT" if r.spot else "STANDARD")
    if r.spot:
        scheduling.instance_termination_action = r.termination_action.upper()
    return scheduling


def _common(r: InstanceRequest, zone_prefix: str) -> dict[str, Any]:
    """Fields shared by an Instance and bulk InstanceProperties (which take bare type names)."""
    accelerators = []
    if r.accelerator_type:
        accelerators = [compute_v1.AcceleratorConfig(accelerator_type=f"{zone_prefix}acceleratorTypes/{r.accelerator_type}"
                                                     if zone_prefix else r.accelerator_type,
                                                     accelerator_count=r.accelerator_count)]
    disk_type = f"{zone_prefix}diskTypes/{r.boot_disk_type}" if zone_prefix else r.boot_disk_type
    nic = compute_v1.NetworkInterface(network=r.network)
    if r.subnetwork:
        nic.subnetwork = r.subnetwork
    if r.external_ip:
        nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
    return dict(
        machine_type=f"{zone_prefix}machineTypes/{r.machine_type}" if zone_prefix else r.machine_type,
        labels=dict(r.labels),
        metadata=compute_v1.Metadata(items=[compute_v1.Items(key=k, value=v) for k, v in r.metadata.items()]),
        disks=[compute_v1.AttachedDisk(boot=True, auto_delete=True, initialize_params=compute_v1.AttachedDiskInitializeParams(
            source_image=r.boot_image, disk_size_gb=r.boot_disk_gb, disk_type=disk_type))],
        network_interfaces=[nic],
        service_accounts=[compute_v1.ServiceAccount(email=r.service_account, scopes=list(r.scopes))],
        tags=compute_v1.Tags(items=list(r.tags)),
        guest_accelerators=accelerators,
        scheduling=_scheduling(r),
    )


def instance_body(r: InstanceRequest) -> compute_v1.Instance:
    return compute_v1.Instance(name=r.name, **_common(r, f"zones/{r.zone}/"))


def bulk_body(rs: Sequence[InstanceRequest]) -> compute_v1.BulkInsertInstanceResource:
    """A gang: one regional bulkInsert, all or none, in exactly the chosen zone.

    bulkInsert gives every instance the same properties, so nodes differ only by name;
    the VM reads its rank from its name's last ``-<rank>``.
    """
    zone = rs[0].zone
    return compute_v1.BulkInsertInstanceResource(
        count=len(rs),
        min_count=len(rs),
        instance_properties=compute_v1.InstanceProperties(**_common(rs[0], "")),
        per_instance_properties={r.name: compute_v1.BulkInsertInstanceResourcePerInstanceProperties(name=r.name) for r in rs},
        location_policy=compute_v1.LocationPolicy(
            locations={f"zones/{zone}": compute_v1.LocationPolicyLocation(preference="ALLOW")},
            target_shape="ANY_SINGLE_ZONE",
        ),
    )
