"""Lesson 08: tiled ("flash") attention, scaled dot-product attention over key blocks with an
online softmax, never forming the ``(L, S)`` matrix, and FlashAttention, whose memory with
gradients is linear in T too.

Keys are processed in blocks; each query keeps a running max ``m``, a running sum ``l`` and an
unnormalised output ``acc`` (:func:`online_softmax_update`), so peak memory grows linearly in T at
a fixed block size. :func:`tiled_attention` is that forward pass under ordinary autograd (which
still saves every block's probabilities: quadratic memory with gradients). :func:`flash_attention`
keeps, per query row, only the log-sum-exp ``lse_i = log sum_j exp(s_ij)``; its backward pass
recomputes each block's probabilities ``P_j = exp(Z_j - lse)`` and never holds an (L, S) matrix.
NumPy float64 references (``_np``) sit beside the PyTorch versions, tested equal to
:func:`txlearn.attention.scaled_dot_product_attention`, to autograd and to each other.

Conventions of the course: boolean masks are True = may attend; a query whose keys are all masked
gets output 0. Source: Milakov & Gimelshein 2018, "Online normalizer calculation for softmax";
Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness"
(forward keeping m and l, Algorithm 1; backward Algorithm 4, with D = rowsum(dO * O)); Dao 2023,
"FlashAttention-2" (one log-sum-exp per row; forward and backward, Algorithms 1 and 2);
``notebooks/08_complexity.ipynb``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from txlearn.precision import compute_dtype

__all__ = ["online_softmax_update_np", "online_softmax_update", "tiled_attention_np",
           "tiled_attention", "flash_attention", "FlashAttentionFunction",
           "flash_attention_forward_np", "flash_attention_backward_np"]


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
    m_new = np.maximum(m, scores.max(axis=-1, initial=-np.inf))  # (..., L); a block of no keys
    # leaves the state as it was
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
    if scores.shape[-1] == 0:  # a block of no keys leaves the state as it was (as the NumPy twin)
        return m.to(dtype), l.to(dtype), acc.to(dtype)
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


# --------------------------------------------------------------------------- FlashAttention

def _flash_shapes(Q, K, V, block_size: int) -> int:
    """Checks shapes for FlashAttention; returns n_rep, the query heads per key/value head."""
    if Q.ndim < 2 or K.ndim != Q.ndim or V.ndim != Q.ndim:
        raise ValueError(f"Q, K, V need the same number of dims (..., T, d), got Q {tuple(Q.shape)}, "
                         f"K {tuple(K.shape)}, V {tuple(V.shape)}")
    if Q.shape[-1] != K.shape[-1] or K.shape[:-1] != V.shape[:-1]:
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)}: Q and K need "
                         "one d_k, K and V the same leading axes and keys")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    lead_q, lead_k = tuple(Q.shape[:-2]), tuple(K.shape[:-2])
    if lead_q == lead_k:
        return 1
    if (lead_q[:-1] == lead_k[:-1] and lead_k and lead_k[-1] >= 1
            and lead_q[-1] % lead_k[-1] == 0):
        return lead_q[-1] // lead_k[-1]
    raise ValueError(f"Q {tuple(Q.shape)} and K {tuple(K.shape)}: the leading axes must match, or "
                     "differ only in the head axis (-3) with n_heads a multiple of n_kv_heads (GQA)")


def _grouped(Q, mask, n_rep: int):
    """GQA as broadcasting: Q (..., n_heads, L, d) -> (..., n_kv_heads, n_rep, L, d), query head
    h in group h // n_rep (``repeat_kv``'s order); the mask follows. K and V get a size-1 group
    axis (``K[..., None, :, :]``) at the call site."""
    if n_rep == 1:
        return Q, mask
    *lead, H, L, d = Q.shape
    Qg = Q.reshape(*lead, H // n_rep, n_rep, L, d)
    if mask is not None and mask.ndim >= 3:
        if mask.shape[-3] == H and H > 1:
            mask = mask.reshape(*mask.shape[:-3], H // n_rep, n_rep, *mask.shape[-2:])
        else:
            mask = mask[..., None, :, :]
    return Qg, mask


def _block_mask(mask, L: int, S: int, start: int, stop: int, causal: bool, arange):
    """The (.., L, stop - start) mask of one key block: the columns of `mask` (a size-1 key axis
    kept) AND, with `causal`, the bottom-right causal rule key j <= query i + S - L, built per
    block so that no (L, S) mask exists. None when nothing is hidden."""
    block = None if mask is None else (mask if mask.shape[-1] == 1 else mask[..., start:stop])
    if causal:
        rule = arange(start, stop)[None, :] <= arange(L)[:, None] + (S - L)  # (L, b)
        block = rule if block is None else block & rule
    return block


def flash_attention_forward_np(Q, K, V, mask=None, block_size: int = 128, causal: bool = False):
    """FlashAttention's forward pass in float64 NumPy: ``(O, lse)``, keeping one number per query.

    Over key blocks, the online softmax of lesson 08 keeps per query the running maximum m, the
    running sum ``l = sum_j exp(s_j - m)`` and the unnormalised output
    ``acc = sum_j exp(s_j - m) v_j``; when a block raises the maximum to m', the old l and acc
    are rescaled by ``exp(m - m')``. At the end ``O = acc / l`` and the log-sum-exp
    ``lse = m + log l`` (``lse_i = log sum_j exp(s_ij)``), all the backward pass needs to
    recompute any block's probabilities, ``P_ij = exp(s_ij - lse_i)``.

    Args:
        Q: ``(..., n_heads, L, d_k)``; K, V: ``(..., n_kv_heads, S, d_k)``, ``(..., S, d_v)`` with
            the same leading axes as Q, or n_kv_heads dividing n_heads (grouped-query attention,
            query head h reading key head ``h // (n_heads / n_kv_heads)``).
        mask: bool broadcastable to ``(..., n_heads, L, S)``, True = may attend; None = no mask.
        block_size: keys per block (>= 1); causal: also apply the bottom-right causal mask.

    Returns:
        ``O (..., n_heads, L, d_v)`` and ``lse (..., n_heads, L)``, float64; a query with no
        visible key gets ``O = 0`` and ``lse = -inf``.

    Raises:
        ValueError: mismatched shapes (named) or ``block_size < 1``.

    Source: Dao 2023, "FlashAttention-2", Algorithm 1 (forward, saving one log-sum-exp per row);
    Milakov and Gimelshein 2018 (online softmax); lesson 08.
    """
    Q, K, V = (np.asarray(a, dtype=np.float64) for a in (Q, K, V))
    mask = None if mask is None else np.asarray(mask)
    n_rep = _flash_shapes(Q, K, V, block_size)
    Qg, maskg = _grouped(Q, mask, n_rep)
    Kg, Vg = (K, V) if n_rep == 1 else (K[..., None, :, :], V[..., None, :, :])
    L, S = Q.shape[-2], K.shape[-2]
    Qs = Qg / math.sqrt(Q.shape[-1])
    m = np.full(Qg.shape[:-1], -np.inf)  # (..., L)
    l = np.zeros(Qg.shape[:-1])
    acc = np.zeros(Qg.shape[:-1] + V.shape[-1:])  # (..., L, d_v)
    for start in range(0, S, block_size):
        stop = min(start + block_size, S)
        s = Qs @ np.swapaxes(Kg[..., start:stop, :], -1, -2)  # (..., L, b)
        block = _block_mask(maskg, L, S, start, stop, causal, np.arange)
        if block is not None:
            s = np.where(block, s, -np.inf)
        m, l, acc = online_softmax_update_np(m, l, acc, s, Vg[..., start:stop, :])
    with np.errstate(divide="ignore"):
        lse = np.where(l > 0, m + np.log(np.where(l > 0, l, 1.0)), -np.inf)
    O = np.where(l[..., None] > 0, acc / np.where(l > 0, l, 1.0)[..., None], 0.0)
    return O.reshape(*Q.shape[:-1], V.shape[-1]), lse.reshape(Q.shape[:-1])


def flash_attention_backward_np(Q, K, V, O, lse, dO, mask=None, block_size: int = 128,
                                causal: bool = False, dlse=None):
    """FlashAttention's backward pass in float64 NumPy: ``(dQ, dK, dV)``, one key block at a time.

    With ``D = rowsum(dO * O)`` (which equals ``rowsum(dP * P)``: ``sum_j P_ij (dO_i . v_j) =
    dO_i . O_i``), each block recomputes its probabilities from the saved log-sum-exp and runs
    lesson 02's backward on them:

        P_j = exp(Z_j - lse),  dV_j = P_j^T dO,  dP_j = dO V_j^T,  dZ_j = P_j * (dP_j - D),
        dQ += dZ_j K_j / sqrt(d_k),  dK_j = dZ_j^T Q / sqrt(d_k)

    Nothing is rescaled: lse is final, so every block's P is final. `dlse` (the gradient of a
    loss that uses lse itself; None = 0) adds ``P_j * dlse`` to dZ_j (``d lse_i / d s_ij = P_ij``).
    Args are those of :func:`flash_attention_forward_np` plus its outputs O, lse and ``dO`` (the
    shape of O). Returns float64 arrays of the shapes of Q, K, V (a key head's gradient summed
    over the query heads that share it); a query with no visible key gets ``dQ = 0``.

    Source: Dao 2023, "FlashAttention-2", Algorithm 2 (backward, recomputing P from the lse);
    Dao et al. 2022, Algorithm 4 (FlashAttention-1's backward, where D = rowsum(dO * O) first
    appears); lesson 08.
    """
    Q, K, V, O, lse, dO = (np.asarray(a, dtype=np.float64) for a in (Q, K, V, O, lse, dO))
    mask = None if mask is None else np.asarray(mask)
    n_rep = _flash_shapes(Q, K, V, block_size)
    Qg, maskg = _grouped(Q, mask, n_rep)
    Kg, Vg = (K, V) if n_rep == 1 else (K[..., None, :, :], V[..., None, :, :])
    Og, dOg = (a.reshape(*Qg.shape[:-1], V.shape[-1]) for a in (O, dO))
    lse_g = lse.reshape(Qg.shape[:-1])
    L, S, scale = Q.shape[-2], K.shape[-2], 1.0 / math.sqrt(Q.shape[-1])
    lse_safe = np.where(np.isneginf(lse_g), 0.0, lse_g)[..., None]  # empty rows: every P is 0
    D = (dOg * Og).sum(axis=-1, keepdims=True)  # (..., L, 1)
    if dlse is not None:
        D = D - np.asarray(dlse, dtype=np.float64).reshape(Qg.shape[:-1])[..., None]
    dQ = np.zeros(Qg.shape)
    dK, dV = np.zeros(K.shape), np.zeros(V.shape)
    for start in range(0, S, block_size):
        stop = min(start + block_size, S)
        s = Qg @ np.swapaxes(Kg[..., start:stop, :], -1, -2) * scale  # (..., L, b)
        block = _block_mask(maskg, L, S, start, stop, causal, np.arange)
        if block is not None:
            s = np.where(block, s, -np.inf)
        P = np.exp(s - lse_safe)  # (..., L, b), final: lse is the whole row's
        dP = dOg @ np.swapaxes(Vg[..., start:stop, :], -1, -2)  # (..., L, b)
        dZ = P * (dP - D)
        dQ += dZ @ Kg[..., start:stop, :] * scale
        dK_block = np.swapaxes(dZ, -1, -2) @ Qg * scale  # (..., b, d_k)
        dV_block = np.swapaxes(P, -1, -2) @ dOg  # (..., b, d_v)
        if n_rep > 1:  # a key head's gradient sums over the query heads of its group
            dK_block, dV_block = dK_block.sum(axis=-3), dV_block.sum(axis=-3)
        dK[..., start:stop, :] = dK_block
        dV[..., start:stop, :] = dV_block
    return dQ.reshape(Q.shape), dK, dV


def _flash_forward(Q, K, V, mask, block_size: int, causal: bool):
    """The torch forward of FlashAttention (no autograd): ``(O, lse)`` in the compute dtype."""
    n_rep = _flash_shapes(Q, K, V, block_size)
    work = compute_dtype(Q.dtype)  # float32 for float16/bfloat16 inputs
    Qg, maskg = _grouped(Q.to(work) / math.sqrt(Q.shape[-1]), mask, n_rep)
    Kg, Vg = (K, V) if n_rep == 1 else (K[..., None, :, :], V[..., None, :, :])
    L, S = Q.shape[-2], K.shape[-2]
    m = Qg.new_full(Qg.shape[:-1], -math.inf)  # (..., L)
    l = Qg.new_zeros(Qg.shape[:-1])
    acc = Qg.new_zeros(Qg.shape[:-1] + V.shape[-1:])  # (..., L, d_v)
    for start in range(0, S, block_size):
        stop = min(start + block_size, S)
        s = Qg @ Kg[..., start:stop, :].to(work).transpose(-1, -2)  # (..., L, b)
        block = _block_mask(maskg, L, S, start, stop, causal,
                            lambda *a: torch.arange(*a, device=Q.device))
        if block is not None:
            s = s.masked_fill(~block, -math.inf)
        m, l, acc = online_softmax_update(m, l, acc, s, Vg[..., start:stop, :].to(work))
        del s  # free the block's scores before the next block
    empty = l == 0
    O = (acc / l.masked_fill(empty, 1.0).unsqueeze(-1)).masked_fill(empty.unsqueeze(-1), 0.0)
    lse = (m + torch.log(l.masked_fill(empty, 1.0))).masked_fill(empty, -math.inf)
    return O.reshape(*Q.shape[:-1], V.shape[-1]), lse.reshape(Q.shape[:-1])


def _flash_backward(Q, K, V, O, lse, dO, dlse, mask, block_size: int, causal: bool):
    """The torch backward of FlashAttention, :func:`flash_attention_backward_np`'s equations,
    written with differentiable operations (so it can be differentiated again)."""
    n_rep = _flash_shapes(Q, K, V, block_size)
    work = compute_dtype(Q.dtype)
    scale = 1.0 / math.sqrt(Q.shape[-1])
    Qg, maskg = _grouped(Q.to(work), mask, n_rep)
    Kg, Vg = (K, V) if n_rep == 1 else (K[..., None, :, :], V[..., None, :, :])
    Kg, Vg = Kg.to(work), Vg.to(work)
    Og, dOg = (a.to(work).reshape(*Qg.shape[:-1], V.shape[-1]) for a in (O, dO))
    lse_g = lse.to(work).reshape(Qg.shape[:-1])
    L, S = Q.shape[-2], K.shape[-2]
    lse_safe = lse_g.masked_fill(torch.isneginf(lse_g), 0.0).unsqueeze(-1)  # empty rows: P = 0
    D = (dOg * Og).sum(dim=-1, keepdim=True)  # (..., L, 1) = rowsum(dP * P)
    if dlse is not None:
        D = D - dlse.to(work).reshape(Qg.shape[:-1]).unsqueeze(-1)
    dQ, dK_blocks, dV_blocks = None, [], []
    for start in range(0, S, block_size):
        stop = min(start + block_size, S)
        K_j, V_j = Kg[..., start:stop, :], Vg[..., start:stop, :]
        s = (Qg @ K_j.transpose(-1, -2)) * scale  # (..., L, b)
        block = _block_mask(maskg, L, S, start, stop, causal,
                            lambda *a: torch.arange(*a, device=Q.device))
        if block is not None:
            s = s.masked_fill(~block, -math.inf)
        P = torch.exp(s - lse_safe)  # (..., L, b): final probabilities, recomputed
        dZ = P * (dOg @ V_j.transpose(-1, -2) - D)  # (..., L, b)
        dQ_j = (dZ @ K_j) * scale
        dQ = dQ_j if dQ is None else dQ + dQ_j
        dK_j = (dZ.transpose(-1, -2) @ Qg) * scale  # (..., b, d_k)
        dV_j = P.transpose(-1, -2) @ dOg  # (..., b, d_v)
        if n_rep > 1:  # summed over the query heads that share the key head
            dK_j, dV_j = dK_j.sum(dim=-3), dV_j.sum(dim=-3)
        dK_blocks.append(dK_j)
        dV_blocks.append(dV_j)
        del s, P, dZ
    return (dQ.reshape(Q.shape).to(Q.dtype), torch.cat(dK_blocks, dim=-2).to(K.dtype),
            torch.cat(dV_blocks, dim=-2).to(V.dtype))


class FlashAttentionFunction(torch.autograd.Function):
    """FlashAttention as an autograd Function: the forward keeps Q, K, V, O and the per-row
    log-sum-exp (no block of probabilities); the backward recomputes each block from them.

    ``FlashAttentionFunction.apply(Q, K, V, mask, block_size, causal) -> (O, lse)``. Both outputs
    are differentiable (the backward takes dO and dlse), so the backward, written with
    differentiable operations, can be differentiated again (``gradgradcheck``). Use
    :func:`flash_attention` for the output alone.
    """

    @staticmethod
    def forward(ctx, Q, K, V, mask, block_size, causal):
        O, lse = _flash_forward(Q, K, V, mask, block_size, causal)
        O, lse = O.to(Q.dtype), lse.to(compute_dtype(Q.dtype))
        ctx.save_for_backward(Q, K, V, O, lse)
        ctx.mask, ctx.block_size, ctx.causal = mask, block_size, causal
        return O, lse

    @staticmethod
    def backward(ctx, dO, dlse):
        Q, K, V, O, lse = ctx.saved_tensors
        if dO is None:
            dO = torch.zeros_like(O)
        dQ, dK, dV = _flash_backward(Q, K, V, O, lse, dO, dlse, ctx.mask, ctx.block_size, ctx.causal)
        return dQ, dK, dV, None, None, None


def flash_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
                    mask: torch.Tensor | None = None, block_size: int = 128,
                    causal: bool = False) -> torch.Tensor:
    """Attention ``softmax(Q K^T / sqrt(d_k)) V`` whose memory, gradients included, is linear in T.

    The forward pass is the online softmax over key blocks (:func:`tiled_attention`); unlike
    it, the computation runs inside :class:`FlashAttentionFunction`, which saves for the
    backward pass only Q, K, V, the output and one log-sum-exp per query row, and recomputes
    each block's probabilities ``exp(Z_j - lse)`` in its own backward pass (lesson 08). Autograd
    through :func:`tiled_attention` keeps every block's intermediate results instead, which
    makes its memory with gradients grow like T^2.

    Args:
        Q: ``(..., n_heads, L, d_k)``; K: ``(..., n_kv_heads, S, d_k)``; V:
            ``(..., n_kv_heads, S, d_v)``: the same leading axes, or n_kv_heads dividing n_heads
            (grouped-query attention, ``repeat_kv``'s grouping, no copy of K and V).
        mask: bool broadcastable to ``(..., n_heads, L, S)``, True = may attend.
        block_size: keys per block (>= 1).
        causal: the bottom-right causal mask (``causal_mask(L, S)``), built block by block so
            that no ``(L, S)`` mask is ever held; it combines with `mask` by AND.

    Returns:
        ``(..., n_heads, L, d_v)`` in the dtype of Q (float16 and bfloat16 computed in float32);
        a query with no visible key gets output 0 and gradients 0.

    Raises:
        ValueError: mismatched shapes (named), ``block_size < 1``, or a non-boolean mask.

    Source: Dao 2023, "FlashAttention-2", Algorithms 1 and 2 (one lse per row); Dao et al. 2022,
    "FlashAttention", Algorithms 1 and 4; lesson 08; tested against autograd of
    :func:`txlearn.attention.scaled_dot_product_attention` and with gradcheck/gradgradcheck.
    """
    if mask is not None and mask.dtype != torch.bool:
        raise ValueError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
    O, _ = FlashAttentionFunction.apply(Q, K, V, mask, block_size, causal)
    return O
