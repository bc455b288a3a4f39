"""The class report's instructor view: the students behind each mistake, who did not submit
(roster minus submissions), and a later set's failure listed under the earlier set's exercise
that caused it, with the mistake made there (no grading: rows as the recorder writes them)."""

from txlearn.course.gradebook import class_report
from txlearn.course.gradebook.report import report_page
from txlearn.course.gradebook.report_instructor import instructor_view, root_cause
from txlearn.course.gradebook.store import NotebookRow, ResultRow, counting

MALLORY = "<b>mallory</b>"


def _row(student, set_name, results, number):
    return NotebookRow(
        uuid=f"{student}-{set_name}", run_uuid="r1", student=student, set_name=set_name,
        notebook=f"{set_name}.ipynb", path=f"/x/{student}/{set_name}.ipynb", digest=f"d{number}",
        submitted_at="2026-10-01T10:00:00Z", submitted_from="manifest",
        graded_at=f"2026-10-02T10:00:{number:02d}Z", status="GRADED", error="", sandbox="bwrap",
        points=sum(s == "PASS" for _, s, _ in results), max_points=len(results), deadline="",
        late_seconds=0.0, penalty=0.0,
        results=[ResultRow(e, s, int(s == "PASS"), 1, mistake=m, position=i)
                 for i, (e, s, m) in enumerate(results)])


def _class():
    """alice's set-03 attention is wrong (heads.HINT_SCALE): her set 07 and set 09 fail through
    it; bob passes set 03 but not set 07's layer norm; dora's set 07 fails through a set 03
    the gradebook never saw; carol (on the roster) submitted nothing."""
    rows = [
        _row("alice", "03_heads", [("multi_head_attention", "FAIL", "heads.HINT_SCALE")], 1),
        _row("bob", "03_heads", [("multi_head_attention", "PASS", "")], 2),
        _row(MALLORY, "03_heads", [("multi_head_attention", "FAIL", "heads.HINT_SCALE")], 3),
        _row("alice", "07_layer", [("transformer_layer", "FAIL", "needs:multi_head_attention"),
                                   ("language_model", "FAIL", "needs:transformer_layer")], 4),
        _row("bob", "07_layer", [("transformer_layer", "FAIL", "layer.HINT_NORM"),
                                 ("language_model", "FAIL", "needs:transformer_layer")], 5),
        _row("dora", "07_layer", [("transformer_layer", "FAIL", "needs:multi_head_attention"),
                                  ("language_model", "PASS", "")], 6),
        _row("alice", "09_capstone", [("char_model", "FAIL", "needs:language_model")], 7),
    ]
    return rows


ROSTER = ["alice", "bob", "carol", "dora", MALLORY]


def test_a_set_09_failure_is_followed_to_its_set_03_cause():
    rows = _class()
    counted = counting(rows)
    view = instructor_view(rows, counted)
    where = {"multi_head_attention": "03_heads", "transformer_layer": "07_layer",
             "language_model": "07_layer", "char_model": "09_capstone"}
    assert root_cause("alice", "09_capstone", "char_model", counted, where) == (
        "03_heads", "multi_head_attention", "heads.HINT_SCALE",
        ["09_capstone/char_model", "07_layer/language_model", "07_layer/transformer_layer",
         "03_heads/multi_head_attention"])
    here = view["sets"]["03_heads"]["caused_here"]
    assert [(c["exercise"], c["mistake"]) for c in here] == [
        ("multi_head_attention", "(not graded here: its notebook is not in the gradebook)"),
        ("multi_head_attention", "heads.HINT_SCALE")]
    assert [(f["student"], f["failure"]) for f in here[1]["failures"]] == [
        ("alice", "07_layer/transformer_layer"), ("alice", "07_layer/language_model"),
        ("alice", "09_capstone/char_model")]
    assert [f["student"] for f in here[0]["failures"]] == ["dora"]
    # bob's language model fails through his own set-07 layer norm: set 07's, not set 03's
    assert view["sets"]["07_layer"]["caused_here"] == [] and \
        all(f["student"] != "bob" for c in here for f in c["failures"])


def test_the_students_behind_each_mistake_and_the_non_submitters_are_named():
    rows = _class()
    view = instructor_view(rows, counting(rows), roster=ROSTER)
    assert view["sets"]["03_heads"]["mistakes"] == [
        {"exercise": "multi_head_attention", "mistake": "heads.HINT_SCALE",
         "students": [MALLORY, "alice"]}]
    assert view["sets"]["03_heads"]["not_submitted"] == ["carol", "dora"]
    assert view["sets"]["09_capstone"]["not_submitted"] == [MALLORY, "bob", "carol", "dora"]
    assert view["roster_from"] == "the course file's roster"
    # without a roster: everyone the gradebook holds a notebook of
    bare = instructor_view(rows, counting(rows))
    assert bare["sets"]["09_capstone"]["not_submitted"] == [MALLORY, "bob", "dora"]


def test_the_report_page_shows_the_instructor_view_escaped():
    data = class_report(_class(), roster=ROSTER)
    assert data["instructor"]["sets"]["03_heads"]["not_submitted"] == ["carol", "dora"]
    html = report_page(data, plots=False)
    assert "Did not submit: 2 student(s)" in html and "carol, dora" in html
    assert "Later sets' failures caused here" in html
    assert ("09_capstone/char_model -&gt; 07_layer/language_model -&gt; "
            "07_layer/transformer_layer -&gt; 03_heads/multi_head_attention") in html
    assert MALLORY not in html and "&lt;b&gt;mallory&lt;/b&gt;, alice" in html
