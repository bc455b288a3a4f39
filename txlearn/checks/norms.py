"""Checks for lesson 06's exercises: LayerNorm, RMSNorm and the residual sub-layer connection.

When the learner's answer differs, it is compared with the catalogued mistakes
(tests/catalogue/norms.py) to choose the hint.
"""

import numpy as np

from txlearn.checks import call, diagnose, exercise, expect_close, expect_shape, given
from txlearn.norms import layer_norm_np, rms_norm_np


UNBIASED = ("use the biased variance, mean((x - mu)^2), dividing by d (np.var's default ddof=0), "
            "not by d - 1 (torch.var's default, unbiased=True)")
EPS_OUTSIDE = "put eps inside the square root: (x - mu) / sqrt(var + eps), not / (sqrt(var) + eps)"
WRONG_AXIS = ("normalise each token over its features: the last axis (axis=-1, keepdims=True), "
              "not axis 0 or the whole array")
GAMMA_BETA = "scale by gamma and then shift by beta, after normalising: gamma * x_hat + beta"


def _layer_norm_wrongs(x, gamma, beta, eps):
    mu = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return [
        (gamma * (x - mu) / np.sqrt(x.var(-1, ddof=1, keepdims=True) + eps) + beta, UNBIASED),
        (gamma * (x - mu) / (np.sqrt(var) + eps) + beta, EPS_OUTSIDE),
        (gamma * (x - x.mean(0)) / np.sqrt(x.var(0) + eps) + beta, WRONG_AXIS),
        (gamma * (x - x.mean()) / np.sqrt(x.var() + eps) + beta, WRONG_AXIS),
        ((x - mu) / np.sqrt(var + eps), GAMMA_BETA),
        (gamma * (x - mu) / np.sqrt(var + eps), GAMMA_BETA),
        ((x - mu) / np.sqrt(var + eps) + beta, GAMMA_BETA),
        (gamma * ((x - mu) / np.sqrt(var + eps) + beta), GAMMA_BETA),
    ]


def _layer_norm_cases():
    rng = np.random.default_rng(6)
    ones, zeros = np.ones(4), np.zeros(4)
    yield "x = [1, 0, 0, 0]", np.array([1.0, 0, 0, 0]), ones, zeros, [1.732005, -0.577335, -0.577335, -0.577335]
    yield "x = [1e-3, -1e-3] (tiny variance)", np.array([1e-3, -1e-3]), np.ones(2), np.zeros(2), [0.301511, -0.301511]
    x = rng.normal(2.0, 3.0, size=(3, 4))
    yield "x of shape (3, 4): 3 tokens", x, ones, zeros, layer_norm_np(x)
    gamma, beta = rng.normal(size=4), rng.normal(size=4)
    x = rng.normal(size=(2, 3, 4))
    yield "x (2, 3, 4) with gamma and beta", x, gamma, beta, layer_norm_np(x, gamma, beta)


@exercise("layer_norm")
def layer_norm(fn):
    for case, x, gamma, beta, expected in _layer_norm_cases():
        got = call(fn, x.copy(), gamma.copy(), beta.copy(), case=case)
        expect_shape(got, x.shape, case=case, hint="LayerNorm keeps the shape of x")
        expect_close(got, expected, case=case, atol=1e-6,
                     hint=diagnose(got, _layer_norm_wrongs(x, gamma, beta, 1e-5),
                                    "gamma * (x - mean) / sqrt(biased var + eps) + beta over the "
                                    "last axis, eps = 1e-5"))


RECIPROCAL = ("divide by the root mean square, x / sqrt(mean(x^2) + eps); you multiplied by it (or "
              "divided by its reciprocal)")
MEAN_SUBTRACTED = "RMSNorm does not subtract the mean: x / sqrt(mean(x^2) + eps), no centring"
RMS_AXIS = "take the mean of x^2 over the last axis (axis=-1, keepdims=True), per token"
NO_MEAN = "use the mean of x^2 (divide the sum by d), not the sum"


def _rms_norm_wrongs(x, gamma, eps):
    ms = (x ** 2).mean(-1, keepdims=True)
    xc = x - x.mean(-1, keepdims=True)
    return [
        (gamma * x * np.sqrt(ms + eps), RECIPROCAL),
        (gamma * xc / np.sqrt((xc ** 2).mean(-1, keepdims=True) + eps), MEAN_SUBTRACTED),
        (gamma * xc / np.sqrt(ms + eps), MEAN_SUBTRACTED),
        (gamma * x / np.sqrt((x ** 2).sum(-1, keepdims=True) + eps), NO_MEAN),
        (gamma * x / np.sqrt((x ** 2).mean(0) + eps), RMS_AXIS),
        (gamma * x / np.sqrt((x ** 2).mean() + eps), RMS_AXIS),
    ]


@exercise("rms_norm")
def rms_norm(fn):
    rng = np.random.default_rng(7)
    x = rng.normal(1.0, 2.0, size=(3, 5))
    gamma = rng.normal(size=5)
    cases = [
        ("x = [3, 4]", np.array([3.0, 4.0]), np.ones(2), [0.848528, 1.131371]),
        ("x of shape (3, 5) with gamma", x, gamma, rms_norm_np(x, gamma)),
    ]
    for case, x, gamma, expected in cases:
        got = call(fn, x.copy(), gamma.copy(), case=case)
        expect_shape(got, x.shape, case=case, hint="RMSNorm keeps the shape of x")
        expect_close(got, expected, case=case, atol=1e-6,
                     hint=diagnose(got, _rms_norm_wrongs(x, gamma, 1e-6),
                                    "gamma * x / sqrt(mean(x^2) + eps) over the last axis, eps = 1e-6"))


SWAPPED = ("the two orders are swapped: post-LN is norm(x + sublayer(x)) (the paper), pre-LN is "
           "x + sublayer(norm(x))")
NO_RESIDUAL = "keep the residual: add x back (x + sublayer(...)), do not return only the sub-layer"
PRE_NORM_OUT = "pre-LN does not normalise the sum: return x + sublayer(norm(x)) as it is"


@exercise("residual_sublayer")
def residual_sublayer(fn):
    rng = np.random.default_rng(8)
    x = rng.normal(1.0, 2.0, size=(2, 3, 4))
    W = rng.normal(size=(4, 4))
    sublayer = given("tanh_linear", W=W)   # tanh(h @ W): built from data, so a grader can pass it
    norm = given("layer_norm")             # LayerNorm without gain or shift, eps = 1e-5
    right = {"post": norm(x + sublayer(x)), "pre": x + sublayer(norm(x))}
    other = {"post": "pre", "pre": "post"}
    for order in ("post", "pre"):
        case = f"order={order!r}"
        got = call(fn, x.copy(), sublayer, norm, order, case=case)
        expect_shape(got, x.shape, case=case, hint="the residual keeps the shape of x")
        wrongs = [
            (right[other[order]], SWAPPED),
            (norm(sublayer(x)), NO_RESIDUAL),
            (sublayer(norm(x)), NO_RESIDUAL),
            (norm(x + sublayer(norm(x))), PRE_NORM_OUT),
            (norm(x) + sublayer(norm(x)), "add the un-normalised x: x + sublayer(norm(x))"),
        ]
        expect_close(got, right[order], case=case, atol=1e-6,
                     hint=diagnose(got, wrongs, "post: norm(x + sublayer(x)); pre: x + sublayer(norm(x))"))
