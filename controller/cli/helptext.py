"""What ``--help`` shows, tidied once for every command, present and to come.

Typer shows a docstring's hard line breaks as they are in the command list (a ragged column at
80 columns), RST's ``double backticks`` literally, a flag's type as ``<bool>`` and a required
argument as ``{spec}`` in the usage line. ``tidy`` runs over the command tree the CLI builds:
each paragraph joined into one line (the terminal wraps it), ``x`` written `x`, a flag with no
type shown, an argument named in capitals (SPEC, JOB) without braces. A paragraph that starts
with click's ``\\b`` keeps its lines (an example).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

_RST = re.compile(r"``([^`]+)``")
_classes: dict[type, type] = {}


def prose(text: str) -> str:
    """``text`` with each paragraph on one line, and RST literals in single backticks."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    joined = [p if p.startswith("\b") else " ".join(line.strip() for line in p.splitlines()) for p in paragraphs]
    return _RST.sub(r"`\1`", "\n\n".join(joined))


def tidy(command: Any) -> None:
    """``command`` and every command under it, as said above (in place)."""
    if command.help:
        command.help = prose(command.help)
    for param in command.params:
        if param.help:
            param.help = prose(param.help)
        if param.param_type_name == "argument" and param.metavar is None:
            param.metavar = param.name.upper()
    command.__class__ = _tidied(type(command))
    for sub in getattr(command, "commands", {}).values():
        tidy(sub)


def _tidied(kind: type) -> type:
    """``kind`` with a usage line that writes a required argument as SPEC, not {SPEC}, and no type
    shown for a flag (those typer and click add too: --help, --install-completion)."""
    if getattr(kind, "_tidied", False):
        return kind
    if kind not in _classes:
        def collect_usage_pieces(self: Any, ctx: Any) -> list[str]:
            pieces = super(made, self).collect_usage_pieces(ctx)
            return [re.sub(r"^\{(.*)\}(\.\.\.)?$", r"\1\2", p) for p in pieces]

        def get_params(self: Any, ctx: Any) -> list[Any]:
            params = super(made, self).get_params(ctx)
            for param in params:
                if getattr(param, "is_flag", False) and param.metavar is None:
                    param.metavar = ""  # a flag takes no value: no <bool>
            return params

        made = type(kind.__name__, (kind,), {"collect_usage_pieces": collect_usage_pieces, "get_params": get_params,
                                             "_tidied": True})
        _classes[kind] = made
    return _classes[kind]
