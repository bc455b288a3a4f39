"""txlearn.course.earlier.load: a learner's answers from the sibling notebook of an earlier set."""

import json
import shutil

import numpy as np
import pytest

from txlearn.course import build
from txlearn.course.earlier import EarlierAnswerError, course_code_cells, load

SOLUTIONS = build.Layout().solutions


def test_loads_answers_and_skips_check_cells_and_added_cells(tmp_path, monkeypatch):
    nb = json.loads((SOLUTIONS / "01_softmax.ipynb").read_text())
    nb["cells"].append({"cell_type": "code", "id": "mine", "metadata": {}, "outputs": [],
                        "execution_count": None, "source": "raise RuntimeError('my experiment')"})
    (tmp_path / "01_softmax.ipynb").write_text(json.dumps(nb))
    monkeypatch.chdir(tmp_path)
    softmax, log_softmax = load("01_softmax", "softmax", "log_softmax")
    np.testing.assert_allclose(softmax(np.array([1000.0, 1000.0])), [0.5, 0.5])
    assert np.isfinite(log_softmax(np.array([0.0, -1000.0]))).all()
    sources = course_code_cells(nb, "01_softmax")
    assert not any("check(" in s for s in sources) and not any("my experiment" in s for s in sources)


def test_clear_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EarlierAnswerError, match="needs 01_softmax.ipynb beside this notebook"):
        load("01_softmax", "softmax")
    shutil.copy(SOLUTIONS / "01_softmax.ipynb", tmp_path)
    with pytest.raises(EarlierAnswerError, match="defines no MultiHeadAttention"):
        load("01_softmax", "MultiHeadAttention")
    (tmp_path / "01_softmax.ipynb").write_text("{not json")
    with pytest.raises(EarlierAnswerError, match="not a readable notebook"):
        load("01_softmax", "softmax")


def test_the_graders_sandbox_loads_earlier_answers_from_the_sibling(tmp_path, monkeypatch):
    """A set that uses an earlier set: the runner finds the sibling's answers in its private folder
    (the same load()); without the sibling the file is not graded."""
    from txlearn.course import grading

    real = build.set_info

    def uses_01(src, name, where):
        info = real(src, name, where)
        return build.SetInfo(**dict(vars(info), uses=("01_softmax",))) \
            if name == "02_attention" else info

    monkeypatch.setattr(build, "set_info", uses_01)
    nb = json.loads((SOLUTIONS / "02_attention.ipynb").read_text())
    for cell in nb["cells"]:
        if cell.get("metadata", {}).get("exercise") == "causal_mask" and \
                "answer" in cell["metadata"].get("tags", []):
            cell["source"] = ("from txlearn.course.earlier import load\n"
                              "my_softmax = load('01_softmax', 'softmax')\n"
                              "assert abs(my_softmax(np.array([0.0, 0.0]))[0] - 0.5) < 1e-12\n"
                              + "".join(cell["source"]))
    for folder, sibling in (("with", True), ("without", False)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "02_attention.ipynb").write_text(json.dumps(nb))
        if sibling:
            shutil.copy(SOLUTIONS / "01_softmax.ipynb", tmp_path / folder)
    subs = grading.grade([tmp_path / "with" / "02_attention.ipynb",
                          tmp_path / "without" / "02_attention.ipynb"], jobs=2)
    assert [r.status for r in subs[0].results] == ["PASS"] * 3, subs[0].results
    assert subs[1].error == "not graded: needs 01_softmax.ipynb beside it (this set uses your " \
                            "answers there)"
