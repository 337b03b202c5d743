"""``respawn dashboard`` over the in-memory fakes: its pages, JSON and /metrics say every field, escape
every hostile name, message and zone, read the bucket at a bounded rate however many pages poll,
refuse a POST from anywhere but its own page, and bind loopback unless told otherwise."""

from __future__ import annotations

import html
import io
import json
import os
import re
import shlex
import signal
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from controller.cli.main import app as cli
from controller.core import names
from controller.core.ledger import Ledger, Mark, Span, Totals
from controller.core.state import Event, JobStatus, Phase
from controller.dashboard import guard as guards
from controller.dashboard import serving
from controller.dashboard.guard import TOKEN_HEADER, Guard
from controller.dashboard.server import create_app
from controller.dashboard.snapshot import Fleet
from controller.service import bootstrap
from controller.service.config import Settings
from controller.service.jobs import Jobs
from tests.harness import BUCKET, PROJECT, TRAINER, Harness, spec_doc

PORT = 8642
BASE = f"http://127.0.0.1:{PORT}"
NOW = datetime(2026, 1, 1, 3, tzinfo=UTC)
EVIL_JOB = "<img src=x onerror=alert(1)>\"'&"  # no "/": a job is a folder of the bucket
EVIL_TEXT = "<script>alert(1)</script>"
EVIL_ZONE = "us-\"central1'-a<b>"


class Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def h() -> Harness:
    return Harness()


def _keyed(client, guard: Guard):
    """A client that sends the dashboard's key with every request, as a scraper would (a browser's cookie:
    the tests of who may enter)."""
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {guard.key}"
    return client


def _dashboard(h: Harness, interval: float = 5.0, clock: Ticks | None = None):
    guard = Guard()
    guard.bound("127.0.0.1", PORT)
    fleet = Fleet(Jobs(h.store, BUCKET, h.policy), interval, clock or Ticks(), wall=lambda: NOW)
    app = create_app(fleet, guard, interval, now=lambda: NOW)
    return _keyed(app.test_client(), guard), guard, fleet


def _running(h: Harness, job: str = "train") -> None:
    h.submit(job)
    h.tick()
    h.tick()
    assert h.status(job).phase == Phase.RUNNING


def _hostile(h: Harness) -> None:
    """A job whose name, message, history and zones are all markup."""
    start = NOW - timedelta(hours=2)
    span = Span(attempt=1, zone=EVIL_ZONE, model="spot", accelerators=1, per_hour=1.0, on_demand_per_hour=3.0,
                start=start, inserted=start, running=start + timedelta(minutes=2), end=NOW - timedelta(hours=1),
                cause="preempted")
    book = Ledger(spans=(span,), totals=Totals(attempts=1, paid_acc_s=3600, boot_acc_s=120, running_s=3480, cost=1.0,
                                               on_demand_cost=3.0, losses={EVIL_ZONE: {"preempted": 1}},
                                               stockouts={EVIL_ZONE: 2}))
    status = JobStatus(created_at=start, phase=Phase.RECOVERING, attempt=1, zone=EVIL_ZONE, provisioning="spot",
                       message=EVIL_TEXT, ledger=book,
                       history=(Event(at=start, event="preempted", attempt=1, detail=EVIL_TEXT),))
    h.store.put(BUCKET, names.spec_key(EVIL_JOB), "zones: [us-central1-a]")
    h.store.put(BUCKET, names.status_key(EVIL_JOB), status.to_json())


def _job_url(job: str) -> str:
    from urllib.parse import quote

    return "/jobs/" + quote(job, safe="")


# -- the pages say every field ----------------------------------------------------------------------

def test_the_fleet_page_has_one_row_per_job_with_every_cell_and_the_totals(h):
    _running(h)
    h.submit("waiting")
    client, _, _ = _dashboard(h)
    page = client.get("/", base_url=BASE)
    assert page.status_code == 200
    text = page.get_data(as_text=True)
    assert '<table id="jobs">' in text and '<select id="phase-filter">' in text and 'id="updated"' in text
    assert '<tr data-job="train"' in text and '<tr data-job="waiting"' in text
    row = re.search(r'<tr data-job="train".*?</tr>', text, re.S).group()
    for cell in ("phase", "attempt", "zone", "step", "age", "goodput", "cost", "event"):
        assert f'<td class="{cell}"' in row, cell
        assert f'<th data-sort="{cell}"' in text
    assert ">RUNNING<" in row and "us-central1-a (spot)" in row
    assert '<option value="">all</option>' in text and '<option value="RUNNING">RUNNING</option>' in text
    assert '<option value="SUCCEEDED">SUCCEEDED</option>' in text  # every phase, whether a job is in it or not
    for figure in ("total-running", "total-week", "total-goodput", "total-cost", "total-saved"):
        assert f'id="{figure}"' in text
    assert 'href="/static/fleet.js"' not in text and 'src="/static/fleet.js"' in text  # its own asset
    assert "http://" not in text.replace(BASE, "") and "https://" not in text  # nothing from elsewhere


def test_the_fleet_json_has_every_job_its_cells_and_when_it_was_read(h):
    _running(h)
    client, _, _ = _dashboard(h)
    data = client.get("/api/jobs", base_url=BASE).get_json()
    assert data["updated"] == "2026-01-01T03:00:00Z"
    (job,) = data["jobs"]
    assert job["job"] == "train" and job["phase"] == "RUNNING" and job["attempt"] == 1
    assert set(job["cells"]) == {"phase", "attempt", "zone", "step", "age", "goodput", "cost", "event"}
    assert data["totals"]["accelerators_running"] == 1  # g2-standard-8: one L4
    assert set(data["totals"]["text"]) == {"accelerators_running", "accelerator_hours_week", "goodput", "cost", "saved"}


def test_the_fleet_json_stays_small_at_3000_jobs_its_rows_only_what_the_page_shows(h):
    import dataclasses

    from controller.dashboard.snapshot import Snapshot

    _running(h)
    client, _, fleet = _dashboard(h)
    one = fleet.snapshot()
    view = one.jobs["train"]
    many = {f"job-{i:05d}": dataclasses.replace(view, row=dataclasses.replace(view.row, job=f"job-{i:05d}"))
            for i in range(3000)}
    fleet.snapshot = lambda: Snapshot(many, one.at)
    answer = client.get("/api/jobs", base_url=BASE)
    rows = answer.get_json()["jobs"]
    assert len(rows) == 3000 and set(rows[0]) == {"job", "phase", "attempt", "problem", "cells", "sort"}
    assert len(answer.data) < 3000 * 400  # it was 1,550 bytes a row: 15 MB every poll at 10,000 jobs


def test_a_name_holding_only_what_a_trainer_writes_is_no_job_on_any_page_nor_in_the_metrics(h):
    _running(h)
    for key in (names.heartbeat_key, names.exit_key, names.notice_key, names.ready_key):
        h.store.put(BUCKET, key("forged"), b'{"step": 1}')  # a trainer may write these, under any name
    h.store.put(BUCKET, names.node_exit_key("forged", 1), b"{}")
    client, _, _ = _dashboard(h)
    assert [row["job"] for row in client.get("/api/jobs", base_url=BASE).get_json()["jobs"]] == ["train"]
    assert 'data-job="forged"' not in client.get("/", base_url=BASE).get_data(as_text=True)
    for path in ("/jobs/forged", "/api/jobs/forged", "/api/jobs/forged/logs", "/jobs/forged/timeline.png"):
        assert client.get(path, base_url=BASE).status_code == 404, path
    metrics = client.get("/metrics", base_url=BASE).get_data(as_text=True)
    jobs = {s.labels["phase"]: s.value for f in text_string_to_metric_families(metrics) if f.name == "respawn_jobs"
            for s in f.samples}
    assert jobs["RUNNING"] == 1 and jobs["SUBMITTED"] == 0 and sum(jobs.values()) == 1


def test_fleet_totals_count_preemptions_and_stockouts_by_zone_and_money(h):
    _hostile(h)
    client, _, _ = _dashboard(h)
    totals = client.get("/api/jobs", base_url=BASE).get_json()["totals"]
    assert totals["zones"] == {EVIL_ZONE: {"preemptions": 1, "stockouts": 2}}
    assert totals["cost"] == 1.0 and totals["saved"] == 2.0
    assert totals["accelerator_hours_week"] == 1.0 and totals["accelerators_running"] == 0


def test_the_job_page_has_its_timeline_ledger_history_logs_command_and_actions(h):
    _running(h)
    client, _, _ = _dashboard(h)
    text = client.get("/jobs/train", base_url=BASE).get_data(as_text=True)
    assert "<h1>train</h1>" in text and '<span id="phase" class="phase">RUNNING</span>' in text
    assert '<img id="timeline"' in text and 'src="/jobs/train/timeline.png?g=' in text
    assert '<table id="ledger">' in text and "us-central1-a" in re.search(r'<table id="ledger">.*?</table>', text, re.S).group()
    history = re.search(r'<ol id="history">(.*?)</ol>', text, re.S).group(1)
    assert history.count("<li>") == len(h.status("train").history) >= 2
    assert '<code id="logs-command">respawn logs train --follow</code>' in text
    for element in ('<button id="cancel"', '<button id="resubmit"', '<dialog id="confirm">', '<button id="confirm-yes"',
                    '<button id="confirm-no"', 'id="flash"'):
        assert element in text, element
    assert "g2-standard-8" in re.search(r'<pre id="spec">.*?</pre>', text, re.S).group()
    picture = client.get("/jobs/train/timeline.png", base_url=BASE)
    assert picture.status_code == 200 and picture.mimetype == "image/png" and picture.data[:4] == b"\x89PNG"


def test_a_status_whose_times_cannot_be_drawn_gives_its_timeline_a_picture_of_one_line_never_a_500(h):
    _running(h)
    st = h.status("train")
    book = st.ledger.model_copy(update={"marks": (Mark(at=datetime(9999, 12, 31, tzinfo=UTC), kind="stockout",
                                                       zone="us-central1-a"),)})
    h.store.put(BUCKET, names.status_key("train"), st.model_copy(update={"ledger": book}).to_json())  # by hand
    client, _, _ = _dashboard(h)
    picture = client.get("/jobs/train/timeline.png", base_url=BASE)
    assert picture.status_code == 200 and picture.mimetype == "image/png" and picture.data[:4] == b"\x89PNG"
    assert client.get("/jobs/train", base_url=BASE).status_code == 200


def test_the_job_json_has_its_phase_history_newest_last_and_tables(h):
    _running(h)
    client, _, _ = _dashboard(h)
    data = client.get("/api/jobs/train", base_url=BASE).get_json()
    assert data["phase"] == "RUNNING" and data["logs_command"] == "respawn logs train --follow"
    events = [e["event"] for e in data["history"]]
    assert events == [e.event for e in h.status("train").history]
    assert data["attempts"] and data["facts"] and data["spec_generation"]
    assert client.get("/api/jobs/nope", base_url=BASE).status_code == 404
    assert client.get("/jobs/nope", base_url=BASE).status_code == 404


def test_an_unknown_jobs_page_is_a_page_saying_so_with_the_job_meant_and_the_api_stays_json(h):
    """Issue 39: the dashboard's page for an unknown job was JSON."""
    _running(h)
    client, _, _ = _dashboard(h)
    page = client.get("/jobs/trian", base_url=BASE)
    assert page.status_code == 404 and page.mimetype == "text/html"
    text = page.get_data(as_text=True)
    assert "no job named trian" in text and "Did you mean train?" in text and 'href="/"' in text
    api = client.get("/api/jobs/trian", base_url=BASE)
    assert api.status_code == 404 and api.get_json() == {"error": "no such job or page"}
    other = client.get("/nowhere", base_url=BASE)
    assert other.status_code == 404 and other.mimetype == "text/html" and "no such page" in other.get_data(as_text=True)


def test_a_bucket_that_does_not_answer_is_a_503_saying_so_and_the_poll_after_the_interval_reads_again(h):
    from controller.core import errors

    _running(h)
    clock = Ticks()
    client, _, _ = _dashboard(h, clock=clock)
    real = h.store.list
    listings = []
    h.store.list = lambda *a, **k: listings.append(1) or (_ for _ in ()).throw(errors.TransientError("503 from GCS"))
    for _ in range(10):  # ten pages polling within one interval: one listing, the same error for all
        failed = client.get("/api/jobs", base_url=BASE)
        assert failed.status_code == 503 and "503 from GCS" in failed.get_json()["error"]
    assert len(listings) == 1
    h.store.list = real
    clock.t += 5
    assert client.get("/api/jobs", base_url=BASE).get_json()["jobs"][0]["job"] == "train"


def test_one_jobs_unreadable_status_flags_its_row_and_keeps_the_last_one_read_the_fleet_still_shows(h):
    from controller.core import errors

    for job in ("eval", "train"):
        _running(h, job)
    clock = Ticks()
    client, _, _ = _dashboard(h, clock=clock)
    client.get("/api/jobs", base_url=BASE)
    real = h.store.read

    def read(bucket, key, *a, **k):
        if key == names.status_key("train"):
            raise errors.TransientError("503 backend error")
        return real(bucket, key, *a, **k)
    h.store.read = read
    h.store.put(BUCKET, names.status_key("train"), real(BUCKET, names.status_key("train")).data)  # a pass wrote it
    clock.t += 5
    shown = client.get("/api/jobs", base_url=BASE)
    assert shown.status_code == 200
    rows = {row["job"]: row for row in shown.get_json()["jobs"]}
    assert rows["train"]["phase"] == "RUNNING" and "503 backend error" in rows["train"]["problem"]
    assert "status unreadable" in rows["train"]["cells"]["event"] and rows["eval"]["problem"] is None
    h.store.read = real
    clock.t += 5
    assert {row["job"]: row for row in client.get("/api/jobs", base_url=BASE).get_json()["jobs"]}["train"]["problem"] is None


def test_a_quiet_fleet_costs_one_listing_per_interval_and_no_checkpoint_listing(h):
    for i in range(20):
        h.submit(f"job{i}")
    h.tick()
    h.tick()
    clock = Ticks()
    client, _, _ = _dashboard(h, clock=clock)
    client.get("/api/jobs", base_url=BASE)
    h.store.calls.clear()
    for _ in range(24):  # two minutes, one page polling, nothing written
        clock.t += 5
        client.get("/api/jobs", base_url=BASE)
    assert _reads(h) == [("list", names.JOBS_PREFIX)] * 24


def test_a_running_job_that_beats_has_its_checkpoints_listed_at_most_every_minute(h, monkeypatch):
    _running(h)
    clock = Ticks()
    client, _, fleet = _dashboard(h, clock=clock)
    lookups = []
    real = fleet.jobs.checkpoint
    monkeypatch.setattr(fleet.jobs, "checkpoint", lambda job, *a: lookups.append(clock.t) or real(job, *a))
    client.get("/api/jobs", base_url=BASE)
    for _ in range(24):  # two minutes, beating every poll
        clock.t += 5
        h.heartbeat("train")
        client.get("/api/jobs", base_url=BASE)
    assert [t - lookups[0] for t in lookups] == [0, 60, 120]


def test_checkpoint_lookups_are_capped_per_refresh_and_read_side_by_side(h, monkeypatch):
    from controller.dashboard import snapshot

    for i in range(200):
        h.submit(f"job{i:03}")
    h.tick()
    h.tick()
    clock = Ticks()
    client, _, fleet = _dashboard(h, clock=clock)
    lookups = []
    real = fleet.jobs.checkpoint

    def slow(job, *a):
        lookups.append(job)
        time.sleep(0.02 * 2)  # its spec and a listing, 20 ms each (the status is passed in)
        return real(job, *a)
    monkeypatch.setattr(fleet.jobs, "checkpoint", slow)
    started = time.monotonic()
    client.get("/api/jobs", base_url=BASE)
    assert len(lookups) == snapshot.MAX_CHECKPOINT_READS
    assert time.monotonic() - started < 1.0
    for _ in range(5):  # the others over the next refreshes, then none while nothing changes
        clock.t += 5
        started = time.monotonic()
        client.get("/api/jobs", base_url=BASE)
        assert time.monotonic() - started < 1.0
    assert sorted(lookups) == [f"job{i:03}" for i in range(200)]


# -- hostile text ----------------------------------------------------------------------------------

def test_hostile_names_messages_and_zones_are_text_on_both_pages_and_in_the_json(h):
    _hostile(h)
    client, _, _ = _dashboard(h)
    fleet = client.get("/", base_url=BASE).get_data(as_text=True)
    job = client.get(_job_url(EVIL_JOB), base_url=BASE)
    assert job.status_code == 200
    page = job.get_data(as_text=True)
    for text in (fleet, page):
        assert "<script>alert" not in text and "<img src=x" not in text and '-"central1' not in text
        assert "&lt;img src=x onerror=alert(1)&gt;&quot;&#x27;&amp;" in text
        assert "us-&quot;central1&#x27;-a&lt;b&gt;" in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # the message and the history's detail
    assert page.count("<li>") == 1
    for raw in (client.get("/api/jobs", base_url=BASE).data, client.get(_job_url(EVIL_JOB).replace("/jobs", "/api/jobs"),
                                                                         base_url=BASE).data):
        assert b"<" not in raw and b">" not in raw and b"'" not in raw  # \u003c...: never markup, even sniffed
        data = json.loads(raw)
    assert data["job"] == EVIL_JOB and data["message"] == EVIL_TEXT and data["zone"] == EVIL_ZONE


def test_the_report_and_the_dashboard_escape_through_one_helper():
    from controller.render import report
    from controller.render.text import html_text

    assert report._h(EVIL_TEXT) == html_text(EVIL_TEXT) == "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert html_text("a\x1b[31m\"'") == "a\\x1b[31m&quot;&#x27;"


# -- the bucket read at a bounded rate ----------------------------------------------------------------

def _reads(h: Harness) -> list[tuple[str, str]]:
    return [c for c in h.store.calls if c[0] in ("read", "list", "stat")]


def test_many_pages_polling_cost_one_refresh_per_interval_and_reads_only_what_changed(h):
    _running(h)
    h.heartbeat("train")
    clock = Ticks()
    client, _, _ = _dashboard(h, interval=5.0, clock=clock)
    h.store.calls.clear()
    client.get("/api/jobs", base_url=BASE)
    first = len(_reads(h))
    assert first >= 2  # the listing and the job's status, at least
    for _ in range(20):  # twenty pages poll within the interval: nothing more is read
        client.get("/api/jobs", base_url=BASE)
        client.get("/api/jobs/train", base_url=BASE)
    assert len(_reads(h)) == first + 1  # the spec, once, for the job page
    h.store.calls.clear()
    for _ in range(6):  # half a minute of polls on a quiet fleet: one listing per interval, no read
        clock.t += 5
        client.get("/api/jobs", base_url=BASE)
        client.get("/api/jobs/train", base_url=BASE)
    assert _reads(h) == [("list", names.JOBS_PREFIX)] * 6
    h.heartbeat("train")  # its VM beat: that heartbeat is read again, nothing else
    h.store.calls.clear()  # (the harness read the status to write it)
    clock.t += 5
    client.get("/api/jobs", base_url=BASE)
    assert _reads(h) == [("list", names.JOBS_PREFIX), ("read", names.heartbeat_key("train"))]


def test_a_changed_status_is_read_and_shown_at_the_next_refresh(h):
    _running(h)
    clock = Ticks()
    client, _, _ = _dashboard(h, clock=clock)
    assert client.get("/api/jobs/train", base_url=BASE).get_json()["phase"] == "RUNNING"
    h.marker("train")
    h.tick()
    assert client.get("/api/jobs/train", base_url=BASE).get_json()["phase"] == "RUNNING"  # within the interval
    clock.t += 5
    data = client.get("/api/jobs/train", base_url=BASE).get_json()
    assert data["phase"] != "RUNNING" and "preempted" in [e["event"] for e in data["history"]]


# -- its recent log lines ---------------------------------------------------------------------------

class FakeRecent:
    """The CLI's reader of a job's last lines, faked: what each call returned, and how many were made."""

    def __init__(self, lines: list[str] | None = None, error: Exception | None = None) -> None:
        self.lines, self.error = lines or [], error
        self.calls: list[str] = []

    def __call__(self, job: str) -> list[str]:
        self.calls.append(job)
        if self.error is not None:
            raise self.error
        return list(self.lines)


def _with_logs(h: Harness, recent, clock: Ticks | None = None):
    from controller.dashboard.logtail import Tails

    clock = clock or Ticks()
    guard = Guard()
    guard.bound("127.0.0.1", PORT)
    fleet = Fleet(Jobs(h.store, BUCKET, h.policy), 5.0, clock, wall=lambda: NOW)
    app = create_app(fleet, guard, 5.0, now=lambda: NOW, tails=Tails(recent, clock=clock, wall=lambda: NOW))
    return _keyed(app.test_client(), guard), guard, clock


def _pre(page: str) -> str:
    return re.search(r'<pre id="logs"[^>]*>(.*?)</pre>', page, re.S).group(1)


def test_logging_is_read_at_most_20_times_a_minute_in_all_jobs_together(h):
    for i in range(30):
        _running(h, f"job{i:02}")
    recent = FakeRecent(["a line"])
    client, _, clock = _with_logs(h, recent)
    answers = [client.get(f"/api/jobs/job{i:02}/logs", base_url=BASE).get_json() for i in range(30)]
    assert len(recent.calls) == 20
    assert answers[-1]["lines"] == [] and "20 a minute" in answers[-1]["note"]
    clock.t += 60  # a minute on: the jobs left are read at their next poll
    assert client.get("/api/jobs/job29/logs", base_url=BASE).get_json()["lines"] == ["a line"]
    assert len(recent.calls) == 21


def test_the_job_page_shows_its_last_log_lines_as_text_and_the_command_for_all_of_them(h):
    _running(h)
    lines = [f"01-01 02:{k // 60:02d}:{k % 60:02d} train-1 trainer: step {k}" for k in range(60)]
    recent = FakeRecent([*lines[:-1], f"01-01 02:59:59 train-1 {EVIL_TEXT} & 'quoted'"])
    client, _, _ = _with_logs(h, recent)
    page = client.get("/jobs/train", base_url=BASE).get_data(as_text=True)
    assert recent.calls == []  # the page itself reads no log: it asks for its lines once loaded
    assert "reading its last lines" in _pre(page)
    assert '<code id="logs-command">respawn logs train --follow</code>' in page
    answer = client.get("/api/jobs/train/logs", base_url=BASE)
    assert answer.status_code == 200 and recent.calls == ["train"]
    assert b"<script>" not in answer.data and b"'" not in answer.data  # \u003c...: never markup, even sniffed
    data = answer.get_json()
    assert data["lines"] == [*lines[20:-1], f"01-01 02:59:59 train-1 {EVIL_TEXT} & 'quoted'"]  # the last 40
    assert data["note"] is None and data["command"] == "respawn logs train --follow" and data["read_at"]
    shown = _pre(client.get("/jobs/train", base_url=BASE).get_data(as_text=True))  # the lines read, at once
    assert recent.calls == ["train"]
    assert shown.splitlines() == [*lines[20:-1], "01-01 02:59:59 train-1 &lt;script&gt;alert(1)&lt;/script&gt; "
                                                 "&amp; &#x27;quoted&#x27;"]
    assert "<script>alert" not in shown
    assert client.get("/api/jobs/nope/logs", base_url=BASE).status_code == 404 and recent.calls == ["train"]


def test_a_hostile_job_name_and_control_characters_in_its_lines_stay_text(h):
    _hostile(h)
    recent = FakeRecent(["\x1b[31mred\x1b[0m\tand a bell\x07", "a line\nand its next"])
    client, _, _ = _with_logs(h, recent)
    data = client.get(_job_url(EVIL_JOB).replace("/jobs", "/api/jobs") + "/logs", base_url=BASE).get_json()
    assert recent.calls == [EVIL_JOB]
    assert data["lines"] == ["\\x1b[31mred\\x1b[0m\tand a bell\\x07", "a line", "and its next"]
    assert data["command"] == shlex.join(["respawn", "logs", EVIL_JOB, "--follow"])
    page = client.get(_job_url(EVIL_JOB), base_url=BASE).get_data(as_text=True)
    assert "<img src=x" not in page and "\x1b" not in page and "\\x1b[31mred" in _pre(page)


def test_many_pages_polling_read_a_jobs_logs_once_per_30_seconds_and_only_when_asked(h):
    _running(h)
    _running(h, "other")
    recent = FakeRecent(["one line"])
    client, _, clock = _with_logs(h, recent)
    for _ in range(20):  # the fleet page and the job's own JSON never read logs
        client.get("/", base_url=BASE)
        client.get("/api/jobs", base_url=BASE)
        client.get("/api/jobs/train", base_url=BASE)
    assert recent.calls == []
    for _ in range(6):  # half a minute of twenty pages polling every 5 s: one read
        for _ in range(20):
            assert client.get("/api/jobs/train/logs", base_url=BASE).get_json()["lines"] == ["one line"]
        clock.t += 4.9
    assert recent.calls == ["train"]
    clock.t += 0.7  # 30 s since that read
    client.get("/api/jobs/train/logs", base_url=BASE)
    client.get("/api/jobs/other/logs", base_url=BASE)  # each job its own read, its own 30 s
    client.get("/api/jobs/other/logs", base_url=BASE)
    assert recent.calls == ["train", "train", "other"]


def test_one_read_of_a_job_at_a_time_the_pages_asking_meanwhile_share_it(h):
    _running(h)
    started, release = threading.Event(), threading.Event()
    running, most = [0], [0]
    lock = threading.Lock()

    class Slow(FakeRecent):
        def __call__(self, job: str) -> list[str]:
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            started.set()
            release.wait(10)
            with lock:
                running[0] -= 1
            return super().__call__(job)

    recent = Slow(["shared"])
    client, guard, _ = _with_logs(h, recent)
    client.get("/api/jobs/train", base_url=BASE)  # the bucket read before the threads start
    answers: list[list[str]] = []

    def page() -> None:
        answers.append(_keyed(client.application.test_client(), guard).get("/api/jobs/train/logs", base_url=BASE)
                       .get_json()["lines"])

    threads = [threading.Thread(target=page) for _ in range(8)]
    for t in threads:
        t.start()
    assert started.wait(10)
    time.sleep(0.2)  # the others are asking by now
    release.set()
    for t in threads:
        t.join(10)
    assert answers == [["shared"]] * 8 and recent.calls == ["train"] and most[0] == 1


@pytest.mark.parametrize("error, said", [
    ("quota", "429 Too Many Requests"),
    ("permission", "403 Permission 'logging.logEntries.list' denied"),
    ("endpoint", "Connection refused"),
    ("bug", "KeyError"),
])
def test_a_read_that_fails_is_a_one_line_note_in_place_of_the_lines_never_a_500(h, error, said):
    from controller.core import errors

    raised = {"quota": errors.TransientError("429 Too Many Requests: Quota exceeded for quota metric 'Read requests'"
                                             "\nretry in 12 s (Cloud Logging)"),
              "permission": errors.RequestError("403 Permission 'logging.logEntries.list' denied on resource "
                                                "(Cloud Logging)"),
              "endpoint": errors.TransientError("HTTPConnectionPool(host='127.0.0.1', port=1): Connection refused "
                                                "(Cloud Logging)"),
              "bug": KeyError("instance_id")}[error]
    _running(h)
    recent = FakeRecent(["never shown"], error=raised)
    client, _, clock = _with_logs(h, recent)
    answer = client.get("/api/jobs/train/logs", base_url=BASE)
    assert answer.status_code == 200
    data = answer.get_json()
    assert data["lines"] == [] and data["note"].startswith("logs not read: ") and said in data["note"]
    assert "\n" not in data["note"] and data["command"] == "respawn logs train --follow"
    page = client.get("/jobs/train", base_url=BASE)
    assert page.status_code == 200
    note = _pre(page.get_data(as_text=True))
    assert note.startswith("logs not read: ") and "\n" not in note and "never shown" not in note
    for _ in range(10):  # the failure is kept as lines are: a refused read is not tried again at each poll
        clock.t += 2.9
        assert client.get("/api/jobs/train/logs", base_url=BASE).status_code == 200
    assert recent.calls == ["train"]
    clock.t += 1
    recent.error = None
    assert client.get("/api/jobs/train/logs", base_url=BASE).get_json() == {
        **data, "lines": ["never shown"], "note": None}


def test_a_dashboard_without_a_reader_says_so_in_place_of_the_lines(h):
    _running(h)
    client, _, _ = _dashboard(h)
    data = client.get("/api/jobs/train/logs", base_url=BASE).get_json()
    assert data["lines"] == [] and data["note"] == "this dashboard reads no logs: run the command below"


def _finished(h: Harness, phase: Phase) -> None:
    _running(h)
    st = h.status("train")
    h.store.put(BUCKET, names.status_key("train"), st.model_copy(update={"phase": phase}).to_json())


@pytest.mark.parametrize("phase", [Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED])
def test_cancel_is_disabled_saying_why_for_a_finished_job_and_enabled_again_once_it_is_resubmitted(h, phase):
    _finished(h, phase)
    client, guard, fleet = _dashboard(h)
    page = client.get("/jobs/train", base_url=BASE).get_data(as_text=True)
    button = re.search(r'<button id="cancel"[^>]*>', page).group()
    assert " disabled" in button and 'title="already ' in button and "nothing to cancel" in button
    data = client.get("/api/jobs/train", base_url=BASE).get_json()
    assert data["phase"] == phase and "nothing to cancel" in data["cancel_refused"]
    done = client.post("/api/jobs/train/resubmit", base_url=BASE, json={"spec_generation": data["spec_generation"]},
                       headers={TOKEN_HEADER: guard.token})
    assert done.status_code == 200
    again = client.get("/api/jobs/train", base_url=BASE).get_json()  # the page's next poll
    assert again["phase"] == phase and again["cancel_refused"] is None  # a new run is about to start: cancellable
    assert " disabled" not in re.search(r'<button id="cancel"[^>]*>', client.get(
        "/jobs/train", base_url=BASE).get_data(as_text=True)).group()
    h.tick()
    fleet.expire()
    data = client.get("/api/jobs/train", base_url=BASE).get_json()
    assert data["phase"] not in ("SUCCEEDED", "FAILED", "CANCELLED") and data["cancel_refused"] is None


def test_cancel_is_enabled_while_the_job_runs_and_disabled_once_the_cancel_lands(h):
    _running(h)
    client, guard, fleet = _dashboard(h)
    button = re.search(r'<button id="cancel"[^>]*>', client.get("/jobs/train", base_url=BASE).get_data(as_text=True))
    assert button.group() == '<button id="cancel" type="button">'
    assert client.get("/api/jobs/train", base_url=BASE).get_json()["cancel_refused"] is None
    assert _post(client, guard, "/api/jobs/train/cancel").status_code == 200
    h.tick()
    fleet.expire()
    data = client.get("/api/jobs/train", base_url=BASE).get_json()
    assert data["phase"] == "CANCELLED" and data["cancel_refused"].startswith("already cancelled")


# -- who may act -------------------------------------------------------------------------------------

def _post(client, guard: Guard, path: str, **headers):
    sent = {TOKEN_HEADER: guard.token, "Origin": BASE, **headers}
    return client.post(path, base_url=BASE, headers={k: v for k, v in sent.items() if v is not None}, json={})


def test_cancel_with_the_pages_token_cancels(h):
    _running(h)
    client, guard, _ = _dashboard(h)
    page = client.get("/jobs/train", base_url=BASE).get_data(as_text=True)
    assert f'<meta name="respawn-token" content="{guard.token}">' in page
    done = _post(client, guard, "/api/jobs/train/cancel")
    assert done.status_code == 200 and done.get_json()["message"] == "cancel requested for train"
    assert h.store.exists(BUCKET, names.cancel_key("train"))
    h.tick()
    assert h.status("train").phase == Phase.CANCELLED


def _bare(h: Harness):
    """The dashboard as another account on this machine meets it: the port known, not the key."""
    guard = Guard()
    guard.bound("127.0.0.1", PORT)
    fleet = Fleet(Jobs(h.store, BUCKET, h.policy), 5.0, Ticks(), wall=lambda: NOW)
    return create_app(fleet, guard, 5.0, now=lambda: NOW).test_client(), guard


KEYED_PATHS = ("/", "/jobs/train", "/api/jobs", "/api/jobs/train", "/api/jobs/train/logs", "/jobs/train/timeline.png",
               "/metrics", "/static/common.js", "/static/job.js", "/static/dashboard.css", "/favicon.ico",
               "/jobs/nosuch", "/api/jobs/nosuch")


def test_another_account_without_the_key_gets_a_403_saying_how_to_get_in_everywhere_and_never_the_post_token(h):
    _running(h)
    client, guard = _bare(h)
    for path in KEYED_PATHS:  # a job that does not exist included: not even which names do
        answer = client.get(path, base_url=BASE)
        assert answer.status_code == 403, path
        assert guard.token.encode() not in answer.data and b"train" not in answer.data, path
        assert b"open the address `respawn dashboard` printed" in answer.data, path
        assert "Set-Cookie" not in answer.headers, path
    refused = client.post("/api/jobs/train/cancel", base_url=BASE, headers={TOKEN_HEADER: "guessed", "Origin": BASE})
    assert refused.status_code == 403 and not h.store.exists(BUCKET, names.cancel_key("train"))


@pytest.mark.parametrize("how", ["query", "cookie", "bearer"])
def test_a_wrong_key_in_the_query_the_cookie_or_an_authorization_header_is_refused(h, how):
    _running(h)
    for key, expected in (("wrong", 403), ("right", 200)):  # the right key, sent the same way, is let in
        client, guard = _bare(h)
        sent = guard.key if key == "right" else guard.key[:-1] + ("A" if guard.key[-1] != "A" else "B")
        if how == "cookie":
            client.set_cookie(guard.cookie, sent, domain="127.0.0.1")
        path = "/api/jobs" + (f"?token={sent}" if how == "query" else "")
        answer = client.get(path, base_url=BASE, headers={"Authorization": f"Bearer {sent}"} if how == "bearer" else {})
        assert answer.status_code == expected, key
        assert ("Set-Cookie" in answer.headers) == (key == "right" and how == "query"), key


def test_the_printed_address_lets_a_browser_in_and_its_cookie_carries_the_key_to_links_assets_polls_and_posts(h):
    _running(h)
    client, guard = _bare(h)
    first = client.get(f"/?token={guard.key}", base_url=BASE)  # the address `respawn dashboard` printed
    assert first.status_code == 200 and guard.key.encode() not in first.data  # the page itself never holds it
    (cookie,) = first.headers.getlist("Set-Cookie")
    assert cookie.split("; ")[0] == f"respawn-dashboard-{PORT}={guard.key}"
    assert {"HttpOnly", "Path=/", "SameSite=Strict"} <= set(cookie.split("; ")[1:])
    page = client.get("/jobs/train", base_url=BASE)  # a link followed: the cookie, no query
    assert page.status_code == 200 and "Set-Cookie" not in page.headers
    for path in ("/static/common.js", "/api/jobs/train", "/jobs/train/timeline.png", "/metrics"):
        assert client.get(path, base_url=BASE).status_code == 200, path
    token = re.search(r'<meta name="respawn-token" content="([^"]+)">', page.get_data(as_text=True)).group(1)
    done = client.post("/api/jobs/train/cancel", base_url=BASE, headers={TOKEN_HEADER: token, "Origin": BASE})
    assert done.status_code == 200 and h.store.exists(BUCKET, names.cancel_key("train"))


def test_a_key_in_the_address_under_a_foreign_host_sets_no_cookie_there(h):
    _running(h)
    client, guard = _bare(h)
    refused = client.get(f"/?token={guard.key}", base_url="http://evil.example:8642")  # a rebinding name
    assert refused.status_code == 403 and "Set-Cookie" not in refused.headers


def test_the_browser_is_opened_on_a_file_of_the_users_alone_never_with_the_key_on_its_command_line(h, monkeypatch):
    opened: list[str] = []
    monkeypatch.setattr("webbrowser.open", opened.append)
    server, url = serving.bind(Jobs(h.store, BUCKET, h.policy), "127.0.0.1", 0, 5.0, remote=False)
    key = url.rpartition("=")[2]
    seen: dict[str, object] = {}

    def look() -> None:
        try:
            for _ in range(100):
                if opened:
                    break
                time.sleep(0.05)
            page = Path(urllib.parse.urlsplit(opened[0]).path)
            seen.update(mode=page.stat().st_mode & 0o777, folder=page.parent.stat().st_mode & 0o777,
                        text=page.read_text(), path=page)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Timer(0.3, look).start()
    assert serving.serve(server, url, open_browser=True, out=io.StringIO()) == 0
    (argument,) = opened  # what a browser's command line shows every account (ps)
    assert argument.startswith("file:///") and key not in argument
    assert seen["mode"] == 0o600 and seen["folder"] == 0o700
    assert f'content="0;url={html.escape(url, quote=True)}"' in seen["text"]
    assert not seen["path"].exists()  # gone once the dashboard stops


def test_a_key_file_keeps_the_key_across_starts_and_one_others_may_read_or_too_short_is_refused(tmp_path):
    kept = tmp_path / "key"
    first = serving.key_file(kept)
    assert serving.key_file(kept) == first and kept.stat().st_mode & 0o777 == 0o600
    kept.chmod(0o644)
    with pytest.raises(serving.KeyRefused, match="chmod 600"):
        serving.key_file(kept)
    kept.write_text("short\n")
    kept.chmod(0o600)
    with pytest.raises(serving.KeyRefused, match="at least 16 characters"):
        serving.key_file(kept)


def test_the_command_refuses_a_key_file_others_may_read_in_one_line_exit_2(monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "200")
    kept = tmp_path / "key"
    kept.write_text("k" * 40 + "\n")
    kept.chmod(0o644)
    result = CliRunner().invoke(cli, ["dashboard", "--no-open", "--port", "0", "--key-file", str(kept)])
    assert result.exit_code == 2 and f"chmod 600 {kept}" in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("headers, why", [
    ({TOKEN_HEADER: None}, "token"),
    ({TOKEN_HEADER: "guessed"}, "token"),
    ({"Origin": "http://evil.example"}, "Origin"),
    ({"Origin": "null"}, "Origin"),
    ({"Host": "evil.example:8642"}, "Host"),  # DNS rebinding: a foreign name that resolves to 127.0.0.1
])
def test_a_post_without_the_token_from_a_foreign_origin_or_host_is_refused(h, headers, why):
    _running(h)
    client, guard, _ = _dashboard(h)
    refused = _post(client, guard, "/api/jobs/train/cancel", **headers)
    assert refused.status_code == 403 and why in refused.get_json()["error"]
    assert not h.store.exists(BUCKET, names.cancel_key("train"))


def test_a_read_under_a_foreign_host_name_is_refused(h):
    _running(h)
    client, _, _ = _dashboard(h)
    for path in ("/", "/api/jobs", "/jobs/train", "/metrics"):
        assert client.get(path, base_url="http://evil.example:8642").status_code == 403, path
    assert client.get("/", base_url=f"http://localhost:{PORT}").status_code == 200


def test_pages_json_metrics_and_pictures_are_never_sniffed_nor_cached(h):
    _running(h)
    client, _, _ = _dashboard(h)
    for path in ("/", "/jobs/train", "/api/jobs", "/api/jobs/train", "/metrics", "/jobs/train/timeline.png"):
        answer = client.get(path, base_url=BASE)
        assert answer.status_code == 200, path
        assert answer.headers["X-Content-Type-Options"] == "nosniff", path
        assert answer.headers["Cache-Control"] == "no-store", path


def test_a_remote_dashboard_answers_ip_addresses_localhost_and_allowed_names_never_a_rebinding_name(h):
    _running(h)
    guard = Guard(remote=True, names=frozenset({"dash.internal"}))
    guard.bound("0.0.0.0", PORT)
    client = _keyed(create_app(Fleet(Jobs(h.store, BUCKET, h.policy), 5.0, Ticks(), wall=lambda: NOW), guard, 5.0,
                               now=lambda: NOW).test_client(), guard)
    for base in ("http://10.1.2.3:8642", "http://[fd00::1]:8642", "http://localhost:8642", "http://dash.internal:8642"):
        assert client.get("/api/jobs", base_url=base).status_code == 200, base
    evil = "http://evil.example:8642"  # the attacker's name, rebound to this machine's address
    assert client.get("/", base_url=evil).status_code == 403
    refused = client.post("/api/jobs/train/cancel", base_url=evil, headers={TOKEN_HEADER: guard.token,
                                                                           "Origin": evil})
    assert refused.status_code == 403 and "--allowed-host" in refused.get_json()["error"]
    assert not h.store.exists(BUCKET, names.cancel_key("train"))


def _served(h: Harness, host: str, port: int, **guarded):
    guard = Guard(**guarded)
    guard.bound(host, port)
    fleet = Fleet(Jobs(h.store, BUCKET, h.policy), 5.0, Ticks(), wall=lambda: NOW)
    return _keyed(create_app(fleet, guard, 5.0, now=lambda: NOW).test_client(), guard), guard


@pytest.mark.parametrize("remote, bound", [(False, "127.0.0.1"), (True, "0.0.0.0")])
def test_on_port_80_the_host_a_browser_sends_without_its_port_is_answered_and_may_cancel(h, remote, bound):
    _running(h)
    client, guard = _served(h, bound, 80, remote=remote)
    for base in ("http://127.0.0.1", "http://localhost"):  # Host: 127.0.0.1, as a browser sends it on port 80
        assert client.get("/", base_url=base).status_code == 200, base
        assert client.get("/api/jobs", base_url=base).status_code == 200, base
    done = client.post("/api/jobs/train/cancel", base_url="http://127.0.0.1",
                       headers={TOKEN_HEADER: guard.token, "Origin": "http://127.0.0.1"})
    assert done.status_code == 200 and h.store.exists(BUCKET, names.cancel_key("train"))
    assert client.get("/", base_url="http://evil.example").status_code == 403


@pytest.mark.parametrize("remote, bound", [(False, "127.0.0.1"), (True, "0.0.0.0")])
def test_behind_an_https_proxy_that_passes_the_host_on_a_post_from_its_page_cancels(h, remote, bound):
    """Caddy and Traefik pass the browser's Host on (nginx with ``proxy_set_header Host $host``); none of
    them need say X-Forwarded-Proto. The page is https://dash.example.com, its POSTs' Origin that."""
    _running(h)
    client, guard = _served(h, bound, PORT, remote=remote, names=frozenset({"dash.example.com"}))
    proxied = "http://dash.example.com"  # Host: dash.example.com, the port the browser left out (443)
    assert client.get("/api/jobs", base_url=proxied).status_code == 200
    done = client.post("/api/jobs/train/cancel", base_url=proxied,
                       headers={TOKEN_HEADER: guard.token, "Origin": "https://dash.example.com"})
    assert done.status_code == 200, done.get_json()
    assert h.store.exists(BUCKET, names.cancel_key("train"))


@pytest.mark.parametrize("origin, host", [
    ("https://evil.example", "dash.example.com"),
    ("https://dash.example.com.evil.example", "dash.example.com"),
    ("https://dash.example.com:8443", "dash.example.com"),  # another port: another origin
    ("http://127.0.0.1:8643", f"127.0.0.1:{PORT}"),  # another server on this machine
    ("https://127.0.0.1:8643", f"127.0.0.1:{PORT}"),
    ("ftp://dash.example.com", "dash.example.com"),
    ("null", "dash.example.com"),
])
def test_a_post_whose_origin_is_another_sites_is_refused_over_http_or_https(h, origin, host):
    _running(h)
    client, guard = _served(h, "127.0.0.1", PORT, names=frozenset({"dash.example.com"}))
    refused = client.post("/api/jobs/train/cancel", base_url=f"http://{host}",
                          headers={TOKEN_HEADER: guard.token, "Origin": origin})
    assert refused.status_code == 403 and "Origin" in refused.get_json()["error"]
    assert not h.store.exists(BUCKET, names.cancel_key("train"))


@pytest.mark.parametrize("site", ["cross-site", "same-site"])
def test_another_sites_page_cannot_spend_a_logging_read_nor_probe_job_names(h, site):
    _running(h)
    guard = Guard()
    guard.bound("127.0.0.1", PORT)
    calls = []
    client = _keyed(create_app(Fleet(Jobs(h.store, BUCKET, h.policy), 5.0, Ticks(), wall=lambda: NOW), guard, 5.0,
                               now=lambda: NOW, recent=lambda job: calls.append(job) or ["x"]).test_client(), guard)
    xs = {"Sec-Fetch-Site": site, "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}
    for path in ("/api/jobs/train/logs", "/jobs/train/timeline.png", "/jobs/nosuch/timeline.png", "/api/jobs"):
        assert client.get(path, base_url=BASE, headers=xs).status_code == 403, path
    assert calls == []
    own = {"Sec-Fetch-Site": "same-origin"}
    assert client.get("/api/jobs/train/logs", base_url=BASE, headers=own).status_code == 200 and calls == ["train"]
    assert client.get("/jobs/train/timeline.png", base_url=BASE, headers=own).status_code == 200


def test_the_spec_is_shown_alike_on_the_page_and_in_the_polls_lines_kept_controls_escaped(h):
    raw = "zones: [us-central1-a]\ncommand: python train.py\r" + " " * 60 + "--lr \u202e1e-4 <b>\n"
    h.submit("train", raw)
    h.tick()
    h.tick()
    client, _, _ = _dashboard(h)
    polled = client.get("/api/jobs/train", base_url=BASE).get_json()["spec"]
    assert polled.startswith("zones: [us-central1-a]\ncommand: python train.py\\r") and "\\u202e" in polled
    page = client.get("/jobs/train", base_url=BASE).get_data(as_text=True)
    shown = re.search(r'<pre id="spec">(.*?)</pre>', page, re.S).group(1)
    assert shown == polled.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


WEBHOOK = "https://hooks.slack.com/services/T0001/B0002/webhookcredential"


def test_no_page_json_nor_poll_shows_a_webhook_url_or_a_token_in_the_specs_env(h):
    raw = yaml.safe_dump(spec_doc(notify={"webhook": WEBHOOK}, env={"HF_TOKEN": "hf_tokencredential",
                                                                     "TOKENIZERS_PARALLELISM": "false"}))
    h.submit("train", raw)
    h.tick()
    h.tick()
    client, guard, _ = _dashboard(h)
    paths = ("/", "/jobs/train", "/api/jobs", "/api/jobs/train", "/api/jobs/train/logs", "/metrics")
    answers = {path: client.get(path, base_url=BASE) for path in paths}
    attempt_token = h.status("train").attempt_token.encode()  # its VMs' secret: the status's own
    for path, answer in answers.items():
        assert answer.status_code == 200, path
        assert b"webhookcredential" not in answer.data and b"hf_tokencredential" not in answer.data, path
        assert attempt_token not in answer.data, path
    spec = answers["/api/jobs/train"].get_json()["spec"]
    assert "webhook: https://hooks.slack.com/<redacted>" in spec and "HF_TOKEN: <redacted>" in spec
    assert "TOKENIZERS_PARALLELISM: 'false'" in spec  # the rest as written
    shown = re.search(r'<pre id="spec">(.*?)</pre>', answers["/jobs/train"].get_data(as_text=True), re.S).group(1)
    assert shown == html.escape(spec, quote=True)
    generation = answers["/api/jobs/train"].get_json()["spec_generation"]
    done = client.post("/api/jobs/train/resubmit", base_url=BASE, json={"spec_generation": generation},
                       headers={TOKEN_HEADER: guard.token})
    assert done.status_code == 200  # the spec in the bucket, secrets and all, not the one shown
    assert h.store.read(BUCKET, names.spec_key("train")).data == raw.encode()


@pytest.mark.parametrize("raw", [
    # JSON that spells the URL with escapes: the text never holds it as such
    json.dumps({**spec_doc(), "notify": {"webhook": WEBHOOK}}).replace("/", "\\/"),
    # a folded YAML string: the URL is split across lines
    yaml.safe_dump(spec_doc()) + "notify:\n  webhook: >-\n    https://hooks.slack.com/services/T0001/B0002/\n"
                                 "    webhookcredential\n",
])
def test_a_webhook_spelled_another_way_is_hidden_too_the_spec_shown_as_respawn_read_it(h, raw):
    h.store.put(BUCKET, names.spec_key("train"), raw)  # as a hand could write it
    client, _, _ = _dashboard(h)
    for path in ("/jobs/train", "/api/jobs/train"):
        answer = client.get(path, base_url=BASE)
        assert answer.status_code == 200 and b"webhookcredential" not in answer.data, path
    spec = client.get("/api/jobs/train", base_url=BASE).get_json()["spec"]
    assert spec.startswith("# the spec as respawn read it") and "https://hooks.slack.com/<redacted>" in spec


def test_resubmit_replaces_the_spec_shown_and_refuses_one_changed_since(h):
    _running(h)
    client, guard, fleet = _dashboard(h)
    shown = client.get("/api/jobs/train", base_url=BASE).get_json()["spec_generation"]
    stale = client.post("/api/jobs/train/resubmit", base_url=BASE, json={"spec_generation": shown - 1},
                        headers={TOKEN_HEADER: guard.token})
    assert stale.status_code == 409 and "changed" in stale.get_json()["error"]
    done = client.post("/api/jobs/train/resubmit", base_url=BASE, json={"spec_generation": shown},
                       headers={TOKEN_HEADER: guard.token})
    assert done.status_code == 200 and "--replace" in done.get_json()["message"]
    assert h.store.read(BUCKET, names.spec_key("train")).info.generation != shown
    h.cancel("train")  # a pending cancel is not revoked by a resubmit: said, as `respawn submit` says it
    fresh = client.get("/api/jobs/train", base_url=BASE).get_json()["spec_generation"]
    refused = client.post("/api/jobs/train/resubmit", base_url=BASE, json={"spec_generation": fresh},
                          headers={TOKEN_HEADER: guard.token})
    assert refused.status_code == 409 and "pending cancel" in refused.get_json()["error"]


def test_resubmit_does_not_undo_a_spec_a_teammate_wrote_after_the_page_showed_it(h):
    _running(h)
    client, guard, _ = _dashboard(h)
    shown = client.get("/api/jobs/train", base_url=BASE).get_json()["spec_generation"]
    h.submit("train", spec_doc(command="python train.py --fixed"))  # within the snapshot's interval
    newer = h.store.read(BUCKET, names.spec_key("train"))
    refused = client.post("/api/jobs/train/resubmit", base_url=BASE, json={"spec_generation": shown},
                          headers={TOKEN_HEADER: guard.token})
    assert refused.status_code == 409 and "changed" in refused.get_json()["error"]
    assert h.store.read(BUCKET, names.spec_key("train")).info.generation == newer.info.generation


# -- binding ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_a_loopback_address_binds_without_a_warning(host):
    assert guards.bind_warning(host, allow_remote=False) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "::", "example.com"])
def test_another_address_needs_allow_remote_and_is_warned_of(host):
    with pytest.raises(guards.BindRefused, match="--allow-remote"):
        guards.bind_warning(host, allow_remote=False)
    assert "cancel" in guards.bind_warning(host, allow_remote=True)


def test_the_command_refuses_a_remote_host_without_allow_remote(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    h = Harness()
    bootstrap.override(None, Settings(bucket=BUCKET, project=PROJECT, trainer_service_account=TRAINER), h.store, h.compute)
    try:
        result = CliRunner().invoke(cli, ["dashboard", "--host", "0.0.0.0", "--no-open", "--port", "0"])
    finally:
        bootstrap.override(None)
    assert result.exit_code == 2 and "--allow-remote" in result.output


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_the_server_prints_one_line_with_the_port_it_got_and_its_key_answers_and_stops_on_a_signal(h, signum, code):
    server, url = serving.bind(Jobs(h.store, BUCKET, h.policy), "127.0.0.1", 0, 5.0, remote=False)
    port = server.server_port
    key = re.fullmatch(rf"http://127\.0\.0\.1:{port}/\?token=([A-Za-z0-9_-]{{43}})", url).group(1)
    answers: list[int] = []

    def client() -> None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/jobs?token={key}", timeout=10) as answer:
                answers.append(answer.status)
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/jobs", timeout=10)
            except urllib.error.HTTPError as e:
                answers.append(e.code)
        finally:
            os.kill(os.getpid(), signum)

    threading.Timer(0.3, client).start()
    out = io.StringIO()
    assert serving.serve(server, url, open_browser=False, out=out) == code
    assert out.getvalue() == f"dashboard at {url}\n" and answers == [200, 403]


def test_the_command_prints_exactly_one_line_its_key_from_the_key_file_and_exits_0_on_sigterm(monkeypatch, tmp_path):
    h = Harness()
    _running(h)
    opened: list[str] = []
    monkeypatch.setattr("webbrowser.open", opened.append)
    bootstrap.override(None, Settings(bucket=BUCKET, project=PROJECT, trainer_service_account=TRAINER), h.store, h.compute)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    answered: list[int] = []
    kept = tmp_path / "dashboard-key"  # made, the user's alone: a scrape job's credentials_file

    def client() -> None:  # SIGTERM once it answers: its handlers are set by then
        for _ in range(200):
            try:
                asked = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                               headers={"Authorization": f"Bearer {kept.read_text().strip()}"})
                with urllib.request.urlopen(asked, timeout=10) as answer:
                    answered.append(answer.status)
                    break
            except OSError:
                time.sleep(0.1)
        if answered:  # never a SIGTERM to the test run when nothing serves (the command failed: said below)
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=client, daemon=True).start()
    try:
        result = CliRunner().invoke(cli, ["dashboard", "--port", str(port), "--no-open", "--interval", "2",
                                          "--key-file", str(kept)])
    finally:
        bootstrap.override(None)
    assert result.exit_code == 0, result.output
    key = kept.read_text().strip()
    assert result.output == f"dashboard at http://127.0.0.1:{port}/?token={key}\n" and answered == [200]
    assert kept.stat().st_mode & 0o777 == 0o600 and len(key) >= 43
    assert opened == []


def test_a_bucket_that_cannot_be_read_at_the_start_is_one_line_and_exit_3_before_anything_listens(monkeypatch):
    from controller.core import errors

    h = Harness()
    h.store.list = lambda *a, **k: (_ for _ in ()).throw(errors.TransientError("503 from GCS"))
    bootstrap.override(None, Settings(bucket=BUCKET, project=PROJECT, trainer_service_account=TRAINER), h.store, h.compute)
    try:
        result = CliRunner().invoke(cli, ["dashboard", "--port", "0", "--no-open"])
    finally:
        bootstrap.override(None)
    assert result.exit_code == 3 and "503 from GCS" in result.output and "dashboard at" not in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


# -- /metrics --------------------------------------------------------------------------------------

def test_metrics_parse_with_prometheus_clients_parser_and_say_the_fleets_figures(h):
    _running(h)
    _hostile(h)
    client, _, _ = _dashboard(h)
    answer = client.get("/metrics", base_url=BASE)
    assert answer.status_code == 200 and answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(answer.get_data(as_text=True))}
    assert all(name.startswith("respawn_") for name in families)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("respawn_jobs", (("phase", "RUNNING"),))] == 1
    assert samples[("respawn_jobs", (("phase", "RECOVERING"),))] == 1
    assert samples[("respawn_preemptions", (("zone", EVIL_ZONE),))] == 1
    assert samples[("respawn_stockouts", (("zone", EVIL_ZONE),))] == 2
    assert samples[("respawn_accelerators_running", ())] == 1
    assert samples[("respawn_cost_dollars", ())] >= 1.0 and samples[("respawn_saved_dollars", ())] >= 2.0
    assert ("respawn_recoveries", ()) in samples and ("respawn_recovery_seconds", ()) in samples
    # Sums over the jobs' current runs fall at a resubmit or a removal: gauges, never counters (rate() would spike).
    assert {f.type for f in families.values()} == {"gauge"}
    assert ("respawn_job_goodput_ratio", (("job", EVIL_JOB),)) in samples
    assert "respawn_goodput_ratio" in families and "respawn_accelerator_hours_week" in families


# -- zero-gap recovery: the standby beside the attempt it replaces (issue 34) -------------------------

def _noticed(h: Harness) -> None:
    """``train`` RUNNING in us-central1-a, its trainer at step 153; its VM's preemption notice boots
    train-2 beside it in us-central1-b."""
    h.submit("train", spec_doc(zones=["us-central1-a", "us-central1-b", "us-central1-c"]))
    h.tick()
    h.tick()
    h.heartbeat("train", step=153)
    h.notice("train")
    h.tick("train")
    assert h.status("train").standby is not None


def test_a_standby_booting_beside_its_job_is_its_rows_event_then_its_line_since_its_ready_record(h):
    _noticed(h)
    clock = Ticks()
    client, _, _ = _dashboard(h, clock=clock)
    (row,) = client.get("/api/jobs", base_url=BASE).get_json()["jobs"]
    assert row["cells"]["event"] == "train-2 booting in us-central1-b while train-1 saves (its trainer at step 153)"
    since = h.clock.now()
    h.ready("train", waiting_since=since)
    clock.t += 5
    (row,) = client.get("/api/jobs", base_url=BASE).get_json()["jobs"]
    assert row["cells"]["event"] == f"train-2 at the starting line since {since:%H:%M:%S} UTC, waiting for train-1's save"
    page = client.get("/", base_url=BASE).get_data(as_text=True)
    assert f">{html.escape(row['cells']['event'])}</td>" in page


def test_a_jobs_ready_record_is_read_only_while_it_has_a_standby_and_only_when_rewritten(h):
    _noticed(h)
    h.ready("train", waiting_since=h.clock.now())
    clock = Ticks()
    client, _, _ = _dashboard(h, clock=clock)
    client.get("/api/jobs", base_url=BASE)
    h.store.calls.clear()
    clock.t += 5
    client.get("/api/jobs", base_url=BASE)
    assert ("read", names.ready_key("train")) not in _reads(h)  # the same record: not read again
    h.ready("train", waiting_since=h.clock.now())  # its next poke
    h.store.calls.clear()
    clock.t += 5
    client.get("/api/jobs", base_url=BASE)
    assert _reads(h).count(("read", names.ready_key("train"))) == 1
    h.submit("plain")
    h.tick("plain")
    h.store.put(BUCKET, names.ready_key("plain"), "{}")  # a job without a standby: its record is never read
    h.store.calls.clear()
    clock.t += 5
    client.get("/api/jobs", base_url=BASE)
    assert ("read", names.ready_key("plain")) not in _reads(h)


def test_the_job_page_summary_says_the_overlap_and_once_started_how_soon_after_the_save(h):
    from controller.core.ports import InstanceStatus

    _noticed(h)
    clock = Ticks()
    client, _, _ = _dashboard(h, clock=clock)
    facts = dict(client.get("/api/jobs/train", base_url=BASE).get_json()["facts"])
    assert facts["zero-gap"] == "now: train-2 booting in us-central1-b while train-1 saves (its trainer at step 153)"
    h.checkpoint(160)
    h.compute.set_status("train-1", InstanceStatus.STOPPING)
    h.marker("train")
    h.tick("train")
    h.advance(seconds=2)
    h.heartbeat("train", trainer_started=h.clock.now())
    h.tick("train")
    clock.t += 5
    data = client.get("/api/jobs/train", base_url=BASE).get_json()
    assert dict(data["facts"])["zero-gap"] == ("1 attempt booted at the notice of the one before, its trainer started "
                                               "2s after the save it resumed from")
    assert data["cells"]["event"].startswith("running: train-2 past the starting line")


# -- a sweep's page ---------------------------------------------------------------------------------
def test_a_sweeps_page_lists_its_trials_best_first_with_their_cells_and_the_fleet_links_to_it(h):
    from controller.core import sweep

    sw = sweep.SweepFile(name="lr", base=spec_doc(), parameters={"lr": (0.1, 0.01, EVIL_TEXT)}, max_parallel=2,
                         metric={"key": "loss", "goal": "minimize"})
    h.store.write(BUCKET, names.sweep_key("lr"), sweep.record(sw).model_dump_json().encode())
    for trial in sweep.trials(sw):
        h.submit(trial.job, sweep.trial_spec(sw.base, sw, trial))
    h.tick()
    h.exit("lr-2", 0, result='{"loss": 0.5}')
    h.tick()
    client, _, _ = _dashboard(h)
    data = client.get("/api/sweeps/lr", base_url=BASE).get_json()
    assert [t["trial"] for t in data["trials"]] == ["lr-2", "lr-1", "lr-3"] and data["max_parallel"] == 2
    assert [t["cells"]["metric"] for t in data["trials"]] == ["0.5", "no result", "no result"]
    assert data["trials"][2]["phase"] == "QUEUED"
    page = client.get("/sweeps/lr", base_url=BASE).get_data(as_text=True)
    assert page.index('data-trial="lr-2"') < page.index('data-trial="lr-1"') and 'href="/jobs/lr-2"' in page
    assert EVIL_TEXT not in page and "&lt;script&gt;" in page  # a parameter's value is text
    fleet = client.get("/", base_url=BASE).get_data(as_text=True)
    assert 'href="/sweeps/lr"' in fleet and "(3 trials)" in fleet
    assert client.get("/sweeps/none", base_url=BASE).status_code == 404 and client.get("/api/sweeps/none", base_url=BASE).status_code == 404
