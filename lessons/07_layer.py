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
# is pre-LN) and we compare them. Then the pieces a model needs around its layers: the token
# embedding table and the output head, the paper's regularisation (dropout and label
# smoothing), and, for the paper's encoder-decoder, the decoder's cross-attention. Symbols: see
# [the notation table](00_map.ipynb#Notation).
#
# **You will be able to:** compute one layer's forward pass by hand, every intermediate; check a
# layer against `nn.TransformerEncoderLayer` and `nn.TransformerDecoderLayer`; say what the
# residual stream does with depth in post-LN and pre-LN; embed tokens, scale them, and tie the
# output head; place the paper's dropout and label smoothing and measure what each does; and
# wire cross-attention into an encoder-decoder.
#
# **You need:** lessons 02 to 06 (attention and masks, heads, positions, the FFN, residuals and
# LayerNorm).
#
# **Time:** about 60 minutes to read and run (the cells take about 15 s on a 2-core CPU), plus
# the exercises.

# %%
import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn

import torch.nn.functional as F

from txlearn.layer import (OutputHead, TokenEmbedding, TransformerDecoderLayer, TransformerLayer,
                           TransformerStack)
from txlearn.masks import causal_mask, padding_mask
from txlearn.measuring import fit_loglog_slope
from txlearn.norms import LayerNorm, layer_norm_np
from txlearn.plotting import heatmap, layer_diagram, show
from txlearn.positional import sinusoidal_encoding
from txlearn.softmax import softmax_np

torch.manual_seed(0)
rng = np.random.default_rng(0)

fig, axes = plt.subplots(1, 2, figsize=(16, 6))
layer_diagram(norm_first=False, ax=axes[0])
axes[0].set_title("post-LN (the paper)")
layer_diagram(norm_first=True, ax=axes[1])
axes[1].set_title("pre-LN (norm_first=True)")
show(fig, alt="Two diagrams of one transformer layer, drawn bottom-up, as in lesson 00. Left, "
     "post-LN (the paper): attention, then LayerNorm, then the feed-forward network, then "
     "LayerNorm, each sub-layer with a red residual arrow around it into a circled plus before "
     "its norm. Right, pre-LN (norm_first=True): each LayerNorm moved before its sub-layer, the "
     "residual arrows going around norm and sub-layer together, and one final LayerNorm "
     "before the output head.")

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
# **Step 2: split into heads.** Head `head` takes features `head*d_k ... (head+1)*d_k - 1`:
# `(T, d_model) -> (T, n_heads, d_k) -> (n_heads, T, d_k)`.

# %%
def split(M):
    return M.reshape(T, n_heads, d_k).transpose(1, 0, 2)  # (n_heads, T, d_k)

Qh, Kh, Vh = split(Q), split(K), split(V)
print("head 1's queries =\n", Qh[1])
assert Qh.shape == (n_heads, T, d_k)
assert np.array_equal(Qh[1], Q[:, d_k:2 * d_k])  # head 1 is the second slice of features

# %% [raw] concept="split-shape"
# question: 'The tiny example: $T = 3$, $d_{model} = 4$, $n_{heads} = 2$. What shape does $Q$ have once
#   split into heads?'
# kind: choice
# options:
#   a: '`(2, 3, 2)`'
#   b: '`(3, 2, 2)`'
#   c: '`(2, 3, 4)`'
#   d: '`(3, 4)`'
# answer: a
# section: A tiny example
# right: '`(T, d_model) -> (T, n_heads, d_k) -> (n_heads, T, d_k)` = `(2, 3, 2)`: head 1 is features
#   2-3 of every token (asserted).'
# wrong:
#   b:
#     misconception: The heads axis left after the tokens
#     explain: 'The reshape gives `(T, n_heads, d_k)`; attention runs per head over the tokens, so the
#       heads move first: `(n_heads, T, d_k)`.'
#   c:
#     misconception: Each head gets all of $d_{model}$
#     explain: 'Heads slice the projected features: each has $d_k = d_{model}/n_{heads} = 2$, not 4.'
#   d:
#     misconception: Splitting changes nothing
#     explain: '`(3, 4)` is $Q$ before the split; the split gives each head its own `(T, d_k)` block.'

# %% [markdown]
# **Step 3: scores.** `scores = Q K^T / sqrt(d_k)` per head: `(n_heads, T, T)`, entry
# `[head, i, j]` says how well query i matches key j in that head.

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
# Each head's output for token i is `sum_j A[head, i, j] Vh[head, j]`; the heads are concatenated back
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
# n_layers = 6 of them (its $N$): the output of one is a valid input of the next. Here a stack of 6 layers of
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
# `(d_in, d_out)`) and compare outputs in float64, in both orders, with ReLU and GELU, with and
# without a padding mask. Expected: equal to float64 rounding (below $10^{-12}$). Mind the mask
# polarity: PyTorch's `src_key_padding_mask` is True for *padding*, the course's
# `key_padding_mask` True for *real tokens*.

# %%
x64 = torch.randn(3, 7, 64, dtype=torch.float64)
real = padding_mask([7, 5, 2], 7)  # (B, S), True = real token
worst = {}
for norm_first in (False, True):
    for activation in ("relu", "gelu"):
        ref = nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, activation=activation,
                                         batch_first=True, norm_first=norm_first).double().eval()
        ours = TransformerLayer.from_torch(ref).eval()
        with torch.no_grad():
            plain_diff = (ours(x64) - ref(x64)).abs().max().item()
            diff = (ours(x64, key_padding_mask=real) - ref(x64, src_key_padding_mask=~real)).abs()
        padded_diff = diff[real].max().item()  # real tokens (a padded query's output is unused)
        worst[norm_first, activation] = (plain_diff, padded_diff)
        print(f"norm_first={norm_first!s:5}  {activation}:  max |diff| {plain_diff:.1e} without "
              f"padding, {padded_diff:.1e} with")
assert max(max(pair) for pair in worst.values()) < 1e-12  # float64 rounding

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
fig = plt.figure(figsize=(6, 3.5))
plt.plot(post, "o-", label="post-LN")
plt.plot(pre, "s-", label="pre-LN")
plt.xlabel("layers applied")
plt.ylabel("RMS of the residual stream")
plt.legend()
show(fig, alt=f"Line plot of the RMS of the residual stream against the number of layers "
     f"applied, 0 to 24, in a random 24-layer stack. Post-LN is flat at 1 throughout. Pre-LN "
     f"grows steadily, from {pre[0]:.2f} to {pre[-1]:.2f}, with a log-log slope of "
     f"{fit_loglog_slope(np.arange(4, 25), pre[4:]):.2f} over layers 4 to 24, close to the "
     "0.5 of growth like the square root of the depth.")
depth = np.arange(1, 25)
slope = fit_loglog_slope(depth[3:], pre[4:])  # layers 4..24
print(f"post-LN RMS after 24 layers {post[-1]:.3f}; pre-LN {pre[0]:.2f} -> {pre[-1]:.2f}, "
      f"log-log slope of RMS vs depth {slope:.2f} (sqrt growth would be 0.5)")
assert np.allclose(post[1:], 1.0, atol=1e-3)  # LayerNorm output, eps = 1e-5
assert pre[-1] > 3 * pre[0]  # grows with depth
assert 0.3 < slope < 0.8  # roughly like sqrt(depth)

# %% [raw] concept="stream-size"
# question: 'A random 24-layer stack: how does the RMS of the residual stream change with depth?'
# kind: choice
# options:
#   a: Post-LN stays at 1; pre-LN grows, roughly like $\sqrt{\text{depth}}$
#   b: 'Both stay at 1: every layer has LayerNorms'
#   c: Both grow with depth
# answer: a
# section: Post-LN vs pre-LN
# right: Post-LN ends every layer with a LayerNorm, so the stream's RMS is 1; pre-LN normalises only
#   each sub-layer's input, and the stream grew more than 3 times, with a log-log slope between 0.3
#   and 0.8.
# wrong:
#   b:
#     misconception: Pre-LN normalises the residual stream
#     explain: 'Pre-LN normalises each sub-layer''s *input*, never the stream it adds to: measured,
#       the stream''s RMS grows with depth (which is why pre-LN stacks end with a final LayerNorm).'
#   c:
#     misconception: Post-LN lets the stream grow too
#     explain: 'Post-LN''s last operation in each layer is a LayerNorm: the stream''s RMS is 1 after
#       every layer (asserted to 1e-3).'

# %% [markdown]
# ## Tokens in, scores out: the embedding table and the output head
#
# A layer takes vectors; a model takes token ids and must return a score for every token of the
# vocabulary. The paper (section 3.4) turns token $x_t$ at position $t$ into
#
# $$x_t \mapsto E_{x_t} \sqrt{d_{model}} + PE(t), \qquad E: (n_{vocab}, d_{model}),$$
#
# and maps the last layer's output $h$ back to scores with the same table, transposed:
# $\text{logits} = h\,E^\top$ (**weight tying**, Press and Wolf 2017). In txlearn these are
# `TokenEmbedding(n_vocab, d_model, positional="sinusoidal", scale=True)` and
# `OutputHead(d_model, n_vocab, tie_to=embedding)`; untied, the head has its own
# $W_U: (d_{model}, n_{vocab})$. Expected, before we measure:
#
# 1. The lookup $E_{x_t}$ is the matrix product of a one-hot row with $E$: the same numbers,
#    without building the one-hot matrix.
# 2. `TokenEmbedding` draws $E$ from $N(0, 1/d_{model})$, so a row has norm about 1, while a
#    sinusoidal row has norm $\sqrt{d_{model}/2}$ (one $\sin^2 + \cos^2 = 1$ per pair of
#    features). Unscaled, the position would outweigh the token by $\sqrt{d_{model}/2} = 8$ at
#    $d_{model} = 128$; times $\sqrt{d_{model}}$, the token's part is $\sqrt2 \approx 1.4$ times
#    the position's.
# 3. Tying saves $n_{vocab} d_{model}$ parameters, and it changes which rows of $E$ learn: every
#    row gets a gradient through the output softmax at every step, where an untied table only
#    updates the rows of the tokens in the batch.

# %%
n_vocab, d_model_e = 1000, 128
torch.manual_seed(0)
embedding = TokenEmbedding(n_vocab, d_model_e, positional="sinusoidal", scale=True).double()
ids = torch.randint(n_vocab, (2, 16))                                  # (B, T) token ids
with torch.no_grad():
    one_hot = F.one_hot(ids, n_vocab).double()                         # (B, T, n_vocab)
    lookup_gap = (embedding.W_E[ids] - one_hot @ embedding.W_E).abs().max().item()
    token_part = embedding.W_E[ids] * d_model_e ** 0.5                  # (B, T, d_model)
    position_part = sinusoidal_encoding(16, d_model_e, dtype=torch.float64)  # (T, d_model)
    gap_embed = (embedding(ids) - (token_part + position_part)).abs().max().item()
row_norm = embedding.W_E.norm(dim=-1).mean().item()
pos_norm = position_part.norm(dim=-1).mean().item()
ratio_scaled = token_part.norm(dim=-1).mean().item() / pos_norm
print(f"lookup vs one-hot @ E: max |diff| = {lookup_gap:.1e}; TokenEmbedding = E[ids] sqrt(d_model) "
      f"+ PE: max |diff| = {gap_embed:.1e}")
print(f"row norms: E {row_norm:.2f}, PE {pos_norm:.2f} (sqrt(d_model/2) = {(d_model_e / 2) ** 0.5:.2f}); "
      f"token / position: unscaled {row_norm / pos_norm:.3f}, scaled {ratio_scaled:.2f}")
assert lookup_gap == 0.0 and gap_embed < 1e-12
assert abs(row_norm - 1) < 0.05 and abs(pos_norm - (d_model_e / 2) ** 0.5) < 1e-9
assert abs(ratio_scaled - 2 ** 0.5) < 0.1

tied_head = OutputHead(d_model_e, n_vocab, tie_to=embedding).double()
untied_head = OutputHead(d_model_e, n_vocab).double()
n_params = {name: sum(p.numel() for p in torch.nn.ModuleList([embedding, head]).parameters())
            for name, head in (("tied", tied_head), ("untied", untied_head))}
rows_updated = {}
for name, head in (("tied", tied_head), ("untied", untied_head)):
    embedding.zero_grad()
    targets = torch.randint(n_vocab, (2, 16))
    F.cross_entropy(head(embedding(ids)).reshape(-1, n_vocab), targets.reshape(-1)).backward()
    rows_updated[name] = int((embedding.W_E.grad.abs().sum(-1) > 0).sum())
print(f"parameters (embedding + head): tied {n_params['tied']:,}, untied {n_params['untied']:,}")
print(f"rows of E with a gradient after one step on {ids.unique().numel()} distinct input tokens: "
      f"tied {rows_updated['tied']}, untied {rows_updated['untied']}")
assert tied_head.W_E is embedding.W_E                                 # one Parameter, shared
assert n_params["untied"] - n_params["tied"] == n_vocab * d_model_e
assert rows_updated["tied"] == n_vocab and rows_updated["untied"] == ids.unique().numel()

with torch.no_grad():   # the whole model: ids (B, T) -> (B, T, d_model) -> layers -> (B, T, n_vocab)
    logits = tied_head(TransformerStack(2, d_model_e, 4, 4 * d_model_e).double()(embedding(ids)))
print(f"ids {tuple(ids.shape)} -> logits {tuple(logits.shape)}")
assert logits.shape == (2, 16, n_vocab)

# %% [raw] concept="tied-rows"
# question: One training step on a batch holding $k$ distinct tokens of a 1000-token vocabulary. How
#   many rows of the embedding table $E$ receive a gradient?
# kind: choice
# options:
#   a: 'Tied head: all 1000; untied: the $k$ rows of the input tokens'
#   b: The $k$ rows either way
#   c: All 1000 either way
# answer: a
# section: Tokens in, scores out
# right: The lookup touches only the rows it reads; a head tied to $E$ scores every token against every
#   row, so all 1000 rows get a gradient through the head (measured).
# wrong:
#   b:
#     misconception: The output head's gradient does not reach the embedding
#     explain: 'With tying the head *is* $E$: its scores use every row, so every row gets a gradient,
#       not only the $k$ looked up.'
#   c:
#     misconception: A lookup updates the whole table
#     explain: 'A lookup''s gradient reaches only the rows it read: untied, exactly the $k$ distinct
#       input tokens'' rows changed.'

# %% [markdown]
# The $\sqrt{d_{model}}$ matters together with the initialisation: a table drawn at the scale an
# output projection wants ($N(0, 1/d_{model})$, so that $h E^\top$ has unit-size logits for a
# unit-size $h$) is too small to compete with the positions until it is scaled up. Models that
# learn their positions (GPT-2, BERT) drop the factor and initialise both tables at a small
# scale: OpenAI's GPT-2 code draws the token table with standard deviation 0.02 and the position
# table with 0.01; lesson 09's model draws both with 0.02 (measured below on a fresh one).

# %%
from txlearn.models.char_lm import CharTransformer

torch.manual_seed(0)
char_model = CharTransformer(n_vocab=100, d_model=128, n_heads=4, n_layers=1, d_ff=512,
                             block_size=256)
std_E, std_P = char_model.E.std().item(), char_model.position.W_pos.std().item()
print(f"lesson 09's CharTransformer: token table std {std_E:.4f}, position table std {std_P:.4f}")
assert abs(std_E - 0.02) < 0.001 and abs(std_P - 0.02) < 0.001   # 12,800 and 32,768 draws

# %% [markdown]
# ## Cross-attention: how the decoder reads the encoder
#
# The paper's model is an encoder-decoder. Each decoder layer has three sub-layers: causal
# self-attention over the tokens generated so far, then **cross-attention**, and the FFN. In
# cross-attention the queries come from the decoder's $L$ positions and the keys and values from
# the encoder's $S$ output positions (the "memory"), so its weights are an $L \times S$ matrix:
# for each output position, where in the input to look. In txlearn it is the same
# `MultiHeadAttention`, called as `attn(x, x_kv=memory)`; `txlearn.layer.TransformerDecoderLayer`
# wires the three sub-layers, in post-LN or pre-LN order. First, as for the encoder layer, equality with
# PyTorch's `nn.TransformerDecoderLayer` in float64 (expected: below $10^{-12}$):

# %%
x_dec = torch.randn(3, 5, 64, dtype=torch.float64)                    # decoder input, L = 5
memory = torch.randn(3, 7, 64, dtype=torch.float64)                   # encoder output, S = 7
for norm_first in (False, True):
    ref = nn.TransformerDecoderLayer(64, 4, 256, dropout=0.0, batch_first=True,
                                     norm_first=norm_first).double().eval()
    ours = TransformerDecoderLayer.from_torch(ref).eval()
    with torch.no_grad():
        expected = ref(x_dec, memory, tgt_mask=~causal_mask(5), memory_key_padding_mask=~real)
        got, w_self, w_cross = ours(x_dec, memory, mask=causal_mask(5),
                                    memory_key_padding_mask=real, return_weights=True)
    gap = (got - expected).abs().max().item()
    print(f"norm_first={norm_first!s:5}: max |ours - nn.TransformerDecoderLayer| = {gap:.1e}; "
          f"self-attention weights {tuple(w_self.shape)}, cross-attention {tuple(w_cross.shape)}")
    assert gap < 1e-12
    assert w_cross.shape == (3, 4, 5, 7)                               # (B, n_heads, L, S)

# %% [markdown]
# **A task that needs cross-attention: reversing a sequence.** The encoder reads $T = 8$ random
# tokens; the decoder must write them in reverse order, one token at a time, seeing the tokens it
# has written so far (teacher forcing in training: its input is a start token followed by the
# target shifted right). Model: a shared `TokenEmbedding` (sinusoidal, scaled), one pre-LN encoder
# layer, one pre-LN `TransformerDecoderLayer` with **one head** so that its map is a single
# matrix, a final LayerNorm on each side and a tied `OutputHead`; Adam at $5\cdot10^{-3}$, 300
# steps of 32 sequences.
#
# Expected, before training: output position $t$ must write source token $T-1-t$, and nothing in
# the decoder's own input says which token that is (the targets so far are random), so the
# decoder can only find it by cross-attention, matching its position to the source's. If it
# learns the task, row $t$ of the cross-attention map should put its weight on column $T-1-t$:
# the **anti-diagonal**. We decode greedily (no teacher forcing: each output token is fed back)
# on 256 held-out sequences and assert that at least 95% are reversed exactly and that the average
# map puts at least 0.8 of each row's weight on the anti-diagonal.

# %%
n_vocab_r, T_r, d_model_r, START = 11, 8, 32, 0                       # tokens 1..10, 0 = start


class Reverser(nn.Module):
    """Encoder-decoder: embedding -> encoder layer -> memory; decoder layer with cross-attention.
    `dropout`: the paper's places (each sub-layer's output, the embedding sum), off in eval()."""

    def __init__(self, dropout=0.0):
        super().__init__()
        self.embed = TokenEmbedding(n_vocab_r, d_model_r, positional="sinusoidal", scale=True,
                                    dropout=dropout)
        self.encoder = TransformerLayer(d_model_r, 1, 4 * d_model_r, norm_first=True,
                                        dropout=dropout)
        self.encoder_norm = LayerNorm(d_model_r)
        self.decoder = TransformerDecoderLayer(d_model_r, 1, 4 * d_model_r, norm_first=True,
                                               dropout=dropout)
        self.decoder_norm = LayerNorm(d_model_r)
        self.head = OutputHead(d_model_r, n_vocab_r, tie_to=self.embed)

    def forward(self, src, tgt_in):                  # (B, S), (B, L) -> logits (B, L, n_vocab), weights
        memory = self.encoder_norm(self.encoder(self.embed(src)))          # (B, S, d_model)
        h, _, w_cross = self.decoder(self.embed(tgt_in), memory, mask=causal_mask(tgt_in.shape[1]),
                                     return_weights=True)                  # w_cross (B, 1, L, S)
        return self.head(self.decoder_norm(h)), w_cross


def reverse_batch(B, generator):
    src = torch.randint(1, n_vocab_r, (B, T_r), generator=generator)
    tgt = src.flip(1)
    tgt_in = torch.cat([torch.full((B, 1), START), tgt[:, :-1]], dim=1)  # shifted right
    return src, tgt_in, tgt


def train_reverser(dropout=0.0, label_smoothing=0.0, steps=300):
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(1)
    model = Reverser(dropout)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    losses = []
    for step in range(steps):
        src, tgt_in, tgt = reverse_batch(32, data)
        loss = F.cross_entropy(model(src, tgt_in)[0].reshape(-1, n_vocab_r), tgt.reshape(-1),
                               label_smoothing=label_smoothing)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model.eval(), losses


def decode_greedy(model, src):
    """Write T_r tokens, each fed back in: (B, S) -> (B, 1 + T_r) with the start token, and the
    last step's cross-attention weights (B, 1, T_r, S)."""
    out = torch.full((len(src), 1), START)
    with torch.no_grad():
        for t in range(T_r):
            logits, w_cross = model(src, out)
            out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return out, w_cross


reverser, losses = train_reverser()
src, _, tgt = reverse_batch(256, torch.Generator().manual_seed(2))   # held out
out, w_cross = decode_greedy(reverser, src)
exact = (out[:, 1:] == tgt).all(dim=1).float().mean().item()
cross_map = w_cross[:, 0].mean(0)                                     # (L, S), averaged over 256
on_anti = cross_map.flip(1).diagonal()                                # weight of row t on T-1-t
print(f"loss {np.mean(losses[:10]):.2f} -> {np.mean(losses[-10:]):.3f} (chance ln 10 = {math.log(10):.2f})")
print(f"greedy decoding reverses {exact:.1%} of 256 held-out sequences exactly")
print(f"cross-attention weight on the anti-diagonal, per output position: {np.round(on_anti.numpy(), 2)}")
assert exact > 0.95
assert on_anti.min() > 0.8

fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
heatmap(axes[0], cross_map, "cross-attention weight", cmap="viridis", vmin=0, vmax=1)
axes[0].set(title="cross-attention, mean over 256 sequences", xlabel="source position (key)",
            ylabel="output position (query)")
example = w_cross[0, 0]
heatmap(axes[1], example, "cross-attention weight", cmap="viridis", vmin=0, vmax=1)
axes[1].set_xticks(range(T_r), [str(v) for v in src[0].tolist()])
axes[1].set_yticks(range(T_r), [str(v) for v in out[0, 1:].tolist()])
axes[1].set(title="one sequence", xlabel="source token", ylabel="written token")
plt.tight_layout()
show(fig, alt=f"Two heatmaps of the decoder's cross-attention weights, output position on the "
     f"rows, source position on the columns, colour from 0 to 1. Left, the mean over 256 "
     f"held-out sequences: a bright anti-diagonal from top right to bottom left (at least "
     f"{on_anti.min():.2f} of each row) and dark elsewhere. Right, one sequence, labelled with "
     "its source tokens and the tokens written: the same anti-diagonal, each written token "
     "looking at the source token it copies.")

# %% [markdown]
# The map is the anti-diagonal: to write output $t$, the decoder looks at source position
# $T-1-t$. Nothing told it so; it is the only place the answer is, and gradient descent found it
# through a $W_Q$, $W_K$ pair that matches a decoder position to the mirrored source position
# (with sinusoidal encodings that is a linear map: $\sin(\omega(T-1-t))$ and
# $\cos(\omega(T-1-t))$ are fixed combinations of $\sin \omega t$ and $\cos \omega t$). In
# translation, cross-attention maps often look like a soft word alignment between the two
# sentences (Bahdanau et al. 2015 drew them so), but they are not one in general: reading
# alignments off a transformer's heads takes care, and Garg et al. 2019 train a head for it.

# %% [markdown]
# ## The backward pass of the whole layer, assembled from its pieces
#
# Lessons 02 and 06 derived the backward passes of attention and of LayerNorm; the rest of the
# layer is linear maps, a ReLU and two sums, whose backward passes are one line each. Run in
# reverse, the post-LN layer's gradient is (each line the chain rule through one forward line,
# `(B, T, ...)` shapes, sums over the tokens wherever a weight is shared by all of them):
#
# | forward | backward |
# |---|---|
# | $\text{out} = \mathrm{LN}_2(o)$, $\;o = h + f$ | $do, d\gamma_2, d\beta_2$ = LayerNorm's backward; $dh \mathrel{+}= do$, $df = do$ |
# | $f = r W_2 + b_2$, $\;r = \max(0, u)$, $\;u = h W_1 + b_1$ | $dW_2 = r^\top df$, $db_2 = \sum df$, $du = (df\,W_2^\top) \odot [u > 0]$, $dW_1 = h^\top du$, $dh \mathrel{+}= du\,W_1^\top$ |
# | $h = \mathrm{LN}_1(a_{in})$, $\;a_{in} = x + m W_O + b_O$ | $da_{in}, d\gamma_1, d\beta_1$ = LayerNorm's backward; $dx \mathrel{+}= da_{in}$; $dW_O = m^\top da_{in}$, $dm = da_{in} W_O^\top$ |
# | $m$ = the heads' outputs merged | $dO_{heads}$ = $dm$ split into heads, then attention's backward: $dQ, dK, dV$ |
# | $Q = x W_Q + b_Q$ (and $K$, $V$) | $dW_Q = x^\top dQ$, $db_Q = \sum dQ$, $dx \mathrel{+}= dQ\,W_Q^\top + dK\,W_K^\top + dV\,W_V^\top$ |
#
# $x$ reaches the output by two routes (the residual and the projections), and $h$ by two (the
# residual and the FFN): their gradients add. Below, in float64 NumPy with
# `attention_backward_np` and `layer_norm_backward_np`, on a layer copied from
# `nn.TransformerEncoderLayer` (post-LN, ReLU, 2 heads, a causal mask); the oracle is autograd on
# PyTorch's own layer with the same weights, for the gradients of the input and of all 16
# parameter tensors. Expected: equal to float64 rounding.

# %%
from txlearn.attention import attention_backward_np, attention_np     # noqa: E402
from txlearn.norms import layer_norm_backward_np                      # noqa: E402

B_b, T_b, d_b, h_b, ff_b = 2, 6, 8, 2, 16
dk_b = d_b // h_b
torch.manual_seed(7)
ref_b = nn.TransformerEncoderLayer(d_b, h_b, ff_b, dropout=0.0, batch_first=True).double().eval()
with torch.no_grad():
    for norm in (ref_b.norm1, ref_b.norm2):                             # gamma, beta away from 1, 0
        norm.weight.normal_(1.0, 0.3), norm.bias.normal_(0.0, 0.3)
w = {k.split(".")[-1] + k[4] * k.startswith("norm"): v.detach().numpy()
     for k, v in TransformerLayer.from_torch(ref_b).named_parameters()}   # (d_in, d_out) weights
x_b = torch.randn(B_b, T_b, d_b, dtype=torch.float64, requires_grad=True)
G_b = torch.randn(B_b, T_b, d_b, dtype=torch.float64)                  # loss = sum(out * G)
mask_b = causal_mask(T_b).numpy()


def heads_of(M):                                                      # (B, T, d) -> (B, h, T, d_k)
    return M.reshape(B_b, T_b, h_b, dk_b).transpose(0, 2, 1, 3)


def merged(M):                                                        # (B, h, T, d_k) -> (B, T, d)
    return M.transpose(0, 2, 1, 3).reshape(B_b, T_b, d_b)


def ln(v, g, b):
    return layer_norm_np(v, g, b, eps=1e-5)


# forward, keeping what the backward pass uses
xb = x_b.detach().numpy()
Qb, Kb, Vb = (heads_of(xb @ w[f"W_{n}"] + w[f"b_{n}"]) for n in "QKV")  # (B, h, T, d_k)
m_b = merged(attention_np(Qb, Kb, Vb, mask_b))                        # (B, T, d)
a_in = xb + m_b @ w["W_O"] + w["b_O"]
h_b_ = ln(a_in, w["gamma1"], w["beta1"])
u_b = h_b_ @ w["W_1"] + w["b_1"]                                      # (B, T, d_ff)
r_b = np.maximum(u_b, 0.0)
o_b = h_b_ + r_b @ w["W_2"] + w["b_2"]
out_b = ln(o_b, w["gamma2"], w["beta2"])

# backward, line by line from the table
grads = {}
do, grads["gamma2"], grads["beta2"] = layer_norm_backward_np(o_b, w["gamma2"], G_b.numpy())
df = do
grads["W_2"], grads["b_2"] = np.einsum("btf,btd->fd", r_b, df), df.sum((0, 1))
du = (df @ w["W_2"].T) * (u_b > 0)
grads["W_1"], grads["b_1"] = np.einsum("btd,btf->df", h_b_, du), du.sum((0, 1))
dh = do + du @ w["W_1"].T                                             # two routes into h
da, grads["gamma1"], grads["beta1"] = layer_norm_backward_np(a_in, w["gamma1"], dh)
grads["W_O"], grads["b_O"] = np.einsum("bti,btj->ij", m_b, da), da.sum((0, 1))
dQh, dKh, dVh = attention_backward_np(Qb, Kb, Vb, heads_of(da @ w["W_O"].T), mask_b)
dx = da.copy()                                                        # the residual route
for n, dP in zip("QKV", (dQh, dKh, dVh)):
    dP = merged(dP)                                                   # (B, T, d)
    grads[f"W_{n}"], grads[f"b_{n}"] = np.einsum("bti,btj->ij", xb, dP), dP.sum((0, 1))
    dx += dP @ w[f"W_{n}"].T

# the oracle: autograd on PyTorch's layer, its gradients converted to (d_in, d_out)
out_t = ref_b(x_b, src_mask=~causal_mask(T_b))                        # PyTorch: True = hidden
(out_t * G_b).sum().backward()
sa, d = ref_b.self_attn, d_b
oracle = {"W_Q": sa.in_proj_weight.grad[:d].T, "W_K": sa.in_proj_weight.grad[d:2 * d].T,
          "W_V": sa.in_proj_weight.grad[2 * d:].T, "b_Q": sa.in_proj_bias.grad[:d],
          "b_K": sa.in_proj_bias.grad[d:2 * d], "b_V": sa.in_proj_bias.grad[2 * d:],
          "W_O": sa.out_proj.weight.grad.T, "b_O": sa.out_proj.bias.grad,
          "W_1": ref_b.linear1.weight.grad.T, "b_1": ref_b.linear1.bias.grad,
          "W_2": ref_b.linear2.weight.grad.T, "b_2": ref_b.linear2.bias.grad,
          "gamma1": ref_b.norm1.weight.grad, "beta1": ref_b.norm1.bias.grad,
          "gamma2": ref_b.norm2.weight.grad, "beta2": ref_b.norm2.bias.grad}
gaps_layer = {k: np.abs(grads[k] - v.numpy()).max() for k, v in oracle.items()}
gap_out = np.abs(out_b - out_t.detach().numpy()).max()
gap_dx = np.abs(dx - x_b.grad.numpy()).max()
print(f"forward by hand vs nn.TransformerEncoderLayer: {gap_out:.1e}; dx: {gap_dx:.1e}")
print("parameters, max |by hand - autograd|: "
      + ", ".join(f"{k} {v:.0e}" for k, v in gaps_layer.items()))
assert len(gaps_layer) == 16                                          # in_proj split in six
assert gap_out < 1e-12 and gap_dx < 1e-12 and max(gaps_layer.values()) < 1e-12

# %% [markdown]
# ### What a layer keeps for its backward pass
#
# Reading the table's right column, the backward pass needs, per layer: $x$ (for $dW_Q$, $dW_K$,
# $dW_V$), $Q$, $K$, $V$ and $P$ (attention's backward), $m$ (for $dW_O$), $\hat x$ and $r$ of
# each LayerNorm (one number per token for $r$), $h$ (for $dW_1$) and $r = \max(0, u)$ (for
# $dW_2$, and its sign for the ReLU). Counted per token: $d_{model}$ for $x$, $3 d_{model}$ for
# $Q, K, V$, $d_{model}$ for $m$, $2 d_{model} + 2$ for the two LayerNorms, $d_{model}$ for $h$
# and $d_{ff}$ for the ReLU's output; per sequence
#
# $$T\,(8\,d_{model} + d_{ff} + 2) + n_{heads} T^2 \text{ numbers.}$$
#
# Autograd decides for itself what to keep, and `saved_tensors_hooks` (lesson 02, section 9)
# shows what: we count the distinct tensors it saves during the forward pass of
# `TransformerLayer`, the parameters left out (they exist anyway), at three lengths, and split
# the total into a part linear in T and a part in $T^2$ (three lengths fix two coefficients and
# test the split). Both of the course's paths: the teaching path and `fused=True`, whose
# attention is PyTorch's `F.scaled_dot_product_attention`.

# %%
from txlearn.counting import activation_bytes                       # noqa: E402


def saved_activation_bytes(module, x):
    """Bytes of the distinct non-parameter tensors autograd saves during module(x)."""
    parameters = {q.untyped_storage().data_ptr() for q in module.parameters()}
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        module(x)
    return sum(storages.values())


B_s, d_s, h_s, ff_s, Ts_s = 2, 32, 4, 128, (16, 32, 64)
fits = {}
for fused in (False, True):
    torch.manual_seed(0)
    lyr = TransformerLayer(d_s, h_s, ff_s, fused=fused)
    saved = np.array([saved_activation_bytes(lyr, torch.randn(B_s, T_s, d_s, requires_grad=True))
                      for T_s in Ts_s], dtype=float)
    A = np.array([[T_s, T_s ** 2] for T_s in Ts_s], dtype=float)
    (per_T, per_T2), residual_fit, *_ = np.linalg.lstsq(A, saved, rcond=None)
    fits[fused] = (per_T / (4 * B_s), per_T2 / (4 * B_s), np.abs(A @ [per_T, per_T2] - saved).max())
minimal = (8 * d_s + ff_s + 2, h_s)
rough = activation_bytes(B=1, T=1, d_model=d_s, n_heads=h_s, d_ff=ff_s, bytes_per_value=1)
rough_T2 = rough["scores"] + rough["softmax weights"]
rough_T = sum(rough.values()) - rough_T2
print(f"numbers kept per sequence: c_1 T + c_2 T^2 (d_model = {d_s}, n_heads = {h_s}, d_ff = {ff_s})")
print(f"  the backward pass by hand needs: c_1 = {minimal[0]}, c_2 = {minimal[1]}")
for fused, (c1, c2, err) in fits.items():
    print(f"  autograd, {'fused=True   ' if fused else 'teaching path'}: c_1 = {c1:.1f}, c_2 = {c2:.2f} "
          f"(fit off by {err:.0f} bytes)")
print(f"  lesson 08's activation_bytes:  c_1 = {rough_T}, c_2 = {rough_T2}")
assert fits[False][2] < 1 and fits[True][2] < 1           # exactly c_1 T + c_2 T^2 at all three T
assert abs(fits[False][1] - h_s) < 1e-9                   # teaching path: P, once per head
assert abs(fits[True][1]) < 1e-9                          # fused: no T^2 term at all
assert fits[False][0] > fits[True][0] >= minimal[0]       # fused: at or just above the minimum,
assert fits[True][0] - minimal[0] < d_s                   # by less than one d_model vector per token
assert rough_T2 == 2 * h_s                                # lesson 08 counts scores and weights

# %% [raw] concept="saved-for-backward"
# question: 'Autograd on the teaching path: how many numbers per head and per (query, key) pair does
#   one layer keep for its backward pass, its $c_2$ in $c_1 T + c_2 T^2$ per head?'
# kind: numeric
# answer: 1
# tolerance: 0
# section: The backward pass of the whole layer
# right: 'The attention weights $P$, once per head: $c_2 = n_{heads}$ in all, measured exactly. `fused=True`
#   keeps no $T^2$ term at all.'
# wrong:
#   2:
#     misconception: The backward pass needs the scores as well as the weights
#     explain: 'Softmax''s backward needs only its output $P$ ($s \odot (g - \langle s, g\rangle)$,
#       lesson 01): the scores are not kept. Lesson 08''s rough count of 2 counts both.'
#   0:
#     misconception: Attention keeps no $T \times T$ tensor
#     explain: That is `fused=True`; the teaching path keeps $P$ for each head (measured $c_2 = n_{heads}$).
#   other:
#     misconception: Not read from the fit
#     explain: The printed fit gives $c_2$ for the whole layer; divide by $n_{heads}$.

# %% [markdown]
# The $T^2$ term is where the three differ. The teaching path keeps exactly one $T \times T$
# matrix per head, $P$, as the hand-written backward needs; lesson 08's `activation_bytes`
# counts two (the scores and the weights), which is what the forward *creates*, but the softmax's
# backward needs only its output, so the scores are freed (measured: $c_2 = n_{heads}$, not
# $2 n_{heads}$). The fused path keeps **no** $T \times T$ matrix: PyTorch's CPU kernel saves one
# log-sum-exp per query row and recomputes $P$ in its backward pass, the FlashAttention trade
# that lesson 08 builds. The linear terms depend on which intermediate results each
# implementation keeps rather than recomputes: the teaching LayerNorm keeps $x - \mu$ and $\hat x$
# before and after $\gamma$ (642 numbers per token, about 1.7 times the count above),
# `F.layer_norm` keeps its input, the mean and $r$ and recomputes $\hat x$: the fused path lands
# just above the minimum (392 numbers per token against 386 here, as printed), not below it,
# six numbers per token more than the hand count.
#
# ## The paper's regularisation: dropout and label smoothing
#
# The paper trains with two regularisers (section 5.4), both at 0.1 in the base model:
#
# - **Residual dropout**: dropout "to the output of each sub-layer, before it is added to the
#   sub-layer input and normalized", and "to the sums of the embeddings and the positional
#   encodings". During training, each number is zeroed with probability $p$ and the survivors
#   are divided by $1 - p$, so every value keeps its expectation; in `eval()` dropout is off. In
#   txlearn, `TransformerLayer(dropout=p)` and `TransformerDecoderLayer(dropout=p)` put it on each
#   sub-layer's output and `TokenEmbedding(dropout=p)` on the sum. (PyTorch's
#   `nn.TransformerEncoderLayer` also drops out the attention weights and the FFN's hidden
#   units; the equality above holds with `dropout=0.0`.)
# - **Label smoothing** (Szegedy et al. 2016): the target distribution puts $1 - \epsilon$ on
#   the right token and spreads $\epsilon$ evenly over all $n_{vocab}$ tokens,
#   $q_k = (1 - \epsilon)\,[k = y] + \epsilon / n_{vocab}$, and the loss is the cross-entropy
#   $-\sum_k q_k \log p_k = (1 - \epsilon)\,(-\log p_y) + \epsilon \cdot \tfrac{1}{n_{vocab}}
#   \sum_k (-\log p_k)$ (PyTorch's `label_smoothing=`). Its minimum is at $p = q$: a model that
#   fits it puts $1 - \epsilon + \epsilon / n_{vocab}$ on the right token, never 1, which the
#   paper says "hurts perplexity, as the model learns to be more unsure, but improves accuracy
#   and BLEU score".
#
# Measured: where the course's modules drop numbers out (a hook on every `nn.Dropout`), the
# smoothed loss against its formula, and then the reverser above trained with both regularisers
# at 0.1. Expected there: on held-out sequences the model should put about
# $0.9 + 0.1/11 = 0.909$ on each right token (11 classes: 10 tokens and the start token), where
# the unregularised one puts nearly 1, so its unsmoothed held-out loss is higher, and it should
# still reverse the sequences.

# %%
p_drop = 0.1
torch.manual_seed(0)
embed_d = TokenEmbedding(n_vocab_r, 64, positional="sinusoidal", scale=True, dropout=p_drop)
layer_d = TransformerLayer(64, 4, 256, dropout=p_drop)
dropped = {}


def record(name):
    def hook(module, inputs, output):
        kept = output != 0
        dropped[name] = (1 - kept.float().mean().item(),
                         (output[kept] / inputs[0][kept] - 1 / (1 - p_drop)).abs().max().item())
    return hook


hooks = []
for name, module in [("embedding sum", embed_d), *layer_d.named_modules()]:
    target = module.dropout if name == "embedding sum" else module
    if isinstance(target, nn.Dropout):
        hooks.append(target.register_forward_hook(record(name)))
ids_d = torch.randint(1, n_vocab_r, (16, 32))
train_out = layer_d(embed_d(ids_d))                                 # train mode: dropout on
for hook in hooks:
    hook.remove()
for name, (share, scale_gap) in dropped.items():
    print(f"dropout on {name:13s}: {share:.3f} of the numbers zeroed; survivors x 1/(1 - p) "
          f"to {scale_gap:.0e}")
layer_d.eval(), embed_d.eval()
with torch.no_grad():
    off = layer_d(embed_d(ids_d))
    plain = TransformerLayer(64, 4, 256)
    plain.load_state_dict(layer_d.state_dict())
    same_eval = torch.equal(off, plain.eval()(embed_d(ids_d)))
print(f"eval(): dropout off, equal to the same layer built without it: {same_eval}")
assert sorted(dropped) == ["dropout1", "dropout2", "embedding sum"]  # attention out, FFN out, sum
assert all(abs(share - p_drop) < 0.02 and gap < 1e-5 for share, gap in dropped.values())
assert same_eval

logits_s = torch.randn(50, n_vocab_r, dtype=torch.float64)
y_s = torch.randint(n_vocab_r, (50,))
log_p = torch.log_softmax(logits_s, -1)
by_formula = ((1 - p_drop) * -log_p[torch.arange(50), y_s] + p_drop * -log_p.mean(-1)).mean()
smooth_gap = (F.cross_entropy(logits_s, y_s, label_smoothing=p_drop) - by_formula).abs().item()
print(f"label smoothing 0.1: max |PyTorch - formula| = {smooth_gap:.1e}")
assert smooth_gap < 1e-12

# %%
regularised, losses_reg = train_reverser(dropout=0.1, label_smoothing=0.1)
out_reg, _ = decode_greedy(regularised, src)
exact_reg = (out_reg[:, 1:] == tgt).all(dim=1).float().mean().item()
tgt_in_held = torch.cat([torch.full((256, 1), START), tgt[:, :-1]], dim=1)


def held_out(model):
    """Mean probability on the right token and unsmoothed loss, teacher forcing, held out."""
    with torch.no_grad():
        log_p = torch.log_softmax(model(src, tgt_in_held)[0], -1)    # (256, T_r, n_vocab)
    right = log_p.gather(-1, tgt[..., None])[..., 0]
    return right.exp().mean().item(), -right.mean().item()


optimum = 1 - 0.1 + 0.1 / n_vocab_r
(p_plain, ce_plain), (p_reg, ce_reg) = held_out(reverser), held_out(regularised)
print(f"{'':28s} {'p(right token)':>14s} {'held-out loss':>13s} {'exactly reversed':>16s}")
print(f"{'no regularisation':28s} {p_plain:14.3f} {ce_plain:13.3f} {exact:16.1%}")
print(f"{'dropout 0.1 + smoothing 0.1':28s} {p_reg:14.3f} {ce_reg:13.3f} {exact_reg:16.1%}")
print(f"label smoothing's optimum: p(right) = 1 - 0.1 + 0.1/{n_vocab_r} = {optimum:.3f}")
assert abs(p_reg - optimum) < 0.03            # the smoothed model's confidence: 0.909, within 0.03
assert p_plain > 0.98 and ce_reg > ce_plain   # "hurts perplexity": less sure, higher loss
assert exact_reg > 0.9                        # ...and still reverses the sequences

# %% [raw] concept="smoothing-optimum"
# question: 'Label smoothing $\epsilon = 0.1$ over the reverser''s 11 tokens: what probability on the
#   right token minimises the smoothed loss (to 3 decimals)?'
# kind: numeric
# answer: 0.909
# tolerance: 0.001
# section: The paper's regularisation
# right: The smoothed target puts $1 - \epsilon + \epsilon/11 = 0.909$ on the right token, and the trained
#   model's confidence came within 0.03 of it.
# wrong:
#   1:
#     misconception: Smoothing leaves the optimum at certainty
#     explain: 'The smoothed loss is minimised at the smoothed target itself, which puts $\epsilon$
#       spread over all tokens: $0.9 + 0.1/11$.'
#   0.9:
#     misconception: The smoothing mass leaves the right token entirely
#     explain: 'The $\epsilon$ is spread over *all* 11 tokens, the right one included: $0.9 + 0.1/11
#       = 0.909$.'
#   other:
#     misconception: Not from the smoothed target
#     explain: $p = 1 - \epsilon + \epsilon / n_{vocab}$.

# %% [markdown]
# ## What we measured
#
# - The layer's forward pass, recomputed by hand, equals `TransformerLayer` to 1e-12 (float64),
#   and `TransformerLayer` equals `torch.nn.TransformerEncoderLayer` to 1e-12 in float64, in both
#   orders, with ReLU and GELU, with and without a padding mask.
# - The layer keeps the shape `(B, T, d_model)`, so layers stack.
# - Post-LN keeps the residual stream at RMS 1; pre-LN lets it grow with depth.
# - An embedding lookup is a one-hot matrix product; with `TokenEmbedding`'s $N(0, 1/d_{model})$
#   table the $\sqrt{d_{model}}$ scale makes the token's part $\sqrt2$ times the position's
#   instead of $1/8$ of it ($d_{model} = 128$). Tying the output head to the table saves
#   $n_{vocab} d_{model}$ parameters and sends a gradient to every row of the table at every step.
# - `TransformerDecoderLayer` equals `nn.TransformerDecoderLayer` to 1e-12; a one-layer encoder-decoder
#   learns to reverse sequences in 300 steps, and its cross-attention map is the anti-diagonal.
# - The layer's backward pass, assembled from attention's and LayerNorm's backward passes and
#   one line per linear map, equals autograd on `nn.TransformerEncoderLayer` to 1e-12 for the input
#   and all 16 parameter tensors; training keeps $n_{heads} T^2$ numbers per sequence on the
#   teaching path and none on the fused one (saved-tensors hooks).
# - The paper's dropout sits on each sub-layer's output and on the embedding sum (measured with
#   hooks: about 10% zeroed, survivors scaled by $1/0.9$, nothing in `eval()`); label smoothing
#   0.1 equals its formula, and the reverser trained with both puts about $0.909$ on each right
#   token, as the smoothed target predicts, where the unregularised one puts nearly 1: a higher
#   held-out loss, the "more unsure" model of the paper.
#
# Lesson 08 asks what one layer costs. Exercises: [`work/07_layer.ipynb`](../work/07_layer.ipynb).
# The whole layer's backward pass is exercise 4 of [`work/11_backward.ipynb`](../work/11_backward.ipynb).
