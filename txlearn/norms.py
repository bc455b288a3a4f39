"""Lesson 06: LayerNorm, RMSNorm and the residual sub-layer connection (post-LN and pre-LN).

Equations (d = d_model, the last axis; statistics are per token, over features only):

    LayerNorm(x) = gamma * (x - mu) / sqrt(sigma^2 + eps) + beta
        mu = mean(x),  sigma^2 = mean((x - mu)^2)        (biased variance: divide by d, not d - 1)
    RMSNorm(x)   = gamma * x / sqrt(mean(x^2) + eps)      (no mean subtracted, no beta)

eps sits *inside* the square root (as in ``torch.nn.LayerNorm`` and ``torch.nn.RMSNorm``).

Precision: the statistics (and the whole normalisation) are computed in float32 for float16 and
bfloat16 inputs, and the result is returned in the input's dtype, as ``F.layer_norm`` and
``F.rms_norm`` do. In float16 a sum of squares overflows early: ``[300, 400]`` has
300^2 + 400^2 = 250,000 > 65,504, float16's largest number, and RMSNorm computed in float16
returns ``[0, 0]`` instead of ``[0.8485, 1.1314]`` (lesson 06 measures it).
Sources: Ba, Kiros, Hinton 2016, "Layer Normalization", eq. 4; Zhang and Sennrich 2019,
"Root Mean Square Layer Normalization", eq. 4; Vaswani et al. 2017, section 3.1 (post-LN
``LayerNorm(x + Sublayer(x))``); Xiong et al. 2020, "On Layer Normalization in the Transformer
Architecture" (pre-LN ``x + Sublayer(LayerNorm(x))``).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from txlearn.precision import upcast

__all__ = [
    "layer_norm_np",
    "rms_norm_np",
    "layer_norm",
    "rms_norm",
    "LayerNorm",
    "RMSNorm",
    "residual",
    "residual_np",
]


def _check_feature_dim(x_shape: tuple, d: int, what: str) -> None:
    if len(x_shape) == 0 or x_shape[-1] != d:
        raise ValueError(f"{what} normalises over d_model={d}, but the input has shape "
                         f"{tuple(x_shape)} (last dimension must be {d})")


def layer_norm_np(x, gamma=None, beta=None, eps: float = 1e-5) -> np.ndarray:
    """LayerNorm over the last axis, float64 NumPy reference.

    ``gamma * (x - mu) / sqrt(sigma^2 + eps) + beta`` with mu, sigma^2 the mean and *biased*
    variance of the last axis (Ba et al. 2016, eq. 4; lesson 06).

    Args:
        x: array (..., d_model), any float dtype; computed in float64.
        gamma, beta: arrays (d_model,) or None (1 and 0).
        eps: added to the variance inside the square root (dimensionless).
    Returns:
        float64 array, same shape as `x`.
    Raises:
        ValueError: `gamma` or `beta` does not have shape (d_model,) for the last axis of `x`.
    """
    x = np.asarray(x, dtype=np.float64)
    for name, p in (("gamma", gamma), ("beta", beta)):
        if p is not None and np.shape(p) != (x.shape[-1],):
            raise ValueError(f"layer_norm_np: {name} has shape {np.shape(p)}, but x has shape "
                             f"{x.shape}: expected ({x.shape[-1]},)")
    mu = x.mean(axis=-1, keepdims=True)                       # (..., 1)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)        # (..., 1) biased
    y = (x - mu) / np.sqrt(var + eps)
    if gamma is not None:
        y = y * np.asarray(gamma, dtype=np.float64)
    if beta is not None:
        y = y + np.asarray(beta, dtype=np.float64)
    return y


def rms_norm_np(x, gamma=None, eps: float = 1e-6) -> np.ndarray:
    """RMSNorm over the last axis, float64 NumPy reference.

    ``gamma * x / sqrt(mean(x^2) + eps)`` (Zhang and Sennrich 2019, eq. 4; lesson 06).

    Args:
        x: array (..., d_model); computed in float64.
        gamma: array (d_model,) or None (ones).
        eps: added to the mean square inside the square root.
    Returns:
        float64 array, same shape as `x`.
    Raises:
        ValueError: `gamma` does not have shape (d_model,).
    """
    x = np.asarray(x, dtype=np.float64)
    if gamma is not None and np.shape(gamma) != (x.shape[-1],):
        raise ValueError(f"rms_norm_np: gamma has shape {np.shape(gamma)}, but x has shape "
                         f"{x.shape}: expected ({x.shape[-1]},)")
    rms = np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + eps)    # (..., 1)
    y = x / rms
    return y * np.asarray(gamma, dtype=np.float64) if gamma is not None else y


def layer_norm(x: torch.Tensor, gamma: torch.Tensor | None = None,
               beta: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dimension (PyTorch, differentiable); see :func:`layer_norm_np`.

    Args: x (..., d_model) float tensor; gamma, beta (d_model,) or None, any float dtype.
    Returns x's shape and dtype, computed in float32 for float16 and bfloat16 (the variance of
    ``[1000, -1000, 1000, -1000]``, 10^6, overflows float16). Raises ValueError when gamma/beta
    do not match the last dimension of x.
    """
    for name, p in (("gamma", gamma), ("beta", beta)):
        if p is not None:
            _check_feature_dim(tuple(x.shape), p.shape[-1] if p.dim() else -1, f"layer_norm's {name}")
    xc = upcast(x)                                            # float32 for float16/bfloat16
    mu = xc.mean(dim=-1, keepdim=True)                        # (..., 1)
    var = ((xc - mu) ** 2).mean(dim=-1, keepdim=True)         # (..., 1) biased
    y = (xc - mu) / torch.sqrt(var + eps)
    if gamma is not None:
        y = y * gamma.to(y.dtype)
    if beta is not None:
        y = y + beta.to(y.dtype)
    return y.to(x.dtype)


def rms_norm(x: torch.Tensor, gamma: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension (PyTorch, differentiable); see :func:`rms_norm_np`.

    Args: x (..., d_model); gamma (d_model,) or None. Returns x's shape and dtype, computed in
    float32 for float16 and bfloat16 (the mean square of ``[300, 400]`` overflows float16).
    Raises ValueError when gamma does not match the last dimension of x.
    """
    if gamma is not None:
        _check_feature_dim(tuple(x.shape), gamma.shape[-1] if gamma.dim() else -1, "rms_norm's gamma")
    xc = upcast(x)                                                # float32 for float16/bfloat16
    rms = torch.sqrt((xc ** 2).mean(dim=-1, keepdim=True) + eps)  # (..., 1)
    y = xc / rms
    return (y * gamma.to(y.dtype) if gamma is not None else y).to(x.dtype)


class LayerNorm(nn.Module):
    """LayerNorm(x) = gamma * (x - mu) / sqrt(sigma^2 + eps) + beta over the last dimension.

    Biased variance, eps inside the square root: equal to ``torch.nn.LayerNorm(d_model, eps)``
    (tested). Parameters ``gamma`` (d_model,) initialised to 1 and ``beta`` (d_model,) to 0.
    ``fused=False`` (default) computes the equation above with :func:`layer_norm` (the teaching
    path); ``fused=True`` calls PyTorch's one-kernel ``F.layer_norm`` (the fast path for training,
    tested equal, gradients included).

    forward(x): x (..., d_model) -> (..., d_model), same dtype; statistics in float32 for
    float16 and bfloat16 (:func:`layer_norm`).
    Raises ValueError when the last dimension of x is not d_model (naming both).
    Source: Ba et al. 2016, eq. 4; lesson 06.
    """

    def __init__(self, d_model: int, eps: float = 1e-5, fused: bool = False):
        super().__init__()
        if d_model < 1:
            raise ValueError(f"LayerNorm: d_model must be positive, got {d_model}")
        self.d_model, self.eps, self.fused = d_model, eps, fused
        self.gamma = nn.Parameter(torch.ones(d_model))
        self.beta = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_feature_dim(tuple(x.shape), self.d_model, "LayerNorm")
        if self.fused:
            return F.layer_norm(x, (self.d_model,), self.gamma, self.beta, self.eps)
        return layer_norm(x, self.gamma, self.beta, self.eps)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, eps={self.eps}"


class RMSNorm(nn.Module):
    """RMSNorm(x) = gamma * x / sqrt(mean(x^2) + eps) over the last dimension.

    No mean subtraction and no beta. Equal to ``torch.nn.RMSNorm(d_model, eps=eps)`` (tested).
    Parameter ``gamma`` (d_model,) initialised to 1.

    forward(x): x (..., d_model) -> (..., d_model), same dtype; statistics in float32 for
    float16 and bfloat16 (:func:`rms_norm`).
    Raises ValueError when the last dimension of x is not d_model (naming both).
    Source: Zhang and Sennrich 2019, eq. 4; lesson 06.
    """

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        if d_model < 1:
            raise ValueError(f"RMSNorm: d_model must be positive, got {d_model}")
        self.d_model, self.eps = d_model, eps
        self.gamma = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_feature_dim(tuple(x.shape), self.d_model, "RMSNorm")
        return rms_norm(x, self.gamma, self.eps)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, eps={self.eps}"


def residual(x, sublayer: Callable, norm: Callable, order: str = "post"):
    """The residual sub-layer connection, in either order.

        order="post":  LayerNorm(x + Sublayer(x))     (Vaswani et al. 2017, section 3.1; default)
        order="pre":   x + Sublayer(LayerNorm(x))     (Xiong et al. 2020; GPT-2 onwards)

    Args:
        x: tensor or array (..., d_model).
        sublayer: callable (..., d_model) -> (..., d_model), e.g. attention or the FFN.
        norm: callable (..., d_model) -> (..., d_model), e.g. a :class:`LayerNorm`.
        order: "post" or "pre".
    Returns: same shape as x.
    Raises: ValueError for another `order`, or when `sublayer` changes the shape of x.
    Source: lesson 06.
    """
    if order not in ("post", "pre"):
        raise ValueError(f"residual: order must be 'post' or 'pre', got {order!r}")
    if order == "post":
        h = sublayer(x)
        _same_shape(x, h)
        return norm(x + h)
    h = sublayer(norm(x))
    _same_shape(x, h)
    return x + h


def _same_shape(x, h) -> None:
    if tuple(x.shape) != tuple(h.shape):
        raise ValueError(f"residual: the sub-layer maps shape {tuple(x.shape)} to "
                         f"{tuple(h.shape)}; a residual connection needs the same shape")


def residual_np(x, sublayer: Callable, norm: Callable = layer_norm_np,
                order: str = "post") -> np.ndarray:
    """NumPy version of :func:`residual` (float64); `norm` defaults to :func:`layer_norm_np`."""
    return residual(np.asarray(x, dtype=np.float64), sublayer, norm, order)
