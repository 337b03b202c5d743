"""The benchmark's code, run once at a tiny size with its latencies scaled down: it cannot rot.

It asserts behaviour only (what a request costs and how it is counted, what the polling
baseline reads, which path a preemption takes, the figures produced); the figures
themselves come from ``make bench``.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import bench.__main__ as bench
from bench.fakes import CostlyCompute, CostlyStore, Google, SimTimer
from controller.adapters.memory import MemoryCompute, MemoryStore
from controller.core import errors
from localcloud.realism import COSTS, Lognormal, quota_group


def simulated(**costs) -> Google:
    return Google(replace(COSTS, **costs), timer=SimTimer(), seed=7, quota_phase=0.0)


def test_a_listing_costs_one_request_per_page_of_1000_objects():
    g = simulated()
    store = CostlyStore(MemoryStore(), g)
    for i in range(2500):
        store.target.put("b", f"jobs/j/{i:05d}", "x")
    assert len(store.list("b", "jobs/")) == 2500
    assert g.requests == {"gcs.list page": 3}
    store.list("b", "nothing-here/")  # an empty listing is still one request
    assert g.requests["gcs.list page"] == 4
    assert g.timer.now() > 0  # each page took its time


def test_an_aggregated_list_costs_one_request_per_500_instances_and_zonal_lists_one_each():
    fleet = bench.Fleet(60, mix=False)
    g = simulated(compute_page=25)  # 60 instances: three pages of 25
    compute = CostlyCompute(fleet.compute, g)
    assert len(compute.list_managed([bench.PROJECT]).instances) == 60
    assert g.requests == {"compute.aggregatedList page": 3}
    compute.list_managed([bench.PROJECT], fleet.jobs[0], ["us-central1-a", "us-central1-b"])
    assert g.requests["compute.instances.list"] == 2


def test_a_request_over_the_minute_s_quota_is_refused_counted_and_retried_after_the_minute():
    g = Google(replace(COSTS, quota_per_minute=2), timer=SimTimer(), seed=7, quota_phase=50.0)  # the minute ends at t=10
    for _ in range(3):
        g.compute("compute.instances.insert", quota_group("instances.insert"))
    assert g.requests["compute.instances.insert"] == 3
    assert g.refusals >= 1 and g.requests["refused 403 (default)"] == g.refusals
    assert g.timer.now() >= 10.0  # the third one went through in the next minute
    # Another group's quota is its own.
    g.compute("compute.instances.list", quota_group("instances.list"))
    assert g.requests["compute.instances.list"] == 1


def test_a_quota_that_never_refills_in_time_ends_as_the_adapter_s_retry_does():
    g = Google(replace(COSTS, quota_per_minute=0), timer=SimTimer(), seed=7, quota_phase=0.0)
    with pytest.raises(errors.TransientError, match="rateLimitExceeded"):
        g.compute("compute.instances.delete", "default")
    assert g.refusals > 3 and "compute.instances.delete" not in g.requests
    assert g.timer.now() <= 61.0


def test_a_second_write_to_one_object_within_a_second_is_refused_with_429():
    g = simulated()
    store = CostlyStore(MemoryStore(), g)
    first = store.write("b", "jobs/j/status.json", b"1")
    again = store.write("b", "jobs/j/status.json", b"2", if_generation_match=first.generation)  # retried: the client's way
    assert again.generation > first.generation and g.requests["refused 429 (one write a second per object)"] >= 1
    with pytest.raises(errors.TransientError, match="429"):
        store.write("b", "jobs/j/status.json", b"3")  # unconditional: the client does not retry it
    store.write("b", "jobs/j/other.json", b"1")  # another object: its own second


def test_an_insert_is_received_at_once_and_its_operation_waited_for_until_the_deadline():
    fleet = bench.Fleet(3, mix=False)
    g = simulated(insert_running=Lognormal(20.0, 20.0))
    compute = CostlyCompute(fleet.compute, g)
    request = replace(fleet.compute.request_of(fleet.vm(fleet.jobs[0])), name="job-00000-new")
    with pytest.raises(errors.OperationPending):
        compute.insert([request], "r1", wait=2.0)
    assert "job-00000-new" in g.received and g.requests["compute.zoneOperations.wait"] == 1
    assert g.timer.now() == pytest.approx(g.received["job-00000-new"] + 2.0, abs=0.01)  # + the client's CPU
    g.timer.sleep(30)
    compute.insert([request], "r1", wait=2.0)  # the same request id: its operation is done now
    assert g.requests["compute.instances.insert"] == 2 and g.requests["compute.zoneOperations.wait"] == 1


def test_the_polling_baseline_reads_one_job_a_poll_and_waits_before_relaunching():
    fleet = bench.Fleet(10, mix=False)
    pre = bench.preemptions(4, COSTS, seed=3)
    subjects = [(job, fleet.compute.request_of(fleet.vm(job))) for job in fleet.running()[:4]]
    waited, asked, polled_s = bench.polling_baseline(fleet, subjects, pre, 60.0, seed=3)
    at_once, _, _ = bench.polling_baseline(fleet, subjects, pre, 0.0, seed=3)
    # Nothing but one zonal list of that job per poll, then one insert per preemption.
    assert set(asked) == {"compute.instances.list", "compute.instances.insert"}
    assert asked["compute.instances.insert"] == 4
    assert asked["compute.instances.list"] == pytest.approx(polled_s / bench.POLL_S, abs=4)
    for slow, fast, p in zip(waited, at_once, pre, strict=True):
        assert slow == pytest.approx(fast + 60.0, abs=2.0)
        assert 0 < fast <= bench.POLL_S + 3.0  # the first poll after the notice sees it


def test_a_pass_that_finds_the_vm_still_stopping_after_its_marker_launches_at_once():
    """The marker says the VM's work is done: its event's pass inserts the replacement even
    while the guest is still powering off (it used to leave the insert to the next tick)."""
    fleet = bench.Fleet(12, mix=False)
    jobs = fleet.running()[:2]
    quick = bench.Preemption(marker_at=0.5, off_at=0.5, delivered_at=0.6, cold_s=0.0, tick_phase=30.0, poll_phase=1.0)
    slow = replace(quick, off_at=20.0)  # the guest powers off long after its pass
    latencies, via, g = bench.event_from_notice(fleet, jobs, [quick, slow], [1.0], scale=0.05, seed=1, workers=4)
    assert via == {"event": 2}
    assert all(x < 30.0 for x in latencies)  # neither waited for the tick at 30 s
    assert g.requests["compute.advice.capacity"] >= 1  # a cold advice cache: the launch asked


def test_bench_runs_at_a_tiny_size(capsys, tmp_path):
    assert bench.main(["--only", "fakes", "mass_recovery", "--sizes", "20", "--quick", "--scale", "0.01",
                       "--out", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "steady tick, 20 jobs" in out and "mass recovery, 20 preempted at once" in out
    assert "event path from the notice" in out and "polling baseline" in out and "tick only" in out
    assert not (tmp_path / "r.json").exists()  # a smoke run writes no figures


def test_the_local_cloud_scenarios_run_at_a_tiny_size():
    """bench/local.py: the two functions in processes of their own, over the local servers."""
    from bench import local

    measured = local.run(10, workers=4, events=2, scale=0.01)
    assert measured["mass_recovery_jobs"] == 7 and measured["mass_recovery_issued"] == 7  # 70 % were running
    assert len(measured["event_latencies_s"]) == 2 and max(measured["event_latencies_s"]) < 30
    assert measured["rate_refusals"] == 0
    json.dumps(measured)
