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


class Terminal:
    """A command in a terminal of its own (``respawn local up``): started in its own session, read
    all along by a thread (``lines``), ready once it prints ``ready`` (its "Ctrl-C to stop" line)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Any, ready: str = "Ctrl-C",
                 wait: float = 120) -> None:
        import threading

        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                        cwd=cwd, stdin=subprocess.DEVNULL, start_new_session=True)
        self.lines: list[str] = []
        seen = threading.Event()

        def read() -> None:
            for line in self.process.stdout:  # type: ignore[union-attr]
                self.lines.append(line)
                if ready in line:
                    seen.set()
            seen.set()

        threading.Thread(target=read, daemon=True).start()
        if not seen.wait(wait) or self.process.poll() is not None:
            stop_gently(self.process)
            raise AssertionError(f"{' '.join(argv)} ended: " + "".join(self.lines)[-3000:])

    def exports(self) -> dict[str, str]:
        """The variables of the file its ``source FILE`` line names, as a second terminal gets them."""
        import shlex
        from pathlib import Path

        [source] = [line.split(maxsplit=1)[1].strip() for line in self.lines if line.startswith("source ")]
        exports = [line for line in Path(source).read_text().splitlines() if line.startswith("export ")]
        return {key: shlex.split(value)[0] for key, value in
                (line.removeprefix("export ").split("=", 1) for line in exports)}

    def stop(self, timeout: float = 60) -> int:
        """Ctrl-C, as a person would: its exit status."""
        import signal

        self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=timeout)

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *_: object) -> None:
        stop_gently(self.process)  # nothing left running, whatever happened
