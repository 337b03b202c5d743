"""TPU slices in Compute Engine on the whole local cloud (issue 38): the controller, the real VM agent on
each host, the local Compute's TPU machine types and MIGs. examples/tpu7x-slice.yaml (two hosts of
tpu7x-standard-4t in one MIG) and examples/tpu7x-single.yaml (one instance) run as shipped but for a
longer training; each is preempted with notice (a graceful shutdown) and then hard, is replaced whole
each time from the newest complete checkpoint, and ends with the weights of an uninterrupted run. A
slice whose job folder is deleted is deleted."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from controller.cli import buckets
from controller.cli.main import app
from controller.core import names
from controller.core.state import JobStatus, Phase
from localcloud.stack import LocalCloud, Options
from tests.harness import cli_against
from tests.wait import until

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS = 600  # at 0.05 s a step: long enough to lose two slices on the way


@pytest.fixture(scope="module")
def cloud() -> Iterator[LocalCloud]:
    with LocalCloud(Options(tick_interval=1.0, boot_delay=0.1, shutdown_budget=3.0)) as c:
        yield c


def status(cloud: LocalCloud, job: str) -> JobStatus | None:
    blob = cloud.storage.bucket(cloud.options.bucket).get_blob(names.status_key(job))
    return JobStatus.from_json(blob.download_as_bytes()) if blob else None


def submit(cloud: LocalCloud, monkeypatch: pytest.MonkeyPatch, folder: Path, example: str, **changes: Any) -> str:
    doc = yaml.safe_load((EXAMPLES / example).read_text())
    doc["env"].update(TRAIN_STEPS=str(STEPS))
    doc.update(changes)
    # Its own prefix in the checkpoints bucket, as the examples have it: never another job's.
    doc["checkpoint"] = {"uri": buckets.default_checkpoint(cloud.options.bucket, doc["name"])}
    cli_against(cloud, monkeypatch)
    shutil.copy(EXAMPLES / "trainer.py", folder / "trainer.py")
    (folder / "spec.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    result = CliRunner().invoke(app, ["submit", str(folder / "spec.yaml"), "--yes"])
    assert result.exit_code == 0, result.output
    return doc["name"]


def hosts(cloud: LocalCloud, node: str) -> dict[int, str]:
    """The VMs of slice ``node`` by their rank (what each one's trainer says it is)."""
    found: dict[int, str] = {}
    for vm in cloud.compute.instances():
        if vm.get("labels", {}).get("respawn-slice") == node:
            for rank in range(4):
                if f"(rank {rank} of" in serial(cloud, vm["name"]):
                    found[rank] = vm["name"]
    return found


def serial(cloud: LocalCloud, name: str) -> str:
    path = cloud.compute.workdir_of(name) / "serial-port-1.log"
    return path.read_text(errors="replace") if path.exists() else ""


def uninterrupted_weights() -> str:
    spec = importlib.util.spec_from_file_location("example_trainer", EXAMPLES / "trainer.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.digest(module.train(STEPS))


def training(cloud: LocalCloud, job: str, attempt: int, ranks: int, saves: int = 1) -> dict[int, str]:
    """The attempt's hosts once every rank trains and rank 0 saved ``saves`` times in this attempt."""
    def up() -> dict[int, str] | None:
        found = hosts(cloud, f"{job}-{attempt}")
        if len(found) == ranks and serial(cloud, found[0]).count("checkpoint at step") >= saves:
            return found
        return None
    try:
        return until(f"attempt {attempt} of {job} training on {ranks} host(s)", up, timeout=90)
    except AssertionError as e:
        st = status(cloud, job)
        raise AssertionError(f"{e}; {job} is {st and st.phase}: {st and st.message}") from None


@pytest.mark.timeout(300)
def test_a_multi_host_slice_preempted_with_notice_then_hard_is_replaced_whole_and_ends_as_an_uninterrupted_run(
        cloud, tmp_path, monkeypatch):
    job = submit(cloud, monkeypatch, tmp_path, "tpu7x-slice.yaml")
    first = training(cloud, job, 1, ranks=2, saves=2)
    assert len(cloud.compute.mig(f"{job}-1")["name"]) and cloud.compute.mig(f"{job}-1")["targetSize"] == 2
    # One host of the two preempted, with its shutdown: the slice is broken; respawn deletes it whole (its other
    # host's shutdown script SIGTERMs rank 0, which saves), then creates the next slice from that save.
    cloud.compute.preempt(first[1])
    second = training(cloud, job, 2, ranks=2)
    st = status(cloud, job)
    assert st is not None and st.preemptions == 1 and st.resume_from is not None
    assert "checkpointed at step" in serial(cloud, first[0]), "rank 0 saved on the SIGTERM of the slice's delete"
    assert "starting at step 0 " not in serial(cloud, second[0])
    assert f"{job}-1" not in cloud.compute.mig_names(), "the broken slice was deleted whole"
    # Rank 0's host preempted hard: no shutdown script, no save; the next slice resumes from the last periodic one.
    until("a save in the second slice", lambda: serial(cloud, second[0]).count("checkpoint at step") >= 2)
    cloud.compute.preempt(second[0], graceful=False)
    final = until(f"{job} to end", lambda: (s := status(cloud, job)) is not None and s.phase.terminal and s,
                  timeout=150)
    assert final.phase == Phase.SUCCEEDED, final.message
    assert final.preemptions == 2 and final.failures == 0 and final.attempt == 3
    assert final.result is not None and final.result["weights"] == uninterrupted_weights()
    launch = next(e for e in final.history if e.event == "launch")
    assert "Compute Engine TPU slice 2x2x2: 2 hosts of tpu7x-standard-4t" in launch.detail
    # The hosts' logs read as VMs' (gce_instance, by the ids the status recorded), each attempt's together.
    logs = CliRunner().invoke(app, ["logs", job, "--limit", "2000"])
    assert logs.exit_code == 0, logs.output
    for attempt in (1, 2, 3):
        header = next((line for line in logs.output.splitlines() if line.startswith(f"── attempt {attempt}:")), "")
        assert header.count(f"{job}-{attempt}-w-") == 2, logs.output[-3000:]
    assert "(rank 1 of 2)" in logs.output and "(rank 0 of 2)" in logs.output
    until("every slice gone", lambda: not [n for n in cloud.compute.mig_names() if n.startswith(f"{job}-")]
          and not hosts(cloud, f"{job}-3"))


@pytest.mark.timeout(240)
def test_a_single_host_slice_preempted_with_notice_then_hard_ends_as_an_uninterrupted_run(
        cloud, tmp_path, monkeypatch):
    job = submit(cloud, monkeypatch, tmp_path, "tpu7x-single.yaml")
    training(cloud, job, 1, ranks=1, saves=2)
    assert cloud.compute.instance(f"{job}-1")["machineType"].endswith("/machineTypes/tpu7x-standard-4t")
    assert not [n for n in cloud.compute.mig_names() if n.startswith(job)], "one host: an instance, no MIG"
    cloud.compute.preempt(f"{job}-1")
    training(cloud, job, 2, ranks=1, saves=2)
    assert "checkpointed at step" in serial(cloud, f"{job}-1"), "saved on its shutdown's SIGTERM"
    cloud.compute.preempt(f"{job}-2", graceful=False)
    final = until(f"{job} to end", lambda: (s := status(cloud, job)) is not None and s.phase.terminal and s,
                  timeout=150)
    assert final.phase == Phase.SUCCEEDED, final.message
    assert (final.preemptions, final.failures, final.attempt) == (2, 0, 3)
    assert final.result is not None and final.result["weights"] == uninterrupted_weights()


@pytest.mark.timeout(180)
def test_a_slice_whose_job_folder_is_deleted_is_deleted(cloud, tmp_path, monkeypatch):
    job = submit(cloud, monkeypatch, tmp_path, "tpu7x-slice.yaml", name="tpu7x-orphan")
    training(cloud, job, 1, ranks=2)
    bucket = cloud.storage.bucket(cloud.options.bucket)
    for blob in bucket.list_blobs(prefix=f"jobs/{job}/"):
        blob.delete()
    until("the orphaned slice deleted", lambda: f"{job}-1" not in cloud.compute.mig_names()
          and not hosts(cloud, f"{job}-1"), timeout=90)


@pytest.mark.timeout(180)
def test_the_quickstart_example_runs_to_succeeded_on_the_local_cloud_as_shipped(cloud, monkeypatch):
    """Issue 39: `respawn submit examples/quickstart.yaml -y` after `respawn local up`, the file as it is."""
    cli_against(cloud, monkeypatch)
    monkeypatch.chdir(EXAMPLES.parent)
    result = CliRunner().invoke(app, ["submit", "examples/quickstart.yaml", "--yes"])
    assert result.exit_code == 0, result.output
    final = until("quickstart to end", lambda: (s := status(cloud, "quickstart")) is not None and s.phase.terminal
                  and s, timeout=150)
    assert final.phase == Phase.SUCCEEDED, final.message
    assert final.result is None or final.result.get("step") in (None, 400)
