"""Which zone an attempt tries first: a pure function of the spec and Compute's advice.

``placement: ordered`` keeps the spec's order. ``placement: capacity`` (the default for
Spot) ranks the same zones by Compute's capacity advice: the more obtainable first, then
the longer Spot VMs are expected to run there (``estimatedUptime``), then, as a tie-break
only, the lower share of the Spot VMs that stopped there on the latest day which were
preempted (``preemptionRate``, a fraction 0..1: it says how Spot VMs ended, not how soon),
then the spec's order. A rate outside 0..1 (or not finite) ranks as unknown. Zones the advice did not score keep the spec's order after
the scored ones. Without advice (not asked, or the call failed) the order is the spec's:
advice may improve a launch, never block one.

Advice is kept up to ``ADVICE_MAX_AGE`` (``controller.service.advice``), so it may predate a
stockout the controller has since met: a zone the job saw refuse a create for want of
capacity within that time (``stocked_out``) has its scores set aside, ranks with the
unscored zones, and is never described by them ("obtainability 0.90" of a zone that just
stocked out).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from controller.core.ports import PROVISIONING_MODELS, Shape, ZoneAdvice
from controller.core.spec import JobSpec


ADVICE_MAX_AGE = timedelta(minutes=5)  # how long advice is kept before it is asked again


def stocked_out(history: Iterable[Any], since: datetime) -> dict[str, datetime]:
    """Each zone where a create was refused for want of capacity (a history event "stockout")
    at or after ``since``: zone -> when last."""
    seen: dict[str, datetime] = {}
    for e in history:
        if e.event == "stockout" and e.zone and e.at >= since:
            seen[e.zone] = max(e.at, seen.get(e.zone, e.at))
    return seen


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def shapes(spec: JobSpec, model: str, project: str) -> list[Shape]:
    """What to ask advice about for an attempt on ``model``: one question per region of the spec's zones."""
    regions = dict.fromkeys(region_of(z) for z in spec.zones)
    accel = spec.accelerators
    return [Shape(project=project, region=r, zones=tuple(z for z in spec.zones if region_of(z) == r),
                  machine_type=spec.machine_type, count=spec.nodes, model=PROVISIONING_MODELS[model],
                  accelerator_type=accel.type if accel else None, accelerator_count=accel.count if accel else 0)
            for r in regions]


def zone_order(spec: JobSpec, model: str, advice: Mapping[str, ZoneAdvice] | None,
               stockouts: Collection[str] = ()) -> tuple[str, ...]:
    """The spec's zones, best first, for an attempt on ``model``; ``stockouts``: zones just seen
    stocked out, whose advice is set aside (``stocked_out``)."""
    if spec.placement_for(model) != "capacity" or not advice:
        return spec.zones
    position = {z: i for i, z in enumerate(spec.zones)}

    def rank(zone: str) -> tuple[float, ...]:
        a = None if zone in stockouts else advice.get(zone)
        if a is None:
            return (1, 0, 0, 0, position[zone])
        share = fraction(a.preemption_rate)
        return (0, -(a.obtainability or 0.0), -(a.uptime_s or 0.0), math.inf if share is None else share,
                position[zone])

    return tuple(sorted(spec.zones, key=rank))


def describe(advice: ZoneAdvice | None, stockout: datetime | None = None, now: datetime | None = None) -> str:
    """One zone's advice in words, for a launch's history line; ``stockout``: when the job last saw
    the zone stock out, if it did lately (its advice is then set aside, never quoted)."""
    if stockout is not None:
        ago = max(0, round(((now or stockout) - stockout).total_seconds()))
        return f"stocked out {ago}s ago: capacity advice set aside"
    if advice is None:
        return "no advice"
    parts = []
    if advice.obtainability is not None:
        parts.append(f"obtainability {advice.obtainability:.2f}")
    if advice.uptime_s is not None:
        parts.append(f"uptime ~{_days(advice.uptime_s)}")
    if (share := fraction(advice.preemption_rate)) is not None:
        parts.append(f"{share:.0%} of stopped Spot VMs preempted")
    return ", ".join(parts) or "no scores"


def fraction(value: object) -> float | None:
    """A share as Google defines ``preemptionRate`` (0.0 to 1.0), or None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and 0.0 <= value <= 1.0 else None


def _days(seconds: float) -> str:
    return f"{seconds / 86400:.1f}d" if seconds >= 86400 else f"{seconds / 3600:.1f}h"
