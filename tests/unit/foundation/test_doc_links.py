"""Every reference in the repository resolves inside it: relative Markdown links name a file
that exists and, with a ``#fragment``, a heading of that file (GitHub's anchor rule); a
``docs/….md#anchor`` written in source, comments or prose (paths from the repository root)
names a real heading; and nothing points outside the repository at the design notes the
project started from."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
SOURCE_REF = re.compile(r"((?:docs|bench|services|deploy)/[\w/.\-]+\.md)#([\w\-]+)")
OUTSIDE = "../" + "shared"  # split so that this file does not match itself


def tracked(*suffixes: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / line for line in out.splitlines() if line.endswith(suffixes) and (ROOT / line).is_file()]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces to ``-`` (inline code marks dropped with the rest)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors_in(text: str) -> set[str]:
    """Anchors of a Markdown text's headings outside fenced code; repeats get ``-1``, ``-2``."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


@cache
def anchors(path: Path) -> frozenset[str]:
    return frozenset(anchors_in(path.read_text(encoding="utf-8")))


def broken_links(md: Path, text: str, root: Path = ROOT) -> list[str]:
    bad = []
    for m in MD_LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        dest = (md.parent / path).resolve() if path else md.resolve()
        if not dest.exists():
            bad.append(f"{md.relative_to(root)}: {target} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            bad.append(f"{md.relative_to(root)}: {target} (no such heading)")
    return bad


def test_markdown_links_resolve_to_files_and_headings() -> None:
    docs = tracked(".md")
    assert ROOT / "README.md" in docs and ROOT / "docs" / "benchmarks.md" in docs
    bad = [b for md in docs for b in broken_links(md, md.read_text(encoding="utf-8"))]
    assert not bad, "\n".join(bad)


def test_doc_anchors_named_in_source_exist() -> None:
    bad = []
    for src in tracked(".py", ".proto", ".toml", ".yaml", ".yml", ".sh", ".md"):
        for m in SOURCE_REF.finditer(src.read_text(encoding="utf-8", errors="replace")):
            dest = ROOT / m.group(1)
            if not dest.exists() or m.group(2) not in anchors(dest):
                bad.append(f"{src.relative_to(ROOT)}: {m.group(0)}")
    assert not bad, "\n".join(bad)


def test_nothing_points_outside_the_repository() -> None:
    hits = [str(p.relative_to(ROOT)) for p in tracked(".md", ".py", ".proto", ".toml", ".yaml", ".yml", ".sh", ".txt")
            if OUTSIDE in p.read_text(encoding="utf-8", errors="replace")]
    assert not hits, hits


@pytest.mark.parametrize(("link", "broken"), [
    ("[a](#twice)", False), ("[a](#twice-1)", False), ("[a](#twice-2)", True),
    ("[a](#a-b_c-d)", False), ("[a](#inside-a-fence)", True), ("[a](nowhere.md)", True),
    ("[a](https://example.com/x#y)", False),
])
def test_the_checker_catches_a_broken_link(tmp_path: Path, link: str, broken: bool) -> None:
    md = tmp_path / "x.md"
    text = "# Twice\n\n## Twice\n\n### A `b_c`: d?\n\n```\n# inside a fence\n```\n\n" + link + "\n"
    md.write_text(text)
    assert bool(broken_links(md, text, root=tmp_path)) is broken
