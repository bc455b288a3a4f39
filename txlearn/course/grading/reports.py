"""What a grading run produces, and its reports: the :class:`Result` rows and :class:`Submission`
records, the plain-text table (:func:`table`), the CSV (:func:`write_csv`, :data:`CSV_FIELDS`)
and the JSON (:func:`write_json`).

Every piece of text a learner made (student folder names, feedback quoting their exceptions,
state-dict names) is cleaned before it is shown (one line, no escapes or control characters).
Every CSV cell (this CSV's and the gradebook's exports') is written by
:func:`txlearn.course.csv_cells.csv_cell`: numbers exactly, text never read as a formula.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from txlearn.checks import clean
from txlearn.course.csv_cells import csv_cell

__all__ = ["Result", "Submission", "results", "table", "write_csv", "write_json", "CSV_FIELDS"]


@dataclass
class Result:
    """One exercise of one notebook: the row of the table, the CSV and the JSON."""

    student: str
    notebook: str
    exercise: str
    status: str = "FAIL"   # PASS, FAIL, ERROR (not graded) or RETIRED (not counted)
    points: int = 0
    max_points: int = 1
    feedback: str = ""
    flagged: str = ""      # the answer tried to import what the set does not allow
    integrity: str = ""    # the submission's integrity notes (informational)
    kind: str = ""         # the failure's CheckFailure.kind ("" when it passed or was not run)
    hints: tuple = ()      # the failure's hint levels, as the check wrote them (for the gradebook)
    hidden: bool = False   # it failed on a hidden case
    # what only the instructor sees of a failed hidden case (its case, got vs expected, the
    # check's reason): kept in the gradebook, never in the feedback, the table, CSV or JSON
    instructor_note: str = ""


@dataclass
class Submission:
    """One graded (or not graded) notebook."""

    path: Path
    student: str
    set_name: str = ""
    error: str = ""                       # "not graded: ..." when the file could not be graded
    mode: str = ""                        # "bwrap", "plain" or "" (not started)
    results: list[Result] = field(default_factory=list)
    concepts: list[Result] = field(default_factory=list)   # its concept answers, graded as data
    integrity: list[str] = field(default_factory=list)
    output_dropped: int = 0               # bytes of printed output dropped by the caps
    digest: str = ""                      # SHA-256 of the notebook's bytes, as graded
    graded_at: str = ""                   # when its grading ended (ISO 8601, UTC)

    @property
    def points(self) -> int:
        return sum(r.points for r in self.results)

    @property
    def max_points(self) -> int:
        return sum(r.max_points for r in self.results)


def results(subs: list[Submission]) -> list[Result]:
    """Every Result row of a run, notebook by notebook."""
    return [r for s in subs for r in s.results]


def table(subs: list[Submission]) -> str:
    """A plain-text table (student, notebook, exercise, status, feedback) and a score per notebook.

    The feedback column holds the feedback's first line; its hint, when it has one, follows on a
    line of its own. A notebook that was not graded shows one ERROR row with the reason. The
    concept answers follow the exercises (rows ``concept:<id>``).
    """
    rows = [("student", "notebook", "exercise", "status", "feedback")]
    hints = {}
    for s in subs:
        shown = s.results[:1] if s.error else s.results + s.concepts
        for r in shown:
            lines = [clean(line, 300) for line in r.feedback.splitlines()]
            first = lines[0] if lines else ""
            if r.flagged:
                first = f"[{clean(r.flagged, 200)}] {first}".strip()
            rows.append((clean(r.student, 60), clean(r.notebook, 60),
                         "-" if s.error else clean(r.exercise, 60), r.status, first))
            hint = next((line for line in lines[1:] if line.startswith("Hint")), "")
            if hint:
                hints[len(rows) - 1] = hint
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    indent = " " * (sum(widths) + 2 * 4)
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4])
        if i in hints:
            lines.append(indent + hints[i])
    lines.insert(1, "-" * min(120, max(len(line) for line in lines)))
    lines.append("")
    for s in subs:
        score = "not graded" if s.error else f"{s.points}/{s.max_points}"
        lines.append(f"score {clean(s.student, 60)}/{clean(s.path.name, 60)}: {score}")
        if s.integrity:
            lines.append(f"  integrity: {clean('; '.join(s.integrity), 600)}")
    return "\n".join(lines)


CSV_FIELDS = ["student", "notebook", "exercise", "status", "points", "max_points", "feedback",
              "flagged", "integrity"]


def write_csv(subs: list[Submission], path: Path) -> None:
    """One row per exercise (ERROR rows for a notebook that was not graded); the concept answers
    are in the JSON and the gradebook."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for r in results(subs):   # learner-made text cleaned: one line each, printable UTF-8
            writer.writerow({k: csv_cell(clean(v, 2000) if k != "feedback" else
                                         "\n".join(clean(x, 2000) for x in v.splitlines()))
                             if isinstance(v, str) else csv_cell(v)
                             for k, v in asdict(r).items() if k in CSV_FIELDS})


def write_json(subs: list[Submission], path: Path) -> None:
    """The results nested per notebook, with its status, score and integrity notes."""
    data = [{"student": s.student, "notebook": s.path.name, "path": str(s.path),
             "set": s.set_name, "status": "ERROR" if s.error else "GRADED", "error": s.error,
             "points": s.points, "max_points": s.max_points, "integrity": s.integrity,
             "sandbox": s.mode,
             "exercises": [{k: v for k, v in asdict(r).items()
                            if k not in ("student", "notebook", "integrity",
                                         "instructor_note")}
                           for r in s.results],
             "concepts": [{k: v for k, v in asdict(r).items()
                           if k not in ("student", "notebook", "integrity", "instructor_note")}
                          for r in s.concepts]}
            for s in subs]
    # ensure_ascii (the default) escapes every non-ASCII character, unpaired surrogates included
    Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
