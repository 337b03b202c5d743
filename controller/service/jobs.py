"""What a user does to the bucket: submit, cancel, and read every job's status.

The CLI's verbs, kept apart from the CLI so they are tested over the in-memory store.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controller.core import errors, ledger, names, placement
from controller.core.checkpoints import Found
from controller.service import fanout
from controller.service.observe import MAX_STATUS_BYTES, discover
from controller.core.policy import ControllerPolicy
from controller.core.ports import BlobStore
from controller.core.spec import MAX_SPEC_BYTES, JobSpec, SpecError, parse_spec
from controller.core.state import JobStatus, Phase
from controller.core.world import MAX_RECORD_BYTES, Record

# ``respawn status`` of every job reads the heartbeats of at most this many RUNNING jobs (the
# first by name), this many at once: one small read each, never a cost that grows with the fleet.
# ``respawn status JOB`` and ``respawn report JOB`` always read their job's.
MAX_LIVE_READS = 50
LIVE_WORKERS = 8


class Refused(Exception):
    """The request was understood and declined; the message says what to do instead."""


def likely_meant(job: str, known: Iterable[str]) -> str | None:
    """The one of ``known`` that a mistyped ``job`` most likely meant; None when none is close. One rule
    wherever an unknown job is named (every CLI command taking a JOB, the dashboard's page)."""
    close = difflib.get_close_matches(job, list(known), n=1)
    return close[0] if close else None


@dataclass(frozen=True)
class JobRow:
    job: str
    status: JobStatus | None
    has_spec: bool
    cancelled: bool

    def as_dict(self, now: datetime, ids: dict[str, str], checkpoint: Found | None = None,
                checkpoint_error: str | None = None) -> dict[str, Any]:
        st = self.status
        last = st.history[-1] if st and st.history else None
        instance = st.instances[0] if st and st.instances else None
        return {
            "job": self.job,
            "phase": str(st.phase) if st else ("CANCELLED" if self.cancelled else "SUBMITTED"),
            "attempt": st.attempt if st else 0,
            "preemptions": st.preemptions if st else 0,
            "failures": st.failures if st else 0,
            # Terminating host maintenance (a GPU VM cannot live-migrate): a loss of its own, not a preemption.
            "maintenance": sum(c.get("maintenance", 0) for c in st.ledger.totals.losses.values()) if st else 0,
            "zone": st.zone if st else None,
            "provisioning": st.provisioning if st else None,  # the current attempt's model
            "tpu": st.tpu if st else False,  # the job has run on a Cloud TPU node
            "tpu_compute": st.tpu_compute if st else False,  # ... or on a TPU slice in Compute Engine
            # Which API the current attempt's TPU is created through ("tpu", "compute"); None: VMs.
            "tpu_api": ("compute" if st.attempt_compute else "tpu") if st and st.attempt_tpu else None,
            "upcoming_maintenance": st.upcoming_maintenance if st else None,  # announced on its TPU node
            # What capacity advice said of each zone at the last launch (placement: capacity).
            "zone_advice": {z: a.model_dump() for z, a in st.zone_advice.items()} if st else {},
            "advice_at": st.advice_at.isoformat() if st and st.advice_at else None,
            # Zones seen stocked out since that advice may have been asked: its scores there are stale.
            "stocked_out": {z: at.isoformat() for z, at in placement.stocked_out(
                st.history, st.advice_at - placement.ADVICE_MAX_AGE).items()} if st and st.advice_at else {},
            "instance": instance,
            "instance_id": ids.get(instance or "") or (st.instance_ids.get(instance or "") if st else None),
            "checkpoint": checkpoint.uri if checkpoint else None,  # the latest complete one, as RESUME_FROM
            "checkpoint_step": checkpoint.step if checkpoint else None,  # the training step, where recorded
            "checkpoint_label": checkpoint.label if checkpoint else None,  # "step 1200", "save 12", "release"
            "checkpoint_tag": checkpoint.tag if checkpoint else None,  # as RESUME_TAG
            "checkpoint_error": checkpoint_error,  # why the checkpoints could not be listed
            "age_seconds": int((now - st.created_at).total_seconds()) if st and st.created_at else None,
            "last_event": f"{last.event}: {last.detail}" if last else "",
            "not_before": st.not_before.isoformat() if st and st.not_before else None,  # a restart's due time
            "message": st.message if st else "",
            "errors": list(st.errors) if st else [],
        }


class Jobs:
    def __init__(self, store: BlobStore, bucket: str, policy: ControllerPolicy) -> None:
        self.store = store
        self.bucket = bucket
        self.policy = policy

    def check(self, raw: bytes, job: str) -> JobSpec:
        """Parse and apply the policy, and refuse a zone Compute Engine does not have; SpecError
        lists every problem."""
        spec = parse_spec(raw, job)
        if problems := self.policy.unknown_zones(spec) + self.policy.violations(spec):
            raise SpecError(problems)
        return spec

    def submit(self, raw: bytes, job: str, replace: bool = False, uncancel: bool = False,
               if_generation: int | None = None) -> int:
        """Upload the spec; a job still running is only overwritten with ``replace``.

        ``if_generation``: write only over that spec generation (the one a page showed);
        ``errors.PreconditionFailed`` when someone wrote another since.

        A cancel the controller has not acted on yet is only withdrawn with ``uncancel``:
        replacing the spec must not quietly revoke someone's cancel. A cancel left from a
        finished run is removed, so that it cannot cancel the new run.
        """
        self.check(raw, job)
        current, cancel = self._admitted(job, replace, uncancel, if_generation)
        if cancel:
            # Only the cancel seen above: one written since then is someone's new decision.
            try:
                self.store.delete(self.bucket, names.cancel_key(job), if_generation_match=cancel)
            except errors.NotFound:
                pass
            except errors.PreconditionFailed:
                raise Refused(f"job {job!r} was cancelled again while submitting; nothing was changed") from None
        match = if_generation if if_generation is not None else (None if replace else current)
        info = self.store.write(self.bucket, names.spec_key(job), raw, if_generation_match=match)
        return info.generation

    def admit(self, job: str, replace: bool = False, uncancel: bool = False) -> None:
        """What ``submit`` would refuse, asked before anything is shown or asked (the estimate, the
        question): Refused for a job still running without ``replace`` or with a pending cancel, and
        ``errors.NoSuchBucket`` when the bucket is not there (a listing of the job's own few objects:
        a read of a missing bucket's object is only "not found"). ``submit`` checks again."""
        if names.job_name_problem(job):
            return  # ``check`` says what is wrong with the name
        self.store.list(self.bucket, f"{names.JOBS_PREFIX}{job}/")
        self._admitted(job, replace, uncancel, None)

    def _admitted(self, job: str, replace: bool, uncancel: bool, if_generation: int | None) -> tuple[int, int]:
        """The spec's and the cancel's generations (0: none) when a submit may write; else Refused."""
        current = self._generation(names.spec_key(job))
        if if_generation is not None and current != if_generation:
            raise errors.PreconditionFailed(f"spec of {job!r} is at generation {current}, not {if_generation}")
        status = self.status(job)
        finished = status is not None and status.phase.terminal
        cancel = self._generation(names.cancel_key(job))
        # A cancel of a job that has neither a spec nor a status cancels nothing: stale.
        pending_cancel = bool(cancel) and not finished and (bool(current) or status is not None)
        if pending_cancel and not uncancel:
            raise Refused(f"job {job!r} has a pending cancel; pass --replace --uncancel to withdraw it and keep "
                          "the job running with this spec, or wait until it is CANCELLED and submit again")
        if current and not replace and not finished:
            phase = status.phase if status else "submitted"
            raise Refused(f"job {job!r} is {phase}; pass --replace to change its spec "
                          "(it applies from the next attempt)")
        return current, cancel

    def cancel(self, job: str) -> str | None:
        """Write the job's cancel; or, writing nothing, say why there is nothing to cancel: its run
        is over (cancelled, succeeded or failed) and no new spec has been submitted since."""
        spec = self._generation(names.spec_key(job))
        status = self.status(job)
        if not spec and status is None:
            raise self.no_such_job(job)
        # A spec whose generation the ended run did not take (None included: a run ended by its spec's
        # deletion) is a new submission, which the planner starts: it can still be cancelled.
        if status is not None and status.phase.terminal and (not spec or status.spec_generation == spec):
            how = "cancelled" if status.phase == "CANCELLED" else f"finished ({status.phase.lower()})"
            return f"{job} is already {how}: nothing to cancel"
        self.store.write(self.bucket, names.cancel_key(job), b"")
        return None

    def status(self, job: str) -> JobStatus | None:
        try:
            return JobStatus.from_json(self.store.read(self.bucket, names.status_key(job), limit=MAX_STATUS_BYTES).data)
        except (errors.NotFound, errors.TooLarge):
            return None
        except (ValueError, RecursionError):
            return None

    def no_such_job(self, job: str) -> Refused:
        """One wording for a job that is not there, whichever command asked (status, report, logs,
        history, reconcile, cancel, rm), with the job likely meant: one listing, made only on the way
        to this error."""
        near = likely_meant(job, self.job_names())
        return Refused(f"no job named {job!r} in gs://{self.bucket}" + (f"; did you mean {near!r}?" if near else ""))

    def bucket_there(self) -> None:
        """``errors.NoSuchBucket`` when the control bucket is not there: a listing of the pass's lease
        (a write of a missing bucket's object is only "not found", naming the object)."""
        self.store.list(self.bucket, "respawn/lease/")

    def job_names(self) -> list[str]:
        """Every job's name (a spec or a status under it): one listing, no status read."""
        kinds: dict[str, set[str]] = {}
        for info in self.store.list(self.bucket, names.JOBS_PREFIX):
            if ref := names.parse_object_name(info.name):
                kinds.setdefault(ref.job, set()).add(ref.kind)
        return sorted(name for name, k in kinds.items() if "spec" in k or "status" in k)

    def rows(self, job: str | None = None) -> list[JobRow]:
        prefix = names.JOBS_PREFIX + (f"{job}/" if job else "")
        kinds: dict[str, set[str]] = {}
        for info in self.store.list(self.bucket, prefix):
            if ref := names.parse_object_name(info.name):
                kinds.setdefault(ref.job, set()).add(ref.kind)
        # A job is a name with a spec or a status, as the controller judges (observe._ours): a name
        # holding only what a trainer can write (a heartbeat, an exit record, a notice) is no job.
        return [JobRow(name, self.status(name) if "status" in k else None, "spec" in k, "cancel" in k)
                for name, k in sorted(kinds.items()) if "spec" in k or "status" in k]

    def live(self, job: str, status: JobStatus | None) -> dict[str, Any] | None:
        """How far the current attempt's trainer is, as its heartbeat says (the VM agent folds the
        trainer's progress file into it, every heartbeat interval): the step, the latest save's
        write and upload times, the step of its newest uploaded save, and when GCS got the beat.

        The controller writes status.json only on events, so between losses this is the only fresh
        step; it is read here, by the CLI, never by a pass. Only a RUNNING job's, and only a beat of
        its current attempt with its token (``Record.belongs_to``); its fields are a trainer's
        (third-party code) and pass ``Record.parse``'s checks. None where there is nothing to show:
        no beat, another attempt's, an unreadable one, or one that reports no progress.
        """
        if status is None or status.phase != Phase.RUNNING:
            return None
        try:
            blob = self.store.read(self.bucket, names.heartbeat_key(job), limit=MAX_RECORD_BYTES)
        except errors.RespawnError:  # gone, too large, unreadable: the view goes on without it
            return None
        beat = Record.parse(blob.info, blob.data)
        if not beat.belongs_to(status):
            return None
        fields = {"step": beat.step, "saved_step": beat.saved_step, "save_s": beat.save_s, "upload_s": beat.upload_s}
        if all(value is None for value in fields.values()):
            return None
        return {**fields, "at": beat.updated.isoformat(), "source": ledger.SAVE_REPORTED}

    def lives(self, rows: list[JobRow], limit: int | None = MAX_LIVE_READS) -> tuple[dict[str, dict[str, Any]], set[str]]:
        """``live`` of the RUNNING jobs among ``rows``, the first ``limit`` of them (None: all), read
        side by side (those with something to show); and the RUNNING jobs left unread."""
        running = [r for r in rows if r.status is not None and r.status.phase == Phase.RUNNING]
        read = running if limit is None else running[:limit]

        def one(row: JobRow) -> dict[str, Any] | None:
            try:
                return self.live(row.job, row.status)
            except Exception:  # noqa: BLE001 - a report: one job's odd beat never costs the table
                return None

        got = fanout.each(read, one, LIVE_WORKERS)
        return ({r.job: live for r, live in zip(read, got, strict=True) if live is not None},
                {r.job for r in running[len(read):]})

    def checkpoint(self, job: str, status: JobStatus | None | bool = False) -> Found | None:
        """The job's latest complete checkpoint, if its spec names a prefix and it is readable: where
        its current run writes them. ``status``: the job's, already read (False: read it here)."""
        try:
            spec = parse_spec(self.store.read(self.bucket, names.spec_key(job), limit=MAX_SPEC_BYTES).data, job)
        except (errors.NotFound, errors.TooLarge, SpecError):
            return None
        if spec.checkpoint is None:
            return None
        if status is False:
            status = self.status(job)  # where its run writes them: a fresh run's own prefix (core.runs)
        return discover(self.store, status.checkpoints(spec.checkpoint) if status else spec.checkpoint)

    def _generation(self, key: str) -> int:
        try:
            return self.store.stat(self.bucket, key).generation  # metadata only
        except errors.NotFound:
            return 0
