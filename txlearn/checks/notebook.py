"""The notebook face of the checks: :func:`check` (what every check cell calls) and :func:`hint`,
and how a failure shows in IPython (a few lines instead of a traceback).

A check cell is always the same two lines::

    from txlearn.checks import check
    check("stable_softmax", softmax)

:func:`check` runs the exercise's check (:func:`txlearn.checks.registry.run_exercise`) on the
objects the cell passes, with the learner's own names for the checks of the exercises it needs,
and prints exactly one line, ``PASSED (public cases): <exercise>`` (:func:`passed_line`), or
raises the :class:`~txlearn.checks.feedback.CheckFailure`. The line says *public* cases because
they are all a learner's kernel has: the grader may hold hidden ones, and a notebook that passes
here can still fail there (its feedback then names the failed case as hidden). The same
mistake twice in a row, or ``hint("stable_softmax")``, gives the next, more specific hint level.
"""

from __future__ import annotations

import sys
from typing import Any

from txlearn.checks.feedback import CheckFailure, render
from txlearn.checks.registry import hidden_dir, run_exercise

__all__ = ["check", "hint", "passed_line"]

_last: dict[str, tuple[str, int]] = {}   # exercise -> (first feedback line, hint level shown)
_shown: dict[str, CheckFailure] = {}


def _level_for(name: str, failure: CheckFailure) -> int:
    """1 for a new mistake; one more each time the same mistake comes back."""
    key = failure.feedback(1).splitlines()[0] + "|" + (failure.hints[0] if failure.hints else "")
    previous = _last.get(name)
    level = previous[1] + 1 if previous and previous[0] == key else 1
    _last[name] = (key, level)
    return level


def _show_failure(shell, etype, evalue, tb, tb_offset=None):
    """IPython's handler for CheckFailure: the feedback lines instead of a long traceback."""
    level = getattr(evalue, "level_shown", 1)
    lines = render(evalue, level)
    shell._showtraceback(etype, evalue, lines)
    return lines


def _install_display() -> None:
    """In IPython, show CheckFailure as its few feedback lines (never the checker's frames)."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None) if ipython else None
    shell = get() if get else None
    if shell is not None and CheckFailure not in getattr(shell, "custom_exceptions", ()):
        shell.set_custom_exc((CheckFailure,), _show_failure)


def passed_line(name: str) -> str:
    """The line a passing check prints for exercise `name` (without the newline), and the output
    ``txlearn build`` stores in a solution notebook's check cell: ``PASSED (public cases): name``.
    """
    return f"PASSED (public cases): {name}"


def check(name: str, *objects: Any) -> None:
    """Check the learner's `objects` (functions, classes, values) for exercise `name`.

    Prints ``PASSED (public cases): <name>`` (:func:`passed_line`) on success. Raises
    :class:`CheckFailure` with feedback on a wrong answer (in a notebook shown as a few lines, at
    the next hint level when the same mistake comes back), and ``KeyError`` for an unknown
    exercise name.
    """
    _install_display()
    caller = sys._getframe(1).f_globals
    verdict = run_exercise(name, objects, namespace=caller, hidden=hidden_dir())
    if verdict.passed:
        _last.pop(name, None)
        print(passed_line(name))
        return
    failure = verdict.failure
    failure.level_shown = _level_for(name, failure)
    _shown[name] = failure
    raise failure.with_traceback(None)


def hint(name: str) -> None:
    """Print the next, more specific hint for the last failure of exercise `name`."""
    failure = _shown.get(name)
    if failure is None or not failure.hints:
        print(f"{name}: no failed check to give a hint for; run its check cell first")
        return
    key, level = _last.get(name, ("", 0))
    level = min(level + 1, len(failure.hints))
    _last[name] = (key, level)
    failure.level_shown = level
    print("\n".join(render(failure, level)[1:] or ["(no hint)"]))
