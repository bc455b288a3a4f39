# ---
# jupyter:
#   txlearn:
#     title: "Exercises 05: the position-wise feed-forward network"
#     minutes: 25
#     objectives:
#     - write the position-wise feed-forward network
#     - compute the exact GELU
#     imports: [numpy]
# ---

# %% [markdown]
# Two exercises on lesson 05 (`notebooks/05_ffn.ipynb`). Write each function in its answer cell,
# then run the check cell below it. Use NumPy (float64).

# %%
import math

import numpy as np

# %% [markdown]
# ## Exercise 1: the FFN forward pass
#
# Write `ffn_forward(x, W_1, b_1, W_2, b_2)` computing the paper's equation 2,
#
# $$\mathrm{FFN}(x) = \max(0,\; x W_1 + b_1)\, W_2 + b_2,$$
#
# for `x` of shape `(..., d_model)`, `W_1` `(d_model, d_ff)`, `b_1` `(d_ff,)`, `W_2`
# `(d_ff, d_model)`, `b_2` `(d_model,)`. Weights are `(d_in, d_out)` and multiply on the right.
# The result has the shape of `x`.

# %% tags=["answer"] exercise="ffn_forward"
def ffn_forward(x, W_1, b_1, W_2, b_2):
    ### BEGIN SOLUTION
    h = np.maximum(0.0, x @ W_1 + b_1)                               # (..., d_ff)
    return h @ W_2 + b_2                                             # (..., d_model)
    ### END SOLUTION

# %% tags=["check"] exercise="ffn_forward"
from txlearn.checks import check
check("ffn_forward", ffn_forward)

# %% [markdown]
# ## Exercise 2: the exact GELU
#
# Write `gelu(x)`, elementwise on an array, the exact form
#
# $$\mathrm{GELU}(x) = x\,\Phi(x) = \tfrac12\, x \left(1 + \mathrm{erf}(x/\sqrt2)\right),$$
#
# where $\Phi$ is the standard normal CDF. `math.erf` works on one number; `np.vectorize(math.erf)`
# applies it to an array. The check's tolerance (1e-7) tells the exact form from the tanh and the
# sigmoid approximations.

# %% tags=["answer"] exercise="gelu_exact"
def gelu(x):
    ### BEGIN SOLUTION
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    ### END SOLUTION

# %% tags=["check"] exercise="gelu_exact"
from txlearn.checks import check
check("gelu_exact", gelu)
