"""Comparing a learner's answer with the expected one: :func:`expect_close`,
:func:`expect_shape`, :func:`expect_true`, :func:`diagnose` (which catalogued mistake an answer
reproduces) and :func:`as_array` (an answer as a NumPy array, or None).

Every failure is a :class:`~txlearn.checks.feedback.CheckFailure` naming the case and the first
problem found: a value that is not an array of numbers, a shape mismatch (both shapes), a NaN or
infinity, or the first differing index with got vs expected.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from txlearn.checks.feedback import CheckFailure

__all__ = ["expect_close", "expect_shape", "expect_true", "diagnose", "as_array"]


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


def _fmt(value: float, digits: int = 6) -> str:
    """A number for feedback: large whole numbers (bytes, FLOPs) with thousands separators, else
    `digits` significant digits."""
    value = float(value)
    if np.isfinite(value) and value.is_integer() and abs(value) >= 1e4:
        return f"{int(value):,}"
    return f"{value:.{digits}g}"


def _difference(got: float, expected: float) -> str:
    """``got X, expected Y (error E, relative R)``, with as many digits as it takes for X and Y
    to read differently (a message never says "got 0.156422, expected 0.156422")."""
    got, expected = float(got), float(expected)
    digits = 6
    while digits < 17 and _fmt(got, digits) == _fmt(expected, digits):
        digits += 1
    error = abs(got - expected)
    text = f"got {_fmt(got, digits)}, expected {_fmt(expected, digits)} (error {error:.3g}"
    if expected != 0:
        text += f", relative {error / abs(expected):.3g}"
    return text + ")"


def expect_close(got: Any, expected: Any, *, case: str, hint=None,
                 rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Fail unless `got` equals `expected` elementwise within ``atol + rtol * |expected|``.

    The message names the case and then the first problem found: a value that is not an array of
    numbers, a shape mismatch (both shapes), a NaN or infinity (first index), or the first
    differing index with got vs expected, in as many digits as it takes to tell them apart, and
    the absolute and relative error.
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
        raise CheckFailure(_difference(g, e), case=case, hint=hint)
    if wrong.any():
        idx = tuple(int(i) for i in np.argwhere(wrong)[0])
        raise CheckFailure(f"first difference at index {idx}: {_difference(g[idx], e[idx])}; "
                           f"{int(wrong.sum())} of {wrong.size} values differ",
                           case=case, hint=hint)


def expect_true(condition: bool, *, case: str, message: str, hint=None) -> None:
    """Fail with `message` (and `hint`) unless `condition` holds."""
    if not condition:
        raise CheckFailure(message, case=case, hint=hint)
