"""Human durations in specs and settings: ``90s``, ``30m``, ``72h``, ``7d``, ``1h30m``.

Bounded on purpose: a duration comes from a user's file, and ``99999999999999d``,
``1e300``, ``.inf`` or ``nan`` must be a readable validation error naming the field,
never an OverflowError out of ``timedelta`` (which tops out near 2.7 million years).
Every error raised here is a ValueError, which pydantic turns into a field error.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, PlainSerializer

MAX_DAYS = 3650
MAX_SECONDS = MAX_DAYS * 86400
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_HINT = "use e.g. '90s', '30m', '72h', '7d' or '1h30m'"


def parse_duration(value: Any) -> timedelta:
    """Parse a duration between 0 and ``MAX_DAYS`` days; a bare number means seconds."""
    if isinstance(value, timedelta):
        return _bounded(value.total_seconds())
    if isinstance(value, bool):
        raise ValueError(f"expected a duration, not a boolean; {_HINT}")
    if isinstance(value, int):
        return _bounded(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"a duration must be finite; {_HINT}")
        return _bounded(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a duration, not {type(value).__name__}; {_HINT}")
    text = value.strip().lower().replace(" ", "")
    if len(text) > 64:
        raise ValueError(f"not a duration (too long to be one); {_HINT}")
    if text.startswith("-"):
        raise ValueError(f"a duration cannot be negative; {_HINT}")
    if re.fullmatch(r"[0-9]+(\.[0-9]+)?", text):
        return _bounded(float(text))
    parts = _PART.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration; {_HINT}")
    return _bounded(sum(float(n) * _UNIT[u] for n, u in parts))


def _bounded(seconds: float | int) -> timedelta:
    # Compare before converting: float(10**400) and timedelta(seconds=1e20) both raise OverflowError.
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative; {_HINT}")
    if seconds > MAX_SECONDS:
        raise ValueError(f"too long: durations are at most {MAX_DAYS}d")
    return timedelta(seconds=float(seconds))


def format_duration(value: timedelta) -> str:
    """The shortest exact spelling: 5400 s -> '1h30m'."""
    seconds = int(value.total_seconds())
    if seconds == 0:
        return "0s"
    out = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            out.append(f"{count}{unit}")
    return "".join(out)


Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
]


def _utc(value: datetime) -> datetime:
    """A time without a zone (a status written by hand, or by an older tool) read as UTC: respawn
    writes every time in UTC, and a naive one would fail every comparison with the rest."""
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


# A moment in a status or a ledger: always aware (naive read as UTC).
Instant = Annotated[datetime, AfterValidator(_utc)]


def measured(seconds: float) -> bool:
    """Whether ``seconds`` is a duration a job's clock could have measured (finite, 0 to
    MAX_SECONDS): else a hand-written value."""
    return math.isfinite(seconds) and 0 <= seconds < MAX_SECONDS
