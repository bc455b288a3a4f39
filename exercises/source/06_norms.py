# ---
# jupyter:
#   txlearn:
#     title: "Exercises 06: residuals and normalisation"
#     minutes: 30
#     objectives:
#     - write LayerNorm and RMSNorm with eps in the right place
#     - connect a sub-layer with a residual, post-LN and pre-LN
#     imports: [numpy]
# ---

# %% [markdown]
# Three exercises on lesson 06 (`notebooks/06_norms.ipynb`). Write each function in its answer
# cell, then run the check cell below it. Use NumPy (float64); every statistic is per token, over
# the **last** axis.

# %%
import numpy as np

# %% [markdown]
# ## Exercise 1: LayerNorm
#
# Write `layer_norm(x, gamma, beta, eps=1e-5)` for `x` of shape `(..., d)`:
#
# $$\mathrm{LN}(x) = \gamma \odot \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta,\qquad
# \mu = \tfrac1d \textstyle\sum_j x_j,\quad \sigma^2 = \tfrac1d \sum_j (x_j - \mu)^2 .$$
#
# The variance is the *biased* one (divide by d) and eps sits *inside* the square root, as in
# `torch.nn.LayerNorm`. `[1, 0, 0, 0]` gives `[1.732005, -0.577335, -0.577335, -0.577335]`.

# %% tags=["answer"] exercise="layer_norm"
def layer_norm(x, gamma, beta, eps=1e-5):
    ### BEGIN SOLUTION
    mu = x.mean(axis=-1, keepdims=True)                              # (..., 1)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)               # (..., 1)
    return gamma * (x - mu) / np.sqrt(var + eps) + beta
    ### END SOLUTION

# %% tags=["check"] exercise="layer_norm"
from txlearn.checks import check
check("layer_norm", layer_norm)

# %% [markdown]
# ## Exercise 2: RMSNorm
#
# Write `rms_norm(x, gamma, eps=1e-6)`:
#
# $$\mathrm{RMSNorm}(x) = \gamma \odot \frac{x}{\sqrt{\tfrac1d \sum_j x_j^2 + \epsilon}} .$$
#
# No mean is subtracted and there is no beta. `[3, 4]` gives `[0.848528, 1.131371]`.

# %% tags=["answer"] exercise="rms_norm"
def rms_norm(x, gamma, eps=1e-6):
    ### BEGIN SOLUTION
    rms = np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + eps)       # (..., 1)
    return gamma * x / rms
    ### END SOLUTION

# %% tags=["check"] exercise="rms_norm"
from txlearn.checks import check
check("rms_norm", rms_norm)

# %% [markdown]
# ## Exercise 3: the residual sub-layer connection
#
# Write `sublayer_connection(x, sublayer, norm, order)` where `sublayer` and `norm` are functions
# from `(..., d)` to `(..., d)`:
#
# - `order == "post"`: $\mathrm{norm}(x + \mathrm{sublayer}(x))$, the paper's order (section 3.1);
# - `order == "pre"`: $x + \mathrm{sublayer}(\mathrm{norm}(x))$, the order of GPT-2 and later.

# %% tags=["answer"] exercise="residual_sublayer"
def sublayer_connection(x, sublayer, norm, order):
    ### BEGIN SOLUTION
    if order == "post":
        return norm(x + sublayer(x))
    return x + sublayer(norm(x))
    ### END SOLUTION

# %% tags=["check"] exercise="residual_sublayer"
from txlearn.checks import check
check("residual_sublayer", sublayer_connection)
