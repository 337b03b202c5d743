"""Compute's capacity advice (``advice.capacity``, ``advice.capacityHistory``), answered from
the local server's own fault schedule, so that a test can tell which zone Google would
have advised.

- obtainability: 0.0 in a zone that is stocked out, out of quota or unreachable (what an
  insert there would meet now), else ``Schedule.obtainability`` (0.9 unless set), 0 to 1;
- history: the zone's ``preemptionRate`` for each of the last 7 days, as Google defines it:
  of the Spot VMs that stopped running in the interval, the fraction 0.0 to 1.0 that were
  preempted (``Schedule.preemption_rates``); and a flat Spot price per machine type where
  one was set (``Schedule.spot_prices``, dollars per hour);
- estimated uptime of Spot VMs (Google: a best-effort estimate of how long the majority of
  them run before preemption): ``Schedule.uptimes`` where a test set one; else this
  server's own model of a zone, one number p, its preemption rate: half of its Spot VMs
  preempted within ln 2 / -ln(1 - p) days (a day at p = 0.5), kept between an hour and 30
  days. That is the local world's choice, not Google's: a zone where every Spot VM that
  stopped was preempted (p = 1) still has Spot VMs that run for a while. None for a
  provisioning model other than Spot, as Google gives it for Spot only.

The request is validated against the discovery document by the server first; what the
schema cannot say (a size, a machine type, zones of the region in the path) is checked
here, with Google's 400 ``invalid``. Field meanings follow the public reference:
``shards[].zone`` is a zone name, ``shards[].machineType`` the name from the request's
instance selection, ``estimatedUptime`` a duration string.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from localcloud.gce import invalid, region_of

_MAX_UPTIME = 30 * 86400.0
_MIN_UPTIME = 3600.0
_DAYS = 7


@dataclass
class Schedule:
    # zone -> preemptionRate: of its Spot VMs that stopped, the fraction preempted (0 to 1)
    preemption_rates: dict[str, float] = field(default_factory=dict)
    uptimes: dict[str, float] = field(default_factory=dict)  # zone -> estimatedUptime, seconds (else the model's)
    obtainability: dict[str, float] = field(default_factory=dict)  # zone -> score where capacity is there
    spot_prices: dict[str, float] = field(default_factory=dict)  # machine type -> dollars per hour

    def rate(self, zone: str) -> float:
        return fraction(self.preemption_rates.get(zone, 0.0), "a preemption rate")

    def uptime(self, zone: str) -> float:
        if zone in self.uptimes:
            return self.uptimes[zone]
        return uptime(self.rate(zone))


def fraction(value: float, what: str) -> float:
    """``value`` when it is in Google's range for a fraction (0 to 1), else ValueError: the
    server never answers out of range, whatever a test wrote into its schedule."""
    value = float(value)
    if not 0.0 <= value <= 1.0:  # NaN fails it too
        raise ValueError(f"{what} is a fraction, 0 to 1: {value}")
    return value


def capacity(body: dict[str, Any], region: str, zones: tuple[str, ...], blocked: set[str],
             schedule: Schedule) -> dict[str, Any]:
    """``advice.capacity``: recommendations over the request's zones of ``region`` (all of the
    server's zones there when it names none), the best first. ``blocked``: zones where an
    insert would fail now."""
    _known(region, zones)
    size = int(body.get("size") or 0)  # the schema let through a number or a decimal string
    if size < 1:
        raise invalid("resource.size", size, "Must be at least 1.")
    machine_type = _machine_type(body)
    model = body.get("instanceProperties", {}).get("scheduling", {}).get("provisioningModel") or "STANDARD"
    policy = body.get("distributionPolicy", {})
    asked = list(dict.fromkeys(_last(z.get("zone", "")) for z in policy.get("zones", [])))
    for zone in asked:
        if region_of(zone) != region or zone not in zones:
            raise invalid("resource.distributionPolicy.zones", zone, f"Zone must be in region '{region}'.")
    candidates = asked or [z for z in zones if region_of(z) == region]

    def scores(zone: str) -> dict[str, Any]:
        odds = 0.0 if zone in blocked else fraction(schedule.obtainability.get(zone, 0.9), "an obtainability")
        out: dict[str, Any] = {"obtainability": odds}
        if model == "SPOT":
            out["estimatedUptime"] = f"{schedule.uptime(zone):.0f}s"
        return out

    def shard(zone: str, count: int) -> dict[str, Any]:
        return {"zone": zone, "machineType": machine_type, "instanceCount": count, "provisioningModel": model}

    if policy.get("targetShape") in ("ANY", "BALANCED"):  # one recommendation spread over the zones that have it
        usable = [z for z in candidates if z not in blocked] or candidates
        counts = [size // len(usable) + (1 if i < size % len(usable) else 0) for i in range(len(usable))]
        parts = [(z, c) for z, c in zip(usable, counts, strict=True) if c]
        worst = max((scores(z) for z, _ in parts), key=_rank)  # a spread is as good as its worst zone
        return {"recommendations": [{"scores": worst, "shards": [shard(z, c) for z, c in parts]}]}
    ranked = sorted(candidates, key=lambda z: (_rank(scores(z)), z))
    return {"recommendations": [{"scores": scores(z), "shards": [shard(z, size)]} for z in ranked]}


def history(body: dict[str, Any], region: str, zones: tuple[str, ...], schedule: Schedule,
            now: datetime | None = None) -> dict[str, Any]:
    """``advice.capacityHistory``: the last 7 days of one zone's (or the region's) preemption
    rate and Spot price for a machine type."""
    _known(region, zones)
    machine_type = _last(body.get("instanceProperties", {}).get("machineType") or "")
    if not machine_type:
        raise invalid("resource.instanceProperties.machineType", "", "A machine type is required.")
    location = _last(body.get("locationPolicy", {}).get("location", "")) or region
    if location != region and (location not in zones or region_of(location) != region):
        raise invalid("resource.locationPolicy.location", location, f"Must be region '{region}' or one of its zones.")
    where = [location] if location != region else [z for z in zones if region_of(z) == region]
    rate = max((schedule.rate(z) for z in where), default=0.0)  # a region: its worst zone
    types = set(body.get("types") or ("PREEMPTION", "PRICE"))
    end = (now or datetime.now(timezone.utc)).replace(minute=0, second=0, microsecond=0)
    days = [(end - timedelta(days=d + 1), end - timedelta(days=d)) for d in reversed(range(_DAYS))]
    out: dict[str, Any] = {"location": location, "machineType": machine_type}
    if "PREEMPTION" in types:
        out["preemptionHistory"] = [{"interval": _interval(a, b), "preemptionRate": rate} for a, b in days]
    if "PRICE" in types and machine_type in schedule.spot_prices:
        units, nanos = divmod(round(schedule.spot_prices[machine_type] * 1e9), 10**9)
        price = {"currencyCode": "USD", "units": str(units), "nanos": nanos}
        out["priceHistory"] = [{"interval": _interval(a, b), "listPrice": price} for a, b in days]
    return out


def _known(region: str, zones: tuple[str, ...]) -> None:
    if not any(region_of(z) == region for z in zones):
        raise invalid("region", region, "Unknown region.")


def _machine_type(body: dict[str, Any]) -> str:
    selections = body.get("instanceFlexibilityPolicy", {}).get("instanceSelections", {})
    ranked = sorted(selections.values(), key=lambda s: int(s.get("rank", 0) or 0))
    for selection in ranked:
        if selection.get("machineTypes"):
            return _last(selection["machineTypes"][0])
    raise invalid("resource.instanceFlexibilityPolicy.instanceSelections", "",
                  "At least one instance selection with a machine type is required.")


def uptime(rate: float) -> float:
    """The local model's Spot uptime for a zone of preemption rate ``rate`` (0 to 1): seconds
    until half of its Spot VMs are preempted, as if a share ``rate`` of them were preempted
    within a day of running; between an hour and 30 days."""
    if rate <= 0:
        return _MAX_UPTIME
    if rate >= 1:
        return _MIN_UPTIME
    return max(_MIN_UPTIME, min(_MAX_UPTIME, math.log(2) / -math.log1p(-rate) * 86400))


def _rank(scores: dict[str, Any]) -> tuple[float, float]:
    """Best first: the more obtainable, then the longer expected to run."""
    return -scores["obtainability"], -float(scores.get("estimatedUptime", "0s").rstrip("s"))


def _interval(start: datetime, end: datetime) -> dict[str, str]:
    return {"startTime": start.isoformat().replace("+00:00", "Z"), "endTime": end.isoformat().replace("+00:00", "Z")}


def _last(path: str) -> str:
    """``zones/us-central1-a``, a full URL or a bare name: the name."""
    return path.rstrip("/").rsplit("/", 1)[-1]


class AdviceApi:
    """Compute's ``advice.capacity`` and ``advice.capacityHistory``, and what a test tells them:
    a mixin of ``localcloud.compute.ComputeServer``, whose fault state (``faults``) it reads."""

    def preemption_rate(self, zone: str, rate: float) -> None:
        """What capacity history tells of ``zone``: of its Spot VMs that stopped, this share
        preempted (0 to 1); unless ``spot_uptime`` says otherwise, it also sets the zone's
        estimated uptime, by this server's model (``uptime``)."""
        rate = fraction(rate, "a preemption rate")
        with self._lock:
            self.faults.advice.preemption_rates[zone] = rate

    def spot_uptime(self, zone: str, seconds: float | None) -> None:
        """What capacity advice estimates of ``zone``'s Spot VMs' run time (None: the model's again)."""
        with self._lock:
            if seconds is None:
                self.faults.advice.uptimes.pop(zone, None)
                return
            seconds = float(seconds)
            if not 0 < seconds < math.inf:
                raise ValueError(f"an uptime is a positive duration: {seconds}")
            self.faults.advice.uptimes[zone] = seconds

    def spot_price(self, machine_type: str, dollars_per_hour: float) -> None:
        """What capacity history tells of ``machine_type``'s Spot price."""
        dollars_per_hour = float(dollars_per_hour)
        if dollars_per_hour < 0:
            raise ValueError(f"a price is not negative: {dollars_per_hour}")
        with self._lock:
            self.faults.advice.spot_prices[machine_type] = dollars_per_hour

    def _advice_capacity(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        spot = (body.get("instanceProperties") or {}).get("scheduling", {}).get("provisioningModel") == "SPOT"
        with self._lock:
            blocked = {*self.faults.stockouts, *self.faults.quota, *self.faults.unreachable,
                       *(self.faults.spot_stockouts if spot else ())} - self.faults.unforeseen
            return capacity(body, p["region"], self.zones, blocked, self.faults.advice)

    def _advice_capacityHistory(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            return history(body, p["region"], self.zones, self.faults.advice)
