"""The local cloud's trainer image: a root filesystem holding this machine's own Python.

No image registry is reachable from the machines this project runs on, and no base image can be
pulled, so the image the local cloud serves (through its Artifact Registry, localcloud.registry) is
made from what is here: the Python that runs respawn (its interpreter, its standard library less
the test suite, the shared libraries they load), the packages a trainer of examples/ needs (numpy,
google-cloud-storage and what they require, as installed in this venv), and busybox for /bin/sh and
the usual commands. Files keep their paths (the interpreter finds its library where it was built to),
and ``python3`` and ``python`` are on the image's PATH. ``TRAINER_IMAGE`` is what the local cloud calls
it (``Options.images``): examples/container.yaml runs in it.

Building it reads and writes about 200 MB (a plain tar: the registry gzips it as a layer): a few
seconds. The tar is cached, keyed by what went into it, under ``$XDG_CACHE_HOME/respawn``
(``~/.cache/respawn``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from packaging.requirements import Requirement

TRAINER_IMAGE = "us-central1-docker.pkg.dev/respawn-local/trainers/python:3.11"
TRAINER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONUNBUFFERED": "1"}
# What a trainer in the local image can import (and everything these require).
PACKAGES = ("numpy", "google-cloud-storage")
BUSYBOX = ("/bin/busybox", "/usr/bin/busybox")
# Left out of the standard library: its own tests and what a trainer never imports.
_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "__pycache__", "site-packages",
         "config-3.11-x86_64-linux-gnu"}
_FORMAT = 2  # bump when what goes into the image changes


def _closure(names: Iterable[str]) -> list[importlib.metadata.Distribution]:
    """The installed distributions ``names`` need, each once, extras and other platforms' markers left out."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        dist = importlib.metadata.distribution(name)
        seen[key] = dist
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return [seen[k] for k in sorted(seen)]


def _dist_files(dist: importlib.metadata.Distribution) -> Iterator[Path]:
    for file in dist.files or ():
        path = Path(dist.locate_file(file)).resolve()
        if path.is_file() and "__pycache__" not in path.parts:
            yield path


def _libraries(binaries: Iterable[Path]) -> set[Path]:
    """The shared libraries the binaries load (ldd), the dynamic loader's links kept as they are."""
    found: set[Path] = set()
    for binary in binaries:
        try:
            out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        for line in out.splitlines():
            match = re.search(r"(/\S+)", line.split("=>")[-1])
            if match and Path(match.group(1)).exists():
                lib = Path(os.path.normpath(match.group(1)))
                found |= {lib, Path(os.path.realpath(lib))}  # a link (the loader's /lib64 one) and its file
    return found


def _python_files() -> tuple[Path, list[Path]]:
    """The interpreter and the standard library this process runs on (not its venv)."""
    prefix = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    interpreter = Path(os.path.realpath(prefix / "bin" / version))
    stdlib = Path(sysconfig.get_paths(vars={"installed_base": str(prefix), "base": str(prefix)})["stdlib"])
    files = [interpreter]
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = [d for d in dirs if d not in _SKIP]
        files.extend(Path(root) / n for n in names if not n.endswith(".pyc"))
    files.extend(p for p in (prefix / "lib").glob(f"lib{version}*.so*"))
    return interpreter, files


def _key(dists: list[importlib.metadata.Distribution], interpreter: Path, busybox: Path) -> str:
    h = hashlib.sha256(f"{_FORMAT} {sys.version} {interpreter} {busybox.stat().st_size}".encode())
    for dist in dists:
        h.update(f"{dist.metadata['Name']}=={dist.version};".encode())
    return h.hexdigest()[:16]


def busybox() -> Path | None:
    return next((Path(p) for p in BUSYBOX if os.access(p, os.X_OK)), None)


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "respawn"


class NoBusybox(RuntimeError):
    pass


def trainer_rootfs(cache: Path | None = None) -> Path:
    """A tar of the trainer image's root filesystem (built once, then cached)."""
    box = busybox()
    if box is None:
        raise NoBusybox("the local trainer image needs a static busybox for its /bin/sh: "
                        "apt-get install busybox-static")
    interpreter, stdlib = _python_files()
    dists = _closure(PACKAGES)
    cache = cache or cache_dir()
    out = cache / f"trainer-rootfs-{_key(dists, interpreter, box)}.tar"
    if out.exists():
        return out
    files = set(stdlib)
    site = Path(sysconfig.get_paths(vars={"base": sys.base_prefix})["purelib"])
    packages: dict[Path, Path] = {}  # where each package file goes in the image: the interpreter's site-packages
    for dist in _closure(PACKAGES):
        base = Path(dist.locate_file("")).resolve()
        for path in _dist_files(dist):
            if path.is_relative_to(base):  # not its scripts under bin/
                packages[path] = site / path.relative_to(base)
    libraries = {lib for lib in _libraries([interpreter, *(p for p in [*files, *packages] if ".so" in p.suffixes)])
                 if lib not in packages}  # a wheel's own (numpy.libs): in the image with its package
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=cache, suffix=".part", delete=False) as part:
        with tarfile.open(fileobj=part, mode="w", format=tarfile.PAX_FORMAT) as tar:
            _add_skeleton(tar, box, interpreter)
            for path in sorted({_canonical(p) for p in files | libraries}):
                _add_file(tar, path, path)
            for source, target in sorted(packages.items()):
                _add_file(tar, source, target)
    os.chmod(part.name, 0o644)
    os.replace(part.name, out)
    return out


def _made(tar: tarfile.TarFile) -> set[str]:
    """The folders already in ``tar`` (a tar may hold a name twice; the image's layer should not)."""
    made: set[str] = getattr(tar, "respawn_made", None) or set()
    tar.respawn_made = made  # type: ignore[attr-defined]
    return made


def _dirs(tar: tarfile.TarFile, path: Path, made: set[str]) -> None:
    for parent in reversed(path.parents):
        name = str(parent).lstrip("/")
        if name and name not in made:
            made.add(name)
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)


def _add_file(tar: tarfile.TarFile, source: Path, target: Path) -> None:
    _dirs(tar, target, _made(tar))
    info = tar.gettarinfo(str(source), arcname=str(target).lstrip("/"))
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    if info.isfile():
        with open(source, "rb") as f:
            tar.addfile(info, f)
    else:
        tar.addfile(info)


def _link(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
    tar.addfile(info)


def _text(tar: tarfile.TarFile, name: str, text: str, mode: int = 0o644) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def _canonical(path: Path) -> Path:
    """Where ``path`` is, its folders' links resolved (Debian's /lib is a link to usr/lib): every file
    goes into the image at one path, under the same top-level links as here."""
    return Path(os.path.realpath(path.parent)) / path.name


def _add_skeleton(tar: tarfile.TarFile, box: Path, interpreter: Path) -> None:
    made = _made(tar)
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        if os.path.islink(f"/{top}"):  # merged /usr: the same links as here
            made.add(top)
            _link(tar, top, os.readlink(f"/{top}"))
    bin_dir = str(_canonical(Path("/bin/sh"))).lstrip("/").rsplit("/", 1)[0]
    for folder in ("tmp", "var", "var/tmp"):  # sticky and open to all, as on any system
        made.add(folder)
        info = tarfile.TarInfo(folder)
        info.type, info.mode = tarfile.DIRTYPE, 0o755 if folder == "var" else 0o1777
        tar.addfile(info)
    for folder in (bin_dir, "usr/local/bin", "etc", "root", "proc", "sys", "dev", "run"):
        _dirs(tar, Path("/" + folder) / "x", made)
    _add_file(tar, box, Path(f"/{bin_dir}/busybox"))
    applets = subprocess.run([str(box), "--list"], capture_output=True, text=True, timeout=30).stdout.split()
    for applet in sorted(set(applets) - {"busybox"}):
        _link(tar, f"{bin_dir}/{applet}", "busybox")
    for name in ("python3", "python"):
        _link(tar, f"usr/local/bin/{name}", str(interpreter))
    _text(tar, "etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
    _text(tar, "etc/group", "root:x:0:\nnogroup:x:65534:\n")
    _text(tar, "etc/hosts", "127.0.0.1 localhost\n")


if __name__ == "__main__":  # python -m localcloud.images: build (or find) it, print its path
    print(trainer_rootfs())
