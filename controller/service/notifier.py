"""Deliver job notifications: to Pub/Sub topics and Slack-compatible webhooks.

A notice is never on the path of a recovery. The executor hands a commit's notices over once
its job's chain of actions is done (``controller.core.notify`` decides what they are); they go
into the pass's ``Sends``, which starts sending them at once, side by side (one task per job and
destination, so each destination gets one job's notices in order), while the pass goes on with
its other jobs. At its very end, after every job's chain, the pass waits for what is still
under way, at most ``Notifier.wait`` seconds (``RESPAWN_NOTIFY_WAIT``), shared by all its sends:
a destination that does not answer costs the pass that budget once, never a timeout per notice.

What did not fit is never dropped silently. Cloud Functions gives a function CPU only while it
serves a request, so "later" cannot be a thread left to finish after the pass returns:

- a notice not yet sent when the budget ran out is **carried** (``Notifier`` keeps it, in this
  process) and sent first by the next pass of this instance, up to ``MAX_CARRIES`` passes; the
  pass that left it logs its id, and so does the pass that gives up on it. An instance that is
  shut down loses what it carried: the log line that named each id is what is left of it.
- a notice whose send was under way when the budget ran out is **in flight**: it may still
  arrive (its request was sent), so it is never sent again (delivery stays at most once); its id
  is logged.

Every send is bounded by its adapter's own timeout, a failure is logged and dropped (not
retried), and nothing raises out of a send.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field

from controller.core import errors
from controller.core.notify import Notice
from controller.core.policy import ControllerPolicy
from controller.core.ports import Publisher, Webhook
from controller.core.spec import Notify

log = logging.getLogger(__name__)
WAIT = 10.0  # seconds a pass waits at its end for its sends (a Pub/Sub publish takes at most 10)
MAX_CARRIES = 3  # passes a notice is carried to before it is given up (a destination that never answers)
MAX_CARRIED = 1000  # notices carried at most; past it the oldest are given up (each id logged)


@dataclass(frozen=True)
class _Send:
    """One job's notices to one destination, sent in order."""

    topic: str | None
    url: str | None
    notices: tuple[Notice, ...]
    carried: int = 0  # passes that ran out of time before sending it

    @property
    def where(self) -> str:
        return self.topic or "the webhook"  # a webhook URL is a secret: never logged


@dataclass
class Unsent:
    """What a pass's budget did not cover: notice ids carried to the next pass, and those whose
    send was under way (they may still arrive; never sent again)."""

    carried: list[str] = field(default_factory=list)
    in_flight: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.carried or self.in_flight)


@dataclass
class Notifier:
    """The controller's destinations (the policy's) plus each job's own (its spec's ``notify``)."""

    policy: ControllerPolicy
    publisher: Publisher | None = None  # in production built on first use (bootstrap.LazyPublisher)
    webhook: Webhook | None = None
    wait: float = WAIT  # seconds a pass waits, at its end, for its sends still under way
    failures: list[str] = field(default_factory=list)  # the last few, for tests and the pass's log
    _carried: list[_Send] = field(default_factory=list, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def destinations(self, mine: Notify | None) -> tuple[list[str], list[str]]:
        """(topics, webhook URLs) for a job whose own are ``mine``, each once. A job's own are
        checked against the policy as it is now: a status records its topic, and whoever may
        write a spec may write a status too; one the policy refuses is dropped."""
        if mine is not None and (refused := self.policy.notify_problems(mine)):
            log.warning("a job's own notification destinations are refused by the policy; dropped",
                        extra={"json_fields": {"problems": refused}})
            mine = None
        topics = [t for t in (self.policy.notify_topic, mine.topic if mine else None) if t]
        hooks = [u for u in (self.policy.notify_webhook, mine.webhook if mine else None) if u]
        return list(dict.fromkeys(topics)), list(dict.fromkeys(hooks))

    def begin(self, workers: int = 1) -> Sends:
        """A pass's sends, on up to ``workers`` threads; what earlier passes carried goes first."""
        with self._lock:
            carried, self._carried = self._carried, []
        sends = Sends(self, max(1, workers))
        for send in carried:
            sends.start(send)
        return sends

    def deliver(self, mine: Notify | None, notices: Sequence[Notice]) -> Unsent:
        """Send ``notices`` now, within ``wait`` seconds (a pass of its own)."""
        sends = self.begin()
        sends.add(mine, notices)
        return sends.finish()

    @property
    def carried(self) -> list[str]:
        """The ids of the notices carried to the next pass."""
        with self._lock:
            return [n.id for s in self._carried for n in s.notices]

    def _carry(self, sends: Sequence[_Send]) -> list[str]:
        """Keep ``sends`` for the next pass; the ids of those given up instead (logged by the caller)."""
        dropped = [n.id for s in sends if s.carried > MAX_CARRIES for n in s.notices]
        with self._lock:
            self._carried += [s for s in sends if s.carried <= MAX_CARRIES]
            while sum(len(s.notices) for s in self._carried) > MAX_CARRIED:
                dropped += [n.id for n in self._carried.pop(0).notices]
        return dropped

    def _send(self, send: _Send, notice: Notice) -> None:
        if send.topic is not None:
            topic = send.topic
            self._try(f"publish {notice.id} to {topic}",
                      lambda: self._publisher().publish(topic, notice.data(), notice.attributes()))
        elif send.url is not None:
            url = send.url
            self._try(f"post {notice.id} to the webhook", lambda: self._webhook().post(url, notice.webhook_body()))

    def _publisher(self) -> Publisher:
        if self.publisher is None:
            raise errors.ConfigError("this controller was built without a Pub/Sub publisher")
        return self.publisher

    def _webhook(self) -> Webhook:
        if self.webhook is None:
            raise errors.ConfigError("this controller was built without a webhook client")
        return self.webhook

    def _try(self, what: str, send: Callable[[], object]) -> None:
        try:
            send()
        except Exception as e:  # noqa: BLE001 - a notification never stops reconciliation
            text = f"{what}: {type(e).__name__}: {e}"
            with self._lock:
                self.failures = [*self.failures, text][-20:]
            log.warning("notification not delivered: %s", text, extra={"json_fields": {"notify": what}})


class _Task:
    """A send's progress, read under the pass's lock when its budget runs out."""

    def __init__(self, send: _Send) -> None:
        self.send = send
        self.at = 0  # the notice being sent, or next to send
        self.sending = False
        self.done = False


class Sends:
    """One pass's notifications: started as each job's chain hands them over, sent side by
    side, and waited for at the pass's end for at most the notifier's ``wait`` (``finish``)."""

    def __init__(self, notifier: Notifier, workers: int) -> None:
        self._notifier = notifier
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._tasks: list[tuple[_Task, Future[None]]] = []
        self._lock = threading.Lock()
        self._cut = False  # the budget ran out: no send starts any more

    def add(self, mine: Notify | None, notices: Sequence[Notice]) -> None:
        """Start sending one job's ``notices`` to the controller's destinations and its own."""
        if not notices:
            return
        topics, hooks = self._notifier.destinations(mine)
        for topic in topics:
            self.start(_Send(topic, None, tuple(notices)))
        for url in hooks:
            self.start(_Send(None, url, tuple(notices)))

    def start(self, send: _Send) -> None:
        task = _Task(send)
        with self._lock:
            if not self._cut:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="respawn-notify")
                self._tasks.append((task, self._pool.submit(self._run, task)))
                return
        self._notifier._carry([send])  # handed over after the pass's end: the next pass sends it

    def _run(self, task: _Task) -> None:
        for i, notice in enumerate(task.send.notices):
            with self._lock:
                if self._cut:
                    return  # finish() has carried the rest
                task.at, task.sending = i, True
            self._notifier._send(task.send, notice)
            with self._lock:
                task.at, task.sending = i + 1, False
        with self._lock:
            task.done = True

    def finish(self, wait: float | None = None) -> Unsent:
        """Wait for the sends still under way, at most ``wait`` seconds (the notifier's), then
        carry what was not sent to the next pass and log every id this pass leaves unsent."""
        budget = self._notifier.wait if wait is None else wait
        with self._lock:
            futures = [f for _, f in self._tasks]
            pool = self._pool
        if futures:
            wait_for(futures, timeout=max(0.0, budget))
        unsent, carry = Unsent(), []
        with self._lock:
            self._cut = True
            for task, _ in self._tasks:
                if task.done:
                    continue
                rest = task.send.notices[task.at:]
                if task.sending:  # its request is out: it may arrive; never sent again
                    unsent.in_flight.append(rest[0].id)
                    rest = rest[1:]
                if rest:
                    carry.append(_Send(task.send.topic, task.send.url, rest, task.send.carried + 1))
        if pool is not None:
            # Threads still sending are not waited for: each send is bounded by its adapter's
            # timeout, and its outcome is logged by _try when (if) this instance gets CPU again.
            pool.shutdown(wait=False, cancel_futures=True)
        dropped = set(self._notifier._carry(carry))
        unsent.carried = [n.id for s in carry for n in s.notices if n.id not in dropped]
        if unsent or dropped:
            log.warning("notifications not sent within the pass's %g s (RESPAWN_NOTIFY_WAIT): %d carried to the "
                        "next pass, %d under way, %d given up", budget, len(unsent.carried), len(unsent.in_flight),
                        len(dropped),
                        extra={"json_fields": {"notices_carried": unsent.carried, "notices_in_flight": unsent.in_flight,
                                               "notices_given_up": sorted(dropped)}})
        return unsent
