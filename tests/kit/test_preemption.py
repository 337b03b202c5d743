"""The kit in a real trainer process: killed mid-upload, and SIGTERMed with a notice."""

from __future__ import annotations

import json
import os
import signal
import time

from tests.kit import finder
from tests.kit.conftest import trainer_env
from tests.kit.trainer import advance


def expected_state(steps: int) -> int:
    state = 0
    for step in range(1, steps + 1):
        state = advance(state, step)
    return state


def read_until(process, predicate, timeout: float = 30) -> list[str]:
    lines, end = [], time.monotonic() + timeout
    while time.monotonic() < end:
        line = process.stdout.readline()
        assert line, f"the trainer ended early: {lines[-5:]} {process.stderr.read()}"
        lines.append(line.strip())
        if predicate(line.strip()):
            return lines
    raise AssertionError(f"not seen in {timeout} s: {lines[-5:]}")


def test_sigkill_in_the_middle_of_an_upload_never_leaves_a_checkpoint_the_finder_picks(spawn, tmp_path) -> None:
    bucket = str(tmp_path / "bucket")
    trainer = spawn(trainer_env(bucket, STEPS=1000, STEP_S=0.05, SAVE_EVERY=10, FILES=4,
                                       SLOW_UPLOAD_S=0.02, HANG_ON="step-000000020/shard-3.bin"))
    # step 10's save lands whole; step 20's is cut after two of its files
    read_until(trainer, lambda line: line == "uploading step-000000020/shard-3.bin")
    trainer.send_signal(signal.SIGKILL)
    trainer.wait(10)
    half = os.listdir(os.path.join(bucket, "step-000000020"))
    assert {"shard-1.bin", "shard-2.bin"} <= set(half) and "_SUCCESS" not in half
    found = finder.latest(bucket)
    assert (found.uri, found.step) == ("gs://kit-bucket/step-000000010", 10)


def test_sigterm_saves_at_the_next_step_flushes_and_a_resume_loses_no_step(spawn, tmp_path) -> None:
    bucket, progress = str(tmp_path / "bucket"), str(tmp_path / "progress.json")
    env = trainer_env(bucket, STEPS=40, STEP_S=0.05, SAVE_EVERY=10, RESPAWN_PROGRESS_FILE=progress)
    first = spawn(env)
    read_until(first, lambda line: line == "step 13")
    first.send_signal(signal.SIGTERM)
    out, err = first.communicate(timeout=30)
    assert first.returncode == 143, err
    stopped = int(out.strip().splitlines()[-1].removeprefix("stopped at step "))
    assert 13 <= stopped < 40
    assert "SIGTERM: saving at the next step boundary" in err
    found = finder.latest(bucket)
    assert found.step == stopped  # the step it stopped at is the step it saved: nothing lost
    with open(os.path.join(finder.local(found, bucket), "state.json")) as f:
        assert json.load(f) == {"step": stopped, "state": expected_state(stopped)}
    with open(progress) as f:
        assert json.load(f)["saved_step"] == stopped

    second = spawn({**env, "RESUME_FROM": finder.local(found, bucket), "RESUME_STEP": str(found.step)})
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    lines = out.strip().splitlines()
    assert lines[0] == f"resumed at step {stopped}" and lines[1] == f"step {stopped + 1}"
    assert lines[-1] == f"done at step 40 state {expected_state(40)}"  # as an uninterrupted run ends


def test_a_notice_file_saves_at_the_next_step_and_the_run_goes_on_to_its_end(spawn, tmp_path) -> None:
    bucket, notice = str(tmp_path / "bucket"), tmp_path / "notice.json"
    trainer = spawn(trainer_env(bucket, STEPS=40, STEP_S=0.05, SAVE_EVERY=0, RESPAWN_NOTICE_FILE=notice))
    read_until(trainer, lambda line: line == "step 13")
    now = time.time()
    notice.with_suffix(".new").write_text(json.dumps({"at": now, "hard_off": now + 150, "reason": "preempted"}))
    os.replace(notice.with_suffix(".new"), notice)  # as the agent writes it: whole
    out, err = trainer.communicate(timeout=30)
    assert trainer.returncode == 0, err
    assert out.strip().splitlines()[-1] == f"done at step 40 state {expected_state(40)}"  # no stop
    assert "notice (preempted): saving at the next step boundary and training on" in err
    saved = sorted(os.listdir(bucket))
    assert len(saved) == 1, saved  # the notice's one save (SAVE_EVERY=0: no other)
    found = finder.latest(bucket)
    assert 13 <= found.step <= 15, found  # the step boundary after the notice (the write lands between steps)
    with open(os.path.join(finder.local(found, bucket), "state.json")) as f:
        assert json.load(f) == {"step": found.step, "state": expected_state(found.step)}
