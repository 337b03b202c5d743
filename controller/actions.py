"""Actions are values: the planner returns them, the executor applies them in order.

A job's actions form a chain; the executor stops the chain at the first action that
fails, so a later step (deleting a marker) never runs without the earlier one
(inserting its replacement).
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.ports import InstanceRequest
from controller.spec import JobSpec
from controller.state import JobStatus


@dataclass(frozen=True)
class WriteStatus:
    """Compare-and-swap ``status.json`` on the generation this pass last saw or wrote."""

    job: str
    status: JobStatus
    reason: str
    replan: bool = False  # the job has a next step right away: plan it in the same pass


@dataclass(frozen=True)
class CreateInstances:
    """Insert the attempt's VM, or its whole gang in one zone."""

    job: str
    attempt: int
    requests: tuple[InstanceRequest, ...]
    request_id: str
    spec: JobSpec  # the executor turns a capacity error into a status update with it
    reason: str


@dataclass(frozen=True)
class DeleteInstance:
    job: str
    project: str
    zone: str
    name: str
    reason: str
    # Orphans are judged on a listing older than the instance list; the executor
    # re-reads the spec right before deleting, so a job created meanwhile is spared.
    only_if_spec_absent: bool = False


@dataclass(frozen=True)
class DeleteRecord:
    """Delete a marker or exit record that has been acted on (or is stale)."""

    job: str
    key: str
    generation: int
    reason: str


Action = WriteStatus | CreateInstances | DeleteInstance | DeleteRecord
