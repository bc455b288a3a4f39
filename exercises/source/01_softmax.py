# ---
# jupyter:
#   txlearn:
#     title: "Exercises 01: softmax and the 1/sqrt(d_k) scale"
#     minutes: 40
#     objectives:
#     - compute a softmax that cannot overflow and explain why the max-shift changes nothing
#     - compute attention scores scaled by 1/sqrt(d_k) for batched queries and keys
#     - derive the softmax Jacobian and say when it vanishes
#     - compute log-softmax without log(0)
#     imports: [numpy]
# ---

# %% [markdown]
# Lesson: `notebooks/01_softmax.ipynb`. Write each function in its answer cell, then run the
# check cell below it: it prints `PASSED (public cases): <exercise>` or tells you which case
# failed and why.
#
# Everything here is NumPy `float64`. Use array operations (no Python loops over elements), and
# never modify an input array in place: the caller still needs it.

# %%
import numpy as np

# %% [markdown]
# ## Exercise 1: a numerically stable softmax
#
# Write `softmax(x, axis=-1)`: the softmax of the NumPy array `x` along `axis`,
#
# $$\text{softmax}(x)_i = \frac{e^{x_i - m}}{\sum_j e^{x_j - m}}, \qquad m = \max_j x_j,$$
#
# where the sum and the maximum run along `axis` only, so each slice (each row of a 2-D `x` with
# `axis=-1`) is its own distribution. Subtracting `m` changes nothing mathematically and keeps
# every `exp` argument at or below 0. The result has the shape of `x`.
#
# The check uses: `softmax(np.array([1000., 1001., 1002.]))` must give
# `[0.090031, 0.244728, 0.665241]`; `softmax(np.array([-1e4, -1e4]))` must give `[0.5, 0.5]`;
# each row of `softmax(np.array([[0., 1.], [1000., 1001.]]))` must give `[0.268941, 0.731059]`.

# %% tags=["answer"] exercise="stable_softmax"
def softmax(x, axis=-1):
    ### BEGIN SOLUTION
    x = np.asarray(x, dtype=np.float64)
    z = x - x.max(axis=axis, keepdims=True)  # (..., 1, ...) broadcast along `axis`
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)
    ### END SOLUTION

# %% tags=["check"] exercise="stable_softmax"
from txlearn.checks import check
check("stable_softmax", softmax)

# %% [markdown]
# ## Exercise 2: the scaled scores
#
# Write `scaled_scores(Q, K)` returning the attention scores
#
# $$\text{scores} = \frac{Q K^\top}{\sqrt{d_k}},$$
#
# for queries `Q` of shape `(..., L, d_k)` and keys `K` of shape `(..., S, d_k)`: entry
# `[..., l, s]` is the dot product of query `l` with key `s`, divided by `sqrt(d_k)`, and the
# result has shape `(..., L, S)`. The leading axes `...` (a batch) may be absent or present:
# transpose only the last two axes of `K`. `d_k` is the width of one query, the size of the last
# axis. Return the scores, not their softmax.

# %% tags=["answer"] exercise="scaled_scores"
def scaled_scores(Q, K):
    ### BEGIN SOLUTION
    d_k = Q.shape[-1]
    return Q @ np.swapaxes(K, -1, -2) / np.sqrt(d_k)  # (..., L, d_k) @ (..., d_k, S) -> (..., L, S)
    ### END SOLUTION

# %% tags=["check"] exercise="scaled_scores"
from txlearn.checks import check
check("scaled_scores", scaled_scores)

# %% [markdown]
# ## Exercise 3: the softmax Jacobian
#
# Write `softmax_jacobian(x)` for a 1-D array of logits `x` of shape `(n,)`, returning the
# `(n, n)` matrix of partial derivatives `J[i, j] = d s_i / d x_j` of `s = softmax(x)`:
#
# $$J_{ij} = s_i(\delta_{ij} - s_j), \qquad J = \operatorname{diag}(s) - s s^\top.$$
#
# Compute `s` stably (your Exercise 1 `softmax` is defined above; you may call it). Lesson 01
# measures how this matrix shrinks as the softmax saturates.

# %% tags=["answer"] exercise="softmax_jacobian"
def softmax_jacobian(x):
    ### BEGIN SOLUTION
    x = np.asarray(x, dtype=np.float64)
    z = x - x.max()
    s = np.exp(z) / np.exp(z).sum()        # (n,)
    return np.diag(s) - np.outer(s, s)     # (n, n)
    ### END SOLUTION

# %% tags=["check"] exercise="softmax_jacobian"
from txlearn.checks import check
check("softmax_jacobian", softmax_jacobian)

# %% [markdown]
# ## Exercise 4: log-softmax without log(0)
#
# Write `log_softmax(x, axis=-1)`, the natural log of the softmax along `axis`, computed so that
# it stays finite where `np.log(softmax(x))` gives `log(0) = -inf`:
#
# $$\log \text{softmax}(x)_i = z_i - \log \sum_j e^{z_j}, \qquad z = x - \max_j x_j.$$
#
# For example `log_softmax(np.array([0., -1000.]))` is `[0., -1000.]`, while
# `np.log(softmax(...))` gives `[0., -inf]`.

# %% tags=["answer"] exercise="log_softmax"
def log_softmax(x, axis=-1):
    ### BEGIN SOLUTION
    x = np.asarray(x, dtype=np.float64)
    z = x - x.max(axis=axis, keepdims=True)  # (..., 1, ...) broadcast along `axis`
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))
    ### END SOLUTION

# %% tags=["check"] exercise="log_softmax"
from txlearn.checks import check
check("log_softmax", log_softmax)

# %% [markdown]
# When every check passes, lesson 02 (`notebooks/02_attention.ipynb`) puts the softmax and the scaled
# scores together into attention.
