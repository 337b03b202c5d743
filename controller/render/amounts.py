"""Counts, figures and sums of money in words, one rule each for every command, the dashboard and the demo.

``counted(1, "zone")`` is "1 zone", never "1 zones". ``figures`` writes figures (accelerator-hours,
say) with ``places`` decimals, or more where one needs them for two significant digits, so that
a small figure never rounds to nothing ("0.026 accelerator-hours", never "0.0" beside
/metrics' 0.0255; "0.0012 of 0.004 useful", never "0.00 of 0.00"). ``dollars`` writes the
sums of one line with one precision, cents unless one is under a cent: "$0.0036 against $0.0116
on demand: $0.0080 saved" is never "$0.0036 against $0.01: $0.008"; a sum alone keeps only its significant digits ("$0.00003 spent", never
"$0.000030"). Below a millionth, a figure reads "< 0.000001" rather than a row of zeros.
"""

from __future__ import annotations

import math

MAX_DECIMALS = 6  # below a millionth, a figure is shown as "< 0.000001"
TINY = 10.0 ** -MAX_DECIMALS


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun in the right number: 1 zone, 2 zones, 0 zones (``plural`` if not noun + s)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def figures(*values: float, places: int = 2) -> tuple[str, ...]:
    """Each value as 1,234.56 (``places`` decimals), or with more where it needs them for two
    significant digits: 0.026, 0.0012 (each on its own: "1.03 paid: 0.033 booting, 0.00 redone")."""
    return tuple(_written(v, "", _significant(v, places), True, places) for v in values)


def _significant(value: float, places: int) -> int:
    if not value or not math.isfinite(value):
        return places
    return max(places, min(MAX_DECIMALS, 1 - math.floor(math.log10(abs(value)))))


def figure(value: float, places: int = 2) -> str:
    """One value as ``figures`` writes it alone: 0.026, 1.5, 0."""
    return figures(value, places=places)[0]


def dollars(*amounts: float) -> tuple[str, ...]:
    """Each amount as $1,234.56, all with the precision the smallest non-zero one needs."""
    places = decimals(*amounts)
    return tuple(_written(a, "$", places, len(amounts) == 1, 2) for a in amounts)


def decimals(*amounts: float) -> int:
    """2 (cents), or more for a non-zero amount under a cent: two significant digits of the smallest."""
    smallest = min((abs(a) for a in amounts if a and math.isfinite(a)), default=1.0)
    if smallest >= 0.01:
        return 2
    return min(MAX_DECIMALS, 1 - math.floor(math.log10(smallest)))


def _written(value: float, unit: str, places: int, alone: bool, least: int) -> str:
    sign = "-" if value < 0 else ""
    if value and math.isfinite(value) and abs(value) < TINY:
        return f"{sign}< {unit}{TINY:.{MAX_DECIMALS}f}"
    text = f"{abs(value):,.{places}f}"
    if alone and places > least:  # the figure alone: no zero that only a column of figures would need
        text = text.rstrip("0")
        whole, _, part = text.partition(".")
        text = f"{whole}.{part.ljust(least, '0')}"
    return f"{sign}{unit}{text}"
