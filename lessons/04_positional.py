# %% [markdown]
# # 04 · Positional encodings
#
# Attention compares every query with every key, and nothing in $\mathrm{softmax}(QK^\top/\sqrt{d_k})V$
# knows *where* a token sits. This lesson measures that blindness, then derives three ways to give
# the model positions: the paper's **sinusoidal** table, a **learned** table, and **rotary**
# encodings (RoPE). Everything used here lives in `txlearn.positional`.

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch

from txlearn.attention import scaled_dot_product_attention
from txlearn.positional import (LearnedPositionalEmbedding, apply_rope, interleaved_to_half,
                                sinusoidal_encoding, sinusoidal_encoding_np,
                                sinusoidal_offset_matrix_np)
from txlearn.plotting import heatmap

torch.manual_seed(0)
rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. Without positions, order is invisible
#
# One self-attention layer with random $W_Q, W_K, W_V$ on $T = 6$ tokens. Shuffle the tokens with a
# permutation $\pi$: if attention ignores order, the outputs are the *same vectors*, shuffled the
# same way, $f(x_\pi) = f(x)_\pi$. "The cat sat" and "sat cat the" then look identical to every
# token.

# %%
T, d_model = 6, 16
x = torch.randn(T, d_model, dtype=torch.float64)
W_Q, W_K, W_V = (torch.randn(d_model, d_model, dtype=torch.float64) / d_model ** 0.5 for _ in range(3))


def self_attention(x):
    return scaled_dot_product_attention(x @ W_Q, x @ W_K, x @ W_V)   # (T, d_model)


perm = torch.tensor([3, 0, 5, 1, 4, 2])
gap_plain = (self_attention(x[perm]) - self_attention(x)[perm]).abs().max().item()
print(f"no positions:   max |f(x_pi) - f(x)_pi| = {gap_plain:.1e}")
assert gap_plain < 1e-12  # equal to float64 rounding: permutation equivariant

pe = sinusoidal_encoding(T, d_model, dtype=torch.float64)                 # (T, d_model)
gap_pos = (self_attention(x[perm] + pe) - self_attention(x + pe)[perm]).abs().max().item()
print(f"with positions: max |f(x_pi + PE) - f(x + PE)_pi| = {gap_pos:.2f}")
assert gap_pos > 0.05  # adding positions breaks the symmetry: order now changes the outputs

# %% [markdown]
# ## 2. The sinusoidal table
#
# Section 3.5 of the paper adds to token $pos$ the vector
#
# $$PE[pos, 2i] = \sin(pos\,\omega_i),\quad PE[pos, 2i+1] = \cos(pos\,\omega_i),\quad
# \omega_i = 10000^{-2i/d_{model}}$$
#
# sin at the **even** feature indices and cos at the **odd** ones (some code concatenates all
# sines then all cosines instead: a different, incompatible layout). Each pair of columns is a
# clock turning at its own speed, from one radian per position ($i=0$) down to $10^{-4}$.

# %%
table = sinusoidal_encoding_np(100, 64)                                   # (T, d_model)
fig, ax = plt.subplots(figsize=(8, 3.5))
heatmap(ax, table, "PE[pos, i]", aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
ax.set(xlabel="feature index", ylabel="position", title="sinusoidal encoding, d_model = 64")
plt.show()

print("position 1, d_model = 4:", np.round(sinusoidal_encoding_np(2, 4)[1], 6))
np.testing.assert_allclose(sinusoidal_encoding_np(2, 4)[1], [0.841471, 0.540302, 0.010000, 0.999950],
                           atol=1e-6)
np.testing.assert_array_equal(table[0], np.tile([0.0, 1.0], 32))  # sin 0 = 0 even, cos 0 = 1 odd

# %% [markdown]
# **Why sines?** The paper says $PE_{pos+k}$ is a *linear function* of $PE_{pos}$. Concretely,
# $PE[pos + k] = PE[pos]\,M_k$ where $M_k$ is block diagonal, one $2\times2$ rotation by $k\,\omega_i$
# per frequency, and the same for every $pos$. Measured:

# %%
errors = []
for k in (1, 7, 50):
    M_k = sinusoidal_offset_matrix_np(k, 64)                               # (d_model, d_model)
    pe = sinusoidal_encoding_np(100 + k, 64)
    errors.append(np.abs(pe[:100] @ M_k - pe[k:]).max())
    assert np.allclose(M_k @ M_k.T, np.eye(64), atol=1e-12)                # a rotation
print("max |PE[pos] M_k - PE[pos + k]| for k = 1, 7, 50:", [f"{e:.1e}" for e in errors])
assert max(errors) < 1e-12

# %% [markdown]
# ## 3. Dot products between encodings depend on distance only
#
# $PE[p] \cdot PE[p+k] = \sum_i \cos(k\,\omega_i)$: a function of the offset $k$ alone, largest
# ($d_{model}/2$) at $k = 0$. It is often said to *decrease steadily* with distance. Measured:

# %%
T_long, d = 512, 64
pe = sinusoidal_encoding_np(T_long, d)
offsets = np.arange(0, 200)
dots = np.array([pe[100] @ pe[100 + k] for k in offsets])
dots_other = np.array([pe[300] @ pe[300 + k] for k in offsets])
rises = int((np.diff(dots) > 0).sum())

fig, ax = plt.subplots(figsize=(7, 3))
ax.plot(offsets, dots)
ax.set(xlabel="offset k", ylabel="PE[p] . PE[p + k]", title=f"d_model = {d}")
plt.show()

print(f"same curve from p = 100 and p = 300: max difference {np.abs(dots - dots_other).max():.1e}")
print(f"PE[p].PE[p] = {dots[0]:.1f}; the curve rises at {rises} of {len(offsets) - 1} steps")
assert np.abs(dots - dots_other).max() < 1e-9       # depends on k only
assert dots[0] == np.max(dots) and abs(dots[0] - d / 2) < 1e-9
assert np.all(dots[1:] < dots[0] - 0.4)             # every other offset is strictly less similar
assert rises > 20                                    # ...but not monotonic: it ripples

# %% [markdown]
# The similarity is highest at distance 0 and falls off overall, but **it is not monotonic**: it
# rises again at many offsets (ripples from the fast clocks). "Closer positions always look more
# alike" is only roughly true.
#
# ## 4. A learned table cannot serve a position it never had
#
# BERT and GPT-2 learn one vector per position, a table `W_pos` of shape `(max_len, d_model)`.
# It can fit whatever the data wants, but it has no row past `max_len`; the sinusoidal formula
# extends to any position (whether the model *uses* unseen positions well is another matter).

# %%
learned = LearnedPositionalEmbedding(max_len=32, d_model=16)
print("learned table:", tuple(learned(32).shape))
try:
    learned(40)
    raised = None
except ValueError as err:
    raised = str(err)
print("T = 40:", raised)
assert raised is not None and "max_len=32" in raised
assert sinusoidal_encoding(40, 16).shape == (40, 16)   # the formula has no maximum

# %% [markdown]
# ## 5. Rotary encodings: relative positions inside the dot product
#
# RoPE (Su et al. 2021) does not add anything to $x$. It rotates each channel pair of a query or a
# key by an angle proportional to its position, $m\,\theta_i$ with $\theta_i = 10000^{-2i/d}$. A
# rotation by $m\theta$ followed by the inverse of one by $n\theta$ is a rotation by $(m - n)\theta$, so
#
# $$\mathrm{RoPE}(q, m) \cdot \mathrm{RoPE}(k, n) \text{ depends on } m - n \text{ only.}$$
#
# We place the same $q$ and $k$ at every pair of positions $0 \le m, n < 64$: the score matrix should
# be constant along each diagonal $m - n = \text{const}$.

# %%
d_k, T = 32, 64
q, k = torch.randn(d_k, dtype=torch.float64), torch.randn(d_k, dtype=torch.float64)
Q = apply_rope(q.expand(T, d_k))               # (T, d_k): q at positions 0..T-1
K = apply_rope(k.expand(T, d_k))               # (T, d_k)
scores = (Q @ K.T).numpy()                     # (T, T): scores[m, n]

diag_spread = max(np.ptp(np.diagonal(scores, offset=o)) for o in range(-T + 1, T))
print(f"largest spread along a diagonal m - n = const: {diag_spread:.1e}")
print(f"spread of all scores: {np.ptp(scores):.1f}")
assert diag_spread < 1e-10

norm_change = (Q.norm(dim=-1) - q.norm()).abs().max().item()
print(f"|RoPE(q, m)| - |q| over m: {norm_change:.1e} (rotations keep norms)")
assert norm_change < 1e-12

fig, ax = plt.subplots(figsize=(4, 3.5))
heatmap(ax, scores, "score", cmap="viridis")
ax.set(xlabel="key position n", ylabel="query position m", title="RoPE(q, m) . RoPE(k, n)")
plt.show()

# %% [markdown]
# **Two pairings.** The RoFormer paper and Meta's LLaMA code pair channels $(2i, 2i+1)$
# (`pairing="interleaved"`); GPT-NeoX and Hugging Face's LLaMA pair $(i, i + d/2)$ (`"half"`). Both are
# RoPE; a checkpoint moves from one to the other by permuting the output columns of $W_Q$ and $W_K$
# (`interleaved_to_half`). Measured on the scores:

# %%
x = torch.randn(T, d_model, dtype=torch.float64)
W_Q, W_K = torch.randn(d_model, d_k, dtype=torch.float64), torch.randn(d_model, d_k, dtype=torch.float64)
S_interleaved = apply_rope(x @ W_Q) @ apply_rope(x @ W_K).T
S_half = (apply_rope(x @ interleaved_to_half(W_Q), pairing="half")
          @ apply_rope(x @ interleaved_to_half(W_K), pairing="half").T)
gap = (S_interleaved - S_half).abs().max().item()
mixed = (S_interleaved - apply_rope(x @ W_Q, pairing="half") @ apply_rope(x @ W_K, pairing="half").T)
print(f"converted weights: max score difference {gap:.1e}; unconverted: {mixed.abs().max().item():.1f}")
assert gap < 1e-10
assert mixed.abs().max().item() > 1.0   # mixing pairings without converting gives other scores

# %% [markdown]
# ## 6. RoPE in bfloat16: the angle must not be rounded
#
# Models often run in bfloat16, which keeps 8 significant bits: between 1024 and 2048 its numbers
# are 8 apart. The angle $m\,\theta_i$ grows with the position $m$, so at long positions the
# *angle* cannot be held in bfloat16 at all, even though its cosine and sine (numbers in
# $[-1, 1]$) can. Measured: the spacing of bfloat16 numbers near $m\,\theta_1$ at $m = 1857$.

# %%
from txlearn.positional import apply_rope_np, rope_angles_np

d_k, m = 32, 1857
angle = rope_angles_np([m], d_k)[0, 1]                      # m * theta_1, float64 radians
near = torch.tensor(np.linspace(angle - 20, angle + 20, 4001))           # float64 grid
spacing = torch.diff(near.to(torch.bfloat16).unique().double()).unique()  # distinct bf16 gaps
rounding = torch.tensor(angle).to(torch.bfloat16).item() - angle
print(f"m theta_1 = {angle:.4f} rad; bfloat16 numbers there are {spacing.tolist()} apart; "
      f"rounding moves the angle by {rounding:+.2f} rad")
assert spacing.tolist() == [8.0] and abs(rounding) <= 4.0 and abs(rounding) > 3.0

# %% [markdown]
# A rotation by an angle that is off by 3.7 radians is a rotation by a nearly random angle. Code
# that rounds the angles to the input's dtype before taking cos and sin (a fault reported
# publicly in other transformer code) does exactly that. Below, that faulty version next to
# `txlearn`'s `apply_rope`, which computes the angles and their cos and sin in float64, rotates in
# float32 and rounds only the result to bfloat16, on $x = e_2$ (so features 2 and 3 of the output
# are $(\cos, \sin)(m\,\theta_1)$):

# %%
def rope_rounding_the_angles(x, positions):
    """The fault, for comparison only: angles rounded to x's dtype before cos and sin."""
    angles = torch.tensor(rope_angles_np(positions, x.shape[-1]), dtype=x.dtype)  # (T, d_k/2)
    a, b = x[..., 0::2], x[..., 1::2]                                             # (T, d_k/2)
    c, s = torch.cos(angles), torch.sin(angles)
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)       # (T, d_k)


e_2 = torch.zeros(1, d_k, dtype=torch.bfloat16)
e_2[0, 2] = 1.0
right = apply_rope_np(e_2.double().numpy(), [m])[0, 2:4]
faulty = rope_rounding_the_angles(e_2, [m])[0, 2:4].double().numpy()
fixed = apply_rope(e_2, [m])[0, 2:4].double().numpy()
print(f"position {m}, features 2-3: right {np.round(right, 6)}, angles rounded to bfloat16 "
      f"{np.round(faulty, 4)}, apply_rope {np.round(fixed, 4)}")
assert np.abs(faulty - right).max() > 1.0          # the issue's [0.2754, -0.9609]
assert np.abs(fixed - right).max() <= 2 ** -9      # within one bfloat16 rounding of the answer

# %% [markdown]
# Over positions, for a random unit vector: the error of the faulty rotation grows with the
# position (the spacing of bfloat16 numbers near the angle doubles with every doubling of $m$) until
# the rotation is as good as random, while `apply_rope`'s stays at the cost of rounding the right
# answer to bfloat16 once (at most $2^{-9}$ per feature of a unit vector).

# %%
positions = [1, 10, 100, 1001, 1857, 3001, 10000, 30000]
u = torch.randn(len(positions), d_k, dtype=torch.float64)
u = (u / u.norm(dim=-1, keepdim=True)).to(torch.bfloat16)               # unit vectors, rounded
exact = apply_rope_np(u.double().numpy(), positions)                   # float64 answer
err_faulty = np.abs(rope_rounding_the_angles(u, positions).double().numpy() - exact).max(-1)
err_fixed = np.abs(apply_rope(u, positions).double().numpy() - exact).max(-1)
err_floor = np.abs(torch.tensor(exact).to(torch.bfloat16).double().numpy() - exact).max(-1)
for p, a, b, c in zip(positions, err_faulty, err_fixed, err_floor):
    print(f"m = {p:>5}: angles rounded {a:.4f}   apply_rope {b:.4f}   rounding the answer {c:.4f}")
assert err_fixed.max() <= 2 ** -9 + 1e-6                # one bfloat16 rounding, at every position
assert err_faulty[positions.index(1001):].min() > 0.1    # the fault: wrong from m = 1001 on

fig, ax = plt.subplots(figsize=(6, 3))
ax.loglog(positions, err_faulty, "o-", label="angles rounded to bfloat16")
ax.loglog(positions, err_fixed, "s-", label="apply_rope (cos, sin from float64)")
ax.axhline(2 ** -9, color="grey", ls=":", lw=0.8, label="half a bfloat16 step, $2^{-9}$")
ax.set(xlabel="position m", ylabel="max |error| (unit vector)", title="RoPE in bfloat16")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# The fault also breaks the promise of section 5: scores no longer depend on $m - n$ alone. The
# same $q$ and $k$, 7 positions apart, placed at four starting positions:

# %%
q16, k16 = q.to(torch.bfloat16)[None], k.to(torch.bfloat16)[None]      # (1, d_k), from section 5
scale = (q16.double().norm() * k16.double().norm()).item()


def score(rope, m):
    return (rope(q16, [m + 7]).double() * rope(k16, [m]).double()).sum().item() / scale


starts = [0, 1850, 3000, 20000]
spread_fixed = np.ptp([score(apply_rope, s) for s in starts])
spread_faulty = np.ptp([score(rope_rounding_the_angles, s) for s in starts])
print(f"spread of q.k / (|q||k|) over the starts: apply_rope {spread_fixed:.4f}, "
      f"angles rounded {spread_faulty:.2f}")
assert spread_fixed <= 2 * 2 ** -8        # each rotated vector rounded once to bfloat16
assert spread_faulty > 0.1

# %% [markdown]
# Float32 angles are not enough at long positions either: near $m = 65{,}519$ float32 numbers are
# $2^{-8} \approx 0.004$ apart, so a float32 angle there is off by up to 0.002 radians, about
# 16,000 times float32's own precision. That is why `apply_rope` computes angles in float64.

# %%
near = torch.tensor(np.linspace(65519 - 0.05, 65519 + 0.05, 1001))
spacing32 = torch.diff(near.float().unique().double()).unique().tolist()
print(f"float32 numbers near 65,519 are {spacing32} apart")
assert spacing32 == [2 ** -8]

# %% [markdown]
# ## Summary
#
# - Attention alone is permutation equivariant (to $10^{-12}$): without positions, order is invisible.
# - The sinusoidal table: sin at even, cos at odd indices; a shift by $k$ is a fixed rotation $M_k$.
# - Encoding similarity depends on the offset only and peaks at 0, but does not decrease monotonically.
# - A learned table stops at `max_len`; RoPE makes the query-key score a function of $m - n$.
#
# Exercises: [`work/04_positional.ipynb`](../work/04_positional.ipynb) (the sinusoidal table, a RoPE rotation).
