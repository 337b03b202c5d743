"""Code from a local folder: packed into a deterministic tarball and uploaded content-addressed.

``respawn submit`` (a spec whose ``code:`` is a local path, or ``--workdir DIR``) and
``respawn run --workdir DIR`` pack the folder here, upload it to
``gs://BUCKET/code/<sha256>.tar.gz`` and submit the spec with that URI: the controller and
the bucket only ever see ``gs://``. The VM agent fetches it as any ``code:`` tarball and
unpacks it into the command's working directory (deploy/vm/startup.sh: ``tar -xzf``).

- What is packed: every regular file and symlink under the folder, but ``.git/`` and what
  ``.gitignore`` and ``.respawnignore`` files exclude (git's rules, through ``pathspec``'s
  ``GitIgnoreSpec``): each file applies to its own folder and below, a deeper one after a
  shallower one, ``.respawnignore`` after ``.gitignore`` in the same folder, so that a
  ``!pattern`` there can bring back what git ignores (a small data file, say). A folder that
  is excluded is not entered (as git: nothing under it can be brought back). Empty folders
  are left out, as git leaves them out. A folder inside a git repository is also under the
  rules above it, as git applies them (controller/cli/gitrules.py): the repository's ignore
  files from its top down, ``info/exclude`` and ``core.excludesFile``; a ``.env`` git keeps out
  of a subfolder is kept out of that subfolder's tarball.
- Deterministic: members sorted by path, mtime fixed (1980-01-01), uid/gid 0 with no names,
  mode 0755 for a file its owner may execute and 0644 otherwise, and a gzip header with no
  name and no time; the same folder gives the same bytes (with the same zlib), hence the
  same address, and an address already in the bucket is not uploaded again.
- Bounded: over ``MAX_PACKED`` (100 MiB, compressed) it is refused, naming the biggest files,
  before anything is uploaded; packing stops as soon as the limit is passed.
- A single file: a ``.tar.gz`` / ``.tgz`` is taken as it is (after checking that it is one);
  any other file is packed alone, under its own name.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from controller.cli import gitrules
from controller.core import errors
from controller.core.ports import BlobStore

MAX_PACKED = 100 * 1024 * 1024
CODE_PREFIX = "code/"
IGNORE_FILES = gitrules.IGNORE_FILES
ALWAYS_LEFT_OUT = (".git",)
MTIME = 315532800  # 1980-01-01T00:00:00Z: a fixed time no tar calls implausible
_BIGGEST = 5


class PackError(Exception):
    """The folder cannot be packed (too big, unreadable); the message says which files and why."""


@dataclass(frozen=True)
class Packed:
    data: bytes
    sha256: str
    files: int
    source: Path

    @property
    def name(self) -> str:
        """The object's name in the control bucket: ``code/<sha256>.tar.gz``."""
        return f"{CODE_PREFIX}{self.sha256}.tar.gz"

    def uri(self, bucket: str) -> str:
        return f"gs://{bucket}/{self.name}"


def is_local(code: str) -> bool:
    """A ``code:`` value the CLI packs: anything but a URL (``gs://``, ``https://``...)."""
    return "://" not in code


def pack(source: Path, limit: int | None = None) -> Packed:
    """``source`` (a folder or a file) as a deterministic .tar.gz, at most ``limit`` bytes
    (default ``MAX_PACKED``); PackError when it cannot be."""
    limit = MAX_PACKED if limit is None else limit
    try:
        kind = source.stat().st_mode
    except OSError as e:
        raise PackError(f"{source}: {e.strerror or e}") from e
    if stat.S_ISREG(kind) and source.name.endswith((".tar.gz", ".tgz")):
        return _tarball(source, limit)
    if stat.S_ISREG(kind):
        members = [(PurePosixPath(source.name), source)]
    elif stat.S_ISDIR(kind):
        members = files(source)
    else:
        raise PackError(f"{source}: neither a folder nor a file")
    if not members:
        raise PackError(f"{source}: nothing to pack (every file is ignored, or the folder is empty)")
    buffer = io.BytesIO()
    try:
        with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=6) as zipped, \
                tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name, path in members:
                _add(tar, name, path, lambda: buffer.tell() > limit)
                if buffer.tell() > limit:
                    raise _PastLimit
    except _PastLimit:
        raise PackError(_too_big(source, members, limit, packed_past=True)) from None
    data = buffer.getvalue()
    if len(data) > limit:
        raise PackError(_too_big(source, members, limit, packed_past=True))
    return Packed(data, hashlib.sha256(data).hexdigest(), len(members), source)


def files(root: Path) -> list[tuple[PurePosixPath, Path]]:
    """Every file (and symlink) under ``root`` that is packed, by its path in the tarball, sorted.

    Inside a git repository the rules above ``root`` apply too (controller/cli/gitrules.py): the
    repository's ignore files from its top down, ``info/exclude``, ``core.excludesFile``. A ``root``
    those rules leave out whole is refused, naming the rule's file: nothing of it would be packed."""
    try:
        rules = gitrules.outside(root)
        ignored, source = rules.verdict(rules.prefix, folder=True) if rules.prefix != gitrules.HERE else (False, None)
    except gitrules.RulesError as e:
        raise PackError(str(e)) from e
    if ignored:
        raise PackError(f"{root}: git ignores this folder (a rule in {source}), so nothing of it would be packed; "
                        f"bring it back with !{rules.prefix.name}/ in a .respawnignore beside that file")
    found: list[tuple[PurePosixPath, Path]] = []

    def left_out(relative: PurePosixPath, folder: bool) -> bool:
        return rules.verdict(rules.prefix / relative, folder)[0]

    for folder, dirs, names in os.walk(root, onerror=_unreadable, followlinks=False):
        here = Path(folder)
        relative_here = PurePosixPath(here.relative_to(root).as_posix())
        for name in IGNORE_FILES:
            if name in names:
                try:
                    rules.add(rules.prefix / relative_here, here / name)
                except gitrules.RulesError as e:
                    raise PackError(str(e)) from e
        kept = []
        for d in sorted(dirs):
            relative = relative_here / d
            if d in ALWAYS_LEFT_OUT or left_out(relative, folder=True):
                continue
            if (here / d).is_symlink():  # a link to a folder is packed as the link, never followed
                found.append((relative, here / d))
                continue
            kept.append(d)
        dirs[:] = kept
        for n in names:
            path, relative = here / n, relative_here / n
            try:
                mode = path.lstat().st_mode
            except FileNotFoundError:
                continue  # gone since the folder was listed (an editor's swap file): not packed
            except OSError as e:
                raise PackError(f"{path}: {e.strerror or e}") from e
            if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                continue  # sockets, pipes, devices: nothing a trainer could use
            if not left_out(relative, folder=False):
                found.append((relative, path))
    return sorted(found, key=lambda member: member[0].as_posix())


def upload(store: BlobStore, bucket: str, packed: Packed) -> bool:
    """Put ``packed`` at ``gs://bucket/code/<sha256>.tar.gz`` unless it is there already (same
    name, same size); True when it was uploaded now."""
    try:
        there = store.stat(bucket, packed.name)
    except errors.NotFound:
        there = None
    if there is not None and there.size == len(packed.data):
        return False
    try:
        # Create only: two submits of the same folder at once write the same bytes, the second
        # is refused and finds them there. An object of the wrong size is a broken upload: replaced.
        store.write(bucket, packed.name, packed.data, if_generation_match=there.generation if there else 0)
    except errors.PreconditionFailed:
        return False
    return True


class _PastLimit(Exception):
    """The packed bytes passed the limit while a file was being read."""


class _Bounded(io.RawIOBase):
    """A file read for the tarball, that stops as soon as ``past()``: one big file (a checkpoint,
    a data set) is never compressed whole into memory only to be refused."""

    def __init__(self, f: io.BufferedReader, past: Callable[[], bool]) -> None:
        self.f, self.past = f, past

    def read(self, size: int = -1) -> bytes:
        if self.past():
            raise _PastLimit
        return self.f.read(size)


def _add(tar: tarfile.TarFile, name: PurePosixPath, path: Path, past: Callable[[], bool] = lambda: False) -> None:
    try:
        info = tar.gettarinfo(str(path), arcname=name.as_posix())
        info.mtime, info.uid, info.gid, info.uname, info.gname = MTIME, 0, 0, "", ""
        if info.issym():
            info.mode = 0o777
            tar.addfile(info)
            return
        info.mode = 0o755 if info.mode & stat.S_IXUSR else 0o644
        with path.open("rb") as f:
            tar.addfile(info, _Bounded(f, past))
    except OSError as e:  # unreadable, or it changed size while being read
        raise PackError(f"{path}: cannot be packed: {e.strerror or e}") from e


def _tarball(source: Path, limit: int) -> Packed:
    try:
        size = source.stat().st_size
        if size > limit:
            raise PackError(f"{source} is {_mib(size)}, over the {_mib(limit)} limit on code; leave data out of "
                            "code (read it from gs:// in the command)")
        data = source.read_bytes()
    except OSError as e:  # unreadable, or gone since
        raise PackError(f"{source}: cannot be read: {e.strerror or e}") from e
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            count = sum(1 for _ in tar)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise PackError(f"{source}: not a .tar.gz the VM agent can unpack ({e})") from e
    return Packed(data, hashlib.sha256(data).hexdigest(), count, source)


def _too_big(source: Path, members: list[tuple[PurePosixPath, Path]], limit: int, packed_past: bool) -> str:
    sizes = []
    for name, path in members:
        try:
            sizes.append((path.lstat().st_size, name.as_posix()))
        except OSError:
            continue
    biggest = sorted(sizes, key=lambda s: (-s[0], s[1]))[:_BIGGEST]
    listed = ", ".join(f"{name} ({_mib(size)})" for size, name in biggest)
    return (f"{source} packs to more than {_mib(limit)}, the limit on code; biggest files: {listed}. "
            "Leave them out with a .respawnignore (gitignore syntax) and read data from gs:// in the command")


def _mib(size: float) -> str:
    return f"{size / 1024 / 1024:.1f} MiB"


def _unreadable(error: OSError) -> None:
    raise PackError(f"{error.filename}: cannot be read: {error.strerror or error}")
