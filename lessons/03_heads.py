# %% [markdown]
# # 03 Multi-head and grouped-query attention
#
# One attention head produces one weighted average per query: it can look at one "kind" of
# place at a time. Multi-head attention runs several heads side by side, each in its own slice of
# the features, and mixes their results with $W_O$ (Vaswani et al. 2017, section 3.2.2):
#
# $$\text{MultiHead}(x) = \text{Concat}(\text{head}_1, \dots, \text{head}_h)\, W_O, \qquad
#   \text{head}_i = \text{Attention}(x W_Q^i,\; x W_K^i,\; x W_V^i),$$
#
# with $d_k = d_{model} / n_{heads}$ per head. Grouped-query attention (Ainslie et al. 2023) then
# lets several query heads share one key/value head, which shrinks the key/value cache that
# text generation keeps in memory. Every claim is measured and ends in an `assert`.
#
# The code: `txlearn.heads` (`split_heads`, `merge_heads`, `MultiHeadAttention`, `KVCache`,
# `kv_cache_bytes`).

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F

from txlearn.heads import KVCache, MultiHeadAttention, kv_cache_bytes, merge_heads, split_heads
from txlearn.masks import causal_mask
from txlearn.plotting import heatmap

torch.manual_seed(0)
torch.set_num_threads(1)  # the tensors here are tiny: one thread is fastest on a shared CPU

# %% [markdown]
# ## 1. Heads are slices of the features
#
# `split_heads` reshapes `(B, T, d_model)` into `(B, n_heads, T, d_k)`: head $h$ gets the
# contiguous features $h\,d_k \dots (h+1)\,d_k - 1$ of every position. `merge_heads` undoes it.
# On a tiny example with $d_{model} = 6$ and 3 heads:

# %%
x = torch.arange(12.0).reshape(1, 2, 6)      # B = 1, T = 2, d_model = 6
heads = split_heads(x, n_heads=3)            # (1, 3, 2, 2)
print("x[0] =", x[0].tolist())
for h in range(3):
    print(f"head {h}:", heads[0, h].tolist())
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

# %% [markdown]
# Our module computes exactly what `nn.MultiheadAttention` computes once the weights are copied
# across (PyTorch stores `(d_out, d_in)`; we transpose at the loading boundary). And because
# $W_O$ acts on the concatenation, the output is a **sum over heads**: head $h$'s output times
# its own block of rows of $W_O$.

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
    blocks = mha.W_O.reshape(8, d_k, d_model)           # (8, d_k, d_model): rows of head h
    summed = sum(per_head[:, h] @ blocks[h] for h in range(8)) + mha.b_O
print(f"max |out - sum over heads| = {(out - summed).abs().max():.1e}")
assert torch.allclose(out, summed, atol=1e-5)

# %% [markdown]
# ## 2. Heads specialise
#
# A small synthetic task needs two different lookups at once: at every position $t \ge 1$,
# predict **the previous token** $x_{t-1}$ and **the first token** $x_0$. A single attention layer
# (causal mask, token plus learned position embeddings, $d_{model} = 32$) with two heads is
# trained for 150 steps; then we draw each head's average attention pattern.

# %%
VOCAB, T, D = 8, 8, 32

class TwoLookups(torch.nn.Module):
    def __init__(self, n_heads):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, D)
        self.pos = torch.nn.Embedding(T, D)
        self.attn = MultiHeadAttention(D, n_heads)
        self.read_prev = torch.nn.Linear(D, VOCAB)
        self.read_first = torch.nn.Linear(D, VOCAB)

    def forward(self, tokens):                          # tokens (B, T)
        h = self.tok(tokens) + self.pos(torch.arange(T))    # (B, T, D)
        out, w = self.attn(h, mask=causal_mask(T), return_weights=True)
        return self.read_prev(out), self.read_first(out), w

def train_two_lookups(n_heads, steps=150, seed=0):
    torch.manual_seed(seed)
    model = TwoLookups(n_heads)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        tokens = torch.randint(0, VOCAB, (64, T))
        prev_logits, first_logits, _ = model(tokens)
        loss = (F.cross_entropy(prev_logits[:, 1:].reshape(-1, VOCAB), tokens[:, :-1].reshape(-1))
                + F.cross_entropy(first_logits[:, 1:].reshape(-1, VOCAB),
                                  tokens[:, :1].expand(-1, T - 1).reshape(-1)))
        opt.zero_grad()
        loss.backward()
        opt.step()
    tokens = torch.randint(0, VOCAB, (512, T))
    with torch.no_grad():
        prev_logits, first_logits, w = model(tokens)
    acc_prev = (prev_logits[:, 1:].argmax(-1) == tokens[:, :-1]).float().mean().item()
    acc_first = (first_logits[:, 1:].argmax(-1) == tokens[:, :1]).float().mean().item()
    return acc_prev, acc_first, w.mean(0)               # w.mean(0): (n_heads, T, T)

acc_prev, acc_first, w2 = train_two_lookups(n_heads=2)
t = torch.arange(2, T)                                  # t >= 2: t - 1 and 0 differ
on_prev = w2[:, t, t - 1].mean(-1)                      # (n_heads,)
on_first = w2[:, t, 0].mean(-1)
print(f"2 heads: accuracy prev {acc_prev:.3f}, first {acc_first:.3f}")
for h in range(2):
    print(f"  head {h}: weight on t-1 = {on_prev[h]:.3f}, on position 0 = {on_first[h]:.3f}")
assert min(acc_prev, acc_first) > 0.99
assert on_prev.max() > 0.95 and on_first.max() > 0.95
assert on_prev.argmax() != on_first.argmax()            # two different heads

fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
for h, ax in enumerate(axes):
    heatmap(ax, w2[h], "attention weight", cmap="Blues", vmin=0, vmax=1)
    role = "previous token" if on_prev[h] > on_first[h] else "first token"
    ax.set(title=f"head {h}: {role}", xlabel="key position", ylabel="query position")
plt.tight_layout()
plt.show()

# %% [markdown]
# The same layer with **one** head of the full width (same parameter count) and the same
# training (same seed) cannot put all its weight on two places: in this run it splits its
# attention about evenly and both accuracies drop (with other seeds it may instead give up one of
# the two lookups).

# %%
acc_prev1, acc_first1, w1 = train_two_lookups(n_heads=1)
print(f"1 head:  accuracy prev {acc_prev1:.3f}, first {acc_first1:.3f}; "
      f"weight on t-1 = {w1[0, t, t - 1].mean():.2f}, on position 0 = {w1[0, t, 0].mean():.2f}")
assert min(acc_prev1, acc_first1) < 0.99 < min(acc_prev, acc_first)

# %% [markdown]
# ## 3. Grouped-query attention and the KV cache
#
# A decoder generating text one token at a time re-uses the keys and values of all earlier
# tokens, so it keeps them in a **KV cache**: per layer, per token, `n_kv_heads * d_k` numbers for
# $K$ and as many for $V$. Grouped-query attention (GQA) keeps `n_heads` query heads but only
# `n_kv_heads` key/value heads; query head $h$ reads key/value head
# $h \,/\!/\, (n_{heads} / n_{kv\_heads})$. `n_kv_heads = 1` is multi-query attention (MQA),
# `n_kv_heads = n_heads` ordinary multi-head attention (MHA).
#
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
plt.show()
slope = np.polyfit(np.log(contexts), np.log([kv_cache_bytes(n_layers=80, n_kv_heads=8, d_k=128, context=int(c))
                                             for c in contexts]), 1)[0]
print(f"log-log slope of cache vs context: {slope:.3f}")
assert abs(slope - 1.0) < 1e-9

# %% [markdown]
# GQA also shrinks $W_K$ and $W_V$ to `(d_model, n_kv_heads * d_k)`. For a 70B layer's attention
# that saves a good share of the attention's parameters (printed below), but the memory of the
# cache is the bigger point:

# %%
d, dk = 8192, 128
w_mha = 4 * d * d
w_gqa = 2 * d * d + 2 * d * 8 * dk
print(f"attention weights per 70B layer: MHA {w_mha / 1e6:.0f} M, GQA (8 KV heads) "
      f"{w_gqa / 1e6:.0f} M ({1 - w_gqa / w_mha:.0%} fewer)")
small = MultiHeadAttention(64, 8, 2, bias=False)
assert count(small) == 2 * 64 * 64 + 2 * 64 * 2 * 8
assert abs(1 - w_gqa / w_mha - 0.4375) < 1e-12

# %% [markdown]
# ## Summary
#
# - Heads split $d_{model}$ into $n_{heads}$ slices of $d_k$; they add no parameters, and the
#   output is a sum of per-head contributions through $W_O$.
# - Trained on a task that needs two lookups, two heads specialise (previous token, first
#   token); one head of the same width, trained the same way, does worse.
# - GQA/MQA share key/value heads across query heads (grouping as SDPA's `enable_gqa`); the KV
#   cache shrinks by $n_{heads} / n_{kv\_heads}$: 2 GiB for Llama-2-7B vs 1.25 GiB for
#   Llama-2-70B at 4k tokens in bf16.
#
# **Exercises:** [`work/03_heads.ipynb`](../work/03_heads.ipynb) (split/merge heads; a multi-head forward pass; sharing
# keys and values across query heads; KV-cache memory).
