"""The local Artifact Registry's Docker endpoint (localcloud.registry) at the HTTP level, reached as podman
reaches it: through the proxy that speaks TLS as LOCATION-docker.pkg.dev (its certificate verified), the
Docker Registry API V2's token dance, Artifact Registry's errors in its own words, IAM as the local
cloud models it. tests/containers does the same with real podman."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import socket
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from localcloud.registry import READ, Registry

HOST = "us-central1-docker.pkg.dev"
IMAGE = f"{HOST}/proj/repo/trainer"
TRAINER, OTHER = "trainer@proj.iam.gserviceaccount.com", "other@proj.iam.gserviceaccount.com"
TOKENS = {"ya29.trainer": TRAINER, "ya29.other": OTHER}
READER = {"role": "roles/artifactregistry.reader", "members": [f"serviceAccount:{TRAINER}"]}
ACCEPT = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
DENIED = (f'Permission "{READ}" denied on resource "projects/proj/locations/us-central1/repositories/repo" '
          "(or it may not exist)")


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rootfs") / "rootfs.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in (("etc/hello", b"hello from the image\n"), ("bin/run", b"#!/bin/sh\necho hi\n")):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(scope="module")
def project() -> dict[str, list[dict]]:
    """The project policies the registry reads (deploy's grant to the trainer on proj)."""
    return {"proj": [READER]}


@pytest.fixture(scope="module")
def registry(rootfs, project) -> Iterator[Registry]:
    with Registry(accounts=TOKENS.get, project_policy=lambda p: project.get(p, [])) as reg:
        reg.push_rootfs(f"{IMAGE}:v1", rootfs, cmd=["/bin/run"], env={"LANG": "C.UTF-8"}, workdir="/work")
        yield reg


@pytest.fixture
def http(registry) -> requests.Session:
    """A client that reaches HOST as podman does: through the registry's proxy, its certificate trusted."""
    session = requests.Session()
    session.trust_env = False
    session.proxies = {"https": registry.proxy.url}
    session.verify = str(registry.proxy.cert)
    return session


def trade(http: requests.Session, access_token: str | None = "ya29.trainer", path: str = "proj/repo/trainer",
          user: str = "oauth2accesstoken") -> requests.Response:
    """The token request podman makes after the ping: the VM's access token as the Basic password."""
    return http.get(f"https://{HOST}/v2/token", params={"service": HOST, "scope": f"repository:{path}:pull"},
                    auth=(user, access_token) if access_token else None, timeout=10)


def bearer(http: requests.Session, **kw) -> dict[str, str]:
    answer = trade(http, **kw)
    assert answer.status_code == 200, answer.text
    return {"Authorization": f"Bearer {answer.json()['token']}", "Accept": ACCEPT}


def error(answer: requests.Response) -> tuple[int, str, str]:
    (found,) = answer.json()["errors"]
    return answer.status_code, found["code"], found["message"]


def test_the_ping_asks_for_a_bearer_token_from_the_hosts_token_endpoint(http):
    ping = http.get(f"https://{HOST}/v2/", timeout=10)
    assert ping.status_code == 401 and ping.headers["Docker-Distribution-API-Version"] == "registry/2.0"
    assert ping.headers["WWW-Authenticate"] == f'Bearer realm="https://{HOST}/v2/token",service="{HOST}"'
    assert error(ping) == (401, "UNAUTHORIZED", "not authenticated: No valid credential was supplied.")
    assert http.get(f"https://{HOST}/v2/", headers=bearer(http), timeout=10).status_code == 200


def test_a_vm_token_pulls_the_image_made_from_the_root_filesystem_tar(http, registry, rootfs):
    token = trade(http).json()
    assert token["token"] == token["access_token"] and token["expires_in"] > 0 and token["issued_at"].endswith("Z")
    headers = bearer(http)
    manifest = http.get(f"https://{HOST}/v2/proj/repo/trainer/manifests/v1", headers=headers, timeout=10)
    assert manifest.status_code == 200
    assert manifest.headers["Content-Type"] == "application/vnd.docker.distribution.manifest.v2+json"
    digest = f"sha256:{hashlib.sha256(manifest.content).hexdigest()}"
    assert manifest.headers["Docker-Content-Digest"] == digest
    body = manifest.json()
    assert body["schemaVersion"] == 2 and body["config"]["mediaType"] == "application/vnd.docker.container.image.v1+json"
    (layer,) = body["layers"]
    assert layer["mediaType"] == "application/vnd.docker.image.rootfs.diff.tar.gzip"
    blobs = {}
    for ref in (body["config"], layer):
        blob = http.get(f"https://{HOST}/v2/proj/repo/trainer/blobs/{ref['digest']}", headers=headers, timeout=10)
        assert blob.status_code == 200 and blob.headers["Docker-Content-Digest"] == ref["digest"]
        assert f"sha256:{hashlib.sha256(blob.content).hexdigest()}" == ref["digest"] and len(blob.content) == ref["size"]
        blobs[ref["digest"]] = blob.content
    config = json.loads(blobs[body["config"]["digest"]])
    tar = rootfs.read_bytes()
    assert config["rootfs"] == {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(tar).hexdigest()}"]}
    assert config["os"] == "linux" and config["architecture"] in ("amd64", "arm64")
    assert config["config"] == {"Cmd": ["/bin/run"], "Env": ["LANG=C.UTF-8"], "WorkingDir": "/work"}
    assert gzip.decompress(blobs[layer["digest"]]) == tar  # the layer is the tar itself
    head = http.head(f"https://{HOST}/v2/proj/repo/trainer/manifests/v1", headers=headers, timeout=10)
    assert head.status_code == 200 and head.headers["Docker-Content-Digest"] == digest and not head.content
    assert int(head.headers["Content-Length"]) == len(manifest.content)
    by_digest = http.get(f"https://{HOST}/v2/proj/repo/trainer/manifests/{digest}", headers=headers, timeout=10)
    assert by_digest.content == manifest.content


def test_pushing_the_same_tar_again_changes_nothing_and_other_settings_make_another_image(registry, rootfs):
    first = registry.push_rootfs(f"{IMAGE}:again", rootfs, cmd=["/bin/run"], env={"LANG": "C.UTF-8"}, workdir="/work")
    assert registry.push_rootfs(f"{IMAGE}:again", rootfs, cmd=["/bin/run"], env={"LANG": "C.UTF-8"},
                                workdir="/work") == first
    assert registry.repository("proj", "us-central1", "repo").images["trainer"].tags["v1"] == first  # as v1 was
    other = registry.push_rootfs(f"{IMAGE}:again", rootfs, cmd=["/bin/sh"])
    stored = registry.repository("proj", "us-central1", "repo").images["trainer"]
    assert other != first and stored.tags["again"] == other and first in stored.manifests
    with pytest.raises(ValueError, match="not an Artifact Registry image"):
        registry.push_rootfs("docker.io/library/busybox:1", rootfs)
    with pytest.raises(ValueError, match="no location of the local registry"):
        registry.push_rootfs("mars-north1-docker.pkg.dev/proj/repo/x:1", rootfs)


def test_an_account_without_the_grant_is_denied_at_the_token_endpoint_in_google_s_words(http):
    assert error(trade(http, access_token="ya29.other")) == (403, "DENIED", DENIED)


def test_no_credentials_are_denied_as_an_unauthenticated_request(http):
    assert error(trade(http, access_token=None)) == (
        403, "DENIED", f'Unauthenticated request. Unauthenticated requests do not have permission "{READ}" on resource '
                       '"projects/proj/locations/us-central1/repositories/repo" (or it may not exist)')


@pytest.mark.parametrize("user, token", [("oauth2accesstoken", "ya29.issued-by-no-vm"), ("_json_key", "ya29.trainer")])
def test_credentials_google_would_not_accept_are_401(http, user, token):
    assert error(trade(http, access_token=token, user=user)) == (
        401, "UNAUTHORIZED", "not authenticated: No valid credential was supplied.")


def test_docker_credential_gcr_s_user_name_is_taken_like_oauth2accesstoken(http):
    assert trade(http, user="_dcgcr_2_1_22_token").status_code == 200


def test_a_manifest_asked_without_a_token_for_its_repository_is_401_with_the_challenge_to_get_one(http, registry, rootfs):
    url = f"https://{HOST}/v2/proj/repo/trainer/manifests/v1"
    scope = 'scope="repository:proj/repo/trainer:pull"'
    bare = http.get(url, timeout=10)
    assert bare.status_code == 401 and bare.headers["WWW-Authenticate"].endswith(scope)
    registry.push_rootfs(f"{HOST}/proj/repo/sidecar:v1", rootfs)
    elsewhere = http.get(url, headers=bearer(http, path="proj/repo/sidecar"), timeout=10)
    assert elsewhere.status_code == 401 and elsewhere.headers["WWW-Authenticate"].endswith(
        f'{scope},error="insufficient_scope"')
    assert http.get(url, headers={"Authorization": "Bearer made-up"}, timeout=10).status_code == 401


def test_a_missing_tag_or_image_is_manifest_unknown_in_google_s_words(http):
    for path, ref in (("proj/repo/trainer", "v9"), ("proj/repo/nothing", "latest")):
        answer = http.get(f"https://{HOST}/v2/{path}/manifests/{ref}", headers=bearer(http, path=path), timeout=10)
        assert error(answer) == (404, "MANIFEST_UNKNOWN", f'Failed to fetch "{ref}" from request "/v2/{path}/manifests/{ref}".')


def test_a_blob_is_served_only_in_a_repository_whose_image_names_it(http, registry, rootfs):
    headers = bearer(http)
    layer = http.get(f"https://{HOST}/v2/proj/repo/trainer/manifests/v1", headers=headers, timeout=10).json()["layers"][0]
    registry.create_repository("proj", "us-central1", "empty")
    answer = http.get(f"https://{HOST}/v2/proj/empty/thing/blobs/{layer['digest']}",
                      headers=bearer(http, path="proj/empty/thing"), timeout=10)
    assert error(answer)[:2] == (404, "BLOB_UNKNOWN")


def test_a_repository_that_does_not_exist_is_denied_as_google_says_it_or_it_may_not_exist(http):
    assert error(trade(http, path="proj/nowhere/trainer")) == (403, "DENIED", DENIED.replace("/repo\"", "/nowhere\""))


def test_a_grant_taken_away_refuses_the_next_request_of_a_token_already_issued(http, project):
    headers = bearer(http)
    project["proj"] = []
    try:
        answer = http.get(f"https://{HOST}/v2/proj/repo/trainer/manifests/v1", headers=headers, timeout=10)
        assert error(answer) == (403, "DENIED", DENIED)
        assert error(trade(http))[:2] == (403, "DENIED")
    finally:
        project["proj"] = [READER]
    assert trade(http).status_code == 200


def test_a_repository_grant_alone_lets_an_account_pull_and_all_users_makes_it_public(http, registry):
    writer = {"role": "roles/artifactregistry.writer", "members": [f"serviceAccount:{OTHER}"]}
    registry.set_policy("proj", "us-central1", "repo", [writer])
    try:
        assert trade(http, access_token="ya29.other").status_code == 200
        assert trade(http, access_token=None).status_code == 403
        registry.set_policy("proj", "us-central1", "repo", [{**writer, "condition": {"expression": "true"}}])
        assert trade(http, access_token="ya29.other").status_code == 403  # a condition is not evaluated: no grant
        registry.set_policy("proj", "us-central1", "repo", [{"role": "roles/artifactregistry.reader",
                                                             "members": ["allUsers"]}])
        assert trade(http, access_token=None).status_code == 200
    finally:
        registry.set_policy("proj", "us-central1", "repo", [])


def test_the_proxy_answers_only_for_the_registry_s_hosts(registry):
    def connect(target: str) -> bytes:
        with socket.create_connection(("127.0.0.1", int(registry.proxy.url.rsplit(":", 1)[1])), timeout=10) as s:
            s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            return s.recv(1024).split(b"\r\n", 1)[0]

    assert connect(f"{HOST}:443") == b"HTTP/1.1 200 Connection established"
    assert connect("europe-docker.pkg.dev:443") == b"HTTP/1.1 200 Connection established"
    for elsewhere in ("registry-1.docker.io:443", "mars-north1-docker.pkg.dev:443", f"{HOST}:80"):
        assert connect(elsewhere) == b"HTTP/1.1 502 Bad Gateway"


def test_a_vm_gets_the_proxy_its_certificate_and_a_registries_conf_with_no_search_and_no_rewrite(registry):
    env = registry.environment()
    assert env["HTTPS_PROXY"] == registry.proxy.url and "127.0.0.1" in env["NO_PROXY"].split(",")
    assert env["SSL_CERT_FILE"] == env["CURL_CA_BUNDLE"] == str(registry.proxy.cert)
    conf = Path(env["CONTAINERS_REGISTRIES_CONF"]).read_text()
    assert "unqualified-search-registries = []" in conf and "[[registry]]" not in conf
    assert {"us", "europe", "asia", "us-central1"} <= set(registry.locations)


def test_the_same_tar_and_settings_make_the_same_image_in_any_store(rootfs, tmp_path):
    from localcloud import oci

    first = oci.from_rootfs(oci.BlobStore(tmp_path / "a"), rootfs, cmd=["/bin/run"])
    again = oci.from_rootfs(oci.BlobStore(tmp_path / "b"), rootfs, cmd=["/bin/run"])
    assert first.manifest == again.manifest and first.digest == again.digest  # no time, no name in any blob
    assert oci.from_rootfs(oci.BlobStore(tmp_path / "c"), rootfs, cmd=["/bin/sh"]).digest != first.digest
    assert all((tmp_path / "a" / "sha256" / d.split(":")[1]).is_file() for d in first.blobs)
