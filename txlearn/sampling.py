"""Choosing the next token from a model's logits: greedy, temperature, top-k and top-p (nucleus).

One sampler for the whole course (lesson 09's capstone, lesson 10's decoder, the exercises). For
logits ``z`` over the vocabulary (the last axis, ``n_vocab`` entries) the distribution is built in
this order:

1. **temperature** ``t``: ``p = softmax(z / t)``, computed as ``softmax((z - max z) / t)`` in
   float64 so that no positive ``t`` overflows (``t = 1e-39`` behaves as greedy instead of giving
   NaN). ``t = 0`` is greedy: the first index of the maximum (``torch.argmax``'s rule), whatever
   ``top_k`` and ``top_p`` say. As ``t -> 0+`` the distribution tends to uniform over the tied
   maxima, so with ties a tiny positive ``t`` samples among them while ``t = 0`` takes the first;
2. **top-k**: keep exactly the ``k`` largest logits. Ties at the k-th value are broken by the lowest
   index (a stable sort, descending), so exactly ``k`` candidates survive; ``top_k = 1`` is greedy;
   ``top_k >= n_vocab`` keeps all;
3. **top-p** (nucleus, Holtzman et al. 2020, section 3.1): renormalise what survived, sort it
   descending (stable), and keep the smallest prefix whose mass reaches ``p``: a token is kept
   when the mass *before* it is below ``p``, so the token that crosses ``p`` is kept. ``p = 1``
   keeps everything.

The kept probabilities are renormalised and one index is drawn by inverse transform sampling from a
uniform number of the given ``torch.Generator`` (same generator state -> same draw).

Before all of that, :func:`apply_repetition_penalty` (Keskar et al. 2019, CTRL, section 4.1) can
discourage tokens that already occur in the sequence: with a penalty ``theta > 1`` the logit
``z_i`` of every token present becomes ``z_i / theta`` if it is positive and ``z_i * theta`` if
it is negative, so the token always becomes *less* likely. (CTRL's paper divides every logit;
dividing a negative logit would make it *larger*, i.e. the repeated token more likely, the sign
bug that public reports found in several implementations.) ``theta = 1`` changes nothing.

:func:`next_token_distribution` returns that distribution (for plots and checks),
:func:`sample_next` draws from it, and :func:`next_token_distribution_np` is the float64 NumPy
reference written independently (the tests compare the two). Source: lesson 09.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["check_settings", "next_token_distribution", "sample_next", "next_token_distribution_np",
           "apply_repetition_penalty", "apply_repetition_penalty_np"]


def check_settings(temperature: float, top_k: int | None = None, top_p: float | None = None,
                   repetition_penalty: float = 1.0) -> None:
    """Raise ValueError for sampler settings no draw can use (naming the value); else return None.

    ``repetition_penalty`` must be a finite number > 0 (1 = off; > 1 discourages repeats)."""
    try:
        t = float(temperature)
    except (TypeError, ValueError):
        t = math.nan
    if not (math.isfinite(t) and t >= 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a whole number >= 1 (or None for all), got {top_k!r}")
    try:
        p = 0.5 if top_p is None else float(top_p)
    except (TypeError, ValueError):
        p = math.nan
    if not 0 < p <= 1:  # False for NaN too
        raise ValueError(f"top_p must lie in (0, 1] (or None for all), got {top_p!r}")
    try:
        theta = float(repetition_penalty)
    except (TypeError, ValueError):
        theta = math.nan
    if not (math.isfinite(theta) and theta > 0):
        raise ValueError("repetition_penalty must be a finite number > 0 (1 = off), got "
                         f"{repetition_penalty!r}")


def _present(previous_ids, n_vocab: int) -> np.ndarray:
    """The distinct ids of `previous_ids` as an int64 array, each checked to lie in the vocabulary."""
    if isinstance(previous_ids, torch.Tensor):
        previous_ids = previous_ids.detach().cpu().numpy()
    ids = np.unique(np.asarray(previous_ids).astype(np.int64).reshape(-1))
    if ids.size and (ids.min() < 0 or ids.max() >= n_vocab):
        raise ValueError(f"previous ids must lie in [0, {n_vocab}) (the logits' vocabulary), got "
                         f"{int(ids.min())} .. {int(ids.max())}")
    return ids


def apply_repetition_penalty(logits: torch.Tensor, previous_ids, penalty: float) -> torch.Tensor:
    """Penalise the tokens already in the sequence (CTRL's repetition penalty, sign-aware).

    For every token ``i`` among `previous_ids` (each counted once, however often it occurs)::

        z_i -> z_i / penalty   if z_i > 0
        z_i -> z_i * penalty   if z_i <= 0

    so with ``penalty > 1`` a repeated token always loses probability (a plain ``z_i / penalty``
    would *raise* a negative logit). Other tokens, and ``-inf`` logits, keep their value.

    Args:
        logits: ``(n_vocab,)`` float tensor, one row (the next token's logits).
        previous_ids: the ids of the sequence so far (prompt and generated), any integer
            sequence or tensor; may be empty.
        penalty: finite, > 0; 1 returns the logits unchanged.

    Returns:
        a new tensor, the shape and dtype of `logits`.

    Raises:
        ValueError: a penalty that :func:`check_settings` rejects, logits that are not one row,
            or an id outside ``[0, n_vocab)`` (the range named).

    Source: Keskar et al. 2019 (CTRL), section 4.1, with the sign handling of Hugging Face's
    ``RepetitionPenaltyLogitsProcessor``; lesson 02 (greedy decoding's loops).
    """
    check_settings(1.0, repetition_penalty=penalty)
    z = torch.as_tensor(logits)
    if z.ndim != 1:
        raise ValueError(f"logits must be one row (n_vocab,), got shape {tuple(z.shape)}")
    ids = torch.from_numpy(_present(previous_ids, z.shape[0])).to(z.device)
    out = z.clone()
    if penalty == 1 or ids.numel() == 0:
        return out
    picked = out[ids]                                                      # (n_present,)
    out[ids] = torch.where(picked > 0, picked / penalty, picked * penalty)
    return out


def apply_repetition_penalty_np(logits, previous_ids, penalty: float) -> np.ndarray:
    """Float64 NumPy reference of :func:`apply_repetition_penalty`, written as a loop over the
    distinct previous ids. Same arguments and errors; returns float64 ``(n_vocab,)``."""
    check_settings(1.0, repetition_penalty=penalty)
    z = np.array(logits, dtype=np.float64)
    if z.ndim != 1:
        raise ValueError(f"logits must be one row (n_vocab,), got shape {z.shape}")
    for i in _present(previous_ids, z.shape[0]):
        z[i] = z[i] / penalty if z[i] > 0 else z[i] * penalty
    return z


def next_token_distribution(logits: torch.Tensor, temperature: float = 1.0,
                            top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """The sampling distribution over the vocabulary after temperature, top-k and top-p.

    Args:
        logits: ``(..., n_vocab)`` float tensor (any float dtype; ``-inf`` marks a forbidden token).
        temperature: ``>= 0``; 0 is greedy (a one-hot at the first maximum).
        top_k: keep the ``k`` largest logits (ties broken by lowest index); None keeps all.
        top_p: keep the smallest highest-probability set whose mass reaches ``p``; None keeps all.

    Returns:
        ``(..., n_vocab)`` float64 probabilities summing to 1 along the last axis (zeros outside
        the kept set).

    Raises:
        ValueError: a negative, NaN or infinite temperature, ``top_k < 1``, ``top_p`` outside
            (0, 1], an empty vocabulary, or a row whose logits are all ``-inf`` or any NaN.
    """
    check_settings(temperature, top_k, top_p)
    z = torch.as_tensor(logits).detach().to(torch.float64)
    if z.ndim == 0 or z.shape[-1] == 0:
        raise ValueError(f"logits must have a vocabulary axis of size >= 1, got shape {tuple(z.shape)}")
    if torch.isnan(z).any():
        raise ValueError("logits contain NaN")
    top = z.max(dim=-1, keepdim=True).values                              # (..., 1)
    if torch.isneginf(top).any():
        raise ValueError("a row of logits is all -inf: no token can be chosen")
    n_vocab = z.shape[-1]
    if temperature == 0:
        return torch.nn.functional.one_hot(z.argmax(dim=-1), n_vocab).to(torch.float64)
    p = torch.softmax((z - top) / temperature, dim=-1)                    # (..., n_vocab)
    order = torch.sort(z, dim=-1, descending=True, stable=True).indices   # (..., n_vocab)
    sorted_p = p.gather(-1, order)
    keep = torch.ones_like(sorted_p, dtype=torch.bool)
    if top_k is not None and top_k < n_vocab:
        keep[..., top_k:] = False
    if top_p is not None and top_p < 1:
        kept = sorted_p * keep
        kept = kept / kept.sum(dim=-1, keepdim=True)
        mass_before = kept.cumsum(dim=-1) - kept                          # exclusive prefix sum
        keep &= mass_before < top_p
    sorted_p = sorted_p * keep
    out = torch.zeros_like(p).scatter(-1, order, sorted_p)
    return out / out.sum(dim=-1, keepdim=True)


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw the next token id from ``logits (..., n_vocab)``: int64 ids of shape ``(...)``.

    Greedy at ``temperature=0`` (no random number is drawn); otherwise one uniform number per row
    from ``generator`` (the global generator when None) picks an index by inverse transform over
    :func:`next_token_distribution`. Raises ValueError as that function does.
    """
    probs = next_token_distribution(logits, temperature, top_k, top_p)    # (..., n_vocab)
    if temperature == 0:
        return probs.argmax(dim=-1)
    u = torch.rand(probs.shape[:-1] + (1,), generator=generator, dtype=torch.float64)
    cdf = probs.cumsum(dim=-1)                                            # (..., n_vocab)
    ids = torch.searchsorted(cdf, u * cdf[..., -1:], right=True)          # first cdf > u
    last_kept = probs.shape[-1] - 1 - (probs > 0).flip(-1).to(torch.int64).argmax(-1, keepdim=True)
    return torch.minimum(ids, last_kept).squeeze(-1)                      # (...,) rounding guard


def next_token_distribution_np(logits, temperature: float = 1.0, top_k: int | None = None,
                               top_p: float | None = None) -> np.ndarray:
    """Float64 NumPy reference of :func:`next_token_distribution` for one row ``(n_vocab,)``.

    Written as the definition reads (a loop over the tokens in descending order of probability),
    as an independent oracle for the tests. Raises ValueError as the PyTorch version.
    """
    check_settings(temperature, top_k, top_p)
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim != 1 or z.size == 0:
        raise ValueError(f"logits must be one row (n_vocab,), got shape {z.shape}")
    out = np.zeros_like(z)
    if temperature == 0:
        out[int(np.argmax(z))] = 1.0
        return out
    e = np.exp((z - z.max()) / temperature)
    p = e / e.sum()
    order = np.argsort(-z, kind="stable")
    k = len(z) if top_k is None else min(top_k, len(z))
    survivors = order[:k]
    mass = p[survivors].sum()
    kept, before = [], 0.0
    for i in survivors:
        if top_p is not None and before >= top_p:
            break
        kept.append(i)
        before += p[i] / mass
    out[kept] = p[kept]
    return out / out.sum()
