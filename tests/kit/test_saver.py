"""CheckpointSaver in process: upload order, back-pressure, the notice's deadline, the progress file."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime

import pytest

from respawnkit import HUGGINGFACE, LIGHTNING_STEPS, CheckpointSaver
from respawnkit.notice import Notice
from respawnkit.progress import Progress
from respawnkit.stores import LocalStore
from tests.kit import finder


class RecordingStore(LocalStore):
    """A local bucket that records each upload (and each removal, as ``delete NAME``) and can hold uploads back
    until released."""

    def __init__(self, root: str, hold: bool = False) -> None:
        super().__init__(root)
        self.order: list[str] = []
        self.release = threading.Event()
        self.entered = threading.Event()
        if not hold:
            self.release.set()

    def put(self, local: str, name: str) -> None:
        self.entered.set()
        assert self.release.wait(10)
        super().put(local, name)
        self.order.append(name)

    def delete(self, name: str) -> None:
        super().delete(name)
        self.order.append(f"delete {name}")


def writer(files: dict[str, bytes], pause: float = 0.0):
    def write(folder: str) -> None:
        time.sleep(pause)
        for name, data in files.items():
            os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
    return write


def saver_for(store: LocalStore, **kwargs) -> CheckpointSaver:
    kwargs.setdefault("sigterm", Notice())
    return CheckpointSaver(store=store, progress=kwargs.pop("progress", Progress(path="")), **kwargs)


def test_marker_is_uploaded_last_and_the_finder_picks_the_newest_save(tmp_path) -> None:
    store = RecordingStore(str(tmp_path / "bucket"))
    saver = saver_for(store)
    for step in (10, 20):
        assert saver.save(step, writer({"model.bin": b"m" * 100, "optim/state.bin": b"o", "zz.json": b"{}"}))
        # Each upload done before the next save: a save still waiting when a newer one comes is
        # dropped (the newer supersedes it), which a loaded machine made happen here at random.
        assert saver.flush(10)
    assert store.order == [name for s in (10, 20) for name in (
        f"step-0000000{s}-unfinished", *(f"step-0000000{s}/{n}" for n in ("model.bin", "optim/state.bin", "zz.json",
                                                                           "_SUCCESS")),
        f"delete step-0000000{s}-unfinished")]
    found = finder.latest(str(tmp_path / "bucket"))
    assert (found.uri, found.format, found.step) == ("gs://kit-bucket/step-000000020", "files", 20)
    assert saver.saved_step == 20


def test_a_save_from_a_folder_the_framework_rotates_away_still_uploads(tmp_path) -> None:
    store = RecordingStore(str(tmp_path / "bucket"), hold=True)
    saver = saver_for(store, layout=HUGGINGFACE)
    checkpoint = tmp_path / "out" / "checkpoint-5"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 5}))
    saver.save(5, str(checkpoint), link=True)
    for leaf in checkpoint.iterdir():  # HF's save_total_limit deletes it while the upload waits
        leaf.unlink()
    store.release.set()
    assert saver.flush(10)
    assert store.order[-2:] == ["checkpoint-5/trainer_state.json", "delete checkpoint-5-unfinished"]
    found = finder.latest(str(tmp_path / "bucket"))
    assert (found.format, found.step) == ("huggingface", 5)


def test_a_writer_marker_missing_means_no_upload_of_that_save(tmp_path, capfd) -> None:
    saver = saver_for(RecordingStore(str(tmp_path / "bucket")), layout=HUGGINGFACE)
    saver.save(5, writer({"model.safetensors": b"w"}))
    assert not saver.flush(10)  # a save that failed: flush says so
    assert saver.saved_step is None and "no trainer_state.json" in saver.errors[0]
    assert finder.latest(str(tmp_path / "bucket")) is None
    assert "upload of step 5 failed" in capfd.readouterr().err


def test_a_single_file_layout_is_one_object(tmp_path) -> None:
    store = RecordingStore(str(tmp_path / "bucket"))
    saver = saver_for(store, layout=LIGHTNING_STEPS)
    saver.save(12, writer({"anything.ckpt": b"ckpt"}))
    assert saver.flush(10)
    assert store.order == ["step-000000012.ckpt"]
    assert finder.latest(str(tmp_path / "bucket")).step == 12


def test_a_full_queue_drops_the_oldest_waiting_save_and_never_uploads_a_step_twice(tmp_path, capfd) -> None:
    store = RecordingStore(str(tmp_path / "bucket"), hold=True)
    saver = saver_for(store, max_pending=1)
    files = {"w.bin": b"w"}
    assert saver.save(1, writer(files))
    assert store.entered.wait(5)  # step 1 is uploading, held
    assert saver.save(2, writer(files))  # waits
    assert not saver.save(1, writer(files))  # uploading: not a second time
    assert not saver.save(2, writer(files))  # waiting: not a second time
    assert saver.save(3, writer(files))  # the queue is full: step 2 is dropped
    store.release.set()
    assert saver.flush(10)
    assert sorted({name.split("/")[0] for name in store.order if "/" in name}) == ["step-000000001", "step-000000003"]
    assert not saver.save(3, writer(files))  # uploaded already
    assert "dropping the waiting upload of step 2: step 3 supersedes it" in capfd.readouterr().err
    assert finder.latest(str(tmp_path / "bucket")).step == 3


def test_every_steps_and_every_seconds_say_when_to_save(tmp_path) -> None:
    by_steps = saver_for(RecordingStore(str(tmp_path / "a")), every_steps=3, every_s=None)
    assert [s for s in range(1, 10) if by_steps.should_save(s)] == [3, 6, 9]
    by_time = saver_for(RecordingStore(str(tmp_path / "b")), every_s=0.05)
    assert not by_time.should_save(1)
    time.sleep(0.06)
    assert by_time.should_save(2)
    by_time.save(2, writer({"w": b""}))
    assert not by_time.should_save(3)
    assert by_time.flush(10) and by_steps.flush(10)


def test_every_seconds_defaults_to_respawns_advice(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESPAWN_CHECKPOINT_EVERY_S", "900")
    assert saver_for(RecordingStore(str(tmp_path))).every_s == 900.0


def test_a_notice_asks_for_one_save_at_the_next_step_then_stop(tmp_path) -> None:
    notice = Notice()
    saver = saver_for(RecordingStore(str(tmp_path / "bucket")), sigterm=notice, every_s=None)
    assert not saver.on_step_end(1, writer({"w": b"1"}))
    notice.trigger()
    assert saver.on_step_end(2, writer({"w": b"2"}))  # saved, flushed: stop
    assert saver.saved_step == 2 and not saver.should_save(3)
    assert finder.latest(str(tmp_path / "bucket")).step == 2


def test_a_save_that_cannot_finish_before_the_deadline_is_skipped_and_said(tmp_path, monkeypatch, capfd) -> None:
    monkeypatch.setenv("RESPAWN_NOTICE_SECONDS", "1")  # the deadline: 0.75 s after SIGTERM
    notice = Notice()
    saver = saver_for(RecordingStore(str(tmp_path / "bucket")), sigterm=notice, every_s=None)
    saver.save(1, writer({"w": b"1"}, pause=0.8))  # a save is measured to take 0.8 s
    assert saver.flush(10)
    notice.trigger()
    assert saver.on_step_end(2, writer({"w": b"2"}, pause=0.8))  # stop, without saving
    assert saver.skipped == [2] and saver.saved_step == 1
    err = capfd.readouterr().err
    assert "SIGTERM at step 2: not saving: a save needs about 0.8 s" in err
    assert "the newest complete save stays step 1" in err
    assert finder.latest(str(tmp_path / "bucket")).step == 1


def test_a_save_that_fits_the_deadline_is_made(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RESPAWN_NOTICE_SECONDS", "30")
    notice = Notice()
    saver = saver_for(RecordingStore(str(tmp_path / "bucket")), sigterm=notice, every_s=None)
    saver.save(1, writer({"w": b"1"}, pause=0.2))
    assert saver.flush(10)
    notice.trigger()
    assert 24 < notice.left() <= 25  # Spot's 30 s less the shutdown script's 5 s margin
    assert saver.on_step_end(2, writer({"w": b"2"}))
    assert saver.skipped == [] and saver.saved_step == 2


def test_a_deadline_known_at_launch_caps_the_notice(monkeypatch) -> None:
    monkeypatch.setenv("RESPAWN_NOTICE_DEADLINE", str(time.time() + 8))
    notice = Notice()
    notice.trigger()
    assert 2 < notice.left() <= 3  # 8 s to the hard-off, less 5 s


def test_the_progress_file_carries_step_times_and_the_saved_step(tmp_path, monkeypatch) -> None:
    path = tmp_path / "progress.json"
    monkeypatch.setenv("RESPAWN_PROGRESS_FILE", str(path))
    saver = saver_for(RecordingStore(str(tmp_path / "bucket")), progress=Progress(), every_steps=4, every_s=None)
    for step in range(1, 6):
        if saver.should_save(step):
            saver.save(step, writer({"w": b"x"}, pause=0.05))
    assert saver.flush(10)
    progress = json.loads(path.read_text())
    assert set(progress) == {"step", "step_at", "save_s", "upload_s", "saved_step"}
    assert progress["step"] == 5 and progress["saved_step"] == 4
    assert progress["save_s"] >= 0.05 and isinstance(progress["upload_s"], float)
    assert datetime.fromisoformat(progress["step_at"].replace("Z", "+00:00")).tzinfo is not None
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".progress")] == []  # no temporary left


def test_an_async_write_is_uploaded_once_it_completes(tmp_path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    store = RecordingStore(str(tmp_path / "bucket"))
    saver = saver_for(store)
    with ThreadPoolExecutor(1) as pool:
        saver.save(4, lambda folder: pool.submit(writer({"late.bin": b"x"}, pause=0.3), folder))
        assert saver.flush(10)
    assert store.order == ["step-000000004-unfinished", "step-000000004/late.bin", "step-000000004/_SUCCESS",
                           "delete step-000000004-unfinished"]
    # the write in the background blocked no training: it is in the upload's time, not the save's
    assert saver.save_s < 0.3 <= saver.upload_s


def test_a_folder_the_framework_wrote_counts_its_save_from_when_it_began_not_the_copy(tmp_path) -> None:
    # HuggingFace's Trainer writes checkpoint-<step>/ itself, then calls on_save: the kit's own
    # snapshot of it (hard links) takes no time; the save that blocked training began earlier.
    folder = tmp_path / "checkpoint-7"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"w" * 8)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 7}))
    saver = saver_for(RecordingStore(str(tmp_path / "bucket")), layout=HUGGINGFACE)
    assert saver.save(7, str(folder), link=True, began=time.monotonic() - 0.4)
    assert saver.flush(10)
    assert saver.save_s >= 0.4


def test_a_file_the_finder_takes_as_a_marker_is_uploaded_after_the_rest_and_before_the_layouts_own(tmp_path) -> None:
    # a DCP save (.metadata) in the default STEP_DIR layout: with .metadata sorted first, respawn's finder called the
    # save complete after its first object; then it did once .metadata landed, before trainer_state.json and
    # _SUCCESS; now it picks nothing until the save's "-unfinished" object is removed, after the very last file
    root = str(tmp_path / "bucket")
    seen = []

    class Watching(RecordingStore):
        def put(self, local: str, name: str) -> None:
            super().put(local, name)
            found = finder.latest(root)
            seen.append((name, found.uri if found else None))

        def delete(self, name: str) -> None:
            super().delete(name)
            found = finder.latest(root)
            seen.append((f"delete {name}", found.uri if found else None))

    store = Watching(root)
    saver = saver_for(store)
    files = {".metadata": b"m", "__0_0.distcp": b"d" * 100, "a.bin": b"a", "trainer_state.json": b"{}",
             "sub/.metadata": b"x"}
    assert saver.save(7, writer(files))
    assert saver.flush(10)
    names = [n for n, _ in seen]
    assert names == ["step-000000007-unfinished", *(f"step-000000007/{n}" for n in (
        "__0_0.distcp", "a.bin", "sub/.metadata", ".metadata", "trainer_state.json", "_SUCCESS")),
        "delete step-000000007-unfinished"]
    assert [found for _, found in seen] == [None] * (len(seen) - 1) + [f"gs://{finder.BUCKET}/step-000000007"]


def test_an_async_saves_time_is_what_blocked_the_caller_never_the_queue_or_the_upload_ahead(tmp_path) -> None:
    from concurrent.futures import Future

    class SlowStore(LocalStore):
        def put(self, local: str, name: str) -> None:
            time.sleep(0.3)
            super().put(local, name)

    path = str(tmp_path / "progress.json")
    saver = saver_for(SlowStore(str(tmp_path / "bucket")), progress=Progress(path))

    def written(folder: str) -> Future:
        with open(os.path.join(folder, "w.bin"), "wb") as f:
            f.write(b"x")
        done: Future = Future()
        done.set_result(None)
        return done  # written already: it blocked the caller for next to nothing

    saver.save(1, written)
    saver.save(2, written)  # waits behind step 1's upload (0.6 s)
    assert saver.flush(10)
    with open(path) as f:
        state = json.load(f)
    assert state["save_s"] < 0.2 and saver.save_s < 0.2, state
    assert state["upload_s"] >= 0.5 and state["saved_step"] == 2, state


def test_a_dropped_async_save_keeps_its_folder_until_its_write_is_over(tmp_path) -> None:
    from concurrent.futures import Future

    store = RecordingStore(str(tmp_path / "bucket"), hold=True)
    saver = saver_for(store)
    folders: dict[int, str] = {}
    futures: dict[int, Future] = {}

    def async_write(step: int):
        def write(folder: str) -> Future:
            folders[step], futures[step] = folder, Future()
            return futures[step]
        return write

    saver.save(1, writer({"a.bin": b"a"}))
    assert store.entered.wait(5)  # step 1 uploading, held
    saver.save(2, async_write(2))  # waiting, its write in flight
    saver.save(3, async_write(3))  # drops step 2
    assert os.path.isdir(folders[2])  # still being written: not removed under the write
    with open(os.path.join(folders[2], "late.bin"), "wb") as f:
        f.write(b"x")
    futures[2].set_result(None)
    assert not os.path.exists(folders[2])  # removed once the write is over
    futures[3].set_result(None)
    store.release.set()
    assert saver.flush(10) and saver.saved_step == 3


def test_a_flush_with_no_timeout_is_bounded_by_a_notice_that_comes_meanwhile(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RESPAWN_NOTICE_SECONDS", "1")
    store = RecordingStore(str(tmp_path / "bucket"), hold=True)
    notice = Notice()
    saver = saver_for(store, sigterm=notice)
    saver.save(1, writer({"a.bin": b"a"}))
    assert store.entered.wait(5)
    result: list[bool] = []
    flushing = threading.Thread(target=lambda: result.append(saver.flush()))  # atexit's: no timeout
    flushing.start()
    time.sleep(0.3)
    began = time.monotonic()
    notice.trigger()
    flushing.join(5)
    assert result == [False] and time.monotonic() - began < 2.0  # at the hard-off (1 s), not forever
    store.release.set()


@pytest.mark.parametrize("variables, written", [({}, True), ({"RANK": "0", "LOCAL_RANK": "0"}, True),
                                                ({"RANK": "1", "LOCAL_RANK": "1"}, False),
                                                ({"LOCAL_RANK": "1"}, False)])
def test_only_global_rank_zero_writes_the_progress_file(tmp_path, monkeypatch, variables, written) -> None:
    for name in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    path = tmp_path / "progress.json"
    progress = Progress(str(path))
    progress.step(4)
    progress.update(saved_step=4)
    assert path.exists() == written


def test_a_zero_notice_is_the_30_s_default_as_the_agent_reads_it(monkeypatch) -> None:
    monkeypatch.setenv("RESPAWN_NOTICE_SECONDS", "0")
    monkeypatch.delenv("RESPAWN_NOTICE_DEADLINE", raising=False)
    notice = Notice()
    notice.trigger(now=1000.0)
    assert notice.deadline == 1000.0 + 30 - 5


# -- the notice file: the agent's word that the VM will be lost, before the SIGTERM ----------

def notice_file(path, at: float, hard_off: float, reason: str = "preempted") -> None:
    """What the agent writes: whole, through a rename."""
    path.with_suffix(".new").write_text(json.dumps({"at": at, "hard_off": hard_off, "reason": reason}))
    os.replace(path.with_suffix(".new"), path)


def test_a_notice_saves_at_the_next_step_boundary_and_training_goes_on(tmp_path, capfd) -> None:
    path = tmp_path / "notice.json"
    notice = Notice(path=str(path))
    saver = saver_for(RecordingStore(str(tmp_path / "bucket")), sigterm=notice, every_s=None)
    assert not saver.on_step_end(1, writer({"w": b"1"})) and saver.saved_step is None
    now = time.time()
    notice_file(path, now, now + 150)
    assert not saver.on_step_end(2, writer({"w": b"2"}))  # saved, and no stop: a notice is not a stop
    assert saver.flush(10) and saver.saved_step == 2 and not saver.stop_requested
    for step in (3, 4):  # one save per notice: the steps after it train on unsaved
        assert not saver.on_step_end(step, writer({"w": b"x"}))
    assert saver.flush(10) and saver.saved_step == 2
    assert "notice (preempted): saving at the next step boundary and training on" in capfd.readouterr().err
    notice.trigger()  # then the soft-off: SIGTERM's save, and the stop
    assert saver.on_step_end(5, writer({"w": b"5"}))
    assert saver.saved_step == 5 and finder.latest(str(tmp_path / "bucket")).step == 5


def test_the_deadline_follows_the_notice_files_hard_off(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RESPAWN_NOTICE_SECONDS", "150")  # the agent's: 120 s of notice, then 30 s of shutdown
    path = tmp_path / "notice.json"
    notice = Notice(path=str(path))
    assert notice.deadline is None and not notice.poll()
    notice_file(path, 1000.0, 1150.0)
    assert notice.poll() and notice.warned and not notice.requested
    assert notice.deadline == 1150.0 - 5  # the hard-off less the shutdown script's margin
    notice.trigger(now=1121.0)  # SIGTERM at the soft-off: the file still says when the hard-off comes
    assert notice.deadline == 1145.0 and notice.until_hard_off(now=1121.0) == 29.0
    notice_file(path, 1000.0, 1152.5)  # the shutdown script's own reckoning at the soft-off
    assert not notice.poll()  # no second notice...
    assert notice.deadline == 1147.5  # ...but its hard-off


def test_without_a_notice_file_that_says_more_sigterm_counts_from_its_arrival(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RESPAWN_NOTICE_SECONDS", "30")
    path = tmp_path / "notice.json"
    notice = Notice(path=str(path))
    notice_file(path, 1000.0, 1030.0, reason="maintenance")  # a maintenance reckoned a 0 s notice; it came later
    notice.poll()
    notice.trigger(now=2000.0)
    assert notice.deadline == 2000.0 + 30 - 5
    bare = Notice(path=str(tmp_path / "none.json"))
    bare.trigger(now=2000.0)
    assert bare.deadline == 2025.0


def test_a_notice_save_that_cannot_land_before_the_deadline_is_skipped_and_said(tmp_path, capfd) -> None:
    path = tmp_path / "notice.json"
    notice = Notice(path=str(path))
    saver = saver_for(RecordingStore(str(tmp_path / "bucket")), sigterm=notice, every_s=None)
    saver.save(1, writer({"w": b"1"}, pause=0.8))
    assert saver.flush(10)
    now = time.time()
    notice_file(path, now, now + 1.0)  # the deadline 0.75 s away: the 0.8 s save cannot land before it
    assert not saver.on_step_end(2, writer({"w": b"2"}))
    assert saver.skipped == [2] and saver.saved_step == 1
    assert "the notice at step 2: not saving: a save needs about 0.8 s" in capfd.readouterr().err


@pytest.mark.parametrize("body", ["{", '{"at": 5}', '{"at": 10, "hard_off": 5}', '{"at": "NaN", "hard_off": 9}', "[]"])
def test_a_notice_file_that_makes_no_sense_is_no_notice(tmp_path, capfd, body) -> None:
    path = tmp_path / "notice.json"
    path.write_text(body)
    notice = Notice(path=str(path))
    assert not notice.poll() and not notice.noticed and notice.deadline is None
    assert "notice file" in capfd.readouterr().err
