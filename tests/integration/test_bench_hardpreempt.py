"""``python -m bench.hardpreempt`` in small: the probe runs end to end on the local cloud (every
latency a hundredth of Google's) and reports what it measured, for each cause apart, each event
timed from a hard loss to the replacement's insert received."""

from __future__ import annotations

import json

import pytest

from bench import hardpreempt


@pytest.mark.parametrize("cause", hardpreempt.CAUSES)
def test_the_probe_times_hard_losses_of_each_cause_to_the_replacements_insert(cause):
    lines: list[str] = []
    found = hardpreempt.measure(jobs=2, rounds=1, scale=0.01, say=lines.append, cause=cause)
    key = f"hard_{cause}"
    assert found[f"{key}_events"] == 2 and len(lines) == 1 and cause in lines[0]
    assert 0 < found[f"{key}_p50_s"] <= found[f"{key}_p99_s"] <= found[f"{key}_max_s"]
    assert sum(found[f"{key}_via"].values()) == 2
    # Seconds, through on_audit: the Scheduler runs once a minute here.
    assert found[f"{key}_max_s"] < 30


def test_a_run_alone_goes_to_a_file_of_its_own_never_into_results(tmp_path, monkeypatch):
    from bench import run

    results, runs = tmp_path / "results.json", tmp_path / "runs"
    results.write_text('{"tick_1k_s": 1.0}\n')
    monkeypatch.setattr(run, "RESULTS", results)
    monkeypatch.setattr(run, "RUNS", runs)
    monkeypatch.setattr(hardpreempt, "measure", lambda *a, cause, **k: {f"hard_{cause}_p99_s": 1.0})
    assert hardpreempt.main([]) == 0
    assert results.read_text() == '{"tick_1k_s": 1.0}\n'
    (alone,) = runs.glob("hardpreempt-*.json")
    written = json.loads(alone.read_text())
    assert written["hard_preempted_p99_s"] == 1.0 and written["hard_host_error_p99_s"] == 1.0
    assert written["commit"] and written["seeds"] == {"hardpreempt": 1} and "started_at" in written
