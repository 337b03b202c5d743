"""deploy/vm scripts on local VMs: real bash + curl against the metadata server and GCS."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from controller.core import checkpoints
from controller.adapters.gcs import GcsStore
from controller.service import vmscripts
from controller.service.config import REPO_ROOT
from localcloud.compute import ComputeServer
from localcloud.gcs import LocalGcs, client
from tests.wait import until

BUCKET = "agent-bucket"
PROJECT = "agent-proj"
SCRIPTS = vmscripts.load(REPO_ROOT / "deploy" / "vm")
STARTUP, SHUTDOWN = SCRIPTS.startup.text.decode(), SCRIPTS.shutdown.text.decode()  # the agent itself
NOTICE = 4.0  # seconds between the soft-off and the hard-off (30 on Spot)


@pytest.fixture(scope="module")
def gcs() -> Iterator[LocalGcs]:
    with LocalGcs(buckets=(BUCKET,)) as g:
        shelve(g, BUCKET)
        yield g


def shelve(gcs: LocalGcs, bucket: str) -> None:
    """The agent's scripts in the bucket, as the controller puts them before its first insert."""
    vmscripts.Shelf(GcsStore(client(gcs.url)), bucket, SCRIPTS).ensure()


def booting(bucket: str) -> dict[str, str]:
    """What a VM carries as the controller launches it: the bootstraps, and where the agent lies."""
    return {"startup-script": SCRIPTS.startup_boot, "shutdown-script": SCRIPTS.shutdown_boot, **SCRIPTS.items(bucket)}


@pytest.fixture
def srv(gcs: LocalGcs) -> Iterator[ComputeServer]:
    with ComputeServer(vm_env=vm_env(gcs), boot_delay=0.05, shutdown_budget=NOTICE) as s:
        yield s


def vm_env(gcs: LocalGcs, worker_exit_delay: float = 0) -> dict[str, str]:
    return {"STORAGE_EMULATOR_HOST": gcs.url, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "RESPAWN_NOTICE_SECONDS": str(NOTICE),  # the shutdown script's budget, as the local cloud gives it
            "RESPAWN_WORKER_EXIT_DELAY": str(worker_exit_delay)}  # 10 s on a real VM


def token_of(name: str) -> str:
    return f"secret-of-{name}"


def boot(srv: ComputeServer, name: str, command: str, *, notice_s: int = 0, **attributes: str | None) -> None:
    """Boot a VM named <job>-<attempt>[-n<rank>]; an attribute given as None is left out. ``notice_s``: the
    Spot preemption notice asked of Compute (``scheduling.preemptionNoticeDuration``), and told to the agent."""
    job, attempt = name.split("-")[0], name.split("-")[1]
    md = {**booting(BUCKET), "respawn-job": job, "respawn-bucket": BUCKET,
          "respawn-attempt": attempt, "respawn-token": token_of(name), "respawn-command": command,
          "respawn-nodes": "1", "respawn-heartbeat-interval": "1", "respawn-master-addr": f"{job}-{attempt}",
          **attributes}
    md = {k: v for k, v in md.items() if v is not None}
    body = {"name": name, "machineType": "zones/us-central1-a/machineTypes/g2-standard-8",
            "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
            "networkInterfaces": [{"network": "global/networks/default"}],
            "scheduling": {"provisioningModel": "SPOT", "automaticRestart": False, "onHostMaintenance": "TERMINATE",
                           **({"preemptionNoticeDuration": {"seconds": str(notice_s)}} if notice_s else {})},
            "metadata": {"items": [{"key": k, "value": v} for k, v in md.items()]}}
    if notice_s:
        body["metadata"]["items"].append({"key": "respawn-preemption-notice-s", "value": str(notice_s)})
    r = requests.post(f"{srv.endpoint}/compute/v1/projects/{PROJECT}/zones/us-central1-a/instances", json=body, timeout=10)
    assert r.ok, r.text


def read(gcs: LocalGcs, name: str) -> dict[str, Any] | None:
    blob = client(gcs.url).bucket(BUCKET).get_blob(name)
    return json.loads(blob.download_as_bytes()) if blob else None


def landed(gcs: LocalGcs, name: str) -> Any:
    """When the object was written, by GCS's clock (what the controller orders exits by)."""
    return client(gcs.url).bucket(BUCKET).get_blob(name).updated




def status(srv: ComputeServer, name: str) -> str:
    return srv.instance(name)["status"]


def serial(srv: ComputeServer, name: str) -> str:
    path = srv.workdir_of(name) / "serial-port-1.log"
    return path.read_text() if path.exists() else ""


def test_startup_runs_the_command_with_its_environment_then_records_exit_and_powers_off(gcs, srv):
    boot(srv, "envjob-3", 'env | grep -E "^(RESUME_|RESPAWN_|NODE|MASTER|GREETING)" | sort > env.txt; exit 7',
         **{"respawn-resume-from": "gs://ck/run/global_step40", "respawn-resume-step": "40",
            "respawn-resume-tag": "global_step40", "respawn-env": "export GREETING='hello world'",
            "respawn-checkpoint-every-s": "865"})
    record = until("the exit record", lambda: read(gcs, "jobs/envjob/exit"))
    assert (record["exit_code"], record["attempt"], record["instance"], record["node"]) == (7, 3, "envjob-3", 0)
    assert record["token"] == token_of("envjob-3")
    assert started_at(record) <= datetime.fromisoformat(record["at"]), "the trainer started before its exit"
    env = dict(line.split("=", 1) for line in (srv.workdir_of("envjob-3") / "env.txt").read_text().splitlines())
    assert env["RESUME_FROM"] == "gs://ck/run/global_step40" and env["RESPAWN_ATTEMPT"] == "3"
    assert (env["RESUME_STEP"], env["RESUME_TAG"]) == ("40", "global_step40")
    assert (env["NODE_RANK"], env["NODES"], env["MASTER_ADDR"]) == ("0", "1", "envjob-3")
    assert env["GREETING"] == "hello world" and env["RESPAWN_JOB"] == "envjob"
    assert env["RESPAWN_CHECKPOINT_EVERY_S"] == "865"  # respawn's Young/Daly advice
    until("the VM to power off", lambda: status(srv, "envjob-3") == "TERMINATED")
    assert any(o["operationType"] == "compute.instances.guestTerminate" for o in srv.operations())


def started_at(record: dict[str, Any]) -> datetime:
    """A record's trainer start: RFC 3339 in UTC, as the controller reads it (world.Record)."""
    from controller.core.world import _instant

    assert isinstance(record.get("trainer_started"), str), record
    when = _instant(record["trainer_started"])
    assert when is not None and record["trainer_started"].endswith("Z"), record
    return when


def test_heartbeat_while_running(gcs, srv):
    boot(srv, "beat-1", "sleep 30")
    first = until("a heartbeat", lambda: read(gcs, "jobs/beat/heartbeat"))
    assert (first["attempt"], first["instance"], first["token"]) == (1, "beat-1", token_of("beat-1"))
    newer = until("a newer heartbeat", lambda: (hb := read(gcs, "jobs/beat/heartbeat")) and hb["at"] != first["at"] and hb)
    # Every beat names the one start of the trainer, before the first beat.
    assert newer["trainer_started"] == first["trainer_started"]
    assert started_at(first) <= datetime.fromisoformat(first["at"])


def test_a_heartbeat_carries_its_record_in_its_listing_as_the_controller_judges_it(gcs, srv):
    """The agent writes each heartbeat's fields as the object's custom metadata, the token's proof
    in place of the token: listed, it makes the record its body makes, and belongs to its attempt."""
    from dataclasses import replace

    from controller.core.state import JobStatus
    from controller.core.world import PROOF_KEY, Record, token_proof

    boot(srv, "meta-3", 'printf \'{"step": 42, "save_s": 0.25, "saved_step": 40}\' > "$RESPAWN_PROGRESS_FILE"; sleep 30')
    store = GcsStore(client(gcs.url))

    def beat_with_step() -> Any:
        infos = [i for i in store.list(BUCKET, "jobs/meta/") if i.name == "jobs/meta/heartbeat"]
        return infos and (infos[0].metadata or {}).get("step") and infos[0]

    info = until("a listed heartbeat with the step", beat_with_step)
    assert info.metadata[PROOF_KEY] == token_proof(token_of("meta-3"))
    assert token_of("meta-3") not in "".join(info.metadata.values()), "the secret itself is never listed"
    listed = Record.listed(info)
    from_body = Record.parse(info, store.read_listed(info))
    assert listed is not None and listed == replace(from_body, token=None, proof=listed.proof)
    assert (listed.attempt, listed.node, listed.instance, listed.step, listed.save_s, listed.saved_step) == \
        (3, 0, "meta-3", 42, 0.25, 40)
    assert listed.trainer_started == started_at(json.loads(store.read_listed(info)))
    assert listed.belongs_to(JobStatus(attempt=3, attempt_token=token_of("meta-3")))
    assert not listed.belongs_to(JobStatus(attempt=3, attempt_token=token_of("meta-4")))


def test_the_resume_lines_fit_80_columns_as_respawn_logs_prints_them(gcs, srv):
    """Issue 26: 'job X attempt N ...; RESUME_FROM=...' was about 135 columns under `respawn logs`."""
    from controller.cli.joblogs import STAMP, one_stamp

    boot(srv, "demo-2", "sleep 30", **{"respawn-checkpoint-uri": "gs://respawn-local/checkpoints/demo",
                                        "respawn-resume-from": "gs://respawn-local/checkpoints/demo/step_000087",
                                        "respawn-resume-step": "87"})
    until("the trainer's heartbeat", lambda: read(gcs, "jobs/demo/heartbeat"))
    lines = [line for line in serial(srv, "demo-2").splitlines() if line.startswith("respawn: ")]
    said = [line for line in lines if " job demo attempt 2 " in line or "RESUME_FROM=" in line]
    assert len(said) == 2, lines
    when = datetime.fromisoformat(said[0].split()[1])
    shown = [f"{when:{STAMP}} demo-2 {one_stamp(line, when)}" for line in said]
    assert all(len(line) <= 80 for line in shown), shown
    assert shown[0].endswith("respawn: job demo attempt 2 node 0/1, from step 87"), shown
    assert shown[1].endswith("respawn: RESUME_FROM=$RESPAWN_CHECKPOINT_URI/step_000087"), shown


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


def test_a_worker_failing_after_rank_0_succeeded_never_overwrites_its_exit_record(gcs, srv):
    gang = {"respawn-nodes": "2", "respawn-master-addr": "ok-5-n0"}
    boot(srv, "ok-5-n0", "exit 0", **gang)
    until("rank 0's exit record", lambda: read(gcs, "jobs/ok/exit") is not None)
    boot(srv, "ok-5-n1", "exit 1", **gang)  # its collective broke when rank 0 left
    until("the worker to power off", lambda: status(srv, "ok-5-n1") == "TERMINATED")
    record = read(gcs, "jobs/ok/exit")
    assert (record["exit_code"], record["node"]) == (0, 0)
    assert read(gcs, "jobs/ok/nodes/1/exit")["exit_code"] == 1
    assert landed(gcs, "jobs/ok/nodes/1/exit") > landed(gcs, "jobs/ok/exit")


def test_a_workers_failure_before_rank_0s_exit_0_is_kept_beside_it(gcs, srv):
    gang = {"respawn-nodes": "3", "respawn-master-addr": "bad-5-n0"}
    boot(srv, "bad-5-n2", "exit 3", **gang)
    record = until("the worker's own exit record", lambda: read(gcs, "jobs/bad/nodes/2/exit"))
    assert (record["exit_code"], record["node"], record["attempt"], record["instance"]) == (3, 2, 5, "bad-5-n2")
    assert record["token"] == token_of("bad-5-n2")
    boot(srv, "bad-5-n0", "exit 0", **gang)  # rank 0 then finishes anyway
    until("rank 0's exit record", lambda: read(gcs, "jobs/bad/exit"))
    assert read(gcs, "jobs/bad/exit")["exit_code"] == 0
    assert read(gcs, "jobs/bad/nodes/2/exit") == record, "rank 0's exit 0 hid the worker's failure"
    assert landed(gcs, "jobs/bad/nodes/2/exit") < landed(gcs, "jobs/bad/exit")


def test_a_failing_worker_waits_before_recording_it_so_rank_0s_earlier_exit_lands_first(gcs):
    # The worker's command fails a moment *before* rank 0's exits 0 (its torchrun losing the store
    # rank 0 is closing): recorded after the worker's delay, it lands after rank 0's exit 0.
    gang = {"respawn-nodes": "2", "respawn-master-addr": "echo-1-n0"}
    with ComputeServer(vm_env=vm_env(gcs, worker_exit_delay=8), boot_delay=0.05, shutdown_budget=NOTICE) as srv:
        boot(srv, "echo-1-n1", "exit 1", **gang)
        boot(srv, "echo-1-n0", "sleep 1; exit 0", **gang)
        until("both exit records", lambda: read(gcs, "jobs/echo/exit") and read(gcs, "jobs/echo/nodes/1/exit"),
              timeout=60)
        assert landed(gcs, "jobs/echo/exit") < landed(gcs, "jobs/echo/nodes/1/exit")
        assert "waiting 8s before recording it" in serial(srv, "echo-1-n1")


def test_gang_node_reads_its_rank_from_its_name(gcs, srv):
    boot(srv, "gang-2-n1", 'echo "$NODE_RANK/$NODES $MASTER_ADDR" > rank.txt; exit 0',
         **{"respawn-nodes": "3", "respawn-master-addr": "gang-2-n0"})
    until("the command to run", lambda: (srv.workdir_of("gang-2-n1") / "rank.txt").exists())
    until("the VM to power off", lambda: status(srv, "gang-2-n1") == "TERMINATED")
    assert (srv.workdir_of("gang-2-n1") / "rank.txt").read_text().strip() == "1/3 gang-2-n0"
    assert read(gcs, "jobs/gang/exit") is None, "only rank 0 reports success"
    assert read(gcs, "jobs/gang/nodes/1/exit") is None, "a worker's exit 0 decides nothing"
    assert read(gcs, "jobs/gang/heartbeat") is None, "only rank 0 heartbeats"


# A trainer's progress file (respawnkit.progress) now and later: the later one's figures are not
# plain JSON numbers (a negative, a string, a leading zero, 19 digits), so none is passed on.
PROGRESS = ('printf \'%s\\n\' "$RESPAWN_PROGRESS_FILE" "$RESPAWN_NOTICE_SECONDS" > told.txt; '
            'printf \'{"step": 42, "step_at": "2026-01-01T00:00:00.000Z", "save_s": 0.25, "upload_s": null, '
            '"saved_step": 40}\' > "$RESPAWN_PROGRESS_FILE"; sleep 3; '
            'printf \'{"step": 1234567890123456789, "save_s": -1, "upload_s": "9", "saved_step": 007}\' '
            '> "$RESPAWN_PROGRESS_FILE"; sleep 1.5')


def test_the_trainer_is_told_its_progress_file_and_notice_and_records_carry_its_numbers_only(gcs, srv):
    boot(srv, "prog-2", PROGRESS)
    beat = until("a heartbeat with the step", lambda: (hb := read(gcs, "jobs/prog/heartbeat")) and "step" in hb and hb)
    assert (beat["step"], beat["save_s"], beat["saved_step"]) == (42, 0.25, 40) and "upload_s" not in beat
    record = until("the exit record", lambda: read(gcs, "jobs/prog/exit"))
    assert record["exit_code"] == 0 and not {"step", "save_s", "upload_s", "saved_step"} & set(record), record
    told_file, told_notice = (srv.workdir_of("prog-2") / "told.txt").read_text().splitlines()
    assert Path(told_file).is_absolute() and Path(told_file).name == "progress.json"
    assert told_notice == str(NOTICE)  # the notice the shutdown script assumes


def test_the_result_a_trainer_writes_goes_with_its_exit_record_and_a_bad_one_never_loses_the_exit(gcs, srv):
    """RESPAWN_RESULT_FILE (a sweep's trial reports its metrics there): its text is the exit record's
    "result"; one too large, or no file, is left out and said, and the exit is recorded all the same."""
    result = {"eval": {"loss": 0.25}, "note": 'a "quoted" tab\t, a newline\n and é'}
    write = f"import json, os; json.dump({result!r}, open(os.environ['RESPAWN_RESULT_FILE'], 'w'), indent=1)"
    boot(srv, "res-1", f"python -c {shlex.quote(write)}")
    record = until("the exit record", lambda: read(gcs, "jobs/res/exit"))
    assert record["exit_code"] == 0 and json.loads(record["result"]) == result
    boot(srv, "big-1", 'head -c 20000 /dev/zero | tr "\\0" x > "$RESPAWN_RESULT_FILE"; exit 3')
    record = until("the exit record", lambda: read(gcs, "jobs/big/exit"))
    assert record["exit_code"] == 3 and "result" not in record
    assert "RESPAWN_RESULT_FILE is over 16 KiB" in serial(srv, "big-1")
    boot(srv, "dir-1", 'mkdir "$RESPAWN_RESULT_FILE"')
    record = until("the exit record", lambda: read(gcs, "jobs/dir/exit"))
    assert record["exit_code"] == 0 and "result" not in record


@pytest.mark.parametrize("job, what", [
    ("fifo", 'mkfifo "$RESPAWN_PROGRESS_FILE"'),  # a read would block for ever
    ("zero", 'ln -s /dev/zero "$RESPAWN_PROGRESS_FILE"'),  # endless
    ("huge", 'printf \'{"step": %03000000d}\' 7 > "$RESPAWN_PROGRESS_FILE"'),  # 3 MB of one number
])
def test_a_progress_file_that_is_no_file_or_no_json_never_stops_the_heartbeat(gcs, srv, job, what):
    boot(srv, f"{job}-1", f"{what}; sleep 30")
    first = until("a heartbeat", lambda: read(gcs, f"jobs/{job}/heartbeat"))
    newer = until("a newer heartbeat", lambda: (hb := read(gcs, f"jobs/{job}/heartbeat")) and hb["at"] != first["at"] and hb)
    assert not {"step", "save_s", "upload_s", "saved_step"} & (set(first) | set(newer)), newer


def test_the_marker_carries_the_progress_the_trainer_wrote_on_sigterm(gcs, srv):
    saved = '{"step": 77, "step_at": null, "save_s": 1.5, "upload_s": 2.25, "saved_step": 77}'
    boot(srv, "mark-4", f"printf '%s' '{saved}' > saved.json; trap 'cp saved.json \"$RESPAWN_PROGRESS_FILE\"; exit 0' TERM; "
                        "echo started > started.txt; while true; do sleep 0.1; done")
    until("the trainer to start", lambda: (srv.workdir_of("mark-4") / "started.txt").exists())
    srv.preempt("mark-4")
    marker = until("the marker", lambda: read(gcs, "preempted-jobs/mark"))
    assert (marker["step"], marker["save_s"], marker["upload_s"], marker["saved_step"]) == (77, 1.5, 2.25, 77)
    assert marker["reason"] == "preempted" and marker["saved"] is True


TRAP = ('trap \'echo term > got-sigterm.txt; exit 0\' TERM; echo started > started.txt; '
        'while true; do sleep 0.1; done')


def test_preemption_sigterms_the_trainer_then_writes_the_marker_and_no_exit_record(gcs, srv):
    boot(srv, "pre-5", TRAP)
    until("the trainer to start", lambda: (srv.workdir_of("pre-5") / "started.txt").exists())
    srv.preempt("pre-5")
    marker = until("the marker", lambda: read(gcs, "preempted-jobs/pre"))
    assert (marker["attempt"], marker["instance"], marker["reason"]) == (5, "pre-5", "preempted")
    assert marker["token"] == token_of("pre-5")
    assert started_at(marker) <= datetime.fromisoformat(marker["at"]), "the marker names when the trainer started"
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
    assert (marker["attempt"], marker["reason"], marker["token"]) == (2, "maintenance", token_of("mnt-2"))
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
    found = checkpoints.latest(f"gs://{BUCKET}/ck/mid", listing, lambda rel, limit: store.read(BUCKET, f"ck/mid/{rel}", limit=limit).data)
    assert found is not None and found.uri == f"gs://{BUCKET}/ck/mid/step_000010" and found.step == 10


# -- the spec's env and the agent's own state ---------------------------------------------

def test_spec_env_reaches_only_the_trainer_and_never_redirects_the_agent(gcs, srv):
    # What the controller writes (values quoted by shlex), with names the agent uses or
    # has used for itself, and names of the contract (the controller rejects those too).
    hostile = {"JOB": "victim", "BUCKET": "elsewhere", "NAME": "victim-1", "ATTEMPT": "99", "NODE_RANK": "5",
               "NODES": "9", "MASTER_ADDR": "evil", "RESUME_FROM": "gs://evil/step_1", "RESUME_STEP": "1", "RESUME_TAG": "evil", "RESPAWN_JOB": "victim",
               "RESPAWN_ATTEMPT": "99", "RESPAWN_BUCKET": "elsewhere", "RESPAWN_CHECKPOINT_URI": "gs://evil",
               "RESPAWN_CHECKPOINT_EVERY_S": "1",
               "agent_job": "victim", "agent_bucket": "elsewhere", "agent_token": "forged", "RUN_DIR": "/tmp/evil",
               "QUOTED": "it's \"$HOME\" `id`\n; exit 1"}
    lines = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in sorted(hostile.items()))
    dump = 'python -c "import json, os; json.dump(dict(os.environ), open(\'env.json\', \'w\'))"; sleep 1.5; exit 3'
    boot(srv, "safe-4", dump, **{"respawn-env": lines, "respawn-resume-from": "gs://ck/safe/step_000040",
                                  "respawn-checkpoint-uri": "gs://ck/safe", "respawn-checkpoint-every-s": "1e9; rm -rf /"})
    beat = until("a heartbeat", lambda: read(gcs, "jobs/safe/heartbeat"))
    assert (beat["attempt"], beat["instance"], beat["node"], beat["token"]) == (4, "safe-4", 0, token_of("safe-4"))
    record = until("the exit record", lambda: read(gcs, "jobs/safe/exit"))
    assert (record["exit_code"], record["attempt"], record["instance"], record["node"], record["token"]) == \
        (3, 4, "safe-4", 0, token_of("safe-4"))
    until("the VM to power off", lambda: status(srv, "safe-4") == "TERMINATED")
    assert not list(client(gcs.url).bucket(BUCKET).list_blobs(prefix="jobs/victim")), "the env redirected a record"
    env = json.loads((srv.workdir_of("safe-4") / "env.json").read_text())
    # The trainer's own (non-reserved) values, byte for byte...
    for key in ("JOB", "BUCKET", "NAME", "ATTEMPT", "agent_job", "agent_bucket", "agent_token", "RUN_DIR"):
        assert env[key] == hostile[key], key
    # $HOME is a reference to the VM's environment, so it expands (see the env tests below); nothing else does.
    assert env["QUOTED"] == hostile["QUOTED"].replace("$HOME", env["HOME"])
    # ...and the contract's variables keep their true values.
    assert {k: env[k] for k in ("RESUME_FROM", "RESUME_STEP", "RESUME_TAG", "RESPAWN_JOB", "RESPAWN_ATTEMPT",
                                "RESPAWN_BUCKET", "RESPAWN_CHECKPOINT_URI", "NODE_RANK", "NODES", "MASTER_ADDR",
                                "RESPAWN_CHECKPOINT_EVERY_S")} == {
        "RESPAWN_CHECKPOINT_EVERY_S": "",  # not a number of seconds: dropped, and the spec's env cannot set it
        "RESUME_FROM": "gs://ck/safe/step_000040", "RESUME_STEP": "", "RESUME_TAG": "", "RESPAWN_JOB": "safe",
        "RESPAWN_ATTEMPT": "4",
        "RESPAWN_BUCKET": BUCKET, "RESPAWN_CHECKPOINT_URI": "gs://ck/safe", "NODE_RANK": "0", "NODES": "1",
        "MASTER_ADDR": "safe-4"}


def test_records_carry_the_attempt_token_json_escaped(gcs, srv):
    token = 'q"b\\s\ttab\nnl\x01ctl é/%'
    boot(srv, "tok-2", "sleep 1.5; exit 0", **{"respawn-token": token})
    assert until("a heartbeat", lambda: read(gcs, "jobs/tok/heartbeat"))["token"] == token
    assert until("the exit record", lambda: read(gcs, "jobs/tok/exit"))["token"] == token


@pytest.mark.parametrize("token", [None, ""], ids=["absent", "empty"])
def test_without_a_token_from_the_controller_records_have_no_token_field(gcs, srv, token):
    name = "old-1" if token is None else "older-1"
    boot(srv, name, "exit 0", **{"respawn-token": token})
    record = until("the exit record", lambda: read(gcs, f"jobs/{name.split('-')[0]}/exit"))
    assert record["attempt"] == 1 and "token" not in record


def test_without_a_token_a_heartbeat_carries_no_metadata_and_is_read_as_before(gcs, srv):
    boot(srv, "bare-1", "sleep 30", **{"respawn-token": None})
    until("a heartbeat", lambda: read(gcs, "jobs/bare/heartbeat"))
    (info,) = [i for i in GcsStore(client(gcs.url)).list(BUCKET, "jobs/bare/") if i.name.endswith("/heartbeat")]
    assert not info.metadata


# -- common.sh against a metadata server that misbehaves ----------------------------------

class FakeMetadata:
    """A metadata server whose answers a test scripts: per path, a value (str), a list of
    HTTP statuses to answer first (then the value), or "hang"; unknown paths are 404. Answers
    carry an ETag; ``wait_for_change=true`` with a ``last_etag`` waits (up to ``timeout_sec``) for
    the value to change, as Google's does; a folder (``instance/attributes/``) with
    ``recursive=true`` is the JSON of the string values under it."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values
        self.release = threading.Event()
        self.hits: dict[str, int] = {}
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path, _, query = self.path.partition("?")
                path = path.removeprefix("/computeMetadata/v1/")
                args = dict(pair.partition("=")[::2] for pair in query.split("&") if pair)
                owner.hits[path] = owner.hits.get(path, 0) + 1
                value = owner.values.get(path)
                if value == "hang":
                    owner.release.wait(30)
                    return
                if isinstance(value, tuple):
                    statuses, value = value
                    if owner.hits[path] <= len(statuses):
                        return self.reply(statuses[owner.hits[path] - 1], b"try again")
                body = owner.body(path, args)
                if body is not None and args.get("wait_for_change") == "true" and args.get("last_etag"):
                    end = time.monotonic() + min(float(args.get("timeout_sec", 60)), 30)
                    while etag(body) == args["last_etag"] and time.monotonic() < end and not owner.release.is_set():
                        time.sleep(0.05)
                        body = owner.body(path, args)
                        if body is None:
                            break
                if body is None:
                    return self.reply(404, b"Not Found")
                self.reply(200, body)

            do_POST = do_GET  # a stand-in GCS takes uploads too

            def reply(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                if code == 200:
                    self.send_header("ETag", etag(body))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def body(self, path: str, args: dict[str, str]) -> bytes | None:
        value = self.values.get(path)
        if isinstance(value, tuple):
            value = value[1]
        if isinstance(value, str):
            return value.encode()
        if path.endswith("/") and args.get("recursive") == "true":
            under = {k.removeprefix(path): v[1] if isinstance(v, tuple) else v for k, v in list(self.values.items())
                     if k.startswith(path)}
            return json.dumps({k: v for k, v in under.items() if isinstance(v, str)}, sort_keys=True).encode()
        return None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def etag(body: bytes) -> str:
    import hashlib

    return hashlib.sha1(body).hexdigest()[:16]


COMMON = (REPO_ROOT / "deploy" / "vm" / "common.sh").read_text()


def identity(name: str, attempt: str | None = None, **attributes: Any) -> dict[str, Any]:
    job, attempt = name.split("-")[0], attempt or name.split("-")[1]
    values: dict[str, Any] = {"instance/name": name, "instance/attributes/respawn-job": job,
                              "instance/attributes/respawn-bucket": BUCKET,
                              "instance/attributes/respawn-attempt": attempt}
    values.update({f"instance/attributes/{k}": v for k, v in attributes.items()})
    return values


def agent(md: FakeMetadata, script: str, gcs_url: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """common.sh, then ``script``, in bash, as the VM scripts run it."""
    env = {"PATH": os.environ["PATH"], "GCE_METADATA_HOST": md.host, "STORAGE_EMULATOR_HOST": gcs_url}
    return subprocess.run(["bash", "-c", f"set -uo pipefail\n{COMMON}\n{script}"], env=env, capture_output=True,
                          text=True, timeout=timeout)


WRITE_EXIT = 'load_identity || { echo NO-IDENTITY; exit 0; }; record exit "jobs/$agent_job/exit" \'"exit_code": 0\' && echo WROTE'


def test_a_token_that_fails_to_read_at_first_is_retried(gcs, fake_md):
    md = fake_md(identity("flaky-3", **{"respawn-token": ((503, 500), "the-token")}))
    out = agent(md, WRITE_EXIT, gcs.url)
    assert "WROTE" in out.stdout, out.stderr
    assert md.hits["instance/attributes/respawn-token"] == 3
    assert read(gcs, "jobs/flaky/exit")["token"] == "the-token"


def test_a_token_that_cannot_be_read_means_no_record_at_all(gcs, fake_md):
    md = fake_md(identity("mute-3", **{"respawn-token": ((503,) * 1000, "never")}))
    started = time.monotonic()
    out = agent(md, f"agent_md_patience=2\n{WRITE_EXIT}", gcs.url)
    assert "NO-IDENTITY" in out.stdout and "respawn-token unreadable" in out.stderr, out.stderr
    assert time.monotonic() - started < 10
    assert read(gcs, "jobs/mute/exit") is None


def test_a_hung_metadata_server_or_gcs_does_not_hang_the_agent(gcs, fake_md):
    md = fake_md({**identity("hung-1"), "instance/preempted": "hang"})
    started = time.monotonic()
    out = agent(md, 'agent_md_patience=2; md instance/preempted; echo "status $?"', gcs.url)
    assert "status 2" in out.stdout and time.monotonic() - started < 10, out.stderr
    hung_gcs = fake_md({"/upload/storage/v1/b/agent-bucket/o": "hang"})  # accepts connections, never answers
    started = time.monotonic()
    out = agent(md, 'agent_gcs_try=1; agent_gcs_patience=2; load_identity; record exit x "" || echo "failed $?"',
                f"http://{hung_gcs.host}")
    assert "failed 28" in out.stdout and time.monotonic() - started < 15, out.stderr  # 28: curl's timeout
    assert hung_gcs.hits["/upload/storage/v1/b/agent-bucket/o"] >= 2, "the upload was not retried"


@pytest.mark.parametrize(("name", "nodes", "rank"), [
    ("a-n1-3-n2", "3", "2"),      # a job name with "-n" in it: the rank is after the last one
    ("solo-n4-2", "1", "0"),      # a single VM is rank 0 whatever its name
    ("gang-3-1", "3", None),      # the old gang name: no rank to read
    ("gang-3-n3", "3", None),     # a rank outside the gang
    ("gang-3-n01", "3", None),
])
def test_gang_rank_is_read_from_the_n_suffix(gcs, fake_md, name, nodes, rank):
    md = fake_md(identity(name, attempt="3", **{"respawn-nodes": nodes}))
    out = agent(md, 'load_identity && echo "rank=$agent_rank"', gcs.url)
    assert out.stdout.strip() == ("" if rank is None else f"rank={rank}"), out.stderr


# -- the marker: "this VM's work is saved or its time is up" ------------------------------

PUT = ('put() { curl -sf -o /dev/null -X POST --data-binary "$2" '
       '"$STORAGE_EMULATOR_HOST/upload/storage/v1/b/$RESPAWN_BUCKET/o?uploadType=media&name=$1"; }; ')


def exists(gcs: LocalGcs, name: str) -> bool:
    return client(gcs.url).bucket(BUCKET).get_blob(name) is not None


def test_the_marker_waits_for_the_checkpoint_the_sigterm_asked_for(gcs, srv):
    # Step 10 is complete; SIGTERM asks for step 20, which takes half the notice to save.
    trainer = (PUT + 'put ck%2Fsave%2Fstep_000010%2Fw w10; put ck%2Fsave%2Fstep_000010%2F_SUCCESS ok; '
               'trap \'sleep 2; put ck%2Fsave%2Fstep_000020%2Fw w20; put ck%2Fsave%2Fstep_000020%2F_SUCCESS ok; '
               'exit 0\' TERM; echo started > started.txt; while true; do sleep 0.1; done')
    boot(srv, "save-3", trainer)
    until("the trainer to start", lambda: (srv.workdir_of("save-3") / "started.txt").exists())
    srv.preempt("save-3")
    marker = until("the marker", lambda: read(gcs, "preempted-jobs/save"))
    assert exists(gcs, "ck/save/step_000020/_SUCCESS"), "the marker was written before the SIGTERM save was complete"
    assert (marker["reason"], marker["saved"], marker["attempt"], marker["token"]) == \
        ("preempted", True, 3, token_of("save-3"))
    until("the VM to stop", lambda: status(srv, "save-3") == "TERMINATED")
    assert read(gcs, "jobs/save/exit") is None


def test_a_trainer_that_ignores_sigterm_gets_its_marker_at_the_deadline_before_the_hard_off(gcs, srv):
    boot(srv, "deaf-2", 'trap "" TERM; echo started > started.txt; while true; do sleep 0.1; done')
    until("the trainer to start", lambda: (srv.workdir_of("deaf-2") / "started.txt").exists())
    preempted = time.monotonic()
    srv.preempt("deaf-2")
    marker = until("the marker", lambda: read(gcs, "preempted-jobs/deaf"))
    waited = time.monotonic() - preempted
    # The deadline: the notice less a quarter of it (at most 5 s), so 3 s of this 4 s notice.
    assert NOTICE * 0.75 - 0.5 <= waited < NOTICE, f"marker {waited:.2f} s into a {NOTICE} s notice"
    assert status(srv, "deaf-2") == "STOPPING", "the marker must land before the hard-off"
    assert (marker["reason"], marker["saved"], marker["token"]) == ("preempted", False, token_of("deaf-2"))
    until("the VM to stop", lambda: status(srv, "deaf-2") == "TERMINATED")


def test_a_trainer_is_recorded_before_its_command_runs_so_a_preemption_never_misses_it(gcs, tmp_path):
    """Issue 35, item 20: a trainer that ignores SIGTERM was marked 'saved': the agent recorded the trainer's pid
    after launching it, and a shutdown script that came before that record took 'no trainer.pid' for 'no
    trainer': no SIGTERM, no wait, 'saved': true. A starved agent (its rename of trainer.pid slowed here) left
    that window open for as long as it was starved."""
    import shutil

    slow = tmp_path / "slow-bin"
    slow.mkdir()
    (slow / "mv").write_text(f'#!/bin/bash\ncase "${{!#}}" in *trainer.pid) sleep 3 ;; esac\n'
                             f'exec {shutil.which("mv")} "$@"\n')
    (slow / "mv").chmod(0o755)
    env = vm_env(gcs)
    env["PATH"] = f"{slow}:{env['PATH']}"
    with ComputeServer(vm_env=env, boot_delay=0.05, shutdown_budget=NOTICE) as srv:
        boot(srv, "late-1", "trap 'echo term >> got-sigterm.txt' TERM; echo started > started.txt; "
                            "while true; do sleep 0.1; done")  # notes SIGTERM, and trains on
        until("the command to start", lambda: (srv.workdir_of("late-1") / "started.txt").exists(), timeout=20)
        srv.preempt("late-1")
        marker = until("the marker", lambda: read(gcs, "preempted-jobs/late"))
        assert (srv.workdir_of("late-1") / "got-sigterm.txt").exists(), "the running command got no SIGTERM"
        assert (marker["reason"], marker["saved"]) == ("preempted", False), marker


# -- the VM scripts run by hand, against a scripted metadata server -----------------------

POWEROFF_SHIM = '#!/bin/sh\necho poweroff >> "$RESPAWN_TEST_POWEROFF"\n'


class Guest:
    """One VM's folders and a poweroff that only takes note, for running the scripts by hand."""

    def __init__(self, root: Path, md: FakeMetadata, gcs_url: str, **env: str) -> None:
        self.root, self.run_dir, self.md = root, root / "run", md
        (root / "bin").mkdir(parents=True, exist_ok=True)
        (root / "bin" / "poweroff").write_text(POWEROFF_SHIM)
        (root / "bin" / "poweroff").chmod(0o755)
        # Every process of this VM carries the tag, whatever its process group (the agent's watchers have
        # their own): close() ends them all, as a power-off does.
        self.tag = f"{root}-{id(self)}"
        self.env = {"PATH": f"{root / 'bin'}:{os.environ['PATH']}", "GCE_METADATA_HOST": md.host,
                    "STORAGE_EMULATOR_HOST": gcs_url, "RESPAWN_RUN_DIR": str(self.run_dir),
                    "RESPAWN_TEST_POWEROFF": str(root / "poweroffs"), "RESPAWN_TEST_VM": self.tag, **env}
        self.processes: list[subprocess.Popen[str]] = []

    def start(self, script: str) -> subprocess.Popen[str]:
        self.processes.append(subprocess.Popen(["bash", "-c", script], env=self.env, cwd=self.root, text=True,
                                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                               start_new_session=True))
        return self.processes[-1]

    def run(self, script: str, timeout: float = 30) -> str:
        process = self.start(script)
        out, _ = process.communicate(timeout=timeout)
        return out

    @property
    def poweroffs(self) -> int:
        path = self.root / "poweroffs"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def lines(self, name: str) -> list[str]:
        path = self.run_dir / name
        return path.read_text().splitlines() if path.exists() else []

    def close(self) -> None:
        needle = f"RESPAWN_TEST_VM={self.tag}".encode()
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and needle in (entry / "environ").read_bytes().split(b"\0"):
                    os.kill(int(entry.name), 9)
            except (OSError, ProcessLookupError):
                continue
        for p in self.processes:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def guest(fake_md, tmp_path) -> Iterator[Callable[..., Guest]]:
    made: list[Guest] = []

    def make(values: dict[str, Any], gcs_url: str, **env: str) -> Guest:
        made.append(Guest(tmp_path / f"vm{len(made)}", fake_md(values), gcs_url, **env))
        return made[-1]

    yield make
    for g in made:
        g.close()


def vm_identity(name: str, command: str, **attributes: Any) -> dict[str, Any]:
    return {**identity(name, **{"respawn-token": token_of(name), "respawn-command": command,
                                "respawn-heartbeat-interval": "1", **attributes}),
            "instance/id": "4242", "instance/preempted": "FALSE", "instance/maintenance-event": "NONE"}


def patient(script: str, seconds: int) -> str:
    """The script with its metadata patience cut to ``seconds`` (120 s on a VM)."""
    assert "agent_md_patience=120" in script
    return script.replace("agent_md_patience=120", f"agent_md_patience={seconds}", 1)


COUNTING = 'echo "$$" >> "$RESPAWN_RUN_DIR_FOR_TEST/starts.txt"; '


def test_a_second_startup_beside_the_first_starts_no_second_trainer(gcs, guest):
    g = guest(vm_identity("twice-1", COUNTING + "sleep 4; exit 0"), gcs.url)
    g.env["RESPAWN_RUN_DIR_FOR_TEST"] = str(g.run_dir)
    first = g.start(STARTUP)
    until("the first trainer", lambda: g.lines("starts.txt"))
    out = g.run(STARTUP, timeout=20)  # Google's troubleshooting advice: run the startup script again
    assert "another respawn agent runs on this VM" in out, out
    assert len(g.lines("starts.txt")) == 1, "a second trainer was started beside the first"
    assert g.poweroffs == 0, "the second run powered the VM off under the first"
    first.wait(timeout=20)
    assert read(gcs, "jobs/twice/exit")["exit_code"] == 0 and len(g.lines("starts.txt")) == 1


def test_a_second_boot_trains_nothing_and_asks_for_a_new_attempt(gcs, guest):
    g = guest(vm_identity("reboot-2", COUNTING + "sleep 60"), gcs.url)
    g.env["RESPAWN_RUN_DIR_FOR_TEST"] = str(g.run_dir)
    g.start(STARTUP)
    until("the first trainer", lambda: g.lines("starts.txt"))
    g.close()  # the power goes: every process of the VM dies; /var/lib (the state) survives
    for stale in ("trainer.pid", "stopping"):  # /var/run is a tmpfs, emptied by the reboot
        (g.run_dir / stale).unlink(missing_ok=True)
    out = g.run(STARTUP, timeout=20)
    assert len(g.lines("starts.txt")) == 1, f"the second boot trained again from the launch-time RESUME_FROM\n{out}"
    marker = read(gcs, "preempted-jobs/reboot")
    assert marker is not None, out
    assert (marker["reason"], marker["attempt"], marker["instance"], marker["token"]) == \
        ("rebooted", 2, "reboot-2", token_of("reboot-2"))
    assert g.poweroffs == 1 and read(gcs, "jobs/reboot/exit") is None


def test_state_left_by_another_instance_is_not_a_reboot(gcs, guest):
    g = guest(vm_identity("baked-1", "echo trained > trained.txt"), gcs.url)
    (g.run_dir / "state").mkdir(parents=True)
    (g.run_dir / "state" / "instance").write_text("999\n")  # a disk image made from another respawn VM
    out = g.run(STARTUP)
    assert (g.run_dir / "trained.txt").exists(), out
    assert read(gcs, "jobs/baked/exit")["exit_code"] == 0 and read(gcs, "preempted-jobs/baked") is None


def test_the_state_directory_can_be_moved(gcs, guest, tmp_path):
    state = tmp_path / "var-lib-respawn"
    g = guest(vm_identity("moved-1", "exit 0"), gcs.url, RESPAWN_STATE_DIR=str(state))
    g.run(STARTUP)
    assert (state / "instance").read_text().strip() == "4242"


def test_stop_then_start_of_a_local_vm_trains_once(gcs, srv):
    boot(srv, "restart-4", 'echo "$$" >> starts.txt; sleep 60')
    until("the trainer to start", lambda: (srv.workdir_of("restart-4") / "starts.txt").exists())
    url = f"{srv.endpoint}/compute/v1/projects/{PROJECT}/zones/us-central1-a/instances/restart-4"
    assert requests.post(f"{url}/stop", timeout=10).ok
    until("the VM to stop", lambda: status(srv, "restart-4") == "TERMINATED", timeout=20)
    assert read(gcs, "preempted-jobs/restart") is None, "a user's stop is no preemption"
    assert requests.post(f"{url}/start", timeout=10).ok
    marker = until("the rebooted marker", lambda: read(gcs, "preempted-jobs/restart"), timeout=20)
    assert (marker["reason"], marker["attempt"], marker["token"]) == ("rebooted", 4, token_of("restart-4"))
    until("the VM to power itself off", lambda: status(srv, "restart-4") == "TERMINATED", timeout=20)
    assert len((srv.workdir_of("restart-4") / "starts.txt").read_text().splitlines()) == 1


def test_a_stop_during_boot_starts_no_command(gcs, guest):
    # The stop comes while the agent still reads its metadata (three 503s: about 3 s).
    values = vm_identity("early-1", "echo ran > ran.txt; exit 0",
                         **{"respawn-resume-from": ((503, 503, 503), "gs://ck/early/step_000010")})
    g = guest(values, gcs.url, RESPAWN_NOTICE_SECONDS="4")
    booting = g.start(STARTUP)
    until("the agent to wait on its metadata", lambda: g.md.hits.get("instance/attributes/respawn-resume-from"))
    values["instance/preempted"] = "TRUE"
    out = g.run(SHUTDOWN, timeout=10)
    marker = read(gcs, "preempted-jobs/early")
    assert marker is not None and (marker["reason"], marker["saved"]) == ("preempted", True), out
    out, _ = booting.communicate(timeout=20)
    assert not (g.run_dir / "ran.txt").exists(), f"the command started on a VM being stopped\n{out}"
    assert read(gcs, "jobs/early/exit") is None, out


def test_a_command_ending_while_a_maintenance_is_only_announced_still_reports_its_exit(gcs, guest):
    # Compute announces a terminating maintenance ahead of time (an hour on GPU VMs): a job
    # that finishes in that window has finished, and its VM must not idle until then.
    g = guest({**vm_identity("pend-1", "exit 0"), "instance/maintenance-event": "TERMINATE_ON_HOST_MAINTENANCE"},
              gcs.url)
    out = g.run(STARTUP)
    assert read(gcs, "jobs/pend/exit")["exit_code"] == 0, out
    assert g.poweroffs == 1


def test_the_marker_waits_for_every_process_of_the_command(gcs, srv):
    # The command's shell dies on SIGTERM at once; the process it started saves for 2 s.
    trainer = ('(trap \'sleep 2; echo saved > saved.txt; exit 0\' TERM; echo started > started.txt; '
               'while true; do sleep 0.1; done); echo never')
    boot(srv, "group-1", trainer)
    until("the trainer to start", lambda: (srv.workdir_of("group-1") / "started.txt").exists())
    srv.preempt("group-1")
    marker = until("the marker", lambda: read(gcs, "preempted-jobs/group"))
    assert (srv.workdir_of("group-1") / "saved.txt").exists(), "the marker did not wait for the saving process"
    assert marker["saved"] is True


def test_a_command_that_daemonises_is_reported_and_what_it_left_is_stopped(gcs, guest):
    g = guest(vm_identity("daemon-1", 'nohup sleep 300 > /dev/null 2>&1 & echo $! > daemon.pid; exit 0'), gcs.url)
    out = g.run(STARTUP)
    assert read(gcs, "jobs/daemon/exit")["exit_code"] == 0
    assert "left processes running" in out and "must stay in the foreground" in out, out
    pid = int((g.run_dir / "daemon.pid").read_text())
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or ") Z " in stat.read_text(), "the daemon outlived the job's exit record"


# -- when the command never ran, the exit record says why ---------------------------------

@pytest.mark.parametrize(("case", "code", "reason"), [
    ("run directory", 96, "no run directory"),
    ("code", 97, "code download failed"),
    ("metadata", 98, "metadata unreadable: respawn-env"),
    ("command", 99, "no command"),
])
def test_when_the_command_never_ran_the_exit_record_says_why(gcs, guest, tmp_path, case, code, reason):
    name = f"why{code}-1"
    values = vm_identity(name, "echo ran > /dev/null; exit 0")
    if case == "code":
        values["instance/attributes/respawn-code"] = f"gs://{BUCKET}/no/such/code.tar.gz"
    if case == "metadata":
        values["instance/attributes/respawn-env"] = ((503,) * 1000, "never")
    if case == "command":
        values["instance/attributes/respawn-command"] = "  \n"
    g = guest(values, gcs.url)
    if case == "run directory":
        g.run_dir.parent.mkdir(parents=True, exist_ok=True)
        g.run_dir.write_text("a file where the run directory should be")
    out = g.run(patient(STARTUP, 2), timeout=60)
    record = read(gcs, f"jobs/why{code}/exit")
    assert record is not None, out
    assert (record["exit_code"], record["reason"][:len(reason)], record["token"]) == (code, reason, token_of(name))
    assert "trainer_started" not in record, "no trainer started"
    assert g.poweroffs == 1


# -- a full disk never turns a record into an empty one -----------------------------------

def test_records_are_whole_on_a_full_disk(gcs, fake_md):
    md = fake_md(identity("full-1", **{"respawn-token": "tok"}))
    out = agent(md, f'ulimit -f 0  # no file may grow: writes fail as on a full disk\n{WRITE_EXIT}', gcs.url)
    assert "WROTE" in out.stdout, out.stderr
    record = read(gcs, "jobs/full/exit")
    assert (record["exit_code"], record["token"], record["instance"]) == (0, "tok", "full-1")


def test_an_empty_body_is_never_uploaded(gcs, fake_md):
    md = fake_md(identity("empty-1"))
    out = agent(md, 'gcs_put agent-bucket jobs/empty/exit "" || echo "refused $?"', gcs.url)
    assert "refused 1" in out.stdout and "empty body" in out.stderr, out.stderr
    assert read(gcs, "jobs/empty/exit") is None


# -- the spec's env: $NAME references to the environment expand, nothing else runs --------

def test_spec_env_expands_references_to_the_environment_and_nothing_else(gcs, srv, tmp_path):
    touched = tmp_path / "touched"
    env = {"PATH": "/opt/conda/bin:$PATH", "RUN": "$(touch {t})x`touch {t}`".format(t=touched),
           "LITERAL": "cost $$5, $NOT_SET_ANYWHERE ${ALSO_NOT} $ {x} $1 $? *", "OUT": "/data/${RESPAWN_JOB}/$RESPAWN_ATTEMPT",
           "HOMELY": "$HOME/x", "SELF": "$SELF$LITERAL"}
    lines = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    dump = 'python -c "import json, os; json.dump(dict(os.environ), open(\'env.json\', \'w\'))"; sleep 1.5; exit 0'
    boot(srv, "exp-2", dump, **{"respawn-env": lines})
    record = until("the exit record", lambda: read(gcs, "jobs/exp/exit"))
    assert record["exit_code"] == 0 and read(gcs, "jobs/exp/heartbeat") is not None
    seen = json.loads((srv.workdir_of("exp-2") / "env.json").read_text())
    assert seen["PATH"].startswith("/opt/conda/bin:") and seen["PATH"].endswith(f":{os.environ['PATH']}")
    assert str(Path(sys.executable).parent) in seen["PATH"].split(":"), "the VM's own PATH was lost"
    assert seen["RUN"] == env["RUN"] and not touched.exists(), "a command substitution ran"
    assert seen["LITERAL"] == "cost $5, $NOT_SET_ANYWHERE ${ALSO_NOT} $ {x} $1 $? *"
    assert seen["OUT"] == "/data/exp/2" and seen["HOMELY"] == f"{seen['HOME']}/x"
    assert seen["SELF"] == "$SELF$LITERAL", "a reference sees the environment before the spec's env"
    until("the VM to power off", lambda: status(srv, "exp-2") == "TERMINATED")


def test_a_flapping_metadata_server_when_the_command_exits_does_not_lose_its_exit_record(gcs, tmp_path):
    # Regression: an unreadable instance/preempted after the command exited 0 meant "no exit
    # record", and the finished job was counted a failure. The "stopping" flag decides.
    values = vm_identity("flap-1", "echo done; exit 0")
    values["instance/preempted"] = ((503,) * 1000, "FALSE")
    md = FakeMetadata(values)
    guest = Guest(tmp_path, md, gcs.url)
    try:
        out = guest.run(patient(STARTUP, 5), timeout=60)
        assert read(gcs, "jobs/flap/exit")["exit_code"] == 0, out
    finally:
        guest.close()
        md.close()


def test_a_trainer_whose_pid_cannot_be_recorded_is_never_left_running(gcs, tmp_path):
    # Regression: with trainer.pid unwritable (a full disk), a preemption sent no SIGTERM,
    # and the marker still said the work was saved. Now such a trainer never runs.
    md = FakeMetadata(vm_identity("nopid-1", "touch ran.txt; sleep 30"))
    guest = Guest(tmp_path, md, gcs.url)
    try:
        guest.run_dir.mkdir(parents=True)
        (guest.run_dir / "trainer.pid.new").mkdir()  # the write fails
        out = guest.run(STARTUP, timeout=60)
        record = read(gcs, "jobs/nopid/exit")
        assert record and record["exit_code"] == 96 and "trainer.pid" in record["reason"], out
        assert guest.poweroffs == 1
    finally:
        guest.close()
        md.close()


def test_a_progress_file_that_turns_into_a_fifo_after_its_test_never_hangs_progress_fields(tmp_path):
    # the race a trainer could make: the path a regular file when tested, a FIFO with no writer when read (here
    # the test builtin itself swaps it): the read is bounded (2 s), the fields are empty, nothing hangs
    script = ('printf \'{"step": 5, "saved_step": 4}\' > "$agent_progress_file"\n'
              'echo "fields:$(progress_fields)"\n'
              '[() { builtin [ "$@"; local r=$?; rm -f "$agent_progress_file"; mkfifo "$agent_progress_file"; '
              'return $r; }\n'
              'echo "fifo:$(progress_fields)"')
    started = time.monotonic()
    out = subprocess.run(["bash", "-c", f"set -uo pipefail\n{COMMON}\n{script}"], capture_output=True, text=True,
                         timeout=20, env={"PATH": os.environ["PATH"], "RESPAWN_RUN_DIR": str(tmp_path)})
    assert out.stdout.splitlines() == ['fields:, "step": 5, "saved_step": 4', "fifo:"], out.stderr
    assert time.monotonic() - started < 6


@pytest.mark.parametrize("value, used", [("0", "30"), ("0.000", "30"), ("00", "30"), ("", "30"), ("-4", "30"),
                                         ("1e3", "30"), ("4", "4"), ("0.5", "0.5"), ("30", "30")])
def test_the_agent_reads_the_notice_as_respawnkit_does_a_zero_is_the_30_s_default(value, used):
    # respawnkit.notice takes a value that is not a positive number as unset (30 s): so does the agent, and what
    # it uses is what it tells the trainer, so both count the same deadline
    out = subprocess.run(["bash", "-c", f"set -uo pipefail\n{COMMON}\nnotice_seconds"], capture_output=True, text=True,
                         timeout=10, env={"PATH": os.environ["PATH"], "RESPAWN_NOTICE_SECONDS": value})
    assert out.stdout == used, out.stderr


# -- the preemption notice: recorded at once, then told to the trainer (issue 34) ----------

# Waits for the notice file, then says whether the notice record was already in the bucket, and trains on.
HEEDS = ('printf \'%s\\n\' "$RESPAWN_NOTICE_SECONDS" "$RESPAWN_NOTICE_FILE" > told.txt; echo started > started.txt; '
         'while [ ! -e "$RESPAWN_NOTICE_FILE" ]; do sleep 0.02; done; '
         'if curl -sf -o /dev/null "$STORAGE_EMULATOR_HOST/storage/v1/b/$RESPAWN_BUCKET/o/jobs%2F$RESPAWN_JOB%2Fnotice"; '
         'then heard=recorded; else heard=not-recorded; fi; '
         'cp "$RESPAWN_NOTICE_FILE" seen.json; echo "$heard" > heard.txt; while true; do sleep 0.1; done')


def generation(gcs: LocalGcs, name: str) -> int:
    return client(gcs.url).bucket(BUCKET).get_blob(name).generation


def test_a_notice_is_recorded_once_before_the_trainer_hears_of_it_and_training_goes_on(gcs, guest):
    values = vm_identity("heed-3", HEEDS, **{"respawn-preemption-notice-s": "120"})
    g = guest(values, gcs.url, RESPAWN_NOTICE_SECONDS="4")
    booted = g.start(STARTUP)
    until("the trainer", lambda: (g.run_dir / "started.txt").exists())
    told_notice, told_file = g.lines("told.txt")
    assert told_notice == "124"  # from the notice to the hard-off: 120 s of notice, then the shutdown's 4 s
    assert told_file == str(g.run_dir / "notice.json") and not Path(told_file).exists()
    noticed = time.time()
    values["instance/preempted"] = "TRUE"  # Compute's notice: the VM runs on for 120 s
    record = until("the notice record", lambda: read(gcs, "jobs/heed/notice"))
    assert (record["reason"], record["notice_s"], record["attempt"], record["instance"], record["node"], record["token"]) \
        == ("preempted", 120, 3, "heed-3", 0, token_of("heed-3"))
    assert until("the trainer to hear of it", lambda: g.lines("heard.txt")) == ["recorded"], "told before it was recorded"
    seen = json.loads((g.run_dir / "seen.json").read_text())
    assert seen["reason"] == "preempted" and noticed - 1 <= seen["at"] <= time.time()
    assert seen["hard_off"] - seen["at"] == pytest.approx(124, abs=0.01)
    time.sleep(1)
    assert booted.poll() is None and read(gcs, "jobs/heed/exit") is None, "a notice is not a stop"
    written = generation(gcs, "jobs/heed/notice")
    values["instance/maintenance-event"] = "TERMINATE_ON_HOST_MAINTENANCE"  # a second word of a loss: no second record
    time.sleep(1)
    # The soft-off: the shutdown script SIGTERMs, tells the trainer the hard-off it knows now, writes the marker.
    out = g.run(SHUTDOWN, timeout=20) + booted.communicate(timeout=20)[0]
    marker = read(gcs, "preempted-jobs/heed")
    assert marker is not None and (marker["reason"], marker["saved"]) == ("maintenance", True), out
    assert generation(gcs, "jobs/heed/notice") == written and out.count("notice recorded") == 1, out
    rewritten = json.loads((g.run_dir / "notice.json").read_text())
    assert rewritten["at"] == seen["at"] and rewritten["hard_off"] < seen["hard_off"] - 100, rewritten
    assert read(gcs, "jobs/heed/exit") is None


def test_a_maintenance_that_migrates_writes_nothing_and_one_that_terminates_is_a_notice(gcs, guest):
    values = vm_identity("move-1", HEEDS)
    g = guest(values, gcs.url)
    g.start(STARTUP)
    until("the trainer", lambda: (g.run_dir / "started.txt").exists())
    values["instance/maintenance-event"] = "MIGRATE_ON_HOST_MAINTENANCE"  # live migration: no loss
    until("the watcher to see it", lambda: g.md.hits.get("instance/maintenance-event", 0) >= 3)
    time.sleep(1)
    values["instance/maintenance-event"] = "NONE"
    time.sleep(0.5)
    assert read(gcs, "jobs/move/notice") is None and not (g.run_dir / "notice.json").exists()
    values["instance/maintenance-event"] = "TERMINATE_ON_HOST_MAINTENANCE"
    record = until("the notice record", lambda: read(gcs, "jobs/move/notice"))
    assert record["reason"] == "maintenance" and "notice_s" not in record  # Google's warning: a minute, or an hour
    assert until("the trainer to hear of it", lambda: g.lines("heard.txt")) == ["recorded"]
    assert json.loads((g.run_dir / "seen.json").read_text())["reason"] == "maintenance"


def test_a_command_that_ends_during_the_notice_reports_its_exit(gcs, guest):
    # preempted is TRUE for the notice's 120 s before the soft-off: an exit meanwhile is the command's own
    values = vm_identity("ends-2", 'while [ ! -e "$RESPAWN_NOTICE_FILE" ]; do sleep 0.02; done; exit 3',
                         **{"respawn-preemption-notice-s": "120"})
    g = guest(values, gcs.url)
    booted = g.start(STARTUP)
    until("the trainer's heartbeat", lambda: read(gcs, "jobs/ends/heartbeat"))
    values["instance/preempted"] = "TRUE"
    out, _ = booted.communicate(timeout=30)
    record = read(gcs, "jobs/ends/exit")
    assert record is not None and record["exit_code"] == 3, out
    assert read(gcs, "jobs/ends/notice")["notice_s"] == 120 and g.poweroffs == 1


def test_without_a_notice_the_preempted_vm_records_its_notice_once_beside_the_marker(gcs, srv):
    boot(srv, "now-2", TRAP)
    until("the trainer to start", lambda: (srv.workdir_of("now-2") / "started.txt").exists())
    srv.preempt("now-2")  # preempted TRUE at the soft-off: the watcher and the shutdown script both see it
    marker = until("the marker", lambda: read(gcs, "preempted-jobs/now"))
    record = until("the notice record", lambda: read(gcs, "jobs/now/notice"))
    assert (record["reason"], record["notice_s"], record["attempt"], record["token"]) == ("preempted", 0, 2, token_of("now-2"))
    assert (marker["reason"], marker["saved"]) == ("preempted", True)
    until("the VM to stop", lambda: status(srv, "now-2") == "TERMINATED")
    assert serial(srv, "now-2").count("notice recorded") == 1


def test_a_preemption_with_notice_is_recorded_and_told_while_the_vm_still_runs(gcs):
    # Google's 120 s notice, shortened 60 times: preempted turns TRUE 2 s before the soft-off.
    with ComputeServer(vm_env=vm_env(gcs), boot_delay=0.05, shutdown_budget=NOTICE, notice_scale=1 / 60) as srv:
        boot(srv, "soon-4", HEEDS, notice_s=120)
        until("the trainer to start", lambda: (srv.workdir_of("soon-4") / "started.txt").exists())
        srv.preempt("soon-4")
        record = until("the notice record", lambda: read(gcs, "jobs/soon/notice"))
        assert status(srv, "soon-4") == "RUNNING", "the record came after the soft-off"
        assert (record["reason"], record["notice_s"]) == ("preempted", 120)
        assert until("the trainer to hear of it", lambda: (srv.workdir_of("soon-4") / "heard.txt").exists())
        assert status(srv, "soon-4") == "RUNNING"
        assert (srv.workdir_of("soon-4") / "heard.txt").read_text().strip() == "recorded"
        marker = until("the marker", lambda: read(gcs, "preempted-jobs/soon"))
        assert marker["reason"] == "preempted" and read(gcs, "jobs/soon/exit") is None
        assert serial(srv, "soon-4").count("notice recorded") == 1


# -- the starting line: a held VM prepares, waits for its go, then starts (issue 34) --------

HELD = {"respawn-hold": "1", "respawn-line-poke-s": "1"}
RUNS = 'env | grep -E "^(RESUME_|RESPAWN_CHECKPOINT_EVERY)" | sort > env.txt; echo started > started.txt; '


def code_tarball(gcs: LocalGcs, name: str) -> str:
    tarball = io.BytesIO()
    with tarfile.open(fileobj=tarball, mode="w:gz") as tar:
        data = b"echo from-the-tarball > proof.txt\n"
        info = tarfile.TarInfo("prepare.sh")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    client(gcs.url).bucket(BUCKET).blob(f"code/{name}.tar.gz").upload_from_string(tarball.getvalue())
    return f"gs://{BUCKET}/code/{name}.tar.gz"


def test_a_held_vm_prepares_writes_ready_and_starts_only_on_its_go_from_the_gos_checkpoint(gcs, srv):
    boot(srv, "line-2", RUNS + "exit 0", **HELD, **{"respawn-code": code_tarball(gcs, "line"),
                                                   "respawn-resume-from": "gs://ck/line/step_000010",  # stale by the go
                                                   "respawn-resume-step": "10"})
    first = until("the ready record", lambda: read(gcs, "jobs/line/ready"))
    assert (first["attempt"], first["instance"], first["node"], first["token"]) == (2, "line-2", 0, token_of("line-2"))
    assert datetime.fromisoformat(first["waiting_since"]) <= datetime.fromisoformat(first["at"])
    assert (srv.workdir_of("line-2") / "code" / "prepare.sh").exists(), "the code was not fetched before the line"
    again = until("the ready record again", lambda: (r := read(gcs, "jobs/line/ready")) and r["at"] != first["at"] and r)
    assert again["waiting_since"] == first["waiting_since"]
    srv.set_metadata("line-2", {"respawn-go": "1"})  # another attempt's go: not this VM's
    until("the agent to say so", lambda: "ignoring respawn-go '1'" in serial(srv, "line-2"))
    time.sleep(1)
    assert not (srv.workdir_of("line-2") / "code" / "started.txt").exists(), "started on another attempt's go"
    assert read(gcs, "jobs/line/heartbeat") is None and read(gcs, "jobs/line/exit") is None
    srv.set_metadata("line-2", {"respawn-go": "2", "respawn-resume-from": "gs://ck/line/step_000020",
                                "respawn-resume-step": "20", "respawn-resume-tag": "", "respawn-checkpoint-every-s": "600"})
    record = until("the exit record", lambda: read(gcs, "jobs/line/exit"))
    assert record["exit_code"] == 0 and started_at(record) > datetime.fromisoformat(again["at"])
    env = dict(line.split("=", 1) for line in (srv.workdir_of("line-2") / "code" / "env.txt").read_text().splitlines())
    assert (env["RESUME_FROM"], env["RESUME_STEP"], env["RESPAWN_CHECKPOINT_EVERY_S"]) == \
        ("gs://ck/line/step_000020", "20", "600")
    assert "the go after " in serial(srv, "line-2") and serial(srv, "line-2").count("ignoring respawn-go") == 1


def test_each_node_of_a_held_gang_waits_and_starts_on_its_own_go(gcs, srv):
    gang = {**HELD, "respawn-nodes": "2", "respawn-master-addr": "pair-5-n0"}
    for node in ("pair-5-n0", "pair-5-n1"):
        boot(srv, node, "echo started > started.txt; sleep 60", **gang)
    until("rank 0's ready record", lambda: read(gcs, "jobs/pair/ready"))
    until("both at the line", lambda: all("waiting at the line" in serial(srv, n) for n in ("pair-5-n0", "pair-5-n1")))
    assert read(gcs, "jobs/pair/ready")["instance"] == "pair-5-n0", "only rank 0 writes the ready record"
    srv.set_metadata("pair-5-n1", {"respawn-go": "5"})
    until("node 1 to start", lambda: (srv.workdir_of("pair-5-n1") / "started.txt").exists())
    time.sleep(1)
    assert not (srv.workdir_of("pair-5-n0") / "started.txt").exists(), "node 0 started on node 1's go"
    srv.set_metadata("pair-5-n0", {"respawn-go": "5"})
    until("node 0 to start", lambda: (srv.workdir_of("pair-5-n0") / "started.txt").exists())


def test_a_stop_at_the_line_starts_no_trainer_and_writes_no_exit_record(gcs, srv):
    boot(srv, "gone-4", "echo ran > ran.txt; exit 0", **HELD)
    until("the ready record", lambda: read(gcs, "jobs/gone/ready"))
    srv.preempt("gone-4")  # no notice: preempted, STOPPING and the shutdown script at once
    marker = until("the marker", lambda: read(gcs, "preempted-jobs/gone"))
    assert (marker["reason"], marker["saved"], marker["attempt"]) == ("preempted", True, 4)
    srv.set_metadata("gone-4", {"respawn-go": "4"})  # a go that comes too late changes nothing
    until("the VM to stop", lambda: status(srv, "gone-4") == "TERMINATED")
    assert not (srv.workdir_of("gone-4") / "ran.txt").exists() and read(gcs, "jobs/gone/exit") is None


def test_a_standby_whose_code_cannot_be_fetched_writes_no_exit_record_over_the_current_attempts(gcs, guest):
    """Found attacking issue 34: a held VM whose preparation failed wrote jobs/<job>/exit, the current
    attempt's key too: an exit 0 of the attempt it stands by for, landing then, was overwritten. It
    powers off without a record (the controller takes a standby down at its line as lost)."""
    client(gcs.url).bucket(BUCKET).blob("jobs/held/exit").upload_from_string('{"exit_code": 0, "attempt": 1}')
    values = vm_identity("held-2", "echo ran > ran.txt; exit 0")
    values.update({f"instance/attributes/{k}": v for k, v in HELD.items()})
    values["instance/attributes/respawn-code"] = f"gs://{BUCKET}/no/such/code.tar.gz"
    g = guest(values, gcs.url)
    out = g.run(patient(STARTUP, 2), timeout=60)
    assert read(gcs, "jobs/held/exit") == {"exit_code": 0, "attempt": 1}, out
    assert "code download failed; at the starting line: no exit record" in out and g.poweroffs == 1


def test_the_starting_line_lines_fit_80_columns_as_respawn_logs_prints_them(gcs, srv):
    from controller.cli.joblogs import STAMP, one_stamp

    boot(srv, "demo-3", "echo started > started.txt; sleep 30", **HELD,
         **{"respawn-checkpoint-uri": "gs://respawn-local/checkpoints/demo"})
    until("the ready record", lambda: read(gcs, "jobs/demo/ready"))
    srv.set_metadata("demo-3", {"respawn-go": "3", "respawn-resume-step": "153",
                                "respawn-resume-from": "gs://respawn-local/checkpoints/demo/step_000153"})
    until("the trainer", lambda: (srv.workdir_of("demo-3") / "started.txt").exists())
    lines = [line for line in serial(srv, "demo-3").splitlines() if line.startswith("respawn: ")]
    said = [line for line in lines if "at the line" in line]
    assert len(said) == 2, lines
    when = datetime.fromisoformat(said[0].split()[1])
    shown = [f"{when:{STAMP}} demo-3 {one_stamp(line, when)}" for line in said]
    assert all(len(line) <= 80 for line in shown), shown
    assert shown[0].endswith("respawn: waiting at the line for attempt 2's save (the go)"), shown
    assert re.search(r"respawn: the go after \d+ s at the line: from step 153$", shown[1]), shown
