"""The local Compute's list filters, as compute.v1's ``filter`` reference describes them."""

from __future__ import annotations

import pytest

from controller.adapters.compute import MANAGED_FILTER, shard_filter
from controller.core import names
from localcloud.filters import FilterError, compile_filter


def vm(**labels: str) -> dict:
    return {"name": "x-1", "labels": labels}


def test_the_shard_filter_selects_the_label_s_last_digits_and_never_a_vm_without_it():
    job = "llm"
    label = names.shard_label(job)
    for k in (2, 4, 256):
        expr = shard_filter(names.shard_of(job, k), k)
        assert compile_filter(expr)(vm(**{names.SHARD_LABEL: label}))
        assert not compile_filter(shard_filter((names.shard_of(job, k) + 1) % k, k))(vm(**{names.SHARD_LABEL: label}))
        assert not compile_filter(expr)(vm(**{"respawn-managed": "true"}))
    assert shard_filter(0, 1) is None


@pytest.mark.parametrize("text", [
    f"({MANAGED_FILTER}) ({shard_filter(1, 4)})",
    "(labels.a = \"1\") AND (name eq 'x-.*')",
])
def test_a_filter_mixing_regular_expressions_and_comparisons_is_refused_as_compute_refuses_it(text):
    with pytest.raises(FilterError, match="cannot be mixed"):
        compile_filter(text)


def test_regular_expressions_alone_on_several_fields_are_taken_as_the_reference_s_own_example():
    assert compile_filter("(name eq 'x-.*') (labels.a ne '2')")(vm(a="1"))
