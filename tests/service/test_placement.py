"""Capacity-aware placement and the provisioning fallback (issue 9), through the whole
engine over the fakes: which zone and which model each attempt gets, and why."""

from __future__ import annotations

import pytest

from controller.core import errors
from controller.adapters.memory import MemoryAdvisor
from controller.core.state import Phase
from tests.harness import Harness, spec_doc

ZONES = ["us-central1-a", "us-central1-b", "us-central1-c"]


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    harness.advisor = MemoryAdvisor(harness.compute)
    return harness


def zone_of(h: Harness, name: str) -> str:
    return h.compute.request_of(name).zone


def events(h: Harness, job: str = "llm") -> list[str]:
    return [e.event for e in h.status(job).history]


# -- placement ------------------------------------------------------------------------------


def test_spot_jobs_go_where_advice_expects_them_to_run_longest(h):
    h.advisor.rates.update({"us-central1-a": 0.5, "us-central1-b": 0.2, "us-central1-c": 0.01})
    h.submit("llm", spec_doc(zones=ZONES))
    h.tick()
    st = h.status("llm")
    assert zone_of(h, "llm-1") == "us-central1-c"
    launch = next(e for e in st.history if e.event == "launch")
    assert "us-central1-c (spot; obtainability 0.90" in launch.detail and "1% of stopped Spot VMs preempted" in launch.detail
    assert {z: s.preemption_rate for z, s in st.zone_advice.items()} == {
        "us-central1-a": 0.5, "us-central1-b": 0.2, "us-central1-c": 0.01}
    assert st.advice_at is not None


def test_obtainability_comes_before_uptime(h):
    h.advisor.rates.update({"us-central1-a": 0.5, "us-central1-c": 0.01})
    h.compute.spot_stockouts.add("us-central1-c")  # the longest-lived zone has no capacity now
    h.submit("llm", spec_doc(zones=ZONES))
    h.tick()
    assert zone_of(h, "llm-1") == "us-central1-b"  # obtainable, and longer-lived than a
    assert "stockout" not in events(h), "the advice kept it off the stocked-out zone"


def test_a_stockout_in_the_best_ranked_zone_moves_to_the_next_best_not_the_next_listed(h):
    h.advisor.rates.update({"us-central1-a": 0.5, "us-central1-b": 0.02, "us-central1-c": 0.01})
    h.compute.faults.fail_next("insert", errors.CapacityError("us-central1-c", "ZONE_RESOURCE_POOL_EXHAUSTED"))
    h.submit("llm", spec_doc(zones=ZONES))
    h.tick()
    assert zone_of(h, "llm-1") == "us-central1-b"
    assert h.status("llm").zone_cooldowns.keys() == {"us-central1-c"}


def test_ordered_placement_keeps_the_spec_order_and_asks_nothing(h):
    h.advisor.rates.update({"us-central1-a": 0.9})
    h.submit("llm", spec_doc(zones=ZONES, placement="ordered"))
    h.tick()
    assert zone_of(h, "llm-1") == "us-central1-a" and h.advisor.calls == []


def test_standard_jobs_keep_the_spec_order_unless_they_ask_for_capacity_placement(h):
    h.compute.stockouts.add("us-central1-a")
    h.submit("std", spec_doc(zones=ZONES, provisioning="standard"))
    h.submit("cap", spec_doc(zones=ZONES, provisioning="standard", placement="capacity"))
    h.tick()
    assert zone_of(h, "std-1") == "us-central1-b"  # tried a first, got a stockout, moved on
    assert "stockout" in events(h, "std")
    assert zone_of(h, "cap-1") == "us-central1-b" and "stockout" not in events(h, "cap")
    assert [c.model for c in h.advisor.calls] == ["STANDARD"]


@pytest.mark.parametrize("failure", [errors.TransientError("503 backendError"),
                                     errors.RequestError("400 advice is not enabled for this project")])
def test_advice_that_fails_falls_back_to_the_spec_order_and_never_blocks_a_launch(h, failure):
    h.advisor.rates.update({"us-central1-a": 0.9})
    h.advisor.failure = failure
    h.submit("llm", spec_doc(zones=ZONES))
    h.tick()
    st = h.status("llm")
    assert zone_of(h, "llm-1") == "us-central1-a" and st.phase == Phase.PROVISIONING
    assert st.zone_advice == {}


def test_advice_is_asked_once_per_shape_and_region_for_a_whole_pass(h):
    h.workers = 8
    for i in range(30):
        h.submit(f"job-{i}", spec_doc(zones=[*ZONES, "us-east1-b"]))
    h.submit("other", spec_doc(zones=ZONES, machine_type="g2-standard-16"))
    h.tick()
    assert len(h.compute.live()) == 31
    asked = sorted((c.region, c.machine_type) for c in h.advisor.calls)
    assert asked == [("us-central1", "g2-standard-16"), ("us-central1", "g2-standard-8"), ("us-east1", "g2-standard-8")]


def test_advice_changing_between_passes_never_moves_an_attempt_whose_insert_may_have_happened(h):
    h.advisor.rates.update({"us-central1-a": 0.01, "us-central1-b": 0.5})
    h.compute.faults.fail_next("insert", errors.TransientError("connection reset"))  # outcome unknown
    h.submit("llm", spec_doc(zones=ZONES[:2]))
    h.tick()
    st = h.status("llm")
    assert st.zone == "us-central1-a" and not st.inserted
    h.advisor.rates.update({"us-central1-a": 0.9, "us-central1-b": 0.01})  # now b looks better
    h.tick()
    assert zone_of(h, "llm-1") == "us-central1-a" and h.status("llm").inserted


def test_the_next_attempt_is_placed_with_fresh_advice(h):
    h.advisor.rates.update({"us-central1-a": 0.01, "us-central1-b": 0.5})
    h.submit("llm", spec_doc(zones=ZONES[:2]))
    h.tick()
    h.tick()
    assert zone_of(h, "llm-1") == "us-central1-a"
    h.advisor.rates.update({"us-central1-a": 0.9, "us-central1-b": 0.01})
    h.marker("llm")
    h.tick()
    assert zone_of(h, "llm-2") == "us-central1-b"


# -- provisioning fallback ------------------------------------------------------------------


def fallback_doc(**policy) -> dict:
    return spec_doc(zones=ZONES[:2], provisioning=["spot", "standard"],
                    policy={"backoff": {"initial": "30s", "max": "5m"}, "zone_cooldown": "10m",
                            "fallback": {"step_up_after": "1h", **policy}})


def test_spot_steps_down_to_standard_after_a_stockout_in_every_zone_and_says_why(h):
    h.compute.spot_stockouts.update(ZONES[:2])
    h.advisor = None  # the spec's order: each zone is tried (advice would skip the stocked-out ones)
    h.submit("llm", fallback_doc())
    h.tick()
    st = h.status("llm")
    request = h.compute.request_of("llm-1")
    assert request.provisioning == "standard" and not request.spot
    assert st.provisioning == "standard" and st.inserted and st.attempt == 1
    assert events(h).count("stockout") == 2
    down = next(e for e in st.history if e.event == "step-down")
    assert down.detail == "stepping down from spot to standard: 2 capacity errors in a row over 0s"


def test_a_job_steps_back_up_to_spot_at_the_next_recovery_after_step_up_after(h):
    h.compute.spot_stockouts.update(ZONES[:2])
    h.submit("llm", fallback_doc())
    h.tick()
    h.tick()
    assert h.status("llm").phase == Phase.RUNNING and h.status("llm").provisioning == "standard"
    h.compute.spot_stockouts.clear()
    h.advance(minutes=30)
    h.compute.host_error("llm-1")  # a recovery before step_up_after: stays on standard
    h.tick()
    assert h.compute.request_of("llm-2").provisioning == "standard"
    h.tick()
    h.advance(minutes=31)
    h.compute.host_error("llm-2")
    h.tick()
    st = h.status("llm")
    assert h.compute.request_of("llm-3").provisioning == "spot" and st.provisioning == "spot"
    launch = [e for e in st.history if e.event == "launch"][-1]
    assert "stepping back up from standard to spot after 1h1m on standard" in launch.detail
    assert "(spot" in launch.detail


def test_a_long_wait_for_capacity_steps_down_even_before_enough_stockouts(h):
    h.compute.spot_stockouts.add("us-central1-a")
    h.advisor = None
    h.submit("llm", spec_doc(zones=ZONES[:1], provisioning=["spot", "standard"],
                             policy={"zone_cooldown": "10m", "fallback": {"stockouts": 50, "wait": "5m"}}))
    h.tick()
    st = h.status("llm")
    assert st.provisioning is None or st.provisioning == "spot"
    assert not st.inserted and "no zone left" in st.message
    h.advance(minutes=6)
    h.tick()  # still cooling, but waited past fallback.wait
    st = h.status("llm")
    assert st.provisioning == "standard" and st.inserted
    assert h.compute.request_of("llm-1").provisioning == "standard"
    assert "no capacity for 6m" in next(e.detail for e in st.history if e.event == "step-down")


def test_at_the_end_of_the_list_a_job_waits_for_capacity_as_before(h):
    h.compute.stockouts.update(ZONES[:2])  # no capacity of any model
    h.advisor = None
    h.submit("llm", fallback_doc())
    h.tick()
    st = h.status("llm")
    assert st.provisioning == "standard" and not st.inserted and st.not_before is not None
    assert events(h).count("step-down") == 1
    h.advance(minutes=11)
    h.tick()
    assert events(h).count("step-down") == 1 and not h.compute.live()


def test_flex_start_waits_in_pending_and_carries_its_run_limit(h):
    h.compute.stockouts.update(ZONES[:2])
    h.advisor = None
    h.submit("llm", spec_doc(zones=ZONES[:2], provisioning=["standard", "flex-start"],
                             policy={"max_run_duration": "3d", "fallback": {"stockouts": 1}}))
    h.tick()
    request = h.compute.request_of("llm-1")
    assert (request.provisioning, request.termination_action, request.max_run_seconds) == ("flex-start", "delete", 3 * 86400)
    h.tick()
    h.advance(hours=5)
    h.tick()
    st = h.status("llm")
    assert st.phase == Phase.PROVISIONING and h.live("llm") == ["llm-1"], "PENDING is a wait, not a loss"
    h.compute.set_status("llm-1", "RUNNING")
    h.tick()
    assert h.status("llm").phase == Phase.RUNNING


# -- review: advice that fails in ways the adapter did not translate ---------------------------


@pytest.mark.parametrize("failure", [KeyError("recommendations"), ValueError("could not parse the answer"),
                                     TypeError("bad proto field")])
def test_advice_failing_with_any_exception_never_blocks_a_launch(h, failure):
    # A malformed answer (proto/JSON parsing), a credentials library error or a bug in the
    # adapter raises something other than a RespawnError: the zones keep the spec's order.
    h.advisor.failure = failure
    h.submit("llm", spec_doc(zones=ZONES))
    summary = h.tick()
    assert "llm" not in summary.errors
    assert zone_of(h, "llm-1") == "us-central1-a" and h.status("llm").phase == Phase.PROVISIONING


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, 7.0])
def test_advice_scores_out_of_range_are_not_trusted_nor_written(h, bad):
    from controller.core.ports import ZoneAdvice

    class Odd:
        calls: list = []

        def advise(self, shape):
            return {"us-central1-a": ZoneAdvice(bad, bad, bad), "us-central1-b": ZoneAdvice(0.5, 86400.0, 0.1)}

    h.advisor = Odd()
    h.submit("llm", spec_doc(zones=ZONES[:2]))
    h.tick()
    st = h.status("llm")
    assert zone_of(h, "llm-1") == "us-central1-b", "a zone with nonsense scores is not ranked first"
    a = st.zone_advice["us-central1-a"]
    assert a.obtainability is None  # unknown, not a score to show in `respawn status`
    assert all(v is None or 0.0 <= v < float("inf") for v in (a.uptime_s, a.preemption_rate))


def test_a_flex_start_vm_that_waited_long_in_pending_gets_its_startup_grace_once_running(h):
    # The heartbeat grace counted from the insert: after hours in PENDING (longer than
    # startup_grace + idle_timeout), the VM was failed as hung on the first pass after it
    # got capacity, before its trainer could have written one heartbeat.
    h.compute.stockouts.update(ZONES[:2])
    h.advisor = None
    h.submit("llm", spec_doc(zones=ZONES[:2], provisioning=["standard", "flex-start"],
                             policy={"max_run_duration": "3d", "fallback": {"stockouts": 1}}))
    h.tick()
    assert h.compute.request_of("llm-1").provisioning == "flex-start"
    h.tick()
    h.advance(hours=5)
    h.tick()
    h.compute.set_status("llm-1", "RUNNING")
    h.tick()
    assert h.status("llm").phase == Phase.RUNNING
    h.advance(minutes=2)
    h.tick()
    st = h.status("llm")
    assert st.phase == Phase.RUNNING and st.failures == 0 and h.live("llm") == ["llm-1"], st.message
    h.advance(minutes=14)  # still within the startup grace, counted from when it ran
    h.tick()
    assert h.status("llm").failures == 0
    h.advance(minutes=60)  # no heartbeat at all, long after the grace: hung
    h.tick()
    assert h.status("llm").failures == 1


def test_a_launch_its_checkpoint_holds_asks_for_no_advice(h, monkeypatch):
    """The evidence comes first: a checkpoint prefix that cannot be listed holds the launch, and a
    pass that launches nothing asks Compute for nothing (advice costs a request and its client)."""
    h.advisor.rates.update({"us-central1-a": 0.9})
    h.submit("llm", spec_doc(zones=ZONES, checkpoint={"uri": "gs://denied/run"}))
    listing = h.store.list

    def list_(bucket: str, prefix: str, **kwargs):
        if bucket == "denied":
            raise errors.RequestError("gs://denied/run/*: 403 caller does not have storage.objects.list access")
        return listing(bucket, prefix, **kwargs)

    monkeypatch.setattr(h.store, "list", list_)
    h.tick()
    assert h.compute.live() == [] and h.advisor.calls == []
    assert "cannot list checkpoint.uri gs://denied/run" in h.status("llm").message
    monkeypatch.setattr(h.store, "list", listing)
    h.tick()
    launch = next(e for e in h.status("llm").history if e.event == "launch")
    assert [c.machine_type for c in h.advisor.calls] == ["g2-standard-8"] and "obtainability" in launch.detail
