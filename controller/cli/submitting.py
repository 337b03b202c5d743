"""What ``respawn submit`` and ``respawn run`` do once they have a spec: pack local code, check the
spec, show the estimate, ask, upload the code, then the spec. Kept out of main.py, which only
parses the options.

1. ``code:`` a local path (relative to the spec's folder), or ``--workdir DIR``: packed
   (controller/cli/pack.py) and written into the spec as ``gs://BUCKET/code/<sha256>.tar.gz``;
2. the spec checked as the controller will (schema and policy): nothing is uploaded if not;
3. the estimate (controller/cli/estimate.py), then a question, asked only on a terminal and
   without ``--yes``; ``--dry-run`` stops here, having uploaded nothing;
4. the code uploaded unless that address is already in the bucket, then the spec.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from rich.console import Console
from rich.text import Text

from controller.cli import buckets, deadline, estimate, pack
from controller.core import errors, tpus
from controller.core.checkpoints import split_uri
from controller.core.spec import JobSpec, SpecError, load_document
from controller.render.amounts import counted
from controller.render.status_view import Note
from controller.service import jobruns, places
from controller.service.jobs import Jobs, Refused


class NotSubmitted(Exception):
    """The user said no at the question; nothing was uploaded."""


@dataclass(frozen=True)
class Request:
    raw: bytes  # the spec as given
    job: str
    base: Path  # a relative ``code:`` is read from here (the spec's folder)
    workdir: Path | None = None  # --workdir: code from here, in place of the spec's
    replace: bool = False
    uncancel: bool = False
    yes: bool = False
    dry_run: bool = False
    fresh: bool = False  # --fresh: a new run that resumes no earlier checkpoint (checkpoint.fresh)
    from_flags: bool = False  # respawn run: no spec file, so a fix is a flag, never a line to add


@dataclass(frozen=True)
class Done:
    generation: int | None  # None: a dry run
    code: pack.Packed | None
    uploaded: bool


def with_code(raw: bytes, base: Path, workdir: Path | None, bucket: str) -> tuple[bytes, pack.Packed | None, str | None]:
    """The spec to upload, the code packed for it (None: nothing local), and a note for the user.

    A spec whose code is already ``gs://`` (or absent) is returned byte for byte. Otherwise the
    spec is written again as YAML with ``code:`` set to the tarball's address (comments and layout
    of the original are not kept: the bucket holds what the controller reads)."""
    data = load_document(raw)
    if not isinstance(data, dict):
        return raw, None, None  # parse_spec says what is wrong with it
    given = data.get("code")
    note = None
    if workdir is not None:
        source = workdir
        if isinstance(given, str):
            note = f"--workdir {workdir} replaces the spec's code: {given}"
    elif isinstance(given, str) and pack.is_local(given):
        try:
            source = Path(given).expanduser()
        except RuntimeError as e:  # ~user of no user here
            raise pack.PackError(f"{given}: {e}") from e
        source = source if source.is_absolute() else base / source
    else:
        return raw, None, None
    packed = pack.pack(source)
    data["code"] = packed.uri(bucket)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).encode(), packed, note


def with_fresh(raw: bytes) -> tuple[bytes, str | None]:
    """The spec with ``checkpoint.fresh: true`` (``--fresh``), and a note when that changes nothing
    (a spec without a checkpoint prefix: every run of it starts from scratch anyway)."""
    data = load_document(raw)
    if not isinstance(data, dict):
        return raw, None  # parse_spec says what is wrong with it
    checkpoint = data.get("checkpoint")
    if not isinstance(checkpoint, dict):
        return raw, "--fresh: the spec names no checkpoint.uri, so there is nothing to resume: it changes nothing"
    data["checkpoint"] = {**checkpoint, "fresh": True}
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).encode(), None


def no_checkpoint(spec: JobSpec, job: str, from_flags: bool = False) -> tuple[str, str] | None:
    """The warning for a spec that names no checkpoint prefix (a warning: a job that is quick to
    redo needs none), what it costs, and the line to add (``from_flags``, respawn run's: the flag
    to give); None for one that names one."""
    if spec.checkpoint is not None:
        return None
    where = ("Leave out --no-checkpoint (run then gives it a folder in the checkpoints bucket respawn deploy "
             "makes) or give it this flag") if from_flags else "Add this line to the spec"
    fix = f"--checkpoint gs://BUCKET-checkpoints/{job}" if from_flags else \
        f"checkpoint: {{uri: gs://BUCKET-checkpoints/{job}}}"
    return (f"{job} names no checkpoint: each preemption restarts it from step 0, and respawn has nothing to "
            f"resume it from. {where} (BUCKET-checkpoints: the bucket respawn deploy makes beside your control "
            "bucket, or another the VMs' account can write), and have the trainer save under "
            "$RESPAWN_CHECKPOINT_URI and load the latest save there when it starts:", fix)


def no_checkpoint_bucket(place: places.Place, where: str, control: str) -> str:
    """Why a spec whose checkpoint bucket is not there is refused, and the fix: the deploy's
    checkpoints bucket (``respawn run``'s default) is made by deploying again."""
    if not _beside_control(where, control):
        return place.refusal()
    ours = buckets.checkpoints_bucket(control)
    return (f"checkpoint.uri {where}: bucket gs://{ours} does not exist, so the job could never find its checkpoints "
            f"and would wait for ever: it is the checkpoints bucket respawn deploy makes beside gs://{control} (a "
            "deploy older than it made none): run respawn deploy again (or resume it with --from checkpoints-bucket; "
            "on the local cloud, restart respawn local up), or give the job another place "
            "(respawn run --checkpoint gs://...)")


def warn_no_checkpoint(spec: JobSpec, job: str, err: Console, from_flags: bool = False) -> None:
    if said := no_checkpoint(spec, job, from_flags):
        err.print(Note("!", "yellow", said[0]))
        err.print(Text(f"  {said[1]}"), soft_wrap=True, highlight=False)


def warn_control_bucket(spec: JobSpec, job: str, control: str, err: Console, from_flags: bool = False) -> None:
    """A warning, not a refusal, for a checkpoint prefix in the control bucket (places.in_control_bucket):
    an operator may have granted the trainers' account more there (``respawn doctor SPEC`` judges the
    grant it finds). The fix is the spec's line, or (``from_flags``, respawn run's) the flag."""
    if spec.checkpoint is None or (wrong := places.in_control_bucket(spec.checkpoint.uri, control, job)) is None:
        return
    field, fix = ("--checkpoint", f"--checkpoint {wrong.instead}  # or leave it out: respawn run's default") \
        if from_flags else (wrong.field, wrong.fix)
    err.print(Note("!", "yellow", f"{field}: {wrong.detail}, unless you granted it more there (respawn doctor SPEC "
                                  "checks the grant). Give the job its own prefix in the checkpoints bucket:"))
    err.print(Text(f"  {fix}"), soft_wrap=True, highlight=False)


def submit(request: Request, jobs: Jobs, sources: Callable[[], estimate.Sources], project: str,
           out: Console, err: Console, ask: Callable[[str], bool], interactive: bool,
           show_spec: bool = False, no_bucket: Callable[[errors.NoSuchBucket], str | None] = lambda e: None) -> Done:
    """Steps 1 to 4; raises SpecError (the spec or its code), PackError, NotSubmitted, or what
    ``Jobs.submit`` raises. A submit that starts a new run over checkpoints already there says
    which one it will resume (or, ``--fresh``, that it resumes none), before the question.

    What the upload would refuse (a job still running without --replace, a pending cancel, no such
    bucket) is refused first, before the code is packed and the estimate made; a dry run only says it.
    ``no_bucket``: the line for a control bucket that is not there (RESPAWN_BUCKET named, the fix)."""
    control_missing = _admit(request, jobs, err, no_bucket)
    raw, packed, note = with_code(request.raw, request.base, request.workdir, jobs.bucket)
    fresh_note = None
    if request.fresh:
        _fresh_allowed(jobs, request.job)
        raw, fresh_note = with_fresh(raw)
    spec = jobs.check(raw, request.job)
    if show_spec:
        out.print(Text(shown(raw).rstrip("\n")), soft_wrap=True, highlight=False)
        out.print()
    for said in (note, fresh_note):
        if said:
            err.print(Text(f"! {said}", style="yellow"), soft_wrap=True)
    warn_no_checkpoint(spec, request.job, err, request.from_flags)
    warn_control_bucket(spec, request.job, jobs.bucket, err, request.from_flags)
    resumes = jobruns.resume(jobs, spec, request.job)
    # A place not there (the example's placeholder bucket) is refused; one not readable here is left to
    # the controller and the VMs (places: respawn doctor SPEC judges them alike).
    if resumes is not None and resumes.bucket is not None and resumes.bucket.there is False:
        if not (control_missing and _beside_control(resumes.where, jobs.bucket)):
            raise Refused(no_checkpoint_bucket(resumes.bucket, resumes.where, jobs.bucket))
        # A dry run with no control bucket (mistyped, or not deployed yet): its checkpoints bucket is
        # missing with it, which the line above said the fix of; never "run respawn deploy again" alone.
        err.print(Text(f"! checkpoint.uri {resumes.where}: its bucket is missing with the control bucket "
                       "(respawn deploy makes both)", style="yellow"), soft_wrap=True)
    if packed is None and spec.code and (code := places.code(jobs.store, spec.code)).there is False:
        raise Refused(code.refusal())
    there = packed is not None and _there(jobs, packed)
    table_rows, notes = _estimate(spec, request.job, project or "", sources)
    out.print(estimate.render(spec, request.job, table_rows, notes))
    if packed is not None:
        size = f"{len(packed.data) / 1024 / 1024:.1f} MiB"
        out.print(Text(f"code: {packed.source} → {packed.uri(jobs.bucket)} ({counted(packed.files, 'file')}, {size}; "
                       f"{'already in the bucket' if there else 'to upload'})"), soft_wrap=True)
    if resumes is not None and (warning := resumes.warning()):
        err.print(Note("!", "yellow", warning))  # wrapped between words, at the terminal's width
    if request.dry_run:
        out.print(Text("dry run: nothing uploaded", style="dim"))
        return Done(None, packed, False)
    question = f"Submit {request.job}" + (f", resuming from {resumes.label}?" if resumes and resumes.label else "?")
    if interactive and not request.yes and not ask(question):
        raise NotSubmitted(f"{request.job} not submitted")
    uploaded = False
    if packed is not None and not there:
        # Its time is its size's (100 MiB at most): the command's bound, plus that at a slow uplink.
        uploaded = deadline.widened(len(packed.data) / deadline.UPLOAD_BYTES_S, pack.upload, jobs.store, jobs.bucket, packed)
    generation = jobs.submit(raw, request.job, request.replace, request.uncancel)
    return Done(generation, packed, uploaded)


HIDDEN = "<hidden>"


def shown(raw: bytes) -> str:
    """The spec as ``respawn run`` echoes it: each ``env`` value hidden (``--env TOKEN=...`` is how a
    secret reaches the VM, and a terminal's scrollback or a CI log is no place for it); the spec
    written to the bucket keeps them, since the VM needs them."""
    data = load_document(raw)
    if not isinstance(data, dict) or not isinstance(data.get("env"), dict) or not data["env"]:
        return raw.decode("utf-8", "replace")
    masked = {**data, "env": {key: HIDDEN for key in data["env"]}}
    return yaml.safe_dump(masked, sort_keys=False, allow_unicode=True)


def _admit(request: Request, jobs: Jobs, err: Console,
           no_bucket: Callable[[errors.NoSuchBucket], str | None] = lambda e: None) -> bool:
    """Refuse now what ``Jobs.submit`` would refuse after the estimate and the question; a dry run,
    which uploads nothing (perhaps before the bucket is made), says it and goes on. True: a dry run
    found no control bucket."""
    try:
        jobs.admit(request.job, request.replace, request.uncancel)
    except (Refused, errors.NoSuchBucket) as e:
        if not request.dry_run:
            raise
        missing = isinstance(e, errors.NoSuchBucket)
        said = (no_bucket(e) if isinstance(e, errors.NoSuchBucket) else None) or str(e)
        err.print(Text(f"! a submit would be refused: {said}", style="yellow"), soft_wrap=True)
        return missing
    return False


def _beside_control(where: str, control: str) -> bool:
    """``where`` is in the checkpoints bucket of the control bucket ``control``."""
    try:
        return split_uri(where)[0] == buckets.checkpoints_bucket(control)
    except ValueError:
        return False


def _fresh_allowed(jobs: Jobs, job: str) -> None:
    """``--fresh`` begins a new run: a job whose run goes on is refused, with what to do instead."""
    status = jobs.status(job)
    if status is not None and not status.phase.terminal:
        raise Refused(f"--fresh starts a new run, and job {job!r} is {status.phase}: cancel it first "
                      f"(respawn cancel {job}), then submit with --fresh once it is CANCELLED; or drop --fresh "
                      "to replace its spec (--replace) and keep its checkpoints")


def run_spec(*, name: str, zones: list[str], command: list[str], machine_type: str | None,
             accelerator: str | None, tpu: str | None, tpu_runtime: str | None, provisioning: list[str],
             nodes: int, checkpoint: str | None, env: list[str], image: str | None = None,
             tpu_topology: str | None = None) -> dict[str, Any]:
    """The spec ``respawn run`` makes from its flags (checked later as any spec is). One COMMAND
    word is a bash line; several are a list of arguments (each quoted as given); none, with an
    image, runs the image's own entrypoint. ``--tpu`` naming a TPU machine type (tpu7x-standard-4t)
    is a slice in Compute Engine (``tpu.machine_type``, with ``--tpu-topology``); any other, a Cloud
    TPU type (``tpu.type``, with ``--tpu-runtime``)."""
    spec: dict[str, Any] = {"name": name, "zones": _split(zones)}
    if tpu and tpus.is_tpu_machine(tpu):
        spec["tpu"] = {"machine_type": tpu, **({"runtime_version": tpu_runtime} if tpu_runtime else {}),
                       **({"topology": tpu_topology} if tpu_topology else {})}
    elif tpu or tpu_topology:
        spec["tpu"] = {**({"type": tpu} if tpu else {}), **({"runtime_version": tpu_runtime} if tpu_runtime else {}),
                       **({"topology": tpu_topology} if tpu_topology else {})}
    if machine_type:
        spec["machine_type"] = machine_type
    if accelerator:
        kind, _, count = accelerator.partition(":")
        spec["accelerators"] = {"type": kind, "count": _count(count, accelerator)}
    models = _split(provisioning)
    if models:
        spec["provisioning"] = models[0] if len(models) == 1 else models
    if nodes != 1:
        spec["nodes"] = nodes
    if image:
        spec["image"] = image
    if command:
        spec["command"] = command[0] if len(command) == 1 else list(command)
    if checkpoint:
        spec["checkpoint"] = {"uri": checkpoint}
    if env:
        spec["env"] = dict(_pair(e) for e in env)
    return spec


def missing_flags(*, name: str | None, zones: list[str], machine_type: str | None, tpu: str | None,
                  command: list[str], image: str | None) -> list[str]:
    """Every required flag ``respawn run`` was not given, all at once (each with an example)."""
    out = []
    if not name:
        out.append("--name (-n): required: the job's name, e.g. --name tune")
    if not _split(zones):
        out.append("--zone (-z): required: a zone to run in, e.g. --zone us-central1-a (repeat it for more)")
    if not machine_type and not tpu:
        out.append("--machine-type (-m): required: a Compute Engine machine type, e.g. -m g2-standard-8 "
                   "(or --tpu for a TPU slice)")
    if not command and not image:
        out.append("COMMAND: required: what the VM runs, after --, e.g. -- python train.py (or --image, whose "
                   "own entrypoint runs)")
    return out


COMMAND_WORDS = 3  # ``python train.py``, ``python -u train.py``, ``bash run.sh``: the file is among the first words


def local_file(command: list[str], here: Path) -> str | None:
    """A file under ``here`` that the command's first words name (``python train.py``, ``bash
    scripts/train.sh``): the VM starts in an empty folder unless code is sent, so it would not find
    it. None when no word names one; an absolute path, or one that leaves this folder (``..``), is
    not what ``--workdir .`` would send."""
    words = command
    if len(command) == 1:
        try:
            words = shlex.split(command[0])
        except ValueError:  # an unclosed quote: bash says so on the VM
            return None
    for word in words[:COMMAND_WORDS]:
        path = PurePosixPath(word)
        if word.startswith("-") or path.is_absolute() or ".." in path.parts or not path.parts:
            continue
        try:
            if (here / path).is_file():
                return str(path)  # ./src/train.py as src/train.py
        except OSError:  # a name too long for the file system
            continue
    return None


def _estimate(spec: JobSpec, job: str, project: str,
              sources: Callable[[], estimate.Sources]) -> tuple[list[estimate.Row], list[str]]:
    try:
        gathered = estimate.gather(spec, spec.project or project, sources())
    except Exception as e:  # noqa: BLE001 - an estimate that cannot be made never stops a submit
        gathered = estimate.Gathered({}, {}, [f"no estimate from Google: {e}"])
    return estimate.rows(spec, gathered), gathered.notes


def _there(jobs: Jobs, packed: pack.Packed) -> bool:
    try:
        return jobs.store.stat(jobs.bucket, packed.name).size == len(packed.data)
    except Exception:  # noqa: BLE001 - not known to be there: uploaded (create-only) at the end
        return False


def _split(values: list[str]) -> list[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def _count(text: str, given: str) -> int:
    if not text:
        return 1
    if not text.isdigit():
        raise SpecError([f"--accelerator: expected TYPE or TYPE:COUNT, e.g. nvidia-l4:1 (got {given!r})"])
    return int(text)


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise SpecError([f"--env: expected KEY=VALUE (got {text!r})"])
    return key, value


def interactive() -> bool:
    """Whether to ask: only when stdin is a terminal (a script or a pipe is never asked)."""
    import sys

    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):  # no stdin, or a closed one
        return False


def google_sources(config: Any) -> Callable[[], estimate.Sources]:
    """The estimate's sources on Google's APIs (or the local cloud's), built when first asked."""
    def build() -> estimate.Sources:
        from controller.adapters.google import capacity_advisor, quota_reader

        return estimate.sources(lambda: capacity_advisor(config), lambda: quota_reader(config))

    return build
