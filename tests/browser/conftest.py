"""Browser tests: `respawn dashboard` in a real headless Chromium (Debian's `chromium` package, driven by
Playwright for Python), against the local cloud. They need the browser and Playwright, which the project's
lock does not hold: `make test-browser` installs both (apt for Chromium when it is missing, a pinned
playwright into the venv) and runs them with RESPAWN_BROWSER=1. Plain `make test` does not collect them.

Enabled but unable to run (no Chromium, no Playwright, a Chromium that does not start), the layer FAILS and
says why: a browser layer that skips itself would prove nothing while looking green. Never `playwright
install`: it downloads a browser of its own; these tests launch the system's."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ENABLED = os.environ.get("RESPAWN_BROWSER") == "1"
# Read here, at collection: tests/conftest.py takes every RESPAWN_* variable out of each test's environment.
CHROMIUM = os.environ.get("RESPAWN_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = Path(os.environ.get("RESPAWN_SCREENSHOTS") or Path(__file__).parent / "screenshots")

collect_ignore_glob = [] if ENABLED else ["test_*.py"]


def chromium_problem() -> str | None:
    """Why the system's Chromium cannot drive these tests, or None when it can."""
    found = CHROMIUM if os.path.isabs(CHROMIUM) else shutil.which(CHROMIUM)
    if not found or not os.access(found, os.X_OK):
        return (f"Chromium is not installed ({CHROMIUM} is missing): these tests drive Debian's `chromium` "
                "package; `make test-browser` installs it with apt-get when run as root with Debian's archive "
                "reachable (`sudo apt-get install chromium` otherwise), or set RESPAWN_CHROMIUM to a Chromium")
    try:
        version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=60,
                                 stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{found} --version did not run: {e}"
    if version.returncode != 0 or "Chromium" not in version.stdout + version.stderr:
        return f"{found} --version exited {version.returncode}: {(version.stdout + version.stderr)[-500:]}"
    return None


@pytest.fixture(scope="session")
def chromium() -> str:
    """The system Chromium's path; fails (never skips) when the enabled layer cannot run."""
    if problem := chromium_problem():
        pytest.fail(problem, pytrace=False)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as e:
        pytest.fail(f"Playwright for Python is not installed in this venv ({e}): `make test-browser` pins it "
                    "(pip install playwright; never `playwright install`, the system's Chromium is used)",
                    pytrace=False)
    return CHROMIUM
