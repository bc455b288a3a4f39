"""A notebook that cannot be read is recorded under the set its file name names (issue 36)."""

from txlearn.course import grading


def test_unreadable_notebook_keeps_its_set(tmp_path):
    bad = tmp_path / "ana" / "01_softmax.ipynb"
    bad.parent.mkdir()
    bad.write_text("{ this is not a notebook", encoding="utf-8")
    (sub,) = grading.grade([bad], no_sandbox=True, jobs=1)
    assert sub.error.startswith("not graded"), sub.error
    assert sub.set_name.startswith("01"), sub.set_name
    assert sub.results and all(r.status == "ERROR" for r in sub.results)
    assert sub.results[0].exercise != "-"
