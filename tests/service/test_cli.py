"""The respawn CLI (more commands arrive with the CLI issue)."""

from __future__ import annotations

import yaml
from typer.testing import CliRunner

from controller.cli.main import app
from tests.harness import spec_doc, tpu_spec_doc

runner = CliRunner()


def test_validate_accepts_the_example_spec():
    result = runner.invoke(app, ["validate", "examples/llm-finetune.yaml"])
    assert result.exit_code == 0, result.output
    assert "llm-finetune: valid" in result.output


def test_validate_names_each_bad_field_and_exits_2(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec_doc(nodes="two", policy={"max_restart": 1})))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    lines = [l for l in result.output.splitlines() if l.startswith("✗")]
    assert len(lines) == 2 and any("nodes:" in l for l in lines) and any("policy.max_restart:" in l for l in lines)


def test_validate_applies_the_controller_policy_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RESPAWN_PROJECT", "proj-1")
    monkeypatch.setenv("RESPAWN_TRAINER_SERVICE_ACCOUNT", "t@proj-1.iam.gserviceaccount.com")
    monkeypatch.setenv("RESPAWN_ALLOWED_MACHINE_TYPES", "n2-*")
    path = tmp_path / "j.yaml"
    path.write_text(yaml.safe_dump(spec_doc()))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2 and "machine_type" in result.output and "n2-*" in result.output


# -- over the in-memory store ---------------------------------------------------------------
import json
import re
from datetime import UTC, datetime

import pytest

from controller.service import bootstrap
from controller.core import errors, names
from controller.service.config import Settings
from controller.core.state import Event, JobStatus, Phase
from tests.harness import BUCKET, PROJECT, Harness, under_cli

ESC = "\x1b"


@pytest.fixture
def mem(monkeypatch) -> Harness:
    """The CLI over the in-memory store and compute, on a terminal wide enough for the whole table."""
    h = under_cli(monkeypatch, 400)
    return h


def _spec(tmp_path, **overrides) -> str:
    path = tmp_path / "j.yaml"
    path.write_text(yaml.safe_dump(spec_doc(**overrides)))
    return str(path)


def _one_error_line(result) -> str:
    """A RespawnError ends a command with one line, never a traceback."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


def _put_status(h: Harness, job: str, **fields) -> None:
    h.submit(job)
    st = JobStatus(created_at=datetime(2026, 1, 1, tzinfo=UTC), **fields)
    h.store.put(BUCKET, names.status_key(job), st.to_json())


def test_validate_prints_spec_problems_as_plain_text(tmp_path):
    path = _spec(tmp_path, zones=["us+central", "[/x]", "[key]"])
    result = runner.invoke(app, ["validate", path])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    # what the field should be, in words (never the regular expression), and the values as they are
    assert "zones.0: should be a zone such as us-central1-a" in result.output and "\\d" not in result.output
    assert "(got '[/x]')" in result.output and "(got '[key]')" in result.output


def test_submit_with_markup_in_a_value_exits_2_naming_it(mem, tmp_path):
    result = runner.invoke(app, ["submit", _spec(tmp_path, machine_type="[/x]")])
    assert result.exit_code == 2, result.output
    assert "machine_type" in result.output and "[/x]" in result.output
    assert not mem.store.exists(BUCKET, names.spec_key("j"))


def test_status_prints_cloud_text_as_text_not_markup(mem):
    event = Event(at=datetime(2026, 1, 1, tzinfo=UTC), event="failed", detail="[/x] exit [key] [bold]3[/bold]")
    _put_status(mem, "mark", phase=Phase.RECOVERING, history=(event,))
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 0, result.output
    assert "failed: [/x] exit [key] [bold]3[/bold]" in result.output


def test_status_escapes_control_characters_in_names_and_messages(mem):
    evil = f"evil{ESC}]0;owned{chr(7)}{ESC}[2J\u202e"
    mem.store.put(BUCKET, f"jobs/{evil}/spec.yaml", "zones: [x]")
    detail = f"jobs/{ESC}[31mred{ESC}[0m\r\nforged"
    _put_status(mem, "ctl", phase=Phase.RUNNING, instances=(f"ctl-1{ESC}[A",),
                history=(Event(at=datetime(2026, 1, 1, tzinfo=UTC), event="failed", detail=detail),))
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 0, result.output
    assert ESC not in result.output and "\x07" not in result.output and "\r" not in result.output
    assert "\u202e" not in result.output
    assert r"evil\x1b]0;owned\x07\x1b[2J\u202e" in result.output
    assert r"failed: jobs/\x1b[31mred\x1b[0m\r\nforged" in result.output and r"ctl-1\x1b[A" in result.output
    rows = json.loads(runner.invoke(app, ["status", "--json"]).output)  # JSON escapes them itself
    assert {r["job"] for r in rows} == {evil, "ctl"}


def test_submit_replace_does_not_revoke_a_pending_cancel(mem, tmp_path):
    path = _spec(tmp_path)
    assert runner.invoke(app, ["submit", path]).exit_code == 0
    mem.tick()
    assert runner.invoke(app, ["cancel", "j"]).exit_code == 0
    refused = runner.invoke(app, ["submit", path, "--replace"])
    assert refused.exit_code == 2 and "pending cancel" in refused.output and "--uncancel" in refused.output
    assert mem.store.exists(BUCKET, names.cancel_key("j"))
    plain = runner.invoke(app, ["submit", path])
    assert plain.exit_code == 2 and mem.store.exists(BUCKET, names.cancel_key("j"))
    mem.tick()
    assert mem.status("j").phase == Phase.CANCELLED and mem.live("j") == []


def test_submit_uncancel_withdraws_a_pending_cancel(mem, tmp_path):
    path = _spec(tmp_path)
    runner.invoke(app, ["submit", path])
    mem.tick()
    runner.invoke(app, ["cancel", "j"])
    result = runner.invoke(app, ["submit", path, "--replace", "--uncancel"])
    assert result.exit_code == 0, result.output
    assert not mem.store.exists(BUCKET, names.cancel_key("j"))
    mem.tick()
    assert mem.status("j").phase != Phase.CANCELLED


def test_a_cancel_of_a_finished_run_does_not_cancel_the_next(mem, tmp_path):
    path = _spec(tmp_path)
    runner.invoke(app, ["submit", path])
    mem.tick()
    runner.invoke(app, ["cancel", "j"])
    mem.tick()
    assert mem.status("j").phase == Phase.CANCELLED
    result = runner.invoke(app, ["submit", path])  # a finished job: a plain submit starts a new run
    assert result.exit_code == 0, result.output
    assert not mem.store.exists(BUCKET, names.cancel_key("j"))
    mem.tick()
    assert mem.status("j").phase != Phase.CANCELLED


def test_status_shows_a_job_whose_checkpoints_cannot_be_listed(mem, monkeypatch):
    mem.submit("good")
    mem.submit("locked", spec_doc(checkpoint={"uri": "gs://denied/run"}))
    mem.checkpoint(40)
    listing = mem.store.list

    def list_(bucket: str, prefix: str):
        if bucket == "denied":
            raise errors.RequestError("gs://denied/run/*: 403 caller does not have storage.objects.list access")
        return listing(bucket, prefix)

    monkeypatch.setattr(mem.store, "list", list_)
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 0, result.output
    assert "locked" in result.output and "unreadable" in result.output and "good" in result.output
    assert "locked: checkpoints not readable: gs://denied/run/*: 403" in result.output
    rows = {r["job"]: r for r in json.loads(runner.invoke(app, ["status", "--json"]).stdout)}
    assert rows["good"]["checkpoint_step"] == 40 and rows["good"]["checkpoint_error"] is None
    assert rows["locked"]["checkpoint_step"] is None and "403" in rows["locked"]["checkpoint_error"]


def test_status_of_an_unknown_job_exits_2(mem):
    mem.submit("known")
    result = runner.invoke(app, ["status", "no-such-job"])
    assert result.exit_code == 2
    assert _one_error_line(result) == f"✗ no job named 'no-such-job' in gs://{BUCKET}"
    assert runner.invoke(app, ["status", "no-such-job", "--json"]).exit_code == 2


def test_without_configuration_every_command_says_so_in_one_line(tmp_path):
    for args in (["logs", "j"], ["status"], ["cancel", "j"], ["reconcile"], ["submit", _spec(tmp_path)]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        line = _one_error_line(result)
        assert line.startswith("✗ configuration:") and "RESPAWN_BUCKET" in line, line


def test_a_bad_setting_is_one_line_naming_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("RESPAWN_MAX_NODES", "lots")
    monkeypatch.setenv("RESPAWN_BUCKET", BUCKET)
    monkeypatch.setenv("RESPAWN_PROJECT", PROJECT)
    for args in (["status"], ["logs", "j"], ["validate", _spec(tmp_path)], ["reconcile"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        line = _one_error_line(result)
        assert line.startswith("✗ configuration: RESPAWN_MAX_NODES='lots'"), line


def test_an_error_from_the_store_is_one_line_and_exit_2(mem):
    mem.store.faults.fail_next("list", errors.RequestError(f"gs://{BUCKET}/jobs/*: 403 [/x] denied"))
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 2
    assert _one_error_line(result) == f"✗ gs://{BUCKET}/jobs/*: 403 [/x] denied"


def test_retries_running_out_in_gcs_are_transient_and_exit_3(mem):
    from google.api_core import exceptions as gexc

    from controller.adapters.gcs import GcsStore

    class Unreachable:
        def list_blobs(self, *args, **kwargs):
            raise gexc.RetryError("Timeout of 120.0s exceeded", ConnectionError("connection refused"))

    store = GcsStore(Unreachable())
    with pytest.raises(errors.TransientError):
        store.list(BUCKET, "jobs/")
    bootstrap.override(None, Settings(bucket=BUCKET, project=PROJECT), store, mem.compute)
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 3
    line = _one_error_line(result)
    assert "Timeout of 120.0s exceeded" in line and "try again" in line


def test_status_watch_keeps_the_last_table_when_a_refresh_fails(mem, monkeypatch):
    mem.submit("w")
    listing, calls = mem.store.list, []

    def list_(bucket: str, prefix: str):
        if prefix == "jobs/":
            calls.append(prefix)
            if len(calls) == 2:
                raise errors.TransientError(f"gs://{BUCKET}/jobs/*: 503 [/x]")
        return listing(bucket, prefix)

    monkeypatch.setattr(mem.store, "list", list_)
    result = runner.invoke(app, ["status", "--watch", "--interval", "0", "--refreshes", "1"])
    assert result.exit_code == 0, result.output
    assert "not refreshed: gs://respawn-test/jobs/*: 503 [/x]" in result.output and "w" in result.output


def test_logs_escape_control_characters_unless_raw(mem, monkeypatch):
    from types import SimpleNamespace

    import google.cloud.logging as cloud_logging

    _put_status(mem, "lg", phase=Phase.RUNNING, instances=("lg-1",), instance_ids={"lg-1": "123"})

    class FakeLogging:
        def __init__(self, project: str) -> None:
            pass

        def list_entries(self, **_):
            return [SimpleNamespace(timestamp=datetime(2026, 1, 1, tzinfo=UTC), payload=f"{ESC}]0;owned\x07step 10\ttab",
                                    labels={"compute.googleapis.com/resource_name": "lg-1"})]

    monkeypatch.setattr(cloud_logging, "Client", FakeLogging)
    result = runner.invoke(app, ["logs", "lg"])
    assert result.exit_code == 0, result.output
    assert ESC not in result.output and r"\x1b]0;owned\x07step 10" + "\ttab" in result.output
    assert f"{ESC}]0;owned\x07step 10" in runner.invoke(app, ["logs", "lg", "--raw"]).output


def test_invisible_characters_cannot_make_one_job_name_pass_for_another():
    from controller.render.text import printable

    assert printable("ab\u200bc") != "abc" and printable("a\ufeffb\u00adc\u2060") == "a\\ufeffb\\xadc\\u2060"


def test_status_shows_the_checkpoint_each_framework_would_resume(mem):
    from tests import checkpoint_trees as trees

    for make in (trees.deepspeed, trees.accelerate, trees.megatron_legacy):
        tree = make()
        for name, data in tree.objects:
            mem.store.put("ckpts", f"{tree.name}/{name}", data)
        mem.submit(tree.name, spec_doc(checkpoint={"uri": f"gs://ckpts/{tree.name}", **tree.checkpoint}))
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 0, result.output
    assert "step 15" in result.output and "save 10" in result.output and "step 1000" in result.output
    rows = {r["job"]: r for r in json.loads(runner.invoke(app, ["status", "--json"]).stdout)}
    assert (rows["ds"]["checkpoint"], rows["ds"]["checkpoint_step"], rows["ds"]["checkpoint_tag"]) == \
        ("gs://ckpts/ds/global_step15", 15, "global_step15")
    assert (rows["accelerate"]["checkpoint_step"], rows["accelerate"]["checkpoint_label"]) == (None, "save 10")
    assert rows["megatron"]["checkpoint_tag"] == "1000"


def test_status_of_a_job_shows_each_zones_advice_and_the_model_it_runs_on(mem):
    from controller.adapters.memory import MemoryAdvisor

    mem.advisor = MemoryAdvisor(mem.compute)
    mem.advisor.rates.update({"us-central1-a": 0.25, "us-central1-b": 0.01})
    mem.submit("llm", spec_doc(provisioning=["spot", "standard"]))
    mem.tick()
    result = runner.invoke(app, ["status", "llm"])
    assert result.exit_code == 0, result.output
    assert "us-central1-b (spot)" in result.output
    assert "capacity advice at the last launch" in result.output
    lines = {re.split(r"\s{2,}", l)[0]: l for l in result.output.splitlines() if l.startswith("us-central1-")}
    assert "25.0%" in lines["us-central1-a"] and "1.0%" in lines["us-central1-b ←"]
    row = json.loads(runner.invoke(app, ["status", "llm", "--json"]).stdout)[0]
    assert row["provisioning"] == "spot" and row["zone_advice"]["us-central1-a"]["preemption_rate"] == 0.25


def test_status_shows_a_tpu_nodes_announced_maintenance(mem, tmp_path):
    path = tmp_path / "tpu.yaml"
    doc = tpu_spec_doc(zones=["us-central2-b"], tpu={"type": "v4-8", "runtime_version": "tpu-ubuntu2204-base"})
    path.write_text(yaml.safe_dump(doc))
    assert runner.invoke(app, ["validate", str(path)]).exit_code == 0
    mem.submit("tpu", doc)
    mem.tick()
    mem.tick()
    mem.tpu.upcoming_maintenance("tpu-1")
    mem.tick()
    result = runner.invoke(app, ["status", "tpu"])
    assert result.exit_code == 0, result.output
    assert "tpu: maintenance scheduled on tpu-1: SCHEDULED, starts 2026-11-24T10:00:00Z" in result.output
    row = json.loads(runner.invoke(app, ["status", "tpu", "--json"]).stdout)[0]
    assert row["tpu"] is True and row["upcoming_maintenance"] == "tpu-1: SCHEDULED, starts 2026-11-24T10:00:00Z"


def test_logs_refuses_a_project_in_the_status_that_is_not_a_project_id(mem, monkeypatch):
    import google.cloud.logging as cloud_logging

    queries: list[str] = []

    class FakeLogging:
        def __init__(self, project: str) -> None:
            pass

        def list_entries(self, **kw):
            queries.append(kw["filter_"])
            return []

    monkeypatch.setattr(cloud_logging, "Client", FakeLogging)
    _put_status(mem, "pj", phase=Phase.RUNNING, instances=("pj-1",), instance_ids={"pj-1": "123"},
                project='evil-proj/logs/x" OR logName:"y')
    result = runner.invoke(app, ["logs", "pj"])
    assert result.exit_code != 0 and queries == []
    assert "not a project id" in _one_error_line(result) and "status.json" in _one_error_line(result)


def test_run_echoes_its_spec_with_env_values_hidden_and_submits_them_whole(mem):
    result = runner.invoke(app, ["run", "-n", "envy", "-z", "us-central1-a", "-m", "g2-standard-8", "--yes",
                                 "--env", "HF_TOKEN=hf_s3cretvalue", "--env", "LR=3e-4", "--", "python", "train.py"])
    assert result.exit_code == 0, result.output
    assert "hf_s3cretvalue" not in result.output and "3e-4" not in result.output
    assert "HF_TOKEN: <hidden>" in result.output and "LR: <hidden>" in result.output
    written = yaml.safe_load(mem.store.read(BUCKET, names.spec_key("envy")).data)
    assert written["env"] == {"HF_TOKEN": "hf_s3cretvalue", "LR": "3e-4"}


def test_a_name_holding_only_what_a_trainer_writes_is_no_job_in_respawn_status(mem):
    """Issue 35, item 3 (the CLI's side of it): a heartbeat, an exit record or a notice under a name
    with neither spec nor status is no SUBMITTED job; the controller ignores it the same way."""
    mem.submit("real")
    for kind in ("heartbeat", "exit", "notice", "ready"):
        mem.store.put(BUCKET, f"jobs/ghost-{kind}/{kind}", json.dumps({"attempt": 1, "token": "x"}))
    result = runner.invoke(app, ["status", "--json"])
    assert result.exit_code == 0, result.output
    assert [row["job"] for row in json.loads(result.output)] == ["real"]


def test_a_hand_edited_status_with_a_time_without_a_zone_is_read_as_utc_never_a_failure(mem):
    """A status whose times carry no zone (written by hand, or by another tool) made every view of the
    fleet fail (TypeError: naive and aware datetimes compared); respawn writes UTC, and reads such a
    time as UTC."""
    mem.submit("naive")
    st = JobStatus(created_at=datetime(2026, 1, 1, tzinfo=UTC), phase=Phase.RUNNING)
    raw = json.loads(st.to_json())
    raw["created_at"] = "2026-01-01T00:00:00"
    raw["history"] = [{"at": "2026-01-01T00:00:05", "event": "running", "detail": "by hand"}]
    mem.store.put(BUCKET, names.status_key("naive"), json.dumps(raw))
    for argv in (["status"], ["status", "--json"], ["status", "naive"], ["report", "naive"]):
        result = runner.invoke(app, argv)
        assert result.exit_code == 0, (argv, result.output)
    assert JobStatus.from_json(mem.store.read(BUCKET, names.status_key("naive")).data).created_at.tzinfo is not None
