"""A local Cloud Pub/Sub (v1) REST server: topics, pull subscriptions, publish, pull, acknowledge.

What the real ``google-cloud-pubsub`` clients talk to with ``transport="rest"`` and
``client_options={"api_endpoint": server.endpoint}`` (gcloud: ``CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB
= endpoint + "/"``). Routes and request schemas come from Google's ``pubsub.v1`` discovery
document (routed by ``flatPath``, as ``localcloud.tpu``); a body with a field the schema does not
have is refused 400 as Google's front end refuses it. Served: ``SUPPORTED``; any other method of
the document answers 501, a path that is none of them 404.

As the API answers (errors are one-platform JSON, ``{"error": {"code", "message", "status"}}``):

- a topic or subscription that does not exist: 404 NOT_FOUND ``Resource not found
  (resource=<id>).``; one that does, on create: 409 ALREADY_EXISTS ``Resource already exists in
  the project (resource=<id>).`` (the texts users quote from Google, e.g. googleapis/nodejs-pubsub
  #1269, GoogleCloudPlatform/nodejs-getting-started #351);
- a name outside Google's rules (3-255 characters, a letter first, then letters, digits and
  ``-_.~+%``, never ``goog`` first): 400 ``Invalid resource name given (name=...)``;
- ``messageIds`` are decimal strings; ``data`` is base64 (standard alphabet, as proto3 JSON
  writes ``bytes``), refused 400 when it does not decode; an empty ``messages`` list, or a
  message with neither data nor attributes, is refused 400;
- a message goes to every subscription that exists when it is published (none: it is dropped,
  as Google drops it); a pulled message not acknowledged within its subscription's
  ``ackDeadlineSeconds`` (default 10) is delivered again with a new ``ackId``; an ``ackId`` this
  server never issued is refused 400; one that is stale (redelivered since) is ignored;
- a deleted topic's subscriptions live on, their ``topic`` reading ``_deleted-topic_``;
- ``pull`` without ``returnImmediately`` waits up to ``pull_wait`` seconds for a message
  before answering ``{}`` (Google holds it open longer); push subscriptions are not served (501).

Faults: ``fail_next("topics.publish", 503, times=2)`` (or ``POST /_local/fail_next`` with those
arguments as JSON) answers the next calls of that method with that HTTP error, as a Google
outage or a rate limit (429) would.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import re
import secrets
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from typing import Any

from flask import Flask, Response, request

from localcloud import discovery
from localcloud.host import Host, json_response
from localcloud.http import Server
from localcloud.tpu_api import STATUS, enums

DOC = "pubsub.v1"
SUPPORTED = {
    "projects.topics": ("create", "get", "delete", "publish"),
    "projects.subscriptions": ("create", "get", "delete", "pull", "acknowledge"),
}
NAME_RE = re.compile(r"[A-Za-z][-A-Za-z0-9_.~+%]{2,254}")
DELETED_TOPIC = "_deleted-topic_"
MAX_REQUEST_BYTES = 10 * 1024 * 1024  # Google: "Request payload size exceeds the limit: 10485760 bytes."
DEFAULT_ACK_DEADLINE = 10
RETENTION = "604800s"  # 7 days, what Google answers for a subscription that names none


class PubsubError(Exception):
    """An HTTP error answered as one-platform APIs do (google.rpc.Status in JSON)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "status": STATUS.get(self.code, "UNKNOWN")}}


def not_found(name: str) -> PubsubError:
    return PubsubError(404, f"Resource not found (resource={name.rsplit('/', 1)[-1]}).")


@dataclass
class _Message:
    id: str
    data: str  # base64, as received
    attributes: dict[str, str]
    published: str  # RFC 3339

    def resource(self) -> dict[str, Any]:
        out: dict[str, Any] = {"messageId": self.id, "publishTime": self.published}
        if self.data:
            out["data"] = self.data
        if self.attributes:
            out["attributes"] = dict(self.attributes)
        return out


@dataclass
class _Delivery:
    message: _Message
    visible_at: float = 0.0  # monotonic: deliverable (again) from then on
    ack_id: str | None = None  # the ack id of its latest delivery
    attempts: int = 0


@dataclass
class _Subscription:
    resource: dict[str, Any]
    backlog: list[_Delivery] = field(default_factory=list)  # published, not acknowledged, in order

    @property
    def ack_deadline(self) -> float:
        return float(self.resource.get("ackDeadlineSeconds") or DEFAULT_ACK_DEADLINE)


class PubsubServer(Server):
    name, threads = "pubsub", 16

    def __init__(self, *, pull_wait: float = 0.5) -> None:
        self.pull_wait = pull_wait
        self._topics: dict[str, dict[str, Any]] = {}  # full name -> Topic
        self._subscriptions: dict[str, _Subscription] = {}  # full name -> subscription
        self._published: dict[str, list[_Message]] = defaultdict(list)  # topic -> every message, in order
        self._acks: dict[str, tuple[str, _Delivery]] = {}  # every ack id issued -> (subscription, delivery)
        self._failures: dict[str, list[int]] = defaultdict(list)  # "topics.publish" -> HTTP codes to answer
        self._ids = itertools.count(int(time.time()) * 1000)
        self._lock = threading.Condition()
        self._routes = discovery.served(DOC, SUPPORTED)

    @property
    def endpoint(self) -> str:
        """What ``client_options.api_endpoint`` takes (``http://127.0.0.1:PORT``)."""
        return self.address

    url = endpoint

    # -- what a test looks at or injects -----------------------------------------------------------
    def fail_next(self, method: str, code: int = 503, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` (``"topics.publish"``) answer HTTP ``code``."""
        if code not in STATUS or code < 400:
            raise ValueError(f"not an error code this server answers: {code}")
        with self._lock:
            self._failures[method].extend([int(code)] * int(times))

    def heal(self) -> None:
        """No more injected failures."""
        with self._lock:
            self._failures.clear()

    def published(self, topic: str) -> list[dict[str, Any]]:
        """Every message published to ``topic`` (its full name), in order, as the API writes one."""
        with self._lock:
            return [m.resource() for m in self._published.get(topic, [])]

    def topics(self) -> list[str]:
        with self._lock:
            return sorted(self._topics)

    # -- HTTP ---------------------------------------------------------------------------------
    def _app(self) -> Flask:
        app = Flask("pubsub")

        @app.route("/v1/<path:path>", methods=["GET", "POST", "DELETE", "PATCH", "PUT"])
        def v1(path: str) -> Response:
            try:
                return json_response(self._dispatch(request.method, f"v1/{path}"))
            except PubsubError as e:
                return json_response(e.body(), e.code)

        Host._fault_route(app, {"fail_next": self.fail_next})
        return app

    def _dispatch(self, verb: str, path: str) -> dict[str, Any]:
        method, match, name = discovery.resolve(self._routes, verb, path, "Pub/Sub", PubsubError)
        with self._lock:
            if self._failures.get(name):
                code = self._failures[name].pop(0)
                raise PubsubError(code, "The service was unable to fulfill your request. Please try again."
                                  if code >= 500 else "Request was throttled. Please try again later.")
        numbers = "enum-encoding=int" in request.args.get("$alt", "")
        body: dict[str, Any] = {}
        if method.request_schema:
            body = self._body(method.request_schema)
        handler = getattr(self, f"_{name.replace('.', '_')}")
        answer = handler(match.groupdict(), body)
        return enums(answer, _descriptor(method.response_schema), numbers) if method.response_schema else answer

    def _body(self, schema: str) -> dict[str, Any]:
        """The request body, checked against the discovery schema. Every Pub/Sub method takes the
        whole body as its request message (``body: "*"``), so paths are named from its root."""
        if request.content_length and request.content_length > MAX_REQUEST_BYTES:
            raise PubsubError(400, f"Request payload size exceeds the limit: {MAX_REQUEST_BYTES} bytes.")
        raw = request.get_data()
        body = {} if not raw else request.get_json(silent=True)
        if not isinstance(body, dict):
            raise PubsubError(400, "Invalid JSON payload received. Expected an object.")
        body = enums(body, _descriptor(schema), numbers=False)  # a client may send enums by number
        problems = discovery.validate(body, schema, "\0", doc=DOC)
        if problems:
            raise PubsubError(400, problems[0].replace(" at '\0'", "").replace("'\0.", "'"))
        return body

    # -- topics ----------------------------------------------------------------------------------
    def _topics_create(self, p: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        name = _name(p["projectsId"], "topics", p["topicsId"])
        with self._lock:
            if name in self._topics:
                raise PubsubError(409, f"Resource already exists in the project (resource={p['topicsId']}).")
            self._topics[name] = {**body, "name": name}
            return dict(self._topics[name])

    def _topics_get(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        with self._lock:
            return dict(self._topic(p["projectsId"], p["topicsId"]))

    def _topics_delete(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        with self._lock:
            name = self._topic(p["projectsId"], p["topicsId"])["name"]
            del self._topics[name]
            for sub in self._subscriptions.values():
                if sub.resource["topic"] == name:
                    sub.resource["topic"] = DELETED_TOPIC
        return {}

    def _topics_publish(self, p: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        if not messages:
            raise PubsubError(400, "The value for message_count is too small. You passed 0 in the request, "
                                   "but the minimum value is 1.")
        for i, message in enumerate(messages):
            data = message.get("data") or ""
            try:
                base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                raise PubsubError(400, f"Invalid value at 'messages[{i}].data' (TYPE_BYTES), "
                                       f"Base64 decoding failed for \"{data[:64]}\"") from None
            if not data and not message.get("attributes"):
                raise PubsubError(400, "Some messages in the publish request are empty: each message must "
                                       "have non-empty data or at least one attribute.")
        with self._lock:
            topic = self._topic(p["projectsId"], p["topicsId"])["name"]
            stamp = _now()
            out = []
            for message in messages:
                m = _Message(str(next(self._ids)), message.get("data") or "", dict(message.get("attributes") or {}),
                             stamp)
                self._published[topic].append(m)
                for sub in self._subscriptions.values():
                    if sub.resource["topic"] == topic:
                        sub.backlog.append(_Delivery(m))
                out.append(m.id)
            self._lock.notify_all()
        return {"messageIds": out}

    def _topic(self, project: str, topic: str) -> dict[str, Any]:
        name = _name(project, "topics", topic)
        if name not in self._topics:
            raise not_found(name)
        return self._topics[name]

    # -- subscriptions ---------------------------------------------------------------------------
    def _subscriptions_create(self, p: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        name = _name(p["projectsId"], "subscriptions", p["subscriptionsId"])
        topic = body.get("topic") or ""
        found = re.fullmatch(r"projects/([^/]+)/topics/([^/]+)", topic)
        if not found:
            raise PubsubError(400, f"Invalid resource name given (name={topic}). Refer to "
                                   "https://cloud.google.com/pubsub/docs/pubsub-basics#resource_names for more "
                                   "information.")
        if (body.get("pushConfig") or {}).get("pushEndpoint"):
            raise PubsubError(501, "Push subscriptions are not implemented by the local Pub/Sub server.")
        deadline = int(body.get("ackDeadlineSeconds") or DEFAULT_ACK_DEADLINE)
        if not 10 <= deadline <= 600:
            raise PubsubError(400, f"Invalid ack deadline given: {deadline} seconds. The minimum is 10 seconds and "
                                   "the maximum is 600 seconds.")
        with self._lock:
            self._topic(found[1], found[2])
            if name in self._subscriptions:
                raise PubsubError(409, f"Resource already exists in the project (resource={p['subscriptionsId']}).")
            resource = {"pushConfig": {}, "messageRetentionDuration": RETENTION,
                        "expirationPolicy": {"ttl": "2678400s"}, "state": "ACTIVE",
                        **body, "name": name, "topic": topic, "ackDeadlineSeconds": deadline}
            self._subscriptions[name] = _Subscription(resource)
            return dict(resource)

    def _subscriptions_get(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        with self._lock:
            return dict(self._subscription(p).resource)

    def _subscriptions_delete(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        with self._lock:
            name = self._subscription(p).resource["name"]
            del self._subscriptions[name]
        return {}

    def _subscriptions_pull(self, p: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        wanted = int(body.get("maxMessages") or 0)
        if wanted < 1:
            raise PubsubError(400, f"The value for max_messages is too small. You passed {wanted} in the request, "
                                   "but the minimum value is 1.")
        until = time.monotonic() + (0 if body.get("returnImmediately") else self.pull_wait)
        with self._lock:
            while True:
                sub = self._subscription(p)  # deleted while waiting: 404
                now = time.monotonic()
                ready = [d for d in sub.backlog if d.visible_at <= now][:wanted]
                if ready or now >= until:
                    break
                self._lock.wait(min(until - now, 0.05))
            received = []
            for delivery in ready:
                delivery.ack_id = f"{secrets.token_urlsafe(24)}-{delivery.message.id}"
                delivery.visible_at = now + sub.ack_deadline
                delivery.attempts += 1
                self._acks[delivery.ack_id] = (sub.resource["name"], delivery)
                received.append({"ackId": delivery.ack_id, "message": delivery.message.resource()})
        return {"receivedMessages": received} if received else {}

    def _subscriptions_acknowledge(self, p: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        ack_ids = body.get("ackIds") or []
        with self._lock:
            sub = self._subscription(p)
            for ack_id in ack_ids:
                found = self._acks.get(ack_id)
                if found is None or found[0] != sub.resource["name"]:
                    raise PubsubError(400, f"You have passed an invalid ack ID to the service (ack_id={ack_id}).")
            for ack_id in ack_ids:
                delivery = self._acks[ack_id][1]
                if delivery.ack_id == ack_id and delivery in sub.backlog:  # stale ids (redelivered since): ignored
                    sub.backlog.remove(delivery)
        return {}

    def _subscription(self, p: dict[str, str]) -> _Subscription:
        name = _name(p["projectsId"], "subscriptions", p["subscriptionsId"])
        if name not in self._subscriptions:
            raise not_found(name)
        return self._subscriptions[name]


def _name(project: str, kind: str, short: str) -> str:
    name = f"projects/{project}/{kind}/{short}"
    if not NAME_RE.fullmatch(short) or short.lower().startswith("goog"):
        raise PubsubError(400, f"Invalid resource name given (name={name}). Refer to "
                               "https://cloud.google.com/pubsub/docs/pubsub-basics#resource_names for more information.")
    return name


def _now() -> str:
    """RFC 3339 UTC with nanoseconds, as Pub/Sub stamps ``publishTime``."""
    moment = datetime.now(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond:06d}000Z"


@cache
def _descriptor(schema: str | None) -> Any:
    """The protobuf message a discovery schema (``"Subscription"``) stands for, to write its enums
    as numbers when the REST client asks for them (``$alt=json;enum-encoding=int``)."""
    if not schema:
        return None
    from google.protobuf import descriptor_pool
    from google.pubsub_v1.types import pubsub  # noqa: F401 - registers google.pubsub.v1 in the default pool

    try:
        return descriptor_pool.Default().FindMessageTypeByName(f"google.pubsub.v1.{schema}")
    except KeyError:
        return None
