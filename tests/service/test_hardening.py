"""Regressions for the holes found by trying respawn as an attacker, a buggy trainer and an
unlucky operator would (issue 7). Each test names the defect it pins down."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from controller.core import errors, names
from controller.service.engine import Summary
from controller.core.ports import InstanceStatus, StopReason
from controller.core.state import JobStatus, Phase
from tests.harness import BUCKET, PROJECT, Harness, spec_doc


def started(h: Harness, job: str = "llm", **spec: Any) -> None:
    h.submit(job, spec_doc(**spec) if spec else None)
    h.tick()
    h.tick()
    assert h.status(job).phase == Phase.RUNNING


def inserts(h: Harness) -> list[str]:
    return [what for op, what in h.compute.calls if op == "insert"]


class FailStatusWrite:
    """A store whose ``n``-th write of a status.json is lost (GCS 5xx, or the function killed)."""

    def __init__(self, store: Any, n: int) -> None:
        self._store, self._left = store, n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def write(self, bucket: str, name: str, data: bytes, **kw: Any) -> Any:
        if name.endswith("/status.json"):
            self._left -= 1
            if self._left == 0:
                raise errors.TransientError("503 on status write")
        return self._store.write(bucket, name, data, **kw)


# -- 1. VMs created only where the controller looks ---------------------------------------

def test_forged_status_project_and_zone_never_redirect_an_insert(h):
    h.submit("llm")
    forged = JobStatus(phase=Phase.PROVISIONING, attempt=1, project="evil-proj", zone="asia-east1-a",
                       instances=("llm-1",), spec_generation=None)
    spec_gen = h.store.read(BUCKET, names.spec_key("llm")).info.generation
    h.store.put(BUCKET, names.status_key("llm"), forged.model_copy(update={"spec_generation": spec_gen}).to_json())
    h.tick()
    request = h.compute.request_of("llm-1")
    assert (request.project, request.zone) == (PROJECT, "us-central1-a")


# -- 2. Per-job isolation is total ------------------------------------------------------------

@pytest.mark.parametrize("body", [
    b'{"attempt": 1e999, "exit_code": 0}',
    b'{"attempt": Infinity, "exit_code": 0}',
    b'{"attempt": 1, "exit_code": NaN}',
    b"[" * 100_000,
    b'{"attempt": true, "exit_code": 0}',
    b'{"attempt": "1", "exit_code": "0"}',
    b'{"attempt": 1, "exit_code": 1e300}',
])
def test_hostile_vm_record_is_ignored_and_the_pass_goes_on(h, body):
    started(h)
    h.submit("other")
    h.store.put(BUCKET, names.exit_key("llm"), body)
    h.store.put(BUCKET, names.marker_key("llm"), body)
    summary = h.tick()
    assert not summary.errors
    assert h.status("llm").phase == Phase.RUNNING and "llm-1" in h.live()
    assert "other-1" in h.live()


def test_oversized_spec_is_refused_without_being_read(h):
    h.store.put(BUCKET, names.spec_key("big"), b"#" * (300 * 1024))
    h.submit("ok")
    h.tick()
    st = h.status("big")
    assert st.phase == Phase.FAILED and "spec.yaml" in st.message and "limit" in st.message
    assert ("read", names.spec_key("big")) not in h.store.calls
    assert "ok-1" in h.live()


@pytest.mark.parametrize("status", [InstanceStatus.PENDING_STOP, InstanceStatus.DEPROVISIONING,
                                    InstanceStatus.REPAIRING, InstanceStatus.UNKNOWN])
def test_status_we_cannot_judge_is_waited_out_never_taken_for_lost(h, status):
    started(h)
    h.compute.set_status("llm-1", status)
    summary = h.tick()
    assert not summary.errors and h.status("llm").attempt == 1 and h.status("llm").restarts == 0
    h.compute.set_status("llm-1", InstanceStatus.RUNNING)
    h.tick()
    assert h.tick().jobs == {"llm": []} and h.status("llm").restarts == 0


def test_flex_start_pending_vm_is_alive_not_lost(h):
    h.compute.boot_status = InstanceStatus.PENDING
    h.submit("llm")
    h.tick()
    h.tick()
    st = h.status("llm")
    assert st.phase == Phase.PROVISIONING and st.restarts == 0 and h.live() == ["llm-1"]


def test_backoff_after_hours_of_quota_errors_does_not_overflow(h):
    h.compute.quota_exhausted.update({"us-central1-a", "us-central1-b"})
    h.submit("llm")
    for _ in range(400):
        h.tick()
        h.advance(hours=1)
    st = h.status("llm")
    assert st.placement >= 400 and "quota" in st.message
    h.compute.quota_exhausted.clear()
    h.tick()
    assert h.live() == ["llm-1"]


def test_an_unexpected_exception_in_one_job_does_not_stop_the_others(h):
    h.submit("a")
    h.submit("b")

    class Exploding:
        def __getattr__(self, name: str) -> Any:
            return getattr(h.store, name)

        def read(self, bucket: str, name: str, **kw: Any) -> Any:
            if name == names.spec_key("a"):
                raise ZeroDivisionError("a bug")
            return h.store.read(bucket, name, **kw)

        def read_listed(self, info: Any) -> bytes:
            if info.name == names.spec_key("a"):
                raise ZeroDivisionError("a bug")
            return h.store.read_listed(info)

    summary = h.engine(store=Exploding()).reconcile()
    assert "ZeroDivisionError" in summary.errors["a"] and "a" not in summary.transient
    assert h.live() == ["b-1"]


def test_event_for_a_hostile_job_name_never_reaches_a_compute_filter(h):
    hostile = 'x" OR labels.respawn-job:*'
    h.store.put(BUCKET, f"jobs/{hostile}/spec.yaml", "zones: [us-central1-a]")
    h.tick(hostile)
    assert not [c for c in h.compute.calls if c[0] == "list"]
    assert h.status(hostile).phase == Phase.FAILED and "not a valid job name" in h.status(hostile).message


# -- 3. Gangs finish once; a loss that began with a preemption is a preemption ----------------

def test_gang_workers_that_finish_first_do_not_restart_a_finished_gang(h):
    started(h, "dist", nodes=3)
    for worker in ("dist-1-n1", "dist-1-n2"):  # exit 0: power off, no exit record
        h.compute.terminate(worker, StopReason.CRASHED)
    h.tick()
    assert h.status("dist").phase == Phase.RUNNING and h.status("dist").failures == 0
    h.exit("dist", 0)
    h.tick()
    st = h.status("dist")
    assert (st.phase, st.attempt, st.failures, st.restarts) == (Phase.SUCCEEDED, 1, 0, 0)
    assert h.live() == []


@pytest.mark.parametrize("with_marker", [True, False])
def test_gang_rank_failing_on_a_broken_collective_after_a_preemption_is_a_preemption(h, with_marker):
    started(h, "dist", nodes=2)
    if with_marker:
        h.marker("dist")
    h.compute.preempt("dist-1-n1")
    h.exit("dist", 1, node=0)  # rank 0's collective broke
    h.tick()
    st = h.status("dist")
    assert (st.failures, st.preemptions, st.attempt) == (0, 1, 2)


def test_gang_rank_failing_while_a_node_is_still_stopping_waits_to_learn_why(h):
    started(h, "dist", nodes=2)
    h.compute.set_status("dist-1-n1", InstanceStatus.STOPPING)
    h.exit("dist", 1, node=0)
    h.tick()
    assert h.status("dist").failures == 0 and h.status("dist").attempt == 1
    h.compute.preempt("dist-1-n1")
    h.tick()
    assert (h.status("dist").failures, h.status("dist").preemptions) == (0, 1)


# -- 4. No duplicate attempt after a failover whose status write was lost -----------------------

def test_lost_inserted_write_after_failover_never_duplicates_the_attempt(h):
    h.compute.stockouts.add("us-central1-a")
    h.submit("llm")
    # Status writes of the first pass: new run, launch (zone a), stockout -> zone b, then
    # the insert into b is accepted and the 4th write ("inserted") is lost.
    h.engine(store=FailStatusWrite(h.store, 4)).reconcile()
    assert h.live() == ["llm-1"] and not h.status("llm").inserted
    h.compute.stockouts.clear()
    h.advance(minutes=30)  # zone a's cooldown is long over
    h.tick()
    h.tick()
    live = [(i.name, i.zone) for i in h.compute.live("llm")]
    assert live == [("llm-1", "us-central1-b")]
    assert h.status("llm").inserted and h.status("llm").zone == "us-central1-b"


# -- 5. An unreachable zone is not a lost VM -----------------------------------------------------

def test_vm_in_an_unreachable_zone_is_left_alone(h):
    started(h)
    h.compute.unreachable.add("us-central1-a")
    h.tick()
    h.advance(minutes=5)
    h.tick()
    st = h.status("llm")
    assert (st.attempt, st.restarts, st.phase) == (1, 0, Phase.RUNNING)
    h.compute.unreachable.clear()
    assert h.tick().jobs == {"llm": []}


def test_no_insert_while_a_zone_of_the_job_is_unreachable(h):
    h.compute.unreachable.add("us-central1-b")
    h.submit("llm")
    h.tick()
    assert h.live() == [] and h.status("llm").phase == Phase.PENDING
    h.compute.unreachable.clear()
    h.tick()
    assert h.live() == ["llm-1"]


# -- 7. Startup grace counts from the acknowledged insert -----------------------------------------

def test_startup_grace_counts_from_the_insert_not_from_a_long_stockout(h):
    policy = {"idle_timeout": "30m", "startup_grace": "15m", "zone_cooldown": "10m"}
    h.compute.stockouts.update({"us-central1-a", "us-central1-b"})
    h.submit("llm", spec_doc(policy=policy))
    for _ in range(12):  # two hours of stockouts
        h.tick()
        h.advance(minutes=10)
    h.compute.stockouts.clear()
    h.tick()
    h.advance(minutes=3)
    h.tick()
    st = h.status("llm")
    assert st.failures == 0 and st.phase == Phase.RUNNING and h.live() == ["llm-1"]


# -- 8. A stale "finished" view never deletes a new run -------------------------------------------

def test_stale_finished_view_does_not_delete_the_new_run(h):
    started(h)
    h.exit("llm", 0)
    h.tick()
    assert h.status("llm").phase == Phase.SUCCEEDED
    engine = h.engine()
    stale = engine.observer.world().jobs["llm"]  # the tick reads SUCCEEDED...
    h.submit("llm")  # ...the user resubmits, and the event pass starts attempt 2
    h.tick("llm")
    assert h.live() == ["llm-2"]
    h.compute.add_foreign(PROJECT, "us-central1-a", "llm-2-probe", {})  # noise: must stay
    stale = stale.__class__(**{**stale.__dict__, "instances": tuple(h.compute.all())})
    engine._reconcile_job(stale, Summary(), dry_run=False)  # ...then the tick acts on its old view
    assert "llm-2" in h.live()


# -- 9. An insert Compute rejects for good ends the job ------------------------------------------

@pytest.mark.parametrize("error", [
    errors.RequestError("Invalid value for field 'resource.machineType': 'zones/us-central1-a/machineTypes/nope'"),
    errors.NotFound("The resource 'projects/p/zones/us-central1-z' was not found"),
])
def test_insert_rejected_with_400_or_404_fails_the_job_with_googles_message(h, error):
    h.compute.faults.fail_next("insert", error, times=2)  # every zone of the spec says no
    h.submit("llm")
    h.tick()
    st = h.status("llm")
    assert st.phase == Phase.FAILED and str(error) in st.message and "every zone" in st.message


def test_insert_rejected_in_one_zone_tries_the_next(h):
    # e.g. the machine type or the accelerator does not exist in the first zone
    h.compute.faults.fail_next("insert", errors.RequestError("Machine type 'a3-highgpu-8g' does not exist in zone"))
    h.submit("llm")
    h.tick()
    st = h.status("llm")
    assert st.phase == Phase.PROVISIONING and h.compute.request_of("llm-1").zone == "us-central1-b"
    assert "us-central1-a" in st.zone_rejections


# -- 13. Names are injective across jobs ----------------------------------------------------------

def test_gang_and_look_alike_job_get_distinct_instances(h):
    h.submit("a", spec_doc(nodes=2))
    h.submit("a-1")
    h.tick()
    assert h.live() == ["a-1-1", "a-1-n0", "a-1-n1"]
    h.tick()
    assert h.status("a").phase == h.status("a-1").phase == Phase.RUNNING
    assert h.status("a-1").restarts == 0


# -- 14. Google's stop causes ----------------------------------------------------------------------

def test_host_error_is_not_the_trainers_fault(h):
    started(h)
    h.compute.terminate("llm-1", StopReason.HOST_ERROR)
    h.tick()
    st = h.status("llm")
    assert (st.failures, st.restarts, st.attempt) == (0, 1, 2)
    assert any(e.event == "host error" for e in st.history)


# -- 15. An exit record racing a recycle or an idle decision is never lost -------------------------

@pytest.mark.parametrize("policy", [{"max_instance_age": "1h"}, {"idle_timeout": "10m", "startup_grace": "1m"}])
def test_exit_zero_landing_after_the_listing_wins_over_a_restart(h, policy):
    started(h, policy=policy)
    h.advance(hours=2)
    engine = h.engine()
    view = engine.observer.world().jobs["llm"]  # listed before the exit record exists
    h.exit("llm", 0)
    engine._reconcile_job(view, Summary(), dry_run=False)
    st = h.status("llm")
    assert st.phase == Phase.SUCCEEDED and st.attempt == 1 and st.failures == 0


# -- Trainer containment: records need the attempt's secret ---------------------------------------

def test_forged_exit_record_without_the_attempts_secret_is_ignored(h):
    started(h)
    token = h.metadata("llm-1")["respawn-token"]
    assert token and token == h.status("llm").attempt_token
    h.exit("llm", 0, token="guessed")
    h.tick()
    assert h.status("llm").phase == Phase.RUNNING and h.live() == ["llm-1"]
    h.exit("llm", 0)
    h.tick()
    assert h.status("llm").phase == Phase.SUCCEEDED


def test_each_attempt_gets_a_new_secret(h):
    started(h)
    first = h.status("llm").attempt_token
    h.marker("llm")
    h.tick()
    assert h.metadata("llm-2")["respawn-token"] == h.status("llm").attempt_token != first
    heartbeat = json.loads(json.dumps({"attempt": 2, "token": first}))
    h.store.put(BUCKET, names.heartbeat_key("llm"), json.dumps(heartbeat))
    assert h.tick().jobs["llm"] == [] or h.status("llm").attempt == 2


def test_unknown_project_in_spec_is_refused_up_front(h):
    h.submit("llm", spec_doc(project="someone-elses"))
    h.tick()
    st = h.status("llm")
    assert st.phase == Phase.FAILED and any(e.startswith("project:") for e in st.errors)
    assert inserts(h) == []


def test_two_hundred_passes_of_a_converged_job_write_nothing(h):
    started(h)
    before = len(h.store.calls)
    for _ in range(200):
        h.heartbeat("llm")
        h.tick()
        h.advance(seconds=30)
    writes = [c for c in h.store.calls[before:] if c[0] in ("write", "delete") and "heartbeat" not in c[1]]
    assert writes == []
    assert timedelta(0) < h.clock.now() - h.status("llm").inserted_at


# -- 14. An insert still running at the wait deadline is not "inserted" -----------------------------

def test_pending_insert_is_not_inserted_and_its_success_is_read_next_pass(h):
    h.compute.hold_inserts = True
    h.submit("llm")
    h.tick()
    st = h.status("llm")
    assert not st.inserted and st.message.startswith("start; creating llm-1")  # the launch, not yet news
    h.tick()
    st = h.status("llm")
    assert not st.inserted and "still running" in st.message  # a later pass finds it under way: said
    h.compute.hold_inserts = False
    h.tick()
    assert h.status("llm").inserted and h.live() == ["llm-1"]
    # Listed PROVISIONING, then RUNNING: the outcome read from the listing, never by asking
    # Compute again (each ask a mutation against the project's rate quota).
    assert len([c for c in h.compute.calls if c[0] == "insert"]) == 1


def test_pending_insert_that_stocks_out_late_cools_the_zone_and_moves_on(h):
    h.compute.hold_inserts = True
    h.submit("llm")
    h.tick()
    h.compute.stockouts.add("us-central1-a")
    h.compute.release_inserts()  # the operation finishes now: no capacity after all
    h.tick()
    st = h.status("llm")
    assert "us-central1-a" in st.zone_cooldowns and st.zone == "us-central1-b" and st.inserted
    assert [(i.name, i.zone) for i in h.compute.live("llm")] == [("llm-1", "us-central1-b")]


# -- Found by a hostile review of the fixes above ---------------------------------------------------

def test_gang_rank_zero_hanging_after_its_workers_finished_is_still_caught(h):
    started(h, "g", nodes=2, policy={"idle_timeout": "30m", "startup_grace": "5m"})
    h.heartbeat("g")
    h.compute.terminate("g-1-n1", StopReason.CRASHED)  # worker done: powered off, no record
    h.tick()
    assert h.status("g").phase == Phase.RUNNING
    h.advance(minutes=31)  # rank 0 stops heartbeating
    h.tick()
    st = h.status("g")
    assert st.failures == 1 and "no heartbeat" in st.message


def test_vms_in_a_project_dropped_from_the_policy_are_still_deleted():
    from controller.core.policy import ControllerPolicy
    from tests.harness import TRAINER

    wide = Harness(ControllerPolicy(default_project=PROJECT, allowed_projects=("other-proj",),
                                    trainer_service_account=TRAINER))
    wide.submit("llm", spec_doc(project="other-proj"))
    wide.tick()
    assert [i.project for i in wide.compute.live()] == ["other-proj"]
    wide.policy = ControllerPolicy(default_project=PROJECT, trainer_service_account=TRAINER)  # narrowed
    wide.tick()
    assert wide.status("llm").phase == Phase.FAILED and wide.live() == []


def test_one_project_whose_list_fails_blinds_only_its_own_jobs():
    from controller.core.policy import ControllerPolicy
    from tests.harness import TRAINER

    h = Harness(ControllerPolicy(default_project=PROJECT, allowed_projects=("typo-proj",),
                                 trainer_service_account=TRAINER))
    started(h)
    h.compute.failing_projects.add("typo-proj")
    h.compute.preempt("llm-1")
    summary = h.tick()
    assert h.live() == ["llm-2"] and "project typo-proj" in summary.errors


def test_a_stale_pass_never_consumes_the_next_attempts_exit_record(h):
    started(h, policy={"idle_timeout": "10m", "startup_grace": "1m"})
    h.advance(minutes=30)
    engine = h.engine()
    stale = engine.observer.world().jobs["llm"]  # attempt 1, its heartbeat long stale
    h.marker("llm")
    h.tick()  # attempt 2 starts...
    h.exit("llm", 0)  # ...and finishes
    engine._reconcile_job(stale, Summary(), dry_run=False)
    assert h.store.exists(BUCKET, names.exit_key("llm"))
    h.tick()
    assert h.status("llm").phase == Phase.SUCCEEDED and h.status("llm").failures == 0


def test_exit_zero_before_the_deadline_seen_after_it_is_a_success(h):
    started(h, policy={"max_runtime": "1h"})
    h.advance(minutes=59)
    h.exit("llm", 0)
    h.advance(minutes=2)
    h.tick()
    assert h.status("llm").phase == Phase.SUCCEEDED


def test_a_reused_job_name_gets_new_request_ids(h):
    h.submit("x")
    h.tick()
    first = h.compute.request_of("x-1")
    h.compute.delete(PROJECT, first.zone, "x-1")
    for key in (names.spec_key("x"), names.status_key("x")):
        h.store.delete(BUCKET, key)
    h.advance(minutes=5)
    h.submit("x")
    h.tick()
    assert h.live() == ["x-1"], "the new run's insert was answered with the old run's operation"


def test_junk_records_under_names_without_spec_or_status_are_never_read(h):
    for i in range(50):
        h.store.put(BUCKET, names.marker_key(f"junk{i}"), "{}")
        h.store.put(BUCKET, names.heartbeat_key(f"junk{i}"), "{}")
    h.submit("ok")
    h.tick()
    assert not [c for c in h.store.calls if c[0] == "read" and "junk" in c[1]]
    assert h.live() == ["ok-1"]


def test_a_huge_record_or_pointer_is_never_downloaded(h):
    started(h)
    h.store.put(BUCKET, names.exit_key("llm"), b"x" * (1024 * 1024))
    from tests.harness import CKPT_BUCKET
    h.store.put(CKPT_BUCKET, "run/LATEST", b"y" * (1024 * 1024))
    h.compute.preempt("llm-1")
    h.tick()
    assert h.live() == ["llm-2"] and h.status("llm").failures == 0


def test_a_node_stuck_in_a_state_we_wait_out_is_given_up_after_idle_timeout(h):
    started(h, policy={"idle_timeout": "30m"})
    h.compute.set_status("llm-1", InstanceStatus.REPAIRING)
    h.tick()
    h.advance(minutes=20)
    h.tick()
    assert h.status("llm").attempt == 1
    h.advance(minutes=15)
    h.tick()
    st = h.status("llm")
    assert (st.attempt, st.restarts, st.failures) == (2, 1, 0) and h.live() == ["llm-2"]


def test_an_exit_record_saying_why_the_command_never_ran_is_shown(h):
    started(h)
    st = h.status("llm")
    body = {"exit_code": 97, "reason": "code download failed", "instance": "llm-1", "attempt": 1,
            "token": st.attempt_token}
    h.store.put(BUCKET, names.exit_key("llm"), json.dumps(body))
    h.tick()
    assert "the command never ran on llm-1: code download failed (exit 97)" in h.status("llm").message


def test_a_rebooted_marker_is_a_restart_not_a_failure(h):
    started(h)
    h.marker("llm", reason="rebooted")
    h.tick()
    st = h.status("llm")
    assert (st.attempt, st.restarts, st.failures, st.preemptions) == (2, 1, 0, 0)
    assert any(e.event == "rebooted" for e in st.history)



# -- Found by a hostile review of the SIGTERM work --------------------------------------------------

def test_exit_zero_while_a_recycle_cannot_delete_the_vm_wins(h):
    started(h, policy={"max_instance_age": "1h"})
    h.advance(hours=2)
    h.compute.faults.fail_next("delete", errors.TransientError("503"), times=3)
    h.tick()
    st = h.status("llm")
    assert st.phase == Phase.RECOVERING and "cannot delete llm-1" in st.message
    h.exit("llm", 0)
    h.compute.terminate("llm-1", StopReason.CRASHED)  # the agent powers off
    h.tick()
    assert h.status("llm").phase == Phase.SUCCEEDED and "llm-2" not in h.live()


def test_exit_zero_landing_after_the_listing_of_a_pass_that_would_launch_the_next_attempt_wins(h):
    """Between attempts a pass reads no record again (a job backing off costs no request), so the
    launch that commits asks for them first: an exit 0 the old VM wrote on its way down, after the
    listing, still ends the job, and no next attempt starts."""
    started(h, policy={"max_instance_age": "1h"})
    h.advance(hours=2)
    h.compute.faults.fail_next("delete", errors.TransientError("503"), times=3)
    h.tick()
    assert h.status("llm").phase == Phase.RECOVERING
    h.compute.terminate("llm-1", StopReason.CRASHED)  # the agent powers off...
    h.advance(minutes=1)  # past its backoff
    engine = h.engine()
    view = engine.observer.world().jobs["llm"]  # listed before its exit record lands
    assert view.exit is None and not view.records_fresh
    h.exit("llm", 0)  # ...having written it
    engine._reconcile_job(view, Summary(), dry_run=False)
    assert h.status("llm").phase == Phase.SUCCEEDED and "llm-2" not in h.live()


def test_exit_zero_landing_after_the_listing_beats_the_deadline_between_attempts(h):
    """Between attempts no record is read again after the instance list, and the deadline is judged
    first: an exit 0 written by the VM on its way down, landing after the listing (a late chunk of a
    long pass), must still be a success, never "max_runtime reached" (found by a hostile review)."""
    h.submit("llm", spec_doc(policy={"max_instance_age": "1h", "max_runtime": "2h30m"}))
    h.tick()
    h.tick()
    h.advance(hours=2)
    h.compute.faults.fail_next("delete", errors.TransientError("503"), times=3)
    h.tick()
    assert h.status("llm").phase == Phase.RECOVERING
    h.compute.terminate("llm-1", StopReason.CRASHED)  # the agent powers off, having written exit 0...
    h.advance(minutes=31)  # past max_runtime
    engine = h.engine()
    listed = engine.observer._instances
    landed: list[int] = []

    def instances(*a: Any, **k: Any) -> Any:
        if not landed:  # ...which lands after the listing and the record reads, before the evidence
            h.exit("llm", 0)
            landed.append(1)
        return listed(*a, **k)

    engine.observer._instances = instances  # type: ignore[method-assign]
    engine.reconcile()
    assert landed and h.status("llm").phase == Phase.SUCCEEDED, h.status("llm").message


def test_a_vm_stuck_on_its_way_down_holds_the_next_attempt_only_for_a_while(h):
    started(h)
    h.compute.set_status("llm-1", InstanceStatus.STOPPING)
    # A marker that does not name its VM (an older agent's): it does not say that llm-1's work
    # is done, so llm-1 is waited for. (Its own marker would not be: test_planner's
    # test_a_vm_going_down_whose_marker_says_its_work_is_done_is_not_waited_for.)
    st = h.status("llm")
    h.store.put(BUCKET, names.marker_key("llm"), json.dumps(
        {"attempt": st.attempt, "reason": "preempted", "token": st.attempt_token}))

    class NeverGone:  # the delete is accepted but never completes
        def __getattr__(self, name: str) -> Any:
            return getattr(h.compute, name)

        def delete(self, project: str, zone: str, name: str) -> None:
            return None

    h.engine(compute=NeverGone()).reconcile()
    assert h.status("llm").phase == Phase.RECOVERING and h.status("llm").attempt == 1
    h.advance(minutes=11)
    h.engine(compute=NeverGone()).reconcile()
    assert h.status("llm").attempt == 2 and "llm-2" in h.live()


# -- Found by a third hostile review ---------------------------------------------------------------

def test_a_forged_status_naming_another_project_never_deletes_anything_there(h):
    h.compute.add_foreign("other-proj", "us-east1-b", "victim-3",
                          {"respawn-managed": "true", "respawn-job": "victim", "respawn-attempt": "3"})
    forged = JobStatus(phase=Phase.SUCCEEDED, attempt=1, project="other-proj", zone="us-east1-b")
    h.store.put(BUCKET, names.status_key("evil"), forged.to_json())
    h.store.put(BUCKET, names.status_key("victim"), forged.to_json())
    h.tick()
    assert "victim-3" not in h.compute.deleted


def test_a_new_run_waits_for_the_previous_runs_vm_on_its_way_down_only_for_a_while(h):
    started(h)
    h.exit("llm", 0)
    h.compute.set_status("llm-1", InstanceStatus.STOPPING)
    h.compute.faults.fail_next("delete", errors.TransientError("503"), times=1000)
    h.tick()
    assert h.status("llm").phase == Phase.SUCCEEDED
    h.submit("llm", spec_doc(command="python train.py --again"))
    for _ in range(4):
        h.tick()
        h.advance(minutes=5)
    assert h.status("llm").attempt == 2 and "llm-2" in h.live()


@pytest.mark.parametrize("status", [InstanceStatus.STAGING, InstanceStatus.PENDING])
def test_a_running_node_stuck_back_in_a_booting_state_is_given_up(h, status):
    started(h, policy={"idle_timeout": "30m"})
    h.compute.set_status("llm-1", status)
    for _ in range(8):
        h.tick()
        h.advance(minutes=5)
    st = h.status("llm")
    assert (st.attempt, st.failures) == (2, 0)


def test_a_zone_that_refused_one_attempt_is_tried_again_by_the_next(h):
    h.compute.faults.fail_next("insert", errors.RequestError("400 resourceNotReady"))
    h.submit("llm")
    h.tick()
    assert h.compute.request_of("llm-1").zone == "us-central1-b"
    h.tick()
    h.compute.faults.fail_next("insert", errors.RequestError("400 resourceNotReady"))
    h.marker("llm")
    h.tick()  # attempt 2 tries a again (its refusal was attempt 1's); it refuses once more, b takes it
    st = h.status("llm")
    assert st.phase == Phase.PROVISIONING and h.compute.request_of("llm-2").zone == "us-central1-b"
    assert list(st.zone_rejections) == ["us-central1-a"]


def test_a_new_run_in_other_zones_on_the_event_path_never_starts_beside_the_old_runs_vm():
    """A run cancelled while its VM's delete fails, then resubmitted with other zones: the
    bucket event's pass lists the zones the status's history names too, so it finds the old
    VM, deletes it, and starts nothing beside it."""
    from controller.core import errors
    from tests.harness import BUCKET, Harness, spec_doc

    h = Harness()
    h.submit("j", spec_doc(zones=["us-central1-a"]))
    h.tick()
    h.tick()
    h.compute.faults.fail_next("delete", errors.TransientError("503"))
    h.cancel("j")
    h.tick("j")
    h.store.delete(BUCKET, names.cancel_key("j"))
    h.submit("j", spec_doc(zones=["us-central1-b"]))
    for _ in range(3):
        h.tick("j")
        assert len({i.attempt for i in h.compute.live("j")}) <= 1, "two attempts of one job alive at once"
    assert [i.name for i in h.compute.live("j")] == ["j-2"]
