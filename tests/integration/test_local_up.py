"""A newcomer's first hour, as the README tells it: `respawn local up` in one terminal; in
another, exactly the lines it printed, then gcloud, `respawn submit`, and faults from
`respawn local preempt|stockout` that the controller heals."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from controller.core import names
from controller.service.config import REPO_ROOT
from controller.core.state import JobStatus, Phase
from localcloud.gcs import client
from tests.wait import Terminal, until

TOKEN = "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE"


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`respawn local up` running in its own process: what it printed (all along: a thread keeps
    reading), and the exports of the file it named."""
    shell = {k: v for k, v in os.environ.items() if not k.startswith(("RESPAWN_", "CLOUDSDK_", "STORAGE_EMULATOR"))}
    folder = tmp_path_factory.mktemp("respawn-local")
    with Terminal([sys.executable, "-m", "controller.cli", "local", "up", "--tick", "2", "--preemption-notice", "3",
                   "--dir", str(folder)], {**shell, "COLUMNS": "200"}, tmp_path_factory.mktemp("terminal-1")) as up:
        [source] = [line.split(maxsplit=1)[1].strip() for line in up.lines if line.startswith("source ")]
        exports = [line for line in Path(source).read_text().splitlines() if line.startswith("export ")]
        env = up.exports()
        yield {"lines": up.lines, "exports": exports, "env": env, "shell": shell, "source": Path(source),
               "folder": folder}
        assert up.stop(timeout=30) == 0
        # The dummy token and the exports went with the local cloud.
        assert not Path(env[TOKEN]).exists() and not Path(source).exists()


def terminal(up: dict[str, Any], home: Path) -> dict[str, str]:
    """A second terminal: the user's shell (no gcloud login: a fresh config), then the exports."""
    return {**up["shell"], "HOME": str(home), "CLOUDSDK_CONFIG": str(home / "gcloud"),
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1", "COLUMNS": "200", **up["env"]}


def test_local_up_names_one_file_a_second_terminal_sources_and_local_env_prints_it_again(up, tmp_path):
    assert up["source"].parent == up["folder"] and up["env"]["RESPAWN_BUCKET"] == "respawn-local"
    again = subprocess.run([sys.executable, "-m", "controller.cli", "local", "env", "--dir", str(up["folder"])],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert again.returncode == 0 and again.stdout == up["source"].read_text()
    sourced = subprocess.run(["bash", "-c", f"source {up['source']} && echo $RESPAWN_COMPUTE_ENDPOINT"],
                             capture_output=True, text=True, timeout=30, env=up["shell"])
    assert sourced.stdout.strip() == up["env"]["RESPAWN_COMPUTE_ENDPOINT"]
    none = subprocess.run([sys.executable, "-m", "controller.cli", "local", "env", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert none.returncode != 0 and "respawn local up" in none.stdout + none.stderr


def test_a_second_local_up_in_the_same_folder_is_refused_and_leaves_the_first_ones_exports(up):
    """Issue 39: a second `respawn local up` took local.env over, and removed it on its stop while the
    first still ran."""
    before = up["source"].read_text()
    second = subprocess.run([sys.executable, "-m", "controller.cli", "local", "up", "--dir", str(up["folder"])],
                            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                            env={**up["shell"], "COLUMNS": "200"})
    said = " ".join((second.stdout + second.stderr).split())
    assert second.returncode == 2 and "a local cloud is already up" in said and "--dir DIR" in said, said
    assert up["source"].read_text() == before


def test_a_deploy_to_another_project_from_a_shell_that_sourced_local_env_is_refused_and_its_unset_line_clears_it(
        up, tmp_path):
    """Issue 39: `respawn deploy --project my-proj --dry-run` there planned my-proj's roles for the local
    project's trainer. Refused, naming every variable local.env exported in its `unset` line; that line
    run, the plan is my-proj's. A deploy to the local cloud's own project from that shell is planned."""
    env = terminal(up, tmp_path)
    deploy = [sys.executable, "-m", "controller.cli", "deploy", "--dry-run"]
    refused = subprocess.run([*deploy, "--project", "my-proj"], capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL, env=env)
    said = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode == 2 and "this shell points at the local cloud (project respawn-local)" in said, said
    unset = said.rpartition("or first: unset ")[2].split()
    assert sorted(unset) == sorted(up["env"]), said  # every variable local.env exports, and only those
    cleared = subprocess.run(["bash", "-c", f"source {shlex.quote(str(up['source']))} && unset {' '.join(unset)} && "
                              f"{shlex.join(deploy)} --project my-proj --region us-central1 --bucket my-bucket"],
                             capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                             env={k: v for k, v in env.items() if k not in up["env"]})
    assert cleared.returncode == 0, cleared.stdout + cleared.stderr
    assert "--member=serviceAccount:respawn-trainer@my-proj.iam.gserviceaccount.com" in cleared.stdout
    assert "respawn-local" not in cleared.stdout and "127.0.0.1" not in cleared.stdout
    own = subprocess.run(deploy, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, env=env)
    assert own.returncode == 0 and "gs://respawn-local" in own.stdout, own.stdout + own.stderr


def test_local_up_prints_one_line_that_gives_gcloud_a_token(up):
    [value] = [up["env"][TOKEN]]
    token = Path(value)
    assert token.is_absolute() and token.is_file()
    assert token.read_text().strip() and len(token.read_text().splitlines()) == 1
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert any("gcloud compute instances list" in x for x in up["lines"])  # and says what it is for


@pytest.fixture
def gcloud() -> str:
    found = shutil.which("gcloud")
    if found is None:
        pytest.skip("gcloud is not on PATH: `gcloud compute instances list` against the local cloud was not run")
    return found


def test_gcloud_lists_the_local_instances_with_exactly_the_printed_lines(up, gcloud, tmp_path):
    env = terminal(up, tmp_path)
    compute, project = env["RESPAWN_COMPUTE_ENDPOINT"], env["RESPAWN_PROJECT"]
    body = {"name": "listed-1", "machineType": "zones/us-central1-c/machineTypes/e2-small",
            "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
            "networkInterfaces": [{"network": "global/networks/default"}]}
    requests.post(f"{compute}/compute/v1/projects/{project}/zones/us-central1-c/instances", json=body,
                  timeout=10).raise_for_status()
    until("listed-1 RUNNING", lambda: requests.get(
        f"{compute}/compute/v1/projects/{project}/zones/us-central1-c/instances/listed-1", timeout=10).json().get(
        "status") == "RUNNING")

    listed = subprocess.run([gcloud, "compute", "instances", "list"], env=env, capture_output=True, text=True,
                            timeout=120, stdin=subprocess.DEVNULL)
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"^listed-1\s+us-central1-c\s+e2-small\s.*RUNNING$", listed.stdout, re.M), listed.stdout
    tpus = subprocess.run([gcloud, "compute", "tpus", "tpu-vm", "list", "--zone", "us-central1-c"], env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert tpus.returncode == 0, tpus.stderr
    # Without the token line, gcloud sends nothing: that one line is what makes it work.
    bare = {k: v for k, v in env.items() if k != TOKEN}
    refused = subprocess.run([gcloud, "compute", "instances", "list"], env=bare, capture_output=True, text=True,
                             timeout=120, stdin=subprocess.DEVNULL)
    assert refused.returncode != 0 and "listed-1" not in refused.stdout
    assert re.search(r"credential|account|auth", refused.stderr, re.I), refused.stderr


def test_respawn_heals_a_job_preempted_from_another_terminal(up, tmp_path):
    """The README's walkthrough: submit your own job, stock out its zone, preempt its VM; it
    resumes in the other zone from its checkpoint, and finishes."""
    env = terminal(up, tmp_path)
    spec = tmp_path / "mine.yaml"
    spec.write_text("zones: [us-central1-a, us-central1-b]\n"
                    "machine_type: g2-standard-8\n"
                    f"command: python {REPO_ROOT}/examples/trainer.py\n"
                    # Longer than the preemption's 12 s notice (the old VM trains on through it).
                    'env: {TRAIN_STEPS: "900", CHECKPOINT_EVERY: "30", STEP_SECONDS: "0.03"}\n'
                    "checkpoint: {uri: gs://respawn-local/checkpoints/mine}\n"
                    "placement: ordered\n")

    def respawn(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "controller.cli", *args], env=env, capture_output=True,
                              text=True, timeout=60, cwd=tmp_path, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    storage = client(env["STORAGE_EMULATOR_HOST"], env["RESPAWN_PROJECT"]).bucket(env["RESPAWN_BUCKET"])

    def status() -> JobStatus | None:
        blob = storage.get_blob(names.status_key("mine"))
        return JobStatus.from_json(blob.download_as_bytes()) if blob else None

    assert "submitted mine" in respawn("submit", str(spec))
    until("mine-1 running", lambda: (s := status()) and s.phase == Phase.RUNNING and s.instances == ("mine-1",), 60)
    until("a checkpoint", lambda: any(b.name.endswith("/_SUCCESS") for b in storage.list_blobs(
        prefix="checkpoints/mine/")), 60)
    assert "stockout in us-central1-a" in respawn("local", "stockout", "us-central1-a")
    try:
        assert "mine-1 (Compute Engine): preempted" in respawn("local", "preempt", "mine-1")
        final = until("mine to finish", lambda: (s := status()) and s.phase.terminal and s, 90)
    finally:
        respawn("local", "stockout", "us-central1-a", "--off")
    assert final.phase == Phase.SUCCEEDED, final.message
    assert (final.attempt, final.preemptions, final.failures, final.zone) == (2, 1, 0, "us-central1-b")
    assert final.resume_from is not None and final.resume_from.step
    # The terminal running the local cloud showed the controller at work, a line per action. It
    # follows the functions' logs every half second, so the last line may come a moment after the
    # status it reports was written.
    actions = ("create mine-1 in us-central1-a: done", "create mine-2 in us-central1-b: done",
               "status SUCCEEDED attempt 2")
    try:
        until("the actions shown", lambda: all(action in "".join(up["lines"]) for action in actions), 10)
    except AssertionError:
        shown = "".join(up["lines"])
        assert [a for a in actions if a not in shown] == [], shown[-3000:]


def test_local_up_makes_the_checkpoints_bucket(up):
    """`respawn run`'s default place for checkpoints, made as `respawn deploy` makes it: beside the control
    bucket, uniform access on, the trainer's read and write and the controller's read on it alone."""
    env = up["env"]
    storage = client(env["STORAGE_EMULATOR_HOST"], env["RESPAWN_PROJECT"])
    made = storage.get_bucket(f"{env['RESPAWN_BUCKET']}-checkpoints")
    assert made.iam_configuration.uniform_bucket_level_access_enabled
    project = env["RESPAWN_PROJECT"]
    assert {(b["role"], tuple(sorted(b["members"]))) for b in made.get_iam_policy(requested_policy_version=3).bindings} \
        == {("roles/storage.objectUser", (f"serviceAccount:respawn-trainer@{project}.iam.gserviceaccount.com",)),
            ("roles/storage.objectViewer", (f"serviceAccount:respawn-controller@{project}.iam.gserviceaccount.com",))}


def test_respawn_run_with_its_default_checkpoint_resumes_a_preempted_job_from_the_checkpoints_bucket(up, tmp_path):
    """Issue 39: `respawn run` without --checkpoint on the local cloud. The trainer saves under
    gs://respawn-local-checkpoints/<job>; preempted, the job is recreated by the controller from the
    checkpoint it found there, and finishes."""
    env = terminal(up, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(REPO_ROOT / "examples" / "trainer.py", work / "trainer.py")

    def respawn(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "controller.cli", *args], env=env, capture_output=True,
                              text=True, timeout=60, cwd=tmp_path, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout + done.stderr

    storage = client(env["STORAGE_EMULATOR_HOST"], env["RESPAWN_PROJECT"])
    control, checkpoints = storage.bucket(env["RESPAWN_BUCKET"]), storage.bucket(f"{env['RESPAWN_BUCKET']}-checkpoints")

    def status() -> JobStatus | None:
        blob = control.get_blob(names.status_key("ckdefault"))
        return JobStatus.from_json(blob.download_as_bytes()) if blob else None

    said = respawn("run", "-n", "ckdefault", "-z", "us-central1-a", "-m", "g2-standard-8", "--workdir", str(work),
                   "-e", "TRAIN_STEPS=900", "-e", "CHECKPOINT_EVERY=30", "-e", "STEP_SECONDS=0.03", "--yes",
                   "--", "python trainer.py")
    assert "uri: gs://respawn-local-checkpoints/ckdefault" in said and "names no checkpoint" not in said, said
    until("ckdefault-1 running", lambda: (s := status()) and s.phase == Phase.RUNNING and s.instances == ("ckdefault-1",),
          60)
    until("a checkpoint in the checkpoints bucket", lambda: any(
        b.name.endswith("/_SUCCESS") for b in checkpoints.list_blobs(prefix="ckdefault/")), 60)
    assert "ckdefault-1 (Compute Engine): preempted" in respawn("local", "preempt", "ckdefault-1")
    final = until("ckdefault to finish", lambda: (s := status()) and s.phase.terminal and s, 120)
    assert final.phase == Phase.SUCCEEDED, final.message
    assert (final.attempt, final.preemptions) == (2, 1)
    # the controller found the checkpoint there, and the second attempt resumed from it
    assert final.resume_from is not None and final.resume_from.step
    assert final.resume_from.uri.startswith("gs://respawn-local-checkpoints/ckdefault/"), final.resume_from
    assert not list(control.list_blobs(prefix="checkpoints/ckdefault"))  # nothing of it in the control bucket
