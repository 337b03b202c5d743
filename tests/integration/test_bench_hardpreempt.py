"""``python -m bench.hardpreempt`` in small: the probe runs end to end on the local cloud (every
latency a hundredth of Google's) and reports what it measured, each event timed from a hard
preemption to the replacement's insert received."""

from __future__ import annotations

from bench import hardpreempt


def test_the_probe_times_hard_preemptions_to_the_replacements_insert():
    lines: list[str] = []
    found = hardpreempt.measure(jobs=2, rounds=1, scale=0.01, say=lines.append)
    assert found["hard_preemption_events"] == 2 and len(lines) == 1
    assert 0 < found["hard_preemption_p50_s"] <= found["hard_preemption_p99_s"] <= found["hard_preemption_max_s"]
    # Seconds, through on_audit: the Scheduler runs once a minute here.
    assert found["hard_preemption_max_s"] < 30
