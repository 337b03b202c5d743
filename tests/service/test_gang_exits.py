"""Every rank's exit is seen (issue 22, item 14).

Each worker of a gang (and each host of a TPU slice) writes its own exit record,
``jobs/<job>/nodes/<rank>/exit``; rank 0's stays ``jobs/<job>/exit``. Rank 0's exit 0 is the
job's success unless a rank's failure landed first; a failure landing after it is a rank
falling off the collective rank 0 left. Records keep their safety: an attempt's token, stale
ones only cleaned, consumed after the decision, and a flood of rank names costs no read.
"""

from __future__ import annotations

import json
from typing import Any

from controller.core import names
from controller.core.ports import StopReason
from controller.core.state import Phase
from controller.service import bootstrap, functions, observe
from controller.service.config import Settings
from controller.service.engine import Summary
from tests.harness import BUCKET, Harness, spec_doc, tpu_spec_doc


def started(h: Harness, job: str = "dist", nodes: int = 3, **spec: Any) -> None:
    h.submit(job, spec_doc(nodes=nodes, **spec))
    h.tick()
    h.tick()
    assert h.status(job).phase == Phase.RUNNING


def reads(h: Harness, needle: str) -> list[str]:
    return [c[1] for c in h.store.calls if c[0] == "read" and needle in c[1]]


def test_a_workers_failure_before_rank_0s_exit_0_fails_the_gang(h):
    started(h)
    h.worker_exit("dist", 1, 3)  # node 1's command fails...
    h.compute.terminate("dist-1-n1", StopReason.CRASHED)  # ...and it powers off
    h.advance(seconds=40)
    h.exit("dist", 0)  # rank 0 then finishes anyway
    h.tick()
    st = h.status("dist")
    assert st.phase != Phase.SUCCEEDED and st.failures == 1
    assert "code 3 on dist-1-n1" in st.message


def test_rank_0s_exit_0_after_a_pass_acted_on_a_workers_failure_does_not_make_the_gang_a_success(h):
    """The failure was acted on (RECOVERING) and its record consumed before rank 0's exit 0 landed:
    the status's own failure event says the gang failed first (found by chaos seed 16)."""
    started(h)
    h.advance(seconds=60)
    h.worker_exit("dist", 2, 255)
    h.tick()
    st = h.status("dist")
    assert st.phase == Phase.RECOVERING and st.failures == 1
    if h.store.exists(BUCKET, names.node_exit_key("dist", 2)):  # consumed, as the failure's chain may
        h.store.delete(BUCKET, names.node_exit_key("dist", 2))
    h.advance(seconds=20)
    h.exit("dist", 0)  # rank 0, its VM still being deleted, exits 0 anyway
    h.tick()
    assert h.status("dist").phase != Phase.SUCCEEDED


def test_rank_0s_exit_0_before_a_workers_failure_is_the_gangs_success(h):
    started(h)
    h.exit("dist", 0)
    h.advance(seconds=10)
    h.worker_exit("dist", 2, 1)  # its collective broke when rank 0 left
    h.tick()
    st = h.status("dist")
    assert (st.phase, st.failures) == (Phase.SUCCEEDED, 0)
    assert h.live() == []
    h.tick()  # every record of the run is deleted with the finished job's leftovers
    assert not h.store.exists(BUCKET, names.exit_key("dist"))
    assert not h.store.exists(BUCKET, names.node_exit_key("dist", 2))


def test_a_failure_landing_with_rank_0s_exit_0_is_not_overruled(h):
    started(h)
    h.exit("dist", 0)
    h.worker_exit("dist", 1, 2)  # same instant (GCS's clock): not after rank 0's exit
    h.tick()
    assert h.status("dist").phase != Phase.SUCCEEDED and h.status("dist").failures == 1


def test_a_workers_failure_alone_fails_the_attempt_and_is_consumed_after_the_next_insert(h):
    started(h, policy={"backoff": {"initial": "30s", "max": "5m"}})
    h.worker_exit("dist", 2, 137)
    h.tick()
    st = h.status("dist")
    assert (st.phase, st.failures, st.attempt) == (Phase.RECOVERING, 1, 1)
    assert h.store.exists(BUCKET, names.node_exit_key("dist", 2)), "consumed before the next attempt was inserted"
    h.advance(minutes=1)
    h.tick()
    assert h.status("dist").attempt == 2 and h.live() == ["dist-2-n0", "dist-2-n1", "dist-2-n2"]
    assert not h.store.exists(BUCKET, names.node_exit_key("dist", 2))


def test_rank_0s_exit_0_landing_while_a_failed_gang_is_replaced_is_no_success(h):
    """The worker's failure was decided (the gang is being deleted); rank 0's trainer finishes
    before its delete reaches it. The failure came first: the next attempt still starts."""
    started(h, policy={"backoff": {"initial": "30s", "max": "5m"}})
    h.worker_exit("dist", 1, 2)
    h.tick()
    assert h.status("dist").phase == Phase.RECOVERING
    h.advance(seconds=5)
    h.exit("dist", 0)
    h.tick()
    h.advance(minutes=1)
    h.tick()
    st = h.status("dist")
    assert (st.phase, st.attempt, st.failures) == (Phase.PROVISIONING, 2, 1)


def test_a_workers_record_of_an_older_attempt_or_without_the_token_is_only_cleaned_up(h):
    started(h)
    h.worker_exit("dist", 1, 3, attempt=0)  # a late record of an older attempt
    h.worker_exit("dist", 2, 3, token="forged")  # written by anything but this attempt's VMs
    h.tick()
    st = h.status("dist")
    assert (st.phase, st.failures, st.attempt) == (Phase.RUNNING, 0, 1)
    assert not h.store.exists(BUCKET, names.node_exit_key("dist", 1))
    assert not h.store.exists(BUCKET, names.node_exit_key("dist", 2))
    h.exit("dist", 0)
    h.tick()
    assert h.status("dist").phase == Phase.SUCCEEDED


def test_a_worker_failure_landing_after_the_listing_is_seen_beside_rank_0s_late_exit_0(h):
    """A restart of a gang that looked alive reads the records again first (an exit 0 must never
    be lost); the workers' records are listed again after rank 0's, so a failure that landed
    before that exit 0 is never hidden by it."""
    started(h, policy={"max_instance_age": "1h"})
    h.advance(minutes=61)
    engine = h.engine()
    view = engine.observer.world().jobs["dist"]  # listed before either record
    h.worker_exit("dist", 1, 3)
    h.advance(seconds=30)
    h.exit("dist", 0)
    engine._reconcile_job(view, Summary(), dry_run=False)
    st = h.status("dist")
    assert st.phase != Phase.SUCCEEDED and st.failures == 1 and st.recycles == 0


def test_the_old_single_exit_record_of_a_previous_release_is_still_read(h):
    started(h)  # a VM of the previous release: a worker's failure in jobs/<job>/exit
    h.exit("dist", 5, node=1)
    h.tick()
    assert h.status("dist").failures == 1 and "code 5" in h.status("dist").message


def test_a_flood_of_rank_names_costs_no_read_and_a_bounded_cleanup_per_pass(h):
    started(h, nodes=2)
    junk = json.dumps({"attempt": 1, "exit_code": 1, "token": "forged"})
    for rank in range(2, 2 + observe.MAX_UNREAD_NODE_EXITS + 50):
        h.store.put(BUCKET, names.node_exit_key("dist", rank), junk)
    h.store.calls.clear()
    h.tick()
    assert reads(h, "/nodes/") == [], "a rank the attempt does not have is never read"
    deleted = [c[1] for c in h.store.calls if c[0] == "delete" and "/nodes/" in c[1]]
    assert len(deleted) == observe.MAX_UNREAD_NODE_EXITS
    h.tick()
    assert not h.store.list(BUCKET, names.node_exits_prefix("dist"))
    assert (h.status("dist").phase, h.status("dist").failures) == (Phase.RUNNING, 0)


def test_a_tpu_hosts_failure_before_worker_0s_exit_0_fails_the_job(h):
    doc = tpu_spec_doc(zones=["us-central2-b"], tpu={"type": "v4-16", "runtime_version": "tpu-ubuntu2204-base"})
    h.submit("tpu", doc)
    h.tick()
    h.tick()
    assert h.status("tpu").phase == Phase.RUNNING
    h.worker_exit("tpu", 1, 4, instance="tpu-1")  # host 1 of the slice
    h.advance(seconds=20)
    h.exit("tpu", 0)
    h.tick()
    st = h.status("tpu")
    assert st.phase != Phase.SUCCEEDED and st.failures == 1 and "tpu-1 worker 1" in st.message


def test_a_workers_exit_record_is_an_event_that_reconciles_its_job_within_seconds(h):
    started(h)
    h.worker_exit("dist", 1, 6)
    bootstrap.override(h.engine(), Settings(bucket=BUCKET, project="respawn-proj"))
    functions.on_object({"bucket": BUCKET, "name": names.node_exit_key("dist", 1), "generation": "1"})
    assert h.status("dist").failures == 1 and "code 6 on dist-1-n1" in h.status("dist").message


import pytest  # noqa: E402


@pytest.mark.parametrize("action", ["stop", "delete"])  # the preempted node TERMINATED, or gone
@pytest.mark.parametrize("aborts", ["rank 0", "worker", "both"])
def test_ranks_aborting_when_a_peer_is_preempted_never_spend_the_failure_budget(h, action, aborts):
    """Issue 35, item 18: a gang whose node was preempted hard (no marker) was charged a failure when
    the surviving ranks aborted on their broken collective (exit 134). A preemption, whatever it
    makes the other ranks do, is a restart, never a failure."""
    started(h, nodes=3, policy={"termination_action": action, "max_failures": 0})
    h.compute.preempt("dist-1-n1")  # hard: no shutdown script, no marker
    if aborts in ("rank 0", "both"):
        h.exit("dist", 134)
    if aborts in ("worker", "both"):
        h.worker_exit("dist", 2, 134)
    h.tick()
    h.tick()
    st = h.status("dist")
    assert st.failures == 0 and st.preemptions == 1 and st.phase != Phase.FAILED, st.message
    assert st.attempt == 2
