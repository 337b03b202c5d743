"""Job notifications: what one status commit tells the world, as JSON events.

Pure: ``notices`` reads the events a commit adds (``JobStatus.added_to``) and the counters
it moved; the executor delivers them (``controller.service.notifier``) only after its compare-and-
swap of that commit succeeded, so a transition goes out once however many passes raced to
decide it: the passes that lost the swap decided nothing and send nothing.

Each notice has an ``id`` unique to its transition (``event_id``), for a
consumer that must drop a repeat: a notice is sent at most once per commit, and a commit
whose process dies between the write and the send is not sent again.
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict

from controller.core import names
from controller.core.spec import JobSpec
from controller.core.state import Event, JobStatus, Phase

# History events that are state changes a person is told of, and what they are called.
KINDS = {
    "launch": "started",
    "running": "running",
    "preempted": "preempted",
    "maintenance": "recovering",
    "host error": "recovering",
    "lost": "recovering",
    "recycled": "recovering",
    "rebooted": "recovering",
    "failed": "recovering",  # a trainer failure retried; "failed" when it ends the job
    "succeeded": "succeeded",
    "cancelled": "cancelled",
}
BUDGET_SHARE = 0.8  # a budget warning when a counter first reaches this share of its limit
SEVERITY = {"failed": "error", "budget": "warning", "preempted": "warning", "recovering": "warning"}


class Notice(BaseModel):
    """One notification, as published to Pub/Sub (its data) and posted to a webhook."""

    model_config = ConfigDict(frozen=True)

    id: str  # <job>/<run>/<spec generation>/<attempt>/<event>/<time>/<hash of the cause>: one per transition
    job: str
    event: str  # started, running, preempted, recovering, failed, succeeded, cancelled, budget
    severity: str = "info"
    attempt: int
    zone: str | None = None
    cause: str  # in words, as the status history says it
    phase: str
    at: datetime
    instance: str | None = None
    status: str  # gs://<bucket>/jobs/<job>/status.json
    link: str  # the status object in the Cloud console

    def data(self) -> bytes:
        return self.model_dump_json().encode()

    def attributes(self) -> dict[str, str]:
        """Pub/Sub attributes, for subscription filters (``attributes.event = "failed"``)."""
        return {"job": self.job, "event": self.event, "attempt": str(self.attempt), "severity": self.severity}

    def text(self) -> str:
        """One line for a chat; ``&``, ``<`` and ``>`` escaped as Slack requires, so text a VM wrote
        (an exit record's reason) cannot ping a channel or disguise a link."""
        where = f" in {self.zone}" if self.zone else ""
        line = f"respawn: job {self.job} {self.event} (attempt {self.attempt}{where}): {self.cause}"
        return line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    def webhook_body(self) -> dict[str, object]:
        """Slack's incoming-webhook shape (``text``), with the event itself beside it."""
        return {"text": self.text(), "respawn": json.loads(self.model_dump_json())}


def notices(job: str, bucket: str, before: JobStatus | None, after: JobStatus, spec: JobSpec | None) -> list[Notice]:
    """The notices of the commit that turned ``before`` into ``after``."""
    out = [_notice(job, bucket, after, e) for e in after.added_to(before) if e.event in KINDS]
    if spec is not None and after.same_run(before) and before is not None:
        out += _budget(job, bucket, before, after, spec)
    return out


def event_id(job: str, status: JobStatus, e: Event) -> str:
    """A transition's id, from what it is: its run, the spec generation it was decided under,
    attempt, event, time and a short hash of what it says (two decisions at one instant, a spec
    refused twice, differ in one of them)."""
    run = status.created_at.isoformat() if status.created_at else ""
    said = hashlib.sha256(e.detail.encode()).hexdigest()[:8]
    return f"{job}/{run}/{status.spec_generation or 0}/{e.attempt}/{e.event}/{e.at.isoformat()}/{said}"


# The phase a notice reports: where the job stood at that event, not after the whole commit
# (a loss and its replacement's launch are often one commit).
_PHASE = {"started": "PROVISIONING", "running": "RUNNING", "preempted": "RECOVERING", "recovering": "RECOVERING"}


def _notice(job: str, bucket: str, status: JobStatus, e: Event, kind: str | None = None) -> Notice:
    kind = kind or KINDS[e.event]
    if e.event == "failed" and status.phase == Phase.FAILED:
        kind = "failed"
    key = names.status_key(job)
    return Notice(
        id=event_id(job, status, e),
        job=job, event=kind, severity=SEVERITY.get(kind, "info"), attempt=e.attempt, zone=e.zone or status.zone,
        cause=e.detail or e.event, phase=_PHASE.get(kind, str(status.phase)), at=e.at, instance=e.instance,
        status=f"gs://{bucket}/{key}",
        link=f"https://console.cloud.google.com/storage/browser/_details/{quote(bucket)}/{quote(key)}",
    )


def _budget(job: str, bucket: str, before: JobStatus, after: JobStatus, spec: JobSpec) -> list[Notice]:
    """A warning when restarts or failures first reach 80% of the policy's budget."""
    out = []
    for counter, limit_name in (("restarts", "max_restarts"), ("failures", "max_failures")):
        limit = getattr(spec.policy, limit_name)
        mark = max(1, math.ceil(BUDGET_SHARE * limit))
        was, now = getattr(before, counter), getattr(after, counter)
        if limit and was < mark <= now and after.history:
            e = Event(at=after.history[-1].at, event=f"budget-{counter}-{limit}", attempt=after.attempt, zone=after.zone,
                      detail=f"{counter} {now} of {limit_name} {limit}: the job fails when it is spent")
            out.append(_notice(job, bucket, after, e, kind="budget"))
    return out
