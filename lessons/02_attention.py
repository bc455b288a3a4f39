# %% [markdown]
# # 02 · Attention as a soft lookup
#
# Symbols: see [the notation table](00_map.ipynb#Notation) of lesson 00.
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
# **You will be able to:** compute attention by hand and with the package; say why $W_Q$ and
# $W_K$ are separate; build causal (bottom-right aligned) and padding masks and combine them;
# generate text one token at a time from a causal model; and predict when masking by adding
# $-10^9$ or $-10^4$ is exact and when it fails, in each floating dtype.
#
# **You need:** lesson 01 (softmax, the max-shift, the $1/\sqrt{d_k}$ scale); matrix products
# and broadcasting in PyTorch.
#
# **Time:** about 60 minutes to read and run (the cells take about 10 s on a 2-core CPU), plus
# the exercises.
#
# The code lives in the package: `txlearn.masks` (causal and padding masks) and
# `txlearn.attention` (`scaled_dot_product_attention`, and `attention_np`, its float64 NumPy
# twin). Section 5 also uses `txlearn.sampling.sample_next`, the course's one sampler.

# %%
import math
import statistics

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from txlearn.attention import (attention_backward, attention_np, masked_softmax,
                               scaled_dot_product_attention)
from txlearn.masks import (causal_mask, combine_masks, key_padding_to_attn_mask,
                           padding_mask)
from txlearn.models.char_lm import CharTransformer
from txlearn.plotting import heatmap, show
from txlearn.sampling import sample_next
from txlearn.training.data import CharVocab, load_corpus, random_windows, split_by_position
from txlearn.training.generate import generate

torch.manual_seed(0)
torch.set_num_threads(1)  # the tensors here are tiny: one thread is fastest on a shared CPU
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
# With one shared $W$, the score of query $i$ against key $j$ is $s_{ij} = (x_i W) \cdot (x_j W)$:
# the scores are the dot products of the vectors $u_i = x_i W$ with each other, a **Gram
# matrix**. That is more than symmetric ($s_{ij} = s_{ji}$). A Gram matrix is positive
# semi-definite (no negative eigenvalue), and by Cauchy-Schwarz
# $s_{ij} \le \|u_i\|\,\|u_j\| = \sqrt{s_{ii}\,s_{jj}} \le \max(s_{ii}, s_{jj})$: of any two
# tokens, at least one scores itself at least as high as the other, and a token whose $u_i$ is
# the longest scores itself highest of all. The bound is the geometric mean of the two
# self-scores, not the query's own: query $i$ is sure to score itself at least as high as key
# $j$ only when $\|u_j\| \le \|u_i\|$. That is all Cauchy-Schwarz gives: a short $u_j$
# pointing along a longer $u_i$ scores $s_{ji} > s_{jj}$, so not every token need favour
# itself. In the random example below every row's top score is its own (as printed): a fact of
# this example, not a theorem. Relevance does not work that way:
# "a pronoun looks for its noun" does not imply "the noun looks for the pronoun", and neither
# means a word looks mostly at itself.
#
# A tiny test: five positions, each must attend to the *next* one, and the last to the first (a
# cycle). A Gram matrix cannot do this: $s_{i,i+1} > s_{ii}$ needs $\sqrt{s_{ii} s_{i+1,i+1}} >
# s_{ii}$, so $s_{i+1,i+1} > s_{ii}$, and around the cycle $s_{00} < s_{11} < \dots < s_{44} <
# s_{00}$. We train both versions on the same embeddings and measure the weight each gives to
# the right key, and then whether the shared version's scores are a Gram matrix or only
# symmetric: a symmetric matrix can have negative eigenvalues and off-diagonal entries above
# $\sqrt{s_{ii} s_{jj}}$, so the test can fail (it does for the symmetric part
# $(s + s^\top)/2$ of the separate version's scores).

# %%
T, d_model, d_k = 5, 8, 8
x_cycle = torch.randn(T, d_model)           # one embedding per position
target = (torch.arange(T) + 1) % T          # position i should attend to i + 1 (cyclic)

def train_scores(tied, steps=200):
    torch.manual_seed(1)
    W_Q = torch.nn.Parameter(torch.randn(d_model, d_k) / d_model ** 0.5)
    W_K = W_Q if tied else torch.nn.Parameter(torch.randn(d_model, d_k) / d_model ** 0.5)
    opt = torch.optim.Adam([W_Q] if tied else [W_Q, W_K], lr=0.05)
    for _ in range(steps):
        scores = (x_cycle @ W_Q) @ (x_cycle @ W_K).T / d_k ** 0.5   # (L, S) = (T, T)
        loss = F.cross_entropy(scores, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return scores.detach()

scores_sep, scores_tied = train_scores(tied=False), train_scores(tied=True)
hit = lambda scores: torch.softmax(scores, -1)[torch.arange(T), target].mean().item()
print(f"separate W_Q, W_K: weight on the right key = {hit(scores_sep):.3f}, "
      f"max |s - s^T| = {(scores_sep - scores_sep.T).abs().max():.2f}")
print(f"shared W (Q = K):  weight on the right key = {hit(scores_tied):.3f}, "
      f"max |s - s^T| = {(scores_tied - scores_tied.T).abs().max():.2f}")
assert hit(scores_sep) > 0.95               # learns the cycle
assert hit(scores_tied) < 0.5               # cannot: its scores are a Gram matrix


def gram_report(s):
    """Smallest eigenvalue, worst excess over Cauchy-Schwarz, rows whose top score is their own."""
    s = s.double()
    d = torch.diagonal(s)
    lowest = torch.linalg.eigvalsh((s + s.T) / 2).min().item()
    excess = (s.abs() - (d.clamp(min=0)[:, None] * d.clamp(min=0)[None, :]).sqrt()).max().item()
    return lowest, excess, int((s.argmax(-1) == torch.arange(len(s))).sum())


symmetric_only = (scores_sep + scores_sep.T) / 2
scale = scores_tied.abs().max().item()
for name, s in (("shared W", scores_tied), ("(s + s^T)/2 of separate", symmetric_only)):
    lowest, excess, own = gram_report(s)
    print(f"{name:24s} smallest eigenvalue {lowest:+.2e}, max |s_ij| - sqrt(s_ii s_jj) "
          f"{excess:+.2e}, rows whose top score is their own: {own} of {T}")
lowest, excess, own = gram_report(scores_tied)
print(f"shared W: weight on itself {torch.softmax(scores_tied, -1).diagonal().mean():.3f} "
      f"vs on the target {hit(scores_tied):.3f}")
assert torch.allclose(scores_tied, scores_tied.T, atol=1e-5)      # symmetric...
assert lowest > -1e-5 * scale and excess < 1e-5 * scale          # ...and a Gram matrix (float32)
assert own == T                                                  # here every token favours itself
lowest_s, excess_s, own_s = gram_report(symmetric_only)
assert lowest_s < -1.0 and excess_s > 1.0 and own_s < T          # a merely symmetric one need not

# %% [markdown]
# ## 3. The attention matrix
#
# `scaled_dot_product_attention(Q, K, V, mask, return_weights=True)` returns the weights, one row
# per query, each row a probability distribution over the keys. Drawn as a heatmap, it shows who
# looks at whom. Here: the learned cycle above, and the same weights from our function, the
# float64 NumPy reference, and PyTorch's `F.scaled_dot_product_attention`.

# %%
with torch.no_grad():
    weights_cycle = torch.softmax(scores_sep, -1)   # (T, T)
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
heatmap(axes[0], weights_cycle, "weight $a_{ij}$", cmap="Blues", vmin=0, vmax=1)
axes[0].set(title="learned: attend to the next", xlabel="key j", ylabel="query i",
            xticks=range(T), yticks=range(T), xticklabels=labels, yticklabels=labels)
heatmap(axes[1], weights[0, 0], "weight $a_{ij}$", cmap="Blues", vmin=0, vmax=1)
axes[1].set(title="random Q, K: a soft spread", xlabel="key j", ylabel="query i")
plt.tight_layout()
show(fig, alt="Two attention-weight heatmaps, query i on the rows, key j on the columns, colour "
     "from 0 (white) to 1 (dark blue). Left, the learned cycle over five tokens a to e: each row "
     "is dark in the single column of the next token (a to b, ..., e to a) and white elsewhere. "
     f"Right, random queries and keys, six queries over seven keys: most rows spread their "
     f"weight over several keys in light shades; {int((weights[0, 0].max(-1).values > 0.5).sum())} "
     f"of the 6 put more than half of it on one key.")

# %% [markdown]
# ## 4. Masks
#
# A mask says which keys each query may use. In this course a mask is **boolean and `True`
# means "may attend"**, and hidden keys get weight exactly 0 (their scores are set to $-\infty$
# before the softmax).
#
# - **Causal mask**: a language model predicting token $t+1$ may only look at positions
#   $\le t$. `causal_mask(T)` is the lower triangle *including* the diagonal.
# - When only the last $L$ of $S$ positions are new queries (text generation with a cache,
#   section 5), `causal_mask(L, S)` is aligned to the **bottom-right** corner: the last query
#   sees all $S$ keys.
# - **Padding mask**: sequences of different lengths padded to one length $S$;
#   `padding_mask(lengths, S)` is `True` on real tokens.
# - Masks combine with a logical AND (`combine_masks`). Much code instead *adds* a large negative
#   number such as $-10^9$ to the hidden scores; section 6 measures when that is exact and when
#   it fails.

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
plt.tight_layout()
show(fig, alt="Four black-and-white masks, black meaning may attend. causal_mask(6): the lower "
     "triangle of a 6 by 6 grid, diagonal included. causal_mask(2, 6): two query rows over six "
     "keys, the first row black up to key 4, the second row all black (bottom-right "
     "alignment). padding_mask([6, 4], 6): two sequences, the first all black, the second "
     "black on its first four keys only. Causal AND padding for sequence 2: the lower triangle "
     "with keys 4 and 5 white in every row.")
assert causal_mask(6).sum().item() == 21                 # 6 * 7 / 2 allowed pairs
assert both[1, :, 4:].sum().item() == 0                  # padded keys hidden from every query

# %% [raw] concept="causal-pairs"
# question: How many (query, key) pairs may attend under `causal_mask(6)`?
# kind: numeric
# answer: 21
# tolerance: 0
# section: '4.'
# right: 'The lower triangle *with* its diagonal: $6 \cdot 7 / 2 = 21$, as the cell asserts.'
# wrong:
#   15:
#     misconception: A token cannot see itself
#     explain: 'The causal mask includes the diagonal: each token attends to itself and the tokens before
#       it, $6\cdot 7/2 = 21$ pairs, not $6 \cdot 5 / 2 = 15$.'
#   36:
#     misconception: The mask hides nothing
#     explain: 36 is every pair; the causal mask hides each key after its query, leaving the lower triangle.
#   18:
#     misconception: Half the square
#     explain: 'The lower triangle of a $6\times6$ grid with its diagonal holds $(36 + 6)/2 = 21$ cells:
#       the diagonal counts whole.'
#   other:
#     misconception: Not counted from the triangle
#     explain: 'Query $i$ sees keys $0 \ldots i$: $1 + 2 + \cdots + 6$.'

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
# ## 5. Generating text, one token at a time
#
# The causal mask is what lets a model *write*. A causal language model maps token ids `(B, T)`
# to logits `(B, T, n_vocab)`; row $t$ scores every candidate for token $t+1$, having seen tokens
# $0 \dots t$ only. To generate, run the model on the prompt, turn the **last** row into one token
# (`txlearn.sampling.sample_next`: greedy at temperature $\tau = 0$, otherwise a draw from
# $\mathrm{softmax}(\text{logits} / \tau)$), append it, and repeat.
#
# > **A black box for now.** The model below is the capstone's `CharTransformer` (lesson 09) made
# > small: one layer, $d_{model} = 64$, 4 heads, a context of 32 characters. Its insides (heads,
# > positions, the FFN, norms) are lessons 03 to 07; here only its contract matters: ids
# > `(B, T)` in, logits `(B, T, n_vocab)` out, and the logits of position $t$ depend on tokens
# > $0 \dots t$ only (the causal mask of section 4). Its training loop is lesson 09's.
#
# We train it for 300 steps (a few seconds) on the course corpus, the Python language
# reference, one character per token.

# %%
text = load_corpus()
vocab = CharVocab.from_text(text)
n_vocab, block_size = len(vocab), 32
train_ids, _ = split_by_position(vocab.encode(text), block_size)

torch.manual_seed(0)
lm = CharTransformer(n_vocab, d_model=64, n_heads=4, n_layers=1, d_ff=128, block_size=block_size,
                     fused=False)   # the teaching path of every layer (lessons 02-07)
opt = torch.optim.Adam(lm.parameters(), lr=1e-2)
batches = torch.Generator().manual_seed(0)
for step in range(300):
    inputs, targets = random_windows(train_ids, 32, block_size, batches)   # (B, T) each
    loss = F.cross_entropy(lm(inputs).flatten(0, 1), targets.flatten())     # (B*T, n_vocab)
    opt.zero_grad()
    loss.backward()
    opt.step()
lm.eval()
print(f"training loss after 300 steps: {loss.item():.2f} nats per character "
      f"(guessing uniformly among {n_vocab} characters: ln {n_vocab} = {math.log(n_vocab):.2f})")
assert loss.item() < 0.65 * math.log(n_vocab)         # it has learned something about the text

# %% [markdown]
# The loop itself, written out. We expect it to produce exactly what the package's `generate`
# produces without a cache (same sampler, same seeded random numbers), as long as the text fits
# in the model's context of 32 characters (`generate` also handles longer texts).

# %%
def generate_by_hand(model, prompt_ids, n_new, temperature, seed):
    ids = [int(i) for i in prompt_ids]
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(torch.tensor([ids]))               # (1, T, n_vocab): every row again
            next_id = sample_next(logits[0, -1], temperature, generator=generator)  # last row only
            ids.append(int(next_id))
    return torch.tensor(ids)

prompt = vocab.encode("The ")
n_new = block_size - len(prompt)                          # fill the context exactly
for tau in (0.0, 0.8):
    ours = generate_by_hand(lm, prompt, n_new, tau, seed=0)
    package = generate(lm, prompt, n_new, temperature=tau, seed=0, use_cache=False)
    print(f"tau = {tau}: {vocab.decode(ours)!r}   identical to generate(): {torch.equal(ours, package)}")
    assert torch.equal(ours, package)

# %% [markdown]
# Greedy decoding ($\tau = 0$) always takes the most likely character, so once a context repeats
# it repeats the same continuation: we expect it to fall into a loop, and sampling not to. A
# crude measure over 200 characters: the share of distinct 8-character substrings (for sampling,
# the median over five seeds: one sample can wander into a run of spaces from the corpus's
# tables, which repeats too).

# %%
def distinct_share(ids, n=8):
    grams = [tuple(ids[i:i + n].tolist()) for i in range(len(ids) - n + 1)]
    return len(set(grams)) / len(grams)

greedy = generate(lm, prompt, 200, temperature=0.0)[len(prompt):]
samples = [generate(lm, prompt, 200, temperature=0.8, seed=s)[len(prompt):] for s in range(5)]
shares = sorted(distinct_share(s) for s in samples)
print("greedy: ", repr(vocab.decode(greedy[:90])))
print("sampled:", repr(vocab.decode(samples[0][:90])))
print(f"distinct 8-character substrings: greedy {distinct_share(greedy):.2f}, sampled "
      f"{', '.join(f'{x:.2f}' for x in shares)} (median {shares[2]:.2f})")
assert distinct_share(greedy) < 0.5 < shares[2]

# %% [markdown]
# **The standard remedy: a repetition penalty** (introduced by Keskar et al. 2019, CTRL, which
# divides every penalised logit by $\theta$). Before choosing, every token already in the text
# has its logit made less attractive by a factor $\theta > 1$: in the sign rule that later
# implementations adopted (Hugging Face's `RepetitionPenaltyLogitsProcessor`, for one), a
# positive logit is divided by $\theta$, a negative one *multiplied* by it (dividing a
# negative logit, as CTRL's rule does, would raise it and make the repeat more likely).
# `generate(..., repetition_penalty=theta)` applies it
# (`txlearn.sampling.apply_repetition_penalty`), greedy decoding otherwise unchanged. We expect
# fewer repeats. With characters for tokens, though, almost every character is "already in the
# text" after a line or two, so the penalty hits nearly the whole vocabulary alike: a mild one
# should help, a strong one need not. One prompt would tell us little (a 300-step model's
# greedy text changes with the last bit of its weights, and those with the CPU's kernels and the
# PyTorch build), so we measure sixteen prompts and compare medians.

# %%
prompts = ["The ", "def ", "In the ", "A ", "If ", "class ", "This ", "When ", "import ", "For ",
           "return ", "It ", "An ", "Note ", "Each ", "self."]
by_theta = {}
for theta in (1.0, 1.3, 2.0):
    texts = [generate(lm, vocab.encode(p), 200, temperature=0.0,
                      repetition_penalty=theta)[len(p):] for p in prompts]
    by_theta[theta] = [distinct_share(t) for t in texts]
    print(f"theta {theta}: {vocab.decode(texts[0][:70])!r}")
for theta, shares_t in by_theta.items():
    print(f"theta {theta}: distinct 8-character substrings per prompt "
          f"{' '.join(f'{x:.2f}' for x in shares_t)} (median {statistics.median(shares_t):.2f})")
med = {theta: statistics.median(v) for theta, v in by_theta.items()}
assert med[1.0] < 0.2                   # greedy decoding loops on most prompts
assert med[1.3] > 1.5 * med[1.0]        # a mild penalty breaks the loop, partly and not always
assert med[2.0] < med[1.3] + 0.1        # a strong one does no better than the mild one
assert max(med.values()) < 0.5 < shares[2]   # and no penalty comes near sampling (above)

# %% [markdown]
# *A surprise:* the strong penalty does no better than the mild one. Once every common character
# has occurred, all of them are penalised, and the ones left unpenalised are rare; greedy
# decoding then settles into another loop (often a run of spaces, from the corpus's tables). How
# much each penalty helps varies from prompt to prompt (the rows above), and for a model this
# small from one build of PyTorch to another: with the CPU wheel of torch 2.13 on Python 3.11 the
# medians for theta 1.0, 1.3 and 2.0 were 0.11, 0.28 and 0.12 (the strong penalty no better than
# none), with PyPI's torch 2.14 on Python 3.13 they were 0.12, 0.23 and 0.25 (the strong one about
# the mild one's). Only what holds on both is asserted. The penalty was designed for word and
# subword vocabularies, where "already in the text" singles out a few tokens of tens of
# thousands; sampling (above) is the better remedy for a character model.

# %% [markdown]
# **Most of that loop's work is repeated.** At every step the model recomputes all $T$ rows and
# uses only the last. Because of the causal mask, the earlier rows cannot have changed when a
# token was appended (the causality test above): we expect the logits of positions $0 \dots T-1$
# to come out the same when the model runs on $T + 1$ tokens.

# %%
ids = generate(lm, prompt, n_new, temperature=0.8, seed=0)            # (32,)
with torch.no_grad():
    step_gaps = [(lm(ids[None, :n])[0] - lm(ids[None, :n + 1])[0, :n]).abs().max().item()
                 for n in range(len(prompt), block_size)]
print(f"largest change of an earlier row when one token is appended: {max(step_gaps):.1e}")
assert max(step_gaps) < 1e-4          # float32 rounding of logits of order 10: nothing new

# %% [markdown]
# So a generator can keep, in every layer, the keys and values of the positions it has already
# processed (the **KV cache**, built in lesson 03) and run only the new position: $L = 1$ query
# against $S$ keys. Its mask is the *bottom* row of the full causal mask: `causal_mask(1, S)`,
# aligned bottom-right. Lesson 10 measures how much time the cache saves.
#
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
x6 = torch.randn(1, 6, 8)
assert torch.allclose(scaled_dot_product_attention(x6, x6, x6, causal_mask(6)),
                      F.scaled_dot_product_attention(x6, x6, x6, is_causal=True), atol=1e-6)

# %% [raw] concept="bottom-right"
# question: A cached sequence of $S = 5$ positions has $L = 2$ new queries (positions 3 and 4). Under
#   the course's bottom-right `causal_mask(2, 5)`, which keys can the **first** new query (position
#   3) see?
# kind: choice
# options:
#   a: Keys 0, 1, 2, 3
#   b: Key 0 only
#   c: Keys 0 to 4
#   d: Keys 3 and 4
# answer: a
# section: '5.'
# right: 'Bottom-right alignment puts the $L$ queries at the last $L$ of $S$ positions: query 3 sees
#   keys $0\ldots3$ and the last query all five, matching `causal_lower_right`.'
# wrong:
#   b:
#     misconception: Top-left alignment
#     explain: Key 0 only is `is_causal=True`'s top-left triangle, which treats the queries as positions
#       0 and 1 and hides keys the new tokens may see (the cell's second gap).
#   c:
#     misconception: Every new query sees everything
#     explain: Only the *last* query sees all $S$ keys; position 3 must not see position 4, which comes
#       after it.
#   d:
#     misconception: Queries see only the new tokens
#     explain: 'The cache exists so that new queries see the earlier keys: position 3 sees 0, 1, 2 and
#       itself.'

# %% [markdown]
# ## 6. Masking by adding numbers: 0/1, $-10^9$, and rows with nothing to see
#
# **Adding the 0/1 mask itself** is wrong: adding the keep-mask (1 = keep) to equal scores gives
# weights $[0.42, 0.42, 0.16]$, not $[0.5, 0.5, 0]$; it only shifts scores by 1. Our boolean
# mask gives the exact answer.

# %%
s0 = torch.zeros(1, 3)
keep = torch.tensor([[True, True, False]])
added = torch.softmax(s0 + keep.float(), -1)
_, ours_w = scaled_dot_product_attention(torch.zeros(1, 2), torch.zeros(3, 2), torch.eye(3),
                                         keep, return_weights=True)
print("0/1 mask added:", np.round(added.numpy(), 6), "  boolean mask:", ours_w.numpy())
assert torch.allclose(added, torch.tensor([[0.422319, 0.422319, 0.155362]]), atol=1e-6)
assert torch.allclose(ours_w, torch.tensor([[0.5, 0.5, 0.0]]))

# %% [raw] concept="added-keep-mask"
# question: Three equal scores; the keep-mask `[1, 1, 0]` (1 = keep) is *added* to them as numbers.
#   What weight does the third, hidden key get (to 3 decimals)?
# kind: numeric
# answer: 0.155
# tolerance: 0.002
# section: '6.'
# right: 'Adding 1 to two scores only shifts them: $e^0/(2e^1 + e^0) \approx 0.155$, the printed `[0.42,
#   0.42, 0.16]`. A boolean mask gives exactly 0.'
# wrong:
#   0:
#     misconception: Adding a 0/1 mask hides keys
#     explain: 'Adding 0 leaves a score as it is: the hidden key keeps $e^0/(2e + 1) = 0.155$. Hiding
#       needs $-\infty$ (or the boolean mask) on the hidden score.'
#   0.333:
#     misconception: A shift of some scores changes nothing
#     explain: Softmax ignores a shift of *all* scores; adding 1 to only two of them moves weight towards
#       them, but does not remove the third.
#   other:
#     misconception: Not computed from the softmax
#     explain: 'With scores $[1, 1, 0]$: weights $e^{s}/\sum e^{s}$.'

# %% [markdown]
# **Adding a large negative constant** to every hidden score is a different matter. Two
# constants are common: $-10^9$, with `scores.masked_fill(mask == 0, -1e9)` (the Annotated
# Transformer and many tutorials), and $-10^4$, with `(1.0 - mask) * -10000.0` (BERT's original
# `modeling.py`). What we expect, from lesson 01: the softmax subtracts the row's largest score,
# which is a visible one, so a hidden key's term is $e^{-10^4 + \dots}$ or $e^{-10^9 + \dots}$:
# exactly 0 in every floating dtype (float32's smallest positive number is about $e^{-104}$).
# For every row with **at least one visible key** the weights should then equal the boolean
# mask's bit for bit, for both constants, in float16, bfloat16, float32 and float64, as long as
# the constant itself can be held in the dtype. We test 4000 random rows with random masks
# (the softmax is the course's `masked_softmax`, the same kernel with and without a mask).

# %%
scores = torch.randn(4000, 10)
visible = torch.rand(4000, 10) > 0.5
visible[:, 0] |= ~visible.any(-1)                       # at least one visible key per row
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
CONSTANTS = {"-1e9": -1e9, "-1e4 (BERT)": -1e4}
for name, c in CONSTANTS.items():
    for dtype in DTYPES:
        s = scores.to(dtype)
        by_adding = masked_softmax(s + (~visible).to(dtype) * c)     # (1 - mask) * c, added
        same = torch.equal(by_adding, masked_softmax(s, visible))
        print(f"{name:12s} {str(dtype):15s} rows with a visible key equal bit for bit: {same}")
        assert same
print(f"-1e9 in float16: {torch.tensor(-1e9).half().item()}; -1e4: {torch.tensor(-1e4).half().item()}")

# %% [markdown]
# In float16 the first line hides a fault: its largest finite number is 65504, so $-10^9$
# becomes $-\infty$ there. Multiplied by a Python number, `(1 - mask) * -1e9` is computed in
# float32 and rounded, so visible keys get $0$ and hidden ones $-\infty$: it works. With the
# constant held as a float16 tensor (as code does that builds it in the scores' dtype), it is
# $0 \times (-\infty)$ = NaN on every visible key. BERT's $-10^4$ is finite in float16 and
# has neither problem.
#
# The failures of both constants are elsewhere, and we expect three:
#
# 1. **A row with no visible key** (a query at a padded position, or a sequence that is all
#    padding). Every score moves by the same constant and the softmax is shift invariant, so the
#    row keeps a full distribution over keys it was told to ignore. What it is depends on the
#    spacing of the dtype's numbers near the constant. Where the spacing is far larger than the
#    scores' spread, $s - c$ rounds to exactly $c$ for every small $s$ and the weights become
#    **exactly uniform**, an average over the padding: $-10^9$ in float32 (spacing 64) and
#    bfloat16, $-10^4$ in float16 (spacing 8) and bfloat16 (spacing 64). Where it is much
#    smaller, the differences survive and the row gets its **unmasked** weights, the mask
#    silently ignored: $-10^9$ in float64 (spacing $10^{-7}$), $-10^4$ in float32 (spacing
#    $10^{-3}$, so to about $10^{-4}$) and float64. In float16, $-10^9$ is $-\infty$ on every
#    key: $-\infty - (-\infty)$ inside the softmax, **NaN**.
# 2. `masked_fill` with $-10^9$ on float16 scores **refuses to run** (the value overflows).
# 3. As above, $(1 - \text{mask}) \times (-10^9)$ with the constant in float16: **NaN** on
#    every row.
#
# The course's boolean mask gives weights 0 (output 0) for an empty row, in every dtype.

# %%
row = torch.tensor([0.3, -1.2, 2.0, 0.5, -0.4, 1.1])       # one query's scores, S = 6
nothing = torch.zeros(6, dtype=torch.bool)                   # no visible key
two_visible = torch.tensor([True, False, True, False, False, False])
unmasked = torch.softmax(row.double(), -1)


def empty_row(weights):
    """What a row with no visible key became: NaN, exactly uniform, or its unmasked weights."""
    if torch.isnan(weights).any():
        return "NaN"
    if torch.equal(weights, torch.full_like(weights, 1 / len(weights))):
        return "uniform"
    gap = (weights.double() - unmasked).abs().max().item()
    return f"unmasked ({gap:.0e})" if gap < 1e-3 else f"other ({gap:.2f})"


measured = {}
for name, c in CONSTANTS.items():
    for dtype in DTYPES:
        empty = masked_softmax(row.to(dtype) + (~nothing).to(dtype) * c)
        try:
            row.to(dtype).masked_fill(~two_visible, c)
            fill = "runs"
        except RuntimeError as err:
            fill = "refused" if "overflow" in str(err) else str(err)
        in_dtype = masked_softmax(row.to(dtype) + (~two_visible).to(dtype) * torch.tensor(c, dtype=dtype))
        nan = "NaN" if torch.isnan(in_dtype).any() else "fine"
        measured[name, dtype] = (empty_row(empty), fill, nan)
        print(f"{name:12s} {str(dtype):15s} empty row: {measured[name, dtype][0]:16s} "
              f"masked_fill: {fill:8s} constant in the dtype: {nan}")
print("boolean mask, empty row:", masked_softmax(row, nothing).numpy())
expected = {("-1e9", torch.float16): ("NaN", "refused", "NaN"),
            ("-1e9", torch.bfloat16): ("uniform", "runs", "fine"),
            ("-1e9", torch.float32): ("uniform", "runs", "fine"),
            ("-1e9", torch.float64): ("unmasked", "runs", "fine"),
            ("-1e4 (BERT)", torch.float16): ("uniform", "runs", "fine"),
            ("-1e4 (BERT)", torch.bfloat16): ("uniform", "runs", "fine"),
            ("-1e4 (BERT)", torch.float32): ("unmasked", "runs", "fine"),
            ("-1e4 (BERT)", torch.float64): ("unmasked", "runs", "fine")}
for key, (empty, fill, nan) in expected.items():
    assert measured[key][0].startswith(empty) and measured[key][1:] == (fill, nan), (key, measured[key])
w32 = masked_softmax(row + (~nothing).float() * -1e4)
assert (w32.double() - unmasked).abs().max() < 1e-4          # float32 spacing near 1e4: 2^-10
assert torch.equal(row - 1e9, torch.full((6,), -1e9))       # float32 spacing at 1e9 is 64
assert torch.equal(row.half() - 1e4, torch.full((6,), -1e4, dtype=torch.float16))  # spacing 8
for dtype in DTYPES:
    assert torch.equal(masked_softmax(row.to(dtype), nothing), torch.zeros(6, dtype=dtype))

# %% [raw] concept="minus-1e9-empty-row"
# question: A query whose 6 keys are **all** masked by adding $-10^9$ to its scores, in float32. What
#   weights does the softmax give?
# kind: choice
# options:
#   a: Uniform, $1/6$ each
#   b: All zeros
#   c: NaN
#   d: Its unmasked weights
# answer: a
# section: '6.'
# right: 'Float32''s spacing at $10^9$ is 64, so every score becomes exactly $-10^9$: equal scores,
#   uniform weights. The row is not hidden at all; the course''s boolean mask gives 0.'
# wrong:
#   b:
#     misconception: The additive mask behaves like the boolean one
#     explain: Only the boolean mask defines an empty row's output as 0; adding $-10^9$ makes all scores
#       equal, and the softmax of equal scores is uniform (measured).
#   c:
#     misconception: $-10^9$ behaves like $-\infty$
#     explain: NaN is what $-\infty$ everywhere gives ($0/0$), and what $-10^9$ gives in float16, where
#       it overflows to $-\infty$. In float32 it is finite.
#   d:
#     misconception: Float32 keeps the scores' differences
#     explain: That is float64, whose spacing at $10^9$ is small enough to keep them; in float32 the
#       differences are rounded away.

# %% [markdown]
# For a query with *no* visible key there is no distribution to average; the course defines its
# output as 0 with finite gradients. PyTorch's own APIs disagree with each other here (measured
# with torch 2.13 on CPU: `F.sdpa`'s boolean mask gives 0, `nn.MultiheadAttention` gives NaN),
# so do not rely on them for it.

# %%
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
# ## 7. Permutation equivariance, and what a causal mask changes
#
# Nothing in $\text{softmax}(QK^\top/\sqrt{d_k})V$ knows where a token sits. Without a mask we
# expect: shuffle the positions and the outputs are shuffled the same way, with the same values
# (to float64 rounding).
#
# With a causal mask we expect the opposite: query 0 sees only key 0, so output 0 is exactly the
# value of whichever token comes first, and query $t$ averages the first $t + 1$ tokens, a set
# that changes when the order does. "Attention is order-blind" holds only **without** a causal
# mask. (Lesson 04 trains a causal model with no positional encoding and finds that it learns
# positions.)

# %%
x = torch.randn(1, 6, 8, dtype=torch.float64)
perm = torch.tensor([3, 0, 5, 1, 4, 2])
gaps = {}
for name, mask in (("no mask", None), ("causal mask", causal_mask(6))):
    out_then_perm = scaled_dot_product_attention(x, x, x, mask)[:, perm]
    perm_then_out = scaled_dot_product_attention(x[:, perm], x[:, perm], x[:, perm], mask)
    gaps[name] = (out_then_perm - perm_then_out).abs().max().item()
    print(f"{name:12s} max |attn(x)[perm] - attn(x[perm])| = {gaps[name]:.1e}")
first = scaled_dot_product_attention(x[:, perm], x[:, perm], x[:, perm], causal_mask(6))[:, 0]
print("causal: output 0 of the shuffled sequence equals the value of its first token "
      f"(token {perm[0].item()}): {torch.equal(first, x[:, perm[0]])}")
assert gaps["no mask"] < 1e-12                          # equivariant: order-blind
assert gaps["causal mask"] > 0.1                        # not equivariant: order matters
assert torch.equal(first, x[:, perm[0]])                # weight exactly 1 on itself

# %% [markdown]
# ## 8. Mask polarity across PyTorch's APIs
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

# %% [markdown]
# ## 9. The backward pass, by hand
#
# Training needs the gradients of a loss $\mathcal{L}$ with respect to $Q$, $K$ and $V$, given the
# gradient $dO = \partial \mathcal{L} / \partial O$ at the output. Write the forward pass one
# product per line and apply the chain rule to each line, last line first (shapes per head:
# $Q$ is $L \times d_k$, $K$ is $S \times d_k$, $V$ is $S \times d_v$):
#
# | forward | backward |
# |---|---|
# | $Z = Q K^\top / \sqrt{d_k}$ | $dQ = dZ\,K / \sqrt{d_k}$ $(L \times d_k)$, $\quad dK = dZ^\top Q / \sqrt{d_k}$ $(S \times d_k)$ |
# | $P = \mathrm{softmax}(Z)$, row by row | $dZ = P \odot \big(dP - \mathrm{rowsum}(dP \odot P)\big)$ $(L \times S)$ |
# | $O = P V$ | $dP = dO\,V^\top$ $(L \times S)$, $\quad dV = P^\top dO$ $(S \times d_v)$ |
#
# The last line: $O_{l} = \sum_s P_{ls} V_s$, so $\partial \mathcal{L} / \partial V_s =
# \sum_l P_{ls}\, dO_l$, which is row $s$ of $P^\top dO$, and
# $\partial \mathcal{L} / \partial P_{ls} = dO_l \cdot V_s$. The middle line is lesson 01's
# vector-Jacobian product of the softmax, once per query row: $\mathrm{rowsum}(dP \odot P)$ is
# $\langle s, g \rangle$ there. The first line is the product rule for
# $Z_{ls} = q_l \cdot k_s / \sqrt{d_k}$: each query gets its scores' gradients times the keys,
# each key its scores' gradients times the queries, and both keep the $1/\sqrt{d_k}$.
#
# **Masks.** A masked entry has $P_{ls} = 0$, so $dZ_{ls} = 0$ and $dV$ gets nothing from that
# pair: no gradient flows into a key its query may not see. A query that sees no key at all has
# a row of zeros in $P$ (section 6): its $dQ$ is 0 and it sends nothing to any key, and nothing
# in the computation divides by its empty sum, so nothing is NaN.
#
# `txlearn.attention.attention_backward(Q, K, V, dO, mask)` is this table. Expected: equal to
# autograd's gradients through `scaled_dot_product_attention` to float64 rounding, with and
# without masks, for $L \ne S$ with the bottom-right causal mask, and with a row that sees nothing.

# %%
row_blind = causal_mask(4, 7) & padding_mask([5], 7)[0]  # keys 5, 6 are padding, for every query
row_blind[1] = False                                     # and query 1 sees no key at all
cases_b = {"no mask, L = 4, S = 7": None, "causal bottom-right, L = 4, S = 7": causal_mask(4, 7),
           "causal, padding, query 1 blind": row_blind}
gaps_b = {}
for name, mask_b in cases_b.items():
    Qb = torch.randn(2, 3, 4, 8, dtype=torch.float64, requires_grad=True)   # (B, n_heads, L, d_k)
    Kb = torch.randn(2, 3, 7, 8, dtype=torch.float64, requires_grad=True)   # (B, n_heads, S, d_k)
    Vb = torch.randn(2, 3, 7, 5, dtype=torch.float64, requires_grad=True)   # (B, n_heads, S, d_v)
    dOb = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    by_autograd = torch.autograd.grad(scaled_dot_product_attention(Qb, Kb, Vb, mask_b), (Qb, Kb, Vb), dOb)
    by_hand = attention_backward(Qb.detach(), Kb.detach(), Vb.detach(), dOb, mask_b)
    gaps_b[name] = max((h - a).abs().max().item() for h, a in zip(by_hand, by_autograd))
    print(f"{name:32s} max |by hand - autograd| over dQ, dK, dV: {gaps_b[name]:.1e}")
dQb, dKb, dVb = by_hand                                  # the last case: query 1 sees nothing
print(f"query 1 (sees nothing): |dQ| = {dQb[:, :, 1].abs().max():.1e}; keys 5, 6 (padding, hidden "
      f"from every query): |dK| = {dKb[:, :, 5:].abs().max():.1e}, |dV| = {dVb[:, :, 5:].abs().max():.1e}")
assert max(gaps_b.values()) < 1e-12
assert torch.equal(dQb[:, :, 1], torch.zeros(2, 3, 8, dtype=torch.float64))   # empty row: exactly 0
assert dKb[:, :, 5:].abs().max() == 0 and dVb[:, :, 5:].abs().max() == 0    # hidden keys: nothing
assert all(torch.isfinite(g).all() for g in by_hand)

# %% [markdown]
# **What the backward pass needs from the forward, and what it costs.** The table's right column
# uses $Q$, $K$, $V$ and $P$. Autograd keeps whatever its backward formulas need, which we can
# watch with `torch.autograd.graph.saved_tensors_hooks`: every tensor saved for the backward pass
# passes through the hook. We count the bytes of distinct tensors (a view of $K$ shares its
# memory) for one head of $d_k = 64$ in float32. Expected without a mask: $Q/\sqrt{d_k}$, $K$, $V$
# ($3 T d_k$ numbers) and $P$ ($T^2$ numbers, saved once although two backward formulas use it),
# $4(3 T d_k + T^2)$ bytes, the $T^2$ term dominating from $T = 3 d_k$ on.

# %%
def saved_bytes(fn, *args):
    """Bytes of the distinct tensors autograd saves while fn(*args) runs (a storage counted once)."""
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn(*args)
    return sum(storages.values())


for T_s in (128, 512, 2048):
    Qs, Ks, Vs = (torch.randn(1, T_s, 64, requires_grad=True) for _ in range(3))
    plain = saved_bytes(scaled_dot_product_attention, Qs, Ks, Vs)
    masked = saved_bytes(scaled_dot_product_attention, Qs, Ks, Vs, causal_mask(T_s))
    formula = 4 * (3 * T_s * 64 + T_s ** 2)
    print(f"T = {T_s:4d}: saved {plain / 2**20:6.2f} MiB (formula 4 (3 T d_k + T^2) = "
          f"{formula / 2**20:6.2f} MiB); with the causal mask {masked / 2**20:6.2f} MiB")
    assert plain == formula                                        # to the byte
    assert masked == formula + 4 * T_s ** 2 + T_s ** 2 + T_s    # + P once more, the mask, a flag per row

# %% [markdown]
# The accounting holds to the byte. With a mask the teaching path keeps *two* $T \times T$ float
# matrices, which we did not expect: `masked_softmax` sets the rows that see nothing to 0 *after*
# the softmax, so the softmax's own output (saved for its backward) and the zeroed weights (saved
# for $P V$) are different tensors; add the boolean mask ($T^2$ bytes) and one flag per row (is
# it empty?). Either way, training an attention layer keeps $O(T^2)$ numbers per head until
# its backward pass runs, where the forward alone (lesson 08) needs only one block of them at a
# time. Recomputing $P$ from $Q$ and $K$ in the backward pass (`attention_backward(...,
# weights=None)` does; FlashAttention, lesson 08, does it block by block from one saved number per
# query row) trades those $T^2$ numbers for a second pass of $Q K^\top$ FLOPs.
#
# ## Summary
#
# - Attention is a differentiable dictionary: scores, softmax, a weighted average of values.
# - Separate $W_Q$ and $W_K$ let relevance be asymmetric; a shared one makes the scores a Gram
#   matrix (positive semi-definite, $s_{ij} \le \sqrt{s_{ii} s_{jj}}$): of any two tokens one
#   scores itself at least as high as the other (not: every token favours itself).
# - Masks are boolean, `True` = may attend, combined with AND; causal masks are bottom-right
#   aligned when $L \ne S$ (SDPA's `is_causal=True` is not); an empty row gives 0, not NaN.
# - A causal model generates text one token at a time from its last row of logits
#   (`sample_next`); the earlier rows never change, which is why a KV cache (lesson 03) can keep
#   their keys and values.
# - Adding $-10^9$ (the Annotated Transformer) or $-10^4$ (BERT) is exact for every row with a
#   visible key, in every dtype that holds the constant; a row with none becomes an average
#   over the padding (exactly uniform where the dtype's spacing near the constant is coarse:
#   $-10^9$ in float32, $-10^4$ in float16) or keeps its unmasked weights (where it is fine:
#   $-10^4$ in float32, both in float64). $-10^9$ overflows float16 ($-\infty$: `masked_fill`
#   refuses, an empty row and a float16 constant give NaN); $-10^4$ does not.
# - Without a mask, attention is permutation-equivariant; with a causal mask it is not (output 0
#   is the first token's value).
# - The backward pass is four products and one softmax VJP ($dV = P^\top dO$, $dP = dO V^\top$,
#   $dZ = P \odot (dP - \mathrm{rowsum}(dP \odot P))$, $dQ = dZ K/\sqrt{d_k}$, $dK = dZ^\top Q/\sqrt{d_k}$),
#   equal to autograd; masked keys and empty rows get no gradient; training keeps $T^2$ numbers per head.
#
# **Exercises:** [`work/02_attention.ipynb`](../work/02_attention.ipynb) (the causal mask; attention with a mask).
# Section 9's backward pass is exercise 2 of [`work/11_backward.ipynb`](../work/11_backward.ipynb).
