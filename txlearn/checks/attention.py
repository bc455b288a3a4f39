"""Checks for lesson 02's exercises: the causal mask and scaled dot-product attention with a mask.

Each check computes the right answer with :mod:`txlearn.masks` / :mod:`txlearn.attention` and, when
the learner's answer differs, compares it with the catalogued mistakes (tests/catalogue/attention.py)
to choose the hint. Cases run from the most diagnostic to the most general.
"""

import numpy as np

from txlearn.attention import attention_np
from txlearn.checks import as_array, diagnose, call, expect_close, expect_shape, expect_true, exercise
from txlearn.masks import causal_mask_np


# ---------------------------------------------------------------- exercise: causal_mask

DIAGONAL = ("keep the diagonal: position i may attend to itself (j <= i, not j < i); hiding it "
            "leaves query 0 with no key at all, a row of NaN")
TRANSPOSED = ("your mask is transposed: it lets query i see the future keys j > i; True must sit "
              "on and below the diagonal (the lower triangle, np.tril)")
POLARITY = ("the course's polarity is True = may attend (as SDPA's boolean attn_mask); yours marks "
            "the hidden positions instead (nn.MultiheadAttention's polarity)")
ALIGNMENT = ("with L queries over S > L keys, align the mask bottom-right: the last query sees all "
             "S keys, so mask[i, j] = j <= i + (S - L) (np.tril(..., k=S - L)); yours is aligned "
             "top-left, as SDPA's is_causal")


def _causal_wrongs(L, S):
    right = causal_mask_np(L, S)
    return [(np.tril(np.ones((L, S), bool), k=S - L - 1), DIAGONAL),
            (right.T if L == S else np.triu(np.ones((L, S), bool), k=S - L), TRANSPOSED),
            (~right, POLARITY),
            (np.tril(np.ones((L, S), bool)), ALIGNMENT)]


@exercise("causal_mask")
def causal_mask(fn):
    for args, case in (((4,), "causal_mask(4)"), ((1,), "causal_mask(1)"),
                       ((2, 5), "causal_mask(2, 5)"), ((3, 3), "causal_mask(3, 3)")):
        L, S = args[0], args[-1]
        got = call(fn, *args, case=case)
        expect_shape(got, (L, S), case=case, hint="return one row per query and one column per key")
        g = as_array(got)
        expect_true(g.dtype == np.bool_, case=case, message=f"dtype {g.dtype}, expected bool",
                    hint="return booleans (True = may attend), e.g. np.tril(np.ones((L, S), "
                         "dtype=bool), ...); 0/1 numbers are easy to add to scores by mistake")
        expect_close(g, causal_mask_np(L, S), case=case, atol=0,
                     hint=diagnose(g, _causal_wrongs(L, S),
                                    "mask[i, j] must be True exactly when j <= i + (S - L)", atol=1e-5))


# ---------------------------------------------------------------- exercise: masked_attention

SCALE_NONE = "divide the scores by sqrt(d_k) (you did not scale them)"
SCALE_MULTIPLIED = "divide the scores by sqrt(d_k); you multiplied by it"
SCALE_TWICE = "divide by sqrt(d_k) once; you divided by d_k (or twice by sqrt(d_k))"
WRONG_AXIS = ("take the softmax over the keys (the last axis, -1): each row of weights must sum to "
              "1 over the S keys")
ADDED_MASK = ("do not add the 0/1 mask to the scores (that only shifts them by 1); set the scores "
              "of hidden keys to -inf (np.where(mask, scores, -np.inf)) before the softmax")
FLIPPED = ("mask polarity: True = may attend; you hid the keys marked True and kept the others")
EMPTY_ROW_NAN = ("a query whose keys are all masked must get weights 0 and output 0, not NaN: "
                 "after exp, divide only where the row sum is > 0 (np.divide(..., where=...))")
EMPTY_ROW_UNIFORM = ("a query whose keys are all masked must get weights 0 and output 0; filling "
                     "with a large negative number makes it average every value uniformly instead")


def _softmax(s, axis):
    e = np.exp(s - s.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _weights(fn, Q, K, V, mask, case):
    result = call(fn, Q, K, V, mask, case=case)
    expect_true(isinstance(result, (tuple, list)) and len(result) == 2, case=case,
                message=f"expected a pair (out, weights), got {type(result).__name__}",
                hint="return out, weights")
    return result


@exercise("masked_attention")
def masked_attention(fn):
    # 1. the scale: raw scores [4, 0] with d_k = 4 -> softmax([2, 0])
    Q = np.ones((1, 4))
    K = np.array([[1.0, 1, 1, 1], [0, 0, 0, 0]])
    V = np.eye(2)
    out, w = _weights(fn, Q, K, V, None, "scale, raw scores [4, 0], d_k = 4")
    scale_wrongs = [(_softmax(np.array([[4.0, 0]]), -1), SCALE_NONE),
                    (_softmax(np.array([[8.0, 0]]), -1), SCALE_MULTIPLIED),
                    (_softmax(np.array([[1.0, 0]]), -1), SCALE_TWICE),
                    (np.ones((1, 2)), WRONG_AXIS)]
    case = "scale, raw scores [4, 0], d_k = 4"
    expect_shape(w, (1, 2), case=case, hint="weights have shape (..., L, S)")
    expect_close(w, [[0.880797, 0.119203]], case=case, atol=1e-6,
                 hint=diagnose(w, scale_wrongs, "weights = softmax(Q K^T / sqrt(d_k)) over keys", atol=1e-5))
    expect_close(out, [[0.880797, 0.119203]], case=case, atol=1e-6,
                 hint="out = weights @ V (here V is the identity, so out equals the weights)")

    # 2. the mask: equal scores, key 2 hidden -> [0.5, 0.5, 0]
    case = "mask, scores [0, 0, 0], key 2 masked"
    Qm, Km, Vm = np.zeros((1, 2)), np.ones((3, 2)), np.arange(6.0).reshape(3, 2)
    mask = np.array([[True, True, False]])
    _, w = _weights(fn, Qm, Km, Vm, mask, case)
    mask_wrongs = [(_softmax(np.array([[1.0, 1, 0]]), -1), ADDED_MASK),
                   (np.array([[0.0, 0, 1]]), FLIPPED)]
    expect_close(w, [[0.5, 0.5, 0.0]], case=case, atol=1e-6,
                 hint=diagnose(w, mask_wrongs, "hidden keys get weight exactly 0", atol=1e-5))

    # 3. a query that may attend to nothing
    case = "fully masked row (query 1 sees no key)"
    rng = np.random.default_rng(0)
    Qe, Ke, Ve = rng.normal(size=(2, 4)), rng.normal(size=(3, 4)), rng.normal(size=(3, 5))
    mask_e = np.array([[True, False, True], [False, False, False]])
    out, w = _weights(fn, Qe, Ke, Ve, mask_e, case)
    o, wt = as_array(out), as_array(w)
    hint = EMPTY_ROW_NAN if (o is not None and np.isnan(np.asarray(o, float)).any()) or \
        (wt is not None and np.isnan(np.asarray(wt, float)).any()) else EMPTY_ROW_UNIFORM
    ref_out, ref_w = attention_np(Qe, Ke, Ve, mask_e, return_weights=True)
    expect_close(w, ref_w, case=case, atol=1e-6, hint=hint)
    expect_close(out, ref_out, case=case, atol=1e-6, hint=hint)

    # 4. batched, L != S, a causal mask over the last L of S positions
    case = "batch (2, 3), L = 4, S = 6, d_k = 8, d_v = 5, causal mask"
    Qb, Kb, Vb = (rng.normal(size=(2, 3, n, d)) for n, d in ((4, 8), (6, 8), (6, 5)))
    mask_b = causal_mask_np(4, 6)
    out, w = _weights(fn, Qb, Kb, Vb, mask_b, case)
    ref_out, ref_w = attention_np(Qb, Kb, Vb, mask_b, return_weights=True)
    expect_shape(out, (2, 3, 4, 5), case=case, hint="out has shape (..., L, d_v): weights @ V")
    axis_wrong = np.where(mask_b, Qb @ np.swapaxes(Kb, -1, -2) / np.sqrt(8), -np.inf)
    expect_close(w, ref_w, case=case, atol=1e-6,
                 hint=diagnose(w, [(_softmax(axis_wrong, -2), WRONG_AXIS)],
                                "use K^T over the last two axes (np.swapaxes(K, -1, -2)) and the "
                                "softmax over the last axis", atol=1e-5))
    expect_close(out, ref_out, case=case, atol=1e-6, hint="out = weights @ V")
