"""The job spec: what a user drops at ``jobs/<job>/spec.yaml`` (YAML or JSON).

Strict on purpose: an unknown field is almost always a typo (``max_restart``) that
would otherwise silently fall back to a default on a job that costs money per hour.
Every problem is reported as ``field.path: what is wrong; what is accepted``.

Hostile on purpose too: the bucket is writable by anyone who may submit a job, so
``parse_spec`` bounds everything before it is walked (size, nesting, YAML alias
expansion, every string and number) and raises nothing but ``SpecError``.
"""

from __future__ import annotations

import difflib
import functools
import re
import shlex
from datetime import timedelta
from typing import Annotated, Any, Literal

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

try:
    from yaml._yaml import CParser  # libyaml's scanner and parser: iterative, in C
except ImportError:  # pragma: no cover
    CParser = None
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from controller.core import imageref, tpus
from controller.core.checkpoints import CustomRule, rule_problem
from controller.core.durations import Duration
from controller.core.names import job_name_problem

MAX_SPEC_BYTES = 256 * 1024  # the whole file; the caller also checks the listed size
MAX_DEPTH = 32  # a real spec nests 4 deep
MAX_NODES = 10_000  # YAML values, aliases expanded: a real spec has a few hundred
MAX_PROBLEMS = 20  # lines reported; the rest are counted
MAX_COMMAND_BYTES = 64 * 1024
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_ENV_BYTES = 128 * 1024  # the rendered respawn-env metadata value (limit: 256 KiB per value)
MAX_NODES_PER_JOB = 1000  # a bulkInsert creates at most 1000 instances
MAX_COUNT = 1_000_000  # restarts, failures: anything larger is a typo

GCS_URI = r"^gs://[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9](/[^\s\x00-\x1f\x7f]*)?$"
_NAME = r"^[a-z][-a-z0-9]{0,62}$"  # machine types, accelerator and disk types
_RESOURCE = r"^[-A-Za-z0-9_.:/]{1,1024}$"  # image, network, subnetwork: names, paths or URLs
# The boot images an image: job gets unless the spec names one: each carries a container runtime the
# VM agent drives. GPU VMs: a Deep Learning VM image (Docker with the NVIDIA Container Toolkit, and
# the driver); others: Container-Optimized OS (Docker). A TPU VM's runtime version has Docker.
CONTAINER_BOOT_GPU = ("common-cu128-ubuntu-2204-nvidia-570", "deeplearning-platform-release")
CONTAINER_BOOT = ("cos-stable", "cos-cloud")
_LABEL_RE = r"^[a-z][-_a-z0-9]{0,62}$"

# Environment the VM agent sets for the command, or reads itself: a spec may not override them.
RESERVED_ENV = {
    "RESUME_FROM": "the VM agent sets it",
    "RESUME_STEP": "the VM agent sets it",
    "RESUME_TAG": "the VM agent sets it",
    "NODE_RANK": "the VM agent sets it",
    "NODES": "the VM agent sets it",
    "MASTER_ADDR": "the VM agent sets it",
    "GCE_METADATA_HOST": "the VM agent relies on it",
    "GCE_METADATA_IP": "the VM agent relies on it",
    "STORAGE_EMULATOR_HOST": "the VM agent relies on it",
    # bash's own: the command runs under bash, which would drop, refuse or act on these
    "IFS": "bash's field separator (the command's shell runs under bash)",
    "_": "bash sets it", "PS4": "bash's trace prompt", "ENV": "bash's startup file",
    "SHELLOPTS": "read-only in bash", "BASHOPTS": "read-only in bash", "BASH_ENV": "bash's startup file",
}
RESERVED_ENV_PREFIX = "RESPAWN_"
# The agent's launcher keeps its own variables under this (lowercase) prefix; BASH_* are bash's.
RESERVED_ENV_PREFIXES = (RESERVED_ENV_PREFIX, "respawn_", "BASH_")

# GPUs built into accelerator-optimized machine types: machine type -> (GPU type, count per VM).
# Source: Google Cloud, "GPU machine types" (cloud.google.com/compute/docs/gpus) and
# "Accelerator-optimized machine family" (cloud.google.com/compute/docs/accelerator-optimized-machines):
# each A and G series machine type comes with a fixed model and number of GPUs attached, and
# GPUs cannot be added to it. GPU models per series and the A4X (4 GPUs) and A3/A4 (8 GPUs)
# counts were confirmed on Google's pages; the per-type counts of A2, A3 High 1/2/4g and G2
# follow the "-<N>g" naming and Google's published tables as mirrored by Google's xpk tool
# (g2-standard-24/48/96 = 2/4/8 L4), and could not be re-read verbatim from Google's tables.
# Variants with a suffix (a3-highgpu-8g-nolssd, a4-highgpu-8g-lowmem) have the same GPUs.
BUILT_IN_GPUS: dict[str, tuple[str, int]] = {
    **{f"a2-highgpu-{n}g": ("nvidia-tesla-a100", n) for n in (1, 2, 4, 8)},
    "a2-megagpu-16g": ("nvidia-tesla-a100", 16),
    **{f"a2-ultragpu-{n}g": ("nvidia-a100-80gb", n) for n in (1, 2, 4, 8)},
    **{f"a3-highgpu-{n}g": ("nvidia-h100-80gb", n) for n in (1, 2, 4, 8)},
    "a3-megagpu-8g": ("nvidia-h100-mega-80gb", 8),
    "a3-edgegpu-8g": ("nvidia-h100-80gb", 8),
    "a3-ultragpu-8g": ("nvidia-h200-141gb", 8),
    "a4-highgpu-8g": ("nvidia-b200", 8),
    "a4x-highgpu-4g": ("nvidia-gb200", 4),
    **{f"g2-standard-{n}": ("nvidia-l4", 1) for n in (4, 8, 12, 16, 32)},
    "g2-standard-24": ("nvidia-l4", 2),
    "g2-standard-48": ("nvidia-l4", 4),
    "g2-standard-96": ("nvidia-l4", 8),
}
# A GPU machine type of a newer A series than the table knows: "a5-highgpu-8g" -> 8.
_A_SERIES_GPU = re.compile(r"a\d+x?-[a-z]+gpu-(\d{1,3})g(-[a-z0-9]+)*")


def built_in_gpus(machine_type: str) -> tuple[str, int] | None:
    """(GPU type, count per VM) that come with ``machine_type``; None for a type without GPUs."""
    parts = machine_type.split("-")
    for end in range(len(parts), 2, -1):  # "a4-highgpu-8g-lowmem" -> "a4-highgpu-8g"
        if (found := BUILT_IN_GPUS.get("-".join(parts[:end]))) is not None:
            return found
    if match := _A_SERIES_GPU.fullmatch(machine_type):
        return "built-in", int(match.group(1))
    return None


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FieldProblem(ValueError):
    """A validator's error about a field below the one it validates (``policy`` -> ``idle_timeout``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class Accelerators(Strict):
    type: str = Field(pattern=_NAME, description="e.g. nvidia-l4, nvidia-tesla-t4")
    count: int = Field(default=1, ge=1, le=16)


# Cloud TPU accelerator types: a generation and its size (v2-8, v4-32, v5litepod-16, v5p-8, v6e-4).
TPU_TYPE = r"^v\d+[a-z]*-\d{1,5}$"


class Tpu(Strict):
    """A TPU slice in place of a Compute Engine VM: one node per attempt, however many hosts
    (workers) it spans. Either a Cloud TPU API node (``type`` and ``runtime_version``: v2 to
    v6e) or a TPU machine type in Compute Engine (``machine_type``, and ``topology`` for a
    multi-host slice: a managed instance group); TPU7x and later are Compute Engine only."""

    type: str | None = Field(default=None, max_length=64,
                             description="Cloud TPU accelerator type, e.g. v5litepod-8, v4-32, v6e-4")
    runtime_version: str | None = Field(default=None, pattern=r"^[a-z0-9][-a-z0-9.]{0,62}$",
                                        description="TPU software version, e.g. v2-alpha-tpuv5-lite, "
                                                    "tpu-ubuntu2204-base")
    # Through queuedResources (the spot tier for Spot): a stockout waits in Google's queue
    # instead of failing the create.
    queued: bool = False
    machine_type: str | None = Field(default=None, max_length=64,
                                     description="a Compute Engine TPU machine type, e.g. tpu7x-standard-4t")
    topology: str | None = Field(default=None, max_length=16,
                                 description="a multi-host slice's chips along each axis, e.g. 2x2x2")

    @field_validator("type")
    @classmethod
    def _a_tpu_type(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if (machine := tpus.COMPUTE_ONLY.get(value.rpartition("-")[0])) is not None:
            raise ValueError(f"{value.rpartition('-')[0]} is served only through Compute Engine, not the Cloud TPU "
                             f"API: write 'machine_type: {machine}' (and 'topology' for a multi-host slice) in "
                             "place of 'type' and 'runtime_version'")
        if not re.fullmatch(TPU_TYPE, value):
            raise ValueError("not a TPU accelerator type: a generation and its size, e.g. v5litepod-8, v4-32, v6e-4")
        return value

    @field_validator("machine_type")
    @classmethod
    def _a_tpu_machine(cls, value: str | None) -> str | None:
        if value is not None and value not in tpus.MACHINES:
            close = difflib.get_close_matches(value, tpus.MACHINES, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"not a TPU machine type; {hint}Compute Engine's are {', '.join(tpus.MACHINES)}")
        return value

    @model_validator(mode="after")
    def _one_api(self) -> Tpu:
        if self.machine_type is None:
            if self.type is None:
                raise FieldProblem("type", "required: a Cloud TPU type with runtime_version (e.g. v6e-8), or "
                                   "'machine_type' for a TPU in Compute Engine (e.g. tpu7x-standard-4t)")
            if self.runtime_version is None:
                raise FieldProblem("runtime_version", "required with tpu.type: the TPU software version, "
                                   "e.g. v2-alpha-tpuv6e")
            if self.topology is not None:
                raise FieldProblem("topology", "only with tpu.machine_type (the type sets a Cloud TPU node's "
                                   "shape); remove it")
            return self
        given = [f for f in ("type", "runtime_version") if getattr(self, f) is not None]
        if given:
            raise FieldProblem(given[0], "not with tpu.machine_type (Compute Engine: the machine type and "
                               "topology set the slice, the boot disk its image); remove it")
        if self.queued:
            raise FieldProblem("queued", "the Cloud TPU API's queue; in Compute Engine a slice that waits "
                               "for capacity is 'provisioning: flex-start'; remove it")
        machine = tpus.MACHINES[self.machine_type]
        if self.topology is not None and (why := tpus.topology_problem(machine, self.topology)):
            raise FieldProblem("topology", why)
        return self

    @property
    def api(self) -> Literal["tpu", "compute"]:
        """Which API serves it: the Cloud TPU API (nodes) or Compute Engine (instances, MIGs)."""
        return "tpu" if self.machine_type is None else "compute"

    @property
    def machine(self) -> tpus.TpuMachine | None:
        return tpus.MACHINES[self.machine_type] if self.machine_type is not None else None

    @property
    def hosts(self) -> int:
        """The slice's VMs in Compute Engine; for a Cloud TPU node, at most its size (TPU nodes say)."""
        if self.machine is not None:
            return self.machine.hosts(self.topology)
        return self.size

    @property
    def accelerator(self) -> str:
        """The slice as a Cloud TPU type names it (``v6e-8``, ``tpu7x-8``): what prices and policy read."""
        if self.machine is not None:
            return self.machine.accelerator(self.topology)
        assert self.type is not None
        return self.type

    @property
    def size(self) -> int:
        """The number the accelerator ends in: TensorCores for v2 to v5p, chips for v5e, v6e and TPU7x."""
        return int(self.accelerator.rsplit("-", 1)[1])

    def describe(self) -> str:
        """How it runs, in words: which API, how many hosts."""
        if self.machine is None:
            return f"Cloud TPU API node {self.type} (runtime {self.runtime_version})"
        if self.hosts == 1:
            return f"Compute Engine TPU VM {self.machine_type} (a single-host slice: one instance)"
        return (f"Compute Engine TPU slice {self.topology}: {self.hosts} hosts of {self.machine_type} "
                "(a managed instance group with a workload policy)")


class BootDisk(Strict):
    image: str | None = Field(default=None, pattern=_RESOURCE, description="image URL or projects/P/global/images/NAME")
    image_family: str | None = Field(default=None, pattern=r"^[a-z][-a-z0-9]{0,62}$")
    image_project: str | None = Field(default=None, pattern=r"^[a-z][-a-z0-9.:]{0,127}$")
    size_gb: int = Field(default=100, ge=10, le=65536)
    type: str = Field(default="pd-balanced", pattern=_NAME)

    @model_validator(mode="after")
    def _one_source(self) -> BootDisk:
        if self.image and (self.image_family or self.image_project):
            raise ValueError("give either 'image' or 'image_family' + 'image_project', not both")
        if not self.image and not (self.image_family and self.image_project):
            raise ValueError("give 'image', or both 'image_family' and 'image_project'")
        return self


def _default_boot() -> BootDisk:
    return BootDisk(image_family="debian-12", image_project="debian-cloud")


class ServiceAccount(Strict):
    email: str | None = Field(
        default=None,
        pattern=r"^(default|[-A-Za-z0-9_.+]{1,64}@[-a-z0-9.]{1,253})$",
        description="default: the controller's trainer service account",
    )
    scopes: tuple[Annotated[str, Field(pattern=r"^[-A-Za-z0-9_.:/]{1,256}$")], ...] = Field(
        default=("https://www.googleapis.com/auth/cloud-platform",), max_length=64
    )


class Network(Strict):
    network: str = Field(default="global/networks/default", pattern=_RESOURCE)
    subnetwork: str | None = Field(default=None, pattern=_RESOURCE)
    external_ip: bool = True
    tags: tuple[Annotated[str, Field(pattern=r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")], ...] = Field(
        default=(), max_length=64
    )


class Checkpoint(Strict):
    uri: str = Field(pattern=GCS_URI, description="gs:// prefix the trainer writes checkpoints under")
    format: Literal["auto", "orbax", "tensorflow", "lightning", "dcp", "files", "pointer", "deepspeed", "megatron",
                    "accelerate", "huggingface", "custom"] = "auto"
    # format: custom only: where the saves are, and what makes one complete (checkpoints.CustomRule)
    pattern: str | None = Field(default=None, description="e.g. 'run/step-{step}/' or 'ckpt-{step}.pt'")
    marker: str | None = Field(default=None, description="the object a directory save writes last")
    same_files: bool = Field(default=False, description="complete when it holds the previous complete save's files")
    # A new run of this spec ignores every earlier run's checkpoints: its own go under
    # <uri>/runs/<job>/<run id>/ (RESPAWN_CHECKPOINT_URI), the older ones stay where they are
    # (controller.core.runs). ``respawn submit --fresh`` sets it.
    fresh: bool = Field(default=False, description="a new run starts from no checkpoint, under a prefix of its own")

    @model_validator(mode="after")
    def _usable_rule(self) -> Checkpoint:
        if self.format != "custom":
            given = [f for f in ("pattern", "marker", "same_files") if getattr(self, f) not in (None, False)]
            if given:
                raise FieldProblem(given[0], "only for 'format: custom'; remove it, or set format to custom")
        elif problem := rule_problem(self.pattern, self.marker, self.same_files):
            raise FieldProblem(*problem)
        return self

    @property
    def rule(self) -> CustomRule | None:
        """The compiled custom rule, for ``format: custom``."""
        if self.format != "custom" or self.pattern is None:
            return None
        return CustomRule(self.pattern, self.marker, self.same_files)


class Notify(Strict):
    """Where this job's state changes go, besides the controller's own destinations."""

    topic: str | None = Field(default=None, pattern=r"^projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/topics/[A-Za-z][-A-Za-z0-9_.~+%]{2,254}$",
                              description="a Pub/Sub topic: projects/PROJECT/topics/TOPIC")
    # A host of letters, digits, dots and dashes only, and a plain path: nothing two URL parsers
    # could read differently (a backslash, brackets, userinfo, non-ASCII), for the policy's host
    # check is only worth the parser that connects agreeing with it. The URL is a secret (its
    # path is the credential): an error about it never shows it (_describe).
    webhook: str | None = Field(
        default=None, max_length=2048,
        pattern=r"^https?://[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?(/[A-Za-z0-9._~/+=%-]*)?(\?[A-Za-z0-9._~/+=%&-]*)?$",
        description="a Slack-compatible incoming webhook URL (https)")


class Backoff(Strict):
    initial: Duration = timedelta(seconds=30)
    max: Duration = timedelta(minutes=30)

    @model_validator(mode="after")
    def _ordered(self) -> Backoff:
        if self.max < self.initial:
            raise ValueError("'max' must be at least 'initial'")
        return self


class Fallback(Strict):
    """When a job steps down its ``provisioning`` list (spot -> standard), and when it steps back up."""

    stockouts: int | None = Field(default=None, ge=1, le=MAX_COUNT,
                                  description="capacity errors in a row on one model; default: one per zone")
    wait: Duration = Field(default=timedelta(minutes=30), description="waiting for capacity on one model this long")
    step_up_after: Duration | None = Field(default=timedelta(hours=6),
                                           description="on a lower model this long, the next recovery tries the first")


Provisioning = Literal["spot", "standard", "flex-start"]  # ports.PROVISIONING_MODELS maps them to Compute's
# Compute's scheduling.preemptionNoticeDuration (Preview since 2026-04-16): the metadata server
# turns instance/preempted TRUE this long before a Spot VM's soft-off. Google accepts 0 and 120 s.
NOTICES = (timedelta(0), timedelta(seconds=120))
DEFAULT_NOTICE = timedelta(seconds=120)
FLEX_MAX_RUN = timedelta(days=7)  # Compute's limit on a Flex-start VM's maxRunDuration
FLEX_MIN_RUN = timedelta(seconds=30)  # a run Compute accepts (0s is no maxRunDuration at all, and refused)


class JobPolicy(Strict):
    max_restarts: int = Field(default=100, ge=0, le=MAX_COUNT, description="recreations of any cause")
    max_failures: int = Field(default=3, ge=0, le=MAX_COUNT, description="non-zero exits, crashes and stalls")
    max_runtime: Duration | None = Field(default=None, description="deadline for the whole job")
    max_instance_age: Duration | None = Field(default=None, description="recycle a VM older than this")
    idle_timeout: Duration | None = timedelta(minutes=30)
    startup_grace: Duration = timedelta(minutes=15)
    backoff: Backoff = Backoff()
    zone_cooldown: Duration = timedelta(minutes=10)
    crash_loop_failures: int = Field(default=3, ge=1, le=MAX_COUNT, description="failures without checkpoint progress")
    termination_action: Literal["stop", "delete"] = "stop"
    # Compute deletes a Flex-start VM after this long (scheduling.maxRunDuration); required with flex-start.
    max_run_duration: Duration | None = None
    fallback: Fallback | None = None
    # A TPU under host maintenance (health UNHEALTHY_MAINTENANCE) is waited for this long while
    # Google reschedules it, then deleted and created again.
    maintenance_timeout: Duration = timedelta(hours=1)
    # Dollars per node-hour (a VM with its GPUs, or a whole TPU node) by provisioning model, for
    # the goodput ledger's cost, in place of respawn's price table (controller.core.prices).
    prices: dict[Provisioning, Annotated[float, Field(ge=0, le=10_000)]] | None = Field(
        default=None, description="e.g. {spot: 2.9, standard: 9.8}: dollars per node-hour")


def _env_name(name: str) -> str:
    if prefix := next((p for p in RESERVED_ENV_PREFIXES if name.startswith(p)), None):
        owner = "bash's" if prefix == "BASH_" else "the VM agent's"
        raise ValueError(f"reserved: names starting with {prefix} are {owner}; rename the variable")
    if name in RESERVED_ENV:
        raise ValueError(f"reserved: {RESERVED_ENV[name]}; rename the variable")
    return name


def _env_value(value: str) -> str:
    if "\x00" in value:
        raise ValueError("contains a NUL character, which no environment variable can hold")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_ENV_VALUE_BYTES:
        raise ValueError(f"longer than {MAX_ENV_VALUE_BYTES // 1024} KiB; "
                         "pass large data through a file under 'code' or gs://")
    return value


def _provisioning_shape(value: Any) -> Any:
    """One model (``spot``) or an ordered list to step down (``[spot, standard]``)."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("must name at least one model: spot, standard or flex-start")
        return tuple(value)
    raise ValueError(f"expected spot, standard, flex-start or a list of them, not {type(value).__name__}")


def _command_shape(value: Any) -> Any:
    """A bash line or a list of arguments, each text; checked here so errors name no union branch."""
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("must not be empty")
        return value
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("must not be empty")
        if bad := [i for i, part in enumerate(value) if not isinstance(part, str)]:
            raise ValueError(f"argument {bad[0]} is not text; quote it")
        return tuple(value)
    raise ValueError(f"expected a bash line or a list of arguments, not {type(value).__name__}")


LabelKey = Annotated[str, Field(pattern=_LABEL_RE)]
LabelValue = Annotated[str, Field(pattern=r"^[-_a-z0-9]{0,63}$")]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"), AfterValidator(_env_name)]
EnvValue = Annotated[str, AfterValidator(_env_value)]


class SweepTrial(Strict):
    """A trial's place in its sweep (controller.core.sweep): the sweep admits it, its parameters are
    in its environment (RESPAWN_PARAM_<NAME>, and each name as given)."""

    name: str = Field(pattern=r"^[a-z]([-a-z0-9]{0,43}[a-z0-9])?$", description="the sweep's name")
    trial: int = Field(ge=1, le=100_000, description="the trial's number in its sweep")
    # Each is an environment variable twice (as given and as RESPAWN_PARAM_<NAME>): the env's checks.
    params: dict[Annotated[EnvName, Field(max_length=64)], Annotated[EnvValue, Field(max_length=1024)]] = Field(
        default={}, max_length=64)

    @field_validator("params")
    @classmethod
    def _one_name_each(cls, params: dict[str, str]) -> dict[str, str]:
        upper: dict[str, str] = {}
        for name in params:
            if (other := upper.setdefault(name.upper(), name)) != name:
                raise ValueError(f"{other!r} and {name!r} are both RESPAWN_PARAM_{name.upper()}; rename one")
        return params

    @property
    def env(self) -> dict[str, str]:
        """What the trial's environment gets: each parameter as RESPAWN_PARAM_<NAME> and as given."""
        out: dict[str, str] = {}
        for key, value in self.params.items():
            out["RESPAWN_PARAM_" + key.upper()] = out[key] = value
        return out


class JobSpec(Strict):
    name: str | None = Field(default=None, description="defaults to the job's folder name")
    project: str | None = Field(default=None, pattern=r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
    zones: tuple[Annotated[str, Field(pattern=r"^[a-z]+-[a-z]+\d+-[a-z]$")], ...] = Field(min_length=1, max_length=64)
    machine_type: str | None = Field(default=None, pattern=_NAME, description="a Compute Engine VM; or 'tpu'")
    accelerators: Accelerators | None = None
    tpu: Tpu | None = None  # a Cloud TPU VM slice instead of a VM (no machine_type then)
    # One model, or the order to step down in when capacity cannot be had (policy.fallback).
    provisioning: Annotated[tuple[Provisioning, ...], BeforeValidator(_provisioning_shape)] = Field(
        default=("spot",), max_length=3)
    # How an attempt's zone is chosen: the spec's order, or Compute's capacity advice over
    # the same zones (default for Spot, whose capacity and preemption rates vary by zone).
    placement: Literal["ordered", "capacity"] | None = None
    boot_disk: BootDisk = Field(default_factory=_default_boot)
    service_account: ServiceAccount = ServiceAccount()
    network: Network = Network()
    # Google allows 64 labels on a VM: the controller's own four (managed, job, attempt, shard) leave 60.
    labels: dict[LabelKey, LabelValue] = Field(default={}, max_length=60)
    # A container image the VM agent pulls and runs the command in (the VM's own account pulls it).
    image: str | None = Field(default=None, max_length=512,
                              description="e.g. us-central1-docker.pkg.dev/PROJECT/REPO/trainer:1")
    # Required without image; with one, optional: the image's own entrypoint and command run then.
    command: Annotated[str | tuple[str, ...] | None, BeforeValidator(_command_shape)] = None
    # A gs:// .tar.gz unpacked into the command's working directory. The CLI also takes a local
    # folder or file here: it packs and uploads it, and writes the gs:// URI in its place.
    code: str | None = Field(default=None, max_length=1024)
    env: dict[EnvName, EnvValue] = Field(default={}, max_length=512)
    nodes: int = Field(default=1, ge=1, le=MAX_NODES_PER_JOB)
    checkpoint: Checkpoint | None = None
    heartbeat_interval: Duration = timedelta(seconds=60)
    # Spot VMs: how long before the soft-off Compute warns through the metadata server (0s: none).
    # 120s by default: it costs nothing, and the replacement boots under it (see notice_for).
    preemption_notice: Duration | None = None
    notify: Notify | None = None
    sweep: SweepTrial | None = Field(default=None, description="the sweep this job is a trial of: respawn sweep "
                                                                "submit writes it")
    policy: JobPolicy = Field(default=JobPolicy(), validate_default=True)  # its idle_timeout is checked against heartbeat_interval

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str | None) -> str | None:
        if value is not None and (problem := job_name_problem(value)):
            raise ValueError(problem)
        return value

    @field_validator("zones")
    @classmethod
    def _distinct(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError("a zone is listed twice")
        return value

    @field_validator("code")
    @classmethod
    def _code_in_gcs(cls, value: str | None) -> str | None:
        if value is None or re.fullmatch(GCS_URI, value):
            return value
        if "://" not in value:
            raise ValueError("a local path is packed and uploaded by the CLI only: submit this spec with "
                             "`respawn submit SPEC` (or `--workdir DIR`), which uploads it to "
                             "gs://BUCKET/code/<sha256>.tar.gz and submits that URI; a spec written to the "
                             "bucket directly needs a gs:// URI of a .tar.gz")
        raise ValueError("expected a gs:// URI of a .tar.gz (gs://BUCKET/PATH), or a local folder given to "
                         "`respawn submit`")

    @field_validator("accelerators")
    @classmethod
    def _not_built_in(cls, value: Accelerators | None, info: ValidationInfo) -> Accelerators | None:
        machine = info.data.get("machine_type")
        if value is not None and machine and (built := built_in_gpus(machine)):
            gpu, count = built
            raise ValueError(
                f"machine type {machine!r} comes with {count} {gpu} GPU(s) built in, and Compute Engine "
                "refuses accelerators added to it; remove 'accelerators' (or use an N1 machine type to attach GPUs)"
            )
        return value

    @field_validator("labels")
    @classmethod
    def _not_ours(cls, value: dict[str, str]) -> dict[str, str]:
        reserved = sorted(k for k in value if k.startswith("respawn-"))
        if reserved:
            raise ValueError(f"labels starting with 'respawn-' are the controller's: {reserved}")
        return value

    @field_validator("image")
    @classmethod
    def _an_image_reference(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                imageref.artifact(imageref.parse(value))  # Artifact Registry's: PROJECT/REPOSITORY/IMAGE too
            except ValueError as e:
                raise ValueError(f"{e}; e.g. us-central1-docker.pkg.dev/PROJECT/REPO/trainer:1") from None
        return value

    @model_validator(mode="after")
    def _something_to_run(self) -> JobSpec:
        """A command, or an image whose own entrypoint runs; an image job's boot disk carries a runtime."""
        if self.command is None and self.image is None:
            raise FieldProblem("command", "required: the bash line (or list of arguments) the VM runs; or give "
                                          "'image' and the image's own entrypoint and command run")
        given = {**{f"env.{k}": v for k, v in self.env.items()},
                 **{f"sweep.params.{k}": v for k, v in (self.sweep.params if self.sweep else {}).items()}}
        if self.image is not None and (broken := next((k for k, v in given.items() if "\n" in v or "\r" in v), None)):
            raise FieldProblem(broken, "holds a line break, which a container's environment cannot take (an env "
                                       "file holds one line a variable); put the text in a file under 'code' and "
                                       "pass its path")
        if self.image is not None and "boot_disk" not in self.model_fields_set and self.tpu is None:
            family, project = CONTAINER_BOOT_GPU if self.gpus_per_node else CONTAINER_BOOT
            object.__setattr__(self, "boot_disk", BootDisk(image_family=family, image_project=project))
        return self

    @field_validator("command")
    @classmethod
    def _runnable(cls, value: str | tuple[str, ...] | None) -> str | tuple[str, ...] | None:
        if value is None:
            return value
        parts = (value,) if isinstance(value, str) else value
        if any("\x00" in p for p in parts):
            raise ValueError("contains a NUL character, which no command line can hold")
        if sum(len(p.encode("utf-8", "surrogatepass")) + 1 for p in parts) > MAX_COMMAND_BYTES:
            raise ValueError(f"longer than {MAX_COMMAND_BYTES // 1024} KiB; put long scripts in 'code'")
        return value

    @field_validator("env")
    @classmethod
    def _fits_metadata(cls, value: dict[str, str]) -> dict[str, str]:
        if len(render_env(value).encode("utf-8", "surrogatepass")) > MAX_ENV_BYTES:
            raise ValueError(
                f"all variables together exceed {MAX_ENV_BYTES // 1024} KiB of instance metadata; "
                "pass large data through a file under 'code' or gs://"
            )
        return value

    @model_validator(mode="after")
    def _sweep_env_fits_metadata(self) -> JobSpec:
        if self.sweep is not None and len(render_env({**self.env, **self.sweep.env}).encode(
                "utf-8", "surrogatepass")) > MAX_ENV_BYTES:
            raise FieldProblem("sweep.params", f"with env, the parameters exceed {MAX_ENV_BYTES // 1024} KiB of "
                                               "instance metadata; fewer or shorter parameters")
        return self

    @field_validator("provisioning")
    @classmethod
    def _models_once(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError("a model is listed twice; list each of spot, standard, flex-start at most once")
        return value

    @model_validator(mode="after")
    def _provisioning_fits(self) -> JobSpec:
        policy = self.policy
        if "flex-start" in self.provisioning:
            if policy.max_run_duration is None:
                raise FieldProblem("policy.max_run_duration", "required with flex-start: Compute runs a Flex-start "
                                   f"VM for at most this long (up to {FLEX_MAX_RUN.days}d); e.g. '7d'")
            if self.nodes > 1:
                raise FieldProblem("provisioning", "flex-start is for single-VM jobs here: a gang's nodes "
                                   "would wait for capacity one by one; use spot or standard for nodes > 1")
        if policy.max_run_duration is not None and policy.max_run_duration > FLEX_MAX_RUN:
            raise FieldProblem("policy.max_run_duration", f"at most {FLEX_MAX_RUN.days}d (Compute's limit)")
        if policy.max_run_duration is not None and policy.max_run_duration < FLEX_MIN_RUN:
            raise FieldProblem("policy.max_run_duration", f"at least {FLEX_MIN_RUN.seconds}s: a Flex-start VM "
                               "runs this long before Compute deletes it; e.g. '7d'")
        if policy.max_run_duration is not None and "flex-start" not in self.provisioning:
            raise FieldProblem("policy.max_run_duration", "only with flex-start in provisioning; "
                               "for a deadline on the whole job use policy.max_runtime")
        if policy.fallback is not None and len(self.provisioning) < 2:
            raise FieldProblem("policy.fallback", "only with a provisioning list to step down, "
                               "e.g. 'provisioning: [spot, standard]'; remove it or list a second model")
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _machine_named(cls, data: Any, handler: Any) -> Any:
        """A spec with neither ``machine_type`` nor ``tpu`` and other problems too: the missing
        machine type is one of them (``_vm_or_tpu`` runs only once every field is valid)."""
        try:
            return handler(data)
        except ValidationError as e:
            found = e.errors()
            if not isinstance(data, dict) or data.get("machine_type") is not None or data.get("tpu") is not None \
                    or any(err["loc"][:1] == ("machine_type",) for err in found):
                raise
            missing = {"type": "missing", "loc": ("machine_type",), "input": data}
            details = [{k: err[k] for k in ("type", "loc", "input", "ctx") if k in err} for err in found]
            raise ValidationError.from_exception_data(e.title, [*details, missing]) from None  # type: ignore[list-item]

    @model_validator(mode="after")
    def _vm_or_tpu(self) -> JobSpec:
        """A job runs on VMs (``machine_type``) or on a TPU slice (``tpu``), never both."""
        if self.tpu is None:
            if self.machine_type is None:
                raise FieldProblem("machine_type", "required: a Compute Engine machine type (e.g. g2-standard-8), "
                                   "or a 'tpu' block (type, runtime_version) for a Cloud TPU VM")
            return self
        fixed = {"machine_type": "the TPU's type sets its hosts", "accelerators": "a TPU has its chips",
                 "boot_disk": "the runtime version sets the TPU VM's image"}
        if self.tpu.api == "compute":
            fixed = {"machine_type": "write the TPU machine type as tpu.machine_type",
                     "accelerators": "a TPU machine type has its chips"}
        if given := next((f for f in fixed if f in self.model_fields_set and getattr(self, f) is not None), None):
            raise FieldProblem(given, f"not with 'tpu' ({fixed[given]}); remove it")
        if self.nodes != 1:
            raise FieldProblem("nodes", "a TPU slice is one node, however many hosts it spans: size it with "
                               "tpu.type (e.g. v4-32) or tpu.topology (e.g. 2x2x2), and remove 'nodes'")
        if self.tpu.machine is not None:
            return self._tpu_in_compute(self.tpu.machine)
        if "flex-start" in self.provisioning:
            raise FieldProblem("provisioning", "flex-start is for Compute Engine VMs; a TPU is spot or standard "
                               "(tpu.queued: true waits in Google's queue for capacity instead)")
        if self.placement == "capacity":
            raise FieldProblem("placement", "capacity advice covers Compute Engine VMs, not TPUs; "
                               "use 'ordered' (the zones' order) or remove it")
        return self

    def _tpu_in_compute(self, machine: tpus.TpuMachine) -> JobSpec:
        """A TPU machine type in Compute Engine: offered in every zone listed; its boot image Google's."""
        if missing := [z for z in self.zones if z not in machine.zones]:
            raise FieldProblem("zones", f"{machine.name} is not offered in {', '.join(missing)}; it is offered in "
                               f"{', '.join(machine.zones)} (Google's TPU regions and zones page)")
        if self.placement == "capacity":
            raise FieldProblem("placement", "Compute's capacity advice does not cover TPUs (Google: 'you can't "
                               "view the availability of TPUs'); use 'ordered' (the zones' order) or remove it")
        if "boot_disk" not in self.model_fields_set:
            object.__setattr__(self, "boot_disk", BootDisk(image_family=machine.image_family,
                                                           image_project=tpus.IMAGE_PROJECT))
        return self

    @property
    def fallback(self) -> Fallback:
        return self.policy.fallback or Fallback()

    def placement_for(self, model: str) -> str:
        """The placement an attempt on ``model`` uses: the spec's, else capacity for Spot."""
        if self.tpu is not None:
            return "ordered"  # Compute's capacity advice does not cover TPUs
        return self.placement or ("capacity" if model == "spot" else "ordered")

    @field_validator("preemption_notice")
    @classmethod
    def _a_notice_google_takes(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value not in NOTICES:
            raise ValueError("Compute takes 0s (no notice) or 120s (the Preview's only other value); "
                             "write 120s or 0s")
        return value

    @model_validator(mode="after")
    def _notice_for_spot(self) -> JobSpec:
        if self.preemption_notice and "spot" not in self.provisioning:
            raise FieldProblem("preemption_notice", "only Spot VMs get a preemption notice; "
                               "remove it, or list spot in provisioning")
        if self.preemption_notice and self.tpu is not None:
            raise FieldProblem("preemption_notice", "TPU slices take no preemption notice here (Cloud TPU nodes "
                               "have none; Google does not document one for TPU machine types); remove it")
        return self

    def notice_for(self, model: str) -> int:
        """Seconds of preemption notice an attempt on ``model`` asks Compute for: 120 for a Spot VM
        unless the spec says 0s (a project that refuses the Preview field gets none: the status says
        so, ``JobStatus.notice_refused``); never for a TPU node or another model."""
        if model != "spot" or self.tpu is not None:
            return 0
        return int((DEFAULT_NOTICE if self.preemption_notice is None else self.preemption_notice).total_seconds())

    @field_validator("heartbeat_interval")
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value < timedelta(seconds=1):
            raise ValueError("must be at least 1s")
        return value

    @field_validator("policy")
    @classmethod
    def _heartbeats_fit(cls, value: JobPolicy, info: ValidationInfo) -> JobPolicy:
        interval = info.data.get("heartbeat_interval")
        if value.idle_timeout is not None and interval is not None and value.idle_timeout < 2 * interval:
            raise FieldProblem(
                "idle_timeout",
                f"must be at least twice heartbeat_interval ({_seconds(interval)}): a beat takes its interval "
                "plus an upload, so anything shorter makes a healthy VM look hung; "
                "raise it or set it to null to disable hang detection",
            )
        return value

    @property
    def command_line(self) -> str:
        """The command as one shell line (a list is quoted element by element); "" for an image's own."""
        if self.command is None:
            return ""
        return self.command if isinstance(self.command, str) else shlex.join(self.command)

    @property
    def gpus_per_node(self) -> tuple[str, int] | None:
        """(GPU type, count) on each VM: built into the machine type, else ``accelerators``."""
        if self.machine_type is None:
            return None
        if built := built_in_gpus(self.machine_type):
            return built
        return (self.accelerators.type, self.accelerators.count) if self.accelerators else None

    @property
    def total_gpus(self) -> int:
        """GPUs of the whole job: nodes x GPUs per node."""
        per_node = self.gpus_per_node
        return self.nodes * (per_node[1] if per_node else 0)


def render_env(env: dict[str, str]) -> str:
    """The ``respawn-env`` metadata value: lines the startup script evaluates, values quoted."""
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items()))


def _seconds(value: timedelta) -> str:
    return f"{int(value.total_seconds())}s"


DOCUMENT = "spec.yaml"  # what problems call the whole document: its name in the bucket


class SpecError(ValueError):
    """A spec that cannot be run; ``problems`` holds one readable line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems

    def named(self, source: str) -> SpecError:
        """The same problems, the document called ``source`` (a local file's name) in place of
        ``spec.yaml``, which is what it is called in the bucket (jobs/<job>/spec.yaml)."""
        return SpecError([f"{source}{p[len(DOCUMENT):]}" if p.startswith(DOCUMENT) else p for p in self.problems])


def parse_spec(raw: bytes | str, job: str) -> JobSpec:
    """Parse and validate the spec stored under ``jobs/<job>/``; raise SpecError, and nothing else."""
    try:
        return _parse(raw, job)
    except SpecError:
        raise
    except RecursionError as e:
        raise _too_deep() from e
    except Exception as e:  # anything unforeseen in a hostile file is that file's problem, not the pass's
        raise SpecError([f"spec.yaml: could not be read ({type(e).__name__}: {_clip(str(e), 120)}); "
                         "write it as plain YAML or JSON with the fields of the spec reference"]) from e


def _parse(raw: bytes | str, job: str) -> JobSpec:
    if problem := job_name_problem(job):
        raise SpecError([_one_line(f"name: {_clip(problem, 300)}; rename the job's folder")])
    data = load_document(raw)
    if not isinstance(data, dict):
        got = "nothing (the file is empty)" if data is None else type(data).__name__
        raise SpecError([f"spec.yaml: expected a mapping of fields, got {got}"])
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as e:
        errors = e.errors()
        lines = [_describe(err) for err in errors[:MAX_PROBLEMS]]
        if len(errors) > MAX_PROBLEMS:
            lines.append(f"spec.yaml: {len(errors) - MAX_PROBLEMS} more problems not shown; fix the ones above first")
        raise SpecError(lines) from e
    if spec.name is not None and spec.name != job:
        raise SpecError([f"name: {spec.name!r} does not match the job's folder {job!r}; make them equal"])
    return spec.model_copy(update={"name": job})


# -- reading YAML or JSON, bounded ------------------------------------------------------


class _Unbounded(yaml.composer.ComposerError):
    """Valid YAML, maybe, but more than a spec may hold."""


class _BoundedComposer(Composer):
    """PyYAML's composer, refusing to nest deeper than MAX_DEPTH or to compose more than MAX_NODES values.

    The composer is recursive (a RecursionError at ``[`` x 1000 in pure Python; libyaml's
    own C composer crashes the process outright), so it is always this Python one, fed
    by libyaml's C parser when available (iterative, and 3x faster) or by PyYAML's.
    """

    def __init__(self) -> None:
        super().__init__()
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        self._nodes += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _too_deep(self.peek_event().start_mark)  # type: ignore[attr-defined]
            if self._nodes > MAX_NODES:  # stop early: composing costs microseconds per value
                mark = self.peek_event().start_mark  # type: ignore[attr-defined]
                raise _Unbounded(None, None, f"more than {MAX_NODES} values; a job spec needs far fewer", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _PythonLoader(Reader, Scanner, Parser, _BoundedComposer, SafeConstructor, Resolver):  # type: ignore[misc]
    """PyYAML's own scanner and parser: no nesting bound of their own (nor libyaml 0.2.5's)."""

    def __init__(self, stream: Any) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        _BoundedComposer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)


if CParser is not None:

    class _CLoader(_BoundedComposer, CParser, SafeConstructor, Resolver):  # type: ignore[misc]
        """libyaml's scanner and parser (0.2.6 refuses nesting past 1,000 levels itself)."""

        def __init__(self, stream: Any) -> None:
            CParser.__init__(self, stream)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            _BoundedComposer.__init__(self)

    _BoundedLoader: type = _CLoader
else:  # pragma: no cover - PyYAML without libyaml
    _BoundedLoader = _PythonLoader


def load_document(raw: bytes | str) -> Any:
    """One YAML (or JSON) document as Python data; SpecError when it is not safe to walk.

    Bounded before anything walks it: its size, its nesting, the node count after
    expanding aliases (a "billion laughs" document is a few hundred bytes), cycles
    made with aliases, and keys given twice.
    """
    size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
    if size > MAX_SPEC_BYTES:
        raise SpecError([f"spec.yaml: {size} bytes is larger than the limit of {MAX_SPEC_BYTES // 1024} KiB; "
                         "keep the spec small and put data in 'code' or gs://"])
    try:
        loader = _BoundedLoader(raw)  # a str is encoded, or checked for unprintable characters, right here
    except yaml.YAMLError as e:
        raise SpecError([f"spec.yaml: not valid YAML or JSON: {_yaml_where(e)}"]) from e
    except UnicodeError as e:
        raise SpecError([f"spec.yaml: not valid UTF-8 text ({_clip(str(e), 100)})"]) from e
    try:
        try:
            node = loader.get_single_node()
        except _Unbounded as e:
            raise SpecError([f"spec.yaml: {_yaml_where(e)}"]) from e
        except yaml.YAMLError as e:
            if _LIBYAML_TOO_DEEP in str(getattr(e, "problem", "")):
                raise _too_deep(getattr(e, "problem_mark", None)) from e
            raise SpecError([f"spec.yaml: not valid YAML or JSON: {_yaml_where(e)}"]) from e
        if node is None:
            return None
        _check_graph(node)
        try:
            return loader.construct_document(node)
        except yaml.YAMLError as e:
            raise SpecError([f"spec.yaml: not valid YAML or JSON: {_yaml_where(e)}"]) from e
        except (ValueError, TypeError, OverflowError) as e:  # e.g. an integer of 5000 digits
            raise SpecError([f"spec.yaml: a value could not be read: {_clip(str(e), 120)}"]) from e
    finally:
        loader.dispose()


_SET_TAG = "tag:yaml.org,2002:set"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_Where = tuple[Any, Any] | None  # (parent's where, index or key node): a path, built only to report it


def _check_graph(root: yaml.Node) -> None:
    """Size and depth after alias expansion, alias cycles and duplicate keys, without recursion.

    Aliases make the node graph a DAG (or a cycle), so sizes are memoized per node: the
    work is linear in the document while the counted size is the expanded one.
    """
    size: dict[int, int] = {}  # scalars are left out: 1 each
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, _Where, bool]] = [(root, None, False)]
    while stack:
        node, where, finished = stack.pop()
        key = id(node)
        if finished:
            on_path.discard(key)
            total, deepest = 1, 0
            for kid in _kids(node):
                total += size.get(id(kid), 1)
                deepest = max(deepest, depth.get(id(kid), 1))
            size[key], depth[key] = total, deepest + 1
            if total > MAX_NODES:
                raise SpecError([f"{_path(where)}: expands to more than {MAX_NODES} values (YAML aliases); "
                                 "write the values out instead of repeating aliases"])
            if deepest + 1 > MAX_DEPTH:
                raise SpecError([f"{_path(where)}: nested more than {MAX_DEPTH} levels deep (YAML aliases)"])
            continue
        if key in size or isinstance(node, yaml.ScalarNode):
            continue
        if node.tag == _SET_TAG:
            raise SpecError([f"{_path(where)}: YAML sets (!!set) are not accepted; use a list"])
        if isinstance(node, yaml.MappingNode):
            _no_duplicates(node, where)
        on_path.add(key)
        stack.append((node, where, True))
        for kid, label in _labelled_kids(node):
            if id(kid) in on_path:
                raise SpecError([f"{_path((where, label))}: a YAML alias refers to a value that contains it; "
                                 "write the value out"])
            if not isinstance(kid, yaml.ScalarNode) and id(kid) not in size:
                stack.append((kid, (where, label), False))


def _kids(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return node.value  # type: ignore[no-any-return]
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _labelled_kids(node: yaml.Node) -> list[tuple[yaml.Node, Any]]:
    if isinstance(node, yaml.SequenceNode):
        return list(zip(node.value, range(len(node.value))))
    return [(part, k) for k, v in node.value for part in (k, v)]


def _path(where: _Where) -> str:
    """The field path of a place in the document, for a message: ``policy.backoff``."""
    parts: list[str] = []
    while where is not None:
        where, label = where
        if isinstance(label, yaml.Node):
            label = label.value if isinstance(label, yaml.ScalarNode) else "<key>"
        parts.append(_segment(label))
    return _clip(".".join(reversed(parts)), 80) or "spec.yaml"


def _no_duplicates(node: yaml.MappingNode, where: _Where) -> None:
    seen: dict[str, int] = {}
    for k, _ in node.value:
        if isinstance(k, yaml.ScalarNode) and k.tag != _MERGE_TAG:
            line = k.start_mark.line + 1
            if k.value in seen:
                raise SpecError([f"{_path((where, k))}: given twice (lines {seen[k.value]} and {line}); keep one"])
            seen[k.value] = line


def _segment(part: Any) -> str:
    """One part of a field path, printable on one line: ``env``, ``0``, ``'bad key'``."""
    text = str(part) if isinstance(part, (str, int)) and not isinstance(part, bool) else repr(part)
    if re.fullmatch(r"[A-Za-z0-9_\-]{1,64}", text):
        return text
    return ascii(_clip(text, 40))


# libyaml 0.2.6 (PyYAML 6.0.4's wheels) refuses nesting past 1,000 levels in its own
# scanner, before the composer sees a node: a ScannerError "while increasing flow (or
# block) level, exceeded maximum nesting depth". 0.2.5 and the pure-Python parser have no
# such bound, and the composer above refuses first. Either way the user reads one message.
_LIBYAML_TOO_DEEP = "maximum nesting depth"


def _too_deep(mark: yaml.Mark | None = None) -> SpecError:
    """The one message for a spec nested past MAX_DEPTH, whichever layer noticed."""
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return SpecError([f"spec.yaml: nested more than {MAX_DEPTH} levels deep{where}; a job spec nests 4 levels, "
                      "so write it as a plain mapping of the spec's fields"])


def _yaml_where(error: yaml.YAMLError) -> str:
    if isinstance(error, yaml.reader.ReaderError):  # its str() spans lines
        char = error.character
        shown = f" {char!r}" if isinstance(char, str) else ""
        if isinstance(char, int) and char >= 0:
            shown = f" #x{char:04x}"
        return f"{error.reason}: character{shown} at position {error.position}"
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    if context := getattr(error, "context", None):
        # Where the thing that went wrong began (an unclosed quote or bracket): the problem's own
        # mark is where the parser gave up, often the end of the file.
        start = getattr(error, "context_mark", None)
        began = f" (begun at line {start.line + 1}, column {start.column + 1})" if start and (
            not mark or (start.line, start.column) != (mark.line, mark.column)) else ""
        problem = f"{context}{began}, {problem}"
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return _clip(_one_line(str(problem)), 160) + where


# -- describing validation errors ----------------------------------------------------------


# What each pattern of the schema asks for, in words with an example: a raw regular expression
# ('^[a-z]+-[a-z]+\d+-[a-z]$') tells a user little.
_PATTERN_WORDS = {
    GCS_URI: "a gs:// URI such as gs://my-bucket/runs/llm",
    _NAME: "a name of lowercase letters, digits and dashes, starting with a letter (g2-standard-8, nvidia-l4, debian-12)",
    _RESOURCE: "a resource name, path or URL, such as projects/debian-cloud/global/images/family/debian-12",
    _LABEL_RE: "lowercase letters, digits, dashes and underscores, starting with a letter, such as team_ml",
    TPU_TYPE: "a TPU type such as v4-16 or v5litepod-8",
    r"^[a-z0-9][-a-z0-9.]{0,62}$": "a version of lowercase letters, digits, dots and dashes, such as tpu-ubuntu2204-base",
    r"^[a-z][-a-z0-9.:]{0,127}$": "a project id such as debian-cloud",
    r"^(default|[-A-Za-z0-9_.+]{1,64}@[-a-z0-9.]{1,253})$":
        "a service account's email, such as trainer@my-proj.iam.gserviceaccount.com, or default",
    r"^[-A-Za-z0-9_.:/]{1,256}$": "an OAuth scope such as https://www.googleapis.com/auth/cloud-platform",
    r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$": "a network tag of lowercase letters, digits and dashes, such as trainer",
    r"^projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/topics/[A-Za-z][-A-Za-z0-9_.~+%]{2,254}$":
        "a topic such as projects/my-proj/topics/respawn-events",
    r"^[-_a-z0-9]{0,63}$": "lowercase letters, digits, dashes and underscores, at most 63",
    r"^[A-Za-z_][A-Za-z0-9_]{0,127}$": "a variable name of letters, digits and underscores, such as BATCH_SIZE",
    r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$": "a project id: 6 to 30 lowercase letters, digits and dashes, such as my-proj",
    r"^[a-z]+-[a-z]+\d+-[a-z]$": "a zone such as us-central1-a (a region and a letter)",
    r"^[a-z]([-a-z0-9]{0,43}[a-z0-9])?$": "a sweep's name of lowercase letters, digits and dashes, such as lr-search",
}


def _describe(err: Any) -> str:
    about_key = "[key]" in err["loc"]
    loc = tuple(p for p in err["loc"] if p != "[key]")
    problem = (err.get("ctx") or {}).get("error")
    if isinstance(problem, FieldProblem):
        loc = (*loc, *problem.field.split("."))
    path = ".".join(_segment(p) for p in loc) or "spec.yaml"
    if err["type"] == "extra_forbidden":
        return _one_line(f"{path}: unknown field{_suggest(loc)}")
    if err["type"] == "missing":
        return f"{path}: required field is missing"
    if err["type"] == "invalid_key":
        return f"{path}: field names must be text"
    got = err.get("input")
    message = err["msg"].removeprefix("Value error, ").replace("valid tuple", "list")
    secret = loc[-2:] == ("notify", "webhook")  # a webhook URL's path is its credential
    quiet = about_key or secret or isinstance(got, (dict, list, tuple, set)) or isinstance(problem, FieldProblem)
    if secret and err["type"] == "string_pattern_mismatch":
        message = "not a webhook URL respawn accepts: https://HOST/PATH, the host letters, digits, dots and dashes"
    elif err["type"] == "string_pattern_mismatch" and (words := _PATTERN_WORDS.get((err.get("ctx") or {}).get("pattern"))):
        message = f"should be {words}"
    shown = "" if quiet else f" (got {_shown(got)})"
    return _one_line(f"{path}: {_clip(message, 300)}{shown}")


def _shown(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**18:
        return "a huge number"
    return _clip(repr(value), 60)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _one_line(text: str) -> str:
    """No line breaks or control characters: one problem is exactly one line."""
    return re.sub(r"[\x00-\x1f\x7f\u2028\u2029\x85]", lambda m: ascii(m.group())[1:-1], text)


def _suggest(loc: tuple[Any, ...]) -> str:
    """'; did you mean ...' from the fields of the model the unknown field sits in first, then from
    every other field path of the spec (``max_restart`` at the top level: ``policy.max_restarts``)."""
    model: Any = JobSpec
    for part in loc[:-1]:
        model = _submodel(getattr(model, "model_fields", {}).get(part))
        if model is None:
            return ""
    fields = sorted(getattr(model, "model_fields", {}))
    typo, here = str(loc[-1]), tuple(str(p) for p in loc[:-1])
    current = difflib.get_close_matches(typo, fields, n=1)
    # Elsewhere: closer than the current level's match, and nearly as close as the best found.
    floor = max(0.6, difflib.SequenceMatcher(None, typo, current[0]).ratio() + 1e-9 if current else 0.0)
    scored = sorted((-difflib.SequenceMatcher(None, typo, path[-1]).ratio(), len(path), path)
                    for path in _field_paths() if path[:-1] != here)
    elsewhere = [path for score, _, path in scored if -score >= floor and score <= scored[0][0] + 0.1]
    close = [repr(f) for f in current] + [repr(".".join(path)) + (" at the top level" if len(path) == 1 else "")
                                          for path in elsewhere[: _SUGGESTIONS - len(current)]]
    hint = f"; did you mean {close[0] if len(close) == 1 else ', '.join(close[:-1]) + ' or ' + close[-1]}?" \
        if close else ";"
    return f"{hint} accepted: {', '.join(fields)}"


_SUGGESTIONS = 3  # at most this many fields offered for one unknown field


def _submodel(field: Any) -> Any:
    """The model a field holds (``Tpu`` for ``tpu: Tpu | None``), or None."""
    annotation = getattr(field, "annotation", None)
    candidates = [a for a in getattr(annotation, "__args__", (annotation,)) if isinstance(a, type)]
    return next((c for c in candidates if issubclass(c, BaseModel)), None)


@functools.cache
def _field_paths() -> tuple[tuple[str, ...], ...]:
    """Every field of the spec as a path: ``("zones",)``, ``("policy", "backoff", "initial")``..."""
    paths: list[tuple[str, ...]] = []

    def walk(model: Any, prefix: tuple[str, ...]) -> None:
        for name, field in model.model_fields.items():
            paths.append((*prefix, name))
            inner = _submodel(field)
            if inner is not None and len(prefix) < 8:  # the spec nests three deep; a bound all the same
                walk(inner, (*prefix, name))

    walk(JobSpec, ())
    return tuple(paths)
