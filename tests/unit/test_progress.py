"""What a respawnkit trainer reports (issue 27, part 2): its step and its saves' durations, read
from the VM agent's records (garbage ignored, the record kept), taken from the current attempt's
own records only, and folded by the ledger into steps lost per loss and the checkpoint cost."""

from __future__ import annotations

import json
import math
from datetime import timedelta

import pytest

from controller.core import accounting, ledger
from controller.core.planner import plan_job
from controller.core.ports import InstanceStatus
from controller.core.state import CheckpointRef, Event, JobStatus, Phase
from controller.core.world import Record
from tests.unit.test_ledger import at, commit, launched
from tests.unit.test_planner import CTX, NOW, running, view, vm
from tests.unit.test_records import BODY, INFO, parse


def test_a_records_progress_is_read():
    record = parse(step=120, save_s=0.41, upload_s=5.8, saved_step=100)
    assert (record.step, record.save_s, record.upload_s, record.saved_step) == (120, 0.41, 5.8, 100)


def test_a_record_without_progress_stays_valid():
    record = Record.parse(INFO, json.dumps(BODY).encode())  # an agent whose trainer reports nothing
    assert (record.attempt, record.step, record.save_s, record.upload_s, record.saved_step) == (1, None, None, None, None)


@pytest.mark.parametrize("garbage", [-1, 1.5, "12", True, None, [3], {"n": 1}, 10**18, 10**300, 1e999, -1e999])
def test_a_garbage_step_is_ignored_and_the_record_kept(garbage):
    record = parse(step=garbage, saved_step=garbage)
    assert (record.step, record.saved_step) == (None, None)
    assert (record.attempt, record.token, record.detail, record.saved) == (1, "t", "preempted", True)


@pytest.mark.parametrize("garbage", [-0.1, "0.4", True, None, [1.0], 8 * 86400, 10**400, 1e999, -1e999])
def test_a_garbage_duration_is_ignored_and_the_record_kept(garbage):
    record = parse(save_s=garbage, upload_s=garbage, step=7)
    assert (record.save_s, record.upload_s, record.step) == (None, None, 7)
    assert (record.attempt, record.token, record.detail) == (1, "t", "preempted")


def test_a_nan_duration_is_ignored_and_the_record_kept():
    record = Record.parse(INFO, b'{"attempt": 1, "token": "t", "save_s": NaN, "upload_s": Infinity, "step": 3}')
    assert (record.save_s, record.upload_s, record.step, record.attempt) == (None, None, 3, 1)


def test_a_marker_carries_the_step_reached_and_the_save_times_into_the_loss_event():
    beat = Record("jobs/job/heartbeat", 2, NOW - timedelta(minutes=1), attempt=1, step=120, save_s=0.3, upload_s=4.0)
    marker = Record("preempted-jobs/job", 5, NOW, attempt=1, instance="job-1", step=131, save_s=0.4)
    actions = plan_job(view(marker=marker, heartbeat=beat), NOW, CTX)
    (lost,) = [e for e in actions[0].status.history if e.event == "preempted"]
    # The furthest step, the newest save's write, and the upload from the record that said it.
    assert (lost.step, lost.save_s, lost.upload_s) == (131, 0.4, 4.0)


def test_a_heartbeat_names_the_step_of_a_vm_lost_without_a_word():
    beat = Record("jobs/job/heartbeat", 2, NOW - timedelta(minutes=1), attempt=1, step=57)
    actions = plan_job(view(heartbeat=beat, instances=(vm("job-1", 1, InstanceStatus.TERMINATED),)), NOW, CTX)
    lost = [e for e in actions[0].status.history if e.attempt == 1 and e.event in ("lost", "preempted")]
    assert lost and lost[-1].step == 57


def test_another_attempts_or_jobs_progress_is_never_taken():
    st = running().but(attempt_token="s3cret")
    forged = Record("preempted-jobs/job", 5, NOW, attempt=1, token="guess", step=10**17, save_s=604800.0)
    beat = Record("jobs/job/heartbeat", 2, NOW, attempt=1, token="s3cret", step=40)
    actions = plan_job(view(status=st, marker=forged, heartbeat=beat,
                            instances=(vm("job-1", 1, InstanceStatus.TERMINATED),)), NOW, CTX)
    events = [e for a in actions if hasattr(a, "status") for e in a.status.history]
    assert events and all(e.step in (None, 40) and e.save_s is None for e in events)


def test_an_exit_record_carries_the_save_times_into_the_end():
    done = Record("jobs/job/exit", 5, NOW, attempt=1, exit_code=0, instance="job-1", step=500, save_s=0.2, upload_s=3.0)
    actions = plan_job(view(exit=done), NOW, CTX)
    assert actions[0].status.phase == Phase.SUCCEEDED
    end = actions[0].status.history[-1]
    assert (end.step, end.save_s, end.upload_s) == (500, 0.2, 3.0)


# -- the ledger ----------------------------------------------------------------------------------

def said(before: JobStatus, minute: float, name: str, **fields) -> JobStatus:
    """``before`` plus one event of its attempt with what its trainer reported, settled."""
    changes = {k: fields.pop(k) for k in list(fields) if k not in ("step", "save_s", "upload_s")}
    e = Event(at=at(minute), event=name, attempt=before.attempt, zone="z1", **fields)
    return accounting.settle(before.but(e, **changes), None)


def running_attempt() -> JobStatus:
    return commit(commit(launched(), (1, "inserted")), (4, "running"), phase=Phase.RUNNING)


def relaunched(st: JobStatus, minute: float, checkpoint: CheckpointRef | None) -> JobStatus:
    return commit(st, (minute, "launch"), attempt=st.attempt + 1, resume_from=checkpoint)


def test_a_loss_keeps_the_step_reached_and_the_replacement_from_step_s_loses_the_difference():
    st = said(running_attempt(), 20, "training", step=80)
    st = said(st, 30, "preempted", step=130, phase=Phase.RECOVERING)
    assert st.ledger.losses[-1].step == 130 and st.ledger.losses[-1].steps_lost is None  # not resumed yet
    st = relaunched(st, 31, CheckpointRef(uri="gs://b/ckpt/step-100/", step=100, saved_at=at(25)))
    (loss,) = st.ledger.losses
    assert (loss.step, loss.resumed_step, loss.steps_lost) == (130, 100, 30)
    assert st.ledger.totals.steps_lost == 30 and ledger.summary(st.ledger, at(40)).steps_lost == 30


def test_steps_lost_add_up_over_losses_and_from_scratch_every_step_is_lost():
    st = said(running_attempt(), 30, "preempted", step=12, phase=Phase.RECOVERING)
    st = relaunched(st, 31, None)  # no checkpoint: from scratch
    st = commit(commit(st, (32, "inserted")), (34, "running"), phase=Phase.RUNNING)
    st = said(st, 50, "preempted", step=70, phase=Phase.RECOVERING)
    st = relaunched(st, 51, CheckpointRef(uri="gs://b/ckpt/step-60/", step=60, saved_at=at(45)))
    assert [loss.steps_lost for loss in st.ledger.losses] == [12, 10]
    assert st.ledger.totals.steps_lost == 22


def test_steps_lost_are_unknown_without_a_reported_step_or_a_checkpoint_step_and_never_negative():
    st = said(running_attempt(), 30, "preempted", phase=Phase.RECOVERING)  # the trainer reported nothing
    st = relaunched(st, 31, CheckpointRef(uri="gs://b/ckpt/step-100/", step=100, saved_at=at(25)))
    assert st.ledger.losses[-1].steps_lost is None
    st = commit(commit(st, (32, "inserted")), (34, "running"), phase=Phase.RUNNING)
    st = said(st, 50, "preempted", step=90, phase=Phase.RECOVERING)
    st = relaunched(st, 51, CheckpointRef(uri="gs://b/ckpt/tag/", step=None, saved_at=at(45)))
    assert st.ledger.losses[-1].steps_lost is None
    st = commit(commit(st, (52, "inserted")), (54, "running"), phase=Phase.RUNNING)
    st = said(st, 60, "preempted", step=5, phase=Phase.RECOVERING)  # behind the checkpoint: a trainer's odd numbering
    st = relaunched(st, 61, CheckpointRef(uri="gs://b/ckpt/step-100/", step=100, saved_at=at(25)))
    assert st.ledger.losses[-1].steps_lost == 0 and st.ledger.totals.steps_lost == 0


def test_the_reported_save_is_the_checkpoint_cost_and_gcs_times_only_a_fallback():
    st = relaunched(said(running_attempt(), 30, "preempted", phase=Phase.RECOVERING), 31,
                    CheckpointRef(uri="gs://b/ckpt/step-100/", step=100, saved_at=at(25), write_s=9.0))
    assert ledger.save_cost(st.ledger) == (9.0, "from GCS times")
    st = commit(commit(st, (32, "inserted")), (34, "running"), phase=Phase.RUNNING)
    st = said(st, 40, "training", save_s=0.4, upload_s=5.8)
    assert ledger.save_cost(st.ledger) == (0.4, "reported by the trainer") and st.ledger.upload_s == 5.8
    # The interval advice weighs the reported save (at least 1 s), not GCS's 9 s: √(2·C·M), M the
    # run's own 26 min RUNNING for its one loss beside the advice's hour worth two.
    m = (1560 + 2 * 3600.0) / 3
    assert ledger.checkpoint_every(st.ledger, 9.0, 3600.0) == pytest.approx(max(60.0, math.sqrt(2 * 1.0 * m)))
    slow = st.ledger.model_copy(update={"save_s": 50.0})
    assert ledger.checkpoint_every(slow, 9.0, 3600.0) == pytest.approx(math.sqrt(2 * 50.0 * m))


def test_the_advice_at_a_relaunch_uses_the_save_the_lost_attempt_reported():
    from controller.core import transitions
    from tests.unit.test_planner import SPEC

    ref = CheckpointRef(uri="gs://b/ckpt/step-100/", step=100, saved_at=at(25), write_s=2.0)

    def relaunch(**reported) -> JobStatus:
        st = said(running_attempt(), 30, "preempted", step=130, phase=Phase.RECOVERING, **reported)
        return transitions.begin_attempt(st, SPEC, "p", "us-central1-a", ["job-2"], ref, at(31), "preempted", 1,
                                         "tok", "spot")

    # M: the run's own 26 min RUNNING per loss; C: the reported 40 s write, else GCS's 2 s.
    assert relaunch(save_s=40.0).checkpoint_every_s == pytest.approx(math.sqrt(2 * 40.0 * 26 * 60))
    assert relaunch().checkpoint_every_s == pytest.approx(math.sqrt(2 * 2.0 * 26 * 60))


@pytest.mark.parametrize("field, value", [("step", -5), ("step", 10**19), ("save_s", math.nan), ("save_s", math.inf),
                                          ("save_s", -1.0), ("upload_s", 10.0**12)])
def test_a_hand_written_events_insane_progress_never_reaches_the_ledger(field, value):
    st = said(running_attempt(), 20, "training", **{field: value})
    assert st.ledger.skipped == 0 and st.ledger.save_s is None and st.ledger.upload_s is None
    assert st.ledger.spans[-1].step is None
    total = ledger.summary(st.ledger, at(30))
    assert total.steps_lost == 0 and all(math.isfinite(x) for x in (total.accelerator_hours, total.useful_hours))


def test_another_attempts_event_never_moves_the_open_attempts_step():
    st = running_attempt()
    stale = Event(at=at(20), event="training", attempt=st.attempt - 1, zone="z1", step=999, save_s=3.0)
    st = accounting.settle(st.but(stale), None)
    assert st.ledger.spans[-1].step is None and st.ledger.save_s is None
