"""Where a spec points beyond the control bucket: its ``checkpoint.uri``'s bucket and its ``code:``
tarball. One judgement of each, for ``respawn submit`` (which refuses a spec pointing at one that is
not there: the controller would wait for ever on a prefix in no bucket, and every VM would fail at
boot fetching no tarball) and ``respawn doctor SPEC`` (a ✗ naming the field and its fix, a ✓ when it
is there), so that doctor never passes a spec that submit refuses.

A place that cannot be read from here (a 403: this account is neither the controller's, which lists
the checkpoints, nor the VMs', which fetch the code) is said and left to them, never refused.

A ``checkpoint.uri`` in the control bucket itself is there, but the trainers' account may write only
its VM records in that bucket (deploy/IAM.md): ``in_control_bucket`` says so, with the checkpoints
bucket deploy makes as the fix; submit warns (an operator may have granted more), doctor judges the
grant it finds.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.core import errors, names
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


@dataclass(frozen=True)
class Misplaced:
    """A spec's ``checkpoint.uri`` in the control bucket: what is wrong, and where to point it instead."""

    field: str
    detail: str
    instead: str  # the checkpoint prefix to give: the job's in the checkpoints bucket deploy makes
    why: str  # what that bucket is

    @property
    def fix(self) -> str:
        """The spec's line that fixes it."""
        return f"checkpoint: {{uri: {self.instead}}}  # {self.why}"


def in_control_bucket(uri: str, control: str, job: str) -> Misplaced | None:
    """``uri`` (a spec's ``checkpoint.uri``) in the control bucket ``control``: the trainers' account
    may create there only its VM records (a conditioned custom role), so the trainer could save no
    checkpoint; the fix, the job's prefix in the checkpoints bucket ``respawn deploy`` makes. None
    for a uri in any other bucket."""
    if split_uri(uri)[0] != control:
        return None
    detail = (f"{uri} is in the control bucket gs://{control}, where the trainers' account may write only its VM "
              "records (deploy/IAM.md): the trainer could save no checkpoint, and each preemption would restart the "
              "job from step 0")
    try:
        return Misplaced("checkpoint.uri", detail, names.default_checkpoint(control, job),
                         "the checkpoints bucket respawn deploy makes")
    except ValueError:  # a control bucket whose name leaves no checkpoints bucket
        return Misplaced("checkpoint.uri", detail, f"gs://YOUR-BUCKET/{job}",
                         "a bucket of yours the trainers' account may write (roles/storage.objectUser)")


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
