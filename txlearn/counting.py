"""Lesson 08: what a transformer layer costs, counted: parameters, FLOPs (forward and training) and memory.

Parameters and forward FLOPs of one layer, itemised per component, with the closed forms they must
agree with; a stack (embedding, layers, head) and the paper's encoder-decoder model; the memory of
activations and of the attention matrix (the KV cache's is :func:`txlearn.heads.kv_cache_bytes`);
the FLOPs of a training step (forward and backward) and the bytes a decoding step reads;
the published sizes of real models (:data:`MODEL_SIZES`). Every size is keyword-only. FLOPs are
``2 x multiply-accumulates`` of the matrix products; element-wise work (softmax, norms,
activations, bias adds) is of lower order and is *not* counted (stated in each docstring).
``tests/test_counting.py`` checks the counts against ``sum(p.numel() ...)`` of the course's and
PyTorch's modules and the FLOPs against ``torch.utils.flop_counter.FlopCounterMode``.

Conventions of the course (docs/conventions.md): T is the sequence length, d_k = d_model /
n_heads. Source: Vaswani et al. 2017, "Attention is all you need", section 4 and Table 1
(complexity), Table 3 (model sizes); Kaplan et al. 2020, Table 1 (FLOPs per token).
"""

from __future__ import annotations

from txlearn.heads import kv_cache_bytes

__all__ = [
    "layer_param_counts",
    "layer_param_count",
    "layer_param_closed_form",
    "stack_param_counts",
    "paper_transformer_param_counts",
    "visible_pairs",
    "layer_flops",
    "attention_flops",
    "training_flops",
    "training_flops_per_token",
    "decode_bytes_per_token",
    "ffn_flop_share",
    "ffn_param_share",
    "MODEL_SIZES",
    "activation_bytes",
    "attention_matrix_bytes",
    "format_table",
]


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
    and ``torch.nn.TransformerEncoderLayer`` (tests/test_counting.py, tests/test_layer.py).

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


def training_flops(*, n_layers: int = 1, **sizes) -> dict[str, int]:
    """FLOPs of one training step of ``n_layers`` layers on one sequence: forward and backward.

    Every matrix product ``Y = A B`` (m x k times k x n, ``2 m k n`` FLOPs) needs two products
    in the backward pass, ``dA = dY B^T`` and ``dB = A^T dY``, of the same size: backward =
    2 x forward, a step = 3 x forward. This holds for the projections (``dW`` and the input's
    gradient) and for the attention products (``Q K^T`` and ``A V``: both factors are
    activations). It assumes the layers' input needs its gradient (it does when an embedding
    or an earlier layer made it); element-wise work is not counted (as in :func:`layer_flops`).

    Args: ``n_layers`` (positive int) and the keyword sizes of :func:`layer_flops`.
    Returns: ``{"forward": int, "backward": int}`` FLOPs. Raises ValueError as
    :func:`layer_flops`, or for ``n_layers < 1``. Source: Kaplan et al. 2020, section 2.1
    (``C ~ 6 N`` per token); lesson 08, checked against ``FlopCounterMode`` with a backward pass.
    """
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers must be a positive integer, got {n_layers!r}")
    forward = n_layers * sum(layer_flops(**sizes).values())
    return {"forward": forward, "backward": 2 * forward}


def training_flops_per_token(*, n_params: int, n_layers: int, T: int, d_model: int,
                             causal: bool = False) -> float:
    """The rule of thumb: training FLOPs per token ``~ 6 N + 12 n_layers T d_model``.

    ``6 N``: each of the N weights of the matrix products costs a multiply-add (2 FLOPs) per
    token forward and twice that backward. The second term is attention's: per token and layer
    the scores and the weighted sum cost ``4 T d_model`` forward (all T keys; with
    ``causal=True`` the average ``(T + 1) / 2`` visible keys), times 3 for a training step; it
    passes ``6 N`` when T is large (per layer, ``N ~ 12 d_model^2``: from ``T ~ 6 d_model``).
    N counts only the weights of matrix products (not biases, norms or the embedding lookup),
    so for such N this equals :func:`training_flops` / T exactly. Returns FLOPs per token (float).
    Raises ValueError for negative N or non-positive sizes. Source: Kaplan et al. 2020, Table 1
    and section 2.1; lesson 08.
    """
    if n_params < 0 or min(n_layers, T, d_model) <= 0:
        raise ValueError(f"n_params ({n_params}) must be >= 0 and n_layers ({n_layers}), T ({T}), "
                         f"d_model ({d_model}) positive")
    keys = (T + 1) / 2 if causal else T
    return 6 * n_params + 3 * n_layers * 4 * keys * d_model


def decode_bytes_per_token(*, n_params: int, n_layers: int, n_kv_heads: int, d_k: int,
                           context: int, batch: int = 1, weight_dtype="bf16",
                           cache_dtype="bf16") -> dict[str, float]:
    """Bytes read from memory per generated token when decoding with a KV cache.

    One decoding step computes one new token for each of ``batch`` sequences: it reads every
    weight once (shared by the batch) and each sequence's cached keys and values
    (:func:`txlearn.heads.kv_cache_bytes` at ``context`` tokens). Per generated token:

        weights  = n_params bytes_per_weight / batch
        KV cache = 2 n_layers n_kv_heads d_k context bytes_per_value

    A step does about 2 FLOPs per weight and per token, so at batch 1 it reads about a byte (or
    two) per FLOP: far less arithmetic per byte than a CPU or GPU can do, so its time is the
    bytes divided by the memory bandwidth. Grouped-query attention divides the cache row by
    ``n_heads / n_kv_heads``; its score FLOPs (``4 n_heads d_k context`` per token and layer)
    do not change.

    Args: sizes as :func:`txlearn.heads.kv_cache_bytes` (keyword-only); ``n_params`` weights read
    per step; dtypes as there. Returns ``{"weights": bytes, "KV cache": bytes}`` (floats).
    Raises ValueError as :func:`txlearn.heads.kv_cache_bytes`, or for negative ``n_params``.
    Source: Shazeer 2019 (multi-query attention, section 2.4); Pope et al. 2022 ("Efficiently
    scaling transformer inference", section 2); Ainslie et al. 2023 (GQA); lesson 08.
    """
    if n_params < 0:
        raise ValueError(f"n_params must be >= 0, got {n_params}")
    per_weight = kv_cache_bytes(n_layers=1, n_kv_heads=1, d_k=1, context=1,
                                dtype=weight_dtype) // 2                # bytes of one weight
    cache = kv_cache_bytes(n_layers=n_layers, n_kv_heads=n_kv_heads, d_k=d_k, context=context,
                           batch=batch, dtype=cache_dtype) / batch
    return {"weights": n_params * per_weight / batch, "KV cache": cache}


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
