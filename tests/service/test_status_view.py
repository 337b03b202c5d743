"""``respawn status`` read as a person reads it, at 60, 80, 100 and 150 columns (issue 11).

The view is drawn by Rich into a recording console of that width, then read back as text:
each job's row is cut into its cells under the headers, and every cell must be one whole
value of its column (never ``us-c…``); each last event, read back from the lines under its
row, must be the event's own words in order, whole, ending with ``…`` only after a whole
word when the narrow view cut it.
"""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console
from typer.testing import CliRunner

from controller.service import bootstrap
from controller.core import names
from controller.cli import main as cli_module
from controller.render import status_view as view
from controller.cli.main import app
from controller.service.config import Settings
from controller.core.durations import format_duration
from controller.core.state import Event, JobStatus, Phase
from tests.harness import BUCKET, PROJECT, TRAINER, Harness

runner = CliRunner()
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _row(job: str, phase: str, **fields) -> dict:
    """A row as controller.service.jobs.JobRow.as_dict and the CLI's goodput make it."""
    return {"job": job, "phase": phase, "attempt": 0, "preemptions": 0, "failures": 0, "zone": None,
            "provisioning": None, "tpu": False, "upcoming_maintenance": None, "zone_advice": {}, "advice_at": None,
            "instance": None, "instance_id": None, "checkpoint": None, "checkpoint_step": None,
            "checkpoint_label": None, "checkpoint_tag": None, "checkpoint_error": None, "age_seconds": None,
            "last_event": "", "message": "", "errors": [], "goodput": None, "checkpoint_every_s": None, **fields}


TYPICAL = [
    _row("data-prep", "PENDING", age_seconds=40, last_event="accepted: spec accepted; waiting for a VM"),
    _row("bert-sweep-7", "PROVISIONING", attempt=1, zone="northamerica-northeast1-b", provisioning="spot",
         instance="bert-sweep-7-1-0", age_seconds=95,
         last_event="inserted: Compute accepted bert-sweep-7-1-0 in northamerica-northeast1-b"),
    _row("llm-finetune", "RUNNING", attempt=3, preemptions=2, zone="us-central1-b", provisioning="spot",
         instance="llm-finetune-3-0", instance_id="8412345678901234567", checkpoint_label="step 1500",
         checkpoint_step=1500, age_seconds=7 * 3600 + 1260,
         last_event="running: llm-finetune-3-0 running in us-central1-b"),
    _row("vit-pretrain", "RECOVERING", attempt=5, preemptions=4, zone="europe-west4-a", provisioning="spot",
         instance="vit-pretrain-5-0", instance_id="3141592653589793238", checkpoint_label="step 42000",
         age_seconds=2 * 86400 + 3 * 3600,
         last_event="launch: preempted: vit-pretrain-4-0 was preempted by Compute Engine in europe-west4-a; "
                    "creating vit-pretrain-5-0 in europe-west4-a (spot; obtainability 0.82, uptime 3.1 d), "
                    "resuming from gs://ml-ckpts/vit-pretrain/global_step42000"),
    _row("eval-nightly", "SUCCEEDED", attempt=1, zone="us-east1-c", provisioning="standard",
         instance="eval-nightly-1-0", checkpoint_label="release", age_seconds=5400,
         last_event="succeeded: command exited with code 0 on eval-nightly-1-0"),
    _row("rl-agent", "FAILED", attempt=4, preemptions=1, failures=3, zone="us-west1-a", provisioning="spot",
         instance="rl-agent-4-0", checkpoint_label="save 12", age_seconds=3 * 86400,
         last_event="failed: command exited with code 137 on rl-agent-4-0: Traceback (most recent call last): "
                    'File "/opt/train/train.py", line 212, in <module> main() torch.OutOfMemoryError: CUDA out '
                    "of memory. Tried to allocate 2.00 GiB; crash loop: 3 failures without progress "
                    "(max_failures 3)"),
    _row("t5-tpu", "RUNNING", attempt=2, preemptions=1, zone="us-central2-b", provisioning="spot", tpu=True,
         instance="t5-tpu-2", checkpoint_label="step 900", age_seconds=4 * 3600,
         last_event="running: t5-tpu-2 running in us-central2-b"),
    _row("gpt-locked", "RUNNING", attempt=1, zone="us-central1-a", provisioning="spot", instance="gpt-locked-1-0",
         instance_id="1234567890123456789", age_seconds=600,
         checkpoint_error="gs://denied/run/*: 403 caller does not have storage.objects.list access",
         last_event="running: gpt-locked-1-0 running in us-central1-a"),
]

WIDE_HEADERS = ["JOB", "PHASE", "ATTEMPT", "PREEMPTED", "FAILED", "ZONE", "INSTANCE (ID)", "CHECKPOINT", "AGE"]


def draw(rows: list[dict], width: int, wide: bool = False) -> str:
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(view.StatusView(rows, wide, view.problems(rows)), soft_wrap=True)
    return console.export_text()


def whole_values(r: dict, header: str) -> set[str]:
    """Every whole spelling a cell of this column may have for this row."""
    zone, model = r["zone"], r["provisioning"]
    instance = r["instance"] or "—"
    age = format_duration(timedelta(seconds=r["age_seconds"])) if r["age_seconds"] is not None else "—"
    return {
        "JOB": {r["job"]}, "PHASE": {r["phase"]}, "ATTEMPT": {str(r["attempt"])},
        "PREEMPTED": {str(r["preemptions"])}, "FAILED": {str(r["failures"])},
        "LOSSES": {f"{r['preemptions']}p/{r['failures']}f"},
        "ZONE": {f"{zone} ({model})", zone} if zone else {"—"},
        "INSTANCE (ID)": {f"{instance} ({r['instance_id']})" if r["instance_id"] else instance},
        "INSTANCE": {instance},
        "CHECKPOINT": {"unreadable" if r["checkpoint_error"] else r["checkpoint_label"] or "—"},
        "AGE": {age},
    }[header]


def read_back(text: str, rows: list[dict]) -> tuple[list[str], list[dict[str, str]], list[list[str]]]:
    """The headers, each job's cells by header, and each job's event lines, as drawn."""
    lines = text.splitlines()
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", header)]  # columns are 2+ spaces apart
    headers = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None])]
    cells: list[dict[str, str]] = []
    events: list[list[str]] = []
    for line in lines[1:]:
        if line.startswith(view.EVENT_INDENT):
            events[-1].append(line.removeprefix(view.EVENT_INDENT))
        elif line.startswith(("! ", "controller ")):  # the table ends: errors, the controller's last pass
            break
        else:
            assert len(cells) < len(rows), f"a job's row drawn over two lines:\n{text}"
            cells.append({h: line[a:b].strip() for h, a, b in zip(headers, starts, [*starts[1:], None])})
            events.append([])
    return headers, cells, events


def check_readable(text: str, rows: list[dict], width: int | None, max_event_lines: int | None) -> list[str]:
    headers, cells, events = read_back(text, rows)
    assert headers[:2] == ["JOB", "PHASE"], text
    assert [c["JOB"] for c in cells] == [r["job"] for r in rows], text  # one line per job, its name whole
    for r, c, event in zip(rows, cells, events, strict=True):
        for h in headers:  # every cell one whole value: never "us-c…", "PROV…", "atte…"
            assert c[h] in whole_values(r, h), (h, c[h], text)
        drawn = " ".join(event).split()
        said = r["last_event"].split()
        if max_event_lines is not None:
            assert len(event) <= max_event_lines, text
        if drawn and drawn[-1].endswith(view.ELLIPSIS):  # cut after a whole word, never inside one
            drawn[-1] = drawn[-1].removesuffix(view.ELLIPSIS)
            assert drawn == said[:len(drawn)] and len(drawn) < len(said), (drawn, said)
        else:
            assert drawn == said, (drawn, said)  # whole words, in order: none split across lines
    assert all("…" not in line for line in text.splitlines() if not line.startswith(view.EVENT_INDENT)), text
    if width is not None:
        assert max(len(line) for line in text.splitlines()) <= width, text
    return headers


@pytest.mark.parametrize("width", [60, 80, 100])
def test_the_narrow_view_cuts_no_cell_and_keeps_each_jobs_name_phase_and_zone_whole(width):
    text = draw(TYPICAL, width)
    headers = check_readable(text, TYPICAL, width, max_event_lines=view.EVENT_LINES)
    assert "ZONE" in headers  # job, phase and zone: whole, at every one of these widths
    _, cells, _ = read_back(text, TYPICAL)
    for r, c in zip(TYPICAL, cells):
        assert c["PHASE"] == r["phase"] and c["ZONE"] in ({r["zone"], f"{r['zone']} ({r['provisioning']})"}
                                                          if r["zone"] else {"—"})
    # the long events were cut at a word, with an ellipsis, in two lines
    events = dict(zip([r["job"] for r in TYPICAL], read_back(text, TYPICAL)[2]))
    assert events["vit-pretrain"][-1].endswith(view.ELLIPSIS) and len(events["vit-pretrain"]) == 2
    assert events["rl-agent"][-1].endswith(view.ELLIPSIS)
    assert "! gpt-locked: checkpoints not readable: gs://denied/run/*: 403" in text.replace("\n  ", " ")


def test_columns_give_way_in_priority_order_as_the_terminal_narrows():
    shown = {w: read_back(draw(TYPICAL, w), TYPICAL)[0] for w in (60, 80, 100, 150)}
    assert shown[60] == ["JOB", "PHASE", "ZONE"]
    assert shown[80] == ["JOB", "PHASE", "LOSSES", "ZONE", "CHECKPOINT", "AGE"]
    assert shown[100] == ["JOB", "PHASE", "ATTEMPT", "LOSSES", "ZONE", "CHECKPOINT", "AGE"]
    assert shown[150] == WIDE_HEADERS  # the wide set, as --wide draws it
    for keys in view.LAYOUTS:  # each layout is the previous one less one thing, job and phase kept
        assert keys[:2] == ("job", "phase")
    assert draw(TYPICAL, 150) == draw(TYPICAL, 150, wide=True)


def test_at_150_columns_everything_shows_and_the_events_are_whole():
    text = draw(TYPICAL, 150)
    check_readable(text, TYPICAL, 150, max_event_lines=None)
    assert "llm-finetune-3-0 (8412345678901234567)" in text and "northamerica-northeast1-b (spot)" in text
    assert "…" not in text


def test_wide_draws_every_column_even_at_80_and_lets_the_terminal_wrap_the_lines():
    text = draw(TYPICAL, 80, wide=True)
    check_readable(text, TYPICAL, None, max_event_lines=None)  # nothing cut, nothing left out
    assert read_back(text, TYPICAL)[0] == WIDE_HEADERS
    assert max(len(line) for line in text.splitlines()) > 80


def test_a_name_of_the_longest_kind_is_never_cut_even_where_its_row_is_wider_than_the_terminal():
    rows = [_row("a" * names.MAX_JOB_NAME, "PROVISIONING", zone="us-central1-a", last_event="x: " + "word " * 40)]
    assert read_back(draw(rows, 66), rows)[0] == ["JOB", "PHASE"]
    check_readable(draw(rows, 60), rows, 64, max_event_lines=view.EVENT_LINES)  # 64: the terminal wraps it


def test_watch_gives_the_events_fewer_lines_where_the_terminal_is_not_tall_enough():
    def lines(height: int) -> list[str]:
        console = Console(width=80, height=height, record=True, color_system=None, file=io.StringIO())
        console.print(view.watched(TYPICAL))
        return console.export_text().splitlines()

    assert len(lines(40)) == 1 + 8 + 10 + 2  # header, rows, events (two of them on two lines), the problem
    assert len(lines(21)) == 1 + 8 + 10 + 2
    assert len(lines(20)) == 1 + 8 + 8 + 2 and lines(20)[8].startswith("    launch: preempted:")  # one line each
    assert lines(20)[8].endswith(view.ELLIPSIS)
    assert len(lines(12)) == 1 + 8 + 2  # no room for events: the rows stay


def test_wrap_breaks_between_words_and_cuts_after_a_whole_word():
    assert view.wrap("one two three four", 9) == ["one two", "three", "four"]
    assert view.wrap("one two three four five six", 9, max_lines=2) == ["one two", "three…"]
    assert view.wrap("gs://a-very-long-uri-with-no-space", 10) == ["gs://a-ver", "y-long-uri", "-with-no-s", "pace"]
    assert view.wrap("", 10) == [] and view.wrap("short", 10, max_lines=2) == ["short"]
    for width in range(4, 30):
        for line in view.wrap(TYPICAL[5]["last_event"], width, max_lines=2):
            assert len(line) <= width


def test_one_jobs_details_read_at_80_columns():
    row = {**TYPICAL[2], "goodput": {"goodput": 0.873, "useful_hours": 12.4, "accelerator_hours": 14.2},
           "checkpoint_every_s": 1500.0, "advice_at": "2026-01-01T00:00:00+00:00",
           "zone_advice": {"us-central1-a": {"obtainability": 0.9, "uptime_s": 4 * 86400, "preemption_rate": 0.25,
                                             "goodput": 0.9612, "per_dollar": 4.3701, "value": 4.37},
                           "us-central1-b": {"obtainability": 0.5, "uptime_s": None, "preemption_rate": 0.01}}}
    for width in (60, 80, 100):
        console = Console(width=width, record=True, color_system=None, file=io.StringIO())
        console.print(view.goodput_line(row))
        console.print(view.AdviceTable(row))
        text = console.export_text()
        assert max(len(line) for line in text.splitlines()) <= width, text
        flat = " ".join(text.split())
        assert ("goodput 87.3% (12.40 of 14.20 accelerator-hours useful); checkpoint every 25m advised "
                "(respawn report llm-finetune)") in flat
        advice = {l.split()[0]: l for l in text.splitlines() if l.startswith("us-central1-")}
        # What placement weighed stays at every width; Google's preemption share gives way first.
        assert "96%, 4.37 h/$" in advice["us-central1-a"] and "us-central1-b ←" in advice["us-central1-b"]
        assert advice["us-central1-b"].rstrip().endswith("—")  # a status from before the figure was kept
        assert ("25.0%" in advice["us-central1-a"]) is (width == 100)


def test_what_a_dollar_buys_keeps_three_figures_in_the_zone_table():
    row = {**TYPICAL[2], "advice_at": "2026-01-01T00:00:00+00:00",
           "zone_advice": {"us-central1-a": {"obtainability": 0.9, "goodput": 0.9027, "per_dollar": 0.00403}}}
    console = Console(width=100, record=True, color_system=None, file=io.StringIO())
    console.print(view.AdviceTable(row))
    assert "90%, 0.00403 h/$" in console.export_text()


def test_the_advised_interval_says_how_sure_its_time_between_losses_is():
    """Issue 36: the advice says how sure the estimate it rests on is (ledger.lifetime)."""
    row = {**TYPICAL[2], "goodput": None, "checkpoint_every_s": 1500.0,
           "lifetime": {"mean_s": 6000.0, "low_s": 3390.0, "high_s": 16320.0, "losses": 1}}
    text = view.goodput_line(row).text
    assert "checkpoint every 25m advised (time between losses ~1.7h, 80 %: 56m-4.5h)" in text
    for odd in (None, {}, {"mean_s": "x", "low_s": 1.0, "high_s": 2.0}, {"mean_s": 1.0, "low_s": -1.0, "high_s": 2.0}):
        assert "time between losses" not in view.goodput_line({**row, "lifetime": odd}).text  # third-party bytes
    assert "time between losses" not in view.goodput_line({**row, "checkpoint_every_s": None}).text


# -- the command, over the in-memory store ---------------------------------------------------------

@pytest.fixture
def mem(monkeypatch) -> Harness:
    h = Harness()
    bootstrap.override(None, Settings(bucket=BUCKET, project=PROJECT, trainer_service_account=TRAINER),
                       h.store, h.compute)
    return h


def _put(h: Harness, job: str, event: str, **fields) -> None:
    h.submit(job)
    at = datetime.now(UTC) - timedelta(hours=3)
    detail = event.split(": ", 1)
    st = JobStatus(created_at=at, history=(Event(at=at, event=detail[0], detail=detail[1]),), **fields)
    h.store.put(BUCKET, names.status_key(job), st.to_json())


def test_respawn_status_at_80_columns(mem, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    for r in TYPICAL[1:4]:
        _put(mem, r["job"], r["last_event"], phase=Phase(r["phase"]), attempt=r["attempt"],
             preemptions=r["preemptions"], zone=r["zone"], provisioning=r["provisioning"],
             instances=(r["instance"],))
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 0, result.output
    rows = sorted(TYPICAL[1:4], key=lambda r: r["job"])
    expected = [{**r, "instance_id": None, "checkpoint_label": None, "age_seconds": 3 * 3600} for r in rows]
    headers = check_readable(result.output, expected, 80, max_event_lines=view.EVENT_LINES)
    assert "ZONE" in headers and "INSTANCE (ID)" not in headers
    wide = runner.invoke(app, ["status", "--wide"])
    assert read_back(wide.output, expected)[0] == WIDE_HEADERS
    assert "bert-sweep-7-1-0" in wide.output and "northamerica-northeast1-b (spot)" in wide.output


def test_watch_redraws_in_place_at_the_terminals_width_of_the_moment(monkeypatch):
    """--watch is a rich Live: each refresh moves the cursor up over the last drawing and
    erases it line by line, never clearing the screen; a terminal narrowed between two
    refreshes gets the narrow layout on the next one."""
    terminal = Console(file=io.StringIO(), force_terminal=True, width=150, height=200, color_system="standard")
    monkeypatch.setattr(cli_module, "out", terminal)
    monkeypatch.setattr(Console, "clear", lambda *_: pytest.fail("--watch cleared the screen"))
    calls = []

    def rows(job):
        calls.append(job)
        if len(calls) == 3:
            terminal.width = 60  # the user narrows the window
        return TYPICAL

    monkeypatch.setattr(cli_module, "_status_rows", rows)
    result = runner.invoke(app, ["status", "--watch", "--interval", "0", "--refreshes", "2"])
    assert result.exit_code == 0, result.output
    drawn = terminal.file.getvalue()
    for clearing in ("\x1b[2J", "\x1b[3J", "\x1b[H", "\x1bc", "\x1b[?1049h"):  # clear, home, reset, alt screen
        assert clearing not in drawn
    assert "\x1b[1A\x1b[2K" in drawn  # up one line, erase it: the last drawing overwritten in place
    frames = [ANSI.sub("", f).strip("\r\n") for f in re.split(r"(?:\r?\x1b\[2K(?:\x1b\[1A\x1b\[2K)+)", drawn)]
    frames = [f for f in frames if f.startswith("JOB")]
    assert len(frames) >= 3
    assert read_back(frames[0] + "\n", TYPICAL)[0] == WIDE_HEADERS
    check_readable(frames[-1] + "\n", TYPICAL, 60, max_event_lines=view.EVENT_LINES)
    assert read_back(frames[-1] + "\n", TYPICAL)[0] == ["JOB", "PHASE", "ZONE"]


def test_a_job_that_has_not_run_yet_says_so_not_zero_percent_of_nothing():
    for total in (None, {"goodput": None, "useful_hours": 0, "accelerator_hours": 0},
                  {"goodput": 0.0, "useful_hours": 0.0, "accelerator_hours": 0.0}):
        text = view.goodput_line({**TYPICAL[2], "goodput": total, "checkpoint_every_s": None}).text
        assert text.startswith("goodput: not started (nothing paid yet); ") and "0.0%" not in text


def test_paid_time_whose_boot_is_unknown_is_said_apart_from_goodput():
    """Issue 26: attempts that ended between two passes, no trainer start on record."""
    some = {"goodput": 0.9, "useful_hours": 0.9, "accelerator_hours": 1.5, "unknown_hours": 0.5}
    text = view.goodput_line({**TYPICAL[2], "goodput": some, "checkpoint_every_s": None}).text
    assert text.startswith("goodput 90.0% (0.90 of 1.00 accelerator-hours useful; 0.50 more paid, boot unknown); ")
    every = {"goodput": None, "useful_hours": 0.0, "accelerator_hours": 0.5, "unknown_hours": 0.5}
    text = view.goodput_line({**TYPICAL[2], "goodput": every, "checkpoint_every_s": None}).text
    assert text.startswith("goodput unknown (0.50 accelerator-hours paid, boot unknown); ") and "not started" not in text


def test_the_capacity_advice_says_how_old_it_is():
    from datetime import datetime, timedelta, timezone

    then = (datetime.now(timezone.utc) - timedelta(minutes=5, seconds=2)).isoformat()
    row = {**TYPICAL[2], "advice_at": then, "zone_advice": {"us-central1-a": {"obtainability": 0.9}}}
    console = Console(width=120, record=True, color_system=None, file=io.StringIO())
    console.print(view.AdviceTable(row))
    assert f"capacity advice at the last launch ({then}, 5m" in console.export_text()


def test_the_capacity_advice_shows_a_zone_seen_stocked_out_since_as_such_not_at_its_stale_score():
    row = {**TYPICAL[2], "advice_at": "2026-01-01T00:00:00+00:00", "zone": "us-central1-b",
           "stocked_out": {"us-central1-a": "2026-01-01T00:00:09+00:00"},
           "zone_advice": {"us-central1-a": {"obtainability": 0.9}, "us-central1-b": {"obtainability": 0.9}}}
    console = Console(width=80, record=True, color_system=None, file=io.StringIO())
    console.print(view.AdviceTable(row))
    advice = {l.split()[0]: l for l in console.export_text().splitlines() if l.startswith("us-central1-")}
    assert "stocked out" in advice["us-central1-a"] and "0.90" not in advice["us-central1-a"], advice
    assert "0.90" in advice["us-central1-b"]


def test_a_jobs_row_names_the_zones_seen_stocked_out_since_its_advice():
    from controller.core.state import ZoneScore
    from controller.service.jobs import JobRow

    then = datetime(2026, 1, 1, tzinfo=UTC)
    st = JobStatus(phase=Phase.RUNNING, attempt=3, zone="us-central1-b", advice_at=then,
                   zone_advice={"us-central1-a": ZoneScore(obtainability=0.9)},
                   history=(Event(at=then - timedelta(hours=1), event="stockout", zone="us-central1-c"),
                            Event(at=then + timedelta(seconds=9), event="stockout", zone="us-central1-a")))
    row = JobRow("j", st, True, False).as_dict(then + timedelta(minutes=1), {})
    assert row["stocked_out"] == {"us-central1-a": (then + timedelta(seconds=9)).isoformat()}


def test_watch_counts_a_restarts_delay_down_at_each_redraw():
    """Issue 26: "restarting in 30s" stood still in ``--watch``; each drawing now tells it from the
    status's due time, here by a fake clock, as Live redraws the same view."""
    failed_at = datetime(2026, 1, 1, 12, tzinfo=UTC)
    row = _row("rl-agent", "RECOVERING", attempt=2, failures=1, zone="us-west1-a",
               not_before=(failed_at + timedelta(seconds=30)).isoformat(),
               last_event="failed: command exited with code 1 on rl-agent-2-0; failure 1 of 3, restarting in 30s")
    clock = [failed_at]
    drawn = view.watched([row], clock=lambda: clock[0])

    def event() -> str:
        console = Console(width=120, height=40, record=True, color_system=None, file=io.StringIO())
        console.print(drawn)
        return " ".join(console.export_text().split())

    seen = []
    for after in (0, 12, 29.5, 30, 95):
        clock[0] = failed_at + timedelta(seconds=after)
        seen.append(re.search(r"restarting (in \w+|now)", event()).group(1))
    assert seen == ["in 30s", "in 18s", "in 1s", "now", "now"], seen
    assert "failure 1 of 3, restarting in 30s" in " ".join(view.wrap(row["last_event"], 200))  # the row is unchanged
    # An event without a due time, or none to count down, is drawn as written.
    assert view.counted_down({**row, "not_before": None}, clock[0]).endswith("restarting in 30s")
    assert view.counted_down({**row, "last_event": "running: x"}, clock[0]) == "running: x"


def test_a_jobs_row_carries_its_restarts_due_time():
    from controller.service.jobs import JobRow

    due = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
    st = JobStatus(phase=Phase.RECOVERING, attempt=2, not_before=due)
    assert JobRow("j", st, True, False).as_dict(due, {})["not_before"] == due.isoformat()


def test_host_maintenance_is_counted_beside_the_preemptions_not_hidden():
    row = {**TYPICAL[2], "maintenance": 1}
    for width, shown in ((200, "2+1m"), (80, "2p/1m/0f")):
        console = Console(width=width, record=True, color_system=None, file=io.StringIO())
        console.print(view.StatusView([row], False, []))
        assert shown in console.export_text(), console.export_text()


def test_a_jobs_row_counts_its_terminating_maintenance():
    from controller.service.jobs import JobRow
    from tests.harness import Harness

    h = Harness()
    h.submit("a")
    h.tick()
    h.tick()
    h.compute.maintenance("a-1")
    h.tick()
    row = JobRow("a", h.status("a"), True, False).as_dict(h.clock.now(), {})
    assert (row["maintenance"], row["preemptions"]) == (1, 0)


# -- zero-gap recovery: the next attempt booting beside the one being preempted (issue 34) ----------

THREE_ZONES = ["us-central1-a", "us-central1-b", "us-central1-c"]


def noticed(h: Harness, step: int = 153) -> None:
    """``demo`` running in us-central1-a, its trainer at ``step`` (its heartbeat), then its VM's
    preemption notice: the standby demo-2 is inserted beside it, in us-central1-b."""
    from tests.harness import spec_doc

    h.submit("demo", spec_doc(zones=THREE_ZONES))
    h.tick()
    h.tick()
    h.checkpoint(140)
    h.heartbeat("demo", trainer_started=h.clock.now(), step=step)
    h.tick("demo")
    h.notice("demo")
    h.tick("demo")
    assert h.status("demo").standby is not None and h.status("demo").standby.inserted


def given_the_go(h: Harness, saved: int = 160, after_save_s: float = 4.2) -> None:
    """The old VM's save lands, its shutdown script writes the marker: the go. Its trainer starts
    ``after_save_s`` after the save was complete."""
    from controller.core.ports import InstanceStatus

    h.advance(seconds=30)
    h.checkpoint(saved)
    h.compute.set_status("demo-1", InstanceStatus.STOPPING)
    h.marker("demo")
    h.tick("demo")
    assert h.status("demo").held
    h.advance(seconds=after_save_s)
    h.heartbeat("demo", trainer_started=h.clock.now())
    h.tick("demo")


def status_lines(h: Harness, monkeypatch, *args: str, columns: int = 80) -> list[str]:
    monkeypatch.setenv("COLUMNS", str(columns))
    result = runner.invoke(app, ["status", *args])
    assert result.exit_code == 0, result.output
    assert all(len(line) <= columns for line in result.output.splitlines()), result.output
    return result.output.splitlines()


def test_a_standby_booting_beside_its_job_is_its_own_line_above_the_last_event(mem, monkeypatch):
    noticed(mem)
    lines = status_lines(mem, monkeypatch)
    under = [line.removeprefix(view.EVENT_INDENT) for line in lines[2:4]]
    assert under[0] == "demo-2 booting in us-central1-b while demo-1 saves (its trainer at step 153)"
    assert under[1].startswith("standby-inserted: Compute accepted demo-2 in us-central1-b")


def test_a_standby_at_its_line_says_since_when_its_ready_record_says(mem, monkeypatch):
    noticed(mem)
    mem.advance(seconds=7)
    mem.ready("demo", waiting_since=mem.clock.now())
    mem.advance(seconds=20)  # rewritten every 10 s: its own time is not when it got there
    mem.ready("demo", waiting_since=mem.clock.now() - timedelta(seconds=20))
    since = f"{mem.clock.now() - timedelta(seconds=20):%H:%M:%S}"
    assert f"    demo-2 at the starting line since {since} UTC, waiting for demo-1's save" in status_lines(mem, monkeypatch)


def test_a_ready_record_that_is_not_the_standbys_own_changes_nothing(mem, monkeypatch):
    noticed(mem)
    mem.ready("demo", token="forged", waiting_since=mem.clock.now())
    assert "    demo-2 booting in us-central1-b while demo-1 saves (its trainer at step 153)" in \
        status_lines(mem, monkeypatch)


def test_one_jobs_status_says_what_its_standbys_go_waits_for_and_when_it_is_withdrawn(mem, monkeypatch):
    noticed(mem)
    until = mem.status("demo").standby.until
    text = " ".join(" ".join(status_lines(mem, monkeypatch, "demo")).split())
    assert (f"demo-2 gets the go once demo-1's save is in: its marker, or its VMs down, or {until:%H:%M:%S} UTC "
            "if demo-1 is on its way down by then; still RUNNING then, demo-1 was not preempted and demo-2 is "
            "withdrawn") in text


def test_given_the_go_the_row_says_from_which_step_until_its_trainer_starts(mem, monkeypatch):
    from controller.core.ports import InstanceStatus

    noticed(mem)
    mem.checkpoint(160)
    mem.compute.set_status("demo-1", InstanceStatus.STOPPING)
    mem.marker("demo")
    mem.tick("demo")
    go = mem.status("demo").go_at
    assert f"    demo-2 given the go at {go:%H:%M:%S} UTC, to start from step 160" in status_lines(mem, monkeypatch)


def test_once_started_the_row_says_the_step_and_how_long_after_the_old_attempts_save(mem, monkeypatch):
    noticed(mem)
    given_the_go(mem, saved=160, after_save_s=4.2)
    lines = status_lines(mem, monkeypatch)
    assert "    demo-2 started from step 160, 4.2s after demo-1's save" in lines
    assert any(line.startswith(("    running: demo-2 past the starting line", "    training: past the starting line"))
               for line in lines)


def test_the_json_rows_carry_the_overlap_and_a_job_without_one_has_none(mem):
    noticed(mem)
    mem.submit("plain")
    mem.tick()
    rows = {r["job"]: r for r in json.loads(runner.invoke(app, ["status", "--json"]).stdout)}
    assert rows["demo"]["overlap"] == "demo-2 booting in us-central1-b while demo-1 saves (its trainer at step 153)"
    assert rows["demo"]["standby_waits"].startswith("demo-2 gets the go once demo-1's save is in")
    assert rows["plain"]["overlap"] is None and rows["plain"]["standby_waits"] is None


@pytest.mark.parametrize("width", [60, 80])
def test_a_long_overlap_wraps_between_words_and_watch_squeezes_it_like_the_events(width):
    overlap = "a-long-job-name-7 booting in northamerica-northeast1-b while a-long-job-name-6 saves"
    row = {**TYPICAL[2], "overlap": overlap}
    console = Console(width=width, height=40, record=True, color_system=None, file=io.StringIO())
    console.print(view.StatusView([row]))
    under = [l.removeprefix(view.EVENT_INDENT) for l in console.export_text().splitlines()[2:]]
    assert " ".join(under).startswith(overlap) and all(len(l) <= width - len(view.EVENT_INDENT) for l in under)
    for height, under_rows in ((6, 3), (4, 0)):  # one line each for the overlap and the event, then none
        short = Console(width=width, height=height, record=True, color_system=None, file=io.StringIO())
        short.print(view.watched([row, TYPICAL[0]]))
        drawn = short.export_text().splitlines()
        assert len([l for l in drawn if l.startswith(view.EVENT_INDENT)]) == under_rows, drawn
