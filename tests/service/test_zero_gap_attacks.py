"""Zero-gap recovery (issue 34) as a hostile trainer and an unlucky operator would meet it: each
test here failed before the fix its commit names."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from controller.core import errors, names
from controller.core.audit import system_event_entry
from controller.core.ports import InstanceStatus, StopReason
from controller.service import bootstrap, functions
from controller.service.config import Settings
from tests.harness import BUCKET, PROJECT, Harness, spec_doc
from tests.service.test_audit import message
from tests.service.test_zero_gap import THREE_ZONES, gos, running


def test_a_notice_seen_only_past_its_bound_is_spent_and_never_cuts_a_later_preemptions_line_short(h: Harness):
    running(h)
    h.notice("a")
    h.advance(seconds=200)  # no pass saw it in time (its event lost, the ticks failing meanwhile)
    h.tick("a")
    assert h.status("a").standby is None and h.live("a") == ["a-1"]
    assert not h.store.exists(BUCKET, names.notice_key("a"))  # it came to nothing: spent
    h.advance(minutes=30)
    h.compute.set_status("a-1", InstanceStatus.STOPPING)  # a real preemption, later, with no notice
    h.compute.causes_of("a-1").append(StopReason.PREEMPTED)
    h.tick("a")
    st = h.status("a")
    assert st.standby is not None and st.standby.until >= h.clock.now() + timedelta(seconds=30)
    h.tick("a")
    assert gos(h) == [] and h.status("a").attempt == 1  # a-1 is still saving: no go yet


def test_a_notice_no_pass_saw_before_a_later_preemption_waits_for_that_vm_as_if_it_began_now(h: Harness):
    running(h)
    h.notice("a")  # comes to nothing, and no pass runs for half an hour (the controller down)
    h.advance(minutes=30)
    h.compute.set_status("a-1", InstanceStatus.STOPPING)  # a real preemption: no second notice comes
    h.compute.causes_of("a-1").append(StopReason.PREEMPTED)
    h.tick("a")
    st = h.status("a")
    assert st.standby is not None and st.standby.until >= h.clock.now() + timedelta(seconds=30)
    h.tick("a")
    assert gos(h) == [] and h.status("a").attempt == 1  # a-1 may still be saving
    h.advance(seconds=36)
    h.tick("a")
    assert gos(h) == ["a-2"]  # its guest is off by now, whatever Compute still says


def test_a_gang_node_whose_go_failed_still_gets_it_after_rank_0_started(h: Harness):
    h.submit("g", spec_doc(zones=THREE_ZONES, nodes=3))
    h.tick()
    h.tick()
    h.notice("g")
    h.tick("g")
    release = h.compute.release

    def flaky(project: str, zone: str, name: str, items: Any, wait: float | None = None) -> bool:
        if name == "g-2-n1":  # one node's setMetadata answers 503 (or the pass dies right there)
            raise errors.TransientError("503 backendError")
        return release(project, zone, name, items, wait)

    h.compute.release = flaky  # type: ignore[method-assign]
    for r in range(3):
        h.compute.preempt(f"g-1-n{r}")
    h.tick("g")
    assert h.metadata("g-2-n0")["respawn-go"] == "2" and "respawn-go" not in h.metadata("g-2-n1")
    h.heartbeat("g", trainer_started=h.clock.now())  # rank 0 got its go and started its trainer
    h.tick("g")  # n1's setMetadata fails again: the gang is not past its line yet
    assert h.status("g").held
    h.compute.release = release  # type: ignore[method-assign]
    h.tick("g")
    h.tick("g")
    assert all(h.metadata(f"g-2-n{r}").get("respawn-go") == "2" for r in range(3))
    assert not h.status("g").held


def test_an_audit_entry_dated_in_the_future_is_never_retried_past_the_age_of_a_true_one(h: Harness):
    """A trainer may write under the System Event log's name (issue 35, item 15), with any timestamp
    Logging takes (up to a day ahead): dated a day ahead, its entry was retried for a day and a half
    while its job's pass met a transient error, not for AUDIT_MAX_AGE."""
    bootstrap.override(h.engine(), Settings(bucket=BUCKET, project=PROJECT))
    h.submit("a")
    h.tick()
    h.tick()
    forged = system_event_entry(PROJECT, h.status("a").zone, "a-1", "", "compute.instances.preempted",
                                h.clock.now() + timedelta(hours=23))
    h.store.faults.fail_next("list", errors.TransientError("503"), times=20)
    assert functions.on_audit(message(forged)) is None  # absorbed: left to the tick


def test_a_standby_steps_back_up_as_the_serial_launch_would(h: Harness):
    """Issue 35, item 19, on the zero-gap path: a job stepped down to Spot whose first model's
    capacity is back past fallback.step_up_after went back up only on a launch after the VM was
    down; a preemption with a notice (a standby) kept it on Spot for ever."""
    h.compute.standard_stockouts.update(THREE_ZONES)
    h.submit("a", spec_doc(zones=THREE_ZONES, provisioning=["standard", "spot"],
                           policy={"zone_cooldown": "1m", "fallback": {"stockouts": 1, "step_up_after": "1h"}}))
    for _ in range(3):
        h.tick()
    assert h.status("a").provisioning == "spot" and h.live("a") == ["a-1"]
    h.compute.standard_stockouts.clear()
    h.advance(hours=2)
    h.heartbeat("a")
    h.tick()
    h.notice("a")
    h.tick("a")
    st = h.status("a")
    assert st.standby is not None and st.standby.provisioning == "standard"
    assert h.compute.request_of(st.standby.instances[0]).provisioning == "standard"
    assert h.metadata("a-2")["respawn-preemption-notice-s"] == "0"  # no notice on a standard VM
    h.compute.preempt("a-1")
    h.tick("a")
    st = h.status("a")
    assert st.attempt == 2 and st.provisioning == "standard" and gos(h) == ["a-2"]


def test_a_standby_stepping_up_into_a_stockout_goes_on_the_current_model_and_parks_that_zone(h: Harness):
    h.compute.standard_stockouts.update(THREE_ZONES)
    h.submit("a", spec_doc(zones=THREE_ZONES, provisioning=["standard", "spot"],
                           policy={"zone_cooldown": "10m", "fallback": {"stockouts": 1, "step_up_after": "1h"}}))
    for _ in range(3):
        h.tick()
    h.advance(hours=2)
    h.heartbeat("a")
    h.tick()
    h.compute.standard_stockouts.clear()
    h.compute.standard_stockouts.add("us-central1-a")  # the model above is back, not in its first zone
    h.notice("a")
    h.tick("a")
    st = h.status("a")
    assert st.standby is not None and st.standby.inserted and st.standby.provisioning == "spot"
    assert h.compute.request_of(st.standby.instances[0]).provisioning == "spot"
    assert st.standby.zone != st.zone  # the preempting zone still last
    assert "us-central1-a" in st.model_cooldowns["standard"] and st.zone_cooldowns == {}


def test_a_standby_stopping_at_its_line_when_the_save_is_in_is_withdrawn_not_given_the_go(h: Harness):
    """A standby Compute is preempting (STOPPING) was promoted and given the go; its agent leaves the
    line without starting: a restart for nothing. It is lost, as one already down is."""
    running(h)
    h.notice("a")
    h.tick("a")
    h.compute.set_status("a-2", InstanceStatus.STOPPING)
    h.compute.causes_of("a-2").append(StopReason.PREEMPTED)
    h.marker("a")  # the old attempt's save is in
    h.compute.preempt("a-1")
    h.tick("a")
    st = h.status("a")
    assert "a-2" not in gos(h) and st.withdrawn == 2
    assert any("a-2 lost at its starting line" in e.detail for e in st.history)
    assert st.attempt == 3 and h.live("a") == ["a-3"]  # the serial launch, in the same pass
