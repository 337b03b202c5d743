"""respawn/controller.json: the tick's record of its last pass (controller.service.lastpass)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from functions_framework import create_app

from controller.adapters.memory import MemoryStore
from controller.core import errors
from controller.service import bootstrap, lastpass
from controller.service.config import Settings
from tests.harness import BUCKET, Harness

MAIN = str(Path(__file__).resolve().parents[2] / "main.py")


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(lastpass, "_last_write", float("-inf"))
    yield
    bootstrap.override(None)


def tick():
    return create_app("tick", MAIN).test_client().post("/")


def test_the_tick_writes_when_it_ran_how_long_and_its_counts(h: Harness):
    bootstrap.override(h.engine(), Settings(bucket=BUCKET, project="respawn-proj"))
    h.submit("a")
    h.submit("b")
    assert tick().status_code == 200
    record = json.loads(h.store.read(BUCKET, lastpass.KEY).data)
    assert record["last_pass"] == h.clock.now().isoformat()
    assert record["jobs"] == 2 and record["actions"] >= 2 and record["errors"] == 0
    assert 0 <= record["duration_s"] < 60
    last = lastpass.read(h.store, BUCKET)
    assert last is not None and last.at == h.clock.now() and not last.stale(h.clock.now())


class _RefusesTheRecord(MemoryStore):
    def write(self, bucket, name, data, *, if_generation_match=None):
        if name == lastpass.KEY:
            raise errors.TransientError("429 rateLimitExceeded")
        return super().write(bucket, name, data, if_generation_match=if_generation_match)


def test_a_record_that_cannot_be_written_never_fails_the_tick(h: Harness):
    store = _RefusesTheRecord(h.clock)
    bootstrap.override(h.engine(store=store), Settings(bucket=BUCKET, project="respawn-proj"))
    store.put(BUCKET, "jobs/a/spec.yaml", json.dumps({"zones": ["us-central1-a"], "machine_type": "g2-standard-8",
                                                      "command": "true"}))
    response = tick()
    assert response.status_code == 200 and response.get_json()["actions"]["a"]
    assert not store.exists(BUCKET, lastpass.KEY)


def test_a_process_writes_the_record_at_most_once_a_second(h: Harness):
    record = lastpass.LastPass(h.clock.now(), 0.5, 1, 0, 0)
    assert lastpass.write(h.store, BUCKET, record) is True
    assert lastpass.write(h.store, BUCKET, record) is False  # GCS: about one write a second per object
    assert [c for c in h.store.calls if c == ("write", lastpass.KEY)] == [("write", lastpass.KEY)]


def test_the_record_says_how_long_ago_and_turns_stale_past_three_minutes(h: Harness):
    record = lastpass.LastPass(h.clock.now(), 0.8, 3, 1, 0)
    now = h.clock.now() + timedelta(seconds=40)
    assert record.describe(now) == "controller last ran 40 s ago (0.8 s, 3 jobs, 1 action, 0 errors)"
    assert not record.stale(now)
    assert record.stale(h.clock.now() + timedelta(minutes=3, seconds=1))
    assert lastpass.parse(record.as_json()) == record


def test_no_record_is_none_and_a_broken_one_is_an_error(h: Harness):
    assert lastpass.read(h.store, BUCKET) is None
    h.store.put(BUCKET, lastpass.KEY, "{not json")
    with pytest.raises(ValueError, match="not a controller record"):
        lastpass.read(h.store, BUCKET)


def test_a_record_dated_in_the_future_is_not_believed_and_an_overflowing_one_is_an_error(h: Harness):
    # Any bucket writer can forge the record: one dated in 9999 read "last ran 0 s ago" for ever,
    # hiding a controller that never runs (doctor ✓, status healthy).
    now = h.clock.now()
    forged = lastpass.LastPass(now + timedelta(days=3650), 0.1, 1, 0, 0)
    assert forged.stale(now) and "in the future: not believed" in forged.describe(now)
    assert not lastpass.LastPass(now + timedelta(seconds=20), 0.1, 1, 0, 0).stale(now)  # clocks disagree a little
    h.store.put(BUCKET, lastpass.KEY, b'{"last_pass": "2026-01-01T00:00:00+00:00", "duration_s": 1, '
                                      b'"jobs": 1e400, "actions": 0, "errors": 0}')
    with pytest.raises(ValueError, match="not a controller record"):
        lastpass.read(h.store, BUCKET)


def test_status_does_not_call_a_future_record_healthy(h: Harness):
    from datetime import UTC, datetime

    h.store.put(BUCKET, lastpass.KEY, lastpass.LastPass(datetime(9999, 1, 1, tzinfo=UTC), 1, 0, 0, 0).as_json())
    said = _status(h)
    assert "in the future: not believed" in said and "controller last ran 0 s ago" not in said


# -- respawn status's line ------------------------------------------------------------------------------
def _status(h: Harness) -> str:
    from typer.testing import CliRunner

    from controller.cli.main import app

    bootstrap.override(None, Settings(bucket=BUCKET, project="respawn-proj"), store=h.store, compute=h.compute)
    done = CliRunner().invoke(app, ["status"], env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.output
    return done.output


def test_status_says_when_the_controller_last_ran(h: Harness):
    from datetime import UTC, datetime

    lastpass.write(h.store, BUCKET, lastpass.LastPass(datetime.now(UTC) - timedelta(seconds=40), 0.8, 3, 1, 0))
    assert "controller last ran 40 s ago (0.8 s, 3 jobs, 1 action, 0 errors)" in _status(h)


def test_status_warns_when_the_controller_has_not_run_for_minutes_or_ever(h: Harness):
    from datetime import UTC, datetime

    assert f"controller has not run yet (gs://{BUCKET}/{lastpass.KEY} missing)" in _status(h)
    h.store.put(BUCKET, lastpass.KEY, lastpass.LastPass(datetime.now(UTC) - timedelta(minutes=5), 1, 0, 0, 0).as_json())
    said = _status(h)
    assert "controller last ran 5 min ago" in said and "is its Scheduler job running? respawn doctor tells" in said
