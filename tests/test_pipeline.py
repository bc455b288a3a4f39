"""The exercise pipeline: generated notebooks, release, and grading of real and tampered copies."""

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from txlearn.checks.concepts import catalogue
from txlearn.course import build, grading

ROOT = build.ROOT
SOURCES = sorted((ROOT / "exercises" / "source").glob("[0-9][0-9]_*.py"))
SOFTMAX_NO_SHIFT = "def softmax(x, axis=-1):\n    e = np.exp(x)\n    return e / e.sum(axis=axis, keepdims=True)\n"


def _digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _exercises(source):
    return build.exercise_names(build.read_source(source), source.name)


def test_course_has_exercise_sets_and_lessons():
    assert len(SOURCES) >= 1
    assert sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py")), "no lesson sources"


def test_generated_notebooks_match_their_sources_and_build_is_deterministic():
    assert build.drift() == []
    assert build.planned() == build.planned()


def test_drift_is_reported(tmp_path):
    layout = build.Layout(tmp_path)
    layout.exercise_sources.mkdir(parents=True)
    layout.lessons.mkdir()
    shutil.copy(SOURCES[0], layout.exercise_sources / SOURCES[0].name)
    assert len(build.build_course(layout)) == 2
    assert build.drift(layout) == []
    student = layout.student / f"{SOURCES[0].stem}.ipynb"
    student.write_text(student.read_text().replace("NotImplementedError", "NotImplemented"))
    (layout.notebooks / "99_orphan.ipynb").parent.mkdir(exist_ok=True)
    (layout.notebooks / "99_orphan.ipynb").write_text("{}")
    (layout.solutions / f"{SOURCES[0].stem}.ipynb").unlink()
    problems = "\n".join(build.drift(layout))
    assert f"exercises/student/{SOURCES[0].stem}.ipynb: differs" in problems
    assert f"exercises/solutions/{SOURCES[0].stem}.ipynb: missing" in problems
    assert "notebooks/99_orphan.ipynb: has no source" in problems


def test_unbalanced_solution_markers_are_a_build_error(tmp_path):
    bad = tmp_path / "exercises" / "source" / "01_bad.py"
    bad.parent.mkdir(parents=True)
    body = ('# %% tags=["answer"] exercise="x"\ndef f():\n    ### BEGIN SOLUTION\n'
            '    return 1\n\n# %% tags=["check"] exercise="x"\n'
            'from txlearn.checks import check\ncheck("x", f)\n')
    bad.write_text(body)
    with pytest.raises(build.BuildError, match="YAML header.*lacks title, minutes, objectives"):
        build.build_exercises(bad, build.Layout(tmp_path))
    header = ('# ---\n# jupyter:\n#   txlearn:\n#     title: "t"\n#     minutes: 5\n'
              '#     objectives: [o]\n# ---\n\n')
    bad.write_text(header + body)
    with pytest.raises(build.BuildError, match="never closed"):
        build.build_exercises(bad, build.Layout(tmp_path))
    bad.write_text(header.replace("#     minutes: 5\n", "#     minutes: 5\n#     limits: {cpu: 1}\n")
                   + body.replace("    ### BEGIN SOLUTION\n", ""))
    with pytest.raises(build.BuildError, match=r"unknown limits \['cpu'\]"):
        build.build_exercises(bad, build.Layout(tmp_path))
    # well formed, but no check module defines exercise "x" (the checks' one index says so)
    bad.write_text(header + body.replace("    ### BEGIN SOLUTION\n", ""))
    with pytest.raises(build.BuildError, match="no check module defines x"):
        build.build_exercises(bad, build.Layout(tmp_path))


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_student_version_holds_no_solution_and_solution_carries_passed_lines(source):
    student, solution = build.build_exercises(source)
    text = build.dumps(student)
    leaked = [line for line in build.solution_texts(source) if line in text]
    assert not leaked, f"solution text in the student notebook: {leaked}"
    assert "generated" in student.cells[0].source.lower()
    assert all(not c.get("outputs") for c in student.cells if c.cell_type == "code")
    names = _exercises(source)
    checks = [c for c in solution.cells if build.is_check(c)]
    assert [c.metadata["exercise"] for c in checks] == names
    for cell in checks:
        assert "nbval-check-output" in cell.metadata["tags"]
        assert cell.outputs[0]["text"] == f"PASSED (public cases): {cell.metadata['exercise']}\n"
        assert cell.execution_count is not None
    stubs = [c for c in student.cells if build.is_answer(c)]
    assert all("raise NotImplementedError" in c.source for c in stubs)


def test_release_writes_student_notebooks_only_and_never_overwrites(tmp_path):
    written = build.release(tmp_path / "out")
    assert sorted(p.name for p in written) == sorted(f"{s.stem}.ipynb" for s in SOURCES)
    for path in written:
        assert path.read_text() == (ROOT / "exercises" / "student" / path.name).read_text()
        assert "### BEGIN SOLUTION" not in path.read_text()
    before = {p: _digest(p) for p in written}
    with pytest.raises(FileExistsError, match="will not overwrite"):
        build.release(tmp_path / "out")
    assert before == {p: _digest(p) for p in written}


# --- grading: one run over every generated notebook and tampered copies (the sandbox, 2 jobs) ---

def _edit(src, dest, edit_cell=None, drop_checks=False, extra=None):
    nb = nbformat.read(src, as_version=4)
    for cell in nb.cells:
        if edit_cell and build.is_answer(cell) and cell.metadata["exercise"] == edit_cell[0]:
            cell.source = edit_cell[1]
    if drop_checks:
        nb.cells = [c for c in nb.cells if not build.is_check(c)]
    if extra:
        nb.cells.insert(1, nbformat.v4.new_code_cell(extra))
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)
    return dest


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grade")
    sol01 = ROOT / "exercises" / "solutions" / "01_softmax.ipynb"
    tampered = {
        "noshift": _edit(sol01, tmp / "noshift" / "01_softmax.ipynb",
                         ("stable_softmax", "import numpy as np\n" + SOFTMAX_NO_SHIFT)),
        "nochecks": _edit(sol01, tmp / "nochecks" / "01_softmax.ipynb", drop_checks=True),
        "cheat": _edit(sol01, tmp / "cheat" / "01_softmax.ipynb",
                       ("stable_softmax", "import numpy as np\n" + SOFTMAX_NO_SHIFT),
                       drop_checks=True,
                       extra="def check(name, *a):\n    print(f'PASSED (public cases): {name}')"),
        "syntax": _edit(sol01, tmp / "syntax" / "01_softmax.ipynb",
                        ("stable_softmax", "def softmax(x, axis=-1):\n    return x /")),
        "imported": _edit(sol01, tmp / "imported" / "01_softmax.ipynb",
                          ("stable_softmax", "from txlearn.softmax import softmax_np as softmax")),
    }
    junk = tmp / "junk" / "notes.ipynb"
    junk.parent.mkdir()
    junk.write_text("this is not a notebook")
    solutions = [ROOT / "exercises" / "solutions" / f"{s.stem}.ipynb" for s in SOURCES]
    students = [ROOT / "exercises" / "student" / f"{s.stem}.ipynb" for s in SOURCES]
    paths = solutions + students + list(tampered.values()) + [junk]
    digests = {p: _digest(p) for p in paths}
    subs = grading.grade(paths, jobs=2)
    return {"subs": subs, "digests": digests, "tampered": tampered, "junk": junk}


def _statuses(graded, path):
    sub = next(s for s in graded["subs"] if s.path == path)
    assert not sub.error, sub.error
    return {r.exercise: r for r in sub.results + sub.concepts}   # exercises, then concepts


def _concept_ids(stem):
    """The concept checks that close a set's notebook (its lesson's: set 12 closes with lesson
    11's), as the grader names their rows."""
    return [f"concept:{c}" for c, e in catalogue().items() if e["set"] == stem]


def test_every_solution_passes(graded):
    for source in SOURCES:
        results = _statuses(graded, ROOT / "exercises" / "solutions" / f"{source.stem}.ipynb")
        # the exercises, then the lesson's concept checks (the solutions hold the right answers)
        assert list(results) == _exercises(source) + _concept_ids(source.stem)
        failed = {n: r.feedback for n, r in results.items() if r.status != "PASS"}
        assert not failed, f"{source.stem}: {failed}"
    assert len(_concept_ids("01_softmax")) >= 3 and _concept_ids("11_backward") == []


def test_every_fresh_student_notebook_fails_as_not_implemented(graded):
    for source in SOURCES:
        results = _statuses(graded, ROOT / "exercises" / "student" / f"{source.stem}.ipynb")
        for name, r in results.items():
            assert r.status == "FAIL" and r.points == 0, (source.stem, name)
            if name.startswith("concept:"):   # an unanswered concept check says so
                assert r.kind == "concept:unanswered" and "Not answered yet" in r.feedback
            else:
                assert "not implemented" in r.feedback, (source.stem, name, r.feedback)


def test_missing_max_shift_fails_that_exercise_only_with_its_hint(graded):
    results = _statuses(graded, graded["tampered"]["noshift"])
    assert results["stable_softmax"].status == "FAIL"
    assert "what does exp() do with a logit of 1000?" in results["stable_softmax"].feedback
    assert all(r.status == "PASS" for n, r in results.items() if n != "stable_softmax")


def test_deleted_or_faked_check_cells_change_nothing(graded):
    pristine = _statuses(graded, ROOT / "exercises" / "solutions" / "01_softmax.ipynb")
    without = _statuses(graded, graded["tampered"]["nochecks"])
    assert {n: r.status for n, r in without.items()} == {n: r.status for n, r in pristine.items()}
    assert "check cell of stable_softmax removed" in without["stable_softmax"].integrity
    cheat = _statuses(graded, graded["tampered"]["cheat"])
    assert cheat["stable_softmax"].status == "FAIL"


def test_syntax_error_is_named_with_its_line(graded):
    results = _statuses(graded, graded["tampered"]["syntax"])
    assert results["stable_softmax"].status == "FAIL"
    assert results["stable_softmax"].feedback.startswith("SyntaxError in your answer cell, line 2")
    assert all(r.status == "PASS" for n, r in results.items() if n != "stable_softmax")


def test_importing_the_package_answer_is_refused_and_flagged(graded):
    results = _statuses(graded, graded["tampered"]["imported"])
    assert results["stable_softmax"].status == "FAIL"
    assert results["stable_softmax"].flagged == "tried to import txlearn.softmax"
    assert "banned import attempted: txlearn.softmax" in results["stable_softmax"].integrity
    assert not any(r.flagged for n, r in results.items() if n != "stable_softmax")


def test_bad_file_is_an_error_row_and_originals_are_untouched(graded):
    sub = next(s for s in graded["subs"] if s.path == graded["junk"])
    assert sub.error.startswith("not graded: not a readable notebook") and "\n" not in sub.error
    assert [r.status for r in sub.results] == ["ERROR"]
    for path, digest in graded["digests"].items():
        assert _digest(path) == digest, f"grading modified {path}"


def test_reports_table_csv_json(graded, tmp_path):
    import csv
    import json
    subs = graded["subs"]
    text = grading.table(subs)
    assert "score noshift/01_softmax.ipynb: 3/4" in text
    assert "score junk/notes.ipynb: not graded" in text
    assert "\n" + " " * 20 in text and "Hint" in text  # hints on lines of their own
    grading.write_csv(subs, tmp_path / "g.csv")
    rows = list(csv.DictReader(open(tmp_path / "g.csv")))
    assert list(rows[0]) == grading.CSV_FIELDS
    assert len(rows) == sum(len(s.results) for s in subs)
    grading.write_json(subs, tmp_path / "g.json")
    data = json.loads((tmp_path / "g.json").read_text())
    assert data[0]["exercises"][0]["status"] == "PASS" and data[0]["sandbox"] == "bwrap"
    assert data[-1]["status"] == "ERROR" and data[-1]["error"].startswith("not graded")


def test_cli_grade_help_describes_the_sandboxed_grader():
    exe = [sys.executable, "-m", "txlearn.cli"]
    help_text = subprocess.run(exe + ["grade", "--help"], capture_output=True, text=True).stdout
    for words in ("bubblewrap", "--no-sandbox", "--jobs", "--set", "--hidden", "ERROR",
                  "never runs a submission's code"):
        assert words in help_text, words


def test_hidden_cases_are_added_to_the_same_check(tmp_path):
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "softmax.py").write_text(
        "from txlearn.checks import CheckFailure\n"
        "def stable_softmax(softmax):\n"
        "    raise CheckFailure(\"case 'instructor': always fails\")\n")
    subs = grading.grade([ROOT / "exercises" / "solutions" / "01_softmax.ipynb"], hidden=hidden)
    results = {r.exercise: r for r in subs[0].results}
    assert results["stable_softmax"].status == "FAIL"
    assert results["stable_softmax"].feedback.startswith("failed a hidden case")
    assert all(r.status == "PASS" for n, r in results.items() if n != "stable_softmax")


# --- the student notebooks in a kernel: every check says "not implemented yet" ------------------

@pytest.fixture(scope="module")
def stub_outputs(tmp_path_factory):
    """Every student notebook's cells, in course order, executed in ONE kernel (the folder of
    the student notebooks as its working directory, so sets that use earlier sets find them)."""
    import nbclient
    nb = nbformat.v4.new_notebook()
    labels = []
    for source in SOURCES:
        student = nbformat.read(ROOT / "exercises" / "student" / f"{source.stem}.ipynb",
                                as_version=4)
        for cell in student.cells:
            if cell.cell_type == "code":
                nb.cells.append(nbformat.v4.new_code_cell(cell.source))
                labels.append(cell.metadata.get("exercise") if build.is_check(cell) else None)
    client = nbclient.NotebookClient(nb, kernel_name="python3", allow_errors=True, timeout=300,
                                     resources={"metadata": {"path": str(ROOT / "exercises" /
                                                                         "student")}})
    client.execute()
    return [(label, cell) for label, cell in zip(labels, nb.cells) if label]


def test_every_stub_check_fails_with_not_implemented_in_eight_lines(stub_outputs):
    import re
    ansi = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
    names = [n for s in SOURCES for n in _exercises(s)]
    assert [label for label, _ in stub_outputs] == names
    for label, cell in stub_outputs:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert errors, f"{label}: the check of a stub did not fail"
        text = "\n".join(ansi.sub("", line) for o in errors for line in o.traceback)
        assert len(text.splitlines()) <= 8, f"{label}:\n{text}"
        assert "not implemented yet" in text, f"{label}:\n{text}"


def test_build_and_grade_commands_do_not_import_torch():
    code = ("import sys\nfrom txlearn.cli import main\n"
            "assert main(['build', '--check']) == 0\n"
            "assert 'torch' not in sys.modules, 'txlearn build imported torch'\n"
            "assert sys.modules.get('rfc3987_syntax') is None, 'its parser was built'\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
