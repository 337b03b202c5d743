"""Issue 26: the README's sample of `make demo`'s output is what the demo prints: every line of
it one of the demo's own lines (tests/demo_output.py, which a real run is held to in
tests/e2e/test_demo.py), its summary table's rows the demo's rows in the demo's order."""

from __future__ import annotations

import re

from controller.service.config import REPO_ROOT
from tests import demo_output


def sample() -> str:
    """The README's sample output: the first fenced block of its `make demo` section."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## `make demo` and `make test`", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", section, re.S | re.M)
    assert blocks, "the README's `make demo` section shows no sample output"
    return blocks[0]


def test_every_line_of_the_readmes_demo_sample_is_one_the_demo_prints():
    lines = demo_output.logical_lines(sample())
    assert demo_output.unmatched(lines) == []


def test_the_readmes_demo_summary_has_the_demos_rows_in_its_order():
    assert [name for name, _ in demo_output.rows(demo_output.logical_lines(sample()))] == \
        [name for name, _ in demo_output.ROWS]


def test_the_readmes_demo_sample_tells_the_whole_story():
    lines = demo_output.logical_lines(sample())
    for template in demo_output.STORY + demo_output.OTHER:
        assert any(re.fullmatch(template, line) for line in lines), f"no line of the sample shows {template}"


def test_the_templates_refuse_a_line_the_demo_does_not_print():
    assert demo_output.unmatched(["  3.2s preempting demo-1 softly at step 3", "│ stockouts │ 0 │",
                                  "│ outcome │ SUCCEEDED │"]) == ["  3.2s preempting demo-1 softly at step 3",
                                                                 "│ stockouts │ 0 │"]
