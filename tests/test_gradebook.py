"""The gradebook on a small class of lesson 01 graded for real (the sandbox, hidden cases, a
course file with a deadline, an extension and a manifest), then read back: every row recorded
with its mistake identifier, re-grading keeping the history, lateness and penalty kept apart,
feedback pages that never show a hidden input or a solution line (and a student's <script>
inert in Chromium), the class report's counts against the gradebook's own rows, the exports
parsed back with their documented column layouts, and the commands' one-line errors."""

import csv
import hashlib
import importlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from tests.test_book import CHROMIUM_ARGS, chromium_path
from txlearn.checks import run_exercise
from txlearn.course import build, grading
from txlearn.course.gradebook import (Recorder, class_report, load_course, mistake_id,
                                      open_gradebook, write_export, write_feedback, write_report)
from txlearn.course.gradebook.exports import CANVAS_COLUMNS, MOODLE_COLUMNS

ROOT = build.ROOT
STUDENT = ROOT / "exercises" / "student" / "01_softmax.ipynb"
SOLUTION = ROOT / "exercises" / "solutions" / "01_softmax.ipynb"
SECRET = "HIDDEN-INPUT-SECRET-5e3a"
HIDDEN_VALUE = 7.3125          # the hidden case's input; no page or export may show it
NO_SHIFT = ("import numpy as np\n"
            "def softmax(x, axis=-1):\n    e = np.exp(x)\n"
            "    return e / e.sum(axis=axis, keepdims=True)\n")
SCRIPT = "<script>window.__pwned = 1</script>"
# right on every public case, raises on the hidden one with its input in the message; written
# unlike the course's solution (no solution line), with a <script> in a comment
EVE = ("import numpy as np\n"
       f"# {SCRIPT} <img src=x onerror=\"window.__pwned = 2\">\n"
       "def softmax(x, axis=-1):\n"
       "    if x.ndim == 2 and x.shape[1] == 3 and np.all(x == x.flat[0]) and x.flat[0] > 7:\n"
       "        raise ValueError('leak ' + repr(x.tolist()))\n"
       "    top = np.max(x, axis=axis, keepdims=True)\n"
       "    w = np.exp(x - top)\n"
       "    return w / np.sum(w, axis=axis, keepdims=True)\n")
EVE_SCORES = ("def scaled_scores(Q, K):\n"
              f"    raise ValueError({SCRIPT!r})\n")
COURSE = """\
timezone: Europe/Berlin
policy: latest
penalty: {per_day: 0.1, max: 0.5, grace_minutes: 10}
sets:
  01_softmax: {deadline: "2026-10-05 23:59", title: Softmax, canvas_id: 4711}
extensions:
  bob: {01_softmax: 3 days}
roster:
  alice: {name: "Liddell, Alice", email: alice@uni.example, id_number: "1001", canvas_id: 5512,
          sis_user_id: S1001, sis_login_id: aliddell, section: A}
"""
# alice 30 hours late (two days or part of one: 20%), bob 30 hours late with 3 days' extension
MANIFEST = ("student,set,submitted_at\n"
            "alice,01_softmax,2026-10-07T05:59:00+02:00\n"
            "bob,01_softmax,2026-10-07T05:59:00+02:00\n")


ON_TIME = 1791194400.0         # 2026-10-05T10:00:00Z, the deadline's morning


def notebook(src: Path, dest: Path, answers: dict | None = None) -> Path:
    nb = json.loads(src.read_text())
    for cell in nb["cells"]:
        name = cell.get("metadata", {}).get("exercise")
        if "answer" in cell.get("metadata", {}).get("tags", []) and name in (answers or {}):
            cell["source"] = answers[name]
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(nb))
    return dest


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Five students graded into class.db with hidden cases, then bob re-submits a fix and is
    graded again: two runs, six notebooks."""
    tmp = tmp_path_factory.mktemp("class")
    subs = tmp / "submissions"
    hidden = tmp / "hidden"
    hidden.mkdir()
    (hidden / "softmax.py").write_text(
        "import numpy as np\n"
        "from txlearn.checks import call, expect_close\n"
        f"_SECRET = {SECRET!r}\n"
        "def stable_softmax(softmax):\n"
        f"    got = call(softmax, np.array([[{HIDDEN_VALUE}] * 3]), case='ties',\n"
        "               hint='equal logits get equal probabilities')\n"
        "    expect_close(got, [[1 / 3] * 3], case='ties')\n")
    paths = [notebook(SOLUTION, subs / "alice" / "01_softmax.ipynb"),
             notebook(SOLUTION, subs / "bob" / "01_softmax.ipynb",
                      answers={"stable_softmax": NO_SHIFT}),
             notebook(STUDENT, subs / "carol" / "01_softmax.ipynb"),
             notebook(STUDENT, subs / "eve" / "01_softmax.ipynb",
                      answers={"stable_softmax": EVE, "scaled_scores": EVE_SCORES}),
             notebook(SOLUTION, subs / "frank" / "01_softmax.ipynb")]
    for path in paths[2:]:      # not in the manifest: submitted (modified) the day before
        os.utime(path, (ON_TIME, ON_TIME))
    (subs / "course.yaml").write_text(COURSE)
    (subs / "manifest.csv").write_text(MANIFEST)
    course = load_course(subs / "course.yaml")
    db = tmp / "class.db"
    runs = []
    for batch in (paths, "bob's fix"):
        if batch == "bob's fix":   # written once the first run is graded
            batch = [notebook(SOLUTION, subs / "bob" / "01_softmax.ipynb")]
        with open_gradebook(db) as gb:
            recorder = Recorder(gb, course, hidden=hidden, command="test")
            out = grading.grade(batch, hidden, jobs=2, on_graded=recorder)
            recorder.finish()
            runs.append(out)
    with open_gradebook(db, readonly=True) as gb:
        rows = gb.notebooks()
    return {"tmp": tmp, "db": db, "rows": rows, "subs": runs, "course": course, "paths": paths,
            "hidden": hidden}


@pytest.fixture(scope="module")
def written(graded):
    """The feedback pages and the class report of the graded class, written once."""
    out = graded["tmp"] / "pages"
    pages = write_feedback(graded["rows"], out, generated="now")
    data = write_report(graded["rows"], out / "report.html", generated="now", source="class.db")
    return {"out": out, "pages": pages, "report": data}


def by_student(rows, student):
    return [r for r in rows if r.student == student]


def test_every_graded_notebook_is_recorded_with_its_rows(graded):
    rows = graded["rows"]
    assert len(rows) == 6 and len({r.run_uuid for r in rows}) == 2
    for sub in graded["subs"][0]:
        row, = [r for r in rows if r.student == sub.student and r.digest == sub.digest]
        assert [(r.exercise, r.status, r.points) for r in row.results] == \
            [(r.exercise, r.status, r.points) for r in sub.results + sub.concepts]
        assert row.points == sub.points and row.max_points == 4 and row.graded_at
    eve, = by_student(rows, "eve")
    assert eve.digest == hashlib.sha256(graded["paths"][3].read_bytes()).hexdigest()
    assert eve.answers["stable_softmax"] == EVE
    results = {r.exercise: r for r in eve.results}
    assert results["stable_softmax"].hidden and results["stable_softmax"].hidden_cases
    assert results["stable_softmax"].mistake.startswith("softmax.hidden-")
    # the grader's own output names the failure as hidden, and shows none of the case's values
    eve_sub, = [s for s in graded["subs"][0] if s.student == "eve"]
    table = grading.table([eve_sub])
    # one fixed text whatever eve's code did there (issue 25): no case name, no exception
    assert "failed a hidden case" in table and "hidden: ties" not in table
    assert "your code raised an exception" not in table and str(HIDDEN_VALUE) not in table
    assert results["scaled_scores"].kind == "raised" and not results["scaled_scores"].hidden
    assert [r.mistake for r in by_student(rows, "carol")[0].results
            if not r.exercise.startswith("concept:")] == ["stub"] * 4
    first_bob = by_student(rows, "bob")[0]
    assert first_bob.results[0].mistake == "softmax.HINT_NO_SHIFT"
    assert first_bob.results[0].hint.startswith("what does exp() do with a logit of 1000")


def test_regrading_keeps_the_history_and_the_policy_says_which_run_counts(graded):
    from txlearn.course.gradebook import counting

    bob = by_student(graded["rows"], "bob")
    assert [r.points for r in bob] == [3, 4] and bob[0].digest != bob[1].digest
    assert counting(graded["rows"], "latest")[("bob", "01_softmax")].uuid == bob[1].uuid
    assert counting(graded["rows"], "best")[("bob", "01_softmax")].uuid == bob[1].uuid
    with sqlite3.connect(graded["db"]) as conn:   # nothing was overwritten: both runs' rows
        assert conn.execute("SELECT count(*) FROM notebooks WHERE student = 'bob'").fetchone() \
            == (2,)
        assert conn.execute("SELECT count(*) FROM results WHERE exercise NOT LIKE 'concept:%'"
                            ).fetchone() == (24,)
        # and each notebook's five concept answers of lesson 01: right in the four copies of the
        # solutions (alice, bob twice, frank), unanswered in the two of the handout (carol, eve)
        concept = dict(conn.execute("SELECT status, count(*) FROM results WHERE exercise LIKE "
                                    "'concept:%' GROUP BY status").fetchall())
        assert concept == {"PASS": 4 * 5, "FAIL": 2 * 5}


def test_lateness_and_penalty_are_kept_apart_from_the_raw_score(graded):
    rows = {r.student: r for r in graded["rows"]}
    alice, bob, frank = rows["alice"], by_student(graded["rows"], "bob")[1], rows["frank"]
    # deadline 2026-10-05 23:59 Berlin = 21:59 UTC; submitted 2026-10-07 05:59 Berlin: 30 h late
    assert (alice.deadline, alice.submitted_at, alice.submitted_from) == \
        ("2026-10-05T21:59:00Z", "2026-10-07T03:59:00Z", "manifest")
    assert alice.late_seconds == 30 * 3600 and alice.penalty == pytest.approx(0.2)
    assert (alice.points, alice.score) == (4, pytest.approx(3.2))
    assert bob.deadline == "2026-10-08T21:59:00Z" and bob.late_seconds == 0 and bob.penalty == 0
    assert (frank.submitted_from, frank.submitted_at) == ("mtime", "2026-10-05T10:00:00Z")
    assert frank.late_seconds == 0 and frank.score == 4   # not in the manifest: the file's time


def test_mistake_identifiers_name_the_check_modules_constants(graded):
    """Catalogued mistakes of three check modules get ``module.CONSTANT`` (the constant holds
    exactly the hint that fired); an inline hint the digest of its first level."""
    warnings.simplefilter("ignore")
    cases = [("softmax", "stable_softmax", "no max shift", "softmax.HINT_NO_SHIFT"),
             ("softmax", "softmax_jacobian", "no diagonal term", "softmax.HINT_NO_DIAG"),
             ("softmax", "stable_softmax", "modifies its input in place", "changed-input"),
             ("softmax", "stable_softmax", "wrong axis (always last)", None),
             ("attention", "causal_mask", None, None), ("heads", "split_heads", None, None)]
    for stem, exercise, label, expected in cases:
        catalogue = importlib.import_module(f"tests.catalogue.{stem}")
        wrong = [w for w in catalogue.WRONG[exercise] if label in (None, w[0])][0]
        failure = run_exercise(exercise, wrong[1], {}).failure
        found = mistake_id(exercise, failure.kind, failure.hints)
        if expected is not None:
            assert found == expected, (label, found)
        if found == "changed-input":
            continue
        module = importlib.import_module(f"txlearn.checks.{stem}")
        assert found.startswith(f"{stem}.")
        name = found.split(".", 1)[1]
        if name.startswith("hint-"):
            digest = hashlib.sha256(failure.hints[0].encode()).hexdigest()[:8]
            assert name == f"hint-{digest}"
        else:
            value = eval(name, vars(module))      # NAME or NAME[key]
            assert ((value,) if isinstance(value, str) else tuple(value)) == failure.hints
    assert mistake_id("stable_softmax", "stub", ()) == "stub"
    assert mistake_id("stable_softmax", "", (), status="PASS") == ""


def test_feedback_pages_never_hold_a_hidden_input_or_a_solution_line(written):
    out, pages = written["out"], written["pages"]
    assert sorted(p.relative_to(out).as_posix() for p in pages) == \
        [f"{s}/01_softmax.html" for s in ("alice", "bob", "carol", "eve", "frank")]
    solution = build.solution_texts(build.find_source("01_softmax"))
    for page in pages:
        text = page.read_text()
        assert SECRET not in text and str(HIDDEN_VALUE) not in text and "7.31" not in text
        assert "<script" not in text.lower() and "<img" not in text.lower()
        if page.parent.name in ("carol", "eve"):          # answers that are not the course's
            leaked = [line for line in solution if line in text]
            assert leaked == [], (page, leaked)
    eve = (out / "eve" / "01_softmax.html").read_text()
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in eve
    assert "hidden case" in eve   # one fixed text: not how eve's code failed there (issue 25)
    assert '"PASSED (public cases)" in your notebook means the public cases passed' in eve
    alice = (out / "alice" / "01_softmax.html").read_text()
    assert "1 day 6 h late" in alice and "20% of the raw score" in alice and "3.2 / 4" in alice


def test_the_class_reports_counts_equal_the_gradebooks_rows(graded, written):
    data = written["report"]
    assert json.loads((written["out"] / "report.json").read_text()) == data
    conn = sqlite3.connect(graded["db"])
    # each student's latest run by store.counting's order: graded_at (whole seconds), then id;
    # two runs graded within one second tie on graded_at alone
    latest = ("SELECT n.id FROM notebooks n WHERE NOT EXISTS (SELECT 1 FROM notebooks m WHERE "
              "m.student = n.student AND m.set_name = n.set_name AND "
              "(m.graded_at, m.id) > (n.graded_at, n.id))")
    assert len(conn.execute(latest).fetchall()) == 5      # one run per student, ties or not
    counts = dict(((e, s), c) for e, s, c in conn.execute(
        f"SELECT exercise, status, count(*) FROM results WHERE notebook_id IN ({latest}) "
        f"GROUP BY exercise, status"))
    ever = dict(((e, m), c) for e, m, c in conn.execute(
        "SELECT r.exercise, r.mistake, count(DISTINCT n.student) FROM results r JOIN notebooks n "
        "ON n.id = r.notebook_id WHERE r.status = 'FAIL' GROUP BY r.exercise, r.mistake"))
    unanswered = dict(conn.execute(
        f"SELECT exercise, count(*) FROM results WHERE notebook_id IN ({latest}) AND mistake "
        f"IN ('stub', 'missing', 'not-in-copy') GROUP BY exercise"))
    report, = data["sets"]
    assert report["students"] == 5 and data["notebooks_recorded"] == 6
    for e in report["exercises"]:
        name = e["exercise"]
        assert e["pass"] == counts.get((name, "PASS"), 0)
        assert e["fail"] == counts.get((name, "FAIL"), 0)
        assert e["unanswered"] == unanswered.get(name, 0)
        assert e["pass_rate"] == pytest.approx(e["pass"] / 5)
        for m in e["mistakes"]:
            assert m["students_ever"] == ever[(name, m["mistake"])]
    softmax = report["exercises"][0]
    assert softmax["exercise"] == "stable_softmax" and softmax["fixed"] == 1
    assert [a["pass"] for a in softmax["attempts"]] == [2, 1]   # 1st: alice, frank; 2nd: bob
    page = (written["out"] / "report.html").read_text()
    assert page.count("<svg") >= 2 and "softmax.HINT_NO_SHIFT" in page
    assert SECRET not in page and "<script" not in page


def test_the_exports_parse_back_with_their_documented_layouts(graded):
    tmp, rows, course = graded["tmp"], graded["rows"], graded["course"]
    write_export(rows, "wide", tmp / "wide.csv")
    wide = list(csv.reader(open(tmp / "wide.csv")))
    assert wide[0] == ["student", "01_softmax", "total"]
    assert {r[0]: r[1] for r in wide[1:]} == {"alice": "3.2", "bob": "4", "carol": "0",
                                              "eve": "0", "frank": "4"}
    # only alice is on the roster: the others have no identity for the import to match on
    with pytest.raises(ValueError, match=r"^canvas: 4 student\(s\) .* \(bob, carol, eve, frank\)"):
        write_export(rows, "canvas", tmp / "canvas.csv", course)
    write_export(rows, "canvas", tmp / "canvas.csv", course, skip_unidentified=True)
    canvas = list(csv.reader(open(tmp / "canvas.csv")))
    assert canvas[0] == CANVAS_COLUMNS + ["Softmax (4711)"]
    assert canvas[1] == ["Points Possible", "", "", "", "", "4"]
    assert canvas[2:] == [["Liddell, Alice", "5512", "S1001", "aliddell", "A", "3.2"]]
    write_export(rows, "moodle", tmp / "moodle.csv", course, skip_unidentified=True)
    moodle = list(csv.reader(open(tmp / "moodle.csv")))
    assert moodle[0] == MOODLE_COLUMNS + ["Softmax"]
    assert moodle[1] == ["Alice", "Liddell", "1001", "alice@uni.example", "3.2"]
    write_export(rows, "gradescope", tmp / "results.json", student="eve", set_name="01_softmax")
    results = json.loads((tmp / "results.json").read_text())
    assert results["score"] == 0.0 and sum(t["max_score"] for t in results["tests"]) == 4.0
    tests = {t["name"]: t for t in results["tests"]}
    hidden = tests["stable_softmax (hidden cases)"]
    assert (hidden["visibility"], hidden["status"], hidden["max_score"]) == \
        ("after_published", "failed", 1.0)
    assert tests["stable_softmax (public cases)"]["visibility"] == "visible"
    assert tests["scaled_scores"]["status"] == "failed"
    for path in ("wide.csv", "canvas.csv", "moodle.csv", "results.json"):
        assert SECRET not in (tmp / path).read_text() and "7.3125" not in (tmp / path).read_text()


def _txlearn(*args, **kwargs):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.Popen([str(Path(sys.executable).parent / "txlearn"), *map(str, args)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kwargs)


def test_two_txlearn_grade_runs_on_one_gradebook_at_once_both_land(graded, tmp_path):
    db = tmp_path / "class.db"
    runs = [_txlearn("grade", graded["paths"][i], "--gradebook", db, "--jobs", "1")
            for i in (0, 2)]
    outputs = [r.communicate(timeout=300) for r in runs]
    assert [r.returncode for r in runs] == [0, 0], outputs
    assert all("recorded 1 notebook(s)" in out for out, _ in outputs)
    with open_gradebook(db, readonly=True) as gb:
        assert sorted(r.student for r in gb.notebooks()) == ["alice", "carol"]
        assert len(gb.runs()) == 2 and gb.check() == []


def test_the_commands_refuse_a_corrupt_gradebook_in_one_line_and_leave_it(graded, tmp_path):
    bad = tmp_path / "class.db"
    bad.write_bytes(graded["db"].read_bytes()[:6000])          # cut short
    before = bad.read_bytes()
    for args in (("grade", graded["paths"][0], "--gradebook", bad), ("report", bad),
                 ("export", "wide", bad, "--out", tmp_path / "w.csv")):
        out, err = _txlearn(*args).communicate(timeout=300)
        assert re.fullmatch(r"txlearn: error: gradebook .*class\.db: corrupt .*the file was left "
                            r"as it is\n", err), err
        assert "Traceback" not in out + err
    assert bad.read_bytes() == before and not (tmp_path / "w.csv").exists()


def test_the_browser_shows_a_feedback_page_and_the_report_offline_with_the_script_inert(written):
    from playwright.sync_api import sync_playwright

    out = written["out"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), headless=True,
                                     chromium_sandbox=False, args=CHROMIUM_ARGS)
        context = browser.new_context()
        requested = []
        context.on("request", lambda request: requested.append(request.url))
        context.route("**/*", lambda route: route.continue_()
                      if route.request.url.startswith(("file:", "data:")) else route.abort())
        page = context.new_page()
        page.goto((out / "eve" / "01_softmax.html").as_uri())
        time.sleep(0.3)
        assert page.evaluate("() => window.__pwned") is None
        assert page.evaluate("() => document.scripts.length") == 0
        text = page.inner_text("body")
        assert SCRIPT in text and "hidden case" in text and "Feedback: 01_softmax" in text
        page.goto((out / "report.html").as_uri())
        shown = page.evaluate("() => [...document.querySelectorAll('svg')]"
                              ".map(s => s.getBoundingClientRect().width)")
        assert len(shown) >= 2 and min(shown) > 200
        assert "stable_softmax" in page.inner_text("body")
        assert page.evaluate("() => document.scripts.length") == 0
        browser.close()
    assert all(url.startswith("file:") for url in requested), requested


def test_the_reading_commands_write_what_they_say(graded, tmp_path, capsys):
    from txlearn.cli import main

    db = graded["db"]
    assert main(["feedback", str(db), "--out", str(tmp_path / "fb"), "--student", "eve"]) == 0
    assert sorted(p.name for p in (tmp_path / "fb").rglob("*.html")) == ["01_softmax.html",
                                                                         "index.html"]
    assert main(["report", str(db), "--out", str(tmp_path / "r.html"), "--no-plots"]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["students"] == 5
    assert main(["export", "gradescope", str(db), "--out", str(tmp_path / "gs")]) == 0
    assert len(list((tmp_path / "gs").rglob("results.json"))) == 5
    assert main(["export", "gradescope", str(db), "--out", str(tmp_path / "one.json")]) == 2
    assert "5 notebooks match" in capsys.readouterr().err
    assert main(["similarity", str(db), "--out", str(tmp_path / "s.html")]) == 0
    for page in [tmp_path / "s.html", tmp_path / "r.html", *(tmp_path / "fb").rglob("*.html")]:
        text = page.read_text()   # no page a command writes holds a hidden input or a live tag
        assert SECRET not in text and str(HIDDEN_VALUE) not in text, page
        assert "<script" not in text.lower() and "<img" not in text.lower(), page
    assert main(["merge", str(tmp_path / "all.db"), str(db), str(db)]) == 0
    out = capsys.readouterr().out
    assert "1 new run(s), 5 new notebook(s)" not in out and "2 new run(s), 6 new notebook(s)" in out
    assert "0 new run(s), 0 new notebook(s) (2 run(s) and 6 notebook(s) already" in out
