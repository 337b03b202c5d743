"""Partial responses (Google's ``fields`` system parameter): the local Compute and TPU servers answer
them as Google documents them, the adapters ask only for names Google's discovery documents have, and
the listing the adapter receives carries no VM's metadata (its scripts) while it still reads all it
needs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from controller.adapters import compute as compute_adapter
from controller.adapters import tpu as tpu_adapter
from controller.adapters.google import compute_gateway
from controller.core import names
from controller.core.launch import requests_for
from controller.core.state import JobStatus, Phase
from controller.service import vmscripts
from controller.service.bootstrap import launch_context
from controller.service.config import REPO_ROOT, Settings
from controller.core.spec import parse_spec
from localcloud import fields
from localcloud.compute import ComputeServer
from tests.harness import spec_doc
from tests.wait import until

import yaml

PROJECT = "fields-proj"
ZONE = "us-central1-a"


# -- the syntax, as Google's "Performance tips" pages give it --------------------------------------
DOC = {"kind": "demo", "items": [{"title": "t1", "comment": "c1", "characteristics": {"length": "short",
                                                                                   "accuracy": "high"}},
                                 {"title": "t2", "comment": "c2", "characteristics": {"length": "long"}}],
       "scopes": {"zones/a": {"instances": [{"name": "a-1", "metadata": {"items": ["big"]}}]},
                  "zones/b": {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "none"}}},
       "nextPageToken": "next"}


@pytest.mark.parametrize("mask, expected", [
    ("kind,nextPageToken", {"kind": "demo", "nextPageToken": "next"}),  # a,b
    ("items/title", {"items": [{"title": "t1"}, {"title": "t2"}]}),  # a/b, through an array
    ("items.title", {"items": [{"title": "t1"}, {"title": "t2"}]}),  # FieldMask's dots
    ("items(title,characteristics/length)", {"items": [{"title": "t1", "characteristics": {"length": "short"}},
                                                       {"title": "t2", "characteristics": {"length": "long"}}]}),
    ("items/characteristics/*", {"items": [{"characteristics": {"length": "short", "accuracy": "high"}},
                                           {"characteristics": {"length": "long"}}]}),
    ("scopes/*/instances(name)", {"scopes": {"zones/a": {"instances": [{"name": "a-1"}]}}}),  # * over a map's keys
    ("scopes/*/instances(name),scopes/*/warning/code",
     {"scopes": {"zones/a": {"instances": [{"name": "a-1"}]}, "zones/b": {"warning": {"code": "NO_RESULTS_ON_PAGE"}}}}),
    ("items/title,items", {"items": DOC["items"]}),  # all of a field wins over part of it
    ("*", DOC),
    (" kind , items( title ) ", {"kind": "demo", "items": [{"title": "t1"}, {"title": "t2"}]}),
])
def test_a_selection_keeps_what_it_names_and_nothing_else(mask, expected):
    assert fields.select(DOC, fields.parse(mask)) == expected


@pytest.mark.parametrize("mask", ["items(title", "items)", "a,,b", "items/", "(title)", "a b"])
def test_a_selection_that_does_not_parse_is_refused(mask):
    with pytest.raises(fields.FieldsError):
        fields.parse(mask)


# -- the names, against the discovery documents -----------------------------------------------------
@pytest.mark.parametrize("mask, schema, doc", [
    (compute_adapter.AGGREGATED_FIELDS, "InstanceAggregatedList", "compute.v1"),
    (compute_adapter.LIST_FIELDS, "InstanceList", "compute.v1"),
    (compute_adapter.GO_FIELDS, "Instance", "compute.v1"),
    (tpu_adapter.NODE_FIELDS, "ListNodesResponse", "tpu.v2"),
])
def test_the_adapters_ask_only_for_names_the_discovery_documents_have(mask, schema, doc):
    fields.check(fields.parse(mask), schema, doc)  # raises FieldsError naming one Google would refuse


@pytest.mark.parametrize("mask, refused", [
    ("items/*/instances(nosuch)", "nosuch"),
    ("item", "item"),
    ("items/*/instances(Name)", "Name"),  # case-sensitive
    ("items/*/instances/name(first)", "name(first)"),  # a string has nothing within it
])
def test_a_name_the_schema_lacks_is_refused(mask, refused):
    with pytest.raises(fields.FieldsError) as refusal:
        fields.check(fields.parse(mask), "InstanceAggregatedList")
    assert str(refusal.value) == f"Invalid field selection {refused}"


# -- the local Compute, over HTTP ---------------------------------------------------------------------
@pytest.fixture
def srv() -> Iterator[ComputeServer]:
    with ComputeServer(run_vms=False) as s:
        yield s


def insert(srv: ComputeServer, name: str, metadata: dict[str, str], labels: dict[str, str] | None = None) -> None:
    body = {"name": name, "machineType": f"zones/{ZONE}/machineTypes/e2-small", "labels": labels or {},
            "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
            "networkInterfaces": [{"network": "global/networks/default"}],
            "metadata": {"items": [{"key": k, "value": v} for k, v in metadata.items()]}}
    r = requests.post(f"{srv.endpoint}/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances", json=body, timeout=10)
    assert r.ok, r.text


def get(srv: ComputeServer, path: str, **kwargs: Any) -> requests.Response:
    return requests.get(f"{srv.endpoint}/compute/v1/projects/{PROJECT}/{path}", timeout=10, **kwargs)


def test_the_local_compute_honours_fields_on_list_aggregated_list_and_get(srv):
    insert(srv, "vm-1", {"startup-script": "#!/bin/bash\n" + "x" * 10_000})
    whole = get(srv, "aggregated/instances").json()
    assert "startup-script" in str(whole)
    mask = "items/*/instances(name,status),nextPageToken"
    for asked in ({"params": {"fields": mask}}, {"headers": {"X-Goog-FieldMask": mask}}):
        page = get(srv, "aggregated/instances", **asked).json()
        assert page == {"items": {f"zones/{ZONE}": {"instances": [{"name": "vm-1", "status": page["items"][
            f"zones/{ZONE}"]["instances"][0]["status"]}]}}}, page
    listed = get(srv, f"zones/{ZONE}/instances", params={"fields": "items(name,labels),kind"}).json()
    assert listed == {"kind": "compute#instanceList", "items": [{"name": "vm-1"}]}  # no labels: none to keep
    one = get(srv, f"zones/{ZONE}/instances/vm-1", params={"fields": "name,metadata/fingerprint"}).json()
    assert set(one) == {"name", "metadata"} and set(one["metadata"]) == {"fingerprint"}


def test_the_local_compute_refuses_a_selection_google_would_refuse_before_the_method_runs(srv):
    r = get(srv, "aggregated/instances", params={"fields": "items/*/instances(nosuch)"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "Invalid field selection nosuch"
    body = {"name": "never", "machineType": f"zones/{ZONE}/machineTypes/e2-small",
            "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
            "networkInterfaces": [{"network": "global/networks/default"}]}
    r = requests.post(f"{srv.endpoint}/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances",
                      params={"fields": "nosuch"}, json=body, timeout=10)
    assert r.status_code == 400 and "never" not in srv.names(), "a refused request must not have run"


# -- the adapter over the local Compute -------------------------------------------------------------
def test_the_listing_the_adapter_receives_holds_no_scripts_and_it_still_reads_everything(srv, monkeypatch):
    scripts = vmscripts.load(REPO_ROOT / "deploy" / "vm")
    ctx = launch_context(Settings(bucket="b", project=PROJECT), scripts)
    spec = parse_spec(yaml.safe_dump(spec_doc(zones=[ZONE], project=PROJECT)), "job")
    gateway = compute_gateway(Settings(bucket="b", project=PROJECT, compute_endpoint=srv.endpoint))
    for job in ("one", "two"):
        gateway.insert(requests_for(job, spec, JobStatus(phase=Phase.PROVISIONING, attempt=1, zone=ZONE), ctx),
                       names.request_id(job, 1, 0))
    until("both RUNNING", lambda: all(srv.instance(f"{job}-1")["status"] == "RUNNING" for job in ("one", "two")))
    received: list[bytes] = []
    gateway.listing.session.hooks["response"].append(lambda r, *a, **k: received.append(r.content))

    lean = gateway.list_managed([PROJECT])
    zoned = gateway.list_managed([PROJECT], zones=[ZONE])
    assert received and not any(b"startup-script" in body or b'"metadata"' in body for body in received)
    monkeypatch.setattr(compute_adapter, "AGGREGATED_FIELDS", "*")  # everything, as before partial responses
    monkeypatch.setattr(compute_adapter, "LIST_FIELDS", "*")
    received.clear()
    whole, zoned_whole = gateway.list_managed([PROJECT]), gateway.list_managed([PROJECT], zones=[ZONE])
    assert any(b"startup-script" in body for body in received)
    assert sorted(lean.instances, key=str) == sorted(whole.instances, key=str) and len(lean.instances) == 2
    assert sorted(zoned.instances, key=str) == sorted(zoned_whole.instances, key=str) == sorted(lean.instances, key=str)
    assert {i.labels[names.JOB_LABEL] for i in lean.instances} == {"one", "two"} and all(i.id for i in lean.instances)


def test_the_tpu_listing_the_adapter_receives_holds_no_scripts_and_it_still_reads_everything(monkeypatch):
    from controller.adapters.google import tpu_gateway
    from localcloud.tpu import TpuServer

    zone = "us-central2-b"
    with TpuServer(boot_delay=0.05) as srv:
        labels = {names.MANAGED_LABEL: "true", names.JOB_LABEL: "tpu", names.ATTEMPT_LABEL: "1"}
        body = {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base", "labels": labels,
                "schedulingConfig": {"spot": True}, "metadata": {"startup-script": "#!/bin/bash\n" + "x" * 5_000}}
        r = requests.post(f"{srv.endpoint}/v2/projects/{PROJECT}/locations/{zone}/nodes", params={"nodeId": "tpu-1"},
                          json=body, timeout=10)
        assert r.ok, r.text
        until("READY", lambda: srv.node("tpu-1")["state"] == "READY")
        gateway = tpu_gateway(Settings(bucket="b", project=PROJECT, tpu_endpoint=srv.endpoint))
        received: list[bytes] = []
        gateway.client.transport._session.hooks["response"].append(lambda r, *a, **k: received.append(r.content))
        lean = gateway.list_nodes([PROJECT], [zone])
        assert received and not any(b"startup-script" in b for b in received)
        monkeypatch.setattr(tpu_adapter, "NODE_FIELDS", None)  # everything
        whole = gateway.list_nodes([PROJECT], [zone])
        assert lean == whole and [(n.name, n.spot, n.labels[names.JOB_LABEL]) for n in lean.nodes] == [("tpu-1", True, "tpu")]
