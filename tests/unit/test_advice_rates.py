"""Compute's Spot scores as Google defines them (issue 22): ``preemptionRate`` a fraction 0..1 of
the Spot VMs that stopped which were preempted, ``estimatedUptime`` the majority's run time.
Pure: the placement's words and ranking, and what a status keeps of them."""

from __future__ import annotations

import json
import math

import pytest

from controller.core import placement
from controller.core.ports import ZoneAdvice
from controller.core.spec import parse_spec
from controller.core.state import JobStatus, ZoneScore

A, B = "us-central1-a", "us-central1-b"


def test_a_zones_preemption_rate_is_told_as_the_share_of_stopped_spot_vms_preempted_not_per_day():
    said = placement.describe(ZoneAdvice(0.9, 2 * 86400, 0.25))
    assert "/day" not in said and "a day" not in said
    assert "25% of stopped Spot VMs preempted" in said


@pytest.mark.parametrize("bad", [1.5, 7.0, -0.1, math.nan, math.inf])
def test_a_preemption_rate_outside_0_to_1_ranks_as_unknown_and_is_not_kept(bad):
    spec = parse_spec(f"zones: [{A}, {B}]\nmachine_type: g2-standard-8\ncommand: x\n", "j")
    # Same obtainability and uptime: the rate alone breaks the tie, and nonsense breaks nothing.
    advice = {A: ZoneAdvice(0.9, 86400.0, bad), B: ZoneAdvice(0.9, 86400.0, 0.9)}
    assert placement.zone_order(spec, "spot", advice) == (B, A)
    assert "preempted" not in placement.describe(advice[A])
    raw = json.loads(JobStatus().to_json())
    raw["zone_advice"] = {A: {"obtainability": 0.9, "preemption_rate": bad if math.isfinite(bad) else str(bad)}}
    assert JobStatus.model_validate(raw).zone_advice[A].preemption_rate is None


def test_the_rate_is_a_tie_break_after_obtainability_and_uptime():
    spec = parse_spec(f"zones: [{A}, {B}]\nmachine_type: g2-standard-8\ncommand: x\n", "j")
    advice = {A: ZoneAdvice(0.9, 3 * 86400.0, 1.0), B: ZoneAdvice(0.9, 86400.0, 0.0)}
    assert placement.zone_order(spec, "spot", advice) == (A, B)  # runs longer, whatever share of its stops
    assert ZoneScore(preemption_rate=1.0).preemption_rate == 1.0
