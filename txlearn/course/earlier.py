"""Your own earlier answers, loaded from the sibling notebook of an earlier exercise set.

From set 03 on, exercise sets build on the learner's own modules: set 07's layer uses the
``MultiHeadAttention`` written in ``03_heads.ipynb``. A setup cell of set 07 says::

    from txlearn.course.earlier import load
    MultiHeadAttention = load("03_heads", "MultiHeadAttention")

:func:`load` reads ``03_heads.ipynb`` from the folder of the running notebook (``work/`` for a
learner), runs its course cells (the setup cells and the answer cells, never its check cells nor
cells the learner added) in a fresh namespace, and returns the named objects. The grader's sandboxed
runner uses the same function on the sibling notebooks the grader copies beside the submission, so
a notebook behaves the same in the learner's kernel and under ``txlearn grade``.
"""

from __future__ import annotations

import linecache
import types
from pathlib import Path

from txlearn.learner_calls import strip_magics

__all__ = ["EarlierAnswerError", "load", "course_code_cells"]

class EarlierAnswerError(ImportError):
    """A sibling notebook is missing, unreadable, or does not define a requested name."""


_cache: dict[tuple[str, float], types.ModuleType] = {}


def course_code_cells(nb: dict, set_name: str) -> list[str]:
    """Sources of the code cells of a notebook that the course generated (ids ``<set>-NNN...``):
    setup and answer cells, without check cells and without cells the learner added."""
    out = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        tags = (cell.get("metadata") or {}).get("tags") or []
        if not isinstance(tags, list) or "check" in tags:
            continue
        if not str(cell.get("id", "")).startswith(f"{set_name}-"):
            continue
        source = cell.get("source", "")
        out.append("".join(source) if isinstance(source, list) else str(source))
    return out


def load(set_name: str, *names: str):
    """The objects ``names`` defined by your answers in ``<set_name>.ipynb`` beside this notebook.

    Returns the object for one name, a tuple for several. The notebook's setup and answer cells
    run once per file version (cached by modification time) in a module of their own.

    Raises:
        EarlierAnswerError: the notebook is not in the folder ("needs 03_heads.ipynb beside
            it"), is not a readable notebook, a cell of it fails to run (naming the cell), or it
            defines no object of a requested name.
    """
    import json

    path = Path.cwd() / f"{set_name}.ipynb"   # a notebook's kernel runs in its folder
    if not path.is_file():
        raise EarlierAnswerError(f"needs {set_name}.ipynb beside this notebook (your earlier "
                                 f"answers; `make lab` puts it in work/)")
    key = (str(path.resolve()), path.stat().st_mtime)
    module = _cache.get(key)
    if module is None:
        try:
            nb = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise EarlierAnswerError(f"{set_name}.ipynb is not a readable notebook "
                                     f"({type(err).__name__})") from None
        module = types.ModuleType(f"txlearn_earlier_{set_name}")
        module.__file__ = str(path)
        for number, source in enumerate(course_code_cells(nb, set_name), start=1):
            filename, source = f"{set_name}.ipynb, cell {number}", strip_magics(source)
            # the cell's lines for tracebacks (the grader's runner names the learner's frames)
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
            try:
                exec(compile(source, filename, "exec"), module.__dict__)
            except Exception as err:
                raise EarlierAnswerError(f"{set_name}.ipynb: a cell failed to run "
                                         f"({type(err).__name__}: {err}); fix it there first"
                                         ) from None
        _cache[key] = module
    missing = [n for n in names if n not in module.__dict__]
    if missing:
        raise EarlierAnswerError(f"{set_name}.ipynb defines no {', '.join(missing)}: write that "
                                 f"answer there first")
    found = tuple(module.__dict__[n] for n in names)
    return found[0] if len(found) == 1 else found
