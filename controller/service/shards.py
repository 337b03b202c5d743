"""Fan-out beyond one instance: the tick publishes each shard's part of the bucket listing on
Pub/Sub, and ``on_shard`` reconciles one shard from its message (controller.core.shards).

With K shards the tick reconciles nothing itself: it lists the bucket (the only pass that does),
splits the listing by the shard of each job's name, and publishes one message per shard, even an
empty one (a shard with no job may still have orphans to delete). Pub/Sub delivers each to an
instance of the ``on_shard`` function, which takes its shard's own lease and reconciles that
shard's jobs alone. So a tick's cost is one listing and K publishes, and a shard's pass is a Kth of
the fleet's, whatever the fleet's size.

A message is at least once and may come late: two deliveries of one make one pass (the shard's
lease; one that comes after the first pass ended makes a pass as an extra tick would), and one
older than ``MAX_AGE`` is dropped (a later tick has published since). A message for another K
(a deploy changing K while a message was in flight) is dropped too: its shards' leases are not
the current K's, so its pass could run beside the current one (safe, every decision being a
compare-and-swap, but paid twice).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from controller.core import errors, names
from controller.core.ports import BlobInfo, BlobStore, Publisher
from controller.core.shards import INLINE_BYTES, Message, Shard, ShardError, envelope, pack, read_message, split, unpack
from controller.service.engine import Engine, Summary

log = logging.getLogger(__name__)
# A shard message older than this is dropped: the tick publishes every minute, so a newer one has
# come (Pub/Sub redelivers an unacknowledged message for days).
MAX_AGE = timedelta(minutes=3)
# Every this many minutes (by the tick's clock) a shard's pass lists every managed VM rather than
# its labelled ones, so that a VM without the shard label (made before sharding) whose job has no
# spec (an orphan) is found and deleted, by the one shard its job's name hashes to.
SWEEP_MINUTES = 15
LISTINGS_PREFIX = "respawn/shards/"  # a listing too large for a message: the controller's own prefix


def topic_path(project: str, topic: str) -> str:
    return topic if topic.startswith("projects/") else f"projects/{project}/topics/{topic}"


def listing_key(shard: Shard) -> str:
    return f"{LISTINGS_PREFIX}{shard.index}-of-{shard.count}"


def publish(engine: Engine, publisher: Publisher, topic: str, shards: int, now: datetime,
            inline_bytes: int = INLINE_BYTES, sweep: bool | None = None) -> dict[str, Any]:
    """List the bucket once and publish each shard its part; what was published, for the tick's
    answer. Every shard's publish is tried; any that failed raise a TransientError after the others
    went out (the Scheduler's retry publishes all again: a shard that gets two passes' messages
    makes one pass at a time, by its lease)."""
    store, bucket = engine.observer.store, engine.observer.bucket
    listing = engine.observer.list_bucket()
    sweep = now.minute % SWEEP_MINUTES == 0 if sweep is None else sweep
    failed: dict[int, str] = {}
    sizes: list[int] = []
    parts = split(listing, shards)
    jobs = len({ref.job for infos in parts for i in infos if (ref := names.parse_object_name(i.name))})
    for index, infos in enumerate(parts):
        shard = Shard(index, shards, sweep=sweep)
        packed = pack(infos)
        sizes.append(len(packed))
        try:
            if len(packed) > inline_bytes:
                # Over what a message may carry: the listing goes in an object under the controller's own
                # prefix (no trainer may write there), and the message names its generation.
                written = store.write(bucket, listing_key(shard), packed)
                data = envelope(shard, bucket, now, listing_object=(written.name, written.generation))
            else:
                data = envelope(shard, bucket, now, listing=packed)
            publisher.publish(topic, data, {"shard": str(index), "shards": str(shards)})
        except errors.RespawnError as e:
            failed[index] = f"{type(e).__name__}: {e}"
            log.error("could not publish a shard's message", extra={"json_fields": {"shard": index, "error": str(e)}})
    result = {"shards": shards, "jobs": jobs, "objects": len(listing), "published": shards - len(failed),
              "largest_message_bytes": max(sizes, default=0), "sweep": sweep}
    if failed:
        raise errors.TransientError(f"shard messages not published: {failed}")
    return result


def read(store: BlobStore, bucket: str, message: Message) -> tuple[BlobInfo, ...]:
    """The shard's listing, from the message or the object it names (that generation alone)."""
    if message.listing_object is None:
        return unpack(message.listing or b"", bucket)
    name, generation = message.listing_object
    if not name.startswith(LISTINGS_PREFIX):
        raise ShardError(f"a shard's listing is under {LISTINGS_PREFIX}, not {name!r}")
    data = store.read_listed(BlobInfo(bucket, name, generation, datetime.min))
    return unpack(data, bucket)


def handle(engine: Engine, data: bytes, bucket: str, shards: int) -> Summary | None:
    """Reconcile the shard a message names, from its listing; None when the message is dropped
    (not the tick's, another bucket's or K's, too old). Raises only what the listing's read raised."""
    try:
        message = read_message(data)
    except ShardError as e:
        log.warning("shard message ignored: %s", e)
        return None
    where = {"shard": message.shard.index, "shards": message.shard.count, "at": message.at.isoformat()}
    if message.bucket != bucket:
        log.warning("shard message for another bucket ignored", extra={"json_fields": {**where, "for": message.bucket}})
        return None
    if message.shard.count != shards:
        log.warning("shard message of another number of shards ignored (RESPAWN_SHARDS=%d)", shards,
                    extra={"json_fields": where})
        return None
    if engine.clock.now() - message.at > MAX_AGE:
        log.info("shard message older than %s ignored: a later tick's has come", MAX_AGE, extra={"json_fields": where})
        return None
    try:
        listing = read(engine.observer.store, bucket, message)
    except (ShardError, errors.NotFound) as e:  # replaced by a later tick's, or none of ours
        log.warning("shard listing unreadable: %s", e, extra={"json_fields": where})
        return None
    return engine.reconcile(shard=replace(message.shard, listing=listing))
