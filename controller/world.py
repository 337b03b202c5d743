"""What one pass observed, per job: plain values the planner decides on."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from controller.ports import BlobInfo, Instance, StopReason
from controller.spec import JobSpec
from controller.state import CheckpointRef, JobStatus


@dataclass(frozen=True)
class Record:
    """A marker, exit record or heartbeat written by a VM.

    ``attempt`` is None when the content could not be read (truncated by a hard-off,
    or garbage); the planner then dates it by the object's ``updated`` time instead.
    """

    key: str
    generation: int
    updated: datetime
    attempt: int | None = None
    instance: str | None = None
    exit_code: int | None = None
    detail: str = ""

    @classmethod
    def parse(cls, info: BlobInfo, data: bytes) -> Record:
        try:
            body = json.loads(data)
            attempt = body.get("attempt")
            code = body.get("exit_code")
            return cls(
                key=info.name,
                generation=info.generation,
                updated=info.updated,
                attempt=int(attempt) if attempt is not None else None,
                instance=str(body["instance"]) if body.get("instance") else None,
                exit_code=int(code) if code is not None else None,
                detail=str(body.get("reason", ""))[:200],
            )
        except (ValueError, TypeError, AttributeError):
            return cls(key=info.name, generation=info.generation, updated=info.updated, detail="unreadable")

    def belongs_to(self, status: JobStatus) -> bool:
        """Written by the current attempt (anything older is stale and only cleaned up)."""
        if self.attempt is not None:
            return self.attempt == status.attempt
        started = status.attempt_started_at
        return started is not None and self.updated >= started


@dataclass(frozen=True)
class JobView:
    job: str
    spec: JobSpec | None = None
    problems: tuple[str, ...] = ()  # why the spec cannot run; non-empty means invalid
    spec_generation: int | None = None
    cancelled: bool = False
    status: JobStatus | None = None
    status_generation: int = 0  # 0: no status.json yet (create-only precondition)
    marker: Record | None = None
    exit: Record | None = None
    heartbeat: Record | None = None
    instances: tuple[Instance, ...] = ()
    stop_reasons: Mapping[str, StopReason] = field(default_factory=dict)
    checkpoint: CheckpointRef | None = None
    checkpoint_loaded: bool = False  # observed lazily, only when a plan launches or fails

    @property
    def has_spec(self) -> bool:
        return self.spec is not None or bool(self.problems)


@dataclass(frozen=True)
class World:
    jobs: Mapping[str, JobView]
    unreachable: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)  # job -> why it could not be observed
