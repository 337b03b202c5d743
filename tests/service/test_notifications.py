"""Notifications over the in-memory fakes: one JSON event per state change, sent by the pass
whose commit won, whatever else goes wrong."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

from controller import errors
from controller.adapters.memory import MemoryPublisher, MemoryWebhook
from controller.notifier import Notifier
from controller.state import Phase
from tests.harness import BUCKET, PROJECT, Harness, spec_doc

TOPIC = f"projects/{PROJECT}/topics/respawn-events"
HOOK = "https://hooks.slack.com/services/T000/B000/XXXX"


@pytest.fixture
def told() -> tuple[Harness, MemoryPublisher, MemoryWebhook]:
    h = Harness()
    h.policy = dataclasses.replace(h.policy, notify_topic=TOPIC, notify_webhook=HOOK)
    publisher, webhook = MemoryPublisher([TOPIC]), MemoryWebhook()
    h.notifier = Notifier(h.policy, publisher, webhook)
    return h, publisher, webhook


def events(publisher: MemoryPublisher) -> list[dict]:
    return [json.loads(data) for _, data, _ in publisher.published]


def test_each_state_change_of_a_preempted_job_goes_out_once_with_its_context(told):
    h, publisher, webhook = told
    h.submit("llm")
    h.tick()
    h.tick()
    h.marker("llm")
    h.tick()
    h.tick()
    h.exit("llm", 0)
    h.tick()
    sent = events(publisher)
    assert [e["event"] for e in sent] == ["started", "running", "preempted", "started", "running", "succeeded"]
    preempted = sent[2]
    assert (preempted["job"], preempted["attempt"], preempted["zone"]) == ("llm", 1, "us-central1-a")
    assert "preempted marker" in preempted["cause"] and preempted["severity"] == "warning"
    assert preempted["status"] == f"gs://{BUCKET}/jobs/llm/status.json"
    assert preempted["link"].startswith("https://console.cloud.google.com/storage/browser/_details/")
    assert len({e["id"] for e in sent}) == len(sent)
    _, _, attributes = publisher.published[2]
    assert attributes == {"job": "llm", "event": "preempted", "attempt": "1", "severity": "warning"}
    bodies = webhook.bodies(HOOK)
    assert [b["respawn"]["event"] for b in bodies] == [e["event"] for e in sent]
    assert bodies[2]["text"].startswith("respawn: job llm preempted (attempt 1 in us-central1-a)")


def test_a_failed_job_and_a_cancelled_one_say_so(told):
    h, publisher, _ = told
    h.submit("bad", spec_doc(policy={"max_failures": 0}))
    h.tick()
    h.tick()
    h.exit("bad", 3)
    h.tick()
    assert events(publisher)[-1]["event"] == "failed" and h.status("bad").phase == Phase.FAILED
    h.submit("other")
    h.tick()
    h.cancel("other")
    h.tick()
    assert events(publisher)[-1]["event"] == "cancelled"


def test_a_budget_warning_when_restarts_reach_80_percent(told):
    h, publisher, _ = told
    h.submit("llm", spec_doc(policy={"max_restarts": 5}))
    h.tick()
    for _ in range(4):
        h.tick()
        h.marker("llm")
        h.tick()
    budget = [e for e in events(publisher) if e["event"] == "budget"]
    assert len(budget) == 1 and "restarts 4 of max_restarts 5" in budget[0]["cause"]


def test_a_jobs_own_destinations_get_its_events_too(told):
    h, publisher, webhook = told
    mine = f"projects/{PROJECT}/topics/mine"
    publisher.create_topic(mine)
    h.policy = dataclasses.replace(h.policy, allowed_webhook_hosts=("hooks.example.com",))
    h.notifier = Notifier(h.policy, publisher, webhook)
    h.submit("llm", spec_doc(notify={"topic": mine, "webhook": "https://hooks.example.com/x"}))
    h.tick()
    assert {t for t, _, _ in publisher.published} == {TOPIC, mine}
    assert {u for u, _ in webhook.posted} == {HOOK, "https://hooks.example.com/x"}


@pytest.mark.parametrize(("notify", "problem"), [
    ({"topic": "projects/elsewhere-proj/topics/t"}, "notify.topic"),
    ({"webhook": "https://169.254.169.254/computeMetadata/v1/"}, "notify.webhook"),
    ({"webhook": "http://hooks.slack.com/services/x"}, "use https://"),
    ({"webhook": "not a url"}, "notify.webhook"),
    ({"channel": "#ml"}, "notify.channel"),
])
def test_a_destination_the_policy_does_not_allow_fails_that_job_with_the_field_named(told, notify, problem):
    h, publisher, _ = told
    h.submit("bad", spec_doc(notify=notify))
    h.submit("good")
    h.tick()
    assert h.status("bad").phase == Phase.FAILED and problem in h.status("bad").message
    assert h.status("good").phase == Phase.PROVISIONING
    assert all(json.loads(d)["job"] != "bad" or json.loads(d)["event"] == "failed" for _, d, _ in publisher.published)


def test_delivery_that_fails_never_holds_reconciliation(told):
    h, publisher, webhook = told
    publisher.fail_next(errors.TransientError("503 unavailable"), times=100)
    webhook.fail_next(errors.TransientError("500"), times=100)
    h.submit("llm")
    h.tick()
    h.tick()
    assert h.status("llm").phase == Phase.RUNNING and h.live() == ["llm-1"]
    assert h.notifier.failures and "503 unavailable" in h.notifier.failures[0]


def test_a_notifier_that_raises_anything_is_contained(told):
    h, _, _ = told

    class Broken:
        def publish(self, *a):
            raise RuntimeError("boom")

        def post(self, *a):
            raise KeyError("boom")

    h.notifier = Notifier(h.policy, Broken(), Broken())
    h.submit("llm")
    h.tick()
    assert h.status("llm").phase == Phase.PROVISIONING and len(h.notifier.failures) == 2


def test_concurrent_passes_send_each_transition_exactly_once(told):
    h, publisher, webhook = told
    h.submit("llm")
    for round_ in range(3):
        if round_ == 1:
            h.marker("llm")
        engines = [h.engine() for _ in range(6)]
        barrier = threading.Barrier(len(engines))

        def one(engine):
            barrier.wait()
            engine.reconcile("llm")

        threads = [threading.Thread(target=one, args=(e,)) for e in engines]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        h.tick()
    sent = events(publisher)
    assert len({e["id"] for e in sent}) == len(sent)
    kinds = [e["event"] for e in sent]
    assert kinds.count("preempted") == 1 and kinds.count("started") == 2 and kinds.count("running") == 2
    assert len(webhook.posted) == len(sent)
