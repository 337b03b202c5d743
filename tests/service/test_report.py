"""``respawn report``: the goodput ledger as a summary, a timeline picture and a page, over the in-memory fakes."""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from matplotlib import image
from matplotlib.colors import to_rgb
from rich.console import Console
from typer.testing import CliRunner

from controller.service import bootstrap
from controller.core import ledger
from controller.render import report
from controller.core import checkpoints, names
from controller.cli.main import app
from controller.service.config import Settings
from controller.core.state import JobStatus, Phase
from tests.harness import BUCKET, PROJECT, TRAINER, Harness, spec_doc
from tests.service.test_ledger import save

runner = CliRunner()
A, B = "us-central1-a", "us-central1-b"


def preempted_then_succeeded() -> Harness:
    """Attempt 1 in A: RUNNING after 3 min, saves step 100 (120 s of writing) at 35 min, preempted
    with notice at 55 min while A is stocked out; attempt 2 goes to B, RUNNING 2 min later, succeeds."""
    h = Harness()
    h.submit("llm", spec_doc(zones=[A, B]))
    h.tick()
    h.advance(minutes=3)
    h.tick()
    h.advance(minutes=30)
    save(h, 100, write_s=120)
    h.advance(minutes=20)
    h.marker("llm")
    h.compute.stockouts.add(A)
    h.advance(seconds=10)
    h.tick()  # seen; A refuses attempt 2, B takes it
    h.advance(minutes=2)
    h.tick()
    h.advance(minutes=50)
    h.exit("llm", 0)
    h.tick()
    assert h.status("llm").phase == Phase.SUCCEEDED
    return h


# Paid: 55 min + 52 min (attempt 2, from 55m10s to 1h47m10s); booting 3 + 2 min; redone: the
# 20 minutes from the save to the preemption. Useful 82 of 107 minutes: 76.6 %.
PAID_MIN, USEFUL_MIN = 107, 82


@pytest.fixture
def day() -> Harness:
    return preempted_then_succeeded()


def text_of(renderable: object) -> str:
    console = Console(width=200, file=io.StringIO(), record=True)
    console.print(renderable)
    return console.export_text()


def table_row(text: str, first: str) -> list[str]:
    """The cells of the row whose first cell is ``first``: a bordered table's (the summary), or a
    plain grid's (the attempts, the losses by zone: columns two spaces apart, as ``respawn status``)."""
    for line in text.splitlines():
        if re.search(r"[│┃]", line):
            cells = [c.strip() for c in re.split(r"[│┃]", line)[1:-1]]
        else:
            cells = re.split(r"\s{2,}", line.strip())
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in\n{text}")


def test_the_summary_gives_the_ledgers_figures(day):
    st = day.status("llm")
    text = text_of(report.render_text("llm", st, day.clock.now()))
    assert table_row(text, "goodput")[1] == f"{USEFUL_MIN / PAID_MIN:.1%}" == "76.6%"
    assert table_row(text, "accelerator-hours")[1] == "1.78 paid: 0.083 booting, 0.33 redone, 1.37 useful"
    assert table_row(text, "cost")[1] == "$0.39 against $1.27 on demand: $0.87 saved (69%)"
    assert "respawn's price table" in table_row(text, "prices from")[1]
    assert table_row(text, "recoveries")[1] == "1, mean 2m10s; per loss p50 2m10s, max 2m10s (last 1)"
    assert st.checkpoint_every_s is not None
    assert table_row(text, "checkpoint")[1] == \
        f"advised every {report.human(st.checkpoint_every_s)} (Young/Daly); a save takes at least 2m"
    assert table_row(text, "between losses")[1] == report.lifetime(st.lifetime) == \
        f"~52m (80 %: {st.lifetime.low_s / 60:.0f}m-{st.lifetime.high_s / 3600:.1f}h), from 1 loss in 52m alone (no advice)"
    # The attempts, and each zone's losses by cause and stockouts.
    assert table_row(text, "1")[1:] == [A, "spot", "scratch", "2026-01-01 00:00:00", "55m", "preempted"]
    assert table_row(text, "2")[1:] == [B, "spot", "step 100", "2026-01-01 00:55:10", "52m", "succeeded"]
    assert table_row(text, A) == [A, "preempted 1", "1"]
    with pytest.raises(AssertionError):  # nothing lost in B, nor refused
        table_row(text.split("losses by zone")[1], B)


def colour_pixels(png: np.ndarray, colour: str) -> np.ndarray:
    """(row, column) of every pixel of exactly ``colour`` (to within rounding)."""
    return np.argwhere(np.all(np.abs(png[..., :3] - np.array(to_rgb(colour))) < 1.5 / 255, axis=-1))


def outcome_colour(kind: str) -> str:
    return report.OUTCOMES[kind][1]


def test_the_picture_shows_each_attempt_in_its_zones_lane_coloured_by_how_it_ended(day, tmp_path):
    path = report.draw("llm", day.status("llm"), day.clock.now(), tmp_path / "llm.png")
    png = image.imread(path)
    preempted, succeeded = colour_pixels(png, outcome_colour("preempted")), colour_pixels(png, outcome_colour("succeeded"))
    # Bars, not just the legend's swatches (a few hundred pixels each).
    assert len(preempted) > 5000 and len(succeeded) > 5000, (len(preempted), len(succeeded))
    # Attempt 1 on A's lane (the top one) and first in time; attempt 2 on B's lane, after it.
    assert np.median(preempted[:, 0]) < np.median(succeeded[:, 0])
    assert np.median(preempted[:, 1]) < np.median(succeeded[:, 1])
    for unused in ("maintenance", "failed", "running", "recycled"):
        assert len(colour_pixels(png, outcome_colour(unused))) == 0, unused


def test_a_running_attempt_is_drawn_up_to_now_in_its_own_colour(tmp_path):
    h = Harness()
    h.submit("llm")
    h.tick()
    h.advance(minutes=3)
    h.tick()
    h.advance(hours=2)
    st = h.status("llm")
    assert st.ledger.open is not None
    png = image.imread(report.draw("llm", st, h.clock.now(), tmp_path / "running.png"))
    assert len(colour_pixels(png, outcome_colour("running"))) > 5000
    assert len(colour_pixels(png, outcome_colour("succeeded"))) == 0


def test_the_page_embeds_the_picture_and_the_summary_with_nothing_external(day, tmp_path):
    path = report.draw("llm", day.status("llm"), day.clock.now(), tmp_path / "llm.html")
    page = path.read_text()
    (embedded,) = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert base64.b64decode(embedded).startswith(b"\x89PNG\r\n\x1a\n")
    assert "<td>76.6%</td>" in page and f"<td>{A}</td><td>preempted 1</td><td>1</td>" in page
    assert page.count("<table") == 4  # the summary, the attempts, the losses, the losses by zone
    assert not re.search(r"(src|href)=\"(?!data:)|<script|<link|@import|url\(", page)


def test_a_picture_is_a_png_or_an_html_file(day, tmp_path):
    with pytest.raises(ValueError, match="png or an .html"):
        report.draw("llm", day.status("llm"), day.clock.now(), tmp_path / "llm.svg")
    as_png = report.draw("llm", day.status("llm"), day.clock.now(), tmp_path / "llm.picture", kind="png")
    assert as_png.read_bytes().startswith(b"\x89PNG")


def test_a_job_with_nothing_paid_yet_still_has_a_report(tmp_path):
    st = JobStatus(created_at=datetime(2026, 1, 1, tzinfo=UTC))
    assert "goodput" in text_of(report.render_text("new", st, datetime(2026, 1, 2, tzinfo=UTC)))
    assert image.imread(report.draw("new", st, datetime(2026, 1, 2, tzinfo=UTC), tmp_path / "new.png")).size


# -- the CLI ---------------------------------------------------------------------------------------

@pytest.fixture
def cli(day, monkeypatch) -> Harness:
    monkeypatch.setenv("COLUMNS", "200")
    bootstrap.override(None, Settings(bucket=BUCKET, project=PROJECT, trainer_service_account=TRAINER),
                       day.store, day.compute)
    return day


def test_report_prints_the_summary_and_writes_the_picture_and_the_page(cli, tmp_path):
    png, page = tmp_path / "out.png", tmp_path / "out.html"
    result = runner.invoke(app, ["report", "llm", "--png", str(png), "--html", str(page)])
    assert result.exit_code == 0, result.output
    assert table_row(result.output, "goodput")[1] == "76.6%" and table_row(result.output, A)[1] == "preempted 1"
    assert f"wrote {png}" in result.output and f"wrote {page}" in result.output
    assert png.read_bytes().startswith(b"\x89PNG") and "data:image/png;base64," in page.read_text()


def test_report_json_is_the_ledger_and_its_summary(cli):
    result = runner.invoke(app, ["report", "llm", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    st = cli.status("llm")
    assert doc["summary"] == json.loads(ledger.summary(st.ledger, cli.clock.now()).model_dump_json())
    assert [s["cause"] for s in doc["ledger"]["spans"]] == ["preempted", "succeeded"]
    assert doc["checkpoint_every_s"] == st.checkpoint_every_s
    assert doc["lifetime"] == st.lifetime.model_dump(mode="json") and doc["lifetime"]["losses"] == 1


def test_report_of_an_unknown_job_or_one_without_a_status_exits_2(cli):
    result = runner.invoke(app, ["report", "no-such-job"])
    assert result.exit_code == 2 and result.output.strip() == f"✗ no job named 'no-such-job' in gs://{BUCKET}"
    cli.submit("queued")
    result = runner.invoke(app, ["report", "queued"])
    assert result.exit_code == 2 and "'queued' has no readable status yet" in result.output


def test_status_of_a_job_shows_its_goodput_and_the_advised_checkpoint_interval(cli):
    result = runner.invoke(app, ["status", "llm"])
    assert result.exit_code == 0, result.output
    every = report.human(cli.status("llm").checkpoint_every_s)
    assert (f"goodput 76.6% (1.37 of 1.78 accelerator-hours useful); a save takes at least 2m (from GCS times); "
            f"checkpoint every {every} advised") in result.output
    (row,) = json.loads(runner.invoke(app, ["status", "llm", "--json"]).stdout)
    assert round(row["goodput"]["goodput"], 3) == round(USEFUL_MIN / PAID_MIN, 3)
    assert row["checkpoint_every_s"] == cli.status("llm").checkpoint_every_s
    table = runner.invoke(app, ["status"]).output
    assert "goodput" not in table  # the table of every job is unchanged


def test_only_drawing_loads_matplotlib():
    """The functions and every other command start without it (requirements.txt does not have it)."""
    import subprocess
    import sys

    code = ("import sys, main, controller.cli.main, controller.render.report; "
            "assert 'matplotlib' not in sys.modules, 'matplotlib loaded'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_checkpoint_cost_is_told_as_a_lower_bound_and_where_it_comes_from(day):
    """C is read from Cloud Storage (the trainer cannot report it yet): the report says so, and
    that it is a lower bound, never a measured save."""
    st = day.status("llm")
    text = text_of(report.render_text("llm", st, day.clock.now()))
    said = table_row(text, "checkpoint")[1]
    assert "measured" not in said and "a save takes at least 2m" in said
    source = table_row(text, "save time from")[1]
    assert "a lower bound from Cloud Storage" in source and "1 GB/s" in source
    doc = report.as_json("llm", st, day.clock.now())
    assert doc["checkpoint_cost"] == {"at_least_s": 120.0, "source": checkpoints.WRITE_TIME_SOURCE}


def test_time_waiting_for_capacity_is_its_own_line_not_paid_hours():
    """A Flex-start VM 5 h in PENDING, then 1 h RUNNING: the report and `respawn status` tell the
    waiting apart, and the paid hours are the hour it ran."""
    from controller.render import status_view

    h = Harness()
    h.compute.stockouts.update({A, B})
    h.submit("llm", spec_doc(zones=[A, B], provisioning="flex-start", policy={"max_run_duration": "3d"}))
    h.tick()
    h.tick()
    h.advance(hours=5)
    h.compute.set_status("llm-1", "RUNNING")
    h.tick()
    h.advance(hours=1)
    st, now = h.status("llm"), h.clock.now()
    text = text_of(report.render_text("llm", st, now))
    assert table_row(text, "waiting")[1].startswith("4h58m for capacity (Flex-start PENDING")
    assert table_row(text, "accelerator-hours")[1].startswith("1.03 paid")
    doc = report.as_json("llm", st, now)
    assert round(doc["summary"]["waiting_hours"], 2) == 4.97
    row = {"job": "llm", "goodput": doc["summary"], "checkpoint_every_s": None}
    assert "4h58m waiting for capacity, not billed" in status_view.goodput_line(row).text


# -- at 80 columns (issue 26: every zone was cut to ``us-centra…`` and "started (UTC)" wrapped) ----

LONG_ZONES = ("us-central1-a", "europe-west4-b", "northamerica-northeast1-a")


def three_zones(h: Harness) -> JobStatus:
    """The day's status with a third attempt, the three in zones of every length Google has."""
    st = h.status("llm")
    spans = [*st.ledger.spans, st.ledger.spans[-1].model_copy(update={"attempt": 3})]
    spans = [s.model_copy(update={"zone": zone}) for s, zone in zip(spans, LONG_ZONES, strict=True)]
    return st.model_copy(update={"ledger": st.ledger.model_copy(update={"spans": spans})})


@pytest.mark.parametrize("width", [80, 100, 60])
def test_at_80_columns_each_attempts_zone_and_start_are_whole_on_its_line(day, width):
    st = three_zones(day)
    console = Console(width=width, file=io.StringIO(), record=True)
    console.print(report.render_text("llm", st, day.clock.now()))
    text = console.export_text()
    lines = text.splitlines()
    assert "…" not in text, text
    for span, zone in zip(st.ledger.spans, LONG_ZONES, strict=True):
        row = table_row(text, str(span.attempt))
        assert row[1] == zone, text
        if width >= 80:  # the start, whole, on the same line (it gives way only below 80)
            assert f"{span.start:%H:%M:%S}" in " ".join(row), text
    if width <= 80:
        assert max(len(line.rstrip()) for line in lines) <= width, text
    assert table_row(text, "1")[-1] == "preempted" and table_row(text, "3")[-1] == "succeeded"


def test_report_at_columns_80_shows_each_attempts_whole_zone(cli, monkeypatch):
    """``respawn report`` in an 80-column terminal, as a newcomer runs it."""
    monkeypatch.setenv("COLUMNS", "80")
    result = runner.invoke(app, ["report", "llm"])
    assert result.exit_code == 0, result.output
    assert table_row(result.output, "1")[1] == A and table_row(result.output, "2")[1] == B
    assert table_row(result.output, "1")[-1] == "preempted"
    assert "us-centra…" not in result.output
    assert max(len(line.rstrip()) for line in result.output.splitlines()) <= 80, result.output


# -- issue 26, Major 5: an attempt that ended between two passes -------------------------------

def ended_between_passes(started_after_s: float | None) -> Harness:
    """One attempt, never seen RUNNING by a pass: its exit 0 lands 10 minutes after its insert,
    naming its trainer's start (``started_after_s`` into the attempt) or not (an older agent)."""
    h = Harness()
    h.submit("llm")
    h.tick()  # inserted; no pass sees it RUNNING
    t0 = h.clock.now()
    h.advance(minutes=10)
    h.exit("llm", 0, trainer_started=None if started_after_s is None else t0 + timedelta(seconds=started_after_s))
    h.tick()
    assert h.status("llm").phase == Phase.SUCCEEDED
    return h


def test_an_attempt_that_ended_between_passes_boots_only_until_its_trainer_started(tmp_path):
    h = ended_between_passes(30)
    st = h.status("llm")
    (span,) = st.ledger.spans
    assert span.trainer_started is not None and not span.boot_unknown
    total = ledger.summary(st.ledger, h.clock.now())
    assert math.isclose(total.boot_hours * 3600, 30) and total.unknown_hours == 0
    assert math.isclose(total.goodput, (600 - 30) / 600)
    text = text_of(report.render_text("llm", st, h.clock.now()))
    assert table_row(text, "1")[-1] == "succeeded" and "unknown" not in text
    png = image.imread(report.draw("llm", st, h.clock.now(), tmp_path / "known.png"))
    assert len(colour_pixels(png, outcome_colour("succeeded"))) > 5000, "drawn all boot"


def test_an_attempt_that_ended_between_passes_without_a_trainer_start_says_boot_unknown(tmp_path):
    h = ended_between_passes(None)
    st = h.status("llm")
    total = ledger.summary(st.ledger, h.clock.now())
    assert total.boot_hours == 0 and math.isclose(total.unknown_hours, 10 / 60) and total.goodput is None
    text = text_of(report.render_text("llm", st, h.clock.now()))
    assert table_row(text, "1")[-1] == "succeeded (boot unknown)"
    assert "10.00 accelerator-minutes boot unknown" in table_row(text, "goodput")[1]
    assert table_row(text, "accelerator-minutes")[1].endswith(", 10.00 boot unknown")
    png = image.imread(report.draw("llm", st, h.clock.now(), tmp_path / "unknown.png"))
    from matplotlib.colors import to_hex

    light = len(colour_pixels(png, to_hex(report._light(outcome_colour("succeeded")))))
    solid = len(colour_pixels(png, outcome_colour("succeeded")))  # its cross-hatching, and the legend's swatch
    assert light > 5 * solid, ("a guessed split drawn as training", light, solid)


# -- what a hand edit can write --------------------------------------------------------------------

def _hand_edited(edit) -> JobStatus:
    """A RUNNING status one attempt old, as JSON, edited as anyone who can write the bucket may."""
    doc = {"phase": "RUNNING", "attempt": 1, "created_at": "2026-01-01T00:00:00Z",
           "ledger": {"spans": [{"attempt": 1, "zone": A, "start": "2026-01-01T00:00:00Z",
                                 "running": "2026-01-01T00:02:00Z"}]}}
    edit(doc)
    return JobStatus.model_validate_json(json.dumps(doc))


def _mark(at: str):
    return lambda doc: doc["ledger"].setdefault("marks", []).append({"at": at, "kind": "stockout", "zone": A})


def _loss(redone_s: float):
    return lambda doc: doc["ledger"].setdefault("losses", []).append(
        {"attempt": 1, "cause": "preempted", "seen_at": "2026-01-01T01:00:00Z", "redone_s": redone_s})


HAND_EDITS = {
    "a mark in year 9999": _mark("9999-12-31T00:00:00Z"),
    "an attempt begun in year 1": lambda doc: doc["ledger"]["spans"][0].update(start="0001-01-01T00:00:00Z"),
    "year 1 in a zone ahead of UTC": lambda doc: doc["ledger"]["spans"][0].update(start="0001-01-01T00:00:00+14:00"),
    "training redone for 1e300 s": _loss(1e300),
    "training redone for NaN s": _loss(math.nan),
    "a checkpoint at step 10**400": lambda doc: doc["ledger"].update(checkpoints=[["2026-01-01T00:30:00Z", 10**400]]),
}


@pytest.mark.parametrize("edit", HAND_EDITS.values(), ids=HAND_EDITS.keys())
def test_a_status_whose_ledger_cannot_be_drawn_gives_a_picture_of_one_line_saying_why(edit, tmp_path):
    st = _hand_edited(edit)
    now = datetime(2026, 1, 1, 3, tzinfo=UTC)
    png = report.draw("llm", st, now, tmp_path / "odd.png")
    assert image.imread(png).size
    picture = report.timeline("llm", st, now)
    assert picture.png == png.read_bytes() and picture.note.startswith("timeline not drawn: ")
    assert "\n" not in picture.note and len(picture.note) < 200


_LIFETIME = {"mean_s": 6000.0, "low_s": 3390.0, "high_s": 16320.0, "losses": 1, "running_s": 3000.0}


@pytest.mark.parametrize("figure", [math.nan, math.inf, -6000.0, 0.0, None])
def test_a_time_between_losses_a_hand_edit_broke_is_left_out_of_the_report_never_an_exception(figure):
    st = _hand_edited(lambda doc: doc.update(checkpoint_every_s=1500.0, lifetime={**_LIFETIME, "mean_s": figure}))
    assert st.lifetime is None  # nothing a run could have estimated (null: an infinity the controller wrote)
    text = text_of(report.render_text("llm", st, datetime(2026, 1, 1, 3, tzinfo=UTC)))
    assert "between losses" not in text and "advised every 25m" in text
    whole = _hand_edited(lambda doc: doc.update(checkpoint_every_s=1500.0, lifetime=_LIFETIME))
    assert report.lifetime(whole.lifetime).startswith("~1.7h (80 %: 56m-4.5h)")


def test_the_page_of_a_status_that_cannot_be_drawn_has_the_line_in_place_of_the_timeline(tmp_path):
    st = _hand_edited(_mark("9999-12-31T00:00:00Z"))
    now = datetime(2026, 1, 1, 3, tzinfo=UTC)
    note = report.timeline("llm", st, now).note
    page = report.draw("llm", st, now, tmp_path / "odd.html").read_text()
    assert f'alt="{html.escape(note, quote=True)}"' in page and "data:image/png;base64," in page


def test_report_of_a_status_that_cannot_be_drawn_writes_the_line_and_says_it_exit_0(cli, tmp_path):
    cli.store.put(BUCKET, names.status_key("llm"), _hand_edited(_mark("9999-12-31T00:00:00Z")).to_json())
    png, page = tmp_path / "out.png", tmp_path / "out.html"
    result = runner.invoke(app, ["report", "llm", "--png", str(png), "--html", str(page)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and f"wrote {png}" in result.output and f"wrote {page}" in result.output
    assert "! timeline not drawn: its ledger has a time (9999-12-31T00:00:00+00:00) outside the years" in result.output
    assert image.imread(png).size and "data:image/png;base64," in page.read_text()


_TIMES = hs.one_of(hs.datetimes(min_value=datetime(2025, 12, 31), max_value=datetime(2026, 1, 2),
                                 timezones=hs.just(UTC)),  # a controller's (drawn: matplotlib's refusals are met)
                   hs.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                                timezones=hs.one_of(hs.none(), hs.timezones())))
_SECONDS = hs.one_of(hs.floats(allow_nan=True, allow_infinity=True), hs.integers(-10**30, 10**30))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spans=hs.lists(hs.fixed_dictionaries({"attempt": hs.integers(1, 5), "zone": hs.sampled_from([A, B, None]),
                                             "start": _TIMES},
                                            optional={"end": _TIMES, "running": _TIMES, "trainer_started": _TIMES,
                                                      "cause": hs.sampled_from(["preempted", "failed", "odd"])}),
                      max_size=3),
       marks=hs.lists(hs.fixed_dictionaries({"at": _TIMES, "kind": hs.sampled_from(["stockout", "preempted", "?"])}),
                      max_size=2),
       losses=hs.lists(hs.fixed_dictionaries({"attempt": hs.integers(1, 5), "cause": hs.just("preempted"),
                                              "seen_at": _TIMES},
                                             optional={"lost_at": _TIMES, "redone_s": _SECONDS,
                                                       "steps_lost": hs.integers(-10**20, 10**20)}), max_size=2),
       saves=hs.lists(hs.tuples(_TIMES, hs.integers(-10**400, 10**400)), max_size=2),
       now=_TIMES)
def test_any_ledger_a_hand_edit_can_write_gives_a_picture_never_an_exception(spans, marks, losses, saves, now):
    book = ledger.Ledger.model_validate({"spans": spans, "marks": marks, "losses": losses, "checkpoints": saves})
    picture = report.timeline("hand", JobStatus(phase=Phase.RUNNING, ledger=book), now)
    assert picture.png.startswith(b"\x89PNG")
    assert picture.note is None or (picture.note.startswith("timeline not drawn: ") and "\n" not in picture.note)


# -- zero-gap recovery: the standby beside the attempt it replaces (issue 34) -------------------------

def zero_gap_run() -> Harness:
    """Attempt 1 in A: at 55 min its VM's preemption notice boots attempt 2 in B beside it; its save
    (step 200) is in 110 s later and attempt 2 gets the go, its trainer starting 3 s after. At 1h35m
    attempt 2's notice, with A stocked out, boots attempt 3 in B too (the preempting zone, last); the
    go 100 s later. At 2h05m a notice comes to nothing (attempt 4 withdrawn, 160 s of boot paid), and
    at 2h35m another boots attempt 5 in A, 40 s before the picture is drawn."""
    from controller.core.ports import InstanceStatus

    h = Harness()
    h.submit("llm", spec_doc(zones=[A, B]))
    h.tick()
    h.advance(minutes=3)
    h.tick()

    def beat_until(minutes: float) -> None:
        while h.clock.now() < T0 + timedelta(minutes=minutes):
            h.advance(minutes=1)
            h.heartbeat("llm", trainer_started=h.clock.now() if h.status("llm").attempt == 1 else None)
            h.tick("llm")

    def noticed_then_saved(step: int, save_after_s: float) -> None:
        h.notice("llm")
        h.tick("llm")
        h.advance(seconds=save_after_s)
        h.checkpoint(step)
        h.compute.set_status(h.status("llm").instances[0], InstanceStatus.STOPPING)
        h.marker("llm")
        h.tick("llm")
        h.advance(seconds=3)
        h.heartbeat("llm", trainer_started=h.clock.now())
        h.tick("llm")

    beat_until(55)
    noticed_then_saved(200, 110)
    beat_until(95)
    h.compute.stockouts.add(A)
    noticed_then_saved(300, 100)
    h.compute.stockouts.clear()
    beat_until(125)
    h.notice("llm")
    h.tick("llm")
    h.advance(seconds=160)
    h.tick("llm")  # still RUNNING past the line's bound: withdrawn
    beat_until(155)
    h.notice("llm")
    h.tick("llm")
    h.advance(seconds=40)
    return h


T0 = datetime(2026, 1, 1, tzinfo=UTC)  # the harness's clock at its start


@pytest.fixture(scope="module")
def gapless() -> Harness:
    return zero_gap_run()


def test_the_summary_says_which_attempts_booted_at_a_notice_and_how_soon_their_trainers_started(gapless):
    st = gapless.status("llm")
    assert [s.attempt for s in st.ledger.spans] == [1, 2, 3] and st.standby is not None and st.standby.attempt == 5
    said = dict(report.facts(st, gapless.clock.now(), job="llm"))["zero-gap"]
    assert table_row(text_of(report.render_text("llm", st, gapless.clock.now())), "zero-gap")[1] in said
    assert said == ("2 attempts booted at the notice of the one before, their trainers started 3s, 3s after "
                           "the save each resumed from; 1 standby withdrawn before its go (2m40s of boot paid, no "
                           "training); now: llm-5 booting in us-central1-a while llm-3 saves"), said


def test_a_run_that_never_had_a_standby_has_no_zero_gap_line(day):
    assert all(what != "zero-gap" for what, _ in report.facts(day.status("llm"), day.clock.now(), job="llm"))


def test_the_timeline_draws_the_standbys_boot_and_time_at_the_line_under_the_old_attempts_save(gapless):
    st, now = gapless.status("llm"), gapless.clock.now()
    lanes = report._lanes(st.ledger, [(b.start, b.zone) for b in report.side_bars(st, now)])
    drawn = report.pieces("llm", st, lanes, now, report.side_bars(st, now))
    one, two = st.ledger.spans[0], st.ledger.spans[1]
    at_line = [p for p in drawn if p.attempt == 2 and p.hatch == report.LINE_HATCH]
    (held,) = at_line
    go = next(e.at for e in st.history if e.event == "launch" and e.attempt == 2)
    # From Compute's acceptance at attempt 1's notice to the go, on B's lane, while attempt 1 still runs in A.
    assert (held.start, held.end, held.lane) == (two.start, go, lanes[B]) and held.start < one.end
    assert any(p.attempt == 1 and p.hatch is None and p.start <= held.start and one.end <= p.end for p in drawn)
    assert not held.half  # alone on its lane


def test_a_standby_in_the_preempting_zones_lane_takes_its_lower_half_while_both_are_there(gapless):
    st, now = gapless.status("llm"), gapless.clock.now()
    lanes = report._lanes(st.ledger)
    drawn = [p for p in report.pieces("llm", st, lanes, now) if p.attempt == 3]
    two = st.ledger.spans[1]
    assert {p.lane for p in drawn} == {lanes[B]}
    assert [p.half for p in drawn if p.end <= two.end] == [True] and all(not p.half for p in drawn if p.start >= two.end)
    assert all(not p.half for p in report.pieces("llm", st, lanes, now) if p.attempt == 2)  # the old one keeps its lane


def test_a_withdrawn_standby_is_drawn_as_paid_boot_and_the_standby_booting_now_up_to_now(gapless, tmp_path):
    st, now = gapless.status("llm"), gapless.clock.now()
    sides = report.side_bars(st, now)
    assert [(b.zone, b.end - b.start, b.withdrawn) for b in sides] == [
        (A, timedelta(seconds=160), True), (A, timedelta(seconds=40), False)]
    assert sides[1].end == now
    png = image.imread(report.draw("llm", st, now, tmp_path / "gapless.png"))
    assert len(colour_pixels(png, report._light(report.WITHDRAWN_COLOUR))) > 600  # its bar, not only its legend swatch
    assert len(colour_pixels(png, report.GO_COLOUR)) > 0


def test_a_standby_whose_times_a_hand_edit_broke_is_left_out_of_the_picture_not_the_picture(gapless, tmp_path):
    st, now = gapless.status("llm"), gapless.clock.now()
    naive = st.standby.model_copy(update={"inserted_at": datetime(2026, 1, 1)})  # no time zone
    broken = st.model_copy(update={"standby": naive})
    assert [b.withdrawn for b in report.side_bars(broken, now)] == [True]  # the standby is left out
    assert report.timeline("llm", broken, now).note is None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=hs.lists(hs.fixed_dictionaries({"at": _TIMES, "since": _TIMES, "attempt": hs.integers(1, 3),
                                              "event": hs.sampled_from(["launch", "standby-withdrawn"]),
                                              "zone": hs.sampled_from([A, B, None]),
                                              "instance": hs.sampled_from(["hand-2", "hand-3-n1", "x", None]),
                                              "detail": hs.sampled_from(["giving the go to hand-2", "?"])}),
                       max_size=3),
       spans=hs.lists(hs.fixed_dictionaries({"attempt": hs.integers(1, 3), "zone": hs.sampled_from([A, B]),
                                             "start": _TIMES},
                                            optional={"end": _TIMES, "trainer_started": _TIMES,
                                                      "resumed_saved_at": _TIMES}), max_size=3),
       standby=hs.one_of(hs.none(), _TIMES), go=hs.one_of(hs.none(), _TIMES), now=_TIMES)
def test_any_standby_a_hand_edit_can_write_gives_a_picture_and_a_summary_never_an_exception(
        events, spans, standby, go, now):
    from controller.core.state import Standby

    sb = None if standby is None else Standby(attempt=3, project="p", zone=A, instances=("hand-3",), token="t",
                                              provisioning="spot", since=standby, until=standby, cause="?",
                                              inserted=True, inserted_at=standby)
    st = JobStatus.model_validate({"phase": "RUNNING", "attempt": 2, "instances": ["hand-2"], "history": events,
                                   "ledger": {"spans": spans}}).model_copy(update={"standby": sb, "go_at": go})
    picture = report.timeline("hand", st, now)
    assert picture.png.startswith(b"\x89PNG")
    assert picture.note is None or (picture.note.startswith("timeline not drawn: ") and "\n" not in picture.note)
    report.facts(st, now, job="hand")


def test_the_pictures_two_legends_never_overlap(day):
    """Issue 39: the PNG's legend overlapped itself ("booting" over "stockout")."""
    from matplotlib.legend import Legend

    fig = report.timeline_figure("llm", day.status("llm"), day.clock.now())
    fig.canvas.draw()
    legends = {id(c): c for a in fig.axes for c in a.get_children() if isinstance(c, Legend)}
    boxes = [legend.get_window_extent() for legend in legends.values()]
    assert len(boxes) == 2
    assert not boxes[0].overlaps(boxes[1]), boxes
