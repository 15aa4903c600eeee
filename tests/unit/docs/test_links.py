"""Every relative link in the README and the guides resolves: to a file of
the repository and, where it names one, to a heading of a Markdown file
(GitHub's anchor rules). Guides point into the code, so a moved module
breaks its link here instead of in a reader's browser."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCED = re.compile(r"```.*?```", re.S)


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of `path` (duplicates get -1, -2, ...)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCED.sub("", path.read_text()).splitlines():
        if not line.startswith("#"):
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", line.lstrip("#").strip())
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(doc: Path) -> list[str]:
    broken = []
    for match in LINK.finditer(FENCED.sub("", doc.read_text())):
        target = match.group(1)
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no such heading")
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc: Path) -> None:
    assert broken_links(doc) == []


def test_the_link_check_sees_a_broken_link(tmp_path: Path) -> None:
    doc = tmp_path / "guide.md"
    doc.write_text("# Title\n[ok](#title) [gone](missing.md) [no heading](#nowhere)\n")
    assert broken_links(doc) == ["missing.md: no such file", "#nowhere: no such heading"]
