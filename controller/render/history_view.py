"""How ``respawn history JOB`` (and ``respawn status --all``) draws a job's runs: one line a run,
plain columns as the jobs table (``status_view.columns``), laid out when drawn at that width.

A run's id is when it began (``20261127-191742``, UTC); then how it ended, when, how long it ran,
its attempts, its goodput, its cost against the same hours on demand, and its latest checkpoint.
As the width shrinks, things give way (``LAYOUTS``): the end's time, the on-demand cost, how long
it ran, the attempts, the checkpoint, the goodput; the run, its outcome and its cost always stay.
Everything from a user or the cloud is plain text with control characters escaped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.text import Text

from controller.core.durations import format_duration
from controller.core.runs import RunSummary
from controller.render.amounts import counted, dollars
from controller.render.status_view import COLOURS, Note, columns
from controller.render.text import plain


def _ran(r: RunSummary) -> Text:
    if r.started is None or r.ended is None:
        return plain("—")
    return plain(format_duration(max(timedelta(0), r.ended - r.started)))


def _money(r: RunSummary, which: int) -> Text:
    """The run's cost (0) or its on-demand cost (1), both at one precision (render.amounts)."""
    return plain(dollars(r.cost, r.on_demand_cost)[which])


def _outcome(r: RunSummary, current: bool) -> Text:
    text = plain(r.phase, COLOURS.get(r.phase, ""))
    return text + plain(" (now)") if current and r.ended is None else text


# key: (header, the cell of one run; ``current``: it is the job's current run)
COLUMNS: dict[str, tuple[str, Callable[[RunSummary, bool], Text]]] = {
    "run": ("RUN", lambda r, now: plain(r.run + (" fresh" if r.fresh else ""))),
    "outcome": ("OUTCOME", _outcome),
    "ended": ("ENDED", lambda r, now: plain(f"{r.ended:%m-%d %H:%M}" if r.ended else "—")),
    "ran": ("RAN", lambda r, now: _ran(r)),
    "attempts": ("ATTEMPTS", lambda r, now: plain(r.attempts)),
    "goodput": ("GOODPUT", lambda r, now: plain("—" if r.goodput is None else f"{r.goodput:.1%}")),
    "cost": ("COST", lambda r, now: _money(r, 0)),
    "on_demand": ("ON DEMAND", lambda r, now: _money(r, 1)),
    "checkpoint": ("CHECKPOINT", lambda r, now: plain(r.checkpoint_label or "—")),
}

# Widest first; each gives one thing up (module docstring). The first that fits is drawn.
LAYOUTS: tuple[tuple[str, ...], ...] = (
    ("run", "outcome", "ended", "ran", "attempts", "goodput", "cost", "on_demand", "checkpoint"),
    ("run", "outcome", "ran", "attempts", "goodput", "cost", "on_demand", "checkpoint"),
    ("run", "outcome", "ran", "attempts", "goodput", "cost", "checkpoint"),
    ("run", "outcome", "attempts", "goodput", "cost", "checkpoint"),
    ("run", "outcome", "goodput", "cost", "checkpoint"),
    ("run", "outcome", "goodput", "cost"),
    ("run", "outcome", "cost"),
)


class HistoryView:
    """A job's runs, oldest first; the last is its current run when ``current``."""

    def __init__(self, runs: Sequence[RunSummary], current: bool = True) -> None:
        self.runs, self.current = list(runs), current

    def cells(self, keys: Sequence[str]) -> list[list[Text]]:
        last = len(self.runs) - 1
        return [[COLUMNS[k][1](r, self.current and i == last) for k in keys] for i, r in enumerate(self.runs)]

    def layout(self, width: int) -> tuple[str, ...]:
        for keys in LAYOUTS:
            lines = columns([COLUMNS[k][0] for k in keys], self.cells(keys))
            if max(line.cell_len for line in lines) <= width:
                return keys
        return LAYOUTS[-1]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        keys = self.layout(options.max_width)
        yield from columns([COLUMNS[k][0] for k in keys], self.cells(keys))



def run_line(row: Mapping[str, Any]) -> Note:
    """Under one job's row (``respawn status JOB``): its run's id, where a fresh run's checkpoints
    go, and how many runs came before (``respawn history JOB``)."""
    if not row.get("run"):
        return Note("", "", "run: not begun (the controller has not taken the job up yet)")
    text = f"run {row['run']}"
    if row.get("run_checkpoints"):
        text += f" ({'fresh: ' if row.get('fresh') else ''}its checkpoints under {row['run_checkpoints']})"
    count = row.get("earlier_runs") or 0
    text += f"; {counted(count, 'earlier run')} (respawn history {row['job']})" if count else "; the job's first run"
    return Note("", "", text)


def earlier_runs(row: Mapping[str, Any]) -> Group:
    """``respawn status --all``: a job's earlier runs (its row's ``runs``) under a line naming it."""
    runs = [RunSummary.model_validate(r) for r in row["runs"]]
    return Group(Note("", "", f"{row['job']}: {counted(len(runs), 'earlier run')}"),
                 HistoryView(runs, current=False))
