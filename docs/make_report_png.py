"""docs/report.png: ``respawn report``'s timeline of a realistic day, made over the in-memory fakes.

A Spot L4 fine-tune over three zones, for about a day: preempted in us-central1-a (with the
VM's notice) and resumed there; preempted again while us-central1-a is stocked out, so it
moves to us-central1-b; taken by host maintenance there while both zones are stocked out,
so it moves to us-central1-c; preempted hard (no notice) there; then it finishes back in
us-central1-a. It saves every 40 minutes (90 s a save), its VMs take 4 minutes to boot,
and the controller ticks every minute.

    .venv/bin/python docs/make_report_png.py [OUT.png]
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controller.core import names  # noqa: E402
from controller.render import report
from tests.harness import Harness, spec_doc  # noqa: E402

JOB = "llm-finetune"
ZONES = ["us-central1-a", "us-central1-b", "us-central1-c"]
SAVE_EVERY, SAVE_S, STEPS_PER_MINUTE, BOOT_MINUTES = timedelta(minutes=40), 90, 5, 4


class Day:
    """The run: a clock, the controller ticking each minute, and a trainer saving on its own schedule."""

    def __init__(self) -> None:
        self.h = Harness()
        self.step, self.saved, self.since_save = 0, 0, timedelta()

    def minutes(self, n: int) -> None:
        """``n`` minutes of the world: the trainer trains (and saves) while its VM is RUNNING."""
        for _ in range(n):
            phase = self.h.status(JOB).phase
            if phase == "RUNNING":
                self.train()
            # A VM accepted takes BOOT_MINUTES to be RUNNING (the controller sees it at its next look).
            self.h.advance(minutes=BOOT_MINUTES if phase == "PROVISIONING" else 1)
            self.h.tick()

    def train(self) -> None:
        self.step += STEPS_PER_MINUTE
        self.h.heartbeat(JOB)
        self.since_save += timedelta(minutes=1)
        if self.since_save >= SAVE_EVERY:
            self.h.store.put("ckpts", f"run/{self.step}/state.bin", b"w" * 8)
            self.h.advance(seconds=SAVE_S)  # its writing time: the checkpoint cost C
            self.h.store.put("ckpts", f"run/{self.step}/commit_success.txt", b"")
            self.saved, self.since_save = self.step, timedelta()

    def lost(self) -> None:
        """The VM is gone: the next attempt resumes from the last save."""
        self.step, self.since_save = self.saved, timedelta()


def scenario() -> tuple[Harness, str]:
    day = Day()
    h = day.h
    h.submit(JOB, spec_doc(zones=ZONES, policy={"backoff": {"initial": "30s", "max": "5m"}, "max_restarts": 20}))
    h.tick()
    day.minutes(4 * 60 + 17)
    h.marker(JOB)  # preempted with notice, in us-central1-a
    day.lost()
    day.minutes(3 * 60 + 7)
    h.compute.stockouts.add("us-central1-a")
    h.marker(JOB)  # preempted again; us-central1-a has no L4 left
    day.lost()
    day.minutes(2 * 60 + 6)
    h.compute.stockouts.discard("us-central1-a")
    day.minutes(3 * 60 + 31)
    h.compute.stockouts.update(("us-central1-a", "us-central1-b"))
    h.compute.maintenance(names.instance_name(JOB, h.status(JOB).attempt))  # us-central1-b's host
    day.lost()
    day.minutes(8)
    h.compute.stockouts.clear()
    day.minutes(5 * 60 + 12)
    h.compute.preempt(names.instance_name(JOB, h.status(JOB).attempt))  # hard: no notice
    day.lost()
    day.minutes(8 + 4 * 60 + 40)
    h.exit(JOB, 0)
    day.minutes(1)
    return h, JOB


def main(out: Path) -> None:
    h, job = scenario()
    report.draw(job, h.status(job), h.clock.now(), out)
    print(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "report.png")
