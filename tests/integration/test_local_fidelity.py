"""The local cloud is not kinder than Google: VM lifetimes, the metadata server as
google-auth sees it, GCS preconditions, reserved characters in object names, the
per-object write rate, a start that fails cleaning up after itself, and, when asked
(``Realism``), Google's latency, operation durations and bulkInsert limits."""

from __future__ import annotations

import io
import json
import os
import shlex
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from localcloud import stack
from localcloud.compute import QUICK, ComputeServer
from localcloud.gcs import LocalGcs, client
from localcloud.realism import Realism
from tests.wait import until

PROJECT = "fidelity-proj"
BUCKET = "fidelity-bucket"
TRAINER_ACCOUNT = f"trainer@{PROJECT}.iam.gserviceaccount.com"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"


# -- VMs -------------------------------------------------------------------------------
@pytest.fixture
def srv() -> Iterator[ComputeServer]:
    with ComputeServer(boot_delay=0.05, shutdown_budget=3.0) as s:
        yield s


def boot(srv: ComputeServer, name: str, startup: str | None, shutdown: str | None = None,
         accounts: list[dict[str, Any]] | None = None) -> None:
    items = [{"key": k, "value": v} for k, v in (("startup-script", startup), ("shutdown-script", shutdown)) if v]
    body = {"name": name, "machineType": "zones/us-central1-a/machineTypes/e2-small",
            "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
            "networkInterfaces": [{"network": "global/networks/default"}],
            "scheduling": {"provisioningModel": "SPOT", "automaticRestart": False, "onHostMaintenance": "TERMINATE"},
            "metadata": {"items": items}}
    if accounts is not None:
        body["serviceAccounts"] = accounts
    r = requests.post(f"{srv.endpoint}/compute/v1/projects/{PROJECT}/zones/us-central1-a/instances", json=body, timeout=10)
    assert r.ok, r.text


def status(srv: ComputeServer, name: str) -> str:
    return srv.instance(name)["status"]


def serial(srv: ComputeServer, name: str) -> str:
    path = srv.workdir_of(name) / "serial-port-1.log"
    return path.read_text() if path.exists() else ""


def guest_terminations(srv: ComputeServer, name: str) -> int:
    return sum(1 for o in srv.operations()
               if o["operationType"] == "compute.instances.guestTerminate" and o["targetLink"].endswith(f"/{name}"))


def test_a_vm_runs_on_after_its_startup_script_exits(srv):
    """On Compute Engine the startup script is a oneshot unit: the VM runs (and bills) on."""
    boot(srv, "ends", "echo the script is done; exit 3")
    until("the script's end in the serial log", lambda: "failed with error: exit status 3" in serial(srv, "ends"))
    time.sleep(1.0)
    assert status(srv, "ends") == "RUNNING"
    assert guest_terminations(srv, "ends") == 0
    assert "Finished running startup scripts." in serial(srv, "ends")


def test_a_vm_without_a_startup_script_runs(srv):
    boot(srv, "bare", None)
    until("RUNNING", lambda: status(srv, "bare") == "RUNNING")
    time.sleep(0.5)
    assert status(srv, "bare") == "RUNNING"
    assert "No startup scripts to run." in serial(srv, "bare")


def test_a_guest_poweroff_after_the_script_ended_runs_the_shutdown_script_then_terminates(srv):
    # the background job outlives the script, as it does under the guest agent
    boot(srv, "later", "(sleep 1; poweroff) >/dev/null 2>&1 &\nexit 0",
         shutdown='echo "notice=${RESPAWN_NOTICE_SECONDS:-none}" > shutdown-ran')
    until("the script's end", lambda: "startup-script exit status 0" in serial(srv, "later"))
    assert status(srv, "later") == "RUNNING"
    until("TERMINATED", lambda: status(srv, "later") == "TERMINATED", timeout=15)
    assert guest_terminations(srv, "later") == 1
    # Google runs the shutdown script on a guest shutdown, and sets it no deadline
    assert (srv.workdir_of("later") / "shutdown-ran").read_text().strip() == "notice=none"


def test_a_delete_while_the_guest_shuts_itself_down_keeps_its_metadata_server_until_that_shutdown_ends(srv):
    """The controller deletes a VM whose trainer is done while its guest still runs the shutdown
    script its own poweroff began: the guest keeps its metadata server until it is off (a second
    power-off stopped it at once: the agent's last lines were "metadata instance/name unreadable
    (curl 7, HTTP 000)"), and the delete is done only once that shutdown is over."""
    md = 'curl -s -o /dev/null -w "%{http_code}" -H "Metadata-Flavor: Google" ' \
         '"http://$GCE_METADATA_HOST/computeMetadata/v1/instance/name" > md'
    boot(srv, "bye", "(sleep 0.3; poweroff) >/dev/null 2>&1 &\nexit 0", shutdown=f"sleep 1.5; {md}; touch done")
    until("STOPPING", lambda: status(srv, "bye") == "STOPPING", timeout=15)
    requests.delete(f"{srv.endpoint}/compute/v1/projects/{PROJECT}/zones/us-central1-a/instances/bye",
                    timeout=10).raise_for_status()
    until("gone", lambda: "bye" not in srv.names(), timeout=15)
    assert (srv.workdir_of("bye") / "done").exists()  # gone only once its shutdown was over
    assert (srv.workdir_of("bye") / "md").read_text() == "200"


def test_a_delete_while_the_guest_shuts_itself_down_still_ends_it_at_the_deletes_own_deadline(srv):
    """A guest's own shutdown has no deadline; a delete has one (``shutdown_budget``, 3 s here):
    past it the guest is off, its shutdown script cut short."""
    boot(srv, "slow", "(sleep 0.3; poweroff) >/dev/null 2>&1 &\nexit 0", shutdown="sleep 60; touch done")
    until("STOPPING", lambda: status(srv, "slow") == "STOPPING", timeout=15)
    asked = time.monotonic()
    requests.delete(f"{srv.endpoint}/compute/v1/projects/{PROJECT}/zones/us-central1-a/instances/slow",
                    timeout=10).raise_for_status()
    until("gone", lambda: "slow" not in srv.names(), timeout=20)
    assert time.monotonic() - asked < 15 and not (srv.workdir_of("slow") / "done").exists()


def test_shutdown_without_a_time_waits_a_minute_and_can_be_cancelled(srv):
    boot(srv, "sched", "shutdown\nsleep 1.5\nshutdown -c\necho still up\nshutdown -h now\nsleep 30")
    until("TERMINATED", lambda: status(srv, "sched") == "TERMINATED", timeout=15)
    log = serial(srv, "sched")
    assert "Shutdown scheduled in 60 s" in log and "still up" in log


@pytest.mark.parametrize("how", ["preempt", "stop"])
def test_a_deadline_from_compute_reaches_the_shutdown_script(srv, how):
    name = f"notice-{how}"
    boot(srv, name, "true", shutdown='echo "$RESPAWN_NOTICE_SECONDS" > notice')
    until("the script's end", lambda: "startup-script exit status 0" in serial(srv, name))
    assert status(srv, name) == "RUNNING"  # idle, and still running its shutdown script when stopped
    if how == "preempt":
        srv.preempt(name)
    else:
        requests.post(f"{srv.endpoint}/compute/v1/projects/{PROJECT}/zones/us-central1-a/instances/{name}/stop",
                      timeout=10).raise_for_status()
    until("TERMINATED", lambda: status(srv, name) == "TERMINATED", timeout=15)
    assert (srv.workdir_of(name) / "notice").read_text().strip() == "3"


def test_a_fractional_deadline_is_told_as_it_is():
    with ComputeServer(boot_delay=0.05, shutdown_budget=1.5) as short:
        boot(short, "frac", "true", shutdown='echo "$RESPAWN_NOTICE_SECONDS" > notice')
        until("the script's end", lambda: "startup-script exit status 0" in serial(short, "frac"))
        short.preempt("frac")
        until("TERMINATED", lambda: status(short, "frac") == "TERMINATED", timeout=15)
        assert (short.workdir_of("frac") / "notice").read_text().strip() == "1.5"


def test_a_crash_kills_the_guest_at_once_without_its_shutdown_script(srv):
    boot(srv, "crash", "sleep 60", shutdown="touch shutdown-ran")
    until("RUNNING", lambda: status(srv, "crash") == "RUNNING")
    time.sleep(0.3)
    srv.crash("crash")
    until("TERMINATED", lambda: status(srv, "crash") == "TERMINATED")
    assert guest_terminations(srv, "crash") == 1
    assert not (srv.workdir_of("crash") / "shutdown-ran").exists()


# -- the metadata server, as google-auth sees it -----------------------------------------
AUTH_PROBE = f"""
import json, google.auth, google.auth.transport.requests as tr
from google.auth import compute_engine
from google.auth.compute_engine import _metadata
request = tr.Request()
out = {{"on_gce": _metadata.is_on_gce(request)}}
creds = compute_engine.Credentials()
creds.refresh(request)
out.update(token=creds.token, email=creds.service_account_email, scopes=list(creds.scopes or []), valid=creds.valid)
default, project = google.auth.default()
default.refresh(request)
out.update(default_type=type(default).__name__, default_token=default.token, project=project)
ids = compute_engine.IDTokenCredentials(request, "https://example.test", use_metadata_identity_endpoint=True)
ids.refresh(request)
out.update(id_token=ids.token.count("."), id_expiry=str(ids.expiry))
json.dump(out, open("auth.json", "w"))
"""


def _probe_script() -> str:
    env = "unset GOOGLE_APPLICATION_CREDENTIALS CLOUDSDK_CONFIG NO_GCE_CHECK"
    return (f"{env}\necho \"$GCE_METADATA_HOST\" > md-host\n"
            f"{shlex.quote(sys.executable)} -c {shlex.quote(AUTH_PROBE)}\n")


def test_google_auth_gets_its_token_and_project_from_a_local_vm(srv):
    boot(srv, "auth", _probe_script(), accounts=[{"email": TRAINER_ACCOUNT, "scopes": [CLOUD_PLATFORM]}])
    result = until("google-auth's answers", lambda: _json(srv.workdir_of("auth") / "auth.json"), timeout=60)
    assert result["on_gce"] is True
    assert result["token"].startswith("ya29.") and result["valid"]
    assert result["email"] == TRAINER_ACCOUNT and result["scopes"] == [CLOUD_PLATFORM]
    assert result["default_type"] == "Credentials" and result["default_token"] == result["token"]
    assert result["project"] == PROJECT
    assert result["id_token"] == 2  # header.payload.signature


def test_the_metadata_server_answers_as_googles_does(srv):
    boot(srv, "md", "echo \"$GCE_METADATA_HOST\" > md-host", accounts=[{"email": "default", "scopes": [CLOUD_PLATFORM]}])
    host = until("the host", lambda: _text(srv.workdir_of("md") / "md-host"))
    base, flavor = f"http://{host}", {"Metadata-Flavor": "Google"}
    root = requests.get(base, timeout=5)  # the probe clients send, with no header at all
    assert root.status_code == 200 and root.headers["Metadata-Flavor"] == "Google"
    assert requests.get(f"{base}/computeMetadata/v1/instance/id", timeout=5).status_code == 403
    token = requests.get(f"{base}/computeMetadata/v1/instance/service-accounts/default/token", headers=flavor, timeout=5)
    assert token.headers["Content-Type"].startswith("application/json")
    assert set(token.json()) == {"access_token", "expires_in", "token_type"} and 0 < token.json()["expires_in"] <= 3600
    account = requests.get(f"{base}/computeMetadata/v1/instance/service-accounts/default/", headers=flavor,
                           params={"recursive": "true"}, timeout=5).json()
    assert account["aliases"] == ["default"] and account["scopes"] == [CLOUD_PLATFORM]
    assert account["email"].endswith("-compute@developer.gserviceaccount.com") and "token" not in account
    email = requests.get(f"{base}/computeMetadata/v1/instance/service-accounts/default/email", headers=flavor, timeout=5)
    assert email.text == account["email"]
    listing = requests.get(f"{base}/computeMetadata/v1/instance/service-accounts/", headers=flavor, timeout=5).text
    assert listing.splitlines() == ["default/", f"{account['email']}/"]
    assert requests.get(f"{base}/computeMetadata/v1/project/project-id", headers=flavor, timeout=5).text == PROJECT
    instance = requests.get(f"{base}/computeMetadata/v1/instance/", headers=flavor, params={"recursive": "true"},
                            timeout=5).json()
    assert {"machineType", "maintenanceEvent", "serviceAccounts", "networkInterfaces"} <= instance.keys()
    assert isinstance(instance["id"], int) and isinstance(instance["networkInterfaces"], list)
    project = requests.get(f"{base}/computeMetadata/v1/project/", headers=flavor, params={"recursive": "true"},
                           timeout=5).json()
    assert project["projectId"] == PROJECT and isinstance(project["numericProjectId"], int)
    identity = f"{base}/computeMetadata/v1/instance/service-accounts/default/identity"
    assert requests.get(identity, headers=flavor, timeout=5).status_code == 400
    assert requests.get(identity, headers=flavor, params={"audience": "x"}, timeout=5).text.count(".") == 2


def test_an_instance_without_a_service_account_has_no_token(srv):
    boot(srv, "nosa", "echo \"$GCE_METADATA_HOST\" > md-host")
    host = until("the host", lambda: _text(srv.workdir_of("nosa") / "md-host"))
    answer = requests.get(f"http://{host}/computeMetadata/v1/instance/service-accounts/default/token",
                          headers={"Metadata-Flavor": "Google"}, timeout=5)
    assert answer.status_code == 404


def test_a_vm_s_token_names_its_account_to_the_services_it_calls(srv):
    """What Google's token check tells a service a VM calls (the local Artifact Registry asks it)."""
    boot(srv, "tok", "echo \"$GCE_METADATA_HOST\" > md-host", accounts=[{"email": TRAINER_ACCOUNT, "scopes": [CLOUD_PLATFORM]}])
    boot(srv, "dflt", "echo \"$GCE_METADATA_HOST\" > md-host", accounts=[{"email": "default", "scopes": [CLOUD_PLATFORM]}])
    tokens = {}
    for name in ("tok", "dflt"):
        host = until("the host", lambda: _text(srv.workdir_of(name) / "md-host"))
        tokens[name] = requests.get(f"http://{host}/computeMetadata/v1/instance/service-accounts/default/token",
                                    headers={"Metadata-Flavor": "Google"}, timeout=5).json()["access_token"]
    assert srv.token_account(tokens["tok"]) == TRAINER_ACCOUNT
    assert srv.token_account(tokens["dflt"]).endswith("-compute@developer.gserviceaccount.com")
    assert srv.token_account("ya29.made-up") is None


def test_an_access_token_serves_until_it_expires_even_once_a_new_one_is_issued(monkeypatch):
    from localcloud import metadata

    clock = [1000.0]
    monkeypatch.setattr(metadata.time, "monotonic", lambda: clock[0])
    tokens = metadata.Tokens("42")
    first = json.loads(tokens.access({})[1])["access_token"]
    assert tokens.valid(first) and not tokens.valid("ya29.localcloud-42-9")
    clock[0] += tokens.lifetime - tokens.renew_within + 1  # the server hands out a fresh one from now
    second = json.loads(tokens.access({})[1])["access_token"]
    assert second != first and tokens.valid(first) and tokens.valid(second)
    clock[0] += tokens.renew_within  # the first one's hour is up
    assert not tokens.valid(first) and tokens.valid(second)


def _json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() and path.stat().st_size else None


def _text(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() and path.read_text().strip() else None


# -- GCS --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gcs() -> Iterator[LocalGcs]:
    with LocalGcs(buckets=(BUCKET,)) as g:
        yield g


def fresh(gcs: LocalGcs, data: bytes = b"v1") -> Any:
    name = f"obj-{time.monotonic_ns()}"
    blob = client(gcs.url).bucket(BUCKET).blob(name)
    blob.upload_from_string(data)
    blob.reload()
    return blob


def media(gcs: LocalGcs, name: str, data: bytes, **conditions: Any) -> requests.Response:
    return requests.post(f"{gcs.url}/upload/storage/v1/b/{BUCKET}/o",
                         params={"uploadType": "media", "name": name, **conditions}, data=data, timeout=10)


class TestPreconditions:
    def test_media_uploads_are_judged_with_googles_412(self, gcs):
        blob = fresh(gcs)
        refused = media(gcs, blob.name, b"v2", ifGenerationMatch=0)
        assert refused.status_code == 412
        error = refused.json()["error"]
        assert error["code"] == 412 and error["errors"][0]["reason"] == "conditionNotMet"
        assert error["message"] == "At least one of the pre-conditions you specified did not hold."
        assert media(gcs, blob.name, b"v2", ifGenerationMatch=blob.generation + 1).status_code == 412
        assert media(gcs, blob.name, b"v2", ifMetagenerationMatch=7).status_code == 412
        assert media(gcs, blob.name, b"v2", ifGenerationNotMatch=blob.generation).status_code == 304
        assert media(gcs, f"{blob.name}-new", b"x", ifGenerationMatch=blob.generation).status_code == 412
        assert media(gcs, blob.name, b"v2", ifGenerationMatch=blob.generation).status_code == 200
        assert client(gcs.url).bucket(BUCKET).blob(blob.name).download_as_bytes() == b"v2"

    def test_reads_are_judged(self, gcs):
        blob = fresh(gcs)
        bucket = client(gcs.url).bucket(BUCKET)
        with pytest.raises(gexc.PreconditionFailed):
            bucket.blob(blob.name).download_as_bytes(if_generation_match=blob.generation + 1)
        with pytest.raises(gexc.PreconditionFailed):
            bucket.get_blob(blob.name, if_metageneration_match=5)
        with pytest.raises(gexc.NotModified):
            bucket.get_blob(blob.name, if_generation_not_match=blob.generation)
        with pytest.raises(gexc.NotFound):  # a missing object is 404 whatever the conditions say
            bucket.blob("never-written").download_as_bytes(if_generation_match=0)
        assert bucket.blob(blob.name).download_as_bytes(if_generation_match=blob.generation) == b"v1"

    def test_a_generation_replaced_since_it_was_read_is_gone_when_pinned(self, gcs):
        """Google pins a download to the generation read (mediaLink); without versioning the old one is 404."""
        gcs.pin_generations = True
        try:
            blob = fresh(gcs)
            assert f"generation={blob.generation}" in blob.media_link
            client(gcs.url).bucket(BUCKET).blob(blob.name).upload_from_string(b"v2")
            with pytest.raises(gexc.NotFound):
                blob.download_as_bytes()
        finally:
            gcs.pin_generations = False

    def test_metadata_updates_bump_the_metageneration_and_are_judged(self, gcs):
        blob = fresh(gcs)
        assert blob.metageneration == 1
        blob.metadata = {"k": "v"}
        blob.patch(if_metageneration_match=1)
        assert blob.metageneration == 2
        with pytest.raises(gexc.PreconditionFailed):
            blob.patch(if_metageneration_match=1)
        blob.reload()
        assert blob.metageneration == 2
        with pytest.raises(gexc.PreconditionFailed):
            blob.delete(if_metageneration_match=1)
        blob.delete(if_metageneration_match=2)

    def test_a_resumable_upload_is_judged_when_it_finishes(self, gcs):
        blob = fresh(gcs)
        big = client(gcs.url).bucket(BUCKET).blob(blob.name, chunk_size=256 * 1024)
        data = b"x" * (300 * 1024)
        with pytest.raises(gexc.PreconditionFailed):
            big.upload_from_file(io.BytesIO(data), if_generation_match=0, size=len(data))
        big.upload_from_file(io.BytesIO(data), if_generation_match=blob.generation, size=len(data))
        assert client(gcs.url).bucket(BUCKET).blob(blob.name).download_as_bytes() == data

    def test_copies_are_judged_against_their_destination_and_source(self, gcs):
        src, dst = fresh(gcs, b"src"), fresh(gcs, b"dst")
        bucket = client(gcs.url).bucket(BUCKET)
        with pytest.raises(gexc.PreconditionFailed):
            bucket.copy_blob(src, bucket, dst.name, if_generation_match=0)
        with pytest.raises(gexc.PreconditionFailed):
            bucket.copy_blob(src, bucket, dst.name, if_source_generation_match=src.generation + 1)
        bucket.copy_blob(src, bucket, dst.name, if_generation_match=dst.generation,
                         if_source_generation_match=src.generation)
        assert bucket.blob(dst.name).download_as_bytes() == b"src"

    def test_links_lead_back_through_the_proxy(self, gcs):
        blob = fresh(gcs)
        assert blob.media_link.startswith(gcs.url)
        assert blob.self_link.startswith(gcs.url)


NAMES = ["hash#tag", "query?x=1&y", "slash%2Fliteral", "with space", "plus+sign", "all # ? %2F of it/ü"]


@pytest.mark.parametrize("name", NAMES)
def test_reserved_characters_in_names_round_trip(gcs, name):
    bucket = client(gcs.url).bucket(BUCKET)
    bucket.blob(name).upload_from_string(name.encode())
    assert name in [b.name for b in bucket.list_blobs(prefix=name)]
    assert bucket.blob(name).download_as_bytes() == name.encode()
    assert bucket.get_blob(name).name == name
    raw = requests.get(f"{gcs.url}/storage/v1/b/{BUCKET}/o/{quote(name, safe='')}", params={"alt": "media"}, timeout=10)
    assert raw.content == name.encode()
    bucket.blob(name).delete()
    assert bucket.get_blob(name) is None


def test_the_per_object_write_rate_is_limited_when_asked(gcs):
    name = f"hot-{time.monotonic_ns()}"
    assert media(gcs, name, b"1").status_code == 200 and media(gcs, name, b"2").status_code == 200  # off by default
    gcs.limit_writes(1.0)
    try:
        assert media(gcs, name, b"3").status_code == 200
        refused = media(gcs, name, b"4")
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert error["errors"][0]["reason"] == "rateLimitExceeded" and "gcs429" in error["message"]
        assert media(gcs, f"{name}-other", b"x").status_code == 200  # per object
        assert requests.get(f"{gcs.url}/storage/v1/b/{BUCKET}/o/{name}", timeout=10).ok  # reads are not writes
        started = time.monotonic()
        client(gcs.url).bucket(BUCKET).blob(name).upload_from_string(b"5")  # the client backs off on 429
        assert time.monotonic() - started < 30
        time.sleep(1.0)
        assert media(gcs, name, b"6").status_code == 200
    finally:
        gcs.limit_writes(None)


def test_a_conditional_write_holds_its_own_object_only(gcs, monkeypatch):
    """The check and the act of a conditional write are one step for that object, and no
    other object's writes queue behind it (GCS serves unrelated objects side by side)."""
    from localcloud.gcs import _STRIPES

    held, release = threading.Event(), threading.Event()
    slow, other = fresh(gcs), fresh(gcs)
    # Objects' locks are striped (one of _STRIPES by name): two names share one 1 time in 256,
    # and then they do wait on each other. The other object is one of another stripe.
    while hash((BUCKET, other.name)) % _STRIPES == hash((BUCKET, slow.name)) % _STRIPES:
        other = fresh(gcs)
    forward = LocalGcs._forward

    def stalling(self, request, target, body, act):
        if act is not None and act.name == slow.name and act.mutates:
            held.set()
            assert release.wait(30)
        return forward(self, request, target, body, act)

    monkeypatch.setattr(LocalGcs, "_forward", stalling)
    first: list[requests.Response] = []
    writer = threading.Thread(target=lambda: first.append(
        media(gcs, slow.name, b"first", ifGenerationMatch=slow.generation)))
    writer.start()
    try:
        assert held.wait(10)
        # another object: written at once while the stalled write holds its own object
        assert media(gcs, other.name, b"v2", ifGenerationMatch=other.generation).status_code == 200
        # the same object, the same generation: waits its turn, then loses the compare-and-swap
        second: list[requests.Response] = []
        racer = threading.Thread(target=lambda: second.append(
            media(gcs, slow.name, b"second", ifGenerationMatch=slow.generation)))
        racer.start()
        racer.join(0.5)
        assert racer.is_alive()
    finally:
        release.set()
        writer.join(30)
    racer.join(30)
    assert first[0].status_code == 200 and second[0].status_code == 412
    assert requests.get(f"{gcs.url}/storage/v1/b/{BUCKET}/o/{slow.name}", params={"alt": "media"},
                        timeout=10).content == b"first"


def test_a_start_that_fails_leaves_no_server_behind():
    before, running = os.environ.get("STORAGE_EMULATOR_HOST"), set(_fake_gcs_children())
    broken = LocalGcs(buckets=("x",))  # too short for a bucket name: creation fails
    with pytest.raises(gexc.BadRequest):
        broken.start()
    assert set(_fake_gcs_children()) <= running
    assert os.environ.get("STORAGE_EMULATOR_HOST") == before


def _fake_gcs_children() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "stat").read_text().split(") ")[1].split()[1] == str(os.getpid()) \
                    and b"fake-gcs-server" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found


# -- realism: as slow and as strict as Google, when asked ---------------------------------
ZONE = "us-central1-a"
DONE = compute_v1.Operation.Status.DONE
RUNNING = compute_v1.Operation.Status.RUNNING


def clients(srv: ComputeServer) -> tuple[compute_v1.InstancesClient, compute_v1.ZoneOperationsClient]:
    options = {"transport": "rest", "credentials": AnonymousCredentials(),
               "client_options": ClientOptions(api_endpoint=srv.endpoint)}
    return compute_v1.InstancesClient(**options), compute_v1.ZoneOperationsClient(**options)


def spot(name: str = "") -> dict[str, Any]:
    return {**({"name": name} if name else {}), "machineType": "e2-small",
            "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
            "networkInterfaces": [{"network": "global/networks/default"}],
            "scheduling": {"provisioningModel": "SPOT", "automaticRestart": False, "onHostMaintenance": "TERMINATE"}}


def bulk(instances: compute_v1.InstancesClient, names: list[str], project: str = PROJECT) -> Any:
    resource = compute_v1.BulkInsertInstanceResource.from_json(json.dumps(
        {"count": len(names), "perInstanceProperties": {n: {} for n in names}, "instanceProperties": spot()}))
    return instances.bulk_insert(project=project, zone=ZONE, bulk_insert_instance_resource_resource=resource)


def insert(instances: compute_v1.InstancesClient, name: str) -> Any:
    body = spot(name)
    body["machineType"] = f"zones/{ZONE}/machineTypes/e2-small"
    return instances.insert(project=PROJECT, zone=ZONE, instance_resource=compute_v1.Instance.from_json(json.dumps(body)))


def timed(fn: Any, *args: Any) -> float:
    started = time.monotonic()
    fn(*args)
    return time.monotonic() - started


def side_by_side(*calls: Any) -> float:
    """Seconds for all ``calls`` (no-argument callables) run at once, each on its own thread."""
    failures: list[BaseException] = []

    def run(call: Any) -> None:
        try:
            call()
        except BaseException as e:  # noqa: BLE001 - re-raised below, in the test's thread
            failures.append(e)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    took = time.monotonic() - started
    if failures:
        raise failures[0]
    return took


def test_realism_is_off_by_default_and_google_like_when_asked():
    off = Realism()
    assert (off.gcs_latency, off.compute_latency, off.compute_method_latency) == (0.0, 0.0, {})
    assert off.insert_seconds is off.delete_seconds is off.gcs_write_interval is None
    assert off.bulk_requests_per_second is off.bulk_operations_in_flight is None
    google = Realism.google()
    assert (google.gcs_latency, google.compute_latency) == (0.030, 0.100)
    # A page of an aggregated list (500 instances): localcloud.realism.COSTS, the bench's fakes' figures too.
    assert google.compute_delay("instances.aggregatedList") == 0.4 and google.compute_delay("instances.get") == 0.100
    assert (google.insert_seconds, google.delete_seconds) == (20.0, 30.0)
    assert (google.bulk_requests_per_second, google.bulk_operations_in_flight, google.gcs_write_interval) == (20, 10, 1.0)
    smoke = google.scaled(0.01)
    assert smoke.compute_delay("instances.aggregatedList") == pytest.approx(0.004) and smoke.insert_seconds == 0.2
    assert smoke.bulk_requests_per_second == 20 and smoke.gcs_write_interval == 1.0  # limits are not times
    assert LocalGcs().latency == 0.0 and LocalGcs().write_interval is None
    with ComputeServer(run_vms=False) as plain:
        assert plain.realism == off
        assert (plain.faults.insert_seconds, plain.faults.delete_seconds) == (QUICK, QUICK)
        instances, _ = clients(plain)
        assert timed(lambda: [list(instances.list(project=PROJECT, zone=ZONE)) for _ in range(5)]) < 2.0


def test_options_carry_one_realism_to_both_servers(monkeypatch):
    realism = Realism(gcs_latency=0.01, compute_latency=0.02, insert_seconds=3.0, gcs_write_interval=1.0)
    seen: dict[str, Any] = {}

    class Recorded:
        def __init__(self, **kwargs: Any) -> None:
            seen.update(kwargs)

        def start(self) -> None:
            raise RuntimeError("recorded")

    monkeypatch.setattr(stack, "ComputeServer", Recorded)
    cloud = stack.LocalCloud(stack.Options(realism=realism))
    assert cloud.gcs.latency == 0.01 and cloud.gcs.write_interval == 1.0
    with pytest.raises(RuntimeError, match="recorded"):
        cloud.start()  # GCS starts, Compute is built with the same profile, then all is stopped
    assert seen["realism"] is realism
    assert stack.LocalCloud(stack.Options(realism=realism, gcs_write_interval=2.0)).gcs.write_interval == 2.0


def test_gcs_latency_is_per_request_and_concurrent_requests_overlap(gcs):
    blob = fresh(gcs, b"slow")
    readers = [client(gcs.url).bucket(BUCKET).blob(blob.name) for _ in range(2)]
    gcs.latency = 0.4
    try:
        assert timed(readers[0].download_as_bytes) >= 0.4
        # two at once take about one latency, not two: a sleep in each request's thread, no lock
        assert side_by_side(readers[0].download_as_bytes, readers[1].download_as_bytes) < 0.8
    finally:
        gcs.latency = 0.0


def test_compute_latency_is_per_call_with_per_method_overrides_and_calls_overlap():
    realism = Realism(compute_latency=0.3, compute_method_latency={"instances.aggregatedList": 0.8})
    with ComputeServer(run_vms=False, realism=realism) as srv:
        instances, _ = clients(srv)
        listing = lambda: list(instances.list(project=PROJECT, zone=ZONE))  # noqa: E731
        assert timed(listing) >= 0.3
        assert timed(lambda: instances.aggregated_list(project=PROJECT)) >= 0.8
        assert side_by_side(listing, listing) < 0.6


def test_a_waiting_client_blocks_no_other_request():
    with ComputeServer(run_vms=False) as srv:
        instances, operations = clients(srv)
        srv.hold_operations()
        op = insert(instances, "waited")
        answer: list[Any] = []
        waiter = threading.Thread(target=lambda: answer.append(operations.wait(project=PROJECT, zone=ZONE,
                                                                               operation=op.name)))
        waiter.start()
        time.sleep(0.2)
        assert timed(lambda: instances.get(project=PROJECT, zone=ZONE, instance="waited")) < 2.0
        assert waiter.is_alive() and not answer  # Google's wait: until DONE, or its own timeout (2 minutes)
        srv.hold_operations(False)
        waiter.join(timeout=10)
        assert answer and answer[0].status == DONE


def test_insert_and_bulk_insert_operations_run_for_insert_seconds():
    with ComputeServer(run_vms=False, realism=Realism(insert_seconds=1.0)) as srv:
        instances, operations = clients(srv)
        started = time.monotonic()
        single, many = insert(instances, "one"), bulk(instances, ["two", "three"])
        for op in (single, many):
            assert operations.get(project=PROJECT, zone=ZONE, operation=op.name).status == RUNNING
        assert srv.instance("one")["status"] == "PROVISIONING"
        for op in (single, many):
            assert operations.wait(project=PROJECT, zone=ZONE, operation=op.name).status == DONE
        assert time.monotonic() - started >= 1.0
        assert not any(o.get("error") for o in srv.operations())


def test_a_delete_lasts_delete_seconds_with_the_guests_shutdown_inside_them():
    with ComputeServer(boot_delay=0.05, shutdown_budget=5.0, realism=Realism(delete_seconds=2.0)) as srv:
        instances, _ = clients(srv)
        boot(srv, "brief", None, shutdown="sleep 1")  # its shutdown fits in the delete's 2 s
        boot(srv, "long", None, shutdown="sleep 3")  # its shutdown outlasts them
        for name in ("brief", "long"):
            until(f"{name} RUNNING", lambda name=name: status(srv, name) == "RUNNING")
        started = time.monotonic()
        ops = {name: instances.delete(project=PROJECT, zone=ZONE, instance=name).name for name in ("brief", "long")}
        took: dict[str, float] = {}
        while len(took) < 2 and time.monotonic() - started < 15:
            done = {o["name"] for o in srv.operations() if o["status"] == "DONE"}
            took.update({n: time.monotonic() - started for n, o in ops.items() if o in done and n not in took})
            time.sleep(0.05)
        assert 2.0 <= took["brief"] < 3.4  # not 2 s and then the shutdown: the shutdown is part of them
        assert took["long"] >= 3.0
        assert srv.instances() == []


def test_bulk_inserts_beyond_the_rate_are_refused_as_google_does():
    # A low rate, so that even a loaded machine makes its calls well inside one second.
    with ComputeServer(run_vms=False, realism=Realism(bulk_requests_per_second=3)) as srv:
        instances, _ = clients(srv)
        for i in range(3):
            bulk(instances, [f"r{i}"])
        with pytest.raises(gexc.Forbidden) as refused:  # Google: 403 rateLimitExceeded (see gce.rate_limited)
            bulk(instances, ["r3"])
        error = refused.value.errors[0]
        assert (error["reason"], error["domain"]) == ("rateLimitExceeded", "usageLimits")
        bulk(instances, ["other-r0"], project="another-project")  # per project
        insert(instances, "plain")  # instances.insert is not counted
        time.sleep(1.0)
        bulk(instances, ["r3"])


def test_bulk_operations_beyond_the_in_flight_limit_are_refused_as_google_does():
    with ComputeServer(run_vms=False, realism=Realism(bulk_operations_in_flight=10)) as srv:
        instances, operations = clients(srv)
        srv.hold_operations()  # every bulk operation stays RUNNING
        ops = [bulk(instances, [f"f{i}"]) for i in range(10)]
        with pytest.raises(gexc.Forbidden) as refused:
            bulk(instances, ["f10"])
        assert refused.value.errors[0]["reason"] == "rateLimitExceeded"
        assert refused.value.reason == "CONCURRENT_OPERATIONS_QUOTA_EXCEEDED"  # google.rpc.ErrorInfo
        assert "concurrent operations" in refused.value.message and "us-central1" in refused.value.message
        with pytest.raises(gexc.NotFound):  # refused: nothing was made
            instances.get(project=PROJECT, zone=ZONE, instance="f10")
        bulk(instances, ["other-f0"], project="another-project")  # per project
        srv.hold_operations(False)
        for op in ops:
            assert operations.wait(project=PROJECT, zone=ZONE, operation=op.name).status == DONE
        bulk(instances, ["f10"])


def test_a_server_keeps_answering_past_1024_open_descriptors():
    """A local cloud of a few hundred VMs holds thousands of descriptors: the servers' loop
    must not be select(), which refuses any descriptor numbered past 1024."""
    from localcloud.http import Served

    pipes = [os.pipe() for _ in range(600)]
    try:
        served = Served(lambda environ, start: (start("200 OK", [("Content-Length", "2")]), [b"ok"])[1], "fd-test")
        try:
            with requests.Session() as session:  # kept alive: one connection, two requests
                assert [session.get(served.url, timeout=5).text for _ in range(2)] == ["ok", "ok"]
        finally:
            served.stop()
    finally:
        for r, w in pipes:
            os.close(r)
            os.close(w)


# -- capacity advice: what Google would advise, from the server's own schedule -------------
def advice_client(srv: ComputeServer) -> compute_v1.AdviceClient:
    return compute_v1.AdviceClient(transport="rest", credentials=AnonymousCredentials(),
                                   client_options=ClientOptions(api_endpoint=srv.endpoint))


def capacity_request(zones: list[str], shape: str = "ANY_SINGLE_ZONE", model: str = "SPOT",
                     size: int = 2) -> compute_v1.CapacityAdviceRpcRequest:
    return compute_v1.CapacityAdviceRpcRequest(project=PROJECT, region="us-central1", capacity_advice_request_resource={
        "size": size,
        "instance_properties": {"scheduling": {"provisioning_model": model}},
        "instance_flexibility_policy": {"instance_selections": {"g2": {"machine_types": ["g2-standard-8"], "rank": 1}}},
        "distribution_policy": {"target_shape": shape, "zones": [{"zone": f"zones/{z}"} for z in zones]}})


def test_capacity_advice_ranks_zones_by_what_an_insert_would_meet_then_by_spot_uptime():
    with ComputeServer(run_vms=False) as srv:
        srv.stockout("us-central1-a")
        srv.preemption_rate("us-central1-b", 0.5)  # half its Spot VMs gone in a day
        srv.preemption_rate("us-central1-c", 0.05)
        answer = advice_client(srv).capacity(capacity_request(["us-central1-a", "us-central1-b", "us-central1-c"]))
        ranked = [(r.shards[0].zone, r.scores.obtainability, r.scores.estimated_uptime) for r in answer.recommendations]
        assert [zone for zone, _, _ in ranked] == ["us-central1-c", "us-central1-b", "us-central1-a"]
        assert ranked[-1][1] == 0.0 and ranked[0][1] > 0  # the stocked-out zone cannot be had now
        assert ranked[1][2] == "86400s"  # half gone in a day
        shard = answer.recommendations[0].shards[0]
        assert (shard.machine_type, shard.instance_count, shard.provisioning_model) == ("g2-standard-8", 2, "SPOT")

        standard = advice_client(srv).capacity(capacity_request(["us-central1-b"], model="STANDARD"))
        assert "estimated_uptime" not in standard.recommendations[0].scores  # uptime is a Spot estimate

        spread = advice_client(srv).capacity(capacity_request(["us-central1-a", "us-central1-b", "us-central1-c"],
                                                              shape="BALANCED", size=5))
        assert [(s.zone, s.instance_count) for s in spread.recommendations[0].shards] == \
            [("us-central1-b", 3), ("us-central1-c", 2)]
        assert spread.recommendations[0].scores.estimated_uptime == "86400s"  # as good as its worst zone
        ranked = advice_client(srv).capacity(capacity_request(
            ["us-central1-c", "https://compute.googleapis.com/compute/v1/projects/p/zones/us-central1-c"]))
        assert len(ranked.recommendations) == 1, "a zone named twice is one zone"


def test_capacity_advice_refuses_what_google_refuses():
    with ComputeServer(run_vms=False) as srv:
        client = advice_client(srv)
        with pytest.raises(gexc.BadRequest, match="Zone must be in region"):
            client.capacity(capacity_request(["europe-west4-a"]))
        with pytest.raises(gexc.BadRequest, match="resource.size"):
            client.capacity(capacity_request(["us-central1-a"], size=0))
        raw = lambda body, region="us-central1": requests.post(  # noqa: E731
            f"{srv.endpoint}/compute/v1/projects/{PROJECT}/regions/{region}/advice/capacity", json=body, timeout=10)
        assert raw({"size": 1, "zones": []}).status_code == 400  # a field the schema does not have
        assert "Unknown name" in raw({"size": 1, "zones": []}).json()["error"]["message"]
        selection = {"instanceFlexibilityPolicy": {"instanceSelections": {"a": {"machineTypes": ["g2-standard-8"]}}}}
        assert raw({"size": 3_000_000_000, **selection}).status_code == 400  # past int32: refused, not echoed
        assert raw({"size": "2", **selection}).status_code == 200  # int32 as a decimal string, as JSON allows
        assert raw({"size": 1, **selection, "distributionPolicy": {"targetShape": "BALANCED"}},
                   region="asia-east1").status_code == 400  # a region this cloud does not have
        assert requests.post(f"{srv.endpoint}/_local/preemption_rate", json={"zone": "us-central1-a", "rate": 2},
                             timeout=10).status_code == 400


def test_capacity_history_tells_a_zones_preemption_rate_and_spot_price():
    with ComputeServer(run_vms=False) as srv:
        srv.preemption_rate("us-central1-b", 0.2)
        srv.spot_price("g2-standard-8", 0.2512)
        answer = advice_client(srv).capacity_history(compute_v1.CapacityHistoryAdviceRequest(
            project=PROJECT, region="us-central1", capacity_history_request_resource={
                "instance_properties": {"machine_type": "g2-standard-8",
                                        "scheduling": {"provisioning_model": "SPOT"}},
                "location_policy": {"location": "zones/us-central1-b"}, "types": ["PREEMPTION", "PRICE"]}))
        assert answer.location == "us-central1-b" and answer.machine_type == "g2-standard-8"
        assert len(answer.preemption_history) == 7 and {r.preemption_rate for r in answer.preemption_history} == {0.2}
        price = answer.price_history[-1].list_price
        assert (price.currency_code, price.units, price.nanos) == ("USD", 0, 251_200_000)
        days = [r.interval for r in answer.preemption_history]
        assert all(a.end_time == b.start_time for a, b in zip(days, days[1:]))


# -- provisioning models ------------------------------------------------------------------
def _gateway(srv: ComputeServer):
    from controller.adapters.google import compute_gateway
    from controller.service.config import Settings

    return compute_gateway(Settings(bucket=BUCKET, project=PROJECT, compute_endpoint=srv.endpoint))


def _request(name: str, provisioning: str, zone: str = "us-central1-a", max_run: int | None = None):
    from controller.core.ports import InstanceRequest

    return InstanceRequest(project=PROJECT, zone=zone, name=name, machine_type="e2-small", provisioning=provisioning,
                           termination_action="stop", boot_image="projects/debian-cloud/global/images/family/debian-12",
                           boot_disk_gb=10, boot_disk_type="pd-balanced", service_account=TRAINER_ACCOUNT,
                           scopes=(CLOUD_PLATFORM,), network="global/networks/default", subnetwork=None,
                           external_ip=False, labels={}, metadata={}, max_run_seconds=max_run)


def test_a_spot_only_stockout_refuses_spot_vms_and_lets_standard_ones_in():
    from controller.core import errors

    with ComputeServer(run_vms=False, boot_delay=0.01) as srv:
        srv.stockout("us-central1-a", spot_only=True)
        gateway = _gateway(srv)
        with pytest.raises(errors.CapacityError):
            gateway.insert([_request("spot-1", "spot")], "00000000-0000-4000-8000-000000000001")
        gateway.insert([_request("std-1", "standard")], "00000000-0000-4000-8000-000000000002")
        assert srv.instance("std-1")["scheduling"]["provisioningModel"] == "STANDARD"


def test_flex_start_waits_in_pending_for_capacity_then_runs_until_its_max_run_duration():
    with ComputeServer(run_vms=False, boot_delay=0.01) as srv:
        srv.stockout("us-central1-a")
        _gateway(srv).insert([_request("flex-1", "flex-start", max_run=2)], "00000000-0000-4000-8000-000000000003")
        scheduling = srv.instance("flex-1")["scheduling"]
        assert (scheduling["provisioningModel"], scheduling["instanceTerminationAction"],
                int(scheduling["maxRunDuration"]["seconds"])) == ("FLEX_START", "DELETE", 2)
        time.sleep(0.3)
        assert status(srv, "flex-1") == "PENDING", "a Flex-start VM waits for capacity; it is not refused"
        srv.stockout("us-central1-a", on=False)
        until("RUNNING once capacity frees up", lambda: status(srv, "flex-1") == "RUNNING", timeout=5)
        until("deleted at its maxRunDuration", lambda: "flex-1" not in srv.names(), timeout=10)


@pytest.mark.parametrize("scheduling, field", [
    ({"provisioningModel": "FLEX_START", "instanceTerminationAction": "DELETE"}, "maxRunDuration"),
    ({"provisioningModel": "FLEX_START", "maxRunDuration": {"seconds": "60"}}, "instanceTerminationAction"),
])
def test_flex_start_needs_a_run_limit_and_deletion(scheduling, field):
    with ComputeServer(run_vms=False) as srv:
        body = {"name": "flex-2", "machineType": "zones/us-central1-a/machineTypes/e2-small",
                "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
                "networkInterfaces": [{"network": "global/networks/default"}], "scheduling": scheduling}
        r = requests.post(f"{srv.endpoint}/compute/v1/projects/{PROJECT}/zones/us-central1-a/instances", json=body,
                          timeout=10)
        assert r.status_code == 400 and field in r.text


def test_with_a_preemption_day_spot_vms_are_preempted_as_their_zone_rate_says():
    with ComputeServer(run_vms=False, boot_delay=0.01, shutdown_budget=0.2, preemption_day=4.0) as srv:
        srv.preemption_rate("us-central1-a", 0.9)  # half preempted in 0.3 days: ~1.2 s here
        gateway = _gateway(srv)
        gateway.insert([_request("doomed", "spot")], "00000000-0000-4000-8000-000000000004")
        gateway.insert([_request("steady", "spot", zone="us-central1-b")], "00000000-0000-4000-8000-000000000005")
        gateway.insert([_request("paid", "standard")], "00000000-0000-4000-8000-000000000006")
        until("the Spot VM in the risky zone preempted", lambda: status(srv, "doomed") == "TERMINATED", timeout=10)
        assert any(o["operationType"] == "compute.instances.preempted" and o["targetLink"].endswith("/doomed")
                   for o in srv.operations())
        assert status(srv, "steady") == "RUNNING" and status(srv, "paid") == "RUNNING"


def test_a_long_poll_reads_the_tree_without_holding_what_changed_needs():
    """A server holding its own lock calls changed(); a long poll reading the tree needs that
    lock. The poll must not hold the condition changed() takes meanwhile (it did: a preemption
    could hang the local Compute server)."""
    from localcloud.metadata import MetadataServer

    owner, calls, value = threading.Lock(), [0], {"x": "a"}

    def snapshot() -> dict[str, Any]:
        calls[0] += 1
        if calls[0] >= 2:  # the first read is free; the poll's next read needs the owner's lock
            with owner:
                return {"instance": {"attributes": dict(value)}}
        return {"instance": {"attributes": dict(value)}}

    server = MetadataServer(snapshot)
    try:
        with owner:  # as ComputeServer.preempt holds its lock while it wakes the VM's polls
            poll = threading.Thread(target=server._wait, args=("instance/attributes/x", None, 5.0), daemon=True)
            poll.start()
            until("the poll reading the tree again", lambda: calls[0] >= 2, timeout=5)
            value["x"] = "b"
            woke = threading.Event()
            threading.Thread(target=lambda: (server.changed(), woke.set()), daemon=True).start()
            assert woke.wait(2), "changed() waited for a poll that waits for the owner's lock"
        poll.join(5)
        assert not poll.is_alive()
    finally:
        server.stop()


# -- capacity advice that keeps failing ------------------------------------------------------
@pytest.mark.parametrize("method", ["advice.capacity", "advice.capacityHistory"])
def test_capacity_advice_that_keeps_failing_gives_up_quickly(method):
    # Every job of a shape waits on one advice answer (AdviceCache): a 5xx-ing API must cost
    # seconds, not the gateway's 60 s retry per call (and 60 s more per zone of history).
    from controller.core import errors
    from controller.adapters.google import capacity_advisor
    from controller.service.config import Settings
    from controller.core.ports import Shape

    zones = ("us-central1-a", "us-central1-b", "us-central1-c")
    with ComputeServer(run_vms=False) as srv:
        srv.fail_next(method, 503, times=10_000)
        advisor = capacity_advisor(Settings(bucket=BUCKET, project=PROJECT, compute_endpoint=srv.endpoint))
        shape = Shape(project=PROJECT, region="us-central1", zones=zones, machine_type="g2-standard-8", count=1,
                      model="SPOT")
        started = time.monotonic()
        if method == "advice.capacity":
            with pytest.raises(errors.TransientError):
                advisor.advise(shape)
        else:
            advice = advisor.advise(shape)  # the ranking stands without the preemption rates
            assert set(advice) == set(zones) and all(a.preemption_rate is None for a in advice.values())
        assert time.monotonic() - started < 20


def test_capacity_advice_for_a_machine_type_with_attached_gpus_is_a_request_google_accepts():
    from controller.adapters.google import capacity_advisor
    from controller.service.config import Settings
    from controller.core.ports import Shape

    with ComputeServer(run_vms=False) as srv:
        advisor = capacity_advisor(Settings(bucket=BUCKET, project=PROJECT, compute_endpoint=srv.endpoint))
        shape = Shape(project=PROJECT, region="us-central1", zones=("us-central1-a", "us-central1-b"),
                      machine_type="n1-standard-8", count=1, model="SPOT", accelerator_type="nvidia-tesla-v100",
                      accelerator_count=4)
        advice = advisor.advise(shape)  # the request and the history's are checked against the discovery document
        assert set(advice) == {"us-central1-a", "us-central1-b"}
        assert all(a.preemption_rate is not None for a in advice.values())


def test_compute_rate_quotas_are_per_group_and_synchronized_minute_as_google_documents():
    """https://cloud.google.com/compute/api-quota: per project and group, per synchronized
    minute; past it, 403 rateLimitExceeded until the next minute. Lists and reads are counted
    apart."""
    if 60 - time.monotonic() % 60 < 15:  # the local server's minutes are monotonic minutes
        time.sleep(60 - time.monotonic() % 60 + 0.1)
    with ComputeServer(run_vms=False, realism=Realism(rate_quota_per_minute=3)) as srv:
        instances, _ = clients(srv)
        for _ in range(3):
            list(instances.list(project=PROJECT, zone=ZONE))
        with pytest.raises(gexc.Forbidden) as refused:
            list(instances.list(project=PROJECT, zone=ZONE))
        error = refused.value.errors[0]
        assert (error["reason"], error["domain"]) == ("rateLimitExceeded", "usageLimits")
        with pytest.raises(gexc.NotFound):  # a get is in another group: answered (404), not refused
            instances.get(project=PROJECT, zone=ZONE, instance="nothing")
        list(instances.list(project="another-project", zone=ZONE))  # per project


def test_an_aggregated_list_pages_by_instances_as_google_does():
    """500 items a page at most, however they fall into zones (a page may split a zone)."""
    with ComputeServer(run_vms=False) as srv:
        instances, _ = clients(srv)
        for i in range(3):
            bulk(instances, [f"a{i}-{n}" for n in range(400)])
        pages = list(instances.aggregated_list(request={"project": PROJECT, "max_results": 500}).pages)
        counts = [sum(len(scoped.instances) for _, scoped in page.items.items()) for page in pages]
        # (an empty zone's warning takes a place on a page here, so a page may hold a few less)
        assert sum(counts) == 1200 and max(counts) == 500 and len(pages) == 3
