"""respawnkit.lightning: respawn's contract as a Lightning ``Callback``.

After each optimizer step (``on_train_batch_end``), the callback asks the saver whether to
save (SIGTERM, respawn's advised interval, ``every_steps``); a save is Lightning's own
``trainer.save_checkpoint`` into a local folder, uploaded in the background as
``step-<step>.ckpt`` (numbered single objects: the finder's "files"), or as ``last.ckpt``
with ``layout=LIGHTNING_LAST``. On SIGTERM it saves, flushes, and sets ``trainer.should_stop``;
Lightning's own SIGTERM handling (chained with the kit's) then ends ``fit`` by raising its
``SIGTERMException``, a ``SystemExit``, after the callback's save::

    callback = RespawnCallback()
    trainer = L.Trainer(callbacks=[callback], ...)
    trainer.fit(model, data, ckpt_path=resume_checkpoint("/tmp/resume"))

``save_checkpoint`` runs on every rank (a strategy may need them all; it ends in a barrier);
only global rank zero's save is uploaded. Whether to save, and whether to stop, is decided
on global rank zero and broadcast (``trainer.strategy.broadcast``), so every rank saves at
the same steps.
"""

from __future__ import annotations

import os
from typing import Any

try:
    from lightning.pytorch import Callback
except ImportError:  # the older package name
    from pytorch_lightning import Callback

from respawnkit.layouts import LIGHTNING_STEPS, Layout
from respawnkit.resume import resume_from
from respawnkit.saver import ADVICE, CheckpointSaver


def resume_checkpoint(download_to: str) -> str | None:
    """The file to pass as ``trainer.fit(..., ckpt_path=...)``, fetched under ``download_to``; None on a fresh start."""
    resume = resume_from(download_to=download_to)
    return None if resume is None else resume.path


class RespawnCallback(Callback):
    def __init__(self, uri: str | None = None, layout: Layout = LIGHTNING_STEPS, *, every_s: Any = ADVICE,
                 every_steps: int | None = None, max_pending: int = 1, **saver: Any) -> None:
        self.saver = CheckpointSaver(uri, layout, every_s=every_s, every_steps=every_steps,
                                     max_pending=max_pending, **saver)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._save_when_due(trainer)
        if self.saver.stop_requested:
            self.saver.finish()
            trainer.should_stop = True

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        # A SIGTERM that came after this callback's on_train_batch_end (in the module's own hook, in validation)
        # ends the fit with Lightning's SIGTERMException before the next one: the notice's save, at the step
        # that ended, is made here (once: should_save answers a notice one time).
        # Lightning broadcasts a SIGTERM to every rank and raises it on all of them at the same point.
        if self.saver.notice.requested or type(exception).__name__ == "SIGTERMException":
            self._save_when_due(trainer)
        self.saver.finish()

    def _save_when_due(self, trainer: Any) -> None:
        step = trainer.global_step
        self.saver.leader = bool(trainer.is_global_zero)
        self.saver.agree = lambda value: trainer.strategy.broadcast(value, src=0)
        if self.saver.should_save(step):
            if trainer.is_global_zero:
                self.saver.save(step, lambda folder: trainer.save_checkpoint(os.path.join(folder, "save.ckpt")))
            else:
                trainer.save_checkpoint(os.path.join(self.saver._staging_root, "rank.ckpt"))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.saver.finish()
