"""Checks of set 07 (lesson 07): transformer_layer (``TransformerLayer``), token_embedding
(``TokenEmbedding``), language_model (``LanguageModel``) and layer_param_count.

References, in float64 with the same weights: ``torch.nn.TransformerEncoderLayer(...,
activation="gelu")`` for the layer (grouped-query and cached cases: the same equations on
``F.scaled_dot_product_attention``, ``F.gelu`` and ``F.layer_norm``); the course's
``txlearn.layer.TransformerLayer`` and ``txlearn.heads.KVCache`` for the language model. When an
answer is wrong, the outputs of the catalogued mistakes (``tests/catalogue/layer.py``) on the same
inputs choose the hint. Source: ``exercises/source/07_layer.py``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from txlearn.checks import CheckFailure, cache_shapes, exercise, expect_close, expect_true
from txlearn.checks.modules import (F32, backward, expect_match, expect_shape_of, f64, load,
                                    make_module, mask_ref, mha_reference, np64, rehint, run)
from txlearn.positional import sinusoidal_encoding_np

# ----------------------------------------------------------------------------- transformer_layer

TL_FLAG = (
    "two orders, one flag",
    "norm_first=False is post-LN, LN(x + sublayer(x)); norm_first=True is pre-LN, "
    "x + sublayer(LN(x))",
    "your layer uses the other order")
TL_NO_ATTN_RESIDUAL = (
    "every sub-layer has a residual connection",
    "the attention sub-layer adds its input back, like the FFN",
    "the attention sub-layer is missing its residual")
TL_NO_FFN_RESIDUAL = (
    "every sub-layer has a residual connection",
    "the FFN sub-layer adds its input back, like the attention",
    "the FFN sub-layer is missing its residual")
TL_NORM_INSIDE = (
    "post-LN normalises the sum",
    "LN(x + sublayer(x)): the norm comes after the addition",
    "you normalised only the sub-layer's output, then added x")
TL_PRE_NORM_OUT = (
    "pre-LN leaves the residual stream unnormalised",
    "with norm_first=True the sums are returned as they are",
    "you normalised the sums as well")
TL_SWAPPED_NORMS = (
    "each sub-layer has its own norm",
    "norm1 goes with the attention, norm2 with the FFN",
    "yours are swapped")
TL_ONE_NORM = (
    "each sub-layer has its own norm",
    "norm1 goes with the attention, norm2 with the FFN: their gamma and beta differ",
    "you used norm1 for both sub-layers")
TL_FFN_ON_X = (
    "the FFN reads what the attention wrote",
    "the second sub-layer's input is h, the output of the first residual connection",
    "your FFN read the layer's input x instead of h")
TL_EPS = (
    "eps is an argument of the layer",
    "pass eps to both LayerNorms",
    "your norms use their default eps")
TL_NO_MASK = (
    "the mask reaches the attention",
    "forward's mask goes to self.attn",
    "your layer attended without the mask")
TL_CACHE = (
    "use_cache reaches the attention",
    "forward's use_cache goes to self.attn, which keeps the keys between calls",
    "the second cached step did not see the first step's keys")
TL_CACHE_TWICE = (
    "how many times does one forward call the attention?",
    "each call of the attention with use_cache=True appends this step's keys to its cache: "
    "your layer's cache grew by more positions than the step holds, so a sub-layer ran twice "
    "(the residual connection of set 06 calls its sub-layer once)")
TL_NAMES = (
    "the state-dict names are part of the statement",
    "four submodules, attn, norm1, ffn and norm2, holding your modules' own names",
    "attn.W_Q, ..., norm1.gamma, norm1.beta, ffn.W_1, ..., norm2.beta: nothing else")
TL_BIAS = (
    "bias=False reaches both sub-layers",
    "the attention and the FFN are built with bias=bias",
    "pass bias on to your MultiHeadAttention and FeedForward")
TL_KV = (
    "the layer's attention has n_kv_heads key/value heads",
    "attn.W_K and attn.W_V are (d_model, n_kv_heads * d_k)",
    "pass n_kv_heads on to your MultiHeadAttention")
TL_DEFAULT = ("post-LN: h = LN1(x + MHA(x)), out = LN2(h + FFN(h)); pre-LN: h = x + MHA(LN1(x)), "
              "out = h + FFN(LN2(h))",)


def _layer_state(d_model, n_heads, d_ff, n_kv_heads, bias, seed, scale=0.6):
    rng = np.random.default_rng(seed)
    d_kv = n_kv_heads * (d_model // n_heads)
    shapes = {"attn.W_Q": (d_model, d_model), "attn.W_K": (d_model, d_kv),
              "attn.W_V": (d_model, d_kv), "attn.W_O": (d_model, d_model),
              "ffn.W_1": (d_model, d_ff), "ffn.W_2": (d_ff, d_model)}
    if bias:
        shapes.update({"attn.b_Q": (d_model,), "attn.b_K": (d_kv,), "attn.b_V": (d_kv,),
                       "attn.b_O": (d_model,), "ffn.b_1": (d_ff,), "ffn.b_2": (d_model,)})
    state = {k: rng.normal(0.0, scale, s) for k, s in shapes.items()}
    for i in (1, 2):
        state[f"norm{i}.gamma"] = rng.uniform(0.5, 2.0, d_model)
        state[f"norm{i}.beta"] = rng.uniform(-1.0, 1.0, d_model)
    return state


def _sub(state, prefix):
    return {k[len(prefix) + 1:]: v for k, v in state.items() if k.startswith(prefix + ".")}


def _layer(state, x, n_heads, mask, norm_first, eps, variant="right"):
    """One layer (float64) from the course's equations, right or with one catalogued mistake."""
    t = {k: f64(v) for k, v in state.items()}
    x = f64(x)
    d = x.shape[-1]
    attn_state = _sub(t, "attn")
    m = None if variant == "no mask" else mask

    def attn(h):
        return mha_reference(attn_state, h, n_heads, m)

    def ffn(h):
        return F.gelu(h @ t["ffn.W_1"] + t.get("ffn.b_1", 0.0)) @ t["ffn.W_2"] + t.get("ffn.b_2", 0.0)

    e = 1e-5 if variant == "eps ignored" else eps
    n1, n2 = {"swapped norms": ("norm2", "norm1"), "one norm": ("norm1", "norm1")}.get(
        variant, ("norm1", "norm2"))

    def ln1(h):
        return F.layer_norm(h, (d,), t[f"{n1}.gamma"], t[f"{n1}.beta"], e)

    def ln2(h):
        return F.layer_norm(h, (d,), t[f"{n2}.gamma"], t[f"{n2}.beta"], e)

    keep1 = 0.0 if variant == "no attention residual" else 1.0
    keep2 = 0.0 if variant == "no FFN residual" else 1.0
    first = (not norm_first) if variant == "flag inverted" else norm_first
    if first and variant == "pre normalises output":
        h = ln1(x + attn(ln1(x)))
        return ln2(h + ffn(ln2(h)))
    ffn_in = (lambda h: x) if variant == "FFN reads x" else (lambda h: h)
    if first:
        h = keep1 * x + attn(ln1(x))
        return keep2 * h + ffn(ln2(ffn_in(h)))
    if variant == "norm inside":
        h = x + ln1(attn(x))
        return h + ln2(ffn(h))
    h = ln1(keep1 * x + attn(x))
    return ln2(keep2 * h + ffn(ffn_in(h)))


_TL_VARIANTS = [("flag inverted", TL_FLAG), ("no attention residual", TL_NO_ATTN_RESIDUAL),
                ("no FFN residual", TL_NO_FFN_RESIDUAL), ("norm inside", TL_NORM_INSIDE),
                ("pre normalises output", TL_PRE_NORM_OUT), ("swapped norms", TL_SWAPPED_NORMS),
                ("eps ignored", TL_EPS), ("no mask", TL_NO_MASK), ("one norm", TL_ONE_NORM),
                ("FFN reads x", TL_FFN_ON_X)]


def _torch_layer(state, d_model, n_heads, d_ff, norm_first, eps):
    """``nn.TransformerEncoderLayer`` (float64, eval) holding ``state`` (course names)."""
    layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=norm_first,
                                       layer_norm_eps=eps, dtype=torch.float64).eval()
    t = {k: torch.as_tensor(np64(v)) for k, v in state.items()}
    layer.load_state_dict({
        "self_attn.in_proj_weight": torch.cat([t["attn.W_Q"].T, t["attn.W_K"].T, t["attn.W_V"].T]),
        "self_attn.in_proj_bias": torch.cat([t["attn.b_Q"], t["attn.b_K"], t["attn.b_V"]]),
        "self_attn.out_proj.weight": t["attn.W_O"].T, "self_attn.out_proj.bias": t["attn.b_O"],
        "linear1.weight": t["ffn.W_1"].T, "linear1.bias": t["ffn.b_1"],
        "linear2.weight": t["ffn.W_2"].T, "linear2.bias": t["ffn.b_2"],
        "norm1.weight": t["norm1.gamma"], "norm1.bias": t["norm1.beta"],
        "norm2.weight": t["norm2.gamma"], "norm2.bias": t["norm2.beta"]})
    return layer


def _layer_module(TransformerLayer, d_model, n_heads, d_ff, case, *, n_kv_heads=None,
                  norm_first=False, eps=None, bias=True, seed=0, scale=0.6):
    kwargs = {"norm_first": norm_first}
    if n_kv_heads is not None:
        kwargs["n_kv_heads"] = n_kv_heads
    if eps is not None:
        kwargs["eps"] = eps
    if not bias:
        kwargs["bias"] = False
    m = make_module(TransformerLayer, d_model, n_heads, d_ff, case=case, **kwargs)
    state = _layer_state(d_model, n_heads, d_ff, n_kv_heads or n_heads, bias, seed, scale)
    load(m, state, case=case, names=TL_NAMES, unexpected=None if bias else TL_BIAS,
         shapes={"attn.W_K": TL_KV, "attn.W_V": TL_KV})
    return m, state


def _cache_overfull(module, positions, case):
    """Whether a cache of ``module`` holds more than ``positions`` positions (axis 2)."""
    return any(len(shape) > 2 and shape[2] > positions
               for pair in cache_shapes(module, case=case) for shape in pair)


def _expect_layer(got, want, state, x, n_heads, mask, norm_first, eps, case):
    expect_shape_of(got, tuple(x.shape), case=case, hint=("the layer keeps the shape of x",))
    mistakes = [(lambda v=v: _layer(state, x, n_heads, mask, norm_first, eps, v), h)
                for v, h in _TL_VARIANTS]
    expect_match(got, want, case=case, **F32, mistakes=mistakes, default=TL_DEFAULT)


@exercise("transformer_layer",
          needs=("multi_head_attention", "feed_forward", "layer_norm_module", "residual_connection"))
def transformer_layer(TransformerLayer):
    g = torch.Generator().manual_seed(16)
    mask = mask_ref(5, 5)
    for norm_first, seed in ((False, 30), (True, 31)):
        case = (f"{'pre' if norm_first else 'post'}-LN (norm_first={norm_first}), B=2, T=5, "
                f"d_model=8, n_heads=2, d_ff=16, causal mask")
        m, state = _layer_module(TransformerLayer, 8, 2, 16, case, norm_first=norm_first, seed=seed)
        x = torch.randn(2, 5, 8, generator=g)
        got = run(m, x.clone(), mask=mask, case=case)
        with torch.no_grad():
            want = _torch_layer(state, 8, 2, 16, norm_first, 1e-5)(x.double(), src_mask=~mask)
        _expect_layer(got, want, state, x, 2, mask, norm_first, 1e-5, case)

    case = "post-LN, eps=0.01, inputs and weights of scale 0.05 and 0.2"
    m, state = _layer_module(TransformerLayer, 8, 2, 16, case, eps=0.01, seed=32, scale=0.2)
    x = 0.05 * torch.randn(2, 5, 8, generator=g)
    got = run(m, x.clone(), mask=mask, case=case)
    with torch.no_grad():
        want = _torch_layer(state, 8, 2, 16, False, 0.01)(x.double(), src_mask=~mask)
    _expect_layer(got, want, state, x, 2, mask, False, 0.01, case)

    case = "pre-LN, GQA n_heads=4, n_kv_heads=2, bias=False, B=2, T=5, d_model=8"
    m, state = _layer_module(TransformerLayer, 8, 4, 16, case, n_kv_heads=2, norm_first=True,
                             bias=False, seed=33)
    x = torch.randn(2, 5, 8, generator=g)
    got = run(m, x.clone(), mask=mask, case=case)
    _expect_layer(got, _layer(state, x, 4, mask, True, 1e-5), state, x, 4, mask, True, 1e-5, case)

    x = torch.randn(1, 5, 8, generator=g)
    for norm_first in (True, False):
        layout = "pre-LN" if norm_first else "post-LN"
        for step, (lo, hi) in enumerate(((0, 3), (3, 5)), start=1):
            case = (f"KV cache, step {step}: positions {lo}-{hi - 1}, {layout}, n_kv_heads=2, "
                    f"use_cache=True")
            if step == 1:
                m, state = _layer_module(TransformerLayer, 8, 4, 16, case, n_kv_heads=2,
                                         norm_first=norm_first, seed=34)
                full = _layer(state, x, 4, mask, norm_first, 1e-5)
            try:
                got = run(m, x[:, lo:hi].clone(), mask=mask_ref(hi - lo, hi), use_cache=True,
                          case=case, raised=[("must match", TL_CACHE)])
            except CheckFailure as err:   # a second call's keys no longer fit the mask
                if _cache_overfull(m, hi, case):
                    raise rehint(err, TL_CACHE_TWICE) from None
                raise
            expect_true(not _cache_overfull(m, hi, case), case=case, hint=TL_CACHE_TWICE,
                        message=f"after positions 0-{hi - 1} the attention's cache holds "
                        f"{cache_shapes(m, case=case)}")
            expect_shape_of(got, (1, hi - lo, 8), case=case, hint=TL_CACHE)
            expect_close(got, full[:, lo:hi], case=case, **F32, hint=TL_CACHE)


# ----------------------------------------------------------------------------- token_embedding

EMB_NO_SCALE = (
    "the paper scales the embedding",
    "multiply W_E[ids] by sqrt(d_model) (section 3.4) before adding the positions",
    "you did not scale it")
EMB_SCALE_AFTER = (
    "only the token embedding is scaled",
    "scale W_E[ids] by sqrt(d_model), then add the positional table as it is",
    "you scaled the sum, positions included")
EMB_DIVIDED = (
    "the scale multiplies",
    "W_E[ids] * sqrt(d_model)",
    "you divided by sqrt(d_model)")
EMB_D_MODEL = (
    "the scale is a square root",
    "W_E[ids] * sqrt(d_model)",
    "you multiplied by d_model")
EMB_START = (
    "positions continue after the cache",
    "token t of this call sits at position start + t",
    "you added the table's first T rows whatever start is")
EMB_FROM_ONE = (
    "positions are counted from 0",
    "the first token of a sequence (start = 0) gets row 0 of the table",
    "your positions are one too far")
EMB_NAMES = (
    "the state-dict names are part of the statement",
    "one parameter, W_E (n_vocab, d_model)",
    "keep no other parameters (the positional table is computed, not learned)")
EMB_GRAD = (
    "the table must be trainable",
    "gradients reach W_E through the lookup W_E[ids]",
    "no gradient reached W_E")
EMB_DEFAULT = ("x_t = W_E[ids_t] * sqrt(d_model) + PE[start + t]",)


def _embed(W_E, ids, start, d, variant="right"):
    W_E, ids = f64(W_E), torch.as_tensor(ids)
    T = ids.shape[-1]
    first = {"start ignored": 0, "from one": start + 1}.get(variant, start)
    pe = torch.as_tensor(sinusoidal_encoding_np(first + T, d)[first:])
    rows = W_E[ids]
    if variant == "scale after":
        return (rows + pe) * math.sqrt(d)
    factor = {"no scale": 1.0, "divided": 1 / math.sqrt(d), "d_model": d}.get(variant, math.sqrt(d))
    return rows * factor + pe


_EMB_VARIANTS = [("no scale", EMB_NO_SCALE), ("scale after", EMB_SCALE_AFTER),
                 ("divided", EMB_DIVIDED), ("d_model", EMB_D_MODEL), ("start ignored", EMB_START),
                 ("from one", EMB_FROM_ONE)]


@exercise("token_embedding", needs=("sinusoidal_table",))
def token_embedding(TokenEmbedding):
    g = torch.Generator().manual_seed(17)
    rng = np.random.default_rng(35)
    W_E = rng.normal(0.0, 0.5, (11, 8))
    for case, ids, start in (("n_vocab=11, d_model=8, ids (2, 5), start 0",
                              torch.randint(0, 11, (2, 5), generator=g), None),
                             ("ids (1, 3), start=4 (4 positions already cached)",
                              torch.randint(0, 11, (1, 3), generator=g), 4)):
        m = make_module(TokenEmbedding, 11, 8, case=case)
        load(m, {"W_E": W_E}, case=case, names=EMB_NAMES)
        got = run(m, ids.clone(), case=case, **({} if start is None else {"start": start}))
        expect_shape_of(got, (*ids.shape, 8), case=case, hint=("(B, T) ids give (B, T, d_model)",))
        s = start or 0
        mistakes = [(lambda v=v: _embed(W_E, ids, s, 8, v), h) for v, h in _EMB_VARIANTS]
        expect_match(got, _embed(W_E, ids, s, 8), case=case, **F32, mistakes=mistakes,
                     default=EMB_DEFAULT)

    case = "gradients: ids (2, 5)"
    m = make_module(TokenEmbedding, 11, 8, case=case)
    load(m, {"W_E": W_E}, case=case, names=EMB_NAMES)
    ids, g_out = torch.randint(0, 11, (2, 5), generator=g), torch.randn(2, 5, 8, generator=g)
    _, grads = backward(m, ids, grad_output=g_out, case=case, raised=[("grad", EMB_GRAD)])
    want = torch.zeros(11, 8, dtype=torch.float64).index_add_(
        0, ids.reshape(-1), g_out.double().reshape(-1, 8)) * math.sqrt(8)
    expect_true(grads.get("W_E") is not None, case=case, message="no gradient reached W_E",
                hint=EMB_GRAD)
    expect_close(grads["W_E"], want, case=case + ", gradient of W_E", **F32, hint=EMB_GRAD)


# ----------------------------------------------------------------------------- language_model

LM_UNTIED = (
    "the output head is tied to the embedding",
    "the logits use W_E itself, transposed: the model has no output matrix of its own",
    "remove the separate head (an nn.Linear or a W_U) and compute norm(h) @ embed.W_E.T")
LM_DETACHED = (
    "a tied head trains the table too",
    "gradients from the logits must reach W_E: use it as it is, not a copy or .detach()",
    "the gradient of embed.W_E misses the part that comes through the head")
LM_NO_FINAL_NORM = (
    "pre-LN needs a final norm",
    "the residual stream of pre-LN layers is never normalised: apply norm before the head",
    "your logits skip the final LayerNorm")
LM_POST_LN = (
    "the model's layers are pre-LN",
    "build every TransformerLayer with norm_first=True",
    "your layers are post-LN")
LM_NO_MASK = (
    "a language model must not see the future",
    "pass causal_mask(T, start + T) to every layer",
    "your layers attended without the causal mask")
LM_CACHED_NO_MASK = (
    "does a cached step of several tokens need a mask?",
    "yes: the new tokens must not see each other's future either; pass causal_mask(T, start + T) "
    "on every call (with one new token it hides nothing), not only on the first",
    "your cached step attended without a mask")
LM_PROBABILITIES = (
    "the model returns logits",
    "the loss of set 09 applies the softmax itself",
    "you returned probabilities (a softmax of the logits)")
LM_START = (
    "positions continue after the cache",
    "with use_cache=True, start is the number of positions the first layer has cached; the "
    "embedding starts there",
    "the new tokens were embedded at positions 0, 1, ... again")
LM_TOP_LEFT = (
    "the mask of a cached step",
    "the new queries are the last T of start + T positions: causal_mask(T, start + T) is aligned "
    "bottom-right",
    "your mask is aligned top-left")
LM_CACHE_MASK = (
    "the mask covers the cached keys",
    "with use_cache=True the attention sees start + T keys",
    "build causal_mask(T, start + T), not causal_mask(T, T)")
LM_UNCACHED_START = (
    "a call without use_cache is a sequence of its own",
    "start counts the cached positions only when use_cache is true; without it the embedding "
    "starts at 0 and the mask is causal_mask(T, T), whatever the layers have cached",
    "your model read the first layer's cache during a call without use_cache")
LM_NAMES = (
    "the state-dict names are part of the statement",
    "embed.W_E, layers.<i>.<your layer's names>, norm.gamma, norm.beta: nothing else",
    "the tied head has no parameter of its own")
LM_DEFAULT = ("logits = LN(layers(embed(ids))) @ embed.W_E^T, pre-LN layers, causal mask",)


class _Embed(nn.Module):
    def __init__(self, n_vocab, d_model):
        super().__init__()
        self.W_E = nn.Parameter(torch.zeros(n_vocab, d_model))


class _ReferenceLM(nn.Module):
    """The course's layers (``txlearn.layer.TransformerLayer``, exact GELU, pre-LN) with the
    statement's names; forward can replay a catalogued mistake."""

    def __init__(self, n_vocab, d_model, n_heads, d_ff, n_layers, n_kv_heads=None):
        super().__init__()
        from txlearn.layer import TransformerLayer
        from txlearn.norms import LayerNorm
        self.embed = _Embed(n_vocab, d_model)
        self.layers = nn.ModuleList(TransformerLayer(d_model, n_heads, d_ff, n_kv_heads,
                                                     activation="gelu", norm_first=True)
                                    for _ in range(n_layers))
        self.norm = LayerNorm(d_model)

    def run(self, chunks, variant="right"):
        """Logits of each chunk of ids, fed in turn through a fresh KV cache."""
        from txlearn.heads import KVCache
        caches = [KVCache() for _ in self.layers]
        d = self.embed.W_E.shape[1]
        outs, start = [], 0
        for ids in chunks:
            T = ids.shape[-1]
            x = _embed(self.embed.W_E, ids, 0 if variant == "start ignored" else start, d)
            mask = None if variant == "no mask" or (variant == "no cached mask" and start) \
                else mask_ref(T, start + T)
            if variant == "top-left":
                mask = torch.ones(T, start + T, dtype=torch.bool).tril()
            for layer, cache in zip(self.layers, caches):
                layer.norm_first = variant != "post-LN"
                x = layer(x, mask=mask, cache=cache)
            h = x if variant == "no final norm" else self.norm(x)
            logits = h @ self.embed.W_E.T
            outs.append(torch.softmax(logits, -1) if variant == "probabilities" else logits)
            start += T
        for layer in self.layers:
            layer.norm_first = True
        return outs


_LM_VARIANTS = [("no final norm", LM_NO_FINAL_NORM), ("post-LN", LM_POST_LN),
                ("no mask", LM_NO_MASK), ("probabilities", LM_PROBABILITIES),
                ("start ignored", LM_START), ("top-left", LM_TOP_LEFT),
                ("no cached mask", LM_CACHED_NO_MASK)]


def _lm_state(ref, seed):
    rng = np.random.default_rng(seed)
    state = {}
    for name, p in ref.state_dict().items():
        if name.endswith("gamma"):
            state[name] = rng.uniform(0.5, 1.5, tuple(p.shape))
        elif name.endswith("beta"):
            state[name] = rng.normal(0.0, 0.2, tuple(p.shape))
        else:
            state[name] = rng.normal(0.0, 0.5 if name == "embed.W_E" else 0.3, tuple(p.shape))
    ref.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
    return state


def _lm(LanguageModel, sizes, seed, case):
    kwargs = {} if sizes[5] is None else {"n_kv_heads": sizes[5]}
    m = make_module(LanguageModel, *sizes[:5], case=case, **kwargs)
    ref = _ReferenceLM(*sizes).double()
    state = _lm_state(ref, seed)
    load(m, state, case=case, names=LM_NAMES, unexpected=LM_UNTIED)
    return m, ref, state


def _expect_lm(got, ref, chunks, index, case, default=None):
    with torch.no_grad():
        want = ref.run(chunks)[index]
        expect_shape_of(got, tuple(want.shape), case=case,
                        hint=("logits are (B, T, n_vocab)",))
        mistakes = [(lambda v=v: ref.run(chunks, v)[index], h) for v, h in _LM_VARIANTS]
        expect_match(got, want, case=case, **F32, mistakes=mistakes, default=default or LM_DEFAULT)


@exercise("language_model", needs=("transformer_layer", "token_embedding"))
def language_model(LanguageModel):
    g = torch.Generator().manual_seed(18)
    sizes = (13, 8, 2, 16, 2, None)            # n_vocab, d_model, n_heads, d_ff, n_layers, n_kv
    ids = torch.randint(0, 13, (2, 6), generator=g)
    case = "n_vocab=13, d_model=8, n_heads=2, d_ff=16, n_layers=2, ids (2, 6), no cache"
    m, ref, _ = _lm(LanguageModel, sizes, 40, case)
    _expect_lm(run(m, ids.clone(), case=case), ref, [ids], 0, case)

    chunks = [ids[:, :4], ids[:, 4:]]
    for step in (0, 1):
        case = f"KV cache, step {step + 1}: ids[:, {4 * step}:{4 + 2 * step}], use_cache=True"
        if step == 0:
            m, ref, _ = _lm(LanguageModel, sizes, 40, case)
        got = run(m, chunks[step].clone(), use_cache=True, case=case,
                  raised=[("must match", LM_CACHE_MASK)])
        _expect_lm(got, ref, chunks, step, case)
    case = "after those cached steps, ids (2, 6) again without use_cache (the cache is not read)"
    got = run(m, ids.clone(), case=case, raised=[("must match", LM_UNCACHED_START)])
    _expect_lm(got, ref, [ids], 0, case, default=LM_UNCACHED_START)

    case = "multi-query: n_heads=2, n_kv_heads=1, n_layers=1, ids (1, 5)"
    m, ref, _ = _lm(LanguageModel, (13, 8, 2, 16, 1, 1), 41, case)
    ids1 = torch.randint(0, 13, (1, 5), generator=g)
    _expect_lm(run(m, ids1.clone(), case=case), ref, [ids1], 0, case)

    case = "gradients: ids (2, 6), the tied W_E"
    m, ref, state = _lm(LanguageModel, sizes, 42, case)
    g_out = torch.randn(2, 6, 13, generator=g)
    _, grads = backward(m, ids.clone(), grad_output=g_out, case=case,
                        raised=[("grad", LM_DETACHED)])
    ref.zero_grad()
    ref.run([ids])[0].backward(g_out.double())
    params = dict(ref.named_parameters())
    for name in ("embed.W_E", "layers.0.attn.W_Q", "norm.gamma"):
        have = grads.get(name)
        expect_true(have is not None, case=case, message=f"no gradient reached {name}",
                    hint=LM_DETACHED)
        expect_close(have, params[name].grad, case=f"{case}, gradient of {name}", **F32,
                     hint=LM_DETACHED)


# ----------------------------------------------------------------------------- layer_param_count

def _right_count(d, d_ff):
    return (4 * d * d + 4 * d) + (2 * d * d_ff + d_ff + d) + 4 * d


COUNT_INT = (
    "a count is a whole number",
    "keep to integer arithmetic: no /, no float()",
    "return an int")
COUNT_DEFAULT = ("attention 4 d^2 + 4 d, FFN 2 d d_ff + d_ff + d, two LayerNorms 4 d",)
_COUNT_WRONGS = [
    (lambda d, f, h: 4 * d * d + 2 * d * f, (
        "count every parameter", "biases and the norms' vectors count too",
        "you left out the biases (4 d_model for attention, d_ff + d_model for the FFN) and the "
        "norms' gamma and beta (2 d_model each)")),
    (lambda d, f, h: _right_count(d, f) - 4 * d, (
        "the norms have parameters", "each LayerNorm has gamma and beta, d_model each",
        "you left out the two LayerNorms (4 d_model)")),
    (lambda d, f, h: _right_count(d, f) - 2 * d, (
        "the norms have two vectors each", "LayerNorm has gamma AND beta",
        "you counted only one vector per LayerNorm")),
    (lambda d, f, h: _right_count(d, f) - (4 * d + f + d), (
        "the linear maps have biases", "b_Q, b_K, b_V, b_O (d_model each), b_1 (d_ff), b_2 (d_model)",
        "count the biases of the linear maps")),
    (lambda d, f, h: _right_count(d, f) - d * d - d, (
        "attention has four matrices", "W_Q, W_K, W_V and the output projection W_O",
        "you left out W_O and its bias b_O")),
    (lambda d, f, h: _right_count(d, f) - d * f, (
        "the FFN has two matrices", "W_1 (d_model, d_ff) and W_2 (d_ff, d_model)",
        "you counted only one of them")),
    (lambda d, f, h: _right_count(d, f) - 4 * d * d - 4 * d + 4 * d * (d // h) + 4 * (d // h), (
        "each projection maps d_model to all the heads at once",
        "W_Q, W_K, W_V and W_O are (d_model, d_model): the heads are n_heads slices of width "
        "d_k of one projection, so they hold n_heads * d_k = d_model columns together",
        "you counted the matrices of one head, (d_model, d_k)")),
    (lambda d, f, h: _right_count(d, f) + f - d, (
        "each bias has the width of its layer's output",
        "b_1 follows W_1 (d_model -> d_ff): d_ff entries; b_2 follows W_2 (d_ff -> d_model): "
        "d_model entries",
        "you gave b_2 d_ff entries")),
    (lambda d, f, h: _right_count(d, f) + (h - 1) * (4 * d * d + 4 * d), (
        "what n_heads changes", "n_heads heads of width d_k = d_model / n_heads share the same "
        "(d_model, d_model) matrices",
        "the number of heads does not change the count")),
]


@exercise("layer_param_count")
def layer_param_count(layer_param_count):
    for d_model, n_heads, d_ff in ((8, 2, 20), (512, 8, 2048), (48, 6, 100)):
        case = f"d_model={d_model}, n_heads={n_heads}, d_ff={d_ff}"
        got = run(layer_param_count, d_model, n_heads, d_ff, case=case)
        expect_true(isinstance(got, (int, np.integer)) and not isinstance(got, bool), case=case,
                    message=f"expected an int, got {type(got).__name__}", hint=COUNT_INT)
        expected = _right_count(d_model, d_ff)
        hint = next((h for wrong, h in _COUNT_WRONGS if got == wrong(d_model, d_ff, n_heads)),
                    COUNT_DEFAULT)
        expect_true(got == expected, case=case, message=f"got {got:,}, expected {expected:,}",
                    hint=hint)
