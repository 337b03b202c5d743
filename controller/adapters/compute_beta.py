"""Inserts that ask for the Spot preemption notice, through google-cloud-compute-v1beta.

``scheduling.preemptionNoticeDuration`` (Preview since 2026-04-16) is in Compute's v1 discovery
document (revision 20261106) but not in google-cloud-compute 1.57's v1 ``Scheduling``, whose
proto-plus messages refuse a field they do not have. The beta API has it: such inserts are sent
to ``compute/beta/...`` with the v1beta ``InstancesClient``, on the same endpoint, credentials
and transport as the v1 clients (``controller.adapters.google``).

Imported only at the first insert with a notice: like compute_v1's, the package's ``__init__``
imports its hundred service clients, and its message module is larger still (``lean``). Both
packages also ship ``google/cloud/compute/__init__.py`` (the one installed last overwrites the
other's): respawn imports neither alias, only ``compute_v1`` and ``compute_v1beta``.

The body is the v1 one (``controller.adapters.compute.instance_body``/``bulk_body``), carried over
by its JSON form, with the notice added: one builder of instances, not two.
"""

from __future__ import annotations

from controller.adapters.lean import lean

lean("google.cloud.compute_v1beta")
lean("google.cloud.compute_v1")
from google.cloud.compute_v1beta.services.instances import InstancesClient  # noqa: E402
from google.cloud.compute_v1beta.types import compute as compute_v1beta  # noqa: E402
from google.cloud.compute_v1.types import compute as compute_v1  # noqa: E402

__all__ = ["InstancesClient", "insert", "operation"]


def insert(client: InstancesClient, body: compute_v1.Instance | compute_v1.BulkInsertInstanceResource, project: str,
           zone: str, request_id: str, notice_s: int, retry: object) -> compute_v1.Operation:
    """``instances.insert`` (an Instance) or ``bulkInsert`` (a gang's resource) through the beta
    API, with ``notice_s`` seconds of preemption notice; its operation as a v1 one, which the
    v1 zone operations client waits for by name (the operation is the same on both APIs)."""
    notice = compute_v1beta.Duration(seconds=notice_s)
    if isinstance(body, compute_v1.Instance):
        instance = _beta(compute_v1beta.Instance, body)
        instance.scheduling.preemption_notice_duration = notice
        op = client.insert_unary(request=compute_v1beta.InsertInstanceRequest(
            project=project, zone=zone, request_id=request_id, instance_resource=instance), retry=retry)
    else:
        gang = _beta(compute_v1beta.BulkInsertInstanceResource, body)
        gang.instance_properties.scheduling.preemption_notice_duration = notice
        op = client.bulk_insert_unary(request=compute_v1beta.BulkInsertInstanceRequest(
            project=project, zone=zone, request_id=request_id, bulk_insert_instance_resource_resource=gang), retry=retry)
    return operation(op)


def operation(op: compute_v1beta.Operation) -> compute_v1.Operation:
    """A beta operation as the v1 message (fields beta alone has are left out)."""
    return compute_v1.Operation.from_json(compute_v1beta.Operation.to_json(op), ignore_unknown_fields=True)


def _beta(kind: type, body: object) -> object:
    """A v1 message as the beta message of the same name: every v1 field is a beta field too."""
    return kind.from_json(type(body).to_json(body))  # type: ignore[attr-defined]
