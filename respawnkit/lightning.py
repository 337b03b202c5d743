"""respawnkit.lightning: respawn's contract as a Lightning ``Callback``.

After each optimizer step (``on_train_batch_end``), the callback asks the saver whether to
save (a preemption notice, SIGTERM, respawn's advised interval, ``every_steps``); a save is
Lightning's own ``trainer.save_checkpoint`` into a local folder, uploaded in the background as
``step-<step>.ckpt`` (numbered single objects: the finder's "files"), or as ``last.ckpt``
with ``layout=LIGHTNING_LAST``. A notice only saves: ``fit`` goes on. On SIGTERM it saves,
flushes, and sets ``trainer.should_stop``; Lightning's own SIGTERM handling (chained with the
kit's) then ends ``fit`` by raising its ``SIGTERMException``, a ``SystemExit``, after the
callback's save::

    callback = RespawnCallback()
    trainer = L.Trainer(callbacks=[callback], ...)
    trainer.fit(model, data, ckpt_path=resume_checkpoint("/tmp/resume"))

``save_checkpoint`` runs on every rank (a strategy may need them all; it ends in a barrier);
only global rank zero's save is uploaded. Whether to save, and whether to stop, is decided
on global rank zero and broadcast (``trainer.strategy.broadcast``), so every rank saves at
the same steps.

Several ranks: Lightning's own SIGTERM handler (``_SignalConnector._sigterm_notifier_fn``, 2.x)
runs a ``torch.distributed.broadcast`` inside the handler, once per SIGTERM a rank receives.
A preemption signals the whole process group and Lightning's launcher forwards rank zero's
SIGTERM to the other local ranks, so they receive it twice (or once, when the two arrive
before the handler runs) while rank zero receives it once: the ranks' collectives get out of
step (a broadcast paired with another rank's all-reduce, or the kit's broadcast) and the run
hangs. With more than one rank the callback replaces that handler (at ``setup``, before
Lightning installs it): a SIGTERM only records the notice (and is forwarded to the launched
ranks once, as Lightning does), with no collective; the decision is taken at the next step
boundary by the kit's broadcast, the one collective every rank makes there, and once every
rank knows it, each marks Lightning's ``received_sigterm`` so that Lightning ends ``fit``
with its ``SIGTERMException`` on every rank at the same point.
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
        self._stopped = False  # the ranks agreed to stop at a step boundary
        self._took_over = False  # this callback, not Lightning's handler, answers SIGTERM (several ranks)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._stopped = False  # the ranks agreed to stop (at a step boundary), Lightning is told
        self._took_over = stage == "fit" and self._take_over_sigterm(trainer)

    def _take_over_sigterm(self, trainer: Any) -> bool:
        """Several ranks: replace Lightning's SIGTERM handler, which runs a collective per signal received, with one
        that only records the notice. Lightning registers it after the ``setup`` hooks."""
        connector = getattr(trainer, "_signal_connector", None)
        if getattr(trainer, "world_size", 1) <= 1 or not hasattr(connector, "_sigterm_notifier_fn"):
            return False
        notice = self.saver.notice
        forwarded = []

        def notifier(signum: Any, frame: Any) -> None:
            if not forwarded:  # as Lightning does: the ranks its launcher started get the signal too, once
                forwarded.append(signum)
                launcher = getattr(trainer.strategy, "launcher", None)
                if launcher is not None:
                    launcher.kill(signum)
            notice.trigger()

        connector._sigterm_notifier_fn = notifier
        return True

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._save_when_due(trainer)
        if self.saver.stop_requested:
            self.saver.finish()
            trainer.should_stop = True
            self._stopped = True
            if self._took_over:
                # every rank has rank zero's decision: every rank raises Lightning's SIGTERMException at the same point
                trainer._signal_connector.received_sigterm = True

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        # A SIGTERM that came after this callback's on_train_batch_end (in the module's own hook, in validation)
        # ends the fit with Lightning's SIGTERMException before the next one: the notice's save, at the step
        # that ended, is made here (once: should_save answers a notice one time). One process only: with
        # several ranks, Lightning's SIGTERMException comes after the ranks agreed (and saved) at a step
        # boundary, and an exception may be one rank's alone, so no collective is made here.
        if not self._took_over and not self._stopped and (
                self.saver.notice.requested or type(exception).__name__ == "SIGTERMException"):
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
