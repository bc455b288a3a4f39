# %% [markdown]
# # 02 Attention as a soft lookup
#
# Lesson 01 showed why the scores are divided by $\sqrt{d_k}$. This lesson builds the whole
# operation around them,
#
# $$\text{Attention}(Q, K, V) = \text{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V
# \qquad \text{(Vaswani et al. 2017, eq. 1)},$$
#
# starting from a plain dictionary lookup, and then adds the masks that decide who may look at
# whom. Every claim below is measured, and each measurement ends in an `assert`.
#
# The code lives in the package: `txlearn.masks` (causal and padding masks) and
# `txlearn.attention` (`scaled_dot_product_attention`, and `attention_np`, its float64 NumPy
# twin).

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from txlearn.attention import attention_np, scaled_dot_product_attention
from txlearn.masks import (causal_mask, combine_masks, key_padding_to_attn_mask,
                           padding_mask)
from txlearn.plotting import heatmap

torch.manual_seed(0)
rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. A hard lookup, then a soft one
#
# A Python dictionary maps a query to the value of the key that matches it *exactly*. Write the
# keys as one-hot vectors and the lookup becomes "score every key by its dot product with the
# query, take the best one, return its value".

# %%
keys = np.eye(4)                                  # 4 keys, one-hot, d_k = 4
values = np.array([[10.0], [20.0], [30.0], [40.0]])  # one number per key
table = {"cat": 10.0, "dog": 20.0, "eel": 30.0, "owl": 40.0}
query = keys[2]                                   # the query for "eel"

scores = keys @ query                             # (4,)
hard = values[np.argmax(scores)]                  # pick one value
print("dictionary:", table["eel"], "  hard lookup:", hard[0])
assert hard[0] == table["eel"]

# %% [markdown]
# `argmax` has no useful gradient: nudging the query changes nothing until the winner flips, and
# then the output jumps. Replace "take the best" by a softmax over the scores and the output
# becomes a weighted average of the values, a smooth function of the query. The sharper the
# softmax (scores multiplied by a large factor), the closer the soft lookup comes to the hard one.

# %%
def soft_lookup(query, keys, values, sharpness):
    weights = np.exp(sharpness * keys @ query)
    weights /= weights.sum()
    return weights @ values, weights

sharpness_grid = [0.5, 1, 2, 5, 10, 20]
soft_out = [soft_lookup(query, keys, values, s)[0][0] for s in sharpness_grid]
for s, out in zip(sharpness_grid, soft_out):
    print(f"sharpness {s:5.1f}: soft lookup = {out:7.3f}")
assert abs(soft_out[-1] - 30.0) < 1e-6      # very sharp: the hard answer, to 1e-6
assert abs(soft_out[0] - 25.0) < 3.0        # blunt: near the mean of all values (25)

# %% [markdown]
# The soft version is differentiable: the gradient of its output with respect to the query is
# non-zero, so a network can *learn* where to look. The hard version's gradient is zero almost
# everywhere (and does not exist where the winner flips).

# %%
q = torch.tensor(keys[2], requires_grad=True)
out = torch.softmax(torch.tensor(keys) @ q, dim=0) @ torch.tensor(values)
out.sum().backward()
grad = q.grad.numpy()
print("d(soft output)/d(query):", np.round(grad, 3))
assert np.abs(grad).max() > 1.0             # a usable signal, not ~0

# %% [markdown]
# ## 2. Queries, keys and values
#
# In a transformer every position plays all three roles. Its embedding $x$ is projected three
# times: $q = x W_Q$ asks "what am I looking for?", $k = x W_K$ says "what do I contain?", and
# $v = x W_V$ is what is handed over when found. Why two different projections for $q$ and $k$?
# With one shared $W$, the score of $i$ looking at $j$, $x_i W W^\top x_j^\top$, equals the score
# of $j$ looking at $i$: the score matrix is **symmetric**. Relevance is not: "a pronoun looks
# for its noun" does not imply "the noun looks for the pronoun".
#
# A tiny test: five positions, each must attend to the *next* one, and the last to the first (a
# cycle). A symmetric score matrix cannot do this: it would need
# $S_{01} > S_{40} > S_{34} > S_{23} > S_{12} > S_{01}$. We train both versions on the same
# embeddings and measure the weight each gives to the right key.

# %%
T, d, d_k = 5, 8, 8
E = torch.randn(T, d)                       # one embedding per position
target = (torch.arange(T) + 1) % T          # position i should attend to i + 1 (cyclic)

def train_scores(tied, steps=200):
    torch.manual_seed(1)
    W_Q = torch.nn.Parameter(torch.randn(d, d_k) / d ** 0.5)
    W_K = W_Q if tied else torch.nn.Parameter(torch.randn(d, d_k) / d ** 0.5)
    opt = torch.optim.Adam([W_Q] if tied else [W_Q, W_K], lr=0.05)
    for _ in range(steps):
        S = (E @ W_Q) @ (E @ W_K).T / d_k ** 0.5   # (T, T) scores
        loss = F.cross_entropy(S, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return S.detach()

S_sep, S_tied = train_scores(tied=False), train_scores(tied=True)
hit = lambda S: torch.softmax(S, -1)[torch.arange(T), target].mean().item()
print(f"separate W_Q, W_K: weight on the right key = {hit(S_sep):.3f}, "
      f"max |S - S^T| = {(S_sep - S_sep.T).abs().max():.2f}")
print(f"shared W (Q = K):  weight on the right key = {hit(S_tied):.3f}, "
      f"max |S - S^T| = {(S_tied - S_tied.T).abs().max():.2f}")
assert hit(S_sep) > 0.95                    # learns the cycle
assert hit(S_tied) < 0.5                    # cannot: its scores are symmetric
assert torch.allclose(S_tied, S_tied.T, atol=1e-5)

# %% [markdown]
# ## 3. The attention matrix
#
# `scaled_dot_product_attention(Q, K, V, mask, return_weights=True)` returns the weights, one row
# per query, each row a probability distribution over the keys. Drawn as a heatmap, it shows who
# looks at whom. Here: the learned cycle above, and the same weights from our function, the
# float64 NumPy reference, and PyTorch's `F.scaled_dot_product_attention`.

# %%
with torch.no_grad():
    W = torch.softmax(S_sep, -1)
Q = torch.randn(2, 4, 6, 8)                 # (B, n_heads, L, d_k): any leading axes work
K = torch.randn(2, 4, 7, 8)                 # (B, n_heads, S, d_k)
V = torch.randn(2, 4, 7, 5)                 # (B, n_heads, S, d_v)
out, weights = scaled_dot_product_attention(Q, K, V, return_weights=True)
out_np = attention_np(Q.numpy(), K.numpy(), V.numpy())
out_torch = F.scaled_dot_product_attention(Q, K, V)
print("shapes: out", tuple(out.shape), " weights", tuple(weights.shape))
print(f"max |ours - float64 NumPy| = {np.abs(out.numpy() - out_np).max():.1e}, "
      f"max |ours - F.sdpa| = {(out - out_torch).abs().max():.1e}")
assert np.allclose(out.numpy(), out_np, atol=1e-5)
assert torch.allclose(out, out_torch, atol=1e-5)
assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 6), atol=1e-6)  # rows sum to 1

fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
labels = ["a", "b", "c", "d", "e"]
heatmap(axes[0], W, "attention weight", cmap="Blues", vmin=0, vmax=1)
axes[0].set(title="learned: attend to the next", xlabel="key", ylabel="query",
            xticks=range(T), yticks=range(T), xticklabels=labels, yticklabels=labels)
heatmap(axes[1], weights[0, 0], "attention weight", cmap="Blues", vmin=0)
axes[1].set(title="random Q, K: a soft spread", xlabel="key j", ylabel="query i")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 4. Masks
#
# A mask says which keys each query may use. In this course a mask is **boolean and `True`
# means "may attend"**, and hidden keys get weight exactly 0 (their scores are set to $-\infty$
# before the softmax).
#
# - **Causal mask**: a language model predicting token $t+1$ may only look at positions
#   $\le t$. `causal_mask(T)` is the lower triangle *including* the diagonal.
# - With a cache, only the last $L$ of $S$ positions are new queries. `causal_mask(L, S)` is then
#   aligned to the **bottom-right** corner: the last query sees all $S$ keys.
# - **Padding mask**: sequences of different lengths padded to one length $S$;
#   `padding_mask(lengths, S)` is `True` on real tokens.
# - Masks combine with a logical AND (`combine_masks`), never by adding large negative numbers.

# %%
pad = key_padding_to_attn_mask(padding_mask([6, 4], 6))[:, 0]   # (B, 1, S)
both = combine_masks(causal_mask(6), pad)                        # (B, 6, 6)
panels = [("causal_mask(6)", causal_mask(6)), ("causal_mask(2, 6)", causal_mask(2, 6)),
          ("padding_mask([6, 4], 6)", padding_mask([6, 4], 6)),
          ("causal AND padding, seq. 2", both[1])]
fig, axes = plt.subplots(1, 4, figsize=(13, 2.8))
for ax, (title, m) in zip(axes, panels):
    _, bar = heatmap(ax, m, "may attend", cmap=plt.get_cmap("Greys", 2), vmin=0, vmax=1)
    bar.set_ticks([0.25, 0.75], labels=["False", "True"])      # two colours, one per value
    ax.set(title=title, xlabel="key", ylabel="sequence" if title.startswith("padding") else "query")
fig.suptitle("dark = True = may attend", fontsize=9)
plt.tight_layout()
plt.show()
assert causal_mask(6).sum().item() == 21                 # 6 * 7 / 2 allowed pairs
assert both[1, :, 4:].sum().item() == 0                  # padded keys hidden from every query

# %% [markdown]
# **Bottom-right, not top-left.** PyTorch's `F.scaled_dot_product_attention(..., is_causal=True)`
# aligns its triangle to the *top-left* corner. For a square mask the two agree; for the last
# 2 queries of a 5-token sequence they do not, and `is_causal=True` silently hides keys the new
# tokens are entitled to see. `torch.nn.attention.bias.causal_lower_right` gives the
# bottom-right version, and matches ours.

# %%
Qc, Kc, Vc = torch.randn(1, 2, 8), torch.randn(1, 5, 8), torch.randn(1, 5, 4)
ours_c = scaled_dot_product_attention(Qc, Kc, Vc, causal_mask(2, 5))
top_left = F.scaled_dot_product_attention(Qc, Kc, Vc, is_causal=True)
lower_right = F.scaled_dot_product_attention(Qc, Kc, Vc,
                                             attn_mask=causal_lower_right(2, 5)._materialize())
print(f"ours vs causal_lower_right: {(ours_c - lower_right).abs().max():.1e}")
print(f"ours vs is_causal=True:     {(ours_c - top_left).abs().max():.2f}")
assert torch.allclose(ours_c, lower_right, atol=1e-6)
assert (ours_c - top_left).abs().max() > 0.1             # genuinely different outputs
T6 = torch.randn(1, 6, 8)
assert torch.allclose(scaled_dot_product_attention(T6, T6, T6, causal_mask(6)),
                      F.scaled_dot_product_attention(T6, T6, T6, is_causal=True), atol=1e-6)

# %% [markdown]
# **Causality, measured.** Change every token after position $t = 2$: outputs at positions
# $\le 2$ do not move, bit for bit.

# %%
x = torch.randn(1, 6, 8)
y = x.clone()
y[:, 3:] = 10 * torch.randn(1, 3, 8)
a = scaled_dot_product_attention(x, x, x, causal_mask(6))
b = scaled_dot_product_attention(y, y, y, causal_mask(6))
print("positions 0-2 identical:", torch.equal(a[:, :3], b[:, :3]),
      f"  largest change at 3-5: {(a[:, 3:] - b[:, 3:]).abs().max():.2f}")
assert torch.equal(a[:, :3], b[:, :3])

# %% [markdown]
# **Why not add a 0/1 mask, or -1e9?** Adding the keep-mask (1 = keep) to equal scores gives
# weights $[0.42, 0.42, 0.16]$, not $[0.5, 0.5, 0]$: it only shifts scores by 1. Our boolean
# mask gives the exact answer. And a query with *no* visible key (a fully padded row) has no
# distribution to average; the course defines its output as 0 with finite gradients. PyTorch's
# own APIs disagree with each other here (measured with torch 2.13 on CPU: `F.sdpa`'s boolean
# mask gives 0, `nn.MultiheadAttention` gives NaN), so do not rely on them for it.

# %%
s0 = torch.zeros(1, 3)
keep = torch.tensor([[True, True, False]])
added = torch.softmax(s0 + keep.float(), -1)
_, ours_w = scaled_dot_product_attention(torch.zeros(1, 2), torch.zeros(3, 2), torch.eye(3),
                                         keep, return_weights=True)
print("0/1 mask added:", np.round(added.numpy(), 6), "  boolean mask:", ours_w.numpy())
assert torch.allclose(added, torch.tensor([[0.422319, 0.422319, 0.155362]]), atol=1e-6)
assert torch.allclose(ours_w, torch.tensor([[0.5, 0.5, 0.0]]))

Qe = torch.randn(1, 2, 4, requires_grad=True)
Ke, Ve = torch.randn(1, 3, 4), torch.randn(1, 3, 4)
empty = torch.tensor([[True, True, True], [False, False, False]])   # query 1 sees nothing
oe = scaled_dot_product_attention(Qe, Ke, Ve, empty)
oe.sum().backward()
mha = torch.nn.MultiheadAttention(4, 1, batch_first=True)
mha_row = mha(Qe.detach(), Ke, Ve, attn_mask=~empty)[0][0, 1]
sdpa_row = F.scaled_dot_product_attention(Qe.detach(), Ke, Ve, attn_mask=empty)[0, 1]
print("empty row, ours:", oe[0, 1].detach().numpy(), " gradient finite:",
      bool(torch.isfinite(Qe.grad).all()))
print("empty row, F.sdpa:", sdpa_row.numpy(), "  nn.MultiheadAttention:", mha_row.detach().numpy())
assert torch.equal(oe[0, 1], torch.zeros(4)) and torch.isfinite(Qe.grad).all()
if torch.__version__.startswith("2.13"):      # PyTorch's behaviour is version-dependent
    assert torch.isnan(mha_row).all() and torch.equal(sdpa_row, torch.zeros(4))

# %% [markdown]
# ## 5. Permutation equivariance
#
# Nothing in $\text{softmax}(QK^\top/\sqrt{d_k})V$ knows where a token sits. Shuffle the
# positions and the outputs are shuffled the same way, with the same values. Attention alone is
# order-blind; lesson 04 adds positions.

# %%
x = torch.randn(1, 6, 8, dtype=torch.float64)
perm = torch.randperm(6)
out_then_perm = scaled_dot_product_attention(x, x, x)[:, perm]
perm_then_out = scaled_dot_product_attention(x[:, perm], x[:, perm], x[:, perm])
print(f"max |attn(x)[perm] - attn(x[perm])| = {(out_then_perm - perm_then_out).abs().max():.1e}")
assert torch.allclose(out_then_perm, perm_then_out, rtol=0, atol=1e-12)

# %% [markdown]
# ## 6. Mask polarity across PyTorch's APIs
#
# The same word, "mask", means opposite things in different places. The table is *measured*: we
# pass each API a boolean mask that is `True` only on key 2 and record whether key 2 ends up
# the only key used (`True` = attend) or the only key ignored (`True` = hide).

# %%
def polarity(weights_row):
    if weights_row[2] > 0.999:
        return "True = may attend"
    if weights_row[2] < 1e-6 and weights_row.sum() > 0.999:
        return "True = hidden"
    return "?"

q1, k1 = torch.randn(1, 1, 4), torch.randn(1, 4, 4)
only2 = torch.tensor([False, False, True, False])
mha1 = torch.nn.MultiheadAttention(4, 1, batch_first=True)
rows = {
    "txlearn (this course), mask":
        scaled_dot_product_attention(q1, k1, torch.eye(4)[None], only2, return_weights=True)[1],
    "F.scaled_dot_product_attention, bool attn_mask":
        F.scaled_dot_product_attention(q1, k1, torch.eye(4)[None], attn_mask=only2),
    "nn.MultiheadAttention, bool attn_mask":
        mha1(q1, k1, k1, attn_mask=only2[None])[1],
    "nn.MultiheadAttention, key_padding_mask":
        mha1(q1, k1, k1, key_padding_mask=only2[None])[1],
}
table = {api: polarity(w.detach().reshape(-1)) for api, w in rows.items()}
for api, rule in table.items():
    print(f"{api:50s} {rule}")
print(f"{'float attn_mask (SDPA and nn.MultiheadAttention)':50s} added to the scores (0 or -inf)")
assert table["txlearn (this course), mask"] == "True = may attend"
assert table["F.scaled_dot_product_attention, bool attn_mask"] == "True = may attend"
assert table["nn.MultiheadAttention, bool attn_mask"] == "True = hidden"
assert table["nn.MultiheadAttention, key_padding_mask"] == "True = hidden"

# %% [markdown]
# To feed one of our masks to `nn.MultiheadAttention`, pass `~mask`
# (`txlearn.masks.from_torch_key_padding_mask` does that conversion, both ways).
#
# ## Summary
#
# - Attention is a differentiable dictionary: scores, softmax, a weighted average of values.
# - Separate $W_Q$ and $W_K$ let relevance be asymmetric; shared ones force symmetric scores.
# - Masks are boolean, `True` = may attend, combined with AND; causal masks are bottom-right
#   aligned when $L \ne S$ (SDPA's `is_causal=True` is not); an empty row gives 0, not NaN.
# - Without positions, attention is permutation-equivariant.
#
# **Exercises:** [`work/02_attention.ipynb`](../work/02_attention.ipynb) (the causal mask; attention with a mask).
