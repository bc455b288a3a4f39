"""Reference answers and catalogued wrong answers for set 06's checks (txlearn/checks/norms.py),
written the way a learner writes them (PyTorch)."""

import torch
import torch.nn.functional as F
from torch import nn


# ------------------------------------------------------------------ layer_norm_module

def ln_class(*, stats="biased", eps_at="inside", dim=-1, affine="right", fixed_eps=None,
             extra=False):
    class LayerNorm(nn.Module):
        def __init__(self, d_model, eps=1e-5):
            super().__init__()
            self.eps = eps if fixed_eps is None else fixed_eps
            self.gamma = nn.Parameter(torch.ones(d_model))
            self.beta = nn.Parameter(torch.zeros(d_model))
            if extra:
                self.weight = nn.Parameter(torch.ones(d_model))

        def forward(self, x):
            dims = tuple(range(x.dim())) if dim == "all" else dim
            mu = x.mean(dim=dims, keepdim=True)
            if stats == "biased":
                var = ((x - mu) ** 2).mean(dim=dims, keepdim=True)
            elif stats == "uncentred":                        # the mean square, not the variance
                var = (x ** 2).mean(dim=dims, keepdim=True)
            else:
                var = x.var(dim=dims, keepdim=True)          # torch's default: unbiased
            if eps_at == "inside":
                x_hat = (x - mu) / torch.sqrt(var + self.eps)
            elif eps_at == "outside":
                x_hat = (x - mu) / (torch.sqrt(var) + self.eps)
            else:
                x_hat = (x - mu) / torch.sqrt(var)
            if affine == "inside":
                return self.gamma * (x_hat + self.beta)
            if affine == "none":
                return x_hat
            return self.gamma * x_hat + self.beta

    return LayerNorm


class LayerNormStd(nn.Module):
    """The annotated-transformer style: x.std() (unbiased) and eps outside the root."""

    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(d_model))
        self.beta = nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.gamma * (x - mean) / (std + self.eps) + self.beta


class LayerNormDetached(nn.Module):
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(d_model))
        self.beta = nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        out = F.layer_norm(x, x.shape[-1:], self.gamma.data, self.beta.data, self.eps)
        return out.detach()


# ------------------------------------------------------------------ rms_norm_module

def rms_class(*, eps_at="inside", centre=False, reduce="mean", root=True, divide=True, dim=-1,
              use_gamma=True, fixed_eps=None, beta=False):
    class RMSNorm(nn.Module):
        def __init__(self, d_model, eps=1e-6):
            super().__init__()
            self.eps = eps if fixed_eps is None else fixed_eps
            self.gamma = nn.Parameter(torch.ones(d_model))
            if beta:
                self.beta = nn.Parameter(torch.zeros(d_model))

        def forward(self, x):
            dims = tuple(range(x.dim())) if dim == "all" else dim
            h = x - x.mean(-1, keepdim=True) if centre else x
            sq = (h ** 2).mean(dim=dims, keepdim=True) if reduce == "mean" else \
                (h ** 2).sum(dim=dims, keepdim=True)
            if eps_at == "inside":
                r = torch.sqrt(sq + self.eps) if root else sq + self.eps
            elif eps_at == "outside":
                r = torch.sqrt(sq) + self.eps
            else:
                r = torch.sqrt(sq)
            out = h / r if divide else h * r
            return self.gamma * out if use_gamma else out

    return RMSNorm


class RMSNormTorchNorm(nn.Module):
    """x / (||x|| + eps): torch.norm is the root of the SUM of squares."""

    def __init__(self, d_model, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        return self.gamma * x / (x.norm(dim=-1, keepdim=True) + self.eps)


# ------------------------------------------------------------------ residual_connection

def residual_ref(x, sublayer, norm, norm_first=False):
    if norm_first:
        return x + sublayer(norm(x))
    return norm(x + sublayer(x))


def residual_swapped(x, sublayer, norm, norm_first=False):
    if not norm_first:
        return x + sublayer(norm(x))
    return norm(x + sublayer(x))


def residual_forgotten(x, sublayer, norm, norm_first=False):
    if norm_first:
        return sublayer(norm(x))
    return norm(sublayer(x))


def residual_pre_normalises_sum(x, sublayer, norm, norm_first=False):
    if norm_first:
        return norm(x + sublayer(norm(x)))
    return norm(x + sublayer(x))


def residual_adds_normed_x(x, sublayer, norm, norm_first=False):
    if norm_first:
        h = norm(x)
        return h + sublayer(h)
    return norm(x + sublayer(x))


def residual_post_norm_inside(x, sublayer, norm, norm_first=False):
    if norm_first:
        return x + sublayer(norm(x))
    return x + norm(sublayer(x))


def residual_pre_norms_output(x, sublayer, norm, norm_first=False):
    if norm_first:
        return x + norm(sublayer(x))
    return norm(x + sublayer(x))


def residual_post_norms_x_only(x, sublayer, norm, norm_first=False):
    if norm_first:
        return x + sublayer(norm(x))
    return norm(x) + sublayer(x)


def residual_own_layer_norm(x, sublayer, norm, norm_first=False):
    own = lambda h: F.layer_norm(h, h.shape[-1:])                          # noqa: E731
    if norm_first:
        return x + sublayer(own(x))
    return own(x + sublayer(x))


def residual_order_string(x, sublayer, norm, norm_first=False):
    if norm_first == "pre":                                                # a string compared
        return x + sublayer(norm(x))
    return norm(x + sublayer(x))


REFERENCE = {
    "layer_norm_module": (ln_class(),),
    "rms_norm_module": (rms_class(),),
    "residual_connection": (residual_ref,),
}

WRONG = {
    "layer_norm_module": [
        ("unbiased variance (torch.var's default)", (ln_class(stats="unbiased"),),
         "unbiased variance"),
        ("eps outside the root", (ln_class(eps_at="outside"),), "eps outside the root"),
        ("the mean square of x as its variance", (ln_class(stats="uncentred"),),
         "subtract the mean before squaring"),
        ("x.std() + eps", (LayerNormStd,), "x.std() + eps"),
        ("no eps at all", (ln_class(eps_at="none"),), "left eps out"),
        ("normalised over axis 0", (ln_class(dim=0),), "another axis"),
        ("normalised over the whole tensor", (ln_class(dim="all"),), "whole tensor"),
        ("gamma * (x_hat + beta)", (ln_class(affine="inside"),), "wrong place"),
        ("no gamma and beta", (ln_class(affine="none"),), "missing"),
        ("eps fixed at 1e-5", (ln_class(fixed_eps=1e-5),), "ignores its eps"),
        ("an extra weight", (ln_class(extra=True),), "name the parameters gamma and beta"),
        ("output detached", (LayerNormDetached,), ".detach()"),
    ],
    "rms_norm_module": [
        ("eps outside the root", (rms_class(eps_at="outside"),), "gives 0.999"),
        ("no eps", (rms_class(eps_at="none"),), "left eps out"),
        ("mean subtracted", (rms_class(centre=True),), "subtracted the mean"),
        ("sum of squares", (rms_class(reduce="sum"),), "sum of squares"),
        ("torch.norm + eps", (RMSNormTorchNorm,), "sum of squares"),
        ("no square root", (rms_class(root=False),), "mean square itself"),
        ("multiplied by the RMS", (rms_class(divide=False),), "multiplied by it"),
        ("averaged over axis 0", (rms_class(dim=0),), "another axis"),
        ("gamma unused", (rms_class(use_gamma=False),), "gamma was never used"),
        ("eps fixed at 1e-6", (rms_class(fixed_eps=1e-6),), "ignores its eps"),
        ("a beta", (rms_class(beta=True),), "no beta"),
    ],
    "residual_connection": [
        ("orders swapped", (residual_swapped,), "orders are swapped"),
        ("no residual", (residual_forgotten,), "without adding x"),
        ("pre-LN normalises the sum", (residual_pre_normalises_sum,), "normalised the sum"),
        ("pre-LN adds norm(x)", (residual_adds_normed_x,), "added norm(x)"),
        ("post-LN normalises the sub-layer only", (residual_post_norm_inside,),
         "normalised only the sub-layer's output"),
        ("pre-LN normalises the sub-layer's output (learner 23)", (residual_pre_norms_output,),
         "instead of its input"),
        ("post-LN as norm(x) + sublayer(x) (learner 23)", (residual_post_norms_x_only,),
         "normalised x alone"),
        ("its own LayerNorm", (residual_own_layer_norm,), "its own layernorm"),
        ("norm_first compared with a string", (residual_order_string,), "orders are swapped"),
    ],
}
