"""Running the dashboard: bind, say where, serve until SIGINT or SIGTERM.

Werkzeug's threaded server (Flask's own, no further dependency): a local tool for one
person's browser tabs, never a production server. One line goes to standard output,
``dashboard at http://HOST:PORT/``, so that a script can read the port it got (``--port 0``).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import webbrowser
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from werkzeug.serving import BaseWSGIServer, make_server

from controller.dashboard.guard import Guard
from controller.dashboard.logtail import Recent
from controller.dashboard.server import create_app
from controller.dashboard.snapshot import Fleet
from controller.service.jobs import Jobs

INTERRUPTED = 130  # SIGINT's exit code, as a shell reports it


def bind(jobs: Jobs, host: str, port: int, interval: float, remote: bool,
         recent: Recent | None = None, allowed_hosts: tuple[str, ...] = ()) -> tuple[BaseWSGIServer, str]:
    """The server, bound (``port`` 0: a free one), and the address it answers at. ``recent(job)``:
    the job's last log lines (``logtail``; None: the job page says to run ``respawn logs``)."""
    guard = Guard(remote=remote, names=frozenset(allowed_hosts))
    fleet = Fleet(jobs, interval)
    fleet.snapshot()  # the bucket read once before anything is said: no credentials, no bucket: one line, exit 2 or 3
    app = create_app(fleet, guard, interval, recent=recent)
    server = make_server(host, port, app, threaded=True)
    guard.bound(host, server.server_port)
    shown = f"[{host}]" if ":" in host else host
    return server, f"http://{shown}:{server.server_port}/"


@contextmanager
def _until_signalled(server: BaseWSGIServer, code: list[int]) -> Iterator[None]:
    """SIGINT (130) or SIGTERM (0) stops ``serve_forever`` between two requests: the handler only
    asks, from a thread of its own (``shutdown`` waits for the loop), and records the exit code."""
    def stop(signum: int, _: object) -> None:
        if not code:
            code.append(INTERRUPTED if signum == signal.SIGINT else 0)
            threading.Thread(target=server.shutdown, daemon=True).start()

    before = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def serve(server: BaseWSGIServer, url: str, open_browser: bool, out: TextIO | None = None) -> int:
    """Print where, open a browser there unless told not to, serve; the exit code once signalled."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request: stdout says one thing
    print(f"dashboard at {url}", file=out or sys.stdout, flush=True)  # looked up now: a test's capture
    if open_browser:
        threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()
    code: list[int] = []
    try:
        with _until_signalled(server, code):
            server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:  # a signal that came before the handlers were set
        return INTERRUPTED
    finally:
        server.server_close()
    return code[0] if code else 0
