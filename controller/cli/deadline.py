"""Every interactive command ends within a bound: ``--timeout`` seconds (RESPAWN_TIMEOUT, 30 by default).

The Google clients retry a 5xx or a 429 for minutes (google-cloud-storage for 120 s, Compute's
``RETRY`` for 60 s), right for a Cloud Function, whose next pass comes anyway, wrong at a terminal:
``respawn status`` against an endpoint that answered 503 sat silent for two minutes. Only the CLI
starts this bound (the functions keep their retries): at the bound, SIGALRM raises ``Expired`` in
the main thread, wherever it waits (a retry's sleep, a read), and ``failfast`` sends no request any
more from any thread. ``Expired`` is a BaseException, as KeyboardInterrupt is, so that no
``except Exception`` on its way takes it for one failed row. Should the command still be running
``GRACE`` seconds later (a pool joining a thread that sleeps between retries), the process says the
line and exits there and then.

Waiting on the user (a question) is no waiting on the cloud: ``paused`` stops the clock for it. An
upload takes what its size takes: ``widened`` gives it that much more (``submit``'s code, at
``UPLOAD_BYTES_S``, a slow uplink).
Commands that run until stopped (``demo``, ``local up``, ``status --watch``, ``logs --follow``) or
bound each step themselves (``deploy``, ``doctor``) call ``stop()``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from controller.adapters import failfast

DEFAULT = 30.0  # seconds
GRACE = 3.0  # seconds between Expired raised and the process ended regardless
UNAVAILABLE = 3  # the CLI's exit code: the same command may work later
LONGEST = 7 * 24 * 3600.0  # a bound longer than a week is none
UPLOAD_BYTES_S = 128 * 1024  # 1 Mbit/s: the slowest uplink an upload's bound allows for

T = TypeVar("T")
given = DEFAULT  # the command's --timeout (begin()), which status --watch gives each refresh
_bound: float = 0.0
_expired = False
_before: tuple[Any, float, float] | None = None  # SIGALRM's handler and timer before start(), and when


class Expired(BaseException):
    """The command's time is up; ``str()``: one line naming the endpoint and what to do."""


def begin(seconds: float) -> None:
    """The command's bound: ``seconds`` from now, and ``given`` for the steps that bound themselves.
    ``inf``, or more than ``LONGEST`` (which no interval timer takes): no bound, as 0 is."""
    global given
    if not seconds <= LONGEST:
        seconds = 0.0
    given = seconds
    start(seconds)


def start(seconds: float) -> None:
    """Bound the command to ``seconds`` from now (0: no bound). Main thread only (a signal)."""
    global _bound, _expired, _before
    _bound, _expired = seconds, False
    if seconds > 0:
        if _before is None:  # whoever had SIGALRM before (pytest-timeout) gets it back at stop()
            _before = (signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)[0], time.monotonic())
        signal.signal(signal.SIGALRM, _ring)
        _arm(seconds)


def stop() -> None:
    """No bound any more (a command that runs until stopped, or bounds its own steps)."""
    global _bound, _expired, _before
    _bound, _expired = 0.0, False
    _arm(0)
    if _before is not None:
        handler, left, since = _before
        _before = None
        signal.signal(signal.SIGALRM, handler)
        if left:
            signal.setitimer(signal.ITIMER_REAL, max(left - (time.monotonic() - since), 0.001))


def paused(ask: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``ask(*args, **kwargs)`` with the clock stopped; then a whole bound again for what follows."""
    bound = _bound
    stop()
    try:
        return ask(*args, **kwargs)
    finally:
        if bound:
            start(bound)


def widened(extra: float, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``work(*args, **kwargs)`` bounded by ``extra`` seconds more than the command's bound (an
    upload, whose time is its size's, not the cloud's answer); then a whole bound again."""
    bound = _bound
    if not bound:
        return work(*args, **kwargs)
    stop()
    start(bound + extra)
    try:
        return work(*args, **kwargs)
    finally:
        stop()
        start(bound)


def message(seconds: float) -> str:
    """One line: how long, where and what it last answered, and what to do."""
    endpoint, variable, answer = failfast.last()
    if not endpoint:
        where = "nothing was answered"
    else:
        named = f" ({variable})" if variable else ""
        where = f"{endpoint}{named} last answered {answer}" if answer else f"{endpoint}{named} did not answer"
    return (f"gave up after {seconds:g} s: {where}; try again later, or allow longer with --timeout "
            "(RESPAWN_TIMEOUT)")


def _arm(seconds: float) -> None:
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.0))
    failfast.stop_at(time.monotonic() + seconds if seconds > 0 else None)


def _ring(signum: int, frame: Any) -> None:
    global _expired
    if _expired:  # Expired was raised GRACE seconds ago and the command is still running: end it here
        sys.stderr.write(f"✗ {message(_bound)}\n")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(UNAVAILABLE)
    _expired = True
    signal.setitimer(signal.ITIMER_REAL, GRACE)
    raise Expired(message(_bound))
