"""docs/report.png: ``respawn report``'s timeline of a realistic hour, made over the in-memory fakes.

A Spot L4 fine-tune over three zones, for a little over an hour. Twice a preemption
comes with Spot's 120 s notice, and the next VM boots beside the old one at once (zero-gap
recovery): the first time in us-central1-b, the second time, with the other two zones stocked out,
in the preempting zone itself, where it takes the lower half of the lane while both are there.
Each old VM saves at the notice and again at the soft-off; the new one, booted meanwhile, waits at
its starting line until that save is in, then starts from it. Then a notice comes to nothing (no
preemption follows): its standby is withdrawn, paid for and all boot. Then a hard preemption (no
notice): the next VM is created only once the old one is gone, and boots on the clock. It saves
every 10 minutes (25 s a save), its VMs take 100 s to boot, and the controller ticks every minute
(and acts at once on a VM's records: its notice, its marker, its standby's ready record).

    .venv/bin/python docs/make_report_png.py [OUT.png]
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controller.core.ports import InstanceStatus  # noqa: E402
from controller.render import report  # noqa: E402
from tests.harness import Harness, spec_doc  # noqa: E402

JOB = "llm-finetune"
ZONES = ["us-central1-a", "us-central1-b", "us-central1-c"]
SAVE_EVERY, SAVE_S, STEPS_PER_MINUTE = timedelta(minutes=10), 25, 10
BOOT, NOTICE = timedelta(seconds=100), timedelta(seconds=120)


class Hour:
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
            if phase == "PROVISIONING":  # a VM created after a loss: its boot, then its trainer starts
                self.h.advance(seconds=BOOT.total_seconds())
                self.h.heartbeat(JOB, trainer_started=self.h.clock.now())
            else:
                self.h.advance(minutes=1)
            self.h.tick()

    def train(self) -> None:
        self.step += STEPS_PER_MINUTE
        self.h.heartbeat(JOB)
        self.since_save += timedelta(minutes=1)
        if self.since_save >= SAVE_EVERY:
            self.save()

    def save(self) -> None:
        self.h.store.put("ckpts", f"run/{self.step}/state.bin", b"w" * 8)
        self.h.advance(seconds=SAVE_S)  # its writing time: the checkpoint cost C
        self.h.store.put("ckpts", f"run/{self.step}/commit_success.txt", b"")
        self.saved, self.since_save = self.step, timedelta()

    def notice(self, preempted: bool = True) -> None:
        """Spot's 120 s notice: the agent's notice record boots the standby at once; the trainer saves
        and trains on; the standby reaches its line after its boot. At the soft-off (``preempted``)
        the trainer saves once more, the shutdown script writes the marker, and the standby gets the
        go and starts from that save. Otherwise the notice comes to nothing, and the standby is
        withdrawn once the line's bound has passed."""
        h = self.h
        h.notice(JOB)
        h.tick(JOB)
        old = h.status(JOB).instances[0]
        self.save()  # at the notice (respawnkit's), 25 s
        h.advance(seconds=(BOOT.total_seconds() - SAVE_S))
        h.ready(JOB, waiting_since=h.clock.now())
        h.tick(JOB)
        h.advance(seconds=(NOTICE - BOOT).total_seconds())
        self.step += STEPS_PER_MINUTE * 2
        if not preempted:
            h.heartbeat(JOB)
            h.advance(seconds=40)  # past the bound: notice, Spot's 30 s shutdown, 5 s of slack
            h.tick(JOB)
            return
        h.compute.set_status(old, InstanceStatus.STOPPING)  # the soft-off: SIGTERM, the last save, the marker
        h.tick(JOB)
        self.save()
        h.marker(JOB)
        h.tick(JOB)  # the go, from that save
        h.advance(seconds=1)
        h.heartbeat(JOB, trainer_started=h.clock.now())
        h.tick(JOB)

    def lost(self) -> None:
        """The VM is gone without a save: the next attempt resumes from the last one."""
        self.step, self.since_save = self.saved, timedelta()


def scenario() -> tuple[Harness, str]:
    day = Hour()
    h = day.h
    h.submit(JOB, spec_doc(zones=ZONES, policy={"backoff": {"initial": "30s", "max": "5m"}, "max_restarts": 20}))
    h.tick()
    day.minutes(16)
    day.notice()  # us-central1-a's VM warned: the next boots in us-central1-b beside it
    day.minutes(13)
    h.compute.stockouts.update(("us-central1-a", "us-central1-c"))
    day.notice()  # us-central1-b's VM warned, the other zones stocked out: the next boots beside it there
    h.compute.stockouts.clear()
    day.minutes(9)
    day.notice(preempted=False)  # a notice that comes to nothing: its standby withdrawn
    day.minutes(11)
    h.compute.preempt(h.status(JOB).instances[0])  # hard: no notice, no marker
    day.lost()
    day.minutes(14)
    h.exit(JOB, 0)
    day.minutes(1)
    return h, JOB


def main(out: Path) -> None:
    h, job = scenario()
    report.draw(job, h.status(job), h.clock.now(), out)
    print(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "report.png")
