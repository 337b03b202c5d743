"""The controller-wide policy: what any spec may ask for.

Set by whoever deploys the controller (environment of the functions), it bounds every
user's spec so that a typo or a hostile spec cannot start 64 A100s in a foreign project
or run its VMs as a powerful identity. Zone, machine type and service account patterns
use shell globs (``us-central1-*``, ``a2-*``); an empty list allows anything, except:

- a project must be one the controller watches (it lists instances only there, so a VM
  elsewhere would never be seen again: never recreated, never deleted);
- service accounts default to the controller's trainer account alone, and the Compute
  Engine default service account is refused unless listed by name.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

from controller.core import zones
from controller.core.spec import BUILT_IN_GPUS, JobSpec, Notify, SpecError, built_in_gpus

TRAINER_SETTING = "RESPAWN_TRAINER_SERVICE_ACCOUNT"
ALLOWED_ACCOUNTS_SETTING = "RESPAWN_ALLOWED_SERVICE_ACCOUNTS"
# Accelerator-optimized families carry their GPUs (a2, a3, a4, a4x, g2, g4...).
_GPU_FAMILY = re.compile(r"(a\d+x?|g\d+)-")
_COMPUTE_DEFAULT = re.compile(r"\d+-compute@developer\.gserviceaccount\.com")


def is_compute_default_account(email: str) -> bool:
    """``default`` or ``PROJECT_NUMBER-compute@developer.gserviceaccount.com``."""
    return email == "default" or bool(_COMPUTE_DEFAULT.fullmatch(email))


@dataclass(frozen=True)
class ControllerPolicy:
    default_project: str
    allowed_projects: tuple[str, ...] = ()
    allowed_zones: tuple[str, ...] = ()
    extra_zones: tuple[str, ...] = ()  # zones Google added since controller/core/zones.py's table (RESPAWN_EXTRA_ZONES)
    allowed_machine_types: tuple[str, ...] = ()
    allowed_service_accounts: tuple[str, ...] = ()  # empty: the trainer account alone
    max_nodes: int = 8
    max_accelerators: int = 16
    allowed_tpu_types: tuple[str, ...] = ()
    max_tpu_size: int = 32  # the number a TPU type ends in (v4-32: 32 TensorCores; v5litepod-16: 16 chips)
    projects_to_watch: tuple[str, ...] = field(default=())
    trainer_service_account: str | None = None  # what VMs run as when a spec names no account
    # Notifications: the deployer's own destinations (every job's events), and what a spec's
    # ``notify`` may name: topics (globs; default: any topic of a watched project) and webhook
    # hosts (globs; the controller POSTs there, so never an address of the controller's choosing).
    notify_topic: str | None = None
    notify_webhook: str | None = None
    allowed_notify_topics: tuple[str, ...] = ()
    allowed_webhook_hosts: tuple[str, ...] = ("hooks.slack.com",)
    # A job's webhook on the controller's own machine (localhost, 127.0.0.1): the local cloud's
    # sink, on any port, whatever the host allowlist. A deployed function's localhost is not the
    # user's, so only the local cloud sets this (RESPAWN_ALLOW_LOOPBACK_WEBHOOKS); no host
    # allowlist, ``*`` included, ever implies it.
    allow_loopback_webhooks: bool = False

    @property
    def watched_projects(self) -> tuple[str, ...]:
        """Where managed instances may live, so orphans are found in every one of them."""
        projects = (self.default_project, *self.allowed_projects, *self.projects_to_watch)
        return tuple(p for p in dict.fromkeys(projects) if p)

    @property
    def service_accounts(self) -> tuple[str, ...]:
        """The accounts specs may name: the allowed list, else the trainer account (else any)."""
        if self.allowed_service_accounts:
            return self.allowed_service_accounts
        return (self.trainer_service_account,) if self.trainer_service_account else ()

    def project_of(self, spec: JobSpec) -> str:
        return spec.project or self.default_project

    def service_account_of(self, spec: JobSpec) -> str | None:
        return spec.service_account.email or self.trainer_service_account

    def resolve(self, spec: JobSpec) -> JobSpec:
        """The spec as the controller runs it: project and service account filled in from the policy.

        Raises SpecError with every violation: an insert is built from the resolved spec
        alone, never from defaults elsewhere.
        """
        if problems := self.violations(spec):
            raise SpecError(problems)
        account = spec.service_account.model_copy(update={"email": self.service_account_of(spec)})
        return spec.model_copy(update={"project": self.project_of(spec), "service_account": account})

    def unknown_zones(self, spec: JobSpec) -> list[str]:
        """The spec's zones that Compute Engine does not have (``us-central1-z``), each with the zone
        perhaps meant. The CLI's check only (validate, submit, run): the controller never refuses a
        spec for it, since a zone Google added after this table is real, and Google's answer decides."""
        return zones.problems(spec.zones, self.extra_zones)

    def violations(self, spec: JobSpec) -> list[str]:
        """One readable line per thing the spec asks for that this controller does not allow."""
        out = self._project(spec) + self._notify(spec)
        for i, zone in enumerate(spec.zones):
            if not _allowed(zone, self.allowed_zones):
                out.append(_refuse(f"zones.{i}", zone, self.allowed_zones))
        if spec.tpu is not None:
            return out + self._tpu(spec) + self._service_account(spec)
        assert spec.machine_type is not None  # the spec's own check: a VM job names one
        if not _allowed(spec.machine_type, self.allowed_machine_types):
            out.append(_refuse("machine_type", spec.machine_type, self.allowed_machine_types))
        out += self._service_account(spec)
        if spec.nodes > self.max_nodes:
            out.append(f"nodes: {spec.nodes} exceeds this controller's limit; use at most {self.max_nodes}")
        if spec.accelerators is None and built_in_gpus(spec.machine_type) is None and _GPU_FAMILY.match(spec.machine_type):
            # A newer GPU family (g4, a5...) would count as zero GPUs: refuse what cannot be counted.
            near = difflib.get_close_matches(spec.machine_type, BUILT_IN_GPUS, n=1, cutoff=0.8)
            fix = f"did you mean {near[0]!r}?" if near else \
                f"use one whose GPUs respawn knows (e.g. g2-standard-8, a3-highgpu-8g), or name its GPUs in accelerators"
            out.append(f"machine_type: {spec.machine_type!r} is no GPU machine type respawn knows, so its GPUs cannot be "
                       f"counted against this controller's limit of {self.max_accelerators}; {fix}")
        elif (total := spec.total_gpus) > self.max_accelerators:
            out.append(self._too_many_gpus(spec, total))
        return out

    def _project(self, spec: JobSpec) -> list[str]:
        project = self.project_of(spec)
        usable = tuple(p for p in (self.default_project, *self.allowed_projects) if p)
        if not project:
            return ["project: not given, and this controller has no default project; "
                    "name one in the spec or set RESPAWN_PROJECT"]
        if project not in self.watched_projects:
            choices = f"use one of: {', '.join(usable)}, or" if usable else "set RESPAWN_PROJECT, or"
            return [f"project: {project!r} is not watched by this controller (it would never see the VMs "
                    f"again); {choices} add it to RESPAWN_ALLOWED_PROJECTS"]
        if project not in usable:
            return [_refuse("project", project, usable)]
        return []

    def _service_account(self, spec: JobSpec) -> list[str]:
        email = self.service_account_of(spec)
        if email is None:
            return [f"service_account.email: not given, and this controller has no trainer service account; "
                    f"name one in the spec, or set {TRAINER_SETTING}"]
        if is_compute_default_account(email) and email not in self.allowed_service_accounts:
            return [f"service_account.email: {email!r} is the Compute Engine default service account, which "
                    "usually holds the Editor role on the whole project; use a dedicated trainer account "
                    f"({TRAINER_SETTING}), or list it by name in {ALLOWED_ACCOUNTS_SETTING}"]
        if not _allowed(email, self.service_accounts):
            return [_refuse("service_account.email", email, self.service_accounts)]
        return []

    def _notify(self, spec: JobSpec) -> list[str]:
        return self.notify_problems(spec.notify) if spec.notify is not None else []

    def notify_problems(self, notify: Notify) -> list[str]:
        """What this controller refuses of a job's own destinations (the spec's, or as a status
        recorded them: checked again at each delivery, against the policy as it is then)."""
        out = []
        topics = self.allowed_notify_topics or tuple(f"projects/{p}/topics/*" for p in self.watched_projects)
        if notify.topic and not _allowed(notify.topic, topics):
            out.append(_refuse("notify.topic", notify.topic, topics))
        if notify.webhook:
            try:
                url = urlsplit(notify.webhook)
                host, port = (url.hostname or "").lower().rstrip("."), url.port
            except ValueError:  # the spec's pattern leaves nothing urlsplit refuses; kept as a guard
                return [*out, "notify.webhook: not a URL respawn can read; use https://HOST/PATH"]
            loopback = host in ("127.0.0.1", "localhost") or host.endswith(".localhost")
            if loopback and not self.allow_loopback_webhooks:
                out.append("notify.webhook: a loopback host (localhost, 127.0.0.1) is the controller's own machine, "
                           "not yours; name a host your webhook is reachable at")
            elif url.scheme != "https" and not loopback:
                out.append(f"notify.webhook: {url.scheme}:// would send the job's events in clear; use https://")
            elif port not in (None, 443) and not loopback:
                out.append(f"notify.webhook: port {port}: only https's own (443) is allowed")
            elif not loopback and _numeric(host):
                out.append("notify.webhook: an address, not a host name; name the host")
            elif not loopback and not any(_host_matches(host, p) for p in self.allowed_webhook_hosts):
                out.append(_refuse("notify.webhook", host, self.allowed_webhook_hosts or ("none",)).replace(
                    "allowed:", "allowed hosts (RESPAWN_ALLOWED_WEBHOOK_HOSTS):"))
        return out

    def _tpu(self, spec: JobSpec) -> list[str]:
        assert spec.tpu is not None
        out = []
        # A Compute Engine slice is judged as the Cloud TPU type it amounts to (tpu7x-8: 8 chips).
        field, given = ("tpu.type", spec.tpu.type) if spec.tpu.type else ("tpu.topology", spec.tpu.accelerator)
        if not _allowed(spec.tpu.accelerator, self.allowed_tpu_types):
            out.append(_refuse(field, given, self.allowed_tpu_types))
        if spec.tpu.size > self.max_tpu_size:
            out.append(f"{field}: {given!r} is larger than this controller's limit of {self.max_tpu_size} "
                       f"(the number a type ends in: TensorCores, or chips for v5e, v6e and TPU7x); use a smaller "
                       f"slice, or raise RESPAWN_MAX_TPU_SIZE")
        return out

    def _too_many_gpus(self, spec: JobSpec, total: int) -> str:
        per_node = spec.gpus_per_node
        built_in = spec.accelerators is None and per_node is not None
        path = "machine_type" if built_in else "accelerators.count"
        how = f"{spec.machine_type} has {per_node[1]} built in" if built_in and per_node else "count per node"
        return (f"{path}: {total} GPUs in all ({spec.nodes} node(s) x {per_node[1] if per_node else 0}; {how}) "
                f"exceeds this controller's limit of {self.max_accelerators}; use fewer nodes or a smaller machine")


def _host_matches(host: str, pattern: str) -> bool:
    """A host against an allowlist glob, label by label: ``*`` stands for one label, never a dot,
    so ``*.slack.com`` admits ``hooks.slack.com`` but ``hooks.slack.com*`` admits no
    ``hooks.slack.com.attacker.example``."""
    labels, wanted = host.split("."), pattern.lower().rstrip(".").split(".")
    return len(labels) == len(wanted) and all(fnmatchcase(a, b) for a, b in zip(labels, wanted))


def _numeric(host: str) -> bool:
    """An address written as a host (``10.0.0.7``, ``2852039166``, ``0x7f.1``): its last label is
    a number, which no top-level domain is."""
    last = host.rsplit(".", 1)[-1]
    return last.isdigit() or bool(re.fullmatch(r"0x[0-9a-f]*", last))


def _allowed(value: str, patterns: tuple[str, ...]) -> bool:
    return not patterns or any(fnmatchcase(value, p) for p in patterns)


def _refuse(path: str, value: str, allowed: tuple[str, ...]) -> str:
    return f"{path}: {value!r} is not allowed by this controller; allowed: {', '.join(allowed)}"
