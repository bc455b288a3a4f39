# ---
# jupyter:
#   txlearn:
#     title: "Exercises 08: what attention costs"
#     minutes: 45
#     objectives:
#     - count the FLOPs of attention and see the number of heads cancel
#     - update a running softmax over blocks of keys (online softmax)
#     - compute attention block by block without the L x S matrix (tiled attention)
#     imports: [numpy]
# ---

# %% [markdown]
# Conventions of the course: FLOPs = 2 x multiply-accumulates (a product of an `(m, k)` and a
# `(k, n)` matrix costs `2 m k n` FLOPs); arrays are NumPy `float64`. Never change an input in
# place: an update such as `l *= alpha` or `acc += p @ V` on the arrays you were given fails the
# check ("changed its input ... in place"); return new arrays (`l = alpha * l + ...`).

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

# %% [markdown]
# ## Exercise 3: tiled attention
#
# Write `tiled_attention(Q, K, V, mask=None, block_size=2)`: single-head scaled dot-product
# attention, `softmax(Q K^T / sqrt(d_k)) V` with hidden keys (mask `False`) left out, computed by
# walking over the keys in blocks of `block_size` and merging each block with your
# `online_update` from exercise 2, so that no `(L, S)` matrix of scores is ever held:
#
# - `Q` is `(L, d_k)`, `K` is `(S, d_k)`, `V` is `(S, d_v)`, `mask` is `None` or a boolean
#   `(L, S)` array (`True` = may attend); return the `(L, d_v)` output;
# - the last block may be shorter than `block_size`;
# - a query whose keys are all hidden gets the output 0 (never NaN).
#
# Lesson 08 measures that this keeps memory linear in the sequence length. The check compares
# values only: it cannot see whether your code held the full `(L, S)` score matrix at some point
# (computing `Q @ K.T` once and slicing it gives the same output), so keeping to blocks is up to
# you.

# %% tags=["answer"] exercise="tiled_attention"
def tiled_attention(Q, K, V, mask=None, block_size=2):
    ### BEGIN SOLUTION
    L, d_k = Q.shape
    S = K.shape[0]
    m = np.full(L, -np.inf)                       # running max, (L,)
    l = np.zeros(L)                               # running sum, (L,)
    acc = np.zeros((L, V.shape[-1]))              # unnormalised output, (L, d_v)
    for start in range(0, S, block_size):
        stop = min(start + block_size, S)
        block = Q @ K[start:stop].T / np.sqrt(d_k)  # (L, stop - start)
        if mask is not None:
            block = np.where(mask[:, start:stop], block, -np.inf)
        m, l, acc = online_update(m, l, acc, block, V[start:stop])
    safe = np.where(l > 0, l, 1.0)
    return np.where(l[:, None] > 0, acc / safe[:, None], 0.0)  # (L, d_v)
    ### END SOLUTION

# %% tags=["check"] exercise="tiled_attention"
from txlearn.checks import check
check("tiled_attention", tiled_attention)
