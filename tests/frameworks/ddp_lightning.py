"""A 2-process Lightning DDP fit (CPU, gloo) with respawnkit's callback and a short advised interval
(RESPAWN_CHECKPOINT_EVERY_S): rank 1's steps are slower, so its own clock would disagree with rank 0's and
enter save_checkpoint's barrier at other steps. Each rank prints ``rank R saved S`` for every save it takes
part in, and ``rank R done`` at the end."""

from __future__ import annotations

import os
import sys
import time

import lightning as L
import torch

from respawnkit.lightning import RespawnCallback


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        time.sleep(float(os.environ.get("STEP_S", "0.03")) * (self.global_rank + 1))
        if self.global_rank == 0:
            print(f"step {self.global_step + 1}", flush=True)
        return self.net(torch.ones(2, 4)).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Recording(RespawnCallback):
    def _save_when_due(self, trainer: object) -> None:
        asked = self.saver.should_save
        def should_save(step: int) -> bool:
            answer = asked(step)
            if answer:
                print(f"rank {trainer.global_rank} saved {step}", flush=True)
            return answer
        self.saver.should_save = should_save
        try:
            super()._save_when_due(trainer)
        finally:
            self.saver.should_save = asked


def main() -> int:
    torch.set_num_threads(1)
    callback = Recording()
    trainer = L.Trainer(max_steps=int(os.environ.get("STEPS", "30")), accelerator="cpu", devices=2, strategy="ddp",
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[callback])
    try:
        trainer.fit(Model(), torch.utils.data.DataLoader(list(range(10_000)), batch_size=1))
    except SystemExit:  # Lightning's SIGTERMException, on every rank once they agreed to stop
        if not callback.saver.stop_requested:
            raise
    if callback.saver.stop_requested:
        print(f"rank {trainer.global_rank} stopped {trainer.global_step}", flush=True)
    print(f"rank {trainer.global_rank} done", flush=True)
    return 143 if callback.saver.stop_requested else 0


if __name__ == "__main__":
    sys.exit(main())
