"""Which process of a distributed run this is, and how its ranks agree, without importing torch.

A save in a multi-process run is collective (Lightning's ``save_checkpoint`` has a barrier,
HuggingFace's an all-gather, a DCP save is one over every rank): every rank must decide the
same way at the same step, or some wait forever for the others. The kit's decision is made
on global rank zero and broadcast (``torch_broadcast``, or the framework's own broadcast).
A save every rank writes part of (DCP's) is complete only once every part landed: the ranks
tell each other which did with ``torch_all_gather``, at the same points.
"""

from __future__ import annotations

import sys
from typing import Any

from respawnkit import env


def _torch_dist() -> Any:
    """torch.distributed when torch is already imported and a process group is up, else None."""
    if "torch" not in sys.modules:
        return None
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


def global_rank() -> int:
    """torch.distributed's rank when a group is up, else ``RANK``, else ``LOCAL_RANK``, else 0."""
    dist = _torch_dist()
    if dist is not None:
        return int(dist.get_rank())
    for name in ("RANK", "LOCAL_RANK"):
        value = env.integer(name)
        if value is not None:
            return value
    return 0


def torch_broadcast(value: Any) -> Any:
    """Rank zero's ``value`` on every rank (``torch.distributed.broadcast_object_list``); ``value`` itself
    where no process group is up."""
    dist = _torch_dist()
    if dist is None or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def world_size() -> int:
    """How many ranks torch.distributed's default group has; 1 when none is up."""
    dist = _torch_dist()
    return 1 if dist is None else int(dist.get_world_size())


def torch_all_gather(value: Any, group: Any = None) -> list[Any]:
    """Every rank's ``value``, in rank order, on every rank (``torch.distributed.all_gather_object`` over ``group``,
    the default one when None); ``[value]`` where no process group is up."""
    dist = _torch_dist()
    if dist is None or dist.get_world_size(group) == 1:
        return [value]
    values: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(values, value, group=group)
    return values
