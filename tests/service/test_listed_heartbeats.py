"""Heartbeats judged from the bucket listing (issue 40, part 2): a pass decides the same whether it
judges a heartbeat from its listing (the custom metadata the VM agent writes with it) or from its
body, and a heartbeat whose proof is not this attempt's keeps nothing alive."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from controller.core import names
from controller.core.launch import LaunchContext
from controller.core.planner import plan
from controller.core.ports import BlobInfo, StopReason
from controller.core.state import Phase
from controller.core.world import listing_metadata, token_proof
from controller.service.observe import Observer
from tests.harness import BUCKET, PROJECT, Harness, spec_doc

POLICY = {"idle_timeout": "10m", "startup_grace": "5m", "max_failures": 3}


class BodiesOnly:
    """The same bucket, listed without custom metadata: every heartbeat is judged by its body."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def list(self, bucket: str, prefix: str) -> list[BlobInfo]:
        return [replace(info, metadata=None) for info in self.store.list(bucket, prefix)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def beat(h: Harness, job: str, body: dict[str, Any], metadata: dict[str, str] | None) -> None:
    h.store.put(BUCKET, names.heartbeat_key(job), json.dumps(body), metadata=metadata)


def test_a_heartbeat_whose_proof_is_wrong_is_not_this_attempts():
    """A writer without the attempt's token (a trainer of another job sharing the account) beats on
    time with a well-formed proof of the token it has: judged on the listing, it is not this
    attempt's, and the stale-heartbeat failure still fires."""
    h = Harness()
    for job in ("forged", "true"):
        h.submit(job, spec_doc(policy=POLICY))
    h.tick()
    h.tick()
    for minute in range(16):
        h.advance(minutes=1)
        h.heartbeat("true")
        h.heartbeat("forged", token="the-token-of-another-job")
        h.store.calls.clear()
        h.tick()
        assert not [n for op, n in h.store.calls if op == "read" and n.endswith("/heartbeat")], "judged on the listing"
    forged, true = h.status("forged"), h.status("true")
    assert forged.phase == Phase.RECOVERING and forged.failures == 1 and "no heartbeat" in forged.message
    assert true.phase == Phase.RUNNING and true.failures == 0


def test_a_heartbeat_of_the_right_token_under_another_attempts_number_is_not_this_attempts():
    h = Harness()
    h.submit("j", spec_doc(policy=POLICY))
    h.tick()
    h.tick()
    st = h.status("j")
    for minute in range(16):
        h.advance(minutes=1)
        body = {"attempt": st.attempt + 1, "token": st.attempt_token, "instance": "j-2", "node": 0}
        beat(h, "j", body, listing_metadata(body))
        h.tick()
    assert h.status("j").failures == 1 and "no heartbeat" in h.status("j").message


# -- the property: the same decisions from the listing as from the bodies ---------------------------
_GARBAGE = hs.one_of(hs.none(), hs.booleans(), hs.integers(min_value=-10**20, max_value=10**20),
                     hs.floats(allow_nan=True, allow_infinity=True), hs.text(max_size=20))
_WRITERS = ("agent", "older agent", "wrong proof", "wrong attempt", "garbage metadata", "oversized", "none")
_EVENTS = ("none", "preempted", "exit 1", "exit 0", "crashed")


@hs.composite
def _job(draw: Any) -> dict[str, Any]:
    progress = {}
    for key, sane in (("step", 1200), ("saved_step", 1100), ("save_s", 0.41), ("upload_s", 5.8),
                      ("trainer_started", "TRAINER_STARTED")):
        kind = draw(hs.integers(0, 2))
        if kind:
            progress[key] = sane if kind == 1 else draw(_GARBAGE)
    return {"writer": draw(hs.sampled_from(_WRITERS)), "event": draw(hs.sampled_from(_EVENTS)),
            "progress": progress, "beat_at": draw(hs.integers(0, 20)),
            "garbage": draw(hs.dictionaries(hs.sampled_from(["attempt", "token_sha256", "step", "instance", "x"]),
                                            hs.text(max_size=70), max_size=4))}


def _write(h: Harness, job: str, how: dict[str, Any]) -> None:
    st = h.status(job)
    started = h.clock.now().strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    progress = {k: started if v == "TRAINER_STARTED" else v for k, v in how["progress"].items()}
    body = {"instance": names.instance_name(job, st.attempt), "attempt": st.attempt, "node": 0,
            "token": st.attempt_token, **progress}
    writer = how["writer"]
    if writer == "none":
        return
    if writer == "wrong proof":
        body["token"] = "a-token-of-another-job"
    elif writer == "wrong attempt":
        body["attempt"] = st.attempt - 1
    elif writer == "oversized":
        body.update(step=10**19, save_s=1e12, instance="x" * 500, reason="r" * 9000)
    metadata = listing_metadata(body)
    if writer == "older agent":
        metadata = None
    elif writer == "garbage metadata":
        metadata = {**metadata, **how["garbage"]}
    beat(h, job, body, metadata)


def _happen(h: Harness, job: str, event: str) -> None:
    name = names.instance_name(job, h.status(job).attempt)
    if event == "preempted":
        h.compute.preempt(name)
        h.marker(job)
    elif event in ("exit 1", "exit 0"):
        h.exit(job, int(event[-1]))
    elif event == "crashed":
        h.compute.terminate(name, StopReason.CRASHED)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(jobs=hs.lists(_job(), min_size=1, max_size=6), later=hs.integers(0, 30))
def test_a_pass_decides_the_same_from_the_listing_as_from_the_bodies(jobs, later):
    """Over random fleets and heartbeats, forged ones included (wrong proof, wrong attempt, garbage
    metadata, oversized values), and random losses: the plan from a listing with the heartbeats'
    metadata is the plan from their bodies."""
    h = Harness()
    order = [f"job-{i}" for i in range(len(jobs))]
    for job in order:
        h.submit(job, spec_doc(policy=POLICY))
    h.tick()
    h.tick()
    for minute in range(21):
        for job, how in zip(order, jobs):
            if how["beat_at"] == minute:
                _write(h, job, how)
        h.advance(minutes=1)
    h.advance(minutes=later)
    for job, how in zip(order, jobs):
        _happen(h, job, how["event"])
    ctx = LaunchContext(BUCKET, PROJECT, "#!/bin/bash\n", "#!/bin/bash\n", new_token=lambda: "next-attempts-token")
    now = h.clock.now()
    listed = Observer(h.store, h.compute, BUCKET, h.policy, tpu=h.tpu, replayable=True).world()
    bodies = Observer(BodiesOnly(h.store), h.compute, BUCKET, h.policy, tpu=h.tpu, replayable=True).world()
    assert plan(listed, now, ctx) == plan(bodies, now, ctx)
    for job, how in zip(order, jobs):
        beat_ = listed.jobs[job].heartbeat
        if how["writer"] in ("agent", "wrong proof", "wrong attempt") and beat_ is not None:
            assert beat_.proof is not None and beat_.token is None, "a well-formed listing is judged on its own"
        if how["writer"] == "agent" and beat_ is not None:
            assert beat_.proof == token_proof(h.status(job).attempt_token or "")
