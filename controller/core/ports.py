"""The two ports the core talks through, and the plain values that cross them.

Each has one real adapter (Google clients) and one in-memory fake with the same
semantics (``controller.adapters.memory``); a contract test runs against both.
Errors crossing a port are ``controller.core.errors`` types, never library exceptions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Protocol, Self

from controller.core import names
from controller.core.quotas import QuotaUse


@dataclass(frozen=True)
class BlobInfo:
    """An object as a listing shows it: enough to decide whether to read it."""

    bucket: str
    name: str
    generation: int
    updated: datetime
    size: int = 0
    # The object's custom metadata as the listing gave it (None: none). Whoever wrote the object
    # wrote it: a VM agent's heartbeat carries its record there (``world.Record.listed``).
    metadata: Mapping[str, str] | None = field(default=None, hash=False)


@dataclass(frozen=True)
class Blob:
    info: BlobInfo
    data: bytes


class BlobStore(Protocol):
    """Google Cloud Storage, reduced to what the controller needs.

    ``if_generation_match=0`` means "only if the object does not exist"; a failed
    precondition raises ``PreconditionFailed``; a missing object raises ``NotFound``.
    """

    def read(self, bucket: str, name: str, *, limit: int | None = None) -> Blob:
        """The object's bytes; ``TooLarge`` (without downloading) when over ``limit`` bytes."""
        ...

    def stat(self, bucket: str, name: str) -> BlobInfo:
        """The object's metadata only (generation, size): never its bytes."""
        ...

    def read_listed(self, info: BlobInfo) -> bytes:
        """The bytes of exactly the generation a listing gave, in one request (``read`` takes
        two: metadata, then bytes); ``NotFound`` once that generation is no longer the object's
        (replaced or deleted since). The caller judges ``info.size``: a generation never changes."""
        ...

    def list(self, bucket: str, prefix: str) -> list[BlobInfo]: ...

    def write(
        self, bucket: str, name: str, data: bytes, *, if_generation_match: int | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> BlobInfo:
        """``metadata``: the object's custom metadata (the controller writes none; a VM agent's
        heartbeat carries some, and a test writes it as the agent does)."""
        ...

    def delete(self, bucket: str, name: str, *, if_generation_match: int | None = None) -> None: ...


class _Lenient(StrEnum):
    """A string enum that reads a value it does not know as its UNKNOWN member."""

    @classmethod
    def of(cls, value: object) -> Self:
        """The value the API sent, or UNKNOWN for one this code does not know (added later)."""
        try:
            return cls(str(value))
        except ValueError:
            return cls["UNKNOWN"]


class InstanceStatus(_Lenient):
    """``Instance.status`` as the v1 discovery document lists it, plus UNKNOWN.

    Google adds values over time (PENDING and PENDING_STOP are recent), so anything the
    API sends that is not listed here reads as UNKNOWN: a VM in a state we cannot judge
    is left to settle, never taken for lost and never an exception.
    """

    DEPROVISIONING = "DEPROVISIONING"
    PENDING = "PENDING"  # Flex-start: waiting for capacity
    PENDING_STOP = "PENDING_STOP"  # graceful shutdown under way
    PROVISIONING = "PROVISIONING"
    REPAIRING = "REPAIRING"
    RUNNING = "RUNNING"
    STAGING = "STAGING"
    STOPPED = "STOPPED"
    STOPPING = "STOPPING"
    SUSPENDED = "SUSPENDED"
    SUSPENDING = "SUSPENDING"
    TERMINATED = "TERMINATED"
    UNKNOWN = "UNKNOWN"

    @property
    def alive(self) -> bool:
        """Booting or running: a VM that is, or is about to be, doing the job's work."""
        return self in _ALIVE

    @property
    def down(self) -> bool:
        """Stopped for good until someone starts it again: its work is lost."""
        return self in _DOWN

    @property
    def stopped(self) -> bool:
        """Down and billing no machine, only its disk (not SUSPENDED: its memory is kept, and billed)."""
        return self.down and self != InstanceStatus.SUSPENDED

    @property
    def settling(self) -> bool:
        """On its way somewhere (down, repaired, or a state we do not know): wait and look again."""
        return not self.alive and not self.down


_ALIVE = frozenset({InstanceStatus.PENDING, InstanceStatus.PROVISIONING, InstanceStatus.STAGING, InstanceStatus.RUNNING})
_DOWN = frozenset({InstanceStatus.TERMINATED, InstanceStatus.STOPPED, InstanceStatus.SUSPENDED})


class Labelled:
    """What the controller's labels say of a VM or TPU node: whose it is, and which attempt."""

    labels: Mapping[str, str]

    @property
    def managed(self) -> bool:
        return self.labels.get(names.MANAGED_LABEL) == "true"

    @property
    def job(self) -> str | None:
        return self.labels.get(names.JOB_LABEL)

    @property
    def attempt(self) -> int:
        value = self.labels.get(names.ATTEMPT_LABEL, "")
        return int(value) if value.isdigit() else 0


@dataclass(frozen=True)
class Instance(Labelled):
    """A managed instance as observed; job, attempt and node come from its labels.

    A TPU node is one too (``TpuNode.as_instance``): its state read as the VM status that
    means the same to the planner, with what only a TPU says beside it."""

    project: str
    zone: str
    name: str
    status: InstanceStatus
    labels: Mapping[str, str]
    created_at: datetime
    id: str = ""
    tpu: bool = False  # a TPU slice: created and deleted through a TPU gateway
    tpu_api: str = "tpu"  # which: "tpu" (the Cloud TPU API's node) or "compute" (Compute Engine's instance or MIG)
    health: NodeHealth | None = None  # a TPU node's health
    upcoming_maintenance: str | None = None  # a TPU node's scheduled maintenance, in words
    # Why it is down, when the resource says so itself (a TPU node's PREEMPTED or TERMINATED
    # state); None: Compute's operations are asked (StopReason).
    stop_reason: StopReason | None = None
    stopped_at: datetime | None = None  # when Compute recorded ``stop_reason`` (a Compute Engine slice's host)
    # A Compute Engine TPU slice's hosts, name -> Compute id (their logs are found by id).
    host_ids: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def maintenance(self) -> bool:
        """Under host maintenance that Google may yet reschedule it through (a TPU's health)."""
        return self.health == NodeHealth.UNHEALTHY_MAINTENANCE

    @property
    def hung(self) -> bool:
        """Up, but its TPU runtime does not answer (TIMEOUT) or is broken (UNHEALTHY_TENSORFLOW)."""
        return self.health in (NodeHealth.TIMEOUT, NodeHealth.UNHEALTHY_TENSORFLOW)


# A spec's provisioning model -> Compute's scheduling.provisioningModel.
PROVISIONING_MODELS: Mapping[str, str] = {"spot": "SPOT", "standard": "STANDARD", "flex-start": "FLEX_START"}


@dataclass(frozen=True)
class InstanceRequest:
    """Everything needed to insert one VM; the adapter maps it onto the Compute API."""

    project: str
    zone: str
    name: str
    machine_type: str
    provisioning: str  # "spot" | "standard" | "flex-start" (controller.core.spec.Provisioning)
    termination_action: str  # "stop" | "delete"
    boot_image: str
    boot_disk_gb: int
    boot_disk_type: str
    service_account: str
    scopes: tuple[str, ...]
    network: str
    subnetwork: str | None
    external_ip: bool
    labels: Mapping[str, str]
    metadata: Mapping[str, str]
    tags: tuple[str, ...] = ()
    accelerator_type: str | None = None
    accelerator_count: int = 0
    max_run_seconds: int | None = None  # Flex-start: Compute deletes the VM after this long
    # Spot only: seconds of warning through the metadata server before the soft-off
    # (scheduling.preemptionNoticeDuration: 0 or 120, a Preview field; 0 = none, not sent).
    preemption_notice_s: int = 0

    @property
    def spot(self) -> bool:
        return self.provisioning == "spot"


@dataclass(frozen=True)
class Shape:
    """What capacity advice is asked about: a job's VMs, in the zones of one region."""

    project: str
    region: str
    zones: tuple[str, ...]
    machine_type: str
    count: int
    model: str  # Compute's provisioning model: SPOT, STANDARD, FLEX_START
    # The GPUs attached to a machine type that has none built in (n1 + nvidia-tesla-v100):
    # capacity is the GPU's, not the bare machine type's, and two such shapes differ.
    accelerator_type: str | None = None
    accelerator_count: int = 0


@dataclass(frozen=True)
class ZoneAdvice:
    """Compute's advice for one zone; a score Google did not give is None."""

    obtainability: float | None = None  # 0..1: how likely an insert there gets the capacity now
    # Spot: Google's best-effort estimate of how long the majority of Spot VMs of the request run
    # there before preemption (``estimatedUptime``); not the zone's true mean lifetime.
    uptime_s: float | None = None
    # Spot, latest interval of ``capacityHistory``: of the Spot VMs that stopped running there,
    # the fraction 0..1 that were preempted (``preemptionRate``). Not a rate per day: 1.0 where
    # every Spot VM that stopped was preempted, however long they ran first.
    preemption_rate: float | None = None
    spot_price_h: float | None = None  # Spot: list price per VM-hour, latest day of history (priceHistory)


class CapacityAdvisor(Protocol):
    """Compute's capacity advice (``advice.capacity`` and ``advice.capacityHistory``)."""

    def advise(self, shape: Shape) -> dict[str, ZoneAdvice]:
        """Advice for each of ``shape.zones`` Google scored; raises a ``RespawnError`` when it cannot."""
        ...


class QuotaReader(Protocol):
    """Compute's regional quotas (``regions.get`` → ``Region.quotas``): what the CLI's estimate
    (and ``respawn doctor``) show; the controller never waits on them."""

    def region_quotas(self, project: str, region: str) -> dict[str, QuotaUse]:
        """Every quota of ``region`` by metric name (``NVIDIA_L4_GPUS``); raises a ``RespawnError``
        when it cannot be read."""
        ...


class StopReason(StrEnum):
    """Why a VM stopped, from Compute's own records (zone operations).

    Only CRASHED (the guest shut itself down: ``compute.instances.guestTerminate``) is
    the trainer's fault; every other cause is the platform's or a person's.
    """

    PREEMPTED = "preempted"  # compute.instances.preempted
    MAINTENANCE = "maintenance"  # compute.instances.terminateOnHostMaintenance
    HOST_ERROR = "host error"  # compute.instances.hostError
    CRASHED = "crashed"  # compute.instances.guestTerminate
    STOPPED = "stopped"  # a user or an admin: stop, suspend, delete
    REFUSED = "refused"  # the request itself failed for good (a TPU queued resource FAILED)
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Stopped:
    """Compute's record of why a VM stopped, and when: the start of the zone operation that says
    so (``compute.instances.preempted``...), where one does. A hard preemption leaves no marker:
    this time is the only one that says when the loss was, not when a pass saw it."""

    reason: StopReason = StopReason.UNKNOWN
    at: datetime | None = None


@dataclass(frozen=True)
class InstanceList:
    instances: list[Instance]
    unreachable: list[str] = field(default_factory=list)  # zones that did not answer
    # Projects whose list failed as a whole (403, 5xx after retries): nothing in them was
    # seen, and the error says why. The other projects' instances are still listed.
    failed_projects: dict[str, str] = field(default_factory=dict)


class ComputeGateway(Protocol):
    """Compute Engine, reduced to what the controller needs.

    Every call is synchronous: an adapter waits for the operation it started and
    raises ``CapacityError``/``QuotaError`` whether the error came back at once or on
    the finished operation.
    """

    def list_managed(self, projects: Sequence[str], job: str | None = None,
                     zones: Sequence[str] | None = None, shard: tuple[int, int] | None = None) -> InstanceList:
        """Instances carrying the controller's label, for every job or one; with ``zones``
        (one job's), only those zones are listed (zonal lists, much faster than an aggregated one).
        ``shard`` (index, K), for every job: only the VMs whose shard label (names.shard_label)
        selects that shard; a VM without the label is not listed."""
        ...

    def insert(self, requests: Sequence[InstanceRequest], request_id: str,
               wait: float | None = None) -> Mapping[str, str]:
        """Create one VM, or a gang in one zone all together. Existing names are success.

        ``wait``: seconds at most for the operation (None: the gateway's own limit); one still
        running then raises ``OperationPending``, and the same request id later reads its outcome.

        Returns the ids Compute gave the new instances (name -> id), as far as its answer names
        them: an insert's operation names its instance (``targetId``), also when the same request
        is sent again; a gang's ``bulkInsert`` operation names none, nor does an "already exists"
        answer (``{}``: those ids are learnt from listings).
        """
        ...

    def delete(self, project: str, zone: str, name: str) -> None:
        """Delete one VM; raises NotFound when it is already gone."""
        ...

    def release(self, project: str, zone: str, name: str, items: Mapping[str, str],
                wait: float | None = None) -> bool:
        """The go at the starting line: add ``items`` to the instance's metadata (merged into what
        is there, by ``instances.setMetadata`` on the fingerprint just read; a fingerprint race is
        read again and retried). A go once given is never changed: where ``respawn-go`` is there
        already nothing is written and the answer is False; True when written now. NotFound when
        the instance is gone. ``wait`` as for ``insert``."""
        ...

    def stopped(self, project: str, zone: str, name: str) -> Stopped:
        """Why a VM stopped or vanished, and when, from Compute's own records."""
        ...


# -- Cloud TPU ----------------------------------------------------------------------


class NodeState(_Lenient):
    """``Node.state`` as tpu.v2.json lists it (UNKNOWN is one of Google's own values too).

    As with ``InstanceStatus``, a value added after this code was written reads as UNKNOWN:
    a node in a state we cannot judge is left to settle, never taken for lost.
    """

    STATE_UNSPECIFIED = "STATE_UNSPECIFIED"
    CREATING = "CREATING"
    READY = "READY"
    RESTARTING = "RESTARTING"
    REIMAGING = "REIMAGING"
    DELETING = "DELETING"
    REPAIRING = "REPAIRING"
    STOPPED = "STOPPED"
    STOPPING = "STOPPING"
    STARTING = "STARTING"
    PREEMPTED = "PREEMPTED"  # Spot/preemptible: reclaimed; a Spot TPU cannot be restarted, only recreated
    TERMINATED = "TERMINATED"  # maintenance, or the end of a preemptible node's life
    HIDING = "HIDING"
    HIDDEN = "HIDDEN"
    UNHIDING = "UNHIDING"
    UNKNOWN = "UNKNOWN"


class NodeHealth(_Lenient):
    """``Node.health`` as tpu.v2.json lists it, plus UNKNOWN (Google omits it while unset)."""

    HEALTH_UNSPECIFIED = "HEALTH_UNSPECIFIED"
    HEALTHY = "HEALTHY"
    TIMEOUT = "TIMEOUT"
    UNHEALTHY_TENSORFLOW = "UNHEALTHY_TENSORFLOW"
    UNHEALTHY_MAINTENANCE = "UNHEALTHY_MAINTENANCE"
    UNKNOWN = "UNKNOWN"


class QueuedState(_Lenient):
    """``QueuedResourceState.state`` as tpu.v2.json lists it, plus UNKNOWN."""

    STATE_UNSPECIFIED = "STATE_UNSPECIFIED"
    CREATING = "CREATING"
    ACCEPTED = "ACCEPTED"
    PROVISIONING = "PROVISIONING"
    FAILED = "FAILED"  # never fulfilled (bad request, or its time constraint expired): it stays until deleted
    DELETING = "DELETING"
    ACTIVE = "ACTIVE"
    SUSPENDING = "SUSPENDING"  # its TPUs are being deleted (by the user or by the service)
    SUSPENDED = "SUSPENDED"  # its TPUs were deleted; never allocated again
    WAITING_FOR_RESOURCES = "WAITING_FOR_RESOURCES"
    UNKNOWN = "UNKNOWN"


# A queued resource not given its TPUs yet: received, accepted, or waiting for resources.
QUEUED_WAITING = frozenset({QueuedState.CREATING, QueuedState.ACCEPTED, QueuedState.WAITING_FOR_RESOURCES})

# What a queued resource whose node does not exist (yet, or any more) reads as, as a node:
# still on its way while the queue may yet give it; reclaimed once the service deleted its
# TPUs (SUSPENDED is never allocated again); TERMINATED when it failed for good; otherwise
# UNKNOWN, which is left to settle.
QUEUED_AS_NODE: Mapping[QueuedState, NodeState] = {
    QueuedState.CREATING: NodeState.CREATING,
    QueuedState.ACCEPTED: NodeState.CREATING,
    QueuedState.WAITING_FOR_RESOURCES: NodeState.CREATING,
    QueuedState.PROVISIONING: NodeState.CREATING,
    QueuedState.ACTIVE: NodeState.CREATING,  # fulfilled a moment before its node is listed
    QueuedState.SUSPENDING: NodeState.PREEMPTED,
    QueuedState.SUSPENDED: NodeState.PREEMPTED,
    QueuedState.FAILED: NodeState.TERMINATED,
    QueuedState.DELETING: NodeState.DELETING,
}


@dataclass(frozen=True)
class TpuNode(Labelled):
    """A managed TPU VM (one node: a slice of ``workers`` hosts) as observed, or the queued
    resource that is to create it (``queued`` set, state from ``QUEUED_AS_NODE``)."""

    project: str
    zone: str
    name: str  # the short node id
    state: NodeState
    health: NodeHealth
    labels: Mapping[str, str]
    created_at: datetime
    accelerator_type: str = ""
    spot: bool = False
    id: str = ""
    workers: int = 1  # len(networkEndpoints); 1 when the node does not say (still creating)
    # "SCHEDULED, starts 2026-11-24T10:00:00Z" (type, then window start; ", ONGOING" once it
    # is under way) while Node.upcomingMaintenance is set, else None.
    upcoming_maintenance: str | None = None
    # The state of the queued resource that owns this node, or that is waiting to create it;
    # None for a node created directly.
    queued: QueuedState | None = None
    # "tpu": a Cloud TPU API node. "compute": a TPU slice in Compute Engine, one instance (single
    # host) or a MIG of ``workers`` instances; its state is read from its instances' statuses
    # (``SLICE_STATE``) and a down host's cause from Compute's operations (``stop_reason``).
    api: str = "tpu"
    stop_reason: StopReason | None = None  # Compute's word on a down host of a Compute Engine slice
    # When Compute recorded it (``Stopped.at``): a hard preemption's loss is timed from there, as a VM's.
    stopped_at: datetime | None = None
    # A Compute Engine slice's hosts, name -> Compute id: their logs are a VM's, found by id.
    host_ids: Mapping[str, str] = field(default_factory=dict, hash=False)

    def as_instance(self) -> Instance:
        """The node as the planner judges instances: its state read as the VM status that means
        the same (``TPU_AS_STATUS``), a node under maintenance as REPAIRING (waited for, within
        ``policy.maintenance_timeout``), PREEMPTED or TERMINATED with their cause, and a queued
        resource still in Google's queue as PENDING (what a Flex-start VM waiting for capacity
        reads as: alive, and not billed yet)."""
        status = TPU_AS_STATUS.get(self.state, InstanceStatus.UNKNOWN)
        if self.queued in QUEUED_WAITING and self.state == NodeState.CREATING:
            status = InstanceStatus.PENDING
        if status == InstanceStatus.RUNNING and self.health == NodeHealth.UNHEALTHY_MAINTENANCE:
            status = InstanceStatus.REPAIRING
        # A queued resource that FAILED (a bad or expired request) never had a node: no
        # maintenance took it, and asking again at once would fail again.
        reason = StopReason.REFUSED if self.queued == QueuedState.FAILED else TPU_STOP_REASONS.get(self.state)
        return Instance(self.project, self.zone, self.name, status, self.labels, self.created_at, self.id, tpu=True,
                        tpu_api=self.api, health=self.health, upcoming_maintenance=self.upcoming_maintenance,
                        stop_reason=self.stop_reason or reason, stopped_at=self.stopped_at, host_ids=self.host_ids)


@dataclass(frozen=True)
class TpuList:
    nodes: list[TpuNode]
    unreachable: list[str] = field(default_factory=list)  # zones that did not answer
    failed_projects: dict[str, str] = field(default_factory=dict)  # project -> why (403...)
    # Zones the project may not use (403 on the location: not enabled, not allowed, or no such
    # zone): nothing of ours can be there, and nothing can be created there. zone -> why.
    denied: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TpuRequest:
    """Everything needed to create one TPU VM; the adapter maps it onto the TPU v2 API."""

    project: str
    zone: str
    name: str
    accelerator_type: str  # e.g. "v5litepod-8"
    runtime_version: str  # e.g. "v2-alpha-tpuv5-lite"
    spot: bool
    labels: Mapping[str, str]
    metadata: Mapping[str, str]  # startup-script, shutdown-script, respawn-*
    service_account: str  # "default": the project's default Compute account
    scopes: tuple[str, ...]
    network: str
    subnetwork: str | None
    external_ip: bool
    tags: tuple[str, ...] = ()
    # Create through queuedResources (the spot tier when spot, else guaranteed) under the
    # node's name: a stockout then waits in the queue instead of failing the create.
    queued: bool = False
    # "compute": a TPU slice in Compute Engine (``accelerator_type`` holds the TPU machine type,
    # e.g. tpu7x-standard-4t; ``runtime_version`` is unused): one instance when ``topology`` is
    # None, else a MIG of ``hosts`` instances under a workload policy naming the topology.
    api: str = "tpu"
    topology: str | None = None
    hosts: int = 1
    flex_start: bool = False  # Compute Engine only: FLEX_START, deleted after max_run_seconds
    max_run_seconds: int | None = None
    boot_image: str = ""  # Compute Engine only: the boot disk's image (family URL)
    boot_disk_gb: int = 100
    boot_disk_type: str = "pd-balanced"

    @property
    def provisioning(self) -> str:
        """The spec's model this request asks for (``InstanceRequest.provisioning``)."""
        return "flex-start" if self.flex_start else "spot" if self.spot else "standard"


class TpuGateway(Protocol):
    """Cloud TPU (v2 API), reduced to what the controller needs. Same error discipline as
    ``ComputeGateway``: ``controller.core.errors`` types only."""

    def list_nodes(self, projects: Sequence[str], zones: Sequence[str], job: str | None = None) -> TpuList:
        """Managed nodes (``names.MANAGED_LABEL`` = "true"; one job's with ``job``) in these
        zones of these projects, plus each managed queued resource whose node is not listed
        (not created yet, or deleted by the service) as a TpuNode with ``queued`` set and its
        state from ``QUEUED_AS_NODE`` (CREATING while the queue may still give it).

        TPU v2 has no aggregated list and no label filter: each zone is listed (side by side)
        and labels are filtered here. A zone that did not answer, or that the project may not
        use, is in ``unreachable``; a project that refused (403) is in ``failed_projects``; an
        invalid ``job`` name raises ``RequestError``.
        """
        ...

    def create(self, request: TpuRequest, request_id: str, wait: float | None = None) -> None:
        """Create one TPU VM (or its queued resource). An existing one is success, once it is no
        longer CREATING: an existing node still being created is waited for like an operation.

        Raises ``CapacityError`` (stockout; a queued create waits instead), ``QuotaError``,
        ``OperationPending`` (still running after ``wait`` seconds, None: the gateway's own
        limit; the same request later reads its outcome), ``RequestError`` (a bad request) or
        ``TransientError`` (after retries).
        """
        ...

    def delete(self, project: str, zone: str, name: str) -> None:
        """Delete the node, or its queued resource (force: with its node) when it has one;
        ``NotFound`` when neither exists. Does not wait for the operation. A queued resource
        named like the node that does not ask for it under the controller's label (queued
        resource ids are a namespace of their own) is someone else's: it is left alone."""
        ...


# A TPU node's state, read as the Compute status the planner knows: booting is alive, gone
# for good is down, anything else (a state added later included) is waited out.
TPU_AS_STATUS: Mapping[NodeState, InstanceStatus] = {
    NodeState.CREATING: InstanceStatus.PROVISIONING,
    NodeState.STARTING: InstanceStatus.STAGING,
    NodeState.READY: InstanceStatus.RUNNING,
    NodeState.RESTARTING: InstanceStatus.REPAIRING,
    NodeState.REIMAGING: InstanceStatus.REPAIRING,
    NodeState.REPAIRING: InstanceStatus.REPAIRING,
    NodeState.STOPPING: InstanceStatus.STOPPING,
    NodeState.STOPPED: InstanceStatus.STOPPED,
    NodeState.DELETING: InstanceStatus.DEPROVISIONING,
    NodeState.PREEMPTED: InstanceStatus.TERMINATED,  # a Spot TPU is never restarted: recreated
    NodeState.TERMINATED: InstanceStatus.TERMINATED,
}
# A Compute Engine slice's state from its hosts' statuses: the first rule a host meets decides, in
# this order (a slice with one host down is broken, whatever the others do). Fewer hosts listed than
# the slice has reads as CREATING (the MIG is still making them) unless one is down.
SLICE_STATE: tuple[tuple[frozenset[InstanceStatus], NodeState], ...] = (
    (frozenset({InstanceStatus.TERMINATED, InstanceStatus.STOPPED, InstanceStatus.SUSPENDED}), NodeState.TERMINATED),
    (frozenset({InstanceStatus.DEPROVISIONING}), NodeState.DELETING),
    (frozenset({InstanceStatus.STOPPING, InstanceStatus.PENDING_STOP, InstanceStatus.SUSPENDING}), NodeState.STOPPING),
    (frozenset({InstanceStatus.REPAIRING}), NodeState.REPAIRING),
    (frozenset({InstanceStatus.UNKNOWN}), NodeState.UNKNOWN),
    (frozenset({InstanceStatus.PENDING, InstanceStatus.PROVISIONING, InstanceStatus.STAGING}), NodeState.CREATING),
)


def slice_state(statuses: Sequence[InstanceStatus], hosts: int) -> NodeState:
    """The node state a Compute Engine slice of ``hosts`` reads as, from its listed hosts' statuses."""
    for among, state in SLICE_STATE:
        if any(s in among for s in statuses):
            return state
    return NodeState.READY if len(statuses) >= hosts else NodeState.CREATING


# What a down TPU node's own state says of why (Compute VMs: their zone operations).
TPU_STOP_REASONS: Mapping[NodeState, StopReason] = {
    NodeState.PREEMPTED: StopReason.PREEMPTED,
    NodeState.TERMINATED: StopReason.MAINTENANCE,
    NodeState.STOPPED: StopReason.STOPPED,
}


# -- notifications ------------------------------------------------------------------------


class Publisher(Protocol):
    """Pub/Sub publishing (google-cloud-pubsub), for job notifications."""

    def publish(self, topic: str, data: bytes, attributes: Mapping[str, str]) -> str:
        """Publish one message to ``topic`` (``projects/P/topics/T``); returns its message id; raises a RespawnError."""


class Webhook(Protocol):
    """A Slack-compatible incoming webhook (HTTP POST of a JSON body)."""

    def post(self, url: str, body: Mapping[str, object]) -> None:
        """POST ``body`` as JSON; raises a RespawnError (TransientError for 429/5xx/timeouts)."""
