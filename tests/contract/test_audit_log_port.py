"""The AuditLog port's adapter (google-cloud-logging, REST) against the local Logging server: the
tick's one query, as Logging answers it (its filter evaluated, oldest first, paged)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from controller.adapters.auditlog import CloudAuditLog
from controller.adapters.google import logging_client
from controller.core import audit, errors
from controller.service.config import Settings
from controller.core.audit import system_event_entry
from localcloud.logging import LoggingServer

PROJECT = "audit-proj"
T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def server() -> Iterator[LoggingServer]:
    with LoggingServer(reads_per_minute=None) as srv:
        yield srv


def port(server: LoggingServer) -> CloudAuditLog:
    return CloudAuditLog(logging_client(Settings(project=PROJECT, logging_endpoint=server.endpoint)))


def test_the_query_returns_the_system_events_of_the_watched_projects_from_a_time_on_oldest_first(server):
    noise = [
        system_event_entry("elsewhere", "us-central1-a", "a-1", "1", "compute.instances.preempted", T0),
        {**system_event_entry(PROJECT, "us-central1-a", "a-1", "1", "compute.instances.preempted", T0),
         "logName": f"projects/{PROJECT}/logs/cloudaudit.googleapis.com%2Factivity"},
        {"logName": f"projects/{PROJECT}/logs/serialconsole.googleapis.com%2Fserial_port_1_output",
         "resource": {"type": "gce_instance", "labels": {"instance_id": "1"}}, "textPayload": "preempted",
         "timestamp": T0.isoformat()},
        system_event_entry(PROJECT, "us-central1-a", "a-1", "1", "compute.instances.preempted", T0 - timedelta(hours=2)),
    ]
    wanted = [system_event_entry(PROJECT, "us-central1-b", f"j{i}-1", str(i), method, T0 + timedelta(seconds=10 - i))
              for i, method in enumerate(audit.METHODS)]
    server.write([*noise, *wanted])
    found = port(server).system_events([PROJECT, "other-proj"], T0 - timedelta(minutes=1), 100)
    events = [audit.parse_entry(e) for e in found]
    assert [e.instance for e in events] == [f"j{i}-1" for i in reversed(range(len(audit.METHODS)))]
    assert {e.method for e in events} == set(audit.METHODS)
    assert events[0].instance_id == str(len(audit.METHODS) - 1) and events[0].zone == "us-central1-b"


def test_the_query_stops_at_its_limit_across_pages(server):
    server.write([system_event_entry(PROJECT, "us-east1-b", f"p{i}-1", str(i), "compute.instances.preempted",
                                     T0 + timedelta(days=1, seconds=i)) for i in range(30)])
    found = port(server).system_events([PROJECT], T0 + timedelta(days=1), 25)
    assert [audit.parse_entry(e).instance for e in found] == [f"p{i}-1" for i in range(25)]


def test_a_refused_query_is_a_respawn_error():
    dead = CloudAuditLog(logging_client(Settings(project=PROJECT, logging_endpoint="http://127.0.0.1:9")))
    with pytest.raises(errors.RespawnError):
        dead.system_events([PROJECT], T0, 10)
