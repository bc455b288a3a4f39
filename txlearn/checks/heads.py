"""Checks for lesson 03's exercises: split/merge heads, a multi-head forward pass, grouped-query
attention (sharing keys and values across query heads) and the KV-cache memory formula.

References come from :mod:`txlearn.heads` and from ``F.scaled_dot_product_attention(...,
enable_gqa=True)``; when the learner's answer differs, it is compared with the catalogued
mistakes (tests/catalogue/heads.py) to choose the hint.
"""

import numpy as np
import torch
import torch.nn.functional as F

from txlearn.attention import attention_np
from txlearn.checks import CheckFailure, as_array, diagnose, call, expect_close, expect_shape, expect_true, exercise
from txlearn.heads import MultiHeadAttention, kv_cache_bytes
from txlearn.masks import causal_mask_np


def _pair(result, case):
    expect_true(isinstance(result, (tuple, list)) and len(result) == 2, case=case,
                message=f"expected a pair (out, weights), got {type(result).__name__}",
                hint="return out, weights")
    return result


# ---------------------------------------------------------------- exercise: split_merge_heads

SPLIT_NO_TRANSPOSE = ("reshape to (B, T, n_heads, d_k) first, then swap axes 1 and 2; reshaping "
                      "straight to (B, n_heads, T, d_k) mixes features of different positions")
SPLIT_STRIDED = ("each head is a contiguous slice of d_k features (head h = features h*d_k .. "
                 "(h+1)*d_k - 1): reshape to (B, T, n_heads, d_k), not (B, T, d_k, n_heads)")
MERGE_NO_TRANSPOSE = ("merge: swap axes 1 and 2 back to (B, T, n_heads, d_k) before reshaping to "
                      "(B, T, d_model); reshaping (B, n_heads, T, d_k) directly mixes positions")


def _split_ref(x, n_heads):
    B, T, d_model = x.shape
    return x.reshape(B, T, n_heads, d_model // n_heads).transpose(0, 2, 1, 3)


@exercise("split_merge_heads")
def split_merge_heads(split_heads, merge_heads):
    x = np.arange(18.0).reshape(1, 3, 6)  # B=1, T=3, d_model=6
    case = "split_heads(x, 2), x = arange(18).reshape(1, 3, 6)"
    got = call(split_heads, x, 2, case=case)
    expect_shape(got, (1, 2, 3, 3), case=case, hint="split_heads returns (B, n_heads, T, d_k)")
    wrongs = [(x.reshape(1, 2, 3, 3), SPLIT_NO_TRANSPOSE),
              (x.reshape(1, 3, 3, 2).transpose(0, 3, 1, 2), SPLIT_STRIDED)]
    expect_close(got, _split_ref(x, 2), case=case, atol=0,
                 hint=diagnose(got, wrongs, "head h of position t holds x[b, t, h*d_k:(h+1)*d_k]", atol=1e-5))

    case = "merge_heads of a (1, 2, 3, 3) split"
    got = call(merge_heads, _split_ref(x, 2), case=case)
    expect_shape(got, (1, 3, 6), case=case, hint="merge_heads returns (B, T, n_heads * d_k)")
    expect_close(got, x, case=case, atol=0,
                 hint=diagnose(got, [(_split_ref(x, 2).reshape(1, 3, 6), MERGE_NO_TRANSPOSE)],
                                "merge_heads must undo split_heads", atol=1e-5))

    x = np.random.default_rng(0).normal(size=(2, 5, 12))
    for n_heads in (4, 1, 12):
        case = f"round trip, x (2, 5, 12), n_heads = {n_heads}"
        heads = call(split_heads, x, n_heads, case=case)
        expect_close(heads, _split_ref(x, n_heads), case=case, atol=0,
                     hint="split_heads: reshape (B, T, n_heads, d_k), then swap axes 1 and 2")
        expect_close(call(merge_heads, as_array(heads, np.float64), case=case), x, case=case, atol=0,
                     hint=MERGE_NO_TRANSPOSE)


# ---------------------------------------------------------------- exercise: multi_head_forward

SCALE_D_MODEL = ("scale each head's scores by sqrt(d_k) = sqrt(d_model / n_heads), the width of "
                 "one head, not by sqrt(d_model)")
NO_W_O = "after merging the heads, project with W_O: out = merge_heads(heads) @ W_O"
MERGE_ORDER = MERGE_NO_TRANSPOSE
NO_SCALE = "divide each head's scores by sqrt(d_k) (you did not scale them)"


def _mha_ref(x, W_Q, W_K, W_V, W_O, n_heads, mask=None):
    d_model = x.shape[-1]
    m = MultiHeadAttention(d_model, n_heads, bias=False).double()
    with torch.no_grad():
        for p, w in ((m.W_Q, W_Q), (m.W_K, W_K), (m.W_V, W_V), (m.W_O, W_O)):
            p.copy_(torch.from_numpy(w))
    mask_t = None if mask is None else torch.from_numpy(mask)
    with torch.no_grad():
        out, w = m(torch.from_numpy(x), mask=mask_t, return_weights=True)
    return out.numpy(), w.numpy()


def _mha_variant(x, W_Q, W_K, W_V, W_O, n_heads, mask, scale, merge_ok=True, use_W_O=True):
    """A NumPy multi-head pass with a chosen mistake, to recognise the learner's answer."""
    B, T, d_model = x.shape
    Q, K, V = (_split_ref(x @ W, n_heads) for W in (W_Q, W_K, W_V))  # (B, h, T, d_k)
    s = Q @ K.transpose(0, 1, 3, 2) / scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    w = e / e.sum(-1, keepdims=True)
    heads = w @ V  # (B, h, T, d_k)
    merged = heads.transpose(0, 2, 1, 3).reshape(B, T, d_model) if merge_ok else \
        heads.reshape(B, T, d_model)
    return (merged @ W_O if use_W_O else merged), w


def _broken_split_merge(fn) -> str:
    """A hint naming exercise 1 when the learner's own split_heads/merge_heads, which their
    multi-head answer calls, are still wrong (else ``""``): the root cause, not this answer."""
    helpers = getattr(fn, "__globals__", {})
    split, merge = helpers.get("split_heads"), helpers.get("merge_heads")
    if split is None or merge is None:
        return ""
    x = np.arange(24.0).reshape(1, 3, 8)
    try:
        ok = (np.allclose(as_array(call(split, x.copy(), 2, case="split"), np.float64), _split_ref(x, 2))
              and np.allclose(as_array(call(merge, _split_ref(x, 2), case="merge"), np.float64), x))
    except (CheckFailure, TypeError, ValueError):
        ok = False
    return "" if ok else ("your split_heads / merge_heads (exercise 1) do not pass yet and this "
                          "answer uses them: fix exercise 1 first")


@exercise("multi_head_forward")
def multi_head_forward(multi_head_attention):
    try:
        _multi_head_forward(multi_head_attention)
    except CheckFailure as err:
        root = _broken_split_merge(multi_head_attention)
        if not root:
            raise
        raise CheckFailure(str(err).split("\nHint:")[0] + "\nHint: " + root) from None


def _multi_head_forward(multi_head_attention):
    # 1. identity weights, d_model = 8, n_heads = 2: head 0's raw scores for query 0 are [4, 0]
    x = np.zeros((1, 2, 8))
    x[0, 0, :4] = 1.0
    x[0, 1, 4:] = [1.0, -1.0, 2.0, 0.5]
    eye = np.eye(8)
    case = "identity weights, d_model = 8, n_heads = 2, head 0 raw scores [4, 0]"
    out, w = _pair(call(multi_head_attention, x, eye, eye, eye, eye, 2, case=case), case)
    expect_shape(w, (1, 2, 2, 2), case=case, hint="weights are per head: (B, n_heads, T, T)")
    row = as_array(w, np.float64)[0, 0, 0]  # head 0, query 0
    expect_close(row, [0.880797, 0.119203], case=case + ", weights[0, 0, 0]", atol=1e-6,
                 hint=diagnose(row, [([0.804430, 0.195570], SCALE_D_MODEL),
                                      ([0.982014, 0.017986], NO_SCALE)],
                                "weights = softmax(Q_h K_h^T / sqrt(d_k)) per head", atol=1e-5))

    # 2. random weights, causal mask
    rng = np.random.default_rng(1)
    B, T, d_model, n_heads = 2, 5, 12, 3
    x = rng.normal(size=(B, T, d_model))
    W_Q, W_K, W_V, W_O = (rng.normal(size=(d_model, d_model)) / np.sqrt(d_model) for _ in range(4))
    mask = causal_mask_np(T)
    case = "random weights, B = 2, T = 5, d_model = 12, n_heads = 3, causal mask"
    out, w = _pair(call(multi_head_attention, x, W_Q, W_K, W_V, W_O, n_heads, mask, case=case),
                   case)
    ref_out, ref_w = _mha_ref(x, W_Q, W_K, W_V, W_O, n_heads, mask)
    d_k = d_model // n_heads
    args = (x, W_Q, W_K, W_V, W_O, n_heads, mask)
    wrongs = [(_mha_variant(*args, np.sqrt(d_k), use_W_O=False)[0], NO_W_O),
              (_mha_variant(*args, np.sqrt(d_k), merge_ok=False)[0], MERGE_ORDER),
              (_mha_variant(*args, np.sqrt(d_model))[0], SCALE_D_MODEL)]
    expect_shape(w, ref_w.shape, case=case, hint="weights are per head: (B, n_heads, T, T)")
    expect_close(w, ref_w, case=case + ", weights", atol=1e-6,
                 hint="Q = x @ W_Q split into heads; weights = softmax(Q K^T / sqrt(d_k)) with "
                      "the mask (True = may attend)")
    expect_shape(out, ref_out.shape, case=case, hint="out has shape (B, T, d_model)")
    expect_close(out, ref_out, case=case + ", out", atol=1e-6,
                 hint=diagnose(out, wrongs, "out = merge_heads(weights @ V) @ W_O", atol=1e-5))


# ---------------------------------------------------------------- exercise: grouped_query_attention

GQA_TILED = ("consecutive query heads share one key/value head: query head h reads kv head "
             "h // (n_heads // n_kv_heads), so repeat each kv head in place (np.repeat(K, r, "
             "axis=1)), not the whole stack (np.tile), which is the grouping SDPA's enable_gqa "
             "does not use")
GQA_ONE_HEAD = ("use every key/value head: query head h reads kv head h // (n_heads // "
                "n_kv_heads), not always head 0")


def _gqa_ref(Q, K, V, mask):
    t = [torch.from_numpy(np.ascontiguousarray(a)) for a in (Q, K, V)]
    m = None if mask is None else torch.from_numpy(mask)
    return F.scaled_dot_product_attention(*t, attn_mask=m, enable_gqa=True).numpy()


@exercise("grouped_query_attention")
def grouped_query_attention(fn):
    rng = np.random.default_rng(2)
    for n_heads, n_kv_heads, mask in ((4, 2, causal_mask_np(3, 5)), (6, 3, None),
                                      (4, 1, causal_mask_np(3, 5)), (4, 4, None)):
        case = f"n_heads = {n_heads}, n_kv_heads = {n_kv_heads}, L = 3, S = 5"
        Q = rng.normal(size=(2, n_heads, 3, 4))
        K, V = rng.normal(size=(2, 2, n_kv_heads, 5, 4))
        got = call(fn, Q, K, V, mask, case=case)
        expect_shape(got, (2, n_heads, 3, 4), case=case,
                     hint="out has one head per query head: (B, n_heads, L, d_v)")
        r = n_heads // n_kv_heads
        wrongs = [(attention_np(Q, np.tile(K, (1, r, 1, 1)), np.tile(V, (1, r, 1, 1)), mask),
                   GQA_TILED),
                  (attention_np(Q, K[:, :1], V[:, :1], mask), GQA_ONE_HEAD)]
        expect_close(got, _gqa_ref(Q, K, V, mask), case=case, atol=1e-6,
                     hint=diagnose(got, wrongs, GQA_TILED, atol=1e-5))


# ---------------------------------------------------------------- exercise: kv_cache_memory

KV_FACTOR_2 = "the cache holds keys AND values: multiply by 2"
KV_N_HEADS = ("only the n_kv_heads key/value heads are cached, each d_k = d_model / n_heads wide: "
              "use n_kv_heads * d_k features per token and layer, not d_model (n_heads * d_k)")


@exercise("kv_cache_memory")
def kv_cache_memory(fn):
    configs = (
        ((80, 64, 8, 8192, 4096, 2), "70B-class: 80 layers, 64 heads, 8 KV heads, d_model 8192, "
                                     "4096 tokens, bf16"),
        ((32, 32, 32, 4096, 4096, 2), "7B-class: 32 layers, 32 heads, 32 KV heads, d_model 4096, "
                                      "4096 tokens, bf16"),
        ((2, 4, 1, 16, 10, 4), "toy MQA: 2 layers, 4 heads, 1 KV head, d_model 16, 10 tokens, fp32"),
    )
    for (n_layers, n_heads, n_kv_heads, d_model, context, nbytes), case in configs:
        got = call(fn, n_layers, n_heads, n_kv_heads, d_model, context, nbytes, case=case)
        expected = kv_cache_bytes(n_layers=n_layers, n_kv_heads=n_kv_heads, d_k=d_model // n_heads,
                                  context=context, dtype=nbytes)
        wrongs = [(expected / 2, KV_FACTOR_2),
                  (expected * n_heads // n_kv_heads, KV_N_HEADS),
                  (expected * n_heads // n_kv_heads / 2, KV_N_HEADS + "; and " + KV_FACTOR_2)]
        expect_close(got, expected, case=case, rtol=0, atol=0.5,
                     hint=diagnose(got, wrongs, "bytes = 2 * n_layers * n_kv_heads * d_k * "
                                                 "context * bytes_per_element", atol=1e-5))
