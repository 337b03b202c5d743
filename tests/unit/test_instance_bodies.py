"""What the two Compute Engine adapters send to create instances, pinned to the byte: a VM or a gang
(``compute.ComputeEngine.insert``, the beta API when it asks for a preemption notice) and a TPU
slice's host or hosts (``tpu_compute.ComputeTpu.create``: an instance, or a workload policy, an
instance template and a MIG).

Each case goes through google-cloud-compute's own clients (REST transport) over a session that
keeps every request as it went on the wire and answers as Compute would; what was sent is compared
with tests/unit/sent/<case>.txt, one request a block: its method and path, then its body. A change
to what respawn asks Compute for shows here as the lines it changes.

The bodies are compared as sent but for the order of a map's entries (``labels``,
``perInstanceProperties``): protobuf's runtime writes those in an order of its own, which differs
from one process to the next, so they are sorted by key (``canonical``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import requests.adapters
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials

from controller.adapters import compute, tpu_compute
from controller.adapters.compute import ComputeEngine, Listing
from controller.core import names
from controller.core.ports import InstanceRequest, TpuRequest
from tests.contract.test_ports import request_for

SENT = Path(__file__).parent / "sent"
ENDPOINT = "http://compute.invalid"
KWARGS: dict[str, Any] = {"transport": "rest", "credentials": AnonymousCredentials(),
                          "client_options": ClientOptions(api_endpoint=ENDPOINT)}
REQUEST_ID = "6f0c1f3e-93a4-4a52-9a37-0d1c4a1f5b27"
MAPS = frozenset({"labels", "perInstanceProperties"})  # the proto maps among the bodies' fields


def canonical(body: str) -> str:
    """``body`` as json_format wrote it (json.dumps, indent 2), each map's entries sorted by key."""
    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: walk(dict(sorted(v.items())) if k in MAPS and isinstance(v, dict) else v)
                    for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    return json.dumps(walk(json.loads(body)), indent=2) if body else body


class Wire(requests.adapters.BaseAdapter):
    """Keeps each request as sent; answers an insert with its operation DONE, and a MIG's listing
    with ``hosts`` managed instances RUNNING."""

    def __init__(self, hosts: int = 0) -> None:
        super().__init__()
        self.sent: list[str] = []
        self.hosts = hosts

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        path = urlsplit(request.url).path
        body = request.body.decode() if isinstance(request.body, bytes) else request.body or ""
        self.sent.append(f"{request.method} {path}\n{canonical(body)}\n")
        if path.endswith("/listManagedInstances"):
            answer: dict[str, Any] = {"managedInstances": [
                {"instance": f"{path.rsplit('/', 2)[-2]}-w-{i:04d}", "instanceStatus": "RUNNING",
                 "currentAction": "NONE"} for i in range(self.hosts)]}
        else:
            answer = {"name": "operation-1", "status": "DONE", "targetId": "1", "operationType": "insert"}
        response = requests.Response()
        response.status_code, response._content = 200, json.dumps(answer).encode()
        response.headers["Content-Type"] = "application/json"
        response.url, response.request = request.url, request
        return response

    def close(self) -> None:
        pass


def wired(wire: Wire, *built: Any) -> None:
    for client in built:
        client._transport._session.mount("http://", wire)


def vm_sent(requests_: list[InstanceRequest]) -> str:
    wire = Wire()

    def clients() -> Any:
        built = compute.clients(**KWARGS)
        wired(wire, *built)
        return built

    def beta() -> Any:
        from controller.adapters.compute_beta import InstancesClient

        client = InstancesClient(**KWARGS)
        wired(wire, client)
        return client

    gw = ComputeEngine(Listing(requests.Session(), ENDPOINT), clients, operation_timeout=5.0, beta=beta)
    gw.insert(requests_, REQUEST_ID)
    return "\n".join(wire.sent)


def slice_sent(request: TpuRequest) -> str:
    wire = Wire(hosts=request.hosts)

    def clients() -> tpu_compute.Clients:
        built = tpu_compute.clients(**KWARGS)
        wired(wire, *vars(built).values())
        return built

    tpu_compute.ComputeTpu(clients, operation_timeout=5.0).create(request, REQUEST_ID)
    return "\n".join(wire.sent)


def gang(**change: Any) -> list[InstanceRequest]:
    return [replace(request_for("gang", name=n), **change) for n in names.node_names("gang", 1, 2)]


def slice_request(topology: str | None = None, **change: Any) -> TpuRequest:
    return replace(TpuRequest(
        project="pinned", zone="us-central1-c", name="llm-1", accelerator_type="tpu7x-standard-4t",
        runtime_version="", spot=True,
        labels={names.MANAGED_LABEL: "true", names.JOB_LABEL: "llm", names.ATTEMPT_LABEL: "1"},
        metadata={"respawn-job": "llm", "startup-script": "#!/bin/bash\nsleep 300\n"}, service_account="default",
        scopes=("https://www.googleapis.com/auth/cloud-platform",), network="global/networks/default",
        subnetwork=None, external_ip=False, api="compute", topology=topology, hosts=1 if topology is None else 2,
        boot_image="projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2404-amd64-tpu-tpu7x"),
        **change)


OPTIONS = dict(boot_image="projects/my-images/global/images/trainer-v3", boot_disk_gb=500, boot_disk_type="hyperdisk-ml",
               subnetwork="regions/us-central1/subnetworks/train", external_ip=True, tags=("trainer", "ssh"),
               service_account="trainer@p.iam.gserviceaccount.com",
               scopes=("https://www.googleapis.com/auth/devstorage.read_write", "https://www.googleapis.com/auth/logging.write"))
FLEX = dict(provisioning="flex-start", max_run_seconds=7200)
CASES: dict[str, Callable[[], str]] = {
    "vm-spot-gpu": lambda: vm_sent([request_for("one")]),
    "vm-spot-delete-no-gpu": lambda: vm_sent([replace(request_for("one"), termination_action="delete",
                                                      accelerator_type=None, accelerator_count=0)]),
    "vm-standard-options": lambda: vm_sent([replace(request_for("one"), provisioning="standard", **OPTIONS)]),
    "vm-flex-start": lambda: vm_sent([replace(request_for("one"), **FLEX)]),
    "vm-spot-notice": lambda: vm_sent([replace(request_for("one"), preemption_notice_s=120)]),
    "gang-spot-gpu": lambda: vm_sent(gang()),
    "gang-flex-start-options": lambda: vm_sent(gang(**FLEX, **OPTIONS, accelerator_type="nvidia-h100-80gb",
                                                    accelerator_count=8)),
    "gang-spot-notice": lambda: vm_sent(gang(preemption_notice_s=120)),
    "slice-host-spot": lambda: slice_sent(slice_request()),
    "slice-host-standard-options": lambda: slice_sent(slice_request(spot=False, **OPTIONS)),
    "slice-host-flex-start": lambda: slice_sent(slice_request(spot=False, flex_start=True, max_run_seconds=7200)),
    "slice-hosts-spot": lambda: slice_sent(slice_request("2x2x2")),
    "slice-hosts-flex-start-options": lambda: slice_sent(slice_request("2x2x2", spot=False, flex_start=True,
                                                                       max_run_seconds=7200, **OPTIONS)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_what_an_adapter_sends_to_create_is_the_request_pinned(case):
    assert CASES[case]() == (SENT / f"{case}.txt").read_text()
