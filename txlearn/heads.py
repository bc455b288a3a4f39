"""Multi-head and grouped-query attention, the key/value cache and its memory (lesson 03).

    head_h = Attention(x W_Q^h, x_kv W_K^g(h), x_kv W_V^g(h))
    MultiHead(x, x_kv) = Concat(head_1, ..., head_{n_heads}) W_O   Vaswani et al. 2017, sec. 3.2.2

Each of the ``n_heads`` query heads works in its own ``d_k = d_model / n_heads`` slice of the
projected features. Grouped-query attention (Ainslie et al. 2023, "GQA") gives keys and values only
``n_kv_heads`` heads; query head ``h`` reads key/value head ``g(h) = h // (n_heads / n_kv_heads)``,
the grouping of ``F.scaled_dot_product_attention(..., enable_gqa=True)``. ``n_kv_heads = 1`` is
multi-query attention (Shazeer 2019), ``n_kv_heads = n_heads`` ordinary multi-head attention.

Weights are ``(d_in, d_out)`` and applied as ``x @ W + b`` (right-multiplication); PyTorch's
``(d_out, d_in)`` layout is converted only when loading (:meth:`MultiHeadAttention.load_torch_weights`).

Precision: a module cast with ``.to(torch.bfloat16)`` (or float16) runs in that dtype. The
projections are matrix products in the module's dtype (PyTorch accumulates them in float32 and
rounds once); the attention between the heads computes its scores and softmax in float32
(:mod:`txlearn.attention`); the KV cache stores K and V in the module's dtype, so a bfloat16
cache takes half the bytes of a float32 one.
"""

from __future__ import annotations

import torch
from torch import nn

import torch.nn.functional as F

from txlearn.attention import check_mask, scaled_dot_product_attention
from txlearn.masks import combine_masks, key_padding_to_attn_mask
from txlearn.positional import PAIRINGS, apply_rope

__all__ = [
    "split_heads",
    "merge_heads",
    "repeat_kv",
    "KVCache",
    "MultiHeadAttention",
    "kv_cache_bytes",
    "DTYPE_BYTES",
]


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Split the feature axis into heads: ``(B, T, d_model) -> (B, n_heads, T, d_k)``.

    Feature ``h * d_k + i`` of `x` becomes feature ``i`` of head ``h`` (heads are contiguous
    slices of width ``d_k = d_model / n_heads``).

    Raises:
        ValueError: `x` is not 3-D, or ``d_model`` is not divisible by `n_heads` (both named).
    """
    if x.dim() != 3:
        raise ValueError(f"split_heads expects (B, T, d_model), got shape {tuple(x.shape)}")
    B, T, d_model = x.shape
    if n_heads < 1 or d_model % n_heads != 0:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    d_k = d_model // n_heads
    x = x.reshape(B, T, n_heads, d_k)  # (B, T, n_heads, d_k)
    return x.transpose(1, 2)  # (B, n_heads, T, d_k)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`split_heads`: ``(B, n_heads, T, d_k) -> (B, T, n_heads * d_k)``.

    Raises:
        ValueError: `x` is not 4-D.
    """
    if x.dim() != 4:
        raise ValueError(f"merge_heads expects (B, n_heads, T, d_k), got shape {tuple(x.shape)}")
    B, n_heads, T, d_k = x.shape
    x = x.transpose(1, 2)  # (B, T, n_heads, d_k)
    return x.reshape(B, T, n_heads * d_k)  # (B, T, d_model)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Share each key/value head with `n_rep` consecutive query heads:
    ``(B, n_kv_heads, S, d_k) -> (B, n_kv_heads * n_rep, S, d_k)``, head ``g`` repeated at
    positions ``g * n_rep ... g * n_rep + n_rep - 1`` (``repeat_interleave``, as SDPA's
    ``enable_gqa=True`` does).
    """
    if n_rep == 1:
        return x
    return x.repeat_interleave(n_rep, dim=1)  # (B, n_kv_heads * n_rep, S, d_k)


class KVCache:
    """Keys and values of the positions seen so far, for one attention layer.

    Stores ``K, V`` of shape ``(B, n_kv_heads, S, d_k)``, before any sharing with query heads,
    so a GQA layer caches ``n_heads / n_kv_heads`` times less than a multi-head one. They keep
    the dtype of the first keys appended (that of the layer), and later ones must match it.
    """

    def __init__(self) -> None:
        self.K: torch.Tensor | None = None
        self.V: torch.Tensor | None = None

    def __len__(self) -> int:
        """Number of cached positions S (0 when empty)."""
        return 0 if self.K is None else self.K.shape[2]

    def append(self, K: torch.Tensor, V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's ``K, V (B, n_kv_heads, T_new, d_k)``; return all cached ones,
        ``(B, n_kv_heads, S, d_k)``.

        Raises:
            ValueError: the new keys' batch, heads or d_k differ from the cached ones, or their
                dtype does (a float32 step appended to a bfloat16 cache would silently double
                its bytes).
        """
        if self.K is not None and (K.shape[:2] != self.K.shape[:2] or K.shape[3] != self.K.shape[3]):
            raise ValueError(f"new keys {tuple(K.shape)} do not match cached keys "
                             f"{tuple(self.K.shape)} in (B, n_kv_heads, ., d_k)")
        if self.K is not None and (K.dtype != self.K.dtype or V.dtype != self.V.dtype):
            raise ValueError(f"new keys and values of dtype {K.dtype}, {V.dtype} do not match "
                             f"the cache's {self.K.dtype}")
        self.K = K if self.K is None else torch.cat([self.K, K], dim=2)  # (B, n_kv, S, d_k)
        self.V = V if self.V is None else torch.cat([self.V, V], dim=2)  # (B, n_kv, S, d_k)
        return self.K, self.V

    def reset(self) -> None:
        """Forget every cached position."""
        self.K = self.V = None

    def nbytes(self) -> int:
        """Bytes held by the cached keys and values."""
        if self.K is None:
            return 0
        return self.K.numel() * self.K.element_size() + self.V.numel() * self.V.element_size()


def _fused_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
                     mask: torch.Tensor | None) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` for the fast path, in at least float32 on the CPU.

    On the CPU, PyTorch 2.13's fused kernel takes twice as long (forward and backward) in
    bfloat16 as in float32 at the capstone's sizes (``benchmarks/README.md``), so under bfloat16
    autocast the CPU computes attention in float32 and returns the input dtype. GPUs keep
    bfloat16.
    """
    if Q.device.type != "cpu":
        return F.scaled_dot_product_attention(Q, K, V, attn_mask=mask)
    dtype = torch.promote_types(Q.dtype, torch.float32)   # bfloat16 -> float32; float64 stays
    with torch.autocast("cpu", enabled=False):
        out = F.scaled_dot_product_attention(Q.to(dtype), K.to(dtype), V.to(dtype),
                                             attn_mask=mask)
    return out.to(Q.dtype)


class MultiHeadAttention(nn.Module):
    """Multi-head (and grouped-query) attention with weights ``W_Q, W_K, W_V, W_O``.

    Parameters (right-multiplied, ``(d_in, d_out)``):
        ``W_Q (d_model, d_model)``, ``W_K, W_V (d_model, n_kv_heads * d_k)``, ``W_O (d_model,
        d_model)``; with ``bias=True`` (the default, as ``nn.MultiheadAttention`` and BERT-style
        models) also ``b_Q (d_model,)``, ``b_K, b_V (n_kv_heads * d_k,)``, ``b_O (d_model,)``.

    Initialisation: Xavier-uniform weights, zero biases (like ``nn.MultiheadAttention``'s input
    projection).

    Two paths, tested equal (masks, GQA, fully masked rows, gradients): by default the heads run
    the course's own :func:`txlearn.attention.scaled_dot_product_attention` (the teaching path);
    with ``use_sdpa=True`` a call that does not ask for the weights runs PyTorch's fused
    ``F.scaled_dot_product_attention`` instead, and every projection ``x W + b`` is one
    ``F.linear`` call (the fast path, for training; see ``benchmarks/``). Asking for the weights
    always takes the teaching attention.

    Rotary positions (``rope="interleaved"`` or ``"half"``, the pairing of
    :func:`txlearn.positional.apply_rope`, with ``theta_k = rope_base^(-2k/d_k)``): every query
    and key head is rotated by its position after the projection and before the cache, so the
    cache holds rotated keys. Positions start at the number of cached positions (``len(cache)``),
    so one token decoded after S cached ones is rotated by S. Self-attention only. ``rope=None``
    (the default) adds no positions here (lesson 04's other encodings are added to the input).

    Precision: runs in the dtype of its parameters (``.to(torch.bfloat16)``, float16, float32,
    float64); the scores and softmax in float32 for 16-bit dtypes (see the module's docstring).
    The fused path is as accurate on CPU: ``F.scaled_dot_product_attention`` accumulates 16-bit
    inputs in float32 too (``tests/test_precision.py`` holds both paths to 2 eps of the dtype).

    Raises:
        ValueError: ``d_model`` not divisible by ``n_heads``, or ``n_heads`` not divisible by
            ``n_kv_heads`` (the numbers are named), an unknown ``rope`` pairing, or an odd d_k
            with RoPE.

    Source: Vaswani et al. 2017, section 3.2.2; Ainslie et al. 2023 (GQA); Su et al. 2021
    (RoPE, eq. 34); lessons 03, 04 and 10.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None,
                 bias: bool = True, use_sdpa: bool = False, rope: str | None = None,
                 rope_base: float = 10000.0) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_heads < 1 or d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if n_kv_heads < 1 or n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}")
        if rope is not None and (rope not in PAIRINGS or (d_model // n_heads) % 2):
            raise ValueError(f"rope must be None or one of {PAIRINGS} with an even d_k, got "
                             f"rope={rope!r}, d_k={d_model // n_heads}")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.use_sdpa = use_sdpa
        self.rope, self.rope_base = rope, rope_base
        self.d_k = d_model // n_heads
        d_kv = n_kv_heads * self.d_k
        self.W_Q = nn.Parameter(torch.empty(d_model, d_model))
        self.W_K = nn.Parameter(torch.empty(d_model, d_kv))
        self.W_V = nn.Parameter(torch.empty(d_model, d_kv))
        self.W_O = nn.Parameter(torch.empty(d_model, d_model))
        for name, size in (("b_Q", d_model), ("b_K", d_kv), ("b_V", d_kv), ("b_O", d_model)):
            self.register_parameter(name, nn.Parameter(torch.zeros(size)) if bias else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weights, zero biases."""
        for W in (self.W_Q, self.W_K, self.W_V, self.W_O):
            nn.init.xavier_uniform_(W)
        for b in (self.b_Q, self.b_K, self.b_V, self.b_O):
            if b is not None:
                nn.init.zeros_(b)

    def _project(self, x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if self.use_sdpa:  # the fast path: x W + b in one kernel (addmm)
            return F.linear(x, W.t(), b)  # (B, T, d_out)
        return x @ W if b is None else x @ W + b  # (B, T, d_in) @ (d_in, d_out) -> (B, T, d_out)

    def _check_inputs(self, x: torch.Tensor, x_kv: torch.Tensor) -> None:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (B, L, d_model={self.d_model}), got {tuple(x.shape)}")
        if x_kv.dim() != 3 or x_kv.shape[-1] != self.d_model or x_kv.shape[0] != x.shape[0]:
            raise ValueError(f"x_kv must be (B={x.shape[0]}, S, d_model={self.d_model}), "
                             f"got {tuple(x_kv.shape)}")
        for name, t in (("x", x), ("x_kv", x_kv)):
            if t.dtype != self.W_Q.dtype:
                raise ValueError(f"{name} has dtype {t.dtype} but the parameters are "
                                 f"{self.W_Q.dtype}: cast one to the other (module.to(dtype))")

    def forward(self, x: torch.Tensor, x_kv: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, key_padding_mask: torch.Tensor | None = None,
                cache: KVCache | None = None, return_weights: bool = False,
                positions: torch.Tensor | None = None):
        """Attend from the positions of `x` to those of `x_kv` (or of `x` itself).

        Args:
            x: queries' inputs ``(B, L, d_model)``.
            x_kv: keys' and values' inputs ``(B, S_new, d_model)``; ``None`` = self-attention.
            mask: bool, ``True`` = may attend, broadcastable to ``(B, n_heads, L, S)`` (e.g.
                ``causal_mask(L, S)``), where S counts cached keys too.
            key_padding_mask: bool ``(B, S)``, ``True`` = real token (the opposite of
                ``nn.MultiheadAttention``'s ``key_padding_mask``).
            cache: a :class:`KVCache`; this call's keys and values are appended to it and the
                queries attend over all cached positions (with RoPE, this call's positions start
                at ``len(cache)``).
            return_weights: also return the per-head weights.
            positions: RoPE only: the positions of this call's L tokens, ``(L,)`` or one row per
                sequence ``(B, L)`` (integers, or floats for position interpolation); None =
                ``len(cache) .. len(cache) + L - 1``. A left-padded batch passes each row's
                positions counted from its first real token.

        Returns:
            ``out (B, L, d_model)``, or ``(out, weights (B, n_heads, L, S))``, in the dtype of
            the parameters.

        Raises:
            ValueError: wrong input shapes, an input whose dtype is not the parameters', a
                mask that is not boolean or does not broadcast, ``x_kv`` given to a module
                with RoPE, or `positions` given to a module without RoPE or not ``(L,)`` or
                ``(B, L)`` (shapes named).
        """
        if self.rope is not None and x_kv is not None:
            raise ValueError("RoPE rotates queries and keys by their positions in one sequence: "
                             "self-attention only (x_kv must be None)")
        x_kv = x if x_kv is None else x_kv
        self._check_inputs(x, x_kv)
        Q = split_heads(self._project(x, self.W_Q, self.b_Q), self.n_heads)  # (B, n_heads, L, d_k)
        K = split_heads(self._project(x_kv, self.W_K, self.b_K), self.n_kv_heads)  # (B, n_kv, S, d_k)
        V = split_heads(self._project(x_kv, self.W_V, self.b_V), self.n_kv_heads)  # (B, n_kv, S, d_k)
        if self.rope is None and positions is not None:
            raise ValueError("positions= rotates queries and keys: this attention has no RoPE")
        if self.rope is not None:  # positions continue after the cached ones
            positions = self._rope_positions(positions, x, cache)             # (L,) or (B, 1, L)
            Q = apply_rope(Q, positions, self.rope, self.rope_base)           # (B, n_heads, L, d_k)
            K = apply_rope(K, positions, self.rope, self.rope_base)           # (B, n_kv, L, d_k)
        if cache is not None:
            K, V = cache.append(K, V)  # (B, n_kv_heads, S_total, d_k)
        n_rep = self.n_heads // self.n_kv_heads
        K, V = repeat_kv(K, n_rep), repeat_kv(V, n_rep)  # (B, n_heads, S, d_k)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_to_attn_mask(key_padding_mask)  # (B, 1, 1, S)
        full_mask = combine_masks(mask, key_padding_mask)
        if self.use_sdpa and not return_weights:
            if full_mask is not None:  # the same errors as the teaching path
                check_mask(full_mask, (*Q.shape[:-1], K.shape[-2]), full_mask.dtype == torch.bool)
            heads = _fused_attention(Q, K, V, full_mask)  # (B, n_heads, L, d_k)
            return self._project(merge_heads(heads), self.W_O, self.b_O)  # (B, L, d_model)
        heads, weights = scaled_dot_product_attention(Q, K, V, full_mask, return_weights=True)
        out = self._project(merge_heads(heads), self.W_O, self.b_O)  # (B, L, d_model)
        return (out, weights) if return_weights else out

    @staticmethod
    def _rope_positions(positions, x, cache):
        B, L = x.shape[0], x.shape[1]
        if positions is None:
            start = 0 if cache is None else len(cache)
            return torch.arange(start, start + L, device=x.device)             # (L,)
        positions = torch.as_tensor(positions)
        if tuple(positions.shape) not in ((L,), (B, L)):
            raise ValueError(f"positions must be (L,) = ({L},) or (B, L) = ({B}, {L}), got "
                             f"{tuple(positions.shape)}")
        return positions if positions.dim() == 1 else positions[:, None, :]     # (B, 1, L)

    @torch.no_grad()
    def load_torch_weights(self, q_weight, k_weight, v_weight, o_weight,
                           q_bias=None, k_bias=None, v_bias=None, o_bias=None) -> None:
        """Copy weights stored in PyTorch's ``nn.Linear`` layout ``(d_out, d_in)`` (as in BERT's
        ``query/key/value/output.dense``) into ``W_* (d_in, d_out)`` by transposing them.

        Raises:
            ValueError: a weight's transposed shape differs from the parameter's (both named), or
                a bias is given for a module built with ``bias=False``.
        """
        pairs = ((self.W_Q, q_weight, self.b_Q, q_bias), (self.W_K, k_weight, self.b_K, k_bias),
                 (self.W_V, v_weight, self.b_V, v_bias), (self.W_O, o_weight, self.b_O, o_bias))
        for W, w, b, bias in pairs:
            w = torch.as_tensor(w)
            if tuple(w.T.shape) != tuple(W.shape):
                raise ValueError(f"weight of shape {tuple(w.shape)} (d_out, d_in) does not fit "
                                 f"a parameter of shape {tuple(W.shape)} (d_in, d_out)")
            W.copy_(w.T)  # (d_out, d_in) -> (d_in, d_out)
            if bias is not None:
                if b is None:
                    raise ValueError("a bias was given but the module has bias=False")
                b.copy_(torch.as_tensor(bias).reshape(b.shape))

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention) -> "MultiHeadAttention":
        """A copy of a ``nn.MultiheadAttention`` (same embed dim for q, k, v) with its weights."""
        d = mha.embed_dim
        has_bias = mha.in_proj_bias is not None
        new = cls(d, mha.num_heads, bias=has_bias).to(mha.in_proj_weight.dtype)
        w_q, w_k, w_v = mha.in_proj_weight.detach().chunk(3, dim=0)  # 3 x (d, d)
        b_q, b_k, b_v = mha.in_proj_bias.detach().chunk(3) if has_bias else (None, None, None)
        o_b = mha.out_proj.bias.detach() if has_bias else None
        new.load_torch_weights(w_q, w_k, w_v, mha.out_proj.weight.detach(), b_q, b_k, b_v, o_b)
        return new


DTYPE_BYTES = {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2,
               "float8": 1, "fp8": 1, "int8": 1, "float64": 8}


def kv_cache_bytes(*, n_layers: int, n_kv_heads: int, d_k: int, context: int, batch: int = 1,
                   dtype: str | torch.dtype | int = "bf16") -> int:
    """Bytes of the key/value cache of a decoder:

        bytes = 2 (K and V) * n_layers * n_kv_heads * d_k * context * batch * bytes_per_element

    Every argument is keyword-only (three of the sizes are head counts and widths that a
    swapped positional call would mix up silently).

    Args:
        n_layers: attention layers; n_kv_heads: key/value heads per layer (``n_heads`` for
            multi-head, 1 for multi-query); d_k: per-head width; context: cached positions
            (tokens); batch: sequences held at once.
        dtype: a name in :data:`DTYPE_BYTES`, a ``torch.dtype``, or bytes per element (int).

    Returns:
        int, bytes (divide by ``2**30`` for GiB).

    Raises:
        ValueError: a size is not a positive integer, or the dtype is unknown.

    Source: lesson 03 (KV-cache memory of MHA, GQA and MQA).
    """
    sizes = {"n_layers": n_layers, "n_kv_heads": n_kv_heads, "d_k": d_k, "context": context,
             "batch": batch}
    for name, n in sizes.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive integer, got {n!r}")
    if isinstance(dtype, torch.dtype):
        per_element = torch.empty((), dtype=dtype).element_size()
    elif isinstance(dtype, int) and not isinstance(dtype, bool) and dtype > 0:
        per_element = dtype
    elif isinstance(dtype, str) and dtype in DTYPE_BYTES:
        per_element = DTYPE_BYTES[dtype]
    else:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPE_BYTES)}, a "
                         "torch.dtype or a number of bytes")
    return 2 * n_layers * n_kv_heads * d_k * context * batch * per_element
