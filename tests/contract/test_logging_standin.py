"""The Cloud Logging stand-in (``localcloud.logging``) against Google's ``logging.v2`` discovery
document and the real google-cloud-logging client; and what it makes of a VM's serial output.

Routes come from the document (what it claims answers, every other method 501, anything else
404); a body with a field the schema lacks is refused 400 in Google's one-platform shape; the
real client writes and lists through it, with respawn's own query (``controller.cli.joblogs``); a
query it cannot evaluate exactly is refused 400, never answered wrong.
"""

from __future__ import annotations

import re

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import requests
from google.api_core import exceptions as gexc
from google.cloud import logging as cloud_logging

from controller.adapters.google import logging_client
from controller.service.config import Settings
from controller.cli.joblogs import SCRIPTS, SERIAL, logs_filter
from tests.routes import assert_serves_exactly
from localcloud.logging import DOC, SUPPORTED, LoggingServer
from localcloud.vmlogs import VmLogs
from localcloud.tpu_api import hostname

PROJECT = "logs-proj"


@pytest.fixture(scope="module")
def server() -> Iterator[LoggingServer]:
    with LoggingServer() as srv:
        yield srv


@pytest.fixture
def client(server: LoggingServer) -> cloud_logging.Client:
    """The client `respawn logs` reads with (``logging_client``: google-cloud-logging's, over REST).
    Each test starts with the project's read quota unspent (the server is the module's)."""
    server.reads.clear()
    return logging_client(Settings(project=PROJECT, logging_endpoint=server.endpoint))


def post(server: LoggingServer, method: str, body: Any) -> requests.Response:
    return requests.post(f"{server.endpoint}/v2/entries:{method}", json=body, timeout=5)


def entry(instance: str, text: str | None, *, project: str = PROJECT, log: str = SERIAL, **extra: Any) -> dict[str, Any]:
    return {"logName": f"projects/{project}/logs/{log}", **({"textPayload": text} if text is not None else {}),
            "resource": {"type": "gce_instance", "labels": {"instance_id": instance, "zone": "us-central1-a",
                                                            "project_id": project}}, **extra}


def listed(server: LoggingServer, query: str, **body: Any) -> list[str]:
    answer = post(server, "list", {"resourceNames": [f"projects/{PROJECT}"], "filter": query, "pageSize": 1000, **body})
    assert answer.status_code == 200, answer.text
    return [e.get("textPayload", "") for e in answer.json().get("entries", [])]


def test_routes_come_from_the_discovery_document(server):
    assert_serves_exactly(server.endpoint, DOC, SUPPORTED)
    assert requests.post(f"{server.endpoint}/v2/entries:nothing", json={}, timeout=5).status_code == 404


def test_bodies_are_checked_against_the_schema_in_googles_error_shape(server):
    unknown = post(server, "list", {"resourceNames": [f"projects/{PROJECT}"], "bogus": 1})
    assert unknown.status_code == 400
    assert unknown.json() == {"error": {"code": 400, "status": "INVALID_ARGUMENT",
                                        "message": 'Invalid JSON payload received. Unknown name "bogus": '
                                                   "Cannot find field."}}
    nested = post(server, "write", {"entries": [{**entry("1", "x"), "textPaylod": "typo"}]})
    assert nested.status_code == 400 and "Unknown name \"textPaylod\" at 'entries[0]'" in nested.json()["error"]["message"]
    wrong = post(server, "list", {"resourceNames": [f"projects/{PROJECT}"], "pageSize": "many"})
    assert wrong.status_code == 400 and "page_size" in wrong.json()["error"]["message"]
    severity = post(server, "write", {"entries": [entry("1", "x", severity="LOUD")]})
    assert severity.status_code == 400 and "expected one of" in severity.json()["error"]["message"]
    # proto3's JSON parser takes a field's original name too: the Python client sends dry_run.
    assert post(server, "write", {"entries": [entry("1", "dry")], "dry_run": True}).status_code == 200
    assert "dry" not in listed(server, 'resource.labels.instance_id="1"')


def test_writes_are_checked_as_google_checks_them(server):
    no_name = post(server, "write", {"entries": [{"textPayload": "x", "resource": {"type": "global"}}]})
    assert no_name.status_code == 400 and "log name" in no_name.json()["error"]["message"]
    bad_name = post(server, "write", {"entries": [entry("2", "x", logName="logs/nope")]})
    assert bad_name.status_code == 400
    no_resource = post(server, "write", {"entries": [{"logName": f"projects/{PROJECT}/logs/a", "textPayload": "x"}]})
    assert no_resource.status_code == 400 and "monitored resource" in no_resource.json()["error"]["message"]
    two = post(server, "write", {"entries": [entry("2", "x", jsonPayload={"a": 1})]})
    assert two.status_code == 400
    # partialSuccess: the valid entries are written, the answer still names the others
    partial = post(server, "write", {"partialSuccess": True, "entries": [entry("2", "kept"), {"textPayload": "x"}]})
    assert partial.status_code == 400
    assert partial.json()["error"]["details"][0]["logEntryErrors"].keys() == {"1"}
    assert post(server, "write", {"entries": [entry("2", "dropped"), {"textPayload": "x"}]}).status_code == 400
    assert listed(server, 'resource.labels.instance_id="2"') == ["kept"]
    # the request's logName, resource and labels are each entry's defaults
    shared = {"logName": f"projects/{PROJECT}/logs/shared", "resource": {"type": "gce_instance",
              "labels": {"instance_id": "3"}}, "labels": {"a": "1", "b": "1"}}
    assert post(server, "write", {**shared, "entries": [{"textPayload": "s", "labels": {"b": "2"}}]}).status_code == 200
    got = post(server, "list", {"resourceNames": [f"projects/{PROJECT}"], "filter": 'resource.labels.instance_id="3"'})
    stored = got.json()["entries"][0]
    assert stored["labels"] == {"a": "1", "b": "2"} and stored["logName"].endswith("/logs/shared")
    assert stored["insertId"] and stored["receiveTimestamp"].endswith("Z") and stored["timestamp"]


def test_the_real_client_lists_entries_with_respawns_own_query(server, client):
    since = datetime.now(UTC) - timedelta(minutes=1)
    server.write([entry("100", f"line {i}") for i in range(5)]
                 + [entry("101", "scripts line", log=SCRIPTS), entry("102", "another VM"),
                    entry("100", "another project", project="elsewhere")])
    query = logs_filter(["100", "101"], [PROJECT], [SERIAL], since)
    found = list(client.list_entries(filter_=query, order_by=cloud_logging.ASCENDING, page_size=2))
    assert [e.payload for e in found] == [f"line {i}" for i in range(5)]  # three pages of two
    assert {e.resource.labels["instance_id"] for e in found} == {"100"} and found[0].log_name.endswith(SERIAL)
    assert found == sorted(found, key=lambda e: e.timestamp)
    last = list(client.list_entries(filter_=query, order_by=cloud_logging.DESCENDING, max_results=2))
    assert [e.payload for e in last] == ["line 4", "line 3"]
    both = logs_filter(["100", "101"], [PROJECT], [SERIAL, SCRIPTS], since)
    assert "scripts line" in [e.payload for e in client.list_entries(filter_=both)]
    # the client writes through it too (its Logger, over REST)
    logger = client.logger("respawn-test", resource=cloud_logging.Resource(type="gce_instance",
                                                                           labels={"instance_id": "103"}))
    logger.log_text("from the client", severity="WARNING")
    assert [e.payload for e in client.list_entries(filter_='resource.labels.instance_id="103" AND severity>=WARNING')] \
        == ["from the client"]
    # ...and 400 for what it cannot evaluate
    with pytest.raises(gexc.BadRequest, match="not supported"):
        list(client.list_entries(filter_='textPayload=~"line.*"'))


def test_a_timestamp_written_with_an_offset_is_answered_in_utc_as_google_does(server, client):
    """Google keeps a protobuf Timestamp and answers it as RFC 3339 UTC ("Z"), whatever offset it was
    written with; google-cloud-logging's reader fails on "+00:00" (found by respawn canary)."""
    # Within the last day: google-cloud-logging's list_entries adds "timestamp >= 24 hours ago" to a
    # filter that names no timestamp (a fixed date here made this test fail a day after it was written).
    at = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    plus2 = timezone(timedelta(hours=2))
    server.write([entry("104", "offset", timestamp=(at + timedelta(milliseconds=250)).astimezone(plus2).isoformat()),
                  entry("104", "utc offset", timestamp=(at + timedelta(seconds=1)).isoformat())])
    answer = post(server, "list", {"resourceNames": [f"projects/{PROJECT}"], "filter": 'resource.labels.instance_id="104"'})
    assert [e["timestamp"] for e in answer.json()["entries"]] == [f"{at:%Y-%m-%dT%H:%M:%S}.250Z",
                                                                  f"{at + timedelta(seconds=1):%Y-%m-%dT%H:%M:%S}Z"]
    found = list(client.list_entries(filter_='resource.labels.instance_id="104"'))
    assert [e.timestamp for e in found] == [at + timedelta(milliseconds=250), at + timedelta(seconds=1)]


def test_the_filter_subset_is_evaluated_as_the_logging_docs_say(server):
    t0 = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)  # after every other test's entries
    stamp = lambda s: (t0 + timedelta(seconds=s)).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    server.write([entry("200", "alpha", timestamp=stamp(0), severity="INFO", labels={"compute.googleapis.com/x": "vm-a"}),
                  entry("200", "Beta", timestamp=stamp(1), severity="ERROR"),
                  entry("201", "gamma", timestamp=stamp(2))])
    mine = 'resource.labels.instance_id=("200" OR "201")'
    cases = {
        mine: ["alpha", "Beta", "gamma"],
        f'{mine} AND textPayload="beta"': ["Beta"],  # string comparisons are not case sensitive
        f'{mine} AND textPayload:"amm"': ["gamma"],  # has: a substring
        f'{mine} AND severity>=ERROR': ["Beta"],
        f'{mine} AND severity=INFO': ["alpha"],
        f'{mine} AND timestamp>="{stamp(1)}" AND timestamp<"{stamp(2)}"': ["Beta"],
        f'{mine} AND NOT textPayload="alpha"': ["Beta", "gamma"],
        f'{mine} -textPayload="alpha"': ["Beta", "gamma"],  # a space is AND; - is NOT
        f'{mine} AND labels."compute.googleapis.com/x"="vm-a"': ["alpha"],
        f'{mine} AND labels:*': ["alpha"],
        # OR binds tighter than AND: (instance 201 OR alpha) AND instance 200 -> alpha only
        f'resource.labels.instance_id="201" OR textPayload="alpha" AND resource.labels.instance_id="200"': ["alpha"],
        f'{mine} AND (textPayload="alpha" OR textPayload="gamma")': ["alpha", "gamma"],
    }
    for query, expected in cases.items():
        assert listed(server, query) == expected, query
    assert listed(server, mine, orderBy="timestamp desc") == ["gamma", "Beta", "alpha"]
    for refused in ('textPayload!="x"', 'textPayload=~"a.*"', '"alpha"', 'SEARCH("alpha")', 'log_id("x")',
                    'nosuchfield="x"', 'textPayload>"a"', 'resource.type=("a" AND "b")', 'timestamp>="yesterday"',
                    '(resource.type="x"'):
        answer = post(server, "list", {"resourceNames": [f"projects/{PROJECT}"], "filter": refused})
        assert answer.status_code == 400 and answer.json()["error"]["status"] == "INVALID_ARGUMENT", refused
    for bad in ({"resourceNames": ["organizations/1"]}, {}, {"resourceNames": [f"projects/{PROJECT}"], "orderBy": "insertId"},
                {"resourceNames": [f"projects/{PROJECT}"], "pageToken": "forged"}):
        assert post(server, "list", bad).status_code == 400, bad


def test_a_page_token_belongs_to_its_query(server):
    server.write([entry("300", f"p{i}") for i in range(3)])
    first = post(server, "list", {"resourceNames": [f"projects/{PROJECT}"], "filter": 'resource.labels.instance_id="300"',
                                  "pageSize": 2}).json()
    token = first["nextPageToken"]
    rest = post(server, "list", {"resourceNames": [f"projects/{PROJECT}"], "filter": 'resource.labels.instance_id="300"',
                                 "pageSize": 2, "pageToken": token}).json()
    assert [e["textPayload"] for e in first["entries"] + rest["entries"]] == ["p0", "p1", "p2"]
    assert "nextPageToken" not in rest
    other = post(server, "list", {"resourceNames": [f"projects/{PROJECT}"], "pageToken": token})
    assert other.status_code == 400


def test_following_never_brings_back_the_lines_limit_left_out(server, client):
    from controller.cli.joblogs import Attempt, JobLogs

    now = datetime.now(UTC)
    server.write([entry("600", f"l{i}", timestamp=(now + timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%SZ"))
                  for i in range(5)])
    printed: list[str] = []
    reader = JobLogs(client, "c", [PROJECT], printed.append, lambda text: text, limit=2)
    runs = [Attempt(1, {"c-1": "600"})]
    reader.print_all(runs, now - timedelta(minutes=1))
    reader.follow(lambda: runs, now - timedelta(minutes=1), 0.01, stop_after=0.05, sleep=lambda _: None)
    assert [plain(line) for line in printed] == ["── attempt 1: c-1 ──",
                                                 "… earlier lines of this attempt left out (--limit 2)",
                                                 "c-1 l3", "c-1 l4"]


def test_the_oldest_entries_go_past_the_cap():
    capped = LoggingServer(max_entries=3)  # not served: what it keeps
    capped.write([entry("500", f"e{i}") for i in range(5)])
    assert [e["textPayload"] for e in capped.entries()] == ["e2", "e3", "e4"]


def test_a_vms_serial_lines_are_logged_as_serial_port_logging_and_the_guest_agent_log_them(tmp_path: Path):
    folder = tmp_path / "job-1"
    folder.mkdir()
    serial = folder / "serial-port-1.log"
    resource = {"id": "4242", "name": "job-1", "zone": "https://x/compute/v1/projects/p9/zones/us-central1-b",
                "selfLink": "https://x/compute/v1/projects/p9/zones/us-central1-b/instances/job-1",
                "metadata": {"items": [{"key": "serial-port-logging-enable", "value": "TRUE"}]}}
    vms: dict[str, Any] = {"job-1": resource}

    def instance(name: str) -> dict[str, Any]:
        return vms[name]  # KeyError once deleted, as ComputeServer.instance

    compute = SimpleNamespace(workdir=tmp_path, instance=instance)
    with LoggingServer() as srv:
        feed = VmLogs(srv, compute)  # type: ignore[arg-type]
        serial.write_bytes(b"trainer: step 1\ntrainer: st")
        feed.sweep()
        serial.write_bytes(b"trainer: step 1\ntrainer: step 2\r\ngoogle_metadata_script_runner: startup-script exit "
                           b"status 0\nunfinished")
        del vms["job-1"]  # deleted: its last lines are still its own
        feed.stop()  # the last sweep takes the unfinished line too
        lines = srv.entries(SERIAL)
        assert [e["textPayload"] for e in lines] == ["trainer: step 1", "trainer: step 2",
                                                     "google_metadata_script_runner: startup-script exit status 0",
                                                     "unfinished"]
        assert lines[0]["logName"] == f"projects/p9/logs/{SERIAL}"
        assert lines[0]["resource"] == {"type": "gce_instance",
                                        "labels": {"instance_id": "4242", "zone": "us-central1-b", "project_id": "p9"}}
        assert [e["timestamp"] for e in lines] == sorted(e["timestamp"] for e in lines) and len({e["timestamp"] for e in lines}) == 4
        agent = srv.entries(SCRIPTS)
        assert [e["jsonPayload"]["message"] for e in agent] == ["startup-script: trainer: step 1",
                                                                "startup-script: trainer: step 2",
                                                                "startup-script exit status 0", "startup-script: unfinished"]
        assert agent[0]["labels"] == {"instance_name": "job-1"} and agent[0]["severity"] == "INFO"
        assert agent[0]["logName"] == f"projects/p9/logs/{SCRIPTS}" and agent[0]["resource"] == lines[0]["resource"]


def plain(line: str) -> str:
    """A printed line without its time (``MM-DD HH:MM:SS``, UTC; headers and notes have none)."""
    stamped = re.match(r"\d{2}-\d{2} \d{2}:\d{2}:\d{2} ", line)
    assert stamped or line.startswith(("──", "…")), line
    return line[stamped.end():] if stamped else line


def test_respawns_reader_prints_each_attempt_from_one_log_and_follows_new_ones(server, client):
    """``controller.cli.joblogs`` over the stand-in: an attempt whose VMs' serial ports are not logged
    is read from the guest agent's log (its script lines as the console has them); following
    prints each new entry once, a new attempt under its header, the agent's copies never."""
    from controller.core import errors
    from controller.cli.joblogs import Attempt, JobLogs

    now = datetime.now(UTC)
    at = lambda s: (now + timedelta(seconds=s)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # noqa: E731
    agent = lambda i, msg, s: entry(i, None, log=SCRIPTS, timestamp=at(s), severity="INFO",  # noqa: E731
                                    jsonPayload={"message": msg}, labels={"instance_name": "r-1"})
    server.write([agent("400", "startup-script: step 1", 1),
                  agent("400", "Finished running startup scripts.", 2),
                  entry("401", "step 2", timestamp=at(3)),
                  agent("401", "startup-script: step 2", 3)])
    printed: list[str] = []
    one, two = Attempt(1, {"r-1": "400"}, "us-central1-a", "preempted"), Attempt(2, {"r-2": "401"}, "us-central1-b", "running")
    reader = JobLogs(client, "r", [PROJECT], printed.append, lambda text: text)
    reader.print_all([one, two], now - timedelta(minutes=1))
    assert [plain(line) for line in printed] == [
        "── attempt 1: r-1 in us-central1-a (preempted) ──", "r-1 step 1", "r-1 Finished running startup scripts.",
        "── attempt 2: r-2 in us-central1-b (running) ──", "r-2 step 2"]

    printed.clear()
    three = Attempt(3, {"r-3": "402"}, "us-central1-a", "running")
    polls = iter([
        (lambda: None, [one, two]),  # nothing new
        (lambda: server.write([entry("401", "step 3", timestamp=at(4)),
                               agent("401", "startup-script: step 3", 4)]),
         [one, two]),
        (lambda: server.write([entry("402", "step 4", timestamp=at(5))]), [one, two, three]),
        (lambda: server.write([entry("401", "late", timestamp=at(3.5))]), [one, two, three]),  # landed late
    ])
    state: dict[str, Any] = {}

    def sleep(_: float) -> None:
        state["write"], state["runs"] = next(polls, (lambda: None, [one, two, three]))
        state["write"]()

    def read() -> list[Attempt]:
        if state.get("fail"):
            raise errors.TransientError("429 Too Many Requests")
        return state["runs"]

    reader.follow(read, now - timedelta(minutes=1), 0.01, stop_after=0.3, sleep=sleep)
    assert [plain(line) for line in printed] == [
        "r-2 step 3", "── attempt 3: r-3 in us-central1-a (running) ──", "r-3 step 4",
        "── attempt 2: r-2 in us-central1-b (running) ──", "r-2 late"]
    printed.clear()
    state["fail"] = True  # a read refused: the next one catches up, nothing is raised
    reader.follow(read, now - timedelta(minutes=1), 0.01, stop_after=0.05, sleep=lambda _: None)
    assert printed == []


def test_a_vm_without_serial_port_logging_enable_has_only_the_guest_agents_log(tmp_path: Path):
    """Serial-port logging is off by default in Google projects: a VM whose metadata does not set
    serial-port-logging-enable has no serial_port_1_output entry, only the agent's copy."""
    for name, items in (("off-1", []), ("on-1", [{"key": "serial-port-logging-enable", "value": "true"}])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "serial-port-1.log").write_bytes(f"{name} says hi\n".encode())
    vms = {name: {"id": str(7000 + i), "zone": "https://x/projects/p9/zones/us-central1-b",
                  "selfLink": f"https://x/compute/v1/projects/p9/zones/us-central1-b/instances/{name}",
                  "metadata": {"items": items}}
           for i, (name, items) in enumerate((("off-1", []), ("on-1", [{"key": "serial-port-logging-enable",
                                                                          "value": "true"}])))}
    srv = LoggingServer()  # not served: what it is fed
    VmLogs(srv, SimpleNamespace(workdir=tmp_path, instance=vms.__getitem__)).sweep(final=True)  # type: ignore[arg-type]
    assert [e["textPayload"] for e in srv.entries(SERIAL)] == ["on-1 says hi"]
    assert sorted(e["jsonPayload"]["message"] for e in srv.entries(SCRIPTS)) == [
        "startup-script: off-1 says hi", "startup-script: on-1 says hi"]


def test_a_tpu_nodes_workers_are_logged_as_tpu_worker_by_node_name_and_worker_number(tmp_path: Path):
    """A Cloud TPU VM's entries are resource.type tpu_worker with project_id, zone, node_id (the
    node's name) and worker_id: each worker's serial lines go in as such, under its node's name."""
    compute = SimpleNamespace(workdir=tmp_path / "vms", instance=lambda name: {}[name])
    node = {"name": "projects/p9/locations/us-central2-b/nodes/tj-1", "id": "9123",
            "metadata": {"serial-port-logging-enable": "TRUE"}}
    tpu = SimpleNamespace(workdir=tmp_path / "tpus", node=lambda name: {"tj-1": node}[name])
    for worker in (0, 1):
        folder = tmp_path / "tpus" / "tj-1" / f"w-{worker}"
        folder.mkdir(parents=True)
        (folder / "serial-port-1.log").write_bytes(f"worker {worker}: step 1\n".encode())
    srv = LoggingServer()
    VmLogs(srv, compute, tpu=tpu).sweep(final=True)  # type: ignore[arg-type]
    serial = srv.entries(SERIAL)
    assert sorted((e["resource"]["labels"]["worker_id"], e["textPayload"]) for e in serial) == [
        ("0", "worker 0: step 1"), ("1", "worker 1: step 1")]
    assert serial[0]["resource"]["type"] == "tpu_worker" and serial[0]["logName"] == f"projects/p9/logs/{SERIAL}"
    assert {k: v for k, v in serial[0]["resource"]["labels"].items() if k != "worker_id"} == {
        "project_id": "p9", "zone": "us-central2-b", "node_id": "tj-1"}
    agent = srv.entries(SCRIPTS)
    assert sorted(e["labels"]["instance_name"] for e in agent) == [hostname("9123", 0), hostname("9123", 1)]


def test_reads_past_sixty_a_minute_are_refused_429_with_the_delay_to_wait():
    """Google's entries.list quota: 60 reads a minute per project; the 61st is refused 429
    RESOURCE_EXHAUSTED, naming the quota (ErrorInfo) and when a read fits again (RetryInfo)."""
    with LoggingServer() as srv:
        body = {"resourceNames": [f"projects/{PROJECT}"], "pageSize": 1}
        answers = [post(srv, "list", body).status_code for _ in range(60)]
        refused = post(srv, "list", body)
        other = post(srv, "list", {**body, "resourceNames": ["projects/another-proj"]})
    assert answers == [200] * 60 and other.status_code == 200 and srv.refused == 1
    error = refused.json()["error"]
    assert refused.status_code == 429 and error["status"] == "RESOURCE_EXHAUSTED" and "Quota exceeded" in error["message"]
    info = {d["@type"].rsplit(".", 1)[-1]: d for d in error["details"]}
    assert info["ErrorInfo"]["reason"] == "RATE_LIMIT_EXCEEDED"
    assert info["ErrorInfo"]["metadata"]["quota_limit_value"] == "60"
    assert 0 < float(info["RetryInfo"]["retryDelay"].rstrip("s")) <= 60


def _agent(resource: dict[str, Any], message: str, at: datetime, project: str = PROJECT) -> dict[str, Any]:
    """An entry of the guest agent's log (what a project without serial-port logging has)."""
    return {"logName": f"projects/{project}/logs/{SCRIPTS}", "resource": resource, "severity": "INFO",
            "jsonPayload": {"message": f"startup-script: {message}"}, "timestamp": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}


def _vm(instance: str) -> dict[str, Any]:
    return {"type": "gce_instance", "labels": {"instance_id": instance, "zone": "us-central1-a", "project_id": PROJECT}}


def test_a_tpu_jobs_output_is_read_from_its_workers_by_the_nodes_name(server, client):
    """A TPU node's workers log as tpu_worker (node_id: the node's name, worker_id): `respawn logs`
    reads them so, not as Compute VMs by the node's numeric id, each line under its worker."""
    from controller.cli.joblogs import Attempt, JobLogs

    now = datetime.now(UTC)
    worker = lambda n: {"type": "tpu_worker", "labels": {"project_id": PROJECT, "zone": "us-central2-b",  # noqa: E731
                                                         "node_id": "tj-1", "worker_id": str(n)}}
    server.write([{**entry("0", f"worker {n} step {i}", timestamp=(now + timedelta(seconds=i, milliseconds=n))
                          .strftime("%Y-%m-%dT%H:%M:%S.%fZ")), "resource": worker(n)}
                  for i in range(3) for n in (0, 1)]
                 + [entry("8123", "a VM whose id is the node's: not the node")])
    printed: list[str] = []
    reader = JobLogs(client, "tj", [PROJECT], printed.append, lambda text: text)
    reader.print_all([Attempt(1, {"tj-1": "8123"}, "us-central2-b", "running", tpu=True)], now - timedelta(minutes=1))
    assert [plain(line) for line in printed] == ["── attempt 1: tj-1 in us-central2-b (running) ──"] + [
        f"tj-1/w{n} worker {n} step {i}" for i in range(3) for n in (0, 1)]


def test_forty_attempts_without_serial_logging_are_read_within_loggings_quota():
    """Sixty entries.list a minute per project, as Google allows: forty attempts whose VMs logged only
    through the guest agent (serial-port logging off) are read in a handful of reads, never refused."""
    from controller.cli.joblogs import Attempt, JobLogs

    start = datetime.now(UTC) - timedelta(hours=2)
    runs = [Attempt(n, {f"q-{n}": str(10_000 + n)}) for n in range(1, 41)]
    with LoggingServer() as srv:  # the quota: 60 reads a minute
        srv.write([_agent(_vm(str(10_000 + n)), f"attempt {n} line {i}", start + timedelta(minutes=n, seconds=i))
                   for n in range(1, 41) for i in range(30)])
        printed: list[str] = []
        reader = JobLogs(logging_client(Settings(project=PROJECT, logging_endpoint=srv.endpoint)), "q", [PROJECT],
                         printed.append, lambda text: text, limit=5)
        reader.print_all(runs, start)
        assert srv.refused == 0 and reader.reads < 20, reader.reads
    for n in range(1, 41):
        at = printed.index(f"── attempt {n}: q-{n} ──")
        assert [plain(line) for line in printed[at + 1:at + 7]] == [
            "… earlier lines of this attempt left out (--limit 5)", *(f"q-{n} attempt {n} line {i}" for i in range(25, 30))]


def test_a_read_refused_for_the_quota_is_tried_again_after_the_delay_the_server_names():
    """A project's quota shared with others (another reader, the Logs Explorer): a read refused 429
    is tried again after the RetryInfo delay, and every attempt is still printed whole."""
    from controller.cli.joblogs import Attempt, JobLogs, Pace

    start = datetime.now(UTC) - timedelta(hours=2)
    runs = [Attempt(n, {f"r-{n}": str(20_000 + n)}) for n in range(1, 9)]
    with LoggingServer(reads_per_minute=2, window=1.0) as srv:  # two reads a second: the reader must wait
        srv.write([_agent(_vm(str(20_000 + n)), f"a{n} l{i}", start + timedelta(minutes=n, seconds=i))
                   for n in range(1, 9) for i in range(150)])
        printed: list[str] = []
        reader = JobLogs(logging_client(Settings(project=PROJECT, logging_endpoint=srv.endpoint)), "r", [PROJECT],
                         printed.append, lambda text: text, limit=100, pace=Pace(1000), retry_for=30)
        reader.print_all(runs, start)
        assert srv.refused >= 1 and reader.reads >= 4
    for n in range(1, 9):
        at = printed.index(f"── attempt {n}: r-{n} ──")
        assert plain(printed[at + 2]) == f"r-{n} a{n} l50" and plain(printed[at + 101]) == f"r-{n} a{n} l149"
