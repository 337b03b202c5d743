"""A newcomer's first hour, third pass (issue 39): a job without a checkpoint is warned about (and
`respawn run` gives it one: its own folder in the checkpoints bucket deploy makes), a zone Google does not have is refused with the one meant, and `run`
says every missing flag at once, and the file of this folder its command names that the VM lacks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from controller.cli import buckets
from controller.cli.main import app
from controller.core import names
from controller.service import bootstrap
from controller.service.config import Settings
from tests.harness import PROJECT, TRAINER, under_cli
from tests.service.test_cli import BUCKET, mem  # noqa: F401 - the fixture

runner = CliRunner()
RUN = ["run", "-n", "tune", "-z", "us-central1-a", "-m", "g2-standard-8", "--yes"]


def _spec(tmp_path, **fields) -> str:
    from tests.harness import spec_doc

    path = tmp_path / "j.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in spec_doc(**fields).items() if v is not None}))
    return str(path)


def test_validate_and_submit_warn_of_a_spec_without_checkpoint_with_the_line_to_add(mem, tmp_path):  # noqa: F811
    path = _spec(tmp_path, checkpoint=None)
    for command in (["validate", path], ["submit", "--dry-run", path]):
        result = runner.invoke(app, command)
        assert result.exit_code == 0, result.output  # a warning, not a refusal
        said = " ".join(result.output.split())
        assert "! j names no checkpoint: each preemption restarts it from step 0" in said, command
        assert "checkpoint: {uri: gs://BUCKET-checkpoints/j}" in result.output, command
    assert "no checkpoint" not in runner.invoke(app, ["validate", _spec(tmp_path)]).output


def test_run_defaults_its_checkpoint_to_the_deploys_checkpoints_bucket_under_the_jobs_name(mem, tmp_path, monkeypatch):  # noqa: F811
    # Not under the control bucket: the trainers' account may neither list nor read its other objects
    # (deploy/IAM.md), and resuming lists the checkpoint folder. The bucket deploy makes beside it.
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, [*RUN, "--", "echo hi"])
    assert result.exit_code == 0, result.output
    assert "names no checkpoint" not in result.output, result.output
    assert f"uri: gs://{BUCKET}-checkpoints/tune" in result.output  # the spec it made, printed
    stored = yaml.safe_load(mem.store.read(BUCKET, names.spec_key("tune")).data)
    assert stored["checkpoint"] == {"uri": f"gs://{BUCKET}-checkpoints/tune"}
    assert buckets.default_checkpoint(BUCKET, "tune") == f"gs://{buckets.checkpoints_bucket(BUCKET)}/tune"
    given = runner.invoke(app, [*RUN, "-n", "mine", "--checkpoint", "gs://ckpts/mine", "--", "echo hi"])
    assert given.exit_code == 0 and "names no checkpoint" not in given.output, given.output
    assert yaml.safe_load(mem.store.read(BUCKET, names.spec_key("mine")).data)["checkpoint"] == {"uri": "gs://ckpts/mine"}


def test_run_no_checkpoint_keeps_none_and_warns_that_a_preemption_restarts_it_from_step_0(mem, tmp_path,  # noqa: F811
                                                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, [*RUN, "--no-checkpoint", "--", "echo hi"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "tune names no checkpoint: each preemption restarts it from step 0" in said, said
    assert "checkpoint" not in yaml.safe_load(mem.store.read(BUCKET, names.spec_key("tune")).data)
    both = runner.invoke(app, [*RUN, "-n", "both", "--no-checkpoint", "--checkpoint", "gs://c/b", "--", "echo hi"])
    assert both.exit_code == 2 and "--checkpoint and --no-checkpoint: give one or the other" in both.output
    assert not mem.store.exists(BUCKET, names.spec_key("both"))


@pytest.mark.parametrize("control, why", [
    ("b" * 52, f"gs://{'b' * 52}-checkpoints would be 64 characters long, and a bucket name is at most 63"),
    ("ckpt.example.com", "gs://ckpt.example.com-checkpoints has dots"),
])
def test_run_asks_for_a_checkpoint_where_the_control_bucket_leaves_no_checkpoints_bucket(tmp_path, monkeypatch,
                                                                                          control, why):
    h = under_cli(monkeypatch)
    bootstrap.override(None, Settings(bucket=control, project=PROJECT, trainer_service_account=TRAINER), h.store,
                       h.compute)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, [*RUN, "--", "echo hi"])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert f"✗ no default place for tune's checkpoints: {why}" in said, said
    assert "--checkpoint gs://BUCKET/tune" in said and "--no-checkpoint" in said
    assert not h.store.exists(control, names.spec_key("tune"))
    assert runner.invoke(app, [*RUN, "--no-checkpoint", "--", "echo hi"]).exit_code == 0


def test_a_run_whose_default_checkpoints_bucket_is_not_there_is_refused_naming_deploy(tmp_path, monkeypatch):
    """An older deploy made no checkpoints bucket: the controller could never list the job's checkpoints."""
    h = under_cli(monkeypatch)
    h.store.buckets = {BUCKET}  # the control bucket alone, as a deploy older than the checkpoints bucket left it
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, [*RUN, "--", "echo hi"])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert f"bucket gs://{BUCKET}-checkpoints does not exist" in said and "run respawn deploy again" in said, said
    assert "--from checkpoints-bucket" in said and "restart respawn local up" in said
    assert not h.store.exists(BUCKET, names.spec_key("tune"))


def test_submit_warns_of_a_checkpoint_in_the_control_bucket_naming_the_checkpoints_bucket_as_the_fix(mem, tmp_path):  # noqa: F811
    """The examples had gs://respawn-local/checkpoints/<job>: the trainers' account may write only its VM
    records there (deploy/IAM.md), so a trainer could never save. A warning, not a refusal: an operator may
    have granted it more (respawn doctor SPEC judges the grant)."""
    result = runner.invoke(app, ["submit", "--yes", _spec(tmp_path, checkpoint={"uri": f"gs://{BUCKET}/checkpoints/j"})])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"! checkpoint.uri: gs://{BUCKET}/checkpoints/j is in the control bucket gs://{BUCKET}, where the " \
           "trainers' account may write only its VM records (deploy/IAM.md): the trainer could save no checkpoint" in said
    assert "unless you granted it more there (respawn doctor SPEC checks the grant)" in said, said
    assert f"  checkpoint: {{uri: gs://{BUCKET}-checkpoints/j}}  # the checkpoints bucket respawn deploy makes" \
        in result.output.splitlines(), result.output
    assert mem.store.exists(BUCKET, names.spec_key("j"))  # submitted as it is


def test_run_with_a_checkpoint_in_the_control_bucket_warns_with_the_flag_that_fixes_it(mem, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, [*RUN, "--checkpoint", f"gs://{BUCKET}/tune", "--", "echo hi"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"! --checkpoint: gs://{BUCKET}/tune is in the control bucket gs://{BUCKET}" in said, said
    assert f"--checkpoint gs://{BUCKET}-checkpoints/tune # or leave it out: respawn run's default" in said


def test_a_checkpoint_in_the_checkpoints_bucket_or_another_is_not_warned_of(mem, tmp_path):  # noqa: F811
    for uri in (f"gs://{BUCKET}-checkpoints/j", "gs://ckpts/j", f"gs://{BUCKET}-other/j"):
        result = runner.invoke(app, ["submit", "--dry-run", _spec(tmp_path, checkpoint={"uri": uri})])
        assert result.exit_code == 0 and "control bucket" not in result.output, (uri, result.output)


def test_validate_and_submit_of_a_sweep_file_say_in_one_line_it_is_one_and_the_command_that_takes_it(mem):  # noqa: F811
    """Issue 39: `respawn validate examples/sweep.yaml` said five unknown fields and two missing ones."""
    from pathlib import Path

    path = str(Path(__file__).parents[2] / "examples" / "sweep.yaml")
    for command in (["validate", path], ["submit", "--yes", path]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, result.output
        assert result.output.strip() == (f"✗ {path} is a sweep file (its base: and parameters: make trials, each a "
                                         f"job), not a job spec: respawn sweep submit {path}"), result.output
    assert mem.store.list(BUCKET, "jobs/") == [] and mem.store.list(BUCKET, "code/") == []


def test_runs_help_example_shows_its_default_checkpoint():
    text = " ".join(runner.invoke(app, ["run", "--help"], terminal_width=80).output.split())
    assert "respawn run -n tune -z us-central1-a -m g2-standard-8 --workdir . -- python train.py" in text
    assert "Its checkpoints go to gs://BUCKET-checkpoints/tune" in text and "RESPAWN_CHECKPOINT_URI" in text
    assert "--no-checkpoint" in text and "--checkpoint gs://" in text


def test_a_zone_google_does_not_have_is_refused_by_validate_and_submit_with_the_zone_meant(mem, tmp_path):  # noqa: F811
    path = _spec(tmp_path, zones=["us-central1-a", "us-central1-z"])
    for command in (["validate", path], ["submit", "--dry-run", path]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, result.output
        said = " ".join(result.output.split())
        assert "✗ zones.1: 'us-central1-z' is not a Compute Engine zone (us-central1 has zones a, b, c, f); " \
               "did you mean us-central1-a?" in said, command
        assert "RESPAWN_EXTRA_ZONES=us-central1-z" in said and "controller/core/zones.py" in said
    assert not mem.store.exists(BUCKET, names.spec_key("j"))  # nothing uploaded
    typo = runner.invoke(app, ["validate", _spec(tmp_path, zones=["us-centrl1-b"])])
    assert typo.exit_code == 2 and "(there is no region us-centrl1); did you mean us-central1-b?" in \
        " ".join(typo.output.split()), typo.output


def test_a_zone_google_added_since_is_taken_when_named_in_respawn_extra_zones(mem, tmp_path, monkeypatch):  # noqa: F811
    path = _spec(tmp_path, zones=["us-central1-z"])
    monkeypatch.setenv("RESPAWN_EXTRA_ZONES", "us-east9-a, us-central1-z")
    result = runner.invoke(app, ["validate", path])
    assert result.exit_code == 0, result.output


def test_the_controller_never_refuses_a_spec_for_its_zone_table():
    """Google adds zones: a spec in the bucket is judged by Google's answer, not by this table."""
    from controller.core.policy import ControllerPolicy
    from controller.core.spec import parse_spec
    from tests.harness import spec_doc

    spec = parse_spec(yaml.safe_dump(spec_doc(zones=["us-central1-z"])).encode(), "j")
    policy = ControllerPolicy(default_project="p", trainer_service_account="t@p.iam.gserviceaccount.com")
    assert policy.violations(spec) == [] and len(policy.unknown_zones(spec)) == 1


def test_the_zone_table_holds_every_zone_of_the_local_cloud_tpus_and_examples():
    import re
    import subprocess
    from pathlib import Path

    from controller.core import tpus, zones
    from localcloud.compute import ZONES as COMPUTE
    from localcloud.tpu import ZONES as TPU

    assert set(COMPUTE) | set(TPU) <= zones.ZONES
    assert {z for m in tpus.MACHINES.values() for z in m.zones} <= zones.ZONES
    root = Path(__file__).parents[2]
    text = subprocess.run(["git", "grep", "-h", "zones", "--", "examples", "README.md", "docs"], cwd=root,
                          capture_output=True, text=True).stdout
    named = set(re.findall(r"\b[a-z]+-[a-z]+\d+-[a-z]\b", text))
    assert named and named <= zones.ZONES, named - zones.ZONES
    assert "us-central1-f" in zones.ZONES and "europe-west1-a" not in zones.ZONES  # letters as Google has them


def test_run_reports_every_missing_flag_at_once(mem, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["run"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["✗ --name (-n)", "✗ --zone (-z)", "✗ --machine-type (-m)",
                                                      "✗ COMMAND"], result.output
    tpu = runner.invoke(app, ["run", "-n", "t", "--tpu", "v4-8", "--", "echo"])  # a TPU needs no machine type
    assert tpu.exit_code == 2 and tpu.output.strip().splitlines() == [
        "✗ --zone (-z): required: a zone to run in, e.g. --zone us-central1-a (repeat it for more)"], tpu.output


def test_run_of_a_file_in_this_folder_without_workdir_says_the_vm_will_not_have_it(mem, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    for command in (["python", "train.py"], ["python -u train.py --epochs 3"]):
        result = runner.invoke(app, [*RUN, "--", *command])
        assert result.exit_code == 2, result.output
        assert "✗ --workdir: train.py is in this folder, but the VM will not have it: send this folder with " \
               "--workdir ." in " ".join(result.output.split())
        assert not mem.store.exists(BUCKET, names.spec_key("tune"))
    sent = runner.invoke(app, [*RUN, "--workdir", ".", "--", "python", "train.py"])
    assert sent.exit_code == 0 and "--workdir" not in sent.output.replace("--workdir .", ""), sent.output
    assert runner.invoke(app, [*RUN, "-n", "other", "--", "python", "other.py"]).exit_code == 0  # no such file here


def test_doctor_against_a_stopped_local_cloud_says_so_at_once_instead_of_twenty_crosses(monkeypatch):
    """Issue 39: doctor took 21.5 s, printed 20 ✗ and first suggested a Google login."""
    import socket

    with socket.socket() as s:  # a port nothing listens on: the local cloud that was
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RESPAWN_PROJECT", "respawn-local")
    monkeypatch.setenv("RESPAWN_BUCKET", "respawn-local")
    monkeypatch.setenv("RESPAWN_REGION", "us-central1")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("RESPAWN_COMPUTE_ENDPOINT", f"http://127.0.0.1:{port}")
    result = runner.invoke(app, ["doctor"])
    said = " ".join(result.output.split())
    assert result.exit_code == 3 and "is `respawn local up` still running?" in said, said
    assert "gcloud auth" not in said and "✓" not in said  # one line, before any check runs


def test_submit_refuses_a_checkpoint_bucket_or_a_code_tarball_that_does_not_exist_naming_the_fix(mem, tmp_path):  # noqa: F811
    """Issue 39: the shipped example passed doctor and submit, then sat PENDING for ever: its checkpoint.uri
    and code: named a bucket that does not exist."""
    mem.store.buckets = {BUCKET, "ckpts"}
    path = _spec(tmp_path, checkpoint={"uri": "gs://my-ckpts-bucket/llm"})
    result = runner.invoke(app, ["submit", "--yes", path])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "bucket gs://my-ckpts-bucket does not exist" in said, said
    assert "gcloud storage buckets create gs://my-ckpts-bucket" in said
    assert mem.store.list(BUCKET, "jobs/") == []
    path = _spec(tmp_path, checkpoint={"uri": "gs://ckpts/llm"}, code="gs://ckpts/code/missing.tar.gz")
    result = runner.invoke(app, ["submit", "--yes", path])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "code: gs://ckpts/code/missing.tar.gz does not exist" in said, said


# Every command taking a JOB, with the words around it; rm of a job not there does nothing and exits 0.
JOB_COMMANDS = {"status": [], "report": [], "logs": [], "history": [], "cancel": [], "reconcile": [],
                "reconcile --dry-run": ["--dry-run"], "rm": []}


@pytest.mark.parametrize("command", list(JOB_COMMANDS))
def test_every_command_taking_a_job_suggests_the_job_likely_meant(mem, command):  # noqa: F811
    """Issue 39: only status said "did you mean"; report, logs, cancel... said only "no job named"."""
    mem.submit("finetune")
    result = runner.invoke(app, [command.split()[0], "fintune", *JOB_COMMANDS[command]])
    said = f"no job named 'fintune' in gs://{BUCKET}; did you mean 'finetune'?"
    if command == "rm":
        assert result.exit_code == 0 and result.output.strip() == f"✓ nothing to remove: {said}", result.output
    else:
        assert result.exit_code == 2 and result.output.strip() == f"✗ {said}", result.output
    assert mem.store.exists(BUCKET, names.spec_key("finetune"))  # nothing done to the job meant


def test_the_list_of_commands_taking_a_job_is_every_one():
    """The test above covers each command with a JOB argument, a command added later included."""
    import typer

    def commands(group: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
        for name, command in group.commands.items():
            if hasattr(command, "commands"):  # a group of its own (sweep, local)
                yield from commands(command, f"{prefix}{name} ")
            else:
                yield f"{prefix}{name}", command

    taking = {name for name, command in commands(typer.main.get_command(app))
              if any(p.param_type_name == "argument" and p.name == "job" for p in command.params)}
    assert taking == {c.split()[0] for c in JOB_COMMANDS}
