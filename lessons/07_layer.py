# %% [markdown]
# # 07 · One full transformer layer
#
# Lessons 02–06 built the parts: attention and its masks, multiple heads, positions, the
# position-wise FFN, residual connections and LayerNorm. This lesson puts them together into the
# layer of the paper (Vaswani et al. 2017, section 3.1) and runs it once by hand, on an example
# small enough to print every intermediate:
#
# $$h = \text{LayerNorm}_1\big(x + \text{MultiHead}(x)\big), \qquad
#   \text{out} = \text{LayerNorm}_2\big(h + \text{FFN}(h)\big)$$
#
# This is the **post-LN** order of the paper. Most models since GPT-2 use **pre-LN**,
# `x + Sublayer(LayerNorm(x))`; `txlearn.layer.TransformerLayer` has both (`norm_first=True`
# is pre-LN) and we compare them at the end.

# %%
import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn

from txlearn.complexity import fit_loglog_slope
from txlearn.layer import TransformerLayer, TransformerStack
from txlearn.masks import padding_mask
from txlearn.norms import layer_norm_np
from txlearn.plotting import layer_diagram
from txlearn.softmax import softmax_np

torch.manual_seed(0)
rng = np.random.default_rng(0)

fig, axes = plt.subplots(1, 2, figsize=(16, 6))
layer_diagram(norm_first=False, ax=axes[0])
axes[0].set_title("post-LN (the paper)")
layer_diagram(norm_first=True, ax=axes[1])
axes[1].set_title("pre-LN (norm_first=True)")
plt.show()

# %% [markdown]
# ## A tiny example: T = 3 tokens, d_model = 4
#
# Two heads of width d_k = 2 and an FFN of width d_ff = 8. We build the course's layer, give it
# random weights (seeded), and then recompute its forward pass step by step in float64 NumPy
# from its own parameters. Each step prints its result and checks it. Weights are `(d_in, d_out)`
# and applied as `x @ W + b`.

# %%
T, d_model, n_heads, d_ff = 3, 4, 2, 8
d_k = d_model // n_heads

layer = TransformerLayer(d_model, n_heads, d_ff).double().eval()
with torch.no_grad():
    for name, param in layer.named_parameters():
        if not name.startswith("norm"):  # the norms keep gamma = 1, beta = 0
            param.copy_(torch.randn(param.shape, dtype=torch.float64) * 0.5)
p = {name.split(".")[-1] + name[4] * name.startswith("norm"): v.detach().numpy()
     for name, v in layer.named_parameters()}
print(sorted(p))

x = rng.normal(size=(T, d_model)).round(2)
np.set_printoptions(precision=3, suppress=True)
print("x =\n", x)

# %% [markdown]
# **Step 1: projections.** Every token's vector is mapped to a query, a key and a value:
# `Q = x W_Q + b_Q`, and likewise K and V. Each is `(T, d_model)`.

# %%
Q = x @ p["W_Q"] + p["b_Q"]
K = x @ p["W_K"] + p["b_K"]
V = x @ p["W_V"] + p["b_V"]
print("Q =\n", Q)
# check one entry by hand: row 0 of x dotted with column 1 of W_Q, plus the bias
by_hand = sum(x[0, i] * p["W_Q"][i, 1] for i in range(d_model)) + p["b_Q"][1]
assert abs(Q[0, 1] - by_hand) < 1e-12

# %% [markdown]
# **Step 2: split into heads.** Head `h` takes features `h*d_k ... (h+1)*d_k - 1`:
# `(T, d_model) -> (T, n_heads, d_k) -> (n_heads, T, d_k)`.

# %%
def split(M):
    return M.reshape(T, n_heads, d_k).transpose(1, 0, 2)  # (n_heads, T, d_k)

Qh, Kh, Vh = split(Q), split(K), split(V)
print("head 1's queries =\n", Qh[1])
assert Qh.shape == (n_heads, T, d_k)
assert np.array_equal(Qh[1], Q[:, d_k:2 * d_k])  # head 1 is the second slice of features

# %% [markdown]
# **Step 3: scores.** `scores = Q K^T / sqrt(d_k)` per head: `(n_heads, T, T)`, entry `[h, i, j]`
# says how well query i matches key j in head h.

# %%
scores = Qh @ Kh.transpose(0, 2, 1) / math.sqrt(d_k)  # (n_heads, T, T)
print("scores, head 0 =\n", scores[0])
assert abs(scores[0, 2, 1] - Qh[0, 2] @ Kh[0, 1] / math.sqrt(d_k)) < 1e-12

# %% [markdown]
# **Step 4: softmax over the keys.** Each row becomes a probability distribution over the T keys.

# %%
A = softmax_np(scores, axis=-1)  # (n_heads, T, T)
print("attention weights, head 0 =\n", A[0])
assert np.allclose(A.sum(axis=-1), 1.0, atol=1e-12) and (A > 0).all()

# %% [markdown]
# **Step 5: weighted sum of the values, merge the heads, output projection.**
# Each head's output for token i is `sum_j A[h, i, j] V_h[j]`; the heads are concatenated back
# to `(T, d_model)` and mixed by `W_O`.

# %%
heads = A @ Vh  # (n_heads, T, d_k)
merged = heads.transpose(1, 0, 2).reshape(T, d_model)  # (T, n_heads, d_k) -> (T, d_model)
attn_out = merged @ p["W_O"] + p["b_O"]
print("MultiHead(x) =\n", attn_out)
with torch.no_grad():
    attn_module = layer.attn(torch.tensor(x)[None])[0].numpy()  # the course's module, lesson 03
assert np.allclose(attn_out, attn_module, rtol=0, atol=1e-12)
print(f"equals txlearn's MultiHeadAttention: max |diff| = {np.abs(attn_out - attn_module).max():.1e}")

# %% [markdown]
# **Step 6: residual and LayerNorm.** `h = LayerNorm(x + MultiHead(x))`. With `gamma = 1` and
# `beta = 0` each row of h has mean 0 and (biased) variance 1 - a small eps correction.

# %%
h = layer_norm_np(x + attn_out, p["gamma1"], p["beta1"], eps=1e-5)
print("h =\n", h)
print("row means", h.mean(axis=1), " row variances", h.var(axis=1))
assert np.allclose(h.mean(axis=1), 0.0, atol=1e-12)
assert np.allclose(h.var(axis=1), 1.0, atol=1e-3)  # eps = 1e-5 pulls it just below 1

# %% [markdown]
# **Step 7: the FFN, applied to each token alone.** `FFN(h) = max(0, h W_1 + b_1) W_2 + b_2`.

# %%
hidden = np.maximum(h @ p["W_1"] + p["b_1"], 0.0)  # (T, d_ff)
ffn_out = hidden @ p["W_2"] + p["b_2"]  # (T, d_model)
print(f"ReLU zeroed {np.mean(hidden == 0):.0%} of the {hidden.size} hidden units")
assert 0 < np.mean(hidden == 0) < 1  # some units off, some on: the FFN is not linear here
print("FFN(h) =\n", ffn_out)
with torch.no_grad():
    assert np.allclose(ffn_out, layer.ffn(torch.tensor(h)).numpy(), rtol=0, atol=1e-12)

# %% [markdown]
# **Step 8: residual and LayerNorm again**, and compare with the whole layer in one call.

# %%
out = layer_norm_np(h + ffn_out, p["gamma2"], p["beta2"], eps=1e-5)
with torch.no_grad():
    out_layer = layer(torch.tensor(x)[None])[0].numpy()
print("out =\n", out)
print(f"by hand vs TransformerLayer: max |diff| = {np.abs(out - out_layer).max():.1e}")
assert np.allclose(out, out_layer, rtol=0, atol=1e-12)
assert out.shape == x.shape

# %% [markdown]
# ## Output shape = input shape, so layers stack
#
# The layer maps `(B, T, d_model)` to `(B, T, d_model)`. That is what lets the paper stack
# N = 6 of them: the output of one is a valid input of the next. Here a stack of 6 layers of
# the paper's base width on a batch of 2 sequences of 10 tokens.

# %%
stack = TransformerStack(6, 512, 8, 2048).eval()
x_batch = torch.randn(2, 10, 512)
with torch.no_grad():
    y, weights = stack(x_batch, return_weights=True)
print("input", tuple(x_batch.shape), "-> output", tuple(y.shape),
      f"; {len(weights)} layers, weights of each {tuple(weights[0].shape)}")
assert y.shape == x_batch.shape and len(weights) == 6

# %% [markdown]
# ## Equal to PyTorch's own layer
#
# `torch.nn.TransformerEncoderLayer` implements the same equations. We copy its weights into the
# course's layer (`TransformerLayer.from_torch` transposes PyTorch's `(d_out, d_in)` weights to
# `(d_in, d_out)`) and compare outputs in both orders, with ReLU and GELU, and with a padding
# mask. Mind the mask polarity: PyTorch's `src_key_padding_mask` is True for *padding*, the
# course's `key_padding_mask` True for *real tokens*.

# %%
x32 = torch.randn(3, 7, 64)
real = padding_mask([7, 5, 2], 7)  # (B, S), True = real token
worst = 0.0
for norm_first in (False, True):
    for activation in ("relu", "gelu"):
        ref = nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, activation=activation,
                                         batch_first=True, norm_first=norm_first).eval()
        ours = TransformerLayer.from_torch(ref).eval()
        with torch.no_grad():
            diff = (ours(x32, key_padding_mask=real) - ref(x32, src_key_padding_mask=~real)).abs()
        real_positions = diff[real]  # compare real tokens (PyTorch's fast path may zero padding)
        print(f"norm_first={norm_first!s:5}  {activation}:  max |diff| = {real_positions.max():.1e}")
        worst = max(worst, real_positions.max().item())
assert worst < 1e-5  # float32 rounding

# %% [markdown]
# ## Post-LN vs pre-LN: what the residual stream looks like with depth
#
# In post-LN every layer ends with a LayerNorm, so the vector passed on always has RMS 1 (with
# `gamma = 1`, `beta = 0`). In pre-LN the residual stream `x + Sublayer(LayerNorm(x))` is never
# normalised: each layer *adds* to it, and its size grows with depth (which is why pre-LN
# stacks end with one final LayerNorm). If each layer added a roughly independent contribution
# of similar size, the variance would grow linearly in depth and the RMS like sqrt(depth).
# Measured on a random 24-layer stack:

# %%
def stream_rms(norm_first, n_layers=24, seed=0):
    torch.manual_seed(seed)
    s = TransformerStack(n_layers, 64, 4, 256, norm_first=norm_first).eval()
    h = torch.randn(4, 16, 64)
    rms = [h.pow(2).mean().sqrt().item()]
    with torch.no_grad():
        for lyr in s.layers:
            h = lyr(h)
            rms.append(h.pow(2).mean().sqrt().item())
    return np.array(rms)

post, pre = stream_rms(False), stream_rms(True)
plt.figure(figsize=(6, 3.5))
plt.plot(post, "o-", label="post-LN")
plt.plot(pre, "s-", label="pre-LN")
plt.xlabel("layers applied")
plt.ylabel("RMS of the residual stream")
plt.legend()
plt.show()
depth = np.arange(1, 25)
slope = fit_loglog_slope(depth[3:], pre[4:])  # layers 4..24
print(f"post-LN RMS after 24 layers {post[-1]:.3f}; pre-LN {pre[0]:.2f} -> {pre[-1]:.2f}, "
      f"log-log slope of RMS vs depth {slope:.2f} (sqrt growth would be 0.5)")
assert np.allclose(post[1:], 1.0, atol=1e-3)  # LayerNorm output, eps = 1e-5
assert pre[-1] > 3 * pre[0]  # grows with depth
assert 0.3 < slope < 0.8  # roughly like sqrt(depth)

# %% [markdown]
# ## What we measured
#
# - The layer's forward pass, recomputed by hand, equals `TransformerLayer` to 1e-12 (float64),
#   and `TransformerLayer` equals `torch.nn.TransformerEncoderLayer` in both orders, with ReLU
#   and GELU and a padding mask, to float32 rounding.
# - The layer keeps the shape `(B, T, d_model)`, so layers stack.
# - Post-LN keeps the residual stream at RMS 1; pre-LN lets it grow with depth.
#
# Lesson 08 asks what one layer costs. Exercises: [`work/07_layer.ipynb`](../work/07_layer.ipynb).
