"""Names and the bucket contract: deterministic, and hostile object names go nowhere."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, strategies as st

from controller.core import names
from controller.core.names import ObjectRef, parse_object_name


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
        ("jobs/llm/nodes/3/exit", ObjectRef("llm", "exit", 3)),
        ("jobs/llm/nodes/999999/exit", ObjectRef("llm", "exit", 999999)),
        ("jobs/llm/nodes/0/exit", None),  # rank 0's record is jobs/llm/exit
        ("jobs/llm/nodes/03/exit", None),
        ("jobs/llm/nodes/1000000/exit", None),
        ("jobs/llm/nodes/3/heartbeat", None),
        ("jobs/llm/nodes/3/exit/x", None),
        ("jobs/llm/other/3/exit", None),
        ("checkpoints/llm/100/commit_success.txt", None),
        ("", None),
    ],
)
def test_object_names_map_to_jobs(name, ref):
    assert parse_object_name(name) == ref


def test_each_worker_has_its_own_exit_record_that_parses_back_to_its_rank():
    keys = {names.node_exit_key("llm", rank) for rank in range(1, 50)}
    assert len(keys) == 49 and names.exit_key("llm") not in keys
    assert all(k.startswith(names.node_exits_prefix("llm")) for k in keys)
    assert parse_object_name(names.node_exit_key("llm", 7)) == ObjectRef("llm", "exit", 7)


def test_instance_names():
    assert names.instance_name("llm", 3) == "llm-3"
    assert names.node_names("llm", 3, 1) == ["llm-3"]
    assert names.node_names("llm", 3, 2) == ["llm-3-n0", "llm-3-n1"]


def test_gang_node_and_single_vm_of_look_alike_jobs_never_share_a_name():
    # Regression: gang "a" attempt 1 node 1 and job "a-1" attempt 1 were both "a-1-1".
    assert names.instance_name("a", 1, 1) != names.instance_name("a-1", 1)


@given(
    job=st.from_regex(r"[a-z]([-a-z0-9n]{0,10}[a-z0-9])?", fullmatch=True),
    attempt=st.integers(1, 999_999),
    rank=st.none() | st.integers(0, 9999),
)
def test_instance_names_are_injective(job, attempt, rank):
    """Reading a name back gives exactly what made it, so no two (job, attempt, rank) collide."""
    name = names.instance_name(job, attempt, rank)
    assert names.parse_instance_name(name) == (job, attempt, rank)
    if len(job) <= names.MAX_JOB_NAME:
        assert len(names.instance_name(job + "x" * (names.MAX_JOB_NAME - len(job)), 999_999, 9999)) <= 63


def test_request_id_is_a_deterministic_uuid():
    a = names.request_id("llm", 3, 0)
    assert a == names.request_id("llm", 3, 0)
    assert uuid.UUID(a).version == 5
    assert len({a, names.request_id("llm", 4, 0), names.request_id("llm", 3, 1), names.request_id("llm2", 3, 0)}) == 4


def test_a_job_s_shard_is_the_same_in_every_process_and_spreads_jobs_evenly():
    # sha256 of the name: a fixed value here would differ under Python's salted hash()
    assert names.shard_of("llm", 256) == int.from_bytes(__import__("hashlib").sha256(b"llm").digest()[:8], "big") % 256
    counts = [0] * 8
    for i in range(8000):
        counts[names.shard_of(f"job-{i}", 8)] += 1
    assert min(counts) > 900 and max(counts) < 1100


@given(st.from_regex(r"[a-z][-a-z0-9]{0,20}[a-z0-9]", fullmatch=True), st.integers(0, 8))
def test_the_shard_label_selects_the_job_s_shard_for_every_number_of_shards(job, bits):
    import re

    k = 1 << bits
    label = names.shard_label(job)
    assert len(label) == names.SHARD_BITS and set(label) <= {"0", "1"}
    matches = [s for s in range(k) if re.fullmatch(names.shard_suffix(s, k), label)]
    assert matches == [names.shard_of(job, k)]


@pytest.mark.parametrize("k", [0, 3, 12, 512, -2])
def test_a_number_of_shards_that_is_no_power_of_two_up_to_the_label_s_range_is_refused(k):
    assert names.shards_problem(k)
    with pytest.raises(ValueError):
        names.shard_of("llm", k)


def test_a_tpu_slice_hosts_name_reads_as_its_job_and_attempt_and_nothing_else_does():
    assert names.parse_slice_host("train-3-w-ab12") == ("train", 3)
    assert names.parse_slice_host("train-3-w-1234") == ("train", 3)  # not job "train-3-w", attempt 1234
    assert names.parse_slice_host("a-1-2-w-zz9x") == ("a-1", 2)
    for other in ("train-3", "train-3-n1", "train-3-w-abc", "train-3-w-ABCD", "train-0-w-abcd", "t1v-n-1f-w-0",
                  "train-3-n1-w-abcd"):
        assert names.parse_slice_host(other) is None, other
