"""Which zone an attempt tries first: a pure function of the spec and Compute's advice.

``placement: ordered`` keeps the spec's order. ``placement: capacity`` (the default for
Spot) ranks the same zones by one figure, what a first try there is worth (``Worth``): the
useful training a dollar buys there (the expected goodput at the zone's estimated Spot uptime,
first-order Young/Daly with the run's own save and boot times, over the zone's price per hour),
discounted by the time capacity is expected to take there (a refused insert costs about a
pass, ``RETRY_S``; at obtainability p, (1 - p) / p of them are expected) against how long it
is then kept. So a zone half as obtainable but with three times the uptime goes first when its
expected goodput is the higher, where a lexicographic order (obtainability, then uptime) let a
0.1 difference in a noisy score override a 2x difference in lifetime. Ties (the figure is 0
wherever the run's own boot and save outlast the uptime) go to the more obtainable, then the
longer uptime, then the lower share of the Spot VMs that stopped there on the latest day which were preempted (``preemptionRate``,
a fraction 0..1: it says how Spot VMs ended, not how soon; a rate outside 0..1 or not finite
ranks as unknown), then the spec's order. Zones the advice did not score keep the spec's order
after the scored ones. Without advice (not asked, or the call failed) the order is the spec's:
advice may improve a launch, never block one. The figures behind an attempt's choice are kept
in its status (``ZoneScore``) and shown by ``respawn status JOB`` as placement used them.

Advice is kept up to ``ADVICE_MAX_AGE`` (``controller.service.advice``), so it may predate a
stockout the controller has since met: a zone the job saw refuse a create for want of
capacity within that time (``stocked_out``) has its scores set aside, ranks with the
unscored zones, and is never described by them ("obtainability 0.90" of a zone that just
stocked out).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from controller.core import prices
from controller.core.ledger import DEFAULT_BOOT_S, MAX_INTERVAL_S, MIN_INTERVAL_S
from controller.core.ports import PROVISIONING_MODELS, Shape, ZoneAdvice
from controller.core.spec import JobSpec


ADVICE_MAX_AGE = timedelta(minutes=5)  # how long advice is kept before it is asked again
RETRY_S = 60.0  # what a refused insert costs before the next try: about one pass
DEFAULT_SAVE_S = 60.0  # a save, before the run has measured one (its boot: ledger.DEFAULT_BOOT_S)
HORIZON_S = 86400.0  # how long capacity is kept where nothing preempts it (standard, flex-start)


@dataclass(frozen=True)
class Worth:
    """What a first try in one zone is worth (module docstring)."""

    # Expected goodput at the zone's uptime, 0..1 (1.0 where nothing preempts); None for Spot where
    # no zone's advice gave an uptime (every zone weighed alike, nothing to say of it).
    goodput: float | None
    per_dollar: float | None  # useful hours per dollar of the attempt's hourly price; None: no price or no goodput known
    value: float  # the figure zones are ranked by (higher first)


def expected_goodput(uptime_s: float | None, save_s: float, boot_s: float) -> float:
    """First-order Young/Daly: a life of mean ``uptime_s`` pays one boot, and saving every
    τ = √(2·C·M) loses C per save and half an interval at the end; 1.0 with no uptime (no preemption)."""
    if uptime_s is None:
        return 1.0
    cost = max(save_s, 1.0)
    tau = min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, math.sqrt(2 * cost * uptime_s)))
    return max(0.0, tau / (tau + cost) * (1 - (boot_s + (tau + cost) / 2) / uptime_s))


def worths(spec: JobSpec, model: str, advice: Mapping[str, ZoneAdvice], save_s: float | None = None,
           boot_s: float | None = None) -> dict[str, Worth]:
    """Each advised zone of the spec's, what a first try there on ``model`` is worth (module
    docstring); ``save_s``/``boot_s``: the run's own, else the defaults. A Spot zone the advice
    gave no uptime is taken at the others' mean; a price is weighed only where every zone has one."""
    scored = {z: a for z, a in advice.items() if z in spec.zones}
    save, boot = save_s if save_s is not None else DEFAULT_SAVE_S, boot_s if boot_s is not None else DEFAULT_BOOT_S
    spot = model == "spot"
    known = [a.uptime_s for a in scored.values() if _positive(a.uptime_s)]
    mean_uptime = sum(known) / len(known) if spot and known else None
    override = dict(spec.policy.prices) if spec.policy.prices else None
    rates = {z: prices.rate(model=model, nodes=1 if spec.tpu else spec.nodes, gpus=spec.gpus_per_node,
                            machine_type=spec.machine_type, tpu_type=spec.tpu.accelerator if spec.tpu else None,
                            override=override, spot_price=a.spot_price_h if spot and _positive(a.spot_price_h) else None)
             for z, a in scored.items()}
    priced = all(r.source != prices.UNKNOWN and r.per_hour > 0 for r in rates.values())
    out = {}
    for zone, a in scored.items():
        uptime = (a.uptime_s if _positive(a.uptime_s) else mean_uptime) if spot else None
        goodput = expected_goodput(uptime, save, boot)
        per_dollar = goodput / rates[zone].per_hour if priced else None
        odds = a.obtainability if a.obtainability is not None and math.isfinite(a.obtainability) else 0.5
        odds = min(1.0, max(0.0, odds))
        kept = min(uptime, HORIZON_S) if uptime is not None else HORIZON_S
        value = 0.0 if odds == 0 else (per_dollar if priced else goodput) * kept / (kept + RETRY_S * (1 - odds) / odds)
        unknown = spot and uptime is None
        out[zone] = Worth(goodput=None if unknown else goodput, per_dollar=None if unknown else per_dollar, value=value)
    return out


def _positive(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


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
               stockouts: Collection[str] = (), save_s: float | None = None,
               boot_s: float | None = None) -> tuple[str, ...]:
    """The spec's zones, best first, for an attempt on ``model``; ``stockouts``: zones just seen
    stocked out, whose advice is set aside (``stocked_out``); ``save_s``/``boot_s``: the run's
    own (``worths``)."""
    if spec.placement_for(model) != "capacity" or not advice:
        return spec.zones
    position = {z: i for i, z in enumerate(spec.zones)}
    usable = {z: a for z, a in advice.items() if z not in stockouts}
    worth = worths(spec, model, usable, save_s, boot_s)

    def rank(zone: str) -> tuple[float, ...]:
        if zone not in worth:
            return (1, 0, 0, 0, 0, position[zone])
        a = usable[zone]
        share = fraction(a.preemption_rate)
        # Where the figure ties (at 0: no zone expected to make progress with the run's own boot
        # and save), the scores behind it still rank, obtainability then uptime.
        return (0, -worth[zone].value, -(fraction(a.obtainability) or 0.0),
                -(a.uptime_s if _positive(a.uptime_s) else 0.0), math.inf if share is None else share, position[zone])

    return tuple(sorted(spec.zones, key=rank))


def describe(advice: ZoneAdvice | None, stockout: datetime | None = None, now: datetime | None = None,
             worth: Worth | None = None) -> str:
    """One zone's advice in words, for a launch's history line, with what placement made of it
    (``worth``); ``stockout``: when the job last saw the zone stock out, if it did lately (its
    advice is then set aside, never quoted)."""
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
    if worth is not None and worth.goodput is not None:
        parts.append(f"expected goodput ~{worth.goodput:.0%}"
                     + (f", {worth.per_dollar:.3g} useful hours per $" if worth.per_dollar is not None else ""))
    return ", ".join(parts) or "no scores"


def fraction(value: object) -> float | None:
    """A share as Google defines ``preemptionRate`` (0.0 to 1.0), or None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and 0.0 <= value <= 1.0 else None


def _days(seconds: float) -> str:
    return f"{seconds / 86400:.1f}d" if seconds >= 86400 else f"{seconds / 3600:.1f}h"
