"""Find the latest *complete* checkpoint under a ``gs://`` prefix.

A checkpoint is only ever chosen when its format proves it complete, because resuming
from a half-written one loses far more than the steps since the previous one. Each
rule comes from the library's own save code:

- Trackers, objects a trainer writes after a save has landed, naming it. When one
  names a checkpoint that exists, it decides, whatever newer (partial) saves exist:
  ``LATEST`` (respawn's own pointer: a path relative to the prefix, or a gs:// URI);
  DeepSpeed's ``latest`` (the tag, written after every rank's ``global_step<N>/`` files);
  Megatron-LM/NeMo's ``latest_checkpointed_iteration.txt`` (an iteration or ``release``,
  written by rank 0 after a barrier, for ``iter_<7 digits>/`` in the legacy and the
  ``torch_dist`` formats); TensorFlow's ``checkpoint`` state file (its ``ckpt-N`` counts
  only with ``ckpt-N.index``).
- Lightning: ``last.ckpt`` is one object, and a GCS object appears whole or not at all.
- The highest-numbered complete save otherwise (numbers compared as numbers):
  orbax step directories with ``commit_success*`` (written last, since GCS has no
  atomic rename); torch.distributed.checkpoint directories with ``.metadata`` (the
  coordinator writes it after every rank's shards); numbered plain files
  (``ckpt-000120.pt``), single objects hence complete; numbered directories with
  ``_SUCCESS``, ``COMPLETE``, ``DONE`` or HuggingFace's ``trainer_state.json`` (saved
  after the weights; its ``global_step`` is reported); Accelerate's
  ``checkpoint_<i>/`` (see ``_accelerate``: it writes no marker).
- A user's own rule (``format: custom``): a step pattern and a marker, or "the file set
  of the previous complete save".

Temporary objects (``*.tmp``, ``*.partial``, ``tmpXXXX``, hidden names; a gcsfuse mount
uploads a killed writer's temp file when it is closed) are never checkpoints. A directory with
a ``<directory>-unfinished`` object beside it (NeMo's, and respawnkit's while it uploads) is
never complete, whatever it holds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime

from controller.core.ports import BlobInfo

MAX_POINTER_BYTES = 64 * 1024  # a tracker names one checkpoint: a line or two
MAX_TRAINER_STATE_BYTES = 1024 * 1024  # read only for its global_step; a larger one keeps the directory's number
FORMATS = ("auto", "orbax", "tensorflow", "lightning", "dcp", "files", "pointer", "deepspeed", "megatron",
           "accelerate", "huggingface", "custom")
# What a format accepts besides itself: "files" predates "huggingface", and keeps matching it.
_ALSO = {"files": {"huggingface"}}
_DIR_MARKERS = {"commit_success": "orbax", ".metadata": "dcp", "_SUCCESS": "files",
                "COMPLETE": "files", "DONE": "files", "trainer_state.json": "huggingface"}
_FILE_EXTENSIONS = {"pt", "pth", "ckpt", "bin", "safetensors", "pkl", "npz", "npy", "msgpack", "h5", "keras"}
_TF_INDEX_RE = re.compile(r"(?P<base>.*-(?P<step>[0-9]+))\.index")
_TF_STATE_RE = re.compile(r'model_checkpoint_path:\s*"([^"]+)"')
_INT = re.compile(r"[0-9]+")  # ASCII digits only: "١٢" is no step
_STEP_KEY = re.compile(r"step[=_-]?([0-9]+)", re.IGNORECASE)  # "epoch=3-step=1200", "global_step15"
MAX_DIGITS = 18  # a longer number is no step (it would not fit a status, nor an int64)
_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.=+-]{0,199}")  # a DeepSpeed tag is one directory name
_ACCELERATE_RE = re.compile(r"(?P<dir>(?:checkpoints/)?[^/]+)/(?P<rest>.+)")
_AUTOMATIC_NAME = re.compile(r"checkpoint_[0-9]+")  # Accelerate's automatic_checkpoint_naming: a save counter
_MEGATRON_DIR = re.compile(r"iter_[0-9]+|release")
_RANDOM_STATES_RE = re.compile(r"random_states_([0-9]+)\.pkl")
_TEMPORARY_PARTS = {"tmp", "temp", "partial", "part", "incomplete", "inprogress", "uploading", "unfinished"}

Reader = Callable[[str, int], "bytes | None"]  # (name relative to the prefix, byte limit) -> bytes


@dataclass(frozen=True)
class Found:
    uri: str
    format: str
    version: int  # generation of the object proving completeness: changes on every save
    number: int | None = None  # what orders saves: the step, or Accelerate's save counter
    step: int | None = None  # the training step, where the format records one
    tag: str | None = None  # the name the framework loads it by: DeepSpeed's tag, Megatron's iteration
    saved_at: datetime | None = None  # when its last object landed: the save was complete from then
    write_s: float | None = None  # a lower bound on its writing time (``write_time``); None when unseen

    @property
    def label(self) -> str:
        """How a person is shown it: ``step 1200``, ``global_step15``, ``release``, ``save 12``, ``last.ckpt``."""
        name = self.uri.rsplit("/", 1)[-1]
        if self.step is not None:
            return f"step {self.step}"
        if self.tag:
            return self.tag
        return f"save {self.number}" if _AUTOMATIC_NAME.fullmatch(name) else name


@dataclass(frozen=True)
class CustomRule:
    """``format: custom``: where saves are (``pattern``) and when one is complete.

    ``pattern`` is relative to the checkpoint prefix and holds ``{step}`` once; one
    ending in ``/`` names directories, which need ``marker`` (an object the trainer
    writes last) or ``same_files`` (complete when it holds every file the previous
    complete save holds); otherwise it names single objects, complete when visible.
    """

    pattern: str
    marker: str | None = None
    same_files: bool = False
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        head, _, tail = self.pattern.partition("{step}")
        end = "" if self.directory else "$"
        object.__setattr__(self, "regex", re.compile(f"{re.escape(head)}([0-9]{{1,{MAX_DIGITS}}}){re.escape(tail)}{end}"))

    @property
    def directory(self) -> bool:
        return self.pattern.endswith("/")


_PATTERN_CHARS = re.compile(r"[-A-Za-z0-9_.=+@,/{}]{1,256}")
_MARKER_RE = re.compile(r"[-A-Za-z0-9_.=+@,]{1,128}(/[-A-Za-z0-9_.=+@,]{1,128}){0,7}")


def rule_problem(pattern: str | None, marker: str | None, same_files: bool) -> tuple[str, str] | None:
    """(field, what is wrong and how to fix it) for a custom rule, or None when it is usable."""
    if pattern is None:
        return "pattern", "format 'custom' needs a pattern, e.g. 'run/step-{step}/' (a directory) or 'ckpt-{step}.pt'"
    if not _PATTERN_CHARS.fullmatch(pattern):
        return "pattern", "use letters, digits, '-_.=+@,' and '/' around one '{step}' (at most 256 characters)"
    if pattern.count("{step}") != 1 or pattern.replace("{step}", "").count("{") + pattern.count("}") > 1:
        return "pattern", "must hold '{step}' exactly once, and no other braces"
    head, _, tail = pattern.partition("{step}")
    if head[-1:].isdigit() or tail[:1].isdigit():
        return "pattern", "'{step}' must not touch a digit: the step could not be told from it"
    parts = pattern.removesuffix("/").split("/")
    if pattern.startswith("/") or "" in parts or {".", ".."} & set(parts):
        return "pattern", "must be relative to checkpoint.uri: no leading '/', no '//', '.' or '..'"
    if not pattern.endswith("/"):
        if marker is not None or same_files:
            return ("marker" if marker is not None else "same_files",
                    "a pattern without a trailing '/' names single objects, complete when visible: "
                    "remove it, or end the pattern with '/' to name directories")
        return None
    if (marker is None) == (not same_files):
        return ("marker", "a directory pattern needs one completion rule: 'marker' (the object your trainer "
                          "writes last in each save) or 'same_files: true', not both and not neither")
    if marker is not None and (not _MARKER_RE.fullmatch(marker) or {".", ".."} & set(marker.split("/"))):
        return "marker", "an object name inside the save: letters, digits, '-_.=+@,' and '/', no '.' or '..'"
    return None


def split_uri(uri: str) -> tuple[str, str]:
    """``gs://bucket/a/b`` -> (``bucket``, ``a/b/``): the listing prefix of a checkpoint root."""
    bucket, _, path = uri.removeprefix("gs://").partition("/")
    path = path.strip("/")
    return bucket, f"{path}/" if path else ""


def latest(
    uri: str, listing: Iterable[BlobInfo], read: Reader, fmt: str = "auto", rule: CustomRule | None = None
) -> Found | None:
    """The newest complete checkpoint under ``uri``, or None.

    ``read(name, limit)`` reads an object by its name relative to the prefix, None when
    it is missing or over ``limit`` bytes; it is called only for trackers and for the
    chosen HuggingFace save's ``trainer_state.json``.
    """
    bucket, prefix = split_uri(uri)
    root = f"gs://{bucket}/{prefix}"
    objects = {b.name[len(prefix) :]: b for b in listing if b.name.startswith(prefix)}
    found = _latest(root, objects, read, fmt, rule)
    return _timed(found, root, objects) if found else None


# A generous upload rate for a save to Cloud Storage: about ten times what one VM was measured
# uploading here (a 515 MiB checkpoint in 5.8 s, ~93 MB/s). A save takes at least its bytes at
# this rate; one that many hosts write at once can go faster in all, and then even this bound
# is only an estimate.
UPLOAD_BYTES_PER_S = 1e9
WRITE_TIME_SOURCE = ("a lower bound from Cloud Storage: the save's first object to its last, and no less "
                     f"than its bytes at {UPLOAD_BYTES_PER_S / 1e9:g} GB/s (no save reported by the trainer)")


def write_time(first: datetime, last: datetime, total_bytes: int) -> float | None:
    """A lower bound on a save's writing time (C), from what a listing shows of it; None when it shows nothing.

    GCS dates an object when its upload is finalized, not when its writing began: the span
    from the first object to the last misses the first object's own upload, and shards that
    finish together read as a save of about no time at all. So C is at least that span and at
    least the save's total bytes at ``UPLOAD_BYTES_PER_S``. Still a lower bound: the time the
    trainer spends serialising before its first byte reaches GCS is seen by neither."""
    bound = max((last - first).total_seconds(), max(total_bytes, 0) / UPLOAD_BYTES_PER_S)
    return bound if bound > 0 else None


def _timed(found: Found, root: str, objects: dict[str, BlobInfo]) -> Found:
    """When the save landed, and a lower bound on how long it took to write (``write_time``):
    a directory's objects from its first to its last (the completion marker every directory
    format writes last) and their bytes; a single object's bytes. This is the checkpoint cost
    the interval advice weighs (``controller.core.ledger.checkpoint_every``)."""
    if not found.uri.startswith(root):
        return found  # a pointer naming a save elsewhere: not in this listing
    name = found.uri[len(root):].rstrip("/")
    if name in objects:  # one object: complete when it appears; its bytes bound its writing time
        blob = objects[name]
        return replace(found, saved_at=blob.updated, write_s=write_time(blob.updated, blob.updated, blob.size))
    blobs = [b for n, b in objects.items() if n.startswith(name + "/")]
    if not blobs:
        return found
    first, last = min(b.updated for b in blobs), max(b.updated for b in blobs)
    return replace(found, saved_at=last, write_s=write_time(first, last, sum(b.size for b in blobs)))


def _latest(root: str, objects: dict[str, BlobInfo], read: Reader, fmt: str, rule: CustomRule | None) -> Found | None:
    if fmt == "custom":
        return _custom(root, objects, rule) if rule else None
    trackers = [
        ("pointer", _pointer), ("deepspeed", _deepspeed), ("megatron", _megatron),
        ("tensorflow", _tf_state), ("lightning", _lightning),
    ]
    for name, find in trackers:
        if fmt in ("auto", name) and (found := find(root, objects, read)):
            return found
    accepted = {fmt, *_ALSO.get(fmt, ())}
    candidates = [c for c in [*_numbered(root, objects), *_accelerate(root, objects)]
                  if fmt == "auto" or c.format in accepted]
    best = _newest(candidates)
    return _with_trainer_state(best, objects, read) if best and best.format == "huggingface" else best


def _newest(candidates: Iterable[Found]) -> Found | None:
    return max(candidates, key=lambda c: (c.number or 0, c.version), default=None)


def _step(text: str) -> int | None:
    """The step a name carries: after ``step`` where it says so, else its last number."""
    numbers = _STEP_KEY.findall(text) or _INT.findall(text)
    return int(numbers[-1]) if numbers and len(numbers[-1]) <= MAX_DIGITS else None


def temporary(name: str) -> bool:
    """A name a writer uses before its save is whole: ``ckpt_5.pt.tmp``, ``x.partial``, ``tmpab12``, ``.x``,
    NeMo's ``<save>-unfinished`` marker."""
    lower = name.lower()
    return lower.startswith((".", "tmp", "~")) or bool(_TEMPORARY_PARTS & set(re.split(r"[._~-]", lower)))


def _text(read: Reader, name: str, objects: dict[str, BlobInfo]) -> str | None:
    if name not in objects or not (raw := read(name, MAX_POINTER_BYTES)):
        return None
    return raw.decode(errors="replace").strip()


def _has_dir(objects: dict[str, BlobInfo], directory: str) -> bool:
    start = directory + "/"
    return any(n.startswith(start) for n in objects)


def _pointer(root: str, objects: dict[str, BlobInfo], read: Reader) -> Found | None:
    if not (target := _text(read, "LATEST", objects)):
        return None
    relative = target.removeprefix(root).strip("/")
    if not relative or not (relative in objects or _has_dir(objects, relative)):
        return None  # points at nothing that exists (deleted, or another bucket): untrusted
    step = _step(relative)
    return Found(root + relative, "pointer", objects["LATEST"].generation, number=step, step=step)


def _deepspeed(root: str, objects: dict[str, BlobInfo], read: Reader) -> Found | None:
    """``latest`` holds the tag (``global_step<N>``, no newline) of the newest ``save_checkpoint``.

    DeepSpeed's rank 0 writes ``latest`` after its own files but without waiting for the
    other ranks' (engine.save_checkpoint has no barrier before it). So the tagged save
    counts when it also holds every file of the previous complete save of its kind
    (``_complete_by_siblings``); otherwise the newest complete one before it is chosen.
    """
    tag = _text(read, "latest", objects)
    if not tag or not _TAG_RE.fullmatch(tag) or not _has_dir(objects, tag):
        return None
    step = _step(tag)
    tagged = Found(root + tag, "deepspeed", objects["latest"].generation, number=step, step=step, tag=tag)
    numbered = re.fullmatch(r"(.*?)([0-9]{1,18})", tag)
    if numbered is None:
        return tagged  # a tag of the user's own ("best"): nothing to compare it with
    same_kind = re.compile(f"({re.escape(numbered.group(1))}([0-9]{{1,18}}))/(.+)")

    def locate(name: str) -> tuple[str, int, str] | None:
        m = same_kind.fullmatch(name)
        return (m.group(1), int(m.group(2)), m.group(3)) if m else None

    limit = int(numbered.group(2))
    complete = _complete_by_siblings([s for s in _saves(objects, locate) if s.number <= limit], lambda _: True)
    if complete and complete[-1].directory == tag:
        return tagged
    whole = next((s for s in reversed(complete) if s.number < limit), None)
    if whole is None:
        return None
    return Found(root + whole.directory, "deepspeed", whole.version, number=whole.number, step=_step(whole.directory),
                 tag=whole.directory)


def _megatron(root: str, objects: dict[str, BlobInfo], read: Reader) -> Found | None:
    """``latest_checkpointed_iteration.txt`` holds an iteration (``iter_{:07d}/``) or ``release``."""
    tracker = "latest_checkpointed_iteration.txt"
    value = _text(read, tracker, objects)
    if value == "release":
        directory, step = "release", None
    elif value and value.isascii() and value.isdigit() and len(value) <= 18:
        step = int(value)
        directory, value = f"iter_{step:07d}", str(step)
    else:
        return None
    if not _has_dir(objects, directory):
        return None
    return Found(root + directory, "megatron", objects[tracker].generation, number=step, step=step, tag=value)


def _tf_state(root: str, objects: dict[str, BlobInfo], read: Reader) -> Found | None:
    match = _TF_STATE_RE.search(_text(read, "checkpoint", objects) or "")
    index = f"{match.group(1)}.index" if match else None
    if index is None or index not in objects:
        return None
    step = _step(match.group(1))
    return Found(root + match.group(1), "tensorflow", objects[index].generation, number=step, step=step)


def _lightning(root: str, objects: dict[str, BlobInfo], read: Reader) -> Found | None:
    last = objects.get("last.ckpt")
    return Found(root + "last.ckpt", "lightning", last.generation) if last else None


def _numbered(root: str, objects: dict[str, BlobInfo]) -> Iterable[Found]:
    """Every complete numbered checkpoint: files, marked directories, TF index prefixes."""
    for name, blob in objects.items():
        if "/" not in name:
            if temporary(name):
                continue
            if tf := _TF_INDEX_RE.fullmatch(name):
                if (step := _step(tf.group("step"))) is not None:
                    yield Found(root + tf.group("base"), "tensorflow", blob.generation, number=step, step=step)
            elif name.rpartition(".")[2] in _FILE_EXTENSIONS and (step := _step(name.rpartition(".")[0])) is not None:
                yield Found(root + name, "files", blob.generation, number=step, step=step)
            continue
        directory, _, leaf = name.partition("/")
        if temporary(directory) or f"{directory}-unfinished" in objects or (step := _step(directory)) is None:
            continue  # .orbax-checkpoint-tmp-12, step_5.partial/, a NeMo save still being written
        if _MEGATRON_DIR.fullmatch(directory):
            continue  # Megatron's (its torch_dist saves hold .metadata): only its tracker makes one complete
        for marker, fmt in _DIR_MARKERS.items():
            if leaf == marker or (marker == "commit_success" and leaf.startswith(marker)):
                yield Found(root + directory, fmt, blob.generation, number=step, step=step)


def _with_trainer_state(found: Found, objects: dict[str, BlobInfo], read: Reader) -> Found:
    """HuggingFace's real step is ``global_step`` in ``trainer_state.json``; the name's number if unreadable."""
    name = f"{found.uri.rsplit('/', 1)[-1]}/trainer_state.json"
    info = objects.get(name)
    if info is None or info.size > MAX_TRAINER_STATE_BYTES or not (raw := read(name, MAX_TRAINER_STATE_BYTES)):
        return found
    try:
        state = json.loads(raw)
    except (ValueError, RecursionError):  # a torn or hostile file ("[" * 10**5): the directory's number stands
        return found
    step = state.get("global_step") if isinstance(state, dict) else None
    if isinstance(step, int) and not isinstance(step, bool) and 0 <= step < 2**63:
        return replace(found, step=step)
    return found


@dataclass(frozen=True)
class _Save:
    """One numbered save directory: what it holds (its top-level entries) and its newest generation."""

    directory: str
    number: int
    entries: frozenset[str]
    version: int


Locate = Callable[[str], "tuple[str, int, str] | None"]  # object name -> (save directory, number, rest)


def _saves(objects: dict[str, BlobInfo], locate: Locate) -> list[_Save]:
    """The numbered save directories ``locate`` finds, oldest first; none with a ``<directory>-unfinished``
    object beside it: that says the save is still being written, in every format (NeMo writes it; respawnkit
    writes it before a save's first object and removes it after its last)."""
    found: dict[str, tuple[int, set[str], list[int]]] = {}
    for name, blob in objects.items():
        if where := locate(name):
            directory, number, rest = where
            if f"{directory}-unfinished" in objects:
                continue
            _, entries, generations = found.setdefault(directory, (number, set(), []))
            entries.add(rest.split("/", 1)[0])
            generations.append(blob.generation)
    return sorted((_Save(d, n, frozenset(e), max(g)) for d, (n, e, g) in found.items()),
                  key=lambda s: (s.number, s.directory))


def _complete_by_siblings(saves: list[_Save], first_is_complete: Callable[[_Save], bool]) -> list[_Save]:
    """The saves, oldest first, that hold every entry the previous complete save holds.

    A save with fewer entries than its predecessor is partial (a rank still writing, or
    cut off); one with more is fine (a new file kind, more ranks). The oldest save has
    nothing to be compared with: ``first_is_complete`` judges it. The price: after the
    number of processes shrinks, no save of the new, smaller shape ever counts.
    """
    complete: list[_Save] = []
    for save in saves:
        if save.entries >= complete[-1].entries if complete else first_is_complete(save):
            complete.append(save)
    return complete


def _accelerate(root: str, objects: dict[str, BlobInfo]) -> Iterable[Found]:
    """Accelerate's ``save_state``: ``[checkpoints/]checkpoint_<i>/`` (automatic naming) or a named one.

    It writes no completion marker: the main process writes the model, optimizer,
    scheduler (sampler) files, then its ``random_states_0.pkl`` and the custom objects;
    every process writes its ``random_states_<rank>.pkl`` (and ``scaler.pt``), in any
    order. Those random states are what marks a numbered directory as Accelerate's. A
    save counts when it holds a model, the random states of ranks 0..R without a gap,
    and every entry of the previous complete save (``_complete_by_siblings``). With
    automatic naming, ``i`` counts saves, not steps: no step is reported for it.
    """

    def locate(name: str) -> tuple[str, int, str] | None:
        if not (m := _ACCELERATE_RE.fullmatch(name)):
            return None
        numbers = _INT.findall(m.group("dir"))
        if not numbers or len(numbers[-1]) > MAX_DIGITS:
            return None
        return m.group("dir"), int(numbers[-1]), m.group("rest")

    saves = [s for s in _saves(objects, locate) if _accelerate_shape(s)]
    for save in _complete_by_siblings(saves, lambda _: True):
        name = save.directory.rsplit("/", 1)[-1]
        step = None if _AUTOMATIC_NAME.fullmatch(name) or not _STEP_KEY.search(name) else _step(name)
        yield Found(root + save.directory, "accelerate", save.version, number=save.number, step=step)


def _accelerate_shape(save: _Save) -> bool:
    ranks = sorted(int(m.group(1)) for e in save.entries if (m := _RANDOM_STATES_RE.fullmatch(e)))
    has_model = any(e.startswith(("model", "pytorch_model")) for e in save.entries)
    return has_model and bool(ranks) and ranks == list(range(len(ranks)))


def _custom(root: str, objects: dict[str, BlobInfo], rule: CustomRule) -> Found | None:
    """The user's rule. Its pattern is exact, so a temporary name can only match when the pattern says so."""
    if not rule.directory:
        files = [Found(root + name, "custom", blob.generation, number=int(m.group(1)), step=int(m.group(1)))
                 for name, blob in objects.items() if (m := rule.regex.match(name))]
        return _newest(files)

    def locate(name: str) -> tuple[str, int, str] | None:
        m = rule.regex.match(name)  # the pattern ends in "/": what follows is inside the save
        return (name[: m.end() - 1], int(m.group(1)), name[m.end() :]) if m and m.end() < len(name) else None

    saves = _saves(objects, locate)
    if rule.marker is not None:
        complete = [replace(s, version=objects[f"{s.directory}/{rule.marker}"].generation)
                    for s in saves if f"{s.directory}/{rule.marker}" in objects]
    else:  # the oldest save is trusted once the trainer has moved on to a newer one
        complete = _complete_by_siblings(saves, lambda s: s is not saves[-1])
    return _newest(Found(root + s.directory, "custom", s.version, number=s.number, step=s.number) for s in complete)
