# ---
# jupyter:
#   txlearn:
#     title: "Exercises 03: multi-head and grouped-query attention"
#     minutes: 45
#     objectives:
#     - split a batch into heads and merge it back
#     - run multi-head attention and say where d_k enters
#     - share keys and values across query heads (grouped-query attention)
#     - count the bytes of a KV cache
#     imports: [numpy, txlearn.attention]
# ---

# %% [markdown]
# Arrays are NumPy `float64`; weights are `(d_in, d_out)` and applied as `x @ W`; masks are
# boolean with `True` = may attend. You may use `attention_np(Q, K, V, mask)` from the package
# (lesson 02's scaled dot-product attention; `return_weights=True` also returns the weights).

# %%
import numpy as np

from txlearn.attention import attention_np

# %% [markdown]
# ## Exercise 1: split and merge heads
#
# `split_heads(x, n_heads)` turns `x` of shape `(B, T, d_model)` into `(B, n_heads, T, d_k)`
# with `d_k = d_model // n_heads`; head `h` of position `t` holds the contiguous slice
# `x[b, t, h*d_k:(h+1)*d_k]`. `merge_heads(x)` is its inverse, `(B, n_heads, T, d_k) ->
# (B, T, n_heads * d_k)`.

# %% tags=["answer"] exercise="split_merge_heads"
def split_heads(x, n_heads):
    ### BEGIN SOLUTION
    B, T, d_model = x.shape
    x = x.reshape(B, T, n_heads, d_model // n_heads)  # (B, T, n_heads, d_k)
    return x.transpose(0, 2, 1, 3)  # (B, n_heads, T, d_k)
    ### END SOLUTION


def merge_heads(x):
    ### BEGIN SOLUTION
    B, n_heads, T, d_k = x.shape
    x = x.transpose(0, 2, 1, 3)  # (B, T, n_heads, d_k)
    return x.reshape(B, T, n_heads * d_k)  # (B, T, d_model)
    ### END SOLUTION

# %% tags=["check"] exercise="split_merge_heads"
from txlearn.checks import check
check("split_merge_heads", split_heads, merge_heads)

# %% [markdown]
# ## Exercise 2: a multi-head forward pass
#
# Write `multi_head_attention(x, W_Q, W_K, W_V, W_O, n_heads, mask=None)` returning
# `(out, weights)`: project `x (B, T, d_model)` with each `W (d_model, d_model)`, split into
# heads, attend in every head with its own scale `sqrt(d_k)`, merge the heads and project with
# `W_O`. `weights` is per head, `(B, n_heads, T, T)`; `out` is `(B, T, d_model)`. No biases.
#
# $$\text{MultiHead}(x) = \text{Concat}(\text{head}_1, \dots, \text{head}_h)\, W_O, \qquad
#   \text{head}_i = \text{Attention}(x W_Q^i, x W_K^i, x W_V^i)$$

# %% tags=["answer"] exercise="multi_head_forward"
def multi_head_attention(x, W_Q, W_K, W_V, W_O, n_heads, mask=None):
    ### BEGIN SOLUTION
    Q = split_heads(x @ W_Q, n_heads)  # (B, n_heads, T, d_k)
    K = split_heads(x @ W_K, n_heads)
    V = split_heads(x @ W_V, n_heads)
    heads, weights = attention_np(Q, K, V, mask, return_weights=True)  # (B, n_heads, T, d_k)
    return merge_heads(heads) @ W_O, weights
    ### END SOLUTION

# %% tags=["check"] exercise="multi_head_forward"
from txlearn.checks import check
check("multi_head_forward", multi_head_attention)

# %% [markdown]
# ## Exercise 3: sharing keys and values across query heads (GQA)
#
# In grouped-query attention, `Q` has `n_heads` heads but `K` and `V` only `n_kv_heads`
# (a divisor of `n_heads`). Consecutive query heads share one key/value head: query head `h`
# reads key/value head `h // (n_heads // n_kv_heads)` (the grouping of PyTorch's
# `F.scaled_dot_product_attention(..., enable_gqa=True)`).
#
# Write `grouped_query_attention(Q, K, V, mask=None)`: `Q (B, n_heads, L, d_k)`,
# `K, V (B, n_kv_heads, S, d_k)`; return `out (B, n_heads, L, d_k)`.

# %% tags=["answer"] exercise="grouped_query_attention"
def grouped_query_attention(Q, K, V, mask=None):
    ### BEGIN SOLUTION
    n_rep = Q.shape[1] // K.shape[1]
    K = np.repeat(K, n_rep, axis=1)  # (B, n_heads, S, d_k)
    V = np.repeat(V, n_rep, axis=1)  # (B, n_heads, S, d_k)
    return attention_np(Q, K, V, mask)
    ### END SOLUTION

# %% tags=["check"] exercise="grouped_query_attention"
from txlearn.checks import check
check("grouped_query_attention", grouped_query_attention)

# %% [markdown]
# ## Exercise 4: the memory of the key/value cache
#
# Write `kv_cache_memory(n_layers, n_heads, n_kv_heads, d_model, context, bytes_per_element)`:
# the bytes a decoder needs to cache keys and values for `context` tokens of one sequence.
# Each layer caches, for every token, `n_kv_heads` key heads and as many value heads, each
# `d_k = d_model // n_heads` wide.

# %% tags=["answer"] exercise="kv_cache_memory"
def kv_cache_memory(n_layers, n_heads, n_kv_heads, d_model, context, bytes_per_element):
    ### BEGIN SOLUTION
    d_k = d_model // n_heads
    return 2 * n_layers * n_kv_heads * d_k * context * bytes_per_element
    ### END SOLUTION

# %% tags=["check"] exercise="kv_cache_memory"
from txlearn.checks import check
check("kv_cache_memory", kv_cache_memory)
