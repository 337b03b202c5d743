"""What `respawn local up` leaves for the user's other terminals, and shows in its own.

- ``write_env``: the exports that point clients at the local cloud, in a file a second
  terminal sources in one line (``respawn local env`` prints it again); removed on stop.
- ``Actions``: a line for every action the controller takes (create, delete, status
  written, and what failed), read from the functions' own logs as they are written, so
  that the terminal running the local cloud shows the controller at work.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path

from controller.cli import buckets
from localcloud.events import Loop

ENV_FILE = "local.env"
# An executor log line, as controller.service.logs writes it in text form:
# "2026-11-27 12:01:03,123 INFO controller.service.executor: create demo-1 in us-central1-a: done {...}"
_ACTION = re.compile(r"^\S+ (?P<time>\d\d:\d\d:\d\d)\S* (?P<level>[A-Z]+) controller\.service\.executor: "
                     r"(?P<what>.+?)(?: \{.*\})?$")


def write_env(folder: Path, env: Mapping[str, str]) -> Path:
    """The exports, one ``export KEY=VALUE`` line each (values quoted for the shell), in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ENV_FILE
    body = "".join(f"export {key}={shlex.quote(value)}\n" for key, value in env.items())
    path.write_text("# written by `respawn local up`; source it in another terminal\n" + body)
    return path


def read_env(folder: Path) -> str | None:
    """What ``write_env`` wrote, or None when no local cloud is up (or it left no file)."""
    try:
        return (folder / ENV_FILE).read_text()
    except FileNotFoundError:
        return None


def running(folder: Path, timeout: float = 1.0) -> str | None:
    """The storage address of a local cloud whose exports are in ``folder`` and which still answers
    there (another `respawn local up`), or None: no file, or what a stopped one left behind."""
    import urllib.error
    import urllib.request

    url = buckets.exported(folder / ENV_FILE, "STORAGE_EMULATOR_HOST")
    if url is None:
        return None
    if not url.startswith("http://127.0.0.1:"):
        return None  # only a local cloud's own address is asked
    try:
        with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=timeout):
            return url
    except urllib.error.HTTPError:
        return url  # it answered
    except (OSError, ValueError):
        return None


def remove_env(folder: Path, written: str | None = None) -> None:
    """Remove the exports; given ``written`` (what this local cloud wrote), only while the file
    still says that: a second local cloud started in the same folder since wrote its own, which stay."""
    if written is not None and read_env(folder) != written:
        return
    (folder / ENV_FILE).unlink(missing_ok=True)


def action_line(line: str, source: str) -> str | None:
    """``HH:MM:SS source what`` for an executor log line; None for any other line."""
    found = _ACTION.match(line.rstrip("\n"))
    if found is None:
        return None
    return f"{found['time']} {source:<6} {found['what']}"


class Actions(Loop):
    """Follows ``function-tick.log`` and ``function-on_object.log`` in ``folder`` (where the local
    cloud's functions write) from their current end, and hands each action line to ``emit``."""

    SOURCES = {"function-tick.log": "tick", "function-on_object.log": "event"}

    def __init__(self, folder: Path, emit: Callable[[str], None], interval: float = 0.5) -> None:
        super().__init__("respawn-local-actions", interval)
        self.folder = folder
        self.emit = emit
        self._offsets = {name: self._size(name) for name in self.SOURCES}  # from now on, not old runs'

    def stop(self) -> None:
        super().stop()
        self.poll()  # what was written before the functions stopped

    def once(self) -> None:
        self.poll()

    def poll(self) -> None:
        for name, source in self.SOURCES.items():
            path = self.folder / name
            try:
                with path.open("rb") as f:
                    f.seek(self._offsets[name])
                    data = f.read()
            except FileNotFoundError:
                continue
            whole = data[: data.rfind(b"\n") + 1]  # a line still being written waits for its end
            self._offsets[name] += len(whole)
            for raw in whole.decode("utf-8", "replace").splitlines():
                if (line := action_line(raw, source)) is not None:
                    self.emit(line)

    def _size(self, name: str) -> int:
        try:
            return (self.folder / name).stat().st_size
        except FileNotFoundError:
            return 0
