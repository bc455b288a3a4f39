"""The gradebook's parts that need no grading: the similarity ranking (normalising names, comments
and layout; identical wrong answers above identical right ones), the course file's rules and
errors, and the pages' escaping of learner-made names."""

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.test_gradebook_store import row
from txlearn.course.gradebook import load_course, normalise, similar_pairs
from txlearn.course.gradebook.course import CourseFileError, Penalty
from txlearn.course.gradebook.feedback import late_text
from txlearn.course.gradebook.pages import esc, slug
from txlearn.course.gradebook.similarity import DISCLAIMER, similarity_page
from txlearn.course.gradebook.store import ResultRow

RIGHT = ("import numpy as np\n\ndef softmax(x, axis=-1):\n"
         "    z = x - x.max(axis=axis, keepdims=True)\n    e = np.exp(z)\n"
         "    return e / e.sum(axis=axis, keepdims=True)\n")
RIGHT_RARE = ("import numpy as np\ndef softmax(x, axis=-1):\n"
              "    e = np.exp(x - np.max(x, axis=axis, keepdims=True))\n"
              "    total = np.sum(e, axis=axis, keepdims=True)\n    return e / total\n")
WRONG = ("import numpy as np\ndef softmax(x, axis=-1):\n    e = np.exp(x)\n"
         "    return e / e.sum(axis=axis, keepdims=True)\n")
# the same wrong answer: other names, a comment, a docstring, other layout and quotes
WRONG_DISGUISED = ('import numpy as np\n\n\ndef softmax(logits, axis = -1):\n'
                   '    """My softmax."""\n'
                   '    # exponentiate every logit\n'
                   '    ex = np.exp( logits )\n'
                   '    return ex / ex.sum(axis=axis,keepdims=True)   # normalise\n')


def test_normalising_removes_names_comments_docstrings_and_layout_only():
    assert normalise(WRONG) == normalise(WRONG_DISGUISED)
    assert normalise(WRONG) != normalise(RIGHT)
    assert normalise(RIGHT) != normalise(RIGHT_RARE)
    # what the code reads (np, attributes) is not renamed: another library is another answer
    assert normalise(WRONG) != normalise(WRONG.replace("np.exp", "np.expm1"))
    assert normalise("def f(:\n  pass") == normalise("def f( :\n    pass  # x")   # unparsed


def _class(answers: dict[str, tuple[str, str]]):
    rows = []
    for i, (student, (source, status)) in enumerate(sorted(answers.items())):
        r = row("run", student, i, n_results=0)
        r.results = [ResultRow("stable_softmax", status, int(status == "PASS"), 1,
                               mistake="" if status == "PASS" else "softmax.HINT_NO_SHIFT")]
        r.answers = {"stable_softmax": source}
        rows.append(r)
    return rows


def test_identical_wrong_answers_rank_above_identical_right_ones_and_common_ones_are_not_paired():
    answers = {f"common{i}": (RIGHT, "PASS") for i in range(6)}      # 6 of 10: not paired
    answers.update({"rare1": (RIGHT_RARE, "PASS"), "rare2": (RIGHT_RARE, "PASS"),
                    "wrong1": (WRONG, "FAIL"), "wrong2": (WRONG_DISGUISED, "FAIL")})
    pairs = similar_pairs(_class(answers))
    assert [p["students"] for p in pairs] == [("wrong1", "wrong2"), ("rare1", "rare2")]
    # log2(10 / 2) = 2.32 bits, doubled for a wrong answer; both answers are 20+ tokens
    assert pairs[0]["score"] == pytest.approx(2 * 2.3219, abs=1e-3)
    assert pairs[1]["score"] == pytest.approx(2.3219, abs=1e-3)
    assert pairs[0]["shared"][0]["answers"] == (WRONG, WRONG_DISGUISED)
    html = similarity_page(pairs, policy="latest", generated="now", source="class.db")
    assert esc(DISCLAIMER) in html and "# exponentiate every logit" in html   # the originals


def test_an_answer_too_deep_for_the_name_binder_still_gets_its_page():
    # `_pad = 0+0+...+0` parses (the parser builds the sum in a loop) but is 500 to 2,000
    # BinOp nodes deep: the name binder recursed past the interpreter's limit, outside the guard
    # of parse and unparse, and `txlearn similarity` died with no page for the class
    for n in (500, 2000):
        assert normalise("_pad = " + "+".join(["0"] * n)).startswith("unparsed: _pad = 0 + 0")
    deep = "_pad = " + "+".join(["0"] * 2000) + "\n" + WRONG
    answers = {"a": (RIGHT, "PASS"), "b": (RIGHT_RARE, "PASS"), "c": (RIGHT_RARE, "PASS"),
               "d": (RIGHT, "PASS"), "deep1": (deep, "FAIL"), "deep2": (deep, "FAIL")}
    pairs = similar_pairs(_class(answers))
    assert [p["students"] for p in pairs] == [("deep1", "deep2"), ("a", "d"), ("b", "c")]
    html = similarity_page(pairs, policy="latest", generated="now", source="class.db")
    assert "_pad = 0+0+0" in html


def test_stubs_are_never_paired():
    stub = "def softmax(x, axis=-1):\n    raise NotImplementedError\n"
    rows = _class({f"s{i}": (stub, "FAIL") for i in range(4)} | {"a": (WRONG, "FAIL")})
    for r in rows[1:]:
        r.results[0].mistake = "stub"
    assert similar_pairs(rows) == []


COURSE = """\
timezone: Europe/Berlin
penalty: {per_day: 0.25, max: 0.6, grace_minutes: 30}
sets: {01_softmax: "2026-10-05 23:59", 02_attention: {deadline: 2026-10-12}}
extensions: {ann: {01_softmax: 36 hours}, ben: {all: "2026-11-01T12:00:00Z"}}
"""


def test_the_course_file_gives_deadlines_extensions_and_the_penalty(tmp_path):
    (tmp_path / "course.yaml").write_text(COURSE)
    course = load_course(tmp_path / "course.yaml")
    berlin = course.deadlines["01_softmax"]
    assert berlin.astimezone(timezone.utc) == datetime(2026, 10, 5, 21, 59, tzinfo=timezone.utc)
    assert course.deadlines["02_attention"] == datetime(2026, 10, 13, tzinfo=berlin.tzinfo)
    # a date alone: the end of that day, the midnight that starts the next
    assert course.deadline("ann", "01_softmax") == berlin + timedelta(hours=36)
    assert course.deadline("ben", "02_attention") == datetime(2026, 11, 1, 12,
                                                              tzinfo=timezone.utc)
    rule = course.penalty
    assert [rule.fraction(s) for s in (0, 29 * 60, 31 * 60, 86400, 86401, 10 * 86400)] == \
        [0, 0, 0.25, 0.25, 0.5, 0.6]
    assert Penalty().fraction(10 * 86400) == 0                     # no rule: no penalty


@pytest.mark.parametrize("text,words", [
    ("penalty: {perday: 0.1}", "unknown key 'perday' (did you mean per_day?)"),
    ("sets: {01_softmax: next tuesday}", "sets.01_softmax.deadline: 'next tuesday' is not a date"),
    ("penalty: {per_day: 2}", "penalty.per_day: 2 is not a number from 0 to 1"),
    ("policy: worst", "policy 'worst': use latest or best"),
    ("timezone: Mars/Olympus", "not a time zone"),
    ("extensions: {ann: {all: soon}}", "neither extra time"),
    ("sets: [1, 2", "not YAML"),
])
def test_a_course_file_mistake_is_named_with_its_key(tmp_path, text, words):
    (tmp_path / "course.yaml").write_text(text)
    with pytest.raises(CourseFileError) as err:
        load_course(tmp_path / "course.yaml")
    assert words in str(err.value) and "course.yaml" in str(err.value)


def test_a_manifest_without_its_columns_is_refused(tmp_path):
    (tmp_path / "course.yaml").write_text("manifest: got.csv\n")
    (tmp_path / "got.csv").write_text("name,when\nann,2026-10-01\n")
    with pytest.raises(CourseFileError, match="no column student, set, submitted_at"):
        load_course(tmp_path / "course.yaml")


def test_learner_made_folder_names_become_safe_distinct_file_names():
    assert slug("alice") == "alice"
    odd = [slug(s) for s in ("../../etc", "a/b", "a?b", "<script>", ".hidden")]
    assert all("/" not in s and not s.startswith(".") and "<" not in s for s in odd)
    assert len(set(odd)) == len(odd) and slug("a?b") != slug("a_b")


def test_windows_device_names_are_no_folder_or_file_name():
    # a student folder named CON, aux or nul.txt became a feedback folder and a Gradescope
    # folder of that name: a zip holding them cannot be extracted on Windows
    from txlearn.course.gradebook.pages import folders
    devices = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)),
               *(f"LPT{i}" for i in range(1, 10))}
    names = ["CON", "aux", "nul.txt", "Com1.ipynb", "lpt9", "alice.", "console", "auxiliary"]
    for name, folder in folders(names).items():
        assert folder.split(".")[0].upper() not in devices and not folder.endswith("."), folder
    assert slug("console") == "console" and slug("auxiliary") == "auxiliary"


def test_line_separators_and_bidi_controls_are_written_out():
    # U+2028 and U+2029 survived the cleaning: str.splitlines breaks there, so a forged
    # "Hint:" line showed in the table and the CSV; a right-to-left override (U+202E) reversed a
    # student's name in the table, the CSV and the pages
    from txlearn.checks import clean
    from txlearn.course.grading.reports import Result, Submission, table
    marks = [0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F,
             0x61C]
    for mark in marks:
        text = f"wrong{chr(mark)}Hint: the forged one"
        assert clean(text) == f"wrong\\u{mark:04x}Hint: the forged one", hex(mark)
        assert f"\\u{mark:04x}" in esc(text) and chr(mark) not in esc(text)
    name = "\u202eecila"
    sub = Submission(path=Path(name) / "01_softmax.ipynb", student=name, set_name="01_softmax",
                     results=[Result(name, "01_softmax.ipynb", "stable_softmax", "FAIL", 0, 1,
                                     feedback=clean("x\u2028Hint: the forged one"))])
    shown = table([sub])
    assert "\\u202eecila" in shown and "\u202e" not in shown
    assert not any(line.lstrip().startswith("Hint: the forged") for line in shown.splitlines())


def test_lateness_reads_in_days_hours_and_minutes():
    assert [late_text(s) for s in (0, 59, 3600 * 3 + 1200, 86400 * 2 + 3600 * 4)] == \
        ["on time", "1 min late", "3 h 20 min late", "2 days 4 h late"]
