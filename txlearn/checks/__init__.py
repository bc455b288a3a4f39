"""Exercise checks: run a learner's answer on chosen cases and diagnose the likely mistake.

A check cell in an exercise notebook is always the same two lines::

    from txlearn.checks import check
    check("stable_softmax", softmax)

`check` finds the exercise by name in the modules of this folder (one module per lesson, named like
the package module it checks: ``softmax.py`` for lesson 01, ``attention.py`` for 02, ...), loaded
afresh from disk on every call, runs it and prints exactly one line, ``PASSED: <exercise>``. A wrong
answer raises :class:`CheckFailure`, shown in a notebook as at most about eight lines: the case,
what differs (shape, first differing index, got vs expected), the learner's own frames when their
code raised, and a hint. Hints come in levels: the first names the concept; running the check again
with the same mistake, or calling ``hint("stable_softmax")``, gives the next, more specific level.
No hint holds a line of a solution (a test enforces it).

**Learner objects.** A check receives what the check cell passes: functions, classes (PyTorch
modules), values. It never touches them directly: it goes through :func:`call` (call a function,
build a module, run a module's forward), :func:`load_state`, :func:`state_shapes` and
:func:`forward_backward`. In a learner's kernel these act on the real objects; under ``txlearn
grade`` the objects are proxies for a sandboxed runner process (:class:`LearnerObject`), and the
same check runs in the grader's process, so nothing the learner's code does can decide a verdict.
For the same reason a check passes the learner's code only plain data (arrays, tensors, numbers,
strings, tuples, lists, dicts, None) or a :func:`given` callable (a fixed component built from
data, e.g. "a linear map with these weights").

**Dependencies.** ``@exercise("transformer_layer", needs=("multi_head_attention",))``: when the
answer fails, the checks of its dependencies run on the learner's objects of the same names (the
check function's parameter names are the names in the check cell, e.g. ``MultiHeadAttention``);
if one of them fails, the feedback says "fix multi_head_attention first". A stub still says "not
implemented yet" first.

Writing a check (in ``txlearn/checks/<module>.py``)::

    from txlearn.checks import exercise, call, expect_close

    @exercise("stable_softmax")
    def stable_softmax(softmax):
        got = call(softmax, np.array([1000., 1001., 1002.]), case="large logits")
        expect_close(got, [0.090031, 0.244728, 0.665241], case="large logits", atol=1e-6,
                     hint=("what happens to exp() of a large number?",
                           "shift the logits by their maximum before exp()"))

Source of the design: ``CONTRIBUTING.md`` (Checks) and lesson 01's exercise notebook.
"""

from __future__ import annotations

import importlib.util
import inspect
import linecache
import os
import signal
import sys
import threading
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from txlearn import learner_calls
from txlearn.learner_calls import (GIVEN_KINDS, Given, TimeLimitExceeded, call_on_copies, given,
                                   learner_frames, load_state_dict, local_forward_backward,
                                   parameter_name)

__all__ = [
    "CheckFailure",
    "check",
    "hint",
    "exercise",
    "call",
    "construct",
    "load_state",
    "state_shapes",
    "forward_backward",
    "given",
    "Given",
    "GIVEN_KINDS",
    "LearnerObject",
    "LearnerError",
    "LearnerTimeout",
    "LearnerChangedInput",
    "clean",
    "expect_close",
    "expect_shape",
    "expect_true",
    "diagnose",
    "as_array",
    "run_exercise",
    "Verdict",
    "hidden_dir",
    "DEFAULT_TIME_LIMIT",
]

def _default_time_limit() -> float:
    """Seconds one call of the learner's code may take: 10, or ``TXLEARN_TIME_LIMIT`` when set
    (a slow machine may need more; the tests of this module use less)."""
    try:
        value = float(os.environ.get("TXLEARN_TIME_LIMIT", "10"))
    except ValueError:
        value = 10.0
    return value if value > 0 else 10.0


DEFAULT_TIME_LIMIT = _default_time_limit()
MAX_LINES = 8              # the most lines a failure shows in a notebook
_CHECKS_DIR = Path(__file__).resolve().parent
_PACKAGE_DIR = _CHECKS_DIR.parent


def _levels(hint) -> tuple[str, ...]:
    """A hint as a tuple of levels (a plain string is one level)."""
    if hint is None:
        return ()
    if isinstance(hint, str):
        return (hint,)
    return tuple(h for h in hint if h)


class CheckFailure(AssertionError):
    """A learner's answer is wrong: which case, what differs, the learner's frames, hint levels.

    ``str(failure)`` is the feedback at hint level 1; :meth:`feedback` gives another level.
    ``kind`` is ``"wrong"`` (a value differs), ``"stub"`` (still ``NotImplementedError``),
    ``"raised"`` (the learner's code raised), ``"timeout"``, ``"dependency"`` (an earlier
    exercise this one uses fails) or ``"missing"`` (the answer is not defined).
    """

    def __init__(self, what: str, *, case: str | None = None, hint=None, kind: str = "wrong",
                 frames: Sequence[str] = (), exercise: str | None = None):
        self.what, self.case, self.hints, self.kind = what, case, _levels(hint), kind
        self.frames, self.exercise = tuple(frames), exercise
        super().__init__(self.feedback(1))

    def feedback(self, level: int = 1) -> str:
        """The feedback text with hint ``level`` (1 = the concept; clipped to the last level)."""
        head = f"case '{self.case}': {self.what}" if self.case else self.what
        lines = head.splitlines()[:3] + [f"  {f}" for f in self.frames[-2:]]
        if self.hints:
            k = min(max(level, 1), len(self.hints))
            more = f" {k} of {len(self.hints)}" if len(self.hints) > 1 else ""
            lines.append(f"Hint{more}: {self.hints[k - 1]}")
        return "\n".join(lines)


class LearnerError(Exception):
    """The learner's code raised: its exception type and message, and its own frames as
    ``"line N in NAME: source"`` strings (raised by :class:`LearnerObject` proxies too)."""

    def __init__(self, type_name: str, message: str, frames: Sequence[str] = ()):
        super().__init__(f"{type_name}: {message}")
        self.type_name, self.message, self.frames = type_name, message, tuple(frames)


class LearnerTimeout(Exception):
    """The learner's code ran past its time limit (``seconds``: the limit that applied, when it
    differs from the check's own, e.g. a grader's shorter per-call limit)."""

    def __init__(self, seconds: float | None = None):
        super().__init__(f"did not finish within {seconds:g} s" if seconds else "timed out")
        self.seconds = seconds


class LearnerChangedInput(Exception):
    """The learner's code changed an array or tensor it was given, in place: the argument's
    position (int) or keyword (str)."""

    def __init__(self, where: int | str):
        super().__init__(where)
        self.where = where


# ---- the learner's objects: local, or proxies for a sandboxed runner ---------------------------

class LearnerObject:
    """Base class of the grader's proxies for objects that live in a sandboxed runner.

    The helpers below (:func:`call`, :func:`load_state`, :func:`state_shapes`,
    :func:`forward_backward`) call these methods instead of touching a local object. Each raises
    :class:`LearnerError` when the learner's code raised and :class:`LearnerTimeout` when it ran
    past ``time_limit`` seconds. Results are plain data (arrays come back as NumPy arrays or
    tensors, as the learner's code returned them); a module the learner's code built comes back
    as another proxy.
    """

    name = "answer"

    def remote_call(self, args: tuple, kwargs: dict, time_limit: float | None):
        raise NotImplementedError

    def remote_load_state(self, state: dict, time_limit: float | None) -> None:
        raise NotImplementedError

    def remote_state_shapes(self, time_limit: float | None) -> dict:
        raise NotImplementedError

    def remote_forward_backward(self, args: tuple, kwargs: dict, grad_output,
                                time_limit: float | None):
        raise NotImplementedError

    def remote_is_module(self) -> bool:
        raise NotImplementedError


_CONTROL = None


def clean(text: Any, limit: int = 400) -> str:
    """Learner-made text made safe to show: one line, no terminal escapes or control characters
    (a message cannot forge a "Hint:" line or repaint a score), no unpaired surrogates (which
    cannot be printed or written as UTF-8), at most ``limit`` characters."""
    global _CONTROL
    if _CONTROL is None:
        import re
        _CONTROL = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]|[\x00-\x1f\x7f-\x9f]")
    text = str(text).encode("utf-8", "backslashreplace").decode("utf-8")
    return _CONTROL.sub(" ", text)[:limit]


_STUB = ("not implemented yet (the stub still raises NotImplementedError)",
         "replace the `raise NotImplementedError` line with your code")


def _run_learner(thunk: Callable, *, case: str, time_limit: float | None, hint=None,
                 what: str = "your code", remote: bool = False):
    """Run ``thunk()`` (which calls the learner's code) and turn what can go wrong into a
    :class:`CheckFailure`: a stub, a timeout, an exception (with the learner's frames).
    ``remote``: the thunk asks a :class:`LearnerObject`, which keeps the time limit itself (no
    alarm here, which would interrupt the grader's own wait)."""
    try:
        with learner_calls.time_limit(None if remote else time_limit):
            return thunk()
    except NotImplementedError:
        raise CheckFailure(_STUB[0], case=case, hint=_STUB[1], kind="stub") from None
    except LearnerError as err:
        if err.type_name == "NotImplementedError":
            raise CheckFailure(_STUB[0], case=case, hint=_STUB[1], kind="stub") from None
        raise CheckFailure(clean(f"{what} raised {err.type_name}: {err.message}"), case=case,
                           hint=hint, kind="raised",
                           frames=[clean(f, 160) for f in err.frames]) from None
    except LearnerChangedInput as err:
        where = f"`{err.where}`" if isinstance(err.where, str) else f"number {err.where + 1}"
        raise CheckFailure(f"your code changed its input {where} in place", case=case,
                           hint=(f"the caller still needs {where}: leave it unchanged",
                                 "in-place operations (`-=`, `/=`, `out=`, `|=`, methods ending "
                                 "in `_` such as masked_fill_) change the caller's array or "
                                 "tensor: build a new one instead"),
                           kind="inplace") from None
    except (TimeLimitExceeded, LearnerTimeout) as err:
        seconds = getattr(err, "seconds", None) or time_limit
        raise CheckFailure(f"did not finish within {seconds:g} s", case=case,
                           hint="look for a loop that never ends, or a loop over elements that "
                                "could be one array operation", kind="timeout") from None
    except CheckFailure:
        raise
    except Exception as err:  # the learner's code raised: report it as feedback
        raise CheckFailure(clean(f"{what} raised {type(err).__name__}: {err}"), case=case,
                           hint=hint, kind="raised",
                           frames=[clean(f, 160) for f in learner_frames(err.__traceback__)]
                           ) from None


def call(fn: Any, *args: Any, case: str, time_limit: float | None = DEFAULT_TIME_LIMIT,
         hint=None, **kwargs: Any) -> Any:
    """Call the learner's `fn(*args, **kwargs)` (a function, a class to build, or a module's
    forward) under a time limit (seconds); `hint` is added when it raises.

    Raises:
        CheckFailure: `fn` is not callable (not defined yet), is still a stub
            (``NotImplementedError``), ran past `time_limit`, or raised any other exception
            (named with its message and the learner's own frames).
    """
    if isinstance(fn, LearnerObject):
        return _run_learner(lambda: fn.remote_call(args, kwargs, time_limit), case=case,
                            time_limit=time_limit, hint=hint, remote=True)
    if not callable(fn):
        raise CheckFailure(f"expected a function or class, got {type(fn).__name__}", case=case,
                           hint="run the cell that defines your answer before this check",
                           kind="missing")
    return _run_learner(lambda: _call_with_copies(fn, args, kwargs), case=case,
                        time_limit=time_limit, hint=hint)


def _call_with_copies(fn, args, kwargs):
    """The in-place rule of :func:`txlearn.learner_calls.call_on_copies` (the grader's runner
    applies the same one): ``fn`` gets copies, and a copy it changed fails the check."""
    result, changed = call_on_copies(fn, args, kwargs)
    if changed:
        raise LearnerChangedInput(parameter_name(fn, changed[0][0]))
    return result


def _is_module(obj) -> bool:
    if isinstance(obj, LearnerObject):
        return obj.remote_is_module()
    import torch
    return isinstance(obj, torch.nn.Module)


def construct(cls: Any, *args: Any, case: str, time_limit: float | None = DEFAULT_TIME_LIMIT,
              hint=None, **kwargs: Any) -> Any:
    """Build the learner's module ``cls(*args, **kwargs)``; fail unless it is a ``torch.nn.Module``.

    Raises CheckFailure as :func:`call` does, and when the result is not an ``nn.Module`` (did
    the class forget to subclass ``nn.Module`` or to call ``super().__init__()``?).
    """
    module = call(cls, *args, case=case, time_limit=time_limit, hint=hint, **kwargs)
    if not _is_module(module):
        raise CheckFailure(f"{getattr(cls, 'name', getattr(cls, '__name__', 'your class'))}(...) "
                           f"built a {type(module).__name__}, not a torch.nn.Module", case=case,
                           hint="subclass torch.nn.Module and call super().__init__() first "
                                "in __init__")
    return module


def state_shapes(module: Any, *, case: str,
                 time_limit: float | None = DEFAULT_TIME_LIMIT) -> dict[str, tuple]:
    """``{name: shape}`` of the learner's module's state dict (parameters and buffers)."""
    if isinstance(module, LearnerObject):
        return _run_learner(lambda: module.remote_state_shapes(time_limit), case=case,
                            remote=True,
                            time_limit=time_limit)
    return _run_learner(lambda: {k: tuple(v.shape) for k, v in module.state_dict().items()},
                        case=case, time_limit=time_limit)


def load_state(module: Any, state: dict, *, case: str,
               time_limit: float | None = DEFAULT_TIME_LIMIT) -> None:
    """Load ``state`` (``{name: array}``) into the learner's module, every name exactly.

    Raises CheckFailure naming the missing and the unexpected names, or a shape that differs
    (both shapes), before any value is compared.
    """
    shapes = state_shapes(module, case=case, time_limit=time_limit)
    missing = [k for k in state if k not in shapes]
    extra = [k for k in shapes if k not in state]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"has no {', '.join(missing[:6])}")
        if extra:   # the learner's names: one line each
            parts.append(f"has unexpected {', '.join(clean(k, 80) for k in extra[:6])}")
        raise CheckFailure(f"your module {' and '.join(parts)}", case=case,
                           hint="name the parameters as the statement gives them (the state-dict "
                                "names), and keep no other parameters or buffers")
    for name, value in state.items():
        want = tuple(np.shape(value))
        if shapes[name] != want:
            raise CheckFailure(f"parameter {name} has shape {shapes[name]}, expected {want}",
                               case=case, hint="the statement gives each parameter's shape; "
                                               "weights are (d_in, d_out), applied as x @ W")
    if isinstance(module, LearnerObject):
        return _run_learner(lambda: module.remote_load_state(state, time_limit), case=case,
                            remote=True,
                            time_limit=time_limit)
    return _run_learner(lambda: load_state_dict(module, state), case=case, time_limit=time_limit)


def forward_backward(module: Any, *args: Any, grad_output, case: str,
                     time_limit: float | None = DEFAULT_TIME_LIMIT, hint=None, **kwargs: Any):
    """Run the learner's module on ``args`` and back-propagate ``grad_output``.

    Floating-point tensor (or array) arguments get ``requires_grad``. Returns ``(out, grads)``:
    ``out`` as :func:`call` returns it (the first element when the module returns a tuple) and
    ``grads`` a dict ``{"input 0": ..., <parameter name>: ...}`` of NumPy arrays (None where no
    gradient reached). Raises CheckFailure as :func:`call` does.
    """
    if isinstance(module, LearnerObject):
        return _run_learner(lambda: module.remote_forward_backward(args, kwargs, grad_output,
                                                                   time_limit),
                            case=case, remote=True, time_limit=time_limit, hint=hint)
    return _run_learner(lambda: local_forward_backward(module, args, kwargs, grad_output),
                        case=case, time_limit=time_limit, hint=hint)


# ---- comparing -----------------------------------------------------------------------------

def _as_array(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # torch.Tensor
        x = x.detach().cpu()
        if getattr(x, "dtype", None) is not None and str(x.dtype) in ("torch.bfloat16",
                                                                     "torch.float16"):
            x = x.float()
        x = x.numpy()
    return np.asarray(x)


def as_array(x: Any, dtype=None) -> np.ndarray | None:
    """The learner's answer as a NumPy array (tensors detached; cast to `dtype` if given), or
    ``None`` when it is not an array of numbers (or booleans)."""
    try:
        a = _as_array(x)
        if dtype is not None and np.iscomplexobj(a) and \
                not np.issubdtype(np.dtype(dtype), np.complexfloating) and np.any(a.imag != 0):
            return None   # casting would drop the imaginary part: right real parts + 5j passed
        a = a if dtype is None else a.astype(dtype)
    except (TypeError, ValueError, RuntimeError):
        return None
    return None if a.dtype == object else a


def diagnose(got: Any, mistakes, default, *, rtol: float = 1e-4, atol: float = 1e-6):
    """The hint of the first catalogued mistake whose output `got` reproduces, else `default`.

    `mistakes` is a sequence of ``(wrong_output, hint)`` pairs: what that mistake computes on the
    case's inputs (an array, or a function of no arguments that computes it), and the hint aimed
    at it (a string or a tuple of levels). Shapes must agree and values match within
    ``atol + rtol * |wrong|`` (NaN matches NaN: a mistake that gives NaN is recognised by it).
    A `got` that is not an array of numbers gets `default`.
    """
    g = as_array(got, np.float64)
    if g is None:
        return default
    for wrong, hint in mistakes:
        with np.errstate(all="ignore"):  # a mistake may overflow: that is the mistake
            try:
                w = np.asarray(wrong() if callable(wrong) else wrong, dtype=np.float64)
            except (ValueError, TypeError, IndexError):
                continue  # this mistake cannot even be computed on these inputs
        if g.shape == w.shape and np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True):
            return hint
    return default


def expect_shape(got: Any, shape: tuple, *, case: str, hint=None) -> None:
    """Fail unless `got` has exactly `shape`; the message names both shapes."""
    a = as_array(got)
    if a is None:
        raise CheckFailure(f"expected an array of shape {tuple(shape)}, got {type(got).__name__}",
                           case=case, hint=hint)
    if tuple(a.shape) != tuple(shape):
        raise CheckFailure(f"shape {tuple(a.shape)}, expected {tuple(shape)}", case=case, hint=hint)


def _fmt(value: float) -> str:
    """A number for feedback: large whole numbers (bytes, FLOPs) with thousands separators."""
    value = float(value)
    if np.isfinite(value) and value.is_integer() and abs(value) >= 1e4:
        return f"{int(value):,}"
    return f"{value:.6g}"


def expect_close(got: Any, expected: Any, *, case: str, hint=None,
                 rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Fail unless `got` equals `expected` elementwise within ``atol + rtol * |expected|``.

    The message names the case and then the first problem found: a value that is not an array of
    numbers, a shape mismatch (both shapes), a NaN or infinity (first index), or the first
    differing index with got vs expected.
    """
    g = as_array(got, np.float64)
    if g is None:
        raise CheckFailure(f"expected an array of numbers, got {type(got).__name__}", case=case,
                           hint=hint)
    e = _as_array(expected).astype(np.float64)
    if g.shape != e.shape:
        raise CheckFailure(f"shape {g.shape}, expected {e.shape}", case=case, hint=hint)
    bad_finite = ~np.isfinite(g) & np.isfinite(e)
    if bad_finite.any():
        idx = tuple(int(i) for i in np.argwhere(bad_finite)[0])
        raise CheckFailure(f"got {g[idx]} at index {idx}, expected {e[idx]:.6g}", case=case,
                           hint=hint)
    wrong = ~np.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
    if wrong.any() and g.ndim == 0:
        raise CheckFailure(f"got {_fmt(g)}, expected {_fmt(e)}", case=case, hint=hint)
    if wrong.any():
        idx = tuple(int(i) for i in np.argwhere(wrong)[0])
        raise CheckFailure(f"first difference at index {idx}: got {_fmt(g[idx])}, expected "
                           f"{_fmt(e[idx])} ({int(wrong.sum())} of {wrong.size} values differ)",
                           case=case, hint=hint)


def expect_true(condition: bool, *, case: str, message: str, hint=None) -> None:
    """Fail with `message` (and `hint`) unless `condition` holds."""
    if not condition:
        raise CheckFailure(message, case=case, hint=hint)


# ---- the registry --------------------------------------------------------------------------

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


def _load_fresh(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def find(name: str) -> tuple[Callable, str]:
    """The check function of exercise `name` and its module's stem (loaded afresh from disk).

    Raises KeyError for an unknown exercise."""
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
    would let a submission read the instructor's cases out of its own feedback."""
    what = ("your code raised an exception" if err.kind == "raised" else
            "your answer is wrong on this hidden case")
    return CheckFailure(what, case=f"hidden: {err.case}" if err.case else "hidden",
                        hint=err.hints, kind=err.kind)


def run_exercise(name: str, objects: Sequence[Any], namespace: dict | None = None,
                 hidden: Path | None = None, follow_needs: bool = True,
                 public: bool = True) -> Verdict:
    """Run the check of exercise `name` on the learner's `objects`; never raises CheckFailure.

    `namespace` maps the learner's names to their objects (for the checks of the exercises this
    one needs). `hidden`: a folder of instructor-only cases (:func:`hidden_dir`), run after the
    public cases; a failed hidden case says only that it failed, with its name and hint
    (:func:`_hidden_failure`). ``public=False`` runs only the hidden cases (the grader runs every
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


# ---- the check cell ------------------------------------------------------------------------

_last: dict[str, tuple[str, int]] = {}   # exercise -> (first feedback line, hint level shown)
_shown: dict[str, CheckFailure] = {}


def _level_for(name: str, failure: CheckFailure) -> int:
    """1 for a new mistake; one more each time the same mistake comes back."""
    key = failure.feedback(1).splitlines()[0] + "|" + (failure.hints[0] if failure.hints else "")
    previous = _last.get(name)
    level = previous[1] + 1 if previous and previous[0] == key else 1
    _last[name] = (key, level)
    return level


def _render(failure: CheckFailure, level: int) -> list[str]:
    """The lines a notebook shows for a failed check (at most :data:`MAX_LINES`)."""
    name = failure.exercise or "check"
    text = failure.feedback(level).splitlines()
    lines = [f"CheckFailure: {name}: {text[0]}"] + text[1:]
    if len(failure.hints) > level:
        lines.append(f'More: run this check again, or call hint("{name}").')
    return lines[:MAX_LINES]


def _show_failure(shell, etype, evalue, tb, tb_offset=None):
    """IPython's handler for CheckFailure: the feedback lines instead of a long traceback."""
    level = getattr(evalue, "_level", 1)
    lines = _render(evalue, level)
    shell._showtraceback(etype, evalue, lines)
    return lines


def _install_display() -> None:
    """In IPython, show CheckFailure as its few feedback lines (never the checker's frames)."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None) if ipython else None
    shell = get() if get else None
    if shell is not None and CheckFailure not in getattr(shell, "custom_exceptions", ()):
        shell.set_custom_exc((CheckFailure,), _show_failure)


def check(name: str, *objects: Any) -> None:
    """Check the learner's `objects` (functions, classes, values) for exercise `name`.

    Prints ``PASSED: <name>`` on success. Raises :class:`CheckFailure` with feedback on a wrong
    answer (in a notebook shown as a few lines, at the next hint level when the same mistake
    comes back), and ``KeyError`` for an unknown exercise name.
    """
    _install_display()
    caller = sys._getframe(1).f_globals
    verdict = run_exercise(name, objects, namespace=caller, hidden=hidden_dir())
    if verdict.passed:
        _last.pop(name, None)
        print(f"PASSED: {name}")
        return
    failure = verdict.failure
    failure._level = _level_for(name, failure)
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
    failure._level = level
    print("\n".join(_render(failure, level)[1:] or ["(no hint)"]))


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
