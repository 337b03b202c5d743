"""The lease (controller.service.lease) on the local GCS through the real client: fake-gcs-server
behind localcloud's proxy, which judges ifGenerationMatch on uploads and deletes as Google does, and
stamps ``updated`` with its own clock. The engines' clocks are the system's, as deployed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from controller.adapters.gcs import GcsStore
from controller.adapters.memory import MemoryCompute
from controller.core import names
from controller.core.clock import SystemClock
from controller.service import lease
from controller.service.engine import Engine
from controller.service.executor import Executor
from controller.service.lease import Leases, Terms
from controller.service.observe import Observer
from localcloud.gcs import LocalGcs, client
from tests.harness import BUCKET, CKPT_BUCKET, Harness, spec_doc
from tests.service.test_lease import HeldInListing, in_threads, wait_for


@pytest.fixture
def gcs() -> Iterator[LocalGcs]:
    with LocalGcs(buckets=(BUCKET, CKPT_BUCKET)) as g:
        yield g


def engine(store: Any, compute: MemoryCompute, holder: str, terms: Terms | None = None) -> Engine:
    h, clock = Harness(), SystemClock()
    observer = Observer(store, compute, BUCKET, h.policy, workers=4)
    return Engine(observer, Executor(store, compute, BUCKET), h.ctx, clock, workers=4,
                  lease=Leases(store, BUCKET, clock, terms, holder=holder))


def submit(store: GcsStore, *jobs: str) -> None:
    for job in jobs:
        store.write(BUCKET, names.spec_key(job), yaml.safe_dump(spec_doc()).encode())


def test_ticks_started_together_on_the_local_gcs_make_one_pass(gcs):
    gcs_store = GcsStore(client(gcs.url))
    submit(gcs_store, "a", "b", "c")
    store, compute = HeldInListing(gcs_store), MemoryCompute(SystemClock())
    engines = [engine(store, compute, f"instance-{i}") for i in range(4)]
    threads, results = in_threads([e.reconcile for e in engines])
    wait_for("three ticks to find the lease held", lambda: len(results) == 3)
    store.go.set()
    for t in threads:
        t.join(timeout=60)
    assert sorted(bool(s.skipped) for s in results.values()) == [False, True, True, True]
    assert store.listings == 1
    assert sorted(i.name for i in compute.live()) == ["a-1", "b-1", "c-1"]
    assert gcs_store.client.bucket(BUCKET).get_blob(lease.KEY) is None  # released


def test_a_pass_longer_than_its_ttl_keeps_its_lease_by_renewing_it(gcs):
    """The renewing thread, for real: a pass held in its observation for twice its ttl keeps the
    lease (a tick meanwhile is turned away), then acts and releases it."""
    gcs_store = GcsStore(client(gcs.url))
    submit(gcs_store, "a")
    store, compute = HeldInListing(gcs_store), MemoryCompute(SystemClock())
    terms = Terms(ttl=2.0, renew=0.5, margin=0.5, max_hold=60)
    threads, results = in_threads([engine(store, compute, "slow", terms).reconcile])
    assert store.entered.wait(30)
    first = gcs_store.stat(BUCKET, lease.KEY).generation
    time.sleep(2 * terms.ttl)
    assert gcs_store.stat(BUCKET, lease.KEY).generation != first  # renewed meanwhile
    late = engine(gcs_store, compute, "late", terms).reconcile()
    assert late.skipped and late.skipped.endswith("(slow)")
    store.go.set()
    threads[0].join(timeout=60)
    summary = results[0]
    assert not summary.skipped and not summary.stopped and summary.jobs["a"]
    assert [i.name for i in compute.live()] == ["a-1"]
    assert gcs_store.client.bucket(BUCKET).get_blob(lease.KEY) is None  # released
