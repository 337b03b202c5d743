"""Compute's System Event audit log: the entries that say a VM was lost, and the filter that picks them.

Google writes host-side events on an instance to the project's System Event audit log
(``logName`` ``projects/P/logs/cloudaudit.googleapis.com%2Fsystem_event``, ``resource.type``
``gce_instance``), whatever the guest did: a hard preemption, a host error or a kernel panic
leave no marker, but they leave this entry. Its ``protoPayload`` is an ``AuditLog``:
``methodName`` (``compute.instances.preempted``...), ``resourceName``
(``projects/P/zones/Z/instances/NAME``), ``authenticationInfo.principalEmail``
(``system@google.com``), ``status.message`` ("Instance was preempted."); ``resource.labels``
hold ``instance_id``, ``zone`` and ``project_id``. The instance's own labels are not in it, so
no filter can keep respawn's instances alone: others are told apart here, by name, at no cost.

Eventarc's audit-log triggers cover Admin Activity and Data Access logs, and its method catalog
lists none of these system methods: they reach respawn through a Logging sink on ``sink_filter``
to a Pub/Sub topic (``on_audit``). An entry only wakes a pass of its VM's job: trainers may write
logs, and Cloud Logging may take an entry written under this log's name, so why a VM went is read
from Compute's own zone operations, never from an entry.

Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from controller.core import names
from controller.core.ports import StopReason

SYSTEM_EVENT_LOG_ID = "cloudaudit.googleapis.com%2Fsystem_event"
# The methods that end a VM's run, and the cause each is evidence of (what Compute's zone
# operations of the same type say: controller.adapters.compute reads the same table).
LOSSES: Mapping[str, StopReason] = {
    "compute.instances.preempted": StopReason.PREEMPTED,
    "compute.instances.hostError": StopReason.HOST_ERROR,
    "compute.instances.terminateOnHostMaintenance": StopReason.MAINTENANCE,
    "compute.instances.guestTerminate": StopReason.CRASHED,
}
# The VM went on (restarted by Compute after a host error, or moved live): nothing is evidence
# of a loss, but its job is looked at (a restarted guest boots its trainer again).
RESTARTS = ("compute.instances.automaticRestart", "compute.instances.migrateOnHostMaintenance")
METHODS = (*LOSSES, *RESTARTS)
# A Cloud TPU VM's worker as Compute names it (the node's name is not in it).
_TPU_WORKER = re.compile(r"t1v-n-[0-9a-f]+-w-(0|[1-9][0-9]*)")
_RESOURCE = re.compile(r"projects/(?P<project>[^/]{1,100})/zones/(?P<zone>[^/]{1,100})/instances/(?P<name>[^/]+)")
_INSTANCE_NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")  # Compute's own rule (RFC 1035, 63 at most)
MAX_INSERT_ID = 128  # past it (no entry of Compute's), an insertId is logged as its digest
MAX_ENTRY_BYTES = 256 * 1024  # Logging's own limit on an entry


class AuditError(ValueError):
    """An entry or message that is not a System Event entry about an instance: ignored, said why."""


@dataclass(frozen=True)
class AuditEvent:
    """One System Event entry about an instance."""

    project: str
    zone: str
    instance: str
    method: str
    at: datetime  # the entry's timestamp: when the event happened
    insert_id: str = ""
    instance_id: str | None = None  # Compute's numeric id: tells a name's reuse apart

    @property
    def reason(self) -> StopReason | None:
        """The cause this entry is evidence of; None for a method that ends nothing (or is new)."""
        return LOSSES.get(self.method)

    @property
    def job(self) -> str | None:
        """The job whose instance this is by respawn's naming (a VM's, or a host of a TPU slice's MIG:
        ``<job>-<attempt>-w-xxxx``); None for any other name (a Cloud TPU worker's ``t1v-n-<hash>-w-3``
        reads as job ``t1v-n-<hash>-w``, attempt 3: it is not one)."""
        parsed = self._parsed()
        return parsed[0] if parsed else None

    @property
    def attempt(self) -> int | None:
        parsed = self._parsed()
        return parsed[1] if parsed else None

    def _parsed(self) -> tuple[str, int, int | None] | None:
        if self.tpu_worker:
            return None
        if (host := names.parse_slice_host(self.instance)) is not None:  # a host of a TPU slice's MIG
            return (*host, None)
        return names.parse_instance_name(self.instance)

    @property
    def tpu_worker(self) -> bool:
        """A Cloud TPU VM's worker (``t1v-n-<hash>-w-<n>``): its name says nothing of its node."""
        return _TPU_WORKER.fullmatch(self.instance) is not None

    @property
    def tpu_worker_index(self) -> int | None:
        found = _TPU_WORKER.fullmatch(self.instance)
        return int(found.group(1)) if found else None

    @property
    def key(self) -> tuple[str, str]:
        """What tells two deliveries of one entry apart from two entries (Logging's own identity)."""
        return self.insert_id or f"{self.method}/{self.project}/{self.zone}/{self.instance}", self.at.isoformat()


# ``protoPayload.status.message`` of each loss, as real entries read (public copies: a preemption in
# thought-machine/spot-interruption-exporter's README, a host error in scylladb/scylla-cluster-tests).
STATUS_MESSAGES: Mapping[str, str] = {
    "compute.instances.preempted": "Instance was preempted.",
    "compute.instances.hostError": "Instance terminated by Compute Engine.",
    "compute.instances.guestTerminate": "Instance terminated by guest OS shutdown.",
    # No public sample of this one's status.message was found: the host error's text, as a guess.
    "compute.instances.terminateOnHostMaintenance": "Instance terminated by Compute Engine.",
}


def system_event_entry(project: str, zone: str, instance: str, instance_id: str, method: str, at: datetime, *,
                       operation: str | None = None, insert_id: str | None = None) -> dict[str, Any]:
    """A System Event entry as Compute writes one for ``method`` on an instance (LogEntry JSON): the
    shape of real entries quoted in public code (the sources of ``STATUS_MESSAGES``, and Dynatrace's
    dynatrace-gcp-monitoring tests for a live migration). ``severity`` INFO; ``operation`` the system
    event's zone operation (``systemevent-<ms>-...``), its producer the method itself; ``protoPayload``
    an AuditLog by ``system@google.com``; a microsecond ``timestamp``; a 12-character ``insertId``.
    What the local cloud's Compute writes and the in-memory fakes hand the controller; ``operation``
    and ``insert_id`` default to names derived from the rest (a seeded run replays)."""
    stamp = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    derived = uuid.uuid5(uuid.NAMESPACE_URL, f"{project}/{zone}/{instance}/{instance_id}/{method}/{stamp}").hex
    millis = int(at.timestamp() * 1000)
    return {
        "protoPayload": {
            "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
            "status": {"message": STATUS_MESSAGES.get(method, "")},
            "authenticationInfo": {"principalEmail": "system@google.com"},
            "serviceName": "compute.googleapis.com",
            "methodName": method,
            "resourceName": f"projects/{project}/zones/{zone}/instances/{instance}",
            "request": {"@type": f"type.googleapis.com/{method}"},
        },
        "insertId": insert_id or derived[:12],
        "resource": {"type": "gce_instance",
                     "labels": {"instance_id": str(instance_id), "project_id": project, "zone": zone}},
        "timestamp": stamp,
        "severity": "INFO",
        "logName": log_name(project),
        "operation": {"id": operation or f"systemevent-{millis}-{derived[12:25]}-{derived[25:29]}{derived[:4]}-"
                                          f"{derived[4:12]}", "producer": method, "first": True, "last": True},
    }


def log_name(project: str) -> str:
    return f"projects/{project}/logs/{SYSTEM_EVENT_LOG_ID}"


def sink_filter(project: str) -> str:
    """The Logging sink's filter in ``project`` (a project sink sees that project's entries only)."""
    return _filter((project,))


def _filter(projects: tuple[str, ...]) -> str:
    logs = " OR ".join(f'"{log_name(p)}"' for p in projects)
    methods = " OR ".join(f'"{m}"' for m in METHODS)
    return f'logName=({logs}) AND resource.type="gce_instance" AND protoPayload.methodName=({methods})'


def parse_entry(entry: Any) -> AuditEvent:
    """The event a LogEntry (JSON, as Logging and Pub/Sub carry it) records; AuditError otherwise."""
    if not isinstance(entry, Mapping):
        raise AuditError(f"a LogEntry is a JSON object, not {type(entry).__name__}")
    payload = entry.get("protoPayload")
    if not isinstance(payload, Mapping):
        raise AuditError("no protoPayload: not an audit log entry")
    if not str(entry.get("logName", "")).endswith(f"/logs/{SYSTEM_EVENT_LOG_ID}"):
        raise AuditError(f"logName {str(entry.get('logName'))[:200]!r} is not a System Event audit log")
    method, resource = payload.get("methodName"), payload.get("resourceName")
    if payload.get("serviceName") != "compute.googleapis.com":
        # Compute writes these, and says so; anything else is not its record of a VM.
        raise AuditError(f"serviceName {str(payload.get('serviceName'))[:100]!r} is not compute.googleapis.com")
    if not isinstance(method, str) or not method.startswith("compute.instances."):
        raise AuditError(f"methodName {str(method)[:100]!r} is not an instance's system event")
    found = _RESOURCE.fullmatch(resource) if isinstance(resource, str) else None
    if found is None:
        raise AuditError(f"resourceName {str(resource)[:200]!r} names no instance (projects/P/zones/Z/instances/NAME)")
    if not _INSTANCE_NAME.fullmatch(found["name"]):
        raise AuditError(f"instance name {found['name'][:100]!r} is not one Compute gives")
    labels = entry.get("resource", {}).get("labels", {}) if isinstance(entry.get("resource"), Mapping) else {}
    labels = labels if isinstance(labels, Mapping) else {}
    instance_id = labels.get("instance_id")
    at = _timestamp(entry.get("timestamp"))
    insert_id = entry.get("insertId")
    if isinstance(insert_id, str) and len(insert_id) > MAX_INSERT_ID:
        insert_id = "sha256:" + hashlib.sha256(insert_id.encode(errors="surrogatepass")).hexdigest()
    return AuditEvent(project=found["project"], zone=found["zone"], instance=found["name"], method=method, at=at,
                      insert_id=insert_id if isinstance(insert_id, str) else "",
                      instance_id=str(instance_id) if isinstance(instance_id, (str, int)) and str(instance_id).isdigit()
                      else None)


def decode_message(data: Any) -> Any:
    """The LogEntry a Pub/Sub ``messagePublished`` CloudEvent carries (``message.data``: base64 JSON)."""
    message = data.get("message") if isinstance(data, Mapping) else None
    if not isinstance(message, Mapping) or not isinstance(message.get("data"), str):
        raise AuditError("not a Pub/Sub message: no message.data")
    text = message["data"]
    if len(text) > MAX_ENTRY_BYTES * 4 // 3 + 4:
        raise AuditError(f"message.data larger than a LogEntry can be ({MAX_ENTRY_BYTES // 1024} KiB)")
    try:
        return json.loads(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise AuditError(f"message.data is not base64 JSON: {e}") from None
    except RecursionError:  # nested past the parser's depth: no LogEntry is (and a raise would be retried)
        raise AuditError("message.data nests too deeply to be a LogEntry") from None


def _timestamp(value: Any) -> datetime:
    if not isinstance(value, str):
        raise AuditError("no timestamp")
    text = value.strip()
    # RFC 3339 with up to nanoseconds (Logging writes 9 digits); Python's parser takes 6.
    text = re.sub(r"(\.\d{6})\d+", r"\1", text).replace("Z", "+00:00").replace("z", "+00:00")
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise AuditError(f"timestamp {value[:40]!r} is not RFC 3339") from None
    if at.tzinfo is None:
        raise AuditError(f"timestamp {value[:40]!r} has no offset")
    return at

