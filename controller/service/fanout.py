"""Bounded concurrency for per-job work: the Google clients block, so a pass uses threads.

Each job's work is independent of every other job's (its own objects, its own VMs, its
own compare-and-swap), which is what makes running them side by side the same as running
them one after another: two passes over one job were always allowed to race, and lose
only a compare-and-swap. ``workers=1`` runs inline, in order (the simulator relies on it).

A pass over every job fans out three times a chunk from its own thread (``shared``): those
fan-outs share threads kept for the process (one pool per width), since starting and joining a
pool's threads each time cost about 2 CPU-s a 10,000-job tick at a third of a vCPU. Every other
fan-out gets a pool of its own, as before: work running on a shared thread, or on a thread such
work started, that waited on the shared pool could wait for its own thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

In = TypeVar("In")
Out = TypeVar("Out")

_pools: dict[tuple[int, int], ThreadPoolExecutor] = {}  # by (process, width)
_lock = threading.Lock()
_here = threading.local()  # ``shared`` on the shared pools' own threads


def each(items: Iterable[In], work: Callable[[In], Out], workers: int, *, shared: bool = False) -> list[Out]:
    """``[work(i) for i in items]``, on up to ``workers`` threads; results in the items' order.

    ``work`` must not raise: per-job isolation is the caller's (an exception would end the
    pass for every job still queued). ``shared``: on the process's kept threads; only for a
    caller that is no fan-out's work itself (a pass over every job, from its own thread).
    """
    batch = list(items)
    if workers <= 1 or len(batch) <= 1:
        return [work(i) for i in batch]
    if not shared or getattr(_here, "shared", False):
        with ThreadPoolExecutor(max_workers=min(workers, len(batch)), thread_name_prefix="respawn") as pool:
            return list(pool.map(work, batch))
    return list(_pool(workers).map(work, batch))


def _pool(workers: int) -> ThreadPoolExecutor:
    # A forked child's copy of its parent's pool counts the parent's idle threads, which the child
    # does not have: a task given to it would never run (bench/shards.py forks its shards).
    key = (os.getpid(), workers)
    with _lock:
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="respawn",
                                                    initializer=_mark)
        return pool


def _mark() -> None:
    _here.shared = True
