"""README.md is the short front page and docs/ holds the guides: README is at most 10 KB and
CONTRIBUTING.md at most 15 KB, README links every docs/*.md page, neither has a paragraph, bullet
or table row over 150 words, every relative link in README, CONTRIBUTING and docs/ names a file
that exists, and every test the security model names exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
SECURITY = ROOT / "docs" / "security.md"
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
            "performance.md", "conventions.md", "architecture.md", "formats.md"} <= names, names


def test_readme_links_every_docs_page():
    linked = {(ROOT / t).resolve() for t in _relative_links(README)}
    missing = [p.name for p in DOCS if p.resolve() not in linked]
    assert not missing, f"README links none of {missing}"


@pytest.mark.parametrize("path", [README, CONTRIBUTING, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves_to_a_file(path):
    broken = [t for t in _relative_links(path) if not (path.parent / t).is_file()]
    assert not broken, f"{path.name}: {broken}"


def test_contributing_is_at_most_15_kb():
    assert CONTRIBUTING.stat().st_size <= 15 * 1024, CONTRIBUTING.stat().st_size


@pytest.mark.parametrize("path", [README, CONTRIBUTING], ids=lambda p: p.name)
def test_no_paragraph_is_over_150_words(path):
    long = [(len(b.split()), b[:60]) for b in _blocks(path.read_text(encoding="utf-8"))
            if len(b.split()) > 150]
    assert not long, long


def test_the_paragraph_count_sees_a_long_bullet():
    text = "Intro.\n\n- short\n- " + "word " * 151 + "\n\n```\n" + "code " * 200 + "\n```\n"
    assert [len(b.split()) for b in _blocks(text) if b.strip()] == [1, 2, 152]


def _security_tables():
    """{heading: [(first cell, last cell)]} of the two tables of docs/security.md."""
    tables, heading = {}, None
    for line in SECURITY.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
        elif line.startswith("|") and not re.match(r"\|\s*-", line) and heading:
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            tables.setdefault(heading, []).append((cells[0], cells[-1]))
    return {h: rows[1:] for h, rows in tables.items()}     # the header row left out


NAMED_TEST = re.compile(r"`(test_[a-z_]+\.py)::(test_\w+)`")


def _missing_tests(text):
    missing = []
    for file, name in NAMED_TEST.findall(text):
        path = ROOT / "tests" / file
        source = path.read_text(encoding="utf-8") if path.is_file() else ""
        if not re.search(rf"^def {name}\(", source, re.M):
            missing.append(f"{file}::{name}")
    return missing


def test_the_security_model_is_two_tables_and_each_guarantee_names_its_attack():
    tables = _security_tables()
    guaranteed = tables["Guaranteed, and the test that attacks it"]
    not_guaranteed = tables["Not guaranteed, and why"]
    assert len(guaranteed) >= 25 and len(not_guaranteed) >= 10, (len(guaranteed),
                                                                 len(not_guaranteed))
    unattacked = [g[:60] for g, tests in guaranteed if not NAMED_TEST.search(tests)]
    assert not unattacked, f"guarantees without a test: {unattacked}"
    unexplained = [n[:60] for n, why in not_guaranteed if len(why.split()) < 5]
    assert not unexplained, f"residuals without a reason: {unexplained}"


def test_every_test_the_security_model_names_exists():
    text = SECURITY.read_text(encoding="utf-8")
    assert len(NAMED_TEST.findall(text)) >= 50
    assert _missing_tests(text) == []


def test_the_named_test_check_sees_a_missing_test():
    assert _missing_tests("`test_docs.py::test_readme_is_at_most_10_kb`") == []
    assert _missing_tests("`test_docs.py::test_that_was_never_written`, "
                          "`test_nowhere.py::test_readme_is_at_most_10_kb`") == [
        "test_docs.py::test_that_was_never_written", "test_nowhere.py::test_readme_is_at_most_10_kb"]


def test_readme_keeps_no_dates_machine_loads_or_issue_numbers():
    text = README.read_text(encoding="utf-8")
    found = re.findall(r"\b(?:issue|load) \d+|\b\d{1,2} (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|"
                       r"Oct|Nov|Dec)[a-z]* 20\d\d\b|\bUTC\b", text, flags=re.I)
    assert not found, found
