"""Zone ranking and the provisioning fallback as pure functions: tables of cases."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, strategies

from controller.core import errors, placement, transitions as t
from controller.core.ports import ZoneAdvice
from controller.core.spec import parse_spec
from controller.core.state import JobStatus

A, B, C = "us-central1-a", "us-central1-b", "us-central1-c"
NOW = datetime(2026, 11, 24, 12, tzinfo=timezone.utc)


def spec(extra: str = ""):
    return parse_spec(f"zones: [{A}, {B}, {C}]\nmachine_type: g2-standard-8\ncommand: x\n{extra}", "j")


def z(obtainability=None, uptime=None, rate=None, price=None) -> ZoneAdvice:
    return ZoneAdvice(obtainability, uptime, rate, price)


@pytest.mark.parametrize("advice, order", [
    (None, (A, B, C)),  # no advice: the spec's order
    ({}, (A, B, C)),
    ({A: z(0.2), B: z(0.9), C: z(0.5)}, (B, C, A)),  # obtainability first
    ({A: z(0.9, 86400), B: z(0.9, 7 * 86400), C: z(0.9, 86400)}, (B, A, C)),  # then uptime, then spec order
    ({A: z(0.9, 86400, 0.3), B: z(0.9, 86400, 0.1), C: z(0.9, 86400)}, (B, A, C)),  # then rate; unknown rate last
    # One figure, not an order of scores: a 30-day life outweighs nine refused inserts in ten ...
    ({A: z(0.1, 30 * 86400), B: z(0.9, 3600)}, (A, B, C)),
    # ... half the obtainability with three times the uptime goes first (issue 36) ...
    ({A: z(0.8, 3600), B: z(0.4, 3 * 3600)}, (B, A, C)),
    # ... but nineteen refusals in twenty outweigh twice the uptime; unscored zones last
    ({A: z(0.05, 2 * 3600), B: z(0.9, 3600)}, (B, A, C)),
    # the same life at half the Spot price (capacityHistory's priceHistory) buys twice the training
    ({A: z(0.9, 86400, price=0.8), B: z(0.9, 86400, price=0.4)}, (B, A, C)),
    ({C: z(0.0)}, (C, A, B)),  # scored, even at 0, before the unscored
])
def test_capacity_placement_ranks_zones(advice, order):
    assert placement.zone_order(spec(), "spot", advice) == order


def test_ordered_placement_and_standard_by_default_ignore_advice():
    advice = {C: z(0.9, 86400)}
    assert placement.zone_order(spec("placement: ordered"), "spot", advice) == (A, B, C)
    assert placement.zone_order(spec(), "standard", advice) == (A, B, C)
    assert placement.zone_order(spec("placement: capacity"), "standard", advice) == (C, A, B)


def test_one_question_per_region():
    s = parse_spec(f"zones: [{A}, us-east1-b, {B}]\nmachine_type: g2-standard-8\ncommand: x\nnodes: 2\n", "j")
    shapes = placement.shapes(s, "spot", "p")
    assert [(x.region, x.zones, x.count, x.model) for x in shapes] == [
        ("us-central1", (A, B), 2, "SPOT"), ("us-east1", ("us-east1-b",), 2, "SPOT")]


FALLBACK = "provisioning: [spot, standard]\npolicy: {fallback: {stockouts: 2, wait: 10m, step_up_after: 1h}}\n"


def stockout(st: JobStatus, s, zone: str, at: datetime) -> JobStatus:
    return t.after_create_error(st, s, errors.CapacityError(zone, "ZONE_RESOURCE_POOL_EXHAUSTED"), at)


@pytest.mark.parametrize("misses, minutes, stepped", [
    (1, 0, False),  # one stockout: next zone
    (2, 0, True),  # policy.fallback.stockouts reached
    (1, 11, True),  # the first stockout was longer ago than fallback.wait
])
def test_step_down_after_stockouts_or_a_long_wait(misses, minutes, stepped):
    s = spec(FALLBACK)
    first = NOW - timedelta(minutes=minutes)
    st = JobStatus(attempt=1, zone=A, provisioning="spot", capacity_misses=misses - 1,
                   capacity_since=first if misses > 1 or minutes else None)
    after = stockout(st, s, A, NOW)
    assert (after.provisioning == "standard") is stepped
    if stepped:
        assert after.zone is None and after.zone_cooldowns == {} and after.capacity_misses == 0
        assert after.history[-1].event == "step-down" and after.history[-2].event == "stockout"
        assert after.placement == st.placement + 2  # the stockout's and the new model's: a new request id
    else:
        assert after.zone == B and after.capacity_misses == misses


def test_no_step_down_below_the_last_model_or_for_a_single_model():
    for extra, model in ((FALLBACK, "standard"), ("", "spot")):
        st = JobStatus(attempt=1, zone=A, provisioning=model, capacity_misses=5, capacity_since=NOW - timedelta(hours=1))
        after = stockout(st, spec(extra), A, NOW)
        assert after.provisioning == model and after.zone == B


@pytest.mark.parametrize("since, model, expected", [
    (None, "spot", "spot"),
    (NOW - timedelta(minutes=30), "standard", "standard"),  # not yet
    (NOW - timedelta(hours=1), "standard", "spot"),  # step_up_after passed
    (NOW - timedelta(hours=5), "spot", "spot"),
])
def test_step_back_up_at_the_next_attempt(since, model, expected):
    st = JobStatus(attempt=1, provisioning=model, model_since=since)
    chosen, zone = t.choose(spec(FALLBACK), st, NOW, lambda m: (A, B))
    assert chosen == expected and zone == A


def test_a_model_status_json_names_but_the_spec_no_longer_lists_is_never_used():
    st = JobStatus(attempt=1, provisioning="flex-start")
    assert t.model_of(spec(FALLBACK), st) == "spot"
    assert t.choose(spec(FALLBACK), st, NOW, lambda m: (A, B)) == ("spot", A)


# -- review ---------------------------------------------------------------------------------


@pytest.mark.parametrize("duration", ["0s", "0.5s", "29s"])
def test_a_flex_start_run_too_short_for_compute_is_refused_in_the_spec(duration):
    # 0s became "no maxRunDuration" in the request (a falsy timedelta): Compute refuses a
    # Flex-start VM without one, in every zone, and the job failed there instead of here.
    from controller.core.spec import SpecError

    with pytest.raises(SpecError, match=r"policy\.max_run_duration: at least 30s"):
        spec(f"provisioning: [spot, flex-start]\npolicy: {{max_run_duration: {duration}}}\n")
    assert spec("provisioning: [spot, flex-start]\npolicy: {max_run_duration: 30s}\n").policy.max_run_duration


def test_advice_is_asked_for_the_jobs_gpus_not_the_bare_machine_type():
    # n1-standard-8 with 4 V100s and with one T4 share a machine type: advice about the
    # machine type alone says nothing of the GPUs, and the cache must not mix the two.
    v100 = parse_spec(f"zones: [{A}]\nmachine_type: n1-standard-8\ncommand: x\n"
                      "accelerators: {type: nvidia-tesla-v100, count: 4}\n", "j")
    t4 = parse_spec(f"zones: [{A}]\nmachine_type: n1-standard-8\ncommand: x\n"
                    "accelerators: {type: nvidia-tesla-t4}\n", "j")
    (a,), (b,) = placement.shapes(v100, "spot", "p"), placement.shapes(t4, "spot", "p")
    assert (a.accelerator_type, a.accelerator_count) == ("nvidia-tesla-v100", 4)
    assert (b.accelerator_type, b.accelerator_count) == ("nvidia-tesla-t4", 1)
    assert a != b and hash(a) != hash(b)
    (plain,) = placement.shapes(spec(), "spot", "p")
    assert plain.accelerator_type is None and plain.accelerator_count == 0


def test_a_step_down_tries_every_zone_afresh_on_the_new_model_even_one_that_refused_the_old():
    # Zone a refused the Spot VM (a 400/404: e.g. no Spot for it there), b and c stocked out:
    # the refusal said nothing of a standard VM, as the cooldowns said nothing of its capacity.
    s = spec(FALLBACK)
    st = JobStatus(attempt=1, zone=B, provisioning="spot", zone_rejections={A: "400 spot unsupported"},
                   capacity_misses=1, capacity_since=NOW)
    after = stockout(st, s, B, NOW)
    assert after.provisioning == "standard" and after.zone is None
    assert after.zone_rejections == {} and after.zone_cooldowns == {}
    assert t.pick_zone(s, after, NOW) == A


# -- stale advice and a stockout the controller has just met (issue 26) --------------------------

def stocked_out_at(zone: str, ago: timedelta) -> JobStatus:
    """A job whose create in ``zone`` was refused for want of capacity ``ago`` before NOW."""
    st = JobStatus(attempt=1, zone=zone, provisioning="spot")
    return stockout(st, spec(), zone, NOW - ago)


def test_a_zone_just_seen_stocked_out_ranks_without_its_stale_advice():
    advice = {A: z(0.9, 30 * 86400), B: z(0.5, 86400)}
    assert placement.zone_order(spec(), "spot", advice) == (A, B, C)
    # A stocked out since the advice was asked: it ranks with the unscored zones, B first.
    assert placement.zone_order(spec(), "spot", advice, {A}) == (B, A, C)
    assert placement.zone_order(spec(), "spot", advice, {C}) == (A, B, C)  # C had no score to set aside


@pytest.mark.parametrize("ago, seen", [(timedelta(seconds=30), True), (timedelta(minutes=4), True),
                                       (timedelta(minutes=6), False)])  # older than any kept advice
def test_stocked_out_reads_the_jobs_history_within_the_advices_age(ago, seen):
    st = stocked_out_at(A, ago)
    found = placement.stocked_out(st.history, NOW - placement.ADVICE_MAX_AGE)
    assert (found == {A: NOW - ago}) is seen, found


def test_the_views_order_sets_aside_the_advice_of_a_zone_it_saw_stock_out():
    from controller.core.world import JobView

    s = spec()
    view = JobView("j", spec=s, status=stocked_out_at(A, timedelta(seconds=40)),
                   advice={A: z(0.9, 30 * 86400), B: z(0.5, 86400)}, advice_model="spot", advice_loaded=True)
    assert view.zone_order("spot") == (A, B, C)  # no clock: as before
    assert view.zone_order("spot", NOW) == (B, A, C)
    assert view.zone_order("spot", NOW + timedelta(minutes=10)) == (A, B, C)  # advice asked since is fresh


def test_a_launch_in_a_zone_just_seen_stocked_out_does_not_quote_its_advice():
    st = stocked_out_at(A, timedelta(seconds=40))
    advice = {A: z(0.9, 30 * 86400), B: z(0.9, 86400)}
    launched = t.begin_attempt(st, spec(), "p", A, ["j-2"], None, NOW, "preempted", 1, "tok", "spot", advice)
    line = launched.history[-1].detail
    assert "obtainability 0.90" not in line and "stocked out 40s ago" in line, line
    other = t.begin_attempt(st, spec(), "p", B, ["j-2"], None, NOW, "preempted", 1, "tok", "spot", advice)
    assert "obtainability 0.90" in other.history[-1].detail  # B's advice still stands
    assert placement.describe(z(0.9), NOW - timedelta(seconds=5), NOW) == "stocked out 5s ago: capacity advice set aside"


odds = strategies.floats(0.01, 1.0)
uptimes = strategies.floats(600.0, 60 * 86400.0)
spot_prices = strategies.floats(0.05, 20.0)


@given(odds, odds, uptimes, uptimes, spot_prices)
def test_the_figure_is_monotone_in_each_score(p1, p2, u1, u2, price):
    """More obtainable, longer-lived or cheaper never ranks a zone lower, the other scores equal."""
    def first(a, b):
        return placement.zone_order(spec(), "spot", {A: a, B: b})[0]

    if p1 != p2:
        better = A if p1 > p2 else B
        assert first(z(p1, u1, price=price), z(p2, u1, price=price)) == better
    if abs(u1 - u2) > 1:
        better = A if u1 > u2 else B
        assert first(z(p1, u1, price=price), z(p1, u2, price=price)) == better
    assert first(z(p1, u1, price=price), z(p1, u1, price=price * 1.5)) == A
    assert first(z(p1, u1, price=price * 1.5), z(p1, u1, price=price)) == B


def test_a_zone_better_in_every_score_goes_first_even_where_no_zone_is_expected_to_make_progress():
    """A run whose own boot (30 min) and save (10 min) outlast every zone's uptime expects no goodput
    anywhere: the figure is 0 in both zones, and the scores behind it still decide, never the spec's
    order alone (B is 18 times as obtainable, its VMs live longer)."""
    advice = {A: z(0.05, 1800), B: z(0.9, 2700)}
    worth = placement.worths(spec(), "spot", advice, 600.0, 1800.0)
    assert worth[A].value == worth[B].value == 0.0
    assert placement.zone_order(spec(), "spot", advice, (), 600.0, 1800.0) == (B, A, C)
    assert placement.zone_order(spec(), "spot", {A: z(0.5, 1800), B: z(0.5, 2700)}, (), 600.0, 1800.0) == (B, A, C)


def test_a_spot_zone_no_advice_gave_an_uptime_is_never_said_to_expect_all_its_goodput():
    """Google's estimatedUptime is best effort: where no zone has one, the zones rank by obtainability
    and price alone (the goodput is weighed as equal), and nothing says a Spot VM is expected to
    keep 100 % of its time."""
    advice = {A: z(0.5), B: z(0.9)}
    worth = placement.worths(spec(), "spot", advice)
    assert placement.zone_order(spec(), "spot", advice) == (B, A, C)
    assert worth[B].goodput is None and worth[B].per_dollar is None and worth[B].value > worth[A].value
    launched = t.begin_attempt(JobStatus(attempt=0), spec(), "p", B, ("j-1",), None, NOW, "submitted", 1, "tok",
                               "spot", advice)
    assert "expected goodput" not in launched.history[-1].detail and "obtainability 0.90" in launched.history[-1].detail
    assert launched.zone_advice[B].goodput is None and launched.zone_advice[B].value == worth[B].value
    # Standard VMs are not preempted: all of their time is theirs to keep.
    assert placement.worths(spec("placement: capacity"), "standard", advice)[B].goodput == 1.0


def test_what_a_dollar_buys_in_an_expensive_job_is_never_shown_as_nothing():
    """Eight A3 VMs cost some $200 an hour: a dollar buys thousandths of a useful hour, which two
    decimals showed as "0.00" in every zone; the line keeps three figures, as placement weighed them."""
    big = parse_spec(f"zones: [{A}, {B}]\nmachine_type: a3-highgpu-8g\nnodes: 8\ncommand: x\n", "j")
    advice = {A: z(0.9, 4 * 3600), B: z(0.5, 8 * 3600)}
    worth = placement.worths(big, "spot", advice)
    assert 0.001 < worth[A].per_dollar < 0.01
    line = placement.describe(advice[A], worth=worth[A])
    assert f"{worth[A].per_dollar:.3g} useful hours per $" in line and "0.00 useful" not in line


def test_what_placement_weighed_is_what_the_launch_records():
    """The launch's history line and the status's zone scores carry the figure zones were ranked by."""
    s = spec()
    advice = {A: z(0.8, 3600), B: z(0.4, 3 * 3600)}
    st = JobStatus(attempt=0)
    worth = placement.worths(s, "spot", advice)
    assert placement.zone_order(s, "spot", advice) == (B, A, C)
    assert worth[B].value > worth[A].value and worth[B].goodput > worth[A].goodput
    launched = t.begin_attempt(st, s, "p", B, ("j-1",), None, NOW, "submitted", 1, "tok", "spot", advice)
    assert f"expected goodput ~{worth[B].goodput:.0%}" in launched.history[-1].detail
    scores = launched.zone_advice
    assert (scores[B].goodput, scores[B].value) == (worth[B].goodput, worth[B].value)
    assert scores[A].value == worth[A].value and C not in scores
