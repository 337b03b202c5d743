"""Build the insert requests for one attempt: names, labels, metadata, machine shape."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any
from dataclasses import dataclass

from controller.core import names
from controller.core.ports import InstanceRequest, TpuRequest
from controller.core.spec import JobSpec, render_env
from controller.core.state import JobStatus
from controller.core.transitions import model_of


@dataclass(frozen=True)
class LaunchContext:
    """What every launch needs besides the spec: where the controller lives, the VM scripts."""

    bucket: str
    default_project: str
    # What VMs carry as their startup-script and shutdown-script: the bootstraps, which fetch the
    # agent's scripts named (gs:// URI and SHA-256) in ``script_items`` (controller.service.vmscripts).
    startup_script: str
    shutdown_script: str
    # A fresh secret per attempt (see JobStatus.attempt_token); tests pass their own.
    new_token: Callable[[], str] = lambda: secrets.token_urlsafe(24)
    script_items: tuple[tuple[str, str], ...] = ()


def boot_image(spec: JobSpec) -> str:
    disk = spec.boot_disk
    if disk.image:
        return disk.image
    return f"projects/{disk.image_project}/global/images/family/{disk.image_family}"


# Seconds between a held VM's ready records while it waits at the starting line: each wakes a pass.
LINE_POKE_S = 10


def standby_requests(job: str, spec: JobSpec, status: JobStatus, ctx: LaunchContext) -> tuple[InstanceRequest, ...]:
    """The standby's VMs (``JobStatus.standby``): the next attempt, held at the starting line,
    with no checkpoint yet (the go names it), where and as which model the standby says."""
    sb = status.standby
    assert sb is not None and spec.tpu is None
    slot = status.model_copy(update={"attempt": sb.attempt, "zone": sb.zone, "attempt_token": sb.token,
                                     "provisioning": sb.provisioning, "resume_from": None, "checkpoint_every_s": None,
                                     "held": True, "go_at": None,
                                     # its own model's notice (it may step back up: then none), as its promotion records
                                     "notice_s": 0 if status.notice_refused else spec.notice_for(sb.provisioning)})
    return requests_for(job, spec, slot, ctx)  # type: ignore[return-value]


def go_items(status: JobStatus) -> dict[str, str]:
    """What the go at the starting line sets on each VM of a held attempt (one setMetadata): the
    attempt it is for, and the checkpoint resolved when it was given, as an insert would carry them."""
    resume = status.resume_from
    return {
        "respawn-go": str(status.attempt),
        "respawn-resume-from": resume.uri if resume else "",
        "respawn-resume-step": str(resume.step) if resume and resume.step is not None else "",
        "respawn-resume-tag": (resume.tag or "") if resume else "",
        "respawn-checkpoint-every-s": str(round(status.checkpoint_every_s)) if status.checkpoint_every_s else "",
    }


def requests_for(job: str, spec: JobSpec, status: JobStatus, ctx: LaunchContext,
                 ) -> tuple[InstanceRequest, ...] | tuple[TpuRequest]:
    """One request per node of the status's current attempt, all in its zone.

    Nodes differ only by name: a gang is one bulkInsert, which gives every instance
    the same labels and metadata, so a node reads its rank from its name's suffix. A TPU
    job is one node however many hosts its slice spans; each host reads its rank from
    its ``agent-worker-number``.
    """
    node_names = names.node_names(job, status.attempt, spec.nodes)
    if spec.tpu is not None:
        return (_tpu_request(job, spec, status, ctx, node_names[0]),)
    return tuple(_request(job, spec, status, ctx, name, node_names[0]) for name in node_names)


def _tpu_request(job: str, spec: JobSpec, status: JobStatus, ctx: LaunchContext, name: str) -> TpuRequest:
    tpu = spec.tpu
    assert tpu is not None
    common = _common(job, spec, status, ctx, name)
    model = model_of(spec, status)
    # The node's name, which its hosts' own names (t1v-n-...-w-N on the Cloud TPU API, the MIG's
    # <name>-w-xxxx in Compute Engine) do not carry: the agent names its records by it.
    metadata = {**_metadata(job, spec, status, ctx, name), "respawn-node": name}
    if tpu.machine_type is not None:  # Compute Engine: an instance, or a MIG of hosts
        return TpuRequest(
            **common, metadata=metadata, accelerator_type=tpu.machine_type, runtime_version="",
            spot=model == "spot", api="compute", topology=tpu.topology if tpu.hosts > 1 else None,
            hosts=tpu.hosts, flex_start=model == "flex-start",
            max_run_seconds=int(spec.policy.max_run_duration.total_seconds()) if model == "flex-start"
            and spec.policy.max_run_duration else None,
            boot_image=boot_image(spec), boot_disk_gb=spec.boot_disk.size_gb, boot_disk_type=spec.boot_disk.type,
        )
    assert tpu.type is not None and tpu.runtime_version is not None
    return TpuRequest(
        **common, metadata=metadata, accelerator_type=tpu.type, runtime_version=tpu.runtime_version,
        spot=model == "spot", queued=tpu.queued,
    )


def _common(job: str, spec: JobSpec, status: JobStatus, ctx: LaunchContext, name: str) -> dict[str, Any]:
    """What a VM's and a TPU node's requests share: where, as whom, on which network, labelled how."""
    return dict(
        project=spec.project or ctx.default_project,
        zone=_zone(spec, status),
        name=name,
        labels=_labels(job, spec, status),
        service_account=spec.service_account.email,
        scopes=spec.service_account.scopes,
        network=spec.network.network,
        subnetwork=spec.network.subnetwork,
        external_ip=spec.network.external_ip,
        tags=spec.network.tags,
    )


def _zone(spec: JobSpec, status: JobStatus) -> str:
    # Where it goes comes from the policy-checked spec, never from status.json alone:
    # the status's zone is used only when it is one of the spec's.
    return status.zone if status.zone in spec.zones else spec.zones[0]


def _labels(job: str, spec: JobSpec, status: JobStatus) -> dict[str, str]:
    return {
        **spec.labels,
        names.MANAGED_LABEL: "true",
        names.JOB_LABEL: job,
        names.ATTEMPT_LABEL: str(status.attempt),
        names.SHARD_LABEL: names.shard_label(job),
    }


def _metadata(job: str, spec: JobSpec, status: JobStatus, ctx: LaunchContext, master: str) -> dict[str, str]:
    return {
        "respawn-job": job,
        "respawn-bucket": ctx.bucket,
        "respawn-attempt": str(status.attempt),
        "respawn-token": status.attempt_token or "",
        "respawn-resume-from": status.resume_from.uri if status.resume_from else "",
        "respawn-resume-step": str(status.resume_from.step) if status.resume_from and status.resume_from.step is not None else "",
        "respawn-resume-tag": (status.resume_from.tag or "") if status.resume_from else "",
        # Where this run writes its checkpoints: a fresh run's own prefix (controller.core.runs).
        "respawn-checkpoint-uri": status.checkpoints(spec.checkpoint).uri if spec.checkpoint else "",
        "respawn-command": spec.command_line,
        # The container the command runs in ("": on the VM itself), pulled before the starting line.
        "respawn-image": spec.image or "",
        "respawn-code": spec.code or "",
        # Lines the startup script evaluates; keys are validated identifiers, values quoted.
        "respawn-env": render_env({**spec.env, **(spec.sweep.env if spec.sweep else {})}),
        "respawn-nodes": str(spec.nodes),
        "respawn-master-addr": master,
        "respawn-heartbeat-interval": str(int(spec.heartbeat_interval.total_seconds())),
        # Young/Daly's interval for this attempt (RESPAWN_CHECKPOINT_EVERY_S), "" while unknown.
        "respawn-checkpoint-every-s": str(round(status.checkpoint_every_s)) if status.checkpoint_every_s else "",
        # Zero-gap recovery: what notice Compute was asked for, and whether the VM waits at the
        # starting line for the go (a standby). An attempt held and given its go already (its
        # insert retried after the go) carries the go itself: it starts at once.
        "respawn-preemption-notice-s": str(status.notice_s),
        "respawn-hold": "1" if status.held else "",
        "respawn-line-poke-s": str(LINE_POKE_S),
        **(go_items(status) if status.held and status.go_at else {}),
        **dict(ctx.script_items),
        "startup-script": ctx.startup_script,
        "shutdown-script": ctx.shutdown_script,
        # The serial console into Cloud Logging (serial_port_1_output), where `respawn logs` reads it:
        # off by default in Google projects. A TPU node passes its metadata on to its workers' VMs.
        "serial-port-logging-enable": "TRUE",
    }


def _request(job: str, spec: JobSpec, status: JobStatus, ctx: LaunchContext, name: str, master: str) -> InstanceRequest:
    assert spec.machine_type is not None  # a VM job (spec._vm_or_tpu)
    accel = spec.accelerators
    model = model_of(spec, status)
    return InstanceRequest(
        **_common(job, spec, status, ctx, name),
        metadata=_metadata(job, spec, status, ctx, master),
        machine_type=spec.machine_type,
        provisioning=model,
        # A Flex-start VM is deleted when its run ends (Compute requires it).
        termination_action="delete" if model == "flex-start" else spec.policy.termination_action,
        boot_image=boot_image(spec),
        boot_disk_gb=spec.boot_disk.size_gb,
        boot_disk_type=spec.boot_disk.type,
        accelerator_type=accel.type if accel else None,
        accelerator_count=accel.count if accel else 0,
        max_run_seconds=int(spec.policy.max_run_duration.total_seconds()) if model == "flex-start"
        and spec.policy.max_run_duration else None,
        preemption_notice_s=status.notice_s if model == "spot" else 0,
    )
