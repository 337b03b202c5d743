"""A small sample of the fuzz run (``python -m tests.fuzz`` runs 10,000 specs): nothing unhandled."""

from __future__ import annotations

import pytest

from tests.fuzz import field_path_problem, run
from tests.fuzz.__main__ import main


def test_a_sample_of_hostile_objects_is_handled():
    report = run(specs=300, records=100, seed=1)
    assert (report.specs, report.records) == (300, 100)
    assert [str(f) for f in report.unhandled] == []


def test_the_command_line_ends_with_the_counts(capsys: pytest.CaptureFixture[str]):
    assert main(["--specs", "20", "--records", "9", "--seed", "7"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "fuzz: specs=20 records=9 unhandled=0"


def test_one_case_replays(capsys: pytest.CaptureFixture[str]):
    assert main(["--only", "record:3"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "fuzz: specs=0 records=1 unhandled=0"


@pytest.mark.parametrize("line", ["policy.max_runtime: too long", "spec.yaml: not valid YAML", "env.NODE_RANK: reserved",
                                  "'a\\nb': unknown field", "zones.0: bad", "l1.2...: too big", "7: not text"])
def test_field_paths(line):
    assert field_path_problem(line) is None


@pytest.mark.parametrize("line", ["Input should be an integer", "nodes:x", "a\nb: c", ": empty", "nodes: ", 3])
def test_not_field_paths(line):
    assert field_path_problem(line) is not None
