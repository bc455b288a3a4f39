"""Helpers shared by the checks of the module track (sets 03-07): the learner writes PyTorch
functions and ``nn.Module`` classes, and the checks drive them only through :func:`call`,
:func:`construct`, :func:`load_state` and :func:`forward_backward` (see ``txlearn.checks``).

These helpers add what those checks have in common: a hint chosen by the message of the exception
the learner's code raised (``raised=[(text, hint), ...]``), a hint chosen by a wrong shape, a
wrong dtype or a wrong state-dict name, and float64 NumPy copies of tensors.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from txlearn.checks import (CheckFailure, as_array, call, construct, diagnose, expect_close,
                            expect_true, forward_backward, load_state)

# Tolerances for answers computed in float32 against a float64 reference.
F32 = {"rtol": 1e-4, "atol": 2e-5}


def rehint(err: CheckFailure, hint) -> CheckFailure:
    """The same failure with another hint (levels)."""
    return CheckFailure(err.what, case=err.case, hint=hint, kind=err.kind, frames=err.frames)


def guarded(helper: Callable, *args: Any, raised: Sequence = (), **kwargs: Any):
    """``helper(*args, **kwargs)`` (``call``, ``construct`` or ``forward_backward``); when the
    learner's code raised, the hint is the first of ``raised`` whose text occurs in the error
    message (``None`` as text matches any message)."""
    try:
        return helper(*args, **kwargs)
    except CheckFailure as err:
        if err.kind == "raised":
            for text, hint in raised:
                if text is None or text in err.what:
                    raise rehint(err, hint) from None
        raise


def run(fn, *args, case: str, raised: Sequence = (), hint=None, **kwargs):
    """:func:`call` with hints chosen by the exception's message."""
    return guarded(call, fn, *args, case=case, raised=raised, hint=hint, **kwargs)


def build(cls, *args, case: str, raised: Sequence = (), **kwargs):
    """:func:`construct` with hints chosen by the exception's message."""
    return guarded(construct, cls, *args, case=case, raised=raised, **kwargs)


def backward(module, *args, grad_output, case: str, raised: Sequence = (), **kwargs):
    """:func:`forward_backward` with hints chosen by the exception's message."""
    return guarded(forward_backward, module, *args, grad_output=grad_output, case=case,
                   raised=raised, **kwargs)


def load(module, state: dict, *, case: str, names=None, unexpected=None,
         shapes: dict | None = None) -> None:
    """:func:`load_state` with hints of our own: ``unexpected`` when the module only has names
    the statement does not give, ``names`` for any other difference of names, ``shapes[name]``
    when parameter ``name`` has another shape."""
    try:
        load_state(module, state, case=case)
    except CheckFailure as err:
        if err.kind == "wrong":
            if err.what.startswith("parameter "):
                name = err.what.split()[1]
                if shapes and name in shapes:
                    raise rehint(err, shapes[name]) from None
            elif unexpected is not None and "has no " not in err.what:
                raise rehint(err, unexpected) from None
            elif names is not None:
                raise rehint(err, names) from None
        raise


def _quiet(wrong):
    """A catalogued mistake's output, or NaN when that mistake cannot run on these inputs."""
    if not callable(wrong):
        return wrong

    def compute():
        try:
            return wrong()
        except Exception:  # e.g. a matmul that only fails for this mistake
            return np.nan
    return compute


def expect_match(got, expected, *, case: str, mistakes: Sequence = (), default=None,
                 rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """:func:`expect_close`; only when it fails are the ``mistakes`` (``(output or function,
    hint)`` pairs) compared with ``got`` to choose the hint (``default`` when none matches)."""
    try:
        expect_close(got, expected, case=case, hint=default, rtol=rtol, atol=atol)
    except CheckFailure as err:
        hint = diagnose(got, [(_quiet(w), h) for w, h in mistakes], default, rtol=rtol, atol=atol)
        raise rehint(err, hint) from None


def expect_pair(got, *, case: str, hint) -> tuple:
    """Fail unless ``got`` is a pair (tuple or list of two)."""
    expect_true(isinstance(got, (tuple, list)) and len(got) == 2, case=case,
                message=f"expected a pair of tensors, got {type(got).__name__}", hint=hint)
    return tuple(got)


def expect_tensor(got, *, case: str, hint) -> None:
    """Fail unless ``got`` is a ``torch.Tensor`` (a NumPy array breaks autograd)."""
    expect_true(type(got).__module__.startswith("torch"), case=case,
                message=f"expected a torch.Tensor, got {type(got).__name__}", hint=hint)


def expect_dtype(got, dtype, *, case: str, hint) -> None:
    """Fail unless ``got`` (a tensor) has ``dtype`` (a torch dtype)."""
    have = getattr(got, "dtype", None)
    expect_true(have == dtype, case=case,
                message=f"dtype {have}, expected {dtype}".replace("torch.", ""), hint=hint)


def expect_shape_of(got, shape: tuple, *, case: str, wrong: Sequence = (), hint=None) -> None:
    """Fail unless ``got`` has ``shape``; the hint is the one of ``wrong`` (``(shape, hint)``
    pairs: the shapes that known mistakes give) matching got's shape, else ``hint``."""
    a = as_array(got)
    if a is None:
        raise CheckFailure(f"expected a tensor of shape {tuple(shape)}, got {type(got).__name__}",
                           case=case, hint=hint)
    have = tuple(a.shape)
    if have != tuple(shape):
        chosen = next((h for s, h in wrong if tuple(s) == have), hint)
        raise CheckFailure(f"shape {have}, expected {tuple(shape)}", case=case, hint=chosen)


def np64(t) -> np.ndarray:
    """A tensor (or array) as a float64 NumPy array."""
    return as_array(t, np.float64)
