"""Serve a WSGI app on a free 127.0.0.1 port in a background thread, and stop it.

The server is waitress, not werkzeug's development server: werkzeug answers every request
with ``Connection: close`` (its handler cannot drain a request before the next one), so
each call of a client paid a new TCP connection on both ends, which Google's front ends,
keeping HTTP/1.1 connections alive, never charge. At a fleet's request rates that
overhead, not the controller, was most of what a benchmark measured. waitress keeps
connections alive, and serves each request on one of ``threads`` threads (a request that
sleeps to play Google's latency, or waits on an operation, holds only its own).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Self

from waitress import wasyncore
from waitress.server import create_server

# "Task queue depth is N": requests waiting for a thread, which a test may make on purpose.
logging.getLogger("waitress.queue").setLevel(logging.ERROR)


class Served:
    def __init__(self, app: Any, name: str, threads: int = 32) -> None:
        self._map: dict[int, Any] = {}
        # poll(), not select(): select() refuses a descriptor past 1024, which a local cloud of
        # a few hundred VMs (each with its metadata server and processes) reaches.
        self._server = create_server(app, map=self._map, host="127.0.0.1", port=0, threads=threads, ident=name,
                                     connection_limit=4096, channel_timeout=300, clear_untrusted_proxy_headers=True,
                                     asyncore_use_poll=True)
        self.port = self._server.effective_port
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        try:
            self._server.run()
        except (OSError, ValueError):  # a socket closed under the loop by stop()
            if not self._stopping:
                raise

    def stop(self) -> None:
        self._stopping = True
        # waitress's loop ends once its socket map is empty: close every channel and the
        # listening socket itself (what WebTest's StopableWSGIServer does), then the threads.
        # Done in the loop's own thread, woken by its trigger: closed from here, the loop slept
        # on in poll() over the closed sockets for up to its timeout (1 s) a server, which a
        # local cloud's Ctrl-C paid several times over.
        # First no new connection, and the requests under way answered (a task thread that wrote
        # its answer after the loop's trigger was closed was waitress's "OSError: Bad file
        # descriptor" traceback, at a VM's power-off); then the rest.
        self._in_loop(lambda: wasyncore.dispatcher.close(self._server))  # the listening socket alone
        self._server.task_dispatcher.shutdown(timeout=2)

        def close() -> None:
            self._server.close()  # the listening socket and the loop's trigger
            while self._map:
                for channel in list(self._map.values()):
                    channel.handle_close()

        if not self._in_loop(close):  # no loop to run it: from here, as before
            close()
        self._thread.join(timeout=5)

    def _in_loop(self, call: Any) -> bool:
        """Run ``call`` in the loop's own thread, woken by its trigger; False where it did not run."""
        done = threading.Event()

        def run() -> None:
            try:
                call()
            finally:
                done.set()

        if self._thread.is_alive():
            try:
                self._server.trigger.pull_trigger(run)
            except OSError:  # the trigger is gone already: the loop is ending
                return False
            return done.wait(timeout=2)
        return False


class Server:
    """A local server's lifecycle: ``start`` serves ``self._app()`` on a free 127.0.0.1 port,
    ``stop`` ends it, and a ``with`` block does both. Subclasses set ``name`` and ``threads``."""

    name = "server"
    threads = 16
    _served: Served | None = None

    def _app(self) -> Any:
        raise NotImplementedError

    def start(self) -> Self:
        self._served = Served(self._app(), self.name, threads=self.threads)
        return self

    def stop(self) -> None:
        if self._served:
            self._served.stop()
            self._served = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def address(self) -> str:
        """``http://127.0.0.1:PORT``, once started."""
        assert self._served, "not started"
        return self._served.url
