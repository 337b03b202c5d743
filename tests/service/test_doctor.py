"""respawn doctor over a project in memory: every check passes on what `respawn deploy` leaves, and
each fails, alone, on the one thing broken, naming the command that fixes it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from controller.adapters.memory_doctor import MemoryProject
from controller.cli import deploy, doctor, grants
from controller.core import audit, errors
from controller.core.spec import parse_spec
from controller.service import lastpass

PROJECT, BUCKET, REGION = "respawn-proj", "respawn-bucket", "us-central1"
CHECKPOINTS = f"{BUCKET}-checkpoints"  # respawn run's default place for checkpoints, which deploy makes
NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
TRAINER = deploy.account_email(deploy.TRAINER_ACCOUNT_ID, PROJECT)
CONTROLLER = deploy.account_email("respawn-controller", PROJECT)
WRITER = "serviceAccount:service-123456789012@gcp-sa-logging.iam.gserviceaccount.com"
DEPLOY_FROM = f"respawn deploy --project={PROJECT} --region={REGION} --bucket={BUCKET} --from"
SCHEDULER = deploy.account_email("respawn-scheduler", PROJECT)
SERVICES = f"projects/{PROJECT}/locations/{REGION}/services"
CUSTOM = f"projects/{PROJECT}/roles/{deploy.TRAINER_ROLE_ID}"
STORAGE_AGENT = "service-123456789012@gs-project-accounts.iam.gserviceaccount.com"
PUBSUB_AGENT = "service-123456789012@gcp-sa-pubsub.iam.gserviceaccount.com"
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
    "checkpoints bucket": (lambda p: _unbind(p.other_buckets[CHECKPOINTS], "roles/storage.objectUser"),
                           f"the trainer ({TRAINER}) lacks storage.objects.create, storage.objects.delete, "
                           f"storage.objects.get and 1 more on gs://{CHECKPOINTS}",
                           f"gcloud storage buckets add-iam-policy-binding gs://{CHECKPOINTS} "
                           f"--member=serviceAccount:{TRAINER} --role=roles/storage.objectUser --condition=None"),
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
        f"'--log-filter={audit.sink_filter(PROJECT)}' --clear-exclusions --no-disabled --project={PROJECT}\n"
        f"# or: {DEPLOY_FROM} audit-sink-update"),
    "audit sink may publish": (lambda p: p.topics[deploy.AUDIT_TOPIC].clear(), f"{WRITER} may not publish",
                               f"gcloud pubsub topics add-iam-policy-binding respawn-audit --member={WRITER} "
                               f"--role=roles/pubsub.publisher --project={PROJECT}"),
    "log-based metrics": (lambda p: p.metrics.pop("respawn_losses"), "missing: respawn_losses",
                          f"{DEPLOY_FROM} metric-respawn_losses"),
    f"controller's grants in {PROJECT}": (
        lambda p: _unbind(p.project_bindings, "roles/compute.instanceAdmin.v1"),
        f"the controller ({CONTROLLER}) lacks compute.instances.create, compute.instances.delete, "
        f"compute.instances.get and 10 more on project {PROJECT}",
        f"gcloud projects add-iam-policy-binding {PROJECT} --member=serviceAccount:{CONTROLLER} "
        f"--role=roles/compute.instanceAdmin.v1 --condition=None\n# or: {DEPLOY_FROM} controller-compute"),
    "scheduler may invoke tick": (
        lambda p: p.run_services[f"{SERVICES}/{deploy.TICK}"].clear(),
        f"{SCHEDULER} lacks run.routes.invoke on {deploy.TICK}'s service",
        f"gcloud functions add-invoker-policy-binding {deploy.TICK} --gen2 --region={REGION} --project={PROJECT} "
        f"--member=serviceAccount:{SCHEDULER}"),
    "triggers may invoke on_object and on_audit": (
        lambda p: p.run_services[f"{SERVICES}/{deploy.ON_AUDIT}"].clear(),
        f"{CONTROLLER} lacks run.routes.invoke on {deploy.ON_AUDIT}'s service",
        f"gcloud functions add-invoker-policy-binding {deploy.ON_AUDIT} --gen2 --region={REGION} --project={PROJECT} "
        f"--member=serviceAccount:{CONTROLLER}"),
    "on_object's trigger receives events": (
        lambda p: _unbind(p.project_bindings, "roles/eventarc.eventReceiver"),
        f"{deploy.ON_OBJECT}'s trigger account ({CONTROLLER}) lacks eventarc.events.receiveEvent",
        f"gcloud projects add-iam-policy-binding {PROJECT} --member=serviceAccount:{CONTROLLER} "
        "--role=roles/eventarc.eventReceiver --condition=None"),
    "service agents": (
        lambda p: _unbind(p.project_bindings, "roles/pubsub.publisher"),
        f"the Cloud Storage service agent ({STORAGE_AGENT}) lacks pubsub.topics.publish",
        f"gcloud projects add-iam-policy-binding {PROJECT} --member=serviceAccount:{STORAGE_AGENT} "
        "--role=roles/pubsub.publisher --condition=None"),
    f"custom role {deploy.TRAINER_ROLE_ID}": (
        lambda p: p.roles[CUSTOM]["includedPermissions"].append("storage.objects.get"),
        "it also grants storage.objects.get: every trainer VM could do that to every job's records",
        f"gcloud iam roles update respawnVmRecords --project={PROJECT} "
        "--permissions=storage.objects.create,storage.objects.delete --stage=GA"),
}


def _unbind(bindings: list, role: str) -> None:
    bindings[:] = [b for b in bindings if b["role"] != role]


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
    # (who may read the bucket, and a refused preemption notice, are said, never failed: the
    # bucket's readers are the user's to grant; the notice's Preview Google's to enable)
    assert set(BREAKS) | {"bucket", f"audit topic {deploy.AUDIT_TOPIC}", "who may read the bucket",
                          "preemption notice"} == set(DEPLOYMENT)


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


def test_a_project_that_refused_the_preemption_notice_is_said_with_how_to_get_it_or_stop_asking():
    """Issue 34: a project or API that refuses preemptionNoticeDuration never fails a job (it runs on
    without the notice, said once in its status); doctor says which project and what to do."""
    p = healthy()
    assert run(p)["preemption notice"].ok and not run(p)["preemption notice"].note
    p.record = dataclasses.replace(p.record, notice_refused={PROJECT: "Invalid value for field "
                                                               "'resource.scheduling.preemptionNoticeDuration'"})
    found = run(p)["preemption notice"]
    assert found.ok and found.note and PROJECT in found.detail and "preemption_notice: 0s" in found.detail
    assert lastpass.parse(p.record.as_json()).notice_refused == p.record.notice_refused


def test_a_missing_bucket_fails_every_check_that_needs_it_and_names_how_to_create_it():
    p = healthy()
    p.bucket_exists = False
    found = run(p)
    assert not found["bucket"].ok and f"gcloud storage buckets create gs://{BUCKET}" in found["bucket"].fix
    assert {n for n, r in found.items() if not r.ok} == {
        "bucket", "uniform bucket-level access", "bucket writable", "trainer cannot read the bucket", "bucket IAM",
        "controller last ran", "who may read the bucket", "preemption notice"}
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


def test_a_checkpoint_bucket_or_a_code_tarball_that_does_not_exist_fails_naming_the_field_and_the_fix():
    """Issue 39: doctor SPEC said "all checks passed" for a spec that submit then refused (its checkpoint
    bucket and its code tarball not there); it judges them as submit does (controller.service.places)."""
    p = healthy()
    p.objects.buckets = {"ckpts"}
    p.objects.put("ckpts", "code/train.tar.gz", b"tarball")
    found = run(p, spec(checkpoint={"uri": "gs://my-ckpts-bucket/llm"}, code="gs://ckpts/code/missing.tar.gz"))
    assert {n for n, r in found.items() if not r.ok} == {"checkpoint.uri", "code"}
    assert "bucket gs://my-ckpts-bucket does not exist (gs://my-ckpts-bucket/llm)" in found["checkpoint.uri"].detail
    assert found["checkpoint.uri"].fix == "gcloud storage buckets create gs://my-ckpts-bucket  # or point " \
                                          "checkpoint.uri at a bucket of yours"
    assert found["code"].detail.startswith("gs://ckpts/code/missing.tar.gz does not exist")
    assert found["code"].fix.startswith("gcloud storage cp CODE.tar.gz gs://ckpts/code/missing.tar.gz  # or give "
                                        "code: a local folder")
    there = run(p, spec(checkpoint={"uri": "gs://ckpts/llm"}, code="gs://ckpts/code/train.tar.gz"))
    assert [n for n, r in there.items() if not r.ok] == []
    assert not there["checkpoint.uri"].note and not there["code"].note
    assert there["checkpoint.uri"].detail == ("bucket gs://ckpts is there; under gs://ckpts/llm, no complete "
                                              "checkpoint there yet (a first run starts from scratch)")
    assert there["code"].detail == "gs://ckpts/code/train.tar.gz is there"


def test_doctor_fails_a_checkpoint_in_the_control_bucket_with_the_checkpoints_bucket_as_the_fix():
    """As submit warns: the trainer may write only its VM records in the control bucket (deploy/IAM.md)."""
    found = run(healthy(), spec(checkpoint={"uri": f"gs://{BUCKET}/checkpoints/job"}))["checkpoint.uri"]
    assert not found.ok
    assert found.detail.startswith(f"gs://{BUCKET}/checkpoints/job is in the control bucket gs://{BUCKET}, where the "
                                   "trainers' account may write only its VM records (deploy/IAM.md)"), found.detail
    assert found.fix == f"checkpoint: {{uri: gs://{CHECKPOINTS}/job}}  # the checkpoints bucket respawn deploy makes"
    in_ours = run(healthy(), spec(checkpoint={"uri": f"gs://{CHECKPOINTS}/job"}))["checkpoint.uri"]
    assert in_ours.ok and not in_ours.note and in_ours.detail.startswith(f"bucket gs://{CHECKPOINTS} is there")


def test_a_checkpoint_in_the_control_bucket_passes_where_the_trainer_was_granted_it_unconditioned():
    p = healthy()
    p.bucket_bindings.append({"role": "roles/storage.objectUser", "members": [f"serviceAccount:{TRAINER}"]})
    found = run(p, spec(checkpoint={"uri": f"gs://{BUCKET}/checkpoints/job"}))["checkpoint.uri"]
    assert found.ok and found.note, found
    assert found.detail == (f"gs://{BUCKET}/checkpoints/job is in the control bucket gs://{BUCKET}, and {TRAINER} may "
                            "read, write and list it there (roles/storage.objectUser): a grant beyond deploy's "
                            "(deploy/IAM.md)")
    # a grant conditioned to a prefix admits no listing (checked against the bucket's own name): still a ✗
    p.bucket_bindings[-1]["condition"] = {"title": "ckpt", "expression":
                                          f'resource.name.startsWith("projects/_/buckets/{BUCKET}/objects/checkpoints/")'}
    assert not run(p, spec(checkpoint={"uri": f"gs://{BUCKET}/checkpoints/job"}))["checkpoint.uri"].ok


def test_a_checkpoint_bucket_or_a_code_tarball_not_readable_here_is_said_never_failed():
    # A 403 for this account says nothing of the controller's (which lists the checkpoints) nor the VMs'
    # (which fetch the code): submit goes on, and doctor says it could not judge.
    p = healthy()
    p.objects.faults.fail_next("list", errors.RequestError("403 you@example.com does not have storage.objects.list "
                                                           "access to the Google Cloud Storage bucket"))
    p.objects.faults.fail_next("stat", errors.RequestError("403 you@example.com does not have storage.objects.get"))
    found = run(p, spec(checkpoint={"uri": "gs://theirs/llm"}, code="gs://theirs/code/t.tar.gz"))
    for name in ("checkpoint.uri", "code"):
        assert found[name].ok and found[name].note and "not judged" in found[name].detail, found[name]
        assert "403 you@example.com does not have" in found[name].detail


def test_a_code_folder_submit_packs_is_not_looked_for_in_the_bucket():
    p = healthy()
    p.objects.buckets = set()  # a tarball not uploaded yet: doctor packs the folder as submit does, uploads nothing
    t = target()
    checked = doctor.spec_checks(p, t, spec(code=f"gs://{BUCKET}/code/abc.tar.gz"), TRAINER, packed=True)
    found = {r.name: r for r in doctor.run(checked, 5.0)}["code"]
    assert found.ok and not found.note and "local: respawn submit packs it and uploads it" in found.detail
    assert p.objects.calls == []


def _tpu_metric(name: str, unit: str, buckets: list[tuple[dict, str]]) -> dict:
    return {"metric": f"tpu.googleapis.com/{name}", "displayName": name, "consumerQuotaLimits": [
        {"unit": unit, "quotaBuckets": [{"dimensions": d, "effectiveLimit": v} for d, v in buckets]}]}


TPU_SPEC = {"machine_type": None, "zones": ["us-central2-b", "europe-west4-a"],
            "tpu": {"type": "v4-8", "runtime_version": "tpu-ubuntu2204-base"}}


def test_a_tpu_spec_fails_a_zone_where_every_cloud_tpu_quota_is_zero_and_says_the_open_ones_elsewhere():
    p = healthy()
    p.tpu_metrics = [
        _tpu_metric("TPU v4 chips", "1/{project}/{zone}", [({}, "0"), ({"zone": "us-central2-b"}, "32")]),
        _tpu_metric("Preemptible TPU v4 chips", "1/{project}/{zone}", [({}, "0")]),
        _tpu_metric("TPU API requests", "1/min/{project}", [({}, "600")]),  # no zone: not a capacity quota
    ]
    found = run(p, spec(**TPU_SPEC))
    central, west = found["TPU quota in us-central2-b"], found["TPU quota in europe-west4-a"]
    assert central.ok and central.note and "TPU v4 chips 32" in central.detail
    assert "Cloud TPU decides at create" in central.detail and "Preemptible" not in central.detail
    assert not west.ok and "every Cloud TPU quota in europe-west4-a is 0 (TPU v4 chips, Preemptible TPU v4 chips)" \
        in west.detail
    assert "iam-admin/quotas?project=respawn-proj" in west.fix and "drop europe-west4-a" in west.fix
    assert not any(n.startswith("GPU quota") or n.startswith("quota in") for n in found)


# -- independence and timeouts ----------------------------------------------------------------------
def test_a_check_that_hangs_times_out_alone_and_the_others_answer():
    p = healthy()
    p.hang.add("log_metrics")  # read by that check alone
    started = time.monotonic()
    found = run(p, timeout=0.5)
    assert time.monotonic() - started < 1.5
    assert [n for n, r in found.items() if not r.ok] == ["log-based metrics"]
    assert found["log-based metrics"].detail == "no answer in time"


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
                                                         f"function {deploy.ON_AUDIT}", "scheduler may invoke tick",
                                                         "triggers may invoke on_object and on_audit",
                                                         "on_object's trigger receives events"}
    assert found[f"function {deploy.TICK}"].detail == "503 backend error"


def test_the_trainer_s_read_of_code_tarballs_only_is_not_a_read_of_the_records():
    p = healthy()
    code = f'resource.name.startsWith("projects/_/buckets/{BUCKET}/objects/code/")'
    p.bucket_bindings.append({"role": "roles/storage.objectViewer", "members": [f"serviceAccount:{TRAINER}"],
                              "condition": {"title": "respawn-trainer-code-read-only", "expression": code}})
    assert run(p)["trainer cannot read the bucket"].ok
    p.bucket_bindings[-1]["condition"]["expression"] = f'resource.name.startsWith("projects/_/buckets/{BUCKET}/objects/")'
    assert not run(p)["trainer cannot read the bucket"].ok


def test_the_trainer_s_read_of_the_vm_scripts_only_is_not_a_read_of_the_records():
    p = healthy()
    assert run(p)["trainer cannot read the bucket"].ok  # deploy's read of respawn/vm/
    scripts = next(x for x in p.bucket_bindings if x.get("condition", {}).get("title") == deploy.TRAINER_SCRIPTS_CONDITION_TITLE)
    scripts["condition"]["expression"] = f'resource.name.startsWith("projects/_/buckets/{BUCKET}/objects/respawn/")'
    assert not run(p)["trainer cannot read the bucket"].ok


def test_a_trainer_that_may_not_read_the_vm_scripts_fails_bucket_iam_with_the_step_that_grants_it():
    p = healthy()
    p.bucket_bindings = [x for x in p.bucket_bindings
                         if x.get("condition", {}).get("title") != deploy.TRAINER_SCRIPTS_CONDITION_TITLE]
    found = run(p)["bucket IAM"]
    assert not found.ok and "may not read the VM scripts (respawn/vm/): no VM can start its agent" in found.detail
    assert f"{DEPLOY_FROM} trainer-scripts" in found.fix


# -- who may do what: judged by what each role grants (issue 35, item 10) --------------------------------
def test_a_controller_without_its_compute_role_fails_and_a_custom_role_is_judged_by_its_permissions():
    # Doctor was all ✓ with no Compute role at all: the controller could create no VM.
    p = healthy()
    _unbind(p.project_bindings, "roles/compute.instanceAdmin.v1")
    assert not run(p)[f"controller's grants in {PROJECT}"].ok
    narrow = f"projects/{PROJECT}/roles/respawnCompute"
    p.roles[narrow] = {"name": narrow, "includedPermissions": list(grants.COMPUTE), "stage": "GA"}
    p.project_bindings.append({"role": narrow, "members": [f"serviceAccount:{CONTROLLER}"]})
    found = run(p)[f"controller's grants in {PROJECT}"]
    assert found.ok and narrow in found.detail  # the narrower role IAM.md describes does
    p.roles[narrow]["includedPermissions"].remove("compute.disks.create")
    found = run(p)[f"controller's grants in {PROJECT}"]
    assert not found.ok and "lacks compute.disks.create on project" in found.detail
    p.roles[narrow]["deleted"] = True  # a deleted role grants nothing
    assert "and 10 more" in run(p)[f"controller's grants in {PROJECT}"].detail


def test_a_conditioned_grant_or_a_role_iam_will_not_describe_is_no_grant_and_said_so():
    p = healthy()
    for binding in p.project_bindings:
        if binding["role"] == "roles/compute.instanceAdmin.v1":
            binding["condition"] = {"title": "t", "expression": "request.time < timestamp('2020-01-01T00:00:00Z')"}
    hidden = "organizations/1/roles/computeish"
    p.project_bindings.append({"role": hidden, "members": [f"serviceAccount:{CONTROLLER}"]})
    found = run(p)[f"controller's grants in {PROJECT}"]
    assert not found.ok and f"roles IAM would not describe: {hidden}" in found.detail


def test_the_tpu_role_is_checked_where_tpu_types_are_allowed():
    p = healthy()
    _unbind(p.project_bindings, "roles/tpu.admin")
    assert run(p)[f"controller's grants in {PROJECT}"].ok
    found = run(p, tpu=True)[f"controller's grants in {PROJECT}"]
    assert not found.ok and "lacks tpu.nodes.create" in found.detail and "--role=roles/tpu.admin" in found.fix


def test_a_tpu_slice_in_compute_engine_needs_the_mig_permissions_and_never_the_tpu_api():
    p = healthy()
    p.disabled.add("tpu.googleapis.com")
    narrow = f"projects/{PROJECT}/roles/respawnCompute"
    _unbind(p.project_bindings, "roles/compute.instanceAdmin.v1")
    p.roles[narrow] = {"name": narrow, "includedPermissions": list(grants.COMPUTE), "stage": "GA"}
    p.project_bindings.append({"role": narrow, "members": [f"serviceAccount:{CONTROLLER}"]})
    slices = dataclasses.replace(target(), slices=True)
    found = {r.name: r for r in doctor.run(doctor.checks(p, slices, now=lambda: NOW), 5.0)}
    assert found["APIs"].ok, "a TPU7x job needs no Cloud TPU API"
    grant = found[f"controller's grants in {PROJECT}"]
    assert not grant.ok and "compute.instanceGroupManagers.create" in grant.detail
    assert run(p)[f"controller's grants in {PROJECT}"].ok, "a VM job needs none of them"
    p.roles[narrow]["includedPermissions"] += list(grants.SLICES)
    found = {r.name: r for r in doctor.run(doctor.checks(p, slices, now=lambda: NOW), 5.0)}
    assert found[f"controller's grants in {PROJECT}"].ok and "TPU slices (MIGs)" in found[
        f"controller's grants in {PROJECT}"].detail
    checked = {r.name: r for r in doctor.run(doctor.spec_checks(p, slices, spec(
        zones=["us-central1-c"], machine_type=None, tpu={"machine_type": "tpu7x-standard-4t", "topology": "2x2x2"}),
        TRAINER), 5.0)}
    assert not any("quota" in name for name in checked) and checked["service account"].ok


def test_each_other_watched_project_is_checked_for_the_controllers_grants_there():
    p = healthy()
    p.other_projects["other-proj"] = [{"role": "roles/compute.instanceAdmin.v1",
                                       "members": [f"serviceAccount:{CONTROLLER}"]}]
    t = dataclasses.replace(target(), watched=("other-proj",))
    found = {r.name: r for r in doctor.run(doctor.checks(p, t, now=lambda: NOW), 5.0)}
    assert found[f"controller's grants in {PROJECT}"].ok and found["controller's grants in other-proj"].ok
    # The controller reads no Cloud Logging there (an audit entry only wakes a pass): Compute alone.
    p.other_projects["other-proj"] = []
    there = {r.name: r for r in doctor.run(doctor.checks(p, t, now=lambda: NOW), 5.0)}["controller's grants in other-proj"]
    assert not there.ok and "compute.instances.create" in there.detail
    assert f"{DEPLOY_FROM} controller-compute@other-proj" in there.fix
    p.other_projects["other-proj"].append({"role": "roles/compute.instanceAdmin.v1",
                                           "members": [f"serviceAccount:{CONTROLLER}"]})
    again = {r.name: r for r in doctor.run(doctor.checks(p, t, now=lambda: NOW), 5.0)}
    assert again["controller's grants in other-proj"].ok


def test_a_last_pass_that_recorded_errors_fails_saying_where_to_read_them():
    # "controller last ran" passed whatever errors the pass recorded: a controller failing every job looked fine.
    p = healthy()
    p.record = lastpass.LastPass(NOW - timedelta(seconds=30), 0.9, 4, 0, 3)
    found = run(p)["controller last ran"]
    assert not found.ok and "its last pass failed on 3 jobs" in found.detail
    assert f"gcloud functions logs read {deploy.TICK} --gen2 --region={REGION} --project={PROJECT}" in found.fix
    assert "respawn status" in found.fix


def test_a_sink_exclusion_in_force_fails_the_sink_and_a_disabled_one_does_not():
    # A sink whose exclusion drops the preemptions exported nothing respawn needs, and passed.
    p = healthy()
    p.sinks[deploy.AUDIT_SINK]["exclusions"] = [
        {"name": "off", "filter": "severity<ERROR", "disabled": True},
        {"name": "quiet", "filter": 'protoPayload.methodName="compute.instances.preempted"'}]
    found = run(p)[f"audit sink {deploy.AUDIT_SINK}"]
    assert not found.ok and "its exclusion quiet drops entries its filter selects" in found.detail
    assert "off" not in found.detail and "--clear-exclusions" in found.fix
    p.sinks[deploy.AUDIT_SINK]["exclusions"][1]["disabled"] = True
    assert run(p)[f"audit sink {deploy.AUDIT_SINK}"].ok


def test_a_pubsub_agent_without_its_token_role_is_said_with_its_fix_never_failed():
    p = healthy()
    _unbind(p.project_bindings, "roles/pubsub.serviceAgent")  # as in a project made before April 2021
    found = run(p)["service agents"]
    assert found.ok and found.note and "before April 8, 2021" in found.detail
    assert (f"gcloud projects add-iam-policy-binding {PROJECT} --member=serviceAccount:{PUBSUB_AGENT} "
            "--role=roles/iam.serviceAccountTokenCreator --condition=None") == found.fix
    shown = [str(line) for line in doctor.render([found])]
    assert shown[0].startswith("! service agents") and shown[1].startswith("    fix: gcloud projects")


def test_a_custom_role_deleted_disabled_missing_or_granting_less_fails_naming_what_brings_it_back():
    p = healthy()
    p.roles[CUSTOM]["deleted"] = True
    found = run(p)[f"custom role {deploy.TRAINER_ROLE_ID}"]
    assert not found.ok and "it is deleted: it grants nothing" in found.detail
    assert found.fix.splitlines()[0] == f"gcloud iam roles undelete respawnVmRecords --project={PROJECT}"
    p.roles[CUSTOM].update(deleted=False, includedPermissions=["storage.objects.create"])
    assert "it lacks storage.objects.delete" in run(p)[f"custom role {deploy.TRAINER_ROLE_ID}"].detail
    del p.roles[CUSTOM]
    found = run(p)[f"custom role {deploy.TRAINER_ROLE_ID}"]
    assert not found.ok and "does not exist" in found.detail and found.fix == f"{DEPLOY_FROM} trainer-role"


def test_everyone_who_may_read_the_bucket_beyond_the_controller_is_named_with_the_role():
    p = healthy()
    p.bucket_bindings.append({"role": "roles/storage.objectViewer", "members": ["group:ml-team@example.com"]})
    p.bucket_bindings.append({"role": "roles/storage.legacyBucketReader", "members": [f"projectViewer:{PROJECT}"]})
    found = run(p)["who may read the bucket"]
    assert found.ok and found.note
    assert "besides the controller, 2 may read every spec (its env) and every record" in found.detail
    assert "group:ml-team@example.com (roles/storage.objectViewer)" in found.detail
    assert "user:you@example.com (roles/owner)" in found.detail and "projectViewer" not in found.detail


# -- the fan-out (respawn deploy --shards K) --------------------------------------------------------
def run_sharded(p: MemoryProject, k: int = 4) -> dict[str, doctor.Result]:
    t = dataclasses.replace(target(), shards=k)
    return {r.name: r for r in doctor.run(doctor.checks(p, t, now=lambda: NOW), 5.0)}


def test_with_shards_doctor_passes_on_what_deploy_leaves_and_says_so():
    results = run_sharded(healthy().shard(4))
    assert all(r.ok for r in results.values()), [r for r in results.values() if not r.ok]
    assert "respawn-on-shard ACTIVE" in results["4 shards"].detail


def test_without_shards_doctor_checks_no_fan_out():
    assert not [name for name in run(healthy()) if "shards" in name]


@pytest.mark.parametrize("break_it, says, fix", [
    (lambda p: p.topics.pop(deploy.SHARD_TOPIC), "does not exist", f"{DEPLOY_FROM} shard-topic"),
    (lambda p: p.topics.__setitem__(deploy.SHARD_TOPIC, []), "lacks pubsub.topics.publish",
     f"{DEPLOY_FROM} shard-publisher"),
    (lambda p: p.functions[deploy.ON_SHARD]["eventTrigger"].__setitem__("pubsubTopic", "projects/x/topics/y"),
     "not google.cloud.pubsub.topic.v1.messagePublished on", f"{DEPLOY_FROM} on-shard"),
    (lambda p: p.functions.pop(deploy.ON_SHARD), "not deployed", f"{DEPLOY_FROM} on-shard"),
    (lambda p: p.functions[deploy.TICK]["serviceConfig"]["environmentVariables"].pop("RESPAWN_SHARDS"),
     "RESPAWN_SHARDS=1, not 4", "--shards 4"),
    (lambda p: p.run_services[f"{SERVICES}/{deploy.ON_SHARD}"].clear(), "lacks run.routes.invoke",
     "add-invoker-policy-binding respawn-on-shard"),
])
def test_a_broken_fan_out_fails_the_shards_check_alone_with_its_fix(break_it, says, fix):
    p = healthy().shard(4)
    break_it(p)
    results = run_sharded(p)
    assert [name for name, r in results.items() if not r.ok] == ["4 shards"]
    assert says in results["4 shards"].detail and fix in results["4 shards"].fix


# -- a spec's container image (controller.cli.imagecheck) -------------------------------------------
IMAGE = f"us-central1-docker.pkg.dev/{PROJECT}/images/trainer"
REPOSITORY = f"projects/{PROJECT}/locations/us-central1/repositories/images"
DEBIAN = {"image_family": "debian-12", "image_project": "debian-cloud"}


def image_spec(image: str = f"{IMAGE}:v1", **over):
    return spec(image=image, boot_disk=DEBIAN, **over)


def test_an_image_on_artifact_registry_passes_when_it_exists_and_the_trainer_may_pull_it():
    p = healthy()
    digest = p.push(f"{IMAGE}:v1")
    found = run(p, image_spec())
    assert [n for n, r in found.items() if not r.ok] == []
    assert found["container image"].detail == f"{IMAGE}:v1 exists ({digest})"
    assert found["container image pull"].detail == f"{TRAINER} may pull it (roles/artifactregistry.reader on project {PROJECT})"
    assert not found["container image pull"].note and run(p, image_spec(f"{IMAGE}@{digest}"))["container image"].ok


def test_an_image_tag_that_does_not_exist_fails_naming_how_to_list_the_images():
    p = healthy()
    p.push(f"{IMAGE}:v1")
    found = run(p, image_spec(f"{IMAGE}:v2"))["container image"]
    assert not found.ok and found.detail == f"{IMAGE} has no tag v2: no VM can pull {IMAGE}:v2"
    assert found.fix.startswith(f"gcloud artifacts docker images list {IMAGE} --include-tags")
    missing = run(p, image_spec(f"{IMAGE}@sha256:{'1' * 64}"))["container image"]
    assert not missing.ok and f"has no digest sha256:{'1' * 64}" in missing.detail


def test_an_image_whose_repository_does_not_exist_fails_once_and_its_pull_is_not_judged():
    found = run(healthy(), image_spec())
    image, pull = found["container image"], found["container image pull"]
    assert not image.ok and image.detail == f"repository {REPOSITORY} does not exist (or you may not see it)"
    assert "gcloud artifacts repositories create images --repository-format=docker" in image.fix
    assert pull.ok and pull.note and "not judged" in pull.detail


def test_a_trainer_that_may_not_pull_fails_naming_the_repository_binding_that_fixes_it():
    p = healthy()
    p.push(f"{IMAGE}:v1")
    p.project_bindings = [b for b in p.project_bindings if b["role"] != deploy.TRAINER_REGISTRY_ROLE]
    pull = run(p, image_spec())["container image pull"]
    assert not pull.ok and pull.detail.startswith(
        f"{TRAINER} (the account its VMs run as) lacks artifactregistry.repositories.downloadArtifacts on {REPOSITORY}")
    assert pull.fix == (f"gcloud artifacts repositories add-iam-policy-binding images --location=us-central1 "
                        f"--project={PROJECT} --member=serviceAccount:{TRAINER} --role=roles/artifactregistry.reader")
    p.repositories[REPOSITORY] = [{"role": "roles/artifactregistry.writer", "members": [f"serviceAccount:{TRAINER}"]}]
    assert run(p, image_spec())["container image pull"].detail == f"{TRAINER} may pull it (roles/artifactregistry.writer on {REPOSITORY})"
    p.repositories[REPOSITORY] = [{"role": "roles/artifactregistry.reader", "members": [f"serviceAccount:{TRAINER}"],
                                   "condition": {"expression": "request.time < timestamp('2020-01-01T00:00:00Z')"}}]
    assert not run(p, image_spec())["container image pull"].ok  # a conditioned binding is not counted on
    p.repositories[REPOSITORY] = [{"role": "roles/artifactregistry.reader", "members": ["allUsers"]}]
    assert run(p, image_spec())["container image pull"].detail == f"{REPOSITORY} is public (allUsers may pull from {REPOSITORY})"


def test_the_account_judged_is_the_one_the_spec_runs_as():
    other = f"other@{PROJECT}.iam.gserviceaccount.com"
    p = healthy()
    p.push(f"{IMAGE}:v1")
    p.accounts[other] = [{"role": "roles/iam.serviceAccountUser", "members": [f"serviceAccount:{CONTROLLER}"]}]
    pull = run(p, image_spec(service_account={"email": other}))["container image pull"]
    assert not pull.ok and pull.detail.startswith(f"{other} (the account its VMs run as) lacks")


def test_a_repository_policy_doctor_may_not_read_leaves_the_judgment_to_the_project_s():
    p = healthy()
    p.push(f"{IMAGE}:v1")
    p.failures["repository_policy"] = errors.RequestError("403 the caller lacks artifactregistry.repositories.getIamPolicy")
    assert run(p, image_spec())["container image pull"].ok  # the project's grant is enough
    p.project_bindings = [b for b in p.project_bindings if b["role"] != deploy.TRAINER_REGISTRY_ROLE]
    pull = run(p, image_spec())["container image pull"]
    assert pull.ok and pull.note and pull.detail.startswith(f"not judged: could not read {REPOSITORY}'s policy (403")
    assert "add-iam-policy-binding images" in pull.fix


@pytest.mark.parametrize("image", ["pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime", "gcr.io/my-proj/trainer:1",
                                   f"nvcr.io/nvidia/nemo@sha256:{'2' * 64}"])
def test_an_image_elsewhere_is_said_not_checked_and_why(image):
    found = run(healthy(), image_spec(image))
    assert "container image pull" not in found
    said = found["container image"]
    assert said.ok and said.note and "is not on Artifact Registry: not checked" in said.detail
    assert "LOCATION-docker.pkg.dev" in said.detail


def test_a_spec_without_an_image_has_no_container_check():
    assert "container image" not in run(healthy(), spec())


def test_a_mistyped_bucket_is_fixed_by_setting_respawn_bucket_to_the_deployed_one_never_by_making_it():
    p = healthy()  # deployed on BUCKET
    t = doctor.Target(PROJECT, "respawn-buckett", REGION, CONTROLLER, TRAINER)
    found = {r.name: r for r in doctor.run(doctor.checks(p, t, now=lambda: NOW), 5.0)}
    assert not found["bucket"].ok
    assert found["bucket"].detail == (f"gs://respawn-buckett does not exist, and the deployed controller "
                                      f"({deploy.ON_OBJECT}) uses gs://{BUCKET}")
    assert found["bucket"].fix.startswith(f"export RESPAWN_BUCKET={BUCKET}")
    on_object = found[f"function {deploy.ON_OBJECT}"]
    assert not on_object.ok and on_object.fix.startswith(f"export RESPAWN_BUCKET={BUCKET}")
    for result in found.values():
        assert "buckets create gs://respawn-buckett" not in (result.fix or "")
        assert "--bucket=respawn-buckett" not in (result.fix or "")


def test_with_a_mistyped_bucket_every_check_that_needs_it_gives_the_bucket_checks_fix_never_create_it():
    """Issue 39: the bucket check said `export RESPAWN_BUCKET=<deployed bucket>`, while the checks that
    depend on it said "fix: create it first (see the bucket check)" (and two, no fix at all)."""
    t = doctor.Target(PROJECT, "respawn-buckett", REGION, CONTROLLER, TRAINER)
    found = {r.name: r for r in doctor.run(doctor.checks(healthy(), t, now=lambda: NOW), 5.0)}
    dependent = ["uniform bucket-level access", "bucket writable", "trainer cannot read the bucket", "bucket IAM",
                 "checkpoints bucket", "controller last ran", "preemption notice", "who may read the bucket"]
    for name in dependent:
        assert not found[name].ok and found[name].detail == "gs://respawn-buckett does not exist", name
        assert found[name].fix == (f"export RESPAWN_BUCKET={BUCKET}  # see the bucket check: the deployed "
                                   "controller's"), (name, found[name].fix)
    assert not any("create" in (r.fix or "") for r in found.values())
    # A bucket simply not there (no deployment on another): each says to make it, as the bucket check does.
    p = healthy()
    del p.functions[deploy.ON_OBJECT]
    found = {r.name: r for r in doctor.run(doctor.checks(p, t, now=lambda: NOW), 5.0)}
    assert found["bucket"].fix.startswith("gcloud storage buckets create gs://respawn-buckett")
    for name in dependent:
        assert found[name].fix.startswith("create it first (see the bucket check)"), (name, found[name].fix)
    assert found["uniform bucket-level access"].fix.endswith(
        f", then respawn deploy --project={PROJECT} --region={REGION} --bucket=respawn-buckett")


def test_doctor_checks_the_checkpoints_bucket_is_there_and_the_trainer_and_controller_grants_on_it_with_the_fix():
    found = run(healthy())["checkpoints bucket"]
    assert found.ok and not found.note and found.detail == (
        f"gs://{CHECKPOINTS}: the trainer may read and write it (roles/storage.objectUser), the controller list it "
        "(roles/storage.objectViewer)")
    # not there (a deploy older than it): how to make it, and the grants, or the deploy step that does
    p = healthy()
    del p.other_buckets[CHECKPOINTS]
    found = run(p)
    assert [n for n, r in found.items() if not r.ok] == ["checkpoints bucket"]
    gone = found["checkpoints bucket"]
    assert gone.detail.startswith(f"gs://{CHECKPOINTS} does not exist: respawn run's default checkpoints")
    assert gone.fix.splitlines() == [
        f"gcloud storage buckets create gs://{CHECKPOINTS} --project={PROJECT} --location={REGION} "
        "--uniform-bucket-level-access --public-access-prevention",
        f"gcloud storage buckets add-iam-policy-binding gs://{CHECKPOINTS} --member=serviceAccount:{TRAINER} "
        f"--role=roles/storage.objectUser --condition=None --project={PROJECT}",
        f"gcloud storage buckets add-iam-policy-binding gs://{CHECKPOINTS} --member=serviceAccount:{CONTROLLER} "
        f"--role=roles/storage.objectViewer --condition=None --project={PROJECT}",
        f"# or: {DEPLOY_FROM} checkpoints-bucket"]
    # the controller may not list it: its own fix alone
    p = healthy()
    _unbind(p.other_buckets[CHECKPOINTS], "roles/storage.objectViewer")
    found = run(p)["checkpoints bucket"]
    assert not found.ok and f"the controller ({CONTROLLER}) lacks storage.objects.get, storage.objects.list on " \
        f"gs://{CHECKPOINTS}" in found.detail and "cannot find a job's latest checkpoint" in found.detail
    assert found.fix == (f"gcloud storage buckets add-iam-policy-binding gs://{CHECKPOINTS} "
                         f"--member=serviceAccount:{CONTROLLER} --role=roles/storage.objectViewer --condition=None "
                         f"--project={PROJECT}")
    # ...which a project role of the controller's may give instead; a trainer's grant conditioned to a prefix
    # is none (listing is checked against the bucket)
    p.project_bindings.append({"role": "roles/storage.objectViewer", "members": [f"serviceAccount:{CONTROLLER}"]})
    for x in p.other_buckets[CHECKPOINTS]:
        if x["role"] == "roles/storage.objectUser":
            x["condition"] = {"title": "mine", "expression": 'resource.name.startsWith("projects/_/buckets/x/objects/a/")'}
    found = run(p)["checkpoints bucket"]
    assert not found.ok and found.detail.startswith(f"the trainer ({TRAINER}) lacks") and CONTROLLER not in found.fix


def test_a_control_bucket_that_leaves_no_checkpoints_bucket_is_said_never_failed():
    long = "b" * 52
    p = MemoryProject.deployed(PROJECT, long, REGION, NOW - timedelta(seconds=40))
    t = doctor.Target(PROJECT, long, REGION, CONTROLLER, TRAINER)
    found = {r.name: r for r in doctor.run(doctor.checks(p, t, now=lambda: NOW), 5.0)}["checkpoints bucket"]
    assert found.ok and found.note
    assert found.detail == (f"none: gs://{long}-checkpoints would be 64 characters long, and a bucket name is at most "
                            "63 (a control bucket of at most 51 has one): respawn run asks each job for --checkpoint "
                            "gs://...")
