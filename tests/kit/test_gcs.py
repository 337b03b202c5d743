"""The kit against Cloud Storage (the local fake-gcs-server): saves land where respawn's own GCS adapter and
finder see them, and resume_from downloads them; with google-cloud-storage, and with the standard library's
JSON API client that a bare VM falls back to."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

import respawnkit
from controller.adapters.gcs import GcsStore
from controller.core import checkpoints, errors
from localcloud.gcs import LocalGcs, client
from respawnkit.notice import Notice
from respawnkit.progress import Progress
from respawnkit.stores import _ClientStore, _JsonApiStore

BUCKET = "kit-ckpt"


@pytest.fixture(scope="module")
def gcs() -> Iterator[LocalGcs]:
    with LocalGcs(buckets=(BUCKET,)) as g:
        yield g


def found_by_respawn(gcs: LocalGcs, uri: str) -> checkpoints.Found | None:
    """What the controller would choose: its GCS adapter's listing and reads, its finder."""
    store = GcsStore(client(gcs.url))
    bucket, prefix = checkpoints.split_uri(uri)

    def read(relative: str, limit: int) -> bytes | None:
        try:
            return store.read(bucket, prefix + relative, limit=limit).data
        except (errors.NotFound, errors.TooLarge):
            return None

    return checkpoints.latest(uri, store.list(bucket, prefix), read)


@pytest.mark.parametrize("kind", [_ClientStore, _JsonApiStore])
def test_saves_to_gcs_are_what_respawn_resumes_from(gcs, kind, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.url)
    uri = f"gs://{BUCKET}/{kind.__name__}/run"
    saver = respawnkit.CheckpointSaver(store=kind(uri), sigterm=Notice(), progress=Progress(path=""),
                                       layout=respawnkit.HUGGINGFACE)
    for step in (3, 6):
        def write(folder: str, step: int = step) -> None:
            os.makedirs(os.path.join(folder, "nested"))
            with open(os.path.join(folder, "nested", "model.bin"), "wb") as f:
                f.write(bytes(range(256)) * step)
            with open(os.path.join(folder, "trainer_state.json"), "w") as f:
                json.dump({"global_step": step}, f)
        assert saver.save(step, write)
    assert saver.flush(30) and saver.errors == []
    found = found_by_respawn(gcs, uri)
    assert (found.uri, found.format, found.step) == (f"{uri}/checkpoint-6", "huggingface", 6)

    monkeypatch.setenv("RESUME_FROM", found.uri)
    monkeypatch.setenv("RESUME_STEP", str(found.step))
    resume = respawnkit.resume_from(download_to=str(tmp_path))
    assert resume.step == 6 and resume.path == str(tmp_path / "checkpoint-6")
    assert (tmp_path / "checkpoint-6" / "nested" / "model.bin").read_bytes() == bytes(range(256)) * 6
    assert json.loads((tmp_path / "checkpoint-6" / "trainer_state.json").read_text()) == {"global_step": 6}
