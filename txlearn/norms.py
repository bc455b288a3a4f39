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
Backward passes (lesson 06, section 6), with xhat the normalised input, r = 1/sqrt(var + eps)
(LayerNorm) or 1/sqrt(mean(x^2) + eps) (RMSNorm) and dxhat = gamma * dy:

    LayerNorm:  dx = r * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
    RMSNorm:    dx = r * (dxhat - xhat * mean(dxhat * xhat))
    dgamma = sum over tokens of dy * xhat,   dbeta = sum over tokens of dy

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
    "layer_norm_backward",
    "layer_norm_backward_np",
    "rms_norm_backward",
    "rms_norm_backward_np",
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


# --------------------------------------------------------------------------- backward passes

def _check_backward_shapes(what: str, x_shape: tuple, dy_shape: tuple, gamma_shape) -> None:
    if tuple(x_shape) != tuple(dy_shape) or len(x_shape) == 0:
        raise ValueError(f"{what}: x {tuple(x_shape)} and dy {tuple(dy_shape)} must have the same "
                         "shape (..., d_model)")
    if gamma_shape is not None and tuple(gamma_shape) != (x_shape[-1],):
        raise ValueError(f"{what}: gamma has shape {tuple(gamma_shape)}, but x has shape "
                         f"{tuple(x_shape)}: expected ({x_shape[-1]},)")


def _token_axes(ndim: int) -> tuple:
    return tuple(range(ndim - 1))  # every axis but the features: gamma is shared by all tokens


def _sum_tokens(t: torch.Tensor) -> torch.Tensor:
    """`t` summed over every axis but the last (``sum(dim=())`` would sum over all of them)."""
    return t.sum(dim=_token_axes(t.dim())) if t.dim() > 1 else t


def layer_norm_backward_np(x, gamma, dy, eps: float = 1e-5):
    """Backward pass of LayerNorm over the last axis, float64 NumPy: ``(dx, dgamma, dbeta)``.

    Forward: ``y = gamma * xhat + beta``, ``xhat = (x - mu) r``, ``r = 1 / sqrt(sigma^2 + eps)``,
    mu and sigma^2 the mean and biased variance of the token's d features. Derivation (lesson
    06, section 6): ``dxhat_i/dx_j = r (delta_ij - 1/d) + (x_i - mu) dr/dx_j`` with
    ``dr/dx_j = -r^3 (x_j - mu) / d``, so ``dxhat_i/dx_j = r (delta_ij - 1/d - xhat_i xhat_j / d)``
    and, with ``dxhat = gamma * dy``,

        dx = r * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))

    The matrix ``I - 1 1^T / d - xhat xhat^T / d`` removes the component of dxhat along 1
    (exactly: dx sums to 0 over the features) and along xhat (up to the factor
    ``eps / (sigma^2 + eps)``, since ``|xhat|^2 = d sigma^2 / (sigma^2 + eps)``): a gradient
    step cannot move a token's mean or scale, which the forward removes anyway.
    ``dgamma = sum_tokens dy * xhat`` and ``dbeta = sum_tokens dy`` (summed over every axis but
    the last). What the backward reuses from the forward: xhat (or x) and r, one number per
    token.

    Args:
        x: the forward's input ``(..., d_model)``; gamma: ``(d_model,)`` or None (ones);
        dy: dLoss/dy, the shape of x; eps: as in the forward (inside the square root).

    Returns:
        ``(dx (..., d_model), dgamma (d_model,), dbeta (d_model,))``, float64.

    Raises:
        ValueError: x and dy differ in shape, or gamma is not ``(d_model,)`` (shapes named).

    Source: Ba et al. 2016, eq. 4, differentiated; lesson 06, section 6.
    """
    x, dy = np.asarray(x, dtype=np.float64), np.asarray(dy, dtype=np.float64)
    _check_backward_shapes("layer_norm_backward_np", x.shape, dy.shape,
                           None if gamma is None else np.shape(gamma))
    gamma = np.ones(x.shape[-1]) if gamma is None else np.asarray(gamma, dtype=np.float64)
    mu = x.mean(axis=-1, keepdims=True)  # (..., 1)
    r = 1.0 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps)  # (..., 1) biased var
    xhat = (x - mu) * r  # (..., d_model)
    dxhat = dy * gamma
    dx = r * (dxhat - dxhat.mean(axis=-1, keepdims=True)
              - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    axes = _token_axes(x.ndim)
    return dx, (dy * xhat).sum(axis=axes), dy.sum(axis=axes)


def rms_norm_backward_np(x, gamma, dy, eps: float = 1e-6):
    """Backward pass of RMSNorm over the last axis, float64 NumPy: ``(dx, dgamma)``.

    Forward: ``y = gamma * xhat``, ``xhat = x r``, ``r = 1 / sqrt(mean(x^2) + eps)``. Derivation
    as for LayerNorm without the mean: ``dxhat_i/dx_j = r (delta_ij - xhat_i xhat_j / d)``, so

        dx = r * (dxhat - xhat * mean(dxhat * xhat)),     dxhat = gamma * dy

    which removes (up to ``eps / (mean(x^2) + eps)``) only the component along xhat: RMSNorm
    keeps the mean, and its gradient can move it. ``dgamma = sum_tokens dy * xhat``; there is no
    beta.

    Args, raises: as :func:`layer_norm_backward_np`.
    Returns: ``(dx (..., d_model), dgamma (d_model,))``, float64.
    Source: Zhang and Sennrich 2019, eq. 4, differentiated; lesson 06, section 6.
    """
    x, dy = np.asarray(x, dtype=np.float64), np.asarray(dy, dtype=np.float64)
    _check_backward_shapes("rms_norm_backward_np", x.shape, dy.shape,
                           None if gamma is None else np.shape(gamma))
    gamma = np.ones(x.shape[-1]) if gamma is None else np.asarray(gamma, dtype=np.float64)
    r = 1.0 / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + eps)  # (..., 1)
    xhat = x * r
    dxhat = dy * gamma
    dx = r * (dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=_token_axes(x.ndim))


def _torch_backward_inputs(what, x, gamma, dy):
    if not isinstance(x, torch.Tensor) or not isinstance(dy, torch.Tensor):
        raise ValueError(f"{what}: x and dy must be torch tensors (use {what}_np for NumPy)")
    _check_backward_shapes(what, tuple(x.shape), tuple(dy.shape),
                           None if gamma is None else tuple(gamma.shape))
    xc = upcast(x)  # float32 for float16/bfloat16
    g = torch.ones(x.shape[-1], dtype=xc.dtype) if gamma is None else gamma.to(xc.dtype)
    return xc, g, dy.to(xc.dtype)


def layer_norm_backward(x: torch.Tensor, gamma: torch.Tensor | None, dy: torch.Tensor,
                        eps: float = 1e-5):
    """PyTorch version of :func:`layer_norm_backward_np` (same equations, shapes and source):
    ``(dx, dgamma, dbeta)``.

    Returns dx in x's dtype and dgamma, dbeta in gamma's (x's when gamma is None), computed in
    float32 for float16 and bfloat16, as the forward. Differentiable (plain tensor operations).
    Raises ValueError for tensors of mismatched shapes (named). Tested equal to autograd of
    :func:`layer_norm` and of ``F.layer_norm``.
    """
    xc, g, dyc = _torch_backward_inputs("layer_norm_backward", x, gamma, dy)
    mu = xc.mean(dim=-1, keepdim=True)  # (..., 1)
    r = torch.rsqrt(((xc - mu) ** 2).mean(dim=-1, keepdim=True) + eps)  # (..., 1) biased var
    xhat = (xc - mu) * r
    dxhat = dyc * g
    dx = r * (dxhat - dxhat.mean(dim=-1, keepdim=True)
              - xhat * (dxhat * xhat).mean(dim=-1, keepdim=True))
    out = x.dtype if gamma is None else gamma.dtype
    return dx.to(x.dtype), _sum_tokens(dyc * xhat).to(out), _sum_tokens(dyc).to(out)


def rms_norm_backward(x: torch.Tensor, gamma: torch.Tensor | None, dy: torch.Tensor,
                      eps: float = 1e-6):
    """PyTorch version of :func:`rms_norm_backward_np`: ``(dx, dgamma)``, dtypes as
    :func:`layer_norm_backward`. Tested equal to autograd of :func:`rms_norm` and of
    ``F.rms_norm``.
    """
    xc, g, dyc = _torch_backward_inputs("rms_norm_backward", x, gamma, dy)
    r = torch.rsqrt((xc ** 2).mean(dim=-1, keepdim=True) + eps)  # (..., 1)
    xhat = xc * r
    dxhat = dyc * g
    dx = r * (dxhat - xhat * (dxhat * xhat).mean(dim=-1, keepdim=True))
    out = x.dtype if gamma is None else gamma.dtype
    return dx.to(x.dtype), _sum_tokens(dyc * xhat).to(out)
