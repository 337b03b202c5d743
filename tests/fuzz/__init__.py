"""Fuzzing a whole pass with hostile bucket objects: ``python -m tests.fuzz [--specs N] [--seed S]``.

Each case puts one generated object (a spec, a VM record or a status.json; see
``generate``) into the in-memory bucket beside one healthy job, then runs ONE full pass
(``Harness().tick()``). A case is *unhandled* when

- an exception escapes the pass, or ``parse_spec`` raises anything but SpecError;
- the healthy job is not handled normally: it must get its VM, and no error;
- a spec rejection has a problem line that does not start with a field path
  (``policy.max_runtime: ...``), or spans lines;
- a VM is inserted outside what the policy allows (an unwatched project, or another
  service account than the trainer's);
- a notice goes to a destination the policy refuses (a spec's ``notify.webhook`` on a host
  not allowed, in clear, on another port, an address; a topic of an unwatched project).

An exception that the pass caught and recorded as *unexpected* for one job is not
unhandled (the pass went on) but is counted and shown: it is a bug class all the same.
Every case is reproducible from (seed, kind, index).
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from controller.adapters.memory import MemoryPublisher, MemoryWebhook
from controller.core import names
from controller.core.policy import ControllerPolicy
from controller.core.spec import JobSpec, Notify, SpecError, parse_spec
from controller.service.notifier import Notifier
from tests.fuzz.generate import (
    HEALTHY,
    HEALTHY_DOC,
    VICTIM,
    VICTIM_DOCS,
    Case,
    record_case,
    spec_case,
    status_case,
    valid_docs,
)
from tests.harness import BUCKET, PROJECT, Harness

TRAINER = f"respawn-trainer@{PROJECT}.iam.gserviceaccount.com"
POLICY = ControllerPolicy(default_project=PROJECT, allowed_projects=("other-proj",), trainer_service_account=TRAINER)

_SEGMENT = r"(?:[A-Za-z0-9_\-]{1,64}|'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|<key>)"
_FIELD_PATH = re.compile(rf"{_SEGMENT}(?:\.{_SEGMENT})*(?:\.\.\.)?: \S")


def field_path_problem(line: object) -> str | None:
    """Why ``line`` is not one problem starting with a field path, or None when it is."""
    if not isinstance(line, str):
        return f"not text: {type(line).__name__}"
    if any(c in line for c in "\r\n\x00"):
        return "spans lines"
    if len(line) > 2000:
        return f"{len(line)} characters long"
    if not _FIELD_PATH.match(line):
        return "does not start with a field path"
    return None


@dataclass(frozen=True)
class Finding:
    case: Case
    seed: int
    why: str

    @property
    def replay(self) -> str:
        return f"replay: .venv/bin/python -m tests.fuzz --seed {self.seed} --only {self.case.kind}:{self.case.index}"

    def __str__(self) -> str:
        return f"{self.case.kind}:{self.case.index} [{self.case.what}] {self.case.key!r}: {self.why}"


@dataclass
class Report:
    specs: int = 0
    records: int = 0  # VM records and status.json files
    unhandled: list[Finding] = field(default_factory=list)
    caught: list[Finding] = field(default_factory=list)  # swallowed by the pass as "unexpected"

    @property
    def summary(self) -> str:
        return f"fuzz: specs={self.specs} records={self.records} unhandled={len(self.unhandled)}"


def cases(specs: int, records: int, seed: int) -> Iterator[Case]:
    """Every case of a run, in order: specs, then VM records, then status files (a third of ``records``)."""
    for i in range(specs):
        yield spec_case(seed, i)
    statuses = records // 3
    for i in range(records - statuses):
        yield record_case(seed, i)
    template = status_template() if statuses else {}
    for i in range(statuses):
        yield status_case(seed, i, template)


def case_by_name(name: str, seed: int) -> Case:
    kind, _, number = name.partition(":")
    index = int(number)
    if kind == "spec":
        return spec_case(seed, index)
    if kind == "record":
        return record_case(seed, index)
    if kind == "status":
        return status_case(seed, index, status_template())
    raise ValueError(f"--only takes spec:N, record:N or status:N, not {name!r}")


def status_template() -> dict[str, Any]:
    """A real status.json of a running job, to mutate."""
    import json

    h = Harness(POLICY)
    h.submit(VICTIM, VICTIM_DOCS[0])
    h.tick()
    return json.loads(h.store.read(BUCKET, names.status_key(VICTIM)).data)  # type: ignore[no-any-return]


def run(specs: int = 10_000, records: int = 3_000, seed: int = 0, only: str | None = None,
        on_finding: Callable[[str, Finding], None] | None = None) -> Report:
    """Run every case (or ``only`` one, e.g. ``spec:17``); ``on_finding(kind, finding)`` as they come."""
    report = Report()
    todo = [case_by_name(only, seed)] if only else cases(specs, records, seed)
    with _quiet_logs():
        for case in todo:
            if case.kind == "spec":
                report.specs += 1
            else:
                report.records += 1
            unhandled, caught = check(case)
            for why, bucket, kind in [(w, report.unhandled, "unhandled") for w in unhandled] + \
                                     [(w, report.caught, "caught") for w in caught]:
                finding = Finding(case, seed, why)
                bucket.append(finding)
                if on_finding:
                    on_finding(kind, finding)
    return report


def check(case: Case) -> tuple[list[str], list[str]]:
    """(unhandled problems, exceptions the pass caught) for one case."""
    unhandled: list[str] = []
    if case.kind == "spec":
        unhandled += _check_parse(case)
    h = Harness(POLICY)
    # Every job's own destinations are tried (a topic must exist to be published to).
    publisher = MemoryPublisher([f"projects/{p}/topics/{t}" for p in POLICY.watched_projects
                                 for t in ("respawn-events", "x")] + ["projects/elsewhere-proj/topics/x"])
    webhook = MemoryWebhook()
    h.notifier = Notifier(POLICY, publisher, webhook)
    try:
        if case.setup:
            h.submit(VICTIM, VICTIM_DOCS[case.victim])
            if case.kind == "spec":
                h.submit(case.job, valid_docs()[1])
            h.tick()
        h.store.put(BUCKET, case.key, case.body)
        h.submit(HEALTHY, HEALTHY_DOC)
        summary = h.tick()
    except Exception as e:  # noqa: BLE001 - exactly what is being looked for
        return [*unhandled, f"the pass raised {_exception(e)}"], []
    live = h.live(HEALTHY)
    if live != [f"{HEALTHY}-1"]:
        unhandled.append(f"the healthy job has VMs {live} instead of ['{HEALTHY}-1']")
    if HEALTHY in summary.errors:
        unhandled.append(f"the healthy job got an error: {summary.errors[HEALTHY][:300]}")
    unhandled += _check_inserts(h)
    unhandled += _check_notices(publisher, webhook)
    if case.kind == "spec":
        unhandled += _check_status_lines(h, case.job)
    caught = [f"{job}: {why[:300]}" for job, why in summary.errors.items() if "unexpected" in why.lower()]
    return unhandled, caught


def _check_parse(case: Case) -> list[str]:
    """parse_spec raises SpecError and nothing else; every line of it and of the policy's starts with a path."""
    try:
        spec = parse_spec(case.body, case.job)
    except SpecError as e:
        return _bad_lines("parse_spec", e.problems)
    except Exception as e:  # noqa: BLE001
        return [f"parse_spec raised {_exception(e)}"]
    try:
        return _bad_lines("violations", POLICY.violations(spec)) + _check_resolve(spec)
    except Exception as e:  # noqa: BLE001
        return [f"the policy raised {_exception(e)}"]


def _check_resolve(spec: JobSpec) -> list[str]:
    try:
        resolved = POLICY.resolve(spec)
    except SpecError:
        return []
    if resolved.project not in POLICY.watched_projects or resolved.service_account.email != TRAINER:
        return [f"resolve() gave project {resolved.project!r} and account {resolved.service_account.email!r}"]
    return []


def _bad_lines(source: str, lines: list[str]) -> list[str]:
    if not lines and source == "parse_spec":
        return ["parse_spec raised SpecError with no problem lines"]
    return [f"{source} line {line[:120]!r}: {why}" for line in lines if (why := field_path_problem(line))]


def _check_status_lines(h: Harness, job: str) -> list[str]:
    try:
        status = h.status(job)
    except Exception:  # noqa: BLE001 - no status for an unreadable job name: nothing to check
        return []
    if not status.message.startswith("invalid spec"):
        return []
    return _bad_lines("status.json errors", list(status.errors))


def _check_inserts(h: Harness) -> list[str]:
    out = []
    for name in h.live():
        request = h.compute.request_of(name)
        if request.project not in POLICY.watched_projects:
            out.append(f"{name} inserted in unwatched project {request.project!r}")
        if request.service_account != TRAINER:
            out.append(f"{name} inserted running as {request.service_account!r}")
    return out


def _check_notices(publisher: MemoryPublisher, webhook: MemoryWebhook) -> list[str]:
    """Notices go only where the policy allows a job's own destinations."""
    out = [f"a notice published to {topic!r}, which the policy refuses"
           for topic, _, _ in publisher.published if POLICY.notify_problems(Notify.model_construct(topic=topic, webhook=None))]
    out += [f"a notice posted to {url[:200]!r}, which the policy refuses"
            for url, _ in webhook.posted if POLICY.notify_problems(Notify.model_construct(topic=None, webhook=url))]
    return out


def _exception(e: BaseException) -> str:
    """The exception and the deepest line of the controller it went through."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if "/controller/" in f.filename] or frames
    at = f" at {'/'.join(ours[-1].filename.split('/')[-2:])}:{ours[-1].lineno} ({ours[-1].name})" if ours else ""
    return f"{type(e).__name__}: {str(e)[:200]!r}{at}"


@contextmanager
def _quiet_logs() -> Iterator[None]:
    """The controller logs every hostile object it meets; thousands of cases need none of it."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)
