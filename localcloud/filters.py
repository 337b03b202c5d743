"""Compute Engine list ``filter`` expressions, evaluated on resource dicts.

Supports what the google-cloud-compute client and gcloud send: ``field = value``,
``!=``, ``:`` (has), ``>``/``<``, the legacy regex forms ``field eq 'regex'`` /
``ne``, ``AND``/``OR``/``NOT``, juxtaposition as AND, and parentheses. Field paths are
dotted (``labels.respawn-managed``); ``*`` in an ``=`` value is a wildcard. The two kinds (``eq``/``ne``
and the rest) mixed in one filter are refused, as compute.v1's reference says Compute refuses them.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from typing import Any

_TOKEN = re.compile(r"""\s*(?:(\()|(\))|"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)'|(!=|=|:|>|<)|([^\s()=!:<>"']+))""")

Predicate = Callable[[dict[str, Any]], bool]


class FilterError(ValueError):
    pass


def compile_filter(text: str | None) -> Predicate:
    if not text or not text.strip():
        return lambda _: True
    tokens = _tokenize(text)
    ops = {value for kind, value in tokens if kind == "op"}
    if ops & {"eq", "ne"} and ops - {"eq", "ne"}:
        # compute.v1's filter reference: expressions with regular expressions and AIP-160 ones
        # "cannot be mixed in one request".
        raise FilterError("Invalid list filter expression: regular expressions (eq, ne) and "
                          "comparisons (=, !=, :, >, <) cannot be mixed in one filter")
    pred, rest = _or(tokens)
    if rest:
        raise FilterError(f"Invalid list filter expression: unexpected {rest[0][1]!r}")
    return pred


def _tokenize(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            if text[pos:].strip():
                raise FilterError(f"Invalid list filter expression at {text[pos:]!r}")
            break
        pos = m.end()
        lpar, rpar, dq, sq, op, word = m.groups()
        if lpar:
            out.append(("(", "("))
        elif rpar:
            out.append((")", ")"))
        elif dq is not None or sq is not None:
            out.append(("str", dq if dq is not None else sq))
        elif op:
            out.append(("op", op))
        elif word:
            kind = word.upper() if word.upper() in ("AND", "OR", "NOT") else ("op" if word in ("eq", "ne") else "word")
            out.append((kind, word))
    return out


def _or(tokens: list[tuple[str, str]]) -> tuple[Predicate, list[tuple[str, str]]]:
    left, tokens = _and(tokens)
    while tokens and tokens[0][0] == "OR":
        right, tokens = _and(tokens[1:])
        left = (lambda a, b: lambda r: a(r) or b(r))(left, right)
    return left, tokens


def _and(tokens: list[tuple[str, str]]) -> tuple[Predicate, list[tuple[str, str]]]:
    left, tokens = _unary(tokens)
    while tokens and tokens[0][0] not in ("OR", ")"):
        if tokens[0][0] == "AND":
            tokens = tokens[1:]
        right, tokens = _unary(tokens)
        left = (lambda a, b: lambda r: a(r) and b(r))(left, right)
    return left, tokens


def _unary(tokens: list[tuple[str, str]]) -> tuple[Predicate, list[tuple[str, str]]]:
    if not tokens:
        raise FilterError("Invalid list filter expression: unexpected end")
    if tokens[0][0] == "NOT":
        inner, rest = _unary(tokens[1:])
        return (lambda r: not inner(r)), rest
    if tokens[0][0] == "(":
        inner, rest = _or(tokens[1:])
        if not rest or rest[0][0] != ")":
            raise FilterError("Invalid list filter expression: missing ')'")
        return inner, rest[1:]
    if len(tokens) < 3 or tokens[0][0] != "word" or tokens[1][0] != "op" or tokens[2][0] not in ("word", "str"):
        raise FilterError(f"Invalid list filter expression near {' '.join(t[1] for t in tokens[:3])!r}")
    return _comparison(tokens[0][1], tokens[1][1], tokens[2][1]), tokens[3:]


def _comparison(field: str, op: str, literal: str) -> Predicate:
    def value(resource: dict[str, Any]) -> Any:
        current: Any = resource
        for part in field.split("."):
            current = current.get(part) if isinstance(current, dict) else None
        return current

    def test(resource: dict[str, Any]) -> bool:
        v = value(resource)
        text = "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
        if op == "=":
            return v is not None and fnmatch.fnmatchcase(text, literal)
        if op == "!=":
            return v is None or not fnmatch.fnmatchcase(text, literal)
        if op == ":":
            return v is not None and (literal == "*" or literal in (v if isinstance(v, (list, dict)) else text))
        if op in ("eq", "ne"):
            matched = v is not None and re.fullmatch(literal, text) is not None
            return matched if op == "eq" else not matched
        if op in (">", "<"):
            return v is not None and (text > literal if op == ">" else text < literal)
        raise FilterError(op)

    return test
