"""fanout.each: the pass's threads, kept for the process."""

from __future__ import annotations

import os
import signal
import threading
import time

from controller.service import fanout


def test_results_come_in_the_items_order_whatever_order_the_work_ends_in():
    assert fanout.each(range(20), lambda i: (time.sleep((20 - i) / 2000), i)[1], 8) == list(range(20))


def test_a_pass_fanning_out_again_and_again_starts_its_threads_once():
    """Each chunk of a pass fans out three times: a pool started and joined each time cost about
    2 CPU-s a 10,000-job tick at a third of a vCPU."""
    names: set[str] = set()

    def work(i: int) -> int:
        names.add(threading.current_thread().name)
        time.sleep(0.001)
        return i

    fanout.each(range(32), work, 4, shared=True)
    first = set(names)
    for _ in range(20):
        fanout.each(range(32), work, 4, shared=True)
    assert names == first and len(first) <= 4


def test_work_that_fans_out_again_from_every_shared_thread_at_once_finishes():
    """Every thread of the shared pool waiting on work of its own: that work must not queue behind them."""
    barrier = threading.Barrier(4, timeout=10)

    def outer(i: int) -> int:
        barrier.wait()  # all four shared threads are busy here at once
        return sum(fanout.each(range(3), lambda j: j + i, 4, shared=True))

    assert fanout.each(range(4), outer, 4, shared=True) == [3, 6, 9, 12]


def test_a_process_forked_after_a_pass_fans_out_on_threads_of_its_own():
    """A fork's copy of the parent's pool counts threads the child does not have: its tasks never ran
    (bench/shards.py's forked shards waited forever)."""
    for _ in range(3):
        fanout.each(range(64), lambda i: time.sleep(0.001) or i, 16, shared=True)
    time.sleep(0.3)  # the parent's threads idle
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            signal.alarm(10)  # a child waiting on threads it does not have would wait forever
            code = 0 if fanout.each(range(64), lambda i: i * 2, 16, shared=True) == [i * 2 for i in range(64)] else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_thread_started_by_shared_work_that_fans_out_does_not_wait_on_the_busy_shared_threads():
    """A TPU listing on a background thread a job's replan started fanned out at the width of the
    pass's own (8 and 8): on the shared pool it waited for threads busy waiting for it."""
    barrier = threading.Barrier(4, timeout=10)

    def job(i: int) -> int:
        barrier.wait()  # every shared thread busy at once
        found: list[int] = []
        helper = threading.Thread(target=lambda: found.extend(fanout.each(range(3), lambda j: j, 4)))
        helper.start()
        helper.join(timeout=5)
        return len(found)

    assert fanout.each(range(4), job, 4, shared=True) == [3, 3, 3, 3]
