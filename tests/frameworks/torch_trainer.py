"""A plain PyTorch loop saved through respawnkit.torch (DCP, async_save): see harness.py for the protocol."""

from __future__ import annotations

import os
import sys
import time

import torch

from respawnkit.torch import Checkpointer
from tests.frameworks import uploads


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(16, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def main() -> int:
    uploads.install()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    ckpt = Checkpointer(model, optimizer, every_s=None, every_steps=int(os.environ.get("SAVE_EVERY", "5")))
    start = ckpt.resume(download_to=os.path.join(os.environ["WORK"], "resume"))
    for step in range(start + 1, int(os.environ["STEPS"]) + 1):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item()!r}", flush=True)
        time.sleep(float(os.environ.get("STEP_S", "0")))
        if ckpt.step_end(step):
            return 143
    ckpt.saver.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
