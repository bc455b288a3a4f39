"""Lesson 04: positional encodings: sinusoidal, learned, rotary (RoPE), ALiBi, interpolation.

Sinusoidal (Vaswani et al. 2017, section 3.5), the paper's layout, sin at even and cos at odd
feature indices::

    PE[pos, 2i]     = sin(pos * omega_i)
    PE[pos, 2i + 1] = cos(pos * omega_i),       omega_i = base^(-2i / d_model),  base = 10000

Rotary (Su et al. 2021, "RoFormer", section 3.4.2, eq. 34): rotate each channel pair (a, b) of a
query or key head (width d_k) at position m by the angle m * theta_k, theta_k = base^(-2k / d_k)::

    (a, b) -> (a cos(m theta_k) - b sin(m theta_k),  a sin(m theta_k) + b cos(m theta_k))

so that q_m . k_n depends only on m - n. Two channel pairings are in use, named here:

- ``"interleaved"``: pair k is channels (2k, 2k + 1): the RoFormer paper, GPT-J, Meta's LLaMA code;
- ``"half"``: pair k is channels (k, k + d_k/2): GPT-NeoX and Hugging Face's LLaMA.

:func:`interleaved_to_half` and :func:`half_to_interleaved` permute channels between the two; the
same permutation of W_Q's and W_K's output columns converts a checkpoint (tested).

ALiBi (Press et al. 2022, "Train short, test long", section 3) adds nothing to x either: it adds
a bias to the scaled scores of head h, linear in the distance between query and key::

    scores[h, i, j] = q_i . k_j / sqrt(d_k) - m_h (i - j)      (j <= i: the causal part)
    m_h = 2^(-8 h / n_heads),  h = 1 .. n_heads                 (n_heads a power of 2)

Position interpolation (Chen et al. 2023, "Extending context window of large language models via
positional interpolation", eq. 4) reads a RoPE model trained on windows of ``trained_len`` tokens
at a longer ``context`` by squeezing the positions back into the trained range:
``m -> m * trained_len / context``, so that no angle exceeds the ones seen in training.

Precision: angles are computed in float64 and their cos and sin rounded to the compute dtype
(:mod:`txlearn.precision`: float32 for float16 and bfloat16 inputs), never the angles themselves.
An angle m * theta_k grows with the position: between 1,024 and 2,048 neighbouring bfloat16
numbers are 8 apart (float16: 1; float32: 1.2e-4), so an angle rounded to bfloat16 can be off by
4 radians, a rotation by a nearly random angle (lesson 04 measures it). Near position 65,519 even
float32 numbers are 0.004 apart, hence float64 angles.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from txlearn.precision import compute_dtype

__all__ = [
    "sinusoidal_encoding",
    "sinusoidal_encoding_np",
    "sinusoidal_offset_matrix_np",
    "LearnedPositionalEmbedding",
    "rope_angles_np",
    "apply_rope",
    "apply_rope_np",
    "interleaved_to_half",
    "half_to_interleaved",
    "PAIRINGS",
    "interpolate_positions",
    "interpolate_positions_np",
    "alibi_slopes_np",
    "alibi_bias",
    "alibi_bias_np",
]

PAIRINGS = ("interleaved", "half")


def _check_even(d: int, what: str) -> None:
    if d < 2 or d % 2:
        raise ValueError(f"{what} needs an even feature size d >= 2 (channels come in sin/cos or "
                         f"rotation pairs), got d={d}")


# ---- sinusoidal --------------------------------------------------------------------------------

def _frequencies_np(d: int, base: float) -> np.ndarray:
    """omega_i = base^(-2i / d) for i = 0 .. d/2 - 1, float64 (d/2,), radians per position."""
    return base ** (-np.arange(0, d, 2, dtype=np.float64) / d)


def sinusoidal_encoding_np(T: int, d_model: int, base: float = 10000.0) -> np.ndarray:
    """The sinusoidal table PE (T, d_model), float64; sin at even, cos at odd feature indices.

    PE[pos, 2i] = sin(pos omega_i), PE[pos, 2i+1] = cos(pos omega_i), omega_i = base^(-2i/d_model)
    (Vaswani et al. 2017, section 3.5). Raises ValueError for an odd d_model or T < 0.
    """
    _check_even(d_model, "sinusoidal_encoding")
    if T < 0:
        raise ValueError(f"sinusoidal_encoding: T must be >= 0, got T={T}")
    angles = np.arange(T, dtype=np.float64)[:, None] * _frequencies_np(d_model, base)  # (T, d/2)
    pe = np.empty((T, d_model), dtype=np.float64)
    pe[:, 0::2] = np.sin(angles)  # even indices
    pe[:, 1::2] = np.cos(angles)  # odd indices
    return pe


def sinusoidal_encoding(T: int, d_model: int, base: float = 10000.0,
                        dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """The sinusoidal table as a tensor (T, d_model) of `dtype` (no gradient).

    Computed in float64 then cast, so it equals :func:`sinusoidal_encoding_np` to the dtype's
    rounding (half an eps) in every dtype and at every position: the angles pos * omega_i are
    never rounded to `dtype`. Add it to the token embeddings: ``x + sinusoidal_encoding(T, d_model)``.
    Raises ValueError for an odd d_model or T < 0. Source: Vaswani et al. 2017, section 3.5.
    """
    return torch.tensor(sinusoidal_encoding_np(T, d_model, base), dtype=dtype, device=device)


def sinusoidal_offset_matrix_np(k: int, d_model: int, base: float = 10000.0) -> np.ndarray:
    """The fixed matrix M_k (d_model, d_model) with PE[pos + k] = PE[pos] @ M_k for every pos.

    Block diagonal: for each frequency omega_i, the 2 x 2 block acting on (sin, cos) is
    [[cos(k omega_i), -sin(k omega_i)], [sin(k omega_i), cos(k omega_i)]] (right-multiplied), a
    rotation by k omega_i; it does not depend on pos. Source: Vaswani et al. 2017, section 3.5
    ("PE_{pos+k} can be represented as a linear function of PE_pos"); lesson 04.
    Raises ValueError for an odd d_model.
    """
    _check_even(d_model, "sinusoidal_offset_matrix_np")
    M = np.zeros((d_model, d_model))
    for i, w in enumerate(_frequencies_np(d_model, base)):
        c, s = np.cos(k * w), np.sin(k * w)
        # row vector [sin a, cos a] @ [[c, -s], [s, c]] = [sin a c + cos a s, -sin a s + cos a c]
        M[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[c, -s], [s, c]]
    return M


# ---- learned -----------------------------------------------------------------------------------

class LearnedPositionalEmbedding(nn.Module):
    """A learned table ``W_pos (max_len, d_model)``: position p gets row p (BERT, GPT-2).

    forward(positions): an int T (positions 0 .. T-1; returns (T, d_model)), a ``range`` of
    positions (returns (len, d_model); a step-1 range is a slice of the table, checked without
    reading a tensor, so ``torch.compile`` keeps one graph) or an integer tensor of positions of
    any shape (returns (*positions.shape, d_model)); dtype of W_pos (a lookup, exact in every
    dtype).
    Raises ValueError for a position past the table, ``>= max_len``, or negative (naming both):
    a learned table has no row for a position it never saw. Init: N(0, 0.02^2) (GPT-2).
    Source: Gehring et al. 2017, section 3.1; Vaswani et al. 2017, section 3.5; lesson 04.
    """

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        if max_len < 1 or d_model < 1:
            raise ValueError(f"LearnedPositionalEmbedding: max_len={max_len} and d_model="
                             f"{d_model} must be positive")
        self.max_len, self.d_model = max_len, d_model
        self.W_pos = nn.Parameter(torch.randn(max_len, d_model) * 0.02)

    def forward(self, positions) -> torch.Tensor:
        if isinstance(positions, int):
            positions = range(positions)
        if isinstance(positions, range) and positions.step == 1:  # a window: a slice, checked
            if len(positions):
                self._check_range(positions.stop - 1, positions.start)
            return self.W_pos[positions.start:positions.stop]  # (len(positions), d_model)
        if isinstance(positions, range):
            positions = torch.tensor(positions, device=self.W_pos.device)
        if positions.numel():
            self._check_range(int(positions.max()), int(positions.min()))
        return self.W_pos[positions]                       # (*positions.shape, d_model)

    def _check_range(self, hi: int, lo: int) -> None:
        if hi >= self.max_len or lo < 0:
            bad = hi if hi >= self.max_len else lo
            raise ValueError(f"LearnedPositionalEmbedding: position {bad} is outside the "
                             f"learned table of max_len={self.max_len} (rows 0..{self.max_len - 1})")

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, d_model={self.d_model}"


# ---- rotary ------------------------------------------------------------------------------------

def rope_angles_np(positions, d: int, base: float = 10000.0) -> np.ndarray:
    """Angles m * theta_k, float64 (..., T, d_k/2) in radians, theta_k = base^(-2k/d_k), for the
    positions (T,) (or (..., T): one row of positions per sequence of a batch) and a head width
    ``d`` (d_k)."""
    _check_even(d, "rope")
    return np.asarray(positions, dtype=np.float64)[..., None] * _frequencies_np(d, base)


def interleaved_to_half(x):
    """Permute the last dimension from interleaved pairs (2i, 2i+1) to half-split pairs (i, i+d/2).

    Channel order [x0, x1, x2, x3, ...] -> [x0, x2, x4, ..., x1, x3, x5, ...]. Works on tensors and
    arrays; raises ValueError for an odd last dimension.
    """
    _check_even(x.shape[-1], "interleaved_to_half")
    return _cat(x[..., 0::2], x[..., 1::2])                 # (..., d)


def half_to_interleaved(x):
    """Inverse of :func:`interleaved_to_half`: [a_0..a_{d/2-1}, b_0..] -> [a_0, b_0, a_1, b_1, ...]."""
    d = x.shape[-1]
    _check_even(d, "half_to_interleaved")
    a, b = x[..., : d // 2], x[..., d // 2:]
    stack = torch.stack if isinstance(x, torch.Tensor) else np.stack
    return stack((a, b), -1).reshape(*x.shape)               # (..., d/2, 2) -> (..., d)


def _cat(a, b):
    return torch.cat((a, b), -1) if isinstance(a, torch.Tensor) else np.concatenate((a, b), -1)


def _rotate(a, b, cos, sin):
    return a * cos - b * sin, a * sin + b * cos


def _split_pairs(x, pairing: str):
    d = x.shape[-1]
    if pairing == "interleaved":
        return x[..., 0::2], x[..., 1::2]                    # (..., d/2) each
    return x[..., : d // 2], x[..., d // 2:]                 # (..., d/2) each


def _join_pairs(a, b, pairing: str):
    if pairing == "interleaved":
        return half_to_interleaved(_cat(a, b))                # (..., d)
    return _cat(a, b)                                         # (..., d)


def _check_rope_args(x_shape, positions_shape, pairing: str) -> None:
    if len(x_shape) < 2:
        raise ValueError(f"apply_rope: x must be (..., T, d), got shape {tuple(x_shape)}")
    if pairing not in PAIRINGS:
        raise ValueError(f"apply_rope: pairing must be one of {PAIRINGS}, got {pairing!r}")
    _check_even(x_shape[-1], "apply_rope")
    positions_shape = tuple(positions_shape)
    n = positions_shape[-1] if positions_shape else 1
    if len(positions_shape) <= 1 and math.prod(positions_shape) != x_shape[-2]:
        raise ValueError(f"apply_rope: {math.prod(positions_shape)} positions for an input of "
                         f"shape {tuple(x_shape)}; need one position per row of the T axis "
                         "(dim -2)")
    if len(positions_shape) > 1 and (n != x_shape[-2] or not _broadcasts(
            positions_shape, tuple(x_shape[:-1]))):
        raise ValueError(f"apply_rope: positions of shape {positions_shape} do not broadcast "
                         f"to the input's {tuple(x_shape[:-1])} (x of shape {tuple(x_shape)} "
                         "without its d axis)")


def _broadcasts(shape, target) -> bool:
    """True when `shape` broadcasts to `target` (NumPy's rule, aligned on the right)."""
    if len(shape) > len(target):
        return False
    return all(a in (1, b) for a, b in zip(reversed(shape), reversed(target)))


def apply_rope(x: torch.Tensor, positions=None, pairing: str = "interleaved",
               base: float = 10000.0) -> torch.Tensor:
    """Rotate channel pairs of `x` by position-dependent angles (RoPE; Su et al. 2021, eq. 34).

    Args:
        x: queries or keys (..., T, d), float; d even (d_k per head).
        positions: positions (T,), default 0 .. T-1 (offset them for a KV cache); integers, or
            floats for position interpolation; or one row per sequence, (..., T) broadcastable
            to x's (..., T) (a left-padded batch, each row counted from its first real token).
        pairing: "interleaved" (pairs (2i, 2i+1), RoFormer/GPT-J) or "half" (pairs (i, i+d/2),
            GPT-NeoX/HF LLaMA).
        base: theta_k = base^(-2k/d_k).
    Returns: (..., T, d), dtype of x; norms of every pair are preserved, and
        ``apply_rope(q, m) . apply_rope(k, n)`` depends on m - n only.
    Precision: the angles m * theta_k and their cos and sin in float64; the rotation in float32
        for float16 and bfloat16 inputs (the input's dtype otherwise), rounded once to x's dtype.
        Rounding the angles to a 16-bit dtype instead breaks the m - n property at long positions
        (bfloat16, position 1857: an error of 1.9 on a unit vector; lesson 04).
    Raises: ValueError for an odd d, an unknown pairing, len(positions) != T, or positions of
        several rows that do not broadcast to x's (..., T) (both shapes named).
    """
    T = x.shape[-2] if x.dim() >= 2 else 0
    positions = torch.arange(T) if positions is None else torch.as_tensor(positions)
    _check_rope_args(tuple(x.shape), tuple(positions.shape), pairing)
    angles = rope_angles_np(positions.cpu().numpy(), x.shape[-1], base)  # (..., T, d/2) float64
    work = compute_dtype(x.dtype)  # float32 for float16/bfloat16: never round the angles
    cos = torch.tensor(np.cos(angles), dtype=work, device=x.device)     # (..., T, d/2)
    sin = torch.tensor(np.sin(angles), dtype=work, device=x.device)     # (..., T, d/2)
    a, b = _split_pairs(x.to(work), pairing)                           # (..., T, d/2) each
    a, b = _rotate(a, b, cos, sin)
    return _join_pairs(a, b, pairing).to(x.dtype)                      # (..., T, d)


def apply_rope_np(x, positions=None, pairing: str = "interleaved",
                  base: float = 10000.0) -> np.ndarray:
    """float64 NumPy reference of :func:`apply_rope` (same arguments, returns float64)."""
    x = np.asarray(x, dtype=np.float64)
    T = x.shape[-2] if x.ndim >= 2 else 0
    positions = np.arange(T) if positions is None else np.asarray(positions)
    _check_rope_args(x.shape, positions.shape, pairing)
    angles = rope_angles_np(positions, x.shape[-1], base)             # (..., T, d/2)
    a, b = _split_pairs(x, pairing)                                    # (..., T, d/2) each
    a, b = _rotate(a, b, np.cos(angles), np.sin(angles))
    return _join_pairs(a, b, pairing)                                  # (..., T, d)


# ---- position interpolation ----------------------------------------------------------------------

def interpolate_positions_np(positions, trained_len: int, context: int) -> np.ndarray:
    """Positions squeezed into the trained range for RoPE: ``m * trained_len / context``, float64.

    Position interpolation (Chen et al. 2023, eq. 4): a RoPE model trained on windows of
    `trained_len` tokens, read at a `context` of up to `context` tokens, rotates position m by the
    angles of position ``m * trained_len / context`` instead, so every angle (and every offset
    ``(m - n) * trained_len / context``) stays inside the range seen in training; neighbouring
    tokens are then ``trained_len / context`` of a position apart. Pass the result to
    :func:`apply_rope` as its `positions`.

    Args:
        positions: integer or float positions, any shape (e.g. ``np.arange(T)``).
        trained_len: the training window, positive.
        context: the longer window to read, ``>= trained_len``.
    Returns: float64 array of the positions' shape.
    Raises: ValueError when `trained_len` is not positive or `context < trained_len` (both named).
    Source: Chen et al. 2023, section 2.2, eq. (4); lesson 04.
    """
    if trained_len < 1 or context < trained_len:
        raise ValueError(f"interpolate_positions: need 1 <= trained_len <= context, got "
                         f"trained_len={trained_len}, context={context} (interpolation only "
                         "squeezes a longer context into the trained one)")
    return np.asarray(positions, dtype=np.float64) * (trained_len / context)


def interpolate_positions(positions, trained_len: int, context: int) -> torch.Tensor:
    """:func:`interpolate_positions_np` as a float64 tensor (positions: a tensor, an array, a list
    or an int T for ``0 .. T-1``). Same equation, arguments and errors."""
    if isinstance(positions, int):
        positions = np.arange(positions)
    elif isinstance(positions, torch.Tensor):
        positions = positions.detach().cpu().numpy()
    return torch.from_numpy(interpolate_positions_np(positions, trained_len, context))


# ---- ALiBi -------------------------------------------------------------------------------------

def alibi_slopes_np(n_heads: int) -> np.ndarray:
    """ALiBi's per-head slopes m_h, float64 (n_heads,).

    For n_heads a power of 2: the geometric sequence ``m_h = 2^(-8 h / n_heads)``, h = 1 ..
    n_heads (8 heads: 1/2, 1/4, ..., 1/256; Press et al. 2022, section 3). Otherwise, as in the
    authors' released code and in BLOOM: the slopes of the largest power of two p below
    n_heads, followed by every other slope of 2p (its 1st, 3rd, ...), until there are n_heads.
    Raises ValueError for n_heads < 1. Source: Press et al. 2022, section 3.
    """
    if isinstance(n_heads, bool) or not isinstance(n_heads, (int, np.integer)) or n_heads < 1:
        raise ValueError(f"alibi_slopes: n_heads must be a positive integer, got {n_heads!r}")

    def geometric(n: int) -> np.ndarray:
        return 2.0 ** (-8.0 * np.arange(1, n + 1) / n)

    p = 1 << (int(n_heads).bit_length() - 1)                 # largest power of 2 <= n_heads
    slopes = geometric(p)
    if p < n_heads:
        slopes = np.concatenate([slopes, geometric(2 * p)[0::2][: n_heads - p]])
    return slopes


def alibi_bias_np(n_heads: int, L: int, S: int | None = None) -> np.ndarray:
    """ALiBi's bias on the scores, float64 (n_heads, L, S): ``-m_h |i' - j|``.

    Query i is position ``i' = S - L + i`` (the last L of S positions, aligned bottom-right like
    :func:`txlearn.masks.causal_mask`), key j is position j. For keys up to the query
    (``j <= i'``, all a causal model sees) this is the paper's ``-m_h (i' - j)``: 0 on the
    query's own key, a penalty growing linearly with the distance behind it; keys after the
    query get the same penalty for the same distance (the symmetric form used without a causal
    mask). Add it to the scaled scores ``Q K^T / sqrt(d_k)`` of shape ``(..., n_heads, L, S)``
    before the (masked) softmax; nothing is added to the token vectors.

    Raises ValueError for n_heads, L or S < 1, or L > S (names all three).
    Source: Press et al. 2022, section 3 and figure 3; lesson 04.
    """
    S = L if S is None else S
    if min(L, S) < 1 or L > S:
        raise ValueError(f"alibi_bias: need 1 <= L <= S (queries are the last L of S positions), "
                         f"got n_heads={n_heads}, L={L}, S={S}")
    slopes = alibi_slopes_np(n_heads)                                   # (n_heads,)
    query_pos = np.arange(S - L, S, dtype=np.float64)[:, None]          # (L, 1)
    key_pos = np.arange(S, dtype=np.float64)[None, :]                   # (1, S)
    return -slopes[:, None, None] * np.abs(query_pos - key_pos)         # (n_heads, L, S)


def alibi_bias(n_heads: int, L: int, S: int | None = None, dtype: torch.dtype = torch.float32,
               device=None) -> torch.Tensor:
    """:func:`alibi_bias_np` as a tensor (n_heads, L, S) of `dtype`, no gradient: computed in
    float64 and rounded once (a bias of -m (i - j) at long distances is large, e.g. -2048 at
    m = 1/2 and 4096 positions, where bfloat16 numbers are 16 apart). Same errors.
    Source: Press et al. 2022, section 3; lesson 04.
    """
    return torch.tensor(alibi_bias_np(n_heads, L, S), dtype=dtype, device=device)
