"""A status's size is bounded however long a job lives: what it keeps is kept to its newest, and
its words are cut. The pass keeps statuses between ticks and parses each one every tick, so a
status that grew without bound would cost every tick more CPU and every function more memory."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from controller.core import ledger as ledgers
from controller.core.runs import RUNS_KEPT, RunSummary
from controller.core.state import (ERRORS_KEPT, HISTORY_LIMIT, IDS_KEPT, NAME_LIMIT, STATUS_BOUND, TEXT_LIMIT, Event,
                                   JobStatus, Phase)

NOW = datetime(2026, 11, 1, tzinfo=timezone.utc)
LONG = "x" * 5000  # words from outside: a Compute error, a trainer's reason


def _at(n: int) -> datetime:
    return NOW + timedelta(seconds=n)


def _full() -> JobStatus:
    """A status at every bound at once, each text field as long as it can be."""
    zones = [f"us-central{n}-a" for n in range(64)]  # a spec names at most 64 zones
    uri = "gs://b/" + "p" * 1000
    span = ledgers.Span(attempt=7, zone=zones[0], model="spot", accelerators=8, machine_type="a3-highgpu-8g",
                        gpus=("nvidia-h100-80gb", 8), per_hour=30.0, on_demand_per_hour=90.0,
                        price_source="pricing", start=_at(0), inserted=_at(1), running=_at(2), end=_at(3),
                        cause="preempted", step=10**17, resumed_step=10**17)
    loss = ledgers.Loss(attempt=7, cause="preempted", zone=zones[0], accelerators=8, seen_at=_at(4), lost_at=_at(3),
                        issued_at=_at(5), running_at=_at(6), redone_s=100.0, step=10**17, steps_lost=10**17)
    book = ledgers.Ledger(spans=(span,) * ledgers.SPANS_KEPT, losses=(loss,) * ledgers.LOSSES_KEPT,
                          marks=(ledgers.Mark(at=_at(1), kind="stockout", zone=zones[0]),) * ledgers.MARKS_KEPT)
    history = tuple(Event(at=_at(n), event=LONG, attempt=n, detail=LONG, instance=LONG, zone=LONG, since=_at(n),
                          trainer_started=_at(n), step=10**17, save_s=1.5, upload_s=2.5)
                    for n in range(HISTORY_LIMIT))
    runs = tuple(RunSummary(run=f"20260101-{n:06d}", started=_at(n), ended=_at(n), phase="FAILED",
                            message="m" * 300, checkpoints=uri, checkpoint=uri, checkpoint_step=10**17,
                            checkpoint_tag="t" * 200) for n in range(RUNS_KEPT))
    return JobStatus(
        phase=Phase.RUNNING, message=LONG, errors=(LONG,) * (ERRORS_KEPT * 2), attempt=7, project="p" * 30,
        zone=zones[0], instances=tuple(f"job-7-n{n}" for n in range(64)), attempt_token="t" * 43,
        zone_cooldowns={z: _at(9) for z in zones}, zone_rejections={z: "r" * 300 for z in zones},
        model_cooldowns={m: {z: _at(9) for z in zones} for m in ("spot", "standard", "flex-start")},
        refused_models={m: "r" * 300 for m in ("spot", "standard", "flex-start")},
        instance_ids={f"job-{n}": str(10**19 + n) for n in range(IDS_KEPT)},
        ledger=book, history=history, event_count=10**6, runs=runs, checkpoint_uri=uri)


def test_a_status_at_every_bound_at_once_stays_under_its_bound():
    raw = _full().to_json()
    assert len(raw) < STATUS_BOUND, f"{len(raw):,} bytes"
    back = JobStatus.from_json(raw)
    assert len(back.history) == HISTORY_LIMIT and len(back.runs) == RUNS_KEPT and len(back.errors) == ERRORS_KEPT


def test_words_from_outside_are_cut_where_they_are_written():
    st = _full()
    # Cut when written (parsing stays fast): a copy, which ``but`` makes, is cut all the same.
    written = JobStatus.from_json(st.but(message=LONG).to_json())
    event = written.history[-1]
    assert len(event.detail) == TEXT_LIMIT and event.detail.endswith("…") and len(event.zone or "") == NAME_LIMIT
    assert len(written.message) == TEXT_LIMIT and len(written.errors) == ERRORS_KEPT
    assert all(len(e) == TEXT_LIMIT for e in written.errors)
