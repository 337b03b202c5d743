"""respawnkit: the trainer's side of respawn's contract, with nothing but the standard library.

- ``resume_from(download_to=None)``: the checkpoint respawn chose (``RESUME_FROM``), or None.
- ``CheckpointSaver``: save locally, upload in the background to ``RESPAWN_CHECKPOINT_URI``
  (a gs:// prefix, or a local folder) with the completion marker last; on SIGTERM, one more
  save at the next step boundary when it fits the notice, then a flush.
- ``checkpoint_every()``: respawn's advised seconds between saves, or None.
- The progress file (``RESPAWN_PROGRESS_FILE``): see ``respawnkit.progress``.

Framework hooks live in their own modules, imported only when asked for:
``respawnkit.hf`` (transformers), ``respawnkit.lightning``, ``respawnkit.torch``
(torch.distributed.checkpoint), ``respawnkit.jax`` (Orbax).
"""

from __future__ import annotations

from respawnkit import env
from respawnkit.layouts import DCP, HUGGINGFACE, LIGHTNING_LAST, LIGHTNING_STEPS, ORBAX, STEP_DIR, Layout
from respawnkit.resume import Resume, download, resume_from
from respawnkit.saver import CheckpointSaver

__all__ = ["CheckpointSaver", "DCP", "HUGGINGFACE", "LIGHTNING_LAST", "LIGHTNING_STEPS", "Layout", "ORBAX",
           "Resume", "STEP_DIR", "checkpoint_every", "download", "resume_from"]


def checkpoint_every() -> float | None:
    """``RESPAWN_CHECKPOINT_EVERY_S``: respawn's advice (Young/Daly from measured save times and losses), None
    until it has one."""
    return env.number("RESPAWN_CHECKPOINT_EVERY_S")
