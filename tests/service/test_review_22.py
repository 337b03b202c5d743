"""Issue 22's changes attacked: a control bucket written by someone else, old status files,
partial failures. Each test names the behaviour that must hold."""

from __future__ import annotations

import json
import time

from controller.core.state import Phase
from controller.service import tpuzones
from tests.harness import BUCKET, PROJECT, Harness
from tests.service.test_tpu import tpu_doc

FORGED = [f"zz-forged{i}-a" for i in range(tpuzones.MAX_PAIRS)]  # well formed, of a watched project


def forge_tpu_zones(h: Harness, zones: list[str] = FORGED) -> None:
    h.store.put(BUCKET, tpuzones.KEY, json.dumps({"zones": [[PROJECT, z] for z in zones]}))


def test_a_forged_tpu_zones_record_naming_hundreds_of_zones_never_blinds_a_tpu_job():
    """Each TPU zone is a request of its own: a record naming 500 zones (anyone who can write the
    bucket can write it) takes far longer to list than the TPU list's bound. The orphan search
    may run out of time; the TPU jobs' own zones are still seen, and a preempted node replaced."""
    h = Harness(workers=4)
    h.submit("tpu", tpu_doc())
    h.tick()
    h.tick()
    assert h.status("tpu").phase == Phase.RUNNING
    forge_tpu_zones(h, FORGED[:-1])  # room left for the job's own zone (see the next test)
    real = h.tpu.list_nodes

    def per_zone(projects, zones, job=None):
        time.sleep(0.005 * len(projects) * len(zones))  # as Google's, one request per zone
        return real(projects, zones, job)

    h.tpu.list_nodes = per_zone
    h.tpu.preempt("tpu-1")
    for _ in range(4):
        engine = h.engine()
        engine.observer.tpu_timeout = 1.0
        h.advance(minutes=3)
        engine.reconcile()
    st = h.status("tpu")
    assert st.attempt == 2 and "tpu-2" in h.tpu.names(), f"the TPU job was blind: {st.phase} {st.message}"


def test_a_full_tpu_zones_record_never_fails_a_tpu_job_as_refused_by_google():
    """A record already holding MAX_PAIRS zones (forged) stops the create, as a record that
    cannot be written does; it is respawn's own record, not Google refusing the zone: the job
    waits saying so, and no model is marked refused."""
    h = Harness()
    forge_tpu_zones(h)
    h.submit("tpu", tpu_doc())
    for _ in range(3):
        h.tick()
        h.advance(minutes=1)
    st = h.status("tpu")
    assert st.phase != Phase.FAILED and st.refused_models == {}, st.message
    assert h.tpu.names() == [] and "already records" in st.message


def test_a_tpu_zones_record_too_large_to_read_is_written_over_and_the_node_created():
    """No pass reads a record past 256 KiB (tpuzones.read): such a record (not the controller's)
    is written over with the zone, and the node is created."""
    h = Harness()
    h.store.put(BUCKET, tpuzones.KEY, b" " * (300 * 1024))
    h.submit("tpu", tpu_doc())
    h.tick()
    h.tick()
    assert h.tpu.names() == ["tpu-1"], h.status("tpu").message
    assert (PROJECT, "us-central2-b") in tpuzones.parse(h.store.read(BUCKET, tpuzones.KEY).data)
