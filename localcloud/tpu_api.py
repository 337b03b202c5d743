"""How Cloud TPU (v2) shapes its resources: accelerator types, nodes, operations, errors.

Pure functions from request bodies to the dicts the real API returns, so the server
module (``localcloud.tpu``) can stay about state and time. Cloud TPU is a one-platform
API: errors are ``google.rpc.Status`` JSON (``{"error": {"code", "message", "status",
"details"}}``, no ``errors[].reason`` as Compute has), long-running operations are
``google.longrunning.Operation``, bodies are proto3 JSON.

Error texts below are Google's own, as users have quoted them:

- stockout, on the finished create operation, code 8 (RESOURCE_EXHAUSTED): ``There is no
  more capacity in the zone "europe-west4-a"; you can try in another zone where Cloud TPU
  Nodes are offered (see https://cloud.google.com/tpu/docs/regions) [EID: 0x...]``
  (github.com/thevasudevgupta/gsoc-wav2vec2 issue 11; "Error code 8" in
  GoogleCloudPlatform/magic-modules PR 7297);
- quota, refused synchronously with HTTP 429 RESOURCE_EXHAUSTED on create (a queued
  resource "never existed"): ``Quota limit 'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI'
  has been exceeded. Limit: 0 in region us-east5.`` (marin-community/marin PR 1612), with
  a ``google.rpc.QuotaFailure`` detail (``Quota '...' exhausted. Limit 4 in zone ...``);
- an accelerator type the zone lacks, 400 INVALID_ARGUMENT: ``Cloud TPU received a bad
  request. The requested accelerator configuration for accelerator type, "v5litepod-8",
  could not be found in the zonal accelerator configurations for "us-central1-b".; the
  accelerator v5litepod-8 was not found in zone us-central1-b [EID: 0x...]``;
- a name taken, 409: ``ALREADY_EXISTS: Resource 'projects/p/locations/z/nodes/n' already
  exists`` with a ``google.rpc.ResourceInfo`` detail (skypilot-org/skypilot issue 129);
- a location the project cannot use, 403: ``Permission denied on 'locations/us-central2-b'
  (or it may not exist).`` No quoted 404 for an unknown TPU location was found; Google's
  front end answers this 403 whether the location is forbidden or does not exist.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import time
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any

TYPE = "type.googleapis.com/google.cloud.tpu.v2."
NAME_RE = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
          409: "ALREADY_EXISTS", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL",
          501: "UNIMPLEMENTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
RESOURCE_EXHAUSTED = 8  # google.rpc.Code, as a failed operation's error carries it


class TpuError(Exception):
    """An HTTP error answered as one-platform APIs do (google.rpc.Status in JSON)."""

    def __init__(self, code: int, message: str, details: list[dict[str, Any]] | None = None,
                 status: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.details = code, message, details or []
        self.status = status or STATUS.get(code, "UNKNOWN")

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message, "status": self.status}
        if self.details:
            error["details"] = self.details
        return {"error": error}


def eid() -> str:
    """The ``[EID: 0x...]`` tag Cloud TPU appends to its own error messages."""
    return f"[EID: 0x{secrets.token_hex(8)}]"


def bad_request(message: str, field: str) -> TpuError:
    """400 naming the field, as ``google.rpc.BadRequest`` does."""
    return TpuError(400, message, [{"@type": "type.googleapis.com/google.rpc.BadRequest",
                                    "fieldViolations": [{"field": field, "description": message}]}])


def not_found(name: str) -> TpuError:
    return TpuError(404, f"Resource '{name}' was not found",
                    [{"@type": "type.googleapis.com/google.rpc.ResourceInfo", "resourceName": name}])


def already_exists(name: str) -> TpuError:
    return TpuError(409, f"Resource '{name}' already exists",
                    [{"@type": "type.googleapis.com/google.rpc.ResourceInfo", "resourceName": name}])


def location_denied(project: str, zone: str) -> TpuError:
    return TpuError(403, f"Permission denied on 'locations/{zone}' (or it may not exist).",
                    [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "domain": "googleapis.com",
                      "reason": "LOCATION_POLICY_VIOLATED",
                      "metadata": {"consumer": f"projects/{project}", "location": zone,
                                   "service": "tpu.googleapis.com"}}])


def stockout_status(zone: str) -> dict[str, Any]:
    """The ``error`` of a create operation that found no capacity (google.rpc.Status)."""
    return {"code": RESOURCE_EXHAUSTED,
            "message": f'There is no more capacity in the zone "{zone}"; you can try in another zone where '
                       f"Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions) {eid()}"}


def quota_error(accelerator: Accelerator, spot: bool, project: str, zone: str) -> TpuError:
    """429 for TPU chips over quota, with the ``google.rpc.QuotaFailure`` detail that names the quota."""
    region = zone.rsplit("-", 1)[0]
    metric = f"TPU{accelerator.quota_family}{'Preemptible' if spot else ''}PerProjectPerRegionForTPUAPI"
    return TpuError(429, f"Quota limit '{metric}' has been exceeded. Limit: 0 in region {region}.",
                    [{"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                      "violations": [{"subject": f"projects/{project}",
                                      "description": f"Quota '{metric}' exhausted. Limit 0 in region {region}"}]}])


# -- accelerator types -----------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    """How one TPU generation names its slices (``v4-16``: the number counts ``unit``)."""
    config_type: str  # AcceleratorConfig.type
    unit: str  # "cores" (2 TensorCores a chip) or "chips"
    sizes: tuple[int, ...]
    dims: int  # topology dimensions: 2 (a 2D torus) or 3
    single_host_max: int  # chips one VM holds when the slice fits on one host
    chips_per_vm: int  # chips per VM of a multi-host slice
    quota_family: str  # how the quota metric names the family
    machine_types: dict[int, str]  # chips per VM -> the VM's machine type ({} when not known)


# Sizes are the slices Google documents (a subset for v4 and v5p, which allow more shapes).
# Sources: cloud.google.com/tpu/docs/v2 and /v3 (vN-M: M TensorCores, 2 a chip, 4 chips =
# 8 cores per host); /v4 and /v5p (M TensorCores, 2 a chip, 4 chips per VM: v4-8 is one
# host, v4-16 two, v4-32 four); /v5e and /v6e (M chips; a VM holds 1, 4 or 8 chips, so
# v5litepod-1/4/8 are one host, and a multi-host slice is built of 4-chip VMs:
# v5litepod-16 has 4 workers). The v5e page's "hosts" column counts 8-chip machines
# (v5litepod-16: 2); the TPU API's workers are the 4-chip VMs.
FAMILIES: dict[str, Family] = {
    "v2": Family("V2", "cores", (8, 32, 128, 256, 512), 2, 4, 4, "V2", {}),
    "v3": Family("V3", "cores", (8, 32, 64, 128, 256, 512, 1024, 2048), 2, 4, 4, "V3", {}),
    "v4": Family("V4", "cores", tuple(2 ** k for k in range(3, 13)), 3, 4, 4, "V4", {4: "ct4p-hightpu-4t"}),
    "v5p": Family("V5P", "cores", tuple(2 ** k for k in range(3, 14)), 3, 4, 4, "V5P", {4: "ct5p-hightpu-4t"}),
    "v5litepod": Family("V5LITE_POD", "chips", (1, 4, 8, 16, 32, 64, 128, 256), 2, 8, 4, "V5sLitepod",
                        {1: "ct5lp-hightpu-1t", 4: "ct5lp-hightpu-4t", 8: "ct5lp-hightpu-8t"}),
    "v6e": Family("V6E", "chips", (1, 4, 8, 16, 32, 64, 128, 256), 2, 8, 4, "V6E",
                  {1: "ct6e-standard-1t", 4: "ct6e-standard-4t", 8: "ct6e-standard-8t"}),
}


@dataclass(frozen=True)
class Accelerator:
    name: str  # "v4-16"
    family: Family
    size: int

    @property
    def chips(self) -> int:
        return self.size // 2 if self.family.unit == "cores" else self.size

    @property
    def workers(self) -> int:
        if self.chips <= self.family.single_host_max:
            return 1
        return self.chips // self.family.chips_per_vm

    @property
    def topology(self) -> str:
        return topology(self.chips, self.family.dims)

    @property
    def quota_family(self) -> str:
        return self.family.quota_family

    @property
    def machine_type(self) -> str | None:
        return self.family.machine_types.get(self.chips // self.workers)

    def config(self) -> dict[str, str]:
        return {"type": self.family.config_type, "topology": self.topology}


def accelerator(name: str) -> Accelerator | None:
    prefix, _, size = name.rpartition("-")
    family = FAMILIES.get(prefix)
    if family is None or not size.isascii() or not size.isdigit() or int(size) not in family.sizes:
        return None
    return Accelerator(name, family, int(size))


def from_config(config: dict[str, Any]) -> Accelerator | None:
    """The accelerator type an ``acceleratorConfig`` ({type, topology}) names, if it is one."""
    for prefix, family in FAMILIES.items():
        if family.config_type == config.get("type"):
            dims = str(config.get("topology", "")).split("x")
            if len(dims) != family.dims or not all(d.isascii() and d.isdigit() and int(d) > 0 for d in dims):
                return None
            chips = 1
            for d in dims:
                chips *= int(d)
            found = accelerator(f"{prefix}-{chips * 2 if family.unit == 'cores' else chips}")
            return found if found and found.topology == config.get("topology") else None
    return None


def all_accelerators() -> list[Accelerator]:
    return [a for p, f in FAMILIES.items() for s in f.sizes if (a := accelerator(f"{p}-{s}"))]


def topology(chips: int, dims: int) -> str:
    """The slice's shape as Google writes it: 2D ``2x4``, ``16x16``; 3D ``2x2x1``, ``4x4x8``."""
    if dims == 2:
        a = 2 ** ((chips.bit_length() - 1) // 2)
        return f"{a}x{chips // a}"
    shape = [2, 2, 1] if chips >= 4 else [chips, 1, 1]
    while shape[0] * shape[1] * shape[2] < chips:  # double the smallest side, the last of equals
        i = max(i for i in range(3) if shape[i] == min(shape))
        shape[i] *= 2
    return "x".join(map(str, shape))


# -- resources -----------------------------------------------------------------------------
def now() -> str:
    """RFC 3339 UTC with nanoseconds, as the API stamps ``createTime``."""
    moment = datetime.now(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond:06d}{secrets.randbelow(1000):03d}Z"


def later(seconds: float) -> str:
    return datetime.fromtimestamp(time.time() + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def hostname(node_id: str, worker: int) -> str:
    """A TPU VM's own name, as Google names the VMs of a slice (``t1v-n-<hash>-w-<worker>``)."""
    return f"t1v-n-{hashlib.sha1(node_id.encode()).hexdigest()[:8]}-w-{worker}"


def operation(parent: str, verb: str, target: str) -> dict[str, Any]:
    """A new long-running operation, not done (proto3 JSON leaves ``done: false`` out)."""
    name = f"{parent}/operations/operation-{int(time.time() * 1000)}-{secrets.token_hex(6)}-" \
           f"{secrets.token_hex(4)}-{secrets.token_hex(4)}"
    return {"name": name, "metadata": {"@type": f"{TYPE}OperationMetadata", "createTime": now(), "target": target,
                                       "verb": verb, "cancelRequested": False, "apiVersion": "v2"}}


def finish(op: dict[str, Any], response: dict[str, Any] | None = None, kind: str = "Node",
           error: dict[str, Any] | None = None) -> None:
    op["done"] = True
    op["metadata"]["endTime"] = now()
    if error is not None:
        op["error"] = error
    elif kind == "Empty":
        op["response"] = {"@type": "type.googleapis.com/google.protobuf.Empty"}
    else:
        op["response"] = {"@type": f"{TYPE}{kind}", **(response or {})}


def page(items: list[Any], q: Any) -> tuple[list[Any], str | None]:
    """One page of ``items`` (``pageSize``, default 500; ``pageToken`` from the last page)."""
    try:
        size = int(q.get("pageSize") or 0) or 500
        start = int(base64.urlsafe_b64decode(q["pageToken"]).decode()) if q.get("pageToken") else 0
    except ValueError as e:
        raise TpuError(400, f"Invalid page: {e}") from e
    if size < 0 or start < 0:
        raise TpuError(400, "pageSize and pageToken must not be negative")
    end = start + size
    return items[start:end], (base64.urlsafe_b64encode(str(end).encode()).decode() if end < len(items) else None)


# -- proto3 JSON enums -------------------------------------------------------------------
# The google-cloud-tpu REST client sends enums as numbers and asks for numbers back
# (``$alt=json;enum-encoding=int``); gcloud sends and reads names. A number the client does
# not know survives parsing (proto3 enums are open), a name it does not know becomes 0, so
# answering numbers is what keeps a value Google adds later visible to the client. Such a
# value (``set_state("SOMETHING_NEW")``) is given a number no version of the enum uses yet.
_PACKAGES = ("google.cloud.tpu.v2", "google.longrunning", "google.cloud.location", "google.protobuf")


@cache
def descriptor(schema: str) -> Any:
    """The protobuf message a discovery schema (``"Node"``, ``"Operation"``) stands for."""
    from google.cloud import tpu_v2  # noqa: F401 - registers google.cloud.tpu.v2 in the default pool
    from google.cloud.location import locations_pb2  # noqa: F401
    from google.longrunning import operations_pb2  # noqa: F401
    from google.protobuf import descriptor_pool, empty_pb2  # noqa: F401

    pool = descriptor_pool.Default()
    for package in _PACKAGES:
        try:
            return pool.FindMessageTypeByName(f"{package}.{schema}")
        except KeyError:
            continue
    return None


def future_number(name: str) -> int:
    return 1000 + zlib.crc32(name.encode()) % 1000


def enums(value: Any, message: Any, numbers: bool) -> Any:
    """``value`` with every enum written as a number (``numbers``) or as its name."""
    if message is None or not isinstance(value, dict):
        return value
    if message.full_name == "google.protobuf.Any":
        kind = str(value.get("@type", ""))
        inner = descriptor(kind.rsplit(".", 1)[-1]) if kind else None
        return {"@type": kind, **enums({k: v for k, v in value.items() if k != "@type"}, inner, numbers)}
    out = {}
    for key, item in value.items():
        field = message.fields_by_camelcase_name.get(key)
        if field is None:
            out[key] = item
        elif field.enum_type is not None:
            out[key] = [_enum(x, field.enum_type, numbers) for x in item] if isinstance(item, list) \
                else _enum(item, field.enum_type, numbers)
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            out[key] = [enums(x, field.message_type, numbers) for x in item] if isinstance(item, list) \
                else enums(item, field.message_type, numbers)
        else:
            out[key] = item
    return out


def _enum(value: Any, enum: Any, numbers: bool) -> Any:
    if numbers and isinstance(value, str):
        known = enum.values_by_name.get(value)
        return known.number if known else future_number(value)
    if not numbers and isinstance(value, int) and not isinstance(value, bool):
        known = enum.values_by_number.get(value)
        return known.name if known else value
    return value


def worker_endpoints(ips: list[str]) -> str:
    """A slice's ``worker-network-endpoints`` attribute: ``unknown:unknown:<ip>`` per worker, worker 0
    first, comma-separated (what JAX's ``GceTpuCluster`` splits)."""
    return ",".join(f"unknown:unknown:{ip}" for ip in ips)


def tpu_env_text(env: dict[str, str]) -> str:
    """The ``tpu-env`` attribute: one ``KEY: 'value'`` line each."""
    return "".join(f"{k}: '{v}'\n" for k, v in env.items())
