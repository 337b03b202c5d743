"""The preemption notice: SIGTERM, and how long the trainer has after it.

The VM agent's shutdown script SIGTERMs the trainer's process group when the VM is being
preempted or stopped, then writes the preemption marker once the trainer has exited or at
its own deadline, the notice less a quarter of it (at most 5 s): 25 s into Spot's 30 s.
A save must land before that marker to be the one respawn resumes from, so that is the
deadline here too: the moment SIGTERM arrived, plus ``RESPAWN_NOTICE_SECONDS`` (default
30, the name the shutdown script reads), less the same margin. ``RESPAWN_NOTICE_DEADLINE``
(epoch seconds, a hard-off known at launch) caps it when set. The agent passes neither to
the trainer today; the default is Spot's notice.

One notice per process (signal handlers are): ``shared()`` installs the handler once, on
the main thread, and chains to a Python handler that was there before (Lightning's, a
user's); a default handler is not called, since it would end the process before the save.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

from respawnkit import env
from respawnkit.log import say

DEFAULT_NOTICE_S = 30.0
MAX_MARGIN_S = 5.0


def margin(notice_s: float) -> float:
    """The shutdown script's: a quarter of the notice, at most 5 s."""
    return min(notice_s / 4, MAX_MARGIN_S)


class Notice:
    def __init__(self) -> None:
        self.received_at: float | None = None  # epoch seconds
        self.deadline: float | None = None  # epoch seconds by which a save must have landed
        self._listeners: list[Callable[[], None]] = []
        self._previous: object = None

    @property
    def requested(self) -> bool:
        return self.received_at is not None

    def left(self, now: float | None = None) -> float | None:
        """Seconds until the deadline, None when no notice came."""
        if self.deadline is None:
            return None
        return self.deadline - (time.time() if now is None else now)

    def trigger(self, now: float | None = None) -> None:
        """What SIGTERM does (tests and frameworks may call it too): the first notice counts."""
        if self.received_at is not None:
            return
        self.received_at = time.time() if now is None else now
        notice_s = env.number("RESPAWN_NOTICE_SECONDS") or DEFAULT_NOTICE_S
        hard_off = self.received_at + notice_s
        if (launch := env.number("RESPAWN_NOTICE_DEADLINE")) is not None:
            hard_off = min(hard_off, launch)
        self.deadline = hard_off - margin(notice_s)
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
