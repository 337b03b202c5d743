"""Where a spec points beyond the control bucket: its ``checkpoint.uri``'s bucket and its ``code:``
tarball. One judgement of each, for ``respawn submit`` (which refuses a spec pointing at one that is
not there: the controller would wait for ever on a prefix in no bucket, and every VM would fail at
boot fetching no tarball) and ``respawn doctor SPEC`` (a ✗ naming the field and its fix, a ✓ when it
is there), so that doctor never passes a spec that submit refuses.

A place that cannot be read from here (a 403: this account is neither the controller's, which lists
the checkpoints, nor the VMs', which fetch the code) is said and left to them, never refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.core import errors
from controller.core.checkpoints import Found, split_uri
from controller.core.ports import BlobStore
from controller.core.spec import Checkpoint
from controller.service.observe import discover


@dataclass(frozen=True)
class Place:
    field: str  # the spec's field that names it: "checkpoint.uri", "code"
    there: bool | None  # None: it could not be read from here (said, never refused)
    detail: str
    fix: str = ""  # what makes it there (a place that is not)

    def refusal(self) -> str:
        """``respawn submit``'s one line for a place that is not there."""
        return f"{self.field}: {self.detail}; fix: {self.fix}"


@dataclass(frozen=True)
class Listed:
    """One listing of a checkpoint prefix: the latest complete checkpoint there, and its bucket judged."""

    found: Found | None
    place: Place
    error: str | None = None  # why the prefix could not be listed


def checkpoints(store: BlobStore, where: Checkpoint) -> Listed:
    """What is under ``where`` (one listing, observe.discover: what a new run resumes), and whether
    its bucket is there: objects.list answers 404 for the bucket alone, never for a prefix."""
    bucket = split_uri(where.uri)[0]
    try:
        found = discover(store, where)
    except errors.NoSuchBucket as e:
        return Listed(None, Place("checkpoint.uri", False,
                                  f"bucket gs://{bucket} does not exist ({where.uri}), so the job could never find "
                                  "its checkpoints and would wait for ever",
                                  f"gcloud storage buckets create gs://{bucket}  # or point checkpoint.uri at a "
                                  "bucket of yours"), _said(e))
    except errors.RespawnError as e:
        return Listed(None, Place("checkpoint.uri", None,
                                  f"cannot list {where.uri} from here ({_said(e)}): not judged; the controller "
                                  "lists it as its own account"), _said(e))
    held = f"its latest complete checkpoint is {found.label}" if found else \
        "no complete checkpoint there yet (a first run starts from scratch)"
    return Listed(found, Place("checkpoint.uri", True, f"bucket gs://{bucket} is there; under {where.uri}, {held}"))


def code(store: BlobStore, uri: str) -> Place:
    """A spec's ``code:`` tarball on gs:// (not one ``respawn submit`` packs from a local folder)."""
    bucket, _, name = uri.removeprefix("gs://").partition("/")
    try:
        store.stat(bucket, name)
    except errors.NotFound:
        return Place("code", False, f"{uri} does not exist (no such object, or no bucket gs://{bucket}): the VM "
                                    "could never fetch it",
                     f"gcloud storage cp CODE.tar.gz {uri}  # or give code: a local folder (respawn submit "
                     "packs and uploads it)")
    except errors.RespawnError as e:
        return Place("code", None, f"cannot read {uri} from here ({_said(e)}): not judged; the VMs fetch it as "
                                   "their own account")
    return Place("code", True, f"{uri} is there")


def _said(error: errors.RespawnError) -> str:
    return str(error) or type(error).__name__
