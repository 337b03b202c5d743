"""`respawn logs` against hostile or skewed inputs (found by attacking issue 11's change)."""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from controller.cli import joblogs
from controller.core.state import JobStatus, Phase
from tests.harness import Harness, spec_doc, tpu_spec_doc

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def _entry(ts: datetime, iid: str, text: str, insert_id: str) -> SimpleNamespace:
    return SimpleNamespace(timestamp=ts, insert_id=insert_id, payload=text, log_name=f"projects/proj-p/logs/{joblogs.SERIAL}",
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
    logs = joblogs.JobLogs(client, "j", ["proj-p"], out.append, lambda s: s)
    logs.print_all([first], T0 - timedelta(hours=1))
    client.entries += [_entry(T0 + timedelta(minutes=1, seconds=k), "222", f"second line {k}", f"i2-{k}") for k in range(5)]
    logs.follow(lambda: [first, second], T0 - timedelta(hours=1), interval=0, stop_after=0.05, sleep=lambda s: None)
    assert [line for line in out if "second line" in line] and sum("first line" in line for line in out) == 1


def test_an_id_that_is_not_computes_is_never_quoted_into_the_query():
    query = joblogs.logs_filter(['123" OR resource.type="k8s_container', "456"], ["proj-p"], [joblogs.SERIAL], T0)
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


def test_logs_that_find_nothing_say_which_log_which_setting_and_which_role_are_missing():
    """A project set up as `respawn deploy` once left it writes neither log: the reader says which log
    it looked for, the metadata key and the role each needs, and the command that fixes each."""
    out: list[str] = []
    reader = joblogs.JobLogs(FakeClient(), "j", ["proj-p"], out.append, lambda s: s,
                             account="respawn-trainer@proj-p.iam.gserviceaccount.com")
    reader.print_all([joblogs.Attempt(1, {"j-1": "111"})], T0)
    text = "\n".join(out)
    assert "(no output in Cloud Logging)" in text
    assert "serialconsole.googleapis.com/serial_port_1_output" in text and "serial-port-logging-enable=TRUE" in text
    assert "gcloud compute project-info add-metadata --metadata=serial-port-logging-enable=TRUE --project=proj-p" in text
    assert joblogs.SCRIPTS in text and "roles/logging.logWriter" in text
    assert ("gcloud projects add-iam-policy-binding proj-p --member=serviceAccount:respawn-trainer@proj-p.iam."
            "gserviceaccount.com --role=roles/logging.logWriter") in text


def test_a_project_that_is_not_a_project_id_is_refused_before_any_query():
    from controller.core import errors

    client = FakeClient()
    for forged in ('proj-p/logs/x" OR logName:"', "proj-p) OR (true", "Proj-Upper", "short", "ends-with-hyphen-",
                   "a" * 31, "1starts-with-digit", "evil.com:proj-p/x"):
        with pytest.raises(errors.RequestError, match="not a project id"):
            joblogs.JobLogs(client, "j", [forged], print, str)
        with pytest.raises(errors.RequestError):
            joblogs.logs_filter(["1"], [forged], [joblogs.SERIAL])
    # a domain-scoped project id is one (projects/example.com:proj-p is a valid resource name)
    assert joblogs.JobLogs(client, "j", ["example.com:proj-p", "proj-p"], print, str).projects == [
        "example.com:proj-p", "proj-p"]


def test_a_status_of_a_tpu_attempt_makes_it_read_as_tpu_workers_by_node_name():
    st = JobStatus.model_validate({"attempt": 2, "tpu": True, "attempt_tpu": True,
                                   "instance_ids": {"tj-1": "9001", "tj-2": "9002"}})
    runs = joblogs.attempts("tj", st)
    assert [(a.number, a.tpu) for a in runs] == [(1, None), (2, True)]  # attempt 1: a VM or a node, not known
    query = joblogs.logs_filter(["9001"], ["proj-p"], [joblogs.SERIAL], T0, nodes=["tj-1", "tj-2"])
    assert ('((resource.type="gce_instance" AND resource.labels.instance_id=("9001")) OR '
            '(resource.type="tpu_worker" AND resource.labels.node_id=("tj-1" OR "tj-2")))') in query
    assert 'node_id=("x")' in joblogs.logs_filter([], [], [], nodes=['x', 'y" OR "z'])  # only a node name is quoted


def test_the_pace_keeps_reads_under_the_per_minute_budget():
    now, slept = [0.0], []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    pace = joblogs.Pace(3, clock=lambda: now[0], sleep=sleep)
    for _ in range(7):
        pace.wait()
        now[0] += 1.0
    assert slept == [57.0, 57.0]  # reads 4 and 7 wait until the first of the three before them is a minute old


def test_the_delay_a_refusal_names_is_the_one_waited():
    from google.api_core import exceptions as gexc
    from google.rpc import error_details_pb2

    rest = gexc.TooManyRequests("quota", details=[{"@type": "type.googleapis.com/google.rpc.ErrorInfo"},
                                                  {"@type": "type.googleapis.com/google.rpc.RetryInfo",
                                                   "retryDelay": "12.5s"}])
    info = error_details_pb2.RetryInfo()
    info.retry_delay.seconds, info.retry_delay.nanos = 3, 500_000_000
    grpc = gexc.ResourceExhausted("quota", details=[info])
    header = gexc.TooManyRequests("quota", response=SimpleNamespace(headers={"Retry-After": "7"}))
    assert [joblogs.server_delay(e) for e in (rest, grpc, header, gexc.TooManyRequests("quota"))] == [12.5, 3.5, 7.0, None]


def test_every_vm_and_tpu_node_respawn_launches_turns_on_serial_port_logging():
    """Serial-port logging is off by default in Google projects: respawn's VMs and TPU nodes set it in
    their own metadata, so their console reaches Cloud Logging whatever the project says."""
    from controller.core import launch
    from controller.core.spec import parse_spec

    h = Harness()
    h.submit("sp", spec_doc())
    h.tick()
    assert h.metadata("sp-1")["serial-port-logging-enable"] == "TRUE"
    doc = tpu_spec_doc(zones=["us-central2-b"], tpu={"type": "v4-8", "runtime_version": "tpu-ubuntu2204-base"})
    (node,) = launch.requests_for("tp", parse_spec(json.dumps(doc), "tp"), JobStatus(attempt=1), h.ctx)
    assert node.metadata["serial-port-logging-enable"] == "TRUE"


class LoggingWithItsFilterLimit(FakeClient):
    """Cloud Logging refuses a filter past 20,000 characters (400 InvalidArgument)."""

    def list_entries(self, resource_names, filter_, order_by, max_results, page_size):  # noqa: ANN001
        from google.api_core import exceptions as gexc

        if len(filter_) > 20_000:
            raise gexc.InvalidArgument(f"filter is {len(filter_)} characters; at most 20000")
        return super().list_entries(resource_names, filter_, order_by, max_results, page_size)


def test_the_logs_of_a_gang_of_a_thousand_nodes_are_read_within_loggings_filter_limit():
    """A spec may ask for 1000 nodes, and the status records every id of the current attempt: one
    query naming them all is 25,000 characters, which Cloud Logging refuses."""
    client, out = LoggingWithItsFilterLimit(), []
    ids = {f"g-1-n{k}": str(7_000_000_000_000_000_000 + k) for k in range(1000)}
    client.entries += [_entry(T0 + timedelta(seconds=k), ids[f"g-1-n{k}"], f"rank {k} says hi", f"i{k}")
                       for k in (0, 500, 999)]
    reader = joblogs.JobLogs(client, "g", ["proj-p"], out.append, lambda s: s)
    reader.print_all([joblogs.Attempt(1, ids)], T0 - timedelta(hours=1))
    lines = [line for line in out if "says hi" in line]
    assert [line.split()[-3] for line in lines] == ["0", "500", "999"], out[:5]


# -- as a terminal shows them (issue 26: progress-bar noise, two timestamps a line) --------------

def _printed(*texts: str, at: datetime = T0) -> list[str]:
    client, out = FakeClient(), []
    client.entries += [_entry(at + timedelta(seconds=k), "111", text, f"i{k}") for k, text in enumerate(texts)]
    joblogs.JobLogs(client, "j", ["proj-p"], out.append, lambda s: s).print_all(
        [joblogs.Attempt(1, {"j-1": "111"})], at - timedelta(hours=1))
    return out[1:]  # after the attempt's header


def test_carriage_return_updates_show_only_their_last_state():
    bar = ("Writing model shards:   0%|          | 0/4 [00:00<?, ?it/s]\r"
           "Writing model shards:  50%|#####     | 2/4 [00:01<00:01, 1.9it/s]\r"
           "Writing model shards: 100%|##########| 4/4 [00:02<00:00, 1.9it/s]")
    lines = _printed(bar, "a\rb", "left as it was\r", "\rloading 1/3\rloading 3/3\r", "step 10\r\n")
    texts = [line.split(" j-1 ", 1)[1] for line in lines]
    assert texts == ["Writing model shards: 100%|##########| 4/4 [00:02<00:00, 1.9it/s]", "b", "left as it was",
                     "loading 3/3", "step 10"]
    assert not any("\r" in line for line in lines)
    assert joblogs.as_shown("x\r   \ry\r  ") == "y"  # a bar cleared with spaces, then redrawn


def test_each_log_line_has_one_timestamp_and_the_agents_lines_fit_80_columns():
    """The entry's time is the one kept, ``MM-DD HH:MM:SS`` (UTC): the agent's own ISO stamp (or a
    trainer's logging stamp) within a minute of it says nothing more. 80 columns: a newcomer's
    terminal; the prefix (14 + the instance name) leaves the agent's usual lines whole in it."""
    at = datetime(2025, 1, 1, 12, 0, 3, 412000, tzinfo=UTC)
    lines = _printed("respawn: 2025-01-01T12:00:03.281Z trainer started (pid 4242), resuming from step 100",
                     "2025-01-01 12:00:04,007 INFO step 110 loss 2.31",
                     "2019-06-30 00:00:00 is when the data's snapshot was taken",
                     at=at)
    assert lines[0] == "01-01 12:00:03 j-1 respawn: trainer started (pid 4242), resuming from step 100"
    assert lines[1] == "01-01 12:00:04 j-1 INFO step 110 loss 2.31"
    # a time far from the entry's is what the line says, not when it was written: kept
    assert lines[2] == "01-01 12:00:05 j-1 2019-06-30 00:00:00 is when the data's snapshot was taken"
    stamp = r"\d{2}:\d{2}:\d{2}"
    assert all(len(re.findall(stamp, line)) == 1 for line in lines[:2]) and max(map(len, lines)) <= 80


# -- the dashboard's reader: a job's last lines, never waiting -------------------------------------------------

def _recent(client: FakeClient, made: list[int], per_minute: int = 20, now: list[float] | None = None):
    from controller.adapters.gcs import translated

    status = JobStatus.model_validate({"phase": "RUNNING", "attempt": 2, "project": "proj-p", "created_at": T0,
                                       "instance_ids": {"j-1": "111", "j-2": "222"}})

    def make() -> FakeClient:
        made.append(1)
        return client
    clock = now or [0.0]
    return joblogs.Recent(lambda job: status if job == "j" else None, make, "proj-p",
                          guard=lambda: translated("Cloud Logging"),  # as `respawn dashboard` builds it
                          lines=40, per_minute=per_minute, clock=lambda: clock[0], now=lambda: T0 + timedelta(hours=1))


def test_the_dashboards_reader_gives_the_last_40_lines_of_the_run_as_respawn_logs_prints_them():
    client, made = FakeClient(), []
    client.entries += [_entry(T0 + timedelta(seconds=k), "111", f"trainer: step {k}", f"a{k}") for k in range(30)]
    client.entries += [_entry(T0 + timedelta(minutes=5, seconds=k), "222",
                              f"{T0 + timedelta(minutes=5, seconds=k):%Y-%m-%dT%H:%M:%SZ} 10%\r"
                              f"{T0 + timedelta(minutes=5, seconds=k):%Y-%m-%dT%H:%M:%SZ} \x1b[31m{k}", f"b{k}")
                       for k in range(20)]
    recent = _recent(client, made)
    lines = recent("j")
    assert len(lines) == 40 and made == [1]
    assert "── attempt 2: j-2" in lines[19]  # attempt 1's last 19 lines, attempt 2's header, its 20 lines
    assert lines[:19] == [f"01-01 12:00:{k:02d} j-1 trainer: step {k}" for k in range(11, 30)]
    assert lines[20] == "01-01 12:05:00 j-2 \\x1b[31m0"  # one stamp, the bar's last state, control characters escaped
    assert lines[-1] == "01-01 12:05:19 j-2 \\x1b[31m19"
    assert recent("j") == lines and made == [1]  # the client is made once
    assert recent("nope") == ["(no instance of nope has been seen yet: nothing is logged)"]


def test_the_dashboards_reader_never_waits_a_quota_refusal_or_its_own_pace_is_an_error_at_once():
    from google.api_core import exceptions as gexc

    from controller.core import errors

    class Refusing(FakeClient):
        calls = 0

        def list_entries(self, *args, **kwargs):  # noqa: ANN002, ANN003
            self.calls += 1
            raise gexc.TooManyRequests("Quota exceeded", details=[{"@type": "type.googleapis.com/google.rpc.RetryInfo",
                                                                   "retryDelay": "20s"}])

    refusing = Refusing()
    with pytest.raises(errors.TransientError) as refused:
        _recent(refusing, [])("j")
    said = str(refused.value)  # Logging's own words, not a retry's "Timeout of 0.0s exceeded"
    assert said.startswith("429 Quota exceeded") and said.endswith("(Cloud Logging)") and "Timeout" not in said
    assert refusing.calls == 1  # not tried again: the page shows why, and asks again in 30 s
    client, now = FakeClient(), [0.0]
    client.entries.append(_entry(T0, "111", "a line", "a"))
    recent = _recent(client, [], per_minute=2, now=now)
    recent("j")
    recent("j")
    with pytest.raises(errors.TransientError, match="pace of Cloud Logging reads is spent: again in 60 s"):
        recent("j")
    now[0] += 60
    assert "01-01 12:00:00 j-1 a line" in recent("j")


def test_logs_serial_never_asks_compute_in_a_project_a_forged_status_names_and_says_why(monkeypatch):
    from typer.testing import CliRunner

    from controller.cli import main
    from controller.core import names
    from tests.harness import BUCKET, PROJECT, under_cli

    h = under_cli(monkeypatch)
    h.submit("j")
    h.tick("j")
    asked: list[str] = []
    monkeypatch.setattr(main, "_serial_output", lambda config, project, zone, name: asked.append(project) or "boot")
    forged = json.loads(h.store.read(BUCKET, names.status_key("j")).data)
    forged["project"] = "someone-elses"  # anyone who may write the bucket may write this
    h.store.put(BUCKET, names.status_key("j"), json.dumps(forged))
    h.compute.vanish("j-1")  # no live VM: its console is looked for where the status says
    result = CliRunner().invoke(main.app, ["logs", "j", "--serial"])
    assert result.exit_code == 2 and asked == [], result.output
    said = " ".join(result.output.split())
    assert "refusing to read j's VM output in project 'someone-elses', which its status.json names" in said
    assert f"this controller watches {PROJECT}" in said

    forged["project"] = PROJECT  # a watched project is read as before
    h.store.put(BUCKET, names.status_key("j"), json.dumps(forged))
    result = CliRunner().invoke(main.app, ["logs", "j", "--serial"])
    assert result.exit_code == 0 and asked == [PROJECT], result.output


# -- zero-gap recovery: each attempt's header says how it stood beside another (issue 34) ------------

def _zero_gap() -> Harness:
    """demo-1 in us-central1-a gets a preemption notice: demo-2 boots beside it in us-central1-b."""
    h = Harness()
    h.submit("demo", spec_doc(zones=["us-central1-a", "us-central1-b", "us-central1-c"]))
    h.tick()
    h.tick()
    h.notice("demo")
    h.tick("demo")
    return h


def _headers(h: Harness) -> list[str]:
    from tests.harness import PROJECT

    live = h.compute.list_managed([PROJECT], "demo").instances
    return [line for a in joblogs.attempts("demo", h.status("demo"), live) for line in a.header().splitlines()]


def test_a_standbys_logs_are_headed_as_the_standby_booted_at_the_old_attempts_notice():
    h = _zero_gap()
    accepted = h.status("demo").standby.inserted_at
    assert _headers(h) == ["── attempt 1: demo-1 in us-central1-a (running) ──",
                           "── attempt 2: demo-2 in us-central1-b (standby) ──",
                           f"   booted from {accepted:%H:%M:%S} at demo-1's notice; waits at the starting line"]


def test_a_standby_given_the_go_is_headed_with_when_and_from_which_step_within_80_columns():
    from controller.core.ports import InstanceStatus

    h = _zero_gap()
    h.advance(seconds=40)
    h.checkpoint(1200)
    h.compute.set_status("demo-1", InstanceStatus.STOPPING)
    h.marker("demo")
    h.tick("demo")
    st = h.status("demo")
    headers = _headers(h)
    assert headers[1:] == ["── attempt 2: demo-2 in us-central1-b (provisioning) ──",
                           f"   booted from {st.inserted_at:%H:%M:%S} at demo-1's notice; the go at {st.go_at:%H:%M:%S}, "
                           "from step 1,200"]
    assert all(len(line) <= 80 for line in headers), headers


def test_a_withdrawn_standby_still_listed_is_headed_as_one_that_never_ran_a_trainer():
    from tests.harness import PROJECT

    h = _zero_gap()
    h.advance(seconds=120 + 36)  # demo-1 still RUNNING past the line's bound: the notice came to nothing
    live = h.compute.list_managed([PROJECT], "demo").instances  # as listed before its delete landed
    h.tick("demo")
    runs = joblogs.attempts("demo", h.status("demo"), live)
    assert h.status("demo").withdrawn == 2
    assert runs[1].header().splitlines() == ["── attempt 2: demo-2 in us-central1-b (withdrawn standby) ──",
                                             f"   withdrawn at {h.clock.now():%H:%M:%S}, before its go: no trainer ran"]
