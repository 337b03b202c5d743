"""Find the latest *complete* checkpoint under a ``gs://`` prefix.

A checkpoint is only ever chosen when its format proves it complete, because resuming
from a half-written one loses far more than the steps since the previous one:

- ``LATEST``: an explicit pointer object the trainer writes after a save (path
  relative to the prefix, or a gs:// URI). Trusted when its target exists.
- TensorFlow: the ``checkpoint`` state file names the newest save; ``<name>-N.index``
  is written last, so a prefix without it is partial.
- Lightning: ``last.ckpt`` is one object, and a GCS object appears whole or not at all.
- orbax: step directories are complete only with ``commit_success*`` (GCS has no
  atomic rename, so orbax writes that file last).
- torch.distributed.checkpoint: a directory is complete with ``.metadata``, which the
  coordinator writes after every rank's shards.
- Numbered plain files (``ckpt-000120.pt``) are single objects, hence complete;
  numbered directories (``step_120/``) need a marker: ``_SUCCESS``, ``COMPLETE``,
  ``DONE``, or HuggingFace's ``trainer_state.json`` (saved after the weights).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from controller.ports import BlobInfo

MAX_POINTER_BYTES = 64 * 1024  # LATEST and TensorFlow's state file name one checkpoint
FORMATS = ("auto", "orbax", "tensorflow", "lightning", "dcp", "files", "pointer")
_DIR_MARKERS = {"commit_success": "orbax", ".metadata": "dcp", "_SUCCESS": "files",
                "COMPLETE": "files", "DONE": "files", "trainer_state.json": "files"}
_FILE_RE = re.compile(r".*?(\d+)\.(pt|pth|ckpt|bin|safetensors|pkl|npz|npy|msgpack|h5|keras)$")
_TF_INDEX_RE = re.compile(r"(?P<base>.*-(?P<step>\d+))\.index$")
_TF_STATE_RE = re.compile(r'model_checkpoint_path:\s*"([^"]+)"')
_LAST_INT = re.compile(r"(\d+)(?!.*\d)")


@dataclass(frozen=True)
class Found:
    uri: str
    step: int | None
    format: str
    version: int  # generation of the object proving completeness: changes on every save


def split_uri(uri: str) -> tuple[str, str]:
    """``gs://bucket/a/b`` -> (``bucket``, ``a/b/``): the listing prefix of a checkpoint root."""
    bucket, _, path = uri.removeprefix("gs://").partition("/")
    path = path.strip("/")
    return bucket, f"{path}/" if path else ""


def latest(
    uri: str, listing: Iterable[BlobInfo], read: Callable[[str], bytes | None], fmt: str = "auto"
) -> Found | None:
    """The newest complete checkpoint under ``uri``, or None. ``read`` takes a relative name."""
    bucket, prefix = split_uri(uri)
    root = f"gs://{bucket}/{prefix}"
    objects = {b.name[len(prefix) :]: b for b in listing if b.name.startswith(prefix)}
    explicit = [
        ("pointer", lambda: _pointer(root, objects, read)),
        ("tensorflow", lambda: _tf_state(root, objects, read)),
        ("lightning", lambda: _lightning(root, objects)),
    ]
    for name, find in explicit:
        if fmt in ("auto", name) and (found := find()):
            return found
    candidates = [c for c in _numbered(root, objects) if fmt in ("auto", c.format)]
    return max(candidates, key=lambda c: (c.step or 0, c.version), default=None)


def _step(text: str) -> int | None:
    match = _LAST_INT.search(text)
    return int(match.group(1)) if match else None


def _pointer(root: str, objects: dict[str, BlobInfo], read: Callable[[str], bytes | None]) -> Found | None:
    if "LATEST" not in objects or not (raw := read("LATEST")):
        return None
    target = raw.decode(errors="replace").strip()
    relative = target.removeprefix(root).strip("/")
    if not relative or not any(n == relative or n.startswith(relative + "/") for n in objects):
        return None  # points at nothing that exists (deleted, or another bucket): untrusted
    return Found(root + relative, _step(relative), "pointer", objects["LATEST"].generation)


def _tf_state(root: str, objects: dict[str, BlobInfo], read: Callable[[str], bytes | None]) -> Found | None:
    if "checkpoint" not in objects or not (raw := read("checkpoint")):
        return None
    match = _TF_STATE_RE.search(raw.decode(errors="replace"))
    index = f"{match.group(1)}.index" if match else None
    if index is None or index not in objects:
        return None
    return Found(root + match.group(1), _step(match.group(1)), "tensorflow", objects[index].generation)


def _lightning(root: str, objects: dict[str, BlobInfo]) -> Found | None:
    last = objects.get("last.ckpt")
    return Found(root + "last.ckpt", None, "lightning", last.generation) if last else None


def _numbered(root: str, objects: dict[str, BlobInfo]) -> Iterable[Found]:
    """Every complete numbered checkpoint: files, marked directories, TF index prefixes."""
    for name, blob in objects.items():
        if "/" not in name:
            if tf := _TF_INDEX_RE.fullmatch(name):
                yield Found(root + tf.group("base"), int(tf.group("step")), "tensorflow", blob.generation)
            elif _FILE_RE.fullmatch(name):
                yield Found(root + name, _step(name), "files", blob.generation)
            continue
        directory, _, leaf = name.partition("/")
        if ".orbax-checkpoint-tmp" in directory or (step := _step(directory)) is None:
            continue
        for marker, fmt in _DIR_MARKERS.items():
            if leaf == marker or (marker == "commit_success" and leaf.startswith(marker)):
                yield Found(root + directory, step, fmt, blob.generation)
