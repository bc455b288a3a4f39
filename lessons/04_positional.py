# %% [markdown]
# # 04 · Positional encodings
#
# Symbols: see [the notation table](00_map.ipynb#Notation) of lesson 00.
#
# Attention compares every query with every key, and nothing in $\mathrm{softmax}(QK^\top/\sqrt{d_k})V$
# knows *where* a token sits. This lesson measures that blindness (and where a causal mask ends
# it), then derives three ways to give the model positions: the paper's **sinusoidal** table, a
# **learned** table, and **rotary** encodings (RoPE). Section 6 trains small models with each and
# measures what happens past the length they were trained on. Everything used here lives in
# `txlearn.positional`.

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F

from txlearn.attention import scaled_dot_product_attention
from txlearn.heads import MultiHeadAttention
from txlearn.masks import causal_mask
from txlearn.plotting import heatmap
from txlearn.positional import (LearnedPositionalEmbedding, apply_rope, interleaved_to_half,
                                sinusoidal_encoding, sinusoidal_encoding_np,
                                sinusoidal_offset_matrix_np)

torch.manual_seed(0)
torch.set_num_threads(1)  # small models: one thread is fastest on a shared CPU
rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. Without positions, order is invisible (unless the mask is causal)
#
# One self-attention layer with random $W_Q, W_K, W_V$ on $T = 6$ tokens. Shuffle the tokens with a
# permutation $\pi$: if attention ignores order, the outputs are the *same vectors*, shuffled the
# same way, $f(x_\pi) = f(x)_\pi$. "The cat sat" and "sat cat the" then look identical to every
# token. We expect that without a mask, and expect it to fail in two ways: when positions are
# added to the tokens, and when the mask is causal (lesson 02, section 7: a causal query sees a
# prefix, and which tokens form the prefix depends on the order).

# %%
T, d_model = 6, 16
x = torch.randn(T, d_model, dtype=torch.float64)
W_Q, W_K, W_V = (torch.randn(d_model, d_model, dtype=torch.float64) / d_model ** 0.5 for _ in range(3))


def self_attention(x, mask=None):
    return scaled_dot_product_attention(x @ W_Q, x @ W_K, x @ W_V, mask)   # (T, d_model)


perm = torch.tensor([3, 0, 5, 1, 4, 2])
gap_plain = (self_attention(x[perm]) - self_attention(x)[perm]).abs().max().item()
print(f"no positions, no mask:     max |f(x_pi) - f(x)_pi| = {gap_plain:.1e}")
assert gap_plain < 1e-12  # equal to float64 rounding: permutation equivariant

pe = sinusoidal_encoding(T, d_model, dtype=torch.float64)                 # (T, d_model)
gap_pos = (self_attention(x[perm] + pe) - self_attention(x + pe)[perm]).abs().max().item()
print(f"with positions, no mask:   max |f(x_pi + PE) - f(x + PE)_pi| = {gap_pos:.2f}")
assert gap_pos > 0.05  # adding positions breaks the symmetry: order now changes the outputs

causal = causal_mask(T)
gap_causal = (self_attention(x[perm], causal) - self_attention(x, causal)[perm]).abs().max().item()
print(f"no positions, causal mask: max |f(x_pi) - f(x)_pi| = {gap_causal:.2f}")
assert gap_causal > 0.05  # a causal mask alone breaks it too

# %% [markdown]
# **A causal model without positions learns positions.** If a causal mask breaks the symmetry,
# a causal model should be able to work out where each token sits with no positional encoding
# at all. One way it can: attend evenly to every visible token, including a start token that
# begins every sequence; the start token then gets weight $1/(t+1)$ at position $t$, a number
# that names the position.
#
# The test: sequences of 16 random tokens (8 kinds), token embedding, one attention layer, a
# small MLP, **no positional encoding**; the target at each position is the position itself
# (16 classes, chance $1/16$). Three variants, 200 training steps each (about a second):
#
# - causal, with a start token: we expect near-perfect accuracy;
# - causal, without a start token: the averages still shrink in spread as $t$ grows, a weaker
#   clue; we expect far better than chance but far from perfect;
# - not causal, with a start token: permutation-equivariant, so only the start token itself can
#   be placed; we expect $1/16$ at every other position, $2/16$ overall.

# %%
n_kinds, T_probe, d_probe = 8, 16, 32
START = 0                                                 # token id of the start token


class PositionProbe(torch.nn.Module):
    """Token embedding -> one attention layer (no positions) -> MLP -> 16 position scores."""

    def __init__(self, causal):
        super().__init__()
        self.causal = causal
        self.tok = torch.nn.Embedding(n_kinds, d_probe)
        self.attn = MultiHeadAttention(d_probe, n_heads=1)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d_probe, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, T_probe))

    def forward(self, tokens):                            # (B, T) -> (B, T, T) scores, weights
        x = self.tok(tokens)                              # (B, T, d_model): no positions added
        mask = causal_mask(T_probe) if self.causal else None
        out, w = self.attn(x, mask=mask, return_weights=True)
        return self.mlp(x + out), w[:, 0]                 # w: (B, T, T)


def probe_tokens(n, start):
    tokens = torch.randint(1 if start else 0, n_kinds, (n, T_probe))
    if start:
        tokens[:, 0] = START
    return tokens


def train_probe(causal, start, steps=200):
    torch.manual_seed(0)
    model = PositionProbe(causal)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    positions = torch.arange(T_probe).expand(64, T_probe)
    for _ in range(steps):
        scores, _ = model(probe_tokens(64, start))
        loss = F.cross_entropy(scores.reshape(-1, T_probe), positions.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        scores, w = model(probe_tokens(2000, start))
    accuracy = (scores.argmax(-1) == torch.arange(T_probe)).float().mean(0)   # (T,) per position
    return accuracy, w.mean(0)                                                 # (T,), (T, T)


probes = {"causal, start token": train_probe(True, True),
          "causal, no start token": train_probe(True, False),
          "not causal, start token": train_probe(False, True)}
for name, (accuracy, _) in probes.items():
    print(f"{name:24s} accuracy {accuracy.mean():.3f} (chance {1 / T_probe:.3f}); "
          f"at positions >= 1: {accuracy[1:].mean():.3f}")

w_start = probes["causal, start token"][1][:, 0]          # weight on the start token, per t
t_probe = torch.arange(T_probe)
fig, (ax_a, ax_w) = plt.subplots(1, 2, figsize=(11, 3.6))
for name, (accuracy, _) in probes.items():
    ax_a.plot(t_probe, accuracy, marker="o", label=name)
ax_a.axhline(1 / T_probe, color="gray", ls=":", label="chance, 1/16")
ax_a.set(xlabel="position t", ylabel="accuracy", title="predicting its own position, no PE")
ax_a.legend(fontsize=8)
ax_w.plot(t_probe, w_start, "o-", label="learned weight on the start token")
ax_w.plot(t_probe, 1 / (t_probe + 1), "k--", label="1/(t+1): even over t+1 tokens")
ax_w.set(xlabel="position t", ylabel="weight", title="causal, start token: the clock it learned")
ax_w.legend(fontsize=8)
plt.tight_layout()
plt.show()

acc = {name: accuracy for name, (accuracy, _) in probes.items()}
assert acc["causal, start token"].mean() > 0.95                          # positions learned
assert 2 / T_probe < acc["causal, no start token"].mean() < 0.9            # a weaker clue
assert abs(acc["not causal, start token"][1:].mean() - 1 / (T_probe - 1)) < 0.05   # chance
assert acc["not causal, start token"][0] > 0.99                           # the start token itself
assert torch.all(torch.diff(w_start) < 0)             # the weight on the start token falls with t

# %% [markdown]
# So "attention is order-blind" is true only without a causal mask. With one, position can be
# read off the attention itself, and here it is: the weight on the start token falls steadily
# with $t$ (roughly like $1/(t+1)$, with a learned preference for the start token). Section 6
# trains a causal language model with no positional encoding beside the three encodings below.
#
# ## 2. The sinusoidal table
#
# Section 3.5 of the paper adds to the token at position $t$ the vector
#
# $$PE[t, 2k] = \sin(t\,\omega_k),\quad PE[t, 2k+1] = \cos(t\,\omega_k),\quad
# \omega_k = 10000^{-2k/d_{model}}$$
#
# (the paper writes $pos$ for $t$ and $i$ for $k$): sin at the **even** feature indices and cos
# at the **odd** ones (some code concatenates all sines then all cosines instead: a different,
# incompatible layout). Each pair of columns is a clock turning at its own speed, from one radian
# per position ($k=0$) down to $10^{-4}$.

# %%
table = sinusoidal_encoding_np(100, 64)                                   # (T, d_model)
fig, ax = plt.subplots(figsize=(8, 3.5))
heatmap(ax, table, "PE[t, i]", aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
ax.set(xlabel="feature index", ylabel="position t", title="sinusoidal encoding, d_model = 64")
plt.show()

print("position 1, d_model = 4:", np.round(sinusoidal_encoding_np(2, 4)[1], 6))
np.testing.assert_allclose(sinusoidal_encoding_np(2, 4)[1], [0.841471, 0.540302, 0.010000, 0.999950],
                           atol=1e-6)
np.testing.assert_array_equal(table[0], np.tile([0.0, 1.0], 32))  # sin 0 = 0 even, cos 0 = 1 odd

# %% [markdown]
# **Why sines?** The paper says $PE_{t+\Delta}$ is a *linear function* of $PE_{t}$. Concretely,
# $PE[t + \Delta] = PE[t]\,M_\Delta$ where $M_\Delta$ is block diagonal, one $2\times2$ rotation by
# $\Delta\,\omega_k$ per frequency, and the same for every $t$. Measured:

# %%
errors = []
for delta in (1, 7, 50):
    M_delta = sinusoidal_offset_matrix_np(delta, 64)                       # (d_model, d_model)
    pe = sinusoidal_encoding_np(100 + delta, 64)
    errors.append(np.abs(pe[:100] @ M_delta - pe[delta:]).max())
    assert np.allclose(M_delta @ M_delta.T, np.eye(64), atol=1e-12)        # a rotation
print("max |PE[t] M_delta - PE[t + delta]| for delta = 1, 7, 50:", [f"{e:.1e}" for e in errors])
assert max(errors) < 1e-12

# %% [markdown]
# ## 3. Dot products between encodings depend on distance only
#
# $PE[t] \cdot PE[t+\Delta] = \sum_k \cos(\Delta\,\omega_k)$: a function of the offset $\Delta$
# alone, largest ($d_{model}/2$) at $\Delta = 0$. It is often said to *decrease steadily* with
# distance. Measured:

# %%
T_long, d_model_pe = 512, 64
pe = sinusoidal_encoding_np(T_long, d_model_pe)
offsets = np.arange(0, 200)
dots = np.array([pe[100] @ pe[100 + delta] for delta in offsets])
dots_other = np.array([pe[300] @ pe[300 + delta] for delta in offsets])
rises = int((np.diff(dots) > 0).sum())

fig, ax = plt.subplots(figsize=(7, 3))
ax.plot(offsets, dots)
ax.set(xlabel="offset $\\Delta$", ylabel="PE[t] . PE[t + $\\Delta$]",
       title=f"d_model = {d_model_pe}")
plt.show()

print(f"same curve from t = 100 and t = 300: max difference {np.abs(dots - dots_other).max():.1e}")
print(f"PE[t].PE[t] = {dots[0]:.1f}; the curve rises at {rises} of {len(offsets) - 1} steps")
assert np.abs(dots - dots_other).max() < 1e-9       # depends on the offset only
assert dots[0] == np.max(dots) and abs(dots[0] - d_model_pe / 2) < 1e-9
assert np.all(dots[1:] < dots[0] - 0.4)             # every other offset is strictly less similar
assert rises > 20                                    # ...but not monotonic: it ripples

# %% [markdown]
# The similarity is highest at distance 0 and falls off overall, but **it is not monotonic**: it
# rises again at many offsets (ripples from the fast clocks). "Closer positions always look more
# alike" is only roughly true.
#
# ## 4. A learned table cannot serve a position it never had
#
# BERT and GPT-2 learn one vector per position, a table `W_pos` of shape `(max_len, d_model)`.
# It can fit whatever the data wants, but it has no row past `max_len`; the sinusoidal formula
# extends to any position. Whether a model *uses* unseen positions well is another matter:
# section 6 measures it, including what a table made longer than the training length holds in
# its extra rows.

# %%
learned = LearnedPositionalEmbedding(max_len=32, d_model=16)
print("learned table:", tuple(learned(32).shape))
try:
    learned(40)
    raised = None
except ValueError as err:
    raised = str(err)
print("T = 40:", raised)
assert raised is not None and "max_len=32" in raised
assert sinusoidal_encoding(40, 16).shape == (40, 16)   # the formula has no maximum

# %% [markdown]
# ## 5. Rotary encodings: relative positions inside the dot product
#
# RoPE (Su et al. 2021) does not add anything to $x$. It rotates each channel pair $k$ of a query
# or a key (of width $d_k$, one head's) by an angle proportional to its position, $m\,\theta_k$
# with $\theta_k = 10000^{-2k/d_k}$. A rotation by $m\theta$ followed by the inverse of one by
# $n\theta$ is a rotation by $(m - n)\theta$, so
#
# $$\mathrm{RoPE}(q, m) \cdot \mathrm{RoPE}(k, n) \text{ depends on } m - n \text{ only.}$$
#
# We place the same $q$ and $k$ at every pair of positions $0 \le m, n < 64$: the score matrix should
# be constant along each diagonal $m - n = \text{const}$.

# %%
d_k, T = 32, 64
q, k = torch.randn(d_k, dtype=torch.float64), torch.randn(d_k, dtype=torch.float64)
Q = apply_rope(q.expand(T, d_k))               # (T, d_k): q at positions 0..T-1
K = apply_rope(k.expand(T, d_k))               # (T, d_k)
scores = (Q @ K.T).numpy()                     # (L, S) = (T, T): scores[m, n]

diag_spread = max(np.ptp(np.diagonal(scores, offset=o)) for o in range(-T + 1, T))
print(f"largest spread along a diagonal m - n = const: {diag_spread:.1e}")
print(f"spread of all scores: {np.ptp(scores):.1f}")
assert diag_spread < 1e-10

norm_change = (Q.norm(dim=-1) - q.norm()).abs().max().item()
print(f"|RoPE(q, m)| - |q| over m: {norm_change:.1e} (rotations keep norms)")
assert norm_change < 1e-12

fig, ax = plt.subplots(figsize=(4, 3.5))
heatmap(ax, scores, "score", cmap="viridis")
ax.set(xlabel="key position n", ylabel="query position m", title="RoPE(q, m) . RoPE(k, n)")
plt.show()

# %% [markdown]
# **Two pairings.** The RoFormer paper and Meta's LLaMA code pair channels $(2k, 2k+1)$
# (`pairing="interleaved"`); GPT-NeoX and Hugging Face's LLaMA pair $(k, k + d_k/2)$ (`"half"`).
# Both are RoPE; a checkpoint moves from one to the other by permuting the output columns of
# $W_Q$ and $W_K$ (`interleaved_to_half`). Measured on the scores:

# %%
x = torch.randn(T, d_model, dtype=torch.float64)
W_Q, W_K = torch.randn(d_model, d_k, dtype=torch.float64), torch.randn(d_model, d_k, dtype=torch.float64)
scores_interleaved = apply_rope(x @ W_Q) @ apply_rope(x @ W_K).T
scores_half = (apply_rope(x @ interleaved_to_half(W_Q), pairing="half")
          @ apply_rope(x @ interleaved_to_half(W_K), pairing="half").T)
gap = (scores_interleaved - scores_half).abs().max().item()
mixed = (scores_interleaved - apply_rope(x @ W_Q, pairing="half") @ apply_rope(x @ W_K, pairing="half").T)
print(f"converted weights: max score difference {gap:.1e}; unconverted: {mixed.abs().max().item():.1f}")
assert gap < 1e-10
assert mixed.abs().max().item() > 1.0   # mixing pairings without converting gives other scores

# %% [markdown]
# ## 6. Past the trained length
#
# A common statement: a learned table "cannot generalise beyond its maximum length", while the
# sinusoidal formula can, and RoPE, being relative, should too. Measured here on real text.
#
# **The experiment.** Four small causal character models on the course corpus (the Python
# language reference, `txlearn.training.data`), identical except for positions: none (NoPE),
# sinusoidal (added to embeddings scaled by $\sqrt{d_{model}}$, paper section 3.4), learned
# (GPT-2's way: a table of `max_len = 128` rows added to the embeddings) and RoPE (on $Q$ and $K$
# in every layer). Each: $d_{model} = 64$, 4 heads, 2 pre-LN layers, $d_{ff} = 128$, output head
# tied to the embedding, 200 Adam steps on batches of 32 windows of $T = 32$ characters (a few
# seconds each). Then each reads 256 validation windows of 128 characters, and we record the loss
# at every position $t$.
#
# **A fair reference.** Loss per position mixes two things: the model's skill and how hard the
# characters at that position happen to be. So each model also reads the *same* characters cut
# into windows of 32 (its trained length): positions 32-63 of a long window are then positions
# 0-31 of a short one. The difference, long-window loss minus short-window loss on the same
# characters, is what positions past 32 cost (if positive) or what the extra context gains (if
# negative). On positions 0-31 the two passes are the same computation (causal mask): the
# difference there must be 0. Evaluating at $T = 64$ needs no separate run: it equals the first
# 64 positions of the $T = 128$ pass, which we check too.
#
# **What we expect.**
# - *Learned*: rows 32-127 never receive a gradient, so they keep their random initial values:
#   the model meets position vectors it never saw. The loss should jump right after 32.
# - *Sinusoidal*: the formula has rows for every position, but past 32 the slow clocks reach
#   angles never seen in training. The paper hoped the encoding "may allow the model to
#   extrapolate"; we expect it to degrade.
# - *RoPE*: scores depend on $m - n$, and training saw $|m - n| \le 31$ only. Queries just past
#   32 still mostly use nearby keys (small offsets, all seen), so we expect damage that grows
#   with the distance.
# - *NoPE*: no position vector to run out of; its position signal is the attention itself
#   (section 1), which changes smoothly with length. We expect the smallest damage.

# %%
import time

from torch import nn

from txlearn.ffn import FeedForward
from txlearn.heads import merge_heads, split_heads
from txlearn.layer import OutputHead, TokenEmbedding
from txlearn.norms import LayerNorm
from txlearn.training.data import CharVocab, load_corpus, random_windows, split_by_position

text = load_corpus()
vocab = CharVocab.from_text(text)
n_vocab = len(vocab)
T_train, T_eval, n_windows = 32, 128, 256
train_ids, val_ids = split_by_position(vocab.encode(text), T_eval)
windows = val_ids[: n_windows * (T_eval + 1)].reshape(n_windows, T_eval + 1)   # (W, T_eval + 1)
x_val, y_val = windows[:, :-1], windows[:, 1:]                                # inputs, targets


class Layer(nn.Module):
    """One pre-LN layer; its attention is MultiHeadAttention's, with RoPE on Q and K if asked."""

    def __init__(self, d_model, n_heads, d_ff, rope):
        super().__init__()
        self.rope, self.n_heads = rope, n_heads
        self.norm1, self.attn = LayerNorm(d_model), MultiHeadAttention(d_model, n_heads)
        self.norm2, self.ffn = LayerNorm(d_model), FeedForward(d_model, d_ff, activation="gelu")

    def attention(self, x):                                       # (B, T, d_model)
        a = self.attn
        Q = split_heads(x @ a.W_Q + a.b_Q, self.n_heads)          # (B, n_heads, T, d_k)
        K = split_heads(x @ a.W_K + a.b_K, self.n_heads)          # (B, n_heads, T, d_k)
        V = split_heads(x @ a.W_V + a.b_V, self.n_heads)          # (B, n_heads, T, d_k)
        if self.rope:
            Q, K = apply_rope(Q), apply_rope(K)                   # positions 0 .. T-1
        heads = scaled_dot_product_attention(Q, K, V, causal_mask(x.shape[1]))
        return merge_heads(heads) @ a.W_O + a.b_O                 # (B, T, d_model)

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class CharLM(nn.Module):
    """ids (B, T) -> logits (B, T, n_vocab); `position` is "none", "sinusoidal", "learned", "rope"."""

    def __init__(self, position, d_model=64, n_heads=4, n_layers=2, d_ff=128):
        super().__init__()
        added = position if position in ("sinusoidal", "learned") else None
        self.embed = TokenEmbedding(n_vocab, d_model, positional=added, max_len=T_eval,
                                    scale=position == "sinusoidal")
        self.layers = nn.ModuleList(Layer(d_model, n_heads, d_ff, position == "rope")
                                    for _ in range(n_layers))
        self.norm = LayerNorm(d_model)
        self.head = OutputHead(d_model, n_vocab, tie_to=self.embed)

    def forward(self, ids):
        x = self.embed(ids)                                       # (B, T, d_model)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))                            # (B, T, n_vocab)


def loss_by_position(model, x, y):
    """Mean cross-entropy (nats) at each position: x, y (W, T) -> (T,)."""
    with torch.no_grad():
        return F.cross_entropy(model(x).transpose(1, 2), y, reduction="none").mean(0)


encodings = ("none", "sinusoidal", "learned", "rope")
models, long_loss, short_loss, seconds = {}, {}, {}, {}
for position in encodings:
    torch.manual_seed(0)
    model = CharLM(position)
    if position == "learned":
        W_pos_init = model.embed.pos.W_pos.detach().clone()         # (T_eval, d_model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    batches = torch.Generator().manual_seed(0)
    start = time.process_time()
    for step in range(200):
        inputs, targets = random_windows(train_ids, 32, T_train, batches)   # (32, T_train)
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    seconds[position] = time.process_time() - start
    models[position] = model
    long_loss[position] = loss_by_position(model, x_val, y_val)                     # (T_eval,)
    with torch.no_grad():                      # the same characters, in windows of T_train
        per_char = F.cross_entropy(model(x_val.reshape(-1, T_train)).transpose(1, 2),
                                   y_val.reshape(-1, T_train), reduction="none")  # (4W, T_train)
    short_loss[position] = per_char.reshape(n_windows, T_eval).mean(0)            # (T_eval,)
    at_64 = loss_by_position(model, x_val[:, :64], y_val[:, :64])
    assert (at_64 - long_loss[position][:64]).abs().max() < 1e-5      # T = 64 is a prefix of 128
    assert (long_loss[position][:T_train] - short_loss[position][:T_train]).abs().max() < 1e-5

cost = {p: long_loss[p] - short_loss[p] for p in encodings}          # (T_eval,) per encoding
span = {"0-31": slice(0, 32), "32-63": slice(32, 64), "64-127": slice(64, 128)}
print("loss past 32 = loss in the 128-window minus loss in 32-windows, same characters (nats)")
print(f"{'position':11s} {'train CPU s':>11s} {'loss at 0-31':>12s} {'past 32: 32-63':>15s} {'64-127':>7s}")
for p in encodings:
    print(f"{p:11s} {seconds[p]:11.1f} {long_loss[p][:32].mean():12.3f} "
          f"{cost[p][span['32-63']].mean():+15.3f} {cost[p][span['64-127']].mean():+7.3f}")
just_past = slice(T_train + 1, T_train + 6)      # positions 33-37
print("past 32, positions 33-37 only:",
      ", ".join(f"{p} {cost[p][just_past].mean():+.2f}" for p in encodings))
c = {p: (cost[p][span["32-63"]].mean().item(), cost[p][span["64-127"]].mean().item())
     for p in encodings}
assert c["learned"][0] > 0.3                     # untrained rows: a jump right after 32
assert c["sinusoidal"][0] > 0.2                  # the formula's extra rows do not help it
assert c["rope"][1] > c["rope"][0] + 0.2         # RoPE: damage grows with the distance
assert cost["rope"][just_past].mean() < 0.1      # ...from almost nothing at 33-37
assert cost["rope"][just_past].mean() < min(cost["learned"][just_past].mean(),
                                            cost["sinusoidal"][just_past].mean()) - 0.2
assert all(c["none"][i] < min(c[p][i] for p in encodings if p != "none") for i in (0, 1))
assert max(c["none"]) < 0.2                      # NoPE: the smallest cost, under 0.2 nats

# %%
def smooth(y, width=8):
    return np.convolve(y.numpy(), np.ones(width) / width, mode="valid")   # running mean

t_eval = np.arange(T_eval)
centre = t_eval[:T_eval - 7] + 3.5                                        # of each running mean
fig, (ax_l, ax_c) = plt.subplots(1, 2, figsize=(12, 4))
for p in encodings:
    ax_l.plot(centre, smooth(long_loss[p]), label=p)
    ax_c.plot(centre, smooth(cost[p]), label=p)
for ax in (ax_l, ax_c):
    ax.axvspan(0, T_train, color="gray", alpha=0.15, label="trained positions")
    ax.set(xlabel="position t (running mean over 8)")
ax_c.axhline(0, color="k", lw=0.8)
ax_l.set(ylabel="loss (nats per character)", title="validation loss by position, T = 128")
ax_c.set(ylabel="long-window minus 32-window loss", title="what positions past 32 cost")
ax_l.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# Every model pays for positions past 32, against the expectation for the sinusoidal table:
#
# - **Learned** jumps within a few positions of 32, as expected, and stays about 0.6 nats worse.
# - **Sinusoidal** is almost as bad as learned (about 0.5 nats): having a formula for every
#   position does not mean the model can use the rows it never saw.
# - **RoPE** is the best model on the trained positions and costs almost nothing at positions
#   33-37 (offsets to nearby keys are all familiar), then becomes the worst of the four:
#   its cost keeps growing with the distance, to more than a nat.
# - **No positional encoding** costs least (about 0.1 nats), although it is the weakest model on
#   the trained positions.
#
# *Surprise, for the claim we started from:* the one encoding designed to extend, the sinusoidal
# formula, extends about as badly as the learned table, and the best length behaviour comes from
# no positional encoding at all. Published measurements point the same way (Press et al. 2022,
# "Train short, test long", for sinusoidal and rotary encodings; Kazemnejad et al. 2023 for causal
# models without one). These are tiny models and one seed each; the ordering, not the exact
# numbers, is the result. (The dip just after 32 is the extra context: a 32-character window
# starts there with none.)

# %% [markdown]
# **The learned table's extra rows.** The table has 128 rows, but only rows 0-31 were ever used in
# training. We expect rows 32-127 to be exactly their random initial values, and the trained
# rows to have grown a structure (neighbouring positions alike) that the untrained ones lack.

# %%
W_pos = models["learned"].embed.pos.W_pos.detach()                       # (T_eval, d_model)
unit = W_pos / W_pos.norm(dim=-1, keepdim=True)
cosine = unit @ unit.T                                                   # (T_eval, T_eval)
neighbours = torch.diagonal(cosine, offset=1)                            # cos(row t, row t+1)
print(f"rows 32-127 equal their initial values: {torch.equal(W_pos[T_train:], W_pos_init[T_train:])}")
print(f"rows 0-31 moved from theirs by up to {(W_pos[:T_train] - W_pos_init[:T_train]).abs().max():.2f}")
print(f"row norms: trained {W_pos[:T_train].norm(dim=-1).mean():.2f}, "
      f"untrained {W_pos[T_train:].norm(dim=-1).mean():.2f}; cosine of neighbouring rows: "
      f"trained {neighbours[:T_train - 1].mean():.2f}, untrained {neighbours[T_train:].mean():.2f}")
assert torch.equal(W_pos[T_train:], W_pos_init[T_train:])    # never touched by training
assert neighbours[:T_train - 1].mean() > neighbours[T_train:].mean() + 0.2

fig, ax = plt.subplots(figsize=(5, 4.2))
heatmap(ax, cosine, "cosine", cmap="RdBu", vmin=-1, vmax=1)
ax.axhline(T_train - 0.5, color="k", lw=0.8)
ax.axvline(T_train - 0.5, color="k", lw=0.8)
ax.set(xlabel="position", ylabel="position", title="learned W_pos: cosine between rows")
plt.show()

# %% [markdown]
# A table longer than the training windows does not extend a learned encoding: its extra rows
# are the random numbers it started with (small, and unrelated to each other or to their
# neighbours), and the model has never seen any of them.

# %% [markdown]
# ## 7. RoPE in bfloat16: the angle must not be rounded
#
# Models often run in bfloat16, which keeps 8 significant bits: between 1024 and 2048 its numbers
# are 8 apart. The angle $m\,\theta_i$ grows with the position $m$, so at long positions the
# *angle* cannot be held in bfloat16 at all, even though its cosine and sine (numbers in
# $[-1, 1]$) can. Measured: the spacing of bfloat16 numbers near $m\,\theta_1$ at $m = 1857$.

# %%
from txlearn.positional import apply_rope_np, rope_angles_np

d_k, m = 32, 1857
angle = rope_angles_np([m], d_k)[0, 1]                      # m * theta_1, float64 radians
near = torch.tensor(np.linspace(angle - 20, angle + 20, 4001))           # float64 grid
spacing = torch.diff(near.to(torch.bfloat16).unique().double()).unique()  # distinct bf16 gaps
rounding = torch.tensor(angle).to(torch.bfloat16).item() - angle
print(f"m theta_1 = {angle:.4f} rad; bfloat16 numbers there are {spacing.tolist()} apart; "
      f"rounding moves the angle by {rounding:+.2f} rad")
assert spacing.tolist() == [8.0] and abs(rounding) <= 4.0 and abs(rounding) > 3.0

# %% [markdown]
# A rotation by an angle that is off by 3.7 radians is a rotation by a nearly random angle. Code
# that rounds the angles to the input's dtype before taking cos and sin (a fault reported
# publicly in other transformer code) does exactly that. Below, that faulty version next to
# `txlearn`'s `apply_rope`, which computes the angles and their cos and sin in float64, rotates in
# float32 and rounds only the result to bfloat16, on $x = e_2$ (so features 2 and 3 of the output
# are $(\cos, \sin)(m\,\theta_1)$):

# %%
def rope_rounding_the_angles(x, positions):
    """The fault, for comparison only: angles rounded to x's dtype before cos and sin."""
    angles = torch.tensor(rope_angles_np(positions, x.shape[-1]), dtype=x.dtype)  # (T, d_k/2)
    a, b = x[..., 0::2], x[..., 1::2]                                             # (T, d_k/2)
    c, s = torch.cos(angles), torch.sin(angles)
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)       # (T, d_k)


e_2 = torch.zeros(1, d_k, dtype=torch.bfloat16)
e_2[0, 2] = 1.0
right = apply_rope_np(e_2.double().numpy(), [m])[0, 2:4]
faulty = rope_rounding_the_angles(e_2, [m])[0, 2:4].double().numpy()
fixed = apply_rope(e_2, [m])[0, 2:4].double().numpy()
print(f"position {m}, features 2-3: right {np.round(right, 6)}, angles rounded to bfloat16 "
      f"{np.round(faulty, 4)}, apply_rope {np.round(fixed, 4)}")
assert np.abs(faulty - right).max() > 1.0          # the issue's [0.2754, -0.9609]
assert np.abs(fixed - right).max() <= 2 ** -9      # within one bfloat16 rounding of the answer

# %% [markdown]
# Over positions, for a random unit vector: the error of the faulty rotation grows with the
# position (the spacing of bfloat16 numbers near the angle doubles with every doubling of $m$) until
# the rotation is as good as random, while `apply_rope`'s stays at the cost of rounding the right
# answer to bfloat16 once (at most $2^{-9}$ per feature of a unit vector).

# %%
positions = [1, 10, 100, 1001, 1857, 3001, 10000, 30000]
u = torch.randn(len(positions), d_k, dtype=torch.float64)
u = (u / u.norm(dim=-1, keepdim=True)).to(torch.bfloat16)               # unit vectors, rounded
exact = apply_rope_np(u.double().numpy(), positions)                   # float64 answer
err_faulty = np.abs(rope_rounding_the_angles(u, positions).double().numpy() - exact).max(-1)
err_fixed = np.abs(apply_rope(u, positions).double().numpy() - exact).max(-1)
err_floor = np.abs(torch.tensor(exact).to(torch.bfloat16).double().numpy() - exact).max(-1)
for p, a, b, c in zip(positions, err_faulty, err_fixed, err_floor):
    print(f"m = {p:>5}: angles rounded {a:.4f}   apply_rope {b:.4f}   rounding the answer {c:.4f}")
assert err_fixed.max() <= 2 ** -9 + 1e-6                # one bfloat16 rounding, at every position
assert err_faulty[positions.index(1001):].min() > 0.1    # the fault: wrong from m = 1001 on

fig, ax = plt.subplots(figsize=(6, 3))
ax.loglog(positions, err_faulty, "o-", label="angles rounded to bfloat16")
ax.loglog(positions, err_fixed, "s-", label="apply_rope (cos, sin from float64)")
ax.axhline(2 ** -9, color="grey", ls=":", lw=0.8, label="half a bfloat16 step, $2^{-9}$")
ax.set(xlabel="position m", ylabel="max |error| (unit vector)", title="RoPE in bfloat16")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# The fault also breaks the promise of section 5: scores no longer depend on $m - n$ alone. The
# same $q$ and $k$, 7 positions apart, placed at four starting positions:

# %%
q16, k16 = q.to(torch.bfloat16)[None], k.to(torch.bfloat16)[None]      # (1, d_k), from section 5
scale = (q16.double().norm() * k16.double().norm()).item()


def score(rope, m):
    return (rope(q16, [m + 7]).double() * rope(k16, [m]).double()).sum().item() / scale


starts = [0, 1850, 3000, 20000]
spread_fixed = np.ptp([score(apply_rope, s) for s in starts])
spread_faulty = np.ptp([score(rope_rounding_the_angles, s) for s in starts])
print(f"spread of q.k / (|q||k|) over the starts: apply_rope {spread_fixed:.4f}, "
      f"angles rounded {spread_faulty:.2f}")
assert spread_fixed <= 2 * 2 ** -8        # each rotated vector rounded once to bfloat16
assert spread_faulty > 0.1

# %% [markdown]
# Float32 angles are not enough at long positions either: near $m = 65{,}519$ float32 numbers are
# $2^{-8} \approx 0.004$ apart, so a float32 angle there is off by up to 0.002 radians, about
# 16,000 times float32's own precision. That is why `apply_rope` computes angles in float64.

# %%
near = torch.tensor(np.linspace(65519 - 0.05, 65519 + 0.05, 1001))
spacing32 = torch.diff(near.float().unique().double()).unique().tolist()
print(f"float32 numbers near 65,519 are {spacing32} apart")
assert spacing32 == [2 ** -8]

# %% [markdown]
# ## Summary
#
# - Attention alone is permutation equivariant (to $10^{-12}$): without positions and without a
#   causal mask, order is invisible. A causal mask breaks the symmetry, and a causal model with no
#   positional encoding learns its positions (here 100% of 16, from the weight on a start token).
# - The sinusoidal table: sin at even, cos at odd indices; a shift by $\Delta$ is a fixed
#   rotation $M_\Delta$.
# - Encoding similarity depends on the offset only and peaks at 0, but does not decrease monotonically.
# - A learned table stops at `max_len`; RoPE makes the query-key score a function of $m - n$.
# - Past the trained length (32 to 128 characters) every encoding loses: learned about 0.6 nats,
#   sinusoidal about 0.5, RoPE little at first and then over a nat, no encoding about 0.1. The
#   learned table's unused rows are still their random initial values.
# - In bfloat16 the angle $m\,\theta_1$ at $m = 1857$ lies where bfloat16 numbers are 8 apart:
#   rounding the angles before cos and sin makes RoPE wrong from about position 1,000 on;
#   `apply_rope` takes cos and sin of float64 angles and rounds only the result.
#
# Exercises: [`work/04_positional.ipynb`](../work/04_positional.ipynb) (the sinusoidal table, a RoPE rotation).
