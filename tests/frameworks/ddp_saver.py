"""One rank of a 2-process torch.distributed (gloo, CPU) loop around a CheckpointSaver that agrees with the
other rank (respawnkit.dist.torch_broadcast). Each save is a barrier, as a framework's collective save is; the
ranks' steps take different times, so their own every_s clocks would disagree. Rank R gets its notice after
step NOTICE_AT_<R>. Prints one JSON line: the steps it saved at and the step it stopped at."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

import torch.distributed as dist

from respawnkit import CheckpointSaver
from respawnkit.dist import global_rank, torch_broadcast
from respawnkit.notice import Notice
from respawnkit.progress import Progress
from respawnkit.stores import LocalStore


def main() -> int:
    dist.init_process_group("gloo", timeout=timedelta(seconds=20))
    rank = global_rank()
    notice = Notice()
    saver = CheckpointSaver(store=LocalStore(os.path.join(os.environ["WORK"], "bucket")), sigterm=notice,
                            every_s=0.15, progress=Progress(""), agree=torch_broadcast)
    saved, stopped = [], None
    for step in range(1, 41):
        time.sleep(0.03 * (rank + 1))
        if step == int(os.environ.get(f"NOTICE_AT_{rank}", "0")):
            notice.trigger()
        if saver.should_save(step):
            saved.append(step)
            if rank == 0:
                saver.save(step, lambda folder: open(os.path.join(folder, "w.bin"), "wb").close())
            dist.barrier()  # a collective save
        if saver.stop_requested:
            stopped = step
            break
    saver.flush(10)
    print(json.dumps({"rank": rank, "saved": saved, "stopped": stopped}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
