"""The function as deployed: cold start, peak RSS and HTTP requests per job of ``main.tick``.

    python -m bench.deployed                  # 10,000 jobs at Google's latencies (8 to 10 minutes, 2 CPUs)
    python -m bench.deployed --cold-only      # the cold starts alone (half a minute)
    python -m bench.deployed --jobs 20 --quick --scale 0.01   # a smoke run (what the test runs)

What runs: ``main.py``'s ``tick`` served by functions-framework (its gunicorn master and the
worker it forks, as Cloud Functions 2nd gen runs it), with the real google-cloud-storage and
google-cloud-compute clients, against a GCS and a Compute server each in a process of its own,
so the servers' memory and CPU are not the function's. The latencies are the bench's profile,
``localcloud.realism.Realism.google()`` times ``scale``, whatever it holds when this runs (GCS
30 ms a request, Compute 100 ms a call, the aggregated instance list's own figure per page;
drawn around those medians where the profile draws them); ``deployed_latency_s`` records it.

Three figures (``bench/results.json`` keys):

- ``cold_start_third_vcpu_s``: a fresh ``python -m functions_framework --target tick`` process,
  from its spawn to the answer of its first tick (interpreter start, functions-framework's
  import, ``main``'s import, the server's start, the worker's fork, the tick with its clients'
  construction, the bucket listing and the aggregated instance list), over an empty bucket and
  project. Measured three times without a limit and three times inside a cgroup holding the
  process to a third of a CPU (cgroup v1 ``cpu.cfs_quota_us`` = period / 3, or cgroup v2
  ``cpu.max``): 512 MiB Cloud Functions get a third of a vCPU. Where no cgroup can be made, the
  figure is computed as wall + 2 x CPU-seconds (the CPU-bound share stretched three times);
  ``cold_start_third_vcpu_method`` says which. CPU-seconds are the function processes' own
  (user + system of the master and its worker, from ``/proc/<pid>/stat``), beside the wall time.
- ``function_rss_10k_mib``: ``VmHWM`` (peak resident set) of the worker process that ran the
  ticks, from ``/proc/<pid>/status``: a fresh function instance's first tick over the fleet
  (its cache filled) and then a steady tick. The master's own ``VmHWM`` and the pair's
  proportional set size (PSS, shared pages counted once) are reported beside it.
- ``tick_10k_http_requests_per_job``: every HTTP request the function process sent to GCS and
  Compute during the steady tick (list pages, metadata gets, media reads, uploads, deletes,
  instance lists and gets, operation reads, inserts, and each retry and refused request: a
  429 is a request too), counted by the servers as they arrive, divided by the jobs. Only the
  function talks to the servers while it is counted; the breakdown is in
  ``tick_10k_http_requests``.

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

The fleet: specs are written, then a function process of its own (not the one measured) launches
them at no latency with three ticks, as bench/local.py builds its fleet: every job launched, then
20 % exit 0 and 10 % exit 1 (backing off), the rest RUNNING with a heartbeat. The records a
trainer would write (exit records, heartbeats) go through the stand-in's side door
(``/_bench/objects``: one request for the fleet, never counted, never the function's). Then the
latencies are turned on and a fresh function instance runs its first tick (filling its cache)
and, after a round of heartbeats, the steady tick that is counted.

Not modelled: the platform's container start and image pull (only the process's own start is
measured), the metadata server's token fetches (anonymous credentials here; on Google one per
token lifetime, not per request), TLS, network distance beyond the fixed latencies, and Cloud
Run's memory accounting beyond the function processes (its in-memory filesystem, the
container's other processes).
"""

from __future__ import annotations

import argparse
import base64
import bisect
import hashlib
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.parser import BytesParser
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote

import google_crc32c
import requests

ROOT = Path(__file__).resolve().parent.parent
BUCKET, CHECKPOINTS, PROJECT = "bench-deployed", "bench-deployed-ckpt", "bench-deployed"
COLD = "bench-cold"  # the cold start's bucket and project: empty
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
        """``{"scale": x}``: ``Realism.google().scaled(x)``'s GCS latency (drawn as the profile draws
        it) and per-object write interval; ``{"scale": null}``: none of either."""
        from localcloud.realism import Realism

        scale = sent.get("scale")
        realism = Realism() if scale is None else Realism.google().scaled(float(scale))
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


def _serve(kind: str) -> None:
    """This process serves GCS or Compute until its stdin closes (its parent's end); prints the port."""
    from localcloud.http import Served

    if kind == "gcs":
        app: Any = GcsStandIn((BUCKET, CHECKPOINTS, COLD))
        served = Served(app, "gcs-standin", threads=64)
    else:
        from localcloud import compute as local_compute
        from localcloud.realism import Realism

        server = _indexed_compute()(run_vms=False, shutdown_budget=0.5)

        def configure(sent: dict[str, Any]) -> None:
            scale = sent.get("scale")
            realism = Realism() if scale is None else Realism.google().scaled(float(scale))
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
    def __init__(self, kind: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "bench.deployed", "--serve", kind], cwd=ROOT,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
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
    """``main.tick`` served by functions-framework in a fresh process (its gunicorn master), as
    Cloud Functions starts an instance; ``worker`` is the process gunicorn forks to serve it."""

    def __init__(self, env: dict[str, str], cgroup: Path | None = None) -> None:
        self.port = _free_port()
        tasks = cgroup / "cgroup.procs" if cgroup else None

        def enter_cgroup() -> None:  # in the child, before exec: all it runs and forks is held to the quota
            if tasks is not None:
                tasks.write_text(str(os.getpid()))

        self.spawned = time.perf_counter()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "functions_framework", "--target", "tick", "--source", str(ROOT / "main.py"),
             "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
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
class ThirdOfCpu:
    """A cgroup whose processes get a third of one CPU (CFS quota = period / 3), or None."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.why = ""
        name = f"respawn-bench-{os.getpid()}"
        v2 = Path("/sys/fs/cgroup/cgroup.controllers")
        try:
            if v2.exists() and "cpu" in v2.read_text().split():
                path = Path("/sys/fs/cgroup") / name
                path.mkdir()
                (path / "cpu.max").write_text("33333 100000")
                self.path, self.kind = path, "cgroup v2 cpu.max = 33333 100000"
            else:
                path = Path("/sys/fs/cgroup/cpu") / name
                path.mkdir()
                (path / "cpu.cfs_period_us").write_text("100000")
                (path / "cpu.cfs_quota_us").write_text("33333")
                self.path, self.kind = path, "cgroup v1 cpu.cfs_quota_us = 33333 / cpu.cfs_period_us = 100000"
        except OSError as e:
            self.why = f"no cgroup could be made here ({e})"
            self.path = None

    def close(self) -> None:
        if self.path is not None:
            for _ in range(50):  # its processes may take a moment to be gone
                try:
                    self.path.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
            self.path = None


# -- the fleet -------------------------------------------------------------------------------------------
class Fleet:
    """``jobs`` in the stand-in's bucket, written and read through its side door (one request for
    them all: the fleet's trainers are not what is measured); the function launches them."""

    def __init__(self, gcs: _Server, jobs: int) -> None:
        self.gcs, self.jobs = gcs, [f"job-{i:05d}" for i in range(jobs)]

    def specs(self) -> None:
        from controller.core import names

        self.gcs.write(BUCKET, {names.spec_key(j): SPEC for j in self.jobs})

    def statuses(self) -> dict[str, Any]:
        from controller.core import names
        from controller.core.state import JobStatus

        found = self.gcs.read(BUCKET, [names.status_key(j) for j in self.jobs])
        return {j: JobStatus.from_json(found[names.status_key(j)].encode()) for j in self.jobs
                if names.status_key(j) in found}

    def records(self, key: Any, extra: Any, which: Any = lambda job, st: True, listed: bool = False) -> int:
        """A record at ``key(job)`` for each job's current attempt, with its token, as its VM agent writes
        it; ``listed``: its fields also in the object's custom metadata, as the agent writes a heartbeat."""
        from controller.core import names
        from controller.core.world import listing_metadata

        written: dict[str, Any] = {}
        for j, st in self.statuses().items():
            if which(j, st):
                body = {"instance": names.instance_name(j, st.attempt), "attempt": st.attempt, "node": 0,
                        "token": st.attempt_token or "", **extra(j)}
                written[key(j)] = {"data": json.dumps(body), "metadata": listing_metadata(body)} if listed else \
                    json.dumps(body)
        self.gcs.write(BUCKET, written)
        return len(written)

    def finish_some(self) -> int:
        """20 % of the jobs exit 0, 10 % exit 1 (they back off): the bench's steady mix."""
        from controller.core import names

        mix = {j: i % 10 for i, j in enumerate(self.jobs) if i % 10 in (0, 1, 2)}
        return self.records(names.exit_key, lambda j: {"exit_code": 0 if mix[j] < 2 else 1}, lambda j, st: j in mix)

    def heartbeats(self) -> int:
        from controller.core import names

        return self.records(names.heartbeat_key, lambda j: {}, lambda j, st: not st.phase.terminal, listed=True)


# -- the scenario --------------------------------------------------------------------------------------
def _env(gcs: str, compute: str, bucket: str, project: str) -> dict[str, str]:
    return {**os.environ, "STORAGE_EMULATOR_HOST": gcs, "RESPAWN_COMPUTE_ENDPOINT": compute,
            "RESPAWN_BUCKET": bucket, "RESPAWN_PROJECT": project,
            "RESPAWN_TRAINER_SERVICE_ACCOUNT": f"respawn-trainer@{project}.iam.gserviceaccount.com",
            "RESPAWN_LOG_FORMAT": "text", "PYTHONUNBUFFERED": "1"}


def cold_starts(env: dict[str, str], runs: int, cgroup: Path | None) -> list[dict[str, float]]:
    """``runs`` fresh function processes, one after another: each from its spawn to its first tick's answer."""
    out = []
    for _ in range(runs):
        function = Function(env, cgroup)
        try:
            function.tick()
            wall = time.perf_counter() - function.spawned
            out.append({"wall_s": wall, "cpu_s": function.cpu(), "listening_s": function.listening,
                        "pid": function.process.pid})
        finally:
            function.close()
    return out


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _requests(counts: Counter[str]) -> int:
    return sum(counts.values())


def measure(scale: float = 1.0, jobs: int = 10000, quick: bool = False, *, cold: bool = True,
            with_fleet: bool = True) -> dict[str, Any]:
    """The three figures (and what they rest on) over a fleet of ``jobs``; ``scale`` multiplies
    every latency (0.01: a smoke run); ``quick``: one cold start of each kind instead of three.
    ``cold`` / ``with_fleet``: run the cold starts / the fleet's ticks (both by default).
    Returns the ``bench/results.json`` keys and ``rows``: (scenario, figure, how) for a table."""
    from localcloud.realism import Realism

    realism = Realism.google().scaled(scale)
    runs = 1 if quick else 3
    gcs, compute = _Server("gcs"), _Server("compute")
    third = ThirdOfCpu()
    out: dict[str, Any] = {
        "deployed_scale": scale,
        "deployed_latency_s": {"gcs_request": realism.gcs_latency, "compute_call": realism.compute_latency,
                               **{f"compute {k}": v for k, v in realism.compute_method_latency.items()},
                               "p99_over_median": getattr(realism, "p99_factor", 0.0) or None,
                               "compute_rate_quota_per_minute": getattr(realism, "rate_quota_per_minute", None),
                               "gcs_write_interval": realism.gcs_write_interval},
        "deployed_machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}, "
                            f"{len(os.sched_getaffinity(0))} CPUs"}
    rows: list[tuple[str, str, str]] = []
    try:
        def google() -> None:
            gcs.config(scale=scale)
            compute.config(scale=scale)

        def off() -> None:
            gcs.config(scale=None)
            compute.config(scale=None)

        compute_endpoint = compute.url
        # 1. Cold starts: an empty bucket and project, Google's latencies.
        if cold:
            google()
            cold_env = _env(gcs.url, compute_endpoint, COLD, COLD)
            gcs.counts(reset=True), compute.counts(reset=True)
            load = os.getloadavg()[0]
            free = cold_starts(cold_env, runs, None)
            cold_requests = gcs.counts(reset=True) + compute.counts(reset=True)
            held = cold_starts(cold_env, runs, third.path) if third.path else []
            wall, cpu = _median([r["wall_s"] for r in free]), _median([r["cpu_s"] for r in free])
            if held:
                third_s, method = _median([r["wall_s"] for r in held]), f"measured: {third.kind}"
            else:
                third_s, method = wall + 2 * cpu, f"computed: wall + 2 x CPU-seconds ({third.why})"
            out.update({"cold_start_wall_s": round(wall, 3), "cold_start_cpu_s": round(cpu, 3),
                        "cold_start_listening_s": round(_median([r["listening_s"] for r in free]), 3),
                        "cold_start_third_vcpu_s": round(third_s, 3), "cold_start_third_vcpu_method": method,
                        "cold_start_third_vcpu_computed_s": round(wall + 2 * cpu, 3),
                        "cold_start_runs": {"unlimited": [{k: round(v, 3) for k, v in r.items()} for r in free],
                                            "third_vcpu": [{k: round(v, 3) for k, v in r.items()} for r in held]},
                        "cold_start_fresh_processes": len(free) + len(held),
                        "cold_start_http_requests": dict(cold_requests),
                        "cold_start_load_avg_1m": [round(load, 2), round(os.getloadavg()[0], 2)]})
            if held:
                out["cold_start_third_vcpu_cpu_s"] = round(_median([r["cpu_s"] for r in held]), 3)
            rows += [("cold start, first tick included (empty bucket)", f"{wall:.2f} s",
                      f"{cpu:.2f} CPU-s; fresh functions-framework process, spawn -> first tick's answer; "
                      f"listening after {out['cold_start_listening_s']:.2f} s"),
                     ("  at a third of a vCPU", f"{third_s:.2f} s", method)]

        # 2. The fleet, built at no latency by a function process of its own (as bench/local.py builds it).
        if with_fleet and jobs:
            off()
            env = {**_env(gcs.url, compute_endpoint, BUCKET, PROJECT), "RESPAWN_CONCURRENCY": "32"}
            built = Fleet(gcs, jobs)
            phases: dict[str, float] = {}
            started = mark = time.perf_counter()

            build_requests: dict[str, dict[str, int]] = {}

            def phase(name: str) -> None:
                nonlocal mark
                phases[name] = round(time.perf_counter() - mark, 1)
                mark = time.perf_counter()
                if name.endswith("_tick"):  # what the builder's tick sent
                    build_requests[name] = dict(gcs.counts(reset=True) + compute.counts(reset=True))

            built.specs()
            phase("specs")
            builder = Function(env)
            try:
                phase("builder_start")
                builder.tick()
                phase("launch_tick")
                builder.tick()
                phase("running_tick")
                finished = built.finish_some()
                phase("exit_records")
                builder.tick()
                phase("exits_tick")
            finally:
                builder.close()
            phase("builder_stop")
            beating = built.heartbeats()
            phase("heartbeats")
            out["build_s"] = round(time.perf_counter() - started, 1)
            out["build_phases_s"] = phases
            out["build_http_requests"] = build_requests
            states = Counter(st.phase.value for st in built.statuses().values())
            out["fleet_phases"] = dict(states)
            out["fleet_exit_records"], out["fleet_heartbeats"] = finished, beating

            # 3. A fresh instance at Google's latencies: its first tick (cache filled), then a steady tick.
            google()
            function = Function(env)
            try:
                worker = function.worker
                gcs.counts(reset=True), compute.counts(reset=True)
                started, cpu0 = time.perf_counter(), function.cpu()
                first_summary = function.tick()
                first_s, first_cpu = time.perf_counter() - started, function.cpu() - cpu0
                first_gcs, first_compute = gcs.counts(reset=True), compute.counts(reset=True)
                first_hwm = _status_kib(worker, "VmHWM")
                built.heartbeats()  # a minute later every running trainer has beaten again
                gcs.counts(reset=True), compute.counts(reset=True)
                steady_from_here = _reset_peak(worker)
                started, cpu0 = time.perf_counter(), function.cpu()
                summary = function.tick()
                steady_s, steady_cpu = time.perf_counter() - started, function.cpu() - cpu0
                steady_gcs, steady_compute = gcs.counts(reset=True), compute.counts(reset=True)
                hwm, master_hwm = _status_kib(worker, "VmHWM"), _status_kib(function.process.pid, "VmHWM")
                pss = _pss_kib(worker) + _pss_kib(function.process.pid)
                rss_now = _status_kib(worker, "VmRSS")
                pid, master = worker, function.process.pid
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            finally:
                function.close()
            total = _requests(steady_gcs) + _requests(steady_compute)
            peak = max(first_hwm, hwm) if steady_from_here else hwm
            label = {10000: "10k", 1000: "1k", 100: "100"}.get(jobs, str(jobs))
            out.update({
                f"function_rss_{label}_mib": round(peak / 1024, 1),
                "function_rss_first_tick_mib": round(first_hwm / 1024, 1),
                "function_rss_steady_tick_mib": round(hwm / 1024, 1) if steady_from_here else None,
                "function_rss_after_mib": round(rss_now / 1024, 1),
                "function_master_rss_mib": round(master_hwm / 1024, 1),
                "function_pss_after_mib": round(pss / 1024, 1),
                "function_pid": pid, "function_master_pid": master, "function_parent_pid": parent,
                "function_cmdline": cmdline, "function_rss_source": f"/proc/{pid}/status VmHWM",
                f"tick_{label}_http_requests_per_job": round(total / jobs, 3),
                f"tick_{label}_http_requests": {"total": total, "gcs": dict(steady_gcs), "compute": dict(steady_compute)},
                f"deployed_tick_{label}_s": round(steady_s, 3), f"deployed_tick_{label}_cpu_s": round(steady_cpu, 3),
                f"deployed_tick_{label}_first_s": round(first_s, 3),
                f"deployed_tick_{label}_first_cpu_s": round(first_cpu, 3),
                f"deployed_tick_{label}_first_http_requests": {
                    "total": _requests(first_gcs) + _requests(first_compute),
                    "gcs": dict(first_gcs), "compute": dict(first_compute)},
                "deployed_tick_summary": summary, "deployed_first_tick_summary": first_summary,
                "deployed_jobs": jobs})
            lists = sum(v for k, v in steady_gcs.items() if k.startswith("list "))
            agg = sum(v for k, v in steady_compute.items() if k.startswith("instances.aggregatedList "))
            rows += [
                (f"function peak RSS, {jobs:,}-job ticks", f"{peak / 1024:.0f} MiB",
                 f"VmHWM of the gunicorn worker (pid {pid}), first + steady tick; master {master_hwm / 1024:.0f} MiB, "
                 f"PSS of both after {pss / 1024:.0f} MiB"),
                (f"HTTP requests per job, steady tick of {jobs:,}", f"{total / jobs:.3f}",
                 f"{total:,} requests counted by the servers ({_requests(steady_gcs):,} GCS incl. {lists} list pages, "
                 f"{_requests(steady_compute):,} Compute incl. {agg} aggregated-list pages)"),
                (f"  the tick itself (deployed, {jobs:,} jobs)", f"{steady_s:.2f} s",
                 f"{steady_cpu:.1f} CPU-s; the instance's first tick {first_s:.2f} s, {first_cpu:.1f} CPU-s"),
            ]
    finally:
        third.close()
        gcs.close()
        compute.close()
    out["rows"] = rows
    return out


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
    parser.add_argument("--quick", action="store_true", help="one cold start of each kind")
    parser.add_argument("--cold-only", action="store_true", help="the cold starts alone (no fleet)")
    parser.add_argument("--fleet-only", action="store_true", help="the fleet's ticks alone (no cold starts)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--serve", choices=("gcs", "compute"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve(args.serve)
        return 0
    result = measure(args.scale, args.jobs, args.quick, cold=not args.fleet_only, with_fleet=not args.cold_only)
    rows = result.pop("rows")
    width = max(len(r[0]) for r in rows)
    print(f"respawn, the function as deployed: {result['deployed_machine']}; latency x {args.scale}: "
          f"{result['deployed_latency_s']}")
    for scenario, figure, note in rows:
        print(f"  {scenario:<{width}}  {figure:<10} {note}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    else:
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
