# %% [markdown]
# # 08 · What a layer costs, counted and measured
#
# The paper's Table 1 compares layer types by three numbers: the work per layer, the sequential
# operations (steps that cannot run in parallel), and the maximum path length between two
# positions. For self-attention it gives $O(T^2 d)$, $O(1)$, $O(1)$; for a recurrent layer
# $O(T d^2)$, $O(T)$, $O(T)$. This lesson counts parameters and FLOPs exactly, then *measures*
# time, memory, sequential steps and path length on this machine, and fills the table with the
# measured numbers beside the formulas. It ends with a tiled attention whose memory grows only
# linearly in T.
#
# Conventions: FLOPs = 2 x multiply-accumulates of the matrix products (softmax, norms and bias
# adds are of lower order and not counted); a time is the fastest of a few repeated runs (other
# programs on the machine can only add time); peak memory is read from the PyTorch profiler's
# allocation events (`txlearn.complexity.peak_memory_bytes`), which see PyTorch's own CPU
# allocations (Python's `tracemalloc` does not). We time on one CPU thread, so that the slopes
# measure work rather than how threads are scheduled on a shared machine.

# %%
import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn

from txlearn import complexity as cx
from txlearn.attention import scaled_dot_product_attention
from txlearn.heads import kv_cache_bytes
from txlearn.layer import TransformerLayer

torch.manual_seed(0)
threads_before = torch.get_num_threads()
torch.set_num_threads(1)


def measured_ticks(ax, x):
    """Label the x axis of a log-log plot with the measured values only."""
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.set_xticks(x, [str(v) for v in x])


def loglog(ax, x, ys, title, ylabel):
    for label, y in ys.items():
        slope = cx.fit_loglog_slope(x, y)
        ax.loglog(x, y, "o-", label=f"{label} (slope {slope:.2f})")
    measured_ticks(ax, x)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)

# %% [markdown]
# ## 1. Counting: parameters
#
# One layer of the paper's base model (`d_model = 512`, 8 heads, `d_ff = 2048`), itemised.
# The closed form: attention $4d^2 + 4d$, FFN $2 d\, d_{ff} + d_{ff} + d$, two LayerNorms $4d$;
# at $d_{ff} = 4d$ that is $12 d^2 + 13 d$.

# %%
d, h, d_ff = 512, 8, 2048
table = cx.layer_param_counts(d_model=d, n_heads=h, d_ff=d_ff)
print(cx.format_table(table, "parameters"))
counted = sum(p.numel() for p in TransformerLayer(d, h, d_ff).parameters())
print(f"\nsum(p.numel()) of TransformerLayer: {counted:,};  12 d^2 + 13 d = {12 * d * d + 13 * d:,}")
assert sum(table.values()) == counted == 12 * d * d + 13 * d == 3_152_384
ffn_share = (table["FFN W_1"] + table["FFN W_2"] + table["FFN biases"]) / counted
print(f"the FFN holds {ffn_share:.1%} of the layer's parameters")
assert abs(ffn_share - 2 / 3) < 0.01

# %% [markdown]
# ### The paper's published sizes
#
# Table 3 of the paper gives 65M parameters for the base model and 213M for the big one. Both
# are encoder-decoder models: 6 encoder layers (self-attention, FFN, 2 norms) and 6 decoder
# layers (self-attention, cross-attention, FFN, 3 norms), with one embedding matrix shared by
# the encoder input, the decoder input and the output projection (section 3.4). The paper says
# only that the shared vocabulary has "about 37000 tokens"; we assume exactly 37000.

# %%
published = {"base": 65e6, "big": 213e6}
configs = {"base": (512, 8, 2048), "big": (1024, 16, 4096)}
for name, (d_m, n_h, f) in configs.items():
    rows = cx.paper_transformer_param_counts(d_model=d_m, n_heads=n_h, d_ff=f, n_vocab=37000)
    total = sum(rows.values())
    non_embedding = total - rows["shared embedding"]
    vocab_to_match = (published[name] - non_embedding) / d_m
    print(f"{name}: ours {total / 1e6:.1f}M vs published {published[name] / 1e6:.0f}M "
          f"({total / published[name] - 1:+.1%}); non-embedding {non_embedding / 1e6:.1f}M; "
          f"a vocabulary of {vocab_to_match:,.0f} would match exactly")
    if name == "base":
        base_total, base_vocab = total, vocab_to_match
    else:
        big_total, big_vocab = total, vocab_to_match
assert abs(base_total / 65e6 - 1) < 0.04 and abs(big_total / 213e6 - 1) < 0.01

# oracle: PyTorch's own encoder-decoder at the base size (it adds one final norm per stack)
ref = nn.Transformer(512, 8, 6, 6, 2048, batch_first=True)
ours = sum(cx.paper_transformer_param_counts(d_model=512, n_heads=8, d_ff=2048, n_vocab=0,
                                                final_norms=True).values())
assert sum(p.numel() for p in ref.parameters()) == ours
del ref

# %% [markdown]
# Our count is 3% under the published base figure and 0.6% over the big one. No single
# vocabulary explains both: the base figure needs about 40,700 tokens, the big one about
# 35,800 (printed above). The published numbers are rounded and the vocabulary is only "about 37000"
# (the released models used slightly different vocabularies per task), so a gap of a few
# percent is what the information in the paper allows; the layers themselves (the
# non-embedding parameters, 44.1M and 176.4M) are fixed by the architecture.

# %%
assert 40_000 < base_vocab < 41_500 and 35_500 < big_vocab < 36_500

# %% [markdown]
# ## 2. Counting: FLOPs and memory
#
# Forward FLOPs of one base layer on one sequence of T = 512 tokens, itemised. Note that the
# scores and the weighted sum are counted apart from the projections: they are the only terms
# with $T^2$. The number of heads cancels out of them ($n_{heads}$ heads of width
# $d_k = d/n_{heads}$).

# %%
T = 512
flops = cx.layer_flops(T=T, d_model=d, n_heads=h, d_ff=d_ff)
print(cx.format_table(flops, "FLOPs"))
quadratic = flops["scores Q K^T"] + flops["weighted sum A V"]
print(f"T^2 terms: {quadratic / sum(flops.values()):.1%} of the layer at T = {T}")
assert quadratic == 4 * T * T * d
assert (cx.attention_flops(T=T, d_model=d, n_heads=1) == cx.attention_flops(T=T, d_model=d, n_heads=16)
        == 8 * T * d * d + 4 * T * T * d)

# the T^2 terms (4 T^2 d) overtake the rest of the layer (8 T d^2 + 4 T d d_ff = 24 T d^2) at T = 6 d
T_star = next(t for t in range(1, 10 * d) if 4 * t * t * d >= 24 * t * d * d)
print(f"the T^2 terms are half the layer's FLOPs from T = {T_star} = {T_star / d:.0f} d")
assert T_star == 6 * d

# %% [markdown]
# Memory: the tensors one layer creates on a batch of 8 sequences of 512 tokens in float32, and
# a KV cache for the whole 6-layer stack in bfloat16. The attention matrices are the only rows
# that grow as $T^2$; the cache grows linearly.

# %%
act = cx.activation_bytes(B=8, T=512, d_model=d, n_heads=h, d_ff=d_ff, bytes_per_value=4)
print(cx.format_table({k: v / 2**20 for k, v in act.items()}, "MiB"))
cache = kv_cache_bytes(n_layers=6, n_kv_heads=8, d_k=64, context=512, batch=8, dtype="bf16")
print(f"KV cache, 6 layers, B = 8, T = 512, bf16: {cache / 2**20:.0f} MiB")
assert act["scores"] == 8 * 8 * 512 * 512 * 4 == 64 * 2**20
assert cache == 2 * 6 * 8 * 64 * 512 * 8 * 2 == 48 * 2**20

# %% [markdown]
# ## 3. Measuring attention: time and memory against T and against d
#
# The course's attention (lesson 02: scores, masked softmax, weighted sum) on one head. Against
# T at fixed d = 64 the work is $4 T^2 d$ and the attention matrix holds $T^2$ numbers, so both
# slopes on a log-log plot should be near 2. We fit over T = 256 ... 4096, a range of 16, wide
# enough that the fixed cost of a call (microseconds) does not matter.

# %%
def attention_call(T, d):
    Q, K, V = (torch.randn(1, T, d) for _ in range(3))
    return lambda: scaled_dot_product_attention(Q, K, V)

Ts = [256, 512, 1024, 2048, 4096]
t_T = cx.measure(lambda t: attention_call(t, 64), Ts, "time", repeats=3)
m_T = cx.measure(lambda t: attention_call(t, 64), Ts, "memory")
ds = [256, 512, 1024, 2048, 4096]
t_d = cx.measure(lambda dd: attention_call(256, dd), ds, "time", repeats=3)
m_d = cx.measure(lambda dd: attention_call(256, dd), ds, "memory")

fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
loglog(axes[0], Ts, {"time (s)": t_T, "peak memory (GB)": m_T / 1e9}, "against T (d = 64)", "")
loglog(axes[1], ds, {"time (s)": t_d, "peak memory (GB)": m_d / 1e9}, "against d (T = 256)", "")
axes[0].set_xlabel("T")
axes[1].set_xlabel("d")
plt.show()
slope_t_T, slope_m_T = cx.fit_loglog_slope(Ts, t_T), cx.fit_loglog_slope(Ts, m_T)
slope_t_d, slope_m_d = cx.fit_loglog_slope(ds, t_d), cx.fit_loglog_slope(ds, m_d)
per_entry_ns = t_T / np.array(Ts, dtype=float) ** 2 * 1e9
print(f"against T: time slope {slope_t_T:.2f}, memory slope {slope_m_T:.2f}")
print("  time per attention-matrix entry (ns):", np.round(per_entry_ns, 1))
print(f"against d: time slope {slope_t_d:.2f}, memory slope {slope_m_d:.2f}")
assert 1.5 < slope_t_T < 3.0  # 2.2 to 2.4 in our runs: see below
assert 1.9 < slope_m_T < 2.1
assert per_entry_ns[-1] > 1.3 * per_entry_ns[:3].min()  # an entry costs more once matrices are large
assert 0.6 < slope_t_d < 1.4
assert 0.5 < slope_m_d < 1.1  # T d outputs grow, the T^2 matrices do not

# %% [markdown]
# Memory grows as $T^2$ to the byte. Time grows *faster* than the $T^2$ that the FLOP count
# predicts over this range (a slope of 2.2 to 2.4 in our runs, not 2): each entry of the
# attention matrix costs more at T = 4096 than at T = 512 (2 to 4 times in our runs; the printed
# ns per entry). At T = 512
# a $T \times T$ matrix takes 1 MiB and stays in this CPU's caches (1 MiB L2, 32 MiB L3); at
# T = 4096 it takes 64 MiB, and the softmax's passes over it wait for main memory. "Attention
# time is quadratic in T" describes the work; the time on a real machine also pays for moving
# the matrix, which is what tiled attention (section 7) avoids.
#
# Against d at fixed T, the work $4T^2 d$ grows linearly, and the memory too, once the
# $T \times d$ outputs outweigh the $T \times T$ matrices (which do not depend on d).
# A warning about the common "attention is $O(T^2 d)$, so time is linear in d" at short T and
# small d: there, the softmax's $T^2$ element-wise passes, not the $4T^2d$ multiply-adds,
# dominate, and the measured time hardly moves with d. That is why we measured against d at
# T = 256 and d from 256 to 4096.
#
# ## 4. A recurrent layer, measured the same way
#
# An Elman RNN, $h_t = \tanh(x_t W_x + h_{t-1} W_h + b)$ (`txlearn.complexity.recurrent_layer`,
# tested equal to `torch.nn.RNN`): $4 T d^2$ FLOPs, linear in T. Against d we use a batch of 16
# sequences so that each step's product is large enough to measure; with one sequence and
# small d, the per-step overhead of the Python loop hides the $d^2$.

# %%
def rnn_call(T, d, B=1):
    x = torch.randn(B, T, d)
    W_x, W_h, b = torch.randn(d, d) / math.sqrt(d), torch.randn(d, d) / math.sqrt(d), torch.zeros(d)
    return lambda: cx.recurrent_layer(x, W_x, W_h, b)

Ts_rnn = [256, 512, 1024, 2048, 4096]
r_T = cx.measure(lambda t: rnn_call(t, 64), Ts_rnn, "time", repeats=3)
rm_T = cx.measure(lambda t: rnn_call(t, 64), Ts_rnn, "memory")
ds_rnn = [256, 512, 1024, 2048]
r_d = cx.measure(lambda dd: rnn_call(32, dd, B=16), ds_rnn, "time", repeats=3)
rm_d = cx.measure(lambda dd: rnn_call(32, dd, B=16), ds_rnn, "memory")

fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
loglog(axes[0], Ts_rnn, {"time (s)": r_T, "peak memory (GB)": rm_T / 1e9}, "RNN against T (d = 64)", "")
loglog(axes[1], ds_rnn, {"time (s)": r_d, "peak memory (GB)": rm_d / 1e9},
       "RNN against d (T = 32, B = 16)", "")
axes[0].set_xlabel("T")
axes[1].set_xlabel("d")
plt.show()
slope_r_T, slope_rm_T = cx.fit_loglog_slope(Ts_rnn, r_T), cx.fit_loglog_slope(Ts_rnn, rm_T)
slope_r_d, slope_rm_d = cx.fit_loglog_slope(ds_rnn, r_d), cx.fit_loglog_slope(ds_rnn, rm_d)
print(f"RNN against T: time slope {slope_r_T:.2f}, memory slope {slope_rm_T:.2f}; "
      f"against d: time slope {slope_r_d:.2f}, memory slope {slope_rm_d:.2f}")
assert 0.7 < slope_r_T < 1.3 and 0.9 < slope_rm_T < 1.1  # linear in T: no T x T matrix
assert 1.2 < slope_r_d < 2.5  # the d x d products
assert 0.9 < slope_rm_d < 1.1  # the states are T x d: memory is linear in d

# %% [markdown]
# ### Where attention and the RNN cross
#
# At d = 256: attention's $4T^2 d$ FLOPs equal the RNN's $4 T d^2$ exactly at T = d. The
# measured times cross much later (on this machine between T = 4d and 8d; the line printed
# below says where): the RNN runs T small dependent steps, each too small to run at full speed,
# while attention does its work in a few large batched products.

# %%
d_x = 256
Ts_x = [64, 128, 256, 512, 1024, 2048]
a_x = cx.measure(lambda t: attention_call(t, d_x), Ts_x, "time", repeats=3)
r_x = cx.measure(lambda t: rnn_call(t, d_x), Ts_x, "time", repeats=3)
plt.figure(figsize=(6, 3.8))
plt.loglog(Ts_x, a_x, "o-", label="attention (course's)")
plt.loglog(Ts_x, r_x, "s-", label="RNN")
plt.axvline(d_x, color="grey", ls=":", label="T = d (equal FLOPs)")
measured_ticks(plt.gca(), Ts_x)
plt.xlabel("T")
plt.ylabel("time (s)")
plt.title(f"d = {d_x}")
plt.legend()
plt.show()
ratio_at_d = r_x[Ts_x.index(d_x)] / a_x[Ts_x.index(d_x)]
faster = [t for t, a, r in zip(Ts_x, a_x, r_x) if r < a]
print(f"at T = d = {d_x} (equal FLOPs) the RNN takes {ratio_at_d:.0f}x attention's time; "
      f"measured crossing: {'T = ' + str(faster[0]) if faster else 'beyond T = 2048'}")
assert ratio_at_d > 2  # equal FLOPs, yet the sequential RNN is several times slower
assert not faster or faster[0] >= 4 * d_x  # if the RNN wins at all, only far beyond T = d

# %% [markdown]
# So "attention is cheaper than recurrence when T < d" (the paper's remark under Table 1)
# is a statement about FLOPs. On this CPU, measured, attention is faster well beyond T = d,
# because the RNN's cost is dominated by its sequential steps, which section 5 counts.
#
# ## 5. Sequential steps and path length
#
# **Sequential steps.** The RNN cannot compute $h_t$ before $h_{t-1}$: T dependent steps.
# Attention computes all T outputs in one batched step. Below, the time per sequential step of
# the RNN stays roughly constant as T grows (so the total grows like T). At T = 1024, d = 64
# attention does 16 times the RNN's FLOPs, yet its one batched step runs them at a far higher
# rate than the RNN's 1024 small steps.
#
# **Path length.** How many matrix products separate input position 0 from output position
# T - 1? We read it off the autograd graph (`matmul_path_length`): for the RNN it is T, for
# attention 3 (a projection, the scores, the weighted sum), whatever T.

# %%
per_step = r_T / np.array(Ts_rnn)
print("RNN time per sequential step (us):", np.round(per_step * 1e6, 1))
assert per_step.max() / per_step.min() < 3  # about constant: total time ~ T steps

T_s = 1024
t_attn_s, t_rnn_s = t_T[Ts.index(T_s)], r_T[Ts_rnn.index(T_s)]
flops_attn_s, flops_rnn_s = 4 * T_s * T_s * 64, 4 * T_s * 64 * 64
rate_attn, rate_rnn = flops_attn_s / t_attn_s / 1e9, flops_rnn_s / t_rnn_s / 1e9
print(f"T = {T_s}, d = 64: attention, 1 batched step: {t_attn_s * 1e3:.1f} ms for "
      f"{flops_attn_s / 1e6:.0f} MFLOP ({rate_attn:.1f} GFLOP/s); RNN, {T_s} steps: "
      f"{t_rnn_s * 1e3:.1f} ms for {flops_rnn_s / 1e6:.0f} MFLOP ({rate_rnn:.1f} GFLOP/s)")
assert rate_attn > 2 * rate_rnn  # the batched step uses the hardware far better

path_rnn, path_attn = [], []
for T_p in (4, 16, 64):
    x = torch.randn(1, T_p, 8, requires_grad=True)
    W_x, W_h = torch.randn(8, 8), torch.randn(8, 8)
    h_all = cx.recurrent_layer(x, W_x, W_h, torch.zeros(8))
    path_rnn.append(cx.matmul_path_length(h_all[:, -1], x))
    Q, K, V = x @ W_x, x @ W_h, x @ W_x
    path_attn.append(cx.matmul_path_length(scaled_dot_product_attention(Q, K, V)[:, -1], x))
print("T = 4, 16, 64: RNN path", path_rnn, " attention path", path_attn)
assert path_rnn == [4, 16, 64] and path_attn == [3, 3, 3]

# %% [markdown]
# ## 6. The paper's Table 1, with measured numbers
#
# Formulas from the paper; measured values from sections 3–5 on this machine.

# %%
rows = [
    ("self-attention", "O(T^2 d)", f"T^{slope_t_T:.2f}, d^{slope_t_d:.2f}", "O(1)", "1 batched step",
     "O(1)", f"{path_attn[-1]} at T = 64"),
    ("recurrent", "O(T d^2)", f"T^{slope_r_T:.2f}, d^{slope_r_d:.2f}", "O(T)", f"T steps, ~{np.median(per_step) * 1e6:.0f} us each",
     "O(T)", f"{path_rnn[-1]} at T = 64"),
]
header = ("layer", "per layer", "time measured", "sequential", "measured", "path length", "measured")
widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
for r in [header] + rows:
    print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))

# %% [markdown]
# ## 7. Tiled attention: the same output, memory linear in T
#
# The $T \times T$ matrix is what makes attention's memory quadratic. It is not needed all at
# once: process the keys in blocks, and keep per query a running max $m$, a running sum
# $l = \sum_j e^{s_j - m}$ and an unnormalised output $acc = \sum_j e^{s_j - m} v_j$. A new
# block with scores $s$ is merged by
#
# $$m' = \max(m, \max_j s_j),\quad \alpha = e^{m - m'},\quad l' = \alpha l + \sum_j e^{s_j - m'},
#   \quad acc' = \alpha\, acc + e^{s - m'} V,$$
#
# and the output is $acc / l$ after the last block. The rescaling by $\alpha$ corrects what was
# summed against an older, smaller max (the online softmax; FlashAttention is this, tiled for
# a GPU's fast memory). Equal to ordinary attention, masks included:

# %%
Q, K, V = (torch.randn(2, 1000, 64, dtype=torch.float64) for _ in range(3))
causal = torch.ones(1000, 1000, dtype=torch.bool).tril()
diff = (cx.tiled_attention(Q, K, V, causal, block_size=96)
        - scaled_dot_product_attention(Q, K, V, causal)).abs().max().item()
print(f"tiled (block 96, which does not divide 1000) vs ordinary, causal, float64: max |diff| = {diff:.1e}")
assert diff < 1e-12

Ts_m = Ts  # the lengths of section 3
def tiled_call(T):
    Q, K, V = (torch.randn(1, T, 64) for _ in range(3))
    return lambda: cx.tiled_attention(Q, K, V, block_size=128)
m_tiled = cx.measure(tiled_call, Ts_m, "memory")
m_plain = m_T  # ordinary attention at the same T and d, measured in section 3
plt.figure(figsize=(6, 3.8))
plt.loglog(Ts_m, m_plain / 2**20, "o-", label=f"ordinary (slope {cx.fit_loglog_slope(Ts_m, m_plain):.2f})")
plt.loglog(Ts_m, m_tiled / 2**20, "s-", label=f"tiled, block 128 (slope {cx.fit_loglog_slope(Ts_m, m_tiled):.2f})")
measured_ticks(plt.gca(), Ts_m)
plt.xlabel("T")
plt.ylabel("peak memory (MiB)")
plt.legend()
plt.show()
print(f"at T = 4096: ordinary {m_plain[-1] / 2**20:.0f} MiB, tiled {m_tiled[-1] / 2**20:.1f} MiB "
      f"({m_tiled[-1] / m_plain[-1]:.1%})")
assert 0.9 < cx.fit_loglog_slope(Ts_m, m_tiled) < 1.05
assert m_tiled[-1] < m_plain[-1] / 10

# %% [markdown]
# ## What we measured
#
# - A base layer has $12d^2 + 13d$ = 3,152,384 parameters, two thirds in the FFN; the paper's
#   base and big models count 63.1M and 214.2M with a 37000-token shared vocabulary (published:
#   65M and 213M; no single vocabulary matches both).
# - Attention's time and memory grow as $T^2$ (slopes near 2); time against d is linear only
#   once the products, not the softmax, dominate.
# - An RNN's time grows as T, and at equal FLOPs (T = d) it is several times slower than
#   attention: its T sequential steps, not its FLOPs, set its speed. Its path length is T;
#   attention's is 3.
# - Tiled attention with an online softmax equals ordinary attention and its memory grows
#   linearly in T.
#
# Speed against PyTorch's built-ins (SDPA, `nn.MultiheadAttention`) is measured in
# `benchmarks/run.py`. Exercises: [`work/08_complexity.ipynb`](../work/08_complexity.ipynb).

# %%
torch.set_num_threads(threads_before)  # give the kernel its threads back
