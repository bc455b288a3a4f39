"""What a learner sees when a check fails, run through a real kernel (nbclient): at most eight
lines, the case and the values, the learner's own frame when their code raised, no frame of the
checker; hint levels that deepen on a second run and with hint(); no hint that gives away a line
of any solution."""

import ast
import re
from pathlib import Path

import nbclient
import nbformat
import pytest

from txlearn.checks import CheckFailure, check, hint
from txlearn.course import build

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
ROOT = Path(__file__).resolve().parent.parent

CELLS = {
    "wrong value": "import numpy as np\n"
                   "def softmax(x, axis=-1):\n    return np.ones_like(x) / x.shape[axis]\n"
                   "from txlearn.checks import check\ncheck('stable_softmax', softmax)",
    "raising answer": "def softmax(x, axis=-1):\n    z = x - x.max(axis=axis, keepdims=True)\n"
                      "    return z / undefined_name\n"
                      "check('stable_softmax', softmax)",
    "stub": "def softmax(x, axis=-1):\n    raise NotImplementedError('exercise stable_softmax')\n"
            "check('stable_softmax', softmax)",
    "timeout": "def softmax(x, axis=-1):\n    while True:\n        pass\n"
               "check('stable_softmax', softmax)",
    "same mistake again": "import numpy as np\n"
                         "def softmax(x, axis=-1):\n    e = np.exp(x)\n"
                         "    return e / e.sum(axis=axis, keepdims=True)\n"
                         "check('stable_softmax', softmax)",
    "and again": "check('stable_softmax', softmax)",
    "hint()": "from txlearn.checks import hint\nhint('stable_softmax')",
    "passes": "def softmax(x, axis=-1):\n    e = np.exp(x - x.max(axis=axis, keepdims=True))\n"
              "    return e / e.sum(axis=axis, keepdims=True)\n"
              "check('stable_softmax', softmax)",
}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS.values()]
    client = nbclient.NotebookClient(nb, kernel_name="python3", allow_errors=True, timeout=120,
                                     resources={"metadata": {"path": str(tmp_path_factory.mktemp("k"))}})
    import os
    os.environ["TXLEARN_TIME_LIMIT"] = "1"          # the timeout case, without waiting 10 s
    try:
        client.execute()
    finally:
        os.environ.pop("TXLEARN_TIME_LIMIT")
    result = {}
    for label, cell in zip(CELLS, nb.cells):
        errors = [o for o in cell.outputs if o.output_type == "error"]
        text = "\n".join(ANSI.sub("", line) for o in errors for line in o.traceback)
        stream = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        result[label] = (text, stream)
    return result


@pytest.mark.parametrize("label", ["wrong value", "raising answer", "stub", "timeout"])
def test_a_failing_check_shows_at_most_eight_lines(outputs, label):
    text, _ = outputs[label]
    lines = text.splitlines()
    assert lines, f"{label}: the cell did not fail"
    assert len(lines) <= 8, f"{label}: {len(lines)} lines:\n{text}"
    assert lines[0].startswith("CheckFailure: stable_softmax: case '")
    assert "txlearn/checks" not in text and "Traceback" not in text, text


def test_each_failure_says_what_is_wrong(outputs):
    assert "first difference at index" in outputs["wrong value"][0]
    raised = outputs["raising answer"][0]
    assert "raised NameError: name 'undefined_name' is not defined" in raised
    assert "line 3 in softmax: return z / undefined_name" in raised   # the learner's own frame
    assert "not implemented yet" in outputs["stub"][0]
    assert "did not finish within 1 s" in outputs["timeout"][0]
    assert outputs["passes"] == ("", "PASSED (public cases): stable_softmax\n")


def test_hint_levels_deepen_on_rerun_and_with_hint(outputs):
    first, again = outputs["same mistake again"][0], outputs["and again"][0]
    level = lambda text: re.search(r"Hint (\d) of (\d):", text)
    assert level(first) and level(first).group(1) == "1", first
    assert level(again) and level(again).group(1) == "2", again
    assert "hint(\"stable_softmax\")" in first
    third = outputs["hint()"][1]
    assert third.strip() and third != again


def _all_hint_strings():
    """Every string constant in the check modules (hints live there)."""
    for path in sorted((ROOT / "txlearn" / "checks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                yield path.name, node.value
            elif isinstance(node, ast.JoinedStr):
                yield path.name, "".join(v.value for v in node.values
                                         if isinstance(v, ast.Constant))


def _solution_lines():
    lines = set()
    for source in sorted((ROOT / "exercises" / "source").glob("[0-9][0-9]_*.py")):
        for line in build.solution_texts(source):
            code = line.split("#")[0].strip()
            if len(code) >= 12 and not code.startswith(("def ", "class ", "return self", "super(")):
                lines.add(code)
    return lines


def test_no_hint_contains_a_line_of_any_solution():
    solutions = _solution_lines()
    assert len(solutions) > 20
    squash = lambda s: re.sub(r"\s+", "", s)
    leaks = [(name, line) for name, text in _all_hint_strings() for line in solutions
             if squash(line) in squash(text)]
    assert not leaks, f"hints that give a solution line away: {leaks[:5]}"


def test_check_outside_a_notebook_raises_check_failure_with_level_one():
    def wrong(x, axis=-1):
        return x
    with pytest.raises(CheckFailure) as info:
        check("stable_softmax", wrong)
    assert info.value.exercise == "stable_softmax" and "Hint" in str(info.value)
