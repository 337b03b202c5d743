"""What an attempt costs per hour, Spot against on-demand, for the goodput ledger.

A small table of list prices per accelerator-hour (GPUs, with the share of the host a
built-in GPU machine type carries; TPU chips) and per vCPU-hour for machine types without
one. Prices change and differ by region: a job's ``policy.prices`` overrides the table with
its own node-hour prices, and Compute's ``advice.capacityHistory`` ``priceHistory`` (the Spot
list price of the attempt's machine type in its zone, where the advice was asked) wins over
the table for Spot, for the shape it was asked about only (``shape``). Every rate says which
of the three it came from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# US dollars per accelerator-hour, (Spot, on-demand), us-central1.
SOURCE = ("respawn's price table: Google Cloud list prices for us-central1 (cloud.google.com/compute/gpus-pricing, "
          "/compute/vm-instance-pricing, /tpu/pricing) as of 2025-06; approximate, override with policy.prices")
GPU_HOUR: dict[str, tuple[float, float]] = {
    "nvidia-tesla-t4": (0.14, 0.35),
    "nvidia-tesla-p4": (0.24, 0.60),
    "nvidia-tesla-p100": (0.58, 1.46),
    "nvidia-tesla-v100": (0.99, 2.48),
    "nvidia-l4": (0.22, 0.71),  # g2-standard-4's price: the GPU and its share of the host
    "nvidia-tesla-a100": (1.47, 3.67),  # a2-highgpu-1g, per GPU with its host
    "nvidia-a100-80gb": (2.03, 5.07),  # a2-ultragpu-1g, per GPU with its host
    "nvidia-h100-80gb": (3.50, 11.06),  # a3-highgpu-8g / 8
    "nvidia-h100-mega-80gb": (3.70, 11.69),  # a3-megagpu-8g / 8
    "nvidia-h200-141gb": (3.72, 10.85),  # a3-ultragpu-8g / 8
}
# Per chip-hour; a type's number counts TensorCores up to v4 (two per chip) and chips from v5e on.
TPU_CHIP_HOUR: dict[str, tuple[float, float]] = {
    "v2": (0.34, 1.13),
    "v3": (0.60, 2.00),
    "v4": (0.97, 3.22),
    "v5litepod": (0.48, 1.20),
    "v5p": (1.68, 4.20),
    "v6e": (0.95, 2.70),
}
_CORES_PER_CHIP = {"v2": 2, "v3": 2, "v4": 2, "v5p": 2}
UNKNOWN = "no price known for this machine (set policy.prices)"
VCPU_HOUR = (0.010, 0.0475)  # N1/N2/E2-class vCPU with its memory, for machine types without an accelerator
_VCPUS = re.compile(r"-(\d{1,3})(?:-|$)")


@dataclass(frozen=True)
class Rate:
    """An attempt's accelerators and what it costs per hour, on its model and on demand."""

    accelerators: float  # GPUs, or TPU chips (0: a CPU-only machine)
    per_hour: float
    on_demand_per_hour: float
    source: str


def shape(*, machine_type: str | None = None, gpus: tuple[str, int] | None = None,
          tpu_type: str | None = None) -> str:
    """What one node of an attempt is, as a price is for: ``a3-highgpu-8g+8xnvidia-h100-80gb``,
    ``g2-standard-8+1xnvidia-l4``, ``n2-standard-8``, ``tpu:v4-32``. A Spot price capacity
    advice gave for one shape is never used for another."""
    if tpu_type is not None:
        return f"tpu:{tpu_type}"
    return f"{machine_type or '?'}" + (f"+{gpus[1]}x{gpus[0]}" if gpus else "")


def tpu_chips(tpu_type: str) -> int:
    """Chips of a TPU slice: ``v4-32`` has 16 (32 TensorCores), ``v5litepod-8`` has 8."""
    generation, _, size = tpu_type.rpartition("-")
    return max(1, int(size) // _CORES_PER_CHIP.get(generation, 1))


def rate(*, model: str, nodes: int, gpus: tuple[str, int] | None = None, machine_type: str | None = None,
         tpu_type: str | None = None, override: dict[str, float] | None = None,
         spot_price: float | None = None) -> Rate:
    """The hourly rate of one attempt: ``nodes`` VMs (or one TPU node) on ``model``.

    ``override``: the job's ``policy.prices``, dollars per node-hour by model; ``spot_price``:
    capacityHistory's Spot list price for the machine type, per VM-hour."""
    if tpu_type is not None:
        accelerators = float(tpu_chips(tpu_type))
        spot, on_demand = TPU_CHIP_HOUR.get(tpu_type.rpartition("-")[0], (0.0, 0.0))
    elif gpus is not None:
        accelerators = float(nodes * gpus[1])
        spot, on_demand = GPU_HOUR.get(gpus[0], (0.0, 0.0))
    else:
        accelerators = 0.0
        found = _VCPUS.search(machine_type or "")
        vcpus = int(found.group(1)) if found else 1
        spot, on_demand = VCPU_HOUR[0] * vcpus * nodes, VCPU_HOUR[1] * vcpus * nodes
    scale = accelerators or 1.0
    table = (spot * scale, on_demand * scale) if accelerators else (spot, on_demand)
    known = table != (0.0, 0.0)
    source = SOURCE if known else UNKNOWN
    paid = table[0] if model == "spot" else table[1]  # flex-start is priced as on-demand: the table has none
    on_demand_paid = table[1]
    override = override or {}
    if "standard" in override:
        on_demand_paid = override["standard"] * nodes
    if model in override:
        return Rate(accelerators, override[model] * nodes, on_demand_paid, "policy.prices")
    if model == "spot" and spot_price is not None:
        return Rate(accelerators, spot_price * nodes, on_demand_paid, "capacityHistory priceHistory")
    return Rate(accelerators, paid, on_demand_paid, source)
