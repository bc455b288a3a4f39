"""Lesson 05: the position-wise feed-forward network (ReLU, GELU, SwiGLU) and its cost.

    FFN(x)        = act(x W_1 + b_1) W_2 + b_2                      (Vaswani et al. 2017, eq. 2)
    FFN_SwiGLU(x) = (SiLU(x W_3 + b_3) * (x W_1 + b_1)) W_2 + b_2   (Shazeer 2020, eq. 6)

applied to every token alone (the same weights at every position). Weights are (d_in, d_out) and
applied on the right, ``x @ W``. GELU is exact, ``x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))``
(Hendrycks and Gimpel 2016, section 2); the tanh approximation only when asked for by name
(``"gelu_tanh"``). The inner size d_ff defaults to 4 d_model (the paper's 512 -> 2048); for SwiGLU
:func:`swiglu_d_ff` gives the "2/3" size that keeps the parameter count of a 4 d_model FFN.

What the FFN costs (its parameters and FLOPs, and their share of a layer's) is counted by the
course's one counter, :func:`txlearn.counting.layer_param_counts` and
:func:`txlearn.counting.layer_flops` (lesson 05 uses them; lesson 08 derives them).

Naming: the course keeps the paper's W_1 (into d_ff) and W_2 (back to d_model) and adds the gate as
W_3, so its numbering runs opposite to Meta's LLaMA code for two of the three matrices:

    role                        course               Meta LLaMA   Hugging Face LlamaMLP
    gate, passed through SiLU   W_3 (d_model, d_ff)  w1           gate_proj.weight (d_ff, d_model)
    up projection               W_1 (d_model, d_ff)  w3           up_proj.weight   (d_ff, d_model)
    down projection             W_2 (d_ff, d_model)  w2           down_proj.weight (d_model, d_ff)

The course stores weights (d_in, d_out) and Hugging Face's nn.Linear (d_out, d_in), so loading is
``W_3 = gate_proj.weight.T``, ``W_1 = up_proj.weight.T``, ``W_2 = down_proj.weight.T``; LLaMA's MLP has
no biases (``bias=False``). Tested equal to ``transformers``' ``LlamaMLP`` with copied weights
(tests/test_ffn.py; lesson 05 shows the same).

Precision: the activations compute in float32 for float16 and bfloat16 inputs and return the
input's dtype, and GELU is computed without the cancellation of ``1 + erf(x / sqrt 2)`` for
negative x (:func:`gelu`). The FFN's matrix products run in the module's
dtype, with PyTorch's float32 accumulation (:mod:`txlearn.precision`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from txlearn.precision import upcast

__all__ = [
    "ACTIVATIONS",
    "relu", "gelu", "silu", "relu_np", "gelu_np", "silu_np",
    "swiglu_d_ff",
    "FeedForward",
    "feed_forward_np",
]

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swiglu")


# ---- activations -------------------------------------------------------------------------------

def relu(x: torch.Tensor) -> torch.Tensor:
    """ReLU(x) = max(0, x), elementwise."""
    return torch.clamp(x, min=0)


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU(x) = x * Phi(x), elementwise (Hendrycks and Gimpel 2016, section 2).

    approximate="none": exact, ``0.5 x (1 + erf(x / sqrt 2))``;
    approximate="tanh": ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``.
    Equal to ``torch.nn.functional.gelu(x, approximate=...)`` (tested).

    Precision: ``1 + erf(u)`` and ``1 + tanh(u)`` cancel for negative u (at x = -3,
    1 + erf = 0.0027, which float16 arithmetic gets 9% wrong; in float32, GELU(-5.5) comes out
    57% too large and GELU(-6) as 0), so they are computed as the equal ``erfc(-u)`` and
    ``2 sigmoid(2u)``, which do not cancel; in float32 for float16 and bfloat16, returned in x's
    dtype.
    Raises ValueError for another `approximate`.
    """
    xc = upcast(x)  # float32 for float16/bfloat16
    if approximate == "none":  # 1 + erf(x / sqrt 2) = erfc(-x / sqrt 2)
        return (0.5 * xc * torch.erfc(-xc / math.sqrt(2.0))).to(x.dtype)
    if approximate == "tanh":  # 0.5 (1 + tanh(u)) = sigmoid(2u)
        u = math.sqrt(2.0 / math.pi) * (xc + 0.044715 * xc ** 3)
        return (xc * torch.sigmoid(2.0 * u)).to(x.dtype)
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU(x) = Swish_1(x) = x * sigmoid(x), elementwise (Ramachandran et al. 2017); computed
    in float32 for float16 and bfloat16, returned in x's dtype."""
    xc = upcast(x)
    return (xc * torch.sigmoid(xc)).to(x.dtype)


def relu_np(x) -> np.ndarray:
    """float64 NumPy ReLU."""
    return np.maximum(np.asarray(x, dtype=np.float64), 0.0)


_erfc_np = np.vectorize(math.erfc, otypes=[np.float64])


def gelu_np(x, approximate: str = "none") -> np.ndarray:
    """float64 NumPy GELU; see :func:`gelu` (the same cancellation-free forms, so it stays a
    reference for x far below 0, where ``1 + erf`` loses every digit even in float64)."""
    x = np.asarray(x, dtype=np.float64)
    if approximate == "none":  # 0.5 x (1 + erf(x / sqrt 2)) = 0.5 x erfc(-x / sqrt 2)
        return 0.5 * x * _erfc_np(-x / math.sqrt(2.0))
    if approximate == "tanh":  # 0.5 x (1 + tanh(u)) = x sigmoid(2u) = x / (1 + exp(-2u))
        u = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)
        with np.errstate(over="ignore"):  # exp(-2u) = inf for u << 0 gives x / inf = -0
            return x / (1.0 + np.exp(-2.0 * u))
    raise ValueError(f"gelu_np: approximate must be 'none' or 'tanh', got {approximate!r}")


def silu_np(x) -> np.ndarray:
    """float64 NumPy SiLU, x / (1 + exp(-x))."""
    x = np.asarray(x, dtype=np.float64)
    return x / (1.0 + np.exp(-x))


def _act(activation: str):
    return {"relu": relu, "gelu": gelu, "gelu_tanh": lambda x: gelu(x, "tanh")}[activation]


def _fused_act(activation: str):
    """PyTorch's one-kernel versions of the activations above (the fast path)."""
    return {"relu": F.relu, "gelu": F.gelu,
            "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}[activation]


def _act_np(activation: str):
    return {"relu": relu_np, "gelu": gelu_np, "gelu_tanh": lambda x: gelu_np(x, "tanh")}[activation]


def _check_activation(activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


# ---- the module --------------------------------------------------------------------------------

def swiglu_d_ff(d_model: int, multiple_of: int = 1) -> int:
    """The "2/3 rule": d_ff = 2/3 * 4 d_model, rounded up to a multiple of `multiple_of`.

    A SwiGLU FFN has three (d_model x d_ff) matrices instead of two, so this d_ff keeps its
    parameter count close to that of a 4 d_model ReLU FFN (Shazeer 2020, section 2;
    LLaMA uses multiple_of=256: d_model 4096 -> 11008).
    Raises ValueError unless d_model and multiple_of are positive.
    """
    if d_model < 1 or multiple_of < 1:
        raise ValueError(f"swiglu_d_ff: d_model={d_model} and multiple_of={multiple_of} "
                         "must both be positive")
    d_ff = int(2 * 4 * d_model / 3)
    return multiple_of * ((d_ff + multiple_of - 1) // multiple_of)


class FeedForward(nn.Module):
    """Position-wise FFN: ``act(x W_1 + b_1) W_2 + b_2``, or SwiGLU
    ``(SiLU(x W_3 + b_3) * (x W_1 + b_1)) W_2 + b_2``.

    Args:
        d_model: model width.
        d_ff: inner width; None means 4 * d_model (use :func:`swiglu_d_ff` for the 2/3 rule).
        activation: "relu" (the paper), "gelu" (exact erf), "gelu_tanh", or "swiglu".
        bias: whether b_1, b_2 (and b_3) exist.
        fused: False (default) computes the activation from its equation (:func:`gelu` etc.,
            the teaching path); True calls PyTorch's one-kernel ``F.relu``/``F.gelu``/``F.silu``
            and computes each ``x W + b`` in one ``F.linear`` call (the fast path for training,
            tested equal, gradients included).
    Parameters: ``W_1 (d_model, d_ff)``, ``b_1 (d_ff,)``, ``W_2 (d_ff, d_model)``, ``b_2 (d_model,)``;
        SwiGLU adds the gate ``W_3 (d_model, d_ff)``, ``b_3 (d_ff,)``.
    forward(x): x (..., d_model) float -> (..., d_model), same dtype; every position alone.
        Runs in the dtype of the parameters (cast the module with ``.to(dtype)``): matrix
        products in that dtype (accumulated in float32 by PyTorch), activations and the SwiGLU
        product in float32 for float16 and bfloat16.
    Raises: ValueError for an unknown activation, a non-positive size, or an input whose last
        dimension is not d_model (naming both), or whose dtype is not the parameters'.
    Source: Vaswani et al. 2017, section 3.3, eq. 2; Shazeer 2020, eq. 6; lesson 05.
    """

    def __init__(self, d_model: int, d_ff: int | None = None, activation: str = "relu",
                 bias: bool = True, fused: bool = False):
        super().__init__()
        _check_activation(activation)
        d_ff = 4 * d_model if d_ff is None else d_ff
        if d_model < 1 or d_ff < 1:
            raise ValueError(f"FeedForward: d_model={d_model} and d_ff={d_ff} must be positive")
        self.d_model, self.d_ff, self.activation = d_model, d_ff, activation
        self.fused = fused
        self.W_1 = nn.Parameter(torch.empty(d_model, d_ff))
        self.W_2 = nn.Parameter(torch.empty(d_ff, d_model))
        self.b_1 = nn.Parameter(torch.zeros(d_ff)) if bias else None
        self.b_2 = nn.Parameter(torch.zeros(d_model)) if bias else None
        if activation == "swiglu":
            self.W_3 = nn.Parameter(torch.empty(d_model, d_ff))
            self.b_3 = nn.Parameter(torch.zeros(d_ff)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Uniform(-1/sqrt(d_in), 1/sqrt(d_in)) weights (nn.Linear's scale), zero biases."""
        for name in ("W_1", "W_2", "W_3"):
            W = getattr(self, name, None)
            if W is not None:
                bound = 1.0 / math.sqrt(W.shape[0])
                nn.init.uniform_(W, -bound, bound)

    def _affine(self, x, W, b):
        if self.fused:  # x W + b in one kernel (addmm); under autocast all of it in bfloat16
            return F.linear(x, W.t(), b)
        return x @ W + b if b is not None else x @ W

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 0 or x.shape[-1] != self.d_model:
            raise ValueError(f"FeedForward: input has shape {tuple(x.shape)}, but d_model="
                             f"{self.d_model} (the last dimension must be {self.d_model})")
        if x.dtype != self.W_1.dtype:
            raise ValueError(f"FeedForward: input has dtype {x.dtype} but the parameters are "
                             f"{self.W_1.dtype}: cast one to the other (module.to(dtype))")
        h = self._affine(x, self.W_1, self.b_1)                       # (..., d_ff)
        if self.activation == "swiglu":
            act = F.silu if self.fused else silu                      # float32+ inside
            gate = act(upcast(self._affine(x, self.W_3, self.b_3)))   # (..., d_ff)
            h = (gate * upcast(h)).to(x.dtype)                        # (..., d_ff)
        else:
            h = (_fused_act if self.fused else _act)(self.activation)(h)  # (..., d_ff)
        return self._affine(h, self.W_2, self.b_2)                    # (..., d_model)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_ff={self.d_ff}, activation={self.activation!r}"


def feed_forward_np(x, W_1, b_1, W_2, b_2, activation: str = "relu", W_3=None, b_3=None):
    """float64 NumPy reference of :class:`FeedForward` (biases may be None).

    Args: x (..., d_model); W_1, W_3 (d_model, d_ff); b_1, b_3 (d_ff,); W_2 (d_ff, d_model);
    b_2 (d_model,). Returns float64 (..., d_model).
    Raises ValueError for an unknown activation, a missing W_3 for SwiGLU, or shapes that do not
    chain (naming them).
    """
    _check_activation(activation)
    x, W_1, W_2 = (np.asarray(a, dtype=np.float64) for a in (x, W_1, W_2))
    if x.shape[-1] != W_1.shape[0] or W_1.shape[1] != W_2.shape[0]:
        raise ValueError(f"feed_forward_np: x {x.shape}, W_1 {W_1.shape}, W_2 {W_2.shape} do "
                         "not chain: need x (..., d_model), W_1 (d_model, d_ff), W_2 (d_ff, d_model)")

    def affine(a, W, b):
        return a @ W + (0.0 if b is None else np.asarray(b, dtype=np.float64))

    h = affine(x, W_1, b_1)                                            # (..., d_ff)
    if activation == "swiglu":
        if W_3 is None:
            raise ValueError("feed_forward_np: activation='swiglu' needs the gate W_3")
        h = silu_np(affine(x, np.asarray(W_3, dtype=np.float64), b_3)) * h
    else:
        h = _act_np(activation)(h)
    return affine(h, W_2, b_2)                                         # (..., d_model)
