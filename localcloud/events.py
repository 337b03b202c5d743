"""Stand-ins for Cloud Scheduler and Eventarc.

- ``Ticker`` POSTs to the ``tick`` function on an interval with a bearer token, and
  waits for each answer before the next (runs of one Scheduler job never overlap).
- ``Watcher`` polls the bucket and turns every new object generation into a binary
  CloudEvent ``google.cloud.storage.object.v1.finalized`` posted to ``on_object``,
  redelivered with backoff while the function answers an error (at-least-once).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import requests
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent

log = logging.getLogger(__name__)


class Loop:
    def __init__(self, name: str, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Loop:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.once()
            except Exception:  # noqa: BLE001 - a stand-in keeps going, like the real service
                log.exception("%s failed", self._thread.name)
            self._stop.wait(self.interval)

    def once(self) -> None:
        raise NotImplementedError


class Ticker(Loop):
    def __init__(self, url: str, interval: float) -> None:
        super().__init__("scheduler", interval)
        self.url = url
        self.runs = 0
        # What Cloud Scheduler's job resource shows (lastAttemptTime, status): the last call's
        # start, and its HTTP status (None: no answer).
        self.last_attempt: datetime | None = None
        self.last_status: int | None = None

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def once(self) -> None:
        self.last_attempt, self.last_status = datetime.now(UTC), None
        # Cloud Scheduler sends an OIDC ID token; the local functions do not check it.
        answer = requests.post(self.url, headers={"Authorization": "Bearer local-oidc-token"}, json={}, timeout=600)
        self.last_status = answer.status_code
        self.runs += 1


class Watcher(Loop):
    def __init__(self, gcs: Any, bucket: str, url: str, interval: float = 0.2, prefixes: tuple[str, ...] = ("",)) -> None:
        super().__init__("eventarc", interval)
        self.gcs = gcs
        self.bucket = bucket
        self.url = url
        self.prefixes = prefixes
        self.delivered = 0
        # Whole sweeps made: an object written before a sweep began has had its event (every
        # retry made) once this count is past that sweep. Tests wait on it for a quiet bucket.
        self.sweeps = 0
        self._seen: dict[str, int] = {}

    def once(self) -> None:
        for prefix in self.prefixes:
            for blob in self.gcs.list_blobs(self.bucket, prefix=prefix):
                if self._seen.get(blob.name) != blob.generation:
                    self._seen[blob.name] = blob.generation
                    self._deliver(blob)
        self.sweeps += 1

    def _deliver(self, blob: Any) -> None:
        headers, body = finalized(self.bucket, blob)
        for delay in (0, 0.5, 1, 2, 4):
            time.sleep(delay)
            try:
                if requests.post(self.url, headers=headers, data=body, timeout=600).ok:
                    self.delivered += 1
                    return
            except requests.RequestException:
                pass
        log.warning("event for %s not delivered", blob.name)


def finalized(bucket: str, blob: Any) -> tuple[dict[str, str], bytes]:
    """The binary CloudEvent Eventarc posts for a new object generation: (headers, body)."""
    data = {"kind": "storage#object", "bucket": bucket, "name": blob.name, "generation": str(blob.generation),
            "metageneration": str(blob.metageneration or 1), "size": str(blob.size or 0),
            "contentType": blob.content_type or "application/octet-stream",
            "timeCreated": blob.time_created.isoformat() if blob.time_created else None,
            "updated": blob.updated.isoformat() if blob.updated else None}
    event = CloudEvent({"id": str(uuid.uuid4()), "type": "google.cloud.storage.object.v1.finalized",
                        "source": f"//storage.googleapis.com/projects/_/buckets/{bucket}",
                        "subject": f"objects/{blob.name}"}, data)
    return to_binary(event)
