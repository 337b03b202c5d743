"""A respawnkit trainer on the local cloud (issue 27, part 2): the real VM agent hands it
RESPAWN_PROGRESS_FILE and the notice, passes its step and save times on in its records, and
``respawn report`` shows the steps each loss cost and the save cost the trainer measured.

Preempted once with notice (its SIGTERM save is the step it reached: 0 steps lost) and once
hard (no shutdown script: it resumes from its last periodic save, and the steps past it that
its last heartbeat reported are lost)."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from controller.core import names
from controller.core.state import JobStatus, Phase
from controller.render import report
from localcloud.stack import LocalCloud, Options
from tests.wait import until

NOTICE = 5.0  # seconds between the soft-off and the hard-off (30 on Spot)
TRAINER = Path(__file__).with_name("kit_trainer.py")
# A save every 6 s of training; the hard loss comes 1 to 2.5 s past one, by the heartbeat (which
# trails the trainer by up to 2 s: the progress file's step is written once a second, read at
# each beat), so the step it reports is past that save and short of the next.
SAVE_EVERY, STEPS = 60, 160


@pytest.fixture(scope="module")
def cloud() -> Iterator[LocalCloud]:
    # Spot's shutdown alone (no 120 s notice before it): what these tests time is the SIGTERM save.
    with LocalCloud(Options(tick_interval=2.0, boot_delay=0.1, shutdown_budget=NOTICE, notice_scale=0.0)) as c:
        assert c.compute is not None
        c.compute.vm_env["RESPAWN_NOTICE_SECONDS"] = str(NOTICE)  # what the local cloud tells the shutdown script
        yield c


def submit(cloud: LocalCloud, job: str) -> None:
    spec = {"zones": ["us-central1-a"], "machine_type": "g2-standard-8",
            "command": f"{Path(sys.executable).name} {TRAINER}", "heartbeat_interval": "1s",
            "env": {"STEPS": str(STEPS), "STEP_S": "0.1", "SAVE_EVERY": str(SAVE_EVERY), "WRITE_S": "0.3"},
            "checkpoint": {"uri": f"gs://{cloud.options.bucket}/ckpt/{job}"},
            "policy": {"startup_grace": "1m", "idle_timeout": "1m"}}
    cloud.storage.bucket(cloud.options.bucket).blob(names.spec_key(job)).upload_from_string(yaml.safe_dump(spec))


def status(cloud: LocalCloud, job: str) -> JobStatus | None:
    blob = cloud.storage.bucket(cloud.options.bucket).get_blob(names.status_key(job))
    return JobStatus.from_json(blob.download_as_bytes()) if blob else None


def heartbeat(cloud: LocalCloud, job: str) -> dict[str, Any] | None:
    blob = cloud.storage.bucket(cloud.options.bucket).get_blob(f"jobs/{job}/heartbeat")
    return json.loads(blob.download_as_bytes()) if blob else None


def step_of(cloud: LocalCloud, job: str, attempt: int) -> int | None:
    beat = heartbeat(cloud, job)
    return beat.get("step") if beat and beat.get("attempt") == attempt else None


def serial(cloud: LocalCloud, name: str) -> str:
    assert cloud.compute is not None
    path = cloud.compute.workdir_of(name) / "serial-port-1.log"
    return path.read_text() if path.exists() else ""


def test_a_kit_trainers_report_shows_the_steps_each_loss_cost_and_its_measured_save(cloud):
    job = "kit"
    assert cloud.compute is not None
    submit(cloud, job)
    # With notice: once its heartbeat says it trains past its first save.
    until("attempt 1 past step 25", lambda: (s := step_of(cloud, job, 1)) is not None and s >= 25, timeout=40)
    cloud.compute.preempt(f"{job}-1")
    # Hard: while attempt 2 is well past a save and short of the next one, by its heartbeat.
    until("attempt 2 between two saves", lambda: (s := step_of(cloud, job, 2)) is not None
          and s > 50 and 10 <= s % SAVE_EVERY <= 25, timeout=40)
    cloud.compute.preempt(f"{job}-2", graceful=False)
    final = until("success", lambda: (s := status(cloud, job)) and s.phase.terminal and s, timeout=60)
    assert final.phase == Phase.SUCCEEDED, final.message
    assert f"done at step {STEPS}" in serial(cloud, f"{job}-3")

    first, second = final.ledger.losses
    # The SIGTERM save was the step reached; the replacement resumed there.
    assert first.step is not None and first.step == first.resumed_step and first.steps_lost == 0, first
    assert f"resumed at step {first.resumed_step}" in serial(cloud, f"{job}-2")
    # The hard loss resumed from the last periodic save, short of the step the heartbeat said.
    assert second.resumed_step is not None and second.resumed_step % SAVE_EVERY == 0, second
    assert second.steps_lost is not None and second.steps_lost >= 10, second
    assert second.steps_lost == second.step - second.resumed_step
    assert final.ledger.totals.steps_lost == second.steps_lost
    save_s = final.ledger.save_s
    assert save_s is not None and 0.3 <= save_s < 3, save_s  # the write's 0.3 s, as the trainer measured it

    out = Console(width=80, file=io.StringIO(), record=True)
    out.print(report.render_text(job, final, datetime.now(UTC)))
    text = out.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert f"{final.ledger.totals.steps_lost} lost (per loss: 0, {second.steps_lost})" in text
    losses = text.split("\nlosses\n")[1].splitlines()
    assert losses[1].split() == ["1", "preempted", str(first.step), "step", str(first.resumed_step), "0",
                                 *losses[1].split()[6:]]
    assert losses[2].split()[:6] == ["2", "preempted", str(second.step), "step", str(second.resumed_step),
                                     str(second.steps_lost)]
    assert f"a save takes {report.seconds(save_s)}" in " ".join(text.split())
    assert "reported by the trainer" in text
