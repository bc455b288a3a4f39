# ---
# jupyter:
#   txlearn:
#     title: "Exercises 07: one full transformer layer"
#     minutes: 45
#     objectives:
#     - assemble one post-LN transformer layer from its parts
#     - count a layer's parameters
#     imports: [numpy, txlearn.norms, txlearn.softmax]
# ---

# %% [markdown]
# Conventions of the course: arrays are NumPy `float64`; weights are `(d_in, d_out)` and applied
# as `x @ W + b`; LayerNorm uses the biased variance with `eps = 1e-5` inside the square root.
# You may use the course's helpers imported below (`softmax_np` from lesson 01, `layer_norm_np`
# from lesson 06).

# %%
import numpy as np

from txlearn.norms import layer_norm_np
from txlearn.softmax import softmax_np

# %% [markdown]
# ## Exercise 1: the post-LN layer, forward pass
#
# Write `post_ln_layer(x, p, n_heads)` for one sequence `x` of shape `(T, d_model)` and return
# the layer's output, also `(T, d_model)`. The parameters are in the dict `p`:
#
# | key | shape | | key | shape |
# |---|---|---|---|---|
# | `W_Q`, `W_K`, `W_V`, `W_O` | `(d_model, d_model)` | | `W_1`, `b_1` | `(d_model, d_ff)`, `(d_ff,)` |
# | `b_Q`, `b_K`, `b_V`, `b_O` | `(d_model,)` | | `W_2`, `b_2` | `(d_ff, d_model)`, `(d_model,)` |
# | `gamma1`, `beta1` | `(d_model,)` | | `gamma2`, `beta2` | `(d_model,)` |
#
# The paper's order (post-LN), with ReLU in the FFN:
#
# $$h = \text{LayerNorm}_1\big(x + \text{MultiHead}(x)\big), \qquad
#   \text{out} = \text{LayerNorm}_2\big(h + \text{FFN}(h)\big)$$
#
# $$\text{MultiHead}(x) = \text{Concat}(\text{head}_1, \dots, \text{head}_{n})\, W_O + b_O, \quad
#   \text{head}_i = \text{softmax}\!\Big(\tfrac{Q_i K_i^\top}{\sqrt{d_k}}\Big) V_i, \quad
#   \text{FFN}(h) = \max(0,\, h W_1 + b_1)\, W_2 + b_2$$
#
# where `Q = x @ W_Q + b_Q` is split into `n_heads` heads of width `d_k = d_model // n_heads`
# (head `i` takes features `i*d_k ... (i+1)*d_k - 1`), and likewise `K` and `V`. No mask.

# %% tags=["answer"] exercise="post_ln_layer"
def post_ln_layer(x, p, n_heads):
    ### BEGIN SOLUTION
    T, d_model = x.shape
    d_k = d_model // n_heads

    def heads(W, b):
        return (x @ W + b).reshape(T, n_heads, d_k).transpose(1, 0, 2)  # (n_heads, T, d_k)

    Q, K, V = heads(p["W_Q"], p["b_Q"]), heads(p["W_K"], p["b_K"]), heads(p["W_V"], p["b_V"])
    weights = softmax_np(Q @ K.transpose(0, 2, 1) / np.sqrt(d_k))  # (n_heads, T, T)
    merged = (weights @ V).transpose(1, 0, 2).reshape(T, d_model)  # (T, d_model)
    attention = merged @ p["W_O"] + p["b_O"]
    h = layer_norm_np(x + attention, p["gamma1"], p["beta1"])
    ffn = np.maximum(h @ p["W_1"] + p["b_1"], 0.0) @ p["W_2"] + p["b_2"]
    return layer_norm_np(h + ffn, p["gamma2"], p["beta2"])
    ### END SOLUTION

# %% tags=["check"] exercise="post_ln_layer"
from txlearn.checks import check
check("post_ln_layer", post_ln_layer)

# %% [markdown]
# ## Exercise 2: how many parameters does one layer have?
#
# Write `layer_param_count(d_model, n_heads, d_ff)` returning an `int`: the number of
# parameters of the layer of exercise 1 (multi-head attention with biases, a ReLU FFN with
# biases, two LayerNorms with `gamma` and `beta`). Think about which sizes `n_heads` changes.
# For the paper's base layer (`d_model = 512`, `d_ff = 2048`) the lesson's counter gives
# 3,152,384.

# %% tags=["answer"] exercise="layer_param_count"
def layer_param_count(d_model, n_heads, d_ff):
    ### BEGIN SOLUTION
    attention = 4 * d_model * d_model + 4 * d_model  # W_Q, W_K, W_V, W_O and their biases
    ffn = 2 * d_model * d_ff + d_ff + d_model  # W_1, W_2, b_1, b_2
    norms = 2 * 2 * d_model  # gamma and beta, twice
    return attention + ffn + norms
    ### END SOLUTION

# %% tags=["check"] exercise="layer_param_count"
from txlearn.checks import check
check("layer_param_count", layer_param_count)
