"""Softmax, log-softmax and the 1/sqrt(d_k) scale (lesson 01).

Each equation exists twice: a float64 NumPy reference (suffix ``_np``, for derivations and as a
test oracle) and a PyTorch function (for autograd and training). They are tested equal, and the
PyTorch ones are tested against ``torch.softmax`` and ``torch.log_softmax``.

    softmax(x)_i     = exp(x_i / tau) / sum_j exp(x_j / tau)
    log_softmax(x)_i = x_i / tau - log sum_j exp(x_j / tau)

Both are computed after subtracting the maximum along the axis (the max-shift): the result is
unchanged, because softmax(x) = softmax(x - c) for any constant c, and exp() of a number <= 0 can
neither overflow nor make every term 0. Lesson 01 measures what happens without it. The shift is
taken before dividing by tau, ``z = (x - max x) / tau``: the same numbers (max(x / tau) =
max(x) / tau for tau > 0), but the difference of two close logits is exact in floating point,
while ``x / tau`` would round each large logit first (a logit near 30,000 divided by 0.4 even
overflows float16).

The PyTorch functions take float16 and bfloat16 tensors and compute in float32
(:mod:`txlearn.precision`), returning the input's dtype.

The backward pass is the vector-Jacobian product (lesson 01 derives it):

    dx = J^T g = s * (g - <s, g>),     J = diag(s) - s s^T

computed in O(n) per vector, without the n x n Jacobian.

Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.2.1 (equation 1 and
footnote 4 for the 1/sqrt(d_k) scale); ``notebooks/01_softmax.ipynb``.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from txlearn.precision import upcast

__all__ = [
    "softmax", "log_softmax", "softmax_np", "log_softmax_np", "naive_softmax_np",
    "softmax_jacobian", "softmax_jacobian_np", "entropy", "entropy_np",
    "scaled_scores", "scaled_scores_np", "sample_scores_np", "softmax_vjp", "softmax_vjp_np",
]


# --------------------------------------------------------------------------- argument checks

def _check_temperature(temperature: float) -> None:
    if (isinstance(temperature, bool) or not isinstance(temperature, numbers.Real)
            or not math.isfinite(temperature) or temperature <= 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")


def _check_axis(axis: int, ndim: int, name: str = "axis") -> None:
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise ValueError(f"{name}={axis} is out of range for an input with {ndim} dimensions")


def _check_float_tensor(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__} "
                         "(use softmax_np for NumPy arrays)")
    if not x.is_floating_point():
        raise ValueError(f"x must be a floating-point tensor, got dtype {x.dtype}")


# --------------------------------------------------------------------------- NumPy references

def softmax_np(x, axis: int = -1, temperature: float = 1.0) -> np.ndarray:
    """Softmax along `axis`, float64 NumPy reference: ``exp(x_i/tau) / sum_j exp(x_j/tau)``.

    Computed as ``exp(z) / sum exp(z)`` with ``z = (x - max(x)) / tau``; the max is taken per
    slice along `axis`, so every slice has one term equal to exp(0) = 1 and the result has no
    overflow and no 0/0. Entries equal to -inf get weight 0 (a slice needs one finite entry).
    An axis of length 0 gives an empty array of the same shape, as ``torch.softmax`` does.

    Args:
        x: array-like of any shape, converted to float64.
        axis: the axis that is normalised (sums to 1).
        temperature: tau > 0; tau > 1 flattens the distribution, tau < 1 sharpens it.

    Returns:
        float64 array, same shape as `x`, entries in [0, 1], summing to 1 along `axis`.

    Raises:
        ValueError: temperature <= 0 or not finite; `axis` out of range for `x.ndim`.

    Source: Vaswani et al. (2017), section 3.2.1, equation 1; lesson 01.
    """
    _check_temperature(temperature)
    x = np.asarray(x, dtype=np.float64)
    _check_axis(axis, x.ndim)
    # max: (..., 1, ...) along `axis`; initial=-inf: an empty axis gives an empty result
    z = (x - x.max(axis=axis, keepdims=True, initial=-np.inf)) / temperature
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax_np(x, axis: int = -1, temperature: float = 1.0) -> np.ndarray:
    """Log of the softmax along `axis`, float64 NumPy: ``z_i - log sum_j exp(z_j)``, ``z = x/tau``.

    Computed as ``z' - log sum exp(z')`` with ``z' = (x - max x) / tau``, which stays finite where
    ``log(softmax_np(x))`` would give log(0) = -inf (e.g. ``[0, -1000] -> [0, -1000]``).

    Args, returns and raises: as :func:`softmax_np`; the values are <= 0 (natural log).

    Source: lesson 01 (the log-sum-exp trick).
    """
    _check_temperature(temperature)
    x = np.asarray(x, dtype=np.float64)
    _check_axis(axis, x.ndim)
    if x.shape[axis] == 0:  # an empty axis: an empty result, as torch.log_softmax returns
        return x.copy()
    z = (x - x.max(axis=axis, keepdims=True)) / temperature  # max: (..., 1, ...) along `axis`
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def naive_softmax_np(x, axis: int = -1) -> np.ndarray:
    """Softmax WITHOUT the max-shift, ``exp(x) / sum exp(x)``, in the dtype of `x`.

    Deliberately unstable, for lesson 01's overflow measurement: in float32, ``exp(x)`` is inf
    for x > ln(3.4e38) ~ 88.7 and the result holds inf/inf = NaN; for very negative x every
    term underflows to 0 and the result is 0/0 = NaN. Use :func:`softmax_np` for real work.

    Args:
        x: floating-point array of any shape (its dtype is kept; integers become float64).
        axis: the axis that is normalised.

    Returns:
        array of the same shape and dtype as `x`, possibly holding NaN.

    Raises:
        ValueError: `axis` out of range for `x.ndim`.
    """
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)
    _check_axis(axis, x.ndim)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        e = np.exp(x)
        return e / e.sum(axis=axis, keepdims=True)


def softmax_jacobian_np(x) -> np.ndarray:
    """Jacobian of the softmax of a vector, float64: ``J_ij = ds_i/dx_j = s_i (delta_ij - s_j)``.

    In matrix form ``J = diag(s) - s s^T`` with ``s = softmax(x)``. J is symmetric, its rows sum
    to 0 (softmax ignores a common shift of x), and by Gershgorin's theorem its spectral norm is
    at most ``max_i 2 s_i (1 - s_i) <= 2 (1 - max_i s_i)``: it vanishes as the softmax saturates.

    Args:
        x: logits, shape (..., n); the Jacobian is taken per vector along the last axis.

    Returns:
        float64 array of shape (..., n, n).

    Raises:
        ValueError: `x` is a scalar (0-d).

    Source: lesson 01 (why saturation stalls learning).
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 0:
        raise ValueError("softmax_jacobian_np needs logits of shape (..., n), got a scalar")
    s = softmax_np(x, axis=-1)                        # (..., n)
    diag = s[..., :, None] * np.eye(s.shape[-1])      # (..., n, n)
    outer = s[..., :, None] * s[..., None, :]         # (..., n, 1) * (..., 1, n) -> (..., n, n)
    return diag - outer


def _check_vjp_shapes(s_shape: tuple, g_shape: tuple) -> None:
    if tuple(s_shape) != tuple(g_shape):
        raise ValueError(f"softmax_vjp: s {tuple(s_shape)} and g {tuple(g_shape)} must have the "
                         "same shape (g is the gradient of the loss with respect to s)")


def softmax_vjp_np(s, g, axis: int = -1) -> np.ndarray:
    """Backward pass of the softmax, float64 NumPy: ``dx = s * (g - <s, g>)`` along `axis`.

    Derivation (lesson 01, section 6). With ``s_i = e^{x_i} / Z`` and ``Z = sum_k e^{x_k}``, the
    quotient rule gives ``ds_i/dx_j = (delta_ij e^{x_i} Z - e^{x_i} e^{x_j}) / Z^2
    = s_i (delta_ij - s_j)``, i.e. ``J = diag(s) - s s^T``. The chain rule needs the
    vector-Jacobian product ``dx_j = sum_i g_i ds_i/dx_j = s_j g_j - s_j sum_i s_i g_i``:
    ``dx = s * (g - <s, g>)``. It costs 3n operations per vector, where forming J costs n^2
    numbers (at the T = 8192 of a long context, 512 MiB of float64 per row of queries).
    J is symmetric, so ``J^T g = J g``. A row with s = 0 (a fully masked attention row) gets
    dx = 0. The result sums to 0 along `axis` (softmax ignores a common shift of x).

    Args:
        s: the softmax output (what the forward pass saved), any shape, float64 after
            conversion; each slice along `axis` sums to 1 (or is all 0).
        g: dLoss/ds, the same shape as `s`.
        axis: the axis the softmax normalised.

    Returns:
        float64 array dLoss/dx, the shape of `s`.

    Raises:
        ValueError: `s` and `g` differ in shape (both named); `axis` out of range.

    Source: lesson 01 (the Jacobian derived, then its vector-Jacobian product).
    """
    s = np.asarray(s, dtype=np.float64)
    g = np.asarray(g, dtype=np.float64)
    _check_vjp_shapes(s.shape, g.shape)
    _check_axis(axis, s.ndim)
    inner = (s * g).sum(axis=axis, keepdims=True)  # <s, g>: (..., 1, ...) along `axis`
    return s * (g - inner)


def entropy_np(p, axis: int = -1) -> np.ndarray:
    """Shannon entropy in nats, float64: ``H(p) = -sum_i p_i log p_i``, with ``0 log 0 = 0``.

    H is log(n) for the uniform distribution over n entries and 0 for a one-hot one.

    Args:
        p: probabilities, any shape, summing to 1 along `axis`.
        axis: the axis of the distribution.

    Returns:
        float64 array, the shape of `p` without `axis`.

    Raises:
        ValueError: `axis` out of range; an entry of `p` is negative or not finite.
    """
    p = np.asarray(p, dtype=np.float64)
    _check_axis(axis, p.ndim)
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError("p must hold finite probabilities >= 0")
    logp = np.log(np.where(p > 0, p, 1.0))  # log 1 = 0 where p = 0, so 0 log 0 -> 0
    return -(p * logp).sum(axis=axis)


def scaled_scores_np(Q, K) -> np.ndarray:
    """Attention scores ``Q K^T / sqrt(d_k)``, float64 NumPy reference.

    Args:
        Q: queries, shape (..., L, d_k).
        K: keys, shape (..., S, d_k); leading axes broadcast against Q's.

    Returns:
        float64 array of shape (..., L, S): entry (l, s) is q_l . k_s / sqrt(d_k).

    Raises:
        ValueError: Q or K has fewer than 2 dimensions, or their last axes (d_k) differ.

    Source: Vaswani et al. (2017), section 3.2.1, equation 1.
    """
    Q = np.asarray(Q, dtype=np.float64)
    K = np.asarray(K, dtype=np.float64)
    _check_qk_shapes(tuple(Q.shape), tuple(K.shape))
    d_k = Q.shape[-1]
    return Q @ np.swapaxes(K, -1, -2) / math.sqrt(d_k)  # (..., L, d_k) @ (..., d_k, S) -> (..., L, S)


def sample_scores_np(d_k: int, n_samples: int, scaled: bool, seed: int = 0) -> np.ndarray:
    """Dot products ``q . k`` (divided by sqrt(d_k) if `scaled`) for q, k ~ N(0, I_{d_k}) i.i.d.

    Each term q_i k_i has mean 0 and variance E[q_i^2] E[k_i^2] = 1, and the d_k terms are
    independent, so ``Var(q . k) = d_k`` and ``Var(q . k / sqrt(d_k)) = 1``: the reason for the
    scale (Vaswani et al. 2017, section 3.2.1, footnote 4). Lesson 01 measures it.

    Args:
        d_k: the vector width (>= 1).
        n_samples: how many independent (q, k) pairs (>= 2).
        scaled: divide by sqrt(d_k).
        seed: seed of ``np.random.default_rng``.

    Returns:
        float64 array of shape (n_samples,).

    Raises:
        ValueError: d_k < 1 or n_samples < 2.
    """
    if d_k < 1 or n_samples < 2:
        raise ValueError(f"need d_k >= 1 and n_samples >= 2, got d_k={d_k}, n_samples={n_samples}")
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_samples, d_k))
    k = rng.standard_normal((n_samples, d_k))
    scores = np.einsum("nd,nd->n", q, k)  # (n_samples,): one dot product per pair
    return scores / math.sqrt(d_k) if scaled else scores


def _check_qk_shapes(q_shape: tuple, k_shape: tuple) -> None:
    if len(q_shape) < 2 or len(k_shape) < 2:
        raise ValueError(f"Q and K need shapes (..., L, d_k) and (..., S, d_k), got Q {q_shape} "
                         f"and K {k_shape}")
    if q_shape[-1] != k_shape[-1]:
        raise ValueError(f"Q {q_shape} and K {k_shape} must share their last axis d_k "
                         f"({q_shape[-1]} != {k_shape[-1]})")


# --------------------------------------------------------------------------- PyTorch

def softmax(x: torch.Tensor, dim: int = -1, temperature: float = 1.0) -> torch.Tensor:
    """Softmax along `dim` in PyTorch: ``exp(x_i/tau) / sum_j exp(x_j/tau)``, with the max-shift.

    The same computation as :func:`softmax_np`, differentiable. The shift ``max(x)`` is
    detached: softmax(z - c) = softmax(z) for any c, so it carries no gradient. Equal to
    ``torch.softmax(x / tau, dim)`` (tested); like it, a slice whose entries are all -inf gives
    NaN (attention handles fully masked rows itself, lesson 02). float16 and bfloat16 inputs
    are computed in float32 and the result rounded once to their dtype (``torch.softmax`` does
    the same on CPU); ``tests/test_precision.py`` holds the error under 1 eps of the dtype.

    Args:
        x: floating-point tensor of any shape (float16, bfloat16, float32 or float64).
        dim: the dimension that is normalised.
        temperature: tau > 0.

    Returns:
        tensor of the shape and dtype of `x`, summing to 1 along `dim`.

    Raises:
        ValueError: `x` is not a floating-point tensor; temperature <= 0 or not finite; `dim`
            out of range.

    Source: Vaswani et al. (2017), section 3.2.1, equation 1; lesson 01.
    """
    _check_float_tensor(x)
    _check_temperature(temperature)
    _check_axis(dim, x.dim(), "dim")
    if x.shape[dim] == 0:  # an empty axis: an empty result, as torch.softmax returns
        return x.clone()
    xc = upcast(x)  # float32 for float16/bfloat16 inputs
    z = (xc - xc.amax(dim=dim, keepdim=True).detach()) / temperature  # max: (..., 1, ...)
    e = torch.exp(z)
    return (e / e.sum(dim=dim, keepdim=True)).to(x.dtype)


def log_softmax(x: torch.Tensor, dim: int = -1, temperature: float = 1.0) -> torch.Tensor:
    """Log-softmax along `dim` in PyTorch: ``z_i - log sum_j exp(z_j)``, ``z = x/tau``, max-shifted.

    The same computation as :func:`log_softmax_np`, in float32 for float16 and bfloat16 inputs,
    returned in the dtype of `x`; equal to ``torch.log_softmax(x / tau, dim)`` (tested). Args,
    returns and raises as :func:`softmax`.

    Source: lesson 01 (the log-sum-exp trick).
    """
    _check_float_tensor(x)
    _check_temperature(temperature)
    _check_axis(dim, x.dim(), "dim")
    if x.shape[dim] == 0:  # an empty axis: an empty result, as torch.softmax returns
        return x.clone()
    xc = upcast(x)  # float32 for float16/bfloat16 inputs
    z = (xc - xc.amax(dim=dim, keepdim=True).detach()) / temperature  # max: (..., 1, ...)
    return (z - torch.log(torch.exp(z).sum(dim=dim, keepdim=True))).to(x.dtype)


def softmax_jacobian(x: torch.Tensor) -> torch.Tensor:
    """Jacobian of the softmax along the last dim: ``J = diag(s) - s s^T``, ``s = softmax(x)``.

    Args:
        x: floating-point logits of shape (..., n).

    Returns:
        tensor of shape (..., n, n), the dtype of `x` (computed in float32 for float16 and
        bfloat16: ``s_i - s_i^2`` cancels when s_i is near 1); ``J[..., i, j] = ds_i / dx_j``.

    Raises:
        ValueError: `x` is not a floating-point tensor, or is 0-d.

    Source: lesson 01; tested against ``torch.autograd.functional.jacobian``.
    """
    _check_float_tensor(x)
    if x.dim() == 0:
        raise ValueError("softmax_jacobian needs logits of shape (..., n), got a 0-d tensor")
    s = softmax(upcast(x), dim=-1)                # (..., n), float32 for 16-bit inputs
    diag = torch.diag_embed(s)                    # (..., n, n)
    outer = s.unsqueeze(-1) * s.unsqueeze(-2)     # (..., n, 1) * (..., 1, n) -> (..., n, n)
    return (diag - outer).to(x.dtype)


def softmax_vjp(s: torch.Tensor, g: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Backward pass of the softmax in PyTorch: ``dx = s * (g - <s, g>)`` along `dim`.

    The same equation and derivation as :func:`softmax_vjp_np` (``J = diag(s) - s s^T`` is never
    formed). Differentiable itself (plain tensor operations), so a backward built from it can be
    differentiated again (``torch.autograd.gradgradcheck`` in the tests). Equal to
    ``torch.autograd.grad(softmax(x), x, g)`` to float64 rounding (tested).

    Args:
        s: the softmax output, floating-point tensor of any shape (float16, bfloat16, float32
            or float64); slices along `dim` sum to 1 or are all 0.
        g: dLoss/ds, the shape of `s`.
        dim: the dimension the softmax normalised.

    Returns:
        dLoss/dx, the shape of `s`, the dtype of `g`; float16 and bfloat16 are computed in
        float32 (the sum <s, g> cancels) and rounded once.

    Raises:
        ValueError: a non-floating tensor; `s` and `g` differ in shape (both named); `dim` out
            of range.

    Source: lesson 01.
    """
    _check_float_tensor(s)
    _check_float_tensor(g)
    _check_vjp_shapes(tuple(s.shape), tuple(g.shape))
    _check_axis(dim, s.dim(), "dim")
    sc, gc = upcast(s), upcast(g).to(upcast(s).dtype)  # float32 for 16-bit inputs
    inner = (sc * gc).sum(dim=dim, keepdim=True)  # <s, g>: (..., 1, ...) along `dim`
    return (sc * (gc - inner)).to(g.dtype)


def entropy(p: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Shannon entropy in nats, ``-sum_i p_i log p_i`` along `dim`, with ``0 log 0 = 0``.

    Args:
        p: floating-point probabilities of any shape, summing to 1 along `dim`.
        dim: the dimension of the distribution.

    Returns:
        tensor of the shape of `p` without `dim`, the dtype of `p` (summed in float32 for
        float16 and bfloat16).

    Raises:
        ValueError: `p` is not a floating-point tensor, or `dim` is out of range.
    """
    _check_float_tensor(p)
    _check_axis(dim, p.dim(), "dim")
    pc = upcast(p)  # float32 for float16/bfloat16 inputs
    logp = torch.log(torch.where(pc > 0, pc, torch.ones_like(pc)))  # 0 log 0 -> 0 log 1 = 0
    return (-(pc * logp).sum(dim=dim)).to(p.dtype)


def scaled_scores(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Attention scores ``Q K^T / sqrt(d_k)`` in PyTorch.

    Args:
        Q: queries, floating-point, shape (..., L, d_k).
        K: keys, shape (..., S, d_k); leading dims broadcast against Q's.

    Returns:
        tensor of shape (..., L, S), the dtype of Q; float16 and bfloat16 are multiplied and
        scaled in float32 and rounded once (a float16 ``Q K^T`` can pass 65,504 before the
        division by sqrt(d_k) brings it back in range).

    Raises:
        ValueError: a non-floating tensor; fewer than 2 dims; the last dims (d_k) differ.

    Source: Vaswani et al. (2017), section 3.2.1, equation 1.
    """
    _check_float_tensor(Q)
    _check_float_tensor(K)
    _check_qk_shapes(tuple(Q.shape), tuple(K.shape))
    d_k = Q.shape[-1]
    scores = upcast(Q) @ upcast(K).transpose(-2, -1) / math.sqrt(d_k)  # (..., L, d_k) @ (..., d_k, S)
    return scores.to(Q.dtype)  # (..., L, S)
