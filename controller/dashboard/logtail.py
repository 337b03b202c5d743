"""A job's recent log lines, for its page, read seldom.

The reader is given (``recent(job) -> list[str]``: the last lines of the job's current run as
``respawn logs`` prints them; the CLI builds it over Cloud Logging, the dashboard imports no CLI).
This module only bounds how often it is called. Cloud Logging allows a project 60
``entries.list`` a minute: a job's lines are read only when its page asks for them (``GET
/api/jobs/JOB/logs``), at most once per ``EVERY`` seconds per job however many pages poll, and
one read at a time per job (a page that asks meanwhile waits for that read and shares it), and
at most ``PER_MINUTE`` reads a minute in all jobs together (past it, a page gets the lines last
read, or a note, and its next poll tries again). A read
that fails (the quota's 429, a 403, no Logging endpoint, anything at all) is a one-line note in
place of the lines, kept as long as lines are: the page never gets a 500, and a refused read is
not tried again at each poll.
"""

from __future__ import annotations

import threading
from collections import deque
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from controller.core import errors
from controller.render.text import printable

EVERY = 30.0  # seconds a job's lines (or the note of a failed read) are kept before the next read
LINES = 40  # the last lines shown
PER_MINUTE = 20  # reads a minute, all jobs together: a third of Logging's quota, the rest for respawn logs
NOTE_CHARS = 300  # a note is one line, at most this long

Recent = Callable[[str], list[str]]


@dataclass(frozen=True)
class Tail:
    """What one read gave: the lines (oldest first), or the note saying why there are none."""

    lines: tuple[str, ...] = ()
    note: str | None = None
    read_at: datetime | None = None


@dataclass
class _Kept:
    lock: threading.Lock = field(default_factory=threading.Lock)  # held while the job's one read is under way
    tail: Tail | None = None
    at: float = float("-inf")


class Tails:
    """Each job's last lines, read through ``recent`` at most once per ``every`` seconds (module docstring)."""

    def __init__(self, recent: Recent | None, every: float = EVERY, lines: int = LINES,
                 per_minute: int = PER_MINUTE, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.recent, self.every, self.lines, self.clock, self.wall = recent, every, lines, clock, wall
        self.per_minute = per_minute
        self._lock = threading.Lock()
        self._kept: dict[str, _Kept] = {}
        self._reads: deque[float] = deque()  # when the reads of the last minute began

    def cached(self, job: str) -> Tail | None:
        """The job's last read, whatever its age; None when none was made. Never reads."""
        with self._lock:
            kept = self._kept.get(job)
        return kept.tail if kept else None

    def get(self, job: str) -> Tail:
        """The job's lines as last read, read again first when that was ``every`` seconds ago or more."""
        with self._lock:
            kept = self._kept.setdefault(job, _Kept())
        with kept.lock:  # one read in flight per job: the others wait for it and share it
            if kept.tail is None or self.clock() - kept.at >= self.every:
                if not self._may_read():
                    if kept.tail is None:
                        kept.tail = Tail(note=f"logs not read yet: the dashboard reads at most {self.per_minute} "
                                              "a minute in all; the next poll tries again", read_at=self.wall())
                    return kept.tail  # its ``at`` unchanged: the next poll tries again
                kept.tail = self._read(job)
                kept.at = self.clock()
            return kept.tail

    def _may_read(self) -> bool:
        """Whether one more read fits in the last minute's ``per_minute`` (counted when it does)."""
        with self._lock:
            now = self.clock()
            while self._reads and now - self._reads[0] >= 60.0:
                self._reads.popleft()
            if len(self._reads) >= self.per_minute:
                return False
            self._reads.append(now)
            return True

    def forget(self, keep: set[str]) -> None:
        """Drop what was kept of jobs no longer in the bucket."""
        with self._lock:
            self._kept = {job: kept for job, kept in self._kept.items() if job in keep}

    def _read(self, job: str) -> Tail:
        if self.recent is None:
            return Tail(note="this dashboard reads no logs: run the command below", read_at=self.wall())
        try:
            found = self.recent(job)
        except Exception as e:  # noqa: BLE001 - a quota, a permission, no endpoint, a bug: a note, never a 500
            return Tail(note=note(e), read_at=self.wall())
        lines = [printable(part, keep="\t") for line in found for part in str(line).split("\n")]
        return Tail(tuple(lines[-self.lines:]), read_at=self.wall())


def note(error: BaseException) -> str:
    """The one line a failed read shows: why, in the error's own words, made printable."""
    said = str(error).strip()
    what = said.splitlines()[0] if said else ""
    if not isinstance(error, errors.RespawnError):
        what = f"{type(error).__name__}: {what}" if what else type(error).__name__
    text = printable(f"logs not read: {what or type(error).__name__}")
    return text if len(text) <= NOTE_CHARS else text[: NOTE_CHARS - 1] + "…"
