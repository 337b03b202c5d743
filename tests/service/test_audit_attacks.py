"""The audit path attacked: hostile messages and entries, and what on_audit costs while a VM goes
down (review of issue 25)."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from typing import Any

import pytest

from controller.core import audit, errors
from controller.core.ports import InstanceStatus, StopReason
from controller.service import bootstrap, functions
from controller.service.config import Settings
from controller.core.audit import system_event_entry
from tests.harness import BUCKET, PROJECT, Harness
from tests.service.test_audit import asked_why, message, running


@pytest.fixture
def wired(h: Harness) -> Harness:
    bootstrap.override(h.engine(), Settings(bucket=BUCKET, project=PROJECT))
    return h


def _raw(data: bytes) -> dict[str, Any]:
    return {"message": {"data": base64.b64encode(data).decode(), "messageId": "1"}}


# -- hostile messages -----------------------------------------------------------------------------


def test_a_deeply_nested_message_is_ignored_not_retried_for_ever(wired):
    running(wired)
    assert functions.on_audit(_raw(b"[" * 100_000)) is None
    assert functions.on_audit(_raw(b'{"protoPayload": ' * 50_000)) is None


def test_an_entry_with_deeply_nested_fields_is_refused_not_a_crash():
    deep: Any = "x"
    for _ in range(900):
        deep = [deep]
    entry = system_event_entry("p", "z", "a-1", "1", "compute.instances.preempted",
                               __import__("datetime").datetime(2026, 1, 1, tzinfo=__import__("datetime").UTC))
    for field in ("logName",):
        with pytest.raises(audit.AuditError):
            audit.parse_entry({**entry, field: deep})
    for field in ("methodName", "resourceName"):
        with pytest.raises(audit.AuditError):
            audit.parse_entry({**entry, "protoPayload": {**entry["protoPayload"], field: deep}})


# -- on_audit's wait and what it costs ---------------------------------------------------------------


def test_on_audit_costs_one_instance_list_however_long_its_vm_takes_to_go_down(wired):
    """A thousand VMs preempted at once are a thousand on_audit calls: each is one pass (one instance
    list against Compute's per-minute quota), never a look again every few seconds while the VM is
    STOPPING; the go follows the marker, the standby's ready record, or the next tick."""
    running(wired)
    zone = wired.status("a").zone
    wired.compute.set_status("a-1", "STOPPING")
    wired.compute.causes_of("a-1").append(StopReason.PREEMPTED)  # Compute's own record, at the soft-off
    entry = system_event_entry(PROJECT, zone, "a-1", wired.compute.all()[0].id, "compute.instances.preempted",
                               wired.clock.now())
    lists = len([c for c in wired.compute.calls if c[0] == "list"])
    functions.on_audit(message(entry))
    assert len([c for c in wired.compute.calls if c[0] == "list"]) - lists == 1
    wired.advance(seconds=30)  # no marker (the script failed); the guest is off
    wired.compute.set_status("a-1", InstanceStatus.TERMINATED)
    wired.ready("a")  # the standby at its line: its event's pass gives the go
    wired.tick("a")
    assert wired.status("a").attempt == 2 and wired.metadata("a-2")["respawn-go"] == "2"


def test_a_tpu_worker_other_than_0_is_not_read_as_a_job_and_costs_no_request(wired):
    """``t1v-n-<hash>-w-3`` fits respawn's naming (job ``t1v-n-<hash>-w``, attempt 3): it was
    reconciled as that job, one pass per worker of a preempted slice."""
    running(wired)
    worker = audit.parse_entry(system_event_entry(PROJECT, "us-central2-b", "t1v-n-5f3a9c1e-w-3", "77",
                                                  "compute.instances.preempted", wired.clock.now()))
    assert worker.tpu_worker and worker.job is None and worker.attempt is None
    store_calls, compute_calls, tpu_calls = len(wired.store.calls), len(wired.compute.calls), len(wired.tpu.calls)
    for n in range(1, 64):
        functions.on_audit(message(system_event_entry(PROJECT, "us-central2-b", f"t1v-n-5f3a9c1e-w-{n}", "77",
                                                      "compute.instances.preempted", wired.clock.now())))
    assert (len(wired.store.calls), len(wired.compute.calls), len(wired.tpu.calls)) == (
        store_calls, compute_calls, tpu_calls)


# -- the invariants ------------------------------------------------------------------------------------


def test_an_entry_claiming_a_running_vm_was_preempted_deletes_nothing_and_restarts_nothing(wired):
    running(wired)
    vm = wired.compute.all()[0]
    before = wired.status("a")
    for method in audit.LOSSES:
        functions.on_audit(message(system_event_entry(PROJECT, vm.zone, vm.name, vm.id, method, wired.clock.now())))
    wired.tick()
    assert wired.live("a") == ["a-1"] and not [c for c in wired.compute.calls if c[0] == "delete"]
    st = wired.status("a")
    assert (st.attempt, st.failures, st.restarts) == (before.attempt, before.failures, before.restarts)


def test_a_preemption_claimed_for_a_running_rank_does_not_excuse_another_ranks_crash(wired):
    from tests.harness import spec_doc

    wired.submit("g", spec_doc(nodes=2))
    wired.tick()
    wired.tick()
    st = wired.status("g")
    assert wired.live("g") == ["g-1-n0", "g-1-n1"]
    wired.compute.terminate("g-1-n0")  # rank 0's guest crashed
    n1 = next(i for i in wired.compute.all() if i.name == "g-1-n1")
    functions.on_audit(message(system_event_entry(PROJECT, st.zone, "g-1-n1", n1.id, "compute.instances.preempted",
                                                  wired.clock.now())))  # n1 is RUNNING
    st = wired.status("g")
    assert st.failures == 1 and not any(e.event == "preempted" for e in st.history)


def test_on_audit_the_tick_and_on_object_at_once_leave_one_live_attempt(h: Harness):
    import threading

    h.submit("a")
    h.tick()
    h.tick()
    for round_ in range(1, 4):
        h.compute.preempt(f"a-{round_}")
        h.marker("a", attempt=round_)
        data = message(h.audit.entries[-1])
        engines = [h.engine() for _ in range(4)]
        calls = [lambda: functions.on_audit(data), lambda: functions.on_audit(data),
                 lambda e=engines[0]: e.reconcile(), lambda e=engines[1]: e.reconcile(),
                 lambda e=engines[2]: e.reconcile("a"), lambda e=engines[3]: e.reconcile("a")]
        barrier = threading.Barrier(len(calls))

        def one(call):
            barrier.wait()
            call()

        threads = [threading.Thread(target=one, args=(c,)) for c in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        h.tick()
        h.tick()
        assert h.live("a") == [f"a-{round_ + 1}"]
        st = h.status("a")
        assert st.attempt == round_ + 1 and st.failures == 0
    inserts = [c for c in h.compute.calls if c[0] == "insert"]
    assert len({c[1] for c in inserts}) == 4


@pytest.mark.parametrize("name", ["a" * 64 + "-1", "a-1-n0-", "a_b-1", "-a-1"])
def test_a_name_compute_would_never_give_costs_no_request(wired, name):
    running(wired)
    store_calls, compute_calls = len(wired.store.calls), len(wired.compute.calls)
    functions.on_audit(message(system_event_entry(PROJECT, "us-central1-a", name, "5", "compute.instances.preempted",
                                                  wired.clock.now())))
    assert (len(wired.store.calls), len(wired.compute.calls)) == (store_calls, compute_calls)


def test_a_marker_gives_the_go_though_the_old_vm_lingers_stopping(wired):
    """Compute keeps a preempted VM STOPPING a while: once its marker says its save is in, the standby
    goes, and the old VM is only a husk to delete."""
    running(wired)
    zone = wired.status("a").zone
    wired.compute.set_status("a-1", "STOPPING")
    wired.compute.causes_of("a-1").append(StopReason.PREEMPTED)  # Compute's own record, at the soft-off
    entry = system_event_entry(PROJECT, zone, "a-1", wired.compute.all()[0].id, "compute.instances.preempted",
                               wired.clock.now())
    functions.on_audit(message(entry))
    wired.marker("a")  # the shutdown script's marker: a-1 is still STOPPING
    wired.tick("a")
    assert wired.status("a").attempt == 2 and wired.metadata("a-2")["respawn-go"] == "2"


def test_a_tpu_slices_entry_is_not_retried_for_another_jobs_trouble(wired):
    """Worker 0's entry makes a pass over every job: one job whose bucket objects do not answer made it
    raise, and Pub/Sub retried the whole pass, for a day if that job's trouble lasted."""
    from tests.service.test_tpu import tpu_doc

    wired.submit("tpu", tpu_doc())
    wired.submit("b")
    wired.tick()
    wired.tick()
    wired.tpu.preempt("tpu-1")
    real_read = wired.store.read

    def read(bucket: str, name: str, **kw: Any):
        if name.startswith("jobs/b/"):
            raise errors.TransientError("503")
        return real_read(bucket, name, **kw)

    real_listed = wired.store.read_listed
    from controller.service import snapshot

    def read_listed(info: Any) -> bytes:  # b's objects, and the snapshot's part that holds what they were
        if info.name.startswith("jobs/b/") or info.name == snapshot.part_key(snapshot.part_of("b")):
            raise errors.TransientError("503")
        return real_listed(info)

    wired.store.read = read  # type: ignore[method-assign]
    wired.store.read_listed = read_listed  # type: ignore[method-assign]
    worker = system_event_entry(PROJECT, "us-central2-b", "t1v-n-5f3a9c1e-w-0", "77", "compute.instances.preempted",
                                wired.clock.now())
    summary = functions.on_audit(message(worker))
    assert summary is not None and "b" in summary["transient"]
    assert wired.status("tpu").phase.name == "RECOVERING"


