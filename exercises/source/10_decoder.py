# ---
# jupyter:
#   txlearn:
#     title: "Exercises 10: a modern decoder"
#     minutes: 25
#     objectives:
#     - convert a model's W_Q and W_K between the two RoPE pairings without changing a score
#     - size a real model's KV cache from its file's metadata
#     imports: [numpy]
#     limits: {call_seconds: 60, memory_mb: 6144}
# ---

# %% [markdown]
# Both exercises are checked on the real model of the lesson, SmolLM2-135M-Instruct, read from
# its GGUF file. Use NumPy. Weights are `(d_in, d_out)` and applied as `x @ W`.

# %%
import numpy as np

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
# A GGUF file describes its model in metadata. `txlearn.models.gguf.read_metadata()` returns it
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
