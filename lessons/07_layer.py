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
# embedding table and the output head, and, for the paper's encoder-decoder, the decoder's
# cross-attention. Symbols: see [the notation table](00_map.ipynb#Notation).

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
from txlearn.plotting import heatmap, layer_diagram
from txlearn.positional import sinusoidal_encoding
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
# **Step 2: split into heads.** Head `head` takes features `head*d_k ... (head+1)*d_k - 1`:
# `(T, d_model) -> (T, n_heads, d_k) -> (n_heads, T, d_k)`.

# %%
def split(M):
    return M.reshape(T, n_heads, d_k).transpose(1, 0, 2)  # (n_heads, T, d_k)

Qh, Kh, Vh = split(Q), split(K), split(V)
print("head 1's queries =\n", Qh[1])
assert Qh.shape == (n_heads, T, d_k)
assert np.array_equal(Qh[1], Q[:, d_k:2 * d_k])  # head 1 is the second slice of features

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

# %% [markdown]
# The $\sqrt{d_{model}}$ matters together with the initialisation: a table drawn at the scale an
# output projection wants ($N(0, 1/d_{model})$, so that $h E^\top$ has unit-size logits for a
# unit-size $h$) is too small to compete with the positions until it is scaled up. Models that
# learn their positions (GPT-2, BERT) drop the factor and initialise both tables at the same
# small scale (GPT-2 draws both with standard deviation 0.02; so does lesson 09's model).
#
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
    """Encoder-decoder: embedding -> encoder layer -> memory; decoder layer with cross-attention."""

    def __init__(self):
        super().__init__()
        self.embed = TokenEmbedding(n_vocab_r, d_model_r, positional="sinusoidal", scale=True)
        self.encoder = TransformerLayer(d_model_r, 1, 4 * d_model_r, norm_first=True)
        self.encoder_norm = LayerNorm(d_model_r)
        self.decoder = TransformerDecoderLayer(d_model_r, 1, 4 * d_model_r, norm_first=True)
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


torch.manual_seed(0)
data = torch.Generator().manual_seed(1)
reverser = Reverser()
opt = torch.optim.Adam(reverser.parameters(), lr=5e-3)
losses = []
for step in range(300):
    src, tgt_in, tgt = reverse_batch(32, data)
    loss = F.cross_entropy(reverser(src, tgt_in)[0].reshape(-1, n_vocab_r), tgt.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())

src, _, tgt = reverse_batch(256, torch.Generator().manual_seed(2))   # held out
out = torch.full((256, 1), START)
with torch.no_grad():
    for t in range(T_r):                               # greedy: feed each output back in
        logits, w_cross = reverser(src, out)
        out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
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
plt.show()

# %% [markdown]
# The map is the anti-diagonal: to write output $t$, the decoder looks at source position
# $T-1-t$. Nothing told it so; it is the only place the answer is, and gradient descent found it
# through a $W_Q$, $W_K$ pair that matches a decoder position to the mirrored source position
# (with sinusoidal encodings that is a linear map: $\sin(\omega(T-1-t))$ and
# $\cos(\omega(T-1-t))$ are fixed combinations of $\sin \omega t$ and $\cos \omega t$). In
# translation the same map is the word alignment between the two sentences.
#
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
#
# Lesson 08 asks what one layer costs. Exercises: [`work/07_layer.ipynb`](../work/07_layer.ipynb).
