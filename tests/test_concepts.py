"""Concept checks: every lesson has them, each wrong option's explanation is shown for that option
when the generated cells run in a real kernel, a right answer is confirmed, malformed answers get a
clear message, and the source format is validated by the build."""

import json
import math
import re

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

from txlearn.checks.concepts import (ATTEMPT_MIME, OTHER, catalogue, judge, parse_answer,
                                     variable)
from txlearn.course import build, concepts

ROOT = build.ROOT
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py"))
COURSE_LESSONS = [p.stem for p in LESSONS if "00" <= p.stem[:2] <= "10"]   # 11_tokens: its own


def _value(key):
    """A catalogued wrong value of a numeric check, as the learner would write it."""
    number = float(key)
    return int(number) if number.is_integer() else number


def _wrong_answers(entry):
    """(value, its wrong entry) for every wrong option of a check (numeric: and another number)."""
    if entry["kind"] == "choice":
        return [(k, w) for k, w in entry["wrong"].items()]
    out = [(_value(k), w) for k, w in entry["wrong"].items() if k != OTHER]
    return out + [(12345.678, entry["wrong"][OTHER])]


def test_every_lesson_00_to_10_has_three_to_six_concept_checks():
    key = catalogue()
    assert len(COURSE_LESSONS) == 11
    for stem in COURSE_LESSONS:
        mine = [c for c, e in key.items() if e["lesson"] == stem]
        assert 3 <= len(mine) <= 6, (stem, mine)
        nb = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
        asked = [c.metadata["concept"] for c in nb.cells
                 if concepts.ANSWER_TAG in c.metadata.get("tags", [])]
        assert asked == mine, stem                       # each one asked in the lesson, in order


def test_the_key_matches_the_lessons_and_holds_every_wrong_explanation():
    # the generated key is what the lesson sources give (txlearn build --check keeps it so)
    built, graded_in = [], build.concept_sets()    # each lesson's checks close one set's notebook
    for path in LESSONS:
        built += [dict(c, set=graded_in.get(path.stem, "")) for c in build.lesson_concepts(path)]
    assert graded_in["01_softmax"] == "01_softmax" and graded_in["11_tokens"] == "12_tokens"
    assert "00_map" not in graded_in                      # lesson 00 has no set: ungraded
    assert json.loads(concepts.key_text(built)) == json.loads(
        (ROOT / "txlearn" / "checks" / "concepts.json").read_text(encoding="utf-8"))
    for entry in catalogue().values():
        if entry["kind"] == "choice":
            assert set(entry["wrong"]) == set(entry["options"]) - {entry["answer"]}, entry["id"]
        for w in entry["wrong"].values():
            assert w["misconception"] and len(w["explain"]) > 20 and w["see"], entry["id"]


@pytest.mark.parametrize("check_id", sorted(catalogue()))
def test_judging_each_option(check_id):
    entry = catalogue()[check_id]
    right = judge(check_id, entry["answer"])
    assert right.right and right.text.startswith("**Right") and entry["right"] in right.text
    for value, wrong in _wrong_answers(entry):
        verdict = judge(check_id, value)
        assert verdict.status == "wrong", (check_id, value)
        assert wrong["misconception"] in verdict.text and wrong["explain"] in verdict.text
        assert wrong["see"] in verdict.text                      # where the lesson measured it


def test_numbers_count_within_the_tolerance_only():
    # 01.std-at-64: 8 within 0.5; 64 is the variance (catalogued), 9 is some other number
    assert judge("01.std-at-64", 8.4).right and judge("01.std-at-64", 8).right
    assert judge("01.std-at-64", 64).misconception == "Variance given for the standard deviation"
    assert judge("01.std-at-64", 9).choice == OTHER
    assert judge("02.causal-pairs", 21).right and judge("02.causal-pairs", 15).choice == "15"
    assert judge("01.var-growth", " B ").right              # a letter, any case, spaces around


@pytest.mark.parametrize("source,why", [
    ('answer_std_at_64 = "8"', "expects a number"),                        # a string, not 8
    ("answer_std_at_64 = True", "expects a number"),
    ('answer_std_at_64 = __import__("os").system("id")', "plain value"),   # code: never run
    ("import os\nanswer_std_at_64 = 8", "one line"),
    ("answer_std_at_64 = 8; print(1)", "one line"),
    ("answer_std_at_64 = (", "not valid Python"),
    ("x = 8", "one line"),
    ("answer_std_at_64 = [8]", "expects a number"),
    ("answer_std_at_64 = float('nan')", "plain value"),
    ("answer_std_at_64 = 1e999", "expects a number"),                       # inf is no answer
    ("answer_std_at_64 = " + "9" * 400, "expects a number"),                # past float's range
])
def test_malformed_answers_are_named_never_run_and_never_crash(source, why):
    value, complaint = parse_answer(source, "answer_std_at_64")
    verdict = judge("01.std-at-64", value, complaint)
    assert verdict.status == "malformed" and why in verdict.text, verdict.text
    assert verdict.text.startswith("**Not judged:**")


def test_a_choice_outside_the_options_is_malformed():
    assert judge("01.var-growth", "e").status == "malformed"
    assert "'a', 'b', 'c', 'd'" in judge("01.var-growth", 2).text
    assert judge("01.var-growth", None).status == "unanswered"


def _generated(stem):
    """The answer and reveal cells of each check in a lesson notebook, by check id."""
    nb = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
    cells = {}
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if concepts.ANSWER_TAG in tags or concepts.REVEAL_TAG in tags:
            cells.setdefault(cell.metadata["concept"], []).append(cell.source)
    return cells


def test_the_generated_cells_show_each_explanation_in_a_kernel():
    """Every check of every lesson, run as generated in one kernel: unanswered first (it says so
    and fails nothing), then each wrong option (its own explanation, and after the first that
    the first answer stands), then the right one (the confirmation)."""
    nb = nbformat.v4.new_notebook()
    expected = []
    for stem in COURSE_LESSONS:
        for check_id, (answer_src, reveal_src) in _generated(stem).items():
            entry = catalogue()[check_id]
            assert re.fullmatch(rf"{variable(check_id)} = None   # your answer: .*", answer_src)
            tries = [(None, None)] + _wrong_answers(entry) + [(entry["answer"], "right")]
            for value, what in tries:
                nb.cells.append(nbformat.v4.new_code_cell(
                    answer_src.replace("= None", f"= {value!r}", 1)))
                nb.cells.append(nbformat.v4.new_code_cell(reveal_src))
                expected.append((check_id, value, what, tries[1][0]))
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    reveals = nb.cells[1::2]
    assert len(reveals) == len(expected)
    for cell, (check_id, value, what, first) in zip(reveals, expected):
        assert [o.output_type for o in cell.outputs] == ["display_data"], (check_id, cell.outputs)
        data = cell.outputs[0].data
        text = data["text/markdown"]
        if what is None:
            assert text.startswith("*Not answered yet:*"), (check_id, text)
            assert data[ATTEMPT_MIME] == {"check": check_id, "first": None}
        elif what == "right":
            assert text.startswith("**Right") and catalogue()[check_id]["right"] in text
        else:
            assert what["misconception"] in text and what["explain"] in text, (check_id, value)
        if what is not None:
            assert data[ATTEMPT_MIME] == {"check": check_id, "first": first}   # one attempt
            assert ("that is the one that counts" in text) == (value != first), (check_id, value)


def _lesson(tmp_path, yaml_text, heading="## 1. The section"):
    path = tmp_path / "lessons" / "01_demo.py"
    path.parent.mkdir(exist_ok=True)
    body = "\n".join("# " + line if line else "#" for line in yaml_text.strip().splitlines())
    path.write_text(f"# %% [markdown]\n# {heading}\n\n# %%\nx = 1\n\n"
                    f'# %% [raw] concept="demo"\n{body}\n', encoding="utf-8")
    return path


GOOD = """
question: What is $1 + 1$?
kind: choice
options: {a: '1', b: '2'}
answer: b
section: '1.'
right: It is 2.
wrong:
  a: {misconception: Adding nothing, explain: One plus one adds the second one too.}
"""


def test_a_valid_source_builds_three_cells_in_place(tmp_path):
    nb = build.build_lesson(_lesson(tmp_path, GOOD), build.Layout(tmp_path))
    question, answer, reveal = nb.cells[-3:]
    assert question.cell_type == "markdown" and "$1 + 1$" in question.source
    assert "- **b.** 2" in question.source and "one attempt counts" in question.source
    assert answer.source.startswith("answer_demo = None")
    assert answer.metadata["concept"] == "01.demo"
    assert reveal.source.endswith("reveal('01.demo', answer_demo)")
    assert reveal.metadata["editable"] is False and concepts.REVEAL_TAG in reveal.metadata["tags"]
    assert "It is 2" not in json.dumps(nb)          # no answer key in the notebook


@pytest.mark.parametrize("change,message", [
    (("answer: b", "answer: c"), "answer must be one of the options"),
    (("  a: {misconception", "  z: {misconception"), "exactly the wrong options"),
    (("section: '1.'", "section: '2.'"), "0 headings before it start with '2.'"),
    (("kind: choice", "kind: essay"), "kind must be choice or numeric"),
    (("right: It is 2.", "right: ''"), "right: must be non-empty text"),
    (("question:", "questoin:"), "unknown keys"),
    (("explain: One plus one adds the second one too.", "see: '1.'"),
     "give misconception and explain"),
    (("options: {a: '1', b: '2'}", "options: {a: '1', b: '2'"), "not YAML"),
])
def test_a_malformed_source_is_a_build_error_naming_the_check(tmp_path, change, message):
    with pytest.raises(build.BuildError, match=re.escape(message)) as raised:
        build.build_lesson(_lesson(tmp_path, GOOD.replace(*change)), build.Layout(tmp_path))
    assert "lessons/01_demo.py, concept 'demo'" in str(raised.value)


def test_a_numeric_check_needs_other_and_values_outside_the_tolerance(tmp_path):
    numeric = """
question: How many?
kind: numeric
answer: 2
tolerance: 0.5
section: '1.'
right: Two.
wrong:
  1: {misconception: One short, explain: Count both of them here.}
  other: {misconception: Not counted, explain: Count them one by one here.}
"""
    checks = concepts.read_checks(jupytext.read(_lesson(tmp_path, numeric)), "01_demo")
    assert checks[0]["wrong"]["1"]["see"] == "1. The section" and checks[0]["tolerance"] == 0.5
    with pytest.raises(concepts.ConceptError, match="needs an entry 'other'"):
        concepts.read_checks(jupytext.read(_lesson(tmp_path, numeric.replace("  other:", "  3:"))),
                             "01_demo")
    with pytest.raises(concepts.ConceptError, match="within the tolerance"):
        concepts.read_checks(jupytext.read(_lesson(tmp_path, numeric.replace("  1:", "  2.4:"))),
                             "01_demo")


def test_right_answers_are_right_against_the_lessons_numbers():
    """A few keys recomputed from the formulas the lessons assert."""
    key = catalogue()
    assert key["03.cache-bytes"]["answer"] == 2 * 1 * 2 * 8 * 6 * 2 * 4
    assert key["08.stack-cache"]["answer"] == 2 * 6 * 8 * 64 * 512 * 8 * 2 / 2 ** 20
    assert key["10.smollm-cache"]["answer"] == 2 * 30 * 3 * 64 * 8192 * 2 / 2 ** 20
    assert key["03.head-parameters"]["answer"] == 4 * 64 * 65
    uniform = key["09.uniform-loss"]
    assert abs(uniform["answer"] - math.log(103)) < uniform["tolerance"]
    assert abs(key["07.smoothing-optimum"]["answer"] - (0.9 + 0.1 / 11)) < 1e-3
    assert key["02.causal-pairs"]["answer"] == 6 * 7 // 2
    assert key["01.overflow-start"]["answer"] == math.floor(math.log(3.4028235e38)) + 1
