# %% [markdown]
# # 05 · The position-wise feed-forward network
#
# After attention, every transformer layer applies the same small MLP to each token alone
# (Vaswani et al. 2017, eq. 2):
#
# $$\mathrm{FFN}(x) = \max(0,\; x W_1 + b_1)\, W_2 + b_2, \qquad W_1: (d_{model}, d_{ff}),\;
# W_2: (d_{ff}, d_{model}),\; d_{ff} = 4\,d_{model}.$$
#
# Why is it needed, what does it cost, and which activation? We measure each answer.
# The code is `txlearn.ffn`.

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch

from txlearn.attention import scaled_dot_product_attention
from txlearn.complexity import (MODEL_SIZES, ffn_flop_share, ffn_param_share, layer_flops,
                                layer_param_counts)
from txlearn.ffn import FeedForward, gelu, relu, silu

torch.manual_seed(0)
rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. Attention alone only re-averages
#
# Each attention output is $\sum_j a_{ij} v_j$ with weights $a_{ij} \ge 0$ summing to 1: a
# **convex combination** of the value vectors. To see what stacking does, take attention with
# identity value and output maps ($V = x$) and random $W_Q, W_K$, and stack 12 layers in $d = 2$,
# where we can look. The product of row-stochastic matrices is row-stochastic, so the points can
# never leave the convex hull of the inputs, however deep the stack.
#
# We test hull membership with support functions: $p$ is inside the hull of the $x_j$ iff for
# every direction $u$, $u\cdot p \le \max_j u\cdot x_j$. 3,600 directions make the test fine-grained.

# %%
T, d, n_layers = 12, 2, 12
x0 = torch.tensor(rng.normal(size=(T, d)))
angles = np.linspace(0, 2 * np.pi, 3600, endpoint=False)
U = np.stack([np.cos(angles), np.sin(angles)], axis=1)                 # (3600, 2) directions
hull_support = (x0.numpy() @ U.T).max(axis=0)                          # (3600,) max_j u.x_j


def outside_hull(points):
    """How far the points stick out of the inputs' hull (max over directions; <= 0: inside)."""
    return float(((points @ U.T) - hull_support).max())


def attention_stack(x, n_layers):
    """n_layers of attention with random W_Q, W_K and V = the layer's input; all outputs."""
    h, history = x, [x.numpy()]
    for _ in range(n_layers):
        W_Q, W_K = (torch.randn(d, d, dtype=torch.float64) * 2 for _ in range(2))
        h = scaled_dot_product_attention(h @ W_Q, h @ W_K, h)          # (T, d): V = h
        history.append(h.numpy())
    return history


def random_ffn():
    """A ReLU FFN (d -> 32 -> d) with unit-scale random weights (output about as spread as x)."""
    ffn = FeedForward(d, 32, "relu").double()
    with torch.no_grad():
        ffn.W_1.normal_()
        ffn.b_1.normal_()
        ffn.W_2.normal_(0.0, 32 ** -0.5)
    return ffn


history = attention_stack(x0, n_layers)
spread = [float(np.linalg.norm(p - p.mean(0), axis=1).max()) for p in history]
print(f"largest distance from the mean: layer 0 {spread[0]:.2f}, layer {n_layers} {spread[-1]:.1e}")
assert spread[-1] < 0.01 * spread[0]  # the cloud collapses towards one average point

n_trials = 200
attn_excess = np.array([max(outside_hull(p) for p in attention_stack(x0, n_layers)[1:])
                        for _ in range(n_trials)])
with torch.no_grad():
    ffn_excess = np.array([outside_hull(random_ffn()(x0).numpy()) for _ in range(n_trials)])
print(f"{n_trials} random {n_layers}-layer attention stacks: {(attn_excess > 1e-12).sum()} ever leave "
      f"the hull (largest excess {attn_excess.max():.1e})")
print(f"{n_trials} random single FFNs: {(ffn_excess > 1e-12).sum()} put a point outside it "
      f"(median excess {np.median(ffn_excess):.2f})")
assert (attn_excess < 1e-12).all()    # a guarantee: never outside, up to rounding
assert (ffn_excess > 1e-12).mean() > 0.9
with torch.no_grad():
    y = random_ffn()(torch.tensor(history[3])).numpy()                 # for the figure

fig, ax = plt.subplots(figsize=(5, 4.5))
hull_pts = x0.numpy()[np.unique((x0.numpy() @ U.T).argmax(axis=0))]
order = np.argsort(np.arctan2(*(hull_pts - hull_pts.mean(0)).T[::-1]))
ax.fill(*hull_pts[order].T, alpha=0.15, label="hull of the inputs")
ax.scatter(*x0.numpy().T, label="inputs", s=20)
ax.scatter(*history[3].T, label="after 3 attention layers", s=20)
ax.scatter(*history[-1].T, label=f"after {n_layers} attention layers", s=20)
ax.scatter(*y.T, marker="x", label="3 attention layers, then one FFN", s=30)
ax.legend(fontsize=8)
ax.set(title="attention re-averages; the FFN moves points out")
plt.show()

# %% [markdown]
# With learned $W_V$ and $W_O$ the picture only changes by a linear map: attention still mixes
# (linearly mapped) values. The nonlinear, per-token computation is the FFN's job.
#
# ## 2. Position-wise: each token alone
#
# The FFN sees one token at a time, so permuting tokens commutes with it, and changing one token
# changes only that token's output.

# %%
ffn = FeedForward(16, activation="gelu").double()
x = torch.randn(2, 10, 16, dtype=torch.float64)
perm = torch.randperm(10)
gap = (ffn(x[:, perm]) - ffn(x)[:, perm]).abs().max().item()
x_edit = x.clone()
x_edit[:, 4] += 1.0
changed = (ffn(x_edit) - ffn(x)).abs().amax(dim=(0, 2)) > 0            # (T,) which outputs moved
print(f"max |FFN(x_pi) - FFN(x)_pi| = {gap:.1e}; editing token 4 changes outputs {changed.nonzero().flatten().tolist()}")
assert gap < 1e-12
assert changed.nonzero().flatten().tolist() == [4]

# %% [markdown]
# ## 3. ReLU, GELU and SwiGLU
#
# - ReLU (the paper): $\max(0, x)$.
# - GELU (BERT, GPT-2): $x\,\Phi(x) = \tfrac12 x\,(1 + \mathrm{erf}(x/\sqrt2))$, exact in txlearn; GPT-2's
#   code uses a tanh approximation, available only by name (`"gelu_tanh"`).
# - SwiGLU (PaLM, LLaMA): $(\mathrm{SiLU}(x W_3) \odot x W_1)\, W_2$ with $\mathrm{SiLU}(z) = z\,\sigma(z)$,
#   a gated unit with a third matrix; to keep the parameter count, $d_{ff}$ shrinks to about
#   $\tfrac23 \cdot 4\,d_{model}$.

# %%
z = torch.linspace(-4, 4, 801, dtype=torch.float64)
fig, ax = plt.subplots(figsize=(6, 3.5))
for name, f in [("ReLU", relu), ("GELU (exact)", gelu), ("SiLU (SwiGLU's gate)", silu)]:
    ax.plot(z, f(z), label=name)
ax.axhline(0, color="grey", lw=0.5)
ax.legend()
ax.set(xlabel="z", ylabel="act(z)")
plt.show()

tanh_gap = (gelu(z) - gelu(z, "tanh")).abs().max().item()
i_min = gelu(z).argmin()
print(f"GELU minimum {gelu(z)[i_min].item():.4f} at z = {z[i_min].item():.2f}; "
      f"max |exact - tanh form| on [-4, 4] = {tanh_gap:.1e}")
assert abs(gelu(z)[i_min].item() + 0.1700) < 1e-3 and abs(z[i_min].item() + 0.75) < 0.02
assert 1e-4 < tanh_gap < 1e-3   # small, but far above float32 rounding: the two are not the same

# %% [markdown]
# Unlike ReLU, GELU and SiLU are smooth and dip below zero (GELU to about $-0.17$ near
# $z = -0.75$). The tanh form of GELU differs from the exact one by up to $\sim 5\cdot10^{-4}$:
# loading a checkpoint with the wrong one gives small but measurable differences.
#
# ## 4. What the FFN costs at real scale
#
# Per layer and per token, with $d = d_{model}$, MHA, and $m = 2$ matrices (3 for SwiGLU), counting
# FLOPs as $2\times$ multiply-accumulates:
#
# | part | parameters | forward FLOPs per token |
# |---|---|---|
# | Q, K, V, O projections | $4d^2$ | $8d^2$ |
# | $QK^\top$ and weights $\cdot V$ | 0 | $4Td$ (all $T$ keys) |
# | FFN | $m\,d\,d_{ff}$ | $2m\,d\,d_{ff}$ |
#
# so the FFN's share of the FLOPs is
# $$\frac{m\,d_{ff}}{m\,d_{ff} + 2d + 2d_{kv} + 2T}\;\;\Big(= \frac{8d}{12d + 2T}\text{ for } d_{ff}=4d\Big),$$
# which is `ffn_flop_share`. The counting lives in `txlearn.complexity` (lesson 08 derives every row;
# here we only need the FFN's share). Published sizes (`MODEL_SIZES`, each at its context length $T$):

# %%
print(f"{'model':26s} {'d_model':>7s} {'d_ff':>6s} {'T':>5s}  {'params':>6s}  {'FLOPs':>6s}  {'FLOPs causal':>12s}")
shares = {}
for name, s in MODEL_SIZES.items():
    widths = {k: s[k] for k in ("d_model", "n_heads", "n_kv_heads", "d_ff", "activation")}
    shares[name] = ffn_flop_share(T=s["T"], **widths)
    p_share = ffn_param_share(**widths)
    print(f"{name:26s} {s['d_model']:7d} {s['d_ff']:6d} {s['T']:5d}  {p_share:6.1%}  {shares[name]:6.1%}"
          f"  {ffn_flop_share(T=s['T'], causal=True, **widths):12.1%}")

gpt3 = MODEL_SIZES["GPT-3 175B"]
share_gpt3 = shares["GPT-3 175B"]
assert abs(share_gpt3 - 8 * 12288 / (12 * 12288 + 2 * 2048)) < 1e-12   # the closed form
assert abs(share_gpt3 - 0.6486) < 1e-4
assert abs(share_gpt3 - 0.80) > 0.1                                    # far from "about 80%"
assert 0.75 < shares["LLaMA-2 70B"] < 0.80                             # GQA + SwiGLU come close

# %% [markdown]
# **Against the common claim.** It is often said that at GPT-3 scale the FFN takes "about 80%" of
# the compute. Counting every matrix product of a GPT-3 175B layer at its 2,048-token context, we
# get **64.9%** (65.8% if only the unmasked half of the causal $T\times T$ products is counted), and
# the FFN holds 2/3 of the layer's parameters. The ceiling for a $4d$ FFN is $8d/12d = 2/3$ as
# $T \to 0$; 80% would need $d_{ff} \approx 8d$. The claim does not survive the count for GPT-3.
# A number near 80% does appear once grouped-query attention shrinks the K and V projections:
# LLaMA-2 70B (8 KV heads for 64 query heads, SwiGLU with $d_{ff} = 3.5\,d$) gives 76.4% (79.2%
# causal) of the FLOPs and 82% of the parameters.
#
# What we left out must be small for this to hold: softmax, GELU, LayerNorm, biases and residual
# additions are a few operations per element. Counting them generously:

# %%
d, d_ff, T, h = gpt3["d_model"], gpt3["d_ff"], gpt3["T"], gpt3["n_heads"]
matmul_per_token = sum(layer_flops(T=T, d_model=d, n_heads=h, d_ff=d_ff).values()) / T
elementwise_per_token = 5 * h * T + 8 * d_ff + 2 * 8 * d + 4 * d + d_ff + 2 * d  # softmax, GELU, 2 LN, biases, adds
print(f"element-wise work / matrix products at GPT-3 size: {elementwise_per_token / matmul_per_token:.2%}")
assert elementwise_per_token / matmul_per_token < 0.01

# %% [markdown]
# The count itself is checked against PyTorch's own FLOP counter on a real forward pass:

# %%
from torch.utils.flop_counter import FlopCounterMode

small = FeedForward(64, 256, "relu")
with FlopCounterMode(display=False) as counter:
    small(torch.randn(1, 50, 64))
ffn_rows = {k: v for k, v in layer_flops(T=50, d_model=64, n_heads=1, d_ff=256).items()
            if k.startswith("FFN")}
print(f"FlopCounterMode: {counter.get_total_flops():,}   layer_flops' FFN rows: {sum(ffn_rows.values()):,}")
assert counter.get_total_flops() == sum(ffn_rows.values())
ffn_params = {k: v for k, v in layer_param_counts(d_model=64, n_heads=1, d_ff=256).items()
              if k.startswith("FFN")}
assert sum(p.numel() for p in small.parameters()) == sum(ffn_params.values())

# %% [markdown]
# The share depends on the context length: the $T\times T$ products grow with $T$, the FFN does not.

# %%
Ts = np.logspace(1, 6, 60).astype(int)
fig, ax = plt.subplots(figsize=(6, 3.2))
ax.semilogx(Ts, [ffn_flop_share(T=int(t), d_model=d, n_heads=h, d_ff=d_ff) for t in Ts],
            label="GPT-3 175B widths")
ax.axvline(2048, color="grey", ls="--", lw=0.8, label="GPT-3 context, T = 2048")
ax.axhline(0.8, color="red", ls=":", lw=0.8, label='the "80%" claim')
ax.set(xlabel="context length T", ylabel="FFN share of layer FLOPs", ylim=(0, 1))
ax.legend(fontsize=8)
plt.show()
assert abs(ffn_flop_share(T=2 * d, d_model=d, n_heads=h, d_ff=d_ff) - 0.5) < 1e-12
print(f"the FFN falls below half of the FLOPs past T = 2 d_model = {2 * d:,} tokens")

# %% [markdown]
# ## Summary
#
# - Attention outputs stay in the convex hull of the values, at any depth (measured: never more
#   than $10^{-12}$ outside); one FFN moves points out of it.
# - The FFN is position-wise: it commutes with permutations and a token's output depends on it alone.
# - Exact GELU and its tanh form differ by up to about $5\cdot10^{-4}$.
# - At GPT-3 175B size and $T = 2048$ the FFN does **64.9%** of a layer's forward FLOPs, not 80%;
#   its ceiling with $d_{ff} = 4d$ and full attention is 2/3. GQA models such as LLaMA-2 70B come
#   closer (76%).
#
# Exercises: [`work/05_ffn.ipynb`](../work/05_ffn.ipynb) (the FFN forward pass, the exact GELU).
