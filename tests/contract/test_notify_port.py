"""The notification ports' contract: Publisher and Webhook, fakes and real adapters alike.

The Publisher runs on the in-memory fake, on ``CloudPublisher`` (REST) against the local
Pub/Sub stand-in (``localcloud.pubsub``), and on ``CloudPublisher`` (gRPC) against the Cloud
SDK's own emulator when ``gcloud`` is on PATH: a stand-in that drifts from Google's emulator, or
a fake that drifts from either, fails here for one backend and not the others. Messages are
read back through the real ``SubscriberClient`` (pull, acknowledge). The Webhook runs on the
fake and on ``HttpWebhook`` against the local sink (``localcloud.webhook``).

Fixtures: ``pubsub_server`` (the stand-in, module-wide), ``pubsub_emulator`` (the emulator's
``host:port``, module-wide; skipped with its reason where gcloud or its emulator component is not
installed, a failure where it is installed and does not start),
``webhook_sink`` (the local sink, emptied for each test).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import pubsub_v1

from controller.core import errors
from controller.adapters.memory import MemoryPublisher, MemoryWebhook
from controller.adapters.pubsub import CloudPublisher, cloud_publisher
from controller.adapters.webhook import HttpWebhook
from controller.core.ports import Publisher, Webhook
from tests.routes import assert_serves_exactly
from localcloud.pubsub import DOC, SUPPORTED, PubsubServer
from localcloud.webhook import WebhookSink

PROJECT = "notify-proj"
EMULATOR_START = 60.0  # seconds the emulator may take to listen (10-20 s on a slow machine)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _names() -> tuple[str, str]:
    suffix = uuid.uuid4().hex[:10]
    return f"projects/{PROJECT}/topics/notify-{suffix}", f"projects/{PROJECT}/subscriptions/notify-{suffix}"


@dataclass
class Backend:
    """A publisher, and what an operator or a subscriber does beside it."""

    name: str
    publisher: Publisher
    create_topic: Callable[[str], None]
    subscribe: Callable[[str, str], None]  # (topic, subscription)
    pull: Callable[[str], list[tuple[str, bytes, dict[str, str]]]]  # everything deliverable now, acknowledged
    fail: Callable[[int], None] | None = None  # the next N publishes fail transiently (None: cannot be made to)
    heal: Callable[[], None] = lambda: None  # no more failures


# -- fixtures -------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _no_emulator_from_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's own PUBSUB_EMULATOR_HOST would win over the stand-in's endpoint."""
    monkeypatch.delenv("PUBSUB_EMULATOR_HOST", raising=False)


@pytest.fixture(scope="module")
def pubsub_server() -> Iterator[PubsubServer]:
    with PubsubServer(pull_wait=0.2) as srv:
        yield srv


@pytest.fixture(scope="module")
def pubsub_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Cloud SDK's Pub/Sub emulator (gRPC, and REST on the same port), on 127.0.0.1: its host:port."""
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        pytest.skip("gcloud is not on PATH: the Cloud SDK Pub/Sub emulator variant was not run")
    if not (Path(gcloud).resolve().parents[1] / "platform" / "pubsub-emulator").is_dir():
        pytest.skip("gcloud has no pubsub-emulator component: the Cloud SDK Pub/Sub emulator variant was not run")
    port = _free_port()
    log = tmp_path_factory.mktemp("pubsub-emulator") / "emulator.log"
    env = {**os.environ, "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}
    env.pop("PUBSUB_EMULATOR_HOST", None)
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [gcloud, "beta", "emulators", "pubsub", "start", f"--host-port=127.0.0.1:{port}", f"--project={PROJECT}",
             f"--data-dir={log.parent}"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True)  # its own process group: gcloud starts the emulator's JVM as a child
    try:
        reason = _wait_for_emulator(process, port, log)
        if reason:  # installed, yet it does not start: that is a failure, not a missing dependency
            pytest.fail(f"the Cloud SDK Pub/Sub emulator did not start: {reason}")
        yield f"127.0.0.1:{port}"
    finally:
        _stop_group(process)


def _wait_for_emulator(process: subprocess.Popen[bytes], port: int, log: os.PathLike[str]) -> str | None:
    """None once the emulator answers HTTP on ``port``; else why not."""
    deadline = time.monotonic() + EMULATOR_START
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = open(log, errors="replace").read()[-500:].strip()
            return f"gcloud exited with {process.returncode}: {tail}"
        try:
            requests.get(f"http://127.0.0.1:{port}/", timeout=1)
            return None
        except requests.exceptions.RequestException:
            time.sleep(0.2)
    return f"not listening on 127.0.0.1:{port} within {EMULATOR_START:.0f} s"


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            if sig == signal.SIGTERM:
                os.killpg(process.pid, signal.SIGKILL)  # the JVM, if gcloud left before it
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


@pytest.fixture(scope="module")
def _sink() -> Iterator[WebhookSink]:
    with WebhookSink() as sink:  # stopping a server takes a second: one for the module
        yield sink


@pytest.fixture
def webhook_sink(_sink: WebhookSink) -> WebhookSink:
    """The local webhook sink, with nothing recorded and no failure pending."""
    _sink.reset()
    return _sink


def _memory() -> Backend:
    fake = MemoryPublisher()
    pulled: dict[str, int] = {}  # subscription -> messages of its topic already handed out
    topics: dict[str, str] = {}  # subscription -> topic

    def subscribe(topic: str, subscription: str) -> None:
        topics[subscription] = topic
        pulled[subscription] = len(fake.messages(topic))

    def pull(subscription: str) -> list[tuple[str, bytes, dict[str, str]]]:
        published = [(t, d, a) for t, d, a in fake.published if t == topics[subscription]]
        ids = [str(i) for i in range(len(published))]
        new = [(ids[i], d, a) for i, (_, d, a) in enumerate(published)][pulled[subscription]:]
        pulled[subscription] = len(published)
        return new

    return Backend("memory", fake, fake.create_topic, subscribe, pull,
                   fail=lambda n: fake.fail_next(errors.TransientError("503 unavailable"), n))


def _clients(publisher: CloudPublisher, subscriber: pubsub_v1.SubscriberClient, admin: pubsub_v1.PublisherClient,
             name: str, fail: Callable[[int], None] | None = None, heal: Callable[[], None] = lambda: None) -> Backend:
    def pull(subscription: str) -> list[tuple[str, bytes, dict[str, str]]]:
        out: list[tuple[str, bytes, dict[str, str]]] = []
        while True:  # until a pull finds nothing: all that was deliverable, each once
            with warnings.catch_warnings():  # return_immediately is deprecated, and exactly what a test wants
                warnings.simplefilter("ignore", DeprecationWarning)
                answer = subscriber.pull(subscription=subscription, max_messages=100, return_immediately=True,
                                         timeout=10)
            if not answer.received_messages:
                return out
            subscriber.acknowledge(subscription=subscription, ack_ids=[m.ack_id for m in answer.received_messages],
                                   timeout=10)
            out += [(m.message.message_id, m.message.data, dict(m.message.attributes))
                    for m in answer.received_messages]

    return Backend(name, publisher, lambda t: admin.create_topic(name=t, timeout=10),
                   lambda t, s: subscriber.create_subscription(name=s, topic=t, timeout=10), pull, fail, heal)


def _local(srv: PubsubServer) -> Backend:
    kwargs = dict(transport="rest", client_options={"api_endpoint": srv.endpoint}, credentials=AnonymousCredentials())
    return _clients(cloud_publisher(srv.endpoint, deadline=4), pubsub_v1.SubscriberClient(**kwargs),
                    pubsub_v1.PublisherClient(**kwargs), "local",
                    fail=lambda n: srv.fail_next("topics.publish", 503, n), heal=srv.heal)


def _emulator(host: str) -> Backend:
    # PUBSUB_EMULATOR_HOST is read when a client is built, so it is set only while building them.
    # The publisher is also given a dead endpoint: the emulator must win, as the adapter says.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PUBSUB_EMULATOR_HOST", host)
        return _clients(cloud_publisher(f"http://127.0.0.1:{_free_port()}", deadline=4), pubsub_v1.SubscriberClient(),
                        pubsub_v1.PublisherClient(), "emulator")


@pytest.fixture(params=["memory", "local", "emulator"])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "memory":
        return _memory()
    if request.param == "local":
        return _local(request.getfixturevalue("pubsub_server"))
    return _emulator(request.getfixturevalue("pubsub_emulator"))


# -- Publisher contract ------------------------------------------------------------------------------
def test_publish_returns_an_id_and_the_message_is_pulled_exactly_once(backend: Backend) -> None:
    topic, subscription = _names()
    backend.create_topic(topic)
    backend.subscribe(topic, subscription)
    started = time.monotonic()
    message_id = backend.publisher.publish(topic, b'{"job": "llm", "phase": "SUCCEEDED"}',
                                           {"job": "llm", "phase": "SUCCEEDED"})
    assert time.monotonic() - started < 2.0  # one message goes out at once, not after a batch fills
    assert isinstance(message_id, str) and message_id
    pulled = backend.pull(subscription)
    assert [(d, a) for _, d, a in pulled] == [(b'{"job": "llm", "phase": "SUCCEEDED"}',
                                              {"job": "llm", "phase": "SUCCEEDED"})]
    if backend.name != "memory":
        assert pulled[0][0] == message_id
    assert backend.pull(subscription) == []  # acknowledged: never delivered again


def test_every_message_arrives_once_with_its_own_id(backend: Backend) -> None:
    topic, subscription = _names()
    backend.create_topic(topic)
    backend.subscribe(topic, subscription)
    ids = [backend.publisher.publish(topic, f"m{i}".encode(), {"n": str(i)}) for i in range(3)]
    ids.append(backend.publisher.publish(topic, b"", {"only": "attributes"}))  # no data: still a message
    assert len(set(ids)) == 4
    pulled = backend.pull(subscription)
    assert sorted((d, tuple(a.items())) for _, d, a in pulled) == sorted(
        [(f"m{i}".encode(), (("n", str(i)),)) for i in range(3)] + [(b"", (("only", "attributes"),))])


def test_publish_to_a_missing_topic_is_not_found(backend: Backend) -> None:
    topic, _ = _names()
    with pytest.raises(errors.NotFound):
        backend.publisher.publish(topic, b"x", {})


@pytest.mark.parametrize("topic, data, attributes", [
    ("notify-topic", b"x", {}),  # not a full name
    (f"projects/{PROJECT}/topics/x", b"x", {}),  # under 3 characters
    (f"projects/{PROJECT}/topics/goog-notify", b"x", {}),  # reserved by Google
    (f"projects/{PROJECT}/topics/notify-ok", b"", {}),  # neither data nor attributes
    (f"projects/{PROJECT}/topics/notify-ok", "text", {}),  # not bytes
    (f"projects/{PROJECT}/topics/notify-ok", b"x", {"n": 1}),  # not a string
    (f"projects/{PROJECT}/topics/notify-ok", b"x", {"googkey": "v"}),  # reserved by Google
    (f"projects/{PROJECT}/topics/notify-ok", b"x", {"timeout": "v"}),  # PublisherClient.publish's own argument
    (f"projects/{PROJECT}/topics/notify-ok", b"x", {"k": "v" * 1025}),
])
def test_a_message_google_would_refuse_is_a_request_error(backend: Backend, topic: str, data: bytes,
                                                          attributes: dict[str, str]) -> None:
    if topic.endswith("/notify-ok"):
        topic = _names()[0]
        backend.create_topic(topic)
    with pytest.raises(errors.RequestError):
        backend.publisher.publish(topic, data, attributes)


@pytest.fixture(params=["memory", "local"])
def faulty(request: pytest.FixtureRequest) -> Backend:
    """The backends that can be made to fail (the emulator cannot)."""
    return _memory() if request.param == "memory" else _local(request.getfixturevalue("pubsub_server"))


def test_a_short_outage_is_retried_within_the_deadline(faulty: Backend) -> None:
    topic, subscription = _names()
    faulty.create_topic(topic)
    faulty.subscribe(topic, subscription)
    assert faulty.fail
    faulty.fail(1)
    if faulty.name == "memory":  # the fake does not retry: the caller sees the failure
        with pytest.raises(errors.TransientError):
            faulty.publisher.publish(topic, b"x", {})
    message_id = faulty.publisher.publish(topic, b"x", {})
    assert [(d, a) for _, d, a in faulty.pull(subscription)] == [(b"x", {})]
    assert message_id


def test_an_outage_is_a_transient_error_within_the_deadline(faulty: Backend) -> None:
    topic, _ = _names()
    faulty.create_topic(topic)
    assert faulty.fail
    faulty.fail(1000)
    try:
        started = time.monotonic()
        with pytest.raises(errors.TransientError):
            faulty.publisher.publish(topic, b"x", {})
        assert time.monotonic() - started < 4.5  # the adapter's deadline (4 s here), never the client's 600 s
    finally:
        faulty.heal()


# -- CloudPublisher alone: bounded time whatever the network does ---------------------------------------
def test_a_refused_connection_is_a_transient_error_within_the_deadline() -> None:
    publisher = cloud_publisher(f"http://127.0.0.1:{_free_port()}", deadline=4)
    started = time.monotonic()
    with pytest.raises(errors.TransientError):
        publisher.publish(f"projects/{PROJECT}/topics/notify-x", b"x", {})
    assert time.monotonic() - started < 4.5


def test_a_server_that_never_answers_is_a_transient_error_within_the_deadline() -> None:
    with socket.socket() as silent:  # accepts connections (the kernel does), never reads nor answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        publisher = cloud_publisher(f"http://127.0.0.1:{silent.getsockname()[1]}", deadline=4)
        started = time.monotonic()
        with pytest.raises(errors.TransientError):
            publisher.publish(f"projects/{PROJECT}/topics/notify-x", b"x", {})
        assert time.monotonic() - started < 4.5


# -- the stand-in, over raw HTTP ------------------------------------------------------------------------
def _url(srv: PubsubServer, path: str) -> str:
    return f"{srv.endpoint}/v1/{path}"


def test_the_stand_in_refuses_an_unknown_field_as_google_does(pubsub_server: PubsubServer) -> None:
    topic, _ = _names()
    assert requests.put(_url(pubsub_server, topic), json={}, timeout=5).status_code == 200
    nested = requests.post(_url(pubsub_server, f"{topic}:publish"),
                           json={"messages": [{"data": "aGk=", "bogus": 1}]}, timeout=5)
    assert nested.status_code == 400
    assert nested.json() == {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message":
                                       "Invalid JSON payload received. Unknown name \"bogus\" at 'messages[0]': "
                                       "Cannot find field."}}
    top = requests.post(_url(pubsub_server, f"{topic}:publish"), json={"messages": [{"data": "aGk="}], "x": 1},
                        timeout=5)
    assert top.status_code == 400 and top.json()["error"]["message"] == (
        'Invalid JSON payload received. Unknown name "x": Cannot find field.')
    created = requests.put(_url(pubsub_server, _names()[0]), json={"labelz": {}}, timeout=5)
    assert created.status_code == 400 and 'Unknown name "labelz"' in created.json()["error"]["message"]
    assert pubsub_server.published(topic) == []


def test_the_stand_in_answers_in_googles_shapes(pubsub_server: PubsubServer) -> None:
    topic, subscription = _names()
    assert requests.put(_url(pubsub_server, topic), timeout=5).json() == {"name": topic}
    again = requests.put(_url(pubsub_server, topic), timeout=5)
    assert again.status_code == 409 and again.json()["error"]["status"] == "ALREADY_EXISTS"
    missing = requests.post(_url(pubsub_server, f"{_names()[0]}:publish"), json={"messages": [{"data": "aGk="}]},
                            timeout=5)
    assert missing.status_code == 404
    assert missing.json()["error"]["status"] == "NOT_FOUND"
    assert missing.json()["error"]["message"].startswith("Resource not found (resource=notify-")
    created = requests.put(_url(pubsub_server, subscription), json={"topic": topic}, timeout=5).json()
    assert created["ackDeadlineSeconds"] == 10 and created["topic"] == topic
    ids = requests.post(_url(pubsub_server, f"{topic}:publish"),
                        json={"messages": [{"data": "aGk=", "attributes": {"a": "b"}}]}, timeout=5).json()
    assert isinstance(ids["messageIds"][0], str) and ids["messageIds"][0].isdigit()
    bad = requests.post(_url(pubsub_server, f"{topic}:publish"), json={"messages": [{"data": "!!"}]}, timeout=5)
    assert bad.status_code == 400 and "Base64 decoding failed" in bad.json()["error"]["message"]
    pulled = requests.post(_url(pubsub_server, f"{subscription}:pull"), json={"maxMessages": 5}, timeout=5).json()
    [received] = pulled["receivedMessages"]
    assert received["message"]["data"] == "aGk=" and received["message"]["messageId"] == ids["messageIds"][0]
    wrong = requests.post(_url(pubsub_server, f"{subscription}:acknowledge"), json={"ackIds": ["nope"]}, timeout=5)
    assert wrong.status_code == 400
    assert requests.post(_url(pubsub_server, f"{subscription}:acknowledge"), json={"ackIds": [received["ackId"]]},
                         timeout=5).json() == {}
    assert requests.delete(_url(pubsub_server, topic), timeout=5).json() == {}
    assert requests.get(_url(pubsub_server, subscription), timeout=5).json()["topic"] == "_deleted-topic_"


def test_an_unacknowledged_message_is_delivered_again_after_its_deadline(pubsub_server: PubsubServer) -> None:
    topic, subscription = _names()
    requests.put(_url(pubsub_server, topic), timeout=5)
    requests.put(_url(pubsub_server, subscription), json={"topic": topic, "ackDeadlineSeconds": 10}, timeout=5)
    requests.post(_url(pubsub_server, f"{topic}:publish"), json={"messages": [{"data": "aGk="}]}, timeout=5)
    pull = {"maxMessages": 5, "returnImmediately": True}
    first = requests.post(_url(pubsub_server, f"{subscription}:pull"), json=pull, timeout=5).json()
    assert len(first["receivedMessages"]) == 1
    assert requests.post(_url(pubsub_server, f"{subscription}:pull"), json=pull, timeout=5).json() == {}
    with pubsub_server._lock:  # ten seconds pass
        for delivery in pubsub_server._subscriptions[subscription].backlog:
            delivery.visible_at -= 10
    again = requests.post(_url(pubsub_server, f"{subscription}:pull"), json=pull, timeout=5).json()
    assert again["receivedMessages"][0]["message"]["messageId"] == first["receivedMessages"][0]["message"]["messageId"]
    assert again["receivedMessages"][0]["ackId"] != first["receivedMessages"][0]["ackId"]


def test_the_stand_in_serves_every_method_it_claims_and_no_other(pubsub_server: PubsubServer) -> None:
    assert_serves_exactly(pubsub_server.endpoint, DOC, SUPPORTED)


def test_the_real_clients_manage_topics_and_subscriptions_on_the_stand_in(pubsub_server: PubsubServer) -> None:
    """The real PublisherClient and SubscriberClient (REST) create, get and delete through it."""
    kwargs = dict(transport="rest", client_options={"api_endpoint": pubsub_server.endpoint},
                  credentials=AnonymousCredentials())
    admin, subscriber = pubsub_v1.PublisherClient(**kwargs), pubsub_v1.SubscriberClient(**kwargs)
    topic, subscription = _names()
    admin.create_topic(name=topic, timeout=5)
    assert admin.get_topic(topic=topic, timeout=5).name == topic
    with pytest.raises(gexc.Conflict):  # REST: 409 reads as Conflict (gRPC: AlreadyExists, a subclass)
        admin.create_topic(name=topic, timeout=5)
    subscriber.create_subscription(name=subscription, topic=topic, timeout=5)
    assert subscriber.get_subscription(subscription=subscription, timeout=5).ack_deadline_seconds == 10
    subscriber.delete_subscription(subscription=subscription, timeout=5)
    admin.delete_topic(topic=topic, timeout=5)
    with pytest.raises(gexc.NotFound):
        admin.get_topic(topic=topic, timeout=5)


# -- Webhook contract ----------------------------------------------------------------------------------
@dataclass
class Hook:
    name: str
    webhook: Webhook
    url: str
    bodies: Callable[[], list[object]]
    fail: Callable[[int, int], None]  # (HTTP status, times)


@pytest.fixture(params=["memory", "http"])
def hook(request: pytest.FixtureRequest) -> Hook:
    if request.param == "memory":
        fake = MemoryWebhook()
        url = "https://hooks.example.com/services/T/B/secret"

        def fail(status: int, times: int) -> None:
            kind = errors.TransientError if status == 429 or status >= 500 else errors.RequestError
            fake.fail_next(kind(f"webhook answered {status}"), times)

        return Hook("memory", fake, url, lambda: fake.bodies(url), fail)
    sink: WebhookSink = request.getfixturevalue("webhook_sink")
    return Hook("http", HttpWebhook(timeout=2.0), sink.url, lambda: sink.bodies, sink.fail_next)


def test_a_post_is_recorded_in_order(hook: Hook) -> None:
    hook.webhook.post(hook.url, {"text": "llm: SUCCEEDED"})
    hook.webhook.post(hook.url, {"text": "llm: FAILED", "blocks": [{"type": "section", "n": 1}]})
    assert hook.bodies() == [{"text": "llm: SUCCEEDED"},
                             {"text": "llm: FAILED", "blocks": [{"type": "section", "n": 1}]}]


@pytest.mark.parametrize("status, error", [(500, errors.TransientError), (503, errors.TransientError),
                                           (429, errors.TransientError), (404, errors.RequestError),
                                           (403, errors.RequestError)])
def test_an_error_answer_is_mapped_and_the_next_post_goes_through(hook: Hook, status: int,
                                                                  error: type[errors.RespawnError]) -> None:
    hook.fail(status, 1)
    with pytest.raises(error) as raised:
        hook.webhook.post(hook.url, {"text": "x"})
    assert "secret" not in str(raised.value)  # the URL's path is the webhook's secret
    hook.webhook.post(hook.url, {"text": "y"})
    assert hook.bodies() == [{"text": "y"}]


@pytest.mark.parametrize("url, body", [
    ("ftp://hooks.example.com/x", {"text": "x"}),
    ("not a url", {"text": "x"}),
    (None, {"text": float("nan")}),
    (None, {"text": object()}),
])
def test_a_body_or_url_that_cannot_be_posted_is_a_request_error(hook: Hook, url: str | None, body: dict) -> None:
    with pytest.raises(errors.RequestError):
        hook.webhook.post(url or hook.url, body)
    assert hook.bodies() == []


def test_a_refused_connection_is_transient() -> None:
    with pytest.raises(errors.TransientError) as raised:
        HttpWebhook(timeout=2.0).post(f"http://127.0.0.1:{_free_port()}/services/T/B/secret", {"text": "x"})
    assert "secret" not in str(raised.value) and raised.value.__cause__ is None


def test_a_hook_that_never_answers_is_transient_within_its_timeout() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        started = time.monotonic()
        with pytest.raises(errors.TransientError):
            HttpWebhook(timeout=0.5).post(f"http://127.0.0.1:{silent.getsockname()[1]}/hook", {"text": "x"})
        assert time.monotonic() - started < 2.0


def test_the_sink_refuses_what_slack_refuses(webhook_sink: WebhookSink) -> None:
    answer = requests.post(webhook_sink.url, data=b"text=not json", timeout=5)
    assert (answer.status_code, answer.text) == (400, "invalid_payload")
    webhook_sink.fail_next(429)
    limited = requests.post(webhook_sink.url, json={"text": "x"}, timeout=5)
    assert limited.status_code == 429 and limited.headers["Retry-After"] == "1"
    assert requests.post(webhook_sink.url, json={"text": "x"}, timeout=5).text == "ok"
    assert webhook_sink.wait_for(1) == [{"text": "x"}] and webhook_sink.refused == 2
    assert webhook_sink.deliveries[0].content_type == "application/json"


# -- the controller's notifications through each backend -----------------------------------------------
def test_concurrent_passes_tell_each_transition_exactly_once_to_the_topic_and_the_webhook(
        backend: Backend, webhook_sink: WebhookSink) -> None:
    """The engine over the in-memory fakes, with six passes racing on every step of a preempted
    job's life; its notifications go through ``backend`` (the stand-in, Google's emulator) and
    ``HttpWebhook`` to the local sink. Each transition arrives once, however many passes raced."""
    import dataclasses
    import json

    from controller.service.notifier import Notifier
    from controller.core.notify import KINDS, event_id
    from tests.harness import Harness

    topic, subscription = _names()
    backend.create_topic(topic)
    backend.subscribe(topic, subscription)
    h = Harness()
    h.policy = dataclasses.replace(h.policy, notify_topic=topic, notify_webhook=webhook_sink.url)
    h.notifier = Notifier(h.policy, backend.publisher, HttpWebhook())

    h.submit("llm")
    h.race("llm")  # started
    h.race("llm")  # running
    h.marker("llm")
    h.race("llm")  # preempted, then the replacement started
    h.race("llm")
    h.race("llm")  # running again
    h.exit("llm", 0)
    h.race("llm")  # succeeded
    told = [json.loads(data) for _, data, _ in backend.pull(subscription)]
    status = h.status("llm")
    expected = [e for e in status.history if e.event in KINDS]
    # Pub/Sub promises no order (nor do passes racing: one may tell "running" while another is
    # still telling the launch before it); the transitions, each exactly once, are the promise.
    assert sorted(n["event"] for n in told) == sorted(["started", "running", "preempted", "started", "running",
                                                       "succeeded"])
    assert sorted(n["id"] for n in told) == sorted(event_id("llm", status, e) for e in expected)
    bodies = webhook_sink.wait_for(len(told))
    assert sorted(b["respawn"]["id"] for b in bodies) == sorted(n["id"] for n in told)


def test_a_pass_whose_webhook_answers_too_late_ends_within_its_notify_wait(webhook_sink: WebhookSink) -> None:
    """``HttpWebhook`` to the local sink, slowed past the client's timeout: the pass that tells
    three launches waits 0.3 s for its sends, not 3 s a post; what it could not send goes out
    with the next pass once the sink answers again."""
    import dataclasses

    from controller.service.notifier import Notifier
    from tests.harness import Harness

    h = Harness()  # one job after another, one send at a time: the slowest case
    h.policy = dataclasses.replace(h.policy, notify_webhook=webhook_sink.url)
    h.notifier = Notifier(h.policy, None, HttpWebhook(timeout=3.0), wait=0.3)
    webhook_sink.slow(60)
    for job in ("a", "b", "c"):
        h.submit(job)
    began = time.monotonic()
    summary = h.tick()
    took = time.monotonic() - began
    webhook_sink.slow(0)
    assert took < 3.0, f"the pass took {took:.1f} s"  # 9 s if each post held its job's chain
    assert sorted(h.live()) == ["a-1", "b-1", "c-1"]
    assert len(summary.notices_in_flight) == 1 and len(summary.notices_carried) == 2
    h.tick()
    told = {b["respawn"]["id"] for b in webhook_sink.wait_for(2)}
    assert set(summary.notices_carried) <= told
