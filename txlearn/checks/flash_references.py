"""What set 11's FlashAttention checks (txlearn/checks/backward.py) compare with: the forward and
backward passes computed with the knobs of their catalogued mistakes, the public cases, and the
log-sum-exp of the masked scores. Registers no exercise."""

from __future__ import annotations

import math

import numpy as np
import torch

from txlearn.attention import masked_softmax_np

__all__ = ["ff_variant", "fb_variant", "flash_cases", "masked_lse"]


def ff_variant(Q, K, V, mask, block, *, rescale="both", shift="running", lse="right",
                scale=True, guard=True, use_mask=True):
    """What FlashAttention's forward computes with one catalogued mistake: (O, lse), flattened."""
    S, d_k = K.shape[-2], Q.shape[-1]
    m, l = np.full(Q.shape[:-1], -np.inf), np.zeros(Q.shape[:-1])
    acc = np.zeros(Q.shape[:-1] + V.shape[-1:])
    for start in range(0, S, block):
        stop = min(start + block, S)
        s = Q @ np.swapaxes(K[..., start:stop, :], -1, -2) / (math.sqrt(d_k) if scale else 1.0)
        if mask is not None and use_mask:
            s = np.where(mask[..., start:stop], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1) if shift != "global" else
                           np.max(s, axis=None, initial=-np.inf))
        base = s.max(axis=-1) if shift == "own" else m_new
        base = np.where(np.isfinite(base), base, 0.0) if guard else base
        alpha = np.exp(m - (np.where(np.isfinite(m_new), m_new, 0.0) if guard else m_new))
        p = np.exp(s - base[..., None])
        l = (alpha if rescale in ("both", "l") else 1.0) * l + p.sum(axis=-1)
        acc = (alpha[..., None] if rescale == "both" else 1.0) * acc + p @ V[..., start:stop, :]
        m = m_new
    seen = l > 0
    if guard:
        O = np.where(seen[..., None], acc / np.where(seen, l, 1.0)[..., None], 0.0)
    else:
        O = acc / l[..., None]
    log_l = np.log(np.where(seen, l, 1.0)) if guard else np.log(l)
    out_lse = {"right": m + log_l, "m": m, "log_l": log_l}[lse]
    if guard:
        out_lse = np.where(seen, out_lse, -np.inf)
    return np.concatenate([O.ravel(), out_lse.ravel()])


def flash_cases():
    rng = np.random.default_rng(15)
    rising = rng.normal(size=(3, 6, 4)) * np.linspace(0.2, 2.5, 6)[None, :, None]  # maxima grow
    blind = np.tril(np.ones((4, 7), bool), 3)  # bottom-right causal for L = 4, S = 7
    blind[1] = False                           # query 1 sees no key
    blind[:, 6] = False                        # key 6 is padding
    yield ("L = 3, S = 6 keys in blocks of 3, scores growing from block to block",
           rng.normal(size=(3, 4)) * 2, rising[0], rng.normal(size=(6, 5)), None, 3)
    yield ("L = 4, S = 7 in blocks of 3 (the last has 1 key), bottom-right causal, query 1 sees "
           "no key, key 6 hidden", rng.normal(size=(4, 4)), rng.normal(size=(7, 4)) * 2,
           rng.normal(size=(7, 3)), blind, 3)
    yield ("batch (2, 5, 4), causal, blocks of 2", rng.normal(size=(2, 5, 4)),
           rng.normal(size=(2, 5, 4)) * 2, rng.normal(size=(2, 5, 3)),
           np.tril(np.ones((5, 5), bool)), 2)


def masked_lse(Q, K, mask):
    scores = torch.tensor(Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1]))
    if mask is not None:
        scores = scores.masked_fill(~torch.tensor(mask), -math.inf)
    return torch.logsumexp(scores, dim=-1).numpy()


def fb_variant(Q, K, V, O, lse, dO, mask, block, *, weights="lse", D_block=False, p_t=True,
                scale=1.0, s_scaled=True, use_mask=True, guard=True):
    S, d_k = K.shape[-2], Q.shape[-1]
    lse_safe = (np.where(np.isfinite(lse), lse, 0.0) if guard else lse)[..., None]
    D = (dO * O).sum(axis=-1, keepdims=True)
    dQ, dK, dV = np.zeros(Q.shape), np.zeros(K.shape), np.zeros(V.shape)
    for start in range(0, S, block):
        stop = min(start + block, S)
        K_j, V_j = K[..., start:stop, :], V[..., start:stop, :]
        s = Q @ np.swapaxes(K_j, -1, -2) / (math.sqrt(d_k) if s_scaled else 1.0)
        if mask is not None and use_mask:
            s = np.where(mask[..., start:stop], s, -np.inf)
        P = masked_softmax_np(s, np.isfinite(s)) if weights == "block" else np.exp(s - lse_safe)
        dP = dO @ np.swapaxes(V_j, -1, -2)
        dZ = P * (dP - ((dP * P).sum(axis=-1, keepdims=True) if D_block else D))
        c = scale / math.sqrt(d_k)
        dQ = dQ + dZ @ K_j * c
        dK[..., start:stop, :] = np.swapaxes(dZ, -1, -2) @ Q * c
        dV[..., start:stop, :] = (np.swapaxes(P, -1, -2) if p_t else P) @ dO
    return np.concatenate([dQ.ravel(), dK.ravel(), dV.ravel()])
