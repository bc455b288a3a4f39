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


def causal_float(L, S=None):
    return causal_ref(L, S).astype(np.float32)


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


REFERENCE = {
    "causal_mask": (causal_ref,),
    "masked_attention": (attention_ref,),
}

WRONG = {
    "causal_mask": [
        ("diagonal hidden", (causal_no_diagonal,), "keep the diagonal"),
        ("transposed", (causal_transposed,), "transposed"),
        ("flipped polarity", (causal_flipped,), "True = may attend"),
        ("top-left aligned", (causal_top_left,), "bottom-right"),
        ("float 0/1 mask", (causal_float,), "return booleans"),
    ],
    "masked_attention": [
        ("no scaling", (attention_no_scale,), "you did not scale"),
        ("multiplied by sqrt(d_k)", (attention_times_scale,), "you multiplied"),
        ("divided by d_k", (attention_scaled_twice,), "divide by sqrt(d_k) once"),
        ("softmax over queries", (attention_wrong_axis,), "softmax over the keys"),
        ("0/1 mask added to scores", (attention_added_mask,), "do not add the 0/1 mask"),
        ("flipped mask polarity", (attention_flipped,), "mask polarity"),
        ("fully masked row gives NaN", (attention_nan_rows,), "not NaN"),
        ("fully masked row averages uniformly", (attention_big_negative,), "uniformly"),
        ("weights not returned", (attention_weights_only,), "return out, weights"),
    ],
}
