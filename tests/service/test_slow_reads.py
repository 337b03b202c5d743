"""Issue 35, items 12 to 14: no read holds a job that does not need it, and no hint is retried for ever.

A TPU listing that hangs holds the TPU jobs alone (within its bound), never a VM job's recovery,
whatever the pass's workers; the tick reads no Cloud Logging at all (an audit entry only wakes a
pass: tests/service/test_audit.py); a burst of TPU workers' entries is one pass over every job;
on_audit asks Pub/Sub to redeliver only what a retry may see through.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from controller.core import errors
from controller.core.audit import system_event_entry
from controller.core.ports import StopReason
from controller.core.state import Phase
from controller.service import bootstrap, functions
from controller.service.config import Settings
from controller.service.engine import Engine
from controller.service.executor import Executor
from controller.service.observe import Observer
from tests.harness import BUCKET, PROJECT, Harness, spec_doc
from tests.service.test_tpu import tpu_doc


class HangingTpu:
    """The TPU API answering a list only after ``release`` (or never), as a hung call does."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.release = threading.Event()
        self.lists = 0

    def list_nodes(self, *args: Any, **kwargs: Any) -> Any:
        self.lists += 1
        self.release.wait(timeout=30)
        return self.inner.list_nodes(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def deployed_engine(h: Harness, tpu: Any, workers: int, timeout: float) -> Engine:
    """An engine as deployed (not replayable: the TPU listing on a thread of its own, bounded)."""
    observer = Observer(h.store, h.compute, BUCKET, h.policy, workers=workers, tpu=tpu, tpu_timeout=timeout)
    return Engine(observer, Executor(h.store, h.compute, BUCKET, tpu), h.ctx, h.clock, workers=workers)


@pytest.mark.parametrize("workers", [1, 4])  # RESPAWN_CONCURRENCY=1 too: never inline and unbounded
def test_a_hung_tpu_listing_never_holds_a_vm_jobs_recovery(workers: int):
    h = Harness()
    h.submit("tpu", tpu_doc())
    h.submit("vm", spec_doc())
    h.tick()
    h.tick()
    assert h.live("vm") == ["vm-1"]
    h.compute.preempt("vm-1")
    tpu = HangingTpu(h.tpu)
    engine = deployed_engine(h, tpu, workers, timeout=5.0)
    done = threading.Event()
    threading.Thread(target=lambda: (engine.reconcile(), done.set()), daemon=True).start()
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline and h.live("vm") != ["vm-2"]:
        time.sleep(0.02)
    assert h.live("vm") == ["vm-2"], "the VM job waited for the TPU listing"
    assert not done.is_set() and tpu.lists >= 1  # the pass itself still waits for the TPU jobs, within its bound
    tpu.release.set()
    assert done.wait(10)


def test_a_tpu_listing_past_its_bound_blinds_the_tpu_jobs_alone_for_that_pass():
    h = Harness()
    h.submit("tpu", tpu_doc())
    h.submit("vm", spec_doc())
    h.tick()
    h.tick()
    tpu = HangingTpu(h.tpu)
    started = time.monotonic()
    summary = deployed_engine(h, tpu, workers=1, timeout=0.5).reconcile()
    assert time.monotonic() - started < 5  # bounded, with one worker too
    assert any("TPU API did not answer" in why for why in summary.errors.values())
    assert h.status("vm").phase == Phase.RUNNING
    tpu.release.set()


def message(entry: Any) -> dict[str, Any]:
    return {"message": {"data": base64.b64encode(json.dumps(entry).encode()).decode(), "messageId": "1"}}


@pytest.fixture
def wired(h: Harness) -> Harness:
    bootstrap.override(h.engine(), Settings(bucket=BUCKET, project=PROJECT))
    return h


def test_a_burst_of_tpu_workers_entries_is_one_pass_over_every_job(wired: Harness):
    wired.submit("a")
    wired.tick()
    lists = [c for c in wired.compute.calls if c[0] == "list"]
    for n in range(20):  # worker 0 of twenty slices, or one slice's entries delivered again and again
        entry = system_event_entry(PROJECT, "us-central2-b", f"t1v-n-{n:08x}-w-0", "77",
                                   "compute.instances.preempted", wired.clock.now())
        functions.on_audit(message(entry))
    assert len([c for c in wired.compute.calls if c[0] == "list"]) - len(lists) == 1


def test_on_audit_does_not_ask_for_a_redelivery_of_a_permanent_error(wired: Harness):
    """A 403 on the job's objects fails every redelivery the same way: Pub/Sub would retry for days."""
    wired.submit("a")
    wired.tick()
    wired.tick()
    wired.compute.preempt("a-1")
    wired.store.faults.fail_next("list", errors.RequestError("403 the controller may not list the bucket"), times=5)
    functions.on_audit(message(wired.audit.entries[-1]))  # no raise: a permanent error is left to the tick


def test_on_audit_does_not_ask_for_a_redelivery_of_an_old_entry(wired: Harness):
    wired.submit("a")
    wired.tick()
    wired.tick()
    vm = wired.compute.all()[0]
    wired.compute.terminate("a-1", StopReason.PREEMPTED)
    entry = system_event_entry(PROJECT, vm.zone, vm.name, vm.id, "compute.instances.preempted",
                               wired.clock.now() - timedelta(hours=2))
    wired.store.faults.fail_next("list", errors.TransientError("503"), times=5)
    functions.on_audit(message(entry))  # transient, but the ticks have judged its VM since: no raise
    wired.store.faults.fail_next("list", errors.TransientError("503"), times=5)
    fresh = system_event_entry(PROJECT, vm.zone, vm.name, vm.id, "compute.instances.preempted", wired.clock.now())
    with pytest.raises(errors.TransientError):
        functions.on_audit(message(fresh))
