"""The local stand-ins respawn doctor reads (localcloud/apis.py; images in localcloud/compute.py; bucket
IAM in localcloud/gcs.py): routes and bodies as Google's discovery documents have them, answers for
what the local cloud runs, read through the same clients as on Google (controller.adapters.doctor)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import requests

from controller.adapters.doctor import GoogleApis
from controller.cli import deploy
from controller.core import errors
from controller.service.config import Settings
from localcloud.apis import SERVERS, Deployment
from localcloud.compute import ComputeServer
from tests.routes import assert_serves_exactly

PROJECT, REGION, BUCKET = "respawn-local", "us-central1", "respawn-local"
STATE = {"alive": True, "ticker": (True, datetime(2026, 1, 5, 12, 0, tzinfo=UTC), 200)}


@pytest.fixture(scope="module")
def servers() -> Iterator[dict]:
    d = Deployment(PROJECT, REGION, BUCKET,
                   functions=lambda: {"tick": ("http://127.0.0.1:1/", STATE["alive"]),
                                      "on_object": ("http://127.0.0.1:2/", True),
                                      "on_audit": ("http://127.0.0.1:3/", True)},
                   ticker=lambda: STATE["ticker"])
    started = {s.name: s(d).start() for s in SERVERS}
    compute = ComputeServer(run_vms=False).start()
    yield {**started, "compute": compute}
    for s in started.values():
        s.stop()
    compute.stop()


@pytest.fixture
def apis(servers) -> GoogleApis:
    config = Settings(project=PROJECT, bucket=BUCKET, compute_endpoint=servers["compute"].endpoint,
                      **{f"{k}_endpoint": v.endpoint for k, v in servers.items() if k != "compute"})
    return GoogleApis(config, timeout=10)


@pytest.mark.parametrize("name", [s.name for s in SERVERS])
def test_each_stand_in_serves_its_methods_and_501s_every_other_of_its_document(servers, name):
    assert_serves_exactly(servers[name].endpoint, servers[name].DOC, servers[name].SUPPORTED)


def test_a_body_field_the_document_does_not_have_is_refused_400(servers):
    url = f"{servers['resourcemanager'].endpoint}/v3/projects/{PROJECT}:getIamPolicy"
    answer = requests.post(url, json={"options": {"requestedPolicyVersion": 3, "bogus": 1}}, timeout=5)
    assert answer.status_code == 400 and 'Unknown name "bogus"' in answer.json()["error"]["message"]
    assert requests.post(url, json={"options": {"requestedPolicyVersion": 3}}, timeout=5).ok


def test_another_project_is_refused_403_as_google_answers_and_read_as_missing(servers, apis):
    answer = requests.get(f"{servers['resourcemanager'].endpoint}/v3/projects/someone-else", timeout=5)
    assert answer.status_code == 403 and answer.json()["error"]["status"] == "PERMISSION_DENIED"
    with pytest.raises(errors.NotFound):
        apis.project("someone-else")
    assert apis.project(PROJECT)["state"] == "ACTIVE"


def test_the_deployment_read_through_google_s_clients(apis):
    trainer = deploy.account_email(deploy.TRAINER_ACCOUNT_ID, PROJECT)
    controller = deploy.account_email("respawn-controller", PROJECT)
    assert apis.services(PROJECT, ["compute.googleapis.com", "tpu.googleapis.com"]) == {
        "compute.googleapis.com": "ENABLED", "tpu.googleapis.com": "ENABLED"}
    assert apis.account(trainer)["email"] == trainer
    assert {"role": "roles/iam.serviceAccountUser", "members": [f"serviceAccount:{controller}"]} in \
        apis.account_policy(trainer)
    assert {"role": "roles/logging.logWriter", "members": [f"serviceAccount:{trainer}"]} in apis.project_policy(PROJECT)
    on_object = apis.function(PROJECT, REGION, deploy.ON_OBJECT)
    assert on_object["state"] == "ACTIVE" and on_object["eventTrigger"]["eventFilters"] == [
        {"attribute": "bucket", "value": BUCKET}]
    on_audit = apis.function(PROJECT, REGION, deploy.ON_AUDIT)
    assert on_audit["state"] == "ACTIVE" and on_audit["eventTrigger"]["eventType"] == deploy.PUBLISHED
    assert on_audit["eventTrigger"]["pubsubTopic"] == f"projects/{PROJECT}/topics/{deploy.AUDIT_TOPIC}"
    assert on_audit["buildConfig"]["entryPoint"] == "on_audit"
    assert not [b for b in apis.project_policy(PROJECT) if b["role"] == "roles/logging.viewer"]
    job = apis.scheduler_job(PROJECT, REGION, deploy.TICK)
    assert job["state"] == "ENABLED" and job["lastAttemptTime"] == "2026-01-05T12:00:00Z" and job["status"] == {}
    with pytest.raises(errors.NotFound):
        apis.function(PROJECT, "europe-west4", deploy.TICK)
    with pytest.raises(errors.NotFound):
        apis.account(f"nobody@{PROJECT}.iam.gserviceaccount.com")


def test_what_runs_shows_a_dead_function_a_stopped_ticker_and_a_failed_attempt(apis):
    STATE["alive"], STATE["ticker"] = False, (False, datetime(2026, 1, 5, 12, 0, tzinfo=UTC), 500)
    try:
        tick = apis.function(PROJECT, REGION, deploy.TICK)
        job = apis.scheduler_job(PROJECT, REGION, deploy.TICK)
    finally:
        STATE["alive"], STATE["ticker"] = True, (True, datetime(2026, 1, 5, 12, 0, tzinfo=UTC), 200)
    assert tick["state"] == "FAILED" and "exited" in tick["stateMessages"][0]["message"]
    assert job["state"] == "PAUSED" and job["status"]["code"] == 13


def test_a_service_disabled_over_the_api_reads_disabled(servers, apis):
    url = f"{servers['serviceusage'].endpoint}/v1/projects/{PROJECT}/services/eventarc.googleapis.com"
    assert requests.post(f"{url}:disable", json={}, timeout=5).json()["done"] is True
    try:
        assert apis.services(PROJECT, ["eventarc.googleapis.com"]) == {"eventarc.googleapis.com": "DISABLED"}
    finally:
        requests.post(f"{url}:enable", json={}, timeout=5)
    assert apis.services(PROJECT, ["eventarc.googleapis.com"]) == {"eventarc.googleapis.com": "ENABLED"}


def test_compute_answers_images_by_name_and_family_but_those_the_unknown_fault_names(servers, apis):
    assert apis.image("debian-cloud", family="debian-12")["status"] == "READY"
    assert apis.image("my-proj", name="img-1")["name"] == "img-1"
    servers["compute"].unknown("image", "no-such-family")
    with pytest.raises(errors.NotFound):
        apis.image("debian-cloud", family="no-such-family")


def test_the_audit_sink_its_topic_and_the_topic_s_policy_read_through_google_s_clients():
    """What respawn doctor reads of the audit path, from the local Logging and Pub/Sub servers (made
    there as respawn deploy makes them on Google, over their REST APIs), through GoogleApis."""
    from controller.core import audit
    from localcloud.logging import LoggingServer
    from localcloud.pubsub import PubsubServer

    pubsub = PubsubServer().start()
    logging_ = LoggingServer(pubsub=pubsub).start()
    try:
        topic = f"projects/{PROJECT}/topics/{deploy.AUDIT_TOPIC}"
        apis = GoogleApis(Settings(project=PROJECT, bucket=BUCKET, compute_endpoint="http://127.0.0.1:9",
                                   pubsub_endpoint=pubsub.endpoint, logging_endpoint=logging_.endpoint), timeout=10)
        with pytest.raises(errors.NotFound):
            apis.topic(PROJECT, deploy.AUDIT_TOPIC)
        with pytest.raises(errors.NotFound):
            apis.sink(PROJECT, deploy.AUDIT_SINK)
        requests.put(f"{pubsub.endpoint}/v1/{topic}", json={}, timeout=5).raise_for_status()
        made = requests.post(f"{logging_.endpoint}/v2/projects/{PROJECT}/sinks", params={"uniqueWriterIdentity": "true"},
                             json={"name": deploy.AUDIT_SINK, "destination": deploy.audit_destination(PROJECT),
                                   "filter": audit.sink_filter(PROJECT)}, timeout=5)
        made.raise_for_status()
        writer = made.json()["writerIdentity"]
        requests.post(f"{pubsub.endpoint}/v1/{topic}:setIamPolicy", json={"policy": {"bindings": [
            {"role": "roles/pubsub.publisher", "members": [writer]}]}}, timeout=5).raise_for_status()

        assert apis.topic(PROJECT, deploy.AUDIT_TOPIC)["name"] == topic
        sink = apis.sink(PROJECT, deploy.AUDIT_SINK)
        assert sink["destination"] == deploy.audit_destination(PROJECT) and sink["filter"] == audit.sink_filter(PROJECT)
        assert sink["writerIdentity"] == writer and not sink.get("disabled")
        assert [b for b in apis.topic_policy(PROJECT, deploy.AUDIT_TOPIC) if writer in b["members"]] == [
            {"role": "roles/pubsub.publisher", "members": [writer]}]
    finally:
        logging_.stop()
        pubsub.stop()


def test_the_log_based_metrics_read_through_google_s_client():
    """respawn doctor's read of the metrics deploy makes (projects.metrics.list), from the
    local Logging, where they are made as the Logging API makes them (update creates an absent one)."""
    import yaml

    from localcloud.logging import LoggingServer

    with LoggingServer() as logging_:
        apis = GoogleApis(Settings(project=PROJECT, bucket=BUCKET, compute_endpoint="http://127.0.0.1:9",
                                   logging_endpoint=logging_.endpoint), timeout=10)
        assert apis.log_metrics(PROJECT) == {}
        for path in deploy.metric_files():
            requests.put(f"{logging_.endpoint}/v2/projects/{PROJECT}/metrics/{path.stem}",
                         json=yaml.safe_load(path.read_text()), timeout=5).raise_for_status()
        found = apis.log_metrics(PROJECT)
        assert set(found) == {p.stem for p in deploy.metric_files()}
        jobs = found["respawn_jobs"]
        assert jobs["valueExtractor"] == "EXTRACT(jsonPayload.jobs)"
        assert jobs["metricDescriptor"]["type"] == "logging.googleapis.com/user/respawn_jobs"


def test_roles_service_policies_and_tpu_quotas_read_through_google_s_clients(servers, apis):
    """What respawn doctor's IAM checks read (issue 35, item 10): a role's permissions (IAM roles.get,
    projects.roles.get), a function's Cloud Run service policy (run v2 services.getIamPolicy, at the
    Functions stand-in) and Cloud TPU's quota limits (Service Usage v1beta1 consumerQuotaMetrics.list)."""
    from controller.cli import doctor, grants

    controller = deploy.account_email("respawn-controller", PROJECT)
    scheduler = deploy.account_email("respawn-scheduler", PROJECT)
    assert set(grants.COMPUTE) <= set(apis.role("roles/compute.instanceAdmin.v1")["includedPermissions"])
    custom = apis.role(f"projects/{PROJECT}/roles/{deploy.TRAINER_ROLE_ID}")
    assert sorted(custom["includedPermissions"]) == sorted(deploy.TRAINER_PERMISSIONS)
    with pytest.raises(errors.NotFound):
        apis.role("roles/no.such")
    tick = apis.function(PROJECT, REGION, deploy.TICK)["serviceConfig"]["service"]
    assert apis.service_policy(tick) == [{"role": "roles/run.invoker", "members": [f"serviceAccount:{scheduler}"]}]
    on_audit = apis.function(PROJECT, REGION, deploy.ON_AUDIT)["serviceConfig"]["service"]
    assert apis.service_policy(on_audit) == [{"role": "roles/run.invoker", "members": [f"serviceAccount:{controller}"]}]
    assert doctor.tpu_zone_limits(apis.tpu_quotas(PROJECT), "us-central2-b") == [("TPU chips", 64.0)]
    servers["serviceusage"].tpu_quota("us-central2-b", 0)
    try:
        assert doctor.tpu_zone_limits(apis.tpu_quotas(PROJECT), "us-central2-b") == [("TPU chips", 0.0)]
        assert doctor.tpu_zone_limits(apis.tpu_quotas(PROJECT), "us-central2-a") == [("TPU chips", 64.0)]
    finally:
        servers["serviceusage"].tpu_limits.clear()
