"""What `respawn canary` makes of what it saw (controller/cli/canaryfigures.py): each span from two
times of one source, the lognormal each figure is summed up as, the table, and the file, which the
local cloud's realism model reads back (localcloud.realism.costs_from)."""

from __future__ import annotations

import io
import json
import math
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console
from rich.table import Table

from controller.cli import canaryfigures as figures
from controller.cli.canaryfigures import FIGURES, Preemption, Vm
from localcloud.realism import COSTS, Lognormal, Realism, costs_from

T0 = datetime(2026, 11, 28, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def preemption(job: str = "canary-abc123-1", halt: float = 1.5, insert: float = 20.0) -> Preemption:
    """A VM inserted at -100 s, preempted at 0: the notice seen at 0.4 s, recorded at 0.6 s, the
    standby decided at 2 s and inserted at 2.5 s; the soft-off at 120 s, the marker at 121 s, TERMINATED
    ``halt`` s after it; on_audit done with the System Event entry 4 s after it."""
    first = Vm(f"{job}-1", "us-central1-a", inserted=at(-100), running=at(-100 + insert), agent=at(-100 + insert + 9))
    standby = Vm(f"{job}-2", "us-central1-b", inserted=at(2.5), running=at(2.5 + insert), agent=at(2.5 + insert + 8))
    return Preemption(job, first, standby, notice_s=120, simulated=at(0), preempted=at(0.4), recorded=at(0.6),
                      decided=at(2.0), soft_off=at(120), stopping_seen=1000.0, terminated_seen=1003.0,
                      terminated=at(121 + halt), marker=at(121), audit_at=at(120), audit_handled=at(124))


def test_each_span_is_between_the_times_it_names():
    spans = {f.key: f.of(preemption()) for f in FIGURES}
    assert spans["notice_to_preempted_s"] == [pytest.approx(0.4)]
    assert spans["preempted_to_record_s"] == [pytest.approx(0.2)]
    assert spans["record_to_standby_s"] == [pytest.approx(1.4)]
    assert spans["record_to_insert_s"] == [pytest.approx(1.9)]
    assert spans["notice_to_insert_s"] == [pytest.approx(2.5)]
    assert spans["notice_to_soft_off_s"] == [pytest.approx(120)]
    assert spans["stopping_to_terminated_s"] == [pytest.approx(2.5)]  # Compute's times, not the polls' 3 s
    assert spans["marker_to_terminated_s"] == [pytest.approx(1.5)]
    assert spans["insert_to_running_s"] == [pytest.approx(20), pytest.approx(20)]  # both VMs
    assert spans["running_to_agent_s"] == [pytest.approx(9), pytest.approx(8)]
    assert spans["audit_to_handled_s"] == [pytest.approx(4)]


def test_stopping_to_terminated_falls_back_on_the_polls_only_without_compute_s_times():
    p = preemption()
    p.soft_off = None
    assert FIGURES[6].key == "stopping_to_terminated_s" and FIGURES[6].of(p) == [pytest.approx(3.0)]


def test_a_time_not_seen_leaves_its_spans_unmeasured_never_guessed():
    p = preemption()
    p.terminated, p.terminated_seen, p.standby = None, None, None  # deleted before TERMINATED; no standby seen
    spans = {f.key: f.of(p) for f in FIGURES}
    assert spans["marker_to_terminated_s"] == [None] and spans["stopping_to_terminated_s"] == [None]
    assert spans["notice_to_insert_s"] == [None] and spans["insert_to_running_s"] == [pytest.approx(20)]


def test_a_span_between_two_clocks_is_refused():
    with pytest.raises(TypeError):
        figures.span(at(0), 1000.0)


def test_a_summary_fits_a_lognormal_whose_p99_lies_beyond_the_samples():
    s = figures.summary([10.0, 20.0, 40.0])
    logs = [math.log(x) for x in (10.0, 20.0, 40.0)]
    sigma = math.sqrt(sum((x - sum(logs) / 3) ** 2 for x in logs) / 2)
    assert (s.n, s.median, s.max) == (3, 20.0, 40.0)
    assert s.p99 == pytest.approx(20.0 * math.exp(figures.Z99 * sigma))  # the geometric mean is 20 here
    assert s.p99 > 40.0


def test_one_sample_or_one_not_positive_fits_no_lognormal_its_largest_stands_for_the_p99():
    assert figures.summary([3.0]) == figures.Summary(1, 3.0, 3.0, 3.0)
    assert figures.summary([-0.01, 0.02, 0.05]) == figures.Summary(3, 0.02, 0.05, 0.05)
    assert figures.summary([]) is None


def test_the_file_gives_the_realism_model_its_costs_and_keeps_every_figure_and_span():
    seen = [preemption(halt=1.0, insert=18.0), preemption("canary-abc123-2", halt=2.0, insert=22.0)]
    doc = figures.document(seen, project="p-1", zones=("us-central1-a", "us-central1-b"), machine_type="e2-small",
                           taken_at=T0)
    assert doc["respawn_canary"] == 1 and doc["notice_s"] == 120 and doc["zones"] == ["us-central1-a", "us-central1-b"]
    assert set(doc["costs"]) == {"insert_running", "poweroff_after_marker"}
    assert doc["costs"]["poweroff_after_marker"]["median"] == 1.5
    assert doc["figures"]["insert_to_running_s"]["n"] == 4
    assert set(doc["figures"]) == {f.key for f in FIGURES}
    assert [row["spans"]["marker_to_terminated_s"] for row in doc["preemptions"]] == [1.0, 2.0]
    assert doc["preemptions"][0]["spans"]["insert_to_running_s"] == [18.0, 18.0]
    json.dumps(doc)  # the file is JSON as it stands


def test_the_file_loads_back_into_the_realism_model(tmp_path):
    seen = [preemption(halt=1.0), preemption("canary-abc123-2", halt=2.0)]
    path = tmp_path / "canary.json"
    path.write_text(json.dumps(figures.document(seen, project="p-1", zones=("us-central1-a",),
                                                machine_type="e2-small", taken_at=T0)))
    costs = costs_from(path)
    halt = costs.poweroff_after_marker
    assert halt.median == 1.5 and halt.p99 > 2.0 and costs.insert_running == Lognormal(20.0, 20.0)
    assert costs.gcs_request == COSTS.gcs_request  # what the canary does not measure stays ours
    realism = Realism.from_canary(path)
    assert realism.insert_seconds == 20.0 and realism.halt_seconds == halt


def test_a_figure_nothing_measured_gives_the_realism_model_nothing():
    p = preemption()
    p.marker = None
    doc = figures.document([p], project="p-1", zones=("us-central1-a",), machine_type="e2-small", taken_at=T0)
    assert "poweroff_after_marker" not in doc["costs"] and doc["figures"]["marker_to_terminated_s"] is None


def test_the_table_fits_80_columns():
    seen = [preemption(), preemption("canary-abc123-2", halt=12.345, insert=123.4)]
    table = Table("figure", "n", "median", "p99", "max")
    for row in figures.table_rows(seen):
        table.add_row(*row)
    buffer = io.StringIO()
    Console(file=buffer, width=200).print(table)
    lines = buffer.getvalue().splitlines()
    assert len(lines) == len(FIGURES) + 4 and max(len(line) for line in lines) <= 80
    assert all(len(f.label) <= 34 for f in FIGURES)
    [unmeasured] = [r for r in figures.table_rows([Preemption("j", Vm("j-1", "z"))]) if r[0] == "insert → RUNNING"]
    assert unmeasured == ("insert → RUNNING", "0", "—", "—", "—")


def test_a_preemption_is_timed_only_when_recorded_stood_in_for_and_watched_to_the_end():
    assert preemption().timed
    halted = preemption()
    halted.terminated = halted.terminated_seen = None  # deleted before TERMINATED: a figure missing, said
    assert halted.timed
    for change in ({"recorded": None}, {"standby": None}, {"cut_short": True}):
        p = preemption()
        for key, value in change.items():
            setattr(p, key, value)
        assert not p.timed, change
