"""A VM record's trainer start (issue 26, Major 5): read where present, absent from an older
agent, garbage ignored without losing the record; carried into the history events the ledger
folds (the loss, the end, RUNNING)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from controller.core.planner import plan_job
from controller.core.ports import BlobInfo, InstanceStatus
from controller.core.state import Phase
from controller.core.world import Record
from tests.unit.test_planner import CTX, NOW, running, view, vm

INFO = BlobInfo("bkt", "preempted-jobs/job", 4, NOW)
BODY = {"instance": "job-1", "attempt": 1, "node": 0, "at": "2026-03-01T11:59:00.000Z", "token": "t",
        "reason": "preempted", "saved": True}


def parse(**fields: object) -> Record:
    return Record.parse(INFO, json.dumps({**BODY, **fields}).encode())


def test_a_records_trainer_start_is_read_as_utc():
    record = parse(trainer_started="2026-03-01T11:02:03.250Z")
    assert record.trainer_started == datetime(2026, 3, 1, 11, 2, 3, 250000, tzinfo=UTC)
    assert parse(trainer_started="2026-03-01T13:02:03+02:00").trainer_started == datetime(2026, 3, 1, 11, 2, 3, tzinfo=UTC)


def test_a_record_without_a_trainer_start_stays_valid():
    record = Record.parse(INFO, json.dumps(BODY).encode())  # an older agent's
    assert (record.attempt, record.detail, record.saved, record.trainer_started) == (1, "preempted", True, None)


@pytest.mark.parametrize("garbage", [
    "2026-03-01T11:02:03",  # no offset: whose clock?
    "yesterday", "", 1767225600, None, True, ["2026-03-01T11:02:03Z"], {"at": 1},
    "9" * 1000, "2026-13-01T00:00:00Z", "0001-01-01T00:00:00+23:59",
])
def test_a_garbage_trainer_start_is_ignored_and_the_record_kept(garbage):
    record = parse(trainer_started=garbage)
    assert record.trainer_started is None
    assert (record.attempt, record.instance, record.token, record.detail) == (1, "job-1", "t", "preempted")


STARTED = NOW - timedelta(minutes=50)


def test_a_marker_with_a_trainer_start_carries_it_into_the_loss_event():
    marker = Record("preempted-jobs/job", 5, NOW, attempt=1, instance="job-1", trainer_started=STARTED)
    actions = plan_job(view(marker=marker), NOW, CTX)
    (lost,) = [e for e in actions[0].status.history if e.event == "preempted"]
    assert lost.trainer_started == STARTED and lost.attempt == 1


def test_an_exit_record_with_a_trainer_start_carries_it_into_the_end():
    done = Record("jobs/job/exit", 5, NOW, attempt=1, exit_code=0, instance="job-1", trainer_started=STARTED)
    actions = plan_job(view(exit=done), NOW, CTX)
    assert actions[0].status.phase == Phase.SUCCEEDED
    assert actions[0].status.history[-1].trainer_started == STARTED


def test_a_heartbeat_names_the_trainer_start_of_a_vm_lost_without_a_word():
    beat = Record("jobs/job/heartbeat", 2, NOW - timedelta(minutes=1), attempt=1, trainer_started=STARTED)
    actions = plan_job(view(heartbeat=beat, instances=(vm("job-1", 1, InstanceStatus.TERMINATED),)), NOW, CTX)
    lost = [e for e in actions[0].status.history if e.attempt == 1 and e.event in ("lost", "preempted")]
    assert lost and lost[-1].trainer_started == STARTED


def test_another_attempts_trainer_start_is_never_taken():
    st = running().but(attempt_token="s3cret")
    forged = Record("jobs/job/exit", 5, NOW, attempt=1, exit_code=0, token="guess", trainer_started=STARTED)
    beat = Record("jobs/job/heartbeat", 2, NOW, attempt=1, token="s3cret")
    actions = plan_job(view(status=st, exit=forged, heartbeat=beat, instances=(vm("job-1", 1, InstanceStatus.TERMINATED),)),
                       NOW, CTX)
    writes = [a.status for a in actions if hasattr(a, "status")]
    assert writes and all(e.trainer_started is None for st in writes for e in st.history)


def test_running_carries_the_trainer_start_when_a_heartbeat_already_says_it():
    st = running(phase=Phase.PROVISIONING)
    beat = Record("jobs/job/heartbeat", 2, NOW, attempt=1, trainer_started=STARTED)
    actions = plan_job(view(status=st, heartbeat=beat), NOW, CTX)
    assert actions[0].status.history[-1].event == "running"
    assert actions[0].status.history[-1].trainer_started == STARTED
