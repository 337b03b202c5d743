"""`respawn local preempt|maintenance|crash INSTANCE` and `respawn local stockout|quota ZONE [--off]`:
faults injected from another terminal into running local Compute Engine and Cloud TPU servers,
through their /_local routes, as `respawn local up` prints the variables that find them."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from typer.testing import CliRunner

from controller.cli.main import app
from localcloud.compute import ComputeServer
from localcloud.http import Served
from localcloud.tpu import TpuServer
from tests.wait import until

PROJECT = "faults-proj"
ZONE = "us-central1-a"
runner = CliRunner()


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[ComputeServer, TpuServer]]:
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    with ComputeServer(vm_env=env, boot_delay=0.05, shutdown_budget=2.0) as compute, \
            TpuServer(vm_env=env, boot_delay=0.05, shutdown_budget=2.0) as tpu:
        yield compute, tpu


@pytest.fixture
def cli(servers, monkeypatch) -> Any:
    compute, tpu = servers
    monkeypatch.setenv("RESPAWN_COMPUTE_ENDPOINT", compute.endpoint)
    monkeypatch.setenv("RESPAWN_TPU_ENDPOINT", tpu.endpoint)
    monkeypatch.setenv("COLUMNS", "250")

    def invoke(*args: str) -> Any:
        return runner.invoke(app, ["local", *args])

    return invoke


def vm(compute: ComputeServer, name: str, zone: str = ZONE) -> str:
    """A running Spot VM whose shutdown script leaves a mark, as a job's VM would."""
    body = {"name": name, "machineType": f"zones/{zone}/machineTypes/g2-standard-8",
            "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
            "networkInterfaces": [{"network": "global/networks/default"}],
            "scheduling": {"provisioningModel": "SPOT", "automaticRestart": False, "onHostMaintenance": "TERMINATE"},
            "metadata": {"items": [{"key": "startup-script", "value": "sleep 60"},
                                   {"key": "shutdown-script", "value": "touch shutdown-ran"}]}}
    r = requests.post(f"{compute.endpoint}/compute/v1/projects/{PROJECT}/zones/{zone}/instances", json=body, timeout=10)
    assert r.ok, r.text
    until(f"{name} RUNNING", lambda: compute.instance(name)["status"] == "RUNNING")
    return name


def node(tpu: TpuServer, name: str, zone: str = ZONE) -> str:
    body = {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base", "schedulingConfig": {"spot": True},
            "metadata": {"startup-script": "sleep 60"}}
    r = requests.post(f"{tpu.endpoint}/v2/projects/{PROJECT}/locations/{zone}/nodes", params={"nodeId": name},
                      json=body, timeout=10)
    assert r.ok, r.text
    until(f"{name} READY", lambda: tpu.node(name)["state"] == "READY")
    return name


def recorded(compute: ComputeServer, name: str) -> list[str]:
    return [o["operationType"] for o in compute.operations() if o.get("targetLink", "").endswith(f"/instances/{name}")]


def one_line(result: Any) -> str:
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


# -- machines ------------------------------------------------------------------------------------
def test_preempt_reaches_the_instance_on_compute_and_its_shutdown_script_runs(cli, servers):
    compute, tpu = servers
    name = vm(compute, "pre-1")
    result = cli("preempt", name)
    assert result.exit_code == 0, result.output
    assert one_line(result).startswith("✓ pre-1 (Compute Engine): preempted")
    assert "compute.instances.preempted" in recorded(compute, name)
    until("TERMINATED", lambda: compute.instance(name)["status"] == "TERMINATED")
    assert (compute.workdir_of(name) / "shutdown-ran").exists()


def test_preempt_hard_gives_no_notice(cli, servers):
    compute, _ = servers
    name = vm(compute, "hard-1")
    result = cli("preempt", name, "--hard")
    assert result.exit_code == 0 and "without notice" in result.output, result.output
    until("TERMINATED", lambda: compute.instance(name)["status"] == "TERMINATED")
    assert not (compute.workdir_of(name) / "shutdown-ran").exists()


def test_maintenance_and_crash_on_an_instance(cli, servers):
    compute, _ = servers
    kept, crashed = vm(compute, "mnt-1"), vm(compute, "crash-1")
    assert cli("maintenance", kept).exit_code == 0
    assert compute.instance(kept)["status"] in ("STOPPING", "TERMINATED")
    assert "compute.instances.terminateOnHostMaintenance" in recorded(compute, kept)
    result = cli("crash", crashed)
    assert result.exit_code == 0 and "crash-1 (Compute Engine): the guest crashed" in result.output, result.output
    assert "compute.instances.guestTerminate" in recorded(compute, crashed)
    until("TERMINATED", lambda: compute.instance(crashed)["status"] == "TERMINATED")
    assert not (compute.workdir_of(crashed) / "shutdown-ran").exists()


def test_a_tpu_node_goes_to_the_tpu_server(cli, servers):
    compute, tpu = servers
    preempted, maintained = node(tpu, "slice-1"), node(tpu, "slice-2")
    before = len(compute.operations())
    result = cli("preempt", preempted)
    assert result.exit_code == 0 and "slice-1 (Cloud TPU): preempted" in result.output, result.output
    until("PREEMPTED", lambda: tpu.node(preempted)["state"] == "PREEMPTED")
    assert cli("maintenance", maintained).exit_code == 0
    assert tpu.node(maintained)["health"] == "UNHEALTHY_MAINTENANCE"
    assert len(compute.operations()) == before  # Compute was never asked
    # A TPU node has no guest crash here: said so, with what it does have.
    crash = cli("crash", maintained)
    assert crash.exit_code == 2
    assert "slice-2 is a Cloud TPU node, and the local Cloud TPU has no crash fault: it has preempt, maintenance" \
        in one_line(crash)


def test_a_refusal_of_the_server_is_one_line(cli, servers):
    _, tpu = servers
    body = {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base", "metadata": {"startup-script": "sleep 60"}}
    requests.post(f"{tpu.endpoint}/v2/projects/{PROJECT}/locations/{ZONE}/nodes", params={"nodeId": "standard-1"},
                  json=body, timeout=10).raise_for_status()
    until("READY", lambda: tpu.node("standard-1")["state"] == "READY")
    result = cli("preempt", "standard-1")  # not Spot: Google does not preempt it
    assert result.exit_code == 2
    assert "the local Cloud TPU refused preempt" in one_line(result) and "neither Spot nor preemptible" in result.output


def test_an_unknown_instance_names_those_that_exist(cli, servers):
    compute, _ = servers
    vm(compute, "known-1")
    result = cli("preempt", "unknown-7")
    assert result.exit_code == 2
    line = one_line(result)
    assert line.startswith("✗ no instance or TPU node named 'unknown-7' in the local cloud; it has ")
    assert "known-1" in line and "slice-1" in line  # instances and TPU nodes alike


def test_an_unknown_instance_in_an_empty_cloud_says_to_submit_a_job(monkeypatch):
    with ComputeServer(run_vms=False) as compute:
        monkeypatch.setenv("RESPAWN_COMPUTE_ENDPOINT", compute.endpoint)
        result = runner.invoke(app, ["local", "crash", "demo-1"])
    assert result.exit_code == 2
    line = one_line(result)
    assert "it has none yet (submit a job" in line
    assert "RESPAWN_TPU_ENDPOINT not set, so its server was not asked" in line


def test_an_instance_that_was_deleted_is_said_gone_not_yet_to_come(cli, servers):
    """A walkthrough whose job finished before its next step: its VM was deleted, which is not "none yet"."""
    compute, _ = servers
    vm(compute, "done-1")
    requests.delete(f"{compute.endpoint}/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/done-1", timeout=10)
    until("done-1 deleted", lambda: "done-1" not in compute.names())
    result = cli("maintenance", "done-1")
    assert result.exit_code == 2
    line = one_line(result)
    assert line.startswith("✗ done-1 is gone: Compute Engine deleted it (its job finished, or moved on")
    assert "none yet" not in line


# -- zones -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("fault, faults", [("stockout", lambda s: s.faults.stockouts),
                                           ("quota", lambda s: s.faults.quota)])
def test_a_zone_fault_goes_to_every_server_with_the_zone_and_off_lifts_it(cli, servers, fault, faults):
    compute, tpu = servers
    result = cli(fault, "europe-west4-b")
    assert result.exit_code == 0, result.output
    assert one_line(result).startswith(f"✓ {fault} in europe-west4-b: ") and "(Compute Engine, Cloud TPU)" in result.output
    assert "europe-west4-b" in faults(compute) and "europe-west4-b" in faults(tpu)
    off = cli(fault, "europe-west4-b", "--off")
    assert off.exit_code == 0 and f"{fault} in europe-west4-b lifted" in off.output, off.output
    assert "europe-west4-b" not in faults(compute) and "europe-west4-b" not in faults(tpu)


def test_a_zone_only_tpus_have_goes_to_the_tpu_server_alone(cli, servers):
    compute, tpu = servers
    try:
        result = cli("stockout", "us-central2-b")
        assert result.exit_code == 0 and "(Cloud TPU)" in result.output, result.output
        assert "us-central2-b" in tpu.faults.stockouts and "us-central2-b" not in compute.faults.stockouts
    finally:
        tpu.stockout("us-central2-b", on=False)


def test_a_stocked_out_zone_refuses_creates_made_after_it(cli, servers):
    compute, _ = servers
    assert cli("stockout", "us-west1-a").exit_code == 0
    try:
        body = {"name": "late-1", "machineType": "zones/us-west1-a/machineTypes/e2-small",
                "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
                "networkInterfaces": [{"network": "global/networks/default"}]}
        op = requests.post(f"{compute.endpoint}/compute/v1/projects/{PROJECT}/zones/us-west1-a/instances", json=body,
                           timeout=10).json()
        done = until("the insert decided", lambda: (o := requests.get(
            f"{compute.endpoint}/compute/v1/projects/{PROJECT}/zones/us-west1-a/operations/{op['name']}",
            timeout=10).json())["status"] == "DONE" and o)
        assert done["error"]["errors"][0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    finally:
        assert cli("stockout", "us-west1-a", "--off").exit_code == 0


def test_an_unknown_zone_names_the_zones(cli):
    result = cli("quota", "europe-west9-z")
    assert result.exit_code == 2
    line = one_line(result)
    assert line.startswith("✗ no zone 'europe-west9-z' in the local cloud; its zones are ")
    assert "us-central1-a" in line and "us-central2-b" in line


# -- no local cloud --------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [("preempt", "demo-1"), ("stockout", ZONE)])
def test_without_the_variables_it_says_to_run_local_up(args, monkeypatch):
    monkeypatch.delenv("RESPAWN_COMPUTE_ENDPOINT", raising=False)
    monkeypatch.delenv("RESPAWN_TPU_ENDPOINT", raising=False)
    result = runner.invoke(app, ["local", *args])
    assert result.exit_code == 2
    line = one_line(result)
    assert "RESPAWN_COMPUTE_ENDPOINT and RESPAWN_TPU_ENDPOINT are not set" in line
    assert "`respawn local up` in another terminal and export the variables it prints" in line


def test_a_local_cloud_that_is_gone_says_to_start_it_again(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    monkeypatch.setenv("RESPAWN_COMPUTE_ENDPOINT", f"http://127.0.0.1:{port}")
    result = runner.invoke(app, ["local", "preempt", "demo-1"])
    assert result.exit_code == 2
    line = one_line(result)
    assert f"no local cloud answers at http://127.0.0.1:{port} (RESPAWN_COMPUTE_ENDPOINT)" in line
    assert "is `respawn local up` still running?" in line


def test_an_endpoint_that_is_no_local_server_gets_no_fault(monkeypatch):
    asked: list[tuple[str, str]] = []

    def google(environ: dict[str, Any], start_response: Any) -> list[bytes]:  # answers as Google's front end does
        asked.append((environ["REQUEST_METHOD"], environ["PATH_INFO"]))
        start_response("404 Not Found", [("Content-Type", "text/html")])
        return [b"<html><title>Error 404 (Not Found)!!1</title></html>"]

    served = Served(google, "not-local")
    try:
        monkeypatch.setenv("RESPAWN_COMPUTE_ENDPOINT", served.url)
        result = runner.invoke(app, ["local", "preempt", "demo-1"])
    finally:
        served.stop()
    assert result.exit_code == 2
    assert f"{served.url} (RESPAWN_COMPUTE_ENDPOINT) is not a local Compute Engine server" in one_line(result)
    assert asked == [("GET", "/_local/")]  # looked, and sent nothing
