"""Checks of set 05 (lesson 05): gelu, feed_forward (``FeedForward``, GELU) and swiglu (``SwiGLU``).

References: ``torch.nn.functional.gelu`` (exact) and ``F.silu`` in float64 with the same weights.
When an answer is wrong, the outputs of the catalogued mistakes (``tests/catalogue/ffn.py``) on
the same inputs choose the hint. Source: ``exercises/source/05_ffn.py``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from txlearn.checks import exercise, expect_close, expect_true
from txlearn.checks.modules import (F32, backward, expect_dtype, expect_match, expect_shape_of,
                                    expect_tensor, load, make_module, np64, run)

# ----------------------------------------------------------------------------- gelu

GELU_TANH = (
    "the exact GELU, not an approximation",
    "x Phi(x) with Phi the normal CDF, written with erf; the tanh formula is an approximation",
    "you computed the tanh approximation (it differs by up to about 5e-4)")
GELU_SIGMOID = (
    "the exact GELU, not an approximation",
    "x Phi(x) with Phi the normal CDF, written with erf",
    "you computed x * sigmoid(1.702 x), the sigmoid approximation")
GELU_NO_SQRT2 = (
    "the normal CDF of x",
    "Phi(x) = (1 + erf(x / sqrt(2))) / 2: erf takes x / sqrt(2)",
    "you passed x itself to erf")
GELU_NO_HALF = (
    "the normal CDF lies between 0 and 1",
    "Phi(x) = (1 + erf(x / sqrt(2))) / 2: mind the factor 1/2",
    "your Phi goes up to 2: the 1/2 is missing")
GELU_RELU = (
    "GELU is smooth",
    "negative inputs give small negative outputs, not 0",
    "you computed ReLU")
GELU_MATH_ERF = (
    "functions of the math module take one number",
    "math.erf cannot take a tensor",
    "use torch.erf, elementwise on the whole tensor")
GELU_TENSOR = (
    "the result is a tensor",
    "NumPy (or a Python loop) returns something else and cuts the gradient",
    "compute with torch functions on x")
GELU_HALF_ARG = (
    "the normal CDF of x",
    "Phi(x) = (1 + erf(x / sqrt(2))) / 2: erf takes x / sqrt(2), not x / 2",
    "you divided x by 2 inside erf")
GELU_PHI_ONLY = (
    "GELU multiplies x by a probability",
    "GELU(x) = x Phi(x): Phi(x) is the gate, x what it lets through",
    "you returned Phi(x) alone")
GELU_FLOAT32 = (
    "keep the precision of x",
    "compute in the dtype of x: a float64 input is computed in float64",
    "your values are right to float32 precision only: something in your function works in "
    "float32 (a .float(), a float32 constant tensor)")
GELU_DEFAULT = ("GELU(x) = x Phi(x) = x (1 + erf(x / sqrt(2))) / 2",)


def _gelu_mistakes(x):
    x = torch.as_tensor(np64(x))
    return [(lambda: F.gelu(x, approximate="tanh"), GELU_TANH),
            (lambda: x * torch.sigmoid(1.702 * x), GELU_SIGMOID),
            (lambda: 0.5 * x * (1 + torch.erf(x)), GELU_NO_SQRT2),
            (lambda: x * (1 + torch.erf(x / math.sqrt(2))), GELU_NO_HALF),
            (lambda: torch.relu(x), GELU_RELU),
            (lambda: 0.5 * x * (1 + torch.erf(x / 2)), GELU_HALF_ARG),
            (lambda: 0.5 * (1 + torch.erf(x / math.sqrt(2))), GELU_PHI_ONLY),
            (lambda: F.gelu(x.float()).double(), GELU_FLOAT32)]


@exercise("gelu")
def gelu(gelu):
    g = torch.Generator().manual_seed(5)
    cases = [("x = linspace(-4, 4, 17), float64", torch.linspace(-4, 4, 17, dtype=torch.float64)),
             ("x (3, 4) float32, scale 3", 3 * torch.randn(3, 4, generator=g)),
             ("x = [-30, -6, 6, 30] float32", torch.tensor([-30.0, -6.0, 6.0, 30.0]))]
    for case, x in cases:
        got = run(gelu, x.clone(), case=case, raised=[("calar", GELU_MATH_ERF),
                                                     ("one element", GELU_MATH_ERF)])
        expect_tensor(got, case=case, hint=GELU_TENSOR)
        expect_shape_of(got, tuple(x.shape), case=case, hint=("GELU is elementwise",))
        expect_dtype(got, x.dtype, case=case, hint=("keep the dtype of x",))
        tol = {"rtol": 1e-10, "atol": 1e-12} if x.dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-6}
        # diagnosed within 1e-6: a float32 computation differs from its own float32 oracle
        dtol = (1e-6, 1e-6) if x.dtype == torch.float64 else None
        expect_match(got, F.gelu(torch.as_tensor(np64(x))), case=case, **tol,
                     mistakes=_gelu_mistakes(x), default=GELU_DEFAULT, dtol=dtol)


# ----------------------------------------------------------------------------- feed_forward

FF_RELU = (
    "this network uses GELU",
    "the activation between W_1 and W_2 is your gelu",
    "you used ReLU")
FF_TANH = (
    "this network uses the exact GELU",
    "use your gelu of exercise 1, not the tanh approximation",
    "you used the tanh approximation")
FF_LINEAR = (
    "the network is non-linear",
    "apply GELU to x W_1 + b_1",
    "without an activation the two layers collapse into one linear map")
FF_ACT_TWICE = (
    "one activation, between the two layers",
    "the output x W_2 + b_2 is not passed through GELU",
    "you applied GELU after W_2 as well")
FF_ACT_MOVED = (
    "one activation, between the two layers",
    "GELU acts on the hidden layer x W_1 + b_1, and x W_2 + b_2 is returned as it is",
    "you applied GELU to the output (after W_2) instead of to the hidden layer")
FF_RESIDUAL = (
    "the residual belongs to the layer, not to the FFN",
    "return GELU(x W_1 + b_1) W_2 + b_2 alone; set 06 adds x around it",
    "you added x to the output")
FF_BIAS_ORDER = (
    "the bias is part of the affine map",
    "GELU acts on x W_1 + b_1",
    "you added b_1 after the activation")
FF_LAYOUT = (
    "weights are (d_in, d_out), applied as x @ W",
    "W_1 maps d_model to d_ff: it is (d_model, d_ff); W_2 is (d_ff, d_model)",
    "yours have PyTorch's nn.Linear layout (d_out, d_in)")
FF_NAMES = (
    "the state-dict names are part of the statement",
    "W_1, W_2 and, when bias is true, b_1, b_2: nothing else",
    "with bias=False the module has no b_1 or b_2")
FF_GRAD = (
    "the module must be trainable",
    "gradients flow through forward: no NumPy, .detach(), .data or torch.no_grad inside it",
    "no gradient reached a parameter or the input")
FF_DEFAULT = ("FFN(x) = GELU(x W_1 + b_1) W_2 + b_2",)


def _t(state):
    return {k: torch.as_tensor(v, dtype=torch.float64) if not torch.is_tensor(v) else v
            for k, v in state.items()}


def _ffn(state, x, *, act="gelu", act_out=False, residual=False, b1_after=False):
    t, x = _t(state), x if torch.is_tensor(x) and x.dtype == torch.float64 else torch.as_tensor(np64(x))
    acts = {"gelu": F.gelu, "relu": torch.relu, "tanh": lambda z: F.gelu(z, approximate="tanh"),
            "none": lambda z: z}
    act_after = F.gelu if act == "none" else acts[act]      # act="none", act_out: GELU moved out
    h = x @ t["W_1"]
    h = acts[act](h) + t.get("b_1", 0.0) if b1_after else acts[act](h + t.get("b_1", 0.0))
    out = h @ t["W_2"] + t.get("b_2", 0.0)
    out = act_after(out) if act_out else out
    return out + x if residual else out


def _ffn_mistakes(state, x):
    def v(**kw):
        return lambda: _ffn(state, x, **kw)
    return [(v(act="relu"), FF_RELU), (v(act="tanh"), FF_TANH), (v(act="none"), FF_LINEAR),
            (v(act_out=True), FF_ACT_TWICE), (v(act="none", act_out=True), FF_ACT_MOVED),
            (v(residual=True), FF_RESIDUAL),
            (v(b1_after=True), FF_BIAS_ORDER)]


def _state(shapes, seed):
    rng = np.random.default_rng(seed)
    return {k: rng.normal(0.0, 0.7, s) for k, s in shapes.items()}


def _expect_grads(grads, want, case, hint):
    for name, w in want.items():
        have = grads.get(name)
        expect_true(have is not None, case=case, message=f"no gradient reached {name}", hint=hint)
        expect_close(have, w, case=f"{case}, gradient of {name}", **F32, hint=hint)


def _reference_grads(fn, state, x, g):
    t = {k: torch.as_tensor(v, dtype=torch.float64).requires_grad_(True) for k, v in state.items()}
    xr = torch.as_tensor(np64(x)).requires_grad_(True)
    fn(t, xr).backward(torch.as_tensor(np64(g)))
    return {"input 0": xr.grad, **{k: v.grad for k, v in t.items()}}


@exercise("feed_forward", needs=("gelu",))
def feed_forward(FeedForward):
    g = torch.Generator().manual_seed(6)
    shapes = {"W_1": (8, 16), "b_1": (16,), "W_2": (16, 8), "b_2": (8,)}
    for case, bias, x in (("d_model=8, d_ff=16, x (2, 3, 8) float32", True, torch.randn(2, 3, 8, generator=g)),
                          ("bias=False, d_model=8, d_ff=16, x (5, 8) float32", False,
                           torch.randn(5, 8, generator=g))):
        m = make_module(FeedForward, 8, 16, case=case, **({} if bias else {"bias": False}))
        state = _state(shapes if bias else {k: s for k, s in shapes.items() if k[0] == "W"}, 7)
        load(m, state, case=case, names=FF_NAMES, shapes={"W_1": FF_LAYOUT, "W_2": FF_LAYOUT})
        got = run(m, x.clone(), case=case)
        expect_shape_of(got, tuple(x.shape), case=case, hint=("the output has the shape of x",))
        expect_match(got, _ffn(state, x), case=case, **F32, mistakes=_ffn_mistakes(state, x),
                     default=FF_DEFAULT)

    case = "gradients: d_model=8, d_ff=16, x (2, 3, 8)"
    m = make_module(FeedForward, 8, 16, case=case)
    state = _state(shapes, 8)
    load(m, state, case=case, names=FF_NAMES, shapes={"W_1": FF_LAYOUT, "W_2": FF_LAYOUT})
    x, g_out = torch.randn(2, 3, 8, generator=g), torch.randn(2, 3, 8, generator=g)
    _, grads = backward(m, x.clone(), grad_output=g_out, case=case,
                        raised=[("grad", FF_GRAD), ("numpy", FF_GRAD)])
    _expect_grads(grads, _reference_grads(_ffn, state, x, g_out), case, FF_GRAD)


# ----------------------------------------------------------------------------- swiglu

SW_SWAPPED = (
    "only the gate goes through SiLU",
    "the gate is x W_3 (+ b_3); the up projection x W_1 (+ b_1) stays linear",
    "you put W_1 under the SiLU and left W_3 linear")
SW_SIGMOID = (
    "SiLU, not the sigmoid",
    "SiLU(z) = z sigmoid(z)",
    "a bare sigmoid makes GLU, not SwiGLU")
SW_GELU = (
    "SwiGLU gates with SiLU",
    "SiLU(z) = z sigmoid(z)",
    "you used GELU (that is GEGLU)")
SW_SILU_AFTER = (
    "the SiLU acts on the gate alone",
    "SiLU(x W_3) is computed first, then multiplied by x W_1",
    "you applied SiLU to the product")
SW_NO_GATE = (
    "SwiGLU multiplies two projections",
    "the gate SiLU(x W_3) multiplies the up projection x W_1 elementwise",
    "W_3 was never used")
SW_SUM = (
    "the gate multiplies",
    "combine SiLU(x W_3) and x W_1 elementwise with *, not +",
    "you added them")
SW_BOTH = (
    "only the gate goes through SiLU",
    "the up projection x W_1 stays linear",
    "you applied SiLU to both projections")
SW_NAMES = (
    "the state-dict names are part of the statement",
    "W_1 (up), W_3 (gate), W_2 (down) and, only when bias is true, b_1, b_3, b_2",
    "the default is bias=False: no biases at all")
SW_DEFAULT = ("SwiGLU(x) = (SiLU(x W_3 + b_3) * (x W_1 + b_1)) W_2 + b_2",)


def _swiglu(state, x, *, gate="W_3", act="silu", silu_after=False, combine="mul", both=False):
    t, x = _t(state), x if torch.is_tensor(x) and x.dtype == torch.float64 else torch.as_tensor(np64(x))
    acts = {"silu": F.silu, "sigmoid": torch.sigmoid, "gelu": F.gelu}
    up_name = "W_1" if gate == "W_3" else "W_3"
    g = x @ t[gate] + t.get("b_" + gate[-1], 0.0)
    u = x @ t[up_name] + t.get("b_" + up_name[-1], 0.0)
    if combine == "none":
        h = F.silu(u)
    elif silu_after:
        h = F.silu(g * u)
    else:
        a = acts[act](g)
        u = F.silu(u) if both else u
        h = a * u if combine == "mul" else a + u
    return h @ t["W_2"] + t.get("b_2", 0.0)


def _swiglu_mistakes(state, x):
    def v(**kw):
        return lambda: _swiglu(state, x, **kw)
    return [(v(gate="W_1"), SW_SWAPPED), (v(act="sigmoid"), SW_SIGMOID), (v(act="gelu"), SW_GELU),
            (v(silu_after=True), SW_SILU_AFTER), (v(combine="none"), SW_NO_GATE),
            (v(combine="add"), SW_SUM), (v(both=True), SW_BOTH)]


@exercise("swiglu")
def swiglu(SwiGLU):
    g = torch.Generator().manual_seed(9)
    shapes = {"W_1": (8, 12), "W_3": (8, 12), "W_2": (12, 8)}
    biases = {"b_1": (12,), "b_3": (12,), "b_2": (8,)}
    for case, bias, x in (("d_model=8, d_ff=12, default bias=False, x (2, 3, 8) float32", False,
                           torch.randn(2, 3, 8, generator=g)),
                          ("bias=True, x (4, 8) float32", True, torch.randn(4, 8, generator=g))):
        m = make_module(SwiGLU, 8, 12, case=case, **({"bias": True} if bias else {}))
        state = _state({**shapes, **biases} if bias else shapes, 10)
        load(m, state, case=case, names=SW_NAMES, shapes={n: FF_LAYOUT for n in shapes})
        got = run(m, x.clone(), case=case)
        expect_shape_of(got, tuple(x.shape), case=case, hint=("the output has the shape of x",))
        expect_match(got, _swiglu(state, x), case=case, **F32, mistakes=_swiglu_mistakes(state, x),
                     default=SW_DEFAULT)

    case = "gradients: d_model=8, d_ff=12, x (2, 3, 8)"
    m = make_module(SwiGLU, 8, 12, case=case)
    state = _state(shapes, 11)
    load(m, state, case=case, names=SW_NAMES, shapes={n: FF_LAYOUT for n in shapes})
    x, g_out = torch.randn(2, 3, 8, generator=g), torch.randn(2, 3, 8, generator=g)
    _, grads = backward(m, x.clone(), grad_output=g_out, case=case,
                        raised=[("grad", FF_GRAD), ("numpy", FF_GRAD)])
    _expect_grads(grads, _reference_grads(_swiglu, state, x, g_out), case, FF_GRAD)
