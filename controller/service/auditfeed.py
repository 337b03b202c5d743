"""The tick's safety net for the audit path: Compute's System Event entries read with one Logging query.

The sink -> Pub/Sub -> ``on_audit`` path is fast but may lose a message, or was never set up
(a sink not created, its grant missing). So each tick also asks Logging, in one ``entries.list``
query (``controller.core.audit.list_filter``, oldest first), for the entries since its
watermark, and hands them to the pass as evidence: a lost message then costs at most one tick,
and a thousand VMs preempted at once cost one Logging query, not a thousand zone-operation lists
(Compute's stop reason stays the last resort, for a VM no entry speaks of).

The watermark is ``respawn/audit-watermark.json`` in the control bucket (the controller's own:
trainer VMs cannot write under ``respawn/``): the newest entry timestamp handed to a pass, and
the identities of the entries of the last ``OVERLAP`` before it. It moves only after the pass
that used the entries ended (``commit``), by compare-and-swap: a tick that crashed before that
reads the same entries again (the pass is level-triggered, so acting on one twice changes
nothing), and no entry is ever skipped. Logging may index an entry after later ones (its
``receiveTimestamp`` trails its ``timestamp``), so each query starts ``OVERLAP`` before the
watermark and drops the entries already handed over; one that arrives later than that is seen
by no query, and its VM is judged by Compute's own records, as before this path existed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from controller.core import audit, errors
from controller.core.clock import Clock
from controller.core.ports import AuditLog, BlobStore

log = logging.getLogger(__name__)
KEY = "respawn/audit-watermark.json"
OVERLAP = timedelta(minutes=5)
FIRST_LOOKBACK = timedelta(hours=1)  # no watermark yet: the entries of the last hour
LIMIT = 2000  # entries a tick reads (two pages); past it, the next tick goes on from the last one read
MAX_SEEN = 20_000  # identities kept in the watermark (a mass preemption's entries within OVERLAP)
MAX_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Watermark:
    high: datetime | None = None  # the newest entry timestamp handed to a pass
    seen: frozenset[tuple[str, str]] = frozenset()  # (insertId, timestamp) of the entries from high - OVERLAP on
    truncated: bool = False  # the last read hit LIMIT: the next one starts at ``high`` itself

    def to_json(self) -> bytes:
        return json.dumps({"high": self.high.isoformat() if self.high else None, "truncated": self.truncated,
                           "seen": sorted(map(list, self.seen))}).encode()

    @classmethod
    def parse(cls, data: bytes) -> Watermark:
        """The watermark a blob holds; one that cannot be read is none (the last hour is read again)."""
        try:
            raw = json.loads(data)
            high = datetime.fromisoformat(raw["high"]) if raw.get("high") else None
            if high is not None and high.tzinfo is None:
                raise ValueError("no offset")
            seen = frozenset((str(a), str(b)) for a, b in raw.get("seen", [])[:MAX_SEEN])
            return cls(high, seen, bool(raw.get("truncated", False)))
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            log.warning("unreadable audit watermark; reading the last hour again", extra={"json_fields": {"object": KEY}})
            return cls()


@dataclass(frozen=True)
class Batch:
    """What one read found: the entries new to the pass, and the watermark to write once it ends."""

    events: tuple[audit.AuditEvent, ...] = ()
    mark: Watermark | None = None
    generation: int = 0
    error: str | None = None
    ignored: int = 0  # entries that are not a System Event entry about an instance
    read: int = 0
    dropped: list[str] = field(default_factory=list)


class AuditFeed:
    def __init__(self, log_reader: AuditLog, store: BlobStore, bucket: str, projects: Sequence[str],
                 clock: Clock) -> None:
        self.reader = log_reader
        self.store = store
        self.bucket = bucket
        self.projects = tuple(projects)
        self.clock = clock

    def read(self) -> Batch:
        """The entries since the watermark that no earlier pass was handed; never raises."""
        try:
            loaded, generation = self._load()
        except errors.RespawnError as e:
            return Batch(error=f"audit watermark: {type(e).__name__}: {e}")
        now = self.clock.now()
        mark = loaded
        if mark.high is not None and mark.high > now:
            # A watermark ahead of the clock (Logging takes entries stamped up to a day ahead; an
            # older release moved to them): from there every entry would be skipped until then.
            mark = Watermark(now, mark.seen, mark.truncated)
        since = now - FIRST_LOOKBACK if mark.high is None else mark.high if mark.truncated else mark.high - OVERLAP
        try:
            raw = self.reader.system_events(self.projects, since, LIMIT)
            events, ignored, stamps = _parse(raw, since)
            if len(raw) >= LIMIT and mark.high is not None and since < mark.high \
                    and not any(at > mark.high for at in stamps):
                # The overlap alone holds a whole read (a mass preemption's entries): none of it is
                # past the watermark. Go on from the watermark itself, or nothing new is ever read.
                since = mark.high
                raw = self.reader.system_events(self.projects, since, LIMIT)
                more, more_ignored, stamps = _parse(raw, since)
                events, ignored = [*events, *more], ignored + more_ignored
        except errors.RespawnError as e:
            log.warning("could not read the System Event audit log", extra={"json_fields": {"error": str(e)}})
            return Batch(error=f"audit log: {type(e).__name__}: {e}")
        events = list({e.key: e for e in events}.values())
        fresh = tuple(e for e in events if e.key not in mark.seen)
        # The newest timestamp read (an entry ignored here was read too: past it, or a page of
        # them stops the feed), never behind the watermark (a read of the overlap alone must not
        # move it back) nor ahead of the clock (an entry stamped ahead must not make every later
        # one look old); an entry older than the query asked for is no timestamp to go by.
        high = max([*stamps, *([mark.high] if mark.high is not None else [])], default=None)
        high = None if high is None else min(high, now)
        seen = frozenset(e.key for e in events if high is not None and e.at >= high - OVERLAP)
        if mark.high is not None and high is not None:
            seen |= frozenset(k for k in mark.seen if (at := _at(k)) is not None and at >= high - OVERLAP)
        seen = frozenset(sorted(seen, key=lambda k: k[1])[-MAX_SEEN:])
        new = Watermark(high, seen, truncated=len(raw) >= LIMIT)
        return Batch(fresh, None if new == loaded else new, generation, ignored=ignored, read=len(raw))

    def commit(self, batch: Batch) -> None:
        """The watermark moves past ``batch``, unless another tick moved it since (it read as much)."""
        if batch.mark is None:
            return
        try:
            self.store.write(self.bucket, KEY, batch.mark.to_json(), if_generation_match=batch.generation)
        except errors.PreconditionFailed:
            log.info("audit watermark moved by another pass", extra={"json_fields": {"object": KEY}})
        except errors.RespawnError as e:  # the next tick reads these entries again: only slower
            log.warning("could not write the audit watermark", extra={"json_fields": {"error": str(e)}})

    def _load(self) -> tuple[Watermark, int]:
        try:
            blob = self.store.read(self.bucket, KEY, limit=MAX_BYTES)
        except errors.NotFound:
            return Watermark(), 0
        except errors.TooLarge:
            return Watermark(), self.store.stat(self.bucket, KEY).generation
        return Watermark.parse(blob.data), blob.info.generation


def _parse(raw: Sequence[object], since: datetime) -> tuple[list[audit.AuditEvent], int, list[datetime]]:
    """The events among ``raw``, how many entries were not one, and the timestamps read (from ``since`` on)."""
    events: list[audit.AuditEvent] = []
    ignored = 0
    for entry in raw:
        try:
            events.append(audit.parse_entry(entry))
        except audit.AuditError:
            ignored += 1
    stamps = [at for entry in raw if (at := audit.entry_time(entry)) is not None and at >= since]
    return events, ignored, stamps


def _at(key: tuple[str, str]) -> datetime | None:
    """The timestamp a kept identity holds; None for one that holds none (with no offset, say)."""
    try:
        at = datetime.fromisoformat(key[1])
    except ValueError:
        return None
    return at if at.tzinfo is not None else None
