"""Lesson 08: sliding-window attention computed band by band, in O(T w) time and memory.

Each query attends to itself and the ``window - 1`` keys before it
(:func:`txlearn.masks.sliding_window_mask`). Masking a full ``T x T`` score matrix gives the
right output but still costs ``O(T^2)``; :func:`sliding_window_attention` computes only the band:
the queries in blocks of ``block``, each block against the ``block + window - 1`` keys it can see.
Tested equal to :func:`txlearn.attention.scaled_dot_product_attention` with the mask
(tests/test_sliding_window.py). Source: Beltagy et al. 2020 (Longformer, section 3.1);
Jiang et al. 2023 (Mistral 7B, section 2); lesson 08.
"""

from __future__ import annotations

import torch

from txlearn.attention import scaled_dot_product_attention

__all__ = ["sliding_window_attention"]


def sliding_window_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, window: int,
                             block: int | None = None) -> torch.Tensor:
    """``softmax(Q K^T / sqrt(d_k) + M_w) V`` with the causal sliding-window mask ``M_w``, banded.

    Query ``i`` is position ``S - L + i`` (the bottom-right alignment of
    :func:`txlearn.masks.causal_mask`) and sees the keys ``j`` with
    ``0 <= S - L + i - j < window``. The queries are processed ``block`` at a time (default
    `window`); a block of b queries needs only the ``b + window - 1`` keys ending at its last
    query, so the scores held at once are ``b (b + window - 1)``: time ``O(L w d_k)`` and
    memory ``O(w^2 + L d_v)``, against ``O(L S)`` for the masked full matrix. A query that sees
    no key (L > S) gets output 0, as in the course's attention.

    Args:
        Q: ``(..., L, d_k)``; K: ``(..., S, d_k)``; V: ``(..., S, d_v)``, the same leading dims.
        window: keys per query, itself included (positive int).
        block: queries per block (positive int); default `window`.

    Returns:
        ``(..., L, d_v)``, dtype of Q.

    Raises:
        ValueError: window or block not a positive integer; shapes that do not fit (names them).

    Source: Beltagy et al. 2020, section 3.1; lesson 08.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    block = window if block is None else block
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive integer, got {block!r}")
    if Q.shape[:-2] != K.shape[:-2] or K.shape[:-1] != V.shape[:-1] or Q.shape[-1] != K.shape[-1]:
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)} must be "
                         "(..., L, d_k), (..., S, d_k), (..., S, d_v)")
    L, S = Q.shape[-2], K.shape[-2]
    outputs = []
    for q0 in range(0, L, block):
        q1 = min(q0 + block, L)
        first, last = S - L + q0, S - L + q1 - 1          # positions of the block's queries
        k0, k1 = max(first - window + 1, 0), max(last + 1, 0)  # the keys the block can see
        if k1 == 0:                                       # no key at all: output 0
            outputs.append(Q.new_zeros(*Q.shape[:-2], q1 - q0, V.shape[-1]))
            continue
        lag = (torch.arange(first, last + 1, device=Q.device)[:, None]
               - torch.arange(k0, k1, device=Q.device)[None, :])  # (b, keys) query - key
        band = (lag >= 0) & (lag < window)                # (b, keys) the mask of this block
        outputs.append(scaled_dot_product_attention(Q[..., q0:q1, :], K[..., k0:k1, :],
                                                    V[..., k0:k1, :], band))  # (..., b, d_v)
    return torch.cat(outputs, dim=-2)                     # (..., L, d_v)
