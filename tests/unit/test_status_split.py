"""A status as the observer keeps it between passes: its head parsed each pass, its history and
past runs only when a pass uses them (``JobStatus.split`` / ``joined``, ``state.Later``). Whatever
a status holds, what a pass makes of it is the status itself: equal, written the same, and the
same after any commit."""

from __future__ import annotations

import copy
import pickle
from datetime import datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.runs import RunSummary
from controller.core.state import HISTORY_LIMIT, Event, JobStatus, Later, Phase

NOW = datetime(2026, 11, 1, tzinfo=timezone.utc)
texts = st.text(max_size=40)
events = st.builds(Event, at=st.integers(0, 10**6).map(lambda s: NOW + timedelta(seconds=s)), event=texts,
                   attempt=st.integers(0, 50), detail=texts, zone=st.none() | texts,
                   step=st.none() | st.integers(0, 10**17), save_s=st.none() | st.floats(0, 1e6))
runs = st.builds(RunSummary, run=st.from_regex(r"2026[01]\d{3}-\d{6}", fullmatch=True), phase=st.sampled_from(
    ["SUCCEEDED", "FAILED", "CANCELLED"]), message=texts)
statuses = st.builds(JobStatus, phase=st.sampled_from(list(Phase)), message=texts, attempt=st.integers(0, 99),
                     event_count=st.integers(0, 10**6), zone=st.none() | texts,
                     history=st.lists(events, max_size=12).map(tuple), runs=st.lists(runs, max_size=4).map(tuple))


def _joined(raw: bytes, reads: list[int] | None = None) -> JobStatus:
    head, past, lengths = JobStatus.split(raw)

    def read() -> bytes:
        if reads is not None:
            reads.append(1)
        return past
    return JobStatus.joined(head, read, lengths)


@settings(max_examples=150, deadline=None)
@given(statuses, st.lists(events, max_size=3))
def test_a_status_taken_apart_and_joined_is_the_status_it_was_after_any_commit(status, more):
    raw = status.to_json()
    whole, joined = JobStatus.from_json(raw), _joined(raw)
    assert joined == whole and whole == joined
    assert joined.to_json() == whole.to_json()
    assert len(joined.history) == len(whole.history) and bool(joined.runs) == bool(whole.runs)
    assert joined.but(*more).to_json() == whole.but(*more).to_json()
    assert joined.but(*more).added_to(joined) == whole.but(*more).added_to(whole)
    assert joined.model_copy(update={"message": "m"}).to_json() == whole.model_copy(update={"message": "m"}).to_json()
    assert list(reversed(joined.history)) == list(reversed(whole.history))
    assert joined.history[-2:] == whole.history[-2:] and joined.runs + () == whole.runs
    assert copy.deepcopy(joined) == whole and pickle.loads(pickle.dumps(joined)) == whole


def test_what_a_pass_does_not_use_of_a_status_is_never_parsed():
    """Counting, comparing lengths and copying with other changes read no history: a steady job's."""
    status = JobStatus(phase=Phase.RUNNING, attempt=3, event_count=HISTORY_LIMIT,
                       history=tuple(Event(at=NOW, event="running", attempt=3) for _ in range(HISTORY_LIMIT)),
                       runs=(RunSummary(run="20260101-000000", phase="SUCCEEDED"),))
    reads: list[int] = []
    joined = _joined(status.to_json(), reads)
    copied = joined.model_copy(update={"message": "still running"})
    assert isinstance(copied.history, Later) and len(copied.history) == HISTORY_LIMIT and len(copied.runs) == 1
    assert reads == []
    assert copied.to_json() == status.model_copy(update={"message": "still running"}).to_json()
    assert reads == [1], "read once, for both the history and the runs"
