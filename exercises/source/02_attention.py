# ---
# jupyter:
#   txlearn:
#     title: "Exercises 02: attention as a soft lookup, and masks"
#     minutes: 35
#     objectives:
#     - build a causal mask for L queries over S keys, aligned to the last positions
#     - build a padding mask from sequence lengths
#     - write masked attention that gives 0, not NaN, for a row with every key masked
#     imports: [numpy]
# ---

# %% [markdown]
# Lesson: `notebooks/02_attention.ipynb`. Write each function in its answer cell, then run the
# check cell below it: it prints `PASSED (public cases): <exercise>` or tells you which case
# failed and why.
#
# Conventions of the course: masks are **boolean** and `True` means *may attend*; arrays are
# NumPy `float64`; a query whose keys are all masked gets weights 0 and output 0.

# %%
import numpy as np

# %% [markdown]
# ## Exercise 1: the causal mask
#
# Write `causal_mask(L, S=None)` returning a boolean array of shape `(L, S)` (`S` defaults to
# `L`): `True` where query `i` may attend to key `j`. For `L == S` that is every key at or before
# the query's own position. When `L < S` the queries are the **last** `L` positions of an
# `S`-token sequence (decoding with a cache), so the mask is aligned to the bottom-right corner:
# the last query sees all `S` keys.
#
# `causal_mask(4)` must be the lower triangle *including* the diagonal.

# %% tags=["answer"] exercise="causal_mask"
def causal_mask(L, S=None):
    ### BEGIN SOLUTION
    S = L if S is None else S
    return np.tril(np.ones((L, S), dtype=bool), k=S - L)
    ### END SOLUTION

# %% tags=["check"] exercise="causal_mask"
from txlearn.checks import check
check("causal_mask", causal_mask)

# %% [markdown]
# ## Exercise 2: the padding mask
#
# A batch holds `B` sequences of different lengths, padded at the end to a common length `S`.
# Write `padding_mask(lengths, S)` returning a boolean array of shape `(B, S)`: entry `[b, j]` is
# `True` when position `j` holds a real token of sequence `b` (it comes before the sequence's
# length), `False` on padding. `lengths` is a list or 1-D array of `B` integers between 0 and `S`.
#
# As a key mask it broadcasts against `(B, L, S)` scores once it has a query axis of size 1.

# %% tags=["answer"] exercise="padding_mask"
def padding_mask(lengths, S):
    ### BEGIN SOLUTION
    lengths = np.asarray(lengths)
    return np.arange(S)[None, :] < lengths[:, None]  # (1, S) vs (B, 1) -> (B, S)
    ### END SOLUTION

# %% tags=["check"] exercise="padding_mask"
from txlearn.checks import check
check("padding_mask", padding_mask)

# %% [markdown]
# ## Exercise 3: scaled dot-product attention with a mask
#
# Write `attention(Q, K, V, mask=None)` returning `(out, weights)`:
#
# $$\text{weights} = \text{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right), \qquad
#   \text{out} = \text{weights}\, V$$
#
# - `Q` is `(..., L, d_k)`, `K` is `(..., S, d_k)`, `V` is `(..., S, d_v)`; `weights` is
#   `(..., L, S)` and `out` is `(..., L, d_v)`. Transpose only the last two axes of `K`.
# - `mask` is `None` or boolean, broadcastable to `(..., L, S)`; a key whose entry is `False`
#   gets weight exactly 0.
# - The softmax runs over the keys; subtract each row's maximum before `exp` (lesson 01).
# - A query whose keys are all masked gets weights 0 and output 0, never NaN.

# %% tags=["answer"] exercise="masked_attention"
def attention(Q, K, V, mask=None):
    ### BEGIN SOLUTION
    d_k = Q.shape[-1]
    scores = Q @ np.swapaxes(K, -1, -2) / np.sqrt(d_k)  # (..., L, S)
    if mask is None:
        mask = np.ones(scores.shape, dtype=bool)
    scores = np.where(mask, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)  # empty rows: shift by 0
    e = np.exp(scores - row_max)  # exp(-inf) = 0 for hidden keys
    total = e.sum(axis=-1, keepdims=True)
    weights = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return weights @ V, weights
    ### END SOLUTION

# %% tags=["check"] exercise="masked_attention"
from txlearn.checks import check
check("masked_attention", attention)
