"""Artifact Registry as respawn doctor reads it, the same tests against the in-memory project
(controller.adapters.memory_doctor) and Google's client over the local stand-in (localcloud.registry_api
serving the images localcloud.registry holds): a repository, a tag, a version, a nested image name,
the repository's policy, and NotFound where Google answers 404. Plus the stand-in's own routes, its
setIamPolicy, and the project policy respawn deploy's grants live in (Resource Manager's setIamPolicy)."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests

from controller.adapters.doctor import GoogleApis
from controller.adapters.memory_doctor import MemoryProject
from controller.cli import deploy
from controller.core import errors
from controller.service.config import Settings
from localcloud.apis import Deployment, IamServer, ResourceManagerServer
from localcloud.registry import Registry
from localcloud.registry_api import ArtifactRegistryServer
from tests.routes import assert_serves_exactly

PROJECT, REGION, BUCKET = "respawn-local", "us-central1", "respawn-local"
REPO = f"projects/{PROJECT}/locations/us-central1/repositories/images"
TRAINER = deploy.account_email(deploy.TRAINER_ACCOUNT_ID, PROJECT)


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rootfs") / "rootfs.tar"
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("etc/hello")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"hi\n"))
    return path


@pytest.fixture(scope="module")
def local(rootfs) -> Iterator[dict[str, Any]]:
    d = Deployment(PROJECT, REGION, BUCKET)
    manager, iam = ResourceManagerServer(d).start(), IamServer(d).start()
    registry = Registry(project_policy=manager.policy).start()
    api = ArtifactRegistryServer(d, registry).start()
    yield {"registry": registry, "api": api, "resourcemanager": manager, "iam": iam}
    for server in (api, registry, manager, iam):
        server.stop()


Backend = tuple[Any, Callable[[str], str], Callable[[str, list[dict[str, Any]]], None]]


@pytest.fixture(params=["memory", "local"])
def backend(request, rootfs) -> Backend:
    """(what doctor reads, push an image -> its digest, set a repository's bindings)."""
    if request.param == "memory":
        project = MemoryProject.deployed(PROJECT, BUCKET, REGION, datetime(2026, 1, 5, tzinfo=UTC))
        def grant(name: str, bindings: list[dict[str, Any]]) -> None:
            project.repositories[name] = bindings
        return project, lambda image: project.push(image, "sha256:" + "ab" * 32), grant
    servers = request.getfixturevalue("local")
    apis = GoogleApis(Settings(project=PROJECT, bucket=BUCKET, compute_endpoint="http://127.0.0.1:9",
                               artifactregistry_endpoint=servers["api"].endpoint,
                               resourcemanager_endpoint=servers["resourcemanager"].endpoint,
                               iam_endpoint=servers["iam"].endpoint), timeout=10)

    def grant(name: str, bindings: list[dict[str, Any]]) -> None:
        url = f"{servers['api'].endpoint}/v1/{name}"
        etag = requests.get(f"{url}:getIamPolicy", timeout=5).json()["etag"]
        requests.post(f"{url}:setIamPolicy", json={"policy": {"etag": etag, "bindings": bindings}},
                      timeout=5).raise_for_status()
    return apis, lambda image: servers["registry"].push_rootfs(image, rootfs), grant


def test_a_pushed_image_s_repository_tag_and_version_read_alike(backend):
    apis, push, _ = backend
    digest = push("us-central1-docker.pkg.dev/respawn-local/images/team/trainer:v1")
    package = f"{REPO}/packages/team%2Ftrainer"  # a nested image's "/" is escaped in its package id
    assert apis.repository(REPO)["name"] == REPO
    assert apis.image_tag(f"{package}/tags/v1")["version"] == f"{package}/versions/{digest}"
    assert apis.image_version(f"{package}/versions/{digest}")["name"] == f"{package}/versions/{digest}"
    for missing in (lambda: apis.image_tag(f"{package}/tags/v2"),
                    lambda: apis.image_version(f"{package}/versions/sha256:{'0' * 64}"),
                    lambda: apis.image_tag(f"{REPO}/packages/other/tags/v1"),
                    lambda: apis.repository(f"projects/{PROJECT}/locations/us-central1/repositories/nope"),
                    lambda: apis.repository_policy(f"projects/{PROJECT}/locations/europe/repositories/images")):
        with pytest.raises(errors.NotFound):
            missing()


def test_a_repository_s_policy_reads_empty_then_as_set_and_the_project_holds_deploy_s_grant(backend):
    apis, push, grant = backend
    push("us-central1-docker.pkg.dev/respawn-local/images/trainer:v1")
    assert apis.repository_policy(REPO) == []
    binding = {"role": "roles/artifactregistry.reader", "members": [f"serviceAccount:{TRAINER}"]}
    grant(REPO, [binding])
    try:
        assert apis.repository_policy(REPO) == [binding]
    finally:
        grant(REPO, [])
    assert binding in apis.project_policy(PROJECT)
    assert set(apis.role("roles/artifactregistry.reader")["includedPermissions"]) >= {
        "artifactregistry.repositories.downloadArtifacts"}


def test_the_stand_in_serves_its_methods_and_501s_every_other_of_its_document(local):
    assert_serves_exactly(local["api"].endpoint, local["api"].DOC, local["api"].SUPPORTED)


def test_set_iam_policy_refuses_a_stale_etag_and_a_field_the_document_does_not_have(local, rootfs):
    local["registry"].push_rootfs("us-central1-docker.pkg.dev/respawn-local/images/etag:v1", rootfs)
    url = f"{local['api'].endpoint}/v1/{REPO}"
    etag = requests.get(f"{url}:getIamPolicy", timeout=5).json()["etag"]
    made = requests.post(f"{url}:setIamPolicy", json={"policy": {"etag": etag, "bindings": []}}, timeout=5)
    assert made.ok and made.json()["etag"] != etag
    stale = requests.post(f"{url}:setIamPolicy", json={"policy": {"etag": etag, "bindings": []}}, timeout=5)
    assert stale.status_code == 409 and stale.json()["error"]["status"] == "ABORTED"
    bogus = requests.post(f"{url}:setIamPolicy", json={"policy": {"bogus": 1}}, timeout=5)
    assert bogus.status_code == 400 and 'Unknown name "bogus"' in bogus.json()["error"]["message"]


def test_gcloud_s_listing_of_docker_images_shows_each_digest_with_its_tags(local, rootfs):
    digest = local["registry"].push_rootfs("us-central1-docker.pkg.dev/respawn-local/images/listed:v3", rootfs)
    listed = requests.get(f"{local['api'].endpoint}/v1/{REPO}/dockerImages", timeout=5).json()["dockerImages"]
    (found,) = [i for i in listed if i["name"].endswith(f"/dockerImages/listed@{digest}")]
    assert found["uri"] == f"us-central1-docker.pkg.dev/respawn-local/images/listed@{digest}" and found["tags"] == ["v3"]
    one = requests.get(f"{local['api'].endpoint}/v1/{REPO}/dockerImages/listed@{digest}", timeout=5).json()
    assert one == found


def test_the_project_policy_changes_through_set_iam_policy_as_gcloud_makes_it(local):
    url = f"{local['resourcemanager'].endpoint}/v3/projects/{PROJECT}"
    policy = requests.post(f"{url}:getIamPolicy", json={}, timeout=5).json()
    reader = {"role": deploy.TRAINER_REGISTRY_ROLE, "members": [f"serviceAccount:{TRAINER}"]}
    assert reader in policy["bindings"]
    kept = [b for b in policy["bindings"] if b != reader]
    made = requests.post(f"{url}:setIamPolicy", json={"policy": {"etag": policy["etag"], "bindings": kept}}, timeout=5)
    try:
        assert made.ok and reader not in local["resourcemanager"].policy(PROJECT)
        stale = requests.post(f"{url}:setIamPolicy", json={"policy": {"etag": policy["etag"], "bindings": []}},
                              timeout=5)
        assert stale.status_code == 409
    finally:
        now = requests.post(f"{url}:getIamPolicy", json={}, timeout=5).json()
        requests.post(f"{url}:setIamPolicy", json={"policy": {"etag": now["etag"], "bindings": [*kept, reader]}},
                      timeout=5).raise_for_status()
    assert reader in local["resourcemanager"].policy(PROJECT)
