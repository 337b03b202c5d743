"""Issue 25 end to end on the local cloud: a VM lost without its shutdown script (a hard preemption,
a guest crash) is replaced within seconds through Compute's System Event audit entry, the Logging
sink, Pub/Sub's push and ``on_audit``, with no tick to help (one an hour); without the audit path it
is not, within that time.

What ``LocalCloud`` sets up for it is checked too: the topic, the sink on ``sink_filter``, the writer
identity's publisher grant, Eventarc's push subscription to ``on_audit``.
"""

from __future__ import annotations

import time
from datetime import datetime
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import yaml

from controller.core import audit, names
from controller.core.state import JobStatus, Phase
from localcloud.stack import LocalCloud, Options
from tests.wait import until

RECOVERY = 15.0  # seconds from the loss to the replacement's insert, through the audit path
QUIET = 8.0  # seconds in which, without the audit path, nothing may replace them (it took about 3.5 s)
OPTIONS = {"tick_interval": 3600.0, "boot_delay": 0.1, "shutdown_budget": 5.0}


@pytest.fixture(scope="module")
def cloud() -> Iterator[LocalCloud]:
    with LocalCloud(Options(**OPTIONS)) as c:
        yield c


def spec(job: str) -> dict[str, Any]:
    return {"zones": ["us-central1-a"], "machine_type": "g2-standard-8", "command": "sleep 600",
            "heartbeat_interval": "5s", "checkpoint": {"uri": f"gs://respawn-local/ckpt/{job}"},
            "policy": {"startup_grace": "5m", "idle_timeout": "5m", "backoff": {"initial": "1s", "max": "2s"}}}


def submit(cloud: LocalCloud, job: str) -> None:
    cloud.storage.bucket(cloud.options.bucket).blob(names.spec_key(job)).upload_from_string(yaml.safe_dump(spec(job)))


def status(cloud: LocalCloud, job: str) -> JobStatus | None:
    blob = cloud.storage.bucket(cloud.options.bucket).get_blob(names.status_key(job))
    return JobStatus.from_json(blob.download_as_bytes()) if blob else None


def running(cloud: LocalCloud, name: str) -> bool:
    return any(i["name"] == name and i["status"] == "RUNNING" for i in cloud.compute.instances())


def started(cloud: LocalCloud, *jobs: str) -> None:
    """Each job submitted (on_object creates its VM), its first VM RUNNING, then one Scheduler run
    (``gcloud scheduler jobs run``) that records them RUNNING: the last tick before the losses.

    It returns with no pass in flight: the Scheduler's own run at its start is over, and every
    object event of the set-up has been delivered, retries and all (a spec's event redelivered
    after the losses is a pass that rightly replaces the VM: a CI run under load met one)."""
    for job in jobs:
        submit(cloud, job)
    for job in jobs:
        until(f"{job}-1 RUNNING", lambda job=job: running(cloud, f"{job}-1"), timeout=60)
    assert cloud.tick()["status"] == 200
    for job in jobs:
        until(f"{job} RUNNING", lambda job=job: (s := status(cloud, job)) is not None and s.phase == Phase.RUNNING)
    if cloud.ticker:
        until("the Scheduler's first run over", lambda: cloud.ticker.runs >= 1, timeout=60)
    assert cloud.watcher is not None
    sweeps = cloud.watcher.sweeps
    until("a whole sweep of events since", lambda: cloud.watcher.sweeps >= sweeps + 2, timeout=60)


def inserted(cloud: LocalCloud, name: str) -> bool:
    return name in cloud.compute.names()


# First in the module, before the module's cloud exists: two local clouds in one process at once
# build their Flask apps while the other's threads run, and CPython 3.11's ast module is not safe
# for two threads parsing at once (werkzeug compiles each URL rule with ast.parse): a CI run met
# "SystemError: AST constructor recursion depth mismatch" there.
def test_without_the_audit_path_nothing_recovers_them_within_that_time():
    with LocalCloud(Options(**OPTIONS, audit=False)) as cloud:
        assert cloud.logging.sinks(cloud.options.project) == [] and "on_audit" not in cloud._functions
        started(cloud, "hard", "crashed")
        cloud.compute.preempt("hard-1", graceful=False)
        cloud.compute.crash("crashed-1")
        until("both TERMINATED", lambda: all(i["status"] == "TERMINATED" for i in cloud.compute.instances()))
        # Compute still wrote its entries, but no sink sends them anywhere.
        assert len(cloud.logging.entries(audit.SYSTEM_EVENT_LOG_ID)) == 2
        time.sleep(QUIET)  # more than twice what the audit path takes (the tests below): nothing else is meant to act in it
        assert not inserted(cloud, "hard-2") and not inserted(cloud, "crashed-2")


def test_the_local_cloud_deploys_the_audit_path_as_respawn_deploy_would(cloud):
    project = cloud.options.project
    [sink] = cloud.logging.sinks(project)
    assert sink["filter"] == audit.sink_filter(project) and not sink.get("disabled")
    assert sink["destination"] == f"pubsub.googleapis.com/{cloud.audit_topic}"
    policy = requests.get(f"{cloud.pubsub.endpoint}/v1/{cloud.audit_topic}:getIamPolicy", timeout=5).json()
    assert {"role": "roles/pubsub.publisher", "members": [sink["writerIdentity"]]} in policy["bindings"]
    subscription = requests.get(f"{cloud.pubsub.endpoint}/v1/{cloud.audit_subscription}", timeout=5).json()
    assert subscription["topic"] == cloud.audit_topic
    assert subscription["pushConfig"]["pushEndpoint"].startswith(cloud.function_url("on_audit"))
    assert "__GCP_CloudEventsMode=CUSTOM_PUBSUB_" in subscription["pushConfig"]["pushEndpoint"]


def test_a_hard_preemption_is_recovered_within_seconds_without_a_tick(cloud):
    started(cloud, "hard")
    ticks = cloud.ticker.runs if cloud.ticker else 0  # the Scheduler's own runs (one, at its start)
    cloud.compute.preempt("hard-1", graceful=False)  # no notice, no shutdown script, no marker
    until("hard-2 inserted", lambda: inserted(cloud, "hard-2"), timeout=RECOVERY)
    assert (cloud.ticker.runs if cloud.ticker else 0) == ticks  # no tick helped
    hard = until("hard's status", lambda: (s := status(cloud, "hard")) and s.attempt == 2 and s)
    assert any(e.event == "preempted" for e in hard.history) and (hard.preemptions, hard.failures) == (1, 0)
    # It went the whole way: Compute's entry, the sink, a push that on_audit acknowledged.
    [entry] = [e for e in cloud.logging.entries(audit.SYSTEM_EVENT_LOG_ID)
               if e["protoPayload"]["resourceName"].endswith("/instances/hard-1")]
    assert entry["protoPayload"]["methodName"] == "compute.instances.preempted"
    pushed = until("on_audit's answer", lambda: [p for p in cloud.pubsub.pushes
                                                 if p["subscription"] == cloud.audit_subscription])
    assert all(p["status"] in (200, 204) for p in pushed)
    # The loss is timed by Compute's record of it (its zone operation, the entry's moment), not
    # by the pass that saw it later: the report's recovery counts from there.
    [lost] = [e for e in hard.history if e.event == "preempted"]
    at = datetime.fromisoformat(entry["timestamp"])
    assert lost.since is None and lost.recorded is not None and abs((lost.recorded - at).total_seconds()) < 0.5
    assert lost.recorded < lost.at and hard.ledger.losses[0].lost_at == lost.recorded


def test_a_crash_is_recovered_within_seconds_without_a_tick(cloud):
    started(cloud, "crashed")
    ticks = cloud.ticker.runs if cloud.ticker else 0
    cloud.compute.crash("crashed-1")  # compute.instances.guestTerminate, no shutdown script
    until("crashed-2 inserted", lambda: inserted(cloud, "crashed-2"), timeout=RECOVERY)
    assert (cloud.ticker.runs if cloud.ticker else 0) == ticks
    crashed = until("crashed's status", lambda: (s := status(cloud, "crashed")) and s.attempt == 2 and s)
    assert crashed.failures == 1 and crashed.preemptions == 0
    assert any(e.event == "failed" and "crashed" in e.detail for e in crashed.history)
