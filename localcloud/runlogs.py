"""The local functions' log lines into the local Cloud Logging, as Cloud Run stores a gen2
function's output.

On Google each function logs through google-cloud-logging's ``StructuredLogHandler``: one JSON
line on stdout per record, which Cloud Run stores in ``run.googleapis.com%2Fstdout`` with resource
``cloud_run_revision`` (``service_name`` the function's), the line's fields as ``jsonPayload``
(``message`` and the record's ``json_fields``), its ``severity``, and the time Cloud Run got it.
Locally the functions log text lines (``controller.service.logs``: ``TIME LEVEL LOGGER: MESSAGE
{FIELDS}``) into ``function-<target>.log`` in the local cloud's ``log_dir``, which ``respawn local
up`` shows (``localcloud.session.Actions``); ``FunctionLogs`` follows those files and writes each
controller line as that entry, so that what reads the controller's log on Google (``respawn
canary``: ``on_audit``'s "audit event handled") reads the same here. A line's time is its own
(to the millisecond, this machine's local time), as Cloud Run's is within a few ms of the write.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from controller.cli.deploy import ON_AUDIT, ON_OBJECT, TICK
from localcloud.events import Loop
from localcloud.logging import LoggingServer, rfc3339

SERVICES = {"function-tick.log": TICK, "function-on_object.log": ON_OBJECT, "function-on_audit.log": ON_AUDIT}
LOG = "run.googleapis.com%2Fstdout"
_LINE = re.compile(r"^(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (?P<level>[A-Z]+) (?P<logger>controller[\w.]*): "
                   r"(?P<rest>.*)$")
_SEVERITIES = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}


def entry(line: str, project: str, region: str, service: str) -> dict[str, Any] | None:
    """The LogEntry Cloud Run would store for a controller log line; None for any other line."""
    found = _LINE.match(line.rstrip("\n"))
    if found is None:
        return None
    message, fields = _split(found["rest"])
    at = datetime.strptime(found["time"], "%Y-%m-%d %H:%M:%S,%f").astimezone()  # this machine's local time
    return {"logName": f"projects/{project}/logs/{LOG}",
            "resource": {"type": "cloud_run_revision",
                         "labels": {"project_id": project, "service_name": service, "location": region,
                                    "configuration_name": service, "revision_name": f"{service}-00001-loc"}},
            "timestamp": rfc3339(round(at.timestamp() * 1000) * 1_000_000),  # UTC, as Logging answers it
            "severity": found["level"] if found["level"] in _SEVERITIES else "DEFAULT",
            "jsonPayload": {**fields, "message": message}}


def _split(rest: str) -> tuple[str, dict[str, Any]]:
    """The message and its fields: the rest of the line from its first `` {`` that starts one JSON
    object running to the line's end (a message may hold braces of its own before it)."""
    for found in re.finditer(r" \{", rest):
        try:
            fields = json.loads(rest[found.start() + 1:])
        except ValueError:
            continue
        if isinstance(fields, dict):
            return rest[:found.start()], fields
    return rest, {}


class FunctionLogs(Loop):
    """Follows the functions' log files in ``folder`` from their current end (not an earlier
    cloud's) and writes their controller lines into ``logging`` every ``interval`` seconds; at
    ``stop()`` what is left first."""

    def __init__(self, logging: LoggingServer, folder: Path, project: str, region: str,
                 interval: float = 0.2) -> None:
        super().__init__("respawn-local-function-logs", interval)
        self.logging, self.folder, self.project, self.region = logging, folder, project, region
        self._offsets = {name: _size(folder / name) for name in SERVICES}

    def stop(self) -> None:
        super().stop()
        self.once()

    def once(self) -> None:
        for name, service in SERVICES.items():
            try:
                with (self.folder / name).open("rb") as f:
                    f.seek(self._offsets[name])
                    data = f.read()
            except FileNotFoundError:
                continue
            whole = data[: data.rfind(b"\n") + 1]  # a line still being written waits for its end
            self._offsets[name] += len(whole)
            entries = [e for raw in whole.decode("utf-8", "replace").splitlines()
                       if (e := entry(raw, self.project, self.region, service)) is not None]
            if entries:
                self.logging.write(entries)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
