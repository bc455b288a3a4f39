"""The gradebook's SQLite file under stress, without grading: what a corrupt, foreign, newer or
locked file gets (a clear error, the file byte for byte unchanged), a writer killed with SIGKILL in
the middle of a notebook (whole notebooks only), two processes writing at once (both land), and
merging gradebooks of several machines (no run counted twice). Rows are made directly, so these
tests cost a few seconds; tests/test_gradebook.py grades real notebooks."""

import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from txlearn.course.gradebook import merge_gradebooks, open_gradebook
from txlearn.course.gradebook.store import (APPLICATION_ID, SCHEMA_VERSION, GradebookError,
                                            NotebookRow, ResultRow)

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = ("stable_softmax", "scaled_scores", "softmax_jacobian", "log_softmax")


def row(run: str, student: str, number: int, n_results: int = 4) -> NotebookRow:
    """A notebook row as the recorder makes one (fields filled, ``n_results`` results)."""
    return NotebookRow(
        uuid=f"{run}-{student}-{number}", run_uuid=run, student=student, set_name="01_softmax",
        notebook="01_softmax.ipynb", path=f"/x/{student}/01_softmax.ipynb", digest=f"d{number}",
        submitted_at="2026-10-01T10:00:00Z", submitted_from="mtime",
        graded_at=f"2026-10-02T10:{number // 60:02d}:{number % 60:02d}Z", status="GRADED",
        error="", sandbox="plain", points=2, max_points=n_results, deadline="", late_seconds=0.0,
        penalty=0.0, integrity=[],
        results=[ResultRow(EXERCISES[i % 4], "PASS" if i % 2 == 0 else "FAIL", int(i % 2 == 0), 1,
                           mistake="" if i % 2 == 0 else "softmax.HINT_NO_SHIFT")
                 for i in range(n_results)],
        answers={"stable_softmax": "def softmax(x):\n    return x\n"})


def new_gradebook(path: Path, notebooks: int = 2, run_name: str = "r1") -> Path:
    with open_gradebook(path) as gb:
        run = gb.start_run(command="test", started_at="2026-10-02T10:00:00Z", version="0")
        for i in range(notebooks):
            gb.add_notebook(row(run, f"s{i}", i))
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))


# ---- files that are not a gradebook this txlearn can write -----------------------------------

def _corrupt_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[4096:8192] = b"\xa5" * 4096          # page 2 (the default page is 4096 bytes)
    path.write_bytes(bytes(data))


def _newer(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()


def _foreign(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE photos (id INTEGER)")
    conn.execute("PRAGMA application_id = 1")
    conn.commit()
    conn.close()


@pytest.mark.parametrize("damage,words", [
    (lambda p: p.write_bytes(b"student,grade\nalice,4\n" * 50), "not a SQLite database"),
    (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "corrupt"),
    (_corrupt_middle, "corrupt"),
    (_newer, "newer txlearn"),
    (_foreign, "another application"),
], ids=["text", "truncated", "garbage_page", "newer_schema", "foreign"])
def test_a_damaged_or_foreign_file_gets_a_clear_error_and_is_left_byte_identical(tmp_path, damage,
                                                                                  words):
    path = new_gradebook(tmp_path / "class.db", notebooks=30)
    damage(path)
    before = digest(path)
    for readonly in (False, True):
        with pytest.raises(GradebookError, match=words) as err:
            open_gradebook(path, readonly=readonly)
        assert "left as it is" in str(err.value)
    assert digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["class.db"]   # no journal left


def test_a_locked_file_gets_a_clear_error_after_the_wait_and_is_left_as_it_was(tmp_path):
    path = new_gradebook(tmp_path / "class.db")
    before = digest(path)
    holder = _child(f"""
        import sqlite3, time, pathlib
        conn = sqlite3.connect({str(path)!r}, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        pathlib.Path({str(tmp_path / 'held')!r}).write_text("yes")
        time.sleep(60)
    """)
    try:
        for _ in range(600):
            if (tmp_path / "held").exists():
                break
            time.sleep(0.05)
        start = time.monotonic()
        with pytest.raises(GradebookError, match="locked by another process"):
            open_gradebook(path, wait=0.5)
        assert time.monotonic() - start >= 0.5     # it waited before giving up
    finally:
        holder.kill()
        holder.wait()
    assert digest(path) == before


def test_a_new_gradebook_is_marked_with_its_schema(tmp_path):
    path = new_gradebook(tmp_path / "class.db")
    head = path.read_bytes()[:100]
    assert int.from_bytes(head[60:64], "big") == SCHEMA_VERSION
    assert int.from_bytes(head[68:72], "big") == APPLICATION_ID


# ---- killed writers and concurrent writers -----------------------------------------------------

def test_a_writer_killed_mid_notebook_leaves_whole_notebooks_only(tmp_path):
    """The child writes three notebooks, then stops inside the fourth's transaction (after 600
    of its 700 results, 6 MB: SQLite has written pages of it into the file) and is killed with
    SIGKILL there: the gradebook holds the three, each whole, and nothing of the fourth, once the
    journal is rolled back, which even a reader's opening does."""
    path = tmp_path / "class.db"
    marker = tmp_path / "inside"
    child = _child(f"""
        import pathlib, time, sys
        sys.path.insert(0, {str(ROOT / 'tests')!r})
        from test_gradebook_store import row
        from txlearn.course.gradebook import open_gradebook

        class Stalls(list):     # the fourth notebook's results: stalls after 600 rows of 10 kB,
            def __iter__(self):  # more than SQLite's page cache: pages reach the file itself
                for i, item in enumerate(list.__iter__(self)):
                    if i == 600:
                        pathlib.Path({str(marker)!r}).write_text("mid-notebook")
                        time.sleep(120)
                    yield item

        gb = open_gradebook({str(path)!r})
        run = gb.start_run(command="killed", started_at="2026-10-02T10:00:00Z", version="0")
        for i in range(3):
            gb.add_notebook(row(run, f"s{{i}}", i))
        fourth = row(run, "s3", 3, n_results=700)
        for r in fourth.results:
            r.feedback = "x" * 10_000
        fourth.results = Stalls(fourth.results)
        gb.add_notebook(fourth)
    """)
    try:
        for _ in range(1200):
            if marker.exists() or child.poll() is not None:
                break
            time.sleep(0.05)
        assert marker.exists(), "the writer never reached the fourth notebook"
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL
    assert Path(f"{path}-journal").exists()       # killed inside a transaction: a hot journal
    assert path.stat().st_size > 4_000_000         # and the fourth notebook's pages in the file
    with open_gradebook(path, readonly=True) as gb:   # rolled back on opening, even to read
        notebooks = gb.notebooks()
        assert [n.student for n in notebooks] == ["s0", "s1", "s2"]
        assert all(len(n.results) == n.n_results == 4 for n in notebooks)
        assert gb.check() == []
        assert gb.read("SELECT count(*) FROM results")[0][0] == 12
        assert gb.read("SELECT count(*) FROM answers")[0][0] == 3


def test_two_processes_writing_one_gradebook_at_once_both_land(tmp_path):
    path = tmp_path / "class.db"
    open_gradebook(path).close()                # an empty gradebook, no run yet
    go = tmp_path / "go"
    children = [_child(f"""
        import pathlib, sys, time
        sys.path.insert(0, {str(ROOT / 'tests')!r})
        from test_gradebook_store import row
        from txlearn.course.gradebook import open_gradebook
        gb = open_gradebook({str(path)!r}, wait=60)
        run = gb.start_run(command="writer {w}", started_at="2026-10-02T10:00:00Z", version="0")
        while not pathlib.Path({str(go)!r}).exists():
            time.sleep(0.01)
        for i in range(25):
            gb.add_notebook(row(run, "w{w}-s" + str(i), i))
        gb.finish_run(run, "2026-10-02T11:00:00Z")
    """) for w in (1, 2)]
    time.sleep(0.5)
    go.write_text("go")
    assert [c.wait(timeout=120) for c in children] == [0, 0]
    with open_gradebook(path, readonly=True) as gb:
        notebooks = gb.notebooks()
        runs = gb.runs()
    assert len(runs) == 2 and all(r["finished_at"] for r in runs)
    assert len(notebooks) == 50
    assert {n.student.split("-")[0] for n in notebooks} == {"w1", "w2"}
    assert all(len(n.results) == 4 for n in notebooks)


# ---- merging ------------------------------------------------------------------------------

def test_merging_gradebooks_of_several_machines_never_duplicates_a_run(tmp_path):
    a = new_gradebook(tmp_path / "a.db", notebooks=3)
    b = new_gradebook(tmp_path / "b.db", notebooks=2)
    class_db = tmp_path / "class.db"
    first = merge_gradebooks(class_db, [a, b])
    assert [(m.runs, m.notebooks) for m in first] == [(1, 3), (1, 2)]
    again = merge_gradebooks(class_db, [a, b, class_db.with_name("a.db")])
    assert [(m.runs, m.notebooks) for m in again] == [(0, 0)] * 3
    assert [(m.known_runs, m.known_notebooks) for m in again] == [(1, 3), (1, 2), (1, 3)]
    merge_gradebooks(a, [b])                    # A gets B's rows; then A (holding B's) into B
    back = merge_gradebooks(b, [a])
    assert [(m.runs, m.notebooks, m.known_notebooks) for m in back] == [(1, 3, 2)]
    for path, notebooks in ((class_db, 5), (a, 5), (b, 5)):
        with open_gradebook(path, readonly=True) as gb:
            rows = gb.notebooks()
            assert len(rows) == notebooks and len({r.uuid for r in rows}) == notebooks
            assert len(gb.runs()) == 2 and gb.check() == []
            assert sorted(len(r.results) for r in rows) == [4] * notebooks


def test_merging_a_corrupt_gradebook_merges_nothing_from_it(tmp_path):
    good = new_gradebook(tmp_path / "good.db", notebooks=2)
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"not a gradebook at all" * 10)
    with pytest.raises(GradebookError, match="bad.db: not a SQLite database"):
        merge_gradebooks(tmp_path / "class.db", [good, bad])
    with open_gradebook(tmp_path / "class.db", readonly=True) as gb:
        assert len(gb.notebooks()) == 2          # the good one, merged before the bad one


def test_two_gradings_in_one_second_count_in_the_order_they_were_recorded(tmp_path):
    # graded_at has whole seconds: bob graded twice within one second (a re-grade right after
    # the first, as the class test does) must still count his second grading as the latest,
    # whatever order the notebooks' uuids sort in
    from txlearn.course.gradebook.store import counting
    first, second = row("r1", "bob", 7), row("r1", "bob", 7)
    first.uuid, second.uuid = "z-first", "a-second"          # uuid order: second first
    first.points, second.points = 3, 4
    with open_gradebook(tmp_path / "g.db") as gb:
        run = gb.start_run(command="test", started_at="2026-10-02T10:00:00Z", version="0")
        first.run_uuid = second.run_uuid = run
        gb.add_notebook(first)
        gb.add_notebook(second)
    with open_gradebook(tmp_path / "g.db", readonly=True) as gb:
        rows = gb.notebooks()
    assert [r.points for r in rows] == [3, 4]
    assert counting(rows, "latest")[("bob", "01_softmax")].points == 4


def test_a_gradebook_another_run_makes_between_two_reads_of_its_header(tmp_path, monkeypatch):
    # two `txlearn grade` runs on one new gradebook (a fresh clone's make test hit it): the
    # second read the file's id, then the first committed the schema, then the second read the
    # schema version and called the file "a SQLite database, but not a txlearn gradebook"
    from txlearn.course.gradebook import store
    path = tmp_path / "class.db"
    real, fired = sqlite3.connect, []

    def connect(*args, **kwargs):
        conn = real(*args, **kwargs)
        statements = []

        def trace(sql):
            statements.append(sql)
            if len(statements) == 3 and not fired:   # after busy_timeout and one more read
                fired.append(sql)
                other = real(path, isolation_level=None)
                store._initialise(other)             # the other run makes the schema now
                other.close()
        conn.set_trace_callback(trace)
        return conn

    monkeypatch.setattr(store.sqlite3, "connect", connect)
    gradebook = open_gradebook(path)
    assert fired, "the other run never made the schema in between"
    monkeypatch.undo()
    gradebook.close()
    again = open_gradebook(path)
    assert again.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    again.close()


def _graded(path: Path, student: str, points: int):
    from txlearn.course.grading.reports import Result, Submission
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")
    return Submission(path=path, student=student, set_name="01_softmax", mode="plain",
                      results=[Result(student, path.name, "stable_softmax", "PASS" if points
                                      else "FAIL", points, 1)],
                      graded_at=f"2026-10-02T10:00:0{points}Z")


def test_one_student_recorded_from_two_folders_or_machines_is_a_warning(tmp_path):
    # a later run of late/alice/ (not alice's folder), or a merged gradebook of another
    # machine with its own alice, replaced alice's score under policy latest without a word
    from txlearn.course.gradebook import Course, Recorder, class_report
    from txlearn.course.gradebook.report import report_page
    from txlearn.course.gradebook.store import identity_clashes
    with open_gradebook(tmp_path / "class.db") as gb:
        for folder, points in (("submissions", 1), ("late", 0)):
            recorder = Recorder(gb, Course())
            recorder(_graded(tmp_path / folder / "alice" / "01_softmax.ipynb", "alice", points))
        assert recorder.warnings and "'alice', 01_softmax: recorded before from " \
            f"{tmp_path / 'submissions' / 'alice'}" in recorder.warnings[0], recorder.warnings
        rows = gb.notebooks()
    assert len(identity_clashes(rows)) == 1 and "2 places" in identity_clashes(rows)[0]
    data = class_report(rows)
    assert data["identity_warnings"] == identity_clashes(rows)
    assert "Warning: &#x27;alice&#x27;, 01_softmax: recorded from 2 places" in report_page(data)
    other = tmp_path / "lab2.db"        # another machine's alice, merged in
    with open_gradebook(other) as gb:
        run = gb.start_run(command="t", started_at="2026-10-03T10:00:00Z", version="0")
        gb.add_notebook(row(run, "bob", 9))
        gb.add_notebook(row(run, "carol", 8))
        gb.write(lambda cur: cur.execute("UPDATE runs SET machine = 'lab2'"))
    merged, = merge_gradebooks(tmp_path / "lab1.db", [other])
    assert merged.warnings == []                      # nothing of theirs clashes yet
    with open_gradebook(tmp_path / "lab1.db") as gb:
        run = gb.start_run(command="t", started_at="2026-10-03T10:00:00Z", version="0")
        gb.add_notebook(row(run, "carol", 7))
    merged, = merge_gradebooks(tmp_path / "class2.db", [tmp_path / "lab1.db"])
    assert len(merged.warnings) == 1 and "'carol'" in merged.warnings[0], merged.warnings
    assert " on lab2" in merged.warnings[0], merged.warnings


def test_the_rosters_student_is_the_folder_beside_the_course_file(tmp_path):
    from txlearn.course.gradebook import Course, Recorder
    course = Course(path=tmp_path / "submissions" / "course.yaml",
                    roster={"alice": {"email": "alice@uni.example"}})
    with open_gradebook(tmp_path / "class.db") as gb:
        recorder = Recorder(gb, course)
        recorder(_graded(tmp_path / "submissions" / "alice" / "01_softmax.ipynb", "alice", 1))
        recorder(_graded(tmp_path / "late" / "alice" / "01_softmax.ipynb", "alice", 0))
        recorder(_graded(tmp_path / "late" / "bob" / "01_softmax.ipynb", "bob", 0))
        students = [(r.student, r.points) for r in gb.notebooks()]
    # bob has no roster entry: his folder's name stays his identity, wherever it is
    assert sorted(students) == [("alice", 1), ("bob", 0), ("late/alice", 0)], students
    assert len(recorder.warnings) == 1 and "recorded as student 'late/alice'" in \
        recorder.warnings[0], recorder.warnings
