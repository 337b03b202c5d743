"""How ``respawn status`` draws its jobs at whatever width it is drawn at.

Like ``kubectl get``: plain columns, no borders, never a cell cut. The view is laid out
when Rich draws it, at that moment's width, so ``--watch`` (a ``rich.live.Live``) follows
a resized terminal on its next refresh. The widest layout that fits is drawn; as the
width shrinks, things give way in this order (``LAYOUTS``):

=====  ===============================================================================
step   what gives way
=====  ===============================================================================
1      the instance's numeric id (the instance name stays)
2      ``PREEMPTED`` and ``FAILED`` become one ``LOSSES`` column: ``3p/1f`` (``3p/1m/1f`` with
       a terminating host maintenance; ``PREEMPTED`` shows it as ``3+1m``)
3      the instance
4      the attempt number (the losses say most of it)
5      the provisioning model beside the zone: ``us-central1-a (spot)`` becomes ``us-central1-a``
6      the age
7      how old the live step is: ``1,234 (12s ago)`` becomes ``1,234``
8      the live step
9      the checkpoint
10     the losses
11     the zone: job and phase are always drawn
=====  ===============================================================================

``STEP`` (steps 7 and 8) is drawn only when some row has a live step: the step its trainer
reported in its current attempt's heartbeat (``controller.service.jobs.Jobs.live``), which
the CLI reads for at most ``MAX_LIVE_READS`` RUNNING jobs per table; with none, the layouts
are the others, unchanged.

A zone, a phase, a name is drawn whole or not at all. ``wide`` draws the first layout
whatever the width (the terminal wraps what does not fit, as ``kubectl get -o wide``).
A name too long for even job and phase to fit is not cut either: its line is wider than
the terminal, which wraps it (``--watch``'s Live crops it at the edge instead).

Each job's last event goes on its own indented line(s) under its row, wrapped between
words; the narrow view keeps two lines at most and ends a longer one with ``…`` after
a whole word. A job recovering with zero gap has one more line above it, its ``overlap``
(``controller.render.handover_view``: "demo-3 booting in us-central1-b while demo-2 saves"),
wrapped the same way. Everything from a user or the cloud is printed as plain text with control
characters escaped (``controller.render.text.printable``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from rich.cells import cell_len, chop_cells
from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

from controller.render.amounts import figure, figures
from controller.render.text import plain, printable
from controller.core.durations import format_duration
from controller.core.placement import fraction

Row = Mapping[str, Any]
GAP = "  "  # between columns
EVENT_INDENT = "    "  # the last event, under the job's name
EVENT_LINES = 2  # the most lines the narrow view gives one event
ELLIPSIS = "…"
COLOURS = {"RUNNING": "green", "SUCCEEDED": "bold green", "FAILED": "red", "RECOVERING": "yellow",
           "CANCELLED": "dim", "PROVISIONING": "cyan", "PENDING": "cyan", "QUEUED": "cyan"}


def _zone(r: Row, model: bool) -> Text:
    if not r["zone"]:
        return plain("—")
    return plain(f"{r['zone']} ({r['provisioning']})" if model and r["provisioning"] else r["zone"])


def _instance(r: Row, with_id: bool) -> Text:
    if with_id and r["instance_id"]:
        return plain(f"{r['instance']} ({r['instance_id']})")
    return plain(r["instance"] or "—")


def _checkpoint(r: Row) -> Text:
    return plain("unreadable", "yellow") if r.get("checkpoint_error") else plain(r["checkpoint_label"] or "—")


def live_step(r: Row, now: datetime, ago: bool = True) -> str | None:
    """"1,234 (12s ago)": the step the row's ``live`` (its trainer, in its current attempt's
    heartbeat) reports, and how long before ``now`` GCS got that beat; None without one. The
    values come from third-party code: anything not of its type is left out, never a crash."""
    live = r.get("live")
    step = live.get("step") if isinstance(live, Mapping) else None
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 10**18:
        return None
    when = beat_age(live, now)
    return f"{step:,}" + (f" ({when})" if ago and when else "")


def beat_age(live: Mapping[str, Any], now: datetime) -> str | None:
    """"12s ago" for the beat's ``at``; None when it is no time with its offset."""
    try:
        then = datetime.fromisoformat(str(live.get("at")))
        if then.tzinfo is None:
            return None
        age = max(0, math.floor((now - then).total_seconds()))
    except (ValueError, OverflowError, TypeError):
        return None
    return f"{format_duration(timedelta(seconds=age))} ago"


def _stamped(rows: Sequence[Row], now: datetime) -> list[Row]:
    """The rows with their STEP cells' text as of ``now``: one time for the layout and the drawing."""
    return [{**r, "_step": live_step(r, now, ago=False), "_step_ago": live_step(r, now)} for r in rows]


def _age(r: Row) -> Text:
    age = r["age_seconds"]
    return plain(format_duration(timedelta(seconds=int(age))) if isinstance(age, int) else "—")


# key: (header, the cell of one row)
COLUMNS: dict[str, tuple[str, Callable[[Row], Text]]] = {
    "job": ("JOB", lambda r: plain(r["job"])),
    "phase": ("PHASE", lambda r: plain(r["phase"], COLOURS.get(str(r["phase"]), ""))),
    "attempt": ("ATTEMPT", lambda r: plain(r["attempt"])),
    "preempted": ("PREEMPTED", lambda r: plain(f"{r['preemptions']}" + (f"+{m}m" if (m := r.get("maintenance")) else ""))),
    "failed": ("FAILED", lambda r: plain(r["failures"])),
    "losses": ("LOSSES", lambda r: plain(f"{r['preemptions']}p/" + (f"{m}m/" if (m := r.get("maintenance")) else "")
                                         + f"{r['failures']}f")),
    "zone_model": ("ZONE", lambda r: _zone(r, model=True)),
    "zone": ("ZONE", lambda r: _zone(r, model=False)),
    "instance_id": ("INSTANCE (ID)", lambda r: _instance(r, with_id=True)),
    "instance": ("INSTANCE", lambda r: _instance(r, with_id=False)),
    "checkpoint": ("CHECKPOINT", _checkpoint),
    "step_ago": ("STEP", lambda r: plain(r.get("_step_ago") or "—")),
    "step": ("STEP", lambda r: plain(r.get("_step") or "—")),
    "age": ("AGE", _age),
}
STEP_KEYS = ("step_ago", "step")

# Widest first; each gives one thing up (module docstring). The first that fits is drawn.
LAYOUTS: tuple[tuple[str, ...], ...] = (
    ("job", "phase", "attempt", "preempted", "failed", "zone_model", "instance_id", "checkpoint", "step_ago", "age"),
    ("job", "phase", "attempt", "preempted", "failed", "zone_model", "instance", "checkpoint", "step_ago", "age"),
    ("job", "phase", "attempt", "losses", "zone_model", "instance", "checkpoint", "step_ago", "age"),
    ("job", "phase", "attempt", "losses", "zone_model", "checkpoint", "step_ago", "age"),
    ("job", "phase", "losses", "zone_model", "checkpoint", "step_ago", "age"),
    ("job", "phase", "losses", "zone", "checkpoint", "step_ago", "age"),
    ("job", "phase", "losses", "zone", "checkpoint", "step_ago"),
    ("job", "phase", "losses", "zone", "checkpoint", "step"),
    ("job", "phase", "losses", "zone", "checkpoint"),
    ("job", "phase", "losses", "zone"),
    ("job", "phase", "zone"),
    ("job", "phase"),
)


def wrap(text: str, width: int, max_lines: int | None = None) -> list[str]:
    """``text`` in lines of at most ``width`` cells, broken between words (a word wider than
    a whole line is the only thing ever cut). Past ``max_lines``, the last line kept ends
    with ``…`` after its last whole word that leaves room for it."""
    width = max(width, 2)
    lines: list[str] = []
    line = ""
    for word in text.split():
        if line and cell_len(line) + 1 + cell_len(word) <= width:
            line += " " + word
            continue
        if line:
            lines.append(line)
        pieces = chop_cells(word, width) if cell_len(word) > width else [word]
        lines.extend(pieces[:-1])
        line = pieces[-1]
    if line:
        lines.append(line)
    if max_lines is None or len(lines) <= max_lines:
        return lines
    kept, last = lines[:max_lines - 1], lines[max_lines - 1].split(" ")
    while len(last) > 1 and cell_len(" ".join(last)) + 1 > width:
        last.pop()
    end = " ".join(last)
    if cell_len(end) + 1 > width:  # one piece of a word wider than the line: cut it, there is no boundary
        end = chop_cells(end, width - 1)[0]
    return [*kept, end + ELLIPSIS]


def columns(headers: Sequence[str], cells: Sequence[Sequence[Text]]) -> list[Text]:
    """A header line and one line per row, each column as wide as its widest cell."""
    widths = [max([cell_len(h), *(c[i].cell_len for c in cells)]) for i, h in enumerate(headers)]

    def line(parts: Sequence[Text]) -> Text:
        out = Text(no_wrap=True, overflow="ignore")
        for i, part in enumerate(parts):
            out.append_text(part)
            if i < len(parts) - 1:
                out.append(" " * (widths[i] - part.cell_len) + GAP)
        return out

    return [line([Text(h, style="bold") for h in headers]), *(line(c) for c in cells)]


def layout(rows: Sequence[Row], width: int, wide: bool = False) -> tuple[str, ...]:
    """The widest of ``LAYOUTS`` whose lines fit ``width`` (the first with ``wide``); without STEP
    where no row has a live step (``_stamped`` rows)."""
    layouts = LAYOUTS if any(r.get("_step") for r in rows) else without_step()
    if wide:
        return layouts[0]
    for keys in layouts:
        if _width(rows, keys) <= width:
            return keys
    return layouts[-1]


def without_step() -> tuple[tuple[str, ...], ...]:
    """``LAYOUTS`` with no STEP: each layout the previous one less one thing, as before it had one."""
    kept = (tuple(k for k in keys if k not in STEP_KEYS) for keys in LAYOUTS)
    return tuple(dict.fromkeys(kept))


def _width(rows: Sequence[Row], keys: Sequence[str]) -> int:
    return sum(max([cell_len(COLUMNS[k][0]), *(COLUMNS[k][1](r).cell_len for r in rows)]) for k in keys) \
        + cell_len(GAP) * (len(keys) - 1)


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


_COUNTDOWN = re.compile(r"\b(restarting|retrying) in \d[\dsmhd]*$")


def counted_down(row: Row, now: datetime) -> str:
    """The row's last event, its "restarting in 30s" (said when it was written) told again
    from the status's due time (``not_before``) as of ``now``: "restarting in 12s", then
    "restarting now" once it is due."""
    event = str(row["last_event"])
    try:
        due = datetime.fromisoformat(str(row.get("not_before")))
    except ValueError:
        return event
    match = _COUNTDOWN.search(event)
    if match is None or due.tzinfo is None:
        return event
    left = math.ceil((due - now).total_seconds())
    when = f"in {format_duration(timedelta(seconds=left))}" if left > 0 else "now"
    return f"{event[:match.start()]}{match.group(1)} {when}"


class StatusView:
    """The jobs' table with each last event under its row, then ``notes``; laid out when drawn.

    ``fit_height`` (``--watch``, whose Live cuts what is taller than the terminal): when the
    events do not fit the terminal's height, each keeps one line, then none. A restart's
    delay is told from ``clock`` at each drawing (``counted_down``): ``--watch`` counts it down."""

    def __init__(self, rows: Sequence[Row], wide: bool = False, notes: Iterable[Note] = (),
                 fit_height: bool = False, clock: Callable[[], datetime] = _utcnow, whole_events: bool = False) -> None:
        self.rows, self.wide, self.notes, self.fit_height = list(rows), wide, list(notes), fit_height
        self.whole_events = whole_events
        self.clock = clock

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        now = self.clock()
        rows = _stamped(self.rows, now)
        keys = layout(rows, width, self.wide)
        lines = columns([COLUMNS[k][0] for k in keys], [[COLUMNS[k][1](r) for k in keys] for r in rows])
        # Under each row: its overlap (a standby booting beside it, started from its save), then its last event.
        said = [[text for text in (printable(r.get("overlap") or ""), printable(counted_down(r, now))) if text]
                for r in self.rows]
        room = width - cell_len(EVENT_INDENT)
        # One job's status (``whole_events``) shows its last event whole: it may end with the fix. A fleet's,
        # two lines each.
        events = [_under(texts, room, None if self.wide or self.whole_events else EVENT_LINES) for texts in said]
        if self.fit_height:
            spare = options.size.height - len(lines) - sum(len(console.render_lines(n, options)) for n in self.notes)
            if sum(map(len, events)) > spare:
                events = [_under(texts, room, 1) for texts in said]
            if sum(map(len, events)) > spare:
                events = [[] for _ in said]
        yield lines[0]
        for line, event in zip(lines[1:], events, strict=True):
            yield line
            for part in event:
                yield Text(EVENT_INDENT + part, no_wrap=True, overflow="ignore")
        yield from self.notes


def _under(texts: Sequence[str], width: int, max_lines: int | None) -> list[str]:
    """Each of ``texts`` wrapped in at most ``max_lines`` lines of ``width``, one after the other."""
    return [part for text in texts for part in wrap(text, width, max_lines)]


class Note:
    """A paragraph under the view, ``mark text``, wrapped between words, its lines under its text."""

    def __init__(self, mark: str, style: str, text: object) -> None:
        self.mark, self.style, self.text = mark, style, printable(text)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        indent = " " * (cell_len(self.mark) + 1) if self.mark else ""
        for i, part in enumerate(wrap(self.text, options.max_width - len(indent))):
            head = Text.assemble((self.mark, self.style), " ") if i == 0 and self.mark else Text(indent)
            yield Text.assemble(head, part, no_wrap=True, overflow="ignore")


def problems(rows: Sequence[Row]) -> list[Note]:
    """A job whose checkpoints cannot be listed: why."""
    return [Note("!", "yellow", f"{r['job']}: checkpoints not readable: {r['checkpoint_error']}")
            for r in rows if r.get("checkpoint_error")]


def maintenance(rows: Sequence[Row]) -> list[Note]:
    return [Note("!", "yellow", f"{r['job']}: maintenance scheduled on {r['upcoming_maintenance']}")
            for r in rows if r["upcoming_maintenance"]]


def watched(rows: Sequence[Row], wide: bool = False, stale: str | None = None,
            clock: Callable[[], datetime] = _utcnow) -> StatusView:
    """What ``--watch`` redraws: the view, its problems under it, and why it is old if a refresh failed."""
    notes = problems(rows) + unread(rows) + ([Note("!", "yellow", f"not refreshed: {stale}")] if stale else [])
    return StatusView(rows, wide, notes, fit_height=True, clock=clock)


def goodput_line(row: Row) -> Note:
    """Under one job's row: its goodput so far and the advised checkpoint interval (wrapped between words)."""
    total: dict[str, Any] | None = row["goodput"]
    # Paid to attempts that ran and ended between two passes with no trainer start on record:
    # their boot is unknown, and goodput is of the rest (controller.core.ledger), so said apart.
    unknown = total.get("unknown_hours") if total else None
    unknown = unknown if isinstance(unknown, float | int) and unknown > 0 else 0.0
    if not total or not total.get("accelerator_hours"):
        text = "goodput: not started (nothing paid yet)"  # never "0.0% (0.00 of 0.00)" before anything ran
    elif total["goodput"] is None:
        text = f"goodput unknown ({figure(unknown)} accelerator-hours paid, boot unknown)"
    else:
        known = total["accelerator_hours"] - unknown
        useful, paid, more = figures(total["useful_hours"], known, unknown)
        text = (f"goodput {total['goodput']:.1%} ({useful} of {paid} accelerator-hours useful"
                + (f"; {more} more paid, boot unknown)" if unknown else ")"))
    if total and isinstance(waited := total.get("waiting_hours"), float | int) and waited > 0:
        text += f"; {format_duration(timedelta(seconds=round(waited * 3600)))} waiting for capacity, not billed"
    if total:
        text += _progress(total)
    every = row["checkpoint_every_s"]
    advice = f"checkpoint every {format_duration(timedelta(seconds=round(every)))} advised" \
        if isinstance(every, float | int) else "no checkpoint interval advised yet"
    known = row.get("lifetime")
    if isinstance(every, float | int) and isinstance(known, Mapping) and \
            all(isinstance(known.get(k), float | int) and known[k] > 0 for k in ("mean_s", "low_s", "high_s")):
        advice += f" (time between losses ~{rough(known['mean_s'])}, 80 %: {rough(known['low_s'])}-{rough(known['high_s'])})"
    return Note("", "", f"{text}; {advice} (respawn report {row['job']})")


def rough(seconds: float) -> str:
    """An estimate's figure: days or hours to a tenth, else whole minutes."""
    if seconds >= 86400:
        return f"{seconds / 86400:.1f}d"
    return f"{seconds / 3600:.1f}h" if seconds >= 3600 else f"{max(1, round(seconds / 60))}m"


def live_line(row: Row, now: datetime | None = None) -> Note | None:
    """Under one job's row, while it runs: 'now at step 1,734; its last save took 0.41s to write,
    5.8s to upload; step 1,700 uploaded (reported by the trainer in its heartbeat, 12s ago)'.
    None without a live beat. Only values of their type are shown (third-party figures)."""
    live = row.get("live")
    if not isinstance(live, Mapping):
        return None
    now = now or _utcnow()
    parts = []
    if step := live_step(row, now, ago=False):
        parts.append(f"now at step {step}")
    save, upload = (live.get(k) for k in ("save_s", "upload_s"))
    took = [f"{_seconds(v)} to {what}" for v, what in ((save, "write"), (upload, "upload")) if _duration(v)]
    if took:
        parts.append(f"its last save took {', '.join(took)}")
    saved = live.get("saved_step")
    if isinstance(saved, int) and not isinstance(saved, bool) and 0 <= saved < 10**18:
        parts.append(f"step {saved:,} uploaded")
    if not parts:
        return None
    when = beat_age(live, now)
    return Note("", "", "; ".join(parts) + f" (reported by the trainer in its heartbeat{', ' + when if when else ''})")


def _duration(value: object) -> bool:
    """A save's or an upload's seconds worth showing: a number from 0 to a week (never NaN, never inf)."""
    return isinstance(value, float | int) and not isinstance(value, bool) and 0 <= value <= 7 * 86400


def unread(rows: Sequence[Row]) -> list[Note]:
    """Running jobs whose heartbeats the table did not read (past ``MAX_LIVE_READS``): where to see their step."""
    n = sum(1 for r in rows if r.get("live_unread") is True)
    if not n:
        return []
    return [Note("", "", f"STEP read for the first running jobs only; {n} more not read "
                         "(respawn status JOB shows a job's)")]


def _progress(total: Mapping[str, Any]) -> str:
    """'; step 1200 reached, 40 steps lost (30, 10); a save takes 0.4s (reported by the trainer),
    its upload 5.8s in the background': what a trainer using respawnkit reported, else ''."""
    step, each, text = total.get("step"), total.get("steps_lost_each") or [], ""
    if isinstance(step, int) or any(isinstance(n, int) for n in each):
        text = f"; step {step if isinstance(step, int) else '—'} reached, {total.get('steps_lost', 0)} steps lost"
        if len(each) > 1 or each and not isinstance(each[0], int):
            text += " (" + ", ".join(str(n) if isinstance(n, int) else "—" for n in each) + ")"
    save, source, upload = total.get("save_s"), total.get("save_source"), total.get("upload_s")
    if isinstance(save, float | int) and isinstance(source, str):
        at_least = "" if source == "reported by the trainer" else "at least "  # GCS's times: a lower bound
        text += f"; a save takes {at_least}{_seconds(save)} ({source})"
        if isinstance(upload, float | int):
            text += f", its upload {_seconds(upload)} in the background"
    return text


def _seconds(value: float) -> str:
    return f"{value:.2g}s" if value < 10 else format_duration(timedelta(seconds=round(value)))


def _ago(stamp: Any) -> str:
    """', 5m ago' for an ISO timestamp (advice is a snapshot: how old it is matters), else ''."""
    try:
        then = datetime.fromisoformat(str(stamp))
    except ValueError:
        return ""
    if then.tzinfo is None:
        return ""
    age = max(0, round((datetime.now(timezone.utc) - then).total_seconds()))
    return f", {format_duration(timedelta(seconds=age))} ago" if age else ", just now"


ADVICE_LAYOUTS = (("zone", "obtainability", "uptime", "rate", "worth"), ("zone", "obtainability", "uptime", "worth"),
                  ("zone", "obtainability", "worth"), ("zone", "worth"))


def _worth(score: Mapping[str, Any]) -> str:
    """A zone's figure as placement used it: "84%, 3.81 h/$"; "—" in a status from before it was kept."""
    goodput, per_dollar = score.get("goodput"), score.get("per_dollar")
    if not isinstance(goodput, float | int) or isinstance(goodput, bool):
        return "—"
    return f"{goodput:.0%}" + (f", {per_dollar:.3g} h/$" if isinstance(per_dollar, float | int) else "")


class AdviceTable:
    """Each zone as capacity advice scored it when the job last launched: where Spot VMs are
    likely to be had, how long the majority of them are expected to run (Google's estimate),
    and, of the Spot VMs that stopped there on the latest day, the share that were preempted
    (``preemptionRate``: how they ended, not how often); and what placement made of it (its
    figure, ``controller.core.placement.Worth``: the expected goodput there, and the useful hours a
    dollar buys where priced; the zones went in the order of that figure). Columns give way as
    the job table's do (the rate first, then the uptime, then the obtainability)."""

    HEADERS = {"zone": "ZONE", "obtainability": "OBTAINABILITY", "uptime": "SPOT UPTIME",
               "rate": "PREEMPTED OF STOPPED", "worth": "EXPECTED GOODPUT"}

    def __init__(self, row: Row) -> None:
        self.row = row

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        advice: dict[str, dict[str, float | None]] = self.row["zone_advice"]
        stocked_out = self.row.get("stocked_out") or {}  # seen since: the advice's scores there are stale
        cells = []
        for zone, a in advice.items():
            uptime, rate = a.get("uptime_s"), fraction(a.get("preemption_rate"))
            odds = "stocked out" if zone in stocked_out else \
                "—" if a.get("obtainability") is None else f"{a['obtainability']:.2f}"
            cells.append({"zone": plain(zone + (" ←" if zone == self.row["zone"] else "")),
                          "obtainability": plain(odds, "yellow" if zone in stocked_out else ""),
                          "uptime": plain("—" if uptime is None else f"{uptime / 86400:.1f} d"),
                          "rate": plain("—" if rate is None else f"{rate:.1%}"),
                          "worth": plain(_worth(a) if zone not in stocked_out else "—")})
        for keys in ADVICE_LAYOUTS:
            lines = columns([self.HEADERS[k] for k in keys], [[c[k] for k in keys] for c in cells])
            if max(line.cell_len for line in lines) <= options.max_width:
                break
        yield Note("", "", f"capacity advice at the last launch ({self.row['advice_at']}{_ago(self.row['advice_at'])})")
        yield from lines

