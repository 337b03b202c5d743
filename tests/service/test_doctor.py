"""respawn doctor over a project in memory: every check passes on what `respawn deploy` leaves, and
each fails, alone, on the one thing broken, naming the command that fixes it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from controller.adapters.memory_doctor import MemoryProject
from controller.cli import deploy, doctor
from controller.core import audit, errors
from controller.core.spec import parse_spec
from controller.service import lastpass

PROJECT, BUCKET, REGION = "respawn-proj", "respawn-bucket", "us-central1"
NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
TRAINER = deploy.account_email(deploy.TRAINER_ACCOUNT_ID, PROJECT)
CONTROLLER = deploy.account_email("respawn-controller", PROJECT)
WRITER = "serviceAccount:service-123456789012@gcp-sa-logging.iam.gserviceaccount.com"
DEPLOY_FROM = f"respawn deploy --project={PROJECT} --region={REGION} --bucket={BUCKET} --from"
DEPLOYMENT = [name for name, _ in doctor.checks(None, doctor.Target(PROJECT, BUCKET, REGION, CONTROLLER, TRAINER))]  # type: ignore[arg-type]


def healthy() -> MemoryProject:
    p = MemoryProject.deployed(PROJECT, BUCKET, REGION, NOW - timedelta(seconds=40))
    for region in ("us-central1", "us-east1"):
        p.quota(region, "NVIDIA_L4_GPUS", 8)
        p.quota(region, "PREEMPTIBLE_NVIDIA_L4_GPUS", 16, usage=2)
    p.images[("debian-cloud", "family/debian-12")] = {"name": "debian-12-bookworm-v20260101", "status": "READY"}
    return p


def target(tpu: bool = False) -> doctor.Target:
    return doctor.Target(PROJECT, BUCKET, REGION, CONTROLLER, TRAINER, tpu=tpu)


def spec(**over):
    doc = {"zones": ["us-central1-a", "us-east1-b"], "machine_type": "g2-standard-8", "command": "true",
           "provisioning": ["spot"], **over}
    return parse_spec(__import__("json").dumps(doc).encode(), "job")


def run(p: MemoryProject, with_spec=None, timeout: float = 5.0, tpu: bool = False) -> dict[str, doctor.Result]:
    t = target(tpu)
    checks = doctor.checks(p, t, now=lambda: NOW)
    if with_spec is not None:
        checks += doctor.spec_checks(p, t, with_spec, with_spec.service_account.email or TRAINER)
    return {r.name: r for r in doctor.run(checks, timeout)}


def test_every_check_passes_on_a_deployed_project():
    found = run(healthy(), spec())
    assert [n for n, r in found.items() if not r.ok] == []
    assert set(DEPLOYMENT) < set(found)
    assert found["controller last ran"].detail == "controller last ran 40 s ago (0.7 s, 2 jobs, 1 action, 0 errors)"
    assert found["credentials"].detail == "found: you@example.com"
    assert "PREEMPTIBLE_NVIDIA_L4_GPUS 14 free of 16" in found["GPU quota in us-central1"].detail
    assert found["image"].detail == "image family debian-12 of debian-cloud: debian-12-bookworm-v20260101"


def _set(obj, key, value):
    obj[key] = value


BREAKS: dict[str, tuple[Callable[[MemoryProject], None], str, str]] = {
    # check name: (what breaks it, what its ✗ says, what its fix runs)
    "credentials": (lambda p: setattr(p, "principal", None), "none usable", "gcloud auth application-default login"),
    "project": (lambda p: setattr(p, "state", "DELETE_REQUESTED"), "DELETE_REQUESTED", "gcloud projects undelete"),
    "APIs": (lambda p: p.disabled.update({"eventarc.googleapis.com", "cloudscheduler.googleapis.com"}),
             "not enabled: eventarc, cloudscheduler",
             f"gcloud services enable eventarc.googleapis.com cloudscheduler.googleapis.com --project={PROJECT}"),
    "uniform bucket-level access": (lambda p: setattr(p, "uniform", False), "off",
                                    f"gcloud storage buckets update gs://{BUCKET} --uniform-bucket-level-access"),
    "bucket writable": (lambda p: setattr(p, "writable", False), "could not write and delete",
                        f"gcloud storage buckets add-iam-policy-binding gs://{BUCKET}"),
    "trainer cannot read the bucket": (
        lambda p: p.bucket_bindings.append({"role": "roles/storage.objectViewer", "members": [f"serviceAccount:{TRAINER}"]}),
        "the trainer holds roles/storage.objectViewer", f"gcloud storage buckets remove-iam-policy-binding gs://{BUCKET} "
                                                        f"--member=serviceAccount:{TRAINER} --role=roles/storage.objectViewer"),
    "bucket IAM": (lambda p: p.bucket_bindings.pop(0), "the controller", "--role=roles/storage.objectUser --condition=None"),
    "project IAM": (lambda p: p.project_bindings.pop(0), "lacks roles/logging.logWriter",
                    f"gcloud projects add-iam-policy-binding {PROJECT} --member=serviceAccount:{TRAINER} "
                    "--role=roles/logging.logWriter"),
    "trainer account": (lambda p: p.accounts.__setitem__(TRAINER, []), "may not act as",
                        f"gcloud iam service-accounts add-iam-policy-binding {TRAINER} "
                        f"--member=serviceAccount:{CONTROLLER} --role=roles/iam.serviceAccountUser"),
    f"function {deploy.TICK}": (lambda p: _set(p.functions[deploy.TICK], "state", "FAILED"), "FAILED",
                                f"respawn deploy --project={PROJECT} --region={REGION} --bucket={BUCKET}"),
    f"function {deploy.ON_OBJECT}": (lambda p: p.functions.pop(deploy.ON_OBJECT), "not deployed", "respawn deploy"),
    f"scheduler job {deploy.TICK}": (lambda p: _set(p.jobs[deploy.TICK], "state", "PAUSED"), "PAUSED",
                                     f"gcloud scheduler jobs resume {deploy.TICK} --location={REGION}"),
    "controller last ran": (lambda p: setattr(p, "record", lastpass.LastPass(NOW - timedelta(minutes=5), 1, 1, 0, 0)),
                            "controller last ran 5 min ago", f"gcloud scheduler jobs run {deploy.TICK}"),
    f"function {deploy.ON_AUDIT}": (lambda p: p.functions.pop(deploy.ON_AUDIT), "not deployed",
                                    f"{DEPLOY_FROM} on-audit"),
    f"audit sink {deploy.AUDIT_SINK}": (
        lambda p: _set(p.sinks[deploy.AUDIT_SINK], "filter", 'resource.type="gce_instance"'),
        "its filter is not respawn's",
        f"gcloud logging sinks update respawn-audit pubsub.googleapis.com/projects/{PROJECT}/topics/respawn-audit "
        f"'--log-filter={audit.sink_filter(PROJECT)}' --no-disabled --project={PROJECT}\n"
        f"# or: {DEPLOY_FROM} audit-sink-update"),
    "audit sink may publish": (lambda p: p.topics[deploy.AUDIT_TOPIC].clear(), f"{WRITER} may not publish",
                               f"gcloud pubsub topics add-iam-policy-binding respawn-audit --member={WRITER} "
                               f"--role=roles/pubsub.publisher --project={PROJECT}"),
    "log-based metrics": (lambda p: p.metrics.pop("respawn_losses"), "missing: respawn_losses",
                          f"{DEPLOY_FROM} metric-respawn_losses"),
    "controller reads audit logs": (lambda p: p.project_bindings.pop(1), "may not read",
                                    f"gcloud projects add-iam-policy-binding {PROJECT} "
                                    f"--member=serviceAccount:{CONTROLLER} --role=roles/logging.viewer --condition=None"),
}


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_each_check_fails_alone_on_its_own_breakage_and_names_its_fix(name):
    p = healthy()
    breaks, said, fix = BREAKS[name]
    breaks(p)
    found = run(p)
    failed = [n for n, r in found.items() if not r.ok]
    assert failed == [name], found
    assert said in found[name].detail and fix in found[name].fix, found[name]


def test_the_breaks_cover_every_deployment_check_but_the_bucket_s_and_the_topic_s_own():
    assert set(BREAKS) | {"bucket", f"audit topic {deploy.AUDIT_TOPIC}"} == set(DEPLOYMENT)


def test_a_metric_changed_by_hand_fails_naming_it_and_every_metric_passes_when_deployed():
    assert "8 log-based metrics of the fleet's figures" in run(healthy())["log-based metrics"].detail
    p = healthy()
    p.metrics["respawn_jobs"]["filter"] = "severity>=ERROR"
    found = run(p)["log-based metrics"]
    assert not found.ok and "not respawn's (filter or extractors): respawn_jobs" in found.detail
    assert f"{DEPLOY_FROM} metric-respawn_jobs" in found.fix


# -- the audit path: sink -> topic -> on_audit; the tick's read ---------------------------------------
def test_a_missing_audit_topic_fails_the_topic_and_the_sink_s_grant_naming_how_to_recreate_them():
    p = healthy()
    del p.topics[deploy.AUDIT_TOPIC]
    found = run(p)
    assert {n for n, r in found.items() if not r.ok} == {f"audit topic {deploy.AUDIT_TOPIC}", "audit sink may publish"}
    topic = found[f"audit topic {deploy.AUDIT_TOPIC}"]
    assert f"gcloud pubsub topics create respawn-audit --project={PROJECT}" in topic.fix
    assert f"{DEPLOY_FROM} audit-topic" in topic.fix


def test_a_missing_sink_names_the_deploy_step_that_creates_it():
    p = healthy()
    del p.sinks[deploy.AUDIT_SINK]
    found = run(p)
    assert {n for n, r in found.items() if not r.ok} == {f"audit sink {deploy.AUDIT_SINK}", "audit sink may publish"}
    assert found[f"audit sink {deploy.AUDIT_SINK}"].fix == f"{DEPLOY_FROM} audit-sink"
    assert "reach only the tick" in found[f"audit sink {deploy.AUDIT_SINK}"].detail


def test_a_sink_routed_elsewhere_or_disabled_fails_saying_each_thing_wrong():
    p = healthy()
    p.sinks[deploy.AUDIT_SINK].update(destination="pubsub.googleapis.com/projects/x/topics/y", disabled=True)
    sink = run(p)[f"audit sink {deploy.AUDIT_SINK}"]
    assert not sink.ok
    assert "routes to pubsub.googleapis.com/projects/x/topics/y, not" in sink.detail and "disabled" in sink.detail
    assert "filter" not in sink.detail and "--no-disabled" in sink.fix


def test_the_sink_check_passes_on_the_filter_audit_writes_and_says_it_cannot_select_respawns_instances():
    found = run(healthy())[f"audit sink {deploy.AUDIT_SINK}"]
    assert found.ok and "carry no labels" in found.detail


def test_an_on_audit_function_triggered_by_another_topic_fails():
    p = healthy()
    p.functions[deploy.ON_AUDIT]["eventTrigger"]["pubsubTopic"] = f"projects/{PROJECT}/topics/other"
    found = run(p)[f"function {deploy.ON_AUDIT}"]
    assert not found.ok and f"on projects/{PROJECT}/topics/other, not" in found.detail
    assert found.fix == f"{DEPLOY_FROM} on-audit"
    p.functions[deploy.ON_AUDIT]["state"] = "DEPLOYING"
    assert run(p)[f"function {deploy.ON_AUDIT}"].detail.startswith("DEPLOYING")


def test_a_writer_that_may_publish_through_the_project_passes_with_a_note():
    p = healthy()
    p.topics[deploy.AUDIT_TOPIC].clear()
    p.project_bindings.append({"role": "roles/pubsub.publisher", "members": [WRITER]})
    found = run(p)["audit sink may publish"]
    assert found.ok and found.note and "every topic" in found.detail


def test_a_conditioned_log_reader_is_no_reader_and_a_custom_role_is_said_not_checked():
    p = healthy()
    p.project_bindings[1]["condition"] = {"title": "t", "expression": "false"}
    assert not run(p)["controller reads audit logs"].ok
    p.project_bindings.append({"role": f"projects/{PROJECT}/roles/logReader", "members": [f"serviceAccount:{CONTROLLER}"]})
    found = run(p)["controller reads audit logs"]
    assert found.ok and found.note and "not checked" in found.detail


def test_a_missing_bucket_fails_every_check_that_needs_it_and_names_how_to_create_it():
    p = healthy()
    p.bucket_exists = False
    found = run(p)
    assert not found["bucket"].ok and f"gcloud storage buckets create gs://{BUCKET}" in found["bucket"].fix
    assert {n for n, r in found.items() if not r.ok} == {
        "bucket", "uniform bucket-level access", "bucket writable", "trainer cannot read the bucket", "bucket IAM",
        "controller last ran"}
    assert all(found[n].ok for n in ("project", "APIs", f"function {deploy.TICK}", "project IAM"))


def test_a_scheduler_job_whose_last_attempt_failed_names_the_tick_s_logs():
    p = healthy()
    p.jobs[deploy.TICK]["status"] = {"code": 7, "message": "PERMISSION_DENIED"}
    found = run(p)
    assert not found[f"scheduler job {deploy.TICK}"].ok
    assert "failed: code 7 PERMISSION_DENIED" in found[f"scheduler job {deploy.TICK}"].detail
    assert f"gcloud functions logs read {deploy.TICK}" in found[f"scheduler job {deploy.TICK}"].fix


def test_an_on_object_trigger_on_another_bucket_or_an_http_tick_gone_event_driven_fails():
    p = healthy()
    p.functions[deploy.ON_OBJECT]["eventTrigger"]["eventFilters"] = [{"attribute": "bucket", "value": "other"}]
    p.functions[deploy.TICK]["eventTrigger"] = {"eventType": "google.cloud.pubsub.topic.v1.messagePublished"}
    found = run(p)
    assert "on other" in found[f"function {deploy.ON_OBJECT}"].detail and not found[f"function {deploy.ON_OBJECT}"].ok
    assert "not HTTP" in found[f"function {deploy.TICK}"].detail and not found[f"function {deploy.TICK}"].ok


def test_a_controller_that_never_ran_fails_naming_the_record():
    p = healthy()
    p.record = None
    found = run(p)
    assert not found["controller last ran"].ok and lastpass.KEY in found["controller last ran"].detail


def test_a_public_bucket_lets_the_trainer_read():
    p = healthy()
    p.bucket_bindings.append({"role": "roles/storage.objectViewer", "members": ["allUsers"]})
    found = run(p)
    assert not found["trainer cannot read the bucket"].ok
    assert "--member=allUsers" in found["trainer cannot read the bucket"].fix


def test_the_trainer_reading_through_a_project_role_fails():
    p = healthy()
    p.project_bindings.append({"role": "roles/storage.objectViewer", "members": [f"serviceAccount:{TRAINER}"]})
    found = run(p)
    assert not found["trainer cannot read the bucket"].ok
    assert f"gcloud projects remove-iam-policy-binding {PROJECT}" in found["trainer cannot read the bucket"].fix


def test_the_tpu_api_is_needed_only_where_tpu_types_are_allowed():
    p = healthy()
    p.disabled.add("tpu.googleapis.com")
    assert run(p)["APIs"].ok
    found = run(p, tpu=True)
    assert not found["APIs"].ok and "tpu.googleapis.com" in found["APIs"].fix


def test_an_unknown_project_fails_and_says_how_to_look():
    p = healthy()
    p.project_id = "someone-else"
    found = run(p)
    assert not found["project"].ok and f"gcloud projects describe {PROJECT}" in found["project"].fix


# -- a spec's checks --------------------------------------------------------------------------------
def test_a_zero_gpu_quota_in_one_region_fails_that_region_only():
    p = healthy()
    p.quota("us-east1", "PREEMPTIBLE_NVIDIA_L4_GPUS", 0)
    p.quota("us-east1", "NVIDIA_L4_GPUS", 0)
    found = run(p, spec())
    assert found["GPU quota in us-central1"].ok
    east = found["GPU quota in us-east1"]
    assert not east.ok and "1 nvidia-l4 needed" in east.detail and "NVIDIA_L4_GPUS 0 free of 0" in east.detail
    assert "request more of PREEMPTIBLE_NVIDIA_L4_GPUS in us-east1" in east.fix and "iam-admin/quotas" in east.fix


def test_spot_uses_the_standard_gpu_quota_where_the_region_lists_no_preemptible_one():
    p = healthy()
    del p.quota_table["us-east1"]["PREEMPTIBLE_NVIDIA_L4_GPUS"]  # controller.core.quotas: then the standard one
    found = run(p, spec())
    assert found["GPU quota in us-east1"].ok and "spot: NVIDIA_L4_GPUS 8 free of 8" in found["GPU quota in us-east1"].detail
    p.quota("us-central1", "PREEMPTIBLE_NVIDIA_L4_GPUS", 0)  # listed at 0: Spot has none there
    assert not run(p, spec())["GPU quota in us-central1"].ok


def test_a_spec_that_may_step_down_to_standard_fits_where_either_model_does():
    p = healthy()
    p.quota("us-east1", "PREEMPTIBLE_NVIDIA_L4_GPUS", 0)
    found = run(p, spec(provisioning=["spot", "standard"]))
    east = found["GPU quota in us-east1"]
    assert east.ok and "spot: PREEMPTIBLE_NVIDIA_L4_GPUS 0 free of 0, standard: NVIDIA_L4_GPUS 8 free of 8" in east.detail


def test_quota_counts_every_node_of_a_gang_and_its_usage():
    p = healthy()
    p.quota("us-central1", "NVIDIA_L4_GPUS", 8, usage=6)
    found = run(p, spec(zones=["us-central1-a"], provisioning=["standard"], machine_type="n1-standard-8",
                        accelerators={"type": "nvidia-l4", "count": 2}, nodes=2))
    assert not found["GPU quota in us-central1"].ok
    assert "4 nvidia-l4 needed; standard: NVIDIA_L4_GPUS 2 free of 8" == found["GPU quota in us-central1"].detail


def test_a_spec_whose_image_does_not_exist_fails_naming_how_to_list_images():
    found = run(healthy(), spec(boot_disk={"image_family": "no-such", "image_project": "debian-cloud"}))
    assert not found["image"].ok
    assert "gcloud compute images list --project=debian-cloud --image-family=no-such" in found["image"].fix


def test_an_image_by_url_is_read_by_name():
    p = healthy()
    p.images[("my-proj", "img-1")] = {"name": "img-1", "status": "READY"}
    assert run(p, spec(boot_disk={"image": "projects/my-proj/global/images/img-1"}))["image"].ok


def test_a_spec_s_service_account_must_exist_and_be_usable_by_the_controller():
    other = f"other@{PROJECT}.iam.gserviceaccount.com"
    p = healthy()
    found = run(p, spec(service_account={"email": other}))
    assert not found["service account"].ok and "does not exist" in found["service account"].detail
    p.accounts[other] = []
    found = run(p, spec(service_account={"email": other}))
    assert not found["service account"].ok and "may not act as" in found["service account"].detail
    assert f"--member=serviceAccount:{CONTROLLER} --role=roles/iam.serviceAccountUser" in found["service account"].fix
    p.accounts[other] = [{"role": "roles/iam.serviceAccountUser", "members": [f"serviceAccount:{CONTROLLER}"]}]
    assert run(p, spec(service_account={"email": other}))["service account"].ok


def test_a_tpu_spec_says_its_quota_is_not_compute_s_and_does_not_fail_on_it():
    found = run(healthy(), spec(machine_type=None, zones=["us-central2-b"],
                                tpu={"type": "v4-8", "runtime_version": "tpu-ubuntu2204-base"}))
    assert found["quota in us-central2"].ok and found["quota in us-central2"].note


# -- independence and timeouts ----------------------------------------------------------------------
def test_a_check_that_hangs_times_out_alone_and_the_others_answer():
    p = healthy()
    p.hang.add("scheduler_job")
    started = time.monotonic()
    found = run(p, timeout=0.5)
    assert time.monotonic() - started < 1.5
    assert [n for n, r in found.items() if not r.ok] == [f"scheduler job {deploy.TICK}"]
    assert found[f"scheduler job {deploy.TICK}"].detail == "no answer in time"


def test_a_controller_record_dated_in_the_future_fails_its_check():
    p = healthy()
    p.record = lastpass.LastPass(NOW + timedelta(days=365), 0.7, 2, 1, 0)
    found = run(p)["controller last ran"]
    assert not found.ok and "in the future: not believed" in found.detail and "clock" in found.fix


def test_a_hung_check_does_not_hold_the_doctor_open_after_its_answer():
    # The interpreter joins a ThreadPoolExecutor's threads at exit: a check hung on an API held
    # `respawn doctor` open, its answer printed, until that API answered.
    code = ("import time; from controller.cli import doctor; "
            "found = doctor.run([('hung', lambda: time.sleep(60) or 'late'), ('quick', lambda: 'ok')], 0.3); "
            "print([(r.name, r.ok, r.detail) for r in found])")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50,
                          cwd=Path(doctor.__file__).parents[2])
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 20
    assert done.stdout.strip() == "[('hung', False, 'no answer in time'), ('quick', True, 'ok')]"


def test_a_check_whose_api_raises_is_its_own_failure():
    p = healthy()
    p.failures["function"] = errors.TransientError("503 backend error")
    found = run(p)
    assert {n for n, r in found.items() if not r.ok} == {f"function {deploy.TICK}", f"function {deploy.ON_OBJECT}",
                                                         f"function {deploy.ON_AUDIT}"}
    assert found[f"function {deploy.TICK}"].detail == "503 backend error"


def test_the_trainer_s_read_of_code_tarballs_only_is_not_a_read_of_the_records():
    p = healthy()
    code = f'resource.name.startsWith("projects/_/buckets/{BUCKET}/objects/code/")'
    p.bucket_bindings.append({"role": "roles/storage.objectViewer", "members": [f"serviceAccount:{TRAINER}"],
                              "condition": {"title": "respawn-trainer-code-read-only", "expression": code}})
    assert run(p)["trainer cannot read the bucket"].ok
    p.bucket_bindings[-1]["condition"]["expression"] = f'resource.name.startsWith("projects/_/buckets/{BUCKET}/objects/")'
    assert not run(p)["trainer cannot read the bucket"].ok
