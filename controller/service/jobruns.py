"""A job's runs, from the user's side: what a submit that starts a new run will resume, the job's
past runs (``respawn history``), and forgetting a finished job (``respawn rm``).

Over the bucket only, as ``Jobs`` is. A job's name is reused by every run of it; its checkpoints
outlive its runs and its records (controller.core.runs): nothing here ever deletes one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controller.core import errors, names, runlog
from controller.core.checkpoints import Found, split_uri
from controller.core.ports import BlobInfo
from controller.core.runs import RunSummary, fresh_root
from controller.core.spec import MAX_SPEC_BYTES, JobSpec, SpecError, parse_spec
from controller.core.state import CheckpointRef, JobStatus
from controller.service.jobs import Jobs, Refused
from controller.service.observe import discover


@dataclass(frozen=True)
class Resume:
    """Where the next run of a job starts from, told before its spec is written."""

    job: str
    last: JobStatus | None  # the job's last run (finished), None for a job with no status
    found: Found | None  # the latest complete checkpoint where the new run will look (or, fresh: kept)
    where: str  # the prefix listed
    fresh: bool  # the spec asks for a fresh run: ``found`` is kept, never resumed
    error: str | None = None  # why the prefix could not be listed
    missing_bucket: str | None = None  # the bucket of the prefix, when it does not exist

    def warning(self) -> str | None:
        """In words, what the new run will do with the checkpoints already there; None: nothing to say."""
        run = f"{self.job}'s last run ({self.last.run}, {self.last.phase})" if self.last else None
        if self.fresh:
            kept = f"; {self.found.label} under {self.where} is kept, not resumed" if self.found else ""
            return (f"--fresh: the new run of {self.job} starts from scratch{kept}; its own checkpoints go under "
                    f"{fresh_root(self.where, self.job, '<run id>')} (its RESPAWN_CHECKPOINT_URI: the trainer must write there)")
        if self.error:
            return f"cannot list {self.where} ({self.error}): the new run will resume from whatever it finds there"
        if self.found is None:
            return None
        whose = f"of {run}" if run else f"already under {self.where} (left by an earlier job of this name?)"
        return (f"the new run will resume from checkpoint {self.found.label} {whose}: {self.found.uri}, not from "
                "scratch; to start fresh instead, submit with --fresh (nothing is deleted: its checkpoints go "
                "under a new prefix)")

    @property
    def label(self) -> str | None:
        """What the question names: the checkpoint resumed from."""
        return None if self.fresh or self.found is None else self.found.label


def resume(jobs: Jobs, spec: JobSpec, job: str) -> Resume | None:
    """What submitting ``spec`` as ``job`` will resume, when it starts a new run (the job has no
    status, or its run is over) and the spec names a checkpoint prefix; None otherwise."""
    if spec.checkpoint is None:
        return None
    status = jobs.status(job)
    if status is not None and not status.phase.terminal:
        return None  # a running job: a spec replaced there applies to its next attempt, same run
    where = status.checkpoints(spec.checkpoint) if status is not None else spec.checkpoint
    try:
        found, error, missing = discover(jobs.store, where), None, None
    except errors.RespawnError as e:
        found, error = None, str(e) or type(e).__name__
        missing = e.bucket if isinstance(e, errors.NoSuchBucket) else None
    return Resume(job, status, found, where.uri, spec.checkpoint.fresh, error, missing)


def history(jobs: Jobs, job: str, now: datetime) -> list[RunSummary]:
    """The job's runs, oldest first: the past ones its status keeps, then the current one."""
    status = jobs.status(job)
    if status is None:
        if not jobs.rows(job):
            raise jobs.missing(job)
        raise Refused(f"job {job!r} has no readable status yet: the controller has not taken it up")
    try:
        found = jobs.checkpoint(job)
    except errors.RespawnError:
        found = None
    return [*status.runs, runlog.summary_of(status, now, CheckpointRef.of(found) if found else None)]


@dataclass(frozen=True)
class Removed:
    job: str
    removed: tuple[str, ...]  # the objects deleted (bucket-relative names)
    checkpoints: tuple[str, ...]  # the prefixes its checkpoints are under: kept


def removable(jobs: Jobs, job: str) -> tuple[dict[str, BlobInfo], JobStatus | None]:
    """The job's objects and status, or Refused when it may not be removed (``remove``'s check,
    made alone: ``respawn sweep rm`` checks every trial before it removes any)."""
    if problem := names.job_name_problem(job):
        # A folder under jobs/ whose name is no job's (status lists it; the controller never runs it): its
        # own objects may go, where the name is one plain path segment; anything else is refused whole.
        folder = _plain_segment(job) and {i.name: i for i in jobs.store.list(jobs.bucket, f"{names.JOBS_PREFIX}{job}/")}
        if not folder:
            raise Refused(f"{problem}; nothing removed")
        return folder, None
    objects = {i.name: i for i in jobs.store.list(jobs.bucket, f"{names.JOBS_PREFIX}{job}/")
               if (ref := names.parse_object_name(i.name)) is not None and ref.job == job}
    try:
        objects[names.marker_key(job)] = jobs.store.stat(jobs.bucket, names.marker_key(job))
    except errors.NotFound:
        pass
    spec_info, status_info = objects.get(names.spec_key(job)), objects.get(names.status_key(job))
    status = jobs.status(job) if status_info else None
    _refuse_active(job, spec_info, status_info is not None, status)
    return objects, status


def _plain_segment(name: str) -> bool:
    """One path segment of printable characters: never '.', '..', a '/' or a control character."""
    return bool(name) and name not in (".", "..") and "/" not in name and name.isprintable() and len(name) <= 200


def remove(jobs: Jobs, job: str) -> Removed:
    """Forget a job that is not running: its spec first (so that no pass starts it again), then its
    records, its status last, each by generation (one written meanwhile is someone's new decision:
    refused, never deleted). Never a checkpoint. Nothing there: nothing removed (removing twice is
    fine)."""
    objects, status = removable(jobs, job)
    kept = _checkpoint_prefixes(jobs, job, status) if not names.job_name_problem(job) else ()
    order = sorted(objects, key=lambda n: (n != names.spec_key(job), n == names.status_key(job), n))
    removed = []
    for name in order:
        try:
            jobs.store.delete(jobs.bucket, name, if_generation_match=objects[name].generation)
        except errors.NotFound:
            continue  # gone already: another rm, or the controller cleaning up
        except errors.PreconditionFailed:
            what = "its spec was written again: nothing removed" if name == names.spec_key(job) else \
                f"{name} changed meanwhile (the job was submitted again?): kept, with what was not removed yet"
            raise Refused(f"job {job!r} changed while being removed: {what}") from None
        removed.append(name)
    return Removed(job, tuple(removed), kept)


def _refuse_active(job: str, spec: BlobInfo | None, has_status: bool, status: JobStatus | None) -> None:
    """A job the controller runs, or is about to run, is never removed: it says what to do first."""
    cancel = f"cancel it first (respawn cancel {job}), then remove it once it is CANCELLED"
    if has_status and status is None and spec is not None:
        raise Refused(f"job {job!r} has a status that cannot be read, so it may be running; {cancel}")
    if status is None:
        if spec is not None:
            raise Refused(f"job {job!r} is submitted and waiting for the controller; {cancel}")
        return
    if not status.phase.terminal:
        raise Refused(f"job {job!r} is {status.phase}; {cancel}")
    if spec is not None and spec.generation != status.spec_generation:  # None too: the planner starts it
        raise Refused(f"job {job!r} was submitted again: a new run is about to start; {cancel}")


def _checkpoint_prefixes(jobs: Jobs, job: str, status: JobStatus | None) -> tuple[str, ...]:
    """Where the job's checkpoints are, to say they are kept: the spec's prefix and every run's own."""
    found = [r.checkpoints for r in status.runs] if status else []
    if status is not None:
        found.append(status.checkpoint_uri)
    spec = _spec(jobs, job)
    if spec is not None and spec.checkpoint is not None:
        found.insert(0, spec.checkpoint.uri)
    seen: list[str] = []
    for uri in found:
        if uri and uri not in seen:
            seen.append(uri)
    return tuple(seen)



def held(jobs: Jobs, prefix: str) -> str | None:
    """Whether a checkpoint prefix holds anything, said for ``rm``'s "kept": None when it does; else
    why not (its bucket does not exist, nothing is under it, or it could not be listed)."""
    bucket, path = split_uri(prefix)
    try:
        found = jobs.store.list(bucket, path)
    except errors.NoSuchBucket:
        return f"bucket gs://{bucket} does not exist"
    except errors.RespawnError as e:
        return f"could not be listed: {e}"
    return None if found else "nothing is there"


def _spec(jobs: Jobs, job: str) -> JobSpec | None:
    try:
        return parse_spec(jobs.store.read(jobs.bucket, names.spec_key(job), limit=MAX_SPEC_BYTES).data, job)
    except (errors.NotFound, errors.TooLarge, SpecError):
        return None
