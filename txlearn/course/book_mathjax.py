"""The book's math typesetter: MathJax 3, found in its PyPI package and copied into the book.

The PyPI package django-static-mathjax ships MathJax 3's browser build in
``mathjax/static/mathjax/es5/`` (its Django app is never used: the book only reads the files).
The book loads ``tex-chtml.js`` (TeX in, CommonHTML out, with the menu and assistive MathML),
which loads the rest on demand from beside itself by relative paths: TeX extensions
(``input/``), the CommonHTML fonts (``output/``), the menu (``ui/``), the accessibility
extensions and their speech rules (``a11y/``, ``sre/``). :func:`copy_mathjax` copies exactly
those, and MathJax's licence, into a book's ``mathjax/`` folder.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

__all__ = ["MATHJAX_COMPONENT", "MATHJAX_PARTS", "MathJaxMissing", "copy_mathjax",
           "mathjax_source"]

MATHJAX_COMPONENT = "tex-chtml.js"
"""The MathJax 3 component every page loads."""
MATHJAX_PARTS = ("a11y", "adaptors", "input", "output", "sre", "ui")
"""The folders of es5/ the component loads on demand."""


class MathJaxMissing(Exception):
    """The package that ships MathJax 3 is not installed, or holds no tex-chtml.js."""


def mathjax_source() -> Path:
    """The MathJax 3 folder (``es5/``) of the installed django-static-mathjax package. Raises
    MathJaxMissing when it is not installed or lacks :data:`MATHJAX_COMPONENT`."""
    spec = importlib.util.find_spec("mathjax")
    if spec is None or not spec.submodule_search_locations:
        raise MathJaxMissing("the package django-static-mathjax is missing (it ships the "
                             "book's MathJax 3): pip install -e . in the course's venv")
    es5 = Path(list(spec.submodule_search_locations)[0]) / "static" / "mathjax" / "es5"
    if not (es5 / MATHJAX_COMPONENT).is_file():
        raise MathJaxMissing(f"{es5}: no {MATHJAX_COMPONENT} in django-static-mathjax")
    return es5


def copy_mathjax(dest: Path) -> Path:
    """Copy the component, the folders it loads on demand and MathJax's licence into `dest`
    (created; it must not exist). Returns `dest`."""
    source = mathjax_source()
    dest = Path(dest)
    dest.mkdir(parents=True)
    shutil.copy2(source / MATHJAX_COMPONENT, dest / MATHJAX_COMPONENT)
    for part in MATHJAX_PARTS:
        shutil.copytree(source / part, dest / part)
    shutil.copy2(source.parent / "LICENSE", dest / "LICENSE")
    return dest
