"""``python -m bench.gpu_e2e`` runs by hand, where a GPU and the frameworks are; its arithmetic runs here:
the step time it reads from a loss log, and whether a run is long enough to be training when the
notice's soft-off comes."""

from __future__ import annotations

import math

from bench import gpu_e2e


def rows(step_s: float, steps: int, start_up: float = 10.0) -> list[dict[str, float]]:
    return [{"step": s, "loss": 1.0, "time": start_up + s * step_s} for s in range(1, steps + 1)]


def test_the_step_time_is_read_from_the_loss_log_past_its_start_up():
    timed = rows(0.25, 40, start_up=30.0)
    timed[0]["time"] = 0.0  # a slow first step (compilation, caches) is no part of it
    assert gpu_e2e.step_time(timed) == 0.25
    assert gpu_e2e.step_time(rows(0.25, 2)) == math.inf  # too few steps to tell
    assert gpu_e2e.step_time([{"final": "abc", "step": 3}]) == math.inf


def test_a_run_that_would_end_before_the_notices_soft_off_asks_for_more_steps():
    for shape in gpu_e2e.SHAPES.values():
        at = shape["save_every"] + shape["save_every"] // 2
        slow = (shape["steps"] - at) / shape["notice_s"]  # a step time that leaves exactly the notice
        need = gpu_e2e.long_enough(shape, at, 1 / slow)
        assert need is not None and need > shape["steps"]
        assert gpu_e2e.long_enough({**shape, "steps": need}, at, 1 / slow) is None


def test_the_notice_is_google_s_120_s_on_a_gpu_and_shortened_on_a_cpu():
    assert gpu_e2e.NOTICE_S == 120.0 and gpu_e2e.SHAPES["cuda"]["notice_s"] == 120.0
    assert gpu_e2e.SHAPES["cpu"]["notice_s"] < gpu_e2e.NOTICE_S
    o = gpu_e2e.options(["--device", "cpu", "--notice-s", "3"])
    assert o.notice_s == 3.0 and o.device == "cpu"
