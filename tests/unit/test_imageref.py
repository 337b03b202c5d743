"""Image references as docker reads them, and which are Artifact Registry's (controller.core.imageref)."""

from __future__ import annotations

import pytest

from controller.core import imageref

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize("text, host, path, tag, digest", [
    ("busybox", "docker.io", "library/busybox", None, None),
    ("pytorch/pytorch:2.5.1-cuda12.4", "docker.io", "pytorch/pytorch", "2.5.1-cuda12.4", None),
    ("localhost:5000/x/y:z", "localhost:5000", "x/y", "z", None),
    ("gcr.io/proj/trainer", "gcr.io", "proj/trainer", None, None),
    (f"nvcr.io/nvidia/nemo:24.07@{DIGEST}", "nvcr.io", "nvidia/nemo", "24.07", DIGEST),
    ("us-central1-docker.pkg.dev/p/r/team/trainer:v1", "us-central1-docker.pkg.dev", "p/r/team/trainer", "v1", None),
])
def test_a_reference_reads_as_docker_reads_it(text, host, path, tag, digest):
    ref = imageref.parse(text)
    assert (ref.host, ref.path, ref.tag, ref.digest) == (host, path, tag, digest)
    assert ref.reference == (digest or tag or "latest")


@pytest.mark.parametrize("text", ["", "Upper/case", "x@sha256:short", "x:bad tag", "us-docker.pkg.dev//r/i"])
def test_what_is_no_reference_is_refused(text):
    with pytest.raises(ValueError):
        imageref.parse(text)


def test_an_artifact_registry_image_names_its_repository_package_and_location():
    image = imageref.artifact(imageref.parse("europe-docker.pkg.dev/my-proj/images/team/trainer:v1"))
    assert image is not None and (image.location, image.project, image.repository, image.image) == (
        "europe", "my-proj", "images", "team/trainer")
    assert image.repository_name == "projects/my-proj/locations/europe/repositories/images"
    assert image.package_name == "projects/my-proj/locations/europe/repositories/images/packages/team%2Ftrainer"
    assert image.uri == "europe-docker.pkg.dev/my-proj/images/team/trainer" and image.reference == "v1"
    assert str(image) == "europe-docker.pkg.dev/my-proj/images/team/trainer:v1"


@pytest.mark.parametrize("text", ["gcr.io/p/x", "busybox", "docker.pkg.dev/p/r/i", "us-python.pkg.dev/p/r/i"])
def test_other_registries_are_not_artifact_registry_s_docker_hosts(text):
    assert imageref.artifact(imageref.parse(text)) is None


def test_an_artifact_registry_reference_needs_project_repository_and_image():
    with pytest.raises(ValueError, match="PROJECT/REPOSITORY/IMAGE"):
        imageref.artifact(imageref.parse("us-docker.pkg.dev/p/only"))
