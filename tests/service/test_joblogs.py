"""`respawn logs` against hostile or skewed inputs (found by attacking issue 11's change)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from controller.cli import joblogs
from controller.core.state import JobStatus, Phase
from tests.harness import Harness, spec_doc

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def _entry(ts: datetime, iid: str, text: str, insert_id: str) -> SimpleNamespace:
    return SimpleNamespace(timestamp=ts, insert_id=insert_id, payload=text, log_name=f"projects/p/logs/{joblogs.SERIAL}",
                           resource=SimpleNamespace(labels={"instance_id": iid}))


class FakeClient:
    """Cloud Logging's list_entries over a list, honouring the query's ids and its start."""

    def __init__(self) -> None:
        self.entries: list[SimpleNamespace] = []

    def list_entries(self, resource_names, filter_, order_by, max_results, page_size):  # noqa: ANN001
        since = filter_.split('timestamp>="')[1].rstrip('"') if 'timestamp>="' in filter_ else None
        out = [e for e in self.entries if f'"{e.resource.labels["instance_id"]}"' in filter_
               and (since is None or e.timestamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ") >= since)]
        out.sort(key=lambda e: e.timestamp, reverse="desc" in order_by)
        return out[:max_results] if max_results else out


def test_one_vm_whose_clock_runs_ahead_does_not_silence_the_next_attempt_when_following():
    client, out = FakeClient(), []
    first, second = joblogs.Attempt(1, {"j-1": "111"}), joblogs.Attempt(2, {"j-2": "222"})
    client.entries.append(_entry(T0 + timedelta(minutes=10), "111", "first line", "i1"))  # its VM's clock, ahead
    logs = joblogs.JobLogs(client, "j", ["p"], out.append, lambda s: s)
    logs.print_all([first], T0 - timedelta(hours=1))
    client.entries += [_entry(T0 + timedelta(minutes=1, seconds=k), "222", f"second line {k}", f"i2-{k}") for k in range(5)]
    logs.follow(lambda: [first, second], T0 - timedelta(hours=1), interval=0, stop_after=0.05, sleep=lambda s: None)
    assert [line for line in out if "second line" in line] and sum("first line" in line for line in out) == 1


def test_an_id_that_is_not_computes_is_never_quoted_into_the_query():
    query = joblogs.logs_filter(['123" OR resource.type="k8s_container', "456"], ["p"], [joblogs.SERIAL], T0)
    assert "k8s_container" not in query and 'instance_id=("456")' in query
    forged = JobStatus.model_validate({"instance_ids": {"j-1": '1") OR ("x', "j-2": "789"}})
    assert forged.instance_ids == {"j-2": "789"}


def test_a_gang_larger_than_the_ids_kept_records_every_node_of_its_current_attempt():
    h = Harness()
    h.policy = dataclasses.replace(h.policy, max_nodes=64)
    h.submit("g", spec_doc(nodes=60, machine_type="n1-standard-4"))
    for _ in range(3):
        h.tick()
    st = h.status("g")
    assert st.phase == Phase.RUNNING and len(st.instance_ids) == 60 and "g-1-n0" in st.instance_ids
