"""Lesson 08: tiled ("flash") attention, scaled dot-product attention over key blocks with an
online softmax, never forming the ``(L, S)`` matrix.

Keys are processed in blocks; each query keeps a running max ``m``, a running sum ``l`` and an
unnormalised output ``acc`` (:func:`online_softmax_update`), so peak memory grows linearly in T at
a fixed block size. NumPy float64 references (``_np``) beside the PyTorch versions, tested equal to
:func:`txlearn.attention.scaled_dot_product_attention` and to each other. FlashAttention's
recomputing backward pass belongs here too (issue 21).

Conventions of the course: boolean masks are True = may attend; a query whose keys are all masked
gets output 0. Source: Milakov & Gimelshein 2018 (online softmax); Dao et al. 2022
(FlashAttention, Alg. 1); lesson 08.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from txlearn.precision import compute_dtype

__all__ = ["online_softmax_update_np", "online_softmax_update", "tiled_attention_np",
           "tiled_attention"]


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
    measures both with :func:`txlearn.measuring.peak_memory_bytes`). Returns the dtype of Q. For float16 and
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
