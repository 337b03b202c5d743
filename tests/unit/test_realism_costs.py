"""localcloud.realism.costs_from: a file of measurements (what `respawn canary` writes) in place of
the realism model's assumptions, field by field; anything else refused, naming it."""

from __future__ import annotations

import json

import pytest

from localcloud.realism import COSTS, Lognormal, Realism, costs_from


def written(tmp_path, doc) -> str:
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_fields_a_file_names_replace_ours_and_only_those(tmp_path):
    costs = costs_from(written(tmp_path, {"costs": {"insert_running": {"median": 41.5, "p99": 90},
                                                    "delete_done": {"median": 5, "p99": 6}, "notice_s": 120,
                                                    "gcs_page": 500}}))
    assert costs.insert_running == Lognormal(41.5, 90.0) and costs.delete_done == Lognormal(5.0, 6.0)
    assert costs.notice_s == 120.0 and isinstance(costs.notice_s, float) and costs.gcs_page == 500
    assert costs.poweroff_after_marker == COSTS.poweroff_after_marker and costs.sink_delay == COSTS.sink_delay


def test_from_canary_is_the_benchmark_profile_with_the_measured_figures(tmp_path):
    path = written(tmp_path, {"costs": {"insert_running": {"median": 41.5, "p99": 90},
                                        "poweroff_after_marker": {"median": 3.2, "p99": 9.1}}})
    measured, ours = Realism.from_canary(path), Realism.google()
    assert measured.insert_seconds == 41.5 and measured.halt_seconds == Lognormal(3.2, 9.1)
    assert (measured.gcs_latency, measured.rate_quota_per_minute, measured.sink_delay) == \
        (ours.gcs_latency, ours.rate_quota_per_minute, ours.sink_delay)


@pytest.mark.parametrize("doc, named", [
    ({"figures": {}}, 'no "costs" object'),
    ({"costs": {"boot_s": 3}}, "costs.boot_s is not a figure"),
    ({"costs": {"insert_running": 20}}, "costs.insert_running: expected"),
    ({"costs": {"insert_running": {"median": 20, "p99": 10}}}, "p99 >= median"),
    ({"costs": {"insert_running": {"median": -1, "p99": 10}}}, "costs.insert_running"),
    ({"costs": {"notice_s": "30"}}, "costs.notice_s: expected a number"),
    ({"costs": {"gcs_page": 10.5}}, "(whole)"),
    ({"costs": {"notice_s": True}}, "costs.notice_s"),
])
def test_a_file_of_another_shape_is_refused_naming_what(tmp_path, doc, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        costs_from(written(tmp_path, doc))
