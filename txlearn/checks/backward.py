"""Checks of set 11, backpropagation by hand: softmax_vjp, attention_backward, layer_norm_backward,
layer_backward (a whole post-LN layer from the learner's own pieces), flash_forward and
flash_backward (FlashAttention's tiled forward that keeps the log-sum-exp, and its recomputing
backward).

Every answer is NumPy float64. The right values come from autograd in float64 (``torch.softmax``,
``scaled_dot_product_attention``, ``F.layer_norm``, ``TransformerLayer``) or from the package's
float64 references, which are themselves tested against autograd. When an answer is wrong, the
outputs of the catalogued mistakes (``tests/catalogue/backward.py``) on the same inputs choose the
hint. Inputs are chosen so that each mistake shows: rows of unequal length, L != S after a square
case, a fully masked row, gamma away from 1, tokens of few features (where the biased variance
differs from the unbiased one), a ReLU that is off for some units.
Source: ``exercises/source/11_backward.py``; lessons 01, 02, 06, 07 and 08.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from txlearn.attention import attention_backward_np, masked_softmax_np, scaled_dot_product_attention
from txlearn.checks import as_array, call, diagnose, exercise, expect_close, expect_shape, expect_true
from txlearn.layer import TransformerLayer
from txlearn.norms import layer_norm_backward_np, layer_norm_np
from txlearn.softmax import softmax_vjp_np

TOL = dict(rtol=1e-7, atol=1e-9)


def _rng(seed):
    return np.random.default_rng(seed)


def _grad(fn, arrays, grad_out):
    """Autograd's gradients of fn(*tensors) against `grad_out`, float64 NumPy."""
    tensors = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    out = fn(*tensors)
    grads = torch.autograd.grad(out, tensors, torch.tensor(grad_out), allow_unused=True)
    return [g.numpy() for g in grads]


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
VJP_DEFAULT = ("dx = s * (g - <s, g>), the inner product along `axis`",)


def _vjp_wrongs(s, g, axis):
    inner = (s * g).sum(axis=axis, keepdims=True)
    other = 0 if axis % s.ndim != 0 else 1
    return [(lambda: s * g, VJP_NO_INNER), (lambda: s * (inner - g), VJP_SIGN),
            (lambda: s * (g - g.sum(axis=axis, keepdims=True)), VJP_SUM_G),
            (lambda: g - inner, VJP_NO_S), (lambda: s * (1 - s) * g, VJP_DIAG),
            (lambda: s * (g - (s * g).sum(axis=axis)), VJP_KEEPDIMS),
            (lambda: s * (g - (s * g).sum(axis=other, keepdims=True)), VJP_AXIS)]


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
                "dQ = dS K / sqrt(d_k) and dK = dS^T Q / sqrt(d_k): you left out the 1/sqrt(d_k)")
ATT_DOUBLE_SCALE = ("how many times does 1/sqrt(d_k) appear?",
                    "you divided by sqrt(d_k) twice (by d_k): once in the scores of the forward, "
                    "once in dQ and dK")
ATT_P_NOT_T = ("which way round is dV?",
               "O = P V, so dV_s = sum_l P_ls dO_l: dV = P^T dO, not P dO")
ATT_NO_INNER = ("the softmax's backward pass has two terms",
                "dS = P * (dP - rowsum(dP * P)): you dropped the rowsum term (lesson 01's <s, g>)")
ATT_DK_NOT_T = ("dK has one row per key",
                "dK = dS^T Q / sqrt(d_k): transpose dS (you used dS Q)")
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
ATT_DEFAULT = ("dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)), dQ = dS K / sqrt(d_k), "
               "dK = dS^T Q / sqrt(d_k)",)


def _att_variant(Q, K, V, dO, mask, *, scale=1.0, p_t=True, inner=True, dk_t=True, use_mask=True,
                 additive=False):
    """What attention's backward computes with one catalogued mistake (NumPy float64)."""
    d_k = Q.shape[-1]
    scores = Q @ np.swapaxes(K, -1, -2) / math.sqrt(d_k)
    if additive and mask is not None:
        P = masked_softmax_np(scores + np.where(mask, 0.0, -1e9))
    else:
        P = masked_softmax_np(scores, mask if use_mask else None)
    dV = (np.swapaxes(P, -1, -2) if p_t else P) @ dO
    dP = dO @ np.swapaxes(V, -1, -2)
    dS = softmax_vjp_np(P, dP) if inner else P * dP
    c = scale / math.sqrt(d_k)
    dK = (np.swapaxes(dS, -1, -2) @ Q if dk_t else dS @ Q) * c
    return dS @ K * c, dK, dV


def _att_wrongs(Q, K, V, dO, mask):
    d_k = Q.shape[-1]
    variants = [(dict(scale=math.sqrt(d_k)), ATT_NO_SCALE),
                (dict(scale=1 / math.sqrt(d_k)), ATT_DOUBLE_SCALE), (dict(p_t=False), ATT_P_NOT_T),
                (dict(inner=False), ATT_NO_INNER), (dict(dk_t=False), ATT_DK_NOT_T),
                (dict(use_mask=False), ATT_MASK_IGNORED), (dict(additive=True), ATT_MINUS_1E9)]
    return [(lambda kw=kw: np.concatenate([a.ravel() for a in _att_variant(Q, K, V, dO, mask, **kw)]),
             hint) for kw, hint in variants]


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
                   None if mask is None else mask.copy(), case=case, hint=ATT_P_NOT_T[:1] +
                   ("with L != S, check which side of each product is transposed",))
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
    return [(lambda kw=kw: _ln_variant(x, gamma, dy, eps, **kw), hint) for kw, hint in variants]


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
        for name, g, r in zip(("dgamma", "dbeta"), got[1:], right[1:]):
            expect_shape(g, (d,), case=f"{case}, {name}", hint=LN_PARAM_SUM)
            expect_close(g, r, case=f"{case}, {name}", hint=LN_DEFAULT if name == "dbeta" else
                         ("dgamma = sum over tokens of dy * xhat (xhat before gamma)",), **TOL)


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
    return [(lambda kw=kw: _layer_variant(x, params, dout, n_heads, mask, **kw), hint)
            for kw, hint in variants]


def _shape_hint(got_shape, shape):
    if len(shape) == 1 and len(got_shape) > 1:
        return LAYER_BIAS_SUM
    if len(shape) == 2 and tuple(got_shape) == tuple(shape[::-1]):
        return LAYER_TRANSPOSED
    return LAYER_NO_SPLIT


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


# the hints given when no catalogued mistake is recognised (tests assert a mistake never gets them)
DEFAULTS = {
    "softmax_vjp": [VJP_DEFAULT],
    "attention_backward": [ATT_DEFAULT],
    "layer_norm_backward": [LN_DEFAULT],
    "layer_backward": [LAYER_DEFAULT],
}
