# %% [markdown]
# # 01 · Softmax and the $1/\sqrt{d_k}$ scale
#
# Symbols: see [the notation table](00_map.ipynb#Notation) of lesson 00.
#
# Attention turns the scores of one query against all keys into weights with a softmax,
#
# $$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V
# \qquad \text{(Vaswani et al. 2017, section 3.2.1, equation 1).}$$
#
# This lesson takes the two pieces in front of $V$ apart and *measures* why each is built the way
# it is:
#
# 1. the softmax, its temperature, and its invariance to a shift;
# 2. why $q \cdot k$ is divided by $\sqrt{d_k}$: its variance grows like $d_k$;
# 3. what happens without the division: the softmax saturates (one weight near 1, entropy near 0);
# 4. why saturation stalls learning: the softmax Jacobian vanishes;
# 5. why every real softmax subtracts the maximum first: overflow in float32.
# 6. the backward pass: the Jacobian derived, and the vector-Jacobian product that every
#    backward pass uses instead of it;
# 7. the gradient that reaches $W_Q$, which is not the gradient into the scores.
#
# Every function used here lives in `txlearn.softmax`; every claim ends in an `assert`.
#
# **You will be able to:** compute a softmax with a temperature and explain its shift
# invariance; derive why $q \cdot k$ has variance $d_k$ and what dividing by $\sqrt{d_k}$ does;
# write the softmax Jacobian and say when it vanishes; and compute a softmax that cannot
# overflow in float32.
#
# **You need:** lesson 00; NumPy; exponentials and logarithms; the mean and variance of a sum of
# independent random variables; a derivative of a vector function (a Jacobian).
#
# **Time:** about 45 minutes to read and run (the cells take a few seconds on a 2-core CPU),
# plus the exercises.

# %%
import math

import matplotlib.pyplot as plt
import numpy as np
import torch

from txlearn.plotting import show
from txlearn.softmax import (entropy_np, log_softmax_np, naive_softmax_np, sample_scores_np,
                             softmax, softmax_jacobian, softmax_jacobian_np, softmax_np,
                             softmax_vjp, softmax_vjp_np)

torch.manual_seed(0)
rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. The softmax
#
# $$\mathrm{softmax}(x)_i = \frac{e^{x_i/\tau}}{\sum_j e^{x_j/\tau}}$$
#
# turns any vector of real scores into positive weights that sum to 1. The temperature $\tau$
# sets how peaked they are: $\tau \to \infty$ gives the uniform distribution, $\tau \to 0$ puts all
# the weight on the largest score. Adding the same constant $c$ to every score changes nothing,
# because $e^{x_i + c} = e^c e^{x_i}$ and $e^c$ cancels between numerator and denominator.

# %%
x = np.array([2.0, 1.0, 0.1, -1.0])
for tau in (0.25, 1.0, 4.0):
    print(f"tau = {tau:4}: {np.round(softmax_np(x, temperature=tau), 3)}")

assert abs(softmax_np(x).sum() - 1) < 1e-12                                  # weights sum to 1
assert np.abs(softmax_np(x + 1e4) - softmax_np(x)).max() < 1e-12             # shift invariance
assert softmax_np(x, temperature=0.25).max() > softmax_np(x, temperature=4.0).max()
assert np.abs(softmax_np(x, temperature=1e6) - 0.25).max() < 1e-5            # tau large: uniform

# %% [markdown]
# ## 2. The variance of $q \cdot k$ grows like $d_k$
#
# Take a query and a key with independent standard-normal entries (what a freshly initialised
# layer roughly produces). Each term $q_i k_i$ of the dot product has mean 0 and variance
# $E[q_i^2]\,E[k_i^2] = 1$, and the $d_k$ terms are independent, so
#
# $$\mathrm{Var}(q \cdot k) = d_k, \qquad \mathrm{Var}\!\left(\frac{q \cdot k}{\sqrt{d_k}}\right) = 1.$$
#
# The paper states this in its footnote 4. We measure it for $d_k = 1, 2, 4, \dots, 1024$ with
# 4000 independent pairs each; the scaled scores are the same samples divided by $\sqrt{d_k}$.
#
# Tolerance: a sample variance over $n$ draws has relative standard error
# $\sqrt{(2 + \kappa)/n}$, where $\kappa = 6/d_k$ is the excess kurtosis of $q \cdot k$ (heavy
# tailed at $d_k = 1$). We accept every point within 5 standard errors.

# %%
d_ks = 2 ** np.arange(11)                    # 1, 2, 4, ..., 1024
n_samples = 4000
var_unscaled = np.array([sample_scores_np(int(d_k), n_samples, scaled=False, seed=int(d_k)).var()
                         for d_k in d_ks])
var_scaled = np.array([sample_scores_np(int(d_k), n_samples, scaled=True, seed=int(d_k)).var()
                       for d_k in d_ks])
slope, intercept = np.polyfit(np.log(d_ks), np.log(var_unscaled), 1)

fig, ax = plt.subplots(figsize=(6, 4))
ax.loglog(d_ks, d_ks, "k--", label="predicted: Var = $d_k$")
ax.loglog(d_ks, var_unscaled, "o", label="measured, $q \\cdot k$")
ax.loglog(d_ks, np.ones_like(d_ks), "k:", label="predicted: Var = 1")
ax.loglog(d_ks, var_scaled, "s", label="measured, $q \\cdot k / \\sqrt{d_k}$")
ax.set_xlabel("$d_k$")
ax.set_ylabel("variance of the score")
ax.set_title(f"Var(q.k) vs $d_k$: fitted log-log slope {slope:.3f}")
ax.legend()
show(fig, alt=f"Log-log plot of the variance of the score against d_k from 1 to 1024. The "
     f"unscaled scores q.k (circles) lie on the dashed line Var = d_k, rising from 1 to about "
     f"1000 (fitted slope {slope:.3f}); the scaled scores q.k / sqrt(d_k) (squares) lie on the "
     "dotted line Var = 1 at every d_k.")

standard_error = np.sqrt((2 + 6 / d_ks) / n_samples)
print(f"fitted slope of log Var vs log d_k: {slope:.3f} (predicted 1)")
print(f"largest |Var/d_k - 1| = {np.abs(var_unscaled / d_ks - 1).max():.3f}, "
      f"scaled variances in [{var_scaled.min():.3f}, {var_scaled.max():.3f}]")
std_64 = math.sqrt(var_unscaled[d_ks == 64][0])
print(f"standard deviation of unscaled scores at d_k = 64: {std_64:.2f} (predicted 8)")
assert abs(slope - 1) < 0.02                                      # on the predicted line
assert abs(std_64 - 8) < 0.4          # 5%: about 4 standard errors of a sample std (1.1%)
assert np.all(np.abs(var_unscaled / d_ks - 1) < 5 * standard_error)
assert np.all(np.abs(var_scaled - 1) < 5 * standard_error)        # ~1 at every d_k

# %% [raw] concept="var-growth"
# question: The scores are unscaled, $q \cdot k$ with standard-normal entries. By what factor does $\mathrm{Var}(q
#   \cdot k)$ grow when $d_k$ doubles?
# kind: choice
# options:
#   a: $\sqrt{2}$
#   b: '2'
#   c: '4'
#   d: '1: it stays the same'
# answer: b
# section: '2.'
# right: '$\mathrm{Var}(q\cdot k) = d_k$: a sum of $d_k$ independent terms of variance 1, so doubling
#   $d_k$ doubles it. The fitted log-log slope above is 1.'
# wrong:
#   a:
#     misconception: Standard deviation taken for variance
#     explain: $\sqrt{2}$ is the growth of the *standard deviation*, $\sqrt{d_k}$; the variance itself
#       grows like $d_k$ (the fitted slope of log Var against log $d_k$ is 1, not 1/2).
#   c:
#     misconception: Variance of a dot product taken as quadratic in $d_k$
#     explain: 'The $d_k$ terms $q_i k_i$ are independent, so their variances add: $d_k \cdot 1$, linear,
#       not $d_k^2$ (the slope is 1, not 2).'
#   d:
#     misconception: Unscaled and scaled scores confused
#     explain: Only the *scaled* scores $q\cdot k/\sqrt{d_k}$ keep variance 1 at every $d_k$; the unscaled
#       ones grow with it.

# %% [raw] concept="std-at-64"
# question: What is the standard deviation of the **unscaled** scores $q \cdot k$ at $d_k = 64$ (the
#   cell printed it)?
# kind: numeric
# answer: 8
# tolerance: 0.5
# section: '2.'
# right: $\sqrt{\mathrm{Var}} = \sqrt{d_k} = \sqrt{64} = 8$, measured within 5% above.
# wrong:
#   64:
#     misconception: Variance given for the standard deviation
#     explain: 64 is the variance, $d_k$; the standard deviation is its square root, 8.
#   1:
#     misconception: Scaled scores taken for unscaled ones
#     explain: 1 is the standard deviation *after* dividing by $\sqrt{d_k}$; unscaled it is $\sqrt{64}
#       = 8$.
#   other:
#     misconception: Not from the variance law
#     explain: $\mathrm{Var}(q\cdot k) = d_k$, so the standard deviation is $\sqrt{d_k}$.

# %% [markdown]
# At $d_k = 64$ (a typical head width) the unscaled scores have a standard deviation of 8
# (measured above): a key whose score is one standard deviation above another's gets
# $e^8 \approx 3000$ times its weight, although both keys are random.
#
# ## 3. Without the scale, the softmax saturates
#
# One query against $S = 16$ keys, all standard normal, 500 independent trials per $d_k$. We
# record the largest attention weight and the entropy $H(p) = -\sum_j p_j \log p_j$ (in nats) of
# each row, with and without the division by $\sqrt{d_k}$. Uniform weights over 16 keys have
# entropy $\log 16 = 2.77$ nats; a one-hot row has entropy 0.

# %%
S, trials = 16, 500


def score_rows(d_k, rng):
    """Scores of `trials` queries against S keys each: (trials, S), unscaled."""
    q = rng.standard_normal((trials, 1, d_k))               # (trials, 1, d_k)
    K = rng.standard_normal((trials, S, d_k))               # (trials, S, d_k)
    return (q @ np.swapaxes(K, -1, -2))[:, 0, :]            # (trials, 1, S) -> (trials, S)


stats = {"unscaled": [], "scaled": []}   # per d_k: (mean max weight, mean entropy, J norms)
for d_k in d_ks:
    s = score_rows(int(d_k), rng)
    for name, logits in (("unscaled", s), ("scaled", s / math.sqrt(d_k))):
        p = softmax_np(logits, axis=-1)                                        # (trials, S)
        J_norm = np.linalg.norm(softmax_jacobian_np(logits), ord=2, axis=(-2, -1))  # (trials,)
        stats[name].append((p.max(-1).mean(), entropy_np(p).mean(), J_norm, p.max(-1)))

max_w = {k: np.array([row[0] for row in v]) for k, v in stats.items()}
H = {k: np.array([row[1] for row in v]) for k, v in stats.items()}

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
for name, marker in (("unscaled", "o-"), ("scaled", "s-")):
    ax1.semilogx(d_ks, max_w[name], marker, base=2, label=name)
    ax2.semilogx(d_ks, H[name], marker, base=2, label=name)
ax1.axhline(1 / S, color="gray", ls=":", label="uniform, 1/S")
ax2.axhline(math.log(S), color="gray", ls=":", label="uniform, log S")
ax1.set(xlabel="$d_k$", ylabel="mean largest weight", title="largest attention weight")
ax2.set(xlabel="$d_k$", ylabel="mean entropy (nats)", title="entropy of the weights")
ax1.legend()
ax2.legend()
show(fig, alt=f"Two plots against d_k from 1 to 1024 (log axis), for softmax rows over S = {S} "
     f"keys. Left, the mean largest attention weight: unscaled scores rise from about "
     f"{max_w['unscaled'][0]:.1f} to {max_w['unscaled'][-1]:.2f} (one key takes almost all the "
     f"weight), scaled ones stay near {max_w['scaled'].mean():.2f}, above the uniform 1/S. Right, "
     f"the mean entropy: unscaled falls from {H['unscaled'][0]:.1f} to {H['unscaled'][-1]:.1f} "
     f"nats, scaled stays near {H['scaled'].mean():.1f}, below the uniform log S = "
     f"{math.log(S):.2f}.")

print(f"d_k = 1024, unscaled: largest weight {max_w['unscaled'][-1]:.3f}, "
      f"entropy {H['unscaled'][-1]:.3f} nats")
print(f"scaled, over all d_k: largest weight in [{max_w['scaled'].min():.3f}, "
      f"{max_w['scaled'].max():.3f}], entropy in [{H['scaled'].min():.3f}, {H['scaled'].max():.3f}]")
assert max_w["unscaled"][-1] > 0.9 and H["unscaled"][-1] < 0.2      # nearly one-hot
assert np.all(np.diff(max_w["unscaled"]) > 0)                        # saturates steadily
assert np.ptp(max_w["scaled"]) < 0.08 and np.ptp(H["scaled"]) < 0.15  # flat in d_k
assert H["scaled"].min() > 0.8 * math.log(S)                         # spread over the keys

# %% [raw] concept="saturation"
# question: One query against 16 random keys, **without** the scale. As $d_k$ grows from 1 to 1024,
#   what happens to the largest attention weight?
# kind: choice
# options:
#   a: 'It rises towards 1: the softmax becomes nearly one-hot'
#   b: 'It stays near $1/16$: the keys are random'
#   c: 'It falls towards $1/16$: more dimensions average out'
# answer: a
# section: '3.'
# right: 'The scores spread like $\sqrt{d_k}$, so the largest one dominates: above 0.9 at $d_k = 1024$
#   with an entropy under 0.2 nats, while the scaled rows stay spread over the keys.'
# wrong:
#   b:
#     misconception: Random keys give even weights
#     explain: Random keys give *random* scores, and unscaled scores of standard deviation $\sqrt{d_k}$
#       make the largest exponential dwarf the others, however random (the measured largest weight rises
#       steadily).
#   c:
#     misconception: Averaging over dimensions makes scores alike
#     explain: 'The sum over $d_k$ dimensions does not average, it adds: the scores'' spread grows like
#       $\sqrt{d_k}$ and the softmax saturates (measured: largest weight above 0.9 at 1024).'

# %% [markdown]
# With the scale, the weights look the same at every width; without it, a 1024-wide head puts
# almost all of its weight on one key *before any training*, chosen by noise.
#
# ## 4. Saturation stalls learning: the softmax Jacobian
#
# The gradient that reaches the scores is the gradient at the weights multiplied by the Jacobian
# of the softmax,
#
# $$J_{ij} = \frac{\partial s_i}{\partial x_j} = s_i(\delta_{ij} - s_j), \qquad
#   J = \operatorname{diag}(s) - s s^\top .$$
#
# First, check the formula against PyTorch's autograd.

# %%
x_t = torch.randn(6, dtype=torch.float64)
J_autograd = torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1), x_t)
gap = (softmax_jacobian(x_t) - J_autograd).abs().max().item()
print(f"max |J_formula - J_autograd| = {gap:.1e}")
assert gap < 1e-15

# %% [markdown]
# Each row $i$ of $J$ has absolute values summing to $2 s_i (1 - s_i)$, so its largest singular
# value (the most any gradient can be amplified) is at most
# $\max_i 2 s_i (1 - s_i) \le 2 (1 - \max_i s_i)$ (Gershgorin). When one weight approaches 1, the
# Jacobian, and with it every gradient into the scores, goes to 0.
#
# Scale one fixed vector of 16 standard-normal logits by $c$ from 0.01 to 100 and measure the
# spectral norm $\lVert J \rVert_2$:

# %%
z = rng.standard_normal(S)
cs = np.logspace(-2, 2, 41)
J_norms = np.array([np.linalg.norm(softmax_jacobian_np(c * z), ord=2) for c in cs])
bounds = np.array([2 * (1 - softmax_np(c * z).max()) for c in cs])
c_peak = cs[J_norms.argmax()]

fig, ax = plt.subplots(figsize=(6, 4))
ax.loglog(cs, J_norms, "o-", label="$\\|J\\|_2$ measured")
ax.loglog(cs, bounds, "k--", label="bound $2(1 - \\max_i s_i)$")
ax.axhline(1 / S, color="gray", ls=":", label="uniform: $1/S$")
ax.set(xlabel="logit scale $c$", ylabel="spectral norm of J",
       title="softmax Jacobian vs logit scale (S = 16)")
ax.legend()
show(fig, alt=f"Log-log plot of the spectral norm of the softmax Jacobian against the scale c "
     f"of a fixed logit vector, c from 0.01 to 100, S = {S}. For small c it sits at the uniform "
     f"value 1/S, rises to a peak of about {J_norms.max():.2f} near c = {c_peak:.1f}, then falls "
     f"steeply, to about {J_norms[-1]:.0e} at c = 100, hugging the dashed bound "
     "2(1 - max s_i) once the softmax saturates.")

print(f"||J|| = {J_norms[0]:.4f} at c = 0.01 (1/S = {1 / S:.4f}), peak {J_norms.max():.3f} "
      f"at c = {c_peak:.1f}, {J_norms[-1]:.1e} at c = 100")
assert np.all(J_norms <= bounds + 1e-12)               # the Gershgorin bound holds
assert abs(J_norms[0] - 1 / S) < 0.01                  # near-uniform: ||J|| ~ 1/S
assert J_norms[-1] < 1e-2 * J_norms.max()              # saturated: 100x smaller than the peak
assert np.all(np.diff(J_norms[cs >= c_peak]) < 0)      # past the peak it only shrinks

# %% [markdown]
# Note what the curve does *not* say: "smaller logits always give bigger gradients" is false.
# Near-uniform weights have a small Jacobian too ($\lVert J \rVert_2 \approx 1/S$); it peaks at a
# moderate scale, where a few keys compete, and then decays exponentially. The $1/\sqrt{d_k}$
# scale does not maximise the gradient; it keeps the logits at unit scale at every width, so the
# network starts on the left of the collapse, whatever $d_k$ is.
#
# Now the same measurement in the attention setting of section 3: the median $\lVert J \rVert_2$
# over 500 rows, scaled and unscaled.

# %%
J_median = {k: np.array([np.median(row[2]) for row in v]) for k, v in stats.items()}
bound_ok = all(np.all(row[2] <= 2 * (1 - row[3]) + 1e-12) for v in stats.values() for row in v)

fig, ax = plt.subplots(figsize=(6, 4))
for name, marker in (("unscaled", "o-"), ("scaled", "s-")):
    ax.loglog(d_ks, J_median[name], marker, base=2, label=name)
ax.set(xlabel="$d_k$", ylabel="median $\\|J\\|_2$ (log scale)",
       title="softmax Jacobian norm vs $d_k$ (S = 16)")
ax.legend()
show(fig, alt=f"Log-log plot of the median spectral norm of the softmax Jacobian over 500 rows "
     f"against d_k from 1 to 1024. Scaled scores stay roughly flat, near "
     f"{np.median(J_median['scaled']):.2f}. Unscaled ones are slightly larger up to d_k = 32, "
     f"then fall steeply, to about {J_median['unscaled'][-1]:.0e} at d_k = 1024.")

for d_k, u, s_ in zip(d_ks, J_median["unscaled"], J_median["scaled"]):
    print(f"d_k = {d_k:5d}: median ||J|| unscaled {u:.2e}, scaled {s_:.3f}")
assert bound_ok
narrow, wide = (d_ks >= 2) & (d_ks <= 32), d_ks >= 64
assert J_median["unscaled"][-1] < 1e-2 * J_median["scaled"][-1]       # 1024: gradient ~gone
assert np.all(J_median["unscaled"][wide] < J_median["scaled"][wide])   # wide heads: smaller
assert np.all(J_median["unscaled"][narrow] > J_median["scaled"][narrow])  # narrow: larger!
assert np.ptp(J_median["scaled"]) < 0.06                              # scaled: flat in d_k

# %% [markdown]
# Measured, not assumed: at small widths ($2 \le d_k \le 32$ here) the *unscaled* scores actually
# have the larger Jacobian, because unit-scale logits sit to the left of the peak above. The
# damage begins at realistic head widths ($d_k = 64$: 0.12 vs 0.19) and is complete by
# $d_k = 1024$ (a median of $2 \times 10^{-5}$, ten thousand times smaller). This is the gradient
# into the *scores*; the weights that learn, $W_Q$ and $W_K$, sit one product further back, and
# section 7 finds that the unscaled gradient reaching them is still the larger one at $d_k = 64$.
#
# One more contrast: when a cross-entropy loss follows the softmax directly (a classifier or the
# language-model head), the gradient at the logits is $s - y$, which does *not* vanish when the
# softmax is confidently wrong; the log cancels the exponential. Saturation hurts where the softmax
# output is used as weights, as in attention.

# %%
logits = torch.tensor(100 * z, requires_grad=True)
wrong_target = int(np.argmin(z))
loss = -torch.log_softmax(logits, -1)[wrong_target]
loss.backward()
ce_grad = logits.grad.norm().item()
print(f"c = 100: ||J||_2 = {J_norms[-1]:.1e}, but ||d CE / d logits|| = {ce_grad:.3f}")
assert ce_grad > 1.0 and J_norms[-1] < 1e-3

# %% [markdown]
# ## 5. Overflow, and the max-shift that fixes it
#
# Computed literally, $e^{x_i} / \sum_j e^{x_j}$ fails in floating point: float32 holds numbers
# up to $3.4 \times 10^{38}$, so $e^{x}$ is `inf` for $x > \ln(3.4 \times 10^{38}) \approx 88.7$,
# and `inf/inf` is NaN. At the other end, $e^x$ loses precision below $e^{-87.3}$ (subnormal
# numbers) and becomes exactly 0 below about $e^{-103.3}$, and `0/0` is NaN too.
#
# The fix is the shift invariance of section 1 with $c = -\max_j x_j$: every exponent is then
# $\le 0$ and the largest term is exactly $e^0 = 1$, so the sum of $n$ terms lies in $[1, n]$. We evaluate
# `[m, m-1, m-2]` in float32 for $m$ from -120 to 120, naive and shifted, against a float64
# reference.

# %%
ms = np.arange(-120, 121)
float32_tiny = np.finfo(np.float32).tiny
err_naive, err_stable = [], []
for m in ms:
    x32 = np.array([m, m - 1, m - 2], dtype=np.float32)
    reference = softmax_np(x32.astype(np.float64))
    err_naive.append(np.abs(naive_softmax_np(x32) - reference).max())
    err_stable.append(np.abs(softmax(torch.from_numpy(x32)).numpy() - reference).max())
err_naive, err_stable = np.array(err_naive), np.array(err_stable)
nan_naive = np.isnan(err_naive)

fig, ax = plt.subplots(figsize=(7, 4))
ax.semilogy(ms, np.where(nan_naive, np.nan, np.maximum(err_naive, 1e-10)), label="naive float32")
ax.semilogy(ms[nan_naive], np.full(nan_naive.sum(), 1.0), "rx", label="naive: NaN")
ax.semilogy(ms, np.maximum(err_stable, 1e-10), label="max-shifted float32 (txlearn.softmax)")
ax.set(xlabel="largest logit m", ylabel="max |error| vs float64 (floor 1e-10)",
       title="softmax of [m, m-1, m-2] in float32")
ax.legend()
show(fig, alt=f"Log-scale plot of the largest error, against float64, of the float32 softmax "
     f"of [m, m-1, m-2] for m from {ms[0]} to {ms[-1]}. The max-shifted softmax is a flat line at "
     f"{err_stable.max():.0e}, float32 rounding, for every m. The naive one is NaN (red crosses) "
     f"for m >= {ms[nan_naive & (ms > 0)].min()} (exp overflows) and m <= "
     f"{ms[nan_naive & (ms < 0)].max()} (every exp underflows to 0), has large errors just above "
     "that lower end (subnormal numbers), and errors of the same order as the shifted one in "
     "between.")

first_overflow = ms[(ms > 0) & nan_naive].min()
last_underflow = ms[(ms < 0) & nan_naive].max()
print(f"naive float32: NaN from m = {first_overflow} (ln of float32 max = "
      f"{math.log(np.finfo(np.float32).max):.2f}) up, and for m <= {last_underflow}")
print(f"naive float32 at m = -100: error {err_naive[ms == -100][0]:.1e} (subnormal exp values, "
      f"below {float32_tiny:.1e})")
print(f"max-shifted: largest error over all m {err_stable.max():.1e}")
assert first_overflow == 89 and np.all(nan_naive[ms >= 89])
assert -106 <= last_underflow <= -103 and np.all(nan_naive[ms <= last_underflow])
assert err_naive[ms == -100][0] > 1e-3                      # precision lost before the NaN
assert np.all(err_naive[(ms >= -80) & (ms <= 88)] < 1e-6)   # fine in between
assert err_stable.max() < 1e-6                              # the shift fixes every m

# %% [raw] concept="overflow-start"
# question: The naive softmax of `[m, m-1, m-2]` in float32 (no max-shift). From which integer $m$ on
#   does it give NaN?
# kind: numeric
# answer: 89
# tolerance: 0
# section: '5.'
# right: $e^{x}$ overflows float32 for $x > \ln(3.4\times10^{38}) \approx 88.7$, so from $m = 89$ on
#   `inf/inf` is NaN; the max-shifted softmax is fine at every $m$.
# wrong:
#   710:
#     misconception: Float64's limit used for float32
#     explain: About 709.8 is where float64's $e^x$ overflows (the `[720, 719]` example); float32 holds
#       far less, up to $3.4\times10^{38} = e^{88.7}$.
#   128:
#     misconception: The exponent's bits taken for the natural log
#     explain: Float32's largest number is about $2^{128}$, so $e^x$ overflows at $x = 128 \ln 2 \approx
#       88.7$, not at 128.
#   38:
#     misconception: The decimal exponent taken for the natural log
#     explain: '$3.4\times10^{38}$ is $e^{88.7}$: the limit on $x$ is $\ln$ of the largest float, not
#       its power of ten.'
#   other:
#     misconception: Not from float32's range
#     explain: 'NaN starts where $e^m$ exceeds float32''s largest number, $3.4\times10^{38}$: the first
#       integer above $\ln(3.4\times10^{38})$.'

# %% [markdown]
# Float64 moves the cliffs (to $\ln(1.8 \times 10^{308}) \approx 709.8$), it does not remove them,
# and logits of a few hundred are not exotic: unscaled scores at $d_k = 1024$ have a standard
# deviation of 32, and masked positions are often set to $-10^4$ or $-\infty$.

# %%
with np.errstate(over="ignore", invalid="ignore"):
    naive64 = naive_softmax_np(np.array([720.0, 719.0]))
print(f"naive float64 softmax([720, 719]) = {naive64}; shifted = {softmax_np([720.0, 719.0])}")
assert np.isnan(naive64).all()
assert np.abs(softmax_np([720.0, 719.0]) - [0.731059, 0.268941]).max() < 1e-6

# %% [markdown]
# The same trick gives a log-softmax that never takes $\log 0$:
# $\log \mathrm{softmax}(x)_i = z_i - \log \sum_j e^{z_j}$ with $z = x - \max_j x_j$.

# %%
with np.errstate(divide="ignore"):
    log_of_softmax = np.log(softmax_np([0.0, -1000.0]))
print(f"log(softmax([0, -1000])) = {log_of_softmax}, log_softmax = {log_softmax_np([0.0, -1000.0])}")
assert np.isneginf(log_of_softmax[1])
assert np.abs(log_softmax_np([0.0, -1000.0]) - [0.0, -1000.0]).max() < 1e-12

# %% [markdown]
# ## 6. The backward pass: the Jacobian derived, and what every backward pass computes instead
#
# Section 4 stated the Jacobian; here it is derived. Write $s_i = e^{x_i}/Z$ with
# $Z = \sum_k e^{x_k}$, so $\partial Z / \partial x_j = e^{x_j}$. The quotient rule gives
#
# $$\frac{\partial s_i}{\partial x_j}
#   = \frac{\delta_{ij} e^{x_i} Z - e^{x_i} e^{x_j}}{Z^2}
#   = s_i \delta_{ij} - s_i s_j = s_i(\delta_{ij} - s_j),
#   \qquad J = \operatorname{diag}(s) - s s^\top .$$
#
# A backward pass never needs $J$ itself. It receives $g = \partial \mathcal{L} / \partial s$ (the
# gradient of the loss at the softmax's output) and must return
# $\partial \mathcal{L} / \partial x = J^\top g$, the **vector-Jacobian product** (VJP). Row $j$
# of it is $\sum_i g_i s_i (\delta_{ij} - s_j) = s_j g_j - s_j \sum_i s_i g_i$:
#
# $$\frac{\partial \mathcal{L}}{\partial x} = s \odot \big(g - \langle s, g \rangle\big).$$
#
# Three operations per entry, where $J$ has $n^2$ entries: in attention the softmax runs over
# each query's $T$ keys, and at $T = 4096$ one row's Jacobian would hold 16.8 million numbers
# (128 MiB in float64), all $T$ rows of one head 512 GiB. `txlearn.softmax.softmax_vjp` computes
# the right-hand side; it must equal autograd's gradient through `torch.softmax`, on every axis.

# %%
x_b = torch.randn(3, 5, 7, dtype=torch.float64)
g_b = torch.randn(3, 5, 7, dtype=torch.float64)
vjp_gaps = []
for dim in (0, 1, 2):
    x_req = x_b.clone().requires_grad_(True)
    (by_autograd,) = torch.autograd.grad(torch.softmax(x_req, dim), x_req, g_b)
    vjp_gaps.append((softmax_vjp(torch.softmax(x_b, dim), g_b, dim=dim) - by_autograd).abs().max().item())
J_row = softmax_jacobian(x_b[0, 0])                                    # (7, 7)
via_J = J_row.T @ g_b[0, 0]                                            # J^T g, the long way
n_big = 4096
print(f"max |softmax_vjp - autograd| over dims 0, 1, 2: {max(vjp_gaps):.1e}")
print(f"J^T g formed explicitly vs the VJP: {(via_J - softmax_vjp(softmax(x_b[0, 0]), g_b[0, 0])).abs().max():.1e}")
print(f"T = {n_big}: one Jacobian {n_big ** 2 * 8 / 2**20:.0f} MiB in float64, the VJP's output "
      f"{n_big * 8 / 2**10:.0f} KiB")
assert max(vjp_gaps) < 1e-15                      # the formula is autograd's gradient, to rounding
assert (via_J - softmax_vjp(softmax(x_b[0, 0]), g_b[0, 0])).abs().max() < 1e-15
assert n_big ** 2 * 8 == 128 * 2**20

# %% [markdown]
# **Saturation, retold as the VJP.** Let $k$ be the largest weight. Every other entry of
# $\partial \mathcal{L}/\partial x$ carries a factor $s_i$, and the $k$-th carries
# $g_k - \langle s, g \rangle = \sum_{j \ne k} s_j (g_k - g_j)$, at most $(1 - s_k)$ times the
# range of $g$. Summing,
#
# $$\Big\lVert \frac{\partial \mathcal{L}}{\partial x} \Big\rVert_1 \le
#   2\,(1 - \max_i s_i)\,(\max_i g_i - \min_i g_i):$$
#
# whatever gradient arrives, a softmax that has put almost all its weight on one entry passes
# almost none of it back, because $\langle s, g \rangle$ is then almost exactly $g_k$ and the
# difference cancels. The same sweep over the logit scale as in section 4, now with one fixed
# incoming gradient $g$:

# %%
g_fixed = rng.standard_normal(S)
vjp_l1 = np.array([np.abs(softmax_vjp_np(softmax_np(c * z), g_fixed)).sum() for c in cs])
vjp_bound = np.array([2 * (1 - softmax_np(c * z).max()) * np.ptp(g_fixed) for c in cs])
fig, ax = plt.subplots(figsize=(6, 4))
ax.loglog(cs, vjp_l1, "o-", label="$\\|s \\odot (g - \\langle s, g\\rangle)\\|_1$ measured")
ax.loglog(cs, vjp_bound, "k--", label="bound $2(1 - \\max_i s_i)(\\max g - \\min g)$")
ax.set(xlabel="logit scale $c$", ylabel="size of the gradient into the logits",
       title="the softmax's backward pass vs logit scale (S = 16)")
ax.legend()
show(fig, alt=f"Log-log plot against the logit scale c from {cs[0]:g} to {cs[-1]:g}: the measured "
     f"size of the gradient into the logits, {vjp_l1[0]:.2f} at the smallest scale and "
     f"{vjp_l1[-1]:.1e} at the largest, always under the dashed bound 2(1 - max s)(max g - min g), "
     f"both falling steeply once the softmax saturates.")
print(f"|dx|_1 at c = 0.01: {vjp_l1[0]:.3f}; at c = 100: {vjp_l1[-1]:.1e}")
assert np.all(vjp_l1 <= vjp_bound + 1e-12)            # the bound holds at every scale
assert vjp_l1[-1] < 1e-6 * vjp_l1.max()                # saturated: almost nothing comes back

# %% [markdown]
# ## 7. The gradient that reaches $W_Q$
#
# Sections 4 and 6 measured the gradient into the **scores**. What learns is $W_Q$ (and $W_K$),
# one product further back: with $q = x W_Q$ and scores $s_j = k_j \cdot q / c$,
#
# $$\frac{\partial \mathcal{L}}{\partial q} = \frac{1}{c} \sum_j
#   \frac{\partial \mathcal{L}}{\partial s_j} k_j, \qquad
#   \frac{\partial \mathcal{L}}{\partial W_Q} = x^\top \frac{\partial \mathcal{L}}{\partial q},$$
#
# and the keys $k_j$ have norm about $\sqrt{d_k}$. Scaled ($c = \sqrt{d_k}$) the two factors
# cancel; unscaled ($c = 1$) the gradient reaching $q$ carries an extra $\sqrt{d_k}$, which
# offsets part of the saturation. So the width at which leaving out the scale starts to *hurt*
# learning is larger for $W_Q$ than for the scores.
#
# Measured: one query against $S = 16$ keys, $d_{model} = d_k$, token vectors $x \sim N(0, I)$,
# $W_Q, W_K, W_V$ drawn as the course's `MultiHeadAttention` draws them (Xavier uniform), loss
# $\mathcal{L} = u \cdot \text{out}$ for a random $u$; the gradients by hand with `softmax_vjp_np`,
# the median over 500 independent draws per $d_k$.

# %%
def gradients_by_hand(d_k, seed, trials=500):
    """Median |dL/dscores| and |dL/dW_Q| over `trials` draws, unscaled and scaled."""
    r = np.random.default_rng(seed)
    X = r.standard_normal((trials, S + 1, d_k))             # token 0 queries keys 1..S
    limit = math.sqrt(6 / (2 * d_k))                        # Xavier uniform, fan-in = fan-out = d_k
    W_Q, W_K, W_V = (r.uniform(-limit, limit, (d_k, d_k)) for _ in range(3))
    u = r.standard_normal((trials, d_k))
    x_q = X[:, 0]                                           # (trials, d_model)
    q, K, V = x_q @ W_Q, X[:, 1:] @ W_K, X[:, 1:] @ W_V     # (trials, d_k), (trials, S, d_k) x 2
    medians = {}
    for name, c in (("unscaled", 1.0), ("scaled", math.sqrt(d_k))):
        p = softmax_np(np.einsum("tsd,td->ts", K, q) / c)   # (trials, S)
        g_scores = softmax_vjp_np(p, np.einsum("tsd,td->ts", V, u))   # dL/dscores (trials, S)
        g_q = np.einsum("tsd,ts->td", K, g_scores) / c      # dL/dq (trials, d_k)
        g_W_Q = np.linalg.norm(x_q, axis=-1) * np.linalg.norm(g_q, axis=-1)  # |x^T dL/dq|
        medians[name] = (np.median(np.linalg.norm(g_scores, axis=-1)), np.median(g_W_Q))
    return medians


def gradients_by_autograd(d_k, seed, trials=500):
    """The same medians as gradients_by_hand, the same draws, the gradients from autograd."""
    r = np.random.default_rng(seed)
    X = torch.tensor(r.standard_normal((trials, S + 1, d_k)))
    limit = math.sqrt(6 / (2 * d_k))
    W_Q, W_K, W_V = (torch.tensor(r.uniform(-limit, limit, (d_k, d_k))) for _ in range(3))
    u = torch.tensor(r.standard_normal((trials, d_k)))
    x_q, K, V = X[:, 0], X[:, 1:] @ W_K, X[:, 1:] @ W_V
    medians = {}
    for name, c in (("unscaled", 1.0), ("scaled", math.sqrt(d_k))):
        q = (x_q @ W_Q).requires_grad_(True)                 # one leaf per trial: its own dL/dq
        logits = torch.einsum("tsd,td->ts", K, q) / c
        logits.retain_grad()
        (torch.softmax(logits, -1).unsqueeze(1) @ V).squeeze(1).mul(u).sum().backward()
        g_W_Q = torch.einsum("td,te->tde", x_q, q.grad)      # each trial's dL/dW_Q = x_q dq^T
        medians[name] = (logits.grad.norm(dim=-1).median().item(),
                         g_W_Q.flatten(1).norm(dim=-1).median().item())
    return medians


# the function that draws every plotted ratio, checked against autograd on the same draws
hand8, auto8 = gradients_by_hand(8, seed=8, trials=51), gradients_by_autograd(8, seed=8, trials=51)
gap8 = max(abs(hand8[n][i] / auto8[n][i] - 1) for n in hand8 for i in (0, 1))
print(f"gradients_by_hand vs autograd, d_k = 8, 51 draws: largest relative gap {gap8:.1e}")
assert gap8 < 1e-10

medians = {int(d_k): gradients_by_hand(int(d_k), seed=int(d_k)) for d_k in d_ks}
ratio_scores = np.array([m["unscaled"][0] / m["scaled"][0] for m in medians.values()])
ratio_W_Q = np.array([m["unscaled"][1] / m["scaled"][1] for m in medians.values()])
fig, ax = plt.subplots(figsize=(6, 4))
ax.loglog(d_ks, ratio_scores, "o-", base=2, label="into the scores")
ax.loglog(d_ks, ratio_W_Q, "s-", base=2, label="reaching $W_Q$")
ax.axhline(1, color="gray", ls=":")
ax.set(xlabel="$d_k$", ylabel="median gradient, unscaled / scaled",
       title="what leaving out $1/\\sqrt{d_k}$ does to the gradient")
ax.legend()
show(fig, alt=f"Log-log plot against d_k from {d_ks[0]} to {d_ks[-1]} of the median gradient "
     f"without the scale divided by the one with it, with a dotted line at 1. Into the scores "
     f"the ratio falls from {ratio_scores[0]:.2f} to {ratio_scores[-1]:.1e}; reaching W_Q it "
     f"rises above 1 (up to {ratio_W_Q.max():.2f}) and crosses below 1 between 64 and 128.")
for d_k, a, b in zip(d_ks, ratio_scores, ratio_W_Q):
    print(f"d_k = {d_k:5d}: unscaled / scaled, into the scores {a:.3f}, reaching W_Q {b:.3f}")
crossover = d_ks[1:][(ratio_W_Q[:-1] > 1) & (ratio_W_Q[1:] < 1)]
print(f"the gradient reaching W_Q is larger without the scale up to d_k = {crossover[0] // 2}, "
      f"smaller from d_k = {crossover[0]}")
at = {int(d): i for i, d in enumerate(d_ks)}
assert ratio_scores[at[64]] < 0.5                        # into the scores: unscaled much smaller at 64
assert ratio_W_Q[at[64]] > 1.2 > 1 > ratio_W_Q[at[128]]  # reaching W_Q: larger at 64, smaller at 128
assert list(crossover) == [128]                          # one crossover, between 64 and 128
assert ratio_W_Q[at[1024]] < 0.01                        # at 1024 the gradient is gone either way

# %% [raw] concept="gradient-at-64"
# question: At initialisation with $d_k = 64$, which query projection $W_Q$ receives the **larger**
#   gradient?
# kind: choice
# options:
#   a: The one without the $1/\sqrt{d_k}$ scale
#   b: The one with the scale
#   c: 'Both the same: the scale cancels in the gradient'
# answer: a
# section: '7.'
# right: 'Into the scores the unscaled gradient is much smaller at 64, but $W_Q$ receives it multiplied
#   by the larger unscaled factor: the ratio is above 1.2 at 64 and crosses below 1 only between 64
#   and 128.'
# wrong:
#   b:
#     misconception: Without the scale the gradient vanishes at every width
#     explain: That is true of the gradient *into the scores* from small widths on; the gradient reaching
#       $W_Q$ is still larger without the scale at 64 (ratio > 1.2) and falls below the scaled one only
#       past 64.
#   c:
#     misconception: A constant factor cancels in the gradient
#     explain: 'The scale changes where the softmax sits (saturated or not), so it changes the gradient''s
#       size, not just by a constant: measured, the ratio varies from above 1.2 at 64 to under 0.01
#       at 1024.'

# %% [markdown]
# So "without the scale the gradient vanishes" is true at the scores from small widths on, but
# the weights see it later: at $d_k = 64$ (a common head width) the unscaled query projection
# still receives the *larger* gradient (measured above), and it falls below the scaled one only
# between 64 and 128, collapsing by 1024. The scale's first job at initialisation is to keep the
# weights from being noise-driven one-hot lookups (section 3), not to rescue the gradient at
# moderate widths.
#
# **The assumption behind every number of this lesson**: $q$ and $k$ have unit-variance entries.
# That holds for the course's initialisation (Xavier uniform, $\mathrm{Var}(W_{ij}) =
# 2/(\text{fan-in} + \text{fan-out}) = 1/d_{model}$ for a square $W$, so
# $\mathrm{Var}(q_i) = d_{model} \cdot 1/d_{model} = 1$ for unit-variance tokens). It does not
# hold for `nn.Linear`'s default (uniform $\pm 1/\sqrt{\text{fan-in}}$, variance
# $1/(3\,\text{fan-in})$): there $\mathrm{Var}(q_i) = 1/3$ and
# $\mathrm{Var}(q \cdot k) = d_k \cdot \tfrac13 \cdot \tfrac13 = d_k / 9$, and every curve above
# moves to widths nine times larger. Measured on 4000 pairs at $d_{model} = d_k = 64$:

# %%
torch.manual_seed(0)
xs, ys = torch.randn(2, 4000, 64, dtype=torch.float64)
course_W = [torch.nn.init.xavier_uniform_(torch.empty(64, 64, dtype=torch.float64)) for _ in range(2)]
linear_Q, linear_K = (torch.nn.Linear(64, 64, bias=False).double() for _ in range(2))
with torch.no_grad():
    var_course = ((xs @ course_W[0]) * (ys @ course_W[1])).sum(-1).var().item()
    var_linear = ((xs @ linear_Q.weight.T) * (ys @ linear_K.weight.T)).sum(-1).var().item()
print(f"Var(q.k) / d_k: Xavier (the course) {var_course / 64:.3f}; nn.Linear's default "
      f"{var_linear / 64:.4f} (1/9 = {1 / 9:.4f})")
assert abs(var_course / 64 - 1) < 0.1                     # sample variance: ~2% standard error,
assert abs(var_linear / 64 * 9 - 1) < 0.1                 # plus the draw of W (~1/sqrt(d_model^2))

# %% [markdown]
# **In training the logits grow.** Everything above is about initialisation. During training
# $q$ and $k$ become correlated and grow, and $q \cdot k$ can grow like $d_k$ rather than
# $\sqrt{d_k}$: large models then saturate their attention in the way of section 3, and their
# training diverges ("attention logit growth": Dehghani et al. 2023, *Scaling Vision
# Transformers to 22 Billion Parameters*, section 2, the architecture; reproduced in small
# models by Wortsman et al. 2023, *Small-scale proxies for large-scale Transformer training instabilities*). Three
# remedies in use: **QK-norm**, a LayerNorm (or RMSNorm) applied to $q$ and $k$ before the dot
# product, which bounds the scores whatever the weights do (Henry et al. 2020, *Query-Key
# Normalization for Transformers*; Dehghani et al. 2023); **soft-capping**,
# $s \mapsto \text{cap} \cdot \tanh(s / \text{cap})$, which keeps every score within
# $\pm\text{cap}$ (Gemma 2 caps attention scores at 50 and the output logits at 30: Gemma Team
# 2024, *Gemma 2: Improving Open Language Models at a Practical Size*); and **muP**'s $1/d_k$
# scale instead of $1/\sqrt{d_k}$, derived for correlated $q$ and $k$ so that the scores stay of
# the same size as the width grows and hyperparameters transfer across widths (Yang et al. 2021,
# *Tensor Programs V: Tuning Large Neural Networks via Zero-Shot Hyperparameter Transfer*,
# section 4).

# %% [markdown]
# ## What we measured
#
# | claim | measured here |
# |---|---|
# | Var$(q \cdot k) = d_k$ for $q, k \sim N(0, I)$ | log-log slope within 0.02 of 1, $d_k = 1 \dots 1024$ |
# | Var$(q \cdot k / \sqrt{d_k}) = 1$ | every $d_k$ within 5 standard errors of 1 |
# | unscaled scores saturate the softmax | $d_k = 1024$, $S = 16$: largest weight > 0.9, entropy < 0.2 nats |
# | scaled scores do not | largest weight and entropy flat across $d_k$ |
# | saturation kills the gradient | $\lVert J \rVert_2 \le 2(1 - \max s)$; median $\lVert J \rVert_2$ unscaled at 1024 is < 1% of scaled |
# | ...but smaller logits are not always better | near-uniform $\lVert J \rVert_2 \approx 1/S$; unscaled larger than scaled for $2 \le d_k \le 32$ |
# | naive float32 softmax fails | NaN from a largest logit of 89 up, and for all logits below about -104 |
# | the max-shift fixes it | error < $10^{-6}$ for every $m \in [-120, 120]$ |
# | the softmax's backward pass is $s \odot (g - \langle s, g\rangle)$ | equal to autograd to $10^{-15}$ on every axis, without forming $J$ |
# | saturation stops the backward pass | $\lVert dx \rVert_1 \le 2(1 - \max s)\,\mathrm{range}(g)$ at every scale; $< 10^{-6}$ of its peak at $c = 100$ |
# | the gradient reaching $W_Q$ is not the one into the scores | into the scores, unscaled < half of scaled at $d_k = 64$; reaching $W_Q$, unscaled larger up to 64 and smaller from 128 |
# | unit-variance $q, k$ is an assumption | Var$(q \cdot k)/d_k$ within 0.1 of 1 for Xavier, of 1/9 for `nn.Linear`'s default |
#
# Exercises: [`work/01_softmax.ipynb`](../work/01_softmax.ipynb) (a stable softmax over any axis, the scaled scores, the
# softmax Jacobian, a log-softmax). Next, lesson 02 puts the scores and the softmax together into
# attention.
#
# The backward pass of section 6 is exercise 1 of [`work/11_backward.ipynb`](../work/11_backward.ipynb)
# (backpropagation by hand: the softmax, attention, LayerNorm, a whole layer, FlashAttention).
