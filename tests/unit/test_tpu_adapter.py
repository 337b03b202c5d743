"""What the TPU adapter makes of Google's own answers, as real users have reported them.

The local TPU server answers in its own words; these are Google's (sources in
controller/adapters/tpu.py), so that a stockout or a quota refusal from the real API is
read as one even where its text differs from the local server's.
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import requests
from google.api_core import exceptions as gexc
from google.longrunning import operations_pb2
from google.protobuf import any_pb2
from google.rpc import status_pb2

from controller.core import errors, names
from controller.adapters import tpu
from controller.adapters.tpu import RETRY, _raise_for, _retryable, _zone_nodes, queued_body, translate
from controller.core.ports import NodeHealth, NodeState, QueuedState, TpuRequest

STOCKOUT = ('There is no more capacity in the zone "europe-west4-a"; you can try in another zone where Cloud TPU '
            'Nodes are offered (see https://cloud.google.com/tpu/docs/regions) [EID: 0x1bc8f9d790be9142]')
RESERVED = "Insufficient reserved capacity. Contact customer support to increase your reservation. [EID: 0x2f8bc266e74261a]"
QUOTA = "Quota limit 'TPUV5sLitepodServingPerProjectPerZoneForTPUAPI' has been exceeded. Limit: 4 in zone us-east5-a."
QUOTA_DETAIL = {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                "violations": [{"subject": "project:1037372895180",
                                "description": "Quota 'TPUV5sLitepodServingPerProjectPerZoneForTPUAPI' exhausted. "
                                               "Limit 4 in zone us-east5-a"}]}


def failed(code: int, message: str, *detail_types: str) -> operations_pb2.Operation:
    details = [any_pb2.Any(type_url=f"type.googleapis.com/{t}") for t in detail_types]
    return operations_pb2.Operation(name="projects/p/locations/z/operations/o", done=True,
                                    error=status_pb2.Status(code=code, message=message, details=details))


class TestFinishedOperations:
    def test_code_8_no_more_capacity_is_a_stockout(self):
        with pytest.raises(errors.CapacityError) as e:
            _raise_for(failed(8, STOCKOUT), "europe-west4-a")
        assert e.value.zone == "europe-west4-a" and e.value.reason == "RESOURCE_EXHAUSTED (no more capacity)"

    def test_code_9_insufficient_reserved_capacity_is_a_stockout(self):
        with pytest.raises(errors.CapacityError):
            _raise_for(failed(9, RESERVED), "us-central1-a")

    def test_code_8_whatever_its_words_is_a_stockout(self):
        with pytest.raises(errors.CapacityError):
            _raise_for(failed(8, "The zone has run out of v5e"), "us-central1-a")

    def test_code_8_naming_a_quota_is_a_quota_error(self):
        with pytest.raises(errors.QuotaError) as e:
            _raise_for(failed(8, QUOTA, "google.rpc.QuotaFailure"), "us-east5-a")
        assert e.value.reason == "QUOTA_EXCEEDED (TPUV5sLitepodServingPerProjectPerZoneForTPUAPI)"

    @pytest.mark.parametrize("code, error", [(13, errors.TransientError), (14, errors.TransientError),
                                             (3, errors.RequestError), (7, errors.RequestError),
                                             (6, errors.AlreadyExists)])
    def test_other_codes(self, code, error):
        with pytest.raises(error):
            _raise_for(failed(code, "something"), "us-central1-a")

    def test_success_and_running_raise_nothing(self):
        _raise_for(operations_pb2.Operation(name="o", done=True), "z")
        _raise_for(operations_pb2.Operation(name="o", done=False), "z")


class TestImmediateAnswers:
    def test_a_429_quota_refusal_is_a_quota_error_and_never_retried(self):
        e = gexc.TooManyRequests(QUOTA, details=[QUOTA_DETAIL])
        assert not _retryable(e)
        error = translate(e, "us-east5-a", creating=True)
        assert isinstance(error, errors.QuotaError)
        assert error.reason == "QUOTA_EXCEEDED (TPUV5sLitepodServingPerProjectPerZoneForTPUAPI)"

    def test_a_quota_on_requests_per_minute_is_a_rate_limit_not_a_quota(self):
        e = gexc.TooManyRequests("Quota exceeded for quota metric 'Create requests' and limit 'Create requests per "
                                 "minute per project' of service 'tpu.googleapis.com' for consumer 'project_number:1'.")
        assert _retryable(e)
        assert isinstance(translate(e, "z", creating=True), errors.TransientError)

    def test_a_plain_429_or_503_is_retried_then_transient(self):
        for e in (gexc.TooManyRequests("Rate limit exceeded"), gexc.ServiceUnavailable("backend error")):
            assert _retryable(e)
            assert isinstance(translate(e, "z"), errors.TransientError)

    def test_conflict_not_found_and_bad_requests(self):
        assert isinstance(translate(gexc.Conflict("exists"), "z", creating=True), errors.AlreadyExists)
        assert isinstance(translate(gexc.NotFound("no node"), "z"), errors.NotFound)
        assert isinstance(translate(gexc.NotFound("no such accelerator type"), "z", creating=True), errors.RequestError)
        assert isinstance(translate(gexc.BadRequest("bad runtime version"), "z"), errors.RequestError)
        assert isinstance(translate(gexc.RetryError("gave up", cause=None), "z"), errors.TransientError)

    def test_retry_gives_up_on_a_quota_refusal_at_once(self):
        calls = []

        def refuse() -> None:
            calls.append(1)
            raise gexc.TooManyRequests(QUOTA)

        with pytest.raises(gexc.TooManyRequests):
            RETRY(refuse)()
        assert len(calls) == 1


def tpu_request(**kw: object) -> TpuRequest:
    base = dict(project="p", zone="us-central1-a", name="j-1", accelerator_type="v4-16", runtime_version="tpu-ubuntu2204-base",
                spot=True, labels={names.MANAGED_LABEL: "true", names.JOB_LABEL: "j"}, metadata={"startup-script": "x"},
                service_account="default", scopes=("s",), network="default", subnetwork=None, external_ip=False)
    return TpuRequest(**{**base, **kw})  # type: ignore[arg-type]


class TestRequestBodies:
    def test_a_spot_queued_resource_is_in_the_spot_tier_under_the_node_name(self):
        body = queued_body(tpu_request(queued=True))
        assert "spot" in body and "guaranteed" not in body
        spec = body.tpu.node_spec[0]
        assert (spec.parent, spec.node_id) == ("projects/p/locations/us-central1-a", "j-1")
        assert spec.node.accelerator_type == "v4-16" and spec.node.service_account.email == ""  # "default"
        assert dict(spec.node.labels) == {names.MANAGED_LABEL: "true", names.JOB_LABEL: "j"}

    def test_a_standard_queued_resource_is_guaranteed(self):
        body = queued_body(tpu_request(queued=True, spot=False))
        assert "guaranteed" in body and "spot" not in body


class TestListingJson:
    """Google's JSON as tpu.v2.json describes it, with what the typed client would drop."""

    NODE = {
        "name": "projects/p/locations/us-central1-a/nodes/j-1", "acceleratorType": "v4-16", "state": "SOMETHING_NEW",
        "health": "UNHEALTHY_MAINTENANCE", "createTime": "2026-11-20T08:00:00.123456789Z", "id": "123",
        "labels": {names.MANAGED_LABEL: "true", names.JOB_LABEL: "j", names.ATTEMPT_LABEL: "1"},
        "schedulingConfig": {"spot": True}, "networkEndpoints": [{"ipAddress": "10.0.0.2"}, {"ipAddress": "10.0.0.3"}],
        "upcomingMaintenance": {"type": "SCHEDULED", "windowStartTime": "2026-11-24T10:00:00Z",
                                "maintenanceStatus": "PENDING"},
    }

    def test_a_node_as_google_sends_it(self):
        [node] = _zone_nodes("p", "us-central1-a", [self.NODE], [], None)
        assert (node.name, node.state, node.health) == ("j-1", NodeState.UNKNOWN, NodeHealth.UNHEALTHY_MAINTENANCE)
        assert (node.accelerator_type, node.spot, node.workers, node.id) == ("v4-16", True, 2, "123")
        assert node.upcoming_maintenance == "SCHEDULED, starts 2026-11-24T10:00:00Z" and node.queued is None
        assert node.created_at.year == 2026 and node.attempt == 1

    def test_a_queued_resource_without_its_node_and_one_with(self):
        waiting = {"name": "projects/p/locations/us-central1-a/queuedResources/k-1", "spot": {},
                   "createTime": "2026-11-20T08:00:00Z", "state": {"state": "WAITING_FOR_RESOURCES"},
                   "tpu": {"nodeSpec": [{"parent": "projects/p/locations/us-central1-a", "nodeId": "k-1",
                                         "node": {"acceleratorType": "v5litepod-8",
                                                  "labels": {names.MANAGED_LABEL: "true", names.JOB_LABEL: "k"}}}]}}
        active = {"name": "projects/p/locations/us-central1-a/queuedResources/j-1", "guaranteed": {},
                  "state": {"state": "ACTIVE"}, "tpu": {"nodeSpec": [{"nodeId": "j-1", "node": {}}]}}
        foreign = {"name": "projects/p/locations/us-central1-a/queuedResources/x-1", "state": {"state": "ACCEPTED"},
                   "tpu": {"nodeSpec": [{"nodeId": "x-1", "node": {"labels": {names.JOB_LABEL: "x"}}}]}}
        nodes = {n.name: n for n in _zone_nodes("p", "us-central1-a", [self.NODE], [waiting, active, foreign], None)}
        assert sorted(nodes) == ["j-1", "k-1"]
        assert (nodes["k-1"].state, nodes["k-1"].queued, nodes["k-1"].spot) == (
            NodeState.CREATING, QueuedState.WAITING_FOR_RESOURCES, True)
        assert nodes["j-1"].queued == QueuedState.ACTIVE and nodes["j-1"].workers == 2
        assert [n.name for n in _zone_nodes("p", "us-central1-a", [self.NODE], [waiting], "k")] == ["k-1"]

    @pytest.mark.parametrize("state, read", [("SUSPENDED", NodeState.PREEMPTED), ("FAILED", NodeState.TERMINATED),
                                             ("NEW_STATE", NodeState.UNKNOWN)])
    def test_a_queued_resource_that_will_not_give_its_node(self, state, read):
        qr = {"name": "q", "state": {"state": state},
              "tpu": {"nodeSpec": [{"nodeId": "k-1", "node": {"labels": {names.MANAGED_LABEL: "true"}}}]}}
        [node] = _zone_nodes("p", "z", [], [qr], None)
        assert node.state == read


class _Session:
    """Answers GETs from a table: path -> list of (status, JSON body), one per call in turn."""

    def __init__(self, answers: dict[str, list[tuple[int, dict]]]) -> None:
        self.answers, self.asked = answers, []

    def get(self, url: str, params: dict, timeout: float) -> requests.Response:
        path = url.removeprefix("http://tpu.test/v2/")
        self.asked.append((path, params.get("pageToken", "")))
        status, body = self.answers[path].pop(0)
        response = requests.Response()
        response.status_code, response._content = status, json.dumps(body).encode()
        response.request = requests.Request("GET", url).prepare()
        return response


class _Client:
    def __init__(self, session: _Session) -> None:
        self.transport = SimpleNamespace(_session=session, _host="http://tpu.test")


class TestListing:
    """The listing's own requests: pages, and which failures blind a zone or a project."""

    @pytest.fixture(autouse=True)
    def _quick_retry(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(tpu, "RETRY", RETRY.with_timeout(0.5).with_delay(initial=0.01, maximum=0.05))

    def test_pages_are_followed_and_each_zone_listed(self):
        node = {**TestListingJson.NODE, "state": "READY"}
        session = _Session({
            "projects/p/locations/us-central1-a/nodes": [(200, {"nodes": [node], "nextPageToken": "2"}),
                                                         (200, {"nodes": [{**node, "name": "x/nodes/j-2"}]})],
            "projects/p/locations/us-central1-a/queuedResources": [(200, {})],
            "projects/p/locations/us-central1-b/nodes": [(200, {})],
            "projects/p/locations/us-central1-b/queuedResources": [(200, {})],
        })
        listed = tpu.CloudTpu(_Client(session)).list_nodes(["p"], ["us-central1-a", "us-central1-b"])  # type: ignore[arg-type]
        assert sorted(n.name for n in listed.nodes) == ["j-1", "j-2"]
        assert ("projects/p/locations/us-central1-a/nodes", "2") in session.asked
        assert listed.unreachable == [] and listed.failed_projects == {}

    def test_a_denied_location_is_denied_and_a_denied_project_failed(self):
        denied_zone = {"error": {"code": 403, "status": "PERMISSION_DENIED",
                                 "message": "Permission denied on 'locations/us-central2-b' (or it may not exist)."}}
        denied_project = {"error": {"code": 403, "status": "PERMISSION_DENIED",
                                    "message": "Permission 'tpu.nodes.list' denied on 'projects/q/locations/us-central1-a/nodes'"}}
        session = _Session({
            "projects/p/locations/us-central2-b/nodes": [(403, denied_zone)],
            "projects/p/locations/us-central1-a/nodes": [(503, {"error": {"code": 503, "message": "backend"}})] * 50,
            "projects/q/locations/us-central2-b/nodes": [(403, denied_zone)],
            "projects/q/locations/us-central1-a/nodes": [(403, denied_project)],
        })
        listed = tpu.CloudTpu(_Client(session)).list_nodes(["p", "q"], ["us-central1-a", "us-central2-b"])  # type: ignore[arg-type]
        assert listed.nodes == []
        assert listed.unreachable == ["us-central1-a"]  # a 503 that outlasted the retries: not seen
        assert list(listed.denied) == ["us-central2-b"]  # the project may not use it: nothing is there
        assert list(listed.failed_projects) == ["q"] and "tpu.nodes.list" in listed.failed_projects["q"]


class TestHostileListings:
    """Google's JSON as it should never be, and pages that never end: the zone is not seen
    (never read as empty), and nothing but ``controller.core.errors`` comes out."""

    @pytest.fixture(autouse=True)
    def _quick_retry(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(tpu, "RETRY", RETRY.with_timeout(0.5).with_delay(initial=0.01, maximum=0.05))

    @staticmethod
    def listed(nodes: list[tuple[int, object]], queued: list[tuple[int, object]] | None = None):
        session = _Session({"projects/p/locations/z/nodes": nodes,
                            "projects/p/locations/z/queuedResources": queued or [(200, {})]})
        return tpu.CloudTpu(_Client(session)).list_nodes(["p"], ["z"]), session  # type: ignore[arg-type]

    def test_a_next_page_token_that_comes_back_blinds_the_zone_instead_of_looping(self):
        listed, session = self.listed([(200, {"nodes": [], "nextPageToken": "again"})] * 5)
        assert listed.unreachable == ["z"] and listed.nodes == []
        assert len(session.asked) == 2

    def test_pages_that_never_end_are_bounded(self, monkeypatch):
        monkeypatch.setattr(tpu, "_MAX_PAGES", 3)
        listed, session = self.listed([(200, {"nextPageToken": str(i)}) for i in range(10)])
        assert listed.unreachable == ["z"] and len(session.asked) == 3

    MANAGED = {names.MANAGED_LABEL: "true"}

    @pytest.mark.parametrize("body", [
        [], None, "nodes", {"nodes": "j-1"}, {"nodes": ["j-1"]}, {"nodes": [{"name": 5, "labels": MANAGED}]},
        {"nodes": [{"name": "x/j-1", "labels": ["respawn-managed"]}]},
        {"nodes": [{"name": "x/j-1", "labels": {names.MANAGED_LABEL: "true", names.ATTEMPT_LABEL: 1}}]},
        {"nodes": [{"name": "x/j-1", "labels": MANAGED, "createTime": "yesterday"}]},
        {"nodes": [{"name": "x/j-1", "labels": MANAGED, "upcomingMaintenance": "soon"}]},
        {"nodes": [{"name": "x/j-1", "labels": MANAGED, "networkEndpoints": 2}]},
        {"nodes": [], "nextPageToken": 7},
    ])
    def test_a_malformed_node_listing_blinds_the_zone(self, body):
        listed, _ = self.listed([(200, body)])
        assert listed.unreachable == ["z"] and listed.nodes == []

    @pytest.mark.parametrize("qr", [
        {"name": "q", "state": "ACTIVE", "tpu": {"nodeSpec": [{"nodeId": "k-1", "node": {"labels": MANAGED}}]}},
        {"name": "q", "tpu": {"nodeSpec": {"nodeId": "k-1"}}},
        {"name": "q", "tpu": {"nodeSpec": ["k-1"]}},
        {"name": "q", "tpu": {"nodeSpec": [{"nodeId": "k-1", "node": {"labels": MANAGED}}]}, "createTime": "soon"},
    ])
    def test_a_malformed_queued_resource_blinds_the_zone(self, qr):
        listed, _ = self.listed([(200, {})], [(200, {"queuedResources": [qr]})])
        assert listed.unreachable == ["z"] and listed.nodes == []

    def test_null_is_a_fields_default_as_proto3_json_says(self):
        node = {"name": "x/nodes/j-1", "labels": self.MANAGED, "schedulingConfig": None, "networkEndpoints": None,
                "upcomingMaintenance": None, "createTime": None, "state": None, "health": None, "id": None}
        qr = {"name": "q", "tpu": None, "state": None}
        listed, _ = self.listed([(200, {"nodes": [node], "nextPageToken": None})], [(200, {"queuedResources": [qr]})])
        [read] = listed.nodes
        assert (read.name, read.state, read.workers, read.spot, read.upcoming_maintenance) == (
            "j-1", NodeState.STATE_UNSPECIFIED, 1, False, None)
        assert listed.unreachable == []
        listed, _ = self.listed([(200, {"nodes": None})])
        assert listed.nodes == [] and listed.unreachable == []

    def test_a_create_time_without_a_zone_is_utc(self):
        node = {"name": "x/nodes/j-1", "labels": self.MANAGED, "createTime": "2026-11-20T08:00:00"}
        [read] = _zone_nodes("p", "z", [node], [], None)
        assert read.created_at.tzinfo is not None

    def test_a_404_on_a_zone_is_not_seen_never_empty(self):
        """Google answers an unknown location with 403; a 404 is a wrong endpoint or path, and
        reading it as "no nodes" would have every TPU job's node taken for lost."""
        listed, _ = self.listed([(404, {"error": {"code": 404, "message": "The requested URL was not found"}})])
        assert listed.unreachable == ["z"] and listed.failed_projects == {}


# -- the real client against a server that answers badly ---------------------------------
class _Hostile:
    """An HTTP server answering (method, path prefix) with (status, raw body), or never."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.answers: dict[tuple[str, str], tuple[int, bytes] | None] = {}
        self.release = threading.Event()
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def answer(self, method: str) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = self.path.split("?")[0]
                found = next((a for (m, p), a in hostile.answers.items() if m == method and path.startswith(p)),
                             (404, json.dumps({"error": {"code": 404, "message": "not found"}}).encode()))
                if found is None:
                    hostile.release.wait(30)
                    return
                status, body = found
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self.answer("GET")

            def do_POST(self) -> None:
                self.answer("POST")

            def do_DELETE(self) -> None:
                self.answer("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


NODES = "/v2/projects/p/locations/us-central1-a/nodes"
QUEUED = "/v2/projects/p/locations/us-central1-a/queuedResources"
OPS = "/v2/projects/p/locations/us-central1-a/operations"
OP = json.dumps({"name": "projects/p/locations/us-central1-a/operations/o1"}).encode()
RID = "8f0c9a2e-3d4b-4c5a-9e6f-7a8b9c0d1e2f"


class TestHostileAnswers:
    @pytest.fixture
    def hostile(self, monkeypatch: pytest.MonkeyPatch):
        monkeypatch.setattr(tpu, "_CALL_TIMEOUT", 0.5)
        monkeypatch.setattr(tpu, "RETRY", RETRY.with_timeout(0.5).with_delay(initial=0.01, maximum=0.05))
        server = _Hostile()
        yield server
        server.close()

    @staticmethod
    def gateway(server: _Hostile, credentials: object = None) -> tpu.CloudTpu:
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import tpu_v2

        client = tpu_v2.TpuClient(transport="rest", credentials=credentials or AnonymousCredentials(),
                                  client_options=ClientOptions(api_endpoint=server.endpoint))
        return tpu.CloudTpu(client, operation_timeout=1.0)

    @pytest.mark.parametrize("queued", [False, True])
    def test_a_create_that_is_never_answered_is_transient_within_the_call_timeout(self, hostile, queued):
        hostile.answers[("POST", QUEUED if queued else NODES)] = None
        started = time.monotonic()
        with pytest.raises(errors.TransientError):
            self.gateway(hostile).create(tpu_request(queued=queued), RID)
        assert time.monotonic() - started < 5

    def test_reading_an_existing_node_that_is_never_answered_is_transient(self, hostile):
        hostile.answers[("POST", NODES)] = (409, json.dumps({"error": {"code": 409, "message": "exists"}}).encode())
        hostile.answers[("GET", f"{NODES}/j-1")] = None
        started = time.monotonic()
        with pytest.raises(errors.TransientError):
            self.gateway(hostile).create(tpu_request(), RID)
        assert time.monotonic() - started < 5

    @pytest.mark.parametrize("method, path", [("GET", f"{QUEUED}/j-1"), ("DELETE", f"{NODES}/j-1")])
    def test_a_delete_that_is_never_answered_is_transient(self, hostile, method, path):
        hostile.answers[(method, path)] = None
        started = time.monotonic()
        with pytest.raises(errors.TransientError):
            self.gateway(hostile).delete("p", "us-central1-a", "j-1")
        assert time.monotonic() - started < 5

    @pytest.mark.parametrize("answers", [
        {("POST", NODES): (200, b"<html>")},
        {("POST", NODES): (200, b'{"name": "o", "done": "maybe"}')},
        {("POST", NODES): (200, b"{}")},  # an operation without a name: nothing to poll
        {("POST", NODES): (200, OP), ("GET", OPS): (200, b"<html>")},
        {("POST", NODES): (409, b'{"error": {"code": 409, "message": "exists"}}'), ("GET", f"{NODES}/j-1"): (200, b"[")},
    ])
    def test_an_answer_the_client_cannot_parse_is_transient(self, hostile, answers):
        hostile.answers.update(answers)
        with pytest.raises(errors.TransientError):
            self.gateway(hostile).create(tpu_request(), RID)

    def test_an_operation_error_with_a_detail_of_an_unknown_type_is_an_error_of_ours(self, hostile):
        hostile.answers[("POST", NODES)] = (200, json.dumps({
            "name": "projects/p/locations/us-central1-a/operations/o1", "done": True,
            "error": {"code": 8, "message": STOCKOUT,
                      "details": [{"@type": "type.googleapis.com/google.cloud.tpu.internal.Thing", "x": 1}]}}).encode())
        with pytest.raises(errors.RespawnError):
            self.gateway(hostile).create(tpu_request(), RID)

    def test_an_operation_that_vanished_is_transient_not_a_missing_node(self, hostile):
        hostile.answers[("POST", NODES)] = (200, OP)  # every GET of the operation: the default 404
        with pytest.raises(errors.TransientError):
            self.gateway(hostile).create(tpu_request(), RID)

    def test_delete_of_an_answer_it_cannot_parse_is_transient(self, hostile):
        hostile.answers[("DELETE", f"{NODES}/j-1")] = (200, b"[1]")
        with pytest.raises(errors.TransientError):
            self.gateway(hostile).delete("p", "us-central1-a", "j-1")

    def test_credentials_that_cannot_be_refreshed_are_an_error_of_ours(self, hostile):
        from google.auth import credentials as ga_credentials
        from google.auth import exceptions as auth_exceptions

        class Broken(ga_credentials.Credentials):
            def refresh(self, request: object) -> None:
                raise auth_exceptions.RefreshError("metadata server unreachable")

        gateway = self.gateway(hostile, Broken())
        with pytest.raises(errors.TransientError):
            gateway.create(tpu_request(), RID)
        with pytest.raises(errors.TransientError):
            gateway.delete("p", "us-central1-a", "j-1")
        listed = gateway.list_nodes(["p"], ["us-central1-a"])
        assert listed.unreachable == ["us-central1-a"]
