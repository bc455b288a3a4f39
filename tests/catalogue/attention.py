"""Reference answers and catalogued wrong answers for lesson 02's checks (txlearn/checks/attention.py)."""

import numpy as np
import torch


# ------------------------------------------------------------------ causal_mask

def causal_ref(L, S=None):
    S = L if S is None else S
    return np.tril(np.ones((L, S), dtype=bool), k=S - L)


def causal_torch_ref(L, S=None):  # a torch answer is fine too
    S = L if S is None else S
    return torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L)


def causal_no_diagonal(L, S=None):
    S = L if S is None else S
    return np.tril(np.ones((L, S), dtype=bool), k=S - L - 1)


def causal_transposed(L, S=None):
    S = L if S is None else S
    return np.triu(np.ones((L, S), dtype=bool), k=S - L)


def causal_flipped(L, S=None):
    return ~causal_ref(L, S)


def causal_top_left(L, S=None):
    S = L if S is None else S
    return np.tril(np.ones((L, S), dtype=bool))


def causal_top_left_no_diagonal(L, S=None):
    S = L if S is None else S
    return np.tril(np.ones((L, S), dtype=bool), k=-1)


def causal_float(L, S=None):
    return causal_ref(L, S).astype(np.float32)


# ------------------------------------------------------------------ padding_mask

def padding_ref(lengths, S):
    return np.arange(S)[None, :] < np.asarray(lengths)[:, None]


def padding_flipped(lengths, S):  # True on the padding
    return ~padding_ref(lengths, S)


def padding_inclusive(lengths, S):  # <= : one padding position too many
    return np.arange(S)[None, :] <= np.asarray(lengths)[:, None]


def padding_transposed(lengths, S):
    return padding_ref(lengths, S).T


def padding_left(lengths, S):  # padding first, as if the sequences were right-aligned
    return np.arange(S)[None, :] >= S - np.asarray(lengths)[:, None]


def padding_ints(lengths, S):
    return padding_ref(lengths, S).astype(np.int64)


def padding_loop_of_lists(lengths, S):  # a list of lists of 0/1, one row per sequence
    return [[1 if j <= n - 2 else 0 for j in range(S)] for n in lengths]


# ------------------------------------------------------------------ masked_attention

def _scores(Q, K):
    return Q @ np.swapaxes(K, -1, -2)


def _finish(weights, V):
    return weights @ V, weights


def attention_ref(Q, K, V, mask=None):
    s = _scores(Q, K) / np.sqrt(Q.shape[-1])
    if mask is None:
        mask = np.ones(s.shape, dtype=bool)
    s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    w = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return _finish(w, V)


def attention_one_key_empty(Q, K, V, mask=None):   # issue 23: a row with 1 visible key as empty
    out, w = attention_ref(Q, K, V, mask)
    if mask is None:
        return out, w
    few = np.broadcast_to(mask, w.shape).sum(axis=-1, keepdims=True) <= 1
    w = np.where(few, 0.0, w)
    return _finish(w, V)


def _masked_softmax(s, mask, fill=-np.inf, axis=-1):
    if mask is not None:
        s = np.where(mask, s, fill)
    e = np.exp(s - s.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def attention_no_scale(Q, K, V, mask=None):
    return _finish(_masked_softmax(_scores(Q, K), mask), V)


def attention_times_scale(Q, K, V, mask=None):
    return _finish(_masked_softmax(_scores(Q, K) * np.sqrt(Q.shape[-1]), mask), V)


def attention_scaled_twice(Q, K, V, mask=None):
    return _finish(_masked_softmax(_scores(Q, K) / Q.shape[-1], mask), V)


def attention_wrong_axis(Q, K, V, mask=None):
    return _finish(_masked_softmax(_scores(Q, K) / np.sqrt(Q.shape[-1]), mask, axis=-2), V)


def attention_added_mask(Q, K, V, mask=None):
    s = _scores(Q, K) / np.sqrt(Q.shape[-1])
    if mask is not None:
        s = s + mask  # the 0/1 keep-mask added to the scores
    return _finish(_masked_softmax(s, None), V)


def attention_flipped(Q, K, V, mask=None):
    return _finish(_masked_softmax(_scores(Q, K) / np.sqrt(Q.shape[-1]),
                                   None if mask is None else ~mask), V)


def attention_nan_rows(Q, K, V, mask=None):  # -inf fill, no guard for empty rows
    with np.errstate(invalid="ignore"):
        return _finish(_masked_softmax(_scores(Q, K) / np.sqrt(Q.shape[-1]), mask), V)


def attention_big_negative(Q, K, V, mask=None):  # -1e9 fill: empty rows average uniformly
    return _finish(_masked_softmax(_scores(Q, K) / np.sqrt(Q.shape[-1]), mask, fill=-1e9), V)


def attention_weights_only(Q, K, V, mask=None):
    return attention_ref(Q, K, V, mask)[1]


def attention_swapped(Q, K, V, mask=None):  # returns (weights, out)
    out, w = attention_ref(Q, K, V, mask)
    return w, out


def attention_no_max_shift(Q, K, V, mask=None):  # exp of the raw scores; empty rows guarded
    s = _scores(Q, K) / np.sqrt(Q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(s)
        total = e.sum(axis=-1, keepdims=True)
        w = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return _finish(w, V)


def attention_k_not_transposed(Q, K, V, mask=None):
    s = Q @ K / np.sqrt(Q.shape[-1])  # K is (S, d_k): fails unless S == d_k
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    return _finish(_masked_softmax(s, None), V)


def attention_full_transpose(Q, K, V, mask=None):  # K.T reverses every axis of a batch
    return attention_ref(Q, K.T.T if K.ndim == 2 else K.T, V, mask) if K.ndim == 2 else \
        _finish(_masked_softmax(Q @ K.T / np.sqrt(Q.shape[-1]), mask), V)


def attention_default_all_true_inverted(Q, K, V, mask=None):
    s = _scores(Q, K) / np.sqrt(Q.shape[-1])
    hidden = np.ones(s.shape, dtype=bool) if mask is None else mask   # "True = hidden"
    with np.errstate(invalid="ignore"):
        return _finish(_masked_softmax(s, ~hidden), V)


def attention_scaled_by_sqrt_S(Q, K, V, mask=None):  # the number of keys, not d_k
    return _finish(_masked_softmax(_scores(Q, K) / np.sqrt(K.shape[-2]), mask), V)


def attention_global_max(Q, K, V, mask=None):  # one max-shift for the whole score array
    s = _scores(Q, K) / np.sqrt(Q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    e = np.exp(s - s.max())
    total = e.sum(axis=-1, keepdims=True)
    w = np.divide(e, total, out=np.zeros_like(e), where=total > 0)  # empty rows guarded
    return _finish(w, V)


def attention_global_max_nan(Q, K, V, mask=None):  # one max-shift, no guard: 0/0 in row 0
    s = _scores(Q, K) / np.sqrt(Q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    e = np.exp(s - s.max())
    with np.errstate(invalid="ignore"):
        return _finish(e / e.sum(axis=-1, keepdims=True), V)


def attention_mask_after_softmax(Q, K, V, mask=None):  # weights zeroed, not renormalised
    w = _masked_softmax(_scores(Q, K) / np.sqrt(Q.shape[-1]), None)
    if mask is not None:
        w = np.where(mask, w, 0.0)
    return _finish(w, V)


def attention_d_k_from_V(Q, K, V, mask=None):  # scaled by sqrt(d_v)
    s = _scores(Q, K) / np.sqrt(V.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    return _finish(np.divide(e, total, out=np.zeros_like(e), where=total > 0), V)


REFERENCE = {
    "causal_mask": (causal_ref,),
    "padding_mask": (padding_ref,),
    "masked_attention": (attention_ref,),
}

WRONG = {
    "causal_mask": [
        ("diagonal hidden", (causal_no_diagonal,), "keep the diagonal"),
        ("transposed", (causal_transposed,), "transposed"),
        ("flipped polarity", (causal_flipped,), "True = may attend"),
        ("top-left aligned", (causal_top_left,), "bottom-right"),
        ("float 0/1 mask", (causal_float,), "masks are booleans"),
        ("strictly lower triangle and top-left", (causal_top_left_no_diagonal,), "may a token attend to itself"),
    ],
    "padding_mask": [
        ("True on the padding", (padding_flipped,), "yours is the opposite"),
        ("<= length", (padding_inclusive,), "compare strictly"),
        ("transposed (S, B)", (padding_transposed,), "yours is transposed"),
        ("padding first", (padding_left,), "puts the padding first"),
        ("0/1 integers", (padding_ints,), "masks are booleans"),
        ("lists, one short", (padding_loop_of_lists,), "compare strictly"),
    ],
    "masked_attention": [
        ("a row with one visible key treated as empty (issue 23)", (attention_one_key_empty,),
         "only a row with no visible key"),
        ("no scaling", (attention_no_scale,), "you did not scale"),
        ("multiplied by sqrt(d_k)", (attention_times_scale,), "you multiplied"),
        ("divided by d_k", (attention_scaled_twice,), "divide by sqrt(d_k) once"),
        ("softmax over queries", (attention_wrong_axis,), "softmax over the keys"),
        ("0/1 mask added to scores", (attention_added_mask,), "do not add the 0/1 mask"),
        ("flipped mask polarity", (attention_flipped,), "mask polarity"),
        ("fully masked row gives NaN", (attention_nan_rows,), "not NaN"),
        ("fully masked row averages uniformly", (attention_big_negative,), "uniformly"),
        ("weights not returned", (attention_weights_only,), "return out, weights"),
        ("(weights, out) instead of (out, weights)", (attention_swapped,), "return (out, weights)"),
        ("no max-shift, scores near 900", (attention_no_max_shift,), "subtract each row's maximum"),
        ("K not transposed", (attention_k_not_transposed,), "transpose the last two axes of K"),
        ("full transpose K.T of a batch", (attention_full_transpose,), "transpose the last two axes"),
        ("default all-True mask, then inverted", (attention_default_all_true_inverted,),
         "your default hides all of them"),
        ("scaled by sqrt(S)", (attention_scaled_by_sqrt_S,), "which width is d_k"),
        ("mask applied after the softmax, not renormalised", (attention_mask_after_softmax,),
         "after the softmax"),
        ("d_k taken from V", (attention_d_k_from_V,), "the width of v"),
        ("one max-shift for the whole score array, empty rows guarded", (attention_global_max,),
         "each row's own maximum"),
        ("one max-shift for the whole score array, no guard", (attention_global_max_nan,),
         "each row's own maximum"),
    ],
}
