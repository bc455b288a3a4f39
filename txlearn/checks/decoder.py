"""Checks for lesson 10's exercises: the permutation between the two RoPE pairings (checked on
SmolLM2's own W_Q and W_K) and the model's KV-cache size read from its GGUF metadata.

Each check computes the right answer with :mod:`txlearn.models.gguf`, :mod:`txlearn.positional`
and :func:`txlearn.heads.kv_cache_bytes`; when the learner's answer differs, it is compared with
the catalogued mistakes (tests/catalogue/decoder.py) to choose the hint. The learner's functions
receive only NumPy arrays, ints and a dict of ints.
"""

import numpy as np

from txlearn.checks import call, diagnose, exercise, expect_close, expect_shape
from txlearn.heads import kv_cache_bytes
from txlearn.positional import apply_rope_np, half_to_interleaved, interleaved_to_half


# ---------------------------------------------------------------- exercise: rope_pairing_permutation

PERM_IDENTITY = ("did any column move?",
                 "nothing moved: within each head, the even channels 0, 2, 4, ... come first, "
                 "then the odd ones 1, 3, 5, ...")
PERM_WHOLE_WIDTH = ("each head is permuted on its own",
                    "permute within each head, not across the whole width: reshape to (d_in, "
                    "n_heads, d_k) first, so every head keeps its own d_k columns")
PERM_INVERSE = ("which way does the conversion go?",
                "that is the inverse (half to interleaved): the pair (2i, 2i+1) must land at "
                "(i, i + d_k/2), so new column i is old column 2i and new column i + d_k/2 is "
                "old column 2i+1")
PERM_ODD_FIRST = ("which channel of a pair comes first?",
                  "even channels first: new column i is old column 2i (the first of pair i), "
                  "new column i + d_k/2 is old column 2i+1")
PERM_ROWS = ("which axis of W holds the heads?",
             "W is (d_in, d_out), applied as x @ W: the output features, and so the heads, are "
             "its columns (axis 1), not its rows")
PERM_STRIDED_HEADS = ("how are the heads laid out in W's columns?",
                      "heads are contiguous blocks of d_k columns (head h = columns h*d_k .. "
                      "(h+1)*d_k - 1): reshape to (d_in, n_heads, d_k), not (d_in, d_k, n_heads)")


def _per_head(W, n_heads, f):
    d_in, width = W.shape
    return f(W.reshape(d_in, n_heads, width // n_heads)).reshape(d_in, width)


def _perm_mistakes(W, n_heads):
    d_in, width = W.shape
    d_k = width // n_heads
    odd_first = lambda h: np.concatenate([h[..., 1::2], h[..., 0::2]], -1)  # noqa: E731
    strided = interleaved_to_half(W.reshape(d_in, d_k, n_heads).swapaxes(1, 2))  # (d_in, n_heads, d_k)
    strided = strided.swapaxes(1, 2).reshape(d_in, width)
    mistakes = [(W, PERM_IDENTITY), (interleaved_to_half(W), PERM_WHOLE_WIDTH),
                (_per_head(W, n_heads, half_to_interleaved), PERM_INVERSE),
                (_per_head(W, n_heads, odd_first), PERM_ODD_FIRST), (strided, PERM_STRIDED_HEADS)]
    if d_in == width:
        mistakes.append((_per_head(W.T, n_heads, interleaved_to_half).T, PERM_ROWS))
    return mistakes


def _check_permutation(fn, W, n_heads, case):
    got = call(fn, W.copy(), n_heads, case=case,
               hint=("W is (d_in, n_heads * d_k): reorder its columns, head by head",))
    expect_shape(got, W.shape, case=case,
                 hint=("return an array of W's shape (d_in, n_heads * d_k)",))
    expected = _per_head(W, n_heads, interleaved_to_half)
    expect_close(got, expected, case=case, atol=0, rtol=0,
                 hint=diagnose(got, _perm_mistakes(W, n_heads), PERM_DEFAULT, rtol=0, atol=0))
    return got


PERM_DEFAULT = ("within each head, new column i is old column 2i and new column i + d_k/2 is old "
                "column 2i+1",)
KV_DEFAULT = ("bytes = 2 * layers * head_count_kv * d_k * context * bytes_per_value",)
# the hints given when no catalogued mistake is recognised (tests assert a mistake never gets them)
DEFAULTS = {"rope_pairing_permutation": [PERM_DEFAULT], "kv_cache_from_metadata": [KV_DEFAULT]}


@exercise("rope_pairing_permutation")
def rope_pairing_permutation(to_half_pairing):
    rows = np.arange(16.0)[:, None] * 100.0
    W = rows + np.arange(16.0)[None, :]              # W[r, c] = 100 r + c: every entry says where it was
    _check_permutation(to_half_pairing, W, 2, "2 heads of d_k = 8, W[r, c] = 100 r + c")

    from txlearn.models.gguf import read_config, read_tensor

    config = read_config()
    W_Q = read_tensor("blk.0.attn_q.weight").T.astype(np.float64)   # (d_model, n_heads * d_k)
    W_K = read_tensor("blk.0.attn_k.weight").T.astype(np.float64)   # (d_model, n_kv_heads * d_k)
    Q_half = _check_permutation(to_half_pairing, W_Q, config.n_heads, "SmolLM2 layer 0, W_Q with n_heads = 9")
    K_half = _check_permutation(to_half_pairing, W_K, config.n_kv_heads, "SmolLM2 layer 0, W_K with n_kv_heads = 3")

    # what the permutation is for: the same attention scores under the other pairing
    case = "SmolLM2 layer 0: scores q . k of head 0 at positions 0..5, half pairing on your weights"
    x = np.random.default_rng(10).normal(size=(6, config.d_model))
    d_k, base = config.d_k, config.rope_base

    def scores(W_q, W_k, pairing):
        q = apply_rope_np(x @ W_q[:, :d_k], None, pairing, base)    # head 0, (6, d_k)
        k = apply_rope_np(x @ W_k[:, :d_k], None, pairing, base)    # its KV head 0
        return q @ k.T                                            # (6, 6)

    expect_close(scores(Q_half, K_half, "half"), scores(W_Q, W_K, "interleaved"), case=case,
                 rtol=1e-9, atol=1e-9, hint=("the permuted weights must give the file's scores",))


# ---------------------------------------------------------------- exercise: kv_cache_from_metadata

KV_NO_TWO = ("what does a KV cache hold?", "cache both keys and values: a factor 2")
KV_QUERY_HEADS = ("how many heads have keys and values in this model?",
                  "only the key/value heads are cached: llama.attention.head_count_kv of them, each "
                  "d_k = embedding_length / head_count wide (d_k comes from the query heads)")
KV_TRAINED_CONTEXT = ("how many tokens are cached?",
                      "use the `context` argument (the tokens actually cached), not the longest "
                      "context the model was trained for (llama.context_length)")
KV_BITS = ("check the unit of bytes_per_value",
           "bytes_per_value is already in bytes (bf16: 2): do not multiply by 8")
KV_MIB = ("check the unit of the result", "return bytes, not MiB or GiB (no division by 2**20)")
KV_NO_LAYERS = ("how many caches does the model keep?",
                "every layer (llama.block_count of them) has its own cache")


def _kv_expected(meta, context, bytes_per_value, **override):
    sizes = dict(n_layers=meta["llama.block_count"], n_kv_heads=meta["llama.attention.head_count_kv"],
                 d_k=meta["llama.embedding_length"] // meta["llama.attention.head_count"],
                 context=context, dtype=bytes_per_value)
    sizes.update(override)
    return kv_cache_bytes(**sizes)


def _kv_mistakes(meta, context, b):
    right = _kv_expected(meta, context, b)
    return [(right / 2, KV_NO_TWO),
            (_kv_expected(meta, context, b, n_kv_heads=meta["llama.attention.head_count"]),
             KV_QUERY_HEADS),
            (_kv_expected(meta, meta["llama.context_length"], b), KV_TRAINED_CONTEXT),
            (right * 8, KV_BITS), (right / 2**20, KV_MIB), (right / meta["llama.block_count"],
                                                           KV_NO_LAYERS)]


def _check_kv(fn, meta, context, b, case):
    got = call(fn, dict(meta), context, b, case=case)
    expect_close(got, _kv_expected(meta, context, b), case=case, rtol=0, atol=0.5,
                 hint=diagnose(got, _kv_mistakes(meta, context, b), KV_DEFAULT, rtol=1e-9,
                               atol=0.5))


@exercise("kv_cache_from_metadata")
def kv_cache_from_metadata(kv_cache_size):
    toy = {"general.architecture": "llama", "llama.block_count": 4, "llama.embedding_length": 96,
           "llama.attention.head_count": 6, "llama.attention.head_count_kv": 2,
           "llama.context_length": 500, "llama.feed_forward_length": 256,
           "llama.rope.dimension_count": 16}
    _check_kv(kv_cache_size, toy, 100, 2, "a toy model: 4 layers, d_model 96, 6 heads, 2 KV heads, 100 tokens, bf16")

    from txlearn.models.gguf import read_metadata

    meta = {k: v for k, v in read_metadata().items() if isinstance(v, int)}
    _check_kv(kv_cache_size, meta, 8192, 2, "SmolLM2-135M at 8192 tokens in bf16 (180 MiB)")
    _check_kv(kv_cache_size, meta, 1000, 4, "SmolLM2-135M at 1000 tokens in float32")
