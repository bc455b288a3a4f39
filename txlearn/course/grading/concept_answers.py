"""Grading a notebook's concept answers as data: one Result row per concept check of its set.

The grader never runs a concept cell (they are no course cells of the runner,
:func:`~txlearn.course.grading.sets.load_set`): it reads each answer cell's text from the
submitted JSON and judges it with :func:`txlearn.checks.concepts.parse_answer` and
:func:`~txlearn.checks.concepts.judge`, the same functions the learner's reveal cell uses.

One attempt counts: where the reveal cell's saved output records the first answer its kernel
judged (:data:`~txlearn.checks.concepts.ATTEMPT_MIME`, a plain letter or number), that answer is
graded, and the feedback says so when the cell now holds another; else the answer cell is. A
learner who clears that output can answer again: the record is good faith, not a lock (the course
file leaves concept checks ungraded unless the instructor weights them).

They are a Submission's ``concepts``, beside its ``results`` (the exercises). Rows: exercise
``concept:<id>`` (``concept:01.var-growth``), status PASS (right) or FAIL (wrong,
unanswered, malformed, or missing from the copy), ``max_points`` 0 (the gradebook applies the
course file's weight), ``kind`` ``concept:<choice>`` (the option chosen, ``unanswered``,
``malformed`` or ``missing``), the misconception as the hint, the judgement as the feedback.
"""

from __future__ import annotations

from txlearn.checks import clean
from txlearn.checks.concepts import ATTEMPT_MIME, catalogue, judge, parse_answer, variable
from txlearn.course.concepts import ANSWER_TAG, REVEAL_TAG
from txlearn.course.grading.reports import Result
from txlearn.course.grading.submission import cell_text

__all__ = ["concept_results", "first_attempt", "PREFIX", "MISSING"]

PREFIX = "concept:"
MISSING = ("not in your copy: run make lab (it adds the lesson's concept checks to your copy and "
           "keeps your answers)")


def _cells_of(nb: dict, tag: str) -> dict[str, dict]:
    """{check id: the first code cell tagged ``tag`` that names it} of a submission's JSON."""
    out: dict[str, dict] = {}
    for cell in nb.get("cells", []):
        meta = cell.get("metadata", {})
        check = meta.get("concept")
        if cell.get("cell_type") == "code" and isinstance(check, str) and \
                tag in meta.get("tags", []):
            out.setdefault(check, cell)
    return out


def first_attempt(cell: dict | None, check_id: str):
    """The first answer a reveal cell's saved output records for ``check_id`` (a str, int or
    float), else None. Anything else in the output is ignored."""
    outputs = cell.get("outputs") if isinstance(cell, dict) else None
    for output in outputs if isinstance(outputs, list) else []:
        data = output.get("data") if isinstance(output, dict) else None
        record = data.get(ATTEMPT_MIME) if isinstance(data, dict) else None
        if isinstance(record, dict) and record.get("check") == check_id:
            first = record.get("first")
            if isinstance(first, (str, int, float)) and not isinstance(first, bool) and \
                    len(str(first)) <= 40:
                return first
    return None


def concept_results(nb: dict, set_name: str, student: str, notebook: str) -> list[Result]:
    """The Result rows of the concept checks that close set ``set_name`` (those of the lesson
    of its name, or of the one lesson it follows: the key's ``set``) in the submission ``nb``
    (its JSON, already checked by :func:`~txlearn.course.grading.submission.read_notebook`), in
    the lesson's order; [] for a set whose lesson has none. Never runs anything; never raises
    for what a notebook holds."""
    answers, reveals = _cells_of(nb, ANSWER_TAG), _cells_of(nb, REVEAL_TAG)
    rows = []
    for check_id, entry in catalogue().items():
        if entry.get("set", entry["lesson"]) != set_name:
            continue
        row = Result(student, notebook, PREFIX + check_id, max_points=0)
        rows.append(row)
        if check_id not in answers:
            row.kind, row.feedback = f"{PREFIX}missing", MISSING
            continue
        value, why = parse_answer(cell_text(answers[check_id])[:20_000], variable(check_id))
        first = first_attempt(reveals.get(check_id), check_id)
        note = ""
        if first is not None and (why or first != value):
            now = "something malformed" if why else repr(value)[:40]
            note = f" (your first answer, {first!r}, counts; the cell now holds {now})"
            value, why = first, ""
        verdict = judge(check_id, value, why)
        row.status = "PASS" if verdict.right else "FAIL"
        row.kind = PREFIX + verdict.choice
        row.hints = (verdict.misconception,) if verdict.misconception else ()
        row.feedback = clean(verdict.text + note, 600)
    return rows
