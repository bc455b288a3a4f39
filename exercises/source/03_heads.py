# ---
# jupyter:
#   txlearn:
#     title: "Exercises 03: multi-head attention as a PyTorch module"
#     minutes: 80
#     objectives:
#     - split a batch of vectors into heads and merge them back, on tensors
#     - share each key/value head with a group of query heads (grouped-query and multi-query attention)
#     - keep a key/value cache and build the bottom-right causal mask that decoding with it needs
#     - write MultiHeadAttention as an nn.Module whose cached forward equals the uncached one
#     - count the bytes of a KV cache
#     imports: [numpy, torch]
#     retired:
#       split_merge_heads: split_heads (the same functions, on PyTorch tensors)
#       multi_head_forward: multi_head_attention (an nn.Module with W_Q, W_K, W_V, W_O and biases)
#       grouped_query_attention: repeat_kv, and multi_head_attention with n_kv_heads
# ---

# %% [markdown]
# From this set on you write PyTorch: functions over tensors and `nn.Module` classes that later
# sets load from this notebook and build on (set 04 adds rotary positions to your
# `MultiHeadAttention`, set 07 builds a transformer layer and a language model from it). Keep the
# names and signatures as given.
#
# Conventions of the course: weights are `(d_in, d_out)` and applied as `x @ W + b`; boolean masks
# are `True` = *may attend*; `d_k = d_model // n_heads`; a query with no visible key gets an
# attention output of 0 (as in set 02). The checks give your modules float32 inputs, and your
# functions float32 and float64 ones.

# %%
import math

import torch
from torch import nn

# %% [markdown]
# ## Exercise 1: split and merge heads
#
# `split_heads(x, n_heads)` turns `x` of shape `(B, T, d_model)` into `(B, n_heads, T, d_k)`: head
# `h` of position `t` holds the contiguous slice `x[b, t, h*d_k:(h+1)*d_k]`. `merge_heads(x)` is
# its inverse, `(B, n_heads, T, d_k) -> (B, T, n_heads * d_k)`. Both keep the dtype.

# %% tags=["answer"] exercise="split_heads"
def split_heads(x, n_heads):
    ### BEGIN SOLUTION
    B, T, d_model = x.shape
    per_head = x.reshape(B, T, n_heads, d_model // n_heads)     # (B, T, n_heads, d_k)
    return per_head.transpose(1, 2)                             # (B, n_heads, T, d_k)
    ### END SOLUTION


def merge_heads(x):
    ### BEGIN SOLUTION
    B, n_heads, T, d_k = x.shape
    per_position = x.transpose(1, 2)                            # (B, T, n_heads, d_k)
    return per_position.reshape(B, T, n_heads * d_k)            # (B, T, d_model)
    ### END SOLUTION

# %% tags=["check"] exercise="split_heads"
from txlearn.checks import check
check("split_heads", split_heads, merge_heads)

# %% [markdown]
# ## Exercise 2: one key/value head for a group of query heads
#
# In grouped-query attention (GQA; Ainslie et al. 2023) the queries have `n_heads` heads but keys
# and values only `n_kv_heads` (a divisor of `n_heads`); multi-query attention is
# `n_kv_heads = 1`. Consecutive query heads share one key/value head: with
# `n_rep = n_heads // n_kv_heads`, query head `h` reads key/value head `h // n_rep`, the grouping
# of `F.scaled_dot_product_attention(..., enable_gqa=True)`.
#
# Write `repeat_kv(x, n_rep)`: `x` is `(B, n_kv_heads, S, d_k)`; return
# `(B, n_kv_heads * n_rep, S, d_k)` whose head `h` is head `h // n_rep` of `x` (so head 0 of `x`
# fills heads `0 .. n_rep - 1`).

# %% tags=["answer"] exercise="repeat_kv"
def repeat_kv(x, n_rep):
    ### BEGIN SOLUTION
    shared = x.repeat_interleave(n_rep, dim=1)   # head g -> heads g*n_rep .. g*n_rep + n_rep - 1
    return shared                                # (B, n_kv_heads * n_rep, S, d_k)
    ### END SOLUTION

# %% tags=["check"] exercise="repeat_kv"
from txlearn.checks import check
check("repeat_kv", repeat_kv)

# %% [markdown]
# ## Exercise 3: the key/value cache and its mask
#
# A decoder generates one token at a time. The keys and values of the positions it has already
# seen do not change, so it keeps them (the KV cache) and computes only the new positions' `Q`, `K`
# and `V`. Write two functions:
#
# - `append_kv(cache, K, V)`: `cache` is `None` (nothing seen yet) or the pair `(K_past, V_past)`,
#   each `(B, n_kv_heads, S_past, d_k)`; `K` and `V` are this step's, `(B, n_kv_heads, L, d_k)`.
#   Return the pair `(K_all, V_all)`, each `(B, n_kv_heads, S_past + L, d_k)`, past positions
#   first.
# - `causal_mask(L, S)`: the boolean `(L, S)` mask, `True` = may attend, for `L` queries that are
#   the **last** `L` of `S` positions (as in set 02, now a tensor): query `i` sits at position
#   `S - L + i` and sees keys `0 .. S - L + i`. With `L == S` it is the lower triangle with its
#   diagonal.

# %% tags=["answer"] exercise="kv_cache"
def append_kv(cache, K, V):
    ### BEGIN SOLUTION
    if cache is None:
        return K, V
    K_past, V_past = cache
    K_all = torch.cat([K_past, K], dim=2)        # (B, n_kv_heads, S_past + L, d_k)
    V_all = torch.cat([V_past, V], dim=2)
    return K_all, V_all
    ### END SOLUTION


def causal_mask(L, S):
    ### BEGIN SOLUTION
    allowed = torch.ones(L, S, dtype=torch.bool)
    return torch.tril(allowed, diagonal=S - L)   # (L, S), aligned to the bottom-right corner
    ### END SOLUTION

# %% tags=["check"] exercise="kv_cache"
from txlearn.checks import check
check("kv_cache", append_kv, causal_mask)

# %% [markdown]
# ## Exercise 4: `MultiHeadAttention`
#
# $$\text{MultiHead}(x) = \text{Concat}(\text{head}_1, \dots, \text{head}_{n_{heads}})\, W_O + b_O,
# \qquad \text{head}_h = \text{softmax}\!\Big(\frac{Q_h K_{g(h)}^\top}{\sqrt{d_k}}\Big) V_{g(h)}$$
#
# with `Q = x @ W_Q + b_Q` split into `n_heads` heads, `K = x @ W_K + b_K` and `V = x @ W_V + b_V`
# into `n_kv_heads` heads, and `g(h) = h // n_rep` (exercise 2). Write the module
# `MultiHeadAttention(d_model, n_heads, n_kv_heads=None, bias=True)` (`n_kv_heads=None` means
# `n_heads`: ordinary multi-head attention). Its parameters, by these state-dict names:
#
# | name | shape | | name | shape |
# |---|---|---|---|---|
# | `W_Q` | `(d_model, d_model)` | | `b_Q` | `(d_model,)` |
# | `W_K`, `W_V` | `(d_model, n_kv_heads * d_k)` | | `b_K`, `b_V` | `(n_kv_heads * d_k,)` |
# | `W_O` | `(d_model, d_model)` | | `b_O` | `(d_model,)` |
#
# With `bias=False` there are no `b_*` at all; keep no other parameters or buffers (initialise the
# weights as you like: the checks load their own).
#
# `forward(x, mask=None, use_cache=False)`: `x` is `(B, L, d_model)`; `mask` is boolean,
# broadcastable to `(B, n_heads, L, S)` (a causal `(L, S)` mask, or a padding mask
# `(B, 1, 1, S)`); returns `(B, L, d_model)`. In this order:
#
# 1. project `x` and split into heads: `Q (B, n_heads, L, d_k)`, `K, V (B, n_kv_heads, L, d_k)`;
# 2. `start` = the number of positions already in the cache when `use_cache` is true, else 0;
# 3. `Q, K = self.apply_positions(Q, K, start)` (given below; it changes nothing here, and set 04
#    overrides it to rotate `Q` and `K` by their positions `start, start + 1, ...`);
# 4. if `use_cache`: append `K, V` to `self.kv_cache` with `append_kv` and attend over all cached
#    positions (`S = start + L`); without `use_cache` the cache is neither read nor changed;
# 5. share the key/value heads with `repeat_kv`, attend in every head with its own `sqrt(d_k)`,
#    give a query with no visible key the output 0, merge the heads and project with `W_O`, `b_O`.
#
# `self.kv_cache` is a plain attribute (not a buffer): `None`, or the pair `(K, V)` of every
# position seen with `use_cache=True`, each `(B, n_kv_heads, S, d_k)`, stored *before*
# `repeat_kv`. Setting it to `None` starts a new sequence. The caller passes the causal mask
# `causal_mask(L, S)` of exercise 3 when decoding with the cache.

# %% tags=["answer"] exercise="multi_head_attention"
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads=None, bias=True):
        super().__init__()
        self.kv_cache = None          # (K, V) of the positions seen with use_cache=True
        ### BEGIN SOLUTION
        self.n_heads = n_heads
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.d_k = d_model // n_heads
        d_kv = self.n_kv_heads * self.d_k
        scale = 1.0 / math.sqrt(d_model)
        self.W_Q = nn.Parameter(torch.randn(d_model, d_model) * scale)
        self.W_K = nn.Parameter(torch.randn(d_model, d_kv) * scale)
        self.W_V = nn.Parameter(torch.randn(d_model, d_kv) * scale)
        self.W_O = nn.Parameter(torch.randn(d_model, d_model) * scale)
        if bias:
            self.b_Q = nn.Parameter(torch.zeros(d_model))
            self.b_K = nn.Parameter(torch.zeros(d_kv))
            self.b_V = nn.Parameter(torch.zeros(d_kv))
            self.b_O = nn.Parameter(torch.zeros(d_model))
        else:
            self.b_Q = self.b_K = self.b_V = self.b_O = None
        ### END SOLUTION

    def apply_positions(self, Q, K, start):
        """Positions enter attention here (set 04); without them Q and K stay as they are."""
        return Q, K

    def forward(self, x, mask=None, use_cache=False):
        ### BEGIN SOLUTION
        def project(W, b):
            return x @ W if b is None else x @ W + b

        Q = split_heads(project(self.W_Q, self.b_Q), self.n_heads)      # (B, n_heads, L, d_k)
        K = split_heads(project(self.W_K, self.b_K), self.n_kv_heads)   # (B, n_kv_heads, L, d_k)
        V = split_heads(project(self.W_V, self.b_V), self.n_kv_heads)
        cached = use_cache and self.kv_cache is not None
        start = self.kv_cache[0].shape[2] if cached else 0
        Q, K = self.apply_positions(Q, K, start)
        if use_cache:
            K, V = append_kv(self.kv_cache, K, V)                       # (B, n_kv_heads, S, d_k)
            self.kv_cache = (K, V)
        n_rep = self.n_heads // self.n_kv_heads
        K, V = repeat_kv(K, n_rep), repeat_kv(V, n_rep)                 # (B, n_heads, S, d_k)
        scores = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)          # (B, n_heads, L, S)
        if mask is not None:
            hidden_row = ~mask.any(dim=-1, keepdim=True)                # queries that see nothing
            scores = scores.masked_fill(~mask, float("-inf")).masked_fill(hidden_row, 0.0)
        weights = torch.softmax(scores, dim=-1)
        if mask is not None:
            weights = weights.masked_fill(hidden_row, 0.0)
        heads = weights @ V                                             # (B, n_heads, L, d_k)
        out = merge_heads(heads) @ self.W_O                             # (B, L, d_model)
        return out if self.b_O is None else out + self.b_O
        ### END SOLUTION

# %% tags=["check"] exercise="multi_head_attention"
from txlearn.checks import check
check("multi_head_attention", MultiHeadAttention)

# %% [markdown]
# ## Exercise 5: the memory of the key/value cache
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
