"""The book's offline rule: every reference a page loads stays inside the book's folder.

:func:`check_links` reads every HTML page of a folder (MathJax's own files left out) and refuses
what would break when the folder is zipped, moved or opened with no network: a load from a host,
an absolute path, or a relative path to a file the folder does not hold. A reader's click on an
``http(s):`` or ``mailto:`` link is allowed (nothing is loaded until they click).
"""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = ["LinkError", "check_links"]


class LinkError(Exception):
    """A page of the book references something outside it (the references are listed)."""


class _References(HTMLParser):
    """Collects (tag, attribute, value) of every reference a page loads or links to."""

    ATTRS = {"a": "href", "link": "href", "img": "src", "script": "src", "iframe": "src",
             "source": "src", "video": "src", "audio": "src", "embed": "src", "object": "data"}

    def __init__(self):
        super().__init__()
        self.refs: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        wanted = self.ATTRS.get(tag)
        for name, value in attrs:
            if name == wanted and value is not None:
                self.refs.append((tag, value))


def check_links(folder: Path) -> None:
    """Check that every page under `folder` loads nothing from outside it.

    Allowed: ``data:`` URLs, ``#fragments`` and empty links (the page itself), relative paths to existing files inside `folder`,
    and, for ``<a href>`` only (a reader's click, not a load), ``http(s):``/``mailto:`` links.
    Raises LinkError listing the offending references (page, tag, value).
    """
    folder = Path(folder).resolve()
    bad = []
    for page in sorted(folder.rglob("*.html")):
        if (folder / "mathjax") in page.parents:
            continue
        parser = _References()
        parser.feed(page.read_text(encoding="utf-8"))
        for tag, value in parser.refs:
            parts = urlsplit(value)
            if value == "" or value.startswith(("#", "data:")):   # "": the page itself
                continue
            if parts.scheme or parts.netloc or value.startswith("/"):
                if tag == "a" and parts.scheme in ("http", "https", "mailto"):
                    continue
                bad.append(f"{page.relative_to(folder)}: <{tag}> {value} (not inside the book)")
                continue
            target = (page.parent / unquote(parts.path)).resolve()
            if folder not in target.parents or not target.is_file():
                bad.append(f"{page.relative_to(folder)}: <{tag}> {value} (no such file in the "
                           "book)")
    if bad:
        raise LinkError(f"{len(bad)} reference(s) would break offline or from a zip:\n  "
                        + "\n  ".join(bad[:20]))
