"""The audit path: Compute's System Event entries, through on_audit (Pub/Sub) and the tick's own query.

Each test runs main.py's functions as the platform does (functions-framework test clients) over
the in-memory fakes, whose Compute writes its system events to a fake Logging.
"""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent
from functions_framework import create_app

from controller.core import audit, errors, names
from controller.core.audit import system_event_entry
from controller.core.ports import StopReason
from controller.core.state import Phase
from controller.service import bootstrap, functions
from controller.service.config import Settings
from tests.harness import BUCKET, PROJECT, Harness, spec_doc

MAIN = str(Path(__file__).resolve().parents[2] / "main.py")


@pytest.fixture
def wired(h: Harness) -> Harness:
    bootstrap.override(h.engine(), Settings(bucket=BUCKET, project=PROJECT))
    return h


def message(entry: Any) -> dict[str, Any]:
    """What Eventarc hands a Pub/Sub-triggered function: the sink's message, the LogEntry as JSON."""
    data = base64.b64encode(json.dumps(entry).encode()).decode()
    return {"message": {"data": data, "attributes": {"logging.googleapis.com/timestamp": "x"}, "messageId": "1",
                        "publishTime": "2026-01-01T00:00:00Z"}, "subscription": f"projects/{PROJECT}/subscriptions/s"}


def post(data: dict[str, Any]):
    client = create_app("on_audit", MAIN, "cloudevent").test_client()
    event = CloudEvent({"type": "google.cloud.pubsub.topic.v1.messagePublished",
                        "source": f"//pubsub.googleapis.com/projects/{PROJECT}/topics/respawn-audit"}, data)
    headers, body = to_binary(event)
    return client.post("/", headers=headers, data=body)


def running(h: Harness, job: str = "a") -> None:
    h.submit(job)
    h.tick()
    assert h.status(job).phase in (Phase.PROVISIONING, Phase.RUNNING)
    h.tick()


def entries(h: Harness) -> list[dict[str, Any]]:
    return list(h.audit.entries)


def asked_why(h: Harness) -> list[str]:
    return [what for op, what in h.compute.calls if op == "stopped"]


# -- the entry and the filter -------------------------------------------------------------


def test_the_filter_names_the_system_event_log_the_instances_and_every_loss_method():
    text = audit.sink_filter("p1")
    assert 'logName=("projects/p1/logs/cloudaudit.googleapis.com%2Fsystem_event")' in text
    assert 'resource.type="gce_instance"' in text
    for method in audit.METHODS:
        assert f'"{method}"' in text


def _now():
    from datetime import UTC, datetime

    return datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def test_an_entry_parses_into_its_instance_method_and_time():
    entry = system_event_entry("p1", "us-central1-a", "train-3-n1", "42", "compute.instances.preempted", _now())
    event = audit.parse_entry(entry)
    assert (event.project, event.zone, event.instance, event.instance_id) == ("p1", "us-central1-a", "train-3-n1", "42")
    assert (event.job, event.attempt, event.reason) == ("train", 3, audit.LOSSES["compute.instances.preempted"])
    assert audit.parse_entry(json.loads(json.dumps(entry))) == event
    # Logging writes nanoseconds; a new method is still an event, evidence of nothing
    entry["timestamp"] = "2026-11-27T12:00:00.123456789Z"
    entry["protoPayload"]["methodName"] = "compute.instances.somethingNew"
    assert audit.parse_entry(entry).reason is None


def test_a_tpu_slice_hosts_entry_names_its_slices_job_and_attempt():
    """A MIG's VM is <job>-<attempt>-w-xxxx: its System Event entry wakes that job's pass (read before the
    VM reading, which would take "-w-1234" for job "<job>-<attempt>-w", attempt 1234)."""
    for host in ("iron-3-w-ab12", "iron-3-w-1234"):
        event = audit.parse_entry(system_event_entry("p1", "us-central1-c", host, "42",
                                                     "compute.instances.preempted", _now()))
        assert (event.job, event.attempt) == ("iron", 3), host


@pytest.mark.parametrize("mangle, why", [
    (lambda e: "not a dict", "JSON object"),
    (lambda e: {**e, "protoPayload": None}, "protoPayload"),
    (lambda e: {**e, "logName": "projects/p1/logs/cloudaudit.googleapis.com%2Factivity"}, "System Event"),
    (lambda e: {**e, "protoPayload": {**e["protoPayload"], "methodName": "v1.compute.instances.delete"}}, "methodName"),
    (lambda e: {**e, "protoPayload": {**e["protoPayload"], "resourceName": "projects/p1/global/networks/x"}}, "resourceName"),
    (lambda e: {**e, "protoPayload": {**e["protoPayload"], "resourceName": 7}}, "resourceName"),
    (lambda e: {**e, "protoPayload": {**e["protoPayload"], "serviceName": "pubsub.googleapis.com"}}, "serviceName"),
    (lambda e: {**e, "protoPayload": {k: v for k, v in e["protoPayload"].items() if k != "serviceName"}}, "serviceName"),
    (lambda e: {**e, "timestamp": "yesterday"}, "RFC 3339"),
    (lambda e: {**e, "timestamp": "2026-11-27T12:00:00"}, "offset"),
    (lambda e: {k: v for k, v in e.items() if k != "timestamp"}, "timestamp"),
])
def test_a_malformed_entry_is_refused_naming_what_is_wrong(mangle, why):
    entry = system_event_entry("p1", "z", "a-1", "1", "compute.instances.preempted", _now())
    with pytest.raises(audit.AuditError, match=why):
        audit.parse_entry(mangle(entry))


@pytest.mark.parametrize("data", [
    {}, {"message": {}}, {"message": {"data": 5}}, {"message": {"data": "%%%"}},
    {"message": {"data": base64.b64encode(b"\xff\xfe").decode()}}, {"message": {"data": base64.b64encode(b"{").decode()}},
    {"message": {"data": base64.b64encode(b"[1, 2]").decode()}}, "a string", None,
])
def test_on_audit_absorbs_garbage_messages_without_a_retry_or_any_request(wired, data):
    running(wired)
    store_calls, compute_calls = len(wired.store.calls), len(wired.compute.calls)
    assert functions.on_audit(data) is None
    assert (len(wired.store.calls), len(wired.compute.calls)) == (store_calls, compute_calls)


# -- on_audit ---------------------------------------------------------------------------------


def test_a_hard_preemption_is_recovered_from_its_audit_entry_and_computes_own_record_of_why(wired):
    """The entry wakes the pass; why the VM went is read from Compute's own records (its zone
    operations), never from the entry, which a trainer allowed to write logs could forge."""
    running(wired)
    wired.compute.preempt("a-1")  # no shutdown script ran: no marker
    [entry] = entries(wired)
    assert post(message(entry)).status_code == 200
    st = wired.status("a")
    assert st.attempt == 2 and wired.live("a") == ["a-2"]
    assert any(e.event == "preempted" for e in st.history) and st.failures == 0
    assert asked_why(wired) == ["a-1"]


def test_a_preempted_entry_a_trainer_forged_for_its_own_crash_is_counted_as_the_failure_it_is(wired):
    """Issue 35, item 15: trainers hold logging.logWriter, and Cloud Logging may take an entry written
    under the System Event log's name: a forged "preempted" must not excuse a crash."""
    running(wired)
    vm = wired.compute.all()[0]
    wired.compute.terminate("a-1")  # the guest crashed (guestTerminate)
    forged = system_event_entry(PROJECT, vm.zone, vm.name, vm.id, "compute.instances.preempted", wired.clock.now())
    functions.on_audit(message(forged))
    st = wired.status("a")
    assert st.failures == 1 and st.preemptions == 0 and asked_why(wired) == ["a-1"]


def test_a_crash_entry_is_no_evidence_alone_compute_is_asked_and_it_counts_as_a_failure(wired):
    running(wired)
    wired.compute.terminate("a-1")  # the guest crashed: compute.instances.guestTerminate
    [entry] = entries(wired)
    assert entry["protoPayload"]["methodName"] == "compute.instances.guestTerminate"
    functions.on_audit(message(entry))
    st = wired.status("a")
    assert st.failures == 1 and asked_why(wired) == ["a-1"]


def test_duplicate_late_and_reordered_entries_change_nothing_after_the_first(wired):
    running(wired)
    wired.compute.preempt("a-1")
    [first] = entries(wired)
    functions.on_audit(message(first))
    wired.tick()
    wired.tick()  # attempt 2 running
    wired.compute.preempt("a-2")
    second = entries(wired)[-1]
    functions.on_audit(message(second))
    assert wired.status("a").attempt == 3
    wired.tick()  # attempt 3 running: nothing left to do
    before = (wired.store.read(BUCKET, names.status_key("a")).info.generation, len(wired.compute.calls))
    inserts = [c for c in wired.compute.calls if c[0] == "insert"]
    for data in (message(first), message(second), message(first), message(second)):  # duplicated, late, reordered
        functions.on_audit(data)
    assert wired.status("a").attempt == 3
    assert [c for c in wired.compute.calls if c[0] == "insert"] == inserts
    assert wired.store.read(BUCKET, names.status_key("a")).info.generation == before[0]


def test_an_entry_for_another_vm_of_the_same_name_is_no_evidence(wired):
    running(wired)
    wired.compute.terminate("a-1", reason=audit.LOSSES["compute.instances.guestTerminate"])
    forged = system_event_entry(PROJECT, "us-central1-a", "a-1", "999", "compute.instances.preempted", wired.clock.now())
    functions.on_audit(message(forged))  # an earlier run's a-1 (another id): Compute is asked
    st = wired.status("a")
    assert asked_why(wired) == ["a-1"] and st.failures == 1


def test_an_entry_older_than_the_attempt_is_no_evidence(wired):
    running(wired)
    wired.compute.terminate("a-1", reason=audit.LOSSES["compute.instances.guestTerminate"])
    st = wired.status("a")
    old = system_event_entry(PROJECT, st.zone, "a-1", "", "compute.instances.preempted",
                             st.attempt_started_at - timedelta(minutes=5))
    functions.on_audit(message(old))
    assert asked_why(wired) == ["a-1"] and wired.status("a").failures == 1


@pytest.mark.parametrize("name", ["web-server", "t1v-nope", "db-7-replica", "UPPER-1"])
def test_an_instance_that_is_not_respawns_costs_no_request(wired, name):
    running(wired)
    store_calls, compute_calls = len(wired.store.calls), len(wired.compute.calls)
    functions.on_audit(message(system_event_entry(PROJECT, "us-central1-a", name, "5", "compute.instances.preempted",
                                                  wired.clock.now())))
    assert (len(wired.store.calls), len(wired.compute.calls)) == (store_calls, compute_calls)


def test_a_lookalike_name_of_no_job_changes_nothing(wired):
    running(wired)
    calls = len(wired.store.calls)
    functions.on_audit(message(system_event_entry(PROJECT, "us-central1-a", "web-7", "5", "compute.instances.preempted",
                                                  wired.clock.now())))
    assert wired.live() == ["a-1"] and wired.status("a").attempt == 1
    assert not [c for c in wired.store.calls[calls:] if c[0] in ("write", "delete")]


def test_an_entry_from_a_project_the_controller_does_not_watch_is_ignored(wired):
    running(wired)
    wired.compute.preempt("a-1")
    entry = entries(wired)[0]
    entry["protoPayload"]["resourceName"] = entry["protoPayload"]["resourceName"].replace(PROJECT, "someone-else")
    entry["logName"] = audit.log_name("someone-else")
    calls = len(wired.compute.calls)
    functions.on_audit(message(entry))
    assert len(wired.compute.calls) == calls and wired.status("a").attempt == 1


def test_on_audit_boots_the_standby_for_a_vm_on_its_way_down_in_one_pass_and_never_waits(wired):
    """Issue 34: on_audit no longer sleeps in its instance until the VM is down. The entry of a VM
    being preempted (STOPPING: its shutdown script saving) launches the next attempt at once, held
    at the starting line; the marker's event gives the go."""
    running(wired)
    wired.compute.set_status("a-1", "STOPPING")
    wired.compute.causes_of("a-1").append(StopReason.PREEMPTED)  # Compute's own record, at the soft-off  # preempted; its shutdown script is saving
    entry = system_event_entry(PROJECT, wired.status("a").zone, "a-1", wired.compute.all()[0].id,
                               "compute.instances.preempted", wired.clock.now())
    lists = len([c for c in wired.compute.calls if c[0] == "list"])
    functions.on_audit(message(entry))
    assert len([c for c in wired.compute.calls if c[0] == "list"]) - lists == 1  # one instance list: one pass
    st = wired.status("a")
    assert st.attempt == 1 and st.standby is not None and wired.live("a") == ["a-2"]
    assert wired.metadata("a-2")["respawn-hold"] == "1" and "respawn-go" not in wired.metadata("a-2")
    wired.marker("a")  # the shutdown script's marker lands: its save is in
    wired.tick("a")
    assert wired.status("a").attempt == 2 and wired.metadata("a-2")["respawn-go"] == "2"


def test_on_audit_raises_for_a_retry_when_the_bucket_does_not_answer(wired):
    running(wired)
    wired.compute.preempt("a-1")
    wired.store.faults.fail_next("list", errors.TransientError("503"), times=20)
    response = post(message(entries(wired)[0]))
    assert response.status_code == 500


def test_a_tpu_workers_entry_names_no_node_so_every_job_is_looked_at_and_the_node_says_what_happened(wired):
    from tests.service.test_tpu import tpu_doc

    wired.submit("tpu", tpu_doc())
    wired.tick()
    wired.tick()
    wired.tpu.preempt("tpu-1")
    worker = system_event_entry(PROJECT, "us-central2-b", "t1v-n-5f3a9c1e-w-0", "77", "compute.instances.preempted",
                                wired.clock.now())
    assert audit.parse_entry(worker).tpu_worker
    functions.on_audit(message(worker))
    st = wired.status("tpu")
    assert st.phase.name == "RECOVERING" and any(e.event == "preempted" for e in st.history)
    assert ("delete", "tpu-1") in wired.tpu.calls


def test_a_crash_whose_backoff_ends_within_the_wait_is_restarted_by_the_same_call(wired):
    """The one wait on_audit keeps: a crash's restart due within AUDIT_DUE_WAIT (nothing else fires
    when a backoff ends). Issue 34 took away only the wait for a VM to be down."""
    running(wired)  # the spec's backoff starts at 30 s
    wired.compute.terminate("a-1")  # the guest crashed: a failure, restarted after the backoff
    before = wired.clock.now()
    functions.on_audit(message(entries(wired)[0]))  # the harness's clock sleeps at once
    st = wired.status("a")
    assert st.failures == 1 and st.attempt == 2 and wired.live("a") == ["a-2"]
    assert 30 <= (wired.clock.now() - before).total_seconds() <= 31


def test_a_backoff_longer_than_the_wait_is_left_to_the_tick(wired):
    wired.submit("a", spec_doc(policy={"backoff": {"initial": "5m", "max": "10m"}}))
    wired.tick()
    wired.tick()
    wired.compute.terminate("a-1")
    before = wired.clock.now()
    functions.on_audit(message(entries(wired)[0]))
    assert wired.clock.now() == before and wired.status("a").attempt == 1 and wired.status("a").failures == 1


def test_a_preemption_never_makes_on_audit_wait(wired):
    running(wired)
    wired.compute.preempt("a-1")
    before = wired.clock.now()
    functions.on_audit(message(entries(wired)[0]))
    assert wired.clock.now() == before and wired.status("a").preemptions == 1
