"""Talking to the learner's objects: :func:`call`, :func:`construct`, :func:`load_state`,
:func:`state_shapes`, :func:`forward_backward`, the proxy base :class:`LearnerObject`, and what
can go wrong on the way (:class:`LearnerError`, :class:`LearnerTimeout`,
:class:`LearnerChangedInput`), each turned into a :class:`~txlearn.checks.feedback.CheckFailure`.

A check never touches the learner's objects itself: in a learner's kernel these helpers act on
the real objects, under ``txlearn grade`` on proxies for a sandboxed runner
(:class:`LearnerObject`), and the same check runs in the grader's process. What both places must
compute the same way (the copies handed to the learner's code and the in-place rule, the state
load, forward and backward, the time limit, the learner's frames) is
:mod:`txlearn.learner_calls`, used here and by the grader's runner.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numpy as np

from txlearn import learner_calls
from txlearn.checks.feedback import STUB, CheckFailure, clean
from txlearn.learner_calls import (METHOD_NAME, TimeLimitExceeded, call_on_copies,
                                   learner_frames, load_state_dict, local_forward_backward,
                                   parameter_name)

__all__ = ["call", "construct", "load_state", "state_shapes", "cache_shapes", "record_starts",
           "forward_backward", "method", "LearnerObject", "LearnerError", "LearnerTimeout", "LearnerChangedInput",
           "DEFAULT_TIME_LIMIT"]


def _default_time_limit() -> float:
    """Seconds one call of the learner's code may take: 10, or ``TXLEARN_TIME_LIMIT`` when set
    (a slow machine may need more; the tests of this module use less)."""
    try:
        value = float(os.environ.get("TXLEARN_TIME_LIMIT", "10"))
    except ValueError:
        value = 10.0
    return value if value > 0 else 10.0


DEFAULT_TIME_LIMIT = _default_time_limit()


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

    def remote_cache_shapes(self, time_limit: float | None) -> list:
        raise NotImplementedError

    def remote_record_starts(self, args: tuple, kwargs: dict, steps: list,
                             time_limit: float | None) -> list:
        raise NotImplementedError

    def remote_is_module(self) -> bool:
        raise NotImplementedError

    def remote_method(self, name: str) -> "LearnerObject":
        raise NotImplementedError


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
        raise CheckFailure(STUB[0], case=case, hint=STUB[1], kind="stub") from None
    except LearnerError as err:
        if err.type_name == "NotImplementedError":
            raise CheckFailure(STUB[0], case=case, hint=STUB[1], kind="stub") from None
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


def method(obj: Any, name: str) -> Any:
    """The learner's ``obj.name`` as something :func:`call` can call (a model's
    ``reset_cache``), looked up when it is called, where ``obj`` lives: a missing method fails
    as the learner's own AttributeError would. ``name`` must be a public name (a course bug
    otherwise: ValueError)."""
    if not METHOD_NAME.fullmatch(name):
        raise ValueError(f"not a public method name: {name!r}")
    if isinstance(obj, LearnerObject):
        return obj.remote_method(name)
    return lambda *args, **kwargs: getattr(obj, name)(*args, **kwargs)


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


def cache_shapes(module: Any, *, case: str,
                 time_limit: float | None = DEFAULT_TIME_LIMIT) -> list[list[tuple]]:
    """The shapes held in the ``kv_cache`` attributes of the learner's module and its
    submodules (:func:`txlearn.learner_calls.cache_shapes`), read where the module lives."""
    if isinstance(module, LearnerObject):
        return _run_learner(lambda: module.remote_cache_shapes(time_limit), case=case,
                            remote=True, time_limit=time_limit)
    return _run_learner(lambda: learner_calls.cache_shapes(module), case=case,
                        time_limit=time_limit)


def record_starts(cls: Any, *args: Any, steps: list, case: str,
                  time_limit: float | None = DEFAULT_TIME_LIMIT, **kwargs: Any) -> list[int]:
    """The ``start`` each cached call of an attention module built from the learner's class
    passes to ``apply_positions`` (:func:`txlearn.learner_calls.record_starts`), run where the
    class lives; ``steps`` is a list of ``(x, mask)``."""
    if isinstance(cls, LearnerObject):
        return _run_learner(lambda: cls.remote_record_starts(args, kwargs, steps, time_limit),
                            case=case, remote=True, time_limit=time_limit)
    if not isinstance(cls, type):
        raise CheckFailure(f"expected a class, got {type(cls).__name__}", case=case,
                           hint="run the cell that defines your class before this check",
                           kind="missing")
    return _run_learner(lambda: learner_calls.record_starts(cls, args, kwargs, steps),
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
