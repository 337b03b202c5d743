"""Issue 26: piped or redirected output (``respawn demo | tee demo.txt``) has no line padded with
spaces to the console's width; a terminal still gets what Rich draws."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from typer.testing import CliRunner

from controller.cli import main as cli_module
from controller.render.text import Trimmed
from localcloud import demo as story


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _story(console: Console, *_: object) -> story.Result:
    """What the demo prints, without the local cloud: its story lines (the padded grid) and a result."""
    for elapsed, text in [(1.3, "local cloud up: GCS http://127.0.0.1:40505, Compute http://127.0.0.1:37825"),
                          (9.4, "[yellow]stockout in us-central1-a[/yellow]; [red]preempting demo-2[/red] at step 87")]:
        console.print(story.event_line(elapsed, text))
    return story.Result(phase="SUCCEEDED", attempts=4, preemptions=3, stockouts=1, want_stockouts=1,
                        final_hash="6bee99e4019fd721", reference_hash="6bee99e4019fd721", final_loss="0.009168",
                        seconds=26.0, story=["attempt 1: reached step 3; attempt 2 resumed at 0"])


def test_the_demo_piped_prints_no_trailing_spaces(monkeypatch):
    monkeypatch.setattr(story, "run", _story)
    result = CliRunner().invoke(cli_module.app, ["demo"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any("local cloud up" in line for line in lines) and any("stockouts met" in line for line in lines)
    assert [line for line in lines if line != line.rstrip()] == []


@pytest.mark.parametrize("pieces", [
    ["a   \n", "b\n"],
    ["a   ", "\nb  ", "  \n"],  # a line's padding split across writes
    ["a  \x1b[0m\nb\n"],  # padding before a style's end code
])
def test_trimmed_drops_the_spaces_that_end_a_line_when_not_a_terminal(monkeypatch, pieces):
    piped = io.StringIO()
    monkeypatch.setattr("sys.stdout", piped)
    out = Trimmed()
    for piece in pieces:
        out.write(piece)
    assert all(line == line.rstrip(" ") for line in piped.getvalue().split("\n"))
    assert piped.getvalue().replace("\x1b[0m", "").split() == "".join(pieces).replace("\x1b[0m", "").split()


def test_trimmed_leaves_a_terminal_as_rich_draws_it(monkeypatch):
    tty = _Tty()
    monkeypatch.setattr("sys.stdout", tty)
    text = "short words that wrap across the line of forty columns"
    Console(file=Trimmed(), width=40, color_system=None).print(story.event_line(1.3, text))
    assert tty.getvalue().endswith("line of forty columns           \n"), repr(tty.getvalue())  # padded, as drawn
