"""Hidden cases explained to the instructor: ``txlearn try-hidden`` runs them on the course's
solutions and names each failure (case, got vs expected, the check's reason); grading a student
records that reason in the gradebook for the instructor while the student's feedback still says
only "failed a hidden case"; a gradebook of the schema before that column still reads."""

import sqlite3
from pathlib import Path

from tests.test_gradebook import notebook
from tests.test_gradebook_store import row
from txlearn import cli
from txlearn.course import build, grading
from txlearn.course.gradebook import (SCHEMA_VERSION, Recorder, load_course, open_gradebook,
                                      write_feedback)
from txlearn.course.grading import grade_one
from txlearn.course.grading.hidden_trial import explain, sets_with_hidden_cases, try_hidden

SOLUTION = build.ROOT / "exercises" / "solutions" / "01_softmax.ipynb"
# ties: softmax of three equal logits is 1/3 each; this case expects 0.5 at index 0 (a wrong
# expected value, the instructor's mistake), so the solution's 0.333333 differs there
WRONG_CASE = (
    "import numpy as np\n"
    "from txlearn.checks import call, expect_close\n"
    "def stable_softmax(softmax):\n"
    "    got = call(softmax, np.array([[7.25, 7.25, 7.25]]), case='ties of 7.25')\n"
    "    expect_close(got, [[0.5, 0.25, 0.25]], case='ties of 7.25',\n"
    "                 hint='equal logits get equal probabilities')\n"
    "def scaled_scores(scaled_scores):\n"
    "    Q = np.eye(2)\n"
    "    expect_close(call(scaled_scores, Q, Q, case='eye'), Q / np.sqrt(2), case='eye')\n")


def _hidden(tmp_path: Path) -> Path:
    folder = tmp_path / "hidden"
    folder.mkdir()
    (folder / "softmax.py").write_text(WRONG_CASE)
    return folder


def test_sets_with_hidden_cases_are_found_from_the_folders_functions(tmp_path):
    assert sets_with_hidden_cases(_hidden(tmp_path)) == {
        "01_softmax": ["stable_softmax", "scaled_scores"]}


def test_try_hidden_explains_the_case_the_solution_fails(tmp_path):
    hidden = _hidden(tmp_path)
    trials = {t.exercise: t for t in try_hidden(hidden)}
    assert trials["scaled_scores"].outcome == "pass"
    bad = trials["stable_softmax"]
    assert bad.outcome == "hidden"
    # the hidden check's own failure: its case, the first differing index, got vs expected
    assert "case 'ties of 7.25'" in bad.reason
    assert "0.5" in bad.reason and "0.33333" in bad.reason, bad.reason
    assert "equal logits get equal probabilities" in bad.reason
    out = explain(list(trials.values()))   # what txlearn try-hidden prints (exit status 1)
    assert "01_softmax / stable_softmax: the solution FAILS a hidden case" in out
    assert "case 'ties of 7.25'" in out
    assert "01_softmax / scaled_scores: the solution passes its hidden cases" in out
    assert out.rstrip().endswith("2 exercise(s) with hidden cases; 1 need(s) your attention")


def test_try_hidden_refuses_a_set_without_hidden_cases_in_one_line(tmp_path, capsys):
    assert cli.main(["try-hidden", str(_hidden(tmp_path)), "--set", "02_attention"]) == 2
    err = capsys.readouterr().err
    assert err == (f"txlearn: error: --set 02_attention: {tmp_path / 'hidden'} has no hidden "
                   f"case for that set\n")


def test_the_instructors_reason_is_recorded_and_the_student_sees_only_the_fixed_text(tmp_path):
    hidden = _hidden(tmp_path)
    path = notebook(SOLUTION, tmp_path / "subs" / "alice" / "01_softmax.ipynb")
    db = tmp_path / "class.db"
    with open_gradebook(db) as gb:
        recorder = Recorder(gb, load_course(None), hidden=hidden, command="test")
        sub, = grading.grade([path], hidden, jobs=1, no_sandbox=True, on_graded=recorder)
        recorder.finish()
    r = {r.exercise: r for r in sub.results}["stable_softmax"]
    assert (r.status, r.feedback, r.hidden) == ("FAIL", grade_one.HIDDEN_FAILED, True)
    assert "case 'ties of 7.25'" in r.instructor_note and "0.5" in r.instructor_note
    out = tmp_path / "out.json"
    grading.write_json([sub], out)
    assert "ties of 7.25" not in out.read_text()          # the grader's JSON: not there
    with open_gradebook(db, readonly=True) as gb:
        rows = gb.notebooks()
    stored = {x.exercise: x for x in rows[0].results}
    assert stored["stable_softmax"].instructor_note == r.instructor_note
    assert stored["stable_softmax"].feedback == grade_one.HIDDEN_FAILED
    assert stored["scaled_scores"].instructor_note == ""   # passed: nothing to explain
    page, = write_feedback(rows, tmp_path / "feedback", generated="now")
    text = page.read_text()
    assert "ties of 7.25" not in text and "0.25" not in text
    assert "failed a hidden case" in text


def test_a_gradebook_of_the_first_schema_reads_and_migrates(tmp_path):
    db = tmp_path / "old.db"
    with open_gradebook(db) as gb:
        run = gb.start_run(command="test", started_at="2026-10-02T10:00:00Z", version="0")
        gb.add_notebook(row(run, "s0", 0))
    conn = sqlite3.connect(db)   # as version 1 wrote it: no instructor_note, no runs.earlier
    conn.execute("ALTER TABLE results DROP COLUMN instructor_note")
    conn.execute("ALTER TABLE runs DROP COLUMN earlier")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    with open_gradebook(db, readonly=True) as gb:    # a report: read as it is, the note blank
        assert [r.instructor_note for r in gb.notebooks()[0].results] == [""] * 4
        assert gb.notebooks()[0].earlier == "" and gb.runs()[0]["earlier"] == ""
    with open_gradebook(db) as gb:                   # grading: migrated to the new schema
        assert gb.read("PRAGMA user_version") == [(SCHEMA_VERSION,)] == [(3,)]
        assert "instructor_note" in {c[1] for c in gb.read("PRAGMA table_info(results)")}
        assert "earlier" in {c[1] for c in gb.read("PRAGMA table_info(runs)")}
