"""A container image made from a root filesystem tar, in pure Python: what ``docker import`` does,
without a container runtime.

One layer: the tar gzipped (the layer blob, ``application/vnd.docker.image.rootfs.diff.tar.gzip``),
whose uncompressed digest is the config's ``rootfs.diff_ids[0]``; the image config
(``application/vnd.docker.container.image.v1+json``: architecture, os, ``config.Cmd``/``Env``/
``WorkingDir``); and the Docker Image Manifest V2, Schema 2 that names both by digest. Every part is
content-addressed and made deterministically (gzip without a timestamp, the config without a creation
time, JSON with sorted keys), so the same tar and settings give the same manifest digest: pushing
again changes nothing. Schema 2 rather than OCI's manifest: both docker and podman pull it, and it is
what ``docker push`` writes to Artifact Registry.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import platform
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG = "application/vnd.docker.container.image.v1+json"
LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
_CHUNK = 1 << 20
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


@dataclass(frozen=True)
class Image:
    """An image's manifest (bytes as served: their sha256 is the image's digest) and its blobs."""

    manifest: bytes
    config: str  # the config blob's digest
    layers: tuple[str, ...]  # the layer blobs' digests

    @property
    def digest(self) -> str:
        return digest_of(self.manifest)

    @property
    def blobs(self) -> tuple[str, ...]:
        return (self.config, *self.layers)


def digest_of(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


class BlobStore:
    """Blobs by digest, as files (``<root>/sha256/<hex>``): a runtime's layer is tens of MiB."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._layers: dict[tuple[str, str], str] = {}  # (diff_id, gzip level) -> layer digest

    def path(self, digest: str) -> Path:
        algorithm, _, hexdigest = digest.partition(":")
        return self.root / algorithm / hexdigest

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def put(self, data: bytes) -> str:
        digest = digest_of(data)
        target = self.path(digest)
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=target.parent, prefix=".blob-", delete=False) as staging:
                staging.write(data)
            os.replace(staging.name, target)
        return digest

    def put_layer(self, tar: Path, level: int = 1) -> tuple[str, str, int]:
        """The tar gzipped as a layer blob: (its digest, the tar's own digest: the diff_id, its size).
        Level 1 by default: a 745 MB tar took 11.7 s here against 30.9 s at level 6, for 10 % more bytes,
        which only ever travel over loopback."""
        plain = hashlib.sha256()
        with open(tar, "rb") as source:
            while chunk := source.read(_CHUNK):
                plain.update(chunk)
        diff_id = f"sha256:{plain.hexdigest()}"
        known = self._layers.get((diff_id, str(level)))
        if known and self.has(known):
            return known, diff_id, self.path(known).stat().st_size
        self.root.mkdir(parents=True, exist_ok=True)
        packed = hashlib.sha256()
        with open(tar, "rb") as source, tempfile.NamedTemporaryFile(dir=self.root, prefix=".layer-",
                                                                    delete=False) as raw:
            staging = Path(raw.name)
            # mtime=0 and no file name in the header: the same tar always gzips to the same bytes
            with gzip.GzipFile(filename="", mode="wb", fileobj=_Hashing(raw, packed), compresslevel=level,
                               mtime=0) as out:
                shutil.copyfileobj(source, out, _CHUNK)
        digest = f"sha256:{packed.hexdigest()}"
        target = self.path(digest)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging, target)
        self._layers[(diff_id, str(level))] = digest
        return digest, diff_id, target.stat().st_size


class _Hashing:
    """A write-only file that hashes what passes through it."""

    def __init__(self, raw: object, sha: hashlib._Hash) -> None:
        self._raw, self._sha = raw, sha

    def write(self, data: bytes) -> int:
        self._sha.update(data)
        return self._raw.write(data)  # type: ignore[attr-defined, no-any-return]

    def flush(self) -> None:
        self._raw.flush()  # type: ignore[attr-defined]


def from_rootfs(store: BlobStore, tar: Path, *, cmd: Sequence[str] | None = None,
                env: Mapping[str, str] | Sequence[str] | None = None, workdir: str | None = None,
                architecture: str | None = None) -> Image:
    """A single-layer image of the root filesystem ``tar`` (paths relative to ``/``), its blobs in ``store``."""
    layer, diff_id, size = store.put_layer(tar)
    settings: dict[str, object] = {"Env": _env(env)}
    if cmd is not None:
        settings["Cmd"] = list(cmd)
    if workdir:
        settings["WorkingDir"] = workdir
    config = _json({
        "architecture": architecture or _ARCH.get(platform.machine().lower(), platform.machine().lower()),
        "os": "linux", "config": settings, "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "localcloud: imported from a root filesystem tar"}],
    })
    config_digest = store.put(config)
    manifest = _json({
        "schemaVersion": 2, "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "size": len(config), "digest": config_digest},
        "layers": [{"mediaType": LAYER, "size": size, "digest": layer}],
    })
    return Image(manifest, config_digest, (layer,))


def _env(env: Mapping[str, str] | Sequence[str] | None) -> list[str]:
    if env is None:
        return ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    if isinstance(env, Mapping):
        return [f"{k}={v}" for k, v in env.items()]
    return list(env)


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
