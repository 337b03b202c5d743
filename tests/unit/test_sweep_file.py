"""Sweep files (controller.core.sweep): a grid makes every combination once, random draws the same
trials for the same seed, and every trial's spec is an ordinary job's with its parameters."""

from __future__ import annotations

import pytest
import yaml

from controller.core import sweep
from controller.core.launch import requests_for
from controller.core.spec import SpecError, parse_spec
from controller.core.state import JobStatus, Phase
from controller.service import vmscripts
from controller.service.bootstrap import launch_context
from controller.service.config import REPO_ROOT, Settings
from tests.harness import spec_doc


def parsed(**fields) -> sweep.SweepFile:
    doc = {"name": "lr", "base": spec_doc(), "parameters": {"lr": [1e-4, 3e-4, 1e-3], "batch": [16, 32]}, **fields}
    return sweep.parse_sweep(yaml.safe_dump(doc, sort_keys=False))  # the parameters' order is the file's


def test_a_grid_of_2_by_3_makes_exactly_6_trials_each_combination_once():
    trials = sweep.trials(parsed())
    assert [t.job for t in trials] == [f"lr-{n}" for n in range(1, 7)]
    combos = [(t.params["lr"], t.params["batch"]) for t in trials]
    assert len(set(combos)) == 6 and combos[:2] == [(1e-4, 16), (1e-4, 32)]  # itertools.product, in the order given


def test_a_random_search_with_a_seed_makes_the_same_trials_every_time_and_another_seed_others():
    fields = {"parameters": {"lr": {"min": 1e-5, "max": 1e-2, "log": True}, "layers": {"min": 2, "max": 8, "integer": True},
                             "opt": {"choices": ["adam", "sgd"]}, "batch": [16, 32, 64]}, "count": 20, "seed": 7}
    first, again = sweep.trials(parsed(**fields)), sweep.trials(parsed(**fields))
    other = sweep.trials(parsed(**{**fields, "seed": 8}))
    assert first == again and first != other and len(first) == 20
    for t in first:
        assert 1e-5 <= t.params["lr"] <= 1e-2 and isinstance(t.params["layers"], int) and 2 <= t.params["layers"] <= 8
        assert t.params["opt"] in ("adam", "sgd") and t.params["batch"] in (16, 32, 64)


def test_each_trial_is_an_ordinary_job_with_its_parameters_its_own_checkpoints_and_its_sweep():
    sw = parsed()
    trial = sweep.trials(sw)[3]
    doc = sweep.trial_spec(sw.base, sw, trial)
    spec = parse_spec(yaml.safe_dump(doc), trial.job)
    assert spec.sweep.name == "lr" and spec.sweep.trial == 4 and spec.env == {}
    assert spec.sweep.env == {"RESPAWN_PARAM_LR": "0.0003", "lr": "0.0003", "RESPAWN_PARAM_BATCH": "32", "batch": "32"}
    assert spec.checkpoint.uri == f"{sw.base['checkpoint']['uri']}/lr-4"
    (request,) = requests_for(trial.job, spec, JobStatus(phase=Phase.PROVISIONING, attempt=1, zone=spec.zones[0]),
                              launch_context(Settings(bucket="b", project="p"), vmscripts.load(REPO_ROOT / "deploy" / "vm")))
    assert "export RESPAWN_PARAM_LR=0.0003" in request.metadata["respawn-env"].splitlines()


@pytest.mark.parametrize("fields, named", [
    ({"parameters": {"lr": {"min": 1e-5, "max": 1e-2}}}, "give 'count'"),
    ({"parameters": {"lr": {"min": 1, "max": 0}}, "count": 3}, "swap them"),
    ({"parameters": {"lr": {"min": 0, "max": 1, "log": True}}, "count": 3}, "min > 0"),
    ({"parameters": {"bad-name": [1]}}, "parameters.bad-name"),
    ({"parameters": {"a": list(range(40)), "b": list(range(40))}}, "1,600 trials"),
    ({"max_parallel": 0}, "max_parallel"),
    ({"maxparallel": 2}, "maxparallel"),
    ({"name": "Bad_Name"}, "name"),
    ({"parameters": {"lr": [0.1, float("inf")]}}, "parameters.lr"),  # a record could not hold it
    ({"parameters": {"lr": {"choices": [float("nan")]}}, "count": 2}, "parameters.lr"),
    ({"parameters": {"lr": {"min": -1e308, "max": 1e308}}, "count": 2}, "max - min"),  # a draw would be inf
])
def test_a_bad_sweep_file_is_refused_naming_the_field_and_the_fix(fields, named):
    with pytest.raises(SpecError) as e:
        parsed(**fields)
    assert named in str(e.value), str(e.value)



@pytest.mark.parametrize("params, named", [
    ({"IFS": "x"}, "reserved"),  # each parameter is an environment variable, checked as env's are
    ({"BASH_ENV": "/tmp/x"}, "reserved"),
    ({"lr": "1", "LR": "2"}, "both RESPAWN_PARAM_LR"),
    ({"lr": "a\x00b"}, "NUL"),
])
def test_a_trials_parameters_are_checked_as_environment_variables(params, named):
    with pytest.raises(SpecError) as e:
        parse_spec(yaml.safe_dump(spec_doc(sweep={"name": "lr", "trial": 1, "params": params})), "lr-1")
    assert named in str(e.value) and "sweep.params" in str(e.value)
