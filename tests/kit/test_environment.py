"""What the kit reads of the agent's environment, and that it needs nothing but the standard library."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import respawnkit
from tests.kit.conftest import REPO

# Any google.* import fails, even one a .pth file prepared; -S leaves site-packages off the path altogether.
_NO_GOOGLE = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == "google" or name.startswith("google."):
            raise ImportError("no google package here: " + name)
        return None
sys.meta_path.insert(0, Refuse())
for name in [m for m in sys.modules if m == "google" or m.startswith("google.")]:
    del sys.modules[name]
sys.path.insert(0, REPO)
import os, tempfile
import respawnkit
from respawnkit.stores import open_store
root = tempfile.mkdtemp()
with respawnkit.CheckpointSaver(os.path.join(root, "ckpt"), handle_sigterm=False) as saver:
    saver.save(3, lambda d: open(os.path.join(d, "w.bin"), "wb").close())
print(sorted(os.listdir(os.path.join(root, "ckpt", "step-000000003"))))
print(type(open_store("gs://bucket/ckpt")).__name__)
print([m for m in sys.modules if m.split(".")[0] in ("google", "torch", "numpy", "fsspec", "requests")])
"""


def test_kit_imports_with_no_google_cloud_package_installed() -> None:
    code = _NO_GOOGLE.replace("REPO", repr(REPO))
    result = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60,
                            env={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/")})
    assert result.returncode == 0, result.stderr
    saved, gcs, imported = result.stdout.splitlines()
    assert saved == "['_SUCCESS', 'w.bin']"
    assert gcs == "_JsonApiStore"  # gs:// falls back to the JSON API over urllib
    assert imported == "[]"


def test_resume_from_is_none_on_a_fresh_start() -> None:
    assert respawnkit.resume_from() is None


def test_resume_from_reads_uri_step_and_tag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESUME_FROM", "gs://b/run/global_step40")
    monkeypatch.setenv("RESUME_STEP", "40")
    monkeypatch.setenv("RESUME_TAG", "global_step40")
    resume = respawnkit.resume_from()
    assert resume == respawnkit.Resume("gs://b/run/global_step40", 40, "global_step40", None)
    with pytest.raises(ValueError, match="download_to"):
        os.fspath(resume)


def test_resume_step_comes_from_the_name_when_respawn_gives_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESUME_FROM", "gs://b/run/step-000000120")
    monkeypatch.setenv("RESUME_STEP", "")
    assert respawnkit.resume_from().step == 120


def test_resume_from_downloads_a_folder(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    save = tmp_path / "bucket" / "step-000000007"
    (save / "sub").mkdir(parents=True)
    (save / "w.bin").write_bytes(b"weights")
    (save / "sub" / "opt.bin").write_bytes(b"optimizer")
    (save / ".metadata").write_bytes(b"dcp")  # a hidden name is part of a save (DCP's marker)
    monkeypatch.setenv("RESUME_FROM", str(save))
    resume = respawnkit.resume_from(download_to=str(tmp_path / "here"))
    assert resume.step == 7
    assert resume.path == str(tmp_path / "here" / "step-000000007")
    assert (tmp_path / "here" / "step-000000007" / "sub" / "opt.bin").read_bytes() == b"optimizer"
    assert (tmp_path / "here" / "step-000000007" / ".metadata").read_bytes() == b"dcp"
    assert os.fspath(resume) == resume.path


def test_resume_from_a_local_folder_needs_no_download(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("RESUME_FROM", f"file://{tmp_path}/step-000000002")
    assert respawnkit.resume_from().path == f"{tmp_path}/step-000000002"


@pytest.mark.parametrize("value, expected", [("600", 600.0), ("42.5", 42.5), ("", None), ("0", None),
                                             ("-5", None), ("soon", None), ("inf", None)])
def test_checkpoint_every_is_respawns_advice_or_none(monkeypatch: pytest.MonkeyPatch, value, expected) -> None:
    monkeypatch.setenv("RESPAWN_CHECKPOINT_EVERY_S", value)
    assert respawnkit.checkpoint_every() == expected


def test_checkpoint_every_unset_is_none() -> None:
    assert respawnkit.checkpoint_every() is None


def test_saver_needs_a_prefix() -> None:
    with pytest.raises(ValueError, match="RESPAWN_CHECKPOINT_URI"):
        respawnkit.CheckpointSaver(handle_sigterm=False)
