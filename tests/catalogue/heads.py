"""Reference answers and catalogued wrong answers for set 03's checks (txlearn/checks/heads.py),
written the way a learner writes them (PyTorch functions and nn.Module classes)."""

import math

import torch
from torch import nn


# ------------------------------------------------------------------ split_heads

def split_ref(x, n_heads):
    B, T, d_model = x.shape
    return x.reshape(B, T, n_heads, d_model // n_heads).transpose(1, 2)   # (B, h, T, d_k)


def merge_ref(x):
    B, h, T, d_k = x.shape
    return x.transpose(1, 2).reshape(B, T, h * d_k)


def split_no_transpose(x, n_heads):
    B, T, d_model = x.shape
    return x.reshape(B, n_heads, T, d_model // n_heads)


def split_strided(x, n_heads):
    B, T, d_model = x.shape
    return x.reshape(B, T, d_model // n_heads, n_heads).permute(0, 3, 1, 2)


def split_not_moved(x, n_heads):
    B, T, d_model = x.shape
    return x.view(B, T, n_heads, d_model // n_heads)


def split_wrong_permute(x, n_heads):
    B, T, d_model = x.shape
    return x.reshape(B, T, n_heads, d_model // n_heads).permute(0, 2, 3, 1)


def merge_no_transpose(x):
    B, h, T, d_k = x.shape
    return x.reshape(B, T, h * d_k)


def merge_view(x):
    B, h, T, d_k = x.shape
    return x.transpose(1, 2).view(B, T, h * d_k)


# ------------------------------------------------------------------ repeat_kv

def repeat_ref(x, n_rep):
    return x.repeat_interleave(n_rep, dim=1)


def repeat_tile(x, n_rep):
    return x.repeat(1, n_rep, 1, 1)


def repeat_cat(x, n_rep):
    return torch.cat([x] * n_rep, dim=1)


def repeat_positions_axis(x, n_rep):
    return x.repeat_interleave(n_rep, dim=2)


def repeat_positions_folded(x, n_rep):
    B, n_kv, S, d_k = x.shape
    return x.repeat_interleave(n_rep, dim=2).reshape(B, n_kv * n_rep, S, d_k)


def repeat_expand_only(x, n_rep):
    B, n_kv, S, d_k = x.shape
    return x[:, :, None].expand(B, n_kv, n_rep, S, d_k)


def repeat_by_head_count(x, n_rep):
    return x.repeat_interleave(x.shape[1], dim=1)


def repeat_expand_tile_order(x, n_rep):
    B, n_kv, S, d_k = x.shape
    return x[:, None].expand(B, n_rep, n_kv, S, d_k).reshape(B, n_rep * n_kv, S, d_k)


# ------------------------------------------------------------------ kv_cache

def append_ref(cache, K, V):
    if cache is None:
        return K, V
    return torch.cat([cache[0], K], dim=2), torch.cat([cache[1], V], dim=2)


def mask_ref(L, S):
    return torch.tril(torch.ones(L, S, dtype=torch.bool), diagonal=S - L)


def append_new_first(cache, K, V):
    if cache is None:
        return K, V
    return torch.cat([K, cache[0]], dim=2), torch.cat([V, cache[1]], dim=2)


def append_heads_axis(cache, K, V):
    if cache is None:
        return K, V
    return torch.cat([cache[0], K], dim=1), torch.cat([cache[1], V], dim=1)


def append_only_new(cache, K, V):
    return K, V


def append_keys_twice(cache, K, V):
    if cache is None:
        return K, K
    K_all = torch.cat([cache[0], K], dim=2)
    return K_all, K_all


def append_swapped(cache, K, V):
    if cache is None:
        return V, K
    return torch.cat([cache[1], V], dim=2), torch.cat([cache[0], K], dim=2)


def append_no_none_case(cache, K, V):
    K_past, V_past = cache
    return torch.cat([K_past, K], dim=2), torch.cat([V_past, V], dim=2)


def mask_top_left(L, S):
    return torch.tril(torch.ones(L, S, dtype=torch.bool))


def mask_inverted(L, S):
    return torch.triu(torch.ones(L, S, dtype=torch.bool), diagonal=S - L + 1)


def mask_no_diagonal(L, S):
    return torch.tril(torch.ones(L, S, dtype=torch.bool), diagonal=S - L - 1)


def mask_wrong_sign(L, S):
    return torch.tril(torch.ones(L, S, dtype=torch.bool), diagonal=L - S)


def mask_float(L, S):
    return torch.tril(torch.ones(L, S), diagonal=S - L)


def mask_square(L, S):
    return torch.tril(torch.ones(S, S, dtype=torch.bool))


# ------------------------------------------------------------------ multi_head_attention

def mha_class(*, scale="d_k", split=split_ref, merge=merge_ref, transpose_k=True, polarity=True,
              softmax_dim=-1, empty="zero", use_W_O=True, add_b_O=True, add_b_in=True,
              share=repeat_ref, kv_width="n_kv", cache="right", grad=True, bias_always=False,
              start_zero=False, global_max=False):
    """A learner's MultiHeadAttention, right or with one mistake."""

    class MultiHeadAttention(nn.Module):
        def __init__(self, d_model, n_heads, n_kv_heads=None, bias=True):
            super().__init__()
            self.kv_cache = None
            self.n_heads = n_heads
            self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
            self.d_k = d_model // n_heads
            d_kv = d_model if kv_width == "d_model" else self.n_kv_heads * self.d_k
            self.W_Q = nn.Parameter(torch.randn(d_model, d_model))
            self.W_K = nn.Parameter(torch.randn(d_model, d_kv))
            self.W_V = nn.Parameter(torch.randn(d_model, d_kv))
            self.W_O = nn.Parameter(torch.randn(d_model, d_model))
            if bias or bias_always:
                self.b_Q = nn.Parameter(torch.zeros(d_model))
                self.b_K = nn.Parameter(torch.zeros(d_kv))
                self.b_V = nn.Parameter(torch.zeros(d_kv))
                self.b_O = nn.Parameter(torch.zeros(d_model))
            else:
                self.b_Q = self.b_K = self.b_V = self.b_O = None

        def apply_positions(self, Q, K, start):
            return Q, K

        def _proj(self, x, W, b, add):
            return x @ W + b if (b is not None and add) else x @ W

        def forward(self, x, mask=None, use_cache=False):
            if not grad:
                with torch.no_grad():
                    return self._forward(x, mask, use_cache)
            return self._forward(x, mask, use_cache)

        def _forward(self, x, mask, use_cache):
            Q = split(self._proj(x, self.W_Q, self.b_Q, add_b_in), self.n_heads)
            K = split(self._proj(x, self.W_K, self.b_K, add_b_in), self.n_kv_heads)
            V = split(self._proj(x, self.W_V, self.b_V, add_b_in), self.n_kv_heads)
            held = self.kv_cache is not None
            reads = held and (use_cache or cache == "when_present")
            start = self.kv_cache[0].shape[2] if reads else 0
            Q, K = self.apply_positions(Q, K, 0 if start_zero else start)
            n_rep = self.n_heads // self.n_kv_heads
            if cache == "after_repeat":                    # GQA's saving undone: n_heads copies
                K, V = share(K, n_rep), share(V, n_rep)
                if use_cache:
                    K, V = append_ref(self.kv_cache, K, V)
                    self.kv_cache = (K, V)
            else:
                if (use_cache and cache != "not_stored") or cache == "always" or \
                        (held and cache == "when_present"):
                    K, V = append_ref(self.kv_cache, K, V)
                    self.kv_cache = (K, V)
                elif held and cache == "extends_unread":     # attends over x alone, but stores
                    self.kv_cache = append_ref(self.kv_cache, K, V)
                K, V = share(K, n_rep), share(V, n_rep)
            divisor = {"d_k": math.sqrt(self.d_k), "d_model": math.sqrt(self.d_k * self.n_heads),
                       "none": 1.0, "twice": self.d_k}[scale]
            scores = Q @ (K.transpose(-2, -1) if transpose_k else K) / divisor
            if mask is not None:
                allowed = mask if polarity else ~mask
                if empty == "uniform":
                    scores = scores.masked_fill(~allowed, -1e9)
                else:
                    scores = scores.masked_fill(~allowed, float("-inf"))
                empty_rows = ~allowed.any(dim=-1, keepdim=True)
                if empty == "zero":
                    scores = scores.masked_fill(empty_rows, 0.0)
            if global_max:   # its own softmax, one max-shift for the whole score tensor
                e = torch.exp(scores - scores.max())
                total = e.sum(dim=-1, keepdim=True)
                weights = torch.where(total > 0, e / total, torch.zeros_like(e))
            else:
                weights = torch.softmax(scores, dim=softmax_dim)
            if mask is not None and empty == "zero":
                weights = weights.masked_fill(empty_rows, 0.0)
            merged = merge(weights @ V)
            out = merged @ self.W_O if use_W_O else merged
            return out + self.b_O if (self.b_O is not None and add_b_O) else out

    return MultiHeadAttention


MHA_REF = mha_class()


# ------------------------------------------------------------------ kv_cache_memory

def kv_ref(n_layers, n_heads, n_kv_heads, d_model, context, bytes_per_element):
    d_k = d_model // n_heads
    return 2 * n_layers * n_kv_heads * d_k * context * bytes_per_element


def kv_no_factor_2(n_layers, n_heads, n_kv_heads, d_model, context, bytes_per_element):
    return n_layers * n_kv_heads * (d_model // n_heads) * context * bytes_per_element


def kv_uses_d_model(n_layers, n_heads, n_kv_heads, d_model, context, bytes_per_element):
    return 2 * n_layers * d_model * context * bytes_per_element


def kv_no_layers(n_layers, n_heads, n_kv_heads, d_model, context, bytes_per_element):
    return 2 * n_kv_heads * (d_model // n_heads) * context * bytes_per_element


def kv_elements(n_layers, n_heads, n_kv_heads, d_model, context, bytes_per_element):
    return 2 * n_layers * n_kv_heads * (d_model // n_heads) * context


def kv_bits(n_layers, n_heads, n_kv_heads, d_model, context, bytes_per_element):
    return 2 * n_layers * n_kv_heads * (d_model // n_heads) * context * bytes_per_element * 8


def kv_gib(n_layers, n_heads, n_kv_heads, d_model, context, bytes_per_element):
    return 2 * n_layers * n_kv_heads * (d_model // n_heads) * context * bytes_per_element / 2 ** 30


REFERENCE = {
    "split_heads": (split_ref, merge_ref),
    "repeat_kv": (repeat_ref,),
    "kv_cache": (append_ref, mask_ref),
    "multi_head_attention": (MHA_REF,),
    "kv_cache_memory": (kv_ref,),
}

WRONG = {
    "split_heads": [
        ("split reshapes straight to (B, h, T, d_k)", (split_no_transpose, merge_ref),
         "mixes features of different positions"),
        ("split takes strided features", (split_strided, merge_ref), "every n_heads-th feature"),
        ("split forgets to move the heads axis", (split_not_moved, merge_ref),
         "swap axes 1 and 2 after the reshape"),
        ("split permutes the wrong axes", (split_wrong_permute, merge_ref), "wrong axes"),
        ("merge forgets the transpose", (split_ref, merge_no_transpose), "mixes positions"),
        ("merge uses view on a transposed tensor", (split_ref, merge_view), "not contiguous"),
    ],
    "repeat_kv": [
        ("tile with .repeat", (repeat_tile,), "repeated the whole stack"),
        ("tile with torch.cat", (repeat_cat,), "repeated the whole stack"),
        ("tile order through expand", (repeat_expand_tile_order,), "repeated the whole stack"),
        ("repeats along the positions axis", (repeat_positions_axis,), "along another axis"),
        ("repeats positions, then reshapes (learner 23)", (repeat_positions_folded,),
         "then reshaped"),
        ("expand without the reshape", (repeat_expand_only,), "fold it into the heads axis"),
        ("n_kv_heads copies instead of n_rep", (repeat_by_head_count,),
         "made n_kv_heads copies"),
    ],
    "kv_cache": [
        ("new keys before the cached ones", (append_new_first, mask_ref), "new keys before"),
        ("joins along the heads axis", (append_heads_axis, mask_ref), "concatenate along dim=2"),
        ("returns only this step's keys", (append_only_new, mask_ref), "appended to the cached"),
        ("returns the keys twice", (append_keys_twice, mask_ref), "keys twice"),
        ("returns (V, K)", (append_swapped, mask_ref), "wrong order"),
        ("fails on an empty cache", (append_no_none_case, mask_ref), "return (K, V) as they are"),
        ("mask aligned top-left", (append_ref, mask_top_left), "top-left"),
        ("mask inverted", (append_ref, mask_inverted), "inverted"),
        ("upper triangle (learner 23)",
         (append_ref, lambda L, S: torch.ones(L, S, dtype=torch.bool).triu(S - L)),
         "upper triangle"),
        ("mask without its diagonal", (append_ref, mask_no_diagonal), "misses its diagonal"),
        ("mask offset with the wrong sign", (append_ref, mask_wrong_sign), "wrong sign"),
        ("float mask", (append_ref, mask_float), "dtype=torch.bool"),
        ("square mask", (append_ref, mask_square), "not (L, L) or (S, S)"),
    ],
    "multi_head_attention": [
        ("its own softmax with one max-shift for the whole score tensor",
         (mha_class(global_max=True),), "each row's own maximum"),
        ("scaled by sqrt(d_model)", (mha_class(scale="d_model"),), "not by sqrt(d_model)"),
        ("not scaled", (mha_class(scale="none"),), "did not scale"),
        ("scaled by d_k", (mha_class(scale="twice"),), "divided by d_k"),
        ("K not transposed", (mha_class(transpose_k=False),), "not by K transposed"),
        ("mask polarity inverted", (mha_class(polarity=False),), "hid the positions where"),
        ("softmax over the queries", (mha_class(softmax_dim=-2),), "over the queries' axis"),
        ("no W_O", (mha_class(use_W_O=False),), "W_O was never used"),
        ("b_O forgotten", (mha_class(add_b_O=False),), "b_O was never added"),
        ("b_Q, b_K, b_V forgotten", (mha_class(add_b_in=False),), "b_Q, b_K and b_V"),
        ("heads split by a plain reshape", (mha_class(split=split_no_transpose),),
         "reshape straight to (B, n_heads, T, d_k)"),
        ("heads merged by a plain reshape", (mha_class(merge=merge_no_transpose),),
         "straight to (B, L, d_model)"),
        ("fully masked query gives NaN", (mha_class(empty="nan"),), "all -inf gives NaN"),
        ("-1e9 instead of -inf", (mha_class(empty="uniform"),), "uniform average"),
        ("GQA heads tiled", (mha_class(share=repeat_tile),), "not each head in place"),
        ("W_K of width d_model", (mha_class(kv_width="d_model"),), "n_kv_heads * d_k"),
        ("biases even with bias=False", (mha_class(bias_always=True),), "no b_* parameters"),
        ("caches without use_cache", (mha_class(cache="always"),), "without use_cache"),
        ("cache never stored", (mha_class(cache="not_stored"),), "store append_kv's result"),
        ("an uncached call reads a non-empty cache (learner 23)",
         (mha_class(cache="when_present"),), "read or extended the cache"),
        ("an uncached call extends a non-empty cache (learner 23)",
         (mha_class(cache="extends_unread"),), "read or extended the cache"),
        ("start never passed to the positions (issue 23)", (mha_class(start_zero=True),),
         "passed to self.apply_positions"),
        ("cache stored after repeat_kv (issue 23)", (mha_class(cache="after_repeat"),),
         "store K and V before repeat_kv"),
        ("forward under torch.no_grad", (mha_class(grad=False),), "no torch.no_grad"),
    ],
    "kv_cache_memory": [
        ("K only, no factor 2", (kv_no_factor_2,), "multiply by 2"),
        ("d_model instead of n_kv_heads * d_k", (kv_uses_d_model,), "not d_model"),
        ("no n_layers", (kv_no_layers,), "n_layers is missing"),
        ("elements, not bytes", (kv_elements,), "counted numbers, not bytes"),
        ("bits", (kv_bits,), "multiplied by 8"),
        ("GiB", (kv_gib,), "do not convert to GiB"),
    ],
}

# A right MultiHeadAttention in a notebook whose split_heads is wrong: the failure names the
# exercise to fix first (the check finds the learner's other answers by name in the namespace).
_BROKEN = {"split_heads": split_no_transpose, "merge_heads": merge_ref, "repeat_kv": repeat_ref,
           "append_kv": append_ref, "causal_mask": mask_ref}
DEPENDENT = {
    "multi_head_attention": [
        ("its own split_heads is wrong", (mha_class(split=split_no_transpose),),
         dict(_BROKEN, MultiHeadAttention=mha_class(split=split_no_transpose)), "fix split_heads first"),
        ("its own repeat_kv tiles", (mha_class(share=repeat_tile),),
         dict(_BROKEN, split_heads=split_ref, repeat_kv=repeat_tile), "fix repeat_kv first"),
    ],
}
