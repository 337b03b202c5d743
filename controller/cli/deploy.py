"""``respawn deploy``: the trainer identity, the bucket's IAM, both functions, the Scheduler
job and the VM scripts, as a plan of steps.

The plan is data, so ``--dry-run`` prints exactly what a real run would execute: every
``gcloud`` command line and the Cloud Scheduler API request, secrets (the notification webhook's
URL, any token) redacted there as in every message about a failing step.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.core import names
from controller.service.config import REPO_ROOT, Settings

TICK, ON_OBJECT = "respawn-tick", "respawn-on-object"
URL_PLACEHOLDER = "<url of respawn-tick>"
TRAINER_ACCOUNT_ID = "respawn-trainer"
TRAINER_CONDITION_TITLE = "respawn-trainer-vm-records-only"

# Single characters tried, in order, as gcloud's alternate list/dict delimiter. None is
# '=' (the key/value separator), '^' (the escape marker) or ',' (the default delimiter).
_DELIMITERS = ("|", ";", "#", "~", "!", "+", "%", "*", ":", "@", "&", "$")
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")
# The settings the functions are deployed with that a deploy passes on (when the user set them).
POLICY_SETTINGS = ("allowed_projects", "allowed_zones", "allowed_machine_types", "allowed_service_accounts", "max_nodes",
                   "max_accelerators", "allowed_tpu_types", "max_tpu_size", "notify_topic", "notify_webhook",
                   "allowed_notify_topics", "allowed_webhook_hosts")
# Settings whose value is a secret: never printed, whether planned, run or failed.
SECRET_SETTINGS = ("RESPAWN_NOTIFY_WEBHOOK",)
_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|CREDENTIALS?|PRIVATE_KEY|API_KEY)$")
# An incoming webhook's URL is its credential, whoever set it and wherever it shows up.
_WEBHOOK_URL = re.compile(r"(https?://hooks\.slack\.com)/[^\s'\"|;,]+")
REDACTED = "<redacted>"


def policy_env(config: Settings) -> dict[str, str]:
    """The policy the functions run with: each setting the user set, as its variable. A list left
    empty where its default is not (``RESPAWN_ALLOWED_WEBHOOK_HOSTS=""``: no host) is passed on
    empty, so that the functions do not fall back to that default."""
    env = {}
    for key, value in config.model_dump(include=set(POLICY_SETTINGS)).items():
        default = Settings.model_fields[key].default
        if value in ((), None) and value == default:
            continue
        env[f"RESPAWN_{key.upper()}"] = ",".join(value) if isinstance(value, tuple) else str(value)
    return env


def secrets_of(env: Mapping[str, str]) -> tuple[str, ...]:
    """The values in ``env`` that are secrets (SECRET_SETTINGS, names like *_TOKEN), longest first."""
    found = {v for k, v in env.items() if v and (k in SECRET_SETTINGS or _SECRET_NAME.search(k))}
    return tuple(sorted(found, key=len, reverse=True))


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` without ``secrets`` (a URL keeps its scheme and host: which webhook, not its key) and
    without any Slack webhook URL's path."""
    for secret in secrets:
        if secret in text:
            url = re.match(r"(https?://[^/\s]+)/", secret)
            text = text.replace(secret, f"{url[1]}/{REDACTED}" if url else REDACTED)
    return _WEBHOOK_URL.sub(rf"\1/{REDACTED}", text)


def gcloud_dict(pairs: Mapping[str, str]) -> str:
    """The value of a gcloud dict flag that gcloud parses back to exactly ``pairs``.

    ``gcloud topic escaping``: a value starting with ``^DELIM^`` is split on DELIM instead
    of ',', and each item on its first '='. DELIM is the first single character of
    ``_DELIMITERS`` that occurs in no key and no value, so that a policy list such as
    ``us-central1-a,us-central1-b`` stays one value.
    """
    for key in pairs:
        if not key or "=" in key:
            raise ValueError(f"{key!r} cannot be a key of a gcloud dict flag")
    items = [f"{key}={value}" for key, value in pairs.items()]
    text = "".join(items)
    for delim in _DELIMITERS:
        if delim not in text:
            return f"^{delim}^" + delim.join(items)
    raise ValueError("every candidate delimiter occurs in a key or value; use a flags file instead")


def account_email(account_id: str, project: str) -> str:
    return f"{account_id}@{project}.iam.gserviceaccount.com"


TRAINER_ROLE_ID = "respawnVmRecords"
# Overwriting an object needs delete as well as create; no get, no list.
TRAINER_PERMISSIONS = ("storage.objects.create", "storage.objects.delete")


def trainer_condition(bucket: str) -> str:
    """CEL for the trainer's bucket binding: the VM records of any job, nothing else.

    Object resource names are ``projects/_/buckets/BUCKET/objects/OBJECT``. Any name this
    admits is, under the bucket contract, an exit record, a heartbeat or a marker, or is
    outside the contract (``jobs/a/b/exit``) and ignored by the controller: never a spec,
    a status, a cancel request or anything the controller executes. Listing the bucket is
    checked against the bucket's own name, which this never admits.
    """
    if not _BUCKET_RE.fullmatch(bucket):
        raise ValueError(f"{bucket!r} is not a Cloud Storage bucket name")
    objects = f"projects/_/buckets/{bucket}/objects/"
    return (
        f'resource.name.startsWith("{objects}{names.MARKERS_PREFIX}") || '
        f'(resource.name.startsWith("{objects}{names.JOBS_PREFIX}") && '
        f'(resource.name.endsWith("/{names.EXIT}") || resource.name.endsWith("/{names.HEARTBEAT}")))'
    )


@dataclass(frozen=True)
class Target:
    project: str
    region: str
    bucket: str
    controller_sa: str
    scheduler_sa: str
    schedule: str = "* * * * *"
    source: Path = REPO_ROOT
    env: dict[str, str] = field(default_factory=dict)
    trainer_sa: str = ""  # default: respawn-trainer@PROJECT.iam.gserviceaccount.com

    @property
    def trainer(self) -> str:
        return self.trainer_sa or account_email(TRAINER_ACCOUNT_ID, self.project)

    def function_env(self) -> dict[str, str]:
        """What the functions are deployed with: bucket, project, policy, trainer account.

        Specs that name no service account run as the trainer account, and unless the
        policy already lists the accounts a spec may use, that account is the only one.
        """
        env = {"RESPAWN_BUCKET": self.bucket, "RESPAWN_PROJECT": self.project, **self.env,
               "RESPAWN_TRAINER_SERVICE_ACCOUNT": self.trainer}
        if not env.get("RESPAWN_ALLOWED_SERVICE_ACCOUNTS"):
            env["RESPAWN_ALLOWED_SERVICE_ACCOUNTS"] = self.trainer
        return dict(sorted(env.items()))


@dataclass(frozen=True)
class Step:
    title: str
    argv: tuple[str, ...] = ()
    request: dict[str, Any] | None = None
    uploads: tuple[tuple[Path, str], ...] = ()
    # a failure whose message contains one of these means "already done"
    done_if: tuple[str, ...] = ()
    # a failure whose message contains one of these is retried (IAM is eventually consistent)
    retry_if: tuple[str, ...] = ()
    # the tick function's deploy: its URL is what the Scheduler job calls
    yields_tick_url: bool = False
    secrets: tuple[str, ...] = ()  # values in it never shown (redact)

    def render(self, reveal: bool = False) -> str:
        """What the step runs, as printed (secrets redacted), or as sent (``reveal``)."""
        if self.argv:
            text = shlex.join(self.argv)
        elif self.request is not None:
            text = json.dumps(self.request, indent=2)
        else:
            text = "\n".join(f"upload {path} -> gs://{dest}" for path, dest in self.uploads)
        return text if reveal else redact(text, self.secrets)


def plan(t: Target) -> list[Step]:
    project = f"--project={t.project}"
    bucket = f"gs://{t.bucket}"
    common = ("--gen2", "--runtime=python311", f"--region={t.region}", project,
              f"--source={t.source}", f"--service-account={t.controller_sa}",
              "--set-env-vars=" + gcloud_dict(t.function_env()), "--memory=512Mi")
    trainer_id, _, trainer_domain = t.trainer.partition("@")
    job = f"projects/{t.project}/locations/{t.region}/jobs/respawn-tick"
    scripts = REPO_ROOT / "deploy" / "vm"
    iam_lag = ("does not exist", "NOT_FOUND")
    steps: list[Step] = []
    if trainer_domain == f"{t.project}.iam.gserviceaccount.com":
        steps.append(Step(
            "create the trainer VMs' service account (no roles yet; already there is fine)",
            ("gcloud", "iam", "service-accounts", "create", trainer_id, project,
             "--display-name=respawn trainer VMs",
             "--description=runs respawn training VMs: writes only their records in the control bucket"),
            done_if=("already exists", "ALREADY_EXISTS")))
    steps += [
        Step("turn on uniform bucket-level access on the control bucket (IAM Conditions need it)",
             ("gcloud", "storage", "buckets", "update", bucket, "--uniform-bucket-level-access", project)),
        Step("let the controller read and write every object of the control bucket",
             ("gcloud", "storage", "buckets", "add-iam-policy-binding", bucket,
              f"--member=serviceAccount:{t.controller_sa}", "--role=roles/storage.objectUser",
              "--condition=None", project)),
        # Write, never read: a record carries its attempt's secret, so a trainer that could
        # read another job's heartbeat could forge that job's exit record with it.
        Step(f"create the custom role {TRAINER_ROLE_ID}: create and overwrite objects, nothing else "
             "(already there is fine)",
             ("gcloud", "iam", "roles", "create", TRAINER_ROLE_ID, project,
              "--title=respawn VM records", "--description=write (never read or list) respawn VM records",
              f"--permissions={','.join(TRAINER_PERMISSIONS)}", "--stage=GA"),
             done_if=("already exists", "ALREADY_EXISTS")),
        Step("let the trainer VMs write only jobs/<job>/exit, jobs/<job>/heartbeat and preempted-jobs/<job>",
             ("gcloud", "storage", "buckets", "add-iam-policy-binding", bucket,
              f"--member=serviceAccount:{t.trainer}", f"--role=projects/{t.project}/roles/{TRAINER_ROLE_ID}",
              "--condition=" + gcloud_dict({
                  "expression": trainer_condition(t.bucket),
                  "title": TRAINER_CONDITION_TITLE,
                  "description": "respawn VM records only: jobs/<job>/exit, jobs/<job>/heartbeat, "
                                 "preempted-jobs/<job>"}),
              project),
             retry_if=iam_lag),
        # The guest agent writes the startup script's lines to GCEMetadataScripts with the VM's
        # account: where `respawn logs` reads a VM's output when its serial port is not logged.
        Step("let the trainer VMs write their logs to Cloud Logging (roles/logging.logWriter on the project)",
             ("gcloud", "projects", "add-iam-policy-binding", t.project,
              f"--member=serviceAccount:{t.trainer}", "--role=roles/logging.logWriter", "--condition=None"),
             retry_if=iam_lag),
        Step("let the controller create VMs that run as the trainer account (on that account only)",
             ("gcloud", "iam", "service-accounts", "add-iam-policy-binding", t.trainer,
              f"--member=serviceAccount:{t.controller_sa}", "--role=roles/iam.serviceAccountUser",
              "--condition=None", project),
             retry_if=iam_lag),
        Step("deploy the tick function (HTTP, authenticated only)",
             ("gcloud", "functions", "deploy", TICK, *common, "--entry-point=tick", "--trigger-http",
              "--no-allow-unauthenticated", "--timeout=540s"),
             yields_tick_url=True),
        Step("deploy the on_object function (GCS finalize events, retried)",
             ("gcloud", "functions", "deploy", ON_OBJECT, *common, "--entry-point=on_object",
              "--trigger-event-filters=type=google.cloud.storage.object.v1.finalized",
              f"--trigger-event-filters=bucket={t.bucket}", "--retry", "--timeout=540s")),
        Step("let the scheduler's service account invoke tick",
             ("gcloud", "functions", "add-invoker-policy-binding", TICK, "--gen2", f"--region={t.region}",
              project, f"--member=serviceAccount:{t.scheduler_sa}")),
        Step("create or update the Cloud Scheduler job (google-cloud-scheduler API)", request={
            "parent": f"projects/{t.project}/locations/{t.region}",
            "job": {
                "name": job,
                "description": "respawn: reconcile every job",
                "schedule": t.schedule,
                "time_zone": "Etc/UTC",
                # runs of one Scheduler job never overlap; a pass must end well within this
                "attempt_deadline": "600s",
                "retry_config": {"retry_count": 0},
                "http_target": {"uri": URL_PLACEHOLDER, "http_method": "POST",
                                "oidc_token": {"service_account_email": t.scheduler_sa, "audience": URL_PLACEHOLDER}},
            },
        }),
        Step("upload the VM scripts, for reference (the controller embeds its own copy)",
             uploads=tuple((p, f"{t.bucket}/respawn/vm/{p.name}") for p in sorted(scripts.glob("*.sh")))),
    ]
    hidden = secrets_of(t.function_env())
    return [dataclasses.replace(step, secrets=hidden) for step in steps]


Runner = Callable[[tuple[str, ...]], str]


def run_command(argv: tuple[str, ...]) -> str:
    # stdin closed: gcloud must never wait for an answer nobody will type
    return subprocess.run(argv, check=True, capture_output=True, text=True, stdin=subprocess.DEVNULL).stdout


def _run_step(step: Step, run: Runner, sleep: Callable[[float], None], tries: int = 6) -> None:
    for attempt in range(1, tries + 1):
        try:
            run(step.argv)
            return
        except subprocess.CalledProcessError as error:
            message = f"{error.stderr or ''}{error.stdout or ''}"
            if any(text in message for text in step.done_if):
                return
            if attempt == tries or not any(text in message for text in step.retry_if):
                raise _redacted(error, step.secrets) from None
            sleep(10.0 * attempt)


def _redacted(error: subprocess.CalledProcessError, secrets: tuple[str, ...]) -> subprocess.CalledProcessError:
    """The same failure, its command line and output without the secrets (the caller prints them)."""
    hide = lambda text: redact(text, secrets) if isinstance(text, str) else text  # noqa: E731
    cmd = tuple(hide(a) for a in error.cmd) if isinstance(error.cmd, (list, tuple)) else hide(error.cmd)
    return subprocess.CalledProcessError(error.returncode, cmd, hide(error.stdout), hide(error.stderr))


def execute(steps: list[Step], t: Target, run: Runner = run_command, say: Callable[[str], None] = print,
            sleep: Callable[[float], None] = time.sleep) -> None:
    """Carry the plan out; the Scheduler job gets the tick function's real URL."""
    url = URL_PLACEHOLDER
    for step in steps:
        say(step.title)
        if step.argv:
            _run_step(step, run, sleep)
            if step.yields_tick_url:
                url = run(("gcloud", "functions", "describe", TICK, "--gen2", f"--region={t.region}",
                           f"--project={t.project}", "--format=value(serviceConfig.uri)")).strip()
        elif step.request is not None:
            _upsert_scheduler_job(json.loads(step.render(reveal=True).replace(URL_PLACEHOLDER, url)))
        else:
            _upload(step.uploads, t.project)


def _upsert_scheduler_job(request: dict[str, Any]) -> None:
    from google.api_core import exceptions
    from google.cloud import scheduler_v1

    client = scheduler_v1.CloudSchedulerClient()
    job = scheduler_v1.Job(request["job"])
    try:
        client.create_job(parent=request["parent"], job=job)
    except exceptions.AlreadyExists:
        client.update_job(job=job)


def _upload(uploads: tuple[tuple[Path, str], ...], project: str) -> None:
    from google.cloud import storage

    client = storage.Client(project=project)
    for path, dest in uploads:
        bucket, _, name = dest.partition("/")
        client.bucket(bucket).blob(name).upload_from_filename(str(path))
