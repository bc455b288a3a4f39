"""README.md is the short front page and docs/ holds the guides: README is at most 10 KB, links
every docs/*.md page, has no paragraph, bullet or table row over 150 words, and every relative
link in README and docs/ names a file that exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _blocks(text):
    """The paragraphs, list items and table rows of a Markdown text, code blocks left out."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for paragraph in re.split(r"\n\s*\n", text):
        yield from re.split(r"\n(?=\s*(?:[-*] |\d+\. |\|))", paragraph)


def _relative_links(path):
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue                                   # https:, mailto:, an anchor on the page
        yield target.split("#", 1)[0]


def test_readme_is_at_most_10_kb():
    assert README.stat().st_size <= 10 * 1024, README.stat().st_size


def test_the_docs_folder_has_the_guides():
    names = {p.name for p in DOCS}
    assert {"learners.md", "instructors.md", "security.md", "measurements.md", "training.md",
            "performance.md", "conventions.md", "architecture.md"} <= names, names


def test_readme_links_every_docs_page():
    linked = {(ROOT / t).resolve() for t in _relative_links(README)}
    missing = [p.name for p in DOCS if p.resolve() not in linked]
    assert not missing, f"README links none of {missing}"


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves_to_a_file(path):
    broken = [t for t in _relative_links(path) if not (path.parent / t).is_file()]
    assert not broken, f"{path.name}: {broken}"


def test_no_readme_paragraph_is_over_150_words():
    long = [(len(b.split()), b[:60]) for b in _blocks(README.read_text(encoding="utf-8"))
            if len(b.split()) > 150]
    assert not long, long


def test_readme_keeps_no_dates_machine_loads_or_issue_numbers():
    text = README.read_text(encoding="utf-8")
    found = re.findall(r"\b(?:issue|load) \d+|\b\d{1,2} (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|"
                       r"Oct|Nov|Dec)[a-z]* 20\d\d\b|\bUTC\b", text, flags=re.I)
    assert not found, found
