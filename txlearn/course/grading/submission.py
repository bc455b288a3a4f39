"""Reading a submitted notebook as data, and planning which of its cells the runner executes.

A submission is hostile: :func:`read_notebook` checks its structure (nbformat 4, cells and their
metadata of the expected types, no symbolic links, limits on its size and on the
values its JSON holds) without running anything, and
:func:`plan` decides what runs: the course's setup cells as the course wrote them and the copy's
answer cells, in the course's order; never check cells, never cells the learner added. What the
copy changed of the course's cells (check cells edited or removed, setup cells edited, notebook
metadata altered) becomes its integrity notes.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from txlearn.checks import clean
from txlearn.course.grading.sets import CourseSet, GradingError

__all__ = ["read_notebook", "cell_text", "Cell", "plan", "MAX_NOTEBOOK_BYTES",
           "MAX_NOTEBOOK_VALUES", "SETUP_INDEX"]

MAX_NOTEBOOK_BYTES = 50 << 20
# "{", "[" and "," in the file, counted before it is parsed: 16 million empty objects fit in 50 MB
# and took the grader 1.2 GB to parse (per notebook, and --jobs grades several at once); this
# many cost at most about 150 MB. The course's notebooks hold a few thousand.
MAX_NOTEBOOK_VALUES = 2_000_000
SETUP_INDEX = 1_000_000   # the runner's numbers for the course's setup cells (above any real index)


def read_notebook(path: Path, sub=None) -> dict:
    """The notebook at ``path`` as plain JSON data, its structure checked (else GradingError);
    ``sub.digest`` (a :class:`~txlearn.course.grading.reports.Submission`) gets the SHA-256 of
    the bytes read."""
    if path.is_symlink():
        raise GradingError("it is a symbolic link (submit the notebook file itself)")
    if Path(os.path.abspath(path)).parent.is_symlink():   # the student is this folder: a link
        # (say, in an extracted archive) would grade another folder's notebooks under its name
        raise GradingError("its folder is a symbolic link (submit the notebook in a folder of "
                           "its own)")
    if not path.is_file():
        raise GradingError("no such file")
    if path.stat().st_nlink > 1:   # a hard link to a classmate's notebook (an archive can hold
        # one): which name is the student's own cannot be told, so neither is graded
        raise GradingError(f"it is a hard link (the same file has {path.stat().st_nlink} names; "
                           f"find out who submitted it)")
    if path.stat().st_size > MAX_NOTEBOOK_BYTES:
        raise GradingError(f"larger than {MAX_NOTEBOOK_BYTES >> 20} MB")
    data = path.read_bytes()
    if sub is not None:
        sub.digest = hashlib.sha256(data).hexdigest()
    if data.count(b"{") + data.count(b"[") + data.count(b",") > MAX_NOTEBOOK_VALUES:
        raise GradingError(f"more than {MAX_NOTEBOOK_VALUES:,} values in its JSON (clear its "
                           f"outputs: Kernel > Restart Kernel and Clear Outputs)")
    try:
        nb = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as err:
        first = (str(err).splitlines() or [""])[0][:120]
        raise GradingError(f"not a readable notebook ({type(err).__name__}: {first})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise GradingError("not a notebook (no list of cells)")
    if nb.get("nbformat") != 4:
        raise GradingError(f"nbformat {str(nb.get('nbformat'))[:10]}: only version 4 notebooks "
                           f"are graded")
    meta = nb.get("metadata", {})
    if not isinstance(meta, dict):
        raise GradingError("odd metadata: the notebook's metadata is not a mapping")
    if "txlearn" in meta and not isinstance(meta["txlearn"], dict):
        raise GradingError(f"odd metadata: metadata.txlearn is a {type(meta['txlearn']).__name__},"
                           f" not a mapping")
    for number, cell in enumerate(nb["cells"], start=1):
        where = f"odd metadata: cell {number}"
        if not isinstance(cell, dict) or not isinstance(cell.get("cell_type"), str):
            raise GradingError(f"{where} is not a notebook cell")
        source = cell.get("source", "")
        if not (isinstance(source, str) or isinstance(source, list)
                and all(isinstance(s, str) for s in source)):
            raise GradingError(f"{where}: its source is not text")
        cmeta = cell.get("metadata", {})
        if not isinstance(cmeta, dict):
            raise GradingError(f"{where}: its metadata is not a mapping")
        tags = cmeta.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise GradingError(f"{where}: its tags are a {type(tags).__name__}, not a list of "
                               f"words")
        if "exercise" in cmeta and not isinstance(cmeta["exercise"], str):
            raise GradingError(f"{where}: its exercise name is not text")
        if "id" in cell and not isinstance(cell["id"], str):
            raise GradingError(f"{where}: its id is not text")
    return nb


def cell_text(cell) -> str:
    """A notebook cell's source as one string (nbformat allows a list of lines)."""
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


@dataclass
class Cell:
    """One cell the runner executes: a setup cell as the course wrote it, or an answer cell."""

    index: int          # the position among the notebook's cells
    source: str
    exercise: str       # "" for a setup cell
    label: str


def plan(nb: dict, cs: CourseSet) -> tuple[list[Cell], set[str], list[str], set[str]]:
    """The cells the runner executes, the current exercises the copy has, its integrity notes,
    and the retired exercises it still has.

    The runner executes the course's code cells in the course's order: each setup cell as the
    course wrote it (the copy's own version, edited or not, never runs; a setup cell is trusted
    course code), and for each exercise the copy's answer cells. Cells the learner added, and
    check cells, never run."""
    answers: dict[str, list[tuple[int, str]]] = {}
    retired, notes, unknown = set(), [], []
    for index, cell in enumerate(nb["cells"]):
        if cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata", {})
        tags = meta.get("tags", [])
        if "answer" not in tags or not meta.get("exercise") or "check" in tags:
            continue
        name = meta["exercise"]
        if name in cs.info.retired:
            retired.add(name)
        elif name not in cs.names:
            unknown.append(name)
        else:
            answers.setdefault(name, []).append((index, cell_text(cell)))
    # one note however many (60,000 made-up names made 60,000 notes, 4 MB in every result row)
    for name in list(dict.fromkeys(unknown))[:3]:
        notes.append(f"an answer cell names an unknown exercise {clean(name, 40)!r}")
    if len(set(unknown)) > 3:
        notes.append(f"and {len(set(unknown)) - 3} more unknown exercise names")
    present = set(answers)
    mine_by_id = {c.get("id"): c for c in nb["cells"] if c.get("cell_type") == "code"}
    cells, setup, done = [], 0, set()
    for cid, exercise, source in cs.course_cells:
        if not exercise:
            setup += 1
            mine = mine_by_id.get(cid)
            if mine is not None and cell_text(mine).strip() != source.strip():
                notes.append(f"setup cell {setup} edited (the course's version ran)")
            cells.append(Cell(SETUP_INDEX + setup, source, "", f"setup cell {setup}"))
        elif exercise in answers and exercise not in done:
            done.add(exercise)
            for index, text in answers[exercise]:
                cells.append(Cell(index, text, exercise, f"answer cell of {exercise}"))
    by_id = {c.get("id"): c for c in nb["cells"]}
    for name in cs.names:
        if name not in present:
            continue
        mine = by_id.get(cs.check_ids[name])
        if mine is None:
            notes.append(f"check cell of {name} removed")
        elif cell_text(mine).strip() != cs.check_sources[name].strip():
            notes.append(f"check cell of {name} edited")
    meta = nb.get("metadata", {}).get("txlearn")
    if meta is not None:   # "version" differs between the handout and the solutions
        changed = [k for k in ("set", "generated_from") if meta.get(k) != cs.metadata.get(k)]
        if changed:
            notes.append(f"notebook metadata altered (txlearn.{', txlearn.'.join(changed)})")
    return cells, present, notes, retired
