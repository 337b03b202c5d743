"""Sweeps through the whole engine over the fakes: at most ``max_parallel`` trials hold VMs, under
preemptions, failures, cancels and passes that race or die between steps; the rest wait QUEUED and
start as others finish; a queued trial never counts as a stockout."""

from __future__ import annotations

import json
import random
from datetime import timedelta

import pytest

from controller.core import errors, names, sweep
from controller.core.state import Phase
from tests.harness import BUCKET, Harness, spec_doc


def submit_sweep(h: Harness, trials: int, max_parallel: int, name: str = "lr", **base: object) -> list[str]:
    """What ``respawn sweep submit`` writes: the sweep's record first, then each trial's spec."""
    sw = sweep.SweepFile(name=name, base=spec_doc(**base), parameters={"lr": tuple(range(trials))},
                         max_parallel=max_parallel)
    h.store.write(BUCKET, names.sweep_key(name), sweep.record(sw).model_dump_json().encode(),
                  metadata={sweep.SWEEP_LIMIT_KEY: str(max_parallel)})
    jobs = []
    for t in sweep.trials(sw):
        h.submit(t.job, sweep.trial_spec(sw.base, sw, t))
        jobs.append(t.job)
    return jobs


def holding(h: Harness, jobs: list[str]) -> set[str]:
    """The trials with a VM not yet gone (booting, running, on its way down, or stopped)."""
    return {i.job for i in h.compute.all() if i.job in jobs}


def test_at_most_max_parallel_trials_hold_vms_and_the_rest_start_as_others_finish():
    h = Harness()
    jobs = submit_sweep(h, trials=5, max_parallel=2)
    h.tick()
    assert len(holding(h, jobs)) == 2
    queued = [j for j in jobs if h.status(j).phase == Phase.QUEUED]
    assert len(queued) == 3 and all("all 2 of sweep lr's slots are held" in h.status(j).message for j in queued)
    first = sorted(holding(h, jobs))[0]
    h.exit(first, 0)
    h.tick()  # the trial ends and its VM is deleted
    h.tick()  # its VM gone, its slot comes back
    assert h.status(first).phase == Phase.SUCCEEDED and len(holding(h, jobs)) == 1
    h.tick()  # a queued trial claims the slot and launches
    assert h.status(first).phase == Phase.SUCCEEDED and len(holding(h, jobs)) == 2
    assert len([j for j in jobs if h.status(j).phase == Phase.QUEUED]) == 2


def test_a_queued_trial_never_counts_as_a_stockout_or_steps_down():
    """Spot is out everywhere: the running trial meets stockouts and steps down to standard; the
    queued ones, which tried no zone, keep Spot, with no stockout, cooldown or step down."""
    h = Harness()
    jobs = submit_sweep(h, trials=3, max_parallel=1, provisioning=["spot", "standard"])
    h.compute.spot_stockouts.update({"us-central1-a", "us-central1-b"})
    for _ in range(4):
        h.tick()
        h.clock.advance(timedelta(minutes=1))
    (running,) = holding(h, jobs)
    assert h.status(running).provisioning == "standard"  # it did meet the stockouts
    waiting = [h.status(j) for j in jobs if j != running]
    for st in waiting:
        assert st.phase == Phase.QUEUED and st.provisioning != "standard" and st.attempt == 0
        assert not st.zone_rejections and not st.zone_cooldowns and not st.refused_models
        assert not [e for e in st.history if e.event in ("stockout", "stepped down", "zones cooling")]


@pytest.mark.parametrize("seed", range(12))
def test_the_limit_holds_under_preemptions_failures_cancels_and_racing_passes(seed):
    rng = random.Random(seed)
    h = Harness()
    limit = rng.randint(1, 3)
    jobs = submit_sweep(h, trials=rng.randint(limit + 1, 7), max_parallel=limit)
    for _ in range(40):
        live = sorted(holding(h, jobs))
        roll = rng.random()
        if live and roll < 0.2:
            h.marker(rng.choice(live))  # preempted
        elif live and roll < 0.3:
            h.exit(rng.choice(live), rng.choice([0, 1]))
        elif roll < 0.35:
            h.cancel(rng.choice(jobs))
        if rng.random() < 0.15:  # a pass dies at a write: between the claim and the status, or after
            h.store.faults.fail_next("write", errors.TransientError("503 from GCS"), times=rng.randint(1, 2))
        if rng.random() < 0.3:
            h.race(rng.choice(jobs), passes=3)  # passes for one trial side by side
        else:
            h.tick()
        h.store.faults._queued.pop("write", None)  # a fault the passes did not meet is not the harness's
        assert len(holding(h, jobs)) <= limit, (seed, holding(h, jobs))
    for _ in range(20):  # calm: every trial running ends; those backing off or queued start and end in turn
        for job in sorted(holding(h, jobs)):
            if h.status(job).phase == Phase.RUNNING:
                h.exit(job, 0)
        h.clock.advance(timedelta(minutes=6))  # past any backoff (spec_doc's: at most 5 minutes)
        h.tick()
        assert len(holding(h, jobs)) <= limit
    assert all(h.status(j).phase.terminal for j in jobs), {j: h.status(j).phase for j in jobs}
    assert not h.store.list(BUCKET, names.slots_prefix("lr")) and not holding(h, jobs)  # every slot given back


def test_a_trial_whose_spec_is_deleted_still_gives_its_slot_back():
    h = Harness()
    jobs = submit_sweep(h, trials=2, max_parallel=1)
    h.tick()
    (first,) = holding(h, jobs)
    h.store.delete(BUCKET, names.spec_key(first))  # by hand: the trial is cancelled, its VM deleted
    for _ in range(3):
        h.tick()
    assert h.status(first).phase == Phase.CANCELLED and holding(h, jobs) == {j for j in jobs if j != first}


def test_a_trial_whose_folder_is_deleted_whole_still_gives_its_slot_back_once_its_vm_is_gone():
    h = Harness()
    jobs = submit_sweep(h, trials=2, max_parallel=1)
    h.tick()
    (first,) = holding(h, jobs)
    for info in h.store.list(BUCKET, f"jobs/{first}/"):  # spec, status and records: no trace of the trial left
        h.store.delete(BUCKET, info.name)
    for _ in range(4):
        h.tick()  # its VM is an orphan, deleted; then its slot, held by no job, goes
    assert holding(h, jobs) == {j for j in jobs if j != first}


def test_a_preempted_trial_resumes_from_its_own_checkpoints_never_another_trials():
    h = Harness()
    jobs = submit_sweep(h, trials=2, max_parallel=2)
    h.tick()
    # spec_doc's checkpoint.uri is gs://ckpts/run: each trial's is gs://ckpts/run/<trial>; the other trial's
    # saves are further along, and must never be taken for this one's.
    h.store.put("ckpts", "run/lr-2/90/state.bin", b"w")
    h.store.put("ckpts", "run/lr-2/90/commit_success.txt", b"")
    h.store.put("ckpts", "run/lr-1/40/state.bin", b"w")
    h.store.put("ckpts", "run/lr-1/40/commit_success.txt", b"")
    h.marker("lr-1")
    h.tick()
    h.tick()
    st = h.status("lr-1")
    assert st.attempt == 2 and st.resume_from is not None and st.resume_from.uri == "gs://ckpts/run/lr-1/40", st.resume_from
    assert jobs == ["lr-1", "lr-2"]



def test_a_pass_that_dies_between_its_claim_and_its_status_write_leaves_the_limit_and_the_slot_right(monkeypatch):
    h = Harness()
    jobs = submit_sweep(h, trials=3, max_parallel=1)
    write = h.store.write
    died: list[str] = []

    def dies_once(bucket, name, data, **kw):
        claimed = h.store.list(BUCKET, names.slots_prefix("lr"))
        if not died and claimed and name.endswith("/status.json") and json.loads(data).get("phase") == "PROVISIONING":
            died.append(name)
            raise errors.TransientError("the function instance went away")
        return write(bucket, name, data, **kw)

    monkeypatch.setattr(h.store, "write", dies_once)
    h.tick()
    assert died and not h.compute.all()  # claimed, never launched
    h.tick()
    h.tick()
    assert len(holding(h, jobs)) == 1 and len(h.store.list(BUCKET, names.slots_prefix("lr"))) == 1
    (holder,) = holding(h, jobs)
    assert (h.store.list(BUCKET, names.slots_prefix("lr"))[0].metadata or {}).get("job") == holder


def test_a_trial_deleted_whole_gives_its_slot_back_even_in_a_tick_that_replans_another_job():
    """The tick's sweeps are its own: a pass for one job inside it (a new run's replan) reads its own."""
    h = Harness()
    jobs = submit_sweep(h, trials=2, max_parallel=1)
    h.submit("other")
    h.tick()
    h.tick()
    (first,) = holding(h, jobs)
    for info in h.store.list(BUCKET, f"jobs/{first}/"):
        h.store.delete(BUCKET, info.name)
    for _ in range(4):
        h.marker("other")  # preempted: its pass commits the loss and plans again at once, inside the tick
        h.tick()
    assert holding(h, jobs) == {j for j in jobs if j != first}



def test_a_pass_reads_max_parallel_from_the_listing_and_never_the_record_and_ignores_odd_slot_names():
    h = Harness()
    jobs = submit_sweep(h, trials=3, max_parallel=1)
    h.store.put(BUCKET, names.slots_prefix("lr") + "00", b"{}", metadata={"job": "lr-9"})  # by hand: no slot 0
    h.store.put(BUCKET, names.slots_prefix("lr") + "x", b"{}")
    h.store.calls.clear()
    h.tick()
    assert not [c for c in h.store.calls if c[0] in ("read", "read_listed") and c[1] == names.sweep_key("lr")]
    assert len(holding(h, jobs)) == 1  # one admitted, whatever else lies under slots/
