"""`respawn canary` against `respawn local up`'s stack, as a user would run it from a second
terminal: it preempts its VMs through the local Compute's simulateMaintenanceEvent, times them
through the deployed controller's pipeline, and leaves nothing behind, whatever happens.

The local cloud runs with `--realism FILE`, FILE in the canary's own shape: inserts RUNNING after
0.5 s, a guest that halts 1 s after its shutdown script (Google's model: TERMINATED comes a while
after the marker, and a delete waits for it), deletes done in 5 s. The canary must measure those
figures back (the round trip a user makes: canary on Google, then the local cloud with its file)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from localcloud.gcs import client
from localcloud.realism import Lognormal, Realism
from tests.wait import Terminal, until

NOTICE_SCALE = 5 / 30  # `--preemption-notice 5`: Spot's 30 s shutdown as 5 s, and its 120 s notice as 20 s
MODEL = {"costs": {"insert_running": {"median": 0.5, "p99": 1.0}, "poweroff_after_marker": {"median": 1.0, "p99": 1.5},
                   "delete_done": {"median": 5.0, "p99": 6.0}}}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    shell = {k: v for k, v in os.environ.items() if not k.startswith(("RESPAWN_", "CLOUDSDK_", "STORAGE_EMULATOR"))}
    folder = tmp_path_factory.mktemp("respawn-local")
    model = folder / "model.json"
    model.write_text(json.dumps(MODEL))
    with Terminal([sys.executable, "-m", "controller.cli", "local", "up", "--tick", "2", "--preemption-notice", "5",
                   "--realism", str(model), "--dir", str(folder)], {**shell, "COLUMNS": "200"},
                  tmp_path_factory.mktemp("terminal-1")) as terminal:
        yield {"env": {**shell, **terminal.exports(), "COLUMNS": "80"}, "folder": folder}
        assert terminal.stop(timeout=60) == 0


def canary(up: dict[str, Any], tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controller.cli", "canary", "-z", "us-central1-a", "-z",
                           "us-central1-b", "--wait", "90", *args], env={**up["env"], **env}, capture_output=True,
                          text=True, timeout=600, cwd=tmp_path, stdin=subprocess.DEVNULL)


def left_behind(up: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(the VMs of the local Compute, the canary jobs' objects in the bucket)."""
    env = up["env"]
    listed = requests.get(f"{env['RESPAWN_COMPUTE_ENDPOINT']}/compute/v1/projects/{env['RESPAWN_PROJECT']}"
                          "/aggregated/instances", timeout=10).json()
    vms = [i["name"] for scope in listed["items"].values() for i in scope.get("instances", [])]
    storage = client(env["STORAGE_EMULATOR_HOST"], env["RESPAWN_PROJECT"])
    objects = [b.name for b in storage.list_blobs(env["RESPAWN_BUCKET"]) if "canary-" in b.name]
    return vms, objects


def nothing_left(up: dict[str, Any]) -> bool:
    return left_behind(up) == ([], [])


def test_canary_times_each_preemption_and_leaves_nothing_behind(up, tmp_path):
    done = canary(up, tmp_path, "--vms", "2", "-o", "figures.json")
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "✓ 2 VMs preempted and timed; nothing left behind" in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) <= 80, done.stdout  # COLUMNS=80
    doc = json.loads((tmp_path / "figures.json").read_text())
    figures, rows = doc["figures"], doc["preemptions"]
    assert doc["notice_s"] == 120 and len(rows) == 2 and all(row["standby"] and row["timed"] for row in rows)

    def each(key: str, at_least: int | None = None) -> list[float]:
        """The figure's samples: every one measured, or (``at_least``) that many, each one missing
        said in its preemption's notes."""
        values = [v for row in rows for v in (row["spans"][key] if isinstance(row["spans"][key], list)
                                                  else [row["spans"][key]])]
        found = [v for v in values if v is not None]
        assert len(found) >= (len(values) if at_least is None else at_least), (key, rows)
        assert all(row["notes"] for row in rows if row["spans"][key] is None), (key, rows)
        return found

    # The 120 s notice, at the local cloud's scale, from the simulated maintenance to the soft-off.
    assert all(abs(s - 120 * NOTICE_SCALE) < 1.5 for s in each("notice_to_soft_off_s")), rows
    # The agent hears of it and records it at once; the controller inserts the standby within seconds.
    assert all(0 <= s < 2 for s in each("notice_to_preempted_s") + each("preempted_to_record_s")), rows
    assert all(0 < s < 15 for s in each("record_to_insert_s")), rows
    assert all(0 < a <= b for a, b in zip(each("record_to_standby_s"), each("record_to_insert_s"))), rows
    assert all(row["standby_zone"] in ("us-central1-a", "us-central1-b") for row in rows), rows
    # The model's own figures, measured back: 0.5 s of insert and the local boot; a guest halting 1 s
    # after its marker (drawn: p99 1.5 s), never past the hard-off (5 s after the soft-off). The
    # controller deletes the VM once its marker is in: one gone before it was seen TERMINATED is said.
    assert len(each("insert_to_running_s")) == 4 and all(0.5 <= s < 4 for s in each("insert_to_running_s")), rows
    halts = each("marker_to_terminated_s", at_least=1)
    assert all(0.5 <= s <= 5.5 for s in halts), rows
    assert all(0.5 <= s <= 5.5 for s in each("stopping_to_terminated_s", at_least=len(halts))), rows
    assert all(0 <= s < 10 for s in each("running_to_agent_s")), rows
    # The System Event entry through the sink and Pub/Sub (a second each, drawn) to on_audit's pass.
    assert all(0.2 < s < 30 for s in each("audit_to_handled_s")), rows
    assert figures["marker_to_terminated_s"]["n"] == len(halts) and figures["insert_to_running_s"]["n"] == 4
    # The file loads back into the realism model, in place of its assumptions.
    realism = Realism.from_canary(tmp_path / "figures.json")
    assert isinstance(realism.halt_seconds, Lognormal) and 0.5 <= realism.halt_seconds.median <= 5.5
    assert realism.insert_seconds == doc["costs"]["insert_running"]["median"]
    assert nothing_left(up), left_behind(up)


def test_ctrl_c_while_the_vms_are_being_preempted_cleans_up_and_exits_130(up, tmp_path):
    process = subprocess.Popen([sys.executable, "-m", "controller.cli", "canary", "-z", "us-central1-a", "-z",
                                "us-central1-b", "--vms", "2", "--wait", "90"], env=up["env"], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    lines: list[str] = []

    def preempting() -> bool:
        line = process.stdout.readline()  # type: ignore[union-attr]
        lines.append(line)
        return "simulateMaintenanceEvent" in line or process.poll() is not None

    until("the canary to preempt its VMs", preempting, 120)
    time.sleep(1)
    process.send_signal(signal.SIGINT)
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)  # a second Ctrl-C must not cut the cleanup short
    rest, _ = process.communicate(timeout=300)
    said = "".join(lines) + rest
    assert process.returncode == 130, said
    assert "interrupted: nothing left behind" in said
    assert nothing_left(up), left_behind(up)


def test_a_canary_whose_vms_never_run_fails_naming_why_and_still_removes_its_jobs(up, tmp_path):
    env = up["env"]

    def fault(*args: str) -> None:
        subprocess.run([sys.executable, "-m", "controller.cli", "local", *args], env=env, check=True,
                       capture_output=True, timeout=60, stdin=subprocess.DEVNULL)

    for zone in ("us-central1-a", "us-central1-b"):
        fault("stockout", zone)
    try:
        done = canary(up, tmp_path, "--vms", "1", "--wait", "10")
    finally:
        for zone in ("us-central1-a", "us-central1-b"):
            fault("stockout", zone, "--off")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "not running after 10 s" in done.stderr and "canary-" in done.stderr
    assert not (set(tmp_path.glob("*.json"))), "no figures from a canary that measured nothing"
    assert nothing_left(up), left_behind(up)


def test_a_machine_type_the_controller_s_policy_refuses_is_said_before_anything_is_made(up, tmp_path):
    done = canary(up, tmp_path, "--vms", "1", RESPAWN_ALLOWED_MACHINE_TYPES="g2-standard-8")
    assert done.returncode == 2 and "the canary's job is refused" in done.stderr and "e2-small" in done.stderr
    assert nothing_left(up), left_behind(up)


def test_local_up_refuses_a_realism_file_of_another_shape_naming_what(tmp_path):
    bad = tmp_path / "figures.json"
    bad.write_text(json.dumps({"costs": {"boot_s": {"median": 40, "p99": 90}}}))
    done = subprocess.run([sys.executable, "-m", "controller.cli", "local", "up", "--realism", str(bad), "--dir",
                           str(tmp_path / "local")], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "--realism" in done.stderr and "costs.boot_s is not a figure" in done.stderr
    assert not (tmp_path / "local" / "local.env").exists()
