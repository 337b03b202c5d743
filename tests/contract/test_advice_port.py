"""The CapacityAdvisor port's contract, on the in-memory fake and on the real adapter over
the local Compute server (whose advice derives from its own stockouts and preemption rates)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from controller.core import errors
from controller.adapters.google import capacity_advisor
from controller.adapters.memory import MemoryAdvisor, MemoryCompute
from controller.service.config import Settings
from controller.core.ports import CapacityAdvisor, Shape
from localcloud.compute import ComputeServer

PROJECT = "contract-proj"
ZONES = ("us-central1-a", "us-central1-b", "us-central1-c")


@dataclass
class Backend:
    name: str
    advisor: CapacityAdvisor
    stockout: Callable[[str, bool], None]
    rate: Callable[[str, float], None]
    price: Callable[[str, float], None]
    uptime: Callable[[str, float], None]


@pytest.fixture(params=["memory", "local"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "memory":
        compute = MemoryCompute()
        fake = MemoryAdvisor(compute)
        yield Backend("memory", fake,
                      stockout=lambda z, on: (compute.stockouts.add if on else compute.stockouts.discard)(z),
                      rate=fake.preemption_rate, price=fake.spot_prices.__setitem__, uptime=fake.spot_uptime)
        return
    srv: ComputeServer = request.getfixturevalue("compute_server")
    advisor = capacity_advisor(Settings(bucket="b", project=PROJECT, compute_endpoint=srv.endpoint))
    yield Backend("local", advisor, stockout=lambda z, on: srv.stockout(z, on), rate=srv.preemption_rate,
                  price=srv.spot_price, uptime=srv.spot_uptime)
    for zone in ZONES:
        srv.stockout(zone, False)
        srv.preemption_rate(zone, 0.0)
    srv.faults.advice.spot_prices.clear()
    srv.faults.advice.uptimes.clear()


def shape(model: str = "SPOT", zones: tuple[str, ...] = ZONES, region: str = "us-central1") -> Shape:
    return Shape(project=PROJECT, region=region, zones=zones, machine_type="g2-standard-8", count=2, model=model)


def test_every_asked_zone_is_scored_and_a_stocked_out_one_cannot_be_had(backend):
    backend.stockout("us-central1-a", True)
    advice = backend.advisor.advise(shape())
    assert set(advice) == set(ZONES)
    assert advice["us-central1-a"].obtainability == 0.0
    assert advice["us-central1-b"].obtainability > 0 and advice["us-central1-c"].obtainability > 0


def test_spot_advice_says_where_vms_run_longer_and_how_often_they_are_preempted(backend):
    backend.rate("us-central1-b", 0.5)
    backend.rate("us-central1-c", 0.05)
    advice = backend.advisor.advise(shape())
    b, c = advice["us-central1-b"], advice["us-central1-c"]
    assert c.uptime_s > b.uptime_s > 0
    assert (b.preemption_rate, c.preemption_rate) == (0.5, 0.05)


def test_standard_advice_has_no_spot_estimates(backend):
    backend.rate("us-central1-b", 0.5)
    advice = backend.advisor.advise(shape("STANDARD"))
    assert advice["us-central1-b"].obtainability > 0
    assert advice["us-central1-b"].uptime_s is None and advice["us-central1-b"].preemption_rate is None


def test_only_the_asked_zones_are_answered(backend):
    advice = backend.advisor.advise(shape(zones=("us-central1-c",)))
    assert set(advice) == {"us-central1-c"}


def test_an_unknown_region_is_a_request_error_not_a_library_one(backend):
    with pytest.raises(errors.RequestError):
        backend.advisor.advise(shape(region="mars-north1", zones=("mars-north1-a",)))


def test_spot_advice_carries_the_spot_list_price_where_google_gives_one(backend):
    assert backend.advisor.advise(shape())["us-central1-a"].spot_price_h is None
    backend.price("g2-standard-8", 0.3125)
    advice = backend.advisor.advise(shape())
    assert {a.spot_price_h for a in advice.values()} == {0.3125}
    assert backend.advisor.advise(shape("STANDARD"))["us-central1-a"].spot_price_h is None


# -- issue 22: Google's ranges -----------------------------------------------------------------------
def test_every_score_is_in_googles_ranges_whatever_the_zone(backend):
    """preemptionRate is (Spot VMs preempted) / (Spot VMs that stopped): 1.0 where every one that
    stopped was preempted, which says nothing of how long they ran, so the uptime is still some."""
    backend.rate("us-central1-b", 1.0)
    backend.stockout("us-central1-a", True)
    for a in backend.advisor.advise(shape()).values():
        assert 0.0 <= a.obtainability <= 1.0 and 0.0 <= a.preemption_rate <= 1.0
        assert a.uptime_s > 0
    for nonsense in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match="0 to 1"):
            backend.rate("us-central1-b", nonsense)


def test_an_estimated_uptime_set_for_a_zone_is_answered_whatever_its_preemption_rate(backend):
    backend.uptime("us-central1-b", 6 * 3600.0)
    backend.rate("us-central1-b", 1.0)
    b = backend.advisor.advise(shape())["us-central1-b"]
    assert (b.uptime_s, b.preemption_rate) == (6 * 3600.0, 1.0)


@pytest.mark.parametrize("rate", [7.0, -0.5, float("nan"), float("inf")])
def test_the_adapter_keeps_no_preemption_rate_outside_0_to_1(rate):
    """Google documents the range; an answer outside it (a unit change, a bug) is unknown, not 700 %."""
    from google.cloud.compute_v1.types import compute as compute_v1

    from controller.adapters.advice import ComputeAdvice

    class Client:
        def capacity(self, request, retry=None, timeout=None):
            return compute_v1.CapacityAdviceResponse(recommendations=[{
                "scores": {"obtainability": 0.9, "estimated_uptime": "86400s"},
                "shards": [{"zone": "us-central1-a", "machine_type": "g2-standard-8", "instance_count": 2}]}])

        def capacity_history(self, request, retry=None, timeout=None):
            return compute_v1.CapacityHistoryResponse(preemption_history=[{
                "interval": {"start_time": "2026-01-01T00:00:00Z", "end_time": "2026-01-02T00:00:00Z"},
                "preemption_rate": rate}])

    a = ComputeAdvice(Client()).advise(shape(zones=("us-central1-a",)))["us-central1-a"]
    assert (a.obtainability, a.uptime_s, a.preemption_rate) == (0.9, 86400.0, None)
