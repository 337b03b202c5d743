"""The ledger's fold, the price table and Young/Daly's interval, as pure functions."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone

import pytest

from controller.core import accounting, checkpoints, ledger, prices
from controller.core.ports import BlobInfo
from controller.core.state import CheckpointRef, Event, JobStatus, Phase

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def commit(before: JobStatus, *events: tuple[float, str], **changes) -> JobStatus:
    """``before`` plus ``events`` (minute, name) committed, the ledger settled as the executor does."""
    after = before.but(*(Event(at=at(m), event=n, attempt=changes.get("attempt", before.attempt), zone="z1")
                         for m, n in events), **changes)
    return accounting.settle(after, None)


def launched(minute: float = 0, attempt: int = 1, **changes) -> JobStatus:
    base = JobStatus(created_at=T0, phase=Phase.PENDING)
    return commit(base, (minute, "launch"), attempt=attempt, zone="z1", provisioning="spot", **changes)


def test_a_launch_opens_an_attempt_and_inserted_and_running_date_it():
    st = commit(launched(), (1, "inserted"))
    st = commit(st, (4, "running"), phase=Phase.RUNNING)
    (span,) = st.ledger.spans
    assert (span.attempt, span.start, span.inserted, span.running, span.end) == (1, at(0), at(1), at(4), None)


def test_a_commit_accounts_only_the_events_it_adds():
    st = commit(launched(), (1, "inserted"))
    again = accounting.settle(st, None)  # the same status written again: nothing new
    assert again.ledger == st.ledger


def test_a_trainer_failure_is_a_loss_and_a_terminal_failure_is_not():
    st = commit(commit(launched(), (1, "inserted")), (4, "running"))
    lost = commit(st, (10, "failed"), phase=Phase.RECOVERING)
    assert [loss.cause for loss in lost.ledger.losses] == ["failed"] and lost.ledger.spans[0].cause == "failed"
    ended = commit(st, (10, "failed"), phase=Phase.FAILED)
    assert ended.ledger.losses == () and ended.ledger.spans[0].cause == "failed"


def test_a_cancel_while_recovering_closes_nothing_twice():
    st = commit(commit(launched(), (1, "inserted")), (4, "running"))
    st = commit(st, (10, "preempted"), phase=Phase.RECOVERING)
    st = commit(st, (11, "cancelled"), phase=Phase.CANCELLED)
    assert st.ledger.totals.attempts == 1 and st.ledger.spans[0].cause == "preempted"


def test_an_attempt_never_accepted_by_compute_costs_nothing():
    st = commit(launched(), (5, "stockout"))
    st = commit(st, (6, "cancelled"), phase=Phase.CANCELLED)
    assert st.ledger.totals.paid_acc_s == 0 and st.ledger.totals.cost == 0
    assert st.ledger.totals.stockouts == {"z1": 1}


def test_a_new_run_starts_its_own_ledger_even_with_the_old_runs_history():
    from controller.core import transitions

    old = commit(commit(launched(), (1, "inserted")), (60, "succeeded"), phase=Phase.SUCCEEDED)
    fresh = transitions.new_run(old, old.attempt, 2, at(90))
    settled = accounting.settle(fresh, None)
    assert settled.ledger == ledger.Ledger(folded=old.event_count + 1) and settled.event_count == old.event_count + 1


def test_summary_counts_the_running_attempt_up_to_now():
    st = commit(commit(launched(), (1, "inserted")), (4, "running"))
    span = st.ledger.spans[0].model_copy(update={"accelerators": 2.0, "per_hour": 3.0, "on_demand_per_hour": 9.0})
    book = st.ledger.model_copy(update={"spans": (span,)})
    total = ledger.summary(book, at(61))
    assert math.isclose(total.accelerator_hours, 2.0) and math.isclose(total.boot_hours, 0.1)
    assert math.isclose(total.goodput, 0.95) and math.isclose(total.cost, 3.0) and math.isclose(total.savings, 6.0)


@pytest.mark.parametrize(("write_s", "uptime", "ran", "losses", "expected"), [
    (120, None, 3600, 1, math.sqrt(2 * 120 * 3600)),  # the run's own M
    (120, 7200, 0, 0, math.sqrt(2 * 120 * 7200)),  # seeded by the advice's uptime
    (120, 7200, 3600, 2, math.sqrt(2 * 120 * (3600 + 2 * 7200) / 4)),  # the advice worth two losses beside the run's
    (120, 30 * 86400, 5400, 3, math.sqrt(2 * 120 * 1800)),  # advice far off is set aside (tests/unit/test_interval_prior.py)
    (None, 7200, 0, 0, None),  # no C measured: no advice
    (120, None, 3600, 0, None),  # no M: no advice
    (1, None, 60, 1, ledger.MIN_INTERVAL_S),  # bounded
    (0, None, 3600, 1, math.sqrt(2 * 1 * 3600)),  # a save that landed within a second: C of 1 s
])
def test_young_daly_interval(write_s, uptime, ran, losses, expected):
    book = ledger.Ledger(totals=ledger.Totals(running_s=ran, platform_losses=losses))
    got = ledger.checkpoint_every(book, write_s, uptime)
    assert got == expected if expected is None else math.isclose(got, expected)


def test_prices_come_from_the_table_the_advice_or_the_policy_and_say_which():
    table = prices.rate(model="spot", nodes=2, gpus=("nvidia-l4", 1))
    assert (table.accelerators, table.per_hour, table.on_demand_per_hour) == (2.0, 0.44, 1.42)
    assert table.source == prices.SOURCE
    advised = prices.rate(model="spot", nodes=2, gpus=("nvidia-l4", 1), spot_price=0.3)
    assert math.isclose(advised.per_hour, 0.6) and advised.source == "capacityHistory priceHistory"
    mine = prices.rate(model="spot", nodes=2, gpus=("nvidia-l4", 1), override={"spot": 1.0, "standard": 2.0})
    assert (mine.per_hour, mine.on_demand_per_hour, mine.source) == (2.0, 4.0, "policy.prices")
    tpu = prices.rate(model="standard", nodes=1, tpu_type="v4-32")
    assert tpu.accelerators == 16 and math.isclose(tpu.per_hour, 16 * 3.22)
    assert prices.rate(model="spot", nodes=1, tpu_type="v5litepod-8").accelerators == 8
    unknown = prices.rate(model="spot", nodes=1, gpus=("nvidia-future", 8))
    assert unknown.per_hour == 0 and "policy.prices" in unknown.source
    cpu = prices.rate(model="standard", nodes=1, machine_type="n2-standard-8")
    assert cpu.accelerators == 0 and math.isclose(cpu.per_hour, 8 * prices.VCPU_HOUR[1])


def test_a_directory_saves_writing_time_is_its_first_object_to_its_marker():
    def blob(name: str, minute: float) -> BlobInfo:
        return BlobInfo("b", f"run/{name}", 1, at(minute))

    listing = [blob("100/a.bin", 0), blob("100/b.bin", 1), blob("100/commit_success.txt", 2.5),
               blob("ckpt-000200.pt", 9)]
    found = checkpoints.latest("gs://b/run", listing[:3], lambda n, lim: None)
    assert (found.step, found.saved_at, found.write_s) == (100, at(2.5), 150.0)
    single = checkpoints.latest("gs://b/run", listing[3:], lambda n, lim: None)
    assert (single.saved_at, single.write_s) == (at(9), None)
    assert CheckpointRef.of(found).write_s == 150.0


def one_accelerator(st: JobStatus) -> JobStatus:
    """``st`` with its open attempt on one accelerator (a spec-less ledger counts none)."""
    span = st.ledger.open.model_copy(update={"accelerators": 1.0})
    return st.model_copy(update={"ledger": ledger.with_current(st.ledger, span)})


def test_an_attempt_that_ran_and_ended_between_two_passes_boots_until_its_trainer_started():
    """Never seen RUNNING, but its marker (or exit record) names its trainer's start: booting
    from its acceptance to then, training after; the recovery it ends is closed there."""
    st = commit(commit(launched(), (1, "inserted")), (4, "running"))  # a 3-minute boot seen
    st = commit(st, (30, "failed"), phase=Phase.RECOVERING)
    st = one_accelerator(commit(commit(st, (31, "launch"), attempt=2, zone="z1", provisioning="spot"), (32, "inserted")))
    marker = Event(at=at(60), event="preempted", attempt=2, zone="z1", since=at(59), trainer_started=at(32.5))
    st = accounting.settle(st.but(marker, phase=Phase.RECOVERING), None)
    second = st.ledger.spans[1]
    assert (second.trainer_started, second.boot_unknown, second.end) == (at(32.5), False, at(59))
    assert math.isclose(st.ledger.totals.boot_acc_s, 30.0)  # 32 to 32.5 min, not a mean boot nor all of it
    assert math.isclose(st.ledger.totals.paid_acc_s, 27 * 60) and st.ledger.totals.unknown_acc_s == 0
    first_loss = st.ledger.losses[0]
    assert first_loss.running_at == at(32.5) and st.ledger.totals.recoveries == 1
    total = ledger.summary(st.ledger, at(60))
    assert math.isclose(total.goodput, (27 * 60 - 30) / (27 * 60)) and total.unknown_hours == 0


def test_an_attempt_that_ran_between_two_passes_with_no_trainer_start_is_boot_unknown_not_guessed():
    """Its exit record says it ran, and none names when its trainer started: no mean boot, no
    default boot is charged; its paid time is of unknown split, outside goodput's ratio."""
    st = commit(commit(launched(), (1, "inserted")), (4, "running"))
    st = one_accelerator(st)
    st = commit(st, (30, "failed"), phase=Phase.RECOVERING)  # 26 min trained, 3 booted: known
    saved = CheckpointRef(uri="gs://b/run/ckpt-87.pt", step=87, saved_at=at(30))  # nothing redone
    st = commit(st, (31, "launch"), attempt=2, zone="z1", provisioning="spot", resume_from=saved)
    st = one_accelerator(commit(st, (32, "inserted")))
    exit0 = Event(at=at(50), event="succeeded", attempt=2, zone="z1", since=at(49))  # an agent without the field
    st = accounting.settle(st.but(exit0, phase=Phase.SUCCEEDED), None)
    second = st.ledger.spans[1]
    assert (second.running, second.boot_unknown, second.end) == (None, True, at(50))
    totals = st.ledger.totals
    assert math.isclose(totals.boot_acc_s, 3 * 60) and math.isclose(totals.unknown_acc_s, 18 * 60)
    loss = st.ledger.losses[0]
    assert loss.recovery_unknown and loss.recovery_s is None and totals.recoveries == 0
    total = ledger.summary(st.ledger, at(50))
    assert math.isclose(total.unknown_hours, 18 / 60) and math.isclose(total.accelerator_hours, 47 / 60)
    assert math.isclose(total.goodput, 26 / 29)  # of the 29 known minutes; the 18 unknown are in neither side


def test_an_attempt_whose_split_is_all_unknown_has_no_goodput_rather_than_a_guess():
    st = one_accelerator(commit(launched(), (1, "inserted")))
    exit0 = Event(at=at(21), event="succeeded", attempt=1, zone="z1", since=at(20))
    st = accounting.settle(st.but(exit0, phase=Phase.SUCCEEDED), None)
    assert st.ledger.spans[0].running is None and st.ledger.spans[0].boot_unknown
    total = ledger.summary(st.ledger, at(21))
    assert total.goodput is None and math.isclose(total.unknown_hours, 20 / 60) and total.boot_hours == 0


@pytest.mark.parametrize(("started", "boot_s"), [
    (at(0.5), 0.0),  # the VM's clock behind the controller's: before billing, so no boot at all
    (at(1.25), 15.0),
    (at(90), 19 * 60),  # after the attempt's end (a clock ahead): all of it boot, never more
])
def test_a_trainer_start_outside_the_attempt_is_clamped_to_it(started, boot_s):
    st = one_accelerator(commit(launched(), (1, "inserted")))
    marker = Event(at=at(21), event="preempted", attempt=1, zone="z1", since=at(20), trainer_started=started)
    st = accounting.settle(st.but(marker, phase=Phase.RECOVERING), None)
    totals = st.ledger.totals
    assert math.isclose(totals.boot_acc_s, boot_s) and math.isclose(totals.paid_acc_s, 19 * 60)
    assert totals.unknown_acc_s == 0 and math.isclose(totals.running_s, 19 * 60 - boot_s)


def test_a_trainer_start_ends_the_boot_whenever_a_pass_saw_running():
    """The tick's lag is no boot: training within half a second, seen RUNNING 5.1 s later."""
    st = one_accelerator(commit(launched(), (0, "inserted")))
    seen = Event(at=T0 + timedelta(seconds=5.6), event="running", attempt=1, zone="z1")
    st = accounting.settle(st.but(seen, phase=Phase.RUNNING), None)
    done = Event(at=at(10), event="succeeded", attempt=1, zone="z1", since=at(10),
                 trainer_started=T0 + timedelta(seconds=0.5))
    st = accounting.settle(st.but(done, phase=Phase.SUCCEEDED), None)
    assert math.isclose(st.ledger.totals.boot_acc_s, 0.5)
    assert math.isclose(ledger.summary(st.ledger, at(10)).goodput, (600 - 0.5) / 600)


def test_a_hard_loss_never_seen_running_stays_boot_and_a_cancel_is_no_evidence():
    st = commit(launched(), (1, "inserted"))
    st = commit(st, (20, "lost"), phase=Phase.RECOVERING)  # no marker: nothing says it ran
    assert st.ledger.spans[0].running is None
    st = commit(st, (21, "launch"), attempt=2, zone="z1", provisioning="spot")
    st = commit(st, (22, "inserted"))
    st = commit(st, (30, "cancelled"), phase=Phase.CANCELLED)
    assert st.ledger.spans[1].running is None and st.ledger.losses[0].running_at is None


def test_an_attempt_adopted_in_another_zone_is_accounted_there():
    """Committed in z1, found (its insert accepted, the status write lost) in z2: adopted there."""
    st = launched()
    assert st.ledger.open.zone == "z1"
    found = Event(at=at(2), event="adopted", attempt=1, detail="found llm-1 in z2")
    st = accounting.settle(st.but(found, zone="z2", inserted=True), None)
    assert (st.ledger.open.zone, st.ledger.open.inserted) == ("z2", at(2))


def test_advice_that_makes_no_sense_is_ignored_not_raised():
    book = ledger.Ledger(totals=ledger.Totals(running_s=3600, platform_losses=1))
    assert math.isclose(ledger.checkpoint_every(book, 120, -5.0), math.sqrt(2 * 120 * 3600))
    assert ledger.checkpoint_every(book.model_copy(update={"totals": ledger.Totals()}), 120, float("nan")) is None


def test_a_ledger_written_before_folded_existed_is_taken_as_up_to_date_not_folded_again():
    st = commit(commit(launched(), (1, "inserted")), (4, "running"))
    raw = json.loads(st.to_json())
    del raw["ledger"]["folded"]  # as the previous release wrote it
    old = JobStatus.model_validate(raw)
    assert old.ledger.folded == old.event_count
    again = accounting.settle(old.but(Event(at=at(9), event="preempted", attempt=1, zone="z1"),
                                  phase=Phase.RECOVERING), None)
    assert len(again.ledger.spans) == 1 and again.ledger.totals.attempts == 1


def test_an_event_the_ledger_cannot_fold_is_skipped_and_said_never_raised():
    st = commit(launched(), (1, "inserted"))
    # No time zone, past validation (a status read now reads one as UTC: durations.Instant): unfoldable.
    naive = Event.model_construct(at=datetime(2026, 1, 1, 0, 30), event="preempted", attempt=1, detail="",
                                  instance=None, zone=None, since=None, trainer_started=None, step=None,
                                  save_s=None, upload_s=None)
    out = accounting.settle(st.but(naive, phase=Phase.RECOVERING), None)
    assert out.ledger.skipped == 1 and "TypeError" in out.ledger.problem
    assert out.ledger.folded == out.event_count


# -- issue 22: what advice and a listing can honestly say of M and C ---------------------------
def _launch_with(advice):
    from controller.core import transitions
    from controller.core.spec import parse_spec

    spec = parse_spec("zones: [us-central1-a]\nmachine_type: g2-standard-8\ncommand: x\n", "j")
    saved = CheckpointRef(uri="gs://b/run/100", step=100, write_s=120.0)
    st = JobStatus(created_at=T0, phase=Phase.PENDING)
    return transitions.begin_attempt(st, spec, "p", "us-central1-a", ["j-1"], saved, at(0), "start", 1, "tok", "spot",
                                     advice)


def test_a_save_or_boot_no_clock_could_have_measured_never_weighs_a_zone():
    """A hand edit's NaN save or negative boot: placement weighs the defaults, never an expected
    goodput of 0 % or 6,000 % that ranks the shorter-lived zone first."""
    from controller.core import placement
    from controller.core.ports import ZoneAdvice
    from controller.core.spec import parse_spec

    book = JobStatus.model_validate_json('{"ledger": {"save_s": NaN, "totals": {"boots": 1, "boot_s": -1e6}}}').ledger
    assert ledger.run_costs(book) == (None, None)
    assert ledger.run_costs(ledger.Ledger(save_s=30.0, totals=ledger.Totals(boots=2, boot_s=300.0))) == (30.0, 150.0)
    a, b = "us-central1-a", "us-central1-b"
    spec = parse_spec(f"zones: [{a}, {b}]\nmachine_type: g2-standard-8\ncommand: x\n", "j")
    worth = placement.worths(spec, "spot", {a: ZoneAdvice(0.9, 4 * 3600.0), b: ZoneAdvice(0.9, 8 * 3600.0)},
                             *ledger.run_costs(book))
    assert 0 < worth[a].goodput < worth[b].goodput < 1


def test_a_preemption_rate_is_a_share_of_stopped_vms_and_never_seeds_the_time_between_losses():
    """capacityHistory's preemptionRate is (Spot VMs preempted) / (Spot VMs that stopped): 1.0 in a zone
    where every Spot VM that stopped was preempted, however long they ran. It is no daily rate: with
    no uptime estimate and no loss of the run's own, there is no M, and no interval is advised."""
    from controller.core.ports import ZoneAdvice

    assert _launch_with({"us-central1-a": ZoneAdvice(obtainability=0.9, preemption_rate=0.5)}).checkpoint_every_s is None
    seeded = _launch_with({"us-central1-a": ZoneAdvice(obtainability=0.9, uptime_s=7200.0,
                                                         preemption_rate=1.0)})
    assert math.isclose(seeded.checkpoint_every_s, math.sqrt(2 * 120 * 7200))


def test_a_save_whose_objects_land_together_costs_at_least_its_bytes_at_the_stated_throughput():
    """Shards that finish within a second of each other read as a 1-second save from their GCS times;
    30 GB cannot be uploaded in a second. C is bounded below by the bytes at UPLOAD_BYTES_PER_S."""
    def blob(name: str, seconds: float, size: int) -> BlobInfo:
        return BlobInfo("b", f"run/{name}", 1, T0 + timedelta(seconds=seconds), size)

    gb = 10**9
    shards = [blob("100/shard-0.bin", 0, 10 * gb), blob("100/shard-1.bin", 0.2, 10 * gb),
              blob("100/shard-2.bin", 0.5, 10 * gb), blob("100/commit_success.txt", 1, 0)]
    found = checkpoints.latest("gs://b/run", shards, lambda n, lim: None)
    assert math.isclose(found.write_s, 30 * gb / checkpoints.UPLOAD_BYTES_PER_S)
    assert found.write_s > 1.0
    slow = [blob("200/a.bin", 0, 1000), blob("200/commit_success.txt", 150, 0)]  # the times say more: they stand
    assert checkpoints.latest("gs://b/run", slow, lambda n, lim: None).write_s == 150.0
    single = checkpoints.latest("gs://b/run", [blob("ckpt-000300.pt", 9, 5 * gb)], lambda n, lim: None)
    assert math.isclose(single.write_s, 5 * gb / checkpoints.UPLOAD_BYTES_PER_S)  # one object: its size alone
    empty = checkpoints.latest("gs://b/run", [blob("ckpt-000400.pt", 9, 0)], lambda n, lim: None)
    assert empty.write_s is None  # nothing known of it


def test_a_create_refused_then_launched_again_is_one_attempt_not_two():
    """A stockout's refused create was never a VM: the attempt launched again is the only one."""
    st = commit(launched(), (0.01, "stockout"))
    st = commit(st, (0.02, "launch"), zone="z2")
    assert len(st.ledger.spans) == 1 and st.ledger.totals.attempts == 0
    st = commit(commit(st, (1, "inserted"), zone="z2"), (4, "running"), phase=Phase.RUNNING)
    st = commit(st, (10, "succeeded"), phase=Phase.SUCCEEDED)
    (span,) = st.ledger.spans
    assert st.ledger.totals.attempts == 1 and span.start == at(0.02) and span.end == at(10)


def test_an_attempt_accepted_in_another_zone_than_its_first_try_is_priced_there():
    st = commit(launched(), (0.01, "stockout"))
    st = commit(st, (1, "inserted"), zone="z2", provisioning="standard")
    (span,) = st.ledger.spans
    assert (span.zone, span.model) == ("z2", "standard")
