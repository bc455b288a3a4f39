"""Scaled dot-product attention (lesson 02), in PyTorch and as a float64 NumPy reference.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V            Vaswani et al. 2017, eq. (1)

Masks are boolean, ``True`` = may attend (see :mod:`txlearn.masks`). A query whose keys are all
masked has no distribution to average with; the course defines its output as 0 (all its weights
0) and keeps its gradients finite, where a plain ``softmax`` over a row of ``-inf`` gives NaN.

Precision: float16 and bfloat16 inputs are computed in float32 (:mod:`txlearn.precision`) and the
results rounded once to the input's dtype. The scores need it: softmax turns an error delta in a
score into a relative error of about delta in its weight, and a bfloat16 score near 100 is
rounded by up to 0.25 (``tests/test_precision.py`` measures it on large, close logits). The cost
is the (L, S) scores held in float32, twice the bytes of float16 ones.

The backward pass (lesson 02, section 9) is written out by hand in :func:`attention_backward`
and its NumPy twin: with ``Z = Q K^T / sqrt(d_k)``, ``P = softmax(Z)``, ``O = P V`` and the
upstream gradient ``dO``,

    dV = P^T dO,   dP = dO V^T,   dZ = P * (dP - rowsum(dP * P)),
    dQ = dZ K / sqrt(d_k),   dK = dZ^T Q / sqrt(d_k).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from txlearn.precision import compute_dtype, upcast
from txlearn.softmax import softmax_vjp, softmax_vjp_np

__all__ = ["masked_softmax", "scaled_dot_product_attention", "attention_np", "masked_softmax_np",
           "check_mask", "attention_backward", "attention_backward_np"]


def check_mask(mask, scores_shape: tuple, is_bool: bool) -> None:
    """Check an attention mask against the scores it masks (every attention of the course uses
    this one rule): it must be boolean (True = may attend; ``is_bool`` says whether its dtype is
    the framework's bool) and broadcast to ``scores_shape`` ``(..., L, S)`` exactly.

    Raises:
        ValueError: a mask that is not boolean (naming its dtype, and how to turn an additive
            float mask into a boolean one), or whose shape does not broadcast to the scores'
            (naming both shapes).
    """
    if not is_bool:
        raise ValueError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}; "
                         "for an additive float mask m use `m == 0` to get the boolean one")
    try:
        full = tuple(np.broadcast_shapes(tuple(mask.shape), tuple(scores_shape)))
    except ValueError:
        full = None
    if full != tuple(scores_shape):
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to the scores' "
                         f"shape {tuple(scores_shape)} (..., L, S)")


def _check_qkv(Q_shape, K_shape, V_shape) -> None:
    if len(Q_shape) < 2 or len(K_shape) < 2 or len(V_shape) < 2:
        raise ValueError(f"Q, K, V need at least 2 dims (..., T, d), got Q {tuple(Q_shape)}, "
                         f"K {tuple(K_shape)}, V {tuple(V_shape)}")
    if Q_shape[-1] != K_shape[-1]:
        raise ValueError(f"d_k of Q and K differ: Q {tuple(Q_shape)} has d_k={Q_shape[-1]}, "
                         f"K {tuple(K_shape)} has d_k={K_shape[-1]}")
    if K_shape[-2] != V_shape[-2]:
        raise ValueError(f"K and V must have the same number of keys S: K {tuple(K_shape)}, "
                         f"V {tuple(V_shape)}")


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None = None,
                   dim: int = -1) -> torch.Tensor:
    """Softmax of `scores` along `dim` over the allowed entries only.

        w_ij = mask_ij exp(s_ij - m_i) / sum_j' mask_ij' exp(s_ij' - m_i),   m_i = max allowed s_ij

    Hidden entries get weight exactly 0. A row with no allowed entry gets all zeros (not NaN),
    and its gradient is 0. The max-shift ``m_i`` (lesson 01) keeps ``exp`` from overflowing;
    it is ``torch.softmax``'s fused kernel (tested equal to lesson 01's softmax and to the
    float64 reference :func:`masked_softmax_np`), one pass instead of five over the T x T scores.
    float16 and bfloat16 scores are exponentiated and summed in float32 (``torch.softmax``'s
    ``dtype=`` argument) and the weights rounded once to their dtype.

    Args:
        scores: float tensor ``(..., L, S)``, any floating dtype.
        mask: bool, broadcastable to `scores`, ``True`` = allowed; ``None`` = all allowed.
        dim: the axis that sums to 1 (the keys' axis, -1, in attention).

    Returns:
        tensor of `scores`' shape and dtype; each row sums to 1, or to 0 if fully masked.

    Raises:
        ValueError: `mask` is not boolean, or does not broadcast to `scores` (shapes named).
    """
    work = compute_dtype(scores.dtype)  # float32 for float16/bfloat16 scores
    if mask is None:  # the max-shifted softmax of lesson 01, one kernel
        return torch.softmax(scores, dim=dim, dtype=work).to(scores.dtype)
    check_mask(mask, scores.shape, mask.dtype == torch.bool)
    empty = ~mask.any(dim=dim, keepdim=True)  # (..., L, 1) rows with no allowed key
    scores = scores.masked_fill(~mask, float("-inf"))  # hidden entries: exp(-inf) = 0
    scores = scores.masked_fill(empty, 0.0)  # an empty row: finite softmax, zeroed just below
    weights = torch.softmax(scores, dim=dim, dtype=work).masked_fill(empty, 0.0)  # 0 weights, 0 grad
    return weights.to(scores.dtype)


def scaled_dot_product_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
                                 mask: torch.Tensor | None = None, return_weights: bool = False):
    """Scaled dot-product attention, ``softmax(Q K^T / sqrt(d_k)) V`` with a boolean mask.

    Args:
        Q: queries ``(..., L, d_k)``, float16, bfloat16, float32 or float64.
        K: keys ``(..., S, d_k)``, same dtype.
        V: values ``(..., S, d_v)``, same dtype.
        mask: bool, broadcastable to ``(..., L, S)``, ``True`` = query i may attend to key j
            (the polarity of ``F.scaled_dot_product_attention``'s boolean ``attn_mask``).
        return_weights: also return the attention weights.

    Returns:
        ``out (..., L, d_v)``, or ``(out, weights (..., L, S))`` if `return_weights`, in the
        dtype of Q (computed in float32 for float16 and bfloat16, see the module's docstring).
        Rows of `weights` sum to 1; a fully masked query gets weights 0 and output 0.

    Raises:
        ValueError: d_k of Q and K differ, K and V have different S, Q, K and V have different
            dtypes, or the mask is not boolean or does not broadcast to ``(..., L, S)`` (the
            shapes and dtypes are named).

    Source: Vaswani et al. 2017, section 3.2.1, eq. (1); lesson 02.
    """
    _check_qkv(Q.shape, K.shape, V.shape)
    if not Q.dtype == K.dtype == V.dtype:
        raise ValueError(f"Q, K and V must share one dtype, got Q {Q.dtype}, K {K.dtype}, "
                         f"V {V.dtype}")
    dtype, d_k = Q.dtype, Q.shape[-1]
    Q, K, V = upcast(Q), upcast(K), upcast(V)  # float32 for float16/bfloat16 (module docstring)
    # Q K^T / sqrt(d_k), with the scale applied to Q (L x d_k numbers) rather than to the scores
    # (L x S numbers): the same product, one pass fewer over the large matrix.
    scores = (Q / math.sqrt(d_k)) @ K.transpose(-2, -1)  # (..., L, d_k) @ (..., d_k, S) -> (..., L, S)
    weights = masked_softmax(scores, mask, dim=-1)  # (..., L, S)
    del scores  # free the L x S scores before the next product (peak memory: one matrix fewer)
    out = (weights @ V).to(dtype)  # (..., L, S) @ (..., S, d_v) -> (..., L, d_v)
    return (out, weights.to(dtype)) if return_weights else out


def masked_softmax_np(scores: np.ndarray, mask: np.ndarray | None = None,
                      axis: int = -1) -> np.ndarray:
    """float64 NumPy reference of :func:`masked_softmax` (fully masked rows give 0).

    Raises:
        ValueError: as :func:`masked_softmax`.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if mask is None:
        mask = np.ones(scores.shape, dtype=bool)
    mask = np.asarray(mask)
    check_mask(mask, scores.shape, mask.dtype == np.bool_)
    mask = np.broadcast_to(mask, scores.shape)
    s = np.where(mask, scores, -np.inf)
    m = s.max(axis=axis, keepdims=True, initial=-np.inf)  # -inf for no keys (S = 0) too
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(mask, np.exp(s - m), 0.0)
    denom = e.sum(axis=axis, keepdims=True)
    return np.divide(e, denom, out=np.zeros_like(e), where=denom > 0)


def attention_np(Q, K, V, mask=None, return_weights: bool = False):
    """float64 NumPy reference of :func:`scaled_dot_product_attention` (same shapes, same
    conventions, same errors). Inputs are converted to float64 arrays.
    """
    Q, K, V = (np.asarray(a, dtype=np.float64) for a in (Q, K, V))
    _check_qkv(Q.shape, K.shape, V.shape)
    d_k = Q.shape[-1]
    scores = Q @ np.swapaxes(K, -2, -1) / np.sqrt(d_k)  # (..., L, S)
    weights = masked_softmax_np(scores, mask, axis=-1)  # (..., L, S)
    out = weights @ V  # (..., L, d_v)
    return (out, weights) if return_weights else out


# --------------------------------------------------------------------------- the backward pass

def _check_grad_out(dO_shape, out_shape) -> None:
    if tuple(dO_shape) != tuple(out_shape):
        raise ValueError(f"dO has shape {tuple(dO_shape)}, but the attention output of these Q, K, "
                         f"V has shape {tuple(out_shape)} (..., L, d_v)")


def _check_weights(P_shape, scores_shape) -> None:
    if tuple(P_shape) != tuple(scores_shape):
        raise ValueError(f"weights of shape {tuple(P_shape)} do not match the scores' shape "
                         f"{tuple(scores_shape)} (..., L, S) of these Q and K")


def _sum_to(grad, shape: tuple):
    """`grad` summed over the axes along which an input of `shape` was broadcast (NumPy or torch):
    an input used by several heads (K shared by a group of query heads) gets the sum of their
    gradients."""
    lead = grad.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape)
                                      if n == 1 and grad.shape[lead + i] != 1)
    if not axes:
        return grad
    if isinstance(grad, np.ndarray):
        return grad.sum(axis=axes, keepdims=True).reshape(shape)
    return grad.sum(dim=axes, keepdim=True).reshape(shape)


def attention_backward(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, dO: torch.Tensor,
                       mask: torch.Tensor | None = None, weights: torch.Tensor | None = None):
    """Gradients of scaled dot-product attention, written by hand: ``(dQ, dK, dV)``.

    Forward (:func:`scaled_dot_product_attention`): ``Z = Q K^T / sqrt(d_k)``,
    ``P = masked_softmax(Z, mask)``, ``O = P V``. Backward, one product at a time (each line is
    the chain rule through one forward line, lesson 02, section 9):

        dV = P^T dO                       O_l = sum_s P_ls V_s, so dV_s = sum_l P_ls dO_l
        dP = dO V^T                       (..., L, S)
        dZ = P * (dP - rowsum(dP * P))    the softmax's vector-Jacobian product, per query row
        dQ = dZ K / sqrt(d_k),   dK = dZ^T Q / sqrt(d_k)

    Masks: a masked entry has ``P = 0``, so ``dZ = 0`` there: no gradient flows into a key a
    query may not see, and a fully masked row (all its P are 0) gets ``dQ = 0`` and sends
    nothing to any key or value, never NaN. Broadcasting: Q, K and V may broadcast over their
    leading axes (a K of shape ``(B, n_kv_heads, 1, S, d_k)`` against a Q of
    ``(B, n_kv_heads, n_rep, L, d_k)`` is grouped-query attention); each gradient is summed back
    to its input's shape.

    What is saved: ``weights=`` takes the P the forward kept (``return_weights=True``), an
    ``(..., L, S)`` tensor, the memory that makes ordinary attention's training quadratic in T;
    ``weights=None`` recomputes P from Q and K (FlashAttention's trade: FLOPs for memory).

    Args:
        Q: ``(..., L, d_k)``; K: ``(..., S, d_k)``; V: ``(..., S, d_v)``, one floating dtype.
        dO: dLoss/dO, the shape of the output, ``(..., L, d_v)`` broadcast over the leading axes.
        mask: bool broadcastable to ``(..., L, S)``, True = may attend; None = no mask.
        weights: the forward's P ``(..., L, S)``, or None to recompute it.

    Returns:
        ``(dQ, dK, dV)`` of the shapes and dtype of Q, K, V; float16 and bfloat16 are computed
        in float32 and rounded once. Differentiable (plain tensor operations).

    Raises:
        ValueError: mismatched shapes of Q, K, V, dO or weights (all named), differing dtypes,
            or a mask that is not boolean or does not broadcast.

    Source: Vaswani et al. 2017, eq. 1, differentiated; lesson 02, section 9; tested against
    ``torch.autograd`` and ``torch.autograd.gradcheck``.
    """
    _check_qkv(Q.shape, K.shape, V.shape)
    if not Q.dtype == K.dtype == V.dtype:
        raise ValueError(f"Q, K and V must share one dtype, got Q {Q.dtype}, K {K.dtype}, "
                         f"V {V.dtype}")
    lead = torch.broadcast_shapes(Q.shape[:-2], K.shape[:-2], V.shape[:-2])
    _check_grad_out(dO.shape, (*lead, Q.shape[-2], V.shape[-1]))
    dtype, scale = Q.dtype, 1.0 / math.sqrt(Q.shape[-1])
    Qc, Kc, Vc, dOc = upcast(Q), upcast(K), upcast(V), upcast(dO).to(upcast(Q).dtype)
    if weights is None:  # recompute P from Q and K, as the forward did
        P = masked_softmax((Qc * scale) @ Kc.transpose(-2, -1), mask)  # (..., L, S)
    else:
        _check_weights(weights.shape, (*lead, Q.shape[-2], K.shape[-2]))
        P = upcast(weights).to(Qc.dtype)
    dV = P.transpose(-2, -1) @ dOc  # (..., S, L) @ (..., L, d_v) -> (..., S, d_v)
    dP = dOc @ Vc.transpose(-2, -1)  # (..., L, d_v) @ (..., d_v, S) -> (..., L, S)
    dZ = softmax_vjp(P, dP)  # (..., L, S); 0 wherever P is 0 (masked keys, empty rows)
    dQ = (dZ @ Kc) * scale  # (..., L, S) @ (..., S, d_k) -> (..., L, d_k)
    dK = (dZ.transpose(-2, -1) @ Qc) * scale  # (..., S, L) @ (..., L, d_k) -> (..., S, d_k)
    return (_sum_to(dQ, tuple(Q.shape)).to(dtype), _sum_to(dK, tuple(K.shape)).to(dtype),
            _sum_to(dV, tuple(V.shape)).to(dtype))


def attention_backward_np(Q, K, V, dO, mask=None, weights=None):
    """float64 NumPy reference of :func:`attention_backward` (same equations, shapes, masks,
    broadcasting and errors): returns ``(dQ, dK, dV)`` as float64 arrays.

    Source: lesson 02, section 9.
    """
    Q, K, V, dO = (np.asarray(a, dtype=np.float64) for a in (Q, K, V, dO))
    _check_qkv(Q.shape, K.shape, V.shape)
    lead = np.broadcast_shapes(Q.shape[:-2], K.shape[:-2], V.shape[:-2])
    _check_grad_out(dO.shape, (*lead, Q.shape[-2], V.shape[-1]))
    scale = 1.0 / math.sqrt(Q.shape[-1])
    if weights is None:
        P = masked_softmax_np(Q @ np.swapaxes(K, -2, -1) * scale, mask)  # (..., L, S)
    else:
        P = np.asarray(weights, dtype=np.float64)
        _check_weights(P.shape, (*lead, Q.shape[-2], K.shape[-2]))
    dV = np.swapaxes(P, -2, -1) @ dO  # (..., S, d_v)
    dP = dO @ np.swapaxes(V, -2, -1)  # (..., L, S)
    dZ = softmax_vjp_np(P, dP)  # (..., L, S)
    dQ = dZ @ K * scale  # (..., L, d_k)
    dK = np.swapaxes(dZ, -2, -1) @ Q * scale  # (..., S, d_k)
    return _sum_to(dQ, Q.shape), _sum_to(dK, K.shape), _sum_to(dV, V.shape)
