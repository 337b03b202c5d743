"""Code from a local folder (controller/cli/pack.py): what is packed, the bytes it packs to,
the limit, and the content-addressed upload."""

from __future__ import annotations

import io
import os
import tarfile
import tracemalloc
from pathlib import Path

import pytest

from controller.adapters.memory import MemoryStore
from controller.cli import pack

BUCKET = "code-bucket"


def tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, body in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body if isinstance(body, bytes) else body.encode())
    return root


def members(packed: pack.Packed) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(packed.data), mode="r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def test_gitignore_and_respawnignore_rules_decide_what_is_packed(tmp_path):
    src = tree(tmp_path / "src", {
        "train.py": "print('train')\n",
        "data/small.csv": "a,b\n",
        "data/huge.bin": "x",
        "logs/run.log": "noise",
        "notes.log": "noise",
        "keep.log": "kept by a negation",
        "model/sub/weights.pt": "w",
        "model/sub/config.json": "{}",
        "model/.gitignore": "*.pt\n",  # a nested file applies to its own folder only
        "top.pt": "a .pt outside model/ is not ignored by model/.gitignore",
        ".git/HEAD": "ref: refs/heads/main",
        "venv/lib/x.py": "",
        ".gitignore": "*.log\n!keep.log\ndata/\nvenv/\n",
        # Read after .gitignore: it re-includes a file git ignores and excludes more. It cannot
        # bring back a file under an ignored folder (data/): git never enters one.
        ".respawnignore": "!notes.log\nmodel/sub/config.json\n",
    })
    assert sorted(members(pack.pack(src))) == [
        ".gitignore", ".respawnignore", "keep.log", "model/.gitignore", "notes.log", "top.pt", "train.py"]


def test_a_line_git_takes_as_matching_nothing_is_left_out_not_a_crash(tmp_path):
    # pathspec refuses ('!' alone, a trailing backslash) lines git accepts and ignores: a
    # ValueError out of respawn submit, a traceback, for a .gitignore git itself is happy with.
    src = tree(tmp_path / "src", {"train.py": "x", "notes.log": "noise", "keep.log": "kept",
                                  ".gitignore": "!\n*.log\nfoo\\\n!keep.log\n"})
    assert sorted(members(pack.pack(src))) == [".gitignore", "keep.log", "train.py"]


def test_the_same_folder_packs_to_the_same_bytes_whatever_its_times_and_owner(tmp_path):
    files = {"train.py": "print(1)\n", "pkg/__init__.py": "", "pkg/run.sh": "#!/bin/bash\necho hi\n"}
    one, two = tree(tmp_path / "one", files), tree(tmp_path / "two", dict(reversed(list(files.items()))))
    os.chmod(one / "pkg/run.sh", 0o775)
    os.chmod(two / "pkg/run.sh", 0o700)  # executable by its owner in both: packed 0755 in both
    os.utime(two / "train.py", (1_000_000, 1_000_000))
    first, second = pack.pack(one), pack.pack(two)
    assert first.data == second.data and first.sha256 == second.sha256
    assert first.name == f"code/{first.sha256}.tar.gz" and len(first.sha256) == 64
    info = members(first)
    assert [m.name for m in info.values()] == sorted(info)  # sorted members
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in info.values()} == {(pack.MTIME, 0, 0, "", "")}
    assert info["pkg/run.sh"].mode == 0o755 and info["train.py"].mode == 0o644
    (one / "train.py").write_text("print(2)\n")
    assert pack.pack(one).sha256 != first.sha256  # one byte changed: another address


def test_over_the_limit_it_is_refused_naming_the_biggest_files(tmp_path):
    src = tree(tmp_path / "src", {"train.py": "x" * 10, "a.bin": os.urandom(60_000), "b.bin": os.urandom(40_000),
                                  "c.bin": os.urandom(1_000)})
    with pytest.raises(pack.PackError) as refused:
        pack.pack(src, limit=50_000)
    message = str(refused.value)
    assert "a.bin (0.1 MiB)" in message and "b.bin" in message and ".respawnignore" in message
    assert message.index("a.bin") < message.index("b.bin") < message.index("c.bin")  # biggest first
    (src / ".respawnignore").write_text("*.bin\n")
    assert sorted(members(pack.pack(src, limit=50_000))) == [".respawnignore", "train.py"]


def test_one_big_file_is_refused_without_being_packed_whole_into_memory(tmp_path):
    # A checkpoint or a data set left in the folder: packing stopped only between files, so a
    # 20 GB file was compressed whole into memory before being refused.
    src = tree(tmp_path / "src", {"train.py": "x", "model.pt": os.urandom(24 * 1024 * 1024)})
    tracemalloc.start()
    try:
        with pytest.raises(pack.PackError, match=r"model\.pt \(24\.0 MiB\)"):
            pack.pack(src, limit=1024 * 1024)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 6 * 1024 * 1024


def test_a_tarball_is_taken_as_it_is_and_any_other_file_packed_alone(tmp_path):
    made = pack.pack(tree(tmp_path / "src", {"train.py": "print(1)\n"}))
    tarball = tmp_path / "code.tar.gz"
    tarball.write_bytes(made.data)
    assert pack.pack(tarball).data == made.data
    script = tree(tmp_path, {"job.sh": "echo hi\n"}) / "job.sh"
    assert list(members(pack.pack(script))) == ["job.sh"]
    fake = tree(tmp_path, {"bad.tar.gz": "not gzip"}) / "bad.tar.gz"
    with pytest.raises(pack.PackError, match="not a .tar.gz"):
        pack.pack(fake)


def test_an_empty_or_missing_folder_is_refused(tmp_path):
    with pytest.raises(pack.PackError, match="nothing to pack"):
        pack.pack(tree(tmp_path / "src", {".gitignore": "*\n"}))
    with pytest.raises(pack.PackError, match="No such file"):
        pack.pack(tmp_path / "missing")


def test_symlinks_are_packed_as_links_never_followed(tmp_path):
    src = tree(tmp_path / "src", {"train.py": "print(1)\n"})
    outside = tree(tmp_path / "outside", {"secret.txt": "s"})
    (src / "link.py").symlink_to("train.py")
    (src / "elsewhere").symlink_to(outside)
    info = members(pack.pack(src))
    assert info["link.py"].issym() and info["link.py"].linkname == "train.py"
    assert info["elsewhere"].issym() and not any(n.startswith("elsewhere/") for n in info)


def test_an_unchanged_folder_is_not_uploaded_again(tmp_path):
    store = MemoryStore()
    packed = pack.pack(tree(tmp_path / "src", {"train.py": "print(1)\n"}))
    assert pack.upload(store, BUCKET, packed) is True
    generation = store.stat(BUCKET, packed.name).generation
    assert pack.upload(store, BUCKET, pack.pack(tmp_path / "src")) is False
    assert store.stat(BUCKET, packed.name).generation == generation
    assert store.read(BUCKET, packed.name).data == packed.data
    assert packed.uri(BUCKET) == f"gs://{BUCKET}/code/{packed.sha256}.tar.gz"


def test_a_broken_upload_of_the_same_address_is_replaced(tmp_path):
    store = MemoryStore()
    packed = pack.pack(tree(tmp_path / "src", {"train.py": "print(1)\n"}))
    store.put(BUCKET, packed.name, b"truncated")
    assert pack.upload(store, BUCKET, packed) is True
    assert store.read(BUCKET, packed.name).data == packed.data


@pytest.mark.parametrize("code, local", [("./src", True), ("src", True), ("/abs/train.tar.gz", True),
                                         ("~/code", True), ("gs://b/code.tar.gz", False), ("https://x/y", False)])
def test_which_code_values_are_local(code, local):
    assert pack.is_local(code) is local


def test_a_file_gone_between_the_listing_and_its_look_is_left_out_not_a_crash(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / ".train.py.swp").write_text("x")
    real_walk = os.walk

    def walk_then_delete(*args, **kw):  # the editor removes its swap file while we look
        for folder, dirs, names in real_walk(*args, **kw):
            (tmp_path / ".train.py.swp").unlink(missing_ok=True)
            yield folder, dirs, names

    monkeypatch.setattr(os, "walk", walk_then_delete)
    assert [str(p) for p, _ in pack.files(tmp_path)] == ["train.py"]


# -- a folder inside a git repository: the rules above it apply too ---------------------------------
def git(*args: str, cwd: Path) -> None:
    import subprocess

    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, stdin=subprocess.DEVNULL,
                   env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(cwd)})


def test_a_subfolder_of_a_repository_leaves_out_what_its_gitignore_files_above_it_and_info_exclude_keep_out(
        tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    repo = tree(tmp_path / "repo", {
        ".git/HEAD": "ref: refs/heads/main\n",
        ".git/info/exclude": "scratch.txt\n",
        ".gitignore": ".env\n*.pem\n",
        "jobs/.gitignore": "*.ckpt\n",
        "jobs/sub/.env": "OPENAI_API_KEY=sk-secret",
        "jobs/sub/deploy.pem": "-----BEGIN PRIVATE KEY-----",
        "jobs/sub/model.ckpt": "w",
        "jobs/sub/scratch.txt": "notes",
        "jobs/sub/train.py": "print(1)\n",
        "jobs/sub/.respawnignore": "!deploy.pem\n",  # the folder's own file still has the last word
    })
    assert sorted(members(pack.pack(repo / "jobs" / "sub"))) == [".respawnignore", "deploy.pem", "train.py"]


def test_the_users_excludes_file_applies_inside_a_repository_and_only_there(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    tree(tmp_path / "xdg", {"git/ignore": "*.key\n"})  # git's default core.excludesFile
    repo = tree(tmp_path / "repo", {".git/HEAD": "ref: refs/heads/main\n", "sub/id.key": "k", "sub/train.py": "x"})
    assert sorted(members(pack.pack(repo / "sub"))) == ["train.py"]
    plain = tree(tmp_path / "plain", {"id.key": "k", "train.py": "x"})  # no repository: git applies none
    assert sorted(members(pack.pack(plain))) == ["id.key", "train.py"]


def test_core_excludes_file_is_read_as_git_reads_it_in_the_repository(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    repo = tmp_path / "repo"
    repo.mkdir()
    git("init", "-q", cwd=repo)
    tree(tmp_path, {"elsewhere/ignore": "credentials.json\n"})
    git("config", "core.excludesFile", str(tmp_path / "elsewhere" / "ignore"), cwd=repo)
    tree(repo, {"sub/credentials.json": "{}", "sub/train.py": "x"})
    assert sorted(members(pack.pack(repo / "sub"))) == ["train.py"]
    assert sorted(members(pack.pack(repo))) == ["sub/train.py"]  # the repository's top too


def test_a_subfolder_git_ignores_whole_is_refused_naming_the_rule_and_the_way_back(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    repo = tree(tmp_path / "repo", {".git/HEAD": "ref: refs/heads/main\n", ".gitignore": "scratch/\n",
                                    "scratch/exp/train.py": "x"})
    with pytest.raises(pack.PackError, match=r"git ignores this folder \(a rule in .*repo/\.gitignore\).*!exp/"):
        pack.pack(repo / "scratch" / "exp")
    (repo / ".respawnignore").write_text("!scratch/\n")  # read after .gitignore in the same folder
    assert sorted(members(pack.pack(repo / "scratch" / "exp"))) == ["train.py"]
