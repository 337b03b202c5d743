"""TPU machine types in Compute Engine: what each host has, the slices it makes, where it is offered.

Since TPU7x (Ironwood) a TPU is a Compute Engine machine type ("Cloud TPU resources in Compute
Engine", docs.cloud.google.com/compute/docs/tpus/tpu-resources-in-compute-engine): a single-host
slice is one VM instance of that type; a multi-host slice is a managed instance group (MIG) of
``hosts`` such VMs whose workload policy names the slice's accelerator topology
("Create a MIG with multi-host TPU slice"). The Cloud TPU API gets bug fixes only and does not
serve TPU7x or later.

What is here is read from Google's pages on TPU machine types (tpu-machines: "each TPU7x VM has
four chips"; topology = the slice's chips as ``AxBxC``, hosts = chips / chips per host) and the
TPU regions page. The zones are those Google lists when this was written; Google adds zones,
so a refused zone names the list and ``respawn doctor`` asks Compute (``machineTypes.get``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class TpuMachine:
    """One TPU machine type: a host with ``chips`` TPU chips."""

    name: str  # tpu7x-standard-4t
    generation: str  # the name Google's prices and quotas use: tpu7x, v6e, v5p
    chips: int  # TPU chips on one host
    dims: int  # the topology's dimensions: 3 (a 3D torus: TPU7x, v5p) or 2 (v6e)
    # The slice shapes it makes, smallest first: the first is one host's own.
    topologies: tuple[str, ...]
    zones: tuple[str, ...]
    image_family: str  # the boot image Google publishes for it (project IMAGE_PROJECT)
    compute_only: bool = False  # not served by the Cloud TPU API at all (TPU7x and later)

    def hosts(self, topology: str | None) -> int:
        """VMs in a slice of ``topology`` (None: one host)."""
        return 1 if topology is None else chips_of(topology) // self.chips

    def accelerator(self, topology: str | None) -> str:
        """The slice as a Cloud TPU type would name it (``tpu7x-8``, ``v6e-16``, ``v5p-16``): chips,
        or TensorCores for v5p, as Google's TPU prices count them (``prices.tpu_chips``)."""
        chips = self.chips * self.hosts(topology)
        return f"{self.generation}-{chips * 2 if self.generation == 'v5p' else chips}"


IMAGE_PROJECT = "ubuntu-os-accelerator-images"
_3D = ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16")

MACHINES: dict[str, TpuMachine] = {m.name: m for m in (
    TpuMachine("tpu7x-standard-4t", "tpu7x", 4, 3, _3D, ("us-central1-c",),
               "ubuntu-accel-2404-amd64-tpu-tpu7x", compute_only=True),
    TpuMachine("ct6e-standard-1t", "v6e", 1, 2, ("1x1",), ("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b"),
               "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"),
    TpuMachine("ct6e-standard-4t", "v6e", 4, 2, ("2x2", "4x4", "4x8", "8x8", "8x16", "16x16"),
               ("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b"), "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"),
    TpuMachine("ct6e-standard-8t", "v6e", 8, 2, ("2x4",), ("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b"),
               "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"),
    TpuMachine("ct5p-hightpu-4t", "v5p", 4, 3, _3D, ("us-central1-a", "us-east5-a"),
               "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"),
)}

# Generations only Compute Engine serves, by the prefix a Cloud TPU type would carry (tpu7x-8; its VMs'
# accelerator-type metadata writes v7x-16).
COMPUTE_ONLY = {m.generation: m.name for m in MACHINES.values() if m.compute_only} | {"v7x": "tpu7x-standard-4t"}
_TOPOLOGY = re.compile(r"[1-9][0-9]{0,2}(x[1-9][0-9]{0,2}){1,2}")


def chips_of(topology: str) -> int:
    """Chips in a slice of this shape: 2x2x2 has 8."""
    return math.prod(int(d) for d in topology.split("x"))


def topology_problem(machine: TpuMachine, topology: str) -> str | None:
    """Why ``topology`` is not a slice of ``machine`` hosts, or None."""
    if not _TOPOLOGY.fullmatch(topology) or topology.count("x") + 1 != machine.dims:
        return (f"not a {machine.dims}D topology such as {machine.topologies[1 if len(machine.topologies) > 1 else 0]}"
                " (the slice's chips along each axis)")
    if topology not in machine.topologies:
        return (f"{machine.name} makes slices of {', '.join(machine.topologies)}; "
                f"{topology} is not one of them")
    return None


def machine_of(name: str) -> TpuMachine | None:
    return MACHINES.get(name)


def is_tpu_machine(machine_type: str | None) -> bool:
    return machine_type is not None and machine_type in MACHINES
