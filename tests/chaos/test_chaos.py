"""`make chaos` in small: seeded chaos runs of the real controller, every invariant checked.

The same engine as ``python -m tests.chaos``; a failure prints each violation with the
one-line command that replays its run step by step.
"""

from __future__ import annotations

import pytest

from tests.chaos import sim

SEEDS = 100


@pytest.fixture(scope="module")
def chaos() -> tuple[sim.Totals, list[str]]:
    lines: list[str] = []
    return sim.run_many(0, SEEDS, out=lines.append, max_examples=3), lines


def test_chaos_runs_break_no_invariant(chaos: tuple[sim.Totals, list[str]]) -> None:
    totals, lines = chaos
    counts = {kind: totals.counts[kind] for kind in sim.ALL_KINDS}
    assert totals.runs == SEEDS
    if totals.failed:
        pytest.fail("\n".join([*lines, f"runs with a violation, by kind: {counts}"]), pytrace=False)


def test_faults_really_reach_the_controller(chaos: tuple[sim.Totals, list[str]]) -> None:
    """An honest harness: every kind of trouble was injected and met by the controller's calls."""
    s = chaos[0].stats
    met = {
        "transient errors": sum(v for k, v in s.items() if k.startswith("fault.transient.")),
        "timeouts after the call": sum(v for k, v in s.items() if k.startswith("fault.timeout.")),
        "crashes mid-pass": s["fault.crash_before_call"] + s["fault.crash_after_call"],
        "late passes": s["fault.late_pass"],
        "duplicate events": s["fault.duplicate_event"],
        "stockouts met": s["fault.stockout_hit"],
        "quota errors met": s["fault.quota_hit"],
        "listings with a zone unreachable": s["fault.unreachable_listing"],
        "pending inserts met": s["fault.pending_insert_hit"],
        "odd instance statuses": sum(v for k, v in s.items() if k.startswith("fault.status_")),
        "graceful preemptions": s["fault.preempt_graceful"],
        "hard preemptions": s["fault.preempt_hard"],
        "trainers exiting 0": s["vm.success"],
        "non-zero exits": s["vm.nonzero"],
        "hangs": s["vm.hang"],
        "cancels": s["user.cancel"],
        "resubmits": s["user.resubmit"],
        "jobs that succeeded": s["outcome.SUCCEEDED"],
    }
    assert all(met.values()), {k: v for k, v in met.items() if not v}


def test_a_seed_replays_exactly() -> None:
    first, second = sim.run_one(7), sim.run_one(7)
    assert first.violations == second.violations
    assert first.stats == second.stats


def test_chaos_runs_with_passes_fanned_out_over_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """As deployed: every pass reconciles its jobs on several threads. Not replayable by seed
    (thread timing decides the order of calls), so this checks invariants only."""
    monkeypatch.setattr(sim, "WORKERS", 4)
    lines: list[str] = []
    totals = sim.run_many(20_000, 30, out=lines.append, max_examples=3)
    if totals.failed:
        pytest.fail("\n".join([*lines, "with --workers 4 (replay without -v is not exact)"]), pytrace=False)
