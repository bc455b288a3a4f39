"""Reference and catalogued wrong answers for lesson 05's checks (txlearn/checks/ffn.py)."""

import math

import numpy as np

_erf = np.vectorize(math.erf)


def ffn_ref(x, W_1, b_1, W_2, b_2):
    return np.maximum(0.0, x @ W_1 + b_1) @ W_2 + b_2


def ffn_no_activation(x, W_1, b_1, W_2, b_2):
    return (x @ W_1 + b_1) @ W_2 + b_2


def ffn_relu_on_output(x, W_1, b_1, W_2, b_2):
    return np.maximum(0.0, np.maximum(0.0, x @ W_1 + b_1) @ W_2 + b_2)


def ffn_forgets_b_1(x, W_1, b_1, W_2, b_2):
    return np.maximum(0.0, x @ W_1) @ W_2 + b_2


def ffn_transposed(x, W_1, b_1, W_2, b_2):
    return np.maximum(0.0, x @ W_1.T + b_1) @ W_2.T + b_2      # PyTorch's (d_out, d_in) habit


def gelu_ref(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_sigmoid(x):
    return x / (1.0 + np.exp(-1.702 * x))


def gelu_no_sqrt2(x):
    return 0.5 * x * (1.0 + _erf(x))


def gelu_cdf_only(x):
    return 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))


REFERENCE = {"ffn_forward": (ffn_ref,), "gelu_exact": (gelu_ref,)}

WRONG = {
    "ffn_forward": [
        ("no activation", (ffn_no_activation,), "apply ReLU between the two layers"),
        ("ReLU on the output too", (ffn_relu_on_output,), "no ReLU on the output"),
        ("b_1 forgotten", (ffn_forgets_b_1,), "add b_1 before the ReLU"),
        ("weights transposed", (ffn_transposed,), "without transposing"),
    ],
    "gelu_exact": [
        ("tanh approximation", (gelu_tanh,), "tanh approximation"),
        ("sigmoid approximation", (gelu_sigmoid,), "sigmoid approximation"),
        ("erf(x) without sqrt 2", (gelu_no_sqrt2,), "divide by sqrt(2)"),
        ("the CDF without x", (gelu_cdf_only,), "multiply the Gaussian CDF by x"),
    ],
}
