"""Who may do what, as ``respawn doctor`` judges it: the permissions a principal holds through the
allow policies it reads (a project's, a bucket's, a Cloud Run service's), each role's permissions
read from IAM itself (``roles.get`` for a predefined role, ``projects.roles.get`` for a custom one),
never from a table of ours: a custom role is judged by what it grants, as a predefined one.

What it cannot see, it says rather than guesses: a grant through a group, or inherited from a
folder or the organization, is not in the policies read; a binding with a condition is left out
(it may not hold for the request); a role IAM would not describe is named as unread.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Policy = Sequence[Mapping[str, Any]]  # an allow policy's bindings (policy version 3)

# What respawn's identities need (deploy/IAM.md). The controller's Compute: the narrower custom
# role IAM.md names for roles/compute.instanceAdmin.v1; its TPU: likewise for roles/tpu.admin.
COMPUTE = ("compute.instances.create", "compute.instances.delete", "compute.instances.get", "compute.instances.list",
           "compute.instances.setMetadata", "compute.instances.setLabels", "compute.instances.setServiceAccount",
           "compute.zoneOperations.get", "compute.zoneOperations.list", "compute.regionOperations.get",
           "compute.disks.create", "compute.subnetworks.use", "compute.subnetworks.useExternalIp")
# TPU slices in Compute Engine (a multi-host one: a workload policy, an instance template, a MIG); in
# roles/compute.instanceAdmin.v1 too.
SLICES = ("compute.instanceGroupManagers.create", "compute.instanceGroupManagers.delete",
          "compute.instanceGroupManagers.get", "compute.instanceGroupManagers.list",
          "compute.instanceTemplates.create", "compute.instanceTemplates.delete", "compute.instanceTemplates.get",
          "compute.instanceTemplates.list", "compute.instanceTemplates.useReadOnly", "compute.resourcePolicies.create",
          "compute.resourcePolicies.get", "compute.resourcePolicies.use", "compute.globalOperations.get")
TPU = ("tpu.nodes.create", "tpu.nodes.delete", "tpu.nodes.get", "tpu.nodes.list", "tpu.queuedResources.create",
       "tpu.queuedResources.delete", "tpu.queuedResources.get", "tpu.queuedResources.list", "tpu.operations.get")
INVOKE = ("run.routes.invoke",)  # a gen2 function is called through its Cloud Run service
RECEIVE = ("eventarc.events.receiveEvent",)
PUBLISH = ("pubsub.topics.publish",)
OBJECTS = ("storage.objects.create", "storage.objects.delete", "storage.objects.get", "storage.objects.list")
READ_OBJECTS = ("storage.objects.get",)
LIST_OBJECTS = ("storage.objects.get", "storage.objects.list")  # the controller's look for a job's latest checkpoint
OIDC_TOKEN = ("iam.serviceAccounts.getOpenIdToken",)
PULL = ("artifactregistry.repositories.downloadArtifacts",)  # a VM pulling a spec's image from Artifact Registry


@dataclass
class Roles:
    """Each role's permissions, read once per doctor run however many checks ask, side by side."""

    read: Callable[[str], Mapping[str, Any]]  # IAM's Role resource of a role name
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _known: dict[str, concurrent.futures.Future[frozenset[str]]] = field(default_factory=dict)

    def permissions(self, role: str) -> frozenset[str]:
        """What ``role`` grants (nothing once deleted); raises what reading it raised."""
        with self._lock:
            future = self._known.get(role)
            mine = future is None
            if future is None:
                future = self._known[role] = concurrent.futures.Future()
        if mine:
            try:
                found = self.read(role)
                granted = () if found.get("deleted") else found.get("includedPermissions") or ()
                future.set_result(frozenset(granted))
            except Exception as e:  # noqa: BLE001 - each asker sees it (held() names the role unread)
                future.set_exception(e)
        return future.result()


@dataclass(frozen=True)
class Held:
    """What a principal holds through some policies: each permission wanted, by the role granting it."""

    granted: dict[str, str]  # permission -> the role that grants it
    unread: tuple[str, ...] = ()  # roles the principal holds that IAM would not describe

    def missing(self, wanted: Iterable[str]) -> list[str]:
        return [p for p in wanted if p not in self.granted]

    def roles(self, wanted: Iterable[str]) -> list[str]:
        return list(dict.fromkeys(self.granted[p] for p in wanted if p in self.granted))


def held(roles: Roles, member: str, wanted: Iterable[str], *policies: Policy) -> Held:
    """The permissions of ``wanted`` that ``member`` holds, unconditioned, through ``policies``."""
    wanted = tuple(wanted)
    granted: dict[str, str] = {}
    unread: list[str] = []
    for role in dict.fromkeys(r for policy in policies for r in roles_of(member, policy)):
        try:
            permissions = roles.permissions(role)
        except Exception:  # noqa: BLE001 - said by the caller: never a guess either way
            unread.append(role)
            continue
        for permission in wanted:
            if permission in permissions:
                granted.setdefault(permission, role)
    return Held(granted, tuple(unread))


def roles_of(member: str, policy: Policy) -> list[str]:
    """The roles ``policy`` grants ``member`` without a condition."""
    return [str(b.get("role", "")) for b in policy if member in (b.get("members") or ()) and not b.get("condition")]


def members_with(roles: Roles, wanted: str, *policies: Policy) -> dict[str, str]:
    """Every member any of ``policies`` grants ``wanted`` to, unconditioned, with the role granting it
    (roles IAM would not describe are left out: see ``held``)."""
    found: dict[str, str] = {}
    for policy in policies:
        for binding in policy:
            if binding.get("condition"):
                continue
            role = str(binding.get("role", ""))
            try:
                grants = wanted in roles.permissions(role)
            except Exception:  # noqa: BLE001
                continue
            for member in binding.get("members") or ():
                if grants:
                    found.setdefault(str(member), role)
    return found
