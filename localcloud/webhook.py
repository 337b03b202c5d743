"""A local incoming-webhook sink (Slack-compatible): every POST's JSON body, recorded in order.

It answers as Slack's incoming webhooks do: 200 ``ok`` (text/plain) for a JSON body, 400
``invalid_payload`` for anything else, 429 with ``Retry-After`` when rate limited. A test makes
it fail on purpose with ``fail_next(500, times=2)`` (or ``POST /_local/fail_next``), and slow
with ``slow(seconds)`` (``POST /_local/slow``): every post is answered that many seconds late,
until ``slow(0)`` (a destination that holds each post past the client's timeout never answers
in time). It listens on 127.0.0.1, on a port of its own; every path is a hook (``url`` is one).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from flask import Flask, Response, request

from localcloud.host import Host
from localcloud.http import Server


@dataclass(frozen=True)
class Delivery:
    path: str
    body: Any  # the JSON it carried
    content_type: str


class WebhookSink(Server):
    name, threads = "webhook", 8

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []  # accepted posts, in order
        self.refused = 0  # posts answered with an error (fail_next or not JSON)
        self._failures: list[int] = []
        self._delay = 0.0  # seconds each post waits before it is answered
        self._fast = threading.Event()  # set by slow(0): posts waiting are answered at once
        self._lock = threading.Condition()

    @property
    def base(self) -> str:
        return self.address

    @property
    def url(self) -> str:
        """A hook's URL, shaped as Slack's (``/services/T.../B.../secret``)."""
        return f"{self.base}/services/TLOCAL/BLOCAL/local-secret"

    @property
    def bodies(self) -> list[Any]:
        with self._lock:
            return [d.body for d in self.deliveries]

    def fail_next(self, status: int = 500, times: int = 1) -> None:
        """The next ``times`` posts are answered ``status`` (500, 503, 429...) and not recorded."""
        if not 400 <= int(status) <= 599:
            raise ValueError(f"not an error status: {status}")
        with self._lock:
            self._failures.extend([int(status)] * int(times))

    def slow(self, seconds: float) -> None:
        """Answer every post ``seconds`` late (0: at once again, and the posts waiting now too)."""
        seconds = float(seconds)
        if not 0 <= seconds <= 3600:
            raise ValueError(f"not a delay in seconds (0 to 3600): {seconds}")
        with self._lock:
            self._delay = seconds
            if seconds == 0:
                self._fast.set()
            else:
                self._fast.clear()

    def reset(self) -> None:
        """Nothing recorded, no failure pending, no delay (a sink shared by several tests)."""
        self.slow(0)
        with self._lock:
            self.deliveries.clear()
            self._failures.clear()
            self.refused = 0

    def wait_for(self, count: int, timeout: float = 10.0) -> list[Any]:
        """The bodies once at least ``count`` were recorded; ``TimeoutError`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self.deliveries) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(self.deliveries)} webhook posts, not {count}, within {timeout}s")
                self._lock.wait(left)
            return [d.body for d in self.deliveries]

    def _app(self) -> Flask:
        app = Flask("webhook")
        Host._fault_route(app, {"fail_next": self.fail_next, "slow": self.slow})

        @app.post("/", defaults={"path": ""})
        @app.post("/<path:path>")
        def hook(path: str) -> Response:
            with self._lock:
                delay, fast = self._delay, self._fast
            if delay:
                fast.wait(delay)
            with self._lock:
                if self._failures:
                    self.refused += 1
                    status = self._failures.pop(0)
                    headers = {"Retry-After": "1"} if status == 429 else {}
                    return Response("rate_limited" if status == 429 else "internal_error", status, headers,
                                    mimetype="text/plain")
            try:
                body = json.loads(request.get_data())
            except ValueError:
                with self._lock:
                    self.refused += 1
                return Response("invalid_payload", 400, mimetype="text/plain")
            with self._lock:
                self.deliveries.append(Delivery(f"/{path}", body, request.content_type or ""))
                self._lock.notify_all()
            return Response("ok", 200, mimetype="text/plain")

        return app
