"""Bounded concurrency for per-job work: the Google clients block, so a pass uses threads.

Each job's work is independent of every other job's (its own objects, its own VMs, its
own compare-and-swap), which is what makes running them side by side the same as running
them one after another: two passes over one job were always allowed to race, and lose
only a compare-and-swap. ``workers=1`` runs inline, in order (the simulator relies on it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

In = TypeVar("In")
Out = TypeVar("Out")


def each(items: Iterable[In], work: Callable[[In], Out], workers: int) -> list[Out]:
    """``[work(i) for i in items]``, on up to ``workers`` threads; results in the items' order.

    ``work`` must not raise: per-job isolation is the caller's (an exception would end the
    pass for every job still queued).
    """
    batch = list(items)
    if workers <= 1 or len(batch) <= 1:
        return [work(i) for i in batch]
    with ThreadPoolExecutor(max_workers=min(workers, len(batch)), thread_name_prefix="respawn") as pool:
        return list(pool.map(work, batch))
