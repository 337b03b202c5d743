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
  before answering ``{}`` (Google holds it open longer);
- a topic's IAM policy (``topics.getIamPolicy`` / ``setIamPolicy`` / ``testIamPermissions``):
  ``bindings`` of a role to members (``user:``, ``serviceAccount:``, ``group:``, ``domain:``...),
  an ``etag`` that changes with each set, and a set whose ``etag`` is not the current one refused
  409 ABORTED (IAM's read-modify-write). An empty policy reads ``{"etag": "ACAB"}``, as Google's.
  Nothing checks the callers of this API (the local cloud has no identities); the policy decides
  what a Logging sink's writer identity may publish (``publish_as``, used by ``localcloud.logging``).

Push subscriptions (``pushConfig.pushEndpoint``: an ``https`` URL, or ``http`` on a loopback host,
the only place a local endpoint can be): each message is POSTed ``push_delay`` seconds after it is
published, and again, while the endpoint answers anything but 102/200/201/202/204 (or nothing
within ``ackDeadlineSeconds``), after an exponential backoff: the subscription's ``retryPolicy``
(``minimumBackoff`` default 10 s, doubling, ``maximumBackoff`` default 600 s, as pubsub.v1.json
documents them; what Eventarc sets on the subscriptions it makes), or, with none, from 100 ms up to
60 s (our reading of Pub/Sub's push backoff, which Google documents as such but does not promise).
Delivery is at least once. The body is Pub/Sub's push format, ``{"message": {"data", "attributes",
"messageId", "message_id", "publishTime", "publish_time"}, "subscription": "projects/P/subscriptions/S"}``;
where the endpoint's query has ``__GCP_CloudEventsMode=CUSTOM_PUBSUB_<topic>`` (what Eventarc puts on
the subscription of a Pub/Sub trigger, e.g. a gen2 function's ``--trigger-topic``) it goes as a
binary-mode CloudEvent: ``ce-type: google.cloud.pubsub.topic.v1.messagePublished``, ``ce-source:
//pubsub.googleapis.com/projects/P/topics/T``, ``ce-id`` the message id, ``ce-time`` its publish
time, the same JSON as data (google-cloudevents' ``MessagePublishedData``).

``push_delay`` (default ``PUSH_DELAY``, 1 s): Google publishes no latency for Pub/Sub push or for
Eventarc's delivery of a Pub/Sub event (its docs say only that delivery is at least once and
retried with 10-600 s backoff, cloud.google.com/eventarc/docs/retry-events); 1 s is a choice, not a
measurement. With ``localcloud.logging``'s sink delay, an entry reaches its function about 2 s
after Compute wrote it.

Faults: ``fail_next("topics.publish", 503, times=2)`` (or ``POST /_local/fail_next`` with those
arguments as JSON) answers the next calls of that method with that HTTP error, as a Google
outage or a rate limit (429) would. ``drop_next(times)`` loses the next pushes (each message is
taken as delivered and never POSTed: a lost event); ``duplicate_next(times)`` POSTs the next
pushes twice (the at-least-once duplicate); both also ``POST /_local/<fault>``.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import logging
import re
import secrets
import threading
import time
from collections import defaultdict
from urllib.parse import parse_qs, unquote, urlsplit
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from typing import Any

import requests
from flask import Flask, Response, request

from localcloud import discovery
from localcloud.host import Host, json_response
from localcloud.http import Server
from localcloud.tpu_api import STATUS, enums
from localcloud.realism import Delay, seconds

DOC = "pubsub.v1"
SUPPORTED = {
    "projects.topics": ("create", "get", "delete", "publish", "getIamPolicy", "setIamPolicy", "testIamPermissions"),
    "projects.subscriptions": ("create", "get", "delete", "pull", "acknowledge"),
}
NAME_RE = re.compile(r"[A-Za-z][-A-Za-z0-9_.~+%]{2,254}")
DELETED_TOPIC = "_deleted-topic_"
MAX_REQUEST_BYTES = 10 * 1024 * 1024  # Google: "Request payload size exceeds the limit: 10485760 bytes."
DEFAULT_ACK_DEADLINE = 10
RETENTION = "604800s"  # 7 days, what Google answers for a subscription that names none
PUSH_DELAY = 1.0  # seconds from publish to push: none published by Google (see the module's docstring)
PUSH_OK = (102, 200, 201, 202, 204)  # what Pub/Sub takes as an acknowledgement of a push
MIN_BACKOFF, MAX_BACKOFF = 10.0, 600.0  # RetryPolicy's defaults (pubsub.v1.json)
PUSH_BACKOFF = (0.1, 60.0)  # with no retryPolicy
CLOUDEVENTS_MODE = "__GCP_CloudEventsMode"
MESSAGE_PUBLISHED = "google.cloud.pubsub.topic.v1.messagePublished"
PUBLISHER_ROLES = ("roles/pubsub.publisher", "roles/pubsub.editor", "roles/pubsub.admin", "roles/editor",
                   "roles/owner")
PERMISSIONS = {  # what testIamPermissions answers for, per role (a topic's permissions)
    "pubsub.topics.publish": PUBLISHER_ROLES,
    "pubsub.topics.get": ("roles/pubsub.viewer", "roles/viewer", *PUBLISHER_ROLES[1:]),
    "pubsub.topics.attachSubscription": ("roles/pubsub.subscriber", *PUBLISHER_ROLES[1:]),
}
MEMBER_RE = re.compile(r"allUsers|allAuthenticatedUsers|(user|serviceAccount|group|domain|principal|principalSet|"
                       r"deleted:user|deleted:serviceAccount|deleted:group):\S+")
log = logging.getLogger(__name__)


class PubsubError(Exception):
    """An HTTP error answered as one-platform APIs do (google.rpc.Status in JSON)."""

    def __init__(self, code: int, message: str, status: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status or STATUS.get(code, "UNKNOWN")

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "status": self.status}}


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
    pushing: bool = False  # a push of it is under way


@dataclass
class _Subscription:
    resource: dict[str, Any]
    backlog: list[_Delivery] = field(default_factory=list)  # published, not acknowledged, in order

    @property
    def ack_deadline(self) -> float:
        return float(self.resource.get("ackDeadlineSeconds") or DEFAULT_ACK_DEADLINE)

    @property
    def push_endpoint(self) -> str:
        return (self.resource.get("pushConfig") or {}).get("pushEndpoint") or ""

    def backoff(self, attempts: int) -> float:
        """The wait before delivery ``attempts + 1`` (after ``attempts`` failed)."""
        policy = self.resource.get("retryPolicy")
        if policy is None:
            low, high = PUSH_BACKOFF
        else:
            low = _seconds(policy.get("minimumBackoff"), MIN_BACKOFF)
            high = _seconds(policy.get("maximumBackoff"), MAX_BACKOFF)
        return min(high, low * 2 ** max(0, attempts - 1))


class PubsubServer(Server):
    name, threads = "pubsub", 16

    def __init__(self, *, pull_wait: float = 0.5, push_delay: Delay = PUSH_DELAY) -> None:
        """``pull_wait``: how long a pull waits for a message; ``push_delay``: seconds from publish
        to a push subscription's first POST (see the module's docstring)."""
        self.pull_wait = pull_wait
        self.push_delay = push_delay
        # Every push tried, once answered: {"subscription", "messageId", "status" (None: no answer), "dropped",
        # "attempt", "started", "answered" (time.monotonic()), "started_at", "answered_at" (time.time())}.
        self.pushes: list[dict[str, Any]] = []
        self._policies: dict[str, dict[str, Any]] = {}  # topic -> its IAM policy (bindings, version, etag serial)
        self._drop = 0  # pushes still to lose (drop_next)
        self._duplicate = 0  # pushes still to make twice (duplicate_next)
        self._pusher: threading.Thread | None = None
        self._closing = False
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

    def start(self) -> PubsubServer:
        super().start()
        self._closing = False
        self._pusher = threading.Thread(target=self._push_loop, name="pubsub-pusher", daemon=True)
        self._pusher.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        if self._pusher is not None:
            self._pusher.join(timeout=5)
            self._pusher = None
        super().stop()

    # -- what a test looks at or injects -----------------------------------------------------------
    def drop_next(self, times: int = 1) -> None:
        """Lose the next ``times`` pushes: each message is taken as delivered and never POSTed."""
        with self._lock:
            self._drop += int(times)

    def duplicate_next(self, times: int = 1) -> None:
        """POST each of the next ``times`` pushes twice (a duplicate delivery of one message)."""
        with self._lock:
            self._duplicate += int(times)

    def backlog(self, subscription: str) -> int:
        """Messages of ``subscription`` (its full name) not yet acknowledged."""
        with self._lock:
            sub = self._subscriptions.get(subscription)
            return len(sub.backlog) if sub else 0

    def publish_as(self, member: str, topic: str, data: str, attributes: dict[str, str] | None = None) -> str:
        """Publish one message to ``topic`` (its full name) on behalf of ``member`` (a Logging sink's
        writer identity): PermissionError unless the topic's policy grants ``member`` a role holding
        ``pubsub.topics.publish``; KeyError for a topic that does not exist. The message id."""
        with self._lock:
            if topic not in self._topics:
                raise KeyError(f"topic {topic} does not exist")
            if not self._granted(topic, member, "pubsub.topics.publish"):
                raise PermissionError(f"{member} does not have pubsub.topics.publish on {topic}")
            return self._publish(topic, [{"data": data, "attributes": attributes or {}}])[0]

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

        Host._fault_route(app, {"fail_next": self.fail_next, "drop_next": self.drop_next,
                                "duplicate_next": self.duplicate_next})
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
            return {"messageIds": self._publish(topic, messages)}

    def _publish(self, topic: str, messages: list[dict[str, Any]]) -> list[str]:
        """Store ``messages`` and hand each to every subscription of ``topic``. Under the lock."""
        stamp = _now()
        out = []
        for message in messages:
            m = _Message(str(next(self._ids)), message.get("data") or "", dict(message.get("attributes") or {}), stamp)
            self._published[topic].append(m)
            for sub in self._subscriptions.values():
                if sub.resource["topic"] == topic:
                    sub.backlog.append(_Delivery(m, visible_at=time.monotonic() + seconds(self.push_delay)
                                                 if sub.push_endpoint else 0.0))
            out.append(m.id)
        self._lock.notify_all()
        return out

    # -- a topic's IAM policy ----------------------------------------------------------------------
    def _topics_getIamPolicy(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        with self._lock:
            return self._policy_of(self._topic(p["projectsId"], p["topicsId"])["name"])

    def _topics_setIamPolicy(self, p: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        policy = body.get("policy")
        if not isinstance(policy, dict):
            raise PubsubError(400, "Request contains an invalid argument: policy is required.")
        bindings = []
        for binding in policy.get("bindings") or []:
            role, members = binding.get("role") or "", list(binding.get("members") or [])
            if not role.startswith(("roles/", "projects/", "organizations/")):
                raise PubsubError(400, f"Role ({role}) does not exist in the resource's hierarchy.")
            if bad := [m for m in members if not MEMBER_RE.fullmatch(m)]:
                raise PubsubError(400, f"Invalid principal {bad[0]!r}: a member is user:, serviceAccount:, group:, "
                                       "domain:, allUsers or allAuthenticatedUsers.")
            if members:
                bindings.append({**binding, "role": role, "members": sorted(set(members))})
        with self._lock:
            topic = self._topic(p["projectsId"], p["topicsId"])["name"]
            current = self._policy_of(topic)
            if policy.get("etag") and policy["etag"] != current["etag"]:
                raise PubsubError(409, "There were concurrent policy changes. Please retry the whole read-modify-write "
                                       "with exponential backoff.", status="ABORTED")
            serial = self._policies.get(topic, {}).get("serial", 0) + 1
            self._policies[topic] = {"bindings": bindings, "version": int(policy.get("version") or 1), "serial": serial}
            return self._policy_of(topic)

    def _topics_testIamPermissions(self, p: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._topic(p["projectsId"], p["topicsId"])
        # The caller has no identity here: it holds what any member of the policy does, i.e. every
        # permission this server knows (the local cloud checks no caller).
        held = [x for x in body.get("permissions") or [] if x in PERMISSIONS]
        return {"permissions": held} if held else {}

    def _policy_of(self, topic: str) -> dict[str, Any]:
        stored = self._policies.get(topic)
        if not stored or not stored["bindings"]:
            return {"etag": "ACAB"} if not stored else {"version": stored["version"], "etag": _etag(stored["serial"])}
        return {"version": stored["version"], "etag": _etag(stored["serial"]),
                "bindings": [dict(b, members=list(b["members"])) for b in stored["bindings"]]}

    def _granted(self, topic: str, member: str, permission: str) -> bool:
        roles = PERMISSIONS[permission]
        bindings = self._policies.get(topic, {}).get("bindings") or []
        return any(b["role"] in roles and (member in b["members"] or "allUsers" in b["members"]) for b in bindings)

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
        endpoint = (body.get("pushConfig") or {}).get("pushEndpoint")
        if endpoint:
            parts = urlsplit(endpoint)
            if not parts.hostname or not (parts.scheme == "https" or (
                    parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost", "::1"))):
                raise PubsubError(400, f"Invalid push endpoint given (endpoint={endpoint}). Refer to "
                                       "https://cloud.google.com/pubsub/subscriber#create_push_subscriptions for more "
                                       "information.")
        if "retryPolicy" in body:
            policy = body.get("retryPolicy") or {}
            low = _seconds(policy.get("minimumBackoff"), MIN_BACKOFF)
            high = _seconds(policy.get("maximumBackoff"), MAX_BACKOFF)
            if not (0 <= low <= 600 and 0 <= high <= 600 and low <= high):
                raise PubsubError(400, "Invalid retry policy: minimum_backoff and maximum_backoff must be between 0 "
                                       "and 600 seconds, the minimum no greater than the maximum.")
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
            if endpoint:  # "GetSubscription calls will always return a valid version" (PushConfig.attributes)
                push = resource["pushConfig"] = dict(resource["pushConfig"])
                push["attributes"] = {"x-goog-version": "v1", **(push.get("attributes") or {})}
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
                ready = [d for d in sub.backlog if d.visible_at <= now and not d.pushing][:wanted]
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


    # -- push ----------------------------------------------------------------------------------------
    def _push_loop(self) -> None:
        """Start each due push delivery, until the server stops."""
        while True:
            with self._lock:
                if self._closing:
                    return
                now = time.monotonic()
                due: list[tuple[_Subscription, _Delivery]] = []
                wake = now + 1.0
                for sub in self._subscriptions.values():
                    if not sub.push_endpoint:
                        continue
                    for delivery in sub.backlog:
                        if delivery.pushing:
                            continue
                        if delivery.visible_at <= now:
                            delivery.pushing = True
                            due.append((sub, delivery))
                        else:
                            wake = min(wake, delivery.visible_at)
                if not due:
                    self._lock.wait(max(0.005, wake - now))
                    continue
            for sub, delivery in due:  # each on a thread of its own: a slow endpoint holds only its pushes
                threading.Thread(target=self._push, args=(sub, delivery), name="pubsub-push", daemon=True).start()

    def _push(self, sub: _Subscription, delivery: _Delivery) -> None:
        """One push of ``delivery`` (twice where duplicate_next asks), then acknowledged or backed off."""
        with self._lock:
            drop = self._drop > 0
            self._drop -= drop
            times = 2 if not drop and self._duplicate > 0 else 1
            self._duplicate -= times == 2
            delivery.attempts += 1
            endpoint, name, timeout = sub.push_endpoint, sub.resource["name"], sub.ack_deadline
            topic = sub.resource["topic"]
        status: int | None = None
        started, started_at = time.monotonic(), time.time()
        if drop:
            status = 0  # lost: never POSTed, and never delivered again
        else:
            for _ in range(times):
                status = self._post(endpoint, name, topic, delivery.message, timeout, sub.resource.get("pushConfig") or {})
        with self._lock:
            self.pushes.append({"subscription": name, "messageId": delivery.message.id, "status": status,
                                "dropped": drop, "attempt": delivery.attempts, "started": started,
                                "answered": time.monotonic(), "started_at": started_at, "answered_at": time.time()})
            delivery.pushing = False
            if drop or status in PUSH_OK:
                if delivery in sub.backlog:
                    sub.backlog.remove(delivery)
            else:
                delivery.visible_at = time.monotonic() + sub.backoff(delivery.attempts)
            self._lock.notify_all()

    def _post(self, endpoint: str, subscription: str, topic: str, message: _Message, timeout: float,
              push_config: dict[str, Any]) -> int | None:
        """POST one message as Pub/Sub push (or Eventarc's CloudEvent) does: its HTTP status, None for no answer."""
        resource = message.resource()
        wrapped = {**resource, "message_id": message.id, "publish_time": message.published}
        body = {"message": wrapped, "subscription": subscription}
        headers = {"Content-Type": "application/json", "User-Agent": "APIs-Google; "
                   "(+https://developers.google.com/webmasters/APIs-Google.html)", "From": "noreply@google.com"}
        if (push_config.get("oidcToken") or {}).get("serviceAccountEmail"):
            headers["Authorization"] = "Bearer local-pubsub-oidc-token"  # nothing here checks it
        mode = (parse_qs(urlsplit(endpoint).query).get(CLOUDEVENTS_MODE) or [""])[0]
        if mode.startswith("CUSTOM_PUBSUB_"):
            source_topic = unquote(mode[len("CUSTOM_PUBSUB_"):]) or topic
            headers.update({"ce-specversion": "1.0", "ce-type": MESSAGE_PUBLISHED, "ce-id": message.id,
                            "ce-source": f"//pubsub.googleapis.com/{source_topic}", "ce-time": message.published})
        try:
            answer = requests.post(endpoint, data=json.dumps(body), headers=headers, timeout=timeout)
        except requests.RequestException as e:
            log.info("push to %s failed: %s", endpoint, e)
            return None
        return answer.status_code


def _seconds(value: Any, default: float) -> float:
    """A google.protobuf.Duration in JSON (``"10s"``, ``"0.5s"``) as seconds; ``default`` when absent."""
    if value in (None, ""):
        return default
    found = re.fullmatch(r"(-?\d+(?:\.\d{1,9})?)s", str(value))
    if not found:
        raise PubsubError(400, f"Invalid value {value!r} for a duration: expected e.g. \"10s\".")
    return float(found[1])


def _etag(serial: int) -> str:
    return base64.b64encode(b"\x00\x05" + serial.to_bytes(6, "big")).decode()


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
