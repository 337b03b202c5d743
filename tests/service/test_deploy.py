"""`respawn deploy` on a fresh project: everything it relies on, set up idempotently and resumably.

A fake gcloud (FakeProject) keeps a project's state the way Google does: APIs, buckets and their
settings, service accounts, the custom role, IAM bindings (a set: one binding added twice is one
binding), the Cloud Storage service agent, functions, the Scheduler job. It
refuses what Google refuses in the order deploy runs things (a function before its APIs, a binding
to an account that does not exist, a Cloud Storage trigger outside its bucket's location), and
logs every change it makes: a second deploy must log none.

The last test runs every gcloud command deploy builds through gcloud's own parser (where gcloud
is installed), answered by a server on 127.0.0.1.
"""

from __future__ import annotations

import copy
import dataclasses
import http.server
import json
import os
import re
import shlex
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from controller.cli import deploy
from controller.cli.main import app
from controller.core import audit

PROJECT, NUMBER, REGION, BUCKET = "prod-proj", "123456789012", "us-central1", "prod-bucket"
CHECKPOINTS = f"{BUCKET}-checkpoints"  # respawn run's default place for checkpoints
DOMAIN = f"{PROJECT}.iam.gserviceaccount.com"
CONTROLLER, SCHEDULER, TRAINER = (f"respawn-{k}@{DOMAIN}" for k in ("controller", "scheduler", "trainer"))
AGENT = f"service-{NUMBER}@gs-project-accounts.iam.gserviceaccount.com"
WRITER = f"serviceAccount:service-{NUMBER}@gcp-sa-logging.iam.gserviceaccount.com"  # the sink's writer identity
TICK_URL = "https://respawn-tick-abc-uc.a.run.app"
IAM_MD = Path(__file__).resolve().parents[2] / "deploy" / "IAM.md"
runner = CliRunner()


def _dict_flag(value: str) -> dict[str, str]:
    """A gcloud dict-flag value read back by the rule of `gcloud topic escaping`."""
    delim = ","
    if value.startswith("^") and "^" in value[1:]:
        delim, value = value[1:].split("^", 1)
    return dict(item.split("=", 1) for item in value.split(delim)) if value else {}


def failure(argv: tuple[str, ...], message: str) -> subprocess.CalledProcessError:
    return subprocess.CalledProcessError(1, argv, "", f"ERROR: (gcloud.{'.'.join(argv[1:4])}) {message}\n")


class FakeProject:
    """One Google Cloud project as gcloud, the Scheduler client and the Storage client see it."""

    def __init__(self) -> None:
        self.apis: set[str] = set()
        self.buckets: dict[str, dict[str, Any]] = {}
        self.accounts: set[str] = set()
        self.roles: dict[str, dict[str, Any]] = {}  # id -> includedPermissions, stage, deleted
        self.bindings: set[tuple[str, str, str, str]] = set()  # (resource, member, role, condition title)
        self.agent = False  # the Cloud Storage service agent exists
        self.functions: dict[str, tuple[str, ...]] = {}  # name -> the flags of its last deploy
        # name -> what `gcloud functions describe --format=json` shows: state, labels, variables, account
        self.deployed: dict[str, dict[str, Any]] = {}
        self.secrets: dict[str, list[str]] = {}  # secret id -> its versions' values, oldest first
        self.topics: set[str] = set()
        self.sinks: dict[str, dict[str, Any]] = {}  # name -> destination, filter, disabled, writerIdentity
        self.jobs: dict[str, Any] = {}
        self.metrics: dict[str, dict[str, Any]] = {}  # name -> LogMetric, as its config file set it
        self.changes: list[str] = []
        self.commands: list[tuple[str, ...]] = []
        self.fail_once: dict[str, str] = {}  # step words (e.g. "storage service-agent") -> error, raised once

    def state(self) -> dict[str, Any]:
        return copy.deepcopy({k: v for k, v in vars(self).items() if k not in ("changes", "commands", "fail_once")})

    def _change(self, what: str) -> None:
        self.changes.append(what)

    def _need(self, argv: tuple[str, ...], *apis: str) -> None:
        for api in apis:
            if f"{api}.googleapis.com" not in self.apis:
                raise failure(argv, f"PERMISSION_DENIED: {api}.googleapis.com has not been used in project {PROJECT} "
                                    "before or it is disabled (SERVICE_DISABLED)")

    def _member_exists(self, argv: tuple[str, ...], member: str) -> None:
        email = member.removeprefix("serviceAccount:")
        if email.endswith(DOMAIN) and email not in self.accounts or email == AGENT and not self.agent \
                or member == WRITER and not self.sinks:
            raise failure(argv, f"INVALID_ARGUMENT: Service account {email} does not exist.")

    def _bind(self, argv: tuple[str, ...], resource: str, member: str, role: str, condition: str = "None") -> str:
        self._member_exists(argv, member)
        title = "" if condition == "None" else dict(re.findall(r"(?:^|[;|#~])(\w+)=([^;]*)", condition))["title"]
        binding = (resource, member, role, title)
        if binding not in self.bindings:
            self.bindings.add(binding)
            self._change(f"bind {binding}")
        return ""

    def __call__(self, argv: tuple[str, ...], stdin: str | None = None) -> str:
        argv = tuple(argv)
        self.commands.append(argv)
        words = [a for a in argv[1:] if not a.startswith("--")]
        flags: dict[str, list[str]] = {}
        for a in argv:
            if a.startswith("--"):
                key, _, value = a[2:].partition("=")
                flags.setdefault(key, []).append(value)
        flag = lambda name: flags.get(name, [""])[-1]  # noqa: E731
        for key, message in list(self.fail_once.items()):
            if " ".join(words).startswith(key):
                del self.fail_once[key]
                raise failure(argv, message)
        match words:
            case ["services", "enable", *apis]:
                for api in apis:
                    if api not in self.apis:
                        self.apis.add(api)
                        self._change(f"enable {api}")
                return ""
            case ["projects", "describe", _]:
                assert flag("format") == "value(projectNumber)"
                return f"{NUMBER}\n"
            case ["storage", "buckets", "describe", url]:
                self._need(argv, "storage")
                found = self.buckets.get(url.removeprefix("gs://"))
                if found is None:
                    raise failure(argv, f"{url} not found: 404.")
                if "raw" in flags:
                    return json.dumps(found)
                assert flag("format") == "value(location)"
                return f"{found['location']}\n"
            case ["storage", "buckets", "create", url]:
                self._need(argv, "storage")
                name = url.removeprefix("gs://")
                if name in self.buckets:
                    raise failure(argv, "HTTPError 409: Your previous request to create the named bucket succeeded "
                                        "and you already own it.")
                self.buckets[name] = {"name": name, "projectNumber": NUMBER, "location": flag("location").upper(),
                                      "iamConfiguration": {
                                          "uniformBucketLevelAccess": {"enabled": "uniform-bucket-level-access" in flags},
                                          "publicAccessPrevention":
                                              "enforced" if "public-access-prevention" in flags else "inherited"}}
                self._change(f"create bucket {name}")
                return ""
            case ["storage", "buckets", "update", url]:
                configuration = self.buckets[url.removeprefix("gs://")]["iamConfiguration"]
                access = configuration["uniformBucketLevelAccess"]
                if "uniform-bucket-level-access" in flags and not access["enabled"]:
                    access["enabled"] = True
                    self._change(f"uniform access on {url}")
                if "public-access-prevention" in flags and configuration.get("publicAccessPrevention") != "enforced":
                    configuration["publicAccessPrevention"] = "enforced"
                    self._change(f"public access prevention on {url}")
                return ""
            case ["storage", "buckets", "add-iam-policy-binding", url]:
                bucket = self.buckets[url.removeprefix("gs://")]
                if flag("condition") != "None":
                    assert bucket["iamConfiguration"]["uniformBucketLevelAccess"]["enabled"], "conditions need UBLA"
                return self._bind(argv, url, flag("member"), flag("role"), flag("condition"))
            case ["storage", "service-agent"]:
                self._need(argv, "storage")
                if not self.agent:
                    self.agent = True
                    self._change("create the Cloud Storage service agent")
                return f"{AGENT}\n"
            case ["iam", "service-accounts", "create", account_id]:
                self._need(argv, "iam")
                email = f"{account_id}@{DOMAIN}"
                if email in self.accounts:
                    raise failure(argv, f"Resource in projects [{PROJECT}] is the subject of a conflict: Service "
                                        f"account {account_id} already exists within project projects/{PROJECT}.")
                self.accounts.add(email)
                self._change(f"create account {email}")
                return ""
            case ["iam", "roles", "create", role_id]:
                self._need(argv, "iam")
                if role_id in self.roles:
                    raise failure(argv, "ALREADY_EXISTS: A role named respawnVmRecords in projects/prod-proj already "
                                        "exists.")
                self.roles[role_id] = {"includedPermissions": sorted(flag("permissions").split(",")),
                                       "stage": flag("stage"), "deleted": False}
                self._change(f"create role {role_id}")
                return ""
            case ["iam", "roles", "describe", role_id]:
                self._need(argv, "iam")
                if role_id not in self.roles:
                    raise failure(argv, f"NOT_FOUND: The role named projects/{PROJECT}/roles/{role_id} was not found.")
                assert flag("format") == "json"
                return json.dumps({"name": f"projects/{PROJECT}/roles/{role_id}", **self.roles[role_id]})
            case ["iam", "roles", "update", role_id]:
                role = self.roles[role_id]
                if role["deleted"]:
                    raise failure(argv, "FAILED_PRECONDITION: You can't update a deleted role.")
                wanted = {**role, "includedPermissions": sorted(flag("permissions").split(",")), "stage": flag("stage")}
                if wanted != role:
                    self.roles[role_id] = wanted
                    self._change(f"update role {role_id}")
                return ""
            case ["iam", "roles", "undelete", role_id]:
                self.roles[role_id]["deleted"] = False
                self._change(f"undelete role {role_id}")
                return ""
            case ["secrets", "create", secret]:
                self._need(argv, "secretmanager")
                if secret in self.secrets:
                    raise failure(argv, f"ALREADY_EXISTS: Secret [projects/{NUMBER}/secrets/{secret}] already exists.")
                self.secrets[secret] = []
                self._change(f"create secret {secret}")
                return ""
            case ["secrets", "versions", "add", secret]:
                assert flag("data-file") == "-" and stdin is not None  # the value from stdin, never argv
                self.secrets[secret].append(stdin)
                self._change(f"add a version of {secret}")
                return ""
            case ["secrets", "versions", "access", "latest"]:
                versions = self.secrets.get(flag("secret"))
                if not versions:
                    raise failure(argv, f"NOT_FOUND: Secret Version [projects/{NUMBER}/secrets/{flag('secret')}/"
                                        "versions/latest] not found or has no versions.")
                return versions[-1]
            case ["secrets", "versions", "describe", "latest"]:
                assert flag("format") == "value(name.basename())"
                return f"{len(self.secrets[flag('secret')])}\n"
            case ["secrets", "add-iam-policy-binding", secret]:
                if secret not in self.secrets:
                    raise failure(argv, f"NOT_FOUND: Secret [{secret}] not found.")
                return self._bind(argv, f"secret:{secret}", flag("member"), flag("role"), flag("condition"))
            case ["iam", "service-accounts", "add-iam-policy-binding", email]:
                self._member_exists(argv, f"serviceAccount:{email}")
                return self._bind(argv, f"account:{email}", flag("member"), flag("role"), flag("condition"))
            case ["projects", "add-iam-policy-binding", where]:
                return self._bind(argv, f"project:{where}", flag("member"), flag("role"), flag("condition"))
            case ["pubsub", "topics", "add-iam-policy-binding", topic]:
                self._need(argv, "pubsub")
                if not topic.startswith("projects/") and topic not in self.topics:
                    raise failure(argv, f"NOT_FOUND: Resource not found (resource={topic}).")
                return self._bind(argv, topic, flag("member"), flag("role"))
            case ["pubsub", "topics", "create", topic]:
                self._need(argv, "pubsub")
                if topic in self.topics:
                    raise failure(argv, f"Failed to create topic [projects/{PROJECT}/topics/{topic}]: Resource "
                                        f"already exists in the project (resource={topic}).")
                self.topics.add(topic)
                self._change(f"create topic {topic}")
                return ""
            case ["logging", "sinks", "create", name, destination]:
                self._need(argv, "logging")
                if name in self.sinks:
                    # what gcloud 528 prints for Logging's 409 (seen against a local server answering it)
                    raise failure(argv, f"Resource in projects [{PROJECT}] is the subject of a conflict: Sink {name} "
                                        "already exists")
                if destination.rpartition("/topics/")[2] not in self.topics:
                    raise failure(argv, f"INVALID_ARGUMENT: destination {destination} does not exist")
                self.sinks[name] = {"destination": destination, "filter": flag("log-filter"),
                                    "disabled": "disabled" in flags, "writerIdentity": WRITER, "exclusions": []}
                self._change(f"create sink {name}")
                return ""
            case ["logging", "sinks", "describe", name]:
                if name not in self.sinks:
                    raise failure(argv, f"NOT_FOUND: Sink {name} does not exist")
                assert flag("format") == "value(writerIdentity)"
                return f"{self.sinks[name]['writerIdentity']}\n"
            case ["logging", "sinks", "update", name, destination]:
                if name not in self.sinks:
                    raise failure(argv, f"NOT_FOUND: Sink {name} does not exist")
                sink = self.sinks[name]
                wanted = {**sink, "destination": destination, "filter": flag("log-filter"),
                          "disabled": "disabled" in flags and "no-disabled" not in flags,
                          "exclusions": [] if "clear-exclusions" in flags else sink.get("exclusions", [])}
                if wanted != sink:
                    self.sinks[name] = wanted
                    self._change(f"update sink {name}")
                return ""
            case ["logging", "metrics", "describe", name]:
                self._need(argv, "logging")
                if name not in self.metrics:
                    raise failure(argv, f"NOT_FOUND: Metric {name} does not exist.")
                return json.dumps({"name": name, **self.metrics[name]})
            case ["logging", "metrics", ("create" | "update") as verb, name]:
                self._need(argv, "logging")
                if (verb == "create") == (name in self.metrics):
                    raise failure(argv, f"Resource in projects [{PROJECT}] is the subject of a conflict: Metric {name} "
                                        "already exists" if verb == "create" else f"NOT_FOUND: Metric {name} does not exist.")
                config = yaml.safe_load(Path(flag("config-from-file")).read_text())
                wanted = {**self.metrics.get(name, {}), **config}  # gcloud's update sets the file's top-level fields
                if self.metrics.get(name) != wanted:
                    self.metrics[name] = wanted
                    self._change(f"{verb} metric {name}")
                return ""
            case ["functions", "deploy", name]:
                self._need(argv, "cloudfunctions", "run", "cloudbuild", "artifactregistry")
                self._member_exists(argv, f"serviceAccount:{flag('service-account')}")
                if "trigger-event-filters" in flags:
                    self._need(argv, "eventarc", "pubsub")
                    bucket = self.buckets[dict(f.split("=", 1) for f in flags["trigger-event-filters"])["bucket"]]
                    if flag("trigger-location") != bucket["location"].lower():
                        raise failure(argv, "INVALID_ARGUMENT: the trigger must be in the bucket's location")
                    if ("project:" + PROJECT, f"serviceAccount:{AGENT}", "roles/pubsub.publisher", "") not in self.bindings:
                        raise failure(argv, "FAILED_PRECONDITION: the Cloud Storage service agent needs "
                                            "roles/pubsub.publisher")
                if "trigger-topic" in flags:
                    self._need(argv, "eventarc", "pubsub")
                    if flag("trigger-topic") not in self.topics:  # gcloud would create it: deploy must not rely on that
                        raise failure(argv, f"NOT_FOUND: topic {flag('trigger-topic')} does not exist")
                if "set-secrets" in flags:
                    for key, ref in _dict_flag(flag("set-secrets")).items():
                        secret, _, version = ref.partition(":")
                        assert version.isdigit(), f"{key}: a secret variable is pinned to a version number"
                        if int(version) > len(self.secrets.get(secret, [])):
                            raise failure(argv, f"INVALID_ARGUMENT: secret {ref} does not exist")
                        if ("secret:" + secret, f"serviceAccount:{flag('service-account')}",
                                "roles/secretmanager.secretAccessor", "") not in self.bindings:
                            raise failure(argv, f"FAILED_PRECONDITION: the function's account may not read {secret}")
                else:
                    assert "clear-secrets" in flags
                # Google makes a new revision of every deploy, the same flags and source or not
                self.functions[name] = tuple(sorted(argv[3:]))
                labels = _dict_flag(flag("update-labels")) if "update-labels" in flags else {}
                self.deployed[name] = {"state": "ACTIVE", "labels": {**self.deployed.get(name, {}).get("labels", {}),
                                                                     **labels},
                                       "serviceConfig": {"environmentVariables": {
                                           **_dict_flag(flag("set-env-vars")), "LOG_EXECUTION_ID": "true"},
                                           "serviceAccountEmail": flag("service-account")}}
                self._change(f"deploy {name}")
                return ""
            case ["functions", "describe", name]:
                if name not in self.functions:
                    raise failure(argv, f"NOT_FOUND: Resource 'projects/{PROJECT}/locations/{REGION}/functions/{name}' "
                                        "was not found")
                if flag("format") == "json":
                    return json.dumps({"name": f"projects/{PROJECT}/locations/{REGION}/functions/{name}",
                                       **self.deployed[name]})
                assert flag("format") == "value(serviceConfig.uri)"
                return f"{TICK_URL}\n"
            case ["functions", "add-invoker-policy-binding", name]:
                if name not in self.functions:
                    raise failure(argv, f"NOT_FOUND: Resource '{name}' was not found")
                return self._bind(argv, f"function:{name}", flag("member"), "roles/run.invoker")
        raise AssertionError(f"the fake gcloud does not know {shlex.join(argv)}")

    def schedule(self, request: dict[str, Any]) -> None:
        assert "cloudscheduler.googleapis.com" in self.apis
        job = request["job"]
        assert job["http_target"]["uri"] == TICK_URL and job["http_target"]["oidc_token"]["audience"] == TICK_URL
        if self.jobs.get(job["name"]) != job:
            self.jobs[job["name"]] = job
            self._change(f"scheduler job {job['name']}")


def target(**env: str) -> deploy.Target:
    return deploy.Target(PROJECT, REGION, BUCKET, CONTROLLER, SCHEDULER, env=env)


def run(fake: FakeProject, t: deploy.Target | None = None, start: int = 1) -> list[str]:
    t = t or target()
    said: list[str] = []
    deploy.execute(deploy.plan(t), t, run=fake, say=said.append, sleep=lambda _: None, start=start,
                   schedule=fake.schedule)
    return said


def roles_of(fake: FakeProject, member: str) -> set[tuple[str, str]]:
    return {(resource, role) for resource, m, role, _ in fake.bindings if m == member}


@pytest.fixture
def fake(monkeypatch) -> FakeProject:
    project = FakeProject()
    monkeypatch.setattr(deploy, "run_command", project)
    monkeypatch.setattr(deploy, "_upsert_scheduler_job", project.schedule)
    monkeypatch.setattr(deploy.time, "sleep", lambda _: None)
    return project


@pytest.fixture
def cli(monkeypatch) -> Any:
    """`respawn deploy` with no RESPAWN_* setting from the environment but those a test sets (nor a local
    cloud's addresses: this machine's shell may have sourced one's local.env)."""
    for key in [k for k in os.environ if k.startswith(("RESPAWN_", "CLOUDSDK_", "STORAGE_EMULATOR_HOST"))]:
        monkeypatch.delenv(key)
    monkeypatch.setattr(deploy, "gcloud_account", lambda run=None: "owner@example.com")  # never this machine's gcloud

    def invoke(*args: str) -> Any:
        return runner.invoke(app, ["deploy", "--project", PROJECT, "--region", REGION, "--bucket", BUCKET, *args])

    return invoke


# -- from a shell that sourced the local cloud's local.env -----------------------------------------

LOCAL = "respawn-local"
# What such a shell holds (localcloud.stack.LocalCloud.env, in part): addresses on 127.0.0.1 for the
# clients and gcloud, and the local project's settings.
LOCAL_ENV = {
    "STORAGE_EMULATOR_HOST": "http://127.0.0.1:40101", "RESPAWN_COMPUTE_ENDPOINT": "http://127.0.0.1:40102",
    "RESPAWN_IAM_ENDPOINT": "http://127.0.0.1:40103", "RESPAWN_FUNCTIONS_ENDPOINT": "http://localhost:40104",
    "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": "http://127.0.0.1:40102/compute/v1/",
    "CLOUDSDK_API_ENDPOINT_OVERRIDES_IAM": "http://127.0.0.1:40103/",
    "CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDFUNCTIONS": "http://localhost:40104/",
    "CLOUDSDK_CORE_PROJECT": LOCAL, "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": "/home/me/.respawn/local/gcloud-token",
    "RESPAWN_PROJECT": LOCAL, "RESPAWN_BUCKET": LOCAL, "RESPAWN_REGION": "us-central1",
    "RESPAWN_TRAINER_SERVICE_ACCOUNT": f"respawn-trainer@{LOCAL}.iam.gserviceaccount.com",
    "RESPAWN_VM_SCRIPTS": "/src/respawn/deploy/vm",
}
ADDRESSES = sorted(k for k, v in LOCAL_ENV.items() if "://" in v)


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_deploy_to_google_from_a_shell_that_sourced_local_env_is_refused_naming_what_points_at_the_local_cloud(
        cli, fake, monkeypatch, dry_run):
    """Issue 39: `respawn deploy --project my-proj --dry-run` there planned my-proj's roles for
    respawn-trainer@respawn-local, and its gcloud calls went to the local cloud."""
    for key, value in LOCAL_ENV.items():
        monkeypatch.setenv(key, value)
    result = runner.invoke(app, ["deploy", "--project", "my-proj", *(["--dry-run"] if dry_run else [])])
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert "\n" not in line and line.startswith(
        f"✗ respawn deploy --project my-proj refused: this shell points at the local cloud (project {LOCAL}): "
        f"{', '.join(ADDRESSES)} point at 127.0.0.1/localhost, where the deploy's calls would go, and "
        f"RESPAWN_TRAINER_SERVICE_ACCOUNT=respawn-trainer@{LOCAL}.iam.gserviceaccount.com would get my-proj's "
        "trainer roles. Deploy from a new shell"), line
    assert line.endswith(f"or first: unset {' '.join(sorted(LOCAL_ENV))}"), line  # every variable it set, exactly
    assert fake.commands == [] and "# 1. " not in result.output  # nothing planned, nothing run
    # The line it gives, run: the plan is my-proj's, with my-proj's trainer, and nothing of the local cloud's.
    for key in line.rpartition("unset ")[2].split():
        monkeypatch.delenv(key)
    result = runner.invoke(app, ["deploy", "--project", "my-proj", "--region", "us-central1", "--bucket", "my-bucket",
                                 "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "--member=serviceAccount:respawn-trainer@my-proj.iam.gserviceaccount.com" in result.output
    assert LOCAL not in result.output and "127.0.0.1" not in result.output


def test_only_an_address_on_this_machine_counts_as_the_local_cloud():
    from controller.cli import localshell

    google = {"RESPAWN_COMPUTE_ENDPOINT": "https://compute.googleapis.com", "RESPAWN_PROJECT": LOCAL,
              "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": "https://compute.googleapis.com/compute/v1/",
              "RESPAWN_TRAINER_SERVICE_ACCOUNT": f"ml@{LOCAL}.iam.gserviceaccount.com", "HOME": "/home/me"}
    assert localshell.refusal(google, "my-proj") is None
    for value in ("127.0.0.1:4443", "http://localhost:4443", "http://[::1]:4443/"):  # bare host:port, as GCS's may be
        assert localshell.pointing({**google, "STORAGE_EMULATOR_HOST": value}) == ["STORAGE_EMULATOR_HOST"]
        said = localshell.refusal({**google, "STORAGE_EMULATOR_HOST": value}, "my-proj")
        assert said is not None and said.endswith("or first: unset RESPAWN_PROJECT RESPAWN_TRAINER_SERVICE_ACCOUNT "
                                                  "STORAGE_EMULATOR_HOST"), said


@pytest.mark.parametrize("value", ["http://127.0.0.2:4443", "http://LOCALHOST:4443", "http://localhost.:4443",
                                   "http://[::ffff:127.0.0.1]:4443", "http://[0:0:0:0:0:0:0:1]:4443",
                                   "http://0.0.0.0:4443"])
def test_every_spelling_of_this_machine_counts_as_the_local_cloud_and_one_variable_points(value):
    """127.0.0.0/8, IPv6's loopback however written (an IPv4-mapped one included), a fully qualified
    localhost and 0.0.0.0 (which a client connects to here) are this machine as much as 127.0.0.1."""
    from controller.cli import localshell

    assert localshell.pointing({"STORAGE_EMULATOR_HOST": value}) == ["STORAGE_EMULATOR_HOST"]
    said = localshell.refusal({"STORAGE_EMULATOR_HOST": value}, "my-proj")
    assert said is not None and ": STORAGE_EMULATOR_HOST points at " in said, said


def test_a_deploy_to_the_local_clouds_own_project_from_its_shell_is_planned_as_before(cli, monkeypatch):
    for key, value in LOCAL_ENV.items():
        monkeypatch.setenv(key, value)
    result = runner.invoke(app, ["deploy", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "this shell points at the local cloud" not in result.output
    assert f"--member=serviceAccount:respawn-trainer@{LOCAL}.iam.gserviceaccount.com" in result.output


# -- a fresh project, twice ------------------------------------------------------------------

def test_a_fresh_project_gets_everything_respawn_relies_on_and_a_second_deploy_changes_nothing(fake):
    said = run(fake)
    assert {f"{api}.googleapis.com" for api in deploy.APIS} | {deploy.TPU_API} == fake.apis
    bucket = fake.buckets[BUCKET]
    assert bucket["location"] == "US-CENTRAL1" and bucket["projectNumber"] == NUMBER
    assert bucket["iamConfiguration"] == {"uniformBucketLevelAccess": {"enabled": True},
                                          "publicAccessPrevention": "enforced"}
    assert fake.accounts == {CONTROLLER, SCHEDULER, TRAINER} and fake.agent
    assert roles_of(fake, f"serviceAccount:{CONTROLLER}") == {
        (f"gs://{BUCKET}", "roles/storage.objectUser"), (f"account:{TRAINER}", "roles/iam.serviceAccountUser"),
        (f"gs://{CHECKPOINTS}", "roles/storage.objectViewer"),
        (f"project:{PROJECT}", "roles/compute.instanceAdmin.v1"), (f"project:{PROJECT}", "roles/tpu.admin"),
        (f"project:{PROJECT}", "roles/logging.logWriter"), (f"project:{PROJECT}", "roles/eventarc.eventReceiver"),
        ("function:respawn-on-object", "roles/run.invoker"), ("function:respawn-on-audit", "roles/run.invoker")}
    assert roles_of(fake, f"serviceAccount:{TRAINER}") == {
        (f"gs://{BUCKET}", f"projects/{PROJECT}/roles/respawnVmRecords"), (f"gs://{BUCKET}", "roles/storage.objectViewer"),
        (f"project:{PROJECT}", "roles/logging.logWriter"),  # objectViewer twice: code/ and respawn/vm/, conditioned
        (f"project:{PROJECT}", "roles/artifactregistry.reader"),  # an image: pulled with the VM's own token
        (f"gs://{CHECKPOINTS}", "roles/storage.objectUser")}
    assert roles_of(fake, f"serviceAccount:{SCHEDULER}") == {("function:respawn-tick", "roles/run.invoker")}
    assert roles_of(fake, f"serviceAccount:{AGENT}") == {(f"project:{PROJECT}", "roles/pubsub.publisher")}
    assert roles_of(fake, WRITER) == {("respawn-audit", "roles/pubsub.publisher")}  # that topic only
    assert fake.topics == {"respawn-audit"} and fake.sinks == {"respawn-audit": {
        "destination": f"pubsub.googleapis.com/projects/{PROJECT}/topics/respawn-audit",
        "filter": audit.sink_filter(PROJECT), "disabled": False, "writerIdentity": WRITER, "exclusions": []}}
    assert set(fake.functions) == {"respawn-tick", "respawn-on-object", "respawn-on-audit"} and len(fake.jobs) == 1
    # each step said what it does, numbered and named
    assert said[0].startswith("1. apis: enable the APIs") and len(said) == len(deploy.plan(target()))

    first = fake.state()
    fake.changes.clear()
    run(fake)
    assert fake.changes == [] and fake.state() == first


def test_deploying_again_after_a_half_done_deploy_finishes_it(fake):
    """Whatever a first deploy left (any prefix of the plan done), the next one completes it."""
    whole = FakeProject()
    run(whole)
    steps = deploy.plan(target())
    for done in (1, 4, 9, len(steps) - 1):
        partial = FakeProject()
        t = target()
        deploy.execute(steps[:done], t, run=partial, say=lambda _: None, sleep=lambda _: None,
                       schedule=partial.schedule)
        run(partial)
        assert partial.state() == whole.state(), done


# -- failures name their step; --from resumes there ---------------------------------------------

def test_a_failed_step_names_itself_and_from_resumes_there_to_the_same_project(fake):
    fake.fail_once["storage service-agent"] = "PERMISSION_DENIED: caller lacks storage.buckets.get"
    with pytest.raises(deploy.StepFailed) as failed:
        run(fake)
    steps = deploy.plan(target())
    assert failed.value.step.name == "storage-agent" and steps[failed.value.number - 1].name == "storage-agent"
    assert "gcloud storage service-agent --project=prod-proj failed" in failed.value.reason
    assert "PERMISSION_DENIED" in failed.value.output
    assert "respawn-tick" not in fake.functions  # it stopped there
    before = len(fake.commands)
    said = run(fake, start=failed.value.number)
    assert said[0].startswith(f"{failed.value.number}. storage-agent:")
    assert not [c for c in fake.commands[before:] if c[1:3] == ("services", "enable")]  # earlier steps not rerun
    whole = FakeProject()
    run(whole)
    assert fake.state() == whole.state()


def test_the_cli_says_how_to_resume_and_from_takes_a_number_or_a_name(fake, cli):
    fake.fail_once["functions deploy respawn-on-object"] = "INVALID_ARGUMENT: quota exceeded for builds"
    result = cli("--trainer-account", TRAINER)
    assert result.exit_code == 1, result.output
    number = next(n for n, s in enumerate(deploy.plan(target()), 1) if s.name == "on-object")
    assert f"step {number} (on-object) failed: gcloud functions deploy respawn-on-object" in result.output
    assert "quota exceeded for builds" in result.output
    assert (f"respawn deploy --project {PROJECT} --region {REGION} --bucket {BUCKET} --trainer-account {TRAINER} "
            "--from on-object") in result.output
    assert "run the whole deploy again" in result.output

    result = cli("--from", "on-object")
    assert result.exit_code == 0, result.output
    assert f"{number}. on-object:" in result.output and "1. apis:" not in result.output
    assert "deployed" in result.output
    fake.changes.clear()
    result = cli("--from", str(number))
    assert result.exit_code == 0 and fake.changes == []


def test_from_an_unknown_step_lists_the_steps(cli):
    result = cli("--from", "nope", "--dry-run")
    assert result.exit_code == 2
    assert "--from 'nope': no such step" in result.output and "storage-agent" in result.output


def test_the_functions_memory_is_an_option_and_a_bad_one_is_refused_naming_the_fix(cli):
    """512Mi holds a few thousand jobs; a 10,000-job tick peaked at 623 MiB (make bench)."""
    plain = cli("--dry-run")
    assert plain.exit_code == 0 and plain.output.count("--memory=512Mi") == 3  # every function
    more = cli("--memory", "1Gi", "--dry-run")
    assert more.exit_code == 0 and more.output.count("--memory=1Gi") == 3 and "--memory=512Mi" not in more.output
    for bad in ("lots", "64Mi", "64Gi", "1G"):
        refused = cli("--memory", bad, "--dry-run")
        assert refused.exit_code == 2 and f"--memory {bad!r}" in refused.output and "1Gi" in refused.output


# -- Compute's System Event audit log: sink -> topic -> on_audit ------------------------------------

def _step(name: str, t: deploy.Target | None = None) -> deploy.Step:
    return next(s for s in deploy.plan(t or target()) if s.name == name)


def test_the_audit_path_is_a_topic_a_sink_on_audits_filter_its_writer_on_that_topic_and_a_third_function(fake):
    run(fake)
    names = [s.name for s in deploy.plan(target())]
    # in the order Google needs: the topic before the sink that writes to it, the writer identity
    # (known once the sink exists) before it is granted, the topic before the function it triggers
    order = ["apis", "audit-topic", "audit-sink", "audit-publisher", "audit-sink-update", "on-audit", "on-audit-invoker"]
    assert [n for n in names if n in order] == order
    sink = _step("audit-sink").argv
    assert sink[:6] == ("gcloud", "logging", "sinks", "create", "respawn-audit",
                        f"pubsub.googleapis.com/projects/{PROJECT}/topics/respawn-audit")
    assert f"--log-filter={audit.sink_filter(PROJECT)}" in sink  # the one filter, never a copy
    on_audit = fake.functions["respawn-on-audit"]
    common = {a for a in fake.functions["respawn-tick"] if a.split("=")[0] in (
        "--gen2", "--runtime", "--region", "--project", "--source", "--service-account", "--set-env-vars", "--memory")}
    assert common <= set(on_audit) and len(common) == 8  # the others' runtime, region, env, account, memory
    assert {"--entry-point=on_audit", "--trigger-topic=respawn-audit", "--retry",
            f"--trigger-service-account={CONTROLLER}"} <= set(on_audit)
    timeout = next(a for a in on_audit if a.startswith("--timeout=")).removeprefix("--timeout=")
    assert float(timeout.removesuffix("s")) >= 540  # a TPU worker's entry is a pass over every job, as the tick's
    assert _step("audit-publisher").lookups[0].argv == (
        "gcloud", "logging", "sinks", "describe", "respawn-audit", f"--project={PROJECT}", "--format=value(writerIdentity)")


def test_a_sink_an_older_deploy_made_with_another_filter_is_brought_back_and_a_disabled_one_enabled(fake):
    run(fake)
    fake.sinks["respawn-audit"].update(filter='resource.type="gce_instance"', disabled=True,
                                       destination=f"pubsub.googleapis.com/projects/{PROJECT}/topics/other")
    fake.changes.clear()
    run(fake)
    assert fake.changes == ["update sink respawn-audit"]
    assert fake.sinks["respawn-audit"] == {"destination": f"pubsub.googleapis.com/projects/{PROJECT}/topics/respawn-audit",
                                           "filter": audit.sink_filter(PROJECT), "disabled": False,
                                           "writerIdentity": WRITER, "exclusions": []}


def test_a_deploy_leaves_the_audit_sink_no_exclusion_that_could_drop_respawns_entries(fake):
    # An exclusion drops every entry it matches, whatever the filter keeps: one matching the
    # preemptions made a sink that exports nothing, and deploy's update kept it.
    run(fake)
    fake.sinks["respawn-audit"]["exclusions"] = [
        {"name": "quiet", "filter": 'protoPayload.methodName="compute.instances.preempted"'}]
    fake.changes.clear()
    run(fake)
    assert fake.sinks["respawn-audit"]["exclusions"] == [] and fake.changes == ["update sink respawn-audit"]
    assert "--clear-exclusions" in _step("audit-sink-update").argv


def test_the_controller_reads_no_logs_anywhere_and_the_sink_is_the_deploy_projects_own(fake):
    """An audit entry only wakes a pass (a trainer may forge one): the controller's account needs no
    Logging read in any watched project, and gets none."""
    run(fake, target(RESPAWN_ALLOWED_PROJECTS="prod-proj,other-proj"))
    mine = roles_of(fake, f"serviceAccount:{CONTROLLER}")
    assert not {r for r in mine if r[1] in ("roles/logging.viewer", "roles/logging.privateLogViewer")}
    assert {("project:prod-proj", "roles/compute.instanceAdmin.v1"), ("project:other-proj", "roles/compute.instanceAdmin.v1")} <= mine
    # the sink is the deploy project's own (a project sink sees that project's entries only)
    assert len(fake.sinks) == 1 and f"projects/{PROJECT}/logs/" in fake.sinks["respawn-audit"]["filter"]


def test_the_dry_run_ends_with_a_summary_of_its_steps_and_whom_they_run_as(cli, monkeypatch):
    """Issue 39: the dry run had no summary of what it will create and did not check gcloud's login."""
    result = cli("--dry-run")
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert re.search(r"the plan: \d+ steps, in order: [-a-z0-9@]+, [-a-z0-9@]+", said), said[-800:]
    assert "every step runs as gcloud's account: owner@example.com" in said
    monkeypatch.setattr(deploy, "gcloud_account", lambda run=None: None)
    said = " ".join(cli("--dry-run").output.split())
    assert "gcloud is not logged in (or not installed)" in said and "gcloud auth login" in said


def test_gcloud_account_reads_the_active_login_and_none_without_one():
    assert deploy.gcloud_account(lambda argv: "me@example.com\n") == "me@example.com"
    assert deploy.gcloud_account(lambda argv: "") is None

    def missing(argv):
        raise FileNotFoundError("gcloud")
    assert deploy.gcloud_account(missing) is None


def test_the_dry_run_shows_the_audit_steps_and_says_the_filter_cannot_select_respawns_instances(cli):
    result = cli("--dry-run")
    assert result.exit_code == 0, result.output
    assert shlex.join(deploy.audit_sink_argv(PROJECT)) in result.output
    assert ("#   <writer identity of the respawn-audit sink> = gcloud logging sinks describe respawn-audit "
            f"--project={PROJECT} '--format=value(writerIdentity)'") in result.output
    assert "--trigger-topic=respawn-audit" in result.output
    assert "the entries carry no instance labels, so no filter can keep respawn's alone" in result.output


# -- an existing bucket: kept if respawn can use it, refused saying why if not -----------------------

@pytest.mark.parametrize("settings, says", [
    ({"retentionPolicy": {"retentionPeriod": "86400"}}, "a retention policy of 86400 s"),
    ({"defaultEventBasedHold": True}, "a default event-based hold"),
    ({"billing": {"requesterPays": True}}, "requester pays"),
    ({"projectNumber": "999"}, "it belongs to project number 999"),
])
def test_an_existing_bucket_that_would_break_respawn_is_refused_saying_why(fake, cli, settings, says):
    fake.apis.add("storage.googleapis.com")
    fake.buckets[BUCKET] = {"name": BUCKET, "projectNumber": NUMBER, "location": "US-CENTRAL1",
                            "iamConfiguration": {"uniformBucketLevelAccess": {"enabled": True}}, **settings}
    kept = copy.deepcopy(fake.buckets)
    result = cli()
    assert result.exit_code == 2, result.output
    assert f"step 2 (bucket) failed: gs://{BUCKET} cannot be respawn's control bucket: {says}" in result.output
    assert "--from bucket" in result.output
    assert fake.buckets == kept and not fake.bindings  # nothing done to it, nothing granted after it


def test_an_existing_usable_bucket_elsewhere_is_kept_its_access_made_uniform_and_the_trigger_put_there(fake):
    fake.apis.add("storage.googleapis.com")
    fake.buckets[BUCKET] = {"name": BUCKET, "projectNumber": NUMBER, "location": "US", "versioning": {"enabled": True},
                            "iamConfiguration": {"uniformBucketLevelAccess": {"enabled": False}}}
    run(fake)
    created = [c[4] for c in fake.commands if c[1:4] == ("storage", "buckets", "create")]
    assert created == [f"gs://{CHECKPOINTS}"]  # the checkpoints bucket only, where the control bucket is
    assert fake.buckets[CHECKPOINTS]["location"] == "US"
    assert fake.buckets[BUCKET]["iamConfiguration"]["uniformBucketLevelAccess"]["enabled"]
    assert "--trigger-location=us" in fake.functions["respawn-on-object"]


def test_an_existing_bucket_kept_is_made_as_private_as_a_created_one(fake):
    # A bucket adopted with public access prevention 'inherited' (a public binding allowed on it)
    # stayed so: every spec's env and every record's secret one allUsers binding from the world.
    fake.apis.add("storage.googleapis.com")
    fake.buckets[BUCKET] = {"name": BUCKET, "projectNumber": NUMBER, "location": "US-CENTRAL1",
                            "iamConfiguration": {"uniformBucketLevelAccess": {"enabled": True},
                                                 "publicAccessPrevention": "inherited"}}
    run(fake)
    assert fake.buckets[BUCKET]["iamConfiguration"]["publicAccessPrevention"] == "enforced"


# -- the checkpoints bucket: respawn run's default place for checkpoints (issue 39) -----------------------

def test_deploy_creates_the_checkpoints_bucket_and_grants_trainer_and_controller_on_it_only(fake):
    run(fake)
    made = fake.buckets[CHECKPOINTS]
    assert made["location"] == fake.buckets[BUCKET]["location"] and made["projectNumber"] == NUMBER
    assert made["iamConfiguration"] == {"uniformBucketLevelAccess": {"enabled": True},
                                        "publicAccessPrevention": "enforced"}
    on_it = {(member, role, title) for resource, member, role, title in fake.bindings if resource == f"gs://{CHECKPOINTS}"}
    assert on_it == {(f"serviceAccount:{TRAINER}", "roles/storage.objectUser", ""),
                     (f"serviceAccount:{CONTROLLER}", "roles/storage.objectViewer", "")}
    # the control bucket's contract untouched: the trainer's grants there are all conditioned, none lists
    on_control = [(role, title) for resource, member, role, title in fake.bindings
                  if resource == f"gs://{BUCKET}" and member == f"serviceAccount:{TRAINER}"]
    assert len(on_control) == 3 and all(title for _, title in on_control)
    # deploy/IAM.md marks both grants **(deploy)**, on that bucket
    rows = [line for line in IAM_MD.read_text().splitlines() if line.startswith("| ") and "**(deploy)**" in line
            and "BUCKET-checkpoints" in line]
    assert {re.findall(r"`(roles/[\w.]+)`", row.split("|")[1])[0] for row in rows} == {
        "roles/storage.objectUser", "roles/storage.objectViewer"}


def test_the_dry_run_shows_the_checkpoints_bucket_and_its_grants_and_its_summary_names_them(cli):
    result = cli("--dry-run")
    assert result.exit_code == 0, result.output
    said = result.output
    assert (f"gcloud storage buckets create gs://{CHECKPOINTS} '--location=<location of the control bucket>' "
            "--uniform-bucket-level-access --public-access-prevention") in said
    assert f"#   <location of the control bucket> = gcloud storage buckets describe gs://{BUCKET}" in said
    for member, role in ((TRAINER, "roles/storage.objectUser"), (CONTROLLER, "roles/storage.objectViewer")):
        assert (f"gcloud storage buckets add-iam-policy-binding gs://{CHECKPOINTS} --member=serviceAccount:{member} "
                f"--role={role} --condition=None") in said
    summary = " ".join(said.split()).split("the plan: ")[1]
    assert re.search(r"uniform-access, checkpoints-bucket, .*trainer-checkpoints, controller-checkpoints", summary)


def test_an_existing_checkpoints_bucket_of_another_project_is_refused_and_nothing_granted_on_it(fake, cli):
    # Bucket names are one namespace: anyone may make BUCKET-checkpoints first, and every job's checkpoints
    # would go to it.
    fake.apis.add("storage.googleapis.com")
    fake.buckets[CHECKPOINTS] = {"name": CHECKPOINTS, "projectNumber": "999", "location": "US-CENTRAL1",
                                 "iamConfiguration": {"uniformBucketLevelAccess": {"enabled": True}}}
    result = cli()
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert (f"(checkpoints-bucket) failed: gs://{CHECKPOINTS} cannot be the checkpoints bucket: it belongs to "
            "project number 999") in said and "--from checkpoints-bucket" in said
    assert not [b for b in fake.bindings if b[0] == f"gs://{CHECKPOINTS}"]


def test_a_control_bucket_too_long_for_a_checkpoints_bucket_is_deployed_without_one_saying_which_flag(cli):
    long = "b" * 60  # 72 characters with -checkpoints
    result = cli("--dry-run", "--bucket", long)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert (f"! no checkpoints bucket: gs://{long}-checkpoints would be 72 characters long, and a bucket name is at "
            "most 63") in said
    assert "respawn run will ask each job for --checkpoint gs://... (or --no-checkpoint)" in said
    assert "deploy with a shorter --bucket" in said
    assert "checkpoints-bucket" not in said and "-checkpoints --member" not in said
    t = deploy.Target(PROJECT, REGION, long, CONTROLLER, SCHEDULER)
    assert t.checkpoints is None and not {"trainer-checkpoints", "controller-checkpoints"} & {s.name for s in deploy.plan(t)}


# -- what the plan holds depends on the policy ---------------------------------------------------------

def test_tpu_api_and_role_only_where_the_policy_admits_a_tpu_slice(fake):
    run(fake, target(RESPAWN_MAX_TPU_SIZE="0"))
    assert deploy.TPU_API not in fake.apis
    assert not [b for b in fake.bindings if b[2] == "roles/tpu.admin"]
    assert deploy.tpu_allowed({}) and deploy.tpu_allowed({"RESPAWN_ALLOWED_TPU_TYPES": "v5litepod-*"})


def test_watched_projects_and_the_notification_topic_get_the_controllers_roles(fake):
    topic = "projects/prod-proj/topics/respawn"
    run(fake, target(RESPAWN_ALLOWED_PROJECTS="prod-proj,other-proj", RESPAWN_NOTIFY_TOPIC=topic))
    mine = roles_of(fake, f"serviceAccount:{CONTROLLER}")
    assert {("project:other-proj", "roles/compute.instanceAdmin.v1"), ("project:other-proj", "roles/tpu.admin"),
            (topic, "roles/pubsub.publisher")} <= mine
    assert not [r for r, role in mine if r == "project:other-proj" and role == "roles/logging.logWriter"]


def test_accounts_of_another_project_are_used_never_created(fake):
    t = deploy.Target(PROJECT, REGION, BUCKET, "ctl@shared-proj.iam.gserviceaccount.com", SCHEDULER)
    names = [s.name for s in deploy.plan(t)]
    assert "controller-account" not in names and "scheduler-account" in names and "trainer-account" in names


# -- the dry run, and IAM.md as the one list of roles ---------------------------------------------

def test_the_dry_run_prints_the_whole_plan_numbered_and_named_and_no_secret(cli, monkeypatch):
    monkeypatch.setenv("RESPAWN_NOTIFY_WEBHOOK", "https://hooks.slack.com/services/T0/B0/secretpath")
    result = cli("--dry-run")
    assert result.exit_code == 0, result.output
    steps = deploy.plan(target(RESPAWN_NOTIFY_WEBHOOK="x"))
    titles = re.findall(r"^# (\d+)\. ([\w@.-]+): ", result.output, re.M)
    assert [(int(n), name) for n, name in titles] == [(n, s.name) for n, s in enumerate(steps, 1)]
    assert len({s.name for s in steps}) == len(steps)  # every name resumes one step
    assert "secretpath" not in result.output and "hooks.slack.com/" not in result.output
    assert "gcloud secrets versions add respawn-notify-webhook --data-file=- --project=prod-proj  # its standard " \
           "input: the value, never shown" in result.output
    assert "#   <Cloud Storage service agent> = gcloud storage service-agent --project=prod-proj" in result.output
    partial = cli("--dry-run", "--from", "tick")
    assert partial.output.startswith(f"# {[s.name for s in steps].index('tick') + 1}. tick:")


def test_a_secret_with_a_quote_in_it_is_redacted_from_the_dry_run_too():
    # shlex.join quoted the command line before redaction: a ' inside the webhook URL became
    # '"'"', the secret no longer matched, and the dry run printed it whole.
    url = "https://chat.example.com/v1/spaces/X/messages?key=keysecret&token=it'stokensecret"
    for step in deploy.plan(target(RESPAWN_NOTIFY_WEBHOOK=url)):
        shown = step.render()
        assert "keysecret" not in shown and "tokensecret" not in shown, step.name
        if step.name == "secret-respawn-notify-webhook-value":
            assert step.stdin == url  # what gcloud is given is whole, on its standard input


def test_the_webhook_url_is_on_no_command_line_and_in_no_plain_variable_only_in_secret_manager(fake):
    """`ps` shows a command line to every user of the machine, and a project Viewer reads a function's
    plain variables: the URL, the webhook's credential, goes to Secret Manager through gcloud's
    standard input, and the functions read it with --set-secrets, as the controller, granted
    roles/secretmanager.secretAccessor on that secret alone."""
    url = "https://hooks.slack.com/services/T0/B0/secretpath"
    run(fake, target(RESPAWN_NOTIFY_WEBHOOK=url))
    assert not [c for c in fake.commands if any("secretpath" in word for word in c)]
    assert fake.secrets == {"respawn-notify-webhook": [url]}
    for name, deployed in fake.deployed.items():
        assert "RESPAWN_NOTIFY_WEBHOOK" not in deployed["serviceConfig"]["environmentVariables"], name
        assert "--set-secrets=^|^RESPAWN_NOTIFY_WEBHOOK=respawn-notify-webhook:1" in fake.functions[name], name
    assert [(r, m) for r, m, role, _ in fake.bindings if role == "roles/secretmanager.secretAccessor"] == [
        ("secret:respawn-notify-webhook", f"serviceAccount:{CONTROLLER}")]
    assert "secretmanager.googleapis.com" in fake.apis
    fake.changes.clear()
    run(fake, target(RESPAWN_NOTIFY_WEBHOOK=url))  # the same URL again: no new version, nothing redeployed
    assert fake.changes == []
    run(fake, target(RESPAWN_NOTIFY_WEBHOOK=url + "2"))  # a new URL: a new version, and every function reads it
    assert fake.secrets["respawn-notify-webhook"] == [url, url + "2"]
    assert sorted(fake.changes) == ["add a version of respawn-notify-webhook", "deploy respawn-on-audit",
                                    "deploy respawn-on-object", "deploy respawn-tick"]
    assert "--set-secrets=^|^RESPAWN_NOTIFY_WEBHOOK=respawn-notify-webhook:2" in fake.functions["respawn-tick"]


def test_without_a_secret_setting_the_functions_are_deployed_with_none_and_secret_manager_stays_off(fake):
    run(fake)
    assert "secretmanager.googleapis.com" not in fake.apis and not fake.secrets
    assert all("--clear-secrets" in flags for flags in fake.functions.values())  # one an older deploy set: gone


# -- a second deploy with nothing changed deploys nothing again ----------------------------------------

def test_a_second_deploy_with_nothing_changed_makes_no_new_revision_and_says_so(fake):
    run(fake)
    fake.changes.clear()
    said = run(fake)
    assert fake.changes == []  # each deploy of a function is a new revision, a build and a restart
    for name in ("tick", "on-object", "on-audit"):
        title = next(i for i, line in enumerate(said) if re.match(rf"\d+\. {name}: ", line))
        assert said[title + 1] == "   deployed already from this source with these flags: not deployed again"


def test_a_changed_source_variable_or_flag_or_a_function_that_is_not_active_is_deployed_again(fake, tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "main.py").write_text("print(1)\n")
    (source / ".gcloudignore").write_text("notes.txt\n")
    t = deploy.Target(PROJECT, REGION, BUCKET, CONTROLLER, SCHEDULER, source=source)
    run(fake, t)

    def deploys(t: deploy.Target) -> list[str]:
        fake.changes.clear()
        run(fake, t)
        return sorted(c for c in fake.changes if c.startswith("deploy "))

    every = ["deploy respawn-on-audit", "deploy respawn-on-object", "deploy respawn-tick"]
    (source / "notes.txt").write_text("gcloud uploads no file its .gcloudignore leaves out")
    assert deploys(t) == []
    (source / "main.py").write_text("print(2)\n")
    assert deploys(t) == every
    assert deploys(dataclasses.replace(t, env={"RESPAWN_MAX_NODES": "4"})) == every
    assert deploys(dataclasses.replace(t, env={"RESPAWN_MAX_NODES": "4"}, memory="1Gi")) == every
    fake.deployed["respawn-on-object"]["state"] = "FAILED"  # a deploy that failed half way
    fake.deployed["respawn-tick"]["serviceConfig"]["environmentVariables"]["RESPAWN_MAX_NODES"] = "64"  # by hand
    assert deploys(dataclasses.replace(t, env={"RESPAWN_MAX_NODES": "4"}, memory="1Gi")) == [
        "deploy respawn-on-object", "deploy respawn-tick"]


# -- the custom role: exactly its permissions ----------------------------------------------------------

@pytest.mark.parametrize("found, changes", [
    ({"includedPermissions": ["storage.objects.create", "storage.objects.delete", "storage.objects.get",
                              "storage.objects.list"], "stage": "GA", "deleted": False}, ["update role respawnVmRecords"]),
    ({"includedPermissions": ["storage.objects.create"], "stage": "GA", "deleted": False}, ["update role respawnVmRecords"]),
    ({"includedPermissions": ["storage.objects.create", "storage.objects.delete"], "stage": "DISABLED",
      "deleted": False}, ["update role respawnVmRecords"]),
    ({"includedPermissions": ["storage.objects.create", "storage.objects.delete"], "stage": "GA", "deleted": True},
     ["undelete role respawnVmRecords"]),
])
def test_a_custom_role_whose_permissions_differ_or_that_is_disabled_or_deleted_is_made_respawns_again(fake, found,
                                                                                                        changes):
    # Deploy took the role as done once it existed: one given storage.objects.get let every trainer
    # read every job's records (their secrets); one left without delete, never overwrite a heartbeat.
    run(fake)
    fake.roles["respawnVmRecords"] = found
    fake.changes.clear()
    run(fake)
    assert fake.changes == changes
    assert fake.roles["respawnVmRecords"] == {"includedPermissions": ["storage.objects.create", "storage.objects.delete"],
                                              "stage": "GA", "deleted": False}



def _iam_md_deploy_roles() -> set[str]:
    """Every role a row of deploy/IAM.md's tables marks **(deploy)**."""
    roles = set()
    for line in IAM_MD.read_text().splitlines():
        if line.startswith("| ") and "**(deploy)**" in line:
            cell = line.split("|")[1]
            roles |= set(re.findall(r"`(roles/[\w.]+)`", cell)) | {f"custom:{r}" for r in re.findall(
                r"custom role `(\w+)`", cell)}
    return roles


def test_iam_md_lists_exactly_the_roles_deploy_grants(fake):
    run(fake, target(RESPAWN_NOTIFY_TOPIC="projects/prod-proj/topics/respawn",
                     RESPAWN_NOTIFY_WEBHOOK="https://hooks.slack.com/services/T0/B0/x"))
    granted = {f"custom:{role.rsplit('/', 1)[1]}" if role.startswith("projects/") else role
               for _, _, role, _ in fake.bindings}
    assert granted == _iam_md_deploy_roles()


# -- every gcloud command, through gcloud's own parser ------------------------------------------

PROBE = "respawn-parse-probe: the request reached 127.0.0.1"


class _Answer400(http.server.BaseHTTPRequestHandler):
    def _answer(self) -> None:
        self.server.paths.append(f"{self.command} {self.path}")  # type: ignore[attr-defined]
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = json.dumps({"error": {"code": 400, "message": PROBE, "status": "INVALID_ARGUMENT"}}).encode()
        self.send_response(400)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def google_that_answers_400(tmp_path) -> Iterator[tuple[dict[str, str], list[str]]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer400)
    server.paths = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    token = tmp_path / "token"
    token.write_text("not-a-real-token")
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
           "CLOUDSDK_CORE_DISABLE_PROMPTS": "1", "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(token),
           "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "1", "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "1"}
    for api in ("serviceusage", "storage", "iam", "cloudresourcemanager", "cloudfunctions", "run", "pubsub",
                "eventarc", "cloudbuild", "artifactregistry", "logging", "compute", "cloudscheduler", "tpu",
                "secretmanager"):
        env[f"CLOUDSDK_API_ENDPOINT_OVERRIDES_{api.upper()}"] = endpoint
    yield env, server.paths  # type: ignore[attr-defined]
    server.shutdown()


def _every_gcloud_command(steps: list[deploy.Step]) -> list[tuple[str, ...]]:
    filled = {deploy.PROJECT_NUMBER: NUMBER, deploy.STORAGE_AGENT: AGENT, deploy.BUCKET_LOCATION: "us-central1",
              deploy.URL_PLACEHOLDER: TICK_URL}
    commands = []
    for step in steps:
        commands += [lookup.argv for lookup in step.lookups] + ([step.probe] if step.probe else [])
        if step.name == "trainer-role":  # what it runs on a role found otherwise
            commands += deploy.role_fixes(PROJECT, json.dumps({"deleted": True}))
        if step.argv:
            argv = step.argv
            for placeholder, value in {**filled, deploy.DIGEST: "0123abcd",
                                       **{deploy.secret_version(s): "1" for s in ("respawn-notify-webhook",)}}.items():
                argv = tuple(a.replace(placeholder, value) for a in argv)
            commands.append(argv)
    return commands


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="gcloud is not installed: its parser cannot be asked")
@pytest.mark.timeout(360)  # some 65 gcloud processes, each about a second of CPU: on a loaded 2-CPU machine, 140 s
def test_every_gcloud_command_deploy_builds_parses_with_gclouds_own_parser(google_that_answers_400):
    """Each command runs through gcloud: its argument parser and its flag checks pass when gcloud goes
    on to send the request, which the server on 127.0.0.1 answers 400. A flag gcloud does not know
    exits 2 ("unrecognized arguments") before any request."""
    env, paths = google_that_answers_400
    t = target(RESPAWN_ALLOWED_PROJECTS="prod-proj,other-proj", RESPAWN_NOTIFY_TOPIC="projects/prod-proj/topics/t",
               RESPAWN_NOTIFY_WEBHOOK="https://hooks.slack.com/services/T0/B0/x",
               RESPAWN_ALLOWED_ZONES="us-central1-a,us-central1-b")
    commands = list(dict.fromkeys(_every_gcloud_command(deploy.plan(t))))
    assert len(commands) > 20
    for argv in commands:
        before = len(paths)
        done = subprocess.run(argv, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
        assert done.returncode == 1 and PROBE in done.stderr, (shlex.join(argv), done.returncode, done.stderr)
        assert len(paths) > before, shlex.join(argv)
    # ...and the check tells a bad flag from a good one
    bad = subprocess.run(("gcloud", "services", "enable", "run.googleapis.com", "--no-such-flag", "--project=p"),
                         env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert bad.returncode == 2 and "unrecognized arguments" in bad.stderr


# -- the log-based metrics of the fleet's figures (deploy/metrics) ------------------------------------------

def test_the_log_based_metrics_are_created_and_one_an_older_deploy_or_a_hand_changed_brought_back(fake):
    run(fake)
    files = {p.stem: yaml.safe_load(p.read_text()) for p in deploy.metric_files()}
    assert set(fake.metrics) == set(files) >= {"respawn_jobs", "respawn_losses", "respawn_recovery_seconds",
                                               "respawn_goodput", "respawn_cost_dollars"}
    assert fake.metrics == files
    fake.metrics["respawn_losses"]["filter"] = 'jsonPayload.respawn_figures="loss"'  # changed by hand
    fake.changes.clear()
    run(fake)
    assert fake.changes == ["update metric respawn_losses"] and fake.metrics == files
    names = [s.name for s in deploy.plan(target())]
    assert names.index("apis") < names.index("metric-respawn_jobs")  # the Logging API on first


def test_the_dry_run_shows_each_metrics_look_update_and_create(cli):
    result = cli("--dry-run")
    assert result.exit_code == 0, result.output
    path = deploy.METRICS_DIR / "respawn_jobs.yaml"
    assert (f"#   if `gcloud logging metrics describe respawn_jobs --project={PROJECT} --format=json` finds it: "
            f"gcloud logging metrics update respawn_jobs --config-from-file={path} --project={PROJECT}; else:\n"
            f"gcloud logging metrics create respawn_jobs --config-from-file={path} --project={PROJECT}") in result.output


def test_iam_md_names_the_role_that_makes_the_metrics():
    text = IAM_MD.read_text()
    assert "logging.logMetrics.create" in text and "logging.logMetrics.update" in text
    assert "roles/logging.configWriter" in text


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="gcloud is not installed")
def test_gcloud_makes_the_metrics_in_the_local_logging_and_a_second_deploy_brings_a_changed_one_back(tmp_path):
    """The metric steps run for real: gcloud against the Logging stand-in (projects.metrics, its
    bodies checked against the discovery document's LogMetric). Three of the metrics: a distribution
    labelled by phase, a counter, a distribution in seconds (test_fleet_metrics puts every file through
    the same API)."""
    from localcloud.logging import LoggingServer

    token = tmp_path / "token"
    token.write_text("not-a-real-token")
    with LoggingServer() as server:
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
               "CLOUDSDK_CORE_DISABLE_PROMPTS": "1", "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(token),
               "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "1", "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "1",
               "CLOUDSDK_API_ENDPOINT_OVERRIDES_LOGGING": server.endpoint + "/"}
        gcloud = lambda argv: subprocess.run(argv, env=env, check=True, capture_output=True, text=True,  # noqa: E731
                                             stdin=subprocess.DEVNULL, timeout=120).stdout
        steps = [s for s in deploy.plan(target()) if s.name in (
            "metric-respawn_jobs", "metric-respawn_losses", "metric-respawn_recovery_seconds")]
        deploy.execute(steps, target(), run=gcloud, say=lambda _: None, sleep=lambda _: None)
        made = server.metrics(PROJECT)
        assert set(made) == {"respawn_jobs", "respawn_losses", "respawn_recovery_seconds"}
        for name, kept in made.items():
            wanted = yaml.safe_load((deploy.METRICS_DIR / f"{name}.yaml").read_text())
            assert kept["filter"] == wanted["filter"] and kept.get("valueExtractor") == wanted.get("valueExtractor")
            assert kept["labelExtractors"] == wanted["labelExtractors"]
            assert kept["metricDescriptor"]["valueType"] == wanted["metricDescriptor"]["valueType"]
        losses = made["respawn_losses"]
        server._metrics[PROJECT]["respawn_losses"] = {**losses, "filter": "severity>=ERROR"}  # changed by hand
        deploy.execute(steps, target(), run=gcloud, say=lambda _: None, sleep=lambda _: None)
        again = server.metrics(PROJECT)
        assert again["respawn_losses"]["filter"] == losses["filter"]
        assert again["respawn_jobs"]["createTime"] == made["respawn_jobs"]["createTime"]  # updated, not made anew


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="gcloud is not installed")
def test_gcloud_runs_the_sink_update_against_the_local_logging_and_no_exclusion_is_left(tmp_path):
    """The audit-sink-update step for real: gcloud against the Logging stand-in, on a sink someone gave
    an exclusion that drops the preemptions (and disabled): respawn's filter, enabled, no exclusion."""
    import requests

    from localcloud.logging import LoggingServer

    token = tmp_path / "token"
    token.write_text("not-a-real-token")
    with LoggingServer() as server:
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
               "CLOUDSDK_CORE_DISABLE_PROMPTS": "1", "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(token),
               "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "1", "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "1",
               "CLOUDSDK_API_ENDPOINT_OVERRIDES_LOGGING": server.endpoint + "/"}
        made = requests.post(  # a unique writer identity, as gcloud's create asks for
            f"{server.endpoint}/v2/projects/{PROJECT}/sinks", params={"uniqueWriterIdentity": "true"},
            json={"name": "respawn-audit", "destination": deploy.audit_destination(PROJECT), "disabled": True,
                  "filter": audit.sink_filter(PROJECT), "exclusions": [
                      {"name": "quiet", "filter": 'protoPayload.methodName="compute.instances.preempted"'}]}, timeout=10)
        made.raise_for_status()
        gcloud = lambda argv: subprocess.run(argv, env=env, check=True, capture_output=True, text=True,  # noqa: E731
                                             stdin=subprocess.DEVNULL, timeout=120).stdout
        deploy.execute([_step("audit-sink-update")], target(), run=gcloud, say=lambda _: None, sleep=lambda _: None)
        sink = next(s for s in server.sinks(PROJECT) if s["name"] == "respawn-audit")
        assert not sink.get("exclusions") and not sink.get("disabled")
        assert sink["filter"] == audit.sink_filter(PROJECT)


def test_shards_auto_counts_the_specs_in_the_bucket_and_plans_the_fan_out_for_them(cli, monkeypatch):
    from controller.adapters import google
    from controller.adapters.memory import MemoryStore
    from controller.core import names

    store = MemoryStore()
    for i in range(5):
        store.put(BUCKET, names.spec_key(f"job-{i}"), "{}")
    store.put(BUCKET, names.status_key("job-0"), "{}")
    monkeypatch.setattr(google, "gcs_store", lambda config: store)
    monkeypatch.setattr(deploy, "SPECS_PER_SHARD", 2)  # 5 specs: 3 shards' worth, rounded up to 4
    result = cli("--shards", "auto", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "--shards auto: 5 specs, 4 shards" in result.output
    assert "gcloud functions deploy respawn-on-shard" in result.output and "RESPAWN_SHARDS=4" in result.output
