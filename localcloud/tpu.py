"""A local Cloud TPU (v2) REST server: TPU VM nodes whose workers are real processes.

Routes and request schemas come from Google's ``tpu.v2`` discovery document (routed by
``flatPath``); answers are the API's: nodes (``projects/{p}/locations/{zone}/nodes/{id}``)
move CREATING -> READY (health HEALTHY) and DELETING -> gone; long-running operations are
``google.longrunning.Operation`` with ``google.cloud.tpu.v2.OperationMetadata``, ``done``
and then ``response`` (the Node, or ``google.protobuf.Empty`` for a delete) or ``error``
(``google.rpc.Status``); HTTP errors are one-platform JSON (``localcloud.tpu_api``). What
is served: nodes create / get / list / delete, operations get / list / delete / cancel
(cancel only records ``cancelRequested``), queuedResources create / get / list / delete
(``force``), locations get / list and acceleratorTypes get / list; any other method of
the document answers 501. Enums are names, or numbers when the caller asks
(``$alt=json;enum-encoding=int``, as the google-cloud-tpu REST client does).

Workers: a READY node has one worker per TPU VM of its slice (``tpu_api.FAMILIES``: v4-8
one, v4-32 four, v5litepod-16 four). Each is a ``localcloud.vm.VmProcess`` running the
node's ``startup-script`` metadata under its own ``localcloud.metadata.MetadataServer``,
which serves what a TPU VM's does: ``instance/attributes/`` = the node's metadata plus
``accelerator-type``, ``agent-worker-number``, ``worker-network-endpoints``
(``unknown:unknown:<ip>`` per worker, comma-separated, worker 0 first, the format JAX's
``GceTpuCluster`` splits) and ``tpu-env`` (``NODE_ID: '<node id>'``, ``WORKER_ID``,
``ACCELERATOR_TYPE``, ``ZONE``...). ``instance/name`` is the VM's own name,
``t1v-n-<hash>-w-<worker>`` as on Google, not the node's: the node id is in ``tpu-env``.
``instance/preempted``, ``maintenance-event``, ``scheduling/``, service-account tokens
are as for Compute VMs.

Decisions where Google's behaviour is not written down, kept simple:

- a worker that powers itself off (``poweroff`` in its script) runs its shutdown script
  and is gone; Google does not restart it, the slice is broken, and the node's health
  turns TIMEOUT (its state stays READY, as the TPU service sees the VM unresponsive);
- preemption (Spot or preemptible nodes only): every worker sees ``preempted`` TRUE and
  runs its shutdown script within ``shutdown_budget`` (in parallel), then every process
  is killed and the node is PREEMPTED; it stays listed until deleted (Spot TPUs cannot be
  restarted). Host maintenance: health UNHEALTHY_MAINTENANCE and ``maintenance-event``
  TERMINATE_ON_HOST_MAINTENANCE, shutdown scripts, then TERMINATED, or, ``recovered``,
  the workers boot again on new hosts (the startup script runs again) and health is
  HEALTHY again;
- stockout is decided when a create operation finishes (the node is listed CREATING
  until then, then gone); quota is refused synchronously (HTTP 429) or, when asked, on
  the operation (code 8);
- a queued resource waits in WAITING_FOR_RESOURCES while its zone is stocked out (or
  operations are held), then PROVISIONING (capacity is granted at that moment), ACTIVE
  once its nodes are READY; SUSPENDED when its node is preempted, terminated or deleted.
  Deleting it while it has nodes needs ``force`` (400 FAILED_PRECONDITION without);
  ``force`` deletes the nodes first.

System Event audit entries: a preemption writes ``compute.instances.preempted``, a terminating
maintenance ``compute.instances.terminateOnHostMaintenance``, one entry per worker, and a worker
that powers itself off ``compute.instances.guestTerminate`` for that worker, as Compute
Engine logs the TPU VMs under a node (``gce_instance``, ``resourceName``
``projects/P/zones/Z/instances/t1v-n-<hash>-w-<i>``, the worker's own name and id: the node's name
is not in it), handed to ``audit_log`` (the stack points it at the local Cloud Logging server).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, request

from localcloud import discovery, fields
from localcloud import tpu_api as api
from localcloud.compute import ZONES as COMPUTE_ZONES
from localcloud.metadata import project_number
from localcloud.host import Host, json_response
from localcloud.http import Served
from localcloud.logging import system_event
from localcloud.metadata import MetadataServer, Tokens, service_account
from localcloud.realism import Realism
from localcloud.tpu_api import TpuError
from localcloud.vm import VmProcess

DOC = "tpu.v2"
SUPPORTED = {
    "projects.locations": ("get", "list"),
    "projects.locations.acceleratorTypes": ("get", "list"),
    "projects.locations.nodes": ("create", "get", "list", "delete"),
    "projects.locations.operations": ("get", "list", "delete", "cancel"),
    "projects.locations.queuedResources": ("create", "get", "list", "delete"),
}
# Compute's zones plus zones that offer TPUs (cloud.google.com/tpu/docs/regions-zones).
ZONES = tuple(dict.fromkeys(COMPUTE_ZONES + ("us-central2-b", "us-east1-d", "us-east5-a", "us-east5-b",
                                             "us-east5-c", "us-south1-a", "us-west1-c", "us-west4-a",
                                             "asia-northeast1-b", "asia-southeast1-b")))
QUICK = 0.05  # seconds a create runs before capacity is decided, when nothing asks for longer
GUEST_SHUTDOWN_LIMIT = 300.0  # a worker's own power-off: Google sets no deadline (a bound, here)
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
GONE = ("DELETING", "PREEMPTED", "TERMINATED")


@dataclass
class Worker:
    number: int
    ip: str
    id: str
    host: str  # the VM's own name: t1v-n-<hash>-w-<number>
    process: VmProcess | None = None
    metadata: MetadataServer | None = None
    tokens: Tokens | None = None


@dataclass
class Node:
    project: str
    zone: str
    node_id: str
    resource: dict[str, Any]
    accelerator: api.Accelerator
    workers: list[Worker]
    preempted: bool = False
    maintenance: str = "NONE"
    op: dict[str, Any] | None = None  # its create operation, until it is done
    deletes: list[dict[str, Any]] = field(default_factory=list)  # delete operations waiting for it to go
    queued: str | None = None  # the queued resource that made it

    @property
    def name(self) -> str:
        return self.resource["name"]

    @property
    def state(self) -> str:
        return self.resource["state"]

    @property
    def spot(self) -> bool:
        scheduling = self.resource.get("schedulingConfig") or {}
        return bool(scheduling.get("spot") or scheduling.get("preemptible"))

    def attribute(self, key: str) -> str | None:
        return (self.resource.get("metadata") or {}).get(key)


@dataclass
class Queued:
    project: str
    zone: str
    resource: dict[str, Any]
    specs: list[tuple[str, dict[str, Any], api.Accelerator]]  # (node id, node body, accelerator)
    nodes: list[str] = field(default_factory=list)  # the node names it made

    @property
    def name(self) -> str:
        return self.resource["name"]

    @property
    def state(self) -> str:
        return self.resource["state"]["state"]


@dataclass
class Faults:
    stockouts: set[str] = field(default_factory=set)
    quota: dict[str, str] = field(default_factory=dict)  # zone -> "sync" | "operation"
    # "nodes.create" -> [(503, message, reason)]
    failures: dict[str, list[tuple[int, str, str]]] = field(default_factory=lambda: defaultdict(list))
    hold: bool = False
    held: list[tuple[Node, dict[str, Any] | None, bool]] = field(default_factory=list)  # _provision's arguments


class TpuServer(Host):
    def __init__(self, *, vm_env: dict[str, str] | None = None, workdir: Path | None = None,
                 boot_delay: float = 0.3, shutdown_budget: float = 30.0, realism: Realism | None = None) -> None:
        """``boot_delay``: seconds from capacity granted to READY (the workers boot);
        ``shutdown_budget``: the shutdown script's time on preemption, maintenance and delete
        (Google: 30 s for Spot VMs); ``realism``: latency per call and how long creates take."""
        super().__init__(vm_env, workdir, "localcloud-tpus-")
        self.boot_delay = boot_delay
        self.shutdown_budget = shutdown_budget
        self.realism = realism or Realism()
        self.zones = ZONES
        self.faults = Faults()
        # Where System Event audit entries go (a LoggingServer's ``write``, set by the stack); None: nowhere.
        self.audit_log: Callable[[list[dict[str, Any]]], None] | None = None
        self._nodes: dict[str, Node] = {}  # full name -> node
        self._queued: dict[str, Queued] = {}  # full name -> queued resource
        self._ops: dict[str, dict[str, Any]] = {}  # full name -> operation
        self._requests: dict[tuple[str, str], dict[str, Any]] = {}  # (project, requestId) -> operation
        self._serial = 0  # nodes made so far: each gets its own loopback /24
        self._routes = discovery.served(DOC, SUPPORTED)

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> TpuServer:
        self._served = Served(self._app(), "tpu", threads=64)
        return self

    def _power_off_machines(self) -> None:
        with self._lock:
            workers = [w for node in self._nodes.values() for w in node.workers]
        for worker in workers:
            self._power_off(None, worker, budget=0)

    # -- faults ------------------------------------------------------------------------
    def stockout(self, zone: str, on: bool = True) -> None:
        """No capacity in ``zone``: creates fail on their operation (code 8); queued resources wait."""
        with self._lock:
            (self.faults.stockouts.add if on else self.faults.stockouts.discard)(zone)
        if not on:
            self._advance_queue()

    def quota(self, zone: str, on: bool = True, mode: str = "sync") -> None:
        """Over quota in ``zone``: creates are refused with HTTP 429 (``mode="sync"``, what Google
        does), or their operation fails with code 8 (``mode="operation"``)."""
        if mode not in ("sync", "operation"):
            raise ValueError(f"quota mode is 'sync' or 'operation', not {mode!r}")
        with self._lock:
            if on:
                self.faults.quota[zone] = mode
            else:
                self.faults.quota.pop(zone, None)

    def fail_next(self, method: str, code: int = 503, times: int = 1, reason: str = "backendError",
                  message: str = "The service is currently unavailable.") -> None:
        """The next ``times`` calls of e.g. ``nodes.create`` answer HTTP ``code`` (its google.rpc
        status), with ``reason`` in a ``google.rpc.ErrorInfo`` detail."""
        short = {f"{r.rsplit('.', 1)[-1]}.{m}" for r, names in discovery.every(DOC).items() for m in names}
        if method not in short:
            raise ValueError(f"no method {method!r} in the Cloud TPU API (e.g. 'nodes.create')")
        with self._lock:
            self.faults.failures[method].extend([(int(code), message, reason)] * int(times))

    def hold_operations(self, on: bool = True) -> None:
        """While on, creates stay CREATING (their operations not done) and queued resources
        wait; turning it off lets them go on, with the zones' faults as they are then."""
        with self._lock:
            self.faults.hold = on
            held: list[tuple[Node, dict[str, Any] | None, bool]] = []
            if not on:
                held, self.faults.held = self.faults.held, []
        for node, op, decide in held:
            self._provision(node, op, decide)
        if not on:
            self._advance_queue()

    def preempt(self, name: str, graceful: bool = True) -> None:
        """Reclaim a Spot (or preemptible) node: ``preempted`` TRUE on every worker, their
        shutdown scripts within ``shutdown_budget`` (none when not ``graceful``: the guest
        never got to it), every process killed, then PREEMPTED."""
        node = self._find(name)
        with self._lock:
            if not node.spot:
                raise ValueError(f"node {name} is neither Spot nor preemptible: Google does not preempt it")
            if node.state in GONE + ("CREATING",):
                raise ValueError(f"node {name} is {node.state}")
            node.preempted = True
        self._changed(node)
        self._audit(node, "compute.instances.preempted")
        budget = self.shutdown_budget if graceful else 0.0
        threading.Thread(target=self._reclaim, args=(node, "PREEMPTED", budget), daemon=True).start()

    def maintenance(self, name: str, outcome: str = "terminated") -> None:
        """Host maintenance: health UNHEALTHY_MAINTENANCE, ``maintenance-event``
        TERMINATE_ON_HOST_MAINTENANCE, the shutdown scripts within ``shutdown_budget``, every
        process killed; then TERMINATED (``"terminated"``), or (``"recovered"``) the workers
        boot again on other hosts (startup script anew) and the node is HEALTHY."""
        if outcome not in ("terminated", "recovered"):
            raise ValueError(f"outcome is 'terminated' or 'recovered', not {outcome!r}")
        node = self._find(name)
        with self._lock:
            if node.state in GONE + ("CREATING",):
                raise ValueError(f"node {name} is {node.state}")
            node.maintenance = "TERMINATE_ON_HOST_MAINTENANCE"
            node.resource["health"] = "UNHEALTHY_MAINTENANCE"
        self._changed(node)
        if outcome == "terminated":
            self._audit(node, "compute.instances.terminateOnHostMaintenance")
        target = self._reclaim if outcome == "terminated" else self._reschedule
        args = (node, "TERMINATED", self.shutdown_budget) if outcome == "terminated" else (node,)
        threading.Thread(target=target, args=args, daemon=True).start()

    def _audit(self, node: Node, method: str, workers: list[Worker] | None = None) -> None:
        """The System Event audit entries of ``method`` on ``node``: one per worker VM (``workers``: those
        only), as Compute logs them."""
        hook = self.audit_log
        if hook is None:
            return
        entries = [system_event(node.project, node.zone, worker.host, worker.id, method)
                   for worker in (node.workers if workers is None else workers)]
        try:
            hook(entries)
        except Exception:  # noqa: BLE001 - Logging's trouble is not the TPU service's
            logging.getLogger(__name__).exception("the System Event audit entries of %s could not be written",
                                                  node.name)

    def set_health(self, name: str, health: str) -> None:
        """Any health string at all (TIMEOUT, UNHEALTHY_TENSORFLOW, one Google adds later)."""
        with self._lock:
            self._find(name).resource["health"] = str(health)

    def set_state(self, name: str, state: str) -> None:
        """Any state string at all (REPAIRING, HIDDEN, one Google adds later); workers are untouched."""
        with self._lock:
            self._find(name).resource["state"] = str(state)

    def upcoming_maintenance(self, name: str, on: bool = True) -> None:
        """Scheduled maintenance announced for the node (``Node.upcomingMaintenance``, and the
        workers' ``instance/upcoming-maintenance``), or withdrawn."""
        node = self._find(name)
        with self._lock:
            if on:
                node.resource["upcomingMaintenance"] = {
                    "type": "SCHEDULED", "canReschedule": False, "maintenanceStatus": "PENDING",
                    "windowStartTime": api.later(3600), "windowEndTime": api.later(3 * 3600),
                    "latestWindowStartTime": api.later(3600)}
            else:
                node.resource.pop("upcomingMaintenance", None)
        self._changed(node)

    # -- inspection -------------------------------------------------------------------------
    def node(self, name: str) -> dict[str, Any]:
        """A node by its id (``"my-tpu"``) or full name."""
        with self._lock:
            return _copy(self._find(name).resource)

    def nodes(self) -> list[dict[str, Any]]:
        with self._lock:
            return [_copy(n.resource) for n in self._nodes.values()]

    def token_account(self, token: str) -> str | None:
        """The service account an access token of one of the workers' metadata servers stands for
        (None: none issued it, or it expired); see ComputeServer.token_account."""
        with self._lock:
            found = [(n, w) for n in self._nodes.values() for w in n.workers if w.tokens is not None]
            for node, worker in found:
                if worker.tokens.valid(token):  # type: ignore[union-attr]
                    return str(node.resource["serviceAccount"]["email"])
        return None

    def names(self) -> set[str]:
        """The ids of every node there is now: a cheap look, for a caller that polls."""
        with self._lock:
            return {n.node_id for n in self._nodes.values()}

    def queued_resource(self, name: str) -> dict[str, Any]:
        """A queued resource by its id or full name."""
        with self._lock:
            for q in self._queued.values():
                if name in (q.name, q.name.rsplit("/", 1)[-1]):
                    return _copy(q.resource)
        raise KeyError(name)

    def workdir_of(self, name: str, worker: int = 0) -> Path:
        """The folder worker ``worker`` of node ``name`` (its id) runs in: its scripts, its serial log."""
        return self.workdir / name.rsplit("/", 1)[-1] / f"w-{worker}"

    def operations(self) -> list[dict[str, Any]]:
        with self._lock:
            return [_copy(op) for op in self._ops.values()]

    # -- HTTP ----------------------------------------------------------------------------------
    def _app(self) -> Flask:
        app = Flask("tpu")

        @app.route("/v2/<path:path>", methods=["GET", "POST", "DELETE", "PATCH", "PUT"])
        def v2(path: str) -> Response:
            try:
                return _json(self._dispatch(request.method, f"v2/{path}"))
            except TpuError as e:
                return _json(e.body(), e.code)

        self._fault_route(app, {
            "stockout": self.stockout, "quota": self.quota, "fail_next": self.fail_next, "preempt": self.preempt,
            "maintenance": self.maintenance, "set_health": self.set_health, "set_state": self.set_state,
            "upcoming_maintenance": self.upcoming_maintenance, "hold_operations": self.hold_operations,
        }, refused=(TypeError, ValueError, KeyError), inventory=self._inventory)  # KeyError: a node not there
        return app

    def _dispatch(self, verb: str, path: str) -> dict[str, Any]:
        found = discovery.route(self._routes, verb, path)
        if found is None:
            self._delay()
            raise TpuError(404, f"The requested URL /{path} was not found on this server.")
        method, match, supported = found
        name = f"{method.resource.rsplit('.', 1)[-1]}.{method.name}"
        self._delay()
        if not supported:
            raise TpuError(501, f"Method {name} is not implemented by the local Cloud TPU server.")
        with self._lock:
            if self.faults.failures.get(name):
                code, message, reason = self.faults.failures[name].pop(0)
                raise TpuError(code, message, [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                                                "reason": reason, "domain": "tpu.googleapis.com"}])
        numbers = "enum-encoding=int" in request.args.get("$alt", "")
        selection = None
        if (wanted := fields.requested(request.args, request.headers)) and method.response_schema:
            try:  # a partial response, refused as Google refuses a name its answer lacks (localcloud.fields)
                selection = fields.parse(wanted)
                fields.check(selection, method.response_schema, doc=DOC)
            except fields.FieldsError as e:
                raise TpuError(400, str(e)) from None
        body = None
        if method.request_schema:
            body = {} if not request.get_data() else request.get_json(silent=True)
            if not isinstance(body, dict):
                raise TpuError(400, "Invalid JSON payload received. Expected an object.")
            schema = api.descriptor(method.request_schema)
            body = api.enums(body, schema, numbers=False)  # a client may send enums by number
            at = re.sub(r"(?<!^)([A-Z])", r"_\1", method.request_schema).lower()  # Node -> node, as the field
            problems = discovery.validate(body, method.request_schema, at, doc=DOC)
            if problems:
                raise api.bad_request(problems[0], at)
        if "locationsId" in match.groupdict():
            self._zone(match["projectsId"], match["locationsId"])
        handler = getattr(self, f"_{method.resource.rsplit('.', 1)[-1]}_{method.name}")
        answer = handler(match.groupdict(), request.args, body)
        answer = api.enums(answer, api.descriptor(method.response_schema), numbers) if method.response_schema else answer
        return fields.select(answer, selection)

    def _delay(self) -> None:
        if self.realism.tpu_latency > 0:
            time.sleep(self.realism.tpu_latency)

    # -- locations and accelerator types ------------------------------------------------------
    def _locations_list(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        items = [self._location(p["projectsId"], z) for z in self.zones]
        found, token = api.page(items, q)
        return {"locations": found, **({"nextPageToken": token} if token else {})}

    def _locations_get(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        return self._location(p["projectsId"], p["locationsId"])

    def _location(self, project: str, zone: str) -> dict[str, Any]:
        return {"name": f"projects/{project}/locations/{zone}", "locationId": zone}

    def _acceleratorTypes_list(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        parent = f"projects/{p['projectsId']}/locations/{p['locationsId']}"
        items = [self._accelerator_type(parent, a) for a in api.all_accelerators()]
        found, token = api.page(items, q)
        return {"acceleratorTypes": found, **({"nextPageToken": token} if token else {})}

    def _acceleratorTypes_get(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        parent = f"projects/{p['projectsId']}/locations/{p['locationsId']}"
        found = api.accelerator(p["acceleratorTypesId"])
        if found is None:
            raise api.not_found(f"{parent}/acceleratorTypes/{p['acceleratorTypesId']}")
        return self._accelerator_type(parent, found)

    def _accelerator_type(self, parent: str, a: api.Accelerator) -> dict[str, Any]:
        return {"name": f"{parent}/acceleratorTypes/{a.name}", "type": a.name, "acceleratorConfigs": [a.config()]}

    # -- nodes ------------------------------------------------------------------------------------
    def _nodes_create(self, p: dict[str, str], q: Any, body: dict[str, Any]) -> dict[str, Any]:
        project, zone = p["projectsId"], p["locationsId"]
        with self._lock:
            node = self._new_node(project, zone, q.get("nodeId") or "", body, "node")
            op = self._operation(project, zone, "create", node.name)
            node.op = op
        self._later(self.realism.tpu_create_seconds or QUICK, self._provision, node, op)
        return op

    def _nodes_get(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            return _copy(self._node(p).resource)

    def _nodes_list(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        return self._listed(self._nodes, "nodes", p, q)

    def _nodes_delete(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            node = self._node(p)
            op = self._operation(node.project, node.zone, "delete", node.name)
            if node.state == "DELETING":  # already going: this operation is done when it is gone
                node.deletes.append(op)
                return op
            node.resource["state"] = "DELETING"
        threading.Thread(target=self._delete, args=([node], op), daemon=True).start()
        return op

    # -- operations ---------------------------------------------------------------------------------
    def _operations_get(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            return _copy(self._op(p))

    def _operations_list(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        if q.get("filter"):
            raise TpuError(400, "The local Cloud TPU server does not filter operations.")
        parent = f"projects/{p['projectsId']}/locations/{p['locationsId']}/operations/"
        with self._lock:
            items = [_copy(op) for name, op in self._ops.items() if name.startswith(parent)]
        found, token = api.page(items, q)
        return {"operations": found, **({"nextPageToken": token} if token else {})}

    def _operations_delete(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            del self._ops[self._op(p)["name"]]
        return {}

    def _operations_cancel(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            op = self._op(p)
            if not op.get("done"):
                op["metadata"]["cancelRequested"] = True
        return {}

    # -- queued resources ----------------------------------------------------------------------------
    def _queuedResources_create(self, p: dict[str, str], q: Any, body: dict[str, Any]) -> dict[str, Any]:
        project, zone = p["projectsId"], p["locationsId"]
        parent = f"projects/{project}/locations/{zone}"
        qr_id = q.get("queuedResourceId") or ""
        with self._lock:
            if replay := self._replay(project, q.get("requestId")):
                return replay
            if not api.NAME_RE.fullmatch(qr_id):
                raise api.bad_request(f"Invalid queued resource id '{qr_id}': it must be 1-63 lowercase letters, "
                                      "digits or hyphens, starting with a letter.", "queued_resource_id")
            if "bestEffort" in body:  # v2alpha1 only; the v2 schema check refused it already
                raise api.bad_request("bestEffort is not a v2 tier.", "queued_resource.best_effort")
            specs = self._specs(parent, body)
            name = f"{parent}/queuedResources/{qr_id}"
            if name in self._queued:
                raise api.already_exists(name)
            spot = "spot" in body
            for node_id, node_body, accelerator in specs:
                self._admit(project, zone, f"{parent}/nodes/{node_id}", accelerator, spot)
            resource = {k: v for k, v in _copy(body).items() if k not in ("name", "createTime", "state")}
            resource.update(name=name, createTime=api.now(),
                            state={"state": "WAITING_FOR_RESOURCES", "stateInitiator": "USER"})
            queued = Queued(project, zone, resource, specs)
            self._queued[name] = queued
            op = self._operation(project, zone, "create", name)
            self._remember(project, q.get("requestId"), op)
        self._later(QUICK, self._accepted, queued, op)
        return op

    def _queuedResources_get(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        with self._lock:
            return _copy(self._qr(p).resource)

    def _queuedResources_list(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        return self._listed(self._queued, "queuedResources", p, q)

    def _listed(self, table: dict[str, Node] | dict[str, Queued], kind: str, p: dict[str, str], q: Any) -> dict[str, Any]:
        """A page of the ``kind`` resources of one location, by name."""
        parent = f"projects/{p['projectsId']}/locations/{p['locationsId']}/{kind}/"
        with self._lock:
            items = [_copy(r.resource) for name, r in sorted(table.items()) if name.startswith(parent)]
        found, token = api.page(items, q)
        return {kind: found, **({"nextPageToken": token} if token else {})}

    def _queuedResources_delete(self, p: dict[str, str], q: Any, body: Any) -> dict[str, Any]:
        force = str(q.get("force", "")).lower() in ("true", "1")
        with self._lock:
            if replay := self._replay(p["projectsId"], q.get("requestId")):
                return replay
            queued = self._qr(p)
            nodes = [self._nodes[n] for n in queued.nodes if n in self._nodes]
            if nodes and not force:
                raise TpuError(400, f"Queued resource '{queued.name}' still has node(s) "
                                    f"{', '.join(n.node_id for n in nodes)}: delete them first, or delete it with force.",
                               status="FAILED_PRECONDITION")
            op = self._operation(queued.project, queued.zone, "delete", queued.name)
            self._remember(queued.project, q.get("requestId"), op)
            queued.resource["state"] = {"state": "DELETING", "stateInitiator": "USER"}
            for node in nodes:
                node.resource["state"] = "DELETING"
        threading.Thread(target=self._delete, args=(nodes, op, queued), daemon=True).start()
        return op

    def _specs(self, parent: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any], api.Accelerator]]:
        """The nodes a queued resource asks for: (id, body, accelerator) each, checked as a create's."""
        specs = ((body.get("tpu") or {}).get("nodeSpec")) or []
        if not specs:
            raise api.bad_request("A queued resource must request at least one node (tpu.node_spec).",
                                  "queued_resource.tpu.node_spec")
        out = []
        for i, spec in enumerate(specs):
            at = f"queued_resource.tpu.node_spec[{i}]"
            if spec.get("parent") != parent:
                raise api.bad_request(f"The node spec's parent must be '{parent}', not '{spec.get('parent', '')}'.",
                                      f"{at}.parent")
            node_body = spec.get("node") or {}
            multislice = spec.get("multisliceParams")
            ids = [f"{multislice.get('nodeIdPrefix', '')}-{k}" for k in range(int(multislice.get("nodeCount", 0)))] \
                if multislice else [spec.get("nodeId", "")]
            if not ids:
                raise api.bad_request("multislice_params.node_count must be positive.", f"{at}.multislice_params")
            for node_id in ids:
                self._check_id(node_id, f"{at}.node_id")
                out.append((node_id, node_body, self._check_node(node_body, parent.rsplit("/", 1)[-1], f"{at}.node")))
        if len({node_id for node_id, _, _ in out}) != len(out):
            raise api.bad_request("Node ids must be unique within a queued resource.", "queued_resource.tpu.node_spec")
        return out

    def _accepted(self, queued: Queued, op: dict[str, Any]) -> None:
        with self._lock:
            api.finish(op, _copy(queued.resource), "QueuedResource")
        self._advance_queue()

    def _advance_queue(self) -> None:
        """Every queued resource waiting in a zone that has capacity now is PROVISIONING: its
        capacity is granted, its nodes are created and boot."""
        starting: list[Node] = []
        with self._lock:
            if self.faults.hold:
                return
            for queued in self._queued.values():
                if queued.state != "WAITING_FOR_RESOURCES" or queued.zone in self.faults.stockouts:
                    continue
                taken = [f"{queued.name.split('/queuedResources/')[0]}/nodes/{node_id}" for node_id, _, _ in queued.specs]
                if any(name in self._nodes for name in taken):  # created directly while it waited
                    queued.resource["state"] = {"state": "FAILED", "stateInitiator": "SERVICE", "failedData": {
                        "error": {"code": 6, "message": f"Resource '{next(n for n in taken if n in self._nodes)}' "
                                                        "already exists"}}}
                    continue
                queued.resource["state"] = {"state": "PROVISIONING", "stateInitiator": "SERVICE"}
                for node_id, node_body, accelerator in queued.specs:
                    body = _copy(node_body)
                    if "spot" in queued.resource:
                        body["schedulingConfig"] = {**(body.get("schedulingConfig") or {}), "spot": True}
                    node = self._create(queued.project, queued.zone, node_id, body, accelerator)
                    node.queued = queued.name
                    node.resource["queuedResource"] = queued.name
                    queued.nodes.append(node.name)
                    starting.append(node)
        for node in starting:
            self._later(self.realism.tpu_create_seconds or QUICK, self._provision, node, None, False)

    # -- the node's life -------------------------------------------------------------------------------
    def _new_node(self, project: str, zone: str, node_id: str, body: dict[str, Any], at: str) -> Node:
        """A create's checks in Google's order (the request, then the name, then quota), then the node, CREATING."""
        self._check_id(node_id, "node_id")
        accelerator = self._check_node(body, zone, at)
        name = f"projects/{project}/locations/{zone}/nodes/{node_id}"
        self._admit(project, zone, name, accelerator, bool((body.get("schedulingConfig") or {}).get("spot")
                                                            or (body.get("schedulingConfig") or {}).get("preemptible")))
        return self._create(project, zone, node_id, body, accelerator)

    def _check_id(self, node_id: str, at: str) -> None:
        if not api.NAME_RE.fullmatch(node_id):
            raise api.bad_request(f"Invalid node id '{node_id}': it must be 1-63 lowercase letters, digits or "
                                  "hyphens, starting with a letter and not ending with a hyphen.", at)

    def _check_node(self, body: dict[str, Any], zone: str, at: str) -> api.Accelerator:
        name = body.get("acceleratorType") or ""
        found = api.accelerator(name) if name else (api.from_config(body["acceleratorConfig"])
                                                   if body.get("acceleratorConfig") else None)
        if found is None:
            if not name and body.get("acceleratorConfig"):
                config = body["acceleratorConfig"]
                name = f"{config.get('type', '')} {config.get('topology', '')}".strip()
            field_ = f"{at}.accelerator_type" if body.get("acceleratorType") or not body.get("acceleratorConfig") \
                else f"{at}.accelerator_config"
            raise api.bad_request(
                f'Cloud TPU received a bad request. The requested accelerator configuration for accelerator type, '
                f'"{name}", could not be found in the zonal accelerator configurations for "{zone}".; the '
                f"accelerator {name} was not found in zone {zone} {api.eid()}", field_)
        if body.get("acceleratorType") and body.get("acceleratorConfig") \
                and api.from_config(body["acceleratorConfig"]) != found:
            raise api.bad_request("accelerator_type and accelerator_config name different slices.",
                                  f"{at}.accelerator_config")
        if not str(body.get("runtimeVersion") or "").strip():
            raise api.bad_request(f'Cloud TPU received an invalid argument. The field "runtime_version" cannot be '
                                  f'"". {api.eid()}', f"{at}.runtime_version")
        return found

    def _admit(self, project: str, zone: str, name: str, accelerator: api.Accelerator, spot: bool) -> None:
        """Synchronous refusals: the name taken, the zone over quota."""
        if name in self._nodes:
            raise api.already_exists(name)
        if self.faults.quota.get(zone) == "sync":
            raise api.quota_error(accelerator, spot, project, zone)

    def _create(self, project: str, zone: str, node_id: str, body: dict[str, Any],
                accelerator: api.Accelerator) -> Node:
        name = f"projects/{project}/locations/{zone}/nodes/{node_id}"
        self._serial += 1
        net = f"127.{1 + (self._serial // 256) % 254}.{self._serial % 256}"
        number = project_number(project)
        resource = {k: v for k, v in _copy(body).items() if k in _NODE_INPUT}
        region = zone.rsplit("-", 1)[0]
        account = resource.get("serviceAccount") or {}
        resource.update(
            name=name, acceleratorType=accelerator.name, acceleratorConfig=accelerator.config(),
            state="CREATING", createTime=api.now(), id=_new_id(), apiVersion="V2", cidrBlock=f"{net}.0/24",
            networkConfig={"network": f"projects/{project}/global/networks/default",
                           "subnetwork": f"projects/{project}/regions/{region}/subnetworks/default",
                           **(resource.get("networkConfig") or {})},
            serviceAccount={"email": account.get("email") or f"{number}-compute@developer.gserviceaccount.com",
                            "scope": account.get("scope") or [CLOUD_PLATFORM]},
            schedulingConfig=resource.get("schedulingConfig") or {}, metadata=resource.get("metadata") or {},
        )
        external = bool(resource["networkConfig"].get("enableExternalIps"))
        workers = [Worker(i, f"{net}.{i + 1}", _new_id(), api.hostname(resource["id"], i))
                   for i in range(accelerator.workers)]
        resource["networkEndpoints"] = [{"ipAddress": w.ip, "port": 8470,
                                         **({"accessConfig": {"externalIp": w.ip}} if external else {})}
                                        for w in workers]
        node = Node(project, zone, node_id, resource, accelerator, workers)
        self._nodes[name] = node
        return node

    def _provision(self, node: Node, op: dict[str, Any] | None, decide: bool = True) -> None:
        """The create finishes: capacity is decided now, as on Google (a queued resource's
        nodes were granted theirs when it left the queue: ``decide`` False)."""
        with self._lock:
            if self._nodes.get(node.name) is not node or node.state != "CREATING":
                return  # deleted meanwhile: the delete finished the operation
            if self.faults.hold:
                self.faults.held.append((node, op, decide))
                return
            error = None
            if decide and node.zone in self.faults.stockouts:
                error = api.stockout_status(node.zone)
            elif decide and self.faults.quota.get(node.zone) == "operation":
                quota = api.quota_error(node.accelerator, node.spot, node.project, node.zone)
                error = {"code": api.RESOURCE_EXHAUSTED, "message": quota.message, "details": quota.details}
            if error is not None:
                del self._nodes[node.name]
                if op is not None:
                    api.finish(op, error=error)
                node.op = None
                return
        self._later(self.boot_delay, self._boot, node, op)

    def _boot(self, node: Node, op: dict[str, Any] | None) -> None:
        # One step under the lock: no one may see READY without the workers' processes.
        with self._lock:
            if self._closed.is_set() or self._nodes.get(node.name) is not node or node.state != "CREATING":
                return
            node.resource["state"] = "READY"
            node.resource["health"] = "HEALTHY"
            for worker in node.workers:
                self._start_worker(node, worker)
            if op is not None:
                api.finish(op, _copy(node.resource))
            node.op = None
            self._settle(node.queued)

    def _start_worker(self, node: Node, worker: Worker) -> None:
        if worker.metadata is None:
            worker.metadata = MetadataServer(lambda: self._metadata_tree(node, worker))
        process = self._machine(self.workdir_of(node.node_id, worker.number), worker.metadata,
                                lambda p: self._worker_powered_off(node, worker, p))
        worker.process = process
        process.start(node.attribute("startup-script") or None)

    def _worker_powered_off(self, node: Node, worker: Worker, process: VmProcess) -> None:
        """A worker's guest powered itself off: its shutdown script runs (no deadline from the
        TPU service), it is gone, and the slice with it: health TIMEOUT."""
        with self._lock:
            if worker.process is not process:
                return
        self._audit(node, "compute.instances.guestTerminate", [worker])
        self._power_off(node, worker, GUEST_SHUTDOWN_LIMIT, notice=None)
        with self._lock:
            if self._nodes.get(node.name) is node and node.state not in GONE:
                node.resource["health"] = "TIMEOUT"

    def _power_off(self, node: Node | None, worker: Worker, budget: float, notice: float | None = None) -> None:
        with self._lock:
            process, worker.process = worker.process, None
        if process is not None:
            process.stop(node.attribute("shutdown-script") if node else None, budget, notice)
            with self._lock:
                self._processes.discard(process)
        with self._lock:
            metadata, worker.metadata = worker.metadata, None
        if metadata is not None:
            metadata.stop()

    def _power_off_all(self, node: Node, budget: float) -> None:
        """Every worker at once, each with its shutdown script (the VMs go down side by side)."""
        threads = [threading.Thread(target=self._power_off, args=(node, w, budget, budget), daemon=True)
                   for w in node.workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _reclaim(self, node: Node, outcome: str, budget: float) -> None:
        """Preemption or terminating maintenance: the workers go down, then the node is ``outcome``."""
        self._power_off_all(node, budget)
        with self._lock:
            if self._nodes.get(node.name) is node and node.state != "DELETING":
                node.resource["state"] = outcome
                self._suspend(node.queued, "SERVICE")

    def _reschedule(self, node: Node) -> None:
        """Maintenance the node survives: its workers go down and boot again elsewhere."""
        self._power_off_all(node, self.shutdown_budget)
        if self._closed.wait(self.boot_delay):
            return
        with self._lock:
            if self._closed.is_set() or self._nodes.get(node.name) is not node or node.state in GONE:
                return
            node.maintenance = "NONE"
            node.resource["health"] = "HEALTHY"
            for worker in node.workers:
                self._start_worker(node, worker)

    def _delete(self, nodes: list[Node], op: dict[str, Any], queued: Queued | None = None) -> None:
        """Nodes (and then a queued resource) go: shutdown scripts within the budget, then gone."""
        threads = [threading.Thread(target=self._power_off_all, args=(n, self.shutdown_budget), daemon=True)
                   for n in nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with self._lock:
            for node in nodes:
                if self._nodes.get(node.name) is node:
                    del self._nodes[node.name]
                self.faults.held = [h for h in self.faults.held if h[0] is not node]
                if node.op is not None and not node.op.get("done"):
                    api.finish(node.op, error={"code": 10, "message": f"Node {node.name} was deleted while "
                                                                      "it was being created."})
                if queued is None:
                    self._suspend(node.queued, "USER")
                for waiting in node.deletes:
                    api.finish(waiting, kind="Empty")
            if queued is not None:
                self._queued.pop(queued.name, None)
            api.finish(op, kind="Empty")

    def _settle(self, queued_name: str | None) -> None:
        """A queued resource whose nodes are all READY is ACTIVE."""
        queued = self._queued.get(queued_name or "")
        if queued is None or queued.state != "PROVISIONING":
            return
        if all(n in self._nodes and self._nodes[n].state == "READY" for n in queued.nodes):
            queued.resource["state"] = {"state": "ACTIVE", "stateInitiator": "SERVICE"}

    def _suspend(self, queued_name: str | None, initiator: str) -> None:
        queued = self._queued.get(queued_name or "")
        if queued is not None and queued.state in ("ACTIVE", "PROVISIONING"):
            queued.resource["state"] = {"state": "SUSPENDED", "stateInitiator": initiator}

    def _metadata_tree(self, node: Node, worker: Worker) -> dict[str, Any]:
        """What a TPU VM's metadata server serves (paths as on Google; see localcloud.metadata)."""
        with self._lock:
            r = node.resource
            number = project_number(node.project)
            a = node.accelerator
            tpu_env = {"ACCELERATOR_TYPE": a.name, "CONSUMER_PROJECT_ID": node.project,
                       "CONSUMER_PROJECT_NUMBER": str(number), "NODE_ID": node.node_id,
                       "PREEMPTIBLE": "true" if node.spot else "false", "RUNTIME_VERSION": r.get("runtimeVersion", ""),
                       "SERVICE_NAME": "tpu.googleapis.com", "TOPOLOGY": a.topology, "TYPE": a.family.config_type,
                       "UID": r["id"], "WORKER_ID": str(worker.number), "ZONE": node.zone}
            attributes = {**(r.get("metadata") or {}),
                          "accelerator-type": a.name, "agent-worker-number": str(worker.number),
                          "worker-network-endpoints": api.worker_endpoints([w.ip for w in node.workers]),
                          "tpu-env": api.tpu_env_text(tpu_env)}
            if worker.tokens is None:
                worker.tokens = Tokens(worker.id)
            email, scopes = r["serviceAccount"]["email"], list(r["serviceAccount"]["scope"])
            account = service_account(email, scopes, worker.id, worker.tokens)
            instance: dict[str, Any] = {
                "attributes": attributes, "hostname": f"{worker.host}.{node.zone}.c.{node.project}.internal",
                "id": int(worker.id), "maintenance-event": node.maintenance, "name": worker.host,
                "network-interfaces": {"0": {"ip": worker.ip}},
                "preempted": "TRUE" if node.preempted else "FALSE",
                "scheduling": {"automatic-restart": "FALSE", "on-host-maintenance": "TERMINATE",
                               "preemptible": "TRUE" if node.spot else "FALSE"},
                "service-accounts": {"default": account, email: account},
                "zone": f"projects/{number}/zones/{node.zone}",
            }
            if a.machine_type:
                instance["machine-type"] = f"projects/{number}/machineTypes/{a.machine_type}"
            upcoming = r.get("upcomingMaintenance")
            if upcoming:  # as a Compute VM's metadata server writes it: one JSON value, snake_case keys
                instance["upcoming-maintenance"] = json.dumps(
                    {re.sub(r"(?<!^)([A-Z])", r"_\1", k).lower(): v for k, v in upcoming.items()})
            return {"instance": instance, "project": {"numeric-project-id": number, "project-id": node.project}}

    # -- helpers ------------------------------------------------------------------------------------
    def _changed(self, node: Node) -> None:
        """Wake the workers' long polls. Never under ``self._lock``: a long poll reads the tree
        (taking ``self._lock``) while it holds its metadata server's condition."""
        for worker in list(node.workers):
            metadata = worker.metadata
            if metadata is not None:
                metadata.changed()

    def _operation(self, project: str, zone: str, verb: str, target: str) -> dict[str, Any]:
        op = api.operation(f"projects/{project}/locations/{zone}", verb, target)
        self._ops[op["name"]] = op
        return op

    def _replay(self, project: str, request_id: str | None) -> dict[str, Any] | None:
        if not request_id:
            return None
        try:
            uuid.UUID(request_id)
        except ValueError:
            raise api.bad_request(f"Invalid request id '{request_id}': it must be a UUID.", "request_id") from None
        return self._requests.get((project, request_id))

    def _remember(self, project: str, request_id: str | None, op: dict[str, Any]) -> None:
        if request_id:
            self._requests[(project, request_id)] = op

    def _zone(self, project: str, zone: str) -> None:
        if zone not in self.zones:
            raise api.location_denied(project, zone)

    def _node(self, p: dict[str, str]) -> Node:
        name = f"projects/{p['projectsId']}/locations/{p['locationsId']}/nodes/{p['nodesId']}"
        node = self._nodes.get(name)
        if node is None:
            raise api.not_found(name)
        return node

    def _qr(self, p: dict[str, str]) -> Queued:
        name = f"projects/{p['projectsId']}/locations/{p['locationsId']}/queuedResources/{p['queuedResourcesId']}"
        queued = self._queued.get(name)
        if queued is None:
            raise api.not_found(name)
        return queued

    def _op(self, p: dict[str, str]) -> dict[str, Any]:
        name = f"projects/{p['projectsId']}/locations/{p['locationsId']}/operations/{p['operationsId']}"
        op = self._ops.get(name)
        if op is None:
            raise api.not_found(name)
        return op

    def _find(self, name: str) -> Node:
        with self._lock:
            for node in self._nodes.values():
                if name in (node.name, node.node_id):
                    return node
        raise KeyError(name)



# Node fields a create may set; the rest are the service's (output only, ignored on input as Google does).
_NODE_INPUT = ("description", "acceleratorType", "runtimeVersion", "networkConfig", "networkConfigs", "cidrBlock",
               "serviceAccount", "schedulingConfig", "labels", "metadata", "tags", "dataDisks",
               "shieldedInstanceConfig", "acceleratorConfig", "bootDiskConfig")
_ids = iter(range(int(time.time() * 1000) * 1000, 2**63))


def _new_id() -> str:
    return str(next(_ids))


def _copy(value: Any) -> Any:
    return json.loads(json.dumps(value))


_json = json_response
