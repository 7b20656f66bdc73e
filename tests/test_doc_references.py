"""Every cited doc section exists, and nothing cites notes outside the repository.

The convention is in ``docs/architecture.md#doc-references``: pages under
``docs/`` carry explicit anchors (``<a id="kebab-case"></a>``), and code,
tests and docs cite them as ``docs/<page>.md#<anchor>``, or by the page's file
name alone (``pravega.md#reads``: every page name under ``docs/`` is unique),
or, inside ``docs/``, by a relative Markdown link (``(pravega.md#reads)``,
``(#reads)``). Numbered sections (``§5.2``, ``section 4``, ``B.4``) and the
team's design notes are not citable: they are not in the repository, or their
numbers change when a page grows.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SCANNED_DIRS = ("src", "tests", "docs", "benchmarks")
SCANNED_SUFFIXES = {".py", ".pyi", ".md", ".proto", ".toml", ".sh", ".txt"}

ANCHOR = re.compile(r'<a id="([a-z0-9][a-z0-9-]*)"></a>')
"""An explicit anchor, the only kind a citation may name."""

CITATION = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.md)#([A-Za-z0-9_-]+)")
"""``page.md#anchor`` with an optional path before the page."""

SAME_PAGE_LINK = re.compile(r"\]\(#([A-Za-z0-9_-]+)\)")
"""A Markdown link to an anchor of the page it is on."""

DOCS_PAGE = re.compile(r"(?<![\w/.-])(docs/(?:[\w-]+/)*[\w-]+\.md)\b")
"""A path to a page under ``docs/``, anchor or not."""

EXTERNAL_SECTIONS = re.compile(
    r"(?:RFC \d+|Reactive Streams)\s+§[\d.]+(?:(?:/|,\s*|\s+and\s+)§[\d.]+)*"
)
"""The only ``§`` allowed: sections of a public standard, named with it."""

FORBIDDEN: dict[str, re.Pattern[str]] = {
    "design notes": re.compile(r"\b(?:DESIGN|STYLE)\b(?:\.md\b)?"),
    "spec notes": re.compile(r"shared/protocols|pravega-wire\.md"),
    "spec section": re.compile(r"\bspec(?:'s)?\s+(?:section\s+|rule\s+)?§?\d"),
    "numbered section": re.compile(r"\bsections?\s+\d"),
    "draft part": re.compile(r"(?<![\w.])[AB]\.[1-9]\b(?!\.\d)|\bPart [A-D]\b"),
}
"""Citations of notes that are not in the repository, or of section numbers."""

KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()
"""(file, cited text) pairs allowed to remain; nothing may be added to it."""


def _pages() -> dict[str, Path]:
    pages: dict[str, Path] = {}
    for path in sorted(DOCS.rglob("*.md")):
        assert path.name not in pages, f"two pages named {path.name}: names must be unique"
        pages[path.name] = path
    return pages


PAGES = _pages()
ANCHORS = {path: set(ANCHOR.findall(path.read_text(encoding="utf-8"))) for path in PAGES.values()}


def _scanned_files() -> Iterator[Path]:
    me = Path(__file__).resolve()
    for top in SCANNED_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in SCANNED_SUFFIXES and path.resolve() != me:
                yield path


FILES = list(_scanned_files())


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def _resolve(source: Path, cited: str) -> Path | None:
    """The page a citation names, or None if there is no such page."""
    if cited.startswith("docs/"):
        target = ROOT / cited
        return target if target.is_file() else None
    if source.is_relative_to(DOCS):
        target = (source.parent / cited).resolve()
        if target.is_file():
            return target
    page = PAGES.get(cited.rsplit("/", 1)[-1])
    if page is None or not _rel(page).endswith(cited):
        return None
    return page


def _citation_errors(path: Path) -> list[str]:
    errors: list[str] = []
    text = path.read_text(encoding="utf-8")
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"{_rel(path)}:{number}"
        for match in CITATION.finditer(line):
            cited, anchor = match.groups()
            page = _resolve(path, cited)
            if page is None:
                errors.append(f"{where}: no page {cited}")
            elif anchor not in ANCHORS.get(page, set()):
                errors.append(f"{where}: {_rel(page)} has no anchor #{anchor}")
        for match in DOCS_PAGE.finditer(line):
            if not (ROOT / match.group(1)).is_file():
                errors.append(f"{where}: no page {match.group(1)}")
        if path.suffix == ".md" and path.is_relative_to(DOCS):
            for match in SAME_PAGE_LINK.finditer(line):
                if match.group(1) not in ANCHORS.get(path, set()):
                    errors.append(f"{where}: this page has no anchor #{match.group(1)}")
    return errors


def _forbidden(path: Path) -> list[tuple[int, str, str]]:
    """(line, kind, cited text) of every citation the convention does not allow."""
    found: list[tuple[int, str, str]] = []
    text = path.read_text(encoding="utf-8")
    for number, line in enumerate(text.splitlines(), start=1):
        for kind, pattern in FORBIDDEN.items():
            found.extend((number, kind, match.group(0)) for match in pattern.finditer(line))
        external = [m.span() for m in EXTERNAL_SECTIONS.finditer(line)]
        for match in re.finditer("§", line):
            if not any(start <= match.start() < end for start, end in external):
                found.append((number, "numbered section", "§"))
    return found


def _allowed(path: Path, cited: str) -> bool:
    return any(_rel(path) == p and cited.startswith(t) for p, t in KNOWN_EXCEPTIONS)


@pytest.mark.parametrize("path", FILES, ids=_rel)
def test_every_cited_section_exists(path: Path) -> None:
    errors = _citation_errors(path)
    assert not errors, "dangling doc references:\n" + "\n".join(errors)


@pytest.mark.parametrize("path", FILES, ids=_rel)
def test_nothing_cites_notes_outside_the_repository(path: Path) -> None:
    found = [
        f"{_rel(path)}:{number}: {kind} {cited!r}"
        for number, kind, cited in _forbidden(path)
        if not _allowed(path, cited)
    ]
    assert not found, (
        "cite docs/<page>.md#<anchor> or an upstream source file instead "
        "(docs/architecture.md#doc-references):\n" + "\n".join(found)
    )


def test_anchors_are_unique_per_page() -> None:
    for path in PAGES.values():
        ids = ANCHOR.findall(path.read_text(encoding="utf-8"))
        duplicates = sorted({a for a in ids if ids.count(a) > 1})
        assert not duplicates, f"{_rel(path)} repeats anchors {duplicates}"


def test_checks_catch_what_they_must(tmp_path: Path) -> None:
    """The rules find a dangling anchor and each forbidden form, and pass good text."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "a (pravega.md#no-such-anchor)\n"
        "b (docs/protocols/nope.md#reads)\n"
        "c (DESIGN.md section 2)\n"
        "d (spec §5.2)\n"
        "e (B.4)\n"
        "f STYLE: rule 4\n",
        encoding="utf-8",
    )
    assert len(_citation_errors(bad)) == 3  # the missing anchor, page twice
    kinds = {kind for _, kind, _ in _forbidden(bad)}
    assert kinds == {"design notes", "numbered section", "spec section", "draft part"}
    good = tmp_path / "good.py"
    good.write_text(
        "a (pravega.md#reads, docs/protocols/rsio.md#goodbye)\n"
        "b (RFC 6455 §7.4.1; Reactive Streams §3.6, §3.7)\n"
        "c version 4.0, B.5x, ``architecture.md#invariants``\n",
        encoding="utf-8",
    )
    assert _citation_errors(good) == []
    assert _forbidden(good) == []
