"""``python -m bench.notice`` in small: preemptions with Google's notice on the local cloud (every
latency a hundredth of Google's, the 120 s notice lasting 5 s), each timed from ``instance/preempted``
turning TRUE to the standby's insert received, each standby begun by the agent's notice record."""

from __future__ import annotations

from bench import notice


def test_the_probe_times_each_notice_to_its_standbys_insert_through_the_notice_record():
    lines: list[str] = []
    found = notice.measure(jobs=2, rounds=1, scale=0.01, notice_s=5.0, say=lines.append)
    assert found["notice_to_insert_events"] == 2 and len(lines) == 1
    assert found["notice_to_insert_via"] == {"notice record": 2}  # never left to Compute's soft-off
    assert 0 < found["notice_to_insert_p50_s"] <= found["notice_to_insert_p99_s"] <= found["notice_to_insert_max_s"]
    assert found["notice_to_insert_cold_share"] == 0.0
    assert found["notice_to_insert_cold_modelled_p99_s"] >= found["notice_to_insert_p99_s"]
