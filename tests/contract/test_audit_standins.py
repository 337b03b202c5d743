"""The audit path's stand-ins: Compute's and Cloud TPU's System Event audit entries, Cloud Logging's
sinks (``projects.sinks``, the Log Router) and Pub/Sub's topic IAM and push subscriptions
(``localcloud.compute``, ``localcloud.tpu``, ``localcloud.logging``, ``localcloud.pubsub``).

The entries are LogEntry objects by ``logging.v2.json``'s schema and in the shape of real ones;
``controller.core.audit.sink_filter`` picks exactly them; the real google-cloud-logging client
(REST) and gcloud manage sinks; a sink delivers only with its writer identity granted the
publisher role; a push is what Eventarc delivers to a Pub/Sub-triggered function, at least once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from flask import Flask, Response, request
from google.api_core import exceptions as gexc

from controller.adapters.google import logging_client
from controller.core import audit
from controller.core.ports import StopReason
from controller.service.config import Settings
from localcloud import discovery
from localcloud.compute import ComputeServer, project_number
from localcloud.http import Served
from localcloud.logging import DOC, SINK_DELAY, LoggingServer, compile_filter, system_event
from localcloud.pubsub import PUSH_DELAY, PubsubServer, _Subscription
from localcloud.tpu import TpuServer
from localcloud.tpu_api import hostname
from tests.wait import until

PROJECT = "audit-proj"
ZONE = "us-central1-a"
TOPIC = f"projects/{PROJECT}/topics/audit"
SPOT = {"provisioningModel": "SPOT", "automaticRestart": False, "onHostMaintenance": "TERMINATE"}


# -- the entries Compute and Cloud TPU write -----------------------------------------------------
@pytest.fixture(scope="module")
def written() -> Iterator[dict[str, list[dict[str, Any]]]]:
    """Every audit entry a Compute server and a TPU server wrote for one VM (node) per event."""
    entries: list[dict[str, Any]] = []
    lock = threading.Lock()

    def hook(batch: list[dict[str, Any]]) -> None:
        with lock:
            entries.extend(batch)

    with ComputeServer(run_vms=False, boot_delay=0.01, shutdown_budget=0.5) as compute, \
            TpuServer(vm_env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, boot_delay=0.01,
                      shutdown_budget=0.5) as tpu:
        compute.audit_log = tpu.audit_log = hook
        events = {"preempted": compute.preempt, "hard": lambda n: compute.preempt(n, graceful=False),
                  "host-error": compute.host_error, "crash": compute.crash, "maintenance": compute.maintenance}
        for name in events:
            body = {"name": name, "machineType": f"zones/{ZONE}/machineTypes/g2-standard-8",
                    "disks": [{"boot": True, "initializeParams": {
                        "sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
                    "networkInterfaces": [{"network": "global/networks/default"}], "scheduling": SPOT}
            r = requests.post(f"{compute.endpoint}/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances", json=body,
                              timeout=10)
            assert r.ok, r.text
        until("the VMs RUNNING", lambda: all(compute.instance(n)["status"] == "RUNNING" for n in events))
        for name, event in events.items():
            event(name)
        until("the VMs TERMINATED", lambda: all(compute.instance(n)["status"] == "TERMINATED" for n in events))
        r = requests.post(f"{tpu.endpoint}/v2/projects/{PROJECT}/locations/{ZONE}/nodes", params={"nodeId": "slice"},
                          json={"acceleratorType": "v4-32", "runtimeVersion": "tpu-ubuntu2204-base",
                                "schedulingConfig": {"spot": True}}, timeout=10)
        assert r.ok, r.text
        until("the node READY", lambda: tpu.node("slice")["state"] == "READY")
        node = tpu.node("slice")
        tpu.preempt("slice", graceful=False)
        until("the node PREEMPTED", lambda: tpu.node("slice")["state"] == "PREEMPTED")
        with lock:
            by_instance: dict[str, list[dict[str, Any]]] = {}
            for entry in entries:
                by_instance.setdefault(entry["protoPayload"]["resourceName"].rsplit("/", 1)[-1], []).append(entry)
        yield {**by_instance, "_node": [node], "_operations": compute.operations(),
               "_ids": [{n: compute.instance(n)["id"] for n in events}]}


def test_each_entry_is_a_log_entry_by_the_discovery_document(written):
    entries = [e for k, v in written.items() if not k.startswith("_") for e in v]
    assert len(entries) >= 9
    for entry in entries:
        assert discovery.validate(entry, "LogEntry", "entry", doc=DOC) == [], entry
        LoggingServer().write([entry])  # what entries.write takes


def test_compute_writes_one_entry_per_system_event_in_googles_shape(written):
    expected = {"preempted": "compute.instances.preempted", "hard": "compute.instances.preempted",
                "host-error": "compute.instances.hostError", "crash": "compute.instances.guestTerminate",
                "maintenance": "compute.instances.terminateOnHostMaintenance"}
    ids = written["_ids"][0]
    for name, method in expected.items():
        [entry] = written[name]
        payload = entry["protoPayload"]
        assert entry["logName"] == f"projects/{PROJECT}/logs/cloudaudit.googleapis.com%2Fsystem_event"
        assert entry["resource"] == {"type": "gce_instance",
                                     "labels": {"instance_id": ids[name], "project_id": PROJECT, "zone": ZONE}}
        assert entry["severity"] == "INFO" and len(entry["insertId"]) == 12
        assert payload == {"@type": "type.googleapis.com/google.cloud.audit.AuditLog",
                           "status": {"message": audit.STATUS_MESSAGES[method]},
                           "authenticationInfo": {"principalEmail": "system@google.com"},
                           "serviceName": "compute.googleapis.com", "methodName": method,
                           "resourceName": f"projects/{PROJECT}/zones/{ZONE}/instances/{name}",
                           "request": {"@type": f"type.googleapis.com/{method}"}}
        operation = entry["operation"]
        assert operation["producer"] == method and operation["first"] and operation["last"]
        # The entry's operation is the zone operation Compute records for the event.
        [op] = [o for o in written["_operations"] if o["name"] == operation["id"]]
        assert op["operationType"] == method and op["targetLink"].endswith(f"/instances/{name}")
        assert op["name"].startswith("systemevent-") and op["status"] == "DONE"
        event = audit.parse_entry(entry)
        assert (event.project, event.zone, event.instance, event.method) == (PROJECT, ZONE, name, method)
        assert event.instance_id == ids[name] and event.reason == audit.LOSSES[method]
    assert audit.parse_entry(written["crash"][0]).reason is StopReason.CRASHED
    assert audit.STATUS_MESSAGES["compute.instances.preempted"] == "Instance was preempted."


def test_a_preempted_tpu_slice_writes_one_entry_per_worker_vm(written):
    node = written["_node"][0]
    workers = [hostname(node["id"], i) for i in range(4)]
    for worker in workers:
        [entry] = written[worker]
        event = audit.parse_entry(entry)
        assert event.tpu_worker and event.job is None and event.method == "compute.instances.preempted"
        assert entry["resource"]["type"] == "gce_instance"
        assert entry["protoPayload"]["resourceName"] == f"projects/{PROJECT}/zones/{ZONE}/instances/{worker}"
        assert event.instance_id is not None


# -- the sink's filter ---------------------------------------------------------------------------
def _others() -> dict[str, dict[str, Any]]:
    """Entries the sink must not pick: what else a project's logs hold about its instances."""
    resource = {"type": "gce_instance", "labels": {"instance_id": "1", "project_id": PROJECT, "zone": ZONE}}
    preempted = system_event(PROJECT, ZONE, "job-1", "1", "compute.instances.preempted")
    admin = json.loads(json.dumps(preempted))
    admin["logName"] = f"projects/{PROJECT}/logs/cloudaudit.googleapis.com%2Factivity"
    admin["protoPayload"].update(methodName="v1.compute.instances.delete",
                                 authenticationInfo={"principalEmail": "someone@example.com"})
    data_access = json.loads(json.dumps(admin))
    data_access["logName"] = f"projects/{PROJECT}/logs/cloudaudit.googleapis.com%2Fdata_access"
    data_access["protoPayload"]["methodName"] = "v1.compute.instances.get"
    upcoming = system_event(PROJECT, ZONE, "job-1", "1", "compute.instances.upcomingMaintenance")
    disk = system_event(PROJECT, ZONE, "job-1", "1", "compute.instances.preempted")
    disk["resource"] = {"type": "gce_disk", "labels": {"disk_id": "2", "project_id": PROJECT, "zone": ZONE}}
    return {
        "serial": {"logName": f"projects/{PROJECT}/logs/serialconsole.googleapis.com%2Fserial_port_1_output",
                   "resource": resource, "textPayload": "compute.instances.preempted Instance was preempted."},
        "other project": system_event("someone-else", ZONE, "job-1", "1", "compute.instances.preempted"),
        "admin activity": admin, "data access": data_access, "another system method": upcoming,
        "not an instance": disk,
    }


def test_the_sink_filter_picks_exactly_the_system_events_of_an_instance(written):
    matches = compile_filter(audit.sink_filter(PROJECT))
    for name in ("preempted", "hard", "host-error", "crash", "maintenance"):
        assert matches(written[name][0]), name
    for name, entry in _others().items():
        assert not matches(entry), name
    restarted = system_event(PROJECT, ZONE, "job-1", "1", "compute.instances.automaticRestart")
    assert matches(restarted)  # in METHODS: the job is looked at, though nothing was lost


# -- sinks: CRUD through the real client and gcloud ------------------------------------------------
@pytest.fixture(scope="module")
def cloud() -> Iterator[tuple[LoggingServer, PubsubServer]]:
    with PubsubServer(push_delay=0.05) as pubsub, LoggingServer(pubsub=pubsub, sink_delay=0.05) as logging_:
        yield logging_, pubsub


def test_the_real_client_creates_gets_lists_and_deletes_sinks(cloud):
    server, _ = cloud
    client = logging_client(Settings(project="crud-proj", logging_endpoint=server.endpoint))
    sink = client.sink("crud", filter_=audit.sink_filter("crud-proj"),
                       destination="pubsub.googleapis.com/projects/crud-proj/topics/topic")
    assert not sink.exists()
    sink.create(unique_writer_identity=True)
    assert sink.writer_identity == \
        f"serviceAccount:service-{project_number('crud-proj')}@gcp-sa-logging.iam.gserviceaccount.com"
    with pytest.raises(gexc.Conflict):
        client.sink("crud", filter_="", destination="pubsub.googleapis.com/projects/crud-proj/topics/topic").create()
    again = client.sink("crud")
    again.reload()
    assert (again.filter_, again.destination) == (audit.sink_filter("crud-proj"), sink.destination)
    shared = client.sink("shared", destination="storage.googleapis.com/some-bucket")
    shared.create()
    assert shared.writer_identity == "serviceAccount:cloud-logs@system.gserviceaccount.com"
    assert sorted(s.name for s in client.list_sinks()) == ["crud", "shared"]
    again.filter_ = 'severity>=ERROR'
    with pytest.raises(gexc.BadRequest):  # "an error if the old value is true and the new value ... defaulted to false"
        again.update()
    again.update(unique_writer_identity=True)
    assert client.sink("crud").exists()
    got = requests.get(f"{server.endpoint}/v2/projects/crud-proj/sinks/crud", timeout=5).json()
    assert got["filter"] == "severity>=ERROR" and got["createTime"] <= got["updateTime"]
    sink.delete()
    shared.delete()
    assert not sink.exists() and list(client.list_sinks()) == []
    with pytest.raises(gexc.NotFound):
        sink.delete()


@pytest.mark.parametrize("body,why", [
    ({"name": "bad-filter", "destination": "pubsub.googleapis.com/projects/p/topics/topic", "filter": "SEARCH(\"x\")"},
     "Invalid query"),
    ({"name": "bad-destination", "destination": "pubsub/topics/topic"}, "Invalid destination"),
    ({"name": "-bad name", "destination": "pubsub.googleapis.com/projects/p/topics/topic"}, "Invalid sink name"),
    ({"name": "no-destination"}, "destination is required"),
])
def test_a_sink_google_would_refuse_is_refused_400(cloud, body, why):
    server, _ = cloud
    r = requests.post(f"{server.endpoint}/v2/projects/refused/sinks", json=body, timeout=5)
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert why in r.json()["error"]["message"]


def test_gcloud_creates_and_describes_a_sink(cloud, tmp_path):
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        pytest.skip("gcloud is not on PATH: the gcloud variant of the sink test was not run")
    server, _ = cloud
    token = tmp_path / "token"
    token.write_text("local\n")
    env = {**os.environ, "CLOUDSDK_API_ENDPOINT_OVERRIDES_LOGGING": f"{server.endpoint}/",
           "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(token), "CLOUDSDK_CORE_PROJECT": "gcloud-proj",
           "CLOUDSDK_CONFIG": str(tmp_path / "config"), "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}

    def run(*args: str) -> Any:
        done = subprocess.run([gcloud, "logging", "sinks", *args, "--format=json"], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout) if done.stdout.strip() else None

    run("create", "respawn-audit", "pubsub.googleapis.com/projects/gcloud-proj/topics/respawn-audit",
        f"--log-filter={audit.sink_filter('gcloud-proj')}")
    described = run("describe", "respawn-audit")
    assert described["filter"] == audit.sink_filter("gcloud-proj")
    assert described["writerIdentity"].endswith("@gcp-sa-logging.iam.gserviceaccount.com")  # gcloud asks for unique
    run("delete", "respawn-audit")
    assert server.sinks("gcloud-proj") == []


# -- the Log Router: delivery, and only with the grant -------------------------------------------------
def _sink(server: LoggingServer, pubsub: PubsubServer, project: str, grant: bool) -> str:
    topic = f"projects/{project}/topics/audit"
    requests.put(f"{pubsub.endpoint}/v1/{topic}", json={}, timeout=5).raise_for_status()
    r = requests.post(f"{server.endpoint}/v2/projects/{project}/sinks", params={"uniqueWriterIdentity": "true"},
                      json={"name": "audit", "destination": f"pubsub.googleapis.com/{topic}",
                            "filter": audit.sink_filter(project)}, timeout=5)
    r.raise_for_status()
    if grant:
        r = requests.post(f"{pubsub.endpoint}/v1/{topic}:setIamPolicy", json={"policy": {"bindings": [
            {"role": "roles/pubsub.publisher", "members": [r.json()["writerIdentity"]]}]}}, timeout=5)
        r.raise_for_status()
    return topic


def test_a_sink_publishes_what_its_filter_picks_as_google_does(cloud):
    server, pubsub = cloud
    topic = _sink(server, pubsub, PROJECT, grant=True)
    entry = system_event(PROJECT, ZONE, "job-2", "7", "compute.instances.preempted")
    server.write([*_others().values(), entry])
    assert server.settle()
    [message] = pubsub.published(topic)
    data = audit.decode_message({"message": message})
    assert data["insertId"] == entry["insertId"] and "receiveTimestamp" in data
    assert message["attributes"] == {"logging.googleapis.com/timestamp": entry["timestamp"]}
    assert audit.parse_entry(data).instance == "job-2"
    # entries.write reaches the sink as well
    other = system_event(PROJECT, ZONE, "job-3", "8", "compute.instances.hostError")
    requests.post(f"{server.endpoint}/v2/entries:write", json={"entries": [other]}, timeout=5).raise_for_status()
    assert server.settle()
    assert [audit.decode_message({"message": m})["insertId"] for m in pubsub.published(topic)] == \
        [entry["insertId"], other["insertId"]]


def test_a_sink_whose_writer_is_not_granted_delivers_nothing(cloud):
    server, pubsub = cloud
    topic = _sink(server, pubsub, "ungranted", grant=False)
    entry = system_event("ungranted", ZONE, "job-1", "1", "compute.instances.preempted")
    server.write([entry])
    assert server.settle()
    assert pubsub.published(topic) == []
    [error] = [e for e in server.sink_errors if e["sink"] == "projects/ungranted/sinks/audit"]
    assert error["insertId"] == entry["insertId"] and "pubsub.topics.publish" in error["error"]
    policy = requests.get(f"{pubsub.endpoint}/v1/{topic}:getIamPolicy", timeout=5).json()
    assert policy == {"etag": "ACAB"}


def test_a_topic_policy_is_read_modify_write(cloud):
    _, pubsub = cloud
    topic = "projects/iam-proj/topics/topic"
    requests.put(f"{pubsub.endpoint}/v1/{topic}", json={}, timeout=5).raise_for_status()
    first = requests.get(f"{pubsub.endpoint}/v1/{topic}:getIamPolicy", timeout=5).json()
    binding = {"role": "roles/pubsub.publisher", "members": ["serviceAccount:a@b.iam.gserviceaccount.com"]}
    set1 = requests.post(f"{pubsub.endpoint}/v1/{topic}:setIamPolicy",
                         json={"policy": {**first, "bindings": [binding]}}, timeout=5)
    assert set1.ok and set1.json()["bindings"] == [binding] and set1.json()["etag"] != first["etag"]
    stale = requests.post(f"{pubsub.endpoint}/v1/{topic}:setIamPolicy",
                          json={"policy": {**first, "bindings": []}}, timeout=5)
    assert stale.status_code == 409 and stale.json()["error"]["status"] == "ABORTED"
    bad = requests.post(f"{pubsub.endpoint}/v1/{topic}:setIamPolicy",
                        json={"policy": {"bindings": [{"role": "roles/pubsub.publisher", "members": ["nobody"]}]}},
                        timeout=5)
    assert bad.status_code == 400


# -- push, as Eventarc delivers to a Pub/Sub-triggered function ------------------------------------------
class Receiver:
    """An HTTP endpoint that records each POST (headers, JSON body) and answers ``answers`` in turn, then 204."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], Any]] = []
        self.answers: list[int] = []
        self.lock = threading.Lock()
        app = Flask("receiver")

        @app.post("/")
        def receive() -> Response:
            with self.lock:
                self.received.append((dict(request.headers), request.get_json(force=True)))
                code = self.answers.pop(0) if self.answers else 204
            return Response("", status=code)

        self.served = Served(app, "receiver", threads=4)

    def url(self, topic: str | None = None) -> str:
        mode = f"?__GCP_CloudEventsMode=CUSTOM_PUBSUB_{topic.replace('/', '%2F')}" if topic else ""
        return f"{self.served.url}/{mode}"

    def ids(self) -> list[str]:
        with self.lock:
            return [body["message"]["messageId"] for _, body in self.received]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.served.stop()


def _push_sub(pubsub: PubsubServer, name: str, topic: str, endpoint: str, **extra: Any) -> str:
    requests.put(f"{pubsub.endpoint}/v1/{topic}", json={}, timeout=5)  # 409 when it exists: fine
    sub = f"projects/{topic.split('/')[1]}/subscriptions/{name}"
    r = requests.put(f"{pubsub.endpoint}/v1/{sub}", json={"topic": topic, "pushConfig": {"pushEndpoint": endpoint},
                                                          **extra}, timeout=5)
    assert r.ok, r.text
    return sub


def _publish(pubsub: PubsubServer, topic: str, text: str) -> str:
    import base64

    r = requests.post(f"{pubsub.endpoint}/v1/{topic}:publish", json={"messages": [
        {"data": base64.b64encode(text.encode()).decode()}]}, timeout=5)
    r.raise_for_status()
    return r.json()["messageIds"][0]


def test_a_sink_entry_is_pushed_as_eventarcs_cloudevent(cloud, receiver):
    server, pubsub = cloud
    topic = _sink(server, pubsub, "push-proj", grant=True)
    sub = _push_sub(pubsub, "eventarc-us-central1-on-audit", topic, receiver.url(topic))
    entry = system_event("push-proj", ZONE, "job-4", "9", "compute.instances.guestTerminate")
    server.write([entry])
    until("the push", lambda: receiver.received)
    headers, body = receiver.received[0]
    assert headers["Ce-Type"] == "google.cloud.pubsub.topic.v1.messagePublished"
    assert headers["Ce-Source"] == f"//pubsub.googleapis.com/{topic}" and headers["Ce-Specversion"] == "1.0"
    assert headers["Ce-Id"] == body["message"]["messageId"] == body["message"]["message_id"]
    assert headers["Ce-Time"] == body["message"]["publishTime"]
    assert body["subscription"] == sub
    assert body["message"]["attributes"] == {"logging.googleapis.com/timestamp": entry["timestamp"]}
    event = audit.parse_entry(audit.decode_message(body))
    assert (event.instance, event.reason) == ("job-4", StopReason.CRASHED)
    until("acknowledged", lambda: pubsub.backlog(sub) == 0)


def test_a_plain_push_subscription_gets_pubsubs_push_format(cloud, receiver):
    _, pubsub = cloud
    topic = "projects/plain/topics/topic"
    _push_sub(pubsub, "plain", topic, receiver.url())
    message_id = _publish(pubsub, topic, "hello")
    until("the push", lambda: receiver.received)
    headers, body = receiver.received[0]
    assert "Ce-Type" not in headers and body["message"]["messageId"] == message_id


def test_a_push_answered_500_is_delivered_again_after_a_backoff(cloud, receiver):
    _, pubsub = cloud
    topic = "projects/retry/topics/topic"
    receiver.answers = [500, 503]
    sub = _push_sub(pubsub, "retry", topic, receiver.url(),
                    retryPolicy={"minimumBackoff": "0.2s", "maximumBackoff": "1s"})
    message_id = _publish(pubsub, topic, "again")
    until("three pushes", lambda: len(receiver.received) >= 3)
    assert receiver.ids() == [message_id] * 3
    until("acknowledged", lambda: pubsub.backlog(sub) == 0)
    attempts = [p for p in pubsub.pushes if p["subscription"] == sub]
    assert [p["status"] for p in attempts] == [500, 503, 204] and [p["attempt"] for p in attempts] == [1, 2, 3]


def test_an_endpoint_that_does_not_answer_is_delivered_again(cloud):
    _, pubsub = cloud
    topic = "projects/nobody/topics/topic"
    sub = _push_sub(pubsub, "nobody", topic, "http://127.0.0.1:9/", retryPolicy={"minimumBackoff": "0.1s"})
    _publish(pubsub, topic, "anyone?")
    until("two attempts", lambda: len([p for p in pubsub.pushes if p["subscription"] == sub]) >= 2)
    assert {p["status"] for p in pubsub.pushes if p["subscription"] == sub} == {None}
    assert pubsub.backlog(sub) == 1
    requests.delete(f"{pubsub.endpoint}/v1/{sub}", timeout=5).raise_for_status()


def test_pubsubs_documented_backoff_doubles_from_10_to_600_seconds():
    sub = _Subscription({"retryPolicy": {}})
    assert [sub.backoff(n) for n in (1, 2, 3, 6, 7, 20)] == [10, 20, 40, 320, 600, 600]
    assert _Subscription({"retryPolicy": {"minimumBackoff": "1s", "maximumBackoff": "5s"}}).backoff(4) == 5
    assert 0 < PUSH_DELAY <= 5 and 0 < SINK_DELAY <= 5  # an entry reaches its function in seconds


def test_drop_and_duplicate_faults(cloud, receiver):
    _, pubsub = cloud
    topic = "projects/faulty/topics/topic"
    sub = _push_sub(pubsub, "faulty", topic, receiver.url())
    r = requests.post(f"{pubsub.endpoint}/_local/drop_next", json={"times": 1}, timeout=5)
    assert r.ok
    lost = _publish(pubsub, topic, "lost")
    until("the drop", lambda: any(p["dropped"] for p in pubsub.pushes if p["subscription"] == sub))
    pubsub.duplicate_next(1)
    twice = _publish(pubsub, topic, "twice")
    once = _publish(pubsub, topic, "once")
    until("three posts", lambda: len(receiver.received) >= 3)
    until("acknowledged", lambda: pubsub.backlog(sub) == 0)
    assert lost not in receiver.ids()
    assert sorted(receiver.ids()) == sorted([twice, twice, once])


def test_a_push_endpoint_google_would_refuse_is_refused(cloud):
    _, pubsub = cloud
    requests.put(f"{pubsub.endpoint}/v1/projects/refuse/topics/topic", json={}, timeout=5)
    r = requests.put(f"{pubsub.endpoint}/v1/projects/refuse/subscriptions/sub", json={
        "topic": "projects/refuse/topics/topic", "pushConfig": {"pushEndpoint": "http://example.com/"}}, timeout=5)
    assert r.status_code == 400 and "push endpoint" in r.json()["error"]["message"]


def test_the_real_pubsub_client_grants_a_topic_and_makes_a_push_subscription(cloud):
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import pubsub_v1

    _, pubsub = cloud
    options = ClientOptions(api_endpoint=pubsub.endpoint)
    publisher = pubsub_v1.PublisherClient(credentials=AnonymousCredentials(), client_options=options, transport="rest")
    subscriber = pubsub_v1.SubscriberClient(credentials=AnonymousCredentials(), client_options=options,
                                            transport="rest")
    topic = publisher.create_topic(name="projects/client-proj/topics/respawn-audit").name
    policy = publisher.get_iam_policy(request={"resource": topic})
    writer = f"serviceAccount:service-{project_number('client-proj')}@gcp-sa-logging.iam.gserviceaccount.com"
    policy.bindings.add(role="roles/pubsub.publisher", members=[writer])
    publisher.set_iam_policy(request={"resource": topic, "policy": policy})
    assert [list(b.members) for b in publisher.get_iam_policy(request={"resource": topic}).bindings] == [[writer]]
    held = publisher.test_iam_permissions(request={"resource": topic, "permissions": ["pubsub.topics.publish"]})
    assert list(held.permissions) == ["pubsub.topics.publish"]
    made = subscriber.create_subscription(request={
        "name": "projects/client-proj/subscriptions/eventarc-us-central1-on-audit", "topic": topic,
        "push_config": {"push_endpoint": "https://127.0.0.1:9/on-audit"}, "ack_deadline_seconds": 540,
        "retry_policy": {"minimum_backoff": {"seconds": 10}, "maximum_backoff": {"seconds": 600}}})
    assert made.push_config.push_endpoint == "https://127.0.0.1:9/on-audit"
    assert made.push_config.attributes["x-goog-version"] == "v1" and made.ack_deadline_seconds == 540
    assert pubsub.publish_as(writer, topic, "e30=") and pubsub.backlog(made.name) == 1
    with pytest.raises(PermissionError):
        pubsub.publish_as("serviceAccount:cloud-logs@system.gserviceaccount.com", topic, "e30=")
    subscriber.delete_subscription(request={"subscription": made.name})
