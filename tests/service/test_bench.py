"""The benchmark's code, run once at a tiny size with its latencies scaled down: it cannot rot.

It asserts behaviour only (every replacement insert issued, the figures produced); the
figures themselves come from ``make bench``.
"""

from __future__ import annotations

import bench.__main__ as bench


def test_bench_runs_at_a_tiny_size(capsys, tmp_path):
    assert bench.main(["--sizes", "20", "--quick", "--scale", "0.01", "--out", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "steady tick, 20 jobs" in out and "mass recovery, 20 preempted at once" in out and "event path" in out
    assert not (tmp_path / "r.json").exists()  # a smoke run writes no figures


def test_the_local_cloud_scenarios_run_at_a_tiny_size():
    """bench/local.py: the two functions in processes of their own, over the local servers."""
    from bench import local

    measured = local.run(10, workers=4, events=2, scale=0.01)
    assert measured["mass_recovery_jobs"] == 7 and measured["mass_recovery_issued"] == 7  # 70 % were running
    assert len(measured["event_latencies_s"]) == 2 and max(measured["event_latencies_s"]) < 30
