"""Fan-out beyond one instance (issue 40, part 6): the tick publishes each shard its part of the
listing, a shard's pass reconciles its own jobs alone, over the in-memory fakes.

Every shard pass here goes through its message as Pub/Sub would carry it (``shards.publish`` on a
MemoryPublisher, then ``shards.handle`` with the message's bytes), each under its shard's lease.
"""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path
from typing import Any

import pytest
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent
from functions_framework import create_app

from controller.adapters.memory import MemoryPublisher
from controller.core import launch, names
from controller.core.ports import BlobInfo
from controller.core.shards import Shard, envelope, pack, read_message, unpack
from controller.core.state import Phase
from controller.service import bootstrap, functions, lastpass, observe, shards
from controller.service.config import Settings
from controller.service.engine import Engine, Summary
from controller.service.lease import Leases
from tests.harness import BUCKET, PROJECT, Harness

TOPIC = f"projects/{PROJECT}/topics/respawn-shards"
MAIN = str(Path(__file__).resolve().parents[2] / "main.py")


@pytest.fixture
def h() -> Harness:
    return Harness()


def leased(h: Harness, holder: str = "test") -> Engine:
    engine = h.engine()
    engine.lease = Leases(h.store, BUCKET, h.clock, monotonic=h.clock.monotonic, holder=holder)
    return engine


def fan_tick(h: Harness, k: int, sweep: bool = False, engine: Engine | None = None) -> list[Summary | None]:
    """A tick with K shards: the listing published, then every shard's message handled."""
    publisher = MemoryPublisher([TOPIC])
    engine = engine or leased(h)
    shards.publish(engine, publisher, TOPIC, k, h.clock.now(), sweep=sweep)
    assert len(publisher.published) == k
    return [shards.handle(engine, data, BUCKET, k) for _, data, _ in publisher.published]


def jobs_of(shard: int, k: int, n: int, prefix: str = "job") -> list[str]:
    out, i = [], 0
    while len(out) < n:
        if names.shard_of(f"{prefix}-{i}", k) == shard:
            out.append(f"{prefix}-{i}")
        i += 1
    return out


def orphan_labels(job: str, shard_label: bool = True) -> dict[str, str]:
    return {"respawn-managed": "true", "respawn-job": job, "respawn-attempt": "1",
            **({names.SHARD_LABEL: names.shard_label(job)} if shard_label else {})}


def test_a_listing_packed_into_a_message_reads_back_as_it_was_listed(h):
    for i in range(5):
        h.submit(f"job-{i}")
        h.marker(f"job-{i}", attempt=1, token="x")
    listing = leased(h).observer.list_bucket()
    message = read_message(envelope(Shard(1, 4), BUCKET, h.clock.now(), listing=pack(listing)))
    assert (message.shard, message.bucket, message.at) == (Shard(1, 4), BUCKET, h.clock.now())
    assert unpack(message.listing or b"", BUCKET) == tuple(listing)


def test_a_shard_never_acts_on_another_shard_s_job_even_when_its_message_names_it(h):
    mine, theirs = jobs_of(0, 4, 3), jobs_of(1, 4, 3)
    for job in mine + theirs:
        h.submit(job)
    # A VM of another shard's job with no spec in this message: another shard's, never this one's orphan.
    h.compute.add_foreign(PROJECT, "us-central1-a", f"{theirs[0]}-1", orphan_labels(theirs[0]))
    engine = leased(h)
    hostile = envelope(Shard(0, 4), BUCKET, h.clock.now(), listing=pack(engine.observer.list_bucket()))
    summary = shards.handle(engine, hostile, BUCKET, 4)
    assert summary is not None and sorted(summary.jobs) == sorted(mine)
    assert h.live() == sorted([*(f"{j}-1" for j in mine), f"{theirs[0]}-1"])
    assert all(not h.store.exists(BUCKET, names.status_key(j)) for j in theirs)


def test_a_shard_lists_only_the_vms_labelled_for_it(h):
    for job in jobs_of(0, 4, 2) + jobs_of(3, 4, 2):
        h.submit(job)
    fan_tick(h, 4)
    # (besides each new run's own list of its name's VMs, before its first insert, as with one shard)
    wide = [what for op, what in h.compute.calls if op == "list" and what.startswith("*")]
    assert sorted(wide) == [f"* shard {s}/4" for s in range(4)]


def test_a_fleet_reconciled_by_four_shards_ends_as_by_one_after_the_same_events():
    for seed in range(6):
        one, four = Harness(), Harness()
        _drive(one, random.Random(seed), lambda h, sweep: leased(h).reconcile())
        _drive(four, random.Random(seed), lambda h, sweep: fan_tick(h, 4, sweep=sweep))
        assert _outcome(four) == _outcome(one), f"seed {seed}"


def _drive(h: Harness, rng: random.Random, tick: Any) -> None:
    """A seeded fleet and its events, tick by tick; the last tick a shard's sweep."""
    jobs = [f"job-{i}" for i in range(24)]
    for job in jobs:
        h.submit(job)
    for i in range(4):  # orphans: labelled ones, and ones from before sharding (no shard label)
        h.compute.add_foreign(PROJECT, "us-central1-a", f"ghost-{i}-1", orphan_labels(f"ghost-{i}", i % 2 == 0))
    for round_ in range(8):
        tick(h, False)
        for job in rng.sample(jobs, 6):
            st = h.status(job) if h.store.exists(BUCKET, names.status_key(job)) else None
            event = rng.choice(["preempt", "exit0", "exit1", "cancel", "unspec", "heartbeat"])
            if st is None or st.phase.terminal or not st.instances:
                continue
            vm = st.instances[0]
            if event == "preempt" and vm in h.live():
                h.compute.preempt(vm)
                h.marker(job)
            elif event == "exit0":
                h.exit(job, 0)
            elif event == "exit1":
                h.exit(job, 1)
            elif event == "cancel":
                h.cancel(job)
            elif event == "unspec":
                h.store.delete(BUCKET, names.spec_key(job))
            else:
                h.heartbeat(job)
        h.advance(minutes=1)
    tick(h, True)
    h.advance(minutes=10)
    tick(h, False)


def _outcome(h: Harness) -> tuple[dict[str, Any], list[str]]:
    statuses = {}
    for info in h.store.list(BUCKET, names.JOBS_PREFIX):
        ref = names.parse_object_name(info.name)
        if ref and ref.kind == "status":
            st = h.status(ref.job)
            statuses[ref.job] = (st.phase, st.attempt, st.instances, st.failures, st.restarts)
    return statuses, h.live()


def test_orphans_are_deleted_once_by_the_one_shard_their_job_hashes_to(h):
    for i in range(8):
        h.compute.add_foreign(PROJECT, "us-central1-a", f"ghost-{i}-1", orphan_labels(f"ghost-{i}", i % 2 == 0))
    fan_tick(h, 4, sweep=True)
    assert h.live() == []
    deleted = [name for op, name in h.compute.calls if op == "delete"]
    assert sorted(deleted) == sorted(f"ghost-{i}-1" for i in range(8))


def test_an_orphan_made_before_sharding_waits_for_a_sweep_and_a_labelled_one_does_not(h):
    h.compute.add_foreign(PROJECT, "us-central1-a", "old-1", orphan_labels("old", shard_label=False))
    h.compute.add_foreign(PROJECT, "us-central1-a", "new-1", orphan_labels("new"))
    fan_tick(h, 4)
    assert h.live() == ["old-1"]
    fan_tick(h, 4, sweep=True)
    assert h.live() == []


@pytest.mark.parametrize("alone_max", [16, 0], ids=["each-job-in-its-zones", "one-list-of-every-vm"])
def test_a_change_of_k_never_duplicates_an_attempt_nor_deletes_a_live_vm(h, monkeypatch, alone_max):
    monkeypatch.setattr(observe, "ALONE_MAX", alone_max)
    jobs = [f"job-{i}" for i in range(16)]
    for job in jobs:
        h.submit(job)
    # Half the VMs made before sharding: launched without the shard label, as an older controller did.
    labels = launch._labels
    monkeypatch.setattr(launch, "_labels", lambda job, spec, status: {
        k: v for k, v in labels(job, spec, status).items() if k != names.SHARD_LABEL or job in jobs[8:]})
    leased(h).reconcile()  # K = 1, as before sharding
    monkeypatch.setattr(launch, "_labels", labels)
    assert sum(names.SHARD_LABEL in i.labels for i in h.compute.live()) == 8
    before = h.live()
    for k in (4, 2, 8, 1, 16):
        h.advance(minutes=1)
        if k == 1:
            leased(h).reconcile()
        else:
            fan_tick(h, k)
        assert h.live() == before, f"K={k}"
        assert all(h.status(j).attempt == 1 for j in jobs), f"K={k}"
    assert not [name for op, name in h.compute.calls if op in ("delete", "stop")]
    assert len([c for c in h.compute.calls if c[0] == "insert"]) == len(jobs)


def test_two_deliveries_of_one_shard_message_make_one_pass(h):
    jobs = jobs_of(2, 4, 3)
    for job in jobs:
        h.submit(job)
    publisher = MemoryPublisher([TOPIC])
    shards.publish(leased(h), publisher, TOPIC, 4, h.clock.now())
    data = publisher.published[2][1]
    first, second = leased(h, "instance-a"), leased(h, "instance-b")
    held = first.lease.keyed(Shard(2, 4).lease_key).take()  # the first delivery's pass, under way
    assert not isinstance(held, type(None))
    summary = shards.handle(second, data, BUCKET, 4)
    assert summary is not None and summary.skipped and not summary.jobs
    assert h.live() == []


def test_a_message_for_another_bucket_or_k_or_too_old_is_dropped(h):
    h.submit(jobs_of(0, 2, 1)[0])
    engine = leased(h)
    listing = pack(engine.observer.list_bucket())
    assert shards.handle(engine, envelope(Shard(0, 2), "other", h.clock.now(), listing=listing), BUCKET, 2) is None
    assert shards.handle(engine, envelope(Shard(0, 2), BUCKET, h.clock.now(), listing=listing), BUCKET, 4) is None
    old = h.clock.now() - shards.MAX_AGE * 2
    assert shards.handle(engine, envelope(Shard(0, 2), BUCKET, old, listing=listing), BUCKET, 2) is None
    assert shards.handle(engine, b"{not json\n", BUCKET, 2) is None
    assert h.live() == []


def test_a_listing_over_what_a_message_carries_goes_through_an_object(h):
    jobs = jobs_of(1, 2, 4)
    for job in jobs:
        h.submit(job)
    engine = leased(h)
    publisher = MemoryPublisher([TOPIC])
    shards.publish(engine, publisher, TOPIC, 2, h.clock.now(), inline_bytes=10)
    head = json.loads(publisher.published[1][1].partition(b"\n")[0])
    assert head["object"]["name"] == "respawn/shards/1-of-2"
    shards.handle(engine, publisher.published[1][1], BUCKET, 2)
    assert h.live() == sorted(f"{j}-1" for j in jobs)


def test_a_status_replaced_since_the_handed_listing_is_observed_again_alone(h):
    job = jobs_of(0, 2, 1)[0]
    h.submit(job)
    engine = leased(h)
    listing = pack(engine.observer.list_bucket())  # before the job's status exists
    stale = envelope(Shard(0, 2), BUCKET, h.clock.now(), listing=listing)
    engine.reconcile()  # another pass launched it meanwhile
    h.exit(job, 0)
    listing = engine.observer.list_bucket()
    status = next(i for i in listing if i.name == names.status_key(job))
    handed = [BlobInfo(i.bucket, i.name, i.generation - 1 if i is status else i.generation, i.updated, i.size)
              for i in listing]  # the status as an older generation
    shards.handle(engine, envelope(Shard(0, 2), BUCKET, h.clock.now(), listing=pack(handed)), BUCKET, 2)
    assert h.status(job).phase == Phase.SUCCEEDED and h.live() == []
    shards.handle(engine, stale, BUCKET, 2)  # a listing from before the status: nothing launched again
    assert h.status(job).attempt == 1 and h.live() == []


def test_one_shard_costs_nothing_new(h):
    for i in range(6):
        h.submit(f"job-{i}")
    leased(h).reconcile()
    before = list(h.compute.calls)
    h.compute.calls.clear()
    leased(h).reconcile()
    assert [c for c in h.compute.calls if c[0] == "list" and c[1].startswith("*")] == [("list", "*")]
    assert before


# -- through main.py, as the platform runs the functions -------------------------------------------

def post_shard_message(data: bytes) -> Any:
    client = create_app("on_shard", MAIN, "cloudevent").test_client()
    event = CloudEvent({"type": "google.cloud.pubsub.topic.v1.messagePublished",
                        "source": f"//pubsub.googleapis.com/{TOPIC}"},
                       {"message": {"data": base64.b64encode(data).decode(), "messageId": "1"},
                        "subscription": "projects/p/subscriptions/s"})
    headers, body = to_binary(event)
    return client.post("/", headers=headers, data=body)


def test_a_tick_with_shards_publishes_and_each_on_shard_reconciles_its_jobs(h):
    jobs = [f"job-{i}" for i in range(8)]
    for job in jobs:
        h.submit(job)
    publisher = MemoryPublisher([TOPIC])
    bootstrap.override(leased(h), Settings(bucket=BUCKET, project=PROJECT, shards=4), publisher=publisher)
    try:
        response = create_app("tick", MAIN).test_client().post("/")
        assert response.status_code == 200 and response.get_json()["published"] == 4
        assert h.live() == [] and [a["shard"] for _, _, a in publisher.published] == ["0", "1", "2", "3"]
        assert lastpass.read(h.store, BUCKET).jobs == len(jobs)  # the controller ran (respawn doctor)
        for _, data, _ in publisher.published:
            assert post_shard_message(data).status_code == 200
        assert h.live() == sorted(f"{j}-1" for j in jobs)
        assert post_shard_message(b"garbage").status_code == 200  # absorbed: no retry could help
    finally:
        bootstrap.override(None)


def test_with_one_shard_the_tick_reconciles_itself_and_publishes_nothing(h):
    for i in range(3):
        h.submit(f"job-{i}")
    publisher = MemoryPublisher([TOPIC])
    bootstrap.override(leased(h), Settings(bucket=BUCKET, project=PROJECT), publisher=publisher)
    try:
        response = create_app("tick", MAIN).test_client().post("/")
        assert response.status_code == 200 and "published" not in response.get_json()
        assert publisher.published == [] and publisher.calls == []
        assert h.live() == ["job-0-1", "job-1-1", "job-2-1"]
        assert not [i for i in h.store.list(BUCKET, "respawn/") if i.name.startswith(("respawn/shards/", "respawn/lease/shard"))]
    finally:
        bootstrap.override(None)


def test_with_shards_a_tpu_worker_s_audit_entry_fans_out_as_a_tick_and_passes_over_no_job_itself(h):
    from controller.core.audit import system_event_entry
    from tests.service.test_audit import message

    h.submit("job-0")
    publisher = MemoryPublisher([TOPIC])
    bootstrap.override(leased(h), Settings(bucket=BUCKET, project=PROJECT, shards=4), publisher=publisher)
    try:
        worker = system_event_entry(PROJECT, "us-central2-b", "t1v-n-5f3a9c1e-w-0", "77",
                                    "compute.instances.preempted", h.clock.now())
        answer = functions.on_audit(message(worker))
        assert answer is not None and answer["published"] == 4 and len(publisher.published) == 4
        assert h.live() == []
    finally:
        bootstrap.override(None)
