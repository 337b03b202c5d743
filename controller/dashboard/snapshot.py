"""What the dashboard reads of the bucket, and how seldom.

Every open page polls, but no poll reaches the bucket itself: pages read the last
``Snapshot``. A refresh happens at most once per ``interval`` seconds, one at a time (pages
that ask while one is under way wait for it and share it). It lists ``jobs/`` once, then
reads only what changed since the last refresh, by the listing's generations: a job's
status when a pass wrote it, its heartbeat when its VM beat (RUNNING jobs only, the first
``MAX_LIVE_READS``). A job's latest checkpoint (its spec, then a listing of its checkpoint
prefix) is looked up again when its spec or status changes, else at most every
``CHECKPOINT_EVERY`` seconds. A page left open on a quiet fleet costs one listing per
interval and no read per job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from controller.core import errors, names
from controller.core.checkpoints import Found
from controller.core.ports import BlobInfo
from controller.core.spec import MAX_SPEC_BYTES
from controller.core.state import JobStatus, Phase
from controller.service.jobs import MAX_LIVE_READS, JobRow, Jobs

CHECKPOINT_EVERY = 60.0  # seconds between two listings of one job's checkpoints, nothing else changing


@dataclass(frozen=True)
class JobView:
    """One job as last read: its row, the generations it was read at, its live step and checkpoint."""

    row: JobRow
    status_generation: int = 0
    spec_generation: int = 0
    live: dict[str, Any] | None = None
    checkpoint: Found | None = None
    checkpoint_error: str | None = None


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
    spec: tuple[int, bytes] | None = None  # (generation, text), read for the job page


class Fleet:
    """The bucket as the dashboard sees it, read at a bounded rate (module docstring)."""

    def __init__(self, jobs: Jobs, interval: float, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.jobs, self.interval, self.clock, self.wall = jobs, interval, clock, wall
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._read_at = float("-inf")
        self._kept: dict[str, _Kept] = {}

    def snapshot(self) -> Snapshot:
        """The last snapshot, refreshed first when it is ``interval`` old."""
        with self._lock:
            if self._snapshot is None or self.clock() - self._read_at >= self.interval:
                self._snapshot = self._refresh()
                self._read_at = self.clock()
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
        self._kept = {job: self._kept.get(job, _Kept()) for job in listed}
        views: dict[str, JobView] = {}
        running = 0
        for job, objects in sorted(listed.items()):
            kept = self._kept[job]
            status_gen = objects["status"].generation if "status" in objects else 0
            if status_gen != kept.status_generation:
                kept.status = self.jobs.status(job) if status_gen else None
                kept.status_generation = status_gen
            row = JobRow(job, kept.status, "spec" in objects, "cancel" in objects)
            is_running = kept.status is not None and kept.status.phase == Phase.RUNNING
            running += is_running
            live = self._live(job, kept, objects, status_gen) if is_running and running <= MAX_LIVE_READS else None
            spec_gen = objects["spec"].generation if "spec" in objects else 0
            checkpoint, problem = self._checkpoint(job, kept, spec_gen, status_gen)
            views[job] = JobView(row, status_gen, spec_gen, live, checkpoint, problem)
        return Snapshot(views, self.wall())

    def _live(self, job: str, kept: _Kept, objects: dict[str, BlobInfo], status_gen: int) -> dict[str, Any] | None:
        beat = objects.get("heartbeat")
        key = (status_gen, beat.generation if beat else 0)
        if beat is not None and key != kept.live_key:
            try:
                kept.live = self.jobs.live(job, kept.status)
            except Exception:  # noqa: BLE001 - a trainer's odd beat never costs the page
                kept.live = None
            kept.live_key = key
        return kept.live if beat is not None else None

    def _checkpoint(self, job: str, kept: _Kept, spec_gen: int, status_gen: int) -> tuple[Found | None, str | None]:
        key = (spec_gen, status_gen)
        if not spec_gen:
            return None, None
        if key != kept.checkpoint_key or self.clock() - kept.checkpoint_at >= CHECKPOINT_EVERY:
            try:
                kept.checkpoint = (self.jobs.checkpoint(job), None)
            except errors.RespawnError as e:
                kept.checkpoint = (None, str(e) or type(e).__name__)
            except Exception as e:  # noqa: BLE001 - a bug or a hostile tree: this job's cell only
                kept.checkpoint = (None, f"unexpected {type(e).__name__}: {e}")
            kept.checkpoint_key, kept.checkpoint_at = key, self.clock()
        return kept.checkpoint
