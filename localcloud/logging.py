"""A local Cloud Logging (v2) REST server: ``entries.write``, ``entries.list``, ``projects.logs.list``,
and the local VMs' output fed into it as Google's serial-console logging and guest agent write it.

What the real ``google-cloud-logging`` client reads with ``_use_grpc=False`` and
``client_options={"api_endpoint": server.endpoint}`` (the CLI does so when
``RESPAWN_LOGGING_ENDPOINT`` is set; gcloud: ``CLOUDSDK_API_ENDPOINT_OVERRIDES_LOGGING = endpoint +
"/"``). Routes and request schemas come from Google's ``logging.v2`` discovery document; a body with
a field the schema does not have is refused 400 as Google's front end refuses it (field names are
taken in either JSON spelling, ``dryRun`` or ``dry_run``, as proto3's JSON parser takes them; the
Python client sends the latter). Any other method of the document answers 501, a path that is none
of them 404. Errors are one-platform JSON (``{"error": {"code", "message", "status"}}``).

As the API answers:

- ``entries.write``: every entry needs a ``logName`` (its own or the request's) of the form
  ``projects/P/logs/LOG_ID`` (LOG_ID URL-encoded, at most 512 characters of ``[A-Za-z0-9/_.%-]``)
  and a monitored ``resource`` with a ``type``; at most one payload; timestamps RFC 3339. The
  request's ``labels`` are merged under each entry's. Missing ``timestamp`` and ``insertId`` are
  filled in; ``receiveTimestamp`` is always set. ``dryRun`` writes nothing; ``partialSuccess``
  writes the valid entries and still answers 400 for the others, with their indexes
  (``WriteLogEntriesPartialErrors``), as Google does.
- ``entries.list``: ``resourceNames`` of projects (``projects/P``; the deprecated ``projectIds``
  too), ``orderBy`` ``timestamp asc`` (the default) or ``timestamp desc``, ``pageSize`` (default
  50, at most 1000), ``pageToken`` (one this server gave for the same query), ``filter``. Entries
  are ordered by timestamp, then by insertion.
- the filter is the subset of the Logging query language respawn's own filters use, evaluated as
  Google documents it: comparisons ``FIELD = VALUE``, ``FIELD : VALUE`` (has: a substring; ``:*``:
  the field is present), ``<``, ``<=``, ``>``, ``>=`` on ``timestamp``/``receiveTimestamp`` (as
  times) and ``severity`` (by level); a value list ``FIELD = ("a" OR "b")``; ``NOT`` (or ``-``),
  ``AND``, ``OR`` (which binds tighter than ``AND``: ``a OR b AND c`` is ``(a OR b) AND c``) and a
  space meaning AND; parentheses; quoted path segments (``labels."compute.googleapis.com/x"``).
  String comparisons are case-insensitive. Fields are LogEntry's own (``resource.labels.*``,
  ``labels.*``, ``jsonPayload.*``...). Anything else (``!=``, regular expressions, global
  restrictions, functions such as ``SEARCH()`` or ``log_id()``, unknown fields) is refused 400
  rather than answered wrong.

- the read quota: Google allows 60 ``entries.list`` a minute per project; a read past it is
  refused 429 RESOURCE_EXHAUSTED with a ``google.rpc.ErrorInfo`` (reason RATE_LIMIT_EXCEEDED, the
  quota's metric and limit) and a ``google.rpc.RetryInfo`` naming when a read fits again. Here a
  read counts against every project its ``resourceNames`` name, within a sliding window
  (``reads_per_minute``, ``window``; None: no quota); a refused read does not count.

- ``projects.sinks`` create / get / list / update / patch / delete (``LogSink``): a sink's ``name``
  is at most 100 characters of ``[A-Za-z0-9_.-]``, an alphanumeric first; its ``destination`` one
  of the forms the schema lists; its ``filter`` one this server can evaluate (else 400
  INVALID_ARGUMENT); an existing name is refused 409 ALREADY_EXISTS, a missing one 404 NOT_FOUND.
  ``writerIdentity`` is what Google gives a project's sink: ``uniqueWriterIdentity`` true (gcloud
  always asks for it) gives the project's Logging service agent,
  ``serviceAccount:service-<project number>@gcp-sa-logging.iam.gserviceaccount.com`` ("a service
  agent used by the sinks with the same parent", the discovery document), false or absent the
  shared ``serviceAccount:cloud-logs@system.gserviceaccount.com``; turning it from true to false on
  an update is refused 400, as the document says.
- routing: every entry stored (``entries.write`` or ``write()``) is matched, ``sink_delay``
  seconds later (the Log Router is "near real-time" for Pub/Sub, no number published; Google's own
  System Event entries carry a ``receiveTimestamp`` 0.5-1.1 s after their ``timestamp``), against
  each enabled sink of its project; a match whose destination is
  ``pubsub.googleapis.com/projects/P/topics/T`` is published to the Pub/Sub stand-in (``pubsub``)
  as Google's sinks publish it: ``data`` the LogEntry as JSON, attribute
  ``logging.googleapis.com/timestamp`` its timestamp. Only where the sink's writer identity holds
  ``roles/pubsub.publisher`` (or editor, admin) on the topic: otherwise, or where the topic does not
  exist, the entry is not delivered and the failure is kept in ``sink_errors`` (Google logs a sink
  error and mails the owner; it does not retry a configuration error). Other destinations are
  accepted and deliver nothing here.
- ``projects.metrics`` create / get / list / update / delete (``LogMetric``): see ``localcloud.logmetrics``.
- ``system_event(...)``: a Compute Engine System Event audit entry as Google writes one
  (``localcloud.compute`` and ``localcloud.tpu`` write them through ``audit_log`` hooks), shaped
  after public samples of real entries (see its docstring).

``VmLogs`` feeds the local Compute server's VMs into it: each line a VM writes to
``serial-port-1.log`` becomes an entry of ``serialconsole.googleapis.com%2Fserial_port_1_output``
(``textPayload``, resource ``gce_instance`` with ``instance_id``, ``zone``, ``project_id``), as
serial-port logging does, only where the VM's metadata sets ``serial-port-logging-enable`` TRUE
(off by default on Google: nothing here sets it for a project), and an entry of
``GCEMetadataScripts`` as the guest agent's script runner writes it (``jsonPayload.message``: its
own lines as they are, the scripts' output as ``startup-script: LINE``; label ``instance_name``;
severity INFO; always: the local cloud checks no IAM, so the VM's account is taken to hold
``roles/logging.logWriter``). The local serial log does not tell a shutdown script's lines from
the startup script's: both read ``startup-script`` here. Cloud TPU workers (``localcloud.tpu``)
are fed the same way, as resource ``tpu_worker`` with ``project_id``, ``zone``, ``node_id`` (the
node's name) and ``worker_id`` (the worker's number), the node's metadata deciding the serial log.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import heapq
import itertools
import json
import logging as pylogging
import re
import secrets
import string
import threading
import time
from bisect import insort
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flask import Flask, Response, request

from controller.core import audit
from localcloud import discovery
from localcloud.host import Host, json_response
from localcloud.logmetrics import LogMetrics
from localcloud.http import Server
from localcloud.tpu_api import STATUS
from localcloud.metadata import project_number  # the number Compute's metadata gives the project
from localcloud.realism import Delay, seconds

if TYPE_CHECKING:
    from localcloud.pubsub import PubsubServer

log = pylogging.getLogger(__name__)
DOC = "logging.v2"
SUPPORTED = {"entries": ("list", "write"), "projects.logs": ("list",),
             "projects.sinks": ("create", "get", "list", "update", "patch", "delete"),
             "projects.metrics": ("create", "get", "list", "update", "delete")}
SERIAL_LOG = "serialconsole.googleapis.com%2Fserial_port_1_output"
SCRIPTS_LOG = "GCEMetadataScripts"
RUNNER = "google_metadata_script_runner: "  # how the local guest agent marks its own lines (localcloud.vm)
DEFAULT_PAGE, MAX_PAGE = 50, 1000
READS_PER_MINUTE = 60  # Cloud Logging's entries.list quota, per project
SERIAL_METADATA = "serial-port-logging-enable"
LOG_NAME_RE = re.compile(r"projects/([^/]+)/logs/([A-Za-z0-9/_.%-]{1,512})")
SEVERITIES = {"DEFAULT": 0, "DEBUG": 100, "INFO": 200, "NOTICE": 300, "WARNING": 400, "ERROR": 500,
              "CRITICAL": 600, "ALERT": 700, "EMERGENCY": 800}
_RFC3339 = re.compile(r"(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?([Zz]|[+-]\d\d:\d\d)")
# Sinks.
SINK_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
PUBSUB_DESTINATION_RE = re.compile(r"pubsub\.googleapis\.com/projects/([^/]+)/topics/([^/]+)")
DESTINATION_RES = (
    PUBSUB_DESTINATION_RE,
    re.compile(r"storage\.googleapis\.com/[a-z0-9][-a-z0-9_.]{1,220}"),
    re.compile(r"bigquery\.googleapis\.com/projects/[^/]+/datasets/[A-Za-z0-9_]+"),
    re.compile(r"logging\.googleapis\.com/projects/[^/]+(/locations/[^/]+/buckets/[^/]+)?"),
)
SINK_FIELDS = ("destination", "filter", "description", "disabled", "exclusions", "includeChildren",
               "bigqueryOptions")  # what an update may change (name and output-only fields may not)
SHARED_WRITER = "serviceAccount:cloud-logs@system.gserviceaccount.com"
PUBLISHER_ROLES = ("roles/pubsub.publisher", "roles/pubsub.editor", "roles/pubsub.admin", "roles/editor",
                   "roles/owner")
TIMESTAMP_ATTRIBUTE = "logging.googleapis.com/timestamp"
# Seconds from an entry's arrival to its publication by a sink: Google publishes no number ("near
# real-time", docs.cloud.google.com/logging/docs/export/using_exported_logs); real System Event
# entries are received 0.5-1.1 s after their timestamp (see controller.core.audit.system_event_entry): 1 s, all told.
SINK_DELAY = 1.0
class LoggingError(Exception):
    """An HTTP error answered as one-platform APIs do (google.rpc.Status in JSON)."""

    def __init__(self, code: int, message: str, details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.details = code, message, details

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message, "status": STATUS.get(self.code, "UNKNOWN")}
        if self.details:
            error["details"] = self.details
        return {"error": error}


class FilterError(LoggingError):
    def __init__(self, message: str) -> None:
        super().__init__(400, f"Invalid query: {message}")


@dataclass(order=True)
class _Stored:
    key: tuple[int, int]  # (timestamp in ns since the epoch, insertion order)
    entry: dict[str, Any] = field(compare=False)

    @property
    def project(self) -> str:
        return self.entry["logName"].split("/", 2)[1]


class LoggingServer(LogMetrics, Server):
    name, threads = "logging", 16
    metric_error = LoggingError  # what LogMetrics raises

    @staticmethod
    def check_filter(text: str) -> object:
        return compile_filter(text)

    def __init__(self, *, max_entries: int = 200_000, reads_per_minute: int | None = READS_PER_MINUTE,
                 window: float = 60.0, pubsub: PubsubServer | None = None, sink_delay: Delay = SINK_DELAY) -> None:
        """``max_entries``: the oldest entries go past this many (Google keeps 30 days; a local
        cloud left up with a chatty trainer must not grow without bound); ``reads_per_minute``:
        ``entries.list`` calls a project may make within ``window`` seconds (None: any number);
        ``pubsub``: where sinks with a Pub/Sub destination publish (None: they deliver nothing);
        ``sink_delay``: seconds from an entry's arrival to its publication by a sink."""
        self.max_entries = max_entries
        self.reads_per_minute, self.window = reads_per_minute, window
        self.reads: dict[str, list[float]] = {}  # project -> when its reads were answered, within the window
        self.refused = 0  # reads refused for the quota
        self.pubsub, self.sink_delay = pubsub, sink_delay
        self.sink_errors: list[dict[str, Any]] = []  # {"sink", "insertId", "error"}: entries a sink could not deliver
        self.exported: list[tuple[str, str]] = []  # (sink, insertId): entries a sink published
        self._entries: list[_Stored] = []  # sorted by key
        self._order = itertools.count(1)
        self._lock = threading.Lock()
        self._routes = discovery.served(DOC, SUPPORTED)
        self._sinks: dict[str, dict[str, dict[str, Any]]] = {}  # project -> sink name -> LogSink
        self._unique: dict[tuple[str, str], bool] = {}  # (project, sink) -> made with uniqueWriterIdentity
        self._metrics: dict[str, dict[str, dict[str, Any]]] = {}  # project -> name -> LogMetric (localcloud.logmetrics)
        self._router = threading.Condition()
        self._routing: list[tuple[float, int, list[dict[str, Any]]]] = []  # (due, order, entries): a heap
        self._router_thread: threading.Thread | None = None
        self._closing = False

    def start(self) -> LoggingServer:
        super().start()
        self._closing = False
        self._router_thread = threading.Thread(target=self._route_loop, name="logging-router", daemon=True)
        self._router_thread.start()
        return self

    def stop(self) -> None:
        with self._router:
            self._closing = True
            self._router.notify_all()
        if self._router_thread is not None:
            self._router_thread.join(timeout=5)
            self._router_thread = None
        super().stop()

    def sinks(self, project: str) -> list[dict[str, Any]]:
        """Every sink of ``project``, as ``sinks.get`` answers each."""
        with self._lock:
            return [dict(s) for _, s in sorted(self._sinks.get(project, {}).items())]

    def settle(self, timeout: float = 10.0) -> bool:
        """Wait until every entry stored so far has been through the sinks (True), or ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._router:
            while self._routing or self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._router.wait(min(left, 0.05))
        return True

    _in_flight = 0

    @property
    def endpoint(self) -> str:
        """What ``client_options.api_endpoint`` takes (``http://127.0.0.1:PORT``)."""
        return self.address

    # -- what a feeder or a test uses ---------------------------------------------------------
    def write(self, entries: list[dict[str, Any]]) -> None:
        """Store entries as ``entries.write`` would (each complete: logName, resource, payload)."""
        for i, entry in enumerate(entries):
            if problem := _entry_problem(entry):
                raise ValueError(f"entries[{i}]: {problem}")
        self._store(entries)

    def entries(self, log: str | None = None) -> list[dict[str, Any]]:
        """Every entry stored, oldest first (``log``: only those of that LOG_ID, URL-encoded)."""
        with self._lock:
            stored = [s.entry for s in self._entries]
        return [dict(e) for e in stored if log is None or e["logName"].endswith(f"/logs/{log}")]

    # -- HTTP ---------------------------------------------------------------------------------
    def _app(self) -> Flask:
        app = Flask("logging")

        @app.route("/v2/<path:path>", methods=["GET", "POST", "DELETE", "PATCH", "PUT"])
        def v2(path: str) -> Response:
            try:
                return json_response(self._dispatch(request.method, f"v2/{path}"))
            except LoggingError as e:
                return json_response(e.body(), e.code)

        Host._fault_route(app, {})
        return app

    def _dispatch(self, verb: str, path: str) -> dict[str, Any]:
        method, match, name = discovery.resolve(self._routes, verb, path, "Cloud Logging", LoggingError,
                                                qualified=True)
        body = self._body(method.request_schema) if method.request_schema else {}
        return getattr(self, f"_{name.replace('.', '_')}")(match.groupdict(), body)

    def _body(self, schema: str) -> dict[str, Any]:
        raw = request.get_data()
        body = {} if not raw else request.get_json(silent=True)
        if not isinstance(body, dict):
            raise LoggingError(400, "Invalid JSON payload received. Expected an object.")
        body = _json_names(_no_nulls(body), {"$ref": schema})
        problems = discovery.validate(body, schema, "\0", doc=DOC)
        if problems:
            raise LoggingError(400, problems[0].replace(" at '\0'", "").replace("'\0.", "'"))
        return body

    # -- entries.write ------------------------------------------------------------------------
    def _entries_write(self, p: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        if not body.get("entries"):
            raise LoggingError(400, "At least one log entry must be provided.")
        shared = {k: body[k] for k in ("logName", "resource") if k in body}
        labels = body.get("labels") or {}
        written, failed = [], {}
        for i, entry in enumerate(body.get("entries") or []):
            entry = {**shared, **entry}
            if labels:
                entry["labels"] = {**labels, **(entry.get("labels") or {})}
            if problem := _entry_problem(entry):
                failed[str(i)] = {"code": 3, "message": problem}
            else:
                written.append(entry)
        if not body.get("dryRun") and (not failed or body.get("partialSuccess")):
            self._store(written)
        if failed:
            first = next(iter(failed.values()))["message"]
            raise LoggingError(400, f"Log entry with index {next(iter(failed))} is invalid: {first}", [{
                "@type": "type.googleapis.com/google.logging.v2.WriteLogEntriesPartialErrors",
                "logEntryErrors": failed}])
        return {}

    def _store(self, entries: list[dict[str, Any]]) -> None:
        received = rfc3339(time.time_ns())
        stored: list[dict[str, Any]] = []
        with self._lock:
            for entry in entries:
                order = next(self._order)
                # Google keeps a Timestamp, and answers it in UTC ("Z") whatever offset it was written
                # with: google-cloud-logging's reader cannot parse "+00:00".
                entry = {**entry, "receiveTimestamp": received,
                         "timestamp": rfc3339(_nanos(entry["timestamp"])) if "timestamp" in entry else received}
                entry.setdefault("insertId", f"{order:016x}")
                insort(self._entries, _Stored((_nanos(entry["timestamp"]), order), entry))
                stored.append(entry)
            if len(self._entries) > self.max_entries:
                del self._entries[: len(self._entries) - self.max_entries]
            routed = any(self._sinks.get(e["logName"].split("/", 2)[1]) for e in stored)
        if routed:
            with self._router:
                heapq.heappush(self._routing, (time.monotonic() + seconds(self.sink_delay), next(self._order), stored))
                self._router.notify_all()

    # -- entries.list ---------------------------------------------------------------------------
    def _entries_list(self, p: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        projects = _projects(body)
        self._charge(projects)
        order = (body.get("orderBy") or "timestamp asc").strip().lower()
        if order not in ("timestamp asc", "timestamp desc"):
            raise LoggingError(400, f"Invalid orderBy: {body.get('orderBy')!r}; only \"timestamp asc\" and "
                                    "\"timestamp desc\" are supported.")
        size = int(body.get("pageSize") or DEFAULT_PAGE)
        if size < 0:
            raise LoggingError(400, f"Invalid page size {size}: it must not be negative.")
        size = min(size or DEFAULT_PAGE, MAX_PAGE)
        matches = compile_filter(body.get("filter") or "")
        query = hashlib.sha256(json.dumps([sorted(projects), order, body.get("filter") or ""]).encode()).hexdigest()[:16]
        after = _token_key(body.get("pageToken") or "", query)
        descending = order.endswith("desc")
        with self._lock:
            stored = list(reversed(self._entries) if descending else self._entries)
        page: list[_Stored] = []
        more = False
        for s in stored:
            if after is not None and (s.key >= after if descending else s.key <= after):
                continue
            if s.project not in projects or not matches(s.entry):
                continue
            if len(page) == size:
                more = True
                break
            page.append(s)
        out: dict[str, Any] = {"entries": [dict(s.entry) for s in page]} if page else {}
        if more:
            out["nextPageToken"] = _token(page[-1].key, query)
        return out

    def _charge(self, projects: set[str]) -> None:
        """Count one read against each project, or refuse it 429 as Google does past the quota."""
        if self.reads_per_minute is None:
            return
        now = time.monotonic()
        with self._lock:
            for project in projects:
                self.reads[project] = [t for t in self.reads.get(project, []) if t > now - self.window]
            full = sorted(p for p in projects if len(self.reads[p]) >= self.reads_per_minute)
            if not full:
                for project in projects:
                    self.reads[project].append(now)
                return
            self.refused += 1
            wait = max(self.reads[p][-self.reads_per_minute] + self.window - now for p in full)
        project = full[0]
        raise LoggingError(429, f"Quota exceeded for quota metric 'Read requests' and limit 'Read requests per "
                                f"minute' of service 'logging.googleapis.com' for consumer 'projects/{project}'.", [
            {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "RATE_LIMIT_EXCEEDED",
             "domain": "googleapis.com",
             "metadata": {"service": "logging.googleapis.com", "consumer": f"projects/{project}",
                          "quota_metric": "logging.googleapis.com/read_requests",
                          "quota_limit": "ReadRequestsPerMinutePerProject",
                          "quota_limit_value": str(self.reads_per_minute)}},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{max(wait, 0.001):.3f}s"},
        ])

    # -- projects.logs.list ---------------------------------------------------------------------
    def _projects_logs_list(self, p: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        project = p["projectsId"]
        with self._lock:
            names = sorted({s.entry["logName"] for s in self._entries if s.project == project})
        return {"logNames": names} if names else {}


    # -- projects.sinks ---------------------------------------------------------------------------
    def _projects_sinks_create(self, p: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        project = p["projectsId"]
        name = body.get("name") or ""
        if not SINK_NAME_RE.fullmatch(name):
            raise LoggingError(400, f"Invalid sink name {name!r}: at most 100 characters of letters, digits, "
                                    "underscores, hyphens and periods, the first a letter or digit.")
        self._check_sink(body)
        unique = _flag(request.args.get("uniqueWriterIdentity"))
        if request.args.get("customWriterIdentity"):
            raise LoggingError(400, "customWriterIdentity can only be specified when routing logs to a log bucket "
                                    "in a different project than the sink.")
        now = rfc3339(time.time_ns())
        sink = {**{k: body[k] for k in SINK_FIELDS if body.get(k) not in (None, False, "", [], {})}, "name": name,
                "resourceName": f"projects/{project}/sinks/{name}", "writerIdentity": _writer(project, unique),
                "createTime": now, "updateTime": now}
        with self._lock:
            if name in self._sinks.get(project, {}):
                raise LoggingError(409, f"Sink {name} already exists")
            self._sinks.setdefault(project, {})[name] = sink
            self._unique[(project, name)] = unique
            return dict(sink)

    def _projects_sinks_get(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        with self._lock:
            return dict(self._sink(p))

    def _projects_sinks_list(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        size = int(request.args.get("pageSize") or 0)
        if size < 0:
            raise LoggingError(400, f"Invalid page size {size}: it must not be negative.")
        with self._lock:
            sinks = [dict(s) for _, s in sorted(self._sinks.get(p["projectsId"], {}).items())]
        token = request.args.get("pageToken") or ""
        start = 0
        if token:
            try:
                start = int(base64.urlsafe_b64decode(token.encode()).decode())
            except (binascii.Error, ValueError, UnicodeDecodeError):
                raise LoggingError(400, "Invalid page token.") from None
        end = start + (size or 200)
        out: dict[str, Any] = {"sinks": sinks[start:end]} if sinks[start:end] else {}
        if end < len(sinks):
            out["nextPageToken"] = base64.urlsafe_b64encode(str(end).encode()).decode()
        return out

    def _projects_sinks_update(self, p: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        mask = [f.strip() for f in (request.args.get("updateMask") or "").split(",") if f.strip()]
        mask = [re.sub(r"_([a-z])", lambda m: m.group(1).upper(), f) for f in mask] or [
            "destination", "filter", "includeChildren"]  # an empty mask, as Google still takes it
        if bad := [f for f in mask if f not in SINK_FIELDS]:
            raise LoggingError(400, f"Invalid update mask: {', '.join(bad)} cannot be updated.")
        if body.get("name") and body["name"] != p["sinksId"]:
            raise LoggingError(400, "The sink's name cannot be changed.")
        unique = _flag(request.args.get("uniqueWriterIdentity"))
        with self._lock:
            sink = self._sink(p)
            merged = {**sink, **{f: body[f] for f in mask if f in body}}
            for f in mask:
                if f not in body:
                    merged.pop(f, None)
            self._check_sink(merged)
            key = (p["projectsId"], p["sinksId"])
            if self._unique[key] and request.args.get("uniqueWriterIdentity") is not None and not unique:
                raise LoggingError(400, "uniqueWriterIdentity cannot be changed from true to false.")
            if unique and not self._unique[key]:
                self._unique[key] = True
                merged["writerIdentity"] = _writer(p["projectsId"], True)
            merged = {k: v for k, v in merged.items() if v not in (False, "", [], {})}  # proto3 JSON omits defaults
            merged["updateTime"] = rfc3339(time.time_ns())
            self._sinks[p["projectsId"]][p["sinksId"]] = merged
            return dict(merged)

    _projects_sinks_patch = _projects_sinks_update

    def _projects_sinks_delete(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        with self._lock:
            self._sink(p)
            del self._sinks[p["projectsId"]][p["sinksId"]]
            self._unique.pop((p["projectsId"], p["sinksId"]), None)
        return {}

    def _sink(self, p: dict[str, str]) -> dict[str, Any]:
        sink = self._sinks.get(p["projectsId"], {}).get(p["sinksId"])
        if sink is None:
            raise LoggingError(404, f"Sink {p['sinksId']} does not exist")
        return sink

    @staticmethod
    def _check_sink(sink: dict[str, Any]) -> None:
        destination = sink.get("destination") or ""
        if not destination:
            raise LoggingError(400, "A sink destination is required.")
        if not any(r.fullmatch(destination) for r in DESTINATION_RES):
            raise LoggingError(400, f"Invalid destination {destination!r}: expected e.g. "
                                    "pubsub.googleapis.com/projects/[PROJECT_ID]/topics/[TOPIC_ID].")
        compile_filter(sink.get("filter") or "")  # FilterError: 400
        for exclusion in sink.get("exclusions") or []:
            compile_filter(exclusion.get("filter") or "")

    # -- the Log Router ---------------------------------------------------------------------------
    def _route_loop(self) -> None:
        while True:
            with self._router:
                while not self._closing and (not self._routing or self._routing[0][0] > time.monotonic()):
                    self._router.wait(max(0.0, self._routing[0][0] - time.monotonic()) if self._routing else None)
                if self._closing:
                    return
                _, _, entries = heapq.heappop(self._routing)
                self._in_flight += 1
            try:
                self._route(entries)
            except Exception:  # noqa: BLE001 - the router keeps going, like Google's
                log.exception("routing log entries failed")
            finally:
                with self._router:
                    self._in_flight -= 1
                    self._router.notify_all()

    def _route(self, entries: list[dict[str, Any]]) -> None:
        """Each entry through each enabled sink of its project, as the Log Router does."""
        for entry in entries:
            project = entry["logName"].split("/", 2)[1]
            with self._lock:
                sinks = [dict(s) for _, s in sorted(self._sinks.get(project, {}).items()) if not s.get("disabled")]
            for sink in sinks:
                if self._matches(sink, entry):
                    self._export(project, sink, entry)

    @staticmethod
    def _matches(sink: dict[str, Any], entry: dict[str, Any]) -> bool:
        try:
            if not _compiled(sink.get("filter") or "")(entry):
                return False
            return not any(_compiled(x.get("filter") or "")(entry) for x in sink.get("exclusions") or []
                           if not x.get("disabled"))
        except FilterError:  # a comparison this server cannot make on this entry: no match
            return False

    def _export(self, project: str, sink: dict[str, Any], entry: dict[str, Any]) -> None:
        found = PUBSUB_DESTINATION_RE.fullmatch(sink["destination"])
        if found is None:
            return  # a destination this server does not deliver to
        topic = f"projects/{found[1]}/topics/{found[2]}"
        data = base64.b64encode(json.dumps(entry, separators=(",", ":")).encode()).decode()
        try:
            if self.pubsub is None:
                raise PermissionError(f"no Pub/Sub server to publish {topic} to")
            self.pubsub.publish_as(sink["writerIdentity"], topic, data, {TIMESTAMP_ATTRIBUTE: entry["timestamp"]})
        except Exception as e:  # noqa: BLE001 - Google logs a sink error; the entry is not delivered
            with self._lock:
                self.sink_errors.append({"sink": f"projects/{project}/sinks/{sink['name']}",
                                         "insertId": entry.get("insertId"), "error": str(e)})
            return
        with self._lock:
            self.exported.append((f"projects/{project}/sinks/{sink['name']}", entry.get("insertId", "")))


# -- System Event audit entries ------------------------------------------------------------------
def system_event(project: str, zone: str, instance: str, instance_id: str, method: str, *,
                 operation: str | None = None, at_ns: int | None = None) -> dict[str, Any]:
    """A Compute Engine System Event audit entry for ``method`` on an instance, now (or at ``at_ns``),
    as ``controller.core.audit.system_event_entry`` shapes it, with the unique names Google gives."""
    nanos = time.time_ns() if at_ns is None else at_ns
    alphabet = string.ascii_lowercase + string.digits
    return audit.system_event_entry(project, zone, instance, instance_id, method,
                                    datetime.fromtimestamp(nanos // 1000 / 1e6, UTC),
                                    operation=operation or system_event_operation(nanos // 1_000_000),
                                    insert_id="".join(secrets.choice(alphabet) for _ in range(12)))


def system_event_operation(millis: int | None = None) -> str:
    """A system event's operation name as Compute writes it (``systemevent-<ms>-<13 hex>-<8>-<8>``)."""
    millis = int(time.time() * 1000) if millis is None else millis
    return f"systemevent-{millis}-{secrets.token_hex(7)[:13]}-{secrets.token_hex(4)}-{secrets.token_hex(4)}"


def _writer(project: str, unique: bool) -> str:

    return f"serviceAccount:service-{project_number(project)}@gcp-sa-logging.iam.gserviceaccount.com" if unique \
        else SHARED_WRITER


@functools.lru_cache(maxsize=256)
def _compiled(text: str) -> Predicate:
    return compile_filter(text)


def _flag(value: str | None) -> bool:
    return str(value or "").strip().lower() in ("true", "1")


# -- entries -------------------------------------------------------------------------------------
def _entry_problem(entry: dict[str, Any]) -> str | None:
    """Why Google would refuse this entry (as written, its request's defaults applied), or None."""
    name = entry.get("logName")
    if not name:
        return "The log name is missing: set logName on the entry or on the request."
    if not LOG_NAME_RE.fullmatch(name):
        return f"Received an invalid log name: {name!r} (expected projects/[PROJECT_ID]/logs/[LOG_ID], LOG_ID URL-encoded)"
    resource = entry.get("resource")
    if not isinstance(resource, dict) or not resource.get("type"):
        return "A monitored resource must be specified for each log entry (resource.type)."
    if sum(k in entry for k in ("textPayload", "jsonPayload", "protoPayload")) > 1:
        return "A log entry holds at most one payload (textPayload, jsonPayload or protoPayload)."
    for key in ("timestamp", "receiveTimestamp"):
        if key in entry and not (isinstance(entry[key], str) and _RFC3339.fullmatch(entry[key])):
            return f"Invalid value at '{key}' (type.googleapis.com/google.protobuf.Timestamp), {json.dumps(entry[key])}"
    return None


def _projects(body: dict[str, Any]) -> set[str]:
    names = [*(body.get("resourceNames") or []), *(f"projects/{p}" for p in body.get("projectIds") or [])]
    if not names:
        raise LoggingError(400, "resourceNames is required: name at least one parent, e.g. projects/[PROJECT_ID].")
    projects = set()
    for name in names:
        found = re.fullmatch(r"projects/([^/]+)", name)
        if not found:
            raise LoggingError(400, f"Resource name {name!r} is not supported by the local Cloud Logging server "
                                    "(only projects/[PROJECT_ID]).")
        projects.add(found[1])
    return projects


def _token(key: tuple[int, int], query: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([key[0], key[1], query]).encode()).decode()


def _token_key(token: str, query: str) -> tuple[int, int] | None:
    if not token:
        return None
    try:
        nanos, order, made_for = json.loads(base64.urlsafe_b64decode(token.encode()))
        if made_for == query:
            return int(nanos), int(order)
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError):
        pass
    raise LoggingError(400, "Invalid page token: it was not given for this query.")


def _nanos(text: str) -> int:
    """An RFC 3339 time as nanoseconds since the epoch (exact: no float on the way)."""
    m = _RFC3339.fullmatch(text)
    if not m:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    year, month, day, hour, minute, second, fraction, zone = m.groups()
    moment = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), tzinfo=UTC)
    offset = 0 if zone in ("Z", "z") else (int(zone[1:3]) * 60 + int(zone[4:6])) * (1 if zone[0] == "+" else -1)
    seconds = int(moment.timestamp()) - offset * 60
    return seconds * 1_000_000_000 + int((fraction or "0").ljust(9, "0"))


def rfc3339(nanos: int) -> str:
    """RFC 3339 UTC, as Cloud Logging answers a protobuf Timestamp in JSON: "Z", and 0, 3, 6 or 9
    fractional digits, as few as hold it exactly (proto3's JSON mapping)."""
    seconds, fraction = divmod(nanos, 1_000_000_000)
    text = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if fraction == 0:
        return text + "Z"
    digits = f"{fraction:09d}"
    kept = 3 if digits.endswith("000000") else 6 if digits.endswith("000") else 9
    return f"{text}.{digits[:kept]}Z"


def _no_nulls(value: Any) -> Any:
    """``value`` without its null fields: proto3's JSON parser reads a null as the field's default
    (google-cloud-logging sends ``"filter": null`` for a sink without one)."""
    if isinstance(value, dict):
        return {k: _no_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_no_nulls(v) for v in value]
    return value


def _json_names(value: Any, spec: dict[str, Any]) -> Any:
    """``value`` with each field named as its schema's JSON name: proto3's JSON parser takes a
    field's original (snake_case) name as well, and google-cloud-logging sends ``dry_run``."""
    if "$ref" in spec:
        spec = discovery.document(DOC)["schemas"][spec["$ref"]]
    if spec.get("type") == "array" and isinstance(value, list):
        return [_json_names(v, spec.get("items", {})) for v in value]
    props = spec.get("properties")
    if spec.get("type") != "object" or not isinstance(value, dict) or props is None:
        return value
    out = {}
    for key, item in value.items():
        camel = re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), key)
        name = camel if key not in props and camel in props and camel not in value else key
        out[name] = _json_names(item, props[name]) if name in props else item
    return out


# -- the filter language -----------------------------------------------------------------------
Predicate = Callable[[dict[str, Any]], bool]
_TOKEN = re.compile(r"""(\s*)(?:(\()|(\))|"((?:[^"\\]|\\.)*)"|(=~|!~|!=|>=|<=|=|:|<|>)|([^\s()"=:<>!~]+))""")
_ORDERED = {"timestamp", "receiveTimestamp", "severity"}
_FUNCTION = re.compile(r"(?<![\w.-])([A-Za-z_]\w*)\s*\(")


@dataclass
class _Tok:
    kind: str  # "(" ")" "str" "op" "word" "AND" "OR" "NOT"
    text: str
    adjacent: bool  # no whitespace before it


def compile_filter(text: str) -> Predicate:
    """The Logging query ``text`` as a predicate over LogEntry dicts; ``FilterError`` (400) for
    what this server cannot evaluate exactly."""
    if not text.strip():
        return lambda _: True
    if any(m[1] not in ("AND", "OR", "NOT") for m in _FUNCTION.finditer(_strip_strings(text))):
        raise FilterError("functions (SEARCH, log_id, sample, ...) are not supported by the local server")
    parser = _Parser(_tokens(text))
    predicate = parser.expression()
    if parser.tokens:
        raise FilterError(f"unexpected {parser.tokens[0].text!r}")
    return predicate


def _strip_strings(text: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)


def _tokens(text: str) -> list[_Tok]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            if text[pos:].strip():
                raise FilterError(f"cannot parse {text[pos:pos + 40]!r}")
            break
        pos = m.end()
        space, lpar, rpar, string, op, word = m.groups()
        adjacent = not space and bool(out)
        if lpar:
            out.append(_Tok("(", "(", adjacent))
        elif rpar:
            out.append(_Tok(")", ")", adjacent))
        elif string is not None:
            out.append(_Tok("str", re.sub(r"\\(.)", r"\1", string), adjacent))
        elif op:
            out.append(_Tok("op", op, adjacent))
        elif word:
            kind = word if word in ("AND", "OR", "NOT") else "word"
            out.append(_Tok(kind, word, adjacent))
    return out


class _Parser:
    """expression = term {["AND"] term}; term = factor {"OR" factor}; factor = ["NOT" | "-"] (
    "(" expression ")" | comparison): OR binds tighter than AND, as the Logging docs have it."""

    def __init__(self, tokens: list[_Tok]) -> None:
        self.tokens = tokens

    def _peek(self) -> _Tok | None:
        return self.tokens[0] if self.tokens else None

    def _take(self) -> _Tok:
        if not self.tokens:
            raise FilterError("unexpected end of the query")
        return self.tokens.pop(0)

    def expression(self) -> Predicate:
        parts = [self.term()]
        while (t := self._peek()) is not None and t.kind != ")":
            if t.kind == "AND":
                self._take()
            parts.append(self.term())
        return parts[0] if len(parts) == 1 else (lambda e: all(p(e) for p in parts))

    def term(self) -> Predicate:
        parts = [self.factor()]
        while (t := self._peek()) is not None and t.kind == "OR":
            self._take()
            parts.append(self.factor())
        return parts[0] if len(parts) == 1 else (lambda e: any(p(e) for p in parts))

    def factor(self) -> Predicate:
        t = self._take()
        if t.kind == "NOT" or (t.kind == "word" and t.text == "-"):
            inner = self.factor()
            return lambda e: not inner(e)
        if t.kind == "word" and t.text.startswith("-"):
            self.tokens.insert(0, _Tok("word", t.text[1:], t.adjacent))
            inner = self.factor()
            return lambda e: not inner(e)
        if t.kind == "(":
            inner = self.expression()
            if self._take().kind != ")":
                raise FilterError("missing ')'")
            return inner
        if t.kind != "word":
            raise FilterError(f"a comparison (FIELD OP VALUE) was expected at {t.text!r}: global restrictions are "
                              "not supported by the local server")
        path = self._path(t)
        op = self._take()
        if op.kind != "op":
            raise FilterError(f"an operator was expected after {'.'.join(path)!r}: global restrictions are not "
                              "supported by the local server")
        return _comparison(path, op.text, self._values())

    def _path(self, first: _Tok) -> list[str]:
        """A field path; segments may be quoted (``labels."a.b/c"``), joined by dots, no spaces."""
        raw = [first]
        while (t := self._peek()) is not None and t.adjacent and t.kind in ("word", "str") and (
                raw[-1].text.endswith(".") or (t.kind == "word" and t.text.startswith("."))):
            raw.append(self._take())
        segments: list[str] = []
        for t in raw:
            segments += [s for s in t.text.split(".") if s] if t.kind == "word" else [t.text]
        return segments

    def _values(self) -> list[tuple[str, bool]]:
        """One value, or a parenthesized OR-list of them: (text, quoted)."""
        t = self._take()
        if t.kind in ("str", "word"):
            return [(t.text, t.kind == "str")]
        if t.kind != "(":
            raise FilterError(f"a value was expected at {t.text!r}")
        values = []
        while True:
            v = self._take()
            if v.kind not in ("str", "word"):
                raise FilterError(f"a value was expected at {v.text!r}")
            values.append((v.text, v.kind == "str"))
            nxt = self._take()
            if nxt.kind == ")":
                return values
            if nxt.kind != "OR":
                raise FilterError(f"only OR lists of values are supported by the local server, not {nxt.text!r}")


def _comparison(path: list[str], op: str, values: list[tuple[str, bool]]) -> Predicate:
    top = path[0]
    fields = discovery.document(DOC)["schemas"]["LogEntry"]["properties"]
    if top not in fields:
        raise FilterError(f"unknown field {top!r} (LogEntry has no such field)")
    if op in ("!=", "=~", "!~"):
        raise FilterError(f"the {op} operator is not supported by the local server")
    if op in ("<", "<=", ">", ">="):
        if len(path) != 1 or top not in _ORDERED:
            raise FilterError(f"{op} is supported on timestamp, receiveTimestamp and severity only")
        if len(values) != 1:
            raise FilterError(f"{op} takes one value")
        return _ordered(top, op, values[0][0])
    if op == ":" and any(v == ("*", False) for v in values):
        if len(values) != 1:
            raise FilterError(":* takes no other value")
        return lambda e: _lookup(e, path) is not None
    if top in ("timestamp", "receiveTimestamp") and op == "=":
        wanted = {_time_value(v) for v, _ in values}
        return lambda e: (x := _lookup(e, path)) is not None and _nanos(x) in wanted
    if top == "severity" and op == "=":
        levels = {_level(v) for v, _ in values}
        return lambda e: _level(e.get("severity") or "DEFAULT") in levels
    folded = [v.casefold() for v, _ in values]

    def test(e: dict[str, Any]) -> bool:
        found = _lookup(e, path)
        if found is None:
            return False
        if isinstance(found, (dict, list)):
            raise FilterError(f"comparing the whole of {'.'.join(path)!r} is not supported by the local server")
        text = (str(found).lower() if isinstance(found, bool) else str(found)).casefold()
        return any(text == v if op == "=" else v in text for v in folded)

    return test


def _lookup(entry: dict[str, Any], path: list[str]) -> Any:
    current: Any = entry
    for part in path:
        if not isinstance(current, dict) or part not in current:
            return None
        current = current[part]
    return current


def _ordered(name: str, op: str, value: str) -> Predicate:
    if name == "severity":
        bound = _level(value)

        def level(e: dict[str, Any]) -> int | None:
            return _level(e.get("severity") or "DEFAULT")

        get = level
    else:
        bound = _time_value(value)

        def when(e: dict[str, Any]) -> int | None:
            return _nanos(e[name]) if name in e else None

        get = when
    compare = {"<": int.__lt__, "<=": int.__le__, ">": int.__gt__, ">=": int.__ge__}[op]
    return lambda e: (x := get(e)) is not None and compare(x, bound)


def _time_value(value: str) -> int:
    """A time in a query: RFC 3339, or with a ``+hhmm`` offset (what google-cloud-logging's
    default ``timestamp>=`` bound is written with, and Google takes)."""
    try:
        return _nanos(re.sub(r"([+-]\d\d)(\d\d)$", r"\1:\2", value))
    except ValueError:
        raise FilterError(f"{value!r} is not an RFC 3339 time (e.g. \"2026-01-02T03:04:05Z\")") from None


def _level(value: str | int) -> int:
    text = str(value).upper()
    if text in SEVERITIES:
        return SEVERITIES[text]
    if text.isdigit():
        return int(text)
    raise FilterError(f"{value!r} is not a severity")
