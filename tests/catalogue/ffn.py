"""Reference answers and catalogued wrong answers for set 05's checks (txlearn/checks/ffn.py),
written the way a learner writes them (PyTorch)."""

import math

import numpy as np
import torch
from torch import nn


# ------------------------------------------------------------------ gelu

def gelu_ref(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_sigmoid(x):
    return x * torch.sigmoid(1.702 * x)


def gelu_no_sqrt2(x):
    return 0.5 * x * (1.0 + torch.erf(x))


def gelu_no_half(x):
    return x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_erf_half(x):
    return 0.5 * x * (1 + torch.erf(x / 2))


def gelu_phi_only(x):
    return 0.5 * (1 + torch.erf(x / math.sqrt(2)))


def gelu_in_float32(x):
    y = x.float()
    return (0.5 * y * (1 + torch.erf(y / math.sqrt(2)))).to(x.dtype)


def gelu_relu(x):
    return torch.clamp(x, min=0.0)


def gelu_math_erf(x):
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


def gelu_numpy(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x.numpy() * (1.0 + erf(x.numpy() / math.sqrt(2.0)))


# ------------------------------------------------------------------ feed_forward

def ffn_class(*, act=gelu_ref, act_out=False, residual=False, b1_after=False, layout="in_out",
              bias_always=False, numpy=False):
    class FeedForward(nn.Module):
        def __init__(self, d_model, d_ff, bias=True):
            super().__init__()
            shape_1, shape_2 = ((d_model, d_ff), (d_ff, d_model)) if layout == "in_out" else \
                ((d_ff, d_model), (d_model, d_ff))
            self.W_1 = nn.Parameter(torch.randn(*shape_1))
            self.W_2 = nn.Parameter(torch.randn(*shape_2))
            self.b_1 = nn.Parameter(torch.zeros(d_ff)) if bias or bias_always else None
            self.b_2 = nn.Parameter(torch.zeros(d_model)) if bias or bias_always else None

        def forward(self, x):
            W_1, W_2 = (self.W_1, self.W_2) if layout == "in_out" else (self.W_1.T, self.W_2.T)
            h = x @ W_1
            b_1 = 0.0 if self.b_1 is None else self.b_1
            if numpy:
                h = torch.from_numpy(gelu_numpy((h + b_1).detach())).float()
            else:
                h = act(h) + b_1 if b1_after else act(h + b_1)
            out = h @ W_2 + (0.0 if self.b_2 is None else self.b_2)
            out = act(out) if act_out else out
            return out + x if residual else out

    return FeedForward


class FeedForwardGeluMoved(ffn_class()):
    """GELU applied to the output, after W_2, and not to the hidden layer."""

    def forward(self, x):
        h = x @ self.W_1 + (0.0 if self.b_1 is None else self.b_1)          # no activation here
        return gelu_ref(h @ self.W_2 + (0.0 if self.b_2 is None else self.b_2))


# ------------------------------------------------------------------ swiglu

def swiglu_class(*, mix=lambda gate, up: nn.functional.silu(gate) * up, bias_always=False):
    class SwiGLU(nn.Module):
        def __init__(self, d_model, d_ff, bias=False):
            super().__init__()
            self.W_1 = nn.Parameter(torch.randn(d_model, d_ff))
            self.W_3 = nn.Parameter(torch.randn(d_model, d_ff))
            self.W_2 = nn.Parameter(torch.randn(d_ff, d_model))
            with_bias = bias or bias_always
            self.b_1 = nn.Parameter(torch.zeros(d_ff)) if with_bias else None
            self.b_3 = nn.Parameter(torch.zeros(d_ff)) if with_bias else None
            self.b_2 = nn.Parameter(torch.zeros(d_model)) if with_bias else None

        def forward(self, x):
            gate = x @ self.W_3 + (0.0 if self.b_3 is None else self.b_3)
            up = x @ self.W_1 + (0.0 if self.b_1 is None else self.b_1)
            return mix(gate, up) @ self.W_2 + (0.0 if self.b_2 is None else self.b_2)

    return SwiGLU


silu = nn.functional.silu

REFERENCE = {
    "gelu": (gelu_ref,),
    "feed_forward": (ffn_class(),),
    "swiglu": (swiglu_class(),),
}

WRONG = {
    "gelu": [
        ("tanh approximation", (gelu_tanh,), "tanh approximation"),
        ("sigmoid approximation", (gelu_sigmoid,), "sigmoid(1.702 x)"),
        ("erf(x), not erf(x / sqrt 2)", (gelu_no_sqrt2,), "passed x itself to erf"),
        ("no factor 1/2", (gelu_no_half,), "the 1/2 is missing"),
        ("ReLU", (gelu_relu,), "you computed relu"),
        ("erf(x / 2) (learner 23)", (gelu_erf_half,), "divided x by 2 inside erf"),
        ("Phi(x) without the x (learner 23)", (gelu_phi_only,), "returned phi(x) alone"),
        ("computed in float32, returned in x's dtype (learner 23)", (gelu_in_float32,),
         "right to float32 precision only"),
        ("math.erf on a tensor", (gelu_math_erf,), "use torch.erf"),
        ("NumPy with np.vectorize", (gelu_numpy,), "compute with torch functions"),
    ],
    "feed_forward": [
        ("ReLU", (ffn_class(act=torch.relu),), "you used relu"),
        ("tanh GELU", (ffn_class(act=gelu_tanh),), "tanh approximation"),
        ("no activation", (ffn_class(act=lambda z: z),), "collapse into one linear map"),
        ("GELU after W_2 too", (ffn_class(act_out=True),), "after W_2 as well"),
        ("GELU after W_2 instead of the hidden layer", (FeedForwardGeluMoved,),
         "instead of to the hidden layer"),
        ("residual inside", (ffn_class(residual=True),), "added x to the output"),
        ("b_1 after the activation", (ffn_class(b1_after=True),), "added b_1 after"),
        ("nn.Linear layout", (ffn_class(layout="out_in"),), "(d_out, d_in)"),
        ("biases even with bias=False", (ffn_class(bias_always=True),), "no b_1 or b_2"),
        ("GELU through NumPy", (ffn_class(numpy=True),), "no numpy"),
    ],
    "swiglu": [
        ("gate and up swapped", (swiglu_class(mix=lambda g, u: silu(u) * g),), "W_1 under the SiLU"),
        ("sigmoid gate (GLU)", (swiglu_class(mix=lambda g, u: torch.sigmoid(g) * u),), "makes GLU"),
        ("GELU gate (GEGLU)", (swiglu_class(mix=lambda g, u: gelu_ref(g) * u),), "GEGLU"),
        ("SiLU of the product", (swiglu_class(mix=lambda g, u: silu(g * u)),), "SiLU to the product"),
        ("no gate", (swiglu_class(mix=lambda g, u: silu(u)),), "W_3 was never used"),
        ("sum, not product", (swiglu_class(mix=lambda g, u: silu(g) + u),), "you added them"),
        ("SiLU on both", (swiglu_class(mix=lambda g, u: silu(g) * silu(u)),), "to both projections"),
        ("biases by default", (swiglu_class(bias_always=True),), "no biases at all"),
    ],
}

DEPENDENT = {
    "feed_forward": [
        ("its own gelu is the tanh form", (ffn_class(act=gelu_tanh),), {"gelu": gelu_tanh},
         "fix gelu first"),
    ],
}
