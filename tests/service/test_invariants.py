"""The invariants of DESIGN.md, proven over the fakes under concurrency and crashes."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

import pytest

from controller.core import names
from controller.core.state import Phase
from tests.harness import BUCKET, Harness


class Jitter:
    """Proxy that sleeps a little before every call, so that threads interleave."""

    def __init__(self, target: Any, seed: int) -> None:
        self._target = target
        self._rng = random.Random(seed)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            time.sleep(self._rng.uniform(0, 0.002))
            return attr(*args, **kwargs)

        return call


class OneLiveAttempt:
    """Wraps the fake Compute and records any insert made while another attempt of the job lives."""

    def __init__(self, compute: Any) -> None:
        self._compute = compute
        self.violations: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._compute, name)

    def insert(self, requests: Any, request_id: str, wait: float | None = None) -> None:
        with self._compute._lock:  # the check and the insert are one step
            job = requests[0].labels[names.JOB_LABEL]
            attempt = requests[0].labels[names.ATTEMPT_LABEL]
            others = [i.name for i in self._compute.live(job) if i.labels[names.ATTEMPT_LABEL] != attempt]
            if others:
                self.violations.append(f"insert attempt {attempt} of {job} while {others} live")
            return self._compute.insert(requests, request_id, wait)


def run_concurrently(h: Harness, guard: OneLiveAttempt, jobs: list[str], passes: int = 20) -> None:
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            engine = h.engine(Jitter(h.store, i), Jitter(guard, 1000 + i))
            if i % 2:
                engine.reconcile()  # a tick
            else:
                engine.reconcile(jobs[i % len(jobs)])  # a (duplicated) event for one job
        except BaseException as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(passes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors


@pytest.mark.parametrize("workers", [1, 8])  # each pass also fans its jobs out over threads
@pytest.mark.parametrize("seed", range(3))
def test_twenty_concurrent_passes_and_duplicate_events_one_live_attempt(seed, workers):
    h = Harness(workers=workers)
    guard = OneLiveAttempt(h.compute)
    jobs = ["a", "b", "c"]
    for job in jobs:
        h.submit(job)
    run_concurrently(h, guard, jobs)  # creation races
    h.tick()
    for job in jobs:
        h.marker(job)  # every job preempted at once
    h.compute.preempt("a-1")
    run_concurrently(h, guard, jobs)  # recovery races
    h.tick()
    h.tick()
    assert guard.violations == []
    for job in jobs:
        st = h.status(job)
        assert h.live(job) == [f"{job}-2"], (job, h.live(job))
        assert (st.attempt, st.preemptions, st.phase) == (2, 1, Phase.RUNNING)
        assert not h.store.exists(BUCKET, names.marker_key(job))
    inserts = Counter(what for op, what in h.compute.calls if op == "insert")
    assert set(inserts) == {"a-1", "b-1", "c-1", "a-2", "b-2", "c-2"}


class Crash(BaseException):
    """Not an Exception: nothing in the controller may catch it, as with a killed process."""


class CrashAfter:
    """Lets ``budget`` mutating calls through (across store and compute), then crashes."""

    MUTATING = {"write", "delete", "insert"}

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.crashed = False

    def wrap(self, target: Any) -> Any:
        outer = self

        class Proxy:
            def __getattr__(self, name: str) -> Any:
                attr = getattr(target, name)
                if name not in outer.MUTATING:
                    return attr

                def call(*args: Any, **kwargs: Any) -> Any:
                    if outer.budget == 0:
                        outer.crashed = True
                        raise Crash(name)
                    outer.budget -= 1
                    return attr(*args, **kwargs)

                return call

        return Proxy()


def scenario_new_job(h: Harness) -> None:
    h.submit("llm")


def scenario_preemption(h: Harness) -> None:
    scenario_new_job(h)
    h.tick()
    h.tick()
    h.checkpoint(10)
    h.compute.preempt("llm-1")
    h.marker("llm")


def scenario_success(h: Harness) -> None:
    scenario_new_job(h)
    h.tick()
    h.tick()
    h.exit("llm", 0)


def scenario_failure(h: Harness) -> None:
    scenario_success(h)
    h.exit("llm", 3)


def scenario_stockout(h: Harness) -> None:
    h.compute.stockouts.add("us-central1-a")
    scenario_new_job(h)


EXPECT = {
    scenario_new_job: dict(phase=Phase.RUNNING, live=["llm-1"]),
    scenario_preemption: dict(phase=Phase.RUNNING, live=["llm-2"], preemptions=1),
    scenario_success: dict(phase=Phase.SUCCEEDED, live=[]),
    scenario_failure: dict(phase=Phase.RUNNING, live=["llm-2"], failures=1),
    scenario_stockout: dict(phase=Phase.RUNNING, live=["llm-1"]),
}


@pytest.mark.parametrize("scenario", list(EXPECT), ids=lambda f: f.__name__)
def test_crash_between_any_two_steps_converges(scenario):
    """Crash the pass before its 1st, 2nd, ... mutating call; a fresh pass must converge."""
    for budget in range(12):
        h = Harness()
        scenario(h)
        crash = CrashAfter(budget)
        engine = h.engine(crash.wrap(h.store), crash.wrap(h.compute))
        try:
            engine.reconcile()
        except Crash:
            pass
        for _ in range(3):
            h.advance(minutes=10)  # past any backoff
            h.tick()
        expect = EXPECT[scenario]
        st = h.status("llm")
        assert st.phase == expect["phase"], (budget, st.message)
        assert h.live("llm") == expect["live"], budget
        assert st.preemptions == expect.get("preemptions", 0), budget
        assert st.failures == expect.get("failures", 0), budget
        assert not h.store.exists(BUCKET, names.marker_key("llm")), budget
        assert not h.store.exists(BUCKET, names.exit_key("llm")), budget
        if not crash.crashed:
            break  # the whole pass fitted in the budget: every crash point was covered
    else:
        pytest.fail("scenario needs more than 12 mutating calls; raise the bound")
