"""The locks: what `make test` installs and what `respawn deploy` ships are exact, hashed and the same.

requirements-dev.txt is the test environment (`make test`, `make demo`, CI);
requirements.txt is what Cloud Functions installs for main.py. Both come from `make lock`
(uv pip compile); pyproject.toml and requirements.in keep the ranges.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")


def locked(path: Path) -> dict[tuple[str, str], str]:
    """(package, marker) -> version, from a lock file; every pin must carry its hashes."""
    pins: dict[tuple[str, str], str] = {}
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if not line or line.startswith((" ", "#")):
            continue
        m = _PIN.match(line)
        assert m, f"{path.name}: {line!r} is not an exact pin (name==version)"
        assert i + 1 < len(lines) and lines[i + 1].strip().startswith("--hash=sha256:"), f"{path.name}: {line} has no hash"
        pins[canonicalize_name(m[1]), (m[3] or "").strip()] = m[2]
    return pins


def ranges(requirements: list[str]) -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in map(Requirement, requirements)}


def requirements_in() -> list[str]:
    return [line.split("#")[0].strip() for line in (ROOT / "requirements.in").read_text().splitlines()
            if line.split("#")[0].strip()]


PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
DEV = locked(ROOT / "requirements-dev.txt")
FUNCTIONS = locked(ROOT / "requirements.txt")


def test_the_deployed_functions_get_exactly_the_versions_the_tests_ran_on():
    assert FUNCTIONS, "requirements.txt pins nothing"
    for key, version in FUNCTIONS.items():
        assert DEV.get(key) == version, f"requirements.txt pins {key[0]}=={version}, requirements-dev.txt {DEV.get(key)}"


def test_the_functions_need_what_the_package_declares():
    """requirements.in is the package's own dependencies, less what only the CLI uses."""
    package = ranges(PYPROJECT["dependencies"])
    for name, req in ranges(requirements_in()).items():
        assert name in package, f"requirements.in has {name}; add it to pyproject.toml's dependencies"
        assert req.specifier == package[name].specifier, f"{name}: {req.specifier} here, {package[name].specifier} in pyproject.toml"
    cli_only = set(package) - set(ranges(requirements_in()))
    assert cli_only == {"typer", "rich", "matplotlib", "pathspec", "google-api-python-client", "prometheus-client"}, "a new dependency: the functions need it (requirements.in) or not"


@pytest.mark.parametrize("lock, wanted", [
    ("requirements.txt", requirements_in()),
    ("requirements-dev.txt", PYPROJECT["dependencies"] + PYPROJECT["optional-dependencies"]["local"]
     + [r for r in PYPROJECT["optional-dependencies"]["dev"] if not r.startswith("respawn")]),
])
def test_every_range_is_locked_at_a_version_inside_it(lock, wanted):
    pins = DEV if lock == "requirements-dev.txt" else FUNCTIONS
    for name, req in ranges(wanted).items():
        versions = [v for (pinned, _), v in pins.items() if pinned == name]
        assert versions, f"{lock} does not lock {name}; run make lock"
        assert all(req.specifier.contains(v, prereleases=True) for v in versions), f"{lock}: {name} {versions} outside {req.specifier}; run make lock"
