"""Capacity advice, asked once per shape and kept a few minutes.

A thousand jobs of one shape in one region cost one question, not a thousand: the answer
is kept for ``ttl`` seconds (a function instance keeps it between passes), and threads
asking for the same shape at once wait for the first one's answer. A failure is kept
for a shorter ``retry`` so that an API that is down is not asked by every job of a pass;
each failure is logged once, and the caller falls back to the spec's order.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from cachetools import TTLCache

from controller.core import errors, placement
from controller.core.ports import CapacityAdvisor, Shape, ZoneAdvice

log = logging.getLogger(__name__)
ADVICE_TTL = placement.ADVICE_MAX_AGE.total_seconds()  # placement sets aside what a stockout since contradicts
FAILURE_TTL = 60.0
_SHAPES = 1024


class AdviceCache:
    def __init__(self, advisor: CapacityAdvisor | None, ttl: float = ADVICE_TTL, retry: float = FAILURE_TTL,
                 timer: Callable[[], float] = time.monotonic) -> None:
        self.advisor = advisor
        self._answers: TTLCache[Shape, dict[str, ZoneAdvice]] = TTLCache(_SHAPES, ttl, timer=timer)
        self._failures: TTLCache[Shape, str] = TTLCache(_SHAPES, retry, timer=timer)
        self._lock = threading.Lock()
        self._asking: dict[Shape, threading.Lock] = {}

    def advise(self, shapes: list[Shape]) -> dict[str, ZoneAdvice]:
        """Advice for every zone of every shape; ``AdviceUnavailable`` when any shape has none
        (ranking some regions' zones and not others would be a guess)."""
        merged: dict[str, ZoneAdvice] = {}
        for shape in shapes:
            merged.update(self._one(shape))
        return merged

    def _one(self, shape: Shape) -> dict[str, ZoneAdvice]:
        if self.advisor is None:
            raise AdviceUnavailable("no capacity advisor configured")
        with self._lock:
            asking = self._asking.setdefault(shape, threading.Lock())
        with asking:  # one question per shape at a time; the others read its answer
            with self._lock:
                if (hit := self._answers.get(shape)) is not None:
                    return hit
                if (why := self._failures.get(shape)) is not None:
                    raise AdviceUnavailable(why)
            try:
                answer = {zone: _sane(a) for zone, a in self.advisor.advise(shape).items() if zone in shape.zones}
            except Exception as e:  # noqa: BLE001 - a malformed answer, a credentials error, a bug: never block a launch
                why = f"{type(e).__name__}: {e}"[:300]
                log.warning("capacity advice unavailable; zones in the spec's order",
                            extra={"json_fields": {"region": shape.region, "machine_type": shape.machine_type,
                                                   "error": why}})
                with self._lock:
                    self._failures[shape] = why
                    self._asking.pop(shape, None)
                raise AdviceUnavailable(why) from e
            with self._lock:
                self._answers[shape] = answer
                self._asking.pop(shape, None)
            return answer


def _sane(advice: ZoneAdvice) -> ZoneAdvice:
    """Scores as Google defines them, else unknown: an obtainability and a preemption rate
    (a share of the Spot VMs that stopped) in [0, 1], a finite uptime and Spot price of at
    least 0. NaN, infinities, negatives and shares above 1 rank (and price) nothing."""
    def ok(value: float | None, top: float = math.inf) -> float | None:
        if value is None:
            return None
        try:
            number = float(value)
        except (TypeError, ValueError):
            return None
        return number if math.isfinite(number) and 0.0 <= number <= top else None
    return ZoneAdvice(ok(advice.obtainability, 1.0), ok(advice.uptime_s), ok(advice.preemption_rate, 1.0),
                      ok(advice.spot_price_h))


class AdviceUnavailable(errors.RespawnError):
    """No advice for a shape: the zones keep the spec's order."""
