"""Bring course updates into a learner's working copies without touching their answers.

``make lab`` runs ``txlearn update-work work/``. For each student notebook of the course:

- no copy in ``work/`` yet: the student notebook is copied, with the language_info a kernel of
  this Python writes (so that opening it in JupyterLab changes nothing);
- a copy exists: every exercise that is new in the course (an answer cell whose exercise name the
  copy lacks) is inserted with its statement, answer stub and check cell, right after the check
  cell of the exercise that precedes it in the course; the course's first exercise goes before
  the first exercise the copy shares with the course, or at the end when the copy holds only
  retired ones (so new answers run after retired answers of the same function names). Cells of
  the set's head that changed (its setup cell) come with it, under a new id.
  The generated introduction (which lists the exercises) is refreshed. The lesson's concept
  checks that close the notebook come the same way (:func:`txlearn.course.concepts.merge_concepts`:
  a new check is inserted, a changed question or reveal cell refreshed, an answer never touched).
  Nothing else changes:
  every existing cell, answers included, keeps its exact source, metadata and outputs. Before the first change the copy is saved to ``work/.backups/<name>.<stamp>.ipynb``.

Exercises the course removed stay in the copy (the learner's work); grading reports them as
retired.

A copy saved as nbformat 4.4 or older (some editors save so, dropping every cell id) is
upgraded to the course's 4.5 before anything is inserted (:func:`upgrade_copy`, with
``nbformat.v4.upgrade``): its cells get the ids of the course cells they were copied from (the
introduction found by its title, answers and checks by their exercise, other cells by their
text), the rest fresh ones, so the inserted cells, which carry ids, make a valid notebook and
the introduction is refreshed, not inserted a second time. A copy that needs no change is left
as it was saved.

Sources: issue "Exercise checks ... and course updates that reach learners' copies"; the public
report on ``update-work`` and copies saved as nbformat 4.4.
"""

from __future__ import annotations

import copy
import platform
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from txlearn.course import build, concepts


@dataclass
class Update:
    """What :func:`update_work` did to one notebook."""

    path: Path
    created: bool = False
    added: list[str] = field(default_factory=list)     # exercise names inserted
    concepts: list[str] = field(default_factory=list)  # concept checks inserted (their ids)
    backup: Path | None = None


def _exercise_of(cell) -> str | None:
    return cell.metadata.get("exercise") if cell.cell_type == "code" else None


def exercise_blocks(nb) -> list[tuple[str, list]]:
    """The course notebook's cells grouped per exercise: ``(name, cells)`` where ``cells`` runs
    from just after the previous exercise's check cell to this exercise's check cell."""
    blocks, pending = [], []
    for cell in nb.cells:
        pending.append(cell)
        if build.is_check(cell):
            blocks.append((cell.metadata["exercise"], pending))
            pending = []
    return blocks


def merge_new_exercises(work, course) -> list[str]:
    """Insert into ``work`` (a learner's notebook, changed in place) the exercises of ``course``
    (the current student notebook) that it lacks; return their names, in course order."""
    have = {_exercise_of(c) for c in work.cells} - {None}
    added = []
    previous = None
    for name, cells in exercise_blocks(course):
        if name not in have:
            position = len(work.cells)
            if previous is not None:
                checks = [i for i, c in enumerate(work.cells)
                          if build.is_check(c) and c.metadata.get("exercise") == previous]
                answers = [i for i, c in enumerate(work.cells)
                           if build.is_answer(c) and c.metadata.get("exercise") == previous]
                anchor = checks or answers
                if anchor:
                    position = anchor[-1] + 1
            else:
                position = _first_position(work, {n for n, _ in exercise_blocks(course)})
            new = _fresh_cells(cells, work)
            work.cells[position:position] = new
            have.add(name)
            added.append(name)
        previous = name
    return added


def _first_position(work, current: set) -> int:
    """Where the course's first exercise goes when the copy lacks it: before the block of the
    first exercise the copy shares with the course (right after the check cell before it), or,
    when the copy has only exercises the course retired, at the end: retired answers run first,
    so that a new answer reusing a retired function's name (set 03's ``split_heads``) wins."""
    kept = [i for i, c in enumerate(work.cells) if _exercise_of(c) in current]
    if not kept:
        return len(work.cells)
    checks = [i for i in range(kept[0]) if build.is_check(work.cells[i])]
    return checks[-1] + 1 if checks else kept[0]


def _fresh_cells(cells, work) -> list:
    """Copies of the course's ``cells`` to insert into ``work``: the generated notice and
    introduction are left out (the copy has its own; :func:`refresh_intro` updates it), a cell
    whose id and source the copy already has is left out, and a cell whose id the copy uses for
    other text (a set's setup cell that changed) gets a new id with the same set prefix, so that
    ids stay unique and ``txlearn.course.earlier.load`` still runs it."""
    by_id = {c.get("id"): c for c in work.cells}
    out = []
    for cell in cells:
        cid = cell.get("id")
        if cid in ("generated-notice", "set-intro"):
            continue
        mine = by_id.get(cid)
        if mine is not None and mine.source == cell.source and mine.cell_type == cell.cell_type:
            continue
        new = copy.deepcopy(cell)
        if mine is not None:
            n = 2
            while f"{cid}-v{n}" in by_id:
                n += 1
            new["id"] = f"{cid}-v{n}"
            by_id[new["id"]] = new
        out.append(new)
    return out


def _origin(cell, intro_title: str | None):
    """What identifies a cell as the copy of a course cell: its exercise and role for answers
    and checks, the set's title line for the introduction, else its type and text."""
    if build.is_check(cell) or build.is_answer(cell):
        return ("check" if build.is_check(cell) else "answer", cell.metadata.get("exercise"))
    if cell.cell_type == "markdown" and intro_title and \
            cell.source.split("\n", 1)[0].strip() == intro_title:
        return ("intro",)
    return (cell.cell_type, cell.source)


def upgrade_copy(work, course) -> bool:
    """Bring a copy saved as nbformat 4.4 or older (no cell ids) to the course's minor version,
    in place, with ``nbformat.v4.upgrade``; each cell then takes the id of the course cell it
    was copied from (:func:`_origin`, each id once), the others keep the fresh ids the upgrade
    gave them. False (nothing changed) for a copy that already has cell ids."""
    if work.nbformat_minor >= 5:
        return False
    nbformat.v4.upgrade(work)               # minor 5, a random id per cell
    intro = next((c for c in course.cells if c.get("id") == "set-intro"), None)
    title = intro.source.split("\n", 1)[0].strip() if intro is not None else None
    ids: dict = {}
    for cell in course.cells:
        ids.setdefault(_origin(cell, title), []).append(cell.get("id"))
    for cell in work.cells:
        free = ids.get(_origin(cell, title))
        if free:
            cell["id"] = free.pop(0)
    return True


def refresh_intro(work, course) -> bool:
    """Make the copy's generated set introduction (cell id ``set-intro``) match the course's
    (it counts and lists the exercises); True when it changed. Learners' cells are not touched."""
    intro = next((c for c in course.cells if c.get("id") == "set-intro"), None)
    if intro is None:
        return False
    mine = next((c for c in work.cells if c.get("id") == "set-intro"), None)
    if mine is None:
        after = next((i + 1 for i, c in enumerate(work.cells) if c.get("id") == "generated-notice"), 0)
        work.cells.insert(after, copy.deepcopy(intro))
        return True
    if mine.source != intro.source:
        mine.source = intro.source
        return True
    return False


def update_work(work_dir: Path, layout: build.Layout = build.Layout(),
                now: float | None = None) -> list[Update]:
    """Copy new student notebooks into ``work_dir`` and merge new exercises into existing copies.

    Returns one :class:`Update` per notebook that was created or changed. A copy that is not a
    readable notebook is left alone (reported with ``added=["<unreadable>"]``).
    """
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    done = []
    for student in sorted(layout.student.glob("[0-9][0-9]_*.ipynb")):
        target = work_dir / student.name
        if not target.exists():
            fresh = nbformat.read(student, as_version=4)
            # the Python version the learner's kernel will report: with it, opening the copy in
            # JupyterLab changes nothing and it never asks to save an untouched notebook
            fresh.metadata["language_info"] = build.language_info(platform.python_version())
            nbformat.write(fresh, target)
            done.append(Update(target, created=True))
            continue
        course = nbformat.read(student, as_version=4)
        try:
            work = nbformat.read(target, as_version=4)
        except Exception:  # nbformat raises several types for a broken file: leave it alone
            done.append(Update(target, added=["<unreadable>"]))
            continue
        upgrade_copy(work, course)             # in memory: saved only with a change below
        added = merge_new_exercises(work, course)
        new_checks, refreshed = concepts.merge_concepts(work, course)
        if not refresh_intro(work, course) and not added and not new_checks and not refreshed:
            continue
        backups = work_dir / ".backups"
        backups.mkdir(exist_ok=True)
        backup = backups / f"{target.stem}.{stamp}.ipynb"
        shutil.copyfile(target, backup)
        nbformat.write(work, target)
        done.append(Update(target, added=added, backup=backup, concepts=new_checks))
    return done
