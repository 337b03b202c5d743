"""Actions are values: the planner returns them, the executor applies them in order.

A job's actions form a chain; the executor stops the chain at the first action that
fails, so a later step (deleting a marker) never runs without the earlier one
(inserting its replacement).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controller.core.ports import InstanceRequest, TpuRequest
from controller.core.spec import JobSpec
from controller.core.state import JobStatus


@dataclass(frozen=True)
class WriteStatus:
    """Compare-and-swap ``status.json`` on the generation this pass last saw or wrote."""

    job: str
    status: JobStatus
    reason: str
    replan: bool = False  # the job has a next step right away: plan it in the same pass
    # Evidence this decision must be taken on, loaded and planned again before it is
    # acted on: "records" (marker and exit record re-read now).
    needs: frozenset[str] = frozenset()


@dataclass(frozen=True)
class CreateInstances:
    """Insert the attempt's VM, or its whole gang in one zone, or create its TPU node."""

    job: str
    attempt: int
    requests: tuple[InstanceRequest, ...] | tuple[TpuRequest]
    request_id: str
    spec: JobSpec  # the executor turns a capacity error into a status update with it
    reason: str
    # The standby's VMs (JobStatus.standby), not the current attempt's: an error moves or drops
    # the standby (transitions.after_standby_error), never the current attempt's zone or model.
    standby: bool = False


@dataclass(frozen=True)
class DeleteInstance:
    """Delete one of the job's instances, re-checked right before it goes.

    Every delete is decided on a bucket listing older than the instance list, so the
    executor re-reads first: an orphan's spec must still be absent (a job created
    meanwhile is spared); any other delete needs status.json still at the generation
    this chain last saw or wrote (a newer run started by another pass is spared).
    """

    job: str
    project: str
    zone: str
    name: str
    reason: str
    only_if_spec_absent: bool = False
    tpu: bool = False  # a TPU node: deleted through the TPU gateway
    tpu_api: str = "tpu"  # which one: the Cloud TPU API's, or Compute Engine's slices ("compute")
    # What is left of an older attempt: a delete that fails is said, and never holds the rest
    # of the chain (the next attempt's insert above all); it is tried again every pass.
    husk: bool = False
    # A stopped VM (TERMINATED): it bills no machine, only its disk, so its delete may wait for a
    # pass over every job with room in its budget (``Executor.apply``'s ``husks``), rather than
    # spend the project's mutation quota beside the inserts of a mass recovery. Never a TPU node
    # (it holds TPU quota until deleted).
    deferrable: bool = False


@dataclass(frozen=True)
class ReleaseLine:
    """The go at the starting line: set ``items`` (``launch.go_items``) on each of the current
    attempt's held VMs, by ``instances.setMetadata``. Idempotent: a VM that has its go keeps it
    (``ComputeGateway.release``); one that is gone is the watch's business."""

    job: str
    attempt: int
    project: str
    zone: str
    names: tuple[str, ...]
    items: Mapping[str, str]
    reason: str
    # The actions after it wait for it: its failure ends the chain (the next pass tries again). Else a
    # go that failed is given again next pass and holds nothing.
    gate: bool = False


@dataclass(frozen=True)
class DeleteRecord:
    """Delete a marker or exit record that has been acted on (or is stale)."""

    job: str
    key: str
    generation: int
    reason: str


@dataclass(frozen=True)
class ClaimSlot:
    """Take slot ``k`` of ``sweep`` for the trial ``job``: ``sweeps/<sweep>/slots/<k>`` created if
    absent, naming the trial. Held by this trial already (another pass's claim): done. Taken by
    another trial: the chain stops before its launch (the next pass reads the slots again)."""

    job: str
    sweep: str
    k: int
    reason: str


@dataclass(frozen=True)
class ReleaseSlot:
    """Give slot ``k`` of ``sweep`` back: deleted at the generation the pass listed (a slot taken
    again since is another trial's, never deleted)."""

    job: str
    sweep: str
    k: int
    generation: int
    reason: str


Action = WriteStatus | CreateInstances | DeleteInstance | DeleteRecord | ReleaseLine | ClaimSlot | ReleaseSlot
