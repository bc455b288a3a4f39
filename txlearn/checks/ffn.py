"""Checks for lesson 05's exercises: the FFN forward pass and the exact GELU.

When the learner's answer differs, it is compared with the catalogued mistakes
(tests/catalogue/ffn.py) to choose the hint.
"""

import math

import numpy as np

from txlearn.checks import diagnose, CheckFailure, call, expect_close, expect_shape, exercise
from txlearn.ffn import feed_forward_np, gelu_np, relu_np


SHAPES = ("weights are (d_in, d_out): W_1 is (d_model, d_ff), W_2 is (d_ff, d_model); multiply on the "
          "right, x @ W_1 then @ W_2, without transposing; the output has x's shape (..., d_model)")


def _ffn_cases():
    rng = np.random.default_rng(5)
    d_model, d_ff = 4, 6
    W_1, W_2 = rng.normal(size=(d_model, d_ff)), rng.normal(size=(d_ff, d_model))
    b_1, b_2 = rng.normal(size=d_ff), rng.normal(size=d_model)
    yield "one token, d_model=4, d_ff=6", rng.normal(size=(1, d_model)), W_1, b_1, W_2, b_2
    yield "batch (2, 5, 4), d_ff=6", rng.normal(size=(2, 5, d_model)), W_1, b_1, W_2, b_2


@exercise("ffn_forward")
def ffn_forward(fn):
    for case, x, W_1, b_1, W_2, b_2 in _ffn_cases():
        try:
            got = call(fn, x.copy(), W_1.copy(), b_1.copy(), W_2.copy(), b_2.copy(), case=case)
        except CheckFailure as err:
            if "raised" not in str(err):
                raise
            raise CheckFailure(f"{err}\nHint: {SHAPES}") from None
        expect_shape(got, x.shape, case=case, hint=SHAPES)
        h = x @ W_1 + b_1
        wrongs = [
            (relu_np(h) @ W_2, "add b_2 after the second matrix product"),
            (relu_np(x @ W_1) @ W_2 + b_2, "add b_1 before the ReLU: max(0, x W_1 + b_1)"),
            (h @ W_2 + b_2, "apply ReLU between the two layers: max(0, x W_1 + b_1) W_2 + b_2"),
            (relu_np(relu_np(h) @ W_2 + b_2), "no ReLU on the output: the activation goes only "
                                              "between the two layers"),
            (relu_np(h @ W_2 + b_2), "the ReLU goes between the two layers, on x W_1 + b_1, "
                                     "not on the output"),
        ]
        expect_close(got, feed_forward_np(x, W_1, b_1, W_2, b_2), case=case, atol=1e-6,
                     hint=diagnose(got, wrongs, "FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, on every "
                                                 "token (the last axis) alone"))


GELU_TANH = ("that is the tanh approximation; the exact GELU is x * Phi(x) = 0.5 x (1 + erf(x / "
             "sqrt(2))) (np.vectorize(math.erf), or torch.erf)")
GELU_SIGMOID = "that is the sigmoid approximation x * sigmoid(1.702 x); use erf: 0.5 x (1 + erf(x / sqrt(2)))"
GELU_NO_SQRT2 = "divide by sqrt(2) inside erf: Phi(x) = 0.5 (1 + erf(x / sqrt(2)))"
GELU_NO_X = "GELU(x) = x * Phi(x): multiply the Gaussian CDF by x"


@exercise("gelu_exact")
def gelu_exact(fn):
    x = np.array([-3.0, -1.5, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0])
    erf = np.vectorize(math.erf)
    got = call(fn, x.copy(), case="x in [-3, 3]")
    expect_shape(got, x.shape, case="x in [-3, 3]", hint="apply GELU elementwise")
    wrongs = [
        (gelu_np(x, "tanh"), GELU_TANH),
        (x / (1 + np.exp(-1.702 * x)), GELU_SIGMOID),
        (0.5 * x * (1 + erf(x)), GELU_NO_SQRT2),
        (0.5 * (1 + erf(x / math.sqrt(2))), GELU_NO_X),
    ]
    # tolerance 1e-7: the tanh form differs from the exact GELU by up to about 3e-4 here
    expect_close(got, gelu_np(x), case="x in [-3, 3]", atol=1e-7, rtol=1e-7,
                 hint=diagnose(got, wrongs, "GELU(x) = 0.5 x (1 + erf(x / sqrt(2)))"))
