"""TPU jobs (issue 9) through the whole engine over the fakes: a ``tpu:`` spec creates one
node per attempt through the TPU gateway, and each thing the TPU service can say of a node
(preempted, terminated by maintenance, under maintenance, hung, maintenance announced) leads
where the README says it does."""

from __future__ import annotations

import pytest

from controller.core import errors, names
from controller.core.ports import NodeHealth, NodeState, QueuedState
from controller.core.state import Phase
from tests.harness import PROJECT, Harness, spec_doc, tpu_spec_doc

ZONES = ["us-central2-b", "us-east5-a"]
TPU = {"type": "v4-16", "runtime_version": "tpu-ubuntu2204-base"}


def tpu_doc(**overrides):
    return tpu_spec_doc(**{"zones": ZONES, "tpu": TPU, "policy": {"backoff": {"initial": "30s", "max": "5m"},
                                                                   "maintenance_timeout": "20m"}, **overrides})


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    harness.submit("tpu", tpu_doc())
    harness.tick()
    return harness


def events(h: Harness, job: str = "tpu") -> list[str]:
    return [e.event for e in h.status(job).history]


def calls(h: Harness) -> list[tuple[str, str]]:
    return [c for c in h.tpu.calls if c[0] != "list"]


def test_a_tpu_spec_creates_one_node_with_the_agents_metadata_and_no_vm(h):
    st = h.status("tpu")
    assert st.phase == Phase.PROVISIONING and st.tpu and st.instances == ("tpu-1",)
    assert h.tpu.names() == ["tpu-1"] and h.live() == []
    r = h.tpu.request_of("tpu-1")
    assert (r.accelerator_type, r.runtime_version, r.spot, r.zone, r.project) == (
        "v4-16", "tpu-ubuntu2204-base", True, "us-central2-b", PROJECT)
    assert r.labels[names.MANAGED_LABEL] == "true" and r.labels[names.JOB_LABEL] == "tpu"
    assert r.metadata["respawn-node"] == "tpu-1" and r.metadata["respawn-token"] == st.attempt_token
    assert "startup-script" in r.metadata and "shutdown-script" in r.metadata
    h.tick()
    assert h.status("tpu").phase == Phase.RUNNING


def gone(h: Harness) -> None:
    """Time for the TPU API's deletes to be done (the fake's take 90 s, as Google's do), then a pass."""
    h.advance(seconds=h.tpu.delete_seconds + 1)
    h.tick()


def running(h: Harness) -> None:
    h.tick()
    assert h.status("tpu").phase == Phase.RUNNING
    h.tpu.calls.clear()


def test_a_preempted_node_is_deleted_then_created_again_from_the_latest_checkpoint(h):
    running(h)
    h.checkpoint(300)
    h.tpu.preempt("tpu-1")
    h.tick()
    st = h.status("tpu")
    # The node's delete is only accepted: it holds the zone's TPU quota until it is gone.
    assert st.phase == Phase.RECOVERING and st.attempt == 1 and "waiting for tpu-1 to be gone" in st.message
    assert calls(h) == [("delete", "tpu-1")]
    gone(h)
    st = h.status("tpu")
    assert st.attempt == 2 and st.preemptions == 1 and st.restarts == 1
    assert st.resume_from is not None and st.resume_from.step == 300
    assert calls(h) == [("delete", "tpu-1"), ("create", "tpu-2")]  # delete, then create once it is gone
    assert h.tpu.names() == ["tpu-2"]
    assert h.tpu.request_of("tpu-2").metadata["respawn-resume-step"] == "300"
    preempted = next(e for e in st.history if e.event == "preempted")
    assert "tpu-1" in preempted.detail


def test_a_node_terminated_by_maintenance_is_a_maintenance_restart_not_a_preemption(h):
    running(h)
    h.tpu.set_state("tpu-1", NodeState.TERMINATED)
    h.tick()
    gone(h)
    st = h.status("tpu")
    assert st.attempt == 2 and st.restarts == 1 and st.preemptions == 0 and st.failures == 0
    assert "maintenance" in events(h)
    assert h.tpu.names() == ["tpu-2"]


def test_a_node_under_maintenance_is_waited_for_and_resumes_when_google_brings_it_back(h):
    running(h)
    h.tpu.set_health("tpu-1", NodeHealth.UNHEALTHY_MAINTENANCE)
    h.tick()
    st = h.status("tpu")
    assert st.settling and "under host maintenance" in st.message and st.attempt == 1
    h.advance(minutes=15)
    h.tick()
    assert h.status("tpu").attempt == 1 and calls(h) == []
    h.tpu.set_health("tpu-1", NodeHealth.HEALTHY)
    h.tick()
    st = h.status("tpu")
    assert not st.settling and st.attempt == 1 and events(h)[-1] == "resumed"


def test_a_node_under_maintenance_past_the_policy_timeout_is_deleted_then_created_again(h):
    running(h)
    h.tpu.set_health("tpu-1", NodeHealth.UNHEALTHY_MAINTENANCE)
    h.tick()
    h.advance(minutes=21)
    h.tick()
    st = h.status("tpu")
    assert st.attempt == 1 and st.restarts == 1 and st.failures == 0 and st.preemptions == 0
    detail = next(e.detail for e in st.history if e.event == "maintenance")
    assert "tpu-1 is under host maintenance (UNHEALTHY_MAINTENANCE) for more than 20m" in detail
    # The node was still up: it is deleted first, and the next attempt waits for it to go.
    assert ("delete", "tpu-1") in calls(h) and "tpu-1" in h.tpu.names()
    gone(h)
    assert h.status("tpu").attempt == 2 and h.tpu.names() == ["tpu-2"]


@pytest.mark.parametrize("health", ["TIMEOUT", "UNHEALTHY_TENSORFLOW"])
def test_a_hung_node_counts_as_a_hang(h, health):
    running(h)
    h.advance(minutes=16)  # past the startup grace
    h.heartbeat("tpu")
    h.tpu.set_health("tpu-1", health)
    h.tick()
    st = h.status("tpu")
    assert st.failures == 1 and st.phase == Phase.RECOVERING
    assert f"tpu-1 health {health} (hung)" in st.message
    assert ("delete", "tpu-1") in calls(h)


def test_a_health_google_adds_later_is_not_a_hang(h):
    running(h)
    h.tpu.set_health("tpu-1", "HEALTH_FROM_THE_FUTURE")
    h.tick()
    st = h.status("tpu")
    assert st.failures == 0 and st.phase == Phase.RUNNING and calls(h) == []


@pytest.mark.parametrize("state", ["REPAIRING", "HIDDEN", "STATE_FROM_THE_FUTURE", "STOPPING"])
def test_a_state_that_is_not_gone_is_waited_out(h, state):
    running(h)
    h.tpu.set_state("tpu-1", state)
    h.tick()
    st = h.status("tpu")
    assert st.settling and st.attempt == 1 and calls(h) == []


def test_an_announced_maintenance_is_shown_in_the_status_once(h):
    running(h)
    h.tpu.upcoming_maintenance("tpu-1")
    h.tick()
    st = h.status("tpu")
    assert st.upcoming_maintenance == "tpu-1: SCHEDULED, starts 2026-11-24T10:00:00Z"
    generation = h.store.stat("respawn-test", names.status_key("tpu")).generation
    h.tick()
    assert h.store.stat("respawn-test", names.status_key("tpu")).generation == generation
    h.tpu.upcoming_maintenance("tpu-1", on=False)
    h.tick()
    assert h.status("tpu").upcoming_maintenance is None


def test_worker_0s_exit_0_succeeds_the_job_and_deletes_the_node(h):
    running(h)
    h.exit("tpu", 0)
    h.tick()
    assert h.status("tpu").phase == Phase.SUCCEEDED and ("delete", "tpu-1") in calls(h)
    h.advance(seconds=h.tpu.delete_seconds + 1)
    assert h.tpu.names() == []


def test_a_deleted_spec_cancels_the_job_and_deletes_its_node(h):
    running(h)
    h.store.delete("respawn-test", names.spec_key("tpu"))
    h.tick()
    assert h.status("tpu").phase == Phase.CANCELLED and ("delete", "tpu-1") in calls(h)
    h.advance(seconds=h.tpu.delete_seconds + 1)
    assert h.tpu.names() == []


def test_a_stockout_moves_to_the_next_zone_and_spot_steps_down_to_standard():
    h = Harness()
    h.tpu.stockout("us-central2-b")
    h.tpu.stockout("us-east5-a")
    h.submit("tpu", tpu_doc(provisioning=["spot", "standard"], policy={"fallback": {"stockouts": 2}}))
    h.tick()
    st = h.status("tpu")
    assert "step-down" in events(h) and st.provisioning == "standard"
    h.tpu.stockout("us-east5-a", on=False)
    h.advance(minutes=11)  # past the zones' cooldowns
    h.tick()
    r = h.tpu.request_of("tpu-1")
    assert not r.spot and r.zone == "us-east5-a"


def test_a_queued_tpu_waits_in_googles_queue_through_a_stockout():
    h = Harness()
    h.tpu.stockout("us-central2-b")
    h.submit("tpu", tpu_doc(tpu={**TPU, "queued": True}))
    h.tick()
    h.advance(hours=3)
    h.tick()
    st = h.status("tpu")
    assert st.phase == Phase.PROVISIONING and st.zone == "us-central2-b" and st.failures == 0
    assert h.tpu.queued_state("tpu-1") == QueuedState.WAITING_FOR_RESOURCES
    h.tpu.stockout("us-central2-b", on=False)
    h.tick()
    h.tick()
    assert h.status("tpu").phase == Phase.RUNNING


def test_a_tpu_list_that_fails_blinds_the_tpu_jobs_alone():
    h = Harness()
    h.submit("tpu", tpu_doc())
    h.tick()
    h.tick()
    h.tpu.failing_projects.add(PROJECT)  # e.g. the TPU API is not enabled
    h.tpu.preempt("tpu-1")
    h.submit("vm", spec_doc())
    h.tick()
    assert h.live() == ["vm-1"]  # the VM job went on
    st = h.status("tpu")
    assert st.attempt == 1 and st.phase == Phase.RUNNING  # not seen: not judged
    h.tpu.failing_projects.clear()
    h.tick()
    gone(h)
    assert h.status("tpu").attempt == 2


def test_a_list_that_raises_blinds_the_tpu_jobs_alone():
    h = Harness()
    h.submit("tpu", tpu_doc())
    h.tick()
    h.tpu.faults.fail_next("list", errors.TransientError("503"), times=1)
    h.submit("vm", spec_doc())
    summary = h.tick()
    assert h.live() == ["vm-1"] and "tpu" not in summary.errors


def test_a_node_left_by_a_spec_that_moved_from_tpu_to_vm_is_still_found_and_deleted():
    h = Harness()
    h.submit("tpu", tpu_doc())
    h.tick()
    h.tick()
    h.submit("tpu", spec_doc())  # replaced by a VM spec mid-run
    h.tpu.faults.fail_next("delete", errors.TransientError("503"), times=1)
    h.tpu.preempt("tpu-1")
    h.tick()
    st = h.status("tpu")
    assert st.attempt == 2 and h.live() == ["tpu-2"]  # the next attempt is a VM
    assert "tpu-1" in h.tpu.names()  # its delete failed: the node is a husk now
    gone(h)  # deleted again by this pass; done 90 s later
    h.advance(seconds=h.tpu.delete_seconds + 1)
    assert h.tpu.names() == []


def test_a_tpu_node_the_controller_did_not_create_is_never_touched(h):
    h.tpu.add_foreign(PROJECT, "us-central2-b", "tpu-9", {"respawn-job": "tpu", "respawn-attempt": "9"})
    for _ in range(3):
        h.tick()
        h.advance(minutes=5)
    assert "tpu-9" in h.tpu.names()


def test_a_tpu_job_never_asks_for_capacity_advice():
    from controller.adapters.memory import MemoryAdvisor

    h = Harness()
    h.advisor = MemoryAdvisor(h.compute)
    h.submit("tpu", tpu_doc())
    h.tick()
    assert h.advisor.calls == [] and h.tpu.names() == ["tpu-1"]
    assert h.status("tpu").zone == ZONES[0]


def test_the_heartbeat_grace_starts_when_the_node_runs(h):
    running(h)
    h.advance(minutes=20)
    h.heartbeat("tpu")
    h.tick()
    assert h.status("tpu").failures == 0
    h.advance(minutes=31)
    h.tick()
    assert h.status("tpu").failures == 1 and "no heartbeat" in h.status("tpu").message



def test_a_hung_health_within_the_startup_grace_or_with_hang_detection_off_is_not_a_failure():
    h = Harness()
    h.submit("tpu", tpu_doc())
    h.submit("calm", tpu_doc(policy={"idle_timeout": None}))
    h.tick()
    h.tick()
    h.tpu.set_health("tpu-1", "TIMEOUT")
    h.tpu.set_health("calm-1", "TIMEOUT")
    h.advance(minutes=5)
    h.tick()
    assert h.status("tpu").failures == 0 and h.status("calm").failures == 0
    h.advance(minutes=11)  # the grace is over: a hang, unless hang detection is off
    h.tick()
    assert h.status("tpu").failures == 1 and h.status("calm").failures == 0


def test_maintenance_timeout_zero_recreates_at_once():
    h = Harness()
    h.submit("tpu", tpu_doc(policy={"maintenance_timeout": "0s"}))
    h.tick()
    h.tick()
    h.tpu.set_health("tpu-1", NodeHealth.UNHEALTHY_MAINTENANCE)
    h.tick()  # says so
    h.advance(seconds=1)
    h.tick()
    gone(h)
    st = h.status("tpu")
    assert st.attempt == 2 and "maintenance" in events(h)


def fail_waiting_queued(h: Harness) -> None:
    """Google gives up on a waiting queued resource (a bad request, or its time constraint
    expired): FAILED, and no node."""
    with h.tpu._lock:
        for queued in h.tpu._queued.values():
            if queued.state == QueuedState.WAITING_FOR_RESOURCES:
                queued.state = QueuedState.FAILED


def test_a_failed_queued_resource_is_a_failure_that_backs_off_not_maintenance():
    h = Harness()
    h.tpu.stockout("us-central2-b")
    h.submit("tpu", tpu_doc(tpu={**TPU, "queued": True}))
    h.tick()
    for _ in range(4):
        fail_waiting_queued(h)
        h.tick()
    st = h.status("tpu")
    assert "maintenance" not in events(h) and st.failures == 1 and st.attempt == 1
    assert "refused" in st.message and st.not_before is not None  # backing off, not asking again at once


def test_a_tpu_quota_error_moves_on_to_a_zone_with_quota():
    h = Harness()
    h.tpu.quota("us-central2-b")  # TPU quota is per zone
    h.submit("tpu", tpu_doc())
    h.tick()
    st = h.status("tpu")
    assert h.tpu.names() == ["tpu-1"] and st.zone == "us-east5-a"
    quota = next(e for e in st.history if e.event == "quota")
    assert "us-central2-b" in st.zone_cooldowns and "us-east5-a" not in st.zone_cooldowns
    assert "quota exceeded in zone us-central2-b" in quota.detail and "PerZone" in quota.detail


def test_a_tpu_client_that_cannot_be_built_never_holds_a_vm_job(monkeypatch):
    from google.auth.exceptions import DefaultCredentialsError

    import controller.adapters.google as google
    from controller.service.bootstrap import LazyTpu

    def cannot(config):
        raise DefaultCredentialsError("Your default credentials were not found")

    monkeypatch.setattr(google, "tpu_gateway", cannot)
    h = Harness()
    h.tpu = LazyTpu(object())  # type: ignore[arg-type, assignment]
    h.submit("tpu", tpu_doc())
    h.submit("vm", spec_doc())
    summary = h.tick()
    assert h.live() == ["vm-1"]
    assert "cannot build the Cloud TPU client" in summary.errors[f"project {PROJECT}"]
    # The TPU job waits, and its status says why, in Google's words (once, not every pass).
    st = h.status("tpu")
    assert st.message.startswith(f"waiting: cannot list this job's instances in project {PROJECT}: TPU nodes: ")
    assert "cannot build the Cloud TPU client" in st.message and st.attempt == 0
    generation = h.store.stat("respawn-test", names.status_key("tpu")).generation
    h.tick()
    assert h.store.stat("respawn-test", names.status_key("tpu")).generation == generation


def test_a_spec_moved_from_vms_to_a_tpu_while_the_insert_is_pending_never_runs_both():
    h = Harness()
    h.submit("j", spec_doc(zones=["us-central1-a"]))
    h.compute.hold_inserts = True  # Compute accepted the insert; its operation still runs
    h.tick()
    h.submit("j", tpu_doc(zones=["us-central1-a"]))  # submit --replace: a TPU job now, same zone
    h.tick()  # the VM is listed (PROVISIONING) already: adopted, never created as a TPU too
    assert h.tpu.names() == []
    h.compute.release_inserts()
    for _ in range(3):
        h.tick()
        h.advance(minutes=5)
        assert not (h.live("j") and h.tpu.names()), "a VM and a TPU node of one job at once"
    st = h.status("j")
    assert st.attempt == 1 and h.live("j") == ["j-1"] and "adopted" in events(h, "j")


def test_a_spec_moved_to_a_tpu_before_its_attempt_exists_creates_it_as_a_tpu_with_a_fresh_capacity_record():
    h = Harness()
    h.submit("j", spec_doc(zones=["us-central1-a"], provisioning=["spot", "standard"],
                           policy={"zone_cooldown": "5m", "fallback": {"wait": "30m"}}))
    h.compute.stockouts.add("us-central1-a")
    h.tick()
    for _ in range(7):  # 35 minutes of VM stockouts on Spot
        h.advance(minutes=5, seconds=1)
        h.tick()
    h.submit("j", tpu_doc(zones=["us-central1-a"], provisioning=["spot", "standard"]))
    h.tick()  # still cooling: the VMs' record steps nothing down for the TPU
    h.advance(minutes=6)
    h.tick()
    st = h.status("j")
    assert h.tpu.names() == ["j-1"] and h.tpu.request_of("j-1").spot and h.live("j") == []
    assert st.attempt == 1 and st.attempt_tpu and st.tpu and "respec" in events(h, "j")
    assert "the spec moved from VMs to a TPU node" in next(e.detail for e in st.history if e.event == "respec")


def test_a_tpu_node_whose_delete_failed_is_still_deleted_after_a_new_run_on_vms_is_cancelled():
    h = Harness()
    h.submit("j", tpu_doc(zones=["us-east5-a"]))
    h.tick()
    h.tick()
    h.tpu.faults.fail_next("delete", errors.RequestError("403 permission denied"))
    h.exit("j", 0)
    h.tick()  # SUCCEEDED; deleting j-1 failed
    h.compute.unreachable.add("us-central1-a")  # the next run cannot launch at once
    h.submit("j", spec_doc(zones=["us-central1-a"]))  # a new run, on VMs
    h.tick()
    h.store.delete("respawn-test", names.spec_key("j"))  # and it is cancelled before its first attempt
    h.tick()
    h.compute.unreachable.clear()
    gone(h)
    assert h.tpu.names() == [] and h.status("j").phase == Phase.CANCELLED


# -- issue 22: a TPU job's own husk never moves it, nor holds it forever -------------------------


def test_a_recovering_spot_tpu_waits_for_its_own_husk_and_never_steps_down_because_of_it():
    """One zone, ``[spot, standard]``, room for one Spot node: the preempted node's delete is only
    accepted, and it holds the Spot quota until it is gone (Google's take a minute or more)."""
    h = Harness()
    h.tpu.quota_limit[("us-central2-b", True)] = 1
    h.submit("tpu", tpu_doc(zones=["us-central2-b"], provisioning=["spot", "standard"]))
    h.tick()
    running(h)
    h.tpu.preempt("tpu-1")
    for _ in range(3):  # passes while the delete is under way: nothing is created beside it
        h.tick()
        h.advance(seconds=20)
    assert calls(h) == [("delete", "tpu-1")]
    gone(h)
    st = h.status("tpu")
    assert st.attempt == 2 and st.provisioning == "spot" and h.tpu.request_of("tpu-2").spot
    assert not {"step-down", "stockout", "quota"} & set(events(h))


def test_a_quota_error_held_by_the_jobs_own_node_is_never_a_stockout():
    """A husk whose delete keeps failing is waited for 10 minutes, then the next node is created
    anyway; the quota error that follows names the husk, and never cools the zone or steps down."""
    h = Harness()
    h.tpu.quota_limit[("us-central2-b", True)] = 1
    h.submit("tpu", tpu_doc(zones=["us-central2-b"], provisioning=["spot", "standard"],
                            policy={"fallback": {"stockouts": 1}}))
    h.tick()
    running(h)
    h.tpu.faults.fail_next("delete", errors.TransientError("503 backend error"), times=1000)
    h.tpu.preempt("tpu-1")
    h.tick()
    st = h.status("tpu")
    assert st.attempt == 1 and "cannot delete tpu-1" in st.message  # what is wrong, said
    h.advance(minutes=11)
    h.tick()
    st = h.status("tpu")
    assert st.attempt == 2 and st.provisioning == "spot" and st.zone_cooldowns == {}
    assert "held by this job's own tpu-1" in st.message
    assert not {"step-down", "stockout"} & set(events(h))
    h.tpu.faults.fail_next("delete", errors.TransientError("503"), times=0)
    h.tpu.faults = type(h.tpu.faults)()  # the delete works again: the husk goes, the node comes
    for _ in range(4):
        h.advance(minutes=2)
        h.tick()
    assert h.tpu.names() == ["tpu-2"] and h.tpu.request_of("tpu-2").spot


def test_a_preempted_node_whose_delete_keeps_failing_holds_the_next_attempt_ten_minutes_at_most():
    h = Harness()
    h.submit("tpu", tpu_doc())
    h.tick()
    running(h)
    h.tpu.faults.fail_next("delete", errors.RequestError("403 tpu.nodes.delete denied"), times=1000)
    h.tpu.preempt("tpu-1")
    h.tick()
    assert h.status("tpu").attempt == 1 and "cannot delete tpu-1" in h.status("tpu").message
    h.advance(minutes=11)
    h.tick()
    st = h.status("tpu")
    assert st.attempt == 2 and "tpu-2" in h.tpu.names()
    assert "tpu-1 still not gone after 10m" in next(e.detail for e in st.history if e.event == "launch" and e.attempt == 2)


def test_a_tpu_node_whose_job_folder_is_deleted_whole_is_found_and_deleted_as_an_orphan(h):
    """Spec and status deleted together: nothing names the node's zone any more but the
    controller's own record of the zones it created TPU nodes in."""
    running(h)
    for key in (names.spec_key("tpu"), names.status_key("tpu")):
        h.store.delete("respawn-test", key)
    h.tick()
    assert ("delete", "tpu-1") in calls(h), "the node bills forever: never listed again"
    h.advance(seconds=h.tpu.delete_seconds + 1)
    assert h.tpu.names() == []


def test_no_tpu_node_is_created_in_a_zone_the_controller_could_not_record():
    from controller.service.tpuzones import KEY, parse

    h = Harness()
    h.store.put("respawn-test", KEY, b"not json")  # garbage is read as no zones, and written over
    real_write = h.store.write

    def refusing(bucket, name, data, **kw):
        if name == KEY:
            raise errors.TransientError("503 backend error")
        return real_write(bucket, name, data, **kw)

    h.store.write = refusing
    h.submit("tpu", tpu_doc())
    h.tick()
    assert h.tpu.names() == [] and ("create", "tpu-1") not in calls(h)
    assert "could not record TPU zone" in h.status("tpu").message or "503" in h.status("tpu").message
    h.store.write = real_write
    h.advance(minutes=1)
    h.tick()
    assert h.tpu.names() == ["tpu-1"]
    assert (PROJECT, "us-central2-b") in parse(h.store.read("respawn-test", KEY).data)


def test_a_tpu_api_that_does_not_answer_never_holds_a_vm_jobs_recovery():
    """The TPU listing has its own bound: past it the TPU jobs are blind for the pass, and the
    VM jobs, listed beside it, are judged and recovered without waiting for it."""
    import threading
    import time


    h = Harness(workers=4)
    h.submit("tpu", tpu_doc())
    h.submit("vm", spec_doc())
    h.tick()
    h.tick()
    assert h.live() == ["vm-1"] and h.status("tpu").phase == Phase.RUNNING
    hung, real_list = threading.Event(), h.tpu.list_nodes

    def never_answers(*args, **kw):
        hung.wait(30)
        return real_list(*args, **kw)

    h.tpu.list_nodes = never_answers
    h.compute.preempt("vm-1")
    engine = h.engine()
    engine.observer.tpu_timeout = 0.5
    engine.observer.replayable = False  # as deployed: the TPU listing on a thread of its own, bounded
    try:
        started = time.monotonic()
        engine.reconcile()
        took = time.monotonic() - started
    finally:
        hung.set()
    assert took < 10, f"the pass waited {took:.1f}s on the TPU API"
    assert h.status("vm").attempt == 2 and "vm-2" in h.live()
    st = h.status("tpu")
    assert st.attempt == 1 and st.phase == Phase.RUNNING  # not seen: not judged


def test_a_tpu_zone_the_project_may_not_use_is_skipped_naming_it_and_the_permission():
    h = Harness()
    h.tpu.denied_zones.add("us-central2-b")
    h.submit("tpu", tpu_doc())
    h.tick()
    st = h.status("tpu")
    assert st.zone == "us-east5-a" and h.tpu.names() == ["tpu-1"]
    launch = next(e.detail for e in st.history if e.event == "launch")
    assert "skipping" in launch and "us-central2-b" in launch and "tpu.nodes.create" in launch


def test_a_tpu_job_with_no_usable_zone_fails_saying_why_instead_of_waiting_forever():
    h = Harness()
    h.tpu.denied_zones.update(ZONES)
    h.submit("tpu", tpu_doc())
    h.tick()
    st = h.status("tpu")  # not at once: a grant made by a deploy just before takes minutes to hold
    assert st.phase == Phase.PENDING and st.message.startswith("waiting: no zone of the spec can be used")
    h.advance(minutes=11)
    h.tick()
    st = h.status("tpu")
    assert st.phase == Phase.FAILED and h.tpu.names() == []
    assert "no zone of the spec can be used" in st.message and all(z in st.message for z in ZONES)
    assert "Permission denied on 'locations/us-central2-b'" in st.message


def test_a_running_tpu_jobs_zone_the_project_may_no_longer_use_is_said_not_judged(h):
    running(h)
    h.tpu.denied_zones.add("us-central2-b")  # a grant revoked: the node may still be there
    h.tick()
    st = h.status("tpu")
    assert st.phase == Phase.RUNNING and st.attempt == 1 and calls(h) == []
    assert "cannot see tpu-1" in st.message and "us-central2-b" in st.message
