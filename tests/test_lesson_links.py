"""Links between lessons (`NN_name.ipynb#Heading`, e.g. to lesson 00's notation table) resolve in
JupyterLab, which opens the notebook at the heading, and in the offline book (`make book`)."""

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
LINK = re.compile(r"\]\((\d\d_\w+)\.ipynb#([^)\s]+)\)")       # markdown [text](NN_name.ipynb#id)


def _markdown(path):
    nb = nbformat.read(path, as_version=4)
    return "\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")


def _heading_ids(path):
    """Ids of a notebook's plain-text headings: the text with spaces as '-', as JupyterLab
    (`createHeaderId`) and nbconvert (`add_anchor`) both make them."""
    headings = re.findall(r"^#{1,6} (.+)$", _markdown(path), flags=re.M)
    return {h.strip().replace(" ", "-") for h in headings}


def _links():
    return [(nb.name, target, anchor) for nb in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
            for target, anchor in LINK.findall(_markdown(nb))]


def test_lessons_00_to_04_link_to_the_notation_table():
    linked = {source for source, target, anchor in _links()
              if (target, anchor) == ("00_map", "Notation")}
    wanted = {p.name for p in NOTEBOOKS.glob("0[1-4]_*.ipynb")}
    assert wanted and wanted <= linked, f"no link to the notation table in {sorted(wanted - linked)}"
    assert "[the notation table](#Notation)" in _markdown(NOTEBOOKS / "00_map.ipynb")


@pytest.mark.parametrize("source,target,anchor", _links())
def test_every_link_between_lessons_names_a_heading(source, target, anchor):
    path = NOTEBOOKS / f"{target}.ipynb"
    assert path.exists(), f"{source} links to {target}.ipynb, which does not exist"
    assert anchor in _heading_ids(path), (f"{source} links to {target}.ipynb#{anchor}; its "
                                          f"headings give {sorted(_heading_ids(path))}")


def test_the_book_keeps_the_anchor_and_points_links_at_its_pages():
    from txlearn.course import book

    nb = nbformat.read(NOTEBOOKS / "04_positional.ipynb", as_version=4)
    book._rewrite_links(nb, {"00_map": "00_map.html", "04_positional": "04_positional.html"},
                        {"04_positional": "exercises/04_positional.html"})
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "](00_map.html#Notation)" in text and "00_map.ipynb#" not in text
    assert "](exercises/04_positional.html)" in text and "../work/" not in text
