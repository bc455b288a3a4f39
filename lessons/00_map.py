# %% [markdown]
# # 00 · The map
#
# This course builds one transformer layer from first principles, a component at a time, and
# *measures* every claim it makes: a number or a plot, each followed by an `assert` with a stated
# tolerance, so running a lesson tests it. This first notebook shows where we are going, fixes
# the symbols every lesson uses ([the notation table](#Notation) below; each lesson links back to
# it), says how to work through the course, and checks that your environment can run it.
#
# **You will be able to:** name every box of a transformer layer and the lesson that derives it;
# read the course's symbols ($B, T, L, S, d_{model}, d_k, \dots$); run a lesson, an exercise
# check and the grader; and confirm that your Python, PyTorch, NumPy and matplotlib are the
# versions the course declares.
#
# **You need:** Python and NumPy (arrays, `@`), and the idea of a neural network trained by
# gradient descent. No transformer background: that is what the course is for.
#
# **Time:** about 15 minutes to read; the cells run in a few seconds.
#
# ## The layer in words
#
# Read it bottom-up, as the data flows (Vaswani et al. 2017, figure 1, encoder side):
#
# 1. **Tokens to vectors.** A batch of `B` sequences of `T` token ids, shape `(B, T)`, becomes
#    `(B, T, d_model)` through an embedding table; a **positional encoding** is added, because
#    attention by itself cannot see the order of the tokens. (Only a causal mask, which lets each
#    token see the ones before it, gives order away: lesson 02 measures both cases, lesson 04
#    trains a causal model without positions that learns them anyway.)
# 2. **Attention.** Each token forms a query $q$, a key $k$ and a value $v$ by multiplying its
#    vector with $W_Q, W_K, W_V$. Its output is an average of all values, weighted by
#    $\mathrm{softmax}(q K^\top / \sqrt{d_k})$: how well its query matches each key (lessons 01-02).
#    `n_heads` heads do this in parallel, each on its own `d_k = d_model / n_heads` wide slice of
#    the *projected* features $q, k, v$ (not of the token vector itself), and $W_O$ mixes their
#    results back to `d_model` (lesson 03).
# 3. **Add & norm.** The attention output is *added* to its input (the residual path) and
#    normalised with LayerNorm (lesson 06).
# 4. **Feed-forward.** The same two-layer network, `d_model -> d_ff -> d_model`, runs on every
#    position separately (lesson 05), followed by another add & norm.
# 5. Steps 2-4 form one **layer**, shape in = shape out = `(B, T, d_model)` (lesson 07); a model
#    stacks `n_layers` of them, and an **output head** maps the last one to `(B, T, n_vocab)` scores
#    (both defined in lesson 07, trained in lesson 09). Lesson 08 measures what all of this
#    costs as `T` and `d_model` grow.
#
# ## The layer as a figure
#
# Left, the paper's order (post-LN: `norm(x + sublayer(x))`); right, the order most recent models
# use (pre-LN: `x + sublayer(norm(x))`), which lesson 06 compares. The lesson that derives each
# box is written beside it.

# %%
import matplotlib.pyplot as plt

from txlearn.plotting import layer_boxes, layer_diagram, show

fig, (ax_post, ax_pre) = plt.subplots(1, 2, figsize=(16, 6))
layer_diagram(norm_first=False, ax=ax_post)
layer_diagram(norm_first=True, ax=ax_pre)
show(fig, alt="Two diagrams of one transformer layer, drawn bottom-up. Left, post-LN (the "
     "paper): token embedding, positional encoding, multi-head attention, LayerNorm, "
     "feed-forward, LayerNorm, output head. Right, pre-LN: the same boxes with each LayerNorm "
     "moved before its sub-layer and a final LayerNorm before the head. In both, red residual "
     "arrows go around attention and around the feed-forward network into a circled plus, "
     "the layer sits in a dashed frame marked x n_layers, and each box names the lesson that "
     "derives it.")

texts = [t.get_text() for t in ax_post.texts]
boxes = [t for t in texts if not t.startswith("lesson") and t not in ("+", "x n_layers")]
print(" -> ".join(label.split("  ")[0] for label in boxes))
assert boxes == [label for label, lesson, colour in layer_boxes(norm_first=False)]
assert texts.count("+") == 2  # two residual additions per layer: attention and FFN

# %% [raw] concept="residual-additions"
# question: How many residual additions ($x + \mathrm{sublayer}(\ldots)$) does one layer of the figure
#   hold?
# kind: numeric
# answer: 2
# tolerance: 0
# section: The layer as a figure
# right: 'One around attention and one around the feed-forward network, in both orders (post-LN and
#   pre-LN): the figure''s two circled plus signs, counted by the cell above.'
# wrong:
#   1:
#     misconception: Only attention has a residual path
#     explain: 'The feed-forward network has its own residual path too: the layer adds its input back
#       after attention and again after the FFN (the cell counts two `+`).'
#   3:
#     misconception: Counting the norm as an addition
#     explain: LayerNorm normalises; it adds nothing back. Only the two sub-layers, attention and the
#       FFN, are wrapped in $x + \ldots$.
#   other:
#     misconception: Not read off the figure
#     explain: 'Count the circled plus signs of one layer in the figure: the cell above asserts the
#       count.'

# %% [markdown]
# ## Notation
#
# Every lesson, docstring and exercise uses these symbols, and only in these meanings. Code uses
# the same names (`d_model`, `n_heads`, ...), so an equation and the line below it read alike.
#
# | symbol | meaning | example |
# |---|---|---|
# | $B$ | batch size: sequences processed at once | `x: (B, T, d_model)` |
# | $T$ | sequence length: tokens in one forward pass | lesson 08's "time against $T$" |
# | $L$ | number of **queries** (rows of an attention matrix); $L = T$ in self-attention | `causal_mask(L, S)` |
# | $S$ | number of **keys and values** (columns); $S = T$ without a cache, $S$ = cached + new with one | `scores: (B, n_heads, L, S)` |
# | $d_{model}$ | width of a token vector, the residual stream (never a bare $d$) | 512 in the paper's base model |
# | $n_{heads}$ | attention (query) heads per layer | 8 |
# | $n_{kv\_heads}$ | key/value heads (grouped-query attention): $n_{heads}$ for MHA, 1 for MQA | 8 of 64 in a 70B model |
# | $d_k$ | per-head width of queries and keys, $d_{model} / n_{heads}$ | 64 |
# | $d_v$ | per-head width of values ($= d_k$ here) | 64 |
# | $d_{ff}$ | inner width of the feed-forward network | $4\,d_{model}$ |
# | $n_{layers}$ | depth: layers in a stack (the paper's $N$) | 6 |
# | $n_{vocab}$ | vocabulary size (never $V$) | 103 characters in lesson 09 |
# | $Q, K, V$ | queries, keys, values: $(\dots, L, d_k)$, $(\dots, S, d_k)$, $(\dots, S, d_v)$ | |
# | $Z, P$ | the scaled scores $Z = Q K^\top / \sqrt{d_k}$ and the weights $P = \mathrm{softmax}(Z)$, $(\dots, L, S)$; $dZ$ is $\partial \mathcal{L} / \partial Z$ (never $S$, which counts keys) | `dZ = softmax_vjp(P, dP)` |
# | $W_Q, W_K, W_V, W_O$ | attention projections, shape $(d_{in}, d_{out})$, applied on the right: $x W$ | `mha.W_Q` |
# | $W_1, W_2, W_3$ | FFN weights; $W_3$ is SwiGLU's gate | `ffn.W_1: (d_model, d_ff)` |
# | $E$ | token embedding table, $(n_{vocab}, d_{model})$ | `E[ids]` |
# | $x$ | a token vector or the residual stream; $h$ an intermediate of the same shape | |
# | $i, j$ | query index and key index (row and column of an attention matrix) | $a_{ij}$ |
# | $t$ | a token's position; RoPE uses $m, n$ for the positions of a query and a key | |
# | $\ell$ | layer index, $1 \dots n_{layers}$ (`layer` in code) | |
# | head | a head index is written out, `head` (never $h$) | `weights[:, head]` |
# | $\theta_k$ | RoPE frequencies, $\theta_k = \text{base}^{-2k/d_k}$ | base 10000 |
# | $\gamma, \beta, \epsilon$ | a norm's gain, shift and epsilon (`gamma`, `beta`, `eps`) | |
# | $p$ | a probability; top-$p$'s threshold; $\tau$ a sampling temperature | |
#
# Masks are boolean with **True = may attend**; a causal mask with $L \ne S$ is aligned to the
# bottom-right corner (the last $L$ of $S$ positions). FLOPs are $2\times$ multiply-accumulates.

# %% [markdown]
# ## The lessons
#
# | NN | lesson | what it measures |
# |---|---|---|
# | 00 | the map (this notebook) | the layer diagram; an environment check against the declared versions |
# | 01 | softmax and the $1/\sqrt{d_k}$ scale | Var$(q \cdot k)$ grows as $d_k$; softmax saturation and its vanishing Jacobian; float32 overflow and the max-shift; the softmax's backward pass by hand, against autograd; the gradient that reaches $W_Q$ |
# | 02 | attention as a soft lookup | hard vs soft lookup; Q/K/V, and why $W_Q = W_K$ forces a Gram matrix; attention heatmaps; causal and padding masks; generating text one token at a time; masking by adding $-10^9$ or BERT's $-10^4$ and where each fails; permutation equivariance, and how a causal mask breaks it; attention's backward pass ($dQ, dK, dV$) by hand |
# | 11 | tokens (read after 02) | bytes and UTF-8; byte-level BPE trained from scratch, equal to `tokenizers`' trainer; SmolLM2's tokenizer rebuilt from its GGUF file; compression and attention's cost against vocabulary size |
# | 03 | multi-head and grouped-query attention | split/merge heads; parameter counts; how one head copes with two lookups; GQA's grouping; the KV cache; KV-cache memory of MHA, GQA, MQA for real model sizes |
# | 04 | positional encodings | order blindness without them; a causal model learning positions without them; sinusoidal, learned, RoPE, ALiBi; loss past the trained length for each, trained to a comparable loss, and RoPE with position interpolation |
# | 05 | the position-wise FFN | attention alone stays in the values' convex hull; the FFN leaves it; ReLU/GELU/SwiGLU; its share of parameters and FLOPs |
# | 06 | residuals and normalisation | gradient norm vs depth with and without residuals; LayerNorm and RMSNorm; post-LN vs pre-LN, at initialisation and in training; norms in float16; their backward passes by hand |
# | 07 | one full layer | the forward pass step by step on a tiny example; equality with `torch.nn.TransformerEncoderLayer`; embedding and output head; cross-attention; the whole layer's backward pass from its pieces; the paper's dropout and label smoothing |
# | 08 | complexity | parameters, FLOPs and memory counted; time and memory vs $T$ and $d_{model}$ (log-log slopes); RNN comparison; the paper's Table 1 measured; tiled online-softmax attention; FlashAttention's forward and backward; what one decoded token costs (GQA); sliding windows |
# | 09 | capstone | a small causal transformer trained on real text on a CPU, sized for its budget; samples; what its heads attend to; a real pretrained encoder rebuilt from the course's modules; previous-token and subject-noun heads against baselines; sentence similarity |
# | 10 | a modern decoder | RMSNorm, RoPE, GQA and SwiGLU in one model; SmolLM2-135M read from its file into it and matched to `transformers`; the RoPE pairing trap; the KV cache; sink, previous-token and induction heads, and ablations showing which heads it needs |
#
# Exercise sets 01 to 10 follow their lessons; set 11 (backpropagation by hand) draws on lessons
# 01, 02, 06, 07 and 08 and comes after lesson 08; set 12 (byte-level BPE) follows lesson 11,
# and set 10's chat turn runs on your set-12 tokenizer.
#
# ## How to work through the course
#
# - `make lab` (once, and again after a `git pull`) sets up `.venv`, copies each exercise
#   notebook into your own working folder `work/`, and opens JupyterLab here.
# - **Lessons** are in `notebooks/`. Read them in order and run every cell: each one re-measures
#   its claims on your machine. They are generated from `lessons/NN_name.py`; change the source,
#   not the notebook, if you contribute.
# - **Exercises** are your copies in `work/NN_name.ipynb` (git-ignored: a course update never
#   overwrites your answers). Replace each `raise NotImplementedError` with your code, then run
#   the **check cell** below it. It prints `PASSED (public cases): <exercise>`, or names the
#   failing case, the first wrong value (got vs expected) and a hint aimed at the likely mistake.
#   *Public* cases are the ones the course ships; a grader may also run hidden ones, and names a
#   failed hidden case as hidden.
#   One rule holds in every set: your code must not change its inputs in place (`x -= m`,
#   `acc *= alpha`, `out=` on an argument). The checks hand it copies and fail when a copy
#   comes back changed ("changed its input ... in place"); build new arrays instead.
# - **Grading**: `txlearn grade work/01_softmax.ipynb` prints a table (exercise, PASS/FAIL, first
#   line of the feedback) and a score. It never runs the notebook's check cells and never reads
#   its saved outputs: your setup and answer cells run in a separate process (inside a
#   bubblewrap sandbox where it is installed), which only answers the grader's calls, and the
#   grader runs the checks itself on what your code returns. Editing or deleting a check cell
#   gains nothing. Without bubblewrap, your own `work/` notebooks are still graded, in a
#   separate process with limits on time and memory but no sandbox; an instructor grading other
#   people's notebooks installs it (docs/security.md, "Without bubblewrap").
#
# ## Environment check
#
# The course declares the oldest versions it supports in `pyproject.toml` (Python 3.10, NumPy
# 1.24, PyTorch 2.4 up to but excluding 3, matplotlib 3.7) and runs on a CPU. The cell below reads
# those requirements from the installed package's metadata and checks each installed version
# against them.

# %%
import importlib.metadata
import platform
import sys

import matplotlib
import numpy as np
import torch
from packaging.requirements import Requirement
from packaging.version import Version

import txlearn

print(f"Python     {platform.python_version()}")
print(f"PyTorch    {torch.__version__} (CUDA available: {torch.cuda.is_available()}, "
      f"CPU threads: {torch.get_num_threads()})")
print(f"NumPy      {np.__version__}")
print(f"matplotlib {matplotlib.__version__}")
print(f"txlearn    {txlearn.__version__}")

declared = {Requirement(r).name: Requirement(r).specifier
            for r in importlib.metadata.requires("txlearn") if "extra" not in r}
installed = {"numpy": np.__version__, "torch": torch.__version__.split("+")[0],
             "matplotlib": matplotlib.__version__}
python_needs = importlib.metadata.metadata("txlearn")["Requires-Python"]
for name, version in installed.items():
    print(f"{name:10s} {version:12s} declared {declared[name]}: "
          f"{'ok' if declared[name].contains(Version(version)) else 'TOO OLD OR TOO NEW'}")
print(f"{'python':10s} {platform.python_version():12s} declared {python_needs}")
assert python_needs == ">=3.10" and sys.version_info >= (3, 10)
assert str(declared["numpy"]) == ">=1.24" and Version(np.__version__) >= Version("1.24")
assert declared["torch"] == Requirement("torch>=2.4,<3").specifier
assert declared["torch"].contains(Version(installed["torch"]))       # 2.4 <= torch < 3
assert str(declared["matplotlib"]) == ">=3.7" and Version(matplotlib.__version__) >= Version("3.7")

# %% [markdown]
# A tiny attention, $\mathrm{softmax}(Q K^\top / \sqrt{d_k})\,V$ for one head with $T = 4$ tokens
# and $d_k = 8$, computed with the course's own `txlearn.softmax` and compared with PyTorch's
# built-in `scaled_dot_product_attention`. Its gradient must exist and be finite.

# %%
import torch.nn.functional as F

from txlearn.softmax import scaled_scores, softmax

torch.manual_seed(0)
T, d_k = 4, 8
Q = torch.randn(T, d_k, dtype=torch.float64, requires_grad=True)
K = torch.randn(T, d_k, dtype=torch.float64)
V = torch.randn(T, d_k, dtype=torch.float64)

weights = softmax(scaled_scores(Q, K), dim=-1)          # (T, T): row i = how query i attends
out = weights @ V                                       # (T, T) @ (T, d_k) -> (T, d_k)
expected = F.scaled_dot_product_attention(Q, K, V)      # (T, d_k)
gap = (out - expected).abs().max().item()
out.sum().backward()

print(f"attention output {tuple(out.shape)}, max |txlearn - torch| = {gap:.1e}")
print(f"weights of query 0: {np.round(weights[0].detach().numpy(), 3)}")
assert out.shape == (T, d_k)
assert gap < 1e-12                                                  # float64 rounding
assert torch.allclose(weights.sum(-1), torch.ones(T, dtype=torch.float64), atol=1e-12)
assert Q.grad is not None and torch.isfinite(Q.grad).all()

# %% [raw] concept="output-shape"
# question: In the cell above, $T = 4$ queries attend over 4 keys with $d_k = 8$. What shape has the
#   attention output `out`?
# kind: choice
# options:
#   a: '`(4, 8)`'
#   b: '`(4, 4)`'
#   c: '`(8, 8)`'
#   d: '`(8, 4)`'
# answer: a
# section: Environment check
# right: 'Each query gets one weighted average of the values, each a $d_k$-wide vector: `(T, T) @ (T,
#   d_k) -> (T, d_k)`, as the cell asserts.'
# wrong:
#   b:
#     misconception: The output is the weight matrix
#     explain: '`(4, 4)` is the shape of the weights `softmax(Q K^T / sqrt(d_k))`; the output multiplies
#       them with $V$, `(T, T) @ (T, d_k)`.'
#   c:
#     misconception: Attention works on features, not tokens
#     explain: 'Attention mixes *positions*: one row per query token. The $d_k \times d_k$ shape belongs
#       to a weight matrix such as $W_Q$, not to an attention output.'
#   d:
#     misconception: Rows and columns swapped
#     explain: 'Rows are tokens (queries) and columns features: `out.shape == (T, d_k)`, asserted in
#       the cell.'

# %% [markdown]
# Step 1 of the map said attention cannot see order. Measured on the same example: reverse the
# 4 tokens and, without a mask, the outputs are the same vectors in reverse order (to float64
# rounding); with a causal mask they are not, because each token then sees only the tokens
# before it (lessons 02 and 04 take this further).

# %%
reverse = torch.arange(T - 1, -1, -1)
Qd = Q.detach()
gaps = {}
for causal in (False, True):
    of_reversed = F.scaled_dot_product_attention(Qd[reverse], K[reverse], V[reverse], is_causal=causal)
    reversed_of = F.scaled_dot_product_attention(Qd, K, V, is_causal=causal)[reverse]
    gaps[causal] = (of_reversed - reversed_of).abs().max().item()
    print(f"causal mask {causal!s:5}: max |attn(reversed tokens) - reversed attn(tokens)| "
          f"= {gaps[causal]:.1e}")
assert gaps[False] < 1e-12          # no mask: order-blind, to float64 rounding
assert gaps[True] > 0.1             # causal mask: the order changes the outputs

# %% [raw] concept="reversed-tokens"
# question: Reverse the order of the 4 tokens and attend **without** a mask. What happens to the outputs?
# kind: choice
# options:
#   a: They are the same vectors as before, in reversed order
#   b: 'They are the same vectors in the original order: nothing changes'
#   c: 'They are new vectors: attention sees the new order'
#   d: It depends on whether the scores are scaled by $1/\sqrt{d_k}$
# answer: a
# section: Environment check
# right: 'Without a mask attention is order-blind (permutation equivariant): each output depends on
#   its own query and on the *set* of keys and values, so reversing the tokens reverses the outputs,
#   to float64 rounding (the first printed gap).'
# wrong:
#   b:
#     misconception: Invariance confused with equivariance
#     explain: 'Each token keeps its own output, so the outputs move with the tokens: reversed inputs
#       give reversed outputs, not the original list (the cell compares `attn(reversed)` with `reversed(attn)`).'
#   c:
#     misconception: Attention sees order by itself
#     explain: Nothing in $\mathrm{softmax}(QK^\top/\sqrt{d_k})V$ knows a position; only the causal
#       mask, the second printed gap, makes the order matter. That is why a positional encoding is added
#       (lesson 04).
#   d:
#     misconception: The scale is about order
#     explain: 'The $1/\sqrt{d_k}$ scale multiplies every score alike: it changes how sharp the weights
#       are (lesson 01), never which token is where.'

# %% [markdown]
# All asserts passed: your environment is ready. Next, lesson 01 (`notebooks/01_softmax.ipynb`)
# measures why the scores above are divided by $\sqrt{d_k}$. Its exercises are in
# [`work/01_softmax.ipynb`](../work/01_softmax.ipynb).
