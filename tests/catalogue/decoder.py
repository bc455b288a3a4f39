"""Reference and catalogued wrong answers for lesson 10's checks (txlearn/checks/decoder.py)."""

import numpy as np


# ------------------------------------------------------------------ rope_pairing_permutation

def to_half_ref(W, n_heads):
    d_in, width = W.shape
    heads = W.reshape(d_in, n_heads, width // n_heads)                    # (d_in, n_heads, d_k)
    heads = np.concatenate([heads[..., 0::2], heads[..., 1::2]], axis=-1)  # evens, then odds
    return heads.reshape(d_in, width)


def to_half_identity(W, n_heads):
    return W                                                               # forgot to permute


def to_half_whole_width(W, n_heads):
    return np.concatenate([W[:, 0::2], W[:, 1::2]], axis=1)                # ignores the heads


def to_half_inverse(W, n_heads):
    d_in, width = W.shape
    d_k = width // n_heads
    heads = W.reshape(d_in, n_heads, 2, d_k // 2)                          # (.., halves, d_k/2)
    return heads.swapaxes(2, 3).reshape(d_in, width)                       # half -> interleaved


def to_half_odd_first(W, n_heads):
    d_in, width = W.shape
    heads = W.reshape(d_in, n_heads, width // n_heads)
    return np.concatenate([heads[..., 1::2], heads[..., 0::2]], axis=-1).reshape(d_in, width)


def to_half_rows(W, n_heads):
    return to_half_ref(W.T, n_heads).T                                     # PyTorch's row habit


def to_half_strided_heads(W, n_heads):
    d_in, width = W.shape
    heads = W.reshape(d_in, width // n_heads, n_heads).swapaxes(1, 2)      # heads as a stride
    heads = np.concatenate([heads[..., 0::2], heads[..., 1::2]], axis=-1)
    return heads.swapaxes(1, 2).reshape(d_in, width)


# ------------------------------------------------------------------ kv_cache_from_metadata

def kv_ref(metadata, context, bytes_per_value):
    n_layers = metadata["llama.block_count"]
    n_kv_heads = metadata["llama.attention.head_count_kv"]
    d_k = metadata["llama.embedding_length"] // metadata["llama.attention.head_count"]
    return 2 * n_layers * n_kv_heads * d_k * context * bytes_per_value


def kv_no_two(metadata, context, bytes_per_value):
    return kv_ref(metadata, context, bytes_per_value) // 2


def kv_query_heads(metadata, context, bytes_per_value):
    d_model = metadata["llama.embedding_length"]
    return 2 * metadata["llama.block_count"] * d_model * context * bytes_per_value


def kv_d_k_from_kv_heads(metadata, context, bytes_per_value):
    n_kv = metadata["llama.attention.head_count_kv"]
    d_k = metadata["llama.embedding_length"] // n_kv                       # the wrong head count
    return 2 * metadata["llama.block_count"] * n_kv * d_k * context * bytes_per_value


def kv_trained_context(metadata, context, bytes_per_value):
    return kv_ref(metadata, metadata["llama.context_length"], bytes_per_value)


def kv_bits(metadata, context, bytes_per_value):
    return kv_ref(metadata, context, bytes_per_value * 8)


def kv_mib(metadata, context, bytes_per_value):
    return kv_ref(metadata, context, bytes_per_value) / 2**20


def kv_no_layers(metadata, context, bytes_per_value):
    return kv_ref(metadata, context, bytes_per_value) // metadata["llama.block_count"]


REFERENCE = {
    "rope_pairing_permutation": (to_half_ref,),
    "kv_cache_from_metadata": (kv_ref,),
}

WRONG = {
    "rope_pairing_permutation": [
        ("returns W unchanged", (to_half_identity,), "nothing moved"),
        ("permutes the whole width", (to_half_whole_width,), "not across the whole width"),
        ("the inverse permutation", (to_half_inverse,), "that is the inverse"),
        ("odd channels first", (to_half_odd_first,), "even channels first"),
        ("permutes rows", (to_half_rows,), "its columns (axis 1)"),
        ("heads taken as a stride", (to_half_strided_heads,), "contiguous blocks"),
    ],
    "kv_cache_from_metadata": [
        ("no factor 2", (kv_no_two,), "a factor 2"),
        ("query heads", (kv_query_heads,), "only the key/value heads are cached"),
        ("d_k from the KV heads", (kv_d_k_from_kv_heads,), "d_k comes from the query heads"),
        ("trained context", (kv_trained_context,), "context` argument"),
        ("bits", (kv_bits,), "do not multiply by 8"),
        ("MiB", (kv_mib,), "not MiB"),
        ("no layers", (kv_no_layers,), "every layer"),
    ],
}
