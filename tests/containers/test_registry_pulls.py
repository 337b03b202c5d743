"""Real podman pulling from the local Artifact Registry as a VM's agent makes it pull on Google: the
proxy and its certificate from ``Registry.environment()``, the VM's access token in an auth file keyed by
the registry's own host (``{"auths": {"us-central1-docker.pkg.dev": {"auth": base64("oauth2accesstoken:
TOKEN")}}}``, as docker-credential-gcr would give it), read through ``REGISTRY_AUTH_FILE`` (podman) or
``DOCKER_CONFIG/config.json`` (docker's place, which podman reads too). What podman prints is asserted as
podman 4.3 prints it: a 403 from the token endpoint comes out as "invalid status code from registry 403
(Forbidden)", its body unread; curl through the same environment shows the body, Artifact Registry's
DENIED message, which is how an agent can name the cause."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcloud.registry import READ, Registry

HOST = "us-central1-docker.pkg.dev"
IMAGE = f"{HOST}/proj/images/busybox"
TRAINER, OTHER = "trainer@proj.iam.gserviceaccount.com", "other@proj.iam.gserviceaccount.com"
TOKENS = {"ya29.trainer": TRAINER, "ya29.other": OTHER}
RESOURCE = "projects/proj/locations/us-central1/repositories/images"
FORBIDDEN = "Requesting bearer token: invalid status code from registry 403 (Forbidden)"


@pytest.fixture(scope="module")
def registry(busybox_rootfs) -> Iterator[Registry]:
    policy = [{"role": "roles/artifactregistry.reader", "members": [f"serviceAccount:{TRAINER}"]}]
    with Registry(accounts=TOKENS.get, project_policy=lambda p: policy if p == "proj" else []) as reg:
        reg.push_rootfs(f"{IMAGE}:1", busybox_rootfs, cmd=["/bin/cat", "/etc/greeting"])
        yield reg


def auth_file(folder: Path, token: str | None, name: str = "auth.json") -> Path:
    """What the VM agent writes: the registry's own host, the token as oauth2accesstoken's password."""
    folder.mkdir(parents=True, exist_ok=True)
    auths = {} if token is None else {HOST: {"auth": base64.b64encode(f"oauth2accesstoken:{token}".encode()).decode()}}
    path = folder / name
    path.write_text(json.dumps({"auths": auths}))
    return path


def pull(podman, registry: Registry, tmp_path: Path, token: str | None, ref: str = f"{IMAGE}:1"):
    env = {**registry.environment(), "REGISTRY_AUTH_FILE": str(auth_file(tmp_path / "auth", token))}
    podman("rmi", "--force", ref)
    return podman("pull", ref, env=env)


def token_endpoint(registry: Registry, token: str | None) -> dict:
    """What an agent's curl, in the VM's environment, hears from the token endpoint podman asked."""
    argv = ["curl", "-sS", "--max-time", "20", f"https://{HOST}/v2/token?service={HOST}&scope=repository:proj/images/busybox:pull"]
    if token:
        argv[1:1] = ["-u", f"oauth2accesstoken:{token}"]
    done = subprocess.run(argv, env={"PATH": "/usr/bin:/bin", **registry.environment()}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_pull_with_the_vm_s_token_succeeds_and_the_image_runs(podman, registry, tmp_path):
    done = pull(podman, registry, tmp_path, "ya29.trainer")
    assert done.returncode == 0, done.stderr
    ran = podman("run", "--rm", f"{IMAGE}:1")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "hello from a rootfs pushed to the local Artifact Registry\n"
    echoed = podman("run", "--rm", f"{IMAGE}:1", "/bin/sh", "-c", "echo $((6 * 7))")
    assert echoed.stdout == "42\n"


def test_an_account_without_the_grant_is_refused_and_the_token_endpoint_names_the_permission(podman, registry, tmp_path):
    done = pull(podman, registry, tmp_path, "ya29.other")
    assert done.returncode != 0 and FORBIDDEN in done.stderr, done.stderr
    assert token_endpoint(registry, "ya29.other") == {"errors": [{"code": "DENIED", "message": (
        f'Permission "{READ}" denied on resource "{RESOURCE}" (or it may not exist)')}]}


def test_a_missing_tag_fails_with_manifest_unknown(podman, registry, tmp_path):
    done = pull(podman, registry, tmp_path, "ya29.trainer", ref=f"{IMAGE}:2")
    assert done.returncode != 0
    assert (f'reading manifest 2 in {IMAGE}: manifest unknown: Failed to fetch "2" from request '
            f'"/v2/proj/images/busybox/manifests/2".') in done.stderr, done.stderr


def test_without_credentials_the_pull_is_refused_as_an_unauthenticated_request(podman, registry, tmp_path):
    done = pull(podman, registry, tmp_path, None)
    assert done.returncode != 0 and FORBIDDEN in done.stderr, done.stderr
    said = token_endpoint(registry, None)["errors"][0]
    assert said["code"] == "DENIED" and said["message"].startswith("Unauthenticated request. Unauthenticated requests "
                                                                  f'do not have permission "{READ}" on resource')


def test_a_token_no_vm_issued_is_unauthorized(podman, registry, tmp_path):
    done = pull(podman, registry, tmp_path, "ya29.forged")
    assert done.returncode != 0
    assert "unauthorized: not authenticated: No valid credential was supplied." in done.stderr, done.stderr


def test_docker_s_config_json_is_read_as_well(podman, registry, tmp_path):
    folder = tmp_path / "docker"
    auth_file(folder, "ya29.trainer", name="config.json")
    podman("rmi", "--force", f"{IMAGE}:1")
    done = podman("pull", f"{IMAGE}:1", env={**registry.environment(), "DOCKER_CONFIG": str(folder),
                                             "REGISTRY_AUTH_FILE": str(auth_file(tmp_path / "none", None))})
    assert done.returncode == 0, done.stderr


def test_the_certificate_is_verified_as_google_s_would_be(podman, registry, tmp_path):
    env = {**registry.environment(), "REGISTRY_AUTH_FILE": str(auth_file(tmp_path / "auth", "ya29.trainer"))}
    env.pop("SSL_CERT_FILE")
    podman("rmi", "--force", f"{IMAGE}:1")
    done = podman("pull", f"{IMAGE}:1", env={**env, "SSL_CERT_FILE": "/dev/null"})
    assert done.returncode != 0 and "x509: certificate signed by unknown authority" in done.stderr, done.stderr
