"""What a ``gcloud functions deploy`` would deploy, as one digest: the source it uploads and the
flags it is given. ``respawn deploy`` labels each function with it (``respawn-deploy``) and reads
the label back (``gcloud functions describe``) before deploying: a function already deployed from
the same source with the same flags, ACTIVE, is not deployed again (each deploy is a new revision,
a build and a restart of its instances).

The source is what gcloud uploads: the files under ``--source`` that its ``.gcloudignore`` (at the
source's top; ``#!include:FILE`` lines read in place) does not exclude, or, without one, what
gcloud's default for functions excludes (``.gcloudignore``, ``.git``, ``.gitignore``,
``node_modules`` and the rules of ``.gitignore``). Each file counts by its path, its executable bit
and its bytes; a symlink by its target.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import pathspec

LABEL = "respawn-deploy"
LENGTH = 40  # hex digits kept: a label value holds at most 63 characters
# gcloud's default for a functions source without .gcloudignore (googlecloudsdk's gcloudignore
# DEFAULT_IGNORE_FILE plus node_modules, as gcloud functions deploy writes it).
DEFAULT_IGNORE = (".gcloudignore", ".git", ".gitignore", "node_modules", "#!include:.gitignore")
_INCLUDE = "#!include:"


def rules(source: Path) -> pathspec.GitIgnoreSpec:
    """The ignore rules gcloud applies to ``source``."""
    top = source / ".gcloudignore"
    lines = top.read_text(errors="replace").splitlines() if top.is_file() else list(DEFAULT_IGNORE)
    expanded: list[str] = []
    for line in lines:
        if line.startswith(_INCLUDE):
            included = source / line.removeprefix(_INCLUDE).strip()
            if included.is_file():
                expanded += included.read_text(errors="replace").splitlines()
            continue
        expanded.append(line)
    valid = []
    for line in expanded:
        try:
            pathspec.GitIgnoreSpec.from_lines([line])
        except ValueError:  # a line git takes as matching nothing
            continue
        valid.append(line)
    return pathspec.GitIgnoreSpec.from_lines(valid)


def uploaded(source: Path) -> list[tuple[str, Path]]:
    """What gcloud would upload from ``source``: each file's (or symlink's) path relative to it, and
    its path here, in walking order."""
    spec = rules(source)
    found: list[tuple[str, Path]] = []
    for folder, dirs, names in os.walk(source):
        here = PurePosixPath(Path(folder).relative_to(source).as_posix())
        links = [d for d in dirs if (Path(folder) / d).is_symlink()]  # a link to a folder: the link itself
        dirs[:] = [d for d in dirs if d not in links and not spec.match_file(f"{(here / d).as_posix()}/")]
        for name in [*names, *links]:
            relative = (here / name).as_posix()
            if not spec.match_file(relative):
                found.append((relative, Path(folder) / name))
    return found


def source_digest(source: Path) -> str:
    """sha256 of what gcloud would upload from ``source``."""
    entries: list[tuple[str, bytes]] = []
    for relative, path in uploaded(source):
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            entries.append((relative, b"link:" + os.readlink(path).encode()))
        elif stat.S_ISREG(mode):
            kind = b"x:" if mode & stat.S_IXUSR else b"f:"
            entries.append((relative, kind + hashlib.sha256(path.read_bytes()).digest()))
    digest = hashlib.sha256()
    for relative, body in sorted(entries):
        digest.update(relative.encode() + b"\0" + body + b"\0")
    return digest.hexdigest()

def label(source_sha: str, argv: Sequence[str]) -> str:
    """The ``respawn-deploy`` label's value: the source's digest and the deploy's flags (``argv``,
    its label flag left out, and the source's path: the same files deployed from another checkout
    are the same function), hashed together."""
    flags = [a for a in argv if not a.startswith(("--update-labels=", "--source="))]
    return hashlib.sha256(json.dumps([source_sha, flags]).encode()).hexdigest()[:LENGTH]


def unchanged(description: str, wanted: str, env: Mapping[str, str], account: str) -> bool:
    """Whether the function ``gcloud functions describe --format=json`` described is what a deploy
    labelled ``wanted`` with ``env`` (its plain variables) and ``account`` would make: ACTIVE, the
    same label, and, against a change made by hand since, the same respawn variables and account."""
    try:
        found: Any = json.loads(description)
    except ValueError:
        return False
    if not isinstance(found, dict):
        return False
    config = found.get("serviceConfig") or {}
    deployed = config.get("environmentVariables") or {}
    ours = {k: v for k, v in deployed.items() if k.startswith("RESPAWN_")}  # gcloud adds its own (LOG_EXECUTION_ID)
    return (found.get("state") == "ACTIVE" and (found.get("labels") or {}).get(LABEL) == wanted
            and ours == dict(env) and config.get("serviceAccountEmail") == account)
