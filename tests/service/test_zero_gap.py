"""Zero-gap recovery (issue 34): the standby boots at the notice, the go comes once the save is in.

The real observer, planner and executor over the in-memory fakes. A VM's agent is played by the
harness: its notice record, its marker, the standby's ready record, the trainer's heartbeat.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from controller.core import errors, names
from controller.core.ports import InstanceStatus, StopReason
from controller.core.state import Phase
from tests.harness import BUCKET, PROJECT, Harness, spec_doc

THREE_ZONES = ["us-central1-a", "us-central1-b", "us-central1-c"]


def running(h: Harness, job: str = "a", **spec: object) -> None:
    h.submit(job, spec_doc(**{"zones": THREE_ZONES, **spec}))
    h.tick()
    h.tick()
    assert h.status(job).phase == Phase.RUNNING, h.status(job).message


def gos(h: Harness) -> list[str]:
    """The VMs the go was set on: what the planner's ReleaseLine did."""
    return [what for op, what in h.compute.calls if op == "release"]


def test_a_notice_boots_the_next_attempt_beside_the_current_one_in_another_zone_held_at_the_line(h: Harness):
    running(h)
    h.notice("a")
    h.tick("a")  # the notice record's event
    st = h.status("a")
    assert st.attempt == 1 and st.phase == Phase.RUNNING and st.standby is not None
    assert st.standby.inserted and st.standby.attempt == 2
    assert h.live("a") == ["a-1", "a-2"]
    assert h.compute.request_of("a-2").zone != h.compute.request_of("a-1").zone  # the preempting zone last
    md = h.metadata("a-2")
    assert md["respawn-hold"] == "1" and md["respawn-attempt"] == "2" and "respawn-go" not in md
    assert md["respawn-resume-from"] == ""  # the checkpoint comes with the go, never before
    assert md["respawn-token"] == st.standby.token != st.attempt_token
    assert any(e.event == "standby" for e in st.history)


def test_the_go_waits_for_the_old_attempts_save_and_carries_the_newest_checkpoint_then(h: Harness):
    running(h)
    h.checkpoint(10)
    h.notice("a")
    h.tick("a")
    h.ready("a")
    h.tick("a")  # the standby at the line; a-1 still RUNNING and saving
    assert gos(h) == [] and h.status("a").attempt == 1
    h.checkpoint(20)  # the save the notice asked for lands
    h.compute.set_status("a-1", InstanceStatus.STOPPING)  # the soft-off
    h.marker("a")  # the shutdown script: its trainer exited, its save is in
    h.tick("a")
    st = h.status("a")
    assert st.attempt == 2 and st.held and st.go_at is not None and st.standby is None
    assert st.resume_from is not None and st.resume_from.step == 20
    assert gos(h) == ["a-2"]
    md = h.metadata("a-2")
    assert md["respawn-go"] == "2" and md["respawn-resume-from"] == "gs://ckpts/run/20"
    assert st.preemptions == 1 and st.failures == 0
    assert not h.store.exists(BUCKET, names.marker_key("a")) and not h.store.exists(BUCKET, names.notice_key("a"))


def test_a_hard_preemption_after_the_notice_gives_the_go_once_the_vm_is_terminated(h: Harness):
    running(h)
    h.notice("a")
    h.tick("a")
    h.compute.set_status("a-1", InstanceStatus.STOPPING)
    h.tick("a")
    assert gos(h) == []  # on its way down, no marker: its trainer may still be saving
    h.compute.preempt("a-1")  # TERMINATED, no marker ever
    h.tick("a")
    assert h.status("a").attempt == 2 and gos(h) == ["a-2"]


def test_a_vm_stuck_stopping_past_the_lines_bound_is_no_longer_waited_for(h: Harness):
    running(h)
    h.notice("a")
    h.tick("a")
    h.compute.set_status("a-1", InstanceStatus.STOPPING)
    h.advance(seconds=120 + 30)  # the notice, the shutdown: Compute still says STOPPING
    h.tick("a")
    assert gos(h) == []
    h.advance(seconds=6)  # past the bound: the guest is off, whatever the status says
    h.tick("a")
    assert h.status("a").attempt == 2 and gos(h) == ["a-2"]


def test_a_notice_after_which_no_preemption_comes_leaves_one_vm_not_two(h: Harness):
    running(h)
    h.notice("a")
    h.tick("a")
    assert h.live("a") == ["a-1", "a-2"]
    h.advance(seconds=120 + 36)  # a-1 still RUNNING past the line's bound (the notice came to nothing)
    h.tick("a")
    st = h.status("a")
    assert h.live("a") == ["a-1"] and st.attempt == 1 and st.standby is None and st.withdrawn == 2
    assert st.restarts == 0 and st.preemptions == 0
    assert not h.store.exists(BUCKET, names.notice_key("a"))  # spent: it launches nothing again
    h.tick()
    assert h.live("a") == ["a-1"]
    h.compute.preempt("a-1")  # a real preemption later: the next attempt never reuses number 2
    h.tick()
    st = h.status("a")
    assert st.attempt == 3 and h.live("a") == ["a-3"]
    assert [e.instance for e in st.history if e.event == "launch"][-1] == "a-3"  # never the withdrawn a-2's name


def test_a_held_attempt_at_its_line_is_not_hung_while_its_ready_records_come_and_a_silent_one_is_a_restart(h: Harness):
    running(h, policy={"startup_grace": "2m", "idle_timeout": "10m"})
    h.notice("a")
    h.tick("a")
    h.compute.preempt("a-1")
    h.compute.faults.fail_next("release", errors.TransientError("503"), times=100)  # the go never lands
    h.tick("a")
    for _ in range(4):  # 20 minutes at its line, its agent still writing ready records
        h.advance(minutes=5)
        h.ready("a", token=h.status("a").attempt_token)
        h.tick("a")
    st = h.status("a")
    assert st.attempt == 2 and st.held and st.failures == 0 and st.restarts == 1
    h.advance(minutes=20)  # silent: its agent is gone
    h.tick("a")
    st = h.status("a")
    assert st.failures == 0 and st.restarts == 2
    assert any(e.event == "lost" and "no trainer past the starting line" in e.detail for e in st.history)


@pytest.mark.parametrize("how", ["forged", "stale", "maintenance"])
def test_a_forged_or_stale_notice_or_a_maintenance_notice_launches_nothing(h: Harness, how: str):
    running(h)
    if how == "forged":
        h.notice("a", token="not-the-secret")
    elif how == "stale":
        h.notice("a", attempt=0)
    else:
        h.notice("a", reason="maintenance")  # up to an hour ahead on GPU VMs: its marker says when
    h.tick("a")
    h.tick()
    assert h.live("a") == ["a-1"] and h.status("a").standby is None


def test_a_duplicated_or_late_notice_changes_nothing_once_the_standby_is_there(h: Harness):
    running(h)
    h.notice("a")
    h.tick("a")
    inserts = [c for c in h.compute.calls if c[0] == "insert"]
    generation = h.store.read(BUCKET, names.status_key("a")).info.generation
    h.notice("a")  # written again (a second agent run, a retried upload)
    h.tick("a")
    h.race("a")
    assert [c for c in h.compute.calls if c[0] == "insert"] == inserts
    assert h.store.read(BUCKET, names.status_key("a")).info.generation == generation


def test_concurrent_passes_on_one_notice_make_one_standby(h: Harness):
    running(h)
    h.notice("a")
    h.race("a", passes=6)
    h.tick()
    assert h.live("a") == ["a-1", "a-2"] and h.status("a").standby is not None


def test_compute_preempting_a_vm_boots_the_standby_at_once_without_any_notice(h: Harness):
    running(h)
    h.compute.set_status("a-1", InstanceStatus.STOPPING)
    h.compute.causes_of("a-1").append(StopReason.PREEMPTED)  # Compute's own record: the soft-off began
    h.tick("a")
    st = h.status("a")
    assert st.standby is not None and st.standby.inserted and h.live("a") == ["a-2"]  # a-1 is STOPPING
    assert st.standby.until <= h.clock.now() + timedelta(seconds=35)


def test_a_standby_refused_for_quota_that_this_jobs_own_vm_holds_waits_for_it_with_no_cooldown(h: Harness):
    running(h)
    h.compute.quota_exhausted.add("us-central1-a")  # the region's GPUs: a-1 holds them
    h.notice("a")
    h.tick("a")
    st = h.status("a")
    assert st.standby is None and st.zone_cooldowns == {} and "held by this job's own a-1" in st.message
    h.compute.preempt("a-1")
    h.compute.quota_exhausted.clear()  # a-1 is down: its quota is free
    h.tick()
    assert h.status("a").attempt == 3 and h.live("a") == ["a-3"]  # the serial path, no region cooldown


def test_an_insert_refused_for_quota_held_by_the_jobs_own_vm_going_down_is_retried_once_it_is_down(h: Harness):
    running(h, zones=["us-central1-a"])
    h.compute.set_status("a-1", InstanceStatus.STOPPING)
    h.marker("a")  # its work is saved: the next attempt need not wait for it to be down
    h.compute.quota_exhausted.add("us-central1-a")
    h.tick("a")
    st = h.status("a")
    assert st.quota_held_by == ("a-1",) and st.zone_cooldowns == {} and st.not_before is not None
    h.compute.preempt("a-1")  # TERMINATED: its GPUs go back to the region
    h.compute.quota_exhausted.clear()
    h.tick("a")  # long before the backoff ends
    assert h.live("a") == [f"a-{h.status('a').attempt}"] and h.status("a").phase != Phase.RECOVERING


def test_a_project_that_refuses_the_notice_field_runs_without_it_said_once(h: Harness):
    h.compute.refuse_notice = True
    h.submit("a", spec_doc(zones=THREE_ZONES))
    h.tick()
    st = h.status("a")
    assert h.live("a") == ["a-1"] and st.notice_refused and st.notice_s == 0
    assert h.compute.request_of("a-1").preemption_notice_s == 0
    assert [e.event for e in st.history].count("notice-refused") == 1
    h.compute.preempt("a-1")
    h.tick()
    assert h.compute.request_of("a-2").preemption_notice_s == 0  # never asked again in this run
    assert [e.event for e in h.status("a").history].count("notice-refused") == 1
    # The tick's summary (what respawn/controller.json keeps for respawn doctor) names the project.
    assert "preemptionNoticeDuration" in h.tick().as_dict()["notice_refused"][PROJECT]


def test_spot_vms_ask_for_the_120_s_notice_by_default_and_0s_asks_for_none(h: Harness):
    h.submit("a", spec_doc())
    h.submit("b", spec_doc(preemption_notice="0s"))
    h.submit("c", spec_doc(provisioning="standard"))
    h.tick()
    assert [h.compute.request_of(n).preemption_notice_s for n in ("a-1", "b-1", "c-1")] == [120, 0, 0]
    assert h.metadata("a-1")["respawn-preemption-notice-s"] == "120" and h.metadata("a-1")["respawn-hold"] == ""


def test_a_gang_waits_at_the_line_as_one_and_gets_the_go_once_every_old_node_is_down(h: Harness):
    h.submit("g", spec_doc(zones=THREE_ZONES, nodes=3))
    h.tick()
    h.tick()
    h.notice("g")
    h.tick("g")
    assert h.live("g") == [*(f"g-1-n{r}" for r in range(3)), *(f"g-2-n{r}" for r in range(3))]
    h.compute.preempt("g-1-n0")
    h.tick("g")
    # The other two old nodes were still running: deleted first (the fake's deletes are done at
    # once), and only once they were gone did the new gang get its go, every node of it.
    calls = [c for c in h.compute.calls if c[0] in ("delete", "release")]
    assert calls == [("delete", "g-1-n1"), ("delete", "g-1-n2"), *(("release", f"g-2-n{r}") for r in range(3))]
    assert all(h.metadata(f"g-2-n{r}")["respawn-go"] == "2" for r in range(3))
    # The preempted husk bills no machine: it waits for the tick, not this event's mutations.
    assert "g-1-n0" in [i.name for i in h.compute.all()]
    before = len(h.compute.calls)
    h.tick()
    assert ("delete", "g-1-n0") in h.compute.calls[before:]
    assert "g-1-n0" not in [i.name for i in h.compute.all()]


def test_a_crash_between_the_commit_and_the_go_is_given_the_go_by_the_next_pass_once(h: Harness):
    running(h)
    h.notice("a")
    h.tick("a")
    h.compute.preempt("a-1")
    h.compute.faults.fail_next("release", errors.TransientError("503 backendError"))
    h.tick("a")
    assert h.status("a").attempt == 2 and "respawn-go" not in h.metadata("a-2")
    h.tick("a")
    assert h.metadata("a-2")["respawn-go"] == "2"
    h.tick("a")  # given again (a no-op) until its trainer says it started
    assert gos(h).count("a-2") >= 2 and h.status("a").held
    h.heartbeat("a", trainer_started=h.clock.now())
    h.tick("a")
    calls = gos(h)
    h.tick("a")
    st = h.status("a")
    assert st.phase == Phase.RUNNING and not st.held and gos(h) == calls
    assert [e.event for e in st.history][-1] == "training" and st.history[-1].trainer_started is not None


def test_a_go_once_given_is_never_changed_even_if_a_newer_checkpoint_lands(h: Harness):
    running(h)
    h.checkpoint(10)
    h.notice("a")
    h.tick("a")
    h.compute.preempt("a-1")
    h.tick("a")
    assert h.metadata("a-2")["respawn-resume-from"] == "gs://ckpts/run/10"
    h.checkpoint(30)
    h.tick("a")
    assert h.metadata("a-2")["respawn-resume-from"] == "gs://ckpts/run/10"


def test_a_failure_of_the_old_attempt_withdraws_the_standby(h: Harness):
    running(h)
    h.notice("a")
    h.tick("a")
    h.exit("a", 1)  # the trainer crashed during the notice: a failure, restarted after its backoff
    h.tick("a")
    st = h.status("a")
    assert st.failures == 1 and st.standby is None and h.live("a") == []


def test_an_exit_0_during_the_notice_ends_the_job_and_deletes_the_standby(h: Harness):
    running(h)
    h.notice("a")
    h.tick("a")
    h.exit("a", 0)
    h.tick("a")
    assert h.status("a").phase == Phase.SUCCEEDED and h.live("a") == [] and h.status("a").standby is None


def test_a_standby_stocked_out_moves_to_the_next_zone(h: Harness):
    running(h)
    zone = h.compute.request_of("a-1").zone
    first = next(z for z in THREE_ZONES if z != zone)
    h.compute.stockouts.add(first)
    h.notice("a")
    h.tick("a")
    st = h.status("a")
    assert st.standby is not None and st.standby.inserted and st.standby.zone not in (first,)
    assert first in st.zone_cooldowns


def test_a_standby_preempted_at_its_line_is_withdrawn_and_the_recovery_goes_on_without_it(h: Harness):
    running(h)
    h.notice("a")
    h.tick("a")
    h.compute.preempt("a-2")  # the standby's own zone reclaims it while it waits
    h.tick("a")
    st = h.status("a")
    assert st.standby is None and st.withdrawn == 2 and "a-2 lost at its starting line" in st.message
    h.marker("a")
    h.compute.preempt("a-1")
    h.tick("a")
    assert h.status("a").attempt == 3 and h.live("a") == ["a-3"]


def test_a_notice_the_standby_itself_gets_withdraws_it_and_is_never_taken_for_stale_first(h: Harness):
    running(h)
    h.notice("a")
    h.tick("a")
    sb = h.status("a").standby
    h.store.put(BUCKET, names.notice_key("a"), json.dumps(
        {"instance": "a-2", "attempt": 2, "node": 0, "reason": "preempted", "token": sb.token}))
    h.tick("a")
    st = h.status("a")
    assert st.standby is None and "a-2 got a preemption notice at its starting line" in st.message
    assert "a-2" not in h.live("a") and not h.store.exists(BUCKET, names.notice_key("a"))


def test_the_ledger_bills_a_standby_from_its_acceptance_and_its_time_at_the_line_as_boot(h: Harness):
    running(h)
    h.notice("a")
    h.tick("a")
    accepted = h.status("a").standby.inserted_at
    h.advance(seconds=100)
    h.compute.preempt("a-1")
    h.tick("a")
    h.advance(seconds=20)
    h.heartbeat("a", trainer_started=h.clock.now())
    h.tick("a")
    book = h.status("a").ledger
    new = book.spans[-1]
    assert new.attempt == 2 and new.inserted == accepted and new.start == accepted
    loss = book.losses[-1]
    assert loss.running_at is not None and loss.recovery_s is not None and loss.recovery_s <= 21
    assert new.trainer_started is not None  # its boot: from acceptance (at the notice) to the go's trainer start


def test_a_withdrawn_standby_is_paid_for_and_counted_as_boot(h: Harness):
    running(h)
    before = h.status("a").ledger.totals.paid_acc_s
    h.notice("a")
    h.tick("a")
    h.advance(seconds=156)
    h.tick("a")
    totals = h.status("a").ledger.totals
    assert h.status("a").standby is None
    assert totals.paid_acc_s - before == pytest.approx(156) and totals.boot_acc_s == pytest.approx(156)
    assert totals.cost > 0


def test_a_notice_written_before_the_status_says_inserted_is_not_consumed_by_the_insert(h: Harness):
    """Found by respawn canary: a pass that asks Compute again for an attempt whose 'inserted' write
    was lost deleted every record, the new VM's own notice among them (no standby; the recovery
    waited for the marker). Only the records of earlier attempts are consumed."""
    running(h)
    st = h.status("a")
    h.store.put(BUCKET, names.status_key("a"), st.but(inserted=False, inserted_at=None).to_json())
    h.notice("a")  # a-1's agent: instance/preempted turned TRUE
    h.tick("a")  # Compute is asked again for a-1 (same request id), and the notice is acted on
    assert h.store.exists(BUCKET, names.notice_key("a"))
    h.tick("a")
    st = h.status("a")
    assert st.standby is not None and st.standby.attempt == 2 and h.live("a") == ["a-1", "a-2"]
