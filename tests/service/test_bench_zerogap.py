"""``python -m bench.zerogap`` in small: the downtime model's three designs over a few draws.

Behaviour only, on the model's own clock (no wall time): each design does what it stands for
(today's inserts after the marker and never a standby; the notice's standby boots beside the saving
VM and gets its go after the marker), the three meet the same draws, and the keys are written."""

from __future__ import annotations

import json

import pytest

from bench import zerogap
from controller.core.state import Phase

MODEL = zerogap.Model()


@pytest.fixture(scope="module")
def found() -> dict[str, list[zerogap.Outcome]]:
    return zerogap.measure(preemptions=4, seed=3, model=MODEL)


def played(design: str, index: int = 0) -> zerogap.Recovery:
    recovery = zerogap.Recovery(design, index, MODEL, seed=3)
    recovery.run()
    return recovery


def test_the_three_designs_meet_the_same_draws(found):
    for serial, notice0, notice120 in zip(*(found[d] for d in zerogap.DESIGNS), strict=True):
        assert serial.boot_s == notice0.boot_s == notice120.boot_s
        assert MODEL.boot[0] <= serial.boot_s <= MODEL.boot[1]
    assert len({o.boot_s for o in found["serial"]}) == 4  # a draw per preemption, not one for all


def test_today_s_design_inserts_the_replacement_after_the_marker_and_boots_it_then(found):
    recovery = played("serial")
    events = [e.event for e in recovery.status().history]
    assert "standby" not in events and "standby-inserted" not in events
    preempted = next(e for e in recovery.status().history if e.event == "preempted")
    assert "marker" in preempted.detail
    o = found["serial"][0]
    assert o.marker_saved and o.sigterm_save == "landed" and o.steps_lost == 0
    # The replacement's insert came after the save (SIGTERM at the soft-off, then the save), and its
    # whole boot comes after that: the downtime is the save, the marker's way, and the boot.
    assert o.insert_after_preemption_s > MODEL.save_s
    assert o.downtime_s > MODEL.save_s + o.boot_s


def test_without_notice_the_standby_boots_while_the_old_vm_saves(found):
    recovery = played("notice0")
    st = recovery.status()
    assert st.attempt == 2 and st.phase != Phase.FAILED
    events = [e.event for e in st.history]
    assert events.index("standby-inserted") < events.index("preempted")  # booting before the marker came
    for serial, o in zip(found["serial"], found["notice0"], strict=True):
        assert o.insert_after_preemption_s < MODEL.save_s  # at the notice record, not after the save
        assert o.boot_s < o.downtime_s < serial.downtime_s
        assert o.resumed_step == o.last_step  # the SIGTERM save, resumed from


def test_with_the_120s_notice_the_standby_waits_at_the_line_and_the_boot_is_hidden(found):
    recovery = played("notice120")
    st = recovery.status()
    go = next(e for e in st.history if e.event == "launch" and "giving the go" in e.detail)
    marker = next(e for e in st.history if e.event == "preempted")
    assert go.at >= marker.at  # the go only once the old VM's save is in
    for o in found["notice120"]:
        assert o.insert_after_preemption_s < 10  # inserted at the notice
        assert o.downtime_s < o.boot_s  # its boot was over before the save was
        assert o.downtime_s > MODEL.save_s  # the save is what is left
        assert o.steps_lost == 0 and o.sigterm_save == "landed"


def test_a_run_alone_writes_its_keys_to_a_file_of_its_own_with_its_provenance(tmp_path):
    out = tmp_path / "zerogap-run.json"
    assert zerogap.main(["--preemptions", "2", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    for key in ("boot_model_p50_s", "save_model_s", "downtime_serial_p50_s", "downtime_notice0_p50_s",
                "downtime_notice0_p99_s", "downtime_notice120_p50_s", "downtime_notice120_p99_s",
                "steps_lost_notice120_p50", "steps_lost_notice0_p50", "downtime_note"):
        assert key in written, key
    assert written["boot_model_p50_s"] == 90.0 and written["downtime_model"]["preemptions"] == 2
    assert written["commit"] and written["seeds"] == {"zerogap": 1} and "zerogap" in written["scenarios"]
    assert written["downtime_notice120_p50_s_target"] == {
        "at_most": MODEL.save_s + 10, "met": written["downtime_notice120_p50_s"] <= MODEL.save_s + 10}
    assert "downtime_notice0_p50_s" in written["targets"]["met"] + written["targets"]["missed"]
