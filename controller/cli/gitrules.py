"""The ignore rules git applies to a folder from outside it, for ``respawn submit``'s packing.

A folder packed from inside a git repository (``--workdir sub/``, a spec's local ``code:``) is
under rules that live above it: the repository's ``.gitignore`` files from its top down to the
folder, ``$GIT_COMMON_DIR/info/exclude`` and the user's ``core.excludesFile``. A ``.env`` or a key
that git keeps out of the repository is kept out of the tarball by them (controller/cli/pack.py
reads the folder's own files as it walks it).

Precedence is git's (gitignore(5)): within one level the last matching rule wins; a ``.gitignore``
beats ``info/exclude``, which beats ``core.excludesFile``; a deeper ``.gitignore`` beats a
shallower one. ``Rules`` keeps them in that order, lowest first, so "the last rule that matches
decides" holds across all of them. respawn's own ``.respawnignore`` is read after the
``.gitignore`` of the same folder, above the packed folder as inside it.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pathspec

IGNORE_FILES = (".gitignore", ".respawnignore")
HERE = PurePosixPath(".")


class RulesError(Exception):
    """An ignore file that exists could not be read."""


@dataclass
class Rules:
    """Ignore rules by the folder they apply from (relative to ``base``), lowest precedence first;
    each with the file it came from, to say which rule left a folder out."""

    base: Path  # the repository's top, or the packed folder when it is in no repository
    prefix: PurePosixPath = HERE  # the packed folder, relative to base
    specs: list[tuple[PurePosixPath, pathspec.GitIgnoreSpec, Path]] = field(default_factory=list)

    def add(self, where: PurePosixPath, source: Path) -> None:
        """The rules of ``source`` (an ignore file, if it is a file), applying from ``where`` down."""
        if not source.is_file():
            return
        try:
            lines = source.read_text(errors="replace").splitlines()
        except OSError as e:
            raise RulesError(f"{source}: {e.strerror or e}") from e
        self.specs.append((where, _spec(lines), source))

    def verdict(self, path: PurePosixPath, folder: bool) -> tuple[bool, Path | None]:
        """Whether ``path`` (relative to ``base``) is ignored, and the file of the rule that decided."""
        ignored, source = False, None
        for where, spec, origin in self.specs:
            if where != HERE and where not in path.parents:
                continue
            result = spec.check_file(path.relative_to(where).as_posix() + ("/" if folder else ""))
            if result.include is not None:  # the last rule that matches decides
                ignored, source = result.include, origin
        return ignored, source


def outside(root: Path) -> Rules:
    """The rules that apply to ``root`` from outside it: none when it is in no git repository."""
    here = root.resolve()
    top = next((d for d in (here, *here.parents) if (d / ".git").exists()), None)
    if top is None:
        return Rules(root)
    rules = Rules(top, PurePosixPath(here.relative_to(top).as_posix()))
    rules.add(HERE, excludes_file(top))
    if (common := _common_dir(top)) is not None:
        rules.add(HERE, common / "info" / "exclude")
    for depth in range(len(rules.prefix.parts)):  # the repository's top down to root's parent
        where = PurePosixPath(*rules.prefix.parts[:depth]) if depth else HERE
        for name in IGNORE_FILES:
            rules.add(where, top / where / name)
    return rules


def excludes_file(top: Path) -> Path:
    """``core.excludesFile`` as git reads it in the repository at ``top`` (its includes and ``~``
    expanded: ``git config --path``), else git's default: ``$XDG_CONFIG_HOME/git/ignore``, or
    ``~/.config/git/ignore`` when XDG_CONFIG_HOME is unset or empty."""
    try:
        done = subprocess.run(["git", "-C", str(top), "config", "--path", "--get", "core.excludesFile"],
                              capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
        if done.returncode == 0 and done.stdout.strip():
            found = Path(done.stdout.strip())
            return found if found.is_absolute() else top / found  # git reads a relative one from the top
    except (OSError, subprocess.SubprocessError):
        pass  # no git here: its default place, which git would read
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "git" / "ignore"


def _common_dir(top: Path) -> Path | None:
    """The repository's common git directory: ``.git`` itself, or for a worktree or submodule (a
    ``.git`` file saying ``gitdir: PATH``) that directory, or the one its ``commondir`` names."""
    dot = top / ".git"
    if dot.is_dir():
        return dot
    try:
        text = dot.read_text(errors="replace").strip()
    except OSError:
        return None
    if not text.startswith("gitdir:"):
        return None
    gitdir = Path(text.removeprefix("gitdir:").strip())
    gitdir = gitdir if gitdir.is_absolute() else top / gitdir
    try:
        common = (gitdir / "commondir").read_text(errors="replace").strip()
    except OSError:
        return gitdir
    return Path(common) if Path(common).is_absolute() else gitdir / common


def _spec(lines: list[str]) -> pathspec.GitIgnoreSpec:
    """An ignore file's rules. A line git takes as a pattern that matches nothing (``!`` alone, a
    trailing backslash) pathspec refuses: left out, as git leaves it out, never the pack's crash."""
    valid = []
    for line in lines:
        try:
            pathspec.GitIgnoreSpec.from_lines([line])
        except ValueError:
            continue
        valid.append(line)
    return pathspec.GitIgnoreSpec.from_lines(valid)
