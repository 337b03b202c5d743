"""The controller-wide policy: what any spec may ask for.

Set by whoever deploys the controller (environment of the functions), it bounds every
user's spec so that a typo or a hostile spec cannot start 64 A100s in a foreign project.
Patterns use shell globs (``us-central1-*``, ``a2-*``); an empty list allows anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from controller.spec import JobSpec


@dataclass(frozen=True)
class ControllerPolicy:
    default_project: str
    allowed_projects: tuple[str, ...] = ()
    allowed_zones: tuple[str, ...] = ()
    allowed_machine_types: tuple[str, ...] = ()
    allowed_service_accounts: tuple[str, ...] = ()
    max_nodes: int = 8
    max_accelerators: int = 16
    projects_to_watch: tuple[str, ...] = field(default=())

    @property
    def watched_projects(self) -> tuple[str, ...]:
        """Where managed instances may live, so orphans are found in every one of them."""
        return tuple(dict.fromkeys((self.default_project, *self.allowed_projects, *self.projects_to_watch)))

    def project_of(self, spec: JobSpec) -> str:
        return spec.project or self.default_project

    def violations(self, spec: JobSpec) -> list[str]:
        """One readable line per thing the spec asks for that this controller does not allow."""
        out: list[str] = []
        project = self.project_of(spec)
        if self.allowed_projects and project not in (*self.allowed_projects, self.default_project):
            out.append(_refuse("project", project, (self.default_project, *self.allowed_projects)))
        for i, zone in enumerate(spec.zones):
            if not _allowed(zone, self.allowed_zones):
                out.append(_refuse(f"zones.{i}", zone, self.allowed_zones))
        if not _allowed(spec.machine_type, self.allowed_machine_types):
            out.append(_refuse("machine_type", spec.machine_type, self.allowed_machine_types))
        email = spec.service_account.email
        if not _allowed(email, self.allowed_service_accounts):
            out.append(_refuse("service_account.email", email, self.allowed_service_accounts))
        if spec.nodes > self.max_nodes:
            out.append(f"nodes: {spec.nodes} exceeds this controller's limit; use at most {self.max_nodes}")
        total = spec.nodes * (spec.accelerators.count if spec.accelerators else 0)
        if total > self.max_accelerators:
            out.append(
                f"accelerators.count: {total} accelerators in all (nodes x count) exceeds this "
                f"controller's limit of {self.max_accelerators}"
            )
        return out


def _allowed(value: str, patterns: tuple[str, ...]) -> bool:
    return not patterns or any(fnmatchcase(value, p) for p in patterns)


def _refuse(path: str, value: str, allowed: tuple[str, ...]) -> str:
    return f"{path}: {value!r} is not allowed by this controller; allowed: {', '.join(allowed)}"
