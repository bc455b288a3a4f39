"""The course's CSV cells (the grader's grades.csv and the gradebook's wide, Canvas and Moodle
exports), from public reports against CSV exporters: numbers written exactly, and a formula never
reachable by a spreadsheet that splits a cell on a separator other than the comma."""

import csv
import json
import re
from pathlib import Path

from tests.test_gradebook_store import row
from txlearn.course import grading
from txlearn.course.gradebook import load_course, write_export
from txlearn.course.gradebook.exports import write_csv_rows
from txlearn.course.csv_cells import CSV_SEPARATORS
from txlearn.course.grading.reports import Result, Submission


def _read(path):
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.reader(f))


def test_numbers_are_written_exactly_and_never_guarded_as_text(tmp_path):
    """The report: numbers were written with ``:g``: 1047552 became ``1.04755e+06`` (read back
    1047550), 0.063417250592446794 became 0.0634173, and the formula guard then put an
    apostrophe before negative numbers (``'-0.5``), which a spreadsheet reads as text. Expected:
    the shortest form that reads back as the same float, and the guard only on text."""
    values = [1047552.0, 0.063417250592446794, -0.5, 3, -7, 1e-300, 2.0 ** 60]
    write_csv_rows([values, ["-0.5", "=1+1"]], tmp_path / "n.csv")
    numbers, texts = _read(tmp_path / "n.csv")
    assert [float(c) for c in numbers] == values                 # every one reads back the same
    assert numbers[:4] == ["1047552", "0.0634172505924468", "-0.5", "3"]  # 0.0634...68 == ...794
    assert texts == ["'-0.5", "'=1+1"]                            # text stays guarded
    big = row("r", "ann", 1)
    big.points, big.max_points = 1047552, 2 ** 21                  # a score past 6 digits
    write_export([big], "wide", tmp_path / "w.csv")
    assert _read(tmp_path / "w.csv")[1] == ["ann", "1047552", "1047552"]


FOLDERS = ["x;=1+1;", "y\t=2+2\t", "z|@SUM(A1)|", "w =HYPERLINK(\"u\")", "v,+cmd|' /C calc'!A0"]


def _parts(cell):
    """Every cell a spreadsheet could make of ``cell`` by splitting it on one of the separators
    its CSV import offers (comma, semicolon, tab, bar, space, a line break), trimmed."""
    return [p.strip(" \t\r\n") for sep in CSV_SEPARATORS for p in cell.split(sep)]


def test_a_formula_after_any_separator_a_spreadsheet_splits_on_is_neutralised(tmp_path):
    """The grader's fourth hardening: the formula guard looked at the first character only, so
    folders named ``x;=1+1;`` or ``y<TAB>=2+2<TAB>`` gave cells ``=1+1`` / ``=2+2`` once the file
    was split on ``;`` (Excel's separator in German, French and Dutch locales) or on tabs: in
    grades.csv, wide, Canvas and Moodle. Expected: no part of any cell, split on any separator,
    starts with a formula character."""
    subs = [Submission(path=Path(f"/s/{i}/01_softmax.ipynb"), student=n,
                       results=[Result(n, "01_softmax.ipynb", "stable_softmax", "FAIL", 0,
                                       feedback=f"got {n}\nHint: -look again")])
            for i, n in enumerate(FOLDERS)]
    grading.write_csv(subs, tmp_path / "grades.csv")
    roster = {n: {"name": f"{n} =2+3;=HYPERLINK(1)", "email": f"{i}@b;@SUM(1)",
                  "sis_login_id": n} for i, n in enumerate(FOLDERS)}   # every export writes all
    (tmp_path / "course.yaml").write_text(json.dumps({"roster": roster}) + "\n")   # JSON is YAML
    course = load_course(tmp_path / "course.yaml")
    rows = [row("r", n, i) for i, n in enumerate(FOLDERS)]
    files = [tmp_path / "grades.csv"]
    for fmt in ("wide", "canvas", "moodle"):
        files += write_export(rows, fmt, tmp_path / f"{fmt}.csv", course)
    for path in files:
        cells = [c for r in _read(path) for c in r]
        assert any("1+1" in c for c in cells)                       # the names are there
        exposed = [(c, p) for c in cells for p in _parts(c) if re.match(r"[=+@]|-[^0-9.]", p)]
        assert exposed == [], (path.name, exposed)
