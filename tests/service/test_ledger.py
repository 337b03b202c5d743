"""The goodput ledger, kept in each job's status by the engine over the in-memory fakes."""

from __future__ import annotations

import math
from datetime import timedelta

from controller.core import ledger, names
from controller.core.state import Phase
from tests.harness import BUCKET, Harness, lost_unseen, spec_doc


def running(h: Harness, job: str = "llm", **spec) -> None:
    h.submit(job, spec_doc(**spec) if spec else None)
    h.tick()
    h.advance(minutes=3)  # booting
    h.tick()
    assert h.status(job).phase == Phase.RUNNING


def save(h: Harness, step: int, write_s: float) -> None:
    """A directory save: its files first, its completion marker ``write_s`` later."""
    h.store.put("ckpts", f"run/{step}/state.bin", b"w" * 8)
    h.advance(seconds=write_s)
    h.store.put("ckpts", f"run/{step}/commit_success.txt", b"")


def test_a_preemption_is_accounted_with_its_recovery_in_three_parts_and_the_work_lost():
    h = Harness()
    t0 = h.clock.now()
    running(h)
    assert h.metadata(names.instance_name("llm", 1))["respawn-checkpoint-every-s"] == ""  # nothing measured yet
    h.advance(minutes=30)
    save(h, 100, write_s=120)  # complete at t0 + 35 min
    saved = h.clock.now()
    h.advance(minutes=20)
    h.marker("llm")  # the VM's notice, at t0 + 55 min
    lost = h.clock.now()
    h.advance(seconds=10)
    h.tick()  # seen: attempt 2 launched from step 100
    seen = h.clock.now()
    h.advance(minutes=2)
    h.tick()  # attempt 2 RUNNING
    back = h.clock.now()

    st = h.status("llm")
    book = st.ledger
    first, second = book.spans
    assert (first.attempt, first.zone, first.model, first.cause) == (1, "us-central1-a", "spot", "preempted")
    assert (first.start, first.inserted, first.running, first.end) == (t0, t0, t0 + timedelta(minutes=3), lost)
    assert first.accelerators == 1 and first.price_source.startswith("respawn's price table")
    assert (second.attempt, second.resumed_step, second.running, second.end) == (2, 100, back, None)
    (loss,) = book.losses
    assert (loss.cause, loss.lost_at, loss.seen_at, loss.issued_at, loss.running_at) == ("preempted", lost, seen, seen, back)
    assert loss.recovery_s == (back - lost).total_seconds()
    assert loss.redone_s == (lost - saved).total_seconds() == 20 * 60  # trained past step 100, then lost
    assert book.checkpoint_cost_s == 120
    assert book.totals.losses == {"us-central1-a": {"preempted": 1}}

    total = ledger.summary(book, back)
    paid_h = ((lost - t0) + (back - seen)).total_seconds() / 3600  # each attempt from Compute's acceptance
    assert math.isclose(total.accelerator_hours, paid_h)
    assert math.isclose(total.boot_hours, (3 * 60 + 120) / 3600)
    assert math.isclose(total.redone_hours, 20 / 60)
    assert math.isclose(total.goodput, (paid_h - total.boot_hours - total.redone_hours) / paid_h)
    assert math.isclose(total.cost, paid_h * 0.22) and math.isclose(total.on_demand_cost, paid_h * 0.71)
    assert total.savings > 0

    # Young/Daly for attempt 2: C = 120 s, M = the 52 minutes RUNNING before the one loss.
    expected = math.sqrt(2 * 120 * 52 * 60)
    assert math.isclose(st.checkpoint_every_s, expected)
    assert h.metadata(names.instance_name("llm", 2))["respawn-checkpoint-every-s"] == str(round(expected))


def test_a_hard_preemption_is_timed_from_computes_record_not_from_the_pass_that_saw_it():
    """No marker (the guest never saw it coming): the loss, the attempt's end and the recovery
    count from Compute's zone operation, not from the pass a minute later."""
    h = Harness()
    running(h)
    h.advance(minutes=30)
    save(h, 100, write_s=60)
    saved = h.clock.now()
    h.advance(minutes=10)
    # Compute's record made now; seen 50 s later: attempt 2 launched.
    lost, seen, _ = lost_unseen(h, lambda: h.compute.preempt(names.instance_name("llm", 1)), "llm")
    h.advance(minutes=2)
    h.tick()
    back = h.clock.now()

    st = h.status("llm")
    (event,) = [e for e in st.history if e.event == "preempted"]
    assert (event.at, event.since, event.recorded) == (seen, None, lost)
    (loss,) = st.ledger.losses
    assert (loss.lost_at, loss.seen_at, loss.running_at) == (lost, seen, back)
    assert loss.recovery_s == (back - lost).total_seconds()
    assert loss.redone_s == (lost - saved).total_seconds() == 10 * 60
    assert st.ledger.spans[0].end == lost  # not billed past Compute's stop


def test_the_ledger_closes_on_success_and_a_new_run_starts_a_new_one():
    h = Harness()
    running(h)
    h.advance(hours=1)
    h.exit("llm", 0)
    h.tick()
    book = h.status("llm").ledger
    assert [s.cause for s in book.spans] == ["succeeded"] and book.open is None
    assert book.totals.attempts == 1 and math.isclose(book.totals.paid_acc_s, 63 * 60)
    h.submit("llm", spec_doc(command="python train.py --again"))
    h.tick()
    again = h.status("llm").ledger
    assert [s.attempt for s in again.spans] == [2] and again.totals.attempts == 0


def test_the_status_stays_small_however_many_attempts_the_job_runs():
    h = Harness()
    running(h, policy={"max_restarts": 1000})
    sizes = []
    for _ in range(60):
        h.advance(minutes=40)
        h.marker("llm")
        h.tick()
        h.advance(minutes=2)
        h.tick()
        sizes.append(len(h.store.read(BUCKET, names.status_key("llm")).data))
    book = h.status("llm").ledger
    assert len(book.spans) == ledger.SPANS_KEPT and len(book.losses) == ledger.LOSSES_KEPT
    assert book.totals.attempts == 60 and book.totals.losses["us-central1-a"]["preempted"] == 60
    assert book.totals.recoveries == 60
    assert sizes[-1] <= sizes[30] * 1.05  # bounded: no growth once the detail is full


def test_a_stockout_is_marked_in_its_zone_and_the_attempt_priced_where_it_went():
    h = Harness()
    h.compute.stockouts.add("us-central1-a")
    h.submit("llm")
    h.tick()
    book = h.status("llm").ledger
    assert book.totals.stockouts == {"us-central1-a": 1}
    assert [m.kind for m in book.marks] == ["stockout"]
    assert book.open.zone == "us-central1-b"


def test_a_price_override_in_the_policy_wins_and_says_so():
    h = Harness()
    running(h, policy={"prices": {"spot": 1.0, "standard": 4.0}})
    h.advance(hours=1)
    total = ledger.summary(h.status("llm").ledger, h.clock.now())
    assert total.price_sources == ("policy.prices",)
    assert math.isclose(total.cost, 63 / 60) and math.isclose(total.on_demand_cost, 4 * 63 / 60)


def test_concurrent_passes_account_each_transition_once():
    h = Harness()
    running(h)
    h.advance(minutes=30)
    h.marker("llm")
    h.race("llm", passes=4)
    h.tick()
    book = h.status("llm").ledger
    assert book.totals.attempts == 1 and len(book.losses) == 1 and [s.attempt for s in book.spans] == [1, 2]


# -- found by attacking the first version ---------------------------------------------------------
def test_a_vm_that_never_ran_before_the_deadline_has_no_useful_time():
    h = Harness()
    h.submit("llm", spec_doc(policy={"max_runtime": "30m"}))
    h.tick()
    h.compute.set_status("llm-1", "STAGING")
    h.advance(minutes=31)
    h.tick()
    st = h.status("llm")
    assert st.phase == Phase.FAILED and st.ledger.spans[-1].running is None
    assert ledger.summary(st.ledger, h.clock.now()).goodput == 0.0


def test_the_interval_counts_the_loss_that_brought_the_relaunch_in_the_same_commit():
    h = Harness()
    running(h, provisioning=["standard"])
    h.advance(minutes=30)
    save(h, 100, write_s=120)
    h.advance(minutes=20)
    h.compute.maintenance(names.instance_name("llm", 1))  # down already: loss and relaunch in one commit
    h.tick()
    st = h.status("llm")
    assert st.attempt == 2 and st.ledger.totals.platform_losses == 1
    assert math.isclose(st.checkpoint_every_s, math.sqrt(2 * 120 * (52 * 60 + 2)), rel_tol=0.01)


def test_after_one_loss_the_interval_weighs_the_zone_s_advice_as_two_losses_and_says_so():
    """Issue 36: the run's one loss (52 min RUNNING) beside the zone's advised uptime (8 h, worth
    two losses): M = (52 min + 16 h) / 3, not the 52 minutes alone; the status keeps the estimate
    and the report says it."""
    from controller.adapters.memory import MemoryAdvisor
    from controller.render import report

    h = Harness()
    h.advisor = MemoryAdvisor(h.compute)
    for zone in ("us-central1-a", "us-central1-b"):
        h.advisor.spot_uptime(zone, 8 * 3600.0)
    running(h, placement="capacity")
    h.advance(minutes=30)
    save(h, 100, write_s=120)
    h.advance(minutes=20)
    h.compute.preempt(names.instance_name("llm", 1))
    h.tick()
    st = h.status("llm")
    assert st.attempt == 2 and st.ledger.totals.platform_losses == 1
    known = st.lifetime
    assert (known.losses, known.prior_s, known.set_aside) == (1, 8 * 3600.0, False)
    assert math.isclose(known.mean_s, (known.running_s + 2 * 8 * 3600.0) / 3)
    assert math.isclose(known.running_s, 52 * 60, rel_tol=0.01) and known.low_s < known.mean_s < known.high_s
    assert math.isclose(st.checkpoint_every_s, math.sqrt(2 * 120 * known.mean_s))
    line = report.lifetime(known)
    assert line.startswith(f"~{known.mean_s / 3600:.1f}h (80 %: ") and "1 loss in 52m" in line
    assert "advised uptime of 8h, worth 2" in line


def test_an_attempt_that_fails_over_to_another_zone_rests_its_interval_on_that_zone_s_uptime():
    """Placement chose a (8 h advised) for attempt 2, a refused the create, and b (1 h) took it:
    the interval its VM is given, and the time between losses the status shows, rest on b's
    advice, never on the zone it did not get."""
    from controller.adapters.memory import MemoryAdvisor
    from controller.core import errors

    h = Harness()
    h.advisor = MemoryAdvisor(h.compute)
    a, b = "us-central1-a", "us-central1-b"
    h.advisor.spot_uptime(a, 8 * 3600.0)
    h.advisor.spot_uptime(b, 3600.0)
    running(h, placement="capacity")
    h.advance(minutes=30)
    save(h, 100, write_s=120)
    h.advance(minutes=20)
    h.compute.preempt(names.instance_name("llm", 1))
    h.compute.faults.fail_next("insert", errors.CapacityError(a, "ZONE_RESOURCE_POOL_EXHAUSTED"))
    h.tick()
    st = h.status("llm")
    assert st.attempt == 2 and st.zone == b and h.compute.request_of(names.instance_name("llm", 2)).zone == b
    assert st.lifetime.prior_s == 3600.0
    assert math.isclose(st.lifetime.mean_s, (st.lifetime.running_s + 2 * 3600.0) / 3)
    assert math.isclose(st.checkpoint_every_s, math.sqrt(2 * 120 * st.lifetime.mean_s))
    every = h.metadata(names.instance_name("llm", 2))["respawn-checkpoint-every-s"]
    assert every == str(round(st.checkpoint_every_s))


def test_an_attempt_stepped_down_to_standard_never_rests_its_interval_on_a_spot_uptime():
    """Both zones out of Spot: attempt 2 steps down to standard VMs, which no Spot uptime speaks
    for (begin_attempt gives a standard launch none): M is the run's own loss alone."""
    from controller.adapters.memory import MemoryAdvisor

    h = Harness()
    h.advisor = MemoryAdvisor(h.compute)
    zones = ("us-central1-a", "us-central1-b")
    for zone in zones:
        h.advisor.spot_uptime(zone, 8 * 3600.0)
    running(h, placement="capacity", provisioning=["spot", "standard"])
    h.advance(minutes=30)
    save(h, 100, write_s=120)
    h.advance(minutes=20)
    h.compute.spot_stockouts.update(zones)
    h.compute.preempt(names.instance_name("llm", 1))
    h.tick()
    st = h.status("llm")
    assert (st.attempt, st.provisioning, st.inserted) == (2, "standard", True)
    assert st.lifetime.prior_s is None and st.lifetime.mean_s == st.lifetime.running_s
    assert math.isclose(st.checkpoint_every_s, math.sqrt(2 * 120 * st.lifetime.mean_s))


def test_a_time_between_losses_too_long_to_write_never_makes_the_status_unreadable():
    """A hand edit gave the run 1e308 s RUNNING: the interval's upper end overflows, and JSON has no
    infinity (the status writes it as null). The next pass still reads the run it wrote, never
    starting a new one over it."""
    import json

    h = Harness()
    running(h)
    doc = json.loads(h.store.read(BUCKET, names.status_key("llm")).data)
    doc["ledger"]["totals"]["running_s"] = 1e308
    h.store.put(BUCKET, names.status_key("llm"), json.dumps(doc).encode())
    h.advance(minutes=30)
    save(h, 100, write_s=120)
    h.compute.preempt(names.instance_name("llm", 1))
    h.tick()
    run = h.status("llm").run_id
    h.advance(minutes=2)
    h.tick()
    st = h.status("llm")
    assert (st.run_id, st.attempt) == (run, 2) and st.ledger.totals.platform_losses == 1
    assert st.lifetime is None and st.checkpoint_every_s == ledger.MAX_INTERVAL_S


def test_a_preemption_that_spends_the_restart_budget_is_still_a_loss():
    h = Harness()
    running(h, policy={"max_restarts": 1})
    for _ in range(2):
        h.advance(minutes=30)
        h.compute.preempt(names.instance_name("llm", h.status("llm").attempt))
        h.tick()
        h.advance(minutes=3)
        h.tick()
    st = h.status("llm")
    assert st.phase == Phase.FAILED
    assert st.ledger.totals.platform_losses == 2 and st.ledger.totals.losses["us-central1-a"]["preempted"] == 2


def test_a_replacement_lost_before_it_ran_leaves_no_recovery_open():
    h = Harness()
    running(h)
    h.advance(minutes=30)
    h.compute.preempt("llm-1")
    h.tick()  # llm-2 inserted
    h.compute.preempt("llm-2")  # gone before any pass saw it RUNNING
    h.tick()  # llm-3
    h.advance(minutes=3)
    h.tick()  # llm-3 RUNNING
    book = h.status("llm").ledger
    assert [loss.running_at is not None for loss in book.losses] == [True, True]
    assert book.totals.recoveries == 2


def test_the_spot_price_capacity_history_gives_prices_the_attempt():
    from controller.adapters.memory import MemoryAdvisor

    h = Harness()
    h.advisor = MemoryAdvisor(h.compute)
    h.advisor.spot_prices["g2-standard-8"] = 0.31
    running(h, placement="capacity")
    h.advance(hours=1)
    span = h.status("llm").ledger.open
    assert (span.per_hour, span.price_source) == (0.31, "capacityHistory priceHistory")
    total = ledger.summary(h.status("llm").ledger, h.clock.now())
    assert total.price_sources == ("capacityHistory priceHistory",) and math.isclose(total.cost, 0.31 * 63 / 60)


# -- issue 22: waiting is not paid; each attempt priced by its own shape -------------------------
def test_hours_a_flex_start_vm_waits_in_pending_are_waiting_not_paid():
    """5 h PENDING (Compute looking for capacity, nothing billed) then 1 h training: 1 h paid,
    5 h waiting, goodput near 100 %, not 1 h useful of 6 h "paid" (17 %)."""
    h = Harness()
    h.compute.stockouts.update({"us-central1-a", "us-central1-b"})  # a Flex-start VM waits it out in PENDING
    h.submit("llm", spec_doc(provisioning="flex-start", policy={"max_run_duration": "3d"}))
    h.tick()
    assert h.compute.request_of("llm-1").provisioning == "flex-start"
    h.tick()  # seen PENDING
    h.advance(hours=5)
    h.tick()
    h.compute.set_status("llm-1", "RUNNING")  # capacity found
    h.tick()
    assert h.status("llm").phase == Phase.RUNNING
    h.advance(hours=1)
    h.tick()
    total = ledger.summary(h.status("llm").ledger, h.clock.now())
    assert math.isclose(total.waiting_hours, 5.0, abs_tol=0.05)
    assert math.isclose(total.accelerator_hours, 1.0, abs_tol=0.05)  # one L4, from capacity on
    assert total.goodput > 0.9
    assert math.isclose(total.cost, total.accelerator_hours * 0.71)  # Flex-start priced at the on-demand table


def test_hours_a_queued_tpu_waits_for_resources_are_waiting_not_paid():
    from tests.service.test_tpu import TPU, tpu_doc

    h = Harness()
    h.tpu.stockout("us-central2-b")
    h.submit("tpu", tpu_doc(tpu={**TPU, "queued": True}))
    h.tick()
    h.tick()  # seen waiting in the queue
    h.advance(hours=5)
    h.tick()
    h.tpu.stockout("us-central2-b", on=False)  # the queue gives it its node
    h.tick()
    h.tick()
    assert h.status("tpu").phase == Phase.RUNNING
    h.advance(hours=1)
    total = ledger.summary(h.status("tpu").ledger, h.clock.now())
    assert math.isclose(total.waiting_hours, 5.0, abs_tol=0.05)
    assert math.isclose(total.accelerator_hours, 8 * 1.0, abs_tol=0.4)  # v4-16: 8 chips, an hour and a boot
    assert total.goodput > 0.9


def test_after_a_spec_change_the_attempt_is_priced_by_the_shape_it_runs_not_the_old_ones_spot_price():
    """Advice at attempt 1 priced g2-standard-8 Spot at $0.30/h. The spec moves to 8 H100s placed
    in the spec's order (no advice asked): $0.30/h is not their price."""
    from controller.adapters.memory import MemoryAdvisor

    h = Harness()
    h.advisor = MemoryAdvisor(h.compute)
    h.advisor.spot_prices["g2-standard-8"] = 0.30
    running(h, placement="capacity")
    assert h.status("llm").ledger.open.per_hour == 0.30
    h.submit("llm", spec_doc(machine_type="a3-highgpu-8g", placement="ordered"))  # from the next attempt on
    h.advance(minutes=30)
    h.compute.preempt("llm-1")
    for _ in range(3):
        h.tick()
        h.advance(minutes=2)
    span = h.status("llm").ledger.open
    assert span.attempt > 1 and span.machine_type == "a3-highgpu-8g" and span.accelerators == 8
    assert math.isclose(span.per_hour, 8 * 3.50) and span.price_source.startswith("respawn's price table")
    first = h.status("llm").ledger.spans[0]
    assert (first.machine_type, first.per_hour) == ("g2-standard-8", 0.30)


def test_a_running_attempts_boot_ends_at_its_trainers_start_once_a_heartbeat_says_it():
    """Issue 26: seen RUNNING before its trainer's first record (a real VM's guest boots after
    Compute says RUNNING): the heartbeat's start is said once, and the ledger's boot ends there
    while the attempt runs, not only when it ends."""
    h = Harness()
    t0 = h.clock.now()
    running(h)  # RUNNING seen 3 minutes in
    h.heartbeat("llm", trainer_started=t0 + timedelta(minutes=4))
    h.advance(minutes=1)
    h.tick()
    st = h.status("llm")
    said = [e for e in st.history if e.event == "training"]
    assert len(said) == 1 and said[0].trainer_started == t0 + timedelta(minutes=4)
    assert st.ledger.open.trainer_started == t0 + timedelta(minutes=4) and st.phase == Phase.RUNNING
    h.advance(minutes=55)
    total = ledger.summary(st.ledger, h.clock.now())
    assert math.isclose(total.boot_hours, 4 / 60) and math.isclose(total.accelerator_hours, 59 / 60)
    h.heartbeat("llm", trainer_started=t0 + timedelta(minutes=4))
    h.tick()
    assert [e.event for e in h.status("llm").history].count("training") == 1, "said once"


def test_an_attempt_whose_command_never_ran_is_all_boot_not_of_unknown_split():
    # The agent's exit record for a command it could not start (code download failed: exit 96).
    import json

    h = Harness()
    h.submit("llm")
    h.tick()
    st = h.status("llm")
    h.advance(minutes=2)
    body = {"exit_code": 96, "reason": "code download failed", "instance": names.instance_name("llm", st.attempt),
            "attempt": st.attempt, "node": 0, "token": h._token("llm", st.attempt, None)}
    h.store.put(BUCKET, names.exit_key("llm"), json.dumps(body))
    h.tick()
    book = h.status("llm").ledger
    span = next(s for s in book.spans if s.attempt == st.attempt)
    assert span.end is not None and not span.boot_unknown
    assert book.totals.unknown_acc_s == 0 and book.totals.boot_acc_s == book.totals.paid_acc_s > 0
