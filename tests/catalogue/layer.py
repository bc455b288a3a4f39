"""Reference answers and catalogued wrong answers for lesson 07's checks (txlearn/checks/layer.py),
written the way a learner would write them."""

import numpy as np


def _ln(x, gamma, beta, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return gamma * (x - mu) / np.sqrt(var + eps) + beta


def _softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _attention(x, p, n_heads, scale=True, split=True):
    T, d_model = x.shape
    n_heads = n_heads if split else 1
    d_k = d_model // n_heads
    Q = (x @ p["W_Q"] + p["b_Q"]).reshape(T, n_heads, d_k).transpose(1, 0, 2)  # (h, T, d_k)
    K = (x @ p["W_K"] + p["b_K"]).reshape(T, n_heads, d_k).transpose(1, 0, 2)
    V = (x @ p["W_V"] + p["b_V"]).reshape(T, n_heads, d_k).transpose(1, 0, 2)
    scores = Q @ K.transpose(0, 2, 1)
    if scale:
        scores = scores / np.sqrt(d_k)
    heads = _softmax(scores) @ V  # (h, T, d_k)
    return heads.transpose(1, 0, 2).reshape(T, d_model) @ p["W_O"] + p["b_O"]


def _ffn(h, p):
    return np.maximum(h @ p["W_1"] + p["b_1"], 0) @ p["W_2"] + p["b_2"]


def _norms(p):
    return (lambda v: _ln(v, p["gamma1"], p["beta1"]), lambda v: _ln(v, p["gamma2"], p["beta2"]))


# ------------------------------------------------------------------ post_ln_layer

def post_ln_ref(x, p, n_heads):
    ln1, ln2 = _norms(p)
    h = ln1(x + _attention(x, p, n_heads))
    return ln2(h + _ffn(h, p))


def post_ln_pre_ln(x, p, n_heads):
    ln1, ln2 = _norms(p)
    h = x + _attention(ln1(x), p, n_heads)
    return h + _ffn(ln2(h), p)


def post_ln_norm_inside(x, p, n_heads):
    ln1, ln2 = _norms(p)
    h = x + ln1(_attention(x, p, n_heads))
    return h + ln2(_ffn(h, p))


def post_ln_no_attn_residual(x, p, n_heads):
    ln1, ln2 = _norms(p)
    h = ln1(_attention(x, p, n_heads))
    return ln2(h + _ffn(h, p))


def post_ln_no_ffn_residual(x, p, n_heads):
    ln1, ln2 = _norms(p)
    h = ln1(x + _attention(x, p, n_heads))
    return ln2(_ffn(h, p))


def post_ln_no_scale(x, p, n_heads):
    ln1, ln2 = _norms(p)
    h = ln1(x + _attention(x, p, n_heads, scale=False))
    return ln2(h + _ffn(h, p))


def post_ln_one_head(x, p, n_heads):
    ln1, ln2 = _norms(p)
    h = ln1(x + _attention(x, p, n_heads, split=False))
    return ln2(h + _ffn(h, p))


def post_ln_swapped_norms(x, p, n_heads):
    ln1, ln2 = _norms(p)
    h = ln2(x + _attention(x, p, n_heads))
    return ln1(h + _ffn(h, p))


def post_ln_unbiased_variance(x, p, n_heads):
    def ln(v, g, b):
        return g * (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, ddof=1, keepdims=True) + 1e-5) + b
    h = ln(x + _attention(x, p, n_heads), p["gamma1"], p["beta1"])
    return ln(h + _ffn(h, p), p["gamma2"], p["beta2"])


def post_ln_transposed(x, p, n_heads):
    return post_ln_ref(x, p, n_heads).T


# ------------------------------------------------------------------ layer_param_count

def count_ref(d_model, n_heads, d_ff):
    attention = 4 * d_model * d_model + 4 * d_model
    ffn = d_model * d_ff + d_ff + d_ff * d_model + d_model
    norms = 2 * (2 * d_model)
    return attention + ffn + norms


def count_weights_only(d_model, n_heads, d_ff):
    return 4 * d_model * d_model + 2 * d_model * d_ff


def count_no_norms(d_model, n_heads, d_ff):
    return count_ref(d_model, n_heads, d_ff) - 4 * d_model


def count_gamma_only(d_model, n_heads, d_ff):
    return count_ref(d_model, n_heads, d_ff) - 2 * d_model


def count_no_biases(d_model, n_heads, d_ff):
    return 4 * d_model * d_model + 2 * d_model * d_ff + 4 * d_model


def count_no_W_O(d_model, n_heads, d_ff):
    return 3 * d_model * d_model + 3 * d_model + 2 * d_model * d_ff + d_ff + d_model + 4 * d_model


def count_per_head(d_model, n_heads, d_ff):
    return n_heads * (4 * d_model * d_model + 4 * d_model) + 2 * d_model * d_ff + d_ff + 5 * d_model


def count_float(d_model, n_heads, d_ff):
    return float(count_ref(d_model, n_heads, d_ff))


REFERENCE = {
    "post_ln_layer": (post_ln_ref,),
    "layer_param_count": (count_ref,),
}

WRONG = {
    "post_ln_layer": [
        ("pre-LN order", (post_ln_pre_ln,), "post-LN order normalises after the residual"),
        ("norm before the residual add", (post_ln_norm_inside,), "must act on the sum"),
        ("no attention residual", (post_ln_no_attn_residual,), "attention sub-layer is missing its residual"),
        ("no FFN residual", (post_ln_no_ffn_residual,), "FFN sub-layer is missing its residual"),
        ("no 1/sqrt(d_k)", (post_ln_no_scale,), "sqrt(d_k)"),
        ("one head", (post_ln_one_head,), "split Q, K, V into n_heads heads"),
        ("swapped norms", (post_ln_swapped_norms,), "swapped"),
        ("unbiased variance", (post_ln_unbiased_variance,), "first difference"),
        ("transposed output", (post_ln_transposed,), "so that layers stack"),
    ],
    "layer_param_count": [
        ("weights only", (count_weights_only,), "left out the biases"),
        ("no norms", (count_no_norms,), "you left them out"),
        ("gamma only", (count_gamma_only,), "gamma AND beta"),
        ("no biases", (count_no_biases,), "count the biases"),
        ("no W_O", (count_no_W_O,), "W_O"),
        ("per head", (count_per_head,), "number of heads does not change"),
        ("float", (count_float,), "expected an int"),
    ],
}
