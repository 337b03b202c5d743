"""One rank of a 2-process DDP loop (gloo, CPU) saved through respawnkit.torch.Checkpointer: each rank writes its
DCP shards into a folder of its own and uploads them, rank zero its .metadata once both ranks' shards landed.
Resumes from RESUME_FROM when set; rank zero prints ``step N loss X`` (X as repr) for each step it trains. ASYNC=0
saves with dcp.save rather than async_save; tests/frameworks/uploads.py's FAIL_ON fails one object's upload."""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from respawnkit.torch import Checkpointer
from tests.frameworks import uploads


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(16, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def main() -> int:
    uploads.install()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    hidden = [torch.nn.Linear(16, 16) for _ in range(4)]  # enough tensors that DCP gives each rank some to write
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), *hidden,
                                                        torch.nn.Linear(16, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    ckpt = Checkpointer(model, optimizer, every_s=None, every_steps=int(os.environ.get("SAVE_EVERY", "5")),
                        use_async=os.environ.get("ASYNC", "1") == "1")
    start = ckpt.resume(download_to=os.path.join(os.environ["WORK"], f"resume-{rank}"))
    for step in range(start + 1, int(os.environ["STEPS"]) + 1):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # DDP's all-reduce: the loop's own collectives on the default group
        optimizer.step()
        if rank == 0:
            print(f"step {step} loss {loss.item()!r}", flush=True)
        ckpt.step_end(step)
    done = ckpt.finish()
    print(f"rank {rank} finished {done}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
