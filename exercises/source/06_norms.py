# ---
# jupyter:
#   txlearn:
#     title: "Exercises 06: LayerNorm, RMSNorm and the residual sub-layer, as modules"
#     minutes: 40
#     objectives:
#     - write LayerNorm and RMSNorm as nn.Modules, with the biased variance and eps inside the root
#     - connect any sub-layer with a residual and a norm, post-LN and pre-LN
#     imports: [numpy, torch]
#     retired:
#       layer_norm: layer_norm_module (an nn.Module with gamma and beta)
#       rms_norm: rms_norm_module (an nn.Module with gamma)
#       residual_sublayer: residual_connection (the same connection, with norm_first as in PyTorch)
# ---

# %% [markdown]
# Lesson: `notebooks/06_norms.ipynb`. Every statistic is per token, over the **last** axis. Set 07
# builds its transformer layer from your `LayerNorm` and `residual`.

# %%
import math

import torch
from torch import nn

# %% [markdown]
# ## Exercise 1: `LayerNorm`
#
# $$\mathrm{LN}(x) = \gamma \odot \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta,\qquad
# \mu = \tfrac1d \textstyle\sum_j x_j,\quad \sigma^2 = \tfrac1d \sum_j (x_j - \mu)^2 .$$
#
# Write the module `LayerNorm(d_model, eps=1e-5)` with parameters `gamma (d_model,)` (initialised
# to 1) and `beta (d_model,)` (initialised to 0), and `forward(x)` for `x (..., d_model)`. The
# variance is the *biased* one (divide by d; mind `torch.var`'s default) and eps sits *inside* the
# square root, as in `torch.nn.LayerNorm`. `[1, 0, 0, 0]` gives
# `[1.732005, -0.577335, -0.577335, -0.577335]`.

# %% tags=["answer"] exercise="layer_norm_module"
class LayerNorm(nn.Module):
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        ### BEGIN SOLUTION
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(d_model))
        self.beta = nn.Parameter(torch.zeros(d_model))
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        mu = x.mean(dim=-1, keepdim=True)                          # (..., 1)
        var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)           # biased, (..., 1)
        x_hat = (x - mu) / torch.sqrt(var + self.eps)
        return self.gamma * x_hat + self.beta
        ### END SOLUTION

# %% tags=["check"] exercise="layer_norm_module"
from txlearn.checks import check
check("layer_norm_module", LayerNorm)

# %% [markdown]
# ## Exercise 2: `RMSNorm`
#
# $$\mathrm{RMSNorm}(x) = \gamma \odot \frac{x}{\sqrt{\tfrac1d \sum_j x_j^2 + \epsilon}}$$
#
# (Zhang and Sennrich 2019): no mean is subtracted and there is no beta. Write the module
# `RMSNorm(d_model, eps=1e-6)` with the parameter `gamma (d_model,)` (initialised to 1). `[3, 4]`
# gives `[0.848528, 1.131371]`; `[1e-3, 1e-3]` gives `0.707107` per entry, because eps is
# inside the root.

# %% tags=["answer"] exercise="rms_norm_module"
class RMSNorm(nn.Module):
    def __init__(self, d_model, eps=1e-6):
        super().__init__()
        ### BEGIN SOLUTION
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(d_model))
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        mean_square = (x ** 2).mean(dim=-1, keepdim=True)          # (..., 1)
        return self.gamma * x * torch.rsqrt(mean_square + self.eps)
        ### END SOLUTION

# %% tags=["check"] exercise="rms_norm_module"
from txlearn.checks import check
check("rms_norm_module", RMSNorm)

# %% [markdown]
# ## Exercise 3: the residual sub-layer connection
#
# Write `residual(x, sublayer, norm, norm_first=False)`, where `sublayer` and `norm` are
# callables from `(..., d_model)` to `(..., d_model)` (an attention or FFN module, a `LayerNorm`):
#
# - `norm_first=False`: $\mathrm{norm}(x + \mathrm{sublayer}(x))$, the paper's order (post-LN,
#   section 3.1);
# - `norm_first=True`: $x + \mathrm{sublayer}(\mathrm{norm}(x))$, the order of GPT-2 and later
#   (pre-LN; the name of `torch.nn.TransformerEncoderLayer`'s flag).
#
# Call each of `sublayer` and `norm` once: set 07 passes an attention that keeps a KV cache as
# the sub-layer, and a second call would append its keys twice (this check cannot count the calls;
# set 07's cached layer can).

# %% tags=["answer"] exercise="residual_connection"
def residual(x, sublayer, norm, norm_first=False):
    ### BEGIN SOLUTION
    if norm_first:
        return x + sublayer(norm(x))        # pre-LN
    return norm(x + sublayer(x))            # post-LN
    ### END SOLUTION

# %% tags=["check"] exercise="residual_connection"
from txlearn.checks import check
check("residual_connection", residual)
