"""resume_from(download_to=...) writes only under its folder, whatever the checkpoint bucket's object names say:
whoever can write the bucket must not be able to write anywhere else on the resuming VM."""

from __future__ import annotations

import os
import re

import pytest

import respawnkit
from respawnkit import resume


class Listed:
    """A bucket listing as Cloud Storage may hand it over: any string is an object name there."""

    def __init__(self, names: list[str]) -> None:
        self.listed = names
        self.got: list[str] = []

    def names(self, under: str = "") -> list[str]:
        return [n for n in self.listed if n.startswith(under)]

    def get(self, name: str, local: str) -> None:
        self.got.append(name)
        with open(local, "w") as f:
            f.write(f"object {name}")


def files_under(path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(where, leaf), path)
                  for where, _, leaves in os.walk(path) for leaf in leaves)


@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch):
    def serve(names: list[str]) -> Listed:
        store = Listed(names)
        monkeypatch.setattr(resume, "open_store", lambda uri: store)
        monkeypatch.setenv("RESUME_FROM", "gs://b/run/step-5")
        return store
    return serve


@pytest.mark.parametrize("hostile", [
    "step-5/../../escaped",  # the reviewer's: two levels above the download folder
    "step-5/a/../../../escaped",
    "step-5/..",  # normalises to the download folder itself
    "step-5/.",  # the save's own folder, as a file
    "step-5/",  # a folder placeholder: the save's folder itself
    "step-5//etc/escaped",  # an empty component, where a join on some systems restarts at the root
    "step-5/..\\..\\escaped",  # a separator on Windows
    "step-5/a\0b",
    "step-5-other/escaped",  # listed under the prefix, but not inside the save
])
def test_a_save_holding_an_object_name_that_could_leave_the_folder_is_refused_naming_it(bucket, tmp_path,
                                                                                       hostile) -> None:
    store = bucket(["step-5/model.bin", hostile, "step-5/zz.bin"])
    with pytest.raises(ValueError, match=re.escape(f"refusing to download gs://b/run/step-5: its object {hostile!r}")):
        respawnkit.resume_from(download_to=str(tmp_path / "resume"))
    assert store.got == [] and files_under(tmp_path) == []  # refused whole, before a single write


def test_a_symlink_already_in_the_folder_is_never_written_through(bucket, tmp_path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("mine")
    folder = tmp_path / "resume"
    (folder / "step-5").mkdir(parents=True)
    (folder / "step-5" / "sub").symlink_to(outside)  # a folder left by an earlier run
    (folder / "step-5" / "w.bin").symlink_to(outside / "victim")  # a file
    for name in ("step-5/sub/victim", "step-5/sub/new/file", "step-5/w.bin"):
        store = bucket(["step-5/a.bin", name])
        with pytest.raises(ValueError, match=re.escape(f"its object {name!r} would be written through a symlink")):
            respawnkit.resume_from(download_to=str(folder))
        assert store.got == []
    assert files_under(outside) == ["victim"] and (outside / "victim").read_text() == "mine"


def test_an_object_that_would_be_both_a_file_and_a_folder_is_refused(bucket, tmp_path) -> None:
    bucket(["step-5/a", "step-5/a/b"])
    with pytest.raises(ValueError, match="'step-5/a/b' is inside another object"):
        respawnkit.resume_from(download_to=str(tmp_path))


def test_names_that_only_look_odd_are_downloaded_where_they_say(bucket, tmp_path) -> None:
    names = ["step-5/.metadata", "step-5/..data", "step-5/a..b/c", "step-5/epoch=3-step=5.ckpt", "step-5/_SUCCESS"]
    store = bucket(names)
    got = respawnkit.resume_from(download_to=str(tmp_path / "resume"))
    assert got.path == str(tmp_path / "resume" / "step-5") and sorted(store.got) == sorted(names)
    assert files_under(tmp_path) == sorted(os.path.join("resume", *n.split("/")) for n in names)
