"""A stdlib-only trainer using respawnkit, for the local cloud: run by the real VM agent, it
saves through respawnkit.CheckpointSaver to $RESPAWN_CHECKPOINT_URI (gs://, the local GCS)
and reports its progress in $RESPAWN_PROGRESS_FILE, which the agent folds into its records.

Its state after step N depends on every step (a lost or repeated step shows). Environment:
STEPS (total), STEP_S (seconds a step takes), SAVE_EVERY (steps), WRITE_S (seconds a save's
local write takes: the save cost respawn is told). Prints ``resumed at step N`` and
``done at step N state X``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import respawnkit  # noqa: E402


def advance(state: int, step: int) -> int:
    return (state * 31 + step * step + 7) % 1_000_000_007


def main() -> int:
    steps, pause = int(os.environ["STEPS"]), float(os.environ["STEP_S"])
    write_s = float(os.environ.get("WRITE_S", "0"))
    saver = respawnkit.CheckpointSaver(every_steps=int(os.environ["SAVE_EVERY"]), every_s=None)
    start, state = 0, 0
    if (resume := respawnkit.resume_from(download_to=tempfile.mkdtemp(prefix="resume-"))) is not None:
        with open(os.path.join(resume.path, "state.json")) as f:
            saved = json.load(f)
        start, state = saved["step"], saved["state"]
        print(f"resumed at step {start}", flush=True)
    for step in range(start + 1, steps + 1):
        time.sleep(pause)
        state = advance(state, step)

        def write(folder: str, step: int = step, state: int = state) -> None:
            time.sleep(write_s)
            with open(os.path.join(folder, "state.json"), "w") as f:
                json.dump({"step": step, "state": state}, f)

        if saver.on_step_end(step, write):  # SIGTERM: this step saved, and its upload done
            saver.finish()
            print(f"stopped at step {step}", flush=True)
            return 143
    saver.finish()
    print(f"done at step {steps} state {state}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
