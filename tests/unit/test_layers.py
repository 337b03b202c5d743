"""The core imports no cloud library, no web framework and nothing of the local cloud."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

CORE = ["actions", "advice", "checkpoints", "clock", "durations", "engine", "errors", "executor", "fanout", "launch", "names",
        "observe", "placement", "planner", "policy", "ports", "spec", "state", "transitions", "world", "jobs",
        "ledger", "prices", "notify", "notifier"]
FORBIDDEN = ("google", "flask", "requests", "functions_framework", "cloudevents", "localcloud", "controller.adapters.google",
             "controller.adapters.gcs", "controller.adapters.compute", "controller.adapters.tpu",
             "controller.adapters.pubsub", "controller.adapters.webhook", "matplotlib")
ROOT = Path(__file__).resolve().parents[2] / "controller"


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_no_cloud_library(module):
    tree = ast.parse((ROOT / f"{module}.py").read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    bad = [m for m in imported if m.startswith(FORBIDDEN)]
    assert not bad, f"controller/{module}.py imports {bad}"


def test_planner_does_no_io_and_reads_no_clock():
    source = "".join((ROOT / f"{m}.py").read_text() for m in ("planner", "transitions", "ledger", "prices", "notify"))
    for call in ("datetime.now(", "time.time(", "os.environ"):
        assert call not in source, call
    assert not re.search(r"(?<!def )(?<![\w.])open\(", source), "open("
