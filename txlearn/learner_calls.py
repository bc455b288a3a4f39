"""What the learner's kernel (:mod:`txlearn.checks`) and the grader's sandboxed runner
(:mod:`txlearn.course.grading.runner`) must compute the same way when they call a learner's code.

A check runs in one of two places: in the learner's own kernel, on the real objects, or in the
grader, where the objects are proxies and the call happens in the runner inside the sandbox. So
that a notebook passes or fails the same way in both, every rule of "calling the learner's code"
exists once, here:

- :class:`Given` / :func:`given` / :data:`GIVEN_KINDS`: the fixed callables a check may hand the
  learner's code, built from data only (the runner rebuilds them from their kind and arrays);
- :func:`local_forward_backward` and :func:`to_tensor`: forward and backward on a module;
- the in-place rule, :func:`call_on_copies` and :func:`parameter_name`: the learner's code gets
  copies of the check's arrays and tensors; a copy that changed is reported, by its key;
- :func:`load_state_dict`: a check's state dict loaded into a module, under ``no_grad``;
- :func:`time_limit` and :class:`TimeLimitExceeded`: the SIGALRM time limit of one call;
- :func:`learner_frames`: which frames of a traceback are the learner's;
- :func:`strip_magics`: notebook magics and shell lines dropped before plain Python runs a cell.

The runner imports this module inside the sandbox, so it needs only the standard library and
NumPy (PyTorch is imported when a tensor is involved) and imports nothing else of txlearn.
Source: issue 20 ("no rule of the grader exists twice"); docs/architecture.md (the grading wing).
"""

from __future__ import annotations

import inspect
import linecache
import os
import re
import signal
import sys
import threading
import traceback
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np

__all__ = [
    "METHOD_NAME",
    "Given",
    "given",
    "GIVEN_KINDS",
    "to_tensor",
    "local_forward_backward",
    "call_on_copies",
    "parameter_name",
    "load_state_dict",
    "cache_shapes",
    "record_starts",
    "one_thread",
    "time_limit",
    "TimeLimitExceeded",
    "learner_frames",
    "strip_magics",
]

# a public method's name: what `checks.method` accepts and the runner resolves
METHOD_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,59}")

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))   # txlearn/ (or the sandbox's view)


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _torch_if_loaded():
    """The torch module when something imported it already, else None (never imports it)."""
    return sys.modules.get("torch")


# ---- Given: fixed callables built from data ----------------------------------------------------

def _cast_like(w, x):
    if _is_torch(x):
        import torch
        return torch.as_tensor(np.asarray(w), dtype=x.dtype)
    return np.asarray(w, dtype=np.float64)


def _given_linear(x, W, b=None):
    """x @ W (+ b), in x's type and dtype."""
    out = x @ _cast_like(W, x)
    return out if b is None else out + _cast_like(b, x)


def _given_tanh_linear(x, W, b=None):
    """tanh(x @ W (+ b))."""
    out = _given_linear(x, W, b)
    if _is_torch(out):
        import torch
        return torch.tanh(out)
    return np.tanh(out)


def _given_layer_norm(x, eps=1e-5):
    """LayerNorm without gain or shift: (x - mean) / sqrt(biased var + eps) over the last axis."""
    if _is_torch(x):
        import torch
        mu = x.mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps)
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)


def _given_rms_norm(x, eps=1e-6, gamma=None):
    """RMSNorm: x / sqrt(mean(x^2) + eps) over the last axis, times gamma when given."""
    if _is_torch(x):
        import torch
        out = x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps)
    else:
        out = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)
    return out if gamma is None else out * _cast_like(gamma, x)


def _given_scale(x, factor):
    """x * factor."""
    return x * factor


GIVEN_KINDS: dict[str, Callable] = {
    "linear": _given_linear,            # x @ W (+ b)
    "tanh_linear": _given_tanh_linear,  # tanh(x @ W (+ b))
    "layer_norm": _given_layer_norm,    # (x - mean) / sqrt(var + eps), no gain or shift
    "rms_norm": _given_rms_norm,        # x / sqrt(mean(x^2) + eps) (* gamma when given)
    "scale": _given_scale,              # x * factor
}


class Given:
    """A fixed callable the check hands to the learner's code, built from data only.

    ``given("linear", W=W, b=b)`` is ``x @ W + b``; the grader's runner rebuilds it from the same
    kind and arrays (it never receives code). Calling a Given runs it in float64 NumPy or
    PyTorch, matching the input's type. Kinds: see :data:`GIVEN_KINDS`.

    Raises:
        KeyError: an unknown kind.
    """

    def __init__(self, kind: str, **data):
        if kind not in GIVEN_KINDS:
            raise KeyError(f"unknown given kind {kind!r}; known: {sorted(GIVEN_KINDS)}")
        self.kind, self.data = kind, data

    def __call__(self, x):
        return GIVEN_KINDS[self.kind](x, **self.data)

    def __repr__(self):
        return f"given({self.kind!r})"


def given(kind: str, **data) -> Given:
    """A :class:`Given` callable of ``kind`` built from ``data`` (arrays, numbers)."""
    return Given(kind, **data)


# ---- forward and backward on a module ------------------------------------------------------------

def to_tensor(value, like=None):
    """``value`` as a torch tensor (arrays converted), cast to the dtype of ``like`` if given."""
    import torch
    t = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
    return t if like is None else t.to(like.dtype)


def local_forward_backward(module, args, kwargs, grad_output):
    """Run ``module(*args, **kwargs)`` and back-propagate ``grad_output`` from its (first) output.

    Floating-point tensor or array arguments get ``requires_grad``. Returns ``(out, grads)``: the
    detached first output and ``{"input i": array or None, <parameter name>: array or None}``
    (NumPy arrays; None where no gradient reached). What the checks' ``forward_backward`` does on
    a local module, and what the grader's runner does on the learner's.
    """
    import torch
    inputs = []
    for a in args:
        if isinstance(a, (np.ndarray, torch.Tensor)) and np.issubdtype(np.asarray(
                a.detach() if isinstance(a, torch.Tensor) else a).dtype, np.floating):
            inputs.append(to_tensor(a).detach().clone().requires_grad_(True))
        else:
            inputs.append(a)
    for p in module.parameters():
        p.grad = None
    out = module(*inputs, **kwargs)
    first = out[0] if isinstance(out, (tuple, list)) else out
    first.backward(to_tensor(grad_output, first))
    grads = {f"input {i}": (t.grad.detach().numpy() if t.grad is not None else None)
             for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.requires_grad}
    for name, p in module.named_parameters():
        grads[name] = None if p.grad is None else p.grad.detach().numpy()
    return first.detach(), grads


@contextmanager
def one_thread():
    """PyTorch on one thread inside the block (restored after): the grader's sandbox runs one
    (``OMP_NUM_THREADS=1``), so a check that times or limits the learner's code runs it the same
    way in the learner's kernel. Without torch imported, nothing to do."""
    torch = _torch_if_loaded()
    if torch is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def cache_shapes(module) -> list:
    """The shapes of what ``module`` and its submodules hold in their ``kv_cache`` attribute, in
    ``module.modules()`` order: one list of shapes per module whose cache is not None (a pair
    ``(K, V)`` gives two shapes), so that a check can see *what* a cache stores (the key/value
    heads before ``repeat_kv``, or copies after it) without touching the learner's objects.
    Anything in a cache that is not a tensor is given as the shape ``(-1,)``."""
    import torch
    out = []
    for m in module.modules() if isinstance(module, torch.nn.Module) else [module]:
        held = getattr(m, "kv_cache", None)
        if held is None:
            continue
        items = held if isinstance(held, (tuple, list)) else [held]
        out.append([tuple(int(n) for n in t.shape) if isinstance(t, torch.Tensor) else (-1,)
                    for t in items])
    return out


def record_starts(cls, args, kwargs, steps) -> list[int]:
    """The ``start`` that an attention module built from the learner's class ``cls`` passes to
    its ``apply_positions`` on each cached call: a subclass of ``cls`` that records it (and
    changes nothing else) is built with ``cls(*args, **kwargs)`` and run, under
    ``torch.no_grad()``, on each ``(x, mask)`` of ``steps`` with ``use_cache=True``. Set 03's
    ``apply_positions`` changes nothing, so only this shows a forward that always passes 0."""
    import torch
    seen: list[int] = []

    class Recorded(cls):
        def apply_positions(self, Q, K, start):
            seen.append(int(start))
            return super().apply_positions(Q, K, start)

    module = Recorded(*args, **kwargs)
    with torch.no_grad():
        for x, mask in steps:
            module(to_tensor(x), mask=None if mask is None else to_tensor(mask), use_cache=True)
    return seen


def load_state_dict(module, state: dict) -> None:
    """Load ``state`` (``{name: array or tensor}``) into ``module`` exactly (``strict=True``),
    each value cast to the dtype of the module's current entry, under ``torch.no_grad()``.

    Raises what ``load_state_dict`` raises (a missing or unexpected name, a shape that differs);
    KeyError for a name the module's state dict does not have."""
    import torch
    current = module.state_dict()
    with torch.no_grad():
        module.load_state_dict({k: to_tensor(v, current[k]) for k, v in state.items()},
                               strict=True)


# ---- the in-place rule ---------------------------------------------------------------------------

def _is_array(value) -> bool:
    if isinstance(value, np.ndarray):
        return True
    torch = _torch_if_loaded()
    return torch is not None and isinstance(value, torch.Tensor)


def _copy(value):
    if isinstance(value, np.ndarray):
        return value.copy()
    return value.detach().clone()


def _same(a, b) -> bool:
    """Whether array or tensor ``a`` still equals ``b`` (its copy from before), NaN equal to NaN."""
    if tuple(a.shape) != tuple(b.shape):
        return False
    if isinstance(a, np.ndarray):
        try:
            return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
        except TypeError:
            return bool(np.array_equal(a, b))
    import torch
    a = a.detach()
    return bool(torch.equal(a, b) or (a.is_floating_point() and a.dtype == b.dtype and
                                      torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)))


def call_on_copies(fn: Callable, args, kwargs) -> tuple[Any, list[tuple[int | str, Any]]]:
    """Call ``fn`` on copies of the arrays and tensors among ``args`` and ``kwargs``.

    The in-place rule: what the learner's code does to its inputs never reaches the caller's
    arrays (the check computes its expected values from them), and a copy the code changed in
    place is reported. Returns ``(result, changed)``, ``changed`` the ``(key, copy as it is now)``
    pairs of the arguments changed, in argument order: the key is the position (int) of a
    positional argument or the name (str) of a keyword argument. Raises what ``fn`` raises.
    """
    args, kwargs = list(args), dict(kwargs)
    originals = {}
    for key, value in list(enumerate(args)) + list(kwargs.items()):
        if _is_array(value):
            originals[key] = value
            if isinstance(key, int):
                args[key] = _copy(value)
            else:
                kwargs[key] = _copy(value)
    result = fn(*args, **kwargs)
    changed = []
    for key, before in originals.items():
        passed = args[key] if isinstance(key, int) else kwargs[key]
        if not _same(passed, before):
            changed.append((key, passed))
    return result, changed


def parameter_name(fn: Callable, key: int | str) -> int | str:
    """How to name argument ``key`` of ``fn`` in feedback: the name its signature gives a
    positional argument, else ``key`` itself (a keyword's name, or a position)."""
    if isinstance(key, str):
        return key
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return params[key].name if key < len(params) else key
    except (TypeError, ValueError):
        return key


# ---- the time limit ------------------------------------------------------------------------------

class TimeLimitExceeded(BaseException):
    """Raised inside the learner's code when its time limit runs out (a BaseException, so that a
    bare ``except Exception`` in the learner's code cannot swallow it)."""


@contextmanager
def time_limit(seconds: float | None):
    """Raise :class:`TimeLimitExceeded` in the enclosed code after ``seconds`` (SIGALRM).

    No limit where ``seconds`` is None or 0, where the platform has no ``setitimer``, and outside
    the main thread (signals reach only the main thread: the grader's checks run in threads and
    leave the limit to the runner). The previous SIGALRM handler is restored on the way out."""
    usable = (bool(seconds) and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def on_alarm(signum, frame):
        raise TimeLimitExceeded()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, float(seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ---- the learner's frames and cells --------------------------------------------------------------

def _machinery(filename: str) -> bool:
    """Frames of txlearn, the standard library and installed packages are not the learner's."""
    stdlib = os.path.dirname(os.__file__)
    return (filename.startswith((_PACKAGE_DIR + os.sep, stdlib + os.sep, "<frozen"))
            or "site-packages" in filename or "dist-packages" in filename)


def learner_frames(tb, limit: int = 6) -> list[str]:
    """The learner's own frames of traceback ``tb`` (the last ``limit``), each as
    ``"line N in NAME: source"`` cut to 160 characters. Frames of txlearn, the standard library
    and installed packages are the machinery and left out; the learner's cells, in a kernel or
    in the grader's runner, and their own files stay."""
    out = []
    for frame in traceback.extract_tb(tb):
        filename = frame.filename or ""
        if _machinery(filename):
            continue
        source = (frame.line or linecache.getline(filename, frame.lineno) or "").strip()
        out.append(f"line {frame.lineno} in {frame.name}: {source}"[:160])
    return out[-limit:] if limit else out


def strip_magics(source: str) -> str:
    """A cell's source without IPython magics and shell lines (``%...``, ``!...``), which plain
    Python cannot run: what the learner's kernel would run of it, everywhere else."""
    return "\n".join(line for line in source.splitlines()
                     if not line.lstrip().startswith(("%", "!")))
