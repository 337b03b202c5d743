"""The job spec: defaults, durations, errors that name the field and the fix, hostile input."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
import yaml

from controller.core import names
from controller.core import spec as spec_module
from controller.core.durations import MAX_DAYS, format_duration, parse_duration
from controller.core.spec import MAX_SPEC_BYTES, RESERVED_ENV, JobPolicy, SpecError, built_in_gpus, parse_spec
from tests.harness import spec_doc


def doc(**overrides: Any) -> dict[str, Any]:
    """A valid spec document (the harness's, without GPUs added to a machine type that has them)."""
    out = spec_doc(**overrides)
    if "accelerators" not in overrides and built_in_gpus(out["machine_type"]):
        out.pop("accelerators", None)
    return out


def problems(spec: Any, job: str = "job") -> list[str]:
    raw = spec if isinstance(spec, (str, bytes)) else yaml.safe_dump(spec)
    with pytest.raises(SpecError) as e:
        parse_spec(raw, job)
    return e.value.problems


def test_minimal_spec_gets_sensible_defaults():
    spec = parse_spec(b"zones: [us-central1-a]\nmachine_type: g2-standard-8\ncommand: python t.py\n", "j")
    assert spec.name == "j"
    assert spec.provisioning == ("spot",)
    assert spec.nodes == 1
    assert spec.policy.max_failures >= 1 and spec.policy.idle_timeout == timedelta(minutes=30)
    assert spec.boot_disk.image_family and spec.boot_disk.image_project
    assert spec.service_account.email is None  # the controller's trainer account, filled in by the policy
    assert spec.gpus_per_node == ("nvidia-l4", 1)


def test_the_harness_spec_is_valid():
    assert parse_spec(yaml.safe_dump(doc()), "job").zones == ("us-central1-a", "us-central1-b")


def test_json_is_accepted_too():
    spec = parse_spec(b'{"zones": ["us-central1-a"], "machine_type": "n1", "command": ["python", "a b.py"]}', "j")
    assert spec.command_line == "python 'a b.py'"


@pytest.mark.parametrize(
    "text, seconds",
    [("90s", 90), ("90m", 5400), ("72h", 259200), ("7d", 604800), ("1h30m", 5400), (120, 120), ("45", 45),
     ("1.5h", 5400), (f"{MAX_DAYS}d", MAX_DAYS * 86400), (0, 0)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == timedelta(seconds=seconds)


def test_durations_round_trip_in_status_json():
    assert format_duration(timedelta(hours=1, minutes=30)) == "1h30m"


@pytest.mark.parametrize("bad", ["soon", "7x", "-5m", True, -1, float("inf"), float("-inf"), float("nan"), 1e300,
                                 10**400, "99999999999999d", "1e300", f"{MAX_DAYS + 1}d", "9" * 100, None, [1]])
def test_bad_durations_are_value_errors_never_overflow(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


@pytest.mark.parametrize("value", ["99999999999999d", 1.0e300, float("inf"), float("nan"), -5, "-5m", 10**400])
def test_bad_duration_in_a_spec_names_the_field(value):
    [line] = problems(doc(policy={"max_runtime": value}))
    assert line.startswith("policy.max_runtime: ")


def test_unknown_field_names_field_and_suggests_the_fix():
    [line] = problems(doc(policy={"max_restart": 3}))
    assert line.startswith("policy.max_restart: unknown field")
    assert "did you mean 'max_restarts'" in line


def test_unknown_top_level_field():
    [line] = problems(doc(zone="us-central1-a"))
    assert line.startswith("zone: unknown field") and "'zones'" in line


def hint(line: str) -> str:
    """What a problem line offers: the text between 'did you mean' and 'accepted:'."""
    return line.split("; ", 1)[1].split(" accepted:")[0]


@pytest.mark.parametrize("overrides, field, offered", [
    ({"max_restart": 3}, "max_restart", "did you mean 'policy.max_restarts'?"),  # a nested field, typed at the top
    ({"max_restarts": 3}, "max_restarts", "did you mean 'policy.max_restarts'?"),  # right name, wrong level
    ({"idle_timout": "5m"}, "idle_timout", "did you mean 'policy.idle_timeout'?"),
    ({"uri": "gs://b/c"}, "uri", "did you mean 'checkpoint.uri'?"),
    ({"policy": {"initial": "1m"}}, "policy.initial", "did you mean 'policy.backoff.initial'?"),  # two levels down
])
def test_a_typo_of_a_field_at_another_level_names_its_full_path(overrides, field, offered):
    [line] = problems(doc(**overrides))
    assert line.startswith(f"{field}: unknown field")
    assert hint(line) == offered


def test_a_top_level_field_given_inside_a_nested_one_is_pointed_back_up():
    [line] = problems(doc(policy={"zones": ["us-central1-a"]}))
    assert line.startswith("policy.zones: unknown field")
    assert hint(line) == "did you mean 'zones' at the top level?"
    assert line.endswith("accepted: " + ", ".join(sorted(JobPolicy.model_fields)))  # still this level's fields


def test_the_current_levels_suggestion_comes_first_and_alone_when_it_is_the_closest():
    [line] = problems(doc(policy={"max_restart": 3}))
    assert hint(line) == "did you mean 'max_restarts'?"  # not policy.max_failures, nor anything elsewhere
    [line] = problems(doc(tpu={"type": "v4-8", "runtime_version": "tpu-ubuntu2204-base", "queue": True}))
    assert hint(line) == "did you mean 'queued'?"
    [line] = problems(doc(typ="v4-8"))  # 'tpu' is here; 'type' fields elsewhere are closer
    assert hint(line).startswith("did you mean 'tpu', ") and "'accelerators.type'" in hint(line)


@pytest.mark.parametrize("overrides, field", [
    ({"xyzzy": 1}, "xyzzy"),
    ({"policy": {"quux_frobnicate": 1}}, "policy.quux_frobnicate"),
    ({"network": {"zzz": True}}, "network.zzz"),
])
def test_a_typo_close_to_no_field_anywhere_suggests_nothing(overrides, field):
    [line] = problems(doc(**overrides))
    assert line.startswith(f"{field}: unknown field; accepted: ")
    assert "did you mean" not in line


def test_malformed_yaml_says_where():
    [line] = problems("zones: [us-central1-a\nmachine_type: x\n")
    assert line.startswith("spec.yaml: not valid YAML or JSON") and "line" in line


def test_wrong_types_each_named():
    lines = problems(doc(nodes="two", zones="us-central1-a", policy={"max_runtime": "forever"}))
    assert any(l.startswith("nodes:") for l in lines)
    assert any(l.startswith("zones:") and "list" in l for l in lines)
    assert any(l.startswith("policy.max_runtime:") and "'7d'" in l for l in lines)


def test_missing_required_fields():
    lines = problems({"zones": ["us-central1-a"]})
    assert "machine_type: required field is missing" in lines
    assert any(line.startswith("command: required: the bash line") and "'image'" in line for line in lines), lines


@pytest.mark.parametrize("job", ["Bad", "9lives", "a_b", "x-", "a" * 51, "../../etc", "a/b", "a\nb", "x" * 5000])
def test_hostile_or_invalid_job_names_rejected(job):
    [line] = problems(doc(), job=job)
    assert line.startswith("name:") and "\n" not in line and len(line) < 500


def test_name_must_match_the_folder():
    [line] = problems(doc(name="other"), job="mine")
    assert "does not match" in line


def test_longest_job_name_still_makes_valid_instance_names():
    job = "a" * names.MAX_JOB_NAME
    assert names.job_name_problem(job) is None
    assert len(names.instance_name(job, 999_999, 9_999)) <= 63


def test_controller_labels_are_reserved():
    [line] = problems(doc(labels={"respawn-managed": "true"}))
    assert line.startswith("labels:")


def test_not_a_mapping():
    assert problems("- a\n- b\n") == ["spec.yaml: expected a mapping of fields, got list"]


def test_empty_file():
    assert problems("") == ["spec.yaml: expected a mapping of fields, got nothing (the file is empty)"]


# -- hostile documents: SpecError naming spec.yaml, never another exception --------------------

_LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi")
)


@pytest.mark.parametrize(
    "raw, says",
    [
        ("x: " + "y" * MAX_SPEC_BYTES, f"{MAX_SPEC_BYTES // 1024} KiB"),
        (b"\x00" * (MAX_SPEC_BYTES + 1), "KiB"),
        (_LAUGHS, "alias"),
        ("a: &a [*a]\n", "alias"),
        ("a: &a {b: *a}\n", "alias"),
        ("nodes: " + "9" * 5000, "could not be read"),
        ("a: !!python/object/apply:os.system [echo hi]", "not valid YAML"),
        (b"\xff\xfe\x00\xd8", "not valid"),
        (b"\x80\x81", "not valid"),
        ("a: \x07", "not valid"),
        ("a: \ud800", "UTF-8"),
        ("---\na: 1\n---\nb: 2\n", "single document"),
        ("zones: !!set {a, b}", "set"),
        ("zones: [a]\nzones: [b]\n", "twice"),
        ("{[1, 2]: 3}", "not valid"),
        ("a: 2001-13-45 25:61:61", "spec"),
    ],
)
def test_hostile_documents_are_spec_errors(raw, says):
    lines = problems(raw)
    assert says in " ".join(lines)
    assert all("\n" not in line and len(line) < 1000 for line in lines)


class _Libyaml026Loader(spec_module._PythonLoader):
    """What libyaml 0.2.6's scanner does past 1,000 levels, whichever libyaml is installed here."""

    def fetch_flow_collection_start(self, token_class):
        if self.flow_level >= 1000:
            mark = self.get_mark()
            raise yaml.scanner.ScannerError("while increasing flow level", mark, "exceeded maximum nesting depth", mark)
        super().fetch_flow_collection_start(token_class)


_DEEP = [
    "[" * 100_000,
    '{"a": ' * 40_000,
    "- " * 100_000 + "x",
    "a:\n" + "".join(" " * i + "b:\n" for i in range(1, 200)),
    json.dumps(spec_doc()).replace('"python train.py"', "[" * 5000 + "]" * 5000),  # deep JSON
    "command: " + "[" * 33 + "x" + "]" * 33,  # just past the bound
]


@pytest.mark.parametrize("loader", ["installed", "python", "libyaml-0.2.6"])
@pytest.mark.parametrize("raw", _DEEP, ids=["flow", "json-objects", "block", "indented", "deep-json", "33"])
def test_deep_documents_get_respawns_message_from_every_parser(monkeypatch, loader, raw):
    """libyaml 0.2.5 and PyYAML's own parser leave the bound to respawn's composer; libyaml 0.2.6
    refuses past 1,000 levels itself. The user reads the same line, naming the limit, either way."""
    if loader != "installed":
        monkeypatch.setattr(spec_module, "_BoundedLoader",
                            spec_module._PythonLoader if loader == "python" else _Libyaml026Loader)
    [line] = problems(raw)
    assert line.startswith(f"spec.yaml: nested more than {spec_module.MAX_DEPTH} levels deep at line ")
    assert "\n" not in line and len(line) < 300


def test_the_emulated_libyaml_refusal_is_what_the_installed_one_says_when_it_refuses():
    """Keeps _Libyaml026Loader honest: where libyaml >= 0.2.6 is installed, it raises the same error."""
    # The lock's PyYAML wheels bring libyaml on every platform it covers: a PyYAML without it
    # was not installed from the lock.
    assert yaml.__with_libyaml__, "PyYAML without libyaml: install the lock (make install)"
    try:
        for _ in yaml.parse("[" * 2000, Loader=yaml.CSafeLoader):  # events only: libyaml's composer is not run
            pass
    except yaml.scanner.ScannerError as e:
        assert (e.context, e.problem) == ("while increasing flow level", "exceeded maximum nesting depth")
    else:
        from yaml._yaml import get_version_string
        assert get_version_string() < "0.2.6", "libyaml 0.2.6 and later refuse this document"


def test_a_spec_within_the_bound_is_read_by_every_parser(monkeypatch):
    raw = yaml.safe_dump(doc(env={"A": "b"}))
    for loader in (spec_module._PythonLoader, _Libyaml026Loader, spec_module._BoundedLoader):
        monkeypatch.setattr(spec_module, "_BoundedLoader", loader)
        assert parse_spec(raw, "job").env == {"A": "b"}


def test_aliases_within_bounds_are_fine():
    raw = "zones: &z [us-central1-a]\nmachine_type: n1-standard-8\ncommand: x\npolicy: {<<: {max_restarts: 3}}\n"
    assert parse_spec(raw, "j").policy.max_restarts == 3


def test_many_problems_are_capped_with_a_count():
    lines = problems(doc(zones=[f"BAD{i}" for i in range(60)]))
    assert len(lines) == 21 and lines[-1].startswith("spec.yaml: ") and "more problems" in lines[-1]


def test_odd_keys_stay_on_one_line_and_start_with_their_path():
    lines = problems({**doc(), "a\nb": 1, 7: 2})
    assert all("\n" not in line for line in lines)
    assert any(line.startswith("'a\\nb': unknown field") for line in lines)
    assert any(line.startswith("7: ") for line in lines)


def test_huge_values_are_shown_clipped():
    [line] = problems(doc(machine_type="X" * 100_000))
    assert line.startswith("machine_type: ") and len(line) < 500


@pytest.mark.parametrize("field, value", [("nodes", 10**300), ("nodes", 1001), ("nodes", float("inf")),
                                          ("policy", {"max_restarts": 10**30}), ("nodes", -1)])
def test_numbers_are_bounded(field, value):
    [line] = problems(doc(**{field: value}))
    assert line.startswith(field)


# -- env: reserved names, bounded sizes ------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(RESERVED_ENV))
def test_env_names_the_vm_agent_owns_are_reserved(name):
    [line] = problems(doc(env={name: "x"}))
    assert line.startswith(f"env.{name}: reserved: ") and line.endswith("; rename the variable")


def test_env_node_rank_message():
    expected = "env.NODE_RANK: reserved: the VM agent sets it; rename the variable"
    assert problems(doc(env={"NODE_RANK": "3"})) == [expected]


def test_env_respawn_prefix_is_reserved():
    [line] = problems(doc(env={"RESPAWN_BUCKET": "mine"}))
    assert line.startswith("env.RESPAWN_BUCKET: reserved:") and "RESPAWN_" in line


def test_env_values_are_bounded():
    lines = problems(doc(env={"BIG": "x" * 40_000, "NUL": "a\x00b"}))
    assert any(l.startswith("env.BIG:") and "KiB" in l for l in lines)
    assert any(l.startswith("env.NUL:") and "NUL" in l for l in lines)


def test_env_in_all_is_bounded_as_metadata_is():
    [line] = problems(doc(env={f"V{i}": "'" * 12_000 for i in range(3)}))
    assert line.startswith("env: ") and "metadata" in line


def test_ordinary_env_is_fine():
    assert parse_spec(yaml.safe_dump(doc(env={"WANDB_MODE": "offline", "RESUME": "x"})), "j").env["RESUME"] == "x"


def test_command_is_bounded_and_has_no_nul():
    assert problems(doc(command="x" * 70_000))[0].startswith("command: ")
    assert problems(doc(command=["a", "b\x00"]))[0].startswith("command: ")
    assert problems(doc(command=[]))[0] == "command: must not be empty"
    assert problems(doc(command=["python", 3]))[0] == "command: argument 1 is not text; quote it"


def test_idle_timeout_must_outlast_the_heartbeat():
    [line] = problems(doc(heartbeat_interval="10m", policy={"idle_timeout": "5m"}))
    assert line.startswith("policy.idle_timeout: ") and "heartbeat_interval" in line


def test_service_account_email_is_optional_but_checked():
    spec = parse_spec(yaml.safe_dump(doc(service_account={"scopes": ["cloud-platform"]})), "j")
    assert spec.service_account.email is None
    [line] = problems(doc(service_account={"email": "not an email"}))
    assert line.startswith("service_account.email: ")


# -- machine types with GPUs built in ---------------------------------------------------------------

@pytest.mark.parametrize(
    "machine, gpus",
    [("a3-highgpu-8g", ("nvidia-h100-80gb", 8)), ("a3-highgpu-1g", ("nvidia-h100-80gb", 1)),
     ("a3-megagpu-8g", ("nvidia-h100-mega-80gb", 8)), ("a3-edgegpu-8g", ("nvidia-h100-80gb", 8)),
     ("a3-ultragpu-8g", ("nvidia-h200-141gb", 8)), ("a2-megagpu-16g", ("nvidia-tesla-a100", 16)),
     ("a2-highgpu-4g", ("nvidia-tesla-a100", 4)), ("a2-ultragpu-2g", ("nvidia-a100-80gb", 2)),
     ("a4-highgpu-8g", ("nvidia-b200", 8)), ("a4x-highgpu-4g", ("nvidia-gb200", 4)),
     ("g2-standard-4", ("nvidia-l4", 1)), ("g2-standard-24", ("nvidia-l4", 2)), ("g2-standard-96", ("nvidia-l4", 8)),
     ("a3-highgpu-8g-nolssd", ("nvidia-h100-80gb", 8)), ("a4-highgpu-8g-lowmem", ("nvidia-b200", 8)),
     ("a9-highgpu-8g", ("built-in", 8)), ("n1-standard-8", None), ("e2-medium", None), ("g2", None)],
)
def test_built_in_gpus(machine, gpus):
    assert built_in_gpus(machine) == gpus


def test_accelerators_on_a_machine_type_with_built_in_gpus_are_refused():
    [line] = problems(doc(machine_type="a3-highgpu-8g", accelerators={"type": "nvidia-h100-80gb", "count": 8}))
    assert line.startswith("accelerators: ") and "8 nvidia-h100-80gb" in line and "remove 'accelerators'" in line


def test_accelerators_on_n1_are_fine():
    t4 = {"type": "nvidia-tesla-t4", "count": 2}
    spec = parse_spec(yaml.safe_dump(doc(machine_type="n1-standard-8", accelerators=t4, nodes=3)), "j")
    assert spec.gpus_per_node == ("nvidia-tesla-t4", 2) and spec.total_gpus == 6


def test_a_heartbeat_interval_the_default_idle_timeout_cannot_honour_is_refused():
    # Regression: the check ran only when 'policy' was given, so 2h beats with the
    # default 30m idle_timeout made every attempt look hung.
    with pytest.raises(SpecError) as e:
        parse_spec("zones: [us-central1-a]\nmachine_type: n1-standard-8\ncommand: x\nheartbeat_interval: 2h\n", "j")
    assert e.value.problems[0].startswith("policy.idle_timeout:")


@pytest.mark.parametrize("name", ["respawn_keys", "IFS", "_", "PS4", "SHELLOPTS", "BASHOPTS", "BASH_ENV", "BASH_XTRACEFD"])
def test_env_names_bash_or_the_agents_launcher_would_drop_or_refuse_are_refused(name):
    with pytest.raises(SpecError) as e:
        parse_spec(yaml.safe_dump({"zones": ["us-central1-a"], "machine_type": "n1-standard-8", "command": "x",
                                   "env": {name: "v"}}), "j")
    assert e.value.problems[0].startswith(f"env.{name}:")


def test_idle_timeout_leaves_a_heartbeat_room_to_arrive():
    with pytest.raises(SpecError) as e:
        parse_spec(yaml.safe_dump({"zones": ["us-central1-a"], "machine_type": "n1-standard-8", "command": "x",
                                   "heartbeat_interval": "90s", "policy": {"idle_timeout": "91s"}}), "j")
    assert e.value.problems[0].startswith("policy.idle_timeout:")


@pytest.mark.parametrize("checkpoint, expected", [
    ({"format": "custom"}, "checkpoint.pattern: format 'custom' needs a pattern"),
    ({"format": "custom", "pattern": "run/{step}/"}, "checkpoint.marker: a directory pattern needs one completion rule"),
    ({"format": "custom", "pattern": "run/step/", "marker": "DONE"}, "checkpoint.pattern: must hold '{step}' exactly once"),
    ({"format": "custom", "pattern": "../{step}/", "marker": "DONE"}, "checkpoint.pattern: must be relative"),
    ({"format": "custom", "pattern": "c-{step}.pt", "marker": "DONE"}, "checkpoint.marker: a pattern without a trailing '/'"),
    ({"format": "auto", "pattern": "run/{step}/"}, "checkpoint.pattern: only for 'format: custom'"),
    ({"format": "deepspeed", "same_files": True}, "checkpoint.same_files: only for 'format: custom'"),
    ({"format": "megatorn"}, "checkpoint.format: "),
])
def test_invalid_checkpoint_rules_are_refused_naming_the_field(checkpoint, expected):
    found = problems(doc(checkpoint={"uri": "gs://bkt/ck", **checkpoint}))
    assert any(p.startswith(expected) for p in found), found


def test_custom_checkpoint_rule_is_compiled():
    spec = parse_spec(yaml.safe_dump(doc(checkpoint={"uri": "gs://bkt/ck", "format": "custom",
                                                     "pattern": "run/step-{step}/", "marker": "COMMITTED"})), "job")
    rule = spec.checkpoint.rule
    assert rule and rule.directory and rule.marker == "COMMITTED" and rule.regex.match("run/step-12/x").group(1) == "12"
    assert parse_spec(yaml.safe_dump(doc(checkpoint={"uri": "gs://bkt/ck", "format": "deepspeed"})), "job").checkpoint.rule is None


# -- TPU jobs ------------------------------------------------------------------------------

TPU = {"type": "v5litepod-8", "runtime_version": "v2-alpha-tpuv5-lite"}


def tpu_doc(**overrides: Any) -> dict[str, Any]:
    out = {"zones": ["us-central2-b"], "command": "python train.py", "tpu": TPU}
    out.update(overrides)
    return out


def test_a_tpu_spec_needs_no_machine_type_and_is_placed_in_the_zones_order():
    spec = parse_spec(yaml.safe_dump(tpu_doc(tpu={**TPU, "queued": True})), "j")
    assert spec.machine_type is None and spec.tpu is not None and spec.tpu.queued and spec.tpu.size == 8
    assert spec.placement_for("spot") == "ordered" and spec.gpus_per_node is None
    assert spec.policy.maintenance_timeout == timedelta(hours=1)


@pytest.mark.parametrize("overrides, line", [
    ({"machine_type": "n1-standard-8"}, "machine_type: not with 'tpu' (the TPU's type sets its hosts); remove it"),
    ({"accelerators": {"type": "nvidia-l4"}}, "accelerators: not with 'tpu'"),
    ({"nodes": 4}, "nodes: a TPU slice is one node"),
    ({"provisioning": ["spot", "flex-start"], "policy": {"max_run_duration": "1d"}},
     "provisioning: flex-start is for Compute Engine VMs"),
    ({"placement": "capacity"}, "placement: capacity advice covers Compute Engine VMs, not TPUs"),
    ({"tpu": {**TPU, "type": "v5lite"}}, "tpu.type: not a TPU accelerator type"),
    ({"tpu": {**TPU, "type": "tpu-v4-32; rm -rf /"}}, "tpu.type: not a TPU accelerator type"),
    ({"tpu": {**TPU, "runtime_version": "V2 Alpha"}}, "tpu.runtime_version:"),
    ({"tpu": {**TPU, "queue": True}}, "tpu.queue: unknown field; did you mean 'queued'?"),
    ({"tpu": {"type": "v4-8"}}, "tpu.runtime_version: required with tpu.type"),
])
def test_invalid_tpu_combinations_name_the_field_and_the_fix(overrides, line):
    found = problems(tpu_doc(**overrides))
    assert any(p.startswith(line) for p in found), found


def test_neither_a_machine_type_nor_a_tpu_says_which_to_give():
    assert problems({"zones": ["us-central1-a"], "command": "x"}) == [
        "machine_type: required: a Compute Engine machine type (e.g. g2-standard-8), "
        "or a 'tpu' block (type, runtime_version) for a Cloud TPU VM"]


def test_a_local_code_path_in_the_bucket_names_the_field_and_the_fix():
    """Only the CLI packs a local folder: a spec dropped into the bucket with one is refused, saying how."""
    [line] = problems(doc(code="./src"))
    assert line.startswith("code: a local path is packed and uploaded by the CLI only")
    assert "respawn submit" in line and "gs://BUCKET/code/<sha256>.tar.gz" in line
    [other] = problems(doc(code="https://example.com/code.tar.gz"))
    assert other.startswith("code: expected a gs:// URI")
    assert parse_spec(yaml.safe_dump(doc(code="gs://my-bucket/code/abc.tar.gz")), "job").code == \
        "gs://my-bucket/code/abc.tar.gz"


def _patterns(schema: Any) -> set[str]:
    if isinstance(schema, dict):
        found = {schema["pattern"]} if isinstance(schema.get("pattern"), str) else set()
        return found.union(*(_patterns(v) for v in schema.values()))
    if isinstance(schema, list):
        return set().union(*(_patterns(v) for v in schema))
    return set()


def test_every_pattern_of_the_schema_is_said_in_words_with_an_example():
    """A user who gets a field wrong reads what it should be, never a regular expression."""
    webhook = next(m.pattern for m in spec_module.Notify.model_fields["webhook"].metadata if hasattr(m, "pattern"))
    found = _patterns(spec_module.JobSpec.model_json_schema())
    assert len(found) > 10 and webhook in found
    assert not found - set(spec_module._PATTERN_WORDS) - {webhook}


@pytest.mark.parametrize("field, value, words", [
    ("zones", ["us-central1"], "zones.0: should be a zone such as us-central1-a"),
    ("machine_type", "G2", "machine_type: should be a name of lowercase letters"),
    ("checkpoint", {"uri": "s3://bucket/x"}, "checkpoint.uri: should be a gs:// URI such as gs://my-bucket/runs/llm"),
])
def test_a_pattern_mismatch_says_what_the_field_should_be(field, value, words):
    doc = {"zones": ["us-central1-a"], "machine_type": "g2-standard-8", "command": "python t.py", field: value}
    with pytest.raises(SpecError) as e:
        parse_spec(yaml.safe_dump(doc), "j")
    shown = "\n".join(e.value.problems)
    assert words in shown and "^" not in shown and "\\d" not in shown


def test_a_yaml_error_names_the_line_where_the_unclosed_thing_began_not_only_where_the_file_ended():
    raw = 'zones: [us-central1-a]\nmachine_type: g2-standard-8\ncommand: "python t.py\nenv: {A: 1}\n'
    with pytest.raises(SpecError) as e:
        parse_spec(raw, "j")
    [line] = e.value.problems
    assert "quoted scalar (begun at line 3, column 10)" in line and "at line 5" in line


@pytest.mark.parametrize("kind", ["tpu7x-8", "v7x-16"])
def test_a_tpu7x_type_on_the_cloud_tpu_api_is_refused_with_the_machine_type_to_write(kind):
    found = problems(tpu_doc(tpu={"type": kind, "runtime_version": "x"}))
    assert any(p.startswith("tpu.type:") and "only through Compute Engine" in p
               and "machine_type: tpu7x-standard-4t" in p for p in found), found


@pytest.mark.parametrize("tpu, line", [
    ({"machine_type": "tpu7x-standard-4t", "topology": "3x3x3"}, "tpu.topology: tpu7x-standard-4t makes slices of"),
    ({"machine_type": "tpu7x-standard-4t", "topology": "4x4"}, "tpu.topology: not a 3D topology"),
    ({"machine_type": "tpu7x-standard-4t", "runtime_version": "x"}, "tpu.runtime_version: not with tpu.machine_type"),
    ({"machine_type": "tpu7x-standard-4t", "queued": True}, "tpu.queued: the Cloud TPU API's queue"),
    ({"machine_type": "tpu7x-standard4t"}, "tpu.machine_type: not a TPU machine type; did you mean 'tpu7x-standard-4t'"),
    ({"type": "v6e-8", "runtime_version": "x", "topology": "2x2"}, "tpu.topology: only with tpu.machine_type"),
    ({}, "tpu.type: required"),
])
def test_a_compute_engine_tpu_block_names_the_field_and_the_fix(tpu, line):
    found = problems(tpu_doc(tpu=tpu, zones=["us-central1-c"]))
    assert any(p.startswith(line) for p in found), found


def test_a_compute_engine_tpu_gets_googles_tpu_image_and_the_hosts_its_topology_makes():
    spec = parse_spec(yaml.safe_dump(tpu_doc(tpu={"machine_type": "tpu7x-standard-4t", "topology": "2x4x4"},
                                             zones=["us-central1-c"])).encode(), "j")
    assert spec.tpu is not None and (spec.tpu.api, spec.tpu.hosts, spec.tpu.accelerator) == ("compute", 8, "tpu7x-32")
    assert (spec.boot_disk.image_project, spec.boot_disk.image_family) == (
        "ubuntu-os-accelerator-images", "ubuntu-accel-2404-amd64-tpu-tpu7x")
