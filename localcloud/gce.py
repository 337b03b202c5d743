"""How Compute Engine shapes its resources: instances, operations, errors, URLs, times.

Pure functions from request bodies to the dicts the real API returns, so the server
module can stay about state and time.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import secrets
import time
import uuid
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from localcloud.filters import FilterError, compile_filter

_NAME_RE = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
_LABEL_KEY = re.compile(r"[a-z][-_a-z0-9]{0,62}")
_LABEL_VALUE = re.compile(r"[-_a-z0-9]{0,63}")
_METADATA_KEY = re.compile(r"[a-zA-Z0-9-_]{1,128}")
_ids = itertools.count(int(time.time() * 1000) * 1000)
try:  # Google stamps resources in Pacific time, e.g. 2024-06-26T11:42:22.006-07:00
    _TZ: Any = ZoneInfo("America/Los_Angeles")
except Exception:  # noqa: BLE001 - no tzdata on this machine
    _TZ = None


class ApiError(Exception):
    """An HTTP error answered in Google's JSON error shape."""

    def __init__(self, code: int, message: str, reason: str, *, domain: str = "global",
                 details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.reason = code, message, reason
        self.domain, self.details = domain, details

    def body(self) -> dict[str, Any]:
        status = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 409: "ALREADY_EXISTS",
                  412: "FAILED_PRECONDITION", 429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE"}.get(self.code, "UNKNOWN")
        error: dict[str, Any] = {"code": self.code, "message": self.message, "status": status,
                                 "errors": [{"message": self.message, "domain": self.domain, "reason": self.reason}]}
        if self.details:
            error["details"] = self.details
        return {"error": error}


def not_found(path: str) -> ApiError:
    return ApiError(404, f"The resource '{path}' was not found", "notFound")


def invalid(field: str, value: Any, why: str) -> ApiError:
    return ApiError(400, f"Invalid value for field '{field}': '{value}'. {why}", "invalid")


def now() -> str:
    moment = datetime.now(_TZ).astimezone(_TZ) if _TZ else datetime.now().astimezone()
    return moment.isoformat(timespec="milliseconds")


def new_id() -> str:
    return str(next(_ids))


class Urls:
    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/") + "/compute/v1/"

    def zone(self, project: str, zone: str) -> str:
        return f"{self.base}projects/{project}/zones/{zone}"

    def region(self, project: str, region: str) -> str:
        return f"{self.base}projects/{project}/regions/{region}"

    def instance(self, project: str, zone: str, name: str) -> str:
        return f"{self.zone(project, zone)}/instances/{name}"

    def absolute(self, project: str, zone: str, ref: str, kind: str) -> str:
        """Expand a partial URL (``zones/z/machineTypes/n1``, a bare name) the way the API does."""
        if ref.startswith("http"):
            return ref
        if ref.startswith("projects/"):
            return self.base + ref
        if ref.startswith(("zones/", "global/", "regions/")):
            return f"{self.base}projects/{project}/{ref}"
        return f"{self.zone(project, zone)}/{kind}/{ref}"


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def check_instance(body: dict[str, Any], zone: str, field: str = "resource") -> None:
    """The semantic checks Compute makes on an instance before accepting an insert."""
    name = body.get("name", "")
    if not _NAME_RE.fullmatch(name or ""):
        raise invalid(f"{field}.name", name, "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'")
    properties_check(body, zone, field)


def properties_check(body: dict[str, Any], zone: str | None, field: str) -> None:
    machine = body.get("machineType", "")
    if not machine:
        raise invalid(f"{field}.machineType", machine, "The machine type must be specified.")
    if zone and "/zones/" in f"/{machine}" and f"zones/{zone}/" not in machine:
        raise invalid(f"{field}.machineType", machine, f"Machine type must be in zone {zone}.")
    disks = body.get("disks") or []
    boot = [d for d in disks if d.get("boot")]
    if len(boot) != 1:
        raise ApiError(400, "Exactly one boot disk must be specified.", "invalid")
    if not (boot[0].get("source") or (boot[0].get("initializeParams") or {}).get("sourceImage")):
        raise invalid(f"{field}.disks[0].initializeParams.sourceImage", "", "A boot disk needs a source image or disk.")
    if not body.get("networkInterfaces"):
        raise ApiError(400, "At least one network interface is required.", "invalid")
    scheduling = body.get("scheduling") or {}
    if body.get("guestAccelerators") and scheduling.get("onHostMaintenance", "MIGRATE") != "TERMINATE":
        raise invalid(f"{field}.scheduling.onHostMaintenance", scheduling.get("onHostMaintenance", "MIGRATE"),
                      "Instances with guest accelerators do not support live migration.")
    if scheduling.get("provisioningModel") == "FLEX_START":
        # Flex-start VMs run for a bounded time and are deleted when it ends.
        if not (scheduling.get("maxRunDuration") or {}).get("seconds"):
            raise invalid(f"{field}.scheduling.maxRunDuration", "", "Flex-start instances require maxRunDuration.")
        if scheduling.get("instanceTerminationAction") != "DELETE":
            raise invalid(f"{field}.scheduling.instanceTerminationAction", scheduling.get("instanceTerminationAction", ""),
                          "Flex-start instances require instanceTerminationAction DELETE.")
    check_notice(scheduling, f"{field}.scheduling")
    spot = scheduling.get("provisioningModel") == "SPOT" or scheduling.get("preemptible")
    if spot and scheduling.get("automaticRestart", True):
        raise invalid(f"{field}.scheduling.automaticRestart", "true",
                      "Spot and preemptible instances cannot be set to restart automatically.")
    for key, value in (body.get("labels") or {}).items():
        if not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
            raise invalid(f"{field}.labels", f"{key}={value}", "Label keys and values must be lowercase letters, "
                          "digits, '-' or '_', at most 63 characters.")
    check_metadata((body.get("metadata") or {}).get("items") or [], f"{field}.metadata")


# scheduling.preemptionNoticeDuration (Preview since 2026-04-16; in the v1 and beta discovery
# documents of revision 20261106, absent from google-cloud-compute 1.57's v1 protos): how long
# before the ACPI soft-off the metadata server's ``instance/preempted`` turns TRUE. Google's
# rules: Spot VMs only, and only 0 (none, the default) or 120 seconds.
NOTICE_FIELD = "preemptionNoticeDuration"
NOTICE_CHOICES = (0, 120)


def notice_seconds(scheduling: dict[str, Any]) -> float:
    """The notice an instance (or a request) asks for, in seconds (0: none)."""
    duration = scheduling.get(NOTICE_FIELD) or {}
    return int(duration.get("seconds") or 0) + int(duration.get("nanos") or 0) / 1e9


def check_notice(scheduling: dict[str, Any], at: str) -> None:
    """Google's rules for ``scheduling.preemptionNoticeDuration`` (the schema already made its
    ``seconds`` an int64 and its ``nanos`` an int32)."""
    if scheduling.get(NOTICE_FIELD) is None:
        return
    seconds, field, told = notice_seconds(scheduling), f"{at}.{NOTICE_FIELD}", _duration(scheduling[NOTICE_FIELD])
    if seconds not in NOTICE_CHOICES:
        raise invalid(field, told, "Preemption notice duration must be 0s or 120s.")
    # A zero notice is no notice: taken whatever the model (Google documents only non-zero ones as Spot-only).
    if seconds and scheduling.get("provisioningModel") != "SPOT":
        raise invalid(field, told, "Preemption notice duration is only supported for Spot VMs (provisioningModel SPOT).")


def notice_refused(at: str, scheduling: dict[str, Any]) -> ApiError:
    """A non-zero notice in a project the Preview is not open to (the ``refuse_notice`` fault)."""
    return invalid(f"{at}.scheduling.{NOTICE_FIELD}", _duration(scheduling[NOTICE_FIELD]),
                   "Preemption notice duration is not supported for this project.")


def _duration(value: dict[str, Any]) -> str:
    """A Duration as its JSON text (``"120s"``, ``"0.5s"``)."""
    seconds, nanos = int(value.get("seconds") or 0), int(value.get("nanos") or 0)
    return f"{seconds}.{nanos:09d}".rstrip("0") + "s" if nanos else f"{seconds}s"


def _normal_duration(value: dict[str, Any]) -> dict[str, Any]:
    """A Duration as the API answers it: ``seconds`` an int64 string, ``nanos`` only when set."""
    out: dict[str, Any] = {"seconds": str(int(value.get("seconds") or 0))}
    return {**out, "nanos": int(value["nanos"])} if value.get("nanos") else out


def instance_resource(body: dict[str, Any], project: str, zone: str, urls: Urls) -> dict[str, Any]:
    """The instance as ``instances.get`` returns it, right after an accepted insert."""
    name = body["name"]
    scheduling = {"onHostMaintenance": "MIGRATE", "automaticRestart": True, "preemptible": False,
                  "provisioningModel": "STANDARD", **(body.get("scheduling") or {})}
    for key in ("preemptionNoticeDuration", "maxRunDuration"):
        if isinstance(scheduling.get(key), dict):
            scheduling[key] = _normal_duration(scheduling[key])
    disks = []
    for index, disk in enumerate(body.get("disks") or []):
        params = disk.get("initializeParams") or {}
        disk_name = params.get("diskName") or (name if disk.get("boot") else f"{name}-{index}")
        disks.append({"kind": "compute#attachedDisk", "type": "PERSISTENT", "mode": "READ_WRITE",
                      "source": f"{urls.zone(project, zone)}/disks/{disk_name}", "deviceName": f"persistent-disk-{index}",
                      "index": index, "boot": bool(disk.get("boot")), "autoDelete": disk.get("autoDelete", True),
                      "interface": "SCSI", "diskSizeGb": str(params.get("diskSizeGb", 10)), "architecture": "X86_64"})
    nics = []
    for index, nic in enumerate(body.get("networkInterfaces") or []):
        out = {"kind": "compute#networkInterface", "name": f"nic{index}", "stackType": "IPV4_ONLY",
               "network": urls.absolute(project, zone, nic.get("network", "global/networks/default"), "networks"),
               "networkIP": f"10.128.0.{next(_ids) % 250 + 2}", "fingerprint": _fingerprint()}
        if nic.get("subnetwork"):
            out["subnetwork"] = urls.absolute(project, zone, nic["subnetwork"], "subnetworks")
        if nic.get("accessConfigs"):
            out["accessConfigs"] = [{"kind": "compute#accessConfig", "type": "ONE_TO_ONE_NAT", "name": "External NAT",
                                     "natIP": f"34.1.{index}.{next(_ids) % 250 + 2}", "networkTier": "PREMIUM"}]
        nics.append(out)
    resource = {
        "kind": "compute#instance",
        "id": new_id(),
        "creationTimestamp": now(),
        "name": name,
        "tags": {"items": list((body.get("tags") or {}).get("items", [])), "fingerprint": _fingerprint()},
        "machineType": urls.absolute(project, zone, body["machineType"], "machineTypes"),
        "status": "PROVISIONING",
        "zone": urls.zone(project, zone),
        "canIpForward": bool(body.get("canIpForward", False)),
        "networkInterfaces": nics,
        "disks": disks,
        "metadata": metadata(list((body.get("metadata") or {}).get("items", []))),
        "serviceAccounts": list(body.get("serviceAccounts") or []),
        "selfLink": urls.instance(project, zone, name),
        "scheduling": scheduling,
        "cpuPlatform": "Unknown CPU Platform",
        "labels": dict(body.get("labels") or {}),
        "labelFingerprint": _fingerprint(),
        "startRestricted": False,
        "deletionProtection": False,
        "fingerprint": _fingerprint(),
    }
    if body.get("guestAccelerators"):
        resource["guestAccelerators"] = [
            {"acceleratorType": urls.absolute(project, zone, a["acceleratorType"], "acceleratorTypes"),
             "acceleratorCount": int(a.get("acceleratorCount", 1))} for a in body["guestAccelerators"]]
    if body.get("hostname"):
        resource["hostname"] = body["hostname"]
    return resource


def operation(kind: str, scope_url: str, scope_key: str, target: str, target_id: str, user: str) -> dict[str, Any]:
    stamp = int(time.time() * 1000)
    name = f"operation-{stamp}-{secrets.token_hex(7)[:13]}-{secrets.token_hex(4)}-{secrets.token_hex(4)}"
    op = {"kind": "compute#operation", "id": new_id(), "name": name, scope_key: scope_url,
          "operationType": kind, "targetLink": target, "targetId": target_id, "status": "PENDING",
          "user": user, "progress": 0, "insertTime": now(), "selfLink": f"{scope_url}/operations/{name}"}
    return {k: v for k, v in op.items() if v != ""}  # a bulk operation has no single target


def finish(op: dict[str, Any], error: ApiError | None = None, code: str | None = None,
           details: list[dict[str, Any]] | None = None) -> None:
    """Mark an operation DONE; a failed one keeps DONE and carries ``error`` + ``httpErrorStatusCode``
    (and ``errorDetails``, e.g. ``quotaInfo`` for a quota failure, where Google sends them)."""
    op.update(status="DONE", progress=100, endTime=now())
    op.setdefault("startTime", op["endTime"])
    if error is not None:
        entry: dict[str, Any] = {"code": code or error.reason.upper(), "message": error.message}
        if details:
            entry["errorDetails"] = details
        op["error"] = {"errors": [entry]}
        op["httpErrorStatusCode"] = error.code
        op["httpErrorMessage"] = {400: "BAD REQUEST", 403: "FORBIDDEN", 404: "NOT FOUND", 409: "CONFLICT",
                                  503: "SERVICE UNAVAILABLE"}.get(error.code, "ERROR")


def valid_request_id(value: str | None) -> bool:
    if value is None:
        return True
    try:
        return uuid.UUID(value) is not None and value != str(uuid.UUID(int=0))
    except ValueError:
        return False


def stockout(project: str, zone: str) -> ApiError:
    return ApiError(503, f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available to "
                         "fulfill the request.  Try a different zone, or try again later.", "ZONE_RESOURCE_POOL_EXHAUSTED")


def quota(region: str) -> ApiError:
    return ApiError(403, f"Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region {region}.", "QUOTA_EXCEEDED")


def quota_details(region: str) -> list[dict[str, Any]]:
    """``errorDetails`` of a failed operation's quota error (the discovery document's QuotaExceededInfo)."""
    return [{"quotaInfo": {"metricName": "compute.googleapis.com/nvidia_l4_gpus", "limitName": "NVIDIA-L4-GPUS-per-project-region",
                           "dimensions": {"region": region}, "limit": 0}}]


def insufficient_capacity(project: str, zone: str) -> ApiError:
    """bulkInsert's synchronous refusal when no zone it may use has room for ``minCount`` VMs."""
    return ApiError(503, f"Not enough resources available in 'projects/{project}/zones/{zone}' to fulfill the request. "
                         "Try a different zone, or try again later.", "insufficientCapacity")


# Compute's rate limits. Google documents both refusals below as HTTP 403 with
# ``errors[].reason`` ``rateLimitExceeded`` (domain ``usageLimits``), not 429:
# - rate quotas ("If your project exceeds a rate quota, you receive a 403 error with the
#   reason rateLimitExceeded", https://cloud.google.com/compute/api-quota);
# - concurrent (in-flight) operation limits (same 403 / rateLimitExceeded, with a
#   google.rpc.ErrorInfo detail whose reason is CONCURRENT_OPERATIONS_QUOTA_EXCEEDED,
#   https://cloud.google.com/compute/operations-quota).
# Not confirmed in Google's documentation: the figures (20 bulkInsert calls per second, 10 bulk
# operations in flight; Google's published rate quotas are per minute and per method group),
# the exact message of a rate-quota refusal, and the exact ``quotaLimit`` name for bulk inserts.
def rate_limited(project: str) -> ApiError:
    """A bulkInsert call beyond the project's request rate."""
    return ApiError(403, "Rate Limit Exceeded", "rateLimitExceeded", domain="usageLimits")


def concurrent_operations(project: str, region: str, operation_type: str) -> ApiError:
    """A bulkInsert beyond the project's bulk operations in flight (Google's concurrent operation limit)."""
    message = f"Quota on concurrent operations exceeded for project {project} in location {region}."
    return ApiError(403, message, "rateLimitExceeded", domain="usageLimits", details=[
        {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "CONCURRENT_OPERATIONS_QUOTA_EXCEEDED",
         "domain": "compute.googleapis.com",
         "metadata": {"containerType": "PROJECT", "containerId": project,
                      "quotaMetric": "compute.googleapis.com/regional_concurrent_operations",
                      "operationType": operation_type, "location": region}},
        {"@type": "type.googleapis.com/google.rpc.Help",
         "links": [{"description": "Concurrent operations quota documentation.",
                    "url": "https://cloud.google.com/compute/operations-quota#concurrent_operation_limits"}]}])


def unknown_machine_type(field: str, machine_type: str, zone: str) -> ApiError:
    name = machine_type.rsplit("/", 1)[-1]
    return invalid(field, machine_type, f"Machine type with name '{name}' does not exist in zone '{zone}'.")


def metadata(items: list[dict[str, Any]]) -> dict[str, Any]:
    """An instance's ``metadata`` as ``instances.get`` returns it, with its fingerprint."""
    return {"kind": "compute#metadata", "fingerprint": metadata_fingerprint(items), "items": items}


def metadata_fingerprint(items: list[dict[str, Any]]) -> str:
    """A digest of the items: Google's fingerprints are digests of what they cover (an unlabelled
    resource's ``labelFingerprint`` is ``42WmSpB8rSM=`` on every resource), so the same items
    give the same fingerprint, and any change a new one."""
    canonical = json.dumps([[i.get("key", ""), i.get("value", "")] for i in items]).encode()
    return base64.b64encode(hashlib.sha256(canonical).digest()[:8]).decode()


def check_metadata(items: list[dict[str, Any]], field: str) -> None:
    """What Compute checks of metadata items on an insert or a ``setMetadata``."""
    for index, item in enumerate(items):
        key = item.get("key", "")
        if not _METADATA_KEY.fullmatch(key):
            raise invalid(f"{field}.items[{index}].key", key, "Must be a match of regex '[a-zA-Z0-9-_]{1,128}'")
    if sum(len(i.get("key", "")) + len(i.get("value", "")) for i in items) > 512 * 1024:
        raise ApiError(400, "Metadata is larger than 512 KB.", "invalid")


def metadata_race() -> ApiError:
    """``setMetadata`` with a fingerprint that is not the instance's current one (or none): Google's
    optimistic lock refuses it, and the caller reads the instance again."""
    return ApiError(412, "Supplied fingerprint does not match current metadata fingerprint.", "conditionNotMet")


def _fingerprint() -> str:
    return secrets.token_urlsafe(8)[:11] + "="


def compile_list_filter(text: str | None) -> Any:
    """A list request's ``filter`` as a predicate; 400 for one Compute would refuse."""
    try:
        return compile_filter(text)
    except FilterError as e:
        raise ApiError(400, str(e), "invalid") from e


def filtered(items: list[dict[str, Any]], text: str | None) -> list[dict[str, Any]]:
    """The items a list request's ``filter`` keeps (400 for one Compute would refuse)."""
    predicate = compile_list_filter(text)
    return [i for i in items if predicate(i)]


def page(items: list[Any], q: Any) -> tuple[list[Any], str | None]:
    """One page of a list (``maxResults``, ``pageToken``) and the next page's token."""
    size = min(int(q.get("maxResults", 500)), 500)
    start = int(base64.urlsafe_b64decode(q["pageToken"]).decode()) if q.get("pageToken") else 0
    end = start + size
    token = base64.urlsafe_b64encode(str(end).encode()).decode() if end < len(items) else None
    return items[start:end], token
