"""One line on stderr per thing the kit decides, prefixed ``respawn:`` like the VM agent's lines."""

from __future__ import annotations

import sys


def say(message: str) -> None:
    try:
        print(f"respawn: {message}", file=sys.stderr, flush=True)
    except (RuntimeError, OSError):  # a signal handler interrupting a write to stderr: the line is lost, not the run
        pass
