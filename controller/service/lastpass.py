"""``respawn/controller.json``: when the controller last ran a full pass, and what it did.

The tick writes it at the end of every pass (``functions.tick``): one small object, so that
``respawn doctor`` and ``respawn status`` can say "controller last ran 40 s ago" without
reading Cloud Logging or Cloud Scheduler. It is a hint for people, never read by the
controller itself, so its write never fails the tick: a failure is logged and the next pass
writes it again. GCS allows about one write a second to one object name; a process writes it
at most once a second (``MIN_INTERVAL``), and ticks come a minute apart. The trainer account's
IAM condition names only the VM records, so trainer VMs cannot write it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from controller.core.ports import BlobStore

KEY = "respawn/controller.json"
STALE_AFTER = 180.0  # seconds: the Scheduler calls tick every minute; three missed is a problem
MIN_INTERVAL = 1.0  # seconds between two writes from one process (GCS: ~1 write/s per object)
MAX_BYTES = 64 * 1024  # what a reader reads of it at most
SKEW = 60.0  # seconds a record may be dated ahead of the reader's clock (clocks disagree a little)

log = logging.getLogger(__name__)
_lock = threading.Lock()
_last_write = float("-inf")  # time.monotonic() of this process's last write


@dataclass(frozen=True)
class LastPass:
    at: datetime  # when the pass started (UTC)
    duration_s: float
    jobs: int
    actions: int
    errors: int
    # Projects that refused a Spot VM's preemption notice (a Preview field), and Compute's words:
    # their jobs run with Spot's 30 s shutdown only (``respawn doctor`` says how to get it).
    notice_refused: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> bytes:
        return json.dumps({"last_pass": self.at.isoformat(), "duration_s": round(self.duration_s, 3),
                           "jobs": self.jobs, "actions": self.actions, "errors": self.errors,
                           **({"notice_refused": self.notice_refused} if self.notice_refused else {})}).encode()

    def age(self, now: datetime) -> float:
        return max(0.0, (now - self.at).total_seconds())

    def future(self, now: datetime) -> bool:
        """Dated later than ``now`` by more than clocks disagree: a forged record (any bucket writer
        can write one) or a broken clock; either way no sign that the controller runs."""
        return (self.at - now).total_seconds() > SKEW

    def stale(self, now: datetime) -> bool:
        return self.age(now) > STALE_AFTER or self.future(now)

    def describe(self, now: datetime) -> str:
        """``controller last ran 40 s ago (0.8 s, 3 jobs, 1 action, 0 errors)``."""
        if self.future(now):
            return (f"{KEY} says the controller last ran at {self.at.isoformat()}, "
                    f"{_ago((self.at - now).total_seconds()).removesuffix(' ago')} in the future: not believed")
        return (f"controller last ran {_ago(self.age(now))} ({self.duration_s:.1f} s, {_n(self.jobs, 'job')}, "
                f"{_n(self.actions, 'action')}, {_n(self.errors, 'error')})")


def of_summary(summary: dict[str, Any], at: datetime, duration_s: float) -> LastPass:
    """The record of a pass from its summary (``Summary.as_dict()``)."""
    actions = summary.get("actions") or {}
    return LastPass(at=at, duration_s=duration_s, jobs=int(summary.get("jobs_seen") or 0),
                    actions=sum(len(done) for done in actions.values()),
                    errors=len(summary.get("errors") or {}), notice_refused=dict(summary.get("notice_refused") or {}))


def write(store: BlobStore, bucket: str, record: LastPass) -> bool:
    """Write the record; False (logged, never raised) when it was not written."""
    global _last_write
    with _lock:
        if time.monotonic() - _last_write < MIN_INTERVAL:
            return False  # a pass a moment ago wrote it: GCS would refuse a second write this second
        _last_write = time.monotonic()
    try:
        store.write(bucket, KEY, record.as_json())
        return True
    except Exception as e:  # noqa: BLE001 - a hint for people: never the tick's failure
        log.warning("could not write %s: %s: %s", KEY, type(e).__name__, e)
        return False


def read(store: BlobStore, bucket: str) -> LastPass | None:
    """The record, or None when there is none yet. A record that is not one raises ValueError."""
    from controller.core import errors

    try:
        blob = store.read(bucket, KEY, limit=MAX_BYTES)
    except errors.NotFound:
        return None
    return parse(blob.data)


def parse(data: bytes) -> LastPass:
    try:
        raw = json.loads(data)
        at = datetime.fromisoformat(raw["last_pass"])
        refused = raw.get("notice_refused") or {}
        refused = {str(p)[:100]: str(why)[:300] for p, why in list(refused.items())[:20]} if isinstance(refused, dict) else {}
        return LastPass(at=at if at.tzinfo else at.replace(tzinfo=UTC), duration_s=float(raw["duration_s"]),
                        jobs=int(raw["jobs"]), actions=int(raw["actions"]), errors=int(raw["errors"]),
                        notice_refused=refused)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError, OverflowError) as e:
        raise ValueError(f"{KEY} is not a controller record: {e}") from e


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.0f} days ago"


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"
