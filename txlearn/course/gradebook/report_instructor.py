"""The class report's instructor view: who made each mistake, who did not submit, and a later
set's failure shown under the earlier set that caused it (the notebooks that could not be graded,
with their reasons, are the report's own ``not_graded_notebooks``).

:func:`instructor_view` computes, per set, over the run that counts for each student:

- ``mistakes``: each (exercise, mistake identifier) that fired, with the students it fired on
  (their folder names, sorted);
- ``not_submitted``: the students of the roster (the course file's; without one, every student
  the gradebook holds a notebook of, stated as such in ``roster_from``) who have no notebook of
  the set;
- ``caused_here``: failures of *later* sets whose cause is an exercise of this set. A check that
  fails because an answer it uses fails says ``needs:<exercise>`` (the mistake identifier,
  :mod:`~txlearn.course.gradebook.mistakes`); that chain is followed through the student's own
  notebooks (set 09's ``char_model`` needs ``language_model``, which needs set 07's
  ``transformer_layer``, which needs set 03's ``multi_head_attention``) to the first exercise that
  failed for a reason of its own, and the failure is listed under that exercise's set, with the
  mistake it made there. A chain whose cause was not graded (its notebook is not in the gradebook)
  stops at the last exercise known and says so.

:func:`instructor_section` is its HTML (every text escaped). Source: issue 36 ("The report names
no one").
"""

from __future__ import annotations

from collections import defaultdict

from txlearn.course.gradebook import mistakes as mistake_ids
from txlearn.course.gradebook.pages import esc, table
from txlearn.course.gradebook.store import NotebookRow

__all__ = ["instructor_view", "instructor_section", "root_cause"]

MAX_CHAIN = 12      # links followed from a failure to its cause (a cycle stops there)


def _course_sets() -> dict[str, str]:
    """{exercise: its set} from the course's exercise sources (for an exercise no recorded
    notebook holds: the cause of a chain whose earlier set was never graded)."""
    from txlearn.course import build

    out: dict[str, str] = {}
    for source in sorted(build.Layout().exercise_sources.glob("[0-9][0-9]_*.py")):
        for name in build.exercise_names(build.read_source(source), source.name):
            out.setdefault(name, source.stem)
    return out


def _set_of_exercise(rows: list[NotebookRow]) -> dict[str, str]:
    """{exercise: the set that grades it}, from the recorded rows (the set whose notebook holds
    a result of it; an exercise recorded under two sets keeps the first set in name order), then
    from the course's sources for an exercise a chain names that no row holds."""
    needed = {r.mistake.removeprefix("needs:") for row in rows for r in row.results
              if r.mistake.startswith("needs:")}
    out: dict[str, str] = {}
    for row in sorted(rows, key=lambda r: r.set_name):
        for r in row.results:
            if r.exercise != "-":
                out.setdefault(r.exercise, row.set_name)
    if needed - set(out) - {"earlier"}:
        for name, set_name in _course_sets().items():
            out.setdefault(name, set_name)
    return out


def root_cause(student: str, set_name: str, exercise: str,
               counted: dict[tuple[str, str], NotebookRow],
               where: dict[str, str]) -> tuple[str, str, str, list[str]]:
    """The first failure of its own behind a failed exercise: ``(set, exercise, mistake,
    chain)``, following ``needs:<exercise>`` through the student's counted notebooks; ``chain``
    lists each ``set/exercise`` passed through, the failure itself first. The mistake is ``""``
    when the cause's notebook is not in the gradebook (or it passed there)."""
    chain, seen = [], set()
    current_set, current = set_name, exercise
    for _ in range(MAX_CHAIN):
        chain.append(f"{current_set}/{current}")
        seen.add((current_set, current))
        row = counted.get((student, current_set))
        r = None if row is None or row.status == "ERROR" else \
            next((x for x in row.results if x.exercise == current), None)
        if r is None or r.status != "FAIL":
            return current_set, current, "", chain
        if not r.mistake.startswith("needs:"):
            return current_set, current, r.mistake, chain
        following = r.mistake.removeprefix("needs:")
        following_set = where.get(following, current_set)
        if following == "earlier" or (following_set, following) in seen:
            return current_set, current, r.mistake, chain
        current_set, current = following_set, following
    return current_set, current, "", chain


def instructor_view(rows: list[NotebookRow], counted: dict[tuple[str, str], NotebookRow],
                    roster=None) -> dict:
    """The instructor view's numbers (module docstring), per set name.

    ``counted``: the run that counts per (student, set)
    (:func:`~txlearn.course.gradebook.store.counting`); ``roster``: the course file's student
    names (NFC, as recorded), or None to use every student of the gradebook."""
    where = _set_of_exercise(rows)
    everyone = sorted({s for s, _ in counted})
    names = sorted(roster) if roster else everyone
    sets = sorted({s for _, s in counted})
    out = {"roster_from": "the course file's roster" if roster else
           "every student with a notebook in the gradebook (no roster in the course file)",
           "sets": {s: {"mistakes": [], "not_submitted": [], "caused_here": []} for s in sets}}
    by_mistake: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    caused: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for (student, set_name), row in sorted(counted.items()):
        if row.status == "ERROR":
            continue
        for r in row.results:
            if r.status != "FAIL" or mistake_ids.is_unanswered(r.mistake):
                continue
            by_mistake[(set_name, r.exercise, r.mistake)].append(student)
            if r.mistake.startswith("needs:"):
                cause_set, cause, mistake, chain = root_cause(student, set_name, r.exercise,
                                                              counted, where)
                if cause_set != set_name:
                    caused[(cause_set, cause, mistake)].append(
                        {"student": student, "failure": f"{set_name}/{r.exercise}",
                         "chain": chain})
    for (set_name, exercise, mistake), students in sorted(by_mistake.items()):
        out["sets"][set_name]["mistakes"].append(
            {"exercise": exercise, "mistake": mistake, "students": sorted(students)})
    for (cause_set, cause, mistake), failures in sorted(caused.items()):
        entry = out["sets"].setdefault(cause_set, {"mistakes": [], "not_submitted": [],
                                                   "caused_here": []})
        entry["caused_here"].append({"exercise": cause, "mistake": mistake or
                                     "(not graded here: its notebook is not in the gradebook)",
                                     "failures": failures})
    for set_name in sets:
        submitted = {s for s, t in counted if t == set_name}
        out["sets"][set_name]["not_submitted"] = [s for s in names if s not in submitted]
    return out


def instructor_section(view: dict, set_name: str) -> str:
    """The HTML of one set's instructor view ("" when the set has nothing to show)."""
    data = view["sets"].get(set_name)
    if not data:
        return ""
    parts = []
    if data["not_submitted"]:
        parts.append(f"<h3>Did not submit: {len(data['not_submitted'])} student(s)</h3>"
                     f"<p>{esc(', '.join(data['not_submitted']))} (from "
                     f"{esc(view['roster_from'])})</p>")
    if data["mistakes"]:
        parts.append("<h3>Who made each mistake</h3>")
        parts.append(table(["exercise", "mistake", "students"],
                           [[m["exercise"], m["mistake"], ", ".join(m["students"])]
                            for m in data["mistakes"]]))
    if data["caused_here"]:
        parts.append("<h3>Later sets' failures caused here</h3>")
        parts.append(table(
            ["exercise", "its mistake here", "student", "the later failure", "through"],
            [[c["exercise"], c["mistake"], f["student"], f["failure"], " -> ".join(f["chain"])]
             for c in data["caused_here"] for f in c["failures"]]))
    if not parts:
        return ""
    return f"<h3>{esc(set_name)}: for the instructor</h3>\n" + "\n".join(parts)
