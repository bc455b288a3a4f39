# %% [markdown]
# # 03 · Multi-head and grouped-query attention
#
# Symbols: see [the notation table](00_map.ipynb#Notation) of lesson 00.
#
# One attention head produces one weighted average per query: it can look at one "kind" of
# place at a time. Multi-head attention runs several heads side by side, each in its own slice of
# the projected features ($x W_Q$, $x W_K$, $x W_V$), and mixes their results with $W_O$ (Vaswani
# et al. 2017, section 3.2.2):
#
# $$\text{MultiHead}(x) = \text{Concat}(\text{head}_1, \dots, \text{head}_{n_{heads}})\, W_O,
#   \qquad \text{head}_{\text{head}} = \text{Attention}(x W_Q^{\text{head}},\;
#   x W_K^{\text{head}},\; x W_V^{\text{head}}),$$
#
# with $d_k = d_{model} / n_{heads}$ per head ($W_Q^{\text{head}}$ is the head's own $d_k$
# columns of $W_Q$). Grouped-query attention (Ainslie et al. 2023) then
# lets several query heads share one key/value head, which shrinks the key/value cache that
# text generation keeps in memory. Every claim is measured and ends in an `assert`.
#
# The code: `txlearn.heads` (`split_heads`, `merge_heads`, `MultiHeadAttention`, `KVCache`,
# `kv_cache_bytes`).
#
# **You will be able to:** split projected features into heads and merge them back; count a
# multi-head layer's parameters; explain, with a measurement, how one head copes with a task
# that needs two lookups; say which key/value head each query head reads under GQA and MQA; and
# compute the KV-cache memory of a published model.
#
# **You need:** lesson 02 (attention, causal masks, generating one token at a time); PyTorch
# `nn.Module`s and reshapes.
#
# **Time:** about 60 minutes to read and run (the cells take about 10 s on a 2-core CPU), plus
# the exercises.

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F

from txlearn.heads import KVCache, MultiHeadAttention, kv_cache_bytes, merge_heads, split_heads
from txlearn.masks import causal_mask
from txlearn.plotting import heatmap, show

torch.manual_seed(0)
torch.set_num_threads(1)  # the tensors here are tiny: one thread is fastest on a shared CPU

# %% [markdown]
# ## 1. Heads are slices of the projected features
#
# `split_heads` reshapes projected features, such as $Q = x W_Q$ of shape `(B, T, d_model)`, into
# `(B, n_heads, T, d_k)`: head number $\text{head}$ gets the contiguous features
# $\text{head} \cdot d_k \dots (\text{head}+1) \cdot d_k - 1$ of every position. `merge_heads`
# undoes it. The slices are of $Q$, $K$ and $V$, never of the token vector $x$: every head's
# $W_Q^{\text{head}}$ reads all $d_{model}$ features of $x$. On a tiny example with
# $d_{model} = 6$ and 3 heads (the numbers stand for projected features):

# %%
x = torch.arange(12.0).reshape(1, 2, 6)      # B = 1, T = 2, d_model = 6
heads = split_heads(x, n_heads=3)            # (1, 3, 2, 2)
print("x[0] =", x[0].tolist())
for head in range(3):
    print(f"head {head}:", heads[0, head].tolist())
assert heads.shape == (1, 3, 2, 2)
assert heads[0, 1].tolist() == [[2.0, 3.0], [8.0, 9.0]]   # features 2-3 of both positions
assert torch.equal(merge_heads(heads), x)

# %% [markdown]
# **Heads cost no extra parameters.** $W_Q, W_K, W_V, W_O$ stay `(d_model, d_model)` whatever
# the number of heads; the heads only *partition* the projected features. A common reading of
# "8 heads" as "8 times the parameters" is wrong, measured:

# %%
count = lambda module: sum(p.numel() for p in module.parameters())
d_model = 64
counts = {n: count(MultiHeadAttention(d_model, n)) for n in (1, 2, 8, 64)}
torch_count = count(torch.nn.MultiheadAttention(d_model, 8))
print("parameters by n_heads:", counts, "  nn.MultiheadAttention(64, 8):", torch_count)
assert set(counts.values()) == {4 * d_model * (d_model + 1)} == {torch_count}   # 16,640

# %% [raw] concept="head-parameters"
# question: '`MultiHeadAttention(d_model=64, n_heads=8)` with biases: how many parameters does it hold?'
# kind: numeric
# answer: 16640
# tolerance: 0
# section: '1.'
# right: '$4 \cdot d_{model}(d_{model} + 1) = 16{,}640$ for any number of heads: $W_Q, W_K, W_V, W_O$
#   and their biases; the heads only slice the projected features (the printed counts for 1, 2, 8 and
#   64 heads are equal).'
# wrong:
#   133120:
#     misconception: Each head has its own full-size projections
#     explain: 'Eight heads do not mean eight times the parameters: each head is a $d_k = 8$ slice of
#       the same $64 \times 64$ projections (measured: the same count for 1 to 64 heads).'
#   2080:
#     misconception: The count of one head taken for the layer
#     explain: 'A head''s slice is an eighth of the projections, but the layer holds all eight slices:
#       $4 \cdot 64 \cdot 65$.'
#   16384:
#     misconception: The biases forgotten
#     explain: $4 \cdot 64^2 = 16{,}384$ counts the four weight matrices only; each also has a bias
#       of 64.
#   other:
#     misconception: Not counted from the four projections
#     explain: Four `(d_model, d_model)` matrices and four biases of `d_model`.

# %% [markdown]
# Our module computes exactly what `nn.MultiheadAttention` computes once the weights are copied
# across (PyTorch stores `(d_out, d_in)`; we transpose at the loading boundary). And because
# $W_O$ acts on the concatenation, the output is a **sum over heads**: each head's output times
# its own block of $d_k$ rows of $W_O$.

# %%
mha_torch = torch.nn.MultiheadAttention(d_model, 8, batch_first=True)
mha = MultiHeadAttention.from_torch(mha_torch)
xb = torch.randn(2, 5, d_model)
out, weights = mha(xb, mask=causal_mask(5), return_weights=True)
ref, ref_w = mha_torch(xb, xb, xb, attn_mask=~causal_mask(5), average_attn_weights=False)
print(f"max |ours - nn.MultiheadAttention| = {(out - ref).abs().max():.1e}")
assert torch.allclose(out, ref, atol=1e-5) and torch.allclose(weights, ref_w, atol=1e-6)

with torch.no_grad():
    Q = split_heads(xb @ mha.W_Q + mha.b_Q, 8)          # (B, 8, T, d_k)
    V = split_heads(xb @ mha.W_V + mha.b_V, 8)          # (B, 8, T, d_k)
    per_head = weights @ V                              # (B, 8, T, d_k)
    d_k = d_model // 8
    blocks = mha.W_O.reshape(8, d_k, d_model)           # (8, d_k, d_model): rows of each head
    summed = sum(per_head[:, head] @ blocks[head] for head in range(8)) + mha.b_O
print(f"max |out - sum over heads| = {(out - summed).abs().max():.1e}")
assert torch.allclose(out, summed, atol=1e-5)

# %% [markdown]
# ## 2. Heads specialise
#
# The claim is that different heads learn different jobs (in trained language models: syntax,
# coreference, long-range links). Here we show the mechanism on a task built for it; heads of
# real models are measured later: lesson 09 finds previous-token and subject-noun heads in a
# trained BERT and in our character model, lesson 10 sink, previous-token and induction heads in
# a real LLM, each against a baseline.
#
# A small synthetic task needs two different lookups at once: at every position $t \ge 1$,
# predict **the previous token** $x_{t-1}$ and **the first token** $x_0$. A single attention layer
# (causal mask, token plus learned position embeddings, $d_{model} = 32$) with two heads is
# trained for 150 steps; then we draw each head's average attention pattern.

# %%
n_vocab, T, d_model = 8, 8, 32

class TwoLookups(torch.nn.Module):
    def __init__(self, n_heads):
        super().__init__()
        self.tok = torch.nn.Embedding(n_vocab, d_model)
        self.pos = torch.nn.Embedding(T, d_model)
        self.attn = MultiHeadAttention(d_model, n_heads)
        self.read_prev = torch.nn.Linear(d_model, n_vocab)
        self.read_first = torch.nn.Linear(d_model, n_vocab)

    def embed(self, tokens):                            # tokens (B, T) -> (B, T, d_model)
        return self.tok(tokens) + self.pos(torch.arange(T))

    def forward(self, tokens):
        out, w = self.attn(self.embed(tokens), mask=causal_mask(T), return_weights=True)
        return self.read_prev(out), self.read_first(out), w   # w: (B, n_heads, T, T)

def train_two_lookups(n_heads, steps=150, seed=0):
    torch.manual_seed(seed)
    model = TwoLookups(n_heads)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        tokens = torch.randint(0, n_vocab, (64, T))
        prev_logits, first_logits, _ = model(tokens)
        loss = (F.cross_entropy(prev_logits[:, 1:].reshape(-1, n_vocab), tokens[:, :-1].reshape(-1))
                + F.cross_entropy(first_logits[:, 1:].reshape(-1, n_vocab),
                                  tokens[:, :1].expand(-1, T - 1).reshape(-1)))
        opt.zero_grad()
        loss.backward()
        opt.step()
    tokens = torch.randint(0, n_vocab, (512, T))
    with torch.no_grad():
        prev_logits, first_logits, w = model(tokens)
    acc_prev = (prev_logits[:, 1:].argmax(-1) == tokens[:, :-1]).float().mean().item()
    acc_first = (first_logits[:, 1:].argmax(-1) == tokens[:, :1]).float().mean().item()
    return model, acc_prev, acc_first, w.mean(0)        # w.mean(0): (n_heads, T, T)

model2, acc_prev, acc_first, w2 = train_two_lookups(n_heads=2)
t = torch.arange(2, T)                                  # t >= 2: t - 1 and 0 differ
on_prev = w2[:, t, t - 1].mean(-1)                      # (n_heads,)
on_first = w2[:, t, 0].mean(-1)
print(f"2 heads: accuracy prev {acc_prev:.3f}, first {acc_first:.3f}")
for head in range(2):
    print(f"  head {head}: weight on t-1 = {on_prev[head]:.3f}, on position 0 = {on_first[head]:.3f}")
assert min(acc_prev, acc_first) > 0.99
assert on_prev.max() > 0.95 and on_first.max() > 0.95
assert on_prev.argmax() != on_first.argmax()            # two different heads
for seed in (1, 2):                                     # the same split on two more seeds
    _, acc_p, acc_f, w_s = train_two_lookups(n_heads=2, seed=seed)
    prev_s, first_s = w_s[:, t, t - 1].mean(-1), w_s[:, t, 0].mean(-1)
    print(f"  seed {seed}: accuracy prev {acc_p:.3f}, first {acc_f:.3f}; previous-token head "
          f"{int(prev_s.argmax())} ({prev_s.max():.3f}), first-token head {int(first_s.argmax())} "
          f"({first_s.max():.3f})")
    assert min(acc_p, acc_f) > 0.99 and min(prev_s.max(), first_s.max()) > 0.95
    assert prev_s.argmax() != first_s.argmax()

fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
for head, ax in enumerate(axes):
    heatmap(ax, w2[head], "mean weight", cmap="Blues", vmin=0, vmax=1)
    role = "previous token" if on_prev[head] > on_first[head] else "first token"
    ax.set(title=f"head {head}: {role}", xlabel="key position", ylabel="query position")
plt.tight_layout()
roles = ["previous token" if on_prev[head] > on_first[head] else "first token" for head in range(2)]
show(fig, alt=f"Two heatmaps of mean attention weight over 512 sequences, query position on the "
     f"rows, key position on the columns, colour from 0 to 1. Head 0, the {roles[0]} head, and "
     f"head 1, the {roles[1]} head: the previous-token head is dark on the line just below the "
     "diagonal, the first-token head is dark in column 0; row 0 is dark at key 0 in both, "
     "since the first query sees only itself.")

# %% [markdown]
# The split does not depend on luck: it holds on each of the three seeds asserted above (and
# on the two more we tried); only which head takes which role changes from seed to seed.
#
# Now the same layer with **one** head of the full width (same parameter count), the same
# training and the same seed. One row of softmax weights cannot put a weight near 1 on two
# keys, so we expect the head to share its weight between $t-1$ and $0$, and both accuracies to
# drop below the two-head model's.

# %%
model1, acc_prev1, acc_first1, w1 = train_two_lookups(n_heads=1)
on_prev1, on_first1 = w1[0, t, t - 1].mean().item(), w1[0, t, 0].mean().item()
print(f"1 head:  accuracy prev {acc_prev1:.3f}, first {acc_first1:.3f}; "
      f"mean weight on t-1 = {on_prev1:.2f}, on position 0 = {on_first1:.2f}")
assert min(acc_prev1, acc_first1) < 0.99 < min(acc_prev, acc_first)
assert min(acc_prev1, acc_first1) > 0.95                # ...but not by much: a surprise
assert 0.3 < on_prev1 < 0.7 and 0.3 < on_first1 < 0.7   # shared about evenly, on average
assert on_prev1 + on_first1 > 0.85                      # and spent on the two positions

# %% [markdown]
# The weight is shared about evenly, as expected, but the accuracies are **surprisingly high**:
# above 0.95, not far below the two heads'. Why is that surprising? Suppose the head gave every
# sequence the same split $a$ on $t-1$ and $b$ on $0$. Its output at $t$ would be
# $a\,v(x_{t-1}) + b\,v(x_0) + \dots$: one weighted average, in which, with $a \approx b$,
# swapping the two tokens changes almost nothing. No readout could then tell which token was
# the previous one and which the first; the best it could do is name one of the two, right half
# of the time, plus the $1/8$ of cases where both are the same token:
# $\tfrac18 + \tfrac78 \cdot \tfrac12 = \tfrac{9}{16} = 0.5625$ for each task.
#
# So the split cannot be the same for every sequence. Two measurements, at $t \ge 2$:
#
# 1. **The split per sequence**: at $t = 5$, the share $a / (a + b)$ of each of 4000 sequences,
#    and its mean for each pair of tokens $(x_{t-1}, x_0)$. If the head split evenly everywhere,
#    every share would be near 0.5.
# 2. **The split frozen**: replace each head's weights by its average pattern (the same for every
#    sequence) and read out again. We expect the one-head accuracies to fall to about
#    $9/16$, and the two heads' to stay at 1 (each of their patterns is already the same for
#    every sequence: one position).

# %%
def accuracies(model, tokens, frozen=None):
    """Accuracy of both readouts at t >= 2; `frozen` (n_heads, T, T) replaces the weights."""
    with torch.no_grad():
        x = model.embed(tokens)                                        # (B, T, d_model)
        if frozen is None:
            out = model.attn(x, mask=causal_mask(T))
        else:
            a = model.attn
            V = split_heads(x @ a.W_V + a.b_V, a.n_heads)              # (B, n_heads, T, d_k)
            out = merge_heads(frozen @ V) @ a.W_O + a.b_O              # (B, T, d_model)
        prev = (model.read_prev(out)[:, 2:].argmax(-1) == tokens[:, 1:-1]).float().mean()
        first = (model.read_first(out)[:, 2:].argmax(-1) == tokens[:, :1]).float().mean()
    return prev.item(), first.item()

tokens = torch.randint(0, n_vocab, (4000, T))
with torch.no_grad():
    w_each = model1(tokens)[2][:, 0]                                     # (4000, T, T)
share = w_each[:, 5, 4] / (w_each[:, 5, 4] + w_each[:, 5, 0])          # (4000,)
pair_mean = torch.zeros(n_vocab, n_vocab)                               # [x_{t-1}, x_0]
pair_mean.index_put_((tokens[:, 4], tokens[:, 0]), share, accumulate=True)
pair_mean /= torch.zeros(n_vocab, n_vocab).index_put_(
    (tokens[:, 4], tokens[:, 0]), torch.ones(4000), accumulate=True)
explained = 1 - (share - pair_mean[tokens[:, 4], tokens[:, 0]]).var() / share.var()

fig, (ax_h, ax_m) = plt.subplots(1, 2, figsize=(10, 3.6))
ax_h.hist(share.numpy(), bins=20, range=(0, 1))
ax_h.set(xlabel="share of the weight on t - 1, a / (a + b)", ylabel="sequences",
         title="one head, t = 5: the split per sequence")
heatmap(ax_m, pair_mean, "share on t - 1", cmap="RdBu", vmin=0, vmax=1)
ax_m.set(xlabel="first token $x_0$", ylabel="previous token $x_{t-1}$",
         title="mean share for each pair of tokens")
plt.tight_layout()
show(fig, alt=f"Left, a histogram of the one head's share of weight on t - 1 at t = 5 over 4000 "
     f"sequences, spread from near 0 to near 1 (mean {share.mean():.2f}, standard deviation "
     f"{share.std():.2f}) rather than piled at 0.5. Right, an 8 by 8 heatmap of the mean share "
     "for each pair of tokens, previous token on the rows and first token on the columns, red "
     "to blue from 0 to 1: the colour is set by the two tokens, as by a ranking of them (some "
     "rows red against most columns, some columns blue against most rows), and the diagonal, "
     "where the two tokens are the same, is near 0.5.")

frozen1 = accuracies(model1, tokens, frozen=w_each.mean(0, keepdim=True))
with torch.no_grad():
    frozen2 = accuracies(model2, tokens, frozen=model2(tokens)[2].mean(0))
print(f"share on t-1 per sequence: mean {share.mean():.2f}, standard deviation {share.std():.2f}; "
      f"the pair (x_t-1, x_0) explains {explained:.1%} of its variance")
for name, model, frozen in (("1 head: ", model1, frozen1), ("2 heads:", model2, frozen2)):
    trained = accuracies(model, tokens)
    print(f"{name} accuracy (prev, first) trained ({trained[0]:.3f}, {trained[1]:.3f}), "
          f"weights frozen ({frozen[0]:.3f}, {frozen[1]:.3f})")
print(f"a mixture that cannot tell the two tokens apart: at most 9/16 = {9 / 16:.4f}")
assert share.std() > 0.15                                 # far from an even split everywhere
assert explained > 0.9                                    # the split is set by the two tokens
assert all(abs(acc - 9 / 16) < 0.05 for acc in frozen1)   # the bound of a symmetric mixture
assert min(frozen2) > 0.99                                # two heads do not need varying weights

with torch.no_grad():
    right = model1.read_prev(model1.attn(model1.embed(tokens), mask=causal_mask(T)))[:, 5]
right = right.argmax(-1) == tokens[:, 4]                  # previous token right, at t = 5
alike = (share - 0.5).abs() < 0.1
print(f"1 head, t = 5: accuracy (prev) {right[alike].float().mean():.2f} where the share is "
      f"within 0.1 of 0.5 ({alike.float().mean():.0%} of sequences), "
      f"{right[~alike].float().mean():.2f} elsewhere")
assert right[alike].float().mean() < right[~alike].float().mean() - 0.05

# %% [markdown]
# The one head splits evenly only **on average**. Per sequence its split depends on which two
# tokens sit at $t-1$ and $0$ (the heatmap: almost all of the variance), because the keys carry
# the tokens: the head ranks the tokens, puts more weight on the higher-ranked one, and the size
# of the share then tells the readouts which token is where. Frozen to its average pattern, the
# head is the symmetric mixture above and both accuracies fall to $9/16$. Where the head ranks
# the two tokens alike (a share near 0.5) the trick cannot work, and its errors are more frequent
# there (measured below, at $t = 5$). Two heads need no such
# trick: each has one fixed position, and their results stay in separate slices of the
# concatenation, which $W_O$ routes to the two readouts.
#
# With another seed the single head may instead give up one lookup altogether:

# %%
_, acc_prev_s1, acc_first_s1, _ = train_two_lookups(n_heads=1, seed=1)
print(f"1 head, seed 1: accuracy prev {acc_prev_s1:.3f}, first {acc_first_s1:.3f}")
assert min(acc_prev_s1, acc_first_s1) < 0.5 < 0.99 < max(acc_prev_s1, acc_first_s1)

# %% [markdown]
# ## 3. Grouped-query attention and the KV cache
#
# Lesson 02 generated text one token at a time, re-running the model on the whole prefix at
# every step, and measured that the rows of the earlier positions never change. A decoder
# therefore keeps the keys and values of all earlier tokens in a **KV cache** and runs only the
# new position: per layer, per token, `n_kv_heads * d_k` numbers for $K$ and as many for $V$.
# Grouped-query attention (GQA) keeps `n_heads` query heads but only `n_kv_heads` key/value
# heads; query head number $\text{head}$ reads key/value head
# $\text{head} \,/\!/\, (n_{heads} / n_{kv\_heads})$. `n_kv_heads = 1` is multi-query attention (MQA;
# Shazeer 2019, *Fast Transformer Decoding: One Write-Head is All You Need*),
# `n_kv_heads = n_heads` ordinary multi-head attention (MHA).
#
# Which query head reads which key/value head, measured rather than read off the code: for a
# layer with 8 query heads, shift the $W_K$ columns of one key/value head and see which query
# heads' attention weights change. Drawn for MHA (8 KV heads), GQA (2) and MQA (1):

# %%
def kv_head_read_by(n_heads, n_kv_heads, d_model=64, T=6):
    """(n_heads,) the key/value head each query head reads, from the weights that change."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(d_model, n_heads, n_kv_heads)
    x, d_k = torch.randn(1, T, d_model), d_model // n_heads
    reads = torch.zeros(n_heads, n_kv_heads, dtype=torch.bool)
    with torch.no_grad():
        _, before = layer(x, mask=causal_mask(T), return_weights=True)    # (1, n_heads, T, T)
        for group in range(n_kv_heads):
            shifted = MultiHeadAttention(d_model, n_heads, n_kv_heads)
            shifted.load_state_dict(layer.state_dict())
            shifted.W_K[:, group * d_k:(group + 1) * d_k] += torch.randn(d_model, d_k)
            _, after = shifted(x, mask=causal_mask(T), return_weights=True)
            reads[:, group] = (after - before).abs().amax(dim=(0, 2, 3)) > 1e-6
    assert (reads.sum(1) == 1).all()                      # each query head reads exactly one
    return reads.int().argmax(1)


groupings = {n_kv: kv_head_read_by(8, n_kv) for n_kv in (8, 2, 1)}
fig, axes = plt.subplots(1, 3, figsize=(12, 2.8))
for ax, (n_kv, read) in zip(axes, groupings.items()):
    colours = plt.get_cmap("tab10")(np.arange(n_kv))
    for head, group in enumerate(read.tolist()):
        kv_x = (group + 0.5) * 8 / n_kv - 0.5                   # KV heads spread under their group
        ax.plot([head, kv_x], [1, 0], color=colours[group], lw=1.5)
        ax.scatter([head], [1], s=260, marker="s", color=colours[group], zorder=3)
        ax.text(head, 1, f"Q{head}", ha="center", va="center", fontsize=7, color="white", zorder=4)
    for group in range(n_kv):
        kv_x = (group + 0.5) * 8 / n_kv - 0.5
        ax.scatter([kv_x], [0], s=420, marker="o", color=colours[group], zorder=3)
        ax.text(kv_x, 0, f"KV{group}", ha="center", va="center", fontsize=7, color="white", zorder=4)
    name = {8: "MHA", 2: "GQA", 1: "MQA"}[n_kv]
    ax.set(title=f"{name}: n_heads = 8, n_kv_heads = {n_kv}", xlim=(-0.8, 7.8), ylim=(-0.45, 1.45))
    ax.axis("off")
plt.tight_layout()
show(fig, alt="Three diagrams of 8 query heads, Q0 to Q7 in a top row, joined by lines to the "
     "key/value head each one reads, in a bottom row, as measured by perturbing each KV head. "
     "MHA: 8 KV heads, each query head joined to its own. GQA with 2 KV heads: Q0 to Q3 joined "
     "to KV0, Q4 to Q7 to KV1 (consecutive groups of 4). MQA: all eight joined to the single KV0.")
print({n_kv: read.tolist() for n_kv, read in groupings.items()})
assert groupings[8].tolist() == list(range(8))
assert groupings[2].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]   # head // (n_heads / n_kv_heads)
assert groupings[1].tolist() == [0] * 8

# %% [raw] concept="gqa-group"
# question: 'Grouped-query attention with $n_{heads} = 8$ and $n_{kv\_heads} = 2$: which key/value head
#   does query head 6 read?'
# kind: choice
# options:
#   a: KV head 0
#   b: KV head 1
#   c: A KV head of its own, number 6
#   d: An average of both KV heads
# answer: b
# section: '3.'
# right: 'Consecutive groups: query head $h$ reads KV head $h \,/\!/\, (n_{heads}/n_{kv\_heads}) = 6
#   \,/\!/\, 4 = 1$; the perturbation measured heads 0-3 on KV0 and 4-7 on KV1.'
# wrong:
#   a:
#     misconception: Heads interleaved across KV heads
#     explain: 'Query head $h$ does not read KV head $h \bmod 2$: the groups are consecutive, `[0, 0,
#       0, 0, 1, 1, 1, 1]` (measured, SDPA''s `enable_gqa` grouping).'
#   c:
#     misconception: GQA keeps a KV head per query head
#     explain: That is multi-head attention ($n_{kv\_heads} = n_{heads}$); with 2 KV heads, 4 query
#       heads share each one.
#   d:
#     misconception: Query heads mix the KV heads
#     explain: 'Each query head reads exactly one KV head: perturbing the other changes nothing (the
#       cell asserts one read per head).'

# %% [markdown]
# Our module groups heads the way PyTorch's `F.scaled_dot_product_attention(..., enable_gqa=True)`
# does, and decoding step by step with a `KVCache` gives the same outputs as one full pass:

# %%
gqa = MultiHeadAttention(d_model=64, n_heads=8, n_kv_heads=2)
xg = torch.randn(2, 6, 64)
with torch.no_grad():
    full = gqa(xg, mask=causal_mask(6))
    Qg = split_heads(xg @ gqa.W_Q + gqa.b_Q, 8)             # (B, 8, T, 8)
    Kg = split_heads(xg @ gqa.W_K + gqa.b_K, 2)             # (B, 2, T, 8)
    Vg = split_heads(xg @ gqa.W_V + gqa.b_V, 2)             # (B, 2, T, 8)
    oracle = F.scaled_dot_product_attention(Qg, Kg, Vg, is_causal=True, enable_gqa=True)
    oracle = merge_heads(oracle) @ gqa.W_O + gqa.b_O
    cache = KVCache()
    steps = [gqa(xg[:, i:i + 1], mask=causal_mask(1, i + 1), cache=cache) for i in range(6)]
    stepwise = torch.cat(steps, dim=1)
print(f"max |ours - SDPA enable_gqa| = {(full - oracle).abs().max():.1e}, "
      f"max |cached steps - full| = {(stepwise - full).abs().max():.1e}")
print(f"cache holds K, V of shape {tuple(cache.K.shape)}: {cache.nbytes()} bytes")
assert torch.allclose(full, oracle, atol=1e-5) and torch.allclose(stepwise, full, atol=1e-5)
assert cache.nbytes() == kv_cache_bytes(n_layers=1, n_kv_heads=2, d_k=8, context=6, batch=2,
                                       dtype=torch.float32)   # 1536

# %% [raw] concept="cache-bytes"
# question: 'The cell''s GQA cache: 1 layer, 2 KV heads of $d_k = 8$, 6 tokens, a batch of 2, float32.
#   How many bytes does it hold?'
# kind: numeric
# answer: 1536
# tolerance: 0
# section: '3.'
# right: $2\,(K, V) \cdot 1 \cdot 2 \cdot 8 \cdot 6 \cdot 2 \cdot 4\text{ bytes} = 1536$, printed and
#   asserted against `kv_cache_bytes`.
# wrong:
#   768:
#     misconception: Only the keys are cached
#     explain: 'The cache holds the values too: the factor 2 in $2 \cdot n_{layers} \cdot n_{kv\_heads}
#       \cdot d_k \cdot$ tokens $\cdot$ bytes.'
#   6144:
#     misconception: The query heads are cached
#     explain: 'Queries are never cached, and keys and values exist once per *KV* head: 2 here, not
#       the 8 query heads.'
#   384:
#     misconception: One byte per number
#     explain: 'Float32 takes 4 bytes per number: $384 \cdot 4 = 1536$.'
#   other:
#     misconception: Not from the cache formula
#     explain: $2 \cdot n_{layers} \cdot n_{kv\_heads} \cdot d_k \cdot \text{tokens} \cdot \text{batch}
#       \cdot \text{bytes}$.

# %% [markdown]
# **Memory for published configurations.** `kv_cache_bytes` is
# $2 \cdot n_{layers} \cdot n_{kv\_heads} \cdot d_k \cdot \text{context} \cdot \text{bytes}$.
# The configurations are the published ones of each model (layers, query heads, KV heads,
# $d_k$); the "70B as MHA / MQA" rows are the same 70B shape with its KV heads changed, for
# comparison. One sequence of 4,096 tokens, bf16 (2 bytes):

# %%
configs = {   # name: (n_layers, n_heads, n_kv_heads, d_k)
    "Llama-2-7B (MHA)": (32, 32, 32, 128),
    "Mistral-7B (GQA)": (32, 32, 8, 128),
    "Falcon-7B (MQA)": (32, 71, 1, 64),
    "Llama-2-70B (GQA)": (80, 64, 8, 128),
    "70B shape as MHA": (80, 64, 64, 128),
    "70B shape as MQA": (80, 64, 1, 128),
}
GiB = 2 ** 30
print(f"{'model':20s} {'layers':>6s} {'heads':>5s} {'kv':>3s} {'d_k':>4s} "
      f"{'KiB/token':>9s} {'GiB @ 4k':>8s}")
cache_gib = {}
for name, (n_layers, n_heads, n_kv, d_k) in configs.items():
    nbytes = kv_cache_bytes(n_layers=n_layers, n_kv_heads=n_kv, d_k=d_k, context=4096, dtype="bf16")
    cache_gib[name] = nbytes / GiB
    per_token = kv_cache_bytes(n_layers=n_layers, n_kv_heads=n_kv, d_k=d_k, context=1,
                               dtype="bf16") / 1024
    print(f"{name:20s} {n_layers:6d} {n_heads:5d} {n_kv:3d} {d_k:4d} {per_token:9.0f} "
          f"{nbytes / GiB:8.3f}")
assert cache_gib["Llama-2-7B (MHA)"] == 2.0
assert cache_gib["Llama-2-70B (GQA)"] == 1.25
assert cache_gib["70B shape as MHA"] == 8 * cache_gib["Llama-2-70B (GQA)"] == 10.0
assert abs(cache_gib["Falcon-7B (MQA)"] - 0.03125) < 1e-12

# %% [raw] concept="cache-7b-vs-70b"
# question: 'One sequence of 4,096 tokens in bf16: which KV cache is larger, Llama-2-7B''s (MHA, 32
#   KV heads) or Llama-2-70B''s (GQA, 8 KV heads)?'
# kind: choice
# options:
#   a: Llama-2-7B's
#   b: Llama-2-70B's
#   c: They are equal
# answer: a
# section: '3.'
# right: '2 GiB for the 7B model against 1.25 GiB for the 70B one: 2.5 times the layers, but a quarter
#   of the KV heads (the printed table).'
# wrong:
#   b:
#     misconception: The cache grows with the parameter count
#     explain: 'The cache depends on layers, KV heads, $d_k$ and tokens only; the 70B model''s 8 KV
#       heads make its cache smaller than the 7B model''s 32 (printed: 1.25 against 2 GiB).'
#   c:
#     misconception: Caches depend on the context only
#     explain: 'The context is the same, but layers and KV heads differ: $80 \cdot 8$ against $32 \cdot
#       32$ KV heads in all.'

# %% [markdown]
# The 70B model's cache (1.25 GiB) is **smaller** than the 7B model's (2 GiB), although it has
# 2.5 times the layers and twice the width: 8 KV heads instead of 32 (or 64) cut it by 8. As MHA
# it would need 10 GiB per 4k-token sequence. The cache grows
# linearly with the context (and with the batch):

# %%
contexts = np.array([1024, 2048, 4096, 8192, 16384, 32768])
fig, ax = plt.subplots(figsize=(6.5, 3.6))
for name in ("70B shape as MHA", "Llama-2-7B (MHA)", "Llama-2-70B (GQA)", "Falcon-7B (MQA)"):
    n_layers, _, n_kv, d_k = configs[name]
    gib = [kv_cache_bytes(n_layers=n_layers, n_kv_heads=n_kv, d_k=d_k, context=int(c), dtype="bf16")
           / GiB for c in contexts]
    ax.plot(contexts, gib, marker="o", label=name)
ax.set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="KV cache (GiB, bf16)",
       title="KV cache of one sequence")
ax.set_xticks(contexts, [f"{c // 1024}k" for c in contexts])
ax.legend(fontsize=8)
plt.tight_layout()
show(fig, alt="Log-log plot of the KV cache of one sequence in GiB (bf16) against the context, 1k "
     "to 32k tokens, for four models: four parallel straight lines rising one decade per decade "
     "of context. From top to bottom: the 70B shape as MHA (10 GiB at 4k), Llama-2-7B (2 GiB at "
     "4k), Llama-2-70B with 8 KV heads (1.25 GiB at 4k), Falcon-7B with one KV head (0.03 GiB "
     "at 4k).")

# %% [markdown]
# Those lines come from the formula. Measured instead on the bytes a real cache holds: decode
# 64 tokens one at a time through a layer with 8 query heads, and read the storage of the
# cache's $K$ and $V$ tensors after each step. We expect the formula's bytes at every length
# (a cache that over-allocated, for instance doubling its buffer, would show steps), a log-log
# slope of 1, and a cache $n_{heads} / n_{kv\_heads}$ times smaller with fewer KV heads.

# %%
def cache_bytes_while_decoding(n_kv_heads, steps=64, d_model=64, n_heads=8):
    torch.manual_seed(0)
    layer, cache, held = MultiHeadAttention(d_model, n_heads, n_kv_heads), KVCache(), []
    x = torch.randn(1, steps, d_model)
    with torch.no_grad():
        for i in range(steps):
            layer(x[:, i:i + 1], mask=causal_mask(1, i + 1), cache=cache)
            held.append(cache.K.untyped_storage().nbytes() + cache.V.untyped_storage().nbytes())
    return np.array(held)


lengths = np.arange(1, 65)
held = {n_kv: cache_bytes_while_decoding(n_kv) for n_kv in (8, 2, 1)}
formula = {n_kv: np.array([kv_cache_bytes(n_layers=1, n_kv_heads=n_kv, d_k=8, context=int(S),
                                          dtype=torch.float32) for S in lengths])
           for n_kv in held}
slopes = {n_kv: np.polyfit(np.log(lengths), np.log(b), 1)[0] for n_kv, b in held.items()}
print("bytes held after 1, 2, 64 tokens:",
      {n_kv: [int(b[0]), int(b[1]), int(b[-1])] for n_kv, b in held.items()})
print("log-log slope of the held bytes vs context:", {k: round(float(v), 4) for k, v in slopes.items()})
for n_kv in held:
    assert np.array_equal(held[n_kv], formula[n_kv])           # the formula, byte for byte
    assert abs(slopes[n_kv] - 1.0) < 1e-3                      # linear in the context
assert np.array_equal(held[8], 4 * held[2]) and np.array_equal(held[8], 8 * held[1])

# %% [markdown]
# GQA also shrinks $W_K$ and $W_V$ to `(d_model, n_kv_heads * d_k)`. For a 70B layer's attention
# that saves a good share of the attention's parameters (printed below), but the memory of the
# cache is the bigger point:

# %%
d_model_70b, d_k_70b = 8192, 128
w_mha = 4 * d_model_70b * d_model_70b
w_gqa = 2 * d_model_70b * d_model_70b + 2 * d_model_70b * 8 * d_k_70b
print(f"attention weights per 70B layer: MHA {w_mha / 1e6:.0f} M, GQA (8 KV heads) "
      f"{w_gqa / 1e6:.0f} M ({1 - w_gqa / w_mha:.0%} fewer)")
small = MultiHeadAttention(64, 8, 2, bias=False)
assert count(small) == 2 * 64 * 64 + 2 * 64 * 2 * 8
assert abs(1 - w_gqa / w_mha - 0.4375) < 1e-12

# %% [markdown]
# ## Summary
#
# - Heads split the projected features $x W_Q$, $x W_K$, $x W_V$ (each $d_{model}$ wide) into
#   $n_{heads}$ slices of $d_k$; they add no parameters, and the
#   output is a sum of per-head contributions through $W_O$.
# - Trained on a task that needs two lookups, two heads specialise (previous token, first
#   token). One head of the same width splits its weight about evenly *on average* and still
#   scores above 0.95, because its split changes with the tokens; frozen to its average split it
#   falls to the 9/16 of a mixture that cannot tell the two tokens apart.
# - A KV cache keeps the keys and values of earlier positions (lesson 02 showed they never
#   change), so each new token costs one position; cached decoding equals the full pass.
# - GQA/MQA share key/value heads across query heads: measured, query head $\text{head}$ reads
#   key/value head $\text{head} \,/\!/\, (n_{heads} / n_{kv\_heads})$ (SDPA's `enable_gqa`
#   grouping). The KV cache a real decoding run holds equals the formula byte for byte at every
#   length (slope 1 in the context) and shrinks by $n_{heads} / n_{kv\_heads}$: 2 GiB for
#   Llama-2-7B vs 1.25 GiB for Llama-2-70B at 4k tokens in bf16.
#
# **Exercises:** [`work/03_heads.ipynb`](../work/03_heads.ipynb) (split/merge heads; a multi-head forward pass; sharing
# keys and values across query heads; KV-cache memory).
