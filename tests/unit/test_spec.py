"""The job spec: defaults, durations, and errors that name the field and the fix."""

from __future__ import annotations

from datetime import timedelta

import pytest
import yaml

from controller import names
from controller.durations import format_duration, parse_duration
from controller.policy import ControllerPolicy
from controller.spec import SpecError, parse_spec
from tests.harness import spec_doc


def problems(doc, job: str = "job") -> list[str]:
    raw = doc if isinstance(doc, (str, bytes)) else yaml.safe_dump(doc)
    with pytest.raises(SpecError) as e:
        parse_spec(raw, job)
    return e.value.problems


def test_minimal_spec_gets_sensible_defaults():
    spec = parse_spec(b"zones: [us-central1-a]\nmachine_type: g2-standard-8\ncommand: python t.py\n", "j")
    assert spec.name == "j"
    assert spec.provisioning == "spot"
    assert spec.nodes == 1
    assert spec.policy.max_failures >= 1 and spec.policy.idle_timeout == timedelta(minutes=30)
    assert spec.boot_disk.image_family and spec.boot_disk.image_project


def test_json_is_accepted_too():
    spec = parse_spec(b'{"zones": ["us-central1-a"], "machine_type": "n1", "command": ["python", "a b.py"]}', "j")
    assert spec.command_line == "python 'a b.py'"


@pytest.mark.parametrize(
    "text, seconds",
    [("90s", 90), ("90m", 5400), ("72h", 259200), ("7d", 604800), ("1h30m", 5400), (120, 120), ("45", 45)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == timedelta(seconds=seconds)


def test_durations_round_trip_in_status_json():
    assert format_duration(timedelta(hours=1, minutes=30)) == "1h30m"
    for bad in ("soon", "7x", "-5m", True):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_unknown_field_names_field_and_suggests_the_fix():
    [line] = problems(spec_doc(policy={"max_restart": 3}))
    assert line.startswith("policy.max_restart: unknown field")
    assert "did you mean 'max_restarts'" in line


def test_unknown_top_level_field():
    [line] = problems(spec_doc(zone="us-central1-a"))
    assert line.startswith("zone: unknown field") and "'zones'" in line


def test_malformed_yaml_says_where():
    [line] = problems("zones: [us-central1-a\nmachine_type: x\n")
    assert line.startswith("spec.yaml: not valid YAML or JSON") and "line" in line


def test_wrong_types_each_named():
    lines = problems(spec_doc(nodes="two", zones="us-central1-a", policy={"max_runtime": "forever"}))
    assert any(l.startswith("nodes:") for l in lines)
    assert any(l.startswith("zones:") and "list" in l for l in lines)
    assert any(l.startswith("policy.max_runtime:") and "'7d'" in l for l in lines)


def test_missing_required_fields():
    lines = problems({"zones": ["us-central1-a"]})
    assert "machine_type: required field is missing" in lines
    assert "command: required field is missing" in lines


@pytest.mark.parametrize("job", ["Bad", "9lives", "a_b", "x-", "a" * 51, "../../etc", "a/b"])
def test_hostile_or_invalid_job_names_rejected(job):
    [line] = problems(spec_doc(), job=job)
    assert line.startswith("name:")


def test_name_must_match_the_folder():
    [line] = problems(spec_doc(name="other"), job="mine")
    assert "does not match" in line


def test_longest_job_name_still_makes_valid_instance_names():
    job = "a" * names.MAX_JOB_NAME
    assert names.job_name_problem(job) is None
    assert len(names.instance_name(job, 999_999, 9_999)) <= 63


def test_controller_labels_are_reserved():
    [line] = problems(spec_doc(labels={"respawn-managed": "true"}))
    assert line.startswith("labels:")


def test_not_a_mapping():
    assert problems("- a\n- b\n") == ["spec.yaml: expected a mapping of fields, got list"]


class TestPolicy:
    policy = ControllerPolicy(
        default_project="home-proj",
        allowed_projects=("other-proj",),
        allowed_zones=("us-central1-*",),
        allowed_machine_types=("g2-*",),
        allowed_service_accounts=("trainer@home-proj.iam.gserviceaccount.com",),
        max_nodes=2,
        max_accelerators=4,
    )

    def test_allows_what_is_inside(self):
        spec = parse_spec(yaml.safe_dump(spec_doc(
            service_account={"email": "trainer@home-proj.iam.gserviceaccount.com"})), "j")
        assert self.policy.violations(spec) == []

    def test_each_violation_names_field_and_what_is_allowed(self):
        doc = spec_doc(project="evil-proj", zones=["europe-west4-a"], machine_type="a3-megagpu-8g",
                       nodes=3, accelerators={"type": "nvidia-h100-80gb", "count": 8})
        lines = self.policy.violations(parse_spec(yaml.safe_dump(doc), "j"))
        fields = [l.split(":")[0] for l in lines]
        assert fields == ["project", "zones.0", "machine_type", "service_account.email", "nodes", "accelerators.count"]
        assert "allowed: us-central1-*" in lines[1]
