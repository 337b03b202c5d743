"""Plain text for a terminal: user or cloud text with no control character left to act."""

from __future__ import annotations

import html
import io
import re
import sys
from typing import Any

from rich.text import Text

# C0 and C1 controls, DEL, line/paragraph separators and bidirectional overrides: a name
# holding any of these could move the cursor, recolour or hide text, or reorder a line.
# Control characters, bidi controls, and invisible ones (zero-width space/joiners, word
# joiner, BOM, soft hyphen) with which one job name could pass for another.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\xad\u061c\u180e\u200b-\u200f\u2028\u2029\u202a-\u202e"
                      "\u2060-\u2064\u2066-\u2069\ufeff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: object, keep: str = "") -> str:
    """``text`` with every control character written as an escape (``\\x1b``), but those in ``keep``."""
    def escaped(match: re.Match[str]) -> str:
        c = match.group()
        if c in keep:
            return c
        return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")

    return _CONTROL.sub(escaped, str(text))


def html_text(text: object) -> str:
    """User or cloud text in an HTML page, in an element or in a quoted attribute: control
    characters escaped as ``printable`` writes them, then ``& < > " '`` as entities. The one
    way respawn writes such text into HTML (the report's page and the dashboard's templates)."""
    return html.escape(printable(text), quote=True)


def plain(text: object, style: str = "") -> Text:
    """User or cloud text as a Rich renderable: no markup parsed, no control character kept."""
    return Text(printable(text), style=style)


class Hanging:
    """``head`` then ``body``, the body wrapped at the console's width with each further line
    indented under the body's start (a doctor's line under its mark, a fix under its command):
    never a line that runs on past the terminal. ``str`` is the whole line, as a test reads it."""

    def __init__(self, head: Text, body: Text) -> None:
        self.head, self.body = head, body

    def __str__(self) -> str:
        return self.head.plain + self.body.plain

    def __rich_console__(self, console: Any, options: Any) -> Any:
        indent = self.head.cell_len
        lines = self.body.wrap(console, max(20, options.max_width - indent))
        for i, line in enumerate(lines):
            line.rstrip()
            yield Text.assemble(self.head if i == 0 else " " * indent, line, end="\n")


_PADDING = re.compile(r" +((?:\x1b\[[0-9;]*m)*)(?=\n)")  # spaces, then only style codes, to a line's end


class Trimmed(io.TextIOBase):
    """Standard output (``stderr``: standard error) as a Rich console's file, looked up at each
    write as Rich looks it up (so that a test's captured stream is the one written), with the
    spaces Rich pads each line with to the console's width dropped where it is not a
    terminal: piped or redirected output has no trailing spaces. A terminal gets it as is."""

    def __init__(self, stderr: bool = False) -> None:
        super().__init__()
        self._stderr = stderr
        self._held = ""  # spaces that ended a write: kept until the next write says whether a line ended there

    @property
    def _target(self) -> io.TextIOBase:
        return sys.stderr if self._stderr else sys.stdout  # type: ignore[return-value]

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._target, "encoding", None) or "utf-8"

    def isatty(self) -> bool:
        return self._target.isatty()

    def fileno(self) -> int:
        return self._target.fileno()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        target, held = self._target, self._held
        if target.isatty():
            self._held = ""
            target.write(held + text)
            return len(text)
        trimmed = _PADDING.sub(r"\1", held + text)
        kept = trimmed.rstrip(" ")
        self._held = trimmed[len(kept):]
        target.write(kept)
        return len(text)

    def flush(self) -> None:
        self._target.flush()
