"""A per-instance metadata server, like 169.254.169.254 inside a Compute Engine VM.

Serves what the VM scripts and Google's client libraries read, the way the real one does,
so that ``google.auth.compute_engine`` and ``google.auth.default()`` work inside a local VM:

- ``/`` answers 200 with ``Metadata-Flavor: Google`` and needs no header (google-auth's
  ``ping`` and the Go client's ``OnGCE`` probe it); under ``/computeMetadata/v1/`` the
  ``Metadata-Flavor: Google`` request header is required (403 without), and every answer
  carries it;
- ``instance/attributes/*``, ``name``, ``id``, ``zone``, ``hostname``, ``machine-type``,
  ``preempted``, ``maintenance-event``, ``network-interfaces/``, ``project/project-id`` and
  ``numeric-project-id``;
- ``instance/service-accounts/{default,EMAIL}/``: ``email``, ``aliases``, ``scopes`` (one a
  line; lists in JSON), ``token`` (``application/json``: ``access_token``, ``expires_in``
  counting down, ``token_type``) and ``identity?audience=…`` (a JWT; 400 without an
  audience). An instance created without a service account has none: ``token`` is 404;
- directories list their entries (``key/`` for directories); ``?recursive=true`` answers
  JSON with Google's camelCase keys (``machineType``, ``serviceAccounts``,
  ``numericProjectId``; attribute keys as they are; no tokens), or with ``alt=text``
  one ``path value`` line per leaf; ``?alt=json`` on a leaf; ETags; and
  ``?wait_for_change=true`` long polling (``last_etag``, ``timeout_sec``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from flask import Flask, Response, request

from localcloud.http import Served

Snapshot = Callable[[], dict[str, Any]]


def project_number(project: str) -> int:
    """A stable 12-digit project number for a project id (Google assigns one to each project)."""
    return 100_000_000_000 + int(hashlib.sha1(project.encode()).hexdigest(), 16) % 900_000_000_000


class Endpoint:
    """A leaf computed per request (a token): listed in its directory, left out of recursive answers."""

    def __init__(self, name: str, render: Callable[[Mapping[str, str]], tuple[int, str, str]]) -> None:
        self.name = name
        self.render = render


class Tokens:
    """The instance's OAuth access token, as the metadata server caches it: the same token
    until it nears expiry, ``expires_in`` counting down."""

    lifetime = 3600.0
    renew_within = 300.0

    def __init__(self, instance_id: str) -> None:
        self._instance = instance_id
        self._lock = threading.Lock()
        self._issued = float("-inf")  # none yet: the first ask issues one
        self._serial = 0
        self._live: dict[str, float] = {}  # token -> when it was issued (an older one serves until it expires)

    def access(self, args: Mapping[str, str]) -> tuple[int, str, str]:
        with self._lock:
            now = time.monotonic()
            if now - self._issued > self.lifetime - self.renew_within:
                self._issued, self._serial = now, self._serial + 1
                self._live = {t: at for t, at in self._live.items() if now - at < self.lifetime}
                self._live[self._token()] = now
            left = int(self.lifetime - (now - self._issued))
            token = self._token()
        body = {"access_token": token, "expires_in": left, "token_type": "Bearer"}
        return 200, json.dumps(body), "application/json"

    def valid(self, token: str) -> bool:
        """``token`` was issued here and has not expired: what Google's token check would say of it
        (the local Artifact Registry asks, to learn whose a pull's credentials are)."""
        with self._lock:
            at = self._live.get(token)
            return at is not None and time.monotonic() - at < self.lifetime

    def _token(self) -> str:
        return f"ya29.localcloud-{self._instance}-{self._serial}"


def service_account(email: str, scopes: list[str], subject: str, tokens: Tokens) -> dict[str, Any]:
    """One ``instance/service-accounts/<alias>/`` directory."""

    def identity(args: Mapping[str, str]) -> tuple[int, str, str]:
        audience = args.get("audience", "")
        if not audience:
            return 400, "non-empty audience parameter required", "application/text"
        now = int(time.time())
        claims: dict[str, Any] = {"aud": audience, "azp": subject, "exp": now + 3600, "iat": now,
                                  "iss": "https://accounts.google.com", "sub": subject}
        if args.get("format") == "full":
            claims.update(email=email, email_verified=True)
        header = {"alg": "RS256", "kid": "localcloud", "typ": "JWT"}
        parts = [_b64(json.dumps(header).encode()), _b64(json.dumps(claims).encode()), _b64(b"localcloud-unsigned")]
        return 200, ".".join(parts), "application/text"

    return {"aliases": ["default"], "email": email, "identity": Endpoint("identity", identity),
            "scopes": list(scopes), "token": Endpoint("token", tokens.access)}


class MetadataServer:
    """``snapshot()`` returns the instance's metadata tree; ``changed()`` wakes long polls."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        self._changed = threading.Condition()
        self._version = 0  # bumped by every changed(): a waiter that saw it move looks again
        self._stopped = False
        self._served = Served(self._app(), "metadata", threads=8)

    @property
    def host(self) -> str:
        """The value for ``GCE_METADATA_HOST`` and ``GCE_METADATA_IP`` (host:port, no scheme)."""
        return f"127.0.0.1:{self._served.port}"

    def changed(self) -> None:
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    def stop(self) -> None:
        # Long polls answer at once once the VM is off (a guest's agent is gone with it): left
        # blocked, they would hold the server's shutdown for its own 5 s wait at every power-off.
        self._stopped = True
        self.changed()
        self._served.stop()

    def _app(self) -> Flask:
        app = Flask("metadata")
        app.url_map.merge_slashes = False
        app.url_map.strict_slashes = False

        @app.route("/")
        def root() -> Response:
            return _reply("computeMetadata/\n", 200)

        @app.route("/computeMetadata/")
        def versions() -> Response:
            if request.headers.get("Metadata-Flavor") != "Google":
                return _reply("Missing required header: Metadata-Flavor", 403)
            return _reply("v1/\n", 200)

        @app.route("/computeMetadata/v1/", defaults={"path": ""})
        @app.route("/computeMetadata/v1/<path:path>")
        def get(path: str) -> Response:
            if request.headers.get("Metadata-Flavor") != "Google":
                return _reply("Missing required header: Metadata-Flavor", 403)
            value = self._lookup(path)
            if value is None:
                return _reply("Not Found", 404)
            if request.args.get("wait_for_change") == "true":
                value = self._wait(path, request.args.get("last_etag"), float(request.args.get("timeout_sec", 60)))
                if value is None:
                    return _reply("Not Found", 404)
            return _render(value, path)

        @app.errorhandler(404)
        def not_found(_: Exception) -> Response:
            return _reply("Not Found", 404)

        @app.errorhandler(405)
        def not_allowed(_: Exception) -> Response:
            return _reply("Method Not Allowed", 405)

        return app

    def _lookup(self, path: str) -> Any:
        node: Any = self._snapshot()
        for part in [p for p in path.split("/") if p]:
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    def _wait(self, path: str, last_etag: str | None, timeout: float) -> Any:
        """Block until the value's ETag differs from ``last_etag`` (or from now), or timeout."""
        current = self._lookup(path)
        baseline = last_etag or _etag(current)
        deadline = time.monotonic() + min(timeout, 300)
        # The tree is read *outside* the condition's lock: reading it takes the owning
        # server's lock, which that server holds while it calls changed() (a waiter holding
        # the condition while reading would deadlock with it).
        while True:
            with self._changed:
                seen = self._version
            value = self._lookup(path)
            left = deadline - time.monotonic()
            if _etag(value) != baseline or left <= 0 or self._stopped:
                return value
            with self._changed:
                if self._version == seen:
                    self._changed.wait(timeout=left)


def _etag(value: Any) -> str:
    document = _as_json(value)
    if document is _SKIP:  # an endpoint: computed per request, its ETag names it
        document = f"endpoint:{value.name}"
    return hashlib.sha1(json.dumps(document, sort_keys=True).encode()).hexdigest()[:16]


def _render(value: Any, path: str) -> Response:
    if isinstance(value, Endpoint):
        status, body, mime = value.render(request.args)
        return _reply(body, status, mime)
    recursive = request.args.get("recursive") == "true"
    alt = request.args.get("alt", "json" if recursive else "text")
    if isinstance(value, dict) and recursive and alt == "text":
        body, mime = "".join(f"{path} {leaf}\n" for path, leaf in _leaves(value, "")), "application/text"
    elif isinstance(value, dict) and not recursive:
        body = "".join(f"{k}/\n" if isinstance(v, dict) else f"{k}\n" for k, v in value.items())
        mime = "application/text"
    elif alt == "json":
        # A directory of names (``instance/attributes/``) keeps them as they are at its own root too.
        verbatim = path.rstrip("/").rsplit("/", 1)[-1] in _VERBATIM
        body, mime = json.dumps(_as_json(value, verbatim)), "application/json"
    elif isinstance(value, list):
        body, mime = "".join(f"{item}\n" for item in value), "application/text"
    else:
        body, mime = str(value), "application/text"
    response = _reply(body, 200, mime)
    response.headers["ETag"] = _etag(value)
    return response


# Directories whose entries are names the user or Compute chose (attribute keys, account
# e-mails, indexes): kept as they are in JSON, where every other key is camelCase.
_VERBATIM = {"attributes", "service-accounts"}
_SKIP = object()


def _as_json(node: Any, verbatim: bool = False) -> Any:
    if isinstance(node, Endpoint):
        return _SKIP
    if not isinstance(node, dict):
        return node
    if node and all(k.isdigit() for k in node):  # disks/0/, network-interfaces/0/: a list in JSON
        return [_as_json(node[k]) for k in sorted(node, key=int)]
    out = {}
    for key, child in node.items():
        converted = _as_json(child, key in _VERBATIM)
        if converted is not _SKIP:
            out[key if verbatim else _camel(key)] = converted
    return out


def _leaves(node: dict[str, Any], prefix: str) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for key, child in node.items():
        if isinstance(child, Endpoint):
            continue
        if isinstance(child, dict):
            found.extend(_leaves(child, f"{prefix}{key}/"))
        elif isinstance(child, list):
            found.extend((f"{prefix}{key}", str(item)) for item in child)
        else:
            found.append((f"{prefix}{key}", str(child)))
    return found


def _camel(key: str) -> str:
    return re.sub(r"-([a-z0-9])", lambda m: m.group(1).upper(), key)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _reply(body: str, status: int, mime: str = "application/text") -> Response:
    response = Response(body, status=status, mimetype=mime)
    response.headers["Metadata-Flavor"] = "Google"
    return response
