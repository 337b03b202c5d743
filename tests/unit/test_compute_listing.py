"""The Compute adapter's listings (``compute.Listing``), sent without google-cloud-compute's client:
what they send and how they read what Compute answers, over a session that answers as Compute would."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import requests

from controller.adapters import compute
from controller.adapters.compute import API_VERSION, ComputeEngine, Listing
from controller.core import names
from controller.core.ports import InstanceStatus

MANAGED = {names.MANAGED_LABEL: "true", names.JOB_LABEL: "llm"}


class Answers(requests.Session):
    """A session that answers each GET with the next page and keeps what it was sent."""

    def __init__(self, *pages: dict[str, Any]) -> None:
        super().__init__()
        self.pages, self.sent = list(pages), []

    def get(self, url: str, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        self.sent.append({"url": url, **kwargs})
        answer = requests.Response()
        answer.status_code, answer._content = 200, json.dumps(self.pages.pop(0)).encode()
        answer.headers["Content-Type"] = "application/json"
        answer.url = url
        return answer


def engine(session: Answers) -> ComputeEngine:
    def no_clients() -> Any:
        raise AssertionError("a listing built google-cloud-compute's clients")

    return ComputeEngine(Listing(session, "http://127.0.0.1:9"), no_clients)


def vm(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "status": "RUNNING", "labels": MANAGED, "creationTimestamp": "2026-11-29T10:00:00.000-08:00",
            "id": "7311212114052375040", **extra}


def test_a_scope_compute_could_not_reach_is_unreachable_not_empty():
    """compute.v1.json's InstancesScopedList warning UNREACHABLE: "A given scope cannot be reached"."""
    session = Answers({"items": {
        "zones/us-central1-a": {"instances": [vm("llm-1")]},
        "zones/us-central1-b": {"warning": {"code": "UNREACHABLE"}},
        "zones/us-central1-c": {"warning": {"code": "NO_RESULTS_ON_PAGE"}}},
        "unreachables": ["zones/europe-west4-a"]})
    listed = engine(session).list_managed(["p"])
    assert [(i.zone, i.name) for i in listed.instances] == [("us-central1-a", "llm-1")]
    assert listed.unreachable == ["europe-west4-a", "us-central1-b"]


def test_a_listing_sends_the_clients_api_version_its_fields_and_each_pages_token():
    session = Answers({"items": [vm("llm-1")], "nextPageToken": "t2"}, {"items": [vm("llm-2", status="FLOATING")]})
    listed = engine(session).list_managed(["p"], "llm", zones=["us-central1-a"])
    first, second = session.sent
    assert first["url"] == "http://127.0.0.1:9/compute/v1/projects/p/zones/us-central1-a/instances"
    assert first["headers"] == {"x-goog-api-version": API_VERSION} and first["timeout"] == 600.0
    assert first["params"]["fields"] == compute.LIST_FIELDS and "pageToken" not in first["params"]
    assert first["params"]["filter"] == f'({compute.MANAGED_FILTER}) AND (labels.respawn-job = "llm")'
    assert second["params"]["pageToken"] == "t2"
    # Read from the JSON as it came: an id JSON carries as a string, a status added after this code as UNKNOWN.
    assert [(i.name, i.id, i.status) for i in listed.instances] == [
        ("llm-1", "7311212114052375040", InstanceStatus.RUNNING), ("llm-2", "7311212114052375040", InstanceStatus.UNKNOWN)]


def test_the_api_version_is_the_one_the_installed_client_pins():
    spec = importlib.util.find_spec("google.cloud.compute_v1")  # its folder: nothing of it imported
    assert spec is not None and spec.submodule_search_locations
    client = Path(spec.submodule_search_locations[0]) / "services" / "instances" / "client.py"
    pinned = set(re.findall(r'to_api_version_header\("([^"]+)"\)', client.read_text()))
    assert pinned == {API_VERSION}
