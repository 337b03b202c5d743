"""The ``respawn`` command line. Every option can also be set by environment variable."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from controller import bootstrap, errors
from controller.config import Settings
from controller.jobs import Jobs, Refused
from controller.spec import SpecError, load_document, parse_spec

app = typer.Typer(help="Keep Spot training jobs on Compute Engine alive.", no_args_is_help=True)
out = Console()
err = Console(stderr=True)


@app.command()
def validate(
    spec: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="spec.yaml or .json")],
    job: Annotated[str | None, typer.Option(envvar="RESPAWN_JOB", help="job name (default: spec's name or file stem)")] = None,
) -> None:
    """Check a spec against the schema and this controller's policy. Exit 2 if invalid."""
    raw = spec.read_bytes()
    name = job or _declared_name(raw) or spec.stem
    config = Settings()
    try:
        parsed = parse_spec(raw, name)
        # Without the controller's settings there is no policy to check against.
        problems = config.policy().violations(parsed) if config.project else []
    except SpecError as e:
        problems = e.problems
    if problems:
        for line in problems:
            err.print(f"[red]✗[/red] {line}", highlight=False)
        raise typer.Exit(2)
    out.print(f"[green]✓[/green] {name}: valid ({len(parsed.zones)} zones, {parsed.nodes} node(s), {parsed.provisioning})")
    if not config.project:
        out.print("[dim]schema only: set RESPAWN_PROJECT (and the policy variables) to check this controller's policy[/dim]")


def _jobs() -> Jobs:
    store, _ = bootstrap.adapters()
    config = bootstrap.settings()
    return Jobs(store, config.bucket, config.policy())


def _fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[red]✗[/red] {message}", highlight=False)
    raise typer.Exit(code)


@app.command()
def submit(
    spec: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="spec.yaml or .json")],
    job: Annotated[str | None, typer.Option(envvar="RESPAWN_JOB", help="job name (default: spec's name or file stem)")] = None,
    replace: Annotated[bool, typer.Option("--replace", help="overwrite the spec of a job that is still running")] = False,
) -> None:
    """Validate a spec, then upload it to jobs/<name>/spec.yaml."""
    raw = spec.read_bytes()
    name = job or _declared_name(raw) or spec.stem
    try:
        generation = _jobs().submit(raw, name, replace)
    except SpecError as e:
        for line in e.problems:
            err.print(f"[red]✗[/red] {line}", highlight=False)
        raise typer.Exit(2) from e
    except (Refused, errors.RespawnError) as e:
        _fail(str(e))
    config = bootstrap.settings()
    out.print(f"[green]✓[/green] submitted {name} to gs://{config.bucket}/jobs/{name}/spec.yaml (generation {generation})")


@app.command()
def cancel(job: Annotated[str, typer.Argument(help="the job to cancel")]) -> None:
    """Ask the controller to cancel a job and delete its VMs."""
    try:
        _jobs().cancel(job)
    except (Refused, errors.RespawnError) as e:
        _fail(str(e))
    out.print(f"[green]✓[/green] cancel requested for {job}")


@app.command()
def status(
    job: Annotated[str | None, typer.Argument(help="one job (default: every job)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    watch: Annotated[bool, typer.Option("--watch", help="refresh until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(envvar="RESPAWN_WATCH_INTERVAL", help="seconds between refreshes")] = 2.0,
    refreshes: Annotated[int, typer.Option(hidden=True, help="stop --watch after this many refreshes (0: never)")] = 0,
) -> None:
    """A table of jobs: phase, attempt, preemptions, failures, zone, instance, checkpoint, age, last event."""
    try:
        rows = _status_rows(job)
    except errors.RespawnError as e:
        _fail(str(e))
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not watch:
        out.print(_status_table(rows))
        return
    from rich.live import Live

    count = 0
    with Live(_status_table(rows), console=out, refresh_per_second=4) as live:
        try:
            while not refreshes or count < refreshes:
                time.sleep(interval)
                live.update(_status_table(_status_rows(job)))
                count += 1
        except KeyboardInterrupt:
            pass


def _status_rows(job: str | None) -> list[dict[str, object]]:
    from datetime import UTC, datetime

    _, compute = bootstrap.adapters()
    config = bootstrap.settings()
    ids = {i.name: i.id for i in compute.list_managed(config.policy().watched_projects, job).instances}
    jobs = _jobs()
    return [row.as_dict(datetime.now(UTC), ids, jobs.checkpoint_step(row.job)) for row in jobs.rows(job)]


def _status_table(rows: list[dict[str, object]]) -> Table:
    from controller.durations import format_duration
    from datetime import timedelta

    table = Table("job", "phase", "attempt", "preempt.", "fail.", "zone", "instance (id)", "ckpt step", "age", "last event")
    colours = {"RUNNING": "green", "SUCCEEDED": "bold green", "FAILED": "red", "RECOVERING": "yellow",
               "CANCELLED": "dim", "PROVISIONING": "cyan", "PENDING": "cyan"}
    for r in rows:
        phase = str(r["phase"])
        age = r["age_seconds"]
        instance = f"{r['instance']} ({r['instance_id']})" if r["instance_id"] else str(r["instance"] or "—")
        event = str(r["last_event"])
        table.add_row(str(r["job"]), f"[{colours.get(phase, 'white')}]{phase}[/]", str(r["attempt"]),
                      str(r["preemptions"]), str(r["failures"]), str(r["zone"] or "—"), instance,
                      str(r["checkpoint_step"] if r["checkpoint_step"] is not None else "—"),
                      format_duration(timedelta(seconds=int(age))) if isinstance(age, int) else "—",
                      event if len(event) <= 80 else event[:77] + "...")
    return table


@app.command()
def logs(
    job: Annotated[str, typer.Argument(help="the job whose VMs' logs to show")],
    limit: Annotated[int, typer.Option(envvar="RESPAWN_LOG_LIMIT", help="at most this many entries")] = 200,
    serial: Annotated[bool, typer.Option("--serial", help="read the serial console through the Compute API "
                                                          "instead of Cloud Logging")] = False,
) -> None:
    """Cloud Logging entries of the job's instances (every attempt), oldest first."""
    status = _jobs().status(job)
    ids = dict(status.instance_ids) if status else {}
    _, compute = bootstrap.adapters()
    config = bootstrap.settings()
    live = compute.list_managed(config.policy().watched_projects, job).instances
    ids.update({i.name: i.id for i in live})
    if not ids:
        _fail(f"no instance of {job!r} has been seen yet")
    if serial:
        where = {i.name: (i.project, i.zone) for i in live}
        fallback = ((status.project or config.project), status.zone) if status else (config.project, None)
        for name in ids:
            out.print(f"[bold]== {name}[/bold]")
            print(_serial_output(config, *where.get(name, fallback), name))
        return
    from google.cloud import logging as cloud_logging

    client = cloud_logging.Client(project=config.project)
    for entry in client.list_entries(filter_=logs_filter(ids.values()), order_by=cloud_logging.ASCENDING,
                                     max_results=limit):
        payload = entry.payload if isinstance(entry.payload, str) else json.dumps(entry.payload)
        name = entry.labels.get("compute.googleapis.com/resource_name", "") if entry.labels else ""
        print(f"{entry.timestamp:%Y-%m-%d %H:%M:%S} {name} {payload}")


def logs_filter(instance_ids: Iterable[str]) -> str:
    ids = " OR ".join(f'"{i}"' for i in sorted(set(instance_ids)) if i)
    return f'resource.type="gce_instance" AND resource.labels.instance_id=({ids})'


def _serial_output(config: Settings, project: str, zone: str | None, name: str) -> str:
    from google.api_core import exceptions
    from controller.adapters.google import instances_client

    try:
        return instances_client(config).get_serial_port_output(project=project, zone=zone, instance=name).contents
    except exceptions.NotFound:
        return "(instance deleted: its serial console went with it; use Cloud Logging)"


@app.command()
def deploy(
    project: Annotated[str, typer.Option(envvar="RESPAWN_PROJECT", help="the project to deploy into")],
    region: Annotated[str, typer.Option(envvar="RESPAWN_REGION", help="region of the functions and the scheduler")],
    bucket: Annotated[str, typer.Option(envvar="RESPAWN_BUCKET", help="the control bucket")],
    service_account: Annotated[str | None, typer.Option(envvar="RESPAWN_SERVICE_ACCOUNT",
                                                        help="the controller's service account")] = None,
    scheduler_account: Annotated[str | None, typer.Option(envvar="RESPAWN_SCHEDULER_ACCOUNT",
                                                          help="the scheduler's service account")] = None,
    trainer_account: Annotated[str | None, typer.Option(
        envvar="RESPAWN_TRAINER_SERVICE_ACCOUNT",
        help="the trainer VMs' service account, created if it is in the project "
             "(default respawn-trainer@PROJECT.iam.gserviceaccount.com)")] = None,
    schedule: Annotated[str, typer.Option(envvar="RESPAWN_SCHEDULE", help="cron schedule of tick")] = "* * * * *",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print every command and API request, run nothing")] = False,
) -> None:
    """Deploy the trainer account and the bucket's IAM, both functions, the Cloud Scheduler job and the VM scripts."""
    import shlex
    import subprocess

    from controller import deploy as deployment

    config = Settings()
    policy_env = {f"RESPAWN_{k.upper()}": ",".join(v) if isinstance(v, tuple) else str(v)
                  for k, v in config.model_dump(include={"allowed_projects", "allowed_zones", "allowed_machine_types",
                                                         "allowed_service_accounts", "max_nodes", "max_accelerators"}).items()
                  if v not in ((), None)}
    target = deployment.Target(
        project=project, region=region, bucket=bucket,
        controller_sa=service_account or deployment.account_email("respawn-controller", project),
        scheduler_sa=scheduler_account or deployment.account_email("respawn-scheduler", project),
        trainer_sa=trainer_account or deployment.account_email(deployment.TRAINER_ACCOUNT_ID, project),
        schedule=schedule, env=policy_env)
    try:
        steps = deployment.plan(target)
    except ValueError as error:
        _fail(str(error))
    if dry_run:
        for number, step in enumerate(steps, 1):
            out.print(f"[bold]# {number}. {step.title}[/bold]", soft_wrap=True)
            print(step.render())
        return
    try:
        deployment.execute(steps, target, say=lambda title: out.print(f"[bold]→[/bold] {title}"))
    except subprocess.CalledProcessError as error:
        _fail(f"{shlex.join(error.cmd)} failed:\n{(error.stderr or '').strip()}", 1)
    out.print("[green]✓[/green] deployed")


@app.command()
def reconcile(
    job: Annotated[str | None, typer.Argument(help="one job (default: every job)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the planned actions, change nothing")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Run one reconcile pass from the terminal."""
    try:
        summary = bootstrap.engine().reconcile(job, dry_run=dry_run)
    except errors.ConfigError as e:
        err.print(f"[red]configuration:[/red] {e}")
        raise typer.Exit(2) from e
    if as_json:
        out.print_json(json.dumps(summary.as_dict()))
        return
    table = Table("job", "planned" if dry_run else "done", "error")
    for name, done in summary.jobs.items():
        table.add_row(name, "\n".join(done) or "—", summary.errors.get(name, ""))
    out.print(table)


local = typer.Typer(help="The local cloud: GCS, Compute Engine, the functions, Scheduler and Eventarc.")
app.add_typer(local, name="local")


@local.command("up")
def local_up(
    bucket: Annotated[str, typer.Option(envvar="RESPAWN_BUCKET")] = "respawn-local",
    project: Annotated[str, typer.Option(envvar="RESPAWN_PROJECT")] = "respawn-local",
    tick: Annotated[float, typer.Option(envvar="RESPAWN_LOCAL_TICK", help="seconds between scheduler ticks")] = 60.0,
    preemption_notice: Annotated[float, typer.Option(envvar="RESPAWN_LOCAL_NOTICE",
                                                     help="shutdown-script budget in seconds (Spot: 30)")] = 30.0,
) -> None:
    """Start the whole local cloud and keep it up until Ctrl-C."""
    import signal
    import threading

    from localcloud.stack import LocalCloud, Options

    cloud = LocalCloud(Options(bucket=bucket, project=project, tick_interval=tick, shutdown_budget=preemption_notice))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # explicit: a background job inherits SIGINT ignored
        signal.signal(sig, lambda *_: stop.set())
    with cloud:
        out.print("[bold green]local cloud up[/bold green] — point clients at it with:\n")
        for key, value in cloud.env().items():
            print(f"export {key}={value}")
        out.print(f"\nfunctions: tick {cloud.function_url('tick')}  on_object {cloud.function_url('on_object')}")
        out.print("Ctrl-C stops everything.")
        while not stop.wait(0.5):
            pass
    out.print("local cloud stopped")


@app.command()
def demo(
    notice: Annotated[float, typer.Option(envvar="RESPAWN_DEMO_NOTICE",
                                          help="preemption notice in seconds (Spot gives 30; shortened for the demo)")] = 3.0,
) -> None:
    """Run the whole story locally: a Spot job preempted three times still ends exactly right."""
    from localcloud import demo as story

    try:
        result = story.run(out, notice)
    except TimeoutError as e:
        err.print(f"[red]demo failed:[/red] {e}")
        raise typer.Exit(1) from e
    table = Table(title="respawn demo", show_header=False)
    rows = [
        ("outcome", str(result.phase)),
        ("attempts", str(result.attempts)),
        ("preemptions", str(result.preemptions)),
        ("failures", str(result.failures)),
        ("steps lost to preemption", str(result.steps_lost)),
        ("final loss", result.final_loss or "?"),
        ("final weights", result.final_hash or "?"),
        ("uninterrupted run", result.reference_hash),
        ("wall time", f"{result.seconds:.0f} s"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    out.print(table)
    for line in result.story:
        out.print(f"  {line}")
    if not result.ok:
        err.print("[red]the story did not come out right[/red]")
        raise typer.Exit(1)
    out.print("[bold green]✓ same weights as an uninterrupted run[/bold green]")


def _declared_name(raw: bytes) -> str | None:
    try:
        data = load_document(raw)  # bounded: a hostile file must not blow the stack here either
    except SpecError:
        return None
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


if __name__ == "__main__":
    app()
