"""What the three Cloud Functions do, kept out of ``main.py`` so it stays entry points only.

Contract with the platform (functions-framework): raising means "retry me". So a
transient failure raises; a terminal one (bad configuration, an event outside the
bucket contract) is logged and absorbed, since a retry could not fix it.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from datetime import timedelta
from typing import Any

from controller.service import bootstrap, lastpass, shards
from controller.core import audit, errors, fleet, names
from controller.core.state import Phase

log = logging.getLogger(__name__)
# Objects whose arrival can change a decision. The controller's own status writes and
# the VMs' heartbeats are left to the tick: reacting to them would only add passes. A notice
# launches the standby at once; a ready record (a standby at its starting line, re-written while
# it waits) asks whether its go is due.
_EVENT_KINDS = {"spec", "cancel", "exit", "marker", "notice", "ready"}


def tick() -> tuple[dict[str, Any], int]:
    """Reconcile every job; the JSON summary is the HTTP response (one that finds another pass
    over every job holding the lease does nothing, and says until when)."""
    try:
        engine = bootstrap.engine()
        at, started = engine.clock.now(), time.monotonic()
        config = bootstrap.settings()
        if config.shards > 1:
            result = _fan_out(engine, config)
            # respawn/controller.json: the controller ran (respawn doctor, respawn status); the actions
            # and the refused notices are the shards' passes', not in it.
            lastpass.write(engine.executor.store, engine.executor.bucket,
                           lastpass.LastPass(at, time.monotonic() - started, result["jobs"], 0, 0))
            return result, 200
        summary = engine.reconcile()
    except errors.ConfigError as e:
        log.error("controller misconfigured: %s", e)
        return {"error": str(e)}, 500
    result = summary.as_dict()
    if summary.skipped:
        # Another pass over every job holds the lease: this tick did nothing, which is no failure
        # (200: Cloud Scheduler must not count it as one); that pass writes respawn/controller.json.
        return result, 200
    if summary.figures is not None:
        log_figures(summary.figures, engine.executor.bucket)
    # respawn/controller.json: when the controller last ran (respawn doctor, respawn status); never fails the tick
    lastpass.write(engine.executor.store, engine.executor.bucket,
                   lastpass.of_summary(result, at, time.monotonic() - started))
    if summary.transient:
        raise errors.TransientError(f"transient errors for {summary.transient}: {summary.errors}")
    return result, 200


def _fan_out(engine: Any, config: Any) -> dict[str, Any]:
    """K > 1: the tick lists the bucket and publishes each shard its part (controller.service.shards);
    the shards' passes reconcile, each under its own lease. A publish that failed raises (retry me)."""
    topic = shards.topic_path(config.project, config.shard_topic)
    result = shards.publish(engine, bootstrap.publisher(), topic, config.shards, engine.clock.now())
    log.info("published %d shard messages", result["published"], extra={"json_fields": result})
    return result


def on_shard(data: dict[str, Any]) -> dict[str, Any] | None:
    """Reconcile one shard of the fleet (a message the tick published on the shards' topic).

    Raises only when the pass could not begin for a trouble a retry may see through (the listing
    object's read); a job's transient error is the next tick's (a redelivered message would carry
    this tick's listing, and the next tick's message comes within a minute)."""
    message = data.get("message") if isinstance(data.get("message"), dict) else {}
    try:
        raw = base64.b64decode(str(message.get("data", "")), validate=True)
    except (binascii.Error, ValueError) as e:
        log.warning("shard message ignored: its data is not base64: %s", e)
        return None
    try:
        engine = bootstrap.engine()
        config = bootstrap.settings()
        summary = shards.handle(engine, raw, config.bucket, config.shards)
    except errors.ConfigError as e:
        log.error("controller misconfigured: %s", e)
        return None
    if summary is None:
        return None
    result = summary.as_dict()
    if summary.figures is not None:
        log_figures(summary.figures, engine.executor.bucket)
    if summary.transient or summary.errors:
        log.warning("shard pass: errors left to the next tick", extra={"json_fields": {"errors": summary.errors}})
    log.info("shard pass done", extra={"json_fields": {k: v for k, v in result.items() if k != "actions"}})
    return result


def log_figures(figures: fleet.Figures, bucket: str) -> None:
    """The tick's figures entries (controller.core.fleet): one with every figure of the fleet, and one
    per phase; each names the bucket, so that two controllers in one project chart apart."""
    entry = fleet.fleet_entry(figures)
    log.info("fleet: %d jobs, %g accelerators running, $%.2f spent ($%.2f on demand)", entry["jobs"],
             figures.accelerators_running, figures.cost, figures.on_demand_cost,
             extra={"json_fields": {**entry, "bucket": bucket}})
    for phase in fleet.phase_entries(figures):
        log.info("jobs %s: %d", phase["phase"], phase["jobs"], extra={"json_fields": {**phase, "bucket": bucket}})


def on_object(data: dict[str, Any]) -> dict[str, Any] | None:
    """Reconcile the one job a finalized object belongs to; ignore everything else."""
    name, bucket = str(data.get("name", "")), str(data.get("bucket", ""))
    ref = names.parse_object_name(name)
    where = {"object": name, "bucket": bucket, "generation": data.get("generation")}
    if ref is None or ref.kind not in _EVENT_KINDS:
        log.debug("ignored object outside the contract", extra={"json_fields": where})
        return None
    try:
        engine = bootstrap.engine()
        if bucket != bootstrap.settings().bucket:
            log.warning("event from another bucket ignored", extra={"json_fields": where})
            return None
        summary = engine.reconcile(ref.job)
    except errors.ConfigError as e:
        log.error("controller misconfigured: %s", e, extra={"json_fields": where})
        return None
    if summary.transient:
        raise errors.TransientError(f"transient errors for {ref.job}: {summary.errors}")
    log.info("event handled", extra={"json_fields": {**where, "job": ref.job, **summary.as_dict()}})
    return summary.as_dict()


def on_audit(data: dict[str, Any]) -> dict[str, Any] | None:
    """Reconcile the job whose VM a System Event audit entry names (a Pub/Sub message from the
    Logging sink); ignore everything else.

    The entry only wakes a pass: why the VM went is read from Compute's own records, never taken
    from the entry (a trainer that may write logs can write under the audit log's name too, and a
    forged "preempted" would excuse its own crash from the failure budget). The pass judges the job
    as it finds it, once, and returns: the function never waits in its instance for a VM to go
    down. A VM being preempted gets its standby at once (controller.core.handover); the go follows
    on the events its save and its standby make (the marker, the ready record) or the next tick.
    The one wait left is a crash's: a failure restarts after the spec's backoff, and one whose
    restart is due within ``AUDIT_DUE_WAIT`` is waited out and made by this call (nothing else
    fires when a backoff ends; the tick would make it up to a minute later).
    An entry for an attempt already replaced, a duplicate, a late one, finds nothing to do; a lost
    one costs the tick's time.

    Pub/Sub redelivers a message whose function raised, for days: it raises only for a trouble a
    retry may see through (a TransientError of that job's), and never for an entry older than
    ``AUDIT_MAX_AGE`` (the ticks have judged its VM since). A TPU VM's worker names no node: its
    worker 0's entry is a pass over every job, at most one per ``TPU_PASS_GAP`` in a function
    instance (a slice's or a project's burst of entries is one pass; the tick is the safety net)."""
    try:
        event = audit.parse_entry(audit.decode_message(data))
    except audit.AuditError as e:
        log.warning("audit message ignored: %s", e)
        return None
    where = {"instance": event.instance, "zone": event.zone, "project": event.project, "method": event.method,
             "at": event.at.isoformat(), "insert_id": event.insert_id}
    job = event.job
    if job is None and not event.tpu_worker:
        log.debug("audit entry of an instance that is not respawn's", extra={"json_fields": where})
        return None
    if event.tpu_worker_index:
        # A slice's event reaches each of its workers: worker 0's entry looks at every job once
        # (not once per host); one host's own event alone is the tick's, as the node's state says.
        log.debug("audit entry of a TPU worker other than 0", extra={"json_fields": where})
        return None
    try:
        engine = bootstrap.engine()
        if event.project not in engine.observer.policy.watched_projects:
            log.info("audit entry from a project the controller does not watch", extra={"json_fields": where})
            return None
        if job is None and not engine.wide_pass_due(TPU_PASS_GAP):
            log.info("audit entry of a TPU worker: a pass over every job ran moments ago", extra={"json_fields": where})
            return None
        if job is None and (config := bootstrap.settings()).shards > 1:
            # With shards no instance passes over every job: the entry fans out as a tick does.
            return _fan_out(engine, config)
        # Dated ahead of this clock by more than its skew, an entry is none of Compute's (a trainer may
        # write under the log's name, and LogEntry.timestamp may be up to 24 hours ahead, its reference
        # says): never retried.
        age = engine.clock.now() - event.at
        old = age > AUDIT_MAX_AGE or age < -AUDIT_SKEW
        summary = engine.reconcile(job)
        if job and not summary.transient and (left := _restart_due(summary, job, engine.clock.now())) is not None:
            engine.clock.sleep(left)
            summary = engine.reconcile(job)
    except errors.ConfigError as e:
        log.error("controller misconfigured: %s", e, extra={"json_fields": where})
        return None
    except errors.RespawnError as e:  # the pass could not begin (the bucket's listing failed)
        if isinstance(e, errors.TransientError) and job and not old:
            raise
        log.warning("audit event: the pass failed, left to the tick: %s", e, extra={"json_fields": where})
        return None
    if summary.transient and job and not old:
        raise errors.TransientError(f"transient errors for {job}: {summary.errors}")
    if summary.transient or summary.errors:
        # Left to the tick: a permanent error (a 403) would fail every redelivery the same way,
        # and a pass over every job retried for one job's trouble would be every job's cost.
        log.warning("audit event: errors left to the tick", extra={"json_fields": {**where, "errors": summary.errors}})
    log.info("audit event handled", extra={"json_fields": {**where, "job": job, **summary.as_dict()}})
    return summary.as_dict()


def _restart_due(summary: Any, job: str, now: Any) -> float | None:
    """Seconds until the job's restart after a failure's backoff, when it is due within
    ``AUDIT_DUE_WAIT`` (the pass just committed it RECOVERING, backing off); None otherwise."""
    st = summary.committed.get(job)
    if st is None or st.phase != Phase.RECOVERING or st.not_before is None:
        return None
    left = (st.not_before - now).total_seconds()
    return left + AUDIT_DUE_SLACK if 0 < left <= AUDIT_DUE_WAIT else None


# A crash's restart due within this long is waited out by on_audit's call (a longer backoff is the tick's).
AUDIT_DUE_WAIT = 45.0
AUDIT_DUE_SLACK = 0.5  # past the due time, so that the pass after the sleep finds it due
# An audit message older than this is never retried (the ticks have judged its VM since).
AUDIT_MAX_AGE = timedelta(minutes=30)
AUDIT_SKEW = timedelta(minutes=5)  # how far ahead of the controller's clock Compute's own timestamps may be
# At most one pass over every job per this long for TPU workers' entries, in one function instance.
TPU_PASS_GAP = 30.0
