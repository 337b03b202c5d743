"""The deployed shape, locally: functions-framework serving main.py, GCS, Compute with
real VM processes running deploy/vm scripts, the Scheduler and Eventarc stand-ins."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.core import ledger, names, notify
from controller.core.state import JobStatus, Phase
from localcloud.stack import LocalCloud, Options
from tests.wait import stop_gently, until

# A tiny trainer: one step every 0.4 s, a numbered checkpoint object per step, resumes
# from RESUME_FROM, and prints where it started. Plain bash + curl, like the VM agent.
TRAINER = r"""
step=0
if [ -n "${RESUME_FROM:-}" ]; then s="${RESUME_FROM##*ckpt-}"; step=$((10#${s%.pt})); fi
echo "trainer: attempt $RESPAWN_ATTEMPT starts at step $step"
while [ "$step" -lt 8 ]; do
  sleep 0.4
  step=$((step + 1))
  echo "$step" | curl -sf -o /dev/null -X POST --data-binary @- \
    "$STORAGE_EMULATOR_HOST/upload/storage/v1/b/$RESPAWN_BUCKET/o?uploadType=media&name=ckpt%2F$RESPAWN_JOB%2Fckpt-$(printf %06d "$step").pt"
done
echo "trainer: done at step $step"
"""


@pytest.fixture(scope="module")
def cloud() -> Iterator[LocalCloud]:
    # A 120 s preemption notice lasts 2.4 s here (the trainers are short).
    with LocalCloud(Options(tick_interval=2.0, boot_delay=0.1, shutdown_budget=5.0, notify=True,
                            notice_scale=0.02)) as c:
        yield c


def spec(job: str, **extra: Any) -> dict[str, Any]:
    return {"zones": ["us-central1-a", "us-central1-b"], "machine_type": "g2-standard-8",
            "command": TRAINER, "heartbeat_interval": "1s",
            "checkpoint": {"uri": f"gs://respawn-local/ckpt/{job}"},
            "policy": {"startup_grace": "1m", "idle_timeout": "1m"}, **extra}


def submit(cloud: LocalCloud, job: str, doc: dict[str, Any]) -> None:
    cloud.storage.bucket(cloud.options.bucket).blob(names.spec_key(job)).upload_from_string(yaml.safe_dump(doc))


def status(cloud: LocalCloud, job: str) -> JobStatus | None:
    blob = cloud.storage.bucket(cloud.options.bucket).get_blob(names.status_key(job))
    return JobStatus.from_json(blob.download_as_bytes()) if blob else None




def running(cloud: LocalCloud, name: str) -> bool:
    return any(i["name"] == name and i["status"] == "RUNNING" for i in cloud.compute.instances())


def checkpoints(cloud: LocalCloud, job: str) -> list[str]:
    return [b.name for b in cloud.storage.list_blobs(cloud.options.bucket, prefix=f"ckpt/{job}/")]


def test_preempted_vm_is_recreated_from_its_checkpoint_and_succeeds(cloud):
    job = "resume"
    submit(cloud, job, spec(job))
    until("the first VM to run", lambda: running(cloud, f"{job}-1"))
    until("two checkpoints", lambda: len(checkpoints(cloud, job)) >= 2)
    cloud.compute.preempt(f"{job}-1")

    final = until("success", lambda: (s := status(cloud, job)) and s.phase.terminal and s, timeout=60)
    assert final.phase == Phase.SUCCEEDED, final.message
    assert (final.attempt, final.preemptions, final.failures) == (2, 1, 0)
    # Told once each, to the Pub/Sub stand-in through the real client and to the webhook sink,
    # though the tick and the object events raced on every step (the last is sent just after its commit).
    history = [e for e in final.history if e.event in notify.KINDS]

    def told() -> list[dict[str, Any]]:
        sent = [json.loads(base64.b64decode(m["data"])) for m in cloud.pubsub.published(cloud.notify_topic)]
        return [n for n in sent if n["job"] == job]

    mine = until("every transition told", lambda: (t := told()) and len(t) >= len(history) and t)
    # Told in any order (the tick and the events race), each once.
    assert sorted(n["id"] for n in mine) == sorted(notify.event_id(job, final, e) for e in history)
    assert {"preempted", "succeeded"} <= {n["event"] for n in mine} and len({n["id"] for n in mine}) == len(mine)
    hooked = until("the webhook posts", lambda: (b := [b["respawn"]["id"] for b in cloud.webhook.bodies
                                                       if b["respawn"]["job"] == job]) and len(b) >= len(mine) and b)
    assert sorted(hooked) == sorted(n["id"] for n in mine)
    # ...and the ledger accounts both attempts and the loss.
    book = final.ledger
    assert [(s.attempt, s.cause) for s in book.spans] == [(1, "preempted"), (2, "succeeded")]
    assert book.losses[0].running_at is not None and book.totals.losses == {"us-central1-a": {"preempted": 1}}
    # Both trained (issue 26): each boot ends at its trainer's start, from the agent's records,
    # however late a pass saw it RUNNING; none is all boot, none of unknown split.
    for span in book.spans:
        assert span.trainer_started is not None and not span.boot_unknown, span
        up = ledger.boot_end(span, span.end)
        assert up is not None and up < span.end, f"attempt {span.attempt} all boot: {span}"
    assert book.totals.unknown_acc_s == 0
    assert final.resume_from is not None and final.resume_from.step and final.resume_from.step >= 2
    log = (cloud.compute.workdir_of(f"{job}-2") / "serial-port-1.log").read_text()
    assert f"trainer: attempt 2 starts at step {final.resume_from.step}" in log
    assert "trainer: done at step 8" in log
    # the shutdown script wrote the marker; it was consumed after the replacement existed
    events = [e.event for e in final.history]
    assert events.index("preempted") < events.index("launch", events.index("preempted"))
    assert not cloud.storage.bucket(cloud.options.bucket).get_blob(names.marker_key(job))
    until("every VM of the job deleted", lambda: not [i for i in cloud.compute.instances() if i["name"].startswith(f"{job}-")])


def test_stockout_in_the_first_zone_moves_the_job_to_the_second(cloud):
    job = "failover"
    cloud.compute.stockout("us-central1-a")
    try:
        submit(cloud, job, spec(job, command="sleep 1", placement="ordered"))
        until("a VM in the second zone", lambda: running(cloud, f"{job}-1"))
        instance = next(i for i in cloud.compute.instances() if i["name"] == f"{job}-1")
        assert instance["zone"].endswith("/zones/us-central1-b")
        st = until("the failover in the history", lambda: (s := status(cloud, job)) and s.zone == "us-central1-b" and s)
        assert "us-central1-a" in st.zone_cooldowns
        assert any(e.event == "stockout" and e.zone == "us-central1-a" for e in st.history)
    finally:
        cloud.compute.stockout("us-central1-a", on=False)
    until("success", lambda: (s := status(cloud, job)) and s.phase == Phase.SUCCEEDED)


def zone_of(cloud: LocalCloud, name: str) -> str:
    return next(i for i in cloud.compute.instances() if i["name"] == name)["zone"].rsplit("/", 1)[-1]


def model_of(cloud: LocalCloud, name: str) -> str:
    return next(i for i in cloud.compute.instances() if i["name"] == name)["scheduling"]["provisioningModel"]


# Each placement test names zones of its own: the functions keep capacity advice a few
# minutes per shape (zones included), and one test's rates must not rank another's zones.
def test_a_stockout_in_the_best_ranked_zone_moves_the_job_to_the_next_best(cloud):
    job = "ranked"
    zones = ["us-central1-a", "us-central1-b", "us-central1-c"]
    for zone, rate in zip(zones, (0.5, 0.3, 0.01), strict=True):
        cloud.compute.preemption_rate(zone, rate)
    cloud.compute.stockout("us-central1-c", foreseen=False)  # advice still ranks c first
    try:
        submit(cloud, job, spec(job, command="sleep 1", zones=zones))
        until("a VM", lambda: running(cloud, f"{job}-1"))
        assert zone_of(cloud, f"{job}-1") == "us-central1-b", "the next best, not the next listed"
        st = until("the stockout in the history", lambda: (s := status(cloud, job)) and s.zone == "us-central1-b" and s)
        assert [e.zone for e in st.history if e.event == "stockout"] == ["us-central1-c"]
        assert st.zone_advice["us-central1-c"].preemption_rate == 0.01
    finally:
        cloud.compute.stockout("us-central1-c", on=False)
        for zone in zones:
            cloud.compute.preemption_rate(zone, 0.0)
    until("success", lambda: (s := status(cloud, job)) and s.phase == Phase.SUCCEEDED)


def test_a_spot_job_placed_by_advice_survives_where_the_spec_order_gets_it_preempted(cloud):
    zones = ["us-central1-f", "us-central1-c"]
    cloud.compute.preemption_rate("us-central1-f", 0.99)  # half its Spot VMs gone in 0.15 days
    cloud.compute.preemption_day = 10.0  # a day of those rates lasts 10 s here: f's VMs last ~1.5 s
    try:
        # No notice: a short trainer would finish inside one, and the point here is the loss.
        submit(cloud, "advised", spec("advised", zones=zones, preemption_notice="0s"))
        submit(cloud, "listed", spec("listed", zones=zones, placement="ordered", preemption_notice="0s"))
        final = until("the advised job's success", lambda: (s := status(cloud, "advised")) and s.phase.terminal and s,
                      timeout=60)
        assert final.phase == Phase.SUCCEEDED, final.message
        assert (final.attempt, final.preemptions, final.zone) == (1, 0, "us-central1-c")
        assert final.zone_advice["us-central1-f"].preemption_rate == 0.99
        listed = until("the listed job preempted", lambda: (s := status(cloud, "listed")) and s.preemptions and s)
        launches = [e.zone for e in listed.history if e.event == "launch"]
        assert launches[0] == "us-central1-f"  # the spec's order: where its Spot VMs do not last
    finally:
        cloud.compute.preemption_day = None
        cloud.compute.preemption_rate("us-central1-f", 0.0)
        cloud.storage.bucket(cloud.options.bucket).blob(names.cancel_key("listed")).upload_from_string("")
    until("the listed job cancelled", lambda: (s := status(cloud, "listed")) and s.phase == Phase.CANCELLED)


def test_spot_steps_down_to_standard_after_stockouts_and_back_up_at_the_next_recovery(cloud):
    job = "fallback"
    zones = ["us-east1-b", "us-east1-c"]
    for zone in zones:
        cloud.compute.stockout(zone, spot_only=True)
    doc = spec(job, command="sleep 60", zones=zones, provisioning=["spot", "standard"],
               policy={"startup_grace": "1m", "idle_timeout": "1m", "max_instance_age": "4s", "zone_cooldown": "2s",
                       "fallback": {"stockouts": 2, "step_up_after": "3s"}})
    try:
        submit(cloud, job, doc)
        until("a standard VM", lambda: running(cloud, f"{job}-1"))
        assert model_of(cloud, f"{job}-1") == "STANDARD"
        st = until("the step down", lambda: (s := status(cloud, job)) and s.provisioning == "standard" and s)
        assert sorted(e.zone for e in st.history if e.event == "stockout") == zones
        assert "stepping down from spot to standard: 2 capacity errors" in st.message or any(
            e.event == "step-down" for e in st.history)
    finally:
        for zone in zones:
            cloud.compute.stockout(zone, on=False, spot_only=True)
    # max_instance_age recycles the standard VM; by then step_up_after has passed, and Spot's own
    # cooldowns in those zones (kept while the job was on standard) are over: Spot again.
    until("a Spot VM for attempt 2", lambda: running(cloud, f"{job}-2"), timeout=60)
    assert model_of(cloud, f"{job}-2") == "SPOT"
    st = until("attempt 2 on spot", lambda: (s := status(cloud, job)) and s.attempt == 2 and s.provisioning == "spot" and s)
    assert any("stepping back up from standard to spot" in e.detail for e in st.history if e.event == "launch")
    cloud.storage.bucket(cloud.options.bucket).blob(names.cancel_key(job)).upload_from_string("")
    until("cancelled", lambda: (s := status(cloud, job)) and s.phase == Phase.CANCELLED)


def test_tick_alone_is_enough(cloud):
    """Events are hints: with the watcher stopped, the scheduler tick still converges."""
    cloud.watcher.stop()
    job = "tickonly"
    submit(cloud, job, spec(job, command="sleep 0.5"))

    def created() -> bool:
        # A Scheduler run now; while the ticker's own pass (every 2 s) holds the lease, it does nothing
        # and says so (200): either way only ticks act here.
        assert cloud.tick()["status"] == 200
        return f"{job}-1" in cloud.compute.names()

    until("a tick that creates the VM", created)
    until("success", lambda: (s := status(cloud, job)) and s.phase == Phase.SUCCEEDED)
    # consumed once acted on (the delete is the step right after the SUCCEEDED write)
    until("the exit record consumed", lambda: cloud.storage.bucket(cloud.options.bucket).get_blob(names.exit_key(job)) is None)


@pytest.mark.parametrize("stop", ["SIGINT", "SIGHUP"])  # Ctrl-C; its terminal closed
def test_local_up_prints_the_environment_and_stops_on_interrupt(tmp_path, stop):
    import os
    import signal
    import subprocess
    import sys

    # --dir: never the user's own ~/.respawn/local (a local cloud of theirs may be using it)
    process = subprocess.Popen([sys.executable, "-m", "controller.cli", "local", "up", "--tick", "3600",
                                "--dir", str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "COLUMNS": "200"}, start_new_session=True)
    lines: list[str] = []
    try:
        for line in process.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "Ctrl-C" in line:
                break
        [source] = [Path(l.split(maxsplit=1)[1].strip()) for l in lines if l.startswith("source ")]
        exports = dict(l.removeprefix("export ").strip().split("=", 1)
                       for l in source.read_text().splitlines() if l.startswith("export "))
        assert exports["STORAGE_EMULATOR_HOST"].startswith("http://127.0.0.1:")
        assert exports["RESPAWN_COMPUTE_ENDPOINT"].startswith("http://127.0.0.1:")
        assert exports["CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE"].endswith("/compute/v1/")
        process.send_signal(getattr(signal, stop))
        assert process.wait(timeout=30) == 0
        assert "local cloud stopped" in process.stdout.read()  # type: ignore[union-attr]
        assert not source.exists()
    finally:
        stop_gently(process)


# -- TPU jobs: the local TPU server's nodes, each worker a real process running the agent ------

# Worker 0 trains (a checkpoint object per step, resuming from RESUME_FROM); every other
# worker of the slice waits, as a JAX host would in its collective, and says who it is.
TPU_TRAINER = r"""
echo "worker: rank $NODE_RANK of $NODES, master $MASTER_ADDR"
if [ "$NODE_RANK" != 0 ]; then while :; do sleep 0.2; done; fi
step=0
if [ -n "${RESUME_FROM:-}" ]; then s="${RESUME_FROM##*ckpt-}"; step=$((10#${s%.pt})); fi
echo "trainer: attempt $RESPAWN_ATTEMPT starts at step $step"
while [ "$step" -lt 30 ]; do
  sleep 0.3
  step=$((step + 1))
  echo "$step" | curl -sf -o /dev/null -X POST --data-binary @- \
    "$STORAGE_EMULATOR_HOST/upload/storage/v1/b/$RESPAWN_BUCKET/o?uploadType=media&name=ckpt%2F$RESPAWN_JOB%2Fckpt-$(printf %06d "$step").pt"
done
echo "trainer: done at step $step"
"""


def tpu_ready(cloud: LocalCloud, name: str) -> bool:
    return any(n["name"].endswith(f"/nodes/{name}") and n.get("state") == "READY" and n.get("health") == "HEALTHY"
               for n in cloud.tpu.nodes())


def serial(cloud: LocalCloud, name: str, worker: int = 0) -> str:
    path = cloud.tpu.workdir_of(name, worker) / "serial-port-1.log"
    return path.read_text(errors="replace") if path.exists() else ""


def test_a_tpu_slice_preempted_then_terminated_by_maintenance_resumes_each_time_and_succeeds(cloud):
    job = "slice"
    doc = {k: v for k, v in spec(job, command=TPU_TRAINER, zones=["us-central2-b"]).items() if k != "machine_type"}
    submit(cloud, job, {**doc, "tpu": {"type": "v4-16", "runtime_version": "tpu-ubuntu2204-base"}})
    until("the first node to run", lambda: tpu_ready(cloud, f"{job}-1"), timeout=30)
    until("three checkpoints", lambda: len(checkpoints(cloud, job)) >= 3, timeout=30)
    assert "worker: rank 1 of 2" in serial(cloud, f"{job}-1", 1)
    cloud.tpu.preempt(f"{job}-1")

    until("the second node to train", lambda: "starts at step" in serial(cloud, f"{job}-2"), timeout=60)
    until("two more checkpoints", lambda: len(checkpoints(cloud, job)) >= 6 + 2, timeout=30)
    cloud.tpu.maintenance(f"{job}-2", outcome="terminated")

    final = until("success", lambda: (s := status(cloud, job)) and s.phase.terminal and s, timeout=90)
    assert final.phase == Phase.SUCCEEDED, final.message
    assert (final.attempt, final.preemptions, final.restarts, final.failures) == (3, 1, 2, 0)
    events = [e.event for e in final.history]
    assert "preempted" in events and "maintenance" in events
    for attempt in (2, 3):  # each resumed from where the one before had saved
        started = int(serial(cloud, f"{job}-{attempt}").split(f"attempt {attempt} starts at step ")[1].split()[0])
        assert started > 0
    assert "trainer: done at step 30" in serial(cloud, f"{job}-3")
    # Both workers were told the same MASTER_ADDR: worker 0's address, not the node's name.
    masters = {serial(cloud, f"{job}-3", w).split("master ")[1].split()[0] for w in (0, 1)}
    assert len(masters) == 1 and f"{job}-3" not in masters
    until("every node of the job deleted", lambda: not [n for n in cloud.tpu.nodes() if f"/nodes/{job}-" in n["name"]])
