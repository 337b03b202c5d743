"""``respawn canary``: what no document gives, measured on the user's own project.

Google publishes no figure for how soon ``instance/preempted`` turns TRUE after a preemption is
decided, how long a Spot VM stays STOPPING, how long an insert takes to be RUNNING, or how long a
System Event entry takes through the Logging sink and Pub/Sub to ``on_audit``; the local cloud's
realism model (``localcloud.realism``) assumes them. The canary measures them through the deployed
controller's own pipeline: it submits a few canary jobs (cheap Spot VMs, ``sleep`` as the command,
the default 120 s notice) as ``respawn submit`` uploads a spec, waits until each VM's agent has
started its command, preempts each VM with Compute's ``instances.simulateMaintenanceEvent``
(Google's documented way to test preemption handling), and watches: the notice record and its
upload, the standby the controller inserts, the old VM's STOPPING and TERMINATED, the standby's
boot and its agent, and ``on_audit``'s own log entry for the preemption. It then cancels and
removes its jobs and deletes any VM of theirs still there, whatever happened (an error, Ctrl-C:
``clean``, which a second Ctrl-C does not cut short).

Each job's spec also bounds it should this command die before its cleanup: ``policy.max_runtime``
and a command that ends by itself, so the controller ends it, and deletes its VMs, within the hour.

The figures (``controller.cli.canaryfigures``) go to a JSON file ``localcloud.realism`` reads
(``Realism.from_canary``, ``respawn local up --realism FILE``).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from controller.cli.canaryfigures import Preemption, Vm
from controller.core import errors, names
from controller.core.state import JobStatus, Phase
from controller.service import fanout
from controller.service.jobs import Jobs

POLL_S = 0.5  # between two looks at a VM about to be preempted
# ... and at one going down: TERMINATED may last only until the controller deletes the VM, which
# it does once its marker is in. Four reads a second per VM, a few seconds long, against Compute's
# 1,500 reads a minute per project (the controller's own included).
FAST_POLL_S = 0.25
SLOW_S = 2.0  # between two reads of a job's status and records
LOG_POLL_S = 5.0  # between two reads of Cloud Logging (it allows 60 a minute per project)
AUDIT_WAIT_S = 120.0  # how long on_audit's entry is looked for after the soft-off
NOTICE_S = 120  # the notice a Spot job asks for by default (spec.DEFAULT_NOTICE)
SHUTDOWN_S = 35  # Spot's 30 s from the soft-off to the hard-off, and some slack
CLEAN_S = 600.0  # the cleanup's bound: Compute deletes a Spot VM in a minute or so, the controller first
READ_TIMEOUT_S = 10.0  # one Compute read's bound: a poll that hangs must not stop the others
HANDLED = "audit event handled"  # on_audit's log line (controller.service.functions)
PREEMPTED = "compute.instances.preempted"


class CanaryError(errors.RespawnError):
    """The canary could not get its VMs to the point it measures (not a measurement missing)."""


@dataclass(frozen=True)
class Plan:
    project: str
    zones: tuple[str, ...]
    machine_type: str
    vms: int
    wait: float  # seconds each stage may take: the VMs' boot, then their preemption and standby
    token: str = field(default_factory=lambda: secrets.token_hex(3))

    @property
    def jobs(self) -> list[str]:
        return [f"canary-{self.token}-{i + 1}" for i in range(self.vms)]

    @property
    def lifetime(self) -> int:
        """Seconds a canary job may live at most, should this command die before its cleanup."""
        return int(2 * self.wait + NOTICE_S + SHUTDOWN_S + CLEAN_S)

    def spec(self, job: str) -> bytes:
        """A cheap Spot VM whose command waits, with the default notice; the zones in order, so
        that its standby goes to the next zone (the preempting zone last, as for any job)."""
        return json.dumps({
            "name": job, "zones": list(self.zones), "machine_type": self.machine_type, "provisioning": "spot",
            "placement": "ordered", "command": f"sleep {self.lifetime}", "labels": {"canary": self.token},
            # One restart: the standby. Past the lifetime the controller ends it (this command died).
            "policy": {"max_restarts": 1, "max_runtime": f"{self.lifetime}s"},
        }).encode()


@dataclass
class _Watch:
    """One job while it is watched: what it is made of, and what has been seen of it."""

    seen: Preemption
    status: JobStatus | None = None
    read: set[tuple[str, int]] = field(default_factory=set)  # (object, generation) already read
    heartbeats: dict[int, datetime] = field(default_factory=dict)  # attempt -> trainer_started
    waiting: dict[int, datetime] = field(default_factory=dict)  # attempt -> waiting_since (a ready record)
    standby_attempt: int = 0
    first_gone: bool = False
    soft_off_seen: float | None = None  # time.monotonic() of the first poll that saw it going down
    over: bool = False  # the job ended meanwhile (FAILED, CANCELLED...): nothing more will come

    @property
    def first(self) -> Vm:
        return self.seen.first

    def done(self, now: float) -> bool:
        p = self.seen
        if self.over:
            return True
        down = p.terminated_seen is not None or self.first_gone
        standby = p.standby is not None and p.standby.agent is not None and p.standby.running is not None
        audit = p.audit_handled is not None or (self.soft_off_seen is not None and now - self.soft_off_seen > AUDIT_WAIT_S)
        return down and standby and audit and p.recorded is not None


class Canary:
    """``run`` measures; ``clean`` removes what ``run`` made (call it in a ``finally``)."""

    def __init__(self, plan: Plan, jobs: Jobs, compute: Any, logs: Callable[[], Any],
                 say: Callable[[str], None]) -> None:
        """``compute``: the CLI's Compute gateway (``controller.adapters.compute.ComputeEngine``:
        its ``instances`` and ``zone_ops`` clients, ``list_managed``, ``delete``); ``logs``: builds
        a google-cloud-logging client (``controller.adapters.google.logging_client``)."""
        self.plan, self.jobs, self.compute, self.say = plan, jobs, compute, say
        self._logs_factory, self._logs = logs, None
        self.submitted: list[str] = []
        self.watches: dict[str, _Watch] = {}

    # -- the measurement --------------------------------------------------------------------
    def run(self) -> list[Preemption]:
        p = self.plan
        for job in p.jobs:
            self.jobs.submit(p.spec(job), job)
            self.submitted.append(job)
        self.say(f"submitted {_named(p.jobs)}: {p.machine_type} Spot, 120 s notice")
        self.say(f"waiting for their VMs' agents (at most {p.wait:g} s)")
        self._boot()
        self._preempt()
        self._observe()
        self._last_look()
        self._operations()
        for w in self.watches.values():
            _say_unseen(w.seen)
        return [w.seen for w in self.watches.values()]

    def _boot(self) -> None:
        deadline = time.monotonic() + self.plan.wait
        pending = list(self.plan.jobs)
        while pending:
            fanout.each(pending, self._look_booting, workers=8)
            ready = [job for job in pending if job in self.watches and self.watches[job].first.agent
                     and self.watches[job].first.running]
            for job in ready:
                w = self.watches[job]
                self.say(f"{w.first.name} RUNNING in {w.first.zone}, its agent "
                         f"{(w.first.agent - w.first.running).total_seconds():.1f} s later")  # type: ignore[operator]
            pending = [job for job in pending if job not in ready]
            if pending and time.monotonic() > deadline:
                raise CanaryError(f"not running after {self.plan.wait:g} s: "
                                  + "; ".join(self._why_not(job) for job in pending)
                                  + " (is the controller deployed? `respawn doctor`; more time: --wait)")
            if pending:
                time.sleep(2 * POLL_S)

    def _look_booting(self, job: str) -> None:
        try:
            st = self.jobs.status(job)
            if st is not None and st.phase.terminal:
                raise CanaryError(f"{job} ended {st.phase} before it was preempted: {st.message}")
            # RUNNING as the controller has it (its insert acknowledged, its VMs seen running): a
            # notice before that is another case (the controller may not stand by for it yet).
            if st is None or st.attempt != 1 or st.phase != Phase.RUNNING or not st.inserted or not st.instances \
                    or st.zone is None:
                return
            w = self.watches.setdefault(job, _Watch(Preemption(job, Vm(st.instances[0], st.zone))))
            w.status = st
            self._records(w)
            w.first.agent = w.heartbeats.get(1)
            found = self._instance(w.first)
            if found is not None and found.status == "RUNNING":
                w.first.running = _time(found.last_start_timestamp)
        except errors.RespawnError as e:
            if isinstance(e, CanaryError):
                raise
            self.say(f"{job}: {e} (trying again)")

    def _why_not(self, job: str) -> str:
        w = self.watches.get(job)
        st = w.status if w else self.jobs.status(job)
        if st is None:
            return f"{job} not taken up by the controller"
        if w is None or w.first.running is None:
            return f"{job} {st.phase}: {st.message}"
        return f"{w.first.name} RUNNING, its agent silent (no heartbeat)"

    def _preempt(self) -> None:
        from controller.adapters.compute import translate

        for w in self.watches.values():
            try:
                op = self.compute.instances.simulate_maintenance_event_unary(
                    project=self.plan.project, zone=w.first.zone, instance=w.first.name)
            except Exception as e:  # noqa: BLE001 - the client's errors, said as respawn says them
                raise translate(e, w.first.zone) from e
            w.seen.simulated = _time(op.insert_time)
        self.say(f"preempted {len(self.watches)} VMs (instances.simulateMaintenanceEvent)")

    def _observe(self) -> None:
        limit = self.plan.wait + NOTICE_S + SHUTDOWN_S + AUDIT_WAIT_S
        bound = time.monotonic() + limit
        since = min((w.seen.simulated for w in self.watches.values() if w.seen.simulated), default=_now())
        next_slow = next_log = time.monotonic()
        said: set[tuple[str, str]] = set()
        while True:
            now = time.monotonic()
            watching = [w for w in self.watches.values() if not w.done(now)]
            if not watching:
                return
            if now > bound:
                for w in watching:
                    w.seen.notes.append(f"not all seen within {limit:g} s (--wait)")
                    w.seen.cut_short = True
                return
            slow = now >= next_slow
            next_slow = now + SLOW_S if slow else next_slow
            fanout.each(watching, lambda w: self._look(w, slow), workers=8)
            if now >= next_log and any(w.soft_off_seen is not None and w.seen.audit_handled is None for w in watching):
                self._audit([w for w in watching if w.seen.audit_handled is None], since)
                next_log = now + LOG_POLL_S
            for w in watching:
                self._tell(w, said)
            going = any(w.soft_off_seen is not None and w.seen.terminated_seen is None and not w.first_gone
                        for w in watching)
            time.sleep(FAST_POLL_S if going else POLL_S)

    def _look(self, w: _Watch, slow: bool) -> None:
        """One look at a job being preempted; a read that fails is tried again at the next."""
        p = w.seen
        try:
            if p.terminated_seen is None and not w.first_gone:
                self._first_down(w)
            if p.marker is None:
                try:
                    p.marker = self.jobs.store.stat(self.jobs.bucket, names.marker_key(p.job)).updated
                except errors.NotFound:
                    pass
            if slow:
                w.status = self.jobs.status(p.job) or w.status
                self._records(w)
                self._from_status(w)
                if p.standby is not None and (p.standby.running is None or p.standby.agent is None):
                    found = self._instance(p.standby)
                    if found is not None and found.status == "RUNNING" and found.last_start_timestamp:
                        p.standby.running = _time(found.last_start_timestamp)
                    p.standby.agent = w.waiting.get(w.standby_attempt) or w.heartbeats.get(w.standby_attempt)
        except errors.RespawnError as e:
            if not any(str(e) in n for n in p.notes[-1:]):
                p.notes.append(f"a read failed, tried again: {e}")

    def _last_look(self) -> None:
        """Each job's status once more: what the controller recorded after the last slow look (the
        marker's time, in the loss event of the pass that consumed it, may be there alone)."""
        def look(w: _Watch) -> None:
            try:
                w.status = self.jobs.status(w.seen.job) or w.status
            except errors.RespawnError:
                return
            self._from_status(w)

        fanout.each(list(self.watches.values()), look, workers=8)

    def _first_down(self, w: _Watch) -> None:
        """The preempted VM going down: when first seen so, and, while TERMINATED, Compute's time of
        it (lastStopTimestamp), which goes with the VM once the controller deletes it."""
        p, found = w.seen, self._instance(w.first)
        at = time.time()
        if found is None:
            w.first_gone = True
            p.notes.append(f"{w.first.name} gone before TERMINATED was seen: the controller deletes a preempted "
                           "VM once its marker is in, and it was still STOPPING (or TERMINATED for less than "
                           f"{FAST_POLL_S:g} s)" + (f", about {(_now() - p.marker).total_seconds():.1f} s after its "
                                                    "marker" if p.marker else ""))
            return
        if found.status in ("STOPPING", "TERMINATED", "STOPPED") and w.soft_off_seen is None:
            w.soft_off_seen = time.monotonic()
            p.stopping_seen = at
        if found.status in ("TERMINATED", "STOPPED"):
            p.terminated_seen, p.terminated = at, _time(found.last_stop_timestamp)

    def _records(self, w: _Watch) -> None:
        """The job's VM records not read yet: heartbeats and ready records (by attempt), the notice."""
        p = w.seen
        for info in self.jobs.store.list(self.jobs.bucket, f"{names.JOBS_PREFIX}{p.job}/"):
            kind = info.name.rsplit("/", 1)[-1]
            if kind not in (names.HEARTBEAT, names.READY, names.NOTICE) or (info.name, info.generation) in w.read:
                continue
            try:
                body = json.loads(self.jobs.store.read_listed(info))
            except errors.NotFound:
                continue  # replaced or consumed since the listing: the next look reads its successor
            except ValueError:
                body = None
            w.read.add((info.name, info.generation))
            if not isinstance(body, dict) or not isinstance(body.get("attempt"), int):
                continue
            attempt = body["attempt"]
            if kind == names.HEARTBEAT and (started := _time(body.get("trainer_started"))):
                w.heartbeats.setdefault(attempt, started)
            elif kind == names.READY and (since := _time(body.get("waiting_since"))):
                w.waiting.setdefault(attempt, since)
            elif kind == names.NOTICE and attempt == 1 and p.recorded is None:
                p.preempted, p.recorded = _time(body.get("at")), info.updated
                if isinstance(body.get("notice_s"), int) and body["notice_s"] == 0:
                    p.notes.append("the notice record says no notice came (notice_s 0): written at the soft-off")

    def _from_status(self, w: _Watch) -> None:
        """The standby (while it stands by, then as the current attempt) and the controller's times."""
        p, st = w.seen, w.status
        if st is None:
            return
        p.notice_s = st.notice_s if p.notice_s is None else p.notice_s
        if st.notice_refused and not any("refused" in n for n in p.notes):
            p.notes.append(f"no notice: the project refused preemptionNoticeDuration ({st.notice_refused})")
        # The standby while it stands by, then as the current attempt once given the go; another
        # in its place (one withdrawn before it ran: its insert refused) replaces it.
        named = (st.standby.attempt, st.standby.instances[0], st.standby.zone) if st.standby is not None else \
            (st.attempt, st.instances[0], st.zone) if st.attempt > 1 and st.instances and st.zone else None
        if named is not None and (p.standby is None or p.standby.running is None and p.standby.name != named[1]):
            w.standby_attempt, p.standby = named[0], Vm(named[1], named[2])
        for event in st.history:
            if event.attempt == 1 and event.event == "standby" and p.decided is None:
                p.decided = event.at
            if event.attempt == 1 and event.event in ("preempted", "maintenance") and event.since and p.marker is None:
                p.marker = event.since  # the marker's GCS time, as the pass that acted on it read it
        if st.phase.terminal and not w.done(time.monotonic()):
            p.notes.append(f"{p.job} ended {st.phase} before all was seen: {st.message}")
            w.over = p.cut_short = True

    def _tell(self, w: _Watch, said: set[tuple[str, str]]) -> None:
        p = w.seen

        def once(what: str, line: str) -> None:
            if (p.job, what) not in said:
                said.add((p.job, what))
                self.say(line)

        if p.recorded and p.simulated:
            once("notice", f"{p.first.name}: notice recorded in {(p.recorded - p.simulated).total_seconds():.1f} s")
        if p.standby is not None:
            once("standby", f"{p.job}: standby {p.standby.name} in {p.standby.zone}")
        if p.terminated_seen is not None or w.first_gone:
            once("down", f"{p.first.name}: {'TERMINATED' if p.terminated_seen is not None else 'gone'}")
        if p.standby is not None and p.standby.agent is not None:
            once("agent", f"{p.standby.name}: its agent up")

    def _audit(self, watching: Sequence[_Watch], since: datetime) -> None:
        """on_audit's own log entry for each VM's preemption: the System Event entry's timestamp
        (its ``at``) and when the function was done with it (the entry's)."""
        from controller.adapters.compute import translate

        by_name = {w.first.name: w for w in watching}
        query = (f'jsonPayload.message="{HANDLED}" AND jsonPayload.method="{PREEMPTED}" AND '
                 f'jsonPayload.instance=({" OR ".join(json.dumps(n) for n in by_name)}) AND '
                 f'timestamp>="{(since - timedelta(minutes=1)).isoformat()}"')
        try:
            if self._logs is None:
                self._logs = self._logs_factory()
            entries = list(self._logs.list_entries(resource_names=[f"projects/{self.plan.project}"], filter_=query,
                                                   order_by="timestamp asc", max_results=100))
        except Exception as e:  # noqa: BLE001 - Logging's trouble costs this figure only
            error = e if isinstance(e, errors.RespawnError) else translate(e, "*")
            for w in watching:
                if not any("Cloud Logging" in n for n in w.seen.notes):
                    w.seen.notes.append(f"Cloud Logging could not be read: {error}")
            return
        for entry in entries:
            payload = entry.payload if isinstance(entry.payload, dict) else {}
            w = by_name.get(str(payload.get("instance")))
            if w is not None and w.seen.audit_handled is None and (at := _time(payload.get("at"))):
                w.seen.audit_at, w.seen.audit_handled = at, entry.timestamp

    def _operations(self) -> None:
        """Compute's own times, from each VM's zone operations: its insert, and the preemption."""
        from controller.adapters.compute import v1

        compute_v1 = v1()
        for w in self.watches.values():
            for vm in w.seen.vms:
                request = compute_v1.ListZoneOperationsRequest(project=self.plan.project, zone=vm.zone,
                                                               filter=f'targetLink eq ".*/instances/{vm.name}"')
                try:
                    ops = [op for op in self.compute.zone_ops.list(request=request)
                           if op.target_link.endswith(f"/instances/{vm.name}")]
                except Exception as e:  # noqa: BLE001 - this VM's operations only
                    w.seen.notes.append(f"the operations of {vm.name} could not be listed: {e}")
                    continue
                vm.inserted = min((t for op in ops if op.operation_type in ("insert", "bulkInsert")
                                   if (t := _time(op.insert_time))), default=None)
                if vm is w.seen.first:
                    w.seen.soft_off = min((t for op in ops if op.operation_type == PREEMPTED
                                           if (t := _time(op.insert_time))), default=None)

    def _instance(self, vm: Vm) -> Any:
        """The instance as Compute has it now; None when it is gone."""
        from google.api_core import exceptions as gexc

        from controller.adapters.compute import translate

        try:
            return self.compute.instances.get(project=self.plan.project, zone=vm.zone, instance=vm.name,
                                              timeout=READ_TIMEOUT_S)
        except gexc.NotFound:
            return None
        except Exception as e:  # noqa: BLE001 - said as respawn says a Compute error
            raise translate(e, vm.zone) from e

    # -- the cleanup ------------------------------------------------------------------------
    def clean(self, bound: float = CLEAN_S) -> list[str]:
        """Remove what ``run`` made (``controller.cli.canaryclean``): what is left, in words."""
        from controller.cli.canaryclean import Cleanup

        return Cleanup(self.plan.project, self.plan.zones, self.jobs, self.compute, self.say).run(self.submitted, bound)


def _say_unseen(p: Preemption) -> None:
    """A note for each time not seen that no note explains yet: a figure missing is always said."""
    said = " ".join(p.notes)
    unseen = [
        (p.recorded is None, "its notice record was not seen"),
        (p.standby is None, "no standby was seen"),
        (p.standby is not None and p.decided is None, f"no standby: {p.standby.name} was inserted only as the "
                                                      "next attempt (its spans are that attempt's)"),
        (p.soft_off is None, f"no {PREEMPTED} operation was listed for it"),
        (p.marker is None, "its marker was not seen (consumed by the controller between two looks, and the "
                           "status's loss event gives no time)"),
        (p.terminated_seen is not None and p.terminated is None, "TERMINATED without a lastStopTimestamp"),
        (p.audit_handled is None and "Cloud Logging" not in said,
         f"on_audit's '{HANDLED}' entry for it was not found in Cloud Logging within {AUDIT_WAIT_S:g} s"),
    ]
    p.notes.extend(note for missing, note in unseen if missing and note not in said)


def _time(value: object) -> datetime | None:
    """An RFC 3339 time as Compute, GCS, Logging and the VM agent write them; None otherwise."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _now() -> datetime:
    return datetime.now(UTC)


def _named(jobs: Sequence[str]) -> str:
    """canary-ab12cd-1..3 for a run of jobs numbered from 1; the one name for one."""
    return jobs[0] if len(jobs) == 1 else f"{jobs[0]}..{len(jobs)}"


