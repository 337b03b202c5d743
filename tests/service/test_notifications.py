"""Notifications over the in-memory fakes: one JSON event per state change, sent by the pass
whose commit won, whatever else goes wrong."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import pytest

from controller.core import errors
from controller.adapters.memory import MemoryPublisher, MemoryWebhook
from controller.service.notifier import Notifier
from controller.core.state import Phase
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
        h.race("llm")
        h.tick()
    sent = events(publisher)
    assert len({e["id"] for e in sent}) == len(sent)
    kinds = [e["event"] for e in sent]
    assert kinds.count("preempted") == 1 and kinds.count("started") == 2 and kinds.count("running") == 2
    assert len(webhook.posted) == len(sent)


# -- found by attacking the first version ---------------------------------------------------------
@pytest.mark.parametrize("url", [
    "https://169.254.169.254\\.slack.com/computeMetadata/v1/",  # urllib3 stops the host at the backslash
    "https://[hooks.slack.com]/services/x",  # urlsplit raised on it
    "https://hooks.slack.com\uff03/x",
    "https://hooks.slack.com@evil.example/x",
    "https://hooks.slack.com/services/T000/B0SECRETTOKENxyz#channel",
    "https://hooks.slack.com/services/T000/B0SECRETTOKENxyz ",
])
def test_a_webhook_url_two_parsers_could_read_differently_fails_the_job_without_showing_it(told, url):
    h, _, _ = told
    h.submit("bad", spec_doc(notify={"webhook": url}))
    h.tick()
    st = h.status("bad")
    assert st.phase == Phase.FAILED and "notify.webhook: not a webhook URL respawn accepts" in st.message
    assert "SECRET" not in st.to_json().decode() and "169.254" not in st.message


@pytest.mark.parametrize(("url", "problem"), [
    ("https://hooks.slack.com:8443/services/x", "port 8443"),
    ("https://HOOKS.SLACK.COM/services/x", None),  # hosts compare lower-case
])
def test_webhook_ports_and_host_case(told, url, problem):
    h, _, _ = told
    h.submit("j", spec_doc(notify={"webhook": url}))
    h.tick()
    st = h.status("j")
    assert (problem in st.message and st.phase == Phase.FAILED) if problem else st.phase == Phase.PROVISIONING


def test_a_running_job_whose_spec_gains_a_bad_webhook_fails_with_the_field_named_and_its_vm_goes(told):
    h, _, _ = told
    h.submit("llm")
    h.tick()
    h.tick()
    h.submit("llm", spec_doc(notify={"webhook": "https://[hooks.slack.com]/x"}))
    h.tick()
    assert h.status("llm").phase == Phase.FAILED and "notify.webhook" in h.status("llm").message
    assert h.live() == []


def test_a_loss_is_told_in_the_zone_it_happened_though_its_replacement_goes_elsewhere(told):
    h, publisher, _ = told
    h.submit("llm")
    h.tick()
    h.tick()
    h.compute.spot_stockouts.add("us-central1-a")
    h.compute.preempt("llm-1")  # down already: the loss and the relaunch are one commit
    h.tick()
    assert h.status("llm").zone == "us-central1-b"
    preempted = next(e for e in events(publisher) if e["event"] == "preempted")
    assert (preempted["zone"], preempted["phase"], preempted["instance"]) == ("us-central1-a", "RECOVERING", "llm-1")


def test_a_deleted_spec_still_tells_the_jobs_own_destinations_of_the_cancel(told):
    h, publisher, webhook = told
    mine = f"projects/{PROJECT}/topics/mine"
    publisher.create_topic(mine)
    h.submit("llm", spec_doc(notify={"topic": mine}))
    h.tick()
    h.store.delete(BUCKET, "jobs/llm/spec.yaml")
    h.tick()
    assert h.status("llm").phase == Phase.CANCELLED
    assert [json.loads(d)["event"] for t, d, _ in publisher.published if t == mine][-1] == "cancelled"


def test_text_a_vm_wrote_cannot_ping_a_channel_or_disguise_a_link(told):
    h, _, webhook = told
    h.submit("llm", spec_doc(policy={"max_failures": 0}))
    h.tick()
    h.tick()
    body = {"exit_code": 1, "instance": "llm-1", "attempt": 1, "node": 0, "token": h.status("llm").attempt_token,
            "reason": "<!channel> <https://evil.example|console.cloud.google.com> & more"}
    h.store.put(BUCKET, "jobs/llm/exit", json.dumps(body))
    h.tick()
    text = webhook.bodies(HOOK)[-1]["text"]
    assert "<" not in text and ">" not in text and "&lt;!channel&gt;" in text and "&amp; more" in text


def test_notification_ids_stay_those_of_their_transitions_when_the_event_count_goes_back(told):
    h, publisher, _ = told
    h.submit("llm")
    h.tick()
    st = h.status("llm")
    rolled = st.model_copy(update={"event_count": 0})  # written back by an older controller, or by hand
    h.store.put(BUCKET, "jobs/llm/status.json", rolled.to_json())
    h.tick()
    h.tick()
    ids = [e["id"] for e in events(publisher)]
    assert len(ids) == len(set(ids)) and [e["event"] for e in events(publisher)] == ["started", "running"]


def test_a_budget_raised_by_a_new_spec_warns_again_under_its_own_id(told):
    h, publisher, _ = told
    h.submit("llm", spec_doc(policy={"max_restarts": 2}))
    h.tick()
    for _ in range(2):
        h.tick()
        h.marker("llm")
        h.tick()
    h.submit("llm", spec_doc(policy={"max_restarts": 10}))
    for _ in range(7):
        h.tick()
        h.marker("llm")
        h.tick()
    budget = [e for e in events(publisher) if e["event"] == "budget"]
    assert len(budget) == 2 and budget[0]["id"] != budget[1]["id"]


def test_the_replacement_is_inserted_before_anyone_is_told(told):
    h, _, _ = told
    seen: list[tuple[str, list[str]]] = []

    class Watching:
        def publish(self, topic, data, attributes):
            seen.append((attributes["event"], h.live()))
            return "1"

    h.notifier = Notifier(h.policy, Watching())
    h.submit("llm")
    h.tick()
    h.tick()
    h.compute.preempt("llm-1")
    h.tick()
    assert ("preempted", ["llm-2"]) in seen  # told after the chain: llm-2 was already inserted


# -- found by attacking the fixes -------------------------------------------------------------------
@pytest.mark.parametrize(("allowed", "host", "ok"), [
    ("*.slack.com", "hooks.slack.com", True),
    ("*.slack.com", "a.b.slack.com", False),  # * is one label
    ("hooks.slack.com*", "hooks.slack.com.attacker.example", False),
    ("10.*", "10.0.0.5.attacker.example", False),
    ("*", "2852039166", False),  # 169.254.169.254, written as a number
    ("*.*", "0x7f.1", False),
    ("*.*.*.*", "169.254.169.254", False),
    ("hooks.slack.com", "hooks.slack.com.", True),
])
def test_webhook_host_globs_match_label_by_label_and_never_an_address(allowed, host, ok):
    from controller.core.policy import ControllerPolicy
    from controller.core.spec import Notify

    policy = ControllerPolicy(default_project=PROJECT, allowed_webhook_hosts=(allowed,))
    assert (policy.notify_problems(Notify(webhook=f"https://{host}/services/x")) == []) is ok


def test_destinations_a_status_records_are_checked_against_the_policy_when_used(told):
    h, publisher, webhook = told
    h.submit("llm", spec_doc(notify={"topic": f"projects/{PROJECT}/topics/mine"}))
    publisher.create_topic(f"projects/{PROJECT}/topics/mine")
    h.tick()
    raw = json.loads(h.store.read(BUCKET, "jobs/llm/status.json").data)
    raw["notify"] = {"topic": "projects/elsewhere-proj/topics/theirs"}  # whoever may write a spec may write this
    h.store.put(BUCKET, "jobs/llm/status.json", json.dumps(raw))
    h.store.delete(BUCKET, "jobs/llm/spec.yaml")
    h.tick()
    assert h.status("llm").phase == Phase.CANCELLED
    assert "projects/elsewhere-proj/topics/theirs" not in {t for t, _, _ in publisher.published}
    assert [b["respawn"]["event"] for b in webhook.bodies(HOOK)][-1] == "cancelled"


def own_destinations(told, url: str):
    """A job submitted with its own topic and webhook; (harness, publisher, webhook, its topic)."""
    h, publisher, webhook = told
    mine = f"projects/{PROJECT}/topics/mine"
    publisher.create_topic(mine)
    h.submit("llm", spec_doc(notify={"topic": mine, "webhook": url}))
    h.tick()
    return h, publisher, webhook, mine


def test_a_jobs_own_webhook_url_is_never_written_into_its_status(told):
    url = "https://hooks.slack.com/services/T1/B1/SECRETxyz"
    h, publisher, webhook, mine = own_destinations(told, url)
    h.tick()
    assert url in {u for u, _ in webhook.posted}  # told while its spec says where
    raw = h.store.read(BUCKET, "jobs/llm/status.json").data
    assert b"SECRET" not in raw and h.status("llm").notify.topic == mine and h.status("llm").notify.webhook is None


def test_a_deleted_spec_tells_its_topic_of_the_cancel_but_not_its_webhook(told):
    url = "https://hooks.slack.com/services/T1/B1/mine"
    h, publisher, webhook, mine = own_destinations(told, url)
    h.store.delete(BUCKET, "jobs/llm/spec.yaml")
    h.tick()
    assert h.status("llm").phase == Phase.CANCELLED
    assert [json.loads(d)["event"] for t, d, _ in publisher.published if t == mine][-1] == "cancelled"
    assert [b["respawn"]["event"] for b in webhook.bodies(url)] == ["started"]  # its URL went with its spec
    assert [b["respawn"]["event"] for b in webhook.bodies(HOOK)][-1] == "cancelled"


def test_a_webhook_url_a_status_was_written_with_is_dropped_when_read_and_never_posted_to(told):
    h, _, webhook = told
    h.submit("llm")
    h.tick()
    raw = json.loads(h.store.read(BUCKET, "jobs/llm/status.json").data)
    raw["notify"] = {"webhook": "https://hooks.slack.com/services/T1/B1/OLDSECRET"}  # an older controller's
    h.store.put(BUCKET, "jobs/llm/status.json", json.dumps(raw))
    h.store.delete(BUCKET, "jobs/llm/spec.yaml")
    h.tick()
    assert h.status("llm").phase == Phase.CANCELLED
    assert {u for u, _ in webhook.posted} == {HOOK}
    assert b"OLDSECRET" not in h.store.read(BUCKET, "jobs/llm/status.json").data


# -- what a user pays for: a change of provisioning model (issue 22, item 15) --------------------------
def fallback(**policy) -> dict:
    return spec_doc(provisioning=["spot", "standard"],
                    policy={"zone_cooldown": "10m", "fallback": {"step_up_after": "1h", **policy}})


def test_a_step_down_to_a_pricier_model_is_told_naming_both_models_and_their_prices(told):
    h, publisher, webhook = told
    h.compute.spot_stockouts.update({"us-central1-a", "us-central1-b"})
    h.submit("llm", fallback())
    h.tick()
    assert h.status("llm").provisioning == "standard"
    sent = events(publisher)
    moved = [e for e in sent if e["event"] == "provisioning"]
    assert len(moved) == 1
    down = moved[0]
    # g2-standard-8 carries one L4: $0.22/h on Spot, $0.71/h on demand (controller/core/prices.py)
    assert (down["previous_model"], down["model"]) == ("spot", "standard")
    assert (down["previous_price_per_hour"], down["price_per_hour"]) == (0.22, 0.71)
    assert down["severity"] == "warning" and "stepping down from spot to standard" in down["cause"]
    started = next(e for e in sent if e["event"] == "started")
    assert (started["model"], started["price_per_hour"]) == ("spot", 0.22)  # every notice names its model
    text = next(b["text"] for b in webhook.bodies(HOOK) if b["respawn"]["event"] == "provisioning")
    assert "spot ($0.22/h)" in text and "standard ($0.71/h)" in text
    _, _, attributes = next(m for m in publisher.published if json.loads(m[1])["event"] == "provisioning")
    assert attributes["event"] == "provisioning"


def test_a_step_back_up_to_the_cheaper_model_is_told_too(told):
    h, publisher, _ = told
    h.compute.spot_stockouts.update({"us-central1-a", "us-central1-b"})
    h.submit("llm", fallback())
    h.tick()
    h.tick()
    h.compute.spot_stockouts.clear()
    h.advance(minutes=61)
    h.compute.host_error("llm-1")
    h.tick()
    assert h.status("llm").provisioning == "spot"
    moved = [e for e in events(publisher) if e["event"] == "provisioning"]
    assert [(e["previous_model"], e["model"]) for e in moved] == [("spot", "standard"), ("standard", "spot")]
    up = moved[-1]
    assert (up["previous_price_per_hour"], up["price_per_hour"], up["severity"]) == (0.71, 0.22, "info")
    assert up["attempt"] == 2 and len({e["id"] for e in events(publisher)}) == len(events(publisher))


def test_a_model_change_is_told_once_however_many_passes_race(told):
    h, publisher, _ = told
    h.compute.spot_stockouts.update({"us-central1-a", "us-central1-b"})
    h.submit("llm", fallback())
    h.race("llm")
    h.tick()
    assert [e["event"] for e in events(publisher)].count("provisioning") == 1


# -- a slow destination never slows recovery (issue 22, item 13) ------------------------------------------
JOBS = [f"job{i}" for i in range(4)]


@pytest.fixture
def slow():
    """Four running jobs whose pass tells a topic and a webhook; the pass waits 0.5 s for its sends."""
    h = Harness(workers=8)
    h.policy = dataclasses.replace(h.policy, notify_topic=TOPIC, notify_webhook=HOOK)
    publisher, webhook = MemoryPublisher([TOPIC]), MemoryWebhook()
    h.notifier = Notifier(h.policy, publisher, webhook, wait=0.5)
    for job in JOBS:
        h.submit(job)
    h.tick()
    h.tick()
    assert all(h.status(j).phase == Phase.RUNNING for j in JOBS)
    yield h, publisher, webhook
    webhook.answer_now()  # no thread left waiting on it


def test_a_webhook_that_never_answers_costs_a_pass_its_notify_budget_once_and_every_replacement_is_inserted(slow):
    h, publisher, webhook = slow
    webhook.delay, webhook.timeout = math.inf, 5.0  # every post times out after 5 s (HttpWebhook's own limit)
    for job in JOBS:
        h.compute.preempt(f"{job}-1")
    began = time.monotonic()
    summary = h.tick()
    took = time.monotonic() - began
    # 2 notices a job (preempted, started): 10 s if each post held its job's chain; 0.5 s of budget.
    assert took < 4.0, f"the pass took {took:.1f} s"
    assert sorted(h.live()) == sorted(f"{j}-2" for j in JOBS)  # every recovery's insert happened
    told = [e for e in events(publisher) if e["event"] in ("preempted", "started") and e["attempt"] >= 1]
    assert sum(e["event"] == "preempted" for e in told) == 4  # the topic is not held by the webhook
    unsent = summary.notices_carried + summary.notices_in_flight
    assert len(unsent) == 8 and len(summary.notices_in_flight) >= 1  # every notice the webhook lacks, by id
    assert summary.as_dict()["notices_unsent"]["carried"] == summary.notices_carried


def test_notices_a_pass_could_not_send_are_sent_by_the_next_one_and_none_twice(slow):
    h, publisher, webhook = slow
    webhook.delay, webhook.timeout = math.inf, 2.0
    for job in JOBS:
        h.compute.preempt(f"{job}-1")
    first = h.tick()
    assert first.notices_carried and h.notifier.carried == first.notices_carried
    webhook.delay = 0.0  # the webhook answers again
    second = h.tick()
    assert not second.notices_carried and not second.notices_in_flight and h.notifier.carried == []
    posted = [b["respawn"]["id"] for b in webhook.bodies(HOOK)]
    assert set(first.notices_carried) <= set(posted) and len(posted) == len(set(posted))
    # Those under way when the first pass ended may still arrive: never sent again, only named.
    sent_by_topic = {e["id"] for e in events(publisher)}
    assert sent_by_topic == set(posted) | set(first.notices_in_flight)


def test_a_notice_a_dead_webhook_never_takes_is_given_up_after_a_few_passes_and_logged(caplog):
    from controller.service import notifier

    h = Harness()  # one job at a time, and one send at a time: the dead webhook holds every later one
    h.policy = dataclasses.replace(h.policy, notify_webhook=HOOK)
    webhook = MemoryWebhook(delay=math.inf, timeout=0.2)
    h.notifier = Notifier(h.policy, None, webhook, wait=0.05)
    jobs = [f"job{i}" for i in range(8)]
    for job in jobs:
        h.submit(job)
    try:
        with caplog.at_level("WARNING", logger="controller.service.notifier"):
            h.tick()  # 8 notices: one under way when the pass ends, 7 carried
            for _ in range(notifier.MAX_CARRIES + 1):
                h.tick("nobody")  # nothing new to tell: each pass takes one more, and the dead webhook holds it
        given_up = [i for r in caplog.records for i in getattr(r, "json_fields", {}).get("notices_given_up", ())]
        assert given_up and h.notifier.carried == [] and webhook.posted == []
        assert all(i.split("/")[0] in jobs and "/launch/" in i for i in given_up)
    finally:
        webhook.answer_now()


def test_the_deployed_notifier_waits_for_its_sends_as_long_as_respawn_notify_wait_says(monkeypatch):
    from controller.service import bootstrap
    from controller.service.config import Settings

    assert Settings(bucket=BUCKET, project=PROJECT, _env_file=None).notify_wait == 10.0
    monkeypatch.setenv("RESPAWN_NOTIFY_WAIT", "2.5")
    monkeypatch.setattr("controller.adapters.google.capacity_advisor", lambda config: None)  # no credentials here
    config = Settings(bucket=BUCKET, project=PROJECT, _env_file=None)
    h = Harness()
    bootstrap.override(None, config, h.store, h.compute)
    try:
        engine = bootstrap.build(config)
    finally:
        bootstrap.override(None)
    assert engine.executor.notifier.wait == 2.5
