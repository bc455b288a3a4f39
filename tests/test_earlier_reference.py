"""``txlearn grade --earlier reference``: a later set graded against the course's answers for the
earlier sets it uses, not the student's own (a set-03 mistake is not charged again in set 04);
the policy is recorded with the run and shown on the feedback page and the report."""

import shutil

import pytest

from tests.test_gradebook import notebook
from txlearn import cli
from txlearn.course import build, grading
from txlearn.course.gradebook import (Recorder, class_report, load_course, open_gradebook,
                                      write_feedback)
from txlearn.course.gradebook.report import report_page

SOLUTIONS = build.Layout().solutions
STUDENTS = build.ROOT / "exercises" / "student"
SLACK = {"cell_seconds": 120, "call_seconds": 60}


def _class(tmp_path):
    """alice: a right set 04 beside her set-03 stub; bob: a right set 04 and no set 03 at all."""
    subs = tmp_path / "subs"
    alice = notebook(SOLUTIONS / "04_positional.ipynb", subs / "alice" / "04_positional.ipynb")
    shutil.copy(STUDENTS / "03_heads.ipynb", subs / "alice" / "03_heads.ipynb")
    bob = notebook(SOLUTIONS / "04_positional.ipynb", subs / "bob" / "04_positional.ipynb")
    return [alice, bob]


def _grade(paths, db, earlier):
    with open_gradebook(db) as gb:
        recorder = Recorder(gb, load_course(None), command="test", earlier=earlier)
        # a busy machine's torch import in the setup cell: wall-time limits are not the point
        out = grading.grade(paths, jobs=2, no_sandbox=True, on_graded=recorder, earlier=earlier,
                            limits=SLACK)
        recorder.finish()
    return out


def test_reference_answers_stand_in_for_the_students_earlier_notebooks(tmp_path):
    paths, db = _class(tmp_path), tmp_path / "class.db"
    own = {s.student: s for s in _grade(paths, db, "own")}
    mine = {r.exercise: r.status for r in own["alice"].results}
    assert mine["rotary_attention"] == "FAIL"          # her set-03 stub, charged again here
    assert own["bob"].error == "not graded: needs 03_heads.ipynb beside it (this set uses " \
                               "your answers there)"
    ref = {s.student: s for s in _grade(paths, db, "reference")}
    for student in ("alice", "bob"):
        assert not ref[student].error, ref[student].error
        assert ref[student].points == ref[student].max_points > 0, \
            [(r.exercise, r.status, r.feedback) for r in ref[student].results]
    with open_gradebook(db, readonly=True) as gb:
        assert [r["earlier"] for r in gb.runs()] == ["own", "reference"]
        rows = gb.notebooks()
    assert sorted((r.student, r.earlier) for r in rows) == [
        ("alice", "own"), ("alice", "reference"), ("bob", "own"), ("bob", "reference")]
    page = write_feedback(rows, tmp_path / "feedback", generated="now")[0].read_text()
    assert "graded with the course&#x27;s reference answers for 03_heads" in page
    data = class_report(rows)
    assert data["sets"][0]["earlier"] == {"reference": 2}
    assert "the course&#x27;s reference answers: 2 student(s)" in report_page(data, plots=False)


def test_an_unknown_earlier_policy_stops_the_run_in_one_line(tmp_path, capsys):
    path = notebook(SOLUTIONS / "01_softmax.ipynb", tmp_path / "a" / "01_softmax.ipynb")
    with pytest.raises(grading.GradingError, match=r"^--earlier mine: use own or reference$"):
        grading.grade([path], no_sandbox=True, earlier="mine")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["grade", str(path), "--no-sandbox", "--earlier", "mine"])
    assert exit_.value.code == 2
    assert "argument --earlier: invalid choice: 'mine'" in capsys.readouterr().err
