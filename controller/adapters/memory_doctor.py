"""A project in memory, as ``respawn deploy`` leaves it, for ``respawn doctor``'s checks
(controller.cli.doctor.Apis). Every field is plain data a test changes to break one thing."""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import yaml

from controller.cli import deploy, grants
from controller.core import audit, errors, imageref
from controller.core.quotas import QuotaUse
from controller.service import lastpass

FUNCTION_STATES = ("ACTIVE",)
NUMBER = "123456789012"
STORAGE_AGENT = f"service-{NUMBER}@gs-project-accounts.iam.gserviceaccount.com"
PUBSUB_AGENT = f"service-{NUMBER}@gcp-sa-pubsub.iam.gserviceaccount.com"
_AR_READ = ("artifactregistry.repositories.downloadArtifacts", "artifactregistry.repositories.get",
            "artifactregistry.repositories.list", "artifactregistry.tags.get", "artifactregistry.tags.list",
            "artifactregistry.versions.get", "artifactregistry.dockerimages.get", "artifactregistry.dockerimages.list")
_AR_WRITE = (*_AR_READ, "artifactregistry.repositories.uploadArtifacts", "artifactregistry.tags.create",
             "artifactregistry.tags.update")
_AR_REPO_ADMIN = (*_AR_WRITE, "artifactregistry.repositories.deleteArtifacts", "artifactregistry.tags.delete",
                  "artifactregistry.versions.delete")
# What IAM's roles.get lists for the predefined roles a deployed project holds: the permissions
# respawn checks (controller.cli.grants) and a few others of each, as Google documents the roles;
# a subset, never the whole list.
PREDEFINED = {
    "roles/owner": ("storage.objects.get", "storage.objects.list", "storage.objects.create", "storage.objects.delete",
                    "resourcemanager.projects.setIamPolicy", "run.routes.invoke", "pubsub.topics.publish"),
    "roles/compute.instanceAdmin.v1": (*grants.COMPUTE, *grants.SLICES, "compute.instances.start", "compute.instances.stop"),
    "roles/tpu.admin": (*grants.TPU, "tpu.nodes.start", "tpu.nodes.stop"),
    "roles/logging.viewer": ("logging.logEntries.list", "logging.logMetrics.list", "logging.sinks.list"),
    "roles/logging.logWriter": ("logging.logEntries.create", "logging.logEntries.route"),
    "roles/eventarc.eventReceiver": ("eventarc.events.receiveEvent", "eventarc.events.receiveAuditLogWritten"),
    "roles/run.invoker": ("run.routes.invoke", "run.jobs.run"),
    "roles/pubsub.publisher": ("pubsub.topics.publish",),
    "roles/pubsub.serviceAgent": ("iam.serviceAccounts.getOpenIdToken", "iam.serviceAccounts.getAccessToken",
                                  "pubsub.topics.publish"),
    "roles/iam.serviceAccountUser": ("iam.serviceAccounts.actAs", "iam.serviceAccounts.get"),
    "roles/storage.objectUser": ("storage.objects.create", "storage.objects.delete", "storage.objects.get",
                                 "storage.objects.list", "storage.objects.update", "storage.objects.restore"),
    "roles/storage.objectViewer": ("storage.objects.get", "storage.objects.list"),
    "roles/storage.legacyBucketOwner": ("storage.buckets.get", "storage.buckets.update", "storage.objects.list",
                                        "storage.objects.create", "storage.objects.delete"),
    "roles/storage.legacyBucketReader": ("storage.buckets.get", "storage.objects.list"),
    # Artifact Registry's, each holding the one before it: pull (downloadArtifacts), push, delete, administer.
    "roles/artifactregistry.reader": _AR_READ,
    "roles/artifactregistry.writer": _AR_WRITE,
    "roles/artifactregistry.repoAdmin": _AR_REPO_ADMIN,
    "roles/artifactregistry.admin": (*_AR_REPO_ADMIN, "artifactregistry.repositories.create",
                                     "artifactregistry.repositories.delete", "artifactregistry.repositories.getIamPolicy",
                                     "artifactregistry.repositories.setIamPolicy"),
}


@dataclass
class MemoryProject:
    project_id: str
    bucket_name: str
    region: str
    controller_sa: str
    trainer_sa: str
    now: datetime
    principal: str | None = "you@example.com"
    state: str = "ACTIVE"
    disabled: set[str] = field(default_factory=set)  # "compute.googleapis.com", ...
    bucket_exists: bool = True
    other_buckets: set[str] = field(default_factory=set)  # buckets besides the control bucket (a spec's checkpoints)
    uniform: bool = True
    writable: bool = True
    probes: list[str] = field(default_factory=list)  # objects written (and deleted) by write_probe
    bucket_bindings: list[dict[str, Any]] = field(default_factory=list)
    project_bindings: list[dict[str, Any]] = field(default_factory=list)
    accounts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # email -> its policy's bindings
    functions: dict[str, dict[str, Any]] = field(default_factory=dict)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    sinks: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> Logging v2 LogSink
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> Logging v2 LogMetric
    topics: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # topic id -> its policy's bindings
    record: lastpass.LastPass | None = None
    quota_table: dict[str, dict[str, QuotaUse]] = field(default_factory=dict)  # region -> metric -> use
    images: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (project, name | family/F)
    other_projects: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # watched project -> its bindings
    roles: dict[str, dict[str, Any]] = field(default_factory=dict)  # role name -> IAM v1 Role
    # Artifact Registry: repository name -> its bindings; tag or version name (.../packages/P/tags/T,
    # .../versions/sha256:D) -> Artifact Registry v1 Tag or Version
    repositories: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    artifacts: dict[str, dict[str, Any]] = field(default_factory=dict)
    run_services: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # Cloud Run service -> bindings
    tpu_metrics: list[dict[str, Any]] = field(default_factory=list)  # tpu.googleapis.com's ConsumerQuotaMetrics
    hang: set[str] = field(default_factory=set)  # method names that answer only after hang_seconds
    hang_seconds: float = 2.0
    failures: dict[str, Exception] = field(default_factory=dict)  # method name -> raised

    @classmethod
    def deployed(cls, project: str, bucket: str, region: str, now: datetime, **kw: Any) -> MemoryProject:
        """What a successful ``respawn deploy`` and a tick a few seconds ago leave."""
        controller = deploy.account_email("respawn-controller", project)
        trainer = deploy.account_email(deploy.TRAINER_ACCOUNT_ID, project)
        scheduler = deploy.account_email("respawn-scheduler", project)
        base = f"projects/{project}/locations/{region}"
        me = cls(project, bucket, region, controller, trainer, now, **kw)
        me.bucket_bindings = [
            {"role": "roles/storage.objectUser", "members": [f"serviceAccount:{controller}"]},
            {"role": f"projects/{project}/roles/{deploy.TRAINER_ROLE_ID}", "members": [f"serviceAccount:{trainer}"],
             "condition": {"title": deploy.TRAINER_CONDITION_TITLE, "expression": deploy.trainer_condition(bucket)}},
            {"role": "roles/storage.legacyBucketOwner", "members": [f"projectOwner:{project}"]},
            {"role": "roles/storage.objectViewer", "members": [f"serviceAccount:{trainer}"],
             "condition": {"title": deploy.TRAINER_SCRIPTS_CONDITION_TITLE,
                           "expression": deploy.trainer_scripts_condition(bucket)}},
        ]
        writer = "serviceAccount:service-123456789012@gcp-sa-logging.iam.gserviceaccount.com"
        me.project_bindings = [
            {"role": "roles/logging.logWriter", "members": [f"serviceAccount:{trainer}"]},
            {"role": deploy.TRAINER_REGISTRY_ROLE, "members": [f"serviceAccount:{trainer}"]},
            {"role": "roles/owner", "members": ["user:you@example.com"]},
            {"role": "roles/compute.instanceAdmin.v1", "members": [f"serviceAccount:{controller}"]},
            {"role": "roles/tpu.admin", "members": [f"serviceAccount:{controller}"]},
            {"role": "roles/logging.logWriter", "members": [f"serviceAccount:{controller}"]},
            {"role": "roles/eventarc.eventReceiver", "members": [f"serviceAccount:{controller}"]},
            {"role": "roles/pubsub.publisher", "members": [f"serviceAccount:{STORAGE_AGENT}"]},
            {"role": "roles/pubsub.serviceAgent", "members": [f"serviceAccount:{PUBSUB_AGENT}"]},
        ]
        me.roles = {name: {"name": name, "includedPermissions": list(permissions), "stage": "GA"}
                    for name, permissions in PREDEFINED.items()}
        custom = f"projects/{project}/roles/{deploy.TRAINER_ROLE_ID}"
        me.roles[custom] = {"name": custom, "includedPermissions": list(deploy.TRAINER_PERMISSIONS), "stage": "GA"}
        me.run_services = {f"{base}/services/{deploy.TICK}": [
                           {"role": "roles/run.invoker", "members": [f"serviceAccount:{scheduler}"]}],
                       **{f"{base}/services/{name}": [{"role": "roles/run.invoker",
                                                      "members": [f"serviceAccount:{controller}"]}]
                          for name in (deploy.ON_OBJECT, deploy.ON_AUDIT)}}
        me.accounts = {
            trainer: [{"role": "roles/iam.serviceAccountUser", "members": [f"serviceAccount:{controller}"]}],
            controller: [], scheduler: [],
        }
        me.functions = {
            deploy.TICK: {"name": f"{base}/functions/{deploy.TICK}", "state": "ACTIVE",
                          "serviceConfig": {"uri": f"https://{deploy.TICK}-x.a.run.app",
                                            "serviceAccountEmail": controller,
                                            "service": f"{base}/services/{deploy.TICK}"}},
            deploy.ON_OBJECT: {"name": f"{base}/functions/{deploy.ON_OBJECT}", "state": "ACTIVE",
                               "serviceConfig": {"serviceAccountEmail": controller,
                                                 "service": f"{base}/services/{deploy.ON_OBJECT}"},
                               "eventTrigger": {"eventType": "google.cloud.storage.object.v1.finalized",
                                                "eventFilters": [{"attribute": "bucket", "value": bucket}]}},
            deploy.ON_AUDIT: {"name": f"{base}/functions/{deploy.ON_AUDIT}", "state": "ACTIVE",
                              "serviceConfig": {"serviceAccountEmail": controller,
                                                "service": f"{base}/services/{deploy.ON_AUDIT}"},
                              "eventTrigger": {"eventType": deploy.PUBLISHED, "retryPolicy": "RETRY_POLICY_RETRY",
                                               "pubsubTopic": f"projects/{project}/topics/{deploy.AUDIT_TOPIC}",
                                               "serviceAccountEmail": controller}},
        }
        me.sinks = {deploy.AUDIT_SINK: {"name": deploy.AUDIT_SINK, "destination": deploy.audit_destination(project),
                                        "filter": audit.sink_filter(project), "writerIdentity": writer}}
        me.topics = {deploy.AUDIT_TOPIC: [{"role": "roles/pubsub.publisher", "members": [writer]}]}
        me.metrics = {path.stem: {"name": path.stem, **yaml.safe_load(path.read_text())} for path in deploy.metric_files()}
        me.jobs = {deploy.TICK: {"name": f"{base}/jobs/{deploy.TICK}", "state": "ENABLED", "schedule": "* * * * *",
                                 "status": {}, "lastAttemptTime": now.isoformat(),
                                 "httpTarget": {"uri": f"https://{deploy.TICK}-x.a.run.app",
                                                "oidcToken": {"serviceAccountEmail": scheduler}}}}
        me.record = lastpass.LastPass(now, 0.7, 2, 1, 0)
        return me

    def shard(self, k: int) -> MemoryProject:
        """What ``respawn deploy --shards K`` adds: RESPAWN_SHARDS on the functions, the shards' topic
        with the controller's publisher grant, on_shard triggered by it and invocable by its trigger."""
        base = f"projects/{self.project_id}/locations/{self.region}"
        controller = f"serviceAccount:{self.controller_sa}"
        for found in self.functions.values():
            found.setdefault("serviceConfig", {}).setdefault("environmentVariables", {})["RESPAWN_SHARDS"] = str(k)
        self.topics[deploy.SHARD_TOPIC] = [{"role": "roles/pubsub.publisher", "members": [controller]}]
        self.functions[deploy.ON_SHARD] = {
            "name": f"{base}/functions/{deploy.ON_SHARD}", "state": "ACTIVE",
            "serviceConfig": {"serviceAccountEmail": self.controller_sa, "service": f"{base}/services/{deploy.ON_SHARD}",
                              "environmentVariables": {"RESPAWN_SHARDS": str(k)}},
            "eventTrigger": {"eventType": deploy.PUBLISHED, "serviceAccountEmail": self.controller_sa,
                             "pubsubTopic": f"projects/{self.project_id}/topics/{deploy.SHARD_TOPIC}"}}
        self.run_services[f"{base}/services/{deploy.ON_SHARD}"] = [{"role": "roles/run.invoker", "members": [controller]}]
        return self

    def push(self, image: str, digest: str = "sha256:" + "0" * 64) -> str:
        """An image in the project's Artifact Registry, as ``docker push`` leaves it: its repository
        (with no bindings of its own: the project's apply), its version and its tag. Returns the digest."""
        target = imageref.artifact(imageref.parse(image))
        assert target is not None, f"{image} is no Artifact Registry image"
        self.repositories.setdefault(target.repository_name, [])
        version = f"{target.package_name}/versions/{digest}"
        self.artifacts[version] = {"name": version}
        if target.tag or not target.digest:
            tag = f"{target.package_name}/tags/{target.tag or 'latest'}"
            self.artifacts[tag] = {"name": tag, "version": version}
        return digest

    def quota(self, region: str, metric: str, limit: float, usage: float = 0) -> None:
        self.quota_table.setdefault(region, {})[metric] = QuotaUse(float(limit), float(usage))

    # -- the port ----------------------------------------------------------------------------------
    def whoami(self) -> str:
        self._call("whoami")
        if self.principal is None:
            raise errors.ConfigError("Your default credentials were not found.")
        return self.principal

    def project(self, project: str) -> Mapping[str, Any]:
        self._call("project")
        if project != self.project_id:
            raise errors.NotFound(f"403 the caller may not see projects/{project}, or it does not exist")
        return {"name": f"projects/{NUMBER}", "projectId": project, "state": self.state}

    def services(self, project: str, names: Sequence[str]) -> Mapping[str, str]:
        self._call("services")
        return {n: "DISABLED" if n in self.disabled else "ENABLED" for n in names}

    def bucket(self, bucket: str) -> Mapping[str, Any]:
        self._call("bucket")
        self._bucket(bucket)
        return {"uniform": self.uniform}

    def write_probe(self, bucket: str, name: str) -> None:
        self._call("write_probe")
        self._bucket(bucket)
        if not self.writable:
            raise errors.RequestError(f"403 you@example.com does not have storage.objects.create access to {bucket}")
        self.probes.append(name)

    def bucket_policy(self, bucket: str) -> Sequence[Mapping[str, Any]]:
        self._call("bucket_policy")
        self._bucket(bucket)
        return copy.deepcopy(self.bucket_bindings)

    def project_policy(self, project: str) -> Sequence[Mapping[str, Any]]:
        self._call("project_policy")
        if project != self.project_id:
            if project not in self.other_projects:
                raise errors.NotFound(f"403 the caller may not see projects/{project}, or it does not exist")
            return copy.deepcopy(self.other_projects[project])
        return copy.deepcopy(self.project_bindings)

    def role(self, name: str) -> Mapping[str, Any]:
        self._call("role")
        if name not in self.roles:
            raise errors.NotFound(name)
        return copy.deepcopy(self.roles[name])

    def service_policy(self, service: str) -> Sequence[Mapping[str, Any]]:
        self._call("service_policy")
        if service not in self.run_services:
            raise errors.NotFound(service)
        return copy.deepcopy(self.run_services[service])

    def tpu_quotas(self, project: str) -> Sequence[Mapping[str, Any]]:
        self._call("tpu_quotas")
        return copy.deepcopy(self.tpu_metrics)

    def account(self, email: str) -> Mapping[str, Any]:
        self._call("account")
        if email not in self.accounts:
            raise errors.NotFound(f"serviceAccounts/{email}")
        return {"email": email}

    def account_policy(self, email: str) -> Sequence[Mapping[str, Any]]:
        self._call("account_policy")
        if email not in self.accounts:
            raise errors.NotFound(f"serviceAccounts/{email}")
        return copy.deepcopy(self.accounts[email])

    def function(self, project: str, region: str, name: str) -> Mapping[str, Any]:
        self._call("function")
        if region != self.region or name not in self.functions:
            raise errors.NotFound(f"functions/{name}")
        return copy.deepcopy(self.functions[name])

    def scheduler_job(self, project: str, region: str, name: str) -> Mapping[str, Any]:
        self._call("scheduler_job")
        if region != self.region or name not in self.jobs:
            raise errors.NotFound(f"jobs/{name}")
        return copy.deepcopy(self.jobs[name])

    def sink(self, project: str, name: str) -> Mapping[str, Any]:
        self._call("sink")
        if project != self.project_id or name not in self.sinks:
            raise errors.NotFound(f"projects/{project}/sinks/{name}")
        return copy.deepcopy(self.sinks[name])

    def log_metrics(self, project: str) -> Mapping[str, Mapping[str, Any]]:
        self._call("log_metrics")
        return copy.deepcopy(self.metrics) if project == self.project_id else {}

    def topic(self, project: str, name: str) -> Mapping[str, Any]:
        self._call("topic")
        if project != self.project_id or name not in self.topics:
            raise errors.NotFound(f"projects/{project}/topics/{name}")
        return {"name": f"projects/{project}/topics/{name}"}

    def topic_policy(self, project: str, name: str) -> Sequence[Mapping[str, Any]]:
        self._call("topic_policy")
        if project != self.project_id or name not in self.topics:
            raise errors.NotFound(f"projects/{project}/topics/{name}")
        return copy.deepcopy(self.topics[name])

    def last_pass(self, bucket: str) -> lastpass.LastPass | None:
        self._call("last_pass")
        self._bucket(bucket)
        return self.record

    def region_quotas(self, project: str, region: str) -> dict[str, QuotaUse]:
        self._call("region_quotas")
        return dict(self.quota_table.get(region, {}))

    def image(self, project: str, *, name: str | None = None, family: str | None = None) -> Mapping[str, Any]:
        self._call("image")
        key = (project, f"family/{family}" if family else str(name))
        if key not in self.images:
            raise errors.NotFound(f"projects/{project}/global/images/{key[1]}")
        return copy.deepcopy(self.images[key])

    def repository(self, name: str) -> Mapping[str, Any]:
        self._call("repository")
        if name not in self.repositories:
            raise errors.NotFound(name)
        return {"name": name, "format": "DOCKER"}

    def repository_policy(self, name: str) -> Sequence[Mapping[str, Any]]:
        self._call("repository_policy")
        if name not in self.repositories:
            raise errors.NotFound(name)
        return copy.deepcopy(self.repositories[name])

    def image_tag(self, name: str) -> Mapping[str, Any]:
        self._call("image_tag")
        return self._artifact(name)

    def image_version(self, name: str) -> Mapping[str, Any]:
        self._call("image_version")
        return self._artifact(name)

    def _artifact(self, name: str) -> Mapping[str, Any]:
        if name not in self.artifacts:
            raise errors.NotFound(name)
        return copy.deepcopy(self.artifacts[name])

    def _bucket(self, bucket: str) -> None:
        if bucket in self.other_buckets:
            return
        if not self.bucket_exists or bucket != self.bucket_name:
            raise errors.NotFound(f"gs://{bucket}")

    def _call(self, method: str) -> None:
        if method in self.hang:
            time.sleep(self.hang_seconds)  # longer than the test's check timeout
        if method in self.failures:
            raise self.failures[method]
