"""The instructor's exports: a wide CSV, Canvas's and Moodle's gradebook imports, Gradescope's
autograder ``results.json``.

Every score is the run that counts (the policy, :func:`~txlearn.course.gradebook.store.counting`)
after its late penalty; a set a student has no notebook for, or whose notebook could not be graded
(ERROR), is left blank (not a zero: the LMS, or the instructor, decides what it scores). Students are identified by the course file's roster
(:mod:`~txlearn.course.gradebook.course`); a course file without a roster lets the student's
folder name stand in for the LMS login (Canvas's "SIS Login ID", Moodle's "ID number").

**Identity.** An import matches each row on one identity: Canvas on ``ID``, ``SIS User ID`` or
``SIS Login ID``; Moodle on the column the instructor maps (``Email address`` to useremail, the
default here, or ``ID number`` to useridnumber: ``match``). A row without it is not written
blank (Moodle aborts on a blank email, or credits the row to the student before it): a student
without a roster entry when the course file has a roster, or without the mapped key, makes
:func:`write_export` refuse with the students named (:func:`unidentified`), or, with
``skip_unidentified``, leave them out for the instructor to enter by hand. Every CSV cell is written
by :func:`~txlearn.course.csv_cells.csv_cell` (as the grader's are): numbers exactly (shortest
round trip), text with a formula character at its start or after a separator a spreadsheet may
split on given an apostrophe (a folder named like a formula would run as one when the file is
opened in a spreadsheet); a name that is not UTF-8 is shown with its escapes
(:func:`~txlearn.course.gradebook.store.readable`).

Formats, as documented by each system:

- **wide** (:func:`wide_rows`): ``student``, one column per set, ``total``.
- **Canvas** (:func:`canvas_rows`): Canvas's gradebook import reads the layout of its own
  gradebook export: the columns ``Student``, ``ID``, ``SIS User ID``, ``SIS Login ID``,
  ``Section``, then one column per assignment, named ``Title (assignment id)`` for an existing
  assignment (a new one is created for a name without an id), and a second row
  ``Points Possible`` giving each assignment's points. A student is matched by ``ID``, ``SIS
  User ID`` or ``SIS Login ID``. Sources: Canvas Instructor Guide, "How do I import grades in the
  Gradebook?" (community.canvaslms.com/t5/Instructor-Guide/How-do-I-import-grades-in-the-Gradebook/ta-p/807);
  Ohio State's guide to it, "Import a CSV file to Carmen Grades" (Student Name, Student ID or
  SIS User ID; SIS Login ID; Section; one column per assignment); Canvas's exporter
  (canvas-lms, ``Course#gradebook_to_csv``: the same header and the ``Points Possible`` row).
- **Moodle** (:func:`moodle_rows`): Moodle's "Import grades from CSV" takes a header row and maps
  one column to the user ("Map from" Email address to "useremail", or ID number to
  "useridnumber") and each other column to a grade item (an existing one or a new one); its
  import format is that of its own CSV export, whose columns start ``First name``, ``Last name``,
  ``ID number``, ``Email address``. Source: MoodleDocs, "Grade import"
  (docs.moodle.org/311/en/Grade_import, "CSV grade import").
- **Gradescope** (:func:`gradescope_results`): the autograder's ``results.json`` (Gradescope
  Autograder Specifications, gradescope-autograders.readthedocs.io/en/latest/specs/, "Output
  format"): a top-level ``score``, ``output`` and ``tests``, each test with ``name``, ``score``,
  ``max_score``, ``status`` ("passed"/"failed"), ``output`` and ``visibility`` (``visible``;
  ``hidden``: never shown to students; ``after_due_date``; ``after_published``: shown once the
  grades are published). An exercise the grader ran hidden cases for becomes two tests: its
  public cases (visible, no points) and its hidden cases (the exercise's points, visibility
  ``after_published`` unless told ``hidden``), so that a student cannot learn from Gradescope,
  before grades are published, which hidden case their code fails.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from txlearn.course.csv_cells import csv_cell
from txlearn.course.gradebook.course import Course
from txlearn.course.gradebook.store import NotebookRow, counting, readable

__all__ = ["wide_rows", "canvas_rows", "moodle_rows", "gradescope_results", "write_csv_rows",
           "write_export", "unidentified", "FORMATS", "CANVAS_COLUMNS", "MOODLE_COLUMNS",
           "HIDDEN_VISIBILITY", "MOODLE_MATCH"]

FORMATS = ("wide", "canvas", "moodle", "gradescope")
CANVAS_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
MOODLE_COLUMNS = ["First name", "Last name", "ID number", "Email address"]
HIDDEN_VISIBILITY = ("after_published", "hidden", "after_due_date")
MOODLE_MATCH = {"email": "email", "idnumber": "id_number"}   # what the import maps -> roster key


def write_csv_rows(rows: list[list], path: Path) -> None:
    """Write rows as UTF-8 CSV (RFC 4180 quoting; each cell by ``csv_cell``: numbers exact,
    formula-like text guarded)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        for row in rows:
            writer.writerow([csv_cell(readable(v) if isinstance(v, str) else v) for v in row])


def _table(rows: list[NotebookRow], policy: str):
    counted = counting(rows, policy)
    students = sorted({s for s, _ in counted})
    sets = sorted({s for _, s in counted})
    maxima = {s: max((r.max_points for (_, s2), r in counted.items() if s2 == s), default=0)
              for s in sets}
    return counted, students, sets, maxima


def _score(row: NotebookRow | None):
    """The score after penalty; None (a blank cell) without a notebook or when the one that
    counts could not be graded (re-grade it, or enter the grade by hand)."""
    if row is None or row.status == "ERROR":
        return None
    return row.score


def wide_rows(rows: list[NotebookRow], *, policy: str = "latest") -> list[list]:
    """``student, <set>..., total``: one row per student, each set's score after penalty."""
    counted, students, sets, _ = _table(rows, policy)
    out = [["student"] + sets + ["total"]]
    for student in students:
        scores = [_score(counted.get((student, s))) for s in sets]
        out.append([student] + scores + [round(sum(x for x in scores if x is not None), 4)])
    return out


def _identity(course: Course, student: str, fmt: str, match: str = "email") -> dict | None:
    """The identity an export writes for ``student`` (roster keys), None when the import has
    nothing to match the row on (module docstring, "Identity"): the folder name stands in only
    where the course file has no roster at all."""
    ident = dict(course.identity(student) or {})
    if fmt == "canvas":
        if not any(ident.get(k) for k in ("canvas_id", "sis_user_id", "sis_login_id")):
            if course.roster:
                return None
            ident["sis_login_id"] = student
        return ident
    key = MOODLE_MATCH[match]
    if not ident.get(key) and key == "id_number" and not course.roster:
        ident["id_number"] = student
    return ident if ident.get(key) else None


def unidentified(rows: list[NotebookRow], fmt: str, course: Course, *, policy: str = "latest",
                 match: str = "email") -> list[str]:
    """The students a Canvas or Moodle export has no identity for (sorted; [] for the other
    formats). Raises ValueError for an unknown ``match``."""
    if match not in MOODLE_MATCH:
        raise ValueError(f"match {match!r}: use one of {', '.join(MOODLE_MATCH)}")
    if fmt not in ("canvas", "moodle"):
        return []
    _, students, _, _ = _table(rows, policy)
    return [s for s in students if _identity(course, s, fmt, match) is None]


def canvas_rows(rows: list[NotebookRow], course: Course, *, policy: str = "latest") -> list[list]:
    """Canvas's gradebook import: the header, the ``Points Possible`` row, one row per student
    with an identity to match on (:func:`unidentified` lists the others)."""
    counted, students, sets, maxima = _table(rows, policy)
    titles = [f"{course.title(s)} ({course.canvas_ids[s]})" if s in course.canvas_ids
              else course.title(s) for s in sets]
    out = [CANVAS_COLUMNS + titles, ["Points Possible", "", "", "", ""] + [maxima[s] for s in sets]]
    for student in students:
        ident = _identity(course, student, "canvas")
        if ident is None:
            continue
        out.append([ident.get("name", student), ident.get("canvas_id", ""),
                    ident.get("sis_user_id", ""), ident.get("sis_login_id", ""),
                    ident.get("section", "")] + [_score(counted.get((student, s))) for s in sets])
    return out


def _names(full: str) -> tuple[str, str]:
    """(first, last) of "Last, First" or "First Last"."""
    if "," in full:
        last, first = (p.strip() for p in full.split(",", 1))
        return first, last
    parts = full.split()
    return (" ".join(parts[:-1]), parts[-1]) if len(parts) > 1 else ("", full)


def moodle_rows(rows: list[NotebookRow], course: Course, *, policy: str = "latest",
                match: str = "email") -> list[list]:
    """Moodle's CSV grade import: identity columns, then one column per set; one row per student
    with the identity the import maps on (``match``: email or idnumber; :func:`unidentified`
    lists the others)."""
    counted, students, sets, _ = _table(rows, policy)
    out = [MOODLE_COLUMNS + [course.title(s) for s in sets]]
    for student in students:
        ident = _identity(course, student, "moodle", match)
        if ident is None:
            continue
        first, last = _names(ident.get("name", ""))
        out.append([first, last, ident.get("id_number", ""), ident.get("email", "")]
                   + [_score(counted.get((student, s))) for s in sets])
    return out


def gradescope_results(row: NotebookRow, *, hidden_visibility: str = "after_published") -> dict:
    """Gradescope's ``results.json`` for one graded notebook (format in the module docstring)."""
    if hidden_visibility not in HIDDEN_VISIBILITY:
        raise ValueError(f"hidden_visibility {hidden_visibility!r}: use one of "
                         f"{', '.join(HIDDEN_VISIBILITY)}")
    if row.status == "ERROR":
        return {"score": 0.0, "output": row.error, "tests": []}
    tests = []
    for number, r in enumerate((r for r in row.results if r.status != "RETIRED"), start=1):
        public_failed = r.status != "PASS" and not r.hidden
        public = {"name": f"{r.exercise} (public cases)" if r.hidden_cases else r.exercise,
                  "number": str(number), "score": 0.0 if r.hidden_cases else float(r.points),
                  "max_score": 0.0 if r.hidden_cases else float(r.max_points),
                  "status": "failed" if public_failed else "passed",
                  "output": r.feedback if public_failed else "passed", "visibility": "visible"}
        tests.append(public)
        if r.hidden_cases:
            tests.append({
                "name": f"{r.exercise} (hidden cases)", "number": f"{number}.h",
                "score": float(r.points), "max_score": float(r.max_points),
                "status": "passed" if r.status == "PASS" else "failed",
                "output": (r.feedback if r.hidden else "passed" if r.status == "PASS"
                           else "not run: the public cases fail"),
                "visibility": hidden_visibility})
    late = f"; late penalty {row.penalty:.0%} applied" if row.penalty else ""
    return {"score": row.score,
            "output": f"{row.set_name}: {row.points} of {row.max_points} raw{late}",
            "stdout_visibility": "hidden", "tests": tests}


def write_export(rows: list[NotebookRow], fmt: str, dest: Path, course: Course | None = None, *,
                 policy: str = "latest", hidden_visibility: str = "after_published",
                 student: str | None = None, set_name: str | None = None, match: str = "email",
                 skip_unidentified: bool = False) -> list[Path]:
    """Write the export ``fmt`` (one of :data:`FORMATS`) to ``dest``; returns the files written.

    ``match`` (Moodle): the identity its import maps on, ``email`` or ``idnumber``. Canvas and
    Moodle refuse (ValueError naming them) students without that identity, or, with
    ``skip_unidentified``, leave them out (:func:`unidentified` lists them); nothing is written
    when they refuse.

    ``gradescope``: one notebook's ``results.json`` when ``dest`` ends in ``.json`` (the run that
    counts of ``student`` and ``set_name``, or the gradebook's only one), else a folder with
    ``<student>/<set>/results.json`` for each. Raises ValueError on an unknown format or an
    ambiguous Gradescope file."""
    course = course or Course()
    dest = Path(dest)
    if fmt == "gradescope":
        counted = {k: v for k, v in counting(rows, policy).items()
                   if (student is None or k[0] == student) and (set_name is None or k[1] == set_name)}
        if dest.suffix == ".json":
            if len(counted) != 1:
                raise ValueError(f"{len(counted)} notebooks match: name one with --student and "
                                 f"--set, or give a folder instead of {dest.name}")
            row, = counted.values()
            dest.write_text(json.dumps(gradescope_results(row, hidden_visibility=hidden_visibility),
                                       indent=1) + "\n", encoding="utf-8")
            return [dest]
        from txlearn.course.gradebook.pages import folders, slug
        out = []
        folder_of = folders(who for who, _ in counted)   # distinct for distinct students
        for (who, which), row in sorted(counted.items()):
            path = dest / folder_of[who] / slug(which) / "results.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(gradescope_results(row, hidden_visibility=hidden_visibility),
                                       indent=1) + "\n", encoding="utf-8")
            out.append(path)
        return out
    makers = {"wide": lambda: wide_rows(rows, policy=policy),
              "canvas": lambda: canvas_rows(rows, course, policy=policy),
              "moodle": lambda: moodle_rows(rows, course, policy=policy, match=match)}
    if fmt not in makers:
        raise ValueError(f"format {fmt!r}: use one of {', '.join(FORMATS)}")
    missing = unidentified(rows, fmt, course, policy=policy, match=match)
    if missing and not skip_unidentified:
        shown = readable(", ".join(missing[:5])) + (", ..." if len(missing) > 5 else "")
        what = ("ID, SIS User ID or SIS Login ID" if fmt == "canvas" else
                "email" if match == "email" else "ID number")
        raise ValueError(f"{fmt}: {len(missing)} student(s) have no {what} in the course file's "
                         f"roster for the import to match on ({shown}): add them to the roster, "
                         f"or pass --skip-unidentified to leave them out (listed) and enter "
                         f"their grades by hand; nothing was written")
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_csv_rows(makers[fmt](), dest)
    return [dest]
