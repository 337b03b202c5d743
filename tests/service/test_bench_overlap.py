"""``python -m bench.overlap`` in small, so that it cannot rot: ticks that outlive their period over
the costly fakes (scaled down), with and without the lease."""

from __future__ import annotations

import json

from bench import overlap


def test_ticks_that_outlive_their_period_never_overlap_with_the_lease_and_do_without_it():
    found = overlap.measure(jobs=30, count=5, scale=0.2, seed=3)
    assert found["overlapping_passes"] == 0
    assert found["overlap_passes_run"] + found["overlap_ticks_skipped"] == found["overlap_ticks"] == 5
    assert found["overlap_ticks_skipped"] >= 1 and found["overlap_passes_run"] >= 1
    assert found["overlapping_passes_without_lease"] >= 2 and found["overlap_passes_run_without_lease"] == 5
    assert found["overlap_period_s"] < found["overlap_tick_s"]


def test_the_command_prints_its_keys_and_writes_them_where_asked(tmp_path, capsys):
    out = tmp_path / "overlap.json"
    assert overlap.main(["--jobs", "10", "--ticks", "3", "--scale", "0.1", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text()) and printed["overlapping_passes"] == 0
