# %% [markdown]
# # 08 · What a layer costs, counted and measured
#
# The paper's Table 1 compares layer types by three numbers: the work per layer, the sequential
# operations (steps that cannot run in parallel), and the maximum path length between two
# positions. For self-attention it gives $O(T^2 d_{model})$, $O(1)$, $O(1)$; for a recurrent layer
# $O(T d_{model}^2)$, $O(T)$, $O(T)$. This lesson counts parameters and FLOPs exactly, then *measures*
# time, memory, sequential steps and path length on this machine, and fills the table with the
# measured numbers beside the formulas. It ends with a tiled attention whose memory grows only
# linearly in T in inference, and FlashAttention, whose memory stays linear in training too.
#
# Conventions: FLOPs = 2 x multiply-accumulates of the matrix products (softmax, norms and bias
# adds are of lower order and not counted); peak memory is read from the PyTorch profiler's
# allocation events (`txlearn.measuring.peak_memory_bytes`), which see PyTorch's own CPU
# allocations (Python's `tracemalloc` does not). We compute on one CPU thread and time it by that
# thread's **CPU time** (`clock="cpu"`, `time.thread_time`), the fastest of a few repeated runs:
# the work of the call, including the operating system's work on its behalf, but not the time it
# waits while other programs use the CPU. On a shared machine a long call waits more often than a
# short one, so wall-clock times would bend every slope upwards (on our busy machine they did, by
# up to 0.5); on a quiet machine the two clocks agree.
#
# Symbols: see [the notation table](00_map.ipynb#Notation).

# %%
import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn

from txlearn.attention import scaled_dot_product_attention
from txlearn.counting import (activation_bytes, attention_flops, format_table, layer_flops,
                              layer_param_counts, paper_transformer_param_counts)
from txlearn.flash_attention import online_softmax_update_np, tiled_attention
from txlearn.heads import kv_cache_bytes
from txlearn.layer import TransformerLayer
from txlearn.measuring import fit_loglog_slope, measure, peak_memory_bytes, time_callable
from txlearn.plotting import show
from txlearn.recurrent import matmul_path_length, recurrent_layer

torch.manual_seed(0)
threads_before = torch.get_num_threads()
torch.set_num_threads(1)
CLOCK = "cpu"  # this thread's CPU time: see the conventions above


def measured_ticks(ax, x):
    """Label the x axis of a log-log plot with the measured values only."""
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.set_xticks(x, [str(v) for v in x])


def loglog(ax, x, ys, title, ylabel):
    for label, y in ys.items():
        slope = fit_loglog_slope(x, y)
        ax.loglog(x, y, "o-", label=f"{label} (slope {slope:.2f})")
    measured_ticks(ax, x)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)

# %% [markdown]
# ## 1. Counting: parameters
#
# One layer of the paper's base model (`d_model = 512`, 8 heads, `d_ff = 2048`), itemised.
# The closed form: attention $4d_{model}^2 + 4d_{model}$, FFN $2 d_{model} d_{ff} + d_{ff} + d_{model}$,
# two LayerNorms $4d_{model}$; at $d_{ff} = 4d_{model}$ that is $12 d_{model}^2 + 13 d_{model}$.

# %%
d_model, n_heads, d_ff = 512, 8, 2048
table = layer_param_counts(d_model=d_model, n_heads=n_heads, d_ff=d_ff)
print(format_table(table, "parameters"))
counted = sum(p.numel() for p in TransformerLayer(d_model, n_heads, d_ff).parameters())
closed_form = 12 * d_model ** 2 + 13 * d_model
print(f"\nsum(p.numel()) of TransformerLayer: {counted:,};  12 d_model^2 + 13 d_model = {closed_form:,}")
assert sum(table.values()) == counted == closed_form == 3_152_384
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
    rows = paper_transformer_param_counts(d_model=d_m, n_heads=n_h, d_ff=f, n_vocab=37000)
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
ours = sum(paper_transformer_param_counts(d_model=512, n_heads=8, d_ff=2048, n_vocab=0,
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
# $d_k = d_{model}/n_{heads}$).

# %%
T = 512
flops = layer_flops(T=T, d_model=d_model, n_heads=n_heads, d_ff=d_ff)
print(format_table(flops, "FLOPs"))
quadratic = flops["scores Q K^T"] + flops["weighted sum A V"]
print(f"T^2 terms: {quadratic / sum(flops.values()):.1%} of the layer at T = {T}")
assert quadratic == 4 * T * T * d_model
assert (attention_flops(T=T, d_model=d_model, n_heads=1)
        == attention_flops(T=T, d_model=d_model, n_heads=16)
        == 8 * T * d_model ** 2 + 4 * T * T * d_model)

# the T^2 terms (4 T^2 d_model) overtake the rest of the layer (8 T d_model^2 + 4 T d_model d_ff
# = 24 T d_model^2) at T = 6 d_model
T_star = next(t for t in range(1, 10 * d_model) if 4 * t * t * d_model >= 24 * t * d_model ** 2)
print(f"the T^2 terms are half the layer's FLOPs from T = {T_star} = {T_star / d_model:.0f} d_model")
assert T_star == 6 * d_model

# %% [markdown]
# Memory: the tensors one layer creates on a batch of 8 sequences of 512 tokens in float32, and
# a KV cache for the whole 6-layer stack in bfloat16. The attention matrices are the only rows
# that grow as $T^2$; the cache grows linearly.

# %%
act = activation_bytes(B=8, T=512, d_model=d_model, n_heads=n_heads, d_ff=d_ff, bytes_per_value=4)
print(format_table({k: v / 2**20 for k, v in act.items()}, "MiB"))
cache = kv_cache_bytes(n_layers=6, n_kv_heads=8, d_k=64, context=512, batch=8, dtype="bf16")
print(f"KV cache, 6 layers, B = 8, T = 512, bf16: {cache / 2**20:.0f} MiB")
assert act["scores"] == 8 * 8 * 512 * 512 * 4 == 64 * 2**20
assert cache == 2 * 6 * 8 * 64 * 512 * 8 * 2 == 48 * 2**20

# %% [markdown]
# ## 3. Measuring attention: time and memory against T and against d_model
#
# The course's attention (lesson 02: scores, masked softmax, weighted sum) on one head of width
# $d_{model}$. Against T at fixed $d_{model} = 64$ the work is $4 T^2 d_{model}$ and the attention
# matrix holds $T^2$ numbers, so both
# slopes on a log-log plot should be near 2. We fit over T = 256 ... 4096, a range of 16, wide
# enough that the fixed cost of a call (microseconds) does not matter.

# %%
def attention_call(T, d_model):
    Q, K, V = (torch.randn(1, T, d_model) for _ in range(3))
    return lambda: scaled_dot_product_attention(Q, K, V)

Ts = [256, 512, 1024, 2048, 4096]
t_T = measure(lambda t: attention_call(t, 64), Ts, "time", repeats=3, clock=CLOCK)
m_T = measure(lambda t: attention_call(t, 64), Ts, "memory")
d_models = [256, 512, 1024, 2048, 4096]
t_d = measure(lambda d_m: attention_call(256, d_m), d_models, "time", repeats=3, clock=CLOCK)
m_d = measure(lambda d_m: attention_call(256, d_m), d_models, "memory")

fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
loglog(axes[0], Ts, {"time (s)": t_T, "peak memory (GB)": m_T / 1e9}, "against T (d_model = 64)", "")
loglog(axes[1], d_models, {"time (s)": t_d, "peak memory (GB)": m_d / 1e9},
       "against d_model (T = 256)", "")
axes[0].set_xlabel("T")
axes[1].set_xlabel("d_model")
show(fig, alt=f"Two log-log plots of attention's time in seconds and peak memory in GB. Left, "
     f"against T from 256 to 4096 at d_model = 64: both rise as straight lines, time with a "
     f"fitted slope of {fit_loglog_slope(Ts, t_T):.2f} and memory {fit_loglog_slope(Ts, m_T):.2f}. "
     f"Right, against d_model from 256 to 4096 at T = 256: flatter lines, time slope "
     f"{fit_loglog_slope(d_models, t_d):.2f} and memory slope {fit_loglog_slope(d_models, m_d):.2f}.")
slope_t_T, slope_m_T = fit_loglog_slope(Ts, t_T), fit_loglog_slope(Ts, m_T)
slope_t_d, slope_m_d = fit_loglog_slope(d_models, t_d), fit_loglog_slope(d_models, m_d)
per_entry_ns = t_T / np.array(Ts, dtype=float) ** 2 * 1e9
print(f"against T: time slope {slope_t_T:.2f}, memory slope {slope_m_T:.2f}")
print("  time per attention-matrix entry (ns):", np.round(per_entry_ns, 1))
print(f"against d_model: time slope {slope_t_d:.2f}, memory slope {slope_m_d:.2f}")
assert 1.5 < slope_t_T < 3.0  # 2.2 to 2.4 in our runs: see below
assert 1.9 < slope_m_T < 2.1
assert per_entry_ns[-1] > 1.3 * per_entry_ns[:3].min()  # an entry costs more once matrices are large
assert 0.6 < slope_t_d < 1.4
assert 0.5 < slope_m_d < 1.1  # T d_model outputs grow, the T^2 matrices do not

# %% [markdown]
# Memory grows as $T^2$ to the byte. Time grows *faster* than the $T^2$ that the FLOP count
# predicts over this range (a slope of 2.2 to 2.4 in our runs, not 2): each entry of the
# attention matrix costs more at T = 4096 than at T = 512 (the printed ns per entry). The FLOPs
# per entry are the same at every T, so the extra time must come from *where the matrix lives*.
# A $T \times T$ float32 matrix takes 1 MiB at T = 512 and 64 MiB at T = 4096. We measure the
# two explanations next rather than state them.
#
# Against $d_{model}$ at fixed T, the work $4T^2 d_{model}$ grows linearly, and the memory too,
# once the $T \times d_{model}$ outputs outweigh the $T \times T$ matrices (which do not depend
# on $d_{model}$). A warning about the common "attention is $O(T^2 d_{model})$, so time is linear
# in $d_{model}$" at short T and small $d_{model}$: there, the softmax's $T^2$ element-wise
# passes, not the $4T^2 d_{model}$ multiply-adds, dominate, and the measured time hardly moves
# with $d_{model}$. That is why we measured against $d_{model}$ at T = 256 and $d_{model}$ from
# 256 to 4096.
#
# ### Where the time per entry goes: caches and fresh memory, measured
#
# Two explanations are usual, and both can be measured. **Caches**: a CPU keeps recently used
# memory in small fast caches (L1, L2, L3, each larger and slower than the one before); an
# operation that does little arithmetic per number it reads runs at the speed of wherever its
# data lives, so its time per element should be flat while the data fits in a cache and rise
# past the last one (L3). **Fresh memory**: attention writes each large matrix into a newly
# allocated tensor, and on Linux the C library serves large blocks (above a threshold that grows
# to at most 32 MiB) straight from the operating system, which hands them out a page (4 KiB) at
# a time on first touch; so writing into fresh memory should cost extra once a matrix passes
# 32 MiB.
#
# We time, per element, over arrays from 64 KiB to 128 MiB: `a + 1` written into a preallocated
# tensor (`out=`: almost no arithmetic, only the caches matter), the same into a fresh tensor, and
# the row-wise softmax (rows of 1024) into a fresh tensor, as attention does. This CPU's cache
# sizes are read from Linux's `/sys` (nothing is assumed where they are missing).

# %%
import sys  # noqa: E402
from pathlib import Path  # noqa: E402


def cache_sizes():
    """{level: bytes} of the data caches of CPU 0, from Linux's /sys ({} elsewhere)."""
    sizes = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            text = (index / "size").read_text().strip()            # e.g. "48K", "32768K"
            level = int((index / "level").read_text())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and text[:-1].isdigit():
            sizes[level] = int(text[:-1]) * {"K": 2**10, "M": 2**20}.get(text[-1], 1)
    return sizes


caches = cache_sizes()
print("data caches: " + (", ".join(f"L{k} {v / 2**10:g} KiB" for k, v in caches.items()) or "unknown"))
n_elements = np.array([2 ** k for k in range(14, 26)])                # 64 KiB ... 128 MiB, float32
ns = {"a + 1, preallocated": [], "a + 1, fresh": [], "softmax, fresh": []}
for n in n_elements:
    a, out = torch.randn(int(n)), torch.empty(int(n))
    rows = a.view(-1, 1024)                                           # softmax over rows of 1024
    for name, fn in zip(ns, (lambda: torch.add(a, 1.0, out=out), lambda: a + 1.0,
                             lambda: torch.softmax(rows, dim=-1))):
        ns[name].append(time_callable(fn, repeats=3, clock=CLOCK) / n * 1e9)
ns = {k: np.array(v) for k, v in ns.items()}
out_bytes = n_elements * 4                                            # the output array
touched = 2 * out_bytes                                               # input + output
in_l2 = touched <= caches.get(2, touched[2])                          # fits in L2 (else: 3 smallest)
past_l3 = touched >= 4 * caches.get(3, touched[-3] / 4)               # 4x past L3 (else: 3 largest)

fig, ax = plt.subplots(figsize=(7.5, 4))
for name, values in ns.items():
    ax.loglog(touched / 2**20, values, "o-", ms=3, label=name)
for level, size in caches.items():
    ax.axvline(size / 2**20, color="grey", ls=":", lw=0.8)
    ax.text(size / 2**20, ax.get_ylim()[1], f" L{level}", va="top", fontsize=8)
ax.axvline(2 * 32, color="red", ls="--", lw=0.8, label="output of 32 MiB")
ax.set(xlabel="bytes touched: input + output (MiB)", ylabel="ns per element")
ax.legend(fontsize=8, loc="center left")
show(fig, alt=f"Log-log plot of the time per element in nanoseconds against the bytes touched "
     f"(input plus output, in MiB) for three operations: a + 1 into a preallocated output, "
     f"a + 1 into fresh memory, and a softmax into fresh memory, with dotted lines at the CPU "
     f"cache sizes it reports and a red dashed line at a 32 MiB output. The preallocated "
     f"add steps up past the last cache; both fresh-memory curves jump much higher at the red "
     f"line, the softmax the highest throughout.")
cache_cost = np.median(ns["a + 1, preallocated"][past_l3]) / np.median(ns["a + 1, preallocated"][in_l2])
fresh_cost = np.median(ns["a + 1, fresh"][past_l3] / ns["a + 1, preallocated"][past_l3])
below = (out_bytes >= 2**20) & (out_bytes <= 16 * 2**20)              # outputs of 1 to 16 MiB
fresh_below = np.median(ns["a + 1, fresh"][below] / ns["a + 1, preallocated"][below])
softmax_cost = np.median(ns["softmax, fresh"][past_l3]) / np.median(ns["softmax, fresh"][in_l2])
print(f"a + 1, preallocated: {cache_cost:.1f}x the time per element past L3 as inside L2")
print(f"a + 1 into fresh memory: {fresh_below:.1f}x the preallocated time for outputs of 1-16 MiB, "
      f"{fresh_cost:.1f}x past L3")
print(f"softmax into fresh memory: {softmax_cost:.1f}x the time per element past L3 as inside L2")
assert cache_cost > 1.3     # streaming from main memory is slower than from a cache
assert fresh_cost > 3       # fresh memory costs far more again
assert softmax_cost > 3     # and the softmax that attention runs pays both
if sys.platform == "linux":
    assert fresh_below < 2  # below the 32 MiB threshold fresh memory costs little

# %% [markdown]
# Both effects are real, and the second is larger: this surprised us. Past the last cache the
# preallocated `a + 1` takes longer per element (the printed factor; 1.7 to 2.6 in our runs);
# but writing into fresh memory beyond 32 MiB costs **7 to 10 times** more than writing into
# memory already held, and it is that jump, at an output of 32 MiB rather than at the L3 size,
# that dominates the softmax's curve.
# Attention at T = 4096 meets both: its 64 MiB score and weight matrices are written into fresh
# memory on every call and read back from main memory. (It is also why deep-learning frameworks
# keep memory pools of their own; PyTorch does on GPUs, not for CPU tensors.)
#
# The remedy is to **block** the computation. Softmax works row by row, so the queries can be
# processed in blocks of 128 rows: each block's $128 \times T$ matrix takes 2 MiB at T = 4096,
# which fits in L3 and, being below the 32 MiB threshold, is served from memory the process
# already holds. Expected: the same output, and less time for the same FLOPs. (The two are timed in
# turn, the fastest of four each, so that a busy moment of the machine hits both alike.)

# %%
def query_blocked(Q, K, V, block=128):
    """Attention computed `block` queries at a time (exact: each softmax row is independent)."""
    return torch.cat([scaled_dot_product_attention(Q[:, i:i + block], K, V)
                      for i in range(0, Q.shape[1], block)], dim=1)


Q, K, V = (torch.randn(1, 4096, 64) for _ in range(3))
block_gap = (query_blocked(Q, K, V) - scaled_dot_product_attention(Q, K, V)).abs().max().item()
t_whole = t_blocked = float("inf")
for _ in range(4):
    t_whole = min(t_whole, time_callable(lambda: scaled_dot_product_attention(Q, K, V), repeats=1,
                                                  clock=CLOCK))
    t_blocked = min(t_blocked, time_callable(lambda: query_blocked(Q, K, V), repeats=1, clock=CLOCK))
print(f"T = 4096: whole {t_whole / 4096**2 * 1e9:.1f} ns/entry, 128-query blocks "
      f"{t_blocked / 4096**2 * 1e9:.1f} ns/entry ({t_whole / t_blocked:.1f}x faster; T = 512 whole: "
      f"{per_entry_ns[1]:.1f}); max |difference| {block_gap:.1e}")
assert block_gap < 1e-5           # the same attention, to float32 rounding
assert t_whole > 1.1 * t_blocked  # the same FLOPs, less time: the memory, not the arithmetic

# %% [markdown]
# In our runs the blocks were about twice as fast (1.9 to 2.3 times), close to the time per entry
# of T = 512: quadratic again.
#
# "Attention time is quadratic in T" describes the work; on a real machine the time also pays
# for where the $T \times T$ matrix lives. Blocking the queries keeps it in cache and gives the
# time back (it does not reduce the memory of the whole output, and each block still needs a
# full row of scores); tiled attention (section 7) blocks the keys too, with an online softmax,
# and its memory then grows only linearly in T (in inference; with gradients, section 8).
#
# ## 4. A recurrent layer, measured the same way
#
# An Elman RNN, $h_t = \tanh(x_t W_x + h_{t-1} W_h + b)$ (`txlearn.recurrent.recurrent_layer`,
# tested equal to `torch.nn.RNN`): $4 T d_{model}^2$ FLOPs, linear in T. Against $d_{model}$ we
# use a batch of 16 sequences so that each step's product is large enough to measure; with one
# sequence and small $d_{model}$, the per-step overhead of the Python loop hides the $d_{model}^2$.

# %%
def rnn_call(T, d_model, B=1):
    x = torch.randn(B, T, d_model)
    W_x, W_h = (torch.randn(d_model, d_model) / math.sqrt(d_model) for _ in range(2))
    return lambda: recurrent_layer(x, W_x, W_h, torch.zeros(d_model))

Ts_rnn = [256, 512, 1024, 2048, 4096]
r_T = measure(lambda t: rnn_call(t, 64), Ts_rnn, "time", repeats=3, clock=CLOCK)
rm_T = measure(lambda t: rnn_call(t, 64), Ts_rnn, "memory")
d_models_rnn = [256, 512, 1024, 2048]
r_d = measure(lambda d_m: rnn_call(32, d_m, B=16), d_models_rnn, "time", repeats=3, clock=CLOCK)
rm_d = measure(lambda d_m: rnn_call(32, d_m, B=16), d_models_rnn, "memory")

fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
loglog(axes[0], Ts_rnn, {"time (s)": r_T, "peak memory (GB)": rm_T / 1e9},
       "RNN against T (d_model = 64)", "")
loglog(axes[1], d_models_rnn, {"time (s)": r_d, "peak memory (GB)": rm_d / 1e9},
       "RNN against d_model (T = 32, B = 16)", "")
axes[0].set_xlabel("T")
axes[1].set_xlabel("d_model")
show(fig, alt=f"Two log-log plots of the RNN's time in seconds and peak memory in GB. Left, "
     f"against T from 256 to 4096 at d_model = 64: straight lines of slope about 1, time "
     f"{fit_loglog_slope(Ts_rnn, r_T):.2f} and memory {fit_loglog_slope(Ts_rnn, rm_T):.2f}: "
     f"no T by T matrix. Right, against d_model from 256 to 2048 at T = 32 and B = 16: time "
     f"slope {fit_loglog_slope(d_models_rnn, r_d):.2f}, memory slope "
     f"{fit_loglog_slope(d_models_rnn, rm_d):.2f}.")
slope_r_T, slope_rm_T = fit_loglog_slope(Ts_rnn, r_T), fit_loglog_slope(Ts_rnn, rm_T)
slope_r_d, slope_rm_d = fit_loglog_slope(d_models_rnn, r_d), fit_loglog_slope(d_models_rnn, rm_d)
print(f"RNN against T: time slope {slope_r_T:.2f}, memory slope {slope_rm_T:.2f}; "
      f"against d_model: time slope {slope_r_d:.2f}, memory slope {slope_rm_d:.2f}")
assert 0.7 < slope_r_T < 1.3 and 0.9 < slope_rm_T < 1.1  # linear in T: no T x T matrix
assert 1.2 < slope_r_d < 2.5  # the d_model x d_model products
assert 0.9 < slope_rm_d < 1.1  # the states are T x d_model: memory is linear in d_model

# %% [markdown]
# ### Where attention and the RNN cross
#
# At $d_{model} = 256$: attention's $4T^2 d_{model}$ FLOPs equal the RNN's $4 T d_{model}^2$
# exactly at $T = d_{model}$. `recurrent_layer` runs its T steps in a Python loop, so part of its
# time is the interpreter; PyTorch's `nn.RNN` runs the same recurrence in C++, and we time it
# beside it (without gradients, like the others). Expected: `nn.RNN` faster than the Python loop,
# but both slower than attention at equal FLOPs and crossing it only well past $T = d_{model}$:
# the RNN runs T small dependent steps, each too small to run at full speed, while attention
# does its work in a few large batched products.

# %%
def torch_rnn_call(T, d_model, B=1):
    x, rnn = torch.randn(B, T, d_model), nn.RNN(d_model, d_model, batch_first=True)

    def run():
        with torch.no_grad():
            return rnn(x)
    return run

d_x = 256
Ts_x = [64, 128, 256, 512, 1024, 2048]
a_x = measure(lambda t: attention_call(t, d_x), Ts_x, "time", repeats=3, clock=CLOCK)
r_x = measure(lambda t: rnn_call(t, d_x), Ts_x, "time", repeats=3, clock=CLOCK)
n_x = measure(lambda t: torch_rnn_call(t, d_x), Ts_x, "time", repeats=3, clock=CLOCK)
plt.figure(figsize=(6, 3.8))
plt.loglog(Ts_x, a_x, "o-", label="attention (course's)")
plt.loglog(Ts_x, r_x, "s-", label="RNN, Python loop (course's)")
plt.loglog(Ts_x, n_x, "^-", label="RNN, torch.nn.RNN (C++ loop)")
plt.axvline(d_x, color="grey", ls=":", label="T = d_model (equal FLOPs)")
measured_ticks(plt.gca(), Ts_x)
plt.xlabel("T")
plt.ylabel("time (s)")
plt.title(f"d_model = {d_x}")
plt.legend(fontsize=8)
at_d = Ts_x.index(d_x)
ratio_at_d, ratio_nn_at_d = r_x[at_d] / a_x[at_d], n_x[at_d] / a_x[at_d]
faster = [t for t, a, r in zip(Ts_x, a_x, np.minimum(r_x, n_x)) if r < a]
show(alt=f"Log-log plot of time in seconds against T from 64 to 2048 at d_model = {d_x} for "
     f"attention, the Python-loop RNN and torch.nn.RNN, with a dotted line at T = d_model, "
     f"where their FLOPs are equal. At that line the Python-loop RNN takes {ratio_at_d:.1f} "
     f"times attention's time and nn.RNN {ratio_nn_at_d:.1f} times; the two RNN lines run "
     f"close together, and an RNN is faster than attention "
     f"{'from T = ' + str(faster[0]) if faster else 'nowhere in the range measured'}.")
print(f"at T = d_model = {d_x} (equal FLOPs): the Python-loop RNN takes {ratio_at_d:.1f}x attention's "
      f"time, nn.RNN {ratio_nn_at_d:.1f}x; the loop costs {r_x[at_d] / n_x[at_d]:.2f}x nn.RNN")
print(f"measured crossing: {'T = ' + str(faster[0]) if faster else 'beyond T = 2048'}")
assert ratio_nn_at_d > 1.5 and ratio_at_d > 1.5     # equal FLOPs, yet both RNNs are slower
assert r_x[at_d] / n_x[at_d] < 2                    # the interpreter is not most of the RNN's time
assert not faster or faster[0] >= 4 * d_x           # if an RNN wins at all, only far past T = d_model

# %% [markdown]
# So "attention is cheaper than recurrence when $T < d_{model}$" (the paper's remark under
# Table 1) is a statement about FLOPs. On this CPU, measured, attention is faster well beyond
# $T = d_{model}$. Running the loop in C++ (`nn.RNN`) removes only a small part of the RNN's time
# (the printed factor; the interpreter was not what made it slow): what remains is T small
# dependent steps, and section 5 measures how much slower each one runs than attention's large
# products.
#
# ## 5. Sequential steps and path length
#
# **Sequential steps.** The RNN cannot compute $h_t$ before $h_{t-1}$: T dependent steps.
# Attention computes all T outputs in one batched step. Below, the time per sequential step of
# the RNN stays roughly constant as T grows (so the total grows like T). At T = 1024, $d_{model} = 64$
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
print(f"T = {T_s}, d_model = 64: attention, 1 batched step: {t_attn_s * 1e3:.1f} ms for "
      f"{flops_attn_s / 1e6:.0f} MFLOP ({rate_attn:.1f} GFLOP/s); RNN, {T_s} steps: "
      f"{t_rnn_s * 1e3:.1f} ms for {flops_rnn_s / 1e6:.0f} MFLOP ({rate_rnn:.1f} GFLOP/s)")
assert rate_attn > 2 * rate_rnn  # the batched step uses the hardware far better

path_rnn, path_attn = [], []
for T_p in (4, 16, 64):
    x = torch.randn(1, T_p, 8, requires_grad=True)
    W_x, W_h = torch.randn(8, 8), torch.randn(8, 8)
    h_all = recurrent_layer(x, W_x, W_h, torch.zeros(8))
    path_rnn.append(matmul_path_length(h_all[:, -1], x))
    Q, K, V = x @ W_x, x @ W_h, x @ W_x
    path_attn.append(matmul_path_length(scaled_dot_product_attention(Q, K, V)[:, -1], x))
print("T = 4, 16, 64: RNN path", path_rnn, " attention path", path_attn)
assert path_rnn == [4, 16, 64] and path_attn == [3, 3, 3]

# %% [markdown]
# ## 6. The paper's Table 1, with measured numbers
#
# Formulas from the paper; measured values from sections 3–5 on this machine.

# %%
rows = [
    ("self-attention", "O(T^2 d_model)", f"T^{slope_t_T:.2f}, d_model^{slope_t_d:.2f}", "O(1)", "1 batched step",
     "O(1)", f"{path_attn[-1]} at T = 64"),
    ("recurrent", "O(T d_model^2)", f"T^{slope_r_T:.2f}, d_model^{slope_r_d:.2f}", "O(T)",
     f"T steps, ~{np.median(per_step) * 1e6:.0f} us each",
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
diff = (tiled_attention(Q, K, V, causal, block_size=96)
        - scaled_dot_product_attention(Q, K, V, causal)).abs().max().item()
print(f"tiled (block 96, which does not divide 1000) vs ordinary, causal, float64: max |diff| = {diff:.1e}")
assert diff < 1e-12

Ts_m = Ts  # the lengths of section 3
def tiled_call(T):
    Q, K, V = (torch.randn(1, T, 64) for _ in range(3))
    return lambda: tiled_attention(Q, K, V, block_size=128)
m_tiled = measure(tiled_call, Ts_m, "memory")
m_plain = m_T  # ordinary attention at the same T and d_model, measured in section 3
plt.figure(figsize=(6, 3.8))
plt.loglog(Ts_m, m_plain / 2**20, "o-", label=f"ordinary (slope {fit_loglog_slope(Ts_m, m_plain):.2f})")
plt.loglog(Ts_m, m_tiled / 2**20, "s-", label=f"tiled, block 128 (slope {fit_loglog_slope(Ts_m, m_tiled):.2f})")
measured_ticks(plt.gca(), Ts_m)
plt.xlabel("T")
plt.ylabel("peak memory (MiB)")
plt.legend()
show(alt=f"Log-log plot of peak memory in MiB against T from 256 to 4096 at d_model = 64: "
     f"ordinary attention rises with slope {fit_loglog_slope(Ts_m, m_plain):.2f}, to "
     f"{m_plain[-1] / 2**20:.0f} MiB at T = 4096; tiled attention with blocks of 128 rises "
     f"with slope {fit_loglog_slope(Ts_m, m_tiled):.2f}, to {m_tiled[-1] / 2**20:.1f} MiB, "
     f"{m_tiled[-1] / m_plain[-1]:.1%} of it.")
print(f"at T = 4096: ordinary {m_plain[-1] / 2**20:.0f} MiB, tiled {m_tiled[-1] / 2**20:.1f} MiB "
      f"({m_tiled[-1] / m_plain[-1]:.1%})")
assert 0.9 < fit_loglog_slope(Ts_m, m_tiled) < 1.05
assert m_tiled[-1] < m_plain[-1] / 10

# %% [markdown]
# ## 8. FlashAttention: linear memory *with gradients*, and its backward pass
#
# Section 7's memory was measured the way `peak_memory_bytes` measures by default: under
# `torch.inference_mode()`, with no autograd graph. Training keeps every tensor that a backward
# formula needs until the backward pass runs, and for tiled attention that is every block's
# scores, exponentials and products: the $T \times T$ numbers come back, in pieces. We expect
# tiled attention *with gradients* to grow like $T^2$ again, and measure the peak of one forward
# and backward pass (`peak_memory_bytes` of a call that turns autograd back on inside itself,
# with `torch.inference_mode(False)`) for ordinary attention, tiled attention under autograd, and
# FlashAttention (`txlearn.flash_attention.flash_attention`), one head of $d_k = 64$, blocks of
# 128 keys.

# %%
from txlearn.attention import attention_np  # noqa: E402
from txlearn.flash_attention import flash_attention  # noqa: E402


def with_autograd(fn):
    """`fn` with autograd on, inside a measurement that runs under inference mode."""
    def run():
        with torch.inference_mode(False):
            return fn()
    return run


def train_step(attention, T, d_k=64):
    """One forward and backward pass of `attention` on one head of T queries and keys."""
    Q, K, V = (torch.randn(1, T, d_k, requires_grad=True) for _ in range(3))
    dO = torch.randn(1, T, d_k)
    return with_autograd(lambda: torch.autograd.grad(attention(Q, K, V), (Q, K, V), dO))


methods = {"ordinary": scaled_dot_product_attention,
           "tiled, autograd": lambda Q, K, V: tiled_attention(Q, K, V, block_size=128),
           "FlashAttention": lambda Q, K, V: flash_attention(Q, K, V, block_size=128)}
Ts_g = [256, 512, 1024, 2048, 4096]
peaks = {name: np.array([peak_memory_bytes(train_step(fn, T)) for T in Ts_g], dtype=float)
         for name, fn in methods.items()}
slopes_g = {name: fit_loglog_slope(Ts_g, p) for name, p in peaks.items()}
plt.figure(figsize=(6, 3.8))
for name, p in peaks.items():
    plt.loglog(Ts_g, p / 2**20, "o-", label=f"{name} (slope {slopes_g[name]:.2f})")
measured_ticks(plt.gca(), Ts_g)
plt.xlabel("T")
plt.ylabel("peak memory, forward + backward (MiB)")
plt.legend()
plt.show()
for name, p in peaks.items():
    print(f"{name:16s}: " + ", ".join(f"T = {T}: {b / 2**20:.1f} MiB" for T, b in zip(Ts_g, p))
          + f"; slope {slopes_g[name]:.2f}")
print(f"T = 4096, FlashAttention / ordinary: {peaks['FlashAttention'][-1] / peaks['ordinary'][-1]:.1%}")
assert 1.7 < slopes_g["tiled, autograd"] < 2.1          # tiled under autograd: quadratic again
assert 1.8 < slopes_g["ordinary"] < 2.1
assert slopes_g["FlashAttention"] < 1.15                 # linear, gradients included
assert peaks["FlashAttention"][-1] < 0.1 * peaks["ordinary"][-1]
assert peaks["tiled, autograd"][-1] > peaks["ordinary"][-1] / 2   # no better than ordinary

# %% [markdown]
# The correction: tiled attention's memory is linear in T **for inference only** (section 7).
# Under autograd it keeps, block by block, about as much as ordinary attention keeps at once.
# What makes FlashAttention linear in training is its own backward pass: its forward keeps only
# Q, K, V, the output O and **one number per query**, the log-sum-exp
# $\mathrm{lse}_i = \log \sum_j e^{s_{ij}}$, and its backward pass recomputes each block's
# probabilities from it (Dao et al. 2022, Algorithms 1 and 2).
#
# **Why the forward is exact: the online softmax's invariant, by induction over the blocks.**
# Let blocks $1, \dots, n$ partition the keys, and write $B_{\le j}$ for the keys of the first $j$
# blocks. Claim: after block $j$,
#
# $$m_j = \max_{k \in B_{\le j}} s_k, \qquad l_j = \sum_{k \in B_{\le j}} e^{s_k - m_j}, \qquad
#   acc_j = \sum_{k \in B_{\le j}} e^{s_k - m_j}\, v_k .$$
#
# *Base* ($j = 0$, no keys yet): $m_0 = -\infty$, $l_0 = 0$, $acc_0 = 0$, the empty max and empty
# sums. *Step*: suppose the claim holds after block $j$; block $j+1$ brings scores $s_k$,
# $k \in B_{j+1}$. The update sets $m_{j+1} = \max(m_j, \max_{k \in B_{j+1}} s_k)$, the max over
# $B_{\le j+1}$. With $\alpha = e^{m_j - m_{j+1}}$,
#
# $$\alpha\, l_j + \sum_{k \in B_{j+1}} e^{s_k - m_{j+1}}
#   = \sum_{k \in B_{\le j}} e^{s_k - m_j} e^{m_j - m_{j+1}} + \sum_{k \in B_{j+1}} e^{s_k - m_{j+1}}
#   = \sum_{k \in B_{\le j+1}} e^{s_k - m_{j+1}} = l_{j+1},$$
#
# and the same computation with $v_k$ inside the sums gives $acc_{j+1}$. So after the last block,
# $acc_n / l_n = \sum_k e^{s_k} v_k / \sum_k e^{s_k} = \mathrm{softmax}(s)\,V$ (the factor
# $e^{-m_n}$ cancels) and $m_n + \log l_n = \log \sum_k e^{s_k} = \mathrm{lse}$. Every exponent is
# $\le 0$ (lesson 01's max-shift), so nothing overflows. The rescaling by $\alpha$ is exactly what
# the step needs: without it, the old terms stay measured against the old maximum. Checked below
# after every block, against the invariant's right-hand side computed directly.

# %%
rng_f = np.random.default_rng(8)
q_f = rng_f.normal(size=(3, 16))
K_f, V_f = rng_f.normal(size=(10, 16)) * np.linspace(0.3, 3, 10)[:, None], rng_f.normal(size=(10, 4))
s_f = q_f @ K_f.T / 4.0                                                  # (3, 10) scores
m_f, l_f, acc_f = np.full(3, -np.inf), np.zeros(3), np.zeros((3, 4))
worst_invariant = 0.0
for start in range(0, 10, 4):                                            # blocks of 4, 4, 2 keys
    m_f, l_f, acc_f = online_softmax_update_np(m_f, l_f, acc_f, s_f[:, start:start + 4],
                                                  V_f[start:start + 4])
    seen = s_f[:, :start + 4]                                            # the keys so far
    m_direct = seen.max(-1)
    l_direct = np.exp(seen - m_direct[:, None]).sum(-1)
    acc_direct = np.exp(seen - m_direct[:, None]) @ V_f[:start + 4]
    worst_invariant = max(worst_invariant, np.abs(m_f - m_direct).max(),
                          np.abs(l_f - l_direct).max(), np.abs(acc_f - acc_direct).max())
lse_f = m_f + np.log(l_f)
print(f"invariant after every block: max deviation {worst_invariant:.1e}; final lse vs "
      f"log sum exp: {np.abs(lse_f - np.log(np.exp(s_f).sum(-1))).max():.1e}")
assert worst_invariant < 1e-12
assert np.abs(acc_f / l_f[:, None] - attention_np(q_f, K_f, V_f)).max() < 1e-12

# %% [markdown]
# **The backward pass, one block at a time.** Lesson 02's backward needs $P$ and
# $\mathrm{rowsum}(dP \odot P)$. The first is recomputed per block from the saved lse,
# $P_j = e^{S_j - \mathrm{lse}}$, already final (no running maximum, nothing to rescale). The
# second would need every block at once, but it has a closed form that needs none:
# $\sum_k P_{ik}\, dP_{ik} = \sum_k P_{ik}\, (dO_i \cdot v_k) = dO_i \cdot O_i$, so
# $D = \mathrm{rowsum}(dO \odot O)$ is computed once (Dao 2023, FlashAttention-2). Then per block
# $dV_j = P_j^\top dO$, $dS_j = P_j \odot (dO\,V_j^\top - D)$, $dQ \mathrel{+}= dS_j K_j / \sqrt{d_k}$ and
# $dK_j = dS_j^\top Q / \sqrt{d_k}$. `FlashAttentionFunction` is an autograd Function whose
# forward saves Q, K, V, O and lse and whose backward is these lines; we expect its gradients to
# equal ordinary attention's in float64 (with the bottom-right causal mask for $L \ne S$, built
# block by block by `causal=True`, and grouped-query heads), and what it saves to be
# $4 T d_k + T$ numbers per head, counted by lesson 02's saved-tensors hooks.

# %%
Qf = torch.randn(2, 4, 6, 16, dtype=torch.float64, requires_grad=True)   # 4 query heads, L = 6
Kf = torch.randn(2, 2, 9, 16, dtype=torch.float64, requires_grad=True)   # 2 kv heads, S = 9
Vf = torch.randn(2, 2, 9, 8, dtype=torch.float64, requires_grad=True)
dOf = torch.randn(2, 4, 6, 8, dtype=torch.float64)
flash_grads = torch.autograd.grad(flash_attention(Qf, Kf, Vf, block_size=4, causal=True), (Qf, Kf, Vf), dOf)
ordinary = scaled_dot_product_attention(Qf, Kf.repeat_interleave(2, 1), Vf.repeat_interleave(2, 1),
                                        torch.ones(6, 9, dtype=torch.bool).tril(9 - 6))
ordinary_grads = torch.autograd.grad(ordinary, (Qf, Kf, Vf), dOf)
gap_f = max((a - b).abs().max().item() for a, b in zip(flash_grads, ordinary_grads))

kept = {}


def keep(tensor):                                  # lesson 02's count: each storage once
    kept[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
    return tensor


Qk, Kk, Vk = (torch.randn(1, 1024, 64, requires_grad=True) for _ in range(3))
with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
    flash_attention(Qk, Kk, Vk, block_size=128)
print(f"GQA, causal, L = 6 < S = 9: max |FlashAttention's gradients - ordinary attention's| = {gap_f:.1e}")
print(f"kept for the backward pass at T = 1024, d_k = 64: {sum(kept.values()):,} bytes "
      f"(4 (4 T d_k + T) = {4 * (4 * 1024 * 64 + 1024):,}; ordinary attention's P alone: {4 * 1024**2:,})")
assert gap_f < 1e-10
assert sum(kept.values()) == 4 * (4 * 1024 * 64 + 1024)

# %% [markdown]
# **What the recomputation costs in time.** Ordinary attention's forward and backward passes
# are 6 matrix products of $2 T^2 d_k$ FLOPs each ($QK^\top$, $PV$; $dV$, $dP$, $dQ$, $dK$);
# FlashAttention's backward pass computes $Q K^\top$ and the exponentials a second time: 7
# products, 7/6 of the FLOPs. On a CPU its $L \times 128$ blocks also stay in the cache and in
# memory the process already holds (section 3), which can give that back. Measured, one thread,
# CPU time, fastest of 3:

# %%
t_train = {name: [time_callable(train_step(fn, T), repeats=3, clock=CLOCK) for T in (1024, 2048)]
           for name, fn in methods.items() if name != "tiled, autograd"}
ratio_time = [f / o for f, o in zip(t_train["FlashAttention"], t_train["ordinary"])]
print("forward + backward, ordinary: " + ", ".join(f"{t * 1e3:.0f} ms" for t in t_train["ordinary"])
      + "; FlashAttention: " + ", ".join(f"{t * 1e3:.0f} ms" for t in t_train["FlashAttention"])
      + f" (T = 1024, 2048); ratio {ratio_time[0]:.2f}, {ratio_time[1]:.2f}")
assert max(ratio_time) < 4.0   # recomputing costs time, not a multiple of it (benchmarks/flash.py)

# %% [markdown]
# ## What we measured
#
# - A base layer has $12d_{model}^2 + 13d_{model}$ = 3,152,384 parameters, two thirds in the FFN;
#   the paper's base and big models count 63.1M and 214.2M with a 37000-token shared vocabulary
#   (published: 65M and 213M; no single vocabulary matches both).
# - Attention's memory grows as $T^2$ (slope 2.00); its time faster than $T^2$ on this CPU. The
#   cause, measured: past the last cache an element costs more, and fresh memory costs more
#   again; computing attention 256 queries at a time (the same FLOPs) gives the time back. Time
#   against $d_{model}$ is linear only once the products, not the softmax, dominate.
# - An RNN's time grows as T, and at equal FLOPs ($T = d_{model}$) it is slower than attention,
#   whether its loop runs in Python or in C++ (`nn.RNN`): its T sequential steps, not its FLOPs
#   or the interpreter, set its speed. Its path length is T; attention's is 3.
# - Tiled attention with an online softmax equals ordinary attention and its memory grows
#   linearly in T *in inference*; under autograd it keeps every block (slope about 1.8 with
#   gradients). FlashAttention, which saves one log-sum-exp per query and recomputes each block in
#   its own backward pass, has gradients equal to ordinary attention's (1e-15 in float64) and a
#   peak memory with gradients that grows linearly (slope near 1; under 10% of ordinary
#   attention's at T = 4096), for 1.3 to 1.8 times its time on this CPU.
#
# Speed against PyTorch's built-ins (SDPA, `nn.MultiheadAttention`) is measured in
# `benchmarks/run.py`. Exercises: [`work/08_complexity.ipynb`](../work/08_complexity.ipynb).
# FlashAttention's forward and backward passes by hand are exercises 5 and 6 of
# [`work/11_backward.ipynb`](../work/11_backward.ipynb); `benchmarks/flash.py` measures it up to
# T = 8192.

# %%
torch.set_num_threads(threads_before)  # give the kernel its threads back
