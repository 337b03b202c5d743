"""Checkpoint discovery: the newest *complete* checkpoint of every supported format."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from controller.checkpoints import latest, split_uri
from controller.ports import BlobInfo

URI = "gs://ck/runs/a"
T = datetime(2026, 1, 1, tzinfo=UTC)


def find(names: list[str], contents: dict[str, str] | None = None, fmt: str = "auto"):
    listing = [BlobInfo("ck", f"runs/a/{n}", i + 1, T) for i, n in enumerate(names)]
    # noise outside the prefix must be ignored
    listing.append(BlobInfo("ck", "runs/ab/999/commit_success.txt", 999, T))
    contents = contents or {}
    return latest(URI, listing, lambda rel: contents.get(rel, "").encode() or None, fmt)


@pytest.mark.parametrize(
    "names, uri, step, fmt",
    [
        # orbax: a step directory counts only with commit_success
        (["100/state/a", "100/commit_success.txt", "200/state/a"], "gs://ck/runs/a/100", 100, "orbax"),
        (["100/commit_success.txt", "200/commit_success.txt"], "gs://ck/runs/a/200", 200, "orbax"),
        (["100/commit_success.txt", "300.orbax-checkpoint-tmp-12/commit_success.txt"], "gs://ck/runs/a/100", 100, "orbax"),
        # torch.distributed.checkpoint: .metadata is written last
        (["step_5/__0_0.distcp", "step_5/.metadata", "step_9/__0_0.distcp"], "gs://ck/runs/a/step_5", 5, "dcp"),
        # numbered plain files are single objects: complete when visible
        (["ckpt-000120.pt", "ckpt-000080.pt", "notes.txt"], "gs://ck/runs/a/ckpt-000120.pt", 120, "files"),
        # numbered directories need a marker; HF's trainer_state.json is one
        (["checkpoint-50/model.bin", "checkpoint-50/trainer_state.json", "checkpoint-60/model.bin"],
         "gs://ck/runs/a/checkpoint-50", 50, "files"),
        (["step_120/_SUCCESS", "step_130/part-0"], "gs://ck/runs/a/step_120", 120, "files"),
        # TensorFlow without the state file: the .index proves a prefix complete
        (["ckpt-7.index", "ckpt-7.data-00000-of-00001", "ckpt-8.data-00000-of-00001"], "gs://ck/runs/a/ckpt-7", 7, "tensorflow"),
        # Lightning's last.ckpt wins over numbered files
        (["epoch=3-step=1200.ckpt", "last.ckpt"], "gs://ck/runs/a/last.ckpt", None, "lightning"),
    ],
)
def test_chooses_newest_complete(names, uri, step, fmt):
    found = find(names)
    assert found is not None
    assert (found.uri, found.step, found.format) == (uri, step, fmt)


@pytest.mark.parametrize(
    "names",
    [
        [],
        ["100/state/a"],  # orbax step without commit_success
        ["step_5/__0_0.distcp"],  # DCP without .metadata
        ["step_130/part-0"],  # numbered directory without a marker
        ["ckpt-8.data-00000-of-00001"],  # TF data without index
    ],
)
def test_never_chooses_a_partial_checkpoint(names):
    assert find(names) is None


def test_latest_pointer_is_trusted_when_its_target_exists():
    found = find(["100/commit_success.txt", "200/x", "LATEST"], {"LATEST": "200"})
    assert found and (found.uri, found.step, found.format) == ("gs://ck/runs/a/200", 200, "pointer")


def test_latest_pointer_accepts_a_full_uri():
    found = find(["200/x", "LATEST"], {"LATEST": "gs://ck/runs/a/200\n"})
    assert found and found.uri == "gs://ck/runs/a/200"


def test_latest_pointer_to_nothing_falls_back_to_the_listing():
    found = find(["100/commit_success.txt", "LATEST"], {"LATEST": "999"})
    assert found and found.uri == "gs://ck/runs/a/100"


def test_tensorflow_state_file_names_the_latest():
    names = ["ckpt-7.index", "ckpt-9.index", "checkpoint"]
    found = find(names, {"checkpoint": 'model_checkpoint_path: "ckpt-7"\nall_model_checkpoint_paths: "ckpt-7"'})
    assert found and (found.uri, found.step) == ("gs://ck/runs/a/ckpt-7", 7)


def test_tensorflow_state_file_pointing_at_partial_save_is_ignored():
    found = find(["ckpt-7.index", "ckpt-9.data-0", "checkpoint"], {"checkpoint": 'model_checkpoint_path: "ckpt-9"'})
    assert found and found.uri == "gs://ck/runs/a/ckpt-7"


def test_explicit_format_restricts_detection():
    names = ["100/commit_success.txt", "ckpt-000500.pt"]
    assert find(names, fmt="orbax").uri == "gs://ck/runs/a/100"
    assert find(names, fmt="files").uri == "gs://ck/runs/a/ckpt-000500.pt"
    assert find(names, fmt="dcp") is None


def test_version_moves_when_the_same_file_is_rewritten():
    listing1 = [BlobInfo("ck", "runs/a/last.ckpt", 1, T)]
    listing2 = [BlobInfo("ck", "runs/a/last.ckpt", 2, T)]
    a = latest(URI, listing1, lambda _: None)
    b = latest(URI, listing2, lambda _: None)
    assert a and b and a.uri == b.uri and a.version != b.version


def test_split_uri():
    assert split_uri("gs://b/x/y/") == ("b", "x/y/")
    assert split_uri("gs://b") == ("b", "")
