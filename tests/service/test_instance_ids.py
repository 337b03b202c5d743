"""Issue 11: every instance's Compute id is recorded in the job's status, whatever states it
went through between two passes, so that its logs are found by id once it is gone; and
never at the cost of a status write of its own."""

from __future__ import annotations

from typing import Any

from controller.core import errors, names
from controller.core.ports import InstanceStatus
from controller.core.state import Phase
from tests.harness import PROJECT, Harness, spec_doc
from tests.service.test_tpu import tpu_doc


def status_writes(h: Harness, job: str) -> int:
    return sum(1 for op, key in h.store.calls if op == "write" and key == names.status_key(job))


def ids_of(h: Harness) -> dict[str, str]:
    return {i.name: i.id for i in h.compute.all()}


def test_a_vm_that_went_from_provisioning_to_exit_0_between_passes_has_its_id_recorded():
    h = Harness()
    h.compute.boot_status = InstanceStatus.PROVISIONING  # never seen RUNNING by any pass
    h.submit("j")
    h.tick()
    st = h.status("j")
    vm = ids_of(h)["j-1"]
    assert st.phase == Phase.PROVISIONING and st.inserted and vm and st.instance_ids == {"j-1": vm}
    # The id rode on the writes the pass made anyway: the new run, the launch, "inserted".
    assert status_writes(h, "j") == 3
    h.exit("j", 0)
    h.compute.terminate("j-1")  # the guest powered off after its command
    h.tick()
    st = h.status("j")
    assert st.phase == Phase.SUCCEEDED and "running" not in [e.event for e in st.history]
    assert st.instance_ids == {"j-1": vm} and h.compute.all() == []  # and the VM is deleted


def test_a_gang_whose_bulk_insert_names_no_id_has_them_recorded_by_the_next_write():
    h = Harness()
    h.compute.boot_status = InstanceStatus.PROVISIONING
    h.submit("g", spec_doc(nodes=2))
    h.tick()
    assert h.status("g").instance_ids == {}  # a bulkInsert's operation names no instance
    seen = ids_of(h)
    writes = status_writes(h, "g")
    h.tick()  # still booting: no news, no write
    assert status_writes(h, "g") == writes
    h.exit("g", 0)
    h.tick()
    st = h.status("g")
    assert st.phase == Phase.SUCCEEDED and st.instance_ids == seen and set(seen) == {"g-1-n0", "g-1-n1"}


def test_an_attempt_preempted_before_any_pass_saw_it_keeps_its_id_beside_the_next_ones():
    h = Harness()
    h.compute.boot_status = InstanceStatus.PROVISIONING
    h.submit("p")
    h.tick()
    first = ids_of(h)["p-1"]
    h.compute.preempt("p-1")
    h.tick()
    st = h.status("p")
    assert st.attempt == 2 and st.preemptions == 1
    assert st.instance_ids == {"p-1": first, "p-2": ids_of(h)["p-2"]}


def test_a_crash_after_the_insert_before_its_status_write_still_records_the_id():
    h = Harness()
    h.compute.boot_status = InstanceStatus.PROVISIONING

    class CrashAfterInsert:
        def __getattr__(self, name: str) -> Any:
            return getattr(h.compute, name)

        def insert(self, requests: Any, request_id: str, wait: float | None = None) -> Any:
            told = h.compute.insert(requests, request_id, wait)
            h.store.faults.fail_next("write", errors.TransientError("the pass died before its status write"))
            return told

    h.submit("c")
    h.engine(compute=CrashAfterInsert()).reconcile()
    st = h.status("c")
    assert not st.inserted and st.instance_ids == {}
    h.tick()  # listed PROVISIONING: under way, its outcome not asked for again
    assert not h.status("c").inserted
    h.compute.set_status("c-1", InstanceStatus.RUNNING)
    h.tick()  # RUNNING: the insert is done; the listing names the VM's id
    st = h.status("c")
    assert st.inserted and st.instance_ids == ids_of(h) and len(h.compute.all()) == 1
    assert [c for c in h.compute.calls if c[0] == "insert"] == [("insert", "c-1")]


def test_concurrent_passes_record_the_one_id_once():
    h = Harness(workers=4)
    h.compute.boot_status = InstanceStatus.PROVISIONING
    h.submit("r")
    h.race("r")
    h.race("r")
    st = h.status("r")
    assert [i.name for i in h.compute.all()] == ["r-1"] and st.instance_ids == ids_of(h)


def test_ids_of_an_earlier_run_are_not_taken_into_a_new_run():
    h = Harness()
    h.submit("n")
    h.tick()
    old = ids_of(h)
    h.exit("n", 0)
    h.tick()
    assert h.status("n").phase == Phase.SUCCEEDED and h.compute.all() == []
    assert h.status("n").instance_ids == {"n-1": old["n-1"]}
    # A husk of that run (its delete failed), down, is still listed when the next run starts.
    h.compute.add_foreign(PROJECT, "us-central1-a", "n-1",
                          {names.MANAGED_LABEL: "true", names.JOB_LABEL: "n", names.ATTEMPT_LABEL: "1"})
    h.compute.set_status("n-1", InstanceStatus.TERMINATED)
    h.submit("n", spec_doc(command="python train.py --again"))  # a new spec: a new run, from attempt 2
    h.tick()
    st = h.status("n")
    assert st.attempt == 2 and set(st.instance_ids) == {"n-2"}  # a new run starts its own record


def test_a_tpu_node_preempted_before_any_pass_saw_it_ready_has_its_id_recorded():
    h = Harness()
    h.submit("tpu", tpu_doc())
    h.tick()
    first = h.tpu.node("tpu-1").id
    assert first
    h.tpu.preempt("tpu-1")
    h.tick()
    st = h.status("tpu")
    assert st.attempt == 1 and st.instance_ids.get("tpu-1") == first  # recorded as the loss is
    h.advance(seconds=h.tpu.delete_seconds + 1)  # the node gone, the next attempt comes
    h.tick()
    st = h.status("tpu")
    assert st.attempt == 2 and st.instance_ids.get("tpu-1") == first
