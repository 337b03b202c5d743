"""The snapshot (controller.service.snapshot): a fresh instance's first pass over every job reads a
few objects where it read two per job, and decides exactly what it would have decided reading them;
a part is a cache that nothing in the bucket can turn into a wrong decision.

Every harness tick is a fresh instance (a new engine and observer), and the harness keeps the
snapshot on: every service test exercises it. These tests pin what it must and must not do."""

from __future__ import annotations

import base64
import json
import tracemalloc
import zlib

import pytest

from controller.core import names
from controller.core.shards import Shard, envelope, pack
from controller.core.state import Phase
from controller.service import shards, snapshot
from controller.service.snapshot import PREFIX, part_key, part_of
from tests.harness import BUCKET, Harness
from tests.service.test_shards import fan_tick, jobs_of, leased


def _fleet(h: Harness, jobs: list[str]) -> None:
    for job in jobs:
        h.submit(job)
    h.tick()
    h.tick()  # every VM seen running
    assert all(h.status(job).phase == Phase.RUNNING for job in jobs)


def _reads(h: Harness, since: int, kinds: tuple[str, ...] = (names.SPEC, names.STATUS)) -> list[str]:
    return [name for op, name in h.store.calls[since:] if op == "read" and name.endswith(kinds)]


def _parts(h: Harness) -> dict[str, list]:
    return {info.name: json.loads(h.store.read(BUCKET, info.name).data)["entries"]
            for info in h.store.list(BUCKET, PREFIX)}


def test_a_fresh_instance_reads_no_spec_or_status_the_snapshot_holds_and_decides_the_same():
    jobs = [f"job-{i}" for i in range(12)]
    h, plain = Harness(), Harness(snapshot=False)
    for harness in (h, plain):
        _fleet(harness, jobs)
        harness.exit(jobs[0], 0)  # something to decide: a job done
        harness.compute.preempt(names.instance_name(jobs[1], 1))
    since = len(h.store.calls)
    with_snapshot = h.tick()
    assert _reads(h, since) == []  # every spec and status from the parts (a few reads of its own)
    since_plain = len(plain.store.calls)
    without = plain.tick()
    assert len(_reads(plain, since_plain)) == 2 * len(jobs)
    assert with_snapshot.jobs == without.jobs
    assert {j: h.status(j).phase for j in jobs} == {j: plain.status(j).phase for j in jobs}
    assert h.status(jobs[0]).phase == Phase.SUCCEEDED


def test_a_status_replaced_since_the_part_was_written_is_read_not_taken_from_the_part():
    h = Harness()
    _fleet(h, ["llm"])
    h.tick()
    key = names.status_key("llm")
    st = h.status("llm")
    h.store.put(BUCKET, key, st.but(message="edited by hand").to_json())  # a new generation
    since = len(h.store.calls)
    h.tick()
    assert _reads(h, since) == [key]
    assert h.status("llm").attempt == st.attempt


def test_the_pass_that_commits_keeps_the_status_it_wrote_so_the_next_instance_reads_nothing():
    h = Harness()
    _fleet(h, ["llm"])
    h.compute.preempt(names.instance_name("llm", 1))
    h.tick()  # commits the loss: what it wrote goes in the part at its new generation
    assert h.status("llm").attempt == 2
    since = len(h.store.calls)
    h.tick()
    assert _reads(h, since) == []


def _hostile_part(h: Harness, job: str, rows: list) -> None:
    h.store.put(BUCKET, part_key(part_of(job)), json.dumps({"v": 1, "part": part_of(job), "entries": rows}))


def _status_row(h: Harness, job: str, head: bytes, past: bytes, lengths: tuple[int, int]) -> list:
    info = h.store.stat(BUCKET, names.status_key(job))
    return ["status", info.name, info.generation, base64.b64encode(head).decode(), base64.b64encode(past).decode(),
            *lengths]


@pytest.mark.parametrize("what", ["invalid head", "invalid past", "past not zlib", "wrong lengths", "bomb", "truncated",
                                  "not base64",
                                  "another part's job", "a record's name", "spec as a status", "not json", "old version"])
def test_a_part_that_is_not_what_a_pass_wrote_is_refused_entry_by_entry_and_the_objects_are_read(what):
    h = Harness()
    _fleet(h, ["llm", "other"])
    h.tick()
    st = h.status("llm")
    head, past, lengths = type(st).split(st.to_json())
    info = h.store.stat(BUCKET, names.status_key("llm"))
    other = jobs_of(part_of("llm") ^ 1, snapshot.PARTS, 1)[0]
    rows: list = {
        "invalid head": [_status_row(h, "llm", zlib.compress(b'{"phase": 7}'), zlib.compress(past), lengths)],
        "invalid past": [_status_row(h, "llm", zlib.compress(head), zlib.compress(b'{"history": 3}'), lengths)],
        "past not zlib": [_status_row(h, "llm", zlib.compress(head), b"not zlib", lengths)],
        "wrong lengths": [_status_row(h, "llm", zlib.compress(head), zlib.compress(past), (lengths[0] + 1, 0))],
        "bomb": [_status_row(h, "llm", zlib.compress(b" " * (snapshot.MAX_STATUS_BYTES + 1)), zlib.compress(past),
                             lengths)],
        "truncated": [_status_row(h, "llm", zlib.compress(head)[:-4], zlib.compress(past), lengths)],
        "not base64": [["status", info.name, info.generation, "!!", "??", *lengths]],
        "another part's job": [["spec", names.spec_key(other), 1, "command: x"]],
        "a record's name": [["spec", names.heartbeat_key("llm"), 1, "{}"]],
        "spec as a status": [["spec", info.name, info.generation, "command: rm -rf /"]],
        "not json": None,
        "old version": [],
    }[what]
    if what == "not json":
        h.store.put(BUCKET, part_key(part_of("llm")), b"\x00garbage{")
    elif what == "old version":
        h.store.put(BUCKET, part_key(part_of("llm")), json.dumps({"v": 0, "entries": [
            _status_row(h, "llm", zlib.compress(head), zlib.compress(past), lengths)]}))
    else:
        _hostile_part(h, "llm", rows)
    past_only = what in ("invalid past", "past not zlib", "wrong lengths")
    if past_only:  # a past is parsed when a pass first uses it: a loss, whose commit appends to the history
        h.compute.preempt(names.instance_name("llm", 1))
    since = len(h.store.calls)
    summary = h.tick()
    assert not summary.errors
    assert names.status_key("llm") in _reads(h, since)  # read, as without a snapshot
    now = h.status("llm")
    if past_only:
        assert now.attempt == st.attempt + 1 and now.history[:len(st.history)] == st.history
    else:
        assert now.attempt == st.attempt and now.phase == st.phase


def test_an_unchanged_fleet_rewrites_no_part_and_a_part_is_rewritten_once_an_eighth_of_it_changed():
    h = Harness()
    jobs = jobs_of(5, snapshot.PARTS, 16)  # one part's
    _fleet(h, jobs)
    h.tick()
    since = len(h.store.calls)
    for _ in range(3):
        h.tick()
    assert [n for op, n in h.store.calls[since:] if op == "write" and n.startswith(PREFIX)] == []
    held = {row[1]: row[2] for row in _parts(h)[part_key(5)]}
    for i, job in enumerate(jobs[:5]):  # 4 of its 32 entries stale: an eighth, not more; the fifth: more
        h.store.put(BUCKET, names.status_key(job), h.status(job).but(message=f"edit {i}").to_json())
        since = len(h.store.calls)
        h.tick()
        wrote = [n for op, n in h.store.calls[since:] if op == "write" and n.startswith(PREFIX)]
        assert wrote == ([] if i < 4 else [part_key(5)]), i
    now = {row[1]: row[2] for row in _parts(h)[part_key(5)]}
    assert now != held and all(now[names.status_key(j)] == h.store.stat(BUCKET, names.status_key(j)).generation
                               for j in jobs)


def test_each_shard_writes_and_reads_only_its_own_parts():
    h = Harness()
    jobs = jobs_of(0, 4, 3) + jobs_of(1, 4, 3) + jobs_of(2, 4, 3) + jobs_of(3, 4, 3)
    for job in jobs:
        h.submit(job)
    fan_tick(h, 4)
    for info in h.store.list(BUCKET, PREFIX):
        part = int(info.name[len(PREFIX):-len(".json")])
        assert {names.parse_object_name(row[1]).job for row in _parts(h)[info.name]} <= \
            {j for j in jobs if part_of(j) == part}
    engine = leased(h)
    since = len(h.store.calls)
    fan_tick(h, 4, engine=engine)
    read_parts = [n for op, n in h.store.calls[since:] if op == "read" and n.startswith(PREFIX)]
    assert len(read_parts) == len(set(read_parts))  # each part once, by the shard that owns it
    assert _reads(h, since) == []


def test_a_part_that_cannot_be_read_is_as_if_missing(monkeypatch):
    h = Harness()
    _fleet(h, ["llm"])
    h.tick()
    real = h.store.read_listed

    def failing(info):
        if info.name.startswith(PREFIX):
            from controller.core import errors
            raise errors.TransientError("503")
        return real(info)

    monkeypatch.setattr(h.store, "read_listed", failing)
    summary = h.tick()
    assert not summary.errors and h.status("llm").phase == Phase.RUNNING


def test_a_spec_from_the_snapshot_is_judged_by_this_instance_s_policy_not_the_writer_s():
    import dataclasses

    h = Harness()
    h.submit("llm")
    h.tick()  # PENDING, and launched: the spec is in the part
    h.policy = dataclasses.replace(h.policy, allowed_machine_types=("a2-highgpu-1g",))  # a redeploy's stricter one
    since = len(h.store.calls)
    h.tick()
    assert _reads(h, since, (names.SPEC,)) == []  # from the part, and judged here
    assert any("machine_type" in e for e in h.status("llm").errors), h.status("llm").errors


def test_an_instance_never_reads_back_a_status_it_wrote_and_a_listing_older_than_its_write_is_not_trusted():
    h = Harness(snapshot=False)
    _fleet(h, ["llm"])
    engine = h.engine()
    engine.reconcile()
    h.compute.preempt(names.instance_name("llm", 1))
    engine.reconcile()  # commits the loss and the next attempt
    assert h.status("llm").attempt == 2
    since = len(h.store.calls)
    engine.reconcile()
    assert _reads(h, since, (names.STATUS,)) == []
    # What it replaced is let go: a listing from before a write names a generation no pass may act on.
    listed = h.store.stat(BUCKET, names.status_key("llm"))
    older = [k for k in engine.observer.parsed._entries if k[1] == listed.name]
    assert [k[2] for k in older] == [listed.generation]


def test_a_part_over_its_bound_is_not_read_and_a_part_that_cannot_be_written_is_written_by_the_next_pass(monkeypatch):
    from controller.core import errors

    h = Harness()
    _fleet(h, ["llm"])
    monkeypatch.setattr(snapshot, "MAX_PART_BYTES", 10)
    since = len(h.store.calls)
    h.tick()
    assert [n for op, n in h.store.calls[since:] if op == "read" and n.startswith(PREFIX)] == []  # not even read
    assert sorted(_reads(h, since)) == sorted([names.spec_key("llm"), names.status_key("llm")])
    monkeypatch.setattr(snapshot, "MAX_PART_BYTES", 256 * 1024 * 1024)
    for info in h.store.list(BUCKET, PREFIX):
        h.store.delete(BUCKET, info.name)
    real = h.store.write

    def refusing(bucket, name, data, **kw):
        if name.startswith(PREFIX):
            raise errors.TransientError("503")
        return real(bucket, name, data, **kw)

    monkeypatch.setattr(h.store, "write", refusing)
    engine = h.engine()
    assert not engine.reconcile().errors
    assert h.store.list(BUCKET, PREFIX) == []
    monkeypatch.setattr(h.store, "write", real)
    engine.reconcile()  # the same instance: the part it could not write is still due
    assert [i.name for i in h.store.list(BUCKET, PREFIX)] == [part_key(part_of("llm"))]


def test_a_vm_record_is_taken_from_the_part_and_judged_as_a_read_of_it_would_be():
    h = Harness()
    _fleet(h, ["llm", "forged"])
    h.exit("llm", 1)  # a failure: the job backs off, its exit record kept until its next attempt
    h.exit("forged", 0, token="not-the-attempt-s")  # a record without the attempt's secret
    h.tick()
    assert h.status("llm").phase == Phase.RECOVERING and h.status("forged").phase == Phase.RUNNING
    since = len(h.store.calls)
    h.tick()
    assert [n for op, n in h.store.calls[since:] if op == "read" and n.startswith(names.JOBS_PREFIX)] == []
    assert h.status("llm").phase == Phase.RECOVERING and h.status("forged").phase == Phase.RUNNING


def test_a_snapshot_entry_for_a_status_older_than_this_instance_s_own_write_is_never_judged():
    # A shard's message carries the listing its tick made; an event's pass on the same instance may
    # commit the job meanwhile. The generation it replaced is then the job of a pass that must
    # observe it again alone, as a read would find (test_shards' listing older than the write),
    # even when the part read after the write holds that generation.
    outcomes = []
    for with_snapshot in (True, False):
        h = Harness(snapshot=with_snapshot)
        job = jobs_of(0, 2, 1)[0]
        _fleet(h, [job])
        h.tick()  # the part holds the job's status as it is now
        engine = leased(h)  # a fresh instance, its snapshot not read yet
        older = envelope(Shard(0, 2), BUCKET, h.clock.now(), listing=pack(engine.observer.list_bucket()))
        h.compute.preempt(names.instance_name(job, 1))
        engine.reconcile(job)  # an event's pass commits the loss and the next attempt
        assert h.status(job).attempt == 2 and h.status(job).phase == Phase.PROVISIONING
        summary = shards.handle(engine, older, BUCKET, 2)
        outcomes.append((summary.jobs.get(job), h.status(job).phase, h.live()))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][1] == Phase.RUNNING  # observed again alone: attempt 2's VM seen running


@pytest.mark.parametrize("rows", ["tiny", "large"])
def test_what_a_fresh_instance_holds_of_its_parts_is_bounded_whatever_they_hold(monkeypatch, rows):
    # A part of tiny entries makes several times its size in memory once parsed, one of large ones
    # holds its text and what base64 gives of it at once; 256 parts, each up to MAX_PART_BYTES, are
    # read side by side: what a load holds is bounded as a whole.
    h = Harness()
    monkeypatch.setattr(snapshot, "MAX_LOAD_BYTES", 4 << 20)
    large = base64.b64encode(bytes(range(256)) * 1_200).decode()  # 400 KB of text
    for part in range(16):
        job = jobs_of(part, snapshot.PARTS, 1)[0]
        entries = [["record", names.marker_key(job), generation, "x"] for generation in range(1, 2_001)] \
            if rows == "tiny" else [["status", names.status_key(job), 1, large, large, 0, 0]]
        h.store.put(BUCKET, part_key(part), json.dumps({"v": 1, "part": part, "entries": entries}))
    loading = snapshot.Snapshot(h.store, BUCKET)
    tracemalloc.start()
    try:
        loading.load(None, workers=4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20
    assert 0 < len({name for name, _ in loading._waiting}) < 16  # the parts that fit were taken, the rest left out
