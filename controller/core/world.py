"""What one pass observed, per job: plain values the planner decides on."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TypeGuard

from controller.core import ledger, placement
from controller.core.ports import BlobInfo, Instance, StopReason, ZoneAdvice
from controller.core.spec import JobSpec
from controller.core.state import CheckpointRef, JobStatus


# A VM record is a few hundred bytes; anything much larger is not one (and must not
# cost a function its memory or its 540 s).
MAX_RECORD_BYTES = 64 * 1024
RESULT_MAX_BYTES = 16 * 1024  # RESPAWN_RESULT_FILE: what the VM agent puts in the exit record (deploy/vm/startup.sh)
_MAX_ATTEMPT = 10**9
MAX_STEP = 10**18 - 1  # a step as the agent passes it on: at most 18 digits
MAX_REPORTED_S = 7 * 86400.0  # a save or an upload reported longer than a week is not one


@dataclass(frozen=True)
class Record:
    """A marker, exit record or heartbeat written by a VM.

    Written by trainer VMs, which run third-party code: every field is checked, and a
    record that cannot be read (garbage, wrong types, too large) keeps only its
    object's identity with ``attempt`` None, so it belongs to no attempt and is only
    ever cleaned up.
    """

    key: str
    generation: int
    updated: datetime
    attempt: int | None = None
    instance: str | None = None
    exit_code: int | None = None
    node: int | None = None
    token: str | None = None
    # A heartbeat judged on its listing (``listed``) carries no token, only its proof: see PROOF_KEY.
    proof: str | None = None
    detail: str = ""  # a marker's reason (preempted, maintenance, rebooted); an exit record's why
    saved: bool | None = None  # a marker: the trainer exited (its SIGTERM save done) before the deadline
    # When the agent launched the trainer, by the VM's clock (RFC 3339, UTC); None from an older
    # agent, or where the field is garbage (the record itself still counts).
    trainer_started: datetime | None = None
    # What the trainer's progress file said (respawnkit.progress), through its agent: the last
    # step it finished, how long its last save took to write (blocking training) and to upload
    # (in the background), and the step of its newest uploaded save. Third-party values: None
    # where absent or not sane, the record itself still counts.
    step: int | None = None
    save_s: float | None = None
    upload_s: float | None = None
    saved_step: int | None = None
    # An image: job's pull of its image, by the VM's clock (before the starting line), and how long it
    # took in whole seconds; None without an image, from an older agent, or where garbage.
    pull_started: datetime | None = None
    pull_ended: datetime | None = None
    pull_s: int | None = None
    # An exit record's: the text the trainer wrote to RESPAWN_RESULT_FILE (a sweep's trial reports
    # its result so), at most RESULT_MAX_BYTES; judged only once the record's token is.
    result: str | None = None

    @classmethod
    def oversized(cls, info: BlobInfo) -> Record:
        """Not a record (too large to be one): only its identity, so that it is cleaned up."""
        return cls(key=info.name, generation=info.generation, updated=info.updated,
                   detail=f"unreadable: {info.size} bytes")

    @classmethod
    def unread(cls, info: BlobInfo, why: str, node: int | None = None) -> Record:
        """A record judged on its listing alone (never read: no attempt of the job can have
        written it, or it is past what one pass reads): only its identity, so it is cleaned up."""
        return cls(key=info.name, generation=info.generation, updated=info.updated, node=node, detail=why)

    @classmethod
    def parse(cls, info: BlobInfo, data: bytes) -> Record:
        base = cls(key=info.name, generation=info.generation, updated=info.updated, detail="unreadable")
        if len(data) > MAX_RECORD_BYTES:
            return replace(base, detail=f"unreadable: {len(data)} bytes")
        try:
            # Bytes that are no UTF-8 (a trainer's result, copied as it wrote it) are replaced, never a
            # record lost: the exit code beside them is the job's.
            body = json.loads(data.decode("utf-8", "replace"))
        except (ValueError, RecursionError):
            return base
        if not isinstance(body, dict):
            return base
        token = body.get("token")
        return cls._judged(info, body, token=token if _is_token(token) else None) or base

    @classmethod
    def listed(cls, info: BlobInfo) -> Record | None:
        """A heartbeat judged on its listing alone, from the custom metadata its VM agent wrote with
        it (``listing_metadata``: each field of the body as its JSON text, and the token's proof in
        place of the token), or None where that cannot say (an older agent wrote none, no proof,
        no whole attempt, a value that is no JSON, more than GCS allows): its body is read then.

        Every value is checked as ``parse`` checks the body's (a trainer wrote it), so that a
        heartbeat judged here is the one its body would give, but for the token: ``proof``.
        Only heartbeats are judged so: an exit record, marker or notice decides on its token."""
        meta = info.metadata
        if not meta or info.size > MAX_RECORD_BYTES:
            return None
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()) \
                or sum(len(k) + len(v) for k, v in meta.items()) > MAX_METADATA_BYTES:
            return None
        proof = meta.get(PROOF_KEY)
        if proof is None or not _PROOF.fullmatch(proof):
            return None
        body: dict[str, object] = {}
        for key in _FIELDS:
            if key in meta:
                try:
                    body[key] = json.loads(meta[key])
                except (ValueError, RecursionError):
                    return None
        return cls._judged(info, body, proof=proof)

    @classmethod
    def _judged(cls, info: BlobInfo, body: Mapping[str, object], *, token: str | None = None,
                proof: str | None = None) -> Record | None:
        """The record a body's fields make, each checked; None without a whole attempt."""
        attempt = _whole(body.get("attempt"), 0, _MAX_ATTEMPT)
        if attempt is None:
            return None
        instance = body.get("instance")
        reason = body.get("reason")
        saved = body.get("saved")
        return cls(
            key=info.name,
            generation=info.generation,
            updated=info.updated,
            attempt=attempt,
            instance=instance[:63] if isinstance(instance, str) and instance else None,
            exit_code=_whole(body.get("exit_code"), -(2**31), 2**31 - 1),
            node=_whole(body.get("node"), 0, 10**6),
            token=token,
            proof=proof,
            detail=reason[:DETAIL_MAX] if isinstance(reason, str) else "",
            saved=saved if isinstance(saved, bool) else None,
            trainer_started=_instant(body.get("trainer_started")),
            result=result if isinstance(result := body.get("result"), str) and len(result) <= RESULT_MAX_BYTES else None,
            step=_whole(body.get("step"), 0, MAX_STEP),
            save_s=_seconds(body.get("save_s")),
            upload_s=_seconds(body.get("upload_s")),
            saved_step=_whole(body.get("saved_step"), 0, MAX_STEP),
            pull_started=_instant(body.get("pull_started")),
            pull_ended=_instant(body.get("pull_ended")),
            pull_s=_whole(body.get("pull_s"), 0, 10**7),
        )

    def belongs_to(self, status: JobStatus) -> bool:
        """Written by the current attempt's VMs; anything else is stale or forged and only cleaned up.

        The attempt number is not enough on its own: a trainer of another job sharing the
        service account could write it. The attempt's secret token is.
        """
        if self.attempt is None or self.attempt != status.attempt:
            return False
        return status.attempt_token is None or self._proves(status.attempt_token)

    def belongs_to_standby(self, status: JobStatus) -> bool:
        """Written by the standby's VMs (``JobStatus.standby``): its number and its own secret."""
        sb = status.standby
        return sb is not None and self.attempt == sb.attempt and self._proves(sb.token)

    def _proves(self, secret: str) -> bool:
        """Carries ``secret``: the token itself (read from its body), or its proof (its listing)."""
        if self.proof is None:
            return self.token == secret
        return _is_token(secret) and hmac.compare_digest(self.proof, token_proof(secret))


# A heartbeat's custom metadata (``Record.listed``). The proof of the token is its SHA-256, in hex.
# That is enough because of who sees it: only a principal that may list the bucket sees the
# listing, which is the controller and the bucket's readers, who can read every body, the token in
# it, anyway; trainers can neither list nor read the bucket (docs/deploy.md, "Threat model"). The token is 192
# random bits: its hash cannot be turned back into it, and only a heartbeat is ever judged by the
# hash (an exit record, a marker, a notice need the token itself), so what the hash lets one forge
# is a heartbeat, and only to whoever could read the token.
PROOF_KEY = "token_sha256"
MAX_METADATA_BYTES = 8 * 1024  # GCS's own bound on an object's custom metadata (keys and values)
_PROOF = re.compile(r"[0-9a-f]{64}")
# The body's fields a record is made of (``Record._judged``): all but the token, which the listing
# never carries.
_FIELDS = ("attempt", "instance", "exit_code", "node", "reason", "saved", "trainer_started", "step", "save_s",
           "upload_s", "saved_step", "pull_started", "pull_ended", "pull_s")
# An exit record's reason, as a status keeps it: room for an image reference and the registry's words.
DETAIL_MAX = 600


def token_proof(token: str) -> str:
    """The proof of an attempt's token that a heartbeat's listing carries: its SHA-256, in hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def listing_metadata(body: Mapping[str, object]) -> dict[str, str]:
    """The custom metadata a VM agent writes with a heartbeat of this body (deploy/vm/common.sh's
    ``record`` does the same in bash): each field a record is made of, as its JSON text, and the
    token's proof where the body carries a token (no proof: the listing cannot say, the body is read)."""
    out = {key: json.dumps(body[key]) for key in _FIELDS if key in body}
    token = body.get("token")
    if _is_token(token):
        out[PROOF_KEY] = token_proof(token)
    return out


def _is_token(value: object) -> TypeGuard[str]:
    """A token as a record may carry one: a string of 1 to 256 characters."""
    return isinstance(value, str) and 0 < len(value) <= 256


def _instant(value: object) -> datetime | None:
    """An RFC 3339 time with its offset (``2026-01-01T00:00:00.123Z``), or None: anything else
    (no offset, a number, a date out of range, 64 KiB of digits) says nothing."""
    if not isinstance(value, str) or not 20 <= len(value) <= 40:
        return None
    try:
        when = datetime.fromisoformat(value)
        return when.astimezone(timezone.utc) if when.utcoffset() is not None else None
    except (ValueError, OverflowError):  # not a time, or one whose UTC is before year 1
        return None


def _seconds(value: object) -> float | None:
    """A duration a trainer measured, in seconds: finite, from 0 to MAX_REPORTED_S, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and not 0 <= value <= MAX_REPORTED_S:
        return None  # a JSON integer of 4000 digits: too large for a float
    number = float(value)
    return number if math.isfinite(number) and 0.0 <= number <= MAX_REPORTED_S else None


def _whole(value: object, low: int, high: int) -> int | None:
    """An integer in [low, high] as JSON gives it (1, 1.0), or None (bools, 1e999, NaN, strings...)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None  # also NaN and infinities
    number = int(value)
    return number if low <= number <= high else None


SLOT_HOLDER = "job"  # a slot object's custom metadata: the trial holding it, read from the listing


@dataclass(frozen=True)
class Slots:
    """A sweep's admission as the pass listed it (``sweeps/<sweep>/``): at most ``limit`` trials hold
    a slot (``slots/<k>``, k < limit); ``holders``: k -> (the trial holding it, the object's
    generation). ``limit`` None: the sweep's record could not be read (``problem`` says why), and
    no trial is admitted."""

    sweep: str
    limit: int | None
    holders: Mapping[int, tuple[str, int]] = field(default_factory=dict)
    problem: str | None = None

    def held_by(self, job: str) -> list[tuple[int, int]]:
        """(k, generation) of each slot ``job`` holds, lowest k first."""
        return sorted((k, generation) for k, (holder, generation) in self.holders.items() if holder == job)

    def free(self) -> list[int]:
        return [k for k in range(self.limit or 0) if k not in self.holders]


@dataclass(frozen=True)
class JobView:
    job: str
    spec: JobSpec | None = None
    problems: tuple[str, ...] = ()  # why the spec cannot run; non-empty means invalid
    spec_generation: int | None = None
    cancelled: bool = False
    status: JobStatus | None = None
    status_generation: int = 0  # 0: no status.json yet (create-only precondition)
    marker: Record | None = None
    exit: Record | None = None  # jobs/<job>/exit: rank 0's (and, from older agents, a worker's failure)
    # jobs/<job>/nodes/<rank>/exit: each worker's own exit record (rank > 0, ``node`` from its name).
    node_exits: tuple[Record, ...] = ()
    heartbeat: Record | None = None
    # jobs/<job>/notice: a VM's preemption notice (its agent writes it at once, token-signed);
    # jobs/<job>/ready: a held VM (a standby) waiting at the starting line, re-written while it waits.
    notice: Record | None = None
    ready: Record | None = None
    instances: tuple[Instance, ...] = ()
    stop_reasons: Mapping[str, StopReason] = field(default_factory=dict)
    stopped_at: Mapping[str, datetime] = field(default_factory=dict)  # when Compute recorded each (``Stopped.at``)
    checkpoint: CheckpointRef | None = None
    checkpoint_loaded: bool = False  # observed lazily, only when a plan launches or fails
    checkpoint_error: str | None = None  # why the checkpoint prefix could not be listed
    records_fresh: bool = False  # marker and exit record re-read after the instance list
    unreachable: tuple[str, ...] = ()  # zones the instance list could not see this pass
    unseen_projects: tuple[str, ...] = ()  # projects whose instance list failed this pass
    unseen_why: Mapping[str, str] = field(default_factory=dict)  # project -> why its list failed
    # TPU zones the project may not use (the TPU list's 403 on the location), zone -> why: never
    # tried, and never "not seen" either (nothing of the job's can be there).
    denied_zones: Mapping[str, str] = field(default_factory=dict)
    # Capacity advice for the spec's zones, asked only when a plan launches under capacity placement.
    advice: Mapping[str, ZoneAdvice] | None = None
    advice_model: str | None = None  # the provisioning model it was asked for
    advice_loaded: bool = False
    advice_error: str | None = None  # why there is none: the zones then keep the spec's order
    slots: Slots | None = None  # a sweep's trial: its sweep's slots (read every pass the trial is seen)
    other_slots: tuple[Slots, ...] = ()  # sweeps the job still holds a slot in but is no trial of now

    @property
    def has_spec(self) -> bool:
        return self.spec is not None or bool(self.problems)

    @property
    def exits(self) -> tuple[Record, ...]:
        """Every exit record of the job: rank 0's, then each worker's."""
        return (*((self.exit,) if self.exit else ()), *self.node_exits)

    def deciding_exit(self, status: JobStatus) -> Record | None:
        """The exit record that decides the current attempt: None while none of its own is there.

        Rank 0's ``exit 0`` is the job's success, unless a rank's failure (a non-zero or
        unreadable exit code) of the same attempt landed before it or with it (GCS's
        ``updated``, one clock for every node): a node that failed first failed the gang,
        whatever rank 0 did next. A failure that landed after rank 0's exit 0 is a rank
        falling off the collective rank 0 left, and changes nothing. Among failures, the first
        to land decides; a worker's exit 0 decides nothing (rank 0's does).
        """
        mine = [r for r in self.exits if r.belongs_to(status)]
        failures = [r for r in mine if r.exit_code != 0]
        first = min(failures, key=lambda r: r.updated) if failures else None
        success = self.exit if self.exit is not None and self.exit.belongs_to(status) and self.exit.exit_code == 0 else None
        if success is not None and (first is None or first.updated > success.updated):
            return success
        return first

    def records(self) -> tuple[Record, ...]:
        """The VM records a decision consumes or a cleanup deletes: the marker, the notice and every
        exit record."""
        return (*((self.marker,) if self.marker else ()), *((self.notice,) if self.notice else ()), *self.exits)

    def advice_for(self, model: str) -> Mapping[str, ZoneAdvice] | None:
        """The advice an attempt on ``model`` is placed by: asked for that model, under capacity placement."""
        capacity = self.spec is not None and self.spec.placement_for(model) == "capacity"
        return self.advice if capacity and self.advice_model == model else None

    def zone_order(self, model: str, now: datetime | None = None) -> tuple[str, ...]:
        """The spec's zones, best first, for an attempt on ``model`` (see ``controller.core.placement``);
        with ``now``, a zone the job saw stock out since its advice may have been asked ranks
        without that advice."""
        assert self.spec is not None
        recent = placement.stocked_out(self.status.history, now - placement.ADVICE_MAX_AGE) \
            if now is not None and self.status is not None else {}
        costs = ledger.run_costs(self.status.ledger) if self.status is not None else (None, None)
        order = placement.zone_order(self.spec, model, self.advice_for(model), recent, *costs)
        return tuple(z for z in order if z not in self.denied_zones)


@dataclass(frozen=True)
class World:
    jobs: Mapping[str, JobView]
    unreachable: tuple[str, ...] = ()
    unseen_projects: Mapping[str, str] = field(default_factory=dict)  # project -> why
    failed: Mapping[str, str] = field(default_factory=dict)  # job -> why it could not be observed
    transient: frozenset[str] | set[str] = frozenset()  # those of ``failed`` a retry may see (TransientError)

    def joined(self, other: World) -> World:
        """This world and another part of the same pass (``Observer.parts``): jobs, blind zones,
        projects and failures of both."""
        return World({**self.jobs, **other.jobs}, tuple(dict.fromkeys((*self.unreachable, *other.unreachable))),
                     {**self.unseen_projects, **other.unseen_projects}, {**self.failed, **other.failed},
                     frozenset({*self.transient, *other.transient}))
