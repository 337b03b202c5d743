"""The CapacityAdvisor port on google-cloud-compute's ``AdviceClient`` (REST transport).

- ``advice.capacity`` is asked for one zone at a time (``targetShape: ANY_SINGLE_ZONE``:
  a gang must sit in one zone), over the job's zones of one region; each recommendation
  whose shards name one zone scores that zone. Recommendations come best first; a zone
  scored twice keeps its first score.
- ``estimatedUptime`` is a duration string ("86400s"); Google gives it for Spot only.
- ``advice.capacityHistory`` is asked per zone (``locationPolicy.location: zones/Z``) for
  Spot, and only its latest interval's ``preemptionRate`` is kept, to break ties and to show
  in ``respawn status``. Google defines it as a fraction 0.0 to 1.0: (Spot VMs preempted) /
  (Spot VMs that stopped running) in the interval, not a rate per day; a value outside that
  range (or not finite) is kept as unknown. A history that fails costs the tie-break only,
  not the ranking.
"""

from __future__ import annotations

import math
from typing import Any

import requests
from google.api_core import exceptions as gexc

from controller.adapters.compute import RETRY, translate
from controller.adapters.lean import lean

lean("google.cloud.compute_v1")
from google.cloud.compute_v1.services.advice import AdviceClient  # noqa: E402
from google.cloud.compute_v1.types import compute as compute_v1  # noqa: E402

from controller.core.ports import Shape, ZoneAdvice  # noqa: E402

_LIBRARY = (gexc.GoogleAPIError, requests.exceptions.RequestException)
_TIMEOUT = 10.0  # advice improves a launch; it must never hold one for long
# Retried for ``_TIMEOUT`` in all, not the gateway's 60 s: every job of the shape waits on
# this answer (AdviceCache), and an API that keeps failing must not hold their launches.
_RETRY = RETRY.with_timeout(_TIMEOUT)


class ComputeAdvice:
    def __init__(self, client: AdviceClient) -> None:
        self.client = client

    def advise(self, shape: Shape) -> dict[str, ZoneAdvice]:
        # With attached GPUs, they are what may be short, not the machine type alone.
        selection: dict[str, Any] = {"machine_types": [shape.machine_type], "rank": 1, **_gpus(shape)}
        request = compute_v1.CapacityAdviceRpcRequest(
            project=shape.project, region=shape.region, capacity_advice_request_resource=compute_v1.CapacityAdviceRequest(
                size=shape.count,
                instance_properties={"scheduling": {"provisioning_model": shape.model}},
                instance_flexibility_policy={"instance_selections": {"respawn": selection}},
                distribution_policy={"target_shape": "ANY_SINGLE_ZONE",
                                     "zones": [{"zone": f"zones/{z}"} for z in shape.zones]}))
        try:
            answer = self.client.capacity(request, retry=_RETRY, timeout=_TIMEOUT)
        except _LIBRARY as e:
            raise translate(e, shape.region) from e
        scores: dict[str, ZoneAdvice] = {}
        for recommendation in answer.recommendations:
            zones = {_last(s.zone) for s in recommendation.shards}
            zone = zones.pop() if len(zones) == 1 else None
            if zone in shape.zones and zone not in scores:
                found = recommendation.scores
                scores[zone] = ZoneAdvice(
                    obtainability=found.obtainability if "obtainability" in found else None,
                    uptime_s=_seconds(found.estimated_uptime) if "estimated_uptime" in found else None)
        if shape.model == "SPOT":
            for zone, advice in scores.items():
                try:
                    rate, price = self._history(shape, zone)
                except _LIBRARY:
                    break  # the tie-break and the status line go without it; one failure is enough to wait for
                scores[zone] = ZoneAdvice(advice.obtainability, advice.uptime_s, rate, price)
        return scores

    def _history(self, shape: Shape, zone: str) -> tuple[float | None, float | None]:
        """The latest interval's preemption rate (the share of stopped Spot VMs that were preempted)
        and Spot list price (dollars per VM-hour) in ``zone``."""
        request = compute_v1.CapacityHistoryAdviceRequest(
            project=shape.project, region=shape.region, capacity_history_request_resource={
                "instance_properties": {"machine_type": shape.machine_type,
                                        "scheduling": {"provisioning_model": shape.model}, **_gpus(shape)},
                "location_policy": {"location": f"zones/{zone}"}, "types": ["PREEMPTION", "PRICE"]})
        history = self.client.capacity_history(request, retry=_RETRY, timeout=_TIMEOUT)
        days = sorted(history.preemption_history, key=lambda r: r.interval.end_time)
        rate = _fraction(days[-1].preemption_rate) if days and "preemption_rate" in days[-1] else None
        prices = sorted(history.price_history, key=lambda r: r.interval.end_time)
        price = None
        if prices and "list_price" in prices[-1] and prices[-1].list_price.currency_code in ("USD", ""):
            money = prices[-1].list_price
            price = money.units + money.nanos / 1e9  # google.type.Money: whole units and nanos
        return rate, price


def _gpus(shape: Shape) -> dict[str, Any]:
    if not shape.accelerator_type:
        return {}
    return {"guest_accelerators": [{"accelerator_type": shape.accelerator_type,
                                    "accelerator_count": shape.accelerator_count}]}


def _fraction(value: float) -> float | None:
    """``preemptionRate`` as Google documents it (0.0 to 1.0), else None."""
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None


def _seconds(text: Any) -> float | None:
    """A google-duration string ("86400s", "1.5s") as seconds; None when it is not one."""
    try:
        return float(str(text).removesuffix("s"))
    except ValueError:
        return None


def _last(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]

