"""One bench run, one record: its figures beside the commit, the work tree's state, the start time,
the seeds and the machine they were measured on, all written by the run itself.

``make bench`` (``python -m bench``) runs every scenario of ``bench.__main__.SCENARIOS`` in one
process and writes ``bench/results.json`` once, when the last is over. A scenario run on its own
(``python -m bench --only NAME``, or its module's ``python -m bench.<module>``) writes
``bench/runs/<scenario>-<UTC time>.json`` with the same provenance, never results.json: a figure
there is always from the run the file names. Nothing in either file is edited by hand; a note that
explains a key is written by the code that writes the key.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results.json"
RUNS = Path(__file__).parent / "runs"
# What runs write: a results file left uncommitted does not make the code that measured it dirty.
OUTPUTS = ("bench/results.json", "bench/runs/")


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout


def dirty_paths() -> list[str] | None:
    """The paths where the work tree differs from HEAD (tracked changes, and untracked files git
    does not ignore), the bench's own outputs left out; None where git cannot say."""
    listed = _git("status", "--porcelain", "--untracked-files=all")
    if listed is None:
        return None
    paths = [line[3:].split(" -> ")[-1] for line in listed.splitlines() if len(line) > 3]
    return [p for p in paths if not p.startswith(OUTPUTS)]


def machine() -> dict[str, Any]:
    return {"cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "python": f"{platform.python_implementation()} {platform.python_version()}",
            "platform": platform.platform(), "arch": platform.machine()}


def load() -> float:
    """The 1-minute load average: other work on the CPUs moves every wall time measured here."""
    return round(os.getloadavg()[0], 2)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def provenance(command: list[str] | None = None, seeds: dict[str, Any] | None = None,
               scale: float = 1.0) -> dict[str, Any]:
    """Where a run's figures come from, taken when it starts."""
    head = _git("rev-parse", "HEAD")
    changed = dirty_paths()
    return {"commit": head.strip() if head else None, "dirty": None if changed is None else bool(changed),
            "dirty_paths": changed[:20] if changed else [], "started_at": now(),
            "command": " ".join(command if command is not None else ["python", "-m", *_module(), *sys.argv[1:]]),
            "seeds": seeds or {}, "scale": scale, "machine": machine(), "load_avg_1m_at_start": load()}


def _module() -> list[str]:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return [spec.name.removesuffix(".__main__")] if spec and spec.name else [sys.argv[0]]


def target(value: float | int | None, *, at_most: float | None = None, equals: float | None = None) -> dict[str, Any]:
    """A figure's target and whether this run met it (a figure not measured meets nothing)."""
    if at_most is not None:
        return {"at_most": at_most, "met": value is not None and value <= at_most}
    return {"equals": equals, "met": value is not None and value == equals}


def beside(figures: dict[str, Any], limits: dict[str, float]) -> dict[str, Any]:
    """``figures`` with ``<key>_target`` (at most ``limits[key]``) after each key that has one."""
    out: dict[str, Any] = {}
    for key, value in figures.items():
        out[key] = value
        if key in limits:
            out[f"{key}_target"] = target(value, at_most=limits[key])
    return out


def targets(found: dict[str, Any]) -> dict[str, list[str]]:
    """Every ``<key>_target`` of a run, sorted into met and missed; one beside no figure is an error."""
    out: dict[str, list[str]] = {"met": [], "missed": []}
    for key, value in found.items():
        if key.endswith("_target") and isinstance(value, dict) and "met" in value:
            figure = key.removesuffix("_target")
            if figure not in found:
                raise ValueError(f"{key}: a target beside no figure (no key {figure!r})")
            out["met" if value["met"] else "missed"].append(figure)
    return out


def run_file(scenario: str, started: str) -> Path:
    return RUNS / f"{scenario}-{started.replace(':', '').replace('-', '')}.json"


def write(path: Path, record: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def alone(scenario: str, found: dict[str, Any], head: dict[str, Any], wall_s: float,
          out: Path | None = None) -> Path:
    """A scenario run on its own: its provenance, its wall time and its keys, in a file of its own
    (``out``, or ``bench/runs/<scenario>-<UTC start>.json``), never results.json."""
    if out is not None and out.resolve() == RESULTS.resolve():
        raise ValueError(f"{RESULTS} is written by make bench alone; a scenario's run goes to bench/runs/")
    record = {**head, "finished_at": now(), "scenarios": {scenario: {"wall_s": round(wall_s, 1),
                                                                      "load_avg_1m_at_end": load()}},
              "targets": targets(found), **found}
    return write(out or run_file(scenario, head["started_at"]), record)
