"""respawnkit.hf: respawn's contract around a HuggingFace ``transformers.Trainer``.

The callback never saves by itself (the framework's idiom: ``on_step_end`` sets
``control.should_save``): on SIGTERM it asks the Trainer for a save at the step that just
ended, and for a stop, unless the save would not fit the notice; at a preemption notice (the
agent's notice file) for a save only, training going on; with respawn's advised
interval (``RESPAWN_CHECKPOINT_EVERY_S``) or ``every_steps`` it asks for periodic saves.
Every save the Trainer makes, its own ``save_strategy``'s included, is uploaded from
``<output_dir>/checkpoint-<step>/`` to the checkpoint prefix with ``trainer_state.json``
last, the file respawn's finder takes as the proof of a whole HuggingFace save::

    callback = RespawnCallback()
    trainer = Trainer(model, args, train_dataset=data, callbacks=[callback])
    trainer.train(resume_from_checkpoint=resume_checkpoint(args.output_dir))

Only the world's process zero uploads (its output_dir holds the save). The Trainer's save is
collective: whether to save, and to stop, is decided on process zero and broadcast to every
rank (``torch.distributed.broadcast_object_list`` when a process group is up).
"""

from __future__ import annotations

import os
import time
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from respawnkit.dist import torch_broadcast
from respawnkit.layouts import HUGGINGFACE
from respawnkit.resume import resume_from
from respawnkit.saver import ADVICE, CheckpointSaver


def resume_checkpoint(download_to: str) -> str | None:
    """The folder to pass as ``trainer.train(resume_from_checkpoint=...)``: respawn's choice, fetched under
    ``download_to`` (the output_dir is a good place), or None on a fresh start."""
    resume = resume_from(download_to=os.path.join(download_to, "respawn-resume"))
    return None if resume is None else resume.path


class RespawnCallback(TrainerCallback):
    def __init__(self, uri: str | None = None, *, every_s: Any = ADVICE, every_steps: int | None = None,
                 max_pending: int = 1, **saver: Any) -> None:
        # built here, on the main thread, so that SIGTERM is handled from the start
        self._stage_beside_output = saver.get("staging_dir") is None
        self.saver = CheckpointSaver(uri, HUGGINGFACE, every_s=every_s, every_steps=every_steps,
                                     max_pending=max_pending, **saver)
        self._began: float | None = None  # when the Trainer was asked for the save it is writing

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        # Saves are hard-linked from output_dir into the staging folder: on another filesystem (the default
        # temporary folder often is) a link fails and each save is copied whole, blocking training. By default,
        # stage in output_dir itself (a hidden folder the Trainer never rotates).
        if self._stage_beside_output and state.is_world_process_zero:
            self._stage_beside_output = False
            os.makedirs(args.output_dir, exist_ok=True)
            self.saver.stage_in(args.output_dir)
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.saver.leader = bool(state.is_world_process_zero)
        self.saver.agree = torch_broadcast
        if self.saver.should_save(state.global_step):
            control.should_save = True
        if self.saver.stop_requested:
            control.should_training_stop = True
        # The Trainer writes its save after the step's callbacks (its own save_steps included, set
        # by the flow callback before this one) and calls on_save once it is written: its time,
        # which blocks training, is from here to there, not the copy on_save makes.
        self._began = time.monotonic() if control.should_save else None
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.saver._last_save = time.monotonic()  # every rank: the Trainer's own saves count as saves too
        if state.is_world_process_zero:
            folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
            # a new folder each save: links are safe
            self.saver.save(state.global_step, folder, link=True, began=self._began)
        self._began = None
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.saver.finish()
        return control
