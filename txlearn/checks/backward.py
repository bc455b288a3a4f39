"""Checks of set 11, backpropagation by hand: softmax_vjp, attention_backward, layer_norm_backward,
layer_backward (a post-LN layer from the learner's own pieces), flash_forward and flash_backward.

Answers are NumPy float64; the right values come from autograd in float64 or from the package's
references (tested against autograd). When an answer is wrong, the outputs of the catalogued
mistakes (``tests/catalogue/backward.py``) on the same inputs choose the hint; the inputs make each
mistake show (uneven rows, L != S after a square case, an empty row, gamma away from 1, few
features, ReLUs off). Source: ``exercises/source/11_backward.py``; lessons 01, 02, 06, 07, 08.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from txlearn.attention import (attention_backward_np, attention_np, masked_softmax_np,
                               scaled_dot_product_attention)
from txlearn.checks import as_array, call, diagnose, exercise, expect_close, expect_shape, expect_true
from txlearn.checks.flash_references import fb_variant, ff_variant, flash_cases, masked_lse
from txlearn.flash_attention import flash_attention_forward_np
from txlearn.layer import TransformerLayer
from txlearn.norms import layer_norm_backward_np, layer_norm_np
from txlearn.softmax import softmax_vjp_np

TOL = dict(rtol=1e-7, atol=1e-9)
_rng = np.random.default_rng


def _grad(fn, arrays, grad_out):
    """Autograd's gradients of fn(*tensors) against `grad_out`, float64 NumPy."""
    tensors = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    out = fn(*tensors)
    grads = torch.autograd.grad(out, tensors, torch.tensor(grad_out), allow_unused=True)
    return [g.numpy() for g in grads]


def _variants(fn, variants, *args):
    """(output of fn(*args, **kw) as a function of no arguments, hint) per (kw, hint): the
    catalogued mistakes' outputs, computed only when diagnose asks."""
    return [(lambda kw=kw: fn(*args, **kw), hint) for kw, hint in variants]


def _expect_tuple(got, n, *, case, names):
    expect_true(isinstance(got, (tuple, list)) and len(got) == n, case=case,
                message=f"expected a tuple ({', '.join(names)}), got {type(got).__name__}",
                hint=(f"return {n} arrays, in this order: {', '.join(names)}",))


# ----------------------------------------------------------------------------- softmax_vjp

VJP_NO_INNER = ("what does raising one logit do to the other weights?",
                "you returned s * g: the softmax's weights sum to 1, so every logit moves every "
                "weight; subtract <s, g>: dx = s * (g - <s, g>)")
VJP_SIGN = ("check the sign", "dx = s * (g - <s, g>); you computed s * (<s, g> - g)")
VJP_SUM_G = ("which inner product?", "<s, g> = sum_i s_i g_i; you summed g alone")
VJP_NO_S = ("every entry of dx carries its own weight s_j",
            "dx_j = s_j (g_j - <s, g>): multiply by s after subtracting")
VJP_DIAG = ("the Jacobian has off-diagonal entries",
            "s * (1 - s) * g uses only J's diagonal; the off-diagonal -s_i s_j give the <s, g> term")
VJP_KEEPDIMS = ("check how the per-row sums broadcast back",
                "sum along `axis` with keepdims=True: without it the sum of row i is subtracted "
                "from column i")
VJP_AXIS = ("along which axis did the softmax normalise?",
            "take the inner product <s, g> along `axis`, the axis the softmax summed over")
VJP_GLOBAL_INNER = ("one inner product per what?",
                    "<s, g> is one number per slice along `axis` (sum with keepdims): you summed "
                    "s * g over the whole array, mixing every row's distribution")
VJP_DEFAULT = ("dx = s * (g - <s, g>), the inner product along `axis`",)


def _vjp_wrongs(s, g, axis):
    inner = (s * g).sum(axis=axis, keepdims=True)
    other = 0 if axis % s.ndim != 0 else 1
    return [(lambda: s * g, VJP_NO_INNER), (lambda: s * (inner - g), VJP_SIGN),
            (lambda: s * (g - g.sum(axis=axis, keepdims=True)), VJP_SUM_G),
            (lambda: g - inner, VJP_NO_S), (lambda: s * (1 - s) * g, VJP_DIAG),
            (lambda: s * (g - (s * g).sum(axis=axis)), VJP_KEEPDIMS),
            (lambda: s * (g - (s * g).sum(axis=other, keepdims=True)), VJP_AXIS),
            (lambda: s * (g - (s * g).sum()), VJP_GLOBAL_INNER)]


@exercise("softmax_vjp")
def softmax_vjp(softmax_vjp):
    """Check `softmax_vjp(s, g, axis=-1)` against autograd through torch.softmax."""
    rng = _rng(11)
    cases = [("one row: s = [1/2, 1/4, 1/4], g = [1, 0, 0]", np.log([2.0, 1.0, 1.0]),
              np.array([1.0, 0.0, 0.0]), -1),
             ("3 rows of 3, axis=-1", rng.normal(size=(3, 3)) * 2, rng.normal(size=(3, 3)), -1),
             ("shape (2, 3, 4), axis=1", rng.normal(size=(2, 3, 4)) * 2, rng.normal(size=(2, 3, 4)), 1)]
    for case, x, g, axis in cases:
        s = torch.softmax(torch.tensor(x), axis).numpy()
        (right,) = _grad(lambda t: torch.softmax(t, axis), [x], g)
        got = call(softmax_vjp, s.copy(), g.copy(), axis=axis, case=case,
                   hint="s and g are NumPy arrays of one shape; return dL/dx, of that shape")
        expect_shape(got, s.shape, case=case, hint=VJP_KEEPDIMS)
        hint = diagnose(got, _vjp_wrongs(s, g, axis), VJP_DEFAULT, rtol=1e-6, atol=1e-9)
        expect_close(got, right, case=case, hint=hint, **TOL)
    case = "a fully masked row: s = [0, 0, 0]"
    got = call(softmax_vjp, np.zeros((1, 3)), np.ones((1, 3)), case=case)
    expect_close(got, np.zeros((1, 3)), case=case, hint=("a row of zero weights passes nothing back",
                                                          "nothing may divide by the row's sum"))


# ----------------------------------------------------------------------------- attention_backward

ATT_NO_SCALE = ("the scores are Q K^T / sqrt(d_k): what does that do to dQ and dK?",
                "dQ = dZ K / sqrt(d_k) and dK = dZ^T Q / sqrt(d_k): you left out the 1/sqrt(d_k)")
ATT_DOUBLE_SCALE = ("how many times does 1/sqrt(d_k) appear?",
                    "you divided by sqrt(d_k) twice (by d_k): once in the scores of the forward, "
                    "once in dQ and dK")
ATT_P_NOT_T = ("which way round is dV?",
               "O = P V, so dV_s = sum_l P_ls dO_l: dV = P^T dO, not P dO")
ATT_NO_INNER = ("the softmax's backward pass has two terms",
                "dZ = P * (dP - rowsum(dP * P)): you dropped the rowsum term (lesson 01's <s, g>)")
ATT_DK_NOT_T = ("dK has one row per key",
                "dK = dZ^T Q / sqrt(d_k): transpose dZ (you used dZ Q)")
ATT_MASK_IGNORED = ("may a hidden key receive a gradient?",
                    "recompute P with the mask, as the forward did: hidden keys get weight 0, so "
                    "no gradient flows into them")
ATT_MINUS_1E9 = ("what does adding -1e9 do to a row with no visible key?",
                 "adding -1e9 gives a row that sees nothing a uniform distribution over the keys "
                 "it must not see, and sends them gradient; hide keys (weight exactly 0) and give "
                 "an empty row P = 0")
ATT_NAN = ("what should a query that sees no key get?",
           "a row whose keys are all hidden has no distribution: its P is 0 and its gradients 0; "
           "never divide by its empty sum (NaN)")
ATT_FULL_T = ("which axes does each transpose swap?",
              "these arrays are batched, (B, L, d_k): a full transpose K.T reverses every axis, "
              "(2, 4, 3) -> (3, 4, 2), and the product fails; swap only the last two axes, in the "
              "scores as in every product of the backward pass (as in set 01's scaled_scores)",
              "with L != S, check which side of each product is transposed")
ATT_ONE_KEY = ("how much weight does a query with one visible key give it?",
               "all of it: the softmax over one score is 1, so that key receives the query's whole "
               "dO in dV; only a row with no visible key at all gets P = 0 (test "
               "mask.any(axis=-1), not a count above 1)")
ATT_D_V = ("which width is d_k?",
           "d_k is the width of a query and a key (Q's last axis): you scaled the scores, dQ and "
           "dK by the square root of V's width d_v")
ATT_DQ_T = ("dQ has one row per query",
            "dQ = dZ K / sqrt(d_k): dZ (L, S) times K (S, d_k); you transposed dZ (dZ^T K), "
            "which only has the right shape when L = S")
ATT_DEFAULT = ("dV = P^T dO, dP = dO V^T, dZ = P * (dP - rowsum(dP * P)), dQ = dZ K / sqrt(d_k), "
               "dK = dZ^T Q / sqrt(d_k)",)


def _att_variant(Q, K, V, dO, mask, *, scale=1.0, p_t=True, inner=True, dk_t=True, use_mask=True,
                 additive=False, one_key_empty=False, d_from_V=False, dq_t=False):
    """What attention's backward computes with one catalogued mistake (NumPy float64)."""
    d_k = V.shape[-1] if d_from_V else Q.shape[-1]
    scores = Q @ np.swapaxes(K, -1, -2) / math.sqrt(d_k)
    if additive and mask is not None:
        P = masked_softmax_np(scores + np.where(mask, 0.0, -1e9))
    else:
        P = masked_softmax_np(scores, mask if use_mask else None)
    if one_key_empty and mask is not None:   # a row with one visible key treated as empty
        P = np.where(np.broadcast_to(mask, P.shape).sum(axis=-1, keepdims=True) <= 1, 0.0, P)
    dV = (np.swapaxes(P, -1, -2) if p_t else P) @ dO
    dP = dO @ np.swapaxes(V, -1, -2)
    dZ = softmax_vjp_np(P, dP) if inner else P * dP
    c = scale / math.sqrt(d_k)
    dK = (np.swapaxes(dZ, -1, -2) @ Q if dk_t else dZ @ Q) * c
    dQ = (np.swapaxes(dZ, -1, -2) if dq_t else dZ) @ K * c
    return dQ, dK, dV


def _att_wrongs(Q, K, V, dO, mask):
    d_k = Q.shape[-1]
    variants = [(dict(scale=math.sqrt(d_k)), ATT_NO_SCALE),
                (dict(scale=1 / math.sqrt(d_k)), ATT_DOUBLE_SCALE), (dict(p_t=False), ATT_P_NOT_T),
                (dict(inner=False), ATT_NO_INNER), (dict(dk_t=False), ATT_DK_NOT_T),
                (dict(use_mask=False), ATT_MASK_IGNORED), (dict(additive=True), ATT_MINUS_1E9),
                (dict(one_key_empty=True), ATT_ONE_KEY), (dict(d_from_V=True), ATT_D_V),
                (dict(dq_t=True), ATT_DQ_T)]
    return _variants(lambda *a, **kw: np.concatenate([g.ravel() for g in _att_variant(*a, **kw)]),
                     variants, Q, K, V, dO, mask)


def _att_cases():
    rng = _rng(12)
    blind = np.tril(np.ones((4, 6), bool), 2)  # bottom-right causal for L = 4, S = 6
    blind[1] = False                           # query 1 sees no key
    blind[:, 5] = False                        # key 5 is padding: hidden from every query
    yield ("L = S = 4, no mask", rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 4, 3)),
           rng.normal(size=(2, 4, 5)), None)
    yield ("L = S = 4, causal mask", rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 4, 3)),
           rng.normal(size=(2, 4, 5)), np.tril(np.ones((4, 4), bool)))
    yield ("L = 4 queries, S = 6 keys, key 5 hidden from all, query 1 sees no key",
           rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 6, 3)), rng.normal(size=(2, 6, 5)), blind)


@exercise("attention_backward", needs=("softmax_vjp",))
def attention_backward(attention_backward):
    """Check `attention_backward(Q, K, V, dO, mask=None)` -> (dQ, dK, dV) against autograd."""
    names = ("dQ", "dK", "dV")
    for case, Q, K, V, mask in _att_cases():
        dO = _rng(len(case)).normal(size=Q.shape[:-1] + V.shape[-1:])
        m = None if mask is None else torch.tensor(mask)
        right = _grad(lambda q, k, v: scaled_dot_product_attention(q, k, v, m), [Q, K, V], dO)
        got = call(attention_backward, Q.copy(), K.copy(), V.copy(), dO.copy(),
                   None if mask is None else mask.copy(), case=case, hint=ATT_FULL_T)
        _expect_tuple(got, 3, case=case, names=names)
        hint = ATT_DEFAULT
        if all(as_array(g) is not None and as_array(g).shape == r.shape for g, r in zip(got, right)):
            flat = np.concatenate([as_array(g, np.float64).ravel() for g in got])
            hint = ATT_NAN if np.isnan(flat).any() else diagnose(flat, _att_wrongs(Q, K, V, dO, mask),
                                                                 ATT_DEFAULT, rtol=1e-6, atol=1e-9)
        for name, g, r in zip(names, got, right):
            expect_shape(g, r.shape, case=f"{case}, {name}", hint=hint if hint is not ATT_DEFAULT
                         else (f"{name} has the shape of {name[1]}",))
            expect_close(g, r, case=f"{case}, {name}", hint=hint, **TOL)


# ----------------------------------------------------------------------------- layer_norm_backward

LN_NO_MEAN = ("the mean mu depends on every x_j",
              "dx = r (dxhat - mean(dxhat) - xhat mean(dxhat xhat)): you left out mean(dxhat), "
              "the path through mu")
LN_NO_XHAT = ("the variance depends on every x_j",
              "dx = r (dxhat - mean(dxhat) - xhat mean(dxhat xhat)): you left out the xhat term, "
              "the path through sigma^2")
LN_CONSTANTS = ("mu and sigma are functions of x too",
                "you treated mu and sigma as constants (dx = r dxhat): add the paths through "
                "them, -mean(dxhat) and -xhat mean(dxhat xhat)")
LN_UNBIASED = ("which variance does LayerNorm use?",
               "the biased one, dividing by d (np.var's default, ddof=0); you divided by d - 1")
LN_NO_GAMMA = ("y = gamma * xhat + beta: what reaches xhat?", "dxhat = gamma * dy, not dy")
LN_EPS_OUTSIDE = ("where does eps sit?", "r = 1 / sqrt(var + eps): eps inside the square root")
LN_PARAM_SUM = ("gamma is shared by every token",
                "dgamma and dbeta sum over every axis but the last: shape (d_model,)")
LN_DGAMMA_NO_XHAT = ("y = gamma * xhat + beta: what multiplies gamma?",
                     "dgamma = sum over tokens of dy * xhat; you summed dy alone (that is dbeta)")
LN_DGAMMA_X = ("y = gamma * xhat + beta: what multiplies gamma?",
               "dgamma = sum over tokens of dy * xhat, the normalised x; you used x itself")
LN_DGAMMA = ("dgamma = sum over tokens of dy * xhat (xhat before gamma)",)
LN_DEFAULT = ("dx = r (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = gamma dy, "
              "r = 1/sqrt(var + eps); dgamma = sum dy xhat, dbeta = sum dy",)


def _ln_variant(x, gamma, dy, eps, *, mean=True, xhat_term=True, ddof=0, use_gamma=True,
                eps_inside=True):
    d = x.shape[-1]
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).sum(axis=-1, keepdims=True) / (d - ddof)
    r = 1 / np.sqrt(var + eps) if eps_inside else 1 / (np.sqrt(var) + eps)
    xhat = (x - mu) * r
    dxhat = dy * gamma if use_gamma else dy
    dx = dxhat - (dxhat.mean(axis=-1, keepdims=True) if mean else 0.0)
    if xhat_term:
        dx = dx - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)
    return r * dx


def _ln_wrongs(x, gamma, dy, eps):
    variants = [(dict(mean=False), LN_NO_MEAN), (dict(xhat_term=False), LN_NO_XHAT),
                (dict(mean=False, xhat_term=False), LN_CONSTANTS), (dict(ddof=1), LN_UNBIASED),
                (dict(use_gamma=False), LN_NO_GAMMA), (dict(eps_inside=False), LN_EPS_OUTSIDE)]
    return _variants(_ln_variant, variants, x, gamma, dy, eps)


@exercise("layer_norm_backward")
def layer_norm_backward(layer_norm_backward):
    """Check `layer_norm_backward(x, gamma, dy, eps=1e-5)` -> (dx, dgamma, dbeta) against autograd
    through F.layer_norm."""
    rng = _rng(13)
    cases = [("4 tokens of d_model = 4, small variance (eps matters)",
              rng.normal(size=(4, 4)) * 0.01 + 1.0, 1e-4),
             ("batch (2, 3, 5), un-centred tokens", rng.normal(size=(2, 3, 5)) * 2 + 3, 1e-5)]
    for case, x, eps in cases:
        d = x.shape[-1]
        gamma, beta, dy = rng.normal(size=d) + 1.5, rng.normal(size=d), rng.normal(size=x.shape)
        right = _grad(lambda x_, g_, b_: torch.nn.functional.layer_norm(x_, (d,), g_, b_, eps),
                      [x, gamma, beta], dy)
        got = call(layer_norm_backward, x.copy(), gamma.copy(), dy.copy(), eps=eps, case=case)
        _expect_tuple(got, 3, case=case, names=("dx", "dgamma", "dbeta"))
        expect_shape(got[0], x.shape, case=f"{case}, dx", hint=("dx has the shape of x",))
        hint = diagnose(got[0], _ln_wrongs(x, gamma, dy, eps), LN_DEFAULT, rtol=1e-6, atol=1e-10)
        expect_close(got[0], right[0], case=f"{case}, dx", hint=hint, **TOL)
        tokens = tuple(range(x.ndim - 1))
        dgamma_wrongs = [(lambda: dy.sum(axis=tokens), LN_DGAMMA_NO_XHAT),
                         (lambda: (dy * x).sum(axis=tokens), LN_DGAMMA_X)]
        for name, g, r in zip(("dgamma", "dbeta"), got[1:], right[1:]):
            expect_shape(g, (d,), case=f"{case}, {name}", hint=LN_PARAM_SUM)
            expect_close(g, r, case=f"{case}, {name}", hint=LN_DEFAULT if name == "dbeta" else
                         diagnose(g, dgamma_wrongs, LN_DGAMMA, rtol=1e-6, atol=1e-10), **TOL)


# ----------------------------------------------------------------------------- layer_backward

GRAD_KEYS = ("W_2", "b_2", "gamma2", "beta2", "W_1", "b_1", "gamma1", "beta1", "W_O", "b_O",
             "W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V", "x")
LAYER_NO_X_RESIDUAL = ("x reaches the output by two routes",
                       "add the residual route: dx = (gradient at the first residual sum) + dQ W_Q^T "
                       "+ dK W_K^T + dV W_V^T")
LAYER_NO_H_RESIDUAL = ("h reaches the output by two routes",
                       "dh = do + du W_1^T: the residual o = h + FFN(h) passes do straight to h")
LAYER_NO_GATE = ("what does the ReLU pass back?",
                 "du = (df W_2^T) * (u > 0): the gradient passes only where the unit was on")
LAYER_LN_OUTPUT = ("LayerNorm's backward needs LayerNorm's input",
                   "call layer_norm_backward with the input of each norm (cache['o'] and "
                   "cache['a_in']), not with its output")
LAYER_BIAS_SUM = ("a bias is shared by every token of every sequence",
                  "sum a bias's gradient over the batch and the positions: shape (d_out,)")
LAYER_TRANSPOSED = ("which way round is a weight's gradient?",
                    "for y = x W with W of shape (d_in, d_out), dW = x^T dy has W's shape "
                    "(d_in, d_out)")
LAYER_NO_SPLIT = ("attention's backward works per head",
                  "split the gradient of the merged heads into (B, n_heads, T, d_k) before "
                  "attention_backward, and merge dQ, dK, dV back")
LAYER_DEFAULT = ("run the forward lines backwards: LN2, the FFN and its residual, LN1, W_O, "
                 "attention, the projections and the residual into x",)
LAYER_KEYS = ("return a dict with the gradient of x and of every parameter",
              "keys: 'x' and each key of params (W_Q, b_Q, ..., gamma2, beta2)")


def _layer_params(d_model, n_heads, d_ff, seed):
    """Random float64 parameters of TransformerLayer (post-LN, ReLU) as {short name: array}, and
    the layer holding them."""
    torch.manual_seed(seed)
    layer = TransformerLayer(d_model, n_heads, d_ff).double()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.copy_(torch.randn(p.shape, dtype=torch.float64) * (0.3 if "norm" in name else 0.5)
                    + (1.0 if name.endswith("gamma") else 0.0))
    params = {_short(name): p.detach().numpy().copy() for name, p in layer.named_parameters()}
    return params, layer


def _short(name):
    """'attn.W_Q' -> 'W_Q', 'norm1.gamma' -> 'gamma1', 'ffn.b_2' -> 'b_2'."""
    module, leaf = name.split(".")
    return leaf + module[4:] if module.startswith("norm") else leaf


def layer_forward_np(x, params, n_heads, mask=None):
    """The post-LN ReLU layer forward in float64 NumPy: (out, cache), the cache as the set's own
    ``layer_forward`` keeps it (the check's diagnosis runs the catalogued mistakes on it)."""
    B, T, d_model = x.shape
    d_k = d_model // n_heads
    Q, K, V = (x @ params[f"W_{n}"] + params[f"b_{n}"] for n in "QKV")
    Q, K, V = (M.reshape(B, T, n_heads, d_k).transpose(0, 2, 1, 3) for M in (Q, K, V))
    P = masked_softmax_np(Q @ np.swapaxes(K, -1, -2) / math.sqrt(d_k), mask)
    merged = (P @ V).transpose(0, 2, 1, 3).reshape(B, T, d_model)
    a_in = x + merged @ params["W_O"] + params["b_O"]
    h = layer_norm_np(a_in, params["gamma1"], params["beta1"])
    u = h @ params["W_1"] + params["b_1"]
    r = np.maximum(u, 0.0)
    o = h + r @ params["W_2"] + params["b_2"]
    out = layer_norm_np(o, params["gamma2"], params["beta2"])
    return out, dict(Q=Q, K=K, V=V, merged=merged, a_in=a_in, h=h, u=u, r=r, o=o)


def _layer_variant(x, params, dout, n_heads, mask, *, x_res=True, h_res=True, gate=True,
                   ln_input=True):
    """The layer's backward pass with one catalogued mistake, from the package's pieces."""
    out, c = layer_forward_np(x, params, n_heads, mask)
    B, T, d_model = x.shape

    def W(inp, d):
        return np.einsum("bti,btj->ij", inp, d)

    g = {}
    do, g["gamma2"], g["beta2"] = layer_norm_backward_np(c["o"] if ln_input else out,
                                                         params["gamma2"], dout)
    g["W_2"], g["b_2"] = W(c["r"], do), do.sum((0, 1))
    du = (do @ params["W_2"].T) * ((c["u"] > 0) if gate else 1.0)
    g["W_1"], g["b_1"] = W(c["h"], du), du.sum((0, 1))
    dh = (do if h_res else 0.0) + du @ params["W_1"].T
    da, g["gamma1"], g["beta1"] = layer_norm_backward_np(c["a_in"] if ln_input else c["h"],
                                                         params["gamma1"], dh)
    g["W_O"], g["b_O"] = W(c["merged"], da), da.sum((0, 1))
    dm = (da @ params["W_O"].T).reshape(B, T, n_heads, -1).transpose(0, 2, 1, 3)
    grads = attention_backward_np(c["Q"], c["K"], c["V"], dm, mask)
    g["x"] = da if x_res else 0.0
    for n, dP in zip("QKV", grads):
        dP = dP.transpose(0, 2, 1, 3).reshape(B, T, d_model)
        g[f"W_{n}"], g[f"b_{n}"] = W(x, dP), dP.sum((0, 1))
        g["x"] = g["x"] + dP @ params[f"W_{n}"].T
    return np.concatenate([np.ravel(g[k]) for k in GRAD_KEYS])


def _layer_wrongs(x, params, dout, n_heads, mask):
    variants = [(dict(x_res=False), LAYER_NO_X_RESIDUAL), (dict(h_res=False), LAYER_NO_H_RESIDUAL),
                (dict(gate=False), LAYER_NO_GATE), (dict(ln_input=False), LAYER_LN_OUTPUT)]
    return _variants(_layer_variant, variants, x, params, dout, n_heads, mask)


def _shape_hint(got_shape, shape):
    if len(shape) == 1 and len(got_shape) > 1:
        return LAYER_BIAS_SUM
    return LAYER_TRANSPOSED if tuple(got_shape) == tuple(shape[::-1]) else LAYER_NO_SPLIT


@exercise("layer_backward", needs=("attention_backward", "layer_norm_backward"))
def layer_backward(layer_backward):
    """Check `layer_backward(x, params, dout, n_heads, mask=None)` -> {name: gradient} against
    autograd through TransformerLayer (post-LN, ReLU) holding the same parameters."""
    B, T, d_model, n_heads, d_ff = 2, 4, 8, 2, 12
    for seed, mask in ((0, None), (1, np.tril(np.ones((T, T), bool)))):
        case = (f"B = {B}, T = {T}, d_model = {d_model}, n_heads = {n_heads}, d_ff = {d_ff}, "
                + ("no mask" if mask is None else "causal mask"))
        params, layer = _layer_params(d_model, n_heads, d_ff, seed)
        rng = _rng(20 + seed)
        x, dout = rng.normal(size=(B, T, d_model)), rng.normal(size=(B, T, d_model))
        xt = torch.tensor(x, requires_grad=True)
        out = layer(xt, mask=None if mask is None else torch.tensor(mask))
        out.backward(torch.tensor(dout))
        right = {_short(n): p.grad.numpy() for n, p in layer.named_parameters()}
        right["x"] = xt.grad.numpy()
        got = call(layer_backward, x.copy(), {k: v.copy() for k, v in params.items()}, dout.copy(),
                   n_heads, None if mask is None else mask.copy(), case=case)
        expect_true(isinstance(got, dict) and set(GRAD_KEYS) <= set(got), case=case,
                    message=f"expected a dict with keys {', '.join(GRAD_KEYS)}, got "
                            + (f"keys {sorted(got)}" if isinstance(got, dict) else type(got).__name__),
                    hint=LAYER_KEYS)
        for key in GRAD_KEYS:
            shape = right[key].shape
            a = as_array(got[key])
            expect_shape(got[key], shape, case=f"{case}, d{key}",
                         hint=_shape_hint(a.shape if a is not None else (), shape))
        flat = np.concatenate([as_array(got[k], np.float64).ravel() for k in GRAD_KEYS])
        hint = diagnose(flat, _layer_wrongs(x, params, dout, n_heads, mask), LAYER_DEFAULT,
                        rtol=1e-6, atol=1e-9)
        for key in GRAD_KEYS:
            expect_close(got[key], right[key], case=f"{case}, d{key}", hint=hint, **TOL)


# ----------------------------------------------------------------------------- flash_forward

FF_NO_RESCALE = ("what happens to the sums of earlier blocks when the maximum grows?",
                 "when a block raises the running maximum from m to m', multiply the accumulated "
                 "output and sum by alpha = exp(m - m') before adding the block: you forgot to "
                 "rescale them")
FF_RESCALE_L_ONLY = ("both accumulators were summed against the old maximum",
                     "rescale acc by alpha as well as l")
FF_OWN_MAX = ("against which maximum are a block's exponentials taken?",
              "exp(s - m') with m' the new *running* maximum, the one acc and l are rescaled to; "
              "you shifted the block by its own maximum")
FF_GLOBAL_MAX = ("each query's row keeps its own running maximum: whose maximum do you take?",
                 "take each block's max along the keys (axis=-1), one per query, not the max of "
                 "the whole block: with one maximum for every row, a query whose scores are far "
                 "below another's underflows to exp(-1000) = 0 and loses its output")
FF_LSE_M = ("lse = log sum_j exp(s_j): what is left after the shift?",
            "lse = m + log l; you returned the running maximum m alone")
FF_LSE_LOG_L = ("l was summed after subtracting m",
                "lse = m + log l; you returned log l alone")
FF_NAN = ("what is exp(m - m') when nothing has been visible yet?",
          "m = m' = -inf gives exp(-inf + inf) = NaN: shift by 0 while the maximum is -inf, and "
          "give a row that saw no key O = 0 and lse = -inf")
FF_NO_SCALE = ("the scores are Q K^T / sqrt(d_k)", "divide each block's scores by sqrt(d_k)")
FF_MASK = ("hidden keys get no weight", "set the scores of hidden keys to -inf in each block "
           "(the mask's columns start to stop)")
FF_DEFAULT = ("m' = max(m, max s), alpha = exp(m - m'), l' = alpha l + sum exp(s - m'), acc' = "
              "alpha acc + exp(s - m') V_j; O = acc / l, lse = m + log l",)


def _ff_wrongs(Q, K, V, mask, block):
    variants = [(dict(rescale="none"), FF_NO_RESCALE), (dict(rescale="l"), FF_RESCALE_L_ONLY),
                (dict(shift="own"), FF_OWN_MAX), (dict(lse="m"), FF_LSE_M),
                (dict(lse="log_l"), FF_LSE_LOG_L), (dict(scale=False), FF_NO_SCALE),
                (dict(use_mask=False), FF_MASK), (dict(shift="global"), FF_GLOBAL_MAX),
                (dict(shift="global", guard=False), FF_GLOBAL_MAX), (dict(guard=False), FF_NAN)]
    return _variants(ff_variant, variants, Q, K, V, mask, block)


@exercise("flash_forward")
def flash_forward(flash_forward):
    """Check `flash_forward(Q, K, V, mask=None, block_size=4)` -> (O, lse) against attention_np
    and torch.logsumexp of the masked scores."""
    scale_case = ("rows of very different scale: query 0's scores [0, 0, 0], query 1's [0, 500, "
                  "1000], blocks of 2", np.array([[0.0], [1000.0]]),
                  np.array([[0.0], [0.5], [1.0]]), np.eye(3), None, 2)
    for case, Q, K, V, mask, block in (*flash_cases(), scale_case):
        right = (attention_np(Q, K, V, mask), masked_lse(Q, K, mask))
        got = call(flash_forward, Q.copy(), K.copy(), V.copy(), None if mask is None else mask.copy(),
                   block, case=case)
        _expect_tuple(got, 2, case=case, names=("O", "lse"))
        for name, g, r in zip(("O", "lse"), got, right):
            expect_shape(g, r.shape, case=f"{case}, {name}",
                         hint=("O has one row per query, (..., L, d_v); lse one number per "
                               "query, (..., L)",))
        flat = np.concatenate([as_array(g, np.float64).ravel() for g in got])
        with np.errstate(all="ignore"):
            hint = diagnose(flat, _ff_wrongs(Q, K, V, mask, block), FF_DEFAULT, rtol=1e-6,
                            atol=1e-9)
        if hint is FF_DEFAULT and np.isnan(flat).any():
            hint = FF_NAN
        for name, g, r in zip(("O", "lse"), got, right):
            expect_close(g, r, case=f"{case}, {name}", hint=hint, **TOL)


# ----------------------------------------------------------------------------- flash_backward

FB_BLOCK_SOFTMAX = ("which statistics make a block's weights final?",
                    "recompute P_j = exp(Z_j - lse) from the whole row's saved log-sum-exp; you "
                    "normalised each block with its own maximum and sum, as if it held every key")
FB_BLOCK_D = ("D is a sum over every key of the row",
              "use D = rowsum(dO * O), computed once before the loop; rowsum(dP_j * P_j) over "
              "one block is only part of it")
FB_P_NOT_T = ("which way round is dV?", "dV_j = P_j^T dO (one row per key), not P_j dO")
FB_NO_SCALE = ("the scores are Q K^T / sqrt(d_k): what does that do to dQ and dK?",
               "dQ += dZ_j K_j / sqrt(d_k) and dK_j = dZ_j^T Q / sqrt(d_k)")
FB_S_UNSCALED = ("recompute the scores exactly as the forward did",
                 "Z_j = Q K_j^T / sqrt(d_k): without the scale, exp(Z_j - lse) are not the "
                 "forward's weights")
FB_MASK = ("may a hidden key receive a gradient?",
           "recompute Z_j with the mask (hidden keys at -inf, so P = 0 there)")
FB_NAN = ("what is exp(Z - lse) for a row that sees no key?",
          "lse = -inf there, and exp(-inf + inf) is NaN: use lse = 0 for such rows (their Z are "
          "all -inf, so P = 0)")
FB_DEFAULT = ("P_j = exp(Z_j - lse), dV_j = P_j^T dO, dZ_j = P_j (dO V_j^T - D) with D = "
              "rowsum(dO O), dQ += dZ_j K_j / sqrt(d_k), dK_j = dZ_j^T Q / sqrt(d_k)",)


def _fb_wrongs(Q, K, V, O, lse, dO, mask, block):
    d_k = Q.shape[-1]
    variants = [(dict(weights="block"), FB_BLOCK_SOFTMAX), (dict(D_block=True), FB_BLOCK_D),
                (dict(p_t=False), FB_P_NOT_T), (dict(scale=math.sqrt(d_k)), FB_NO_SCALE),
                (dict(s_scaled=False), FB_S_UNSCALED), (dict(use_mask=False), FB_MASK),
                (dict(guard=False), FB_NAN)]
    return _variants(fb_variant, variants, Q, K, V, O, lse, dO, mask, block)


@exercise("flash_backward")
def flash_backward(flash_backward):
    """Check `flash_backward(Q, K, V, O, lse, dO, mask=None, block_size=4)` -> (dQ, dK, dV)
    against autograd of scaled_dot_product_attention; O and lse from the package's forward."""
    names = ("dQ", "dK", "dV")
    for case, Q, K, V, mask, block in flash_cases():
        O, lse = flash_attention_forward_np(Q, K, V, mask, block_size=block)
        dO = _rng(len(case)).normal(size=O.shape)
        m = None if mask is None else torch.tensor(mask)
        right = _grad(lambda q, k, v: scaled_dot_product_attention(q, k, v, m), [Q, K, V], dO)
        got = call(flash_backward, Q.copy(), K.copy(), V.copy(), O.copy(), lse.copy(), dO.copy(),
                   None if mask is None else mask.copy(), block, case=case,
                   hint=FB_P_NOT_T[:1] + ("with S != L, check which side of each product is "
                                          "transposed",))
        _expect_tuple(got, 3, case=case, names=names)
        for name, g, r in zip(names, got, right):
            expect_shape(g, r.shape, case=f"{case}, {name}", hint=(f"{name} has the shape of "
                                                                  f"{name[1]}",))
        flat = np.concatenate([as_array(g, np.float64).ravel() for g in got])
        with np.errstate(all="ignore"):
            hint = diagnose(flat, _fb_wrongs(Q, K, V, O, lse, dO, mask, block), FB_DEFAULT,
                            rtol=1e-6, atol=1e-9)
        if hint is FB_DEFAULT and np.isnan(flat).any():
            hint = FB_NAN
        for name, g, r in zip(names, got, right):
            expect_close(g, r, case=f"{case}, {name}", hint=hint, **TOL)


# the hints given when no catalogued mistake is recognised (tests assert a mistake never gets them)
DEFAULTS = {
    "softmax_vjp": [VJP_DEFAULT],
    "attention_backward": [ATT_DEFAULT],
    "layer_norm_backward": [LN_DEFAULT, LN_DGAMMA],
    "layer_backward": [LAYER_DEFAULT],
    "flash_forward": [FF_DEFAULT],
    "flash_backward": [FB_DEFAULT],
}
