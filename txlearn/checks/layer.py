"""Checks for lesson 07's exercises: the post-LN layer forward pass and a layer's parameter count.

Each check computes the right answer itself (float64 NumPy, from :mod:`txlearn.norms` and
:mod:`txlearn.attention`) and, when the learner's answer differs, compares it with the catalogued
mistakes (tests/catalogue/layer.py) to choose the hint. The most diagnostic case runs first.
"""

import numpy as np

from txlearn.attention import attention_np
from txlearn.checks import diagnose, call, expect_close, expect_shape, expect_true, exercise
from txlearn.norms import layer_norm_np


# ---------------------------------------------------------------- exercise: post_ln_layer

PRE_LN = ("you normalised before the sub-layers (pre-LN: x + Sublayer(LayerNorm(x))); the paper's "
          "post-LN order normalises after the residual add: LayerNorm(x + Sublayer(x))")
NORM_INSIDE = ("the LayerNorm must act on the sum x + Sublayer(x); you normalised only the "
               "sub-layer's output and added x afterwards (x + LayerNorm(Sublayer(x)))")
NO_ATTN_RESIDUAL = ("the attention sub-layer is missing its residual connection: use "
                    "LayerNorm(x + MultiHead(x)), not LayerNorm(MultiHead(x))")
NO_FFN_RESIDUAL = ("the FFN sub-layer is missing its residual connection: use "
                   "LayerNorm(h + FFN(h)), not LayerNorm(FFN(h))")
NO_SCALE = "divide the attention scores Q K^T by sqrt(d_k) before the softmax"
NO_HEADS = ("split Q, K, V into n_heads heads of width d_k = d_model / n_heads, attend in each head, "
            "then merge them before W_O; you attended with one head of width d_model")
SWAPPED_NORMS = ("use gamma1/beta1 after attention and gamma2/beta2 after the FFN; yours are "
                 "swapped")


def _params(d_model, d_ff, seed):
    rng = np.random.default_rng(seed)
    p = {name: rng.normal(0, 0.6, shape) for name, shape in [
        ("W_Q", (d_model, d_model)), ("W_K", (d_model, d_model)), ("W_V", (d_model, d_model)),
        ("W_O", (d_model, d_model)), ("W_1", (d_model, d_ff)), ("W_2", (d_ff, d_model)),
        ("b_Q", d_model), ("b_K", d_model), ("b_V", d_model), ("b_O", d_model),
        ("b_1", d_ff), ("b_2", d_model)]}
    for i in (1, 2):
        p[f"gamma{i}"] = rng.uniform(0.5, 2.0, d_model)
        p[f"beta{i}"] = rng.uniform(-1.0, 1.0, d_model)
    return p


def _mha(x, p, n_heads, scale=True):
    T, d_model = x.shape
    d_k = d_model // n_heads

    def heads(W, b):
        return (x @ W + b).reshape(T, n_heads, d_k).transpose(1, 0, 2)  # (n_heads, T, d_k)

    Q, K, V = heads(p["W_Q"], p["b_Q"]), heads(p["W_K"], p["b_K"]), heads(p["W_V"], p["b_V"])
    if not scale:
        Q = Q * np.sqrt(d_k)  # cancels the 1/sqrt(d_k) inside attention_np
    out = attention_np(Q, K, V).transpose(1, 0, 2).reshape(T, d_model)  # (T, d_model)
    return out @ p["W_O"] + p["b_O"]


def _ffn(h, p):
    return np.maximum(h @ p["W_1"] + p["b_1"], 0.0) @ p["W_2"] + p["b_2"]


def _layer(x, p, n_heads, variant="right"):
    """The post-LN layer, or one of the catalogued mistakes."""
    ln1 = lambda v: layer_norm_np(v, p["gamma1"], p["beta1"])  # noqa: E731
    ln2 = lambda v: layer_norm_np(v, p["gamma2"], p["beta2"])  # noqa: E731
    attn = lambda v: _mha(v, p, n_heads, scale=variant != "no scale")  # noqa: E731
    if variant == "no heads":
        attn = lambda v: _mha(v, p, 1)  # noqa: E731
    if variant == "swapped norms":
        ln1, ln2 = ln2, ln1
    if variant == "pre-LN":
        h = x + attn(ln1(x))
        return h + _ffn(ln2(h), p)
    if variant == "norm inside":
        h = x + ln1(attn(x))
        return h + ln2(_ffn(h, p))
    h = ln1(attn(x)) if variant == "no attention residual" else ln1(x + attn(x))
    return ln2(_ffn(h, p)) if variant == "no FFN residual" else ln2(h + _ffn(h, p))


_VARIANTS = [("pre-LN", PRE_LN), ("norm inside", NORM_INSIDE),
             ("no attention residual", NO_ATTN_RESIDUAL), ("no FFN residual", NO_FFN_RESIDUAL),
             ("no scale", NO_SCALE), ("no heads", NO_HEADS), ("swapped norms", SWAPPED_NORMS)]


@exercise("post_ln_layer")
def post_ln_layer(fn):
    for T, d_model, n_heads, d_ff, seed in ((3, 4, 1, 8, 0), (5, 8, 2, 16, 1), (4, 12, 3, 24, 2)):
        case = f"T={T}, d_model={d_model}, n_heads={n_heads}, d_ff={d_ff}"
        p = _params(d_model, d_ff, seed)
        x = np.random.default_rng(seed + 10).normal(0, 1.0, (T, d_model))
        got = call(fn, x.copy(), {k: v.copy() for k, v in p.items()}, n_heads, case=case)
        expect_shape(got, (T, d_model), case=case,
                     hint="the layer maps (T, d_model) to (T, d_model), so that layers stack")
        wrongs = [(_layer(x, p, n_heads, v), hint) for v, hint in _VARIANTS]
        expect_close(got, _layer(x, p, n_heads), case=case, rtol=1e-6, atol=1e-8,
                     hint=diagnose(got, wrongs, "follow h = LayerNorm_1(x + MultiHead(x)), "
                                    "out = LayerNorm_2(h + FFN(h)), FFN = ReLU(h W_1 + b_1) W_2 + b_2", rtol=1e-6, atol=1e-8))


# ---------------------------------------------------------------- exercise: layer_param_count

def _right_count(d, d_ff):
    return (4 * d * d + 4 * d) + (2 * d * d_ff + d_ff + d) + 4 * d


_COUNT_WRONGS = [
    (lambda d, f, h: 4 * d * d + 2 * d * f, "you left out the biases (4 d_model for attention, "
     "d_ff + d_model for the FFN) and the norms' gamma and beta (2 d_model each)"),
    (lambda d, f, h: _right_count(d, f) - 4 * d, "each of the two LayerNorms has gamma and beta "
     "(2 d_model parameters each, 4 d_model for the layer); you left them out"),
    (lambda d, f, h: _right_count(d, f) - 2 * d, "each LayerNorm has two vectors, gamma AND beta: "
     "4 d_model for the two norms"),
    (lambda d, f, h: _right_count(d, f) - (4 * d + f + d), "count the biases of the linear maps: "
     "b_Q, b_K, b_V, b_O (d_model each), b_1 (d_ff) and b_2 (d_model)"),
    (lambda d, f, h: _right_count(d, f) - d * d - d, "attention has four matrices: W_Q, W_K, W_V "
     "and the output projection W_O (with its bias b_O)"),
    (lambda d, f, h: _right_count(d, f) - d * f, "the FFN has two matrices: W_1 (d_model, d_ff) "
     "and W_2 (d_ff, d_model)"),
    (lambda d, f, h: _right_count(d, f) + (h - 1) * (4 * d * d + 4 * d), "the number of heads "
     "does not change the count: n_heads heads of width d_k = d_model / n_heads share the same "
     "(d_model, d_model) matrices"),
]


@exercise("layer_param_count")
def layer_param_count(fn):
    for d_model, n_heads, d_ff in ((8, 2, 20), (512, 8, 2048), (48, 6, 100)):
        case = f"d_model={d_model}, n_heads={n_heads}, d_ff={d_ff}"
        got = call(fn, d_model, n_heads, d_ff, case=case)
        expect_true(isinstance(got, (int, np.integer)) and not isinstance(got, bool), case=case,
                    message=f"expected an int, got {type(got).__name__}",
                    hint="a count of parameters is a whole number: use integer arithmetic")
        expected = _right_count(d_model, d_ff)
        hint = "attention 4 d^2 + 4 d, FFN 2 d d_ff + d_ff + d, two LayerNorms 4 d"
        for wrong, wrong_hint in _COUNT_WRONGS:
            if got == wrong(d_model, d_ff, n_heads):
                hint = wrong_hint
                break
        expect_true(got == expected, case=case, message=f"got {got}, expected {expected}",
                    hint=hint)
