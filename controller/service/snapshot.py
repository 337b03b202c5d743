"""``respawn/snapshot/<part>.json``: what passes over every job made of the objects they read (specs,
statuses, VM records), so that a fresh function instance reads a few objects where it read two or
three per job.

A function instance keeps what it made of each object between passes (observe.Parsed, keyed by
the object's generation), so its steady tick reads only what changed. A fresh instance has
nothing: its first pass over 10,000 jobs read 20,000 objects, and split and validated 10,000
statuses, about 80 CPU-seconds, four minutes at a third of a vCPU. So a pass over every job also
writes what its cache holds, in ``PARTS`` objects by the job's residue (``names.shard_of``; shard
i of K owns the parts p with p mod K = i, so each shard writes only its own and reads only its own),
and a fresh instance reads its parts once, before its first pass.

A snapshot is a cache, never a source of truth. Each entry names the object and the generation it
was made from, and is used only for an object the pass's own listing names at that generation: a
generation names one content forever, so an entry either is exactly what a read would give or is
never used. A status entry is its head and its history and past runs as ``JobStatus.split`` gives
them, compressed: both are decompressed within the status's own bound and the past validated
before the cache takes them, and the head is validated where every pass parses it (one that does
not is let go and the object read: ``Observer._status``). A spec entry is the spec's bytes as
stored, judged as a read's would be (by this instance's policy, whatever the writer's was); a
record entry is a VM record's bytes, judged by ``Record.parse`` as a read's. A part that does not
parse, is too large, or holds an entry for another part's job or another kind of object is skipped,
entry by entry.

Who can write it: the controller (and whoever administers the bucket, who can write any status
too); trainer VMs cannot (their IAM condition names their own records only: deploy/IAM.md). A
part is rewritten when more than ``STALE`` of what it holds no longer matches the listing (or it
is missing): in a steady fleet a part is rewritten every few tens of minutes, never every tick.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
import zlib
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from controller.core import errors, names
from controller.core.ports import BlobInfo, BlobStore
from controller.core.shards import Shard
from controller.core.spec import MAX_SPEC_BYTES
from controller.core.state import JobStatus
from controller.core.world import MAX_RECORD_BYTES
from controller.service import fanout

log = logging.getLogger(__name__)
T = TypeVar("T")

PREFIX = "respawn/snapshot/"
PARTS = names.MAX_SHARDS
VERSION = 1
STALE = 1 / 8  # a part is rewritten once more than this share of its entries no longer matches
MAX_PART_BYTES = 256 * 1024 * 1024  # a part is a few hundred KB at 10,000 jobs; bounded whoever wrote it
# What a load may hold at once, as ``cost`` and ``held`` bound it: the parts read side by side while
# they are parsed (a part of tiny entries makes several times its size: 16 parts of 90 KB peaked at
# 10.8 MB), and their entries until a pass takes them; a fresh instance reads up to 256 parts, each
# up to MAX_PART_BYTES. A job whose status is at its history limit holds about 6 KB (60 MB at 10,000
# jobs). A part past what is left is skipped, as if missing (its jobs' objects are read).
MAX_LOAD_BYTES = 128 * 1024 * 1024
VALUE_BYTES = 128  # at most what json.loads makes of one JSON value (a str, a list, a dict's pair) in memory
ENTRY_BYTES = 320  # what an entry held costs beside its bytes: its key, name, generation, the dict's slot
MAX_STATUS_BYTES = 4 * 1024 * 1024  # as observe.MAX_STATUS_BYTES: a status's own bound

Packed = tuple[bytes, bytes, tuple[int, int]]  # a status as observe.Parsed keeps it: head, past (zlib), lengths
# What VMs write that a part holds (names.parse_object_name's kinds). Not the heartbeat: a trainer
# writes it again every minute, so a part holding it would be stale, and rewritten, every pass.
RECORDS = ("marker", "exit", "notice", "ready")


class _SpecBytes(bytes):
    """A spec's bytes, as a part held them."""


class _RecordBytes(bytes):
    """A VM record's bytes, as a part held them."""


class Unchecked(tuple):  # type: ignore[type-arg]
    """A status's Packed as a part held it: its past not validated yet (``Observer._status``)."""


def part_of(job: str) -> int:
    return names.shard_of(job, PARTS)


def part_key(part: int) -> str:
    return f"{PREFIX}{part:03d}.json"


def parts_of(shard: Shard | None) -> range | list[int]:
    """The parts a pass over every job (of ``shard``) reads and writes."""
    if shard is None:
        return range(PARTS)
    return [p for p in range(PARTS) if p % shard.count == shard.index]


class Snapshot:
    """The snapshot as this instance knows it: what each of its parts holds in the bucket (loaded or
    written here), and the entries loaded and not yet taken by a pass."""

    def __init__(self, store: BlobStore, bucket: str) -> None:
        self.store = store
        self.bucket = bucket
        self._held: dict[int, dict[str, int]] = {}  # part -> {object name: generation} as it is stored
        self._waiting: dict[tuple[str, int], Any] = {}  # (name, generation) -> _SpecBytes, Packed or _RecordBytes
        self._loaded: set[int] = set()
        self._left = 0  # of MAX_LOAD_BYTES, for the parts a load still reads (``_read_part``)
        self._lock = threading.Lock()

    # -- reading ---------------------------------------------------------------------------------

    def load(self, shard: Shard | None, workers: int = 1) -> None:
        """Read the parts of ``shard`` (or every part) this instance has not read yet: one listing
        of the prefix and a read of each part there. Never fails a pass: a part that cannot be read
        is as if it were missing (its jobs' objects are read)."""
        wanted = [p for p in parts_of(shard) if p not in self._loaded]
        if not wanted:
            return
        self._loaded.update(wanted)
        try:
            self._load(wanted, workers)
        except Exception:  # noqa: BLE001 - a cache: a pass without it reads the objects, never fails
            log.exception("the snapshot could not be read; this pass reads every object")

    def _load(self, wanted: list[int], workers: int) -> None:
        try:
            listed = {info.name: info for info in self.store.list(self.bucket, PREFIX)}
        except errors.RespawnError as e:
            log.warning("the snapshot's parts could not be listed: %s; this pass reads every object", e)
            return
        there = [listed[part_key(p)] for p in wanted if part_key(p) in listed]
        self._left = MAX_LOAD_BYTES
        for part, got in zip(there, fanout.each(there, self._read_part, workers), strict=True):
            number = int(part.name[len(PREFIX):-len(".json")])
            stored: dict[str, int] = {}
            with self._lock:
                for key, value in got:
                    stored[key[0]] = key[1]
                    self._waiting[key] = value
                self._held[number] = stored

    def _read_part(self, info: BlobInfo) -> list[tuple[tuple[str, int], Any]]:
        """The part's entries; none when it cannot be read or is too large (``fanout.each``'s work:
        never raises)."""
        if info.size > MAX_PART_BYTES:
            log.warning("snapshot part %s is larger than %d bytes: not read", info.name, MAX_PART_BYTES)
            return []
        if not self._take(info.size):  # its bytes, before they are read
            log.warning("snapshot part %s not read: the load holds all it may", info.name)
            return []
        try:
            data = self.store.read_listed(info)
            parsing = cost(data)
            if not self._take(parsing - info.size):  # what parsing it makes, before it is parsed
                self._take(-info.size)  # its bytes are let go here
                log.warning("snapshot part %s not parsed: the load holds all it may", info.name)
                return []
            found = entries(data, int(info.name[len(PREFIX):-len(".json")]))
            self._take(held(found) - parsing)  # only its entries stay
            return found
        except Exception as e:  # noqa: BLE001 - replaced since the listing, not answering, a surprise: as if missing
            log.warning("snapshot part %s could not be read: %s", info.name, e)
            return []

    def _take(self, size: int) -> bool:
        """Whether ``size`` bytes of the load's bound are left, taken when they are (a negative size gives
        them back). What a part's entries hold stays until a pass takes them or ``save`` lets them go:
        not given back."""
        with self._lock:
            if size > self._left:
                return False
            self._left -= size
            return True

    def spec(self, info: BlobInfo) -> bytes | None:
        """The spec's bytes at the listed generation, when a part held them (taken: once)."""
        found = self._take_entry(info, _SpecBytes)
        return bytes(found) if found is not None else None

    def status(self, info: BlobInfo) -> Packed | None:
        """The status at the listed generation as ``Parsed`` keeps it (an ``Unchecked``), when a part
        held it and its head decompresses within the status's bound (taken: once). Its head is
        validated where every pass parses it (``Observer._status``: one that does not is let go and
        the object read); its past, decompressed within the same bound, when a pass first uses it,
        and read from the object where it does not validate (``JobStatus.joined``'s ``otherwise``)."""
        found = self._take_entry(info, Unchecked)
        if found is None:
            return None
        try:
            inflate(found[0])
        except ValueError:
            log.warning("snapshot entry for %s refused: its head is larger than a status; the object is read", info.name)
            return None
        return found

    def record(self, info: BlobInfo) -> bytes | None:
        """A VM record's bytes at the listed generation, when a part held them (taken: once): judged
        as a read's (``Record.parse``), as anything a VM wrote."""
        found = self._take_entry(info, _RecordBytes)
        return bytes(found) if found is not None else None

    def _take_entry(self, info: BlobInfo, kind: type[T]) -> T | None:
        """The entry for the object at the listed generation when it is of ``kind``, taken (once);
        an entry of another kind stays where it is."""
        with self._lock:
            found = self._waiting.get((info.name, info.generation))
            if not isinstance(found, kind):
                return None
            del self._waiting[(info.name, info.generation)]
        return found

    # -- writing ---------------------------------------------------------------------------------

    def save(self, listing: Mapping[str, Mapping[str, BlobInfo]], cached: Callable[[BlobInfo], Any],
             shard: Shard | None = None, workers: int = 1) -> int:
        """After a pass over every job (of ``shard``): rewrite each of its parts whose stored entries
        differ from the pass's listing by more than ``STALE`` (or that is missing), from what the
        cache holds at the listed generations (``cached``: observe.Parsed's value, None when not
        held). Entries not taken by then are let go. Returns the parts
        written; a write that fails is left to the next pass (never the pass's failure)."""
        mine = set(parts_of(shard))
        by_part: dict[int, dict[str, BlobInfo]] = defaultdict(dict)
        for job, objects in listing.items():
            for kind, info in objects.items():
                if kind.split("/")[0] in ("spec", "status", *RECORDS):  # a worker's exit too ("exit/<rank>")
                    by_part[part_of(job)][info.name] = info
        with self._lock:
            self._waiting = {k: v for k, v in self._waiting.items() if _part_of_name(k[0]) not in mine}
        due: list[tuple[int, dict[str, int], list[list[Any]]]] = []
        for part in sorted(mine):
            listed = by_part.get(part, {})
            values = {name: value for name, info in sorted(listed.items())
                      if _storable(value := cached(info))}
            kept = {name: listed[name].generation for name in values}
            held = self._held.get(part)
            if held is None and not kept:
                continue
            if held is not None:
                # What the pass could write that the part lacks or holds at another generation. Not
                # what the part holds that the cache lacks (a cache smaller than the fleet leaves some
                # out), nor objects gone since (records a pass consumed after reading them, a job
                # deleted): never used, and let go at the part's next rewrite; counted, a part would
                # be rewritten every pass.
                stale = [name for name, generation in kept.items() if held.get(name) != generation]
                if len(stale) <= STALE * len(kept):
                    continue
            due.append((part, kept, [_row(name, kept[name], value) for name, value in values.items()]))
        done = fanout.each(due, self._write_part, workers)
        for (part, kept, _), ok in zip(due, done, strict=True):
            if ok:
                self._held[part] = kept
        return sum(done)

    def _write_part(self, due: tuple[int, dict[str, int], list[list[Any]]]) -> bool:
        part, _, rows = due
        try:
            body = json.dumps({"v": VERSION, "part": part, "entries": rows}, separators=(",", ":")).encode()
            self.store.write(self.bucket, part_key(part), body)
            return True
        except Exception as e:  # noqa: BLE001 - a cache (fanout.each's work: never raises): the next pass tries again
            log.warning("snapshot part %d not written: %s; the next pass tries again", part, e)
            return False


def entries(data: bytes, part: int) -> list[tuple[tuple[str, int], Any]]:
    """A part's entries that are this part's and well formed; anything else in it is skipped."""
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        return []
    rows = body.get("entries") if isinstance(body, dict) and body.get("v") == VERSION else None
    if not isinstance(rows, list):
        return []
    found = []
    for row in rows:
        try:
            kind, name, generation, *rest = row
            ref = names.parse_object_name(name) if isinstance(name, str) else None
            if ref is None or part_of(ref.job) != part or not isinstance(generation, int) or generation <= 0 \
                    or (ref.node is not None and kind != "record") \
                    or ref.kind != kind and not (kind == "record" and ref.kind in RECORDS):
                continue
            if kind in ("spec", "record") and len(rest) == 1 and isinstance(rest[0], str):
                raw = rest[0].encode()
                if len(raw) <= (MAX_SPEC_BYTES if kind == "spec" else MAX_RECORD_BYTES):
                    found.append(((name, generation), _SpecBytes(raw) if kind == "spec" else _RecordBytes(raw)))
            elif kind == "status" and len(rest) == 4 and all(isinstance(x, str) for x in rest[:2]) \
                    and all(isinstance(x, int) and x >= 0 for x in rest[2:]):
                head, past = (base64.b64decode(x, validate=True) for x in rest[:2])
                found.append(((name, generation), Unchecked((head, past, (rest[2], rest[3])))))
        except (ValueError, TypeError, binascii.Error):
            continue
    return found


def cost(data: bytes) -> int:
    """At most what parsing a part holds in memory at once: its bytes, their text, the strings parsed
    from it and what base64 gives of them, and ``VALUE_BYTES`` for each JSON value, every one but the
    first of a list or dict following a comma (a comma inside a string only counts one more)."""
    return 4 * len(data) + VALUE_BYTES * (data.count(b",") + data.count(b"[") + data.count(b"{") + 1)


def held(found: list[tuple[tuple[str, int], Any]]) -> int:
    """What a part's entries hold in memory (``entries``'s), about."""
    return sum(ENTRY_BYTES + len(key[0]) + (len(value) if isinstance(value, bytes) else len(value[0]) + len(value[1]))
               for key, value in found)


def _storable(value: Any) -> bool:
    """What a part can hold of the cache's (observe.Parsed) values: a spec's (spec, problems, its
    bytes), a status's (Packed, generation), or a VM record's (Record, its bytes), bytes in UTF-8
    (what is not is refused anyway, and read again: never kept)."""
    if not isinstance(value, tuple):
        return False
    if len(value) == 2 and isinstance(value[0], tuple):  # a status
        return True
    text = value[2] if len(value) == 3 else value[1] if len(value) == 2 and value[0] is not None else None
    if not isinstance(text, bytes):
        return False
    try:
        text.decode()
    except UnicodeDecodeError:
        return False
    return True


def _row(name: str, generation: int, value: Any) -> list[Any]:
    if len(value) == 3:
        return ["spec", name, generation, value[2].decode()]
    if isinstance(value[0], tuple):
        head, past, (history, runs) = value[0]
        return ["status", name, generation, base64.b64encode(head).decode(), base64.b64encode(past).decode(),
                history, runs]
    return ["record", name, generation, value[1].decode()]


def _part_of_name(name: str) -> int | None:
    ref = names.parse_object_name(name)
    return part_of(ref.job) if ref is not None else None


def inflate(data: bytes) -> bytes:
    """Decompressed within a status's bound (a small entry cannot unpack to gigabytes). Anything
    that is not such a stream is a ValueError, as ``JobStatus.joined``'s ``otherwise`` expects: a
    zlib.error escaping it failed the job's passes for good: the entry stayed cached, and in its part."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, MAX_STATUS_BYTES)
    except zlib.error as e:
        raise ValueError(f"not a zlib stream: {e}") from e
    if inflater.unconsumed_tail or not inflater.eof:
        raise ValueError("larger than a status may be, or truncated")
    return out

