"""respawnkit.torch: a plain PyTorch loop's saves with ``torch.distributed.checkpoint``.

Each save is a DCP checkpoint (``async_save`` where this torch has it: the state is staged
and the loop goes on while it is written) in a local folder, uploaded as
``step-<step>/`` with ``.metadata`` last, the file DCP's coordinator writes after every
shard and respawn's finder takes as the proof of a whole save::

    ckpt = Checkpointer(model, optimizer)
    start = ckpt.resume()  # the step to start after: 0 on a fresh start
    for step in range(start + 1, steps + 1):
        train_one_step(step)
        if ckpt.step_end(step):
            break  # SIGTERM: saved (when it fitted the notice) and flushed

With several ranks (a process group of more than one), each rank writes its shards into a
folder of its own (on its own machine, often) and uploads them; rank zero uploads ``.metadata``
only once every rank's shards have landed, which the ranks tell each other at the step
boundary and in ``finish()`` (``CheckpointSaver(gather=...)``): a save is never complete
without every rank's part. ``step_end`` and ``finish`` must be called on every rank. An
asynchronous save's collectives run on a gloo group of their own, one save at a time, so they
never meet the training's, nor the ranks' agreement, on the default group.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from respawnkit.dist import torch_all_gather, torch_broadcast, world_size
from respawnkit.layouts import DCP
from respawnkit.resume import resume_from
from respawnkit.saver import ADVICE, CheckpointSaver


class Checkpointer:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, uri: str | None = None,
                 *, use_async: bool = True, every_s: Any = ADVICE, every_steps: int | None = None, **saver: Any) -> None:
        self.model, self.optimizer = model, optimizer
        self.use_async = use_async and hasattr(dcp, "async_save")
        saver.setdefault("agree", torch_broadcast)  # every rank decides as rank zero does (a DCP save is collective)
        self._group: Any = None  # an async save's own process group (several ranks)
        self._writing: Any = None  # the async save under way
        if world_size() > 1:
            # rank zero's .metadata waits for every rank's shards; the ranks say which landed over a gloo group of
            # their own. On the default one, DDP's reducer, which holds it, could outlive destroy_process_group()
            # and free it holding the GIL while gloo's thread still frees the gather's tensors, which needs the
            # GIL: the rank hung at exit (torch 2.13)
            agreement = torch.distributed.new_group(backend="gloo")
            saver.setdefault("gather", lambda value: torch_all_gather(value, agreement))
            if self.use_async:  # its collectives run in a thread of DCP's: never on a group another thread uses
                self._group = torch.distributed.new_group(backend="gloo")
        self.saver = CheckpointSaver(uri, DCP, every_s=every_s, every_steps=every_steps, **saver)

    def state(self) -> dict[str, Any]:
        if self.optimizer is None:
            return {"model": self.model.state_dict()}
        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer}

    def write(self, folder: str) -> Any:
        """One DCP save into ``folder``: a future when asynchronous (the saver uploads once it resolves)."""
        if self.use_async:
            if self._group is not None and self._writing is not None:  # two saves' collectives must not interleave
                with contextlib.suppress(Exception):  # its failure is its upload's to report
                    self._writing.result()
            self._writing = dcp.async_save(self.state(), checkpoint_id=folder, process_group=self._group)
            return self._writing
        dcp.save(self.state(), checkpoint_id=folder)
        return None

    def step_end(self, step: int) -> bool:
        """After step ``step`` (on every rank): save when due; True when SIGTERM came (saved if it fitted, flushed):
        stop."""
        return self.saver.on_step_end(step, self.write)

    def finish(self) -> bool:
        """After the last step (on every rank): flush the uploads (until the hard-off after a notice), complete the
        saves every rank's part of which landed, and write the last step to the progress file. Called at exit too,
        when the loop ends without it (a flush only: no save of several ranks is completed there)."""
        return self.saver.finish()

    def resume(self, download_to: str | None = None) -> int:
        """Load respawn's choice into the model and optimizer; the step it holds (0 on a fresh start)."""
        chosen = resume_from(download_to=download_to or tempfile.mkdtemp(prefix="respawn-resume-"))
        if chosen is None:
            return 0
        state = self.state()
        dcp.load(state, checkpoint_id=os.fspath(chosen))
        if self.optimizer is None:
            self.model.load_state_dict(state["model"])
        else:
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optimizer"])
        if chosen.step is None:
            raise ValueError(f"{chosen.uri} names no step: set RESUME_STEP")
        return chosen.step
