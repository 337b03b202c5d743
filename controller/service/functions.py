"""What the two Cloud Functions do, kept out of ``main.py`` so it stays entry points only.

Contract with the platform (functions-framework): raising means "retry me". So a
transient failure raises; a terminal one (bad configuration, an event outside the
bucket contract) is logged and absorbed, since a retry could not fix it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from controller.service import bootstrap, lastpass
from controller.core import errors, names

log = logging.getLogger(__name__)
# Objects whose arrival can change a decision. The controller's own status writes and
# the VMs' heartbeats are left to the tick: reacting to them would only add passes.
_EVENT_KINDS = {"spec", "cancel", "exit", "marker"}


def tick() -> tuple[dict[str, Any], int]:
    """Reconcile every job; the JSON summary is the HTTP response."""
    try:
        engine = bootstrap.engine()
        at, started = engine.clock.now(), time.monotonic()
        summary = engine.reconcile()
    except errors.ConfigError as e:
        log.error("controller misconfigured: %s", e)
        return {"error": str(e)}, 500
    result = summary.as_dict()
    # respawn/controller.json: when the controller last ran (respawn doctor, respawn status); never fails the tick
    lastpass.write(engine.executor.store, engine.executor.bucket,
                   lastpass.of_summary(result, at, time.monotonic() - started))
    if summary.transient:
        raise errors.TransientError(f"transient errors for {summary.transient}: {summary.errors}")
    return result, 200


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
