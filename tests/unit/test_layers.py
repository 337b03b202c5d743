"""The folders show the architecture, and this test holds them to it:

- ``controller/core``: the pure core (spec, status, world, actions, planner, transitions,
  policy, ledger...). It imports only the standard library, pydantic, PyYAML and itself: no
  cloud library, no service, no adapter, and it does no I/O and reads no clock (but the clock's).
- ``controller/service``: the imperative shell (observe, executor, engine, functions...). It
  reaches Google only through the ports; only its wiring (``bootstrap``, and ``logs``: Cloud
  Logging's handler) names a cloud library or the adapters.
- ``controller/adapters``: one per Google API (and the in-memory fakes).
- ``controller/render``: what respawn draws (plain text, the jobs table, the run report), for
  the CLI and the local cloud's demo alike: below both, it imports neither.
- ``controller/cli``: the ``respawn`` command.
- ``controller/dashboard``: ``respawn dashboard``'s web server, over the service like the CLI;
  only the CLI imports it (never the functions), and it imports neither the CLI nor the local cloud.

And no module imports, however indirectly, a module that imports it: each layer only looks down.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "controller"
CORE = sorted(p.stem for p in (ROOT / "core").glob("*.py") if p.stem != "__init__")
SERVICE = sorted(p.stem for p in (ROOT / "service").glob("*.py") if p.stem != "__init__")
CORE_MAY_IMPORT = ("__future__", "pydantic", "yaml", "controller.core")
CLOUD = ("google", "flask", "requests", "functions_framework", "cloudevents", "localcloud", "matplotlib",
         "controller.adapters", "controller.cli")


def imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    return found + [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]


def test_the_layers_are_where_the_architecture_says():
    assert {"spec", "state", "world", "actions", "planner", "transitions", "policy", "checkpoints", "names",
            "durations", "ledger", "notify"} <= set(CORE)
    assert {"observe", "executor", "engine", "functions", "bootstrap", "config", "notifier"} <= set(SERVICE)
    assert [p.name for p in ROOT.glob("*.py")] == ["__init__.py"], "modules live in the layers, not controller/"


@pytest.mark.parametrize("module", CORE)
def test_a_core_module_imports_only_the_standard_library_pydantic_yaml_and_the_core(module):
    outside = [m for m in imports(ROOT / "core" / f"{module}.py")
               if m.split(".")[0] not in sys.stdlib_module_names and not m.startswith(CORE_MAY_IMPORT)]
    assert not outside, f"controller/core/{module}.py imports {outside}"


@pytest.mark.parametrize("module", [m for m in SERVICE if m not in ("bootstrap", "logs")])
def test_a_service_module_reaches_google_only_through_the_ports(module):
    bad = [m for m in imports(ROOT / "service" / f"{module}.py") if m.startswith(CLOUD)]
    assert not bad, f"controller/service/{module}.py imports {bad}"


@pytest.mark.parametrize("module", [m for m in CORE if m != "clock"])
def test_the_core_does_no_io_and_reads_no_clock(module):
    source = (ROOT / "core" / f"{module}.py").read_text()
    for call in ("datetime.now(", "time.time(", "time.monotonic(", "os.environ", "subprocess", "socket"):
        assert call not in source, f"controller/core/{module}.py: {call}"
    assert not re.search(r"(?<!def )(?<![\w.])open\(", source), f"controller/core/{module}.py: open("


def _graph() -> dict[str, set[str]]:
    """Each module of the project's packages -> the project's modules it imports (at the top, in a
    function, or for type checking alike: a circle of any of them is a tangle)."""
    found: dict[str, set[str]] = {}
    for package in ("controller", "localcloud", "bench", "sim"):
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            tree = ast.parse(path.read_text())
            named = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
            named |= {f"{n.module}.{a.name}" for n in ast.walk(tree)
                      if isinstance(n, ast.ImportFrom) and n.module and not n.level for a in n.names}
            named |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            found[name] = named
    return {m: {d for d in deps if d in found and d != m and not m.startswith(d + ".")} for m, deps in found.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while (w := stack.pop()) != v:
                part.append(w)
            if part:
                circles.append(sorted([v, *part]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_module_imports_a_module_that_imports_it():
    assert _circles(_graph()) == []


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_what_respawn_draws_imports_neither_the_cli_nor_the_local_cloud():
    for path in (ROOT / "render").glob("*.py"):
        bad = [m for m in imports(path) if m.startswith(("controller.cli", "localcloud", "controller.service"))]
        assert not bad, f"controller/render/{path.name} imports {bad}"


def test_only_the_cli_imports_the_dashboard_and_the_dashboard_imports_no_cli():
    for path in ROOT.rglob("*.py"):
        if path.is_relative_to(ROOT / "cli") or path.is_relative_to(ROOT / "dashboard"):
            continue
        bad = [m for m in imports(path) if m.startswith("controller.dashboard")]
        assert not bad, f"{path.relative_to(REPO)} imports {bad}"
    for path in (ROOT / "dashboard").glob("*.py"):
        bad = [m for m in imports(path) if m.startswith(("controller.cli", "localcloud"))]
        assert not bad, f"controller/dashboard/{path.name} imports {bad}"
    assert not [m for m in imports(REPO / "main.py") if m.startswith("controller.dashboard")]
