"""image: jobs on the whole local cloud (issue 37): the controller, the real VM agent, podman on each
local VM pulling the trainer image (localcloud.images) from the local Artifact Registry with the VM's
own token. examples/container.yaml runs as shipped but for a shorter training; preempted with notice
and then hard, it saves inside its container and ends with the weights of an uninterrupted run. An
image that is not there, one the trainer's account may not pull, and a container that cannot start
(GPUs with no GPU runtime) each fail the job once, naming the cause; the exit code inside is the job's;
a trainer that ignores its SIGTERM never outlives its VM."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from typer.testing import CliRunner

from controller.cli.main import app
from controller.core import names
from controller.core.state import JobStatus, Phase
from localcloud.stack import LocalCloud, Options
from tests.harness import cli_against
from tests.wait import until

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS = 600  # at 0.05 s a step, longer than the notice (12 s here): the first attempt cannot finish in it


@pytest.fixture(scope="module")
def cloud(podman) -> Iterator[LocalCloud]:
    with LocalCloud(Options(tick_interval=1.0, boot_delay=0.1, shutdown_budget=3.0, images=True)) as c:
        yield c


def status(cloud: LocalCloud, job: str) -> JobStatus | None:
    blob = cloud.storage.bucket(cloud.options.bucket).get_blob(names.status_key(job))
    return JobStatus.from_json(blob.download_as_bytes()) if blob else None


def ended(cloud: LocalCloud, job: str, timeout: float = 180) -> JobStatus:
    return until(f"{job} to end", lambda: (st := status(cloud, job)) is not None and st.phase.terminal and st,
                 timeout=timeout)


def submit(cloud: LocalCloud, monkeypatch: pytest.MonkeyPatch, folder: Path, doc: dict[str, Any]) -> None:
    cli_against(cloud, monkeypatch)
    shutil.copy(EXAMPLES / "trainer.py", folder / "trainer.py")
    (folder / "spec.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    result = CliRunner().invoke(app, ["submit", str(folder / "spec.yaml"), "--yes"])
    assert result.exit_code == 0, result.output


def example(**changes: Any) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / "container.yaml").read_text())
    doc["env"].update(TRAIN_STEPS=str(STEPS), CHECKPOINT_EVERY="40", STEP_SECONDS="0.05")  # as shipped but 600 steps
    name = changes.get("name", doc["name"])
    where = doc["checkpoint"]["uri"].rsplit("/", 1)[0]  # the example's checkpoints bucket, a prefix of its own there
    return {**doc, "checkpoint": {"uri": f"{where}/{name}"}, **changes}


def uninterrupted_weights() -> str:
    spec = importlib.util.spec_from_file_location("example_trainer", EXAMPLES / "trainer.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.digest(module.train(STEPS))


def serial(cloud: LocalCloud, name: str) -> str:
    path = cloud.compute.workdir_of(name) / "serial-port-1.log"
    return path.read_text(errors="replace") if path.exists() else ""


def heartbeat(cloud: LocalCloud, job: str) -> dict[str, Any] | None:
    blob = cloud.storage.bucket(cloud.options.bucket).get_blob(names.heartbeat_key(job))
    return json.loads(blob.download_as_bytes()) if blob else None


@pytest.mark.timeout(300)  # three attempts, each pulling its image, and a 12 s notice
def test_the_example_preempted_with_notice_then_hard_saves_in_its_container_and_ends_as_an_uninterrupted_run(
        cloud, tmp_path, monkeypatch):
    job = "container-long"
    submit(cloud, monkeypatch, tmp_path, example(name=job))
    beat = until("the first attempt's first heartbeat", lambda: (b := heartbeat(cloud, job)) and b.get("attempt") == 1
                 and b, timeout=90)
    assert beat["pull_s"] >= 0 and beat["pull_started"] <= beat["pull_ended"] <= beat["trainer_started"]
    first = serial(cloud, f"{job}-1")
    assert f"pulling {cloud.trainer_image}" in first and "container runtime: podman" in first
    until("a save in the first attempt's container", lambda: "checkpoint at step 80" in serial(cloud, f"{job}-1"))
    cloud.compute.preempt(f"{job}-1")  # Spot's notice: the trainer saves in its container, the standby pulls
    second = until("the second attempt to train", lambda: (st := status(cloud, job)) and st.attempt >= 2
                   and "starting at step" in serial(cloud, f"{job}-{st.attempt}") and st, timeout=90)
    assert "preemption notice: checkpoint at step" in serial(cloud, f"{job}-1")
    resumed = serial(cloud, f"{job}-{second.attempt}")
    assert "starting at step 0" not in resumed, "resumed from the save made in the first attempt's container"
    until("a save in the second attempt's container", lambda: serial(cloud, f"{job}-{second.attempt}").count(
        "checkpoint at step") >= 1)
    cloud.compute.preempt(f"{job}-{second.attempt}", graceful=False)  # hard: SIGTERM at the soft-off only
    final = ended(cloud, job, timeout=90)
    assert final.phase == Phase.SUCCEEDED, final.message
    assert final.preemptions == 2 and final.failures == 0
    assert final.result is not None and final.result["weights"] == uninterrupted_weights()
    assert final.result["step"] == STEPS
    pulls = {s.attempt: s for s in final.ledger.spans if s.pull_started is not None}
    assert len(pulls) == 3 and all(s.pull_started <= s.pull_ended for s in pulls.values()), "each pull on the timeline"
    first = next(s for s in final.ledger.spans if s.attempt == 1)
    assert first.end is not None and pulls[2].pull_ended < first.end, "the standby pulled while the old VM still saved"


def test_a_missing_image_fails_the_job_once_naming_the_cause(cloud, tmp_path, monkeypatch):
    submit(cloud, monkeypatch, tmp_path, example(name="no-such-image", image=cloud.trainer_image + "-missing"))
    st = ended(cloud, "no-such-image")
    assert (st.phase, st.attempt, st.restarts, st.failures) == (Phase.FAILED, 1, 0, 0), st.message
    assert "could not be pulled" in st.message and "manifest unknown" in st.message and "not retried" in st.message
    until("its VM deleted", lambda: not [i for i in cloud.compute.instances() if i["name"].startswith("no-such-image-")])


def test_a_pull_the_trainers_account_may_not_make_fails_once_naming_the_permission(cloud, tmp_path, monkeypatch):
    other = cloud.trainer_image.replace(f"/{cloud.options.project}/", "/someone-elses-proj/")
    from localcloud import images
    cloud.registry.push_rootfs(other, images.trainer_rootfs(), env=images.TRAINER_ENV)  # there, not ours to read
    submit(cloud, monkeypatch, tmp_path, example(name="denied-image", image=other))
    st = ended(cloud, "denied-image")
    assert (st.phase, st.attempt) == (Phase.FAILED, 1), st.message
    assert "403" in st.message and "artifactregistry.repositories.downloadArtifacts" in st.message, st.message


def test_the_exit_code_inside_the_container_is_the_jobs(cloud, tmp_path, monkeypatch):
    submit(cloud, monkeypatch, tmp_path, example(name="exits-three", command="python -c 'import sys; sys.exit(3)'",
                                                 policy={"max_failures": 0}))
    st = ended(cloud, "exits-three")
    assert st.phase == Phase.FAILED and "command exited with code 3 on exits-three-1" in st.message, st.message


def test_gpus_without_a_gpu_runtime_fail_once_saying_what_the_vm_lacks(cloud, tmp_path, monkeypatch):
    devices = tmp_path / "dev"
    devices.mkdir()
    (devices / "nvidiactl").touch()  # a GPU VM's device, with no NVIDIA container runtime for podman
    monkeypatch.setitem(cloud.compute.vm_env, "RESPAWN_DEV_DIR", str(devices))
    submit(cloud, monkeypatch, tmp_path, example(name="no-gpu-runtime"))
    st = ended(cloud, "no-gpu-runtime")
    assert (st.phase, st.attempt) == (Phase.FAILED, 1), st.message
    assert "this VM has NVIDIA GPUs, but podman has no CDI device nvidia.com/gpu" in st.message, st.message


def test_a_trainer_that_ignores_its_sigterm_never_outlives_its_vm(cloud, tmp_path, monkeypatch):
    mark = f"stubborn-{os.getpid()}"
    stubborn = (f"python -c 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                f"print(\"{mark}\", flush=True); time.sleep(3600)'")
    submit(cloud, monkeypatch, tmp_path, example(name="stubborn", command=stubborn))
    until("the trainer to run in its container", lambda: mark in serial(cloud, "stubborn-1"), timeout=120)
    assert _processes(mark), "the trainer runs"
    requests.delete(f"{cloud.compute.endpoint}/compute/v1/projects/{cloud.options.project}/zones/us-central1-a/"
                    "instances/stubborn-1", timeout=10).raise_for_status()
    until("the VM to be gone", lambda: not [i for i in cloud.compute.instances() if i["name"] == "stubborn-1"],
          timeout=60)
    assert not _processes(mark), "the container's trainer outlived its VM"
    env = {**os.environ, **{k: str(cloud.compute.workdir_of("stubborn-1") / ".containers" / f)
                            for k, f in (("CONTAINERS_CONF", "containers.conf"), ("CONTAINERS_STORAGE_CONF", "storage.conf"))}}
    left = subprocess.run(["podman", "ps", "--all", "--quiet"], env=env, capture_output=True, text=True, timeout=60)
    assert left.returncode == 0 and left.stdout.strip() == "", left.stdout + left.stderr


def _processes(mark: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark.encode() in (entry / "cmdline").read_bytes() and b") Z " not in (entry / "stat").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return [p for p in found if p != os.getpid()]


def test_doctor_passes_the_shipped_container_example_its_image_there_and_the_trainer_allowed_to_pull_it(cloud):
    from tests.integration.test_local_doctor import doctor, line

    done = doctor(cloud, str(EXAMPLES / "container.yaml"))  # its local code: checked as respawn submit writes it
    assert line(done.stdout, "spec container-demo").startswith("✓"), done.stdout
    assert line(done.stdout, "container image ").startswith("✓") and cloud.trainer_image in done.stdout
    assert line(done.stdout, "container image pull").startswith("✓")


def test_the_shipped_container_example_runs_to_succeeded_as_shipped(cloud, monkeypatch):
    cli_against(cloud, monkeypatch)
    result = CliRunner().invoke(app, ["submit", str(EXAMPLES / "container.yaml"), "--yes"])
    assert result.exit_code == 0, result.output
    job = yaml.safe_load((EXAMPLES / "container.yaml").read_text())["name"]
    st = ended(cloud, job, timeout=100)
    assert st.phase == Phase.SUCCEEDED, st.message
    steps = int(yaml.safe_load((EXAMPLES / "container.yaml").read_text())["env"]["TRAIN_STEPS"])
    assert st.result is not None and st.result["step"] == steps


def test_the_spec_env_extends_the_images_environment_and_never_the_runtimes(cloud, tmp_path, monkeypatch):
    report = ("python -c 'import os, json; json.dump({k: os.environ.get(k) for k in (\"PATH\", \"EXTRA\", \"GREETING\")}, "
              "open(os.environ[\"RESPAWN_RESULT_FILE\"], \"w\"))'")
    env = {"PATH": "/opt/tools/bin:$PATH", "EXTRA": "${NOT_IN_THE_IMAGE}x", "GREETING": "it's \"quoted\" $$HOME"}
    submit(cloud, monkeypatch, tmp_path, example(name="env-in-image", command=report, env=env))
    st = ended(cloud, "env-in-image")
    assert st.phase == Phase.SUCCEEDED, st.message
    from localcloud import images
    assert st.result["PATH"] == f"/opt/tools/bin:{images.TRAINER_ENV['PATH']}", "the image's PATH, not the VM's"
    assert st.result["EXTRA"] == "${NOT_IN_THE_IMAGE}x" and st.result["GREETING"] == 'it\'s "quoted" $HOME'
