"""Checks for lesson 02's exercises: the causal mask and scaled dot-product attention with a mask.

Each check computes the right answer with :mod:`txlearn.masks` / :mod:`txlearn.attention` and, when
the learner's answer differs, compares it with the catalogued mistakes (tests/catalogue/attention.py)
to choose the hint. Cases run from the most diagnostic to the most general; every hint has levels,
the first naming the concept, later ones more specific, none giving a line of the solution.
"""

import numpy as np

from txlearn.attention import attention_np
from txlearn.checks import (as_array, call, diagnose, exercise, expect_close, expect_shape,
                            expect_true)
from txlearn.masks import causal_mask_np


# ---------------------------------------------------------------- exercise: causal_mask

DIAGONAL = ("may a token attend to itself?",
            "keep the diagonal: query i may see key i (j <= i, not j < i); without it query 0 "
            "sees no key at all and its row becomes NaN")
TRANSPOSED = ("which keys may query i see: the earlier ones or the later ones?",
              "your mask is transposed: query i sees the future keys j > i; True belongs on and "
              "below the diagonal")
POLARITY = ("what does True mean in the course's masks?",
            "the course's polarity is True = may attend (as SDPA's boolean attn_mask); yours "
            "marks the hidden positions (nn.MultiheadAttention's polarity)")
ALIGNMENT = ("with fewer queries than keys, which S positions are the L queries?",
             "the L queries are the LAST L of S positions: align the mask to the bottom-right "
             "corner, so the last query sees all S keys (yours is aligned top-left, as SDPA's "
             "is_causal)",
             "mask[i, j] is True exactly when j <= i + (S - L)")
NOT_BOOL = ("masks are booleans, not numbers",
            "return a boolean array (True = may attend); 0/1 numbers get added to scores by "
            "mistake")
MASK_DEFAULT = ("the mask is True exactly where key j is at or before query i's position",
                "with L queries over S keys, query i sits at position i + (S - L)")


def _causal_wrongs(L, S):
    right = causal_mask_np(L, S)
    return [(np.tril(np.ones((L, S), bool), k=S - L - 1), DIAGONAL),
            (right.T if L == S else np.triu(np.ones((L, S), bool), k=S - L), TRANSPOSED),
            (~right, POLARITY),
            (np.tril(np.ones((L, S), bool), k=-1), DIAGONAL),      # and aligned top-left
            (np.tril(np.ones((L, S), bool)), ALIGNMENT)]


@exercise("causal_mask")
def causal_mask(causal_mask):
    for args, case in (((2, 5), "causal_mask(2, 5): L = 2 queries over S = 5 keys"),
                       ((4,), "causal_mask(4)"), ((1,), "causal_mask(1)"),
                       ((3, 3), "causal_mask(3, 3)"), ((1, 6), "causal_mask(1, 6): one new token")):
        L, S = args[0], args[-1]
        got = call(causal_mask, *args, case=case)
        expect_shape(got, (L, S), case=case,
                     hint=("one row per query, one column per key: (L, S)",))
        g = as_array(got)
        if g.dtype != np.bool_:   # numbers: right values get the dtype hint, wrong ones theirs
            right_values = np.array_equal(g.astype(bool), causal_mask_np(L, S))
            expect_true(False, case=case, message=f"dtype {g.dtype}, expected bool",
                        hint=NOT_BOOL if right_values else diagnose(g, _causal_wrongs(L, S),
                                                                    MASK_DEFAULT, atol=1e-5))
        expect_close(g, causal_mask_np(L, S), case=case, atol=0,
                     hint=diagnose(g, _causal_wrongs(L, S), MASK_DEFAULT, atol=1e-5))


# ---------------------------------------------------------------- exercise: padding_mask

PAD_POLARITY = ("what does True mean in the course's masks?",
                "True marks a real token (may attend), False the padding; yours is the opposite")
PAD_OFF_BY_ONE = ("how many real tokens does a sequence of length n have?",
                  "positions 0 .. n - 1 are real: compare strictly (position < length); yours "
                  "also marks position n, or misses position n - 1")
PAD_TRANSPOSED = ("one row per sequence, one column per position",
                  "return (B, S): row b is sequence b; yours is transposed (S, B)")
PAD_LEFT = ("where does the padding go?",
            "the sequences are padded at the end: real tokens first, then padding; yours puts the "
            "padding first")
PAD_NOT_BOOL = ("masks are booleans, not numbers",
                "return a boolean array (True = real token); 0/1 numbers get added to scores by "
                "mistake")
PAD_DEFAULT = ("mask[b, j] is True exactly when position j comes before the length of sequence b",)


def _padding_wrongs(lengths, S):
    pos, n = np.arange(S)[None, :], np.asarray(lengths)[:, None]
    return [(pos >= n, PAD_POLARITY), (pos <= n, PAD_OFF_BY_ONE), (pos < n - 1, PAD_OFF_BY_ONE),
            ((pos < n).T, PAD_TRANSPOSED), (pos >= S - n, PAD_LEFT)]


@exercise("padding_mask")
def padding_mask(padding_mask):
    cases = [("lengths [3, 1, 4], S = 4", [3, 1, 4], 4),
             ("lengths [2, 2], S = 5 (a square batch would hide a transpose)", [2, 2], 5),
             ("an empty sequence: lengths [0, 3], S = 3", np.array([0, 3]), 3),
             ("one sequence, no padding: lengths [6], S = 6", [6], 6)]
    for case, lengths, S in cases:
        got = call(padding_mask, lengths, S, case=case)
        right = np.arange(S)[None, :] < np.asarray(lengths)[:, None]
        g = as_array(got)
        expect_true(g is not None, case=case, message=f"expected an array, got {type(got).__name__}",
                    hint=("return a boolean array of shape (B, S)",))
        if g.dtype != np.bool_:
            expect_true(False, case=case, message=f"dtype {g.dtype}, expected bool",
                        hint=PAD_NOT_BOOL if g.shape == right.shape and np.array_equal(
                            g.astype(bool), right) else diagnose(g, _padding_wrongs(lengths, S),
                                                                  PAD_DEFAULT, atol=1e-5))
        expect_shape(g, right.shape, case=case,
                     hint=diagnose(g, _padding_wrongs(lengths, S), PAD_TRANSPOSED, atol=1e-5))
        expect_close(g, right, case=case, atol=0,
                     hint=diagnose(g, _padding_wrongs(lengths, S), PAD_DEFAULT, atol=1e-5))


# ---------------------------------------------------------------- exercise: masked_attention

SCALE_NONE = ("the scores are too large: what keeps their variance at 1?",
              "divide the scores by sqrt(d_k) (you did not scale them)")
SCALE_MULTIPLIED = ("check the direction of the scale",
                    "divide the scores by sqrt(d_k); you multiplied by it")
SCALE_TWICE = ("check the size of the scale",
               "divide by sqrt(d_k) once; you divided by d_k (or twice by sqrt(d_k))")
SCALE_D_MODEL = ("which width is d_k?",
                 "d_k is the width of one query, the size of Q's last axis; you scaled by "
                 "another length (of queries or keys)")
WRONG_AXIS = ("over which axis does each query's distribution run?",
              "take the softmax over the keys, the last axis: each row of weights must sum to 1 "
              "over the S keys")
ADDED_MASK = ("a mask hides keys; it is not a score",
              "do not add the 0/1 mask to the scores (that only shifts them by 1); give the "
              "hidden keys a score of minus infinity before the softmax")
MASK_AFTER = ("when does the mask act: before or after the softmax?",
              "you zeroed the hidden keys' weights after the softmax, so each row's visible weights "
              "sum to less than 1 (here 1/3 + 1/3): hide the keys before the softmax (a score of "
              "-inf), so the visible keys share all of the weight")
D_V = ("which width is d_k?",
       "d_k is the width of a query and a key, Q's last axis; you scaled by the width of V (d_v)")
FLIPPED = ("what does True mean in the course's masks?",
           "mask polarity: True = may attend; you hid the keys marked True and kept the others")
DEFAULT_HIDES_ALL = ("with no mask, which keys may each query see?",
                     "mask=None means every key is visible; your default hides all of them "
                     "(a polarity mix-up: a default of all True, then inverted)")
EMPTY_ROW_NAN = ("what should a query with no visible key return?",
                 "a query whose keys are all masked must get weights 0 and output 0, not NaN: "
                 "after exp, divide only where the row's sum is positive")
EMPTY_ROW_UNIFORM = ("what should a query with no visible key return?",
                     "a query whose keys are all masked must get weights 0 and output 0; a large "
                     "negative fill makes it average every value uniformly instead")
NO_SHIFT = ("what does exp() do with scores near 900?",
            "exp(900) overflows to inf and inf/inf is NaN: subtract each row's maximum score "
            "before exp (lesson 01), taking care of rows whose keys are all hidden")
GLOBAL_MAX = ("each query's row is its own distribution: whose maximum do you subtract?",
              "one maximum for the whole score array makes a row of small scores exp(0 - 1000) = "
              "0 (weights 0, or 0/0 = NaN): subtract each row's own maximum, "
              "max(axis=-1, keepdims=True), as in lesson 01")
SWAPPED = ("check the order of what you return",
           "return (out, weights), in that order: out (..., L, d_v) first, then the weights "
           "(..., L, S)")
NOT_TRANSPOSED = ("Q K^T pairs every query with every key: which axes of K must swap?",
                  "transpose the last two axes of K, (..., S, d_k) -> (..., d_k, S), so that "
                  "the product is (..., L, S); a full transpose reverses every axis of a batch")
OUT_WRONG = ("out mixes the values with the weights",
             "out = weights @ V: each query's output is its weighted sum of the value rows")
GENERIC = ("weights = softmax(Q K^T / sqrt(d_k)) over the keys, hidden keys 0; out = weights V",)


# the hints given when no catalogued mistake is recognised (tests assert a mistake never gets them)
DEFAULTS = {"causal_mask": [MASK_DEFAULT], "padding_mask": [PAD_DEFAULT],
            "masked_attention": [GENERIC]}


def _softmax(s, axis=-1):
    with np.errstate(all="ignore"):
        e = np.exp(s - s.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)


def _global_max_softmax(s, guard):
    """The softmax shifted by one maximum for the whole array (the mistake GLOBAL_MAX names)."""
    with np.errstate(all="ignore"):
        e = np.exp(s - s.max())
        total = e.sum(axis=-1, keepdims=True)
        return np.divide(e, total, out=np.zeros_like(e), where=total > 0) if guard else e / total


def _pair(fn, Q, K, V, mask, case):
    result = call(fn, Q, K, V, mask, case=case, hint=NOT_TRANSPOSED)
    expect_true(isinstance(result, (tuple, list)) and len(result) == 2, case=case,
                message=f"expected a pair (out, weights), got {type(result).__name__}",
                hint=("return two arrays: out and the weights", "return out, weights"))
    return result


def _weights_mistakes(Q, K, V, mask):
    """What each catalogued mistake returns as weights on these inputs (for diagnose)."""
    d_k = Q.shape[-1]
    raw = Q @ np.swapaxes(K, -1, -2)
    m = None if mask is None else np.broadcast_to(mask, raw.shape)
    hide = (lambda s, keep: s if keep is None else np.where(keep, s, -np.inf))
    L, S = raw.shape[-2:]
    out = [(lambda: _softmax(hide(raw, m)), SCALE_NONE),
           (lambda: _softmax(hide(raw * np.sqrt(d_k), m)), SCALE_MULTIPLIED),
           (lambda: _softmax(hide(raw / d_k, m)), SCALE_TWICE),
           (lambda: _softmax(hide(raw / np.sqrt(L), m)), SCALE_D_MODEL),
           (lambda: _softmax(hide(raw / np.sqrt(S), m)), SCALE_D_MODEL),
           (lambda: _softmax(hide(raw / np.sqrt(d_k), m), axis=-2), WRONG_AXIS),
           (lambda: _softmax(hide(raw / np.sqrt(d_k), None if m is None else ~m)), FLIPPED)]
    if m is not None:
        out.append((lambda: _softmax(raw / np.sqrt(d_k) + m), ADDED_MASK))
        out.append((lambda: _softmax(raw / np.sqrt(d_k)) * m, MASK_AFTER))
    if V.shape[-1] != d_k:
        out.append((lambda: _softmax(hide(raw / np.sqrt(V.shape[-1]), m)), D_V))
    return out


ONE_KEY = ("how much weight does a query with one visible key give it?",
           "all of it: the softmax over one score is 1; only a row with no visible key at all "
           "gets weights 0 (test mask.any(axis=-1), not a count above 1)")


@exercise("masked_attention")
def masked_attention(attention):
    rng = np.random.default_rng(0)

    # 1. the scale and the return order: raw scores [4, 0] with d_k = 4 -> softmax([2, 0]);
    #    V is not the identity, so out and weights differ (a swapped pair shows)
    case = "scale, raw scores [4, 0], d_k = 4, L = 1, S = 2"
    Q = np.ones((1, 4))
    K = np.array([[1.0, 1, 1, 1], [0, 0, 0, 0]])
    V = np.array([[1.0, 2.0, 3.0], [-1.0, 0.0, 1.0]])
    out, w = _pair(attention, Q, K, V, None, case)
    ref_out, ref_w = attention_np(Q, K, V, return_weights=True)
    if as_array(out) is not None and as_array(out).shape == ref_w.shape and \
            np.allclose(as_array(out, np.float64), ref_w, atol=1e-6):
        expect_true(False, case=case, message="the first element you returned holds the weights",
                    hint=SWAPPED)
    ww = as_array(w, np.float64)
    if ww is not None and ww.shape == ref_w.shape and np.isnan(ww).all():
        expect_true(False, case=case, message="every weight is NaN with mask=None",
                    hint=DEFAULT_HIDES_ALL)
    expect_shape(w, (1, 2), case=case, hint=("weights have one row per query and one column "
                                             "per key: (..., L, S)",))
    expect_close(w, ref_w, case=case, atol=1e-6,
                 hint=diagnose(w, _weights_mistakes(Q, K, V, None), GENERIC, atol=1e-5))
    expect_close(out, ref_out, case=case, atol=1e-6, hint=OUT_WRONG)

    # 2. K square, so an untransposed K gives no shape error; scores around 900 (no max-shift
    #    gives NaN)
    case = "large scores around 900, d_k = S = 3"
    Q = np.array([[30.0, 30.0, 30.0], [30.0, 29.0, 31.0]]) * np.sqrt(3) / 3
    K = np.array([[30.0, 30.0, 30.0], [29.0, 31.0, 30.0], [31.0, 29.0, 30.5]])
    V = rng.normal(size=(3, 2))
    out, w = _pair(attention, Q, K, V, None, case)
    ref_out, ref_w = attention_np(Q, K, V, return_weights=True)
    mistakes = _weights_mistakes(Q, K, V, None) + [
        (lambda: _softmax(Q @ K / np.sqrt(3)), NOT_TRANSPOSED)]
    ww = as_array(w, np.float64)
    hint = NO_SHIFT if ww is not None and ww.shape == ref_w.shape and np.isnan(ww).any() else \
        diagnose(w, mistakes, GENERIC, atol=1e-5)
    expect_close(w, ref_w, case=case, atol=1e-6, hint=hint)
    expect_close(out, ref_out, case=case, atol=1e-6, hint=OUT_WRONG)

    # 2b. rows of very different scale: raw scores [[0, 0], [0, 1000]], d_k = 1; one maximum for
    #     the whole array underflows row 0 to weights 0 (or NaN) instead of [0.5, 0.5]
    case = "rows of very different scale: query 0's scores [0, 0], query 1's [0, 1000]"
    Qs, Ks, Vs = np.array([[0.0], [1000.0]]), np.array([[0.0], [1.0]]), np.eye(2)
    out, w = _pair(attention, Qs, Ks, Vs, None, case)
    ref_out, ref_w = attention_np(Qs, Ks, Vs, return_weights=True)
    hint = diagnose(w, [(lambda: _global_max_softmax(Qs @ Ks.T, guard=True), GLOBAL_MAX),
                        (lambda: _global_max_softmax(Qs @ Ks.T, guard=False), GLOBAL_MAX)],
                    GENERIC, atol=1e-5)
    expect_close(w, ref_w, case=case, atol=1e-6, hint=hint)
    expect_close(out, ref_out, case=case, atol=1e-6, hint=OUT_WRONG)

    # 3. the mask: equal scores, key 2 hidden -> [0.5, 0.5, 0]
    case = "mask, scores [0, 0, 0], key 2 masked"
    Qm, Km, Vm = np.zeros((1, 2)), np.ones((3, 2)), np.arange(6.0).reshape(3, 2)
    mask = np.array([[True, True, False]])
    _, w = _pair(attention, Qm, Km, Vm, mask, case)
    expect_close(w, [[0.5, 0.5, 0.0]], case=case, atol=1e-6,
                 hint=diagnose(w, _weights_mistakes(Qm, Km, Vm, mask),
                               ("hidden keys get weight exactly 0",), atol=1e-5))

    # 4. a query that may attend to nothing
    case = "fully masked row (query 1 sees no key)"
    Qe, Ke, Ve = rng.normal(size=(2, 4)), rng.normal(size=(3, 4)), rng.normal(size=(3, 5))
    mask_e = np.array([[True, False, True], [False, False, False]])
    out, w = _pair(attention, Qe, Ke, Ve, mask_e, case)
    o, wt = as_array(out, np.float64), as_array(w, np.float64)
    nan = (o is not None and np.isnan(o).any()) or (wt is not None and np.isnan(wt).any())
    ref_out, ref_w = attention_np(Qe, Ke, Ve, mask_e, return_weights=True)
    hint = EMPTY_ROW_NAN if nan else diagnose(
        w, _weights_mistakes(Qe, Ke, Ve, mask_e), EMPTY_ROW_UNIFORM, atol=1e-5)
    expect_close(w, ref_w, case=case, atol=1e-6, hint=hint)
    expect_close(out, ref_out, case=case, atol=1e-6, hint=hint)

    # 4b. a query that sees exactly one key: all its weight on that key, not an empty row
    case = "a query that sees exactly one key (query 0 sees key 2 only)"
    mask_1 = np.array([[False, False, True], [True, True, False]])
    out, w = _pair(attention, Qe, Ke, Ve, mask_1, case)
    ref_out, ref_w = attention_np(Qe, Ke, Ve, mask_1, return_weights=True)
    expect_close(w, ref_w, case=case, atol=1e-6,
                 hint=diagnose(w, _weights_mistakes(Qe, Ke, Ve, mask_1), ONE_KEY, atol=1e-5))
    expect_close(out, ref_out, case=case, atol=1e-6, hint=ONE_KEY)

    # 5. batched float32, L != S, a causal mask over the last L of S positions
    case = "float32 batch (2, 3), L = 4, S = 6, d_k = 8, d_v = 5, causal mask"
    Qb, Kb, Vb = (rng.normal(size=(2, 3, n, d)).astype(np.float32)
                  for n, d in ((4, 8), (6, 8), (6, 5)))
    mask_b = causal_mask_np(4, 6)
    out, w = _pair(attention, Qb, Kb, Vb, mask_b, case)
    ref_out, ref_w = attention_np(Qb.astype(np.float64), Kb.astype(np.float64),
                                  Vb.astype(np.float64), mask_b, return_weights=True)
    expect_shape(out, (2, 3, 4, 5), case=case,
                 hint=("out has one row per query and d_v columns: (..., L, d_v)",))
    expect_close(w, ref_w, case=case, rtol=1e-4, atol=1e-5,
                 hint=diagnose(w, _weights_mistakes(Qb.astype(np.float64), Kb.astype(np.float64),
                                                    Vb, mask_b), GENERIC, atol=1e-4))
    expect_close(out, ref_out, case=case, rtol=1e-4, atol=1e-5, hint=OUT_WRONG)
