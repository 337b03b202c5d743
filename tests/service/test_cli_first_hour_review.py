"""A newcomer's first hour, third pass, reviewed (issue 39): what a hostile first hour still found after
the fixes. The shipped examples pass `respawn validate`, which the empty fleet's line suggests; `run`
notices a file its command names in a folder under this one, and names its own flag as the checkpoint's
fix; every command given an unknown job says the one likely meant, and a mistyped bucket is said as
such by `cancel` too; deploy's dry run prints no literal backslash-n."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from controller.cli.main import app
from controller.core import names
from tests.service.test_cli import BUCKET, mem  # noqa: F401 - the fixture
from tests.service.test_cli_newcomer import _mistyped_bucket
from tests.service.test_deploy import cli  # noqa: F401 - the fixture

runner = CliRunner()
RUN = ["run", "-n", "tune", "-z", "us-central1-a", "-m", "g2-standard-8", "--yes"]
EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.mark.parametrize("example", ["quickstart.yaml", "container.yaml", "tpu7x-single.yaml"])
def test_validate_takes_a_shipped_example_whose_code_is_a_local_file(mem, example):  # noqa: F811
    """`respawn status` of an empty fleet says `respawn validate SPEC.yaml` checks a spec first; the shipped
    quickstart (code: trainer.py, packed by submit) was refused by it, exit 2."""
    result = runner.invoke(app, ["validate", str(EXAMPLES / example)])
    assert result.exit_code == 0, result.output
    assert "✓" in result.output and "packed and uploaded by the CLI only" not in result.output


def test_validate_refuses_a_local_code_path_that_is_not_there_naming_it(mem, tmp_path):  # noqa: F811
    from tests.harness import spec_doc

    path = tmp_path / "j.yaml"
    path.write_text(yaml.safe_dump({**spec_doc(), "code": "src"}))
    result = runner.invoke(app, ["validate", str(path)])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "code:" in said and str(tmp_path / "src") in said, said
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    assert runner.invoke(app, ["validate", str(path)]).exit_code == 0
    assert mem.store.list(BUCKET, "code/") == []  # validate uploads nothing


def test_run_of_a_file_in_a_folder_under_this_one_without_workdir_says_the_vm_will_not_have_it(
        mem, tmp_path, monkeypatch):  # noqa: F811
    """The check looked at `train.py` only: `python src/train.py` (or examples/trainer.py) went through."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    for command in (["python", "src/train.py"], ["python -u ./src/train.py --epochs 3"]):
        result = runner.invoke(app, [*RUN, "--", *command])
        assert result.exit_code == 2, result.output
        said = " ".join(result.output.split())
        assert "✗ --workdir: src/train.py is in this folder, but the VM will not have it" in said, said
        assert not mem.store.exists(BUCKET, names.spec_key("tune"))
    # A path outside this folder, or an absolute one, is not what --workdir . would send.
    for command in (["python", str(tmp_path / "src" / "train.py")], ["python", "../elsewhere.py"]):
        assert runner.invoke(app, [*RUN, "--replace", "--", *command]).exit_code == 0


def test_run_no_checkpoint_names_its_own_flags_as_the_fix(mem, tmp_path, monkeypatch):  # noqa: F811
    """run has no spec file: "Add this line to the spec" named a file the user never wrote."""
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, [*RUN, "--no-checkpoint", "--", "echo hi"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "tune names no checkpoint: each preemption restarts it from step 0" in said, said
    assert "Leave out --no-checkpoint" in said and "--checkpoint gs://BUCKET-checkpoints/tune" in said, said
    assert "to the spec" not in said, said


def test_cancel_in_a_mistyped_bucket_says_the_bucket_is_not_there_not_that_the_job_is_not(mem, tmp_path):  # noqa: F811
    _mistyped_bucket(mem, tmp_path, local_env=BUCKET)
    result = runner.invoke(app, ["cancel", "quickstart"])
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert line.startswith("✗ bucket gs://respawn-locall does not exist: RESPAWN_BUCKET=respawn-locall"), line


def test_reconcile_in_a_mistyped_bucket_says_the_bucket_is_not_there(mem, tmp_path):  # noqa: F811
    """It printed a bare `✗ gs://respawn-locall/respawn/lease/tick`."""
    _mistyped_bucket(mem, tmp_path, local_env=BUCKET)
    result = runner.invoke(app, ["reconcile"])
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert line.startswith("✗ bucket gs://respawn-locall does not exist: RESPAWN_BUCKET=respawn-locall"), line


@pytest.mark.parametrize("command", [["sweep", "status"], ["sweep", "cancel"], ["sweep", "rm"], ["report", "--sweep"]])
def test_every_sweep_command_in_a_mistyped_bucket_says_the_bucket_is_not_there_not_that_the_sweep_is_not(
        mem, tmp_path, command):  # noqa: F811
    """They said "no sweep named 'lr' in gs://respawn-locall (respawn sweep submit FILE makes one)"."""
    _mistyped_bucket(mem, tmp_path, local_env=BUCKET)
    result = runner.invoke(app, [*command, "lr"])
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert line == (f"✗ bucket gs://respawn-locall does not exist: RESPAWN_BUCKET=respawn-locall is set in your "
                    f"environment, while the local cloud's {tmp_path / 'local.env'} says {BUCKET}: `source "
                    f"{tmp_path / 'local.env'}` (or set RESPAWN_BUCKET to your control bucket)"), line
    # ...and in the bucket that is there, a sweep that is not is said as before
    from controller.service import bootstrap
    from controller.service.config import Settings
    from tests.harness import PROJECT, TRAINER

    bootstrap.override(None, Settings(bucket=BUCKET, project=PROJECT, trainer_service_account=TRAINER,
                                      local_dir=tmp_path), mem.store, mem.compute)
    result = runner.invoke(app, [*command, "lr"])
    assert result.exit_code == 2 and result.output.strip() == (
        f"✗ no sweep named 'lr' in gs://{BUCKET} (respawn sweep submit FILE makes one)"), result.output


def test_deploys_dry_run_prints_its_summary_after_a_blank_line_never_a_literal_backslash_n(cli):  # noqa: F811
    """Item 13's own complaint, back in the summary the fix added: `\\nthe plan: 37 steps...`."""
    result = cli("--dry-run")
    assert result.exit_code == 0, result.output
    assert "\\nthe plan" not in result.output, result.output[-400:]
    assert "\n\nthe plan: " in result.output


LOCALL = "✗ bucket gs://respawn-locall does not exist: RESPAWN_BUCKET=respawn-locall"
WOULD = "! a submit would be refused: bucket gs://respawn-locall does not exist: RESPAWN_BUCKET=respawn-locall"


@pytest.mark.parametrize("dry_run", [False, True])
def test_sweep_submit_in_a_mistyped_bucket_says_the_bucket_is_not_there(mem, tmp_path, dry_run):  # noqa: F811
    """It printed a bare `✗ gs://respawn-locall/code/<sha256>.tar.gz` after the trials' table (its base's
    code upload), and its dry run said nothing of the bucket at all."""
    _mistyped_bucket(mem, tmp_path, local_env=BUCKET)
    result = runner.invoke(app, ["sweep", "submit", str(EXAMPLES / "sweep.yaml"),
                                 *(["--dry-run"] if dry_run else ["--yes"])])
    said = " ".join(result.output.split())
    if dry_run:
        assert result.exit_code == 0 and WOULD in said and "dry run: nothing uploaded" in said, result.output
    else:
        assert result.exit_code == 2 and result.output.strip().startswith(LOCALL), result.output
    assert not [b for b in mem.store.buckets if b.startswith("respawn-locall")]  # no bucket made


@pytest.mark.parametrize("command", [["submit", "SPEC", "--dry-run"], [*RUN, "--dry-run", "--", "echo hi"]],
                         ids=["submit", "run"])
def test_a_dry_run_in_a_mistyped_bucket_names_respawn_bucket_not_a_deploy(mem, tmp_path, monkeypatch,  # noqa: F811
                                                                          command):
    """submit's dry run said only "bucket gs://respawn-locall does not exist"; run's, with its default
    checkpoint in gs://respawn-locall-checkpoints, a ✗ whose fix was "run respawn deploy again"."""
    from tests.harness import spec_doc

    _mistyped_bucket(mem, tmp_path, local_env=BUCKET)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec_doc()))
    result = runner.invoke(app, [str(tmp_path / "job.yaml") if word == "SPEC" else word for word in command])
    said = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert WOULD in said and "respawn deploy again" not in said, said
    assert "dry run: nothing uploaded" in said
