"""The ``respawn`` command line. Every option can also be set by environment variable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from controller import bootstrap, errors
from controller.config import Settings
from controller.spec import SpecError, parse_spec

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
    try:
        parsed = parse_spec(raw, name)
        problems = Settings().policy().violations(parsed)
    except SpecError as e:
        problems = e.problems
    if problems:
        for line in problems:
            err.print(f"[red]✗[/red] {line}", highlight=False)
        raise typer.Exit(2)
    out.print(f"[green]✓[/green] {name}: valid ({len(parsed.zones)} zones, {parsed.nodes} node(s), {parsed.provisioning})")


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
    import yaml

    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError:
        return None
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


if __name__ == "__main__":
    app()
