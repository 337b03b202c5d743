"""Polling for things that happen in other processes (VMs, functions, servers)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any


def until(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """The first truthy result of ``check``; fails the test naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def stop_gently(process: subprocess.Popen[str], timeout: float = 30) -> None:
    """End a ``respawn local up`` a test started, whatever state the test left it in: Ctrl-C
    first (it stops its servers, functions and VMs), then its whole process group by force
    (start it with ``start_new_session=True``), so no child is left running after the test."""
    import os
    import signal

    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait(timeout=timeout)
