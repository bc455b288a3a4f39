# ---
# jupyter:
#   txlearn:
#     title: "Exercises 07: a transformer layer and a language model from your own modules"
#     minutes: 75
#     objectives:
#     - assemble a transformer layer, post-LN and pre-LN, from your attention, FFN, LayerNorm and residual
#     - embed tokens with positions that continue after the KV cache
#     - build a decoder-only language model whose output head is tied to its embedding, with a KV cache
#     - count a layer's parameters
#     imports: [numpy, torch, txlearn.course.earlier]
#     uses: [03_heads, 04_positional, 05_ffn, 06_norms]
#     retired:
#       post_ln_layer: transformer_layer (an nn.Module, post-LN and pre-LN, built from your modules)
# ---

# %% [markdown]
# This set assembles your own modules of sets 03-06, loaded from their notebooks below (they must
# sit in the same folder; `make lab` puts them all in `work/`). Nothing here imports a model
# class from the course's package: the layer and the model are yours. Set 09 trains the model of
# exercise 3.

# %%
import math

import torch
from torch import nn

from txlearn.course.earlier import load

MultiHeadAttention, causal_mask = load("03_heads", "MultiHeadAttention", "causal_mask")
sinusoidal_encoding = load("04_positional", "sinusoidal_encoding")
FeedForward = load("05_ffn", "FeedForward")
LayerNorm, residual = load("06_norms", "LayerNorm", "residual")

# %% [markdown]
# ## Exercise 1: `TransformerLayer`
#
# One transformer layer: attention, then the FFN, each wrapped in a residual connection with a
# LayerNorm (your `residual` of set 06):
#
# | `norm_first=False` (post-LN, the paper) | `norm_first=True` (pre-LN, GPT-2 on) |
# |---|---|
# | $h = \mathrm{LN}_1(x + \mathrm{MHA}(x))$ | $h = x + \mathrm{MHA}(\mathrm{LN}_1(x))$ |
# | $\text{out} = \mathrm{LN}_2(h + \mathrm{FFN}(h))$ | $\text{out} = h + \mathrm{FFN}(\mathrm{LN}_2(h))$ |
#
# Write `TransformerLayer(d_model, n_heads, d_ff, n_kv_heads=None, norm_first=False, eps=1e-5,
# bias=True)` with exactly four submodules, by these names: `attn`, your
# `MultiHeadAttention(d_model, n_heads, n_kv_heads, bias=bias)`; `norm1` and `norm2`, your
# `LayerNorm(d_model, eps)`; `ffn`, your `FeedForward(d_model, d_ff, bias=bias)`. Its state-dict
# names are therefore `attn.W_Q`, ..., `norm1.gamma`, `norm1.beta`, `ffn.W_1`, ..., `norm2.beta`.
#
# `forward(x, mask=None, use_cache=False)`: `x (B, T, d_model)`; pass `mask` and `use_cache` to
# the attention; return `(B, T, d_model)`. The check compares your layer with
# `torch.nn.TransformerEncoderLayer(..., activation="gelu")` holding the same weights.

# %% tags=["answer"] exercise="transformer_layer"
class TransformerLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, n_kv_heads=None, norm_first=False, eps=1e-5,
                 bias=True):
        super().__init__()
        ### BEGIN SOLUTION
        self.norm_first = norm_first
        self.attn = MultiHeadAttention(d_model, n_heads, n_kv_heads, bias=bias)
        self.norm1 = LayerNorm(d_model, eps)
        self.ffn = FeedForward(d_model, d_ff, bias=bias)
        self.norm2 = LayerNorm(d_model, eps)
        ### END SOLUTION

    def forward(self, x, mask=None, use_cache=False):
        ### BEGIN SOLUTION
        def attention(h):
            return self.attn(h, mask=mask, use_cache=use_cache)

        h = residual(x, attention, self.norm1, self.norm_first)        # (B, T, d_model)
        return residual(h, self.ffn, self.norm2, self.norm_first)
        ### END SOLUTION

# %% tags=["check"] exercise="transformer_layer"
from txlearn.checks import check
check("transformer_layer", TransformerLayer)

# %% [markdown]
# ## Exercise 2: token embeddings with positions
#
# Write `TokenEmbedding(n_vocab, d_model)` with one parameter, the table `W_E (n_vocab, d_model)`,
# and `forward(ids, start=0)`: `ids` is an int64 tensor `(B, T)`; return the float tensor
# `(B, T, d_model)`
#
# $$x_t = W_E[\text{ids}_t]\,\sqrt{d_{model}} + PE[\text{start} + t],$$
#
# the paper's embedding (section 3.4 scales it by $\sqrt{d_{model}}$) plus your sinusoidal table
# of set 04 at positions `start, ..., start + T - 1` (`start` is the number of positions already
# cached when decoding with a KV cache).

# %% tags=["answer"] exercise="token_embedding"
class TokenEmbedding(nn.Module):
    def __init__(self, n_vocab, d_model):
        super().__init__()
        ### BEGIN SOLUTION
        self.d_model = d_model
        self.W_E = nn.Parameter(torch.randn(n_vocab, d_model) / math.sqrt(d_model))
        ### END SOLUTION

    def forward(self, ids, start=0):
        ### BEGIN SOLUTION
        T = ids.shape[-1]
        table = sinusoidal_encoding(start + T, self.d_model)[start:]    # (T, d_model)
        scaled = self.W_E[ids] * math.sqrt(self.d_model)                # (B, T, d_model)
        return scaled + table.to(scaled.dtype)
        ### END SOLUTION

# %% tags=["check"] exercise="token_embedding"
from txlearn.checks import check
check("token_embedding", TokenEmbedding)

# %% [markdown]
# ## Exercise 3: a language model with a tied output head
#
# A decoder-only language model: token embeddings, `n_layers` pre-LN layers under a causal mask,
# a final LayerNorm (pre-LN leaves the residual stream unnormalised), and logits from the
# embedding table itself, transposed (weight tying; paper section 3.4, Press and Wolf 2017):
#
# $$\text{logits} = \mathrm{LN}(h)\, W_E^\top \qquad (B, T, n_{vocab}).$$
#
# Write `LanguageModel(n_vocab, d_model, n_heads, d_ff, n_layers, n_kv_heads=None)` with the
# submodules `embed` (your `TokenEmbedding`), `layers` (an `nn.ModuleList` of `n_layers` of your
# `TransformerLayer(..., norm_first=True)`) and `norm` (your `LayerNorm(d_model)`): state-dict
# names `embed.W_E`, `layers.0.attn.W_Q`, ..., `norm.gamma`, `norm.beta`, and no output matrix of
# its own.
#
# `forward(ids, use_cache=False)` returns the logits `(B, T, n_vocab)` (not probabilities). With
# `use_cache=True` the new tokens continue the cached sequence: `start` is the number of positions
# the first layer's attention has cached (0 when its `kv_cache` is `None`), the embedding starts at
# `start`, the mask is `causal_mask(T, start + T)`, and every layer gets `use_cache=True`.
# `reset_cache()` (given) empties every layer's cache before a new sequence.

# %% tags=["answer"] exercise="language_model"
class LanguageModel(nn.Module):
    def __init__(self, n_vocab, d_model, n_heads, d_ff, n_layers, n_kv_heads=None):
        super().__init__()
        ### BEGIN SOLUTION
        self.embed = TokenEmbedding(n_vocab, d_model)
        self.layers = nn.ModuleList(
            TransformerLayer(d_model, n_heads, d_ff, n_kv_heads, norm_first=True)
            for _ in range(n_layers))
        self.norm = LayerNorm(d_model)
        ### END SOLUTION

    def reset_cache(self):
        for layer in self.layers:
            layer.attn.kv_cache = None

    def forward(self, ids, use_cache=False):
        ### BEGIN SOLUTION
        cache = self.layers[0].attn.kv_cache
        start = cache[0].shape[2] if (use_cache and cache is not None) else 0
        T = ids.shape[-1]
        h = self.embed(ids, start)                                      # (B, T, d_model)
        mask = causal_mask(T, start + T)                                # (T, start + T)
        for layer in self.layers:
            h = layer(h, mask=mask, use_cache=use_cache)
        return self.norm(h) @ self.embed.W_E.T                          # (B, T, n_vocab)
        ### END SOLUTION

# %% tags=["check"] exercise="language_model"
from txlearn.checks import check
check("language_model", LanguageModel)

# %% [markdown]
# ## Exercise 4: how many parameters does one layer have?
#
# Write `layer_param_count(d_model, n_heads, d_ff)` returning an `int`: the number of
# parameters of your `TransformerLayer(d_model, n_heads, d_ff)` of exercise 1 (multi-head
# attention with biases and `n_kv_heads = n_heads`, a GELU FFN with biases, two LayerNorms with
# `gamma` and `beta`). Think about which sizes `n_heads` changes. For the paper's base layer
# (`d_model = 512`, `d_ff = 2048`) the lesson's counter gives 3,152,384.

# %% tags=["answer"] exercise="layer_param_count"
def layer_param_count(d_model, n_heads, d_ff):
    ### BEGIN SOLUTION
    attention = 4 * d_model * d_model + 4 * d_model  # W_Q, W_K, W_V, W_O and their biases
    ffn = 2 * d_model * d_ff + d_ff + d_model  # W_1, W_2, b_1, b_2
    norms = 2 * 2 * d_model  # gamma and beta, twice
    return attention + ffn + norms
    ### END SOLUTION

# %% tags=["check"] exercise="layer_param_count"
from txlearn.checks import check
check("layer_param_count", layer_param_count)
