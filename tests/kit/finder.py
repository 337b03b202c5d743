"""respawn's own finder (controller.core.checkpoints.latest) over a local folder standing in for a bucket:
what the controller would choose from the objects the kit uploaded."""

from __future__ import annotations

import os
from datetime import datetime, timezone

from controller.core import checkpoints
from controller.core.ports import BlobInfo

BUCKET = "kit-bucket"


def objects(root: str) -> list[BlobInfo]:
    """Every object under ``root`` as a listing of ``gs://kit-bucket/`` shows it; a copy under way (the
    store's hidden temporary file) is an object too, as an unfinished upload would be to a careless reader."""
    found = []
    for where, _, leaves in os.walk(root):
        for leaf in leaves:
            path = os.path.join(where, leaf)
            info = os.stat(path)
            name = os.path.relpath(path, root).replace(os.sep, "/")
            found.append(BlobInfo(BUCKET, name, info.st_mtime_ns, datetime.fromtimestamp(info.st_mtime, timezone.utc),
                                  info.st_size))
    return found


def latest(root: str, fmt: str = "auto") -> checkpoints.Found | None:
    def read(name: str, limit: int) -> bytes | None:
        path = os.path.join(root, *name.split("/"))
        if not os.path.isfile(path) or os.path.getsize(path) > limit:
            return None
        with open(path, "rb") as f:
            return f.read()

    return checkpoints.latest(f"gs://{BUCKET}/", objects(root), read, fmt)


def local(found: checkpoints.Found, root: str) -> str:
    """The local path of a found checkpoint (what RESUME_FROM would name)."""
    return os.path.join(root, found.uri.removeprefix(f"gs://{BUCKET}/"))
