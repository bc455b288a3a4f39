"""The precision rule every component of the course follows (float16, bfloat16, float32, float64).

A component takes its inputs in any floating dtype and returns its result in the input's dtype.
Where the numerics need more bits than a 16-bit float holds, it computes in
``compute_dtype(x.dtype)``: float32 for float16 and bfloat16, the dtype itself for float32 and
float64 (so float32 and float64 results are unchanged by this rule). The places that need it:

- statistics over features (LayerNorm's mean and variance, RMSNorm's mean square): a sum of
  squares overflows float16 (300^2 + 400^2 = 250,000 > 65,504, its largest number; lesson 06),
  as ``F.layer_norm`` and ``F.rms_norm`` also compute in float32;
- RoPE's angles ``m * theta_k`` and their cos and sin: bfloat16 numbers between 1,024 and 2,048
  are 8 apart, so an angle rounded to bfloat16 can be off by 4 radians (lesson 04); RoPE takes
  its angles, cos and sin from float64;
- softmax and attention scores: an error delta in a logit is an error of about delta (relative)
  in its weight, and a logit of 100 in bfloat16 is rounded by up to 0.25;
- elementwise functions with cancellation (GELU's ``1 + erf(x / sqrt 2)`` for negative x).

Matrix products stay in the input's dtype: PyTorch's CPU kernels multiply float16 and bfloat16
with float32 accumulation and round the result once (``tests/test_precision.py`` measures it:
an error below 0.2 eps of ``sum |a_i b_i|`` for sums of 64 to 8,192 terms; a float16 sum
accumulated in float16 would lose all precision past 2,048 terms of 1).

Source: issue 14; Micikevicius et al. 2018, "Mixed Precision Training" (float32 for reductions);
lessons 04 and 06.
"""

from __future__ import annotations

import torch

__all__ = ["compute_dtype", "upcast"]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a component computes in for inputs of `dtype`: float32 for float16 and
    bfloat16, `dtype` itself for float32 and float64 (``torch.promote_types(dtype, float32)``).

    Raises:
        ValueError: `dtype` is not a floating-point dtype (named).
    """
    if not dtype.is_floating_point:
        raise ValueError(f"compute_dtype needs a floating-point dtype, got {dtype}")
    return torch.promote_types(dtype, torch.float32)


def upcast(x: torch.Tensor) -> torch.Tensor:
    """`x` converted to ``compute_dtype(x.dtype)``; the same tensor (no copy) when it already is.

    Raises:
        ValueError: `x` is not a floating-point tensor.
    """
    return x.to(compute_dtype(x.dtype))
