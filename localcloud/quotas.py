"""Compute's ``regions.get``, answered by the local server: a Region with its ``quotas[]``.

GPU quotas only (the metrics of ``controller.core.quotas``, the one table of them, with
their ``PREEMPTIBLE_`` twins), each ``DEFAULT_LIMIT`` unless a test set one
(``ComputeServer.quota_limit``). ``usage`` counts the GPUs of the region's live VMs as
Compute does: a Spot or Flex-start VM's against the preemptible metric, a standard VM's
against the standard one; a machine type's built-in GPUs and attached ``guestAccelerators``
alike. A region under the ``quota`` fault lists every GPU limit as 0, as the refusal it
answers inserts with says ("Limit: 0.0 in region ...").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from controller.core.quotas import GPU_METRICS, PREEMPTIBLE, metric
from controller.core.spec import built_in_gpus

DEFAULT_LIMIT = 64.0
_LIVE = ("PROVISIONING", "STAGING", "RUNNING", "PENDING", "STOPPING", "SUSPENDING", "REPAIRING")


def every_metric() -> list[str]:
    return sorted({*GPU_METRICS.values(), *(PREEMPTIBLE + m for m in GPU_METRICS.values())})


def gpus_of(resource: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(GPU type, count) of one instance resource: built into its machine type, or attached."""
    machine_type = str(resource.get("machineType", "")).rsplit("/", 1)[-1]
    if built := built_in_gpus(machine_type):
        return [built]
    return [(str(a.get("acceleratorType", "")).rsplit("/", 1)[-1], int(a.get("acceleratorCount") or 0))
            for a in resource.get("guestAccelerators") or []]


def quotas(resources: Iterable[Mapping[str, Any]], limits: Mapping[str, float], exhausted: bool) -> list[dict[str, Any]]:
    """``Region.quotas[]`` for a region whose live instances are ``resources``."""
    used: dict[str, float] = {}
    for r in resources:
        if r.get("status") not in _LIVE:
            continue
        scheduling = r.get("scheduling") or {}
        model = {"SPOT": "spot", "FLEX_START": "flex-start"}.get(
            scheduling.get("provisioningModel") or ("SPOT" if scheduling.get("preemptible") else ""), "standard")
        for gpu, count in gpus_of(r):
            if name := metric(gpu, model):
                used[name] = used.get(name, 0.0) + count
    return [{"metric": m, "limit": 0.0 if exhausted else float(limits.get(m, DEFAULT_LIMIT)),
             "usage": used.get(m, 0.0)} for m in every_metric()]
