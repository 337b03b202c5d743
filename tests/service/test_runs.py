"""Runs of a reused job name (issue 26, "Run history"): each run has an id; a resubmit of a finished
job says which checkpoint it resumes; ``--fresh`` resumes none, at every attempt of its run and
after a crash between any two steps; ``respawn history`` shows the runs; ``respawn rm`` forgets a
finished job and never its checkpoints. Over the in-memory fakes, through the CLI where a user acts."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import yaml
from rich.cells import cell_len
from typer.testing import CliRunner

from controller.cli.main import app
from controller.core import names
from controller.core.runs import RUNS_KEPT
from controller.core.state import JobStatus, Phase
from tests.harness import BUCKET, CKPT_BUCKET, Harness, spec_doc, under_cli
from tests.service.test_invariants import Crash, CrashAfter

runner = CliRunner()


@pytest.fixture
def mem(monkeypatch) -> Harness:
    """The CLI over the in-memory store and compute, at 80 columns."""
    h = under_cli(monkeypatch, 80)
    return h


@pytest.fixture
def spec(tmp_path) -> str:
    path = tmp_path / "j.yaml"
    path.write_text(yaml.safe_dump(spec_doc()))
    return str(path)


def _cli(*args: str):
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output, result.output
    return result


def _cancelled_at_step(h: Harness, spec: str, step: int) -> JobStatus:
    """Run 1 of job j: launched, a checkpoint at ``step`` saved, then cancelled."""
    assert _cli("submit", spec).exit_code == 0
    h.tick()
    h.tick()
    h.checkpoint(step)
    h.advance(minutes=30)
    assert _cli("cancel", "j").exit_code == 0
    h.tick()
    st = h.status("j")
    assert st.phase == Phase.CANCELLED and h.live("j") == []
    return st


def _fresh_save(h: Harness, st: JobStatus, step: int) -> None:
    """What the trainer of a fresh run saves: under its RESPAWN_CHECKPOINT_URI."""
    prefix = f"run/runs/j/{st.run}/{step}"
    h.store.put(CKPT_BUCKET, f"{prefix}/state.bin", b"w" * 8)
    h.store.put(CKPT_BUCKET, f"{prefix}/commit_success.txt", b"")


def _preempt(h: Harness) -> None:
    st = h.status("j")
    h.compute.preempt(st.instances[0])
    h.marker("j")
    h.tick()


def test_each_run_has_an_id_kept_in_its_status_and_shown_by_status_and_report(mem, spec):
    assert _cli("submit", spec).exit_code == 0
    mem.tick()
    st = mem.status("j")
    assert st.run_id is not None and st.run == st.run_id and len(st.run) == len("20260101-000000")
    mem.tick()
    assert mem.status("j").run == st.run  # stable: every later commit keeps it
    shown = _cli("status", "j")
    assert shown.exit_code == 0 and f"run {st.run}; the job's first run" in shown.output
    assert json.loads(_cli("status", "--json").stdout)[0]["run"] == st.run
    assert st.run in _cli("report", "j").output
    assert json.loads(_cli("report", "j", "--json").stdout)["run"] == st.run


def test_a_resubmit_after_cancel_warns_which_checkpoint_it_resumes_and_resumes_it(mem, spec):
    first = _cancelled_at_step(mem, spec, 809)
    again = _cli("submit", spec)
    assert again.exit_code == 0, again.output
    said = " ".join(again.output.split())
    assert f"the new run will resume from checkpoint step 809 of j's last run ({first.run}, CANCELLED)" in said
    assert "gs://ckpts/run/809" in said and "--fresh" in said
    mem.advance(seconds=5)
    mem.tick()
    st = mem.status("j")
    assert st.run != first.run and not st.fresh and st.phase in (Phase.PROVISIONING, Phase.RUNNING)
    name = st.instances[0]
    assert mem.metadata(name)["respawn-resume-from"] == "gs://ckpts/run/809"
    assert mem.metadata(name)["respawn-checkpoint-uri"] == "gs://ckpts/run"
    assert [(r.run, r.phase, r.checkpoint_step) for r in st.runs] == [(first.run, "CANCELLED", 809)]


def test_the_question_on_a_terminal_names_the_checkpoint_it_resumes(mem, spec, monkeypatch):
    from controller.cli import submitting

    _cancelled_at_step(mem, spec, 809)
    monkeypatch.setattr(submitting, "interactive", lambda: True)
    declined = runner.invoke(app, ["submit", spec], input="n\n")
    assert declined.exit_code == 1 and "Submit j, resuming from step 809?" in declined.output
    assert mem.status("j").phase == Phase.CANCELLED  # nothing written: the same spec generation
    told = runner.invoke(app, ["submit", spec, "--yes"])
    assert told.exit_code == 0 and "resuming from step 809?" not in told.output and "step 809" in told.output


def test_fresh_resumes_no_old_checkpoint_at_the_first_attempt_nor_a_later_one(mem, spec):
    _cancelled_at_step(mem, spec, 809)
    fresh = _cli("submit", spec, "--fresh")
    assert fresh.exit_code == 0, fresh.output
    said = " ".join(fresh.output.split())
    assert "starts from scratch; step 809 under gs://ckpts/run is kept, not resumed" in said
    assert "gs://ckpts/run/runs/j/<run id>/" in said
    mem.advance(seconds=5)
    mem.tick()
    st = mem.status("j")
    own = f"gs://ckpts/run/runs/j/{st.run}/"
    assert st.fresh and st.checkpoint_uri == own
    first = mem.metadata(st.instances[0])
    assert first["respawn-resume-from"] == "" and first["respawn-checkpoint-uri"] == own
    # A later attempt, with nothing saved yet by this run, while the old prefix gets a newer save:
    mem.tick()
    mem.checkpoint(900)  # under gs://ckpts/run: an earlier run's tree, never this run's
    _preempt(mem)
    mem.tick()
    second = mem.status("j")
    assert second.attempt == st.attempt + 1 and second.preemptions == 1
    assert mem.metadata(second.instances[0])["respawn-resume-from"] == ""
    assert mem.metadata(second.instances[0])["respawn-checkpoint-uri"] == own
    # Once this run has saved, its own save is resumed, and only it.
    mem.tick()
    _fresh_save(mem, st, 50)
    _preempt(mem)
    mem.tick()
    third = mem.status("j")
    assert mem.metadata(third.instances[0])["respawn-resume-from"] == f"{own}50"
    # The old checkpoints are all still there.
    for step in (809, 900):
        assert mem.store.exists(CKPT_BUCKET, f"run/{step}/state.bin")
    # status shows this run's checkpoint, not the old prefix's step 900
    row = json.loads(_cli("status", "j", "--json").stdout)[0]
    assert row["checkpoint_step"] == 50 and row["fresh"] is True and row["run_checkpoints"] == own


def test_a_later_plain_resubmit_goes_on_from_the_fresh_runs_checkpoints(mem, spec):
    _cancelled_at_step(mem, spec, 809)
    assert _cli("submit", spec, "--fresh").exit_code == 0
    mem.advance(seconds=5)
    mem.tick()
    fresh = mem.status("j")
    mem.tick()
    _fresh_save(mem, fresh, 120)
    mem.exit("j", 0)
    mem.tick()
    assert mem.status("j").phase == Phase.SUCCEEDED
    again = _cli("submit", spec)
    said = " ".join(again.output.split())
    assert again.exit_code == 0 and f"resume from checkpoint step 120 of j's last run ({fresh.run}, SUCCEEDED)" in said
    mem.advance(seconds=5)
    mem.tick()
    st = mem.status("j")
    assert not st.fresh and st.checkpoint_uri == fresh.checkpoint_uri
    assert mem.metadata(st.instances[0])["respawn-resume-from"] == f"{fresh.checkpoint_uri}120"


def test_fresh_is_refused_for_a_job_whose_run_goes_on(mem, spec):
    assert _cli("submit", spec).exit_code == 0
    mem.tick()
    refused = _cli("submit", spec, "--fresh", "--replace")
    assert refused.exit_code == 2
    line = " ".join(refused.output.split())
    assert "--fresh starts a new run, and job 'j' is" in line and "respawn cancel j" in line
    assert "fresh" not in mem.store.read(BUCKET, names.spec_key("j")).data.decode()


# The pass that takes the fresh spec up makes four mutating calls: the new run's status, the
# attempt's, its insert, the insert's acknowledgement. It is crashed before each.
@pytest.mark.parametrize("budget", range(4))
def test_a_pass_crashing_between_any_two_steps_of_a_fresh_resubmit_still_ends_fresh(budget, mem, spec):
    _cancelled_at_step(mem, spec, 809)
    assert _cli("submit", spec, "--fresh").exit_code == 0
    mem.advance(seconds=5)
    crash = CrashAfter(budget)
    with pytest.raises(Crash):
        mem.engine(store=crash.wrap(mem.store), compute=crash.wrap(mem.compute)).reconcile("j")
    for _ in range(3):
        mem.advance(seconds=5)
        mem.tick()
    st = mem.status("j")
    assert st.fresh and st.checkpoint_uri == f"gs://ckpts/run/runs/j/{st.run}/"
    assert mem.live("j") == [st.instances[0]]
    assert mem.metadata(st.instances[0])["respawn-resume-from"] == ""
    assert mem.metadata(st.instances[0])["respawn-checkpoint-uri"] == st.checkpoint_uri
    _preempt(mem)
    mem.tick()
    after = mem.status("j")
    assert after.run == st.run and mem.metadata(after.instances[0])["respawn-resume-from"] == ""
    assert [r.phase for r in after.runs] == ["CANCELLED"]  # the old run summed up once, however often tried


def test_history_shows_each_run_with_its_outcome_goodput_and_cost_at_80_columns(mem, spec):
    first = _cancelled_at_step(mem, spec, 809)
    assert _cli("submit", spec).exit_code == 0
    mem.advance(seconds=5)
    mem.tick()
    mem.tick()
    mem.advance(hours=1)
    shown = _cli("history", "j")
    assert shown.exit_code == 0, shown.output
    lines = shown.output.rstrip("\n").splitlines()
    assert all(cell_len(line) <= 80 for line in lines), shown.output
    assert lines[0].split()[:2] == ["RUN", "OUTCOME"] and "GOODPUT" in lines[0] and "COST" in lines[0]
    old, new = lines[1], lines[2]
    current = mem.status("j")
    assert old.startswith(first.run) and "CANCELLED" in old and "step 809" in old and "$" in old and "%" in old
    assert new.startswith(current.run) and "RUNNING (now)" in new and "$" in new and "%" in new
    runs = json.loads(_cli("history", "j", "--json").stdout)
    assert [r["run"] for r in runs] == [first.run, current.run]
    assert runs[0]["phase"] == "CANCELLED" and runs[0]["cost"] > 0 and 0 < runs[0]["goodput"] <= 1
    assert runs[0]["on_demand_cost"] >= runs[0]["cost"] and runs[1]["cost"] > 0
    wide = _cli("status", "--all")
    assert wide.exit_code == 0 and "j: 1 earlier run" in wide.output and first.run in wide.output
    assert json.loads(_cli("status", "--all", "--json").stdout)[0]["runs"][0]["run"] == first.run
    assert "runs" not in json.loads(_cli("status", "--json").stdout)[0]


def test_history_keeps_the_newest_runs_only(mem, spec):
    assert _cli("submit", spec).exit_code == 0
    mem.tick()
    for _ in range(RUNS_KEPT + 2):
        assert _cli("cancel", "j").exit_code == 0
        mem.tick()
        mem.advance(seconds=2)
        assert _cli("submit", spec).exit_code == 0
        mem.tick()
    st = mem.status("j")
    assert len(st.runs) == RUNS_KEPT and all(r.phase == "CANCELLED" for r in st.runs)
    assert len({r.run for r in st.runs} | {st.run}) == RUNS_KEPT + 1


@pytest.mark.parametrize("job", ["no-such-job", "Bad/../Name", "evil\x1b[2J"])
def test_history_of_no_such_job_is_one_line_exit_2(mem, job):
    mem.submit("known")
    result = _cli("history", job)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("✗ no job named") and "\x1b" not in result.output


def test_rm_refuses_an_active_job_saying_to_cancel_first(mem, spec):
    assert _cli("submit", spec).exit_code == 0
    pending = _cli("rm", "j")
    assert pending.exit_code == 2 and "respawn cancel j" in pending.output
    mem.tick()
    running = _cli("rm", "j")
    line = " ".join(running.output.split())
    assert running.exit_code == 2 and "job 'j' is" in line and "cancel it first (respawn cancel j)" in line
    assert mem.store.exists(BUCKET, names.spec_key("j")) and mem.store.exists(BUCKET, names.status_key("j"))


def test_rm_forgets_a_finished_job_keeps_its_checkpoints_and_a_second_rm_is_fine(mem, spec):
    _cancelled_at_step(mem, spec, 809)
    mem.marker("j", attempt=1)  # a late shutdown script's marker
    mem.heartbeat("j")
    gone = _cli("rm", "j")
    assert gone.exit_code == 0, gone.output
    assert "removed j" in gone.output and "checkpoints kept under gs://ckpts/run" in " ".join(gone.output.split())
    assert [o.name for o in mem.store.list(BUCKET, "jobs/j/")] == []
    assert not mem.store.exists(BUCKET, names.marker_key("j"))
    assert mem.store.exists(CKPT_BUCKET, "run/809/state.bin") and mem.store.exists(CKPT_BUCKET, "run/809/commit_success.txt")
    assert _cli("status", "j").exit_code == 2
    again = _cli("rm", "j")
    assert again.exit_code == 0 and "nothing to remove" in again.output
    # A new job of the same name resumes from the kept checkpoints, and says so.
    resubmit = _cli("submit", spec)
    assert resubmit.exit_code == 0 and "step 809" in resubmit.output and "earlier job of this name" in \
        " ".join(resubmit.output.split())


def test_rm_never_deletes_a_spec_written_again_meanwhile(mem, spec, monkeypatch):
    _cancelled_at_step(mem, spec, 809)
    written = mem.store.delete

    def resubmitted_first(bucket: str, name: str, **kw):
        if name == names.spec_key("j"):
            mem.submit("j")  # the user's submit lands between rm's look and its delete
        return written(bucket, name, **kw)

    monkeypatch.setattr(mem.store, "delete", resubmitted_first)
    refused = _cli("rm", "j")
    assert refused.exit_code == 2 and "nothing removed" in refused.output
    assert mem.store.exists(BUCKET, names.spec_key("j")) and mem.store.exists(BUCKET, names.status_key("j"))


@pytest.mark.parametrize("job", ["Bad_Name", "../jobs", "evil\x1b]0;x\x07"])
def test_rm_of_a_hostile_name_is_one_line_exit_2_and_removes_nothing(mem, job):
    mem.submit("other")
    result = _cli("rm", job)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "not a valid job name" in lines[0] and "nothing removed" in lines[0]
    assert "\x1b" not in result.output and mem.store.exists(BUCKET, names.spec_key("other"))


def test_a_runs_summary_survives_a_status_read_back(mem, spec):
    first = _cancelled_at_step(mem, spec, 809)
    assert _cli("submit", spec).exit_code == 0
    mem.advance(seconds=5)
    mem.tick()
    st = mem.status("j")
    assert JobStatus.from_json(st.to_json()).runs == st.runs
    past = st.runs[0]
    assert past.run == first.run and past.started == first.created_at and past.ended is not None
    assert past.ended - past.started >= timedelta(minutes=30) and past.attempts == 1


def test_an_invalid_spec_over_a_finished_run_leaves_that_runs_outcome_as_it_was(mem, spec):
    assert _cli("submit", spec).exit_code == 0
    mem.tick()
    mem.tick()
    mem.exit("j", 0)
    mem.tick()
    done = mem.status("j")
    assert done.phase == Phase.SUCCEEDED
    mem.submit("j", spec_doc(zones="not a list"))
    mem.advance(seconds=5)
    mem.tick()
    bad = mem.status("j")
    assert bad.phase == Phase.FAILED and "invalid spec" in bad.message and bad.run != done.run
    assert [(r.run, r.phase) for r in bad.runs] == [(done.run, "SUCCEEDED")]
    mem.tick()
    assert mem.status("j") == bad  # decided once
    assert _cli("submit", spec).exit_code == 0
    mem.advance(seconds=5)
    mem.tick()
    assert [r.phase for r in mem.status("j").runs] == ["SUCCEEDED", "FAILED"]


def test_a_vm_left_by_a_removed_job_is_deleted_as_an_orphan(mem, spec):
    from controller.core import errors

    assert _cli("submit", spec).exit_code == 0
    mem.tick()
    mem.tick()
    assert _cli("cancel", "j").exit_code == 0
    mem.compute.faults.fail_next("delete", errors.TransientError("503 backend error"))
    mem.tick()
    assert mem.status("j").phase == Phase.CANCELLED and mem.live("j") == ["j-1"]  # its delete failed
    assert _cli("rm", "j").exit_code == 0
    mem.tick()
    assert mem.live("j") == [] and "j-1" in mem.compute.deleted
    assert [o.name for o in mem.store.list(BUCKET, "jobs/j/")] == []  # nothing written back


def test_two_jobs_sharing_a_checkpoint_uri_begun_fresh_in_the_same_second_get_prefixes_of_their_own(mem):
    # A sweep: one checkpoint.uri, each job --fresh, all taken up by one pass.
    doc = spec_doc(checkpoint={"uri": f"gs://{CKPT_BUCKET}/run", "fresh": True})
    mem.submit("a", doc)
    mem.submit("b", doc)
    mem.tick()
    a, b = mem.status("a"), mem.status("b")
    assert a.run == b.run  # the same second
    assert a.checkpoint_uri == f"gs://{CKPT_BUCKET}/run/runs/a/{a.run}/"
    assert b.checkpoint_uri == f"gs://{CKPT_BUCKET}/run/runs/b/{b.run}/"


def test_rm_after_a_fresh_run_says_which_kept_checkpoints_a_new_job_would_resume(mem, spec):
    _cancelled_at_step(mem, spec, 809)
    assert _cli("submit", spec, "--fresh").exit_code == 0
    mem.tick()
    st = mem.status("j")
    mem.store.put(CKPT_BUCKET, f"run/runs/j/{st.run}/900/state.bin", b"s")  # the fresh run's own save
    assert _cli("cancel", "j").exit_code == 0
    mem.tick()
    gone = _cli("rm", "j")
    said = " ".join(gone.output.split())
    assert gone.exit_code == 0, gone.output
    assert ("checkpoints kept under gs://ckpts/run (a new job named j with this checkpoint.uri resumes from them "
            "unless submitted with --fresh)") in said
    assert f"checkpoints kept under gs://ckpts/run/runs/j/{st.run}/ (kept, never resumed by a new job)" in said


def test_rm_removes_a_job_folder_whose_name_is_no_jobs_and_only_its_own_objects(mem):
    """Issue 39: a folder with an invalid name showed in `status` but `rm` could not remove it."""
    mem.submit("other")
    mem.store.put(BUCKET, "jobs/My_Job/spec.yaml", b"zones: [us-central1-a]\n")
    mem.store.put(BUCKET, "jobs/My_Job/notes.txt", b"x")
    mem.store.put(BUCKET, "jobs/My_Job2/spec.yaml", b"x")
    result = _cli("rm", "My_Job")
    assert result.exit_code == 0, result.output
    assert not mem.store.exists(BUCKET, "jobs/My_Job/spec.yaml") and not mem.store.exists(BUCKET, "jobs/My_Job/notes.txt")
    assert mem.store.exists(BUCKET, "jobs/My_Job2/spec.yaml") and mem.store.exists(BUCKET, names.spec_key("other"))
