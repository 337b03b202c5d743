"""A spec moved between VMs and a TPU while an attempt was committed and not yet created
(``planner._insert``, ``JobStatus.attempt_tpu``): the attempt goes on as the new kind, marks the
job as a TPU one, records that kind however its create ends, and starts its capacity record
afresh; nothing of either kind is ever left running beside the other.

Not covered, by design: a create accepted by Google but not yet listed. The planner assumes,
everywhere, that an acknowledged create is listed at once (PROVISIONING, CREATING)."""

from __future__ import annotations

import json

from controller.core import errors, names
from controller.core.state import Phase
from tests.harness import BUCKET, PROJECT, Harness, spec_doc
from tests.service.test_tpu import tpu_doc

ZONE = "us-central1-a"


def vm_doc(**overrides):
    return spec_doc(zones=[ZONE], **overrides)


def a_tpu_doc(**overrides):
    return tpu_doc(zones=[ZONE], **overrides)


def switched_vm_attempt_to_tpu(h: Harness) -> None:
    """Attempt 1 committed as VMs (its zone stocked out), then the spec replaced by a TPU one:
    once the zone has cooled, the attempt is created as a TPU node."""
    h.submit("j", vm_doc(policy={"zone_cooldown": "1m"}))
    h.compute.stockouts.add(ZONE)
    h.tick()
    h.submit("j", a_tpu_doc())
    h.advance(minutes=11)
    h.tick()
    assert h.tpu.names() == ["j-1"] and h.status("j").attempt_tpu


def test_a_vm_attempt_switched_to_a_tpu_node_marks_the_job_as_tpu():
    """status.tpu is what observe lists TPU zones by once the spec no longer says tpu."""
    h = Harness()
    switched_vm_attempt_to_tpu(h)
    assert h.status("j").tpu, "a job with a TPU node must have status.tpu (what observe lists by)"


def test_the_switched_tpu_node_is_deleted_when_the_spec_is_deleted():
    h = Harness()
    switched_vm_attempt_to_tpu(h)
    h.tick()
    assert h.status("j").phase == Phase.RUNNING
    h.store.delete(BUCKET, names.spec_key("j"))  # the job is cancelled by deleting its spec
    for _ in range(3):
        h.tick()
    assert h.status("j").phase == Phase.CANCELLED
    h.advance(seconds=h.tpu.delete_seconds + 1)  # the delete, accepted, is done
    assert h.tpu.names() == [], "the TPU slice is leaked: never listed again, never deleted"


def test_the_switched_tpu_node_is_not_left_running_beside_a_vm_when_the_spec_goes_back_to_vms():
    h = Harness()
    switched_vm_attempt_to_tpu(h)
    h.tick()
    h.compute.stockouts.clear()
    h.submit("j", vm_doc())  # submit --replace: back to VMs mid-run
    for _ in range(3):
        h.tick()
        h.advance(minutes=1)
        assert not (h.live("j") and h.tpu.names()), \
            f"a VM {h.live('j')} and a TPU node {h.tpu.names()} of one job at once"


def test_a_switch_whose_create_is_pending_records_the_new_kind():
    """The switch is written before the create, so the create's outcome (here: still under way)
    is recorded on a status that names the new kind."""
    h = Harness()
    h.submit("j", a_tpu_doc())
    h.tpu.faults.fail_next("create", errors.TransientError("503"))
    h.tick()  # attempt 1 committed as a TPU node; its create failed: will retry, same zone
    st = h.status("j")
    assert st.attempt_tpu and not st.inserted and st.zone == ZONE
    h.submit("j", vm_doc(policy={"termination_action": "delete"}))
    h.advance(minutes=11)
    h.compute.hold_inserts = True
    h.tick()  # the attempt is now VMs: the insert is accepted and still running
    assert not h.status("j").attempt_tpu, "a VM insert is under way, but the status says a TPU node"


def test_a_preempted_vm_of_a_switched_attempt_counts_as_a_preemption():
    h = Harness()
    h.submit("j", a_tpu_doc())
    h.tpu.faults.fail_next("create", errors.TransientError("503"))
    h.tick()
    h.submit("j", vm_doc(policy={"termination_action": "delete"}))
    h.advance(minutes=11)
    h.compute.hold_inserts = True
    h.tick()
    h.compute.release_inserts()
    h.tick()
    h.tick()
    assert h.status("j").phase == Phase.RUNNING and h.live("j") == ["j-1"]
    h.compute.preempt("j-1")  # termination action DELETE: the VM is gone, Compute knows why
    h.tick()
    st = h.status("j")
    assert st.attempt == 2 and st.preemptions == 1, [e.event for e in st.history][-4:]


def _hand_written(h: Harness, job: str, **fields) -> None:
    h.store.put(BUCKET, names.status_key(job), json.dumps(fields))


def test_a_hand_repaired_status_without_attempt_started_at_is_not_stuck_forever():
    """A status edited by hand (no attempt_started_at, no attempt_tpu) still gets its TPU node."""
    h = Harness()
    h.submit("j", a_tpu_doc())
    _hand_written(h, "j", phase="PROVISIONING", attempt=1, project=PROJECT, zone=ZONE,
                  created_at="2026-01-01T00:00:00Z", started_at="2026-01-01T00:00:00Z")
    for _ in range(4):
        h.tick()
        h.advance(minutes=15)
    assert h.tpu.names() == ["j-1"], h.status("j").message


def test_vm_stockouts_do_not_step_a_switched_attempt_down_to_on_demand_tpus_untried():
    """Half an hour of VM stockouts never steps the TPU attempt down to on-demand before a Spot
    TPU was asked for: the switch starts the capacity record afresh."""
    h = Harness()
    h.submit("j", vm_doc(policy={"zone_cooldown": "5m"}))
    h.compute.stockouts.add(ZONE)
    h.tick()
    for _ in range(7):  # 35 minutes of VM stockouts, one try per cooldown
        h.advance(minutes=5, seconds=1)
        h.tick()
    st = h.status("j")
    assert not st.inserted and st.capacity_misses >= 7 and st.not_before is not None
    h.submit("j", a_tpu_doc(provisioning=["spot", "standard"]))
    h.tick()
    h.advance(minutes=6)
    h.tick()
    assert h.tpu.names() == ["j-1"], h.status("j").message
    assert h.tpu.request_of("j-1").spot, "stepped down to on-demand without ever trying a Spot TPU"
