"""A Lightning fit with respawnkit.lightning's callback: see harness.py for the protocol. Each step's batch is
drawn from the global step (the DataLoader only counts), so a resumed run sees the batches it would have."""

from __future__ import annotations

import os
import signal
import sys
import time

import lightning as L
import torch

from respawnkit.lightning import RespawnCallback, resume_checkpoint
from tests.frameworks import uploads


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(1000 + self.global_step)
        x = torch.randn(16, 8, generator=g)
        loss = torch.nn.functional.mse_loss(self.net(x), x.sum(dim=1, keepdim=True).sin())
        print(f"step {self.global_step + 1} loss {loss.item()!r}", flush=True)
        return loss

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        # Lightning calls this after the callbacks' on_train_batch_end: SIGTERM_SELF_AT puts the notice there
        if self.global_step == int(os.environ.get("SIGTERM_SELF_AT", "0")):
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(float(os.environ.get("STEP_S", "0")))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def main() -> int:
    uploads.install()
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    callback = RespawnCallback(every_s=None, every_steps=int(os.environ.get("SAVE_EVERY", "5")))
    trainer = L.Trainer(max_steps=int(os.environ["STEPS"]), accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[callback])
    data = torch.utils.data.DataLoader(list(range(10_000)), batch_size=1)
    try:
        trainer.fit(Model(), data, ckpt_path=resume_checkpoint(os.path.join(os.environ["WORK"], "resume")))
    except SystemExit:  # Lightning ends a SIGTERMed fit with its SIGTERMException, after the callback's save
        if not callback.saver.stop_requested:
            raise
    return 143 if callback.saver.stop_requested else 0


if __name__ == "__main__":
    sys.exit(main())
