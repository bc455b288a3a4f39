"""Trying an instructor's hidden cases on the course's own solutions, each failure explained to
the instructor (``txlearn try-hidden DIR``).

A hidden case that the official solution fails fails every student, and each is told only that
a hidden case failed (:data:`~.grade_one.HIDDEN_FAILED`): a wrong expected value, a tolerance too
tight or a call the exercise does not take is found only when a class complains. Before grading,
:func:`try_hidden` grades the solution notebook (``exercises/solutions/NN_*.ipynb``) of every set
with a hidden case in the folder, with those cases, and :func:`explain` says for each exercise
whether its hidden cases pass the solution and, when one does not, which case, what differs (got
vs expected) and the check's own reason: the instructor-only note that the grader also records
in the gradebook for a student's failed hidden case (``results.instructor_note``), never shown to
the student.

The solutions are the course's own code, so they run without a sandbox; the hidden cases run in
this process, as in any grading run. Source: issue 36 ("Hidden cases are hard to write").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from txlearn.checks.registry import exercise_modules
from txlearn.course import build
from txlearn.course.grading.grade_one import grade
from txlearn.course.grading.hidden import hidden_functions, validate_hidden
from txlearn.course.grading.sets import GradingError

__all__ = ["Trial", "try_hidden", "explain", "sets_with_hidden_cases"]


@dataclass
class Trial:
    """One exercise's hidden cases tried on the course's solution.

    ``outcome``: ``"pass"`` (the solution passes them), ``"hidden"`` (a hidden case fails the
    solution: fix the case), ``"public"`` (the solution fails the exercise's public cases, so
    its hidden cases did not run: the course or its installation is broken) or ``"error"`` (the
    solution notebook could not be graded). ``reason``: the instructor's explanation (the
    hidden check's case, got vs expected and hint; or the public feedback; or the error)."""

    set_name: str
    exercise: str
    outcome: str
    reason: str = ""


def sets_with_hidden_cases(folder: Path) -> dict[str, list[str]]:
    """{set name: its exercises that have a hidden case in ``folder``}, in course order."""
    by_module = hidden_functions(Path(folder))
    modules = exercise_modules()
    out: dict[str, list[str]] = {}
    for source in sorted(build.Layout().exercise_sources.glob("[0-9][0-9]_*.py")):
        names = build.exercise_names(build.read_source(source), source.name)
        mine = [n for n in names if n in by_module.get(modules.get(n, ""), ())]
        if mine:
            out[source.stem] = mine
    return out


def try_hidden(folder: Path, sets: list[str] | None = None, *, jobs: int | None = None,
               solutions: Path | None = None) -> list[Trial]:
    """Grade the course's solution of each set with a hidden case in ``folder`` (or only
    ``sets``), with those hidden cases; one :class:`Trial` per exercise that has one.

    ``solutions``: the folder of solution notebooks (default ``exercises/solutions``; a set's
    later notebooks find the earlier sets' solutions beside them). Raises GradingError when the
    folder is not a valid hidden-case folder (:func:`~.hidden.validate_hidden`), a set named in
    ``sets`` has no hidden case there, or a set has no solution notebook."""
    folder = Path(folder)
    validate_hidden(folder)
    wanted = sets_with_hidden_cases(folder)
    if sets:
        chosen = {}
        for name in sets:
            source = build.find_source(name)
            if source is None or source.stem not in wanted:
                raise GradingError(f"--set {name}: {folder} has no hidden case for "
                                   f"{'that set' if source else 'it (no such exercise set)'}")
            chosen[source.stem] = wanted[source.stem]
        wanted = chosen
    solutions = Path(solutions) if solutions else build.ROOT / "exercises" / "solutions"
    paths = []
    for name in wanted:
        path = solutions / f"{name}.ipynb"
        if not path.is_file():
            raise GradingError(f"no solution notebook {path} (run txlearn build)")
        paths.append(path)
    subs = grade(paths, folder, jobs=jobs, no_sandbox=True)
    out = []
    for name, sub in zip(wanted, subs):
        results = {r.exercise: r for r in sub.results}
        for exercise in wanted[name]:
            r = results.get(exercise)
            if sub.error or r is None:
                out.append(Trial(name, exercise, "error", sub.error or
                                 "the solution notebook has no such exercise"))
            elif r.status == "PASS":
                out.append(Trial(name, exercise, "pass"))
            elif r.hidden:
                out.append(Trial(name, exercise, "hidden", r.instructor_note))
            else:
                out.append(Trial(name, exercise, "public", r.feedback))
    return out


_SAYS = {
    "pass": "the solution passes its hidden cases",
    "hidden": ("the solution FAILS a hidden case: every student would fail it too (told only "
               "\"failed a hidden case\"); fix the case (its expected value, its tolerance, what "
               "it calls)"),
    "public": ("the solution fails the exercise's public cases, so its hidden cases did not run "
               "(the course or its installation is broken: run make test)"),
    "error": "the solution notebook could not be graded",
}


def explain(trials: list[Trial]) -> str:
    """The instructor's report of :func:`try_hidden`: one paragraph per exercise, the reason
    indented under it, and a last line counting the failures."""
    lines = []
    for t in trials:
        lines.append(f"{t.set_name} / {t.exercise}: {_SAYS[t.outcome]}")
        lines += [f"    {line}" for line in t.reason.splitlines() if t.outcome != "pass"]
    bad = sum(t.outcome != "pass" for t in trials)
    lines.append(f"{len(trials)} exercise(s) with hidden cases; "
                 + (f"{bad} need(s) your attention" if bad else "every one passes the solution"))
    return "\n".join(lines)
