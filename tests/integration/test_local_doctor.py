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

from controller.cli import buckets
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
                          env={**clean, **cloud.env(), "COLUMNS": "1000", **env}, timeout=120, stdin=subprocess.DEVNULL)


def line(out: str, check: str) -> str:
    return next(x for x in out.splitlines() if x[2:].startswith(check))


def test_doctor_passes_every_check_on_a_healthy_local_cloud(cloud, spec):
    done = doctor(cloud, str(spec))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "✗" not in done.stdout and f"all 33 checks passed" in done.stdout
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
                  "custom role respawnVmRecords", "who may read the bucket", "checkpoints bucket"):
        assert line(done.stdout, check).startswith(f"✓ {check}"), done.stdout
    assert "PREEMPTIBLE_NVIDIA_L4_GPUS 64 free of 64" in line(done.stdout, "GPU quota in us-east1")
    assert re.match(r"✓ scheduler job respawn-tick +ENABLED", line(done.stdout, "scheduler job respawn-tick"))


def test_doctor_passes_the_quickstart_and_fails_a_checkpoint_bucket_or_code_tarball_submit_would_refuse(cloud, tmp_path):
    """Issue 39: doctor passed a spec whose checkpoint bucket and code tarball were not there, which submit
    then refused; the shipped quickstart (its bucket the local cloud's checkpoints bucket, its code a file beside
    it) passes."""
    import yaml

    quickstart = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
    done = doctor(cloud, str(quickstart))
    assert done.returncode == 0, done.stdout + done.stderr
    assert line(done.stdout, "checkpoint.uri").startswith("✓ checkpoint.uri") and \
        f"bucket gs://{buckets.checkpoints_bucket(cloud.options.bucket)} is there" in line(done.stdout, "checkpoint.uri")
    assert line(done.stdout, "code").startswith("✓ code") and "local: respawn submit packs it" in line(done.stdout, "code")
    doc = yaml.safe_load(quickstart.read_text())
    broken = tmp_path / "quickstart.yaml"
    broken.write_text(yaml.safe_dump({**doc, "checkpoint": {"uri": "gs://respawn-no-such-ckpts/quickstart"},
                                      "code": f"gs://{cloud.options.bucket}/code/no-such.tar.gz"}))
    refused = doctor(cloud, str(broken))
    assert refused.returncode == 1
    assert line(refused.stdout, "checkpoint.uri").startswith("✗") and \
        "bucket gs://respawn-no-such-ckpts does not exist" in refused.stdout
    assert "fix: gcloud storage buckets create gs://respawn-no-such-ckpts" in refused.stdout
    assert line(refused.stdout, "code").startswith("✗") and \
        f"gs://{cloud.options.bucket}/code/no-such.tar.gz does not exist" in refused.stdout
    assert refused.stderr.partition("checks failed: ")[2].strip() == "checkpoint.uri, code"


def test_doctor_fails_the_quickstart_with_its_checkpoint_in_the_control_bucket_naming_the_checkpoints_bucket(
        cloud, tmp_path):
    """The examples had gs://respawn-local/checkpoints/<job>: the local cloud's trainer holds deploy's grants,
    its VM records alone in the control bucket, so doctor fails it as on Google, with the line to write."""
    import yaml

    examples = Path(__file__).resolve().parents[2] / "examples"
    doc = yaml.safe_load((examples / "quickstart.yaml").read_text())
    (tmp_path / "trainer.py").write_bytes((examples / "trainer.py").read_bytes())  # its code: beside it
    old = tmp_path / "quickstart.yaml"
    old.write_text(yaml.safe_dump({**doc, "checkpoint": {"uri": f"gs://{cloud.options.bucket}/checkpoints/quickstart"}}))
    done = doctor(cloud, str(old))
    assert done.returncode == 1 and line(done.stdout, "checkpoint.uri").startswith("✗"), done.stdout
    assert done.stderr.partition("checks failed: ")[2].strip() == "checkpoint.uri", done.stderr
    assert f"is in the control bucket gs://{cloud.options.bucket}, where the trainers' account may write only its VM " \
           "records" in done.stdout
    ours = buckets.default_checkpoint(cloud.options.bucket, "quickstart")
    assert f"fix: checkpoint: {{uri: {ours}}}  # the checkpoints bucket respawn deploy makes" in done.stdout, done.stdout


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
    assert "1 of 33 checks failed: GPU quota in us-east1" in done.stderr


def test_a_missing_bucket_fails_naming_the_bucket_check_and_the_deployed_controllers_bucket(cloud):
    """Issue 39: a mistyped RESPAWN_BUCKET is fixed by naming the deployed controller's bucket, never by
    creating the misspelled one."""
    done = doctor(cloud, RESPAWN_BUCKET="respawn-no-such-bucket")
    assert done.returncode == 1
    assert line(done.stdout, "bucket ").startswith("✗ bucket") and "does not exist" in line(done.stdout, "bucket ")
    assert "fix: export RESPAWN_BUCKET=respawn-local" in done.stdout
    assert "buckets create gs://respawn-no-such-bucket" not in done.stdout
    assert line(done.stdout, "project").startswith("✓") and line(done.stdout, "APIs").startswith("✓")


def test_a_tick_not_run_for_five_minutes_fails_naming_the_controller_check(cloud):
    old = lastpass.LastPass(datetime.now(UTC) - timedelta(minutes=5), 0.4, 1, 0, 0)
    cloud.storage.bucket(cloud.options.bucket).blob(lastpass.KEY).upload_from_string(old.as_json())
    done = doctor(cloud)
    assert done.returncode == 1
    assert line(done.stdout, "controller last ran").startswith("✗ controller last ran")
    assert "controller last ran 5 min ago" in done.stdout and "more than 3 minutes" in done.stdout
    assert "fix: gcloud scheduler jobs run respawn-tick --location=us-central1" in done.stdout
    assert "1 of 28 checks failed: controller last ran" in done.stderr


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


# -- a spec's container image on the local Artifact Registry -------------------------------------------
def _image_spec(tmp_path: Path, image: str) -> Path:
    path = tmp_path / "image-spec.json"
    path.write_text(json.dumps({**SPEC, "name": "doctor-image", "image": image}))
    return path


@pytest.fixture(scope="module")
def pushed(cloud, tmp_path_factory) -> str:
    """An image in the local cloud's Artifact Registry, made from a small root filesystem tar."""
    import io
    import tarfile

    tar = tmp_path_factory.mktemp("rootfs") / "rootfs.tar"
    with tarfile.open(tar, "w") as t:
        info = tarfile.TarInfo("etc/hello")
        info.size = 3
        t.addfile(info, io.BytesIO(b"hi\n"))
    image = f"us-central1-docker.pkg.dev/{cloud.options.project}/images/trainer"
    cloud.registry.push_rootfs(f"{image}:v1", tar)
    return image


def test_doctor_passes_an_image_the_trainer_may_pull_and_fails_one_that_does_not_exist(cloud, pushed, tmp_path):
    done = doctor(cloud, str(_image_spec(tmp_path, f"{pushed}:v1")))
    assert "container image" not in done.stderr, done.stdout  # (another test may have aged the tick's record)
    assert line(done.stdout, "container image ").startswith(f"✓ container image ") and f"{pushed}:v1 exists" in done.stdout
    trainer = f"respawn-trainer@{cloud.options.project}.iam.gserviceaccount.com"
    assert f"{trainer} may pull it (roles/artifactregistry.reader on project {cloud.options.project})" in \
        line(done.stdout, "container image pull")
    missing = doctor(cloud, str(_image_spec(tmp_path, f"{pushed}:v2")))
    assert missing.returncode == 1
    assert line(missing.stdout, "container image ").startswith("✗") and f"{pushed} has no tag v2" in missing.stdout
    assert f"fix: gcloud artifacts docker images list {pushed} --include-tags" in missing.stdout
    failed = missing.stderr.partition("checks failed: ")[2].strip().split(", ")
    assert "container image" in failed and "container image pull" not in failed


def test_doctor_fails_an_image_the_trainer_may_not_pull_and_its_fix_run_with_gcloud_makes_it_pass(cloud, pushed, tmp_path):
    import shutil

    import requests

    gcloud = shutil.which("gcloud")  # the fix doctor prints is run with it where it is installed
    spec = str(_image_spec(tmp_path, f"{pushed}:v1"))
    url = f"{cloud.apis['resourcemanager'].endpoint}/v3/projects/{cloud.options.project}"
    policy = requests.post(f"{url}:getIamPolicy", json={}, timeout=10).json()
    without = [b for b in policy["bindings"] if b["role"] != "roles/artifactregistry.reader"]
    requests.post(f"{url}:setIamPolicy", json={"policy": {**policy, "bindings": without}}, timeout=10).raise_for_status()
    try:
        denied = doctor(cloud, spec)
        assert denied.returncode == 1 and line(denied.stdout, "container image pull").startswith("✗")
        assert "lacks artifactregistry.repositories.downloadArtifacts on projects/" in denied.stdout
        fix = next(x for x in denied.stdout.splitlines() if "fix: gcloud artifacts repositories add-iam-policy-binding" in x)
        argv = fix.split("fix: ", 1)[1].split()
        if gcloud:
            env = {**os.environ, **cloud.env(), "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
                   "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}
            ran = subprocess.run([gcloud, *argv[1:]], env=env, capture_output=True, text=True, timeout=120)
            assert ran.returncode == 0, ran.stderr
        else:  # no Cloud SDK here (CI's machine): what the command does, through the same REST API
            flags = dict(flag.split("=", 1) for flag in argv[5:])
            assert argv[1:5] == ["artifacts", "repositories", "add-iam-policy-binding", "images"], argv
            repo = f"{cloud.apis['artifactregistry'].endpoint}/v1/projects/{flags.get('--project', cloud.options.project)}" \
                   f"/locations/{flags['--location']}/repositories/images"
            current = requests.get(f"{repo}:getIamPolicy", timeout=10).json()
            bindings = [*current.get("bindings", []), {"role": flags["--role"], "members": [flags["--member"]]}]
            requests.post(f"{repo}:setIamPolicy", json={"policy": {**current, "bindings": bindings}},
                          timeout=10).raise_for_status()
        granted = doctor(cloud, spec)
        assert line(granted.stdout, "container image pull").startswith("✓"), granted.stdout
        assert "roles/artifactregistry.reader on projects/respawn-local/locations/us-central1/repositories/images" in \
            line(granted.stdout, "container image pull")
    finally:
        now = requests.post(f"{url}:getIamPolicy", json={}, timeout=10).json()
        requests.post(f"{url}:setIamPolicy", json={"policy": {**now, "bindings": policy["bindings"]}},
                      timeout=10).raise_for_status()
        cloud.registry.set_policy(cloud.options.project, "us-central1", "images", [])
