"""main.py as the platform runs it: functions-framework apps, no server."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent
from functions_framework import create_app

from controller.service import bootstrap
from controller.core import names
from controller.service.config import Settings
from controller.core.errors import ConfigError, TransientError
from controller.core.state import Phase
from tests.harness import BUCKET, Harness

MAIN = str(Path(__file__).resolve().parents[2] / "main.py")


@pytest.fixture
def wired(h: Harness) -> Harness:
    bootstrap.override(h.engine(), Settings(bucket=BUCKET, project="respawn-proj"))
    return h


def post_event(name: str, bucket: str = BUCKET, generation: str = "1"):
    client = create_app("on_object", MAIN, "cloudevent").test_client()
    event = CloudEvent(
        {"type": "google.cloud.storage.object.v1.finalized", "source": f"//storage.googleapis.com/projects/_/buckets/{bucket}",
         "subject": f"objects/{name}"},
        {"bucket": bucket, "name": name, "generation": generation},
    )
    headers, body = to_binary(event)
    return client.post("/", headers=headers, data=body)


def test_tick_reconciles_every_job_and_returns_a_summary(wired):
    wired.submit("a")
    wired.submit("b")
    client = create_app("tick", MAIN).test_client()
    response = client.post("/")
    assert response.status_code == 200
    body = response.get_json()
    assert set(body["actions"]) == {"a", "b"} and body["errors"] == {}
    assert wired.live() == ["a-1", "b-1"]


def test_on_object_reconciles_only_that_job(wired):
    wired.submit("a")
    wired.submit("b")
    response = post_event(names.spec_key("a"))
    assert response.status_code == 200
    assert wired.live() == ["a-1"]


def test_duplicate_and_late_events_change_nothing(wired):
    wired.submit("a")
    for _ in range(3):
        assert post_event(names.spec_key("a")).status_code == 200
    wired.tick()
    assert post_event(names.spec_key("a"), generation="0").status_code == 200
    assert wired.live() == ["a-1"] and wired.status("a").attempt == 1


def test_marker_event_recovers_within_the_event(wired):
    wired.submit("a")
    wired.tick()
    wired.tick()
    wired.compute.preempt("a-1")
    wired.marker("a")
    assert post_event(names.marker_key("a")).status_code == 200
    assert wired.live() == ["a-2"]


@pytest.mark.parametrize("name", ["checkpoints/a/100/x", "jobs/a/status.json", "jobs/a/heartbeat", "", "jobs/../x"])
def test_objects_outside_the_contract_are_ignored(wired, name):
    wired.submit("a")
    assert post_event(name).status_code == 200
    assert wired.live() == []


def test_event_from_another_bucket_is_ignored(wired):
    wired.submit("a")
    assert post_event(names.spec_key("a"), bucket="elsewhere").status_code == 200
    assert wired.live() == []


def test_transient_failure_raises_so_the_platform_retries(wired):
    wired.submit("a")
    wired.compute.faults.fail_next("insert", TransientError("503"))
    assert post_event(names.spec_key("a")).status_code == 500
    assert post_event(names.spec_key("a")).status_code == 200
    assert wired.live() == ["a-1"]


def test_terminal_error_is_absorbed(wired):
    from controller.core.errors import RequestError

    wired.submit("a")
    wired.compute.faults.fail_next("insert", RequestError("bad image"), times=2)  # in both zones
    assert post_event(names.spec_key("a")).status_code == 200
    assert wired.status("a").phase == Phase.FAILED


def test_misconfigured_controller_is_reported_not_crashed():
    client = create_app("tick", MAIN).test_client()
    response = client.post("/")
    assert response.status_code == 500 and "RESPAWN_BUCKET" in response.get_json()["error"]
    assert post_event(names.spec_key("a")).status_code == 200


@pytest.fixture
def collector():
    """The process's collector as it was, put back after the test (the engine sets it)."""
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    bootstrap.override(None)
    yield
    bootstrap.override(None)
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    (gc.enable if enabled else gc.disable)()


def test_the_engine_is_built_with_the_collector_paused_then_freezes_and_tunes_it(collector, monkeypatch):
    seen = []

    def build(config):
        seen.append(gc.isenabled())
        return "engine"

    monkeypatch.setattr(bootstrap, "build", build)
    monkeypatch.setattr(bootstrap, "settings", lambda: Settings(bucket=BUCKET, project="respawn-proj"))
    gc.enable()
    assert bootstrap.engine() == "engine" and bootstrap.engine() == "engine"
    assert seen == [False]  # paused while built, built once
    assert gc.isenabled() and gc.get_threshold() == bootstrap.collector.THRESHOLDS and gc.get_freeze_count() > 0


def test_an_engine_that_cannot_be_built_leaves_the_collector_running_as_it_was(collector, monkeypatch):
    def build(config):
        raise ConfigError("no bucket")

    monkeypatch.setattr(bootstrap, "build", build)
    monkeypatch.setattr(bootstrap, "settings", lambda: Settings(bucket=BUCKET, project="respawn-proj"))
    gc.enable()
    with pytest.raises(ConfigError):
        bootstrap.engine()
    assert gc.isenabled()


def test_main_tunes_the_collector_before_the_controller_loads():
    """The controller's modules define hundreds of classes; a cold start imports them at the tuned
    thresholds, not CPython's (controller/service/collector.py)."""
    import subprocess
    import sys

    probe = (
        "import gc, sys\n"
        "seen = []\n"
        "class Spy:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'controller.service.bootstrap':\n"
        "            seen.append(gc.get_threshold())\n"
        "sys.meta_path.insert(0, Spy())\n"
        "import main\n"
        "from controller.service import collector\n"
        "assert seen == [collector.THRESHOLDS], seen\n"
        "assert gc.get_threshold() == collector.THRESHOLDS\n")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
