"""Google's Compute v1 discovery document as the schema of truth.

It ships inside ``google-api-python-client``. The local server takes its URL routes
from it and validates every request body against its schemas, answering the way
Google's front end does (HTTP 400, ``Invalid JSON payload received. Unknown name...``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any


@dataclass(frozen=True)
class Method:
    resource: str  # e.g. "instances"
    name: str  # e.g. "insert"
    http_method: str
    pattern: re.Pattern[str]
    request_schema: str | None


@cache
def document() -> dict[str, Any]:
    path = resources.files("googleapiclient") / "discovery_cache" / "documents" / "compute.v1.json"
    return json.loads(path.read_text())


def methods(wanted: dict[str, tuple[str, ...]]) -> list[Method]:
    """The routes of the wanted methods, as regexes over the path after ``compute/v1/``."""
    doc = document()
    out = []
    for resource, names in wanted.items():
        for name in names:
            m = doc["resources"][resource]["methods"][name]
            regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(m["path"]))
            out.append(Method(resource, name, m["httpMethod"], re.compile(regex + "$"),
                              m.get("request", {}).get("$ref")))
    # Literal segments must win over parameters (".../instances/bulkInsert" is no instance name).
    return sorted(out, key=lambda m: m.pattern.pattern.count("(?P"))


def validate(body: Any, schema: str, at: str = "resource") -> list[str]:
    """Problems with ``body`` against the named schema, worded as Google words them."""
    return _check(body, {"$ref": schema}, at)


def _check(value: Any, spec: dict[str, Any], at: str) -> list[str]:
    if "$ref" in spec:
        spec = document()["schemas"][spec["$ref"]]
    kind = spec.get("type")
    if kind == "object":
        if not isinstance(value, dict):
            return [f"Invalid value at '{at}', expected an object"]
        problems: list[str] = []
        props, extra = spec.get("properties"), spec.get("additionalProperties")
        for key, item in value.items():
            if props is not None and key in props:
                problems += _check(item, props[key], f"{at}.{_snake(key)}")
            elif extra is not None:
                problems += _check(item, extra, f"{at}[{key}]")
            else:
                problems.append(f'Invalid JSON payload received. Unknown name "{key}" at \'{at}\': Cannot find field.')
        return problems
    if kind == "array":
        if not isinstance(value, list):
            return [f"Invalid value at '{at}', expected a list"]
        return [p for i, item in enumerate(value) for p in _check(item, spec.get("items", {}), f"{at}[{i}]")]
    return _scalar(value, spec, at)


_RANGES = {"int32": (-2**31, 2**31 - 1), "uint32": (0, 2**32 - 1), "int64": (-2**63, 2**63 - 1), "uint64": (0, 2**64 - 1)}


def _whole(value: Any, fmt: str) -> bool:
    """An integer of that format, as a JSON number or a decimal string (ASCII digits only)."""
    if isinstance(value, str) and value.removeprefix("-").isascii() and value.removeprefix("-").isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    low, high = _RANGES.get(fmt, (-2**63, 2**64 - 1))
    return low <= value <= high


def _scalar(value: Any, spec: dict[str, Any], at: str) -> list[str]:
    kind, fmt = spec.get("type"), spec.get("format", "")
    if kind == "string" and fmt in ("int64", "uint64"):
        ok = _whole(value, fmt)
    elif kind == "string":
        ok = isinstance(value, str)
    elif kind == "integer":
        ok = _whole(value, fmt)
    elif kind == "number":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind == "boolean":
        ok = isinstance(value, bool)
    else:
        ok = True
    if not ok:
        return [f"Invalid value at '{at}' ({kind}{'/' + fmt if fmt else ''}), {json.dumps(value)}"]
    if "enum" in spec and value not in spec["enum"]:
        return [f"Invalid value at '{at}', {json.dumps(value)}: expected one of {', '.join(spec['enum'])}"]
    return []


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()
