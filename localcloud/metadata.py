"""A per-instance metadata server, like 169.254.169.254 inside a Compute Engine VM.

Serves what the VM scripts and Google's client libraries read: ``instance/attributes/*``,
``instance/name``, ``zone``, ``id``, ``hostname``, ``preempted``, ``maintenance-event``,
the default service account's token, ``project/project-id``; with the
``Metadata-Flavor: Google`` header required, ETags, ``?recursive=true``, ``?alt=text``
and ``?wait_for_change=true`` long polling.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, request

from localcloud.http import Served

Snapshot = Callable[[], dict[str, Any]]


class MetadataServer:
    """``snapshot()`` returns the instance's metadata tree; ``changed()`` wakes long polls."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        self._changed = threading.Condition()
        self._served = Served(self._app(), "metadata")

    @property
    def host(self) -> str:
        """The value for ``GCE_METADATA_HOST`` (host:port, no scheme)."""
        return f"127.0.0.1:{self._served.port}"

    def changed(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def stop(self) -> None:
        self.changed()
        self._served.stop()

    def _app(self) -> Flask:
        app = Flask("metadata")

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
            return _render(value, path)

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
        with self._changed:
            self._changed.wait_for(lambda: _etag(self._lookup(path)) != baseline, timeout=min(timeout, 300))
        return self._lookup(path)


def _etag(value: Any) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _render(value: Any, path: str) -> Response:
    recursive = request.args.get("recursive") == "true"
    alt = request.args.get("alt", "json" if recursive else "text")
    if isinstance(value, dict) and not recursive:
        body = "".join(f"{k}/\n" if isinstance(v, dict) else f"{k}\n" for k, v in value.items())
        mime = "application/text"
    elif alt == "json" and (recursive or not isinstance(value, str)):
        body, mime = json.dumps(value), "application/json"
    else:
        body, mime = str(value), "application/text"
    response = _reply(body, 200, mime)
    response.headers["ETag"] = _etag(value)
    return response


def _reply(body: str, status: int, mime: str = "application/text") -> Response:
    response = Response(body, status=status, mimetype=mime)
    response.headers["Metadata-Flavor"] = "Google"
    return response
