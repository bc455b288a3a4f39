"""Concept answers graded as data: the grader reads a notebook's answer cells without running them
(right, wrong, malformed, code, missing, the first attempt a reveal cell recorded), the gradebook
records each answer with the course file's weight, the class report counts who chose each option
and names its misconception, and `txlearn update-work` brings new checks into a copy without
touching its answers."""

import copy
import hashlib
import json

import nbformat
import pytest

from txlearn.checks.concepts import ATTEMPT_MIME, catalogue
from txlearn.course import build, update
from txlearn.course.gradebook.concept_report import concept_section, concept_summary
from txlearn.course.gradebook.course import Course, CourseFileError, load_course
from txlearn.course.gradebook.record import Recorder
from txlearn.course.gradebook.report import class_report, report_page
from txlearn.course.gradebook.store import open_gradebook
from txlearn.course.grading.concept_answers import MISSING, concept_results
from txlearn.course.grading.reports import Result, Submission
from txlearn.course.grading.sets import load_set
from txlearn.course.grading.submission import plan

ROOT = build.ROOT
STUDENT = ROOT / "exercises" / "student" / "01_softmax.ipynb"
IDS = [c for c, e in catalogue().items() if e["lesson"] == "01_softmax"]


def _answered(answers: dict, reveals: dict | None = None, drop=()) -> dict:
    """Set 01's student notebook as JSON, with these answer-cell texts (by check id), these
    recorded first attempts in the reveal cells' outputs, and these checks' cells deleted."""
    nb = json.loads(STUDENT.read_text(encoding="utf-8"))
    cells = []
    for cell in nb["cells"]:
        check = cell.get("metadata", {}).get("concept")
        if check in drop:
            continue
        tags = cell["metadata"].get("tags", [])
        if check in answers and "concept-answer" in tags:
            cell["source"] = answers[check]
        if reveals and check in reveals and "concept-reveal" in tags:
            cell["outputs"] = [{"output_type": "display_data", "metadata": {},
                                "data": {"text/plain": "...", ATTEMPT_MIME: reveals[check]}}]
        cells.append(cell)
    nb["cells"] = cells
    return nb


def _rows(nb):
    return {r.exercise.removeprefix("concept:"): r for r in concept_results(nb, "01_softmax",
                                                                             "ann", "01.ipynb")}


def test_the_grader_grades_each_answer_as_data():
    nb = _answered({
        "01.var-growth": 'answer_var_growth = "b"   # my answer',
        "01.std-at-64": "answer_std_at_64 = 64",
        "01.saturation": 'answer_saturation = __import__("os").system("touch /tmp/owned")',
        "01.overflow-start": 'answer_overflow_start = "89"',
    }, drop=("01.gradient-at-64",))
    rows = _rows(nb)
    assert list(rows) == IDS                                      # every check of lesson 01
    assert (rows["01.var-growth"].status, rows["01.var-growth"].kind) == ("PASS", "concept:b")
    std = rows["01.std-at-64"]
    assert (std.status, std.kind, std.hints) == ("FAIL", "concept:64",
                                                ("Variance given for the standard deviation",))
    assert "64 is the variance" in std.feedback and std.max_points == 0
    code = rows["01.saturation"]
    assert code.kind == "concept:malformed" and "not an expression or code" in code.feedback
    string = rows["01.overflow-start"]
    assert string.kind == "concept:malformed" and "expects a number" in string.feedback
    assert rows["01.gradient-at-64"].kind == "concept:missing"
    assert rows["01.gradient-at-64"].feedback == MISSING
    assert all("\n" not in r.feedback for r in rows.values())       # one line each


def test_the_first_recorded_attempt_counts_and_junk_records_are_ignored():
    nb = _answered({"01.var-growth": 'answer_var_growth = "b"',          # changed afterwards
                    "01.std-at-64": "answer_std_at_64 = 8",
                    "01.saturation": "answer_saturation = (",             # broken afterwards
                    "01.overflow-start": "answer_overflow_start = 89"},
                   reveals={"01.var-growth": {"check": "01.var-growth", "first": "c"},
                            "01.std-at-64": {"check": "01.var-growth", "first": 64},   # not its own
                            "01.saturation": {"check": "01.saturation", "first": "a"},
                            "01.overflow-start": {"check": "01.overflow-start",
                                                  "first": ["x"] * 1000}})           # not a value
    rows = _rows(nb)
    first = rows["01.var-growth"]
    assert (first.status, first.kind) == ("FAIL", "concept:c")
    assert "your first answer, 'c', counts; the cell now holds 'b'" in first.feedback
    assert rows["01.std-at-64"].status == "PASS"                 # a record of another check
    assert rows["01.saturation"].status == "PASS" and "something malformed" in \
        rows["01.saturation"].feedback
    assert rows["01.overflow-start"].status == "PASS"


def test_the_runner_never_gets_a_concept_cell():
    cs = load_set(ROOT / "exercises" / "source" / "01_softmax.py")
    assert not [cid for cid, _, _ in cs.course_cells if cid.startswith("concept-")]
    nb = _answered({"01.var-growth": "import os\nos.system('touch /tmp/owned')"})
    cells, present, notes, _ = plan(nb, cs)
    assert all("os.system" not in c.source for c in cells)
    assert notes == [] and present == set(cs.names)


def _submission(tmp_path, student, answers):
    """A graded Submission of set 01 (its code rows made up, its concept rows graded)."""
    path = tmp_path / student / "01_softmax.ipynb"
    path.parent.mkdir()
    nb = _answered(answers)
    path.write_text(json.dumps(nb), encoding="utf-8")
    sub = Submission(path=path, student=student, set_name="01_softmax", mode="plain",
                     digest=hashlib.sha256(path.read_bytes()).hexdigest(),
                     graded_at="2026-01-01T00:00:00Z")
    sub.results = [Result(student, path.name, "stable_softmax", status="PASS", points=1)]
    sub.concepts = concept_results(nb, "01_softmax", student, path.name)
    return sub


def test_the_gradebook_records_each_answer_and_the_report_counts_them(tmp_path):
    subs = [_submission(tmp_path, "ann", {"01.var-growth": 'answer_var_growth = "a"'}),
            _submission(tmp_path, "ben", {"01.var-growth": 'answer_var_growth = "a"',
                                          "01.std-at-64": "answer_std_at_64 = 8"}),
            _submission(tmp_path, "cy", {"01.var-growth": 'answer_var_growth = "b"',
                                         "01.std-at-64": 'answer_std_at_64 = "8"'})]
    with open_gradebook(tmp_path / "class.db") as gb:
        recorder = Recorder(gb, Course(concept_points=2), command="test")
        for sub in subs:
            recorder(sub)
        recorder.finish()
        rows = gb.notebooks()
    ben = next(r for r in rows if r.student == "ben")
    concept = {r.exercise: r for r in ben.results if r.exercise.startswith("concept:")}
    std = concept["concept:01.std-at-64"]
    assert (std.points, std.max_points) == (2, 2)
    assert concept["concept:01.var-growth"].mistake == "concept:01.var-growth=a"
    assert (ben.points, ben.max_points) == (1 + 2, 1 + 2 * len(IDS))   # the course file's weight
    assert ben.answers["concept:01.std-at-64"] == "answer_std_at_64 = 8"
    assert ben.answers["concept:01.var-growth"] == 'answer_var_growth = "a"'

    summary = {c["check"]: c for c in concept_summary(rows, "01_softmax")}
    growth = summary["01.var-growth"]
    assert (growth["students"], growth["right"]) == (3, 1)
    chose = {c["choice"]: (c["students"], c["misconception"]) for c in growth["choices"]}
    assert chose == {"a": (2, "Standard deviation taken for variance"), "b": (1, "(right)")}
    std = {c["choice"]: c["students"] for c in summary["01.std-at-64"]["choices"]}
    assert std == {"right": 1, "malformed": 1, "unanswered": 1}

    data = class_report(rows)
    report, = data["sets"]
    assert [e["exercise"] for e in report["exercises"]] == ["stable_softmax"]   # code apart
    assert report["concepts"] == concept_summary(rows, "01_softmax")
    page = report_page(data, plots=False)
    assert "Concept checks: what the class believes" in page
    assert "Standard deviation taken for variance" in page and "(1 of 3 right)" in page
    assert concept_section([]) == ""


def test_the_graders_table_and_json_show_the_concept_answers_after_the_exercises(tmp_path):
    from txlearn.course.grading.reports import table, write_json
    sub = _submission(tmp_path, "dee", {"01.var-growth": 'answer_var_growth = "c"'})
    text = table([sub])
    assert text.index("stable_softmax") < text.index("concept:01.var-growth")
    assert "Variance of a dot product taken as quadratic" in text
    assert "score dee/01_softmax.ipynb: 1/1" in text           # 0 points in the grader's table
    write_json([sub], tmp_path / "g.json")
    data, = json.loads((tmp_path / "g.json").read_text())
    assert [c["exercise"] for c in data["concepts"]] == [f"concept:{c}" for c in IDS]
    assert data["concepts"][0]["kind"] == "concept:c" and data["points"] == 1


def test_the_course_file_weights_concepts_or_leaves_them_ungraded(tmp_path):
    course = tmp_path / "course.yaml"
    assert load_course(None).concept_points == 0
    course.write_text("concepts: {points: 3}\n")
    assert load_course(course).concept_points == 3
    for bad, says in (("concepts: {points: 1.5}", "whole number"),
                      ("concepts: {weight: 1}", "unknown key 'weight'"),
                      ("concepts: {points: -1}", "not a number from 0")):
        course.write_text(bad + "\n")
        with pytest.raises(CourseFileError, match=says):
            load_course(course)


def test_update_work_adds_new_checks_and_keeps_every_concept_answer(tmp_path):
    course = nbformat.read(STUDENT, as_version=4)
    old = copy.deepcopy(course)
    dropped = "concept-01-std-at-64"
    old.cells = [c for c in old.cells if not c.get("id", "").startswith(dropped)]
    for cell in old.cells:
        if cell.get("id") == "concept-01-var-growth-answer":
            cell.source = 'answer_var_growth = "c"  # mine'
        if cell.get("id") == "concept-01-var-growth-question":
            cell.source = "an older wording of the question"
    work = tmp_path / "work"
    work.mkdir()
    nbformat.write(old, work / STUDENT.name)

    done = [u for u in update.update_work(work) if u.path.name == STUDENT.name]
    assert done and done[0].concepts == ["01.std-at-64"] and done[0].added == []
    merged = nbformat.read(work / STUDENT.name, as_version=4)
    by_id = {c.get("id"): c for c in merged.cells}
    assert by_id["concept-01-var-growth-answer"].source == 'answer_var_growth = "c"  # mine'
    assert by_id["concept-01-var-growth-question"].source == \
        next(c for c in course.cells if c.get("id") == "concept-01-var-growth-question").source
    ids = [c.get("id") for c in merged.cells]
    assert ids == [c.get("id") for c in course.cells]                # in the course's order
    assert [u for u in update.update_work(work) if u.path.name == STUDENT.name] == []
