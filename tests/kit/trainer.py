"""A stdlib-only trainer for the kit's tests: its state after step N is a number that depends on every step
(so a lost or repeated step shows), saved as ``state.json`` through respawnkit.CheckpointSaver.

Environment: STEPS (total), STEP_S (seconds a step takes), SAVE_EVERY (steps, 0: none), SLOW_UPLOAD_S
(seconds each uploaded file takes), HANG_ON (an object whose upload never ends), plus respawn's own (RESPAWN_CHECKPOINT_URI, RESUME_FROM...).
Prints ``step N`` after each step and ``stopped at step N`` / ``done at step N state X``.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import respawnkit  # noqa: E402
from respawnkit.stores import LocalStore  # noqa: E402


class SlowStore(LocalStore):
    def put(self, local: str, name: str) -> None:
        print(f"uploading {name}", flush=True)
        time.sleep(float(os.environ.get("SLOW_UPLOAD_S", "0")))
        if name == os.environ.get("HANG_ON"):  # an upload that never ends: the test kills the process here
            time.sleep(3600)
        super().put(local, name)


def advance(state: int, step: int) -> int:
    return (state * 31 + step * step + 7) % 1_000_000_007


def main() -> int:
    steps, pause = int(os.environ["STEPS"]), float(os.environ.get("STEP_S", "0"))
    files = int(os.environ.get("FILES", "1"))
    store = SlowStore(os.environ["RESPAWN_CHECKPOINT_URI"])
    saver = respawnkit.CheckpointSaver(store=store, every_steps=int(os.environ.get("SAVE_EVERY", "0")) or None)
    start, state = 0, 0
    if (resume := respawnkit.resume_from()) is not None:
        with open(os.path.join(resume.path, "state.json")) as f:
            saved = json.load(f)
        start, state = saved["step"], saved["state"]
        assert resume.step == start, (resume.step, start)
        print(f"resumed at step {start}", flush=True)
    for step in range(start + 1, steps + 1):
        time.sleep(pause)
        state = advance(state, step)
        print(f"step {step}", flush=True)

        def write(folder: str, step: int = step, state: int = state) -> None:
            for i in range(1, files):
                with open(os.path.join(folder, f"shard-{i}.bin"), "wb") as f:
                    f.write(os.urandom(1024))
            with open(os.path.join(folder, "state.json"), "w") as f:
                json.dump({"step": step, "state": state}, f)

        if saver.on_step_end(step, write):
            print(f"stopped at step {step}", flush=True)
            return 143
    saver.flush()
    print(f"done at step {steps} state {state}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
