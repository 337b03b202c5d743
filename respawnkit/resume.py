"""Where to resume from: the checkpoint respawn chose for this attempt.

respawn picks the newest *complete* checkpoint under the job's prefix and hands it to the
trainer as ``RESUME_FROM`` (a gs:// URI, or empty on a fresh start), with ``RESUME_STEP``
and ``RESUME_TAG`` when its format records them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from respawnkit import env
from respawnkit.stores import open_store


@dataclass(frozen=True)
class Resume:
    uri: str  # as respawn named it
    step: int | None  # RESUME_STEP, else the number in its name
    tag: str | None  # RESUME_TAG: the name a framework loads it by (DeepSpeed's tag, Megatron's iteration)
    path: str | None  # a local file or folder holding it: downloaded, or the uri itself when it is local

    def __fspath__(self) -> str:
        if self.path is None:
            raise ValueError(f"{self.uri} is not on this machine: resume_from(download_to=...) fetches it")
        return self.path


def resume_from(download_to: str | None = None) -> Resume | None:
    """The checkpoint respawn chose, or None on a fresh start; with ``download_to``, fetched into that folder
    (``<download_to>/<its name>``, a file or a folder like the original)."""
    uri = env.text("RESUME_FROM")
    if uri is None:
        return None
    step = env.integer("RESUME_STEP")
    local = None if uri.startswith("gs://") else uri.removeprefix("file://")
    path = download(uri, download_to) if download_to is not None else local
    return Resume(uri, step if step is not None else env.step_in_name(uri), env.text("RESUME_TAG"), path)


def download(uri: str, folder: str) -> str:
    """Copy the file or folder at ``uri`` into ``folder``; the local path of the copy."""
    parent, _, leaf = uri.rstrip("/").rpartition("/")
    store = open_store(parent)
    names = store.names(leaf)
    if not names:
        raise FileNotFoundError(f"nothing at {uri}")
    for name in names:
        target = os.path.join(folder, *name.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        store.get(name, target)
    return os.path.join(folder, leaf)
