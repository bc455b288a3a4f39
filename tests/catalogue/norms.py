"""Reference and catalogued wrong answers for lesson 06's checks (txlearn/checks/norms.py)."""

import numpy as np


def layer_norm_ref(x, gamma, beta, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return gamma * (x - mu) / np.sqrt(var + eps) + beta


def layer_norm_unbiased(x, gamma, beta, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, ddof=1, keepdims=True)
    return gamma * (x - mu) / np.sqrt(var + eps) + beta


def layer_norm_eps_outside(x, gamma, beta, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    return gamma * (x - mu) / (x.std(axis=-1, keepdims=True) + eps) + beta


def layer_norm_axis0(x, gamma, beta, eps=1e-5):
    mu = x.mean(axis=0, keepdims=True)
    var = x.var(axis=0, keepdims=True)
    return gamma * (x - mu) / np.sqrt(var + eps) + beta


def layer_norm_no_beta(x, gamma, beta, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    return gamma * (x - mu) / np.sqrt(x.var(axis=-1, keepdims=True) + eps)


def rms_norm_ref(x, gamma, eps=1e-6):
    return gamma * x / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + eps)


def rms_norm_reciprocal(x, gamma, eps=1e-6):
    return gamma * x / (1.0 / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + eps))


def rms_norm_centred(x, gamma, eps=1e-6):
    xc = x - x.mean(axis=-1, keepdims=True)
    return gamma * xc / np.sqrt((xc ** 2).mean(axis=-1, keepdims=True) + eps)


def rms_norm_sum(x, gamma, eps=1e-6):
    return gamma * x / np.sqrt((x ** 2).sum(axis=-1, keepdims=True) + eps)


def residual_ref(x, sublayer, norm, order):
    if order == "post":
        return norm(x + sublayer(x))
    return x + sublayer(norm(x))


def residual_swapped(x, sublayer, norm, order):
    return residual_ref(x, sublayer, norm, "pre" if order == "post" else "post")


def residual_forgotten(x, sublayer, norm, order):
    return norm(sublayer(x)) if order == "post" else sublayer(norm(x))


def residual_pre_normalises_output(x, sublayer, norm, order):
    if order == "post":
        return norm(x + sublayer(x))
    return norm(x + sublayer(norm(x)))


REFERENCE = {
    "layer_norm": (layer_norm_ref,),
    "rms_norm": (rms_norm_ref,),
    "residual_sublayer": (residual_ref,),
}

WRONG = {
    "layer_norm": [
        ("unbiased variance", (layer_norm_unbiased,), "biased variance"),
        ("eps outside the square root", (layer_norm_eps_outside,), "eps inside the square root"),
        ("normalised over axis 0", (layer_norm_axis0,), "last axis"),
        ("beta forgotten", (layer_norm_no_beta,), "shift by beta"),
    ],
    "rms_norm": [
        ("divides by the reciprocal root", (rms_norm_reciprocal,), "divide by the root mean square"),
        ("subtracts the mean", (rms_norm_centred,), "does not subtract the mean"),
        ("sum instead of mean", (rms_norm_sum,), "not the sum"),
    ],
    "residual_sublayer": [
        ("pre-LN and post-LN swapped", (residual_swapped,), "orders are swapped"),
        ("no residual", (residual_forgotten,), "keep the residual"),
        ("pre-LN normalises the sum", (residual_pre_normalises_output,), "does not normalise the sum"),
    ],
}
