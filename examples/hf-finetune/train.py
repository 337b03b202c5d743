"""Fine-tune a causal language model with the Hugging Face ``Trainer``, on Spot VMs that respawn recreates.

respawnkit (``respawnkit.hf``) does respawn's side: the Trainer resumes from the checkpoint respawn chose
(``RESUME_FROM``, downloaded), every save is uploaded in the background to ``RESPAWN_CHECKPOINT_URI`` with
``trainer_state.json`` last, and a preemption's SIGTERM becomes one last save at the next step boundary,
then a stop (exit 143)::

    python train.py                          # a tiny GPT-2 built from its config: no download, runs on a CPU
    python train.py --model gpt2 --steps 2000 --batch-size 16    # a hub model, on the GPU when there is one
    python train.py --data corpus.txt        # your text instead of the built-in arithmetic sentences

The device is CUDA when there is one (``--device cpu`` forces the CPU), in bf16 mixed precision where the
GPU supports it. ``--deterministic`` makes a resumed run compute bit for bit what an uninterrupted one does
(the Trainer's ``full_determinism``, eager attention): what ``bench/gpu_e2e.py`` checks. Each step prints
``step N loss X`` (``--loss-log FILE`` also appends it, as JSON lines with the time and attempt), and a
finished run prints ``final weights <digest>``.

Run it alone with ``RESPAWN_CHECKPOINT_URI`` set to a folder (or a gs:// prefix), or as respawn's job:
``spec.yaml`` beside this file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time

import torch
from transformers import (AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, Trainer,
                          TrainerCallback, TrainingArguments, set_seed)

from respawnkit.hf import RespawnCallback, resume_checkpoint


def options(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="a hub model to fine-tune (e.g. gpt2); default: a tiny GPT-2 from its config")
    p.add_argument("--layers", type=int, default=2, help="the tiny model's layers (without --model)")
    p.add_argument("--width", type=int, default=64, help="the tiny model's embedding width (without --model)")
    p.add_argument("--data", help="a text file to train on; default: generated arithmetic sentences")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--block-size", type=int, default=64, help="tokens per training sequence")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--save-every", type=int, default=50, help="steps between saves (respawn's advised interval, "
                   "RESPAWN_CHECKPOINT_EVERY_S, is followed too when set)")
    p.add_argument("--output-dir", default="output", help="the Trainer's local folder (saves, the final model)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--deterministic", action="store_true", help="bit-for-bit reproducible, also across resumes")
    p.add_argument("--loss-log", help="append each step's loss here (JSON lines)")
    p.add_argument("--pause", type=float, default=0.0, help="seconds to sleep after each step (demos, tests)")
    return p.parse_args(argv)


def arithmetic(n: int, seed: int = 0) -> str:
    """Sentences a small model can learn: ``17 plus 25 is 42.``"""
    rng = random.Random(seed)
    return "\n".join(f"{a} plus {b} is {a + b}." for a, b in ((rng.randrange(100), rng.randrange(100))
                                                                for _ in range(n)))


class Blocks(torch.utils.data.Dataset):
    """The text's tokens cut into blocks of ``size``, each its own label (the model shifts them)."""

    def __init__(self, ids: list[int], size: int) -> None:
        count = len(ids) // size
        self.ids = torch.tensor(ids[: count * size], dtype=torch.long).view(count, size)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def model_and_tokens(o: argparse.Namespace, text: str) -> tuple[torch.nn.Module, list[int]]:
    attention = {"attn_implementation": "eager"} if o.deterministic else {}
    if o.model:
        tokenizer = AutoTokenizer.from_pretrained(o.model)
        return AutoModelForCausalLM.from_pretrained(o.model, **attention), tokenizer(text)["input_ids"]
    # No tokenizer to download: bytes are the tokens.
    config = GPT2Config(vocab_size=256, n_positions=o.block_size, n_embd=o.width, n_layer=o.layers,
                        n_head=max(1, o.width // 32), bos_token_id=10, eos_token_id=10, **attention)
    return GPT2LMHeadModel(config), list(text.encode())


def digest(model: torch.nn.Module) -> str:
    """The weights' fingerprint: every tensor's bytes, in name order."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


class Losses:
    """Each step's loss, unrounded, on stdout and in the loss log."""

    def __init__(self, path: str | None) -> None:
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.file = open(path, "a", buffering=1) if path else None  # noqa: SIM115 - open for the whole run

    def __call__(self, **record: object) -> None:
        if "loss" in record:
            print(f"step {record['step']} loss {record['loss']!r}", flush=True)
        if self.file:
            attempt = os.environ.get("RESPAWN_ATTEMPT")
            self.file.write(json.dumps({**record, "time": time.time(), "attempt": attempt}) + "\n")


class LoggedTrainer(Trainer):
    losses: Losses

    def training_step(self, model, inputs, num_items_in_batch=None):  # noqa: ANN001, ANN201
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.losses(step=self.state.global_step + 1, loss=loss.item())
        return loss


class Pause(TrainerCallback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        time.sleep(self.seconds)


def main(argv: list[str] | None = None) -> int:
    o = options(argv)
    cuda = o.device != "cpu" and torch.cuda.is_available()
    if o.device == "cuda" and not cuda:
        sys.exit("--device cuda: no CUDA device here")
    set_seed(0, deterministic=o.deterministic)
    text = open(o.data, encoding="utf-8").read() if o.data else arithmetic(20_000)
    model, ids = model_and_tokens(o, text)
    args = TrainingArguments(
        output_dir=o.output_dir, max_steps=o.steps, per_device_train_batch_size=o.batch_size, learning_rate=o.lr,
        warmup_steps=min(10, o.steps // 10), lr_scheduler_type="cosine", weight_decay=0.01, logging_steps=10,
        save_strategy="no", save_total_limit=2, report_to=[], seed=0, data_seed=0, use_cpu=not cuda,
        bf16=cuda and torch.cuda.is_bf16_supported(), full_determinism=o.deterministic,
        dataloader_num_workers=0, disable_tqdm=True)
    callback = RespawnCallback(every_steps=o.save_every)  # saves on SIGTERM, every N steps, at respawn's advice
    trainer = LoggedTrainer(model=model, args=args, train_dataset=Blocks(ids, o.block_size),
                            callbacks=[Pause(o.pause), callback])
    trainer.losses = Losses(o.loss_log)
    trainer.train(resume_from_checkpoint=resume_checkpoint(o.output_dir))
    if callback.saver.stop_requested:
        return 143  # preempted: saved (if it fitted the notice) and uploaded; respawn resumes it
    trainer.save_model(os.path.join(o.output_dir, "final"))
    weights = digest(trainer.model)
    print(f"final weights {weights}", flush=True)
    trainer.losses(final=weights, step=trainer.state.global_step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
