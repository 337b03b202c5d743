"""The dashboard's web server: Flask routes over the cached ``Fleet`` and the CLI's verbs.

Pages are Jinja templates whose every ``{{ }}`` goes through ``controller.render.text.html_text``
(the report's escaping: one path for all HTML), JSON escapes ``< > & '`` as ``\\u`` escapes
so that no value is markup even where a browser sniffs it, and every asset (CSS, JavaScript,
the timeline's PNG) is served from here. Every request is checked by ``guard.Guard``.
"""

from __future__ import annotations

import html
import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from flask import Flask, Response, abort, g, render_template, request
from markupsafe import Markup

from controller.core import errors
from controller.core.spec import SpecError
from controller.dashboard import metrics, views
from controller.dashboard.logtail import Recent, Tail, Tails
from controller.dashboard.guard import TOKEN_HEADER, Guard
from controller.dashboard.snapshot import Fleet
from controller.render.text import html_text
from controller.service.jobs import Refused, likely_meant

DEFAULT_INTERVAL = 5.0


def _escaped(value: object) -> Markup:
    """Every ``{{ }}`` of the templates: Markup already made safe stays; anything else is text."""
    return value if isinstance(value, Markup) else Markup(html_text("" if value is None else value))


def as_json(data: Any, status: int = 200) -> Response:
    text = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("'", "\\u0027")
    return Response(text, status=status, mimetype="application/json",
                    headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})


def create_app(fleet: Fleet, guard: Guard, interval: float = DEFAULT_INTERVAL,
               now: Callable[[], datetime] = lambda: datetime.now(UTC), recent: Recent | None = None,
               tails: Tails | None = None) -> Flask:
    """``recent(job)``: the job's last log lines (the CLI's reader of Cloud Logging), read through
    ``tails`` (``logtail.Tails``: per job, at most once per 30 s, only when its page asks)."""
    app = Flask(__name__)
    tails = tails or Tails(recent)
    app.jinja_env.finalize = _escaped
    pictures: dict[str, tuple[int, bytes]] = {}  # job -> (status generation, its timeline PNG)
    drawing = threading.Lock()

    @app.before_request
    def _checked() -> Response | None:
        if problem := guard.read_problem(request.headers):
            return as_json({"error": problem}, 403)
        if problem := guard.key_problem(request.headers, request.cookies, request.args):
            # Nothing of the user's, the POST token included: only how to get in.
            return as_json({"error": problem}, 403) if request.path.startswith("/api/") else \
                Response(problem + "\n", status=403, mimetype="text/plain")
        g.keyed = guard.key_in_query(request.args)  # by the printed address: its cookie is set
        problem = guard.write_problem(request.headers) if request.method == "POST" else None
        if problem is None and (request.path.startswith("/api/") or request.path.endswith("/timeline.png")):
            problem = guard.fetch_problem(request.headers)
        return as_json({"error": problem}, 403) if problem else None

    @app.after_request
    def _headers(response: Response) -> Response:
        if g.get("keyed"):  # the links, the assets and the polls carry the key from here on
            response.set_cookie(guard.cookie, guard.key, httponly=True, samesite="Strict", path="/")
        response.headers.setdefault("Content-Security-Policy", "default-src 'self'; img-src 'self'; "
                                    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        if not request.path.startswith("/static/"):  # pages, JSON, /metrics, pictures: always fresh
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    def page(template: str, **context: Any) -> str:
        return render_template(template, token=guard.token, interval=interval, **context)

    @app.get("/")
    def fleet_page() -> str:
        data = views.fleet(fleet.snapshot(), now())
        return page("fleet.html", data=data, columns=views.COLUMNS, phases=views.PHASES)

    @app.get("/api/jobs")
    def fleet_json() -> Response:
        return as_json(views.fleet(fleet.snapshot(), now()))

    def detail(job: str) -> dict[str, Any]:
        snapshot = fleet.snapshot()
        view = snapshot.jobs.get(job)
        if view is None:
            abort(404)
        return views.job(view, snapshot, now(), fleet.spec(job))

    @app.get("/jobs/<job>")
    def job_page(job: str) -> str:
        shown = detail(job)  # the lines last read, if any: the page asks for fresh ones itself
        # The spec as the polls send it (its lines kept, every other control character escaped), then HTML-escaped.
        spec = Markup(html.escape(shown["spec"], quote=True)) if shown["spec"] is not None else None
        return page("job.html", job=shown, spec=spec, attempt_columns=views.ATTEMPT_COLUMNS,
                    loss_columns=views.LOSS_COLUMNS, logs=_logs(job, tails.cached(job), tails.every))

    @app.get("/api/jobs/<job>/logs")
    def logs_json(job: str) -> Response:
        jobs = fleet.snapshot().jobs
        if job not in jobs:
            abort(404)
        tails.forget(set(jobs))
        return as_json(_logs(job, tails.get(job), tails.every))

    @app.get("/api/jobs/<job>")
    def job_json(job: str) -> Response:
        return as_json(detail(job))

    @app.get("/jobs/<job>/timeline.png")
    def timeline(job: str) -> Response:
        from controller.render import report

        snapshot = fleet.snapshot()
        view = snapshot.jobs.get(job)
        if view is None or view.row.status is None:
            abort(404)
        with drawing:  # matplotlib's figures are not drawn side by side; one drawing per status written
            for gone in [name for name in pictures if name not in snapshot.jobs]:
                del pictures[gone]  # a job removed from the bucket: its picture goes too
            kept = pictures.get(job)
            if kept is None or kept[0] != view.status_generation:
                kept = pictures[job] = (view.status_generation, report.timeline_png(job, view.row.status, now()))
        return Response(kept[1], mimetype="image/png", headers={"Cache-Control": "no-store"})

    @app.post("/api/jobs/<job>/cancel")
    def cancel(job: str) -> Response:
        return _act(fleet, lambda: fleet.jobs.cancel(job) or f"cancel requested for {job}")

    @app.post("/api/jobs/<job>/resubmit")
    def resubmit(job: str) -> Response:
        body = request.get_json(silent=True) or {}
        shown = fleet.spec(job)
        if shown is None:
            return as_json({"error": f"{job} has no spec to resubmit"}, 409)
        if body.get("spec_generation") != shown[0]:
            return as_json({"error": "the spec changed since the page showed it: reload and look again"}, 409)

        def submit() -> str:
            try:
                generation = fleet.jobs.submit(shown[1], job, replace=True, if_generation=shown[0])
            except errors.PreconditionFailed:
                fleet.expire()
                raise Refused("the spec changed since the page showed it (someone submitted another): "
                              "reload and look again") from None
            return f"resubmitted {job} with --replace (spec generation {generation})"
        return _act(fleet, submit)

    records: dict[str, tuple[datetime, Any]] = {}  # sweep -> (the snapshot it was read with, its record)

    def sweep_data(name: str) -> dict[str, Any]:
        """The sweep's page, its record read once a snapshot (the bucket once an interval, however
        many pages poll it), its trials' statuses the snapshot's."""
        from controller.service import sweeps

        snapshot = fleet.snapshot()
        kept = records.get(name)
        if kept is None or kept[0] != snapshot.at:
            try:
                kept = records[name] = (snapshot.at, sweeps.read_record(fleet.jobs, name))
            except Refused:
                records.pop(name, None)
                abort(404)
        return views.sweep(kept[1], snapshot, now())

    @app.get("/sweeps/<name>")
    def sweep_page(name: str) -> str:
        return page("sweep.html", sweep=sweep_data(name), columns=views.SWEEP_COLUMNS)

    @app.get("/api/sweeps/<name>")
    def sweep_json(name: str) -> Response:
        return as_json(sweep_data(name))

    @app.get("/metrics")
    def prometheus() -> Response:
        return Response(metrics.exposition(fleet.snapshot(), now()), mimetype=None,
                        headers={"Content-Type": metrics.CONTENT_TYPE})

    @app.get("/favicon.ico")
    def _icon() -> Response:
        return Response(status=204)  # none: a browser asks for one; the answer is from here, and empty

    @app.errorhandler(errors.RespawnError)
    def _unreadable(e: errors.RespawnError) -> Response:
        # The bucket did not answer (or refused): said, and the page's next poll tries again.
        return as_json({"error": f"cannot read gs://{fleet.jobs.bucket}: {e or type(e).__name__}"}, 503)

    @app.errorhandler(404)
    def _missing(_: Exception) -> Response | tuple[str, int]:
        if request.path.startswith("/api/"):
            return as_json({"error": "no such job or page"}, 404)
        # A page asked for by a person (a mistyped job in the address bar): a page back, never JSON.
        parts = request.path.strip("/").split("/")
        if len(parts) >= 2 and parts[0] == "jobs":
            near = likely_meant(parts[1], sorted(fleet.snapshot().jobs))  # the CLI's rule
            hint = f" Did you mean {near}?" if near else ""
            return page("missing.html", what=f"no job named {parts[1]}",
                        why=f"gs://{fleet.jobs.bucket} holds no job of that name.{hint}"), 404
        return page("missing.html", what="no such page", why=f"{request.path} is none of the dashboard's pages."), 404

    return app


def _logs(job: str, tail: Tail | None, every: float) -> dict[str, Any]:
    """``GET /api/jobs/JOB/logs``: the last lines of its current run, or the note saying why none,
    when they were read, and the command that prints them all."""
    if tail is None:
        return {"lines": [], "note": "reading its last lines…", "read_at": None, "every": every,
                "command": views.logs_command(job)}
    return {"lines": list(tail.lines), "note": tail.note if tail.note or tail.lines else "(no output yet)",
            "read_at": views.stamp(tail.read_at) if tail.read_at else None, "every": every,
            "command": views.logs_command(job)}


def _act(fleet: Fleet, action: Callable[[], str]) -> Response:
    """A verb's outcome as JSON: what was done, or why not (409), or that Google failed (503)."""
    try:
        done = action()
        fleet.expire()
        return as_json({"message": done})
    except (Refused, SpecError) as e:
        return as_json({"error": "; ".join(e.problems) if isinstance(e, SpecError) else str(e)}, 409)
    except errors.RespawnError as e:
        return as_json({"error": str(e) or type(e).__name__}, 503)


__all__ = ["TOKEN_HEADER", "create_app", "as_json", "DEFAULT_INTERVAL"]
