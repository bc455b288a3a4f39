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
# The code is `txlearn.ffn`. Symbols: see [the notation table](00_map.ipynb#Notation).
#
# **You will be able to:** show why attention alone can only re-average its values (and what
# several heads change), and that a position-wise FFN leaves that set; compute ReLU, GELU and
# SwiGLU and map SwiGLU's matrices onto LLaMA's; size $d_{ff}$ with the 2/3 rule; and compute
# the FFN's share of a layer's parameters and FLOPs at real model sizes.
#
# **You need:** lessons 02 and 03 (attention, heads, $W_O$); convex combinations; counting
# multiply-accumulates of a matrix product.
#
# **Time:** about 45 minutes to read and run (the cells take about 10 s on a 2-core CPU), plus
# the exercises.

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch

from txlearn.attention import scaled_dot_product_attention
from txlearn.counting import (MODEL_SIZES, ffn_flop_share, ffn_param_share, layer_flops,
                              layer_param_counts)
from txlearn.ffn import FeedForward, gelu, relu, silu, swiglu_d_ff
from txlearn.heads import MultiHeadAttention
from txlearn.plotting import show

torch.manual_seed(0)
rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. Attention alone only re-averages
#
# Each output of one attention head is $\sum_j a_{ij} v_j$ with weights $a_{ij} \ge 0$ summing to
# 1: a **convex combination** of the value vectors. To see what stacking does, take one head with
# identity value and output maps ($V = x$) and random $W_Q, W_K$, and stack 12 layers with
# $d_{model} = 2$, where we can look. The product of row-stochastic matrices is row-stochastic, so
# the points can never leave the convex hull of the inputs, however deep the stack.
#
# We test hull membership with support functions: $p$ is inside the hull of the $x_j$ iff for
# every direction $u$, $u\cdot p \le \max_j u\cdot x_j$. 3,600 directions make the test fine-grained.

# %%
T, d_model, n_layers = 12, 2, 12
x0 = torch.tensor(rng.normal(size=(T, d_model)))
angles = np.linspace(0, 2 * np.pi, 3600, endpoint=False)
U = np.stack([np.cos(angles), np.sin(angles)], axis=1)                 # (3600, 2) directions
hull_support = (x0.numpy() @ U.T).max(axis=0)                          # (3600,) max_j u.x_j


def outside_hull(points, support=hull_support):
    """How far the points stick out of a convex set given by its support function (<= 0: inside)."""
    return float(((points @ U.T) - support).max())


def attention_stack(x, n_layers):
    """n_layers of one-head attention with random W_Q, W_K and V = the layer's input; all outputs."""
    h, history = x, [x.numpy()]
    for _ in range(n_layers):
        W_Q, W_K = (torch.randn(x.shape[-1], x.shape[-1], dtype=torch.float64) * 2 for _ in range(2))
        h = scaled_dot_product_attention(h @ W_Q, h @ W_K, h)          # (T, d_model): V = h
        history.append(h.numpy())
    return history


def random_ffn(width=2):
    """A ReLU FFN (width -> 32 -> width) with unit-scale random weights (output about as spread as x)."""
    ffn = FeedForward(width, 32, "relu").double()
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
print(f"{n_trials} random {n_layers}-layer one-head attention stacks: {(attn_excess > 1e-12).sum()} "
      f"ever leave the hull (largest excess {attn_excess.max():.1e})")
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
ax.set(title="one head re-averages; the FFN moves points out")
show(fig, alt=f"Scatter plot in the plane of twelve 2-D input points and their shaded convex "
     f"hull. After 3 one-head attention layers the points have moved inward, all inside the "
     f"hull; after {n_layers} layers they have collapsed to nearly one point inside it. The "
     "crosses, the 3-layer points passed through one random FFN, lie partly outside the hull.")

# %% [raw] concept="convex-hull"
# question: A stack of one-head attention layers with no FFN (values = inputs). Can an output point
#   land **outside** the convex hull of the input points?
# kind: choice
# options:
#   a: 'Never: every output is a weighted average with non-negative weights summing to 1'
#   b: Yes, with enough layers
#   c: Yes, when the softmax is very sharp
# answer: a
# section: '1.'
# right: 'Softmax weights are non-negative and sum to 1, so each output is a convex combination; stacking
#   averages of averages stays inside (measured: none of the random stacks left the hull; a single FFN
#   almost always does).'
# wrong:
#   b:
#     misconception: Depth adds expressiveness by itself
#     explain: 'An average of averages is still an average: the measured stacks never left the hull,
#       and the cloud collapsed towards one point.'
#   c:
#     misconception: A sharp softmax extrapolates
#     explain: 'A sharp softmax picks one value: a corner of the hull, never beyond it.'

# %% [markdown]
# ### Learned maps, and several heads
#
# The hull statement is about **one head**. With learned $W_V$ and $W_O$, one head's output is a
# convex combination of the *mapped* values $x_j W_V W_O$, so it stays in *their* hull. With
# several heads it is a sum over heads, each head a convex combination under its own map:
#
# $$\text{out}_i = \sum_{\text{head}} \sum_j a^{\text{head}}_{ij}\; x_j W_V^{\text{head}} W_O^{\text{head}},$$
#
# which lies in the sum of the per-head hulls (their Minkowski sum, whose support function is
# the sum of theirs), and that set is larger than the hull of the values. Expected, before we
# measure: one head with random $W_V, W_O$ never leaves the hull of its mapped values; two heads
# of width 1 with identity maps ($d_{model} = 2$, head 0 reads coordinate 0, head 1 coordinate 1:
# `MultiHeadAttention(2, 2)` with $W_V = W_O = I$) leave the hull of the inputs often, but never
# their bounding box, which is here the sum of the two heads' hulls (a segment on each axis).

# %%
def mha_with_identity_maps(n_heads):
    """The course's MultiHeadAttention on d_model = 2 with W_V = W_O = I and zero biases."""
    mha = MultiHeadAttention(2, n_heads).double()
    with torch.no_grad():
        mha.W_V.copy_(torch.eye(2))
        mha.W_O.copy_(torch.eye(2))
    return mha


def one_head_mapped_excess():
    """One head, random W_Q, W_K, W_V, W_O: how far out of the hull of x W_V W_O."""
    mha = MultiHeadAttention(2, 1).double()
    with torch.no_grad():
        for W in (mha.W_Q, mha.W_K, mha.W_V, mha.W_O):
            W.normal_(0.0, 2.0)
        mapped = (x0 @ mha.W_V @ mha.W_O).numpy()                       # (T, 2)
        return outside_hull(mha(x0[None])[0].numpy(), (mapped @ U.T).max(axis=0))


def two_head_stack(n_layers):
    """n_layers of 2-head attention (width 1 each, identity maps, random W_Q, W_K); all outputs."""
    mha, h, history = mha_with_identity_maps(2), x0[None], []
    with torch.no_grad():
        for _ in range(n_layers):
            mha.W_Q.normal_(0.0, 2.0)
            mha.W_K.normal_(0.0, 2.0)
            h = mha(h)                                                  # (1, T, 2)
            history.append(h[0].numpy())
    return history


lo, hi = x0.numpy().min(axis=0), x0.numpy().max(axis=0)
box_support = np.maximum(U * lo, U * hi).sum(axis=1)   # support of the box = sum of the heads' segments
one_head = np.array([one_head_mapped_excess() for _ in range(n_trials)])
stacks = [two_head_stack(n_layers) for _ in range(n_trials)]
two_heads_hull = np.array([max(outside_hull(p) for p in st) for st in stacks])
two_heads_box = np.array([max(outside_hull(p, box_support) for p in st) for st in stacks])
first_layer = np.concatenate([st[0] for st in stacks])                 # (n_trials * T, 2)
first_out = ((first_layer @ U.T) - hull_support).max(axis=1)          # per output point
with torch.no_grad():
    ffn_box = np.array([outside_hull(random_ffn()(x0).numpy(), box_support) for _ in range(n_trials)])
print(f"one head, random W_V, W_O: {(one_head > 1e-12).sum()} of {n_trials} leave the hull of the "
      f"mapped values (largest excess {one_head.max():.1e})")
print(f"two heads, {n_layers}-layer stacks: {(two_heads_hull > 1e-12).sum()} of {n_trials} leave the hull "
      f"of the inputs (largest excess {two_heads_hull.max():.2f}); {(two_heads_box > 1e-12).sum()} "
      f"leave the sum of the heads' hulls")
print(f"two heads, first layer: {(first_out > 1e-12).sum()} of {first_out.size} output points "
      f"outside the hull")
print(f"random single FFNs: {(ffn_box > 1e-12).sum()} of {n_trials} leave even the box")
assert (one_head < 1e-12).all()                      # one head: inside the hull of its mapped values
assert (two_heads_hull > 1e-12).mean() > 0.5         # two heads: outside the hull, often
assert (two_heads_box < 1e-12).all()                 # ...but never outside the sum of the heads' hulls
assert (ffn_box > 1e-12).mean() > 0.5                # a nonlinearity per token leaves that too

fig, ax = plt.subplots(figsize=(7.5, 4.5))
ax.fill(*hull_pts[order].T, alpha=0.15, label="hull of the inputs")
ax.add_patch(plt.Rectangle(lo, *(hi - lo), fill=False, ls="--", color="grey",
                           label="sum of the two heads' hulls"))
ax.scatter(*x0.numpy().T, s=20, label="inputs")
outside = first_out > 1e-12
ax.scatter(*first_layer[outside][:300].T, s=4, color="red", label="2-head outputs outside the hull")
ax.scatter(*first_layer[~outside][:300].T, s=4, color="green", label="2-head outputs inside it")
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
ax.set(title="two heads leave the hull, not the box")
plt.tight_layout()
show(fig, alt="Scatter plot of the twelve input points, their shaded convex hull and a dashed "
     "rectangle, the sum of the two width-1 heads' hulls. First-layer outputs of two-head "
     "attention: green points inside the hull, red points outside it, and every point, red "
     "or green, inside the dashed rectangle.")

# %% [markdown]
# So the accurate statement is not "attention stays in the hull" but: **attention applies no
# nonlinearity to a token's vector.** Each head mixes linearly mapped values with weights that sum
# to 1; everything nonlinear in it is in the weights (the softmax of the scores), not in what is
# mixed. (This is the attention operation itself. In a full layer the LayerNorm before it, lesson
# 06, is also a function of each token's own vector, and not a linear one: it recentres the
# vector (a linear step) and divides it by its own standard deviation (a nonlinear one, since the
# divisor depends on the vector). It changes a vector's length, not the direction of its
# recentred part; the FFN is where a token's features are bent.) With one head the output stays in the hull of the mapped values, with several in the sum
# of the heads' hulls, and a deep stack of attention alone collapses towards averages (the first
# figure). A function applied to each token's own vector, like ReLU, comes from the FFN: it leaves
# both sets.
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

# %% [raw] concept="position-wise"
# question: Edit token 4 of a sequence and run it through the FFN alone. Which outputs change?
# kind: choice
# options:
#   a: Only output 4
#   b: All outputs
#   c: Outputs 4 and after
# answer: a
# section: '2.'
# right: 'The FFN runs on each position separately (the same weights): only output 4 changes, as the
#   cell measured.'
# wrong:
#   b:
#     misconception: The FFN mixes positions like attention
#     explain: Mixing positions is attention's job; the FFN is position-wise, `FFN(x)[t]` depends on
#       `x[t]` only.
#   c:
#     misconception: The FFN is causal
#     explain: Causality belongs to attention's mask; the FFN never looks at another position, before
#       or after.

# %% [markdown]
# ## 3. ReLU, GELU and SwiGLU
#
# - ReLU (the paper): $\max(0, x)$.
# - GELU (BERT, GPT-2): $x\,\Phi(x) = \tfrac12 x\,(1 + \mathrm{erf}(x/\sqrt2))$, exact in txlearn; GPT-2's
#   code uses a tanh approximation, available only by name (`"gelu_tanh"`).
# - SwiGLU (Shazeer 2020, *GLU Variants Improve Transformer*; used by PaLM and LLaMA):
#   $(\mathrm{SiLU}(x W_3) \odot x W_1)\, W_2$ with $\mathrm{SiLU}(z) = z\,\sigma(z)$, a gated
#   unit with a third matrix; to keep the parameter count, $d_{ff}$ shrinks to about
#   $\tfrac23 \cdot 4\,d_{model}$.

# %%
z = torch.linspace(-4, 4, 801, dtype=torch.float64)
fig, ax = plt.subplots(figsize=(6, 3.5))
for name, f in [("ReLU", relu), ("GELU (exact)", gelu), ("SiLU (SwiGLU's gate)", silu)]:
    ax.plot(z, f(z), label=name)
ax.axhline(0, color="grey", lw=0.5)
ax.legend()
ax.set(xlabel="z", ylabel="act(z)")
show(fig, alt="Line plot of three activations for z from -4 to 4. ReLU is 0 for negative z and "
     "the identity for positive z, with a corner at 0. GELU and SiLU are smooth, follow ReLU "
     "far from 0, and dip slightly below zero for negative z: GELU to its minimum of about "
     "-0.17 near z = -0.75, SiLU lower and wider, to about -0.28 near z = -1.3.")

tanh_gap = (gelu(z) - gelu(z, "tanh")).abs().max().item()
i_min = gelu(z).argmin()
print(f"GELU minimum {gelu(z)[i_min].item():.4f} at z = {z[i_min].item():.2f}; "
      f"max |exact - tanh form| on [-4, 4] = {tanh_gap:.1e}")
assert abs(gelu(z)[i_min].item() + 0.1700) < 1e-3 and abs(z[i_min].item() + 0.75) < 0.02
assert 1e-4 < tanh_gap < 1e-3   # small, but far above float32 rounding: the two are not the same

# %% [raw] concept="gelu-minimum"
# question: What is the smallest value exact GELU takes (to 2 decimals)?
# kind: numeric
# answer: -0.17
# tolerance: 0.005
# section: '3.'
# right: 'About $-0.17$, near $z = -0.75$ (printed): GELU dips below zero, unlike ReLU.'
# wrong:
#   0:
#     misconception: GELU is a smooth ReLU that never goes negative
#     explain: '$x\,\Phi(x)$ is negative for every $x < 0$: the measured minimum is $-0.17$.'
#   -0.28:
#     misconception: SiLU's minimum taken for GELU's
#     explain: $-0.28$ is SiLU's, lower and wider; GELU's is $-0.17$.
#   other:
#     misconception: Not read from the curve
#     explain: The cell printed GELU's minimum on $[-4, 4]$.

# %% [markdown]
# Unlike ReLU, GELU and SiLU are smooth and dip below zero (GELU to about $-0.17$ near
# $z = -0.75$). The tanh form of GELU differs from the exact one by up to $\sim 5\cdot10^{-4}$:
# loading a checkpoint with the wrong one gives small but measurable differences.
#
# ### SwiGLU against an independent implementation
#
# The same function is written with other names elsewhere. The course keeps the paper's $W_1$
# (into $d_{ff}$) and $W_2$ (back to $d_{model}$) and calls the gate $W_3$; Meta's LLaMA code
# numbers the other way round for two of the three, and Hugging Face names them by role:
#
# | role | course (`txlearn.ffn`) | Meta LLaMA | Hugging Face `LlamaMLP` |
# |---|---|---|---|
# | gate, through SiLU | `W_3 (d_model, d_ff)` | `w1` | `gate_proj.weight (d_ff, d_model)` |
# | up projection | `W_1 (d_model, d_ff)` | `w3` | `up_proj.weight (d_ff, d_model)` |
# | down projection | `W_2 (d_ff, d_model)` | `w2` | `down_proj.weight (d_model, d_ff)` |
#
# The course stores weights `(d_in, d_out)` and applies them as `x @ W`; `nn.Linear` stores
# `(d_out, d_in)`, so every copy is a transpose. Expected: with the weights copied by the table,
# txlearn's SwiGLU equals `transformers`' `LlamaMLP` to float64 rounding; with gate and up
# swapped (reading "w1" as the course's $W_1$), it is a different function.

# %%
import warnings  # noqa: E402

with warnings.catch_warnings():  # transformers imports tqdm.auto, which warns without ipywidgets
    warnings.simplefilter("ignore")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

torch.manual_seed(0)
config = LlamaConfig(hidden_size=64, intermediate_size=swiglu_d_ff(64), hidden_act="silu",
                     mlp_bias=False, num_attention_heads=1, num_key_value_heads=1)
llama_mlp = LlamaMLP(config).double()
ours = FeedForward(64, swiglu_d_ff(64), "swiglu", bias=False).double()
x_s = torch.randn(2, 10, 64, dtype=torch.float64)
with torch.no_grad():
    ours.W_3.copy_(llama_mlp.gate_proj.weight.T)          # gate:  Meta w1 -> course W_3
    ours.W_1.copy_(llama_mlp.up_proj.weight.T)            # up:    Meta w3 -> course W_1
    ours.W_2.copy_(llama_mlp.down_proj.weight.T)          # down:  Meta w2 -> course W_2
    gap_swiglu = (ours(x_s) - llama_mlp(x_s)).abs().max().item()
    swapped = FeedForward(64, swiglu_d_ff(64), "swiglu", bias=False).double()
    swapped.load_state_dict(ours.state_dict())
    swapped.W_1.copy_(ours.W_3)                           # the numbering taken literally
    swapped.W_3.copy_(ours.W_1)
    gap_swapped = (swapped(x_s) - llama_mlp(x_s)).abs().max().item()
print(f"max |txlearn SwiGLU - LlamaMLP| = {gap_swiglu:.1e}; with gate and up swapped: {gap_swapped:.2f}")
assert gap_swiglu < 1e-12
assert gap_swapped > 1e-3

# %% [markdown]
# **The 2/3 rule.** SwiGLU has three $d_{model} \times d_{ff}$ matrices instead of two, so to
# keep the parameters of a $4\,d_{model}$ FFN, $d_{ff}$ shrinks to $\tfrac23 \cdot 4\,d_{model}$
# (`swiglu_d_ff`), rounded up to a multiple of 256 in LLaMA. Expected: that gives LLaMA-2 7B's
# published $d_{ff} = 11008$ from $d_{model} = 4096$, with parameters within 1% of the
# $4\,d_{model}$ ReLU FFN's $8\,d_{model}^2$. Not every model keeps the rule: LLaMA-2 70B's code
# multiplies the 2/3 size by 1.3 before rounding up to a multiple of 4096, which should give its
# published $d_{ff} = 28672 = 3.5\,d_{model}$.

# %%
d_ff_7b = swiglu_d_ff(4096, multiple_of=256)
swiglu_params = FeedForward(4096, d_ff_7b, "swiglu", bias=False).W_1.numel() * 3
print(f"d_model 4096: 2/3 * 4 * 4096 = {2 * 4 * 4096 / 3:.1f} -> d_ff {d_ff_7b} "
      f"(LLaMA-2 7B: {MODEL_SIZES['LLaMA-2 7B']['d_ff']}); SwiGLU parameters / 8 d_model^2 = "
      f"{swiglu_params / (8 * 4096 ** 2):.4f}")
assert d_ff_7b == MODEL_SIZES["LLaMA-2 7B"]["d_ff"] == 11008
assert abs(swiglu_params / (8 * 4096 ** 2) - 1) < 0.01
for width in (64, 512, 768, 4096):   # without rounding the rule holds to within 1 / d_model
    assert abs(3 * width * swiglu_d_ff(width) / (8 * width ** 2) - 1) <= 1 / width
d_ff_70b = 4096 * -(-int(1.3 * swiglu_d_ff(8192)) // 4096)   # x 1.3, then round up to 4096
print(f"d_model 8192: 1.3 x {swiglu_d_ff(8192)} rounded up to a multiple of 4096 = {d_ff_70b} "
      f"= {d_ff_70b / 8192} d_model (LLaMA-2 70B: {MODEL_SIZES['LLaMA-2 70B']['d_ff']})")
assert d_ff_70b == MODEL_SIZES["LLaMA-2 70B"]["d_ff"] == 28672

# %% [raw] concept="swiglu-width"
# question: 'LLaMA-2 7B: SwiGLU with $d_{model} = 4096$, $\tfrac23 \cdot 4\,d_{model}$ rounded up to
#   a multiple of 256. What is $d_{ff}$?'
# kind: numeric
# answer: 11008
# tolerance: 0
# section: '3.'
# right: '$\tfrac23 \cdot 4 \cdot 4096 = 10922.7$, rounded up to a multiple of 256: 11008, LLaMA-2 7B''s
#   published width.'
# wrong:
#   16384:
#     misconception: SwiGLU keeps the $4\,d_{model}$ width
#     explain: 'SwiGLU has three matrices, not two: to keep the parameters, $d_{ff}$ shrinks to $\tfrac23
#       \cdot 4\,d_{model}$.'
#   10923:
#     misconception: The rounding to 256 forgotten
#     explain: '$10922.7$ is the 2/3 size; LLaMA rounds it up to a multiple of 256: 11008.'
#   10922:
#     misconception: The rounding to 256 forgotten
#     explain: '$10922.7$ is the 2/3 size; LLaMA rounds it up to a multiple of 256: 11008.'
#   other:
#     misconception: Not from the 2/3 rule
#     explain: $\tfrac23 \cdot 4 \cdot 4096$, then up to a multiple of 256.

# %% [markdown]
# ## 4. What the FFN costs at real scale
#
# Per layer and per token, with multi-head attention and $m = 2$ FFN matrices (3 for SwiGLU),
# counting FLOPs as $2\times$ multiply-accumulates:
#
# | part | parameters | forward FLOPs per token |
# |---|---|---|
# | Q, K, V, O projections | $4d_{model}^2$ | $8d_{model}^2$ |
# | $QK^\top$ and weights $\cdot V$ | 0 | $4T d_{model}$ (all $T$ keys) |
# | FFN | $m\,d_{model} d_{ff}$ | $2m\,d_{model} d_{ff}$ |
#
# so the FFN's share of the FLOPs is ($n_{kv\_heads} d_k = d_{model}$ without grouped-query attention)
# $$\frac{m\,d_{ff}}{m\,d_{ff} + 2d_{model} + 2n_{kv\_heads} d_k + 2T}\;\;\Big(= \frac{8d_{model}}{12d_{model} + 2T}\text{ for } d_{ff}=4d_{model}\Big),$$
# which is `ffn_flop_share`. The counting lives in `txlearn.counting` (lesson 08 derives every row;
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

# %% [raw] concept="ffn-flop-share"
# question: At GPT-3 175B's widths and its 2,048-token context, what share of a layer's forward FLOPs
#   does the FFN take?
# kind: choice
# options:
#   a: About 65%
#   b: About 80%
#   c: About 50%
#   d: About a third
# answer: a
# section: '4.'
# right: '$8d_{model}/(12d_{model} + 2T) = 0.649$: counted row by row and asserted.'
# wrong:
#   b:
#     misconception: The FFN takes about 80% of the compute
#     explain: 'A common claim, measured false for GPT-3: 65%. Only with GQA and SwiGLU (LLaMA-2 70B)
#       does the share come close to 80%.'
#   c:
#     misconception: The FFN and attention split evenly
#     explain: The FFN falls to half only past $T = 2\,d_{model}$ (24,576 tokens at GPT-3's width);
#       at 2,048 it is 65%.
#   d:
#     misconception: Attention dominates a layer
#     explain: 'At GPT-3''s width the projections and the FFN dwarf the $T^2$ terms at $T = 2048$: the
#       FFN alone is two thirds.'

# %% [markdown]
# **Against the common claim.** It is often said that at GPT-3 scale the FFN takes "about 80%" of
# the compute. Counting every matrix product of a GPT-3 175B layer at its 2,048-token context, we
# get **64.9%** (65.8% if only the unmasked half of the causal $T\times T$ products is counted), and
# the FFN holds 2/3 of the layer's parameters. The ceiling for a $4d_{model}$ FFN is
# $8d_{model}/12d_{model} = 2/3$ as $T \to 0$; 80% would need $d_{ff} \approx 8d_{model}$. The claim does not survive the count for GPT-3.
# A number near 80% does appear once grouped-query attention shrinks the K and V projections:
# LLaMA-2 70B (8 KV heads for 64 query heads, SwiGLU with $d_{ff} = 3.5\,d_{model}$) gives 76.4% (79.2%
# causal) of the FLOPs and 82% of the parameters.
#
# What we left out must be small for this to hold: softmax, GELU, LayerNorm, biases and residual
# additions are a few operations per element. Counting them generously:

# %%
d_model, d_ff, T, n_heads = gpt3["d_model"], gpt3["d_ff"], gpt3["T"], gpt3["n_heads"]
matmul_per_token = sum(layer_flops(T=T, d_model=d_model, n_heads=n_heads, d_ff=d_ff).values()) / T
elementwise_per_token = (5 * n_heads * T + 8 * d_ff + 2 * 8 * d_model + 4 * d_model + d_ff
                         + 2 * d_model)                    # softmax, GELU, 2 LN, biases, adds
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
ax.semilogx(Ts, [ffn_flop_share(T=int(t), d_model=d_model, n_heads=n_heads, d_ff=d_ff) for t in Ts],
            label="GPT-3 175B widths")
ax.axvline(2048, color="grey", ls="--", lw=0.8, label="GPT-3 context, T = 2048")
ax.axhline(0.8, color="red", ls=":", lw=0.8, label='the "80%" claim')
ax.set(xlabel="context length T", ylabel="FFN share of layer FLOPs", ylim=(0, 1))
ax.legend(fontsize=8)
show(fig, alt="Line plot of the FFN's share of a GPT-3-size layer's forward FLOPs against the "
     "context length T on a log axis from 10 to a million. The share is flat near 2/3 for short "
     "contexts, is 0.65 at GPT-3's T = 2048 (dashed line), and falls towards 0 for contexts of "
     "hundreds of thousands of tokens; it never reaches the dotted 80% line.")
assert abs(ffn_flop_share(T=2 * d_model, d_model=d_model, n_heads=n_heads, d_ff=d_ff) - 0.5) < 1e-12
print(f"the FFN falls below half of the FLOPs past T = 2 d_model = {2 * d_model:,} tokens")

# %% [markdown]
# ## Summary
#
# - One attention head's outputs stay in the convex hull of its (mapped) values at any depth
#   (measured: never more than $10^{-12}$ outside in 200 stacks of 12 layers). Several heads can
#   leave that hull (two heads of width 1: most 12-layer stacks did), but not the sum of the heads'
#   hulls: attention applies no nonlinearity to a token's vector. One FFN moves points out of both.
# - The FFN is position-wise: it commutes with permutations and a token's output depends on it alone.
# - Exact GELU and its tanh form differ by up to about $5\cdot10^{-4}$.
# - txlearn's SwiGLU equals `transformers`' `LlamaMLP` to float64 rounding once the weights are
#   mapped (course $W_3$ = Meta `w1` = `gate_proj`, $W_1$ = `w3` = `up_proj`, $W_2$ = `w2` =
#   `down_proj`); the 2/3 rule gives LLaMA-2 7B's $d_{ff} = 11008$.
# - At GPT-3 175B size and $T = 2048$ the FFN does **64.9%** of a layer's forward FLOPs, not 80%;
#   its ceiling with $d_{ff} = 4d_{model}$ and full attention is 2/3. GQA models such as LLaMA-2
#   70B come closer (76%).
#
# Exercises: [`work/05_ffn.ipynb`](../work/05_ffn.ipynb) (the FFN forward pass, the exact GELU).
