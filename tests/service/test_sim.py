"""The fleet simulator (``make sim``) at a tiny size: it runs, its figures are sane, and its
shortcuts change nothing. The figures themselves come from ``make sim``."""

from __future__ import annotations

import json
from dataclasses import replace

import sim.__main__ as cli
from sim.fleet import POLICIES, run_policy
from sim.model import Params, ceiling, make_trace

FIELDS = ("goodput", "recovery_p50_s", "recovery_p99_s", "accelerator_hours_lost", "cost")


def test_a_few_hours_of_two_jobs_under_every_policy(tmp_path, capsys):
    out, png = tmp_path / "results.json", tmp_path / "results.png"
    # --verify-skips: every tick the engine policies skip is run dry and must not act.
    argv = ["--days", "0.25", "--jobs", "2", "--seeds", "1", "--workers", "1", "--verify-skips",
            "--out", str(out), "--plot", str(png)]
    assert cli.main(argv) == 0
    doc = json.loads(out.read_text())
    assert set(doc) >= {"parameters", "policies", "goodput", "ceiling"}
    assert doc["parameters"]["days"] == 0.25 and doc["parameters"]["jobs"] == 2
    assert set(doc["policies"]) == set(POLICIES) == set(doc["goodput"])
    assert 0 < doc["ceiling"] <= 1
    for name, r in doc["policies"].items():
        assert all(k in r for k in FIELDS), name
        assert 0 < r["goodput"] <= 1 and r["goodput"] == doc["goodput"][name]
        assert r["goodput"] <= doc["ceiling"] + 0.1, name  # a few hours: wide noise
        assert r["accelerator_hours_lost"] > 0 and r["cost"] > 0
        assert r["losses"] > 0 and r["recovery_p50_s"] is not None and r["recovery_p50_s"] <= r["recovery_p99_s"]
        assert r["counters"]["pass_errors"] == 0, r["errors"]
        assert r["counters"]["deleted_alive"] == 0  # no controller deleted a VM that was not being preempted
    respawn, polling = doc["policies"]["respawn"], doc["policies"]["poll-15s"]
    # The marker's event recovers at once; the polling loop waits 60 s after seeing the loss.
    assert respawn["recovery_p50_s"] < 30 < 60 < polling["recovery_p50_s"]
    c = respawn["counters"]
    assert c["passes_event"] > 0 and c["passes_skipped"] > 0
    # Every trainer took its interval from the controller's metadata or, without one, from the sim.
    assert c["interval_controller"] + c["interval_sim"] == c["vms"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "respawn" in printed and "ceiling" in printed and "wall time" in printed


def test_skipping_idle_ticks_changes_nothing():
    trace = make_trace(Params(days=0.5, jobs=3, seed=7))
    for policy in ("respawn", "respawn-tick-only"):
        fast, full = run_policy(trace, policy), run_policy(trace, policy, skip_ticks=False)
        assert fast["counters"]["passes_skipped"] > full["counters"]["passes_skipped"] == 0
        for counters in (fast["counters"], full["counters"]):
            for key in ("passes_tick", "passes_skipped"):
                counters.pop(key)
        assert fast == full


def test_the_simulated_ideal_policy_meets_the_analytic_ceiling():
    """The ceiling's formula against the ideal policy run on the sim's own draws (a month of 8 jobs)."""
    p = Params(days=30, jobs=8)
    for seed in (1, 2):
        trace = make_trace(replace(p, seed=seed))
        simulated = run_policy(trace, "ideal")["goodput"]
        assert abs(simulated - ceiling(trace)["goodput"]) < 0.015
