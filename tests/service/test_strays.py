"""VM records under names with neither spec nor status (issue 22, item 24).

Anything that can write a VM record (every trainer) can write them for jobs that do not
exist, and every tick lists them all. Such strays are deleted once older than the grace
period (GCS's ``updated``), by generation, a bounded number per pass, oldest first, never
read, and never a spec, cancel or status object.
"""

from __future__ import annotations

import json

from controller.core import names
from controller.core.planner import STRAY_GRACE
from controller.service import observe
from tests.harness import BUCKET, Harness


def junk(h: Harness, job: str) -> list[str]:
    keys = [names.marker_key(job), names.exit_key(job), names.heartbeat_key(job), names.node_exit_key(job, 3)]
    for key in keys:
        h.store.put(BUCKET, key, json.dumps({"attempt": 1, "exit_code": 0, "token": "whatever"}))
    return keys


def left(h: Harness, keys: list[str]) -> list[str]:
    return [k for k in keys if h.store.exists(BUCKET, k)]


def test_records_of_a_name_with_neither_spec_nor_status_are_deleted_after_the_grace(h):
    keys = junk(h, "ghost")
    h.cancel("ghost")  # a user's object: never touched
    h.tick()
    assert left(h, keys) == keys, "deleted within the grace period"
    h.advance(seconds=STRAY_GRACE.total_seconds() + 1)
    h.store.calls.clear()
    h.tick()
    assert left(h, keys) == []
    assert h.store.exists(BUCKET, names.cancel_key("ghost"))
    assert not [c for c in h.store.calls if c[0] == "read" and "ghost" in c[1]], "judged on its listing, never read"


def test_a_stray_rewritten_after_the_listing_is_not_deleted(h):
    keys = junk(h, "ghost")
    h.advance(seconds=STRAY_GRACE.total_seconds() + 1)
    engine = h.engine()
    view = engine.observer.world().jobs["ghost"]
    h.store.put(BUCKET, names.heartbeat_key("ghost"), b'{"attempt": 2}')  # a VM beats again
    engine.executor.apply(view, engine.plan(view)[1], h.clock.now())
    assert left(h, keys) == [names.heartbeat_key("ghost")], "deleted by generation: the new one stays"


def test_a_stray_whose_status_appears_before_the_delete_is_spared(h):
    keys = junk(h, "ghost")
    h.advance(seconds=STRAY_GRACE.total_seconds() + 1)
    engine = h.engine()
    view = engine.observer.world().jobs["ghost"]
    h.store.put(BUCKET, names.status_key("ghost"), "{}")
    engine.executor.apply(view, engine.plan(view)[1], h.clock.now())
    assert left(h, keys) == keys


def test_a_flood_of_strays_costs_a_bounded_number_of_deletes_per_pass_oldest_first(h):
    count = observe.MAX_STRAYS * 2 + 7
    for i in range(count):
        h.store.put(BUCKET, names.heartbeat_key(f"junk{i}"), "{}")
        h.advance(seconds=1)
    h.submit("ok")
    h.advance(seconds=STRAY_GRACE.total_seconds() + 1)
    h.store.calls.clear()
    h.tick()
    deleted = [c[1] for c in h.store.calls if c[0] == "delete"]
    assert len(deleted) == observe.MAX_STRAYS
    assert deleted and set(deleted) == {names.heartbeat_key(f"junk{i}") for i in range(observe.MAX_STRAYS)}
    assert h.live() == ["ok-1"], "the real job goes on"
    h.tick()
    h.tick()
    assert h.store.list(BUCKET, "jobs/junk") == [], "three passes: 500, 500, then the last 7"


def test_the_event_for_a_stray_name_cleans_up_only_that_name(h):
    ghost, other = junk(h, "ghost"), junk(h, "other")
    h.advance(seconds=STRAY_GRACE.total_seconds() + 1)
    h.tick("ghost")
    assert left(h, ghost) == [] and left(h, other) == other
