"""deploy/vm scripts on local VMs: real bash + curl against the metadata server and GCS."""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from controller import checkpoints
from controller.adapters.gcs import GcsStore
from controller.bootstrap import vm_scripts
from controller.config import REPO_ROOT
from localcloud.compute import ComputeServer
from localcloud.gcs import LocalGcs, client
from tests.wait import until

BUCKET = "agent-bucket"
PROJECT = "agent-proj"
STARTUP, SHUTDOWN = vm_scripts(REPO_ROOT / "deploy" / "vm")


@pytest.fixture(scope="module")
def gcs() -> Iterator[LocalGcs]:
    with LocalGcs(buckets=(BUCKET,)) as g:
        yield g


@pytest.fixture
def srv(gcs: LocalGcs) -> Iterator[ComputeServer]:
    env = {"STORAGE_EMULATOR_HOST": gcs.url, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    with ComputeServer(vm_env=env, boot_delay=0.05, shutdown_budget=4.0) as s:
        yield s


def boot(srv: ComputeServer, name: str, command: str, **attributes: str) -> None:
    job, attempt = name.split("-")[0], name.split("-")[1]
    md = {"startup-script": STARTUP, "shutdown-script": SHUTDOWN, "respawn-job": job, "respawn-bucket": BUCKET,
          "respawn-attempt": attempt, "respawn-command": command, "respawn-nodes": "1",
          "respawn-heartbeat-interval": "1", "respawn-master-addr": f"{job}-{attempt}", **attributes}
    body = {"name": name, "machineType": "zones/us-central1-a/machineTypes/g2-standard-8",
            "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
            "networkInterfaces": [{"network": "global/networks/default"}],
            "scheduling": {"provisioningModel": "SPOT", "automaticRestart": False, "onHostMaintenance": "TERMINATE"},
            "metadata": {"items": [{"key": k, "value": v} for k, v in md.items()]}}
    r = requests.post(f"{srv.endpoint}/compute/v1/projects/{PROJECT}/zones/us-central1-a/instances", json=body, timeout=10)
    assert r.ok, r.text


def read(gcs: LocalGcs, name: str) -> dict[str, Any] | None:
    blob = client(gcs.url).bucket(BUCKET).get_blob(name)
    return json.loads(blob.download_as_bytes()) if blob else None




def status(srv: ComputeServer, name: str) -> str:
    return srv.instance(name)["status"]


def serial(srv: ComputeServer, name: str) -> str:
    path = srv.workdir_of(name) / "serial-port-1.log"
    return path.read_text() if path.exists() else ""


def test_startup_runs_the_command_with_its_environment_then_records_exit_and_powers_off(gcs, srv):
    boot(srv, "envjob-3", 'env | grep -E "^(RESUME_FROM|RESPAWN_|NODE|MASTER|GREETING)" | sort > env.txt; exit 7',
         **{"respawn-resume-from": "gs://ck/run/step_000040", "respawn-env": "export GREETING='hello world'"})
    record = until("the exit record", lambda: read(gcs, "jobs/envjob/exit"))
    assert (record["exit_code"], record["attempt"], record["instance"], record["node"]) == (7, 3, "envjob-3", 0)
    env = dict(line.split("=", 1) for line in (srv.workdir_of("envjob-3") / "env.txt").read_text().splitlines())
    assert env["RESUME_FROM"] == "gs://ck/run/step_000040" and env["RESPAWN_ATTEMPT"] == "3"
    assert (env["NODE_RANK"], env["NODES"], env["MASTER_ADDR"]) == ("0", "1", "envjob-3")
    assert env["GREETING"] == "hello world" and env["RESPAWN_JOB"] == "envjob"
    until("the VM to power off", lambda: status(srv, "envjob-3") == "TERMINATED")
    assert any(o["operationType"] == "compute.instances.guestTerminate" for o in srv.operations())


def test_heartbeat_while_running(gcs, srv):
    boot(srv, "beat-1", "sleep 30")
    first = until("a heartbeat", lambda: read(gcs, "jobs/beat/heartbeat"))
    assert (first["attempt"], first["instance"]) == (1, "beat-1")
    until("a newer heartbeat", lambda: (hb := read(gcs, "jobs/beat/heartbeat")) and hb["at"] != first["at"])


def test_code_tarball_is_fetched_before_the_command(gcs, srv):
    tarball = io.BytesIO()
    with tarfile.open(fileobj=tarball, mode="w:gz") as tar:
        data = b"#!/bin/bash\necho from-the-tarball > proof.txt\n"
        info = tarfile.TarInfo("run.sh")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    client(gcs.url).bucket(BUCKET).blob("code/app.tar.gz").upload_from_string(tarball.getvalue())
    boot(srv, "code-1", "bash run.sh", **{"respawn-code": f"gs://{BUCKET}/code/app.tar.gz"})
    assert until("the exit record", lambda: read(gcs, "jobs/code/exit"))["exit_code"] == 0
    assert (srv.workdir_of("code-1") / "code" / "proof.txt").read_text().strip() == "from-the-tarball"


def test_gang_node_reads_its_rank_from_its_name(gcs, srv):
    boot(srv, "gang-2-1", 'echo "$NODE_RANK/$NODES" > rank.txt; exit 0', **{"respawn-nodes": "3", "respawn-master-addr": "gang-2-0"})
    until("the command to run", lambda: (srv.workdir_of("gang-2-1") / "rank.txt").exists())
    until("the VM to power off", lambda: status(srv, "gang-2-1") == "TERMINATED")
    assert (srv.workdir_of("gang-2-1") / "rank.txt").read_text().strip() == "1/3"
    assert read(gcs, "jobs/gang/exit") is None, "only rank 0 reports success"
    assert read(gcs, "jobs/gang/heartbeat") is None, "only rank 0 heartbeats"


TRAP = ('trap \'echo term > got-sigterm.txt; exit 0\' TERM; echo started > started.txt; '
        'while true; do sleep 0.1; done')


def test_preemption_sigterms_the_trainer_then_writes_the_marker_and_no_exit_record(gcs, srv):
    boot(srv, "pre-5", TRAP)
    until("the trainer to start", lambda: (srv.workdir_of("pre-5") / "started.txt").exists())
    srv.preempt("pre-5")
    marker = until("the marker", lambda: read(gcs, "preempted-jobs/pre"))
    assert (marker["attempt"], marker["instance"], marker["reason"]) == (5, "pre-5", "preempted")
    assert (srv.workdir_of("pre-5") / "got-sigterm.txt").exists(), "trainer got no SIGTERM"
    until("the VM to stop", lambda: status(srv, "pre-5") == "TERMINATED")
    assert read(gcs, "jobs/pre/exit") is None, "a trainer exiting 0 on SIGTERM must not look like success"
    log = serial(srv, "pre-5")
    assert log.index("VM is stopping: no exit record") >= 0


def test_terminating_host_maintenance_writes_a_maintenance_marker(gcs, srv):
    boot(srv, "mnt-2", TRAP)
    until("the trainer to start", lambda: (srv.workdir_of("mnt-2") / "started.txt").exists())
    srv.maintenance("mnt-2")
    marker = until("the marker", lambda: read(gcs, "preempted-jobs/mnt"))
    assert (marker["attempt"], marker["reason"]) == (2, "maintenance")
    until("the VM to stop", lambda: status(srv, "mnt-2") == "TERMINATED")
    assert read(gcs, "jobs/mnt/exit") is None


def test_plain_delete_sigterms_the_trainer_without_a_marker(gcs, srv):
    boot(srv, "del-1", TRAP)
    until("the trainer to start", lambda: (srv.workdir_of("del-1") / "started.txt").exists())
    requests.delete(f"{srv.endpoint}/compute/v1/projects/{PROJECT}/zones/us-central1-a/instances/del-1", timeout=10)
    until("the trainer's SIGTERM", lambda: (srv.workdir_of("del-1") / "got-sigterm.txt").exists())
    time.sleep(0.5)
    assert read(gcs, "preempted-jobs/del") is None and read(gcs, "jobs/del/exit") is None


def test_preemption_in_the_middle_of_a_checkpoint_write_leaves_the_previous_one_latest(gcs, srv):
    # step 10 is complete; step 20's weights are written, then the VM dies before _SUCCESS.
    put = ('put() { curl -sf -o /dev/null -X POST --data-binary "$2" '
           '"$STORAGE_EMULATOR_HOST/upload/storage/v1/b/$RESPAWN_BUCKET/o?uploadType=media&name=$1"; }; '
           'trap "" TERM; '  # this trainer is too busy writing to honour SIGTERM
           'put ck%2Fmid%2Fstep_000010%2Fweights.npy w10; put ck%2Fmid%2Fstep_000010%2F_SUCCESS ""; '
           'put ck%2Fmid%2Fstep_000020%2Fweights.npy w20; echo writing > writing.txt; sleep 60; '
           'put ck%2Fmid%2Fstep_000020%2F_SUCCESS ""')
    boot(srv, "mid-2", put)
    until("the second write to be under way", lambda: (srv.workdir_of("mid-2") / "writing.txt").exists())
    srv.preempt("mid-2")
    until("the marker", lambda: read(gcs, "preempted-jobs/mid"))
    until("the VM to stop", lambda: status(srv, "mid-2") == "TERMINATED", timeout=20)
    store = GcsStore(client(gcs.url))
    listing = store.list(BUCKET, "ck/mid/")
    assert {b.name for b in listing} >= {"ck/mid/step_000020/weights.npy"}
    found = checkpoints.latest(f"gs://{BUCKET}/ck/mid", listing, lambda rel: store.read(BUCKET, f"ck/mid/{rel}").data)
    assert found is not None and found.uri == f"gs://{BUCKET}/ck/mid/step_000010" and found.step == 10
