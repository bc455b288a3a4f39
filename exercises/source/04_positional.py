# ---
# jupyter:
#   txlearn:
#     title: "Exercises 04: positional encodings"
#     minutes: 30
#     objectives:
#     - compute the sinusoidal encoding in the paper's layout
#     - rotate queries and keys by their position (RoPE)
#     imports: [numpy]
# ---

# %% [markdown]
# Two exercises on lesson 04 (`notebooks/04_positional.ipynb`). Write each function in its answer
# cell, then run the check cell below it: it prints `PASSED: <exercise>` or tells you what differs
# and gives a hint. Use NumPy (float64).

# %%
import numpy as np

# %% [markdown]
# ## Exercise 1: the sinusoidal table
#
# Write `sinusoidal_encoding(T, d_model)` returning the array `PE` of shape `(T, d_model)` with
#
# $$PE[pos, 2i] = \sin(pos\,\omega_i), \qquad PE[pos, 2i+1] = \cos(pos\,\omega_i),
# \qquad \omega_i = 10000^{-2i/d_model},$$
#
# for $i = 0, \dots, d_{model}/2 - 1$: sin at the **even** feature indices, cos at the **odd** ones
# (the paper's layout, section 3.5). With `d_model = 4`, position 1 is
# `[0.841471, 0.540302, 0.010000, 0.999950]`.

# %% tags=["answer"] exercise="sinusoidal_encoding"
def sinusoidal_encoding(T, d_model):
    ### BEGIN SOLUTION
    pos = np.arange(T)[:, None]                                      # (T, 1)
    omega = 10000.0 ** (-np.arange(0, d_model, 2) / d_model)         # (d_model/2,)
    pe = np.zeros((T, d_model))
    pe[:, 0::2] = np.sin(pos * omega)                                # even indices
    pe[:, 1::2] = np.cos(pos * omega)                                # odd indices
    return pe
    ### END SOLUTION

# %% tags=["check"] exercise="sinusoidal_encoding"
from txlearn.checks import check
check("sinusoidal_encoding", sinusoidal_encoding)

# %% [markdown]
# ## Exercise 2: a RoPE rotation
#
# Write `rope_rotation(x, positions)`: `x` is `(T, d)` (queries or keys, `d` even), `positions` is
# an integer array `(T,)`. Rotate each channel pair `(a, b) = (x[t, 2i], x[t, 2i+1])` (the
# *interleaved* pairing) by the angle $m\,\theta_i$ with $m$ = `positions[t]` and
# $\theta_i = 10000^{-2i/d}$:
#
# $$(a, b) \mapsto (a\cos m\theta_i - b\sin m\theta_i,\; a\sin m\theta_i + b\cos m\theta_i).$$
#
# Return a new array of the same shape.

# %% tags=["answer"] exercise="rope_rotation"
def rope_rotation(x, positions):
    ### BEGIN SOLUTION
    d = x.shape[-1]
    theta = 10000.0 ** (-np.arange(0, d, 2) / d)                     # (d/2,)
    angle = np.asarray(positions)[:, None] * theta                   # (T, d/2)
    a, b = x[:, 0::2], x[:, 1::2]                                    # (T, d/2) each
    out = np.empty_like(x, dtype=np.float64)
    out[:, 0::2] = a * np.cos(angle) - b * np.sin(angle)
    out[:, 1::2] = a * np.sin(angle) + b * np.cos(angle)
    return out
    ### END SOLUTION

# %% tags=["check"] exercise="rope_rotation"
from txlearn.checks import check
check("rope_rotation", rope_rotation)
