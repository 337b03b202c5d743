"""Checkpoint trees as the libraries LLM training runs on write them, each with a partial newest save.

Every tree follows its library's own save order (controller/core/checkpoints.py cites it) and
is cut off mid-save, and its numbers are chosen so that text order and number order
disagree (``checkpoint_9`` vs ``checkpoint_10``, ``ckpt_900`` vs ``ckpt_1000``): a
discovery that takes the newest numbered save, or compares numbers as text, picks wrong.
Used by the unit tests (discovery alone) and the integration test (one job each on the
local cloud, whose first VM must get the newest complete save).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Tree:
    name: str  # also the job's name in the integration test
    objects: tuple[tuple[str, bytes], ...]  # in write order: generations grow along it
    expected: str | None  # the chosen save, relative to the prefix; None: nothing is complete
    step: int | None = None
    tag: str | None = None
    label: str | None = None
    checkpoint: dict[str, Any] = field(default_factory=dict)  # spec fields besides uri (format, pattern...)


def _files(directory: str, *names: str) -> list[tuple[str, bytes]]:
    return [(f"{directory}/{n}", f"{directory}/{n}".encode()) for n in names]


def _trainer_state(step: int) -> bytes:
    # As transformers writes it: sort_keys, so global_step comes before the long log_history.
    state = {"best_metric": None, "epoch": step / 100, "global_step": step,
             "log_history": [{"loss": 1.0 / (s + 1), "step": s} for s in range(0, step, 5)], "max_steps": 10_000}
    return json.dumps(state, indent=2, sort_keys=True).encode()


def deepspeed() -> Tree:
    def save(step: int, ranks: int) -> list[tuple[str, bytes]]:
        d = f"global_step{step}"
        return _files(d, "mp_rank_00_model_states.pt",
                      *(f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(ranks)))

    objects = [*save(5, 2), ("latest", b"global_step5"), ("zero_to_fp32.py", b"# copied by DeepSpeed"),
               *save(15, 2), ("latest", b"global_step15"),  # rewritten: no newline, as DeepSpeed writes it
               *save(20, 1)]  # partial: rank 1's optimizer states and the tracker never came
    return Tree("ds", tuple(objects), "global_step15", step=15, tag="global_step15", label="step 15")


def megatron_legacy() -> Tree:
    def save(iteration: int, ranks: int) -> list[tuple[str, bytes]]:
        return [pair for r in range(ranks)
                for pair in _files(f"iter_{iteration:07d}/mp_rank_{r:02d}", "model_optim_rng.pt")]

    objects = [*save(900, 2), ("latest_checkpointed_iteration.txt", b"900"),
               *save(1000, 2), ("latest_checkpointed_iteration.txt", b"1000"),
               *save(1100, 1)]  # partial: tensor-parallel rank 1 and the tracker never came
    return Tree("megatron", tuple(objects), "iter_0001000", step=1000, tag="1000", label="step 1000")


def megatron_torch_dist() -> Tree:
    def save(iteration: int) -> list[tuple[str, bytes]]:
        return _files(f"iter_{iteration:07d}", "metadata.json", "common.pt", "__0_0.distcp", "__1_0.distcp",
                      ".metadata")

    # The newest one even holds torch DCP's .metadata: complete as a DCP save, but Megatron
    # writes its tracker after a barrier across every rank, and the tracker never moved.
    objects = [*save(900), ("latest_checkpointed_iteration.txt", b"900\n"),
               *save(1000), ("latest_checkpointed_iteration.txt", b"1000\n"), *save(1100)]
    return Tree("megatron-dist", tuple(objects), "iter_0001000", step=1000, tag="1000", label="step 1000")


def accelerate() -> Tree:
    def save(i: int, ranks: int, *, model: bool = True) -> list[tuple[str, bytes]]:
        main = ["model.safetensors", "optimizer.bin", "scheduler.bin"] if model else []
        return _files(f"checkpoints/checkpoint_{i}", *main, *(f"random_states_{r}.pkl" for r in range(ranks)))

    objects = [*save(9, 2), *save(10, 2),
               *save(11, 1)]  # partial: rank 1's random states never came
    return Tree("accelerate", tuple(objects), "checkpoints/checkpoint_10", step=None, label="save 10")


def huggingface() -> Tree:
    def save(step: int, *, done: bool = True) -> list[tuple[str, bytes]]:
        d = f"checkpoint-{step}"
        weights = _files(d, "config.json", "model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth")
        return weights + ([(f"{d}/trainer_state.json", _trainer_state(step))] if done else [])

    # checkpoint-1500 is partial (no trainer_state.json): transformers' own get_last_checkpoint
    # would pick it, by its number, and fail to resume from it.
    objects = [*save(500), *save(1000), *save(1500, done=False)]
    return Tree("hf", tuple(objects), "checkpoint-1000", step=1000, label="step 1000")


def torch_files() -> Tree:
    objects = [("ckpt_900.pt", b"900"), ("ckpt_1000.pt", b"1000"),
               ("ckpt_1100.pt.tmp", b"a torch.save killed before its rename; gcsfuse uploaded it on close"),
               ("ckpt_1200.pt.partial", b"partial"), ("tmpk3j2x9.pt", b"tempfile"), (".ckpt_1300.pt", b"hidden")]
    return Tree("plain", tuple(objects), "ckpt_1000.pt", step=1000, label="step 1000")


def custom_marker() -> Tree:
    objects = [*_files("run/step-900", "weights.bin", "opt.bin", "COMMITTED"),
               *_files("run/step-1000", "weights.bin", "opt.bin", "COMMITTED"),
               *_files("run/step-1100", "weights.bin", "opt.bin")]  # no marker yet
    return Tree("custom-marker", tuple(objects), "run/step-1000", step=1000, label="step 1000",
                checkpoint={"format": "custom", "pattern": "run/step-{step}/", "marker": "COMMITTED"})


def custom_same_files() -> Tree:
    objects = [*_files("run/step-900", "weights.bin", "opt.bin"),
               *_files("run/step-1000", "weights.bin", "opt.bin", "extra.json"),  # more files is fine
               *_files("run/step-1100", "weights.bin", "extra.json")]  # opt.bin missing: partial
    return Tree("custom-same", tuple(objects), "run/step-1000", step=1000, label="step 1000",
                checkpoint={"format": "custom", "pattern": "run/step-{step}/", "same_files": True})


ALL = [deepspeed, megatron_legacy, megatron_torch_dist, accelerate, huggingface, torch_files, custom_marker,
       custom_same_files]
