"""A local Compute Engine REST server: the subset respawn (and gcloud) uses.

Routes and request schemas come from Google's discovery document; answers have the
real API's fields (numeric ``id``, ``selfLink``, ``creationTimestamp``, zone URLs),
instances move PROVISIONING -> STAGING -> RUNNING, operations PENDING -> RUNNING ->
DONE, and errors carry ``errors[].reason`` as Google sends them. Each RUNNING instance
is a real local process (``localcloud.vm``) with its own metadata server.

``instances.setMetadata`` holds Google's optimistic lock (the metadata fingerprint, 412
``conditionNotMet``); a Spot VM may carry a preemption notice (``scheduling.preemptionNoticeDuration``,
a Preview field also served on ``compute/beta/`` routes), which ``preempt`` follows; and
``instances.simulateMaintenanceEvent`` does to a VM what host maintenance would. Every answer is
a partial response when the request asks for one (``fields``, ``X-Goog-FieldMask``: ``localcloud.fields``).

Faults are injected from Python or over HTTP (``POST /_local/<fault>``): stockouts
and quota per zone (on the operation or synchronously), any HTTP error per method,
slow or held operations, unreachable zones, images and machine types that do not
exist, and, on named instances: preemption, host maintenance, host errors, guest
crashes, and any status string at all (values Google may add later); a project that refuses
the preemption notice (``refuse_notice``), and notices shortened by ``notice_scale``. Capacity advice
(``advice.capacity``, ``advice.capacityHistory``) is answered from those faults and a
per-zone preemption rate (``localcloud.advice``).

Each system event (a preemption, a host error, a guest's termination, a terminating host
maintenance, a live migration) is a zone operation named ``systemevent-...`` with the method as its
``operationType``, and also the System Event audit entry Google writes for it
(``localcloud.logging.system_event``), handed to ``audit_log`` (the stack points it at the local
Cloud Logging server).

TPU slices (``localcloud.migs``): TPU machine types exist only in their catalogue zones
(``controller.core.tpus``; ``machineTypes`` get / list), a TPU VM's metadata server serves its slice
(``accelerator-type``, ``agent-worker-number``, ``worker-network-endpoints``, ``tpu-env``), and
workload policies (``resourcePolicies``), ``instanceTemplates`` and zonal ``instanceGroupManagers``
(with the ``instanceGroups`` and ``autoscalers`` reads gcloud's MIG listing makes) are served.

How slow and strict it is comes from a ``localcloud.realism.Realism`` (default: not at
all): latency per call (per method if wanted), how long insert and delete operations
stay RUNNING, bulkInsert's rate and in-flight limits, and the guest's halt time between its
shutdown script and TERMINATED. Requests are served on threads
of their own: a latency or an ``operations.wait`` blocks only its own caller.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

from flask import Flask, Response, request

from localcloud import advice, discovery, fields, gce, quotas
from localcloud.advice import AdviceApi
from localcloud.gce import ApiError
from localcloud.host import Host, json_response
from controller.core import audit
from localcloud.logging import system_event, system_event_operation
from localcloud.http import Served
from localcloud.migs import MigsApi
from localcloud.operations import OperationsApi
from localcloud.metadata import MetadataServer, Tokens, project_number, service_account
from localcloud.realism import Realism, quota_group
from localcloud.vm import VmProcess

SUPPORTED = {
    "instances": ("aggregatedList", "list", "get", "insert", "delete", "bulkInsert", "stop", "start",
                  "getSerialPortOutput", "setMetadata", "simulateMaintenanceEvent"),
    "regionInstances": ("bulkInsert",),
    "zoneOperations": ("get", "wait", "list", "delete"),
    "regionOperations": ("get", "wait", "list"),
    "advice": ("capacity", "capacityHistory"),
    "regions": ("get",),  # quotas[] (localcloud.quotas)
    "images": ("get", "getFromFamily"),  # every image exists but those the unknown("image") fault names
    # TPU slices (localcloud.migs): templates, workload policies, MIGs, machine types, global operations
    "instanceTemplates": ("insert", "get", "list", "delete"),
    "resourcePolicies": ("insert", "get", "list", "delete"),
    "instanceGroupManagers": ("insert", "get", "list", "aggregatedList", "delete", "listManagedInstances"),
    "instanceGroups": ("get", "list"),  # a MIG's VMs as an unmanaged group: gcloud's MIG listing reads its size
    "autoscalers": ("list",),  # none, ever: gcloud's MIG listing asks
    "machineTypes": ("get", "list"),
    "globalOperations": ("get", "wait", "list"),
}
# What the beta API (``compute/beta/...``, validated against compute.beta.json) is served for: the
# inserts that carry ``scheduling.preemptionNoticeDuration`` from google-cloud-compute-v1beta,
# whose v1 protos lack it, and what such a client reads back.
BETA = {"instances": ("get", "insert", "bulkInsert"), "zoneOperations": ("get", "wait")}
ZONES = ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-east1-b", "us-east1-c",
         "us-east1-d", "us-west1-a", "us-west1-b", "europe-west4-a", "europe-west4-b", "europe-west4-c")
USER = "respawn-controller@localcloud.iam.gserviceaccount.com"
QUICK = 0.05  # seconds an operation runs when nothing asks for longer
BULK = ("instances.bulkInsert", "regionInstances.bulkInsert")
# The system events Compute writes to the System Event audit log (cloudaudit.googleapis.com/system_event).
SYSTEM_EVENTS = tuple(audit.METHODS)
# Google's advance notice of a live migration on ``instance/maintenance-event`` ("60 seconds",
# https://cloud.google.com/compute/docs/instances/host-maintenance-overview), times ``notice_scale``.
MIGRATION_NOTICE_S = 60.0
log = logging.getLogger(__name__)


@dataclass
class Vm:
    project: str
    zone: str
    resource: dict[str, Any]
    preempted: bool = False
    maintenance: str = "NONE"
    process: VmProcess | None = None
    metadata: MetadataServer | None = None
    # A power-off under way (its shutdown script): set once the guest is off; the process it stops.
    off: tuple[threading.Event, VmProcess] | None = None
    tokens: Tokens | None = None
    group: str | None = None  # the MIG it belongs to (localcloud.migs)
    worker: int = 0  # its index in its TPU slice (agent-worker-number)
    ip: str = "127.0.0.1"  # its address as the metadata server and its slice's peers know it

    @property
    def name(self) -> str:
        return self.resource["name"]

    def attribute(self, key: str) -> str | None:
        return next((i.get("value") for i in self.resource["metadata"]["items"] if i.get("key") == key), None)


@dataclass
class Faults:
    stockouts: dict[str, str] = field(default_factory=dict)  # zone -> "operation" | "sync"
    spot_stockouts: dict[str, str] = field(default_factory=dict)  # the same, for Spot VMs only
    unforeseen: set[str] = field(default_factory=set)  # zones whose stockout capacity advice does not show
    quota: dict[str, str] = field(default_factory=dict)
    unreachable: set[str] = field(default_factory=set)
    # "instances.insert" -> [(503, message, reason)]
    failures: dict[str, list[tuple[int, str, str]]] = field(default_factory=lambda: defaultdict(list))
    insert_seconds: float = QUICK  # insert, bulkInsert and start operations RUNNING this long
    delete_seconds: float = QUICK  # delete operations at least this long, the guest's shutdown included
    hold: bool = False  # insert operations stay RUNNING until released
    held: list[tuple[list[Vm], dict[str, Any]]] = field(default_factory=list)
    unknown: set[tuple[str, str]] = field(default_factory=set)  # ("image" | "machineType", name)
    advice: advice.Schedule = field(default_factory=advice.Schedule)  # preemption rates, prices: what advice says
    quota_limits: dict[str, dict[str, float]] = field(default_factory=dict)  # region -> metric -> limit (regions.get)
    refuse_notice: bool = False  # inserts asking for a preemption notice are refused (no Preview)


class ComputeServer(Host, OperationsApi, AdviceApi, MigsApi):
    _user = USER

    def __init__(self, *, vm_env: dict[str, str] | None = None, workdir: Path | None = None,
                 boot_delay: float = 0.1, shutdown_budget: float = 30.0, run_vms: bool = True,
                 zones: tuple[str, ...] = ZONES, guest_shutdown_limit: float = 300.0,
                 realism: Realism | None = None, preemption_day: float | None = None,
                 notice_scale: float = 1.0) -> None:
        """``shutdown_budget``: the shutdown script's time when Compute stops, deletes or preempts
        a VM (Google: 30 s for Spot and preemptible VMs, 90 s otherwise); ``guest_shutdown_limit``:
        its time when the guest powers itself off, which Google does not limit (a bound, here);
        ``realism``: latency, operation durations and bulkInsert limits (default: none);
        ``preemption_day``: seconds that stand for a day of the local world: a Spot VM is then
        preempted when its zone's estimated uptime (``spot_uptime``, else the model's from its
        ``preemption_rate``) has passed at that scale; None: they only inform capacity advice;
        ``notice_scale``: a preemption notice (``scheduling.preemptionNoticeDuration``) lasts its
        seconds times this (tests and the demo shorten Google's 120 s)."""
        super().__init__(vm_env, workdir, "localcloud-vms-")
        self.boot_delay = boot_delay
        self.shutdown_budget = shutdown_budget
        self.guest_shutdown_limit = guest_shutdown_limit
        self.run_vms = run_vms
        self.zones = zones
        self.preemption_day = preemption_day
        self.realism = realism or Realism()  # latency and limits are read from it on each call
        self.faults = Faults()
        # Where System Event audit entries go (a LoggingServer's ``write``, set by the stack); None: nowhere.
        self.audit_log: Callable[[list[dict[str, Any]]], None] | None = None
        if self.realism.insert_seconds is not None:
            self.faults.insert_seconds = self.realism.insert_seconds
        if self.realism.delete_seconds is not None:
            self.faults.delete_seconds = self.realism.delete_seconds
        self._rate_windows: dict[tuple[str, str], tuple[int, int]] = {}  # (project, group) -> (minute, requests)
        self.rate_refusals = 0  # 403 rateLimitExceeded answered (the rate quotas)
        self._bulk_calls: dict[str, deque[float]] = defaultdict(deque)  # project -> bulkInsert arrivals, last second
        self._bulk_running: dict[str, list[dict[str, Any]]] = defaultdict(list)  # project -> bulk operations
        self._vms: dict[tuple[str, str, str], Vm] = {}
        self._ops: dict[tuple[str, str], dict[str, Any]] = {}  # (scope url, name) -> op
        self._requests: dict[tuple[str, str], dict[str, Any]] = {}  # (project, requestId) -> op
        self._done = threading.Condition(self._lock)
        self._routes = {"v1": discovery.methods(SUPPORTED), "beta": discovery.methods(BETA, "compute.beta")}
        self.notice_scale = notice_scale
        self.urls = gce.Urls("http://127.0.0.1")
        self._migs_init()

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> ComputeServer:
        self._served = Served(self._app(), "compute", threads=128)
        self.urls = gce.Urls(self._served.url)
        return self

    def _power_off_machines(self) -> None:
        with self._lock:
            vms = list(self._vms.values())
        for vm in vms:
            self._power_off(vm, budget=0)

    # -- faults and inspection ---------------------------------------------------
    def stockout(self, zone: str, on: bool = True, mode: str = "operation", spot_only: bool = False,
                 foreseen: bool = True) -> None:
        """No capacity in ``zone`` (``spot_only``: for Spot VMs; standard ones still fit). Flex-start
        VMs are not refused: they wait in PENDING, and boot once the stockout is lifted.
        ``foreseen=False``: capacity advice still scores the zone as obtainable (advice is a
        forecast, and an insert can meet a stockout it did not predict)."""
        _switch(self._lock, self.faults.spot_stockouts if spot_only else self.faults.stockouts, zone,
                mode if on else None)
        with self._lock:
            (self.faults.unforeseen.add if on and not foreseen else self.faults.unforeseen.discard)(zone)
        if not on:
            self._capacity_freed(zone)

    def quota(self, zone: str, on: bool = True, mode: str = "sync") -> None:
        _switch(self._lock, self.faults.quota, zone, mode if on else None)

    def quota_limit(self, region: str, metric: str, limit: float) -> None:
        """``regions.get`` lists ``metric``'s limit in ``region`` as ``limit`` (default
        ``localcloud.quotas.DEFAULT_LIMIT``); inserts are not held to it (the ``quota`` fault refuses them)."""
        if metric not in quotas.every_metric() or float(limit) < 0:
            raise ValueError(f"not a GPU quota metric with a limit >= 0: {metric} {limit}")
        with self._lock:
            self.faults.quota_limits.setdefault(region, {})[metric] = float(limit)

    def fail_next(self, method: str, code: int = 503, times: int = 1, reason: str = "backendError",
                  message: str = "Internal error. Please try again or contact Google Support.") -> None:
        """The next ``times`` calls of e.g. ``instances.insert`` answer HTTP ``code`` with ``errors[].reason``
        ``reason`` (e.g. 403 ``rateLimitExceeded``, 503 ``insufficientCapacity``)."""
        with self._lock:
            self.faults.failures[method].extend([(code, message, reason)] * times)

    def slow_operations(self, seconds: float | None = None, *, insert: float | None = None,
                        delete: float | None = None) -> None:
        """Operations run this long before they finish: ``seconds`` for all, or ``insert`` (insert,
        bulkInsert, start) and ``delete`` (at least this long, the guest's shutdown included) apart."""
        insert = seconds if insert is None else insert
        delete = seconds if delete is None else delete
        with self._lock:
            if insert is not None:
                self.faults.insert_seconds = insert
            if delete is not None:
                self.faults.delete_seconds = delete

    def hold_operations(self, on: bool = True) -> None:
        """While on, insert/bulkInsert/start operations stay RUNNING (capacity not yet decided);
        turning it off lets every held one finish now, with the zone's faults as they are then."""
        with self._lock:
            self.faults.hold = on
            held: list[tuple[list[Vm], dict[str, Any]]] = []
            if not on:
                held, self.faults.held = self.faults.held, []
        for vms, op in held:
            self._provision(vms, op)

    def refuse_notice(self, on: bool = True) -> None:
        """While on, an insert asking for a preemption notice (non-zero) is refused 400 naming
        ``scheduling.preemptionNoticeDuration``, as in a project the Preview is not open to."""
        with self._lock:
            self.faults.refuse_notice = bool(on)

    def scale_notice(self, scale: float) -> None:
        """Preemption notices last their seconds times ``scale`` from now on (1: as asked)."""
        if not float(scale) >= 0:
            raise ValueError(f"a notice scale is a number >= 0: {scale}")
        with self._lock:
            self.notice_scale = float(scale)

    def unknown(self, kind: str, name: str, on: bool = True) -> None:
        """An image (``kind="image"``, as the request names it or its last path segment) or machine
        type (``kind="machineType"``, bare name) that does not exist: inserts naming it are refused."""
        if kind not in ("image", "machineType"):
            raise ValueError(f"unknown resource kind {kind!r}")
        with self._lock:
            (self.faults.unknown.add if on else self.faults.unknown.discard)((kind, name))

    def unreachable(self, zone: str, on: bool = True) -> None:
        with self._lock:
            if on:
                self.faults.unreachable.add(zone)
            else:
                self.faults.unreachable.discard(zone)

    def preempt(self, name: str, graceful: bool = True) -> None:
        """Reclaim a Spot VM: preempted=TRUE, then at the soft-off STOPPING (Compute's record of
        the preemption: its zone operation and System Event entry), the shutdown script, then
        TERMINATED or deleted.

        A VM inserted with a preemption notice of N seconds (``preemptionNoticeDuration``) reads
        preempted=TRUE N seconds (times ``notice_scale``) before the soft-off and RUNNING until
        then; without one, preempted=TRUE and the soft-off come together. ``graceful=False``: the
        guest never sees it coming (it was still booting, or hung): its processes end before
        instance/preempted turns TRUE, no notice, no shutdown script, so no notice record and no
        marker; only Compute's preemption record tells what happened, at the soft-off, which comes
        at once. A VM is reclaimed once: preempting it again before it starts again changes nothing.
        """
        vm = self._find(name)
        with self._lock:
            if vm.preempted:
                return
            process = vm.process
        if not graceful and process is not None:
            process.kill()  # before the guest could read instance/preempted
        with self._lock:
            if vm.preempted:
                return
            vm.preempted = True
            if not graceful:
                self._soft_off(vm, vm.process, graceful)
                return
            notice = gce.notice_seconds(vm.resource["scheduling"]) * self.notice_scale
            if notice > 0 and vm.resource["status"] == "RUNNING":
                if vm.metadata:
                    vm.metadata.changed()  # instance/preempted: the guest's long poll wakes now
                self._later(notice, self._soft_off, vm, vm.process, graceful)
                return
            self._soft_off(vm, vm.process, graceful)

    def _soft_off(self, vm: Vm, process: VmProcess | None, graceful: bool) -> None:
        """The preemption's ACPI soft-off (at the end of its notice, if it had one)."""
        with self._lock:
            if vm.process is not process or self._vms.get((vm.project, vm.zone, vm.name)) is not vm \
                    or vm.resource["status"] in ("STOPPING", "TERMINATED", "STOPPED"):
                return  # stopped or deleted during the notice: nothing left to reclaim
            self._record(vm, "compute.instances.preempted")
            self._set_status(vm, "STOPPING")
        action = vm.resource["scheduling"].get("instanceTerminationAction", "STOP")
        outcome = "DELETE" if action == "DELETE" else "TERMINATED"
        threading.Thread(target=self._stop_then, args=(vm, outcome, None, None if graceful else 0),
                         kwargs={"halt": True}, daemon=True).start()

    def maintenance(self, name: str) -> None:
        """Host maintenance on a VM that cannot live-migrate (GPUs, onHostMaintenance=TERMINATE):
        maintenance-event turns TERMINATE_ON_HOST_MAINTENANCE, then the VM is stopped."""
        vm = self._find(name)
        with self._lock:
            vm.maintenance = "TERMINATE_ON_HOST_MAINTENANCE"
            self._record(vm, "compute.instances.terminateOnHostMaintenance")
            self._set_status(vm, "STOPPING")
        threading.Thread(target=self._stop_then, args=(vm, "TERMINATED"), kwargs={"halt": True}, daemon=True).start()

    def host_error(self, name: str) -> None:
        """The host under the VM fails: ``compute.instances.hostError`` is recorded and the VM is
        gone at once (no shutdown script runs, no guest halts: TERMINATED at once); with
        automaticRestart off it stays TERMINATED."""
        vm = self._find(name)
        with self._lock:
            self._record(vm, "compute.instances.hostError")
            self._set_status(vm, "STOPPING")
        threading.Thread(target=self._stop_then, args=(vm, "TERMINATED", None, 0), daemon=True).start()

    def crash(self, name: str) -> None:
        """The guest dies (kernel panic, OOM of PID 1): Compute records
        ``compute.instances.guestTerminate`` and every process of the VM is killed at once, no
        shutdown script. A guest already on its way down (a preempted one shutting itself
        down) gets the record too."""
        self._guest_terminated(self._find(name), budget=0, halt=False)

    def set_metadata(self, name: str, items: dict[str, str]) -> None:
        """Merge ``items`` into a named instance's metadata, as someone else's ``setMetadata``
        would (a new fingerprint; the VM's long polls wake)."""
        with self._lock:
            vm = self._find(name)
            merged = {i["key"]: i.get("value", "") for i in vm.resource["metadata"]["items"]} | dict(items)
            self._set_items(vm, [{"key": k, "value": v} for k, v in merged.items()])

    def set_status(self, name: str, status: str) -> None:
        """Give a named instance any status string at all, e.g. PENDING_STOP or one Google adds later."""
        with self._lock:
            self._set_status(self._find(name), status)

    def instance(self, name: str) -> dict[str, Any]:
        with self._lock:
            return json.loads(json.dumps(self._find(name).resource))

    def instances(self) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(json.dumps(vm.resource)) for vm in self._vms.values()]

    def workdir_of(self, name: str) -> Path:
        return self.workdir / name

    def token_account(self, token: str) -> str | None:
        """The service account an access token of one of these instances' metadata servers stands for
        (None: no instance issued it, or it expired): what Google's token check tells the services a
        VM calls with it (the local Artifact Registry asks)."""
        with self._lock:
            vms = list(self._vms.values())
        for vm in vms:
            if vm.tokens is not None and vm.tokens.valid(token):
                with self._lock:
                    return self._account_email(vm)
        return None

    def names(self) -> set[str]:
        """The names of every instance there is now: a cheap look, for a caller that polls."""
        with self._lock:
            return {name for _, _, name in self._vms}

    def _inventory(self) -> dict[str, Any]:
        """What a fault can name, and the instances there were and are no more (``gone``): a name
        given after its job finished is told apart from one no job has made yet."""
        found = super()._inventory()
        with self._lock:
            made = {str(op.get("targetLink", "")).rsplit("/", 1)[-1] for op in self._ops.values()
                    if op.get("operationType") == "insert"}
        return {**found, "gone": sorted(made - set(found["machines"]) - {""})}

    def operations(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(op) for op in self._ops.values()]

    # -- HTTP ----------------------------------------------------------------------
    def _app(self) -> Flask:
        app = Flask("compute")

        @app.route("/compute/<any(v1, beta):version>/<path:path>", methods=["GET", "POST", "DELETE", "PATCH", "PUT"])
        def api(version: str, path: str) -> Response:
            try:
                answer = self._dispatch(request.method, path, version)
            except ApiError as e:
                return _json(e.body(), e.code)
            if isinstance(answer, dict) and answer.get("kind") == "compute#operation":
                # An operation is the server's own, finished on another thread (DONE, an error
                # added): copied as it stands now, under the lock its changes are made under, so an
                # answer is never serialized half-way through one (a 500 Google never sends).
                with self._lock:
                    answer = copy.deepcopy(answer)
            # The beta API's links name the beta API; the resource is the same one.
            return _json(_relinked(answer, self.urls.base, self.urls.base.replace("/v1/", "/beta/"))
                         if version == "beta" else answer)

        self._fault_route(app, {
            "stockout": self.stockout, "quota": self.quota, "fail_next": self.fail_next, "preempt": self.preempt,
            "crash": self.crash, "unreachable": self.unreachable, "maintenance": self.maintenance,
            "host_error": self.host_error, "set_status": self.set_status, "slow_operations": self.slow_operations,
            "hold_operations": self.hold_operations, "unknown": self.unknown,
            "preemption_rate": self.preemption_rate, "spot_uptime": self.spot_uptime, "spot_price": self.spot_price,
            "quota_limit": self.quota_limit, "set_metadata": self.set_metadata, "refuse_notice": self.refuse_notice,
            "notice_scale": self.scale_notice},
            refused=(TypeError, ValueError, KeyError), inventory=self._inventory)  # KeyError: an instance not there
        return app

    def _dispatch(self, verb: str, path: str, version: str = "v1") -> dict[str, Any]:
        for method in self._routes[version]:
            match = method.pattern.match(path)
            if match and method.http_method == verb:
                break
        else:
            self._delay(None)
            raise ApiError(404, f"The requested URL /compute/{version}/{path} was not found on this server.", "notFound")
        name = f"{method.resource}.{method.name}"
        self._delay(name)
        self._rate_quota(match.groupdict().get("project", ""), name)
        if name in BULK:
            self._bulk_rate(match.group("project"))
        with self._lock:
            if self.faults.failures.get(name):
                raise ApiError(*self.faults.failures[name].pop(0))
        selection = self._selection(method.response_schema, version)
        body = request.get_json(silent=True) if method.request_schema else None
        if method.request_schema:
            if not isinstance(body, dict):
                raise ApiError(400, "Invalid JSON payload received.", "parseError")
            problems = discovery.validate(body, method.request_schema, doc=f"compute.{version}")
            if problems:
                raise ApiError(400, problems[0], "invalid")
        handler = getattr(self, f"_{method.resource}_{method.name}")
        return fields.select(handler(match.groupdict(), request.args, body), selection)

    @staticmethod
    def _selection(schema: str | None, version: str) -> fields.Tree | None:
        """The partial response the request asks for (``fields``, ``X-Goog-FieldMask``), refused as
        Google refuses one naming a field its answer does not have, before the method runs."""
        text = fields.requested(request.args, request.headers)
        if not text or not schema:
            return None
        try:
            tree = fields.parse(text)
            fields.check(tree, schema, doc=f"compute.{version}")
        except fields.FieldsError as e:
            raise ApiError(400, str(e), "invalidParameter") from None
        return tree

    # -- regions ---------------------------------------------------------------------
    def _regions_get(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        project, region = p["project"], p["region"]
        zones = [z for z in self.zones if gce.region_of(z) == region]
        if not zones:
            raise gce.not_found(f"projects/{project}/regions/{region}")
        with self._lock:
            live = [vm.resource for (pr, z, _), vm in self._vms.items() if pr == project and gce.region_of(z) == region]
            listed = quotas.quotas(live, self.faults.quota_limits.get(region, {}), self._quota(zones[0]) is not None)
        return {"kind": "compute#region", "id": str(project_number(region) % 10_000), "name": region,
                "description": region, "status": "UP", "selfLink": self.urls.region(project, region),
                "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
                "zones": [self.urls.zone(project, z) for z in zones], "quotas": listed}

    # -- images ----------------------------------------------------------------------
    def _images_get(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        return self._image(p["project"], p["image"], None)

    def _images_getFromFamily(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        family = p["family"]
        return self._image(p["project"], f"{family}-v20260101", family)

    def _image(self, project: str, name: str, family: str | None) -> dict[str, Any]:
        """Any image a VM may boot here (a local VM runs its startup script whatever its image), but
        one the ``unknown`` fault names, as an insert naming it is refused: 404 as Google answers."""
        path = f"projects/{project}/global/images/{'family/' + family if family else name}"
        with self._lock:
            if {("image", name), ("image", family or name), ("image", path)} & self.faults.unknown:
                raise gce.not_found(path)
        return {"kind": "compute#image", "id": str(project_number(f"{project}/{name}")), "name": name,
                "family": family or name.rsplit("-v", 1)[0], "status": "READY", "archiveSizeBytes": "0",
                "diskSizeGb": "10", "sourceType": "RAW", "creationTimestamp": "2026-01-01T00:00:00.000-08:00",
                "selfLink": f"{self.urls.base}projects/{project}/global/images/{name}"}

    # -- instances -------------------------------------------------------------------
    def _instances_get(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            return self._vm(p["project"], p["zone"], p["instance"]).resource

    def _instances_getSerialPortOutput(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            vm = self._vm(p["project"], p["zone"], p["instance"])
        log = self.workdir_of(vm.name) / "serial-port-1.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        start = int(q.get("start", 0))
        return {"kind": "compute#serialPortOutput", "contents": text[start:], "start": str(start),
                "next": str(len(text)), "selfLink": f"{vm.resource['selfLink']}/serialPort"}

    def _instances_list(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        self._zone(p["zone"])
        with self._lock:
            items = [vm.resource for (pr, z, _), vm in sorted(self._vms.items()) if pr == p["project"] and z == p["zone"]]
        page, token = gce.page(gce.filtered(items, q.get("filter")), q)
        out = {"kind": "compute#instanceList", "id": f"projects/{p['project']}/zones/{p['zone']}/instances",
               "items": page, "selfLink": f"{self.urls.zone(p['project'], p['zone'])}/instances"}
        return {**out, "nextPageToken": token} if token else out

    def _instances_aggregatedList(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        project = p["project"]
        with self._lock:
            vms = [vm for (pr, _, _), vm in sorted(self._vms.items()) if pr == project]
            unreachable = sorted(self.faults.unreachable)
        predicate = gce.compile_list_filter(q.get("filter"))
        zones = sorted(set(self.zones) | {vm.zone for vm in vms})
        # Paged by items, as Google pages (maxResults, at most 500 instances a page; a zone's
        # instances may span pages): each zone is one entry when it has none (its warning).
        entries: list[tuple[str, Any]] = []
        for zone in zones:
            if zone in unreachable:
                continue
            found = [vm.resource for vm in vms if vm.zone == zone and predicate(vm.resource)]
            entries += [(zone, r) for r in found] if found else [(zone, None)]
        paged, token = gce.page(entries, q)
        items: dict[str, Any] = {}
        for zone, resource in paged:
            if resource is not None:
                items.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(resource)
            else:
                items[f"zones/{zone}"] = {"warning": {
                    "code": "NO_RESULTS_ON_PAGE", "message": f"There are no results for scope 'zones/{zone}' on this page.",
                    "data": [{"key": "scope", "value": f"zones/{zone}"}]}}
        out: dict[str, Any] = {"kind": "compute#instanceAggregatedList", "id": f"projects/{project}/aggregated/instances",
                               "items": items, "selfLink": f"{self.urls.base}projects/{project}/aggregated/instances"}
        if unreachable:
            out["unreachables"] = [f"zones/{z}" for z in unreachable]
        return {**out, "nextPageToken": token} if token else out

    def _instances_insert(self, p: dict[str, str], q: Any, body: dict[str, Any]) -> dict[str, Any]:
        project, zone = p["project"], self._zone(p["zone"])
        with self._lock:
            if replay := self._replay(project, q.get("requestId")):
                return replay
            gce.check_instance(body, zone)
            self._tpu_check(body, zone, "resource")
            self._notice_open(body, "resource")
            self._exists(body, zone, "resource")
            self._admit(project, zone, [body["name"]], model=_model(body))
            vm = self._create(project, zone, body)
            op = self._zone_op(project, zone, "insert", vm)
            self._remember(project, q.get("requestId"), op)
        self._later(self.faults.insert_seconds, self._provision, [vm], op)
        return op

    def _instances_bulkInsert(self, p: dict[str, str], q: Any, body: dict[str, Any]) -> dict[str, Any]:
        project, zone = p["project"], self._zone(p["zone"])
        return self._bulk(project, [zone], body, q, self.urls.zone(project, zone), "zone")

    def _regionInstances_bulkInsert(self, p: dict[str, str], q: Any, body: dict[str, Any]) -> dict[str, Any]:
        """Google's rule: a zone the location policy leaves out is allowed (the default preference
        is ALLOW), only DENY excludes; so one ALLOW entry does not pin the request to that zone.
        Compute picks a zone that has room (here: the first allowed one without a fault)."""
        project, region = p["project"], p["region"]
        locations = {k.removeprefix("zones/"): (v or {}).get("preference", "ALLOW")
                     for k, v in ((body.get("locationPolicy") or {}).get("locations") or {}).items()}
        if any(gce.region_of(z) != region for z in locations):
            raise ApiError(400, f"Invalid location policy for region {region}: every location must be a zone of it.",
                           "invalid")
        candidates = [z for z in self.zones if gce.region_of(z) == region and locations.get(z) != "DENY"]
        if not candidates:
            raise ApiError(400, f"Invalid location policy for region {region}: no zone is allowed.", "invalid")
        with self._lock:
            candidates.sort(key=lambda z: z in self.faults.stockouts or z in self.faults.quota)
        return self._bulk(project, candidates, body, q, self.urls.region(project, region), "region")

    def _bulk(self, project: str, zones: list[str], body: dict[str, Any], q: Any, scope: str, key: str) -> dict[str, Any]:
        """bulkInsert: all ``minCount`` (= ``count`` here) instances in one zone, or none."""
        props = body.get("instanceProperties")
        if not props:
            raise ApiError(400, "instanceProperties (or a source instance template) is required.", "invalid")
        names = list((body.get("perInstanceProperties") or {}))
        if not names and body.get("namePattern"):
            pattern = body["namePattern"]
            width = pattern.count("#")
            names = [pattern.replace("#" * width, str(i + 1).zfill(width)) for i in range(int(body.get("count", 0)))]
        if not names or int(body.get("count", len(names))) != len(names):
            raise ApiError(400, "count must equal the number of perInstanceProperties names.", "invalid")
        with self._lock:
            if replay := self._replay(project, q.get("requestId")):
                return replay
            self._bulk_in_flight(project, gce.region_of(zones[0]))
            chosen, last_error = None, None
            for zone in zones:
                try:
                    gce.properties_check({**props, "name": names[0]}, None, "resource.instanceProperties")
                    self._tpu_check(props, zone, "resource.instanceProperties")
                    self._notice_open(props, "resource.instanceProperties")
                    self._exists(props, zone, "resource.instanceProperties")
                    self._admit(project, zone, names, bulk=True, model=_model(props))
                    chosen = zone
                    break
                except ApiError as e:
                    if e.code == 400:
                        raise
                    last_error = e
            if chosen is None:
                assert last_error is not None
                raise last_error
            # instanceProperties names a bare machine type; each VM gets the chosen zone's.
            base = {**props, "machineType": f"zones/{chosen}/machineTypes/{props['machineType'].rsplit('/', 1)[-1]}"}
            per = body.get("perInstanceProperties") or {}
            vms = [self._create(project, chosen, {**base, "name": n, **_hostname(per.get(n))}) for n in names]
            op = gce.operation("bulkInsert", scope, key, "", "", USER)
            op["status"] = "RUNNING"
            op["startTime"] = gce.now()
            self._ops[(op[key], op["name"])] = op
            self._remember(project, q.get("requestId"), op)
            self._bulk_running[project].append(op)
        self._later(self.faults.insert_seconds, self._provision, vms, op)
        return op

    def _instances_delete(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            if replay := self._replay(p["project"], q.get("requestId")):
                return replay
            vm = self._vm(p["project"], p["zone"], p["instance"])
            op = self._zone_op(vm.project, vm.zone, "delete", vm)
            self._remember(vm.project, q.get("requestId"), op)
            if vm.resource["status"] not in ("STOPPING",):
                self._set_status(vm, "STOPPING")
        budget = 0 if q.get("noGracefulShutdown") == "true" else self.shutdown_budget
        # The guest's shutdown starts now; the operation is DONE when it is over, and not before
        # delete_seconds (a delete takes a while on Google, the shutdown included).
        not_before = time.monotonic() + self.faults.delete_seconds
        threading.Thread(target=self._stop_then, args=(vm, "DELETE", op, budget), kwargs={"not_before": not_before},
                         daemon=True).start()
        return op

    def _instances_stop(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            vm = self._vm(p["project"], p["zone"], p["instance"])
            op = self._zone_op(vm.project, vm.zone, "stop", vm)
            if vm.resource["status"] in ("TERMINATED", "STOPPED"):
                gce.finish(op)
                return op
            self._set_status(vm, "STOPPING")
        threading.Thread(target=self._stop_then, args=(vm, "TERMINATED", op), kwargs={"halt": True},
                         daemon=True).start()
        return op

    def _instances_setMetadata(self, p: dict[str, str], q: Any, body: dict[str, Any]) -> dict[str, Any]:
        """The items replace the instance's, on its current fingerprint (Google's optimistic lock:
        any other, or none, is 412 conditionNotMet); the guest sees them at once."""
        with self._lock:
            if replay := self._replay(p["project"], q.get("requestId")):
                return replay
            vm = self._vm(p["project"], p["zone"], p["instance"])
            if body.get("fingerprint") != vm.resource["metadata"]["fingerprint"]:
                raise gce.metadata_race()
            items = [{"key": i.get("key", ""), "value": i.get("value", "")} for i in body.get("items") or []]
            gce.check_metadata(items, "metadataResource")
            op = self._zone_op(vm.project, vm.zone, "setMetadata", vm)
            self._set_items(vm, items)
            self._remember(vm.project, q.get("requestId"), op)
        self._later(QUICK, self._finish_op, op)
        return op

    def _instances_simulateMaintenanceEvent(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        """What host maintenance does to this VM (Google documents it as the way to test
        preemption handling): a Spot (or preemptible) VM is preempted, with its notice; one with
        onHostMaintenance TERMINATE is stopped by a terminating maintenance; any other migrates
        live and runs on."""
        with self._lock:
            if replay := self._replay(p["project"], q.get("requestId")):
                return replay
            vm = self._vm(p["project"], p["zone"], p["instance"])
            if vm.resource["status"] != "RUNNING":
                raise ApiError(400, f"The resource '{vm.resource['selfLink'].split('/compute/v1/')[-1]}' is not ready",
                               "resourceNotReady")
            op = self._zone_op(vm.project, vm.zone, "simulateMaintenanceEvent", vm)
            self._remember(vm.project, q.get("requestId"), op)
            if _model(vm.resource) == "SPOT":
                self.preempt(vm.name)
            elif vm.resource["scheduling"].get("onHostMaintenance") == "TERMINATE":
                self.maintenance(vm.name)
            else:
                self._migrate(vm)
        self._later(QUICK, self._finish_op, op)
        return op

    def _migrate(self, vm: Vm) -> None:
        """A live migration: announced on ``maintenance-event``, then done while the VM runs on."""
        vm.maintenance = "MIGRATE_ON_HOST_MAINTENANCE"
        if vm.metadata:
            vm.metadata.changed()
        self._later(MIGRATION_NOTICE_S * self.notice_scale, self._migrated, vm, vm.process)

    def _migrated(self, vm: Vm, process: VmProcess | None) -> None:
        with self._lock:
            if vm.process is not process or self._vms.get((vm.project, vm.zone, vm.name)) is not vm:
                return  # stopped or deleted meanwhile
            self._record(vm, "compute.instances.migrateOnHostMaintenance")
            vm.maintenance = "NONE"
            if vm.metadata:
                vm.metadata.changed()

    def _instances_start(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            vm = self._vm(p["project"], p["zone"], p["instance"])
            op = self._zone_op(vm.project, vm.zone, "start", vm)
            if vm.resource["status"] != "TERMINATED":
                gce.finish(op)
                return op
            self._admit(vm.project, vm.zone, [])
            vm.preempted, vm.maintenance = False, "NONE"
            self._set_status(vm, "PROVISIONING")
        self._later(self.faults.insert_seconds, self._provision, [vm], op)
        return op

    # -- state machine ---------------------------------------------------------------
    def _notice_open(self, body: dict[str, Any], field: str) -> None:
        scheduling = body.get("scheduling") or {}
        if self.faults.refuse_notice and gce.notice_seconds(scheduling) > 0:
            raise gce.notice_refused(field, scheduling)

    def _exists(self, body: dict[str, Any], zone: str, field: str) -> None:
        """The image and machine type an insert names must exist (unknown ones are injected faults):
        Google answers 404 for a missing image and 400 for a machine type the zone does not have."""
        machine = body.get("machineType", "")
        if ("machineType", machine.rsplit("/", 1)[-1]) in self.faults.unknown:
            raise gce.unknown_machine_type(f"{field}.machineType", machine, zone)
        for disk in body.get("disks") or []:
            image = (disk.get("initializeParams") or {}).get("sourceImage") or ""
            if image and {("image", image), ("image", image.rsplit("/", 1)[-1])} & self.faults.unknown:
                raise gce.not_found(image.split("/compute/v1/")[-1])

    def _admit(self, project: str, zone: str, names: list[str], bulk: bool = False, model: str = "STANDARD") -> None:
        """Synchronous refusals: name taken, sync stockout (bulkInsert: ``insufficientCapacity``) or quota."""
        for name in names:
            if (project, zone, name) in self._vms:
                raise ApiError(409, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists",
                               "alreadyExists")
        if self._stocked(zone, model) == "sync" and model != "FLEX_START":
            raise gce.insufficient_capacity(project, zone) if bulk else gce.stockout(project, zone)
        if self._quota(zone) == "sync":
            raise gce.quota(gce.region_of(zone))

    def _quota(self, zone: str) -> str | None:
        """How a quota fault refuses a create in ``zone``: one set for any zone of its region
        (GPU and CPU quotas are the region's), "sync" or "operation"; None: within quota."""
        region = gce.region_of(zone)
        return self.faults.quota.get(zone) or next(
            (mode for z, mode in self.faults.quota.items() if gce.region_of(z) == region), None)

    def _create(self, project: str, zone: str, body: dict[str, Any]) -> Vm:
        vm = Vm(project, zone, gce.instance_resource(body, project, zone, self.urls))
        self._vms[(project, zone, vm.name)] = vm
        return vm

    def _provision(self, vms: list[Vm], op: dict[str, Any]) -> None:
        """The insert operation finishes: capacity is decided now (as on the real API)."""
        with self._lock:
            if self.faults.hold:
                self.faults.held.append((vms, op))
                return
            zone, model = vms[0].zone, _model(vms[0].resource)
            error, details = None, None
            if self._stocked(zone, model) and model == "FLEX_START" and op["operationType"] != "start":
                # Flex-start waits for capacity: the insert is accepted, the VM PENDING until
                # capacity frees up (``_capacity_freed``).
                for vm in vms:
                    self._set_status(vm, "PENDING")
                gce.finish(op)
                self._done.notify_all()
                return
            if self._stocked(zone, model) == "operation":
                error, code = gce.stockout(vms[0].project, zone), "ZONE_RESOURCE_POOL_EXHAUSTED"
            elif self._quota(zone) == "operation":
                error, code = gce.quota(gce.region_of(zone)), "QUOTA_EXCEEDED"
                details = gce.quota_details(gce.region_of(zone))
            if error is not None:
                for vm in vms:
                    if op["operationType"] != "start":
                        self._vms.pop((vm.project, vm.zone, vm.name), None)
                    else:
                        self._set_status(vm, "TERMINATED")
                gce.finish(op, error, code, details)
                self._done.notify_all()
                return
            for vm in vms:
                self._set_status(vm, "STAGING")
            gce.finish(op)
            self._done.notify_all()
        self._later(self.boot_delay, self._boot, vms)

    def _stocked(self, zone: str, model: str) -> str | None:
        """How ``zone`` refuses a VM of ``model`` for want of capacity (None: it does not)."""
        return self.faults.stockouts.get(zone) or (self.faults.spot_stockouts.get(zone) if model == "SPOT" else None)

    def _capacity_freed(self, zone: str) -> None:
        """Capacity came back to ``zone``: its PENDING Flex-start VMs boot."""
        with self._lock:
            waiting = [vm for vm in self._vms.values() if vm.zone == zone and vm.resource["status"] == "PENDING"
                       and not self._stocked(zone, _model(vm.resource))]
            for vm in waiting:
                self._set_status(vm, "STAGING")
        if waiting:
            self._later(self.boot_delay, self._boot, waiting)

    def _boot(self, vms: list[Vm]) -> None:
        for vm in vms:
            # One step under the lock: no one may see RUNNING without its process (a crash
            # injected in between would find nothing to kill).
            with self._lock:
                if self._vms.get((vm.project, vm.zone, vm.name)) is not vm or vm.resource["status"] != "STAGING":
                    continue
                self._set_status(vm, "RUNNING")
                vm.resource["lastStartTimestamp"] = gce.now()
                if self.run_vms:
                    self._start_process(vm)
                self._schedule_end(vm)

    def _schedule_end(self, vm: Vm) -> None:
        """What ends a RUNNING VM by itself: its zone's preemptions at ``preemption_day`` scale
        (Spot), or its ``maxRunDuration`` (Compute then deletes or stops it)."""
        scheduling, process = vm.resource["scheduling"], vm.process
        plan = self.faults.advice
        if scheduling.get("provisioningModel") == "SPOT" and self.preemption_day and (
                plan.preemption_rates.get(vm.zone, 0.0) > 0 or vm.zone in plan.uptimes):
            self._later(plan.uptime(vm.zone) * self.preemption_day / 86400, self._ends, vm, process, "preempted")
        if seconds := float((scheduling.get("maxRunDuration") or {}).get("seconds") or 0):
            self._later(seconds, self._ends, vm, process, "max run")

    def _ends(self, vm: Vm, process: VmProcess | None, why: str) -> None:
        with self._lock:
            if vm.process is not process or vm.resource["status"] != "RUNNING" \
                    or self._vms.get((vm.project, vm.zone, vm.name)) is not vm:
                return  # restarted, stopped or deleted since
            if why == "max run":
                # Google stops or deletes the VM as its termination action says, with no
                # documented operation type of its own: recorded as a stop.
                action = vm.resource["scheduling"].get("instanceTerminationAction", "STOP")
                self._record(vm, "stop")
                self._set_status(vm, "STOPPING")
                threading.Thread(target=self._stop_then, args=(vm, "DELETE" if action == "DELETE" else "TERMINATED"),
                                 kwargs={"halt": True}, daemon=True).start()
                return
        self.preempt(vm.name)

    def _start_process(self, vm: Vm) -> None:
        if vm.metadata is None:
            vm.metadata = MetadataServer(lambda: self._metadata_tree(vm))
        process = self._machine(self.workdir_of(vm.name), vm.metadata, lambda p: self._guest_powered_off(vm, p))
        vm.process = process
        process.start(vm.attribute("startup-script") or None)  # none: the VM runs, idle

    def _guest_powered_off(self, vm: Vm, process: VmProcess) -> None:
        """The guest ran ``poweroff`` (or ``shutdown``): Compute records a guest termination;
        the shutdown script runs, with no deadline from Compute (the guest's own shutdown)."""
        with self._lock:
            if vm.process is not process or vm.resource["status"] != "RUNNING":
                return
            self._guest_terminated(vm, budget=self.guest_shutdown_limit)

    def _guest_terminated(self, vm: Vm, budget: float, halt: bool = True) -> None:
        """``halt``: the guest halts as it powers itself off; a crashed one is off already."""
        with self._lock:
            self._record(vm, "compute.instances.guestTerminate")
            if vm.resource["status"] in ("TERMINATED", "STOPPED", "STOPPING"):
                return  # already on its way down (preempted, stopped): only the record is new
            self._set_status(vm, "STOPPING")
        threading.Thread(target=self._stop_then, args=(vm, "TERMINATED", None, budget, False), kwargs={"halt": halt},
                         daemon=True).start()

    def _stop_then(self, vm: Vm, outcome: str, op: dict[str, Any] | None = None, budget: float | None = None,
                   deadline: bool = True, not_before: float | None = None, halt: bool = False) -> None:
        """Power the VM off (shutdown script within ``budget``, Compute's deadline when ``deadline``),
        then, no earlier than ``not_before`` (``time.monotonic()``), the outcome: TERMINATED, or gone (DELETE).

        ``halt``: the guest halts first (``Realism.halt``), after its shutdown script (or the soft-off,
        when none ran): Compute reports the outcome only once the guest is off, and when Compute
        set a deadline, never past its hard-off (``shutdown_budget`` after the soft-off)."""
        soft_off = time.monotonic()
        budget = self.shutdown_budget if budget is None else budget
        self._power_off(vm, budget, notice=budget if deadline else None)
        if halt:
            off = time.monotonic() + self.realism.halt()
            if deadline:
                off = min(off, max(time.monotonic(), soft_off + self.shutdown_budget))
            not_before = max(off, not_before or off)
        if not_before is not None and self._closed.wait(max(0.0, not_before - time.monotonic())):
            return  # the server stopped meanwhile
        with self._lock:
            if outcome == "DELETE":
                self._vms.pop((vm.project, vm.zone, vm.name), None)
            else:
                self._set_status(vm, "TERMINATED")
                vm.resource["lastStopTimestamp"] = gce.now()
            if op is not None:
                gce.finish(op)
            self._done.notify_all()

    def _power_off(self, vm: Vm, budget: float, notice: float | None = None) -> None:
        """The guest off: its shutdown script (within ``budget``), then its metadata server. A second
        power-off while one is under way (a delete while the guest shuts itself down) waits for that
        one: the guest keeps its metadata server until it is off, as on Google."""
        with self._lock:
            process, vm.process = vm.process, None
            going = vm.off
            off = vm.off = (threading.Event(), process) if process is not None else None
        if process is None:
            # Within this power-off's own budget (a guest's own shutdown has no deadline; a delete
            # has one): past it, its hard-off, which ends the other's shutdown script too.
            if going is not None and not going[0].wait(timeout=budget):
                going[1].kill()
                going[0].wait(timeout=10)
            return
        assert off is not None
        try:
            process.stop(vm.attribute("shutdown-script"), budget, notice)
            with self._lock:
                self._processes.discard(process)
        finally:
            with self._lock:
                metadata, vm.metadata = vm.metadata, None
            if metadata is not None:
                metadata.stop()
            off[0].set()

    def _account_email(self, vm: Vm) -> str | None:
        """The instance's service account (None without one); "default" as the API resolves it, to the
        project's Compute Engine default account."""
        entries = vm.resource.get("serviceAccounts") or []
        if not entries:
            return None
        email = entries[0].get("email") or "default"
        return f"{project_number(vm.project)}-compute@developer.gserviceaccount.com" if email == "default" else email

    def _metadata_tree(self, vm: Vm) -> dict[str, Any]:
        """What the instance's metadata server serves (paths as on Google; see localcloud.metadata)."""
        with self._lock:
            r = vm.resource
            number = project_number(vm.project)
            attributes = {i["key"]: i.get("value", "") for i in r["metadata"]["items"]} | self._tpu_attributes(vm)
            if vm.tokens is None:
                vm.tokens = Tokens(str(r["id"]))
            accounts: dict[str, Any] = {}
            email = self._account_email(vm)
            for entry in (r.get("serviceAccounts") or [])[:1]:  # Compute allows one per instance
                account = service_account(email or "", list(entry.get("scopes") or []), str(r["id"]), vm.tokens)
                accounts = {"default": account, email: account}
            return {
                "instance": {
                    "attributes": attributes, "hostname": f"{r['name']}.{vm.zone}.c.{vm.project}.internal",
                    "id": int(r["id"]), "machine-type": f"projects/{number}/machineTypes/"
                                                         f"{r['machineType'].rsplit('/', 1)[-1]}",
                    "maintenance-event": vm.maintenance, "name": r["name"],
                    "network-interfaces": {"0": {"ip": vm.ip}},
                    "preempted": "TRUE" if vm.preempted else "FALSE",
                    "service-accounts": accounts, "zone": f"projects/{number}/zones/{vm.zone}",
                },
                "project": {"numeric-project-id": number, "project-id": vm.project},
            }

    # -- realism: latency and bulkInsert limits ------------------------------------------
    def _delay(self, method: str | None) -> None:
        """The call's latency, slept in this request's own thread (others overlap it, as on Google)."""
        seconds = self.realism.compute_delay(method) if method else self.realism.compute_latency
        if seconds > 0:
            time.sleep(self.realism.draw(seconds))

    def _rate_quota(self, project: str, method: str) -> None:
        """Compute's per-minute rate quota of the method's group (``realism.quota_group``), per
        project and synchronized minute: beyond it, 403 rateLimitExceeded (a refused request is
        not counted against the minute; the same rule as bench/fakes.py's)."""
        limit = self.realism.rate_quota_per_minute
        if limit is None:
            return
        key, minute = (project, quota_group(method)), int(time.monotonic() // 60)
        with self._lock:
            window, used = self._rate_windows.get(key, (minute, 0))
            used = used if window == minute else 0
            self._rate_windows[key] = (minute, min(used + 1, limit))
            self.rate_refusals += used >= limit
        if used >= limit:
            raise gce.rate_limited(project)

    def _bulk_rate(self, project: str) -> None:
        """At most ``bulk_requests_per_second`` bulkInsert calls per project in any one second
        (a sliding window; refused calls do not count). See ``gce.rate_limited`` for the shape."""
        limit = self.realism.bulk_requests_per_second
        if limit is None:
            return
        with self._lock:
            now, calls = time.monotonic(), self._bulk_calls[project]
            while calls and now - calls[0] >= 1.0:
                calls.popleft()
            if len(calls) >= limit:
                raise gce.rate_limited(project)
            calls.append(now)

    def _bulk_in_flight(self, project: str, region: str) -> None:
        """At most ``bulk_operations_in_flight`` bulkInsert operations RUNNING per project (held ones
        included). See ``gce.concurrent_operations`` for the shape. Called under the lock."""
        running = self._bulk_running[project] = [op for op in self._bulk_running[project] if op["status"] != "DONE"]
        limit = self.realism.bulk_operations_in_flight
        if limit is not None and len(running) >= limit:
            raise gce.concurrent_operations(project, region, "bulkInsert")

    # -- helpers ------------------------------------------------------------------------
    def _set_status(self, vm: Vm, status: str) -> None:
        vm.resource["status"] = status
        if vm.metadata:
            vm.metadata.changed()

    def _set_items(self, vm: Vm, items: list[dict[str, str]]) -> None:
        vm.resource["metadata"] = gce.metadata(items)
        if vm.metadata:
            vm.metadata.changed()

    def _finish_op(self, op: dict[str, Any]) -> None:
        with self._lock:
            gce.finish(op)
            self._done.notify_all()

    def _record(self, vm: Vm, kind: str) -> dict[str, Any]:
        """A system event (preemption, guest termination) as the zone operation Google logs, named
        ``systemevent-...`` as Google names those, and (``SYSTEM_EVENTS``) its System Event audit
        entry, given to ``audit_log`` with that operation's name as its ``operation.id``."""
        op = self._zone_op(vm.project, vm.zone, kind, vm)
        if kind in SYSTEM_EVENTS:
            scope = self.urls.zone(vm.project, vm.zone)
            del self._ops[(scope, op["name"])]
            op["name"] = system_event_operation()
            op["selfLink"] = f"{scope}/operations/{op['name']}"
            self._ops[(scope, op["name"])] = op
        gce.finish(op)
        op["user"] = "system"
        if vm.metadata:
            vm.metadata.changed()
        hook = self.audit_log
        if hook is not None and kind in SYSTEM_EVENTS:
            entry = system_event(vm.project, vm.zone, vm.name, str(vm.resource["id"]), kind, operation=op["name"])
            try:
                hook([entry])
            except Exception:  # noqa: BLE001 - Logging's trouble is not Compute's: the VM's fate stands
                log.exception("the System Event audit entry of %s could not be written", vm.name)
        return op

    def _zone_op(self, project: str, zone: str, kind: str, vm: Vm) -> dict[str, Any]:
        scope = self.urls.zone(project, zone)
        op = gce.operation(kind, scope, "zone", vm.resource["selfLink"], vm.resource["id"], USER)
        op.update(status="RUNNING", startTime=gce.now())
        self._ops[(scope, op["name"])] = op
        return op

    def _replay(self, project: str, request_id: str | None) -> dict[str, Any] | None:
        if not gce.valid_request_id(request_id):
            raise gce.invalid("requestId", request_id, "The request id must be a valid UUID.")
        return self._requests.get((project, request_id)) if request_id else None

    def _remember(self, project: str, request_id: str | None, op: dict[str, Any]) -> None:
        if request_id:
            self._requests[(project, request_id)] = op

    def _zone(self, zone: str) -> str:
        if zone not in self.zones:
            raise gce.not_found(f"zones/{zone}")
        return zone

    def _vm(self, project: str, zone: str, name: str) -> Vm:
        self._zone(zone)
        vm = self._vms.get((project, zone, name))
        if vm is None:
            raise gce.not_found(f"projects/{project}/zones/{zone}/instances/{name}")
        return vm

    def _find(self, name: str) -> Vm:
        with self._lock:
            for (_, _, n), vm in self._vms.items():
                if n == name:
                    return vm
        raise KeyError(name)

    def _op(self, scope: str, name: str) -> dict[str, Any]:
        op = self._ops.get((scope, name))
        if op is None:
            raise gce.not_found(f"{scope.split('/compute/v1/')[-1]}/operations/{name}")
        return op



def _relinked(answer: Any, v1: str, beta: str) -> Any:
    """An answer with every link into the v1 API pointing into the beta one instead."""
    if isinstance(answer, dict):
        return {k: _relinked(v, v1, beta) for k, v in answer.items()}
    if isinstance(answer, list):
        return [_relinked(v, v1, beta) for v in answer]
    return answer.replace(v1, beta) if isinstance(answer, str) and answer.startswith(v1) else answer


def _switch(lock: threading.RLock, faults: dict[str, str], zone: str, mode: str | None) -> None:
    """Turn a per-zone fault on (with its mode) or off."""
    with lock:
        if mode is None:
            faults.pop(zone, None)
        else:
            faults[zone] = mode


def _model(body: dict[str, Any]) -> str:
    """An instance's (or a request's) provisioning model as Compute reads it."""
    scheduling = body.get("scheduling") or {}
    return scheduling.get("provisioningModel") or ("SPOT" if scheduling.get("preemptible") else "STANDARD")


def _hostname(per_instance: dict[str, Any] | None) -> dict[str, Any]:
    hostname = (per_instance or {}).get("hostname")
    return {"hostname": hostname} if hostname else {}


_json = json_response

