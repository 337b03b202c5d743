"""Google's discovery documents (Compute v1, Cloud TPU v2) as the schema of truth.

They ship inside ``google-api-python-client``. The local servers take their URL routes
from them and validate every request body against their schemas, answering the way
Google's front end does (HTTP 400, ``Invalid JSON payload received. Unknown name...``).
``doc`` names a document as its file does (``"compute.v1"``, the default, or ``"tpu.v2"``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any


@dataclass(frozen=True)
class Method:
    resource: str  # e.g. "instances", or "projects.locations.nodes" in a nested document
    name: str  # e.g. "insert"
    http_method: str
    pattern: re.Pattern[str]
    request_schema: str | None
    response_schema: str | None = None


@cache
def document(name: str = "compute.v1") -> dict[str, Any]:
    path = resources.files("googleapiclient") / "discovery_cache" / "documents" / f"{name}.json"
    return json.loads(path.read_text())


def methods(wanted: dict[str, tuple[str, ...]], doc: str = "compute.v1") -> list[Method]:
    """The routes of the wanted methods, as regexes over the path after the service's root
    (``compute/v1/``; a one-platform API's paths start with their version: ``v2/...``).

    A resource nested in another is named by its dotted path (``"projects.locations.nodes"``).
    A path with a reserved expansion (``v2/{+name}``, where one parameter spans several
    segments) is routed by its ``flatPath`` (``v2/projects/{projectsId}/locations/...``);
    those parameters never hold a ``:`` (AIP-136 custom methods follow one: ``.../nodes/{id}:stop``)."""
    document_ = document(doc)
    out = []
    for resource, names in wanted.items():
        node = document_
        for part in resource.split("."):
            node = node["resources"][part]
        for name in names:
            m = node["methods"][name]
            flat = "{+" in m["path"] and "flatPath" in m
            param = r"(?P<\1>[^/:]+)" if flat else r"(?P<\1>[^/]+)"
            regex = re.sub(r"\\\{(\w+)\\\}", param, re.escape(m["flatPath"] if flat else m["path"]))
            out.append(Method(resource, name, m["httpMethod"], re.compile(regex + "$"),
                              m.get("request", {}).get("$ref"), m.get("response", {}).get("$ref")))
    # Literal segments must win over parameters (".../instances/bulkInsert" is no instance name).
    return sorted(out, key=lambda m: m.pattern.pattern.count("(?P"))


def every(doc: str = "compute.v1") -> dict[str, tuple[str, ...]]:
    """Every method of the document, in ``methods``' terms (nested resources by dotted path)."""
    found: dict[str, tuple[str, ...]] = {}

    def walk(node: dict[str, Any], prefix: str) -> None:
        for name, resource in (node.get("resources") or {}).items():
            path = f"{prefix}{name}"
            if resource.get("methods"):
                found[path] = tuple(resource["methods"])
            walk(resource, f"{path}.")

    walk(document(doc), "")
    return found


def validate(body: Any, schema: str, at: str = "resource", doc: str = "compute.v1") -> list[str]:
    """Problems with ``body`` against the named schema, worded as Google words them."""
    return _check(body, {"$ref": schema}, at, doc)


def _check(value: Any, spec: dict[str, Any], at: str, doc: str) -> list[str]:
    if "$ref" in spec:
        spec = document(doc)["schemas"][spec["$ref"]]
    kind = spec.get("type")
    if kind == "object":
        if not isinstance(value, dict):
            return [f"Invalid value at '{at}', expected an object"]
        problems: list[str] = []
        props, extra = spec.get("properties"), spec.get("additionalProperties")
        for key, item in value.items():
            if props is not None and key in props:
                problems += _check(item, props[key], f"{at}.{_snake(key)}", doc)
            elif extra is not None:
                problems += _check(item, extra, f"{at}[{key}]", doc)
            else:
                problems.append(f'Invalid JSON payload received. Unknown name "{key}" at \'{at}\': Cannot find field.')
        return problems
    if kind == "array":
        if not isinstance(value, list):
            return [f"Invalid value at '{at}', expected a list"]
        return [p for i, item in enumerate(value) for p in _check(item, spec.get("items", {}), f"{at}[{i}]", doc)]
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


def served(doc: str, supported: Mapping[str, Sequence[str]]) -> list[tuple[Method, bool]]:
    """Every method of the document as ``route`` takes them, each with whether the stand-in
    implements it (``supported``: resource -> method names)."""
    implemented = {(r, m) for r, names in supported.items() for m in names}
    return [(m, (m.resource, m.name) in implemented) for m in methods(every(doc), doc)]


def resolve(routes: list[tuple[Method, bool]], verb: str, path: str, server: str,
            error: Callable[[int, str], Exception], qualified: bool = False) -> tuple[Method, re.Match[str], str]:
    """``route``, answering as Google's front end does where it finds nothing (404) and as a
    stand-in does for a method of the document it does not implement (501): (the method, its
    path parameters, its name: ``resource.method``, the resource's last part unless ``qualified``)."""
    found = route(routes, verb, path)
    if found is None:
        raise error(404, f"The requested URL /{path} was not found on this server.")
    method, match, supported = found
    name = f"{method.resource if qualified else method.resource.rsplit('.', 1)[-1]}.{method.name}"
    if not supported:
        raise error(501, f"Method {name} is not implemented by the local {server} server.")
    return method, match, name


def route(routes: list[tuple[Method, bool]], verb: str, path: str) -> tuple[Method, re.Match[str], bool] | None:
    """The method of a server's ``routes`` (each with whether the server implements it) that
    answers ``verb path``, with its path parameters; None when none does (Google's 404)."""
    for method, supported in routes:
        match = method.pattern.match(path)
        if match and method.http_method == verb:
            return method, match, supported
    return None
