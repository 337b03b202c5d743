"""controller.core.fleet: what one commit added to a job's ledger, and the fleet added up (pure)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from controller.core import fleet
from controller.core.ledger import Ledger, Loss, Totals
from controller.core.state import JobStatus, Phase

T0 = datetime(2026, 1, 1, tzinfo=UTC)
RUN = T0 - timedelta(hours=1)


def status(*losses: Loss, stockouts: dict[str, int] | None = None, created: datetime = RUN, **kw) -> JobStatus:
    return JobStatus(created_at=created, ledger=Ledger(losses=losses, totals=Totals(stockouts=stockouts or {})), **kw)


def lost(attempt: int, zone: str | None = "us-central1-a", cause: str = "preempted", back: datetime | None = None,
         unknown: bool = False) -> Loss:
    return Loss(attempt=attempt, cause=cause, zone=zone, lost_at=T0, seen_at=T0 + timedelta(seconds=5),
                issued_at=T0 + timedelta(seconds=5), running_at=back, recovery_unknown=unknown)


def test_a_commit_that_adds_a_loss_is_one_loss_and_its_replacement_running_later_is_one_recovery():
    before = status()
    after = status(lost(1))
    assert fleet.changes("j", before, after) == (fleet.Change("loss", "j", "us-central1-a", "preempted", 1),)
    back = status(lost(1, back=T0 + timedelta(seconds=95)))
    assert fleet.changes("j", after, back) == (
        fleet.Change("recovery", "j", "us-central1-a", "preempted", 1, 95.0),)
    assert fleet.changes("j", back, back) == ()  # the same ledger committed again: nothing new


def test_a_loss_and_its_recovery_in_one_commit_are_both_and_an_unknown_recovery_time_is_none():
    after = status(lost(2, zone=None, cause="host error", back=T0 + timedelta(minutes=3), unknown=True))
    assert fleet.changes("j", None, after) == (fleet.Change("loss", "j", fleet.NO_ZONE, "host error", 2),
                                               fleet.Change("recovery", "j", fleet.NO_ZONE, "host error", 2, None))


def test_stockouts_are_counted_by_how_many_the_commit_added_in_each_zone():
    before = status(stockouts={"a": 1})
    after = status(stockouts={"a": 3, "b": 1})
    assert sorted(c.zone for c in fleet.changes("j", before, after)) == ["a", "a", "b"]
    assert all(c.kind == "stockout" for c in fleet.changes("j", before, after))


def test_a_new_runs_ledger_is_counted_from_nothing_and_never_against_the_old_runs():
    old = status(lost(1), lost(2), stockouts={"a": 5})
    new = status(lost(1), created=T0)  # the job submitted again: a new run, its own first loss
    assert [c.kind for c in fleet.changes("j", old, new)] == ["loss"]


def test_the_fleet_adds_every_job_up_and_this_passes_changes_apart():
    running = JobStatus(phase=Phase.RUNNING, ledger=Ledger(totals=Totals(
        losses={"a": {"preempted": 2}}, recoveries=2, recovery_s=100.0, paid_acc_s=7200.0, boot_acc_s=720.0,
        cost=1.5, on_demand_cost=4.0)))
    done = JobStatus(phase=Phase.SUCCEEDED, ledger=Ledger(totals=Totals(
        losses={"a": {"preempted": 1}, "b": {"maintenance": 1}}, recoveries=2, recovery_s=300.0, paid_acc_s=3600.0,
        cost=0.5, on_demand_cost=2.0)))
    made = [fleet.Change("loss", "x", "a", "preempted", 3), fleet.Change("recovery", "x", "a", "preempted", 2, 61.0),
            fleet.Change("stockout", "x", "b")]
    f = fleet.figures([running, done, JobStatus()], T0, made, unread=1)
    assert f.jobs["RUNNING"] == f.jobs["SUCCEEDED"] == f.jobs["PENDING"] == 1 and sum(f.jobs.values()) == 3
    assert f.losses == {"a": {"preempted": 3}, "b": {"maintenance": 1}}
    assert (f.recoveries, f.recovery_mean_s, f.cost, f.on_demand_cost, f.savings) == (4, 100.0, 2.0, 6.0, 4.0)
    assert math.isclose(f.goodput, (10800 - 720) / 10800) and f.accelerators_running == 0  # no open attempt
    assert (f.pass_losses, f.pass_stockouts, f.pass_recoveries, f.pass_recovery_s) == (
        {"a": {"preempted": 1}}, {"b": 1}, 1, (61.0,))
    entry = fleet.fleet_entry(f)
    assert entry["jobs_unread"] == 1 and entry["saved_dollars"] == 4.0 and entry["recovery_mean_s"] == 100.0
