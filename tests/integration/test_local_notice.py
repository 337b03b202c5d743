"""The local Compute as zero-gap recovery meets it (issue 34): ``instances.setMetadata`` on
Google's optimistic lock, the Spot preemption notice (``scheduling.preemptionNoticeDuration``,
a Preview field, on v1 and beta routes), the guest's halt time between the soft-off and
TERMINATED, and ``instances.simulateMaintenanceEvent``."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from localcloud.compute import ComputeServer
from localcloud.realism import Lognormal, Realism
from tests.wait import until

PROJECT = "notice-proj"
ZONE = "us-central1-a"
FLAVOR = {"Metadata-Flavor": "Google"}


@pytest.fixture
def srv() -> Iterator[ComputeServer]:
    with ComputeServer(boot_delay=0.05, shutdown_budget=3.0) as s:
        yield s


def api(srv: ComputeServer, path: str = "", version: str = "v1") -> str:
    return f"{srv.endpoint}/compute/{version}/projects/{PROJECT}/zones/{ZONE}/instances{path}"


def body(name: str, *, spot: bool = True, notice: dict[str, Any] | None = None, startup: str | None = None,
         shutdown: str | None = None, items: dict[str, str] | None = None, **scheduling: Any) -> dict[str, Any]:
    metadata = {**(items or {}), **{k: v for k, v in (("startup-script", startup), ("shutdown-script", shutdown)) if v}}
    sched: dict[str, Any] = {"provisioningModel": "SPOT", "automaticRestart": False, "onHostMaintenance": "TERMINATE"} \
        if spot else {"provisioningModel": "STANDARD"}
    if notice is not None:
        sched["preemptionNoticeDuration"] = notice
    return {"name": name, "machineType": f"zones/{ZONE}/machineTypes/e2-small",
            "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
            "networkInterfaces": [{"network": "global/networks/default"}], "scheduling": {**sched, **scheduling},
            "metadata": {"items": [{"key": k, "value": v} for k, v in metadata.items()]}}


def insert(srv: ComputeServer, resource: dict[str, Any], version: str = "v1") -> requests.Response:
    return requests.post(api(srv, version=version), json=resource, timeout=10)


def running(srv: ComputeServer, resource: dict[str, Any], version: str = "v1") -> dict[str, Any]:
    r = insert(srv, resource, version)
    assert r.ok, r.text
    until("RUNNING", lambda: status(srv, resource["name"]) == "RUNNING")
    return srv.instance(resource["name"])


def status(srv: ComputeServer, name: str) -> str:
    return srv.instance(name)["status"]


def operation(srv: ComputeServer, op: dict[str, Any]) -> dict[str, Any]:
    """The zone operation once DONE (``zoneOperations.wait``)."""
    url = f"{srv.endpoint}/compute/v1/projects/{PROJECT}/zones/{ZONE}/operations/{op['name']}/wait"
    return requests.post(url, timeout=30).json()


def metadata_host(srv: ComputeServer, name: str) -> str:
    return until("the VM's metadata host", lambda: _text(srv.workdir_of(name) / "md-host"))


def _text(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() and path.read_text().strip() else None


TELL_HOST = 'echo "$GCE_METADATA_HOST" > md-host'


# -- instances.setMetadata -----------------------------------------------------------------------
def test_set_metadata_replaces_the_items_on_the_current_fingerprint_and_answers_a_done_operation(srv):
    before = running(srv, body("md", items={"respawn-attempt": "2"}))["metadata"]
    assert before["fingerprint"] and before["items"] == [{"key": "respawn-attempt", "value": "2"}]
    items = [{"key": "respawn-attempt", "value": "2"}, {"key": "respawn-go", "value": "2"}]
    r = requests.post(api(srv, "/md/setMetadata"), json={"fingerprint": before["fingerprint"], "items": items}, timeout=10)
    assert r.status_code == 200, r.text
    op = r.json()
    assert op["operationType"] == "setMetadata" and op["targetLink"].endswith("/instances/md")
    assert operation(srv, op)["status"] == "DONE" and "error" not in operation(srv, op)
    after = requests.get(api(srv, "/md"), timeout=10).json()["metadata"]
    assert after["items"] == items and after["fingerprint"] not in ("", before["fingerprint"])


@pytest.mark.parametrize("fingerprint", ["stale", None])
def test_set_metadata_on_another_fingerprint_is_412_condition_not_met_as_google_answers(srv, fingerprint):
    running(srv, body("race", items={"a": "1"}))
    sent = {"items": [{"key": "a", "value": "2"}], **({"fingerprint": fingerprint} if fingerprint else {})}
    r = requests.post(api(srv, "/race/setMetadata"), json=sent, timeout=10)
    assert r.status_code == 412
    message = "Supplied fingerprint does not match current metadata fingerprint."
    assert r.json() == {"error": {"code": 412, "message": message, "status": "FAILED_PRECONDITION",
                                  "errors": [{"message": message, "domain": "global", "reason": "conditionNotMet"}]}}
    assert srv.instance("race")["metadata"]["items"] == [{"key": "a", "value": "1"}]  # nothing written


def test_the_client_reads_the_fingerprint_and_a_stale_one_is_failed_precondition(srv):
    running(srv, body("cl", items={"a": "1"}))
    client = compute_v1.InstancesClient(transport="rest", credentials=AnonymousCredentials(),
                                        client_options=ClientOptions(api_endpoint=srv.endpoint))
    got = client.get(project=PROJECT, zone=ZONE, instance="cl")
    fingerprint = got.metadata.fingerprint
    assert fingerprint == srv.instance("cl")["metadata"]["fingerprint"]
    srv.set_metadata("cl", {"b": "2"})  # someone else's write in between
    with pytest.raises(gexc.PreconditionFailed) as e:
        client.set_metadata_unary(project=PROJECT, zone=ZONE, instance="cl", metadata_resource=compute_v1.Metadata(
            fingerprint=fingerprint, items=[compute_v1.Items(key="c", value="3")]))
    assert "conditionNotMet" in str(e.value.errors)


def test_the_python_helper_merges_items_and_gives_a_new_fingerprint(srv):
    first = running(srv, body("merge", items={"a": "1", "b": "1"}))["metadata"]["fingerprint"]
    srv.set_metadata("merge", {"b": "2", "c": "3"})
    after = srv.instance("merge")["metadata"]
    assert after["items"] == [{"key": "a", "value": "1"}, {"key": "b", "value": "2"}, {"key": "c", "value": "3"}]
    assert after["fingerprint"] != first
    requests.post(f"{srv.endpoint}/_local/set_metadata", json={"name": "merge", "items": {"d": "4"}},
                  timeout=10).raise_for_status()
    assert {"key": "d", "value": "4"} in srv.instance("merge")["metadata"]["items"]


def test_a_metadata_change_wakes_the_guests_long_poll_on_its_attributes(srv):
    running(srv, body("poll", startup=TELL_HOST, items={"respawn-hold": "1"}))
    host = metadata_host(srv, "poll")
    url = f"http://{host}/computeMetadata/v1/instance/attributes/"
    first = requests.get(url, headers=FLAVOR, params={"recursive": "true"}, timeout=5)
    answers: list[requests.Response] = []
    poll = threading.Thread(target=lambda: answers.append(requests.get(url, headers=FLAVOR, timeout=30, params={
        "recursive": "true", "wait_for_change": "true", "last_etag": first.headers["ETag"], "timeout_sec": "20"})))
    began = time.monotonic()
    poll.start()
    time.sleep(0.3)
    fingerprint = srv.instance("poll")["metadata"]["fingerprint"]
    items = srv.instance("poll")["metadata"]["items"] + [{"key": "respawn-go", "value": "3"}]
    requests.post(api(srv, "/poll/setMetadata"), json={"fingerprint": fingerprint, "items": items},
                  timeout=10).raise_for_status()
    poll.join(timeout=25)
    assert answers and answers[0].json()["respawn-go"] == "3"  # keys as they are, as Google serves them
    assert time.monotonic() - began < 5  # woken by the change, not by the poll's timeout


def test_gcloud_add_metadata_goes_through_get_and_set_metadata(srv, tmp_path):
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        pytest.skip("gcloud is not on PATH: `gcloud compute instances add-metadata` was not run")
    running(srv, body("gc", items={"a": "1"}))
    done = subprocess.run([gcloud, "compute", "instances", "add-metadata", "gc", f"--zone={ZONE}", "--metadata=b=2"],
                          env=_gcloud_env(srv, tmp_path), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert srv.instance("gc")["metadata"]["items"] == [{"key": "a", "value": "1"}, {"key": "b", "value": "2"}]


def _gcloud_env(srv: ComputeServer, tmp_path: Path) -> dict[str, str]:
    token = tmp_path / "token"
    token.write_text("local\n")
    return {**os.environ, "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": f"{srv.endpoint}/compute/v1/",
            "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(token), "CLOUDSDK_CORE_PROJECT": PROJECT,
            "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}


# -- scheduling.preemptionNoticeDuration: where Google takes it ----------------------------------
NOTICE_FIELD = "scheduling.preemptionNoticeDuration"


@pytest.mark.parametrize("version", ["v1", "beta"])
@pytest.mark.parametrize("seconds", [0, 120])
def test_a_spot_vm_takes_a_notice_of_0_or_120_s_on_v1_and_beta_and_reads_it_back(srv, version, seconds):
    name = f"n{seconds}-{version}"
    r = insert(srv, body(name, notice={"seconds": seconds}), version)
    assert r.status_code == 200, r.text
    assert r.json()["selfLink"].startswith(f"{srv.endpoint}/compute/{version}/")  # the beta API links into beta
    for read in ("v1", "beta"):
        got = requests.get(api(srv, f"/{name}", read), timeout=10).json()
        assert got["scheduling"]["preemptionNoticeDuration"] == {"seconds": str(seconds)}
        assert got["selfLink"] == api(srv, f"/{name}", read)


@pytest.mark.parametrize("version", ["v1", "beta"])
@pytest.mark.parametrize("notice, spot, why", [
    ({"seconds": 60}, True, "must be 0s or 120s"),
    ({"seconds": 300}, True, "must be 0s or 120s"),
    ({"seconds": 120, "nanos": 500}, True, "must be 0s or 120s"),
    ({"seconds": 120}, False, "only supported for Spot VMs"),
])
def test_a_notice_google_does_not_take_is_refused_400_naming_the_field(srv, version, notice, spot, why):
    r = insert(srv, body("refused", notice=notice, spot=spot), version)
    assert r.status_code == 400
    error = r.json()["error"]
    assert f"Invalid value for field 'resource.{NOTICE_FIELD}'" in error["message"] and why in error["message"]
    assert error["errors"][0]["reason"] == "invalid"
    assert "refused" not in srv.names()


def test_a_notice_that_is_not_a_duration_is_refused_by_the_schema(srv):
    r = insert(srv, body("bad", notice={"minutes": 2}))
    assert r.status_code == 400 and 'Unknown name "minutes"' in r.json()["error"]["message"]


def test_a_gangs_notice_is_checked_on_its_instance_properties_through_beta(srv):
    gang = {"count": 2, "minCount": 2, "perInstanceProperties": {"g-0": {}, "g-1": {}},
            "instanceProperties": {k: v for k, v in body("x", notice={"seconds": 60}).items() if k != "name"}}
    gang["instanceProperties"]["machineType"] = "e2-small"
    refused = requests.post(api(srv, "/bulkInsert", "beta"), json=gang, timeout=10)
    assert refused.status_code == 400
    assert f"'resource.instanceProperties.{NOTICE_FIELD}'" in refused.json()["error"]["message"]
    gang["instanceProperties"]["scheduling"]["preemptionNoticeDuration"] = {"seconds": "120"}
    taken = requests.post(api(srv, "/bulkInsert", "beta"), json=gang, timeout=10)
    assert taken.status_code == 200, taken.text
    assert operation(srv, taken.json())["status"] == "DONE"
    assert {srv.instance(n)["scheduling"]["preemptionNoticeDuration"]["seconds"] for n in ("g-0", "g-1")} == {"120"}


@pytest.mark.parametrize("how", ["python", "http"])
def test_a_project_without_the_preview_refuses_a_notice_and_takes_the_same_vm_without_one(srv, how):
    def refuse(on: bool) -> None:
        if how == "python":
            srv.refuse_notice(on)
        else:
            requests.post(f"{srv.endpoint}/_local/refuse_notice", json={"on": on}, timeout=10).raise_for_status()

    refuse(True)
    for version in ("v1", "beta"):
        r = insert(srv, body(f"pre-{version}", notice={"seconds": 120}), version)
        assert r.status_code == 400 and f"'resource.{NOTICE_FIELD}'" in r.json()["error"]["message"]
    assert insert(srv, body("zero", notice={"seconds": 0})).status_code == 200  # no notice asked: nothing to refuse
    assert insert(srv, body("none")).status_code == 200
    refuse(False)
    assert insert(srv, body("pre-v1", notice={"seconds": 120})).status_code == 200


# -- the notice, then the soft-off ----------------------------------------------------------------
def watch(srv: ComputeServer, name: str, host: str | None, seconds: float = 15) -> list[tuple[float, str, str]]:
    """(seconds since the call, status, instance/preempted) at each change, until TERMINATED or gone."""
    seen: list[tuple[float, str, str]] = []
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        state = srv.instance(name)["status"] if name in srv.names() else "GONE"
        try:
            preempted = requests.get(f"http://{host}/computeMetadata/v1/instance/preempted", headers=FLAVOR,
                                     timeout=2).text if host else "-"
        except requests.ConnectionError:
            preempted = "-"  # the metadata server goes with the guest
        if not seen or seen[-1][1:] != (state, preempted):
            seen.append((time.monotonic() - began, state, preempted))
        if state in ("TERMINATED", "GONE"):
            break
        time.sleep(0.02)
    return seen


def first(seen: list[tuple[float, str, str]], status: str) -> float:
    return next(t for t, s, _ in seen if s == status)


def preempted_records(srv: ComputeServer, name: str) -> list[dict[str, Any]]:
    return [o for o in srv.operations()
            if o["operationType"] == "compute.instances.preempted" and o["targetLink"].endswith(f"/{name}")]


def test_with_a_notice_preempted_turns_true_while_running_for_the_scaled_notice_then_the_soft_off():
    # 120 s of notice -> 1.2 s; the hard-off 2 s after the soft-off (Google: 30 s), the guest's halt 0.5 s
    with ComputeServer(boot_delay=0.05, shutdown_budget=2.0, notice_scale=0.01,
                       realism=Realism(halt_seconds=0.5)) as srv:
        running(srv, body("warned", notice={"seconds": 120}, startup=TELL_HOST,
                          shutdown="sleep 0.5; touch shutdown-ran"))
        host = metadata_host(srv, "warned")
        srv.preempt("warned")
        seen = watch(srv, "warned", host, 15)
        assert seen[0][1:] == ("RUNNING", "TRUE")  # told at once, still running
        assert 1.0 <= first(seen, "STOPPING") <= 2.0
        assert [s for _, s, _ in seen][-1] == "TERMINATED"
        # the shutdown script's 0.5 s, then the halt's 0.5 s, within the hard-off's 2 s
        assert 0.9 <= first(seen, "TERMINATED") - first(seen, "STOPPING") <= 2.0
        assert len(preempted_records(srv, "warned")) == 1  # at the soft-off, not at the notice
        assert (srv.workdir_of("warned") / "shutdown-ran").exists()


def test_the_notice_wakes_a_long_poll_on_instance_preempted_at_once():
    with ComputeServer(boot_delay=0.05, shutdown_budget=1.0, notice_scale=0.05) as srv:  # 6 s of notice
        running(srv, body("polled", notice={"seconds": 120}, startup=TELL_HOST))
        url = f"http://{metadata_host(srv, 'polled')}/computeMetadata/v1/instance/preempted"
        assert requests.get(url, headers=FLAVOR, timeout=5).text == "FALSE"
        answers: list[tuple[float, str]] = []
        began = time.monotonic()
        poll = threading.Thread(target=lambda: answers.append((time.monotonic(), requests.get(
            url, headers=FLAVOR, params={"wait_for_change": "true", "timeout_sec": "30"}, timeout=40).text)))
        poll.start()
        time.sleep(0.3)
        srv.preempt("polled")
        poll.join(timeout=40)
        assert answers and answers[0][1] == "TRUE"
        assert answers[0][0] - began < 2.0 and status(srv, "polled") == "RUNNING"  # woken at the notice


def test_without_a_notice_preempted_and_stopping_come_together(srv):
    running(srv, body("abrupt", startup=TELL_HOST))
    host = metadata_host(srv, "abrupt")
    srv.preempt("abrupt")
    assert status(srv, "abrupt") == "STOPPING" and len(preempted_records(srv, "abrupt")) == 1
    assert requests.get(f"http://{host}/computeMetadata/v1/instance/preempted", headers=FLAVOR, timeout=5).text == "TRUE"
    until("TERMINATED", lambda: status(srv, "abrupt") == "TERMINATED")


def test_a_vm_is_preempted_once_and_one_deleted_during_its_notice_is_not_preempted():
    with ComputeServer(boot_delay=0.05, shutdown_budget=0.5, notice_scale=0.01, run_vms=False) as srv:
        for name in ("twice", "deleted"):
            running(srv, body(name, notice={"seconds": 120}))
            srv.preempt(name)
        srv.preempt("twice")  # during its notice: the same reclaim
        requests.delete(api(srv, "/deleted"), timeout=10).raise_for_status()
        until("TERMINATED", lambda: status(srv, "twice") == "TERMINATED")
        srv.preempt("twice")  # a husk: nothing left to reclaim
        until("gone", lambda: "deleted" not in srv.names())
        time.sleep(1.5)  # past the notice the deleted VM had
        assert len(preempted_records(srv, "twice")) == 1 and preempted_records(srv, "deleted") == []
        assert status(srv, "twice") == "TERMINATED"


def test_the_notice_scale_is_a_fault_over_http_too():
    with ComputeServer(boot_delay=0.05, shutdown_budget=0.5, run_vms=False) as srv:
        requests.post(f"{srv.endpoint}/_local/notice_scale", json={"scale": 0.005}, timeout=10).raise_for_status()
        running(srv, body("quick", notice={"seconds": 120}))
        began = time.monotonic()
        srv.preempt("quick")
        until("STOPPING", lambda: status(srv, "quick") != "RUNNING", timeout=5)
        assert 0.5 <= time.monotonic() - began < 2.0
        assert requests.post(f"{srv.endpoint}/_local/notice_scale", json={"scale": -1}, timeout=10).status_code == 400


# -- the guest's halt, between the soft-off and TERMINATED ----------------------------------------
def stopping_to_terminated(srv: ComputeServer, name: str) -> float:
    """Seconds from STOPPING (seen within a poll of it) to TERMINATED."""
    seen = watch(srv, name, None)
    return first(seen, "TERMINATED") - first(seen, "STOPPING")


@pytest.fixture
def halting() -> Iterator[ComputeServer]:
    """Guests that halt for 1 s; Compute's hard-off 3 s after the soft-off."""
    with ComputeServer(boot_delay=0.05, shutdown_budget=3.0, realism=Realism(halt_seconds=1.0)) as s:
        yield s


def test_the_guest_halts_after_its_shutdown_script_before_compute_says_terminated(halting):
    running(halting, body("halts", shutdown="sleep 0.5; touch shutdown-ran"))
    halting.preempt("halts")
    assert 1.4 <= stopping_to_terminated(halting, "halts") <= 2.2  # the script's 0.5 s, then the halt's 1 s
    assert (halting.workdir_of("halts") / "shutdown-ran").exists()


def test_the_halt_never_passes_the_hard_off(halting):
    running(halting, body("long", shutdown="sleep 2.5"))
    halting.preempt("long")
    assert 2.8 <= stopping_to_terminated(halting, "long") <= 3.6  # 2.5 + 1 would be past the hard-off at 3


def test_a_hard_preemption_runs_no_shutdown_script_yet_the_guest_still_halts(halting):
    running(halting, body("hard", shutdown="touch shutdown-ran"))
    halting.preempt("hard", graceful=False)
    assert 0.9 <= stopping_to_terminated(halting, "hard") <= 1.6
    assert not (halting.workdir_of("hard") / "shutdown-ran").exists()


def test_a_host_error_and_a_guest_crash_are_immediate_and_each_its_own_record(halting):
    entries: list[dict[str, Any]] = []
    halting.audit_log = entries.extend
    for name in ("pre", "host", "crash"):
        running(halting, body(name, startup="sleep 60"))
    halting.preempt("pre")
    halting.host_error("host")
    halting.crash("crash")
    began = time.monotonic()
    until("host and crash TERMINATED", lambda: {status(halting, "host"), status(halting, "crash")} == {"TERMINATED"})
    assert time.monotonic() - began < 0.8 and status(halting, "pre") == "STOPPING"  # the preempted guest halts
    until("pre TERMINATED", lambda: status(halting, "pre") == "TERMINATED")
    kinds = {name: [o["operationType"] for o in halting.operations()
                    if o["targetLink"].endswith(f"/{name}") and o["operationType"] != "insert"]
             for name in ("pre", "host", "crash")}
    assert kinds == {"pre": ["compute.instances.preempted"], "host": ["compute.instances.hostError"],
                     "crash": ["compute.instances.guestTerminate"]}
    logged = {e["protoPayload"]["resourceName"].rsplit("/", 1)[-1]: e["protoPayload"]["methodName"] for e in entries}
    assert logged == {"pre": "compute.instances.preempted", "host": "compute.instances.hostError",
                      "crash": "compute.instances.guestTerminate"}


def test_no_halt_by_default_and_a_few_seconds_in_the_google_profile():
    assert Realism().halt() == 0.0
    google = Realism.google()
    assert isinstance(google.halt_seconds, Lognormal)
    draws = sorted(google.halt() for _ in range(400))
    assert 1.0 <= draws[200] <= 4.0 and draws[0] > 0  # a few seconds around the 2 s median
    assert Realism.google().scaled(0.1).halt_seconds == google.halt_seconds.scaled(0.1)


# -- instances.simulateMaintenanceEvent ----------------------------------------------------------
def simulate(srv: ComputeServer, name: str) -> dict[str, Any]:
    r = requests.post(api(srv, f"/{name}/simulateMaintenanceEvent"), timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["operationType"] == "simulateMaintenanceEvent"
    return operation(srv, r.json())


def records(srv: ComputeServer, name: str) -> list[str]:
    return [o["operationType"] for o in srv.operations()
            if o["targetLink"].endswith(f"/{name}") and o["operationType"].startswith("compute.instances.")]


def maintenance_event(host: str) -> str:
    return requests.get(f"http://{host}/computeMetadata/v1/instance/maintenance-event", headers=FLAVOR, timeout=5).text


@pytest.fixture
def scaled() -> Iterator[ComputeServer]:
    """Notices a hundredth of Google's: 120 s of preemption notice in 1.2 s, 60 s of migration notice in 0.6 s."""
    with ComputeServer(boot_delay=0.05, shutdown_budget=1.0, notice_scale=0.01) as s:
        s.audit_log = lambda entries: None
        yield s


def test_simulated_maintenance_preempts_a_spot_vm_with_its_notice(scaled):
    running(scaled, body("spot", notice={"seconds": 120}, startup=TELL_HOST))
    host = metadata_host(scaled, "spot")
    assert simulate(scaled, "spot")["status"] == "DONE"
    seen = watch(scaled, "spot", host)
    assert seen[0][1:] == ("RUNNING", "TRUE") and 1.0 <= first(seen, "TERMINATED") <= 3.0
    assert records(scaled, "spot") == ["compute.instances.preempted"]


def test_simulated_maintenance_stops_a_vm_that_cannot_migrate(scaled):
    running(scaled, body("gpu", spot=False, onHostMaintenance="TERMINATE", startup=TELL_HOST, shutdown="sleep 0.5"))
    host = metadata_host(scaled, "gpu")
    simulate(scaled, "gpu")
    assert maintenance_event(host) == "TERMINATE_ON_HOST_MAINTENANCE"
    until("TERMINATED", lambda: status(scaled, "gpu") == "TERMINATED")
    assert records(scaled, "gpu") == ["compute.instances.terminateOnHostMaintenance"]


def test_simulated_maintenance_migrates_any_other_vm_live(scaled):
    entries: list[dict[str, Any]] = []
    scaled.audit_log = entries.extend
    running(scaled, body("cpu", spot=False, onHostMaintenance="MIGRATE", startup=TELL_HOST))
    host = metadata_host(scaled, "cpu")
    simulate(scaled, "cpu")
    assert maintenance_event(host) == "MIGRATE_ON_HOST_MAINTENANCE"  # announced...
    until("the migration done", lambda: maintenance_event(host) == "NONE", timeout=5)  # ...then over
    assert status(scaled, "cpu") == "RUNNING"
    assert records(scaled, "cpu") == ["compute.instances.migrateOnHostMaintenance"]
    assert [e["protoPayload"]["methodName"] for e in entries] == ["compute.instances.migrateOnHostMaintenance"]


def test_simulated_maintenance_on_a_vm_that_is_not_running_is_refused(scaled):
    running(scaled, body("down", spot=False))
    requests.post(api(scaled, "/down/stop"), timeout=10).raise_for_status()
    until("TERMINATED", lambda: status(scaled, "down") == "TERMINATED")
    r = requests.post(api(scaled, "/down/simulateMaintenanceEvent"), timeout=10)
    assert r.status_code == 400 and r.json()["error"]["errors"][0]["reason"] == "resourceNotReady"


def test_gcloud_simulate_maintenance_event_preempts_a_spot_vm(scaled, tmp_path):
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        pytest.skip("gcloud is not on PATH: `gcloud compute instances simulate-maintenance-event` was not run")
    running(scaled, body("gcs", notice={"seconds": 120}))
    done = subprocess.run([gcloud, "compute", "instances", "simulate-maintenance-event", "gcs", f"--zone={ZONE}"],
                          env=_gcloud_env(scaled, tmp_path), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    until("TERMINATED", lambda: status(scaled, "gcs") == "TERMINATED")
    assert records(scaled, "gcs") == ["compute.instances.preempted"]
