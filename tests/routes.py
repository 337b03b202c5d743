"""What every local server built on a discovery document must show: it answers each method it
claims (``supported``), 501 for every other method of Google's document, never a 404."""

from __future__ import annotations

import re

import requests

from localcloud import discovery


def concrete(path: str) -> str:
    """A discovery flatPath with every parameter filled in with a valid id."""
    return re.sub(r"\{\+?(\w+)\}", lambda m: f"cover-{m[1].lower()}", path)


def assert_serves_exactly(endpoint: str, doc: str, supported: dict[str, tuple[str, ...]]) -> None:
    document = discovery.document(doc)
    every = discovery.every(doc)
    for resource, methods in supported.items():
        assert set(methods) <= set(every[resource]), f"{resource}: {methods} not all in {doc}.json"
    claimed = {(r, m) for r, methods in supported.items() for m in methods}
    for resource, methods in every.items():
        node = document
        for part in resource.split("."):
            node = node["resources"][part]
        for name in methods:
            m = node["methods"][name]
            path = concrete(m.get("flatPath") or m["path"])
            answer = requests.request(m["httpMethod"], f"{endpoint}/{path}",
                                      json={} if "request" in m else None, timeout=5)
            message = answer.json()["error"]["message"] if answer.status_code >= 400 else ""
            if (resource, name) in claimed:
                assert answer.status_code != 501 and "requested URL" not in message, (resource, name, message)
            else:
                assert answer.status_code == 501, (resource, name, answer.status_code, message)
