"""A sweep's admission, as the planner decides it (pure): a trial launches only holding one of its
sweep's slots; the others wait QUEUED, never trying a zone; a trial over gives its slot back."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from controller.core.actions import ClaimSlot, ReleaseSlot
from controller.core.launch import LaunchContext
from controller.core.planner import plan_job
from controller.core.spec import parse_spec
from controller.core.state import JobStatus, Phase
from controller.core.world import JobView, Slots
from tests.harness import spec_doc
from tests.unit.test_planner import running, vm

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
CTX = LaunchContext("bkt", "proj-1", "startup", "shutdown")


def trial(job: str = "job", **status) -> JobView:
    spec = parse_spec(yaml.safe_dump(spec_doc(sweep={"name": "lr", "trial": 1, "params": {"lr": "0.1"}})), job)
    st = JobStatus(phase=Phase.PENDING, created_at=NOW - timedelta(minutes=5), spec_generation=1).model_copy(update=status)
    return JobView(job=job, spec=spec, spec_generation=1, status=st, status_generation=3, checkpoint_loaded=True)


def kinds(actions) -> list[str]:
    return [type(a).__name__ for a in actions]


def with_slots(v: JobView, limit: int | None, **holders: int) -> JobView:
    """``holders``: trial -> slot number (the generation is the number plus 10)."""
    return replace(v, slots=Slots("lr", limit, {k: (job, k + 10) for job, k in holders.items()}))


def test_a_trial_with_a_free_slot_claims_it_then_launches():
    actions = plan_job(with_slots(trial(), 2, other=0), NOW, CTX)
    assert kinds(actions) == ["ClaimSlot", "WriteStatus", "CreateInstances", "WriteStatus"]
    assert actions[0] == ClaimSlot("job", "lr", 1, "start") and actions[1].status.phase == Phase.PROVISIONING


def test_a_trial_holding_a_slot_claims_it_again_before_it_launches():
    """Held in a listing that may be older than a release: the claim (create-if-absent, then whose it
    is) says whether it is held now."""
    actions = plan_job(with_slots(trial(), 2, job=1), NOW, CTX)
    assert kinds(actions) == ["ClaimSlot", "WriteStatus", "CreateInstances", "WriteStatus"]
    assert actions[0].k == 1


def test_trials_queued_together_claim_different_free_slots():
    claimed = {plan_job(with_slots(trial(), 4), NOW, CTX)[0].k}
    other = replace(trial(), spec=parse_spec(yaml.safe_dump(spec_doc(sweep={"name": "lr", "trial": 2, "params": {}})),
                                             "job"))
    claimed.add(plan_job(with_slots(other, 4), NOW, CTX)[0].k)
    assert len(claimed) == 2


def test_a_trial_between_attempts_whose_slots_cannot_be_read_keeps_its_phase_and_says_why():
    recovering = replace(trial(**running(phase=Phase.RECOVERING).__dict__), instances=(),
                         slots=Slots("lr", None, {}, problem="503 from GCS"))
    writes = [a for a in plan_job(recovering, NOW, CTX) if hasattr(a, "status")]
    assert writes and all(w.status.phase == Phase.RECOVERING for w in writes)
    assert "503 from GCS" in writes[0].status.message


def test_a_trial_whose_sweep_is_full_waits_queued_said_once_and_never_tries_a_zone():
    actions = plan_job(with_slots(trial(), 2, a=0, b=1), NOW, CTX)
    assert kinds(actions) == ["WriteStatus"]
    queued = actions[0].status
    assert queued.phase == Phase.QUEUED and "all 2 of sweep lr's slots are held" in queued.message
    assert not queued.zone_rejections and queued.attempt == 0 and queued.provisioning == trial().status.provisioning
    assert plan_job(with_slots(trial(**queued.__dict__), 2, a=0, b=1), NOW, CTX) == []
    # A slot comes free: the queued trial claims it and launches.
    assert kinds(plan_job(with_slots(trial(**queued.__dict__), 2, a=0), NOW, CTX)) == [
        "ClaimSlot", "WriteStatus", "CreateInstances", "WriteStatus"]


def test_a_trial_whose_sweep_record_cannot_be_read_waits_and_says_why():
    v = replace(trial(), slots=Slots("lr", None, {}, problem="no gs://bkt/sweeps/lr/sweep.json"))
    (write,) = plan_job(v, NOW, CTX)
    assert write.status.phase == Phase.QUEUED and "no gs://bkt/sweeps/lr/sweep.json" in write.status.message
    assert "respawn sweep submit" in write.status.message


def test_a_trial_over_gives_its_slot_back_once_its_vms_are_gone_and_seen_gone():
    done = running(phase=Phase.SUCCEEDED)
    over = with_slots(trial(**done.__dict__), 2, job=1)
    assert [a for a in plan_job(over, NOW, CTX) if isinstance(a, ReleaseSlot)] == [
        ReleaseSlot("job", "lr", 1, 11, "the trial is over and its VMs are gone")]
    left = replace(over, instances=(vm("job-1", 1),))
    assert not [a for a in plan_job(left, NOW, CTX) if isinstance(a, ReleaseSlot)]  # its VM still holds quota
    blind = replace(over, unreachable=("us-central1-a",))
    assert not [a for a in plan_job(blind, NOW, CTX) if isinstance(a, ReleaseSlot)]  # not seen is not gone


def test_a_running_trial_keeps_one_slot_and_gives_back_another_it_got():
    v = replace(trial(**running().__dict__), slots=Slots("lr", 4, {1: ("job", 11), 3: ("job", 13)}),
                instances=(vm("job-1", 1),))
    releases = [a for a in plan_job(v, NOW, CTX) if isinstance(a, ReleaseSlot)]
    assert releases == [ReleaseSlot("job", "lr", 3, 13, "the trial holds another slot")]


def test_a_job_outside_any_sweep_never_reads_or_claims_a_slot():
    v = replace(trial(), spec=parse_spec(yaml.safe_dump(spec_doc()), "job"), slots=Slots("lr", 1, {0: ("other", 10)}))
    actions = plan_job(v, NOW, CTX)
    assert kinds(actions) == ["WriteStatus", "CreateInstances", "WriteStatus"] and actions[0].status.phase == Phase.PROVISIONING


def test_the_result_a_trainer_reports_with_its_exit_is_kept_bounded_and_said_when_it_is_no_json():
    import json

    from controller.core.ports import BlobInfo
    from controller.core.world import RESULT_MAX_BYTES, Record

    def exit_record(result: str) -> Record:
        body = {"exit_code": 0, "attempt": 1, "instance": "job-1", "token": "t" * 32, "result": result}
        return Record.parse(BlobInfo("bkt", "jobs/job/exit", 9, NOW), json.dumps(body).encode())

    assert exit_record('{"loss": 0.25}').result == '{"loss": 0.25}'
    assert exit_record("x" * (RESULT_MAX_BYTES + 1)).result is None  # past the agent's bound: none
    st = running(attempt_token="t" * 32)
    ended = plan_job(replace(trial(**st.__dict__), exit=exit_record('{"loss": 0.25}'), instances=()), NOW, CTX)[0]
    assert ended.status.phase == Phase.SUCCEEDED and ended.status.result == {"loss": 0.25}
    bad = plan_job(replace(trial(**st.__dict__), exit=exit_record("loss=0.25"), instances=()), NOW, CTX)[0]
    assert bad.status.result["unreadable"].startswith("not JSON")



@pytest.mark.parametrize("text, why", [
    ('{"x": "\\ud800"}', "surrogate"),
    ("[" * 40 + "]" * 40, "nested deeper than 32"),
    ('{"loss": NaN}', "Out of range float"),
])
def test_a_result_no_status_could_keep_is_said_unreadable_and_the_trial_still_succeeds(text, why):
    import json

    from controller.core.ports import BlobInfo
    from controller.core.world import Record

    body = {"exit_code": 0, "attempt": 1, "instance": "job-1", "token": "t" * 32, "result": text}
    record = Record.parse(BlobInfo("bkt", "jobs/job/exit", 9, NOW), json.dumps(body).encode())
    st = running(attempt_token="t" * 32)
    ended = plan_job(replace(trial(**st.__dict__), exit=record, instances=()), NOW, CTX)[0]
    assert ended.status.phase == Phase.SUCCEEDED and why in ended.status.result["unreadable"]
    assert JobStatus.from_json(ended.status.to_json()).result == ended.status.result  # written and read back


def test_an_exit_record_whose_result_is_no_utf8_keeps_its_exit_code():
    from controller.core.ports import BlobInfo
    from controller.core.world import Record

    data = b'{"exit_code": 0, "attempt": 1, "instance": "job-1", "token": "' + b"t" * 32 + b'", "result": "caf\xe9 \xff"}'
    record = Record.parse(BlobInfo("bkt", "jobs/job/exit", 9, NOW), data)
    assert record.exit_code == 0 and record.attempt == 1 and record.result is not None and "\ufffd" in record.result



def test_a_trials_relaunch_reads_its_records_again_first_as_any_jobs_does():
    """An exit 0 that landed since the listing is never lost to a restart: the decision's write, after
    the claim of its slot, asks for the records again."""
    recovering = replace(trial(**running(phase=Phase.RECOVERING).__dict__), instances=(),
                         slots=Slots("lr", 2, {0: ("job", 10)}))
    actions = plan_job(recovering, NOW, CTX)
    assert kinds(actions)[:2] == ["ClaimSlot", "WriteStatus"] and actions[1].needs == frozenset({"records"})


def test_a_trial_moved_to_another_sweep_keeps_the_old_slot_while_the_run_it_admitted_has_vms():
    st = running(sweep="old")
    moved = replace(trial(**st.__dict__), instances=(vm("job-1", 1),),
                    slots=Slots("lr", 2, {}), other_slots=(Slots("old", 2, {0: ("job", 10)}),))
    assert not [a for a in plan_job(moved, NOW, CTX) if isinstance(a, ReleaseSlot)]
    gone = replace(moved, instances=(), status=running(sweep="old", phase=Phase.SUCCEEDED))
    assert [a.sweep for a in plan_job(gone, NOW, CTX) if isinstance(a, ReleaseSlot)] == ["old"]


def test_a_queued_trials_wait_is_not_its_run_time():
    from controller.core.spec import parse_spec as parse

    spec = parse(yaml.safe_dump(spec_doc(sweep={"name": "lr", "trial": 1, "params": {}},
                                         policy={"max_runtime": "1h"})), "job")
    waited = replace(trial(created_at=NOW - timedelta(hours=5), phase=Phase.QUEUED), spec=spec,
                     slots=Slots("lr", 1, {0: ("other", 10)}))
    assert not [a for a in plan_job(waited, NOW, CTX) if getattr(a, "status", None) is not None
                and a.status.phase == Phase.FAILED]


def test_an_exit_0_seen_between_attempts_keeps_the_trials_result():
    import json

    from controller.core.ports import BlobInfo
    from controller.core.world import Record

    body = {"exit_code": 0, "attempt": 1, "instance": "job-1", "token": "t" * 32, "result": '{"loss": 0.1}'}
    record = Record.parse(BlobInfo("bkt", "jobs/job/exit", 9, NOW), json.dumps(body).encode())
    st = running(phase=Phase.RECOVERING, attempt_token="t" * 32)
    ended = plan_job(replace(trial(**st.__dict__), exit=record, instances=(), records_fresh=True), NOW, CTX)[0]
    assert ended.status.phase == Phase.SUCCEEDED and ended.status.result == {"loss": 0.1}
