"""deploy/vm scripts on local Cloud TPU VMs: real bash + curl on every worker of a slice.

A TPU node (slice) is the attempt's one node, named ``<job>-<attempt>`` like a single VM;
each of its workers (hosts) runs the same startup script under its own metadata server,
where ``instance/name`` is the worker VM's own name and ``agent-worker-number``,
``worker-network-endpoints`` and the controller's ``respawn-node`` say who it is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from controller.service.config import REPO_ROOT
from localcloud.gcs import LocalGcs, client
from localcloud.tpu import TpuServer
from localcloud.vm import POWEROFF_REQUEST
from tests.integration.test_vm_agent import FakeMetadata, booting, shelve
from tests.wait import until

BUCKET = "tpu-agent-bucket"
PROJECT = "tpu-agent-proj"
ZONE = "us-central2-b"
COMMON = (REPO_ROOT / "deploy" / "vm" / "common.sh").read_text()
NOTICE = 4.0  # seconds between the soft-off and the hard-off (30 on Spot)
# The trainer runs in its worker's run directory; it waits there for the test's word.
WAIT_FOR_GO = "while [ ! -e go ]; do sleep 0.1; done; "


@pytest.fixture(scope="module")
def gcs() -> Iterator[LocalGcs]:
    with LocalGcs(buckets=(BUCKET,)) as g:
        shelve(g, BUCKET)
        yield g


@pytest.fixture
def srv(gcs: LocalGcs) -> Iterator[TpuServer]:
    env = {"STORAGE_EMULATOR_HOST": gcs.url, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "RESPAWN_NOTICE_SECONDS": str(NOTICE), "RESPAWN_WORKER_EXIT_DELAY": "0"}  # 10 s on a real VM
    with TpuServer(vm_env=env, boot_delay=0.05, shutdown_budget=NOTICE) as s:
        yield s


def token_of(name: str) -> str:
    return f"secret-of-{name}"


def boot(srv: TpuServer, name: str, command: str, accelerator: str = "v4-16", **attributes: str | None) -> list[str]:
    """Create the Spot node ``<job>-<attempt>`` with the metadata the controller gives a TPU
    node (an attribute given as None is left out); its workers' IPs, worker 0 first, once READY."""
    job, attempt = name.split("-")[0], name.split("-")[1]
    md = {**booting(BUCKET), "respawn-job": job, "respawn-bucket": BUCKET,
          "respawn-attempt": attempt, "respawn-token": token_of(name), "respawn-command": command,
          "respawn-heartbeat-interval": "1", "respawn-node": name,
          # Set for TPU nodes too, describing the slice as one VM: the agent ignores both there.
          "respawn-nodes": "1", "respawn-master-addr": name, **attributes}
    body = {"acceleratorType": accelerator, "runtimeVersion": "tpu-ubuntu2204-base",
            "schedulingConfig": {"spot": True}, "metadata": {k: v for k, v in md.items() if v is not None}}
    r = requests.post(f"{srv.endpoint}/v2/projects/{PROJECT}/locations/{ZONE}/nodes", params={"nodeId": name},
                      json=body, timeout=10)
    assert r.ok, r.text
    node = until(f"node {name} READY", lambda: (n := srv.node(name))["state"] == "READY" and n, timeout=15)
    return [e["ipAddress"] for e in node["networkEndpoints"]]


def read(gcs: LocalGcs, name: str) -> dict[str, Any] | None:
    blob = client(gcs.url).bucket(BUCKET).get_blob(name)
    return json.loads(blob.download_as_bytes()) if blob else None


def serial(srv: TpuServer, name: str, worker: int) -> str:
    path = srv.workdir_of(name, worker) / "serial-port-1.log"
    return path.read_text() if path.exists() else ""


def finished(srv: TpuServer, name: str, worker: int) -> bool:
    """The worker's startup script has ended (the guest agent logged it)."""
    return "Finished running startup scripts." in serial(srv, name, worker)


def go(srv: TpuServer, name: str, worker: int) -> None:
    (srv.workdir_of(name, worker) / "go").touch()


def test_every_worker_runs_the_command_as_a_rank_of_the_slice(gcs, srv):
    dump = 'env | grep -E "^(RESUME_|RESPAWN_|NODE|MASTER|GREETING)" | sort > env.txt; exit 0'
    ips = boot(srv, "envjob-3", dump, accelerator="v5litepod-16",
               **{"respawn-resume-from": "gs://ck/run/step_000040", "respawn-resume-step": "40",
                  "respawn-checkpoint-uri": "gs://ck/run", "respawn-env": "export GREETING='hello world'"})
    assert len(ips) == 4
    until("every worker to finish", lambda: all(finished(srv, "envjob-3", w) for w in range(4)))
    for worker in range(4):
        path = srv.workdir_of("envjob-3", worker) / "env.txt"
        env = dict(line.split("=", 1) for line in path.read_text().splitlines())
        assert (env["NODE_RANK"], env["NODES"], env["MASTER_ADDR"]) == (str(worker), "4", ips[0]), worker
        assert {k: env[k] for k in ("RESPAWN_JOB", "RESPAWN_ATTEMPT", "RESPAWN_BUCKET", "RESPAWN_CHECKPOINT_URI",
                                    "RESUME_FROM", "RESUME_STEP", "RESUME_TAG", "GREETING")} == {
            "RESPAWN_JOB": "envjob", "RESPAWN_ATTEMPT": "3", "RESPAWN_BUCKET": BUCKET,
            "RESPAWN_CHECKPOINT_URI": "gs://ck/run", "RESUME_FROM": "gs://ck/run/step_000040", "RESUME_STEP": "40",
            "RESUME_TAG": "", "GREETING": "hello world"}
        assert f"node envjob-3, TPU worker {worker}/4" in serial(srv, "envjob-3", worker)
    record = read(gcs, "jobs/envjob/exit")
    assert record is not None and (record["exit_code"], record["instance"], record["node"]) == (0, "envjob-3", 0)


def test_only_worker_0_heartbeats_and_its_exit_record_names_the_node(gcs, srv):
    # Worker 0 fails with 5 after a few heartbeats; worker 1 succeeds (and so writes nothing).
    boot(srv, "beat-2", 'sleep 3.5; exit $((NODE_RANK == 0 ? 5 : 0))')
    seen: list[dict[str, Any]] = []

    def exit_record() -> dict[str, Any] | None:
        if (beat := read(gcs, "jobs/beat/heartbeat")) is not None and beat not in seen:
            seen.append(beat)
        return read(gcs, "jobs/beat/exit")

    record = until("the exit record", exit_record)
    assert len(seen) >= 2, seen  # every second for 3.5 s
    assert {(b["instance"], b["node"], b["attempt"], b["token"]) for b in seen} == \
        {("beat-2", 0, 2, token_of("beat-2"))}, seen
    assert (record["exit_code"], record["instance"], record["node"], record["attempt"], record["token"]) == \
        (5, "beat-2", 0, 2, token_of("beat-2"))
    until("worker 1 to finish", lambda: finished(srv, "beat-2", 1))
    assert read(gcs, "jobs/beat/exit") == record, "worker 1's exit 0 must write nothing"


def test_no_worker_powers_off_after_the_command_exits(gcs, srv):
    boot(srv, "stay-1", "exit 0")
    until("the exit record", lambda: read(gcs, "jobs/stay/exit"))
    until("both workers to finish", lambda: all(finished(srv, "stay-1", w) for w in range(2)))
    time.sleep(1.0)  # a power-off asked for would have been seen (the server polls every 50 ms)
    node = srv.node("stay-1")
    assert (node["state"], node["health"]) == ("READY", "HEALTHY"), "a worker broke the slice"
    for worker in range(2):
        assert not (srv.workdir_of("stay-1", worker) / ".bin" / POWEROFF_REQUEST).exists(), worker
        log = serial(srv, "stay-1", worker)
        assert "not powering off" in log and "startup-script exit status 0" in log, log
        assert not (srv.workdir_of("stay-1", worker) / "trainer.pid").exists(), "a finished trainer's pid was left"
    # The controller deletes the node: the workers' shutdown scripts run against no trainer, write no marker.
    r = requests.delete(f"{srv.endpoint}/v2/projects/{PROJECT}/locations/{ZONE}/nodes/stay-1", timeout=10)
    assert r.ok, r.text
    until("the node gone", lambda: "stay-1" not in srv.names(), timeout=15)
    assert read(gcs, "preempted-jobs/stay") is None


def test_a_failing_worker_records_its_failure_in_its_own_exit_record(gcs, srv):
    boot(srv, "bad-4", f'[ "$NODE_RANK" = 1 ] && exit 3; {WAIT_FOR_GO}exit 0')
    record = until("worker 1's exit record", lambda: read(gcs, "jobs/bad/nodes/1/exit"))
    assert (record["exit_code"], record["instance"], record["node"], record["token"]) == (3, "bad-4", 1, token_of("bad-4"))
    # Worker 0's record is the slice's and always written; it hides no other worker's.
    go(srv, "bad-4", 0)
    until("worker 0's exit record", lambda: (r := read(gcs, "jobs/bad/exit")) and r["node"] == 0)
    assert read(gcs, "jobs/bad/exit")["exit_code"] == 0 and read(gcs, "jobs/bad/nodes/1/exit") == record


def test_a_worker_failing_after_worker_0_succeeded_never_overwrites_its_exit_record(gcs, srv):
    boot(srv, "ok-5", f'[ "$NODE_RANK" = 0 ] && exit 0; {WAIT_FOR_GO}exit 1')
    until("worker 0's exit record", lambda: read(gcs, "jobs/ok/exit"))
    go(srv, "ok-5", 1)  # its collective broke when worker 0 left
    until("worker 1 to finish", lambda: finished(srv, "ok-5", 1))
    assert read(gcs, "jobs/ok/nodes/1/exit")["exit_code"] == 1  # its own record, after worker 0's
    record = read(gcs, "jobs/ok/exit")
    assert (record["exit_code"], record["instance"], record["node"]) == (0, "ok-5", 0)
    assert srv.node("ok-5")["health"] == "HEALTHY"


TRAP = ('trap \'echo term > got-sigterm.txt; exit 0\' TERM; echo started > started.txt; '
        'while true; do sleep 0.1; done')


def test_preemption_sigterms_every_workers_trainer_and_the_marker_names_the_node(gcs, srv):
    boot(srv, "pre-6", TRAP)
    until("both trainers", lambda: all((srv.workdir_of("pre-6", w) / "started.txt").exists() for w in range(2)))
    srv.preempt("pre-6")
    until("PREEMPTED", lambda: srv.node("pre-6")["state"] == "PREEMPTED", timeout=15)
    marker = read(gcs, "preempted-jobs/pre")
    assert marker is not None
    assert (marker["instance"], marker["attempt"], marker["reason"], marker["saved"], marker["token"]) == \
        ("pre-6", 6, "preempted", True, token_of("pre-6"))
    assert marker["node"] in (0, 1)  # every worker writes it; the last one stays
    for worker in range(2):
        assert (srv.workdir_of("pre-6", worker) / "got-sigterm.txt").exists(), f"worker {worker} got no SIGTERM"
        assert "marker written (preempted, saved: true)" in serial(srv, "pre-6", worker)
    assert read(gcs, "jobs/pre/exit") is None, "a trainer exiting 0 on SIGTERM must not look like success"


def test_workers_booted_again_after_maintenance_train_nothing_and_ask_for_a_new_attempt(gcs, srv):
    boot(srv, "again-2", 'echo "$$" >> starts.txt; ' + TRAP)
    until("both trainers", lambda: all((srv.workdir_of("again-2", w) / "started.txt").exists() for w in range(2)))
    srv.maintenance("again-2", outcome="recovered")  # the workers go down and boot again elsewhere
    until("the rebooted marker", lambda: (m := read(gcs, "preempted-jobs/again")) and m["reason"] == "rebooted")
    for worker in range(2):  # each worker knows its own instance/id
        until(f"worker {worker}'s second boot", lambda: "this instance started before" in serial(srv, "again-2", worker))
        starts = (srv.workdir_of("again-2", worker) / "starts.txt").read_text().splitlines()
        assert len(starts) == 1, f"worker {worker} trained again"
    marker = read(gcs, "preempted-jobs/again")
    assert (marker["instance"], marker["attempt"], marker["token"]) == ("again-2", 2, token_of("again-2"))
    assert read(gcs, "jobs/again/exit") is None


def test_a_tpu_vm_without_respawn_node_writes_no_record(gcs, srv):
    boot(srv, "anon-1", "echo ran > ran.txt; exit 0", accelerator="v4-8", **{"respawn-node": None})
    until("the agent to give up", lambda: "giving up" in serial(srv, "anon-1", 0))
    assert "no respawn-node metadata on this TPU VM" in serial(srv, "anon-1", 0)
    assert not (srv.workdir_of("anon-1", 0) / "ran.txt").exists()
    time.sleep(0.5)
    assert read(gcs, "jobs/anon/exit") is None and read(gcs, "jobs/anon/heartbeat") is None
    # It powers off (no record is better than a guess): the slice is broken, which the controller sees.
    until("health TIMEOUT", lambda: srv.node("anon-1")["health"] == "TIMEOUT", timeout=10)


# -- load_identity on a TPU VM, against a scripted metadata server -----------------------

def tpu_identity(worker: Any = "1", endpoints: Any = "unknown:unknown:10.0.0.7,unknown:unknown:10.0.0.8",
                 node: Any = "train-3", **attributes: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "instance/name": "t1v-n-0123abcd-w-1", "instance/attributes/respawn-job": "train",
        "instance/attributes/respawn-bucket": BUCKET, "instance/attributes/respawn-attempt": "3",
        "instance/attributes/respawn-nodes": "1", "instance/attributes/respawn-master-addr": "train-3",
        "instance/attributes/agent-worker-number": worker, "instance/attributes/worker-network-endpoints": endpoints,
        "instance/attributes/respawn-node": node, "instance/network-interfaces/0/ip": "10.0.0.9"}
    values.update({f"instance/attributes/{k}": v for k, v in attributes.items()})
    return values


SHOW = ('agent_md_patience=2; load_identity || { echo NO-IDENTITY; exit 0; }; '
        'echo "$agent_tpu $agent_name $agent_rank/$agent_nodes master=$agent_tpu_master"')


def identify(md: FakeMetadata) -> tuple[str, str]:
    env = {"PATH": os.environ["PATH"], "GCE_METADATA_HOST": md.host, "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9"}
    out = subprocess.run(["bash", "-c", f"set -uo pipefail\n{COMMON}\n{SHOW}"], env=env, capture_output=True,
                         text=True, timeout=30)
    return out.stdout.strip(), out.stderr


@pytest.mark.parametrize(("values", "expected", "why"), [
    (tpu_identity(), "1 train-3 1/2 master=10.0.0.7", ""),
    (tpu_identity(worker="0", endpoints="unknown:unknown:10.0.0.7"), "1 train-3 0/1 master=10.0.0.7", ""),
    (tpu_identity(worker="0", endpoints=None), "1 train-3 0/1 master=10.0.0.9", ""),  # no endpoints: itself
    (tpu_identity(worker=None), "0 t1v-n-0123abcd-w-1 0/1 master=", ""),  # a Compute VM, as before
    (tpu_identity(node=None), "NO-IDENTITY", "no respawn-node metadata"),
    (tpu_identity(node=((503,) * 1000, "train-3")), "NO-IDENTITY", "respawn-node unreadable"),
    (tpu_identity(node="Train_3"), "NO-IDENTITY", "bad respawn-node"),
    (tpu_identity(node="x" * 64), "NO-IDENTITY", "bad respawn-node"),
    (tpu_identity(worker=((503,) * 1000, "0")), "NO-IDENTITY", "agent-worker-number unreadable"),
    (tpu_identity(worker="2"), "NO-IDENTITY", "not below the slice's 2 workers"),
    (tpu_identity(worker="01"), "NO-IDENTITY", "bad agent-worker-number"),
    (tpu_identity(worker="-1"), "NO-IDENTITY", "bad agent-worker-number"),
    (tpu_identity(endpoints=((503,) * 1000, "x")), "NO-IDENTITY", "worker-network-endpoints unreadable"),
    (tpu_identity(worker="0", endpoints=""), "NO-IDENTITY", "no worker"),
    (tpu_identity(endpoints="unknown:unknown:10.0.0.7,,unknown:unknown:10.0.0.8"), "NO-IDENTITY", "an empty entry"),
    (tpu_identity(worker="0", endpoints="unknown:unknown:"), "NO-IDENTITY", "bad worker 0 address"),
], ids=["worker-1-of-2", "one-worker", "no-endpoints", "compute-vm", "no-respawn-node", "respawn-node-unreadable",
        "bad-node-name", "node-name-too-long", "worker-number-unreadable", "rank-outside", "rank-leading-zero",
        "rank-negative", "endpoints-unreadable", "endpoints-empty", "endpoints-empty-entry", "no-master-ip"])
def test_tpu_identity(fake_md, values, expected, why):
    out, err = identify(fake_md(values))
    assert out == expected, err
    assert why in err, err
