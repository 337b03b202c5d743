"""The function as deployed: the tick at a third of a vCPU, its RSS and HTTP requests per job, and a cold start.

    python -m bench.deployed                  # 10,000 jobs at Google's latencies: bench/runs/deployed-<UTC>.json
    python -m bench.deployed --cold-only      # the fleet, then the cold starts alone
    python -m bench.deployed --jobs 20 --quick --scale 0.01   # a smoke run, nothing written

What runs: ``main.py``'s functions served by functions-framework (its gunicorn master and the
worker it forks, as Cloud Functions 2nd gen runs them), with the real google-cloud-storage and
google-cloud-compute clients, against a GCS and a Compute server each in a process of its own,
so the servers' memory and CPU are not the function's. The latencies are the bench's profile,
``localcloud.realism.Realism.google()`` times ``scale``, whatever it holds when this runs (GCS
30 ms a request, Compute 100 ms a call, the aggregated instance list's own figure per page;
drawn around those medians, from ``--seed``); ``deployed_latency_s`` records it.

A 512 MiB Cloud Function gets a third of a vCPU, so the function's processes run inside a cgroup
holding them to a third of one CPU (cgroup v1 ``cpu.cfs_quota_us`` = period / 3, or cgroup v2
``cpu.max``), weighted so that other work on a shared machine does not take it from them; the
servers, which stand for Google's, run in a weighted cgroup of their own (``CpuGroup``). Where no
cgroup can be made, a figure at a third of a vCPU is computed as wall + 2 x
CPU-seconds (the CPU-bound share stretched three times); ``deployed_third_vcpu_method`` says
which. CPU-seconds are the function processes' own (user + system of the master and its worker,
from ``/proc/<pid>/stat``). The figures (``bench/results.json`` keys; issue 40's targets beside
those for 10,000 jobs, as ``<key>_target``, met or missed):

- ``tick_10k_third_vcpu_s`` / ``tick_10k_cpu_s``: the steady tick, a minute after the instance's
  first (its cache filled, every running trainer's heartbeat written again);
  ``tick_10k_first_third_vcpu_s`` / ``tick_10k_first_cpu_s``: that first tick of a fresh instance.
- ``function_rss_10k_mib``: the container's: the peak resident set (``VmHWM``) of the worker that
  ran both ticks plus the master's (``RSS_NOTE``).
- ``tick_10k_http_requests_per_job``: every HTTP request the function sent to GCS and Compute
  during the steady tick (list pages, metadata gets, media reads, uploads, deletes, instance
  lists and gets, operation reads, inserts, and each retry and refused request: a 429 is a
  request too), counted by the servers as they arrive, divided by the jobs.
- ``status_history_events`` / ``status_run_summaries``: what the fleet's statuses held when the
  ticks read them, counted from the bucket.
- ``cold_start_third_vcpu_s``: a fresh ``on_object`` process (the event function, where a cold
  start sits on a recovery's path), from its spawn to its answer to one job's event, the fleet in
  the bucket; three runs without a limit and three in the cgroup, the medians. Each runs from a
  copy of what ``respawn deploy`` uploads, compiled and stamped as Google's build leaves it
  (``workspace``).

The GCS server. fake-gcs-server (``localcloud.gcs``), the local cloud's GCS, reads every object of
a bucket to list a prefix; at 10,000 jobs (about 28,000 objects, 28 pages a listing) one tick's
listing alone costs it minutes of CPU on this machine, and its requests would be counted behind a
proxy that makes several of its own. gcp-storage-emulator (PyPI) would be a new dependency and
answers a list in one response whatever its size (its ``objects.ls`` reads neither ``maxResults``
nor ``pageToken``: no list pages to count) and judges no ``ifGenerationMatch`` on reads, uploads
or deletes (src/gcp_storage_emulator/handlers/objects.py, oittaa/gcp-storage-emulator). So this
module brings its own stand-in (option (a) of the issue): GCS's JSON API in Python, in its own
process, serving exactly what ``controller.adapters.gcs.GcsStore`` sends through
google-cloud-storage (object lists by prefix with ``maxResults``/``pageToken``, ``delimiter``,
``startOffset``/``endOffset``; object metadata gets; media downloads, ``generation=`` and
``mediaLink`` pinned to the generation as Google's are; multipart and media uploads; deletes),
with generations, metagenerations, the four ``if(Meta)generation(Not)Match`` preconditions
(412 ``conditionNotMet``, 304 for ``NotMatch``), crc32c and MD5 (``x-goog-hash``), and GCS's one
mutation per second per object (429 ``rateLimitExceeded``) once the bench's latencies are on.
Objects are held in a sorted index per bucket: a page is a bisection and at most 1,000 entries,
as on GCS. Anything else it is sent is answered 501 and counted as ``unimplemented``, so a
request it does not know cannot pass unnoticed. Compute is the local cloud's own
``localcloud.compute.ComputeServer`` (``run_vms=False``: instances without guest processes),
wrapped to count requests, with the profile's latencies, paging and rate quotas; an aggregated
list of one job's instances is answered from the instances carrying its label rather than by
evaluating its filter on every instance (``_indexed_compute``: the same answer, found as Google
finds it), which made building 10,000 jobs quadratic.

The fleet, built at no latency: each job's status as it stands after twenty runs of it (bench/steady.py:
made by the real controller, a full history and twenty past runs), then its spec; a function
process of its own (not the one measured) begins each job's next run and launches it with three
ticks, as bench/local.py builds its fleet: every job launched, then 20 % exit 0 and 10 % exit 1
(backing off), the rest RUNNING with a heartbeat. What a trainer writes (exit records,
heartbeats) and the past go through the stand-in's side door (``/_bench/objects``: never counted,
never the function's). Then the latencies are turned on and a fresh function instance runs its
first tick and, after a round of heartbeats, the steady tick that is counted.

Not measured (``PLATFORM_NOTE``, written by each run): the platform's container start and image
pull, the metadata server's token fetches (anonymous credentials here; on Google one per token
lifetime, not per request), TLS, network distance beyond the fixed latencies, and Cloud Run's
memory accounting beyond the function processes (its in-memory filesystem). The tick reads no
audit feed (``AUDIT_NOTE``).
"""

from __future__ import annotations

import argparse
import base64
import bisect
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from email.parser import BytesParser
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, quote, unquote

import google_crc32c
import requests

from bench import steady
from bench.run import alone, beside, provenance, target

ROOT = Path(__file__).resolve().parent.parent
BUCKET, CHECKPOINTS, PROJECT = "bench-deployed", "bench-deployed-ckpt", "bench-deployed"
TRAINER = f"respawn-trainer@{PROJECT}.iam.gserviceaccount.com"
SPEC = json.dumps({"zones": ["us-central1-a", "us-central1-b"], "machine_type": "g2-standard-8",
                   "command": "python train.py", "checkpoint": {"uri": f"gs://{CHECKPOINTS}/run"},
                   "policy": {"backoff": {"initial": "30m", "max": "1h"}}})
MIB = 1024 * 1024
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- the GCS stand-in ------------------------------------------------------------------------------
@dataclass
class _Object:
    name: str
    data: bytes
    generation: int
    content_type: str
    created: str
    metageneration: int = 1
    metadata: dict[str, str] | None = None  # custom metadata, listed with the object (a heartbeat's record)
    md5: str = field(init=False)
    crc32c: str = field(init=False)

    def __post_init__(self) -> None:
        self.md5 = base64.b64encode(hashlib.md5(self.data).digest()).decode()
        self.crc32c = base64.b64encode(google_crc32c.Checksum(self.data).digest()).decode()


_OBJECTS = re.compile(r"^/storage/v1/b/([^/]+)/o/?$")
_OBJECT = re.compile(r"^/(download/)?storage/v1/b/([^/]+)/o/(.+)$")
_UPLOAD = re.compile(r"^/upload/storage/v1/b/([^/]+)/o/?$")
_BUCKET = re.compile(r"^/storage/v1/b/([^/]+)/?$")
_CONDITIONS = ("ifMetagenerationMatch", "ifMetagenerationNotMatch", "ifGenerationMatch", "ifGenerationNotMatch")


class _Answer(Exception):
    def __init__(self, status: int, body: Any = None, headers: list[tuple[str, str]] | None = None) -> None:
        super().__init__(status)
        self.status, self.body, self.headers = status, body, headers or []


def _error(status: int, message: str, reason: str) -> _Answer:
    return _Answer(status, {"error": {"code": status, "message": message,
                                      "errors": [{"message": message, "domain": "global", "reason": reason}]}})


class GcsStandIn:
    """GCS's JSON API, the part GcsStore uses, over an in-memory sorted index (a WSGI app)."""

    def __init__(self, buckets: tuple[str, ...] = (), project: str = PROJECT) -> None:
        self.project = project
        self.latency = 0.0  # seconds added to every request, in its own thread
        self.write_interval: float | None = None  # one mutation per object per this many seconds
        self.counts: Counter[str] = Counter()
        self._objects: dict[str, dict[str, _Object]] = {b: {} for b in buckets}
        self._names: dict[str, list[str]] = {b: [] for b in buckets}  # sorted
        self._last_write: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self._generation = 0

    def configure(self, sent: dict[str, Any]) -> None:
        """``{"scale": x, "seed": s}``: ``Realism.google().scaled(x)``'s GCS latency (drawn as the profile
        draws it, from seed ``s``) and per-object write interval; ``{"scale": null}``: none of either."""
        realism = _realism(sent)
        with self._lock:
            self.latency, self.write_interval = realism.gcs_latency, realism.gcs_write_interval
            self._draw = getattr(realism, "draw", lambda median: median)
            self._last_write.clear()

    _draw: Any = staticmethod(lambda median: median)

    # WSGI
    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        target = environ.get("REQUEST_URI") or environ.get("RAW_URI") or environ.get("PATH_INFO", "")
        path, _, query = target.partition("?")
        args = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        method = environ["REQUEST_METHOD"]
        if path.startswith("/_bench/"):
            return self._control(method, path, environ, start_response)
        if self.latency > 0:
            time.sleep(self._draw(self.latency))
        kind = _gcs_kind(method, path, args)
        try:
            status, body, headers = 200, self._route(kind, path, args, environ), []
        except _Answer as a:
            status, body, headers = a.status, a.body, a.headers
        with self._lock:
            self.counts[f"{kind} {status}"] += 1
        if isinstance(body, (dict, list)):
            payload = json.dumps(body).encode()
            headers = [("Content-Type", "application/json; charset=UTF-8"), *headers]
        else:
            payload = body or b""
        start_response(f"{status} {_REASONS.get(status, 'Status')}", [*headers, ("Content-Length", str(len(payload)))])
        return [payload]

    def _control(self, method: str, path: str, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        if path == "/_bench/config" and method == "POST":
            self.configure(json.loads(_body(environ) or b"{}"))
            out: Any = {"ok": True}
        elif path == "/_bench/objects" and method == "POST":
            out = self._bulk(json.loads(_body(environ)))
        elif path == "/_bench/counts":
            with self._lock:
                out = dict(self.counts)
                if method == "POST":  # read and reset
                    self.counts.clear()
        else:
            out = {"error": "unknown control"}
        payload = json.dumps(out).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))])
        return [payload]

    def _bulk(self, sent: dict[str, Any]) -> dict[str, Any]:
        """The bench's own side door, never counted and never the function's: ``{"bucket": b,
        "read": [names]}`` answers ``{name: text}`` (the missing left out); ``{"bucket": b,
        "write": {name: text}}`` writes each as a new generation (the fleet's records, in one request),
        ``{name: {"data": text, "metadata": {...}}}`` with custom metadata (as a VM agent writes a heartbeat)."""
        bucket = sent["bucket"]
        with self._lock:
            objects = self._bucket(bucket)
            if "read" in sent:
                return {n: objects[n].data.decode() for n in sent["read"] if n in objects}
            for name, written in sent.get("write", {}).items():
                text, metadata = (written["data"], written.get("metadata")) if isinstance(written, dict) else (written, None)
                self._generation = max(self._generation + 1, time.time_ns() // 1000)
                if name not in objects:
                    bisect.insort(self._names[bucket], name)
                objects[name] = _Object(name, text.encode(), self._generation, "application/octet-stream", _now(),
                                        metadata=_custom(metadata))
            return {"written": len(sent.get("write", {}))}

    def _route(self, kind: str, path: str, args: dict[str, str], environ: dict[str, Any]) -> Any:
        if kind == "list":
            return self._list(unquote(_OBJECTS.match(path)[1]), args, environ)  # type: ignore[index]
        if kind == "upload":
            return self._upload(unquote(_UPLOAD.match(path)[1]), args, environ)  # type: ignore[index]
        if kind in ("media", "get", "delete"):
            m = _OBJECT.match(path)
            assert m
            bucket, name = unquote(m[2]), unquote(m[3])
            if kind == "media":
                return self._media(bucket, name, args)
            if kind == "delete":
                return self._delete(bucket, name, args)
            with self._lock:
                return self._resource(self._judged(bucket, name, args), environ, bucket)
        if kind == "bucket":
            bucket = unquote(_BUCKET.match(path)[1])  # type: ignore[index]
            if bucket not in self._objects:
                raise _error(404, "The specified bucket does not exist.", "notFound")
            return {"kind": "storage#bucket", "name": bucket, "id": bucket, "location": "US-CENTRAL1",
                    "storageClass": "STANDARD", "metageneration": "1"}
        raise _error(501, f"{path}: not implemented by the bench's GCS stand-in", "notImplemented")

    def _bucket(self, bucket: str) -> dict[str, _Object]:
        try:
            return self._objects[bucket]
        except KeyError:
            raise _error(404, "The specified bucket does not exist.", "notFound") from None

    def _judged(self, bucket: str, name: str, args: dict[str, str], creating: bool = False) -> _Object | None:
        """The object now, once the request's preconditions hold (the caller holds the lock or reads)."""
        current = self._bucket(bucket).get(name)
        if current is None and not creating:
            raise _error(404, f"No such object: {bucket}/{name}", "notFound")
        if current is not None and "generation" in args and not creating and args["generation"] != str(current.generation):
            raise _error(404, f"No such object: {bucket}/{name}#{args['generation']}", "notFound")
        for condition in _CONDITIONS:
            if condition not in args:
                continue
            try:
                wanted = int(args[condition])
            except ValueError:
                raise _error(400, f"Invalid value for parameter {condition}: {args[condition]}", "invalid") from None
            actual = None if current is None else (
                current.metageneration if condition.startswith("ifMeta") else current.generation)
            if condition.endswith("NotMatch"):
                if not (current is not None if wanted == 0 else actual != wanted):
                    raise _Answer(304)
            elif not (current is None if wanted == 0 else actual == wanted):
                raise _error(412, "At least one of the pre-conditions you specified did not hold.", "conditionNotMet")
        return current

    def _resource(self, obj: _Object | None, environ: dict[str, Any], bucket: str) -> dict[str, Any]:
        assert obj is not None
        here = f"http://{environ.get('HTTP_HOST', '127.0.0.1')}"
        path = f"b/{quote(bucket, safe='')}/o/{quote(obj.name, safe='')}"
        return {"kind": "storage#object", "id": f"{bucket}/{obj.name}/{obj.generation}",
                "selfLink": f"{here}/storage/v1/{path}",
                "mediaLink": f"{here}/download/storage/v1/{path}?generation={obj.generation}&alt=media",
                "name": obj.name, "bucket": bucket, "generation": str(obj.generation),
                "metageneration": str(obj.metageneration), "contentType": obj.content_type,
                "storageClass": "STANDARD", "size": str(len(obj.data)), "md5Hash": obj.md5, "crc32c": obj.crc32c,
                "etag": base64.b64encode(f"{obj.generation}/{obj.metageneration}".encode()).decode(),
                "timeCreated": obj.created, "updated": obj.created, "timeStorageClassUpdated": obj.created,
                **({"metadata": obj.metadata} if obj.metadata else {})}

    def _list(self, bucket: str, args: dict[str, str], environ: dict[str, Any]) -> dict[str, Any]:
        objects, names = self._bucket(bucket), self._names[bucket]
        prefix, delimiter = args.get("prefix", ""), args.get("delimiter") or None
        size = max(1, min(int(args.get("maxResults") or 1000), 1000))
        start = max(prefix, args.get("startOffset", ""))
        if token := args.get("pageToken"):
            start = max(start, base64.urlsafe_b64decode(token.encode()).decode())
        end = args.get("endOffset")
        items: list[dict[str, Any]] = []
        prefixes: list[str] = []
        with self._lock:
            i = bisect.bisect_left(names, start)
            next_token = None
            while i < len(names):
                name = names[i]
                if not name.startswith(prefix) or (end is not None and name >= end):
                    break
                if len(items) + len(prefixes) == size:
                    next_token = base64.urlsafe_b64encode(name.encode()).decode()
                    break
                if delimiter and (cut := name.find(delimiter, len(prefix))) >= 0:
                    common = name[:cut + len(delimiter)]
                    prefixes.append(common)
                    i = bisect.bisect_left(names, common[:-1] + chr(ord(common[-1]) + 1))  # past the whole prefix
                    continue
                items.append(self._resource(objects[name], environ, bucket))
                i += 1
        out: dict[str, Any] = {"kind": "storage#objects"}
        if items:
            out["items"] = items
        if prefixes:
            out["prefixes"] = prefixes
        if next_token:
            out["nextPageToken"] = next_token
        return out

    def _media(self, bucket: str, name: str, args: dict[str, str]) -> bytes:
        with self._lock:
            obj = self._judged(bucket, name, args)
        assert obj is not None
        raise _Answer(200, obj.data, [("Content-Type", obj.content_type), ("x-goog-generation", str(obj.generation)),
                                      ("x-goog-metageneration", str(obj.metageneration)),
                                      ("x-goog-hash", f"crc32c={obj.crc32c},md5={obj.md5}"),
                                      ("x-goog-stored-content-length", str(len(obj.data))),
                                      ("x-goog-stored-content-encoding", "identity"),
                                      ("x-goog-storage-class", "STANDARD")])

    def _upload(self, bucket: str, args: dict[str, str], environ: dict[str, Any]) -> dict[str, Any]:
        body = _body(environ)
        kind = args.get("uploadType", "")
        metadata: dict[str, Any] = {}
        content_type = environ.get("CONTENT_TYPE") or "application/octet-stream"
        if kind == "multipart":
            message = BytesParser().parsebytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
            parts = message.get_payload() if message.is_multipart() else []
            if len(parts) != 2:
                raise _error(400, "a multipart upload has two parts", "invalid")
            metadata = json.loads(parts[0].get_payload(decode=True) or b"{}")
            data = parts[1].get_payload(decode=True) or b""
            content_type = metadata.get("contentType") or parts[1].get_content_type()
        elif kind == "media":
            data = body
        else:
            raise _error(501, f"uploadType={kind}: not implemented by the bench's GCS stand-in", "notImplemented")
        name = args.get("name") or metadata.get("name")
        if not name:
            raise _error(400, "Required: name", "required")
        with self._lock:
            self._bucket(bucket)
            self._judged(bucket, name, args, creating=True)
            self._rate(bucket, name)
            self._generation = max(self._generation + 1, time.time_ns() // 1000)
            obj = _Object(name, data, self._generation, content_type, _now(), metadata=_custom(metadata.get("metadata")))
            if "crc32c" in metadata and metadata["crc32c"] != obj.crc32c:
                raise _error(400, "Provided CRC32C does not match calculated CRC32C.", "invalid")
            if "md5Hash" in metadata and metadata["md5Hash"] != obj.md5:
                raise _error(400, "Provided MD5 hash does not match calculated MD5 hash.", "invalid")
            if name not in self._objects[bucket]:
                bisect.insort(self._names[bucket], name)
            self._objects[bucket][name] = obj
        return self._resource(obj, environ, bucket)

    def _delete(self, bucket: str, name: str, args: dict[str, str]) -> bytes:
        with self._lock:
            self._judged(bucket, name, args)
            self._rate(bucket, name)
            del self._objects[bucket][name]
            names = self._names[bucket]
            del names[bisect.bisect_left(names, name)]
        raise _Answer(204)

    def _rate(self, bucket: str, name: str) -> None:
        now = time.monotonic()
        if self.write_interval is not None:
            last = self._last_write.get((bucket, name))
            if last is not None and now - last < float(self.write_interval):
                raise _error(429, f"The object {bucket}/{name} exceeded the rate limit for object mutation "
                                  "operations (create, update, and delete). Please reduce your request rate. "
                                  "See https://cloud.google.com/storage/docs/gcs429.", "rateLimitExceeded")
        self._last_write[(bucket, name)] = now


def _custom(metadata: Any) -> dict[str, str] | None:
    """An object resource's custom metadata as GCS keeps it: string keys and values, or none."""
    if not isinstance(metadata, dict) or not metadata:
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise _error(400, "custom metadata: string keys and values only", "invalid")
    return dict(metadata)


def _gcs_kind(method: str, path: str, args: dict[str, str]) -> str:
    """What a request to GCS is: list, get, media, upload, delete, bucket, or unimplemented."""
    if _OBJECTS.match(path):
        return "list" if method == "GET" else "unimplemented"
    if _UPLOAD.match(path):
        return "upload" if method == "POST" and args.get("uploadType") in ("multipart", "media") else "unimplemented"
    if m := _OBJECT.match(path):
        if re.search(r"/(copyTo|rewriteTo|compose|acl)(/|$)", m[3]):
            return "unimplemented"
        if method == "GET":
            return "media" if m[1] or args.get("alt") == "media" else "get"
        return "delete" if method == "DELETE" else "unimplemented"
    return "bucket" if _BUCKET.match(path) and method == "GET" else "unimplemented"


_REASONS = {200: "OK", 204: "No Content", 304: "Not Modified", 400: "Bad Request", 404: "Not Found",
            412: "Precondition Failed", 429: "Too Many Requests", 501: "Not Implemented"}


def _body(environ: dict[str, Any]) -> bytes:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    return environ["wsgi.input"].read(length) if length else b""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- Compute, counted ------------------------------------------------------------------------------
_COMPUTE_KINDS = (
    (re.compile(r"/aggregated/instances"), "instances.aggregatedList"),
    (re.compile(r"/operations/[^/]+/wait$"), "operations.wait"),
    (re.compile(r"/operations/[^/]+$"), "operations.get|delete"),
    (re.compile(r"/operations$"), "operations.list"),
    (re.compile(r"/bulkInsert$"), "instances.bulkInsert"),
    (re.compile(r"/advice/"), "advice"),
    (re.compile(r"/zones/[^/]+/instances$"), "instances.list|insert"),
    (re.compile(r"/zones/[^/]+/instances/[^/]+$"), "instances.get|delete"),
)


def _compute_kind(method: str, path: str) -> str:
    for pattern, kind in _COMPUTE_KINDS:
        if pattern.search(path):
            if "|" in kind:
                resource, verbs = kind.split(".")
                get, other = verbs.split("|")
                return f"{resource}.{get if method == 'GET' else other}"
            return kind
    return f"other {method} {re.sub(r'/projects/[^/]+/(zones|regions)/[^/]+', '/…', path)}"


class _Counted:
    """A WSGI app whose requests are counted by kind and status; ``/_bench/`` is its control."""

    def __init__(self, app: Any, configure: Any) -> None:
        self.app, self.configure = app, configure
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO", "")
        if path.startswith("/_bench/"):
            if path == "/_bench/config":
                self.configure(json.loads(_body(environ) or b"{}"))
                out: Any = {"ok": True}
            else:
                with self._lock:
                    out = dict(self.counts)
                    if environ["REQUEST_METHOD"] == "POST":
                        self.counts.clear()
            payload = json.dumps(out).encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))])
            return [payload]
        kind = _compute_kind(environ["REQUEST_METHOD"], path)

        def counted(status: str, headers: Any, *exc: Any) -> Any:
            with self._lock:
                self.counts[f"{kind} {status.split()[0]}"] += 1
            return start_response(status, headers, *exc)

        return self.app(environ, counted)


_ONE_JOB = re.compile(r'^\((?P<managed>.*)\) AND \(labels\.respawn-job = "(?P<job>[a-z0-9-]+)"\)$')


def _indexed_compute() -> Any:
    """``ComputeServer`` whose aggregated list of one job's instances (what each job's first launch
    asks: ``(managed) AND (labels.respawn-job = "JOB")``) looks only at the instances carrying that
    label, instead of evaluating the filter on every instance of the project: the same answer (no
    instance without the label can match the AND; a name without wildcards matches only itself),
    found as Google finds it, from an index rather than a scan. Without it, building a fleet of
    10,000 cost about 10,000 x 10,000 filter evaluations in the server (most of a 17-minute run)."""
    from localcloud.compute import ComputeServer

    class View:
        """The server as its method sees it, its instances narrowed to ``vms``."""

        def __init__(self, server: Any, vms: dict[Any, Any]) -> None:
            self.__dict__.update(_server=server, _vms=vms)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._server, name)

    class Indexed(ComputeServer):  # type: ignore[misc,valid-type]
        def _instances_aggregatedList(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
            one = _ONE_JOB.match(q.get("filter") or "")
            if one is None:
                return super()._instances_aggregatedList(p, q, body)
            with self._lock:
                vms = {key: vm for key, vm in self._vms.items()
                       if (vm.resource.get("labels") or {}).get("respawn-job") == one["job"]}
            return ComputeServer._instances_aggregatedList(View(self, vms), p, q, body)

    return Indexed


def _realism(sent: dict[str, Any]) -> Any:
    """A server's profile from the bench's ``/_bench/config``: Google's at ``scale`` (its draws seeded), or none."""
    from dataclasses import replace

    from localcloud.realism import Realism

    if sent.get("scale") is None:
        return Realism()
    return replace(Realism.google().scaled(float(sent["scale"])), seed=int(sent.get("seed") or 0))


def _serve(kind: str) -> None:
    """This process serves GCS or Compute until its stdin closes (its parent's end); prints the port."""
    from localcloud.http import Served

    if kind == "gcs":
        app: Any = GcsStandIn((BUCKET, CHECKPOINTS))
        served = Served(app, "gcs-standin", threads=64)
    else:
        from localcloud import compute as local_compute

        server = _indexed_compute()(run_vms=False, shutdown_budget=0.5)

        def configure(sent: dict[str, Any]) -> None:
            realism = _realism(sent)
            server.realism = realism
            server.faults.insert_seconds = local_compute.QUICK if realism.insert_seconds is None else realism.insert_seconds
            server.faults.delete_seconds = local_compute.QUICK if realism.delete_seconds is None else realism.delete_seconds

        inner = server._app  # noqa: SLF001 - counted around, served as ComputeServer.start serves it
        server._app = lambda: _Counted(inner(), configure)  # type: ignore[method-assign]
        server.start()
        served = server._served  # noqa: SLF001
    print(served.port, flush=True)
    sys.stdin.read()  # until the parent goes
    os._exit(0)


class _Server:
    def __init__(self, kind: str, group: CpuGroup | None = None) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "bench.deployed", "--serve", kind], cwd=ROOT,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        preexec_fn=group.enter() if group else None)
        line = self.process.stdout.readline() if self.process.stdout else ""
        if not line.strip():
            raise RuntimeError(f"the {kind} server did not start")
        self.url = f"http://127.0.0.1:{int(line)}"
        self.session = requests.Session()
        self.session.trust_env = False

    def config(self, **sent: Any) -> None:
        self.session.post(f"{self.url}/_bench/config", json=sent, timeout=30).raise_for_status()

    def read(self, bucket: str, names: list[str]) -> dict[str, str]:
        answer = self.session.post(f"{self.url}/_bench/objects", json={"bucket": bucket, "read": names}, timeout=300)
        answer.raise_for_status()
        return answer.json()

    def write(self, bucket: str, objects: dict[str, Any]) -> None:
        self.session.post(f"{self.url}/_bench/objects", json={"bucket": bucket, "write": objects},
                          timeout=300).raise_for_status()

    def stat(self, bucket: str, name: str) -> dict[str, Any]:
        """An object's metadata, through the JSON API (counted: read before a count is reset)."""
        answer = self.session.get(f"{self.url}/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}",
                                  timeout=30)
        answer.raise_for_status()
        return answer.json()

    def counts(self, reset: bool = False) -> Counter[str]:
        answer = (self.session.post if reset else self.session.get)(f"{self.url}/_bench/counts", timeout=30)
        answer.raise_for_status()
        return Counter(answer.json())

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# -- the function's processes ----------------------------------------------------------------------
def _proc_cpu(pid: int) -> float:
    """User + system CPU-seconds of one process, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _pss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class Function:
    """``main.<target>`` (``tick``, or ``on_object``: a CloudEvent function) served by functions-framework
    in a fresh process (its gunicorn master), as Cloud Functions starts an instance; ``worker`` is the
    process gunicorn forks to serve it."""

    def __init__(self, env: dict[str, str], cgroup: Path | None = None, target: str = "tick",
                 source: Path = ROOT) -> None:
        self.port = _free_port()
        tasks = cgroup / "cgroup.procs" if cgroup else None

        def enter_cgroup() -> None:  # in the child, before exec: all it runs and forks is held to the quota
            if tasks is not None:
                tasks.write_text(str(os.getpid()))

        self.spawned = time.perf_counter()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "functions_framework", "--target", target, "--source", str(source / "main.py"),
             "--host", "127.0.0.1", "--port", str(self.port),
             *(["--signature-type", "cloudevent"] if target != "tick" else [])],
            cwd=source, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
            preexec_fn=enter_cgroup if tasks else None, start_new_session=True)
        self.listening = self._wait_listening() - self.spawned
        self.session = requests.Session()
        self.session.trust_env = False

    def _wait_listening(self, timeout: float = 120) -> float:
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"functions-framework exited with {self.process.returncode}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return time.perf_counter()
            time.sleep(0.005)
        raise RuntimeError(f"functions-framework did not listen on {self.port} within {timeout}s")

    @property
    def worker(self) -> int:
        deadline = time.perf_counter() + 30
        while not (workers := _children(self.process.pid)) and time.perf_counter() < deadline:
            time.sleep(0.01)  # gunicorn forks its worker once it listens
        if len(workers) != 1:
            raise RuntimeError(f"expected one gunicorn worker under {self.process.pid}, found {workers}")
        return workers[0]

    def tick(self) -> dict[str, Any]:
        answer = self.session.post(f"http://127.0.0.1:{self.port}/", json={}, timeout=1800)
        if answer.status_code != 200:
            raise RuntimeError(f"tick answered {answer.status_code}: {answer.text[:500]}")
        return answer.json()

    def event(self, headers: dict[str, str], body: bytes) -> None:
        """One CloudEvent, as Eventarc pushes it (binary mode); its answer's status is all it returns."""
        answer = self.session.post(f"http://127.0.0.1:{self.port}/", data=body, headers=headers, timeout=600)
        if answer.status_code != 200:
            raise RuntimeError(f"the event answered {answer.status_code}: {answer.text[:500]}")

    def cpu(self) -> float:
        """CPU-seconds of the master and its worker so far."""
        return sum(_proc_cpu(pid) for pid in (self.process.pid, *_children(self.process.pid)))

    def close(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- a third of a vCPU -----------------------------------------------------------------------------
class CpuGroup:
    """A cpu cgroup for some of the bench's processes, or ``path`` None where none can be made.

    ``third`` holds them to a third of one CPU (CFS quota = period / 3): a 512 MiB Cloud Function's
    share. Every group is weighted ten times a process's default (cgroup v1 ``cpu.shares`` 10240, v2
    ``cpu.weight`` 1000), so that on a machine shared with other work they still get it: the function
    its third (never less because others are busy), the servers, which stand for Google's (never on
    the function's CPUs), what they need."""

    def __init__(self, role: str, third: bool) -> None:
        self.path: Path | None = None
        self.why, self.kind = "", ""
        name = f"respawn-bench-{os.getpid()}-{role}"
        v2 = Path("/sys/fs/cgroup/cgroup.controllers")
        try:
            if v2.exists() and "cpu" in v2.read_text().split():
                path = Path("/sys/fs/cgroup") / name
                path.mkdir()
                settings = {**({"cpu.max": "33333 100000"} if third else {}), "cpu.weight": "1000"}
                version = "cgroup v2"
            else:
                path = Path("/sys/fs/cgroup/cpu") / name
                path.mkdir()
                settings = {**({"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "33333"} if third else {}),
                            "cpu.shares": "10240"}
                version = "cgroup v1"
            self.path = path
            for key, value in settings.items():
                (path / key).write_text(value)
            self.kind = f"{version} " + ", ".join(f"{k} = {v}" for k, v in settings.items())
        except OSError as e:
            self.why = f"no cgroup could be made here ({e})"
            self.close()

    def enter(self) -> Any:
        """For ``preexec_fn``: the child joins the group before it execs (all it forks stays in it)."""
        if self.path is None:
            return None
        procs = self.path / "cgroup.procs"
        return lambda: procs.write_text(str(os.getpid()))

    def close(self) -> None:
        if self.path is not None:
            for _ in range(50):  # its processes may take a moment to be gone
                try:
                    self.path.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
            self.path = None


class ThirdOfCpu(CpuGroup):
    """The function's group: a third of one CPU."""

    def __init__(self) -> None:
        super().__init__("function", third=True)


# -- the fleet -------------------------------------------------------------------------------------------
RUNNING_TICKS = 10  # the builder's ticks after the launch, at most, until every job reads RUNNING
CHUNK = 250  # statuses a side-door request carries (about 55 KB each at their steady size)


class Head(NamedTuple):
    """What the bench reads of a status to write a trainer's records: never the function's parse."""

    phase: str
    attempt: int
    token: str


class Fleet:
    """``jobs`` in the stand-in's bucket, written and read through its side door (a request per
    ``CHUNK`` jobs: the fleet's trainers and its past are not what is measured); the function
    launches them."""

    def __init__(self, gcs: _Server, jobs: int) -> None:
        self.gcs, self.jobs = gcs, [f"job-{i:05d}" for i in range(jobs)]

    def chunks(self) -> list[list[str]]:
        return [self.jobs[i:i + CHUNK] for i in range(0, len(self.jobs), CHUNK)]

    def pasts(self, seed: int) -> int:
        """Each job's status at its steady size (bench/steady.py: twenty runs over, a full history),
        before its spec is written: the function's launch begins its next run. Returns one's bytes."""
        from controller.core import names

        template = steady.past(BUCKET, PROJECT, SPEC, datetime.now(timezone.utc) - timedelta(hours=1), seed=seed)
        for chunk in self.chunks():
            self.gcs.write(BUCKET, {names.status_key(j): steady.for_job(template, j).decode() for j in chunk})
        return len(template)

    def specs(self) -> None:
        from controller.core import names

        self.gcs.write(BUCKET, {names.spec_key(j): SPEC for j in self.jobs})

    def raw_statuses(self) -> Iterator[tuple[str, str]]:
        from controller.core import names

        for chunk in self.chunks():
            found = self.gcs.read(BUCKET, [names.status_key(j) for j in chunk])
            yield from ((j, found[names.status_key(j)]) for j in chunk if names.status_key(j) in found)

    def heads(self) -> dict[str, Head]:
        heads = {}
        for job, text in self.raw_statuses():
            st = json.loads(text)
            heads[job] = Head(st.get("phase", ""), int(st.get("attempt") or 0), st.get("attempt_token") or "")
        return heads

    def sizes(self) -> dict[str, Any]:
        """What the fleet's statuses hold, as stored (bench/steady.py: ``Sizes``)."""
        sizes = steady.Sizes()
        for _, text in self.raw_statuses():
            sizes.add(text)
        return sizes.figures()

    def records(self, key: Any, extra: Any, which: Any = lambda job, head: True, listed: bool = False) -> int:
        """A record at ``key(job)`` for each job's current attempt, with its token, as its VM agent writes
        it; ``listed``: its fields also in the object's custom metadata, as the agent writes a heartbeat."""
        from controller.core import names
        from controller.core.world import listing_metadata

        written = 0
        heads = self.heads()
        for chunk in self.chunks():
            batch: dict[str, Any] = {}
            for j in chunk:
                if (h := heads.get(j)) is None or not which(j, h):
                    continue
                body = {"instance": names.instance_name(j, h.attempt), "attempt": h.attempt, "node": 0,
                        "token": h.token, **extra(j)}
                batch[key(j)] = {"data": json.dumps(body), "metadata": listing_metadata(body)} if listed else \
                    json.dumps(body)
            self.gcs.write(BUCKET, batch)
            written += len(batch)
        return written

    def finish_some(self) -> int:
        """20 % of the jobs exit 0, 10 % exit 1 (they back off): the bench's steady mix."""
        from controller.core import names

        mix = {j: i % 10 for i, j in enumerate(self.jobs) if i % 10 in (0, 1, 2)}
        return self.records(names.exit_key, lambda j: {"exit_code": 0 if mix[j] < 2 else 1}, lambda j, h: j in mix)

    def heartbeats(self) -> int:
        from controller.core import names

        return self.records(names.heartbeat_key, lambda j: {},
                            lambda j, h: h.phase not in ("SUCCEEDED", "FAILED", "CANCELLED"), listed=True)


# -- the scenario --------------------------------------------------------------------------------------
# Written by every run beside its figures: what it measured, and what it did not.
AUDIT_NOTE = (
    "The tick reads no audit feed: Compute's System Event entries go to on_audit, where an entry only wakes its "
    "job's pass (controller/service/functions.on_audit; the tick's Logging read and its watermark were removed in "
    "68b179e). There is no audit read for the measured tick to turn on; on_audit is not run here.")
PLATFORM_NOTE = (
    "Not measured: the platform's own part of a cold start (Cloud Run placing the instance, starting its sandbox "
    "and container from the image) comes before the process's spawn, where these figures begin; Google publishes "
    "no figure for it. Nor the metadata server's token fetches (anonymous credentials here), TLS, or memory the "
    "container holds outside the function's two processes (its in-memory filesystem).")
RSS_NOTE = (
    "function_rss_*_mib: the container's two processes (functions-framework's gunicorn master and the worker that "
    "ran the ticks), each at its peak (VmHWM, /proc/<pid>/status): the worker's over the first and the steady "
    "tick, plus the master's. Pages the worker still shares with the master since the fork count in both: an "
    "upper bound by at most the master's own (function_master_rss_mib).")


def _env(gcs: str, compute: str, bucket: str, project: str) -> dict[str, str]:
    return {**os.environ, "STORAGE_EMULATOR_HOST": gcs, "RESPAWN_COMPUTE_ENDPOINT": compute,
            "RESPAWN_BUCKET": bucket, "RESPAWN_PROJECT": project,
            "RESPAWN_TRAINER_SERVICE_ACCOUNT": f"respawn-trainer@{project}.iam.gserviceaccount.com",
            "RESPAWN_LOG_FORMAT": "text", "PYTHONUNBUFFERED": "1"}


def cold_starts(env: dict[str, str], events: list[tuple[dict[str, str], bytes]],
                cgroup: Path | None) -> list[dict[str, float]]:
    """A fresh ``on_object`` process for each event, one after another: each from its spawn to
    its answer to that event (one job's pass), run from what ``respawn deploy`` uploads as
    Google's build leaves it (``workspace``)."""
    out = []
    with workspace() as source:
        for headers, body in events:
            function = Function({**env, "PYTHONDONTWRITEBYTECODE": "1"}, cgroup, target="on_object", source=source)
            try:
                function.event(headers, body)
                wall = time.perf_counter() - function.spawned
                out.append({"wall_s": wall, "cpu_s": function.cpu(), "listening_s": function.listening,
                            "pid": function.process.pid})
            finally:
                function.close()
    return out


@contextlib.contextmanager
def workspace() -> Iterator[Path]:
    """What a fresh instance on Google finds, in a temporary folder: a copy of what ``respawn
    deploy`` uploads (controller.cli.revision.uploaded: no ``__pycache__``), built as Google's
    build does it, then stamped as the image's layers are.

    The functions-framework buildpack runs ``python3 -m compileall -f -q .`` in the source
    (GoogleCloudPlatform/buildpacks cmd/python/functions_framework/lib/lib.go) with the build's
    environment, which holds deploy's ``--set-build-env-vars`` (``deploy.BUILD_ENV``); then the
    lifecycle writes every layer with each file's mtime set to 1980-01-01 00:00:01 UTC
    (buildpacks/lifecycle, archive.NormalizedModTime). A timestamp ``.pyc`` is then stale and
    the instance compiles respawn's modules again; deploy's SOURCE_DATE_EPOCH makes them
    checked-hash ``.pyc`` files, valid whatever the mtimes (PEP 552). The dependencies' own are
    written ``unchecked-hash`` by the Python buildpack (pkg/python/python.go) and stay valid.
    Run from here with ``PYTHONDONTWRITEBYTECODE``, as an instance's writes would be lost with it."""
    from controller.cli import deploy, revision

    with tempfile.TemporaryDirectory(prefix="respawn-workspace-") as folder:
        for relative, path in revision.uploaded(ROOT):
            target = Path(folder) / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target, follow_symlinks=False)
        env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
        subprocess.run([sys.executable, "-m", "compileall", "-f", "-q", "."], cwd=folder, check=True,
                       env={**env, **deploy.BUILD_ENV}, stdout=subprocess.DEVNULL)
        stamp = datetime(1980, 1, 1, 0, 0, 1, tzinfo=timezone.utc).timestamp()
        for path in [*Path(folder).rglob("*"), Path(folder)]:
            os.utime(path, (stamp, stamp), follow_symlinks=False)
        yield Path(folder)


def _spec_event(gcs: _Server, job: str) -> tuple[dict[str, str], bytes]:
    """The CloudEvent Eventarc posts when ``job``'s spec is finalized (as its generation stands)."""
    from types import SimpleNamespace

    from controller.core import names
    from localcloud.events import finalized

    meta = gcs.stat(BUCKET, names.spec_key(job))
    created = datetime.fromisoformat(meta["timeCreated"].replace("Z", "+00:00"))
    blob = SimpleNamespace(name=meta["name"], generation=int(meta["generation"]),
                           metageneration=int(meta["metageneration"]), size=int(meta["size"]),
                           content_type=meta["contentType"], time_created=created, updated=created)
    return finalized(BUCKET, blob)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _requests(counts: Counter[str]) -> int:
    return sum(counts.values())


def _label(jobs: int) -> str:
    return {10000: "10k", 1000: "1k", 100: "100"}.get(jobs, str(jobs))


@dataclass
class _Bench:
    """The servers, the cgroup and the fleet one measurement shares."""

    gcs: _Server
    compute: _Server
    third: ThirdOfCpu
    fleet: Fleet
    scale: float
    seed: int
    env: dict[str, str] = field(default_factory=dict)

    def google(self) -> None:
        self.gcs.config(scale=self.scale, seed=self.seed)
        self.compute.config(scale=self.scale, seed=self.seed)

    def off(self) -> None:
        self.gcs.config(scale=None)
        self.compute.config(scale=None)

    def counts(self) -> tuple[Counter[str], Counter[str]]:
        """What each server was sent since the last call (and from now on, nothing)."""
        return self.gcs.counts(reset=True), self.compute.counts(reset=True)

    def third_of(self, wall: float, cpu: float) -> float:
        """Seconds at a third of a vCPU: measured (the function ran in the cgroup), or computed."""
        return wall if self.third.path else wall + 2 * cpu

    @property
    def method(self) -> str:
        return f"measured: {self.third.kind}" if self.third.path else \
            f"computed: wall + 2 x CPU-seconds ({self.third.why})"


def build(b: _Bench, steady_size: bool) -> dict[str, Any]:
    """The fleet, at no latency, launched by a function process of its own (as bench/local.py builds
    it): each job's past (``steady_size``), its spec; the launch, RUNNING, 30 % exits; heartbeats."""
    b.off()
    phases: dict[str, float] = {}
    build_requests: dict[str, dict[str, int]] = {}
    started = mark = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal mark
        phases[name] = round(time.perf_counter() - mark, 1)
        mark = time.perf_counter()
        if name.endswith("_tick"):  # what the builder's tick sent
            build_requests[name] = dict(sum(b.counts(), Counter()))

    past_bytes = b.fleet.pasts(b.seed) if steady_size else 0
    phase("pasts")
    b.fleet.specs()
    phase("specs")
    b.counts()
    builder = Function(b.env)
    try:
        phase("builder_start")
        builder.tick()
        phase("launch_tick")
        # Until every launched job reads RUNNING: on a loaded machine an insert can still be
        # provisioning at the next tick, and the bench's mix is drawn from the RUNNING ones.
        for _ in range(RUNNING_TICKS):
            builder.tick()
            if not any(h.phase in ("PENDING", "PROVISIONING") for h in b.fleet.heads().values()):
                break
            time.sleep(1)
        phase("running_tick")
        finished = b.fleet.finish_some()
        phase("exit_records")
        builder.tick()
        phase("exits_tick")
    finally:
        builder.close()
    phase("builder_stop")
    beating = b.fleet.heartbeats()
    phase("heartbeats")
    sizes = b.fleet.sizes()
    return {"build_s": round(time.perf_counter() - started, 1), "build_phases_s": phases,
            "build_http_requests": build_requests,
            "fleet_phases": dict(Counter(h.phase for h in b.fleet.heads().values())),
            "fleet_exit_records": finished, "fleet_heartbeats": beating,
            # What the statuses held when the ticks read them, counted from the bucket, not assumed.
            "status_history_events": sizes["history_events"].get("median", 0),
            "status_run_summaries": sizes["run_summaries"].get("median", 0),
            "status_sizes": sizes, "status_past_bytes": past_bytes,
            "status_note": (
                f"Each job's status was written first as it stands after {steady.RUNS} runs of it made by the real "
                "controller over the in-memory fakes (bench/steady.py: launches, heartbeats with steps and saves, "
                "numbered checkpoints, 1 to 3 preemptions a run, each run's exit 0); the fleet's function then began "
                "its next run over it. status_history_events / status_run_summaries: the median over the fleet's "
                "status.json objects as stored after the build (status_sizes: min, median, max, and bytes). The "
                "current run's ledger holds its own attempts only (a run's ledger starts empty)."
                if steady_size else "Statuses as the build leaves them (no past runs written first).")}


def ticks(b: _Bench, jobs: int) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """A fresh tick instance at Google's latencies, held to a third of a vCPU where a cgroup can be
    made: its first tick over the fleet (its cache filled), a round of heartbeats, a steady tick."""
    b.google()
    label = _label(jobs)
    function = Function(b.env, b.third.path)
    try:
        worker = function.worker
        b.counts()
        load_before = os.getloadavg()[0]
        started, cpu0 = time.perf_counter(), function.cpu()
        first_summary = function.tick()
        first_s, first_cpu = time.perf_counter() - started, function.cpu() - cpu0
        first_gcs, first_compute = b.counts()
        first_hwm = _status_kib(worker, "VmHWM")
        b.fleet.heartbeats()  # a minute later every running trainer has beaten again
        b.counts()
        steady_from_here = _reset_peak(worker)
        started, cpu0 = time.perf_counter(), function.cpu()
        summary = function.tick()
        steady_s, steady_cpu = time.perf_counter() - started, function.cpu() - cpu0
        steady_gcs, steady_compute = b.counts()
        load_after = os.getloadavg()[0]
        hwm, master_hwm = _status_kib(worker, "VmHWM"), _status_kib(function.process.pid, "VmHWM")
        pss = _pss_kib(worker) + _pss_kib(function.process.pid)
        rss_now = _status_kib(worker, "VmRSS")
        pid, master = worker, function.process.pid
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    finally:
        function.close()
    total = _requests(steady_gcs) + _requests(steady_compute)
    worker_peak = max(first_hwm, hwm) if steady_from_here else hwm
    container = round((worker_peak + master_hwm) / 1024, 1)
    steady_third, first_third = b.third_of(steady_s, steady_cpu), b.third_of(first_s, first_cpu)
    figures: dict[str, Any] = {
        f"tick_{label}_third_vcpu_s": round(steady_third, 3), f"tick_{label}_cpu_s": round(steady_cpu, 3),
        f"tick_{label}_first_third_vcpu_s": round(first_third, 3), f"tick_{label}_first_cpu_s": round(first_cpu, 3),
        f"function_rss_{label}_mib": container,
        f"tick_{label}_http_requests_per_job": round(total / jobs, 3)}
    if label == "10k":  # issue 40's targets, at the fleet size they are set for
        figures = beside(figures, {f"tick_{label}_third_vcpu_s": 30, f"tick_{label}_cpu_s": 8,
                                   f"tick_{label}_first_third_vcpu_s": 60, f"function_rss_{label}_mib": 384,
                                   f"tick_{label}_http_requests_per_job": 1.1})
    out = {
        **figures,
        "deployed_third_vcpu_method": b.method,
        f"tick_{label}_wall_s": {"steady": round(steady_s, 3), "first": round(first_s, 3)},
        # Other work on the CPUs: in the cgroup the function gets at most a third of one, and less when
        # the machine is busier than its CPUs; its CPU-seconds do not move with it.
        "tick_load_avg_1m": [round(load_before, 2), round(load_after, 2)],
        "function_worker_rss_mib": round(worker_peak / 1024, 1),
        "function_rss_first_tick_mib": round(first_hwm / 1024, 1),
        "function_rss_steady_tick_mib": round(hwm / 1024, 1) if steady_from_here else None,
        "function_rss_after_mib": round(rss_now / 1024, 1),
        "function_master_rss_mib": round(master_hwm / 1024, 1),
        "function_pss_after_mib": round(pss / 1024, 1),
        "function_pid": pid, "function_master_pid": master, "function_parent_pid": parent,
        "function_cmdline": cmdline, "function_rss_source": f"/proc/{pid}/status VmHWM + /proc/{master}/status VmHWM",
        "function_rss_note": RSS_NOTE,
        f"tick_{label}_http_requests": {"total": total, "gcs": dict(steady_gcs), "compute": dict(steady_compute)},
        f"tick_{label}_first_http_requests": {
            "total": _requests(first_gcs) + _requests(first_compute), "gcs": dict(first_gcs),
            "compute": dict(first_compute)},
        "tick_audit_feed": AUDIT_NOTE,
        "deployed_tick_summary": summary, "deployed_first_tick_summary": first_summary, "deployed_jobs": jobs}
    lists = sum(v for k, v in steady_gcs.items() if k.startswith("list "))
    agg = sum(v for k, v in steady_compute.items() if k.startswith("instances.aggregatedList "))
    where = "at a third of a vCPU" if b.third.path else "at a third of a vCPU (computed)"
    rows = [
        (f"steady tick, {jobs:,} jobs, {where}", f"{steady_third:.2f} s",
         f"{steady_cpu:.1f} CPU-s, {steady_s:.1f} s wall; {b.method}"),
        (f"  the instance's first tick {where}", f"{first_third:.2f} s", f"{first_cpu:.1f} CPU-s, {first_s:.1f} s wall"),
        (f"function peak RSS, {jobs:,}-job ticks", f"{container:.0f} MiB",
         f"the worker's VmHWM (pid {pid}) {worker_peak / 1024:.0f} MiB + the master's {master_hwm / 1024:.0f} MiB; "
         f"PSS of both after {pss / 1024:.0f} MiB"),
        (f"HTTP requests per job, steady tick of {jobs:,}", f"{total / jobs:.3f}",
         f"{total:,} requests counted by the servers ({_requests(steady_gcs):,} GCS incl. {lists} list pages, "
         f"{_requests(steady_compute):,} Compute incl. {agg} aggregated-list pages)")]
    return out, rows


def colds(b: _Bench, runs: int) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """Fresh ``on_object`` instances at Google's latencies, the fleet in the bucket: ``runs`` without
    a limit, ``runs`` at a third of a vCPU, each for the spec event of a RUNNING job of its own (a
    pass that reads that job and finds nothing to do); then as many for a job whose VM was just
    reclaimed without notice (a pass that launches its replacement: ``recovery_colds``)."""
    running = [j for j, h in b.fleet.heads().items() if h.phase == "RUNNING"][:4 * runs]
    if len(running) < 4 * runs:
        raise RuntimeError(f"the fleet has {len(running)} RUNNING jobs: {4 * runs} cold starts need one each")
    b.google()
    events = [_spec_event(b.gcs, job) for job in running[:2 * runs]]
    b.counts()
    load = os.getloadavg()[0]
    free = cold_starts(b.env, events[:runs], None)
    cold_gcs, cold_compute = b.counts()
    held = cold_starts(b.env, events[runs:], b.third.path) if b.third.path else []
    wall, cpu = _median([r["wall_s"] for r in free]), _median([r["cpu_s"] for r in free])
    third_s = _median([r["wall_s"] for r in held]) if held else wall + 2 * cpu
    out = {"cold_start_third_vcpu_s": round(third_s, 3), "cold_start_third_vcpu_s_target": target(third_s, at_most=3),
           "cold_start_third_vcpu_method": b.method,
           "cold_start_wall_s": round(wall, 3), "cold_start_cpu_s": round(cpu, 3),
           "cold_start_listening_s": round(_median([r["listening_s"] for r in free]), 3),
           "cold_start_third_vcpu_computed_s": round(wall + 2 * cpu, 3),
           "cold_start_runs": {"unlimited": [{k: round(v, 3) for k, v in r.items()} for r in free],
                               "third_vcpu": [{k: round(v, 3) for k, v in r.items()} for r in held]},
           "cold_start_fresh_processes": len(free) + len(held),
           "cold_start_http_requests": dict(cold_gcs + cold_compute),
           "cold_start_load_avg_1m": [round(load, 2), round(os.getloadavg()[0], 2)],
           "cold_start_note": (
               f"A fresh on_object process (functions-framework, --signature-type cloudevent), from its spawn to its "
               f"answer to one job's spec event, the fleet of {len(b.fleet.jobs):,} jobs in the bucket: the interpreter, "
               "the imports, the server and its worker, the clients, that job's pass (its objects, its zones' "
               "instance lists; nothing to change, so none of google-cloud-compute is imported). A cold start whose "
               "pass launches a VM is cold_start_recovery_*. The tick's own first pass over the fleet is "
               "tick_*_first_third_vcpu_s. " + PLATFORM_NOTE)}
    if held:
        out["cold_start_third_vcpu_cpu_s"] = round(_median([r["cpu_s"] for r in held]), 3)
    rows = [("cold start: on_object, first event answered (fleet in the bucket)", f"{wall:.2f} s",
             f"{cpu:.2f} CPU-s; fresh functions-framework process, spawn -> its answer; listening after "
             f"{out['cold_start_listening_s']:.2f} s"),
            ("  at a third of a vCPU", f"{third_s:.2f} s", b.method)]
    found, more = recovery_colds(b, running[2 * runs:], runs)
    out.update(found)
    return out, rows + more


def recovery_colds(b: _Bench, jobs: list[str], runs: int) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """Fresh ``on_object`` instances for the spec event of a job whose VM Compute reclaimed without
    notice just before (``respawn local preempt --hard``: no marker, the VM TERMINATED): the pass
    finds it stopped and inserts the replacement, with the 120 s notice a Spot VM asks for by default
    (the beta API), after asking for capacity advice. ``runs`` without a limit, ``runs`` in the cgroup."""
    from controller.core import names

    heads = b.fleet.heads()

    def reclaimed(job: str) -> tuple[dict[str, str], bytes]:
        name = names.instance_name(job, heads[job].attempt)
        b.compute.session.post(f"{b.compute.url}/_local/preempt", json={"name": name, "graceful": False},
                               timeout=30).raise_for_status()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for zone in json.loads(SPEC)["zones"]:
                got = b.compute.session.get(f"{b.compute.url}/compute/v1/projects/{PROJECT}/zones/{zone}/instances/"
                                            f"{name}", params={"fields": "status"}, timeout=30)
                if got.ok and got.json().get("status") == "TERMINATED":
                    return _spec_event(b.gcs, job)
            time.sleep(0.1)
        raise RuntimeError(f"{name} was not TERMINATED within 60 s of its preemption")

    def measured(group: Path | None, these: list[str]) -> tuple[list[dict[str, float]], Counter[str]]:
        out = []
        for job in these:  # one at a time: each reclaimed just before its own cold start
            event = reclaimed(job)
            b.counts()
            out += cold_starts(b.env, [event], group)
            gcs, compute = b.counts()
            if not any(k.startswith(("instances.insert ", "instances.bulkInsert ")) and k.endswith(" 200")
                       for k in compute):
                raise RuntimeError(f"the recovery cold start of {job} inserted nothing: {dict(compute)}")
            sent = gcs + compute
        return out, sent

    free, sent = measured(None, jobs[:runs])
    held, _ = measured(b.third.path, jobs[runs:2 * runs]) if b.third.path else ([], Counter())
    wall, cpu = _median([r["wall_s"] for r in free]), _median([r["cpu_s"] for r in free])
    third_s = _median([r["wall_s"] for r in held]) if held else wall + 2 * cpu
    out: dict[str, Any] = {
        "cold_start_recovery_third_vcpu_s": round(third_s, 3),
        "cold_start_recovery_wall_s": round(wall, 3), "cold_start_recovery_cpu_s": round(cpu, 3),
        "cold_start_recovery_runs": {"unlimited": [{k: round(v, 3) for k, v in r.items()} for r in free],
                                     "third_vcpu": [{k: round(v, 3) for k, v in r.items()} for r in held]},
        "cold_start_recovery_http_requests": dict(sent),
        "cold_start_recovery_note": (
            "As cold_start_*, for the spec event of a job whose VM was reclaimed without notice just before: "
            "its pass lists the VM TERMINATED, asks Compute's capacity advice, inserts the replacement with a "
            "120 s notice through the beta API and waits for that operation, so it imports google-cloud-compute's "
            "v1 and v1beta message types (0.34 and 0.43 s at full CPU: python -X importtime). With notice, the "
            "replacement is launched at the notice, 120 s before the VM stops (the zero-gap recovery), so this cold "
            "start is not on that recovery's path; without notice it is. http_requests: the last unlimited run's.")}
    if held:
        out["cold_start_recovery_third_vcpu_cpu_s"] = round(_median([r["cpu_s"] for r in held]), 3)
    rows = [("cold start that launches: a VM reclaimed without notice", f"{wall:.2f} s",
             f"{cpu:.2f} CPU-s; capacity advice, the beta insert (120 s notice) and its operation"),
            ("  at a third of a vCPU", f"{third_s:.2f} s", b.method)]
    return out, rows


def measure(scale: float = 1.0, jobs: int = 10000, quick: bool = False, *, cold: bool = True,
            with_ticks: bool = True, steady_size: bool = True, seed: int = 1) -> dict[str, Any]:
    """The function's figures over a fleet of ``jobs`` (built first, at ``steady_size`` by default);
    ``scale`` multiplies every latency (0.01: a smoke run); ``quick``: one cold start of each kind
    instead of three. ``cold`` / ``with_ticks``: run the cold starts / the measured ticks (both by
    default). Returns the ``bench/results.json`` keys and ``rows``: (scenario, figure, how) for a table."""
    from localcloud.realism import Realism

    realism = Realism.google().scaled(scale)
    servers = CpuGroup("servers", third=False)
    gcs, compute = _Server("gcs", servers), _Server("compute", servers)
    b = _Bench(gcs, compute, ThirdOfCpu(), Fleet(gcs, jobs), scale, seed)
    b.env = {**_env(gcs.url, compute.url, BUCKET, PROJECT), "RESPAWN_CONCURRENCY": "32"}
    out: dict[str, Any] = {
        "deployed_latency_s": {"gcs_request": realism.gcs_latency, "compute_call": realism.compute_latency,
                               **{f"compute {k}": v for k, v in realism.compute_method_latency.items()},
                               "p99_over_median": getattr(realism, "p99_factor", 0.0) or None,
                               "compute_rate_quota_per_minute": getattr(realism, "rate_quota_per_minute", None),
                               "gcs_write_interval": realism.gcs_write_interval},
        "deployed_latency_seed": seed,
        "deployed_servers_cgroup": servers.kind or servers.why}
    rows: list[tuple[str, str, str]] = []
    try:
        out.update(build(b, steady_size))
        rows.append((f"the fleet: {jobs:,} jobs built", f"{out['build_s']:.0f} s",
                     f"statuses hold {out['status_history_events']} history events, "
                     f"{out['status_run_summaries']} past runs (median; {out['fleet_phases']})"))
        if with_ticks:
            found, more = ticks(b, jobs)
            out.update(found)
            rows += more
        if cold:
            found, more = colds(b, 1 if quick else 3)
            out.update(found)
            rows += more
    finally:
        b.third.close()
        gcs.close()
        compute.close()
        servers.close()
    out["rows"] = rows
    return out


def scenario(run: Any) -> dict[str, Any]:
    """``make bench``'s deployed scenario (bench/__main__.py): ``run.deployed`` jobs, every part."""
    return measure(run.scale, run.deployed, run.quick, seed=run.seed)


def _reset_peak(pid: int) -> bool:
    """Resets the process's VmHWM to its RSS now (``clear_refs`` 5), so the next peak is the steady tick's alone."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.deployed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every latency (0.01: a smoke run)")
    parser.add_argument("--seed", type=int, default=1, help="the servers' latency draws")
    parser.add_argument("--quick", action="store_true", help="one cold start of each kind; nothing written")
    parser.add_argument("--cold-only", action="store_true", help="the fleet, then the cold starts (no measured ticks)")
    parser.add_argument("--ticks-only", action="store_true", help="the fleet, then the measured ticks (no cold starts)")
    parser.add_argument("--fresh-statuses", action="store_true",
                        help="statuses as the build leaves them, not at their steady size")
    parser.add_argument("--out", type=Path, help="write the run here (default: bench/runs/deployed-<UTC>.json)")
    parser.add_argument("--serve", choices=("gcs", "compute"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve(args.serve)
        return 0
    head = provenance(seeds={"deployed": args.seed}, scale=args.scale)
    started = time.perf_counter()
    result = measure(args.scale, args.jobs, args.quick, cold=not args.ticks_only, with_ticks=not args.cold_only,
                     steady_size=not args.fresh_statuses, seed=args.seed)
    rows = result.pop("rows")
    width = max(len(r[0]) for r in rows)
    print(f"respawn, the function as deployed: {head['machine']}; latency x {args.scale}: "
          f"{result['deployed_latency_s']}")
    for scenario_, figure, note in rows:
        print(f"  {scenario_:<{width}}  {figure:<10} {note}")
    if args.quick:
        print(json.dumps(result, indent=1))
    else:
        print(f"written: {alone('deployed', result, head, time.perf_counter() - started, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
