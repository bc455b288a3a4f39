"""Recording a grading run into the gradebook: one notebook per transaction, as each is graded.

:class:`Recorder` is what ``txlearn grade --gradebook class.db`` hands the grader as its
``on_graded`` callback: for each graded :class:`~txlearn.course.grading.Submission` it adds one
notebook row with its results (each with the identifier of the mistake that fired,
:mod:`~txlearn.course.gradebook.mistakes`), its lateness from the course file
(:mod:`~txlearn.course.gradebook.course`) and the text of its answer cells, in one transaction.
The gradebook is opened, and the run added, before any notebook is graded, so a gradebook that
cannot be written stops the run before it starts. Concept answers (results ``concept:<id>``) are
recorded with the answer that counted and the option chosen; their points are the course file's
``concepts.points`` per right answer (0 by default: recorded, not graded).

Nothing a submission wrote is trusted here either: answer cells are read from the same bytes the
grader graded (their SHA-256 must match, else none are kept and an integrity note says so), at
most :data:`MAX_ANSWER_CHARS` per exercise of the set (cells naming made-up exercises are not
kept).

One student never stops the class: a notebook whose row cannot be written (anything about it
the gradebook cannot take) is recorded as not graded, with the reason (:meth:`Recorder.unrecorded`),
and the run goes on; only a gradebook that cannot be written at all stops it. Names are
recorded in the form the course file's names are compared in (NFC,
:func:`~txlearn.course.gradebook.course.name_key`), texts losslessly
(:func:`~txlearn.course.gradebook.store.stored_text`). Source: the public report on undecodable
names and the grader's fourth hardening (a lone surrogate in a folder name or an answer cell
stopped the whole ``txlearn grade --gradebook`` run).

Who a notebook is: its student folder's name, as the grader says; but where the course file has
a roster naming that student, only the folder of that name beside the course file is them
(``late/alice/`` is recorded as ``late/alice``, with a warning). A (student, set) already
recorded from another folder or machine gets a warning too (:attr:`Recorder.warnings`): the
run that counts might be someone else's.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from pathlib import Path

from txlearn.course.gradebook import mistakes
from txlearn.course.gradebook.course import Course, name_key
from txlearn.course.gradebook.store import (Gradebook, NotebookRow, ResultRow, readable,
                                            stored_text, text_of)

__all__ = ["Recorder", "set_of_file", "earlier_sets", "answer_cells", "hidden_exercises", "now_utc",
           "MAX_ANSWER_CHARS"]

MAX_ANSWER_CHARS = 20_000


def now_utc() -> str:
    """The time now, ISO 8601 in UTC to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def answer_cells(data: bytes) -> dict[str, str]:
    """{exercise: the text of its answer cells} of a notebook's bytes ({} when unreadable);
    concept answers under ``concept:<id>``."""
    try:
        nb = json.loads(data.decode("utf-8"))
        cells = nb["cells"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return {}
    out: dict[str, list[str]] = {}
    for cell in cells if isinstance(cells, list) else []:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata") if isinstance(cell.get("metadata"), dict) else {}
        tags = meta.get("tags") if isinstance(meta.get("tags"), list) else []
        name = meta.get("exercise")
        if "concept-answer" in tags and isinstance(meta.get("concept"), str):
            name = "concept:" + meta["concept"]   # a concept answer, under its result's name
        elif "answer" not in tags or "check" in tags or not isinstance(name, str) or not name:
            continue
        source = cell.get("source", "")
        if isinstance(source, list):
            source = "".join(s for s in source if isinstance(s, str))
        if isinstance(source, str):
            out.setdefault(name[:100], []).append(source)
    return {k: "\n".join(v)[:MAX_ANSWER_CHARS] for k, v in out.items()}


def hidden_exercises(hidden: Path | None) -> dict[str, set[str]]:
    """{check module stem: the exercises it has hidden cases for} of a hidden-case folder
    (:func:`txlearn.course.grading.hidden.hidden_functions`; ``{}`` without one)."""
    if hidden is None:
        return {}
    from txlearn.course.grading.hidden import hidden_functions   # the grader's own reading

    return hidden_functions(Path(hidden))


def earlier_sets(set_name: str) -> tuple[str, ...]:
    """The earlier sets whose answers ``set_name`` uses (its source's ``uses:``; () for a set
    the course does not know), for the pages that state a run's earlier-sets policy."""
    from txlearn.course import build

    if set_name not in _USES:
        source = build.find_source(set_name)
        _USES[set_name] = tuple(build.set_info(build.read_source(source), source.stem,
                                               source.name).uses) if source else ()
    return _USES[set_name]


_USES: dict[str, tuple[str, ...]] = {}


def set_of_file(path: str) -> str:
    """The exercise set a notebook's file name names (``01_softmax.ipynb``: ``01_softmax``,
    as the grader finds it), else the file name's stem: a row is never recorded without a set,
    or the report, the feedback index and the pages would leave it out (issue 36)."""
    from txlearn.course import build   # only where a row lacks its set
    stem = Path(path).stem
    try:
        source = build.find_source(stem)
    except (OSError, ValueError):
        source = None
    return source.stem if source is not None else stem


class Recorder:
    """The grader's ``on_graded`` callback writing each notebook into ``gradebook``.

    ``course``: the course file (deadlines, extensions, penalty, manifest); ``hidden``: the
    run's hidden-case folder (which exercises had hidden cases is recorded per result);
    ``command``: how the run was started (kept with the run, which is added with the first
    notebook); ``earlier``: the run's earlier-sets policy (``own`` or ``reference``, as
    ``txlearn grade --earlier`` gave it). :meth:`finish` marks the run done.
    """

    def __init__(self, gradebook: Gradebook, course: Course, *, hidden: Path | None = None,
                 command: str = "txlearn grade", version: str = "", earlier: str = "own"):
        self.gradebook, self.course = gradebook, course
        self.hidden = hidden_exercises(hidden)
        self.recorded = 0
        self.unrecordable: list[str] = []     # "path: why" of each notebook recorded as ERROR
        self.warnings: list[str] = []   # identities in doubt, for the grader to print
        self.from_file_times: list[str] = []   # notebooks whose lateness is their file's time
        self.run = ""          # added with the first notebook (a run that grades none leaves none)
        self._run_values = dict(command=command[:2000], hidden=str(hidden or ""),
                                course_file=str(course.path or ""), started_at=now_utc(),
                                version=version, earlier=earlier)

    def row(self, sub) -> NotebookRow:
        """The notebook row of a graded Submission (results, lateness, answers)."""
        path = Path(sub.path)
        integrity = list(sub.integrity)
        answers = {}
        try:
            data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
        except OSError:
            data = b""
        if data and sub.digest and hashlib.sha256(data).hexdigest() == sub.digest:
            # the set's own exercises and concept checks: a made-up name is no answer
            names = {r.exercise for r in sub.results + sub.concepts}
            answers = {k: v for k, v in answer_cells(data).items() if k in names}
        elif data and sub.digest:
            integrity.append("the file changed after it was graded: its answers were not kept")
        try:
            timing = self.course.lateness(sub.student, sub.set_name, path)
        except OSError:
            timing = self.course.lateness(sub.student, sub.set_name, Path("/"))
            timing.submitted_from = "unknown"
        if timing.submitted_from == "mtime" and timing.deadline:   # a time nobody gave
            self.from_file_times.append(readable(str(path)))
            integrity.append("lateness from the file's modification time (no manifest row "
                             "gives its submission time)")
        results, extra_points, extra_max = [], 0, 0
        for r in sub.results + sub.concepts:
            concept = r.kind.startswith("concept:")   # the course file weights these (or not)
            stem = mistakes.check_module(r.exercise) if r.status not in ("ERROR", "RETIRED") \
                and r.exercise != "-" and not concept else ""
            points, max_points = int(r.points), int(r.max_points)
            if concept:
                max_points = self.course.concept_points
                points = max_points if r.status == "PASS" else 0
                extra_points += points - int(r.points)
                extra_max += max_points - int(r.max_points)
            results.append(ResultRow(
                exercise=r.exercise, status=r.status, points=points,
                max_points=max_points, feedback=r.feedback, kind=r.kind,
                mistake=mistakes.mistake_id(r.exercise, r.kind, r.hints, hidden=r.hidden,
                                            status=r.status),
                hint=mistakes.hint_text(r.hints), hidden=bool(r.hidden),
                hidden_cases=r.exercise in self.hidden.get(stem, ()), flagged=r.flagged,
                instructor_note=getattr(r, "instructor_note", "")))
        return NotebookRow(
            uuid=uuid.uuid4().hex, run_uuid=self.run,
            student=self._student(name_key(sub.student), path),
            set_name=sub.set_name, notebook=path.name, path=str(path), digest=sub.digest,
            submitted_at=timing.submitted_at, submitted_from=timing.submitted_from,
            graded_at=sub.graded_at or now_utc(), status="ERROR" if sub.error else "GRADED",
            error=sub.error, sandbox=sub.mode, points=int(sub.points) + extra_points,
            max_points=int(sub.max_points) + extra_max, deadline=timing.deadline,
            late_seconds=timing.late_seconds, penalty=timing.penalty, integrity=integrity,
            results=results, answers=answers)

    def unrecorded(self, sub, err: BaseException) -> NotebookRow:
        """The row of a notebook whose own row could not be written (``err``): not graded
        (ERROR), with the reason, its student, set and path, so that the class report and the
        exports show it and a re-grade replaces it."""
        path = str(getattr(sub, "path", ""))
        why = readable(f"{type(err).__name__}: {err}")[:300]
        return NotebookRow(
            uuid=uuid.uuid4().hex, run_uuid=self.run, student=name_key(sub.student),
            set_name=str(sub.set_name or set_of_file(path)), notebook=Path(path).name, path=path,
            digest=str(sub.digest or ""), submitted_at="", submitted_from="unknown",
            graded_at=str(sub.graded_at or now_utc()), status="ERROR",
            error=f"not recorded: the gradebook could not take this notebook ({why}); "
                  f"grade it again", sandbox=str(sub.mode or ""), points=0, max_points=0,
            deadline="", late_seconds=0.0, penalty=0.0, integrity=[])

    def _student(self, student: str, path: Path) -> str:
        """Whom the notebook at ``path`` is recorded as (see the module docstring)."""
        if student not in self.course.roster or not self.course.path:
            return student
        beside = Path(self.course.path).resolve().parent
        folder = path.absolute().parent
        if folder.parent == beside:
            return student
        name = f"{folder.parent.name}/{folder.name}"
        self.warnings.append(readable(
            f"{path}: recorded as student {name!r}: the course file's roster names "
            f"{student!r}, whose folder is {beside / student}"))
        return name

    def _elsewhere(self, row: NotebookRow) -> None:
        """A warning when ``row``'s student and set were recorded before from another folder
        or machine."""
        before = self.gradebook.read(
            "SELECT n.path, r.machine FROM notebooks n JOIN runs r ON r.uuid = n.run_uuid "
            "WHERE n.student = ? AND n.set_name = ? AND n.run_uuid != ?",
            (stored_text(row.student), stored_text(row.set_name), self.run))
        machine = self.gradebook.read("SELECT machine FROM runs WHERE uuid = ?", (self.run,))
        here = (os.path.dirname(row.path), machine[0][0] if machine else "")
        elsewhere = sorted({(os.path.dirname(text_of(p)), m) for p, m in before} - {here})
        if elsewhere and row.set_name:
            self.warnings.append(readable(
                f"{row.student!r}, {row.set_name}: recorded before from {elsewhere[0][0]} on "
                f"{elsewhere[0][1]}, now from {here[0]} on {here[1]}: both count as the same "
                f"student (give each its own folder name, or a roster in the course file)"))

    def __call__(self, sub) -> None:
        if not self.run:
            self.run = self.gradebook.start_run(**self._run_values)
        try:
            row = self.row(sub)
            self._elsewhere(row)
            self.gradebook.add_notebook(row)
        except Exception as err:   # this notebook's own: recorded as such, the class goes on
            self.gradebook.add_notebook(self.unrecorded(sub, err))   # raises: the gradebook's
            self.unrecordable.append(readable(f"{sub.path}: {type(err).__name__}: {err}")[:300])
        self.recorded += 1

    def finish(self) -> None:
        """Mark the run finished (when it recorded anything); warn when lateness came from file
        modification times (a copy or an unzip sets them to its own time: two correct notebooks
        copied on the day of grading were recorded 58 days late)."""
        if self.run:
            self.gradebook.finish_run(self.run, now_utc())
        if self.from_file_times:
            n = len(self.from_file_times)
            self.warnings.append(
                f"{n} notebook(s) have no submission time in a manifest: their lateness comes "
                f"from the files' modification times, which a copy or an unzip resets (e.g. "
                f"{self.from_file_times[0]}); give their times in manifest.csv (txlearn collect "
                f"writes it from the LMS's download); the gradebook flags each of them")
