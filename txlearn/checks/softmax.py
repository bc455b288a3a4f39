"""Checks of lesson 01's exercises: stable_softmax, scaled_scores, softmax_jacobian, log_softmax.

Each check runs the learner's function on inputs chosen so that every catalogued mistake
(``tests/catalogue/softmax.py``) gives a wrong answer, most diagnostic case first. When an answer
is wrong, the check recomputes what each known mistake would have returned on that input; the
first one that matches the learner's output picks the hint.

Source: ``exercises/source/01_softmax.py``; golden values from issue 2.
"""

from __future__ import annotations

import math

import numpy as np

from txlearn.checks import (as_array, call, diagnose, exercise, expect_close, expect_shape,
                            expect_true)
from txlearn.softmax import log_softmax_np, softmax_jacobian_np, softmax_np

# ----------------------------------------------------------------------------- helpers


def _expect_unchanged(before, after, *, case: str, name: str) -> None:
    expect_true(np.array_equal(before, after, equal_nan=True), case=case,
                message=f"your function changed its input `{name}` in place",
                hint=(f"the caller still needs `{name}`: leave it unchanged",
                      f"in-place operations (`-=`, `/=`, `out=`) change the caller's array: "
                      f"build a new array instead"))


def _softmax_global_max(x, axis):
    e = np.exp(x - x.max())
    return e / e.sum(axis=axis, keepdims=True)


def _softmax_clamped(x, axis):
    e = np.exp(x - np.maximum(x.max(axis=axis, keepdims=True), 0))
    return e / e.sum(axis=axis, keepdims=True)


def _softmax_no_keepdims(x, axis):
    e = np.exp(x - x.max(axis=axis))
    return e / e.sum(axis=axis)


def _log_softmax_no_keepdims(x, axis):
    z = x - x.max(axis=axis)
    return z - np.log(np.exp(z).sum(axis=axis))


def _softmax_sum_no_keepdims(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis)


def _softmax_global_sum(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum()


# ----------------------------------------------------------------------------- stable_softmax

HINT_NO_SHIFT = ("what does exp() do with a logit of 1000?",
                 "exp(1000) overflows to inf and inf/inf is NaN: subtract the maximum before exp() "
                 "(softmax(x - c) = softmax(x) for any constant c)",
                 "the maximum must be taken along `axis` and kept broadcastable (keepdims)")
HINT_CLAMPED = ("what does exp() do with a logit of -1e4?",
                "every exp(-1e4) underflows to 0 and 0/0 is NaN: shift by the maximum itself, even "
                "when it is negative; do not clamp the shift at 0")
HINT_GLOBAL_MAX = ("each slice is its own distribution: whose maximum do you subtract?",
                   "one maximum for the whole array makes row 0 exp(0 - 1001) = 0, then 0/0: take "
                   "the maximum of each slice along `axis`")
HINT_WRONG_AXIS = ("along which axis must the values sum to 1?",
                   "you normalised along another axis: use the `axis` argument in both the max "
                   "and the sum")
HINT_KEEPDIMS = ("check how each reduction along `axis` (the max and the sum) broadcasts back "
                 "against x",
                 "a reduction along `axis` drops that axis: a (3, 4) array's sum over axis=-1 "
                 "has shape (3,), which no longer lines up with x's rows; keep the reduced axis "
                 "(keepdims) in the max and in the sum")
HINT_MAX_KEEPDIMS = ("check how the per-row maximum broadcasts back against x",
                     "a reduction along `axis` drops that axis, so the max of row i is "
                     "subtracted from column i: keep the reduced axis (keepdims) in the max")
HINT_SUM_KEEPDIMS = ("check how the per-row sum broadcasts back against x",
                     "your maximum keeps its axis but your sum does not: the sum of row i divides "
                     "column i; keep the reduced axis (keepdims) in the sum as well")
HINT_GLOBAL_SUM = ("each slice must sum to 1, not the whole array",
                   "sum along `axis` only (and keep that axis for broadcasting)")


DEFAULT_SOFTMAX = ("softmax(x)_i = exp(x_i - m) / sum_j exp(x_j - m), with m = max(x) along `axis`",)
DEFAULT_ROWS = ("each row of a 2-D input is its own distribution",)
DEFAULT_AXIS = ("the values must sum to 1 along `axis`",)


@exercise("stable_softmax")
def stable_softmax(softmax):
    """Check `softmax(x, axis=-1)` on NumPy arrays: golden values, every axis, no in-place edit."""
    golden = [
        ("large logits [1000, 1001, 1002]", [1000.0, 1001.0, 1002.0],
         [0.090031, 0.244728, 0.665241], HINT_NO_SHIFT),
        ("all logits -1e4: [-1e4, -1e4]", [-1e4, -1e4], [0.5, 0.5], HINT_CLAMPED),
    ]
    for case, x, expected, hint in golden:
        x = np.array(x)
        got = call(softmax, x.copy(), case=case, hint="x is a 1-D NumPy array of floats here")
        hint = diagnose(got, [
            (lambda: _softmax_clamped(x, -1), hint),
            (lambda: np.exp(x) / np.exp(x).sum(), hint),
        ], DEFAULT_SOFTMAX, rtol=1e-5)
        expect_close(got, expected, case=case, hint=hint, rtol=0, atol=1e-6)

    case = "row-wise, axis=-1: [[0, 1], [1000, 1001]]"
    x = np.array([[0.0, 1.0], [1000.0, 1001.0]])
    got = call(softmax, x.copy(), axis=-1, case=case, hint=HINT_KEEPDIMS)
    hint = diagnose(got, [
        (lambda: _softmax_global_max(x, -1), HINT_GLOBAL_MAX),
        (lambda: softmax_np(x, axis=0), HINT_WRONG_AXIS),
        (lambda: _softmax_no_keepdims(x, -1), HINT_MAX_KEEPDIMS),
        (lambda: _softmax_global_sum(x, -1), HINT_GLOBAL_SUM),
        (lambda: np.exp(x) / np.exp(x).sum(-1, keepdims=True), HINT_NO_SHIFT),
    ], DEFAULT_ROWS, rtol=1e-5)
    expect_close(got, [[0.268941, 0.731059], [0.268941, 0.731059]], case=case, hint=hint,
                 rtol=0, atol=1e-6)

    # rows whose sums differ, square so that a sum without keepdims broadcasts without an error
    case = "row-wise, axis=-1: [[0, 1], [0, 0]] (the rows' sums differ)"
    x = np.array([[0.0, 1.0], [0.0, 0.0]])
    got = call(softmax, x.copy(), axis=-1, case=case, hint=HINT_KEEPDIMS)
    hint = diagnose(got, [
        (lambda: _softmax_sum_no_keepdims(x, -1), HINT_SUM_KEEPDIMS),
        (lambda: _softmax_no_keepdims(x, -1), HINT_KEEPDIMS),
        (lambda: softmax_np(x, axis=0), HINT_WRONG_AXIS),
        (lambda: _softmax_global_sum(x, -1), HINT_GLOBAL_SUM),
    ], DEFAULT_ROWS, rtol=1e-5)
    expect_close(got, softmax_np(x, axis=-1), case=case, hint=hint, rtol=0, atol=1e-6)

    x = np.random.default_rng(0).normal(scale=3.0, size=(2, 3, 4))
    for axis in (0, 1, 2, -2):
        case = f"3-D input of shape (2, 3, 4), axis={axis}"
        before = x.copy()
        got = call(softmax, x, axis=axis, case=case, hint=HINT_KEEPDIMS)
        _expect_unchanged(before, x, case=case, name="x")
        expect_shape(got, x.shape, case=case, hint=HINT_KEEPDIMS)
        hint = diagnose(got, [
            (lambda: softmax_np(x, -1), HINT_WRONG_AXIS[:1] + (HINT_WRONG_AXIS[1] + " (you always used the last axis)",)),
            (lambda: softmax_np(x, 0), HINT_WRONG_AXIS),
            (lambda: _softmax_global_sum(x, axis), HINT_GLOBAL_SUM),
        ], DEFAULT_AXIS, rtol=1e-5)
        expect_close(got, softmax_np(x, axis=axis), case=case, hint=hint)


    _expect_default_axis(softmax, softmax_np)


HINT_DEFAULT_AXIS = ("which axis does a call without `axis` use?",
                     "keep the signature's default, axis=-1: called as f(x) on a 2-D array, it "
                     "normalises each row")


def _expect_default_axis(fn, reference):
    x = np.random.default_rng(5).normal(scale=2.0, size=(3, 4))
    case = "a 2-D input (3, 4) called without axis (the default, axis=-1)"
    got = call(fn, x.copy(), case=case, hint=HINT_KEEPDIMS)
    expect_shape(got, x.shape, case=case, hint=HINT_KEEPDIMS)
    expect_close(got, reference(x, axis=-1), case=case, rtol=1e-6, atol=1e-9,
                 hint=HINT_DEFAULT_AXIS)


# ----------------------------------------------------------------------------- scaled_scores

HINT_NO_SCALE = ("the dot products are too large: what makes their variance 1?",
                 "divide the dot products by sqrt(d_k)")
HINT_BY_D_K = ("check the size of the scale",
               "you divided by d_k; the scale is 1/sqrt(d_k) (it makes Var(score) = 1, not 1/d_k)")
HINT_TIMES = ("check the direction of the scale", "you multiplied by sqrt(d_k); divide by it instead")
HINT_WRONG_D = ("which length is d_k?",
                "d_k is the size of the LAST axis (the width of one query), not the number of "
                "queries or keys")
HINT_SOFTMAX = ("what does this function return: scores or weights?",
                "return the scores themselves; the softmax comes after, in attention")
HINT_NP_DOT = ("which product batches over the leading axes?",
               "np.dot of N-D arrays is not a batched product: it pairs every batch entry of Q "
               "with every batch entry of K, (2, 3, 16) and (2, 16, 5) give (2, 3, 2, 5); use the "
               "@ operator (np.matmul), which pairs batch b of Q with batch b of K")
HINT_BATCH_T = ("Q K^T pairs every query with every key: which axes of K must swap?",
                "for batched inputs transpose only the last two axes of K (a full transpose "
                "reverses every axis), and use a product that batches over the leading axes "
                "(the @ operator)")


DEFAULT_SCORES = ("scores[..., l, s] = q_l . k_s / sqrt(d_k)",)


@exercise("scaled_scores")
def scaled_scores(scaled_scores):
    """Check `scaled_scores(Q, K)`: ``Q K^T / sqrt(d_k)`` for Q (..., L, d_k), K (..., S, d_k)."""
    rng = np.random.default_rng(1)
    for batch in ((), (2,)):
        L, S, d_k = 3, 5, 16  # sqrt(L), sqrt(S), sqrt(d_k), d_k all differ: each mistake shows
        Q = rng.normal(size=(*batch, L, d_k))
        K = rng.normal(size=(*batch, S, d_k))
        case = f"Q {Q.shape}, K {K.shape}"
        Q0, K0 = Q.copy(), K.copy()
        got = call(scaled_scores, Q, K, case=case, hint=HINT_BATCH_T)
        _expect_unchanged(Q0, Q, case=case, name="Q")
        _expect_unchanged(K0, K, case=case, name="K")
        g = as_array(got, np.float64)
        expect_true(g is not None, case=case, message=f"expected an array of numbers, got "
                    f"{type(got).__name__}", hint=("return the scores as an array",))
        shape_hint = {(*batch, S, L): "scores[l, s] = q_l . k_s has shape (L, S): compute "
                                      "Q @ K^T, not K @ Q^T",
                      (*batch, d_k, d_k): "Q^T K sums over the positions; Q @ K^T sums over "
                                          "d_k",
                      (*batch, L, *batch, S): HINT_NP_DOT}.get(g.shape, HINT_BATCH_T)
        expect_shape(g, (*batch, L, S), case=case, hint=shape_hint)
        dots = Q @ np.swapaxes(K, -1, -2)  # (..., L, d_k) @ (..., d_k, S) -> (..., L, S)
        hint = diagnose(g, [
            (lambda: dots, HINT_NO_SCALE),
            (lambda: dots / d_k, HINT_BY_D_K),
            (lambda: dots * math.sqrt(d_k), HINT_TIMES),
            (lambda: dots / math.sqrt(L), HINT_WRONG_D),
            (lambda: dots / math.sqrt(S), HINT_WRONG_D),
            (lambda: softmax_np(dots / math.sqrt(d_k), axis=-1), HINT_SOFTMAX),
        ], DEFAULT_SCORES, rtol=1e-5)
        expect_close(g, dots / math.sqrt(d_k), case=case, hint=hint)


# ----------------------------------------------------------------------------- softmax_jacobian

HINT_NO_DIAG = ("what is d s_i / d x_i?", "the diagonal needs s_i as well: J = diag(s) - s s^T")
HINT_NO_OUTER = ("what is d s_i / d x_j for i != j?", "the off-diagonal entries are -s_i s_j: J = diag(s) - s s^T")
HINT_DIAG_ONLY = ("the Jacobian is a full matrix",
                  "you returned only the diagonal s_i (1 - s_i); the off-diagonal entries are -s_i s_j")
HINT_SIGN = ("raising x_i raises s_i: what sign has d s_i / d x_i?",
             "the sign is flipped: J = diag(s) - s s^T (d s_i / d x_i = s_i (1 - s_i) > 0)")
HINT_LOGITS = ("the formula is in terms of the probabilities",
               "use s = softmax(x) in the formula, not the logits x")
HINT_ELEMENTWISE = ("s s^T has n x n entries",
                    "s s^T is an outer product (entry [i, j] = s_i s_j); s * s is elementwise")
HINT_1D_OUTER = ("what is s @ s.T for a 1-D s?",
                 "a 1-D array has no second axis: s.T is s itself and s @ s.T is the number "
                 "sum_i s_i^2, subtracted from every entry; s s^T is the outer product (n, n), "
                 "entry [i, j] = s_i s_j: make s a column (n, 1) first, or use an outer product")
HINT_DELTA = ("which entries get the s_i term?",
              "J_ij = s_i (delta_ij - s_j): only the diagonal gets s_i; off the diagonal it is "
              "-s_i s_j, not s_i (1 - s_j)")


DEFAULT_JACOBIAN = ("J = diag(s) - s s^T with s = softmax(x)",)


@exercise("softmax_jacobian")
def softmax_jacobian(softmax_jacobian):
    """Check `softmax_jacobian(x)`: the (n, n) matrix ``J_ij = ds_i/dx_j`` for x of shape (n,)."""
    cases = [("logits [0.5, -1, 2, 0]", np.array([0.5, -1.0, 2.0, 0.0])),
             ("large logits [1000, 1001, 1002]", np.array([1000.0, 1001.0, 1002.0]))]
    for case, x in cases:
        n = x.shape[0]
        before = x.copy()
        got = call(softmax_jacobian, x, case=case)
        _expect_unchanged(before, x, case=case, name="x")
        expect_shape(got, (n, n), case=case,
                     hint=("the Jacobian is a full matrix",
                           "return the (n, n) matrix J[i, j] = d s_i / d x_j"))
        s = softmax_np(x)
        hint = diagnose(got, [
            (lambda: -np.outer(s, s), HINT_NO_DIAG),
            (lambda: np.diag(s), HINT_NO_OUTER),
            (lambda: np.diag(s * (1 - s)), HINT_DIAG_ONLY),
            (lambda: np.outer(s, s) - np.diag(s), HINT_SIGN),
            (lambda: np.diag(x) - np.outer(x, x), HINT_LOGITS),
            (lambda: np.diag(s) - s * s, HINT_ELEMENTWISE),
            (lambda: np.diag(s) - s @ s, HINT_1D_OUTER),
            (lambda: np.outer(s, 1 - s), HINT_DELTA),
        ], HINT_NO_SHIFT if case.startswith("large") else DEFAULT_JACOBIAN, rtol=1e-5)
        expect_close(got, softmax_jacobian_np(x), case=case, hint=hint, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- log_softmax

HINT_LOG_OF_SOFTMAX = ("what is log(softmax(x)) when exp() underflows to 0?",
                       "log(softmax(x)) is log(0) = -inf once exp() underflows: compute it as the "
                       "shifted logits minus the log of the sum of their exponentials (log-sum-exp)")
HINT_LSE_NO_SHIFT = ("what does exp() do with a logit of 1000?",
                     "log(sum(exp(x))) overflows for large x: shift by the maximum first, then "
                     "subtract the log-sum-exp of the shifted values")
HINT_FORGOT_SHIFT_BACK = ("check which values the log-sum-exp is subtracted from",
                          "you subtracted the shifted log-sum-exp from x instead of from the "
                          "shifted logits: the result is off by max(x)")


DEFAULT_LOG_SOFTMAX = ("log_softmax(x) = z - log(sum(exp(z))) with z = x - max(x) along `axis`",)


@exercise("log_softmax")
def log_softmax(log_softmax):
    """Check `log_softmax(x, axis=-1)` on NumPy arrays: finite where log(softmax) is not."""
    cases = [("logits [0, -1000]", np.array([0.0, -1000.0]), -1),
             ("large logits [1000, 1001, 1002]", np.array([1000.0, 1001.0, 1002.0]), -1),
             ("row-wise, axis=-1: [[0, 1], [1000, 1001]]",
              np.array([[0.0, 1.0], [1000.0, 1001.0]]), -1),
             ("3-D input of shape (2, 3, 4), axis=1",
              np.random.default_rng(2).normal(scale=3.0, size=(2, 3, 4)), 1)]
    for case, x, axis in cases:
        before = x.copy()
        got = call(log_softmax, x, axis=axis, case=case, hint=HINT_KEEPDIMS)
        _expect_unchanged(before, x, case=case, name="x")
        expect_shape(got, x.shape, case=case, hint=HINT_KEEPDIMS)
        m = x.max(axis=axis, keepdims=True)
        hint = diagnose(got, [
            (lambda: np.log(softmax_np(x, axis=axis)), HINT_LOG_OF_SOFTMAX),
            (lambda: x - np.log(np.exp(x).sum(axis=axis, keepdims=True)), HINT_LSE_NO_SHIFT),
            (lambda: x - np.log(np.exp(x - m).sum(axis=axis, keepdims=True)),
             HINT_FORGOT_SHIFT_BACK),
            (lambda: log_softmax_np(x, axis=0), HINT_WRONG_AXIS),
            (lambda: _log_softmax_no_keepdims(x, axis), HINT_MAX_KEEPDIMS),
        ], DEFAULT_LOG_SOFTMAX, rtol=1e-5)
        expect_close(got, log_softmax_np(x, axis=axis), case=case, hint=hint, rtol=1e-6,
                     atol=1e-6)
    _expect_default_axis(log_softmax, log_softmax_np)


# the hints given when no catalogued mistake is recognised (tests assert a mistake never gets them)
DEFAULTS = {
    "stable_softmax": [DEFAULT_SOFTMAX, DEFAULT_ROWS, DEFAULT_AXIS],
    "scaled_scores": [DEFAULT_SCORES],
    "softmax_jacobian": [DEFAULT_JACOBIAN],
    "log_softmax": [DEFAULT_LOG_SOFTMAX],
}
