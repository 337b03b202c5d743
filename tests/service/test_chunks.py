"""A pass over every job in chunks: each acted on before the next is read, and a status that a
concurrent pass replaced between the listing and its read judged again alone."""

from __future__ import annotations

from typing import Any

from controller.core import errors, names
from controller.core.state import Phase
from controller.service.engine import Engine
from controller.service.executor import Executor
from controller.service.observe import Observer
from tests.harness import BUCKET, Harness


def _engine(h: Harness, chunk: int, store: Any = None, compute: Any = None) -> Engine:
    observer = Observer(store or h.store, compute or h.compute, BUCKET, h.policy, tpu=h.tpu, replayable=True,
                        chunk=chunk)
    return Engine(observer, Executor(store or h.store, compute or h.compute, BUCKET, h.tpu), h.ctx, h.clock)


def _running(h: Harness, jobs: list[str]) -> None:
    for job in jobs:
        h.submit(job)
    h.tick()
    h.tick()
    assert all(h.status(j).phase == Phase.RUNNING for j in jobs)


class _Spy:
    """A port that logs its calls (``log``) before passing them on; ``after`` runs a hook once a
    named call returned."""

    def __init__(self, inner: Any, log: list[tuple[str, str]], after: dict[str, Any] | None = None) -> None:
        self._inner, self._log, self._after = inner, log, after or {}

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._inner, name)
        if not callable(call):
            return call

        def logged(*args: Any, **kwargs: Any) -> Any:
            what = args[0].name if args and hasattr(args[0], "name") else str(args[1] if len(args) > 1 else "")
            if name == "insert":
                what = args[0][0].name
            self._log.append((name, what))
            found = call(*args, **kwargs)
            if (hook := self._after.pop(name, None)) is not None:
                hook()
            return found

        return logged


def test_a_pass_over_every_job_acts_on_a_chunk_before_it_reads_the_next():
    h = Harness()
    jobs = ["a", "b", "c", "d", "e", "f"]
    _running(h, jobs)
    for job in jobs:
        h.marker(job)  # every VM preempted: each job's recovery inserts its next attempt
        h.compute.preempt(f"{job}-1")
    log: list[tuple[str, str]] = []
    _engine(h, 2, store=_Spy(h.store, log), compute=_Spy(h.compute, log)).reconcile()
    assert sorted(h.live()) == [f"{j}-2" for j in jobs]
    reads = [what for op, what in log if op == "read_listed" and what.endswith("/status.json")]
    inserts = [what for op, what in log if op == "insert"]
    assert reads == [f"jobs/{j}/status.json" for j in jobs] and inserts == [f"{j}-2" for j in jobs]
    # a and b (the first chunk) were inserted before e's status was read; e and f after c and d's.
    at = {entry: n for n, entry in enumerate(log)}
    assert at[("insert", "b-2")] < at[("read_listed", "jobs/e/status.json")]
    assert at[("insert", "d-2")] < at[("read_listed", "jobs/e/status.json")] < at[("insert", "e-2")]


def test_every_chunk_holds_at_most_its_size_of_jobs():
    h = Harness()
    _running(h, [f"j{n}" for n in range(7)])
    chunks, rest = _engine(h, 3).observer.parts()
    assert [sorted(w.jobs) for w in chunks] == [["j0", "j1", "j2"], ["j3", "j4", "j5"], ["j6"]]
    assert rest().jobs == {}


def test_a_status_replaced_after_the_instance_list_is_judged_again_alone_never_as_a_lost_vm():
    """The instance list is asked for right after the bucket listing; b's status is read later. A
    concurrent pass recovers b in between (its attempt 2 inserted and committed): read as it is now,
    b's status would say attempt 2 was inserted while the instance list, older, lacks b-2, and the
    pass would take b-2 for lost and launch attempt 3 beside it. Read at its listed generation it
    is found replaced, and b is observed again, alone, in the right order."""
    h = Harness()
    _running(h, ["a", "b"])
    h.marker("b")
    h.compute.preempt("b-1")

    def recover_b() -> None:
        h.tick("b")  # another function instance's event pass
        assert h.live("b") == ["b-2"] and h.status("b").attempt == 2

    log: list[tuple[str, str]] = []
    summary = _engine(h, 1, compute=_Spy(h.compute, log, after={"list_managed": recover_b})).reconcile()
    assert not summary.errors
    assert h.live() == ["a-1", "b-2"] and h.status("b").attempt == 2 and h.status("b").phase != Phase.RECOVERING
    assert ("list_managed", "b") in log  # b looked at again on its own
    # And the next tick agrees: nothing to do.
    h.tick()
    assert h.live() == ["a-1", "b-2"]


def test_the_fleets_figures_add_up_every_chunk():
    h = Harness()
    _running(h, [f"j{n}" for n in range(5)])
    h.submit("new")  # a spec with no status yet: counted as PENDING
    summary = _engine(h, 2).reconcile()
    assert summary.figures is not None
    assert summary.figures.jobs["RUNNING"] == 5 and sum(summary.figures.jobs.values()) == 6


class _FailingJobListing:
    """The bucket, whose listing of one job's folder fails (a 503) once ``armed``."""

    def __init__(self, inner: Any, job: str) -> None:
        self._inner, self._prefix, self.armed = inner, f"jobs/{job}/", False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def list(self, bucket: str, prefix: str) -> Any:
        if self.armed and prefix == self._prefix:
            raise errors.TransientError(f"gs://{bucket}/{prefix}*: 503")
        return self._inner.list(bucket, prefix)


def test_a_replaced_status_that_cannot_be_observed_again_fails_its_job_alone_never_the_rest_of_the_pass():
    """b's status is replaced by another pass after the instance list, so b is observed again alone
    at the end of the pass; that listing of b's folder fails. The failure is b's: the jobs the pass
    hands to ``rest`` (here a new run) are still acted on, and the pass ends with b's error."""
    h = Harness()
    _running(h, ["a", "b"])
    h.marker("b")
    h.compute.preempt("b-1")
    h.submit("new")  # a run that launched nothing yet: judged with the rest, after every chunk
    store = _FailingJobListing(h.store, "b")

    def recover_b() -> None:
        h.tick("b")  # another function instance's event pass
        store.armed = True

    summary = _engine(h, 1, store=store, compute=_Spy(h.compute, [], after={"list_managed": recover_b})).reconcile()
    assert h.live("new") == ["new-1"]
    assert "b" in summary.errors and "TransientError" in summary.errors["b"] and "b" in summary.transient
    assert summary.figures is not None


def test_a_pass_over_every_job_keeps_no_committed_status_past_its_chunk():
    """Every job of the fleet commits (a mass recovery: each VM preempted); the pass keeps each
    committed status only until its chunk is added to the figures, so its memory is the chunk's, not
    the fleet's (a status at its history limit parses to about 160 KiB: 10,000 recoveries held 1.6 GiB)."""
    h = Harness()
    jobs = [f"j{n}" for n in range(7)]
    _running(h, jobs)
    for job in jobs:
        h.marker(job)
        h.compute.preempt(f"{job}-1")
    held: list[int] = []
    engine = _engine(h, 2)
    done_with = engine._done_with

    def watched(world, seen, summary, tally):
        out = done_with(world, seen, summary, tally)
        held.append(len(summary.committed))
        return out

    engine._done_with = watched
    summary = engine.reconcile()
    assert sorted(h.live()) == [f"{job}-2" for job in jobs]
    assert max(held) <= 2 and summary.committed == {}
    assert summary.figures is not None and sum(summary.figures.jobs.values()) == 7


def test_jobs_whose_spec_was_deleted_are_read_and_acted_on_a_chunk_at_a_time():
    """A job whose spec is gone keeps its status (a record of how it ended): a fleet of them, or of
    specs a policy change made invalid, was all held in one part of the pass, the rest, every status
    parsed at once. They are judged with the instance list like any VM job, a chunk at a time, and
    a VM one of them left is still deleted."""
    h = Harness()
    jobs = [f"j{n}" for n in range(6)]
    _running(h, jobs)
    for job in jobs:
        h.store.delete(BUCKET, names.spec_key(job))
    observer = Observer(h.store, h.compute, BUCKET, h.policy, tpu=h.tpu, replayable=True, chunk=2)
    chunks, rest = observer.parts()
    assert [len(world.jobs) for world in chunks] == [2, 2, 2]
    assert rest().jobs == {}
    summary = _engine(h, 2).reconcile()
    assert not summary.errors and h.live() == []
    assert all(h.status(job).phase == Phase.CANCELLED for job in jobs)
    assert summary.figures is not None and sum(summary.figures.jobs.values()) == 6
