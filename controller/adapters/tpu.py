"""The TpuGateway port on google-cloud-tpu (``tpu_v2.TpuClient``, REST transport).

Surprises handled here, each checked against the installed client (google-cloud-tpu 1.28,
google-api-core 2.44):
- Operations. Unlike Compute's ``ExtendedOperation`` (see compute.py), the TPU REST
  transport builds its ``operations_client`` with ``host=self._host``, the configured
  endpoint (scheme included), so ``Operation.result()`` would poll the right server. It
  still is not used: that operations client is an ``OperationsRestTransport`` with an
  ``AuthorizedSession`` of its own (not the tuned pool, see google.py ``_tune``), and
  ``result(timeout)`` ends in ``concurrent.futures.TimeoutError``, a library exception we
  would have to know to catch. The adapter polls ``client.get_operation`` itself (the
  transport's ``_GetOperation``: same host, same session, ``/v2/{name}``).
- ``nodes.create`` takes no ``requestId`` in v2 (only ``queuedResources.create`` does): a
  repeated create is answered 409 while the first one's node exists. So an existing node
  still CREATING is waited for as its operation would be, and the request id goes to
  queued resources only.
- The installed ``tpu_v2.Node`` has no ``upcoming_maintenance`` field (tpu.v2.json has
  ``upcomingMaintenance``; only ``tpu_v2alpha1`` carries it), and the REST transport parses
  with ``ignore_unknown_fields=True``: the field is dropped silently. It also asks for
  enums as numbers (``$alt=json;enum-encoding=int``), so a state Google adds later would
  reach us as a bare number. Listings therefore read the JSON themselves, through the
  transport's own session and host, with enums as names.
- A zone the project may not use, or that does not exist, is a 403 naming the location
  ("Permission denied on 'locations/us-central2-b' (or it may not exist)."): that zone is
  unreachable, not the whole project refused.
- Stockout comes back on the finished operation as code 8 (RESOURCE_EXHAUSTED), 'There
  is no more capacity in the zone "europe-west4-a"; you can try in another zone where
  Cloud TPU Nodes are offered ...'; a reservation without room as code 9, 'Insufficient
  reserved capacity'. Quota is refused at once, HTTP 429 RESOURCE_EXHAUSTED "Quota limit
  'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI' has been exceeded. Limit: 0 in region
  us-east5." with a ``google.rpc.QuotaFailure`` detail ("Quota '...' exhausted. Limit 4 in
  zone us-east5-a"). A 429 is no rate limit to retry then: the quota text decides.
  Sources: SkyPilot's GCP failover handler treats operation codes 8 and 9 (with those
  texts) as the zone being out of TPU capacity (skypilot-org/skypilot,
  sky/backends/cloud_vm_ray_backend.py, ``_gcp_handler``); marin's iris TPU provider takes
  an operation's code 8 as exhaustion (marin-community/marin, lib/iris/.../providers/gcp);
  the operation text in hashicorp/terraform-provider-google#21243; the 429 quota answer to
  ``nodes.create`` in marin-community/marin#1612.
- Hostile answers. The client sets no timeout of its own (``default_timeout=None``): every
  call here passes one. A body it cannot parse is ``json_format.Error`` (also an operation
  whose error details hold an ``Any`` of a type not in the descriptor pool), a credential
  refresh that fails is ``google.auth`` 's: both are transient errors here. A listing page
  that is not shaped as tpu.v2.json says, a ``nextPageToken`` that comes back, or a 404 on
  a zone leave the zone unreachable, never empty (null is a field's default, as proto3
  JSON has it). Zones and projects named twice are listed once.
- Queued resource ids are a namespace apart from node ids: delete force-deletes the queued
  resource named like the node only when it asks for that node under our label.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import requests
from google.api_core import exceptions as gexc
from google.api_core import retry as retries
from google.auth import exceptions as auth_exceptions
from google.cloud import tpu_v2
from google.longrunning import operations_pb2
from google.protobuf import json_format

from controller.adapters import reasons
from controller.core import errors, names
from controller.service import fanout
from controller.core.ports import (QUEUED_AS_NODE, NodeHealth, NodeState, QueuedState, TpuList, TpuNode, TpuRequest)

_ZONE_LISTS = 8  # zones listed side by side (a spec names a few)
_LIST_TIMEOUT = 30.0  # seconds for one page of a listing
_CALL_TIMEOUT = 30.0  # seconds for one create / get / delete request: the client sets none (default_timeout=None)
_MAX_PAGES = 1000  # pages of one collection: a nextPageToken that never ends blinds the zone, not the pass
# What _zone_nodes reads of a listed node (tpu.v2.json's names: tests/contract/test_fields.py), so a
# listing carries no node's metadata (its startup and shutdown scripts). Queued resources are read
# whole: their tier is an empty message (``"spot": {}``) whose presence is what is read, and an empty
# message is what a partial response may well leave out; they are few (queued TPU jobs alone).
NODE_FIELDS = ("nodes(name,labels,queuedResource,schedulingConfig,state,health,createTime,acceleratorType,id,"
               "networkEndpoints,upcomingMaintenance),nextPageToken")
# Matched lowercased, in the message and the details of an error.
_CAPACITY = ("no more capacity", "insufficient reserved capacity", "insufficient capacity", "stockout",
             "resource_pool_exhausted")
_QUOTA = ("quota limit", "quota '", "quotafailure", "quota_exceeded", "quota exceeded")
# A quota on API requests ("Quota exceeded for quota metric 'Create requests' and limit
# 'Create requests per minute' of service 'tpu.googleapis.com'", the wording Google APIs
# share) is a rate limit: it clears by itself, unlike a quota on TPU chips.
_RATE = ("per minute", "per_minute", "per second", "per_second", "requests per")
_QUOTA_NAME = re.compile(r"[Qq]uota (?:limit )?'([^']+)'")
_LOCATION_DENIED = re.compile(r"Permission denied on 'locations/[^']*'")
# Everything the client may raise on a bad answer: API errors, no answer, a body it cannot
# parse (json_format.Error: not JSON, a wrong type, an Any of a type it does not know in an
# operation's error details), credentials it could not refresh.
_LIBRARY = (gexc.GoogleAPIError, requests.exceptions.RequestException, json_format.Error,
            auth_exceptions.GoogleAuthError)
_TRANSIENT = (gexc.TooManyRequests, gexc.InternalServerError, gexc.BadGateway, gexc.ServiceUnavailable,
              gexc.GatewayTimeout, gexc.DeadlineExceeded)
# google.rpc.Code of a failed operation worth trying again: DEADLINE_EXCEEDED, ABORTED,
# INTERNAL, UNAVAILABLE.
_TRANSIENT_CODES = {4, 10, 13, 14}
_RESOURCE_EXHAUSTED, _ALREADY_EXISTS = 8, 6
_POLL_FIRST, _POLL_MAX = 0.2, 5.0  # seconds between operation polls: TPU has no operations.wait


def _marker(text: str, markers: Sequence[str]) -> str | None:
    low = text.lower()
    return next((m for m in markers if m in low), None)


def _quota_reason(text: str) -> str:
    found = _QUOTA_NAME.search(text)
    return f"QUOTA_EXCEEDED ({found.group(1)})" if found else "QUOTA_EXCEEDED"


def _text(e: gexc.GoogleAPICallError) -> str:
    """Message, reason and details (QuotaFailure violations...) of an error, as one string."""
    parts = [e.message or "", e.reason or ""]
    for detail in list(e.errors or []) + list(e.details or []):
        parts.append(str(detail))
    return " ".join(parts)


def _retryable(e: Exception) -> bool:
    """Transient, and not a stockout or quota answer in disguise (TPU quota is a 429)."""
    if isinstance(e, requests.exceptions.ConnectionError):
        return True
    if not isinstance(e, _TRANSIENT):
        return False
    text = _text(e)
    return _marker(text, _RATE) is not None or _marker(text, _CAPACITY + _QUOTA) is None


RETRY = retries.Retry(predicate=_retryable, initial=0.5, maximum=8.0, multiplier=2.0, timeout=60.0)


def translate(e: Exception, zone: str, *, creating: bool = False) -> errors.RespawnError:
    """A library error as one of the project's. ``creating``: the answer to a create, where a
    404 names something the request refers to (zone, accelerator type, network), not a node."""
    if not isinstance(e, gexc.GoogleAPICallError):  # no answer, or RETRY gave up on transient ones
        return errors.TransientError(reasons.reason(e))
    text = _text(e)
    if _retryable(e):  # still failing after RETRY gave up: rate limits, 5xx
        return errors.TransientError(reasons.message(e))
    if _marker(text, _QUOTA):
        return errors.QuotaError(zone, _quota_reason(text))
    if marker := _marker(text, _CAPACITY):
        return errors.CapacityError(zone, f"RESOURCE_EXHAUSTED ({marker})")
    if isinstance(e, gexc.Conflict):
        return errors.AlreadyExists(reasons.message(e))
    if isinstance(e, gexc.NotFound) and not creating:
        return errors.NotFound(reasons.message(e))
    return errors.RequestError(reasons.message(e))


def _raise_for(op: operations_pb2.Operation, zone: str) -> None:
    """A finished operation that failed, as one of the project's errors; nothing if it succeeded."""
    if not op.done or not op.HasField("error") or op.error.code == 0:
        return
    code, message = op.error.code, op.error.message
    text = " ".join([message, *(d.type_url for d in op.error.details)])
    if _marker(text, _QUOTA):
        raise errors.QuotaError(zone, _quota_reason(text))
    if (marker := _marker(text, _CAPACITY)) or code == _RESOURCE_EXHAUSTED:
        raise errors.CapacityError(zone, f"RESOURCE_EXHAUSTED ({marker or 'code 8'})")
    if code == _ALREADY_EXISTS:
        raise errors.AlreadyExists(message)
    if code in _TRANSIENT_CODES:
        raise errors.TransientError(f"code {code}: {message}")
    raise errors.RequestError(f"code {code}: {message}")


class CloudTpu:
    def __init__(self, client: tpu_v2.TpuClient, operation_timeout: float = 180.0) -> None:
        self.client = client
        self.operation_timeout = operation_timeout

    # -- listing ----------------------------------------------------------------------
    def list_nodes(self, projects: Sequence[str], zones: Sequence[str], job: str | None = None) -> TpuList:
        if job is not None and (problem := names.job_name_problem(job)):
            raise errors.RequestError(problem)

        def one(where: tuple[str, str]) -> tuple[list[TpuNode], str | None, tuple[str, str] | None,
                                                 tuple[str, str] | None]:
            """(nodes, the zone if it could not be seen, (project, why) if the project refused,
            (zone, why) if the project may not use the zone)."""
            project, zone = where
            parent = f"projects/{project}/locations/{zone}"
            try:
                nodes = self._pages(f"{parent}/nodes", "nodes", NODE_FIELDS)
                queued = self._pages(f"{parent}/queuedResources", "queuedResources")
                return _zone_nodes(project, zone, nodes, queued, job), None, None, None
            except (*_LIBRARY, ValueError, TypeError, AttributeError, KeyError) as e:
                # ValueError...KeyError: a body that is not JSON, or JSON not shaped as
                # tpu.v2.json says (read in _zone_nodes); the zone is not seen, never empty.
                error = translate(e, zone)
                # This location refused (403 "Permission denied on 'locations/...' (or it may
                # not exist)"): the project may not use the zone, so nothing of ours is there and
                # nothing can be created there: denied, for the job to say, not unseen.
                if isinstance(e, gexc.Forbidden) and _LOCATION_DENIED.search(e.message or ""):
                    return [], None, None, (zone, e.message or str(error))
                # Not seen, like an aggregated list's unreachables: no answer, 5xx, the
                # read-request quota, or a 404 (Google answers an unknown location with 403:
                # a 404 is a wrong endpoint or path, never proof that nothing is there);
                # anything else (a 403 on the project) is the project refusing.
                if isinstance(error, (errors.TransientError, errors.QuotaError)) or isinstance(e, gexc.NotFound):
                    return [], zone, None, None
                return [], None, (project, str(error)), None

        # Each (project, zone) once: a zone named twice would list its nodes twice.
        pairs = list(dict.fromkeys((p, z) for p in projects for z in zones))
        results = fanout.each(pairs, one, workers=_ZONE_LISTS)
        return TpuList([n for listed, _, _, _ in results for n in listed],
                       sorted({zone for _, zone, _, _ in results if zone}),
                       dict(refusal for _, _, refusal, _ in results if refusal),
                       dict(denial for _, _, _, denial in results if denial))

    def _pages(self, path: str, key: str, fields: str | None = None) -> list[dict[str, Any]]:
        """Every item of a v2 collection, as the JSON Google sent (see the module's docstring);
        ``fields``: only those (Google's partial response, the standard ``fields`` parameter)."""
        items: list[dict[str, Any]] = []
        token = ""
        seen: set[str] = set()
        for _ in range(_MAX_PAGES):
            params = {**({"pageToken": token} if token else {}), **({"fields": fields} if fields else {})}
            page = RETRY(self._get)(path, params)
            if not isinstance(page, dict):
                raise ValueError(f"a page of {path} is {type(page).__name__}, not an object")
            items += _field(page, key, list, [])
            token = _field(page, "nextPageToken", str, "")
            if not token:
                return items
            if token in seen:
                raise ValueError(f"nextPageToken {token[:40]!r} of {path} came back again: the listing would not end")
            seen.add(token)
        raise ValueError(f"{path} still had pages after {_MAX_PAGES}")

    def _get(self, path: str, params: Mapping[str, str]) -> dict[str, Any]:
        transport = self.client.transport
        response = transport._session.get(f"{transport._host}/v2/{path}", params=dict(params),  # type: ignore[attr-defined]
                                          timeout=_LIST_TIMEOUT)
        if response.status_code >= 400:
            raise gexc.from_http_response(response)  # what the transport itself raises
        return response.json()

    # -- create ------------------------------------------------------------------------
    def create(self, request: TpuRequest, request_id: str, wait: float | None = None) -> None:
        r = request
        wait = self.operation_timeout if wait is None else wait
        deadline = time.monotonic() + wait
        parent = f"projects/{r.project}/locations/{r.zone}"
        try:
            if r.queued:
                started = self.client.create_queued_resource(request=tpu_v2.CreateQueuedResourceRequest(
                    parent=parent, queued_resource_id=r.name, queued_resource=queued_body(r), request_id=request_id),
                    retry=RETRY, timeout=_CALL_TIMEOUT)
            else:
                started = self.client.create_node(request=tpu_v2.CreateNodeRequest(
                    parent=parent, node_id=r.name, node=node_body(r)), retry=RETRY, timeout=_CALL_TIMEOUT)
        except _LIBRARY as e:
            error = translate(e, r.zone, creating=True)
            if not isinstance(error, errors.AlreadyExists):
                raise error from e
            if not r.queued:  # no request id to find the first create's operation by: its node tells
                self._settled(r, deadline, wait)
            return
        op = self._wait(started.operation, r.zone, deadline)
        if not op.done:
            raise errors.OperationPending(
                f"create of {r.name} in {r.zone} still running after {wait:g}s (operation {op.name}); "
                "its outcome is read on the next try")
        try:
            _raise_for(op, r.zone)
        except errors.AlreadyExists:
            return

    def _settled(self, r: TpuRequest, deadline: float, wait: float) -> None:
        """An existing node is success once it is past CREATING; until ``deadline``, waited for."""
        name = f"projects/{r.project}/locations/{r.zone}/nodes/{r.name}"
        pause = _POLL_FIRST
        while True:
            try:
                node = self.client.get_node(name=name, retry=RETRY, timeout=_CALL_TIMEOUT)
            except gexc.NotFound as e:  # its create failed (a late stockout) and took it away
                raise errors.TransientError(f"{r.name} in {r.zone} vanished while being created; create it again") from e
            except _LIBRARY as e:
                raise translate(e, r.zone) from e
            if node.state != tpu_v2.Node.State.CREATING:
                return
            if (left := deadline - time.monotonic()) <= 0:
                raise errors.OperationPending(f"{r.name} in {r.zone} still CREATING after {wait:g}s")
            time.sleep(min(pause, left))
            pause = min(pause * 1.5, _POLL_MAX)

    def _wait(self, op: operations_pb2.Operation, zone: str, deadline: float) -> operations_pb2.Operation:
        """The operation once done, or as it stands at ``deadline``."""
        if not op.done and not op.name:
            raise errors.TransientError("the TPU API started an operation without a name: its outcome cannot be read")
        pause = _POLL_FIRST
        while not op.done and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(pause, left))
            pause = min(pause * 1.5, _POLL_MAX)
            try:
                op = self.client.get_operation(operations_pb2.GetOperationRequest(name=op.name), retry=RETRY,
                                               timeout=max(deadline - time.monotonic(), 1.0))
            except requests.exceptions.Timeout:
                continue
            except gexc.NotFound as e:  # the operation itself is gone: not a 404 on what it made
                raise errors.TransientError(f"operation {op.name} vanished: {e.message}") from e
            except _LIBRARY as e:
                raise translate(e, zone) from e
        return op

    # -- delete ------------------------------------------------------------------------
    def delete(self, project: str, zone: str, name: str) -> None:
        """The queued resource first (force: its node goes with it), else the node. Returns once
        the TPU API accepted the delete, as Compute's delete does: later passes see it go."""
        parent = f"projects/{project}/locations/{zone}"
        try:
            # Queued resource ids are a namespace of their own: one named like our node may be
            # someone else's, asking for other nodes. Force-deleting it would take them too, so
            # only one that asks for this node, with our label, is deleted in its stead.
            try:
                qr = self.client.get_queued_resource(name=f"{parent}/queuedResources/{name}", retry=RETRY,
                                                     timeout=_CALL_TIMEOUT)
            except gexc.NotFound:
                qr = None
            started = None
            if qr is not None and _queued_for(qr, name):
                try:
                    started = self.client.delete_queued_resource(request=tpu_v2.DeleteQueuedResourceRequest(
                        name=qr.name, force=True), retry=RETRY, timeout=_CALL_TIMEOUT)
                except gexc.NotFound:  # gone since: its node (if any) is deleted below
                    pass
            if started is None:
                started = self.client.delete_node(name=f"{parent}/nodes/{name}", retry=RETRY, timeout=_CALL_TIMEOUT)
        except _LIBRARY as e:
            raise translate(e, zone) from e
        _raise_for(started.operation, zone)


def _queued_for(qr: tpu_v2.QueuedResource, name: str) -> bool:
    """The queued resource asks for node ``name``, under the controller's label."""
    return any(spec.node_id == name and spec.node.labels.get(names.MANAGED_LABEL) == "true"
               for spec in qr.tpu.node_spec)


# -- reading the JSON -----------------------------------------------------------------
# proto3 JSON: a field may be left out or null (its default); any other type than the
# document's is a malformed answer (ValueError: the zone is not seen).
def _field(raw: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ValueError(f"{key} is {type(value).__name__}, not {kind.__name__}")
    return value


def _labels(raw: Mapping[str, Any]) -> dict[str, str]:
    labels = _field(raw, "labels", dict, {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise ValueError("labels are not strings")
    return dict(labels)


def _short(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def _time(value: str | None) -> datetime:
    if not value:
        return datetime.min.replace(tzinfo=timezone.utc)
    moment = datetime.fromisoformat(value)  # ValueError on a malformed one
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _maintenance(raw: Mapping[str, Any] | None) -> str | None:
    if not raw:
        return None
    text = f"{raw.get('type') or 'UNKNOWN_TYPE'}, starts {raw.get('windowStartTime') or 'unknown'}"
    return text + (", ONGOING" if raw.get("maintenanceStatus") == "ONGOING" else "")


def _wanted(labels: Mapping[str, str], job: str | None) -> bool:
    return labels.get(names.MANAGED_LABEL) == "true" and (job is None or labels.get(names.JOB_LABEL) == job)


def _zone_nodes(project: str, zone: str, nodes: list[dict[str, Any]], queued: list[dict[str, Any]],
                job: str | None) -> list[TpuNode]:
    """One zone's managed nodes, and its managed queued resources whose node is not listed."""
    if not all(isinstance(x, dict) for x in [*nodes, *queued]):
        raise ValueError("a listed node or queued resource is not an object")
    owners: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}  # node id -> (queued resource, its node spec)
    for qr in queued:
        for spec in _field(_field(qr, "tpu", dict, {}), "nodeSpec", list, []):
            if not isinstance(spec, dict):
                raise ValueError("a node spec is not an object")
            if node_id := _field(spec, "nodeId", str, ""):
                owners[node_id] = (qr, spec)
    found: list[TpuNode] = []
    for raw in nodes:
        labels = _labels(raw)
        name = _short(_field(raw, "name", str, ""))
        if not _wanted(labels, job):
            continue
        owner = owners.get(name, (None, None))[0]
        if owner is None and (queued_name := _field(raw, "queuedResource", str, "")):
            owner = next((qr for qr in queued if qr.get("name") == queued_name), None)
        scheduling = _field(raw, "schedulingConfig", dict, {})
        found.append(TpuNode(
            project=project, zone=zone, name=name, state=NodeState.of(raw.get("state") or "STATE_UNSPECIFIED"),
            health=NodeHealth.of(raw.get("health") or "HEALTH_UNSPECIFIED"), labels=labels,
            created_at=_time(_field(raw, "createTime", str, "")),
            accelerator_type=_short(_field(raw, "acceleratorType", str, "")),
            spot=bool(scheduling.get("spot") or scheduling.get("preemptible") or (owner and "spot" in owner)),
            id=str(raw.get("id") or ""), workers=len(_field(raw, "networkEndpoints", list, [])) or 1,
            upcoming_maintenance=_maintenance(_field(raw, "upcomingMaintenance", dict, {})),
            queued=_queued_state(owner) if owner else QueuedState.UNKNOWN if raw.get("queuedResource") else None))
    listed = {n.name for n in found} | {_short(_field(raw, "name", str, "")) for raw in nodes}
    for node_id, (qr, spec) in owners.items():
        node = _field(spec, "node", dict, {})
        labels = _labels(node)
        if node_id in listed or not _wanted(labels, job):
            continue
        state = _queued_state(qr)
        found.append(TpuNode(
            project=project, zone=zone, name=node_id, state=QUEUED_AS_NODE.get(state, NodeState.UNKNOWN),
            health=NodeHealth.HEALTH_UNSPECIFIED, labels=labels, created_at=_time(_field(qr, "createTime", str, "")),
            accelerator_type=_short(_field(node, "acceleratorType", str, "")), spot="spot" in qr, queued=state))
    return found


def _queued_state(qr: Mapping[str, Any]) -> QueuedState:
    return QueuedState.of(_field(qr, "state", dict, {}).get("state") or "STATE_UNSPECIFIED")


# -- request bodies -------------------------------------------------------------------
def node_body(r: TpuRequest, *, spot: bool | None = None) -> tpu_v2.Node:
    """The node as ``nodes.create`` (or a queued resource's node spec) takes it."""
    network = tpu_v2.NetworkConfig(network=r.network, enable_external_ips=r.external_ip)
    if r.subnetwork:
        network.subnetwork = r.subnetwork
    # TPU's ServiceAccount: an empty email means the default Compute account, Compute's "default".
    account = tpu_v2.ServiceAccount(email="" if r.service_account == "default" else r.service_account,
                                    scope=list(r.scopes))
    return tpu_v2.Node(
        accelerator_type=r.accelerator_type, runtime_version=r.runtime_version, network_config=network,
        service_account=account, labels=dict(r.labels), metadata=dict(r.metadata), tags=list(r.tags),
        scheduling_config=tpu_v2.SchedulingConfig(spot=r.spot if spot is None else spot))


def queued_body(r: TpuRequest) -> tpu_v2.QueuedResource:
    """One node spec under the node's name, in the spot tier (Spot) or the guaranteed one.

    Spot is the queued resource's tier, not the node spec's scheduling config: the API
    documents the tier as where a queued request says how it is to be provisioned.
    """
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=f"projects/{r.project}/locations/{r.zone}", node_id=r.name,
                                              node=node_body(r, spot=False))
    tier: dict[str, Any] = ({"spot": tpu_v2.QueuedResource.Spot()} if r.spot
                            else {"guaranteed": tpu_v2.QueuedResource.Guaranteed()})
    return tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]), **tier)
