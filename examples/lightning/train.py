"""Train a small character-level transformer with Lightning, on Spot VMs that respawn recreates.

respawnkit's Lightning callback (``respawnkit.lightning``) does respawn's side: ``fit`` resumes from the
checkpoint respawn chose (``RESUME_FROM``, downloaded), each save is Lightning's own
``trainer.save_checkpoint``, uploaded in the background to ``RESPAWN_CHECKPOINT_URI`` as
``step-<n>.ckpt``, and a preemption's SIGTERM becomes one last save at the next step boundary, then a stop
(exit 143)::

    python train.py                          # a tiny model: runs on a CPU in seconds
    python train.py --layers 8 --width 512 --steps 20000 --batch-size 64    # on the GPU when there is one
    python train.py --data corpus.txt        # your text instead of the built-in arithmetic sentences

The accelerator is Lightning's ``auto`` (``--device cpu`` forces the CPU), in ``bf16-mixed`` precision where
the GPU supports it. Step ``s`` trains on the batch drawn from a generator seeded with ``s`` (the
DataLoader only counts steps), so a resumed run sees exactly the batches an uninterrupted one would have;
``--deterministic`` adds Lightning's ``deterministic=True`` for GPU kernels. Each step prints
``step N loss X`` (``--loss-log FILE`` also appends it, as JSON lines), and a finished run prints
``final weights <digest>``. As respawn's job: ``spec.yaml`` beside this file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time

import lightning as L
import torch

from respawnkit.lightning import RespawnCallback, resume_checkpoint


def options(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--data", help="a text file to train on; default: generated arithmetic sentences")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--block-size", type=int, default=64, help="characters per training sequence")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--save-every", type=int, default=50, help="steps between saves (respawn's advised interval, "
                   "RESPAWN_CHECKPOINT_EVERY_S, is followed too when set)")
    p.add_argument("--resume-dir", default="resume", help="where the checkpoint to resume from is downloaded")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--loss-log", help="append each step's loss here (JSON lines)")
    p.add_argument("--pause", type=float, default=0.0, help="seconds to sleep after each step (demos, tests)")
    return p.parse_args(argv)


def arithmetic(n: int, seed: int = 0) -> str:
    """Sentences a small model can learn: ``17 plus 25 is 42.``"""
    rng = random.Random(seed)
    return "\n".join(f"{a} plus {b} is {a + b}." for a, b in ((rng.randrange(100), rng.randrange(100))
                                                                for _ in range(n)))


class CharModel(L.LightningModule):
    """Bytes in, the next byte out: embedding, a causal transformer encoder, a linear head."""

    def __init__(self, text: bytes, layers: int, width: int, block: int, batch: int, lr: float,
                 log: object) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=("text", "log"))
        self.data = torch.tensor(list(text), dtype=torch.long)
        self.embed = torch.nn.Embedding(256, width)
        self.position = torch.nn.Parameter(torch.zeros(block, width))
        layer = torch.nn.TransformerEncoderLayer(width, max(1, width // 32), 4 * width, dropout=0.0,
                                                 batch_first=True, norm_first=True)
        self.body = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, 256)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(block), persistent=False)
        self.log_loss = log

    def batch_of(self, step: int) -> torch.Tensor:
        """Step ``step``'s sequences (block + 1 bytes each): a function of the step alone."""
        g = torch.Generator().manual_seed(1_000_003 + step)
        block = self.hparams.block
        starts = torch.randint(0, len(self.data) - block - 1, (self.hparams.batch,), generator=g)
        return torch.stack([self.data[s: s + block + 1] for s in starts.tolist()]).to(self.device)

    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        seq = self.batch_of(self.global_step)
        x, y = seq[:, :-1], seq[:, 1:]
        h = self.body(self.embed(x) + self.position, mask=self.mask, is_causal=True)
        loss = torch.nn.functional.cross_entropy(self.head(h).reshape(-1, 256).float(), y.reshape(-1))
        self.log_loss(step=self.global_step + 1, loss=loss.item())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)


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


class Pause(L.Callback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # noqa: ANN001, ANN201
        time.sleep(self.seconds)


def main(argv: list[str] | None = None) -> int:
    o = options(argv)
    cuda = o.device != "cpu" and torch.cuda.is_available()
    if o.device == "cuda" and not cuda:
        sys.exit("--device cuda: no CUDA device here")
    L.seed_everything(0, verbose=False)
    text = open(o.data, "rb").read() if o.data else arithmetic(20_000).encode()
    losses = Losses(o.loss_log)
    model = CharModel(text, o.layers, o.width, o.block_size, o.batch_size, o.lr, losses)
    callback = RespawnCallback(every_steps=o.save_every)  # saves on SIGTERM, every N steps, at respawn's advice
    trainer = L.Trainer(max_steps=o.steps, accelerator="gpu" if cuda else "cpu", devices=1,
                        precision="bf16-mixed" if cuda and torch.cuda.is_bf16_supported() else "32-true",
                        deterministic=o.deterministic, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[Pause(o.pause), callback])
    steps = torch.utils.data.DataLoader(range(o.steps), batch_size=1)  # only counts: the batch comes from the step
    try:
        trainer.fit(model, steps, ckpt_path=resume_checkpoint(o.resume_dir))
    except SystemExit:  # Lightning ends a SIGTERMed fit with its SIGTERMException, after the callback's save
        if not callback.saver.stop_requested:
            raise
    if callback.saver.stop_requested:
        return 143  # preempted: saved (if it fitted the notice) and uploaded; respawn resumes it
    weights = digest(model)
    print(f"final weights {weights}", flush=True)
    losses(final=weights, step=trainer.global_step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
