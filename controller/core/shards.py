"""A shard of the fleet: which jobs it reconciles, and the bucket listing the tick handed it.

With K shards (RESPAWN_SHARDS) the tick lists the bucket once and publishes each shard's part of
the listing (controller.service.shards); each shard function reconciles the jobs whose name hashes
to it (names.shard_of), from that listing, and lists only the VMs labelled for it. Pure values and
their wire format here; no I/O.

The message is JSON, zlib-compressed: the listing as object names, generations, updated times (in
microseconds) and sizes, every field ``BlobInfo`` carries. A listing is a name plus a few numbers
per object, and its names repeat the job's: compressed, about 24 bytes an object (the generations
and times are the incompressible part; tests/unit/test_shards.py), so a shard of 10,000 jobs
(40,000 objects) is about 1 MB, a tenth of Pub/Sub's 10 MB message limit (Google's quotas page, as
controller.adapters.pubsub.MAX_MESSAGE_BYTES; pubsub.v1's discovery document states none). A
listing over ``INLINE_BYTES`` compressed goes through an object the shard reads instead
(controller.service.shards).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta, timezone

from controller.core import names
from controller.core.ports import BlobInfo

VERSION = 1
# Compressed bytes a message carries its listing in; over it, an object carries it. Under Pub/Sub's
# 10,000,000-byte limit with room for the attributes and the JSON around it.
INLINE_BYTES = 8 * 1000 * 1000
MAX_LISTING_BYTES = 512 * 1000 * 1000  # a listing unpacked: bounded, whoever wrote the message or object
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class ShardError(ValueError):
    """A message or listing that is none of the tick's (malformed, another bucket's, a bad K)."""


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count``. ``listing``: the bucket's objects the tick listed for it (None:
    the shard lists the bucket itself). ``sweep``: this pass also looks for the VMs that carry no
    shard label (made before sharding), each kept by the shard of its job's name."""

    index: int
    count: int
    listing: tuple[BlobInfo, ...] | None = field(default=None, repr=False)
    sweep: bool = False

    def __post_init__(self) -> None:
        if problem := names.shards_problem(self.count):
            raise ShardError(problem)
        if not 0 <= self.index < self.count:
            raise ShardError(f"shard {self.index} of {self.count} does not exist")

    def owns(self, job: str | None) -> bool:
        """Whether this shard reconciles ``job`` (a VM's job label, an object's job): never None's."""
        return job is not None and names.shard_of(job, self.count) == self.index

    @property
    def lease_key(self) -> str:
        return f"respawn/lease/shard-{self.index}-of-{self.count}"

    def __str__(self) -> str:
        return f"shard {self.index} of {self.count}"


def split(infos: Iterable[BlobInfo], shards: int) -> list[list[BlobInfo]]:
    """The listing by shard: each object with the shard of the job its name belongs to (an object
    outside the bucket contract goes nowhere: no shard would read it)."""
    out: list[list[BlobInfo]] = [[] for _ in range(shards)]
    for info in infos:
        ref = names.parse_object_name(info.name)
        if ref is not None:
            out[names.shard_of(ref.job, shards)].append(info)
    return out


# Whatever else a listing's BlobInfo carries (a custom metadata map, say) travels too, after the four
# fields every object has: a shard must judge an object as a listing of its own would.
_EXTRA = tuple(f.name for f in fields(BlobInfo) if f.name not in ("bucket", "name", "generation", "updated", "size"))


def pack(infos: Iterable[BlobInfo]) -> bytes:
    """A listing, compressed."""
    rows = [[i.name, i.generation, _micros(i.updated), i.size, *(_plain(getattr(i, f)) for f in _EXTRA)]
            for i in infos]
    return zlib.compress(json.dumps(rows, separators=(",", ":")).encode(), 6)


def unpack(data: bytes, bucket: str) -> tuple[BlobInfo, ...]:
    """``pack``'s listing again, every object in ``bucket``; ShardError for anything else."""
    try:
        raw = zlib.decompressobj().decompress(data, MAX_LISTING_BYTES)
        rows = json.loads(raw)
        return tuple(BlobInfo(bucket, str(name), int(generation), _EPOCH + timedelta(microseconds=int(updated)),
                              int(size), **dict(zip(_EXTRA, map(_checked, extra), strict=True)))
                     for name, generation, updated, size, *extra in rows)
    except (zlib.error, ValueError, TypeError, OverflowError) as e:
        raise ShardError(f"not a shard listing: {type(e).__name__}: {e}") from e


def _plain(value: object) -> object:
    return dict(value) if isinstance(value, Mapping) else value


def _checked(value: object) -> object:
    """An extra field as a listing could have given it: None, a number, a string, or a map of strings."""
    if value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return value
    raise ValueError(f"not a listing's value: {type(value).__name__}")


def envelope(shard: Shard, bucket: str, at: datetime, listing: bytes | None = None,
             listing_object: tuple[str, int] | None = None) -> bytes:
    """A shard message's data: which shard, the tick's time, and its listing inline (``pack``) or
    the object (name, generation) that holds it."""
    body: dict[str, object] = {"v": VERSION, "shard": shard.index, "shards": shard.count, "bucket": bucket, "at": at.isoformat(),
            "sweep": shard.sweep}
    if listing_object is not None:
        body["object"] = {"name": listing_object[0], "generation": listing_object[1]}
    head = json.dumps(body, separators=(",", ":")).encode()
    # The head, a newline, then the packed listing's bytes as they are (no base64: Pub/Sub carries bytes).
    return head + b"\n" + (listing or b"")


@dataclass(frozen=True)
class Message:
    """A shard message as read: the shard, the tick's time, and where its listing is."""

    shard: Shard
    bucket: str
    at: datetime
    listing: bytes | None  # packed, inline
    listing_object: tuple[str, int] | None  # or (name, generation) of the object that holds it


def read_message(data: bytes) -> Message:
    """``envelope``'s fields again; ShardError for a message that is none of the tick's."""
    head, sep, rest = data.partition(b"\n")
    try:
        body = json.loads(head)
        if not sep or not isinstance(body, dict) or body.get("v") != VERSION:
            raise ShardError("not a shard message of this version")
        shard = Shard(int(body["shard"]), int(body["shards"]), sweep=bool(body.get("sweep")))
        at = datetime.fromisoformat(str(body["at"]))
        if at.tzinfo is None:
            raise ShardError("the message's time names no zone")
        where = body.get("object")
        obj = (str(where["name"]), int(where["generation"])) if isinstance(where, dict) else None
        return Message(shard, str(body["bucket"]), at, None if obj else rest, obj)
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, ShardError):
            raise
        raise ShardError(f"not a shard message: {type(e).__name__}: {e}") from e


def _micros(at: datetime) -> int:
    delta = at - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
