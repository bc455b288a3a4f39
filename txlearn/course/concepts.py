"""Concept checks in the course's notebooks: read from the lessons' YAML cells, written as cells.

A lesson source marks a concept check with a raw cell whose metadata names it,
``# %% [raw] concept="var-growth"``, holding YAML (read with PyYAML's ``safe_load``; the whole
format is in ``docs/concept_checks.md``)::

    question: By what factor does $\\operatorname{Var}(q \\cdot k)$ grow when $d_k$ doubles?
    kind: choice              # or numeric (then: answer: 2, tolerance: 0.01)
    options: {a: "it stays 1", b: "2", c: "4"}
    answer: b
    section: "2."             # the heading (its start) of the section that measured it
    right: Var(q.k) = d_k ... (the confirmation)
    wrong:                    # one entry per wrong option (numeric: per catalogued value, + other)
      a: {misconception: "...", explain: "...", see: "2."}   # see: defaults to section
      c: {...}

:func:`read_checks` validates every cell (BuildError naming the lesson, the check and the key);
:func:`check_cells` gives the three generated cells of a check (the Markdown question, the answer
cell ``answer_<name> = None`` the learner edits, the locked reveal cell calling
:func:`txlearn.checks.concepts.reveal`); :func:`key_text` the key ``txlearn/checks/concepts.json``
(the right answers stay in the package, never in a notebook); :func:`merge_concepts` brings new
checks into a learner's copy of a set notebook without touching any answer.

Where a learner answers: in the lesson (to try; ungraded), and in their copy of the lesson's
exercise set, ``work/NN_name.ipynb``, where the same checks close the notebook and are graded.
"""

from __future__ import annotations

import copy
import json
import re

import nbformat
import yaml

from txlearn.checks.concepts import OTHER, variable

__all__ = ["read_checks", "check_cells", "section_cells", "key_text", "merge_concepts",
           "is_concept", "is_concept_cell", "concept_id", "ConceptError", "ANSWER_TAG",
           "REVEAL_TAG", "HEADING_ID"]

ANSWER_TAG, REVEAL_TAG = "concept-answer", "concept-reveal"
HEADING_ID = "concept-checks"
_SLUG = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_LETTER = re.compile(r"^[a-h]$")
_KEYS = {"question", "kind", "options", "answer", "tolerance", "section", "right", "wrong"}
_WRONG_KEYS = {"misconception", "explain", "see"}


class ConceptError(ValueError):
    """A concept cell breaks the format (the message names the lesson, the check, the key)."""


def is_concept(cell) -> bool:
    """A lesson source's concept cell (raw, with ``concept="name"`` metadata)."""
    return cell.cell_type == "raw" and bool(cell.metadata.get("concept"))


def is_concept_cell(cell) -> bool:
    """A generated concept cell (question, answer or reveal; or the set's heading of them)."""
    return str(cell.get("id", "")).startswith("concept-")


def concept_id(stem: str, name: str) -> str:
    """The course-wide id of check ``name`` of lesson ``stem``: ``01_softmax``, ``var-growth``
    -> ``01.var-growth``."""
    return f"{stem[:2]}.{name}"


def _headings(cells) -> list[str]:
    found = []
    for cell in cells:
        if cell.cell_type == "markdown":
            found += [m.strip() for m in re.findall(r"^#{2,3}\s+(.+)$", cell.source, re.M)]
    return found


def _section(where: str, start, headings: list[str]) -> str:
    """The heading that starts with ``start`` among those before the check (else ConceptError)."""
    if not isinstance(start, str) or not start.strip():
        raise ConceptError(f"{where}: a section is the start of a heading before it (text)")
    hits = [h for h in headings if h.startswith(start.strip())]
    if len(hits) != 1:
        raise ConceptError(f"{where}: {len(hits)} headings before it start with {start!r} "
                           f"(need exactly one)")
    return hits[0]


def _text(where: str, value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConceptError(f"{where}: must be non-empty text")
    return value.strip()


def _wrong(where: str, value, headings: list[str], default: str) -> dict:
    if not isinstance(value, dict) or set(value) - _WRONG_KEYS or \
            not {"misconception", "explain"} <= set(value):
        raise ConceptError(f"{where}: give misconception and explain (and optionally see)")
    see = _section(f"{where}.see", value["see"], headings) if "see" in value else default
    return {"misconception": _text(f"{where}.misconception", value["misconception"]),
            "explain": _text(f"{where}.explain", value["explain"]), "see": see}


def _number(where: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConceptError(f"{where}: must be a number")
    return value


def _entry(stem: str, name: str, data, headings: list[str]) -> dict:
    where = f"lessons/{stem}.py, concept {name!r}"
    if not _SLUG.match(name):
        raise ConceptError(f"{where}: a name is lower-case words joined by hyphens")
    if not isinstance(data, dict):
        raise ConceptError(f"{where}: the cell must hold a YAML mapping")
    unknown = set(data) - _KEYS
    if unknown:
        raise ConceptError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(_KEYS)}")
    kind = data.get("kind")
    section = _section(f"{where}: section", data.get("section"), headings)
    entry = {"id": concept_id(stem, name), "lesson": stem, "kind": kind,
             "question": _text(f"{where}: question", data.get("question")),
             "section": section, "right": _text(f"{where}: right", data.get("right"))}
    wrong = data.get("wrong")
    if not isinstance(wrong, dict) or not wrong:
        raise ConceptError(f"{where}: wrong must map each wrong option to its misconception")
    if kind == "choice":
        options = data.get("options")
        if not isinstance(options, dict) or len(options) < 2 or \
                not all(isinstance(k, str) and _LETTER.match(k) for k in options):
            raise ConceptError(f"{where}: options must map letters a, b, ... to their text")
        if data.get("answer") not in options:
            raise ConceptError(f"{where}: answer must be one of the options {sorted(options)}")
        if "tolerance" in data:
            raise ConceptError(f"{where}: a choice has no tolerance")
        expected = set(options) - {data["answer"]}
        if set(wrong) != expected:
            raise ConceptError(f"{where}: wrong must have exactly the wrong options "
                               f"{sorted(expected)}, has {sorted(map(str, wrong))}")
        entry.update(options={k: _text(f"{where}: options.{k}", str(options[k]))
                              for k in sorted(options)}, answer=data["answer"])
        entry["wrong"] = {k: _wrong(f"{where}: wrong.{k}", wrong[k], headings, section)
                          for k in sorted(wrong)}
    elif kind == "numeric":
        answer = _number(f"{where}: answer", data.get("answer"))
        tolerance = _number(f"{where}: tolerance", data.get("tolerance", 0))
        if tolerance < 0 or "options" in data:
            raise ConceptError(f"{where}: a numeric check has a tolerance >= 0 and no options")
        if OTHER not in wrong:
            raise ConceptError(f"{where}: wrong needs an entry {OTHER!r} (any other number)")
        entry.update(answer=answer, tolerance=tolerance, wrong={})
        for key, value in wrong.items():
            if key != OTHER:
                value_of = _number(f"{where}: wrong key {key!r}", key)
                if abs(value_of - answer) <= tolerance:
                    raise ConceptError(f"{where}: wrong value {key} is within the tolerance")
            entry["wrong"][str(key)] = _wrong(f"{where}: wrong.{key}", value, headings, section)
    else:
        raise ConceptError(f"{where}: kind must be choice or numeric, not {kind!r}")
    return entry


def read_checks(src, stem: str) -> list[dict]:
    """The concept checks of a parsed lesson source (jupytext), in order, each validated
    against the headings that come before it. Raises ConceptError."""
    checks, seen = [], set()
    for i, cell in enumerate(src.cells):
        if not is_concept(cell):
            continue
        name = str(cell.metadata["concept"])
        if name in seen:
            raise ConceptError(f"lessons/{stem}.py: concept {name!r} appears twice")
        seen.add(name)
        try:
            data = yaml.safe_load(cell.source)
        except yaml.YAMLError as err:
            first = (str(err).splitlines() or [""])[0]
            raise ConceptError(f"lessons/{stem}.py, concept {name!r}: not YAML ({first})") \
                from None
        checks.append(_entry(stem, name, data, _headings(src.cells[:i])))
    return checks


def _question_text(c: dict, number: int) -> str:
    var = variable(c["id"])
    lines = [f"**Concept check {c['id']}** ({number}; one attempt counts)", "", c["question"], ""]
    if c["kind"] == "choice":
        lines += [f"- **{k}.** {text}" for k, text in c["options"].items()]
        example = f'{var} = "{next(iter(c["options"]))}"'
        lines += ["", f"Answer in the cell below with a letter in quotes (`{example}`), then run "
                      f"the cell after it."]
    else:
        lines += [f"Answer in the cell below with a number (`{var} = 3.5`), then run the cell "
                  f"after it (within {c['tolerance']:g} counts)."]
    return "\n".join(lines)


def check_cells(c: dict, number: int, solved: bool = False) -> list:
    """The three cells of check ``c`` (an entry of :func:`read_checks`), ``number`` its place in
    the lesson: the question, the answer cell (``answer_<name> = None``; the right answer with
    ``solved``, for the instructor's solutions) and the locked reveal cell."""
    base = f"concept-{c['id'].replace('.', '-')}"
    var = variable(c["id"])
    question = nbformat.v4.new_markdown_cell(_question_text(c, number))
    question.id = f"{base}-question"
    value = repr(c["answer"]) if solved else "None"
    hint = ", ".join(f'"{k}"' for k in c.get("options", {})) or "a number"
    answer = nbformat.v4.new_code_cell(f"{var} = {value}   # your answer: {hint}")
    answer.id, answer.metadata = f"{base}-answer", {"tags": [ANSWER_TAG], "concept": c["id"]}
    show = nbformat.v4.new_code_cell(f"from txlearn.checks.concepts import reveal\n"
                                     f"reveal({c['id']!r}, {var})")
    show.id = f"{base}-reveal"
    show.metadata = {"tags": [REVEAL_TAG], "concept": c["id"], "editable": False,
                     "deletable": False}
    return [question, answer, show]


def section_cells(stem: str, checks: list[dict], solved: bool = False) -> list:
    """What closes set ``stem``'s notebook: a heading, then every check of its lesson (the graded
    copies of the checks the lesson asks in place)."""
    if not checks:
        return []
    head = nbformat.v4.new_markdown_cell(
        f"## Concept checks of lesson {stem[:2]}\n\nThe questions lesson {stem[:2]} "
        f"(`notebooks/{stem}.ipynb`) asks at the end of its sections, graded here: one "
        f"attempt counts (the first answer the cell under each judges). Your answers are data "
        f"(a letter in quotes, or a number); the grader reads them and never runs them.")
    head.id = HEADING_ID
    cells = [head]
    for number, c in enumerate(checks, start=1):
        cells += check_cells(c, number, solved)
    return cells


def key_text(checks: list[dict]) -> str:
    """The text of ``txlearn/checks/concepts.json``: every check of the course, in lesson
    order (deterministic JSON)."""
    return json.dumps({"generated": "by txlearn build from the concept cells of lessons/*.py: "
                                    "edit those, not this file", "checks": checks},
                      indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def merge_concepts(work, course) -> tuple[list[str], int]:
    """Bring into ``work`` (a learner's copy, changed in place) the concept cells of ``course``
    (the current student notebook) that it lacks, each after the concept cell before it in the
    course (else at the end); refresh the text of question and reveal cells that changed (course
    text). Answer cells already in the copy are never changed. Returns the ids of the checks
    added and the number of cells refreshed."""
    ours = [c for c in course.cells if is_concept_cell(c)]
    index = {c.get("id"): i for i, c in enumerate(work.cells)}
    added, previous, refreshed = [], None, 0
    for cell in ours:
        cid = cell.get("id")
        if cid in index:
            mine = work.cells[index[cid]]
            if ANSWER_TAG not in cell.metadata.get("tags", []) and mine.source != cell.source:
                mine.source = cell.source
                refreshed += 1
        else:
            at = index[previous] + 1 if previous in index else len(work.cells)
            work.cells.insert(at, copy.deepcopy(cell))
            index = {c.get("id"): i for i, c in enumerate(work.cells)}
            if ANSWER_TAG in cell.metadata.get("tags", []):
                added.append(cell.metadata["concept"])
        previous = cid
    return added, refreshed
