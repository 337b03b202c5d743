"""What the local Compute and Cloud TPU servers share: machines that are real local processes.

A server of this kind owns a work folder (one subfolder per machine), timers for what
happens later (an operation finishing, a VM booting), the processes of its machines,
and its HTTP server, whose ``POST /_local/<fault>`` injects faults (``GET /_local/`` says
which machines and zones there are to name); ``stop()`` ends all of it, and no machine
process outlives it.
"""

from __future__ import annotations

import json
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Self

from flask import Flask, Response, request

from localcloud.http import Served
from localcloud.metadata import MetadataServer
from localcloud.vm import VmProcess, unmount_under


class Host:
    def __init__(self, vm_env: dict[str, str] | None, workdir: Path | None, prefix: str) -> None:
        self.vm_env = dict(vm_env or {})
        self._closed = threading.Event()
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True)
        self.workdir = workdir or Path(self._tmp.name)  # type: ignore[union-attr]
        self._lock = threading.RLock()
        self._timers: list[threading.Timer] = []
        self._processes: set[VmProcess] = set()  # every machine process not yet killed
        self._served: Served | None = None

    @property
    def endpoint(self) -> str:
        """What ``client_options.api_endpoint`` takes; gcloud's overrides add the API's path
        (``/compute/v1/`` for Compute, ``/`` for Cloud TPU)."""
        assert self._served, "not started"
        return self._served.url

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        self._closed.set()
        with self._lock:
            timers, self._timers = self._timers, []
        for timer in timers:
            timer.cancel()
        self._power_off_machines()
        with self._lock:
            stopping, self._processes = list(self._processes), set()
        for process in stopping:  # machines part-way through a shutdown script
            process.kill()
        if self._served:
            self._served.stop()
        # A machine's podman may mount its store again after its power-off (conmon's cleanup of a
        # container that died with it): nothing of it stays mounted once the server is gone.
        unmount_under(self.workdir)
        if self._tmp:
            self._tmp.cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _power_off_machines(self) -> None:
        """Every machine off at once, no shutdown script (the server is going away)."""
        raise NotImplementedError

    def _later(self, delay: float, fn: Any, *args: Any) -> None:
        if self._closed.is_set():
            return
        timer = threading.Timer(delay, fn, args)
        timer.daemon = True
        with self._lock:
            self._timers = [t for t in self._timers if t.is_alive()] + [timer]
        timer.start()

    def _machine(self, workdir: Path, metadata: MetadataServer, powered_off: Callable[[VmProcess], None]) -> VmProcess:
        """A machine's process, not started yet (its owner records it first), run in ``workdir``
        against ``metadata``; ``powered_off(process)`` when its guest powers itself off."""
        workdir.mkdir(parents=True, exist_ok=True)
        env = {**self.vm_env, "GCE_METADATA_HOST": metadata.host, "GCE_METADATA_IP": metadata.host,
               "RESPAWN_RUN_DIR": str(workdir)}  # /var/run/respawn on a real VM; one VM per folder here
        process = VmProcess(workdir, env, lambda: powered_off(process))
        self._processes.add(process)
        return process

    zones: tuple[str, ...] = ()

    def names(self) -> set[str]:
        """The names of the machines there are now (instance names, TPU node ids)."""
        raise NotImplementedError

    def _inventory(self) -> dict[str, Any]:
        """What a fault can name: the machines there are now, and the zones."""
        return {"machines": sorted(self.names()), "zones": list(self.zones)}

    @staticmethod
    def _fault_route(app: Flask, actions: Mapping[str, Callable[..., Any]],
                     refused: tuple[type[Exception], ...] = (TypeError, ValueError),
                     inventory: Callable[[], dict[str, Any]] | None = None) -> None:
        """``POST /_local/<fault>`` with the fault's arguments as JSON; 400 when it refuses them.
        ``GET /_local/``: the faults, and what ``inventory()`` says they can name."""

        @app.get("/_local/")
        def listed() -> Response:
            return json_response({"faults": sorted(actions), **(inventory() if inventory else {})})

        @app.post("/_local/<fault>")
        def fault(fault: str) -> Response:
            args = request.get_json(force=True, silent=True) or {}
            if fault not in actions:
                return json_response({"error": f"unknown fault {fault}"}, 404)
            try:
                actions[fault](**args)
            except refused as e:  # arguments the fault does not take
                return json_response({"error": f"{fault}: {e}"}, 400)
            return json_response({"ok": True})


def json_response(body: dict[str, Any], status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, mimetype="application/json")
