"""The progress file: how far training is, for the VM agent to fold into its heartbeat.

When ``RESPAWN_PROGRESS_FILE`` is set, the kit keeps at that path one JSON object::

    {"step": 120, "step_at": "2026-11-27T19:20:01.123Z", "save_s": 0.41, "upload_s": 5.8, "saved_step": 100}

``step``: the last finished training step; ``step_at``: when it finished (RFC 3339, UTC);
``save_s``/``upload_s``: how long the last save took to write locally and to upload (null
until one did); ``saved_step``: the step of the newest save whose upload completed (null
until one did). The file is replaced whole (a temporary file, then ``os.replace``), so a
reader never sees half of one. Step updates are written at most once a second; saves and
uploads are written at once. Only the global rank zero of a distributed run writes it (every rank
of a node shares the path): see ``respawnkit.dist.global_rank``.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from datetime import datetime, timezone
from typing import Any

from respawnkit import dist, env
from respawnkit.log import say

MIN_INTERVAL_S = 1.0


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Progress:
    def __init__(self, path: str | None = None) -> None:
        self.path = path if path is not None else env.text("RESPAWN_PROGRESS_FILE")
        self.state: dict[str, Any] = {"step": None, "step_at": None, "save_s": None, "upload_s": None,
                                      "saved_step": None}
        self._written = 0.0
        self._lock = threading.Lock()

    def step(self, step: int) -> None:
        with self._lock:
            self.state.update(step=int(step), step_at=rfc3339(time.time()))
            if time.monotonic() - self._written >= MIN_INTERVAL_S:
                self._write()

    def update(self, **fields: Any) -> None:
        """Save and upload figures: written at once."""
        with self._lock:
            self.state.update(fields)
            self._write()

    def _write(self) -> None:
        if not self.path or self.state["step"] is None and self.state["saved_step"] is None:
            return
        if dist.global_rank() != 0:  # one writer: the rank whose saves are uploaded
            return
        self._written = time.monotonic()
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            fd, temporary = tempfile.mkstemp(prefix=".progress-", dir=folder)
            with os.fdopen(fd, "w") as out:
                json.dump(self.state, out)
            os.replace(temporary, self.path)
        except OSError as e:  # progress is a report: never what stops training
            say(f"could not write the progress file {self.path}: {e}")
