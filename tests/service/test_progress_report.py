"""What a respawnkit trainer reported, shown (issue 27, part 2): ``respawn report``'s summary,
its losses table and its picture, and ``respawn status JOB``'s goodput line, give the step
reached, the steps lost per loss and in all, and the save cost with where it comes from."""

from __future__ import annotations

import io

from rich.console import Console

from controller.core import ledger
from controller.core.state import CheckpointRef, JobStatus, Phase
from controller.render import report, status_view
from tests.service.test_report import table_row, text_of
from tests.unit.test_ledger import at, commit
from tests.unit.test_progress import relaunched, running_attempt, said


def two_losses() -> JobStatus:
    """Preempted at step 130 and resumed from step 100, then lost again at step 210 and resumed
    from step 200; its saves reported: a 0.4 s write, a 5.8 s upload."""
    st = said(running_attempt(), 30, "preempted", step=130, save_s=0.4, upload_s=5.8, phase=Phase.RECOVERING)
    st = relaunched(st, 31, CheckpointRef(uri="gs://b/ckpt/step-100/", step=100, saved_at=at(25), write_s=9.0))
    st = commit(commit(st, (32, "inserted")), (34, "running"), phase=Phase.RUNNING)
    st = said(st, 60, "preempted", step=210, phase=Phase.RECOVERING)
    st = relaunched(st, 61, CheckpointRef(uri="gs://b/ckpt/step-200/", step=200, saved_at=at(58), write_s=9.0))
    return commit(commit(st, (62, "inserted")), (64, "running"), phase=Phase.RUNNING)


def at_width(renderable: object, width: int) -> list[str]:
    console = Console(width=width, file=io.StringIO(), record=True)
    console.print(renderable)
    return console.export_text().splitlines()


def test_the_report_shows_the_steps_lost_per_loss_and_in_all_and_the_reported_save():
    st = two_losses()
    text = text_of(report.render_text("llm", st, at(70)))
    assert table_row(text, "steps")[1] == "reached step 210; 40 lost (per loss: 30, 10)"
    assert table_row(text, "checkpoint")[1].endswith("a save takes 0.4s, then its upload 5.8s in the background")
    assert table_row(text, "save time from")[1].startswith("reported by the trainer")
    losses = text.split("\nlosses\n")[1]
    assert table_row(losses, "1") == ["1", "preempted", "01-01 00:30:00", "130", "step 100", "30", "4m"]
    assert table_row(losses, "2") == ["2", "preempted", "01-01 01:00:00", "210", "step 200", "10", "4m"]


def test_the_report_fits_80_columns_with_its_losses():
    lines = at_width(report.render_text("llm", two_losses(), at(70)), 80)
    assert max(len(line) for line in lines) <= 80
    losses = lines[lines.index("losses"):]
    assert losses[1].split() == ["attempt", "lost", "by", "step", "reached", "resumed", "from", "steps", "lost",
                                 "recovery"]  # only the loss's time gives way
    assert losses[2].split() == ["1", "preempted", "130", "step", "100", "30", "4m"]


def test_the_report_json_gives_the_measured_save_and_the_gcs_bound_apart():
    doc = report.as_json("llm", two_losses(), at(70))
    assert doc["checkpoint_cost"] == {"s": 0.4, "upload_s": 5.8, "source": "reported by the trainer", "at_least_s": 9.0}
    assert doc["summary"]["steps_lost"] == 40 and doc["summary"]["steps_lost_each"] == [30, 10]


def test_a_trainer_that_reports_nothing_shows_unknown_steps_and_the_gcs_bound_labelled():
    st = said(running_attempt(), 30, "preempted", phase=Phase.RECOVERING)
    st = relaunched(st, 31, CheckpointRef(uri="gs://b/ckpt/step-100/", step=100, saved_at=at(25), write_s=9.0))
    text = text_of(report.render_text("llm", st, at(40)))
    assert table_row(text, "steps")[1] == "not reported (a trainer using respawnkit reports its step)"
    assert table_row(text, "checkpoint")[1].endswith("a save takes at least 9s")
    assert "a lower bound from Cloud Storage" in table_row(text, "save time from")[1]
    assert table_row(text.split("\nlosses\n")[1], "1")[3:6] == ["—", "step 100", "—"]


def test_the_picture_marks_each_losss_steps_and_its_title_the_total(tmp_path):
    st = two_losses()
    assert [words for _, _, words in report.loss_notes(st.ledger)] == ["\u221230 steps", "\u221210 steps"]
    assert "40 steps lost" in report._title("llm", st, at(70))
    assert report.draw("llm", st, at(70), tmp_path / "t.png").read_bytes().startswith(b"\x89PNG")


def test_status_shows_the_step_the_steps_lost_and_the_save_with_its_source_within_80_columns():
    st = two_losses()
    row = {"job": "llm", "goodput": ledger.summary(st.ledger, at(70)).model_dump(mode="json"),
           "checkpoint_every_s": 600.0}
    line = " ".join(" ".join(at_width(status_view.goodput_line(row), 80)).split())
    assert "step 210 reached, 40 steps lost (30, 10)" in line
    assert "a save takes 0.4s (reported by the trainer), its upload 5.8s in the background" in line
    assert max(len(x) for x in at_width(status_view.goodput_line(row), 80)) <= 80
