"""Every name the controller derives: bucket keys, instance names, request ids.

One pure module so that two passes, or a pass and a crash-recovered pass, always
compute the same identity for the same thing.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass
from typing import NewType

JobName = NewType("JobName", str)

JOBS_PREFIX = "jobs/"
MARKERS_PREFIX = "preempted-jobs/"
# sweeps/<sweep>/sweep.json (the CLI's record of a sweep) and sweeps/<sweep>/slots/<k> (a trial's
# admission, created if absent by the controller alone: controller.core.sweep).
SWEEPS_PREFIX = "sweeps/"
SPEC = "spec.yaml"
CANCEL = "cancel"
STATUS = "status.json"
EXIT = "exit"
HEARTBEAT = "heartbeat"
NOTICE = "notice"  # jobs/<job>/notice: a VM's preemption notice, written by its agent at once
READY = "ready"  # jobs/<job>/ready: a held VM waiting at the starting line (rank 0), re-written while it waits
NODES = "nodes"  # jobs/<job>/nodes/<rank>/exit: a gang worker's (or TPU host's) own exit record

MANAGED_LABEL = "respawn-managed"
JOB_LABEL = "respawn-job"
ATTEMPT_LABEL = "respawn-attempt"
# The job's residue mod MAX_SHARDS in binary (SHARD_BITS digits): every VM carries it whatever the
# number of shards, so a shard of any K finds its jobs' VMs by the last log2(K) digits (Compute's
# regular-expression filter, ``shard_filter``), and a change of K relabels nothing. One label, not
# one per K: a VM has at most 64 labels and a spec may name 60.
SHARD_LABEL = "respawn-shard"
SHARD_BITS = 8
MAX_SHARDS = 1 << SHARD_BITS

# Compute Engine names are RFC 1035 labels of at most 63 characters. A job name leaves
# room for "-<attempt up to 6 digits>-n<rank up to 4 digits>".
MAX_JOB_NAME = 50
_JOB_RE = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_INSTANCE_RE = re.compile(r"(?P<job>[a-z](?:[-a-z0-9]*[a-z0-9])?)-(?P<attempt>[1-9][0-9]*)(?:-n(?P<rank>0|[1-9][0-9]*))?")
# Namespace for insert request ids; any fixed UUID works, it must simply never change.
_REQUEST_NS = uuid.UUID("5f0c7a7e-9a39-4a4b-8d3b-2f1e6b0d9c11")


def job_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a job name, or None when it can."""
    if not _JOB_RE.fullmatch(name):
        return (
            f"{name!r} is not a valid job name: use lowercase letters, digits and '-', "
            "starting with a letter and not ending with '-'"
        )
    if len(name) > MAX_JOB_NAME:
        return f"{name!r} is {len(name)} characters long; job names are at most {MAX_JOB_NAME}"
    return None


# The checkpoints bucket beside a control bucket (deploy/IAM.md): the CLI names it (respawn run's default
# checkpoint, deploy, doctor) and so does the service (controller.service.places: a spec's checkpoint.uri
# in the control bucket, where no trainer may save, is pointed there).
CHECKPOINTS_SUFFIX = "-checkpoints"
# Cloud Storage's bucket names (cloud.google.com/storage/docs/naming-buckets): 3 to 63 lowercase letters,
# digits, '-' and '_', starting and ending with a letter or digit. A name with dots may be longer, but
# "names containing dots require verification" of the domain they name: CONTROL-checkpoints is no domain.
_PLAIN_BUCKET = re.compile(r"[a-z0-9][a-z0-9_-]{1,61}[a-z0-9]")
MAX_BUCKET = 63


def checkpoints_bucket(control: str) -> str:
    """The checkpoints bucket of the control bucket ``control``: ``CONTROL-checkpoints``, which
    ``respawn deploy`` (and ``respawn local up``) makes, the trainers' account may read and write, and
    the controller's may list. A bucket of its own, not a prefix of the control bucket: the trainers
    may neither list nor read that one (deploy/IAM.md). ValueError, saying why, where that name
    cannot be a bucket's."""
    name = f"{control}{CHECKPOINTS_SUFFIX}"
    if len(name) > MAX_BUCKET:
        raise ValueError(f"gs://{name} would be {len(name)} characters long, and a bucket name is at most "
                         f"{MAX_BUCKET} (a control bucket of at most {MAX_BUCKET - len(CHECKPOINTS_SUFFIX)} has one)")
    if "." in name:
        raise ValueError(f"gs://{name} has dots, and Cloud Storage makes a bucket with dots only for a domain "
                         "verified as yours")
    if not _PLAIN_BUCKET.fullmatch(name):
        raise ValueError(f"gs://{name} is not a Cloud Storage bucket name")
    return name


def default_checkpoint(control: str, job: str) -> str:
    """``respawn run``'s checkpoint prefix for ``job`` when given none: its name in the checkpoints
    bucket. ValueError as ``checkpoints_bucket``."""
    return f"gs://{checkpoints_bucket(control)}/{job}"


def sweep_key(sweep: str) -> str:
    return f"{SWEEPS_PREFIX}{sweep}/sweep.json"


def slots_prefix(sweep: str) -> str:
    return f"{SWEEPS_PREFIX}{sweep}/slots/"


def slot_key(sweep: str, k: int) -> str:
    return f"{slots_prefix(sweep)}{k}"


def spec_key(job: str) -> str:
    return f"{JOBS_PREFIX}{job}/{SPEC}"


def cancel_key(job: str) -> str:
    return f"{JOBS_PREFIX}{job}/{CANCEL}"


def status_key(job: str) -> str:
    return f"{JOBS_PREFIX}{job}/{STATUS}"


def exit_key(job: str) -> str:
    return f"{JOBS_PREFIX}{job}/{EXIT}"


def heartbeat_key(job: str) -> str:
    return f"{JOBS_PREFIX}{job}/{HEARTBEAT}"


def notice_key(job: str) -> str:
    return f"{JOBS_PREFIX}{job}/{NOTICE}"


def ready_key(job: str) -> str:
    return f"{JOBS_PREFIX}{job}/{READY}"


def marker_key(job: str) -> str:
    return f"{MARKERS_PREFIX}{job}"


def node_exits_prefix(job: str) -> str:
    return f"{JOBS_PREFIX}{job}/{NODES}/"


def node_exit_key(job: str, rank: int) -> str:
    """A worker's own exit record (rank > 0; rank 0's is ``exit_key``): one object per rank,
    so that no rank's exit can overwrite another's."""
    return f"{node_exits_prefix(job)}{rank}/{EXIT}"


@dataclass(frozen=True)
class ObjectRef:
    """What a bucket object means under the contract: whose it is and which kind."""

    job: str
    kind: str  # spec | cancel | status | exit | heartbeat | marker | notice | ready
    node: int | None = None  # an exit record's rank, for a worker's own record (``node_exit_key``)


_KINDS = {SPEC: "spec", CANCEL: "cancel", STATUS: "status", EXIT: "exit", HEARTBEAT: "heartbeat", NOTICE: "notice",
          READY: "ready"}
# A worker's rank as the agent writes it: 1 to 999999, no leading zero (rank 0's record is ``exit``).
_NODE_EXIT_RE = re.compile(rf"{NODES}/([1-9][0-9]{{0,5}})/{EXIT}")


def parse_object_name(name: str) -> ObjectRef | None:
    """Map a bucket object name to the job it belongs to; None when outside the contract.

    The job part is returned even when it is not a valid job name, so that a hostile
    name gets a status that says why it was rejected instead of vanishing.
    """
    if name.startswith(MARKERS_PREFIX):
        job = name[len(MARKERS_PREFIX) :]
        return ObjectRef(job, "marker") if job and "/" not in job else None
    if name.startswith(JOBS_PREFIX):
        job, sep, leaf = name[len(JOBS_PREFIX) :].partition("/")
        if job and sep and leaf in _KINDS:
            return ObjectRef(job, _KINDS[leaf])
        if job and sep and (node := _NODE_EXIT_RE.fullmatch(leaf)):
            return ObjectRef(job, "exit", int(node.group(1)))
    return None


def instance_name(job: str, attempt: int, node: int | None = None) -> str:
    """``<job>-<attempt>`` for a single VM, ``<job>-<attempt>-n<rank>`` for a gang node.

    Injective across jobs: a single VM's name ends in ``-<digits>``, a gang node's in
    ``-n<digits>``, so reading from the right recovers (job, attempt, rank) uniquely.
    (With a bare ``-<rank>``, gang ``a`` attempt 1 node 1 and job ``a-1`` attempt 1 were
    both ``a-1-1``.)
    """
    return f"{job}-{attempt}" if node is None else f"{job}-{attempt}-n{node}"


def parse_instance_name(name: str) -> tuple[str, int, int | None] | None:
    """(job, attempt, rank or None) for a name ``instance_name`` made; None otherwise."""
    match = _INSTANCE_RE.fullmatch(name)
    if not match:
        return None
    rank = match.group("rank")
    return match.group("job"), int(match.group("attempt")), None if rank is None else int(rank)


# A host of a TPU slice's MIG: the slice's name (``instance_name``), "-w", and the hyphen and four
# characters Compute appends to a MIG's base instance name.
_SLICE_HOST_RE = re.compile(r"(?P<slice>[a-z][-a-z0-9]*-[1-9][0-9]*)-w-[a-z0-9]{4}")


def parse_slice_host(name: str) -> tuple[str, int] | None:
    """(job, attempt) for a host of a TPU slice's MIG (``<job>-<attempt>-w-xxxx``); None otherwise. Read
    before ``parse_instance_name``: ``<job>-<attempt>-w-1234`` would also read as job ``<job>-<attempt>-w``."""
    match = _SLICE_HOST_RE.fullmatch(name)
    parsed = parse_instance_name(match["slice"]) if match else None
    return (parsed[0], parsed[1]) if parsed and parsed[2] is None else None


def node_names(job: str, attempt: int, nodes: int) -> list[str]:
    if nodes == 1:
        return [instance_name(job, attempt)]
    return [instance_name(job, attempt, rank) for rank in range(nodes)]


def request_id(job: str, attempt: int, placement: int, run: str = "") -> str:
    """Deterministic insert ``request_id`` (Compute requires a UUID).

    Every retry of one insert reuses the id, so Compute deduplicates it. ``placement``
    counts capacity failures within the attempt: Compute answers a reused id with the
    *original* operation, so trying the next zone after a stockout needs a new id.
    ``run`` tells runs of a reused job name apart (attempt numbers start over when its
    status.json is deleted): Compute would answer run 2's attempt 1 with run 1's.
    """
    return str(uuid.uuid5(_REQUEST_NS, f"{job}/{attempt}/{placement}" + (f"/{run}" if run else "")))


def _digest(job: str) -> int:
    # sha256, never Python's hash(): salted per process, it would move jobs between shards on
    # every cold start.
    return int.from_bytes(hashlib.sha256(job.encode()).digest()[:8], "big")


def shard_of(job: str, shards: int) -> int:
    """The shard that reconciles ``job`` among ``shards`` (a power of two up to MAX_SHARDS)."""
    if shards_problem(shards):
        raise ValueError(shards_problem(shards))
    return _digest(job) % shards


def shard_label(job: str) -> str:
    """The ``respawn-shard`` label's value: the job's residue mod MAX_SHARDS, in binary. Its last
    log2(K) digits are ``shard_of(job, K)`` for every K (K divides MAX_SHARDS)."""
    return format(_digest(job) % MAX_SHARDS, f"0{SHARD_BITS}b")


def shards_problem(shards: int) -> str | None:
    """Why ``shards`` cannot be a number of shards, or None. A power of two, so that one label
    serves every K (``shard_label``); at most MAX_SHARDS (2.5 million jobs at 10,000 a shard)."""
    if not isinstance(shards, int) or shards < 1 or shards > MAX_SHARDS or shards & (shards - 1):
        return f"the number of shards must be a power of two from 1 to {MAX_SHARDS}, not {shards!r}"
    return None


def shard_suffix(index: int, shards: int) -> str:
    """The regular expression a shard's VMs' ``respawn-shard`` label ends with (RE2, whole value)."""
    bits = shards.bit_length() - 1
    return ".*" + (format(index, f"0{bits}b") if bits else "")
