"""The planner alone: plain values in, actions out, no fakes and no clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from controller.core import names
from controller.core.actions import CreateInstances, DeleteInstance, DeleteRecord, WriteStatus
from controller.core.launch import LaunchContext
from controller.core.planner import plan_job
from controller.core.ports import Instance, InstanceStatus, StopReason
from controller.core.spec import parse_spec
from controller.core.state import JobStatus, Phase
from controller.core.world import JobView, Record
from tests.harness import spec_doc

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
CTX = LaunchContext("bkt", "proj-1", "startup", "shutdown")
SPEC = parse_spec(yaml.safe_dump(spec_doc()), "job")


def vm(name: str, attempt: int, status: InstanceStatus = InstanceStatus.RUNNING, managed: bool = True,
       job: str = "job", age: timedelta = timedelta(hours=1)) -> Instance:
    labels = {names.JOB_LABEL: job, names.ATTEMPT_LABEL: str(attempt)}
    if managed:
        labels[names.MANAGED_LABEL] = "true"
    return Instance("proj-1", "us-central1-a", name, status, labels, NOW - age)


def running(attempt: int = 1, **changes) -> JobStatus:
    base = JobStatus(phase=Phase.RUNNING, attempt=attempt, project="proj-1", zone="us-central1-a",
                     instances=(f"job-{attempt}",), inserted=True, created_at=NOW - timedelta(hours=2),
                     started_at=NOW - timedelta(hours=2), attempt_started_at=NOW - timedelta(hours=1),
                     spec_generation=1)
    return base.model_copy(update=changes)


def view(**kw) -> JobView:
    beat = Record("jobs/job/heartbeat", 2, NOW - timedelta(minutes=1), attempt=1)
    defaults = dict(job="job", spec=SPEC, spec_generation=1, status=running(), status_generation=7,
                    instances=(vm("job-1", 1),), heartbeat=beat)
    return JobView(**{**defaults, **kw})


def kinds(actions) -> list[str]:
    return [type(a).__name__ for a in actions]


def test_does_nothing_when_converged():
    assert plan_job(view(), NOW, CTX) == []


def test_first_action_of_a_decision_is_the_status_commit():
    record = Record("preempted-jobs/job", 5, NOW, attempt=1, instance="job-1")
    # The VM is still up: commit the decision, delete it (its SIGTERM save lands), replan.
    actions = plan_job(view(marker=record), NOW, CTX)
    assert kinds(actions) == ["WriteStatus", "DeleteInstance"]
    assert actions[0].status.phase == Phase.RECOVERING and actions[0].replan
    # Once it is gone: commit the next attempt, insert it, and only then consume the marker.
    actions = plan_job(view(marker=record, status=actions[0].status, instances=()), NOW, CTX)
    assert kinds(actions) == ["WriteStatus", "CreateInstances", "WriteStatus", "DeleteRecord"]
    assert actions[0].status.attempt == 2 and actions[2].status.inserted
    assert actions[-1] == DeleteRecord("job", "preempted-jobs/job", 5, "acted on by attempt 2")


@pytest.mark.parametrize("settling", [InstanceStatus.STOPPING, InstanceStatus.PENDING_STOP, InstanceStatus.UNKNOWN])
def test_a_vm_going_down_whose_marker_says_its_work_is_done_is_not_waited_for(settling):
    """The marker is written once the trainer exited (its save landed) or at the deadline:
    the replacement goes in the same pass (the event's), not a tick later; the husk's delete
    comes after the insert."""
    record = Record("preempted-jobs/job", 5, NOW, attempt=1, instance="job-1")
    actions = plan_job(view(marker=record, instances=(vm("job-1", 1, settling),)), NOW, CTX)
    assert kinds(actions)[:2] == ["WriteStatus", "CreateInstances"] and actions[0].status.attempt == 2
    assert [a.name for a in actions if isinstance(a, DeleteInstance)] == ["job-1"]
    # A VM still alive is always waited for (never two live attempts), marker or not.
    actions = plan_job(view(marker=record, instances=(vm("job-1", 1),)), NOW, CTX)
    assert kinds(actions) == ["WriteStatus", "DeleteInstance"]
    # A marker of another VM (a gang's rank 0) says nothing of this one: it may still be saving.
    other = Record("preempted-jobs/job", 5, NOW, attempt=1, instance="job-1-w1")
    actions = plan_job(view(marker=other, instances=(vm("job-1", 1, settling),)), NOW, CTX)
    assert "CreateInstances" not in kinds(actions)


@pytest.mark.parametrize(
    "reason, counted",
    [
        (StopReason.PREEMPTED, dict(preemptions=1, failures=0, restarts=1)),
        (StopReason.STOPPED, dict(preemptions=0, failures=0, restarts=1)),
        (StopReason.UNKNOWN, dict(preemptions=0, failures=0, restarts=1)),
        (StopReason.CRASHED, dict(preemptions=0, failures=1, restarts=1)),
    ],
)
@pytest.mark.parametrize("gone", [True, False], ids=["missing", "terminated"])
def test_lost_vm_counted_against_the_right_budget(reason, counted, gone):
    instances = () if gone else (vm("job-1", 1, InstanceStatus.TERMINATED),)
    actions = plan_job(view(instances=instances, stop_reasons={"job-1": reason}), NOW, CTX)
    status = actions[0].status
    assert {k: getattr(status, k) for k in counted} == counted


@pytest.mark.parametrize("reason", [StopReason.PREEMPTED, StopReason.STOPPED])
@pytest.mark.parametrize("after", [timedelta(seconds=-40), timedelta(0), timedelta(seconds=5)],
                         ids=["earlier", "same", "later"])
def test_a_loss_no_vm_told_of_carries_computes_record_time_unless_it_is_past_the_pass(reason, after):
    """Compute's record is when the loss was (the ledger's loss time); a time past the pass's own
    (a skewed clock) is never taken for it."""
    recorded = NOW + after
    seen = view(instances=(vm("job-1", 1, InstanceStatus.TERMINATED),), stop_reasons={"job-1": reason},
                stopped_at={"job-1": recorded})
    (lost,) = [e for e in plan_job(seen, NOW, CTX)[0].status.history if e.attempt == 1 and e.event in ("preempted", "lost")]
    assert (lost.since, lost.recorded) == (None, recorded if after <= timedelta(0) else None)


@pytest.mark.parametrize("settling", [InstanceStatus.STOPPING, InstanceStatus.REPAIRING, InstanceStatus.PENDING_STOP,
                                      InstanceStatus.DEPROVISIONING, InstanceStatus.UNKNOWN])
def test_settling_vm_is_waited_for_and_said_once(settling):
    actions = plan_job(view(instances=(vm("job-1", 1, settling),)), NOW, CTX)
    assert kinds(actions) == ["WriteStatus"] and f"job-1 is {settling}" in actions[0].status.message
    said = view(instances=(vm("job-1", 1, settling),), status=actions[0].status)
    assert plan_job(said, NOW, CTX) == []


def test_status_behind_instances_adopts_instead_of_launching():
    actions = plan_job(view(instances=(vm("job-1", 1), vm("job-2", 2))), NOW, CTX)
    assert kinds(actions) == ["WriteStatus"] and actions[0].status.attempt == 2


def test_provisioning_not_inserted_reinserts_same_attempt_with_same_request_id():
    st = running(phase=Phase.PROVISIONING, inserted=False)
    first = plan_job(view(status=st, instances=()), NOW, CTX)
    again = plan_job(view(status=st, instances=()), NOW + timedelta(minutes=1), CTX)
    creates = [a for a in first + again if isinstance(a, CreateInstances)]
    assert len(creates) == 2 and creates[0].request_id == creates[1].request_id
    assert creates[0].requests[0].name == "job-1"


def test_records_of_the_current_attempt_are_not_acted_on_twice_while_recovering():
    st = running(phase=Phase.RECOVERING, failures=1, not_before=NOW + timedelta(minutes=1))
    exit_record = Record("jobs/job/exit", 3, NOW, attempt=1, exit_code=1)
    assert plan_job(view(status=st, instances=(), exit=exit_record), NOW, CTX) == []


def test_unreadable_record_belongs_to_no_attempt():
    # A GCS upload lands whole or not at all, so a record that cannot be read was not
    # written by a VM agent: it is never acted on, only cleaned up.
    st = running()
    garbage = Record("preempted-jobs/job", 3, st.attempt_started_at + timedelta(seconds=1))
    assert not garbage.belongs_to(st)


@pytest.mark.parametrize("token, belongs", [("s3cret", True), ("guess", False), (None, False)])
def test_record_needs_the_attempts_secret(token, belongs):
    st = running().but(attempt_token="s3cret")
    record = Record("jobs/job/exit", 3, NOW, attempt=st.attempt, exit_code=0, token=token)
    assert record.belongs_to(st) is belongs


statuses = st.builds(
    JobStatus,
    phase=st.sampled_from(list(Phase)),
    attempt=st.integers(0, 4),
    inserted=st.booleans(),
    project=st.just("proj-1"),
    zone=st.sampled_from(["us-central1-a", "us-central1-b"]),
    instances=st.just(("job-1",)),
    spec_generation=st.sampled_from([1, 2]),
    created_at=st.just(NOW - timedelta(days=3)),
    attempt_started_at=st.just(NOW - timedelta(hours=5)),
)
instances = st.builds(
    vm,
    name=st.sampled_from(["job-1", "job-2", "job-3", "x"]),
    attempt=st.integers(0, 5),
    status=st.sampled_from(list(InstanceStatus)),
    managed=st.booleans(),
    job=st.sampled_from(["job", "other"]),
    age=st.timedeltas(timedelta(0), timedelta(days=5)),
)
records = st.none() | st.builds(Record, key=st.just("preempted-jobs/job"), generation=st.just(1),
                                updated=st.just(NOW), attempt=st.none() | st.integers(0, 4),
                                exit_code=st.none() | st.integers(0, 2))


@settings(max_examples=400, deadline=None)
@given(
    status=st.none() | statuses,
    found=st.lists(instances, max_size=5),
    has_spec=st.booleans(),
    cancelled=st.booleans(),
    marker=records,
    exit_record=records,
    reasons=st.dictionaries(st.sampled_from(["job-1", "job-2"]), st.sampled_from(list(StopReason))),
)
def test_never_deletes_an_unlabelled_instance(status, found, has_spec, cancelled, marker, exit_record, reasons):
    v = JobView(job="job", spec=SPEC if has_spec else None, spec_generation=1, cancelled=cancelled,
                status=status, status_generation=3, instances=tuple(found), marker=marker, exit=exit_record,
                stop_reasons=reasons)
    actions = plan_job(v, NOW, CTX)
    unlabelled = {i.name for i in found if not i.managed or i.job != "job"}
    deleted = {a.name for a in actions if isinstance(a, DeleteInstance)}
    assert not deleted & (unlabelled - {i.name for i in found if i.managed and i.job == "job"})
    # and every chain that changes anything in Compute commits its status first, or is cleanup
    writes = [i for i, a in enumerate(actions) if isinstance(a, WriteStatus)]
    creates = [i for i, a in enumerate(actions) if isinstance(a, CreateInstances)]
    assert all(c > min(writes, default=-1) or (status and not status.inserted) for c in creates)


# -- TPU nodes: every state and health Google may send, and one added later ------------------

TPU_SPEC = parse_spec(yaml.safe_dump({**{k: v for k, v in spec_doc().items() if k != "machine_type"},
                                      "zones": ["us-central2-b"],
                                      "tpu": {"type": "v4-16", "runtime_version": "tpu-ubuntu2204-base"}}), "job")


def tpu_node(state: str, health: str = "HEALTHY", attempt: int = 1) -> Instance:
    from controller.core.ports import NodeHealth, NodeState, TpuNode

    labels = {names.JOB_LABEL: "job", names.ATTEMPT_LABEL: str(attempt), names.MANAGED_LABEL: "true"}
    return TpuNode("proj-1", "us-central2-b", f"job-{attempt}", NodeState.of(state), NodeHealth.of(health),
                   labels, NOW - timedelta(hours=1), "v4-16", True).as_instance()


def tpu_view(node: Instance | None, **kw) -> JobView:
    st = running(zone="us-central2-b", tpu=True)
    seen = () if node is None else (node,)
    # What Observer._stop_reason gives a TPU node that is down or gone: its own state's cause.
    reasons = {} if node is not None and node.status.alive else {
        "job-1": (node.stop_reason or StopReason.UNKNOWN) if node is not None else StopReason.UNKNOWN}
    beat = Record("jobs/job/heartbeat", 2, NOW - timedelta(minutes=1), attempt=1)
    return JobView(**{**dict(job="job", spec=TPU_SPEC, spec_generation=1, status=st, status_generation=7,
                             instances=seen, heartbeat=beat, stop_reasons=reasons, checkpoint_loaded=True), **kw})


# state -> what the planner does with a RUNNING attempt's node in it (health HEALTHY)
TPU_STATES = {
    "READY": "nothing",
    "CREATING": "settle", "STARTING": "settle", "RESTARTING": "settle", "REIMAGING": "settle",
    "REPAIRING": "settle", "STOPPING": "settle", "DELETING": "settle", "HIDING": "settle", "HIDDEN": "settle",
    "UNHIDING": "settle", "STATE_UNSPECIFIED": "settle", "UNKNOWN": "settle", "A_STATE_ADDED_LATER": "settle",
    "PREEMPTED": "preempted", "TERMINATED": "maintenance", "STOPPED": "lost",
}


def test_the_matrix_covers_every_node_state_in_the_discovery_document():
    from controller.core.ports import NodeState

    assert {s.value for s in NodeState} <= set(TPU_STATES)


@pytest.mark.parametrize("state, outcome", sorted(TPU_STATES.items()))
def test_each_tpu_node_state(state, outcome):
    actions = plan_job(tpu_view(tpu_node(state)), NOW, CTX)
    if outcome == "nothing":
        assert actions == []
        return
    first = actions[0]
    assert isinstance(first, WriteStatus)
    if outcome == "settle":
        assert first.status.settling and first.status.attempt == 1, first.status.message
        assert not any(isinstance(a, (CreateInstances, DeleteInstance)) for a in actions)
        return
    # Down for good: counted and committed, the old node deleted; the next attempt is created
    # once that node is gone (it holds the zone's TPU quota until then).
    st = first.status
    assert st.attempt == 1 and st.phase == Phase.RECOVERING and st.restarts == 1 and st.failures == 0
    assert st.preemptions == (outcome == "preempted") and st.history[-1].event == outcome
    assert kinds(actions) == ["WriteStatus", "DeleteInstance"] and first.replan
    assert actions[1].tpu and actions[1].name == "job-1"
    # The next pass finds it gone: the next attempt.
    gone = plan_job(tpu_view(None, status=st, status_generation=8), NOW, CTX)
    assert kinds(gone)[:2] == ["WriteStatus", "CreateInstances"] and gone[0].status.attempt == 2
    assert gone[1].requests[0].name == "job-2"


@pytest.mark.parametrize("health, outcome", [
    ("HEALTHY", "nothing"), ("HEALTH_UNSPECIFIED", "nothing"), ("UNKNOWN", "nothing"), ("A_HEALTH_ADDED_LATER", "nothing"),
    ("TIMEOUT", "hang"), ("UNHEALTHY_TENSORFLOW", "hang"), ("UNHEALTHY_MAINTENANCE", "maintenance"),
])
def test_each_tpu_node_health_while_ready(health, outcome):
    from controller.core.ports import NodeHealth

    assert {h.value for h in NodeHealth} <= {"HEALTHY", "HEALTH_UNSPECIFIED", "UNKNOWN", "TIMEOUT",
                                             "UNHEALTHY_TENSORFLOW", "UNHEALTHY_MAINTENANCE"}
    actions = plan_job(tpu_view(tpu_node("READY", health)), NOW, CTX)
    if outcome == "nothing":
        assert actions == []
    elif outcome == "hang":
        st = actions[0].status
        assert st.failures == 1 and st.phase == Phase.RECOVERING and f"health {health} (hung)" in st.message
        assert actions[0].needs == frozenset({"records"})  # an exit 0 landing meanwhile wins
        assert any(isinstance(a, DeleteInstance) and a.tpu for a in actions)
    else:
        st = actions[0].status
        assert st.settling and "under host maintenance" in st.message and len(actions) == 1


def test_maintenance_is_waited_for_within_the_policy_timeout_then_recreated():
    since = running(zone="us-central2-b", tpu=True, settling=True)
    timeout = TPU_SPEC.policy.maintenance_timeout
    node = tpu_node("READY", "UNHEALTHY_MAINTENANCE")
    assert plan_job(tpu_view(node, status=since.but(settling_since=NOW - timeout + timedelta(seconds=1))),
                    NOW, CTX) == []
    actions = plan_job(tpu_view(node, status=since.but(settling_since=NOW - timeout - timedelta(seconds=1))),
                       NOW, CTX)
    st = actions[0].status
    assert st.phase == Phase.RECOVERING and st.restarts == 1 and st.failures == 0
    assert st.history[-1].event == "maintenance"
    # Still up: deleted first; the next attempt waits until it is gone.
    assert kinds(actions) == ["WriteStatus", "DeleteInstance"] and actions[1].tpu


def test_a_tpu_node_gone_without_a_word_is_lost_not_a_failure():
    actions = plan_job(tpu_view(None), NOW, CTX)
    st = actions[0].status
    assert st.attempt == 2 and st.restarts == 1 and st.failures == 0 and st.history[-2].event == "lost"
