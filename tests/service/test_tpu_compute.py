"""TPU slices in Compute Engine (issue 38) through the whole engine over the fakes: a spec's
``tpu.machine_type`` creates one slice per attempt through Compute Engine's slice gateway (one
instance, or a MIG of hosts), never through the Cloud TPU API, and a slice one of whose hosts is
lost is replaced whole, from the newest checkpoint, once the old one is gone."""

from __future__ import annotations

import pytest
import yaml

from controller.core import errors, names
from controller.core.ports import NodeState, StopReason
from controller.core.state import Phase
from tests.harness import BUCKET, PROJECT, Harness, lost_unseen, tpu_spec_doc

SINGLE = {"machine_type": "tpu7x-standard-4t"}
MULTI = {"machine_type": "tpu7x-standard-4t", "topology": "2x2x2"}


def slice_doc(tpu=None, **overrides):
    return tpu_spec_doc(**{"zones": ["us-central1-c"], "tpu": tpu or MULTI, **overrides})


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    harness.submit("ironwood", slice_doc())
    harness.tick()
    return harness


def changes(h: Harness) -> list[tuple[str, str]]:
    return [c for c in h.slices.calls if c[0] != "list"]


def running(h: Harness) -> None:
    h.tick()
    assert h.status("ironwood").phase == Phase.RUNNING
    h.slices.calls.clear()


def gone(h: Harness) -> None:
    """Time for the slice's delete to be done (a MIG's hosts shut down, then go), then a pass."""
    h.advance(seconds=h.slices.delete_seconds + 1)
    h.tick()


def test_a_multi_host_slice_is_one_compute_engine_request_for_its_hosts_and_never_the_tpu_api(h):
    st = h.status("ironwood")
    assert st.phase == Phase.PROVISIONING and st.instances == ("ironwood-1",)
    assert st.tpu_compute and not st.tpu and st.attempt_tpu and st.attempt_compute
    r = h.slices.request_of("ironwood-1")
    assert (r.api, r.accelerator_type, r.topology, r.hosts, r.zone, r.project, r.spot) == (
        "compute", "tpu7x-standard-4t", "2x2x2", 2, "us-central1-c", PROJECT, True)
    assert r.boot_image == "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2404-amd64-tpu-tpu7x"
    assert r.metadata["respawn-node"] == "ironwood-1" and r.metadata["respawn-token"] == st.attempt_token
    assert r.labels[names.JOB_LABEL] == "ironwood"
    assert h.tpu.calls == [] and h.tpu.names() == [], "the Cloud TPU API is never asked about a TPU7x job"
    assert h.live() == [], "no VM of the VM path"
    running(h)


def test_a_single_host_slice_is_one_instance_request(h):
    h.submit("one", slice_doc(SINGLE))
    h.tick("one")
    r = h.slices.request_of("one-1")
    assert (r.topology, r.hosts, r.accelerator_type) == (None, 1, "tpu7x-standard-4t")


@pytest.mark.parametrize("why, event, counted", [
    (StopReason.PREEMPTED, "preempted", "preemptions"),
    (StopReason.HOST_ERROR, "host error", "restarts"),
    (StopReason.MAINTENANCE, "maintenance", "restarts"),
])
def test_a_slice_one_of_whose_hosts_is_lost_is_replaced_whole_from_the_newest_checkpoint(h, why, event, counted):
    running(h)
    h.checkpoint(300)
    h.slices.lose("ironwood-1", why)
    h.tick()
    st = h.status("ironwood")
    # Deleted whole; its quota is held until it is gone, and the next slice waits for that.
    assert st.phase == Phase.RECOVERING and st.attempt == 1 and "waiting for ironwood-1 to be gone" in st.message
    assert changes(h) == [("delete", "ironwood-1")]
    gone(h)
    st = h.status("ironwood")
    assert st.attempt == 2 and getattr(st, counted) == 1 and st.failures == 0
    assert event in [e.event for e in st.history]
    assert st.resume_from is not None and st.resume_from.step == 300
    assert changes(h) == [("delete", "ironwood-1"), ("create", "ironwood-2")]
    assert h.slices.names() == ["ironwood-2"]
    assert h.slices.request_of("ironwood-2").metadata["respawn-resume-step"] == "300"


def test_a_slices_hard_preemption_is_timed_from_computes_record_not_from_the_pass_that_saw_it(h):
    """A host of a Compute Engine slice preempted without notice: Compute's record says when (its zone
    operation), as for a VM; the loss and the attempt's end count from there, not from the pass."""
    running(h)
    h.advance(minutes=10)
    lost, seen, st = lost_unseen(h, lambda: h.slices.lose("ironwood-1", StopReason.PREEMPTED), "ironwood")
    (event,) = [e for e in st.history if e.event == "preempted"]
    assert (event.at, event.since, event.recorded) == (seen, None, lost)
    (loss,) = st.ledger.losses
    assert (loss.lost_at, loss.seen_at) == (lost, seen)
    assert st.ledger.spans[0].end == lost


def test_a_slice_whose_job_folder_is_deleted_whole_is_found_and_deleted_as_an_orphan(h):
    running(h)
    for key in (names.spec_key("ironwood"), names.status_key("ironwood")):
        h.store.delete(BUCKET, key)
    h.tick()
    assert ("delete", "ironwood-1") in changes(h), "the slice bills forever: never listed again"
    h.advance(seconds=h.slices.delete_seconds + 1)
    assert h.slices.names() == []


def test_a_deleted_spec_deletes_the_slice(h):
    running(h)
    h.store.delete(BUCKET, names.spec_key("ironwood"))
    h.tick()
    assert changes(h) == [("delete", "ironwood-1")]


def test_worker_0s_exit_0_succeeds_the_job_and_deletes_the_slice(h):
    running(h)
    h.exit("ironwood", 0)
    h.tick()
    assert h.status("ironwood").phase == Phase.SUCCEEDED
    assert ("delete", "ironwood-1") in changes(h)


def test_a_spot_stockout_steps_down_to_standard_in_compute_engine():
    h = Harness()
    h.submit("v6", slice_doc({"machine_type": "ct6e-standard-4t", "topology": "4x4"}, zones=["us-central1-b"],
                             provisioning=["spot", "standard"], policy={"fallback": {"wait": "0s"}}))
    h.slices.stockout("us-central1-b")
    for _ in range(4):
        h.tick()
        h.advance(seconds=61)
    assert h.status("v6").provisioning == "standard" and h.slices.names() == []
    h.slices.stockout("us-central1-b", False)
    h.advance(seconds=600)  # past the zone's cooldown
    h.tick()
    st = h.status("v6")
    assert st.provisioning == "standard" and st.phase in (Phase.PROVISIONING, Phase.RUNNING)
    r = h.slices.request_of(st.instances[0])
    assert (r.spot, r.hosts, r.topology) == (False, 4, "4x4")


def test_a_flex_start_slice_waits_for_capacity_instead_of_failing():
    h = Harness()
    h.submit("flex", slice_doc(provisioning="flex-start", policy={"max_run_duration": "1d"}))
    h.slices.stockout("us-central1-c")
    h.tick()
    h.tick()
    st = h.status("flex")
    assert st.phase == Phase.PROVISIONING and st.failures == 0 and st.attempt == 1
    r = h.slices.request_of("flex-1")
    assert r.flex_start and r.max_run_seconds == 86400
    h.slices.stockout("us-central1-c", False)
    h.tick()
    h.tick()
    assert h.status("flex").phase == Phase.RUNNING


def test_a_compute_engine_slice_never_blinds_on_a_project_without_the_tpu_api():
    """A TPU7x user need not enable the Cloud TPU API: its listing is never asked for one."""
    h = Harness()
    h.tpu.failing_projects.add(PROJECT)
    h.submit("ironwood", slice_doc())
    h.tick()
    h.tick()
    assert h.status("ironwood").phase == Phase.RUNNING


@pytest.mark.parametrize("state", [NodeState.REPAIRING, NodeState.STOPPING, "STATE_FROM_THE_FUTURE"])
def test_a_slice_whose_delete_keeps_failing_is_never_created_beside_while_it_may_yet_run(h, state):
    """Chaos (issue 38): a failed attempt's slice whose delete never got through, one of its hosts
    REPAIRING (or STOPPING, or a status Google adds later): not down, so it may yet run. Past the
    ten minutes the next slice is created anyway beside a husk that is down or DELETING, never
    beside this one: two live attempts of the job."""
    running(h)
    h.exit("ironwood", 1)
    h.slices.faults.fail_next("delete", errors.TransientError("503 backend error"), times=1000)
    h.tick()
    assert h.status("ironwood").phase == Phase.RECOVERING
    h.slices.set_state("ironwood-1", state)
    for _ in range(4):
        h.advance(seconds=5 * 60)
        h.tick()
    assert h.slices.names() == ["ironwood-1"], "a second slice beside one that may yet run"
    assert h.status("ironwood").attempt == 1
    h.slices.faults._queued.clear()  # the delete goes through: DELETING, then gone
    h.tick()
    gone(h)
    assert h.status("ironwood").attempt == 2 and h.slices.names() == ["ironwood-2"]


def test_a_down_slice_whose_delete_keeps_failing_no_longer_holds_the_next_one(h):
    """The other side of it: a husk that is down (a host TERMINATED) is no longer waited for after
    ten minutes, however its delete fails (a quota error then names it)."""
    running(h)
    h.slices.faults.fail_next("delete", errors.TransientError("503 backend error"), times=1000)
    h.slices.lose("ironwood-1", StopReason.HOST_ERROR)
    for _ in range(4):
        h.tick()
        h.advance(seconds=5 * 60)
    h.tick()
    assert h.status("ironwood").attempt == 2 and "ironwood-2" in h.slices.names()


def test_a_sweep_trials_folder_deleted_whole_keeps_its_slot_while_the_slice_list_fails():
    """Chaos (issue 38): a trial's folder deleted whole while its project's slice list is refused
    (403): its slice, unseen, still holds quota, so its slot is not given back until a list that
    answered shows the slice gone; never a second trial's slice beside it past max_parallel."""
    from tests.service.test_sweeps import submit_sweep

    h = Harness()
    jobs = submit_sweep(h, trials=2, max_parallel=1, zones=["us-central1-c"], tpu=MULTI, machine_type=None)

    def holding() -> set[str]:  # trials with a slice not yet gone (DELETING included)
        return {h.slices.node(n).labels[names.JOB_LABEL] for n in h.slices.names()}

    h.tick()
    (first,) = holding()
    h.slices.failing_projects.add(PROJECT)
    for info in h.store.list(BUCKET, f"jobs/{first}/"):
        h.store.delete(BUCKET, info.name)
    for _ in range(3):
        h.tick()
        assert len(holding()) <= 1
    h.slices.failing_projects.clear()
    for _ in range(6):
        h.tick()
        assert len(holding()) <= 1, f"{sorted(holding())} hold slices at once; max_parallel 1"
        h.advance(seconds=h.slices.delete_seconds + 1)
    assert holding() == {j for j in jobs if j != first}


def test_a_slice_left_by_a_deleted_run_is_deleted_when_an_invalid_spec_takes_its_name(h):
    """Chaos seed 5343: the folder deleted while the slice was down, then a spec that does not parse under
    the same name. Its FAILED status names no TPU; the old slice must still be found and deleted."""
    running(h)
    h.slices.lose("ironwood-1", StopReason.PREEMPTED)
    for key in (names.spec_key("ironwood"), names.status_key("ironwood")):
        h.store.delete(BUCKET, key)
    h.submit("ironwood", "zones: [us-central1-c]\nmachine_typo: x\n")
    h.slices.failing_projects.add(PROJECT)  # the pass that writes its FAILED status does not see the slice
    h.tick()
    h.slices.failing_projects.clear()
    h.tick()
    assert h.status("ironwood").phase == Phase.FAILED
    assert ("delete", "ironwood-1") in changes(h), "the old run's slice bills forever"


def test_validate_refuses_a_zone_that_does_not_offer_the_machine_type_naming_the_zones_that_do(tmp_path):
    from typer.testing import CliRunner

    from controller.cli.main import app

    doc = slice_doc(zones=["us-central1-c", "us-east1-b"])
    path = tmp_path / "iron.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "zones: tpu7x-standard-4t is not offered in us-east1-b; it is offered in us-central1-c" in said, said
    path.write_text(yaml.safe_dump(slice_doc()))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "runs on a Compute Engine TPU slice 2x2x2: 2 hosts of tpu7x-standard-4t" in " ".join(result.output.split())


def test_a_slice_whose_create_was_pending_is_asked_again_so_that_a_stockout_since_is_read():
    """A MIG in BULK mode without room never ends its create: it keeps trying, its hosts CREATING, and
    only a create (the same request id) reads its last attempt's stockout and deletes it. A slice found
    CREATING is asked again, never left as an insert under way for ever (review 38)."""
    h = Harness()
    h.submit("stuck", slice_doc(provisioning=["spot", "standard"], policy={"fallback": {"wait": "0s"}}))
    h.slices.hold = True
    h.tick()
    assert h.status("stuck").phase == Phase.PROVISIONING and h.slices.names() == ["stuck-1"]
    h.slices.hold = False
    h.slices.stockout("us-central1-c")
    for _ in range(3):
        h.tick()
        h.advance(seconds=61)
    st = h.status("stuck")
    assert "stuck-1" not in h.slices.names(), "the slice that could not get room is no longer trying"
    assert st.provisioning == "standard" or st.attempt > 1 or st.not_before is not None, st.message


def test_a_slice_listing_that_fails_never_blinds_a_cloud_tpu_job_in_the_project_nor_the_other_way_round():
    h = Harness()
    h.submit("ironwood", slice_doc())
    h.submit("pod", tpu_spec_doc(zones=["us-central2-b"],
                                 tpu={"type": "v4-16", "runtime_version": "tpu-ubuntu2204-base"}))
    h.tick()
    h.tick()
    assert h.status("ironwood").phase == h.status("pod").phase == Phase.RUNNING
    h.slices.failing_projects.add(PROJECT)  # e.g. a role without compute.instanceGroupManagers.list
    h.tpu.preempt("pod-1")
    h.tick()
    h.advance(seconds=h.tpu.delete_seconds + 1)
    h.tick()
    assert h.status("pod").attempt == 2 and h.status("pod").preemptions == 1, h.status("pod").message
    assert h.status("ironwood").attempt == 1
    h.slices.failing_projects.clear()
    h.tpu.failing_projects.add(PROJECT)
    h.slices.lose("ironwood-1", StopReason.PREEMPTED)
    h.tick()
    h.advance(seconds=h.slices.delete_seconds + 1)
    h.tick()
    assert h.status("ironwood").attempt == 2 and h.status("ironwood").preemptions == 1, h.status("ironwood").message
