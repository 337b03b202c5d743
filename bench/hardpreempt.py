"""Hard preemptions on the local cloud: from the loss to the replacement's insert received, per cause.

``make bench`` runs it (scenario ``hardpreempt``: ``hard_preempted_p50_s`` / ``hard_preempted_p99_s``
and ``hard_host_error_p50_s`` / ``hard_host_error_p99_s`` in ``bench/results.json``);
``python -m bench.hardpreempt [--jobs 10] [--rounds 5]`` runs it alone, into ``bench/runs/``.

The whole local cloud (``localcloud.stack.LocalCloud``) at Google's latencies
(``Realism.google()``: the figures of ``localcloud.realism.COSTS``, the bench's fakes' too), its
three functions served by functions-framework as deployed, Cloud Scheduler's tick every 60 s.
Each job's VM (Spot, asking for no preemption notice) runs the real startup script and a trainer
that only sleeps; each is lost **hard**, at a random moment, a few at once, to one of two causes:

- ``preempted`` (``compute.preempt(name, graceful=False)``): the soft-off, with no notice before it
  and no shutdown script (no marker is written); the VM is STOPPING while its guest halts (a halt
  time drawn from ``COSTS.poweroff_after_marker``, never past the 30 s hard-off), then TERMINATED.
  Compute records ``compute.instances.preempted`` at the soft-off: ``on_audit`` may find the VM
  still STOPPING, its preemption recorded, and boot the replacement beside it then.
- ``host_error`` (``compute.host_error(name)``): ``compute.instances.hostError``, the VM gone at
  once (no script, no halt).

The clock runs from the loss to the moment the local Compute server received the insert of the
job's next attempt (its operation's ``insertTime``). Between them: Compute's System Event entry,
the Logging sink's delivery to Pub/Sub, the push to ``on_audit`` (the local Pub/Sub's delivery
delay), the pass (bucket reads, a zonal list, the insert), each at the bench's latencies.

The audit path's two delays are drawn for each entry from ``COSTS``: the Log Router's
(``sink_delay``, median 1 s, p99 3 s) and Eventarc's push (``eventarc_delay``, median 1 s, p99
4 s). Google publishes neither figure (see ``localcloud.realism.Costs``): they are choices, and the
result moves with them. Not modelled: a cold ``on_audit`` instance (its process is warm here;
``COSTS.cold_start`` is 3 s median, for an event after a quiet spell, in 30 % of isolated events);
Pub/Sub redeliveries (a push answered 2xx here on its first try).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from bench.run import alone, provenance
from controller.core import names
from controller.core.state import JobStatus, Phase
from localcloud.realism import Realism
from localcloud.stack import LocalCloud, Options

CAUSES = ("preempted", "host_error")


def spec(zones: list[str]) -> str:
    # No notice: a Spot VM asks for Google's 120 s by default, and one that has it is preempted
    # with it (the agent's notice record: bench/notice.py's figure), never hard.
    return yaml.safe_dump({"zones": zones, "machine_type": "g2-standard-8", "command": "sleep 100000",
                           "preemption_notice": "0s",
                           "policy": {"backoff": {"initial": "30s", "max": "5m"}, "max_restarts": 1000}})


def status(cloud: LocalCloud, job: str) -> JobStatus | None:
    blob = cloud.storage.bucket(cloud.options.bucket).get_blob(names.status_key(job))
    return JobStatus.from_json(blob.download_as_bytes()) if blob else None


def insert_received(cloud: LocalCloud, name: str) -> float | None:
    """When Compute received the insert of ``name`` (epoch seconds), if it has."""
    assert cloud.compute is not None
    for op in cloud.compute.operations():
        if op.get("operationType") == "insert" and str(op.get("targetLink", "")).endswith(f"/instances/{name}"):
            return datetime.fromisoformat(op["insertTime"]).timestamp()
    return None


def running(cloud: LocalCloud, job: str) -> str | None:
    """The name of the job's current VM once Compute runs it (its startup script began)."""
    st = status(cloud, job)
    if st is None or st.phase not in (Phase.PROVISIONING, Phase.RUNNING) or not st.inserted or not st.instances:
        return None
    assert cloud.compute is not None
    try:
        vm = cloud.compute.instance(st.instances[0])
    except Exception:  # noqa: BLE001 - gone between the two reads
        return None
    return st.instances[0] if vm["status"] == "RUNNING" else None


def wait(what: str, check: Any, timeout: float, nudge: Any = None, every: float = 10.0) -> Any:
    """``check()`` until it finds something; ``nudge()`` every ``every`` seconds meanwhile (a
    Scheduler run, while the fleet comes up: an insert whose operation outlived its pass is
    recorded by the next pass, and that wait is no part of any figure)."""
    start = time.monotonic()
    nudged = start
    while time.monotonic() < start + timeout:
        if (found := check()) is not None:
            return found
        if nudge is not None and time.monotonic() - nudged >= every:
            nudge()
            nudged = time.monotonic()
        time.sleep(0.05)
    raise TimeoutError(f"{what} not within {timeout:g}s")


def lose(cloud: LocalCloud, vm: str, cause: str) -> None:
    assert cloud.compute is not None
    if cause == "preempted":
        cloud.compute.preempt(vm, graceful=False)
    elif cause == "host_error":
        cloud.compute.host_error(vm)
    else:
        raise ValueError(f"no such cause: {cause}")


def begun_by(cloud: LocalCloud, job: str, attempt: int) -> str:
    """How the pass that inserted ``attempt`` knew: beside a VM still going down, its preemption
    recorded (a standby), or once it was down (the loss)."""
    st = status(cloud, job)
    standby = any(e.event == "standby" and e.attempt == attempt - 1 for e in (st.history if st else ()))
    return "standby" if standby else "loss"


def measure(jobs: int = 10, rounds: int = 5, seed: int = 1, scale: float = 1.0,
            say: Any = print, cause: str = "preempted") -> dict[str, Any]:
    rng = random.Random(seed)
    realism = Realism.google() if scale == 1.0 else Realism.google().scaled(scale)
    options = Options(tick_interval=60.0, realism=realism, boot_delay=0.3)
    delays: list[float] = []
    via: dict[str, int] = {}
    with LocalCloud(options) as cloud:
        assert cloud.compute is not None
        zones = sorted(cloud.compute.zones)[:2]
        bucket = cloud.storage.bucket(options.bucket)
        names_ = [f"hard{i}" for i in range(jobs)]
        for job in names_:
            bucket.blob(names.spec_key(job)).upload_from_string(spec(zones))
        for r in range(rounds):
            vms = {job: wait(f"{job} running", lambda job=job: running(cloud, job), 300, nudge=lambda: cloud.tick())
                   for job in names_}
            # One Scheduler run records them RUNNING (as the minute's tick would): the last pass
            # before the losses, so that each is a loss of a running job.
            cloud.tick()
            order = list(names_)
            rng.shuffle(order)
            hit: dict[str, tuple[str, float]] = {}
            for job in order:
                time.sleep(rng.uniform(0.0, 2.0))  # a few at once, not all at one instant
                vm = vms[job]
                at = time.time()
                lose(cloud, vm, cause)
                hit[job] = (vm, at)
            for job, (vm, at) in hit.items():
                parsed = names.parse_instance_name(vm)
                assert parsed is not None
                nxt = names.instance_name(job, parsed[1] + 1)
                got = wait(f"insert of {nxt}", lambda nxt=nxt: insert_received(cloud, nxt), 150)
                delays.append(got - at)
                how = begun_by(cloud, job, parsed[1] + 1)
                via[how] = via.get(how, 0) + 1
            say(f"round {r + 1}/{rounds}: {len(hit)} hard losses ({cause}), "
                f"p50 so far {statistics.median(delays):.2f}s, max {max(delays):.2f}s; inserted as {via}")
    delays.sort()
    key = f"hard_{cause}"
    return {f"{key}_p50_s": round(percentile(delays, 50), 2), f"{key}_p99_s": round(percentile(delays, 99), 2),
            f"{key}_max_s": round(delays[-1], 2), f"{key}_events": len(delays), f"{key}_via": dict(sorted(via.items())),
            f"{key}_tick_interval_s": options.tick_interval, f"{key}_note": note(cause, jobs, rounds)}


def note(cause: str, jobs: int, rounds: int) -> str:
    how = ("compute.preempt(graceful=False): the soft-off with no notice and no shutdown script, STOPPING while the "
           "guest halts (COSTS.poweroff_after_marker), then TERMINATED; via: the replacement booted beside the VM "
           "still STOPPING (standby) or once it was down (loss)" if cause == "preempted" else
           "compute.host_error: compute.instances.hostError, the VM TERMINATED at once, no script, no halt")
    return (f"python -m bench.hardpreempt --jobs {jobs} --rounds {rounds}: the local cloud at Realism.google(), jobs "
            f"asking for no preemption notice, {how}; from the loss to the replacement's insert received, through "
            "Compute's System Event entry, the Log Router's and Eventarc's delays drawn per entry from COSTS, on_audit "
            "warm, the Scheduler every 60 s")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def scenario(run: Any) -> dict[str, Any]:
    """``make bench``'s: 10 jobs, 5 rounds, each cause (2 jobs, 1 round in a smoke run)."""
    jobs, rounds = (2, 1) if run.quick else (10, 5)
    found: dict[str, Any] = {}
    for cause in CAUSES:
        found.update(measure(jobs, rounds, run.seed, scale=run.scale, cause=cause))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hardpreempt", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--causes", nargs="+", choices=CAUSES, default=list(CAUSES))
    parser.add_argument("--out", type=Path, help="write the run here (default: bench/runs/hardpreempt-<UTC>.json)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    head, started = provenance(seeds={"hardpreempt": args.seed}), time.perf_counter()
    found: dict[str, Any] = {}
    for cause in args.causes:
        found.update(measure(args.jobs, args.rounds, args.seed, cause=cause))
    print(json.dumps(found, indent=1))
    if not args.no_write:
        print(f"written: {alone('hardpreempt', found, head, time.perf_counter() - started, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
