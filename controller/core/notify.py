"""Job notifications: what one status commit tells the world, as JSON events.

Pure: ``notices`` reads the events a commit adds (``JobStatus.added_to``) and the counters
it moved; the executor hands them to its pass's sends (``controller.service.notifier``), once
the job's chain is done, only after its compare-and-swap of that commit succeeded, so a transition goes out once however many passes raced to
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
# A change of the job's provisioning model within a run (a step down the spec's list, a step back
# up, a respec): what the user pays changes, so it is told, with both models and their prices.
MODEL_CHANGE = "provisioning"
_MOVED_BY = ("step-down", "launch", "respec", "adopted")  # the events that change the model, first found wins
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
    # The attempt's provisioning model (spot, standard, flex-start) and what the whole attempt (all
    # its nodes) costs per hour on it, in US dollars, as the job's ledger prices it (policy.prices,
    # capacityHistory, else respawn's table: controller/core/prices.py); None where not known.
    model: str | None = None
    price_per_hour: float | None = None
    # A "provisioning" notice: the model the job left, and its price.
    previous_model: str | None = None
    previous_price_per_hour: float | None = None

    def data(self) -> bytes:
        return self.model_dump_json().encode()

    def attributes(self) -> dict[str, str]:
        """Pub/Sub attributes, for subscription filters (``attributes.event = "failed"``)."""
        return {"job": self.job, "event": self.event, "attempt": str(self.attempt), "severity": self.severity}

    def text(self) -> str:
        """One line for a chat; ``&``, ``<`` and ``>`` escaped as Slack requires, so text a VM wrote
        (an exit record's reason) cannot ping a channel or disguise a link."""
        where = f" in {self.zone}" if self.zone else ""
        what = self.event
        if self.event == MODEL_CHANGE:
            what = (f"moved from {_priced(self.previous_model, self.previous_price_per_hour)} "
                    f"to {_priced(self.model, self.price_per_hour)}")
        line = f"respawn: job {self.job} {what} (attempt {self.attempt}{where}): {self.cause}"
        return line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    def webhook_body(self) -> dict[str, object]:
        """Slack's incoming-webhook shape (``text``), with the event itself beside it."""
        return {"text": self.text(), "respawn": json.loads(self.model_dump_json())}


def notices(job: str, bucket: str, before: JobStatus | None, after: JobStatus, spec: JobSpec | None) -> list[Notice]:
    """The notices of the commit that turned ``before`` into ``after``."""
    added = after.added_to(before)
    out = [_notice(job, bucket, after, e) for e in added if e.event in KINDS]
    if before is not None and after.same_run(before):
        out += _model_change(job, bucket, before, after, added, spec)
        if spec is not None:
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
    model, price = _paid(status, e.attempt)
    return Notice(
        id=event_id(job, status, e),
        job=job, event=kind, severity=SEVERITY.get(kind, "info"), attempt=e.attempt, zone=e.zone or status.zone,
        cause=e.detail or e.event, phase=_PHASE.get(kind, str(status.phase)), at=e.at, instance=e.instance,
        status=f"gs://{bucket}/{key}",
        link=f"https://console.cloud.google.com/storage/browser/_details/{quote(bucket)}/{quote(key)}",
        model=model, price_per_hour=price,
    )


def _paid(status: JobStatus, attempt: int, model: str | None = None) -> tuple[str | None, float | None]:
    """An attempt's model and its price per hour, from the ledger's span of it (the newest, and
    on ``model`` where given); the status's model for its current attempt where no span has it."""
    span = next((s for s in reversed(status.ledger.spans)
                 if s.attempt == attempt and (model is None or s.model == model)), None)
    if span is None or span.model is None:
        return (model or (status.provisioning if attempt == status.attempt else None)), None
    return span.model, (round(span.per_hour, 4) if span.per_hour > 0 else None)


def _model_change(job: str, bucket: str, before: JobStatus, after: JobStatus, added: tuple[Event, ...],
                  spec: JobSpec | None) -> list[Notice]:
    """A notice when the commit moved the job to another provisioning model: down the spec's list
    (``step-down``: Spot stocked out, on-demand from now), back up (``fallback.step_up_after``),
    or elsewhere (a new spec), naming both models and what each costs an hour."""
    was, now = before.provisioning, after.provisioning
    if not was or not now or was == now:
        return []
    e = next((x for name in _MOVED_BY for x in added if x.event == name), added[-1] if added else None)
    if e is None:
        return []
    old_price = _paid(before, before.attempt, was)[1]
    new_price = _paid(after, after.attempt, now)[1]
    order = spec.provisioning if spec is not None else ()
    down = e.event == "step-down" or (was in order and now in order and order.index(now) > order.index(was))
    pricier = new_price > old_price if new_price is not None and old_price is not None else down
    told = _notice(job, bucket, after, e.model_copy(update={"event": MODEL_CHANGE, "attempt": after.attempt}),
                   kind=MODEL_CHANGE)
    return [told.model_copy(update={"severity": "warning" if pricier else "info", "model": now,
                                    "price_per_hour": new_price, "previous_model": was,
                                    "previous_price_per_hour": old_price})]


def _priced(model: str | None, price: float | None) -> str:
    return f"{model or 'an unknown model'}" + (f" (${price:.2f}/h)" if price is not None else "")


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
