"""The deploy plan: gcloud-escaped flag values, the trainer account and its conditional binding.

No gcloud needed: dict-flag values are parsed back with the rule `gcloud topic escaping`
documents, and the binding's CEL is evaluated on object names by a literal translation.
"""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.cli import deploy
from controller.core import names

PROJECT, BUCKET = "prod-proj", "prod-bucket"
CONTROLLER = "respawn-controller@prod-proj.iam.gserviceaccount.com"
TRAINER = "respawn-trainer@prod-proj.iam.gserviceaccount.com"
ZONES = "us-central1-a,us-central1-b,us-central1-c"
MACHINES = "a2-highgpu-1g,g2-standard-8"
EXPECTED_CEL = (
    'resource.name.startsWith("projects/_/buckets/prod-bucket/objects/preempted-jobs/") || '
    '(resource.name.startsWith("projects/_/buckets/prod-bucket/objects/jobs/") && '
    '(resource.name.endsWith("/exit") || resource.name.endsWith("/heartbeat") || '
    'resource.name.endsWith("/notice") || resource.name.endsWith("/ready")))'
)


def parse_dict_flag(value: str) -> dict[str, str]:
    """`gcloud topic escaping`: ``^DELIM^`` up front replaces ',' as the item delimiter;
    each item is split on its first '='."""
    delim = ","
    if value.startswith("^") and "^" in value[1:]:
        delim, value = value[1:].split("^", 1)
    items = value.split(delim) if value else []
    return dict(item.split("=", 1) for item in items)


def target(**overrides) -> deploy.Target:
    fields = dict(project=PROJECT, region="us-central1", bucket=BUCKET, controller_sa=CONTROLLER,
                  scheduler_sa="respawn-scheduler@prod-proj.iam.gserviceaccount.com",
                  env={"RESPAWN_ALLOWED_ZONES": ZONES, "RESPAWN_ALLOWED_MACHINE_TYPES": MACHINES})
    return deploy.Target(**{**fields, **overrides})


def flag(argv: tuple[str, ...], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
    return value


def step(steps: list[deploy.Step], *words: str) -> deploy.Step:
    (found,) = [s for s in steps if s.argv[: len(words)] == words]
    return found


def named(steps: list[deploy.Step], name: str) -> deploy.Step:
    (found,) = [s for s in steps if s.name == name]
    return found


def functions(steps: list[deploy.Step]) -> list[deploy.Step]:
    return [s for s in steps if s.argv[:3] == ("gcloud", "functions", "deploy")]


def allowed(expression: str, object_name: str) -> bool:
    """Evaluate the binding's CEL on one resource name (it uses only startsWith/endsWith, ||, &&)."""
    python = (expression.replace("||", " or ").replace("&&", " and ")
              .replace(".startsWith(", ".startswith(").replace(".endsWith(", ".endswith("))
    return eval(python, {"__builtins__": {}}, {"resource": SimpleNamespace(name=object_name)})  # noqa: S307


def test_multi_entry_allow_lists_round_trip_through_the_env_vars_flag():
    t = target()
    env = t.function_env()
    assert env["RESPAWN_ALLOWED_ZONES"] == ZONES and env["RESPAWN_ALLOWED_MACHINE_TYPES"] == MACHINES
    for fn in functions(deploy.plan(t)):
        value = flag(fn.argv, "set-env-vars")
        assert value.startswith("^") and "," not in value.split("^")[1]  # an alternate delimiter, never ','
        assert parse_dict_flag(value) == env
    # the bug this replaces: joined with commas, the lists fall apart into keyless items
    naive = ",".join(f"{k}={v}" for k, v in env.items())
    with pytest.raises(ValueError):
        parse_dict_flag(naive)


@given(st.dictionaries(
    st.text(st.characters(codec="utf-8", exclude_characters="="), min_size=1, max_size=12),
    st.text(st.characters(codec="utf-8"), max_size=20), max_size=6))
def test_gcloud_dict_round_trips_any_keys_and_values(pairs):
    try:
        value = deploy.gcloud_dict(pairs)
    except ValueError:  # every candidate delimiter is taken: refused, never mis-encoded
        used = "".join(f"{k}{v}" for k, v in pairs.items())
        assert all(d in used for d in deploy._DELIMITERS)
        return
    assert parse_dict_flag(value) == pairs


@pytest.mark.parametrize("bad_key", ["", "A=B"])
def test_gcloud_dict_refuses_keys_gcloud_cannot_carry(bad_key):
    with pytest.raises(ValueError):
        deploy.gcloud_dict({bad_key: "v"})


def test_every_function_is_built_with_a_source_date_so_its_pyc_files_survive_the_image():
    """Checked-hash .pyc files (PEP 552): the image's 1980 mtimes leave them valid, so no fresh
    instance compiles respawn again (bench/deployed.py ``workspace`` builds the same way)."""
    fns = functions(deploy.plan(target()))
    assert fns and all(parse_dict_flag(flag(fn.argv, "set-build-env-vars")) == {"SOURCE_DATE_EPOCH": "315532800"}
                       for fn in fns)


def test_functions_run_with_the_trainer_account_and_allow_only_it_by_default():
    env = parse_dict_flag(flag(functions(deploy.plan(target()))[0].argv, "set-env-vars"))
    assert env["RESPAWN_TRAINER_SERVICE_ACCOUNT"] == TRAINER
    assert env["RESPAWN_ALLOWED_SERVICE_ACCOUNTS"] == TRAINER
    assert env["RESPAWN_BUCKET"] == BUCKET and env["RESPAWN_PROJECT"] == PROJECT


def test_an_allow_list_of_service_accounts_the_user_set_is_kept():
    mine = "a@prod-proj.iam.gserviceaccount.com,b@prod-proj.iam.gserviceaccount.com"
    env = parse_dict_flag(flag(functions(deploy.plan(target(env={"RESPAWN_ALLOWED_SERVICE_ACCOUNTS": mine})))[0].argv,
                               "set-env-vars"))
    assert env["RESPAWN_ALLOWED_SERVICE_ACCOUNTS"] == mine
    assert env["RESPAWN_TRAINER_SERVICE_ACCOUNT"] == TRAINER


def test_the_trainer_may_pull_the_project_s_images_and_never_push_them():
    # A spec's image: is pulled by its VM with the VM's own token: roles/artifactregistry.reader, the least
    # role with artifactregistry.repositories.downloadArtifacts (writer and up could replace what others pull).
    steps = deploy.plan(target())
    images = named(steps, "trainer-images")
    assert images.argv == ("gcloud", "projects", "add-iam-policy-binding", PROJECT, f"--member=serviceAccount:{TRAINER}",
                           "--role=roles/artifactregistry.reader", "--condition=None")
    trainer_roles = [flag(s.argv, "role") for s in steps if f"--member=serviceAccount:{TRAINER}" in s.argv]
    assert not [r for r in trainer_roles if r.startswith("roles/artifactregistry.") and r != deploy.TRAINER_REGISTRY_ROLE]
    assert "artifactregistry" in deploy.APIS  # the API is enabled with the others (Cloud Functions' builds use it too)


def test_the_trainer_account_is_created_idempotently():
    create = named(deploy.plan(target()), "trainer-account")
    assert create.argv[:5] == ("gcloud", "iam", "service-accounts", "create", "respawn-trainer")
    assert f"--project={PROJECT}" in create.argv and "already exists" in create.done_if

    ran: list[tuple[str, ...]] = []

    def gcloud(argv: tuple[str, ...]) -> str:
        ran.append(argv)
        if argv[:4] == ("gcloud", "iam", "service-accounts", "create"):
            raise subprocess.CalledProcessError(1, argv, "", "ERROR: Service account respawn-trainer already exists "
                                                             "within project projects/prod-proj.")
        if "--raw" in argv:  # the bucket's description: not there yet
            raise subprocess.CalledProcessError(1, argv, "", f"ERROR: gs://{BUCKET} not found: 404.")
        return "https://tick.example\n" if "describe" in argv else ""

    steps = [s for s in deploy.plan(target()) if s.argv]
    deploy.execute(steps, target(), run=gcloud, say=lambda _: None, sleep=lambda _: None)
    # every step went on: its command, what it looked up first, the bucket's probe
    assert len(ran) == sum(1 + len(s.lookups) + bool(s.probe) for s in steps)


def test_a_trainer_account_outside_the_project_is_used_not_created():
    other = "trainer@other-proj.iam.gserviceaccount.com"
    steps = deploy.plan(target(trainer_sa=other))
    assert not [s for s in steps if s.argv[:5] == ("gcloud", "iam", "service-accounts", "create", "respawn-trainer")]
    binding = [s for s in steps if f"--member=serviceAccount:{other}" in s.argv]
    assert binding and flag(binding[0].argv, "role") == f"projects/{PROJECT}/roles/{deploy.TRAINER_ROLE_ID}"


def test_the_trainer_binding_is_conditional_to_exactly_the_vm_records():
    steps = deploy.plan(target())
    bindings = [s for s in steps if s.argv[:5] == ("gcloud", "storage", "buckets", "add-iam-policy-binding",
                                                    f"gs://{BUCKET}")]  # the checkpoints bucket's: their own test
    (trainer, code, scripts) = [s for s in bindings if f"--member=serviceAccount:{TRAINER}" in s.argv]
    assert trainer.argv[4] == f"gs://{BUCKET}"
    assert flag(trainer.argv, "role") == f"projects/{PROJECT}/roles/{deploy.TRAINER_ROLE_ID}"
    condition = parse_dict_flag(flag(trainer.argv, "condition"))
    assert condition["expression"] == EXPECTED_CEL
    assert condition["title"] == deploy.TRAINER_CONDITION_TITLE
    # IAM Conditions on a bucket need uniform bucket-level access, turned on before the binding
    ubla = step(steps, "gcloud", "storage", "buckets", "update")
    assert ubla.argv[4] == f"gs://{BUCKET}" and "--uniform-bucket-level-access" in ubla.argv
    assert steps.index(ubla) < steps.index(trainer)
    # and a second binding, read-only, to the code tarballs respawn submit packs
    assert flag(code.argv, "role") == "roles/storage.objectViewer"
    code_condition = parse_dict_flag(flag(code.argv, "condition"))
    assert code_condition["expression"] == deploy.trainer_code_condition(BUCKET)
    assert steps.index(ubla) < steps.index(code)
    # and a third, read-only, to the VM scripts every VM's bootstrap fetches
    assert flag(scripts.argv, "role") == "roles/storage.objectViewer"
    scripts_condition = parse_dict_flag(flag(scripts.argv, "condition"))
    assert scripts_condition["expression"] == deploy.trainer_scripts_condition(BUCKET)
    assert scripts_condition["title"] == deploy.TRAINER_SCRIPTS_CONDITION_TITLE
    assert steps.index(ubla) < steps.index(scripts)


@pytest.mark.parametrize("name, admitted", [
    ("code/" + "a" * 64 + ".tar.gz", True),
    ("jobs/train/exit", False),
    ("preempted-jobs/train", False),
    ("jobs/train/status.json", False),
    ("respawn/tpu-zones.json", False),
    ("respawn/lease/tick", False),
    ("xcode/a.tar.gz", False),
])
def test_the_code_condition_admits_the_code_tarballs_and_nothing_else(name, admitted):
    cel = deploy.trainer_code_condition(BUCKET)
    assert allowed(cel, f"projects/_/buckets/{BUCKET}/objects/{name}") is admitted
    assert not allowed(cel, f"projects/_/buckets/{BUCKET}")  # no listing
    assert not allowed(deploy.trainer_condition(BUCKET), f"projects/_/buckets/{BUCKET}/objects/code/x.tar.gz")


@pytest.mark.parametrize("name, admitted", [
    ("respawn/vm/" + "a" * 64 + "/startup.sh", True),
    ("respawn/vm/" + "a" * 64 + "/shutdown.sh", True),
    ("respawn/tpu-zones.json", False),
    ("respawn/controller.json", False),
    ("respawn/snapshot/000.json", False),  # statuses, attempt tokens in them: never a trainer's to read
    ("jobs/train/exit", False),
    ("jobs/train/status.json", False),
    ("code/" + "a" * 64 + ".tar.gz", False),
    ("xrespawn/vm/a/startup.sh", False),
])
def test_the_scripts_condition_admits_the_vm_scripts_and_nothing_else(name, admitted):
    cel = deploy.trainer_scripts_condition(BUCKET)
    assert allowed(cel, f"projects/_/buckets/{BUCKET}/objects/{name}") is admitted
    assert not allowed(cel, f"projects/_/buckets/{BUCKET}")  # no listing
    if admitted:  # and no write: the records' binding never admits them
        assert not allowed(deploy.trainer_condition(BUCKET), f"projects/_/buckets/{BUCKET}/objects/{name}")


def test_the_controller_gets_the_whole_bucket_and_may_attach_only_the_trainer_account():
    steps = deploy.plan(target())
    (controller,) = [s for s in steps if s.argv[:5] == ("gcloud", "storage", "buckets", "add-iam-policy-binding",
                                                        f"gs://{BUCKET}")
                     and f"--member=serviceAccount:{CONTROLLER}" in s.argv]
    assert flag(controller.argv, "role") == "roles/storage.objectUser"
    assert flag(controller.argv, "condition") == "None"  # explicit: the bucket policy has conditions
    act_as = step(steps, "gcloud", "iam", "service-accounts", "add-iam-policy-binding")
    assert act_as.argv[4] == TRAINER and flag(act_as.argv, "member") == f"serviceAccount:{CONTROLLER}"
    assert flag(act_as.argv, "role") == "roles/iam.serviceAccountUser"
    assert steps.index(named(steps, "trainer-account")) < steps.index(act_as)


@pytest.mark.parametrize("name, admitted", [
    ("jobs/train/exit", True),
    ("jobs/train/heartbeat", True),
    ("jobs/train/notice", True),  # the agent's preemption notice (issue 34)
    ("jobs/train/ready", True),  # a standby at its starting line
    ("preempted-jobs/train", True),
    ("jobs/train/spec.yaml", False),
    ("jobs/train/status.json", False),
    ("jobs/train/cancel", False),
    ("jobs/train/exit.tmp", False),
    ("jobs/train/myexit", False),
    ("respawn/vm/startup.sh", False),
    ("respawn/lease/tick", False),  # the lease of the pass over every job: never a trainer's to hold
    ("respawn/lease/shard-1-of-4", False),  # nor a shard's
    ("respawn/shards/1-of-4", False),  # a shard's listing, handed through an object
    ("respawn/lease/tick.clock", False),  # what a taker writes to read GCS's time: never a trainer's either
    ("respawn/snapshot/000.json", False),  # what a fresh controller instance starts from: nor a trainer's to write
    ("sweeps/lr/slots/0", False),  # a sweep's admission: a trial's VM taking a slot would run past max_parallel
    ("sweeps/lr/sweep.json", False),  # nor may it change its sweep's limits
    ("ckpt/train/step-100/model.pt", False),
    ("exit", False),
])
def test_the_condition_admits_vm_records_and_refuses_everything_else(name, admitted):
    assert allowed(EXPECTED_CEL, f"projects/_/buckets/{BUCKET}/objects/{name}") is admitted


def test_the_condition_refuses_the_bucket_itself_and_other_buckets():
    assert not allowed(EXPECTED_CEL, f"projects/_/buckets/{BUCKET}")  # listing is a bucket-level check
    assert not allowed(EXPECTED_CEL, f"projects/_/buckets/{BUCKET}-2/objects/jobs/train/exit")
    assert not allowed(EXPECTED_CEL, f"projects/_/buckets/{BUCKET}/managedFolders/jobs/")


@given(st.text(st.sampled_from("jobs/preempted-exitheartbspc.yamlstu_1nocd"), max_size=40))
def test_every_object_a_trainer_may_write_is_a_vm_record_or_ignored(name):
    if allowed(deploy.trainer_condition(BUCKET), f"projects/_/buckets/{BUCKET}/objects/{name}"):
        ref = names.parse_object_name(name)
        assert ref is None or ref.kind in {"exit", "heartbeat", "marker", "notice", "ready"}


@pytest.mark.parametrize("bucket", ['b"||true||"', "UPPER", "a", "with space"])
def test_a_bucket_name_that_is_not_one_is_refused_before_it_reaches_the_condition(bucket):
    with pytest.raises(ValueError):
        deploy.plan(target(bucket=bucket))


def test_a_new_account_not_yet_visible_to_iam_is_retried_then_succeeds():
    binding = step(deploy.plan(target()), "gcloud", "iam", "service-accounts", "add-iam-policy-binding")
    calls, waits = [], []

    def gcloud(argv: tuple[str, ...]) -> str:
        calls.append(argv)
        if len(calls) < 3:
            raise subprocess.CalledProcessError(1, argv, "", f"NOT_FOUND: Service account {TRAINER} does not exist.")
        return ""

    deploy._run_step(binding, gcloud, waits.append)
    assert len(calls) == 3 and len(waits) == 2


def test_any_other_failure_stops_the_deploy():
    binding = step(deploy.plan(target()), "gcloud", "storage", "buckets", "update")

    def gcloud(argv: tuple[str, ...]) -> str:
        raise subprocess.CalledProcessError(1, argv, "", "PERMISSION_DENIED")

    with pytest.raises(subprocess.CalledProcessError):
        deploy._run_step(binding, gcloud, lambda _: pytest.fail("must not retry"))


def test_trainers_may_write_records_but_never_read_them():
    # A record carries its attempt's secret: a trainer able to read another job's
    # heartbeat could copy the token into a forged exit record for that job.
    (create,) = [s for s in deploy.plan(target()) if s.argv[:4] == ("gcloud", "iam", "roles", "create")]
    assert flag(create.argv, "permissions") == "storage.objects.create,storage.objects.delete"
    assert "already exists" in create.done_if


# -- the audit sink's filter: one source, shown as it is -------------------------------------------

def test_the_deploy_page_shows_the_sink_filter_audit_writes_for_project_PROJECT():
    """docs/deploy.md shows the filter once, generated from controller.core.audit.sink_filter("PROJECT"):
    this keeps the two from drifting apart."""
    import re
    from pathlib import Path

    from controller.core import audit

    readme = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    shown = re.findall(r"^```\n(logName=\(.*?)\n```$", readme, re.M)
    assert shown == [audit.sink_filter("PROJECT")]
    around = readme[readme.index(shown[0]) - 2000:readme.index(shown[0]) + 2000]
    assert "no instance labels" in around and "ignores those whose name cannot be" in around


def test_the_sink_is_created_and_updated_with_the_filter_audit_writes_and_its_topic_as_destination():
    from controller.core import audit

    for argv in (deploy.audit_sink_argv(PROJECT), deploy.audit_sink_update_argv(PROJECT)):
        assert argv[4:6] == ("respawn-audit", "pubsub.googleapis.com/projects/prod-proj/topics/respawn-audit")
        assert [a for a in argv if a.startswith("--log-filter=")] == [f"--log-filter={audit.sink_filter(PROJECT)}"]
        assert argv[-1] == f"--project={PROJECT}"
    assert "--no-disabled" in deploy.audit_sink_update_argv(PROJECT)
    assert deploy.audit_publisher_argv(PROJECT, "serviceAccount:w@x") == (
        "gcloud", "pubsub", "topics", "add-iam-policy-binding", "respawn-audit", "--member=serviceAccount:w@x",
        "--role=roles/pubsub.publisher", f"--project={PROJECT}")


def test_the_deploy_label_is_the_source_s_content_and_the_flags_not_where_the_source_lies(tmp_path):
    from controller.cli import revision

    one, two = tmp_path / "one", tmp_path / "two"
    for source in (one, two):
        (source / "controller").mkdir(parents=True)
        (source / "main.py").write_text("print(1)\n")
        (source / "controller" / "x.py").write_text("x = 1\n")
        (source / ".gcloudignore").write_text(".gcloudignore\ntests/\n#!include:.extra\n")
        (source / ".extra").write_text("*.log\n")
    (two / "tests").mkdir()
    (two / "tests" / "test_x.py").write_text("left out by .gcloudignore")
    (two / "run.log").write_text("left out by the file .gcloudignore includes")
    argv = ("gcloud", "functions", "deploy", "f", "--memory=512Mi")
    same = [revision.label(revision.source_digest(s), (*argv, f"--source={s}", "--update-labels=respawn-deploy=x"))
            for s in (one, two)]
    assert same[0] == same[1] and len(same[0]) == revision.LENGTH
    (two / "controller" / "x.py").write_text("x = 2\n")
    assert revision.source_digest(one) != revision.source_digest(two)
    assert revision.label("d", (*argv,)) != revision.label("d", (*argv[:-1], "--memory=1Gi"))


def test_with_shards_deploy_makes_the_topic_its_publisher_grant_and_on_shard_and_sets_k_on_every_function():
    steps = deploy.plan(target(shards=8))
    topic = named(steps, "shard-topic")
    assert topic.argv[:5] == ("gcloud", "pubsub", "topics", "create", "respawn-shards")
    grant = named(steps, "shard-publisher")
    assert grant.argv[4] == "respawn-shards" and flag(grant.argv, "member") == f"serviceAccount:{CONTROLLER}"
    assert flag(grant.argv, "role") == "roles/pubsub.publisher"
    on_shard = named(steps, "on-shard")
    assert flag(on_shard.argv, "entry-point") == "on_shard" and flag(on_shard.argv, "trigger-topic") == "respawn-shards"
    assert flag(on_shard.argv, "trigger-service-account") == CONTROLLER and "--retry" not in on_shard.argv
    assert steps.index(topic) < steps.index(grant) < steps.index(on_shard) < steps.index(named(steps, "on-shard-invoker"))
    for function in functions(steps):
        assert parse_dict_flag(flag(function.argv, "set-env-vars"))["RESPAWN_SHARDS"] == "8"


def test_without_shards_deploy_is_as_before():
    steps = deploy.plan(target())
    assert not [s for s in steps if "shard" in s.name]
    for function in functions(steps):
        assert "RESPAWN_SHARDS" not in parse_dict_flag(flag(function.argv, "set-env-vars"))


@pytest.mark.parametrize("specs, k", [(0, 1), (10_000, 1), (10_001, 2), (25_000, 4), (100_000, 16),
                                      (10**9, names.MAX_SHARDS)])
def test_shards_auto_is_one_shard_per_ten_thousand_specs_rounded_up_to_a_power_of_two(specs, k):
    assert deploy.shards_for(specs) == k
