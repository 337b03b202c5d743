"""Run ids (controller.core.runs): when a run began, unique among the job's runs."""

from __future__ import annotations

from datetime import UTC, datetime

from controller.core.runs import checkpoint_root, fresh_root, run_id, unique_id

BEGAN = datetime(2026, 11, 27, 19, 17, 42, 500000, tzinfo=UTC)


def test_a_run_id_is_the_second_it_began():
    assert run_id(BEGAN) == "20261127-191742"


def test_a_run_begun_in_the_same_second_as_an_earlier_one_gets_its_own_id():
    assert unique_id(BEGAN, set()) == "20261127-191742"
    assert unique_id(BEGAN, {"20261127-191742", None}) == "20261127-191742-2"
    assert unique_id(BEGAN, {"20261127-191742", "20261127-191742-2"}) == "20261127-191742-3"


def test_a_fresh_prefix_is_under_the_specs_and_followed_only_while_it_is():
    own = fresh_root("gs://b/ckpt/", "j", "20261127-191742")
    assert own == "gs://b/ckpt/runs/j/20261127-191742/"
    assert checkpoint_root("gs://b/ckpt", own) == own
    assert checkpoint_root("gs://b/other", own) == "gs://b/other"  # the spec moved its checkpoints
    assert checkpoint_root("gs://b/ckpt", None) == "gs://b/ckpt"
    assert checkpoint_root("gs://b/ck", own) == "gs://b/ck"  # a prefix of the name is not a parent
