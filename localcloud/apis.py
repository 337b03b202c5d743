"""Local stand-ins for the APIs ``respawn doctor`` reads and the rest of the local cloud never
calls: Service Usage v1, Cloud Resource Manager v3, IAM v1, Cloud Functions v2 and Cloud
Scheduler v1, one server each, answering for what the local cloud actually runs.

Each is built on Google's discovery document (``<api>.<version>.json`` in google-api-python-client,
as ``localcloud.pubsub``): routes come from it (by ``flatPath``), a request body is validated
against its schema (a field it does not have: 400 ``Invalid JSON payload received. Unknown
name ...``), a method of the document this server does not serve answers 501, a path that is no
method 404. Errors are one-platform JSON (``{"error": {"code", "message", "status"}}``).

What they answer comes from ``Deployment``: what ``respawn deploy`` would have made of the local
cloud. The project (its number as ``localcloud.compute.project_number`` gives it) is ACTIVE and
every API enabled; its IAM policy (deploy's grants, the trainer's roles/artifactregistry.reader
among them; changed by ``projects.setIamPolicy``, whose changes the local Artifact Registry's pulls
obey), the trainer account's and the three accounts themselves are deploy's; the functions are the local functions-framework processes (ACTIVE while their
process lives, FAILED once it has exited), ``respawn-tick`` HTTP at its local URL,
``respawn-on-object`` on the bucket's finalized events and, where the local cloud serves it,
``respawn-on-audit`` on the ``respawn-audit`` topic's messages (Pub/Sub trigger); the Scheduler job ``respawn-tick`` is
the local ticker (ENABLED while it runs, PAUSED once stopped; ``lastAttemptTime`` and ``status``
its last call's). Another project is 403 ``PERMISSION_DENIED``, as Google answers for a project
that does not exist or that the caller may not see; another function, job or account 404.

Faults: ``ServiceUsageServer.disable(service)`` (and ``services.disable`` over the API), and
``fail_next(method, code)`` on each, over HTTP too (``POST /_local/<fault>``).
"""

from __future__ import annotations

import base64
import copy
import secrets
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from flask import Flask, Response, request

from controller.adapters.memory_doctor import PREDEFINED
from controller.cli import deploy
from localcloud import discovery
from localcloud.metadata import project_number
from localcloud.host import Host, json_response
from localcloud.http import Server
from localcloud.tpu_api import STATUS

# What a project has on once respawn is deployed (and what the local cloud stands in for).
ENABLED = ("compute", "cloudfunctions", "run", "cloudbuild", "artifactregistry", "eventarc", "pubsub",
           "cloudscheduler", "logging", "iam", "storage", "tpu", "serviceusage", "cloudresourcemanager")
FINALIZED = "google.cloud.storage.object.v1.finalized"


@dataclass
class Deployment:
    """The local cloud as ``respawn deploy`` would have left it: names, and how to look at what runs."""

    project: str
    region: str
    bucket: str
    # target ("tick", "on_object", "on_audit") -> (its URL, whether its process still runs)
    functions: Callable[[], dict[str, tuple[str, bool]]] = lambda: {}
    # the Scheduler stand-in: (running, last attempt time or None, last attempt's HTTP status or None)
    ticker: Callable[[], tuple[bool, datetime | None, int | None]] = lambda: (False, None, None)
    schedule: str = "* * * * *"
    shards: int = 1  # RESPAWN_SHARDS the functions run with (K > 1: on_shard too)
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat().replace("+00:00", "Z"))

    @property
    def number(self) -> int:
        return project_number(self.project)

    @property
    def controller(self) -> str:
        return deploy.account_email("respawn-controller", self.project)

    @property
    def trainer(self) -> str:
        return deploy.account_email(deploy.TRAINER_ACCOUNT_ID, self.project)

    @property
    def scheduler(self) -> str:
        return deploy.account_email("respawn-scheduler", self.project)

    def project_policy(self) -> list[dict[str, Any]]:
        """The project bindings deploy makes (controller.cli.deploy), and the service agents' own."""
        agent = f"service-{self.number}@"
        return [
            {"role": "roles/logging.logWriter", "members": [f"serviceAccount:{self.trainer}"]},
            {"role": deploy.TRAINER_REGISTRY_ROLE, "members": [f"serviceAccount:{self.trainer}"]},
            {"role": "roles/compute.instanceAdmin.v1", "members": [f"serviceAccount:{self.controller}"]},
            {"role": "roles/tpu.admin", "members": [f"serviceAccount:{self.controller}"]},
            {"role": "roles/logging.logWriter", "members": [f"serviceAccount:{self.controller}"]},
            {"role": "roles/eventarc.eventReceiver", "members": [f"serviceAccount:{self.controller}"]},
            {"role": "roles/pubsub.publisher", "members": [f"serviceAccount:{agent}gs-project-accounts.iam.gserviceaccount.com"]},
            {"role": "roles/pubsub.serviceAgent", "members": [f"serviceAccount:{agent}gcp-sa-pubsub.iam.gserviceaccount.com"]},
        ]

    def bucket_policy(self) -> list[dict[str, Any]]:
        """The bucket bindings deploy makes (controller.cli.deploy), as the local cloud applies them."""
        return [
            {"role": "roles/storage.objectUser", "members": [f"serviceAccount:{self.controller}"]},
            {"role": f"projects/{self.project}/roles/{deploy.TRAINER_ROLE_ID}",
             "members": [f"serviceAccount:{self.trainer}"],
             "condition": {"title": deploy.TRAINER_CONDITION_TITLE,
                           "description": "respawn VM records only: jobs/<job>/exit, jobs/<job>/heartbeat, "
                                          "preempted-jobs/<job>",
                           "expression": deploy.trainer_condition(self.bucket)}},
            {"role": "roles/storage.objectViewer", "members": [f"serviceAccount:{self.trainer}"],
             "condition": {"title": deploy.TRAINER_SCRIPTS_CONDITION_TITLE,
                           "description": "the VM scripts the controller writes, read-only",
                           "expression": deploy.trainer_scripts_condition(self.bucket)}},
        ]

    def checkpoints_policy(self) -> list[dict[str, Any]]:
        """The checkpoints bucket's bindings deploy makes: the trainer reads and writes, the controller reads."""
        return [
            {"role": "roles/storage.objectUser", "members": [f"serviceAccount:{self.trainer}"]},
            {"role": "roles/storage.objectViewer", "members": [f"serviceAccount:{self.controller}"]},
        ]


class ApiError(Exception):
    def __init__(self, code: int, message: str, status: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status or STATUS.get(code, "UNKNOWN")

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "status": self.status}}


def concurrent_change() -> ApiError:
    """A setIamPolicy whose etag is not the policy's now: 409 ABORTED, as Google answers it."""
    return ApiError(409, "There were concurrent policy changes. Please retry the whole read-modify-write with "
                         "exponential backoff.", "ABORTED")


def denied(what: str) -> ApiError:
    return ApiError(403, f"The caller does not have permission to access {what}, or it does not exist.")


class DiscoveryServer(Server):
    """One API of one discovery document: routing, validation, errors, faults; subclasses answer."""

    DOC = ""
    SUPPORTED: dict[str, tuple[str, ...]] = {}
    # Methods of another document served at the same address (its paths start with its own version:
    # Cloud Run v2 beside Cloud Functions v2, Service Usage v1beta1 beside v1), after DOC's routes.
    ALSO: dict[str, dict[str, tuple[str, ...]]] = {}

    def __init__(self, deployment: Deployment) -> None:
        self.d = deployment
        self._lock = threading.RLock()
        self._failures: dict[str, list[int]] = defaultdict(list)
        self._routes = discovery.served(self.DOC, self.SUPPORTED) + [
            route for doc, supported in self.ALSO.items() for route in discovery.served(doc, supported)]

    @property
    def endpoint(self) -> str:
        """The root URL (``http://127.0.0.1:PORT``): google-api-python-client's ``api_endpoint``."""
        return self.address

    def fail_next(self, method: str, code: int = 503, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` (e.g. ``"functions.get"``) answer HTTP ``code``."""
        if code not in STATUS or code < 400:
            raise ValueError(f"not an error code this server answers: {code}")
        with self._lock:
            self._failures[method].extend([int(code)] * int(times))

    def _faults(self) -> dict[str, Callable[..., Any]]:
        return {"fail_next": self.fail_next}

    def _app(self) -> Flask:
        app = Flask(self.name)

        @app.route("/<path:path>", methods=["GET", "POST", "DELETE", "PATCH", "PUT"])
        def api(path: str) -> Response:
            try:
                return json_response(self._dispatch(request.method, self._path(path)))
            except ApiError as e:
                return json_response(e.body(), e.code)

        Host._fault_route(app, self._faults())
        return app

    def _path(self, path: str) -> str:
        """The request's path as dispatched: as Flask decoded it (a server whose ids may hold an
        escaped "/" takes it as sent instead)."""
        return path

    def _dispatch(self, verb: str, path: str) -> dict[str, Any]:
        method, match, name = discovery.resolve(self._routes, verb, path, self.name, ApiError)
        with self._lock:
            if self._failures.get(name):
                code = self._failures[name].pop(0)
                raise ApiError(code, "The service is currently unavailable." if code >= 500 else "Request refused.")
        body: dict[str, Any] = {}
        if method.request_schema:
            raw = request.get_data()
            body = {} if not raw else request.get_json(silent=True)
            if not isinstance(body, dict):
                raise ApiError(400, "Invalid JSON payload received. Expected an object.")
            problems = discovery.validate(body, method.request_schema, "\0", doc=self.DOC)
            if problems:
                raise ApiError(400, problems[0].replace(" at '\0'", "").replace("'\0.", "'"))
        handler = getattr(self, f"_{name.replace('.', '_')}")
        return handler(match.groupdict(), body)

    def _project(self, ref: str) -> str:
        """The project a path names (its id or its number); another is 403, as Google answers."""
        if ref not in (self.d.project, str(self.d.number)):
            raise denied(f"projects/{ref}")
        return self.d.project


class ServiceUsageServer(DiscoveryServer):
    DOC, name = "serviceusage.v1", "serviceusage"
    SUPPORTED = {"services": ("get", "batchGet", "list", "enable", "disable")}
    # Cloud TPU's quota limits, as respawn doctor reads them for a TPU spec: one per-zone metric of
    # chips, TPU_QUOTA in every zone but those ``tpu_quota`` set.
    ALSO = {"serviceusage.v1beta1": {"services.consumerQuotaMetrics": ("list",)}}
    TPU_QUOTA = 64

    def __init__(self, deployment: Deployment) -> None:
        super().__init__(deployment)
        self.enabled = {f"{s}.googleapis.com" for s in ENABLED}
        self.tpu_limits: dict[str, int] = {}  # zone -> its limit, where a test set one

    def tpu_quota(self, zone: str, limit: int) -> None:
        with self._lock:
            self.tpu_limits[zone] = int(limit)

    def _consumerQuotaMetrics_list(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        self._parent({"v1Id": p["v1beta1Id"], "v1Id1": p["v1beta1Id1"]})
        if p["servicesId"] != "tpu.googleapis.com":
            return {}
        with self._lock:
            zones = dict(self.tpu_limits)
        name = f"projects/{self.d.number}/services/tpu.googleapis.com/consumerQuotaMetrics/tpu_chips"
        buckets = [{"effectiveLimit": str(self.TPU_QUOTA), "defaultLimit": str(self.TPU_QUOTA)},
                   *({"effectiveLimit": str(v), "defaultLimit": str(self.TPU_QUOTA), "dimensions": {"zone": z}}
                     for z, v in sorted(zones.items()))]
        return {"metrics": [{"name": name, "metric": "tpu.googleapis.com/tpu_chips", "displayName": "TPU chips",
                             "unit": "1/{project}/{zone}", "consumerQuotaLimits": [
                                 {"name": f"{name}/limits/%2Fproject%2Fzone", "metric": "tpu.googleapis.com/tpu_chips",
                                  "unit": "1/{project}/{zone}", "isPrecise": True, "quotaBuckets": buckets}]}]}

    def disable(self, service: str) -> None:
        with self._lock:
            self.enabled.discard(service if "." in service else f"{service}.googleapis.com")

    def enable(self, service: str) -> None:
        with self._lock:
            self.enabled.add(service if "." in service else f"{service}.googleapis.com")

    def _faults(self) -> dict[str, Callable[..., Any]]:
        return {**super()._faults(), "disable": self.disable, "enable": self.enable, "tpu_quota": self.tpu_quota}

    def _service(self, name: str) -> dict[str, Any]:
        parent = f"projects/{self.d.number}"
        with self._lock:
            state = "ENABLED" if name in self.enabled else "DISABLED"
        return {"name": f"{parent}/services/{name}", "parent": parent, "state": state,
                "config": {"name": name, "title": name.split(".")[0]}}

    def _parent(self, p: dict[str, str]) -> None:
        if p["v1Id"] != "projects":
            raise ApiError(400, f"Invalid parent {p['v1Id']}/{p['v1Id1']}: only projects are supported.")
        self._project(p["v1Id1"])

    def _services_get(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        self._parent(p)
        return self._service(p["servicesId"])

    def _services_batchGet(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        self._parent(p)
        names = request.args.getlist("names")
        if not 0 < len(names) <= 30:
            raise ApiError(400, "Between 1 and 30 names must be given.")
        out = []
        for full in names:
            parent, _, service = full.rpartition("/services/")
            if parent.removeprefix("projects/") not in (self.d.project, str(self.d.number)):
                raise ApiError(400, f"Service {full} is not under projects/{p['v1Id1']}.")
            out.append(self._service(service))
        return {"services": out}

    def _services_list(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        self._parent(p)
        wanted = request.args.get("filter", "")
        with self._lock:
            names = sorted(self.enabled)
        services = [self._service(n) for n in names]
        if wanted == "state:ENABLED":
            services = [s for s in services if s["state"] == "ENABLED"]
        return {"services": services}

    def _operation(self, service: str) -> dict[str, Any]:
        return {"name": f"operations/local.{service}", "done": True,
                "response": {"@type": "type.googleapis.com/google.api.serviceusage.v1.EnableServiceResponse",
                             "service": self._service(service)}}

    def _services_enable(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        self._parent(p)
        self.enable(p["servicesId"])
        return self._operation(p["servicesId"])

    def _services_disable(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        self._parent(p)
        self.disable(p["servicesId"])
        return self._operation(p["servicesId"])


class ResourceManagerServer(DiscoveryServer):
    """The project and its allow policy: deploy's grants (``Deployment.project_policy``), changed by
    ``projects.setIamPolicy`` (what ``gcloud projects add-iam-policy-binding`` and
    ``remove-iam-policy-binding`` call: a read, then the whole policy written with its etag)."""

    DOC, name = "cloudresourcemanager.v3", "resourcemanager"
    SUPPORTED = {"projects": ("get", "getIamPolicy", "setIamPolicy")}

    def __init__(self, deployment: Deployment) -> None:
        super().__init__(deployment)
        self._bindings = deployment.project_policy()
        self._etag = "BwYlocal"  # base64, as Google's (gcloud sends it back decoded and encoded again)

    def policy(self, project: str) -> list[dict[str, Any]]:
        """The project's bindings now (another project's: none); what the local registry's IAM reads."""
        with self._lock:
            return copy.deepcopy(self._bindings) if project in (self.d.project, str(self.d.number)) else []

    def _projects_get(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        project = self._project(p["projectsId"])
        return {"name": f"projects/{self.d.number}", "parent": "organizations/0", "projectId": project,
                "state": "ACTIVE", "displayName": project, "createTime": self.d.created,
                "updateTime": self.d.created, "etag": "W/\"local\""}

    def _projects_getIamPolicy(self, p: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        self._project(p["projectsId"])
        with self._lock:
            return {"version": 1, "etag": self._etag, "bindings": copy.deepcopy(self._bindings)}

    def _projects_setIamPolicy(self, p: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        self._project(p["projectsId"])
        policy = body.get("policy") or {}
        with self._lock:
            if policy.get("etag") not in (None, "", self._etag):
                raise concurrent_change()
            self._bindings = [b for b in copy.deepcopy(policy.get("bindings") or []) if b.get("members")]
            self._etag = base64.b64encode(secrets.token_bytes(6)).decode()
            return {"version": policy.get("version", 1), "etag": self._etag, "bindings": copy.deepcopy(self._bindings)}


class IamServer(DiscoveryServer):
    DOC, name = "iam.v1", "iam"
    SUPPORTED = {"projects.serviceAccounts": ("get", "getIamPolicy", "list"), "roles": ("get",),
                 "projects.roles": ("get",)}

    def _roles_get(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        """``roles.get``: a predefined role the local deployment's identities hold, with the permissions
        the in-memory project gives it (controller.adapters.memory_doctor.PREDEFINED: what respawn
        checks, a subset); ``projects.roles.get`` (routed here too): deploy's custom role."""
        if "projectsId" in p:
            return self._custom_role(p)
        name = f"roles/{p['rolesId']}"
        if name not in PREDEFINED:
            raise ApiError(404, f"The role named {name} was not found.")
        return {"name": name, "title": name, "includedPermissions": list(PREDEFINED[name]), "stage": "GA",
                "etag": "AA=="}

    def _custom_role(self, p: dict[str, str]) -> dict[str, Any]:
        project = self._project(p["projectsId"])
        if p["rolesId"] != deploy.TRAINER_ROLE_ID:
            raise ApiError(404, f"The role named projects/{project}/roles/{p['rolesId']} was not found.")
        return {"name": f"projects/{project}/roles/{deploy.TRAINER_ROLE_ID}", "title": "respawn VM records",
                "includedPermissions": list(deploy.TRAINER_PERMISSIONS), "stage": "GA", "etag": "BwYlocal="}

    def _accounts(self) -> dict[str, str]:
        return {self.d.controller: "respawn controller", self.d.trainer: "respawn trainer VMs",
                self.d.scheduler: "respawn scheduler"}

    def _account(self, p: dict[str, str]) -> dict[str, Any]:
        if p["projectsId"] != "-":
            self._project(p["projectsId"])
        email = p["serviceAccountsId"]
        if email not in self._accounts():
            raise ApiError(404, f"Unknown service account {email}.")
        unique = str(project_number(email))[:12] + "000000000"
        return {"name": f"projects/{self.d.project}/serviceAccounts/{email}", "projectId": self.d.project,
                "uniqueId": unique, "email": email, "displayName": self._accounts()[email],
                "etag": "MDEwMjE5MjA=", "oauth2ClientId": unique}

    def _serviceAccounts_get(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        return self._account(p)

    def _serviceAccounts_list(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        self._project(p["projectsId"])
        return {"accounts": [self._account({"projectsId": "-", "serviceAccountsId": e}) for e in self._accounts()]}

    def _serviceAccounts_getIamPolicy(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        email = self._account(p)["email"]
        if email != self.d.trainer:
            return {"version": 1, "etag": "ACAB"}
        return {"version": 1, "etag": "BwYlocal=", "bindings": [
            {"role": "roles/iam.serviceAccountUser", "members": [f"serviceAccount:{self.d.controller}"]}]}


class FunctionsServer(DiscoveryServer):
    DOC, name = "cloudfunctions.v2", "functions"
    SUPPORTED = {"projects.locations.functions": ("get", "list")}
    # A gen2 function's Cloud Run service holds its invoker bindings (`gcloud functions
    # add-invoker-policy-binding`): deploy's, the scheduler's on tick and the controller's on the others.
    ALSO = {"run.v2": {"projects.locations.services": ("getIamPolicy",)}}
    TARGETS = {deploy.TICK: "tick", deploy.ON_OBJECT: "on_object", deploy.ON_AUDIT: "on_audit",
               deploy.ON_SHARD: "on_shard"}

    def _services_getIamPolicy(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        self._location(p)
        name = p["servicesId"]
        if name not in self.TARGETS or self.TARGETS[name] not in self.d.functions():
            raise ApiError(404, f"Resource 'projects/{self.d.project}/locations/{self.d.region}/services/{name}' "
                                "was not found")
        invoker = self.d.scheduler if name == deploy.TICK else self.d.controller
        return {"version": 1, "etag": "BwYlocal=",
                "bindings": [{"role": "roles/run.invoker", "members": [f"serviceAccount:{invoker}"]}]}

    def _location(self, p: dict[str, str]) -> None:
        self._project(p["projectsId"])
        if p["locationsId"] != self.d.region:
            raise ApiError(404, f"Location {p['locationsId']} has no function of the local cloud "
                                f"(they are in {self.d.region}).")

    def _function(self, name: str) -> dict[str, Any]:
        target = self.TARGETS.get(name)
        running = self.d.functions()
        if target is None or target not in running:
            raise ApiError(404, f"Resource 'projects/{self.d.project}/locations/{self.d.region}/functions/{name}' "
                                "was not found")
        url, alive = running[target]
        base = f"projects/{self.d.project}/locations/{self.d.region}"
        resource: dict[str, Any] = {
            "name": f"{base}/functions/{name}", "environment": "GEN_2", "state": "ACTIVE" if alive else "FAILED",
            "updateTime": self.d.created, "url": url,
            "buildConfig": {"runtime": "python311", "entryPoint": target},
            "serviceConfig": {"uri": url, "serviceAccountEmail": self.d.controller, "timeoutSeconds": 540,
                              "availableMemory": "512Mi", "service": f"{base}/services/{name}",
                              **({"environmentVariables": {"RESPAWN_SHARDS": str(self.d.shards)}}
                                 if self.d.shards > 1 else {})},
        }
        if not alive:
            resource["stateMessages"] = [{"severity": "ERROR", "type": "LocalProcess",
                                          "message": "the local functions-framework process has exited"}]
        if target == "on_object":
            resource["eventTrigger"] = {
                "eventType": FINALIZED, "retryPolicy": "RETRY_POLICY_RETRY", "triggerRegion": self.d.region,
                "eventFilters": [{"attribute": "bucket", "value": self.d.bucket}],
                "serviceAccountEmail": self.d.controller}
        elif target in ("on_audit", "on_shard"):  # what `gcloud functions deploy --trigger-topic` makes
            topic = f"projects/{self.d.project}/topics/{deploy.AUDIT_TOPIC if target == 'on_audit' else deploy.SHARD_TOPIC}"
            retry = "RETRY_POLICY_RETRY" if target == "on_audit" else "RETRY_POLICY_DO_NOT_RETRY"  # on_shard: no --retry
            resource["eventTrigger"] = {
                "eventType": deploy.PUBLISHED, "pubsubTopic": topic, "retryPolicy": retry,
                "triggerRegion": self.d.region, "serviceAccountEmail": self.d.controller,
                "trigger": f"projects/{self.d.project}/locations/{self.d.region}/triggers/{name}"}
        return resource

    def _functions_get(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        self._location(p)
        return self._function(p["functionsId"])

    def _functions_list(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        self._location(p)
        running = self.d.functions()
        return {"functions": [self._function(n) for n, t in self.TARGETS.items() if t in running]}


class SchedulerServer(DiscoveryServer):
    DOC, name = "cloudscheduler.v1", "scheduler"
    SUPPORTED = {"projects.locations.jobs": ("get", "list")}

    def _location(self, p: dict[str, str]) -> None:
        self._project(p["projectsId"])
        if p["locationsId"] != self.d.region:
            raise ApiError(404, f"Location {p['locationsId']} has no job of the local cloud.")

    def _job(self) -> dict[str, Any]:
        running, last, code = self.d.ticker()
        tick = self.d.functions().get("tick", ("", False))[0]
        job: dict[str, Any] = {
            "name": f"projects/{self.d.project}/locations/{self.d.region}/jobs/{deploy.TICK}",
            "description": "respawn: reconcile every job", "schedule": self.d.schedule, "timeZone": "Etc/UTC",
            "state": "ENABLED" if running else "PAUSED", "attemptDeadline": "600s", "retryConfig": {"retryCount": 0},
            "userUpdateTime": self.d.created,
            "httpTarget": {"uri": tick, "httpMethod": "POST",
                           "oidcToken": {"serviceAccountEmail": self.d.scheduler, "audience": tick}},
        }
        if last is not None:
            job["lastAttemptTime"] = last.isoformat().replace("+00:00", "Z")
            # google.rpc.Status of the last attempt: empty when it succeeded (code 0 is OK)
            job["status"] = {} if code is not None and 200 <= code < 300 else \
                {"code": 13 if code is None or code >= 500 else 9, "message": f"HTTP {code}" if code else "no answer"}
        return job

    def _jobs_get(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        self._location(p)
        if p["jobsId"] != deploy.TICK:
            raise ApiError(404, f"Job not found: {p['jobsId']}.")
        return self._job()

    def _jobs_list(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        self._location(p)
        return {"jobs": [self._job()]}


SERVERS = (ServiceUsageServer, ResourceManagerServer, IamServer, FunctionsServer, SchedulerServer)
