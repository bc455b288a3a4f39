# ---
# jupyter:
#   txlearn:
#     title: "Exercises 05: the position-wise feed-forward network as a module"
#     minutes: 40
#     objectives:
#     - compute the exact GELU on tensors
#     - write the feed-forward network as an nn.Module with GELU
#     - write its gated variant, SwiGLU, with the course's names for the three matrices
#     imports: [numpy, torch]
#     retired:
#       gelu_exact: gelu (the same function, on tensors)
#       ffn_forward: feed_forward (an nn.Module with GELU) and swiglu (the gated variant)
# ---

# %% [markdown]
# Lesson: `notebooks/05_ffn.ipynb`. Weights are `(d_in, d_out)` and applied as `x @ W + b`. Set
# 07 builds its transformer layer from your `FeedForward`.

# %%
import math

import torch
from torch import nn

# %% [markdown]
# ## Exercise 1: the exact GELU
#
# Write `gelu(x)` for a tensor `x`, elementwise, the exact form
#
# $$\mathrm{GELU}(x) = x\,\Phi(x) = \tfrac12\, x \left(1 + \mathrm{erf}(x/\sqrt2)\right),$$
#
# where $\Phi$ is the standard normal CDF (`torch.erf` works on tensors). Keep the dtype of `x`.
# The check's tolerance tells the exact form from the tanh and the sigmoid approximations.

# %% tags=["answer"] exercise="gelu"
def gelu(x):
    ### BEGIN SOLUTION
    Phi = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))    # standard normal CDF
    return x * Phi
    ### END SOLUTION

# %% tags=["check"] exercise="gelu"
from txlearn.checks import check
check("gelu", gelu)

# %% [markdown]
# ## Exercise 2: `FeedForward`
#
# The paper's position-wise network (section 3.3, eq. 2), with GELU in place of ReLU as in BERT
# and GPT-2:
#
# $$\mathrm{FFN}(x) = \mathrm{GELU}(x W_1 + b_1)\, W_2 + b_2 .$$
#
# Write the module `FeedForward(d_model, d_ff, bias=True)` with parameters `W_1 (d_model, d_ff)`,
# `b_1 (d_ff,)`, `W_2 (d_ff, d_model)`, `b_2 (d_model,)` (no `b_*` when `bias=False`, and no
# other parameters) and `forward(x)` for `x` of shape `(..., d_model)`, returning the same shape.
# Use your `gelu`.

# %% tags=["answer"] exercise="feed_forward"
class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, bias=True):
        super().__init__()
        ### BEGIN SOLUTION
        self.W_1 = nn.Parameter(torch.randn(d_model, d_ff) / math.sqrt(d_model))
        self.W_2 = nn.Parameter(torch.randn(d_ff, d_model) / math.sqrt(d_ff))
        self.b_1 = nn.Parameter(torch.zeros(d_ff)) if bias else None
        self.b_2 = nn.Parameter(torch.zeros(d_model)) if bias else None
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        hidden = x @ self.W_1 if self.b_1 is None else x @ self.W_1 + self.b_1    # (..., d_ff)
        out = gelu(hidden) @ self.W_2                                            # (..., d_model)
        return out if self.b_2 is None else out + self.b_2
        ### END SOLUTION

# %% tags=["check"] exercise="feed_forward"
from txlearn.checks import check
check("feed_forward", FeedForward)

# %% [markdown]
# ## Exercise 3: SwiGLU
#
# The gated feed-forward network of LLaMA and PaLM (Shazeer 2020, eq. 6) multiplies an "up"
# projection by a gate, elementwise, before the "down" projection:
#
# $$\mathrm{SwiGLU}(x) = \big(\mathrm{SiLU}(x W_3 + b_3) \odot (x W_1 + b_1)\big)\, W_2 + b_2,
# \qquad \mathrm{SiLU}(z) = z\,\sigma(z).$$
#
# The course's names: `W_1 (d_model, d_ff)` is the up projection, `W_3 (d_model, d_ff)` the gate
# (the only one under the SiLU), `W_2 (d_ff, d_model)` the down projection, and biases `b_1`,
# `b_3 (d_ff,)`, `b_2 (d_model,)` only when `bias=True`. Write the module
# `SwiGLU(d_model, d_ff, bias=False)` (no biases by default, as in LLaMA).

# %% tags=["answer"] exercise="swiglu"
class SwiGLU(nn.Module):
    def __init__(self, d_model, d_ff, bias=False):
        super().__init__()
        ### BEGIN SOLUTION
        self.W_1 = nn.Parameter(torch.randn(d_model, d_ff) / math.sqrt(d_model))
        self.W_3 = nn.Parameter(torch.randn(d_model, d_ff) / math.sqrt(d_model))
        self.W_2 = nn.Parameter(torch.randn(d_ff, d_model) / math.sqrt(d_ff))
        self.b_1 = nn.Parameter(torch.zeros(d_ff)) if bias else None
        self.b_3 = nn.Parameter(torch.zeros(d_ff)) if bias else None
        self.b_2 = nn.Parameter(torch.zeros(d_model)) if bias else None
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        def affine(W, b):
            return x @ W if b is None else x @ W + b

        gate = affine(self.W_3, self.b_3)                        # (..., d_ff)
        up = affine(self.W_1, self.b_1)                          # (..., d_ff)
        hidden = gate * torch.sigmoid(gate) * up                 # SiLU(gate) * up
        out = hidden @ self.W_2                                  # (..., d_model)
        return out if self.b_2 is None else out + self.b_2
        ### END SOLUTION

# %% tags=["check"] exercise="swiglu"
from txlearn.checks import check
check("swiglu", SwiGLU)
