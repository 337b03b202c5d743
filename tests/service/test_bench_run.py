"""``make bench`` is one run, one record (bench/run.py, bench/__main__.py): every key of
bench/results.json written by one run with its provenance; a scenario run alone goes to a file of its
own; nothing is merged into results.json from elsewhere. Over tiny scenarios of the test's own."""

from __future__ import annotations

import json
import subprocess

import pytest

import bench.__main__ as bench
from bench import run


def _scenarios(*pairs):
    return [bench.Scenario(name, measure, f"the test's {name}") for name, measure in pairs]


@pytest.fixture
def outputs(tmp_path, monkeypatch):
    """results.json and bench/runs/ in the test's own folder."""
    results, runs = tmp_path / "results.json", tmp_path / "runs"
    monkeypatch.setattr(run, "RESULTS", results)
    monkeypatch.setattr(bench, "RESULTS", results)
    monkeypatch.setattr(run, "RUNS", runs)
    return results, runs


def test_make_bench_writes_every_key_in_one_run_with_its_provenance(outputs, monkeypatch):
    results, runs = outputs
    monkeypatch.setattr(bench, "SCENARIOS", _scenarios(
        ("one", lambda r: {"a_s": 1.0, "a_s_target": run.target(1.0, at_most=2), "rows": [("a", "1 s", "")]}),
        ("two", lambda r: {"b_refusals": 3, "b_refusals_target": run.target(3, equals=0), "seen_seed": r.seed})))
    assert bench.main(["--seed", "7"]) == 0
    written = json.loads(results.read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=run.ROOT, capture_output=True, text=True).stdout.strip()
    assert written["commit"] == head and isinstance(written["dirty"], bool)
    assert written["started_at"].endswith("Z") and written["finished_at"] >= written["started_at"]
    assert written["seeds"] == {"one": 7, "two": 7} and written["seen_seed"] == 7
    assert written["machine"]["cpus"] >= 1 and written["machine"]["python"].startswith("CPython")
    assert set(written["scenarios"]) == {"one", "two"}
    assert all(s["wall_s"] >= 0 and len(s["load_avg_1m"]) == 2 for s in written["scenarios"].values())
    assert written["targets"] == {"met": ["a_s"], "missed": ["b_refusals"]}
    assert written["a_s"] == 1.0 and written["b_refusals"] == 3 and "rows" not in written
    assert not runs.exists()


def test_a_scenario_run_alone_goes_to_its_own_file_never_into_results(outputs, monkeypatch):
    results, runs = outputs
    results.write_text('{"a_s": 1.0}\n')
    monkeypatch.setattr(bench, "SCENARIOS", _scenarios(("one", lambda r: {"a_s": 9.0}), ("two", lambda r: {"b": 1})))
    assert bench.main(["--only", "one"]) == 0
    assert results.read_text() == '{"a_s": 1.0}\n'
    (alone,) = runs.glob("one-*.json")
    written = json.loads(alone.read_text())
    assert written["a_s"] == 9.0 and "b" not in written and set(written["scenarios"]) == {"one"}
    assert written["commit"] and written["seeds"] == {"one": 1}
    with pytest.raises(SystemExit):
        bench.main(["--only", "one", "--out", str(results)])
    with pytest.raises(ValueError, match="make bench alone"):
        run.alone("one", {"a_s": 9.0}, run.provenance(), 1.0, out=results)


def test_a_key_written_by_two_scenarios_fails_the_run_and_writes_nothing(outputs, monkeypatch):
    results, runs = outputs
    monkeypatch.setattr(bench, "SCENARIOS", _scenarios(("one", lambda r: {"a_s": 1.0}), ("two", lambda r: {"a_s": 2.0})))
    with pytest.raises(RuntimeError, match=r"two writes keys another scenario wrote: \['a_s'\]"):
        bench.main([])
    assert not results.exists() and not runs.exists()


def test_a_failed_scenario_leaves_results_as_they_were_and_keeps_what_was_measured(outputs, monkeypatch):
    results, runs = outputs
    results.write_text('{"a_s": 1.0}\n')

    def broken(r):
        raise OSError("the local cloud did not start")

    monkeypatch.setattr(bench, "SCENARIOS", _scenarios(("one", lambda r: {"a_s": 5.0}), ("two", broken)))
    with pytest.raises(OSError):
        bench.main([])
    assert results.read_text() == '{"a_s": 1.0}\n'
    (kept,) = runs.glob("incomplete-*.json")
    written = json.loads(kept.read_text())
    assert written["incomplete"] and written["a_s"] == 5.0
    assert written["scenarios"]["two"]["failed"] == "OSError: the local cloud did not start"


def test_the_work_tree_is_dirty_for_code_not_for_the_bench_s_own_outputs(tmp_path, monkeypatch):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "bench").mkdir()
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "bench" / "results.json").write_text("{}\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    monkeypatch.setattr(run, "ROOT", tmp_path)
    assert run.dirty_paths() == [] and run.provenance()["dirty"] is False
    (tmp_path / "bench" / "results.json").write_text('{"a": 1}\n')  # a run's own output
    (tmp_path / "bench" / "runs").mkdir()
    (tmp_path / "bench" / "runs" / "one-x.json").write_text("{}\n")
    assert run.dirty_paths() == []
    (tmp_path / "code.py").write_text("x = 2\n")
    (tmp_path / "new.py").write_text("")
    assert sorted(run.dirty_paths()) == ["code.py", "new.py"]
    head = run.provenance()
    assert head["dirty"] is True and sorted(head["dirty_paths"]) == ["code.py", "new.py"]


def test_every_registered_scenario_is_a_function_of_the_run_with_a_name_of_its_own():
    import importlib
    import inspect

    names = [s.name for s in bench.SCENARIOS]
    assert len(names) == len(set(names))
    for scenario in bench.SCENARIOS:
        measure = scenario.measure
        if isinstance(measure, str):
            module, _, function = measure.partition(":")
            measure = getattr(importlib.import_module(module), function)
        assert list(inspect.signature(measure).parameters) == ["run"], scenario.name


def test_a_target_beside_no_figure_is_refused():
    with pytest.raises(ValueError, match="cold_start_target: a target beside no figure"):
        run.targets({"cold_start_s": 4.0, "cold_start_target": run.target(4.0, at_most=3)})
