"""What the CLI does with a sweep (controller.core.sweep): submit it, read its trials back best
first, cancel or remove all of them. The controller itself reads only the sweep's record and its
slots (controller.service.observe ``_with_slots``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import yaml

from controller.core import errors, ledger, names
from controller.core.spec import SpecError
from controller.core.state import JobStatus
from controller.core.sweep import (MAX_RECORD_BYTES, SWEEP_LIMIT_KEY, SweepFile, SweepRecord, Trial, record,
                                  trial_spec, trials)
from controller.service.jobs import Jobs, Refused



@dataclass
class Submitted:
    """What a submit wrote: each trial's spec generation, and the trials already there unchanged."""

    written: dict[str, int] = field(default_factory=dict)
    unchanged: list[str] = field(default_factory=list)


def specs(sw: SweepFile, base: dict[str, Any], jobs: Jobs) -> list[tuple[Trial, bytes]]:
    """Each trial and the spec it is submitted with, checked as ``respawn submit`` checks one
    (schema and the controller's policy): SpecError names the trial and the field."""
    out = []
    for trial in trials(sw):
        raw = yaml.safe_dump(trial_spec(base, sw, trial), sort_keys=False, allow_unicode=True).encode()
        try:
            jobs.check(raw, trial.job)
        except SpecError as e:
            raise SpecError([f"trial {trial.job}: {p}" for p in e.problems]) from e
        out.append((trial, raw))
    return out


def submit(jobs: Jobs, sw: SweepFile, base: dict[str, Any], prepared: list[tuple[Trial, bytes]]) -> Submitted:
    """The sweep's record first (every trial's admission reads it; its ``max_parallel`` also in its
    metadata, which the controller reads from the listing), then each trial's spec. Submitting the
    same sweep again changes nothing that is there; another sweep (trials, limits or base) under a
    name in use is refused before anything is written."""
    key = names.sweep_key(sw.name)
    mine = record(sw, base)
    body = mine.model_dump_json(indent=1).encode()
    if len(body) > MAX_RECORD_BYTES:
        raise Refused(f"sweep {sw.name!r}: its record would be {len(body) / 2**20:.1f} MiB, over "
                      f"{MAX_RECORD_BYTES // 2**20} MiB; fewer trials or shorter parameter values")
    try:
        there = SweepRecord.model_validate_json(jobs.store.read(jobs.bucket, key, limit=MAX_RECORD_BYTES).data)
    except errors.NotFound:
        there = None
    except ValueError:
        raise Refused(f"gs://{jobs.bucket}/{key} is not a sweep's record; remove it (gsutil rm) or name the sweep "
                      "otherwise") from None
    if there is not None and there != mine:
        raise Refused(f"sweep {sw.name!r} exists with other trials, limits or base spec; remove it first "
                      f"(respawn sweep rm {sw.name}) or give this one another name")
    if there is None:
        jobs.store.write(jobs.bucket, key, body, if_generation_match=0,
                         metadata={SWEEP_LIMIT_KEY: str(sw.max_parallel)})
    done = Submitted()
    for trial, raw in prepared:
        try:
            current = jobs.store.read(jobs.bucket, names.spec_key(trial.job)).data
        except errors.NotFound:
            current = None
        if current == raw:
            done.unchanged.append(trial.job)
            continue
        done.written[trial.job] = jobs.submit(raw, trial.job)
    return done


def read_record(jobs: Jobs, name: str) -> SweepRecord:
    try:
        return SweepRecord.model_validate_json(jobs.store.read(jobs.bucket, names.sweep_key(name),
                                                               limit=MAX_RECORD_BYTES).data)
    except errors.NotFound:
        # A read of a missing bucket's object is only "not found": a mistyped RESPAWN_BUCKET is said as
        # such (errors.NoSuchBucket, as every command says it), not as a sweep that is not there.
        jobs.bucket_there()
        raise Refused(f"no sweep named {name!r} in gs://{jobs.bucket} (respawn sweep submit FILE makes one)") from None
    except ValueError as e:
        raise Refused(f"gs://{jobs.bucket}/{names.sweep_key(name)} cannot be read as a sweep's record: "
                      f"{str(e).splitlines()[0]}") from None


def rows(record_: SweepRecord, status_of: Callable[[str], JobStatus | None], now: datetime) -> list[dict[str, Any]]:
    """Every trial of the sweep: its parameters, phase, losses (preemptions and the platform's other
    losses: the ledger's), cost and what it would have cost on demand, metric (a number or None) and
    the JSON its trainer wrote to RESPAWN_RESULT_FILE when it exited 0 (``result``, None while there
    is none); best first by the sweep's metric, then the trials without one, in their order.
    ``status_of``: a trial's status (the CLI reads it; the dashboard has it already)."""
    out = []
    for trial in record_.trials:
        status = status_of(trial.job)
        result = status.result if status is not None else None
        metric = _metric(result, record_.metric.key) if record_.metric else None
        total = ledger.summary(status.ledger, now) if status is not None else None
        out.append({"trial": trial.job, "number": trial.number, "params": dict(trial.params),
                    "phase": str(status.phase) if status else "NOT SUBMITTED",
                    "losses": total.losses if total else 0,
                    "cost_usd": round(total.cost, 6) if total else 0.0,
                    "on_demand_usd": round(total.on_demand_cost, 6) if total else 0.0,
                    "metric": metric, "result": result})
    if record_.metric is not None:
        sign = 1 if record_.metric.goal == "minimize" else -1
        out.sort(key=lambda r: (r["metric"] is None, sign * (r["metric"] or 0.0), r["number"]))
    return out


def summed(record_: SweepRecord, status_of: Callable[[str], JobStatus | None], now: datetime) -> dict[str, Any]:
    """The sweep as ``respawn report --sweep`` sums it: its trials by phase, and over all of them the
    accelerator-hours paid and useful (goodput), the losses, what it cost, and what Spot saved
    against on demand (each trial's ledger, ``ledger.summary``)."""
    phases: dict[str, int] = {}
    paid = useful = known = cost = on_demand = 0.0
    losses = 0
    for trial in record_.trials:
        status = status_of(trial.job)
        phase = str(status.phase) if status else "NOT SUBMITTED"
        phases[phase] = phases.get(phase, 0) + 1
        if status is None:
            continue
        total = ledger.summary(status.ledger, now)
        paid += total.accelerator_hours
        useful += total.useful_hours
        known += total.accelerator_hours - total.unknown_hours
        cost += total.cost
        on_demand += total.on_demand_cost
        losses += total.losses
    return {"sweep": record_.name, "trials": len(record_.trials), "phases": phases,
            "accelerator_hours": round(paid, 6), "useful_hours": round(useful, 6),
            "goodput": useful / known if known > 0 else None, "losses": losses,
            "cost_usd": round(cost, 6), "on_demand_usd": round(on_demand, 6), "saved_usd": round(on_demand - cost, 6)}


def totals(rows_: list[dict[str, Any]]) -> dict[str, float]:
    """What the sweep spent, what on demand would have cost, and what Spot saved."""
    spent = sum(r["cost_usd"] for r in rows_)
    on_demand = sum(r["on_demand_usd"] for r in rows_)
    return {"cost_usd": round(spent, 6), "on_demand_usd": round(on_demand, 6), "saved_usd": round(on_demand - spent, 6)}


def _metric(result: Any, key: str) -> float | None:
    """``result[key]`` as a number (a dotted key reads into nested objects); None when it is not one."""
    value = result
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)
