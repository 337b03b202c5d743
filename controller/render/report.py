"""``respawn report JOB``: a job's goodput ledger (controller.core.ledger) as a person reads it.

- ``render_text``: the terminal summary (rich): phase, accelerator-hours paid / booting /
  redone / useful, the time waited for capacity (unbilled), goodput, cost against on demand, recoveries, the advised checkpoint
  interval and the save time it weighs (a lower bound, and where it comes from), the kept
  attempts, and each zone's losses and stockouts;
- ``draw``: the timeline: one lane per zone, each attempt a bar coloured by how it ended
  (its boot lighter and hatched), the marks (stockouts, quota, preemptions, maintenance)
  on their zone's lane, the checkpoint steps resumed from on a second axis, and the
  training redone after each loss shaded. A ``.png``, or a self-contained ``.html`` page
  with the picture embedded and the summary as tables.

The summary's figures are computed once (``facts``, ``attempt_rows``, ``zone_rows``) and
written both ways. Only the CLI and the demo import this module; matplotlib is imported
inside ``draw``, so neither ``respawn status`` nor the functions ever load it.
"""

from __future__ import annotations

import base64
import io
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

from controller.core import checkpoints, ledger
from controller.render.amounts import dollars, figure, figures
from controller.render.status_view import live_line, rough
from controller.render.text import html_text, printable
from controller.core.durations import format_duration, measured

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from controller.core.state import JobStatus

# How an attempt ended (Span.cause; None while it runs) -> the legend's words and the bar's colour.
OUTCOMES: dict[str, tuple[str, str]] = {
    "running": ("still running", "#1f77b4"),
    "succeeded": ("succeeded", "#2ca02c"),
    "preempted": ("preempted", "#ff7f0e"),
    "maintenance": ("maintenance", "#9467bd"),
    "failed": ("failed", "#d62728"),
    "cancelled": ("cancelled", "#7f7f7f"),
    "lost": ("lost / host error", "#8c564b"),
    "recycled": ("recycled", "#17becf"),
    "other": ("ended otherwise", "#bcbd22"),
}
_KIND = {None: "running", "host error": "lost", "rebooted": "lost", "replaced": "other"}
# Mark.kind -> (matplotlib marker, legend words); any other loss is a dot.
MARKS: dict[str, tuple[str, str]] = {
    "stockout": ("x", "stockout"),
    "quota": ("s", "quota refused"),
    "preempted": ("v", "preemption"),
    "maintenance": ("D", "maintenance"),
}
_OTHER_MARK = ("o", "other loss")
_REFUSALS = ("stockout", "quota")
MARK_COLOUR, CHECKPOINT_COLOUR, REDONE_COLOUR = "#222222", "#444444", "#e377c2"
MAX_LANES = 12  # zones drawn, each its lane
BAR, LANE_GAP = 0.5, 0.36  # bar height, and how far from its lane's centre a mark sits (above or below)


def outcome(cause: str | None) -> str:
    """The OUTCOMES key of an attempt that ended by ``cause``."""
    kind = _KIND.get(cause, cause)
    return kind if kind in OUTCOMES else "other"


# -- the figures, once -------------------------------------------------------------------------

def human(seconds: float | None) -> str:
    if seconds is None or not measured(seconds):
        return "—"  # none, or nothing a clock could have measured (a hand-written status)
    return f"{seconds:.2g}s" if 0 < seconds < 1 else format_duration(timedelta(seconds=round(seconds)))


def seconds(value: float | None) -> str:
    """A measured save or upload: two figures under 10 s ("0.41s", "5.8s"), else as ``human``."""
    return f"{value:.2g}s" if value is not None and measured(value) and 0 < value < 10 else human(value)


def _unit(paid_hours: float) -> tuple[str, float]:
    """Accelerator time in hours, or in minutes or seconds for a short run (the demo's): its name and factor."""
    if paid_hours >= 1 or paid_hours == 0:
        return "accelerator-hours", 1.0
    return ("accelerator-minutes", 60.0) if paid_hours >= 1 / 60 else ("accelerator-seconds", 3600.0)


def _percent(share: float | None) -> str:
    return "—" if share is None else f"{share:.1%}"


def facts(status: JobStatus, now: datetime, live: dict[str, Any] | None = None, job: str = "") -> list[tuple[str, str]]:
    """The summary, as (what, figure) lines; with ``live`` (``controller.service.jobs.Jobs.live``: the
    running attempt's heartbeat), the step its trainer is at now and its latest save's times. A run
    that recovered with zero gap, or has a standby now, has a line for it (``job`` names its VMs)."""
    book, total = status.ledger, ledger.summary(status.ledger, now)
    unit, k = _unit(total.accelerator_hours)
    hours = figures(*(h * k for h in (total.accelerator_hours, total.boot_hours, total.redone_hours,
                                      total.useful_hours, total.unknown_hours)))
    return [
        ("run", f"{status.run or '—'}" + (" (fresh)" if status.fresh else "")
                + (f", after {len(status.runs)} earlier (respawn history)" if status.runs else "")),
        ("phase", f"{status.phase}" + (f" — {status.message}" if status.message else "")),
        ("attempts", f"{book.totals.attempts + (book.open is not None)} ({total.losses} lost)"),
        (unit, "{} paid: {} booting, {} redone, {} useful".format(*hours[:4])
               + (f", {hours[4]} boot unknown" if total.unknown_hours else "")),
        ("waiting", f"{human(total.waiting_hours * 3600) if total.waiting_hours else 'none'} for capacity "
                    "(Flex-start PENDING, a queued TPU: not billed, not in goodput)"),
        ("goodput", _goodput(total)),
        ("cost", _cost(total)),
        ("prices from", "; ".join(total.price_sources) or "—"),
        ("losses", f"{total.losses} ({book.totals.platform_losses} of the platform's); mean time between them "
                   f"{human(total.time_between_losses_s)}"),
        ("recoveries", _recoveries(book, total)),
        *((("zero-gap", gap),) if (gap := zero_gap(job, status, live)) else ()),
        *((("image pulls", pulls),) if (pulls := image_pulls(status)) else ()),
        ("steps", _steps(total, _now_at(live, now))),
        ("checkpoint", f"advised every {human(status.checkpoint_every_s)} (Young/Daly); {_save(total)}"),
        *((("between losses", basis),) if (basis := lifetime(status.lifetime)) else ()),
        ("save time from", _save_source(total)),
        *((("latest save", latest),) if (latest := _latest_save(live, now)) else ()),
    ]


def image_pulls(status: JobStatus) -> str | None:
    """An image: job's pulls, part of each attempt's boot (its VM's clock): the mean and the longest, and
    how many attempts pulled; None where no attempt reported one."""
    took = [(s.pull_ended - s.pull_started).total_seconds() for s in status.ledger.spans
            if s.pull_started is not None and s.pull_ended is not None]
    if not took:
        return None
    return (f"{len(took)} {'attempt' if len(took) == 1 else 'attempts'} pulled the image before its trainer "
            f"started: {seconds(sum(took) / len(took))} on average, {seconds(max(took))} at most (part of booting)")


def zero_gap(job: str, status: JobStatus, live: dict[str, Any] | None = None) -> str | None:
    """The run's recoveries that booted the next VM at a preemption notice, how long after the save
    each resumed from its trainer started, the standbys withdrawn (paid for, all boot), and the
    overlap now, if any; None for a run with none of these (``controller.render.handover_view``)."""
    from controller.render import handover_view

    parts = []
    if hands := handover_view.handovers(job, status):
        gaps = [seconds(h.downtime_s()) if h.downtime_s() is not None else "—" for h in hands]
        one = len(hands) == 1
        parts.append(f"{len(hands)} {'attempt' if one else 'attempts'} booted at the notice of the one before, "
                     f"{'its trainer' if one else 'their trainers'} started {', '.join(gaps)} after the save "
                     f"{'it' if one else 'each'} resumed from")
    if gone := handover_view.withdrawn(status):
        paid = sum((w.at - w.since).total_seconds() for w in gone)
        parts.append(f"{len(gone)} standby withdrawn before its go ({human(paid)} of boot paid, no training)"
                     if len(gone) == 1 else f"{len(gone)} standbys withdrawn before their go ({human(paid)} of boot "
                     "paid, no training)")
    step = live.get("step") if isinstance(live, dict) else None
    if (status.standby is not None or status.held) and (now := handover_view.line(
            job or "?", status, None, step if isinstance(step, int) else None)):
        parts.append(f"now: {now}")  # booting beside it, or given the go: its trainer not started yet
    return "; ".join(parts) or None


def _now_at(live: dict[str, Any] | None, now: datetime) -> str | None:
    """'now at step 1,734 (reported by the trainer in its heartbeat, 12s ago)', else None."""
    if not isinstance(live, dict):
        return None
    note = live_line({"live": {"step": live.get("step"), "at": live.get("at")}}, now)
    return note.text if note else None


def _latest_save(live: dict[str, Any] | None, now: datetime) -> str | None:
    """The running attempt's latest save, as its heartbeat says: its write and upload times, the
    step uploaded (reported by the trainer in its heartbeat, 12s ago); else None."""
    if not isinstance(live, dict):
        return None
    note = live_line({"live": {k: live.get(k) for k in ("save_s", "upload_s", "saved_step", "at")}}, now)
    return note.text.removeprefix("its last save took ") if note else None


def _steps(total: ledger.Summary, now_at: str | None = None) -> str:
    """How far training got and the steps the losses cost, as the trainer reported its steps;
    then, while it runs, the step it is at now (its heartbeat's: the ledger's is the last event's)."""
    if total.step is None and not any(n is not None for n in total.steps_lost_each):
        return now_at or "not reported (a trainer using respawnkit reports its step)"
    return _steps_recorded(total) + (f"; {now_at}" if now_at else "")


def _steps_recorded(total: ledger.Summary) -> str:
    """What the ledger holds: the step reached at its last event and the steps each loss cost."""
    known = [n for n in total.steps_lost_each if n is not None]
    text = f"reached step {total.step if total.step is not None else '—'}; {total.steps_lost} lost"
    if total.steps_lost_each:
        each = ", ".join("—" if n is None else str(n) for n in total.steps_lost_each)
        text += f" (per loss: {each})" if len(total.steps_lost_each) > 1 or not known else ""
    return text


def lifetime(known: ledger.Lifetime | None) -> str | None:
    """M as the interval used it, how sure, and from what: "~1.7h (80 %: 0.9h-4.5h), from 1 loss
    in 1h and the zone's advised uptime of 2h, worth 2"."""
    if known is None:
        return None
    own = f"{known.losses} loss{'es' if known.losses != 1 else ''} in {human(known.running_s)}" if known.losses \
        else "no loss yet"
    if known.prior_s is not None:
        rests = f"{own} and the zone's advised uptime of {human(known.prior_s)}, worth {ledger.PRIOR_LOSSES}"
    elif known.set_aside:
        rests = f"{own} alone: the zone's advised uptime was set aside, these losses came far sooner"
    else:
        rests = f"{own} alone (no advice)"
    return f"~{rough(known.mean_s)} (80 %: {rough(known.low_s)}-{rough(known.high_s)}), from {rests}"



def _save(total: ledger.Summary) -> str:
    """The checkpoint cost C: the trainer's measured write, else the GCS lower bound."""
    if total.save_source == ledger.SAVE_REPORTED:
        upload = f", then its upload {seconds(total.upload_s)} in the background" if total.upload_s is not None else ""
        return f"a save takes {seconds(total.save_s)}{upload}"
    return f"a save takes at least {human(total.save_s)}"


def _save_source(total: ledger.Summary) -> str:
    if total.save_source == ledger.SAVE_REPORTED:
        return f"{ledger.SAVE_REPORTED}: its last save's local write, which blocks training (respawnkit)"
    return checkpoints.WRITE_TIME_SOURCE


def _goodput(total: ledger.Summary) -> str:
    """Goodput, and how much paid time it leaves out: attempts that ran and ended between two
    passes with no record of their trainer's start, whose boot is unknown (never guessed)."""
    if not total.unknown_hours:
        return _percent(total.goodput)
    unit, k = _unit(total.accelerator_hours)
    return (f"{_percent(total.goodput)} of the time whose split is known; {figure(total.unknown_hours * k)} "
            f"{unit} boot unknown (attempts that ended between two passes, no trainer start recorded)")


def _cost(total: ledger.Summary) -> str:
    if not total.on_demand_cost:
        return dollars(total.cost)[0]
    cost, on_demand, saved = dollars(total.cost, total.on_demand_cost, total.savings)  # one precision for the line
    return f"{cost} against {on_demand} on demand: {saved} saved ({total.savings / total.on_demand_cost:.0%})"


def _recoveries(book: ledger.Ledger, total: ledger.Summary) -> str:
    kept = [s for loss in book.losses if (s := loss.recovery_s) is not None]
    text = f"{book.totals.recoveries}, mean {human(total.recovery_mean_s)}"
    if kept:
        text += f"; per loss p50 {human(statistics.median(kept))}, max {human(max(kept))} (last {len(kept)})"
    return text


ATTEMPT_COLUMNS = ("attempt", "zone", "model", "resumed from", "started (UTC)", "ran for", "ended by")


def attempt_rows(status: JobStatus, now: datetime) -> list[tuple[str, ...]]:
    """The kept attempts, one row each, oldest first."""
    return [(str(s.attempt), s.zone or "?", s.model or "?",
             "scratch" if s.resumed_step is None else f"step {s.resumed_step}",
             f"{s.start:%Y-%m-%d %H:%M:%S}", human(((s.end or now) - s.start).total_seconds()),
             (OUTCOMES[outcome(s.cause)][0] if s.cause is None else s.cause) + (" (boot unknown)" if s.boot_unknown else ""))
            for s in status.ledger.spans]


ZONE_COLUMNS = ("zone", "losses", "stockouts")


def zone_rows(status: JobStatus) -> list[tuple[str, str, str]]:
    """Each zone with a loss or a stockout: its losses by cause, and its stockouts."""
    totals = status.ledger.totals
    zones = sorted(set(totals.losses) | set(totals.stockouts))
    return [(zone, ", ".join(f"{cause} {n}" for cause, n in sorted(totals.losses.get(zone, {}).items())) or "—",
             str(totals.stockouts.get(zone, 0)))
            for zone in zones]


def as_json(job: str, status: JobStatus, now: datetime, live: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"job": job, "run": status.run, "phase": str(status.phase), "checkpoint_every_s": status.checkpoint_every_s,
            "lifetime": status.lifetime.model_dump(mode="json") if status.lifetime else None,
            "checkpoint_cost": _cost_json(status.ledger), "live": live,
            "summary": ledger.summary(status.ledger, now).model_dump(mode="json"),
            "ledger": status.ledger.model_dump(mode="json")}


def _cost_json(book: ledger.Ledger) -> dict[str, Any]:
    """C as ``--json`` gives it: GCS's lower bound (``at_least_s``) and, where the trainer
    reported its saves, the measured write (``s``, what C is) and upload (``upload_s``)."""
    gcs = {"at_least_s": book.checkpoint_cost_s, "source": checkpoints.WRITE_TIME_SOURCE}
    if book.save_s is None:
        return gcs
    return {"s": book.save_s, "upload_s": book.upload_s, "source": ledger.SAVE_REPORTED, "at_least_s": book.checkpoint_cost_s}


LOSS_COLUMNS = ("attempt", "lost by", "lost at (UTC)", "step reached", "resumed from", "steps lost", "recovery")
# As the attempts' layouts: the width given up by the loss's time first, then the column names.
LOSS_LAYOUTS: tuple[tuple[tuple[int, str], ...], ...] = (
    tuple(enumerate(LOSS_COLUMNS)),
    ((0, "attempt"), (1, "lost by"), (3, "step reached"), (4, "resumed from"), (5, "steps lost"), (6, "recovery")),
    ((0, "#"), (1, "lost by"), (3, "reached"), (4, "resumed"), (5, "lost"), (6, "recovery")),
    ((0, "#"), (1, "lost by"), (3, "reached"), (5, "lost")),
)


def loss_rows(status: JobStatus) -> list[tuple[str, ...]]:
    """The kept losses, oldest first: the step each attempt had reached, the step its replacement
    resumed from, and the steps lost between them (— where the trainer reported no step)."""
    def step(n: int | None) -> str:
        return "—" if n is None else str(n)

    return [(str(loss.attempt), loss.cause, f"{loss.lost_at or loss.seen_at:%m-%d %H:%M:%S}", step(loss.step),
             "—" if loss.issued_at is None else "scratch" if loss.resumed_step is None else f"step {loss.resumed_step}",
             step(loss.steps_lost), human(loss.recovery_s))
            for loss in status.ledger.losses]


def _kept_note(status: JobStatus) -> str | None:
    closed = status.ledger.totals.attempts + (status.ledger.open is not None)
    kept = len(status.ledger.spans)
    return f"the last {kept} of {closed} attempts" if closed > kept else None


# -- the terminal ------------------------------------------------------------------------------

def render_text(job: str, status: JobStatus, now: datetime, live: dict[str, Any] | None = None) -> Group:
    """What ``respawn report`` prints. Every name and message is plain text, escaped."""
    head = Table(show_header=False, title=Text(f"respawn report: {printable(job)}"), title_justify="left")
    for what, figure in facts(status, now, live, job):
        head.add_row(what, Text(printable(figure), overflow="fold"))  # a long word folds, never cut with "…"
    parts: list[Any] = [head, Grid("attempts", ATTEMPT_LAYOUTS, attempt_rows(status, now), _kept_note(status))]
    if losses := loss_rows(status):
        parts.append(Grid("losses", LOSS_LAYOUTS, losses))
    if zones := zone_rows(status):
        parts.append(Grid("losses by zone", (tuple(enumerate(ZONE_COLUMNS)),), zones))
    return Group(*parts)


# The attempts as ``respawn status`` draws its jobs (controller.render.status_view): plain columns two
# spaces apart, no borders, never a cell cut; laid out when drawn, the widest layout that fits the
# width. Each layout is (column of ATTEMPT_COLUMNS, header) pairs; "started (UTC)" without its year
# is column -1 (its cell ``MM-DD HH:MM:SS``). As the width shrinks, things give way in this order:
# the start's year, the provisioning model, where it resumed from, how long it ran. The attempt's
# number, its zone (whole: the zone at fault must be readable) and how it ended are always drawn.
_SHORT_START = -1
ATTEMPT_LAYOUTS: tuple[tuple[tuple[int, str], ...], ...] = (
    ((0, "attempt"), (1, "zone"), (2, "model"), (3, "resumed from"), (4, "started (UTC)"), (5, "ran for"),
     (6, "ended by")),
    ((0, "attempt"), (1, "zone"), (2, "model"), (3, "resumed from"), (_SHORT_START, "started (UTC)"),
     (5, "ran for"), (6, "ended by")),
    ((0, "#"), (1, "zone"), (2, "model"), (3, "resumed from"), (_SHORT_START, "started (UTC)"), (5, "ran for"),
     (6, "ended by")),
    ((0, "#"), (1, "zone"), (3, "resumed from"), (_SHORT_START, "started (UTC)"), (5, "ran for"), (6, "ended by")),
    ((0, "#"), (1, "zone"), (_SHORT_START, "started (UTC)"), (5, "ran for"), (6, "ended by")),
    ((0, "#"), (1, "zone"), (_SHORT_START, "started (UTC)"), (6, "ended by")),
    ((0, "#"), (1, "zone"), (6, "ended by")),
)


class Grid:
    """A titled table drawn as ``respawn status`` draws its jobs: the first of ``layouts`` whose
    lines fit the width it is drawn at (the last whatever the width; the terminal wraps it)."""

    def __init__(self, title: str, layouts: tuple[tuple[tuple[int, str], ...], ...],
                 rows: list[tuple[str, ...]], caption: str | None = None) -> None:
        self.title, self.layouts, self.rows, self.caption = title, layouts, rows, caption

    def lines(self, width: int) -> list[Text]:
        from controller.render.status_view import columns

        drawn: list[Text] = []
        for layout in self.layouts:
            cells = [[Text(printable(_cell(row, i))) for i, _ in layout] for row in self.rows]
            drawn = columns([header for _, header in layout], cells)
            if max(line.cell_len for line in drawn) <= width:
                break
        return drawn

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Text(self.title, no_wrap=True, overflow="ignore")
        yield from self.lines(options.max_width)
        if self.caption:
            yield Text(printable(self.caption))


def _cell(row: tuple[str, ...], column: int) -> str:
    if column == _SHORT_START:
        return row[4][5:]  # "2026-01-01 00:55:10" -> "01-01 00:55:10"
    return row[column]


# -- the picture -----------------------------------------------------------------------------------

def draw(job: str, status: JobStatus, now: datetime, path: Path | str, kind: str | None = None,
         live: dict[str, Any] | None = None, picture: Picture | None = None) -> Path:
    """Write the timeline to ``path``: ``kind`` "png", or "html" (the picture embedded, and the summary);
    by default from the path's suffix. ``picture``: the timeline already drawn (``timeline``)."""
    path = Path(path)
    kind = kind or {".png": "png", ".html": "html", ".htm": "html"}.get(path.suffix.lower())
    if kind not in ("png", "html"):
        raise ValueError(f"{path}: a report is a .png or an .html file")
    picture = picture or timeline(job, status, now)
    path.write_bytes(picture.png if kind == "png" else page(job, status, now, picture.png, live, picture.note).encode())
    return path


@dataclass(frozen=True)
class Picture:
    png: bytes
    note: str | None = None  # why the picture is this one line in place of the timeline


# The times a timeline is drawn between. Matplotlib's dates run from year 1 to 9999 and its axes
# pad a run's span on both sides, so a time near either end (a hand-edited status) would be drawn
# outside them; a controller writes its own clock's times, far inside.
DRAWN_FROM, DRAWN_UNTIL = datetime(1900, 1, 1, tzinfo=UTC), datetime(9000, 1, 1, tzinfo=UTC)
MAX_DRAWN_STEP = 10**15  # a checkpoint step drawn on the axis (a float): no trainer counts near it


def timeline(job: str, status: JobStatus, now: datetime) -> Picture:
    """The timeline; for a status it cannot be drawn from (a hand edit's times, a trainer's absurd
    step), a picture of the one line that says why. Whatever a status holds, never an exception:
    the dashboard's page and ``respawn report`` show the line in its place."""
    note = _undrawable(status.ledger, now)
    if note is None:
        try:
            return Picture(_drawn(job, status, now))
        except Exception as e:  # noqa: BLE001 - a status is anyone's hand edit: matplotlib's refusal is a note
            note = f"timeline not drawn: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return Picture(note_png(note), note)


def timeline_png(job: str, status: JobStatus, now: datetime) -> bytes:
    return timeline(job, status, now).png


def _undrawable(book: ledger.Ledger, now: datetime) -> str | None:
    """Why ``book`` cannot be drawn, or None: a time without a zone or outside DRAWN_FROM..DRAWN_UNTIL
    (the training redone before a loss included), or a checkpoint step too large to place."""
    redone = [(loss.lost_at or loss.seen_at, loss.redone_s) for loss in book.losses if loss.redone_s]
    if any(not measured(seconds) for _, seconds in redone):
        return "timeline not drawn: a loss's training redone is no duration a clock measured"
    times = [now, *(value for item in (*book.spans, *book.losses, *book.marks) for value in dict(item).values()
                    if isinstance(value, datetime)), *(at for at, _ in book.checkpoints)]
    for when in times:
        if when.utcoffset() is None:
            return f"timeline not drawn: its ledger has a time without a time zone ({when.isoformat()})"
        if not DRAWN_FROM <= when < DRAWN_UNTIL:
            return (f"timeline not drawn: its ledger has a time ({when.isoformat()}) outside the years "
                    f"{DRAWN_FROM.year} to {DRAWN_UNTIL.year - 1}")
    for until, seconds in redone:
        if seconds > (until - DRAWN_FROM).total_seconds():
            return f"timeline not drawn: a loss's training redone ({seconds:g} s) began before {DRAWN_FROM.year}"
    if any(abs(step) > MAX_DRAWN_STEP for _, step in book.checkpoints):
        return "timeline not drawn: a checkpoint step is too large to draw"
    return None


def note_png(note: str) -> bytes:
    """A picture of one line of text (``note``, its controls escaped, clipped to 200 characters)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    line = printable(note)
    line = line if len(line) <= 200 else line[:199] + "…"
    fig = Figure(figsize=(12, 0.6), dpi=100)
    FigureCanvasAgg(fig)
    fig.text(0.01, 0.5, line, va="center", fontsize=11, color="#444444", parse_math=False)
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def _drawn(job: str, status: JobStatus, now: datetime) -> bytes:
    fig = timeline_figure(job, status, now)
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def timeline_figure(job: str, status: JobStatus, now: datetime) -> Any:
    """The timeline as a matplotlib Figure (what ``_drawn`` saves)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    sides = side_bars(status, now)
    lanes = _lanes(status.ledger, [(bar.start, bar.zone) for bar in sides])
    room = 0.3 if sides or status.go_at or any(e.since and e.event == "launch" for e in status.history) else 0.0
    rows = 4 if room else 3
    # The two legends one under the other, each in a strip as tall as its title and rows (inches): side
    # by side, a long one ran into the other ("booting" over "stockout").
    strip = 0.35 + 0.25 * (rows + 1)
    fig = Figure(figsize=(12, 1.5 + 0.6 * len(lanes) + 2 * strip), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax, key, key_events = fig.subplots(3, 1, height_ratios=(1.4 + 0.6 * len(lanes), strip, strip))
    bars = _bars(ax, job, status, lanes, now, sides)
    steps = _checkpoints(ax, status.ledger)
    # The marks over everything, the checkpoint line's axes included.
    marks = _marks(steps[0].axes if steps else ax, ax, status.ledger, lanes)
    events = [*marks, *_redone(ax, status.ledger), *steps]
    _steps_lost(ax, status.ledger, lanes)
    if status.ledger.open is not None:
        events.append(ax.axvline(now, color="#999999", linestyle=":", linewidth=1, label="now"))
    _axes(ax, lanes, _title(job, status, now))
    _legends((key, key_events), bars, events, rows)
    return fig


def _legends(keys: tuple[Axes, Axes], bars: list[Any], events: list[Any], rows: int = 3) -> None:
    """Under the timeline, one under the other, each left-aligned in its own strip: the attempts'
    colours, then the events, in columns of ``rows`` (4 where zero-gap recovery's entries make them wider)."""
    for key, handles, title in ((keys[0], bars, "attempts, by how they ended"), (keys[1], events, "events")):
        key.axis("off")
        if handles:
            key.add_artist(key.legend(handles=handles, title=title, loc="upper left", ncol=-(-len(handles) // rows),
                                      frameon=False, alignment="left", borderaxespad=0))


class Lanes(dict[str, int]):
    """Zone -> lane, in the order the run first went to (or was refused by) each; at most
    MAX_LANES, the rest (a hand-written status) sharing the last one."""

    def __missing__(self, zone: str) -> int:
        return len(self) - 1


def _lanes(book: ledger.Ledger, more: Sequence[tuple[datetime, str | None]] = ()) -> Lanes:
    events = sorted([(s.start, s.zone or "?") for s in book.spans] + [(m.at, m.zone or "?") for m in book.marks]
                    + [(at, zone or "?") for at, zone in more], key=lambda e: e[0])
    zones = list(dict.fromkeys(zone for _, zone in events)) or ["?"]
    if len(zones) > MAX_LANES:
        zones = [*zones[:MAX_LANES - 1], "other zones"]
    return Lanes((zone, i) for i, zone in enumerate(zones))


def _title(job: str, status: JobStatus, now: datetime) -> str:
    total = ledger.summary(status.ledger, now)
    unit, k = _unit(total.accelerator_hours)
    useful, paid, unknown_h = figures(total.useful_hours * k, total.accelerator_hours * k, total.unknown_hours * k,
                                      places=1)
    unknown = f" ({unknown_h} boot unknown, not in goodput)" if total.unknown_hours else ""
    text = (f"{printable(job)}: {status.phase}, goodput {_percent(total.goodput)}\n"
            f"{useful} of {paid} {unit} useful{unknown}; "
            "{} against {} on demand".format(*dollars(total.cost, total.on_demand_cost))
            + (f"; {total.steps_lost} steps lost" if any(n is not None for n in total.steps_lost_each) else ""))
    return text.replace("$", r"\$")  # not mathtext


BOOT_HATCH, UNKNOWN_HATCH, LINE_HATCH, PULL_HATCH = "////", "xx", "....", "\\\\"
WITHDRAWN_COLOUR, GO_COLOUR = "#7f7f7f", "#111111"


@dataclass(frozen=True)
class SideBar:
    """A standby's VMs that are no attempt of the ledger (yet): the one booting now (``withdrawn``
    False, to ``now``), or one withdrawn before its go, paid from Compute's acceptance for nothing."""

    zone: str | None
    start: datetime
    end: datetime
    withdrawn: bool


def side_bars(status: JobStatus, now: datetime) -> list[SideBar]:
    """The standby booting now and the withdrawn ones the history keeps, where their times can be
    drawn (a hand-edited status's are left out, never the picture)."""
    from controller.render import handover_view

    bars = [SideBar(w.zone, w.since, w.at, True) for w in handover_view.withdrawn(status)]
    sb = status.standby
    if sb is not None and sb.inserted_at is not None and sb.inserted_at.utcoffset() is not None and sb.inserted_at <= now:
        bars.append(SideBar(sb.zone, sb.inserted_at, now, False))
    return [b for b in bars if all(t.utcoffset() is not None and DRAWN_FROM <= t < DRAWN_UNTIL for t in (b.start, b.end))]


@dataclass(frozen=True)
class Piece:
    """One rectangle of the timeline: part of an attempt (or a standby) on its zone's lane, solid
    (training) or hatched (``hatch``: booting; at the starting line; boot unknown), in the lower half
    of its lane (``half``) where an attempt that began before it is still there."""

    lane: int
    start: datetime
    end: datetime
    colour: str
    hatch: str | None
    half: bool = False
    attempt: int | None = None


def pieces(job: str, status: JobStatus, lanes: Lanes, now: datetime,
           sides: list[SideBar] | None = None) -> list[Piece]:
    """The rectangles of the timeline, each attempt's in order, then the standbys': an attempt's
    boot (to its trainer's start, else RUNNING) hatched, a standby's time from its acceptance at the
    notice to its go hatched apart (it booted, then waited at its starting line), its training
    solid, to its end or ``now``. Where a bar overlaps an attempt that began before it on the same
    lane (a standby booted beside its attempt in the preempting zone), that part takes the lane's
    lower half, so that both show."""
    from controller.render import handover_view

    goes = {h.attempt: h.go for h in handover_view.handovers(job, status)}
    drawn: list[tuple[int, datetime, datetime]] = []  # (lane, start, end) of each attempt before
    out: list[Piece] = []
    for span in status.ledger.spans:
        colour, y, end = OUTCOMES[outcome(span.cause)][1], lanes[span.zone or "?"], span.end or now
        up = end if span.boot_unknown else max(span.start, min(ledger.boot_end(span, end) or end, end))
        go = goes.get(span.attempt)
        parts: list[tuple[datetime, datetime, str | None]] = []
        if span.boot_unknown:
            parts.append((span.start, up, UNKNOWN_HATCH))
        elif go is not None and span.start < go < up:
            parts += [(span.start, go, LINE_HATCH), (go, up, BOOT_HATCH)]
        else:
            parts.append((span.start, up, LINE_HATCH if go is not None else BOOT_HATCH))
        parts = _pulled(span, parts)
        parts.append((up, end, None))
        covers = [(a, b) for lane, a, b in drawn if lane == y and a < span.start]
        out += [p for a, b, hatch in parts if b > a for p in _split(y, a, b, colour, hatch, covers, span.attempt)]
        drawn.append((y, span.start, end))
    for bar in sides or []:
        y = lanes[bar.zone or "?"]
        colour, hatch = (WITHDRAWN_COLOUR, BOOT_HATCH) if bar.withdrawn else (OUTCOMES["running"][1], LINE_HATCH)
        covers = [(a, b) for lane, a, b in drawn if lane == y and a < bar.start]
        out += _split(y, bar.start, bar.end, colour, hatch, covers, None) if bar.end > bar.start else []
    return out


def _pulled(span: ledger.Span, parts: list[tuple[datetime, datetime, str | None]]) -> list[tuple[datetime, datetime, str | None]]:
    """The boot's parts with its image's pull cut out of them (an image: job), where the VM's clock
    puts it inside them; else as they were."""
    a, b = span.pull_started, span.pull_ended
    if a is None or b is None or not parts or not parts[0][0] <= a < b <= parts[-1][1]:
        return parts
    out: list[tuple[datetime, datetime, str | None]] = []
    for start, end, hatch in parts:
        out += [(x, y, h) for x, y, h in ((start, min(end, a), hatch), (max(start, a), min(end, b), PULL_HATCH),
                                          (max(start, b), end, hatch)) if y > x]
    return out


def _split(lane: int, start: datetime, end: datetime, colour: str, hatch: str | None,
           covers: list[tuple[datetime, datetime]], attempt: int | None) -> list[Piece]:
    """``start``..``end`` cut where ``covers`` (earlier bars of its lane) begin and end: the parts
    under one of them in the lane's lower half."""
    cuts = sorted({start, end, *(t for a, b in covers for t in (a, b) if start < t < end)})
    return [Piece(lane, a, b, colour, hatch, any(x <= a and b <= y for x, y in covers), attempt)
            for a, b in zip(cuts, cuts[1:])]


def _bars(ax: Axes, job: str, status: JobStatus, lanes: Lanes, now: datetime, sides: list[SideBar]) -> list[Any]:
    """Each attempt, and each standby beside one, as ``pieces`` says; its number where legible (at
    the start of its solid part, white, else of its bar); each standby's go as a dark stroke."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from controller.render import handover_view

    book = status.ledger
    drawn = pieces(job, status, lanes, now, sides)
    for p in drawn:
        style = {"color": p.colour} if p.hatch is None else \
            {"color": _light(p.colour), "edgecolor": p.colour, "hatch": p.hatch}
        ax.barh(p.lane + (BAR / 4 if p.half else 0), p.end - p.start, left=p.start, height=BAR / 2 if p.half else BAR,
                linewidth=0, zorder=3 if p.half else 2, **style)
    for span in book.spans:
        own = [p for p in drawn if p.attempt == span.attempt]
        if not own:
            continue
        first = own[0]
        top, bottom = (first.lane, first.lane + BAR / 2) if first.half else (first.lane - BAR / 2, first.lane + BAR / 2)
        ax.vlines(span.start, top, bottom, color="white", linewidth=1.5, zorder=4)  # apart from the last
        solid = next((p for p in own if p.hatch is None), None)
        at = solid or first
        ax.annotate(f"#{span.attempt}", xy=(at.start, at.lane + (BAR / 4 if at.half else 0)), xytext=(3, 0),
                    textcoords="offset points", va="center", fontsize=8, fontweight="bold",
                    color="white" if solid else "#222222", zorder=5)
    went = False
    for hand in handover_view.handovers(job, status):
        lane = next((p for p in drawn if p.attempt == hand.attempt and p.start <= hand.go <= p.end), None)
        if lane is not None:
            top = lane.lane if lane.half else lane.lane - BAR / 2
            ax.vlines(hand.go, top, lane.lane + BAR / 2, color=GO_COLOUR, linewidth=1.5, zorder=4)
            went = True
    used = dict.fromkeys(outcome(s.cause) for s in book.spans)
    handles: list[Any] = [Patch(color=OUTCOMES[k][1], label=OUTCOMES[k][0]) for k in OUTCOMES if k in used]
    hatches = {p.hatch for p in drawn if p.hatch is not None and p.colour != WITHDRAWN_COLOUR}
    if book.spans:
        hatches.add(BOOT_HATCH)
    for hatch, label in ((BOOT_HATCH, "booting (until the trainer started)"),
                         (PULL_HATCH, "pulling image"),
                         (LINE_HATCH, "booted at a notice, held until the go"),
                         (UNKNOWN_HATCH, "boot unknown (ended between passes)")):
        if hatch in hatches:
            handles.append(Patch(facecolor="#dddddd", edgecolor="#777777", hatch=hatch, linewidth=0, label=label))
    if any(p.colour == WITHDRAWN_COLOUR for p in drawn):
        handles.append(Patch(facecolor=_light(WITHDRAWN_COLOUR), edgecolor=WITHDRAWN_COLOUR, hatch=BOOT_HATCH,
                             linewidth=0, label="standby withdrawn: paid, all boot"))
    if went:
        handles.append(Line2D([], [], color=GO_COLOUR, linewidth=1.5, label="the go (the old save is in)"))
    return handles


def _light(colour: str) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    return tuple(0.45 * c + 0.55 for c in to_rgb(colour))  # type: ignore[return-value]


def _marks(top: Axes, ax: Axes, book: ledger.Ledger, lanes: Lanes) -> list[Any]:
    """Each mark on its zone's lane of ``ax``, drawn on ``top``: a loss just above the bars (the first
    lane is at the top), a refused create (stockout, quota) just below them, so that none hides another."""
    handles: dict[str, Any] = {}
    for mark in book.marks:
        symbol, label = MARKS.get(mark.kind, _OTHER_MARK)
        offset = LANE_GAP if mark.kind in _REFUSALS else -LANE_GAP
        drawn = top.scatter([mark.at], [lanes[mark.zone or "?"] + offset], transform=ax.transData,
                            marker=symbol, s=55, color=MARK_COLOUR, linewidths=2 if symbol == "x" else 0.5,
                            zorder=4, label=label, **({} if symbol == "x" else {"edgecolors": "white"}))
        handles.setdefault(label, drawn)
    return list(handles.values())


def _redone(ax: Axes, book: ledger.Ledger) -> list[Any]:
    """After each loss, the training it lost: from the save the replacement resumed from (or
    the lost attempt's RUNNING) to the loss, as the ledger measured it (Loss.redone_s)."""
    shaded = []
    for loss in book.losses:
        if loss.redone_s:
            until = loss.lost_at or loss.seen_at
            shaded.append(ax.axvspan(until - timedelta(seconds=loss.redone_s), until, color=REDONE_COLOUR, alpha=0.25,
                                     linewidth=0, zorder=1, label="training lost, redone"))
    return shaded[:1]  # one entry in the legend


def loss_notes(book: ledger.Ledger) -> list[tuple[datetime, str, str]]:
    """(when, zone, words) beside each loss whose steps lost are known: "-30 steps"."""
    return [(loss.lost_at or loss.seen_at, loss.zone or "?", f"\u2212{loss.steps_lost} steps")
            for loss in book.losses if loss.steps_lost is not None]


def _steps_lost(ax: Axes, book: ledger.Ledger, lanes: Lanes) -> list[Any]:
    """Each loss's steps lost, written beside its mark on its zone's lane."""
    return [ax.annotate(words, xy=(when, lanes[zone] - LANE_GAP), xytext=(6, 0), textcoords="offset points",
                        va="center", fontsize=8, color=MARK_COLOUR, zorder=5)
            for when, zone, words in loss_notes(book)]


def _checkpoints(ax: Axes, book: ledger.Ledger) -> list[Any]:
    """The checkpoints the run resumed from: (saved at, step), on a second y axis."""
    if not book.checkpoints:
        return []
    steps = ax.twinx()
    when, step = zip(*sorted(book.checkpoints), strict=True)
    (line,) = steps.plot(when, step, color=CHECKPOINT_COLOUR, marker="o", markersize=4, linewidth=1.2,
                         label="checkpoint resumed from (step, right axis)")
    steps.set_ylabel("checkpoint step")
    steps.set_ylim(bottom=0, top=max(step) * 1.15 or 1)
    return [line]


def _axes(ax: Axes, lanes: Lanes, title: str) -> None:
    import matplotlib.dates as mdates

    ax.set_yticks(range(len(lanes)), [printable(z).replace("$", r"\$") for z in lanes])  # not mathtext
    ax.set_ylim(len(lanes) - 0.5, -0.5)  # the first zone on top, room above it for its marks
    for border in range(len(lanes) - 1):
        ax.axhline(border + 0.5, color="#dddddd", linewidth=0.8, zorder=0)
    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    ax.set_xlabel("time (UTC)")
    ax.grid(axis="x", color="#eeeeee", zorder=0)
    ax.set_title(title, loc="left", fontsize=11)


# -- the page ------------------------------------------------------------------------------------

def page(job: str, status: JobStatus, now: datetime, picture: bytes, live: dict[str, Any] | None = None,
         note: str | None = None) -> str:
    """A self-contained HTML page: the timeline embedded as a data: URI (``note``: why it is a line of
    text in its place), then the summary's tables."""
    name = html_text(job)
    image = base64.b64encode(picture).decode()
    alt = _h(note) if note else f"timeline of {name}: its attempts by zone"
    zones = zone_rows(status)
    return "\n".join([
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>respawn report: {name}</title>", f"<style>{_STYLE}</style></head><body>",
        f"<h1>respawn report: {name}</h1>",
        f'<img alt="{alt}" src="data:image/png;base64,{image}">',
        '<h2>summary</h2><table class="facts">',
        *(f"<tr><th>{_h(what)}</th><td>{_h(figure)}</td></tr>" for what, figure in facts(status, now, live, job)),
        "</table>", "<h2>attempts</h2>", _html_table(ATTEMPT_COLUMNS, attempt_rows(status, now), _kept_note(status)),
        *(["<h2>losses</h2>", _html_table(LOSS_COLUMNS, losses)] if (losses := loss_rows(status)) else []),
        *(["<h2>losses by zone</h2>", _html_table(ZONE_COLUMNS, zones)] if zones else []),
        f"<p class=\"when\">at {now:%Y-%m-%d %H:%M:%S} UTC</p>", "</body></html>", ""])


def _h(text: object) -> str:
    return html_text(text)


def _html_table(columns: tuple[str, ...], rows: list[tuple[str, ...]], caption: str | None = None) -> str:
    head = "".join(f"<th>{_h(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_h(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    note = f"<caption>{_h(caption)}</caption>" if caption else ""
    return f"<table>{note}<tr>{head}</tr>{body}</table>"


_STYLE = ("body{font-family:system-ui,sans-serif;margin:2em;color:#222}img{max-width:100%}"
          "table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{border:1px solid #ccc;padding:.25em .6em;"
          "text-align:left;vertical-align:top}.facts th{background:#f4f4f4}caption{caption-side:bottom;"
          "text-align:left;color:#666}.when{color:#666}")
