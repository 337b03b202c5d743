"""A small deterministic trainer that survives preemption.

Linear regression by SGD with numpy. Batch ``k`` is drawn from a generator seeded with
``k``, so the weights after step N depend only on the weights at any earlier step and
the steps since: a run resumed from an exact checkpoint ends bit-for-bit where an
uninterrupted run ends, and the final hash proves it.

No step goes through BLAS (``@``). numpy hands a matrix product to OpenBLAS, which picks
a kernel for the CPU it finds (or the one ``OPENBLAS_CORETYPE`` names), and with it the
summation order and FMA use: the same steps then give other weights on another CPU or
under another environment, and an attempt resumed elsewhere would not end where an
uninterrupted run does. Products here are elementwise and sums are numpy's own
fixed-order pairwise sum along a contiguous axis: the same bits whatever the CPU, BLAS
kernel or thread count.

Checkpoints go to ``$RESPAWN_CHECKPOINT_URI/step_<N>/weights.npy``, then ``_SUCCESS`` is
written last: respawn only resumes from a step directory that has it. It saves every
``CHECKPOINT_EVERY`` steps, and also once ``RESPAWN_CHECKPOINT_EVERY_S`` seconds have passed
since its last save (respawn's advice: Young/Daly's interval from the measured save time and
the job's time between losses; unset until respawn has measured both). At a preemption notice
(the agent writes ``RESPAWN_NOTICE_FILE``, up to 120 s before the soft-off) it checkpoints at the
next step boundary and trains on, as respawnkit does: the next attempt is booting meanwhile and
starts from the newest complete save. On SIGTERM (the soft-off) it checkpoints at the next step
boundary and exits.

On a multi-host slice (a Cloud TPU node: the VM agent runs the command on every worker,
with ``NODE_RANK`` and ``NODES``) rank 0 saves, as multi-host trainers do, rather than
every rank writing the same objects. The others compute the same steps (data-parallel
replicas hold the same weights), save nothing, and exit like rank 0: 0 at the end,
143 on SIGTERM. ``NODE_RANK`` unset is rank 0, so a single VM saves as before.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import sys
import time

import numpy as np

DIM, BATCH = 32, 64
LR = float(os.environ.get("LR") or "0.05")  # a sweep's parameter (examples/sweep.yaml), 0.05 unless given


def matvec(a: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``a @ v`` without BLAS: elementwise products, then a fixed-order sum along each row."""
    return np.add.reduce(np.ascontiguousarray(a) * v, axis=1)


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    truth = np.random.default_rng(0).normal(size=DIM)
    rng = np.random.default_rng(1_000_003 + step)
    x = rng.normal(size=(BATCH, DIM))
    return x, matvec(x, truth) + 0.1 * rng.normal(size=BATCH)


def sgd_step(w: np.ndarray, step: int) -> tuple[np.ndarray, float]:
    x, y = batch(step)
    err = matvec(x, w) - y
    return w - LR * matvec(x.T, err) / BATCH, float(np.mean(err**2))


def train(steps: int, w: np.ndarray | None = None, start: int = 0) -> np.ndarray:
    """The whole computation, no I/O: what an uninterrupted run ends with."""
    w = np.zeros(DIM) if w is None else w
    for step in range(start, steps):
        w, _ = sgd_step(w, step)
    return w


def digest(w: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(w, dtype=np.float64).tobytes()).hexdigest()[:16]


class Checkpoints:
    """``step_<N>/weights.npy`` then ``step_<N>/_SUCCESS`` under a gs:// prefix."""

    def __init__(self, uri: str) -> None:
        from google.cloud import storage  # honours STORAGE_EMULATOR_HOST under the local cloud

        bucket, _, prefix = uri.removeprefix("gs://").partition("/")
        self.bucket = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT")).bucket(bucket)
        self.prefix = prefix.strip("/")

    def save(self, step: int, w: np.ndarray) -> None:
        buffer = io.BytesIO()
        np.save(buffer, w)
        folder = f"{self.prefix}/step_{step:06d}"
        self.bucket.blob(f"{folder}/weights.npy").upload_from_string(buffer.getvalue())
        self.bucket.blob(f"{folder}/_SUCCESS").upload_from_string(b"")  # last: the save is complete

    def load(self, uri: str) -> tuple[int, np.ndarray]:
        folder = uri.removeprefix(f"gs://{self.bucket.name}/").strip("/")
        data = self.bucket.blob(f"{folder}/weights.npy").download_as_bytes()
        return int(folder.rsplit("_", 1)[-1]), np.load(io.BytesIO(data))


def main() -> int:
    steps = int(os.environ.get("TRAIN_STEPS", "400"))
    every = int(os.environ.get("CHECKPOINT_EVERY", "40"))
    pause = float(os.environ.get("STEP_SECONDS", "0.05"))
    advised = float(os.environ.get("RESPAWN_CHECKPOINT_EVERY_S") or "inf")  # seconds between saves
    rank, ranks = int(os.environ.get("NODE_RANK") or 0), int(os.environ.get("NODES") or 1)
    # Every rank runs the same deterministic steps (no collective here: replicas of the same
    # weights), so a rank > 0 needs nothing from rank 0; only rank 0 writes checkpoints.
    saves = rank == 0
    store = Checkpoints(os.environ["RESPAWN_CHECKPOINT_URI"])
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))

    resume = os.environ.get("RESUME_FROM", "")
    start, w = store.load(resume) if resume else (0, np.zeros(DIM))
    print(f"trainer: attempt {os.environ.get('RESPAWN_ATTEMPT', '?')} starting at step {start}"
          f" (rank {rank} of {ranks})", flush=True)
    step, loss = start, float("nan")
    last_save = time.monotonic()
    notice = os.environ.get("RESPAWN_NOTICE_FILE") or ""
    noticed = False
    if advised != float("inf"):
        print(f"trainer: respawn advises a checkpoint every {advised:.0f} s", flush=True)
    while step < steps:
        w, loss = sgd_step(w, step)
        step += 1
        time.sleep(pause)
        print(f"trainer: step {step} loss {loss:.5f}", flush=True)
        due = step % every == 0 or time.monotonic() - last_save >= advised
        # A notice is not a stop: one save at once (a stat per step finds the file), then train on.
        warned = not noticed and bool(notice) and os.path.exists(notice)
        noticed = noticed or warned
        if saves and (due or stop["now"] or warned):
            store.save(step, w)
            last_save = time.monotonic()
            print(f"trainer: {'preemption notice: ' if warned else ''}checkpoint at step {step}", flush=True)
        if stop["now"]:
            done = "checkpointed at step" if saves else "rank 0 saves; stopped at step"
            print(f"trainer: SIGTERM, {done} {step}, exiting", flush=True)
            return 143
    print(f"trainer: final step {step} loss {loss:.6f} weights {digest(w)}", flush=True)
    if result := os.environ.get("RESPAWN_RESULT_FILE"):  # what a sweep orders its trials by
        with open(result, "w") as f:
            json.dump({"loss": loss, "step": step, "lr": LR, "weights": digest(w)}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
