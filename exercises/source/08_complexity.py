# ---
# jupyter:
#   txlearn:
#     title: "Exercises 08: what attention costs"
#     minutes: 30
#     objectives:
#     - count the FLOPs of attention and see the number of heads cancel
#     - update a running softmax over blocks of keys (online softmax)
#     imports: [numpy]
# ---

# %% [markdown]
# Lesson: `notebooks/08_complexity.ipynb`. Write each function in its answer cell, then run the
# check cell below it: it prints `PASSED: <exercise>` or tells you which case failed and why.
#
# Conventions of the course: FLOPs = 2 x multiply-accumulates (a product of an `(m, k)` and a
# `(k, n)` matrix costs `2 m k n` FLOPs); arrays are NumPy `float64`.

# %%
import numpy as np

# %% [markdown]
# ## Exercise 1: the FLOPs of multi-head attention
#
# Write `attention_flops(T, d_model, n_heads)` returning an `int`: the forward FLOPs of the
# multi-head self-attention sub-layer on one sequence of `T` tokens, counting only matrix
# products: the four projections (`x W_Q`, `x W_K`, `x W_V`, and `W_O` on the merged heads), the
# scores `Q K^T` and the weighted sum `A V` of every head. Leave out the softmax, the scale and
# the biases (they are of lower order). Each head has width `d_k = d_model // n_heads`.

# %% tags=["answer"] exercise="attention_flops"
def attention_flops(T, d_model, n_heads):
    ### BEGIN SOLUTION
    d_k = d_model // n_heads
    projections = 4 * (2 * T * d_model * d_model)
    scores = n_heads * (2 * T * T * d_k)  # Q K^T, per head (T, d_k) @ (d_k, T)
    weighted_sum = n_heads * (2 * T * T * d_k)  # A V, per head (T, T) @ (T, d_k)
    return projections + scores + weighted_sum
    ### END SOLUTION

# %% tags=["check"] exercise="attention_flops"
from txlearn.checks import check
check("attention_flops", attention_flops)

# %% [markdown]
# ## Exercise 2: one step of the online softmax
#
# Tiled attention reads the keys block by block and keeps, for each query, a running max `m`,
# a running sum `l = sum_j exp(s_j - m)` and an *unnormalised* output `acc = sum_j exp(s_j - m) v_j`
# over the keys seen so far. Write `online_update(m, l, acc, scores, V)` that merges one new
# block and returns `(m_new, l_new, acc_new)`:
#
# $$m' = \max\big(m, \max_j s_j\big), \quad \alpha = e^{m - m'}, \quad p_j = e^{s_j - m'}, \quad
#   l' = \alpha\, l + \sum_j p_j, \quad acc' = \alpha\, acc + p\, V$$
#
# Shapes: `m`, `l` are `(L,)`; `acc` is `(L, d_v)`; `scores` is `(L, S_block)` with `-inf`
# for masked keys; `V` is `(S_block, d_v)`. Before the first block `m = -inf`, `l = 0`,
# `acc = 0`. While every key seen by a query is masked, its `m'` is `-inf`; make sure that row
# gets no NaN (the block must then add nothing). After the last block, the output is `acc / l`.

# %% tags=["answer"] exercise="online_softmax_update"
def online_update(m, l, acc, scores, V):
    ### BEGIN SOLUTION
    m_new = np.maximum(m, scores.max(axis=-1))  # (L,)
    shift = np.where(np.isneginf(m_new), 0.0, m_new)  # no (-inf) - (-inf)
    alpha = np.exp(m - shift)  # (L,)
    p = np.exp(scores - shift[:, None])  # (L, S_block)
    return m_new, alpha * l + p.sum(axis=-1), alpha[:, None] * acc + p @ V
    ### END SOLUTION

# %% tags=["check"] exercise="online_softmax_update"
from txlearn.checks import check
check("online_softmax_update", online_update)
