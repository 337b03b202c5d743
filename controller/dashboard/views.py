"""What the dashboard's pages and JSON say, from a ``Snapshot``: pure, no reads.

A fleet row is the row ``respawn status --json`` gives (``JobRow.as_dict``, the ledger's
summary) plus ``cells``: each table cell's text, written here once for the page and for its
polls alike (the page's JavaScript only puts text where the server wrote it), and ``sort``,
the numbers the columns sort by. Text from users or the cloud stays text: the templates and
the JSON escape it (``controller.render.text.html_text``; ``server.as_json``).
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from controller.core import ledger
from controller.core.durations import format_duration
from controller.core.state import JobStatus, Phase
from controller.core.sweep import SweepRecord
from controller.dashboard.snapshot import JobView, Snapshot
from controller.render import handover_view, report, spec_text
from controller.render.amounts import dollars, figure
from controller.render.status_view import counted_down, live_step
from controller.render.text import printable
from controller.service import sweeps

WEEK = timedelta(days=7)
PHASES = [str(p) for p in Phase] + ["SUBMITTED"]  # a job's phase; SUBMITTED: not taken up yet
# key: the column's header; the fleet table's columns in order (the job's name comes first)
COLUMNS = {"phase": "phase", "attempt": "attempt", "zone": "zone (model)", "step": "step / checkpoint",
           "age": "age", "goodput": "goodput", "cost": "cost (saved)", "event": "last event"}


def stamp(when: datetime) -> str:
    """RFC 3339, UTC, to the second: 2026-11-27T20:05:01Z."""
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def fleet_row(view: JobView, now: datetime) -> dict[str, Any]:
    row = view.row.as_dict(now, {}, view.checkpoint, view.checkpoint_error)
    total = ledger.summary(view.row.status.ledger, now) if view.row.status else None
    row["goodput"] = total.model_dump(mode="json") if total else None
    row["live"] = view.live
    row["problem"] = view.problem
    row["overlap"] = overlap(view)
    row["cells"] = {key: printable(text) for key, text in _cells(row, total, now).items()}
    row["sort"] = {"attempt": row["attempt"], "age": row["age_seconds"] or 0,
                   "goodput": total.goodput if total and total.goodput is not None else -1.0,
                   "cost": total.cost if total else 0.0}
    return row


def overlap(view: JobView) -> str | None:
    """While a job's next attempt boots beside it (a standby, at a preemption notice) or waits for its
    trainer after the go: that, in one line (``handover_view.line``), in place of its last event.
    Once its trainer started, the job page's summary says how soon (``report.zero_gap``)."""
    status = view.row.status
    if status is None or (status.standby is None and not status.held):
        return None
    step = view.live.get("step") if isinstance(view.live, dict) else None
    return handover_view.line(view.row.job, status, view.ready, step if isinstance(step, int) else None)


def _cells(row: dict[str, Any], total: ledger.Summary | None, now: datetime) -> dict[str, str]:
    zone = row["zone"] or "—"
    step = live_step(row, now) or (f"checkpoint {row['checkpoint_label']}" if row["checkpoint_label"] else "—")
    if row.get("checkpoint_error"):
        step = "checkpoints unreadable"
    age = row["age_seconds"]
    return {
        "phase": row["phase"], "attempt": str(row["attempt"]),
        "zone": f"{zone} ({row['provisioning']})" if row["zone"] and row["provisioning"] else zone,
        "step": step,
        "age": format_duration(timedelta(seconds=age)) if isinstance(age, int) else "—",
        "goodput": "—" if total is None or total.goodput is None else f"{total.goodput:.1%}",
        "cost": _cost(total),
        "event": f"{row['problem']} (showing the last one read)" if row.get("problem") else
                 row.get("overlap") or counted_down(row, now),
    }


def _cost(total: ledger.Summary | None) -> str:
    if total is None:
        return "—"
    if not total.on_demand_cost:
        return dollars(total.cost)[0]
    cost, saved = dollars(total.cost, total.savings)
    return f"{cost} ({saved} saved)"


def totals(statuses: Iterable[JobStatus], now: datetime) -> dict[str, Any]:
    """The fleet's figures: accelerators running now, accelerator-hours paid in the last 7 days
    (of the attempts each ledger keeps in detail), goodput, dollars spent and saved, and each
    zone's preemptions and stockouts."""
    running = week = paid = useful = cost = saved = on_demand = 0.0
    zones: dict[str, dict[str, int]] = {}
    for status in statuses:
        book, total = status.ledger, ledger.summary(status.ledger, now)
        if (span := book.open) is not None and span.running is not None:
            running += span.accelerators
        week += sum(_hours_since(span, now - WEEK, now) for span in book.spans)
        paid += total.accelerator_hours - total.unknown_hours
        useful += total.useful_hours
        cost, saved, on_demand = cost + total.cost, saved + total.savings, on_demand + total.on_demand_cost
        for zone, causes in book.totals.losses.items():
            zones.setdefault(zone, {"preemptions": 0, "stockouts": 0})["preemptions"] += causes.get("preempted", 0)
        for zone, n in book.totals.stockouts.items():
            zones.setdefault(zone, {"preemptions": 0, "stockouts": 0})["stockouts"] += n
    spent_text, saved_text = dollars(cost)[0], dollars(saved)[0]  # two tiles: each figure alone
    return {"accelerators_running": running, "accelerator_hours_week": round(week, 4),
            "goodput": useful / paid if paid > 0 else None, "cost": cost, "saved": saved, "on_demand": on_demand,
            "zones": dict(sorted(zones.items())),
            "text": {"accelerators_running": f"{running:g}", "accelerator_hours_week": figure(week, places=1),
                     "goodput": "—" if paid <= 0 else f"{useful / paid:.1%}", "cost": spent_text,
                     "saved": saved_text}}


def _hours_since(span: ledger.Span, since: datetime, now: datetime) -> float:
    """The span's accelerator-hours paid after ``since``: billed from its capacity (a queued
    attempt's) or its acceptance, else its start, to its end or ``now``."""
    start = span.capacity if span.queued is not None else (span.inserted or span.start)
    if start is None:
        return 0.0
    begin, end = max(start, since), span.end or now
    return max(0.0, (end - begin).total_seconds()) / 3600 * span.accelerators


def fleet(snapshot: Snapshot, now: datetime) -> dict[str, Any]:
    """``GET /api/jobs``: every job's row (``FLEET_FIELDS``: what the page shows and sorts by; the
    rest is in ``GET /api/jobs/JOB``), the fleet's totals, the sweeps its trials are in (each with
    its number of trials, linked to its page), and when the bucket was read."""
    statuses = [v.row.status for v in snapshot.jobs.values() if v.row.status is not None]
    sweeps = Counter(st.sweep for st in statuses if st.sweep)
    return {"jobs": [{key: row[key] for key in FLEET_FIELDS} for row in (fleet_row(v, now) for v in snapshot.jobs.values())],
            "totals": totals(statuses, now), "sweeps": dict(sorted(sweeps.items())), "updated": stamp(snapshot.at)}


SWEEP_COLUMNS = ("trial", "params", "phase", "losses", "cost")


def sweep(record: SweepRecord, snapshot: Snapshot, now: datetime) -> dict[str, Any]:
    """``GET /api/sweeps/NAME``: the sweep's trials as ``respawn sweep status --json`` lists them (best
    first by its metric), each with its cells as the page shows them, and the sweep's totals."""
    def status_of(job: str) -> JobStatus | None:
        view = snapshot.jobs.get(job)
        return view.row.status if view is not None else None

    rows = sweeps.rows(record, status_of, now)
    for row in rows:
        metric = row["metric"]
        row["cells"] = {"trial": row["trial"], "params": " ".join(f"{k}={v}" for k, v in row["params"].items()),
                        "phase": row["phase"], "losses": str(row["losses"]), "cost": dollars(row["cost_usd"])[0],
                        "metric": ("no result" if row["result"] is None else "not a number") if metric is None
                        else f"{metric:g}"}
    summed = sweeps.totals(rows)
    return {"sweep": record.name, "max_parallel": record.max_parallel,
            "metric": record.metric.model_dump() if record.metric else None, "trials": rows, "totals": summed,
            "text": {"cost": dollars(summed["cost_usd"])[0], "saved": dollars(summed["saved_usd"])[0]},
            "updated": stamp(snapshot.at)}


# What the fleet page uses of a row (its cells and sort keys); a job's JSON has all of them.
FLEET_FIELDS = ("job", "phase", "attempt", "problem", "cells", "sort")


def logs_command(job: str) -> str:
    """What prints every attempt's output and follows it: ``respawn logs JOB --follow``."""
    return shlex.join(["respawn", "logs", job, "--follow"])


def nothing_to_cancel(view: JobView) -> str | None:
    """Why the job's Cancel button is disabled, as ``respawn cancel`` would answer it; None: it can be
    cancelled. A run that ended (succeeded, failed, cancelled) has nothing to cancel until a spec it
    did not take is submitted (a resubmit): then the new run can be."""
    status = view.row.status
    if status is None:
        return None if view.spec_generation else "no spec and no run: nothing to cancel"
    if status.phase.terminal and (not view.spec_generation or status.spec_generation == view.spec_generation):
        how = "cancelled" if status.phase == Phase.CANCELLED else f"finished ({status.phase.lower()})"
        return f"already {how}: nothing to cancel (resubmit it to run it again)"
    return None


def job(view: JobView, snapshot: Snapshot, now: datetime, spec: tuple[int, bytes] | None) -> dict[str, Any]:
    """``GET /api/jobs/JOB``: its row, the report's summary and tables, its transitions (oldest
    first), its spec (what resubmit sends, its secrets hidden: ``spec_text``) and the command that
    prints its logs."""
    status = view.row.status
    detail: dict[str, Any] = {**fleet_row(view, now), "updated": stamp(snapshot.at),
                              "status_generation": view.status_generation,
                              "logs_command": logs_command(view.row.job),
                              "cancel_refused": nothing_to_cancel(view),
                              # Its secrets hidden (a webhook's URL, a token in env), whoever reaches the page.
                              "spec": printable(spec_text.shown(spec[1]), keep="\n\t") if spec else None,
                              "spec_generation": spec[0] if spec else None}
    if status is None:
        return {**detail, "history": [], "facts": [], "attempts": [], "losses": []}
    return {**detail,
            "history": [{"at": stamp(e.at), "event": e.event, "attempt": e.attempt, "detail": e.detail,
                         "text": printable(f"{stamp(e.at)}  #{e.attempt} {e.event}" + (f": {e.detail}" if e.detail else ""))}
                        for e in status.history],
            "facts": [[printable(what), printable(figure)] for what, figure in report.facts(status, now, view.live, view.row.job)],
            "attempts": [[printable(c) for c in row] for row in report.attempt_rows(status, now)],
            "losses": [[printable(c) for c in row] for row in report.loss_rows(status)]}


ATTEMPT_COLUMNS, LOSS_COLUMNS = report.ATTEMPT_COLUMNS, report.LOSS_COLUMNS
