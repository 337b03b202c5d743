"""The respawn CLI (more commands arrive with the CLI issue)."""

from __future__ import annotations

import yaml
from typer.testing import CliRunner

from controller.cli import app
from tests.harness import spec_doc

runner = CliRunner()


def test_validate_accepts_the_example_spec():
    result = runner.invoke(app, ["validate", "examples/llm-finetune.yaml"])
    assert result.exit_code == 0, result.output
    assert "llm-finetune: valid" in result.output


def test_validate_names_each_bad_field_and_exits_2(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec_doc(nodes="two", policy={"max_restart": 1})))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    lines = [l for l in result.output.splitlines() if l.startswith("✗")]
    assert len(lines) == 2 and any("nodes:" in l for l in lines) and any("policy.max_restart:" in l for l in lines)


def test_validate_applies_the_controller_policy_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RESPAWN_PROJECT", "proj-1")
    monkeypatch.setenv("RESPAWN_TRAINER_SERVICE_ACCOUNT", "t@proj-1.iam.gserviceaccount.com")
    monkeypatch.setenv("RESPAWN_ALLOWED_MACHINE_TYPES", "n2-*")
    path = tmp_path / "j.yaml"
    path.write_text(yaml.safe_dump(spec_doc()))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2 and "machine_type" in result.output and "n2-*" in result.output
