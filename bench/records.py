"""A bench fleet's view of its bucket, over the BlobStore port: the fakes' or GCS's."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from controller.service import fanout
from controller.core import names
from controller.core.ports import BlobInfo, BlobStore
from controller.core.state import JobStatus, Phase

T = TypeVar("T")


class Records:
    """Reads a job's status, and writes what its trainer would: exit records, markers, heartbeats."""

    store: BlobStore
    bucket: str
    jobs: list[str]
    workers: int = 1  # the fleet's own writes and reads, side by side

    def each(self, work: Callable[[Any], T], items: list[Any]) -> list[T]:
        return fanout.each(items, work, self.workers)

    def status(self, job: str) -> JobStatus:
        return JobStatus.from_json(self.store.read(self.bucket, names.status_key(job)).data)

    def record(self, job: str, key: str, extra: dict[str, Any], st: JobStatus | None = None) -> BlobInfo:
        """A record at ``key`` for the job's current attempt, with its token, as the VM agent writes it."""
        st = st or self.status(job)
        body = {"instance": names.instance_name(job, st.attempt), "attempt": st.attempt, "node": 0,
                "token": st.attempt_token or "", **extra}
        return self.store.write(self.bucket, key, json.dumps(body).encode())

    def heartbeats(self) -> None:
        def beat(job: str) -> None:
            st = self.status(job)
            if not st.phase.terminal:
                self.record(job, names.heartbeat_key(job), {}, st)

        self.each(beat, self.jobs)

    def running(self) -> list[str]:
        statuses = self.each(self.status, self.jobs)
        return [j for j, st in zip(self.jobs, statuses, strict=True) if st.phase == Phase.RUNNING]
