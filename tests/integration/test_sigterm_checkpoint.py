"""The checkpoint a trainer saves on SIGTERM is the one the next attempt resumes from.

End to end on the local cloud: functions-framework serving main.py, the watcher and the
ticker, real VM processes running deploy/vm. A preemption gives the shutdown script a
5 s notice; the marker means "this VM's work is saved or its time is up", so it lands
once the trainer has exited, or at the deadline before the hard-off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from controller.core import names
from controller.core.state import JobStatus, Phase
from localcloud.stack import LocalCloud, Options
from tests.wait import until

NOTICE = 5.0  # seconds between the soft-off and the hard-off (30 on Spot)

# Attempt 1 saves step 10, then trains on. SIGTERM asks it to save what it holds, step 20,
# which takes SAVE seconds, most of the notice; the completeness marker is written last.
# A later attempt says where it resumed from and finishes. Plain bash + curl.
TRAINER = r"""
put() { curl -sf -o /dev/null -X POST --data-binary "$2" \
  "$STORAGE_EMULATOR_HOST/upload/storage/v1/b/$RESPAWN_BUCKET/o?uploadType=media&name=ckpt%2F$RESPAWN_JOB%2F$1"; }
if [ -n "${RESUME_FROM:-}" ]; then
  echo "trainer: attempt $RESPAWN_ATTEMPT resumes from $RESUME_FROM"
  exit 0
fi
put step_000010%2Fweights w10 && put step_000010%2F_SUCCESS done
save() {
  echo "trainer: SIGTERM, saving step 20"
  sleep SAVE
  put step_000020%2Fweights w20 && put step_000020%2F_SUCCESS done
  echo "trainer: step 20 saved"
  exit 0
}
trap TRAP TERM
echo "trainer: at step 10"
while true; do sleep 0.1; done
"""


@pytest.fixture(scope="module")
def cloud() -> Iterator[LocalCloud]:
    # Spot's shutdown alone (no 120 s notice before it): what these tests time is the SIGTERM save.
    with LocalCloud(Options(tick_interval=2.0, boot_delay=0.1, shutdown_budget=NOTICE, notice_scale=0.0)) as c:
        assert c.compute is not None
        # What the local cloud tells the shutdown script: the notice it imposes.
        c.compute.vm_env["RESPAWN_NOTICE_SECONDS"] = str(NOTICE)
        yield c


def submit(cloud: LocalCloud, job: str, command: str) -> None:
    spec = {"zones": ["us-central1-a"], "machine_type": "g2-standard-8", "command": command,
            "heartbeat_interval": "1s", "checkpoint": {"uri": f"gs://{cloud.options.bucket}/ckpt/{job}"},
            "policy": {"startup_grace": "1m", "idle_timeout": "1m"}}
    cloud.storage.bucket(cloud.options.bucket).blob(names.spec_key(job)).upload_from_string(yaml.safe_dump(spec))


def status(cloud: LocalCloud, job: str) -> JobStatus | None:
    blob = cloud.storage.bucket(cloud.options.bucket).get_blob(names.status_key(job))
    return JobStatus.from_json(blob.download_as_bytes()) if blob else None


def serial(cloud: LocalCloud, name: str) -> str:
    assert cloud.compute is not None
    path = cloud.compute.workdir_of(name) / "serial-port-1.log"
    return path.read_text() if path.exists() else ""


def vm_status(cloud: LocalCloud, name: str) -> str | None:
    assert cloud.compute is not None
    return next((i["status"] for i in cloud.compute.instances() if i["name"] == name), None)


class Watch:
    """Polls, every 20 ms, for the job's marker (the controller deletes it once acted on) and
    the first VM's status: when each was first seen, and the marker's body."""

    def __init__(self, cloud: LocalCloud, job: str) -> None:
        self.cloud, self.job = cloud, job
        self.marker: dict[str, Any] | None = None
        self.marker_at: float | None = None
        self.terminated_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import json

        bucket = self.cloud.storage.bucket(self.cloud.options.bucket)
        while not self._stop.is_set():
            if self.marker is None and (blob := bucket.get_blob(names.marker_key(self.job))):
                self.marker_at = time.monotonic()
                self.marker = json.loads(blob.download_as_bytes())
            if self.terminated_at is None and vm_status(self.cloud, f"{self.job}-1") in ("TERMINATED", None):
                self.terminated_at = time.monotonic()
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def preempt_at_step_10(cloud: LocalCloud, job: str) -> tuple[Watch, float]:
    until("attempt 1 at step 10", lambda: "trainer: at step 10" in serial(cloud, f"{job}-1"), timeout=60)
    watch = Watch(cloud, job)
    assert cloud.compute is not None
    preempted = time.monotonic()
    cloud.compute.preempt(f"{job}-1")
    return watch, preempted


def test_the_checkpoint_saved_on_sigterm_is_the_one_resumed_from(cloud):
    job = "sigsave"
    submit(cloud, job, TRAINER.replace("SAVE", "3").replace("TRAP", "save"))
    watch, preempted = preempt_at_step_10(cloud, job)
    try:
        final = until("the job to finish", lambda: (s := status(cloud, job)) and s.phase.terminal and s, timeout=90)
    finally:
        watch.stop()
    assert final.phase == Phase.SUCCEEDED, final.message
    assert (final.attempt, final.preemptions, final.failures) == (2, 1, 0)
    want = f"gs://{cloud.options.bucket}/ckpt/{job}/step_000020"
    assert final.resume_from is not None and final.resume_from.uri == want, final.resume_from
    assert f"trainer: attempt 2 resumes from {want}" in serial(cloud, f"{job}-2")
    assert "trainer: step 20 saved" in serial(cloud, f"{job}-1")
    # The marker came after the save (3 s into the notice), said so, and came before the hard-off.
    assert watch.marker is not None and watch.marker_at is not None
    assert (watch.marker["reason"], watch.marker["saved"], watch.marker["attempt"]) == ("preempted", True, 1)
    assert 3.0 <= watch.marker_at - preempted < NOTICE


def test_a_trainer_that_ignores_sigterm_still_gets_its_marker_before_the_hard_off(cloud):
    job = "sigdeaf"
    submit(cloud, job, TRAINER.replace("TRAP", '""'))  # SIGTERM ignored: no save at all
    watch, preempted = preempt_at_step_10(cloud, job)
    try:
        final = until("the job to finish", lambda: (s := status(cloud, job)) and s.phase.terminal and s, timeout=90)
        until("the first VM seen down", lambda: watch.terminated_at is not None)
    finally:
        watch.stop()
    assert final.phase == Phase.SUCCEEDED, final.message
    assert (final.attempt, final.preemptions, final.failures) == (2, 1, 0)
    assert final.resume_from is not None and final.resume_from.uri.endswith("/step_000010")
    assert watch.marker is not None and watch.marker_at is not None and watch.terminated_at is not None
    assert (watch.marker["reason"], watch.marker["saved"]) == ("preempted", False)
    # At the deadline (the notice less a quarter: 3.75 s), before the hard-off at 5 s.
    assert 3.0 <= watch.marker_at - preempted < NOTICE
    assert watch.marker_at < watch.terminated_at, "the marker landed after the hard-off"
    assert any(e.event == "preempted" and "marker" in e.detail for e in final.history), \
        [f"{e.event}: {e.detail}" for e in final.history]
