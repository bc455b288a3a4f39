"""What the class believes: per concept check, how many students chose each option, and the
misconception each wrong option stands for (the class report's concept section and its JSON).

Counting is over the run that counts for each student (the report's policy,
:func:`~txlearn.course.gradebook.store.counting`), from the results named ``concept:<id>``
(:mod:`~txlearn.course.grading.concept_answers`): their ``kind`` says the option chosen. The
question, the right answer and each misconception's name come from the course's key
(:func:`txlearn.checks.concepts.catalogue`); a check the key no longer has is shown by its id.

Source: the course's concept checks (``docs/concept_checks.md``).
"""

from __future__ import annotations

from collections import Counter

from txlearn.checks.concepts import MALFORMED, OTHER, UNANSWERED, catalogue
from txlearn.course.gradebook.pages import esc, table
from txlearn.course.gradebook.store import NotebookRow, counting

__all__ = ["concept_summary", "concept_section", "is_concept_result"]

_PREFIX = "concept:"


def is_concept_result(exercise: str) -> bool:
    """Whether a result row is a concept answer (``concept:<id>``), not a code exercise."""
    return exercise.startswith(_PREFIX)


def _label(entry: dict | None, choice: str) -> tuple[str, str]:
    """(what the option says, its misconception) of one choice of a check."""
    if entry is None:
        return "", ""
    if choice in (UNANSWERED, MALFORMED, "missing"):
        return {"missing": "not in the copy"}.get(choice, choice), ""
    if entry["kind"] == "choice":
        text = entry["options"].get(choice, "")
    else:
        text = "any other number" if choice == OTHER else ("the right value" if choice == "right"
                                                           else choice)
    right = choice == (entry["answer"] if entry["kind"] == "choice" else "right")
    wrong = entry["wrong"].get(choice, {})
    return text, "(right)" if right else wrong.get("misconception", "")


def concept_summary(rows: list[NotebookRow], set_name: str, policy: str = "latest") -> list[dict]:
    """Per concept check of ``set_name`` (course order): ``check``, ``question``, ``students``
    (who answered it in the run that counts), ``right``, and ``choices``: each option chosen by
    anyone, with ``students``, what it says and its ``misconception`` ("(right)" for the right
    one), most chosen first."""
    counted = [row for (_, s), row in sorted(counting(rows, policy).items())
               if s == set_name and row.status != "ERROR"]
    key = catalogue()
    chosen: dict[str, Counter] = {}
    for row in counted:
        for r in row.results:
            if is_concept_result(r.exercise):
                chosen.setdefault(r.exercise[len(_PREFIX):], Counter())[
                    r.kind.removeprefix(_PREFIX) or "?"] += 1
    order = [c for c in key if c in chosen] + sorted(c for c in chosen if c not in key)
    out = []
    for check in order:
        entry = key.get(check)
        counts = chosen[check]
        choices = []
        for choice, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            text, misconception = _label(entry, choice)
            choices.append({"choice": choice, "students": n, "says": text,
                            "misconception": misconception})
        out.append({"check": check, "question": entry["question"] if entry else "",
                    "students": sum(counts.values()),
                    "right": sum(c["students"] for c in choices if c["misconception"] == "(right)"),
                    "choices": choices})
    return out


def concept_section(checks: list[dict]) -> str:
    """The HTML of a set's concept checks in the class report ("" when it has none)."""
    if not checks:
        return ""
    parts = ["<h3>Concept checks: what the class believes</h3>"]
    for c in checks:
        parts.append(f"<p><b>{esc(c['check'])}</b>: {esc(c['question'])} "
                     f"({c['right']} of {c['students']} right)</p>")
        parts.append(table(["chose", "students", "it says", "misconception"],
                           [[x["choice"], x["students"], x["says"], x["misconception"]]
                            for x in c["choices"]], numeric={1}))
    return "\n".join(parts)
