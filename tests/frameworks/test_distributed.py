"""Several ranks, one decision: a save is collective (Lightning's save_checkpoint ends in a barrier,
HuggingFace's in an all-gather, DCP's over every rank), so every rank must save at the same steps and stop at
the same step, or some wait forever. Two CPU processes with gloo."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading

import pytest

from tests.frameworks.harness import HERE, environment
from tests.kit import finder

pytestmark = pytest.mark.timeout(300)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ranks_agree_on_every_save_and_on_the_notice_with_rank_zeros_decision(tmp_path) -> None:
    env = environment(str(tmp_path), MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port(), WORLD_SIZE=2,
                      NOTICE_AT_0=25, NOTICE_AT_1=22)
    ranks = [subprocess.Popen([sys.executable, os.path.join(HERE, "ddp_saver.py")], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=120) for p in ranks]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in ranks] == [0, 0], [err[-2000:] for _, err in outs]
    zero, one = (json.loads(out.strip().splitlines()[-1]) for out, _ in outs)
    assert zero["saved"] == one["saved"], (zero, one)  # the same steps on both ranks
    assert len([s for s in zero["saved"] if s < 25]) >= 2, zero  # periodic saves, before the notice
    assert zero["stopped"] == one["stopped"] == 25  # rank zero's notice: both stop there
    assert [s for s in zero["saved"] if s >= 25] == [25]  # one notice save, rank zero's


def lightning_ddp(tmp_path, sigterm_at: int | None, deadline: float = 90) -> tuple[int, str, str]:
    """Both ranks run in a process group of their own (rank zero launches rank one); with ``sigterm_at``, the group
    is SIGTERMed once rank zero prints that step. After ``deadline`` seconds the group is SIGKILLed (a hang is a
    failure, not a stuck test): the exit code is then -9."""
    env = environment(str(tmp_path), RESPAWN_CHECKPOINT_EVERY_S=0.3, STEPS=30, MASTER_PORT=free_port())
    errors = tmp_path / "stderr.txt"  # a file: a pipe nobody reads till the end could fill and block the ranks
    with open(errors, "w") as err:
        process = subprocess.Popen([sys.executable, os.path.join(HERE, "ddp_lightning.py")], env=env,
                                   cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=err, text=True,
                                   start_new_session=True)
    def kill_group() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    watchdog = threading.Timer(deadline, kill_group)  # the loop below blocks on the ranks' output
    watchdog.start()
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if sigterm_at is not None and line.strip() == f"step {sigterm_at}":
                os.killpg(process.pid, signal.SIGTERM)  # what the shutdown script does: the whole group
                sigterm_at = None
        return process.wait(deadline), "".join(lines), errors.read_text()
    finally:
        watchdog.cancel()
        if process.poll() is None:
            kill_group()
            process.wait()
        kill_group()  # rank one, should it outlive rank zero


def saves(out: str, rank: int) -> list[int]:
    return [int(s) for s in re.findall(rf"^rank {rank} saved (\d+)$", out, re.MULTILINE)]


def test_lightning_ddp_with_a_short_advised_interval_saves_the_same_steps_on_every_rank(tmp_path) -> None:
    code, out, err = lightning_ddp(tmp_path, None)
    assert code == 0, err[-3000:]
    assert "rank 0 done" in out and "rank 1 done" in out, err[-3000:]
    assert len(saves(out, 0)) >= 2 and saves(out, 0) == saves(out, 1), out
    uploaded = sorted(os.listdir(os.path.join(str(tmp_path), "bucket")))
    assert uploaded == [f"step-{s:09d}.ckpt" for s in saves(out, 0)]



@pytest.mark.timeout(120)
def test_lightning_ddp_sigterm_to_the_process_group_saves_one_step_on_both_ranks_and_stops(tmp_path) -> None:
    # A preemption SIGTERMs every process; Lightning's launcher also forwards rank zero's SIGTERM to rank one, which
    # gets it twice. Lightning's own handler made a broadcast per SIGTERM received (2 on rank one, 1 on rank zero):
    # the collectives got out of step and the run hung. The callback's handler records the notice only; the ranks
    # agree at the step boundary, save that step once, and both end with Lightning's SIGTERMException.
    code, out, err = lightning_ddp(tmp_path, sigterm_at=10, deadline=90)
    assert code == 143, (code, out[-2000:], err[-3000:])
    assert "rank 0 done" in out and "rank 1 done" in out, err[-3000:]
    stops = sorted(re.findall(r"^rank (\d) stopped (\d+)$", out, re.MULTILINE))
    assert [rank for rank, _ in stops] == ["0", "1"] and stops[0][1] == stops[1][1], out
    stopped = int(stops[0][1])
    assert 10 <= stopped < 30, out  # the notice's step boundary, well before the end
    assert saves(out, 0) == saves(out, 1), out  # the same saves on both ranks
    assert saves(out, 0)[-1] == stopped and saves(out, 0).count(stopped) == 1, out  # the notice's save, once
    assert "SIGTERM: saving at the next step boundary" in err
    uploaded = sorted(os.listdir(os.path.join(str(tmp_path), "bucket")))
    assert uploaded == [f"step-{s:09d}.ckpt" for s in saves(out, 0)]


def dcp_ranks(tmp: str, **extra: object) -> tuple[dict[int, str], list[str]]:
    """tests/frameworks/ddp_dcp.py on two ranks: rank zero's losses by step, and each rank's stderr."""
    env = environment(tmp, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port(), WORLD_SIZE=2, **extra)
    ranks = [subprocess.Popen([sys.executable, os.path.join(HERE, "ddp_dcp.py")], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=180) for p in ranks]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in ranks] == [0, 0], [err[-3000:] for _, err in outs]
    losses = {int(m.group(1)): m.group(2) for m in re.finditer(r"^step (\d+) loss (\S+)$", outs[0][0], re.MULTILINE)}
    return losses, [err for _, err in outs]


def shards_named_by_metadata(save: str) -> set[str]:
    import pickle

    with open(os.path.join(save, ".metadata"), "rb") as f:
        return {info.relative_path for info in pickle.load(f).storage_data.values()}


def test_a_dcp_save_of_two_ranks_is_taken_as_complete_only_with_every_ranks_shards(tmp_path) -> None:
    # Each rank writes its shards into a folder of its own. Rank one's were never uploaded (its saver found no
    # .metadata and refused its part), so rank zero's shards and .metadata made a save the finder took as complete,
    # which DCP cannot load; with async_save, its collectives on the default group met the ranks' agreement there
    # and the ranks hung. Now every shard lands before the .metadata, and two ranks resume from it.
    whole, _ = dcp_ranks(str(tmp_path / "whole"), STEPS=12)
    assert sorted(whole) == list(range(1, 13))
    bucket = os.path.join(str(tmp_path / "whole"), "bucket")
    found = finder.latest(bucket)
    assert found is not None and (found.format, found.step) == ("dcp", 10), found
    save = finder.local(found, bucket)
    named = shards_named_by_metadata(save)
    assert {"__0_0.distcp", "__1_0.distcp"} <= named  # both ranks hold shards: the case that needs both parts
    assert named <= set(os.listdir(save))
    resumed, _ = dcp_ranks(str(tmp_path / "resumed"), STEPS=12, RESUME_FROM=save, RESUME_STEP=10,
                           RESPAWN_CHECKPOINT_URI=str(tmp_path / "resumed" / "bucket"))
    assert resumed == {s: whole[s] for s in (11, 12)}  # bit for bit: the state both ranks saved


def test_a_two_rank_save_missing_a_ranks_shards_is_never_completed(tmp_path) -> None:
    # rank one's shard of step 10 is refused for good: rank zero never uploads that save's .metadata, says why, and
    # the finder keeps step 5, whole
    losses, errs = dcp_ranks(str(tmp_path), STEPS=12, ASYNC=0, FAIL_ON="step-000000010/__1_0.distcp")
    assert sorted(losses) == list(range(1, 13))
    bucket = os.path.join(str(tmp_path), "bucket")
    found = finder.latest(bucket)
    assert found is not None and found.step == 5, found
    assert shards_named_by_metadata(finder.local(found, bucket)) <= set(os.listdir(finder.local(found, bucket)))
    assert not os.path.exists(os.path.join(bucket, "step-000000010", ".metadata"))
    assert "step 10: another rank's part of the save failed or was dropped: it is not completed" in errs[0]
    assert "the upload of step 10 failed (OSError: refused" in errs[1], errs[1][-2000:]
