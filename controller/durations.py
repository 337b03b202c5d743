"""Human durations in specs and settings: ``90s``, ``30m``, ``72h``, ``7d``, ``1h30m``."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer

_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: Any) -> timedelta:
    """Parse a duration; a bare number means seconds."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError("expected a duration like '90m', '72h' or '7d', got a boolean")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return timedelta(seconds=value)
    if not isinstance(value, str):
        raise ValueError(f"expected a duration like '90m', '72h' or '7d', got {value!r}")
    text = value.strip().lower().replace(" ", "")
    if text.isdigit():
        return timedelta(seconds=int(text))
    parts = _PART.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{value!r} is not a duration; use e.g. '90s', '30m', '72h', '7d' or '1h30m'")
    return timedelta(seconds=sum(float(n) * _UNIT[u] for n, u in parts))


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
