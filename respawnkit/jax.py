"""respawnkit.jax: JAX state saved with Orbax, uploaded in respawn's Orbax layout.

Each save is Orbax's ``StandardCheckpointer`` (asynchronous: the loop goes on while it is
written) into a local folder, uploaded as ``<step>/state/...`` with
``<step>/commit_success.txt`` last, what Orbax itself writes last on Cloud Storage and
respawn's finder takes as the proof of a whole save::

    ckpt = OrbaxCheckpointer()
    state, start = ckpt.resume(state)  # the abstract or initial state in, the restored one out
    for step in range(start + 1, steps + 1):
        state = train_step(state)
        if ckpt.step_end(step, state):
            break

Untested in this repository's suite unless jax and orbax-checkpoint are installed
(tests/frameworks/test_frameworks.py says so).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import orbax.checkpoint as ocp

from respawnkit.layouts import ORBAX
from respawnkit.resume import resume_from
from respawnkit.saver import ADVICE, CheckpointSaver


class _Pending:
    """What the saver waits on before uploading: Orbax's background write."""

    def __init__(self, checkpointer: Any) -> None:
        self.checkpointer = checkpointer

    def result(self) -> None:
        self.checkpointer.wait_until_finished()


class OrbaxCheckpointer:
    def __init__(self, uri: str | None = None, *, every_s: Any = ADVICE, every_steps: int | None = None,
                 **saver: Any) -> None:
        self.checkpointer = ocp.StandardCheckpointer()
        self.saver = CheckpointSaver(uri, ORBAX, every_s=every_s, every_steps=every_steps, **saver)

    def step_end(self, step: int, state: Any) -> bool:
        def write(folder: str) -> _Pending:
            self.checkpointer.save(os.path.join(folder, "state"), state)
            return _Pending(self.checkpointer)

        return self.saver.on_step_end(step, write)

    def resume(self, state: Any, download_to: str | None = None) -> tuple[Any, int]:
        chosen = resume_from(download_to=download_to or tempfile.mkdtemp(prefix="respawn-resume-"))
        if chosen is None:
            return state, 0
        restored = self.checkpointer.restore(os.path.join(os.fspath(chosen), "state"), state)
        return restored, chosen.step or 0
