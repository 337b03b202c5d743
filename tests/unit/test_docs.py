"""Issue 39: the README is a path (what respawn is, the two commands, the three routes, where to go
next), under 300 lines; the reference is in docs/, a page a part, each found from it; every link in
them resolves, to a file that exists and, with an anchor, to a heading of that file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def outside_code(path: Path) -> list[str]:
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for line in outside_code(path) if (m := re.match(r"^#{1,6} (.*)$", line))}


def links(path: Path) -> list[str]:
    return [m.group(1) for line in outside_code(path) for m in LINK.finditer(re.sub(r"`[^`]*`", "", line))]


def test_the_readme_is_a_path_under_300_lines_that_finds_every_docs_page():
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) < 300
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in links(readme)}
    assert PAGES and all(page.resolve() in linked for page in PAGES), [p.name for p in PAGES if p.resolve() not in linked]


@pytest.mark.parametrize("path", [ROOT / "README.md", *PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_resolves_to_a_file_and_a_heading(path: Path):
    broken = []
    for target in links(path):
        if re.match(r"^[a-z]+:", target):
            continue  # a web address
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no such heading in {dest.relative_to(ROOT)}")
    assert broken == []
