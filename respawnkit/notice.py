"""The preemption notice: the notice file, SIGTERM, and how long the trainer has after them.

Two warnings reach the trainer, and they mean different things:

- The notice file (``RESPAWN_NOTICE_FILE``): the VM agent writes it, whole, the moment it learns
  that the VM will be lost (Compute's preemption notice, up to 120 s before the soft-off, or a
  terminating host maintenance): ``{"at": <epoch s>, "hard_off": <epoch s>, "reason": ...}``.
  ``poll()`` looks at it (a stat; the file is read only when it changed), which the saver does
  at each step boundary. A notice is not a stop: the saver saves at the next step boundary and
  training goes on. The agent's shutdown script writes the file again at the soft-off, with the
  hard-off it knows then.
- SIGTERM: the shutdown script SIGTERMs the trainer's process group at the soft-off, then writes
  the preemption marker once the trainer has exited or at its own deadline, the time it has less
  a quarter of it (at most 5 s): 25 s into Spot's 30 s. SIGTERM asks for a final save when it
  fits, a flush, and a stop.

A save must land before that marker to be the one respawn resumes from, so the marker's deadline
is the deadline here too: the notice file's ``hard_off`` less the shutdown script's margin (a
quarter of the time from the notice to the hard-off, at most 5 s: never less than the script's
own). Without a file that says more (none, or one whose hard-off had passed when SIGTERM came:
a maintenance's notice reckoned too short), SIGTERM's arrival plus ``RESPAWN_NOTICE_SECONDS``
(default 30, the name the shutdown script reads; the agent adds the preemption notice to it when
there is one), less the same margin. ``RESPAWN_NOTICE_DEADLINE`` (epoch seconds, a hard-off known
at launch) caps either when set.

One notice per process (signal handlers are): ``shared()`` installs the handler once, on
the main thread, and chains to a Python handler that was there before (Lightning's, a
user's); a default handler is not called, since it would end the process before the save.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable

from respawnkit import env
from respawnkit.log import say

DEFAULT_NOTICE_S = 30.0
MAX_MARGIN_S = 5.0
MAX_FILE_BYTES = 4096


def margin(notice_s: float) -> float:
    """The shutdown script's: a quarter of the notice, at most 5 s."""
    return min(notice_s / 4, MAX_MARGIN_S)


class Notice:
    def __init__(self, path: str | None = None) -> None:
        self.received_at: float | None = None  # epoch seconds: SIGTERM
        self.path = path if path is not None else env.text("RESPAWN_NOTICE_FILE")
        self.warned_at: float | None = None  # epoch seconds: the notice file's "at"
        self.file_hard_off: float | None = None  # epoch seconds: the notice file's "hard_off"
        self.reason: str | None = None  # the notice file's
        self._seen: tuple[int, int, int] | None = None  # the file's (inode, mtime, size) when last read
        self._listeners: list[Callable[[], None]] = []
        self._previous: object = None

    @property
    def requested(self) -> bool:
        """SIGTERM came: save if it fits, flush, stop."""
        return self.received_at is not None

    @property
    def warned(self) -> bool:
        """The notice file came (as ``poll()`` last saw it): save at the next step boundary, train on."""
        return self.warned_at is not None

    @property
    def noticed(self) -> bool:
        """Either: the VM is on its way to a hard-off."""
        return self.warned or self.requested

    @property
    def hard_off(self) -> float | None:
        """Epoch seconds of the hard-off as the trainer knows it; None before any notice."""
        return self._reckon()[0]

    @property
    def deadline(self) -> float | None:
        """Epoch seconds by which a save must have landed (the marker's deadline); None before any notice."""
        hard_off, notice_s = self._reckon()
        return None if hard_off is None else hard_off - margin(notice_s)

    def _reckon(self) -> tuple[float | None, float]:
        """(the hard-off, the notice's length that the margin is a quarter of)."""
        hard_off, notice_s = None, DEFAULT_NOTICE_S
        received = self.received_at
        if self.file_hard_off is not None and self.warned_at is not None and (
                received is None or self.file_hard_off > received):
            hard_off, notice_s = self.file_hard_off, max(0.0, self.file_hard_off - self.warned_at)
        elif received is not None:
            notice_s = env.number("RESPAWN_NOTICE_SECONDS") or DEFAULT_NOTICE_S
            hard_off = received + notice_s
        if hard_off is not None and (launch := env.number("RESPAWN_NOTICE_DEADLINE")) is not None:
            hard_off = min(hard_off, launch)
        return hard_off, notice_s

    def left(self, now: float | None = None) -> float | None:
        """Seconds until the deadline, None when no notice came."""
        deadline = self.deadline
        if deadline is None:
            return None
        return deadline - (time.time() if now is None else now)

    def until_hard_off(self, now: float | None = None) -> float | None:
        """Seconds until the hard-off, None when no notice came."""
        hard_off = self.hard_off
        return None if hard_off is None else hard_off - (time.time() if now is None else now)

    def poll(self) -> bool:
        """Look at the notice file: a stat, and a read only when it changed since. True when a notice file came
        now, for the first time (a rewrite, the agent's at the soft-off, only updates the hard-off)."""
        if not self.path:
            return False
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            with open(self.path, "rb") as f:
                body = json.loads(f.read(MAX_FILE_BYTES))
            at, hard_off = float(body["at"]), float(body["hard_off"])
            reason = str(body.get("reason", ""))[:40]
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
            say(f"notice file {self.path} unreadable ({type(e).__name__}): ignored")
            return False
        if not (math.isfinite(at) and math.isfinite(hard_off) and hard_off >= at):
            say(f"notice file {self.path} makes no sense (at {at}, hard_off {hard_off}): ignored")
            return False
        first = self.warned_at is None
        if first:
            self.warned_at, self.reason = at, reason
        self.file_hard_off = hard_off
        if first:
            say(f"notice ({reason or 'unknown'}): saving at the next step boundary and training on; "
                f"{self.left():.1f} s until the marker deadline")
        return first

    def trigger(self, now: float | None = None) -> None:
        """What SIGTERM does (tests and frameworks may call it too): the first notice counts."""
        if self.received_at is not None:
            return
        self.received_at = time.time() if now is None else now
        self.poll()
        say(f"SIGTERM: saving at the next step boundary; {self.left():.1f} s until the marker deadline")
        for listener in list(self._listeners):
            listener()

    def on_trigger(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def install(self) -> bool:
        """The SIGTERM handler, once; False where it cannot be installed (not the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            say("not on the main thread: SIGTERM is not handled here (call respawnkit.notice.shared() from it)")
            return False
        if signal.getsignal(signal.SIGTERM) is self._handle:
            return True
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        return True

    def _handle(self, signum: int, frame: object) -> None:
        self.trigger()
        if callable(self._previous) and self._previous is not self._handle:
            self._previous(signum, frame)


_shared: Notice | None = None


def shared(install: bool = True) -> Notice:
    """The process's notice, its handler installed."""
    global _shared
    if _shared is None:
        _shared = Notice()
    if install:
        _shared.install()
    return _shared
