"""The job spec: what a user drops at ``jobs/<job>/spec.yaml`` (YAML or JSON).

Strict on purpose: an unknown field is almost always a typo (``max_restart``) that
would otherwise silently fall back to a default on a job that costs money per hour.
Every problem is reported as ``field.path: what is wrong; what is accepted``.
"""

from __future__ import annotations

import difflib
import shlex
from datetime import timedelta
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from controller.durations import Duration
from controller.names import job_name_problem

GCS_URI = r"^gs://[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9](/.*)?$"
_LABEL_RE = r"^[a-z][-_a-z0-9]{0,62}$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Accelerators(Strict):
    type: str = Field(min_length=1, description="e.g. nvidia-l4, nvidia-tesla-a100")
    count: int = Field(default=1, ge=1, le=16)


class BootDisk(Strict):
    image: str | None = Field(default=None, description="image URL or projects/P/global/images/NAME")
    image_family: str | None = None
    image_project: str | None = None
    size_gb: int = Field(default=100, ge=10, le=65536)
    type: str = "pd-balanced"

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
    email: str = "default"
    scopes: tuple[str, ...] = ("https://www.googleapis.com/auth/cloud-platform",)


class Network(Strict):
    network: str = "global/networks/default"
    subnetwork: str | None = None
    external_ip: bool = True
    tags: tuple[Annotated[str, Field(pattern=r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")], ...] = ()


class Checkpoint(Strict):
    uri: str = Field(pattern=GCS_URI, description="gs:// prefix the trainer writes checkpoints under")
    format: Literal["auto", "orbax", "tensorflow", "lightning", "dcp", "files", "pointer"] = "auto"


class Backoff(Strict):
    initial: Duration = timedelta(seconds=30)
    max: Duration = timedelta(minutes=30)

    @model_validator(mode="after")
    def _ordered(self) -> Backoff:
        if self.max < self.initial:
            raise ValueError("'max' must be at least 'initial'")
        return self


class JobPolicy(Strict):
    max_restarts: int = Field(default=100, ge=0, description="recreations of any cause")
    max_failures: int = Field(default=3, ge=0, description="non-zero exits, crashes and stalls")
    max_runtime: Duration | None = Field(default=None, description="deadline for the whole job")
    max_instance_age: Duration | None = Field(default=None, description="recycle a VM older than this")
    idle_timeout: Duration | None = timedelta(minutes=30)
    startup_grace: Duration = timedelta(minutes=15)
    backoff: Backoff = Backoff()
    zone_cooldown: Duration = timedelta(minutes=10)
    crash_loop_failures: int = Field(default=3, ge=1, description="failures without checkpoint progress")
    termination_action: Literal["stop", "delete"] = "stop"


class JobSpec(Strict):
    name: str | None = Field(default=None, description="defaults to the job's folder name")
    project: str | None = Field(default=None, pattern=r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
    zones: tuple[Annotated[str, Field(pattern=r"^[a-z]+-[a-z]+\d+-[a-z]$")], ...] = Field(min_length=1)
    machine_type: str = Field(min_length=1)
    accelerators: Accelerators | None = None
    provisioning: Literal["spot", "standard"] = "spot"
    boot_disk: BootDisk = Field(default_factory=_default_boot)
    service_account: ServiceAccount = ServiceAccount()
    network: Network = Network()
    labels: dict[Annotated[str, Field(pattern=_LABEL_RE)], Annotated[str, Field(pattern=r"^[-_a-z0-9]{0,63}$")]] = {}
    command: str | tuple[str, ...] = Field(min_length=1)
    code: str | None = Field(default=None, pattern=GCS_URI)
    env: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = {}
    nodes: int = Field(default=1, ge=1)
    checkpoint: Checkpoint | None = None
    heartbeat_interval: Duration = timedelta(seconds=60)
    policy: JobPolicy = JobPolicy()

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

    @field_validator("labels")
    @classmethod
    def _not_ours(cls, value: dict[str, str]) -> dict[str, str]:
        reserved = sorted(k for k in value if k.startswith("respawn-"))
        if reserved:
            raise ValueError(f"labels starting with 'respawn-' are the controller's: {reserved}")
        return value

    @property
    def command_line(self) -> str:
        """The command as one bash line (a list is quoted element by element)."""
        return self.command if isinstance(self.command, str) else shlex.join(self.command)


class SpecError(ValueError):
    """A spec that cannot be run; ``problems`` holds one readable line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def parse_spec(raw: bytes | str, job: str) -> JobSpec:
    """Parse and validate the spec stored under ``jobs/<job>/``; raise SpecError."""
    if problem := job_name_problem(job):
        raise SpecError([f"name: {problem}; rename the job's folder"])
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise SpecError([f"spec.yaml: not valid YAML or JSON: {_yaml_where(e)}"]) from e
    if not isinstance(data, dict):
        raise SpecError([f"spec.yaml: expected a mapping of fields, got {type(data).__name__}"])
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError([_describe(err) for err in e.errors()]) from e
    if spec.name is not None and spec.name != job:
        raise SpecError([f"name: {spec.name!r} does not match the job's folder {job!r}; make them equal"])
    return spec.model_copy(update={"name": job})


def _yaml_where(error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem


def _describe(err: Any) -> str:
    path = ".".join(str(p) for p in err["loc"]) or "spec"
    if err["type"] == "extra_forbidden":
        return f"{path}: unknown field{_suggest(err['loc'])}"
    if err["type"] == "missing":
        return f"{path}: required field is missing"
    got = err.get("input")
    shown = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
    message = err["msg"].removeprefix("Value error, ").replace("valid tuple", "list")
    return f"{path}: {message}{shown}"


def _suggest(loc: tuple[Any, ...]) -> str:
    """'; did you mean ...' from the fields of the model the unknown field sits in."""
    model: Any = JobSpec
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        annotation = getattr(field, "annotation", None)
        candidates = [a for a in getattr(annotation, "__args__", (annotation,)) if isinstance(a, type)]
        model = next((c for c in candidates if issubclass(c, BaseModel)), None)
        if model is None:
            return ""
    fields = sorted(getattr(model, "model_fields", {}))
    close = difflib.get_close_matches(str(loc[-1]), fields, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{hint} accepted: {', '.join(fields)}"
