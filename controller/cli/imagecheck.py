"""``respawn doctor SPEC``'s look at a spec's container image (``image:``): on Artifact Registry
(``LOCATION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE``), that its repository and its tag (or digest)
exist, and that the account the VM runs as may pull it; anywhere else, what is not checked and why.

Who may pull is judged as IAM grants it: ``artifactregistry.repositories.downloadArtifacts`` through
a role (its permissions read from IAM: ``grants.Roles``) bound, without a condition, on the
repository or on its project, or the repository public (``allUsers``, ``allAuthenticatedUsers``).
Grants through groups, folders or the organization are not in the policies read; doctor says so
rather than guess. Each judgment is a ``Finding``; ``controller.cli.doctor`` turns it into a line.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from controller.cli import deploy, grants
from controller.core import errors, imageref
from controller.core.imageref import ArtifactImage

PUBLIC = ("allUsers", "allAuthenticatedUsers")


class Registry(Protocol):
    """What these checks read (a part of ``controller.cli.doctor.Apis``)."""

    def repository(self, name: str) -> Mapping[str, Any]: ...
    def repository_policy(self, name: str) -> Sequence[Mapping[str, Any]]: ...
    def image_tag(self, name: str) -> Mapping[str, Any]: ...
    def image_version(self, name: str) -> Mapping[str, Any]: ...
    def project_policy(self, project: str) -> Sequence[Mapping[str, Any]]: ...


@dataclass(frozen=True)
class Finding:
    ok: bool
    detail: str
    fix: str = ""
    note: bool = False  # a ✓ said with a reservation (not checked, or not fully)


def target(image: str) -> ArtifactImage | Finding:
    """The Artifact Registry image ``image`` names, or the finding that stands for the checks: a
    reference that is none (✗), or an image elsewhere (said, not checked)."""
    try:
        ref = imageref.parse(image)
        found = imageref.artifact(ref)
    except ValueError as e:
        return Finding(False, f"cannot read the spec's image: {e}", "fix image: in the spec (respawn validate)")
    if found is None:
        return Finding(True, f"{ref} is not on Artifact Registry: not checked (doctor reads Artifact Registry's "
                             f"LOCATION-docker.pkg.dev repositories only; whether {ref.host} has it, and lets the VM "
                             "pull it, shows at the VM's pull)", note=True)
    return found


def exists(apis: Registry, image: ArtifactImage) -> Finding:
    """The repository, then the tag (or digest), exist."""
    where = f"--location={image.location} --project={image.project}"
    try:
        apis.repository(image.repository_name)
    except errors.NotFound:
        return Finding(False, f"repository {image.repository_name} does not exist (or you may not see it)",
                       f"gcloud artifacts repositories list {where}  # then fix image:, or create it: "
                       f"gcloud artifacts repositories create {image.repository} --repository-format=docker {where}")
    try:
        if image.digest:
            apis.image_version(f"{image.package_name}/versions/{image.digest}")
            return Finding(True, f"{image} exists")
        found = apis.image_tag(f"{image.package_name}/tags/{image.reference}")
    except errors.NotFound:
        which = f"digest {image.digest}" if image.digest else f"tag {image.reference}"
        return Finding(False, f"{image.uri} has no {which}: no VM can pull {image}",
                       f"gcloud artifacts docker images list {shlex.quote(image.uri)} --include-tags  "
                       "# then fix image: in the spec, or push it")
    digest = str(found.get("version", "")).rpartition("/versions/")[2]
    return Finding(True, f"{image} exists" + (f" ({digest})" if digest else ""))


def may_pull(apis: Registry, roles: grants.Roles, image: ArtifactImage, account: str | None) -> Finding:
    """``account`` holds downloadArtifacts on the image's repository (its policy or its project's)."""
    if not account:
        return Finding(False, "the spec names no service account and the controller has no trainer account",
                       "set RESPAWN_TRAINER_SERVICE_ACCOUNT, or service_account.email in the spec")
    member = f"serviceAccount:{account}"
    repo_unread = project_unread = ""
    try:
        on_repo: Sequence[Mapping[str, Any]] | None = apis.repository_policy(image.repository_name)
    except errors.NotFound:
        return Finding(True, f"not judged: {image.repository_name} does not exist (see the container image check)", note=True)
    except Exception as e:  # noqa: BLE001 - said below: judged by the project's policy alone
        on_repo, repo_unread = None, _said(e)
    try:
        on_project: Sequence[Mapping[str, Any]] | None = apis.project_policy(image.project)
    except Exception as e:  # noqa: BLE001
        on_project, project_unread = None, _said(e)
    for where, policy in ((image.repository_name, on_repo), (f"project {image.project}", on_project)):
        if policy is None:
            continue
        public = [m for m, role in grants.members_with(roles, grants.PULL[0], policy).items() if m in PUBLIC]
        if public:
            return Finding(True, f"{image.repository_name} is public ({public[0]} may pull from {where})")
        found = grants.held(roles, member, grants.PULL, policy)
        if not found.missing(grants.PULL):
            return Finding(True, f"{account} may pull it ({found.roles(grants.PULL)[0]} on {where})")
    fix = (f"gcloud artifacts repositories add-iam-policy-binding {image.repository} --location={image.location} "
           f"--project={image.project} --member={member} --role={deploy.TRAINER_REGISTRY_ROLE}")
    unread = [f"{image.repository_name}'s policy ({repo_unread})" if on_repo is None else "",
              f"project {image.project}'s policy ({project_unread})" if on_project is None else ""]
    if any(unread):
        return Finding(True, f"not judged: could not read {' nor '.join(u for u in unread if u)}; neither read grants "
                             f"{account} {grants.PULL[0]}", fix, note=True)
    return Finding(False, f"{account} (the account its VMs run as) lacks {grants.PULL[0]} on {image.repository_name}: "
                          "its pull is denied (grants through groups, folders or the organization are not read)", fix)


def _said(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text if isinstance(error, errors.RespawnError) else f"{type(error).__name__}: {text}"
