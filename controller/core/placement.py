"""Which zone an attempt tries first: a pure function of the spec and Compute's advice.

``placement: ordered`` keeps the spec's order. ``placement: capacity`` (the default for
Spot) ranks the same zones by Compute's capacity advice: the more obtainable first, then
the longer Spot VMs are expected to run there (``estimatedUptime``), then, as a tie-break
only, the lower share of the Spot VMs that stopped there on the latest day which were
preempted (``preemptionRate``, a fraction 0..1: it says how Spot VMs ended, not how soon),
then the spec's order. A rate outside 0..1 (or not finite) ranks as unknown. Zones the advice did not score keep the spec's order after
the scored ones. Without advice (not asked, or the call failed) the order is the spec's:
advice may improve a launch, never block one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from controller.core.ports import PROVISIONING_MODELS, Shape, ZoneAdvice
from controller.core.spec import JobSpec


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


def zone_order(spec: JobSpec, model: str, advice: Mapping[str, ZoneAdvice] | None) -> tuple[str, ...]:
    """The spec's zones, best first, for an attempt on ``model``."""
    if spec.placement_for(model) != "capacity" or not advice:
        return spec.zones
    position = {z: i for i, z in enumerate(spec.zones)}

    def rank(zone: str) -> tuple[float, ...]:
        a = advice.get(zone)
        if a is None:
            return (1, 0, 0, 0, position[zone])
        share = fraction(a.preemption_rate)
        return (0, -(a.obtainability or 0.0), -(a.uptime_s or 0.0), math.inf if share is None else share,
                position[zone])

    return tuple(sorted(spec.zones, key=rank))


def describe(advice: ZoneAdvice | None) -> str:
    """One zone's advice in words, for a launch's history line."""
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
