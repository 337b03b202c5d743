"""Zero-gap recovery as a person reads it (issue 34): the next attempt booting beside the one a
preemption notice condemned, waiting at its starting line, then started from the old one's save.

One sentence a job, written here once for every view (``respawn status`` and its JSON, ``respawn
logs``' headers, ``respawn report``, the dashboard, the demo); the longest below is 76 characters
(within 80 columns under the status table's 4-space indent), and a longer job name or zone wraps
between words:

- ``demo-3 booting in us-central1-b while demo-2 saves (its trainer at step 153)``: the standby
  was inserted at the notice; the step is the old trainer's, from its heartbeat, where read;
- ``demo-3 at the starting line since 12:03:04 UTC, waiting for demo-2's save``: its rank 0's
  ready record came (``waiting_since``, by its VM's clock);
- ``demo-3 given the go at 12:03:20 UTC, to start from step 153``: promoted, its trainer not
  started yet;
- ``demo-3 started from step 153, 4.2s after demo-2's save``: its trainer's start (its VM's clock)
  less the time the save it resumed from was complete (Cloud Storage's).

Pure: the caller reads the ready record (``at_line`` judges it) and the old trainer's step. The
status does not record when a standby reached its line; only its ready record says so, while the
standby waits (the controller cleans it up once the trainer is past the line).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta

from controller.core import names
from controller.core.durations import format_duration
from controller.core.ledger import Span
from controller.core.ports import BlobInfo
from controller.core.state import Event, JobStatus
from controller.core.world import MAX_RECORD_BYTES, Record

GIVEN_THE_GO = "giving the go to"  # a promoted standby's launch event says this (transitions.begin_attempt's verb)


@dataclass(frozen=True)
class AtLine:
    """A standby's rank 0 at its starting line: since ``at`` (its ``waiting_since``), or, where its
    record does not say, by ``at`` (Cloud Storage's time of the record)."""

    at: datetime
    since: bool = True


def at_line(info: BlobInfo, data: bytes, status: JobStatus) -> AtLine | None:
    """What the job's ready record (``jobs/<job>/ready``) says of its standby; None when it is not
    the standby's (another attempt's, a forger's without its token, unreadable): written by a
    trainer VM, every field is checked."""
    record = Record.parse(info, data)
    if not record.belongs_to_standby(status):
        return None
    when = None
    if len(data) <= MAX_RECORD_BYTES:
        try:
            body = json.loads(data)
        except (ValueError, RecursionError):
            body = None
        when = _instant(body.get("waiting_since")) if isinstance(body, dict) else None
    return AtLine(when, True) if when is not None else AtLine(record.updated, False)


def _instant(value: object) -> datetime | None:
    """An RFC 3339 time with its offset, else None (the agent writes ``2026-01-01T00:00:00Z``)."""
    if not isinstance(value, str) or not 20 <= len(value) <= 40:
        return None
    try:
        when = datetime.fromisoformat(value)
    except (ValueError, OverflowError):
        return None
    return when if when.utcoffset() is not None else None


def who(job: str, attempt: int, nodes: int) -> str:
    """An attempt as the lines name it: its VM (``demo-3``), or its gang (``g-3 (4 nodes)``)."""
    return f"{job}-{attempt}" if nodes <= 1 else f"{job}-{attempt} ({nodes} nodes)"


CREATING, BOOTING, AT_LINE, GIVEN_GO, STARTED = "creating", "booting", "at the line", "given the go", "started"


def stage(status: JobStatus, ready: AtLine | None = None) -> str | None:
    """Where the job's zero-gap recovery stands: its standby ``CREATING`` (committed, not accepted
    yet), ``BOOTING``, ``AT_LINE`` (its ready record came); its current attempt, a standby once,
    ``GIVEN_GO`` or ``STARTED`` (its trainer's start on record). None: no standby, and the current
    attempt was none (or the run is over)."""
    sb = status.standby
    if sb is not None:
        return (AT_LINE if ready is not None else BOOTING) if sb.inserted else CREATING
    if status.phase.terminal or (hand := current("", status)) is None:
        return None
    return GIVEN_GO if hand.started is None else STARTED


def line(job: str, status: JobStatus, ready: AtLine | None = None, step: int | None = None) -> str | None:
    """The job's overlap, in one sentence (module docstring); None when it has none (``stage``)."""
    where = stage(status, ready)
    sb = status.standby
    if sb is not None:
        new, old = who(job, sb.attempt, len(sb.instances)), who(job, status.attempt, len(status.instances))
        if where == AT_LINE and ready is not None:
            return f"{new} at the starting line {'since' if ready.since else 'by'} {_clock(ready.at)}, waiting for {old}'s save"
        trainer = f" (its trainer at step {step:,})" if step is not None and step >= 0 else ""
        return f"{new} {'booting' if where == BOOTING else 'being created'} in {sb.zone} while {old} saves{trainer}"
    hand = current(job, status)
    return hand.sentence() if where is not None and hand is not None else None


@dataclass(frozen=True)
class Handover:
    """An attempt that was a standby: booted beside the attempt before it (``old``) from ``booted``
    (Compute's acceptance, at the notice), given the go at ``go``, from ``step`` (None: scratch, or a
    save that records no step), whose save was complete at ``saved_at``; its trainer started at
    ``started`` (its VM's clock; None: not yet, or not recorded)."""

    new: str
    old: str
    attempt: int
    booted: datetime | None
    go: datetime
    step: int | None
    resumed: bool  # from a checkpoint (False: from scratch)
    saved_at: datetime | None
    started: datetime | None
    old_span: Span | None = None

    def sentence(self) -> str:
        start = f"step {self.step:,}" if self.step is not None else "its checkpoint" if self.resumed else "scratch"
        if self.started is None:
            return f"{self.new} given the go at {_clock(self.go)}, to start from {start}"
        if self.saved_at is None:
            return f"{self.new} started from {start}{_after(self.started - self.go, 'the go')}"
        whose = f"{self.old}'s save" if self._old_saved_it() else "that save"
        return f"{self.new} started from {start}{_after(self.started - self.saved_at, whose)}"

    def downtime_s(self) -> float | None:
        """From the save it resumed from being complete to its trainer's start (None where either is
        not known, or the clocks disagree by more than the gap)."""
        if self.started is None or self.saved_at is None:
            return None
        gap = (self.started - self.saved_at).total_seconds()
        return gap if gap >= 0 else None

    def _old_saved_it(self) -> bool:
        """The save was made while the attempt before ran (it, not an earlier one, wrote it)."""
        span = self.old_span
        if span is None or self.saved_at is None:
            return False
        start, end = span.start, span.end or self.go
        return _tz(start) is not None and _tz(end) is not None and start <= self.saved_at <= end


def _after(gap: timedelta, what: str) -> str:
    """', 4.2s after demo-2's save'; nothing where the gap is negative (a VM's clock behind GCS's)."""
    seconds = gap.total_seconds()
    return f" ({what})" if seconds < 0 else f", {said(seconds)} after {what}"


def said(seconds: float) -> str:
    """A gap as the lines say it: '4.2s' under 10 s, else '1m05s'."""
    return f"{seconds:.1f}s" if seconds < 10 else format_duration(timedelta(seconds=round(seconds)))


def _clock(when: datetime) -> str:
    return f"{when:%H:%M:%S} UTC"


def current(job: str, status: JobStatus) -> Handover | None:
    """The current attempt as a handover, where it was a standby given the go (``JobStatus.go_at``)."""
    if _tz(status.go_at) is None:
        return None
    spans = [s for s in status.ledger.spans if s.attempt <= status.attempt]
    span = spans[-1] if spans and spans[-1].attempt == status.attempt else None
    old = spans[-2] if span is not None and len(spans) > 1 else None
    ref = status.resume_from
    return Handover(new=who(job, status.attempt, len(status.instances) or 1),
                    old=who(job, old.attempt, old.nodes) if old else f"attempt {status.attempt - 1}",
                    attempt=status.attempt, booted=_tz(status.inserted_at), go=status.go_at,
                    step=ref.step if ref else None, resumed=ref is not None,
                    saved_at=_tz((ref.saved_at if ref else None) or (span.resumed_saved_at if span else None)),
                    started=_tz(span.trainer_started if span else None), old_span=old)


def handovers(job: str, status: JobStatus) -> list[Handover]:
    """Every attempt of the run that was a standby given the go, oldest first, as far as the history
    (its last 100 events) and the ledger (its last 20 attempts) keep them: its launch event is
    ``giving the go to`` with ``since`` (Compute's acceptance, at the notice)."""
    spans = {s.attempt: s for s in status.ledger.spans}
    ordered = sorted(spans)
    found: dict[int, Handover] = {}
    for e in status.history:
        if e.event != "launch" or _tz(e.since) is None or _tz(e.at) is None or GIVEN_THE_GO not in e.detail \
                or e.attempt not in spans:
            continue
        span = spans[e.attempt]
        before = [a for a in ordered if a < e.attempt]
        old = spans[before[-1]] if before else None
        found[e.attempt] = Handover(new=who(job, e.attempt, span.nodes),
                                    old=who(job, old.attempt, old.nodes) if old else f"attempt {e.attempt - 1}",
                                    attempt=e.attempt, booted=e.since, go=e.at, step=span.resumed_step,
                                    resumed=span.resumed_step is not None or span.resumed_saved_at is not None,
                                    saved_at=_tz(span.resumed_saved_at), started=_tz(span.trainer_started),
                                    old_span=old)
    if (now := current(job, status)) is not None:
        found[now.attempt] = found.get(now.attempt) or now
    return [found[a] for a in sorted(found)]


@dataclass(frozen=True)
class Withdrawn:
    """A standby given up before its go (a notice that came to nothing, its zone's refusal, its own
    VM lost at the line): its VMs were paid from Compute's acceptance (``since``) to ``at``."""

    attempt: int | None
    zone: str | None
    since: datetime
    at: datetime
    why: str


def withdrawn(status: JobStatus) -> list[Withdrawn]:
    """The run's withdrawn standbys that Compute had accepted, oldest first, as far as its history
    keeps them (one never accepted was never paid for)."""
    return [Withdrawn(_attempt_of(e), e.zone, since, at, e.detail) for e in status.history
            if e.event == "standby-withdrawn" and (since := _tz(e.since)) and (at := _tz(e.at)) and since <= at]


def _tz(when: datetime | None) -> datetime | None:
    """``when`` where it has a time zone; None for a time a hand edit left without one (a status is
    anyone's who may write the bucket: never compared with the controller's own times)."""
    return when if when is not None and when.utcoffset() is not None else None


def _attempt_of(e: Event) -> int | None:
    """The standby's number, from its first VM's name (``<job>-<attempt>[-n<rank>]``)."""
    parsed = names.parse_instance_name(e.instance or "")
    return parsed[1] if parsed else None


def waiting(job: str, status: JobStatus) -> str | None:
    """``respawn status JOB``'s word on its standby: what its go waits for, and when it is withdrawn
    instead (``controller.core.handover``: the line's bound; a notice that came to nothing)."""
    sb = status.standby
    if sb is None:
        return None
    new, old = who(job, sb.attempt, len(sb.instances)), who(job, status.attempt, len(status.instances))
    return (f"{new} gets the go once {old}'s save is in: its marker, or its VMs down, or {_clock(sb.until)} "
            f"if {old} is on its way down by then; still RUNNING then, {old} was not preempted and {new} is "
            "withdrawn")


def attempt_note(job: str, status: JobStatus, attempt: int) -> str | None:
    """What ``respawn logs`` says under an attempt's header of how it stood beside another, its
    times UTC as the log lines' own stamps are: the standby now booting, a standby given the go, a
    withdrawn one. None for any other attempt."""
    sb = status.standby
    if sb is not None and attempt == sb.attempt:
        since = f"from {sb.inserted_at:%H:%M:%S} " if _tz(sb.inserted_at) else ""
        return f"booted {since}at {who(job, status.attempt, len(status.instances))}'s notice; waits at the starting line"
    for hand in handovers(job, status):
        if hand.attempt == attempt:
            since = f"from {hand.booted:%H:%M:%S} " if hand.booted else ""
            start = f"step {hand.step:,}" if hand.step is not None else "its checkpoint" if hand.resumed else "scratch"
            return f"booted {since}at {hand.old}'s notice; the go at {hand.go:%H:%M:%S}, from {start}"
    for gone in withdrawn(status):
        if gone.attempt == attempt:
            return f"withdrawn at {gone.at:%H:%M:%S}, before its go: no trainer ran"
    return None
