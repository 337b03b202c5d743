"""What ``respawn logs JOB`` prints: the output of every attempt of the job's run, read from Cloud
Logging by instance id, in order, each under a header naming the attempt, its instances, zone and
how it ended; with ``follow``, what is written after, until stopped.

Where the output is, on Google: the serial console's log (``serial_port_1_output``, when the
project or VM sets ``serial-port-logging-enable``; written by the platform, whatever the VM's
account may do), else the guest agent's ``GCEMetadataScripts`` log (the startup script's output
line by line, as ``startup-script: LINE``; written with the VM's account, which needs
``roles/logging.logWriter``). Both hold the same lines: each attempt is read from the first that
has any, never both. Every query names a time bound of its own (the run's start), so the client's
default of the last 24 hours never hides an older attempt.

Printing is the caller's (``emit``, ``show``): this module reads and orders.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from controller.core import errors, names
from controller.core.ledger import ENDS, LOSS_CAUSES
from controller.core.ports import Instance
from controller.core.state import JobStatus

SERIAL = "serialconsole.googleapis.com%2Fserial_port_1_output"
SCRIPTS = "GCEMetadataScripts"
LOGS = (SERIAL, SCRIPTS)  # in order of preference
RETENTION = timedelta(days=30)  # Cloud Logging's default: nothing older is there to read
SLACK = timedelta(minutes=5)  # before the run's start: a VM's clock, an event's
LOOKBACK = timedelta(seconds=30)  # following: entries may land late, up to this much older than the newest
PAGE = 1000


@dataclass(frozen=True)
class Attempt:
    number: int
    instances: dict[str, str]  # name -> Compute id, by rank
    zone: str | None = None
    outcome: str | None = None  # how it ended (preempted, succeeded...), or the job's phase while it lasts

    def header(self) -> str:
        names_ = ", ".join(self.instances) or "no instance"
        where = f" in {self.zone}" if self.zone else ""
        end = f" ({self.outcome})" if self.outcome else ""
        return f"── attempt {self.number}: {names_}{where}{end} ──"


def attempts(job: str, status: JobStatus | None, live: Iterable[Instance] = ()) -> list[Attempt]:
    """The run's attempts, oldest first, from its status (the ids it recorded, its ledger and
    history) and the instances listed now (ids a status has not recorded yet)."""
    live = [i for i in live if i.job == job]
    ids = {**(status.instance_ids if status else {}), **{i.name: i.id for i in live if i.id}}
    by_attempt: dict[int, dict[str, str]] = {}
    for name, id_ in ids.items():
        parsed = names.parse_instance_name(name)
        if parsed and parsed[0] == job and id_:
            by_attempt.setdefault(parsed[1], {})[name] = id_
    spans = {s.attempt: s for s in status.ledger.spans} if status else {}
    numbers = sorted({*by_attempt, *spans})
    out = []
    for n in numbers:
        span = spans.get(n)
        zone = (span.zone if span else None) or _zone_in_history(status, n) or next(
            (i.zone for i in live if i.attempt == n), None)
        outcome = span.cause if span and span.cause else _outcome_in_history(status, n)
        if outcome is None and status is not None and n == status.attempt:
            outcome = status.phase.lower()
        found = by_attempt.get(n, {})
        out.append(Attempt(n, dict(sorted(found.items(), key=lambda kv: _rank(kv[0]))), zone, outcome))
    return out


def _rank(name: str) -> int:
    parsed = names.parse_instance_name(name)
    return (parsed[2] or 0) if parsed else 0


def _zone_in_history(status: JobStatus | None, attempt: int) -> str | None:
    events = [e for e in (status.history if status else ()) if e.attempt == attempt and e.zone
              and e.event in ("launch", "failover", "adopted", "inserted")]
    return events[-1].zone if events else None


def _outcome_in_history(status: JobStatus | None, attempt: int) -> str | None:
    ends = [e.event for e in (status.history if status else ()) if e.attempt == attempt
            and e.event in (*LOSS_CAUSES, *ENDS)]
    return ends[-1] if ends else None


def logs_filter(instance_ids: Iterable[str], projects: Sequence[str] = (), logs: Sequence[str] = (),
                since: datetime | None = None) -> str:
    """The Logging query for these instances' entries: of ``logs`` (LOG_IDs, in ``projects``) when
    given, at or after ``since`` when given."""
    # Compute's ids are decimal numbers (JobStatus keeps no other); one that is not is no id of
    # ours and is never quoted into the query, whoever wrote it.
    ids = " OR ".join(f'"{i}"' for i in sorted(set(instance_ids)) if i.isascii() and i.isdigit())
    parts = [f'resource.type="gce_instance" AND resource.labels.instance_id=({ids})']
    if logs:
        parts.append("logName=(" + " OR ".join(f'"projects/{p}/logs/{log}"' for p in projects for log in logs) + ")")
    if since is not None:
        parts.append(f'timestamp>="{since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}"')
    return " AND ".join(parts)


def run_start(status: JobStatus | None, now: datetime) -> datetime:
    """From when the run's entries are looked for: its start, a little before; at most the
    retention back."""
    begun = [t for t in (status.created_at if status else None,
                         *(s.start for s in (status.ledger.spans if status else ()))) if t]
    return max(min(begun) - SLACK, now - RETENTION) if begun else now - RETENTION


class JobLogs:
    """Reads and prints one job's logs. ``client``: a google-cloud-logging ``Client``; ``emit``
    prints a line; ``show`` makes a text printable (escapes control characters)."""

    def __init__(self, client: Any, job: str, projects: Sequence[str], emit: Callable[[str], None],
                 show: Callable[[str], str], limit: int = 200, guard: Callable[[], Any] | None = None) -> None:
        self.client, self.job, self.projects = client, job, list(dict.fromkeys(p for p in projects if p))
        self.emit, self.show, self.limit = emit, show, limit
        self.guard = guard  # a context manager factory around every call to Cloud Logging
        self.source: dict[int, str] = {}  # attempt -> the log its output is read from
        self.header: int | None = None  # the attempt whose header was printed last
        # The newest entry printed of each instance (by id): each VM stamps its agent's entries by
        # its own clock, so one that runs ahead must not move the look-back past another's entries.
        self.newest: dict[str, datetime] = {}
        self._seen: dict[str, datetime] = {}  # insert ids printed within LOOKBACK of their instance's newest
        self._cut: dict[int, datetime] = {}  # attempt -> its oldest line printed, where --limit left older ones out

    # -- every attempt, once -----------------------------------------------------------------
    def print_all(self, runs: list[Attempt], since: datetime) -> None:
        for attempt in runs:
            self._header(attempt)
            if not attempt.instances:
                self.emit("(no instance id recorded for this attempt: nothing to read)")
                continue
            entries, log = [], SERIAL
            for log in LOGS:
                entries = self._list(attempt.instances.values(), (log,), since, descending=True,
                                     limit=self.limit + 1)
                if entries:
                    break
            if not entries:
                self.emit("(no output in Cloud Logging)")
                continue
            self.source[attempt.number] = log
            if len(entries) > self.limit:
                self.emit(f"… earlier lines of this attempt left out (--limit {self.limit})")
                entries = entries[: self.limit]
                self._cut[attempt.number] = entries[-1].timestamp  # following must not bring them back
            for entry in reversed(entries):
                self._print(attempt, entry)

    # -- what comes after --------------------------------------------------------------------
    def follow(self, read: Callable[[], list[Attempt]], since: datetime, interval: float,
               stop_after: float | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        """Print entries as they land, every ``interval`` seconds, until interrupted or for
        ``stop_after`` seconds. ``read``: the attempts as the job's status says now (a new attempt
        is followed from its first entry)."""
        deadline = None if stop_after is None else time.monotonic() + stop_after
        while deadline is None or time.monotonic() < deadline:
            sleep(interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic())))
            try:
                runs = read()
                by_id = {id_: a for a in runs for id_ in a.instances.values()}
                # From the least advanced instance: one with nothing printed yet is read from ``since``.
                start = max(since, min((self.newest[i] - LOOKBACK if i in self.newest else since) for i in by_id)) \
                    if by_id else since
                found = self._list(by_id, LOGS, start, descending=False, limit=None) if by_id else []
            except errors.TransientError:
                continue  # a read refused for the quota, a network hiccup: the next one catches up
            for entry in found:
                attempt = by_id.get(_instance_id(entry))
                if attempt is None or _key(entry) in self._seen or entry.timestamp < self._cut.get(
                        attempt.number, entry.timestamp):
                    continue
                log = _log_id(entry)
                if self.source.setdefault(attempt.number, log) != log:
                    continue  # the same line, from the attempt's other log
                if self.header != attempt.number:
                    self._header(attempt)
                self._print(attempt, entry)

    # -- the parts -----------------------------------------------------------------------------
    def _list(self, ids: Iterable[str], logs: Sequence[str], since: datetime, descending: bool,
              limit: int | None) -> list[Any]:
        from google.cloud import logging as cloud_logging

        query = logs_filter(ids, self.projects, logs, since)
        order = cloud_logging.DESCENDING if descending else cloud_logging.ASCENDING
        resources = [f"projects/{p}" for p in self.projects]
        guard = self.guard() if self.guard else _Nothing()
        with guard:
            return list(self.client.list_entries(resource_names=resources, filter_=query, order_by=order,
                                                 max_results=limit, page_size=min(limit or PAGE, PAGE)))

    def _header(self, attempt: Attempt) -> None:
        self.header = attempt.number
        self.emit(self.show(attempt.header()))

    def _print(self, attempt: Attempt, entry: Any) -> None:
        payload = entry.payload
        if isinstance(payload, dict) and isinstance(payload.get("message"), str):
            # The guest agent's entries: a script's line as the serial console has it.
            payload = re.sub(r"^(startup|shutdown)-script: ", "", payload["message"])
        text = payload if isinstance(payload, str) else json.dumps(payload, default=str)
        name = next((n for n, i in attempt.instances.items() if i == _instance_id(entry)), "")
        self.emit(f"{entry.timestamp:%Y-%m-%d %H:%M:%S} {self.show(name)} {self.show(text)}")
        # Following re-reads the last LOOKBACK: what was printed is known by its insert id.
        self._seen[_key(entry)] = entry.timestamp
        when, instance = entry.timestamp, _instance_id(entry)
        if instance not in self.newest or when > self.newest[instance]:
            self.newest[instance] = when
            oldest = min(self.newest.values()) - LOOKBACK
            self._seen = {k: t for k, t in self._seen.items() if t >= oldest}


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _key(entry: Any) -> str:
    return getattr(entry, "insert_id", None) or f"{entry.timestamp}/{_instance_id(entry)}/{entry.payload}"


def _instance_id(entry: Any) -> str:
    resource = getattr(entry, "resource", None)
    labels = getattr(resource, "labels", None) or {}
    return str(labels.get("instance_id", ""))


def _log_id(entry: Any) -> str:
    return str(getattr(entry, "log_name", "") or "").rsplit("/logs/", 1)[-1]
