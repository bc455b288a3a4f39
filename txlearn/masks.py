"""Attention masks (lesson 02): causal, padding, sliding-window (lesson 08), and their combination.

Convention of the whole course (docs/conventions.md; lesson 02): a mask is **boolean** and
``True`` means *may attend*. This is the polarity of the boolean ``attn_mask`` of
``torch.nn.functional.scaled_dot_product_attention``; ``nn.MultiheadAttention``'s boolean
``attn_mask`` and ``key_padding_mask`` use the opposite one (``True`` = hidden), see
:func:`from_torch_key_padding_mask`.

Masks are combined with logical operations (``&``), never by adding large negative numbers to
the scores: a sum of two ``-1e9`` terms, or a ``0/1`` keep-mask added by mistake, silently changes
the weights, while a boolean AND cannot.

Precision: boolean masks hold no numbers, so they are the same for every dtype of the scores
they are applied to (float16, bfloat16, float32, float64); :func:`to_additive`'s 0 and -inf are
exact in every floating dtype, where a "large negative" constant is not (-1e9 is beyond
float16's largest magnitude, 65,504, and becomes -inf there).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

__all__ = [
    "causal_mask",
    "causal_mask_np",
    "sliding_window_mask",
    "sliding_window_mask_np",
    "padding_mask",
    "padding_mask_np",
    "left_padding_mask",
    "left_padding_mask_np",
    "positions_from_padding",
    "combine_masks",
    "key_padding_to_attn_mask",
    "from_torch_key_padding_mask",
    "to_additive",
]


def _check_lengths(L: int, S: int | None) -> tuple[int, int]:
    S = L if S is None else S
    for name, n in (("L", L), ("S", S)):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"{name} must be a positive integer, got {n!r} (L={L!r}, S={S!r})")
    return int(L), int(S)


def causal_mask(L: int, S: int | None = None, device=None) -> torch.Tensor:
    """Causal mask for `L` queries over `S` keys, aligned to the bottom-right corner.

    ``mask[i, j] = j <= i + (S - L)``: query ``i`` is the ``(S - L + i)``-th position of a
    sequence whose first ``S`` positions are the keys, so the last query sees every key. With
    ``L == S`` this is the lower triangle including the diagonal (every position sees itself and
    its past). With ``L < S`` it is the mask of the last ``L`` queries of a cached sequence; with
    ``L > S`` the first ``L - S`` rows are all ``False`` (such queries get output 0 in
    :func:`txlearn.attention.scaled_dot_product_attention`).

    Same as ``torch.nn.attention.bias.causal_lower_right(L, S)``. SDPA's ``is_causal=True``
    aligns top-left instead (``j <= i``), which differs when ``L != S``.

    Args:
        L: number of queries (positive int).
        S: number of keys (positive int); defaults to `L`.
        device: torch device of the result.

    Returns:
        bool tensor ``(L, S)``, ``True`` = may attend.

    Raises:
        ValueError: `L` or `S` is not a positive integer (names both).

    Source: Vaswani et al. 2017, section 3.2.3 ("masking out ... illegal connections"); lesson 02.
    """
    L, S = _check_lengths(L, S)
    ones = torch.ones(L, S, dtype=torch.bool, device=device)  # (L, S)
    return torch.tril(ones, diagonal=S - L)  # (L, S), keeps j - i <= S - L


def causal_mask_np(L: int, S: int | None = None) -> np.ndarray:
    """NumPy reference of :func:`causal_mask`: bool ``(L, S)``, ``mask[i, j] = j <= i + S - L``.

    Raises:
        ValueError: `L` or `S` is not a positive integer.
    """
    L, S = _check_lengths(L, S)
    i = np.arange(L)[:, None]  # (L, 1) query index
    j = np.arange(S)[None, :]  # (1, S) key index
    return j <= i + (S - L)  # (L, S)


def _check_window(window: int) -> int:
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    return int(window)


def sliding_window_mask(L: int, S: int | None = None, window: int = 1, device=None) -> torch.Tensor:
    """Causal sliding-window mask: each query sees itself and the ``window - 1`` keys before it.

    ``mask[i, j] = 0 <= (i + S - L) - j < window``: the bottom-right causal mask of
    :func:`causal_mask` (query ``i`` is position ``S - L + i``) restricted to the last `window`
    positions. Each query sees at most `window` keys, so attention costs ``O(T w)`` instead of
    ``O(T^2)``; with ``window >= S`` it equals :func:`causal_mask`. Information still travels
    further than `window` through depth: layer ``n`` sees ``n (window - 1)`` positions back.

    Args:
        L: number of queries (positive int).
        S: number of keys (positive int); defaults to `L`.
        window: keys each query may see, itself included (positive int).
        device: torch device of the result.

    Returns:
        bool tensor ``(L, S)``, ``True`` = may attend.

    Raises:
        ValueError: `L`, `S` or `window` is not a positive integer (names them).

    Source: Child et al. 2019 (sparse transformers, local attention); Beltagy et al. 2020
    (Longformer, section 3.1, "sliding window"); Jiang et al. 2023 (Mistral 7B, window 4096);
    lesson 08.
    """
    L, S = _check_lengths(L, S)
    window = _check_window(window)
    ones = torch.ones(L, S, dtype=torch.bool, device=device)  # (L, S)
    causal = torch.tril(ones, diagonal=S - L)  # (L, S), keeps j <= i + S - L
    return causal & ~torch.tril(ones, diagonal=S - L - window)  # (L, S), drops j <= i + S - L - w


def sliding_window_mask_np(L: int, S: int | None = None, window: int = 1) -> np.ndarray:
    """NumPy reference of :func:`sliding_window_mask`: bool ``(L, S)``,
    ``mask[i, j] = 0 <= i + S - L - j < window``.

    Raises:
        ValueError: `L`, `S` or `window` is not a positive integer.
    """
    L, S = _check_lengths(L, S)
    window = _check_window(window)
    lag = np.arange(L)[:, None] + (S - L) - np.arange(S)[None, :]  # (L, S) query position - key
    return (lag >= 0) & (lag < window)  # (L, S)


def _lengths_array(lengths, S: int) -> np.ndarray:
    if hasattr(lengths, "detach"):
        lengths = lengths.detach().cpu().numpy()
    lengths = np.asarray(lengths)
    if lengths.ndim == 1 and lengths.size == 0:  # an empty batch (B = 0): [] reads as float64
        lengths = lengths.astype(np.int64)
    if lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(f"lengths must be a 1-D sequence of integers (B,), got shape "
                         f"{lengths.shape} and dtype {lengths.dtype}")
    if isinstance(S, bool) or not isinstance(S, (int, np.integer)) or S < 1:
        raise ValueError(f"S must be a positive integer, got {S!r}")
    if lengths.size and (lengths.min() < 0 or lengths.max() > S):
        raise ValueError(f"every length must lie in [0, S={S}], got min {lengths.min()} "
                         f"and max {lengths.max()}")
    return lengths


def padding_mask(lengths: Sequence[int] | torch.Tensor, S: int, device=None) -> torch.Tensor:
    """Key padding mask from sequence lengths: ``mask[b, j] = j < lengths[b]``.

    Args:
        lengths: ``(B,)`` integers, the number of real tokens of each sequence (a list, array or
            integer tensor).
        S: padded length (positive int), ``max(lengths) <= S``.
        device: torch device of the result (defaults to that of `lengths` if it is a tensor).

    Returns:
        bool tensor ``(B, S)``, ``True`` = real token (may be attended to). Broadcast it over
        queries and heads with :func:`key_padding_to_attn_mask`.

    Raises:
        ValueError: `lengths` is not 1-D integer, or a length is negative or above `S`.

    Source: lesson 02 (padding masks).
    """
    if device is None and isinstance(lengths, torch.Tensor):
        device = lengths.device
    lengths = _lengths_array(lengths, S)
    lengths_t = torch.as_tensor(lengths, device=device)[:, None]  # (B, 1)
    positions = torch.arange(S, device=device)[None, :]  # (1, S)
    return positions < lengths_t  # (B, S)


def padding_mask_np(lengths, S: int) -> np.ndarray:
    """NumPy reference of :func:`padding_mask`: bool ``(B, S)``, ``mask[b, j] = j < lengths[b]``.

    Raises:
        ValueError: as :func:`padding_mask`.
    """
    lengths = _lengths_array(lengths, S)
    return np.arange(S)[None, :] < lengths[:, None]  # (B, S)


def left_padding_mask(lengths: Sequence[int] | torch.Tensor, S: int, device=None) -> torch.Tensor:
    """Key padding mask of a left-padded batch: ``mask[b, j] = j >= S - lengths[b]``.

    Generation pads prompts of different lengths on the left, so that every row's last real token
    sits in the last column and the next token of every row is appended at the same place.
    Arguments and errors as :func:`padding_mask`; returns bool ``(B, S)``, True = real token.
    Source: lesson 10 (batched generation).
    """
    return padding_mask(lengths, S, device).flip(-1)  # (B, S): the real tokens at the end


def left_padding_mask_np(lengths, S: int) -> np.ndarray:
    """NumPy reference of :func:`left_padding_mask`: ``mask[b, j] = j >= S - lengths[b]``."""
    lengths = _lengths_array(lengths, S)
    return np.arange(S)[None, :] >= S - lengths[:, None]  # (B, S)


def positions_from_padding(key_padding_mask: torch.Tensor) -> torch.Tensor:
    """Each token's position counted from its row's first real token:
    ``positions[b, j] = (number of real tokens in row b before column j)``, int64 ``(B, S)``.

    With left padding the first real token of every row gets position 0, as it would alone;
    padding slots get 0 too (their outputs are never attended to). Without padding this is
    ``arange(S)`` in every row. Raises ValueError when the mask is not boolean ``(B, S)``.
    Source: lesson 10 (batched generation: a prompt's positions do not depend on its batch).
    """
    if key_padding_mask.dtype != torch.bool or key_padding_mask.dim() != 2:
        raise ValueError("key_padding_mask must be bool (B, S), got "
                         f"{key_padding_mask.dtype} of shape {tuple(key_padding_mask.shape)}")
    real = key_padding_mask.to(torch.int64)                         # (B, S)
    return (real.cumsum(-1) - real)                                 # (B, S) exclusive count


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Logical AND of boolean masks, broadcast together; ``None`` entries are skipped.

    A position may be attended to only if every mask allows it. Returns ``None`` when every
    argument is ``None`` (no mask at all).

    Raises:
        ValueError: a mask is not boolean (its dtype is named), or two masks do not broadcast
            (both shapes are named).

    Source: lesson 02 (combining causal and padding masks).
    """
    result = None
    for m in masks:
        if m is None:
            continue
        if m.dtype != torch.bool:
            raise ValueError(f"masks must be boolean (True = may attend), got dtype {m.dtype}")
        if result is None:
            result = m
            continue
        try:
            torch.broadcast_shapes(result.shape, m.shape)
        except RuntimeError:
            raise ValueError(f"masks of shapes {tuple(result.shape)} and {tuple(m.shape)} "
                             "do not broadcast") from None
        result = result & m
    return result


def key_padding_to_attn_mask(key_padding_mask: torch.Tensor) -> torch.Tensor:
    """Reshape a ``(B, S)`` key padding mask to ``(B, 1, 1, S)`` so it broadcasts over heads and
    queries against scores of shape ``(B, n_heads, L, S)``.

    Raises:
        ValueError: `key_padding_mask` is not 2-D boolean.
    """
    if key_padding_mask.dtype != torch.bool or key_padding_mask.dim() != 2:
        raise ValueError("key_padding_mask must be bool of shape (B, S), got dtype "
                         f"{key_padding_mask.dtype} and shape {tuple(key_padding_mask.shape)}")
    return key_padding_mask[:, None, None, :]  # (B, 1, 1, S)


def from_torch_key_padding_mask(mask: torch.Tensor) -> torch.Tensor:
    """Convert a boolean mask of ``nn.MultiheadAttention`` (``True`` = ignore) to this course's
    polarity (``True`` = may attend), and back: the conversion is its own inverse, ``~mask``.

    Raises:
        ValueError: `mask` is not boolean.
    """
    if mask.dtype != torch.bool:
        raise ValueError(f"expected a boolean mask, got dtype {mask.dtype}")
    return ~mask


def to_additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive float form of a boolean mask: ``0`` where allowed, ``-inf`` where hidden.

    This is the float ``attn_mask`` that ``F.scaled_dot_product_attention`` and
    ``nn.MultiheadAttention`` add to the scores. The course itself keeps masks boolean.
    Exact in every floating `dtype` (float16, bfloat16, float32, float64).

    Raises:
        ValueError: `mask` is not boolean.
    """
    if mask.dtype != torch.bool:
        raise ValueError(f"expected a boolean mask, got dtype {mask.dtype}")
    zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return zeros.masked_fill(~mask, float("-inf"))
