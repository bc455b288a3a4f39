"""Checks of set 06 (lesson 06): layer_norm_module (``LayerNorm``), rms_norm_module (``RMSNorm``)
and residual_connection (``residual``).

References: ``F.layer_norm`` and ``F.rms_norm`` in float64 with the same gamma and beta, and for
the residual connection the given sub-layer and norm (``given("tanh_linear", ...)``,
``given("layer_norm", ...)``, ``given("rms_norm", ...)``) composed in float64. When an answer is
wrong, the outputs of the catalogued mistakes (``tests/catalogue/norms.py``) on the same inputs
choose the hint; the tiny-variance cases run first because they tell where eps sits.
Source: ``exercises/source/06_norms.py``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from txlearn.checks import GIVEN_KINDS, exercise, expect_close, expect_true, given
from txlearn.checks.modules import (F32, backward, expect_dtype, expect_match, expect_shape_of,
                                    load, make_module, np64, run)

# ----------------------------------------------------------------------------- layer_norm_module

LN_UNBIASED = (
    "which variance LayerNorm uses",
    "the biased variance divides by d (torch.var(..., unbiased=False)); torch.var and "
    "torch.std divide by d - 1 by default",
    "you used the unbiased variance")
LN_UNCENTRED = (
    "the variance is taken around the mean",
    "sigma^2 = mean((x - mu)^2): subtract the mean before squaring",
    "you divided by the root of mean(x^2), the mean square of x itself (RMSNorm's statistic), "
    "not by its variance")
LN_EPS_OUTSIDE = (
    "where eps goes",
    "eps is added to the variance, inside the square root, as in torch.nn.LayerNorm",
    "you divided by sqrt(var) + eps (eps outside the root)")
LN_STD_EPS = (
    "which variance, and where eps goes",
    "torch.std divides by d - 1, and eps belongs inside the square root",
    "you divided by x.std() + eps: unbiased, and eps outside the root")
LN_NO_EPS = (
    "eps keeps the division finite",
    "a row whose entries are all equal has variance 0; eps inside the root keeps it finite",
    "you left eps out")
LN_AXIS = (
    "each token is normalised over its own features",
    "the mean and variance are over the last axis (dim=-1, keepdim=True)",
    "you normalised over another axis, or over the whole tensor")
LN_AFFINE = (
    "gamma scales, beta shifts, after normalising",
    "gamma * x_hat + beta",
    "your gamma and beta are missing or in the wrong place")
LN_EPS_IGNORED = (
    "eps is an argument",
    "use the eps the module was built with",
    "your module ignores its eps argument")
LN_NAMES = (
    "the state-dict names are part of the statement",
    "gamma (d_model,) and beta (d_model,): nothing else",
    "name the parameters gamma and beta")
NORM_GRAD = (
    "the module must be trainable",
    "gradients flow through forward: no NumPy, .detach(), .data or torch.no_grad inside it",
    "no gradient reached a parameter or the input")
LN_DEFAULT = ("gamma * (x - mean) / sqrt(biased variance + eps) + beta, over the last axis",)


def _ln(x, gamma, beta, eps, *, ddof=0, eps_at="inside", dims=(-1,), affine="right",
        centred=True):
    x = torch.as_tensor(np64(x))
    gamma, beta = torch.as_tensor(np64(gamma)), torch.as_tensor(np64(beta))
    mu = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, keepdim=True, correction=ddof) if centred else \
        (x ** 2).mean(dim=dims, keepdim=True)
    if eps_at == "inside":
        x_hat = (x - mu) / torch.sqrt(var + eps)
    elif eps_at == "outside":
        x_hat = (x - mu) / (torch.sqrt(var) + eps)
    else:
        x_hat = (x - mu) / torch.sqrt(var)
    if affine == "none":
        return x_hat
    if affine == "inside":
        return gamma * (x_hat + beta)
    return gamma * x_hat + beta


def _ln_mistakes(x, gamma, beta, eps):
    def v(**kw):
        return lambda: _ln(x, gamma, beta, kw.pop("eps", eps), **kw)
    return [(v(eps=1e-5), LN_EPS_IGNORED), (v(eps=1e-6), LN_EPS_IGNORED),
            (v(ddof=1), LN_UNBIASED), (v(centred=False), LN_UNCENTRED),
            (v(eps_at="outside"), LN_EPS_OUTSIDE),
            (v(ddof=1, eps_at="outside"), LN_STD_EPS), (v(eps_at="none"), LN_NO_EPS),
            (v(dims=(0,)), LN_AXIS), (v(dims=tuple(range(np64(x).ndim))), LN_AXIS),
            (v(affine="none"), LN_AFFINE), (v(affine="inside"), LN_AFFINE)]


def _ln_cases(g):
    d = 8
    yield "x = [[1e-3, -1e-3]] (tiny variance), eps=1e-5", torch.tensor([[1e-3, -1e-3]]), 2, None, None
    # mean 2: the variance 1, the unbiased one 2 and the mean square 5 all differ (on the next
    # case the unbiased variance and the mean square are both 1/4)
    yield "x = [[3, 1]] (mean 2, variance 1)", torch.tensor([[3.0, 1.0]]), 2, None, None
    yield "x = [[1, 0, 0, 0]]", torch.tensor([[1.0, 0.0, 0.0, 0.0]]), 4, None, None
    yield "x = [[2, 2, 2, 2]] (variance 0)", torch.full((1, 4), 2.0), 4, None, None
    gamma, beta = torch.randn(d, generator=g), torch.randn(d, generator=g)
    yield ("x (2, 3, 8) float32 with gamma and beta", 2 + 3 * torch.randn(2, 3, d, generator=g),
           d, None, (gamma, beta))
    yield "eps=1e-2, x (4, 6) of scale 0.1", 0.1 * torch.randn(4, 6, generator=g), 6, 1e-2, None


@exercise("layer_norm_module")
def layer_norm_module(LayerNorm):
    g = torch.Generator().manual_seed(12)
    for case, x, d, eps, affine in _ln_cases(g):
        m = make_module(LayerNorm, d, case=case, **({} if eps is None else {"eps": eps}))
        gamma, beta = affine if affine else (torch.ones(d), torch.zeros(d))
        load(m, {"gamma": gamma, "beta": beta}, case=case, names=LN_NAMES)
        got = run(m, x.clone(), case=case)
        expect_shape_of(got, tuple(x.shape), case=case, hint=("LayerNorm keeps the shape of x",))
        eps = 1e-5 if eps is None else eps
        expect_match(got, F.layer_norm(torch.as_tensor(np64(x)), (d,), torch.as_tensor(np64(gamma)),
                                       torch.as_tensor(np64(beta)), eps),
                     case=case, **F32, mistakes=_ln_mistakes(x, gamma, beta, eps), default=LN_DEFAULT)

    case = "gradients: x (2, 3, 8), gamma and beta"
    m = make_module(LayerNorm, 8, case=case)
    state = {"gamma": torch.randn(8, generator=g), "beta": torch.randn(8, generator=g)}
    load(m, state, case=case, names=LN_NAMES)
    x, g_out = torch.randn(2, 3, 8, generator=g), torch.randn(2, 3, 8, generator=g)
    _expect_grads(m, x, g_out, state, case,
                  lambda x, t: F.layer_norm(x, (8,), t["gamma"], t["beta"], 1e-5))


def _expect_grads(m, x, g_out, state, case, reference):
    _, grads = backward(m, x.clone(), grad_output=g_out, case=case,
                        raised=[("grad", NORM_GRAD), ("numpy", NORM_GRAD)])
    t = {k: torch.as_tensor(np64(v)).requires_grad_(True) for k, v in state.items()}
    xr = torch.as_tensor(np64(x)).requires_grad_(True)
    reference(xr, t).backward(torch.as_tensor(np64(g_out)))
    for name, want in {"input 0": xr.grad, **{k: v.grad for k, v in t.items()}}.items():
        have = grads.get(name)
        expect_true(have is not None, case=case, message=f"no gradient reached {name}",
                    hint=NORM_GRAD)
        expect_close(have, want, case=f"{case}, gradient of {name}", **F32, hint=NORM_GRAD)


# ----------------------------------------------------------------------------- rms_norm_module

RMS_EPS_OUTSIDE = (
    "where eps goes",
    "eps is added to the mean of the squares, inside the square root: for [1e-3, 1e-3] the "
    "answer is 0.707107 per entry",
    "you divided by sqrt(mean(x^2)) + eps (eps outside the root), which gives 0.999")
RMS_NO_EPS = (
    "eps is part of RMSNorm",
    "eps is added to the mean of the squares, inside the square root",
    "you left eps out")
RMS_CENTRED = (
    "RMSNorm does not centre",
    "no mean is subtracted: only the root mean square divides x",
    "you subtracted the mean (that is LayerNorm without beta)")
RMS_SUM = (
    "the root MEAN square",
    "average x^2 over the d features (divide the sum by d); torch.norm is the root of the sum",
    "you used the sum of squares, not their mean")
RMS_NO_SQRT = (
    "the root mean square",
    "take the square root of mean(x^2) + eps",
    "you divided by the mean square itself")
RMS_MULTIPLY = (
    "RMSNorm divides by the root mean square",
    "x / sqrt(mean(x^2) + eps)",
    "you multiplied by it")
RMS_AXIS = (
    "each token is normalised over its own features",
    "the mean of x^2 is over the last axis (dim=-1, keepdim=True)",
    "you averaged over another axis, or over the whole tensor")
RMS_NO_GAMMA = (
    "gamma scales the result",
    "gamma * x / sqrt(mean(x^2) + eps)",
    "gamma was never used")
RMS_NAMES = (
    "the state-dict names are part of the statement",
    "gamma (d_model,): nothing else (no beta)",
    "RMSNorm has no beta")
RMS_DEFAULT = ("gamma * x / sqrt(mean(x^2) + eps) over the last axis",)


def _rms(x, gamma, eps, *, eps_at="inside", centre=False, reduce="mean", root=True, divide=True,
         dims=(-1,), use_gamma=True):
    x = torch.as_tensor(np64(x))
    gamma = torch.as_tensor(np64(gamma))
    if centre:
        x = x - x.mean(-1, keepdim=True)
    sq = (x ** 2).mean(dim=dims, keepdim=True) if reduce == "mean" else \
        (x ** 2).sum(dim=dims, keepdim=True)
    if eps_at == "inside":
        r = torch.sqrt(sq + eps) if root else sq + eps
    elif eps_at == "outside":
        r = torch.sqrt(sq) + eps
    else:
        r = torch.sqrt(sq)
    out = x / r if divide else x * r
    return gamma * out if use_gamma else out


def _rms_mistakes(x, gamma, eps):
    def v(**kw):
        return lambda: _rms(x, gamma, kw.pop("eps", eps), **kw)
    return [(v(eps=1e-6), LN_EPS_IGNORED), (v(eps=1e-5), LN_EPS_IGNORED),
            (v(eps_at="outside"), RMS_EPS_OUTSIDE), (v(eps_at="none"), RMS_NO_EPS),
            (v(centre=True), RMS_CENTRED), (v(reduce="sum"), RMS_SUM),
            (v(reduce="sum", eps_at="outside"), RMS_SUM), (v(root=False), RMS_NO_SQRT),
            (v(divide=False), RMS_MULTIPLY), (v(dims=(0,)), RMS_AXIS),
            (v(dims=tuple(range(np64(x).ndim))), RMS_AXIS), (v(use_gamma=False), RMS_NO_GAMMA)]


def _rms_cases(g):
    d = 8
    yield "x = [[1e-3, 1e-3]] (tiny magnitude), eps=1e-6, gamma 1", torch.tensor([[1e-3, 1e-3]]), 2, None, None
    yield "x = [[3, 4]]", torch.tensor([[3.0, 4.0]]), 2, None, None
    yield ("x (2, 3, 8) float32 with gamma", 1 + 2 * torch.randn(2, 3, d, generator=g), d, None,
           torch.randn(d, generator=g))
    yield "eps=1e-2, x (4, 6) of scale 0.1", 0.1 * torch.randn(4, 6, generator=g), 6, 1e-2, None


@exercise("rms_norm_module")
def rms_norm_module(RMSNorm):
    g = torch.Generator().manual_seed(13)
    for case, x, d, eps, gamma in _rms_cases(g):
        m = make_module(RMSNorm, d, case=case, **({} if eps is None else {"eps": eps}))
        gamma = torch.ones(d) if gamma is None else gamma
        load(m, {"gamma": gamma}, case=case, names=RMS_NAMES)
        got = run(m, x.clone(), case=case)
        expect_shape_of(got, tuple(x.shape), case=case, hint=("RMSNorm keeps the shape of x",))
        expect_dtype(got, torch.float32, case=case, hint=("keep the dtype of x",))
        eps = 1e-6 if eps is None else eps
        want = F.rms_norm(torch.as_tensor(np64(x)), (d,), torch.as_tensor(np64(gamma)), eps)
        tol = {"rtol": 1e-4, "atol": 1e-9} if "tiny" in case else F32   # tell 1e-6 from 0
        expect_match(got, want, case=case, **tol, mistakes=_rms_mistakes(x, gamma, eps),
                     default=RMS_DEFAULT)

    case = "gradients: x (2, 3, 8), gamma"
    m = make_module(RMSNorm, 8, case=case)
    state = {"gamma": torch.randn(8, generator=g)}
    load(m, state, case=case, names=RMS_NAMES)
    x, g_out = torch.randn(2, 3, 8, generator=g), torch.randn(2, 3, 8, generator=g)
    _expect_grads(m, x, g_out, state, case, lambda x, t: F.rms_norm(x, (8,), t["gamma"], 1e-6))


# ----------------------------------------------------------------------------- residual_connection

RES_SWAPPED = (
    "two orders, one flag",
    "norm_first=False is the paper's post-LN, norm(x + sublayer(x)); True is pre-LN, "
    "x + sublayer(norm(x))",
    "your orders are swapped")
RES_NO_RESIDUAL = (
    "the residual connection adds the input back",
    "x itself is added to the sub-layer's output",
    "you returned the sub-layer's output without adding x")
RES_PRE_NORM_OUT = (
    "pre-LN leaves the residual stream unnormalised",
    "with norm_first=True, the sum x + sublayer(norm(x)) is returned as it is",
    "you normalised the sum as well")
RES_NORMED_X = (
    "the residual carries x itself",
    "pre-LN normalises only the sub-layer's input; the x that is added back is not normalised",
    "you added norm(x) instead of x")
RES_POST_INSIDE = (
    "post-LN normalises the sum",
    "the norm acts on x + sublayer(x), after the addition",
    "you normalised only the sub-layer's output, then added x")
RES_PRE_NORM_AFTER = (
    "pre-LN normalises the sub-layer's INPUT",
    "with norm_first=True the norm acts on x before the sub-layer sees it; the sub-layer's "
    "output is added to x as it is",
    "you normalised the sub-layer's output instead of its input")
RES_POST_PARTS = (
    "post-LN normalises the sum",
    "with norm_first=False the norm acts once, on x + sublayer(x), after the addition",
    "you normalised x alone and added the sub-layer's output afterwards")
RES_OWN_NORM = (
    "use the norm you are given",
    "norm is an argument: a LayerNorm here, an RMSNorm there",
    "your function normalised with its own LayerNorm, not with norm")
RES_DEFAULT = ("post-LN: norm(x + sublayer(x)); pre-LN: x + sublayer(norm(x))",)


def _residual(x, sub, norm, norm_first, variant="right"):
    if variant == "no residual":
        return sub(norm(x)) if norm_first else norm(sub(x))
    if variant == "swapped":
        norm_first = not norm_first
    if variant == "pre normalises sum":
        return norm(x + sub(norm(x))) if norm_first else norm(x + sub(x))
    if variant == "normed x":
        return norm(x) + sub(norm(x)) if norm_first else norm(x + sub(x))
    if variant == "post inside":
        return x + sub(norm(x)) if norm_first else x + norm(sub(x))
    if variant == "pre norm after":
        return x + norm(sub(x)) if norm_first else norm(x + sub(x))
    if variant == "post parts":
        return x + sub(norm(x)) if norm_first else norm(x) + sub(x)
    return x + sub(norm(x)) if norm_first else norm(x + sub(x))


_VARIANTS = [("swapped", RES_SWAPPED), ("no residual", RES_NO_RESIDUAL),
             ("pre normalises sum", RES_PRE_NORM_OUT), ("normed x", RES_NORMED_X),
             ("post inside", RES_POST_INSIDE), ("pre norm after", RES_PRE_NORM_AFTER),
             ("post parts", RES_POST_PARTS)]


@exercise("residual_connection")
def residual_connection(residual):
    rng = np.random.default_rng(14)
    W, b = rng.normal(0, 0.8, (6, 6)), rng.normal(0, 0.5, 6)
    sublayer = given("tanh_linear", W=W, b=b)
    ln = given("layer_norm", eps=1e-5)
    rms = given("rms_norm", eps=1e-6, gamma=rng.uniform(0.5, 2.0, 6))
    x64 = torch.as_tensor(rng.normal(1.0, 2.0, (2, 3, 6)))
    cases = [("post-LN (norm_first=False), x (2, 3, 6) float64, a LayerNorm", x64, ln, "layer_norm", {}),
             ("pre-LN (norm_first=True), x (2, 3, 6) float32, a LayerNorm", x64.float(), ln, "layer_norm",
              {"norm_first": True}),
             ("pre-LN, x (2, 3, 6) float64, an RMSNorm as the norm", x64, rms, "rms_norm",
              {"norm_first": True}),
             ("post-LN, x (5, 6) float64, an RMSNorm as the norm", x64[0, :, :].repeat(2, 1)[:5], rms,
              "rms_norm", {})]
    for case, x, norm, kind, kwargs in cases:
        got = run(residual, x.clone(), sublayer, norm, case=case, **kwargs)
        expect_shape_of(got, tuple(x.shape), case=case, hint=("the result has the shape of x",))
        xd = torch.as_tensor(np64(x))
        sub64 = lambda h: GIVEN_KINDS["tanh_linear"](h, W=W, b=b)            # noqa: E731
        norm64 = lambda h: GIVEN_KINDS[kind](h, **norm.data)                  # noqa: E731
        first = kwargs.get("norm_first", False)
        mistakes = [(lambda v=v: _residual(xd, sub64, norm64, first, v), h) for v, h in _VARIANTS]
        own = lambda h: GIVEN_KINDS["layer_norm"](h)                          # noqa: E731
        mistakes.append((lambda: _residual(xd, sub64, own, first), RES_OWN_NORM))
        tol = F32 if x.dtype == torch.float32 else {"rtol": 1e-7, "atol": 1e-9}
        expect_match(got, _residual(xd, sub64, norm64, first), case=case, **tol,
                     mistakes=mistakes, default=RES_DEFAULT)
