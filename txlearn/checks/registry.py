"""The registry of exercises: :func:`exercise` (the decorator that registers a check), the ONE
index of which check module defines which exercise (:func:`exercise_modules`), running a check
(:func:`run_exercise` -> :class:`Verdict`, with its dependencies and the instructor's hidden
cases) and where hidden cases come from in a learner's kernel (:func:`hidden_dir`).

A check module is a file of this folder (``softmax.py`` for lesson 01, ``attention.py`` for 02,
..., ``capstone.py``, ``decoder.py``) with at least one ``@exercise("name")`` check; its stem is
also the name of the instructor's hidden-case file for its exercises. The index is read from the
decorators without importing anything (the checks in the learner's kernel, the grader, ``txlearn
build`` and the hidden-case validation all use it), and a check module is loaded afresh from disk
each time one of its checks runs (an edited check takes effect without a kernel restart). Helper
modules of this folder (``modules.py``, ``capstone_*.py``) register nothing and are imported as
usual.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
from pathlib import Path
from typing import Any, Callable, Sequence

from txlearn.checks.feedback import CheckFailure

__all__ = ["exercise", "exercise_modules", "find", "parameters", "run_exercise", "Verdict",
           "hidden_dir", "CHECKS_DIR"]

CHECKS_DIR = Path(__file__).resolve().parent


def exercise(name: str, needs: Sequence[str] = ()) -> Callable:
    """Register the decorated function as the check of exercise `name`.

    Its parameter names are the names the check cell passes (the learner's objects). `needs`:
    exercises whose answers this one uses (their checks run when this one fails, to name the
    root cause).
    """

    def register(fn: Callable) -> Callable:
        fn.__txlearn_exercise__ = name
        fn.__txlearn_needs__ = tuple(needs)
        return fn

    return register


def _registered(tree: ast.Module) -> list[str]:
    """The exercise names of the ``@exercise("name", ...)`` decorators of a module's functions."""
    names = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for deco in node.decorator_list:
            func = deco.func if isinstance(deco, ast.Call) else None
            called = getattr(func, "id", None) or getattr(func, "attr", None)
            if called == "exercise" and deco.args and isinstance(deco.args[0], ast.Constant) \
                    and isinstance(deco.args[0].value, str):
                names.append(deco.args[0].value)
    return names


_index: tuple[tuple, dict[str, str]] = ((), {})   # (the files' sizes and times, the index)


def exercise_modules() -> dict[str, str]:
    """Exercise name -> the stem of the check module that registers it (``"stable_softmax":
    "softmax"``), read from the ``@exercise("...")`` decorators of this folder's modules without
    importing them, in file and then source order; re-read when a file changes.

    Raises RuntimeError when two modules register the same exercise (a course bug)."""
    global _index
    paths = [p for p in sorted(CHECKS_DIR.glob("*.py")) if not p.name.startswith("_")]
    stamp = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in paths)
    if stamp != _index[0]:
        found: dict[str, str] = {}
        for path in paths:
            for name in _registered(ast.parse(path.read_text(encoding="utf-8"))):
                if name in found and found[name] != path.stem:
                    raise RuntimeError(f"exercise {name!r} is registered twice, in "
                                       f"{found[name]}.py and {path.stem}.py")
                found[name] = path.stem
        _index = (stamp, found)
    return dict(_index[1])


def _load_fresh(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def find(name: str) -> tuple[Callable, str]:
    """The check function of exercise `name` and its module's stem (loaded afresh from disk).

    Raises KeyError for an unknown exercise."""
    stem = exercise_modules().get(name)
    if stem is not None:
        module = _load_fresh(CHECKS_DIR / f"{stem}.py", f"_txlearn_checks_{stem}")
        for obj in vars(module).values():
            if callable(obj) and getattr(obj, "__txlearn_exercise__", None) == name:
                return obj, stem
    raise KeyError(f"no exercise named {name!r} in {CHECKS_DIR}")


def parameters(name: str) -> list[str]:
    """The names the check of exercise `name` takes (the names its check cell passes)."""
    fn, _ = find(name)
    return list(inspect.signature(fn).parameters)


class Verdict:
    """The outcome of one exercise: ``passed`` and, when not, the :class:`CheckFailure`."""

    def __init__(self, name: str, failure: CheckFailure | None = None):
        self.name, self.failure = name, failure

    @property
    def passed(self) -> bool:
        return self.failure is None


def _dependency_failure(needs, namespace, hidden) -> CheckFailure | None:
    for dep in needs:
        names = parameters(dep)
        objects = [namespace.get(n) for n in names]
        if any(o is None for o in objects):
            continue  # not loaded here: nothing to say about it
        verdict = run_exercise(dep, objects, namespace, hidden=None, follow_needs=False)
        if not verdict.passed:
            first = verdict.failure.feedback(1).splitlines()[0]
            return CheckFailure(
                f"this answer uses your {', '.join(names)}, and that does not pass yet:\n{first}",
                hint=f"fix {dep} first (run its check), then come back to this one",
                kind="dependency")
    return None


def _hidden_check(hidden: Path | None, module_stem: str, name: str):
    if hidden is None:
        return None
    path = Path(hidden) / f"{module_stem}.py"
    if not path.exists():
        return None
    return getattr(_load_fresh(path, f"_txlearn_hidden_{module_stem}"), name, None)


def _hidden_failure(err: CheckFailure) -> CheckFailure:
    """What a learner may see of a failed hidden case: that it failed, its name and the hint;
    never the learner's exception text nor the case's values (got, expected, shapes), which
    would let a submission read the instructor's cases out of its own feedback. The hidden
    case's own failure (its case, got vs expected, its reason) is kept as ``unredacted`` on the
    returned failure, for the instructor's record, never for the learner's feedback."""
    what = ("your code raised an exception" if err.kind == "raised" else
            "your answer is wrong on this hidden case")
    shown = CheckFailure(what, case=f"hidden: {err.case}" if err.case else "hidden",
                         hint=err.hints, kind=err.kind)
    shown.unredacted = err   # for the instructor only (the grader records it apart)
    return shown


def run_exercise(name: str, objects: Sequence[Any], namespace: dict | None = None,
                 hidden: Path | None = None, follow_needs: bool = True,
                 public: bool = True) -> Verdict:
    """Run the check of exercise `name` on the learner's `objects`; never raises CheckFailure.

    `namespace` maps the learner's names to their objects (for the checks of the exercises this
    one needs). `hidden`: a folder of instructor-only cases (:func:`hidden_dir`), run after the
    public cases; a failed hidden case says only that it failed, with its name and hint
    (``_hidden_failure``). ``public=False`` runs only the hidden cases (the grader runs every
    exercise's public cases first, then the hidden ones, so that no public feedback can carry
    what the learner's code saw of a hidden case). Returns a :class:`Verdict`. Raises KeyError
    for an unknown exercise.
    """
    fn, module_stem = find(name)
    try:
        if public:
            fn(*objects)
        extra = _hidden_check(hidden, module_stem, name)
        if extra is not None:
            try:
                extra(*objects)
            except CheckFailure as err:
                raise _hidden_failure(err) from None
    except CheckFailure as err:
        err.exercise = name
        if public and follow_needs and err.kind not in ("stub", "missing"):
            dep = _dependency_failure(getattr(fn, "__txlearn_needs__", ()), namespace or {},
                                      hidden)
            if dep is not None:
                dep.exercise = name
                return Verdict(name, dep)
        return Verdict(name, err)
    return Verdict(name)


def hidden_dir() -> Path | None:
    """The instructor's hidden-case folder for a local run, from ``TXLEARN_HIDDEN`` (the grader
    passes its ``--hidden DIR`` to :func:`run_exercise` directly and never sets the variable).

    Format: one Python file per check module, named like it (``softmax.py`` for the lesson-01
    checks), defining one function per exercise, named like the exercise, taking the same objects
    as the public check and raising :class:`CheckFailure` (use :func:`call`, :func:`expect_close`)
    on a wrong answer.
    """
    value = os.environ.get("TXLEARN_HIDDEN")
    return Path(value) if value else None
