"""A notebook that cannot be graded is recorded under the set its file name names, and the class
report, the feedback index and its page say so, why, and what the student should fix (issue 36)."""

import html
import json
import re
from types import SimpleNamespace

import pytest

from txlearn.course import build, grading


def test_unreadable_notebook_keeps_its_set(tmp_path):
    bad = tmp_path / "ana" / "01_softmax.ipynb"
    bad.parent.mkdir()
    bad.write_text("{ this is not a notebook", encoding="utf-8")
    (sub,) = grading.grade([bad], no_sandbox=True, jobs=1)
    assert sub.error.startswith("not graded"), sub.error
    assert sub.set_name.startswith("01"), sub.set_name
    assert sub.results and all(r.status == "ERROR" for r in sub.results)
    assert sub.results[0].exercise != "-"


# ---- the whole path: graded into a gradebook with a good notebook, then reported and fed back ----

SOLUTION = build.ROOT / "exercises" / "solutions" / "01_softmax.ipynb"
FIX = ("your upload could not be read as a notebook: re-download it from JupyterLab with "
       "File > Download and submit again")


def _text(path):
    """A page's text as a reader sees it (tags dropped, entities decoded, spaces collapsed)."""
    page = re.sub(r"<style.*?</style>", "", path.read_text(encoding="utf-8"), flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    from txlearn.cli import main

    root = tmp_path_factory.mktemp("class")
    bad, good = root / "ana" / "01_softmax.ipynb", root / "bob" / "01_softmax.ipynb"
    for path in (bad, good):
        path.parent.mkdir()
    bad.write_text("{ this is not a notebook", encoding="utf-8")
    good.write_bytes(SOLUTION.read_bytes())
    db = root / "class.db"
    # 1: one notebook could not be graded; the other is, and both are recorded
    assert main(["grade", "--no-sandbox", "--jobs", "1", "--gradebook", str(db),
                 str(bad), str(good)]) == 1
    assert main(["report", str(db), "--out", str(root / "report.html"), "--no-plots"]) == 0
    assert main(["feedback", str(db), "--out", str(root / "fb")]) == 0
    return {"root": root, "bad": bad}


def test_the_report_counts_and_lists_it(graded):
    root = graded["root"]
    (data,) = json.loads((root / "report.json").read_text())["sets"]
    assert data["set"] == "01_softmax" and data["students"] == 2 and data["not_graded"] == 1
    (ng,) = data["not_graded_notebooks"]
    assert ng["student"] == "ana" and ng["notebook"] == "01_softmax.ipynb"
    assert ng["path"] == str(graded["bad"]) and ng["reason"].startswith("not a readable notebook")
    text = _text(root / "report.html")
    assert "1 not graded" in text
    assert f"ana 01_softmax.ipynb {graded['bad']} not a readable notebook" in text, text


def test_the_feedback_index_and_page_say_what_to_fix(graded):
    fb = graded["root"] / "fb"
    index = _text(fb / "index.html")
    assert "ana 01_softmax not graded 01_softmax.ipynb: not a readable notebook" in index, index
    assert "bob 01_softmax 4 / 4" in index
    raw = (fb / "ana" / "01_softmax.html").read_text(encoding="utf-8")
    assert "File &gt; Download" in raw          # escaped like every other text of a page
    page = _text(fb / "ana" / "01_softmax.html")
    assert "Not graded: not a readable notebook" in page and f"What to do: {FIX}." in page, page


def test_an_unrecorded_notebook_keeps_its_set_too(tmp_path):
    from txlearn.course.gradebook.record import Recorder, set_of_file

    assert set_of_file(str(tmp_path / "ana" / "01_softmax.ipynb")) == "01_softmax"
    assert set_of_file(str(tmp_path / "ana" / "notes.ipynb")) == "notes"
    sub = SimpleNamespace(path=tmp_path / "ana" / "01_softmax.ipynb", student="ana",
                          set_name="", digest="", graded_at="", mode="")
    row = Recorder.unrecorded(SimpleNamespace(run="r"), sub, OSError("disk full"))
    assert row.set_name == "01_softmax" and row.status == "ERROR"
    assert row.error.startswith("not recorded:")
