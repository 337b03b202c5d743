"""What the respawn VM agent tells the trainer, read from the environment in one place.

The agent (``deploy/vm/startup.sh``) exports, for the trainer's process only:
``RESUME_FROM`` (the gs:// URI of the checkpoint respawn chose, empty on a fresh start),
``RESUME_STEP`` and ``RESUME_TAG`` (its step and the framework's tag, when known),
``RESPAWN_CHECKPOINT_URI`` (the job's ``checkpoint.uri``: where saves go),
``RESPAWN_CHECKPOINT_EVERY_S`` (respawn's advised interval between saves, empty until
measured), ``RESPAWN_JOB``, ``RESPAWN_ATTEMPT`` and ``NODE_RANK``/``NODES``.

The kit adds those it reads when they are there:
``RESPAWN_PROGRESS_FILE`` (where to keep the progress file, see ``respawnkit.progress``);
``RESPAWN_NOTICE_FILE`` (where the agent writes a preemption notice),
``RESPAWN_NOTICE_SECONDS`` (the time from the first warning to the hard-off: 30 s for Spot,
150 s with its 120 s preemption notice) and ``RESPAWN_NOTICE_DEADLINE`` (epoch seconds of a
hard-off known at launch, e.g. a ``maxRunDuration``), see ``respawnkit.notice``.
"""

from __future__ import annotations

import math
import os
import re

_STEP_IN_NAME = re.compile(r"step[=_-]?([0-9]{1,18})", re.IGNORECASE)
_NUMBER = re.compile(r"[0-9]{1,18}")


def text(name: str) -> str | None:
    """The variable's value, None when unset or blank."""
    value = os.environ.get(name, "").strip()
    return value or None


def number(name: str) -> float | None:
    """A positive finite number of the variable, None when unset or not one (advice is never fatal)."""
    raw = text(name)
    try:
        value = float(raw) if raw is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) and value > 0 else None


def integer(name: str) -> int | None:
    raw = text(name)
    return int(raw) if raw is not None and raw.isascii() and raw.isdigit() else None


def checkpoint_uri() -> str | None:
    return text("RESPAWN_CHECKPOINT_URI")


def rank() -> int:
    return integer("NODE_RANK") or 0


def step_in_name(name: str) -> int | None:
    """The step a checkpoint's name carries, as respawn reads it: after ``step`` where it says so, else
    its last number (``step-000120`` and ``checkpoint-120`` are both 120)."""
    leaf = name.rstrip("/").rsplit("/", 1)[-1]
    numbers = _STEP_IN_NAME.findall(leaf) or _NUMBER.findall(leaf)
    return int(numbers[-1]) if numbers else None
