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
