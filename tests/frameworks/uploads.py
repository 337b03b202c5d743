"""Test-only uploads for the framework trainers: the local "bucket" store, slowed or hung on purpose.

``install()`` (each trainer calls it before building its saver) wraps ``respawnkit.stores.LocalStore.put`` when
the environment asks for it, and does nothing otherwise:

- ``SLOW_UPLOAD_S``: the last object of each save (the layout's completion marker, or the one object of a
  single-file layout) takes that many seconds more to upload, so every measured upload is at least that long;
- ``HANG_ON``: the upload of that object (a name under the prefix, e.g. ``checkpoint-10/trainer_state.json``)
  writes half of its bytes into the store's temporary file beside the target, as a copy cut off mid-way
  leaves it, writes that name to ``$WORK/hung`` and never ends: the test SIGKILLs the process there;
- ``FAIL_ON``: the upload of that object fails (OSError), as one refused for good would.
"""

from __future__ import annotations

import os
import time

from respawnkit import layouts
from respawnkit.stores import _TEMPORARY, LocalStore

MARKERS = {layout.marker for layout in vars(layouts).values() if isinstance(layout, layouts.Layout) and layout.marker}


def hung_file(work: str) -> str:
    return os.path.join(work, "hung")


def last_of_its_save(name: str) -> bool:
    if name.endswith(layouts.UNFINISHED):  # the object beside a save while it uploads, its first
        return False
    return "/" not in name or name.rsplit("/", 1)[1] in MARKERS


def install() -> None:
    slow, hang_on = float(os.environ.get("SLOW_UPLOAD_S", "0")), os.environ.get("HANG_ON")
    fail_on = os.environ.get("FAIL_ON")
    if not slow and not hang_on and not fail_on:
        return
    put = LocalStore.put

    def put_slowly(self: LocalStore, local: str, name: str) -> None:
        if name == fail_on:
            raise OSError(f"refused: {name} (FAIL_ON)")
        if slow and last_of_its_save(name):
            time.sleep(slow)
        if name == hang_on:
            target = os.path.join(self.root, *name.split("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(local, "rb") as src:
                data = src.read()
            with open(os.path.join(os.path.dirname(target), f"{_TEMPORARY}cut.partial"), "wb") as out:
                out.write(data[: max(1, len(data) // 2)])
            with open(hung_file(os.environ["WORK"]), "w") as out:
                out.write(name)
            time.sleep(3600)
        put(self, local, name)

    LocalStore.put = put_slowly  # type: ignore[method-assign]
