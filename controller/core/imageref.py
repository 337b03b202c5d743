"""Container image references (``image:`` in a spec), and which of them are Artifact Registry's.

A reference is ``[HOST/]PATH[:TAG][@DIGEST]`` as Docker reads it: the first component is a host
when it holds a ``.`` or a ``:`` or is ``localhost`` (``docker.io`` otherwise, ``library/`` before
a one-component path). Artifact Registry's Docker repositories are
``LOCATION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE`` (IMAGE may hold further ``/``); LOCATION is a
region (``us-central1``) or a multi-region (``us``, ``europe``, ``asia``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote

_AR_HOST = re.compile(r"(?P<location>[a-z][a-z0-9-]*[a-z0-9])-docker\.pkg\.dev")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")


@dataclass(frozen=True)
class ImageRef:
    host: str  # "docker.io" when the reference names none
    path: str  # the repository path on that host ("library/busybox")
    tag: str | None = None
    digest: str | None = None

    @property
    def reference(self) -> str:
        """What a registry's ``/v2/<path>/manifests/<reference>`` takes: the digest, else the tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        return f"{self.host}/{self.path}" + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


@dataclass(frozen=True)
class ArtifactImage:
    """An image of an Artifact Registry Docker repository."""

    location: str
    project: str
    repository: str
    image: str  # may hold "/" (a nested image name)
    tag: str | None = None
    digest: str | None = None

    @property
    def host(self) -> str:
        return f"{self.location}-docker.pkg.dev"

    @property
    def repository_name(self) -> str:
        """The repository's resource name, as the REST API and IAM's messages give it."""
        return f"projects/{self.project}/locations/{self.location}/repositories/{self.repository}"

    @property
    def package_name(self) -> str:
        """The image as a package of the REST API: a ``/`` in its name is escaped (``%2F``)."""
        return f"{self.repository_name}/packages/{quote(self.image, safe='')}"

    @property
    def reference(self) -> str:
        return self.digest or self.tag or "latest"

    @property
    def uri(self) -> str:
        """``LOCATION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE`` (no tag, no digest)."""
        return f"{self.host}/{self.project}/{self.repository}/{self.image}"

    def __str__(self) -> str:
        return self.uri + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


def parse(text: str) -> ImageRef:
    """``text`` as Docker reads an image reference; ValueError saying why it is none."""
    rest, _, digest = text.strip().partition("@")
    if digest and not _DIGEST.fullmatch(digest):
        raise ValueError(f"{text!r}: a digest is sha256: and 64 lowercase hex digits")
    head, slash, tail = rest.partition("/")
    if slash and ("." in head or ":" in head or head == "localhost"):
        host, path = head, tail
    else:
        host, path = "docker.io", rest
    name, colon, tag = path.rpartition(":") if ":" in path.rsplit("/", 1)[-1] else (path, "", "")
    if colon and not _TAG.fullmatch(tag):
        raise ValueError(f"{text!r}: {tag!r} is no tag (letters, digits, _ . -, at most 128)")
    if not name or not all(_COMPONENT.fullmatch(c) for c in name.split("/")):
        raise ValueError(f"{text!r}: {name!r} is no repository path (lowercase components separated by /)")
    if host == "docker.io" and "/" not in name:
        name = f"library/{name}"
    return ImageRef(host, name, tag or None, digest or None)


def artifact(ref: ImageRef) -> ArtifactImage | None:
    """The Artifact Registry image ``ref`` names; None when its host is not ``*-docker.pkg.dev``.
    ValueError for such a host with fewer than project/repository/image."""
    found = _AR_HOST.fullmatch(ref.host)
    if found is None:
        return None
    parts = ref.path.split("/", 2)
    if len(parts) < 3:
        raise ValueError(f"{ref}: Artifact Registry images are {ref.host}/PROJECT/REPOSITORY/IMAGE")
    return ArtifactImage(found["location"], parts[0], parts[1], parts[2], ref.tag, ref.digest)
