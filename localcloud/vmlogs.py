"""Each local VM's and Cloud TPU worker's serial output, line by line, into the local Cloud
Logging (``localcloud.logging``), as Google's serial-port logging and guest agent write it.

Above the local Compute, Cloud TPU and Logging servers alike: it reads the first two's machines
and writes into the third, so none of those three imports another to do it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localcloud.logging import RUNNER, SCRIPTS_LOG, SERIAL_LOG, SERIAL_METADATA, LoggingServer, rfc3339
from localcloud.tpu_api import hostname

if TYPE_CHECKING:
    from localcloud.compute import ComputeServer
    from localcloud.tpu import TpuServer


# -- the VMs' output ---------------------------------------------------------------------------
@dataclass(frozen=True)
class _Who:
    """Whose serial port a log is, as Logging names it."""

    resource: dict[str, Any]  # the monitored resource: gce_instance or tpu_worker
    project: str
    host: str  # the VM's own name (the guest agent's instance_name label)
    serial: bool  # serial-port-logging-enable is TRUE in its metadata


@dataclass
class _Tail:
    offset: int = 0
    partial: bytes = b""
    last: int = 0  # the last timestamp given (ns): each line later than the one before
    who: _Who | None = None  # the machine writing it, as last seen


def _enabled(value: str | None) -> bool:
    """A metadata boolean as Compute reads it (TRUE, true, 1, y, yes...)."""
    return str(value or "").strip().lower() in ("true", "1", "y", "yes", "on")


class VmLogs:
    """Feeds each line a local Compute VM, or a local Cloud TPU node's worker (``tpu``), writes to
    its serial port into a ``LoggingServer``, as Google's serial-port logging and guest agent do
    (see the module's docstring), every ``interval`` seconds until ``stop()``, which feeds what is
    left first."""

    def __init__(self, logging: LoggingServer, compute: ComputeServer, interval: float = 0.2,
                 tpu: TpuServer | None = None) -> None:
        self.logging, self.compute, self.tpu, self.interval = logging, compute, tpu, interval
        self._tails: dict[str, _Tail] = {}
        self._stop = threading.Event()
        self._sweeping = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> VmLogs:
        self._thread = threading.Thread(target=self._run, name="vm-logs", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        self.sweep(final=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - a VM folder going away mid-read: the next sweep sees
                continue

    def sweep(self, final: bool = False) -> None:
        """Feed every line written since the last sweep (``final``: an unfinished last line too)."""
        with self._sweeping:
            root = self.compute.workdir
            for folder in sorted(root.iterdir()) if root.exists() else ():
                log = folder / "serial-port-1.log"
                if folder.name.startswith(".") or not log.is_file():
                    continue
                self._feed(folder.name, log, final, lambda name=folder.name: self._vm(name))
            root = self.tpu.workdir if self.tpu is not None else None
            for folder in sorted(root.iterdir()) if root is not None and root.exists() else ():
                if folder.name.startswith("."):
                    continue
                for worker in sorted(folder.glob("w-*")):
                    log, number = worker / "serial-port-1.log", worker.name[2:]
                    if not number.isdigit() or not log.is_file():
                        continue
                    self._feed(f"tpu/{folder.name}/{number}", log, final,
                               lambda node=folder.name, n=int(number): self._worker(node, n))

    def _vm(self, name: str) -> _Who:
        resource = self.compute.instance(name)  # KeyError once deleted
        project = resource["selfLink"].split("/projects/", 1)[1].split("/", 1)[0]
        items = {i.get("key"): i.get("value") for i in (resource.get("metadata") or {}).get("items") or []}
        return _Who({"type": "gce_instance", "labels": {"instance_id": str(resource["id"]),
                                                        "zone": resource["zone"].rsplit("/", 1)[-1],
                                                        "project_id": project}},
                    project, name, _enabled(items.get(SERIAL_METADATA)))

    def _worker(self, node_id: str, worker: int) -> _Who:
        assert self.tpu is not None
        node = self.tpu.node(node_id)  # KeyError once deleted
        _, project, _, zone, _, _ = node["name"].split("/")
        return _Who({"type": "tpu_worker", "labels": {"project_id": project, "zone": zone, "node_id": node_id,
                                                      "worker_id": str(worker)}},
                    project, hostname(node["id"], worker), _enabled((node.get("metadata") or {}).get(SERIAL_METADATA)))

    def _feed(self, key: str, log: Path, final: bool, identify: Callable[[], _Who]) -> None:
        tail = self._tails.setdefault(key, _Tail())
        size = log.stat().st_size
        if size < tail.offset:  # a new file in its place
            tail.offset, tail.partial = 0, b""
        if size == tail.offset and not (final and tail.partial):
            return
        with open(log, "rb") as f:
            f.seek(tail.offset)
            data = f.read(size - tail.offset)
        tail.offset += len(data)
        *lines, tail.partial = (tail.partial + data).split(b"\n")
        if final and tail.partial:
            lines, tail.partial = [*lines, tail.partial], b""
        if not lines:
            return
        try:
            tail.who = identify()
        except KeyError:  # deleted since: its last lines are still its own
            pass
        if tail.who is None:
            return
        entries = []
        for raw in lines:
            tail.last = max(time.time_ns(), tail.last + 1000)
            entries += _vm_entries(tail.who, raw.decode(errors="replace").rstrip("\r"), tail.last)
        if entries:
            self.logging.write(entries)


def _vm_entries(who: _Who, line: str, nanos: int) -> list[dict[str, Any]]:
    """One serial-port line as serial-port logging (where it is on) and the guest agent's script
    runner log it."""
    stamp = rfc3339(nanos)
    message = line[len(RUNNER):] if line.startswith(RUNNER) else f"startup-script: {line}"
    local = datetime.fromtimestamp(nanos / 1e9).astimezone().isoformat(timespec="milliseconds")
    serial = [{"logName": f"projects/{who.project}/logs/{SERIAL_LOG}", "resource": who.resource,
               "textPayload": line, "timestamp": stamp}] if who.serial else []
    return [
        *serial,
        {"logName": f"projects/{who.project}/logs/{SCRIPTS_LOG}", "resource": who.resource, "severity": "INFO",
         "jsonPayload": {"message": message, "localTimestamp": local}, "labels": {"instance_name": who.host},
         "timestamp": stamp},
    ]
