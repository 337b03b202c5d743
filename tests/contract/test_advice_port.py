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


@pytest.fixture(scope="module")
def server() -> Iterator[ComputeServer]:
    with ComputeServer(run_vms=False) as srv:
        yield srv


@pytest.fixture(params=["memory", "local"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "memory":
        compute = MemoryCompute()
        fake = MemoryAdvisor(compute)
        yield Backend("memory", fake,
                      stockout=lambda z, on: (compute.stockouts.add if on else compute.stockouts.discard)(z),
                      rate=fake.rates.__setitem__, price=fake.spot_prices.__setitem__)
        return
    srv: ComputeServer = request.getfixturevalue("server")
    advisor = capacity_advisor(Settings(bucket="b", project=PROJECT, compute_endpoint=srv.endpoint))
    yield Backend("local", advisor, stockout=lambda z, on: srv.stockout(z, on), rate=srv.preemption_rate,
                  price=srv.spot_price)
    for zone in ZONES:
        srv.stockout(zone, False)
        srv.preemption_rate(zone, 0.0)
    srv.faults.advice.spot_prices.clear()


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
