"""Deliver job notifications: to Pub/Sub topics and Slack-compatible webhooks.

The executor hands over a commit's notices right after its compare-and-swap succeeded
(``controller.core.notify`` decides what they are). Delivery never holds reconciliation: every
call is bounded by its adapter's timeout, a failure is logged and dropped, and nothing
raises out of ``deliver``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from controller.core import errors
from controller.core.notify import Notice
from controller.core.policy import ControllerPolicy
from controller.core.ports import Publisher, Webhook
from controller.core.spec import Notify

log = logging.getLogger(__name__)


@dataclass
class Notifier:
    """The controller's destinations (the policy's) plus each job's own (its spec's ``notify``)."""

    policy: ControllerPolicy
    publisher: Publisher | None = None  # in production built on first use (bootstrap.LazyPublisher)
    webhook: Webhook | None = None
    failures: list[str] = field(default_factory=list)  # the last few, for tests and the pass's log

    def destinations(self, mine: Notify | None) -> tuple[list[str], list[str]]:
        """(topics, webhook URLs) for a job whose own are ``mine``, each once. A job's own are
        checked against the policy as it is now: a status records them, and whoever may write
        a spec may write a status too; one the policy refuses is dropped."""
        if mine is not None and (refused := self.policy.notify_problems(mine)):
            log.warning("a job's own notification destinations are refused by the policy; dropped",
                        extra={"json_fields": {"problems": refused}})
            mine = None
        topics = [t for t in (self.policy.notify_topic, mine.topic if mine else None) if t]
        hooks = [u for u in (self.policy.notify_webhook, mine.webhook if mine else None) if u]
        return list(dict.fromkeys(topics)), list(dict.fromkeys(hooks))

    def deliver(self, mine: Notify | None, notices: Sequence[Notice]) -> None:
        """Send ``notices`` to the controller's destinations and the job's own (``mine``)."""
        if not notices:
            return
        topics, hooks = self.destinations(mine)
        for notice in notices:
            for topic in topics:
                self._try(f"publish {notice.id} to {topic}",
                          lambda t=topic, n=notice: self._publisher().publish(t, n.data(), n.attributes()))
            for url in hooks:
                self._try(f"post {notice.id} to the webhook", lambda u=url, n=notice: self._webhook().post(u, n.webhook_body()))

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
            self.failures = [*self.failures, text][-20:]
            log.warning("notification not delivered: %s", text, extra={"json_fields": {"notify": what}})
