"""A save every rank writes part of (DCP's: each rank its shards, the coordinator .metadata) is complete only once
every rank's part has landed: each rank uploads its own part, and rank zero its completion files only after the
ranks said, at a step boundary or in finish(), that every part landed. Ranks are threads here, meeting at a barrier
as torch.distributed's collectives do."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from respawnkit import DCP, CheckpointSaver
from respawnkit.notice import Notice
from respawnkit.progress import Progress
from tests.kit import finder
from tests.kit.test_saver import RecordingStore, writer

SHARDS = {0: {"__0_0.distcp": b"zero" * 10, ".metadata": b"meta"}, 1: {"__1_0.distcp": b"one" * 10}}


class World:
    """The ranks' collectives: every rank's value to every rank, once all have called."""

    def __init__(self, size: int) -> None:
        self.barrier = threading.Barrier(size, timeout=10)
        self.values: list[Any] = [None] * size
        self.calls = 0

    def gather(self, rank: int) -> Callable[[Any], list[Any]]:
        def call(value: Any) -> list[Any]:
            self.values[rank] = value
            self.barrier.wait()
            out = list(self.values)
            if rank == 0:
                self.calls += 1
            self.barrier.wait()
            return out
        return call

    def agree(self, rank: int) -> Callable[[Any], Any]:
        return lambda value: self.gather(rank)(value)[0]


def ranks(root: str, world: World, hold_rank_one: bool = False) -> tuple[list[CheckpointSaver], list[RecordingStore]]:
    stores = [RecordingStore(root), RecordingStore(root, hold=hold_rank_one)]
    savers = [CheckpointSaver(store=stores[r], layout=DCP, every_s=None, every_steps=5, sigterm=Notice(),
                              progress=Progress(path=""), leader=r == 0, agree=world.agree(r), gather=world.gather(r))
              for r in (0, 1)]
    return savers, stores


def on_every_rank(work: Callable[[int], Any]) -> list[Any]:
    out: list[Any] = [None, None]
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            out[rank] = work(rank)
        except BaseException as e:  # noqa: BLE001 - the test's thread: handed to the test
            errors.append(e)
    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return out


def picked(root: str) -> str | None:
    found = finder.latest(root)
    return found.uri.rsplit("/", 1)[1] if found else None


def test_a_save_of_several_ranks_is_complete_only_once_every_ranks_part_landed(tmp_path) -> None:
    root = str(tmp_path / "bucket")
    world = World(2)
    savers, stores = ranks(root, world, hold_rank_one=True)

    def steps(first: int, last: int) -> Callable[[int], list[bool]]:
        def loop(rank: int) -> list[bool]:
            saved = []
            for step in range(first, last + 1):
                if savers[rank].should_save(step):
                    saved.append(step)
                    savers[rank].save(step, writer(SHARDS[rank]))
            return saved
        return loop

    assert on_every_rank(steps(1, 7)) == [[5], [5]]
    assert stores[1].entered.wait(5)  # rank one's shard is held mid-upload
    assert savers[0].flush(10)  # rank zero's own part; its .metadata waits for rank one's
    assert "step-000000005/__0_0.distcp" in stores[0].order and picked(root) is None  # rank zero's part alone
    assert not any(n.endswith(".metadata") for n in stores[0].order)
    stores[1].release.set()
    assert savers[1].flush(10)  # rank one's part landed, but nobody has said so yet
    assert picked(root) is None
    on_every_rank(steps(8, 8))  # the next step boundary: the ranks say which parts landed
    assert savers[0].flush(10) and picked(root) == "step-000000005"
    assert stores[0].order[-2:] == ["step-000000005/.metadata", "delete step-000000005-unfinished"]
    assert stores[1].order == ["step-000000005/__1_0.distcp"]  # rank one's part: its shard, nothing that completes
    assert savers[0].saved_step == 5


def test_finish_on_every_rank_completes_the_saves_whose_parts_landed(tmp_path) -> None:
    root = str(tmp_path / "bucket")
    world = World(2)
    savers, _ = ranks(root, world)

    def loop(rank: int) -> bool:
        for step in range(1, 11):
            if savers[rank].should_save(step):
                savers[rank].save(step, writer(SHARDS[rank]))
        return savers[rank].finish()

    assert on_every_rank(loop) == [True, True]
    assert picked(root) == "step-000000010"
    assert sorted(n.name for n in (tmp_path / "bucket" / "step-000000010").iterdir()) == \
        [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert not (tmp_path / "bucket" / "step-000000010-unfinished").exists()


def test_a_save_whose_part_failed_on_another_rank_is_never_completed_and_it_is_said(tmp_path, capfd) -> None:
    root = str(tmp_path / "bucket")
    world = World(2)
    savers, stores = ranks(root, world)

    def refuse(local: str, name: str) -> None:
        if name.startswith("step-000000010/"):
            raise OSError("refused")
        RecordingStore.put(stores[1], local, name)
    stores[1].put = refuse  # type: ignore[method-assign]

    def loop(rank: int) -> bool:
        for step in range(1, 13):
            if savers[rank].should_save(step):
                savers[rank].save(step, writer(SHARDS[rank]))
        return savers[rank].finish()

    assert on_every_rank(loop) == [True, False]  # rank one's upload failed: its finish says so
    assert picked(root) == "step-000000005"
    assert not (tmp_path / "bucket" / "step-000000010" / ".metadata").exists()
    assert "step 10: another rank's part of the save failed or was dropped: it is not completed" in \
        capfd.readouterr().err


def test_another_ranks_part_holding_what_completes_a_save_is_refused(tmp_path) -> None:
    root = str(tmp_path / "bucket")
    world = World(2)
    savers, _ = ranks(root, world)
    parts = {0: SHARDS[0], 1: {"__1_0.distcp": b"one", ".metadata": b"not rank one's to write"}}

    def loop(rank: int) -> bool:
        savers[rank].save(5, writer(parts[rank]))
        return savers[rank].finish()

    assert on_every_rank(loop) == [True, False]
    assert "only global rank zero's part may hold them" in savers[1].errors[0]
    assert picked(root) is None
