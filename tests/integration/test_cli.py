"""Every respawn command, against the local GCS and Compute servers through the real clients."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from controller.service import bootstrap
from controller.core import names
from controller.cli.main import app, logs_filter
from controller.cli.joblogs import LOGS, SERIAL
from localcloud.compute import ComputeServer
from localcloud.gcs import LocalGcs, client
from tests.harness import spec_doc

BUCKET = "cli-bucket"
PROJECT = "cli-proj"
runner = CliRunner()


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[LocalGcs, ComputeServer]]:
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    with LocalGcs(buckets=(BUCKET,)) as gcs, ComputeServer(vm_env={**env}, boot_delay=0.05, shutdown_budget=0.5) as srv:
        srv.vm_env["STORAGE_EMULATOR_HOST"] = gcs.url
        yield gcs, srv


@pytest.fixture
def cli(servers, monkeypatch) -> Any:
    gcs, srv = servers
    for key, value in {"STORAGE_EMULATOR_HOST": gcs.url, "RESPAWN_BUCKET": BUCKET, "RESPAWN_PROJECT": PROJECT,
                       "RESPAWN_COMPUTE_ENDPOINT": srv.endpoint, "COLUMNS": "250",
                       "RESPAWN_TRAINER_SERVICE_ACCOUNT": f"respawn-trainer@{PROJECT}.iam.gserviceaccount.com"}.items():
        monkeypatch.setenv(key, value)
    bootstrap.override(None)

    def invoke(*args: str) -> Any:
        return runner.invoke(app, list(args))

    return invoke


@pytest.fixture
def deploying(cli, monkeypatch) -> Any:
    """`respawn deploy` to a project of Google's: from a shell that does not point at the local servers
    (one that does is refused: controller.cli.localshell)."""
    for key in ("STORAGE_EMULATOR_HOST", "RESPAWN_COMPUTE_ENDPOINT"):
        monkeypatch.delenv(key)
    return cli


def spec_file(tmp_path: Path, job: str, **overrides: Any) -> Path:
    path = tmp_path / f"{job}.yaml"
    doc = spec_doc(command="sleep 600", **overrides)
    doc["checkpoint"] = {"uri": f"gs://{BUCKET}/ckpt/{job}"}
    path.write_text(yaml.safe_dump(doc))
    return path


def test_submit_uploads_the_spec_and_refuses_to_overwrite_a_running_job(cli, tmp_path, servers):
    path = spec_file(tmp_path, "sub")
    result = cli("submit", str(path))
    assert result.exit_code == 0, result.output
    assert "submitted sub" in result.output
    assert client(servers[0].url).bucket(BUCKET).get_blob(names.spec_key("sub")) is not None
    again = cli("submit", str(path))
    assert again.exit_code == 2 and "--replace" in again.output
    assert cli("submit", str(path), "--replace").exit_code == 0


def test_submit_rejects_an_invalid_spec_naming_the_field(cli, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec_doc(policy={"max_restart": 2})))
    result = cli("submit", str(path))
    assert result.exit_code == 2 and "policy.max_restart" in result.output


def test_reconcile_then_status_shows_the_job(cli, tmp_path):
    assert cli("submit", str(spec_file(tmp_path, "stat"))).exit_code == 0
    dry = cli("reconcile", "stat", "--dry-run")
    assert dry.exit_code == 0 and "would WriteStatus" in dry.output
    result = cli("reconcile", "stat")
    assert result.exit_code == 0 and "create stat-1" in result.output
    cli("reconcile", "stat")  # sees it running, records its id
    table = cli("status")
    assert table.exit_code == 0 and "stat" in table.output and "stat-1" in table.output
    rows = json.loads(cli("status", "stat", "--json").output)
    assert [r["job"] for r in rows] == ["stat"]
    row = rows[0]
    assert row["phase"] in ("PROVISIONING", "RUNNING") and row["attempt"] == 1 and row["zone"] == "us-central1-a"
    assert row["instance"] == "stat-1" and row["instance_id"] and row["instance_id"].isdigit()
    assert row["checkpoint_step"] is None
    bucket = client(os.environ["STORAGE_EMULATOR_HOST"]).bucket(BUCKET)
    for step in (40, 80):
        bucket.blob(f"ckpt/stat/{step}/commit_success.txt").upload_from_string(b"")
    bucket.blob("ckpt/stat/120/state").upload_from_string(b"partial")
    assert json.loads(cli("status", "stat", "--json").output)[0]["checkpoint_step"] == 80
    watched = cli("status", "--watch", "--interval", "0.1", "--refreshes", "2")
    assert watched.exit_code == 0 and "stat" in watched.output


def test_cancel(cli, tmp_path, servers):
    cli("submit", str(spec_file(tmp_path, "can")))
    result = cli("cancel", "can")
    assert result.exit_code == 0 and "cancel requested" in result.output
    assert client(servers[0].url).bucket(BUCKET).get_blob(names.cancel_key("can")) is not None
    missing = cli("cancel", "nosuchjob")
    assert missing.exit_code == 2 and "no job named" in missing.output


def test_logs_reads_cloud_logging_by_instance_id(cli, tmp_path, monkeypatch):
    cli("submit", str(spec_file(tmp_path, "lg")))
    cli("reconcile", "lg")
    cli("reconcile", "lg")
    row = json.loads(cli("status", "lg", "--json").output)[0]
    seen: dict[str, Any] = {}

    class FakeLogging:
        def __init__(self, project: str) -> None:
            seen["project"] = project

        def list_entries(self, filter_: str, order_by: str, max_results: int, **_: Any) -> list[Any]:
            seen.update(filter=filter_, limit=max_results)
            from datetime import UTC, datetime

            return [SimpleNamespace(timestamp=datetime(2026, 1, 1, tzinfo=UTC), payload="step 10 loss 0.5",
                                    resource=SimpleNamespace(labels={"instance_id": row["instance_id"]}),
                                    log_name=f"projects/{PROJECT}/logs/{SERIAL}", insert_id="1")]

    import google.cloud.logging as cloud_logging

    monkeypatch.setattr(cloud_logging, "Client", FakeLogging)
    result = cli("logs", "lg", "--limit", "5")
    assert result.exit_code == 0 and "lg-1 step 10 loss 0.5" in result.output
    assert seen["filter"].startswith(logs_filter([row["instance_id"]], [PROJECT], LOGS) + ' AND timestamp>="')
    assert seen["limit"] == 1000  # one read: the run's newest page, both logs, every attempt (all there is here)
    assert f'resource.labels.instance_id=("{row["instance_id"]}")' in seen["filter"]


def test_logs_serial_reads_the_console_through_the_compute_api(cli, tmp_path):
    path = spec_file(tmp_path, "ser")
    cli("submit", str(path))
    cli("reconcile", "ser")
    result = cli("logs", "ser", "--serial")
    assert result.exit_code == 0 and "== ser-1" in result.output


def _dict_flag(value: str) -> dict[str, str]:
    """A gcloud dict-flag value read back by the rule of `gcloud topic escaping`."""
    delim = ","
    if value.startswith("^") and "^" in value[1:]:
        delim, value = value[1:].split("^", 1)
    return dict(item.split("=", 1) for item in value.split(delim))


def test_deploy_dry_run_prints_every_command_with_the_right_flags(deploying, monkeypatch):
    import shlex

    from controller.cli import deploy

    monkeypatch.setenv("RESPAWN_ALLOWED_ZONES", "us-central1-a,us-central1-b")
    monkeypatch.setenv("RESPAWN_ALLOWED_MACHINE_TYPES", "g2-standard-8,a2-highgpu-1g")
    monkeypatch.setenv("RESPAWN_NOTIFY_TOPIC", "projects/prod-proj/topics/respawn")
    monkeypatch.setenv("RESPAWN_NOTIFY_WEBHOOK", "https://hooks.slack.com/services/T0/B0/x,y")
    monkeypatch.delenv("RESPAWN_TRAINER_SERVICE_ACCOUNT", raising=False)
    result = deploying("deploy", "--project", "prod-proj", "--region", "us-central1", "--bucket", "prod-bucket",
                       "--dry-run")
    assert result.exit_code == 0, result.output
    text = result.output
    lines = text.splitlines()
    trainer = "respawn-trainer@prod-proj.iam.gserviceaccount.com"
    assert "gcloud iam service-accounts create respawn-trainer --project=prod-proj" in text
    assert "gcloud storage buckets update gs://prod-bucket --uniform-bucket-level-access" in text
    grant = shlex.split(next(l for l in lines if f"--member=serviceAccount:{trainer}" in l and "storage buckets" in l))
    condition = _dict_flag(next(a for a in grant if a.startswith("--condition=")).split("=", 1)[1])
    assert condition["expression"].startswith('resource.name.startsWith("projects/_/buckets/prod-bucket/objects/')
    assert "--role=projects/prod-proj/roles/respawnVmRecords" in grant
    tick = next(l for l in lines if l.startswith("gcloud functions deploy respawn-tick"))
    for flag in ("--gen2", "--trigger-http", "--no-allow-unauthenticated", "--entry-point=tick", "--region=us-central1",
                 "--project=prod-proj", "--service-account=respawn-controller@prod-proj.iam.gserviceaccount.com"):
        assert flag in tick, flag
    env = _dict_flag(next(a for a in shlex.split(tick) if a.startswith("--set-env-vars=")).split("=", 1)[1])
    assert env["RESPAWN_BUCKET"] == "prod-bucket" and env["RESPAWN_ALLOWED_ZONES"] == "us-central1-a,us-central1-b"
    assert env["RESPAWN_ALLOWED_MACHINE_TYPES"] == "g2-standard-8,a2-highgpu-1g"
    assert env["RESPAWN_NOTIFY_TOPIC"] == "projects/prod-proj/topics/respawn"
    assert "RESPAWN_NOTIFY_WEBHOOK" not in env  # a secret: in Secret Manager, never a plain variable
    assert "--set-secrets=^|^RESPAWN_NOTIFY_WEBHOOK=respawn-notify-webhook:<version of respawn-notify-webhook>" in tick
    assert "T0/B0" not in text
    assert env["RESPAWN_ALLOWED_WEBHOOK_HOSTS"] == "hooks.slack.com"
    assert env["RESPAWN_TRAINER_SERVICE_ACCOUNT"] == trainer == env["RESPAWN_ALLOWED_SERVICE_ACCOUNTS"]
    assert "--allow-unauthenticated " not in tick.replace("--no-allow-unauthenticated", "")
    event = next(l for l in lines if l.startswith("gcloud functions deploy respawn-on-object"))
    for flag in ("--gen2", "--entry-point=on_object", "--retry",
                 "--trigger-event-filters=type=google.cloud.storage.object.v1.finalized",
                 "--trigger-event-filters=bucket=prod-bucket"):
        assert flag in event, flag
    assert "add-invoker-policy-binding respawn-tick" in text
    request = json.loads(text[text.index("{"): text.rindex("}") + 1])
    job = request["job"]
    assert request["parent"] == "projects/prod-proj/locations/us-central1"
    assert job["schedule"] == "* * * * *" and job["http_target"]["http_method"] == "POST"
    assert job["http_target"]["oidc_token"]["service_account_email"] == "respawn-scheduler@prod-proj.iam.gserviceaccount.com"
    assert 'startsWith("projects/_/buckets/prod-bucket/objects/respawn/vm/")' in text and "upload" not in text
    titles = [l for l in lines if l.startswith("# ") and not l.startswith("#  ")]  # '#   ': what a step looks up
    steps = deploy.plan(deploy.Target("prod-proj", "us-central1", "prod-bucket", "c@prod-proj.iam.gserviceaccount.com",
                                      "s@prod-proj.iam.gserviceaccount.com",
                                      env={"RESPAWN_NOTIFY_TOPIC": "projects/prod-proj/topics/respawn",
                                           "RESPAWN_NOTIFY_WEBHOOK": "https://hooks.slack.com/services/T0/B0/x,y"}))
    assert [int(t.split(".")[0][2:]) for t in titles] == list(range(1, len(steps) + 1))  # every step, one line each


def test_deploy_takes_the_trainer_account_and_the_users_allow_list(deploying, monkeypatch):
    import shlex

    monkeypatch.setenv("RESPAWN_ALLOWED_SERVICE_ACCOUNTS", "x@prod-proj.iam.gserviceaccount.com,y@prod-proj.iam.gserviceaccount.com")
    result = deploying("deploy", "--project", "prod-proj", "--region", "us-central1", "--bucket", "prod-bucket",
                 "--trainer-account", "ml@prod-proj.iam.gserviceaccount.com", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "gcloud iam service-accounts create ml --project=prod-proj" in result.output
    tick = next(l for l in result.output.splitlines() if l.startswith("gcloud functions deploy respawn-tick"))
    env = _dict_flag(next(a for a in shlex.split(tick) if a.startswith("--set-env-vars=")).split("=", 1)[1])
    assert env["RESPAWN_TRAINER_SERVICE_ACCOUNT"] == "ml@prod-proj.iam.gserviceaccount.com"
    assert env["RESPAWN_ALLOWED_SERVICE_ACCOUNTS"] == "x@prod-proj.iam.gserviceaccount.com,y@prod-proj.iam.gserviceaccount.com"


def test_deploy_sets_up_what_respawn_logs_reads(deploying, monkeypatch):
    """The guest agent writes a VM's script lines with the VM's account: deploy grants the trainer
    account roles/logging.logWriter on the project (serial-port logging is each VM's own metadata)."""
    import shlex

    monkeypatch.delenv("RESPAWN_TRAINER_SERVICE_ACCOUNT", raising=False)
    result = deploying("deploy", "--project", "prod-proj", "--region", "us-central1", "--bucket", "prod-bucket",
                       "--dry-run")
    assert result.exit_code == 0, result.output
    grant = shlex.split(next(l for l in result.output.splitlines() if l.startswith("gcloud projects add-iam")))
    assert grant == ["gcloud", "projects", "add-iam-policy-binding", "prod-proj",
                     "--member=serviceAccount:respawn-trainer@prod-proj.iam.gserviceaccount.com",
                     "--role=roles/logging.logWriter", "--condition=None"]


def test_an_empty_webhook_host_list_is_deployed_empty(deploying, monkeypatch):
    """RESPAWN_ALLOWED_WEBHOOK_HOSTS="" means no host: the functions get it empty, never their default."""
    import shlex

    from controller.service.config import Settings

    monkeypatch.setenv("RESPAWN_ALLOWED_WEBHOOK_HOSTS", "")
    result = deploying("deploy", "--project", "prod-proj", "--region", "us-central1", "--bucket", "prod-bucket",
                       "--dry-run")
    assert result.exit_code == 0, result.output
    tick = next(l for l in result.output.splitlines() if l.startswith("gcloud functions deploy respawn-tick"))
    env = _dict_flag(next(a for a in shlex.split(tick) if a.startswith("--set-env-vars=")).split("=", 1)[1])
    assert env["RESPAWN_ALLOWED_WEBHOOK_HOSTS"] == ""
    # ...and the functions read it as no host at all
    monkeypatch.setenv("RESPAWN_ALLOWED_WEBHOOK_HOSTS", env["RESPAWN_ALLOWED_WEBHOOK_HOSTS"])
    assert Settings().allowed_webhook_hosts == ()


def test_a_failing_deploy_step_never_prints_the_webhook_url(deploying, monkeypatch):
    """The notification webhook's URL (a secret) reaches gcloud on its standard input alone, and
    gcloud may echo what it read back: neither a failure's message nor its output shows it."""
    import subprocess

    secret = "https://hooks.slack.com/services/T0SECRET/B0SECRET/xyzzy"
    monkeypatch.setenv("RESPAWN_NOTIFY_WEBHOOK", secret)
    given: list[tuple[list[str], str | None]] = []

    def gcloud(argv, **kw):
        given.append((list(argv), kw.get("input")))
        if tuple(argv[1:4]) == ("secrets", "versions", "add"):
            raise subprocess.CalledProcessError(1, argv, "", f"ERROR: (gcloud.secrets.versions.add) invalid: {kw['input']}")
        if "--raw" in argv:  # the bucket's description: not there yet (deploy creates it)
            raise subprocess.CalledProcessError(1, argv, "", "ERROR: gs://b-bucket not found: 404.")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(subprocess, "run", gcloud)
    result = deploying("deploy", "--project", "p-proj", "--region", "us-central1", "--bucket", "b-bucket")
    assert result.exit_code == 1 and "gcloud secrets versions add respawn-notify-webhook" in result.output
    assert "(gcloud.secrets.versions.add) invalid: https://hooks.slack.com/<redacted>" in result.output
    assert "T0SECRET" not in result.output and "xyzzy" not in result.output
    assert [stdin for argv, stdin in given if secret in " ".join(argv) or stdin] == [secret]  # stdin, once


def test_deploy_refuses_a_bucket_name_that_is_not_one(deploying):
    result = deploying("deploy", "--project", "p", "--region", "r", "--bucket", 'b"||true', "--dry-run")
    assert result.exit_code == 2 and "not a Cloud Storage bucket name" in result.output


def test_deploy_reports_the_failing_command_and_stops(deploying, monkeypatch):
    import subprocess

    from controller.cli import deploy

    def fail(steps, target, say, **_):
        step = next(s for s in steps if s.name == "uniform-access")
        raise deploy.StepFailed(steps.index(step) + 1, step, "gcloud storage buckets update gs://b-bucket failed",
                                output="ERROR: PERMISSION_DENIED")

    monkeypatch.setattr(deploy, "execute", fail)
    result = deploying("deploy", "--project", "p-proj", "--region", "us-central1", "--bucket", "b-bucket")
    assert result.exit_code == 1
    assert "step 3 (uniform-access) failed: gcloud storage buckets update gs://b-bucket failed" in result.output
    assert "PERMISSION_DENIED" in result.output and "--from uniform-access" in result.output


def test_deploy_runs_the_plan_in_order(monkeypatch):
    import subprocess

    from controller.cli import deploy

    ran: list[tuple[str, ...]] = []
    scheduled: list[dict[str, Any]] = []
    monkeypatch.setattr(deploy, "_upsert_scheduler_job", scheduled.append)

    def fake_gcloud(argv: tuple[str, ...]) -> str:
        ran.append(argv)
        if "--raw" in argv:
            raise subprocess.CalledProcessError(1, argv, "", "ERROR: gs://b-bucket not found: 404.")
        if argv[1:3] == ("functions", "describe"):
            return "https://respawn-tick-xyz.a.run.app\n"
        return "US-CENTRAL1\n" if "describe" in argv else ""

    target = deploy.Target("p-proj", "us-central1", "b-bucket", "c@p-proj.iam.gserviceaccount.com",
                           "s@p-proj.iam.gserviceaccount.com")
    deploy.execute(deploy.plan(target), target, run=fake_gcloud, say=lambda _: None)
    assert [a[1:4] for a in ran[:10]] == [("services", "enable", "compute.googleapis.com"),
                                          ("projects", "describe", "p-proj"), ("storage", "buckets", "describe"),
                                          ("storage", "buckets", "create"), ("storage", "buckets", "update"),
                                          # the checkpoints bucket: where the control bucket is (its lookups), if absent
                                          ("projects", "describe", "p-proj"), ("storage", "buckets", "describe"),
                                          ("storage", "buckets", "describe"), ("storage", "buckets", "create"),
                                          ("iam", "service-accounts", "create")]
    assert ran[8][4] == "gs://b-bucket-checkpoints"
    functions = [a[2:4] for a in ran if a[1] == "functions"]
    assert functions == [("describe", "respawn-tick"), ("deploy", "respawn-tick"),  # what is deployed, read first
                         ("describe", "respawn-on-object"), ("deploy", "respawn-on-object"),
                         ("describe", "respawn-on-audit"), ("deploy", "respawn-on-audit"),
                         ("add-invoker-policy-binding", "respawn-tick"), ("add-invoker-policy-binding", "respawn-on-object"),
                         ("add-invoker-policy-binding", "respawn-on-audit"), ("describe", "respawn-tick")]
    assert "--trigger-location=us-central1" in next(a for a in ran if "respawn-on-object" in a and "deploy" in a)
    assert scheduled[0]["job"]["http_target"]["uri"] == "https://respawn-tick-xyz.a.run.app"
    assert scheduled[0]["job"]["http_target"]["oidc_token"]["audience"] == "https://respawn-tick-xyz.a.run.app"
    # VMs fetch their scripts from respawn/vm/ (the controller writes them): the trainer may read them
    assert any(a[1:4] == ("storage", "buckets", "add-iam-policy-binding")
               and "objects/respawn/vm/" in " ".join(a) and "--role=roles/storage.objectViewer" in a for a in ran)


def test_status_keeps_every_job_when_one_checkpoint_bucket_cannot_be_listed(cli, tmp_path, servers):
    assert cli("submit", str(spec_file(tmp_path, "ck-ok"))).exit_code == 0
    # Written to the bucket as anyone who may write it can (submit refuses a checkpoint bucket that is not there).
    gone = yaml.safe_dump({**spec_doc(command="sleep 600"), "checkpoint": {"uri": "gs://no-such-ckpt-bkt/run"}})
    client(servers[0].url).bucket(BUCKET).blob(names.spec_key("ck-gone")).upload_from_string(gone)
    result = cli("status")
    assert result.exit_code == 0, result.output
    assert "ck-ok" in result.output and "unreadable" in result.output
    assert "ck-gone: checkpoints not readable: gs://no-such-ckpt-bkt/run/*" in result.output
    rows = {r["job"]: r for r in json.loads(cli("status", "--json").stdout)}
    assert rows["ck-ok"]["checkpoint_error"] is None
    assert rows["ck-gone"]["checkpoint_step"] is None and "no-such-ckpt-bkt" in rows["ck-gone"]["checkpoint_error"]
    one = cli("status", "ck-gone")
    assert one.exit_code == 0 and "ck-gone" in one.output


def test_submit_replace_does_not_revoke_a_pending_cancel_without_uncancel(cli, tmp_path, servers):
    bucket = client(servers[0].url).bucket(BUCKET)
    path = str(spec_file(tmp_path, "unc"))
    assert cli("submit", path).exit_code == 0
    assert cli("reconcile", "unc").exit_code == 0
    assert cli("cancel", "unc").exit_code == 0
    refused = cli("submit", path, "--replace")
    assert refused.exit_code == 2 and "pending cancel" in refused.output and "--uncancel" in refused.output
    assert bucket.get_blob(names.cancel_key("unc")) is not None
    withdrawn = cli("submit", path, "--replace", "--uncancel")
    assert withdrawn.exit_code == 0, withdrawn.output
    assert bucket.get_blob(names.cancel_key("unc")) is None
    assert cli("reconcile", "unc").exit_code == 0
    assert json.loads(cli("status", "unc", "--json").stdout)[0]["phase"] != "CANCELLED"
    cli("cancel", "unc")
    cli("reconcile", "unc")
    assert json.loads(cli("status", "unc", "--json").stdout)[0]["phase"] == "CANCELLED"


def test_status_escapes_control_characters_in_object_names(cli, servers):
    blob = client(servers[0].url).bucket(BUCKET).blob("jobs/esc\x1b]0;owned\x07\x1b[2J[x]/spec.yaml")
    blob.upload_from_string(b"zones: [x]")
    try:
        result = cli("status")
        assert result.exit_code == 0, result.output
        assert "\x1b" not in result.output and "\x07" not in result.output
        assert r"esc\x1b]0;owned\x07\x1b[2J[x]" in result.output
    finally:
        blob.delete()


def test_status_of_an_unknown_job_exits_2_in_one_line(cli):
    result = cli("status", "no-such-job")
    assert result.exit_code == 2
    assert result.output.strip() == f"✗ no job named 'no-such-job' in gs://{BUCKET}"


def test_configuration_problems_are_one_line_naming_the_variable(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("RESPAWN_MAX_NODES", "lots")
    for args in (("status",), ("logs", "nothing"), ("submit", str(spec_file(tmp_path, "cfg"))), ("reconcile",)):
        result = cli(*args)
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output
        assert result.output.startswith("✗ configuration: RESPAWN_MAX_NODES='lots'"), result.output
    monkeypatch.delenv("RESPAWN_MAX_NODES")
    monkeypatch.delenv("RESPAWN_BUCKET")
    bootstrap.override(None)
    result = cli("logs", "nothing")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.strip() == "✗ configuration: set RESPAWN_BUCKET and RESPAWN_PROJECT (or GOOGLE_CLOUD_PROJECT)"
