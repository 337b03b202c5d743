"""Plain text for a terminal: user or cloud text with no control character left to act."""

from __future__ import annotations

import re

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


def plain(text: object, style: str = "") -> Text:
    """User or cloud text as a Rich renderable: no markup parsed, no control character kept."""
    return Text(printable(text), style=style)
