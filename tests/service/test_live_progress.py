"""The live step between losses (issue 27, part 2): status.json is written on events only, so
``respawn status`` and ``respawn report`` read a RUNNING job's heartbeat for the step its trainer
is at now and its latest save's times, counted only when the beat is its current attempt's, with
its token; the beat's fields are third-party values and never crash the view."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console
from typer.testing import CliRunner

from controller.cli.main import app
from controller.core import names
from controller.core.state import Event, JobStatus, Phase
from controller.render import status_view as view
from controller.service.jobs import MAX_LIVE_READS, Jobs
from controller.core.policy import ControllerPolicy
from tests.harness import BUCKET, PROJECT, Harness, under_cli
from tests.service.test_report import table_row

runner = CliRunner()
TOKEN = "s3cret-token"
BEAT = {"attempt": 3, "token": TOKEN, "instance": "llm-3-0", "step": 1234, "save_s": 0.41, "upload_s": 5.8,
        "saved_step": 1200}


@pytest.fixture
def mem(monkeypatch) -> Harness:
    h = under_cli(monkeypatch, 80)
    # The store stamps each write with its clock: 12 s before the CLI reads it.
    h.clock.advance(datetime.now(UTC) - h.clock.now() - timedelta(seconds=12))
    return h


def running(h: Harness, job: str = "llm", attempt: int = 3, phase: Phase = Phase.RUNNING) -> None:
    h.submit(job)
    at = h.clock.now() - timedelta(hours=1)
    st = JobStatus(created_at=at, phase=phase, attempt=attempt, attempt_token=TOKEN, zone="us-central1-a",
                   provisioning="spot", instances=(f"{job}-{attempt}-0",),
                   history=(Event(at=at, event="running", detail=f"{job}-{attempt}-0 running in us-central1-a"),))
    h.store.put(BUCKET, names.status_key(job), st.to_json())


def beat(h: Harness, job: str = "llm", body: object = BEAT) -> None:
    h.store.put(BUCKET, names.heartbeat_key(job), body if isinstance(body, bytes) else json.dumps(body))


def flat(text: str) -> str:
    return " ".join(text.split())


def test_a_running_jobs_step_from_its_heartbeat_is_in_the_table_the_job_and_the_report(mem):
    running(mem)
    beat(mem)
    table = runner.invoke(app, ["status"])
    assert table.exit_code == 0, table.output
    header, row = table.output.splitlines()[:2]
    assert header.split()[-2:] == ["STEP", "AGE"] and "1,234 (12s ago)" in row
    assert max(len(line) for line in table.output.splitlines()) <= 80
    one = runner.invoke(app, ["status", "llm"])
    assert ("now at step 1,234; its last save took 0.41s to write, 5.8s to upload; step 1,200 uploaded "
            "(reported by the trainer in its heartbeat, 12s ago)") in flat(one.output)
    assert max(len(line) for line in one.output.splitlines()) <= 80
    report = runner.invoke(app, ["report", "llm"], env={"COLUMNS": "200"})
    assert report.exit_code == 0, report.output
    assert table_row(report.output, "steps")[1] == ("now at step 1,234 (reported by the trainer in its heartbeat, "
                                                   "12s ago)")
    assert table_row(report.output, "latest save")[1] == ("0.41s to write, 5.8s to upload; step 1,200 uploaded "
                                                         "(reported by the trainer in its heartbeat, 12s ago)")
    narrow = runner.invoke(app, ["report", "llm"]).output
    assert max(len(line) for line in narrow.splitlines()) <= 80
    live = json.loads(runner.invoke(app, ["report", "llm", "--json"]).output)["live"]
    assert live["step"] == 1234 and live["upload_s"] == 5.8 and live["source"] == "reported by the trainer"
    rows = json.loads(runner.invoke(app, ["status", "--json"]).output)
    assert rows[0]["live"]["step"] == 1234 and rows[0]["live_unread"] is False


@pytest.mark.parametrize("body", [{**BEAT, "attempt": 2}, {**BEAT, "token": "forged"},
                                  {k: v for k, v in BEAT.items() if k != "token"}])
def test_a_heartbeat_of_another_attempt_or_without_the_attempts_token_is_ignored(mem, body):
    running(mem)
    beat(mem, body=body)
    jobs = Jobs(mem.store, BUCKET, ControllerPolicy(default_project=PROJECT))
    assert jobs.live("llm", jobs.status("llm")) is None
    table = runner.invoke(app, ["status"])
    assert table.exit_code == 0 and "STEP" not in table.output and "1,234" not in table.output
    assert "1,234" not in runner.invoke(app, ["status", "llm"]).output
    report = runner.invoke(app, ["report", "llm"])
    assert "now at step" not in report.output and "latest save" not in report.output
    assert json.loads(runner.invoke(app, ["report", "llm", "--json"]).output)["live"] is None


def test_a_job_not_running_shows_no_live_step_even_with_a_matching_beat(mem):
    running(mem, phase=Phase.RECOVERING)
    beat(mem)
    assert "1,234" not in runner.invoke(app, ["status", "llm"]).output
    assert not any(op == "read" and name == names.heartbeat_key("llm") for op, name in mem.store.calls)


GARBAGE = [
    b"not json", b"[1, 2]", b"null", b'{"attempt": 3, "token": "' + TOKEN.encode() + b'", "step": ' + b"9" * 5000 + b"}",
    b"{" * 100_000,
    {**BEAT, "step": "1234", "save_s": "fast", "upload_s": [1], "saved_step": {"a": 1}},
    {**BEAT, "step": True, "save_s": -1, "upload_s": 1e999, "saved_step": 1.5},
    {**BEAT, "step": 10**30, "save_s": 10**400, "upload_s": None, "saved_step": -3},
    {**BEAT, "attempt": "3"}, {**BEAT, "token": 7}, b" " * (70 * 1024),
]


@pytest.mark.parametrize("body", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_in_a_heartbeat_never_crashes_the_views_and_shows_nothing_of_it(mem, body):
    running(mem)
    beat(mem, body=body)
    for args in (["status"], ["status", "llm"], ["report", "llm"], ["status", "--json"], ["report", "llm", "--json"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, (args, result.output)
        assert "now at step" not in result.output and "STEP" not in result.output and "latest save" not in result.output


def test_a_heartbeats_sane_fields_show_and_its_garbage_ones_do_not(mem):
    running(mem)
    beat(mem, body={**BEAT, "save_s": "fast", "upload_s": float("nan"), "saved_step": "x"})
    said = flat(runner.invoke(app, ["status", "llm"]).output)
    assert "now at step 1,234 (reported by the trainer in its heartbeat, 12s ago)" in said
    assert "last save" not in said and "uploaded" not in said


def test_rows_that_are_not_what_the_cli_builds_never_crash_the_view():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for live in (None, 7, "step 5", [1], {"step": "5"}, {"step": 5, "at": 12}, {"step": 5, "at": "2026-01-01"},
                 {"step": 10**5000}, {"save_s": float("inf"), "saved_step": True}, {"step": 5, "at": "9" * 10_000},
                 {"step": 5, "save_s": 10**400, "upload_s": float("nan"), "saved_step": -1}):
        row = {"job": "j", "phase": "RUNNING", "attempt": 1, "preemptions": 0, "failures": 0, "zone": None,
               "provisioning": None, "instance": None, "instance_id": None, "checkpoint_label": None,
               "checkpoint_error": None, "age_seconds": None, "last_event": "", "live": live}
        console = Console(width=80, record=True, file=io.StringIO())
        console.print(view.StatusView([row], clock=lambda: now))
        note = view.live_line(row, now)
        assert note is None or note.text in ("now at step 5 (reported by the trainer in its heartbeat)",
                                             "now at step 5 (reported by the trainer in its heartbeat, 12s ago)")
        assert ("5" in console.export_text().splitlines()[1]) == (note is not None)


def test_the_table_gives_up_the_beats_age_then_the_step_as_it_narrows(mem):
    now = datetime(2026, 1, 1, tzinfo=UTC)
    live = {"step": 1234, "at": (now - timedelta(seconds=12)).isoformat()}
    row = {"job": "llm-finetune-long", "phase": "RUNNING", "attempt": 3, "preemptions": 2, "failures": 0,
           "zone": "us-central1-a", "provisioning": "spot", "instance": "llm-finetune-long-3-0",
           "instance_id": None, "checkpoint_label": "step 1200", "checkpoint_error": None, "age_seconds": 3600,
           "last_event": "running", "live": live}
    shown = {}
    for width in (80, 73, 64):
        console = Console(width=width, record=True, file=io.StringIO())
        console.print(view.StatusView([row], clock=lambda: now))
        lines = console.export_text().splitlines()
        assert max(len(line) for line in lines) <= width
        shown[width] = (lines[0].split(), lines[1].split())
    assert shown[80] == (["JOB", "PHASE", "LOSSES", "ZONE", "CHECKPOINT", "STEP"],
                         ["llm-finetune-long", "RUNNING", "2p/0f", "us-central1-a", "step", "1200", "1,234", "(12s",
                          "ago)"])
    assert shown[73] == (["JOB", "PHASE", "LOSSES", "ZONE", "CHECKPOINT", "STEP"],
                         ["llm-finetune-long", "RUNNING", "2p/0f", "us-central1-a", "step", "1200", "1,234"])
    assert shown[64][0] == ["JOB", "PHASE", "LOSSES", "ZONE", "CHECKPOINT"]
    # With no live step anywhere, the layouts are those the table had before it had a STEP.
    assert view.without_step() == (
        ("job", "phase", "attempt", "preempted", "failed", "zone_model", "instance_id", "checkpoint", "age"),
        ("job", "phase", "attempt", "preempted", "failed", "zone_model", "instance", "checkpoint", "age"),
        ("job", "phase", "attempt", "losses", "zone_model", "instance", "checkpoint", "age"),
        ("job", "phase", "attempt", "losses", "zone_model", "checkpoint", "age"),
        ("job", "phase", "losses", "zone_model", "checkpoint", "age"),
        ("job", "phase", "losses", "zone", "checkpoint", "age"),
        ("job", "phase", "losses", "zone", "checkpoint"),
        ("job", "phase", "losses", "zone"),
        ("job", "phase", "zone"),
        ("job", "phase"),
    )


def test_the_fleet_table_reads_at_most_the_bound_of_heartbeats_and_says_so(mem):
    jobs = [f"job-{i:03}" for i in range(MAX_LIVE_READS + 3)]
    for job in jobs:
        running(mem, job)
        beat(mem, job)
    mem.store.calls.clear()
    table = runner.invoke(app, ["status"])
    assert table.exit_code == 0, table.output
    read = [name for op, name in mem.store.calls if op == "read" and name.endswith("/heartbeat")]
    assert len(read) == MAX_LIVE_READS and sorted(read) == [names.heartbeat_key(j) for j in jobs[:MAX_LIVE_READS]]
    assert "3 more not read (respawn status JOB shows a job's)" in flat(table.output)
    rows = {r["job"]: r for r in json.loads(runner.invoke(app, ["status", "--json"]).output)}
    assert rows[jobs[-1]]["live"] is None and rows[jobs[-1]]["live_unread"] is True
    assert rows[jobs[0]]["live"]["step"] == 1234
    assert "now at step 1,234" in flat(runner.invoke(app, ["status", jobs[-1]]).output)  # one job: always read
