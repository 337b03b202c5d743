"""The ComputeGateway port on google-cloud-compute (REST transport).

Surprises handled here, each checked against the installed client:
- ``ExtendedOperation.result()`` polls through a ZoneOperationsClient built without
  the client's ``api_endpoint``, i.e. against Google's host whatever endpoint we set.
  So inserts and deletes use the ``*_unary`` methods and this adapter waits for the
  operation itself, with an operations client pointed at the same endpoint.
- An operation can finish DONE and still have failed (``error.errors[].code`` plus
  ``httpErrorStatusCode``, quota failures with ``errorDetails[].quotaInfo``); capacity
  errors also come back synchronously (HTTP 503, ``insufficientCapacity`` on bulkInsert).
- An operation still RUNNING at the wait's deadline is not a success: an insert raises
  ``OperationPending`` and the next pass, sending the same request id, is answered with
  that very operation and reads its outcome.
- A gang is a *zonal* ``instances.bulkInsert``: a regional one is not pinned by a
  ``locationPolicy`` that allows one zone (zones left out default to ALLOW).
- There is no ``return_partial_success`` on aggregated list in google-cloud-compute >=
  1.55: zones that did not answer are read from each page's ``unreachables``.
- ``Instance.status`` is a plain string in the client: values added after this code was
  written read as ``InstanceStatus.UNKNOWN``.
- ``scheduling.preemptionNoticeDuration`` is not in the v1 protos of google-cloud-compute 1.57:
  an insert asking for the notice goes through the beta API (``compute_beta``), whose operation
  the v1 zone operations client waits for by name. A project the Preview is not open to answers
  400 naming the field: ``NoticeRefused``.
- ``instances.setMetadata`` replaces every item, on the fingerprint last read (412
  ``conditionNotMet`` when another write came between): the go reads, merges and retries.
- Partial responses. Listings ask only for the fields ``_instance`` reads (``LIST_FIELDS``,
  ``AGGREGATED_FIELDS``): without that every listed VM carried its whole metadata, the VM scripts
  once inlined there (a 500-VM page was 35 MiB and 1.2 CPU-s to parse: ``python -m bench.listing``).
  The client's request types have no ``fields``; ``get`` (the go's read) sends the selection as
  ``X-Goog-FieldMask``, the header form of the same system parameter (Google's "System parameters"
  page): the REST transport sends every ``metadata`` pair as an HTTP header.
- Listings do not go through the client at all (``Listing``). google-cloud-compute's message types are
  one module of ~2,200 proto-plus classes, built at import: 0.33 CPU-s, a third of a cold start's,
  three times that at the third of a vCPU a function gets (``python -X importtime``). A pass that
  changes nothing (most events, most ticks) only lists; so ``instances.list`` and
  ``instances.aggregatedList`` are GETs on google-auth's AuthorizedSession (what the REST transport
  sends them on), their JSON read as it comes, errors raised by google-api-core's
  ``from_http_response`` exactly as the transport raises them, and the client and its types are
  imported at a pass's first change (``v1``, ``ComputeEngine.instances``).
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from types import ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import requests
from google.api_core import exceptions as gexc
from google.api_core import retry as retries

from controller.adapters import reasons
from controller.adapters.lean import lean
from controller.core import audit, errors, names
from controller.service import fanout
from controller.core.ports import (PROVISIONING_MODELS, Instance, InstanceList, InstanceRequest, InstanceStatus,
                                   StopReason, Stopped, TpuRequest)

if TYPE_CHECKING:
    from google.cloud.compute_v1.services.instances import InstancesClient
    from google.cloud.compute_v1.services.zone_operations import ZoneOperationsClient
    from google.cloud.compute_v1.types import compute as compute_v1


def v1() -> ModuleType:
    """google-cloud-compute's message types (``compute_v1``), imported at the first call that
    needs one: a change, not a listing (see the module's docstring)."""
    lean("google.cloud.compute_v1")  # its submodules without the package's ~100 clients (see lean.py)
    from google.cloud.compute_v1.types import compute

    return compute


def instances_client(**kwargs: Any) -> InstancesClient:
    """google-cloud-compute's InstancesClient, built with ``kwargs`` (imported here, see ``v1``)."""
    lean("google.cloud.compute_v1")
    from google.cloud.compute_v1.services.instances import InstancesClient

    return InstancesClient(**kwargs)


def clients(**kwargs: Any) -> tuple[InstancesClient, ZoneOperationsClient]:
    """The two v1 clients a change needs, built with ``kwargs``."""
    lean("google.cloud.compute_v1")
    from google.cloud.compute_v1.services.zone_operations import ZoneOperationsClient

    return instances_client(**kwargs), ZoneOperationsClient(**kwargs)

MANAGED_FILTER = 'labels.respawn-managed = "true"'
# The API version google-cloud-compute's clients send (``to_api_version_header`` in each method of
# services/instances/client.py), sent by the listings too: tests/unit/test_lean.py keeps them equal.
API_VERSION = "2026-09-01"


def shard_filter(index: int, shards: int) -> str | None:
    """The filter of one shard's VMs (None: K = 1, every managed VM): a regular expression on the
    shard label (names.shard_label), one field alone. compute.v1's ``filter`` reference: the two
    kinds of expression (AIP-160's ``=``, the regular expressions' ``eq``) "cannot be mixed in one
    request", and "you cannot combine constraints on multiple fields using regular expressions";
    so the managed label is not in it, and the caller keeps only managed VMs."""
    if shards == 1:
        return None
    return f"labels.{names.SHARD_LABEL} eq '{names.shard_suffix(index, shards)}'"
# Every field ``_instance`` reads of a listed instance, and of a page what the listing reads (the
# scope's warning, the zones that did not answer, the next page): checked against compute.v1.json's
# names by tests/contract/test_fields.py.
_INSTANCE_FIELDS = "name,status,labels,creationTimestamp,id"
LIST_FIELDS = f"items({_INSTANCE_FIELDS}),nextPageToken"
AGGREGATED_FIELDS = f"items/*/instances({_INSTANCE_FIELDS}),items/*/warning/code,nextPageToken,unreachables"
GO_FIELDS = "metadata"  # all the go reads of the instance it releases
_MASK = "x-goog-fieldmask"  # the REST transport sends metadata pairs as HTTP headers
_ZONE_LISTS = 8  # zonal lists of one job's zones sent side by side (a spec names a few zones)
_CAPACITY = ("ZONE_RESOURCE_POOL_EXHAUSTED", "insufficientCapacity", "STOCKOUT", "does not have enough resources")
_QUOTA = ("QUOTA_EXCEEDED", "quotaExceeded", "Quota '")
_RATE = ("rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED")
# RetryError: RETRY gave up; RequestException: no answer at all (connection refused, read timeout).
_LIBRARY = (gexc.GoogleAPIError, requests.exceptions.RequestException)
_TRANSIENT = (gexc.TooManyRequests, gexc.InternalServerError, gexc.BadGateway, gexc.ServiceUnavailable,
              gexc.GatewayTimeout, gexc.DeadlineExceeded)
# Compute's own records of why an instance stopped (zone operation types).
_REASONS = {
    **audit.LOSSES,  # the system events, as their audit entries name them
    "stop": StopReason.STOPPED,
    "suspend": StopReason.STOPPED,
    "delete": StopReason.STOPPED,
}
_STARTS = ("insert", "bulkInsert", "start", "resume")
# When several causes were recorded, the platform's beats a person's, which beats the
# guest's own shutdown: a preempted or stopped guest powers itself off too.
_PRECEDENCE = {StopReason.PREEMPTED: 0, StopReason.MAINTENANCE: 0, StopReason.HOST_ERROR: 0,
               StopReason.STOPPED: 1, StopReason.CRASHED: 2}
# The field a project without the Preview refuses (JSON and proto spellings).
_NOTICE_FIELD = ("preemptionNoticeDuration", "preemption_notice_duration")
GO = "respawn-go"  # the go's instance attribute: never written over once there (ComputeGateway.release)
_METADATA_RACES = 5  # setMetadata refused on a stale fingerprint: read again and retried this often


def _text(e: gexc.GoogleAPICallError) -> str:
    reasons = " ".join(str(x.get("reason", "")) + " " + str(x.get("message", ""))
                       for x in (e.errors or []) if isinstance(x, dict))
    return f"{e.message} {e.reason or ''} {reasons}"


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


def translate(e: Exception, zone: str, *, creating: bool = False) -> errors.RespawnError:
    """A library error as one of the project's. ``creating``: the answer to an insert, where
    a 404 names something the request refers to (zone, image, machine type), not a VM."""
    if not isinstance(e, gexc.GoogleAPICallError):  # no answer, or RETRY gave up on transient ones
        return errors.TransientError(reasons.reason(e))
    text = _text(e)
    if _retryable(e):  # still failing after RETRY gave up: rate limits, 5xx
        return errors.TransientError(reasons.message(e))
    if any(m in text for m in _CAPACITY):
        return errors.CapacityError(zone, next(m for m in _CAPACITY if m in text))
    if any(m in text for m in _QUOTA):
        return errors.QuotaError(zone, _quota_named(text))
    if isinstance(e, gexc.BadRequest) and any(f in text for f in _NOTICE_FIELD):
        return errors.NoticeRefused(zone, reasons.message(e))
    if isinstance(e, gexc.Conflict):
        return errors.AlreadyExists(reasons.message(e))
    if isinstance(e, gexc.NotFound) and not creating:
        return errors.NotFound(reasons.message(e))
    return errors.RequestError(reasons.message(e))


class Listing:
    """``instances.list`` and ``instances.aggregatedList`` without google-cloud-compute (see the
    module's docstring): GETs on ``session`` (an AuthorizedSession, or the local cloud's anonymous
    one) at ``host``, each page read as the JSON it is, each with the partial response's
    ``fields``; a refusal raised as the client raises it (``from_http_response``), retried by
    ``RETRY`` as the client's calls are. ``page_size``: ``maxResults`` (None: Compute's 500).

    As the client sends them: the API version its clients pin (``API_VERSION``) and its list
    methods' 600 s timeout (``default_timeout`` in transports/base.py). Not as the client: the host
    is the one given (google.py: ``compute.googleapis.com`` or the local cloud's), never an mTLS
    endpoint or another universe's (the client derives those from the environment)."""

    def __init__(self, session: requests.Session, host: str, timeout: float = 600.0,
                 page_size: int | None = None) -> None:
        self.session = session
        self.host = host.rstrip("/") if "://" in host else f"https://{host.rstrip('/')}"
        self.timeout = timeout
        self.page_size = page_size

    def zone(self, project: str, zone: str, expr: str) -> Iterator[dict[str, Any]]:
        """Each instance of ``project`` in ``zone`` that ``expr`` keeps, as Compute's JSON."""
        for page in self._pages(f"projects/{quote(project, safe='')}/zones/{quote(zone, safe='')}/instances",
                                {"filter": expr, "fields": LIST_FIELDS}):
            yield from page.get("items", ())

    def aggregated(self, project: str, expr: str) -> Iterator[dict[str, Any]]:
        """Each page of ``project``'s aggregated list: ``items`` by scope (``zones/<zone>``), ``unreachables``."""
        yield from self._pages(f"projects/{quote(project, safe='')}/aggregated/instances",
                               {"filter": expr, "fields": AGGREGATED_FIELDS})

    def _pages(self, path: str, params: dict[str, str]) -> Iterator[dict[str, Any]]:
        if self.page_size is not None:
            params = {**params, "maxResults": str(self.page_size)}
        token = ""
        while True:
            page: dict[str, Any] = RETRY(self._get)(path, {**params, **({"pageToken": token} if token else {})})
            yield page
            if not (token := page.get("nextPageToken") or ""):
                return

    def _get(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        response = self.session.get(f"{self.host}/compute/v1/{path}", params=params, timeout=self.timeout,
                                    headers={"x-goog-api-version": API_VERSION})
        if response.status_code >= 400:
            raise gexc.from_http_response(response)  # what the client's REST transport raises
        return response.json()  # type: ignore[no-any-return]


class ComputeEngine:
    """The port: listings on ``listing``; changes on the v1 clients ``clients()`` builds at the
    first change (``instances``, ``zone_ops``). ``beta`` builds google-cloud-compute-v1beta's
    InstancesClient (``compute_beta``), at the first insert that asks for a preemption notice."""

    def __init__(self, listing: Listing, clients: Callable[[], tuple[InstancesClient, ZoneOperationsClient]],
                 operation_timeout: float = 180.0, beta: Callable[[], Any] | None = None) -> None:
        self.listing = listing
        self.operation_timeout = operation_timeout
        self._clients_factory = clients
        self._clients: tuple[InstancesClient, ZoneOperationsClient] | None = None
        self._beta_factory = beta
        self._beta: Any = None
        self._lock = threading.Lock()
        self._beta_lock = threading.Lock()

    @property
    def instances(self) -> InstancesClient:
        return self._built()[0]

    @instances.setter
    def instances(self, client: InstancesClient) -> None:
        self._clients = (client, self._built()[1])

    @property
    def zone_ops(self) -> ZoneOperationsClient:
        return self._built()[1]

    def _built(self) -> tuple[InstancesClient, ZoneOperationsClient]:
        with self._lock:
            if self._clients is None:
                self._clients = self._clients_factory()
            return self._clients

    def list_managed(self, projects: Sequence[str], job: str | None = None,
                     zones: Sequence[str] | None = None, shard: tuple[int, int] | None = None) -> InstanceList:
        if job is not None and (problem := names.job_name_problem(job)):
            raise errors.RequestError(problem)  # never put into a filter expression
        expr = MANAGED_FILTER if job is None else f'({MANAGED_FILTER}) AND (labels.respawn-job = "{job}")'
        if shard is not None and job is None and (by_shard := shard_filter(*shard)) is not None:
            found = self._listed(projects, zones, by_shard)
            # The shard filter names the shard label alone: the managed label is checked here.
            return replace(found, instances=[i for i in found.instances if i.managed])
        return self._listed(projects, zones, expr)

    def _listed(self, projects: Sequence[str], zones: Sequence[str] | None, expr: str) -> InstanceList:
        if zones is not None:
            return self._list_zones(projects, zones, expr)
        found: list[Instance] = []
        unreachable: list[str] = []
        failed: dict[str, str] = {}
        for project in projects:
            try:
                listed: list[Instance] = []
                for page in self.listing.aggregated(project, expr):
                    unreachable += [u.removeprefix("zones/") for u in page.get("unreachables", ())]
                    for scope, scoped in page.get("items", {}).items():
                        zone = scope.removeprefix("zones/")
                        if (scoped.get("warning") or {}).get("code") == "UNREACHABLE":
                            unreachable.append(zone)  # "A given scope cannot be reached": not seen, not empty
                        listed += [_instance(project, zone, i) for i in scoped.get("instances", ())]
                found += listed
            except _LIBRARY as e:  # one project's trouble (a typo, no IAM) blinds only its jobs
                failed[project] = str(translate(e, "*"))
        return InstanceList(found, sorted(set(unreachable)), failed)

    def _list_zones(self, projects: Sequence[str], zones: Sequence[str], expr: str) -> InstanceList:
        """``instances.list`` in each zone, side by side: a tenth of an aggregated list's time."""
        def one(where: tuple[str, str]) -> tuple[list[Instance], str | None, tuple[str, str] | None]:
            """(instances, the zone if it could not be seen, (project, why) if the project refused)."""
            project, zone = where
            try:
                return [_instance(project, zone, i) for i in self.listing.zone(project, zone, expr)], None, None
            except gexc.NotFound:  # no such zone: nothing of ours can be there
                return [], None, None
            except _LIBRARY as e:
                error = translate(e, zone)
                if isinstance(error, errors.TransientError):
                    return [], zone, None  # not seen, as an aggregated list's unreachables
                return [], None, (project, str(error))

        results = fanout.each([(p, z) for p in projects for z in zones], one, workers=_ZONE_LISTS)
        return InstanceList([i for listed, _, _ in results for i in listed],
                            sorted({zone for _, zone, _ in results if zone}),
                            dict(refusal for _, _, refusal in results if refusal))

    def insert(self, requests_: Sequence[InstanceRequest], request_id: str, wait: float | None = None) -> dict[str, str]:
        compute_v1 = v1()
        first = requests_[0]
        if len({(r.project, r.zone) for r in requests_}) != 1:
            raise errors.RequestError("a gang must be inserted in a single zone of one project")
        # A notice is Spot's alone (Compute refuses it on other models); 0 is none, never sent.
        notice = first.preemption_notice_s if first.spot else 0
        try:
            if notice > 0:
                from controller.adapters import compute_beta

                body = instance_body(first) if len(requests_) == 1 else bulk_body(requests_)
                op = compute_beta.insert(self._beta_instances(), body, first.project, first.zone, request_id,
                                         notice, RETRY)
            elif len(requests_) == 1:
                op = self.instances.insert_unary(request=compute_v1.InsertInstanceRequest(
                    project=first.project, zone=first.zone, request_id=request_id,
                    instance_resource=instance_body(first)), retry=RETRY)
            else:
                op = self.instances.bulk_insert_unary(request=compute_v1.BulkInsertInstanceRequest(
                    project=first.project, zone=first.zone, request_id=request_id,
                    bulk_insert_instance_resource_resource=bulk_body(requests_)), retry=RETRY)
        except _LIBRARY as e:
            error = translate(e, first.zone, creating=True)
            if isinstance(error, errors.AlreadyExists):
                return {}  # an earlier try with this very request, or another pass, got there: success
            raise error from e
        # An insert's operation names its instance from the start (a bulkInsert's names none).
        target = str(op.target_id) if len(requests_) == 1 and op.target_id else ""
        wait = self.operation_timeout if wait is None else wait
        op = self._wait(first.project, first.zone, op, wait)
        if not _done(op):
            raise errors.OperationPending(
                f"{op.operation_type or 'insert'} of {', '.join(r.name for r in requests_)} in {first.zone} still "
                f"running after {wait:g}s (operation {op.name}); its outcome is read on the next try")
        try:
            _raise_for(op, first.zone)
        except errors.AlreadyExists:
            return {}
        return {first.name: target} if target else {}

    def delete(self, project: str, zone: str, name: str) -> None:
        """Returns once Compute accepted the delete, without waiting for its operation.

        A delete's operation runs as long as the guest's shutdown (30 s on Spot), and
        nothing in a pass needs its end: the planner waits for the VM to be gone on later
        passes, and a delete that fails after being accepted leaves a VM that the next pass
        sees and deletes again. Errors Compute reports at once are raised.
        """
        try:
            op = self.instances.delete_unary(project=project, zone=zone, instance=name, retry=RETRY)
        except _LIBRARY as e:
            raise translate(e, zone) from e
        _raise_for(op, zone)

    def release(self, project: str, zone: str, name: str, items: Mapping[str, str],
                wait: float | None = None) -> bool:
        """The go: ``items`` merged into the instance's metadata by one ``setMetadata`` on the
        fingerprint just read; never over a go already there (False). A write refused on a stale
        fingerprint (someone else's came between) is read again and retried."""
        compute_v1 = v1()
        for _ in range(_METADATA_RACES):
            try:
                current = self.instances.get(project=project, zone=zone, instance=name, retry=RETRY,
                                             metadata=[(_MASK, GO_FIELDS)])
            except _LIBRARY as e:
                raise translate(e, zone) from e
            there = {i.key: i.value for i in current.metadata.items}
            if GO in there:
                return False  # a go once given is never changed
            merged = compute_v1.Metadata(fingerprint=current.metadata.fingerprint, items=[
                compute_v1.Items(key=k, value=v) for k, v in {**there, **items}.items()])
            # One request id per write: a retry after a lost answer is answered with its operation,
            # not refused on the fingerprint it changed itself.
            request = compute_v1.SetMetadataInstanceRequest(project=project, zone=zone, instance=name,
                                                            metadata_resource=merged, request_id=str(uuid.uuid4()))
            try:
                op = self.instances.set_metadata_unary(request=request, retry=RETRY)
            except gexc.PreconditionFailed:
                continue  # conditionNotMet: the metadata changed since it was read
            except _LIBRARY as e:
                raise translate(e, zone) from e
            wait = self.operation_timeout if wait is None else wait
            op = self._wait(project, zone, op, wait)
            if not _done(op):
                raise errors.OperationPending(f"setMetadata of {name} in {zone} still running after {wait:g}s "
                                              f"(operation {op.name})")
            _raise_for(op, zone)
            return True
        raise errors.TransientError(f"the metadata of {name} in {zone} changed under each of {_METADATA_RACES} writes")

    def stopped(self, project: str, zone: str, name: str) -> Stopped:
        """Compute's own record of what stopped this instance, among the stop-causing
        operations since it last started: the platform's cause (preemption, maintenance, host
        error) beats a person's stop or delete, which beats the guest's own shutdown (a
        preempted guest powers itself off too; a preempted husk we then delete was preempted)."""
        return stopped(self.zone_ops, project, zone, name)

    def _beta_instances(self) -> Any:
        with self._beta_lock:
            if self._beta is None:
                if self._beta_factory is None:
                    raise errors.ConfigError("no beta Compute client to ask for a preemption notice with")
                self._beta = self._beta_factory()
            return self._beta

    # -- operations -----------------------------------------------------------------
    def _wait(self, project: str, zone: str, op: compute_v1.Operation, seconds: float) -> compute_v1.Operation:
        """The operation once DONE, or as it stands after ``seconds`` (not DONE)."""
        deadline = time.monotonic() + seconds
        while not _done(op) and (left := deadline - time.monotonic()) > 0:
            try:
                # zoneOperations.wait answers when the operation is done or after about two
                # minutes; the client-side timeout cuts it short at our own deadline.
                op = self.zone_ops.wait(project=project, zone=zone, operation=op.name,
                                        retry=RETRY.with_timeout(left), timeout=left)
            except requests.exceptions.Timeout:
                continue
            except _LIBRARY as e:
                raise translate(e, zone) from e
        return op


def stopped(zone_ops: ZoneOperationsClient, project: str, zone: str, name: str) -> Stopped:
    """``ComputeEngine.stopped`` on a zone operations client (TPU slices in Compute Engine ask too).
    When: the first operation of the winning cause since the last start, by its ``startTime``
    (its ``insertTime`` where it has none)."""
    request = v1().ListZoneOperationsRequest(project=project, zone=zone, filter=f'targetLink eq ".*/instances/{name}"')
    try:
        ops = list(zone_ops.list(request=request, retry=RETRY))
    except _LIBRARY as e:
        raise translate(e, zone) from e
    ops = sorted((op for op in ops if op.target_link.endswith(f"/instances/{name}")), key=_inserted)
    starts = [i for i, op in enumerate(ops) if op.operation_type in _STARTS]
    since = ops[starts[-1] + 1 :] if starts else ops
    causes = [(_REASONS[op.operation_type], op) for op in since if op.operation_type in _REASONS]
    if not causes:
        return Stopped()
    reason, op = min(causes, key=lambda c: _PRECEDENCE[c[0]])  # the first of the strongest: min is stable
    return Stopped(reason, _stamp(op.start_time) or _stamp(op.insert_time))


def _done(op: compute_v1.Operation) -> bool:
    return bool(op.status == v1().Operation.Status.DONE)


def _inserted(op: compute_v1.Operation) -> datetime:
    return _stamp(op.insert_time) or datetime.min.replace(tzinfo=timezone.utc)


def _stamp(text: str) -> datetime | None:
    """An operation's RFC 3339 time, in UTC; None where it is empty or unreadable (never a pass's
    failure). Compute writes them in Pacific time ("2026-11-29T23:37:48.123-08:00"): kept as given,
    a status printed its hour eight hours off the rest."""
    try:
        at = datetime.fromisoformat(text) if text else None
    except ValueError:
        return None
    if at is None:
        return None
    return at.astimezone(timezone.utc) if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)


# Compute's synchronous quota refusal names the quota and where it counts: "Quota
# 'NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region us-central1." (or "... globally.").
_QUOTA_MESSAGE = re.compile(r"Quota '([A-Z0-9_-]+)' exceeded\.\s*Limit: ([0-9.]+) (in (?:region|zone) [a-z0-9-]+|globally)")


def _quota_named(text: str) -> str:
    """QUOTA_EXCEEDED, with the quota, its limit and its scope where Compute's message says them."""
    found = _QUOTA_MESSAGE.search(text)
    if not found:
        return "QUOTA_EXCEEDED"
    name, limit, where = found.groups()
    return f"QUOTA_EXCEEDED ({name}, limit {float(limit):g} {where})"


def _raise_for(op: compute_v1.Operation, zone: str) -> None:
    """A DONE operation that failed, as one of the project's errors; nothing if it succeeded."""
    if not _done(op) or not op.error.errors:
        return
    codes = [e.code for e in op.error.errors]
    message = "; ".join(f"{e.code}: {e.message}" for e in op.error.errors)
    if any(any(m in c for m in _CAPACITY) for c in codes):
        raise errors.CapacityError(zone, next(c for c in codes if any(m in c for m in _CAPACITY)))
    quota = [(e.code, d.quota_info) for e in op.error.errors for d in e.error_details if d.quota_info.metric_name
             or d.quota_info.limit_name]
    if quota:
        code, info = quota[0]
        dims = dict(info.dimensions)
        where = f" in region {dims['region']}" if "region" in dims else f" in zone {dims['zone']}" if "zone" in dims else ""
        raise errors.QuotaError(zone, f"{code} ({info.metric_name or info.limit_name}, limit {info.limit:g}{where})")
    if any("QUOTA" in c or "RATE_LIMIT" in c for c in codes):
        raise errors.QuotaError(zone, next(c for c in codes if "QUOTA" in c or "RATE_LIMIT" in c))
    if any(c in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS") for c in codes):
        raise errors.AlreadyExists(message)
    if op.http_error_status_code == 400 and any(f in message for f in _NOTICE_FIELD):
        raise errors.NoticeRefused(zone, message)
    status = op.http_error_status_code
    if status == 429 or status >= 500:
        raise errors.TransientError(message)
    raise errors.RequestError(message)


def _instance(project: str, zone: str, i: Mapping[str, Any]) -> Instance:
    """A listed instance, from Compute's JSON (its id a uint64, which JSON carries as a string)."""
    return Instance(project=project, zone=zone, name=i["name"], status=InstanceStatus.of(i.get("status", "")),
                    labels=dict(i.get("labels") or {}), created_at=datetime.fromisoformat(i["creationTimestamp"]),
                    id=str(i.get("id", "0")))


def _typed(zone_prefix: str, kind: str, name: str) -> str:
    """A type's name as an Instance takes it (``zones/Z/<kind>/<name>``), or bare in InstanceProperties."""
    return f"{zone_prefix}{kind}/{name}" if zone_prefix else name


def instance_properties(r: InstanceRequest | TpuRequest, zone_prefix: str, *, machine_type: str,
                        labels: Mapping[str, str], spot_action: str, accelerators: Sequence[Any] = ()) -> dict[str, Any]:
    """The fields of an Instance (``zone_prefix`` ``zones/Z/``) or of InstanceProperties (a gang's or an
    instance template's: bare type names, ``zone_prefix`` empty), for a VM (``_common``) or a TPU slice's
    host (``tpu_compute``). What differs between the two is given: the machine type, the labels, what a
    preempted Spot instance becomes (``instanceTerminationAction``), the GPUs attached."""
    compute_v1 = v1()
    nic = compute_v1.NetworkInterface(network=r.network)
    if r.subnetwork:
        nic.subnetwork = r.subnetwork
    if r.external_ip:
        nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
    return dict(
        machine_type=_typed(zone_prefix, "machineTypes", machine_type),
        labels=dict(labels),
        metadata=compute_v1.Metadata(items=[compute_v1.Items(key=k, value=v) for k, v in r.metadata.items()]),
        disks=[compute_v1.AttachedDisk(boot=True, auto_delete=True, initialize_params=compute_v1.AttachedDiskInitializeParams(
            source_image=r.boot_image, disk_size_gb=r.boot_disk_gb,
            disk_type=_typed(zone_prefix, "diskTypes", r.boot_disk_type)))],
        network_interfaces=[nic],
        service_accounts=[compute_v1.ServiceAccount(email=r.service_account, scopes=list(r.scopes))],
        tags=compute_v1.Tags(items=list(r.tags)),
        guest_accelerators=list(accelerators),
        scheduling=_scheduling(r, spot_action),
    )


def _scheduling(r: InstanceRequest | TpuRequest, spot_action: str) -> compute_v1.Scheduling:
    compute_v1 = v1()
    # GPUs and TPUs cannot live-migrate; and respawn, not Compute, decides when to bring a VM back.
    scheduling = compute_v1.Scheduling(on_host_maintenance="TERMINATE", automatic_restart=False,
                                       provisioning_model=PROVISIONING_MODELS[r.provisioning])
    if r.provisioning == "spot":
        scheduling.instance_termination_action = spot_action
    elif r.provisioning == "flex-start":
        # Compute requires both for FLEX_START: a bounded run, and deletion when it ends.
        scheduling.instance_termination_action = "DELETE"
        scheduling.max_run_duration = compute_v1.Duration(seconds=r.max_run_seconds or 0)
    return scheduling


def _common(r: InstanceRequest, zone_prefix: str) -> dict[str, Any]:
    """A VM's fields, shared by an Instance and bulk InstanceProperties (which take bare type names)."""
    compute_v1 = v1()
    accelerators = []
    if r.accelerator_type:
        accelerators = [compute_v1.AcceleratorConfig(
            accelerator_type=_typed(zone_prefix, "acceleratorTypes", r.accelerator_type),
            accelerator_count=r.accelerator_count)]
    return instance_properties(r, zone_prefix, machine_type=r.machine_type, labels=r.labels,
                               spot_action=r.termination_action.upper(), accelerators=accelerators)


def instance_body(r: InstanceRequest) -> compute_v1.Instance:
    compute_v1 = v1()
    return compute_v1.Instance(name=r.name, **_common(r, f"zones/{r.zone}/"))


def bulk_body(rs: Sequence[InstanceRequest]) -> compute_v1.BulkInsertInstanceResource:
    """A gang for the *zonal* bulkInsert: all ``count`` instances or none (``minCount``).

    bulkInsert gives every instance the same properties (which take bare type names), so
    nodes differ only by name; the VM reads its rank from its name's ``-n<rank>``.
    """
    compute_v1 = v1()
    return compute_v1.BulkInsertInstanceResource(
        count=len(rs),
        min_count=len(rs),
        instance_properties=compute_v1.InstanceProperties(**_common(rs[0], "")),
        per_instance_properties={r.name: compute_v1.BulkInsertInstanceResourcePerInstanceProperties(name=r.name) for r in rs},
    )
