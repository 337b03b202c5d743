"""A local VM pulls from the local cloud's Artifact Registry with its own account, as on Google: its
startup script reads the VM's token from its metadata server, writes it as the agent does (an auth file
keyed by us-central1-docker.pkg.dev), and podman pulls and runs the image, with nothing but the VM's
environment (LocalCloud.registry.environment() is in it). Who may pull is the project's policy as
respawn deploy leaves it (the trainer account holds roles/artifactregistry.reader), changed the way
gcloud changes it (Resource Manager's setIamPolicy)."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from localcloud.stack import LocalCloud, Options
from tests.wait import until

HOST = "us-central1-docker.pkg.dev"
SCRIPT = """set -u
md="http://$GCE_METADATA_HOST/computeMetadata/v1/instance/service-accounts/default/token"
token="$(curl -sS -H 'Metadata-Flavor: Google' "$md" | sed -n 's/.*"access_token": *"\\([^"]*\\)".*/\\1/p')"
mkdir -p auth
printf '{"auths": {"%s": {"auth": "%s"}}}\\n' {host} "$(printf 'oauth2accesstoken:%s' "$token" | base64 | tr -d '\\n')" \\
  > auth/config.json
curl -sS -u "oauth2accesstoken:$token" "https://{host}/v2/token?service={host}&scope=repository:{path}:pull" > token.out
DOCKER_CONFIG="$PWD/auth" REGISTRY_AUTH_FILE="$PWD/auth/config.json" podman pull {image} > pull.out 2> pull.err
echo $? > pull.rc
podman run --rm {image} > run.out 2> run.err
echo $? > run.rc
"""


@pytest.fixture(scope="module")
def cloud(busybox_rootfs, podman) -> Iterator[LocalCloud]:
    with LocalCloud(Options(tick_interval=3600.0, audit=False)) as running:
        yield running


@pytest.fixture(scope="module")
def image(cloud, busybox_rootfs) -> str:
    ref = f"{HOST}/{cloud.options.project}/images/busybox:1"
    cloud.registry.push_rootfs(ref, busybox_rootfs, cmd=["/bin/cat", "/etc/greeting"])
    return ref


def boot(cloud: LocalCloud, name: str, image: str, account: str) -> Path:
    """A VM running as ``account`` whose startup script pulls and runs ``image``; its folder, once done."""
    path = image.split("/", 1)[1].rsplit(":", 1)[0]
    script = SCRIPT.replace("{host}", HOST).replace("{path}", path).replace("{image}", shlex.quote(image))
    body = {"name": name, "machineType": "zones/us-central1-a/machineTypes/e2-small",
            "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/cos-cloud/global/images/family/cos-stable"}}],
            "networkInterfaces": [{"network": "global/networks/default"}],
            "serviceAccounts": [{"email": account, "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}],
            "metadata": {"items": [{"key": "startup-script", "value": script}]}}
    made = requests.post(f"{cloud.compute.endpoint}/compute/v1/projects/{cloud.options.project}/zones/us-central1-a/instances",
                         json=body, timeout=30)
    assert made.ok, made.text
    folder = cloud.compute.workdir_of(name)
    until(f"{name}'s script", lambda: (folder / "run.rc").exists(), timeout=120)
    return folder


def read(folder: Path, name: str) -> str:
    return (folder / name).read_text()


def test_a_vm_pulls_with_its_own_token_and_runs_the_image(cloud, image):
    folder = boot(cloud, "pulls", image, cloud.deployment.trainer)
    assert read(folder, "pull.rc").strip() == "0", read(folder, "pull.err")
    assert read(folder, "run.out") == "hello from a rootfs pushed to the local Artifact Registry\n", read(folder, "run.err")


def test_a_vm_whose_account_holds_no_grant_is_denied(cloud, image):
    stranger = f"stranger@{cloud.options.project}.iam.gserviceaccount.com"
    folder = boot(cloud, "stranger", image, stranger)
    assert read(folder, "pull.rc").strip() != "0"
    assert "Requesting bearer token: invalid status code from registry 403 (Forbidden)" in read(folder, "pull.err")
    assert 'Permission \\"artifactregistry.repositories.downloadArtifacts\\" denied on resource' in read(folder, "token.out")


def test_taking_the_project_grant_away_denies_the_trainer_s_next_pull(cloud, image):
    url = f"{cloud.apis['resourcemanager'].endpoint}/v3/projects/{cloud.options.project}"
    policy = requests.post(f"{url}:getIamPolicy", json={}, timeout=10).json()
    kept = [b for b in policy["bindings"] if b["role"] != "roles/artifactregistry.reader"]
    assert kept != policy["bindings"]  # deploy's grant was there
    requests.post(f"{url}:setIamPolicy", json={"policy": {**policy, "bindings": kept}}, timeout=10).raise_for_status()
    try:
        folder = boot(cloud, "revoked", image, cloud.deployment.trainer)
    finally:
        now = requests.post(f"{url}:getIamPolicy", json={}, timeout=10).json()
        requests.post(f"{url}:setIamPolicy", json={"policy": {**now, "bindings": policy["bindings"]}},
                      timeout=10).raise_for_status()
    assert read(folder, "pull.rc").strip() != "0"
    assert "403 (Forbidden)" in read(folder, "pull.err")
    assert f'\\"projects/{cloud.options.project}/locations/us-central1/repositories/images\\"' in read(folder, "token.out")
