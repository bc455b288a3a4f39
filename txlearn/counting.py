"""Lesson 08: what a transformer layer costs, counted and measured.

Four parts, in the order of the lesson:

1. **Counting.** Parameters and forward FLOPs of one layer, itemised per component, plus the
   closed forms they must agree with; the encoder-decoder model of the paper; memory of
   activations and of the attention matrix (the KV cache's is ``txlearn.heads.kv_cache_bytes``). FLOPs are ``2 x multiply-accumulates``
   of the matrix products; element-wise work (softmax, norms, activations, bias adds) is of lower
   order and is *not* counted (stated in each docstring).
2. **Measuring.** Wall time (fastest of repeats, ``time.perf_counter``) and peak memory of a
   callable (the PyTorch profiler's memory events, which see PyTorch's own CPU allocations; the
   standard library's ``tracemalloc`` does not), over a range of T or d, with log-log slopes.
3. **A recurrent layer** (Elman RNN), the sequential baseline of the paper's Table 1.
4. **Tiled attention with an online softmax** (NumPy and PyTorch): keys are processed in blocks,
   each query keeps a running max ``m``, a running sum ``l`` and an unnormalised output ``acc``;
   the ``(T, T)`` matrix is never formed, so peak memory grows linearly in T.

Conventions of the course (``DESIGN.md``): boolean masks are True = may attend; a query whose
keys are all masked gets output 0; T is the sequence length, d_k = d_model / n_heads.
Source: Vaswani et al. 2017, "Attention is all you need", section 4 and Table 1 (complexity),
Table 3 (model sizes); Milakov & Gimelshein 2018 and Dao et al. 2022 (online softmax, tiling).
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
import time
from typing import Callable, Iterable

import numpy as np
import torch

from txlearn.precision import compute_dtype

__all__ = [
    "layer_param_counts",
    "layer_param_count",
    "layer_param_closed_form",
    "stack_param_counts",
    "paper_transformer_param_counts",
    "visible_pairs",
    "layer_flops",
    "attention_flops",
    "ffn_flop_share",
    "ffn_param_share",
    "MODEL_SIZES",
    "activation_bytes",
    "attention_matrix_bytes",
    "format_table",
    "time_callable",
    "peak_memory_bytes",
    "measure",
    "fit_loglog_slope",
    "recurrent_layer",
    "matmul_path_length",
    "online_softmax_update_np",
    "online_softmax_update",
    "tiled_attention_np",
    "tiled_attention",
]


# --------------------------------------------------------------------------------------------
# 1. Counting
# --------------------------------------------------------------------------------------------

def _check_heads(d_model: int, n_heads: int, n_kv_heads: int | None) -> tuple[int, int]:
    """Return (d_k, n_kv_heads); raise ValueError when the widths do not divide."""
    if d_model <= 0 or n_heads <= 0:
        raise ValueError(f"d_model ({d_model}) and n_heads ({n_heads}) must be positive")
    if d_model % n_heads:
        raise ValueError(f"d_model ({d_model}) is not divisible by n_heads ({n_heads})")
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    if n_kv_heads <= 0 or n_heads % n_kv_heads:
        raise ValueError(f"n_heads ({n_heads}) is not divisible by n_kv_heads ({n_kv_heads})")
    return d_model // n_heads, n_kv_heads


def layer_param_counts(*, d_model: int, n_heads: int, d_ff: int, n_kv_heads: int | None = None,
                       bias: bool = True, activation: str = "relu",
                       norm: str = "layer") -> dict[str, int]:
    """Parameters of one transformer layer, itemised per component: the course's one counter.

    Every size is keyword-only (``layer_param_counts(d_model=512, n_heads=8, d_ff=2048)``), so a
    call with the sizes in another order cannot pass silently (it raises TypeError).

    Attention: ``W_Q, W_O (d_model, d_model)``; ``W_K, W_V (d_model, n_kv_heads * d_k)``; biases
    of the same widths. FFN: ``W_1 (d_model, d_ff)``, ``W_2 (d_ff, d_model)`` (SwiGLU adds the gate
    ``W_3 (d_model, d_ff)``), biases ``b_1 (d_ff)``, ``b_2 (d_model)``. Two norms: LayerNorm has
    ``gamma, beta (d_model)``, RMSNorm ``gamma`` only. Matches ``txlearn.layer.TransformerLayer``
    and ``torch.nn.TransformerEncoderLayer`` (tests/test_complexity.py, tests/test_layer.py).

    Args:
        d_model, n_heads, d_ff, n_kv_heads: widths (``n_kv_heads=None`` means ``n_heads``).
        bias: whether the linear maps have biases (the norms keep theirs).
        activation: ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` or ``"swiglu"``.
        norm: ``"layer"`` or ``"rms"``.

    Returns:
        ``{component: number of parameters}`` (ints), in the order of the forward pass.

    Raises:
        ValueError: d_model not divisible by n_heads, n_heads not by n_kv_heads, an unknown
            activation or norm.

    Source: lesson 08; Vaswani et al. 2017, section 3.
    """
    d_k, n_kv_heads = _check_heads(d_model, n_heads, n_kv_heads)
    if d_ff <= 0:
        raise ValueError(f"d_ff ({d_ff}) must be positive")
    if activation not in ("relu", "gelu", "gelu_tanh", "swiglu"):
        raise ValueError(f"unknown activation {activation!r}")
    if norm not in ("layer", "rms"):
        raise ValueError(f"unknown norm {norm!r}: use 'layer' or 'rms'")
    d_kv = n_kv_heads * d_k
    per_norm = 2 * d_model if norm == "layer" else d_model
    counts = {
        "attention W_Q": d_model * d_model,
        "attention W_K": d_model * d_kv,
        "attention W_V": d_model * d_kv,
        "attention W_O": d_model * d_model,
        "attention biases": (2 * d_model + 2 * d_kv) if bias else 0,
        "norm1": per_norm,
        "FFN W_1": d_model * d_ff,
        "FFN W_2": d_ff * d_model,
        "FFN biases": (d_ff + d_model) if bias else 0,
        "norm2": per_norm,
    }
    if activation == "swiglu":
        counts["FFN W_3 (gate)"] = d_model * d_ff
        counts["FFN biases"] += d_ff if bias else 0
    return counts


def layer_param_count(**sizes) -> int:
    """Total parameters of one layer: ``sum(layer_param_counts(**sizes).values())`` (see there;
    keyword arguments only)."""
    return sum(layer_param_counts(**sizes).values())


def layer_param_closed_form(*, d_model: int, d_ff: int | None = None) -> int:
    """The closed form for a standard MHA + ReLU/GELU layer with biases and two LayerNorms.

    ``4 d^2 + 4 d`` (attention) ``+ 2 d d_ff + d_ff + d`` (FFN) ``+ 4 d`` (norms); at
    ``d_ff = 4 d`` this is ``12 d^2 + 13 d``. Returns an int (parameters). Raises ValueError for
    non-positive widths. Source: lesson 08.
    """
    d_ff = 4 * d_model if d_ff is None else d_ff
    if d_model <= 0 or d_ff <= 0:
        raise ValueError(f"d_model ({d_model}) and d_ff ({d_ff}) must be positive")
    return 4 * d_model**2 + 4 * d_model + 2 * d_model * d_ff + d_ff + d_model + 4 * d_model


def stack_param_counts(*, n_layers: int, d_model: int, n_heads: int, d_ff: int, n_vocab: int,
                       tied: bool = True, final_norm: bool = False, max_len: int = 0,
                       head_bias: bool = False, **layer_options) -> dict[str, int]:
    """Parameters of an embedding, ``n_layers`` layers and an output head (one stack, e.g. a
    decoder-only LM).

    Sizes are keyword-only. Rows: ``token embedding W_E (n_vocab, d_model)``, ``learned positions (max_len, d_model)``
    (0 for sinusoidal), ``layers`` (N times :func:`layer_param_count`), ``final norm``,
    ``output head`` (0 when tied to ``W_E``; else ``W_U (d_model, n_vocab)`` and an optional
    bias). Returns ``{component: int}``. Raises ValueError when ``n_layers < 1`` or
    ``n_vocab < 1`` (and as :func:`layer_param_counts`). Source: lesson 08.
    """
    if n_layers < 1 or n_vocab < 1:
        raise ValueError(f"n_layers ({n_layers}) and n_vocab ({n_vocab}) must be >= 1")
    per_norm = 2 * d_model if layer_options.get("norm", "layer") == "layer" else d_model
    return {
        "token embedding": n_vocab * d_model,
        "learned positions": max_len * d_model,
        "layers": n_layers * layer_param_count(d_model=d_model, n_heads=n_heads, d_ff=d_ff,
                                               **layer_options),
        "final norm": per_norm if final_norm else 0,
        "output head": 0 if tied else d_model * n_vocab + (n_vocab if head_bias else 0),
    }


def paper_transformer_param_counts(*, d_model: int = 512, n_heads: int = 8, d_ff: int = 2048,
                                   n_layers: int = 6, n_vocab: int = 37000,
                                   final_norms: bool = False) -> dict[str, int]:
    """Parameters of the paper's encoder-decoder Transformer, itemised.

    Encoder layer: self-attention + FFN + 2 LayerNorms. Decoder layer: self-attention +
    cross-attention + FFN + 3 LayerNorms. One embedding matrix ``(n_vocab, d_model)`` shared by
    encoder input, decoder input and the pre-softmax projection (paper section 3.4), ``(n_vocab,
    d_model)``; sinusoidal
    positions (no parameters). ``final_norms=True`` adds the LayerNorms that
    ``torch.nn.Transformer`` puts after each stack (the oracle of the test). The vocabulary is an
    assumption: the paper states "about 37000 tokens" (shared BPE, WMT 2014 English-German).

    Returns ``{component: int}``; the paper's Table 3 says 65M (base) and 213M (big).
    Sizes are keyword-only. Raises ValueError as :func:`layer_param_counts`.
    Source: Vaswani et al. 2017, Table 3.
    """
    sizes = dict(d_model=d_model, n_heads=n_heads, d_ff=d_ff)
    encoder_layer = layer_param_count(**sizes)
    attention = sum(v for k, v in layer_param_counts(**sizes).items()
                    if k.startswith("attention"))
    decoder_layer = encoder_layer + attention + 2 * d_model  # cross-attention and its norm
    return {
        "shared embedding": n_vocab * d_model,
        "encoder layers": n_layers * encoder_layer,
        "decoder layers": n_layers * decoder_layer,
        "final norms": 4 * d_model if final_norms else 0,
    }


def visible_pairs(L: int, S: int, causal: bool) -> int:
    """Query-key pairs that attention computes: ``L S``, or with a causal mask aligned to the
    bottom-right corner (the last L of S positions) ``L S - L (L - 1) / 2`` (``S (S + 1) / 2``
    when L > S). An int. Source: lesson 02 (the masks), lesson 08."""
    if not causal:
        return L * S
    return L * S - L * (L - 1) // 2 if L <= S else S * (S + 1) // 2


def layer_flops(*, T: int, d_model: int, n_heads: int, d_ff: int, n_kv_heads: int | None = None,
                activation: str = "relu", S: int | None = None,
                causal: bool = False) -> dict[str, int]:
    """Forward FLOPs of one layer on one sequence, itemised (FLOPs = 2 x multiply-accumulates).

    The course's one FLOP counter (lessons 05 and 08). Sizes are keyword-only, so a call with them
    in another order raises TypeError instead of returning wrong numbers. T tokens go through the
    layer (they are the L = T queries); S keys (``S=None`` means S = T: self-attention without a
    cache; with a cache of P earlier tokens, S = P + T). With P = L S pairs (or, with
    ``causal=True``, only the :func:`visible_pairs` under a bottom-right causal mask, what a
    kernel that skips masked blocks computes; the common convention counts all of them):

    - projections: Q ``2 T d_model^2``; K and V ``2 S d_model (n_kv_heads d_k)`` each (with a
      cache only the T new keys are projected; this counts all S, an upper bound);
      output ``W_O``: ``2 T d_model^2``;
    - scores ``Q K^T``: ``2 P d_k`` per head, ``2 P d_model`` over all heads;
    - weighted sum ``A V``: ``2 P d_model`` (also independent of the number of heads);
    - FFN: ``2 T d_model d_ff`` per matrix (2 matrices, 3 for SwiGLU).

    Not counted (lower order, lesson 05 measures them under 1% at GPT-3 size): softmax, masking,
    the 1/sqrt(d_k) scale, norms, activations, bias adds, residual adds.

    Returns ``{component: int FLOPs}``; the rows starting with ``"FFN"`` are the FFN's. Raises
    ValueError for non-positive sizes and as :func:`layer_param_counts`. Source: lessons 05 and
    08; Vaswani et al. 2017, Table 1; Kaplan et al. 2020, Table 1.
    """
    d_k, n_kv_heads = _check_heads(d_model, n_heads, n_kv_heads)
    S = T if S is None else S
    if T <= 0 or S <= 0 or d_ff <= 0:
        raise ValueError(f"T ({T}), S ({S}) and d_ff ({d_ff}) must be positive")
    if activation not in ("relu", "gelu", "gelu_tanh", "swiglu"):
        raise ValueError(f"unknown activation {activation!r}")
    d_kv = n_kv_heads * d_k
    pairs = visible_pairs(T, S, causal)
    flops = {
        "Q projection": 2 * T * d_model * d_model,
        "K projection": 2 * S * d_model * d_kv,
        "V projection": 2 * S * d_model * d_kv,
        "scores Q K^T": 2 * pairs * d_model,
        "weighted sum A V": 2 * pairs * d_model,
        "output projection W_O": 2 * T * d_model * d_model,
        "FFN W_1": 2 * T * d_model * d_ff,
        "FFN W_2": 2 * T * d_ff * d_model,
    }
    if activation == "swiglu":
        flops["FFN W_3 (gate)"] = 2 * T * d_model * d_ff
    return flops


def attention_flops(*, T: int, d_model: int, n_heads: int, n_kv_heads: int | None = None,
                    S: int | None = None, causal: bool = False) -> int:
    """Forward FLOPs of the multi-head attention sub-layer for one sequence of length T.

    ``8 T d_model^2 + 4 T^2 d_model`` for standard MHA without a cache (four projections, scores
    and weighted sum; FLOPs = 2 x MACs; softmax not counted). The number of heads cancels out:
    n_heads heads of width d_k = d_model / n_heads cost what one head of width d_model costs.
    Keyword-only; the non-FFN rows of :func:`layer_flops`. Returns an int. Raises ValueError as
    :func:`layer_flops`. Source: lesson 08.
    """
    table = layer_flops(T=T, d_model=d_model, n_heads=n_heads, d_ff=1, n_kv_heads=n_kv_heads,
                        S=S, causal=causal)
    return sum(v for k, v in table.items() if not k.startswith("FFN"))


def ffn_flop_share(**sizes) -> float:
    """The FFN's share of one layer's forward FLOPs, a fraction in [0, 1] (keyword arguments of
    :func:`layer_flops`).

        share = m d_ff / (m d_ff + 2 d_model + 2 d_kv + 2 P / T),   P = visible query-key pairs

    with m = 3 for SwiGLU else 2; for a 4 d_model ReLU/GELU FFN with MHA and no mask,
    ``8 d_model / (12 d_model + 2 T)``: 2/3 when T << d_model, falling as T grows. Source: lesson 05.
    """
    flops = layer_flops(**sizes)
    return sum(v for k, v in flops.items() if k.startswith("FFN")) / sum(flops.values())


def ffn_param_share(**sizes) -> float:
    """The FFN's share of one layer's parameters, a fraction (keyword arguments of
    :func:`layer_param_counts`): FFN rows / all rows. Source: lesson 05."""
    counts = layer_param_counts(**sizes)
    return sum(v for k, v in counts.items() if k.startswith("FFN")) / sum(counts.values())


# Published sizes (d_model, n_heads, n_kv_heads, d_ff, context T, activation) of real models:
# Vaswani 2017 table 3 (base; the paper fixes no context length: T = 512 is only illustrative);
# Devlin 2019 (BERT); Radford 2019 (GPT-2); Brown 2020 table 2.1 (GPT-3); Touvron 2023 (LLaMA 2).
MODEL_SIZES = {
    "Transformer base (2017)": dict(d_model=512, n_heads=8, n_kv_heads=None, d_ff=2048, T=512, activation="relu"),
    "BERT-base": dict(d_model=768, n_heads=12, n_kv_heads=None, d_ff=3072, T=512, activation="gelu"),
    "GPT-2 XL (1.5B)": dict(d_model=1600, n_heads=25, n_kv_heads=None, d_ff=6400, T=1024, activation="gelu"),
    "GPT-3 175B": dict(d_model=12288, n_heads=96, n_kv_heads=None, d_ff=49152, T=2048, activation="gelu"),
    "LLaMA-2 7B": dict(d_model=4096, n_heads=32, n_kv_heads=None, d_ff=11008, T=4096, activation="swiglu"),
    "LLaMA-2 70B": dict(d_model=8192, n_heads=64, n_kv_heads=8, d_ff=28672, T=4096, activation="swiglu"),
}


def activation_bytes(*, B: int, T: int, d_model: int, n_heads: int, d_ff: int,
                     bytes_per_value: int = 4) -> dict[str, int]:
    """Memory of the tensors one layer's forward pass creates (and training keeps for backward).

    Rows (bytes): layer input ``B T d_model``; Q, K, V ``3 B T d_model``; scores and softmax
    weights ``B n_heads T^2`` each; attention output before and after ``W_O`` ``2 B T d_model``;
    FFN hidden before and after the activation ``2 B T d_ff``; FFN output ``B T d_model``.
    A rough model (fused kernels keep less); the scores rows are what grows as T^2.
    ``bytes_per_value``: 4 for float32, 2 for float16/bfloat16. Keyword-only. Raises ValueError for a
    non-positive size. Source: lesson 08.
    """
    if min(B, T, d_model, n_heads, d_ff, bytes_per_value) <= 0:
        raise ValueError(f"sizes must be positive, got B={B}, T={T}, d_model={d_model}, "
                         f"n_heads={n_heads}, d_ff={d_ff}, bytes_per_value={bytes_per_value}")
    n = bytes_per_value
    return {
        "layer input": B * T * d_model * n,
        "Q, K, V": 3 * B * T * d_model * n,
        "scores": attention_matrix_bytes(B=B, n_heads=n_heads, L=T, bytes_per_value=n),
        "softmax weights": attention_matrix_bytes(B=B, n_heads=n_heads, L=T, bytes_per_value=n),
        "attention output (2)": 2 * B * T * d_model * n,
        "FFN hidden (2)": 2 * B * T * d_ff * n,
        "FFN output": B * T * d_model * n,
    }


def attention_matrix_bytes(*, B: int, n_heads: int, L: int, S: int | None = None,
                           bytes_per_value: int = 4) -> int:
    """Bytes of one ``(B, n_heads, L, S)`` attention matrix: ``B n_heads L S bytes_per_value``.

    ``S=None`` means S = L. Keyword-only. Raises ValueError for non-positive sizes. Source: lesson 08.
    """
    S = L if S is None else S
    if min(B, n_heads, L, S, bytes_per_value) <= 0:
        raise ValueError(f"sizes must be positive, got B={B}, n_heads={n_heads}, L={L}, S={S}, "
                         f"bytes_per_value={bytes_per_value}")
    return B * n_heads * L * S * bytes_per_value


def format_table(rows: dict[str, float], unit: str = "", total: bool = True) -> str:
    """Render ``{component: number}`` as an aligned text table with an optional total line."""
    width = max([len(k) for k in rows] + [5])
    lines = [f"{k:<{width}}  {v:>16,.0f} {unit}".rstrip() for k, v in rows.items()]
    if total:
        lines.append(f"{'total':<{width}}  {sum(rows.values()):>16,.0f} {unit}".rstrip())
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# 2. Measuring
# --------------------------------------------------------------------------------------------

_CLOCKS = {"wall": "perf_counter", "cpu": "thread_time"}


def time_callable(fn: Callable[[], object], repeats: int = 5, warmup: int = 1,
                  reduce: str = "min", clock: str = "wall") -> float:
    """Time of ``fn()`` in seconds over `repeats` calls, after `warmup` calls.

    ``clock="wall"`` (default) is elapsed time (``time.perf_counter``); ``clock="cpu"`` is the CPU
    time of the calling thread (``time.thread_time``, user + system, page faults included). With
    PyTorch on one thread (``torch.set_num_threads(1)``) every operation runs on the calling
    thread, so the CPU clock counts the call's own work and not the time it spends waiting while
    other programs use the CPU: on a busy machine a long call waits more often than a short
    one, which inflates wall-time slopes. (With several threads the CPU clock misses the other
    threads' work: use it with one thread only.)

    ``reduce="min"`` (default) returns the fastest call: other processes on a shared machine only
    ever add time, so the minimum is the steadiest estimate of the call's own cost;
    ``reduce="median"`` returns the median. Runs under ``torch.inference_mode()`` (no autograd
    bookkeeping). Raises ValueError when ``repeats < 1``, ``warmup < 0``, or `reduce` or `clock`
    is unknown. Source: lesson 08.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats ({repeats}) must be >= 1 and warmup ({warmup}) >= 0")
    if reduce not in ("min", "median"):
        raise ValueError(f"reduce must be 'min' or 'median', got {reduce!r}")
    if clock not in _CLOCKS:
        raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    now = getattr(time, _CLOCKS[clock])
    times = []
    with torch.inference_mode():
        for i in range(warmup + repeats):
            start = now()
            fn()
            if i >= warmup:
                times.append(now() - start)
    return min(times) if reduce == "min" else statistics.median(times)


@contextlib.contextmanager
def _silent_c_stderr():
    """Send file descriptor 2 to /dev/null for a while: the profiler's C++ side logs a line on
    every start and stop there, which would fill a notebook. Python's ``sys.stderr`` (warnings,
    tracebacks) is flushed first and restored after."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no usable descriptor 2: nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def peak_memory_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes that PyTorch allocated on the CPU during one call of ``fn()``, above the start.

    Method: the PyTorch profiler with ``profile_memory=True`` records every allocation and free
    of PyTorch's CPU allocator (tensors created by ``fn``, including temporaries); replaying those
    events in time order gives the running total and its maximum. ``tracemalloc`` would miss
    these allocations (they are not made by the Python allocator), and NumPy arrays are not seen
    by this profiler either: measure PyTorch code only. The result of ``fn`` counts as allocated
    (it is alive at the end). Output that C code writes to file descriptor 2 during the call is
    discarded (the profiler's own log lines); Python-level warnings are not affected. Runs under ``torch.inference_mode()``. Returns an int (bytes).
    Source: lesson 08.
    """
    from torch.profiler import ProfilerActivity, profile

    with _silent_c_stderr(), torch.inference_mode(), profile(activities=[ProfilerActivity.CPU],
                                                             profile_memory=True) as prof:
        result = fn()
    del result
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    current = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        current += event.nbytes()  # negative for a free
        peak = max(peak, current)
    return int(peak)


def measure(make_fn: Callable[[int], Callable[[], object]], values: Iterable[int],
            what: str = "time", repeats: int = 3, clock: str = "wall") -> np.ndarray:
    """Measure ``make_fn(v)()`` for each v in `values`: seconds (``what="time"``, with `clock` as in
    :func:`time_callable`) or peak bytes (``what="memory"``). `make_fn` builds the inputs outside
    the measured call.

    Returns a float64 array, one value per entry of `values`. Raises ValueError for an unknown
    `what`. Source: lesson 08.
    """
    if what not in ("time", "memory"):
        raise ValueError(f"what must be 'time' or 'memory', got {what!r}")
    out = []
    for v in values:
        fn = make_fn(v)
        out.append(time_callable(fn, repeats, clock=clock) if what == "time"
                   else peak_memory_bytes(fn))
    return np.asarray(out, dtype=np.float64)


def fit_loglog_slope(x: Iterable[float], y: Iterable[float]) -> float:
    """Least-squares slope of ``log y`` against ``log x``: the exponent p of ``y ~ c x^p``.

    Raises ValueError unless x and y have the same length (>= 2) and are all positive.
    Source: lesson 08.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or len(x) < 2:
        raise ValueError(f"x and y must be 1-D of the same length >= 2, got {x.shape} and {y.shape}")
    if (x <= 0).any() or (y <= 0).any():
        raise ValueError("x and y must be positive to take logarithms")
    slope, _ = np.polyfit(np.log(x), np.log(y), 1)
    return float(slope)


# --------------------------------------------------------------------------------------------
# 3. A recurrent layer: T sequential steps
# --------------------------------------------------------------------------------------------

def recurrent_layer(x: torch.Tensor, W_x: torch.Tensor, W_h: torch.Tensor,
                    b: torch.Tensor) -> torch.Tensor:
    """An Elman RNN layer: ``h_t = tanh(x_t W_x + h_{t-1} W_h + b)``, ``h_0 = 0``.

    Args:
        x: ``(B, T, d_in)``; W_x: ``(d_in, d)``; W_h: ``(d, d)``; b: ``(d,)``.
    Returns:
        all hidden states ``(B, T, d)``, dtype of x.
    Raises:
        ValueError: when the shapes of x, W_x, W_h, b do not fit (both shapes named).

    The loop over t cannot be batched: step t needs h_{t-1}. That is the O(T) "sequential
    operations" of the paper's Table 1 (Vaswani et al. 2017, section 4), against attention's O(1).
    Equals ``torch.nn.RNN`` (tests/test_complexity.py).
    """
    if x.dim() != 3 or W_x.shape[0] != x.shape[-1]:
        raise ValueError(f"x {tuple(x.shape)} must be (B, T, d_in) with d_in = W_x.shape[0] "
                         f"(W_x {tuple(W_x.shape)})")
    d = W_x.shape[1]
    if W_h.shape != (d, d) or b.shape != (d,):
        raise ValueError(f"W_h {tuple(W_h.shape)} must be ({d}, {d}) and b {tuple(b.shape)} ({d},)")
    x_proj = x @ W_x + b  # (B, T, d): the input part is one batched product
    h = x.new_zeros(x.shape[0], d)  # (B, d)
    states = []
    for t in range(x.shape[1]):  # the sequential part: T steps
        h = torch.tanh(x_proj[:, t] + h @ W_h)  # (B, d)
        states.append(h)
    return torch.stack(states, dim=1)  # (B, T, d)


_MATMUL_NODES = ("MmBackward", "BmmBackward", "AddmmBackward", "BaddbmmBackward", "MvBackward")


def matmul_path_length(output: torch.Tensor, source: torch.Tensor) -> int:
    """The most matrix products on any path from `source` to `output` in the autograd graph.

    A measured "path length" (Vaswani et al. 2017, Table 1, maximum path length): how many
    matrix products a signal from `source` (a leaf tensor with ``requires_grad=True``) passes
    through before it reaches `output`. For an RNN it grows with the distance between positions;
    for self-attention it is a constant. Counts the autograd nodes ``mm``, ``bmm``, ``addmm``,
    ``baddbmm`` and ``mv``.

    Returns an int >= 0. Raises ValueError when `source` is not a leaf that requires grad, or
    when `output` does not depend on it. Source: lesson 08.
    """
    if not (source.requires_grad and source.is_leaf) or output.grad_fn is None:
        raise ValueError("source must be a leaf with requires_grad=True and output must have "
                         "been computed from it with gradients enabled")
    best: dict = {}  # node -> most products from this node down to source (-1: unreachable)
    stack = [(output.grad_fn, False)]
    while stack:  # iterative post-order traversal (graphs of long loops are deep)
        node, children_done = stack.pop()
        if node in best:
            continue
        children = [child for child, _ in node.next_functions if child is not None]
        if not children_done:
            stack.append((node, True))
            stack.extend((c, False) for c in children if c not in best)
            continue
        own = int(type(node).__name__.startswith(_MATMUL_NODES))
        if getattr(node, "variable", None) is source:
            best[node] = 0
        else:
            reach = [best[c] for c in children if best.get(c, -1) >= 0]
            best[node] = own + max(reach) if reach else -1
    if best[output.grad_fn] < 0:
        raise ValueError("output does not depend on source")
    return best[output.grad_fn]


# --------------------------------------------------------------------------------------------
# 4. Tiled attention with an online softmax
# --------------------------------------------------------------------------------------------

def online_softmax_update_np(m: np.ndarray, l: np.ndarray, acc: np.ndarray,
                             scores: np.ndarray, V: np.ndarray):
    """Merge one block of keys into the running softmax state of each query (NumPy).

    State per query: ``m`` the max score so far, ``l = sum_j exp(s_j - m)``, and
    ``acc = sum_j exp(s_j - m) v_j`` (unnormalised output). With the block's scores ``s`` (masked
    entries ``-inf``) and values ``V``:

        m' = max(m, max_j s_j);   alpha = exp(m - m');   p_j = exp(s_j - m')
        l' = alpha * l + sum_j p_j;   acc' = alpha * acc + p @ V

    The old sum and output must be rescaled by alpha because they were computed against the old
    max. While every score so far is ``-inf``, ``m'`` stays ``-inf`` and the update adds nothing
    (no NaN). After the last block, output = acc / l (0 where l = 0).

    Shapes: m, l ``(..., L)``; acc ``(..., L, d_v)``; scores ``(..., L, S_block)``;
    V ``(..., S_block, d_v)``. Returns ``(m', l', acc')``, same shapes, float64 when the inputs are.
    Source: Milakov & Gimelshein 2018, "Online normalizer calculation for softmax", Alg. 3;
    lesson 08.
    """
    m_new = np.maximum(m, scores.max(axis=-1))  # (..., L)
    m_safe = np.where(np.isneginf(m_new), 0.0, m_new)  # avoids (-inf) - (-inf)
    alpha = np.exp(m - m_safe)  # (..., L); 0 when m = -inf
    p = np.exp(scores - m_safe[..., None])  # (..., L, S_block)
    l_new = alpha * l + p.sum(axis=-1)
    acc_new = alpha[..., None] * acc + p @ V  # (..., L, d_v)
    return m_new, l_new, acc_new


def online_softmax_update(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor,
                          scores: torch.Tensor, V: torch.Tensor):
    """PyTorch version of :func:`online_softmax_update_np` (same equations, shapes and source).

    Computes in ``compute_dtype`` of the state's dtype (float32 for a float16 or bfloat16
    state, see :mod:`txlearn.precision`), with `scores` and `V` converted to it, and returns the
    new state in the dtype of `m`, `l` and `acc`. Keep the state in float32 for 16-bit inputs,
    as :func:`tiled_attention` does: a 16-bit state is rounded again at every block.
    """
    dtype = m.dtype
    work = compute_dtype(dtype)  # float32 for a float16/bfloat16 state
    m, l, acc = m.to(work), l.to(work), acc.to(work)
    scores, V = scores.to(work), V.to(work)
    m_new = torch.maximum(m, scores.amax(dim=-1))  # (..., L)
    m_safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    alpha = torch.exp(m - m_safe)  # (..., L)
    p = torch.exp(scores - m_safe.unsqueeze(-1))  # (..., L, S_block)
    l_new = alpha * l + p.sum(dim=-1)
    acc_new = alpha.unsqueeze(-1) * acc + p @ V  # (..., L, d_v)
    return m_new.to(dtype), l_new.to(dtype), acc_new.to(dtype)


def _check_qkv(Q, K, V, block_size: int) -> None:
    if Q.shape[-1] != K.shape[-1] or K.shape[-2] != V.shape[-2]:
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)}: need "
                         "Q and K of the same last dim and K, V of the same key count")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")


def _mask_block(mask, start: int, stop: int):
    """Columns start:stop of a mask broadcastable to (..., L, S); a size-1 key axis is kept."""
    return mask if mask.shape[-1] == 1 else mask[..., start:stop]


def tiled_attention_np(Q: np.ndarray, K: np.ndarray, V: np.ndarray, mask: np.ndarray | None = None,
                       block_size: int = 128) -> np.ndarray:
    """Scaled dot-product attention computed over key blocks with an online softmax (NumPy).

    ``softmax(Q K^T / sqrt(d_k) + mask) V`` without forming the ``(L, S)`` matrix: for each block
    of `block_size` keys, the ``(L, block_size)`` scores are merged into the running state by
    :func:`online_softmax_update_np`. Equal to ordinary attention to float tolerance, for any
    block size (dividing S or not).

    Args:
        Q: ``(..., L, d_k)``; K: ``(..., S, d_k)``; V: ``(..., S, d_v)``.
        mask: bool, True = may attend, broadcastable to ``(..., L, S)``; None = no mask.
        block_size: keys per block (>= 1).
    Returns:
        ``(..., L, d_v)``, float64 for float64 inputs; a query with every key masked gets 0.
    Raises:
        ValueError: mismatched Q/K/V shapes (all named) or ``block_size < 1``.
    Source: Vaswani et al. 2017, eq. 1; Dao et al. 2022 (FlashAttention), Alg. 1; lesson 08.
    """
    _check_qkv(Q, K, V, block_size)
    S, d_k = K.shape[-2], Q.shape[-1]
    m = np.full(Q.shape[:-1], -np.inf)  # (..., L)
    l = np.zeros(Q.shape[:-1])  # (..., L)
    acc = np.zeros(Q.shape[:-1] + V.shape[-1:])  # (..., L, d_v)
    for start in range(0, S, block_size):
        stop = min(start + block_size, S)
        scores = Q @ np.swapaxes(K[..., start:stop, :], -1, -2) / math.sqrt(d_k)  # (..., L, b)
        if mask is not None:
            scores = np.where(_mask_block(mask, start, stop), scores, -np.inf)
        m, l, acc = online_softmax_update_np(m, l, acc, scores, V[..., start:stop, :])
    l_safe = np.where(l > 0, l, 1.0)
    return np.where(l[..., None] > 0, acc / l_safe[..., None], 0.0)  # (..., L, d_v)


def tiled_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
                    mask: torch.Tensor | None = None, block_size: int = 128) -> torch.Tensor:
    """PyTorch version of :func:`tiled_attention_np` (same equation, shapes, mask and source).

    Peak memory: ``O(L block_size)`` for the block's scores plus ``O(L d_v)`` for the state, i.e.
    linear in T at a fixed block size, where ordinary attention needs ``O(L S)`` (lesson 08
    measures both with :func:`peak_memory_bytes`). Returns the dtype of Q. For float16 and
    bfloat16 inputs the scores, the state and the output are computed in float32 (each block of
    K and V converted as it is used; :mod:`txlearn.precision`) and the output rounded once, as
    FlashAttention keeps its running max and sums in float32.
    """
    _check_qkv(Q, K, V, block_size)
    S, d_k, dtype = K.shape[-2], Q.shape[-1], Q.dtype
    work = compute_dtype(dtype)  # float32 for float16/bfloat16 inputs
    Q = Q.to(work) / math.sqrt(d_k)  # scale the (L, d_k) queries once, not every (L, b) block
    m = Q.new_full(Q.shape[:-1], -math.inf)  # (..., L)
    l = Q.new_zeros(Q.shape[:-1])  # (..., L)
    acc = Q.new_zeros(Q.shape[:-1] + V.shape[-1:])  # (..., L, d_v)
    for start in range(0, S, block_size):
        stop = min(start + block_size, S)
        scores = Q @ K[..., start:stop, :].to(work).transpose(-1, -2)  # (..., L, b)
        if mask is not None:
            scores = scores.masked_fill(~_mask_block(mask, start, stop), -math.inf)
        m, l, acc = online_softmax_update(m, l, acc, scores, V[..., start:stop, :].to(work))
    out = acc / l.clamp_min(torch.finfo(l.dtype).tiny).unsqueeze(-1)  # (..., L, d_v)
    return out.masked_fill((l == 0).unsqueeze(-1), 0.0).to(dtype)
