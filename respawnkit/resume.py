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
    """Copy the file or folder at ``uri`` into ``folder``; the local path of the copy.

    Object names come from whoever can write the checkpoint bucket, so none is trusted to stay in ``folder``:
    every name is checked before anything is written, and a save holding one that could land elsewhere is
    refused whole (``UnsafeName``, naming the object) rather than downloaded in part."""
    parent, _, leaf = uri.rstrip("/").rpartition("/")
    store = open_store(parent)
    names = store.names(leaf)
    if not names:
        raise FileNotFoundError(f"nothing at {uri}")
    root = os.path.realpath(folder)
    listed = set(names)
    for name in names:
        if why := _unsafe(name, leaf, listed):
            raise UnsafeName(f"refusing to download {uri}: its object {name!r} {why}")
        _inside(root, os.path.join(root, *name.split("/")), uri, name)  # a symlink already in the folder
    for name in names:
        target = os.path.join(root, *name.split("/"))
        _inside(root, os.path.dirname(target), uri, name)  # again, as it is now: no folder made through a symlink
        os.makedirs(os.path.dirname(target), exist_ok=True)
        _inside(root, target, uri, name)
        store.get(name, target)
    return os.path.join(folder, leaf)


class UnsafeName(ValueError):
    """A save holds an object whose name could write outside the download folder."""


def _unsafe(name: str, leaf: str, listed: set[str]) -> str | None:
    """Why ``name`` (relative to the save's parent) cannot be written under the download folder, or None."""
    parts = name.split("/")
    if "" in parts:
        return "has an empty path component (a leading, doubled or trailing '/'): it names a folder, or the root"
    if {".", ".."} & set(parts):
        return "has a '.' or '..' component: it would resolve outside the save"
    if "\\" in name or "\0" in name:
        return "holds a backslash or a NUL: it would not be the file it says on every system"
    if parts[0] != leaf:
        return f"is not under {leaf!r}"
    if any("/".join(parts[:i]) in listed for i in range(1, len(parts))):
        return "is inside another object of the save: one name would be both a file and a folder"
    return None


def _inside(root: str, path: str, uri: str, name: str) -> None:
    """``path``, with every symlink on it resolved, is ``root`` or under it; and is no symlink itself."""
    real = os.path.realpath(path)
    if os.path.islink(path) or (real != root and not real.startswith(root + os.sep)):
        raise UnsafeName(f"refusing to download {uri}: its object {name!r} would be written through a symlink "
                         f"to {real}, outside {root}")
