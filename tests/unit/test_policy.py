"""The controller-wide policy: projects it watches, accounts VMs run as, GPUs counted in full."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from controller.service.config import Settings
from controller.core.policy import ControllerPolicy, is_compute_default_account
from controller.core.spec import JobSpec, SpecError, parse_spec

TRAINER = "trainer@home-proj.iam.gserviceaccount.com"


def spec(**overrides: Any) -> JobSpec:
    doc: dict[str, Any] = {"zones": ["us-central1-a"], "machine_type": "n1-standard-8", "command": "python t.py"}
    doc.update(overrides)
    return parse_spec(yaml.safe_dump(doc), "j")


def policy(**kw: Any) -> ControllerPolicy:
    return ControllerPolicy(**{"default_project": "home-proj", "trainer_service_account": TRAINER, **kw})


def fields(lines: list[str]) -> list[str]:
    return [line.split(":")[0] for line in lines]


class TestEveryViolation:
    strict = policy(
        allowed_projects=("other-proj",),
        allowed_zones=("us-central1-*",),
        allowed_machine_types=("n1-*",),
        allowed_service_accounts=(TRAINER,),
        max_nodes=2,
        max_accelerators=4,
    )

    def test_allows_what_is_inside(self):
        assert self.strict.violations(spec(service_account={"email": TRAINER}, project="other-proj")) == []
        assert self.strict.violations(spec()) == []

    def test_each_violation_names_field_and_what_is_allowed(self):
        bad = spec(project="evil-proj", zones=["europe-west4-a"], machine_type="a3-megagpu-8g", nodes=3,
                   service_account={"email": "root@evil-proj.iam.gserviceaccount.com"})
        lines = self.strict.violations(bad)
        assert fields(lines) == ["project", "zones.0", "machine_type", "service_account.email", "nodes", "machine_type"]
        assert "allowed: us-central1-*" in lines[1]
        assert f"allowed: {TRAINER}" in lines[3]


# -- 3. GPUs built into the machine type count --------------------------------------------------

def test_built_in_gpus_count_against_the_limit():
    [line] = policy(max_nodes=8).violations(spec(machine_type="a3-highgpu-8g", nodes=8))
    assert line.startswith("machine_type: 64 GPUs in all (8 node(s) x 8") and "limit of 16" in line


def test_attached_gpus_count_per_node():
    [line] = policy().violations(spec(accelerators={"type": "nvidia-tesla-t4", "count": 4}, nodes=5))
    assert line.startswith("accelerators.count: 20 GPUs in all") and "limit of 16" in line


@pytest.mark.parametrize("machine, nodes", [("a3-highgpu-8g", 2), ("a2-megagpu-16g", 1), ("g2-standard-48", 4)])
def test_up_to_the_limit_is_fine(machine, nodes):
    assert policy().violations(spec(machine_type=machine, nodes=nodes)) == []


def test_a_machine_without_gpus_counts_none():
    assert spec(machine_type="e2-standard-4", nodes=8).total_gpus == 0


# -- 4. the project must be one the controller watches ------------------------------------------

def test_a_project_the_controller_does_not_watch_is_refused_even_with_no_allowed_list():
    [line] = policy().violations(spec(project="elsewhere"))
    assert line.startswith("project: 'elsewhere' is not watched by this controller")
    assert "use one of: home-proj" in line


def test_allowed_projects_are_watched_and_usable():
    p = policy(allowed_projects=("other-proj",))
    assert "other-proj" in p.watched_projects
    assert p.violations(spec(project="other-proj")) == []
    assert "use one of: home-proj, other-proj" in p.violations(spec(project="third-proj"))[0]


def test_a_project_only_watched_for_orphans_is_not_for_new_vms():
    [line] = policy(projects_to_watch=("old-proj",)).violations(spec(project="old-proj"))
    assert line.startswith("project: 'old-proj' is not allowed")


def test_no_project_anywhere():
    [line] = policy(default_project="").violations(spec())
    assert line.startswith("project: not given") and "RESPAWN_PROJECT" in line


def test_resolve_fills_in_project_and_account():
    resolved = policy().resolve(spec())
    assert resolved.project == "home-proj"
    assert resolved.service_account.email == TRAINER
    assert resolved.service_account.scopes == spec().service_account.scopes


def test_resolve_keeps_what_the_spec_names_when_allowed():
    other = "other@home-proj.iam.gserviceaccount.com"
    resolved = policy(allowed_projects=("other-proj",), allowed_service_accounts=(TRAINER, other)).resolve(
        spec(project="other-proj", service_account={"email": other}))
    assert (resolved.project, resolved.service_account.email) == ("other-proj", other)


def test_resolve_refuses_a_violating_spec():
    with pytest.raises(SpecError) as e:
        policy().resolve(spec(project="elsewhere"))
    assert e.value.problems[0].startswith("project: ")


# -- 5. the trainer service account --------------------------------------------------------------

def test_only_the_trainer_account_by_default():
    [line] = policy().violations(spec(service_account={"email": "admin@home-proj.iam.gserviceaccount.com"}))
    assert line.startswith("service_account.email: 'admin@home-proj.iam.gserviceaccount.com' is not allowed")
    assert TRAINER in line


def test_no_account_and_no_trainer_names_the_setting():
    [line] = policy(trainer_service_account=None).violations(spec())
    assert line.startswith("service_account.email: not given") and "RESPAWN_TRAINER_SERVICE_ACCOUNT" in line


def test_no_trainer_and_no_list_allows_a_named_account():
    assert policy(trainer_service_account=None).violations(spec(service_account={"email": TRAINER})) == []


@pytest.mark.parametrize("email", ["default", "123456789-compute@developer.gserviceaccount.com"])
def test_the_compute_default_account_is_refused_with_the_reason(email):
    for p in (policy(), policy(trainer_service_account=None), policy(allowed_service_accounts=("*",))):
        [line] = p.violations(spec(service_account={"email": email}))
        assert line.startswith("service_account.email: ") and "Editor" in line
        assert "RESPAWN_ALLOWED_SERVICE_ACCOUNTS" in line


def test_the_compute_default_account_when_listed_by_name():
    email = "123456789-compute@developer.gserviceaccount.com"
    assert policy(allowed_service_accounts=(email,)).violations(spec(service_account={"email": email})) == []
    resolved = policy(trainer_service_account=email, allowed_service_accounts=(email,)).resolve(spec())
    assert resolved.service_account.email == email


def test_a_compute_default_trainer_is_refused_unless_listed():
    [line] = policy(trainer_service_account="default").violations(spec())
    assert "Compute Engine default service account" in line


def test_is_compute_default_account():
    assert is_compute_default_account("default")
    assert is_compute_default_account("42-compute@developer.gserviceaccount.com")
    assert not is_compute_default_account(TRAINER)
    assert not is_compute_default_account("x-compute@developer.gserviceaccount.com.evil")


# -- config ----------------------------------------------------------------------------------------

def test_settings_read_the_policy(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RESPAWN_PROJECT", "home-proj")
    monkeypatch.setenv("RESPAWN_ALLOWED_ZONES", "us-central1-*, europe-west4-a,")
    monkeypatch.setenv("RESPAWN_ALLOWED_PROJECTS", "other-proj,third-proj")
    monkeypatch.setenv("RESPAWN_ALLOWED_SERVICE_ACCOUNTS", f"{TRAINER},x@home-proj.iam.gserviceaccount.com")
    monkeypatch.setenv("RESPAWN_TRAINER_SERVICE_ACCOUNT", f" {TRAINER} ")
    p = Settings().policy()
    assert p.allowed_zones == ("us-central1-*", "europe-west4-a")
    assert p.watched_projects == ("home-proj", "other-proj", "third-proj")
    assert p.allowed_service_accounts == (TRAINER, "x@home-proj.iam.gserviceaccount.com")
    assert p.trainer_service_account == TRAINER


def test_settings_without_a_trainer(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RESPAWN_TRAINER_SERVICE_ACCOUNT", "")
    assert Settings().policy().trainer_service_account is None


def test_settings_refuse_project_patterns(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RESPAWN_ALLOWED_PROJECTS", "team-*")
    with pytest.raises(ValueError, match="not patterns"):
        Settings()


def test_a_gpu_family_whose_count_is_unknown_is_refused_not_counted_as_zero():
    (problem,) = policy().violations(spec(machine_type="g4-standard-384", nodes=8))
    assert problem.startswith("machine_type:") and "g4-standard-384" in problem


def test_tpu_types_and_sizes_are_bounded_by_the_policy():
    tpu = spec(machine_type=None, tpu={"type": "v4-64", "runtime_version": "tpu-ubuntu2204-base"})
    assert fields(policy().violations(tpu)) == ["tpu.type"]  # default limit: 32
    assert "v4-64" in policy().violations(tpu)[0] and "RESPAWN_MAX_TPU_SIZE" in policy().violations(tpu)[0]
    assert policy(max_tpu_size=64).violations(tpu) == []
    lines = policy(max_tpu_size=64, allowed_tpu_types=("v5litepod-*",), allowed_zones=("us-central1-*",),
                   ).violations(spec(machine_type=None, zones=["us-central2-b"],
                                     tpu={"type": "v4-64", "runtime_version": "v2"}))
    assert fields(lines) == ["zones.0", "tpu.type"]


def test_tpu_policy_settings_are_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("RESPAWN_ALLOWED_TPU_TYPES", "v5litepod-*, v6e-*")
    monkeypatch.setenv("RESPAWN_MAX_TPU_SIZE", "16")
    p = Settings(project="home-proj").policy()
    assert p.allowed_tpu_types == ("v5litepod-*", "v6e-*") and p.max_tpu_size == 16


def test_notification_settings_are_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("RESPAWN_NOTIFY_TOPIC", "projects/home-proj/topics/respawn")
    monkeypatch.setenv("RESPAWN_NOTIFY_WEBHOOK", " ")
    monkeypatch.setenv("RESPAWN_ALLOWED_WEBHOOK_HOSTS", "hooks.slack.com, chat.example.com")
    monkeypatch.setenv("RESPAWN_ALLOWED_NOTIFY_TOPICS", "projects/home-proj/topics/team-*")
    p = Settings(project="home-proj").policy()
    assert p.notify_topic == "projects/home-proj/topics/respawn" and p.notify_webhook is None
    assert p.allowed_webhook_hosts == ("hooks.slack.com", "chat.example.com")
    assert p.allowed_notify_topics == ("projects/home-proj/topics/team-*",)
    assert Settings(project="home-proj", _env_file=None).policy().allowed_webhook_hosts


def test_a_webhook_host_list_emptied_by_the_deployer_refuses_every_spec_webhook():
    from controller.core.spec import JobSpec

    p = ControllerPolicy(default_project="home-proj", trainer_service_account=TRAINER, allowed_webhook_hosts=())
    spec = JobSpec.model_validate({"zones": ["us-central1-a"], "machine_type": "n1-standard-4", "command": "x",
                                   "notify": {"webhook": "https://hooks.slack.com/services/x"}})
    assert any(v.startswith("notify.webhook") for v in p.violations(spec))


# -- a function's localhost is not the user's (issue 22, item 23) -----------------------------------
@pytest.mark.parametrize(("allowed", "url"), [
    ("*", "http://localhost:8080/hook"),
    ("*", "https://localhost/hook"),
    ("*", "http://localhost./hook"),
    ("*", "http://LOCALHOST:9/hook"),
    ("*", "http://127.0.0.1:8123/services/x"),
    ("127.0.0.1", "http://127.0.0.1:8123/services/x"),
    ("*.*", "https://admin.localhost/hook"),
    ("localhost", "http://localhost:8080/hook"),  # named outright: still the controller's own machine
])
def test_a_loopback_webhook_is_refused_whatever_the_host_allowlist_says(allowed, url):
    from controller.core.spec import Notify

    problems = policy(allowed_webhook_hosts=(allowed,)).notify_problems(Notify(webhook=url))
    assert problems and all(p.startswith("notify.webhook") for p in problems)
    assert "/hook" not in " ".join(problems) and "services" not in " ".join(problems)  # never the URL's path


def test_loopback_webhooks_are_admitted_only_by_the_explicit_local_cloud_setting(monkeypatch):
    from controller.core.spec import Notify

    local = Notify(webhook="http://127.0.0.1:8123/services/TLOCAL/BLOCAL/local-secret")
    for allowed in (("*",), ("hooks.slack.com",)):  # the setting admits it, whatever the host list
        assert policy(allowed_webhook_hosts=allowed, allow_loopback_webhooks=True).notify_problems(local) == []
    assert policy(allowed_webhook_hosts=("*",)).notify_problems(local)
    assert Settings(project="home-proj", _env_file=None).policy().allow_loopback_webhooks is False
    monkeypatch.setenv("RESPAWN_ALLOW_LOOPBACK_WEBHOOKS", "true")
    assert Settings(project="home-proj", _env_file=None).policy().allow_loopback_webhooks is True


def test_a_gpu_machine_type_typo_suggests_the_closest_known_type_not_a_source_file():
    [line] = policy().violations(spec(machine_type="g2-standrd-8"))
    assert line.startswith("machine_type: 'g2-standrd-8' is no GPU machine type respawn knows")
    assert "did you mean 'g2-standard-8'?" in line and ".py" not in line
    [far] = policy().violations(spec(machine_type="g9-mystery-1"))
    assert "did you mean" not in far and "e.g. g2-standard-8" in far and ".py" not in far
