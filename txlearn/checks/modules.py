"""Helpers shared by the checks of the module track (sets 03-10): the learner writes PyTorch
functions and ``nn.Module`` classes, and the checks drive them only through :func:`call`,
:func:`construct`, :func:`load_state` and :func:`forward_backward` (see ``txlearn.checks``).

These helpers add what those checks have in common: a hint chosen by the message of the exception
the learner's code raised (``raised=[(text, hint), ...]``), a hint chosen by a wrong shape, a
wrong dtype or a wrong state-dict name, a catalogued mistake's output computed quietly, float64
copies of tensors, and the references several check modules compare with: the causal mask
(:func:`mask_ref`), a multi-head attention's random state (:func:`mha_state`) and its float64
output (:func:`mha_reference`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from txlearn.checks.compare import as_array, diagnose, expect_close, expect_true
from txlearn.checks.feedback import CheckFailure
from txlearn.checks.learner import cache_shapes, call, construct, forward_backward, load_state

__all__ = ["MHA_CACHE_REPEATED", "MHA_CACHE_CONTENT", "expect_cache", "F32", "rehint", "guarded", "run", "make_module", "backward", "load", "quiet",
           "expect_match", "expect_pair", "expect_tensor", "expect_dtype", "expect_shape_of",
           "finite", "np64", "f64", "mask_ref", "mha_state", "mha_reference"]

# Tolerances for answers computed in float32 against a float64 reference.
F32 = {"rtol": 1e-4, "atol": 2e-5}


def rehint(err: CheckFailure, hint) -> CheckFailure:
    """The same failure with another hint (levels)."""
    return CheckFailure(err.what, case=err.case, hint=hint, kind=err.kind, frames=err.frames)


def guarded(helper: Callable, *args: Any, raised: Sequence = (), **kwargs: Any):
    """``helper(*args, **kwargs)`` (``call``, ``construct`` or ``forward_backward``); when the
    learner's code raised, the hint is the first of ``raised`` whose text occurs in the error
    message (``None`` as text matches any message)."""
    try:
        return helper(*args, **kwargs)
    except CheckFailure as err:
        if err.kind == "raised":
            for text, hint in raised:
                if text is None or text in err.what:
                    raise rehint(err, hint) from None
        raise


def run(fn, *args, case: str, raised: Sequence = (), hint=None, **kwargs):
    """:func:`call` with hints chosen by the exception's message."""
    return guarded(call, fn, *args, case=case, raised=raised, hint=hint, **kwargs)


def make_module(cls, *args, case: str, raised: Sequence = (), **kwargs):
    """Build the learner's module: :func:`construct` with hints chosen by the exception's
    message."""
    return guarded(construct, cls, *args, case=case, raised=raised, **kwargs)


def backward(module, *args, grad_output, case: str, raised: Sequence = (), **kwargs):
    """:func:`forward_backward` with hints chosen by the exception's message."""
    return guarded(forward_backward, module, *args, grad_output=grad_output, case=case,
                   raised=raised, **kwargs)


def load(module, state: dict, *, case: str, names=None, unexpected=None,
         shapes: dict | None = None) -> None:
    """:func:`load_state` with hints of our own: ``unexpected`` when the module only has names
    the statement does not give, ``names`` for any other difference of names, ``shapes[name]``
    when parameter ``name`` has another shape."""
    try:
        load_state(module, state, case=case)
    except CheckFailure as err:
        if err.kind == "wrong":
            if err.what.startswith("parameter "):
                name = err.what.split()[1]
                if shapes and name in shapes:
                    raise rehint(err, shapes[name]) from None
            elif unexpected is not None and "has no " not in err.what:
                raise rehint(err, unexpected) from None
            elif names is not None:
                raise rehint(err, names) from None
        raise


def quiet(wrong):
    """A catalogued mistake's output, or NaN when that mistake cannot run on these inputs."""
    if not callable(wrong):
        return wrong

    def compute():
        try:
            return wrong()
        except Exception:  # e.g. a matmul that only fails for this mistake
            return np.nan
    return compute


def expect_match(got, expected, *, case: str, mistakes: Sequence = (), default=None,
                 rtol: float = 1e-5, atol: float = 1e-6, dtol: tuple | None = None) -> None:
    """:func:`expect_close`; only when it fails are the ``mistakes`` (``(output or function,
    hint)`` pairs) compared with ``got`` to choose the hint (``default`` when none matches), within
    ``dtol = (rtol, atol)`` (default: the tolerances of the comparison itself)."""
    try:
        expect_close(got, expected, case=case, hint=default, rtol=rtol, atol=atol)
    except CheckFailure as err:
        r, a = dtol or (rtol, atol)
        hint = diagnose(got, [(quiet(w), h) for w, h in mistakes], default, rtol=r, atol=a)
        raise rehint(err, hint) from None


def expect_pair(got, *, case: str, hint) -> tuple:
    """Fail unless ``got`` is a pair (tuple or list of two)."""
    expect_true(isinstance(got, (tuple, list)) and len(got) == 2, case=case,
                message=f"expected a pair of tensors, got {type(got).__name__}", hint=hint)
    return tuple(got)


def expect_tensor(got, *, case: str, hint) -> None:
    """Fail unless ``got`` is a ``torch.Tensor`` (a NumPy array breaks autograd)."""
    expect_true(type(got).__module__.startswith("torch"), case=case,
                message=f"expected a torch.Tensor, got {type(got).__name__}", hint=hint)


def expect_dtype(got, dtype, *, case: str, hint) -> None:
    """Fail unless ``got`` (a tensor) has ``dtype`` (a torch dtype)."""
    have = getattr(got, "dtype", None)
    expect_true(have == dtype, case=case,
                message=f"dtype {have}, expected {dtype}".replace("torch.", ""), hint=hint)


def expect_shape_of(got, shape: tuple, *, case: str, wrong: Sequence = (), hint=None) -> None:
    """Fail unless ``got`` has ``shape``; the hint is the one of ``wrong`` (``(shape, hint)``
    pairs: the shapes that known mistakes give) matching got's shape, else ``hint``."""
    a = as_array(got)
    if a is None:
        raise CheckFailure(f"expected a tensor of shape {tuple(shape)}, got {type(got).__name__}",
                           case=case, hint=hint)
    have = tuple(a.shape)
    if have != tuple(shape):
        chosen = next((h for s, h in wrong if tuple(s) == have), hint)
        raise CheckFailure(f"shape {have}, expected {tuple(shape)}", case=case, hint=chosen)


def finite(got) -> bool:
    """Whether ``got`` is an array of numbers, all finite (no NaN, no infinity)."""
    a = as_array(got, np.float64)
    return a is not None and bool(np.isfinite(a).all())


def np64(t) -> np.ndarray:
    """A tensor (or array) as a float64 NumPy array."""
    return as_array(t, np.float64)


def f64(v) -> torch.Tensor:
    """A tensor or array as a float64 tensor (a float64 tensor itself, so gradients reach it)."""
    if torch.is_tensor(v) and v.dtype == torch.float64:
        return v
    return torch.as_tensor(np64(v))


def mask_ref(L: int, S: int) -> torch.Tensor:
    """The causal mask of L queries over S keys, bottom-right aligned, bool (L, S), True = may
    attend (query i sees keys 0 .. S - L + i): the course's ``causal_mask``."""
    return torch.ones(L, S, dtype=torch.bool).tril(S - L)


def mha_state(d_model: int, n_heads: int, n_kv_heads: int, bias: bool, seed: int) -> dict:
    """A random multi-head attention state in the statement's names: ``W_Q (d_model, d_model)``,
    ``W_K`` and ``W_V (d_model, n_kv_heads * d_k)``, ``W_O (d_model, d_model)`` and, with
    ``bias``, ``b_Q``, ``b_K``, ``b_V``, ``b_O``; float64 NumPy arrays, entries N(0, 0.6^2)."""
    rng = np.random.default_rng(seed)
    d_kv = n_kv_heads * (d_model // n_heads)
    shapes = {"W_Q": (d_model, d_model), "W_K": (d_model, d_kv), "W_V": (d_model, d_kv),
              "W_O": (d_model, d_model)}
    if bias:
        shapes.update(b_Q=(d_model,), b_K=(d_kv,), b_V=(d_kv,), b_O=(d_model,))
    return {k: rng.normal(0.0, 0.6, s) for k, s in shapes.items()}


def mha_reference(state: dict, x, n_heads: int, mask=None) -> torch.Tensor:
    """The right multi-head attention output for ``x (B, L, d_model)``, float64 ``(B, L,
    d_model)``, on ``F.scaled_dot_product_attention(..., enable_gqa=True)`` with the weights of
    ``state`` (:func:`mha_state`'s names) and a bool ``mask`` (True = may attend); a query with
    every key masked gives 0. Float64 tensors in ``state`` and ``x`` are used as they are (for
    gradients)."""
    t = {k: f64(v) for k, v in state.items()}
    x = f64(x)
    B, L, d_model = x.shape
    d_k = d_model // n_heads
    n_kv = t["W_K"].shape[1] // d_k

    def heads(name, h):
        y = x @ t[f"W_{name}"] + t.get(f"b_{name}", 0.0)
        return y.reshape(B, L, h, d_k).transpose(1, 2)                 # (B, h, L, d_k)

    m = None if mask is None else torch.as_tensor(mask).bool()
    out = F.scaled_dot_product_attention(heads("Q", n_heads), heads("K", n_kv), heads("V", n_kv),
                                         attn_mask=m, enable_gqa=True)
    if m is not None:
        out = out.masked_fill(~m.any(-1, keepdim=True), 0.0)
    return out.transpose(1, 2).reshape(B, L, d_model) @ t["W_O"] + t.get("b_O", 0.0)


# the KV cache: what it holds, read where the module lives (set 03, and every set built on it)

MHA_CACHE_REPEATED = (
    "what does the cache store?",
    "store K and V before repeat_kv: the cache holds the n_kv_heads key/value heads, each "
    "(B, n_kv_heads, S, d_k); repeating them first caches n_heads copies and undoes what "
    "grouped-query attention saves",
    "your kv_cache holds n_heads heads")
MHA_CACHE_CONTENT = (
    "what does the cache store?",
    "self.kv_cache is the pair (K, V) of every position seen with use_cache=True, each "
    "(B, n_kv_heads, S, d_k), stored before repeat_kv")

def expect_cache(module, B, n_heads, n_kv_heads, S, d_k, case, empty=MHA_CACHE_CONTENT):
    """Fail unless the module's kv_cache holds exactly (K, V), each (B, n_kv_heads, S, d_k);
    ``empty`` is the hint when it holds nothing."""
    held = cache_shapes(module, case=case)
    want = (B, n_kv_heads, S, d_k)
    if held == [[want, want]]:
        return
    repeated = (B, n_heads, S, d_k)
    hint = MHA_CACHE_REPEATED if held == [[repeated, repeated]] else \
        empty if not held else MHA_CACHE_CONTENT
    shown = "; ".join(", ".join(str(s) for s in pair) for pair in held) or "nothing"
    raise CheckFailure(f"after this step self.kv_cache holds {shown}; expected (K, V), each "
                       f"{want}", case=case, hint=hint)
