"""The provisioning list never leaves a job on the wrong model (issue 22, items 7 to 10).

A model Google refuses everywhere moves the job to the next one; a job that stepped down goes
back up when its first model's capacity returns; a queued request that waits too long is
withdrawn and the job steps down; a quota, which is the region's, moves the job to another
region and says which quota ran out.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import yaml

from controller.core import errors
from controller.core import transitions as t
from controller.core.spec import parse_spec
from controller.core.ports import QueuedState
from controller.core.state import JobStatus
from controller.core.state import Phase
from tests.harness import Harness, spec_doc, tpu_spec_doc

ZONES = ["us-central1-a", "us-central1-b"]


def events(h: Harness, job: str) -> list[str]:
    return [e.event for e in h.status(job).history]


def models_inserted(h: Harness) -> list[str]:
    return [h.compute.request_of(name).provisioning for name in h.live()]


# -- item 7: one model refused everywhere ---------------------------------------------------


def test_a_model_refused_in_every_zone_moves_the_job_to_the_next_model():
    h = Harness()
    spot_refused = errors.RequestError("400 SPOT is not supported for this machine type")
    h.compute.faults.fail_next("insert", spot_refused, times=len(ZONES))
    h.submit("j", spec_doc(zones=ZONES, provisioning=["spot", "standard"]))
    h.tick()
    h.tick()
    st = h.status("j")
    assert st.phase in (Phase.PROVISIONING, Phase.RUNNING) and st.provisioning == "standard"
    assert models_inserted(h) == ["standard"]
    assert "refused" in events(h, "j") and "step-down" in events(h, "j")
    assert "spot" in st.refused_models and "SPOT is not supported" in st.refused_models["spot"]


def test_only_a_job_every_model_of_which_is_refused_fails_naming_each_refusal():
    h = Harness()
    h.compute.faults.fail_next("insert", errors.RequestError("400 SPOT is not supported for this machine type"),
                               times=len(ZONES))
    h.compute.faults.fail_next("insert", errors.NotFound("404 machine type a3-megagpu-8g not found"),
                               times=len(ZONES))
    h.submit("j", spec_doc(zones=ZONES, provisioning=["spot", "standard"]))
    h.tick()
    h.tick()
    st = h.status("j")
    assert st.phase == Phase.FAILED and h.live() == []
    assert "refused every model" in st.message
    assert "spot: " in st.message and "SPOT is not supported" in st.message
    assert "standard: " in st.message and "a3-megagpu-8g not found" in st.message


def test_a_refused_model_is_never_stepped_back_up_to_in_the_same_run():
    h = Harness()
    h.compute.faults.fail_next("insert", errors.RequestError("400 SPOT is not supported for this machine type"),
                               times=len(ZONES))
    h.submit("j", spec_doc(zones=ZONES, provisioning=["spot", "standard"],
                           policy={"fallback": {"step_up_after": "1h"}}))
    h.tick()
    h.tick()
    h.advance(hours=2)
    [vm] = h.live()
    h.compute.preempt(vm)
    for _ in range(3):
        h.tick()
    assert h.status("j").provisioning == "standard" and models_inserted(h) == ["standard"]



def test_a_spec_replaced_after_a_refusal_tries_its_models_again_instead_of_waiting_forever():
    # spot refused for the old machine type; the new spec lists spot alone (a machine type Spot
    # supports): the refusal was the old spec's, and the job must not wait on no model at all.
    h = Harness()
    h.compute.faults.fail_next("insert", errors.RequestError("400 SPOT is not supported for this machine type"),
                               times=len(ZONES))
    h.submit("j", spec_doc(zones=ZONES, provisioning=["spot", "standard"]))
    h.tick()
    h.tick()
    assert "spot" in h.status("j").refused_models
    [vm] = h.live()
    h.submit("j", spec_doc(zones=ZONES, machine_type="n1-standard-8", provisioning=["spot"]))
    h.compute.preempt(vm)
    for _ in range(3):
        h.advance(minutes=5)
        h.tick()
    st = h.status("j")
    assert st.provisioning == "spot" and st.attempt == 2 and h.live() == ["j-2"]
    assert h.compute.request_of("j-2").provisioning == "spot" and st.refused_models == {}
    assert "cooling down" not in st.message

# -- item 8: back up a model whose capacity is back -------------------------------------------


def test_a_job_waiting_on_the_lower_models_stockouts_goes_back_up_when_spot_returns():
    h = Harness()
    h.compute.stockouts.update(ZONES)  # nothing at all: spot, then standard, stocked out
    h.submit("j", spec_doc(zones=ZONES, provisioning=["spot", "standard"],
                           policy={"zone_cooldown": "5m", "fallback": {"wait": "20m", "step_up_after": "1h"}}))
    for _ in range(15):  # past fallback.wait: stepped down, and waiting on standard's stockouts
        h.advance(minutes=2)
        h.tick()
    st = h.status("j")
    assert st.provisioning == "standard" and h.live() == [] and "step-down" in events(h, "j")
    stepped = st.model_since
    h.compute.stockouts.clear()
    h.compute.standard_stockouts.update(ZONES)  # Spot capacity is back; on-demand still out
    for _ in range(40):
        h.advance(minutes=2)
        h.tick()
        if h.live():
            break
    st = h.status("j")
    assert models_inserted(h) == ["spot"], "still waiting on standard's stockouts with Spot capacity back"
    assert st.provisioning == "spot" and "step-up" in events(h, "j")
    assert h.clock.now() - stepped >= timedelta(hours=1)  # not before fallback.step_up_after


def test_the_cooldowns_of_the_model_left_behind_are_kept_for_its_return():
    spec = parse_spec(yaml.safe_dump(spec_doc(zones=ZONES, provisioning=["spot", "standard"],
                                              policy={"fallback": {"step_up_after": "1h"}})), "j")
    now = datetime(2026, 1, 1, tzinfo=UTC)
    st = JobStatus(attempt=1, provisioning="spot", zone_cooldowns={ZONES[0]: now + timedelta(minutes=9)})
    down = t.step_down(st, spec, now, "test")
    assert down.provisioning == "standard" and down.zone_cooldowns == {}
    assert down.model_cooldowns == {"spot": {ZONES[0]: now + timedelta(minutes=9)}}
    later = now + timedelta(hours=1)
    assert t.choose(spec, down, later - timedelta(minutes=1), lambda m: ZONES) == ("standard", ZONES[0])
    assert t.choose(spec, down, later, lambda m: ZONES) == ("spot", ZONES[0])  # its cooldown long over


# -- item 9: a queued request that waits too long ----------------------------------------------


def tpu_doc(**overrides):
    tpu = {"type": "v4-16", "runtime_version": "tpu-ubuntu2204-base", "queued": True}
    return tpu_spec_doc(**{"zones": ["us-central2-b"], "tpu": tpu, "provisioning": ["spot", "standard"],
                           "policy": {"fallback": {"wait": "30m"}}, **overrides})


def test_a_queued_spot_tpu_past_fallback_wait_is_withdrawn_and_the_job_steps_down():
    h = Harness()
    h.tpu.stockout("us-central2-b")
    h.submit("tpu", tpu_doc())
    h.tick()
    h.advance(minutes=20)
    h.tick()
    assert h.status("tpu").provisioning == "spot"  # still queued, within fallback.wait
    assert h.tpu.queued_state("tpu-1") == QueuedState.WAITING_FOR_RESOURCES
    h.advance(minutes=11)
    h.tick()
    st = h.status("tpu")
    assert st.provisioning == "standard" and "step-down" in events(h, "tpu")
    assert ("delete", "tpu-1") in h.tpu.calls and st.restarts == 0 and st.failures == 0  # not a loss
    assert "withdrawing tpu-1" in next(e.detail for e in st.history if e.event == "step-down")
    assert "us-central2-b" in st.model_cooldowns["spot"]  # a step back up does not go straight back into that queue
    h.advance(seconds=h.tpu.delete_seconds + 1)  # the queued request gone: the next goes on demand
    h.tick()
    st = h.status("tpu")
    assert st.attempt == 2 and not h.tpu.request_of("tpu-2").spot


def test_a_queued_tpu_with_no_lower_model_waits_in_the_queue():
    h = Harness()
    h.tpu.stockout("us-central2-b")
    h.submit("tpu", tpu_doc(provisioning=["spot"], policy={}))
    h.tick()
    h.advance(hours=3)
    h.tick()
    assert h.status("tpu").attempt == 1 and "step-down" not in events(h, "tpu")
    assert h.tpu.queued_state("tpu-1") == QueuedState.WAITING_FOR_RESOURCES


# -- item 10: a quota is the region's -----------------------------------------------------------


def test_a_quota_error_fails_over_to_another_region_naming_the_quota():
    h = Harness()
    zones = ["us-central1-a", "us-central1-b", "us-east1-b"]
    h.compute.quota_exhausted.add("us-central1-a")  # the region's GPU quota is spent
    h.submit("j", spec_doc(zones=zones, placement="ordered"))
    h.tick()
    st = h.status("j")
    inserts = [c[1] for c in h.compute.calls if c[0] == "insert"]
    assert len(inserts) == 2 and h.live() == ["j-1"] and st.zone == "us-east1-b"
    quota = next(e for e in st.history if e.event == "quota")
    assert "NVIDIA_L4_GPUS" in quota.detail and "region us-central1" in quota.detail
    assert {"us-central1-a", "us-central1-b"} <= set(st.zone_cooldowns)  # both zones of the region, not retried


def test_a_request_rate_limit_is_retried_never_read_as_a_quota_that_cools_the_region_or_steps_down():
    """RATE_LIMIT_EXCEEDED (an operation's error code, read as a QuotaError) limits how fast
    requests come, not how much capacity the region has: retried with backoff in the same
    zone, no zone cooled, the job never stepped down to the pricier model for it."""
    h = Harness()
    h.compute.faults.fail_next("insert", errors.QuotaError(ZONES[0], "RATE_LIMIT_EXCEEDED"), times=len(ZONES))
    h.submit("j", spec_doc(zones=ZONES, provisioning=["spot", "standard"]))
    h.tick()
    assert h.status("j").zone_cooldowns == {} and h.status("j").not_before is not None
    for _ in range(4):
        h.advance(minutes=1)
        h.tick()
    st = h.status("j")
    assert h.live() == ["j-1"] and models_inserted(h) == ["spot"] and st.provisioning == "spot"
    assert "step-down" not in events(h, "j") and st.zone_cooldowns == {}
    assert "request rate limit" in next(e.detail for e in st.history if e.event == "quota")


def test_a_new_spec_that_drops_the_current_model_never_inherits_its_cooldowns():
    """On standard with both zones cooling; the spec is replaced by one listing only spot: the
    standard cooldowns are standard's, and spot starts with none of them."""
    spec = parse_spec(yaml.safe_dump(spec_doc(zones=ZONES, provisioning=["spot"])), "j")
    now = datetime(2026, 1, 1, tzinfo=UTC)
    cooling = {z: now + timedelta(minutes=9) for z in ZONES}
    st = JobStatus(attempt=1, provisioning="standard", zone_cooldowns=cooling)
    nxt = t.begin_attempt(st, spec, "proj-1", ZONES[0], ["j-2"], None, now, "recover", 2, "tok", "spot")
    assert nxt.zone_cooldowns == {} and nxt.model_cooldowns == {"standard": cooling}
    assert nxt.provisioning == "spot" and nxt.model_since == now


@pytest.mark.parametrize("cooldown, tick", [("1m", 1), ("1m", 10), ("5m", 10), ("10m", 3)])
def test_stepping_back_up_never_depends_on_when_passes_land(cooldown, tick):
    """Issue 35, item 19: a job stepped down to standard steps back up once fallback.step_up_after
    has passed and Spot capacity is back, however its zone cooldown and the passes' times fall (a
    one-minute cooldown with the deployed one-minute tick, or a tick every ten minutes)."""
    h = Harness()
    h.compute.stockouts.update(ZONES)
    h.submit("j", spec_doc(zones=ZONES, provisioning=["spot", "standard"],
                           policy={"zone_cooldown": cooldown, "fallback": {"wait": "20m", "step_up_after": "1h"}}))
    for _ in range(60 // tick + 2):
        h.advance(minutes=tick)
        h.tick()
    assert h.status("j").provisioning == "standard" and h.live() == []
    h.compute.stockouts.clear()
    h.compute.standard_stockouts.update(ZONES)  # Spot is back; on-demand still out
    for _ in range(150 // tick + 2):
        h.advance(minutes=tick)
        h.tick()
        if h.live():
            break
    assert models_inserted(h) == ["spot"] and h.status("j").provisioning == "spot"


def test_a_running_job_on_the_lower_model_steps_up_at_its_next_recovery_whenever_its_passes_land():
    h = Harness()
    h.compute.spot_stockouts.update(ZONES)
    h.submit("j", spec_doc(zones=ZONES, provisioning=["spot", "standard"],
                           policy={"zone_cooldown": "1m", "idle_timeout": None,
                                   "fallback": {"stockouts": 1, "step_up_after": "1h"}}))
    for _ in range(3):
        h.tick()
    assert models_inserted(h) == ["standard"]
    h.compute.spot_stockouts.clear()
    h.advance(hours=2)
    h.tick()
    [vm] = h.live()
    h.compute.host_error(vm)
    for _ in range(3):
        h.advance(minutes=10)
        h.tick()
    assert models_inserted(h) == ["spot"]
