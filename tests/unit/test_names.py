"""Names and the bucket contract: deterministic, and hostile object names go nowhere."""

from __future__ import annotations

import uuid

import pytest

from controller import names
from controller.names import ObjectRef, parse_object_name


@pytest.mark.parametrize(
    "name, ref",
    [
        ("jobs/llm/spec.yaml", ObjectRef("llm", "spec")),
        ("jobs/llm/cancel", ObjectRef("llm", "cancel")),
        ("jobs/llm/status.json", ObjectRef("llm", "status")),
        ("jobs/llm/exit", ObjectRef("llm", "exit")),
        ("jobs/llm/heartbeat", ObjectRef("llm", "heartbeat")),
        ("preempted-jobs/llm", ObjectRef("llm", "marker")),
        ("jobs/llm/spec.yaml.bak", None),
        ("jobs/llm/sub/spec.yaml", None),
        ("jobs//spec.yaml", None),
        ("preempted-jobs/a/b", None),
        ("checkpoints/llm/100/commit_success.txt", None),
        ("", None),
    ],
)
def test_object_names_map_to_jobs(name, ref):
    assert parse_object_name(name) == ref


def test_instance_names():
    assert names.instance_name("llm", 3) == "llm-3"
    assert names.node_names("llm", 3, 1) == ["llm-3"]
    assert names.node_names("llm", 3, 2) == ["llm-3-0", "llm-3-1"]


def test_request_id_is_a_deterministic_uuid():
    a = names.request_id("llm", 3, 0)
    assert a == names.request_id("llm", 3, 0)
    assert uuid.UUID(a).version == 5
    assert len({a, names.request_id("llm", 4, 0), names.request_id("llm", 3, 1), names.request_id("llm2", 3, 0)}) == 4
