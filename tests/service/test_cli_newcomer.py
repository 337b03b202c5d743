"""A newcomer's first hour with the CLI (issue 26): files named as the user named them, counts
in the right number, one wording for a job that is not there, and help that reads well at 80 columns."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from controller.cli.main import app
from tests.service.test_cli import BUCKET, mem  # noqa: F401 - the fixture
from tests.service.test_estimate import world  # noqa: F401 - the fixture

runner = CliRunner()


def test_validate_and_submit_name_the_local_file_not_spec_yaml(tmp_path, mem):  # noqa: F811
    path = tmp_path / "train.yml"
    path.write_text("name: x\nzones: [a\n  b: c\n")
    for command in (["validate", str(path)], ["submit", "--dry-run", str(path)]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, result.output
        assert result.output.startswith("✗ train.yml: not valid YAML or JSON: "), result.output
        assert "spec.yaml" not in result.output


def test_a_spec_in_the_bucket_is_still_called_spec_yaml():
    from controller.core.spec import SpecError, parse_spec

    try:
        parse_spec(b"- 1\n", "x")
    except SpecError as e:
        assert e.problems == ["spec.yaml: expected a mapping of fields, got list"]
        assert SpecError([*e.problems, "nodes: not a number"]).named("t.yml").problems == \
            ["t.yml: expected a mapping of fields, got list", "nodes: not a number"]
    else:
        raise AssertionError("a list is no spec")


def test_counts_are_singular_for_one():
    from controller.render.amounts import counted

    assert [counted(n, "zone") for n in (0, 1, 2)] == ["0 zones", "1 zone", "2 zones"]
    assert counted(1, "entry", "entries") == "1 entry" and counted(3, "entry", "entries") == "3 entries"


def test_validate_says_1_zone_and_1_node(tmp_path):
    import yaml

    from tests.harness import spec_doc

    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(spec_doc(zones=["us-central1-a"], nodes=1)))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "(1 zone, 1 node, " in result.output


def test_the_figures_of_one_money_line_share_one_precision():
    from types import SimpleNamespace

    from controller.render import report
    from controller.render.amounts import dollars

    assert dollars(0.0036, 0.0116, 0.008) == ("$0.0036", "$0.0116", "$0.0080")
    assert dollars(0.39, 1.266, 0.875) == ("$0.39", "$1.27", "$0.88")
    assert dollars(0.00061) == ("$0.00061",) and dollars(0) == ("$0.00",) and dollars(1234.5) == ("$1,234.50",)
    tiny = SimpleNamespace(cost=0.0036, on_demand_cost=0.0116, savings=0.008)
    assert report._cost(tiny) == "$0.0036 against $0.0116 on demand: $0.0080 saved (69%)"


def test_a_small_figure_keeps_two_significant_digits_never_rounding_to_nothing():
    from controller.render.amounts import dollars, figure, figures

    assert figure(0.0255, places=1) in ("0.025", "0.026") and figure(12.34, places=1) == "12.3"
    assert figures(0.0012, 0.004, 1.0333) == ("0.0012", "0.004", "1.03") and figures(0.5, 3.25) == ("0.50", "3.25")
    assert figure(0) == "0.00" and figure(1e-9) == "< 0.000001"
    assert dollars(0.00003) == ("$0.00003",) and dollars(1e-9) == ("< $0.000001",)
    assert dollars(0.0036, 0.0116, 0.008) == ("$0.0036", "$0.0116", "$0.0080")  # a line of figures still aligns


def test_status_report_and_dashboard_show_a_tiny_runs_hours_and_cost_with_their_digits():
    """Issue 39: '0.00 of 0.00 accelerator-hours useful', the dashboard's '0.0 accelerator-hours this
    week' beside /metrics' 0.0255, and '$0.000030 spent'."""
    from datetime import datetime, timedelta, timezone

    from controller.core.ledger import Ledger, Span, Totals
    from controller.core.state import JobStatus, Phase
    from controller.dashboard import views
    from controller.render import report, status_view

    row = {"goodput": {"accelerator_hours": 0.0256, "useful_hours": 0.0124, "goodput": 0.49, "unknown_hours": 0.0},
           "checkpoint_every_s": None, "job": "j"}
    assert "(0.012 of 0.026 accelerator-hours useful)" in status_view.goodput_line(row).text

    now = datetime(2026, 1, 5, tzinfo=timezone.utc)
    start = now - timedelta(seconds=92)  # 92 s of one accelerator: 0.0255 h
    span = Span(attempt=1, zone="us-central1-a", model="spot", accelerators=1, per_hour=0.0012,
                on_demand_per_hour=0.0035, start=start, inserted=start, running=start + timedelta(seconds=10),
                end=now, cause="exited")
    book = Ledger(spans=(span,), totals=Totals(attempts=1, paid_acc_s=92, boot_acc_s=10, running_s=82,
                                               cost=0.00003, on_demand_cost=0.00009))
    status = JobStatus(created_at=start, phase=Phase.SUCCEEDED, attempt=1, zone="us-central1-a",
                       provisioning="spot", ledger=book)
    shown = views.totals([status], now)
    assert shown["text"]["accelerator_hours_week"] in ("0.025", "0.026"), shown["text"]
    assert shown["text"]["cost"] == "$0.00003", shown["text"]
    paid = dict(report.facts(status, now))
    assert paid["accelerator-minutes"] == "1.53 paid: 0.17 booting, 0.00 redone, 1.37 useful"  # a true 0 is 0.00


def _spec_file(tmp_path) -> str:
    import yaml

    from tests.harness import spec_doc

    path = tmp_path / "j.yaml"
    path.write_text(yaml.safe_dump(spec_doc()))
    return str(path)


def test_cancel_of_a_cancelled_job_says_so_and_writes_nothing(mem, tmp_path):  # noqa: F811
    from controller.core import names
    from controller.core.state import Phase

    assert runner.invoke(app, ["submit", _spec_file(tmp_path)]).exit_code == 0
    mem.tick()
    assert runner.invoke(app, ["cancel", "j"]).output.strip() == "✓ cancel requested for j"
    mem.tick()
    assert mem.status("j").phase == Phase.CANCELLED
    written = mem.store.stat(BUCKET, names.cancel_key("j")).generation
    again = runner.invoke(app, ["cancel", "j"])
    assert again.exit_code == 0, again.output
    assert again.output.strip() == "✓ j is already cancelled: nothing to cancel"
    assert mem.store.stat(BUCKET, names.cancel_key("j")).generation == written


def test_cancel_of_a_finished_job_resubmitted_since_is_written(mem, tmp_path):  # noqa: F811
    from controller.core import names

    path = _spec_file(tmp_path)
    runner.invoke(app, ["submit", path])
    mem.tick()
    mem.exit("j", 0)
    mem.tick()
    assert runner.invoke(app, ["cancel", "j"]).output.strip() == "✓ j is already finished (succeeded): nothing to cancel"
    assert runner.invoke(app, ["submit", path]).exit_code == 0  # a new run, not taken up yet
    assert runner.invoke(app, ["cancel", "j"]).output.strip() == "✓ cancel requested for j"
    assert mem.store.exists(BUCKET, names.cancel_key("j"))


def test_a_job_cancelled_by_deleting_its_spec_then_resubmitted_can_be_cancelled_and_is_not_removed(mem, tmp_path):  # noqa: F811
    # The spec's deletion ends the run with no spec generation; a spec written since is a new
    # submission the planner starts, so cancel writes its cancel and rm refuses it.
    from controller.core import names
    from controller.core.state import Phase

    path = _spec_file(tmp_path)
    assert runner.invoke(app, ["submit", path]).exit_code == 0
    mem.tick()
    mem.store.delete(BUCKET, names.spec_key("j"))
    mem.tick()
    assert mem.status("j").phase == Phase.CANCELLED and mem.status("j").spec_generation is None
    assert runner.invoke(app, ["submit", path, "--yes"]).exit_code == 0
    removed = runner.invoke(app, ["rm", "j"])
    assert removed.exit_code != 0 and "cancel it first" in removed.output, removed.output
    assert mem.store.exists(BUCKET, names.spec_key("j"))
    assert runner.invoke(app, ["cancel", "j"]).output.strip() == "✓ cancel requested for j"
    mem.tick()
    assert mem.status("j").phase == Phase.CANCELLED


def test_one_wording_for_a_job_that_is_not_there(mem):  # noqa: F811
    mem.submit("known")
    said = set()
    for command in (["status", "nosuch"], ["report", "nosuch"], ["logs", "nosuch"], ["reconcile", "nosuch"],
                    ["cancel", "nosuch"], ["reconcile", "nosuch", "--dry-run"]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, (command, result.output)
        said.add(result.output.strip())
    assert said == {f"✗ no job named 'nosuch' in gs://{BUCKET}"}


def test_status_of_an_empty_fleet_says_there_are_no_jobs_and_how_to_submit_one(mem):  # noqa: F811
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert text.startswith(f"no jobs in gs://{BUCKET} yet: submit one with `respawn submit SPEC.yaml`"), text
    assert "JOB" not in result.output  # no bare header
    mem.submit("known")
    assert "known" in runner.invoke(app, ["status"]).output


def _commands(command, path=()):
    """Every command and group under ``command``, with the words that reach it."""
    yield list(path), command
    for name, sub in getattr(command, "commands", {}).items():
        if not sub.hidden:
            yield from _commands(sub, (*path, name))


def test_every_help_reads_well_at_80_columns():
    import re

    import typer

    root = typer.main.get_command(app)
    seen = 0
    for path, command in _commands(root):
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
        assert result.exit_code == 0, (path, result.output)
        text = result.output
        assert max(len(line) for line in text.splitlines()) <= 80, path
        for wrong in ("``", "controller.", "<bool>", "{spec}", "…", "{"):
            assert wrong not in text, (path, wrong, text)
        assert not re.search(r"\[default: [^\]]*…", text), path
        for param in command.params:
            if not getattr(param, "hidden", False):
                assert (param.help or "").strip(), (path, param.name)
        seen += 1
    assert seen >= 20  # every command, the local ones included
    top = runner.invoke(app, ["--help"], env={"COLUMNS": "80"}, terminal_width=80).output
    assert "TPU" in top
    # the command list: each summary a paragraph wrapped at the width, not the docstring's own breaks
    listed = [line.strip("│").rstrip() for line in top[top.index("Commands"):].splitlines()[1:-1]]
    for line, after in zip(listed, listed[1:]):
        if after[:11].strip() == "":  # the summary goes on: this line was filled up to the width
            assert len(line) > 60, (line, after)


def test_at_80_columns_the_estimate_shows_every_zone_whole_on_its_row(world, tmp_path, monkeypatch):  # noqa: F811
    """Issue 39: the one table submit asks the user to confirm read ``us-central…`` on every row."""
    from tests.service.test_estimate import write_spec

    monkeypatch.setenv("COLUMNS", "80")
    world.advisor.spot_prices["g2-standard-8"] = 0.30
    zones = ["us-central1-a", "northamerica-northeast1-b", "europe-west4-a"]
    path = write_spec(tmp_path, nodes=1, provisioning=["spot", "flex-start", "standard"], zones=zones,
                      policy={"max_run_duration": "4h"})
    result = runner.invoke(app, ["submit", path, "--dry-run"], terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80, result.output
    assert "…" not in result.output, result.output
    rows = [line.split() for line in lines if line.split()[:1] and line.split()[0] in zones]
    assert sorted((r[0], r[1]) for r in rows) == sorted((z, m) for z in zones for m in ("spot", "flex-start", "standard"))
    for header in ("zone", "model", "$/hour", "obtainable", "goodput"):
        assert header in result.output, header
    wide = runner.invoke(app, ["submit", path, "--dry-run"], env={"COLUMNS": "200"}, terminal_width=200).output
    assert "┃ zone " in wide and "│ northamerica-northeast1-b │" in wide  # where it fits, the boxed table as ever


def test_at_80_columns_each_doctor_line_wraps_under_its_mark_and_its_fix_under_the_command(monkeypatch):
    """Issue 39: doctor's lines ran to 150-220 characters in an 80-column terminal."""
    from controller.cli import doctor as doctors
    from tests.service.test_doctor import healthy, run, target

    p = healthy()
    p.images.clear()  # a spec's image that is not there: a long detail and a long fix
    results = list(run(p).values()) + [doctors.Result(
        "spec j", False, "image projects/debian-cloud/global/images/family/debian-12 is not there: " + "x " * 60,
        "gcloud compute images describe-from-family debian-12 --project debian-cloud " + "--flag=value " * 8)]
    monkeypatch.setattr(doctors, "diagnose", lambda *a, **k: (target(False), results))
    env = {"COLUMNS": "80", "RESPAWN_PROJECT": "my-proj", "RESPAWN_BUCKET": "my-bucket", "RESPAWN_REGION": "us-east1"}
    result = runner.invoke(app, ["doctor"], env=env, terminal_width=80)
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80, result.output
    first = next(i for i, line in enumerate(lines) if line[:1] in ("✓", "!", "✗"))  # after the heading
    for line in lines[first:]:
        assert line[:1] in ("✓", "!", "✗") or line.startswith("  "), line  # a further line sits under the text
    at = next(i for i, line in enumerate(lines) if line.startswith("✗ spec j"))
    assert lines[at + 1].startswith("  ") and not lines[at + 1].startswith("    fix:")  # the detail goes on
    fix = next(i for i in range(at, len(lines)) if lines[i].startswith("    fix: gcloud compute images"))
    assert lines[fix + 1].startswith(" " * len("    fix: ")) and lines[fix + 1][len("    fix: ")] != " "
    assert " ".join(lines[fix:fix + 3]).split()[1:] == results[-1].fix.split()  # the command whole, in order
    said = " ".join(line.strip() for line in lines[at:fix])
    assert said.split() == ["✗", "spec", "j", *results[-1].detail.split()]  # nothing lost in the wrap


def test_deploy_refuses_a_project_region_or_bucket_that_cannot_be_one_each_with_its_fix():
    result = runner.invoke(app, ["deploy", "--dry-run", "--project", "MY_PROJ", "--region", "uscentral",
                                 "--bucket", "gs://my-bucket"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("✗ ") for line in lines), result.output
    assert "'MY_PROJ' is not a project id" in lines[0] and "--project my-proj" in lines[0]
    assert "did you mean --region us-central1?" in lines[1]
    assert "drop gs://" in lines[2] and "--bucket my-bucket" in lines[2] and "refused" in lines[2]
    assert "gcloud" not in result.output.replace("`gcloud projects list`", "").replace(
        "`gcloud compute regions list`", "")  # no step printed


def test_a_failed_deploy_step_prints_gclouds_message_as_lines_not_backslash_n(monkeypatch):
    from controller.cli import deploy
    from tests.service.test_deploy import BUCKET as DEPLOY_BUCKET, PROJECT, REGION, FakeProject

    fake = FakeProject()
    monkeypatch.setattr(deploy, "run_command", fake)
    monkeypatch.setattr(deploy, "_upsert_scheduler_job", fake.schedule)
    monkeypatch.setattr(deploy.time, "sleep", lambda _: None)
    fake.fail_once["functions deploy respawn-on-object"] = ("INVALID_ARGUMENT: the build failed:\n"
                                                            "- quota exceeded for builds\n- try again later")
    result = runner.invoke(app, ["deploy", "--project", PROJECT, "--region", REGION, "--bucket", DEPLOY_BUCKET])
    assert result.exit_code == 1, result.output
    assert "\\n" not in result.output, result.output
    lines = result.output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.endswith("INVALID_ARGUMENT: the build failed:"))
    assert lines[at + 1:at + 3] == ["- quota exceeded for builds", "- try again later"]


def test_a_deploy_step_failed_by_an_api_error_of_several_lines_prints_them_as_lines(monkeypatch):
    from controller.cli import deploy
    from tests.service.test_deploy import BUCKET as DEPLOY_BUCKET, PROJECT, REGION, FakeProject

    fake = FakeProject()
    monkeypatch.setattr(deploy, "run_command", fake)
    monkeypatch.setattr(deploy.time, "sleep", lambda _: None)

    def refused(job):
        raise RuntimeError("403 Cloud Scheduler API has not been used in project prod-proj\nEnable it by visiting "
                           "the console, then retry")

    monkeypatch.setattr(deploy, "_upsert_scheduler_job", refused)
    result = runner.invoke(app, ["deploy", "--project", PROJECT, "--region", REGION, "--bucket", DEPLOY_BUCKET])
    assert result.exit_code == 1, result.output
    assert "\\n" not in result.output, result.output
    assert "Enable it by visiting the console, then retry" in result.output.splitlines()


def test_deploy_rules_for_project_ids_and_regions():
    from controller.cli import targets

    for good in ("my-proj", "abcdef", "a" * 30, "example.com:my-proj"):
        assert targets.project_problem(good) is None, good
    for bad in ("MY_PROJ", "abcde", "a" * 31, "1project", "my-proj-", "my proj"):
        assert targets.project_problem(bad), bad
    assert targets.region_problem("us-central1") is None and targets.region_note("us-central1") is None
    assert targets.region_problem("northamerica-northeast1") is None
    assert targets.region_problem("us-east9") is None  # well formed: perhaps newer than the list, only noted
    assert "did you mean --region us-central1?" in targets.region_note("us-centrl1")
    for bad in ("uscentral", "us-central", "US-CENTRAL1", "us-central1-a"):
        assert targets.region_problem(bad), bad


def test_a_well_formed_deploy_target_prints_its_plan(monkeypatch):
    result = runner.invoke(app, ["deploy", "--dry-run", "--project", "my-proj", "--region", "europe-west4",
                                 "--bucket", "my-bucket"])
    assert result.exit_code == 0, result.output
    assert "✗" not in result.output and "--project=my-proj" in result.output


def test_no_google_credentials_is_one_line_with_the_command_that_fixes_it(monkeypatch):
    from google.auth.exceptions import DefaultCredentialsError

    from controller.service import bootstrap

    def adapters():
        raise DefaultCredentialsError("Your default credentials were not found. To set up Application Default "
                                      "Credentials, see https://cloud.google.com/docs/authentication/external/set-up-adc")

    monkeypatch.setenv("RESPAWN_PROJECT", "my-proj")
    monkeypatch.setenv("RESPAWN_BUCKET", "my-bucket")
    monkeypatch.setattr(bootstrap, "adapters", adapters)
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == ("✗ configuration: no Google credentials: run `gcloud auth application-default "
                                     "login`, or, for the local cloud, export what `respawn local env` prints")


def test_a_paused_wait_does_not_count_against_the_bound(monkeypatch):
    """respawn's own waits (a question, logs' pacing of reads) stop the clock; then a whole bound again."""
    import signal
    import time

    from controller.cli import deadline

    before = signal.getsignal(signal.SIGALRM)
    deadline.begin(0.3)
    try:
        deadline.paused(time.sleep, 0.5)  # longer than the bound: not Expired
        assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 0.3  # a whole bound again after it
        try:
            time.sleep(1)
        except deadline.Expired as e:
            assert str(e).startswith("gave up after 0.3 s: ")
        else:
            raise AssertionError("the bound did not ring")
    finally:
        deadline.stop()
    assert signal.getsignal(signal.SIGALRM) is before


def test_an_upload_is_bounded_by_its_size_at_a_slow_uplink_not_by_the_commands_bound(monkeypatch):
    """A workdir of 40 MiB cannot go up in 30 s on a home uplink: its upload gets the time its size
    takes at UPLOAD_BYTES_S more than the bound, then a whole bound again."""
    import signal
    import time

    from controller.cli import deadline

    monkeypatch.setattr(deadline, "UPLOAD_BYTES_S", 10.0)  # 5 bytes: half a second more
    deadline.begin(0.3)
    try:
        deadline.widened(5 / deadline.UPLOAD_BYTES_S, time.sleep, 0.5)  # past the bound, within the widened one
        assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 0.3
        try:
            deadline.widened(0.1, time.sleep, 1.0)  # past even the widened bound
        except deadline.Expired as e:
            assert str(e).startswith("gave up after 0.4 s: ")
        else:
            raise AssertionError("the widened bound did not ring")
    finally:
        deadline.stop()


@pytest.mark.parametrize("value", ["inf", "1e12", "0"])
def test_a_timeout_of_inf_or_more_than_a_timer_takes_is_no_bound(value):
    from pathlib import Path

    from controller.cli import deadline

    spec = Path(__file__).parents[2] / "examples" / "llm-finetune.yaml"
    result = runner.invoke(app, ["--timeout", value, "validate", str(spec)])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert deadline.given == 0.0


# -- third pass (issue 39) ------------------------------------------------------------------------

def _mistyped_bucket(mem, tmp_path, local_env: str | None = None) -> None:  # noqa: F811
    """RESPAWN_BUCKET=respawn-locall where only the harness's bucket exists; ``local_env``: what the
    local cloud's exports say RESPAWN_BUCKET is (None: no local cloud's local.env)."""
    from controller.service import bootstrap
    from controller.service.config import Settings
    from tests.harness import CKPT_BUCKET, PROJECT, TRAINER

    if local_env is not None:
        (tmp_path / "local.env").write_text(f"# written by `respawn local up`\nexport RESPAWN_BUCKET={local_env}\n")
    mem.store.buckets = {BUCKET, CKPT_BUCKET}
    bootstrap.override(None, Settings(bucket="respawn-locall", project=PROJECT, trainer_service_account=TRAINER,
                                             local_dir=tmp_path),
                       mem.store, mem.compute)


@pytest.mark.parametrize("command", [["status"], ["submit", "--yes", "SPEC"], ["dashboard", "--no-open", "--port", "0"]])
def test_a_mistyped_bucket_is_named_with_its_variable_its_source_and_the_fix(mem, tmp_path, command):  # noqa: F811
    spec = _spec_file(tmp_path)
    _mistyped_bucket(mem, tmp_path, local_env=BUCKET)
    result = runner.invoke(app, [spec if word == "SPEC" else word for word in command])
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert line == (f"✗ bucket gs://respawn-locall does not exist: RESPAWN_BUCKET=respawn-locall is set in your "
                    f"environment, while the local cloud's {tmp_path / 'local.env'} says {BUCKET}: `source "
                    f"{tmp_path / 'local.env'}` (or set RESPAWN_BUCKET to your control bucket)"), line


def test_a_bucket_not_there_without_a_local_cloud_points_at_doctor_not_at_making_it(mem, tmp_path):  # noqa: F811
    _mistyped_bucket(mem, tmp_path)
    line = runner.invoke(app, ["status"]).output.strip()
    assert line.startswith("✗ bucket gs://respawn-locall does not exist: RESPAWN_BUCKET=respawn-locall is set in "
                           "your environment: set RESPAWN_BUCKET to your control bucket (`respawn doctor` names"), line
    assert "respawn deploy" not in line and "create" not in line


def test_a_bucket_that_local_env_names_but_no_local_cloud_serves_says_so(mem, tmp_path):  # noqa: F811
    _mistyped_bucket(mem, tmp_path, local_env="respawn-locall")
    line = runner.invoke(app, ["status"]).output.strip()
    assert f"RESPAWN_BUCKET=respawn-locall comes from {tmp_path / 'local.env'}" in line
    assert "`respawn local up`" in line


def test_a_checkpoint_bucket_not_there_is_its_own_message_not_respawn_buckets():
    from controller.core import errors

    e = errors.NoSuchBucket("ckpts", "gs://ckpts/run/*")
    assert isinstance(e, errors.NotFound)
    assert str(e) == "gs://ckpts/run/*: bucket gs://ckpts does not exist"


def test_submit_refuses_a_running_job_without_replace_before_the_estimate_and_the_question(mem, tmp_path,  # noqa: F811
                                                                                          monkeypatch):
    from controller.cli import submitting
    from controller.core.state import Phase

    path = _spec_file(tmp_path)
    assert runner.invoke(app, ["submit", path]).exit_code == 0
    mem.tick()
    mem.tick()  # its VM up
    assert mem.status("j").phase == Phase.RUNNING

    def never(*_):
        raise AssertionError("reached after the refusal")

    monkeypatch.setattr(submitting, "interactive", lambda: True)
    monkeypatch.setattr(submitting, "_estimate", never)
    monkeypatch.setattr(submitting.pack, "pack", never)
    monkeypatch.setattr("typer.confirm", never)
    result = runner.invoke(app, ["submit", path])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == "✗ job 'j' is RUNNING; pass --replace to change its spec (it applies from the next attempt)"


def test_a_dry_run_of_a_running_job_shows_the_estimate_and_says_a_submit_would_be_refused(mem, tmp_path):  # noqa: F811
    path = _spec_file(tmp_path)
    assert runner.invoke(app, ["submit", path]).exit_code == 0
    mem.tick()
    mem.tick()
    result = runner.invoke(app, ["submit", "--dry-run", path])
    assert result.exit_code == 0, result.output
    assert "! a submit would be refused: job 'j' is RUNNING; pass --replace" in result.output
    assert "estimate for j" in result.output and "dry run: nothing uploaded" in result.output
    assert runner.invoke(app, ["submit", "--dry-run", "--replace", path]).output.count("would be refused") == 0


def test_status_follow_points_at_watch_not_all(mem):  # noqa: F811
    for flag in ("--follow", "-f"):
        result = runner.invoke(app, ["status", flag])
        assert result.exit_code == 2, result.output
        line = result.output.strip()
        assert line.startswith("✗ status has no --follow: --watch refreshes it until Ctrl-C"), line
        assert "--all" not in line


def test_logs_tail_n_is_limit_n(mem, monkeypatch):  # noqa: F811
    from datetime import UTC, datetime

    from controller.cli import joblogs
    from controller.core import names
    from controller.core.state import JobStatus, Phase

    mem.submit("lg")
    mem.store.put(BUCKET, names.status_key("lg"), JobStatus(created_at=datetime(2026, 1, 1, tzinfo=UTC),
                  phase=Phase.RUNNING, instances=("lg-1",), instance_ids={"lg-1": "123"}).to_json())
    asked = []

    class Reader:
        def __init__(self, *args, **_):
            asked.append(args[5])  # (client, job, projects, emit, show, limit)

        def print_all(self, *_):
            pass

    monkeypatch.setattr(joblogs, "JobLogs", Reader)
    monkeypatch.setattr("controller.adapters.google.logging_client", lambda config: object())
    for flags, limit in ((["--tail", "7"], 7), (["--limit", "9"], 9), ([], 200)):
        result = runner.invoke(app, ["logs", "lg", *flags])
        assert result.exit_code == 0, result.output
        assert asked.pop() == limit


def test_version_prints_the_packages_version():
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"respawn {pyproject['project']['version']}\n"


def test_h_is_help_for_every_command():
    import typer

    for path, _ in _commands(typer.main.get_command(app)):
        long, short = (runner.invoke(app, [*path, flag], env={"COLUMNS": "80"}, terminal_width=80)
                       for flag in ("--help", "-h"))
        assert short.exit_code == 0 and short.output == long.output, path


def test_h_after_a_double_dash_is_the_jobs_own():
    from controller.cli.main import _short_help

    assert _short_help(["run", "-n", "x", "-h", "--", "python", "t.py", "-h"]) == \
        ["run", "-n", "x", "--help", "--", "python", "t.py", "-h"]


def test_rm_says_kept_only_for_checkpoints_that_are_there(mem, tmp_path):  # noqa: F811
    from tests.harness import CKPT_BUCKET

    path = _spec_file(tmp_path)  # checkpoint.uri gs://ckpts/run
    for there in ({BUCKET, CKPT_BUCKET}, {BUCKET}):
        mem.store.buckets = {BUCKET, CKPT_BUCKET}  # submit refuses a checkpoint bucket that is not there
        assert runner.invoke(app, ["submit", path]).exit_code == 0
        mem.store.buckets = there  # ... and it may go afterwards
        mem.tick()
        assert runner.invoke(app, ["cancel", "j"]).exit_code == 0
        mem.tick()
        said = " ".join(runner.invoke(app, ["rm", "j"]).output.split())
        if CKPT_BUCKET in there:  # the bucket, but nothing saved under the prefix
            assert "no checkpoints under gs://ckpts/run: nothing is there" in said, said
        else:
            assert "no checkpoints under gs://ckpts/run: bucket gs://ckpts does not exist" in said, said
        assert "kept" not in said
    mem.store.buckets = None
    mem.store.put(CKPT_BUCKET, "run/7/state.bin", b"s")
    assert runner.invoke(app, ["submit", path]).exit_code == 0
    mem.tick()
    runner.invoke(app, ["cancel", "j"])
    mem.tick()
    assert "checkpoints kept under gs://ckpts/run (" in " ".join(runner.invoke(app, ["rm", "j"]).output.split())


def test_an_unknown_job_gets_the_job_likely_meant(mem):  # noqa: F811
    """Issue 39: unknown job names got no suggestion."""
    mem.submit("finetune")
    result = runner.invoke(app, ["status", "fintune"])
    assert result.exit_code == 2
    assert result.output.strip() == f"✗ no job named 'fintune' in gs://{BUCKET}; did you mean 'finetune'?"


def test_status_of_one_job_shows_its_last_event_whole(mem, monkeypatch):  # noqa: F811
    """Issue 39: `respawn status JOB` cut the last event to two lines, hiding the fix at its end."""
    from controller.core import names
    from controller.core.state import Event

    mem.submit("long")
    mem.tick()
    st = mem.status("long")
    words = " ".join(f"word{i}" for i in range(60))
    said = f"{words}; fix: run THE-FIX"
    st = st.but(Event(at=st.history[-1].at, event="note", attempt=st.attempt, detail=said), message=said)
    mem.store.put(BUCKET, names.status_key("long"), st.to_json())
    monkeypatch.setenv("COLUMNS", "80")
    one = runner.invoke(app, ["status", "long"])
    assert "THE-FIX" in one.output, one.output
    fleet = runner.invoke(app, ["status"])
    assert "THE-FIX" not in fleet.output  # the fleet's view keeps two lines an event
