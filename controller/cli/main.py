"""The ``respawn`` command line. Every option can also be set by environment variable.

Exit codes (docs/cli.md): 0 done; 1 an operation ran and failed (a deploy step,
the demo) or a bug; 2 usage, an invalid spec or configuration, an unknown job, or a
request refused (by respawn or by Google); 3 Google did not answer in time or its
retries ran out: the same command may succeed later.

Everything that came from a user or the cloud (spec problems, job and object names,
status messages, errors) is printed as plain text: never parsed as Rich markup, and
with control characters escaped so that no name can drive the terminal.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from controller.service import bootstrap
from controller.core import errors, ledger, names
from controller.cli import deadline, joblogs
from controller.render.amounts import counted
from controller.render.status_view import Note
from controller.render.text import Hanging, Trimmed, plain, printable
from controller.service.config import Settings
from controller.service.jobs import MAX_LIVE_READS, Jobs, Refused
from controller.cli.joblogs import logs_filter  # noqa: F401 - the query `respawn logs` sends, named for tests
from controller.core.spec import SpecError, load_document, parse_spec
from controller.core.state import JobStatus

OK, FAILED, REFUSED, UNAVAILABLE = 0, 1, 2, 3  # exit codes
NO_CREDENTIALS = ("no Google credentials: run `gcloud auth application-default login`, or, for the local cloud, "
                  "export what `respawn local env` prints")
INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports it
def _line(mark: str, style: str, text: object) -> Text:
    return Text.assemble((mark, style), " ", printable(text))


def _code(error: errors.RespawnError) -> int:
    return UNAVAILABLE if isinstance(error, (errors.TransientError, errors.OperationPending,
                                             errors.CapacityError)) else REFUSED


def _message(error: errors.RespawnError) -> str:
    if isinstance(error, errors.ConfigError):
        return f"configuration: {error}"
    if _code(error) == UNAVAILABLE:
        return f"{error} (transient: try again)"
    return str(error)


class _Guarded(TyperGroup):
    """Every command: a RespawnError is one line on stderr and its exit code, never a traceback."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from controller.cli.helptext import tidy

        tidy(self)  # --help at any width: whole paragraphs, no <bool>, no {spec}

    def main(self, args: Any = None, *rest: Any, **kwargs: Any) -> Any:
        return super().main(_short_help(args), *rest, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        from controller.adapters import failfast

        failfast.enable()  # at a terminal, an endpoint that is not there is said in seconds
        try:
            return super().invoke(ctx)
        except deadline.Expired as e:  # the command's bound (--timeout): one line, never a traceback
            _fail(str(e), UNAVAILABLE)
        except Refused as e:
            _fail(str(e))
        except errors.Unreachable as e:  # already one line that says what to do
            _fail(str(e), UNAVAILABLE)
        except errors.NoSuchBucket as e:
            _fail(_no_bucket(e) or _message(e), _code(e))
        except errors.RespawnError as e:
            _fail(_message(e), _code(e))
        except ValidationError as e:
            if e.title != Settings.__name__:
                raise
            _fail(_message(errors.ConfigError(_settings_problem(e))))
        except Exception as e:
            if type(e).__name__ != "DefaultCredentialsError":  # google.auth's, not imported for every command
                raise
            _fail(_message(errors.ConfigError(NO_CREDENTIALS)))
        finally:
            deadline.stop()
            failfast.enable(False)


def _short_help(args: Any) -> list[str]:
    """``-h`` is ``--help`` for every command. Rewritten here rather than made a help option name:
    that would add a column of short options to every --help without one, and squeeze the
    descriptions of those at 80 columns. Never after ``--`` (``respawn run ... -- cmd -h``: the job's)."""
    import sys

    words = list(sys.argv[1:] if args is None else args)
    end = words.index("--") if "--" in words else len(words)
    return ["--help" if i < end and word == "-h" else word for i, word in enumerate(words)]


app = typer.Typer(cls=_Guarded, no_args_is_help=True,
                  help="Keep Spot training jobs alive on Compute Engine VMs (GPUs) and Cloud TPU slices: "
                       "a preempted job is recreated, in another zone if need be, and resumes from its checkpoint.")
out = Console(file=Trimmed())  # piped or redirected: no line padded with spaces to the width
err = Console(file=Trimmed(stderr=True))


def _version(given: bool) -> None:
    if given:
        out.print(plain(f"respawn {version()}"))
        raise typer.Exit()


def version() -> str:
    """The installed package's version (pyproject.toml's, as packaged); a checkout that was never
    installed reads pyproject.toml itself."""
    import importlib.metadata

    try:
        return importlib.metadata.version("respawn")
    except importlib.metadata.PackageNotFoundError:
        import tomllib

        from controller.service.config import REPO_ROOT

        return str(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"])


@app.callback()
def _bounded(timeout: Annotated[float, typer.Option(
        "--timeout", envvar="RESPAWN_TIMEOUT", min=0, metavar="SECONDS",
        help="seconds a command may wait on the cloud in all, retries included, before it gives up "
             "(exit 3); 0 or inf: no bound")] = deadline.DEFAULT,
        _shown: Annotated[bool, typer.Option("--version", is_eager=True, callback=_version,
                                             help="print respawn's version and exit")] = False) -> None:
    deadline.begin(timeout)


def _no_bucket(error: errors.NoSuchBucket) -> str | None:
    """The control bucket not there: RESPAWN_BUCKET named, where it came from, the fix (None: another
    bucket, a checkpoint's: its own message says which)."""
    from controller.cli import buckets
    from localcloud.session import ENV_FILE

    try:
        config = _config()
    except errors.ConfigError:
        return None
    if error.bucket != config.bucket:
        return None
    return buckets.no_bucket(config.bucket, (config.local_dir or DEFAULT_LOCAL_DIR) / ENV_FILE)


def _settings_problem(error: ValidationError) -> str:
    """One phrase per bad variable, named as the user set it: RESPAWN_MAX_NODES='lots': ..."""
    parts = []
    for problem in error.errors():
        field = str(problem["loc"][0]) if problem["loc"] else ""
        known = Settings.model_fields.get(field)
        variable = f"RESPAWN_{field.upper()}" if known and known.validation_alias is None else field
        parts.append(f"{variable}={problem.get('input')!r}: {problem['msg']}")
    return "; ".join(parts)


def _config(fresh: bool = False) -> Settings:
    """The settings from the environment; a bad variable is a ConfigError naming it."""
    try:
        return Settings() if fresh else bootstrap.settings()
    except ValidationError as e:
        raise errors.ConfigError(_settings_problem(e)) from e


def _read(spec: Path) -> bytes:
    try:
        return spec.read_bytes()
    except OSError as e:
        _fail(f"cannot read {spec}: {e.strerror or e}")


def _not_a_sweep(raw: bytes, path: Path) -> None:
    """A sweep file given to validate or submit: one line naming the command that takes it."""
    from controller.core import sweep

    if sweep.is_sweep_file(raw):
        _fail(f"{path} is a sweep file (its base: and parameters: make trials, each a job), not a job spec: "
              f"respawn sweep submit {shlex.quote(str(path))}")


@app.command()
def validate(
    spec: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="the job's spec file, YAML or JSON")],
    job: Annotated[str | None, typer.Option(envvar="RESPAWN_JOB", help="job name (default: spec's name or file stem)")] = None,
) -> None:
    """Check a spec against the schema and this controller's policy. Exit 2 if invalid."""
    from controller.cli import pack, submitting

    raw = _read(spec)
    _not_a_sweep(raw, spec)
    name = job or _declared_name(raw) or spec.stem
    config = _config(fresh=True)
    packed = None
    try:
        # A local code: is packed as submit packs it (nothing uploaded), and its place in the bucket checked.
        raw, packed, _ = submitting.with_code(raw, spec.resolve().parent, None, config.bucket or "bucket")
        parsed = parse_spec(raw, name)
        # Without the controller's settings there is no policy to check against; Compute's zones always.
        policy = config.policy()
        problems = policy.unknown_zones(parsed) + (policy.violations(parsed) if config.project else [])
    except SpecError as e:
        problems = e.named(spec.name).problems  # the file as the user named it, not spec.yaml
    except pack.PackError as e:
        problems = [f"code: {e}"]
    if problems:
        for line in problems:
            err.print(_line("✗", "red", line), soft_wrap=True)
        raise typer.Exit(REFUSED)
    out.print(_line("✓", "green", f"{name}: valid ({counted(len(parsed.zones), 'zone')}, {counted(parsed.nodes, 'node')}, "
                                  f"{' then '.join(parsed.provisioning)})"), soft_wrap=True)
    if parsed.tpu is not None:  # which API serves it: TPU7x and later only Compute Engine
        out.print(Text(f"  runs on a {parsed.tpu.describe()}"), soft_wrap=True)
    if packed is not None:
        out.print(plain(f"  code: {packed.source} ({counted(packed.files, 'file')}), packed and uploaded by "
                        "`respawn submit`"), soft_wrap=True)
    if parsed.image:  # where it runs, and on what: the boot image is respawn's pick unless the spec names one
        disk = parsed.boot_disk
        boot = disk.image or f"{disk.image_project}/{disk.image_family}"
        out.print(Text(f"  runs in the container image {parsed.image}, on the boot image {boot}"), soft_wrap=True)
    from controller.cli.submitting import warn_no_checkpoint

    warn_no_checkpoint(parsed, name, err)
    if not config.project:
        out.print("[dim]schema only: set RESPAWN_PROJECT (and the policy variables) to check this controller's policy[/dim]")


def _container_images() -> bool:
    """Whether `local up` serves the trainer image (examples/container.yaml's): where this machine can make
    one (busybox for its /bin/sh), said otherwise, and an image: job then fails saying the image is missing."""
    from localcloud import images

    if images.busybox() is None:
        err.print("[yellow]![/yellow] no busybox here (apt-get install busybox-static): the local Artifact Registry "
                  "serves no trainer image, and examples/container.yaml cannot run", soft_wrap=True)
        return False
    if shutil.which("podman") is None:
        err.print("[yellow]![/yellow] no podman here (apt-get install podman runc catatonit): an image: job fails "
                  "saying its VM has no container runtime", soft_wrap=True)
    return True


def _jobs() -> Jobs:
    config = _config()
    store, _ = bootstrap.adapters()
    return Jobs(store, config.bucket, config.policy())


def _fail(message: str, code: int = REFUSED) -> NoReturn:
    """One line on stderr, then exit: what went wrong, as plain text."""
    err.print(_line("✗", "red", message), soft_wrap=True)
    raise typer.Exit(code)


@app.command()
def submit(
    spec: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="the job's spec file, YAML or JSON")],
    job: Annotated[str | None, typer.Option(envvar="RESPAWN_JOB", help="job name (default: spec's name or file stem)")] = None,
    replace: Annotated[bool, typer.Option("--replace", help="overwrite the spec of a job that is still running")] = False,
    uncancel: Annotated[bool, typer.Option("--uncancel", help="withdraw a cancel the controller has not acted on "
                                                              "yet (without it, such a job is refused)")] = False,
    workdir: Annotated[Path | None, typer.Option("--workdir", exists=True, help="code from this local folder "
                                                 "(packed and uploaded; in place of the spec's code:)")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="submit without asking after the estimate")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="check the spec and show the estimate; upload nothing")] = False,
    fresh: Annotated[bool, typer.Option("--fresh", help="a finished job's new run resumes no earlier checkpoint: "
                                                        "its own go under CHECKPOINT_URI/runs/<job>/<run id>/ (none is "
                                                        "deleted)")] = False,
) -> None:
    """Validate a spec, show what it would cost and find (per zone and model: price, obtainability,
    GPU quota left), ask, then upload it to jobs/<name>/spec.yaml.

    A job whose run is over (SUCCEEDED, FAILED, CANCELLED) starts a new run, which resumes from the
    last run's latest checkpoint: the command says which before it asks. --fresh starts from scratch
    instead (checkpoint.fresh), the older checkpoints kept where they are.

    A ``code:`` that is a local folder or file (relative to the spec's folder), or --workdir, is
    packed (honouring .gitignore and .respawnignore) and uploaded to gs://BUCKET/code/<sha256>.tar.gz
    first. The question is asked only on a terminal; --yes skips it."""
    raw = _read(spec)
    _not_a_sweep(raw, spec)
    _submit(raw, job or _declared_name(raw) or spec.stem, spec.resolve().parent, workdir, replace, uncancel, yes, dry_run,
            source=spec.name, fresh=fresh)


def _submit(raw: bytes, name: str, base: Path, workdir: Path | None, replace: bool, uncancel: bool, yes: bool,
            dry_run: bool, show_spec: bool = False, source: str = "spec.yaml", fresh: bool = False,
            from_flags: bool = False) -> None:
    """``source``: what the spec's problems call it (the local file's name; run's spec is made from flags,
    ``from_flags``)."""
    from controller.cli import pack, submitting

    config = _config()
    jobs = _jobs()
    request = submitting.Request(raw, name, base, workdir, replace, uncancel, yes, dry_run, fresh, from_flags)
    try:
        done = submitting.submit(request, jobs, submitting.google_sources(config), config.project, out, err,
                                 ask=lambda q: deadline.paused(typer.confirm, q, default=True), interactive=submitting.interactive(),
                                 show_spec=show_spec, no_bucket=_no_bucket)
    except SpecError as e:
        for line in e.named(source).problems:
            err.print(_line("✗", "red", line), soft_wrap=True)
        raise typer.Exit(REFUSED) from e
    except pack.PackError as e:
        _fail(f"code: {e}")
    except submitting.NotSubmitted as e:
        _fail(str(e), FAILED)
    if done.generation is not None:
        out.print(_line("✓", "green", f"submitted {name} to gs://{jobs.bucket}/jobs/{name}/spec.yaml "
                                      f"(generation {done.generation})"), soft_wrap=True)


@app.command(context_settings={"allow_interspersed_args": False})
def run(
    name: Annotated[str | None, typer.Option("--name", "-n", envvar="RESPAWN_JOB", help="the job's name "
                                                                                       "(required)")] = None,
    zone: Annotated[list[str] | None, typer.Option("--zone", "-z", help="a zone to run in, in order (repeat "
                                                                         "it, or separate with commas; "
                                                                         "required)")] = None,
    machine_type: Annotated[str | None, typer.Option("--machine-type", "-m", help="e.g. g2-standard-8")] = None,
    accelerator: Annotated[str | None, typer.Option("--accelerator", help="GPUs to attach: TYPE[:COUNT], "
                                                                         "e.g. nvidia-tesla-t4:2")] = None,
    tpu: Annotated[str | None, typer.Option("--tpu", help="a TPU slice instead of a VM: a Cloud TPU type (e.g. "
                                                          "v5litepod-8, with --tpu-runtime), or a Compute Engine "
                                                          "TPU machine type (e.g. tpu7x-standard-4t)")] = None,
    tpu_runtime: Annotated[str | None, typer.Option("--tpu-runtime", help="a Cloud TPU type's software version, "
                                                                         "e.g. v2-alpha-tpuv5-lite")] = None,
    tpu_topology: Annotated[str | None, typer.Option("--tpu-topology", help="a TPU machine type's multi-host "
                                                                           "slice, e.g. 2x2x2")] = None,
    provisioning: Annotated[list[str] | None, typer.Option("--provisioning", "-p", help="spot, standard, "
                                                           "flex-start; several: the order to step down in")] = None,
    nodes: Annotated[int, typer.Option("--nodes", min=1, help="VMs of a gang job")] = 1,
    checkpoint: Annotated[str | None, typer.Option("--checkpoint", help="gs:// prefix of its checkpoints, in a "
                                                   "bucket the trainers' account may write (default: "
                                                   "gs://BUCKET-checkpoints/NAME, the bucket respawn deploy "
                                                   "makes)")] = None,
    no_checkpoint: Annotated[bool, typer.Option("--no-checkpoint", help="no checkpoints: each preemption restarts "
                                                                        "the job from step 0")] = False,
    image: Annotated[str | None, typer.Option("--image", help="a container image to run the command in, "
                                                              "pulled by the VM's own account (e.g. from "
                                                              "Artifact Registry)")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE for the command (repeat it)")] = None,
    workdir: Annotated[Path | None, typer.Option("--workdir", exists=True, help="code from this local folder")] = None,
    replace: Annotated[bool, typer.Option("--replace", help="overwrite the spec of a job that is still running")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="submit without asking after the estimate")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the spec and the estimate; upload nothing")] = False,
    fresh: Annotated[bool, typer.Option("--fresh", help="as submit --fresh: resume no earlier checkpoint")] = False,
    command: Annotated[list[str] | None, typer.Argument(help="what the VM runs, after --: one word is a bash line, "
                                                            "several are a list of arguments (with --image: optional, "
                                                            "the image's own entrypoint runs without one)")] = None,
) -> None:
    """A job from flags alone: prints the spec it makes, then submits it as `respawn submit` does
    (the estimate and the question included). Example:
    respawn run -n tune -z us-central1-a -m g2-standard-8 --workdir . -- python train.py

    Its checkpoints go to gs://BUCKET-checkpoints/tune (BUCKET: the control bucket, RESPAWN_BUCKET),
    the bucket respawn deploy makes for them: the trainer saves under $RESPAWN_CHECKPOINT_URI, and a
    preempted job resumes from there. --checkpoint gs://... puts them elsewhere; --no-checkpoint gives
    the job none (run warns: each preemption then restarts it from step 0).

    In a container: respawn run -n tune -z us-central1-a -m g2-standard-8 --image IMAGE -- python train.py"""
    import yaml

    from controller.cli import submitting

    missing = submitting.missing_flags(name=name, zones=zone or [], machine_type=machine_type, tpu=tpu,
                                       command=command or [], image=image)
    unsent = None if workdir is not None else submitting.local_file(command or [], Path.cwd())
    if unsent and not image:  # in an image, the file may be the image's own
        missing.append(f"--workdir: {unsent} is in this folder, but the VM will not have it: send this folder "
                       "with --workdir . (packed and uploaded)")
    if missing:
        for line in missing:
            err.print(_line("✗", "red", line), soft_wrap=True)
        raise typer.Exit(REFUSED)
    assert name is not None  # missing_flags: --name given
    if unsent:
        err.print(Note("!", "yellow", f"{unsent} is in this folder, and the VM has it only if the image {image} "
                                      "does: to send this folder, add --workdir ."))
    if checkpoint is not None and no_checkpoint:
        _fail("--checkpoint and --no-checkpoint: give one or the other")
    if checkpoint is None and not no_checkpoint:
        checkpoint = _default_checkpoint(name)
    try:
        doc = submitting.run_spec(name=name, zones=zone or [], command=command or [], machine_type=machine_type,
                                  accelerator=accelerator, tpu=tpu, tpu_runtime=tpu_runtime,
                                  provisioning=provisioning or [], nodes=nodes, checkpoint=checkpoint, env=env or [],
                                  image=image, tpu_topology=tpu_topology)
    except SpecError as e:
        _fail("; ".join(e.problems))
    raw = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).encode()
    _submit(raw, name, Path.cwd(), workdir, replace, False, yes, dry_run, show_spec=True, fresh=fresh, from_flags=True)


def _default_checkpoint(job: str) -> str | None:
    """``run``'s checkpoint prefix when given none: the job's own in the deploy's checkpoints bucket
    (None without a control bucket: the submit says what to set)."""
    from controller.cli import buckets

    config = _config()
    if not config.bucket:
        return None
    try:
        return buckets.default_checkpoint(config.bucket, job)
    except ValueError as e:
        _fail(f"no default place for {job}'s checkpoints: {e}. Give it one with --checkpoint gs://BUCKET/{job} "
              "(a bucket the trainers' account may write), or run it without: --no-checkpoint")


@app.command()
def cancel(job: Annotated[str, typer.Argument(help="the job to cancel")]) -> None:
    """Ask the controller to cancel a job and delete its VMs (a job whose run is over: nothing is written)."""
    over = _jobs().cancel(job)
    out.print(_line("✓", "green", over or f"cancel requested for {job}"), soft_wrap=True)


@app.command()
def status(
    job: Annotated[str | None, typer.Argument(help="one job (default: every job)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    watch: Annotated[bool, typer.Option("--watch", help="refresh until Ctrl-C")] = False,
    wide: Annotated[bool, typer.Option("--wide", help="every column, however narrow the terminal "
                                                      "(it wraps the lines that do not fit)")] = False,
    interval: Annotated[float, typer.Option(envvar="RESPAWN_WATCH_INTERVAL", help="seconds between refreshes")] = 2.0,
    refreshes: Annotated[int, typer.Option(hidden=True, help="stop --watch after this many refreshes (0: never)")] = 0,
    every_run: Annotated[bool, typer.Option("--all", help="also each job's earlier runs (respawn history JOB): "
                                                          "outcome, goodput, cost")] = False,
    follow: Annotated[bool, typer.Option("--follow", "-f", hidden=True,
                                         help="not status's: said so, with --watch")] = False,
) -> None:
    """A table of jobs, finished ones included (one row a job: its current run): phase, attempt,
    preemptions, failures, zone, instance, checkpoint, age; each job's last event on its own line
    under its row. --all also lists each job's earlier runs under the table (--json: ``runs``).

    The columns that fit the terminal are shown (job and phase always, then the zone, losses,
    checkpoint, age, attempt, instance); --wide shows them all.

    For one JOB, also its goodput so far and the checkpoint interval advised to its attempt
    (``respawn report`` tells the rest); --json has both for every job (``goodput``, ``checkpoint_every_s``).

    A RUNNING job's STEP is the live one, read from its heartbeat (its trainer's report, with the
    current attempt's token): for one JOB always, with its latest save's times; for every job, of
    the first 50 RUNNING jobs only (--json: ``live``, and ``live_unread`` for the rest).

    A job recovering from a preemption notice with zero gap has one more line under its row: its
    next attempt booting beside it (a standby), at the starting line, or started from its save
    (--json: ``overlap``; for one JOB, also what the standby's go waits for: ``standby_waits``).

    A job whose checkpoints cannot be listed keeps its row, with the reason (``checkpoint_error``
    in --json); the command still exits 0. A JOB that does not exist exits 2.
    """
    from controller.render import status_view as view

    from controller.render import history_view

    if follow:  # Click's guess for a mistyped option is the nearest spelling: --all
        _fail("status has no --follow: --watch refreshes it until Ctrl-C (respawn logs JOB --follow follows a "
              "job's output)")
    rows = _status_rows(job, every_run=True) if every_run else _status_rows(job)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not watch:  # soft_wrap: a --wide line wider than the terminal is wrapped by it, never cut
        if job is None and not rows:  # never a bare header: say what there is and how to start
            out.print(plain(f"no jobs in gs://{_config().bucket} yet: submit one with `respawn submit SPEC.yaml` "
                            "(`respawn validate SPEC.yaml` checks it first), or `respawn run --help` for one "
                            "made from flags"))
        else:
            out.print(view.StatusView(rows, wide, whole_events=job is not None), soft_wrap=True)
        if job is not None and rows:  # one job's details, each after a blank line
            out.print()
            out.print(history_view.run_line(rows[0]))
            out.print(view.goodput_line(rows[0]))
            if live := view.live_line(rows[0]):
                out.print(live)
            if rows[0]["standby_waits"]:
                out.print(view.Note("", "", rows[0]["standby_waits"]))
        for row in rows if every_run else ():
            if row["runs"]:
                out.print()
                out.print(history_view.earlier_runs(row))
        if job is not None and rows and rows[0]["zone_advice"]:
            out.print()
            out.print(view.AdviceTable(rows[0]))
        for note in [*view.unread(rows), *view.maintenance(rows)]:
            out.print(note)
        for problem in view.problems(rows):
            err.print(problem)
        if job is None:  # when the controller last ran (respawn/controller.json; yellow past 3 minutes)
            from controller.cli.doctor import last_pass_line

            config = _config()
            out.print(last_pass_line(bootstrap.adapters()[0], config.bucket, datetime.now(UTC)))  # wrapped at the width, as the table
        return
    from rich.live import Live

    deadline.stop()  # it runs until Ctrl-C; each refresh has a bound of its own
    bound = deadline.given
    # Live redraws in place (cursor up, erase line), never clearing the screen; each redraw
    # lays the view out at the terminal's width of that moment.
    count = 0
    with Live(view.watched(rows, wide), console=out, refresh_per_second=4) as live:
        try:
            while not refreshes or count < refreshes:
                time.sleep(interval)
                try:
                    deadline.start(bound)
                    rows = _status_rows(job)
                    live.update(view.watched(rows, wide), refresh=True)
                except (errors.RespawnError, Refused, deadline.Expired) as e:  # keep the last table, say why it is old
                    live.update(view.watched(rows, wide, stale=str(e)), refresh=True)
                finally:
                    deadline.stop()
                count += 1
        except KeyboardInterrupt:
            pass


def _status_rows(job: str | None, every_run: bool = False) -> list[dict[str, object]]:
    from controller.core import names
    from controller.render import handover_view

    config = _config()
    jobs = _jobs()
    _, compute = bootstrap.adapters()
    found = jobs.rows(job)
    if job is not None and not found:
        raise jobs.no_such_job(job)
    # A job whose name is not one never had an instance (nor may it go into a filter).
    listed = [] if job is not None and names.job_name_problem(job) else \
        compute.list_managed(config.policy().watched_projects, job).instances
    ids = {i.name: i.id for i in listed}
    now = datetime.now(UTC)
    # The live step, from each RUNNING job's heartbeat: every job's for one JOB, else a bounded number.
    lives, unread = jobs.lives(found, None if job is not None else MAX_LIVE_READS)
    rows = []
    for row in found:
        try:  # one job's unreadable checkpoint bucket must not hide every job
            checkpoint, problem = jobs.checkpoint(row.job), None
        except errors.RespawnError as e:
            checkpoint, problem = None, str(e) or type(e).__name__
        except Exception as e:  # noqa: BLE001 - a bug or a hostile tree: this row only, never the command
            checkpoint, problem = None, f"unexpected {type(e).__name__}: {e}"
        live = lives.get(row.job)
        rows.append({**row.as_dict(now, ids, checkpoint, problem), **_goodput(row.status, now),
                     **_run(row.status, every_run), "live": live, "live_unread": row.job in unread,
                     "overlap": _overlap(jobs, row.job, row.status, live),
                     "standby_waits": handover_view.waiting(row.job, row.status) if row.status else None})
    return rows


def _overlap(jobs: Jobs, job: str, status: JobStatus | None, live: dict[str, Any] | None) -> str | None:
    """The job's zero-gap recovery in one sentence (controller.render.handover_view), where it has
    one; a job with a standby costs one more small read, its ready record (when it reached its line)."""
    from controller.render import handover_view

    if status is None:
        return None
    step = live.get("step") if isinstance(live, dict) else None
    return handover_view.line(job, status, _at_line(jobs, job, status), step if isinstance(step, int) else None)


def _at_line(jobs: Jobs, job: str, status: JobStatus) -> Any:
    """What the standby's ready record says (``handover_view.AtLine``), or None: no standby yet
    accepted, no record, or not its own."""
    from controller.core import names
    from controller.core.world import MAX_RECORD_BYTES
    from controller.render import handover_view

    if status.standby is None or not status.standby.inserted:
        return None
    try:
        blob = jobs.store.read(jobs.bucket, names.ready_key(job), limit=MAX_RECORD_BYTES)
    except errors.RespawnError:  # none yet, too large, unreadable: the line says "booting"
        return None
    return handover_view.at_line(blob.info, blob.data, status)


def _run(status: JobStatus | None, every_run: bool) -> dict[str, object]:
    """What a status row adds of the job's runs: the current one's id, where its checkpoints go
    when not the spec's prefix (a fresh run's), how many ran before; with --all, those runs."""
    past = status.runs if status else ()
    return {"run": status.run if status else None, "fresh": status.fresh if status else False,
            "run_checkpoints": status.checkpoint_uri if status else None, "earlier_runs": len(past),
            **({"runs": [r.model_dump(mode="json") for r in past]} if every_run else {})}


def _goodput(status: JobStatus | None, now: datetime) -> dict[str, object]:
    """What a status row adds from the job's ledger: its summary (controller.core.ledger.summary) up to
    ``now``, the checkpoint interval advised to the current attempt, and the time between losses
    it rests on (``lifetime``: the estimate, its 80 % interval, what it came from)."""
    return {"goodput": ledger.summary(status.ledger, now).model_dump(mode="json") if status else None,
            "checkpoint_every_s": status.checkpoint_every_s if status else None,
            "lifetime": status.lifetime.model_dump(mode="json") if status and status.lifetime else None}


@app.command()
def report(
    job: Annotated[str | None, typer.Argument(help="the job to report on")] = None,
    sweep: Annotated[str | None, typer.Option("--sweep", help="a sweep instead: its trials summed")] = None,
    png: Annotated[Path | None, typer.Option("--png", dir_okay=False, help="write its timeline to this PNG file")] = None,
    html: Annotated[Path | None, typer.Option("--html", dir_okay=False, help="write a self-contained HTML page: "
                                                                         "the timeline and the summary")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="the ledger and its summary, machine-readable")] = False,
) -> None:
    """A job's goodput: accelerator-hours paid, lost to boots and redone work, and useful; its cost
    against on demand; its losses and recoveries by zone; the advised checkpoint interval.
    --sweep NAME: a sweep's trials summed (by phase; accelerator-hours, goodput, losses, cost, and
    what Spot saved against on demand); each trial is a job of its own here."""
    from controller.render import report as reporting

    if (job is None) == (sweep is None):
        _fail("name a job, or a sweep with --sweep NAME")
    if sweep is not None:
        _sweep_report(sweep, as_json)
        return
    assert job is not None
    status = _job_status(job)
    live = _jobs().live(job, status)  # while it runs: its trainer's step now, from its heartbeat
    now = datetime.now(UTC)
    if as_json:
        print(json.dumps(reporting.as_json(job, status, now, live), indent=2))
    else:
        out.print(reporting.render_text(job, status, now, live))
    picture = reporting.timeline(job, status, now) if png or html else None
    for path, kind in ((png, "png"), (html, "html")):
        if path is not None:
            try:
                reporting.draw(job, status, now, path, kind, live, picture)
            except OSError as e:
                _fail(f"cannot write {path}: {e.strerror or e}")
            (err if as_json else out).print(_line("✓", "green", f"wrote {path}"), soft_wrap=True)
    if picture is not None and picture.note:  # its status holds what cannot be drawn: the files say this line
        err.print(_line("!", "yellow", picture.note), soft_wrap=True)


def _sweep_report(name: str, as_json: bool) -> None:
    from controller.render.amounts import dollars, figures
    from controller.service import sweeps

    jobs = _jobs()
    total = sweeps.summed(sweeps.read_record(jobs, name), jobs.status, datetime.now(UTC))
    if as_json:
        print(json.dumps(total, indent=2))
        return
    cost, on_demand, saved = dollars(total["cost_usd"], total["on_demand_usd"], total["saved_usd"])
    goodput = "unknown yet" if total["goodput"] is None else f"{total['goodput']:.0%}"
    table = Table(title=f"sweep {name}", title_justify="left", show_header=False)
    for what, figure in (("trials", ", ".join(f"{p} {n}" for p, n in sorted(total["phases"].items()))),
                         ("accelerator-hours", "{} paid, {} useful".format(
                             *figures(total["accelerator_hours"], total["useful_hours"]))),
                         ("goodput", goodput), ("losses", str(total["losses"])),
                         ("cost", f"{cost} against {on_demand} on demand: {saved} saved")):
        table.add_row(what, figure)
    out.print(table)


@app.command()
def dashboard(
    port: Annotated[int, typer.Option(envvar="RESPAWN_DASHBOARD_PORT", min=0, max=65535,
                                      help="the port to listen on; 0: a free one (printed)")] = 8642,
    interval: Annotated[float, typer.Option(envvar="RESPAWN_DASHBOARD_INTERVAL", min=1, metavar="SECONDS",
                                            help="seconds between refreshes: the pages poll this often, and "
                                                 "the bucket is read at most this often however many are open")] = 5.0,
    host: Annotated[str, typer.Option(envvar="RESPAWN_DASHBOARD_HOST", help="the address to listen on; other "
                                      "than loopback only with --allow-remote")] = "127.0.0.1",
    allow_remote: Annotated[bool, typer.Option("--allow-remote", help="let --host be an address others can reach "
                                               "(whoever reaches it can cancel and resubmit jobs); it then "
                                               "answers to IP addresses and localhost only, and to the names "
                                               "given with --allowed-host")] = False,
    allowed_host: Annotated[list[str] | None, typer.Option("--allowed-host", metavar="NAME",
                                                           help="a host name the dashboard answers to besides its "
                                                                "address (repeatable), at any port: a reverse "
                                                                "proxy's, passed on in Host; any other name is "
                                                                "refused, so a DNS-rebinding site cannot reach it")] = None,
    key_file: Annotated[Path | None, typer.Option("--key-file", envvar="RESPAWN_DASHBOARD_KEY_FILE",
                                                    dir_okay=False, metavar="PATH",
                                                    help="keep its key in this file (made, readable by you "
                                                         "alone, when missing): the same address at every "
                                                         "start, and the file a Prometheus scrape job's "
                                                         "credentials_file names")] = None,
    no_open: Annotated[bool, typer.Option("--no-open", help="do not open a browser")] = False,
) -> None:
    """The fleet and each job in a browser, live: a local web server over the bucket, with cancel
    and resubmit behind a confirmation, and /metrics for Prometheus.

    It reads what `respawn status` reads, with the same credentials, at most once per --interval
    however many pages are open. It prints one line, the address it serves at, then serves until
    Ctrl-C. The address carries a secret key (?token=...), as a notebook server's does: any other
    account on this machine can reach the port, and every page, JSON, asset and /metrics answers
    403 without the key (a cookie carries it after the first visit; a scraper sends
    Authorization: Bearer KEY). It listens on 127.0.0.1 only, unless --host names another address
    and --allow-remote is given. Remote, it answers to a Host that is an IP address, localhost, or
    a name given with --allowed-host (repeatable), never to another name."""
    from controller.dashboard import guard, serving

    deadline.stop()  # it serves until stopped; each read has the adapters' own bounds
    try:
        warning = guard.bind_warning(host, allow_remote)
        key = serving.key_file(key_file) if key_file is not None else None
    except (guard.BindRefused, serving.KeyRefused) as e:
        _fail(str(e))
    jobs = _jobs()
    try:
        server, url = serving.bind(jobs, host, port, interval, allow_remote, recent=_recent_logs(jobs),
                                    allowed_hosts=tuple(allowed_host or ()), key=key)
    except OSError as e:
        _fail(f"cannot listen on {host}:{port}: {e.strerror or e}")
    if warning:
        err.print(_line("!", "yellow", warning), soft_wrap=True)
    raise typer.Exit(serving.serve(server, url, open_browser=not no_open))


def _recent_logs(jobs: Jobs) -> joblogs.Recent:
    """The job page's last log lines: read as `respawn logs` reads them, with the same settings."""
    from controller.adapters.gcs import translated
    from controller.adapters.google import logging_client

    config = _config()

    def client() -> Any:
        with translated("Cloud Logging"):
            return logging_client(config)
    return joblogs.Recent(jobs.status, client, config.project, guard=lambda: translated("Cloud Logging"),
                          account=config.trainer_service_account)


@app.command()
def history(
    job: Annotated[str, typer.Argument(help="the job whose runs to show")],
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """A job's runs, one line each, oldest first, the current one last: its id (when it began, UTC),
    how it ended and when, how long it ran, its attempts, goodput, cost and the same hours on
    demand, and its latest checkpoint. A JOB that does not exist exits 2."""
    from controller.render.history_view import HistoryView
    from controller.service import jobruns

    runs = jobruns.history(_jobs(), job, datetime.now(UTC))
    if as_json:
        print(json.dumps([r.model_dump(mode="json") for r in runs], indent=2))
        return
    out.print(HistoryView(runs), soft_wrap=True)


@app.command("rm")
def remove(job: Annotated[str, typer.Argument(help="the finished job to forget")]) -> None:
    """Forget a finished or cancelled job: delete its spec, status and records under jobs/JOB/ (and
    its preemption marker). Its checkpoints are never deleted. A job still running is refused: cancel
    it first. Removing a job that is already gone does nothing and exits 0."""
    from controller.service import jobruns

    jobs = _jobs()
    done = jobruns.remove(jobs, job)
    if not done.removed:
        out.print(_line("✓", "green", f"nothing to remove: {jobs.no_such_job(job)}"), soft_wrap=True)
        return
    from controller.render.amounts import counted

    out.print(_line("✓", "green", f"removed {job}: {counted(len(done.removed), 'object')} from gs://{jobs.bucket}"),
              soft_wrap=True)
    from controller.core.runs import RUNS_DIR

    for prefix in done.checkpoints:
        if (missing := jobruns.held(jobs, prefix)) is not None:  # "kept" only where there is something
            out.print(plain(f"  no checkpoints under {prefix}: {missing}"), soft_wrap=True)
            continue
        # A new job resumes from its spec's checkpoint.uri itself, never from a fresh run's own prefix.
        fate = "kept, never resumed by a new job" if f"/{RUNS_DIR}/" in prefix else \
            f"a new job named {job} with this checkpoint.uri resumes from them unless submitted with --fresh"
        out.print(plain(f"  checkpoints kept under {prefix} ({fate})"), soft_wrap=True)


def _job_status(job: str) -> JobStatus:
    """One job's status, read as ``status`` reads it; a job without one is refused (exit 2)."""
    jobs = _jobs()
    status = jobs.status(job)
    if status is None:
        if not jobs.rows(job):
            raise jobs.no_such_job(job)
        raise Refused(f"job {job!r} has no readable status yet: the controller has not taken it up")
    return status


@app.command()
def logs(
    job: Annotated[str, typer.Argument(help="the job whose VMs' logs to show")],
    limit: Annotated[int, typer.Option("--limit", "--tail", envvar="RESPAWN_LOG_LIMIT",
                                       help="at most this many entries of each attempt, its last")] = 200,
    serial: Annotated[bool, typer.Option("--serial", help="read the serial console through the Compute API "
                                                          "instead of Cloud Logging (live instances only)")] = False,
    raw: Annotated[bool, typer.Option("--raw", help="print control characters (colours, cursor moves) as they are; "
                                                    "by default they are escaped")] = False,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="then print new entries as they come, "
                                                                "until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(envvar="RESPAWN_LOG_INTERVAL", min=0.05,
                                            help="--follow: seconds between reads (Cloud Logging allows a "
                                                 "project 60 reads a minute)")] = 5.0,
    stop_after: Annotated[float | None, typer.Option(hidden=True, help="--follow: stop after this many "
                                                                       "seconds (for tests)")] = None,
) -> None:
    """The output of every attempt of the job, from Cloud Logging by instance id, in order, each under a
    header naming the attempt, its instances, zone and how it ended; an attempt booted beside the one
    before at its preemption notice (a standby) says so under its header: when, its go, its step."""
    config = _config()
    jobs = _jobs()
    status = jobs.status(job)
    if status is None and not jobs.rows(job):
        raise jobs.no_such_job(job)
    _, compute = bootstrap.adapters()
    live = compute.list_managed(config.policy().watched_projects, job).instances
    runs = joblogs.attempts(job, status, live)
    if not any(a.instances for a in runs):
        _fail(f"no instance of {job!r} has been seen yet")

    def show(text: str) -> str:
        return text if raw else printable(text.replace("\r\n", "\n"), keep="\n\t")

    # A status is anyone's who may write the bucket: its project is used only where a pass would look.
    recorded = joblogs.console_project(job, status.project if status else None, config.policy().watched_projects,
                                       _spec_project(jobs, job))
    if serial:
        where = {i.name: (i.project, i.zone) for i in live}
        fallback = ((recorded or config.project), status.zone) if status else (config.project, None)
        for name in (n for a in runs for n in a.instances):
            out.print(plain(f"== {name}", "bold"), soft_wrap=True)
            print(show(_serial_output(config, *where.get(name, fallback), name)))
        return
    from google.auth import exceptions as auth_errors

    from controller.adapters.gcs import translated
    from controller.adapters.google import logging_client

    now = datetime.now(UTC)
    since = joblogs.run_start(status, now)
    projects = [*(i.project for i in live), recorded or config.project, config.project]

    def read() -> list[joblogs.Attempt]:
        return joblogs.attempts(job, jobs.status(job))  # a new attempt's ids, as its status records them

    try:
        # Only the calls to Cloud Logging are translated: a closed pipe on our side is not Google's.
        with translated("Cloud Logging"):
            client = logging_client(config)
        # respawn's own pacing of reads (50 a minute) is no wait on Google: the bound stops for it
        pace = joblogs.Pace(sleep=lambda seconds: deadline.paused(time.sleep, seconds))
        reader = joblogs.JobLogs(client, job, projects, lambda line: print(line, flush=True), show, limit,
                                 guard=lambda: translated("Cloud Logging"), account=config.trainer_service_account,
                                 pace=pace)
        reader.print_all(runs, since)
        if follow:
            deadline.stop()  # it runs until Ctrl-C
            try:
                reader.follow(read, since, interval, stop_after)
            except KeyboardInterrupt:
                return
    except auth_errors.TransportError as e:  # the token could not be fetched: the network, not the setup
        raise errors.TransientError(f"Cloud Logging: {e}") from e
    except auth_errors.GoogleAuthError as e:
        raise errors.ConfigError(f"no usable Google credentials for Cloud Logging: {e}") from e


def _spec_project(jobs: Jobs, job: str) -> str | None:
    """The project the job's spec names (its controller's default when it names none); None without
    a readable spec."""
    from controller.core import names
    from controller.core.spec import MAX_SPEC_BYTES

    try:
        spec = parse_spec(jobs.store.read(jobs.bucket, names.spec_key(job), limit=MAX_SPEC_BYTES).data, job)
    except (errors.NotFound, errors.TooLarge, SpecError):
        return None
    return jobs.policy.project_of(spec)


def _serial_output(config: Settings, project: str, zone: str | None, name: str) -> str:
    from google.api_core import exceptions

    from controller.adapters.gcs import translated
    from controller.adapters.google import instances_client

    try:
        with translated(f"serial console of {name}"):
            try:
                return instances_client(config).get_serial_port_output(project=project, zone=zone,
                                                                       instance=name).contents
            except exceptions.NotFound:
                return "(instance deleted: its serial console went with it; use Cloud Logging)"
    except errors.TransientError:
        raise
    except errors.RespawnError as e:  # one instance's console, not the others'
        return f"(serial console not readable: {e})"


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
             "(default: respawn-trainer, in the project)")] = None,
    schedule: Annotated[str, typer.Option(envvar="RESPAWN_SCHEDULE", help="cron schedule of tick")] = "* * * * *",
    memory: Annotated[str, typer.Option(envvar="RESPAWN_FUNCTION_MEMORY",
                                        help="each function's memory: 512Mi holds a few thousand jobs, "
                                             "1Gi 10,000 (make bench)")] = "512Mi",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print every command and API request, run nothing")] = False,
    start: Annotated[str | None, typer.Option("--from", help="resume at this step (its number or name)")] = None,
    shards: Annotated[str, typer.Option(envvar="RESPAWN_DEPLOY_SHARDS",
                                        help="K > 1 (a power of two): the tick publishes each of K shards its part of "
                                             "the listing on Pub/Sub and on_shard reconciles it; 'auto': one shard per "
                                             "10,000 specs in the bucket")] = "1",
) -> None:
    """Set up everything respawn relies on: APIs, the control bucket, the checkpoints bucket beside it
    (BUCKET-checkpoints: respawn run's default place for checkpoints), the service accounts and their roles,
    the audit sink and its topic, the three functions, the Cloud Scheduler job and the VM scripts. Safe to
    run again."""
    import shlex

    from controller.cli import deploy as deployment

    deadline.stop()  # each step (a gcloud command, an API request) is bounded by its own timeout
    _not_from_a_local_shell(project)
    _check_target(project, region, bucket)
    if note := deployment.checkpoints_note(bucket):  # respawn run's default place for checkpoints
        err.print(_line("!", "yellow", note), soft_wrap=True)
    config = _config(fresh=True)
    policy_env = deployment.policy_env(config)  # an empty list set on purpose is passed on empty
    target = deployment.Target(
        project=project, region=region, bucket=bucket,
        controller_sa=service_account or deployment.account_email("respawn-controller", project),
        scheduler_sa=scheduler_account or deployment.account_email("respawn-scheduler", project),
        trainer_sa=trainer_account or deployment.account_email(deployment.TRAINER_ACCOUNT_ID, project),
        schedule=schedule, env=policy_env, memory=memory, shards=_shards(shards, project, bucket))
    try:
        steps = deployment.plan(target)
        first = deployment.start_at(steps, start) if start else 1
    except ValueError as error:
        _fail(str(error))
    if dry_run:
        for number, step in enumerate(steps, 1):
            if number >= first:
                out.print(plain(f"# {number}. {step.name}: {step.title}", "bold"), soft_wrap=True)
                print(step.render())
        out.print()  # plain() escapes a newline in its text as `\n`
        out.print(plain(f"the plan: {deployment.summary(steps, first)}", "bold"), soft_wrap=True)
        if (account := deployment.gcloud_account()) is None:
            err.print(_line("!", "yellow", "gcloud is not logged in (or not installed): every step runs as gcloud's "
                                           "account; run `gcloud auth login` before the real deploy"), soft_wrap=True)
        else:
            out.print(plain(f"every step runs as gcloud's account: {account}", "dim"), soft_wrap=True)
        return
    try:
        deployment.execute(steps, target, start=first,
                           say=lambda said: out.print(plain(said, "dim") if said.startswith(" ") else
                                                      _line("→", "bold", said), soft_wrap=True))
    except deployment.StepFailed as failed:
        given = ["--project", project, "--region", region, "--bucket", bucket]
        for flag, value in (("--service-account", service_account), ("--scheduler-account", scheduler_account),
                            ("--trainer-account", trainer_account), ("--schedule", schedule)):
            if value and not (flag == "--schedule" and value == "* * * * *"):
                given += [flag, value]
        # gcloud's message and an API error's run over several lines: printed as lines, never as `\n`
        err.print(Text.assemble(("✗", "red"), " ", printable(f"step {failed.number} ({failed.step.name}) failed: "
                                                             f"{failed.reason}", keep="\n")), soft_wrap=True)
        if failed.output:
            err.print(Text(printable(failed.output, keep="\n")), soft_wrap=True)
        err.print(plain(f"Fix that, then resume from it: {shlex.join(['respawn', 'deploy', *given, '--from', failed.step.name])}"
                        " (with the same RESPAWN_* policy variables set), or run the whole deploy again: "
                        "every step is safe to repeat."), soft_wrap=True)
        raise typer.Exit(REFUSED if failed.refused else FAILED) from None
    out.print(_line("✓", "green", "deployed"))


def _shards(given: str, project: str, bucket: str) -> int:
    """``--shards``: a power of two, or ``auto`` (the specs in the bucket counted: one listing of jobs/;
    a bucket not there yet has none)."""
    from controller.cli import deploy as deployment

    if given.strip().lower() == "auto":
        try:
            from controller.adapters.google import gcs_store  # the deploy's own project and bucket

            store = gcs_store(Settings(project=project, bucket=bucket))
            specs = sum(1 for info in store.list(bucket, names.JOBS_PREFIX)
                        if (ref := names.parse_object_name(info.name)) and ref.kind == "spec")
        except errors.NotFound:
            specs = 0
        except errors.RespawnError as e:
            _fail(f"--shards auto: could not count the specs in gs://{bucket}: {e}")
        k = deployment.shards_for(specs)
        out.print(plain(f"--shards auto: {specs} specs, {k} shard{'s' if k > 1 else ''}", "dim"))
        return k
    try:
        k = int(given)
    except ValueError:
        _fail(f"--shards: a power of two or 'auto', not {given!r}")
    if problem := names.shards_problem(k):
        _fail(f"--shards: {problem}")
    return k


def _not_from_a_local_shell(project: str) -> None:
    """Refuse (exit 2) a deploy to a project of Google's from a shell that sourced the local cloud's
    local.env (controller.cli.localshell), dry run or not, before anything is planned or run."""
    import os

    from controller.cli import localshell

    if (refused := localshell.refusal(os.environ, project)) is not None:
        _fail(refused)


def _check_target(project: str, region: str, bucket: str) -> None:
    """Refuse (exit 2) a project id, region or bucket name that cannot be one, each with its fix,
    before any step is printed or run; a region respawn does not know is only warned of."""
    from controller.cli import targets

    wrong = targets.problems(project, region, bucket)
    for problem in wrong:
        err.print(_line("✗", "red", problem), soft_wrap=True)
    if wrong:
        raise typer.Exit(REFUSED)
    if note := targets.region_note(region):
        err.print(_line("!", "yellow", note), soft_wrap=True)


@app.command()
def doctor(
    spec: Annotated[Path | None, typer.Argument(exists=True, dir_okay=False,
                                                help="also check this spec: its GPU quota in each of its zones' "
                                                     "regions, its image, its service account, its checkpoint "
                                                     "bucket and its code tarball")] = None,
    region: Annotated[str, typer.Option(envvar="RESPAWN_REGION", help="region of the functions and the scheduler")] = "",
    service_account: Annotated[str | None, typer.Option(envvar="RESPAWN_SERVICE_ACCOUNT",
                                                        help="the controller's service account")] = None,
    timeout: Annotated[float, typer.Option(envvar="RESPAWN_DOCTOR_TIMEOUT", min=1,
                                           help="seconds each check may take")] = 20.0,
) -> None:
    """Can respawn work on this project? One line per check, ✓ or ✗ with the command that fixes it.
    Exit 0 only when every check passes (1 otherwise)."""
    from controller.adapters.doctor import GoogleApis
    from controller.cli import doctor as doctors
    from controller.cli.deploy import account_email

    deadline.stop()  # every check has its own bound (--timeout of doctor)
    config = _config(fresh=True)
    if not config.project or not config.bucket or not region:
        _fail("set RESPAWN_PROJECT, RESPAWN_BUCKET and RESPAWN_REGION (or --region): the deployment to check")
    if (down := _local_cloud_down(config)) is not None:
        # Every check would fail on its own bound, each suggesting a Google login: one line instead.
        _fail(f"the local cloud does not answer at {down}: is `respawn local up` still running? Start it again "
              "(and source the local.env it names), or unset the RESPAWN_*_ENDPOINT and STORAGE_EMULATOR_HOST "
              "variables to check a project on Google", UNAVAILABLE)
    checked, packed = None, False
    if spec is not None:
        from controller.cli import pack, submitting

        raw = _read(spec)
        try:  # a local code: as respawn submit would write it (packed from beside the spec, not uploaded)
            raw, code, _ = submitting.with_code(raw, spec.parent, None, config.bucket)
            packed = code is not None
        except (SpecError, pack.PackError):
            pass  # the spec's own check says what is wrong with it
        checked = (raw, _declared_name(raw) or spec.stem)
    target, results = doctors.diagnose(GoogleApis(config, timeout), config, region,
                                       service_account or account_email("respawn-controller", config.project),
                                       timeout, checked, packed)
    out.print(plain(f"respawn doctor: project {target.project}, bucket gs://{target.bucket}, region {target.region}",
                    "bold"))
    for line in doctors.render(results):
        out.print(line)
    failed = [r.name for r in results if not r.ok]
    if failed:
        err.print(Hanging(Text("✗ ", style="red"), plain(f"{len(failed)} of {counted(len(results), 'check')} failed: "
                                                         f"{', '.join(failed)}")))
        raise typer.Exit(FAILED)
    out.print(_line("✓", "green", f"all {len(results)} checks passed"), soft_wrap=True)


@app.command()
def canary(
    zone: Annotated[list[str], typer.Option("--zone", "-z", envvar="RESPAWN_CANARY_ZONES",
                                            help="a zone for the canary's VMs, in order (repeat it, or separate "
                                                 "with commas): each VM's standby goes to the next one")],
    vms: Annotated[int, typer.Option("--vms", min=1, max=10, help="VMs to preempt, each a job of its own "
                                                                  "(its standby is a second VM)")] = 3,
    machine_type: Annotated[str, typer.Option("--machine-type", "-m", help="the VMs' machine type: a cheap "
                                                                             "one")] = "e2-small",
    output: Annotated[Path | None, typer.Option("--output", "-o", dir_okay=False,
                                                help="the figures' file (default: respawn-canary-<UTC time>.json "
                                                     "here)")] = None,
    wait: Annotated[float, typer.Option("--wait", envvar="RESPAWN_CANARY_WAIT", min=10, metavar="SECONDS",
                                        help="seconds each stage may take: the VMs' boot; then their "
                                             "notice, standby and power-off (plus the 120 s notice)")] = 600.0,
) -> None:
    """Measure on your own project what Google documents no figure for, through the deployed
    controller: a few cheap Spot VMs (canary jobs: e2-small, `sleep`, the 120 s notice) are preempted
    with Compute's simulateMaintenanceEvent, and each is timed from the notice to instance/preempted,
    its notice record and its upload, the standby's insert; STOPPING to TERMINATED; insert to RUNNING
    to its agent's start; and the System Event entry to on_audit (the Logging sink, Pub/Sub, the
    function's pass). Prints a table, and writes the figures to a file the local cloud's realism
    model reads (`respawn local up --realism FILE`).

    It cleans up after itself whatever happens (an error, Ctrl-C): it cancels and removes its jobs
    and deletes any VM of theirs left. Exit 0 when every VM was preempted and timed and nothing was
    left behind; 1 otherwise, saying what is left; 130 on Ctrl-C."""
    from controller.adapters.google import logging_client
    from controller.cli import canary as canaries
    from controller.cli import canaryfigures as figures

    deadline.stop()  # minutes of VMs booting and being preempted: each stage bounds itself (--wait)
    config = _config()
    zones = tuple(z.strip() for value in zone for z in value.split(",") if z.strip())
    plan = canaries.Plan(config.project, zones, machine_type, vms, wait)
    store, compute = bootstrap.adapters()
    jobs = Jobs(store, config.bucket, config.policy())
    for job in plan.jobs:  # the controller's policy (zones, machine types) before anything is made
        try:
            jobs.check(plan.spec(job), job)
        except SpecError as e:
            _fail("the canary's job is refused: " + "; ".join(e.problems))
    began, start = datetime.now(UTC), time.monotonic()
    path = output or Path(f"respawn-canary-{began:%Y%m%d-%H%M%S}.json")

    def say(line: str) -> None:
        out.print(plain(f"{time.monotonic() - start:5.0f} s  {line}"))  # wrapped at the terminal's width

    run = canaries.Canary(plan, jobs, compute, lambda: logging_client(config), say)
    seen: list[figures.Preemption] = []
    failure: errors.RespawnError | None = None
    interrupted = False
    with _interruptible():
        try:
            seen = run.run()
        except KeyboardInterrupt:
            interrupted = True
        except errors.RespawnError as e:
            failure = e
        finally:
            left = run.clean()  # a bug's exception too: its VMs never outlive the command
    if seen:
        path.write_text(json.dumps(figures.document(seen, project=plan.project, zones=zones,
                                                    machine_type=machine_type, taken_at=began), indent=2) + "\n")
        _canary_table(seen)
        out.print(plain(f"figures: {path} (respawn local up --realism {path}: the local cloud with them)"))
    for line in left:
        err.print(_line("✗", "red", f"left behind: {line}"), soft_wrap=True)
    if interrupted:
        err.print("interrupted: " + ("nothing left behind" if not left else "see above"), soft_wrap=True,
                  highlight=False)
        raise typer.Exit(INTERRUPTED)
    if failure is not None:
        _fail(f"canary: {_message(failure)}", FAILED if isinstance(failure, canaries.CanaryError) else _code(failure))
    if untimed := [p.first.name for p in seen if not p.timed]:
        err.print(_line("✗", "red", f"not timed to the end: {', '.join(untimed)} (see the notes above)"),
                  soft_wrap=True)
    if left or untimed:
        raise typer.Exit(FAILED)
    out.print(_line("✓", "green", f"{counted(len(seen), 'VM')} preempted and timed; nothing left behind"))


def _canary_table(seen: list[Any]) -> None:
    """The figures at 80 columns, then what could not be seen, per job."""
    from controller.cli import canaryfigures as figures

    table = Table("figure", "n", "median", "p99", "max", title=f"respawn canary: {counted(len(seen), 'preemption')}")
    for row in figures.table_rows(seen):
        table.add_row(*row)
    out.print(table, width=80)
    out.print(plain("p99: of a lognormal fitted to the samples (few: an extrapolation). Times from Compute, "
                    "GCS, Cloud Logging and the VMs' agents; TERMINATED is seen only until the controller "
                    "deletes the VM (polled every 0.25 s)"), width=80)
    for p in seen:
        for note in p.notes:
            out.print(plain(f"{p.job}: {note}"), width=80)


@app.command()
def reconcile(
    job: Annotated[str | None, typer.Argument(help="one job (default: every job)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the planned actions, change nothing")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Run one reconcile pass from the terminal."""
    _config()  # a bad setting is said as one line before the engine is built
    jobs = _jobs()
    jobs.bucket_there()  # a mistyped RESPAWN_BUCKET said as such, not as the lease object not found
    if job is not None and not jobs.rows(job):  # as status: an unknown JOB is an error, not an empty row
        raise jobs.no_such_job(job)
    summary = bootstrap.engine().reconcile(job, dry_run=dry_run)
    if as_json:
        print(json.dumps(summary.as_dict(), indent=2))
        return
    if summary.skipped:  # a pass over every job is under way: this one did nothing
        out.print(plain(summary.skipped))
        return
    table = Table("job", "planned" if dry_run else "done", "error")
    for name, done in summary.jobs.items():
        table.add_row(plain(name), Text("\n").join(plain(d) for d in done) if done else plain("—"),
                      plain(summary.errors.get(name, ""), "red"))
    out.print(table)
    if summary.stopped:
        out.print(plain(f"this pass stopped acting: {summary.stopped}; {len(summary.not_acted)} jobs not acted on",
                        "yellow"))


DEFAULT_LOCAL_DIR = Path.home() / ".respawn" / "local"
LocalDir = Annotated[Path, typer.Option("--dir", envvar="RESPAWN_LOCAL_DIR",
                                        help="where the local cloud's exports (local.env) and function logs go")]

sweep_app = typer.Typer(help="Sweeps: many trials of one job spec, at most max_parallel holding VMs at once "
                                 "(respawn sweep submit FILE).", no_args_is_help=True)
app.add_typer(sweep_app, name="sweep")


@sweep_app.command("submit")
def sweep_submit(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="the sweep file, YAML or JSON")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="submit without asking")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="check the sweep and list its trials; upload nothing")] = False,
) -> None:
    """Expand a sweep file into its trials (a grid: every combination; random: COUNT draws, the same
    for the same SEED), check each trial's spec as submit does, list them, ask, then write the
    sweep's record (sweeps/NAME/sweep.json) and each trial's spec (jobs/NAME-N/spec.yaml). The
    controller starts at most max_parallel trials at once and the others as those finish.

    The base spec is the file's ``base:``, inline or a path relative to the sweep file. Each trial
    runs it with its parameters in its environment (RESPAWN_PARAM_<NAME>, and each name as given)
    and its checkpoints under CHECKPOINT_URI/NAME-N. Submitting the same file again changes nothing."""
    from controller.cli import submitting
    from controller.core import sweep
    from controller.service import sweeps

    from controller.cli import pack

    raw = _read(file)
    try:
        sw = sweep.parse_sweep(raw, file.name)
        base, folder = _sweep_base(sw, file)
        jobs = _jobs()
        _sweep_bucket(jobs, dry_run)
        base_raw, packed, note = submitting.with_code(_yaml_dump(base), folder, None, jobs.bucket)
        base = load_document(base_raw)
        prepared = sweeps.specs(sw, base, jobs)
    except SpecError as e:
        for line in e.problems:
            err.print(_line("✗", "red", line), soft_wrap=True)
        raise typer.Exit(REFUSED) from e
    except pack.PackError as e:
        _fail(f"base: code: {e}")
    if note:
        err.print(Text(f"! {note}", style="yellow"), soft_wrap=True)
    if prepared:  # every trial's checkpoints go under the base's prefix: said once, for the sweep
        submitting.warn_control_bucket(parse_spec(prepared[0][1], prepared[0][0].job), sw.name, jobs.bucket, err)
    # Every name and value is the file's text, never Rich markup.
    table = Table(title=Text(f"sweep {sw.name}: {counted(len(prepared), 'trial')}, at most {sw.max_parallel} at once"
                             + (f", best by {sw.metric.key} ({sw.metric.goal})" if sw.metric else "")),
                  title_justify="left")
    table.add_column("trial")
    for key in sw.parameters:
        table.add_column(Text(key), overflow="fold")
    for trial, _ in prepared:
        table.add_row(trial.job, *(Text(sweep.env_value(trial.params[k])) for k in sw.parameters))
    out.print(table)
    if dry_run:
        out.print(Text("dry run: nothing uploaded", style="dim"))
        return
    if submitting.interactive() and not yes and not deadline.paused(
            typer.confirm, f"Submit {counted(len(prepared), 'trial')} of {sw.name}?", default=True):
        _fail(f"sweep {sw.name} not submitted", FAILED)
    if packed is not None:
        deadline.widened(len(packed.data) / deadline.UPLOAD_BYTES_S, pack.upload, jobs.store, jobs.bucket, packed)
    done = sweeps.submit(jobs, sw, base, prepared)
    again = f"; {counted(len(done.unchanged), 'trial')} already there unchanged" if done.unchanged else ""
    out.print(_line("✓", "green", f"submitted sweep {sw.name}: {counted(len(done.written), 'trial')} written to "
                                  f"gs://{jobs.bucket}/jobs/{again}; respawn sweep status {sw.name} follows it"),
              soft_wrap=True)


def _sweep_bucket(jobs: Jobs, dry_run: bool) -> None:
    """A control bucket that is not there (a mistyped RESPAWN_BUCKET) said as such before the sweep is
    expanded, as submit says it: a dry run goes on (perhaps before the deploy), a submit is refused."""
    try:
        jobs.bucket_there()
    except errors.NoSuchBucket as e:
        if not dry_run:
            raise
        err.print(Text(f"! a submit would be refused: {_no_bucket(e) or e}", style="yellow"), soft_wrap=True)


def _sweep_base(sw: Any, file: Path) -> tuple[dict[str, Any], Path]:
    """The base spec as a mapping, and the folder its ``code:`` is read from: the sweep file's for an
    inline base, the base file's for one it names (a path relative to the sweep file's folder)."""
    if isinstance(sw.base, dict):
        return dict(sw.base), file.resolve().parent
    try:
        path = Path(sw.base).expanduser()
        path = path if path.is_absolute() else file.resolve().parent / path
        data = load_document(path.read_bytes())
    except (OSError, RuntimeError) as e:
        raise SpecError([f"{file.name}: base: cannot read {sw.base} ({getattr(e, 'strerror', None) or e}); give the "
                         f"job spec's path, relative to {file.name}'s folder, or the spec itself inline"]) from e
    if not isinstance(data, dict):
        raise SpecError([f"{file.name}: base: {sw.base} holds no mapping of spec fields"])
    return data, path.parent


def _yaml_dump(doc: dict[str, Any]) -> bytes:
    import yaml

    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).encode()


@sweep_app.command("status")
def sweep_status(
    name: Annotated[str, typer.Argument(help="the sweep")],
    as_json: Annotated[bool, typer.Option("--json", help="a list of trials: trial, params, phase, metric, result")] = False,
) -> None:
    """Every trial of a sweep with its parameters, phase, losses, cost and metric, best first by the
    sweep's metric (the trials without a result last, in their order)."""
    from controller.render.amounts import dollars
    from controller.service import sweeps

    jobs = _jobs()
    record = sweeps.read_record(jobs, name)
    rows = sweeps.rows(record, jobs.status, datetime.now(UTC))
    if as_json:
        print(json.dumps(rows, indent=1, default=str))
        return
    metric = record.metric.key if record.metric else None
    table = Table(title=Text(f"sweep {name}: {counted(len(rows), 'trial')}, at most {record.max_parallel} at once"),
                  title_justify="left")
    for column in ("trial", "params", "phase", "losses", "cost", *([metric] if metric else [])):
        table.add_column(Text(column), overflow="fold")
    for row in rows:
        params = " ".join(f"{k}={v}" for k, v in row["params"].items())
        shown = ("no result" if row["result"] is None else "not a number") if row["metric"] is None else f"{row['metric']:g}"
        table.add_row(row["trial"], Text(params), row["phase"], str(row["losses"]), dollars(row["cost_usd"])[0],
                      *([shown] if metric else []))
    out.print(table)
    summed = sweeps.totals(rows)
    if summed["on_demand_usd"]:
        spent, on_demand, saved = dollars(summed["cost_usd"], summed["on_demand_usd"], summed["saved_usd"])
        out.print(plain(f"spent {spent}; on demand it would have been {on_demand} ({saved} saved)"), soft_wrap=True)


@sweep_app.command("cancel")
def sweep_cancel(name: Annotated[str, typer.Argument(help="the sweep")]) -> None:
    """Cancel every trial of a sweep that is not over (queued ones never start)."""
    from controller.service import sweeps

    jobs = _jobs()
    for trial in sweeps.read_record(jobs, name).trials:
        try:
            said = jobs.cancel(trial.job)
        except Refused:
            continue  # never submitted
        out.print(_line("✓", "green", said or f"cancel requested for {trial.job}"), soft_wrap=True)


@sweep_app.command("rm")
def sweep_remove(name: Annotated[str, typer.Argument(help="the sweep, every trial of it over")]) -> None:
    """Forget a sweep whose trials are all over: each trial as respawn rm does, then the sweep's
    record and slots. Refused while a trial is not over (respawn sweep cancel NAME first)."""
    from controller.service import jobruns, sweeps

    jobs = _jobs()
    record = sweeps.read_record(jobs, name)
    refused = []
    for trial in record.trials:  # every trial checked before any is removed
        try:
            jobruns.removable(jobs, trial.job)
        except Refused as e:
            refused.append(str(e))
    if refused:
        _fail(f"sweep {name}: {len(refused)} of its trials are not over ({refused[0]}); respawn sweep cancel "
              f"{name} first")
    for trial in record.trials:
        jobruns.remove(jobs, trial.job)
    # The record goes; the slots stay with the controller, which gives each back once its trial's
    # VMs are gone (a trial is over before its last VM is: deleting them here would admit a new
    # sweep of the same name beside them).
    with contextlib.suppress(errors.NotFound):
        jobs.store.delete(jobs.bucket, names.sweep_key(name))
    out.print(_line("✓", "green", f"removed sweep {name} and its {counted(len(record.trials), 'trial')} "
                                  "(their checkpoints are kept)"), soft_wrap=True)


local = typer.Typer(help="The local cloud: GCS, Compute Engine, the functions, Scheduler and Eventarc; "
                         "and faults injected into it from another terminal.", no_args_is_help=True)
app.add_typer(local, name="local")


@local.command("up")
def local_up(
    bucket: Annotated[str, typer.Option(envvar="RESPAWN_BUCKET", help="the local control bucket's name")] = "respawn-local",
    project: Annotated[str, typer.Option(envvar="RESPAWN_PROJECT", help="the local project's id")] = "respawn-local",
    tick: Annotated[float, typer.Option(envvar="RESPAWN_LOCAL_TICK", help="seconds between scheduler ticks")] = 60.0,
    preemption_notice: Annotated[float, typer.Option(envvar="RESPAWN_LOCAL_NOTICE",
                                                     help="shutdown-script budget in seconds (Spot: 30); a Spot "
                                                          "VM's preemption notice (120 s on Google) is shortened "
                                                          "alike")] = 30.0,
    realism: Annotated[Path | None, typer.Option("--realism", exists=True, dir_okay=False,
                                                 envvar="RESPAWN_LOCAL_REALISM",
                                                 help="a file `respawn canary` wrote: every server as slow as "
                                                      "Google (Realism.google()), with its measured figures in "
                                                      "place of respawn's assumptions")] = None,
    folder: LocalDir = DEFAULT_LOCAL_DIR,
    shards: Annotated[int, typer.Option(envvar="RESPAWN_SHARDS",
                                        help="K > 1: the tick publishes each of K shards its part of the "
                                             "listing and on_shard reconciles it (a power of two)")] = 1,
) -> None:
    """Start the whole local cloud and keep it up until Ctrl-C; another terminal sources the file it names."""
    import signal
    import threading

    from localcloud.realism import Realism
    from localcloud.session import Actions, remove_env, running, write_env
    from localcloud.stack import LocalCloud, Options

    deadline.stop()  # it runs until Ctrl-C
    if (other := running(folder)) is not None:
        # Its local.env is what every other terminal sources: a second cloud would take it over, then
        # remove it on stop while the first still runs.
        _fail(f"a local cloud is already up: {folder / 'local.env'} points at it (storage {other}); stop it "
              f"(Ctrl-C in its terminal), or give this one a folder of its own (--dir DIR, or RESPAWN_LOCAL_DIR)", REFUSED)

    try:
        measured = Realism() if realism is None else Realism.from_canary(realism)
    except (OSError, ValueError) as e:
        _fail(f"--realism: {e}")
    if problem := names.shards_problem(shards):
        _fail(f"--shards: {problem}")
    cloud = LocalCloud(Options(bucket=bucket, project=project, tick_interval=tick, shutdown_budget=preemption_notice,
                               log_dir=_made(folder), realism=measured, shards=shards, images=_container_images()))
    stop = threading.Event()
    # explicit: a background job inherits SIGINT ignored; SIGHUP: its terminal closed (the VMs,
    # each in a session of its own, would outlive a process killed by it, and local.env with them)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    with cloud:
        env_file = write_env(folder, cloud.env())
        written = env_file.read_text()
        out.print("[bold green]local cloud up[/bold green] — in another terminal, point clients at it with:\n")
        print(f"source {env_file}")
        out.print(f"\n[dim](`respawn local env` prints the exports again.) gcloud works against it once they are "
                  "set (a dummy token: no login needed): gcloud compute instances list[/dim]")
        out.print(f"\nfunctions: tick {cloud.function_url('tick')}  on_object {cloud.function_url('on_object')}")
        out.print("Ctrl-C stops everything. What the controller does is shown here as it happens:\n")
        actions = Actions(folder, lambda line: out.print(plain(line), soft_wrap=True)).start()
        try:
            while not stop.wait(0.5):
                pass
        finally:
            actions.stop()
            remove_env(folder, written)
    out.print("local cloud stopped")


@local.command("env")
def local_env(folder: LocalDir = DEFAULT_LOCAL_DIR) -> None:
    """Print the exports of the running local cloud again (what `respawn local up` wrote)."""
    from localcloud.session import read_env

    text = read_env(folder)
    if text is None:
        _fail(f"no local cloud is up (nothing in {folder}): start one with `respawn local up`")
    print(text, end="")


def _made(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


Instance = Annotated[str, typer.Argument(help="an instance or TPU node of the local cloud (`respawn status` names it)")]
Zone = Annotated[str, typer.Argument(help="a zone of the local cloud, e.g. us-central1-a")]
Off = Annotated[bool, typer.Option("--off", help="lift the fault instead")]


def _fault(fault: str, name: str, done: str, **args: Any) -> None:
    """Inject a fault into a machine of the running local cloud, and say which server took it."""
    from localcloud.faults import FaultError, Faults

    config = _config(fresh=True)
    try:
        server = Faults(config.compute_endpoint, config.tpu_endpoint).machine(fault, name, **args)
    except FaultError as e:
        _fail(str(e))
    out.print(_line("✓", "green", f"{name} ({server}): {done}"), soft_wrap=True)


def _zone_fault(fault: str, zone: str, off: bool, effect: str) -> None:
    from localcloud.faults import FaultError, Faults

    config = _config(fresh=True)
    try:
        servers = Faults(config.compute_endpoint, config.tpu_endpoint).zone(fault, zone, not off)
    except FaultError as e:
        _fail(str(e))
    said = f"{fault} in {zone} lifted" if off else f"{fault} in {zone}: {effect}"
    out.print(_line("✓", "green", f"{said} ({', '.join(servers)})"), soft_wrap=True)


@local.command("preempt")
def local_preempt(
    instance: Instance,
    hard: Annotated[bool, typer.Option("--hard", help="no notice: the shutdown script never runs (no marker)")] = False,
) -> None:
    """Preempt a Spot VM or TPU node of the running local cloud, as Google reclaims one."""
    _fault("preempt", instance, "preempted hard, without notice" if hard else
           "preempted; its shutdown script has the notice to checkpoint", graceful=not hard)


@local.command("maintenance")
def local_maintenance(instance: Instance) -> None:
    """Terminating host maintenance on a VM or TPU node of the running local cloud."""
    _fault("maintenance", instance, "host maintenance: its shutdown script runs, then it is TERMINATED")


@local.command("crash")
def local_crash(instance: Instance) -> None:
    """Crash the guest of a VM of the running local cloud: every process killed at once, no shutdown script."""
    _fault("crash", instance, "the guest crashed: killed at once, no shutdown script")


@local.command("stockout")
def local_stockout(zone: Zone, off: Off = False) -> None:
    """No capacity in a zone of the running local cloud (Compute Engine and Cloud TPU), until --off."""
    _zone_fault("stockout", zone, off, "creates there fail for want of capacity")


@local.command("quota")
def local_quota(zone: Zone, off: Off = False) -> None:
    """Over quota in a zone of the running local cloud (Compute Engine and Cloud TPU), until --off."""
    _zone_fault("quota", zone, off, "creates there are refused for quota")


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Ctrl-C, SIGTERM or a closed terminal (SIGHUP) is a KeyboardInterrupt in the main thread, even
    where SIGINT came inherited ignored (a shell's background job): the command's ``with`` blocks
    then stop what they started. Once one has come, the others are ignored until the block is left,
    so that a second Ctrl-C cannot cut that stopping short and leave servers or VMs behind."""
    import signal

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def interrupted(*_: object) -> None:
        for sig in signals:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    before = {sig: signal.signal(sig, interrupted) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


@app.command()
def demo(
    notice: Annotated[float, typer.Option(envvar="RESPAWN_DEMO_NOTICE",
                                          help="seconds of a Spot VM's shutdown and of its preemption notice "
                                               "(Google gives 30 and 120; both shortened for the demo)")] = 3.0,
    tpu: Annotated[bool, typer.Option("--tpu", help="the Cloud TPU story: a Spot v4-16 slice (2 hosts) "
                                                    "preempted, then terminated by host maintenance")] = False,
    tpu7x: Annotated[bool, typer.Option("--tpu7x", help="TPU7x through Compute Engine: a Spot 2x2x2 slice (a MIG "
                                                        "of 2 hosts) with one host preempted, then one lost to a "
                                                        "host error")] = False,
    output: Annotated[Path | None, typer.Option("--output", file_okay=False,
                                                help="folder for the job's report (HTML and PNG; "
                                                     "default: a new temporary folder)")] = None,
) -> None:
    """Run the whole story locally: a Spot job preempted three times, twice with notice, its next
    attempt booting beside the old one at each notice (--tpu: a TPU slice preempted, then taken by
    host maintenance; --tpu7x: a TPU7x slice in Compute Engine broken twice, replaced whole each time)
    still ends exactly right."""
    from localcloud import demo as story

    if tpu and tpu7x:
        _fail("--tpu or --tpu7x: one story at a time", REFUSED)
    which = "tpu7x" if tpu7x else "tpu" if tpu else "gpu"
    deadline.stop()  # its story takes minutes; its own waits are bounded
    try:
        with _interruptible():
            result = story.run(out, notice, which, output)
    except TimeoutError as e:
        _fail(f"demo failed: {e}", FAILED)
    except KeyboardInterrupt:  # the local cloud's `with` has stopped it (servers, functions, VMs)
        err.print("interrupted: the local cloud is stopped", soft_wrap=True, highlight=False)
        raise typer.Exit(INTERRUPTED) from None
    table = Table(title="respawn demo" + {"gpu": "", "tpu": " --tpu", "tpu7x": " --tpu7x"}[which], show_header=False)
    rows = [
        ("outcome", str(result.phase)),
        ("attempts", str(result.attempts)),
        ("preemptions", str(result.preemptions)),
        ("stockouts met", str(result.stockouts)),  # creates refused for want of capacity, as the report counts them
        *{"tpu": [("maintenance restarts", str(result.maintenance))],
          "tpu7x": [("host-error restarts", str(result.host_errors))],
          "gpu": [("zero-gap recoveries", _zero_gap(result))]}[which],
        ("failures", str(result.failures)),
        ("steps lost to preemption", str(result.steps_lost)),
        ("final loss", result.final_loss or "?"),
        ("final weights", result.final_hash or "?"),
        ("uninterrupted run", result.reference_hash),
        ("wall time", f"{result.seconds:.0f} s"),
    ]
    for key, value in rows:
        table.add_row(key, plain(value))
    out.print(table)
    for line in result.story:
        out.print(plain(f"  {line}"))
    for path in result.reports:
        out.print(plain(f"report: {path}"), soft_wrap=True)
    if not result.ok:
        err.print("[red]the story did not come out right[/red]")
        raise typer.Exit(1)
    out.print("[bold green]✓ same weights as an uninterrupted run[/bold green]")


def _local_cloud_down(config: Settings) -> str | None:
    """The local cloud's address the environment points at (its storage, or its Compute) when it
    does not answer; None when nothing points at one, or it answers."""
    import os
    import socket
    from urllib.parse import urlsplit

    for url in (os.environ.get("STORAGE_EMULATOR_HOST"), config.compute_endpoint):
        parts = urlsplit(url or "")
        if parts.hostname not in ("127.0.0.1", "localhost") or parts.port is None:
            continue
        try:
            socket.create_connection((parts.hostname, parts.port), timeout=1.0).close()
        except OSError:
            return str(url)
    return None


def _zero_gap(result: Any) -> str:
    """'2: trainer started 0.9s, 0.6s after the save': the recoveries that booted at a notice, and
    how long after the save each resumed from its trainer started."""
    from controller.render.handover_view import said

    gaps = ", ".join("—" if s is None else said(s) for s in result.zero_gap_s)
    return f"{result.zero_gap}" + (f": trainer started {gaps} after the save" if gaps else "")


def _declared_name(raw: bytes) -> str | None:
    try:
        data = load_document(raw)  # bounded: a hostile file must not blow the stack here either
    except SpecError:
        return None
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


if __name__ == "__main__":
    app()
