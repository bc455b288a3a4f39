"""Checks of set 03 (lesson 03): split_heads, repeat_kv, kv_cache, multi_head_attention and
kv_cache_memory.

The learner writes functions over tensors and the module ``MultiHeadAttention``; the checks drive
the module only through ``construct``, ``load_state`` (the state-dict names of the statement),
``call`` and ``forward_backward``. References: ``torch.repeat_interleave``,
``F.scaled_dot_product_attention(..., enable_gqa=True)`` in float64 with the same weights, and
``txlearn.heads.kv_cache_bytes``. When an answer is wrong, the outputs of the catalogued mistakes
(``tests/catalogue/heads.py``) on the same inputs choose the hint; the most diagnostic case runs
first. Source: ``exercises/source/03_heads.py``.
"""

from __future__ import annotations

import math
import numpy as np

import torch

from txlearn.checks import diagnose, exercise, expect_close, expect_true, record_starts
from txlearn.checks.learner import cache_shapes
from txlearn.checks.modules import (F32, MHA_CACHE_CONTENT, MHA_CACHE_REPEATED, backward,
                                    expect_cache, expect_match, expect_pair, expect_shape_of,
                                    load, make_module, mask_ref, mha_reference, mha_state, np64,
                                    run)
from txlearn.heads import kv_cache_bytes

# ----------------------------------------------------------------------------- split_heads

SPLIT_NO_TRANSPOSE = (
    "each head takes a slice of every position's features",
    "a reshape keeps the memory order, so (B, T, d_model) can only become (B, T, n_heads, d_k); "
    "the heads axis moves in front of T afterwards",
    "reshaping straight to (B, n_heads, T, d_k) mixes features of different positions")
SPLIT_STRIDED = (
    "each head is a contiguous slice of d_k features",
    "head h holds features h*d_k .. (h+1)*d_k - 1 of each position",
    "you took every n_heads-th feature (a (B, T, d_k, n_heads) reshape): reshape to "
    "(B, T, n_heads, d_k) instead")
SPLIT_NOT_MOVED = (
    "split_heads returns (B, n_heads, T, d_k)",
    "after the reshape to (B, T, n_heads, d_k) the heads axis still has to move in front of T",
    "swap axes 1 and 2 after the reshape")
SPLIT_WRONG_AXES = (
    "split_heads returns (B, n_heads, T, d_k)",
    "you moved the wrong axes: only the positions axis and the heads axis trade places",
    "a permutation that sends d_k to axis 2 puts the positions last")
MERGE_NO_TRANSPOSE = (
    "merging undoes the split",
    "the heads axis must go back behind T before the reshape",
    "reshaping (B, n_heads, T, d_k) straight to (B, T, d_model) mixes positions")
MERGE_VIEW = (
    "a transposed tensor is not contiguous in memory",
    "view() needs contiguous memory, and moving the heads axis back makes the tensor "
    "non-contiguous",
    "use reshape(), or call .contiguous() before .view()")
SPLIT_DEFAULT = ("head h of position t holds x[b, t, h*d_k:(h+1)*d_k]",
                 "compare your output for arange(24).reshape(1, 3, 8) with that rule by hand")


def _split_ref(x, n_heads):
    B, T, d = x.shape
    return x.reshape(B, T, n_heads, d // n_heads).transpose(1, 2)    # (B, n_heads, T, d_k)


@exercise("split_heads")
def split_heads(split_heads, merge_heads):
    x = torch.arange(24.0, dtype=torch.float64).reshape(1, 3, 8)
    case = "split_heads(x, 2), x = arange(24.).reshape(1, 3, 8), float64"
    got = run(split_heads, x.clone(), 2, case=case)
    expect_shape_of(got, (1, 2, 3, 4), case=case, hint=SPLIT_DEFAULT,
                    wrong=[((1, 3, 2, 4), SPLIT_NOT_MOVED), ((1, 2, 4, 3), SPLIT_WRONG_AXES)])
    wrongs = [(x.reshape(1, 2, 3, 4), SPLIT_NO_TRANSPOSE),
              (x.reshape(1, 3, 4, 2).permute(0, 3, 1, 2), SPLIT_STRIDED)]
    expect_close(got, _split_ref(x, 2), case=case, atol=0,
                 hint=diagnose(got, wrongs, SPLIT_DEFAULT))

    case = "merge_heads of that split, made contiguous (as the heads that attention returns)"
    got = run(merge_heads, _split_ref(x, 2).contiguous(), case=case, raised=[("view", MERGE_VIEW)])
    expect_shape_of(got, (1, 3, 8), case=case, hint=MERGE_NO_TRANSPOSE)
    expect_close(got, x, case=case, atol=0,
                 hint=diagnose(got, [(_split_ref(x, 2).reshape(1, 3, 8), MERGE_NO_TRANSPOSE)],
                               ("merge_heads(split_heads(x, n)) must give x back",)))

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 12, generator=g)                            # float32
    for n_heads in (4, 1, 12):
        case = f"round trip, x (2, 5, 12) float32, n_heads = {n_heads}"
        heads = run(split_heads, x.clone(), n_heads, case=case)
        expect_shape_of(heads, (2, n_heads, 5, 12 // n_heads), case=case, hint=SPLIT_DEFAULT)
        expect_close(heads, _split_ref(x, n_heads), case=case, atol=0, hint=SPLIT_DEFAULT)
        back = run(merge_heads, _split_ref(x, n_heads).contiguous(), case=case,
                   raised=[("view", MERGE_VIEW)])
        expect_close(back, x, case=case, atol=0, hint=MERGE_NO_TRANSPOSE)


# ----------------------------------------------------------------------------- repeat_kv

REPEAT_TILED = (
    "consecutive query heads share one key/value head",
    "query head h reads key/value head h // n_rep: head 0 must fill heads 0 .. n_rep - 1",
    "you repeated the whole stack of heads (tile, .repeat or cat): repeat each head in place "
    "(repeat_interleave), the grouping of SDPA's enable_gqa")
REPEAT_WRONG_AXIS = (
    "the heads axis is axis 1 of (B, n_kv_heads, S, d_k)",
    "only the number of heads grows; S and d_k stay as they are",
    "you repeated along another axis: repeat along dim=1")
REPEAT_NOT_MERGED = (
    "the result has four axes, (B, n_kv_heads * n_rep, S, d_k)",
    "an expand adds a group axis: fold it into the heads axis with a reshape",
    "reshape (B, n_kv_heads, n_rep, S, d_k) to (B, n_kv_heads * n_rep, S, d_k)")
REPEAT_POSITIONS_FOLDED = (
    "the heads axis is axis 1 of (B, n_kv_heads, S, d_k)",
    "repeat each head along dim=1; repeating positions (dim=2) and reshaping to the right shape "
    "mixes the positions of one head into two heads",
    "you repeated along the positions axis, then reshaped")
REPEAT_COUNT = (
    "each key/value head is shared by n_rep query heads",
    "the number of copies is n_rep, the argument, not the number of heads x has",
    "you made n_kv_heads copies of each head")
REPEAT_DEFAULT = ("head h of the result is head h // n_rep of x",)


@exercise("repeat_kv")
def repeat_kv(repeat_kv):
    x = torch.arange(24.0, dtype=torch.float64).reshape(1, 2, 3, 4)    # head 0: 0..11, head 1: 12..23
    case = "x (1, 2, 3, 4) float64, heads 0 and 1 distinct, n_rep = 2"
    got = run(repeat_kv, x.clone(), 2, case=case)
    expect_shape_of(got, (1, 4, 3, 4), case=case, hint=REPEAT_DEFAULT,
                    wrong=[((1, 2, 6, 4), REPEAT_WRONG_AXIS), ((1, 2, 3, 8), REPEAT_WRONG_AXIS),
                           ((2, 2, 3, 4), REPEAT_WRONG_AXIS), ((1, 2, 2, 3, 4), REPEAT_NOT_MERGED)])
    expect_close(got, x.repeat_interleave(2, dim=1), case=case, atol=0,
                 hint=diagnose(got, [(x.repeat(1, 2, 1, 1), REPEAT_TILED),
                                     (x.repeat_interleave(2, dim=2).reshape(1, 4, 3, 4),
                                      REPEAT_POSITIONS_FOLDED)], REPEAT_DEFAULT))

    g = torch.Generator().manual_seed(1)
    for n_kv, n_rep, dtype in ((2, 3, torch.float32), (1, 4, torch.float32), (3, 1, torch.float64)):
        x = torch.randn(2, n_kv, 4, 4, generator=g).to(dtype)
        case = f"x (2, {n_kv}, 4, 4) {str(dtype)[6:]}, n_rep = {n_rep}"
        got = run(repeat_kv, x.clone(), n_rep, case=case)
        expect_shape_of(got, (2, n_kv * n_rep, 4, 4), case=case, hint=REPEAT_DEFAULT,
                        wrong=[((2, n_kv * n_kv, 4, 4), REPEAT_COUNT),
                               ((2, n_kv, 4 * n_rep, 4), REPEAT_WRONG_AXIS),
                               ((2, n_kv, 4, 4 * n_rep), REPEAT_WRONG_AXIS),
                               ((2, n_kv, n_rep, 4, 4), REPEAT_NOT_MERGED)])
        expect_close(got, x.repeat_interleave(n_rep, dim=1), case=case, atol=0,
                     hint=diagnose(got, [(x.repeat(1, n_rep, 1, 1), REPEAT_TILED)],
                                   REPEAT_DEFAULT))


# ----------------------------------------------------------------------------- kv_cache

CACHE_ORDER = (
    "the cache keeps positions in order",
    "the past positions come first and this step's after them",
    "you put the new keys before the cached ones")
CACHE_AXIS = (
    "positions are axis 2 of (B, n_kv_heads, S, d_k)",
    "joining along another axis fails, or mixes heads, batch or features",
    "concatenate along dim=2")
CACHE_ONLY_NEW = (
    "the cache returns every position seen so far",
    "this step's K and V are appended to the cached ones, not instead of them",
    "return S_past + L positions")
CACHE_K_V = (
    "the cache holds keys AND values",
    "the second element of the pair is V_all",
    "you returned the keys twice, or (V, K) in the wrong order")
CACHE_NONE = (
    "nothing is cached before the first step",
    "with cache None, this step's K and V are all there is",
    "return (K, V) as they are")
CACHE_DEFAULT = ("the cache returns the past and the new positions, in order, for keys and for "
                 "values",)
MASK_TOP_LEFT = (
    "the L queries are the LAST L of the S positions",
    "query i sits at position S - L + i, so it sees S - L + i + 1 keys; the last query sees all S",
    "your mask is aligned to the top-left corner: move the diagonal by S - L")
MASK_POLARITY = (
    "the course's masks say True = may attend",
    "True where key j is at or before the query's position, False after it",
    "your mask is inverted (True where attention is forbidden)")
MASK_UPPER = (
    "which triangle may a query see?",
    "a query sees the keys at or BEFORE its position: the lower triangle (torch.tril), aligned "
    "bottom-right",
    "yours is the upper triangle (torch.triu): each query sees its own position and the future")
MASK_DIAGONAL = (
    "a query may attend to its own position",
    "the diagonal of the aligned triangle is True",
    "your triangle misses its diagonal by one")
MASK_SIGN = (
    "the diagonal moves right by S - L",
    "query i sees keys up to S - L + i: the offset is S - L, not L - S",
    "your offset has the wrong sign")
MASK_SHAPE = (
    "the mask has one row per query and one column per key: (L, S)",
    "with a cache there are more keys than queries",
    "build an (L, S) mask, not (L, L) or (S, S)")
MASK_DTYPE = (
    "a mask is boolean",
    "masked_fill and the course's attention need a bool tensor",
    "build it with dtype=torch.bool (True = may attend)")
MASK_DEFAULT = ("query i sees keys 0 .. S - L + i",)


@exercise("kv_cache")
def kv_cache(append_kv, causal_mask):
    g = torch.Generator().manual_seed(2)
    K_past, V_past = torch.randn(2, 2, 3, 4, generator=g), torch.randn(2, 2, 3, 4, generator=g) + 5
    K, V = torch.randn(2, 2, 2, 4, generator=g) - 5, torch.randn(2, 2, 2, 4, generator=g) + 10
    case = "cache (K_past, V_past) each (2, 2, 3, 4), new K, V each (2, 2, 2, 4), float32"
    got = run(append_kv, (K_past.clone(), V_past.clone()), K.clone(), V.clone(), case=case,
              raised=[("Sizes of tensors must match", CACHE_AXIS)])
    got_K, got_V = expect_pair(got, case=case, hint=("return the pair (K_all, V_all)",))
    K_all, V_all = torch.cat([K_past, K], 2), torch.cat([V_past, V], 2)
    shapes = [((2, 2, 2, 4), CACHE_ONLY_NEW), ((4, 2, 3, 4), CACHE_AXIS)]
    for name, got_x, want in (("K_all", got_K, K_all), ("V_all", got_V, V_all)):
        expect_shape_of(got_x, (2, 2, 5, 4), case=f"{case}, {name}", hint=CACHE_DEFAULT,
                        wrong=shapes)
        wrongs = [(torch.cat([K, K_past], 2), CACHE_ORDER), (torch.cat([V, V_past], 2), CACHE_ORDER),
                  (K_all if name == "V_all" else V_all, CACHE_K_V)]
        expect_close(got_x, want, case=f"{case}, {name}", atol=0,
                     hint=diagnose(got_x, wrongs, CACHE_DEFAULT))

    case = "cache None, K, V each (1, 2, 3, 4) float64"
    K1, V1 = K_past[:1].double(), V_past[:1].double()
    got = run(append_kv, None, K1.clone(), V1.clone(), case=case, hint=CACHE_NONE)
    got_K, got_V = expect_pair(got, case=case, hint=CACHE_NONE)
    expect_close(got_K, K1, case=case + ", K_all", atol=0, hint=CACHE_NONE)
    expect_close(got_V, V1, case=case + ", V_all", atol=0, hint=CACHE_NONE)

    for L, S in ((2, 5), (4, 4), (1, 6)):
        case = f"causal_mask({L}, {S})"
        got = run(causal_mask, L, S, case=case)
        expect_shape_of(got, (L, S), case=case, hint=MASK_SHAPE)
        expect_true(getattr(got, "dtype", None) == torch.bool, case=case, hint=MASK_DTYPE,
                    message=f"dtype {getattr(got, 'dtype', type(got).__name__)}, expected bool")
        right = mask_ref(L, S)
        ones = torch.ones(L, S, dtype=torch.bool)
        wrongs = [(ones.tril(), MASK_TOP_LEFT), (~right, MASK_POLARITY),
                  (ones.tril(S - L - 1), MASK_DIAGONAL), (ones.tril(L - S), MASK_SIGN),
                  (~ones.tril(), MASK_POLARITY), (ones.triu(S - L), MASK_UPPER)]
        expect_close(got, right, case=case, atol=0, hint=diagnose(got, wrongs, MASK_DEFAULT))


# ----------------------------------------------------------------------------- multi_head_attention

MHA_SCALE_D_MODEL = (
    "each head has its own scale",
    "the scores of a head are divided by the square root of that head's width",
    "divide by sqrt(d_k) = sqrt(d_model / n_heads), not by sqrt(d_model)")
MHA_NO_SCALE = (
    "scaled dot-product attention",
    "the scores Q K^T grow with d_k; lesson 01 divides them by sqrt(d_k)",
    "you did not scale the scores")
MHA_SCALE_D_K = (
    "the scale is a square root",
    "divide the scores once by sqrt(d_k)",
    "you divided by d_k (or by sqrt(d_k) twice)")
MHA_K_NOT_TRANSPOSED = (
    "scores compare every query with every key",
    "scores[i, j] = q_i . k_j, so K enters transposed (its last two axes swapped)",
    "you multiplied Q by K itself, not by K transposed")
MHA_POLARITY = (
    "the course's masks say True = may attend",
    "entries where the mask is False get -inf before the softmax",
    "you hid the positions where the mask is True")
MHA_SOFTMAX_AXIS = (
    "each query's weights sum to 1 over the keys",
    "the keys are the last axis of the scores (B, n_heads, L, S)",
    "you took the softmax over the queries' axis")
MHA_NO_W_O = (
    "the heads are mixed by an output projection",
    "after merging the heads, project with W_O and add b_O",
    "W_O was never used")
MHA_NO_B_O = (
    "every projection has its bias",
    "the output projection adds b_O",
    "b_O was never added")
MHA_NO_B_IN = (
    "every projection has its bias",
    "Q, K and V are x @ W + b",
    "b_Q, b_K and b_V were never added")
MHA_SPLIT = (
    "heads are contiguous slices of each position's features",
    "use your split_heads (exercise 1): reshape to (B, T, n_heads, d_k), then move the heads axis",
    "a reshape straight to (B, n_heads, T, d_k) mixes positions")
MHA_MERGE = (
    "merging undoes the split",
    "use your merge_heads (exercise 1)",
    "a reshape of (B, n_heads, L, d_k) straight to (B, L, d_model) mixes positions")
MHA_EMPTY_NAN = (
    "a query with no visible key",
    "softmax over a row that is all -inf gives NaN: the course gives that query the output 0",
    "find the rows where the mask has no True and set their weights to 0")
MHA_EMPTY_UNIFORM = (
    "a query with no visible key",
    "a large negative number instead of -inf turns a fully hidden row into a uniform average",
    "the course gives that query the output 0: zero the weights of rows with no True")
MHA_TILED = (
    "consecutive query heads share one key/value head",
    "query head h reads key/value head h // n_rep: use your repeat_kv (exercise 2)",
    "the whole stack of key/value heads was repeated (tile), not each head in place")
MHA_W_K_SHAPE = (
    "keys and values have only n_kv_heads heads",
    "W_K and W_V map d_model to n_kv_heads * d_k features",
    "their shape is (d_model, n_kv_heads * d_k), not (d_model, d_model)")
MHA_NAMES = (
    "the state-dict names are part of the statement",
    "W_Q, W_K, W_V, W_O and, when bias is true, b_Q, b_K, b_V, b_O: nothing else",
    "with bias=False the module has no b_* parameters at all")
MHA_CACHE_ALWAYS = (
    "the cache is used only when asked",
    "a call with use_cache=False neither reads nor changes self.kv_cache",
    "your module stored keys during a call without use_cache")
MHA_CACHE_READ = (
    "the cache is used only when asked",
    "a call with use_cache=False neither reads nor changes self.kv_cache, even when it holds "
    "positions: such a call attends over its own L positions only",
    "your module read or extended the cache during a call without use_cache")
MHA_CACHE_MISSING = (
    "the cache keeps every earlier position",
    "with use_cache=True, store append_kv's result in self.kv_cache and attend over all of it",
    "the second step must see the keys of the first")
MHA_START = (
    "which positions does a cached call hold?",
    "step 2 of the forward: start = the number of positions already in self.kv_cache "
    "(self.kv_cache[0].shape[2]) when use_cache is true, else 0, passed to "
    "self.apply_positions(Q, K, start); set 04's rotary attention needs it",
    "your forward passed another start to apply_positions")
MHA_NO_GRAD = (
    "the module must be trainable",
    "gradients flow through forward: no torch.no_grad, .detach(), .data or NumPy inside it",
    "no gradient reached the parameters or the input")
MHA_GLOBAL_MAX = (
    "each query's row is its own distribution: whose maximum do you subtract?",
    "one maximum for the whole score tensor makes a row of small scores exp(0 - 1000) = 0 "
    "(weights 0, or 0/0 = NaN): subtract each row's own maximum, over the keys (dim=-1, "
    "keepdim=True), or use torch.softmax, which does")
MHA_DEFAULT = (
    "follow the five steps of the statement",
    "project, split, (cache), share heads, softmax(Q K^T / sqrt(d_k)) with the mask, merge, W_O")


def _mha_variant(state, x, n_heads, mask=None, *, scale="d_k", split_ok=True, merge_ok=True,
                 transpose_k=True, invert_mask=False, softmax_dim=-1, empty="zero", W_O=True,
                 b_O=True, b_in=True, tile=False):
    """The output of one catalogued mistake (float64)."""
    t = {k: torch.as_tensor(v, dtype=torch.float64) for k, v in state.items()}
    x = torch.as_tensor(np64(x))
    B, L, d_model = x.shape
    d_k = d_model // n_heads
    n_kv = t["W_K"].shape[1] // d_k

    def heads(name, h):
        y = x @ t[f"W_{name}"] + (t.get(f"b_{name}", 0.0) if b_in else 0.0)
        return y.reshape(B, L, h, d_k).transpose(1, 2) if split_ok else y.reshape(B, h, L, d_k)

    Q, K, V = heads("Q", n_heads), heads("K", n_kv), heads("V", n_kv)
    r = n_heads // n_kv
    K, V = (K.repeat(1, r, 1, 1), V.repeat(1, r, 1, 1)) if tile else \
        (K.repeat_interleave(r, 1), V.repeat_interleave(r, 1))
    divisor = {"d_k": math.sqrt(d_k), "d_model": math.sqrt(d_model), "none": 1.0, "d_k^1": d_k}
    scores = Q @ (K.transpose(-2, -1) if transpose_k else K) / divisor[scale]
    hidden = None
    if mask is not None:
        m = torch.as_tensor(mask).bool()
        m = ~m if invert_mask else m
        hidden = ~m.any(-1, keepdim=True)
        scores = scores.masked_fill(~m, -1e9 if empty == "uniform" else float("-inf"))
        if empty == "zero":
            scores = scores.masked_fill(hidden, 0.0)
    w = torch.softmax(scores, dim=softmax_dim)
    if hidden is not None and empty == "zero":
        w = w.masked_fill(hidden, 0.0)
    o = w @ V                                                          # (B, h, L, d_k)
    merged = o.transpose(1, 2).reshape(B, L, d_model) if merge_ok else o.reshape(B, L, d_model)
    out = merged @ t["W_O"] if W_O else merged
    return out + t["b_O"] if (b_O and "b_O" in t) else out


def _mha_mistakes(state, x, n_heads, mask):
    """(output, hint) of each catalogued mistake, computed lazily."""
    def v(**kw):
        return lambda: _mha_variant(state, x, n_heads, mask, **kw)
    return [(v(scale="d_model"), MHA_SCALE_D_MODEL), (v(scale="none"), MHA_NO_SCALE),
            (v(scale="d_k^1"), MHA_SCALE_D_K), (v(transpose_k=False), MHA_K_NOT_TRANSPOSED),
            (v(invert_mask=True), MHA_POLARITY), (v(invert_mask=True, empty="nan"), MHA_POLARITY),
            (v(invert_mask=True, empty="uniform"), MHA_POLARITY),
            (v(softmax_dim=-2), MHA_SOFTMAX_AXIS), (v(softmax_dim=-2, empty="nan"), MHA_SOFTMAX_AXIS),
            (v(W_O=False), MHA_NO_W_O), (v(b_O=False), MHA_NO_B_O), (v(b_in=False), MHA_NO_B_IN),
            (v(split_ok=False), MHA_SPLIT), (v(merge_ok=False), MHA_MERGE),
            (v(empty="nan"), MHA_EMPTY_NAN), (v(empty="uniform"), MHA_EMPTY_UNIFORM),
            (v(tile=True), MHA_TILED)]


def _global_max_attention(x, guard):
    """Attention with every W the identity and one max-shift for the whole score tensor."""
    x = torch.as_tensor(np64(x))
    scores = x @ x.transpose(-2, -1) / math.sqrt(x.shape[-1])
    e = torch.exp(scores - scores.max())
    total = e.sum(-1, keepdim=True)
    w = torch.where(total > 0, e / total, torch.zeros_like(e)) if guard else e / total
    return w @ x


def _x(B, T, d_model, seed):
    return torch.randn(B, T, d_model, generator=torch.Generator().manual_seed(seed))


def _built(MultiHeadAttention, d_model, n_heads, n_kv_heads, bias, seed, case):
    kwargs = {} if n_kv_heads is None else {"n_kv_heads": n_kv_heads}
    if not bias:
        kwargs["bias"] = False
    m = make_module(MultiHeadAttention, d_model, n_heads, case=case, **kwargs)
    state = mha_state(d_model, n_heads, n_kv_heads or n_heads, bias, seed)
    load(m, state, case=case, names=MHA_NAMES, shapes={"W_K": MHA_W_K_SHAPE, "W_V": MHA_W_K_SHAPE})
    return m, state


def _expect_mha(got, state, x, n_heads, mask, case):
    expect_shape_of(got, tuple(x.shape), case=case, hint=("out has the shape of x, (B, L, d_model)",))
    expect_match(got, mha_reference(state, x, n_heads, mask), case=case, **F32,
                 mistakes=_mha_mistakes(state, x, n_heads, mask), default=MHA_DEFAULT)


@exercise("multi_head_attention", needs=("split_heads", "repeat_kv", "kv_cache"))
def multi_head_attention(MultiHeadAttention):
    # 1. d_k == T, so that a K without its transpose still multiplies; batched; causal mask
    case = "B=2, T=4, d_model=8, n_heads=2 (d_k=4), causal mask"
    m, state = _built(MultiHeadAttention, 8, 2, None, True, 0, case)
    x, mask = _x(2, 4, 8, 10), mask_ref(4, 4)
    got = run(m, x.clone(), mask=mask, case=case)
    _expect_mha(got, state, x, 2, mask, case)

    # 2. a padding mask (B, 1, 1, S): the second sequence has 2 real tokens
    case = "B=2, T=4, d_model=8, n_heads=2, padding mask (2, 1, 1, 4), lengths [4, 2]"
    m, state = _built(MultiHeadAttention, 8, 2, None, True, 0, case)
    pad = torch.tensor([[True] * 4, [True, True, False, False]]).reshape(2, 1, 1, 4)
    got = run(m, x.clone(), mask=pad, case=case,
              hint=("the mask broadcasts to (B, n_heads, L, S)",
                    "a padding mask is (B, 1, 1, S): use it as it is, with broadcasting"))
    _expect_mha(got, state, x, 2, pad, case)

    # 3. a query that sees no key
    case = "B=2, T=4, causal mask whose row 0 is all False (query 0 sees nothing)"
    hidden = mask.clone()
    hidden[0] = False
    m, state = _built(MultiHeadAttention, 8, 2, None, True, 0, case)
    got = run(m, x.clone(), mask=hidden, case=case)
    _expect_mha(got, state, x, 2, hidden, case)

    # 4. grouped-query and multi-query attention
    for n_kv, seed in ((2, 1), (1, 2)):
        case = f"GQA: B=2, T=5, d_model=8, n_heads=4, n_kv_heads={n_kv}, causal mask"
        m2, st2 = _built(MultiHeadAttention, 8, 4, n_kv, True, seed, case)
        x2, mask2 = _x(2, 5, 8, 11 + seed), mask_ref(5, 5)
        got = run(m2, x2.clone(), mask=mask2, case=case)
        _expect_mha(got, st2, x2, 4, mask2, case)

    # 5. no biases, no mask
    case = "bias=False, B=1, T=3, d_model=6, n_heads=3, no mask"
    m3, st3 = _built(MultiHeadAttention, 6, 3, None, False, 3, case)
    x3 = _x(1, 3, 6, 13)
    _expect_mha(run(m3, x3.clone(), case=case), st3, x3, 3, None, case)

    # 5b. rows of very different scale: W = I, d_k = 2, x = [[0, 0], [c, 0]] with c^2 / sqrt(2)
    #     = 1000, so query 0's scores are [0, 0] and query 1's [0, 1000]; one maximum for the
    #     whole tensor underflows row 0 (its output must be the mean of the values, [c/2, 0])
    case = ("rows of very different scale: d_model=2, n_heads=1, every W the identity, no bias; "
            "query 0's scores [0, 0], query 1's [0, 1000]")
    m6 = make_module(MultiHeadAttention, 2, 1, case=case, bias=False)
    st6 = {name: np.eye(2) for name in ("W_Q", "W_K", "W_V", "W_O")}
    load(m6, st6, case=case, names=MHA_NAMES)
    x6 = torch.tensor([[[0.0, 0.0], [math.sqrt(1000 * math.sqrt(2)), 0.0]]])
    got = run(m6, x6.clone(), case=case)
    expect_shape_of(got, (1, 2, 2), case=case, hint=("out has the shape of x, (B, L, d_model)",))
    expect_match(got, mha_reference(st6, x6, 1), case=case, **F32, default=MHA_DEFAULT,
                 mistakes=[(lambda: _global_max_attention(x6, guard=True), MHA_GLOBAL_MAX),
                           (lambda: _global_max_attention(x6, guard=False), MHA_GLOBAL_MAX)])

    # 6. the KV cache: an uncached call, then the same sequence in two cached steps
    case = "KV cache: n_heads=4, n_kv_heads=2, T=5 in one call without use_cache"
    m4, st4 = _built(MultiHeadAttention, 8, 4, 2, True, 4, case)
    x4 = _x(2, 5, 8, 14)
    full = mha_reference(st4, x4, 4, mask_ref(5, 5))
    got = run(m4, x4.clone(), mask=mask_ref(5, 5), case=case)
    _expect_mha(got, st4, x4, 4, mask_ref(5, 5), case)
    case = "KV cache, step 1: positions 0-2, use_cache=True, mask causal_mask(3, 3)"
    got = run(m4, x4[:, :3].clone(), mask=mask_ref(3, 3), use_cache=True, case=case,
              raised=[("must match", MHA_CACHE_ALWAYS)])
    expect_close(got, full[:, :3], case=case, **F32, hint=MHA_CACHE_ALWAYS)
    expect_cache(m4, 2, 4, 2, 3, 2, case, empty=MHA_CACHE_MISSING)
    case = "KV cache, step 2: positions 3-4, use_cache=True, mask causal_mask(2, 5)"
    got = run(m4, x4[:, 3:].clone(), mask=mask_ref(2, 5), use_cache=True, case=case,
              raised=[("must match", MHA_CACHE_MISSING), ("shape", MHA_CACHE_MISSING)])
    expect_shape_of(got, (2, 2, 8), case=case, hint=MHA_CACHE_MISSING)
    expect_close(got, full[:, 3:], case=case, **F32, hint=MHA_CACHE_MISSING)
    expect_cache(m4, 2, 4, 2, 5, 2, case, empty=MHA_CACHE_MISSING)
    case = ("KV cache, then positions 0-4 again without use_cache, mask causal_mask(5, 5): the "
            "cache (5 positions) is neither read nor changed")
    got = run(m4, x4.clone(), mask=mask_ref(5, 5), case=case,
              raised=[("must match", MHA_CACHE_READ), ("shape", MHA_CACHE_READ)])
    expect_close(got, full, case=case, **F32, hint=MHA_CACHE_READ)
    held = cache_shapes(m4, case=case)
    expect_true(held == [[(2, 2, 5, 2), (2, 2, 5, 2)]], case=case, hint=MHA_CACHE_READ,
                message=f"after this call self.kv_cache holds "
                        f"{'; '.join(', '.join(str(s) for s in pair) for pair in held) or 'nothing'}"
                        f"; expected the 5 cached positions, unchanged")
    case = ("KV cache: the start your forward passes to apply_positions on cached calls of 3, 2 "
            "and 1 positions")
    starts = record_starts(MultiHeadAttention, 8, 4, n_kv_heads=2, case=case,
                           steps=[(x4[:, :3].clone(), mask_ref(3, 3)),
                                  (x4[:, 3:].clone(), mask_ref(2, 5)),
                                  (x4[:, 4:].clone(), mask_ref(1, 6))])
    expect_true(starts == [0, 3, 5], case=case, hint=MHA_START,
                message=f"apply_positions received start = {starts}, expected [0, 3, 5]")

    # 7. gradients reach the input and every parameter
    case = "gradients: B=2, T=4, d_model=8, n_heads=2, causal mask"
    g = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(15))
    m5, st5 = _built(MultiHeadAttention, 8, 2, None, True, 0, case)
    out, grads = backward(m5, x.clone(), mask=mask, grad_output=g, case=case,
                          raised=[("grad", MHA_NO_GRAD)])
    xr = torch.as_tensor(np64(x)).requires_grad_(True)
    params = {k: torch.as_tensor(v, dtype=torch.float64).requires_grad_(True) for k, v in st5.items()}
    mha_reference(params, xr, 2, mask).backward(g.double())
    for name, want in (("input 0", xr.grad), ("W_Q", params["W_Q"].grad), ("b_O", params["b_O"].grad)):
        have = grads.get(name)
        expect_true(have is not None, case=case, message=f"no gradient reached {name}",
                    hint=MHA_NO_GRAD)
        expect_close(have, want, case=f"{case}, gradient of {name}", **F32, hint=MHA_NO_GRAD)


# ----------------------------------------------------------------------------- kv_cache_memory

KV_FACTOR_2 = (
    "what the cache holds for each token",
    "each layer caches a key AND a value vector per head",
    "the cache holds keys and values: multiply by 2")
KV_N_HEADS = (
    "grouped-query attention shrinks the cache",
    "only the n_kv_heads key/value heads are cached, each d_k = d_model / n_heads wide",
    "use n_kv_heads * d_k features per token and layer, not d_model (n_heads * d_k)")
KV_LAYERS = (
    "every layer has its own cache",
    "multiply by the number of layers",
    "n_layers is missing from your product")
KV_BYTES = (
    "the unit is bytes",
    "each cached number takes bytes_per_element bytes",
    "multiply by bytes_per_element (you counted numbers, not bytes)")
KV_BITS = (
    "the unit is bytes",
    "bytes_per_element is already in bytes",
    "you multiplied by 8 (bits)")
KV_GIB = (
    "the unit is bytes",
    "return the number of bytes itself; dividing by 2**30 (GiB) is for printing",
    "do not convert to GiB")
KV_DEFAULT = ("count what one token adds to one layer's cache, then multiply by the layers, the "
              "tokens and the bytes of one number",)


@exercise("kv_cache_memory")
def kv_cache_memory(kv_cache_memory):
    configs = (
        ((32, 32, 8, 4096, 8192, 4), "8B-class GQA: 32 layers, 32 heads, 8 KV heads, d_model 4096, "
                                     "8192 tokens, fp32"),
        ((80, 64, 8, 8192, 4096, 2), "70B-class: 80 layers, 64 heads, 8 KV heads, d_model 8192, "
                                     "4096 tokens, bf16"),
        ((32, 32, 32, 4096, 4096, 2), "7B-class: 32 layers, 32 heads, 32 KV heads, d_model 4096, "
                                      "4096 tokens, bf16"),
        ((2, 4, 1, 16, 10, 4), "toy MQA: 2 layers, 4 heads, 1 KV head, d_model 16, 10 tokens, fp32"),
    )
    for (n_layers, n_heads, n_kv_heads, d_model, context, nbytes), case in configs:
        got = run(kv_cache_memory, n_layers, n_heads, n_kv_heads, d_model, context, nbytes, case=case)
        expected = kv_cache_bytes(n_layers=n_layers, n_kv_heads=n_kv_heads, d_k=d_model // n_heads,
                                  context=context, dtype=nbytes)
        wrongs = [(expected / 2, KV_FACTOR_2),
                  (expected * n_heads / n_kv_heads, KV_N_HEADS),
                  (expected * n_heads / n_kv_heads / 2, KV_N_HEADS),
                  (expected / n_layers, KV_LAYERS),
                  (expected / nbytes, KV_BYTES),
                  (expected * 8, KV_BITS),
                  (expected / 2 ** 30, KV_GIB)]
        expect_close(got, expected, case=case, rtol=0, atol=0.5,
                     hint=diagnose(got, wrongs, KV_DEFAULT, rtol=1e-9, atol=1e-12))
