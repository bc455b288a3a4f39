"""Undecodable names and texts in the gradebook, from a public report against course gradebooks
and the grader's fourth hardening: a folder whose name is not UTF-8 (``os.fsdecode(b"Jos\\xe9")``
gives a lone surrogate, as ``unzip`` writes raw names) or an answer cell holding ``"\\udcff"``
raised ``UnicodeEncodeError`` in the recorder and stopped the whole ``txlearn grade --gradebook``
run. Expected: every notebook recorded, names and texts stored losslessly (escaped) and shown
readably, and a notebook the gradebook cannot take recorded as such while the class goes on."""

import hashlib
import json
import os
import sqlite3

from txlearn.course import build
from txlearn.course.gradebook import (Recorder, load_course, open_gradebook, write_export,
                                      write_feedback)
from txlearn.course.gradebook.store import ESCAPED, readable, stored_text, text_of
from txlearn.course.grading.reports import Result, Submission

STUDENT = build.ROOT / "exercises" / "student" / "01_softmax.ipynb"
JOSE = os.fsdecode(b"Jos\xe9")                # "Jos\udce9": the byte 0xE9 that is not UTF-8
ANSWER = "def softmax(x, axis=-1):\n    return x  # '\udcff'\n"


def _submission(folder, answer=ANSWER, points=1):
    """A graded Submission of lesson 01's notebook in ``folder``, its answer cell ``answer``."""
    nb = json.loads(STUDENT.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell.get("metadata", {}).get("exercise") == "stable_softmax" and \
                "answer" in cell["metadata"].get("tags", []):
            cell["source"] = answer
    folder.mkdir(parents=True)
    path = folder / STUDENT.name
    path.write_text(json.dumps(nb), encoding="ascii")   # json escapes the surrogate: "\udcff"
    return Submission(path=path, student=folder.name, set_name="01_softmax",
                      results=[Result(folder.name, path.name, "stable_softmax", "PASS", points,
                                      feedback=f"got '\udcff' from {folder.name}")],
                      digest=hashlib.sha256(path.read_bytes()).hexdigest(),
                      graded_at="2026-10-02T10:00:00Z")


def test_any_text_round_trips_through_its_stored_form():
    texts = ["plain", "Jos\u00e9", JOSE, "a\\udce9", "\\" + JOSE, ESCAPED + "x", "\ud83d\ude00",
             "\\\\"]
    for text in texts:
        stored = stored_text(text)
        stored.encode("utf-8")                                   # what SQLite can hold
        assert text_of(stored) == text
    assert [stored_text(t) for t in texts[:2]] == texts[:2]      # the rest as before, unchanged
    assert readable(JOSE) == "Jos\\udce9"


def test_a_class_with_an_undecodable_name_and_answer_is_recorded_whole(tmp_path):
    """The class: alice, a folder named by the byte 0xE9 whose answer cell holds a lone surrogate,
    bob, whose Result the gradebook cannot store (points not a number), and a folder named in
    NFD (as macOS archives write names): all four are recorded, José's name and answer exactly,
    bob's notebook as not graded with the reason, the NFD name in NFC (as the course file's
    names are compared)."""
    subs = [_submission(tmp_path / "s" / "alice", "def softmax(x, axis=-1):\n    return x\n"),
            _submission(tmp_path / "s" / JOSE),
            _submission(tmp_path / "s" / "bob", points=float("nan")),
            _submission(tmp_path / "s" / "Zoe\u0308")]
    (tmp_path / "course.yaml").write_text("sets: {01_softmax: 2030-01-01}\n")
    with open_gradebook(tmp_path / "class.db") as gb:
        recorder = Recorder(gb, load_course(tmp_path / "course.yaml"),
                            command=f"txlearn grade {subs[1].path}")
        for sub in subs:                                         # as grade() calls it
            recorder(sub)
        recorder.finish()
        rows = {r.student: r for r in gb.notebooks()}
        runs = gb.runs()
    assert recorder.recorded == 4 and sorted(rows) == sorted(["alice", "bob", JOSE, "Zo\u00eb"])
    jose = rows[JOSE]
    assert (jose.status, jose.path, jose.points) == ("GRADED", str(subs[1].path), 1)
    assert jose.answers == {"stable_softmax": ANSWER}            # lossless
    assert jose.results[0].feedback == f"got '\udcff' from {JOSE}"
    assert runs[0]["command"] == f"txlearn grade {subs[1].path}"
    bob = rows["bob"]
    assert bob.status == "ERROR" and bob.error.startswith("not recorded") and "ValueError" in \
        bob.error and recorder.unrecordable and "bob" in recorder.unrecordable[0]
    with sqlite3.connect(tmp_path / "class.db") as conn:         # escaped on disk, plain text
        stored = dict(conn.execute("SELECT path, student FROM notebooks").fetchall())
    assert stored[str(subs[0].path)] == "alice" and \
        stored[stored_text(str(subs[1].path))] == ESCAPED + "Jos\\udce9"
    pages = write_feedback(list(rows.values()), tmp_path / "fb", generated="now")
    html = [p.read_text(encoding="utf-8") for p in pages if "Jos" in str(p)]
    assert html and "Jos\\udce9" in html[0]                      # shown readably
    wide, = write_export(list(rows.values()), "wide", tmp_path / "w.csv")
    assert "Jos\\udce9,1" in wide.read_text(encoding="utf-8")
