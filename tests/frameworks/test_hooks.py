"""The framework hooks in process, without a run: where HuggingFace saves are staged, and what the torch
helper leaves in the progress file."""

from __future__ import annotations

import json
import os
import types

import pytest

from respawnkit.notice import Notice
from respawnkit.progress import Progress
from respawnkit.stores import LocalStore


def test_huggingface_saves_are_staged_beside_output_dir_so_they_are_linked_never_copied(tmp_path) -> None:
    from respawnkit.hf import RespawnCallback

    output = tmp_path / "out"
    callback = RespawnCallback(store=LocalStore(str(tmp_path / "bucket")), every_s=None, sigterm=Notice(),
                               progress=Progress(""))
    args = types.SimpleNamespace(output_dir=str(output))
    state = types.SimpleNamespace(global_step=3, is_world_process_zero=True)
    callback.on_train_begin(args, state, types.SimpleNamespace())
    root = callback.saver._staging_root
    assert os.path.dirname(root) == str(output)  # the same filesystem as the Trainer's saves
    linked = []
    real_link = os.link
    os.link = lambda a, b: (linked.append(b), real_link(a, b))[1]
    try:
        folder = output / "checkpoint-3"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"w" * 100)
        (folder / "trainer_state.json").write_text("{}")
        callback.on_save(args, state, types.SimpleNamespace())
    finally:
        os.link = real_link
    assert callback.saver.flush(10) and callback.saver.saved_step == 3
    assert len(linked) == 2 and all(p.startswith(root) for p in linked)


def test_the_torch_helpers_last_step_reaches_the_progress_file_when_the_loop_ends(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    from respawnkit.torch import Checkpointer

    path = str(tmp_path / "progress.json")
    ckpt = Checkpointer(torch.nn.Linear(2, 1), uri=str(tmp_path / "bucket"), every_s=None, use_async=False,
                        sigterm=Notice(), progress=Progress(path))
    for step in (1, 2, 3):
        assert not ckpt.step_end(step)  # step 1 written, then throttled
    ckpt.saver._at_exit()  # what atexit runs when the loop just ends
    with open(path) as f:
        assert json.load(f)["step"] == 3
    assert ckpt.finish()
