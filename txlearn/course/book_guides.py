"""The course's guides as pages of the offline book: which files, in which order, and their links.

The guides are the Markdown pages of ``docs/`` and ``CONTRIBUTING.md``, written to read well on a
code host. In the book each becomes ``guides/<name>.html`` (``CONTRIBUTING.md`` is
``guides/contributing.html``), in the order README's links first name them (then any other
``docs/*.md`` by name, then CONTRIBUTING). :func:`book_markdown` points each relative link at
what the book holds instead: a guide at its page, README at the contents page, a lesson's
notebook at its page when this build has it; a link to any other file of the repository (a
benchmark's notes, a source file) keeps its text and names the file, which is not in the book.
Links with a scheme (``https:``) are left as they are. A heading's anchor is renamed from the code
host's form (``#a-term-with-the-gradebook``: lower case, punctuation dropped) to the id nbconvert
gives the heading in the book (its text, spaces as hyphens: ``#A-term-with-the-gradebook``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

__all__ = ["Guide", "book_markdown", "find_guides", "heading_ids", "LINK"]

LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")
"""A Markdown inline link ``[text](target)`` (images, ``![...]``, are not links)."""


@dataclass(frozen=True)
class Guide:
    """One guide: ``source`` its Markdown file, ``page`` its path in the book
    (``guides/security.html``), ``title`` the text of its first ``# `` heading."""

    source: Path
    page: str
    title: str


def find_guides(root: Path) -> list[Guide]:
    """The guides of the repository at `root`: ``docs/*.md`` in the order README.md first links
    them, the others after them by name, then CONTRIBUTING.md (when it exists)."""
    docs = sorted((root / "docs").glob("*.md"))
    readme = root / "README.md"
    order = []
    if readme.is_file():
        for _, target in LINK.findall(readme.read_text(encoding="utf-8")):
            path = (root / target.split("#", 1)[0]).resolve()
            if path in [d.resolve() for d in docs] and path not in order:
                order.append(path)
    sources = order + [d.resolve() for d in docs if d.resolve() not in order]
    if (root / "CONTRIBUTING.md").is_file():
        sources.append((root / "CONTRIBUTING.md").resolve())
    return [Guide(s, f"guides/{s.stem.lower()}.html", _title(s)) for s in sources]


def _title(source: Path) -> str:
    match = re.search(r"^# (.+)$", source.read_text(encoding="utf-8"), re.M)
    return match.group(1).strip() if match else source.stem


def heading_ids(text: str) -> dict[str, str]:
    """{the code host's anchor of a heading: the id nbconvert gives it} for every Markdown heading
    of `text` outside code fences (the plain text of the heading: code spans and emphasis
    unwrapped, links as their text)."""
    ids = {}
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M):
        plain = LINK.sub(r"\1", heading).replace("`", "").replace("**", "").strip()
        slug = re.sub(r"[^\w\- ]", "", plain.lower()).replace(" ", "-")
        ids.setdefault(slug, quote(plain.replace(" ", "-"), safe="?/:@!$&'()*+,;="))
    return ids


def book_markdown(guide: Guide, guides: list[Guide], root: Path,
                  lesson_pages: dict[str, str]) -> str:
    """The text of `guide` with its relative links pointed at the book's pages, as seen from the
    guide's own page (``guides/``): the other `guides`, README (the contents, ``../index.html``)
    and the lessons in `lesson_pages` ({stem: page relative to the book}); any other file of the
    repository at `root` keeps the link's text and is named after it in code."""
    pages = {g.source.resolve(): Path(g.page).name for g in guides}
    root = root.resolve()

    def target(match: re.Match) -> str:
        text, href = match.group(1), match.group(2)
        if re.match(r"[a-z][a-z0-9+.-]*:", href):
            return match.group(0)
        path_part, _, fragment = href.partition("#")
        path = (guide.source.parent / path_part).resolve() if path_part else guide.source.resolve()
        anchor = f"#{fragment}" if fragment else ""
        if path in pages:
            ids = heading_ids(path.read_text(encoding="utf-8")) if fragment else {}
            anchor = f"#{ids.get(fragment, fragment)}" if fragment else ""
            return f"[{text}]({'' if not path_part else pages[path]}{anchor})"
        if path == root / "README.md":
            return f"[{text}](../index.html)"
        if path.suffix == ".ipynb" and path.stem in lesson_pages:
            return f"[{text}](../{lesson_pages[path.stem]}{anchor})"
        try:
            shown = path.relative_to(root).as_posix()
        except ValueError:
            shown = path_part
        return text if text.strip("`") == shown else f"{text} (`{shown}`)"

    return LINK.sub(target, guide.source.read_text(encoding="utf-8"))
