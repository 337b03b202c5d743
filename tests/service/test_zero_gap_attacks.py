"""Zero-gap recovery (issue 34) as a hostile trainer and an unlucky operator would meet it: each
test here failed before the fix its commit names."""

from __future__ import annotations

from datetime import timedelta

from controller.core import names
from controller.core.ports import InstanceStatus, StopReason
from tests.harness import BUCKET, Harness
from tests.service.test_zero_gap import gos, running


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
