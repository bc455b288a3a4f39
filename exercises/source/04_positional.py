# ---
# jupyter:
#   txlearn:
#     title: "Exercises 04: positional encodings, and rotary attention from your own module"
#     minutes: 50
#     objectives:
#     - compute the sinusoidal encoding in the paper's layout, as a tensor
#     - rotate queries and keys by their positions (RoPE) on batched tensors of heads
#     - add rotary positions to your own MultiHeadAttention, with positions that continue after the KV cache
#     imports: [numpy, torch, txlearn.course.earlier]
#     uses: [03_heads]
#     retired:
#       sinusoidal_encoding: sinusoidal_table (the same table, as a tensor)
#       rope_rotation: rope (on batched tensors) and rotary_attention (RoPE inside your MultiHeadAttention)
# ---

# %% [markdown]
# This set builds on your `MultiHeadAttention` of set 03, loaded from `03_heads.ipynb` (it must sit
# in the same folder; `make lab` puts both in `work/`). Functions receive float32 or float64
# tensors and keep their dtype; positions are int64 tensors.

# %%
import math

import torch
from torch import nn

from txlearn.course.earlier import load

MultiHeadAttention = load("03_heads", "MultiHeadAttention")

# %% [markdown]
# ## Exercise 1: the sinusoidal table
#
# Write `sinusoidal_encoding(T, d_model)` returning the float32 tensor `PE` of shape
# `(T, d_model)` with
#
# $$PE[pos, 2i] = \sin(pos\,\omega_i), \qquad PE[pos, 2i+1] = \cos(pos\,\omega_i),
# \qquad \omega_i = 10000^{-2i/d_{model}},$$
#
# for $i = 0, \dots, d_{model}/2 - 1$ and positions $0, \dots, T-1$: sin at the **even** feature
# indices, cos at the **odd** ones (the paper's layout, section 3.5). With `d_model = 4`, position
# 1 is `[0.841471, 0.540302, 0.010000, 0.999950]`. Set 07 adds this table to token embeddings.

# %% tags=["answer"] exercise="sinusoidal_table"
def sinusoidal_encoding(T, d_model):
    ### BEGIN SOLUTION
    pos = torch.arange(T, dtype=torch.float64)[:, None]                     # (T, 1)
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    table = torch.zeros(T, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * omega)                                 # even features
    table[:, 1::2] = torch.cos(pos * omega)                                 # odd features
    return table.float()
    ### END SOLUTION

# %% tags=["check"] exercise="sinusoidal_table"
from txlearn.checks import check
check("sinusoidal_table", sinusoidal_encoding)

# %% [markdown]
# ## Exercise 2: rotary position embedding (RoPE)
#
# Write `apply_rope(x, positions)`: `x` is `(..., T, d)` (for example queries
# `(B, n_heads, T, d_k)`), `d` even; `positions` is an int64 tensor `(T,)`, the position of each
# row of the `T` axis. Rotate each channel pair `(a, b) = (x[..., t, 2i], x[..., t, 2i+1])` (the
# *interleaved* pairing of RoFormer, Su et al. 2021) by the angle $m\,\theta_i$, with
# $m$ = `positions[t]` and $\theta_i = 10000^{-2i/d}$:
#
# $$(a, b) \mapsto (a\cos m\theta_i - b\sin m\theta_i,\; a\sin m\theta_i + b\cos m\theta_i).$$
#
# Return a new tensor of the shape and dtype of `x` (do not change `x`).

# %% tags=["answer"] exercise="rope"
def apply_rope(x, positions):
    ### BEGIN SOLUTION
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)    # (d/2,)
    angle = positions.to(torch.float64)[:, None] * theta                    # (T, d/2)
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]                                       # (..., T, d/2)
    rotated = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1)   # (..., T, d/2, 2)
    return rotated.flatten(-2)                                              # (..., T, d)
    ### END SOLUTION

# %% tags=["check"] exercise="rope"
from txlearn.checks import check
check("rope", apply_rope)

# %% [markdown]
# ## Exercise 3: rotary attention
#
# RoPE enters attention by rotating the queries and the keys (never the values) before their
# dot products, so that $q_m \cdot k_n$ depends on the positions only through $m - n$. Your
# `MultiHeadAttention` of set 03 calls `self.apply_positions(Q, K, start)` after splitting the
# heads and before the cache: `Q` is `(B, n_heads, L, d_k)`, `K` is `(B, n_kv_heads, L, d_k)`,
# and `start` is the number of positions already cached, so this call's positions are
# `start, start + 1, ..., start + L - 1`.
#
# Write `RotaryAttention`, a subclass of your `MultiHeadAttention` (same constructor, same
# parameters), whose `apply_positions` returns `Q` and `K` rotated with `apply_rope` by those
# positions. Cached keys keep the rotation of their own positions, which is why the cache stores
# keys after the rotation.

# %% tags=["answer"] exercise="rotary_attention"
class RotaryAttention(MultiHeadAttention):
    def apply_positions(self, Q, K, start):
        ### BEGIN SOLUTION
        positions = torch.arange(start, start + Q.shape[-2])                # (L,)
        return apply_rope(Q, positions), apply_rope(K, positions)
        ### END SOLUTION

# %% tags=["check"] exercise="rotary_attention"
from txlearn.checks import check
check("rotary_attention", RotaryAttention)
