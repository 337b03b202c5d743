"""Artifact Registry's REST API (v1) over the local registry's repositories (``localcloud.registry``):
the subset ``respawn doctor`` and gcloud read, and the repository policy tests change.

Built like the other stand-ins of ``localcloud.apis`` on Google's discovery document
(``artifactregistry.v1.json``): routes, request validation, one-platform errors, 501 for a method it
does not serve. Served: ``projects.locations.repositories`` ``get``, ``list``, ``getIamPolicy``,
``setIamPolicy``; ``packages.get``, ``packages.tags.get`` and ``list``, ``packages.versions.get``
(how the API tells whether an image has a tag or a digest: an image is a package, a tag a
``Tag`` whose ``version`` names the digest, a digest a ``Version``); ``dockerImages.get`` and
``list`` (what ``gcloud artifacts docker images list`` calls). A package id holding ``/`` (a nested
image name) is escaped in paths (``packages/team%2Ftrainer``), as the API's resource names say:
routes are matched on the raw request path, so ``%2F`` stays within one segment.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from flask import request

from localcloud.apis import ApiError, Deployment, DiscoveryServer, concurrent_change
from localcloud.registry import Registry, Repository, Stored

NOT_FOUND = "Requested entity was not found."


def _id(segment: str) -> str:
    """A path segment as an id: unescaped until it stays the same. gcloud escapes the "%" of a package
    id's escaped "/" once more (``team%252Ftrainer``), google-api-python-client does not
    (``team%2Ftrainer``); Artifact Registry takes both. No id of it holds a "%" of its own."""
    while (plain := unquote(segment)) != segment:
        segment = plain
    return segment
_WITH_COLONS = re.compile(r"\(\?P<(versionsId|dockerImagesId)>\[\^/:\]\+\)")


class ArtifactRegistryServer(DiscoveryServer):
    DOC, name = "artifactregistry.v1", "artifactregistry"
    SUPPORTED = {"projects.locations.repositories": ("get", "list", "getIamPolicy", "setIamPolicy"),
                 "projects.locations.repositories.packages": ("get",),
                 "projects.locations.repositories.packages.tags": ("get", "list"),
                 "projects.locations.repositories.packages.versions": ("get", "list"),
                 "projects.locations.repositories.dockerImages": ("get", "list")}

    def __init__(self, deployment: Deployment, registry: Registry) -> None:
        super().__init__(deployment)
        self.registry = registry
        # A version id is a digest (sha256:...), a docker image id IMAGE@sha256:...: a ":" inside them
        # is no custom method's (those follow a resource id: repositories/R:getIamPolicy).
        self._routes = [(dataclasses.replace(m, pattern=re.compile(_WITH_COLONS.sub(r"(?P<\1>[^/]+)", m.pattern.pattern))),
                         served) for m, served in self._routes]

    def _path(self, path: str) -> str:
        """As sent: a package id holds "/" escaped once (%2F) or twice (gcloud), which Flask would decode."""
        return urlsplit(request.environ.get("REQUEST_URI") or request.full_path).path.lstrip("/")

    # -- repositories ------------------------------------------------------------------------------
    def _repo(self, p: dict[str, str]) -> Repository:
        found = self.registry.repository(_id(p["projectsId"]), _id(p["locationsId"]),
                                         _id(p["repositoriesId"]))
        if found is None:
            raise ApiError(404, NOT_FOUND)
        return found

    def _repository(self, repo: Repository) -> dict[str, Any]:
        with self.registry.lock:
            size = sum(self.registry.blobs.path(b).stat().st_size for s in repo.images.values() for b in s.blobs
                       if self.registry.blobs.has(b))
        return {"name": repo.name, "format": "DOCKER", "mode": "STANDARD_REPOSITORY", "description": repo.description,
                "createTime": repo.created, "updateTime": repo.created, "sizeBytes": str(size),
                "registryUri": f"{repo.location}-docker.pkg.dev/{repo.project}/{repo.repository}"}

    def _repositories_get(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        return self._repository(self._repo(p))

    def _repositories_list(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        project, location = _id(p["projectsId"]), _id(p["locationsId"])
        with self.registry.lock:
            found = [r for (pr, loc, _), r in sorted(self.registry.repositories.items()) if (pr, loc) == (project, location)]
        return {"repositories": [self._repository(r) for r in found]} if found else {}

    def _repositories_getIamPolicy(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        repo = self._repo(p)
        with self.registry.lock:
            return {"version": 1, "etag": repo.etag, **({"bindings": copy.deepcopy(repo.bindings)} if repo.bindings else {})}

    def _repositories_setIamPolicy(self, p: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        repo = self._repo(p)
        policy = body.get("policy") or {}
        with self.registry.lock:
            if policy.get("etag") not in (None, "", repo.etag):
                raise concurrent_change()
            etag = self.registry.set_policy(repo.project, repo.location, repo.repository,
                                            [b for b in policy.get("bindings") or [] if b.get("members")])
            return {"version": policy.get("version", 1), "etag": etag,
                    **({"bindings": copy.deepcopy(repo.bindings)} if repo.bindings else {})}

    # -- images: packages, tags, versions, docker images ---------------------------------------------
    def _stored(self, p: dict[str, str]) -> tuple[Repository, str, Stored]:
        repo = self._repo(p)
        image = _id(p["packagesId"] if "packagesId" in p else p["dockerImagesId"])
        with self.registry.lock:
            stored = repo.images.get(image)
        if stored is None:
            raise ApiError(404, NOT_FOUND)
        return repo, image, stored

    def _package_name(self, repo: Repository, image: str) -> str:
        return f"{repo.name}/packages/{quote(image, safe='')}"

    def _packages_get(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        repo, image, stored = self._stored(p)
        return {"name": self._package_name(repo, image), "displayName": image, "createTime": stored.created,
                "updateTime": stored.updated}

    def _tag(self, repo: Repository, image: str, tag: str, digest: str) -> dict[str, Any]:
        package = self._package_name(repo, image)
        return {"name": f"{package}/tags/{tag}", "version": f"{package}/versions/{digest}"}

    def _tags_get(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        repo, image, stored = self._stored(p)
        tag = _id(p["tagsId"])
        with self.registry.lock:
            digest = stored.tags.get(tag)
        if digest is None:
            raise ApiError(404, NOT_FOUND)
        return self._tag(repo, image, tag, digest)

    def _tags_list(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        repo, image, stored = self._stored(p)
        with self.registry.lock:
            tags = sorted(stored.tags.items())
        return {"tags": [self._tag(repo, image, t, d) for t, d in tags]} if tags else {}

    def _versions_get(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        repo, image, stored = self._stored(p)
        with self.registry.lock:
            if _id(p["versionsId"]) not in stored.manifests:
                raise ApiError(404, NOT_FOUND)
            return self._version(repo, image, stored, _id(p["versionsId"]))

    def _versions_list(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        repo, image, stored = self._stored(p)
        with self.registry.lock:
            found = [self._version(repo, image, stored, digest) for digest in stored.manifests]
        return {"versions": found} if found else {}

    def _version(self, repo: Repository, image: str, stored: Stored, digest: str) -> dict[str, Any]:
        media_type, _, uploaded = stored.manifests[digest]
        tags = sorted(t for t, d in stored.tags.items() if d == digest)
        package = self._package_name(repo, image)
        version: dict[str, Any] = {"name": f"{package}/versions/{digest}", "createTime": uploaded,
                                   "updateTime": uploaded,
                                   "metadata": {"mediaType": media_type, "imageSizeBytes": str(self._size(stored, digest)),
                                                "name": self._docker_name(repo, image, digest)}}
        if request.args.get("view") == "FULL":
            version["relatedTags"] = [self._tag(repo, image, t, digest) for t in tags]
        return version

    def _docker_name(self, repo: Repository, image: str, digest: str) -> str:
        return f"{repo.name}/dockerImages/{quote(image, safe='')}@{digest}"

    def _size(self, stored: Stored, digest: str) -> int:
        manifest = json.loads(stored.manifests[digest][1])
        return int(manifest.get("config", {}).get("size", 0)) + sum(int(x.get("size", 0)) for x in manifest.get("layers", []))

    def _docker_image(self, repo: Repository, image: str, stored: Stored, digest: str) -> dict[str, Any]:
        media_type, _, uploaded = stored.manifests[digest]
        return {"name": self._docker_name(repo, image, digest),
                "uri": f"{repo.location}-docker.pkg.dev/{repo.project}/{repo.repository}/{image}@{digest}",
                "tags": sorted(t for t, d in stored.tags.items() if d == digest), "mediaType": media_type,
                "imageSizeBytes": str(self._size(stored, digest)), "uploadTime": uploaded, "updateTime": uploaded}

    def _dockerImages_get(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        image, _, digest = _id(p["dockerImagesId"]).rpartition("@")
        if not image or not digest.startswith("sha256:"):
            raise ApiError(400, "Invalid docker image name: want IMAGE@sha256:DIGEST (the image's name escaped).")
        repo, _, stored = self._stored({**p, "dockerImagesId": image})
        with self.registry.lock:
            if digest not in stored.manifests:
                raise ApiError(404, NOT_FOUND)
            return self._docker_image(repo, image, stored, digest)

    def _dockerImages_list(self, p: dict[str, str], body: Any) -> dict[str, Any]:
        repo = self._repo(p)
        with self.registry.lock:
            found = [self._docker_image(repo, image, stored, digest)
                     for image, stored in sorted(repo.images.items()) for digest in stored.manifests]
        return {"dockerImages": found} if found else {}
