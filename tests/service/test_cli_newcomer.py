"""A newcomer's first hour with the CLI (issue 26): files named as the user named them, counts
in the right number, one wording for a job that is not there, and help that reads well at 80 columns."""

from __future__ import annotations

from typer.testing import CliRunner

from controller.cli.main import app
from tests.service.test_cli import BUCKET, mem  # noqa: F401 - the fixture

runner = CliRunner()


def test_validate_and_submit_name_the_local_file_not_spec_yaml(tmp_path, mem):  # noqa: F811
    path = tmp_path / "train.yml"
    path.write_text("name: x\nzones: [a\n  b: c\n")
    for command in (["validate", str(path)], ["submit", "--dry-run", str(path)]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, result.output
        assert result.output.startswith("✗ train.yml: not valid YAML or JSON: "), result.output
        assert "spec.yaml" not in result.output


def test_a_spec_in_the_bucket_is_still_called_spec_yaml():
    from controller.core.spec import SpecError, parse_spec

    try:
        parse_spec(b"- 1\n", "x")
    except SpecError as e:
        assert e.problems == ["spec.yaml: expected a mapping of fields, got list"]
        assert SpecError([*e.problems, "nodes: not a number"]).named("t.yml").problems == \
            ["t.yml: expected a mapping of fields, got list", "nodes: not a number"]
    else:
        raise AssertionError("a list is no spec")
