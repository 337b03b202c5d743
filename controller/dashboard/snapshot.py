"""What the dashboard reads of the bucket, and how seldom.

Every open page polls, but no poll reaches the bucket itself: pages read the last
``Snapshot``. A refresh happens at most once per ``interval`` seconds, one at a time (pages
that ask while one is under way wait for it and share it). It lists ``jobs/`` once, then
reads only what changed since the last refresh, by the listing's generations: a job's
status when a pass wrote it, its heartbeat when its VM beat (RUNNING jobs only, the first
``MAX_LIVE_READS``), its ready record when rewritten (only a job with a standby booted at a
preemption notice: when it reached its starting line). A job's latest checkpoint (its spec, then a listing of its checkpoint
prefix; the status already read is passed in) is looked up again when its spec or status
changes, or, for a RUNNING job whose heartbeat changed since, at most every
``CHECKPOINT_EVERY`` seconds; never for a finished job while nothing changes; at most
``MAX_CHECKPOINT_READS`` per refresh. The reads of one refresh go side by side
(``READ_WORKERS``). A page left open on a quiet fleet costs one listing per interval and no
read per job. One job's status that cannot be read keeps the last one read and flags its row
(``problem``); a listing that fails is the refresh's error, given to every page until the
next refresh, an interval later.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from controller.core import errors, names
from controller.core.checkpoints import Found
from controller.core.ports import BlobInfo
from controller.core.spec import MAX_SPEC_BYTES
from controller.core.state import JobStatus, Phase
from controller.core.world import MAX_RECORD_BYTES
from controller.render.handover_view import AtLine, at_line
from controller.service.jobs import MAX_LIVE_READS, JobRow, Jobs

CHECKPOINT_EVERY = 60.0  # seconds between two listings of one RUNNING job's checkpoints, nothing else changing
MAX_CHECKPOINT_READS = 50  # checkpoint look-ups per refresh; the others wait for the next
READ_WORKERS = 8  # reads side by side within one refresh


@dataclass(frozen=True)
class JobView:
    """One job as last read: its row, the generations it was read at, its live step and checkpoint."""

    row: JobRow
    status_generation: int = 0
    spec_generation: int = 0
    live: dict[str, Any] | None = None
    checkpoint: Found | None = None
    checkpoint_error: str | None = None
    problem: str | None = None  # why its status could not be read this time (the row shows the last one read)
    ready: AtLine | None = None  # its standby at the starting line, as its ready record says


@dataclass(frozen=True)
class Snapshot:
    jobs: dict[str, JobView]  # by name, sorted
    at: datetime  # when it was read (wall clock, UTC)


@dataclass
class _Kept:
    """What one job's reads left, for the next refresh to reuse."""

    status: JobStatus | None = None
    status_generation: int = 0
    live: dict[str, Any] | None = None
    live_key: tuple[int, int] = (0, 0)  # (status, heartbeat) generations it was read at
    checkpoint: tuple[Found | None, str | None] = (None, None)
    checkpoint_key: tuple[int, int] = (-1, -1)  # (spec, status) generations
    checkpoint_at: float = float("-inf")
    beat_at: float = float("-inf")  # when its heartbeat last changed (this clock)
    problem: str | None = None
    spec: tuple[int, bytes] | None = None  # (generation, text), read for the job page
    ready: AtLine | None = None
    ready_key: tuple[int, int] = (0, 0)  # (status, ready record) generations it was read at


class Fleet:
    """The bucket as the dashboard sees it, read at a bounded rate (module docstring)."""

    def __init__(self, jobs: Jobs, interval: float, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.jobs, self.interval, self.clock, self.wall = jobs, interval, clock, wall
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._read_at = float("-inf")
        self._failed: errors.RespawnError | None = None  # the last refresh's error, until the next one
        self._kept: dict[str, _Kept] = {}

    def snapshot(self) -> Snapshot:
        """The last snapshot, refreshed first when it is ``interval`` old."""
        with self._lock:
            if self.clock() - self._read_at >= self.interval or (self._snapshot is None and self._failed is None):
                try:
                    self._snapshot, self._failed = self._refresh(), None
                except errors.RespawnError as e:
                    self._failed = e
                    raise
                finally:  # a failed refresh waits its interval too: pages polling meanwhile get its error
                    self._read_at = self.clock()
            elif self._failed is not None:
                raise self._failed
            assert self._snapshot is not None
            return self._snapshot

    def expire(self) -> None:
        """The next snapshot is read afresh (after a cancel or a resubmit: the page shows its effect)."""
        with self._lock:
            self._read_at = float("-inf")

    def spec(self, job: str) -> tuple[int, bytes] | None:
        """The job's spec (generation, text) as of the last snapshot; read again only when it changed."""
        view = self.snapshot().jobs.get(job)
        if view is None or not view.spec_generation:
            return None
        with self._lock:
            kept = self._kept.setdefault(job, _Kept())
            if kept.spec is None or kept.spec[0] != view.spec_generation:
                try:
                    blob = self.jobs.store.read(self.jobs.bucket, names.spec_key(job), limit=MAX_SPEC_BYTES)
                except (errors.NotFound, errors.TooLarge):
                    return None
                kept.spec = (blob.info.generation, blob.data)
            return kept.spec

    def _refresh(self) -> Snapshot:
        listed: dict[str, dict[str, BlobInfo]] = {}
        for info in self.jobs.store.list(self.jobs.bucket, names.JOBS_PREFIX):
            if (ref := names.parse_object_name(info.name)) and ref.node is None:
                listed.setdefault(ref.job, {})[ref.kind] = info
        # A job is a name with a spec or a status, as the controller judges them (observe._ours): a
        # name holding only what a trainer can write (a heartbeat, an exit record, a notice) is none.
        listed = {job: objects for job, objects in listed.items() if "spec" in objects or "status" in objects}
        self._kept = {job: self._kept.get(job, _Kept()) for job in listed}
        gens = {job: (objects["spec"].generation if "spec" in objects else 0,
                      objects["status"].generation if "status" in objects else 0) for job, objects in listed.items()}
        with ThreadPoolExecutor(READ_WORKERS) as pool:
            # Statuses that a pass wrote since the last refresh, side by side; one that cannot be
            # read keeps the last one read and flags its row, never the fleet.
            changed = [job for job, (_, status_gen) in gens.items() if status_gen != self._kept[job].status_generation]
            for job, (status, problem) in zip(changed, pool.map(self._status, changed)):
                kept = self._kept[job]
                kept.problem = problem
                if problem is None:
                    kept.status, kept.status_generation = (status if gens[job][1] else None), gens[job][1]
            running = [job for job in sorted(listed) if _running(self._kept[job].status)][:MAX_LIVE_READS]
            beats = [job for job in running if self._beat_changed(job, listed[job])]
            for job, live in zip(beats, pool.map(lambda j: self._live(j, self._kept[j].status), beats)):
                self._kept[job].live = live
            # A standby's ready record, only for a job that has one accepted, only when it was rewritten.
            standing = [job for job in listed if _standby(self._kept[job].status) and "ready" in listed[job]]
            lines = [job for job in standing
                     if (gens[job][1], listed[job]["ready"].generation) != self._kept[job].ready_key]
            for job, ready in zip(lines, pool.map(lambda j: self._ready(j, self._kept[j].status), lines)):
                kept = self._kept[job]
                kept.ready, kept.ready_key = ready, (gens[job][1], listed[job]["ready"].generation)
            due = self._checkpoints_due(gens)
            for job, found in zip(due, pool.map(lambda j: self._checkpoint(j, self._kept[j].status), due)):
                kept = self._kept[job]
                kept.checkpoint, kept.checkpoint_key, kept.checkpoint_at = found, gens[job], self.clock()
        views: dict[str, JobView] = {}
        for job, objects in sorted(listed.items()):
            kept = self._kept[job]
            row = JobRow(job, kept.status, "spec" in objects, "cancel" in objects)
            live = kept.live if job in running and "heartbeat" in objects else None
            checkpoint, problem = kept.checkpoint if gens[job][0] else (None, None)
            ready = kept.ready if job in standing else None
            views[job] = JobView(row, kept.status_generation, gens[job][0], live, checkpoint, problem, kept.problem,
                                 ready)
        return Snapshot(views, self.wall())

    def _status(self, job: str) -> tuple[JobStatus | None, str | None]:
        try:
            return self.jobs.status(job), None
        except errors.RespawnError as e:
            return None, f"status unreadable: {e or type(e).__name__}"
        except Exception as e:  # noqa: BLE001 - a bug or a hostile object: this job's row only
            return None, f"status unreadable: unexpected {type(e).__name__}: {e}"

    def _beat_changed(self, job: str, objects: dict[str, BlobInfo]) -> bool:
        kept, beat = self._kept[job], objects.get("heartbeat")
        key = (kept.status_generation, beat.generation if beat else 0)
        if beat is None or key == kept.live_key:
            return False
        if key[1] != kept.live_key[1]:
            kept.beat_at = self.clock()  # it beat: its run may have written a checkpoint since
        kept.live_key = key
        return True

    def _live(self, job: str, status: JobStatus | None) -> dict[str, Any] | None:
        try:
            return self.jobs.live(job, status)
        except Exception:  # noqa: BLE001 - a trainer's odd beat never costs the page
            return None

    def _ready(self, job: str, status: JobStatus | None) -> AtLine | None:
        """What the job's ready record says of its standby (``handover_view.at_line``), or None."""
        if status is None:
            return None
        try:
            blob = self.jobs.store.read(self.jobs.bucket, names.ready_key(job), limit=MAX_RECORD_BYTES)
            return at_line(blob.info, blob.data, status)
        except Exception:  # noqa: BLE001 - gone, too large, a trainer's odd record: the row says "booting"
            return None

    def _checkpoints_due(self, gens: dict[str, tuple[int, int]]) -> list[str]:
        """The jobs whose latest checkpoint is looked up this refresh: those whose spec or status
        changed, then RUNNING jobs that beat since their last look, at most every
        ``CHECKPOINT_EVERY`` seconds; a finished job's is never looked up again while nothing
        changes. At most ``MAX_CHECKPOINT_READS``, oldest look first: the others wait a refresh."""
        changed, aged = [], []
        for job, key in gens.items():
            kept = self._kept[job]
            if not key[0] or kept.problem is not None:
                continue
            if key != kept.checkpoint_key:
                changed.append(job)
            elif (_running(kept.status) and kept.beat_at > kept.checkpoint_at
                  and self.clock() - kept.checkpoint_at >= CHECKPOINT_EVERY):
                aged.append(job)
        aged.sort(key=lambda job: self._kept[job].checkpoint_at)
        return (sorted(changed, key=lambda job: self._kept[job].checkpoint_at) + aged)[:MAX_CHECKPOINT_READS]

    def _checkpoint(self, job: str, status: JobStatus | None) -> tuple[Found | None, str | None]:
        try:
            return self.jobs.checkpoint(job, status), None
        except errors.RespawnError as e:
            return None, str(e) or type(e).__name__
        except Exception as e:  # noqa: BLE001 - a bug or a hostile tree: this job's cell only
            return None, f"unexpected {type(e).__name__}: {e}"


def _running(status: JobStatus | None) -> bool:
    return status is not None and status.phase == Phase.RUNNING


def _standby(status: JobStatus | None) -> bool:
    return status is not None and status.standby is not None and status.standby.inserted
