"""The QuotaReader port's contract (``regions.get`` quotas), on the in-memory fake and on the real
adapter over the local Compute server; and the one table of GPU quota metrics (controller.core.quotas)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from controller.adapters.google import compute_gateway, quota_reader
from controller.adapters.memory import MemoryCompute, MemoryQuotas
from controller.core import errors, quotas
from controller.core.ports import ComputeGateway, QuotaReader
from controller.core.quotas import QuotaUse
from controller.service.config import Settings
from localcloud.compute import ComputeServer
from tests.contract.test_ports import PROJECT, request_for
from tests.wait import until


@dataclass
class Backend:
    reader: QuotaReader
    compute: ComputeGateway
    limit: Callable[[str, str, float], None]
    exhaust: Callable[[str, bool], None]


@pytest.fixture(params=["memory", "local"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "memory":
        compute = MemoryCompute()
        fake = MemoryQuotas(compute)
        yield Backend(fake, compute, limit=lambda r, m, n: fake.limits.setdefault(r, {}).__setitem__(m, n),
                      exhaust=lambda z, on: (compute.quota_exhausted.add if on else compute.quota_exhausted.discard)(z))
        return
    srv: ComputeServer = request.getfixturevalue("compute_server")
    settings = Settings(bucket="b", project=PROJECT, compute_endpoint=srv.endpoint)
    yield Backend(quota_reader(settings), compute_gateway(settings), limit=srv.quota_limit,
                  exhaust=lambda z, on: srv.quota(z, on))
    srv.faults.quota_limits.clear()
    srv.faults.quota.clear()


def test_every_gpu_metric_is_listed_with_its_limit_and_a_limit_set_is_answered(backend):
    backend.limit("us-east1", "PREEMPTIBLE_NVIDIA_H100_GPUS", 16)
    listed = backend.reader.region_quotas(PROJECT, "us-east1")
    assert {"NVIDIA_L4_GPUS", "PREEMPTIBLE_NVIDIA_L4_GPUS", "NVIDIA_H100_GPUS"} <= set(listed)
    assert listed["PREEMPTIBLE_NVIDIA_H100_GPUS"] == QuotaUse(16.0, 0.0)
    assert all(isinstance(q, QuotaUse) and q.limit > 0 for q in listed.values())


def test_live_spot_vms_use_the_preemptible_metric_and_standard_ones_the_standard_metric(backend):
    spot = request_for("quota-spot", zone="us-west1-a")  # g2-standard-8: one L4 built in
    standard = dataclasses.replace(request_for("quota-std", zone="us-west1-b"), provisioning="standard",
                                   machine_type="n1-standard-8", accelerator_type="nvidia-tesla-t4",
                                   accelerator_count=2)
    backend.compute.insert([spot], "5d1c1c5e-0000-4000-8000-000000000001", wait=10)
    backend.compute.insert([standard], "5d1c1c5e-0000-4000-8000-000000000002", wait=10)
    listed = until("the VMs to count", lambda: (q := backend.reader.region_quotas(PROJECT, "us-west1"))
                   ["PREEMPTIBLE_NVIDIA_L4_GPUS"].usage == 1 and q)
    assert listed["NVIDIA_L4_GPUS"].usage == 0
    assert listed["NVIDIA_T4_GPUS"].usage == 2 and listed["PREEMPTIBLE_NVIDIA_T4_GPUS"].usage == 0
    assert listed["NVIDIA_T4_GPUS"].left == listed["NVIDIA_T4_GPUS"].limit - 2


def test_a_region_out_of_quota_lists_its_gpu_limits_as_zero(backend):
    backend.exhaust("europe-west4-a", True)
    listed = backend.reader.region_quotas(PROJECT, "europe-west4")
    assert listed["NVIDIA_L4_GPUS"].limit == 0 and listed["NVIDIA_L4_GPUS"].left == 0
    assert backend.reader.region_quotas(PROJECT, "us-east1")["NVIDIA_L4_GPUS"].limit > 0


def test_an_unknown_region_is_a_respawn_error_on_the_real_adapter(compute_server):
    reader = quota_reader(Settings(bucket="b", project=PROJECT, compute_endpoint=compute_server.endpoint))
    with pytest.raises(errors.NotFound):
        reader.region_quotas(PROJECT, "mars-north1")


def test_the_fake_raises_its_failure():
    fake = MemoryQuotas()
    fake.failure = errors.RequestError("403 Compute Engine API has not been used in project")
    with pytest.raises(errors.RequestError):
        fake.region_quotas(PROJECT, "us-central1")
    assert fake.calls == [(PROJECT, "us-central1")]


@pytest.mark.parametrize("gpu, model, listed, expected", [
    ("nvidia-l4", "standard", None, "NVIDIA_L4_GPUS"),
    ("nvidia-l4", "spot", None, "PREEMPTIBLE_NVIDIA_L4_GPUS"),
    ("nvidia-l4", "flex-start", None, "PREEMPTIBLE_NVIDIA_L4_GPUS"),
    # Spot with no preemptible quota listed in the region counts against the standard one
    ("nvidia-h100-80gb", "spot", {"NVIDIA_H100_GPUS": QuotaUse(8, 0)}, "NVIDIA_H100_GPUS"),
    ("nvidia-unknown-gpu", "spot", None, None),
])
def test_which_metric_a_jobs_gpus_count_against(gpu, model, listed, expected):
    assert quotas.metric(gpu, model, listed) == expected


def test_what_is_left_against_what_the_job_needs():
    listed = {"PREEMPTIBLE_NVIDIA_L4_GPUS": QuotaUse(8, 6), "NVIDIA_L4_GPUS": QuotaUse(4, 5)}
    spot = quotas.left_for("nvidia-l4", "spot", 2, listed)
    assert (spot.metric, spot.left, spot.needed, spot.enough) == ("PREEMPTIBLE_NVIDIA_L4_GPUS", 2, 2, True)
    standard = quotas.left_for("nvidia-l4", "standard", 1, listed)
    assert (standard.left, standard.enough) == (0, False)  # over its limit already: nothing left, never negative
    assert quotas.left_for("nvidia-tesla-t4", "spot", 1, listed) is None
