"""respawn doctor against the local cloud (issue 23's proof): every check passes on a healthy one;
with the bucket missing, the tick not run for 5 minutes, or a zero GPU quota in one of the spec's
regions, it exits non-zero naming the failing check."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from controller.service import lastpass
from localcloud.stack import LocalCloud, Options

SPEC = {"name": "doctor-l4", "zones": ["us-central1-a", "us-east1-b"], "machine_type": "g2-standard-8",
        "provisioning": ["spot"], "command": "python train.py"}


@pytest.fixture(scope="module")
def cloud() -> Iterator[LocalCloud]:
    with LocalCloud(Options(tick_interval=60.0)) as running:  # the ticker's first call is at once
        deadline = time.monotonic() + 60
        while running.ticker.runs < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert running.ticker.runs >= 1
        yield running


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(SPEC))
    return path


def doctor(cloud: LocalCloud, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RESPAWN_", "CLOUDSDK_", "STORAGE_EMULATOR"))}
    return subprocess.run([sys.executable, "-m", "controller.cli", "doctor", *args], capture_output=True, text=True,
                          env={**clean, **cloud.env(), "COLUMNS": "200", **env}, timeout=120, stdin=subprocess.DEVNULL)


def line(out: str, check: str) -> str:
    return next(x for x in out.splitlines() if x[2:].startswith(check))


def test_doctor_passes_every_check_on_a_healthy_local_cloud(cloud, spec):
    done = doctor(cloud, str(spec))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "✗" not in done.stdout and f"all 32 checks passed" in done.stdout
    assert line(done.stdout, "controller last ran").startswith("✓")
    # the audit path the local cloud makes as respawn deploy does: sink, topic, grant, on_audit (the entries
    # only wake passes: the controller reads no logs, issue 35 item 15); no project refused the 120 s notice
    for check in ("audit topic respawn-audit", "audit sink respawn-audit", "audit sink may publish",
                  "function respawn-on-audit", "log-based metrics", "preemption notice"):
        assert line(done.stdout, check).startswith(f"✓ {check}"), done.stdout
    assert "google.cloud.pubsub.topic.v1.messagePublished on projects/" in line(done.stdout, "function respawn-on-audit")
    # who may do what, by the permissions of the roles the local IAM describes (issue 35, item 10)
    for check in ("controller's grants in respawn-local", "scheduler may invoke tick",
                  "triggers may invoke on_object and on_audit", "on_object's trigger receives events", "service agents",
                  "custom role respawnVmRecords", "who may read the bucket"):
        assert line(done.stdout, check).startswith(f"✓ {check}"), done.stdout
    assert "PREEMPTIBLE_NVIDIA_L4_GPUS 64 free of 64" in line(done.stdout, "GPU quota in us-east1")
    assert re.match(r"✓ scheduler job respawn-tick +ENABLED", line(done.stdout, "scheduler job respawn-tick"))


def test_a_zero_gpu_quota_in_one_of_the_spec_s_regions_fails_that_check(cloud, spec):
    cloud.compute.quota_limit("us-east1", "PREEMPTIBLE_NVIDIA_L4_GPUS", 0)
    try:
        done = doctor(cloud, str(spec))
    finally:
        cloud.compute.quota_limit("us-east1", "PREEMPTIBLE_NVIDIA_L4_GPUS", 64)
    assert done.returncode == 1
    assert line(done.stdout, "GPU quota in us-east1").startswith("✗")
    assert "PREEMPTIBLE_NVIDIA_L4_GPUS 0 free of 0" in line(done.stdout, "GPU quota in us-east1")
    assert line(done.stdout, "GPU quota in us-central1").startswith("✓")
    assert "1 of 32 checks failed: GPU quota in us-east1" in done.stderr


def test_a_missing_bucket_fails_naming_the_bucket_check_and_how_to_create_it(cloud):
    done = doctor(cloud, RESPAWN_BUCKET="respawn-no-such-bucket")
    assert done.returncode == 1
    assert line(done.stdout, "bucket ").startswith("✗ bucket") and "does not exist" in line(done.stdout, "bucket ")
    assert "fix: gcloud storage buckets create gs://respawn-no-such-bucket" in done.stdout
    assert line(done.stdout, "project").startswith("✓") and line(done.stdout, "APIs").startswith("✓")


def test_a_tick_not_run_for_five_minutes_fails_naming_the_controller_check(cloud):
    old = lastpass.LastPass(datetime.now(UTC) - timedelta(minutes=5), 0.4, 1, 0, 0)
    cloud.storage.bucket(cloud.options.bucket).blob(lastpass.KEY).upload_from_string(old.as_json())
    done = doctor(cloud)
    assert done.returncode == 1
    assert line(done.stdout, "controller last ran").startswith("✗ controller last ran")
    assert "controller last ran 5 min ago" in done.stdout and "more than 3 minutes" in done.stdout
    assert "fix: gcloud scheduler jobs run respawn-tick --location=us-central1" in done.stdout
    assert "1 of 27 checks failed: controller last ran" in done.stderr


def test_a_sink_whose_filter_was_changed_fails_naming_the_update_that_brings_it_back(cloud):
    import requests

    from controller.cli import deploy
    from controller.core import audit

    project = cloud.options.project
    url = f"{cloud.logging.endpoint}/v2/projects/{project}/sinks/{deploy.AUDIT_SINK}"
    requests.patch(url, params={"updateMask": "filter"}, json={"filter": 'resource.type="gce_instance"'},
                   timeout=10).raise_for_status()
    try:
        done = doctor(cloud)
    finally:
        requests.patch(url, params={"updateMask": "filter"}, json={"filter": audit.sink_filter(project)},
                       timeout=10).raise_for_status()
    assert done.returncode == 1
    assert line(done.stdout, "audit sink respawn-audit").startswith("✗") and "its filter is not respawn's" in done.stdout
    assert f"fix: gcloud logging sinks update respawn-audit pubsub.googleapis.com/projects/{project}/topics/" \
           "respawn-audit" in done.stdout
    assert "audit sink respawn-audit" in done.stderr.partition("checks failed:")[2]  # (another test aged the tick's record)
    assert line(doctor(cloud).stdout, "audit sink respawn-audit").startswith("✓")
