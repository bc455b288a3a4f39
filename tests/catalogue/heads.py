"""Reference answers and catalogued wrong answers for lesson 03's checks (txlearn/checks/heads.py)."""

import numpy as np


# ------------------------------------------------------------------ split_merge_heads

def split_ref(x, n_heads):
    B, T, d_model = x.shape
    x = x.reshape(B, T, n_heads, d_model // n_heads)  # (B, T, h, d_k)
    return x.transpose(0, 2, 1, 3)  # (B, h, T, d_k)


def merge_ref(x):
    B, h, T, d_k = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, h * d_k)


def split_no_transpose(x, n_heads):
    B, T, d_model = x.shape
    return x.reshape(B, n_heads, T, d_model // n_heads)


def split_strided(x, n_heads):
    B, T, d_model = x.shape
    return x.reshape(B, T, d_model // n_heads, n_heads).transpose(0, 3, 1, 2)


def merge_no_transpose(x):
    B, h, T, d_k = x.shape
    return x.reshape(B, T, h * d_k)


# ------------------------------------------------------------------ multi_head_forward

def _attention(Q, K, V, mask, scale):
    s = Q @ np.swapaxes(K, -1, -2) / scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    w = e / e.sum(-1, keepdims=True)
    return w @ V, w


def _mha(x, W_Q, W_K, W_V, W_O, n_heads, mask=None, scale_by="d_k", merge=merge_ref,
         use_W_O=True):
    d_k = x.shape[-1] // n_heads
    Q, K, V = (split_ref(x @ W, n_heads) for W in (W_Q, W_K, W_V))  # (B, h, T, d_k)
    scale = {"d_k": np.sqrt(d_k), "d_model": np.sqrt(x.shape[-1]), "none": 1.0}[scale_by]
    heads, w = _attention(Q, K, V, mask, scale)
    merged = merge(heads)  # (B, T, d_model)
    return (merged @ W_O if use_W_O else merged), w


def mha_ref(x, W_Q, W_K, W_V, W_O, n_heads, mask=None):
    return _mha(x, W_Q, W_K, W_V, W_O, n_heads, mask)


def mha_sqrt_d_model(x, W_Q, W_K, W_V, W_O, n_heads, mask=None):
    return _mha(x, W_Q, W_K, W_V, W_O, n_heads, mask, scale_by="d_model")


def mha_no_scale(x, W_Q, W_K, W_V, W_O, n_heads, mask=None):
    return _mha(x, W_Q, W_K, W_V, W_O, n_heads, mask, scale_by="none")


def mha_no_W_O(x, W_Q, W_K, W_V, W_O, n_heads, mask=None):
    return _mha(x, W_Q, W_K, W_V, W_O, n_heads, mask, use_W_O=False)


def mha_wrong_merge(x, W_Q, W_K, W_V, W_O, n_heads, mask=None):
    return _mha(x, W_Q, W_K, W_V, W_O, n_heads, mask, merge=merge_no_transpose)


def mha_output_only(x, W_Q, W_K, W_V, W_O, n_heads, mask=None):
    return mha_ref(x, W_Q, W_K, W_V, W_O, n_heads, mask)[0]


# ------------------------------------------------------------------ grouped_query_attention

def _gqa(Q, K, V, mask, share):
    r = Q.shape[1] // K.shape[1]
    return _attention(Q, share(K, r), share(V, r), mask, np.sqrt(Q.shape[-1]))[0]


def _safe_attention(Q, K, V, mask):
    return _attention(Q, K, V, mask, np.sqrt(Q.shape[-1]))[0]


def gqa_ref(Q, K, V, mask=None):
    r = Q.shape[1] // K.shape[1]
    K = np.repeat(K, r, axis=1)  # (B, n_heads, S, d_k): kv head g serves heads g*r .. g*r+r-1
    V = np.repeat(V, r, axis=1)
    return _safe_attention(Q, K, V, mask)


def gqa_tiled(Q, K, V, mask=None):
    return _gqa(Q, K, V, mask, lambda X, r: np.tile(X, (1, r, 1, 1)))


def gqa_first_head_only(Q, K, V, mask=None):
    return _gqa(Q, K, V, mask, lambda X, r: X[:, :1])


# ------------------------------------------------------------------ kv_cache_memory

def kv_ref(n_layers, n_heads, n_kv_heads, d_model, context, bytes_per_element):
    d_k = d_model // n_heads
    return 2 * n_layers * n_kv_heads * d_k * context * bytes_per_element


def kv_no_factor_2(n_layers, n_heads, n_kv_heads, d_model, context, bytes_per_element):
    return kv_ref(n_layers, n_heads, n_kv_heads, d_model, context, bytes_per_element) // 2


def kv_uses_d_model(n_layers, n_heads, n_kv_heads, d_model, context, bytes_per_element):
    return 2 * n_layers * d_model * context * bytes_per_element


REFERENCE = {
    "split_merge_heads": (split_ref, merge_ref),
    "multi_head_forward": (mha_ref,),
    "grouped_query_attention": (gqa_ref,),
    "kv_cache_memory": (kv_ref,),
}

def _with_broken_split():
    """The reference multi-head answer, defined beside a wrong split_heads that it calls (as in a
    learner's notebook, where exercise 2 uses exercise 1's functions)."""
    namespace = {"np": np, "merge_heads": merge_ref, "split_heads": split_no_transpose}
    exec(
        "def multi_head_attention(x, W_Q, W_K, W_V, W_O, n_heads, mask=None):\n"
        "    Q, K, V = (split_heads(x @ W, n_heads) for W in (W_Q, W_K, W_V))\n"
        "    s = Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])\n"
        "    if mask is not None:\n"
        "        s = np.where(mask, s, -np.inf)\n"
        "    w = np.exp(s - s.max(-1, keepdims=True))\n"
        "    w = w / w.sum(-1, keepdims=True)\n"
        "    return merge_heads(w @ V) @ W_O, w\n", namespace)
    return namespace["multi_head_attention"]


WRONG = {
    "split_merge_heads": [
        ("split reshapes straight to (B, h, T, d_k)", (split_no_transpose, merge_ref),
         "mixes features of different positions"),
        ("split takes strided features", (split_strided, merge_ref), "contiguous slice"),
        ("merge forgets the transpose", (split_ref, merge_no_transpose), "swap axes 1 and 2 back"),
    ],
    "multi_head_forward": [
        ("scaled by sqrt(d_model)", (mha_sqrt_d_model,), "not by sqrt(d_model)"),
        ("not scaled", (mha_no_scale,), "you did not scale"),
        ("W_O forgotten", (mha_no_W_O,), "project with W_O"),
        ("heads merged in the wrong order", (mha_wrong_merge,), "mixes positions"),
        ("weights not returned", (mha_output_only,), "return out, weights"),
        ("its own split_heads is wrong", (_with_broken_split(),), "fix exercise 1 first"),
    ],
    "grouped_query_attention": [
        ("kv heads tiled instead of repeated", (gqa_tiled,), "np.tile"),
        ("only kv head 0 used", (gqa_first_head_only,), "not always head 0"),
    ],
    "kv_cache_memory": [
        ("K only, no factor 2", (kv_no_factor_2,), "keys AND values"),
        ("d_model instead of n_kv_heads * d_k", (kv_uses_d_model,), "not d_model"),
    ],
}
