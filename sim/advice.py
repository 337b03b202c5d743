"""Capacity advice as Google gives it, for the sim's headline (``--advice as-google-gives``).

The in-memory fake (``controller.adapters.memory.MemoryAdvisor``) answers from the fake
Compute's live state: obtainability exactly 0 where a zone is stocked out *now*, and whatever
uptime a test set. Fed each zone's true mean lifetime, it is an oracle no controller has.
Google documents its scores as estimates (``advice.capacity``: "the likelihood of
successfully obtaining" the VMs, 0.0 to 1.0, from "real-time availability and the success
rate of recent creation requests"; ``estimatedUptime``: "the estimated run time of the
majority of Spot VMs ... best-effort only"; ``capacityHistory``'s ``preemptionRate``: of the
Spot VMs that stopped running, the fraction 0 to 1 that were preempted). This advisor answers
the same port (``CapacityAdvisor.advise``) with:

- ``obtainability``: the zone's capacity ``advice_obtainability_lag_s`` ago (a score built
  from recent requests trails the zone), 0.9 where it had capacity and 0.1 where it was out,
  plus normal noise (``advice_obtainability_sd``), clipped to 0..1 and rounded to 0.1 (Google
  describes the score in tenths: high 0.7-1.0, medium 0.4-0.6, low 0.0-0.3). The noise is
  redrawn per zone every simulated minute;
- ``uptime_s`` (``estimatedUptime``): the zone's true *median* lifetime (the "majority"), times
  a lognormal factor ``exp(N(0, advice_uptime_sigma))`` redrawn per zone every
  ``advice_uptime_refresh_h``. No mean lifetime, no distribution: the only lifetime figure a
  controller gets;
- ``preemption_rate``: a fraction drawn per zone and day in ``advice_rate_range``, unrelated to
  how long the zone's VMs live (what Google's figure is: how Spot VMs ended, not how soon).

Every draw is a function of (seed, zone, time bucket): the same answers for every policy on
a trace, whenever it asks. The sim's own choices (the lag, the 0.9/0.1 levels, the noise, the
refresh periods) are parameters; none is a Google figure.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from controller.core import errors
from controller.core.ports import Shape, ZoneAdvice

if TYPE_CHECKING:
    from sim.model import Trace

OBTAINABLE, OUT = 0.9, 0.1  # the score's level where the zone had capacity / was out, before noise


class GoogleLikeAdvisor:
    """``CapacityAdvisor`` over a trace, noisy and lagging as above; ``now`` gives simulated seconds."""

    def __init__(self, trace: Trace, now: Callable[[], float]) -> None:
        self.trace = trace
        self.p = trace.params
        self.now = now
        self.regions = {z.rsplit("-", 1)[0] for z in trace.zones}
        self.calls: list[Shape] = []

    def _rng(self, what: str, zone: str, bucket: int) -> random.Random:
        return random.Random(f"advice-{self.p.seed}-{what}-{zone}-{bucket}")

    def obtainability(self, zone: str, t: float) -> float:
        z = self.trace.zones[zone]
        level = OUT if z.out_at(max(0.0, t - self.p.advice_obtainability_lag_s)) else OBTAINABLE
        noisy = level + self._rng("obt", zone, int(t // 60)).gauss(0.0, self.p.advice_obtainability_sd)
        return round(min(1.0, max(0.0, noisy)), 1)

    def uptime(self, zone: str, t: float) -> float:
        z = self.trace.zones[zone]
        bucket = int(t // (self.p.advice_uptime_refresh_h * 3600)) if self.p.advice_uptime_refresh_h > 0 else 0
        factor = math.exp(self._rng("uptime", zone, bucket).gauss(0.0, self.p.advice_uptime_sigma))
        return z.lifetime_median_s * factor

    def rate(self, zone: str, t: float) -> float:
        return self._rng("rate", zone, int(t // 86400)).uniform(*self.p.advice_rate_range)

    def advise(self, shape: Shape) -> dict[str, ZoneAdvice]:
        self.calls.append(shape)
        if shape.region not in self.regions:
            raise errors.RequestError(f"400 Invalid value for field 'region': '{shape.region}'. Unknown region.")
        t = self.now()
        spot = shape.model == "SPOT"
        return {zone: ZoneAdvice(obtainability=self.obtainability(zone, t),
                                 uptime_s=self.uptime(zone, t) if spot else None,
                                 preemption_rate=self.rate(zone, t) if spot else None)
                for zone in shape.zones if zone in self.trace.zones}
