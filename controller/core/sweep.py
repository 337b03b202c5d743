"""A sweep: many trials of one job spec, each an ordinary respawn job with its own parameters.

A sweep file (``respawn sweep submit sweep.yaml``) names a base job spec (inline or a path the CLI
reads), ``parameters`` as a grid (every value a list: the trials are their product, in the order
given) or random draws (``count`` trials from ranges and choices, ``seed`` making them the same
every time), ``max_parallel`` (at most that many trials hold VMs at once: the controller admits
the rest as others finish) and an optional ``metric`` that orders the results.

Everything here is pure: the CLI expands the file into trials and writes each trial's spec
(``trial_spec``) and the sweep's record (``SweepRecord``, ``sweeps/<name>/sweep.json``); the
controller reads that record, never the sweep file.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from controller.core import names
from controller.core.spec import MAX_PROBLEMS, SpecError, load_document

MAX_TRIALS = 1000  # trials a sweep may make: each is a job with its own objects and VMs
MAX_PARALLEL = 256
SWEEP_LIMIT_KEY = "max_parallel"  # sweep.json's custom metadata: the controller reads it from the listing
MAX_RECORD_BYTES = 4 * 1024 * 1024  # what the controller and the CLI read of a sweep's record
PARAMETER = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"  # also an environment variable's name, as given
Scalar = str | int | Annotated[float, Field(allow_inf_nan=False)] | bool


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Range(_Strict):
    """A number drawn uniformly between ``min`` and ``max`` (``log``: uniformly in its logarithm;
    ``integer``: a whole number)."""

    min: float
    max: float
    log: bool = False
    integer: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if not (math.isfinite(self.min) and math.isfinite(self.max) and math.isfinite(self.max - self.min)):
            raise ValueError("min and max must be finite numbers, and so must max - min")
        if self.min > self.max:
            raise ValueError(f"min ({self.min:g}) is above max ({self.max:g}); swap them")
        if self.log and self.min <= 0:
            raise ValueError("a log range needs min > 0 (its logarithm is drawn)")
        return self

    def draw(self, rng: random.Random) -> Scalar:
        if self.log:
            value = math.exp(rng.uniform(math.log(self.min), math.log(self.max)))
        else:
            value = rng.uniform(self.min, self.max)
        if self.integer:
            return int(min(max(round(value), math.ceil(self.min)), math.floor(self.max)))
        return float(f"{value:.6g}")  # what the trial is given and what its row shows: the same number


class Choices(_Strict):
    """One of ``choices``, drawn uniformly."""

    choices: tuple[Scalar, ...] = Field(min_length=1, max_length=1000)

    def draw(self, rng: random.Random) -> Scalar:
        return self.choices[rng.randrange(len(self.choices))]


Values = Annotated[tuple[Scalar, ...], Field(min_length=1, max_length=1000)]
Parameter = Values | Range | Choices


class Metric(_Strict):
    key: str = Field(min_length=1, max_length=256, description="a key of the JSON the trial writes to RESPAWN_RESULT_FILE")
    goal: Literal["minimize", "maximize"] = "minimize"


class SweepFile(_Strict):
    name: str = Field(description="the sweep's name; its trials are <name>-<n>")
    base: str | dict[str, Any] = Field(description="the job spec every trial runs: a path, or the spec inline")
    parameters: dict[Annotated[str, Field(pattern=PARAMETER)], Parameter] = Field(min_length=1, max_length=64)
    count: int | None = Field(default=None, ge=1, le=MAX_TRIALS, description="random draws: how many trials")
    seed: int = Field(default=0, ge=0, description="random draws: the same seed makes the same trials")
    max_parallel: int = Field(default=4, ge=1, le=MAX_PARALLEL)
    metric: Metric | None = None

    @field_validator("name")
    @classmethod
    def _a_job_name_prefix(cls, name: str) -> str:
        # "<name>-<n>" must be a job name for every n the sweep can make.
        if problem := names.job_name_problem(f"{name}-{MAX_TRIALS}"):
            raise ValueError(problem.replace(f"{name}-{MAX_TRIALS}", name) +
                             f" (a trial is named <name>-<n>, so at most {names.MAX_JOB_NAME - 5} characters)")
        return name

    @model_validator(mode="after")
    def _grid_or_random(self) -> SweepFile:
        drawn = [k for k, v in self.parameters.items() if not isinstance(v, tuple)]
        if self.count is None and drawn:
            raise ValueError(f"parameters {', '.join(drawn)} are drawn (a range or choices): give 'count', the "
                             "number of random trials, or make every parameter a list for a grid")
        if self.count is None and (size := math.prod(len(v) for v in self.parameters.values())) > MAX_TRIALS:
            raise ValueError(f"the grid makes {size:,} trials; at most {MAX_TRIALS:,}: fewer values, or random draws "
                             "with 'count'")
        return self

    @property
    def grid(self) -> bool:
        return self.count is None


class Trial(BaseModel):
    """One trial: its job name, its number (from 1) and its parameters' values."""

    model_config = ConfigDict(frozen=True)
    job: str
    number: int
    params: dict[str, Scalar]


class SweepRecord(BaseModel):
    """``sweeps/<name>/sweep.json``: what the controller and ``respawn sweep status`` read of a
    sweep (written by the CLI before any trial's spec, so every trial finds it). ``base_sha256``:
    the base spec's, so that the same name with another base is another sweep, refused."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    name: str
    max_parallel: int = Field(ge=1, le=MAX_PARALLEL)
    metric: Metric | None = None
    trials: tuple[Trial, ...] = ()
    base_sha256: str = ""


def trials(sweep: SweepFile) -> list[Trial]:
    """The sweep's trials, the same every time: a grid's in the order of ``itertools.product``
    over the parameters as given; random draws from ``random.Random(seed)``, parameter by
    parameter in the order given, trial after trial."""
    names_ = list(sweep.parameters)
    if sweep.grid:
        rows = [dict(zip(names_, values)) for values in itertools.product(*sweep.parameters.values())]  # type: ignore[arg-type]
    else:
        rng = random.Random(sweep.seed)
        rows = [{k: _draw(v, rng) for k, v in sweep.parameters.items()} for _ in range(sweep.count or 0)]
    return [Trial(job=f"{sweep.name}-{n}", number=n, params=row) for n, row in enumerate(rows, start=1)]


def _draw(parameter: Parameter, rng: random.Random) -> Scalar:
    if isinstance(parameter, tuple):  # a list in a random sweep: one of its values
        return parameter[rng.randrange(len(parameter))]
    return parameter.draw(rng)


def env_value(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def trial_spec(base: Mapping[str, Any], sweep: SweepFile, trial: Trial) -> dict[str, Any]:
    """The job spec of ``trial``: the base, checkpoints under a prefix of its own, and its place in
    the sweep (``sweep``: its parameters, which the launch puts in its environment)."""
    doc = {k: v for k, v in base.items() if k != "name"}
    if isinstance(checkpoint := doc.get("checkpoint"), Mapping) and isinstance(checkpoint.get("uri"), str):
        doc["checkpoint"] = {**checkpoint, "uri": f"{checkpoint['uri'].rstrip('/')}/{trial.job}"}
    doc["sweep"] = {"name": sweep.name, "trial": trial.number,
                    "params": {k: env_value(v) for k, v in trial.params.items()}}
    return doc


def record(sweep: SweepFile, base: Mapping[str, Any] | None = None) -> SweepRecord:
    digest = hashlib.sha256(json.dumps(base, sort_keys=True, default=str).encode()).hexdigest() if base else ""
    return SweepRecord(name=sweep.name, max_parallel=sweep.max_parallel, metric=sweep.metric,
                       trials=tuple(trials(sweep)), base_sha256=digest)


def parse_sweep(raw: bytes | str, source: str = "sweep.yaml") -> SweepFile:
    """Parse and validate a sweep file; raise SpecError (each problem naming its field), nothing else."""
    data = load_document(raw)
    if not isinstance(data, dict):
        raise SpecError([f"{source}: expected a mapping of fields (name, base, parameters, ...)"])
    try:
        return SweepFile.model_validate(data)
    except ValidationError as e:
        errors = e.errors()
        lines = [f"{source}: {_where(err['loc'])}: {err['msg']}" for err in errors[:MAX_PROBLEMS]]
        if len(errors) > MAX_PROBLEMS:
            lines.append(f"{source}: {len(errors) - MAX_PROBLEMS} more problems not shown; fix the ones above first")
        raise SpecError(lines) from e


def is_sweep_file(raw: bytes | str) -> bool:
    """A sweep file given where a job spec is wanted (``respawn validate``, ``submit``): it has a
    ``base:`` or ``parameters:``, which no job spec has, and no ``zones:``, which every job spec has.
    Said in one line rather than as five unknown fields."""
    try:
        data = load_document(raw)
    except SpecError:
        return False  # parse_spec says what is wrong with it
    return isinstance(data, dict) and bool({"base", "parameters"} & data.keys()) and "zones" not in data


def _where(loc: tuple[Any, ...]) -> str:
    # pydantic names the union member it tried ("tuple[...]", "Range"): the field's path is what a person needs.
    parts = [str(p) for p in loc if not (isinstance(p, str) and (p[:1].isupper() or "[" in p))]
    return ".".join(parts) or "(the file)"
