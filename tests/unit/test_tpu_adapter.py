"""What the TPU adapter makes of Google's own answers, as real users have reported them.

The local TPU server answers in its own words; these are Google's (sources in
controller/adapters/tpu.py), so that a stockout or a quota refusal from the real API is
read as one even where its text differs from the local server's.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import requests
from google.api_core import exceptions as gexc
from google.longrunning import operations_pb2
from google.protobuf import any_pb2
from google.rpc import status_pb2

from controller import errors, names
from controller.adapters import tpu
from controller.adapters.tpu import RETRY, _raise_for, _retryable, _zone_nodes, queued_body, translate
from controller.ports import NodeHealth, NodeState, QueuedState, TpuRequest

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

    def test_a_denied_location_is_unreachable_and_a_denied_project_failed(self):
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
        assert listed.unreachable == ["us-central1-a", "us-central2-b"]
        assert list(listed.failed_projects) == ["q"] and "tpu.nodes.list" in listed.failed_projects["q"]
