"""``respawn deploy``: everything respawn relies on in a project, as a plan of steps.

The APIs, the control bucket (created if absent, refused if its settings would break respawn),
the checkpoints bucket beside it (``respawn run``'s default place for checkpoints: controller.cli.buckets),
the three service accounts, every role deploy/IAM.md marks **(deploy)**, the Logging sink of
Compute's System Event audit entries and its Pub/Sub topic, the log-based metrics of the fleet's
figures (``deploy/metrics``), the secret settings in Secret Manager, the three functions (``tick``,
``on_object``, ``on_audit``) and the Scheduler job; the controller writes the VM scripts itself
(controller.service.vmscripts). Each step says what it does and is safe to run again: it creates
only what is absent (or treats "already exists" as done), brings what it
finds otherwise back to respawn's (the custom role's permissions, the sink's filter and exclusions),
adds bindings IAM keeps once, and deploys a function only when its source or flags changed
(controller.cli.revision), so a second deploy changes nothing. A failed step names itself; ``--from``
(its number or name) resumes there, and running the whole deploy again is as good.

The plan is data, so ``--dry-run`` prints exactly what a real run would execute: every
``gcloud`` command line, what is looked up first (lines starting '#', which change nothing) and
the Cloud Scheduler API request. A secret (the notification webhook's URL, any token) is on no
command line: it reaches gcloud on its standard input, and is redacted wherever a command or its
output is printed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.cli import buckets, revision
from controller.cli.pack import CODE_PREFIX  # where respawn submit packs a local folder
from controller.core import audit, names
from controller.service import vmscripts
from controller.service.config import REPO_ROOT, Settings

TICK, ON_OBJECT, ON_AUDIT, ON_SHARD = "respawn-tick", "respawn-on-object", "respawn-on-audit", "respawn-on-shard"
# K > 1 (controller.service.shards): the tick publishes each shard's listing here; on_shard is triggered by it.
SHARD_TOPIC = Settings.model_fields["shard_topic"].default
# A shard's pass is as long as the tick's was: the functions' longest.
SHARD_TIMEOUT = "540s"
# `--shards auto`: one shard per this many specs (bench: a 10,000-job pass fits a third of a vCPU's
# minute only with the lean tick of issue 40), rounded up to a power of two.
SPECS_PER_SHARD = 10_000
# Compute's System Event audit log -> a Logging sink -> this topic -> on_audit (controller.core.audit).
AUDIT_TOPIC = AUDIT_SINK = "respawn-audit"
PUBLISHED = "google.cloud.pubsub.topic.v1.messagePublished"  # what a --trigger-topic function receives
# on_audit makes one pass; an entry about a Cloud TPU VM's worker (its name says no job) is a pass over
# every job, as the tick's: given the tick's time.
AUDIT_TIMEOUT = "540s"
SINK_WRITER = "<writer identity of the respawn-audit sink>"
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
# Settings whose value is a secret: never printed, whether planned, run or failed; kept in Secret
# Manager, never in the functions' plain variables (which a project Viewer reads) nor on a command line.
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


def is_secret(key: str) -> bool:
    return key in SECRET_SETTINGS or bool(_SECRET_NAME.search(key))


def secret_id(key: str) -> str:
    """The Secret Manager secret that holds setting ``key``: ``RESPAWN_NOTIFY_WEBHOOK`` ->
    ``respawn-notify-webhook``."""
    return "respawn-" + key.lower().removeprefix("respawn_").replace("_", "-")


def secret_version(secret: str) -> str:
    """The placeholder of ``secret``'s latest version number, looked up when a function step runs."""
    return f"<version of {secret}>"


def secrets_of(env: Mapping[str, str]) -> tuple[str, ...]:
    """The values in ``env`` that are secrets (SECRET_SETTINGS, names like *_TOKEN), longest first."""
    found = {v for k, v in env.items() if v and is_secret(k)}
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
# What trainer VMs hold to pull a spec's ``image:`` from the project's Artifact Registry with their own
# token: the least of its predefined roles with artifactregistry.repositories.downloadArtifacts
# (writer, repoAdmin and admin add pushing and deleting). deploy/IAM.md says how to narrow it.
TRAINER_REGISTRY_ROLE = "roles/artifactregistry.reader"


def trainer_condition(bucket: str) -> str:
    """CEL for the trainer's bucket binding: the VM records of any job, nothing else.

    Object resource names are ``projects/_/buckets/BUCKET/objects/OBJECT``. Any name this
    admits is, under the bucket contract, an exit record, a heartbeat, a notice, a ready record
    (a standby at its starting line) or a marker, or is
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
        f'(resource.name.endsWith("/{names.EXIT}") || resource.name.endsWith("/{names.HEARTBEAT}") || '
        f'resource.name.endsWith("/{names.NOTICE}") || resource.name.endsWith("/{names.READY}")))'
    )


TRAINER_CODE_CONDITION_TITLE = "respawn-trainer-code-read-only"


def trainer_code_condition(bucket: str) -> str:
    """CEL for the trainer's second binding on the control bucket (``roles/storage.objectViewer``):
    the code tarballs ``respawn submit`` packs, read-only. Listing is checked against the
    bucket's own name, which this never admits: a tarball is read only by one that knows its
    content's hash (its job's ``respawn-code`` metadata)."""
    if not _BUCKET_RE.fullmatch(bucket):
        raise ValueError(f"{bucket!r} is not a Cloud Storage bucket name")
    return f'resource.name.startsWith("projects/_/buckets/{bucket}/objects/{CODE_PREFIX}")'


TRAINER_SCRIPTS_CONDITION_TITLE = "respawn-trainer-vm-scripts-read-only"


def trainer_scripts_condition(bucket: str) -> str:
    """CEL for the trainer's third binding on the control bucket (``roles/storage.objectViewer``): the
    VM agent's scripts, which every VM's bootstrap fetches by the name its metadata gives
    (``respawn/vm/<sha256>/startup.sh``, written by the controller: controller.service.vmscripts),
    read-only. No listing (checked against the bucket's own name), no write, no secret in them."""
    if not _BUCKET_RE.fullmatch(bucket):
        raise ValueError(f"{bucket!r} is not a Cloud Storage bucket name")
    return f'resource.name.startsWith("projects/_/buckets/{bucket}/objects/{vmscripts.PREFIX}")'


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
    # Each function's memory, as gcloud's --memory takes it. A 10,000-job tick over statuses at their
    # steady size peaked at 367 MiB for the container (bench/runs/deployed-20261129T075538Z.json).
    memory: str = "512Mi"
    shards: int = 1  # K > 1: the fan-out (the shards' topic, on_shard, the tick's publisher grant)

    @property
    def trainer(self) -> str:
        return self.trainer_sa or account_email(TRAINER_ACCOUNT_ID, self.project)

    @property
    def checkpoints(self) -> str | None:
        """The checkpoints bucket deploy makes (controller.cli.buckets), or None where the control
        bucket's name leaves none (``checkpoints_note`` says so)."""
        try:
            return buckets.checkpoints_bucket(self.bucket)
        except ValueError:
            return None

    def function_env(self) -> dict[str, str]:
        """What the functions are deployed with: bucket, project, policy, trainer account.

        Specs that name no service account run as the trainer account, and unless the
        policy already lists the accounts a spec may use, that account is the only one.
        """
        env = {"RESPAWN_BUCKET": self.bucket, "RESPAWN_PROJECT": self.project, **self.env,
               "RESPAWN_TRAINER_SERVICE_ACCOUNT": self.trainer,
               # Only K > 1: --set-env-vars replaces every variable, so a deploy back to one shard
               # drops it, and a deployment that never shards is deployed as before.
               **({"RESPAWN_SHARDS": str(self.shards)} if self.shards > 1 else {})}
        if not env.get("RESPAWN_ALLOWED_SERVICE_ACCOUNTS"):
            env["RESPAWN_ALLOWED_SERVICE_ACCOUNTS"] = self.trainer
        return dict(sorted(env.items()))


# The APIs a deploy relies on (a fresh project has most of them off). Enabling one that is on
# already changes nothing. Cloud TPU only where the policy lets a spec ask for a TPU slice.
APIS = ("compute", "cloudfunctions", "run", "cloudbuild", "artifactregistry", "eventarc", "pubsub", "cloudscheduler",
        "logging", "iam", "storage")
TPU_API = "tpu.googleapis.com"
CONTROLLER_ACCOUNT_ID, SCHEDULER_ACCOUNT_ID = "respawn-controller", "respawn-scheduler"
# Values only the project knows, looked up (by the gcloud command their Lookup names) when their step runs.
PROJECT_NUMBER = "<project number>"
DIGEST = "<digest of the source and these flags>"  # controller.cli.revision.label
# The build's environment. Google's functions-framework buildpack compiles the source
# (``python3 -m compileall -f -q .``, GoogleCloudPlatform/buildpacks
# cmd/python/functions_framework/lib/lib.go), then the image's layers are written with every
# mtime set to 1980-01-01 (buildpacks/lifecycle, archive.NormalizedModTime): a timestamp
# ``.pyc`` is then stale, and every fresh instance compiles respawn's modules again, on the
# recovery's path (about 0.1 CPU-s). With SOURCE_DATE_EPOCH set, py_compile writes
# checked-hash ``.pyc`` files instead (PEP 552), valid whatever the mtimes; the buildpack runs
# compileall with the build's environment, where ``--set-build-env-vars`` puts it, as it
# does GOOGLE_RUNTIME_VERSION. bench/deployed.py builds its cold starts' source the same way.
BUILD_ENV = {"SOURCE_DATE_EPOCH": "315532800"}
SECRET_API = "secretmanager.googleapis.com"  # only where a secret setting is deployed
# What `gcloud functions describe` and `gcloud iam roles describe` say of what is not there.
_NO_FUNCTION = ("NOT_FOUND", "was not found", "does not exist", "status=[404]")
_NO_ROLE = ("NOT_FOUND", "was not found")
# What `gcloud secrets versions access latest` says of a secret with no version to read.
_NO_VERSION = ("NOT_FOUND", "not found", "DISABLED", "DESTROYED", "FAILED_PRECONDITION")
STORAGE_AGENT = "<Cloud Storage service agent>"
BUCKET_LOCATION = "<location of the control bucket>"
# What `gcloud storage buckets describe` says of a bucket that does not exist ("gs://B not found: 404.").
_ABSENT = ("not found: 404", "NotFoundError")
# A binding to an account (or service agent) created moments ago: IAM may not see it yet.
_IAM_LAG = ("does not exist", "NOT_FOUND")


def shards_for(specs: int) -> int:
    """``--shards auto``: one shard per SPECS_PER_SHARD specs, rounded up to a power of two (what
    the shard label selects: names.shard_label), at most names.MAX_SHARDS."""
    wanted = max(1, -(-specs // SPECS_PER_SHARD))
    return min(names.MAX_SHARDS, 1 << (wanted - 1).bit_length())


def tpu_allowed(env: Mapping[str, str]) -> bool:
    """Whether the policy lets a spec ask for a TPU slice: RESPAWN_ALLOWED_TPU_TYPES empty admits
    every type (controller.core.policy), so only RESPAWN_MAX_TPU_SIZE=0 (no slice fits) rules TPUs out."""
    size = env.get("RESPAWN_MAX_TPU_SIZE")
    return int(size if size not in (None, "") else Settings.model_fields["max_tpu_size"].default) > 0


@dataclass(frozen=True)
class Lookup:
    """A value a step's command needs that only the project knows: what ``argv`` prints (stripped,
    lowercased if ``lower``) replaces ``placeholder`` in the command when the step runs."""
    placeholder: str
    argv: tuple[str, ...]
    lower: bool = False


class Refusal(Exception):
    """A step found something respawn cannot work with (an existing control bucket's settings)."""


@dataclass(frozen=True)
class Step:
    name: str  # short, unique: what `--from` takes besides the step's number
    title: str
    argv: tuple[str, ...] = ()
    request: dict[str, Any] | None = None
    # a failure whose message contains one of these means "already done"
    done_if: tuple[str, ...] = ()
    # a failure whose message contains one of these is retried (IAM is eventually consistent)
    retry_if: tuple[str, ...] = ()
    lookups: tuple[Lookup, ...] = ()
    # Run first. Found (exit 0): ``check`` reads what it printed (refusing what respawn cannot work
    # with) and ``argv`` is not run. Not found: ``argv`` runs (creates it).
    probe: tuple[str, ...] = ()
    check: Callable[[str, Mapping[str, str]], None] | None = field(default=None, compare=False, repr=False)
    check_says: str = ""
    # Found by ``probe``: run this instead of ``argv`` (an update to respawn's config), not nothing.
    found_argv: tuple[str, ...] = ()
    absent_if: tuple[str, ...] = ()  # what ``probe`` says of a thing that is not there (default: _ABSENT)
    secrets: tuple[str, ...] = ()  # values in it never shown (redact)
    # Found by ``probe``: the commands that make it respawn's, from what the probe printed and the
    # step's own command (filled); none: it is respawn's already, and ``unchanged_says`` is said.
    when_found: Callable[[str, tuple[str, ...]], tuple[tuple[str, ...], ...]] | None = field(
        default=None, compare=False, repr=False)
    found_says: str = ""  # what ``when_found`` runs, as the dry run says it
    unchanged_says: str = ""
    stdin: str = field(default="", repr=False)  # given to ``argv`` on its standard input: never on a command line
    digest_of: Path | None = None  # DIGEST in ``argv``: this source's and the filled command's (controller.cli.revision)

    def render(self, reveal: bool = False) -> str:
        """What the step runs, as printed (secrets redacted), or as sent (``reveal``). Lines that
        start with '#' read what is there and change nothing."""
        lines = [f"#   {lookup.placeholder} = {shlex.join(lookup.argv)}" + (" (lowercased)" if lookup.lower else "")
                 for lookup in self.lookups]
        if self.probe:
            found = shlex.join(self.found_argv) if self.found_argv else self.found_says or self.check_says
            lines.append(f"#   if `{shlex.join(self.probe)}` finds it: {found}; else:")
        if self.argv:  # each word redacted before quoting: a quote inside a secret splits it apart
            lines.append(shlex.join(self.argv if reveal else [redact(a, self.secrets) for a in self.argv])
                         + ("  # its standard input: the value, never shown" if self.stdin else ""))
        elif self.request is not None:
            lines.append(json.dumps(self.request, indent=2))
        text = "\n".join(lines)
        return text if reveal else redact(text, self.secrets)


def usable_bucket(bucket: str, description: str, values: Mapping[str, str]) -> None:
    """Refuse an existing bucket whose settings break respawn (``description``: the JSON API's bucket
    resource, ``gcloud storage buckets describe --raw --format=json``).

    Cloud Storage's documentation, setting by setting:
    - a retention policy (Bucket Lock): an object cannot be deleted or replaced until it is as old
      as the retention period. respawn replaces ``status.json`` on every change (compare-and-swap
      on its generation), trainers overwrite their heartbeat, and the controller deletes consumed
      markers, exit records and cancels: all refused.
    - a default event-based hold: every new object gets a hold and cannot be deleted or replaced
      until someone releases it: the same.
    - requester pays: every request must name a billing project (``userProject``); neither the
      controller nor the VM agent sends one, so every read and write fails.
    - another project's bucket: a Cloud Storage trigger (``on_object``) must be in the bucket's
      project ("the service and the bucket must be in the same Google Cloud project").
    Not refused: another location than the functions' region (the trigger is created in the
    bucket's location, ``--trigger-location``); object versioning and soft delete (old versions
    are kept and billed, nothing is blocked); per-object retention enabled on the bucket (it holds
    only objects given a retention, and respawn gives none); uniform access off (the next step
    turns it on).
    """
    _refuse_unusable(bucket, "respawn's control bucket", description, values,
                     "respawn rewrites status.json and deletes the records it has read",
                     "status.json could not be rewritten nor a read record deleted until released",
                     "a Cloud Storage trigger must be in its bucket's project",
                     "Change those settings, or deploy with a new bucket name (deploy creates it).")


def usable_checkpoints_bucket(bucket: str, description: str, values: Mapping[str, str]) -> None:
    """Refuse an existing checkpoints bucket (``CONTROL-checkpoints``) whose settings break checkpoints,
    as ``usable_bucket`` does the control bucket's. Another project's is refused above all: bucket names
    are one namespace, anyone may make that one first, and every job's checkpoints would go to it."""
    _refuse_unusable(bucket, "the checkpoints bucket", description, values,
                     "trainers overwrite and delete their checkpoints",
                     "a checkpoint could not be overwritten nor deleted until released",
                     "every job's checkpoints would go to a bucket this project does not own",
                     "Change those settings, or deploy with another control bucket name (--bucket), whose "
                     "-checkpoints bucket deploy creates.")


def _refuse_unusable(bucket: str, what: str, description: str, values: Mapping[str, str], replaced: str,
                     held: str, elsewhere: str, fix: str) -> None:
    """Refusal naming each setting of the existing bucket that breaks it as ``what`` (_bucket_problems), and the fix."""
    if problems := _bucket_problems(json.loads(description), values, replaced, held, elsewhere):
        raise Refusal(f"gs://{bucket} cannot be {what}: {'; '.join(problems)}. {fix}")


def _bucket_problems(found: Mapping[str, Any], values: Mapping[str, str], replaced: str, held: str,
                     elsewhere: str) -> list[str]:
    """What in an existing bucket's settings (the JSON API's resource) breaks respawn, each with why."""
    problems = []
    period = int((found.get("retentionPolicy") or {}).get("retentionPeriod") or 0)
    if period > 0:
        problems.append(f"a retention policy of {period} s (objects could not be deleted or replaced for that long: "
                        f"{replaced})")
    if found.get("defaultEventBasedHold"):
        problems.append(f"a default event-based hold (every new object held: {held})")
    if (found.get("billing") or {}).get("requesterPays"):
        problems.append("requester pays (respawn's requests name no billing project, so every one would fail)")
    number = values.get(PROJECT_NUMBER)
    if number and str(found.get("projectNumber", "")) != number:
        problems.append(f"it belongs to project number {found.get('projectNumber')}, not this project ({number}): "
                        f"{elsewhere}")
    return problems


def checkpoints_note(bucket: str) -> str | None:
    """What deploy says when the control bucket ``bucket`` leaves no checkpoints bucket (its name too
    long for ``-checkpoints``): ``respawn run`` then needs ``--checkpoint``; None where it has one."""
    try:
        buckets.checkpoints_bucket(bucket)
    except ValueError as e:
        return (f"no checkpoints bucket: {e}. respawn run will ask each job for --checkpoint gs://... (or "
                "--no-checkpoint); for its default, deploy with a shorter --bucket")
    return None


def audit_destination(project: str) -> str:
    """The sink's destination: the audit topic, as Logging names a Pub/Sub destination."""
    return f"pubsub.googleapis.com/projects/{project}/topics/{AUDIT_TOPIC}"


def audit_topic_argv(project: str) -> tuple[str, ...]:
    return ("gcloud", "pubsub", "topics", "create", AUDIT_TOPIC, f"--project={project}")


def audit_sink_argv(project: str) -> tuple[str, ...]:
    """Create the sink: System Event entries of instances (audit.sink_filter) to the audit topic. The
    entries carry no instance labels, so the filter cannot keep respawn's instances alone; on_audit
    ignores the others by name."""
    return ("gcloud", "logging", "sinks", "create", AUDIT_SINK, audit_destination(project),
            f"--log-filter={audit.sink_filter(project)}",
            "--description=respawn: Compute System Event audit entries of instances, to on_audit",
            f"--project={project}")


def audit_sink_update_argv(project: str) -> tuple[str, ...]:
    """Set the sink's destination and filter to respawn's, drop every exclusion and enable it: a sink
    made by an older deploy (another filter) or changed by hand is brought back (an exclusion drops
    the entries that match it, and respawn's filter already selects only what on_audit needs);
    the same values again change nothing."""
    return ("gcloud", "logging", "sinks", "update", AUDIT_SINK, audit_destination(project),
            f"--log-filter={audit.sink_filter(project)}", "--clear-exclusions", "--no-disabled",
            f"--project={project}")


def audit_publisher_argv(project: str, member: str) -> tuple[str, ...]:
    """Let the sink's writer identity (``member``, as Logging gives it: ``serviceAccount:...``) publish
    to the audit topic, and to nothing else."""
    return ("gcloud", "pubsub", "topics", "add-iam-policy-binding", AUDIT_TOPIC, f"--member={member}",
            "--role=roles/pubsub.publisher", f"--project={project}")


def writer_lookup(project: str) -> Lookup:
    return Lookup(SINK_WRITER, ("gcloud", "logging", "sinks", "describe", AUDIT_SINK, f"--project={project}",
                                "--format=value(writerIdentity)"))


METRICS_DIR = REPO_ROOT / "deploy" / "metrics"


def metric_files() -> list[Path]:
    """The log-based metrics deploy makes (``deploy/metrics/NAME.yaml``: a LogMetric each, the
    metric's name the file's), reading the figures entries of controller.core.fleet."""
    return sorted(METRICS_DIR.glob("respawn_*.yaml"))


def metric_step(project: str, path: Path) -> Step:
    """Create the log-based metric ``path`` defines, or, where it exists, update it to that file
    (gcloud's update sets every top-level field the file has): a metric an older deploy made, or
    one changed by hand, is brought back; the same file again changes nothing that counts."""
    name, config = path.stem, f"--config-from-file={path}"
    return Step(f"metric-{name}", f"create or update the log-based metric {name} ({path.relative_to(REPO_ROOT)})",
                ("gcloud", "logging", "metrics", "create", name, config, f"--project={project}"),
                probe=("gcloud", "logging", "metrics", "describe", name, f"--project={project}", "--format=json"),
                found_argv=("gcloud", "logging", "metrics", "update", name, config, f"--project={project}"),
                absent_if=("NOT_FOUND", "does not exist"),
                # created by another deploy between the look and the create: the next deploy updates it
                done_if=("already exists", "ALREADY_EXISTS", "is the subject of a conflict"))


def memory(text: str) -> str:
    """A function's memory as gcloud's ``--memory`` takes it (``512Mi``, ``1Gi``); ValueError
    naming the fix otherwise. Cloud Run functions take 128Mi to 32Gi."""
    m = re.fullmatch(r"(\d+)(Mi|Gi)", text.strip())
    mib = int(m[1]) * (1024 if m[2] == "Gi" else 1) if m else 0
    if not 128 <= mib <= 32 * 1024:
        raise ValueError(f"--memory {text!r}: give the functions' memory as 512Mi, 1Gi or 2Gi (128Mi to 32Gi)")
    return f"{m[1]}{m[2]}"  # type: ignore[index]


def plan(t: Target) -> list[Step]:
    project = f"--project={t.project}"
    bucket = f"gs://{t.bucket}"
    env = t.function_env()
    tpu = tpu_allowed(env)
    hidden = {key: value for key, value in env.items() if value and is_secret(key)}
    plain = {key: value for key, value in env.items() if key not in hidden}
    # A secret setting reaches the functions from Secret Manager, pinned to its latest version (Google
    # advises a number for a secret variable: "latest" is read only by instances started after it).
    secret_flag = "--set-secrets=" + gcloud_dict({key: f"{secret_id(key)}:{secret_version(secret_id(key))}"
                                                  for key in hidden}) if hidden else "--clear-secrets"
    versions = tuple(Lookup(secret_version(secret_id(key)), (
        "gcloud", "secrets", "versions", "describe", "latest", f"--secret={secret_id(key)}", project,
        "--format=value(name.basename())")) for key in hidden)
    common = ("--gen2", "--runtime=python311", f"--region={t.region}", project,
              f"--source={t.source}", f"--service-account={t.controller_sa}",
              "--set-env-vars=" + gcloud_dict(plain), "--set-build-env-vars=" + gcloud_dict(BUILD_ENV), secret_flag,
              f"--memory={memory(t.memory)}", f"--update-labels={revision.LABEL}={DIGEST}")
    controller, scheduler, trainer = (f"serviceAccount:{a}" for a in (t.controller_sa, t.scheduler_sa, t.trainer))
    job = f"projects/{t.project}/locations/{t.region}/jobs/respawn-tick"
    url = Lookup(URL_PLACEHOLDER, ("gcloud", "functions", "describe", TICK, "--gen2", f"--region={t.region}", project,
                                   "--format=value(serviceConfig.uri)"))

    def grant(name: str, title: str, where: str, member: str, role: str) -> Step:
        return Step(name, title, ("gcloud", "projects", "add-iam-policy-binding", where, f"--member={member}",
                                  f"--role={role}", "--condition=None"), retry_if=_IAM_LAG)

    def function(name: str, title: str, argv: tuple[str, ...], lookups: tuple[Lookup, ...] = ()) -> Step:
        """Deploy a function unless it is deployed already from this source with these flags."""
        return Step(name, title, argv, retry_if=_IAM_LAG, lookups=(*lookups, *versions), digest_of=t.source,
                    probe=("gcloud", "functions", "describe", argv[3], "--gen2", f"--region={t.region}", project,
                           "--format=json"),
                    absent_if=_NO_FUNCTION,
                    when_found=functools.partial(_redeploy, plain, t.controller_sa),
                    found_says=f"nothing if it is ACTIVE, labelled {revision.LABEL}=<this digest> and runs with these "
                               "variables, the command below otherwise",
                    unchanged_says="deployed already from this source with these flags: not deployed again")

    steps = [
        Step("apis", "enable the APIs respawn uses (enabled already is fine)",
             ("gcloud", "services", "enable", *(f"{api}.googleapis.com" for api in APIS), *((TPU_API,) if tpu else ()),
              *((SECRET_API,) if hidden else ()), project)),
        # Uniform access and public access prevention from the start: IAM Conditions need the
        # first, and nothing of respawn's is ever public.
        Step("bucket", f"create the control bucket in {t.region}, private, uniform access (if absent)",
             ("gcloud", "storage", "buckets", "create", bucket, f"--location={t.region}",
              "--uniform-bucket-level-access", "--public-access-prevention", project),
             lookups=(Lookup(PROJECT_NUMBER, ("gcloud", "projects", "describe", t.project,
                                              "--format=value(projectNumber)")),),
             probe=("gcloud", "storage", "buckets", "describe", bucket, "--raw", "--format=json"),
             check=functools.partial(usable_bucket, t.bucket),
             check_says="kept, unless it is another project's or has a retention policy, a default event-based "
                        "hold or requester pays (refused, saying which)"),
        # An existing bucket is kept: made as private as a created one (public access prevention
        # enforced: a public binding left on it would publish every spec and every record's secret).
        Step("uniform-access", "turn on uniform bucket-level access (IAM Conditions need it) and enforce public "
             "access prevention on the control bucket",
             ("gcloud", "storage", "buckets", "update", bucket, "--uniform-bucket-level-access",
              "--public-access-prevention", project)),
        *checkpoints_bucket_steps(t),
    ]
    for key, email, display, description in (
            ("controller", t.controller_sa, "respawn controller", "runs the respawn functions: tick, on_object, on_audit"),
            ("scheduler", t.scheduler_sa, "respawn scheduler", "calls the respawn tick function every minute"),
            ("trainer", t.trainer, "respawn trainer VMs",
             "runs respawn training VMs: writes only their records in the control bucket")):
        account_id, _, domain = email.partition("@")
        if domain == f"{t.project}.iam.gserviceaccount.com":  # one of another project's is used, never created
            steps.append(Step(f"{key}-account", f"create the {key}'s service account {email} (already there is fine)",
                              ("gcloud", "iam", "service-accounts", "create", account_id, project,
                               f"--display-name={display}", f"--description={description}"),
                              done_if=("already exists", "ALREADY_EXISTS")))
    steps += [
        Step("controller-bucket", "let the controller read and write every object of the control bucket",
             ("gcloud", "storage", "buckets", "add-iam-policy-binding", bucket, f"--member={controller}",
              "--role=roles/storage.objectUser", "--condition=None", project),
             retry_if=_IAM_LAG),
        # Write, never read: a record carries its attempt's secret, so a trainer that could
        # read another job's heartbeat could forge that job's exit record with it.
        Step("trainer-role", f"create the custom role {TRAINER_ROLE_ID}: create and overwrite objects, nothing else "
             "(one there with other permissions, disabled or deleted is made so again)",
             ("gcloud", "iam", "roles", "create", TRAINER_ROLE_ID, project,
              "--title=respawn VM records", "--description=write (never read or list) respawn VM records",
              f"--permissions={','.join(TRAINER_PERMISSIONS)}", "--stage=GA"),
             probe=("gcloud", "iam", "roles", "describe", TRAINER_ROLE_ID, project, "--format=json"),
             absent_if=_NO_ROLE, when_found=lambda found, _: role_fixes(t.project, found),
             found_says=f"{shlex.join(role_fixes(t.project, '{}')[-1])} (undeleted first if deleted) unless it has "
                        "exactly these permissions",
             unchanged_says=f"{TRAINER_ROLE_ID} has exactly {', '.join(TRAINER_PERMISSIONS)}",
             # created by another deploy between the look and the create: the next deploy checks it
             done_if=("already exists", "ALREADY_EXISTS")),
        Step("trainer-bucket", "let the trainer VMs write only jobs/<job>/exit, heartbeat, notice, ready and "
             "preempted-jobs/<job>",
             ("gcloud", "storage", "buckets", "add-iam-policy-binding", bucket,
              f"--member={trainer}", f"--role=projects/{t.project}/roles/{TRAINER_ROLE_ID}",
              "--condition=" + gcloud_dict({
                  "expression": trainer_condition(t.bucket),
                  "title": TRAINER_CONDITION_TITLE,
                  "description": "respawn VM records only: jobs/<job>/exit, heartbeat, notice, ready, "
                                 "preempted-jobs/<job>"}),
              project),
             retry_if=_IAM_LAG),
        Step("trainer-code", "let the trainer VMs read (never list, never write) the code tarballs respawn submit "
             "packs into code/",
             ("gcloud", "storage", "buckets", "add-iam-policy-binding", bucket,
              f"--member={trainer}", "--role=roles/storage.objectViewer",
              "--condition=" + gcloud_dict({
                  "expression": trainer_code_condition(t.bucket),
                  "title": TRAINER_CODE_CONDITION_TITLE,
                  "description": "code tarballs packed by respawn submit, read-only"}),
              project),
             retry_if=_IAM_LAG),
        # Without it no VM boots: its bootstrap runs nothing it could not fetch and check.
        Step("trainer-scripts", f"let the trainer VMs read (never list, never write) the VM scripts the controller "
             f"writes into {vmscripts.PREFIX}",
             ("gcloud", "storage", "buckets", "add-iam-policy-binding", bucket,
              f"--member={trainer}", "--role=roles/storage.objectViewer",
              "--condition=" + gcloud_dict({
                  "expression": trainer_scripts_condition(t.bucket),
                  "title": TRAINER_SCRIPTS_CONDITION_TITLE,
                  "description": "the VM scripts the controller writes, read-only"}),
              project),
             retry_if=_IAM_LAG),
        *checkpoints_grant_steps(t),
        # The guest agent writes the startup script's lines to GCEMetadataScripts with the VM's
        # account: where `respawn logs` reads a VM's output when its serial port is not logged.
        grant("trainer-logs", "let the trainer VMs write their logs to Cloud Logging (roles/logging.logWriter)",
              t.project, trainer, "roles/logging.logWriter"),
        # A spec's image: is pulled by its VM with the VM's own token (no key on the VM): read, never write.
        grant("trainer-images", "let the trainer VMs pull container images from the project's Artifact Registry "
              f"repositories ({TRAINER_REGISTRY_ROLE})", t.project, trainer, TRAINER_REGISTRY_ROLE),
        Step("act-as-trainer", "let the controller create VMs that run as the trainer account (on that account only)",
             ("gcloud", "iam", "service-accounts", "add-iam-policy-binding", t.trainer, f"--member={controller}",
              "--role=roles/iam.serviceAccountUser", "--condition=None", project),
             retry_if=_IAM_LAG),
    ]
    watched = dict.fromkeys((t.project, *[p for p in env.get("RESPAWN_ALLOWED_PROJECTS", "").split(",") if p]))
    for where in watched:
        at = "" if where == t.project else f"@{where}"
        steps.append(grant(f"controller-compute{at}", f"let the controller create, list and delete VMs in {where} "
                           "(roles/compute.instanceAdmin.v1)", where, controller, "roles/compute.instanceAdmin.v1"))
        if tpu:
            steps.append(grant(f"controller-tpu{at}", f"let the controller create, list and delete TPU nodes in {where} "
                               "(roles/tpu.admin)", where, controller, "roles/tpu.admin"))
    steps += [
        grant("controller-logs", "let the controller write its logs (roles/logging.logWriter)",
              t.project, controller, "roles/logging.logWriter"),
        # gen2 functions: the trigger runs as --trigger-service-account, or else --service-account
        # (gcloud's functions deploy): the controller's. Cloud Storage triggers need it to hold
        # roles/eventarc.eventReceiver, and the Cloud Storage service agent roles/pubsub.publisher.
        grant("trigger-events", "let on_object's trigger (the controller's account) receive events "
              "(roles/eventarc.eventReceiver)", t.project, controller, "roles/eventarc.eventReceiver"),
        dataclasses.replace(
            grant("storage-agent", "let the Cloud Storage service agent publish bucket events (roles/pubsub.publisher; "
                  "`gcloud storage service-agent` creates the agent if the project has none yet)",
                  t.project, f"serviceAccount:{STORAGE_AGENT}", "roles/pubsub.publisher"),
            lookups=(Lookup(STORAGE_AGENT, ("gcloud", "storage", "service-agent", project)),)),
    ]
    if topic := env.get("RESPAWN_NOTIFY_TOPIC"):
        steps.append(Step("notify-topic", f"let the controller publish job notices to {topic} (on that topic only)",
                          ("gcloud", "pubsub", "topics", "add-iam-policy-binding", topic, f"--member={controller}",
                           "--role=roles/pubsub.publisher", project),
                          retry_if=_IAM_LAG))
    for key, value in hidden.items():
        steps += secret_steps(t.project, key, value, controller)
    steps += [
        # Compute's System Event audit log (preemptions, host errors, guest terminations, terminating
        # maintenance) through a Logging sink to a topic that on_audit is triggered by. "Already
        # exists" is done: the update step below makes an existing sink's filter respawn's.
        Step("audit-topic", f"create the Pub/Sub topic {AUDIT_TOPIC} the audit sink publishes to (already there "
             "is fine)", audit_topic_argv(t.project), done_if=("already exists", "ALREADY_EXISTS")),
        Step("audit-sink", f"create the Logging sink {AUDIT_SINK}: Compute's System Event audit entries of "
             f"every instance of {t.project} (the entries carry no instance labels, so no filter can keep "
             f"respawn's alone: on_audit ignores other names), to {AUDIT_TOPIC} (already there is fine)",
             audit_sink_argv(t.project),
             # gcloud says of any 409 "... is the subject of a conflict: " before Logging's message
             done_if=("already exists", "ALREADY_EXISTS", "is the subject of a conflict")),
        Step("audit-publisher", f"let the sink's writer identity publish to {AUDIT_TOPIC} (on that topic only)",
             audit_publisher_argv(t.project, SINK_WRITER), lookups=(writer_lookup(t.project),),
             retry_if=_IAM_LAG),
        Step("audit-sink-update", f"make the sink's filter and destination respawn's, remove its exclusions and "
             "enable it (an older deploy's filter is replaced; the same again changes nothing)",
             audit_sink_update_argv(t.project)),
        function("tick", "deploy the tick function (HTTP, authenticated only)",
                 ("gcloud", "functions", "deploy", TICK, *common, "--entry-point=tick", "--trigger-http",
                  "--no-allow-unauthenticated", "--timeout=540s")),
        # The trigger lives where the bucket does (Eventarc: a Cloud Storage trigger's location is its bucket's).
        function("on-object", "deploy the on_object function (GCS finalize events, retried)",
                 ("gcloud", "functions", "deploy", ON_OBJECT, *common, "--entry-point=on_object",
                  "--trigger-event-filters=type=google.cloud.storage.object.v1.finalized",
                  f"--trigger-event-filters=bucket={t.bucket}", f"--trigger-location={BUCKET_LOCATION}",
                  f"--trigger-service-account={t.controller_sa}", "--retry", "--timeout=540s"),
                 lookups=(Lookup(BUCKET_LOCATION, ("gcloud", "storage", "buckets", "describe", bucket,
                                                   "--format=value(location)"), lower=True),)),
        # Retried: on_audit raises only for a transient failure (anything else it logs and absorbs).
        function("on-audit", f"deploy the on_audit function (Pub/Sub messages of {AUDIT_TOPIC}, retried)",
                 ("gcloud", "functions", "deploy", ON_AUDIT, *common, "--entry-point=on_audit",
                  f"--trigger-topic={AUDIT_TOPIC}", f"--trigger-service-account={t.controller_sa}", "--retry",
                  f"--timeout={AUDIT_TIMEOUT}")),
        *(shard_steps(t, common, function) if t.shards > 1 else ()),
        Step("tick-invoker", "let the scheduler's service account invoke tick",
             ("gcloud", "functions", "add-invoker-policy-binding", TICK, "--gen2", f"--region={t.region}",
              project, f"--member={scheduler}"),
             retry_if=_IAM_LAG),
        Step("on-object-invoker", "let on_object's trigger (the controller's account) invoke on_object",
             ("gcloud", "functions", "add-invoker-policy-binding", ON_OBJECT, "--gen2", f"--region={t.region}",
              project, f"--member={controller}"),
             retry_if=_IAM_LAG),
        Step("on-audit-invoker", "let on_audit's trigger (the controller's account) invoke on_audit",
             ("gcloud", "functions", "add-invoker-policy-binding", ON_AUDIT, "--gen2", f"--region={t.region}",
              project, f"--member={controller}"),
             retry_if=_IAM_LAG),
        Step("scheduler", "create or update the Cloud Scheduler job (google-cloud-scheduler API)", request={
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
        }, lookups=(url,)),
        *(metric_step(t.project, path) for path in metric_files()),
    ]
    redacted = secrets_of(env)
    return [dataclasses.replace(step, secrets=redacted) for step in steps]


def checkpoints_bucket_steps(t: Target) -> list[Step]:
    """The checkpoints bucket (``respawn run``'s default place: gs://CONTROL-checkpoints/<job>), where the
    control bucket is, private and uniform as it is; an existing one is kept unless it would break
    checkpoints (``usable_checkpoints_bucket``). None where the control bucket's name leaves none."""
    if t.checkpoints is None:
        return []
    project, bucket = f"--project={t.project}", f"gs://{t.checkpoints}"
    return [Step(
        "checkpoints-bucket", f"create the checkpoints bucket {bucket} (respawn run's default checkpoint.uri: "
        f"{bucket}/<job>) where the control bucket is, private, uniform access (if absent)",
        ("gcloud", "storage", "buckets", "create", bucket, f"--location={BUCKET_LOCATION}",
         "--uniform-bucket-level-access", "--public-access-prevention", project),
        lookups=(Lookup(PROJECT_NUMBER, ("gcloud", "projects", "describe", t.project, "--format=value(projectNumber)")),
                 Lookup(BUCKET_LOCATION, ("gcloud", "storage", "buckets", "describe", f"gs://{t.bucket}",
                                          "--format=value(location)"), lower=True)),
        probe=("gcloud", "storage", "buckets", "describe", bucket, "--raw", "--format=json"),
        check=functools.partial(usable_checkpoints_bucket, t.checkpoints),
        check_says="kept, unless it is another project's or has a retention policy, a default event-based hold "
                   "or requester pays (refused, saying which)")]


def checkpoints_grant_steps(t: Target) -> list[Step]:
    """Trainers read and write checkpoints there (every job's: they share the account, deploy/IAM.md),
    and the controller lists them to find a job's latest complete one. On that bucket only: the
    trainers' grants on the control bucket stay its records' writes and two reads."""
    if t.checkpoints is None:
        return []
    project, bucket = f"--project={t.project}", f"gs://{t.checkpoints}"
    return [
        Step("trainer-checkpoints", f"let the trainer VMs read and write checkpoints in {bucket} "
             "(roles/storage.objectUser, on that bucket only)",
             ("gcloud", "storage", "buckets", "add-iam-policy-binding", bucket, f"--member=serviceAccount:{t.trainer}",
              "--role=roles/storage.objectUser", "--condition=None", project), retry_if=_IAM_LAG),
        Step("controller-checkpoints", f"let the controller list and read checkpoints in {bucket} "
             "(roles/storage.objectViewer, on that bucket only)",
             ("gcloud", "storage", "buckets", "add-iam-policy-binding", bucket,
              f"--member=serviceAccount:{t.controller_sa}", "--role=roles/storage.objectViewer", "--condition=None",
              project), retry_if=_IAM_LAG),
    ]


def shard_steps(t: Target, common: tuple[str, ...], function: Callable[..., Step]) -> list[Step]:
    """K > 1: the shards' topic, the controller's publish on it (the tick publishes as the controller),
    on_shard with its Pub/Sub trigger, and its invoker. Not retried (no --retry): on_shard raises for
    nothing a redelivery would fix, and a late message is dropped for the next tick's."""
    project, controller = f"--project={t.project}", f"serviceAccount:{t.controller_sa}"
    return [
        Step("shard-topic", f"create the Pub/Sub topic {SHARD_TOPIC} the tick publishes each shard's listing to "
             "(already there is fine)", ("gcloud", "pubsub", "topics", "create", SHARD_TOPIC, project),
             done_if=("already exists", "ALREADY_EXISTS")),
        Step("shard-publisher", f"let the controller (the tick) publish to {SHARD_TOPIC} (on that topic only)",
             ("gcloud", "pubsub", "topics", "add-iam-policy-binding", SHARD_TOPIC, f"--member={controller}",
              "--role=roles/pubsub.publisher", project), retry_if=_IAM_LAG),
        function("on-shard", f"deploy the on_shard function ({t.shards} shards: Pub/Sub messages of {SHARD_TOPIC})",
                 ("gcloud", "functions", "deploy", ON_SHARD, *common, "--entry-point=on_shard",
                  f"--trigger-topic={SHARD_TOPIC}", f"--trigger-service-account={t.controller_sa}",
                  f"--timeout={SHARD_TIMEOUT}")),
        Step("on-shard-invoker", "let on_shard's trigger (the controller's account) invoke on_shard",
             ("gcloud", "functions", "add-invoker-policy-binding", ON_SHARD, "--gen2", f"--region={t.region}",
              project, f"--member={controller}"), retry_if=_IAM_LAG),
    ]


def _redeploy(env: Mapping[str, str], account: str, found: str, argv: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """The function deploy ``argv``, unless the function ``found`` describes is what it would make."""
    wanted = next(a for a in argv if a.startswith("--update-labels=")).rpartition("=")[2]
    return () if revision.unchanged(found, wanted, env, account) else (argv,)


def role_fixes(project: str, description: str) -> tuple[tuple[str, ...], ...]:
    """What makes the custom role ``gcloud iam roles describe --format=json`` described respawn's: its
    permissions exactly TRAINER_PERMISSIONS (more would let trainers read or list the records; fewer,
    not write them), enabled (stage GA), not deleted (a deleted role grants nothing for up to 44
    days, and cannot be made again under its id meanwhile: it is undeleted)."""
    try:
        found = json.loads(description)
    except ValueError:
        found = {}
    found = found if isinstance(found, dict) else {}
    update = ("gcloud", "iam", "roles", "update", TRAINER_ROLE_ID, f"--project={project}",
              f"--permissions={','.join(TRAINER_PERMISSIONS)}", "--stage=GA")
    fixes: list[tuple[str, ...]] = []
    if found.get("deleted"):
        fixes.append(("gcloud", "iam", "roles", "undelete", TRAINER_ROLE_ID, f"--project={project}"))
    if found.get("deleted") or sorted(found.get("includedPermissions") or ()) != sorted(TRAINER_PERMISSIONS) \
            or found.get("stage") == "DISABLED":
        fixes.append(update)
    return tuple(fixes)


def secret_steps(project: str, key: str, value: str, controller: str) -> list[Step]:
    """Setting ``key`` (a secret) in Secret Manager: the secret, its value as its latest version (from
    standard input, never a command line: ``ps`` shows a command line to every user of the machine;
    a new version only when the value changed), and the controller's read of that secret alone.
    The functions read it with ``--set-secrets``, never as a plain variable a project Viewer reads."""
    secret, where = secret_id(key), f"--project={project}"
    return [
        Step(f"secret-{secret}", f"create the Secret Manager secret {secret}, which holds {key} (already there is fine)",
             ("gcloud", "secrets", "create", secret, "--replication-policy=automatic", where),
             done_if=("already exists", "ALREADY_EXISTS")),
        Step(f"secret-{secret}-value", f"store {key} as the latest version of {secret}, from standard input",
             ("gcloud", "secrets", "versions", "add", secret, "--data-file=-", where), stdin=value,
             probe=("gcloud", "secrets", "versions", "access", "latest", f"--secret={secret}", where),
             absent_if=_NO_VERSION, when_found=lambda found, argv: () if found.rstrip("\n") == value else (argv,),
             found_says="nothing if its latest version holds this value, the command below otherwise",
             unchanged_says="its latest version holds this value already"),
        Step(f"secret-{secret}-access", f"let the controller read {secret} (roles/secretmanager.secretAccessor, on "
             "that secret only)",
             ("gcloud", "secrets", "add-iam-policy-binding", secret, f"--member={controller}",
              "--role=roles/secretmanager.secretAccessor", "--condition=None", where),
             retry_if=_IAM_LAG),
    ]


def start_at(steps: list[Step], wanted: str) -> int:
    """The number of the step ``--from`` names (its number or its name)."""
    if wanted.isdigit() and 1 <= int(wanted) <= len(steps):
        return int(wanted)
    for number, step in enumerate(steps, 1):
        if step.name == wanted:
            return number
    raise ValueError(f"--from {wanted!r}: no such step; name one of 1-{len(steps)} or "
                     f"{', '.join(s.name for s in steps)}")


class StepFailed(Exception):
    """Step ``number`` failed (``command`` and ``output``: gcloud's, secrets redacted) or refused."""

    def __init__(self, number: int, step: Step, reason: str, command: str = "", output: str = "",
                 refused: bool = False) -> None:
        super().__init__(reason)
        self.number, self.step, self.reason = number, step, reason
        self.command, self.output, self.refused = command, output, refused


Runner = Callable[..., str]  # (argv) or (argv, stdin) -> what it printed; CalledProcessError when it failed


def summary(steps: Sequence[Step], first: int = 1) -> str:
    """What a dry run's plan comes to, in one paragraph: how many steps, and each one's name in order."""
    shown = steps[first - 1:]
    return f"{len(shown)} steps, in order: {', '.join(step.name for step in shown)}"


def gcloud_account(run: Callable[[tuple[str, ...]], str] | None = None) -> str | None:
    """The account gcloud is logged in as (what every step runs as), or None: no gcloud, or no login."""
    try:
        found = (run or run_command)(("gcloud", "auth", "list", "--filter=status:ACTIVE", "--format=value(account)"))
    except (OSError, subprocess.CalledProcessError):
        return None
    return found.strip().splitlines()[0] if found.strip() else None


def run_command(argv: tuple[str, ...], stdin: str | None = None) -> str:
    # stdin closed unless given: gcloud must never wait for an answer nobody will type. A secret goes
    # through stdin, never argv: another user of this machine sees a command line in `ps`.
    if stdin is None:
        return subprocess.run(argv, check=True, capture_output=True, text=True, stdin=subprocess.DEVNULL).stdout
    return subprocess.run(argv, check=True, capture_output=True, text=True, input=stdin).stdout


def _run_step(step: Step, run: Runner, sleep: Callable[[float], None], tries: int = 6) -> None:
    for attempt in range(1, tries + 1):
        try:
            run(step.argv, step.stdin) if step.stdin else run(step.argv)
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


def _carry_out(step: Step, t: Target, run: Runner, sleep: Callable[[float], None],
               schedule: Callable[[dict[str, Any]], None]) -> str | None:
    """Do the step; what to say besides its title (something found as respawn needs it), if anything."""
    values = {}
    for lookup in step.lookups:
        found = run(lookup.argv).strip()
        values[lookup.placeholder] = found.lower() if lookup.lower else found

    def filled(text: str) -> str:
        for placeholder, value in values.items():
            text = text.replace(placeholder, value)
        return text

    argv = tuple(filled(a) for a in step.argv)
    if step.digest_of is not None:
        digest = revision.label(revision.source_digest(step.digest_of), argv)
        argv = tuple(a.replace(DIGEST, digest) for a in argv)
    if step.probe:
        try:
            description = run(step.probe)
        except subprocess.CalledProcessError as error:
            if not any(text in f"{error.stderr or ''}{error.stdout or ''}" for text in step.absent_if or _ABSENT):
                raise
        else:
            if step.check:
                step.check(description, values)
            if step.when_found:
                todo = step.when_found(description, argv)
                for command in todo:
                    _run_step(dataclasses.replace(step, argv=command, stdin=step.stdin if command == argv else ""),
                              run, sleep)
                return None if todo else step.unchanged_says or "found as respawn needs it: nothing to do"
            if step.found_argv:
                _run_step(dataclasses.replace(step, argv=tuple(filled(a) for a in step.found_argv)), run, sleep)
            return None
    if step.argv:
        _run_step(dataclasses.replace(step, argv=argv), run, sleep)
    elif step.request is not None:
        schedule(json.loads(filled(json.dumps(step.request))))
    return None


def execute(steps: list[Step], t: Target, run: Runner | None = None, say: Callable[[str], None] = print,
            sleep: Callable[[float], None] | None = None, start: int = 1,
            schedule: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Carry the plan out from step ``start`` (1: all of it); each step is safe to run again.

    A step that fails or refuses raises StepFailed, naming it (its number and name: what
    ``--from`` takes to resume there), secrets redacted."""
    for number, step in enumerate(steps, 1):
        if number < start:
            continue
        say(f"{number}. {step.name}: {step.title}")
        try:
            note = _carry_out(step, t, run or run_command, sleep or time.sleep, schedule or _upsert_scheduler_job)
        except Refusal as refusal:
            raise StepFailed(number, step, str(refusal), refused=True) from None
        except subprocess.CalledProcessError as error:
            error = _redacted(error, step.secrets)
            command = shlex.join(error.cmd) if isinstance(error.cmd, (list, tuple)) else str(error.cmd)
            raise StepFailed(number, step, f"{command} failed", command=command,
                             output=(error.stderr or error.stdout or "").strip()) from None
        except Exception as error:  # the Scheduler or Storage client: a Google API error
            raise StepFailed(number, step, redact(f"{type(error).__name__}: {error}", step.secrets)) from None
        if note:
            say(f"   {note}")


def _upsert_scheduler_job(request: dict[str, Any]) -> None:
    from google.api_core import exceptions
    from google.cloud import scheduler_v1

    client = scheduler_v1.CloudSchedulerClient()
    job = scheduler_v1.Job(request["job"])
    try:
        client.create_job(parent=request["parent"], job=job)
    except exceptions.AlreadyExists:
        client.update_job(job=job)
