"""A transformers Trainer with respawnkit.hf's callback: see harness.py for the protocol. A one-layer GPT-2
built from its config (nothing from the hub), on token sequences drawn from a seed."""

from __future__ import annotations

import os
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments, set_seed

from respawnkit.hf import RespawnCallback, resume_checkpoint
from tests.frameworks import uploads


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 64, (n, 16), generator=torch.Generator().manual_seed(7))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Printing(Trainer):
    """Each step's loss, unrounded (the Trainer's own log rounds it)."""

    def training_step(self, model, inputs, num_items_in_batch=None):  # noqa: ANN001, ANN201
        loss = super().training_step(model, inputs, num_items_in_batch)
        print(f"step {self.state.global_step + 1} loss {loss.item()!r}", flush=True)
        return loss


class Slow(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        time.sleep(float(os.environ.get("STEP_S", "0")))


def main() -> int:
    uploads.install()
    torch.set_num_threads(1)
    work = os.environ["WORK"]
    output = os.path.join(work, "output")
    args = TrainingArguments(output_dir=output, max_steps=int(os.environ["STEPS"]), per_device_train_batch_size=4,
                             learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=[], seed=0,
                             data_seed=0, use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    set_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=16,
                                       bos_token_id=0, eos_token_id=0))
    callback = RespawnCallback(every_s=None, every_steps=int(os.environ.get("SAVE_EVERY", "5")))
    trainer = Printing(model=model, args=args, train_dataset=Tokens(256), callbacks=[Slow(), callback])
    trainer.train(resume_from_checkpoint=resume_checkpoint(work))
    return 143 if callback.saver.stop_requested else 0


if __name__ == "__main__":
    sys.exit(main())
