"""Running the dashboard: bind, say where, serve until SIGINT or SIGTERM.

Werkzeug's threaded server (Flask's own, no further dependency): a local tool for one
person's browser tabs, never a production server. One line goes to standard output,
``dashboard at http://HOST:PORT/?token=KEY``, so that a script can read the port it got
(``--port 0``) and the key every request carries (``guard``). The key never goes on a command
line, where any account's ``ps`` reads it: the browser is opened on a file of the user's alone
that forwards to the address (as notebook servers do), and ``--key-file`` names a file.
"""

from __future__ import annotations

import html
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import webbrowser
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO
from urllib.parse import urlencode

from werkzeug.serving import BaseWSGIServer, make_server

from controller.dashboard.guard import KEY_PARAM, Guard, new_key
from controller.dashboard.logtail import Recent
from controller.dashboard.server import create_app
from controller.dashboard.snapshot import Fleet
from controller.service.jobs import Jobs

INTERRUPTED = 130  # SIGINT's exit code, as a shell reports it


MIN_KEY = 16  # characters of a key read from --key-file: a shorter one could be guessed


class KeyRefused(Exception):
    """A --key-file that cannot hold the dashboard's key: said in one line."""


def bind(jobs: Jobs, host: str, port: int, interval: float, remote: bool,
         recent: Recent | None = None, allowed_hosts: tuple[str, ...] = (),
         key: str | None = None) -> tuple[BaseWSGIServer, str]:
    """The server, bound (``port`` 0: a free one), and the address it answers at, its key in it.
    ``recent(job)``: the job's last log lines (``logtail``; None: the job page says to run ``respawn
    logs``). ``key``: the one every request must carry (``key_file``); by default a fresh one."""
    guard = Guard(remote=remote, names=frozenset(allowed_hosts), key=key or new_key())
    fleet = Fleet(jobs, interval)
    fleet.snapshot()  # the bucket read once before anything is said: no credentials, no bucket: one line, exit 2 or 3
    app = create_app(fleet, guard, interval, recent=recent)
    server = make_server(host, port, app, threaded=True)
    guard.bound(host, server.server_port)
    shown = f"[{host}]" if ":" in host else host
    return server, f"http://{shown}:{server.server_port}/?{urlencode({KEY_PARAM: guard.key})}"


def key_file(path: Path) -> str:
    """The key kept in ``path`` (its first line), the same at every start: for a bookmark, or a
    Prometheus scrape job's ``authorization: {credentials_file: PATH}``. A missing file is made with
    a fresh key, readable by its owner alone; one that other accounts may read is refused, as ssh
    refuses such a private key."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    except OSError as e:
        raise KeyRefused(f"cannot make --key-file {path}: {e.strerror or e}") from None
    else:
        with os.fdopen(fd, "w") as made:
            made.write(new_key() + "\n")
    try:
        if os.stat(path).st_mode & 0o077:
            raise KeyRefused(f"--key-file {path} may be read by other accounts: chmod 600 {path}")
        key = path.read_text(encoding="utf-8").partition("\n")[0].strip()
    except (OSError, UnicodeError) as e:
        raise KeyRefused(f"cannot read --key-file {path}: {getattr(e, 'strerror', None) or e}") from None
    if len(key) < MIN_KEY or not key.isprintable() or " " in key:
        raise KeyRefused(f"--key-file {path}: its first line must be a key of at least {MIN_KEY} characters, "
                         "no spaces (delete the file to have one made)")
    return key


def forwarding_page(url: str) -> Path:
    """A page of the user's alone (its folder 0700) that forwards the browser to ``url``: opened in
    place of the address, which a browser's command line would show to every account."""
    folder = Path(tempfile.mkdtemp(prefix="respawn-dashboard-"))
    page = folder / "open.html"
    fd = os.open(page, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    target = html.escape(url, quote=True)
    with os.fdopen(fd, "w") as out:
        out.write(f'<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url={target}">'
                  f'<title>respawn dashboard</title><p><a href="{target}">respawn dashboard</a></p>\n')
    return page


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
    opener = forwarding_page(url) if open_browser else None
    if opener is not None:
        threading.Thread(target=webbrowser.open, args=(opener.as_uri(),), daemon=True).start()
    code: list[int] = []
    try:
        with _until_signalled(server, code):
            server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:  # a signal that came before the handlers were set
        return INTERRUPTED
    finally:
        server.server_close()
        if opener is not None:
            shutil.rmtree(opener.parent, ignore_errors=True)
    return code[0] if code else 0
