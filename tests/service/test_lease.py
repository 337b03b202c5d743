"""One pass over every job at a time (issue 40, part 4): the lease, over the in-memory store.

Every engine here is its own function instance (its own ``Leases``, holder and caches); time is the
harness's FakeClock, for GCS's ``updated`` and for the holder's monotonic deadlines alike, so a
lapse is exact. The renewing thread waits in real time (10 s) and never fires within a test:
renewals are called where a test wants one.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from functions_framework import create_app
from pydantic import ValidationError

from controller.core import errors, names
from controller.core.audit import system_event_entry
from controller.service import bootstrap, functions, lastpass, lease
from controller.service.config import Settings
from controller.service.engine import Engine, Summary
from controller.service.lease import Busy, Held, Leases, Terms
from tests.harness import BUCKET, PROJECT, Harness

MAIN = str(Path(__file__).resolve().parents[2] / "main.py")
TTL, MARGIN = Terms.ttl, Terms.margin


def leases(h: Harness, store: Any = None, holder: str = "test", terms: Terms | None = None) -> Leases:
    return Leases(store or h.store, BUCKET, h.clock, terms, monotonic=h.clock.monotonic, holder=holder)


def leased(h: Harness, store: Any = None, holder: str = "test") -> Engine:
    """An engine as deployed: its passes over every job take the lease."""
    engine = h.engine(store)
    engine.lease = leases(h, store, holder)
    return engine


class HeldInListing:
    """The store, whose listing of every job waits until ``go``: a pass over every job stays in its
    observation, holding its lease, for as long as a test needs."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.entered, self.go = threading.Event(), threading.Event()
        self.listings = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def list(self, bucket: str, prefix: str) -> Any:
        if prefix == names.JOBS_PREFIX:
            self.listings += 1
            self.entered.set()
            assert self.go.wait(30), "the test never let the pass go on"
        return self._store.list(bucket, prefix)


class RetriedWrite:
    """google-cloud-storage's retry of a conditional upload: its first try lands, its answer is
    lost, and the retry answers 412 (the object's generation is no longer the one it names)."""

    def __init__(self, store: Any, times: int = 1) -> None:
        self._store, self.left = store, times

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def write(self, bucket: str, name: str, data: bytes, *, if_generation_match: int | None = None) -> Any:
        info = self._store.write(bucket, name, data, if_generation_match=if_generation_match)
        if name == lease.KEY and self.left:
            self.left -= 1
            raise errors.PreconditionFailed(f"gs://{bucket}/{name}: 412 on the retry")
        return info


class Later:
    """Compute, with the clock moved on by ``seconds`` during the (first) insert of ``name``: a pass
    that stalls there (a slow operation, a starved CPU) while its lease's renewals do not land."""

    def __init__(self, h: Harness, name: str, seconds: float) -> None:
        self._h, self._name, self._seconds = h, name, seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._h.compute, name)

    def insert(self, requests: Any, request_id: str, wait: float | None = None) -> Any:
        done = self._h.compute.insert(requests, request_id, wait)
        if requests[0].name == self._name:
            self._h.advance(seconds=self._seconds)
            self._name = None
        return done


def inserts(h: Harness) -> list[str]:
    return sorted(what for op, what in h.compute.calls if op == "insert")


def in_threads(calls: list[Any]) -> tuple[list[threading.Thread], dict[int, Any]]:
    """Each call on its own thread, released together; their results by index."""
    barrier, results = threading.Barrier(len(calls)), {}

    def run(i: int) -> None:
        barrier.wait()
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    return threads, results


def wait_for(what: str, check: Any, timeout: float = 30.0) -> None:
    event = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if check():
            return
        event.wait(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_ticks_started_together_make_one_pass():
    h = Harness()
    for job in ("a", "b", "c"):
        h.submit(job)
    store = HeldInListing(h.store)
    engines = [leased(h, store, holder=f"instance-{i}") for i in range(4)]
    threads, results = in_threads([e.reconcile for e in engines])
    wait_for("three ticks to find the lease held", lambda: len(results) == 3)
    store.go.set()
    for t in threads:
        t.join(timeout=30)
    ran = [s for s in results.values() if not s.skipped]
    skipped = [s for s in results.values() if s.skipped]
    assert len(ran) == 1 and len(skipped) == 3 and store.listings == 1
    assert all(s.skipped.startswith("another pass holds the lease until ") and s.jobs == {} for s in skipped)
    assert inserts(h) == ["a-1", "b-1", "c-1"]
    assert not h.store.exists(BUCKET, lease.KEY)  # released at the end of the pass


def test_a_pass_releases_the_lease_so_the_next_tick_runs_at_once():
    h = Harness()
    h.submit("a")
    engine = leased(h)
    first, second = engine.reconcile(), engine.reconcile()
    assert not first.skipped and not second.skipped and h.live() == ["a-1"]
    assert [what for op, what in h.store.calls if what == lease.KEY] == [lease.KEY] * 4  # create, delete, twice


def test_a_crashed_holders_lease_is_taken_over_once_lapsed_and_not_before():
    h = Harness()
    h.submit("a")
    crashed = leases(h, holder="crashed").take()  # its process died with it: never released
    assert isinstance(crashed, Held)
    taken_at = h.clock.now()
    engine = leased(h, holder="next")
    h.advance(seconds=TTL - MARGIN)
    assert not crashed.acting()  # had it only stalled, it would have stopped acting by now
    h.advance(seconds=2 * MARGIN - 0.001)  # lapsed by GCS's clock, but not by the margin past it
    summary = engine.reconcile()
    until = (taken_at + timedelta(seconds=TTL)).isoformat(timespec="seconds")
    assert summary.skipped == f"another pass holds the lease until {until} (crashed)"
    assert h.live() == []
    h.advance(seconds=0.001)
    summary = engine.reconcile()
    assert not summary.skipped and h.live() == ["a-1"]
    assert not h.store.exists(BUCKET, lease.KEY)
    crashed.release()  # come back to life: the lease it would delete is no longer its own
    assert not crashed.acting()


def test_a_pass_that_outlives_its_lease_mid_way_applies_no_action_after_it():
    h = Harness()  # one worker: the jobs in order, a, b, c
    for job in ("a", "b", "c"):
        h.submit(job)
    engine = h.engine(compute=Later(h, "a-1", TTL - MARGIN))  # no renewal lands meanwhile
    engine.lease = leases(h)
    summary = engine.reconcile()
    assert inserts(h) == ["a-1"]
    assert not h.store.exists(BUCKET, names.status_key("b")) and not h.store.exists(BUCKET, names.status_key("c"))
    assert summary.stopped and "not renewed for 25 s" in summary.stopped
    assert {"b", "c"} <= set(summary.not_acted)
    said = summary.as_dict()
    assert said["stopped"] == summary.stopped and said["jobs_not_acted"] == len(summary.not_acted)
    # the next tick finds the lease released (no other pass took it: it was still this one's) and
    # goes on where it stopped (a-1's insert sent again under its request id: Compute's answer is the first)
    assert not engine.reconcile().skipped and h.live() == ["a-1", "b-1", "c-1"]


class Capturing(Leases):
    """Leases that keep the last lease taken, so that a test can renew it when it wants."""

    held: Held | None = None

    def take(self) -> Held | Busy:
        taken = super().take()
        self.held = taken if isinstance(taken, Held) else None
        return taken


def test_a_pass_whose_lease_is_taken_mid_way_applies_no_action_after_its_renewal_finds_out():
    h = Harness()
    for job in ("a", "b", "c"):
        h.submit(job)
    taken = Capturing(h.store, BUCKET, h.clock, monotonic=h.clock.monotonic, holder="mine")

    class Taken(Later):
        def insert(self, requests: Any, request_id: str, wait: float | None = None) -> Any:
            done = self._h.compute.insert(requests, request_id, wait)
            if requests[0].name == "a-1":  # another writer's lease lands; this pass's next renewal sees it
                self._h.store.put(BUCKET, lease.KEY, json.dumps({"holder": "thief", "ttl_s": TTL}))
                assert taken.held is not None and not taken.held.renew()
            return done

    engine = h.engine(compute=Taken(h, "a-1", 0))
    engine.lease = taken
    summary = engine.reconcile()
    assert inserts(h) == ["a-1"] and {"b", "c"} <= set(summary.not_acted)
    assert summary.stopped == "another pass took the lease (thief)"
    assert json.loads(h.store.read(BUCKET, lease.KEY).data)["holder"] == "thief"  # not released: not ours


def test_a_pass_that_stops_acting_at_an_error_leaves_it_unrecorded_for_the_next_pass():
    h = Harness()
    h.submit("a")
    h.tick()  # launched: a-1
    h.compute.preempt("a-1")
    h.marker("a")

    class FailingLater(Later):
        def insert(self, requests: Any, request_id: str, wait: float | None = None) -> Any:
            self._h.advance(seconds=self._seconds)
            raise errors.RequestError("400 bad image")

    engine = h.engine(compute=FailingLater(h, "a-2", TTL))
    engine.lease = leases(h)
    before = h.status("a")
    summary = engine.reconcile()
    assert summary.not_acted == ["a"] and summary.errors["a"].startswith("create a-2")
    after = h.status("a")
    assert not any("bad image" in e.detail for e in after.history)  # the error's write was not made
    assert after.attempt == before.attempt + 1  # the decision before the insert was committed under the lease


def test_a_renewal_that_finds_the_lease_another_writers_stops_acting_at_once():
    h = Harness()
    mine = leases(h).take()
    assert isinstance(mine, Held) and mine.acting()
    h.store.put(BUCKET, lease.KEY, json.dumps({"holder": "someone", "pass": "x", "renewal": 0, "ttl_s": TTL}))
    assert not mine.renew()
    assert not mine.acting() and mine.why_not() == "another pass took the lease (someone)"
    mine.release()
    assert h.store.exists(BUCKET, lease.KEY)  # never deleted: not this pass's


def test_a_pass_renewed_in_time_acts_past_its_first_ttl_and_stops_once_renewals_stop():
    h = Harness()
    held = leases(h).take()
    assert isinstance(held, Held)
    for _ in range(3):
        h.advance(seconds=Terms.renew)
        assert held.renew() and held.acting()
    h.advance(seconds=TTL - MARGIN - 0.001)
    assert held.acting()  # 55 s after its take
    h.advance(seconds=0.001)
    assert not held.acting() and "not renewed for 25 s" in (held.why_not() or "")


def test_a_pass_never_acts_past_its_longest_hold_however_renewed():
    h = Harness()
    held = leases(h, terms=Terms(ttl=30, renew=10, margin=5, max_hold=60)).take()
    assert isinstance(held, Held)
    for _ in range(5):
        h.advance(seconds=10)
        assert held.renew()
    assert held.acting()  # 50 s
    h.advance(seconds=5)
    assert not held.acting() and held.why_not() == "the pass outlived its longest hold (60 s)"
    h.advance(seconds=5)
    assert not held.renew()  # nor renewed past it: the lease lapses by itself


def test_a_renewal_that_fails_keeps_the_last_deadline():
    h = Harness()
    held = leases(h).take()
    assert isinstance(held, Held)
    h.advance(seconds=Terms.renew)
    h.store.faults.fail_next("write", errors.TransientError("503"))
    assert not held.renew()
    assert held.acting()  # 10 s into a 25 s deadline
    h.advance(seconds=TTL - MARGIN - Terms.renew)
    assert not held.acting()


@pytest.mark.parametrize("what", ["take", "renewal"])
def test_a_412_on_a_retried_write_whose_first_try_landed_is_read_back_as_won(what):
    h = Harness()
    h.submit("a")
    store = RetriedWrite(h.store, times=1 if what == "take" else 0)
    held = leases(h, store).take()
    assert isinstance(held, Held)
    if what == "renewal":
        store.left = 1
        assert held.renew()
    assert held.acting()
    assert json.loads(h.store.read(BUCKET, lease.KEY).data)["pass"] == held.pass_id
    held.release()
    assert not h.store.exists(BUCKET, lease.KEY)
    # and a whole tick through it: the pass runs, acts, and releases what it took
    summary = leased(h, RetriedWrite(h.store)).reconcile()
    assert not summary.skipped and h.live() == ["a-1"] and not h.store.exists(BUCKET, lease.KEY)


@pytest.mark.parametrize("body, lapses_after", [
    ("not json", TTL),  # a bucket writer's garbage: our own ttl from its updated time
    (json.dumps({"holder": "forged", "ttl_s": 1e9}), lease.MAX_TTL),  # a ttl for ever: believed 10 minutes at most
    (json.dumps({"holder": "older revision", "ttl_s": 60}), 60),  # a holder deployed with other terms: its own
])
def test_a_lease_we_did_not_write_lapses_by_its_updated_time(body, lapses_after):
    h = Harness()
    h.submit("a")
    h.store.put(BUCKET, lease.KEY, body)
    engine = leased(h)
    h.advance(seconds=lapses_after + MARGIN - 0.001)
    assert engine.reconcile().skipped
    h.advance(seconds=0.001)
    assert not engine.reconcile().skipped and h.live() == ["a-1"]


def test_event_passes_for_one_job_are_not_blocked_by_the_lease():
    h = Harness()
    h.submit("a")
    h.submit("b")
    store = HeldInListing(h.store)
    tick = leased(h, store, holder="tick")
    threads, results = in_threads([tick.reconcile])
    assert store.entered.wait(30)  # the tick holds the lease, in its observation
    event = leased(h, holder="event").reconcile("a")
    assert not event.skipped and h.live() == ["a-1"]
    assert leased(h, holder="another tick").reconcile().skipped  # a pass over every job waits its turn
    store.go.set()
    threads[0].join(timeout=30)
    assert not results[0].skipped and h.live() == ["a-1", "b-1"] and inserts(h) == ["a-1", "b-1"]


def message(entry: Any) -> dict[str, Any]:
    return {"message": {"data": base64.b64encode(json.dumps(entry).encode()).decode(), "messageId": "1"}}


def tpu_worker_entry(h: Harness) -> dict[str, Any]:
    """Worker 0 of a TPU slice: its entry names no node, so on_audit makes a pass over every job."""
    return message(system_event_entry(PROJECT, "us-central2-b", "t1v-n-0000abcd-w-0", "77",
                                      "compute.instances.preempted", h.clock.now()))


@pytest.mark.parametrize("first", ["tick", "hint"])
def test_a_hints_pass_over_every_job_and_a_tick_never_overlap(first):
    h = Harness()
    h.submit("a")
    store = HeldInListing(h.store)
    bootstrap.override(leased(h, store), Settings(bucket=BUCKET, project=PROJECT))
    tick = lambda: functions.tick()[0]  # noqa: E731
    hint = lambda: functions.on_audit(tpu_worker_entry(h))  # noqa: E731
    threads, results = in_threads([tick if first == "tick" else hint])
    assert store.entered.wait(30)
    second = (hint if first == "tick" else tick)()
    assert second["skipped"].startswith("another pass holds the lease until ") and second["actions"] == {}
    store.go.set()
    threads[0].join(timeout=30)
    assert "skipped" not in results[0] and results[0]["actions"]["a"] and store.listings == 1
    assert h.live() == ["a-1"]


def test_a_tick_that_finds_the_lease_held_answers_200_saying_until_when(caplog):
    h = Harness()
    h.submit("a")
    other = leases(h, holder="instance-7").take()
    assert isinstance(other, Held)
    bootstrap.override(leased(h), Settings(bucket=BUCKET, project=PROJECT))
    with caplog.at_level(logging.INFO):
        response = create_app("tick", MAIN).test_client().post("/")
    assert response.status_code == 200  # Cloud Scheduler must not count it as a failure
    said = response.get_json()["skipped"]
    assert said.startswith("another pass holds the lease until ") and said.endswith("(instance-7)")
    assert any(said in r.getMessage() for r in caplog.records)
    assert h.live() == [] and not h.store.exists(BUCKET, lastpass.KEY)  # the holder's pass writes it


def test_a_dry_run_over_every_job_takes_no_lease():
    h = Harness()
    h.submit("a")
    other = leases(h, holder="tick").take()
    assert isinstance(other, Held)
    summary = leased(h).reconcile(dry_run=True)
    assert not summary.skipped and summary.jobs["a"]


def test_the_lease_durations_are_settings(monkeypatch):
    assert Settings(bucket=BUCKET, project=PROJECT).lease_terms() == Terms(ttl=30, renew=10, margin=5, max_hold=540)
    monkeypatch.setenv("RESPAWN_LEASE_TTL", "90")
    monkeypatch.setenv("RESPAWN_LEASE_RENEW", "20")
    monkeypatch.setenv("RESPAWN_LEASE_MARGIN", "10")
    monkeypatch.setenv("RESPAWN_LEASE_MAX_HOLD", "300")
    assert Settings(bucket=BUCKET, project=PROJECT).lease_terms() == Terms(ttl=90, renew=20, margin=10, max_hold=300)
    monkeypatch.setenv("RESPAWN_LEASE_RENEW", "80")  # a lease that lapses before its renewal
    with pytest.raises(ValidationError, match="renew < ttl - margin"):
        Settings(bucket=BUCKET, project=PROJECT)


def test_a_skipped_pass_says_so_in_its_summary_and_nothing_else():
    summary = Summary(skipped="another pass holds the lease until 2026-01-01T00:00:30+00:00 (x)")
    assert summary.as_dict() == {"actions": {}, "errors": {}, "transient": [], "unreachable_zones": [], "jobs_seen": 0,
                                 "skipped": summary.skipped}
    assert Busy("x", datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)).describe() == summary.skipped


def test_respawn_reconcile_says_when_another_pass_holds_the_lease(monkeypatch):
    from typer.testing import CliRunner

    from controller.cli.main import app

    monkeypatch.setenv("COLUMNS", "400")
    h = Harness()
    h.submit("a")
    assert isinstance(leases(h, holder="tick-instance").take(), Held)
    bootstrap.override(leased(h), Settings(bucket=BUCKET, project=PROJECT), h.store, h.compute)
    result = CliRunner().invoke(app, ["reconcile"])
    assert result.exit_code == 0, result.output
    assert "another pass holds the lease until " in result.output and "(tick-instance)" in result.output
    assert h.live() == []
    assert CliRunner().invoke(app, ["reconcile", "a"]).exit_code == 0 and h.live() == ["a-1"]  # one job: no lease


@pytest.mark.parametrize("ttl", ["NaN", '"nan"'])
def test_a_forged_lease_whose_ttl_is_no_number_lapses_by_our_ttl_and_never_stalls_the_controller(ttl):
    # json.loads reads NaN (and float() reads "nan"): min/max pass a NaN through, and timedelta(NaN)
    # raised ValueError from every take, so one such object failed every tick for as long as it lay there.
    h = Harness()
    h.submit("a")
    h.store.put(BUCKET, lease.KEY, '{"holder": "forged", "ttl_s": %s}' % ttl)
    engine = leased(h)
    h.advance(seconds=TTL + MARGIN - 0.001)
    assert engine.reconcile().skipped
    h.advance(seconds=0.001)
    assert not engine.reconcile().skipped and h.live() == ["a-1"]


class Ahead:
    """A machine's wall clock ahead of GCS's by ``seconds`` (a laptop running ``respawn reconcile``);
    its monotonic clock runs as everyone's."""

    def __init__(self, h: Harness, seconds: float) -> None:
        self._h, self._ahead = h, timedelta(seconds=seconds)

    def now(self) -> datetime:
        return self._h.clock.now() + self._ahead

    def monotonic(self) -> float:
        return self._h.clock.monotonic()


def test_a_pass_whose_clock_runs_ahead_never_takes_a_lease_its_holder_still_acts_under():
    # The lapse is judged by GCS's updated time against the taker's own wall clock: a taker ten
    # minutes ahead took a lease renewed a second ago and acted beside its holder, which went on
    # acting until its next renewal found out (10 s), or its deadline if renewals failed (25 s).
    h = Harness()
    h.submit("a")
    holder = leases(h, holder="tick").take()
    assert isinstance(holder, Held)
    h.advance(seconds=1)
    engine = h.engine()
    engine.lease = Leases(h.store, BUCKET, Ahead(h, 600), monotonic=h.clock.monotonic, holder="laptop")
    summary = engine.reconcile()
    assert holder.acting()
    assert summary.skipped and "(tick)" in summary.skipped and h.live() == []
    # once the holder is gone for good, by GCS's clock, the same laptop takes it over
    h.advance(seconds=TTL + MARGIN)
    assert not engine.reconcile().skipped and h.live() == ["a-1"]


class Surprise:
    """The bucket, whose next write of the lease raises what no adapter translated (google.auth's
    TransportError when the metadata server's token refresh fails) once ``armed``."""

    def __init__(self, store: Any) -> None:
        self._store, self.armed = store, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def write(self, bucket: str, name: str, data: bytes, **kwargs: Any) -> Any:
        if self.armed and name == lease.KEY:
            self.armed = False
            raise RuntimeError("token refresh failed: metadata server unreachable")
        return self._store.write(bucket, name, data, **kwargs)


def test_a_renewal_that_raises_a_surprise_leaves_the_renewing_thread_renewing():
    # The thread caught only the project's errors: anything else ended it, silently, and the pass
    # stopped acting 25 s later though the next renewal would have landed.
    h = Harness()
    store = Surprise(h.store)
    held = leases(h, store, terms=Terms(ttl=30, renew=0.02, margin=5)).take()
    assert isinstance(held, Held)
    store.armed = True
    with held:
        wait_for("a renewal after the surprise", lambda: not store.armed and
                 json.loads(h.store.read(BUCKET, lease.KEY).data)["renewal"] >= 1)
        h.advance(seconds=TTL - MARGIN - 1)
        renewal = json.loads(h.store.read(BUCKET, lease.KEY).data)["renewal"]
        # two more: the second surely began after the clock moved
        wait_for("renewals by the new time", lambda: json.loads(h.store.read(BUCKET, lease.KEY).data)["renewal"]
                 >= renewal + 2)
        h.advance(seconds=TTL - MARGIN - 1)
        assert held.acting()


class ClockRefused:
    """The bucket, answering the write that reads GCS's time with a 429 (another taker wrote it
    within the second)."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def write(self, bucket: str, name: str, data: bytes, **kwargs: Any) -> Any:
        if name == f"{lease.KEY}.clock":
            raise errors.TransientError(f"gs://{bucket}/{name}: 429")
        return self._store.write(bucket, name, data, **kwargs)


def test_a_lapsed_lease_whose_takers_cannot_read_gcs_time_is_left_for_the_next_tick():
    h = Harness()
    h.submit("a")
    assert isinstance(leases(h, holder="crashed").take(), Held)
    h.advance(seconds=TTL + MARGIN)
    summary = leased(h, ClockRefused(h.store)).reconcile()
    assert summary.skipped and "(crashed)" in summary.skipped and h.live() == []
    assert not leased(h).reconcile().skipped and h.live() == ["a-1"]
