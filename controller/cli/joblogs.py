"""What ``respawn logs JOB`` prints: the output of every attempt of the job's run, read from Cloud
Logging by instance id, in order, each under a header naming the attempt, its instances, zone and
how it ended (a standby booted at a preemption notice: a line under it says when, and its go or its
withdrawal: ``controller.render.handover_view.attempt_note``); with ``follow``, what is written
after, until stopped.

Where the output is, on Google: the serial console's log (``serial_port_1_output``, when the
project or VM sets ``serial-port-logging-enable``, which respawn sets on every VM and TPU node it
launches; written by the platform, whatever the VM's account may do), else the guest agent's
``GCEMetadataScripts`` log (the startup script's output line by line, as ``startup-script: LINE``;
written with the VM's account, which needs ``roles/logging.logWriter``: ``respawn deploy`` grants it
to the trainer account). Both hold the same lines: each attempt is read from the first that has
any, never both. A Compute VM's entries are ``gce_instance`` by ``instance_id``; a Cloud TPU VM's
are ``tpu_worker`` (labels ``project_id``, ``zone``, ``node_id``: the node's name, ``worker_id``)
by its node's name. Every query names a time bound of its own (the run's start), so the client's
default of the last 24 hours never hides an older attempt.

Cloud Logging allows a project 60 ``entries.list`` a minute: the run's attempts are read together
in one query first (their newest page); only an attempt that page does not settle is read on its
own, once (both logs in one query). Reads are paced (``Pace``) and one refused for the quota (429)
is tried again after the delay the server names (``google.rpc.RetryInfo``), else with backoff.

Printing is the caller's (``emit``, ``show``): this module reads and orders, and gives each line as
a terminal would show it (``as_shown``: a progress bar's carriage-return updates collapse to their
last state) with one timestamp, the entry's, ``MM-DD HH:MM:SS`` UTC (``one_stamp`` drops a line's
own leading stamp within a minute of it, such as the VM agent's ISO one).
"""

from __future__ import annotations

import json
import random
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from controller.core import errors, names
from controller.core.ledger import ENDS, LOSS_CAUSES
from controller.core.ports import Instance
from controller.core.state import JobStatus
from controller.render import handover_view
from controller.render.text import printable as _printable

SERIAL = "serialconsole.googleapis.com%2Fserial_port_1_output"
SCRIPTS = "GCEMetadataScripts"
LOGS = (SERIAL, SCRIPTS)  # in order of preference
RETENTION = timedelta(days=30)  # Cloud Logging's default: nothing older is there to read
SLACK = timedelta(minutes=5)  # before the run's start: a VM's clock, an event's
LOOKBACK = timedelta(seconds=30)  # following: entries may land late, up to this much older than the newest
PAGE = 1000  # entries.list's largest page
READS_PER_MINUTE = 50  # respawn's own pace: under Logging's 60 entries.list a minute per project, with room
RETRY_FOR = 300.0  # seconds a read refused for the quota (or unavailable) is tried again, at most
# Cloud Logging refuses a filter longer than 20,000 characters: a gang of many nodes (up to 1000,
# each id ~25 characters quoted) is read in as many queries as its ids need, each within this.
MAX_FILTER = 19_000
# A project id: 6-30 lowercase letters, digits or hyphens, starting with a letter, not ending with a
# hyphen; or a domain-scoped one (``example.com:my-project``), which Google still has. Neither can
# carry a quote, a slash or a space into a query or a resource name.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
PROJECT_RE = re.compile(rf"(?:{_LABEL}(?:\.{_LABEL})+:)?[a-z][a-z0-9-]{{4,28}}[a-z0-9]")
NODE_RE = re.compile(r"[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?")  # a TPU node's name (its node_id label)


def project_id(value: str) -> str:
    """``value`` if it is a project id, else ``RequestError``: it goes into a Logging query and its
    resource names, and a status file is only as trustworthy as whoever could write the bucket."""
    if isinstance(value, str) and PROJECT_RE.fullmatch(value):
        return value
    raise errors.RequestError(
        f"refusing to read Cloud Logging for project {value!r}: not a project id (6 to 30 lowercase letters, "
        "digits or hyphens, starting with a letter and not ending with a hyphen, or DOMAIN:ID). It comes from "
        "the job's status.json or the live instances: check what wrote them")


def console_project(job: str, recorded: str | None, watched: Sequence[str], spec_project: str | None) -> str | None:
    """The project ``job``'s status records (None: it records none), where ``respawn logs`` reads its
    VMs' output (``--serial``: asks Compute for a VM's console): only one this controller watches (its policy's projects) or the
    one the job's spec names, as a pass looks for the job's VMs (controller.service.observe). A
    status is only as trustworthy as whoever could write the bucket: anything else is refused,
    saying why, before any request."""
    if not recorded:
        return None
    if project_id(recorded) in watched or recorded == spec_project:
        return recorded
    raise errors.RequestError(
        f"refusing to read {job}'s VM output in project {recorded!r}, which its status.json names: this "
        f"controller watches {', '.join(watched) or 'no project'} (RESPAWN_PROJECT, RESPAWN_ALLOWED_PROJECTS) "
        f"and the job's spec names {spec_project or 'none'}. Check what wrote the status")


@dataclass(frozen=True)
class Attempt:
    number: int
    instances: dict[str, str]  # name -> Compute id, by rank
    zone: str | None = None
    outcome: str | None = None  # how it ended (preempted, succeeded...), or the job's phase while it lasts
    # A Cloud TPU node (its workers log as tpu_worker, by the node's name); None: not known, read as either.
    tpu: bool | None = None
    # How it stood beside another attempt (zero-gap recovery: a standby booted at a preemption
    # notice, given the go or withdrawn): a line of its own under the header.
    note: str | None = None

    def header(self) -> str:
        names_ = ", ".join(self.instances) or "no instance"
        where = f" in {self.zone}" if self.zone else ""
        end = f" ({self.outcome})" if self.outcome else ""
        return f"── attempt {self.number}: {names_}{where}{end} ──" + (f"\n   {self.note}" if self.note else "")


def attempts(job: str, status: JobStatus | None, live: Iterable[Instance] = ()) -> list[Attempt]:
    """The run's attempts, oldest first, from its status (the ids it recorded, its ledger and
    history) and the instances listed now (ids a status has not recorded yet)."""
    live = [i for i in live if i.job == job]
    ids = {**(status.instance_ids if status else {}), **{i.name: i.id for i in live if i.id}}
    by_attempt: dict[int, dict[str, str]] = {}
    for name, id_ in ids.items():
        parsed = names.parse_slice_host(name) or names.parse_instance_name(name)
        if parsed and parsed[0] == job and id_:
            by_attempt.setdefault(parsed[1], {})[name] = id_
    spans = {s.attempt: s for s in status.ledger.spans} if status else {}
    numbers = sorted({*by_attempt, *spans})
    standby = status.standby if status else None
    gone = {w.attempt for w in handover_view.withdrawn(status)} if status else set()
    out = []
    for n in numbers:
        span = spans.get(n)
        zone = (span.zone if span else None) or _zone_in_history(status, n) or next(
            (i.zone for i in live if i.attempt == n), None) or (standby.zone if standby and n == standby.attempt else None)
        outcome = span.cause if span and span.cause else _outcome_in_history(status, n)
        if outcome is None and status is not None and n == status.attempt:
            outcome = status.phase.lower()
        if outcome is None and (standby and n == standby.attempt or n in gone):
            outcome = "standby" if standby and n == standby.attempt else "withdrawn standby"
        found = by_attempt.get(n, {})
        out.append(Attempt(n, dict(sorted(found.items(), key=lambda kv: _rank(kv[0]))), zone, outcome,
                           _tpu(status, live, n), handover_view.attempt_note(job, status, n) if status else None))
    return out


def _tpu(status: JobStatus | None, live: list[Instance], attempt: int) -> bool | None:
    """Whether the attempt ran on a Cloud TPU node (its workers log as tpu_worker): what a live
    instance says, else the status (which knows the current attempt's kind, and whether the run ever
    used a TPU node). A TPU slice in Compute Engine is not one: its hosts log as the VMs they are."""
    seen = {i.tpu and i.tpu_api == "tpu" for i in live if i.attempt == attempt}
    if len(seen) == 1:
        return seen.pop()
    if status is None:
        return None
    if attempt == status.attempt:
        return status.attempt_tpu and not status.attempt_compute
    return None if status.tpu else False


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
                since: datetime | None = None, nodes: Iterable[str] = ()) -> str:
    """The Logging query for these instances' entries (Compute VMs by id, TPU nodes' workers by the
    node's name): of ``logs`` (LOG_IDs, in ``projects``) when given, at or after ``since`` when given."""
    # Compute's ids are decimal numbers (JobStatus keeps no other), a node's name is lowercase letters,
    # digits and hyphens; anything else is no id of ours and is never quoted into the query.
    ids = " OR ".join(f'"{i}"' for i in sorted(set(instance_ids)) if i.isascii() and i.isdigit())
    names_ = " OR ".join(f'"{n}"' for n in sorted(set(nodes)) if NODE_RE.fullmatch(n))
    vms = f'resource.type="gce_instance" AND resource.labels.instance_id=({ids})'
    tpus = f'resource.type="tpu_worker" AND resource.labels.node_id=({names_})'
    # OR binds tighter than AND in the Logging query language: each side is parenthesized.
    parts = [f"(({vms}) OR ({tpus}))" if ids and names_ else tpus if names_ else vms]
    if logs:
        parts.append("logName=(" + " OR ".join(f'"projects/{project_id(p)}/logs/{log}"' for p in projects
                                               for log in logs) + ")")
    if since is not None:
        parts.append(f'timestamp>="{since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}"')
    return " AND ".join(parts)


def run_start(status: JobStatus | None, now: datetime) -> datetime:
    """From when the run's entries are looked for: its start, a little before; at most the
    retention back."""
    begun = [t for t in (status.created_at if status else None,
                         *(s.start for s in (status.ledger.spans if status else ()))) if t]
    return max(min(begun) - SLACK, now - RETENTION) if begun else now - RETENTION


class Pace:
    """At most ``per_minute`` reads in any 60 seconds: each read waits until one fits."""

    def __init__(self, per_minute: int = READS_PER_MINUTE, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.per_minute, self.clock, self.sleep = max(1, per_minute), clock, sleep
        self._reads: deque[float] = deque()

    def wait(self) -> None:
        while True:
            now = self.clock()
            if (left := self.left(now)) <= 0:
                self._reads.append(now)
                return
            self.sleep(left)

    def left(self, now: float | None = None) -> float:
        """Seconds until the next read fits (0: now)."""
        now = self.clock() if now is None else now
        while self._reads and self._reads[0] <= now - 60.0:
            self._reads.popleft()
        return 0.0 if len(self._reads) < self.per_minute else self._reads[0] + 60.0 - now


class _Delays:
    """retry_target's sleeps: the delay the server names for the last error (RetryInfo, or a
    Retry-After header), else exponential backoff with jitter, 1 s to 60 s."""

    def __init__(self) -> None:
        self.named: float | None = None

    def note(self, error: Exception) -> None:
        self.named = server_delay(error)

    def __iter__(self) -> Iterator[float]:
        backoff = 1.0
        while True:
            if self.named is not None:
                yield self.named
            else:
                yield random.uniform(0, backoff)
                backoff = min(60.0, backoff * 2)


def server_delay(error: Exception) -> float | None:
    """How long the server asks a client to wait before trying again: ``google.rpc.RetryInfo`` in
    the error's details (REST: ``{"@type": ".../google.rpc.RetryInfo", "retryDelay": "12.5s"}``;
    gRPC: the message), else the HTTP ``Retry-After`` header (seconds); None when it names none."""
    for detail in getattr(error, "details", None) or ():
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("google.rpc.RetryInfo"):
            found = re.fullmatch(r"\s*(\d+(?:\.\d*)?)s\s*", str(detail.get("retryDelay", "")))
            if found:
                return float(found[1])
        delay = getattr(detail, "retry_delay", None)
        if delay is not None and hasattr(delay, "seconds"):
            return delay.seconds + getattr(delay, "nanos", 0) / 1e9
    response = getattr(error, "response", None)
    header = getattr(response, "headers", {}).get("Retry-After") if response is not None else None
    if header and str(header).strip().isdigit():
        return float(header)
    return None


def _retryable(error: Exception) -> bool:
    from google.api_core import exceptions as gexc

    return isinstance(error, (gexc.TooManyRequests, gexc.ServiceUnavailable))


class JobLogs:
    """Reads and prints one job's logs. ``client``: a google-cloud-logging ``Client``; ``emit``
    prints a line; ``show`` makes a text printable (escapes control characters); ``pace``: how reads
    are spaced (``Pace``); ``account``: the VMs' service account, named when nothing is found."""

    def __init__(self, client: Any, job: str, projects: Sequence[str], emit: Callable[[str], None],
                 show: Callable[[str], str], limit: int = 200, guard: Callable[[], Any] | None = None,
                 pace: Pace | None = None, retry_for: float = RETRY_FOR, account: str | None = None) -> None:
        self.client, self.job = client, job
        self.projects = [project_id(p) for p in dict.fromkeys(p for p in projects if p)]
        self.emit, self.show, self.limit = emit, show, limit
        self.guard = guard  # a context manager factory around every call to Cloud Logging
        self.pace, self.retry_for, self.account = pace or Pace(), retry_for, account
        self.reads = 0  # entries.list calls made (each page is one)
        self.source: dict[int, str] = {}  # attempt -> the log its output is read from
        self.header: int | None = None  # the attempt whose header was printed last
        # The newest entry printed of each instance (by id; a TPU worker by node and worker): each VM
        # stamps its agent's entries by its own clock, so one that runs ahead must not move the
        # look-back past another's entries.
        self.newest: dict[str, datetime] = {}
        self._seen: dict[str, datetime] = {}  # insert ids printed within LOOKBACK of their instance's newest
        self._cut: dict[int, datetime] = {}  # attempt -> its oldest line printed, where --limit left older ones out

    # -- every attempt, once -----------------------------------------------------------------
    def print_all(self, runs: list[Attempt], since: datetime) -> None:
        read = [a for a in runs if a.instances]
        settled = self._together(read, since) if read else {}
        empty = 0
        for attempt in runs:
            self._header(attempt)
            if not attempt.instances:
                self.emit("(no instance id recorded for this attempt: nothing to read)")
                continue
            log, entries = settled[attempt.number] if attempt.number in settled else self._alone(attempt, since)
            if not entries:
                empty += 1
                self.emit("(no output in Cloud Logging)")
                continue
            self.source[attempt.number] = log
            if len(entries) > self.limit:
                self.emit(f"… earlier lines of this attempt left out (--limit {self.limit})")
                entries = entries[: self.limit]
                self._cut[attempt.number] = entries[-1].timestamp  # following must not bring them back
            for entry in reversed(entries):
                self._print(attempt, entry)
        if read and empty == len(read):
            for line in self.missing(read, since):
                self.emit(line)

    def missing(self, runs: list[Attempt], since: datetime) -> list[str]:
        """Why nothing was found, and what to do about it: which log, which setting or role."""
        project = self.projects[-1] if self.projects else "PROJECT"
        account = self.account or "the VMs' service account"
        member = f"serviceAccount:{self.account}" if self.account else "serviceAccount:ACCOUNT"
        tpu = any(a.tpu is not False for a in runs)
        kinds = 'resource.type="gce_instance" by instance id' + (
            ', resource.type="tpu_worker" by node name' if tpu else "")
        return [
            f"No Cloud Logging entry of these instances since {since.astimezone(UTC):%Y-%m-%d %H:%M} UTC "
            f"in {', '.join(self.projects) or 'the project'} ({kinds}). Neither log respawn reads was written:",
            f"  - {SERIAL.replace('%2F', '/')}: written only where the VM's metadata (or the project's) "
            "sets serial-port-logging-enable=TRUE and no organization policy (compute.disableSerialPortLogging) "
            "forbids it. respawn sets it on the VMs and TPU nodes it launches; VMs launched before it did "
            "lack it. For a whole project: gcloud compute project-info add-metadata "
            f"--metadata=serial-port-logging-enable=TRUE --project={project}",
            f"  - {SCRIPTS} (the guest agent's copy of the startup script's lines): written with the VM's "
            f"service account ({account}), which needs roles/logging.logWriter in {project}. respawn deploy "
            "grants it to the trainer account; by hand: gcloud projects add-iam-policy-binding "
            f"{project} --member={member} --role=roles/logging.logWriter --condition=None",
            "  Entries are kept 30 days; the VM also needs the logging.write (or cloud-platform) scope.",
        ]

    def _together(self, runs: list[Attempt], since: datetime) -> dict[int, tuple[str, list[Any]]]:
        """One read of the newest page of every attempt's entries (both logs): each attempt it holds
        more than ``limit`` lines of, or all of whose lines it holds, is settled (the log chosen, its
        entries newest first)."""
        page = self._list(runs, LOGS, since, descending=True, limit=PAGE)
        whole = len(page) < PAGE  # everything there is
        grouped: dict[int, list[Any]] = {}
        index = self._index(runs)
        for entry in page:
            attempt = runs[0] if len(runs) == 1 else index.get(_origin(entry)[0])
            if attempt is not None:
                grouped.setdefault(attempt.number, []).append(entry)
        settled = {}
        for attempt in runs:
            log, entries = _choose(grouped.get(attempt.number, []))
            if whole or len(entries) > self.limit:
                settled[attempt.number] = (log, entries)
        return settled

    def _alone(self, attempt: Attempt, since: datetime) -> tuple[str, list[Any]]:
        """One attempt's last lines: both logs in one read; the chosen log alone again only where
        that read was cut short before it held ``limit`` + 1 of its lines."""
        want = 2 * (self.limit + 1)  # each line is in both logs when both are written
        entries = self._list([attempt], LOGS, since, descending=True, limit=want)
        log, chosen = _choose(entries)
        if len(entries) >= want and len(chosen) <= self.limit:
            chosen = self._list([attempt], (log,), since, descending=True, limit=self.limit + 1)
        return log, chosen

    # -- what comes after --------------------------------------------------------------------
    def follow(self, read: Callable[[], list[Attempt]], since: datetime, interval: float,
               stop_after: float | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        """Print entries as they land, every ``interval`` seconds, until interrupted or for
        ``stop_after`` seconds. ``read``: the attempts as the job's status says now (a new attempt
        is followed from its first entry)."""
        deadline = None if stop_after is None else time.monotonic() + stop_after
        while deadline is None or time.monotonic() < deadline:
            sleep(interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic())))
            if deadline is not None and time.monotonic() + self.pace.left() >= deadline:
                return  # the next read would come after the end asked for (the pace is spent)
            try:
                runs = [a for a in read() if a.instances]
                index = self._index(runs)
                # From the least advanced instance: one with nothing printed yet is read from ``since``.
                start = max(since, min((self.newest[k] - LOOKBACK if k in self.newest else since)
                                       for k in self._clocks(runs))) if runs else since
                found = self._list(runs, LOGS, start, descending=False, limit=None) if runs else []
            except errors.TransientError:
                continue  # a read refused for the quota past its retries, a network hiccup: the next one catches up
            for entry in found:
                key, clock, _ = _origin(entry)
                attempt = index.get(key)
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
    @staticmethod
    def _index(runs: Iterable[Attempt]) -> dict[str, Attempt]:
        """Where an entry belongs, by its origin's key (``_origin``)."""
        index: dict[str, Attempt] = {}
        for attempt in runs:
            for name, id_ in attempt.instances.items():
                if attempt.tpu is not True:
                    index[f"id:{id_}"] = attempt
                if attempt.tpu is not False:
                    index[f"node:{name}"] = attempt
        return index

    def _clocks(self, runs: Iterable[Attempt]) -> list[str]:
        """The clocks a follow's look-back waits for: each VM's, each TPU worker's seen so far (a
        node with none seen yet: read from the start)."""
        keys = []
        for attempt in runs:
            for name, id_ in attempt.instances.items():
                vm, workers = f"id:{id_}", [k for k in self.newest if k.startswith(f"node:{name}/")]
                if attempt.tpu is True or (attempt.tpu is None and workers and vm not in self.newest):
                    keys += workers or [f"node:{name}/"]
                else:
                    keys.append(vm)
        return keys

    def _list(self, runs: Sequence[Attempt], logs: Sequence[str], since: datetime, descending: bool,
              limit: int | None) -> list[Any]:
        from google.api_core.retry import retry_target
        from google.cloud import logging as cloud_logging

        ids = [("id", i) for a in runs if a.tpu is not True for i in a.instances.values()]
        nodes = [("node", n) for a in runs if a.tpu is not False for n in a.instances]
        order = cloud_logging.DESCENDING if descending else cloud_logging.ASCENDING
        resources = [f"projects/{p}" for p in self.projects]

        def query(part: list[tuple[str, str]]) -> str:
            return logs_filter([v for k, v in part if k == "id"], self.projects, logs, since,
                               nodes=[v for k, v in part if k == "node"])

        # As few queries as keep each filter within MAX_FILTER (one, but for a gang of hundreds).
        parts: list[list[tuple[str, str]]] = [[]]
        for origin in [*ids, *nodes]:
            if parts[-1] and len(query([*parts[-1], origin])) > MAX_FILTER:
                parts.append([])
            parts[-1].append(origin)

        def read(text: str) -> list[Any]:
            self.pace.wait()
            self.reads += 1
            return list(self.client.list_entries(resource_names=resources, filter_=text, order_by=order,
                                                 max_results=limit, page_size=min(limit or PAGE, PAGE)))

        found: list[Any] = []
        guard = self.guard() if self.guard else _Nothing()
        with guard:
            for part in parts:
                delays = _Delays()
                text = query(part)
                found += retry_target(lambda: read(text), _retryable, delays, timeout=self.retry_for,
                                      on_error=delays.note)
        if len(parts) == 1:
            return found
        found.sort(key=lambda e: e.timestamp, reverse=descending)  # as one query would have ordered them
        return found[:limit] if limit else found

    def _header(self, attempt: Attempt) -> None:
        self.header = attempt.number
        self.emit(self.show(attempt.header()))

    def _print(self, attempt: Attempt, entry: Any) -> None:
        payload = entry.payload
        if isinstance(payload, dict) and isinstance(payload.get("message"), str):
            # The guest agent's entries: a script's line as the serial console has it.
            payload = re.sub(r"^(startup|shutdown)-script: ", "", payload["message"])
        text = payload if isinstance(payload, str) else json.dumps(payload, default=str)
        key, clock, worker = _origin(entry)
        name = next((n for n, i in attempt.instances.items() if key in (f"id:{i}", f"node:{n}")), "")
        if name and worker:
            name = f"{name}/w{worker}"  # a TPU node's worker
        text = one_stamp(as_shown(text), entry.timestamp)
        self.emit(f"{_utc(entry.timestamp):{STAMP}} {self.show(name)} {self.show(text)}")
        # Following re-reads the last LOOKBACK: what was printed is known by its insert id.
        self._seen[_key(entry)] = entry.timestamp
        when = entry.timestamp
        if clock not in self.newest or when > self.newest[clock]:
            self.newest[clock] = when
            oldest = min(self.newest.values()) - LOOKBACK
            self._seen = {k: t for k, t in self._seen.items() if t >= oldest}


DASHBOARD_READS_PER_MINUTE = 20  # respawn dashboard's own reads, all jobs together: a third of Logging's 60


class Recent:
    """``respawn dashboard``'s reader of a job's last log lines (its server calls it as ``recent(job)``,
    at most every 30 s per job, and only while the job's page is open: ``controller.dashboard.logtail``):
    the last ``lines`` of the job's current run, every attempt's, as ``respawn logs`` prints them (one
    timestamp, ``as_shown``, control characters escaped). It never waits: a read Cloud Logging refuses
    for its quota (429) is not tried again, and one respawn's own pace (``per_minute``, all jobs of the
    dashboard together) has no room for is refused at once; each raises, and the page shows why.
    ``status(job)``: the job's status as read from the bucket; ``client()``: the Logging client
    (made once, on the first read); ``guard``: the context manager around each call to Logging
    (its errors made the project's own); ``projects``: the job's and the configured project."""

    def __init__(self, status: Callable[[str], JobStatus | None], client: Callable[[], Any], project: str,
                 guard: Callable[[], Any], account: str | None = None, lines: int = 40,
                 per_minute: int = DASHBOARD_READS_PER_MINUTE, clock: Callable[[], float] = time.monotonic,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        import threading

        self.status, self._make, self.project, self.guard, self.account = status, client, project, guard, account
        self.lines, self.now = lines, now
        self._lock = threading.Lock()
        self._client: Any = None
        self.pace = Pace(per_minute, clock, sleep=self._refused)

    @staticmethod
    def _refused(seconds: float) -> None:
        raise errors.TransientError(f"respawn's own pace of Cloud Logging reads is spent: again in {seconds:.0f} s")

    def __call__(self, job: str) -> list[str]:
        from google.auth import exceptions as auth_errors

        status = self.status(job)
        runs = attempts(job, status)
        if not any(a.instances for a in runs):
            return [f"(no instance of {job} has been seen yet: nothing is logged)"]
        shown: list[str] = []
        with self._lock:
            if self._client is None:
                self._client = self._make()
            client = self._client
        reader = JobLogs(client, job, [(status.project if status else None) or self.project, self.project],
                         shown.append, lambda text: _printable(text.replace("\r\n", "\n"), keep="\n\t"),
                         limit=self.lines, guard=lambda: _last_refusal(self.guard), pace=_Locked(self.pace, self._lock),
                         retry_for=0.0,
                         account=self.account)
        try:
            reader.print_all(runs, run_start(status, self.now()))
        except auth_errors.TransportError as e:  # the token could not be fetched: the network
            raise errors.TransientError(f"Cloud Logging: {e}") from e
        except auth_errors.GoogleAuthError as e:
            raise errors.ConfigError(f"no usable Google credentials for Cloud Logging: {e}") from e
        lines = [part for line in shown for part in line.split("\n")]
        return lines[-self.lines:]


@contextmanager
def _last_refusal(guard: Callable[[], Any]) -> Iterator[None]:
    """``guard``, around Logging's own refusal where the dashboard's reader tried once (``retry_for``
    0): its "429 Quota exceeded", not google-api-core's "Timeout of 0.0s exceeded" around it."""
    from google.api_core import exceptions as gexc

    with guard():
        try:
            yield
        except gexc.RetryError as e:
            if isinstance(e.cause, Exception):
                raise e.cause from e
            raise


class _Locked:
    """A ``Pace`` shared by the dashboard's request threads: one ``wait`` at a time (it never sleeps)."""

    def __init__(self, pace: Pace, lock: Any) -> None:
        self.pace, self.lock = pace, lock

    def wait(self) -> None:
        with self.lock:
            self.pace.wait()

    def left(self, now: float | None = None) -> float:
        with self.lock:
            return self.pace.left(now)


STAMP = "%m-%d %H:%M:%S"  # each line's one timestamp, the entry's (UTC): the year is the run's, and 80 columns are few
# A timestamp a line starts with (after a tag such as ``respawn: ``): the VM agent's (ISO 8601, UTC),
# Python logging's (``2025-01-01 12:00:04,007``).
_LEADING_STAMP = re.compile(r"(?P<tag>[\w.-]+(?:\[\d+\])?: )?(?P<stamp>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}"
                            r"(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?) +")
SAME_MOMENT = timedelta(minutes=1)  # a line's own stamp this close to its entry's says nothing more


def as_shown(text: str) -> str:
    """``text`` as a terminal leaves it: each line's carriage-return updates (a progress bar's)
    collapse to the last state drawn; a ``\\r`` with nothing after it leaves what came before it."""
    shown = []
    for line in text.replace("\r\n", "\n").split("\n"):
        states = [part for part in line.split("\r") if part.strip()]
        shown.append(states[-1] if states else "")
    return "\n".join(shown).rstrip("\n")


def one_stamp(text: str, when: datetime) -> str:
    """``text`` without the timestamp it starts with (after a tag) where that is within SAME_MOMENT
    of ``when``, the entry's: the line is printed with one timestamp, the entry's."""
    match = _LEADING_STAMP.match(text)
    if not match:
        return text
    try:
        stamp = datetime.fromisoformat(match["stamp"].replace(",", "."))
    except ValueError:
        return text
    if abs(_utc(stamp) - _utc(when)) > SAME_MOMENT:
        return text
    return (match["tag"] or "") + text[match.end():]


def _utc(moment: datetime) -> datetime:
    """A moment in UTC; one without a zone is taken as UTC (the agent's clock, Google's VMs')."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _choose(entries: list[Any]) -> tuple[str, list[Any]]:
    """The log an attempt is read from, and its entries among ``entries``: the serial console's
    where it has any, else the guest agent's."""
    serial = [e for e in entries if _log_id(e) == SERIAL]
    return (SERIAL, serial) if serial else (SCRIPTS, [e for e in entries if _log_id(e) != SERIAL])


def _key(entry: Any) -> str:
    return getattr(entry, "insert_id", None) or f"{entry.timestamp}/{_origin(entry)[1]}/{entry.payload}"


def _origin(entry: Any) -> tuple[str, str, str]:
    """Where an entry comes from: (its instance's key: ``id:ID`` for a Compute VM, ``node:NAME``
    for a TPU node; the key of the clock that stamped it, each TPU worker its own; the worker, or "")."""
    resource = getattr(entry, "resource", None)
    labels = getattr(resource, "labels", None) or {}
    if getattr(resource, "type", None) == "tpu_worker" or "node_id" in labels:
        node, worker = str(labels.get("node_id", "")), str(labels.get("worker_id", ""))
        return f"node:{node}", f"node:{node}/{worker}", worker
    return f"id:{labels.get('instance_id', '')}", f"id:{labels.get('instance_id', '')}", ""


def _log_id(entry: Any) -> str:
    return str(getattr(entry, "log_name", "") or "").rsplit("/logs/", 1)[-1]
