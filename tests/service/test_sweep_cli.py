"""``respawn sweep``: submit a sweep file, follow it best first, cancel and remove it whole."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import yaml
from typer.testing import CliRunner

from controller.cli.main import app
from controller.core import names
from controller.core.state import Phase
from tests.harness import BUCKET, Harness, spec_doc, under_cli

runner = CliRunner()


@pytest.fixture
def mem(monkeypatch) -> Harness:
    return under_cli(monkeypatch, 400)


def sweep_file(tmp_path, **fields) -> str:
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec_doc()))
    doc = {"name": "lr", "base": "job.yaml", "parameters": {"lr": [0.1, 0.01, 0.001]}, "max_parallel": 2,
           "metric": {"key": "eval.loss", "goal": "minimize"}, **fields}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def test_a_sweep_is_submitted_as_its_record_and_one_spec_a_trial_and_again_changes_nothing(mem, tmp_path):
    path = sweep_file(tmp_path)
    done = runner.invoke(app, ["sweep", "submit", path, "--yes"])
    assert done.exit_code == 0, done.output
    assert "submitted sweep lr: 3 trials" in done.output
    assert all(mem.store.exists(BUCKET, names.spec_key(f"lr-{n}")) for n in (1, 2, 3))
    assert mem.store.exists(BUCKET, names.sweep_key("lr"))
    again = runner.invoke(app, ["sweep", "submit", path, "--yes"])
    assert again.exit_code == 0 and "0 trials written" in again.output and "3 trials already there" in again.output
    other = runner.invoke(app, ["sweep", "submit", sweep_file(tmp_path, max_parallel=3), "--yes"])
    assert other.exit_code != 0 and "exists with other trials, limits or base spec" in other.output


def test_a_sweep_whose_checkpoints_go_to_the_control_bucket_is_warned_once_naming_the_checkpoints_bucket(mem, tmp_path):
    """Every trial saves under the base's prefix: in the control bucket the trainers could save nothing."""
    path = sweep_file(tmp_path)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec_doc(checkpoint={"uri": f"gs://{BUCKET}/checkpoints/lr"})))
    done = runner.invoke(app, ["sweep", "submit", path, "--yes"])
    assert done.exit_code == 0, done.output
    said = " ".join(done.output.split())
    assert said.count(f"is in the control bucket gs://{BUCKET}") == 1, said
    assert f"checkpoint: {{uri: gs://{BUCKET}-checkpoints/lr}}" in said, said
    (elsewhere := tmp_path / "elsewhere").mkdir()
    quiet = runner.invoke(app, ["sweep", "submit", sweep_file(elsewhere, name="ok"), "--yes"])
    assert quiet.exit_code == 0 and "control bucket" not in quiet.output, quiet.output


def test_a_dry_run_lists_the_trials_and_uploads_nothing(mem, tmp_path):
    done = runner.invoke(app, ["sweep", "submit", sweep_file(tmp_path), "--dry-run"])
    assert done.exit_code == 0 and "lr-3" in done.output and "0.001" in done.output and "dry run" in done.output
    assert not mem.store.exists(BUCKET, names.sweep_key("lr"))


def test_a_bad_sweep_or_base_is_refused_naming_the_trial_and_the_field(mem, tmp_path):
    bad = runner.invoke(app, ["sweep", "submit", sweep_file(tmp_path, max_parallel=0), "--yes"])
    assert bad.exit_code == 2 and "max_parallel" in bad.output
    path = sweep_file(tmp_path)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec_doc(nodes="two")))
    base = runner.invoke(app, ["sweep", "submit", path, "--yes"])
    assert base.exit_code == 2 and "trial lr-1: nodes" in base.output


def test_sweep_status_orders_by_the_metric_and_shows_a_trial_without_a_result_as_such(mem, tmp_path):
    assert runner.invoke(app, ["sweep", "submit", sweep_file(tmp_path), "--yes"]).exit_code == 0
    mem.tick()
    mem.exit("lr-1", 0, result=json.dumps({"eval": {"loss": 0.9}}))  # as the agent puts RESPAWN_RESULT_FILE
    mem.exit("lr-2", 0, result=json.dumps({"eval": {"loss": 0.3}}))
    mem.tick()
    rows = json.loads(runner.invoke(app, ["sweep", "status", "lr", "--json"]).stdout)
    assert [r["trial"] for r in rows] == ["lr-2", "lr-1", "lr-3"]
    assert [r["metric"] for r in rows] == [0.3, 0.9, None] and rows[2]["result"] is None
    assert rows[0]["params"] == {"lr": 0.01} and rows[0]["phase"] == Phase.SUCCEEDED
    assert rows[0]["result"] == {"eval": {"loss": 0.3}}
    shown = runner.invoke(app, ["sweep", "status", "lr"]).output
    assert shown.index("lr-2") < shown.index("lr-1") < shown.index("lr-3") and "no result" in shown


def test_a_sweep_is_cancelled_and_removed_whole(mem, tmp_path):
    assert runner.invoke(app, ["sweep", "submit", sweep_file(tmp_path), "--yes"]).exit_code == 0
    mem.tick()
    refused = runner.invoke(app, ["sweep", "rm", "lr"])
    assert refused.exit_code != 0 and "respawn sweep cancel lr first" in refused.output
    assert runner.invoke(app, ["sweep", "cancel", "lr"]).exit_code == 0
    for _ in range(3):
        mem.tick()
    assert all(mem.status(f"lr-{n}").phase == Phase.CANCELLED for n in (1, 2, 3))
    removed = runner.invoke(app, ["sweep", "rm", "lr"])
    assert removed.exit_code == 0, removed.output
    assert not mem.store.list(BUCKET, "sweeps/lr/") and not mem.store.list(BUCKET, "jobs/lr-")


def test_the_report_of_a_sweep_sums_its_trials_cost_and_what_spot_saved(mem, tmp_path):
    assert runner.invoke(app, ["sweep", "submit", sweep_file(tmp_path), "--yes"]).exit_code == 0
    mem.tick()
    mem.clock.advance(timedelta(hours=1))
    mem.exit("lr-1", 0, result='{"eval": {"loss": 0.5}}')
    mem.tick()
    total = json.loads(runner.invoke(app, ["report", "--sweep", "lr", "--json"]).stdout)
    assert total["trials"] == 3 and total["phases"] == {"SUCCEEDED": 1, "RUNNING": 1, "QUEUED": 1}
    assert total["cost_usd"] > 0 and total["on_demand_usd"] > total["cost_usd"]
    assert total["saved_usd"] == pytest.approx(total["on_demand_usd"] - total["cost_usd"])
    shown = runner.invoke(app, ["report", "--sweep", "lr"]).output
    assert "sweep lr" in shown and "saved" in shown and "QUEUED 1" in shown
    neither = runner.invoke(app, ["report"])
    assert neither.exit_code != 0 and "name a job, or a sweep with --sweep NAME" in neither.output



def test_a_sweep_whose_goal_is_maximize_lists_the_highest_first(mem, tmp_path):
    path = sweep_file(tmp_path, metric={"key": "accuracy", "goal": "maximize"}, max_parallel=3)
    assert runner.invoke(app, ["sweep", "submit", path, "--yes"]).exit_code == 0
    mem.tick()
    for n, accuracy in ((1, 0.7), (2, 0.9), (3, 0.8)):
        mem.exit(f"lr-{n}", 0, result=json.dumps({"accuracy": accuracy}))
    mem.tick()
    rows = json.loads(runner.invoke(app, ["sweep", "status", "lr", "--json"]).stdout)
    assert [r["trial"] for r in rows] == ["lr-2", "lr-3", "lr-1"]


def test_a_resubmit_with_another_base_is_refused_before_anything_is_written(mem, tmp_path):
    path = sweep_file(tmp_path)
    assert runner.invoke(app, ["sweep", "submit", path, "--yes"]).exit_code == 0
    before = mem.store.read(BUCKET, names.spec_key("lr-1")).info.generation
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec_doc(command="python other.py")))
    again = runner.invoke(app, ["sweep", "submit", path, "--yes"])
    assert again.exit_code != 0 and "other trials, limits or base spec" in again.output
    assert mem.store.read(BUCKET, names.spec_key("lr-1")).info.generation == before


def test_a_base_named_by_path_packs_its_code_from_its_own_folder(mem, tmp_path, monkeypatch):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "train.py").write_text("print('the base folder')\n")
    (tmp_path / "specs" / "job.yaml").write_text(yaml.safe_dump(spec_doc(code="train.py")))
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({"name": "lr", "base": "specs/job.yaml",
                                                         "parameters": {"lr": [1, 2]}}))
    done = runner.invoke(app, ["sweep", "submit", str(tmp_path / "sweep.yaml"), "--yes"])
    assert done.exit_code == 0, done.output
    code = yaml.safe_load(mem.store.read(BUCKET, names.spec_key("lr-1")).data)["code"]
    assert code.startswith(f"gs://{BUCKET}/code/")


def test_hostile_parameter_values_are_text_in_the_tables(mem, tmp_path):
    done = runner.invoke(app, ["sweep", "submit", sweep_file(tmp_path, parameters={"lr": ["[/]", "[bold]x"]}),
                               "--dry-run"])
    assert done.exit_code == 0, done.output
    assert "[/]" in done.output and "[bold]x" in done.output
