"""Links between lessons: every `NN_name.ipynb#Anchor` in a lesson points to a notebook that exists
and to a heading in it, with the anchor that nbconvert's HTML export writes (its own markdown
renderer is the oracle) and the one JupyterLab gives a rendered heading (its text with spaces
turned into '-', ``createHeaderId`` in @jupyterlab/rendermime); every lesson links to lesson 00's
notation table; the offline book (`make book`) keeps the anchors when it points links at pages."""

import re
from pathlib import Path
from urllib.parse import unquote

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
LINK = re.compile(r"\]\(((\d\d_\w+)\.ipynb)#([^)\s]+)\)")


def _markdown(path):
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown"]


def _nbconvert_ids(path):
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    html = "".join(markdown2html_mistune(source) for source in _markdown(path))
    return {unquote(i) for i in re.findall(r'<h[1-6] id="([^"]+)"', html)}


def _jupyterlab_ids(path):
    ids = set()
    for source in _markdown(path):
        for line in source.splitlines():
            m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:  # the heading's text content: inline code and emphasis marks are not text
                ids.add(re.sub(r"[`*_]", "", m.group(1)).replace(" ", "-"))
    return ids


def _links():
    found = []
    for nb in NOTEBOOKS:
        for source in _markdown(nb):
            found += [(nb.name, target, anchor) for target, _, anchor in LINK.findall(source)]
    return found


def test_the_notation_section_has_the_anchor_lessons_link_to():
    lesson_00 = next(nb for nb in NOTEBOOKS if nb.name.startswith("00_"))
    assert "Notation" in _nbconvert_ids(lesson_00)
    assert "Notation" in _jupyterlab_ids(lesson_00)
    assert "[the notation table](#Notation)" in "\n".join(_markdown(lesson_00))


def test_every_lesson_links_to_the_notation_table():
    linked = {source for source, target, anchor in _links()
              if (target, anchor) == ("00_map.ipynb", "Notation")}
    wanted = {nb.name for nb in NOTEBOOKS if not nb.name.startswith("00_")}
    assert wanted and not wanted - linked, f"no link to the notation table in {sorted(wanted - linked)}"


@pytest.mark.parametrize("source,target,anchor", _links())
def test_every_anchor_link_between_lessons_resolves(source, target, anchor):
    path = ROOT / "notebooks" / target
    assert path.exists(), f"{source} links to {target}, which does not exist"
    assert unquote(anchor) in _nbconvert_ids(path), f"{source}: no heading #{anchor} in {target} (nbconvert)"
    assert unquote(anchor) in _jupyterlab_ids(path), f"{source}: no heading #{anchor} in {target} (JupyterLab)"


def test_the_book_keeps_the_anchor_and_points_links_at_its_pages():
    from txlearn.course import book

    nb = nbformat.read(ROOT / "notebooks" / "04_positional.ipynb", as_version=4)
    book._rewrite_links(nb, {"00_map": "00_map.html", "04_positional": "04_positional.html"},
                        {"04_positional": "exercises/04_positional.html"})
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "](00_map.html#Notation)" in text and "00_map.ipynb#" not in text
    assert "](exercises/04_positional.html)" in text and "../work/" not in text
