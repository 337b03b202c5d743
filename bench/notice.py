"""A preemption notice on the local cloud: from ``instance/preempted`` turning TRUE to the standby's insert.

``make bench`` runs it (scenario ``notice``: ``notice_to_insert_p50_s`` / ``notice_to_insert_p99_s`` in
``bench/results.json``); ``python -m bench.notice [--jobs 10] [--rounds 5]`` runs it alone, into ``bench/runs/``.

The whole local cloud (``localcloud.stack.LocalCloud``) at Google's latencies (``Realism.google()``,
the figures of ``localcloud.realism.COSTS``), its functions served by functions-framework as
deployed, warm (each has served requests before the first notice), Cloud Scheduler's tick every
60 s. Each job is a Spot VM asking for Google's 120 s notice, running the real startup script (the VM
agent) and a trainer that only sleeps. Each is preempted with its notice (``compute.preempt(name)``),
a few at once: ``instance/preempted`` turns TRUE, the agent's long poll answers, the agent writes its
notice record, GCS's event reaches ``on_object`` after Eventarc's delay (drawn from
``COSTS.eventarc_delay`` for each event, the deliveries side by side, as Eventarc's are), and the
pass inserts the standby. The clock runs from the preemption call (the flag is TRUE from then) to the
moment the local Compute server received the standby's insert (its operation's ``insertTime``).

The notice lasts ``--notice-s`` seconds here (``Options.notice_scale``), not 120: long enough for
every insert to come before the soft-off (each is checked to have come by the notice record, not by
Compute's record of the soft-off), short enough for five rounds to take minutes. Not modelled: a cold
instance (every event here finds a warm one: ``notice_to_insert_cold_share`` is 0; on Google
``COSTS.cold_fraction`` of isolated events, 30 %, the bench's assumption, would add a cold start,
median 3 s, and ``notice_to_insert_cold_modelled_p99_s`` draws that onto the measured latencies);
Eventarc's redeliveries.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from bench.hardpreempt import insert_received, percentile, status, wait
from bench.run import alone, provenance
from controller.core import names
from controller.core.state import Phase
from localcloud.events import Watcher
from localcloud.realism import COSTS, Lognormal, Realism
from localcloud.stack import LocalCloud, Options

class Eventarc(Watcher):
    """The local stand-in's deliveries, each after a delay drawn from ``delay`` and side by side (the
    stand-in posts one event at a time, as soon as it sees its object; Eventarc does neither)."""

    def __init__(self, gcs: Any, bucket: str, url: str, delay: Lognormal, seed: int,
                 prefixes: tuple[str, ...] = ("",)) -> None:
        super().__init__(gcs, bucket, url, prefixes=prefixes)
        self.delay, self.rng = delay, random.Random(seed)

    def _deliver(self, blob: Any) -> None:
        wait_s = self.delay.draw(self.rng)
        threading.Thread(target=self._later, args=(blob, wait_s), daemon=True).start()

    def _later(self, blob: Any, wait_s: float) -> None:
        time.sleep(wait_s)
        super()._deliver(blob)


def spec(zones: list[str]) -> str:
    return yaml.safe_dump({"zones": zones, "machine_type": "g2-standard-8", "command": "sleep 100000",
                           "preemption_notice": "120s",
                           "policy": {"backoff": {"initial": "30s", "max": "5m"}, "max_restarts": 1000}})


def trained(cloud: LocalCloud, job: str) -> str | None:
    """The job's current VM once its trainer runs (past any starting line, no standby pending)."""
    st = status(cloud, job)
    if st is None or st.phase != Phase.RUNNING or st.standby is not None or not st.instances:
        return None
    assert cloud.compute is not None
    try:
        vm = cloud.compute.instance(st.instances[0])
    except Exception:  # noqa: BLE001 - gone between the two reads
        return None
    return st.instances[0] if vm["status"] == "RUNNING" else None


def why_standby(cloud: LocalCloud, job: str, attempt: int) -> str:
    """What began the standby of ``attempt``: the notice record, or Compute's record of the soft-off."""
    st = status(cloud, job)
    said = [e.detail for e in (st.history if st else ()) if e.event == "standby" and e.attempt == attempt - 1]
    if not said:
        return "no standby"
    return "notice record" if said[-1].startswith("preemption notice") else "Compute"


def measure(jobs: int = 10, rounds: int = 5, seed: int = 1, scale: float = 1.0, notice_s: float = 20.0,
            say: Any = print) -> dict[str, Any]:
    rng = random.Random(seed)
    realism = Realism.google() if scale == 1.0 else Realism.google().scaled(scale)
    options = Options(tick_interval=60.0, realism=realism, boot_delay=0.3, notice_scale=notice_s / 120.0)
    delays: list[float] = []
    via: dict[str, int] = {}
    with LocalCloud(options) as cloud:
        assert cloud.compute is not None and cloud.watcher is not None
        cloud.watcher.stop()
        cloud.watcher = Eventarc(cloud.storage, options.bucket, cloud.function_url("on_object"),
                                 COSTS.eventarc_delay.scaled(scale), seed,
                                 prefixes=("jobs/", "preempted-jobs/")).start()
        zones = sorted(cloud.compute.zones)[:2]
        bucket = cloud.storage.bucket(options.bucket)
        jobs_ = [f"notice{i}" for i in range(jobs)]
        for job in jobs_:
            bucket.blob(names.spec_key(job)).upload_from_string(spec(zones))
        for r in range(rounds):
            vms = {job: wait(f"{job} training", lambda job=job: trained(cloud, job), 300, nudge=lambda: cloud.tick())
                   for job in jobs_}
            cloud.tick()  # as hardpreempt does: the last pass before the notices sees every job running
            order = list(jobs_)
            rng.shuffle(order)
            hit: dict[str, tuple[str, float]] = {}
            for job in order:
                time.sleep(rng.uniform(0.0, 2.0))  # a few at once, not all at one instant
                at = time.time()
                cloud.compute.preempt(vms[job])  # instance/preempted is TRUE from now
                hit[job] = (vms[job], at)
            for job, (vm, at) in hit.items():
                parsed = names.parse_instance_name(vm)
                assert parsed is not None
                nxt = names.instance_name(job, parsed[1] + 1)
                got = wait(f"insert of {nxt}", lambda nxt=nxt: insert_received(cloud, nxt), 150)
                delays.append(got - at)
                cause = why_standby(cloud, job, parsed[1] + 1)
                via[cause] = via.get(cause, 0) + 1
            say(f"round {r + 1}/{rounds}: {len(hit)} notices, p50 so far {statistics.median(delays):.2f}s, "
                f"max {max(delays):.2f}s; standbys begun by {via}")
    delays.sort()
    cold_rng = random.Random(seed + 1)
    cold_start = COSTS.cold_start.scaled(scale)
    cold = sorted(d + (cold_start.draw(cold_rng) if cold_rng.random() < COSTS.cold_fraction else 0.0) for d in delays)
    return {"notice_to_insert_p50_s": round(percentile(delays, 50), 2),
            "notice_to_insert_p99_s": round(percentile(delays, 99), 2),
            "notice_to_insert_max_s": round(delays[-1], 2), "notice_to_insert_events": len(delays),
            "notice_to_insert_via": dict(sorted(via.items())), "notice_to_insert_cold_share": 0.0,
            "notice_to_insert_cold_modelled_p99_s": round(percentile(cold, 99), 2),
            "notice_to_insert_note": (
                f"python -m bench.notice --jobs {jobs} --rounds {rounds}: the local cloud at Realism.google(), the "
                "real VM agent, on_object warm (cold share 0), Eventarc's delay drawn per event from "
                f"COSTS.eventarc_delay (median 1 s, p99 4 s), the 120 s notice lasting {notice_s:g} s here; from "
                "instance/preempted TRUE to the standby's insert received. notice_to_insert_cold_modelled_p99_s: "
                "the same latencies with a cold start (COSTS.cold_start, median 3 s) drawn onto "
                f"{COSTS.cold_fraction:.0%} of them, the bench's assumption for isolated events.")}


def scenario(run: Any) -> dict[str, Any]:
    """``make bench``'s: 10 jobs, 5 rounds, the notice lasting 20 s (2 jobs, 1 round, 5 s in a smoke run)."""
    jobs, rounds, notice_s = (2, 1, 5.0) if run.quick else (10, 5, 20.0)
    return measure(jobs, rounds, run.seed, scale=run.scale, notice_s=notice_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.notice", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--notice-s", type=float, default=20.0, help="how long the 120 s notice lasts here")
    parser.add_argument("--out", type=Path, help="write the run here (default: bench/runs/notice-<UTC>.json)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    head, started = provenance(seeds={"notice": args.seed}), time.perf_counter()
    found = measure(args.jobs, args.rounds, args.seed, notice_s=args.notice_s)
    print(json.dumps(found, indent=1))
    if not args.no_write:
        print(f"written: {alone('notice', found, head, time.perf_counter() - started, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
