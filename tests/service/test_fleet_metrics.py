"""The fleet's figures in the controller's log, and the log-based metrics `respawn deploy` makes of them.

The log lines are the real ones: google-cloud-logging's ``StructuredLogHandler`` (what the functions
log through on Google) writes each to a stream, and each is made into the LogEntry Cloud Run makes of
a JSON line on stdout (its fields the ``jsonPayload``, ``severity`` and the handler's own keys taken
out), resource ``cloud_run_revision`` of the function's service. Each metric of ``deploy/metrics``
is then applied as Logging applies it: its ``filter`` evaluated by the local Logging's query
parser, its ``valueExtractor`` and ``labelExtractors`` read from each entry it selects.
"""

from __future__ import annotations

import io
import json
import logging
import math
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from google.cloud.logging.handlers import StructuredLogHandler

from controller.cli import deploy
from controller.core import fleet, ledger
from controller.core.state import Phase
from controller.service import bootstrap, functions
from controller.service.config import Settings
from localcloud.logging import LoggingServer, compile_filter
from tests.harness import BUCKET, Harness, spec_doc

SPECIAL = {"severity", "httpRequest", "time", "timestamp", "logging.googleapis.com/labels",
           "logging.googleapis.com/trace", "logging.googleapis.com/spanId", "logging.googleapis.com/trace_sampled",
           "logging.googleapis.com/sourceLocation", "logging.googleapis.com/insertId"}
NAMED = {"respawn_jobs", "respawn_losses", "respawn_stockouts", "respawn_recovery_seconds", "respawn_goodput",
         "respawn_cost_dollars", "respawn_on_demand_dollars", "respawn_accelerators_running"}


class CloudRunLog:
    """The controller's log as Cloud Logging stores it from a gen2 function's stdout."""

    def __init__(self) -> None:
        self.stream = io.StringIO()
        self.handler = StructuredLogHandler(stream=self.stream, project_id="respawn-proj")
        self.service = deploy.TICK

    def entries(self) -> list[dict[str, Any]]:
        out = []
        for line in self.stream.getvalue().splitlines():
            raw = json.loads(line)
            out.append({"logName": "projects/respawn-proj/logs/run.googleapis.com%2Fstdout",
                        "resource": {"type": "cloud_run_revision",
                                     "labels": {"service_name": raw.pop("_service"), "location": "us-central1"}},
                        "severity": raw.get("severity", "DEFAULT"),
                        "jsonPayload": {k: v for k, v in raw.items() if k not in SPECIAL}})
        return out

    def figures(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The jsonPayload of every figures entry (of ``kind``)."""
        return [e["jsonPayload"] for e in self.entries()
                if e["jsonPayload"].get(fleet.KIND) and kind in (None, e["jsonPayload"][fleet.KIND])]

    def clear(self) -> None:
        self.stream.seek(0)
        self.stream.truncate()


@pytest.fixture
def log() -> Iterator[CloudRunLog]:
    captured = CloudRunLog()
    logger = logging.getLogger("controller")
    # which function wrote the line: Cloud Run names the service in the entry's resource
    stamp = logging.Filter()
    stamp.filter = lambda record: setattr(record, "json_fields", {  # type: ignore[method-assign]
        **(getattr(record, "json_fields", None) or {}), "_service": captured.service}) or True
    captured.handler.addFilter(stamp)
    level = logger.level
    logger.addHandler(captured.handler)
    logger.setLevel(logging.INFO)
    yield captured
    logger.removeHandler(captured.handler)
    logger.setLevel(level)


def metric(name: str) -> dict[str, Any]:
    return yaml.safe_load((deploy.METRICS_DIR / f"{name}.yaml").read_text())


def extract(text: str, entry: dict[str, Any]) -> Any:
    """``EXTRACT(field)`` of a LogEntry, as a log-based metric reads it (None: absent)."""
    path = re.fullmatch(r"EXTRACT\(([\w.]+)\)", text)
    assert path, f"not an EXTRACT: {text}"
    value: Any = entry
    for part in path[1].split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def points(name: str, entries: list[dict[str, Any]]) -> list[tuple[dict[str, str], Any]]:
    """What the metric ``name`` records from ``entries``: (labels, value) per entry its filter selects;
    a counter's value is 1 (it counts entries)."""
    m = metric(name)
    selected = [e for e in entries if compile_filter(m["filter"])(e)]
    out = []
    for e in selected:
        labels = {key: extract(text, e) for key, text in m.get("labelExtractors", {}).items()}
        assert all(isinstance(v, str) and v for v in labels.values()), (name, labels)
        value = extract(m["valueExtractor"], e) if "valueExtractor" in m else 1
        assert isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value), (name, value)
        out.append((labels, value))
    return out


def running(h: Harness, job: str, **spec: Any) -> None:
    h.submit(job, spec_doc(**spec) if spec else None)
    h.tick()
    h.advance(minutes=3)
    h.tick()
    assert h.status(job).phase == Phase.RUNNING


# -- what a commit did: one entry per loss, recovery and stockout ----------------------------------------

def test_a_preemption_and_its_recovery_are_each_one_entry_written_by_the_pass_that_committed_them(h, log):
    running(h, "llm")
    log.clear()
    h.marker("llm")
    lost = h.clock.now()
    h.advance(seconds=10)
    h.tick()  # attempt 2 launched
    (loss,) = log.figures(fleet.LOSS)
    assert loss == {fleet.KIND: "loss", "job": "llm", "zone": "us-central1-a", "cause": "preempted", "attempt": 1,
                    "bucket": BUCKET, "message": loss["message"]}
    assert not log.figures(fleet.RECOVERY)
    h.advance(minutes=2)
    h.tick()  # attempt 2 RUNNING: the recovery is over
    (back,) = log.figures(fleet.RECOVERY)
    assert (back["zone"], back["cause"], back["attempt"]) == ("us-central1-a", "preempted", 1)
    assert back["latency_s"] == (h.clock.now() - lost).total_seconds() == 130
    log.clear()
    h.tick()
    h.tick()
    assert not log.figures(fleet.LOSS) and not log.figures(fleet.RECOVERY)  # counted once, never again


def test_a_loss_an_event_pass_recovers_is_its_entry_and_the_tick_after_it_does_not_count_it_again(h, log):
    running(h, "llm")
    h.marker("llm")
    h.engine().reconcile("llm")  # on_object's pass for the marker
    assert [e["cause"] for e in log.figures(fleet.LOSS)] == ["preempted"]
    log.clear()
    summary = h.tick()
    assert not log.figures(fleet.LOSS) and summary.figures is not None
    assert summary.figures.pass_losses == {} and summary.figures.losses == {"us-central1-a": {"preempted": 1}}


def test_a_stockout_is_an_entry_of_its_zone_and_the_create_goes_on_to_the_next(h, log):
    h.compute.stockouts.add("us-central1-a")
    h.submit("llm")
    summary = h.tick()
    assert [(e["zone"], e[fleet.KIND]) for e in log.figures(fleet.STOCKOUT)] == [("us-central1-a", "stockout")]
    assert summary.figures is not None and summary.figures.pass_stockouts == {"us-central1-a": 1}
    assert h.status("llm").zone == "us-central1-b"


# -- what the fleet is: one entry a tick, and one per phase --------------------------------------------------

def _wired(h: Harness) -> None:
    bootstrap.override(h.engine(), Settings(bucket=BUCKET, project="respawn-proj"))


def test_each_tick_writes_one_fleet_entry_with_every_figure_and_one_entry_per_phase(h, log):
    running(h, "a")
    running(h, "b", machine_type="a2-highgpu-2g")  # two A100s built in
    h.exit("b", 0)
    h.submit("bad", {"zones": "nope"})
    h.advance(minutes=30)
    _wired(h)
    log.clear()
    body, code = functions.tick()
    assert code == 200
    (entry,) = log.figures(fleet.FLEET)
    assert entry["jobs_by_phase"] == {"PENDING": 0, "QUEUED": 0, "PROVISIONING": 0, "RUNNING": 1, "RECOVERING": 0,
                                      "SUCCEEDED": 1, "FAILED": 1, "CANCELLED": 0}
    assert entry["jobs"] == 3 and entry["accelerators_running"] == 1 and entry["bucket"] == BUCKET
    books = [h.status(j).ledger for j in ("a", "b")]
    now = h.clock.now()
    sums = [ledger.summary(b, now) for b in books]
    assert math.isclose(entry["cost_dollars"], sum(s.cost for s in sums), abs_tol=1e-3)
    assert math.isclose(entry["on_demand_dollars"], sum(s.on_demand_cost for s in sums), abs_tol=1e-3)
    assert entry["on_demand_dollars"] > entry["cost_dollars"] > 0
    useful, paid = sum(s.useful_hours for s in sums), sum(s.accelerator_hours - s.unknown_hours for s in sums)
    assert math.isclose(entry["goodput"], useful / paid, abs_tol=1e-5) and 0 < entry["goodput"] < 1
    assert entry["pass"] == {"losses_by_zone": {}, "stockouts_by_zone": {}, "recoveries": 0, "recovery_s": []}
    phases = {e["phase"]: e["jobs"] for e in log.figures(fleet.PHASE)}
    assert phases == entry["jobs_by_phase"]
    assert body["jobs_seen"] == 3  # the HTTP answer is the pass's summary, as before


def test_a_fleet_of_ten_thousand_jobs_is_one_entry_of_a_few_kib(h):
    """The entry's maps are keyed by phase, zone and cause, never by job."""
    from controller.core.state import JobStatus

    zones = [f"us-central1-{z}" for z in "abcdf"] + [f"europe-west4-{z}" for z in "abc"]
    statuses = []
    for i in range(10_000):
        book = ledger.Ledger(totals=ledger.Totals(losses={zones[i % 8]: {"preempted": 3, "maintenance": 1}},
                                                  stockouts={zones[(i + 1) % 8]: 2}, recoveries=4, recovery_s=480.0,
                                                  paid_acc_s=36000.0, boot_acc_s=600.0, cost=2.2, on_demand_cost=7.1))
        statuses.append(JobStatus(phase=list(Phase)[i % 7], ledger=book))
    figures = fleet.figures(statuses, h.clock.now())
    entry = fleet.fleet_entry(figures)
    assert len(json.dumps(entry)) < 4096
    assert entry["jobs"] == 10_000 and sum(entry["jobs_by_phase"].values()) == 10_000
    assert entry["losses_by_zone"][zones[0]] == {"preempted": 3750, "maintenance": 1250}
    assert math.isclose(entry["cost_dollars"], 22_000) and entry["recoveries"] == 40_000
    assert len(fleet.phase_entries(figures)) == 8  # one a phase


# -- the metrics read what the entries carry -----------------------------------------------------------------

def test_every_metric_deploy_makes_reads_its_figure_from_the_entries_the_functions_write(h, log):
    assert {p.stem for p in deploy.metric_files()} == NAMED
    running(h, "llm")
    running(h, "big", machine_type="a2-highgpu-2g")
    h.compute.stockouts.add("us-central1-a")
    h.submit("late")
    h.marker("llm")
    h.advance(seconds=20)
    log.service = deploy.ON_OBJECT  # the marker's event recovers it
    h.engine().reconcile("llm")
    log.service = deploy.TICK
    h.advance(minutes=2)
    _wired(h)
    functions.tick()
    entries = log.entries()

    jobs = {labels["phase"]: value for labels, value in points("respawn_jobs", entries)}
    assert jobs["RUNNING"] == 2 and jobs["PROVISIONING"] == 1 and sum(jobs.values()) == 3
    assert [labels for labels, _ in points("respawn_losses", entries)] == [
        {"zone": "us-central1-a", "cause": "preempted", "bucket": BUCKET}]
    assert [labels["zone"] for labels, _ in points("respawn_stockouts", entries)] == ["us-central1-a"] * 2
    ((labels, latency),) = points("respawn_recovery_seconds", entries)
    assert labels["cause"] == "preempted" and latency == h.status("llm").ledger.losses[0].recovery_s > 0
    (goodput,) = [v for _, v in points("respawn_goodput", entries)]
    assert 0 < goodput < 1
    (cost,) = [v for _, v in points("respawn_cost_dollars", entries)]
    (on_demand,) = [v for _, v in points("respawn_on_demand_dollars", entries)]
    assert on_demand > cost > 0
    assert [v for _, v in points("respawn_accelerators_running", entries)] == [3]  # one L4, two A100s


def test_a_metric_selects_only_respawns_functions_entries():
    """A VM's account may write logs (roles/logging.logWriter): an entry of another resource, or of
    another service, with the same fields is not counted."""
    payload = {fleet.KIND: "loss", "zone": "z", "cause": "preempted", "bucket": BUCKET, "job": "x", "attempt": 1}
    vm = {"resource": {"type": "gce_instance", "labels": {}}, "jsonPayload": payload}
    other = {"resource": {"type": "cloud_run_revision", "labels": {"service_name": "someone-else"}}, "jsonPayload": payload}
    ours = {"resource": {"type": "cloud_run_revision", "labels": {"service_name": "respawn-on-audit"}},
            "jsonPayload": payload}
    assert points("respawn_losses", [vm, other, ours]) == [({"zone": "z", "cause": "preempted", "bucket": BUCKET}, 1)]


# -- the metrics as the Logging API takes them ----------------------------------------------------------------

@pytest.fixture(scope="module")
def logging_api() -> Iterator[LoggingServer]:
    with LoggingServer() as server:
        yield server


@pytest.mark.parametrize("path", deploy.metric_files(), ids=lambda p: p.stem)
def test_each_metric_file_is_a_log_metric_the_logging_api_takes(logging_api, path: Path):
    body = yaml.safe_load(path.read_text())
    url = f"{logging_api.endpoint}/v2/projects/p/metrics/{path.stem}"
    answer = requests.put(url, json=body, timeout=10)
    assert answer.status_code == 200, answer.text
    kept = requests.get(url, timeout=10).json()
    assert kept["metricDescriptor"]["type"] == f"logging.googleapis.com/user/{path.stem}"
    assert {k: kept[k] for k in body if k != "metricDescriptor"} == {k: v for k, v in body.items()
                                                                     if k != "metricDescriptor"}
    assert kept["metricDescriptor"]["labels"] == body["metricDescriptor"]["labels"]
    assert body["metricDescriptor"]["metricKind"] == "DELTA"
    assert ("valueExtractor" in body) == (body["metricDescriptor"]["valueType"] == "DISTRIBUTION")


@pytest.mark.parametrize("change, says", [
    ({"valueExtractor": "EXTRACT(jsonPayload.zone)"}, "counter metric has no valueExtractor"),
    ({"labelExtractors": {"region": "EXTRACT(jsonPayload.zone)"}}, "labels the descriptor does not have"),
    ({"filter": 'jsonPayload.x=~"re"'}, "Invalid query"),
    ({"metricDescriptor": {"metricKind": "GAUGE", "valueType": "INT64"}}, "log-based metrics are DELTA"),
])
def test_the_logging_stand_in_refuses_a_metric_google_would_refuse(logging_api, change, says):
    body = {**metric("respawn_losses"), **change}
    answer = requests.post(f"{logging_api.endpoint}/v2/projects/p/metrics", json={"name": "bad", **body}, timeout=10)
    assert answer.status_code == 400 and says in answer.json()["error"]["message"], answer.text


def test_a_recovery_of_unknown_time_is_a_loss_counted_but_no_latency_read():
    change = fleet.Change(fleet.RECOVERY, "j", "z", "preempted", 2, None)
    entry = {"resource": {"type": "cloud_run_revision", "labels": {"service_name": deploy.TICK}},
             "jsonPayload": {**fleet.change_entry(change), "bucket": BUCKET}}
    assert "latency_s" not in entry["jsonPayload"]
    assert points("respawn_recovery_seconds", [entry]) == []  # never a 0 s recovery


def test_an_empty_fleet_has_every_phase_at_zero_and_no_goodput_rather_than_a_zero_one(h):
    f = fleet.figures([], h.clock.now())
    assert Counter({e["phase"]: e["jobs"] for e in fleet.phase_entries(f)}) == Counter({p.value: 0 for p in Phase})
    assert "goodput" not in fleet.fleet_entry(f)  # none known: absent (the metric skips it), never a 0
