"""``python -m bench.shards`` in small, so that it cannot rot: a fleet over K shards, each measured
shard's pass in a process of its own over the costly fakes (scaled down)."""

from __future__ import annotations

import json

from bench import shards


def test_every_shard_s_pass_sees_its_own_jobs_and_the_slowest_is_reported():
    found = shards.measure(jobs=120, k=4, which="all", scale=0.05, seed=2)
    assert found["shards_100k_k"] == 4 and found["shards_measured"] == [0, 1, 2, 3]
    assert sum(found["shards_jobs_per_shard"]) == found["shards_jobs"] == 120
    assert found["shards_pass_errors"] == 0
    assert found["shards_100k_max_pass_third_vcpu_s"] > 0 and found["shards_slowest_pass_requests"] > 0
    assert found["shards_method"].startswith(("measured", "computed"))


def test_the_command_prints_its_keys_and_writes_them_where_asked(tmp_path, capsys):
    out = tmp_path / "shards.json"
    assert shards.main(["--jobs", "40", "--shards", "2", "--scale", "0.05", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text()) and printed["shards_measured"] in ([0], [1])
