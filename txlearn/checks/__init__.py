"""Exercise checks: run a learner's function on chosen cases and diagnose the likely mistake.

A check cell in an exercise notebook is always the same two lines::

    from txlearn.checks import check
    check("stable_softmax", softmax)

`check` finds the exercise by name in the modules of this folder (one module per lesson, named like
the package module it checks: ``softmax.py`` for lesson 01, ``attention.py`` for 02, ...), loaded
afresh from disk on every call, runs it, then runs the instructor's hidden cases (see
:func:`hidden_dir`), and prints exactly one line, ``PASSED: <exercise>``. Any failure raises
:class:`CheckFailure` whose message names the case, what differs (shape, first differing index,
got vs expected) and a hint aimed at the likely mistake.

Writing a check (in ``txlearn/checks/<module>.py``)::

    from txlearn.checks import exercise, call, expect_close

    @exercise("stable_softmax")
    def stable_softmax(softmax):
        got = call(softmax, np.array([1000., 1001., 1002.]), case="large logits")
        expect_close(got, [0.090031, 0.244728, 0.665241], case="large logits", atol=1e-6,
                     hint="subtract the maximum before exp()")

Source of the design: ``DESIGN.md`` (Exercises) and lesson 01's exercise notebook.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import numpy as np

__all__ = [
    "CheckFailure",
    "check",
    "exercise",
    "call",
    "expect_close",
    "expect_shape",
    "expect_true",
    "diagnose",
    "as_array",
    "hidden_dir",
    "DEFAULT_TIME_LIMIT",
]

DEFAULT_TIME_LIMIT = 10.0  # seconds one call of the learner's function may take
_CHECKS_DIR = Path(__file__).resolve().parent
_REGISTRY_ATTR = "__txlearn_exercises__"


class CheckFailure(AssertionError):
    """A learner's answer is wrong; the message says which case, what differs, and a hint."""


class _TimeLimit(BaseException):
    """Raised inside the learner's code when its time limit runs out (BaseException so that a
    bare ``except Exception`` in the learner's code cannot swallow it)."""


def exercise(name: str) -> Callable:
    """Register the decorated function as the check of exercise `name` in its module."""

    def register(fn: Callable) -> Callable:
        fn.__txlearn_exercise__ = name
        return fn

    return register


def _fail(case: str | None, what: str, hint: str | None = None) -> CheckFailure:
    text = f"case '{case}': {what}" if case else what
    if hint:
        text += f"\nHint: {hint}"
    return CheckFailure(text)


@contextmanager
def _time_limit(seconds: float | None):
    """Interrupt the enclosed code after `seconds` (SIGALRM; only in the main thread on POSIX)."""
    usable = (
        seconds is not None
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        yield
        return

    def on_alarm(signum, frame):
        raise _TimeLimit()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def call(fn: Callable, *args: Any, case: str, time_limit: float | None = DEFAULT_TIME_LIMIT,
         hint: str | None = None, **kwargs: Any) -> Any:
    """Call the learner's `fn(*args, **kwargs)` under a time limit (seconds); `hint` is added to
    the feedback when the function raises (e.g. what the input looks like in this case).

    Raises:
        CheckFailure: the function is still a stub (``NotImplementedError``), ran past
            `time_limit`, or raised any other exception (named with its message).
    """
    if not callable(fn):
        raise _fail(case, f"expected a function, got {type(fn).__name__}",
                    "run the cell that defines your answer before this check")
    try:
        with _time_limit(time_limit):
            return fn(*args, **kwargs)
    except NotImplementedError:
        raise _fail(case, "not implemented yet (the stub still raises NotImplementedError)",
                    "replace the `raise NotImplementedError` line with your code") from None
    except _TimeLimit:
        raise _fail(case, f"did not finish within {time_limit:g} s",
                    "look for a loop that never ends, or a loop over elements that could be "
                    "one array operation") from None
    except CheckFailure:
        raise
    except Exception as err:  # the learner's code raised: report it as feedback
        raise _fail(case, f"your function raised {type(err).__name__}: {err}", hint) from err


def _as_array(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # torch.Tensor
        x = x.detach().cpu()
        if getattr(x, "dtype", None) is not None and str(x.dtype) == "torch.bfloat16":
            x = x.float()
        x = x.numpy()
    return np.asarray(x)


def as_array(x: Any, dtype=None) -> np.ndarray | None:
    """The learner's answer as a NumPy array (tensors detached; cast to `dtype` if given), or
    ``None`` when it is not an array of numbers (or booleans)."""
    try:
        a = _as_array(x)
        a = a if dtype is None else a.astype(dtype)
    except (TypeError, ValueError):
        return None
    return None if a.dtype == object else a


def diagnose(got: Any, mistakes, default: str, *, rtol: float = 1e-4, atol: float = 1e-6) -> str:
    """The hint of the first catalogued mistake whose output `got` reproduces, else `default`.

    `mistakes` is a sequence of ``(wrong_output, hint)`` pairs: what that mistake computes on the
    case's inputs (an array, or a function of no arguments that computes it), and the hint aimed
    at it. Shapes must agree and values match within
    ``atol + rtol * |wrong|`` (NaN matches NaN: a mistake that gives NaN is recognised by it).
    A `got` that is not an array of numbers gets `default`.
    """
    try:
        g = _as_array(got).astype(np.float64)
    except (TypeError, ValueError):
        return default
    for wrong, hint in mistakes:
        with np.errstate(all="ignore"):  # a mistake may overflow: that is the mistake
            w = np.asarray(wrong() if callable(wrong) else wrong, dtype=np.float64)
        if g.shape == w.shape and np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True):
            return hint
    return default


def expect_shape(got: Any, shape: tuple, *, case: str, hint: str | None = None) -> None:
    """Fail unless `got` has exactly `shape`; the message names both shapes."""
    got_shape = tuple(_as_array(got).shape)
    if got_shape != tuple(shape):
        raise _fail(case, f"shape {got_shape}, expected {tuple(shape)}", hint)


def _fmt(value: float) -> str:
    """A number for feedback: large whole numbers (bytes, FLOPs) with thousands separators."""
    value = float(value)
    if np.isfinite(value) and value.is_integer() and abs(value) >= 1e4:
        return f"{int(value):,}"
    return f"{value:.6g}"


def expect_close(got: Any, expected: Any, *, case: str, hint: str | None = None,
                 rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Fail unless `got` equals `expected` elementwise within ``atol + rtol * |expected|``.

    The message names the case and then the first problem found: a value that is not an array of
    numbers, a shape mismatch (both shapes), a NaN or infinity (first index), or the first
    differing index with got vs expected.
    """
    try:
        g = _as_array(got).astype(np.float64)
    except (TypeError, ValueError):
        raise _fail(case, f"expected an array of numbers, got {type(got).__name__}", hint) from None
    e = _as_array(expected).astype(np.float64)
    if g.shape != e.shape:
        raise _fail(case, f"shape {g.shape}, expected {e.shape}", hint)
    bad_finite = ~np.isfinite(g) & np.isfinite(e)
    if bad_finite.any():
        idx = tuple(int(i) for i in np.argwhere(bad_finite)[0])
        raise _fail(case, f"got {g[idx]} at index {idx}, expected {e[idx]:.6g}", hint)
    wrong = ~np.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
    if wrong.any() and g.ndim == 0:
        raise _fail(case, f"got {_fmt(g)}, expected {_fmt(e)}", hint)
    if wrong.any():
        idx = tuple(int(i) for i in np.argwhere(wrong)[0])
        raise _fail(case, f"first difference at index {idx}: got {_fmt(g[idx])}, expected "
                          f"{_fmt(e[idx])} ({int(wrong.sum())} of {wrong.size} values differ)", hint)


def expect_true(condition: bool, *, case: str, message: str, hint: str | None = None) -> None:
    """Fail with `message` (and `hint`) unless `condition` holds."""
    if not condition:
        raise _fail(case, message, hint)


def hidden_dir() -> Path | None:
    """The instructor's hidden-case folder, from the environment variable ``TXLEARN_HIDDEN``.

    Format: one Python file per check module, named like it (``softmax.py`` for the lesson-01
    checks), defining one function per exercise, named like the exercise, taking the same objects
    as the public check and raising :class:`CheckFailure` (use :func:`call`, :func:`expect_close`)
    on a wrong answer. ``txlearn grade --hidden DIR`` sets the variable for the graded kernels.
    """
    value = os.environ.get("TXLEARN_HIDDEN")
    return Path(value) if value else None


def _load_fresh(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _find(name: str) -> tuple[Callable, str]:
    for path in sorted(_CHECKS_DIR.glob("*.py")):
        if path.name.startswith("_"):
            continue
        if f'"{name}"' not in path.read_text(encoding="utf-8"):
            continue
        module = _load_fresh(path, f"_txlearn_checks_{path.stem}")
        for obj in vars(module).values():
            if callable(obj) and getattr(obj, "__txlearn_exercise__", None) == name:
                return obj, path.stem
    raise KeyError(f"no exercise named {name!r} in {_CHECKS_DIR}")


def check(name: str, *objects: Any) -> None:
    """Check the learner's `objects` (functions, modules, values) for exercise `name`.

    Prints ``PASSED: <name>`` on success. Raises :class:`CheckFailure` with feedback on a wrong
    answer, and ``KeyError`` for an unknown exercise name.
    """
    fn, module_stem = _find(name)
    fn(*objects)
    hidden = hidden_dir()
    if hidden is not None and (hidden / f"{module_stem}.py").exists():
        extra = getattr(_load_fresh(hidden / f"{module_stem}.py", f"_txlearn_hidden_{module_stem}"),
                        name, None)
        if extra is not None:
            try:
                extra(*objects)
            except CheckFailure as err:
                raise CheckFailure(f"hidden case: {err}") from None
    print(f"PASSED: {name}")
