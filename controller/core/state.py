"""``jobs/<job>/status.json``: the controller's memory of a job, and its audit trail.

Only ever written by compare-and-swap on the object's generation, so whichever pass
commits a decision first wins and every other concurrent pass backs off.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, TypeVar

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, SerializerFunctionWrapHandler,
                      field_serializer, model_validator)

from controller.core.checkpoints import Found
from controller.core.durations import Instant, measured
from controller.core.ledger import Ledger, Lifetime
from controller.core.runs import RunSummary, checkpoint_root, run_id
from controller.core.spec import Checkpoint, Notify

HISTORY_LIMIT = 100
# A status stays small however long a job runs: its history, past runs, ledger and ids are kept to
# their newest (HISTORY_LIMIT, runs.RUNS_KEPT, ledger.*_KEPT, IDS_KEPT), and its words are cut at
# TEXT_LIMIT characters, names at NAME_LIMIT (a Compute error, a trainer's reason: text from outside). A status at every
# bound at once is under STATUS_BOUND bytes (tests/unit/test_status_bound.py).
TEXT_LIMIT = 500
NAME_LIMIT = 80
ERRORS_KEPT = 50  # a spec's problems, as its status lists them
STATUS_BOUND = 256 * 1024
IDS_KEPT = 50  # instance ids remembered (name -> id), the newest


class Phase(StrEnum):
    PENDING = "PENDING"
    QUEUED = "QUEUED"  # a sweep's trial waiting for one of its sweep's slots (max_parallel)
    PROVISIONING = "PROVISIONING"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED)


def _cut(text: str | None, limit: int = TEXT_LIMIT) -> str | None:
    return text if text is None or len(text) <= limit else text[:limit - 1] + "…"


def _name(text: str | None) -> str | None:
    """An event's kind, an instance's or a zone's name: a few dozen characters (63 at most for a name)."""
    return _cut(text, NAME_LIMIT)


class Event(BaseModel):
    """One line of a job's history: what was decided or done, and why, in words."""

    model_config = ConfigDict(frozen=True)

    at: Instant
    # Cut where they are written (a serializer: parsing, every pass, stays pydantic-core's alone).
    event: Annotated[str, PlainSerializer(_name)]
    attempt: int = 0
    detail: Annotated[str, PlainSerializer(_cut)] = ""
    instance: Annotated[str | None, PlainSerializer(_name)] = None
    zone: Annotated[str | None, PlainSerializer(_name)] = None
    since: Instant | None = None  # when it happened, where that is known and earlier (a VM's marker)
    # A loss no VM told of (a hard preemption, a host error): when Compute recorded it (the start
    # of its zone operation), where that is earlier than the pass that saw it.
    recorded: Instant | None = None
    trainer_started: Instant | None = None  # the attempt's trainer started, by its VM's clock (its records)
    # An image: job's pull of its image on the attempt's VM (its records, the VM's clock).
    pull_started: Instant | None = None
    pull_ended: Instant | None = None
    # The attempt's progress as its trainer reported it (its records, through the VM agent): the
    # furthest step it finished, and its newest save's write (blocking) and upload times.
    step: int | None = None
    save_s: float | None = None
    upload_s: float | None = None


class CheckpointRef(BaseModel):
    model_config = ConfigDict(frozen=True)

    uri: str
    step: int | None = None
    version: int = 0  # generation of the object that proves it complete; moves on every save
    tag: str | None = None  # the name the framework loads it by: DeepSpeed's tag, Megatron's iteration
    saved_at: Instant | None = None  # when the save was complete (its last object)
    write_s: float | None = None  # how long its writing took: the checkpoint cost C

    @classmethod
    def of(cls, found: Found) -> CheckpointRef:
        return cls(uri=found.uri, step=found.step, version=found.version, tag=found.tag, saved_at=found.saved_at,
                   write_s=found.write_s)


def _a_fraction_or_none(value: Any) -> float | None:
    """A share from 0 to 1, or None (a hand-written 7, NaN or "high")."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) and 0.0 <= number <= 1.0 else None


class ZoneScore(BaseModel):
    """Compute's capacity advice for one zone, as it stood when an attempt chose its zone."""

    model_config = ConfigDict(frozen=True)

    obtainability: float | None = None
    uptime_s: float | None = None  # estimatedUptime: the majority of Spot VMs' run time, best effort
    # preemptionRate, latest interval: of the Spot VMs that stopped, the fraction 0..1 preempted
    # (not a rate per day); anything else (a hand-edited status) reads as unknown.
    preemption_rate: Annotated[float | None, BeforeValidator(_a_fraction_or_none)] = None
    spot_price_h: float | None = None  # the Spot list price per VM-hour (capacityHistory priceHistory)
    # What the advice was asked about (``prices.shape``): its price is that shape's alone. None in a
    # status written before it was recorded: then no attempt is priced by it.
    shape: str | None = None
    # What placement made of it (controller.core.placement.Worth): the zone's expected goodput,
    # useful hours per dollar where priced, and the figure the zones were ranked by.
    goodput: float | None = None
    per_dollar: float | None = None
    value: float | None = None


def _a_duration_or_none(value: Any) -> Any:
    """Seconds a clock could have measured, or None (a hand-written NaN, infinity or 1e300)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) if measured(value) else None
    return value


def _a_lifetime_or_none(value: Any) -> Any:
    """A time between losses whose estimate and bounds are positive numbers, or None: a hand-written
    NaN, or an infinity the controller wrote itself (a ledger edited to 1e308 s RUNNING), which
    JSON holds as null and a status that kept it would no longer read."""
    figures = value if isinstance(value, Mapping) else value.__dict__ if isinstance(value, Lifetime) else None
    if figures is None:
        return value
    sane = all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0
               for x in (figures.get(k) for k in ("mean_s", "low_s", "high_s")))
    return value if sane else None


def _ids_only(value: Any) -> Any:
    """Compute's instance ids are decimal numbers; anything else (a hand-written status) is dropped,
    never quoted into a log query."""
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str) and v.isdigit() and v.isascii()}
    return value


def recorded_notify(notify: Notify | None) -> Notify | None:
    """A job's own destinations as ``status.json`` keeps them: its topic, never a webhook URL.

    Any reader of the bucket may read a status, and a webhook's URL is its credential (whoever has
    it posts to the channel). The status keeps the topic so that a job cancelled by deleting its
    spec still tells it; its webhook went with its spec and is not told of that cancel."""
    if notify is None or notify.topic is None:
        return None
    return notify if notify.webhook is None else Notify(topic=notify.topic)


def _without_webhook(value: Any) -> Any:
    """A status read with a webhook URL (written by an older controller, or by hand) drops it:
    it is neither posted to nor written again."""
    if isinstance(value, dict):
        rest = {k: v for k, v in value.items() if k != "webhook"}
        return rest if rest.get("topic") else None
    return recorded_notify(value) if isinstance(value, Notify) else value


class Standby(BaseModel):
    """The next attempt, launched at the current one's preemption notice (or Compute's word that
    it is being preempted) while the current one still saves: its VMs boot and prepare, then wait
    at the starting line (metadata ``respawn-hold``) for the go that only the controller gives
    (``respawn-go``, by ``instances.setMetadata``), once the current attempt's save is in.

    Committed (status CAS) before its insert, as an attempt is; it becomes the current attempt
    (``planner._promote``) when the current one is lost, or is withdrawn past ``until`` if the
    current one is still RUNNING then (a notice that came to nothing): one VM, never two."""

    model_config = ConfigDict(frozen=True)

    attempt: int
    project: str
    zone: str
    instances: tuple[str, ...]
    token: str  # the attempt's secret, as ``JobStatus.attempt_token`` once promoted
    provisioning: str  # its model: the current attempt's
    since: Instant  # when the controller saw the notice (or Compute's preemption)
    until: Instant  # the starting line's bound: the notice, plus the 30 s shutdown and 5 s of slack
    cause: str  # what launched it, in words ("preemption notice from demo-2", ...)
    spec_generation: int | None = None  # the spec its VMs were made from: another one withdraws it
    placement: int = 0  # capacity errors of its inserts: part of its request id
    inserted: bool = False
    inserted_at: Instant | None = None


T = TypeVar("T")
# What a status holds besides its head: read only when a pass uses it (``JobStatus.split``).
PAST = ("history", "runs")


class Later(Sequence[T]):
    """A tuple made when first used (``make()``), its length known before: a status's history and
    past runs as the observer hands them over (``JobStatus.joined``). A pass over a job whose plan
    is to do nothing never reads them, and parsing them was most of a steady tick's CPU (a status at
    its history limit: 55 KB, about 1 ms to parse, four fifths of it history and past runs).

    It is the tuple it stands for in every way a reader can tell (equality, hashing, slicing,
    concatenation), and is written as that tuple."""

    __slots__ = ("_make", "_items", "_length", "_lock")

    def __init__(self, make: Callable[[], tuple[T, ...]], length: int) -> None:
        self._make: Callable[[], tuple[T, ...]] | None = make
        self._items: tuple[T, ...] | None = None
        self._length = length
        self._lock = threading.Lock()

    @property
    def items(self) -> tuple[T, ...]:
        if self._items is None:
            with self._lock:
                if self._items is None:
                    assert self._make is not None
                    self._items = tuple(self._make())
                    self._make = None
        return self._items

    def __len__(self) -> int:
        return self._length if self._items is None else len(self._items)

    def __getitem__(self, index: Any) -> Any:
        return self.items[index]

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)

    def __reversed__(self) -> Iterator[T]:
        return reversed(self.items)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Later):
            other = other.items
        return isinstance(other, tuple) and self.items == other

    def __hash__(self) -> int:
        return hash(self.items)

    def __add__(self, other: tuple[T, ...]) -> tuple[T, ...]:
        return self.items + tuple(other)

    def __radd__(self, other: tuple[T, ...]) -> tuple[T, ...]:
        return tuple(other) + self.items

    def __repr__(self) -> str:
        return repr(self.items) if self._items is not None else f"Later({self._length} items, unread)"

    def __reduce__(self) -> tuple[type, tuple[tuple[T, ...]]]:
        """Pickled and deep-copied as the tuple (its lock would not be)."""
        return tuple, (self.items,)


class _Past(BaseModel):
    """A status's history and past runs, parsed apart from its head (``JobStatus.split``)."""

    history: tuple[Event, ...] = ()
    runs: tuple[RunSummary, ...] = ()


class JobStatus(BaseModel):
    """Everything the planner must remember between passes; the rest is observed anew."""

    model_config = ConfigDict(frozen=True)

    phase: Phase = Phase.PENDING
    message: str = ""
    errors: tuple[str, ...] = ()
    spec_generation: int | None = None
    # The sweep whose slot the run's trial holds (its spec's, when the run began): a trial whose spec
    # is deleted still gives its slot back (controller.service.observe ``_with_slots``).
    sweep: str | None = Field(default=None, max_length=64)
    # What the trainer of the attempt that ended the run wrote to RESPAWN_RESULT_FILE, as JSON (or,
    # where it was no JSON, {"unreadable": why}); None: it wrote nothing (``sweep status`` says so).
    result: Any = None

    attempt: int = 0
    project: str | None = None
    zone: str | None = None
    instances: tuple[str, ...] = ()
    # The job has run on a Cloud TPU node (spec.tpu) in this run or an earlier one: its
    # zones are listed for TPU nodes too, so that none is left behind when the spec changes.
    tpu: bool = False
    # The same for a TPU slice in Compute Engine (spec.tpu.machine_type): its projects' instances
    # and MIGs are listed for slices. (``tpu`` is the Cloud TPU API's alone.)
    tpu_compute: bool = False
    attempt_tpu: bool = False  # the current attempt was committed as a TPU node (not VMs), of either API
    attempt_compute: bool = False  # ... as a TPU slice in Compute Engine (not a Cloud TPU API node)
    upcoming_maintenance: str | None = None  # a TPU node's announced maintenance, while it is
    inserted: bool = False  # the current attempt's insert was acknowledged by Compute
    inserted_at: Instant | None = None  # when it was: startup grace counts from here
    settling: bool = False  # a node is in a state we wait out (REPAIRING, UNKNOWN...)
    settling_since: Instant | None = None
    recovering_since: Instant | None = None  # when the current attempt was given up
    resumed_at: Instant | None = None  # when every node was RUNNING again after settling
    # A secret only this attempt's VMs receive (instance metadata); a VM record without
    # it is not this attempt's and is ignored. None for attempts begun before tokens.
    attempt_token: str | None = None
    placement: int = 0  # capacity failures within this attempt; part of the request id
    provisioning: str | None = None  # the current attempt's model (spot, standard, flex-start)
    model_since: Instant | None = None  # when the job stepped down to it (step back up after policy.fallback)
    capacity_misses: int = 0  # capacity errors in a row on the current model
    capacity_since: Instant | None = None  # the first of them
    zone_advice: dict[str, ZoneScore] = Field(default_factory=dict)  # what placement knew at the last launch
    advice_at: Instant | None = None
    resume_from: CheckpointRef | None = None
    # Zero-gap recovery (Standby): the next attempt booting beside this one, if any; whether this
    # attempt's VMs were made to wait at the starting line (a promoted standby), and when the go was
    # given (its checkpoint is ``resume_from``); the highest attempt number a withdrawn standby
    # took, never used again (its VMs, if a delete failed, are husks, never this run's attempt).
    standby: Standby | None = None
    held: bool = False
    go_at: Instant | None = None
    withdrawn: int = 0
    # The preemption notice this attempt asked Compute for (seconds: 0 or 120), and why the project
    # refused it, if it did (a Preview field): then this run asks for none again.
    notice_s: int = 0
    notice_refused: str | None = None
    # This job's own VMs that held the quota an insert was refused for (they are still going down):
    # the insert is tried again as soon as none of them is up, never a zone's or region's cooldown.
    quota_held_by: tuple[str, ...] = ()

    created_at: Instant | None = None
    started_at: Instant | None = None  # first attempt launched: the max_runtime clock
    attempt_started_at: Instant | None = None
    not_before: Instant | None = None  # backoff or zone cooldowns
    zone_cooldowns: dict[str, Instant] = Field(default_factory=dict)  # the current model's
    zone_rejections: dict[str, str] = Field(default_factory=dict)  # zone -> Compute's 400/404 there
    # The other models' cooldowns, kept while the job is on another (model -> zone -> until):
    # a model it may go back to is tried again only where it is not cooling.
    model_cooldowns: dict[str, dict[str, Instant]] = Field(default_factory=dict)
    # Models Google refused in every zone in this run (a 400 or 404: "SPOT is not supported for
    # this machine type"), model -> its refusals: never tried again in this run.
    refused_models: dict[str, str] = Field(default_factory=dict)

    restarts: int = 0
    preemptions: int = 0
    failures: int = 0
    recycles: int = 0
    stalled_failures: int = 0  # failures in a row with no checkpoint progress
    stalled_at: CheckpointRef | None = None

    # name -> Compute id, to find their logs (a log query quotes them: only digits, as Compute's ids are)
    instance_ids: Annotated[dict[str, str], BeforeValidator(_ids_only)] = Field(default_factory=dict)
    # Young/Daly's checkpoint interval for the current attempt (ledger.checkpoint_every), given to
    # its trainer as RESPAWN_CHECKPOINT_EVERY_S; None while the run has no measure of C or M.
    checkpoint_every_s: Annotated[float | None, BeforeValidator(_a_duration_or_none)] = None
    # The M that interval rests on (ledger.lifetime): the estimate, how sure, and from what.
    lifetime: Annotated[Lifetime | None, BeforeValidator(_a_lifetime_or_none)] = None
    ledger: Ledger = Ledger()  # goodput: attempts, losses, totals (controller.core.ledger)
    # The spec's own topic at the last launch, told of the end if the spec goes; never its webhook
    # (recorded_notify: the URL is a secret, and any bucket reader reads this object).
    notify: Annotated[Notify | None, BeforeValidator(_without_webhook)] = None
    history: tuple[Event, ...] = ()
    event_count: int = 0  # events ever appended: which of ``history`` a commit adds (accounting.settle)
    # The run (controller.core.runs): its id, set when it began (None in a status written before
    # runs had ids: then ``run`` is read from ``created_at``, the same stamp); where its checkpoints
    # go when not the spec's own prefix (a fresh run's, or one inherited from the run before); and
    # whether it began fresh, ignoring earlier runs' checkpoints.
    run_id: str | None = None
    checkpoint_uri: str | None = None
    fresh: bool = False
    runs: tuple[RunSummary, ...] = ()  # the past runs of this job name, oldest first (runs.RUNS_KEPT)

    @model_validator(mode="before")
    @classmethod
    def _ledger_of_known_origin(cls, data: Any) -> Any:
        """A ledger read without ``folded`` (written before it existed) already holds what it
        holds: taken as up to date with the status's events, never folded from them again."""
        if isinstance(data, dict) and isinstance(data.get("ledger"), dict) and "folded" not in data["ledger"]:
            count = data.get("event_count")
            return {**data, "ledger": {**data["ledger"], "folded": count if isinstance(count, int) else 0}}
        return data

    @field_serializer("message")
    def _message_cut(self, message: str) -> str:
        """``but(message=...)`` copies without validating: the bound is kept where it is written."""
        return _cut(message) or ""

    @field_serializer("errors")
    def _errors_cut(self, found: tuple[str, ...]) -> list[str]:
        return [_cut(e) or "" for e in found[:ERRORS_KEPT]]

    @field_serializer("notify")
    def _notify_as_written(self, notify: Notify | None) -> dict[str, Any] | None:
        """Whatever a copy was given (``model_copy`` does not validate), no webhook URL is written."""
        kept = recorded_notify(notify)
        return kept.model_dump(mode="json") if kept is not None else None

    def but(self, *events: Event, **changes: object) -> JobStatus:
        """A copy with ``changes`` applied and ``events`` appended to the bounded history."""
        history = (*self.history, *events)[-HISTORY_LIMIT:]
        return self.model_copy(update={**changes, "history": history, "event_count": self.event_count + len(events)})

    def with_ids(self, ids: Mapping[str, str]) -> JobStatus:
        """A copy that also knows these instances' Compute ids (name -> id), to find their logs
        once they are gone: the current attempt's all, and the newest others up to ``IDS_KEPT``.
        Itself when it knew them all."""
        fresh = {name: id_ for name, id_ in ids.items() if id_ and self.instance_ids.get(name) != id_}
        if not fresh:
            return self
        kept = {**{n: i for n, i in self.instance_ids.items() if n not in fresh}, **fresh}
        # The current attempt's are kept whole, however many nodes it has; older ones make room.
        current = {n: i for n, i in kept.items() if n in self.instances}
        older = [n for n in kept if n not in current]
        room = max(0, IDS_KEPT - len(current))
        older = older[len(older) - room:] if room else []
        return self.model_copy(update={"instance_ids": {**{n: kept[n] for n in older}, **current}})

    def to_json(self) -> bytes:
        return self.model_dump_json(indent=1).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> JobStatus:
        return cls.model_validate_json(raw)

    @field_serializer(*PAST, mode="wrap")
    def _as_tuples(self, value: Sequence[Any], handler: SerializerFunctionWrapHandler) -> Any:
        """A ``Later`` (``joined``) is written as the tuple it stands for."""
        return handler(tuple(value))

    @staticmethod
    def split(raw: bytes) -> tuple[bytes, bytes, tuple[int, int]]:
        """A status's JSON, already known to parse (``from_json``), as its head (every field but
        the history and the past runs), those two, and their lengths: ``joined``'s arguments."""
        whole = json.loads(raw)
        past = {key: whole.pop(key, []) for key in PAST}
        return json.dumps(whole).encode(), json.dumps(past).encode(), (len(past["history"]), len(past["runs"]))

    @classmethod
    def joined(cls, head: bytes, past: Callable[[], bytes], lengths: tuple[int, int],
               otherwise: Callable[[], bytes] | None = None) -> JobStatus:
        """The status ``split`` took apart, its head parsed now and its history and past runs
        (``past()``'s bytes) when first used (``Later``). ``otherwise``: for a past that came from
        elsewhere than a read of the status (controller.service.snapshot), the past as a read of
        the status gives it, used when ``past()`` raises ValueError, does not validate, or holds
        other lengths than ``lengths`` say (without it, those raise)."""
        status = cls.model_validate_json(head)
        cell: list[_Past] = []

        def parsed() -> _Past:
            if not cell:
                try:
                    found = _Past.model_validate_json(past())
                    if (len(found.history), len(found.runs)) != tuple(lengths):
                        raise ValueError(f"a past of {len(found.history)} events and {len(found.runs)} runs, "
                                         f"not {lengths[0]} and {lengths[1]}")
                except ValueError:
                    if otherwise is None:
                        raise
                    found = _Past.model_validate_json(otherwise())
                cell.append(found)
            return cell[0]

        return status.model_copy(update={"history": Later(lambda: parsed().history, lengths[0]),
                                         "runs": Later(lambda: parsed().runs, lengths[1])})

    @property
    def run(self) -> str | None:
        """This run's id (controller.core.runs.run_id)."""
        return self.run_id or (run_id(self.created_at) if self.created_at else None)

    def checkpoints(self, checkpoint: Checkpoint) -> Checkpoint:
        """The spec's ``checkpoint`` as this run reads and writes it: under the run's own prefix
        where it has one (``runs.checkpoint_root``), so that every attempt of a fresh run, and every
        pass that lists its checkpoints, sees its saves only."""
        root = checkpoint_root(checkpoint.uri, self.checkpoint_uri)
        return checkpoint if root == checkpoint.uri else checkpoint.model_copy(update={"uri": root})

    def same_run(self, other: JobStatus | None) -> bool:
        return other is not None and other.created_at == self.created_at

    @property
    def accepted(self) -> Event | None:
        """The event that began this run (its "accepted"), while the history still holds it."""
        return next((e for e in reversed(self.history) if e.event == "accepted" and e.at == self.created_at), None)

    def added_to(self, before: JobStatus | None) -> tuple[Event, ...]:
        """The events this status adds to ``before`` (as last committed): what one commit
        decided. Across a new run, the new run's own events (from its "accepted" on)."""
        if self.same_run(before):
            assert before is not None
            fresh = self.event_count - before.event_count
        else:
            accepted = self.accepted
            fresh = next((back for back, e in enumerate(reversed(self.history), start=1) if e is accepted),
                         self.event_count)
        fresh = max(0, min(fresh, len(self.history)))
        return self.history[len(self.history) - fresh:] if fresh else ()

