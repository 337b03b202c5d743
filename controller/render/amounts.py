"""Counts and sums of money in words, one rule each for every command and the demo.

``counted(1, "zone")`` is "1 zone", never "1 zones". ``dollars`` writes the figures of one line
with one precision: cents when the smallest is at least a cent, else enough decimals for two
significant digits of the smallest (a demo's run costs fractions of a cent), so that
"$0.0036 against $0.0116 on demand: $0.0080 saved" is never "$0.0036 against $0.01: $0.008".
"""

from __future__ import annotations

import math

MAX_DECIMALS = 6  # below a millionth of a dollar, a figure is shown as $0.000000


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun in the right number: 1 zone, 2 zones, 0 zones (``plural`` if not noun + s)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def dollars(*amounts: float) -> tuple[str, ...]:
    """Each amount as $1,234.56, all with the precision the smallest non-zero one needs."""
    places = decimals(*amounts)
    return tuple(f"{'-' if a < 0 else ''}${abs(a):,.{places}f}" for a in amounts)


def decimals(*amounts: float) -> int:
    """2 (cents), or more for a non-zero amount under a cent: two significant digits of the smallest."""
    smallest = min((abs(a) for a in amounts if a and math.isfinite(a)), default=1.0)
    if smallest >= 0.01:
        return 2
    return min(MAX_DECIMALS, 1 - math.floor(math.log10(smallest)))
