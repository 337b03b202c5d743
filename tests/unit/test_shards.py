"""A shard message's wire format (controller.core.shards): what the tick packs, a shard reads back."""

from __future__ import annotations

import dataclasses
import random
from datetime import datetime, timedelta, timezone

import pytest

from controller.core import names
from controller.core.ports import BlobInfo
from controller.core.shards import Shard, ShardError, envelope, pack, read_message, split, unpack

AT = datetime(2026, 11, 29, tzinfo=timezone.utc)


def listing(jobs: int, seed: int = 1) -> list[BlobInfo]:
    """Four objects a job, each with a generation and time as random as GCS's (the incompressible part)."""
    rng = random.Random(seed)
    return [BlobInfo("b", f"jobs/job-{i:05d}/{kind}", rng.randrange(1, 2**60),
                     AT + timedelta(microseconds=rng.randrange(10**12)), rng.randrange(100, 40_000))
            for i in range(jobs) for kind in ("spec.yaml", "status.json", "heartbeat", "exit")]


def test_a_listing_of_ten_thousand_jobs_packs_to_about_a_megabyte_a_tenth_of_a_pubsub_message():
    infos = listing(10_000)
    packed = pack(infos)
    assert len(packed) / len(infos) < 30  # 24 bytes an object when measured
    assert len(packed) < 1_300_000 < 10_000_000 // 5
    assert unpack(packed, "b") == tuple(infos)


def test_the_listing_is_split_by_the_shard_of_each_object_s_job_and_nothing_outside_the_contract_goes_anywhere():
    infos = [*listing(50), BlobInfo("b", "respawn/lease/tick", 1, AT), BlobInfo("b", "preempted-jobs/job-00003", 2, AT)]
    parts = split(infos, 4)
    assert sum(len(p) for p in parts) == len(infos) - 1
    for index, part in enumerate(parts):
        assert all(names.shard_of(names.parse_object_name(i.name).job, 4) == index for i in part)  # type: ignore[union-attr]


@pytest.mark.parametrize("data", [b"", b"{}", b'{"v": 1}\n', b'{"v": 2, "shard": 0, "shards": 2}\n',
                                  b'{"v": 1, "shard": 3, "shards": 2, "bucket": "b", "at": "2026-01-01T00:00:00+00:00"}\n',
                                  b'{"v": 1, "shard": 0, "shards": 3, "bucket": "b", "at": "2026-01-01T00:00:00+00:00"}\n',
                                  b'{"v": 1, "shard": 0, "shards": 2, "bucket": "b", "at": "2026-01-01T00:00:00"}\n'])
def test_a_message_that_is_none_of_the_tick_s_is_refused_as_such(data):
    with pytest.raises(ShardError):
        read_message(data)


@pytest.mark.parametrize("data", [b"not zlib", __import__("zlib").compress(b'[["a", 1]]'),
                                  __import__("zlib").compress(b'{"a": 1}')])
def test_a_listing_that_is_not_one_is_refused_as_such(data):
    with pytest.raises(ShardError):
        unpack(data, "b")


def test_a_message_names_its_shard_its_time_and_where_its_listing_is():
    inline = read_message(envelope(Shard(1, 2, sweep=True), "b", AT, listing=pack(listing(2))))
    assert (inline.shard, inline.at, inline.listing_object) == (Shard(1, 2, sweep=True), AT, None)
    held = read_message(envelope(Shard(0, 2), "b", AT, listing_object=("respawn/shards/0-of-2", 7)))
    assert (held.listing, held.listing_object) == (None, ("respawn/shards/0-of-2", 7))


def test_every_field_a_listing_gives_travels_in_the_message():
    # A field BlobInfo gains (a custom metadata map) is carried as it was listed.
    extra = {f.name: {"respawn-record": "x"} for f in dataclasses.fields(BlobInfo)
             if f.name not in ("bucket", "name", "generation", "updated", "size")}
    infos = [dataclasses.replace(i, **extra) for i in listing(3)]
    assert unpack(pack(infos), "b") == tuple(infos)
    assert [dataclasses.asdict(i) for i in unpack(pack(infos), "b")] == [dataclasses.asdict(i) for i in infos]
