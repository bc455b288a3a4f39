"""Merging gradebooks written on several machines into one, without ever duplicating a run.

``txlearn merge class.db lab1.db lab2.db`` adds to ``class.db`` every run and every graded
notebook of the others that it does not hold yet. Runs and notebooks are identified by the random
UUIDs they were given when graded (:mod:`~txlearn.course.gradebook.store`), so merging the same
file twice, merging A into B and then B into A, or merging copies of copies adds each one once.
Each source is merged in one transaction (all of its new rows or none); a source is opened
read-only and checked like any gradebook (not a gradebook, corrupt, newer schema: an error naming
it, and nothing merged from it). A student and set the merge leaves recorded from two folders or
machines (another machine's ``alice``) is a warning of :attr:`Merged.warnings`
(:func:`~txlearn.course.gradebook.store.identity_clashes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from txlearn.course.gradebook.store import (NOTEBOOK_COLUMNS, RESULT_COLUMNS, RUN_COLUMNS,
                                            Gradebook, GradebookError, identity_clashes,
                                            open_gradebook)

__all__ = ["merge_gradebooks", "Merged"]


@dataclass
class Merged:
    """What one source added: runs and notebooks new to the target, and those it already had."""

    source: Path
    runs: int = 0
    notebooks: int = 0
    known_runs: int = 0
    known_notebooks: int = 0
    warnings: list = field(default_factory=list)    # identities in doubt after the merge


def _merge_one(target: Gradebook, source: Gradebook) -> Merged:
    out = Merged(source.path)
    runs = source.read(f"SELECT {source.columns('runs', RUN_COLUMNS)} FROM runs")
    notebooks = source.read(f"SELECT id, {', '.join(NOTEBOOK_COLUMNS)} FROM notebooks")
    results = source.read(f"SELECT notebook_id, {source.columns('results', RESULT_COLUMNS)} "
                          f"FROM results")
    answers = source.read("SELECT notebook_id, exercise, source FROM answers")
    by_notebook: dict[int, list] = {}
    for r in results:
        by_notebook.setdefault(r[0], []).append(r[1:])
    answers_of: dict[int, list] = {}
    for a in answers:
        answers_of.setdefault(a[0], []).append(a[1:])
    incomplete = [n[1] for n in notebooks if len(by_notebook.get(n[0], ())) != n[-1]]
    if incomplete:
        raise GradebookError(f"gradebook {source.path}: notebook {incomplete[0]} has not all its "
                             f"results; nothing was merged from it")

    def statements(cur):
        for run in runs:
            cur.execute(f"INSERT OR IGNORE INTO runs ({', '.join(RUN_COLUMNS)}) VALUES "
                        f"({', '.join('?' * len(RUN_COLUMNS))})", run)
            if cur.rowcount:
                out.runs += 1
            else:
                out.known_runs += 1
                # a run that was still going when the other copy was made: keep its end time
                cur.execute("UPDATE runs SET finished_at = ? WHERE uuid = ? AND finished_at = ''",
                            (run[RUN_COLUMNS.index("finished_at")], run[0]))
        for notebook in notebooks:
            old_id, values = notebook[0], notebook[1:]
            cur.execute(f"INSERT OR IGNORE INTO notebooks ({', '.join(NOTEBOOK_COLUMNS)}) "
                        f"VALUES ({', '.join('?' * len(NOTEBOOK_COLUMNS))})", values)
            if not cur.rowcount:
                out.known_notebooks += 1
                continue
            out.notebooks += 1
            new_id = cur.lastrowid
            cur.executemany(f"INSERT INTO results (notebook_id, {', '.join(RESULT_COLUMNS)}) "
                            f"VALUES (?, {', '.join('?' * len(RESULT_COLUMNS))})",
                            [(new_id, *r) for r in by_notebook.get(old_id, [])])
            cur.executemany("INSERT INTO answers (notebook_id, exercise, source) VALUES (?, ?, ?)",
                            [(new_id, *a) for a in answers_of.get(old_id, [])])
    target.write(statements)
    column = NOTEBOOK_COLUMNS.index
    theirs = {(n[1 + column("student")], n[1 + column("set_name")]) for n in notebooks}
    out.warnings = [w for w in identity_clashes(target.notebooks(with_answers=False))
                    if any(w.startswith(f"{s!r}, {t}:") for s, t in theirs)]
    return out


def merge_gradebooks(target: Path, sources: list[Path], *, wait: float = 60.0) -> list[Merged]:
    """Merge each of ``sources`` into ``target`` (created when missing); returns what each added.
    Raises GradebookError for a source or target that cannot be read or written (sources before
    it stay merged)."""
    target = Path(target)
    out = []
    with open_gradebook(target, wait=wait) as into:
        for source in sources:
            if Path(source).resolve() == target.resolve():
                raise GradebookError(f"gradebook {source}: the target itself")
            with open_gradebook(source, readonly=True, wait=wait) as other:
                out.append(_merge_one(into, other))
    return out
