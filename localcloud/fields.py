"""Google's partial responses (the ``fields`` system parameter), as the local servers answer them.

A request may ask for only some fields of its answer: the ``fields`` (or ``$fields``) query
parameter, or the ``X-Goog-FieldMask`` header, the same selection (Google's "System parameters"
page). Its syntax, from Google's "Performance tips" pages: ``a,b`` selects fields a and b; ``a/b``
(or ``a.b``) b within a; ``a(b,c)`` b and c within a, nested freely (``a(b/c,d)``); ``*`` every field
at its level, and every key of a map (Compute's aggregated lists: ``items/*/instances(name)``). A
selection inside an array applies to each element. Names are case-sensitive and must be the
response schema's (the discovery document's): anything else is answered 400 "Invalid field
selection NAME" before the method runs, as Google's front end does. A field the answer lacks is
simply absent, and an object left with nothing selected is left out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from localcloud import discovery

Tree = dict[str, "Tree | None"]  # a selected name -> what is selected within it (None: all of it)
_NAME = re.compile(r"\s*([A-Za-z0-9_$-]+|\*)\s*")
HEADER = "X-Goog-FieldMask"


class FieldsError(ValueError):
    """The selection Google would refuse: the message is Google's."""

    def __init__(self, selection: str) -> None:
        super().__init__(f"Invalid field selection {selection}")
        self.selection = selection


def requested(args: Mapping[str, str], headers: Mapping[str, str]) -> str | None:
    """The selection a request asks for, None when it asks for everything."""
    for key in ("fields", "$fields"):
        if args.get(key):
            return args[key]
    return headers.get(HEADER) or None


def parse(text: str) -> Tree:
    tree, end = _mask(text, 0)
    if end != len(text):
        raise FieldsError(text[end:].strip() or text)
    return tree


def _mask(text: str, at: int) -> tuple[Tree, int]:
    tree: Tree = {}
    while True:
        path, at = _path(text, at)
        sub: Tree | None = None
        if text.startswith("(", at):
            sub, at = _mask(text, at + 1)
            if not text.startswith(")", at):
                raise FieldsError(text)
            at += 1
        for name in reversed(path):
            sub = {name: sub}
        tree = merge(tree, sub)
        at += len(text[at:]) - len(text[at:].lstrip())
        if not text.startswith(",", at):
            return tree, at
        at += 1


def _path(text: str, at: int) -> tuple[list[str], int]:
    names = []
    while True:
        found = _NAME.match(text, at)
        if not found:
            raise FieldsError(text[at:].split(",")[0] or text)
        names.append(found.group(1))
        at = found.end()
        if not text.startswith(("/", "."), at):
            return names, at
        at += 1


def merge(a: Tree | None, b: Tree | None) -> Tree | None:
    """Both selections: all of a field wins over part of it."""
    if a is None or b is None:
        return None
    out = dict(a)
    for key, sub in b.items():
        out[key] = merge(out[key], sub) if key in out else sub
    return out


def check(tree: Tree, schema: str, doc: str = "compute.v1") -> None:
    """Refuse (``FieldsError``) a selection of a name the response schema does not have."""
    _check(tree, {"$ref": schema}, doc)


def _check(tree: Tree, spec: dict[str, Any] | None, doc: str) -> None:
    for key, sub in tree.items():
        child = _child(spec, key, doc)
        if sub is None or child is None:
            continue
        if _items(child, doc).get("type") != "object":  # a scalar has nothing within it to select
            raise FieldsError(f"{key}({','.join(sub)})")
        _check(sub, child, doc)


def _items(spec: dict[str, Any], doc: str) -> dict[str, Any]:
    """The schema of what ``spec`` holds, arrays seen through (a selection applies to each element)."""
    while True:
        if "$ref" in spec:
            spec = discovery.document(doc)["schemas"][spec["$ref"]]
        elif spec.get("type") == "array":
            spec = spec.get("items", {})
        else:
            return spec


def _child(spec: dict[str, Any] | None, key: str, doc: str) -> dict[str, Any] | None:
    """The schema of field ``key`` within ``spec``; None when it cannot be told (under ``*``)."""
    if spec is None:
        return None
    spec = _items(spec, doc)
    props, extra = spec.get("properties"), spec.get("additionalProperties")
    if isinstance(extra, dict):  # a map: any key, ``*`` for all of them
        return extra
    if key == "*":
        return None
    if props and key in props:
        return props[key]
    raise FieldsError(key)


def select(value: Any, tree: Tree | None) -> Any:
    """``value`` with only the selected fields."""
    if tree is None:
        return value
    if isinstance(value, list):
        return [select(v, tree) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key not in tree and "*" not in tree:
            continue
        sub = merge(tree[key], tree["*"]) if key in tree and "*" in tree else tree[key] if key in tree else tree["*"]
        picked = select(item, sub)
        if picked != {}:
            out[key] = picked
    return out
