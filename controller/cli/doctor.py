"""``respawn doctor``: can respawn work on this project? One line per check, ✓ or ✗, each ✗ with
the command that fixes it (as ``sky check`` does for SkyPilot).

The checks read what ``respawn deploy`` makes (controller.cli.deploy) and compare: the project,
the APIs respawn needs, the control bucket and its IAM, the three functions, the Scheduler job,
the controller's last pass (``respawn/controller.json``) and the errors it recorded, the checkpoints
bucket (``respawn run``'s default place: there, the trainer's read and write, the controller's list), the IAM bindings
(what each identity may do, judged by the permissions of the roles it holds: controller.cli.grants),
the custom role's permissions, and the audit path
(the Logging sink of Compute's System Event audit entries, its filter and exclusions, its Pub/Sub topic,
the sink's right to publish there, the controller's right to read those entries), the log-based metrics
of the fleet's figures (``deploy/metrics``); with a SPEC, also
that spec's GPU quotas in each of its regions (Cloud TPU's quotas in each of its zones), its boot
image, its service account, for ``image:`` on Artifact Registry that the container image exists
and that the account may pull it (controller.cli.imagecheck), and that its checkpoint bucket and its
``code:`` tarball are there, judged as ``respawn submit`` judges them (controller.service.places).

Checks are independent: each calls its own APIs (``Apis``, a port: Google's in
controller.adapters.doctor, fakes in tests), runs on a thread of its own beside the others, and
is given ``timeout`` seconds: one that fails, raises or hangs is its own ✗, never another's.
"""

from __future__ import annotations

import concurrent.futures
import json
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from controller.cli import buckets, deploy, grants, imagecheck
from controller.core import audit, errors, quotas
from controller.core.ports import BlobStore
from controller.core.quotas import QuotaUse
from controller.core.spec import JobSpec, built_in_gpus
from controller.service import lastpass, places, vmscripts

FINALIZED = "google.cloud.storage.object.v1.finalized"
# The APIs respawn (its deploy, its functions, its VMs) calls. tpu only where TPU jobs may run.
SERVICES = ("compute", "cloudfunctions", "run", "cloudbuild", "artifactregistry", "eventarc", "pubsub",
            "cloudscheduler", "logging", "iam", "storage")
TPU_SERVICE = "tpu"
PROBE_PREFIX = "respawn/doctor-probe-"
# Roles that let a principal read every object of a bucket (on the bucket or its project). The
# trainer must hold none of them: its records carry their attempt's secret.
READER_ROLES = ("roles/storage.objectViewer", "roles/storage.objectUser", "roles/storage.objectAdmin",
                "roles/storage.admin", "roles/storage.legacyObjectReader", "roles/storage.legacyBucketReader",
                "roles/storage.legacyBucketOwner", "roles/storage.legacyBucketWriter", "roles/viewer",
                "roles/editor", "roles/owner")
PUBLIC = ("allUsers", "allAuthenticatedUsers")
ACT_AS = ("roles/iam.serviceAccountUser", "roles/iam.serviceAccountAdmin", "roles/editor", "roles/owner")
# Roles that let a principal publish to a topic (on the topic or its project).
PUBLISH = ("roles/pubsub.publisher", "roles/pubsub.editor", "roles/pubsub.admin", "roles/editor", "roles/owner")


class Apis(Protocol):
    """What the checks read. Each method raises ``errors.NotFound`` for a resource that does not
    exist (or that Google will not say exists: a project answers 403 either way), anything else
    for a failure to read it."""

    def whoami(self) -> str: ...
    def project(self, project: str) -> Mapping[str, Any]: ...  # CRM v3 Project
    def services(self, project: str, names: Sequence[str]) -> Mapping[str, str]: ...  # "compute.googleapis.com" -> state
    def bucket(self, bucket: str) -> Mapping[str, Any]: ...  # {"uniform": bool}
    def write_probe(self, bucket: str, name: str) -> None: ...  # write, then delete, a small object
    def bucket_policy(self, bucket: str) -> Sequence[Mapping[str, Any]]: ...  # bindings (policy version 3)
    def project_policy(self, project: str) -> Sequence[Mapping[str, Any]]: ...
    def account(self, email: str) -> Mapping[str, Any]: ...  # IAM v1 ServiceAccount
    def account_policy(self, email: str) -> Sequence[Mapping[str, Any]]: ...
    def function(self, project: str, region: str, name: str) -> Mapping[str, Any]: ...  # Cloud Functions v2
    def scheduler_job(self, project: str, region: str, name: str) -> Mapping[str, Any]: ...  # Cloud Scheduler v1
    def sink(self, project: str, name: str) -> Mapping[str, Any]: ...  # Logging v2 LogSink
    def log_metrics(self, project: str) -> Mapping[str, Mapping[str, Any]]: ...  # Logging v2 LogMetrics by name
    def topic(self, project: str, name: str) -> Mapping[str, Any]: ...  # Pub/Sub v1 Topic
    def topic_policy(self, project: str, name: str) -> Sequence[Mapping[str, Any]]: ...  # its bindings
    def last_pass(self, bucket: str) -> lastpass.LastPass | None: ...
    def region_quotas(self, project: str, region: str) -> dict[str, QuotaUse]: ...  # ports.QuotaReader
    def image(self, project: str, *, name: str | None = None, family: str | None = None) -> Mapping[str, Any]: ...
    def role(self, name: str) -> Mapping[str, Any]: ...  # IAM v1 Role: roles/X, projects/P/roles/X
    def service_policy(self, service: str) -> Sequence[Mapping[str, Any]]: ...  # a Cloud Run v2 service's bindings
    def tpu_quotas(self, project: str) -> Sequence[Mapping[str, Any]]: ...  # Service Usage v1beta1 ConsumerQuotaMetrics
    def repository(self, name: str) -> Mapping[str, Any]: ...  # Artifact Registry v1 Repository
    def repository_policy(self, name: str) -> Sequence[Mapping[str, Any]]: ...  # its bindings
    def image_tag(self, name: str) -> Mapping[str, Any]: ...  # Artifact Registry v1 Tag
    def image_version(self, name: str) -> Mapping[str, Any]: ...  # Artifact Registry v1 Version
    def store(self) -> BlobStore: ...  # a spec's checkpoint bucket and code tarball, read as submit reads them


@dataclass(frozen=True)
class Result:
    name: str
    ok: bool
    detail: str
    fix: str = ""  # the command (or step) that fixes a ✗
    note: bool = False  # a ✓ that could not be fully checked (said, never failing)


@dataclass(frozen=True)
class Target:
    """What is checked: the deployment (as ``respawn deploy`` names it), and the controller's policy."""

    project: str
    bucket: str
    region: str
    controller_sa: str
    trainer_sa: str
    tpu: bool = False  # TPU types allowed: the tpu API is needed too
    slices: bool = False  # TPU slices in Compute Engine (a spec's tpu.machine_type): MIGs, templates, policies
    scheduler_sa: str = ""  # when the Scheduler job names none (default: respawn-scheduler@PROJECT)
    watched: tuple[str, ...] = ()  # the other projects the controller runs jobs in (RESPAWN_ALLOWED_PROJECTS)
    shards: int = 1  # RESPAWN_SHARDS: K > 1, the fan-out is checked (its topic, the tick's grant, on_shard)

    @property
    def deploy_command(self) -> str:
        return shlex.join(["respawn", "deploy", f"--project={self.project}", f"--region={self.region}",
                           f"--bucket={self.bucket}"])

    def deploy_from(self, step: str) -> str:
        """``respawn deploy`` resumed at ``step``: that step and everything after it (each safe again)."""
        return f"{self.deploy_command} --from {step}"


class Failed(Exception):
    """A check's ✗: what is wrong and what fixes it."""

    def __init__(self, detail: str, fix: str = "") -> None:
        super().__init__(detail)
        self.detail, self.fix = detail, fix


# name, () -> detail, or (detail, note) or (detail, note, fix): a ✓ said with a reservation; raises Failed
Check = tuple[str, Callable[[], str | tuple[str, bool] | tuple[str, bool, str]]]


def run(checks: Sequence[Check], timeout: float) -> list[Result]:
    """Every check on a thread of its own, side by side; each given ``timeout`` seconds.

    Daemon threads, not a ThreadPoolExecutor: the interpreter joins an executor's threads at
    exit, so a check hung on an API would hold ``respawn doctor`` open after its answer."""
    futures = []
    for number, (name, fn) in enumerate(checks):
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        threading.Thread(target=_settle, args=(future, fn), name=f"doctor-{number}", daemon=True).start()
        futures.append((name, future))
    deadline = time.monotonic() + timeout
    return [_result(name, future, deadline) for name, future in futures]


def _settle(future: concurrent.futures.Future[Any], fn: Callable[[], Any]) -> None:
    try:
        future.set_result(fn())
    except BaseException as e:  # noqa: BLE001 - the check's own ✗ (_result says which)
        future.set_exception(e)


def _result(name: str, future: concurrent.futures.Future[Any], deadline: float) -> Result:
    try:
        value = future.result(timeout=max(0.0, deadline - time.monotonic()))
    except concurrent.futures.TimeoutError:
        return Result(name, False, "no answer in time", "run it again; if it keeps timing out, check your network")
    except Failed as e:
        return Result(name, False, e.detail, e.fix)
    except Exception as e:  # noqa: BLE001 - a check that broke is that check's ✗, never the doctor's
        return Result(name, False, _said(e), "")
    detail, note, fix = (*value, "")[:3] if isinstance(value, tuple) else (value, False, "")
    return Result(name, True, detail, fix, note=note)


def _said(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    if isinstance(error, errors.NotFound):
        return f"not found: {text}"
    return text if isinstance(error, errors.RespawnError) else f"{type(error).__name__}: {text}"


def _missing(apis: Apis, bucket: str) -> bool:
    try:
        apis.bucket(bucket)
    except errors.NotFound:
        return True
    except Exception:  # noqa: BLE001 - not known to be missing
        return False
    return False


# -- the deployment's checks ---------------------------------------------------------------------
def checks(apis: Apis, t: Target, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> list[Check]:
    p, b, r = t.project, t.bucket, t.region
    gs = f"gs://{b}"
    roles = grants.Roles(lambda name: apis.role(name))
    controller_member = f"serviceAccount:{t.controller_sa}"

    def credentials() -> str:
        try:
            return f"found: {apis.whoami()}"
        except Exception as e:  # noqa: BLE001
            raise Failed(f"none usable: {_said(e)}", "gcloud auth application-default login") from e

    def project() -> str:
        try:
            found = apis.project(p)
        except errors.NotFound as e:
            raise Failed(f"{p} does not exist, or you may not see it ({e})",
                         f"gcloud projects describe {p}  # or set RESPAWN_PROJECT to your project's id") from e
        state = found.get("state", "STATE_UNSPECIFIED")
        if state != "ACTIVE":
            raise Failed(f"{p} is {state}", f"gcloud projects undelete {p}")
        return f"{p} ({found.get('name', '')}, ACTIVE)"

    def apis_enabled() -> str:
        wanted = [*SERVICES, *([TPU_SERVICE] if t.tpu else [])]
        states = apis.services(p, [f"{s}.googleapis.com" for s in wanted])
        off = [s for s in wanted if states.get(f"{s}.googleapis.com") != "ENABLED"]
        if off:
            raise Failed(f"not enabled: {', '.join(off)}",
                         shlex.join(["gcloud", "services", "enable", *(f"{s}.googleapis.com" for s in off),
                                     f"--project={p}"]))
        return f"{len(wanted)} enabled ({', '.join(wanted)})"

    deployed: list[concurrent.futures.Future[str | None]] = []
    deployed_lock = threading.Lock()

    def deployed_bucket() -> str | None:
        """The bucket the deployed on_object is triggered by, when it is another that exists: then
        RESPAWN_BUCKET is what is wrong (a typo), not the deployment, which must not be moved to it.
        Asked once per doctor run, however many checks find the control bucket missing (as ``Roles``)."""
        with deployed_lock:
            mine = not deployed
            if mine:
                deployed.append(concurrent.futures.Future())
        if mine:
            deployed[0].set_result(_deployed_bucket())
        return deployed[0].result()

    def _deployed_bucket() -> str | None:
        try:
            trigger = apis.function(p, r, deploy.ON_OBJECT).get("eventTrigger") or {}
            other = {f.get("attribute"): f.get("value") for f in trigger.get("eventFilters") or []}.get("bucket")
            if not other or other == b:
                return None
            apis.bucket(other)
        except Exception:  # noqa: BLE001 - none to point at: the usual fix
            return None
        return str(other)

    def no_bucket(then: str = "") -> Failed:
        """A check of the control bucket, which is not there: its fix is the bucket check's, never another.
        Where RESPAWN_BUCKET is a typo of the deployed controller's bucket, setting it (never making the
        typo's bucket); otherwise making it (``then``: what follows)."""
        if other := deployed_bucket():
            return Failed(f"{gs} does not exist",
                          f"export RESPAWN_BUCKET={shlex.quote(other)}  # see the bucket check: the deployed controller's")
        return Failed(f"{gs} does not exist", f"create it first (see the bucket check){then}")

    def control_policy() -> Sequence[Mapping[str, Any]]:
        try:
            return apis.bucket_policy(b)
        except errors.NotFound as e:
            raise no_bucket() from e

    def bucket() -> str:
        try:
            apis.bucket(b)
        except errors.NotFound as e:
            if other := deployed_bucket():
                raise Failed(f"{gs} does not exist, and the deployed controller ({deploy.ON_OBJECT}) uses gs://{other}",
                             f"export RESPAWN_BUCKET={shlex.quote(other)}  # the deployed controller's bucket") from e
            raise Failed(f"{gs} does not exist, or you may not see it",
                         f"gcloud storage buckets create {gs} --project={p} --location={r} "
                         "--uniform-bucket-level-access") from e
        return f"{gs} reachable"

    def uniform() -> str:
        try:
            found = apis.bucket(b)
        except errors.NotFound as e:
            raise no_bucket(then=f", then {t.deploy_command}") from e
        if not found.get("uniform"):
            raise Failed(f"off on {gs}: IAM Conditions (the trainer's) need it",
                         f"gcloud storage buckets update {gs} --uniform-bucket-level-access --project={p}")
        return "on"

    def writable() -> str:
        name = f"{PROBE_PREFIX}{int(time.time() * 1000)}"
        try:
            apis.write_probe(b, name)
        except errors.NotFound as e:
            raise no_bucket() from e
        except Exception as e:  # noqa: BLE001
            raise Failed(f"could not write and delete {gs}/{name}: {_said(e)}",
                         f"gcloud storage buckets add-iam-policy-binding {gs} --member=user:YOU "
                         f"--role=roles/storage.objectUser --project={p}") from e
        return f"wrote and deleted {gs}/{name}"

    def bucket_iam() -> str:
        policy = control_policy()
        bindings = _bindings(policy)
        controller, trainer = f"serviceAccount:{t.controller_sa}", f"serviceAccount:{t.trainer_sa}"
        problems, fixes = [], []
        # The controller's own writes (status.json, its last pass record) and reads, by what its roles
        # grant on the bucket or the project: a custom role or a project grant counts as deploy's.
        found = grants.held(roles, controller, grants.OBJECTS, policy, apis.project_policy(p))
        if missing := found.missing(grants.OBJECTS):
            problems.append(_lacks(f"the controller ({t.controller_sa})", missing, gs, found.unread))
            fixes.append(f"gcloud storage buckets add-iam-policy-binding {gs} --member={controller} "
                         f"--role=roles/storage.objectUser --condition=None --project={p}")
        if not any(x.role == _trainer_role(p) and trainer in x.members and _trainer_condition(x, b) for x in bindings):
            problems.append(f"the trainer ({t.trainer_sa}) lacks {_trainer_role(p)} conditioned to its records")
            fixes.append(t.deploy_command)
        # Every VM's bootstrap fetches the agent from there: without the read, no VM runs anything.
        if not any(trainer in x.members and _scripts_read(x, b) for x in bindings):
            problems.append(f"the trainer ({t.trainer_sa}) may not read the VM scripts ({vmscripts.PREFIX}): "
                            "no VM can start its agent")
            fixes.append(t.deploy_from("trainer-scripts"))
        if problems:
            raise Failed("; ".join(problems), "\n".join(fixes))
        return (f"the controller may read, write and list its objects ({', '.join(found.roles(grants.OBJECTS))}); "
                f"trainer {deploy.TRAINER_ROLE_ID} on its records only, and a read of {vmscripts.PREFIX}")

    def checkpoints_bucket() -> str | tuple[str, bool]:
        """``respawn run``'s default place for checkpoints (controller.cli.buckets): there, the trainer
        may read, write and list it, the controller list and read it."""
        try:
            name = buckets.checkpoints_bucket(b)
        except ValueError as e:
            return f"none: {e}: respawn run asks each job for --checkpoint gs://...", True
        where, trainer = f"gs://{name}", f"serviceAccount:{t.trainer_sa}"
        grant = {trainer: "roles/storage.objectUser", controller_member: "roles/storage.objectViewer"}
        fix = {m: f"gcloud storage buckets add-iam-policy-binding {where} --member={m} --role={role} --condition=None "
                  f"--project={p}" for m, role in grant.items()}
        try:
            policy = apis.bucket_policy(name)
        except errors.NotFound as e:
            if _missing(apis, b):  # a mistyped RESPAWN_BUCKET: never a -checkpoints bucket made for the typo
                raise no_bucket() from e
            raise Failed(f"{where} does not exist: respawn run's default checkpoints ({where}/<job>) have nowhere to "
                         "go, and such a job is refused",
                         "\n".join([f"gcloud storage buckets create {where} --project={p} --location={r} "
                                    "--uniform-bucket-level-access --public-access-prevention", *fix.values(),
                                    f"# or: {t.deploy_from('checkpoints-bucket')}"])) from e
        trainer_holds = grants.held(roles, trainer, grants.OBJECTS, policy)
        controller_holds = grants.held(roles, controller_member, grants.LIST_OBJECTS, policy, apis.project_policy(p))
        problems, fixes = [], []
        if missing := trainer_holds.missing(grants.OBJECTS):
            problems.append(_lacks(f"the trainer ({t.trainer_sa})", missing, where, trainer_holds.unread)
                            + ": its jobs can neither save nor resume there")
            fixes.append(fix[trainer])
        if missing := controller_holds.missing(grants.LIST_OBJECTS):
            problems.append(_lacks(f"the controller ({t.controller_sa})", missing, where, controller_holds.unread)
                            + ": it cannot find a job's latest checkpoint there")
            fixes.append(fix[controller_member])
        if problems:
            raise Failed("; ".join(problems), "\n".join(fixes))
        return (f"{where}: the trainer may read and write it ({', '.join(trainer_holds.roles(grants.OBJECTS))}), "
                f"the controller list it ({', '.join(controller_holds.roles(grants.LIST_OBJECTS))})")

    def trainer_reads() -> str:
        trainer = f"serviceAccount:{t.trainer_sa}"
        problems, fixes = [], []
        for x in _bindings(control_policy()):
            public = [m for m in x.members if m in PUBLIC]
            if public:  # whatever the role: anyone, the trainer included
                problems.append(f"{gs} grants {x.role} to {', '.join(public)}")
                fixes += [f"gcloud storage buckets remove-iam-policy-binding {gs} --member={m} --role={x.role}"
                          for m in public]
            if trainer in x.members and not (x.role == _trainer_role(p) and _trainer_condition(x, b)) \
                    and not _code_read(x, b) and not _scripts_read(x, b):
                problems.append(f"the trainer holds {x.role} on {gs}" + (" (conditioned otherwise)" if x.condition else ""))
                fixes.append(f"gcloud storage buckets remove-iam-policy-binding {gs} --member={trainer} --role={x.role}"
                             + (" --all" if x.condition else ""))
        for x in _bindings(apis.project_policy(p)):
            if trainer in x.members and (x.role in READER_ROLES or x.role.startswith("roles/storage.")):
                problems.append(f"the trainer holds {x.role} on project {p}")
                fixes.append(f"gcloud projects remove-iam-policy-binding {p} --member={trainer} --role={x.role}")
        if problems:
            raise Failed("; ".join(problems) + ": trainer VMs could read other jobs' records", "\n".join(fixes))
        return f"{t.trainer_sa} may write its records only (no list; reads only code/ and {vmscripts.PREFIX})"

    def project_iam() -> str:
        trainer = f"serviceAccount:{t.trainer_sa}"
        if not any(x.role == "roles/logging.logWriter" and trainer in x.members and not x.condition
                   for x in _bindings(apis.project_policy(p))):
            raise Failed("the trainer account lacks roles/logging.logWriter (its VMs' logs for respawn logs)",
                         f"gcloud projects add-iam-policy-binding {p} --member={trainer} "
                         "--role=roles/logging.logWriter --condition=None")
        return f"trainer roles/logging.logWriter on {p}"

    def trainer_account() -> str:
        try:
            apis.account(t.trainer_sa)
        except errors.NotFound as e:
            raise Failed(f"{t.trainer_sa} does not exist", t.deploy_command) from e
        if not _may_act_as(apis, t, t.trainer_sa):
            raise Failed(f"the controller ({t.controller_sa}) may not act as {t.trainer_sa}: VMs cannot run as it",
                         f"gcloud iam service-accounts add-iam-policy-binding {t.trainer_sa} "
                         f"--member=serviceAccount:{t.controller_sa} --role=roles/iam.serviceAccountUser "
                         f"--condition=None --project={p}")
        return f"{t.trainer_sa} exists; the controller may act as it"

    def function(name: str, http: bool) -> Callable[[], str]:
        def check() -> str:
            redeploy = t.deploy_from("on-audit") if name == deploy.ON_AUDIT else t.deploy_command
            try:
                found = apis.function(p, r, name)
            except errors.NotFound as e:
                raise Failed(f"not deployed in {p}/{r}", redeploy) from e
            state = found.get("state", "STATE_UNSPECIFIED")
            if state != "ACTIVE":
                said = "; ".join(m.get("message", "") for m in found.get("stateMessages") or [] if m.get("message"))
                raise Failed(f"{state}{': ' + said if said else ''}", redeploy)
            trigger = found.get("eventTrigger") or {}
            if http:
                if trigger:
                    raise Failed(f"triggered by {trigger.get('eventType')}, not HTTP", redeploy)
                return f"ACTIVE, HTTP at {(found.get('serviceConfig') or {}).get('uri', '?')}"
            if name == deploy.ON_AUDIT:
                topic = f"projects/{p}/topics/{deploy.AUDIT_TOPIC}"
                if trigger.get("eventType") != deploy.PUBLISHED or trigger.get("pubsubTopic") != topic:
                    raise Failed(f"trigger is {trigger.get('eventType') or 'HTTP'} on "
                                 f"{trigger.get('pubsubTopic') or 'no topic'}, not {deploy.PUBLISHED} on {topic}",
                                 redeploy)
                return f"ACTIVE, {deploy.PUBLISHED} on {topic}"
            filters = {f.get("attribute"): f.get("value") for f in trigger.get("eventFilters") or []}
            if trigger.get("eventType") != FINALIZED or filters.get("bucket") != b:
                said = (f"trigger is {trigger.get('eventType') or 'HTTP'} on {filters.get('bucket') or 'no bucket'}, "
                        f"not {FINALIZED} on {b}")
                if (other := deployed_bucket()) and trigger.get("eventType") == FINALIZED and _missing(apis, b):
                    raise Failed(f"{said}, which does not exist",
                                 f"export RESPAWN_BUCKET={shlex.quote(other)}  # the deployed controller's bucket")
                raise Failed(said, redeploy)
            return f"ACTIVE, {FINALIZED} on {gs}"
        return check

    # -- the audit path: System Event entries -> sink -> topic -> on_audit; and the tick's read --
    topic_name = f"projects/{p}/topics/{deploy.AUDIT_TOPIC}"

    def audit_topic() -> str:
        try:
            apis.topic(p, deploy.AUDIT_TOPIC)
        except errors.NotFound as e:
            raise Failed(f"{topic_name} does not exist: the sink has nowhere to publish, on_audit no trigger",
                         f"{shlex.join(deploy.audit_topic_argv(p))}\n{t.deploy_from('audit-topic')}  "
                         "# then the sink's grant and on_audit's trigger again") from e
        return f"{topic_name} exists"

    def audit_sink() -> str:
        try:
            found = apis.sink(p, deploy.AUDIT_SINK)
        except errors.NotFound as e:
            raise Failed(f"no sink {deploy.AUDIT_SINK} in {p}: System Event entries reach only the tick",
                         t.deploy_from("audit-sink")) from e
        problems = []
        destination = deploy.audit_destination(p)
        if found.get("destination") != destination:
            problems.append(f"it routes to {found.get('destination') or 'nowhere'}, not {destination}")
        if (found.get("filter") or "") != audit.sink_filter(p):
            problems.append("its filter is not respawn's (a stale deploy's, or changed by hand)")
        if found.get("disabled"):
            problems.append("it is disabled (exports nothing)")
        # An exclusion drops every entry it matches, whatever the filter keeps; respawn's filter keeps
        # only what on_audit needs, so any exclusion in force may drop some of it (a disabled one: none).
        dropping = [x.get("name") or "?" for x in found.get("exclusions") or [] if not x.get("disabled")]
        if dropping:
            problems.append(f"its exclusion{'s' if len(dropping) > 1 else ''} {', '.join(dropping)} drop"
                            f"{'' if len(dropping) > 1 else 's'} entries its filter selects (respawn's sink needs none)")
        if problems:
            raise Failed("; ".join(problems), f"{shlex.join(deploy.audit_sink_update_argv(p))}\n"
                                              f"# or: {t.deploy_from('audit-sink-update')}")
        return (f"{deploy.AUDIT_SINK} routes System Event entries of instances to {topic_name}, enabled "
                "(every instance's: the entries carry no labels; on_audit ignores names not respawn's)")

    def audit_publisher() -> str:
        try:
            writer = (apis.sink(p, deploy.AUDIT_SINK).get("writerIdentity") or "").strip()
        except errors.NotFound as e:
            raise Failed(f"no sink {deploy.AUDIT_SINK}, so no writer identity", t.deploy_from("audit-sink")) from e
        if not writer:
            raise Failed(f"the sink {deploy.AUDIT_SINK} has no writer identity", t.deploy_from("audit-sink"))
        try:
            on_topic = _bindings(apis.topic_policy(p, deploy.AUDIT_TOPIC))
        except errors.NotFound as e:
            raise Failed(f"{topic_name} does not exist", t.deploy_from("audit-topic")) from e
        if any(x.role in PUBLISH and writer in x.members and not x.condition for x in on_topic):
            return f"{writer} may publish to {deploy.AUDIT_TOPIC}"
        if any(x.role in PUBLISH and writer in x.members and not x.condition for x in _bindings(apis.project_policy(p))):
            return (f"{writer} may publish to every topic of {p} (deploy grants it on {deploy.AUDIT_TOPIC} only)", True)
        raise Failed(f"the sink's writer identity {writer} may not publish to {deploy.AUDIT_TOPIC}: the sink's "
                     "exports fail", shlex.join(deploy.audit_publisher_argv(p, writer)))

    def fan_out() -> str:
        """K > 1: the tick runs with K, the shards' topic exists, the controller may publish to it, and
        on_shard is ACTIVE, triggered by that topic, invocable by its trigger's account."""
        k, topic = t.shards, f"projects/{p}/topics/{deploy.SHARD_TOPIC}"
        fix = f"{t.deploy_command} --shards {k}"
        try:
            tick_env = (apis.function(p, r, deploy.TICK).get("serviceConfig") or {}).get("environmentVariables") or {}
        except errors.NotFound as e:
            raise Failed(f"{deploy.TICK} is not deployed", fix) from e
        if tick_env.get("RESPAWN_SHARDS", "1") != str(k):
            raise Failed(f"{deploy.TICK} runs with RESPAWN_SHARDS={tick_env.get('RESPAWN_SHARDS', '1')}, not {k}", fix)
        try:
            policy = apis.topic_policy(p, deploy.SHARD_TOPIC)
        except errors.NotFound as e:
            raise Failed(f"{topic} does not exist: the tick has nowhere to publish, on_shard no trigger",
                         t.deploy_from("shard-topic")) from e
        member = f"serviceAccount:{t.controller_sa}"
        held = grants.held(roles, member, grants.PUBLISH, policy, apis.project_policy(p))
        if held.missing(grants.PUBLISH):
            raise Failed(_lacks(t.controller_sa, grants.PUBLISH, topic, held.unread) + ": the tick's publishes fail",
                         t.deploy_from("shard-publisher"))
        try:
            found = apis.function(p, r, deploy.ON_SHARD)
        except errors.NotFound as e:
            raise Failed(f"{deploy.ON_SHARD} is not deployed: no shard is reconciled", t.deploy_from("on-shard")) from e
        trigger = found.get("eventTrigger") or {}
        if found.get("state") != "ACTIVE" or trigger.get("eventType") != deploy.PUBLISHED \
                or trigger.get("pubsubTopic") != topic:
            raise Failed(f"{deploy.ON_SHARD} is {found.get('state', '?')}, triggered by {trigger.get('eventType') or 'HTTP'} "
                         f"on {trigger.get('pubsubTopic') or 'no topic'}, not {deploy.PUBLISHED} on {topic}",
                         t.deploy_from("on-shard"))
        said, invoke_fix = may_invoke(deploy.ON_SHARD, trigger_account(deploy.ON_SHARD))
        if said:
            raise Failed(said, invoke_fix)
        return f"{k} shards: the tick publishes to {topic} ({', '.join(held.roles(grants.PUBLISH))}), " \
               f"{deploy.ON_SHARD} ACTIVE on it"

    def log_metrics() -> str:
        """The log-based metrics of the fleet's figures (deploy/metrics), each there with respawn's filter
        and extractors (the controller runs without them; Cloud Monitoring then has no fleet figures)."""
        import yaml

        found = apis.log_metrics(p)
        wanted = {path.stem: yaml.safe_load(path.read_text()) for path in deploy.metric_files()}
        missing = [name for name in wanted if name not in found]
        changed = [name for name in wanted if name in found and any(
            found[name].get(key) != wanted[name].get(key) for key in ("filter", "valueExtractor", "labelExtractors"))]
        if missing or changed:
            said = "; ".join([*([f"missing: {', '.join(missing)}"] if missing else []),
                              *([f"not respawn's (filter or extractors): {', '.join(changed)}"] if changed else [])])
            first = (missing or changed)[0]
            raise Failed(f"{said}: Cloud Monitoring has no figures of the fleet from them",
                         f"{t.deploy_from(f'metric-{first}')}  # creates or updates every metric from there")
        return f"{len(wanted)} log-based metrics of the fleet's figures ({', '.join(sorted(wanted))})"

    def scheduler() -> str:
        job = deploy.TICK
        where = f"--location={r} --project={p}"
        try:
            found = apis.scheduler_job(p, r, job)
        except errors.NotFound as e:
            raise Failed(f"no job {job} in {p}/{r}", t.deploy_command) from e
        state = found.get("state", "STATE_UNSPECIFIED")
        if state == "PAUSED":
            raise Failed("PAUSED: tick is never called", f"gcloud scheduler jobs resume {job} {where}")
        if state != "ENABLED":
            raise Failed(f"{state}", t.deploy_command)
        last = found.get("lastAttemptTime")
        if not last:
            return (f"ENABLED; no attempt yet (schedule {found.get('schedule', '?')})", True)
        status = found.get("status") or {}
        if status.get("code"):
            raise Failed(f"ENABLED, but its last attempt ({last}) failed: code {status.get('code')} "
                         f"{status.get('message', '')}".rstrip(),
                         f"gcloud functions logs read {deploy.TICK} --gen2 --region={r} --project={p}")
        return f"ENABLED, last attempt {last} succeeded"

    def last_pass() -> str:
        try:
            record = apis.last_pass(b)
        except errors.NotFound as e:
            raise no_bucket() from e
        run_now = f"gcloud scheduler jobs run {deploy.TICK} --location={r} --project={p}"
        if record is None:
            raise Failed(f"the controller has never run ({gs}/{lastpass.KEY} missing)", run_now)
        at = now()
        if record.future(at):  # forged, or a clock gone wrong: never "ran 0 s ago" for ever
            raise Failed(record.describe(at), f"check this machine's clock; then {run_now}")
        logs = f"gcloud functions logs read {deploy.TICK} --gen2 --region={r} --project={p}"
        if record.stale(at):
            raise Failed(f"{record.describe(at)}: more than {lastpass.STALE_AFTER / 60:.0f} minutes", f"{run_now}\n{logs}")
        if record.errors:  # a pass that ran is no pass that worked: some job was not reconciled
            raise Failed(f"{record.describe(at)}: its last pass failed on {record.errors} "
                         f"job{'' if record.errors == 1 else 's'}", f"{logs}  # why\nrespawn status  # which: "
                         "each job's last error under its row")
        return record.describe(at)

    def preemption_notice() -> str | tuple[str, bool]:
        """Whether Compute gave Spot VMs the 120 s notice they ask for (``preemption_notice``): a
        project not enrolled in the Preview refuses the field, and its jobs run without it."""
        try:
            record = apis.last_pass(b)
        except errors.NotFound as e:
            raise no_bucket() from e
        if record is None or not record.notice_refused:
            return "no project refused a Spot VM's 120 s preemption notice"
        each = "; ".join(f"{project}: {why}" for project, why in record.notice_refused.items())
        return (f"Compute refused the 120 s preemption notice ({each}): those jobs run with Spot's 30 s shutdown only. "
                "To get it, ask Google to enable the Spot preemption notice Preview "
                "(scheduling.preemptionNoticeDuration) for the project; to stop asking, set "
                "preemption_notice: 0s in the specs", True)

    # -- who may do what: the permissions of the roles each identity holds (controller.cli.grants) --
    def controller_in(project: str) -> Callable[[], str]:
        """The controller's Compute (and TPU) permissions in ``project``."""
        def check() -> str:
            wanted = {"roles/compute.instanceAdmin.v1": grants.COMPUTE + (grants.SLICES if t.slices else ()),
                      **({"roles/tpu.admin": grants.TPU} if t.tpu else {})}
            every = [perm for perms in wanted.values() for perm in perms]
            found = grants.held(roles, controller_member, every, apis.project_policy(project))
            short = [role for role, perms in wanted.items() if found.missing(perms)]
            if short:
                at = "" if project == p else f"@{project}"
                steps = [f"controller-{'compute' if 'compute' in role else 'tpu'}{at}" for role in short]
                raise Failed(_lacks(f"the controller ({t.controller_sa})", found.missing(every), f"project {project}",
                                    found.unread) + ": it cannot create, list or delete what its jobs need there",
                             "\n".join([*(f"gcloud projects add-iam-policy-binding {project} --member={controller_member} "
                                           f"--role={role} --condition=None" for role in short),
                                         f"# or: {t.deploy_from(steps[0])}"]))
            return (f"may create, list and delete VMs{' and TPU nodes' if t.tpu else ''}"
                    f"{' and TPU slices (MIGs)' if t.slices else ''} in {project}"
                    + f" ({', '.join(found.roles(every))})")
        return check

    unchecked = "is not deployed (its own check says so): nothing to check"

    def may_invoke(name: str, account: str) -> tuple[str, str]:
        """(what was found, the fix) for ``account``'s right to call function ``name``: ("", "") when it may."""
        found = apis.function(p, r, name)
        service = (found.get("serviceConfig") or {}).get("service") or f"projects/{p}/locations/{r}/services/{name}"
        member = f"serviceAccount:{account}"
        held = grants.held(roles, member, grants.INVOKE, apis.service_policy(service), apis.project_policy(p))
        if held.missing(grants.INVOKE):
            return (_lacks(account, grants.INVOKE, f"{name}'s service", held.unread) + ": its calls are refused 403",
                    f"gcloud functions add-invoker-policy-binding {name} --gen2 --region={r} --project={p} "
                    f"--member={member}")
        return "", ""

    def scheduler_invokes() -> str | tuple[str, bool]:
        try:
            job = apis.scheduler_job(p, r, deploy.TICK)
        except errors.NotFound:
            return f"the Scheduler job {unchecked}", True
        account = ((job.get("httpTarget") or {}).get("oidcToken") or {}).get("serviceAccountEmail") or t.scheduler_sa
        try:
            said, fix = may_invoke(deploy.TICK, account)
        except errors.NotFound:
            return f"{deploy.TICK} {unchecked}", True
        if said:
            raise Failed(said, fix)
        return f"{account} (the Scheduler job's token) may invoke {deploy.TICK}"

    def trigger_account(name: str) -> str:
        found = apis.function(p, r, name)
        return ((found.get("eventTrigger") or {}).get("serviceAccountEmail")
                or (found.get("serviceConfig") or {}).get("serviceAccountEmail") or t.controller_sa)

    def triggers_invoke() -> str | tuple[str, bool]:
        problems, fixes, accounts, absent = [], [], [], []
        for name in (deploy.ON_OBJECT, deploy.ON_AUDIT):
            try:
                said, fix = may_invoke(name, account := trigger_account(name))
            except errors.NotFound:
                absent.append(name)
                continue
            problems += [said] if said else []
            fixes += [fix] if fix else []
            accounts.append(f"{name}'s ({account})")
        if problems:
            raise Failed("; ".join(problems), "\n".join(fixes))
        said = f"each trigger's account may invoke its function: {', '.join(accounts)}" if accounts else ""
        if absent:
            return "; ".join(x for x in (said, f"{', '.join(absent)} {unchecked}") if x), True
        return said

    def trigger_receives() -> str | tuple[str, bool]:
        try:
            account = trigger_account(deploy.ON_OBJECT)
        except errors.NotFound:
            return f"{deploy.ON_OBJECT} {unchecked}", True
        member = f"serviceAccount:{account}"
        found = grants.held(roles, member, grants.RECEIVE, apis.project_policy(p))
        if found.missing(grants.RECEIVE):
            raise Failed(_lacks(f"{deploy.ON_OBJECT}'s trigger account ({account})", grants.RECEIVE, f"project {p}",
                                found.unread) + ": Eventarc delivers none of the bucket's events",
                         f"gcloud projects add-iam-policy-binding {p} --member={member} "
                         "--role=roles/eventarc.eventReceiver --condition=None")
        return f"{account} may receive {deploy.ON_OBJECT}'s events ({', '.join(found.roles(grants.RECEIVE))})"

    def service_agents() -> str | tuple[str, bool, str]:
        number = str(apis.project(p).get("name", "")).rpartition("/")[2]
        storage, pubsub = (f"service-{number}@{domain}" for domain in ("gs-project-accounts.iam.gserviceaccount.com",
                                                                       "gcp-sa-pubsub.iam.gserviceaccount.com"))
        policy = apis.project_policy(p)
        found = grants.held(roles, f"serviceAccount:{storage}", grants.PUBLISH, policy)
        if found.missing(grants.PUBLISH):
            raise Failed(_lacks(f"the Cloud Storage service agent ({storage})", grants.PUBLISH, f"project {p}",
                                found.unread) + ": the bucket's events never reach on_object",
                         f"gcloud storage service-agent --project={p}  # makes it if the project has none yet\n"
                         f"gcloud projects add-iam-policy-binding {p} --member=serviceAccount:{storage} "
                         "--role=roles/pubsub.publisher --condition=None")
        said = f"{storage} may publish the bucket's events ({', '.join(found.roles(grants.PUBLISH))})"
        try:
            trigger = apis.account_policy(t.controller_sa)
        except errors.NotFound:
            trigger = []
        tokens = grants.held(roles, f"serviceAccount:{pubsub}", grants.OIDC_TOKEN, policy, trigger)
        if tokens.missing(grants.OIDC_TOKEN):
            # Google builds this in for projects made after 2021-04-08, where no policy shows it.
            return (f"{said}; {pubsub} holds no {grants.OIDC_TOKEN[0]} in the policies read: a project made "
                    "before April 8, 2021 needs it for on_audit's push (newer ones have it built in)", True,
                    f"gcloud projects add-iam-policy-binding {p} --member=serviceAccount:{pubsub} "
                    "--role=roles/iam.serviceAccountTokenCreator --condition=None")
        return f"{said}; {pubsub} may sign on_audit's push tokens ({', '.join(tokens.roles(grants.OIDC_TOKEN))})"

    def custom_role() -> str:
        name = f"projects/{p}/roles/{deploy.TRAINER_ROLE_ID}"
        try:
            found = apis.role(name)
        except errors.NotFound as e:
            raise Failed(f"{name} does not exist: the trainer's binding grants nothing, no VM can write its records",
                         t.deploy_from("trainer-role")) from e
        permissions = sorted(found.get("includedPermissions") or ())
        extra = [x for x in permissions if x not in deploy.TRAINER_PERMISSIONS]
        missing = [x for x in deploy.TRAINER_PERMISSIONS if x not in permissions]
        problems = [*(["it is deleted: it grants nothing"] if found.get("deleted") else []),
                    *(["it is DISABLED: it grants nothing"] if found.get("stage") == "DISABLED" else []),
                    *([f"it also grants {', '.join(extra)}: every trainer VM could do that to every job's "
                       "records (read their secrets, list them)"] if extra else []),
                    *([f"it lacks {', '.join(missing)}: trainer VMs cannot write their records"] if missing else [])]
        if problems:
            fixes = deploy.role_fixes(p, json.dumps(dict(found)))
            raise Failed("; ".join(problems), "\n".join([*(shlex.join(f) for f in fixes),
                                                         f"# or: {t.deploy_from('trainer-role')}"]))
        return f"{deploy.TRAINER_ROLE_ID} grants exactly {', '.join(deploy.TRAINER_PERMISSIONS)}"

    def bucket_readers() -> str | tuple[str, bool]:
        """Everyone who may read the control bucket's objects: every spec (its env, the webhook of its
        notify) and every record (its attempt's secret). Public members are the trainer check's ✗."""
        policy = control_policy()
        found = grants.members_with(roles, grants.READ_OBJECTS[0], policy, apis.project_policy(p))
        others = {m: role for m, role in found.items() if m != controller_member and m not in PUBLIC}
        if not others:
            return f"only the controller may read {gs}'s objects"
        return (f"besides the controller, {len(others)} may read every spec (its env) and every record in {gs}: "
                + ", ".join(f"{m} ({role})" for m, role in sorted(others.items())), True)

    return [
        ("credentials", credentials),
        ("project", project),
        ("APIs", apis_enabled),
        ("bucket", bucket),
        ("uniform bucket-level access", uniform),
        ("bucket writable", writable),
        ("trainer cannot read the bucket", trainer_reads),
        ("bucket IAM", bucket_iam),
        ("checkpoints bucket", checkpoints_bucket),
        ("project IAM", project_iam),
        ("trainer account", trainer_account),
        (f"function {deploy.TICK}", function(deploy.TICK, http=True)),
        (f"function {deploy.ON_OBJECT}", function(deploy.ON_OBJECT, http=False)),
        (f"function {deploy.ON_AUDIT}", function(deploy.ON_AUDIT, http=False)),
        (f"audit topic {deploy.AUDIT_TOPIC}", audit_topic),
        (f"audit sink {deploy.AUDIT_SINK}", audit_sink),
        ("audit sink may publish", audit_publisher),
        *(((f"{t.shards} shards", fan_out),) if t.shards > 1 else ()),
        ("log-based metrics", log_metrics),
        (f"scheduler job {deploy.TICK}", scheduler),
        ("controller last ran", last_pass),
        ("preemption notice", preemption_notice),
        *((f"controller's grants in {where}", controller_in(where)) for where in dict.fromkeys((p, *t.watched))),
        ("scheduler may invoke tick", scheduler_invokes),
        ("triggers may invoke on_object and on_audit", triggers_invoke),
        ("on_object's trigger receives events", trigger_receives),
        ("service agents", service_agents),
        (f"custom role {deploy.TRAINER_ROLE_ID}", custom_role),
        ("who may read the bucket", bucket_readers),
    ]


# -- a spec's checks -------------------------------------------------------------------------------
def spec_checks(apis: Apis, t: Target, spec: JobSpec, account: str | None, packed: bool = False) -> list[Check]:
    """Quotas in each region of the spec's zones, its image, its service account (``account``: the
    one it runs as, the policy's trainer account when it names none), and where it points beyond the
    control bucket (its checkpoint bucket, its code tarball: ``packed``, local code submit uploads)."""
    project = spec.project or t.project
    rest: list[Check] = [("image", _image_check(apis, spec)), ("service account", _account_check(apis, t, account)),
                         *_container_checks(apis, spec, account), *_place_checks(apis, t, spec, account, packed)]
    if spec.tpu is not None and spec.tpu.type is not None:  # Cloud TPU's quotas: per zone, not Compute's regional ones
        return [*((f"TPU quota in {zone}", _tpu_quota_check(apis, project, zone, spec.tpu.type))
                  for zone in dict.fromkeys(spec.zones)), *rest]
    if spec.tpu is not None:  # a TPU machine type: Compute's Quota.metric lists no TPU7x metric to read
        return rest
    out: list[Check] = []
    gpu = _gpus(spec)
    for region in dict.fromkeys(z.rsplit("-", 1)[0] for z in spec.zones):
        if gpu is None:
            out.append((f"quota in {region}", lambda: ("the spec asks for no GPU", True)))
        else:
            out.append((f"GPU quota in {region}", _quota_check(apis, project, region, spec, *gpu)))
    return out + rest


def _place_checks(apis: Apis, t: Target, spec: JobSpec, account: str | None, packed: bool) -> list[Check]:
    """The spec's checkpoint bucket and ``code:`` tarball, judged as ``respawn submit`` judges them
    (controller.service.places): one that is not there fails, one not readable here is said; a
    checkpoint prefix in the control bucket fails unless ``account`` (the trainers') may save there."""
    out: list[Check] = []
    if spec.checkpoint is not None:
        where = spec.checkpoint
        if (wrong := places.in_control_bucket(where.uri, t.bucket, spec.name or "JOB")) is not None:
            out.append(("checkpoint.uri", lambda: _control_checkpoints(apis, t, account or t.trainer_sa, wrong)))
        else:
            out.append(("checkpoint.uri", lambda: _place(places.checkpoints(apis.store(), where).place)))
    if spec.code and packed:
        out.append(("code", lambda: f"local: respawn submit packs it and uploads it ({spec.code})"))
    elif spec.code:
        uri = spec.code
        out.append(("code", lambda: _place(places.code(apis.store(), uri))))
    return out


def _control_checkpoints(apis: Apis, t: Target, account: str, wrong: places.Misplaced) -> tuple[str, bool]:
    """A checkpoint prefix in the control bucket: ✗, as submit warns, unless the trainers' account holds
    what it holds on the checkpoints bucket (read, write, list), unconditioned, on the control bucket too:
    an operator's grant beyond deploy's (which lets every trainer read every job's records)."""
    roles = grants.Roles(lambda name: apis.role(name))
    found = grants.held(roles, f"serviceAccount:{account}", grants.OBJECTS, apis.bucket_policy(t.bucket))
    if found.missing(grants.OBJECTS):
        raise Failed(wrong.detail, wrong.fix)
    return (f"{wrong.detail.partition(',')[0]}, and {account} may read, write and list it there "
            f"({', '.join(found.roles(grants.OBJECTS))}): a grant beyond deploy's (deploy/IAM.md)", True)


def _place(found: places.Place) -> str | tuple[str, bool]:
    if found.there is False:
        raise Failed(found.detail, found.fix)
    return found.detail if found.there else (found.detail, True)


def _container_checks(apis: Apis, spec: JobSpec, account: str | None) -> list[Check]:
    """A spec's ``image:`` (controller.cli.imagecheck): on Artifact Registry, that it exists and that
    ``account`` may pull it; elsewhere, one line saying it is not checked. None without ``image:``."""
    image = getattr(spec, "image", None)
    if not image:
        return []
    found = imagecheck.target(image)
    if isinstance(found, imagecheck.Finding):
        return [("container image", lambda: _finding(found))]
    roles = grants.Roles(lambda name: apis.role(name))
    return [("container image", lambda: _finding(imagecheck.exists(apis, found))),
            ("container image pull", lambda: _finding(imagecheck.may_pull(apis, roles, found, account)))]


def _finding(found: imagecheck.Finding) -> tuple[str, bool, str]:
    if not found.ok:
        raise Failed(found.detail, found.fix)
    return found.detail, found.note, found.fix


def _gpus(spec: JobSpec) -> tuple[str, int] | None:
    """(accelerator type, GPUs one attempt holds) of a VM spec; None without GPUs."""
    if spec.accelerators is not None:
        return spec.accelerators.type, spec.accelerators.count * spec.nodes
    built = built_in_gpus(spec.machine_type or "")
    if built and built[0] != "built-in":
        return built[0], built[1] * spec.nodes
    return None


def _quota_check(apis: Apis, project: str, region: str, spec: JobSpec, kind: str, need: int) -> Callable[[], str]:
    def check() -> str:
        if quotas.metric(kind, "standard") is None:
            return (f"{need} {kind}: no Compute quota metric known for it; Compute checks it at create", True)
        listed = apis.region_quotas(project, region)
        lines, fits, metrics = [], False, []
        for model in spec.provisioning:  # the controller falls back along the list: one that fits will do
            left = quotas.left_for(kind, model, need, listed)
            name = quotas.metric(kind, model, listed)
            metrics.append(name)
            if left is None:
                lines.append(f"{model}: {name} not listed in {region}")
                continue
            lines.append(f"{model}: {left.metric} {left.left:g} free of {left.limit:g}")
            fits = fits or left.enough
        said = f"{need} {kind} needed; " + ", ".join(lines)
        if not fits:
            raise Failed(said, f"request more of {' or '.join(dict.fromkeys(m for m in metrics if m))} in {region}: "
                               f"https://console.cloud.google.com/iam-admin/quotas?project={project} "
                               f"(or drop {region}'s zones from the spec)")
        return said
    return check


def _tpu_quota_check(apis: Apis, project: str, zone: str, kind: str) -> Callable[[], str | tuple[str, bool]]:
    """Cloud TPU's quota limits in ``zone`` (Service Usage's consumer quota metrics of
    tpu.googleapis.com: each limit per zone or region, its most specific bucket). Every one at 0: no
    TPU of any type can be made there (✗). Otherwise said, not judged: which metric a type counts
    against (chips or TensorCores, by generation and model) is Cloud TPU's to decide at create, and
    these metrics carry no usage."""
    def check() -> str | tuple[str, bool]:
        limits = tpu_zone_limits(apis.tpu_quotas(project), zone)
        if not limits:
            return f"Cloud TPU lists no quota limit for {zone}: it checks at create", True
        open_ = [(name, value) for name, value in limits if value != 0]
        if not open_:
            raise Failed(f"every Cloud TPU quota in {zone} is 0 ({', '.join(n for n, _ in limits)}): no TPU, a {kind} "
                         "included, can be made there",
                         f"request Cloud TPU quota in {zone}: https://console.cloud.google.com/iam-admin/quotas?"
                         f"project={project} (or drop {zone} from the spec)")
        shown = ", ".join(f"{name} {'unlimited' if value < 0 else f'{value:g}'}" for name, value in open_)
        return (f"{len(open_)} of Cloud TPU's quotas open in {zone} ({shown}); which one a {kind} counts against, "
                "and how much is in use, Cloud TPU decides at create", True)
    return check


def tpu_zone_limits(metrics: Sequence[Mapping[str, Any]], zone: str) -> list[tuple[str, float]]:
    """(metric, effective limit; -1 unlimited) of each per-zone or per-region limit in ``zone``: the
    bucket for the zone, else for its region, else the default (a bucket without dimensions)."""
    region = zone.rsplit("-", 1)[0]
    out = []
    for metric in metrics:
        name = str(metric.get("displayName") or metric.get("metric") or "?")
        for limit in metric.get("consumerQuotaLimits") or []:
            if "{zone}" not in str(limit.get("unit", "")) and "{region}" not in str(limit.get("unit", "")):
                continue
            buckets = limit.get("quotaBuckets") or []
            chosen = next((x for want in ({"zone": zone}, {"region": region}, {}) for x in buckets
                           if (x.get("dimensions") or {}) == want), None)
            if chosen is not None and chosen.get("effectiveLimit") not in (None, ""):
                out.append((name, float(chosen["effectiveLimit"])))
    return out


def _image_check(apis: Apis, spec: JobSpec) -> Callable[[], str]:
    disk = spec.boot_disk

    def check() -> str:
        if disk.image:
            parts = disk.image.split("/")
            try:
                project, name = parts[parts.index("projects") + 1], parts[-1]
            except (ValueError, IndexError) as e:
                raise Failed(f"cannot read {disk.image!r} as projects/P/global/images/NAME") from e
            what, kwargs = f"image {name} of {project}", {"name": name}
            if "family" in parts:
                what, kwargs = f"image family {name} of {project}", {"family": name}
        else:
            project = disk.image_project or ""
            what, kwargs = f"image family {disk.image_family} of {project}", {"family": disk.image_family}
        try:
            found = apis.image(project, **kwargs)
        except errors.NotFound as e:
            flag = f"--image-family={kwargs['family']}" if "family" in kwargs else f"--filter=name={kwargs['name']}"
            raise Failed(f"{what} does not exist (or you may not see it)",
                         f"gcloud compute images list --project={project} {flag}  # then fix boot_disk") from e
        status = found.get("status", "READY")
        if status != "READY":
            raise Failed(f"{what}: {found.get('name')} is {status}", "use another image")
        return f"{what}: {found.get('name')}"
    return check


def _account_check(apis: Apis, t: Target, account: str | None) -> Callable[[], str]:
    def check() -> str:
        if not account:
            raise Failed("the spec names no service account and the controller has no trainer account",
                         "set RESPAWN_TRAINER_SERVICE_ACCOUNT, or service_account.email in the spec")
        try:
            apis.account(account)
        except errors.NotFound as e:
            raise Failed(f"{account} does not exist", f"gcloud iam service-accounts describe {account}") from e
        if not _may_act_as(apis, t, account):
            raise Failed(f"the controller ({t.controller_sa}) may not act as {account}",
                         f"gcloud iam service-accounts add-iam-policy-binding {account} "
                         f"--member=serviceAccount:{t.controller_sa} --role=roles/iam.serviceAccountUser "
                         "--condition=None")
        return f"{account} exists; the controller may act as it"
    return check


# -- helpers ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Binding:
    role: str
    members: frozenset[str]
    condition: Mapping[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _bindings(raw: Sequence[Mapping[str, Any]]) -> list[_Binding]:
    return [_Binding(str(x.get("role", "")), frozenset(x.get("members") or ()), x.get("condition") or None)
            for x in raw]


def _lacks(who: str, missing: Sequence[str], where: str, unread: Sequence[str] = ()) -> str:
    """``who`` lacks ``missing`` on ``where``, said in a line (the first three), with what could not be seen."""
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    said = f"{who} lacks {shown} on {where} (grants through groups, folders or the organization are not read"
    return said + (f"; roles IAM would not describe: {', '.join(unread)})" if unread else ")")


def _trainer_role(project: str) -> str:
    return f"projects/{project}/roles/{deploy.TRAINER_ROLE_ID}"


def _trainer_condition(binding: _Binding, bucket: str) -> bool:
    return bool(binding.condition) and binding.condition.get("expression") == deploy.trainer_condition(bucket)


def _code_read(binding: _Binding, bucket: str) -> bool:
    """The trainer's read of the code tarballs ``respawn submit`` packs (deploy/IAM.md): objectViewer
    conditioned to ``code/`` alone, which holds no record and no secret."""
    return binding.role == "roles/storage.objectViewer" and bool(binding.condition) and \
        binding.condition.get("expression") == f'resource.name.startsWith("projects/_/buckets/{bucket}/objects/code/")'


def _scripts_read(binding: _Binding, bucket: str) -> bool:
    """The trainer's read of the VM scripts (deploy/IAM.md): objectViewer conditioned to ``respawn/vm/``
    alone, which holds the agent's scripts and no record, no secret."""
    return binding.role == "roles/storage.objectViewer" and bool(binding.condition) and \
        binding.condition.get("expression") == deploy.trainer_scripts_condition(bucket)


def _may_act_as(apis: Apis, t: Target, account: str) -> bool:
    """The controller holds a role that lets it act as ``account``: on the account itself, or on
    the project (which reaches every account of the project)."""
    controller = f"serviceAccount:{t.controller_sa}"
    if any(x.role in ACT_AS and controller in x.members and not x.condition
           for x in _bindings(apis.account_policy(account))):
        return True
    home = account.partition("@")[2].removesuffix(".iam.gserviceaccount.com")
    return home == t.project and any(x.role in ACT_AS and controller in x.members and not x.condition
                                     for x in _bindings(apis.project_policy(t.project)))


# -- the command -------------------------------------------------------------------------------------
def diagnose(apis: Apis, config: Any, region: str, controller_sa: str, timeout: float,
             spec: tuple[bytes, str] | None = None, packed: bool = False) -> tuple[Target, list[Result]]:
    """Every check of the deployment ``config`` (Settings) names, and of ``spec`` (its bytes, its job
    name) if given, run side by side. ``packed``: the spec's code is local (a folder or a file),
    written into it as submit writes it (``gs://BUCKET/code/<sha256>.tar.gz``) but not uploaded."""
    from controller.core.spec import SpecError, parse_spec

    project = config.project
    trainer = config.trainer_service_account or deploy.account_email(deploy.TRAINER_ACCOUNT_ID, project)
    parsed: JobSpec | None = None
    spec_result: Result | None = None
    if spec is not None:
        raw, name = spec
        try:
            parsed = parse_spec(raw, name)
            problems = config.policy().violations(parsed)
        except SpecError as e:
            problems = e.problems
        if problems:
            spec_result = Result(f"spec {name}", False, "; ".join(problems), f"respawn validate  # then fix the spec")
            parsed = None
        else:
            spec_result = Result(f"spec {name}", True, "valid, within this controller's policy")
    t = Target(project, config.bucket, region, controller_sa, trainer,
               tpu=bool(config.allowed_tpu_types) or (parsed is not None and parsed.tpu is not None
                                                      and parsed.tpu.api == "tpu"),
               slices=parsed is not None and parsed.tpu is not None and parsed.tpu.api == "compute",
               scheduler_sa=deploy.account_email(deploy.SCHEDULER_ACCOUNT_ID, project),
               watched=tuple(x for x in config.allowed_projects if x != project), shards=config.shards)
    todo = checks(apis, t)
    if parsed is not None:
        todo += spec_checks(apis, t, parsed, config.policy().service_account_of(parsed), packed)
    results = run(todo, timeout)
    return t, results + ([spec_result] if spec_result else [])


NAME_WIDTH = 28  # the details align after the names up to this long; a longer name is followed by two spaces


def render(results: Sequence[Result]) -> list[Any]:
    """One line per check (✓, ✗, or ! for a ✓ with a reservation), each ✗'s (and !'s) fix under it,
    each wrapped at the terminal's width (``str`` of one is its whole line)."""
    from rich.text import Text

    from controller.render.text import Hanging, printable

    width = min(NAME_WIDTH, max((len(r.name) for r in results), default=0))
    lines: list[Any] = []
    for r in results:  # each wrapped at the terminal's width under its mark, its fix under the command
        mark, style = ("✓", "green") if r.ok and not r.note else ("!", "yellow") if r.ok else ("✗", "red")
        lines.append(Hanging(Text.assemble((mark, style), " "),
                             Text.assemble((r.name.ljust(width), "bold"), "  ", printable(r.detail))))
        for fix in r.fix.splitlines() if not r.ok or r.note else ():
            lines.append(Hanging(Text("    fix: "), Text(printable(fix), style="cyan")))
    return lines


def last_pass_line(store: Any, bucket: str, now: datetime) -> Any:
    """``respawn status``'s line on the controller itself: when it last ran (yellow past 3 minutes)."""
    from rich.text import Text

    try:
        record = lastpass.read(store, bucket)
    except Exception as e:  # noqa: BLE001 - a line about the controller never fails the status
        return Text(f"controller: {gs_key(bucket)} unreadable: {_said(e)}", style="yellow")
    if record is None:
        return Text(f"controller has not run yet ({gs_key(bucket)} missing): respawn doctor tells why", style="yellow")
    if record.stale(now):
        return Text(f"{record.describe(now)}: is its Scheduler job running? respawn doctor tells", style="yellow")
    return Text(record.describe(now), style="dim")


def gs_key(bucket: str) -> str:
    return f"gs://{bucket}/{lastpass.KEY}"
