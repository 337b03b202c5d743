"""A whole controller over the in-memory fakes, with the helpers a VM or a user would use."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta
from typing import Any

import yaml

from controller.core import names
from controller.adapters.memory import MemoryAdvisor, MemoryAuditLog, MemoryCompute, MemorySlices, MemoryStore, MemoryTpu
from controller.core.clock import FakeClock
from controller.service.engine import Engine, Summary
from controller.service.executor import Executor
from controller.core.launch import LaunchContext
from controller.service.notifier import Notifier
from controller.service.observe import Observer
from controller.core.policy import ControllerPolicy
from controller.core.state import JobStatus
from controller.core.world import listing_metadata

BUCKET = "respawn-test"
PROJECT = "respawn-proj"
CKPT_BUCKET = "ckpts"
TRAINER = f"respawn-trainer@{PROJECT}.iam.gserviceaccount.com"


def _started(when: datetime | None) -> dict[str, str]:
    """A record's trainer start as the VM agent writes it (RFC 3339, UTC, milliseconds), where given."""
    return {"trainer_started": when.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"} if when else {}


def spec_doc(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "zones": ["us-central1-a", "us-central1-b"],
        "machine_type": "g2-standard-8",  # one L4 built in
        "command": "python train.py",
        "checkpoint": {"uri": f"gs://{CKPT_BUCKET}/run"},
        "policy": {"backoff": {"initial": "30s", "max": "5m"}},
    }
    doc.update(overrides)
    return doc


def tpu_spec_doc(**overrides: Any) -> dict[str, Any]:
    """A TPU job's spec: ``spec_doc``'s with ``overrides`` (its ``tpu:`` block among them), and no machine type."""
    doc = spec_doc(**overrides)
    del doc["machine_type"]
    return doc


class Harness:
    def __init__(self, policy: ControllerPolicy | None = None, workers: int = 1, snapshot: bool = True) -> None:
        self.workers = workers  # jobs observed and reconciled side by side in one pass
        # Each tick's engine is a fresh instance: with ``snapshot``, it reads the snapshot the last
        # pass over every job kept (controller.service.snapshot) before its own first pass.
        self.snapshot = snapshot
        self.clock = FakeClock()
        self.store = MemoryStore(self.clock)
        self.compute = MemoryCompute(self.clock)
        # Compute's System Event audit log: every preemption, crash, host error and maintenance of
        # the fake Compute lands there (an on_audit message each wakes a pass; tests/service/test_audit.py).
        self.audit = MemoryAuditLog()
        self.compute.audit = self.audit
        self.tpu = MemoryTpu(self.clock)
        self.slices = MemorySlices(self.clock)  # TPU slices in Compute Engine (tpu.machine_type)
        self.advisor: MemoryAdvisor | None = None  # capacity advice: none unless a test sets one (zones keep the spec's order)
        self.notifier: Notifier | None = None  # notifications: none unless a test sets one
        self.policy = policy or ControllerPolicy(default_project=PROJECT, trainer_service_account=TRAINER)
        self.ctx = LaunchContext(BUCKET, PROJECT, "#!/bin/bash\necho startup", "#!/bin/bash\necho shutdown")

    def engine(self, store: Any = None, compute: Any = None, tpu: Any = None, slices: Any = None) -> Engine:
        store, compute, tpu, slices = store or self.store, compute or self.compute, tpu or self.tpu, slices or self.slices
        observer = Observer(store, compute, BUCKET, self.policy, workers=self.workers, advisor=self.advisor, tpu=tpu,
                            replayable=True, snapshot=self.snapshot, slices=slices)  # in order, on the test's thread
        return Engine(observer, Executor(store, compute, BUCKET, tpu, self.notifier, written=observer.remember,
                                         slices=slices),
                      self.ctx, self.clock,
                      workers=self.workers)

    def tick(self, job: str | None = None) -> Summary:
        return self.engine().reconcile(job)

    def race(self, job: str, passes: int = 6) -> None:
        """``passes`` passes for ``job`` at once, each its own engine (as concurrent function
        invocations are), released together."""
        engines = [self.engine() for _ in range(passes)]
        barrier = threading.Barrier(passes)

        def one(engine: Engine) -> None:
            barrier.wait()
            engine.reconcile(job)

        threads = [threading.Thread(target=one, args=(e,)) for e in engines]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # -- what a user does ----------------------------------------------------------
    def submit(self, job: str, doc: dict[str, Any] | str | None = None) -> None:
        body = doc if isinstance(doc, str) else yaml.safe_dump(doc or spec_doc())
        self.store.put(BUCKET, names.spec_key(job), body)

    def cancel(self, job: str) -> None:
        self.store.put(BUCKET, names.cancel_key(job), "")

    # -- what a VM does --------------------------------------------------------------
    # Each record carries the attempt's secret, as the VM agent copies it from the
    # instance's metadata; ``token=""`` writes one without it (a forger).
    def exit(self, job: str, code: int, attempt: int | None = None, token: str | None = None,
             node: int = 0, trainer_started: datetime | None = None, result: str | None = None) -> None:
        """``result``: what the trainer wrote to RESPAWN_RESULT_FILE, as the agent puts it in the record."""
        attempt = self.status(job).attempt if attempt is None else attempt
        body = {"exit_code": code, "instance": names.instance_name(job, attempt), "attempt": attempt,
                "node": node, "token": self._token(job, attempt, token), **_started(trainer_started),
                **({"result": result} if result is not None else {})}
        self.store.put(BUCKET, names.exit_key(job), json.dumps(body))

    def worker_exit(self, job: str, rank: int, code: int, attempt: int | None = None, token: str | None = None,
                    instance: str | None = None) -> None:
        """A worker's (rank > 0) own exit record, as the VM agent writes it: a gang node's, or a TPU host's."""
        attempt = self.status(job).attempt if attempt is None else attempt
        body = {"exit_code": code, "instance": instance or names.instance_name(job, attempt, rank), "attempt": attempt,
                "node": rank, "token": self._token(job, attempt, token)}
        self.store.put(BUCKET, names.node_exit_key(job, rank), json.dumps(body))

    def marker(self, job: str, attempt: int | None = None, reason: str = "preempted", token: str | None = None,
               trainer_started: datetime | None = None) -> None:
        attempt = self.status(job).attempt if attempt is None else attempt
        body = {"instance": names.instance_name(job, attempt), "attempt": attempt, "reason": reason,
                "token": self._token(job, attempt, token), **_started(trainer_started)}
        self.store.put(BUCKET, names.marker_key(job), json.dumps(body))

    def notice(self, job: str, attempt: int | None = None, reason: str = "preempted", token: str | None = None) -> None:
        """The agent's notice record, written the moment instance/preempted turns TRUE."""
        attempt = self.status(job).attempt if attempt is None else attempt
        body = {"instance": names.instance_name(job, attempt), "attempt": attempt, "node": 0, "reason": reason,
                "notice_s": 120, "token": self._token(job, attempt, token)}
        self.store.put(BUCKET, names.notice_key(job), json.dumps(body))

    def ready(self, job: str, token: str | None = None, waiting_since: datetime | None = None) -> None:
        """A held VM's rank 0 at the starting line (its ready record): the standby's, with its own
        secret, or, once it was given the go, the current attempt's; since ``waiting_since`` where
        given (RFC 3339, as the agent writes it)."""
        st = self.status(job)
        sb = st.standby
        instance, attempt, secret = (sb.instances[0], sb.attempt, sb.token) if sb else \
            (st.instances[0], st.attempt, st.attempt_token)
        body = {"instance": instance, "attempt": attempt, "node": 0, "token": secret if token is None else token,
                **({"waiting_since": waiting_since.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"} if waiting_since else {})}
        self.store.put(BUCKET, names.ready_key(job), json.dumps(body))

    def heartbeat(self, job: str, token: str | None = None, trainer_started: datetime | None = None,
                  step: int | None = None, listed: bool = True) -> None:
        """The heartbeat as the VM agent writes it: its fields also in the object's custom metadata,
        the token's proof in place of the token (``listed=False``: an older agent's, body only)."""
        attempt = self.status(job).attempt
        body = {"attempt": attempt, "token": self._token(job, attempt, token), **_started(trainer_started),
                **({"step": step} if step is not None else {})}
        self.store.put(BUCKET, names.heartbeat_key(job), json.dumps(body),
                       metadata=listing_metadata(body) if listed else None)

    def _token(self, job: str, attempt: int, token: str | None) -> str:
        if token is not None:
            return token
        st = self.status(job)
        return (st.attempt_token or "") if st.attempt == attempt else f"old-token-{attempt}"

    def checkpoint(self, step: int, complete: bool = True) -> None:
        self.store.put(CKPT_BUCKET, f"run/{step}/state.bin", b"w" * 8)
        if complete:
            self.store.put(CKPT_BUCKET, f"run/{step}/commit_success.txt", b"")

    # -- what a test looks at ----------------------------------------------------------
    def status(self, job: str) -> JobStatus:
        return JobStatus.from_json(self.store.read(BUCKET, names.status_key(job)).data)

    def live(self, job: str | None = None) -> list[str]:
        return sorted(i.name for i in self.compute.live(job))

    def metadata(self, name: str) -> dict[str, str]:
        """What the VM reads from its metadata server now: its insert's, and the go if it was given."""
        return self.compute.metadata_of(name)

    def advance(self, **kw: float) -> None:
        self.clock.advance(timedelta(**kw))


def lost_unseen(h: Harness, lose: Any, job: str) -> tuple[datetime, datetime, JobStatus]:
    """A loss no VM tells of (``lose``: a hard preemption, Compute's record made now), and the pass
    that sees it 50 s later: when it was lost, when seen, and the job's status after that pass."""
    lose()
    lost = h.clock.now()
    h.advance(seconds=50)
    h.tick()
    return lost, h.clock.now(), h.status(job)


def under_cli(monkeypatch: Any, columns: int = 400) -> Harness:
    """A harness that the `respawn` CLI reads and writes (its store and compute in place of
    Google's), on a terminal ``columns`` wide."""
    from controller.service import bootstrap
    from controller.service.config import Settings

    monkeypatch.setenv("COLUMNS", str(columns))
    h = Harness()
    bootstrap.override(None, Settings(bucket=BUCKET, project=PROJECT, trainer_service_account=TRAINER),
                       h.store, h.compute)
    return h


def cli_against(cloud: Any, monkeypatch: Any, columns: int = 200) -> None:
    """The `respawn` CLI pointed at a running local cloud (``localcloud.stack.LocalCloud``): its
    environment, a terminal ``columns`` wide, no question asked, no process state left from before."""
    from controller.cli import submitting
    from controller.service import bootstrap

    for key, value in cloud.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setattr(submitting, "interactive", lambda: False)
    bootstrap.override(None)
