"""`respawn logs` on the local cloud (issue 11): the VMs' serial output goes into the Cloud
Logging stand-in as Google logs it, and the CLI, through the real google-cloud-logging client,
prints every attempt's output in order under its header, and follows what comes after."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from controller.service import bootstrap
from controller.cli.main import app
from controller.cli.joblogs import SERIAL
from controller.core.state import Phase
from localcloud.stack import LocalCloud, Options
from tests.integration.test_local_cloud import TRAINER, checkpoints, running, spec, status, submit
from tests.wait import until

runner = CliRunner()


@pytest.fixture(scope="module")
def cloud() -> Iterator[LocalCloud]:
    # A 120 s preemption notice lasts 0.6 s here: the tiny trainer (3.2 s) outlives it.
    with LocalCloud(Options(tick_interval=2.0, boot_delay=0.1, shutdown_budget=5.0, notice_scale=0.005)) as c:
        yield c


def noted(lines: list[str], i: int) -> int:
    """Where the lines under the header at ``i`` begin: past its note, a standby's (``   booted ...``)."""
    return i + 2 if i + 1 < len(lines) and lines[i + 1].startswith("   ") else i + 1


@pytest.fixture
def cli(cloud: LocalCloud, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for key, value in {**cloud.env(), "COLUMNS": "250"}.items():
        monkeypatch.setenv(key, value)
    bootstrap.override(None)  # settings and clients built anew, from this environment
    yield lambda *args: runner.invoke(app, list(args))
    bootstrap.override(None)


def logged(cloud: LocalCloud, text: str) -> bool:
    assert cloud.logging is not None
    return any(text in e["textPayload"] for e in cloud.logging.entries(SERIAL))


def test_logs_prints_every_attempt_in_order_under_its_header(cloud, cli):
    job = "logged"
    submit(cloud, job, spec(job))
    until("the first VM to run", lambda: running(cloud, f"{job}-1"))
    until("two checkpoints", lambda: len(checkpoints(cloud, job)) >= 2)
    cloud.compute.preempt(f"{job}-1")
    final = until("success", lambda: (s := status(cloud, job)) and s.phase.terminal and s, timeout=60)
    assert final.phase == Phase.SUCCEEDED and final.attempt == 2
    until("the last line in Cloud Logging", lambda: logged(cloud, "trainer: done at step 8"))
    until("every VM of the job deleted", lambda: not [i for i in cloud.compute.instances() if i["name"].startswith(job)])
    # Every line the VMs wrote is in Cloud Logging before the reads below: the full read and the
    # --limit one are compared, and under load a sweep could still be feeding the last lines.
    assert cloud.vm_logs is not None
    cloud.vm_logs.sweep(final=True)

    result = cli("logs", job)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    first = lines.index(f"── attempt 1: {job}-1 in {final.ledger.spans[0].zone} (preempted) ──")
    second = lines.index(f"── attempt 2: {job}-2 in {final.ledger.spans[1].zone} (succeeded) ──")
    step = final.resume_from.step if final.resume_from else None
    started = [i for i, line in enumerate(lines) if re.search(r" logged-\d trainer: attempt \d starts at step", line)]
    assert len(started) == 2 and first < started[0] < second < started[1], result.output
    assert lines[started[0]].endswith(f"{job}-1 trainer: attempt 1 starts at step 0")
    assert lines[started[1]].endswith(f"{job}-2 trainer: attempt 2 starts at step {step}")
    done = next(i for i, line in enumerate(lines) if line.endswith(f"{job}-2 trainer: done at step 8"))
    assert done > started[1]
    # each attempt's lines are its own VM's, in order, once: the serial console's, not the agent's copy
    # (attempt 2 may have booted at attempt 1's notice: its header's note says so, a line of its own)
    assert all(f" {job}-1 " in line for line in lines[noted(lines, first):second])
    assert all(f" {job}-2 " in line for line in lines[noted(lines, second):])
    notes = [line for line in lines if line.startswith("   ")]
    assert all(re.fullmatch(rf"   booted from [\d:]+ at {job}-1's notice; the go at [\d:]+, from step \d+", n)
               for n in notes) and len(notes) <= 1, result.output
    body = [line for line in lines if not line.startswith(("──", "   "))]
    assert len(body) == len(set(body)) and not any("startup-script: " in line for line in body)
    # one timestamp a line, the entry's (MM-DD HH:MM:SS): the VM agent's own ISO stamp is not repeated
    assert all(len(re.findall(r"\d{2}:\d{2}:\d{2}", line)) == 1 for line in body), result.output
    assert any(f" {job}-1 respawn: " in line for line in body), result.output
    stamps = [line[:19] for line in lines[noted(lines, second):]]
    assert stamps == sorted(stamps)

    # --limit: the last lines of each attempt, saying that earlier ones were left out
    tail = cli("logs", job, "--limit", "2")
    assert tail.exit_code == 0, tail.output
    note = "… earlier lines of this attempt left out (--limit 2)"
    assert tail.output.splitlines() == [*lines[first:noted(lines, first)], note, *lines[second - 2:second],
                                        *lines[second:noted(lines, second)], note, *lines[-2:]]


def test_a_standby_booted_at_the_notice_is_headed_with_when_its_go_and_its_step(cloud, cli):
    """Zero-gap recovery (issue 34) in `respawn logs`: attempt 2 booted beside attempt 1 at its
    notice; its header says so, and its own lines show it waiting at its starting line first."""
    job = "overlap"
    command = TRAINER.replace("-lt 8", "-lt 40").replace("sleep 0.4", "sleep 0.2")  # 8 s: past a 6 s notice
    submit(cloud, job, spec(job, command=command))
    until("the first VM to run", lambda: running(cloud, f"{job}-1"))
    until("two checkpoints", lambda: len(checkpoints(cloud, job)) >= 2)
    scale = cloud.compute.notice_scale
    cloud.compute.scale_notice(0.05)  # 6 s: the notice record boots the standby before the soft-off
    try:
        cloud.compute.preempt(f"{job}-1")
    finally:
        cloud.compute.scale_notice(scale)
    final = until("success", lambda: (s := status(cloud, job)) and s.phase.terminal and s, timeout=60)
    assert final.phase == Phase.SUCCEEDED and final.attempt == 2 and final.preemptions == 1, final.message
    assert any(e.event == "standby" for e in final.history), [e.event for e in final.history]
    until("the last line in Cloud Logging", lambda: logged(cloud, "trainer: done at step 40"))
    result = cli("logs", job)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    second = lines.index(f"── attempt 2: {job}-2 in {final.ledger.spans[1].zone} (succeeded) ──")
    assert re.fullmatch(rf"   booted from \d\d:\d\d:\d\d at {job}-1's notice; the go at \d\d:\d\d:\d\d, "
                        rf"from step {final.resume_from.step}", lines[second + 1]), result.output
    waited = next(i for i, line in enumerate(lines) if f" {job}-2 respawn: waiting at the line" in line)
    started = next(i for i, line in enumerate(lines) if f" {job}-2 trainer: attempt 2 starts at step" in line)
    assert second + 1 < waited < started, result.output


def test_logs_follow_prints_what_is_written_after_it_started(cloud, cli):
    job = "tailed"
    command = 'for i in $(seq 1 16); do echo "tick $i"; sleep 0.25; done'
    submit(cloud, job, spec(job, command=command))
    until("the first tick in Cloud Logging", lambda: logged(cloud, "tick 1"), timeout=30)
    before = {e["textPayload"] for e in cloud.logging.entries(SERIAL) if e["textPayload"].startswith("tick ")}
    result = cli("logs", job, "--follow", "--interval", "0.2", "--stop-after", "3")
    assert result.exit_code == 0, result.output
    ticks = [int(m[1]) for m in re.finditer(r" tailed-1 tick (\d+)$", result.output, re.MULTILINE)]
    assert ticks == sorted(ticks) and len(ticks) == len(set(ticks)), result.output
    after = {f"tick {t}" for t in ticks} - before
    assert after, f"nothing written after --follow started was printed: {result.output}"
    assert result.output.count("── attempt 1: tailed-1") == 1 and "startup-script:" not in result.output
    until("success", lambda: (s := status(cloud, job)) and s.phase == Phase.SUCCEEDED, timeout=30)


def test_logs_prints_a_tpu_jobs_workers_lines_read_as_tpu_worker(cloud, cli):
    """A TPU job's output, as Cloud TPU VMs log it (tpu_worker by the node's name): each worker's
    lines under its attempt's header, named NODE/wN, on the local cloud end to end."""
    job = "tpulog"
    doc = {k: v for k, v in spec(job, command='echo "worker says hello"', zones=["us-central2-b"]).items()
           if k != "machine_type"}
    submit(cloud, job, {**doc, "tpu": {"type": "v4-16", "runtime_version": "tpu-ubuntu2204-base"}})
    final = until("success", lambda: (s := status(cloud, job)) and s.phase.terminal and s, timeout=90)
    assert final.phase == Phase.SUCCEEDED, final.message
    assert cloud.logging is not None
    until("both workers' line in Cloud Logging", lambda: {
        e["resource"]["labels"].get("worker_id") for e in cloud.logging.entries(SERIAL)
        if e["resource"]["type"] == "tpu_worker" and e["resource"]["labels"]["node_id"] == f"{job}-1"
        and "worker says hello" in e["textPayload"]} == {"0", "1"})
    result = cli("logs", job)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"── attempt 1: {job}-1 in us-central2-b"), result.output
    assert {w for w in ("w0", "w1") if any(line.endswith(f" {job}-1/{w} worker says hello") for line in lines)} \
        == {"w0", "w1"}, result.output
