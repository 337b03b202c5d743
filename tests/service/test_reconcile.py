"""Every planner rule, end to end over the in-memory fakes: observe -> plan -> act."""

from __future__ import annotations

import json

import pytest

from controller.core import errors, names
from controller.core.ports import InstanceStatus, StopReason
from controller.core.state import Phase
from tests.harness import BUCKET, PROJECT, Harness, spec_doc


def started(h: Harness, job: str = "llm", **spec) -> None:
    h.submit(job, spec_doc(**spec) if spec else None)
    h.tick()
    h.tick()  # sees the VM running
    assert h.status(job).phase == Phase.RUNNING


def history(h: Harness, job: str = "llm") -> list[str]:
    return [e.event for e in h.status(job).history]


class TestNewJob:
    def test_new_spec_creates_one_vm_with_metadata_and_labels(self, h):
        h.submit("llm")
        h.tick()
        assert h.live() == ["llm-1"]
        request = h.compute.request_of("llm-1")
        assert request.zone == "us-central1-a" and request.project == PROJECT and request.spot
        assert dict(request.labels) == {"respawn-managed": "true", "respawn-job": "llm", "respawn-attempt": "1",
                                       "respawn-shard": names.shard_label("llm")}
        md = request.metadata
        assert (md["respawn-job"], md["respawn-bucket"], md["respawn-attempt"]) == ("llm", BUCKET, "1")
        assert md["respawn-resume-from"] == ""
        assert md["respawn-command"] == "python train.py"
        assert md["startup-script"] == h.ctx.startup_script and md["shutdown-script"] == h.ctx.shutdown_script
        assert h.status("llm").phase == Phase.PROVISIONING and h.status("llm").inserted

    def test_converged_state_takes_no_action(self, h):
        started(h)
        calls = len(h.store.calls)
        summary = h.tick()
        assert summary.jobs == {"llm": []}
        assert not [c for c in h.store.calls[calls:] if c[0] in ("write", "delete")]
        assert [c for c in h.compute.calls if c[0] in ("insert", "delete")] == [("insert", "llm-1")]

    def test_vm_still_booting_is_waited_for(self, h):
        h.compute.boot_status = InstanceStatus.STAGING
        h.submit("llm")
        h.tick()
        assert h.tick().jobs == {"llm": []}
        assert h.status("llm").phase == Phase.PROVISIONING


class TestPreemption:
    def test_marker_recreates_from_latest_complete_checkpoint(self, h):
        started(h)
        h.checkpoint(100)
        h.checkpoint(200, complete=False)  # being written when the VM was reclaimed
        h.compute.preempt("llm-1")
        h.marker("llm")
        h.tick()
        st = h.status("llm")
        assert (st.phase, st.attempt, st.preemptions, st.failures) == (Phase.PROVISIONING, 2, 1, 0)
        assert st.resume_from and st.resume_from.uri == "gs://ckpts/run/100" and st.resume_from.step == 100
        assert h.metadata("llm-2")["respawn-resume-from"] == "gs://ckpts/run/100"
        assert h.live() == ["llm-2"] and "llm-1" in h.compute.deleted
        assert not h.store.exists(BUCKET, names.marker_key("llm"))

    def test_marker_survives_a_failed_insert(self, h):
        started(h)
        h.compute.preempt("llm-1")
        h.marker("llm")
        h.compute.faults.fail_next("insert", errors.TransientError("503 backend error"))
        summary = h.tick()
        assert summary.transient == ["llm"]
        assert h.store.exists(BUCKET, names.marker_key("llm")), "marker deleted before its replacement existed"
        h.tick()
        assert h.live() == ["llm-2"] and not h.store.exists(BUCKET, names.marker_key("llm"))
        assert h.status("llm").preemptions == 1  # counted once, not once per pass

    def test_maintenance_marker_recovers_without_counting_a_preemption(self, h):
        started(h)
        h.marker("llm", reason="maintenance")
        h.tick()
        st = h.status("llm")
        assert (st.attempt, st.preemptions, st.restarts, st.failures) == (2, 0, 1, 0)
        assert "maintenance marker" in st.history[-3].detail

    def test_marker_on_a_still_running_vm_deletes_it_first(self, h):
        started(h)
        h.marker("llm")  # the 30 s notice: the shutdown script wrote it, the VM is still up
        h.tick()
        assert h.live() == ["llm-2"]

    def test_terminated_without_marker_classified_as_preempted(self, h):
        started(h)
        h.compute.preempt("llm-1")  # too early to write a marker
        h.tick()
        st = h.status("llm")
        assert (st.attempt, st.preemptions, st.failures, st.restarts) == (2, 1, 0, 1)

    def test_preempted_vm_deleted_by_termination_action_is_recovered(self, h):
        started(h, policy={"termination_action": "delete"})
        h.compute.preempt("llm-1")
        assert h.compute.all() == []
        h.tick()
        assert h.live() == ["llm-2"] and h.status("llm").preemptions == 1

    def test_terminated_without_marker_classified_as_crash_counts_as_failure(self, h):
        started(h)
        h.compute.terminate("llm-1", StopReason.CRASHED)
        h.tick()
        st = h.status("llm")
        assert (st.phase, st.failures, st.preemptions) == (Phase.RECOVERING, 1, 0)

    def test_user_stop_recovers_without_counting_a_failure(self, h):
        started(h)
        h.compute.terminate("llm-1", StopReason.STOPPED)
        h.tick()
        st = h.status("llm")
        assert (st.attempt, st.failures, st.restarts) == (2, 0, 1)

    def test_stale_marker_from_older_attempt_is_only_cleaned_up(self, h):
        started(h)
        h.marker("llm")
        h.tick()  # attempt 2
        h.tick()
        h.marker("llm", attempt=1)  # a late shutdown script of attempt 1
        h.tick()
        st = h.status("llm")
        assert (st.attempt, st.preemptions) == (2, 1) and h.live() == ["llm-2"]
        assert not h.store.exists(BUCKET, names.marker_key("llm"))

    def test_exit_record_of_a_killed_trainer_from_older_attempt_is_ignored(self, h):
        started(h)
        h.marker("llm")
        h.tick()
        h.exit("llm", 143, attempt=1)  # SIGTERM during preemption
        h.tick()
        st = h.status("llm")
        assert (st.phase, st.attempt, st.failures) == (Phase.RUNNING, 2, 0)

    def test_preemptions_count_against_max_restarts_only(self, h):
        started(h, policy={"max_restarts": 2, "max_failures": 0})
        for attempt in (1, 2):
            h.compute.preempt(f"llm-{attempt}")
            h.tick()
            h.tick()
        assert h.status("llm").phase == Phase.RUNNING
        h.compute.preempt("llm-3")
        h.tick()
        st = h.status("llm")
        assert st.phase == Phase.FAILED and "restart budget" in st.message
        assert h.live() == []


class TestExit:
    def test_exit_zero_succeeds_and_deletes_vm_never_recreated(self, h):
        started(h)
        h.exit("llm", 0)
        h.tick()
        assert h.status("llm").phase == Phase.SUCCEEDED and h.live() == []
        h.marker("llm", attempt=1)  # a late marker must not resurrect it
        h.compute.preempt  # noqa: B018 (nothing left to preempt)
        for _ in range(3):
            h.tick()
        assert h.status("llm").phase == Phase.SUCCEEDED and h.live() == []
        assert [c for c in h.compute.calls if c[0] == "insert"] == [("insert", "llm-1")]

    def test_exit_zero_seen_after_guest_power_off(self, h):
        started(h)
        h.exit("llm", 0)
        h.compute.terminate("llm-1", StopReason.UNKNOWN)  # the startup script powers off
        h.tick()
        assert h.status("llm").phase == Phase.SUCCEEDED

    def test_nonzero_exit_backs_off_then_restarts_until_max_failures(self, h):
        started(h, policy={"max_failures": 2, "crash_loop_failures": 10,
                           "backoff": {"initial": "1m", "max": "10m"}})
        delays = []
        for attempt in (1, 2):
            h.checkpoint(attempt * 10)  # progress, so this is no crash loop
            h.exit("llm", 1)
            h.tick()
            st = h.status("llm")
            assert st.phase == Phase.RECOVERING and h.live() == []
            delays.append(st.not_before - h.clock.now())
            h.tick()
            assert h.live() == [], "restarted before the backoff elapsed"
            h.clock.advance(st.not_before - h.clock.now())
            h.tick()
            h.tick()
            assert h.live() == [f"llm-{attempt + 1}"]
        assert delays[0].total_seconds() == 60
        h.exit("llm", 1)
        h.tick()
        st = h.status("llm")
        assert st.phase == Phase.FAILED and "failure budget exhausted" in st.message and h.live() == []

    def test_backoff_grows_without_checkpoint_progress(self, h):
        started(h, policy={"max_failures": 5, "crash_loop_failures": 5, "backoff": {"initial": "1m", "max": "3m"}})
        waits = []
        for _ in range(3):
            h.exit("llm", 1)
            h.tick()
            st = h.status("llm")
            waits.append((st.not_before - h.clock.now()).total_seconds())
            h.clock.advance(st.not_before - h.clock.now())
            h.tick()
            h.tick()
        assert waits == [60, 120, 180]

    def test_crash_loop_without_checkpoint_progress_stops_restarting(self, h):
        started(h, policy={"max_failures": 10, "crash_loop_failures": 3, "backoff": {"initial": "1s", "max": "1s"}})
        h.checkpoint(50)
        for _ in range(3):
            h.exit("llm", 1)
            h.tick()
            h.advance(seconds=2)
            h.tick()
            h.tick()
        st = h.status("llm")
        assert st.phase == Phase.FAILED and "crash loop" in st.message and "gs://ckpts/run/50" in st.message
        assert st.failures == 3 and h.live() == []


class TestCapacity:
    def test_stockout_in_first_zone_moves_same_attempt_to_second(self, h):
        h.compute.stockouts.add("us-central1-a")
        h.submit("llm")
        h.tick()
        st = h.status("llm")
        assert (st.attempt, st.zone, st.phase) == (1, "us-central1-b", Phase.PROVISIONING)
        assert h.live() == ["llm-1"] and h.compute.request_of("llm-1").zone == "us-central1-b"
        assert "us-central1-a" in st.zone_cooldowns
        [stockout] = [e for e in st.history if e.event == "stockout"]
        assert "ZONE_RESOURCE_POOL_EXHAUSTED" in stockout.detail and stockout.zone == "us-central1-a"

    def test_every_zone_stocked_out_waits_for_cooldown_then_retries(self, h):
        h.compute.stockouts.update({"us-central1-a", "us-central1-b"})
        h.submit("llm", spec_doc(policy={"zone_cooldown": "5m"}))
        h.tick()
        st = h.status("llm")
        assert h.live() == [] and st.not_before is not None and "no zone left" in st.message
        h.tick()
        assert [c for c in h.compute.calls if c[0] == "insert"].__len__() == 2, "retried during cooldown"
        h.compute.stockouts.clear()
        h.advance(minutes=5)
        h.tick()
        assert h.live() == ["llm-1"] and h.status("llm").attempt == 1

    def test_quota_error_backs_off_visibly(self, h):
        h.compute.quota_exhausted.add("us-central1-a")
        h.submit("llm")
        h.tick()
        st = h.status("llm")
        assert h.live() == [] and st.not_before is not None
        assert "quota exceeded" in st.message and "quota" in history(h)
        h.compute.quota_exhausted.clear()
        h.advance(minutes=1)
        h.tick()
        assert h.live() == []  # the region's zones cool down, as after a stockout
        h.advance(minutes=10)
        h.tick()
        assert h.live() == ["llm-1"]

    def test_rejected_request_fails_the_job_with_the_reason(self, h):
        h.compute.faults.fail_next("insert", errors.RequestError("image family 'nope' not found"), times=2)
        h.submit("llm")
        h.tick()
        st = h.status("llm")
        assert st.phase == Phase.FAILED and "image family 'nope'" in st.message


class TestLifetime:
    def test_over_age_vm_is_recycled_from_checkpoint(self, h):
        started(h, policy={"max_instance_age": "24h", "idle_timeout": None})
        h.checkpoint(10)
        h.advance(hours=23)
        h.tick()
        assert h.live() == ["llm-1"]
        h.advance(hours=1)
        h.tick()
        st = h.status("llm")
        assert h.live() == ["llm-2"] and (st.recycles, st.restarts, st.failures) == (1, 0, 0)
        assert st.resume_from and st.resume_from.step == 10

    def test_deadline_fails_job_and_deletes_vms(self, h):
        started(h, policy={"max_runtime": "2h", "idle_timeout": None})
        h.advance(hours=2)
        h.tick()
        st = h.status("llm")
        assert st.phase == Phase.FAILED and "deadline" in st.message and h.live() == []

    def test_stale_heartbeat_after_grace_restarts(self, h):
        started(h, policy={"idle_timeout": "10m", "startup_grace": "5m", "max_failures": 3})
        h.advance(minutes=4)
        h.heartbeat("llm")
        h.advance(minutes=10)
        h.tick()
        assert h.live() == ["llm-1"], "restarted while heartbeats were fresh"
        h.advance(minutes=1)
        h.tick()
        st = h.status("llm")
        assert st.phase == Phase.RECOVERING and st.failures == 1 and "no heartbeat" in st.message

    def test_no_heartbeat_at_all_is_tolerated_during_startup_grace(self, h):
        started(h, policy={"idle_timeout": "10m", "startup_grace": "15m"})
        h.advance(minutes=24)
        h.tick()
        assert h.status("llm").phase == Phase.RUNNING
        h.advance(minutes=2)
        h.tick()
        assert h.status("llm").phase == Phase.RECOVERING


class TestOwnership:
    def test_orphan_labelled_vm_is_deleted(self, h):
        h.compute.add_foreign(PROJECT, "us-central1-a", "gone-3",
                              {"respawn-managed": "true", "respawn-job": "gone", "respawn-attempt": "3"})
        h.tick()
        assert h.compute.all() == []

    def test_vm_without_the_label_is_never_deleted(self, h):
        h.compute.add_foreign(PROJECT, "us-central1-a", "llm-1", {"respawn-job": "llm", "respawn-attempt": "1"})
        h.compute.add_foreign(PROJECT, "us-central1-a", "someone-else", {"team": "x"})
        h.submit("llm")
        h.cancel("other")
        for _ in range(3):
            h.tick()
        assert {"llm-1", "someone-else"} <= {i.name for i in h.compute.all()}
        assert "someone-else" not in h.compute.deleted

    def test_orphan_whose_spec_appears_meanwhile_is_spared(self, h):
        h.compute.add_foreign(PROJECT, "us-central1-a", "new-1",
                              {"respawn-managed": "true", "respawn-job": "new", "respawn-attempt": "1"})
        engine = h.engine()
        world = engine.observer.world()
        h.submit("new")  # written after the listing, before the delete
        view, actions = engine.plan(world.jobs["new"])
        engine.executor.apply(view, actions, h.clock.now())
        assert "new-1" not in h.compute.deleted

    def test_cancel_deletes_vms_and_stops(self, h):
        started(h)
        h.cancel("llm")
        h.tick()
        assert h.status("llm").phase == Phase.CANCELLED and h.live() == []
        h.tick()
        assert h.live() == []

    def test_deleting_the_spec_cancels(self, h):
        started(h)
        h.store.delete(BUCKET, names.spec_key("llm"))
        h.tick()
        assert h.status("llm").phase == Phase.CANCELLED and h.live() == []

    def test_resubmitting_after_success_starts_a_new_run_with_new_names(self, h):
        started(h)
        h.exit("llm", 0)
        h.tick()
        h.submit("llm")
        h.tick()
        st = h.status("llm")
        assert (st.phase, st.attempt, st.failures) == (Phase.PROVISIONING, 2, 0) and h.live() == ["llm-2"]


class TestGang:
    def test_gang_created_together_in_one_zone(self, h):
        h.submit("dist", spec_doc(nodes=3))
        h.tick()
        assert h.live() == ["dist-1-n0", "dist-1-n1", "dist-1-n2"]
        zones = {h.compute.request_of(n).zone for n in h.live()}
        assert zones == {"us-central1-a"}
        md = [h.metadata(f"dist-1-n{r}") for r in range(3)]
        assert all(m == md[0] for m in md), "bulkInsert gives every node the same metadata"
        assert md[0]["respawn-master-addr"] == "dist-1-n0" and md[0]["respawn-nodes"] == "3"

    def test_losing_one_node_recreates_the_whole_gang(self, h):
        h.submit("dist", spec_doc(nodes=3))
        h.tick()
        h.tick()
        h.compute.preempt("dist-1-n1")
        h.tick()
        assert h.live() == ["dist-2-n0", "dist-2-n1", "dist-2-n2"]
        assert {"dist-1-n0", "dist-1-n1", "dist-1-n2"} <= set(h.compute.deleted)
        assert h.status("dist").preemptions == 1

    def test_gang_stockout_moves_all_nodes(self, h):
        h.compute.stockouts.add("us-central1-a")
        h.submit("dist", spec_doc(nodes=2))
        h.tick()
        assert {h.compute.request_of(n).zone for n in h.live()} == {"us-central1-b"}


class TestBadInput:
    @pytest.mark.parametrize(
        "body, field",
        [
            ("zones: [us-central1-a\n", "spec.yaml"),
            (json.dumps({**spec_doc(), "colour": "red"}), "colour"),
            (json.dumps({**spec_doc(), "nodes": "many"}), "nodes"),
            (json.dumps({**spec_doc(), "machine_type": "a3-megagpu-8g", "nodes": 99}), "nodes"),
        ],
    )
    def test_invalid_spec_fails_with_reason_and_others_run(self, h, body, field):
        h.submit("good")
        h.submit("bad", body)
        summary = h.tick()
        st = h.status("bad")
        assert st.phase == Phase.FAILED and any(e.startswith(field) for e in st.errors), st.errors
        assert h.live() == ["good-1"] and "good" not in summary.errors

    def test_hostile_job_name_gets_a_status_and_nothing_else(self, h):
        h.submit("Robert'); DROP", spec_doc())
        h.submit("good")
        h.tick()
        st = h.status("Robert'); DROP")
        assert st.phase == Phase.FAILED and st.errors[0].startswith("name:")
        assert h.live() == ["good-1"]

    def test_fixed_spec_runs_again(self, h):
        h.submit("llm", "nodes: [")
        h.tick()
        assert h.status("llm").phase == Phase.FAILED
        h.tick()
        assert len(h.status("llm").history) == 1  # converged: not rewritten every pass
        h.submit("llm")
        h.tick()
        assert h.live() == ["llm-1"]

    def test_garbage_marker_is_never_acted_on(self, h):
        started(h)
        h.store.put(BUCKET, names.marker_key("llm"), b"\x00\xffnot json")
        h.tick()
        assert h.status("llm").preemptions == 0 and h.live() == ["llm-1"]

    def test_unreadable_status_starts_over_instead_of_crashing(self, h):
        h.submit("llm")
        h.store.put(BUCKET, names.status_key("llm"), "{oops")
        h.tick()
        assert h.live() == ["llm-1"]

    def test_one_jobs_checkpoint_bucket_error_does_not_stop_the_others(self, h):
        class BrokenCheckpoints:
            def __getattr__(self, name):
                return getattr(h.store, name)

            def list(self, bucket, prefix):
                if bucket == "broken-ckpts":
                    raise errors.TransientError("checkpoint bucket 503")
                return h.store.list(bucket, prefix)

        h.submit("a", spec_doc(checkpoint={"uri": "gs://broken-ckpts/a"}))
        h.submit("b")
        summary = h.engine(store=BrokenCheckpoints()).reconcile()
        assert h.live() == ["b-1"] and summary.transient == []
        assert "cannot list checkpoint.uri gs://broken-ckpts/a" in h.status("a").message
        assert "checkpoint bucket 503" in h.status("a").message

    def test_one_jobs_read_error_does_not_stop_the_others(self, h):
        h.submit("a")
        h.submit("b")
        h.store.faults.fail_next("read", errors.TransientError("GCS 503"))
        summary = h.tick()
        assert len(h.live()) == 1 and len(summary.transient) == 1
        h.tick()
        assert h.live() == ["a-1", "b-1"]


@pytest.mark.parametrize("left", ["running", "terminated"])
def test_a_run_numbered_while_a_zone_was_blind_never_adopts_the_previous_runs_vm_found_later(left: str):
    """Found by chaos (seed 15 of issue 22's proof): the job folder is deleted whole and the
    job resubmitted while the zone of the old run's VM does not answer; the new run is
    numbered without it (attempt 0). When the zone answers again, that VM, created before
    this run began, is the old run's leftover: the run's attempts go after it (as a new run
    numbers them when it sees one), it is deleted, and it is never adopted as this run's
    attempt (its old command taken for the new spec's, or its crash counted against the new
    run's budget)."""
    h = Harness()
    h.submit("j", spec_doc(zones=["us-central1-a"]))
    h.tick()
    h.tick()
    assert h.live("j") == ["j-1"]
    if left == "terminated":
        h.compute.terminate("j-1", StopReason.CRASHED)
    for key in [names.spec_key("j"), names.status_key("j")]:  # gsutil rm -r gs://BUCKET/jobs/j/
        h.store.delete(BUCKET, key)
    h.compute.unreachable.add("us-central1-a")
    h.advance(seconds=30)
    h.submit("j", spec_doc(zones=["us-central1-a"]))
    h.tick()
    assert h.status("j").attempt == 0  # numbered blind
    h.compute.unreachable.discard("us-central1-a")
    for _ in range(4):
        h.advance(minutes=1)
        h.tick()
    st = h.status("j")
    assert "adopted" not in [e.event for e in st.history], st.message
    assert (st.restarts, st.failures) == (0, 0), st.message
    assert h.live("j") == ["j-2"] and st.attempt == 2 and st.phase == Phase.RUNNING, st.message


@pytest.mark.parametrize("kind", ["vm", "tpu"])
def test_a_job_resubmitted_over_zones_its_deleted_run_did_not_use_never_runs_beside_that_runs_vm(kind: str):
    """Found by chaos (seeds 12084, 12927): the job folder deleted whole while its VM (or TPU node)
    runs in us-central1-b, then the job resubmitted over other zones; the event for the new spec
    listed only the new spec's zones, saw nothing, and created attempt 1 beside the old one. A run
    that has launched nothing looks everywhere first (the aggregated list; the zones respawn
    recorded for TPU nodes), finds the old run's machine, and goes after it."""
    h = Harness()
    old = spec_doc(zones=["us-central1-b"])
    if kind == "tpu":
        old = {**{k: v for k, v in old.items() if k != "machine_type"},
               "zones": ["us-central2-b"], "tpu": {"type": "v4-16", "runtime_version": "tpu-ubuntu2204-base"}}
    h.submit("j", old)
    h.tick()
    h.tick()
    was = h.tpu.names() if kind == "tpu" else h.live("j")
    assert was == ["j-1"]
    for key in [names.spec_key("j"), names.status_key("j")]:  # gsutil rm -r gs://BUCKET/jobs/j/
        h.store.delete(BUCKET, key)
    h.advance(seconds=30)
    h.submit("j", spec_doc(zones=["us-central1-c", "us-central1-a"]))
    h.tick("j")  # the event for the new spec
    h.tick("j")
    st = h.status("j")
    if kind == "vm":  # the old VM deleted first (the new run numbered after it), then attempt 2
        assert h.live("j") == ["j-2"] and st.attempt == 2 and "j-1" in h.compute.deleted
        return
    # The old run's TPU node is alive: it is deleted and waited for, and no VM runs beside it.
    assert h.live("j") == [] and ("delete", "j-1") in h.tpu.calls
    h.advance(seconds=h.tpu.delete_seconds + 1)
    h.tick("j")
    assert h.live("j") == ["j-2"] and h.status("j").attempt == 2 and h.tpu.names() == []
