"""No prefix of a save's upload looks complete to respawn's finder: whatever files the save holds (those the finder
takes as proofs, shapes that are proofs, names that only look like either), in whatever layout, over whatever an
earlier save or a cut-off attempt left in the bucket, and in every format the finder may be told to read. A VM
killed at any point of an upload resumes from a whole save or an older one, never from the one cut off."""

from __future__ import annotations

import itertools
import os
from datetime import UTC, datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.core import checkpoints
from controller.core.checkpoints import CustomRule
from controller.core.ports import BlobInfo
from respawnkit import DCP, HUGGINGFACE, ORBAX, STEP_DIR, CheckpointSaver, Layout
from respawnkit.notice import Notice
from respawnkit.progress import Progress

URI = "gs://b/run"
T = datetime(2026, 1, 1, tzinfo=UTC)
STEP = 10

# (layout, the format respawn's finder calls its saves, or None where only a custom rule finds them)
LAYOUTS = [
    (STEP_DIR, "files"), (HUGGINGFACE, "huggingface"), (DCP, "dcp"), (ORBAX, "orbax"),
    (Layout("checkpoint_{step}", "_SUCCESS"), "files"),  # Accelerate's automatic naming
    (Layout("checkpoints/checkpoint_{step}", "_SUCCESS"), None),  # ... under checkpoints/: only Accelerate's rule
    (Layout("save-{step}", "done.txt"), None),  # a marker of the user's own
]
PROOFS = [".metadata", "_SUCCESS", "COMPLETE", "DONE", "trainer_state.json", "commit_success.txt",
          "commit_success_0", "random_states_0.pkl", "random_states_1.pkl", "random_states_2.pkl"]
LOOKALIKES = ["model.safetensors", "pytorch_model.bin", "model/part-1.safetensors", "model/part-2.safetensors",
              "random_states_0.pkl/x", "optimizer.bin", "scheduler.bin", "sub/.metadata", "sub/_SUCCESS",
              "nested/trainer_state.json", "__0_0.distcp", "latest", "LATEST", "checkpoint", "last.ckpt",
              "ckpt-3.index", "step-9.pt", "x-unfinished", "tmp1", ".hidden", "done.txt"]


def valid(files: frozenset[str]) -> bool:
    """A file set a folder can hold: no name is also another's folder."""
    return not any("/".join(f.split("/")[:i]) in files for f in files for i in range(1, f.count("/") + 1))


class Memory:
    """A bucket in memory that logs each change, to replay the upload up to any point."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.start = dict(objects)
        self.ops: list[tuple[str, str, bytes]] = []
        self.uri = URI

    def put(self, local: str, name: str) -> None:
        with open(local, "rb") as f:
            self.ops.append(("put", name, f.read()))

    def delete(self, name: str) -> None:
        self.ops.append(("delete", name, b""))

    def after(self, k: int) -> dict[str, tuple[bytes, int]]:
        objects = {n: (data, 0) for n, data in self.start.items()}
        for generation, (op, name, data) in enumerate(self.ops[:k], start=1):
            if op == "put":
                objects[name] = (data, generation)
            else:
                objects.pop(name, None)
        return objects


def latest(objects: dict[str, tuple[bytes, int]], fmt: str, rule: CustomRule | None) -> str | None:
    listing = [BlobInfo("b", f"run/{n}", gen + 1, T, len(data)) for n, (data, gen) in objects.items()]

    def read(name: str, limit: int) -> bytes | None:
        data = objects.get(name, (None, 0))[0]
        return data if data is not None and len(data) <= limit else None

    found = checkpoints.latest(URI, listing, read, fmt, rule)
    return found.uri if found else None


def rule_for(layout: Layout) -> CustomRule:
    """The custom rule a user would write for the layout: its folders, its marker."""
    return CustomRule(layout.pattern.replace("{step:09d}", "{step}") + "/", marker=layout.marker)


def save(layout: Layout, step: int, files: frozenset[str]) -> dict[str, bytes]:
    """The objects of a whole save, as an earlier attempt left it."""
    name = layout.name(step)
    return {f"{name}/{f}": f"old {f}".encode() for f in files | {str(layout.marker)}}


@st.composite
def uploads(draw: st.DrawFn) -> tuple[Layout, str | None, frozenset[str], dict[str, bytes]]:
    layout, fmt = draw(st.sampled_from(LAYOUTS))
    files = draw(st.frozensets(st.sampled_from(PROOFS + LOOKALIKES), max_size=10).filter(valid))
    if layout.marker_from_writer:
        files |= {str(layout.marker)}
    if not valid(files):
        files = frozenset({str(layout.marker)})
    before: dict[str, bytes] = {}
    if draw(st.booleans()):  # a whole save before it, of the same shape: the finder compares shapes
        before |= save(layout, STEP - 5, files)
    if draw(st.booleans()):  # what an attempt cut off mid-upload left of this very step
        left = draw(st.frozensets(st.sampled_from(sorted(files | {str(layout.marker)})))) if files else frozenset()
        before |= {k: v for k, v in save(layout, STEP, files).items() if k.split("/")[-1] in left or
                   k.removeprefix(layout.name(STEP) + "/") in left}
        if draw(st.booleans()):
            before[layout.name(STEP) + "-unfinished"] = b""
    return layout, fmt, files, before


def upload(layout: Layout, files: frozenset[str], before: dict[str, bytes], tmp: str) -> Memory:
    store = Memory(before)
    saver = CheckpointSaver(store=store, layout=layout, sigterm=Notice(), progress=Progress(path=""),
                            staging_dir=tmp, every_s=None)

    def write(folder: str) -> None:
        for f in files:
            os.makedirs(os.path.dirname(os.path.join(folder, f)), exist_ok=True)
            with open(os.path.join(folder, f), "wb") as out:
                out.write(f"new {f}".encode())

    assert saver.save(STEP, write)
    assert saver.close(10) and saver.errors == []
    return store


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(uploads())
def test_no_prefix_of_an_upload_looks_complete_whatever_the_files_layout_and_format(tmp_path, case) -> None:
    layout, fmt, files, before = case
    store = upload(layout, files, before, str(tmp_path))
    new = f"{URI}/{layout.name(STEP)}"
    rule = rule_for(layout)
    formats = [("auto", None), ("custom", rule), *([(fmt, None)] if fmt else []),
               *((f, None) for f in ("accelerate", "files", "dcp", "huggingface", "orbax"))]
    for k, (f, r) in itertools.product(range(1, len(store.ops)), formats):
        assert latest(store.after(k), f, r) != new, (f"after {store.ops[k - 1][:2]}", f, store.ops)
    whole = store.after(len(store.ops))
    assert latest(whole, "custom", rule) == new
    if fmt is not None:
        assert latest(whole, "auto", None) == new
    assert layout.name(STEP) + "-unfinished" not in whole


def test_an_accelerate_shaped_save_is_not_complete_before_its_scheduler_lands(tmp_path) -> None:
    # the reviewer's case: Accelerate's save_state files in the default layout; in name order random_states_0.pkl
    # landed before scheduler.bin, and with the model it made Accelerate's shape, which the finder took as complete
    files = frozenset({"model.safetensors", "optimizer.bin", "random_states_0.pkl", "scheduler.bin"})
    store = upload(STEP_DIR, files, {}, str(tmp_path))
    picked = [latest(store.after(k), "auto", None) for k in range(1, len(store.ops) + 1)]
    assert picked == [None] * (len(store.ops) - 1) + [f"{URI}/step-000000010"], store.ops
