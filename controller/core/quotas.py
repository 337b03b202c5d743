"""Compute Engine's regional GPU quotas: which metric a job's GPUs count against, and what is left.

The one table of quota metric names in respawn (``respawn submit``'s estimate, ``respawn
doctor``, and the local Compute server's ``regions.get`` all read it). Names are those
``regions.get`` returns in ``Region.quotas[].metric`` (the ``Quota.metric`` enum of the
Compute v1 discovery document, plus the newer GPUs it does not list yet).

Which quota a VM's GPUs use (cloud.google.com/compute/resource-usage, "Preemptible quotas";
"About Flex-start VMs"): standard VMs the ``NVIDIA_*_GPUS`` metric; Spot (and preemptible)
and Flex-start VMs the ``PREEMPTIBLE_NVIDIA_*_GPUS`` metric where the region lists one, and
the standard metric where it does not.

Cloud TPU nodes count against the Cloud TPU API's own per-zone quotas (tpu.googleapis.com),
which ``regions.get`` does not return: a TPU job has no Compute quota to show here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# GPU accelerator type (as a spec names it) -> Compute's standard quota metric.
GPU_METRICS: dict[str, str] = {
    "nvidia-tesla-t4": "NVIDIA_T4_GPUS",
    "nvidia-tesla-p4": "NVIDIA_P4_GPUS",
    "nvidia-tesla-p100": "NVIDIA_P100_GPUS",
    "nvidia-tesla-v100": "NVIDIA_V100_GPUS",
    "nvidia-tesla-k80": "NVIDIA_K80_GPUS",
    "nvidia-l4": "NVIDIA_L4_GPUS",
    "nvidia-tesla-a100": "NVIDIA_A100_GPUS",
    "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
    "nvidia-h100-80gb": "NVIDIA_H100_GPUS",
    "nvidia-h100-mega-80gb": "NVIDIA_H100_MEGA_GPUS",
    "nvidia-h200-141gb": "NVIDIA_H200_GPUS",
}
PREEMPTIBLE = "PREEMPTIBLE_"
_PREEMPTIBLE_MODELS = ("spot", "flex-start")


@dataclass(frozen=True)
class QuotaUse:
    """One ``Region.quotas[]`` entry: the limit and what is in use now."""

    limit: float
    usage: float

    @property
    def left(self) -> float:
        return max(0.0, self.limit - self.usage)


@dataclass(frozen=True)
class QuotaLeft:
    """What a job's GPUs would meet in one region: the metric, what is left of it, what the job needs."""

    metric: str
    left: float
    limit: float
    needed: int

    @property
    def enough(self) -> bool:
        return self.left >= self.needed


def metric(gpu_type: str, model: str, listed: Mapping[str, QuotaUse] | None = None) -> str | None:
    """The quota ``gpu_type`` GPUs on ``model`` count against; None for a GPU this table does not know.

    ``listed``: the region's quotas, when known: a Spot or Flex-start VM uses the preemptible
    metric only where the region lists it."""
    standard = GPU_METRICS.get(gpu_type)
    if standard is None:
        return None
    if model in _PREEMPTIBLE_MODELS and (listed is None or PREEMPTIBLE + standard in listed):
        return PREEMPTIBLE + standard
    return standard


def left_for(gpu_type: str, model: str, needed: int, listed: Mapping[str, QuotaUse]) -> QuotaLeft | None:
    """What is left for a job of ``needed`` ``gpu_type`` GPUs on ``model`` in a region whose quotas
    are ``listed``; None when the region lists no quota for that GPU (or the GPU is unknown)."""
    name = metric(gpu_type, model, listed)
    if name is None or name not in listed:
        return None
    use = listed[name]
    return QuotaLeft(name, use.left, use.limit, needed)
