"""bench/deployed.py, the function as deployed, run once at a tiny size with its latencies scaled down.

Behaviour only: the RSS is the function process's, the requests were counted at the HTTP layer
(list pages among them), the cold starts were fresh processes. The figures come from
``python -m bench.deployed``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import deployed
from controller.adapters.gcs import GcsStore
from controller.core import errors
from controller.core.runs import RUNS_KEPT
from controller.core.state import HISTORY_LIMIT
from localcloud.gcs import client
from localcloud.http import Served


def test_the_deployed_function_is_measured_at_a_tiny_size():
    out = deployed.measure(scale=0.01, jobs=20, quick=True)
    # The peak RSS is read from the gunicorn worker that ran the ticks: a child of the function's
    # master process (functions-framework), neither of them this test's process; the container's
    # figure is both of them.
    assert out["function_pid"] != os.getpid() and out["function_master_pid"] != os.getpid()
    assert out["function_parent_pid"] == out["function_master_pid"]
    assert "functions_framework" in out["function_cmdline"] and "--target tick" in out["function_cmdline"]
    assert out["function_rss_source"] == (f"/proc/{out['function_pid']}/status VmHWM + "
                                          f"/proc/{out['function_master_pid']}/status VmHWM")
    assert out["function_rss_20_mib"] == pytest.approx(out["function_worker_rss_mib"] + out["function_master_rss_mib"],
                                                       abs=0.11)
    # Requests were counted by the servers, per HTTP request: list pages and the aggregated list among them.
    counted = out["tick_20_http_requests"]
    assert counted["total"] > 0 and out["tick_20_http_requests_per_job"] == round(counted["total"] / 20, 3)
    assert sum(v for k, v in counted["gcs"].items() if k.startswith("list ")) >= 1
    assert sum(v for k, v in counted["compute"].items() if k.startswith("instances.aggregatedList ")) >= 1
    assert not any(k.startswith("unimplemented") for k in counted["gcs"])
    # Every running trainer beat again before the steady tick, as the VM agent writes a beat: each is
    # judged from the listing, and nothing else changed, so nothing is downloaded.
    assert out["fleet_heartbeats"] > 0 and not any(k.startswith("media ") for k in counted["gcs"]), counted["gcs"]
    assert out["deployed_tick_summary"]["jobs_seen"] == 20 and not out["deployed_tick_summary"]["errors"]
    # The ticks ran where the third of a vCPU is measured, or say that it was computed.
    assert out["deployed_third_vcpu_method"].startswith(("measured: cgroup", "computed: wall + 2 x CPU-seconds"))
    assert out["tick_20_third_vcpu_s"] > 0 and out["tick_20_cpu_s"] > 0 and out["tick_20_first_third_vcpu_s"] > 0
    assert "tick_20_third_vcpu_s_target" not in out  # issue 40's targets are for 10,000 jobs
    # Cold starts: fresh on_object processes, each its own pid, none of them the measured instance or this test,
    # each answering one job's event over the fleet.
    runs = out["cold_start_runs"]["unlimited"] + out["cold_start_runs"]["third_vcpu"]
    pids = {r["pid"] for r in runs}
    assert len(pids) == len(runs) == out["cold_start_fresh_processes"] >= 1
    assert not pids & {os.getpid(), out["function_pid"], out["function_master_pid"]}
    assert all(0 < r["listening_s"] < r["wall_s"] and r["cpu_s"] > 0 for r in runs)
    assert out["cold_start_http_requests"].get("instances.list 200", 0) >= len(out["cold_start_runs"]["unlimited"])
    assert out["cold_start_third_vcpu_method"] == out["deployed_third_vcpu_method"]
    assert out["cold_start_third_vcpu_s_target"] == {"at_most": 3, "met": out["cold_start_third_vcpu_s"] <= 3}
    assert {row[0].strip().split(":")[0].split(",")[0] for row in out["rows"]} >= {"cold start", "function peak RSS"}
    # And cold starts whose pass launches: each for a job whose VM was just reclaimed without notice, in a
    # process of its own, its replacement inserted once (the bench raises when a run inserted nothing).
    recovery = out["cold_start_recovery_runs"]["unlimited"] + out["cold_start_recovery_runs"]["third_vcpu"]
    assert len(recovery) == len(runs) and not {r["pid"] for r in recovery} & pids
    sent = out["cold_start_recovery_http_requests"]
    assert sent.get("instances.insert 200") == 1 and sent.get("instances.list 200", 0) >= 1, sent


def test_a_cold_start_runs_from_what_deploy_uploads_as_googles_build_leaves_it():
    """The upload's files only, compiled as the buildpack does with deploy's build environment,
    every mtime 1980-01-01 as in the image: each ``.pyc`` a checked-hash one that matches its
    source (a timestamp one would be stale there, and compiled again by every instance)."""
    import importlib.util
    import subprocess
    import sys

    with deployed.workspace() as source:
        files = {p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file()}
        assert {"main.py", "requirements.txt", "controller/service/functions.py"} <= files
        assert not any(f.startswith(("tests/", "bench/", "localcloud/", ".git/")) for f in files)
        assert {(source / f).stat().st_mtime for f in files} == {315532801.0}
        sources = [source / f for f in files if f.endswith(".py")]
        for py in sources:
            pyc = Path(importlib.util.cache_from_source(str(py)))
            header = pyc.read_bytes()[:16]
            flags = int.from_bytes(header[4:8], "little")
            assert flags == 0b11, f"{pyc}: not a checked-hash .pyc (flags {flags})"
            assert header[8:16] == importlib.util.source_hash(py.read_bytes()), f"{pyc} does not match {py}"
        before = {p: p.stat().st_mtime for p in source.rglob("*.pyc")}
        probe = "import main, controller; print(controller.__file__)"
        done = subprocess.run([sys.executable, "-c", probe], cwd=source, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == str(source / "controller" / "__init__.py")
        assert {p: p.stat().st_mtime for p in source.rglob("*.pyc")} == before


def test_the_fleet_statuses_are_measured_at_their_steady_size_from_the_bucket():
    """Each job's status holds a full history and twenty past runs when the ticks read it, made by
    the real controller, and the figure is what the bucket held, not what was meant."""
    out = deployed.measure(scale=0.01, jobs=10, quick=True, cold=False, with_ticks=False)
    assert out["status_history_events"] == HISTORY_LIMIT and out["status_run_summaries"] == RUNS_KEPT
    assert out["status_sizes"]["statuses"] == 10 and out["status_sizes"]["history_events"]["min"] == HISTORY_LIMIT
    # The fleet's own run began over the past ones: launched, then the bench's mix.
    assert out["fleet_phases"] == {"RUNNING": 7, "SUCCEEDED": 2, "RECOVERING": 1}
    fresh = deployed.measure(scale=0.01, jobs=10, quick=True, cold=False, with_ticks=False, steady_size=False)
    assert fresh["status_history_events"] < 10 and fresh["status_run_summaries"] == 0


@pytest.fixture
def standin():
    app = deployed.GcsStandIn(("b",))
    served = Served(app, "gcs-standin-test", threads=8)
    try:
        yield app, GcsStore(client(served.url, "p"), page_size=2)
    finally:
        served.stop()


def test_the_gcs_standin_keeps_generations_and_preconditions(standin):
    app, store = standin
    first = store.write("b", "jobs/a/spec.yaml", b"one")
    assert store.read("b", "jobs/a/spec.yaml").data == b"one"
    with pytest.raises(errors.PreconditionFailed):
        store.write("b", "jobs/a/spec.yaml", b"two", if_generation_match=0)
    second = store.write("b", "jobs/a/spec.yaml", b"two", if_generation_match=first.generation)
    assert second.generation > first.generation
    with pytest.raises(errors.NotFound):  # replaced since it was listed
        store.read_listed(first)
    assert store.read_listed(second) == b"two"
    with pytest.raises(errors.PreconditionFailed):
        store.delete("b", "jobs/a/spec.yaml", if_generation_match=first.generation)
    store.delete("b", "jobs/a/spec.yaml", if_generation_match=second.generation)
    with pytest.raises(errors.NotFound):
        store.stat("b", "jobs/a/spec.yaml")


def test_the_gcs_standin_lists_by_prefix_a_page_at_a_time(standin):
    app, store = standin
    for name in ("jobs/a/x", "jobs/b/x", "jobs/c/x", "jobs/d/x", "jobs/e/x", "other/x", "jobr"):
        store.write("b", name, b"")
    app.counts.clear()
    assert [i.name for i in store.list("b", "jobs/")] == [f"jobs/{c}/x" for c in "abcde"]
    assert app.counts["list 200"] == 3  # 2 + 2 + 1: a request per page
    assert store.list("b", "nothing/") == []


def test_the_gcs_standin_lists_the_custom_metadata_an_upload_or_its_side_door_wrote(standin):
    app, store = standin
    store.write("b", "jobs/a/heartbeat", b"{}", metadata={"attempt": "1", "token_sha256": "ab" * 32})
    app._bulk({"bucket": "b", "write": {"jobs/b/heartbeat": {"data": "{}", "metadata": {"attempt": "2"}},
                                        "jobs/c/heartbeat": "{}"}})
    listed = {i.name: i.metadata for i in store.list("b", "jobs/")}
    assert listed == {"jobs/a/heartbeat": {"attempt": "1", "token_sha256": "ab" * 32},
                      "jobs/b/heartbeat": {"attempt": "2"}, "jobs/c/heartbeat": None}


def test_the_gcs_standin_refuses_a_second_write_within_the_interval(standin):
    app, store = standin
    app.write_interval = 1.0
    store.write("b", "o", b"1")
    store.write("b", "o", b"2")  # 429 rateLimitExceeded, then google-cloud-storage's own retry a second on
    assert app.counts["upload 429"] >= 1 and app.counts["upload 200"] == 2
    assert store.read("b", "o").data == b"2"


def test_the_counted_compute_answers_one_jobs_aggregated_list_as_the_local_server_does():
    """The build's shortcut (only the instances labelled with the job are looked at) changes no answer."""
    from controller.adapters.compute import MANAGED_FILTER
    from localcloud.compute import ComputeServer, Vm

    plain, indexed = ComputeServer(run_vms=False), deployed._indexed_compute()(run_vms=False)
    for server in (plain, indexed):
        for i in range(30):
            zone = ("us-central1-a", "us-central1-b", "europe-west4-a")[i % 3]
            labels = {"respawn-managed": "true" if i % 5 else "false", "respawn-job": f"job-{i % 7}"}
            resource = {"name": f"vm-{i:02d}", "labels": labels, "status": "RUNNING", "zone": zone}
            server._vms[("p", zone, resource["name"])] = Vm("p", zone, resource)
    for text in (f'({MANAGED_FILTER}) AND (labels.respawn-job = "job-3")', MANAGED_FILTER,
                 f'({MANAGED_FILTER}) AND (labels.respawn-job = "job-*")', None):
        q = {"filter": text} if text else {}
        assert indexed._instances_aggregatedList({"project": "p"}, q, None) == \
            plain._instances_aggregatedList({"project": "p"}, q, None)
    one = indexed._instances_aggregatedList({"project": "p"}, {"filter": f'({MANAGED_FILTER}) AND (labels.respawn-job = "job-3")'}, None)
    assert sorted(i["name"] for scoped in one["items"].values() for i in scoped.get("instances", [])) == \
        ["vm-03", "vm-17", "vm-24"]  # vm-10 is job-3's but not managed


def test_a_steady_past_is_the_real_controllers_and_names_only_its_job():
    from datetime import UTC, datetime

    from bench import steady
    from controller.core.state import JobStatus, Phase

    until = datetime(2026, 6, 1, tzinfo=UTC)
    raw = steady.for_job(steady.past("b", "p", deployed.SPEC, until), "job-00007")
    st = JobStatus.from_json(raw)
    assert st.phase == Phase.SUCCEEDED and len(st.history) == HISTORY_LIMIT and len(st.runs) == RUNS_KEPT
    assert st.ledger.folded == st.event_count  # every event accounted, as the controller left it
    assert all(e.at < until for e in st.history) and st.history == tuple(sorted(st.history, key=lambda e: e.at))
    assert steady.TEMPLATE.encode() not in raw and all(n.startswith("job-00007-") for n in st.instance_ids)
    assert {"launch", "running", "preempted", "succeeded", "accepted"} <= {e.event for e in st.history}
    assert all(r.checkpoint_step for r in st.runs)  # each run resumed from and left numbered checkpoints
