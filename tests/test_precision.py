"""Every public component in float32, float16 and bfloat16 against its float64 reference (issue 14).

The sweep: each entry of CASES builds one component in a dtype, feeds it inputs in that dtype, and
compares its output with a float64 reference computed from the *same* numbers: the inputs and
the weights as rounded to the dtype, converted exactly to float64. The test therefore measures the
component's own arithmetic, not the rounding of its inputs (which no code can undo). The bound is

    max |got - ref|  <=  C * eps(dtype) * scale,

    eps(dtype) = torch.finfo(dtype).eps: 2^-23 (float32), 2^-10 (float16), 2^-7 (bfloat16);
    scale      = max |ref| over the whole output (the output's scale), or, for elementwise
                 functions, |ref| of each element, but at least tiny / eps (tiny = the dtype's
                 smallest normal number): results below tiny may be off by C * tiny, since
                 subnormal numbers may be flushed to 0 (exp(-2u) overflowing to inf in
                 sigmoid(2u) = 1 / (1 + exp(-2u)) does that to the tanh form of GELU at
                 x = -10.25, -3e-40, in float32).
    Where the reference is exactly 0 (masked weights, fully masked rows), so must the result be.

How C is chosen (two numbers per case; "measured" = the worst ratio err / (eps * scale) over 50
seeds, which ``python tests/test_precision.py`` prints):

- C, for float16 and bfloat16. A component that computes in float32 and rounds its result once
  is off by at most half a unit in the last place, 0.5 eps * |y|, plus float32's own error (about
  1e-4 of a float16 eps): C = 1, derived (measured at most 0.49). A module that also rounds
  intermediate results to its dtype (attention's projections, the FFN's hidden layer, the
  residual stream) adds roundings that the weights and norms after them amplify: C = twice the
  measured worst, rounded up (measured 0.6 to 1.3).
- C_f32, for float32, which has no wider dtype to compute in: every step rounds in float32 and a
  chain of steps adds up, C_f32 = twice the measured worst, rounded up (measured 0.25 to 3.8).
  Two are larger because the function itself is ill-conditioned there, the same in any code:
  softmax_jacobian's diagonal s_i - s_i^2 cancels as the softmax saturates (measured 18.6), and
  GELU(x) ~ exp(-x^2 / 2) for x << 0, so rounding x / sqrt(2) alone moves it by about x^2 eps / 2
  relative (measured 32 for x in [-8, 8]; 44 for the tanh form).

A computation in the 16-bit dtype shows as a ratio far above C on the hard inputs. The code before
issue 14 (worst of 5 seeds): RoPE at long positions 232 (bfloat16), 1,858 (float16) and 7,999
(float32: its angles were float64 but rounded to float32 before cos and sin); LayerNorm and RMSNorm
on large inputs in float16, 1,024 and more (zeros); attention on large close scores, 27 to 31;
softmax of large logits over a temperature, NaN in float16 and 124; GELU for x << 0, 7 (float16)
and 128 (bfloat16, 0 for a small nonzero result).

The hard inputs are the ones where a 16-bit computation breaks: large and close logits (a score
error delta is a relative weight error delta), logits whose division by the temperature
overflows float16, long RoPE and sinusoidal positions (an angle between 1,024 and 2,048 in
bfloat16 is off by up to 4 radians), large norms' inputs (a float16 sum of squares overflows at 65,504), tiny ones
(the squares underflow), fully masked rows (output exactly 0), and decoding with a KV cache.

To add a component (e.g. a whole model): append one ``Case`` to CASES with its ``build`` (the
component in a dtype), ``inputs`` (its arguments in that dtype, from the global seed) and
``reference`` (float64 output from the built component and the float64 inputs), its C and C_f32
(measured with ``python tests/test_precision.py``, then set as above).
"""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from txlearn import (attention, ffn, flash_attention, heads, layer, masks, norms, positional,
                     softmax)
from txlearn.models.char_lm import CharTransformer
from txlearn.models.llama import LlamaConfig, LlamaDecoder
from txlearn.precision import compute_dtype, upcast

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[torch.dtype], Callable]  # the component in `dtype` (weights from the seed)
    inputs: Callable[[torch.dtype], tuple]  # its arguments; float tensors in `dtype`
    reference: Callable[[Callable, tuple], object]  # float64 output: (built component, f64 args)
    C: float  # float16 and bfloat16: tolerance in eps(dtype) * scale (module docstring)
    C_f32: float  # float32: the same, for a computation with no wider dtype to work in
    elementwise: bool = False  # scale each element by its own |ref| (elementwise functions)

    def tolerance(self, dtype: torch.dtype) -> float:
        return self.C_f32 if dtype == torch.float32 else self.C


# ----------------------------------------------------------------------------- helpers

def randn(*shape, scale=1.0, shift=0.0):
    """float64 normal numbers from the global seed (cast to a dtype by the case)."""
    return torch.randn(*shape, dtype=torch.float64) * scale + shift


def grid(*shape, step=1 / 8, lo=-24, hi=24, shift=0.0):
    """float64 multiples of `step` in [lo, hi] * step, plus `shift`: numbers that every dtype
    holds exactly and whose products and short sums float32 holds exactly, so that Q K^T is exact
    in float32 and a test of large scores measures the softmax, not float32's own rounding."""
    return torch.randint(lo, hi + 1, shape).double() * step + shift


def cast(args, dtype):
    return tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                 for a in args)


def module(factory):
    """build() for an nn.Module: made in float32 from the seed, then cast (like a user would)."""
    return lambda dtype: factory().eval().to(dtype)


def f64(component):
    """A float64 copy of a module: its weights as rounded to the module's dtype, exactly."""
    return copy.deepcopy(component).double()


def same_module_in_float64(component, args):
    """Reference for a module: the same module in float64 on the same numbers. The modules are
    checked against independent oracles in float64 elsewhere (nn.MultiheadAttention in
    test_heads, nn.TransformerEncoderLayer in test_layer, nn.LayerNorm/nn.RMSNorm in test_norms)."""
    return f64(component)(*args)


class Decoding(torch.nn.Module):
    """Runs an attention module, layer or stack over x (B, T, d_model) in pieces of 3, 1 and 2
    positions with a KV cache, each piece with its bottom-right causal mask; returns the outputs
    of every position. Its reference is one causal call without a cache (:func:`full_causal`)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        cache = self.model.new_cache() if hasattr(self.model, "new_cache") else heads.KVCache()
        outs, start = [], 0
        for n in (3, 1, 2):
            mask = masks.causal_mask(n, start + n)
            outs.append(self.model(x[:, start:start + n], mask=mask, cache=cache))
            start += n
        for c in cache if isinstance(cache, list) else [cache]:
            assert c.K.dtype == x.dtype and len(c) == start  # the cache keeps the dtype
        return torch.cat(outs, dim=1)  # (B, T, d_model)


class CachedChars(torch.nn.Module):
    """The capstone model run over ids (B, T) in pieces of 3, 1 and 2 positions with its KV caches;
    its reference is one call without a cache."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        caches, outs, start = self.model.new_caches(), [], 0
        for n in (3, 1, 2):
            outs.append(self.model(ids[:, start:start + n], caches))
            start += n
        return torch.cat(outs, dim=1)  # (B, T, n_vocab)


def full_causal(decoding, args):
    """Reference of a Decoding case: the float64 model over the whole sequence, no cache."""
    x, = args
    return f64(decoding.model)(x, mask=masks.causal_mask(x.shape[1]))


# Inputs of the attention-based cases: B = 2 sequences of T = 6, d_model = 32.
D_MODEL, T = 32, 6


def mha_inputs(dtype):
    return cast((randn(2, T, D_MODEL),), dtype)


def fully_masked_padding(dtype):
    """x and a key padding mask where the second sequence has no real token: every one of its
    query rows is fully masked."""
    x, = mha_inputs(dtype)
    return x, masks.padding_mask([4, 0], T)


def mha_args(dtype, causal=False, padding=False):
    """Arguments of MultiHeadAttention.forward: x, x_kv, mask, key_padding_mask."""
    x, kpm = fully_masked_padding(dtype)
    return x, None, masks.causal_mask(T) if causal else None, kpm if padding else None


def close_large_scores(dtype):
    """Q, K, V for scores near 100 within a few units of each other (every key matters), on the
    grid of 1/8 so that the dtypes hold Q, K exactly and float32 holds Q K^T / sqrt(d_k)
    exactly (d_k = 16). A 16-bit score there is off by up to 1/16 (float16) or 1/4 (bfloat16)."""
    Q = grid(2, 5, 16, lo=-4, hi=4, shift=5.0)  # entries 4.5 .. 5.5
    K = grid(2, 7, 16, lo=-4, hi=4, shift=5.0)
    V = randn(2, 7, 16)
    return cast((Q, K, V), dtype)


# ----------------------------------------------------------------------------- the table
# Trailing comments: the measured worst ratio, float32 / float16 / bfloat16 (module docstring).

CASES = [
    # softmax.py (lesson 01): computed in float32 for 16-bit inputs, rounded once.
    # measured 1.69 / 0.39 / 0.38
    Case("softmax", lambda dt: softmax.softmax, lambda dt: cast((randn(4, 2, 33, scale=3),), dt),
         lambda f, a: softmax.softmax_np(a[0].numpy()), C=1, C_f32=4),
    # measured 1.81 / 0.36 / 0.33
    Case("softmax temperature 0.7", lambda dt: lambda x: softmax.softmax(x, temperature=0.7),
         lambda dt: cast((randn(4, 33, scale=3),), dt),
         lambda f, a: softmax.softmax_np(a[0].numpy(), temperature=0.7), C=1, C_f32=4),
    # Hard: logits near 30,000 over temperature 0.4: x / tau overflows float16 (75,000 > 65,504).
    # measured 0.88 / 0.08 / 0.32
    Case("softmax large logits, tau 0.4",
         lambda dt: lambda x: softmax.softmax(x, temperature=0.4),
         lambda dt: cast((randn(4, 33, scale=40, shift=3e4),), dt),
         lambda f, a: softmax.softmax_np(a[0].numpy(), temperature=0.4), C=1, C_f32=2),
    # Hard: logits near 30,000 over temperature 30: x / tau = 1,000 is rounded by up to 2 in
    # bfloat16 (0.25 in float16) before the shift, where x - max(x) is exact.
    # measured 2.18 / 0.26 / 0.25
    Case("softmax large logits, tau 30",
         lambda dt: lambda x: softmax.softmax(x, temperature=30.0),
         lambda dt: cast((randn(4, 33, scale=300, shift=3e4),), dt),
         lambda f, a: softmax.softmax_np(a[0].numpy(), temperature=30.0), C=1, C_f32=5),
    # measured 0.87 / 0.45 / 0.47
    Case("log_softmax", lambda dt: softmax.log_softmax,
         lambda dt: cast((randn(4, 2, 33, scale=3),), dt),
         lambda f, a: softmax.log_softmax_np(a[0].numpy()), C=1, C_f32=2),
    # measured 0.74 / 0.41 / 0.38
    Case("log_softmax large logits, tau 30",
         lambda dt: lambda x: softmax.log_softmax(x, temperature=30.0),
         lambda dt: cast((randn(4, 33, scale=300, shift=3e4),), dt),
         lambda f, a: softmax.log_softmax_np(a[0].numpy(), temperature=30.0), C=1, C_f32=2),
    # measured 18.64 / 0.42 / 0.35
    Case("softmax_jacobian", lambda dt: softmax.softmax_jacobian,
         lambda dt: cast((randn(3, 9, scale=3),), dt),
         lambda f, a: softmax.softmax_jacobian_np(a[0].numpy()), C=1, C_f32=40),
    # measured 1.22 / 0.35 / 0.39
    Case("entropy", lambda dt: softmax.entropy,
         lambda dt: cast((torch.softmax(randn(3, 9, scale=2), -1),), dt),
         lambda f, a: softmax.entropy_np(a[0].numpy()), C=1, C_f32=3),
    # measured 1.24 / 0.45 / 0.44
    Case("scaled_scores", lambda dt: softmax.scaled_scores,
         lambda dt: cast((randn(2, 5, 16), randn(2, 7, 16)), dt),
         lambda f, a: softmax.scaled_scores_np(a[0].numpy(), a[1].numpy()), C=1, C_f32=3),
    # the backward pass: <s, g> summed in float32, rounded once; in float32 g - <s, g> cancels
    # where g is close to its mean (measured 7.98 / 0.49 / 0.41)
    Case("softmax_vjp", lambda dt: softmax.softmax_vjp,
         lambda dt: cast((torch.softmax(randn(4, 33, scale=3), -1), randn(4, 33)), dt),
         lambda f, a: softmax.softmax_vjp_np(a[0].numpy(), a[1].numpy()), C=1, C_f32=16),

    # masks.py (lesson 02): to_additive's 0 and -inf are exact in every dtype.
    Case("to_additive", lambda dt: lambda m: masks.to_additive(m, dt),
         lambda dt: (masks.causal_mask(4, 6),),
         lambda f, a: masks.to_additive(a[0], torch.float64), C=0, C_f32=0),

    # attention.py (lesson 02): scores, softmax and the weighted sum in float32, rounded once.
    # measured 0.89 / 0.25 / 0.25
    Case("masked_softmax, fully masked rows",
         lambda dt: attention.masked_softmax,
         lambda dt: cast((randn(2, 7, 5, scale=3), masks.causal_mask(7, 5)), dt),
         lambda f, a: attention.masked_softmax_np(a[0].numpy(), a[1].numpy()), C=1, C_f32=2),
    # measured 0.96 / 0.43 / 0.44
    Case("attention, causal and fully masked rows",
         lambda dt: attention.scaled_dot_product_attention,
         lambda dt: cast((randn(2, 7, 16), randn(2, 5, 16), randn(2, 5, 16),
                          masks.causal_mask(7, 5)), dt),
         lambda f, a: attention.attention_np(*(t.numpy() for t in a)), C=1, C_f32=2),
    # measured 2.02 / 0.47 / 0.49
    Case("attention, large close scores", lambda dt: attention.scaled_dot_product_attention,
         close_large_scores, lambda f, a: attention.attention_np(*(t.numpy() for t in a)), C=1, C_f32=5),
    # measured 1.54 / 0.48 / 0.45
    Case("attention weights, large close scores",
         lambda dt: lambda Q, K, V: attention.scaled_dot_product_attention(
             Q, K, V, return_weights=True)[1],
         close_large_scores,
         lambda f, a: attention.attention_np(*(t.numpy() for t in a), return_weights=True)[1],
         C=1, C_f32=4),
    # the backward pass (dQ, dK, dV), computed in float32 for 16-bit inputs and rounded once
    # (measured up to 3.10 / 0.44 / 0.47)
    *[Case(f"attention_backward {name}, causal and fully masked rows",
           lambda dt, i=i: lambda Q, K, V, dO, m: attention.attention_backward(Q, K, V, dO, m)[i],
           lambda dt: cast((randn(2, 7, 16), randn(2, 5, 16), randn(2, 5, 8), randn(2, 7, 8),
                            masks.causal_mask(7, 5)), dt),
           lambda f, a, i=i: attention.attention_backward_np(*(t.numpy() for t in a))[i],
           C=1, C_f32=7)
      for i, name in enumerate(("dQ", "dK", "dV"))],

    # heads.py (lesson 03): projections in the dtype, attention in float32.
    # measured 2.81 / 0.62 / 0.61
    Case("MultiHeadAttention, causal", module(lambda: heads.MultiHeadAttention(D_MODEL, 4)),
         lambda dt: mha_args(dt, causal=True), same_module_in_float64, C=2, C_f32=6),
    # measured 3.12 / 0.81 / 0.74
    Case("MultiHeadAttention GQA, fully masked rows",
         module(lambda: heads.MultiHeadAttention(D_MODEL, 4, n_kv_heads=2)),
         lambda dt: mha_args(dt, padding=True), same_module_in_float64, C=2, C_f32=7),
    # measured 3.03 / 0.70 / 0.64
    Case("MultiHeadAttention GQA, KV cache decoding",
         module(lambda: Decoding(heads.MultiHeadAttention(D_MODEL, 4, n_kv_heads=2))),
         mha_inputs, full_causal, C=2, C_f32=7),
    # measured 3.33 / 0.63 / 0.62
    Case("MultiHeadAttention, fused SDPA path",
         module(lambda: heads.MultiHeadAttention(D_MODEL, 4, use_sdpa=True)),
         lambda dt: mha_args(dt, causal=True, padding=True), same_module_in_float64, C=2, C_f32=7),

    # positional.py (lesson 04): angles in float64, rotation in float32, rounded once
    # (measured up to 0.87 / 0.47 / 0.39).
    *[Case(f"apply_rope {pairing}", lambda dt, p=pairing: lambda x: positional.apply_rope(x, pairing=p),
           lambda dt: cast((randn(2, 3, 8, 32),), dt),
           lambda f, a, p=pairing: positional.apply_rope_np(a[0].numpy(), pairing=p), C=1, C_f32=2)
      for pairing in positional.PAIRINGS],
    *[Case(f"apply_rope {pairing}, long positions",
           lambda dt, p=pairing: lambda x: positional.apply_rope(x, LONG_POSITIONS, pairing=p),
           lambda dt: cast((randn(2, len(LONG_POSITIONS), 32),), dt),
           lambda f, a, p=pairing: positional.apply_rope_np(a[0].numpy(), LONG_POSITIONS, p),
           C=1, C_f32=2)
      for pairing in positional.PAIRINGS],
    # measured 0.25 / 0.25 / 0.25
    Case("sinusoidal_encoding, positions 0 to 4095",
         lambda dt: lambda: positional.sinusoidal_encoding(4096, 16, dtype=dt), lambda dt: (),
         lambda f, a: positional.sinusoidal_encoding_np(4096, 16), C=1, C_f32=1),
    # ALiBi's bias at distances up to 4095 (-2047.5 for the first head: bfloat16 numbers are 8
    # apart there) and RoPE at interpolated (fractional) long positions: float64, rounded once.
    Case("alibi_bias, 8 heads, last 4 of 4096 positions",
         lambda dt: lambda: positional.alibi_bias(8, 4, 4096, dtype=dt), lambda dt: (),
         lambda f, a: positional.alibi_bias_np(8, 4, 4096), C=1, C_f32=1),
    Case("apply_rope, interpolated long positions",
         lambda dt: lambda x: positional.apply_rope(
             x, positional.interpolate_positions(LONG_POSITIONS, 2048, 8192)),
         lambda dt: cast((randn(2, len(LONG_POSITIONS), 32),), dt),
         lambda f, a: positional.apply_rope_np(
             a[0].numpy(), positional.interpolate_positions_np(LONG_POSITIONS, 2048, 8192)),
         C=1, C_f32=2),
    Case("LearnedPositionalEmbedding", module(lambda: positional.LearnedPositionalEmbedding(64, 16)),
         lambda dt: (torch.tensor([0, 5, 63, 7]),), same_module_in_float64, C=0, C_f32=0),

    # ffn.py (lesson 05): activations in float32, rounded once, checked element by element.
    *[Case(f"{name} elementwise", lambda dt, fn=fn: fn,
           lambda dt: cast(((torch.rand(400, dtype=torch.float64) - 0.5) * 16,), dt),
           lambda f, a, ref=ref: ref(a[0].numpy()), C=1, C_f32=c32, elementwise=True)
      for name, fn, ref, c32 in [("gelu", ffn.gelu, ffn.gelu_np, 64),
                                 ("silu", ffn.silu, ffn.silu_np, 3),
                                 ("gelu_tanh", lambda x: ffn.gelu(x, "tanh"),
                                  lambda x: ffn.gelu_np(x, "tanh"), 88)]],
    # The module rounds its hidden layer to the dtype (measured up to 3.8 / 0.88 / 0.91).
    *[Case(f"FeedForward {act}", module(lambda act=act: ffn.FeedForward(D_MODEL, 64, act)),
           lambda dt: cast((randn(2, T, D_MODEL),), dt), same_module_in_float64, C=2, C_f32=8)
      for act in ffn.ACTIVATIONS],

    # norms.py (lesson 06): statistics in float32, rounded once (measured up to 1.6 / 0.46 / 0.46).
    *[Case(f"{Norm.__name__} {label}", module(lambda Norm=Norm: _with_affine(Norm(32))),
           lambda dt, s=s: cast((randn(3, 5, 32, scale=s),), dt), same_module_in_float64, C=1, C_f32=4)
      for Norm in (norms.LayerNorm, norms.RMSNorm)
      for label, s in [("ordinary", 1.0),
                       ("large inputs (squares overflow float16)", 300.0),
                       ("tiny inputs (squares underflow float16)", 3e-3)]],
    # the backward passes (dx, dgamma), statistics and sums in float32, rounded once
    # (measured up to 2.16 / 0.48 / 0.47)
    *[Case(f"{fn.__name__} {what}, {label}",
           lambda dt, fn=fn, i=i: lambda x, g, dy: fn(x, g, dy)[i],
           lambda dt, s=s: cast((randn(3, 5, 32, scale=s, shift=s), 1 + 0.1 * randn(32),
                                 randn(3, 5, 32)), dt),
           lambda f, a, ref=ref, i=i: ref(*(t.numpy() for t in a))[i], C=1, C_f32=5)
      for fn, ref in ((norms.layer_norm_backward, norms.layer_norm_backward_np),
                      (norms.rms_norm_backward, norms.rms_norm_backward_np))
      for i, what in enumerate(("dx", "dgamma"))
      for label, s in [("ordinary", 1.0), ("large inputs", 300.0)]],

    # layer.py (lesson 07): each rounding of the residual stream is amplified by the norm after it.
    # measured 1.91 / 1.19 / 1.01
    Case("TransformerLayer post-LN, causal",
         module(lambda: layer.TransformerLayer(D_MODEL, 4, 64)),
         lambda dt: (*mha_inputs(dt), masks.causal_mask(T)), same_module_in_float64, C=3, C_f32=4),
    # measured 1.97 / 0.91 / 0.74
    Case("TransformerLayer pre-LN GELU, fully masked rows",
         module(lambda: layer.TransformerLayer(D_MODEL, 4, 64, activation="gelu", norm_first=True)),
         lambda dt: (lambda x, kpm: (x, None, kpm))(*fully_masked_padding(dt)),
         same_module_in_float64, C=2, C_f32=4),
    # measured 2.24 / 0.92 / 1.10
    Case("TransformerLayer GQA SwiGLU, KV cache decoding",
         module(lambda: Decoding(layer.TransformerLayer(D_MODEL, 4, 64, n_kv_heads=2,
                                                        activation="swiglu", norm_first=True))),
         mha_inputs, full_causal, C=3, C_f32=5),
    # measured 2.65 / 1.26 / 1.14
    Case("TransformerStack pre-LN, final norm, KV cache decoding",
         module(lambda: Decoding(layer.TransformerStack(2, D_MODEL, 4, 64, final_norm=True,
                                                        norm_first=True))),
         mha_inputs, full_causal, C=3, C_f32=6),
    # measured 0.63 / 0.42 / 0.39
    Case("TokenEmbedding sinusoidal, scaled, start 3000",
         module(lambda: layer.TokenEmbedding(50, D_MODEL, scale=True)),
         lambda dt: (torch.randint(0, 50, (2, T)), 3000), same_module_in_float64, C=1, C_f32=2),
    # measured 0.43 / 0.48 / 0.43
    Case("TokenEmbedding learned", module(lambda: layer.TokenEmbedding(50, D_MODEL, "learned", 16)),
         lambda dt: (torch.randint(0, 50, (2, T)), 4), same_module_in_float64, C=1, C_f32=1),
    # measured 1.72 / 0.67 / 0.61
    Case("OutputHead with bias", module(lambda: _with_bias(layer.OutputHead(D_MODEL, 50, bias=True))),
         lambda dt: cast((randn(2, T, D_MODEL),), dt), same_module_in_float64, C=2, C_f32=4),

    # models/char_lm.py (lesson 09): the whole model, tied head, and with a KV cache.
    # measured (30 seeds) 5.33 / 1.78 / 1.52, the same with the cache
    Case("CharTransformer logits", module(lambda: CharTransformer(40, D_MODEL, 4, 2, 64, 16)),
         lambda dt: (torch.randint(0, 40, (2, T)),), same_module_in_float64, C=4, C_f32=11),
    Case("CharTransformer, KV cache decoding",
         module(lambda: CachedChars(CharTransformer(40, D_MODEL, 4, 2, 64, 16))),
         lambda dt: (torch.randint(0, 40, (2, T)),),
         lambda m, a: f64(m.model)(*a), C=4, C_f32=11),

    # models/llama.py (lesson 10): RMSNorm, RoPE, GQA, SwiGLU, tied head; with its KV caches.
    # measured (30 seeds) 4.29 / 2.12 / 1.70, the same with the caches
    *[Case(f"LlamaDecoder, {label}",
           module(lambda wrap=wrap: wrap(LlamaDecoder(LlamaConfig(n_vocab=40, d_model=D_MODEL,
                                                                  n_layers=2, n_heads=4,
                                                                  n_kv_heads=2, d_ff=64)))),
           lambda dt: (torch.randint(0, 40, (2, T)),),
           (lambda m, a: f64(m.model)(*a)) if wrap is CachedChars else same_module_in_float64,
           C=C, C_f32=C_f32)
      for label, wrap, C, C_f32 in [("logits", lambda m: m, 5, 9),
                                    ("KV cache decoding", CachedChars, 5, 9)]],

    # flash_attention.py (lesson 08): scores and the online-softmax state in float32, rounded once.
    # measured 1.13 / 0.43 / 0.44
    Case("tiled_attention, causal and fully masked rows",
         lambda dt: lambda Q, K, V, m: flash_attention.tiled_attention(Q, K, V, m, block_size=3),
         lambda dt: cast((randn(2, 7, 16), randn(2, 5, 16), randn(2, 5, 16),
                          masks.causal_mask(7, 5)), dt),
         lambda f, a: attention.attention_np(*(t.numpy() for t in a)), C=1, C_f32=3),
    # measured 1.97 / 0.47 / 0.49
    Case("tiled_attention, large close scores",
         lambda dt: lambda Q, K, V: flash_attention.tiled_attention(Q, K, V, block_size=3),
         close_large_scores, lambda f, a: attention.attention_np(*(t.numpy() for t in a)), C=1, C_f32=4),

    # flash_attention.py (lesson 08): the same online-softmax state in float32, inside the
    # autograd Function (measured up to 1.42 / 0.40 / 0.40)
    Case("flash_attention, causal and fully masked rows",
         lambda dt: lambda Q, K, V, m: flash_attention.flash_attention(Q, K, V, m, block_size=3),
         lambda dt: cast((randn(2, 7, 16), randn(2, 5, 16), randn(2, 5, 16),
                          masks.causal_mask(7, 5)), dt),
         lambda f, a: attention.attention_np(*(t.numpy() for t in a)), C=1, C_f32=3),
    Case("flash_attention, large close scores, causal=True",
         lambda dt: lambda Q, K, V: flash_attention.flash_attention(Q, K, V, block_size=3, causal=True),
         close_large_scores,
         lambda f, a: attention.attention_np(*(t.numpy() for t in a), masks.causal_mask(5, 7).numpy()),
         C=1, C_f32=4),
]

# Long positions for RoPE, including the issue's 1001, 1857 and 3001; 65,519 is past float16's
# 65,504 (a position that float16 cannot even hold as a number; float64 angles can).
LONG_POSITIONS = [1001, 1857, 3001, 8191, 20011, 65519]


def _with_affine(norm):
    """A norm with gamma and beta away from 1 and 0, so that a dropped parameter shows."""
    with torch.no_grad():
        norm.gamma.copy_(1 + 0.1 * torch.randn(norm.gamma.shape))
        if hasattr(norm, "beta"):
            norm.beta.copy_(0.1 * torch.randn(norm.beta.shape))
    return norm


def _with_bias(head):
    with torch.no_grad():
        head.b_U.copy_(torch.randn(head.b_U.shape))
    return head


# ----------------------------------------------------------------------------- the measurement

def measure(case: Case, dtype: torch.dtype, seed: int = 0) -> float:
    """err / (eps(dtype) * scale) for one case, dtype and seed; also checks dtype and shape."""
    torch.manual_seed(seed)
    component = case.build(dtype)
    args = case.inputs(dtype)
    got = component(*args)
    args64 = cast(args, torch.float64)
    with torch.no_grad():
        ref = torch.as_tensor(case.reference(component, args64), dtype=torch.float64)
    assert got.dtype == dtype, f"{case.name}: returned {got.dtype} for {dtype} inputs"
    assert got.shape == ref.shape, f"{case.name}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    got = got.detach().double()
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(got), finite), f"{case.name}: inf/NaN where ref has none"
    assert torch.equal(got[~finite], ref[~finite]), f"{case.name}: wrong infinities"
    # exact zeros stay exact: masked weights, fully masked rows, an underflowed exp
    assert (got[ref == 0] == 0).all(), f"{case.name}: nonzero where the reference is exactly 0"
    err = (got - ref)[finite].abs()
    if case.elementwise:  # below the smallest normal number, an absolute error of C * tiny
        scale = ref[finite].abs().clamp_min(torch.finfo(dtype).tiny / torch.finfo(dtype).eps)
    else:
        scale = ref[finite].abs().max().clamp_min(torch.finfo(dtype).tiny)
    return float((err / scale).max()) / torch.finfo(dtype).eps if err.numel() else 0.0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_component_against_float64(case, dtype):
    ratio = measure(case, dtype)
    assert ratio <= case.tolerance(dtype), (f"{case.name} in {dtype}: error {ratio:.3g} eps x "
                                            f"scale, allowed {case.tolerance(dtype)}")


def test_case_names_are_unique():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))


# ----------------------------------------------------------------------------- golden values
# The numbers (issue 14), computed with the old code, which rounded the angles to the
# input's dtype and computed the norms' statistics in it. Right values from float64.

def _e(i, d):
    x = torch.zeros(1, d)
    x[0, i] = 1.0
    return x


def test_rope_bfloat16_position_1857_golden():
    got = positional.apply_rope(_e(2, 32).bfloat16(), [1857])[0, 2:4].double()
    right = torch.tensor([0.306693, 0.951809], dtype=torch.float64)  # (cos, sin)(1857 theta_1)
    # the old code gave [0.2754, -0.9609]; bfloat16 numbers in [0.25, 1) are at most 2^-8
    # apart, so rounding costs at most 2^-9, and the 6 decimals 5e-7 more
    torch.testing.assert_close(got, right, rtol=0, atol=2 ** -9 + 5e-7)
    torch.testing.assert_close(right, torch.tensor(positional.apply_rope_np(
        _e(2, 32).numpy(), [1857])[0, 2:4]), rtol=0, atol=1e-6)


def test_rope_bfloat16_position_1001_golden():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    right = torch.tensor(positional.apply_rope_np(x.numpy(), [1001]))
    torch.testing.assert_close(right, torch.tensor([[-2.231922, 0.136110, -0.291230, -4.991511]],
                                                   dtype=torch.float64), rtol=0, atol=1e-6)
    err = (positional.apply_rope(x.bfloat16(), [1001]).double() - right).abs().max()
    rounding = (right.bfloat16().double() - right).abs().max()  # the 0.0085
    assert abs(float(rounding) - 0.0085) < 5e-5
    assert err <= rounding  # the old code: 1.82


def test_rope_float16_position_3001_golden():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    got = positional.apply_rope(x.half(), [3001]).double()
    right = torch.tensor([[0.694, -2.126, 4.438, -2.303]], dtype=torch.float64)
    # old: [-1.414, -1.732, 4.449, -2.277]; the right values to 3 decimals, float16 spacing 2^-8
    torch.testing.assert_close(got, right, rtol=0, atol=2 ** -9 + 5e-4)


def test_rms_norm_float16_golden():
    got = norms.rms_norm(torch.tensor([300.0, 400.0]).half())
    assert got.dtype == torch.float16
    # old: [0, 0]; right 300/sqrt(125000), 400/sqrt(125000)
    torch.testing.assert_close(got.double(), torch.tensor([0.848528, 1.131371], dtype=torch.float64),
                               rtol=2 ** -11, atol=1e-6)
    layer_out = norms.RMSNorm(2).half()(torch.tensor([300.0, 400.0]).half())
    torch.testing.assert_close(layer_out, got, rtol=0, atol=0)


def test_layer_norm_float16_golden():
    x = torch.tensor([1000.0, -1000.0, 1000.0, -1000.0]).half()
    got = norms.layer_norm(x)
    assert got.dtype == torch.float16
    # old: zeros (the variance 10^6 overflows float16); eps = 1e-5 moves the result by 5e-12
    torch.testing.assert_close(got.double(), torch.tensor([1.0, -1.0, 1.0, -1.0],
                                                          dtype=torch.float64), rtol=0, atol=0)
    torch.testing.assert_close(norms.LayerNorm(4).half()(x), got, rtol=0, atol=0)


def test_rope_keeps_relative_positions_in_bfloat16():
    """The documented promise: <R_m q, R_n k> depends only on m - n, at long positions too."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 32, generator=g).bfloat16(), torch.randn(1, 32, generator=g).bfloat16()
    dots = [float((positional.apply_rope(q, [m + 7]).double()
                   * positional.apply_rope(k, [m]).double()).sum()) for m in (0, 1850, 3000, 20000)]
    scale = float(q.double().norm() * k.double().norm())
    # each rotated vector is rounded to bfloat16 once: relative error <= 2^-8 each
    assert max(dots) - min(dots) <= 2 * 2 ** -8 * scale, dots


# ----------------------------------------------------------------------------- the rule itself

def test_compute_dtype_rule():
    assert compute_dtype(torch.float16) == compute_dtype(torch.bfloat16) == torch.float32
    assert compute_dtype(torch.float32) == torch.float32
    assert compute_dtype(torch.float64) == torch.float64
    x = torch.zeros(3)
    assert upcast(x) is x  # float32 is not copied
    with pytest.raises(ValueError, match="floating-point dtype, got torch.int64"):
        compute_dtype(torch.int64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [64, 8192])
def test_cpu_half_matmul_accumulates_in_float32(dtype, n):
    """Why the components leave matrix products in the input's dtype (txlearn.precision): on
    this CPU build the product of 16-bit matrices is accumulated in float32 and rounded once,
    so its error is below 0.5 eps of sum |a_i b_i| (a 16-bit accumulator would lose everything
    past 2,048 terms in float16, 256 in bfloat16)."""
    g = torch.Generator().manual_seed(n)
    a = torch.randn(4, n, generator=g).to(dtype)
    b = torch.randn(n, 3, generator=g).to(dtype)
    exact = a.double() @ b.double()
    bound = a.double().abs() @ b.double().abs()
    ratio = ((a @ b).double() - exact).abs() / bound / torch.finfo(dtype).eps
    assert ratio.max() <= 0.5
    ones = torch.ones(1, 4096, dtype=dtype)
    assert float(ones @ ones.T) == 4096.0  # exact; a float16 running sum would stop at 2,048


def test_kv_cache_refuses_another_dtype():
    cache = heads.KVCache()
    cache.append(torch.zeros(1, 2, 3, 4, dtype=torch.bfloat16),
                 torch.zeros(1, 2, 3, 4, dtype=torch.bfloat16))
    assert cache.nbytes() == 2 * 24 * 2  # K and V, 24 numbers each, 2 bytes each
    with pytest.raises(ValueError, match="dtype torch.float32, torch.float32 do not match the "
                                         "cache's torch.bfloat16"):
        cache.append(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))


def test_modules_name_a_dtype_mismatch():
    x = torch.zeros(1, 2, D_MODEL)
    for m, call in [(heads.MultiHeadAttention(D_MODEL, 4), lambda m: m(x)),
                    (ffn.FeedForward(D_MODEL), lambda m: m(x)),
                    (layer.OutputHead(D_MODEL, 5), lambda m: m(x)),
                    (layer.TransformerLayer(D_MODEL, 4, 64), lambda m: m(x))]:
        with pytest.raises(ValueError, match="dtype torch.float32 but the"):
            call(m.to(torch.bfloat16))
    with pytest.raises(ValueError, match="Q torch.float16, K torch.float32"):
        attention.scaled_dot_product_attention(x.half(), x, x)


# ----------------------------------------------------------------------------- the C table

if __name__ == "__main__":  # python tests/test_precision.py [n_seeds]: the worst ratio per case
    n_seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 50

    def worst_ratio(case, dtype):
        try:
            return max(measure(case, dtype, seed) for seed in range(n_seeds))
        except AssertionError:  # a wrong dtype, shape, inf or NaN
            return math.inf

    for case in CASES:
        worst = {dt: worst_ratio(case, dt) for dt in DTYPES}
        row = "  ".join(f"{str(dt)[6:]} {w:5.2f}/{case.tolerance(dt):<2g}" for dt, w in worst.items())
        over = any(w > case.tolerance(dt) for dt, w in worst.items())
        print(f"{case.name:<55} {row}" + ("  EXCEEDS C" if over else ""))
