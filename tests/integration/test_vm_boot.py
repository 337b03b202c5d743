"""The VM bootstrap (deploy/vm/*-boot.sh) on local VMs: the agent fetched from the bucket, run only
when its digest is the one in the VM's metadata; the shutdown script run from the copy kept at boot."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from localcloud.compute import ComputeServer
from localcloud.gcs import LocalGcs, client
from tests.integration.test_vm_agent import (NOTICE, SCRIPTS, TRAP, boot, read, serial, shelve, status, token_of,
                                             vm_env)
from tests.wait import until

BUCKET = "agent-bucket"  # test_vm_agent's boot() names it in every VM's metadata
EVIL = '#!/bin/bash\ntouch "$RESPAWN_RUN_DIR/evil-ran"\n'


@pytest.fixture(scope="module")
def local_gcs() -> Iterator[LocalGcs]:
    with LocalGcs(buckets=(BUCKET,)) as g:
        yield g


@pytest.fixture
def gcs(local_gcs: LocalGcs) -> LocalGcs:
    """The scripts as the controller leaves them, whatever the test before replaced or deleted: a
    controller process puts them back before its first insert (each test's jobs are its own)."""
    shelve(local_gcs, BUCKET)
    return local_gcs


@pytest.fixture
def srv(gcs: LocalGcs) -> Iterator[ComputeServer]:
    env = {**vm_env(gcs), "RESPAWN_BOOT_PATIENCE": "3"}  # 3 minutes on a VM
    with ComputeServer(vm_env=env, boot_delay=0.05, shutdown_budget=NOTICE) as s:
        yield s


def replace(gcs: LocalGcs, role: str, text: str) -> None:
    """What anyone who may write the bucket can do to the object a VM's metadata points to."""
    key = getattr(SCRIPTS, role).key
    client(gcs.url).bucket(BUCKET).blob(key).upload_from_string(text.encode())


def delete(gcs: LocalGcs, role: str) -> None:
    client(gcs.url).bucket(BUCKET).blob(getattr(SCRIPTS, role).key).delete()


def ran_evil(srv: ComputeServer, name: str) -> bool:
    return any(p.name == "evil-ran" for p in srv.workdir_of(name).rglob("evil-ran"))


def test_a_vm_boots_and_runs_its_command_through_the_bootstrap(gcs, srv):
    boot(srv, "boot-1", "echo ran > ran.txt; exit 0")
    record = until("the exit record", lambda: read(gcs, "jobs/boot/exit"))
    assert (record["exit_code"], record["attempt"], record["token"]) == (0, 1, token_of("boot-1"))
    assert (srv.workdir_of("boot-1") / "ran.txt").read_text() == "ran\n"
    log = serial(srv, "boot-1")
    assert f"startup script {SCRIPTS.startup.sha256} verified" in log, log
    assert f"shutdown script {SCRIPTS.shutdown.sha256} verified" in log, log
    items = {i["key"]: i["value"] for i in srv.instance("boot-1")["metadata"]["items"]}
    assert "load_identity" not in items["startup-script"] + items["shutdown-script"], "the agent itself in metadata"
    assert items["respawn-startup-script-sha256"] == SCRIPTS.startup.sha256
    kept = srv.workdir_of("boot-1") / "state" / "scripts"
    assert (kept / "shutdown.sh").read_bytes() == SCRIPTS.shutdown.text
    assert kept.stat().st_mode & 0o077 == 0 and (kept / "shutdown.sh").stat().st_mode & 0o077 == 0, "root-only"
    until("the VM to power off", lambda: status(srv, "boot-1") == "TERMINATED")


@pytest.mark.parametrize("role", ["startup", "shutdown"])
def test_a_vm_whose_script_object_was_replaced_runs_nothing_of_it(gcs, srv, role):
    replace(gcs, role, EVIL)
    boot(srv, "swap-1", "echo ran > ran.txt; exit 0")
    until("the VM to power itself off", lambda: status(srv, "swap-1") == "TERMINATED", timeout=20)
    log = serial(srv, "swap-1")
    assert f"is not the controller's {role} script" in log and "running nothing, powering off" in log, log
    assert not ran_evil(srv, "swap-1"), "the replaced object ran"
    assert not (srv.workdir_of("swap-1") / "ran.txt").exists(), "a VM without the controller's scripts ran its command"
    assert read(gcs, "jobs/swap/exit") is None, "no record: the controller counts a VM off without one as failed"
    assert any(o["operationType"] == "compute.instances.guestTerminate" for o in srv.operations())


def test_a_script_that_cannot_be_fetched_runs_nothing_and_says_why(gcs, srv):
    delete(gcs, "startup")
    boot(srv, "gone-1", "echo ran > ran.txt; exit 0")
    until("the VM to give up and power off", lambda: status(srv, "gone-1") == "TERMINATED", timeout=30)
    log = serial(srv, "gone-1")
    assert "HTTP 404; trying again" in log and "could not fetch gs://" in log, log
    assert "no verified startup script: running nothing, powering off" in log, log
    assert not (srv.workdir_of("gone-1") / "ran.txt").exists()


def test_the_shutdown_bootstrap_runs_the_verified_local_copy(gcs, srv):
    boot(srv, "kept-2", TRAP)
    until("the trainer to start", lambda: (srv.workdir_of("kept-2") / "started.txt").exists())
    delete(gcs, "shutdown")  # a fetch now would find nothing: only the copy kept at boot can run
    srv.preempt("kept-2")
    marker = until("the marker", lambda: read(gcs, "preempted-jobs/kept"))
    assert (marker["reason"], marker["saved"], marker["token"]) == ("preempted", True, token_of("kept-2"))
    assert (srv.workdir_of("kept-2") / "got-sigterm.txt").exists(), "the trainer got no SIGTERM"
    assert "fetching" not in serial(srv, "kept-2")


def test_a_kept_shutdown_script_changed_on_the_vm_is_fetched_and_checked_again(gcs, srv):
    boot(srv, "tamper-2", TRAP)
    until("the trainer to start", lambda: (srv.workdir_of("tamper-2") / "started.txt").exists())
    kept = srv.workdir_of("tamper-2") / "state" / "scripts" / "shutdown.sh"
    kept.write_text(EVIL)
    srv.preempt("tamper-2")
    marker = until("the marker", lambda: read(gcs, "preempted-jobs/tamper"))
    assert marker["reason"] == "preempted" and not ran_evil(srv, "tamper-2")
    assert "not the one this VM's metadata names: fetching it again" in serial(srv, "tamper-2")
    assert kept.read_bytes() == SCRIPTS.shutdown.text


def test_a_changed_copy_whose_object_was_replaced_too_runs_nothing(gcs, srv):
    boot(srv, "both-2", TRAP)
    until("the trainer to start", lambda: (srv.workdir_of("both-2") / "started.txt").exists())
    (srv.workdir_of("both-2") / "state" / "scripts" / "shutdown.sh").write_text(EVIL)
    replace(gcs, "shutdown", EVIL)
    srv.preempt("both-2")
    until("the VM to stop", lambda: status(srv, "both-2") == "TERMINATED", timeout=20)
    assert not ran_evil(srv, "both-2") and read(gcs, "preempted-jobs/both") is None
    assert "no verified shutdown script: running nothing" in serial(srv, "both-2")


def test_the_controller_puts_its_own_script_back_over_a_replaced_object_and_vms_boot_again(gcs, srv):
    replace(gcs, "startup", EVIL)
    shelve(gcs, BUCKET)  # a new controller process, before its first insert
    assert client(gcs.url).bucket(BUCKET).blob(SCRIPTS.startup.key).download_as_bytes() == SCRIPTS.startup.text
    boot(srv, "again-1", "echo ran > ran.txt; exit 0")
    assert until("the exit record", lambda: read(gcs, "jobs/again/exit"))["exit_code"] == 0
    assert not ran_evil(srv, "again-1")
