# %% [markdown]
# # 06 · Residual connections and normalisation
#
# Each sub-layer of the transformer (attention, FFN) is wrapped as
#
# $$\text{post-LN (the paper, sec. 3.1):}\;\; \mathrm{LayerNorm}(x + F(x)) \qquad
# \text{pre-LN (GPT-2 and most models since):}\;\; x + F(\mathrm{LayerNorm}(x)).$$
#
# This lesson measures why the residual $x + \dots$ is there (gradients through depth), what
# LayerNorm and RMSNorm do to the same activations, and how the two orders differ in gradients and
# in training. Code: `txlearn.norms` (`LayerNorm`, `RMSNorm`, `residual`), `txlearn.layer`.
# Symbols: see [the notation table](00_map.ipynb#Notation).
#
# **You will be able to:** predict how a gradient changes through a deep stack from the size of
# each block's branch at initialisation, with and without residuals; compute LayerNorm and
# RMSNorm and say how they differ (and why not BatchNorm); compare post-LN and pre-LN gradients
# and training; and keep a norm's statistics exact in float16.
#
# **You need:** lessons 03 and 05 (attention and the FFN, the two sub-layers); the chain rule
# and variances of sums and products of independent variables.
#
# **Time:** about 60 minutes to read and run (the cells take about 20 s on a 2-core CPU, the
# training ablation most of it), plus the exercises.
#
# The stacks of section 3 use `TransformerStack`, lesson 07's layers, as a black box: attention
# and an FFN, each wrapped in the residual and norm this lesson derives.

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F

from txlearn.ffn import FeedForward
from txlearn.layer import TransformerStack
from txlearn.norms import (LayerNorm, RMSNorm, layer_norm_backward, layer_norm_np, residual,
                          rms_norm_backward, rms_norm_np)
from txlearn.plotting import show
from txlearn.positional import sinusoidal_encoding

torch.manual_seed(0)
rng = np.random.default_rng(0)
torch.set_num_threads(1)  # tiny matrices: one thread is faster here, and reproducible

# %% [markdown]
# ## 1. Gradients through depth: residuals, initialisation, normalisation
#
# Stack `n_layers` FFN blocks ($d_{model} = 32$, $d_{ff} = 128$, zero biases) either plainly,
# $x \leftarrow F(x)$, or with a residual, $x \leftarrow x + F(x)$, and measure the gradient norm
# reaching the **first** block's $W_1$ (loss: a fixed random projection of the output, averaged
# over 2 seeds). What happens depends on how $W_1$ and $W_2$ are initialised, so we try two:
#
# - **default** (`FeedForward`'s, which is `nn.Linear`'s scale): uniform $\pm 1/\sqrt{\text{fan-in}}$,
#   variance $1/(3\,\text{fan-in})$;
# - **He** (He et al. 2015): $N(0, 2/\text{fan-in})$, the scale that keeps the variance through
#   one linear map followed by a ReLU.
#
# Expected, before measuring. Per block, $W_1$ multiplies a token's second moment by
# $\text{fan-in} \cdot \mathrm{Var}(W)$, ReLU halves it, $W_2$ multiplies it again. So one block
# has a gain $g$ (output variance / input variance) of $\tfrac13 \cdot \tfrac12 \cdot \tfrac13 =
# \tfrac1{18}$ with the default init and $2 \cdot \tfrac12 \cdot 2 = 2$ with He's (He's scale
# assumes one linear map per ReLU; the block has two). Backward, each block multiplies the
# gradient by about $\sqrt{g}$ (plain) or $\sqrt{1 + g}$ (residual: $\partial(x + F(x))/\partial x
# = I + J_F$). From 1 to 32 blocks the first block's gradient should change by
#
# | | plain | residual |
# |---|---|---|
# | default | $(1/18)^{31/2} \approx 3\cdot10^{-20}$ | $(19/18)^{31/2} \approx 2.3$ |
# | He | $2^{31/2} \approx 5\cdot10^{4}$ | $3^{31/2} \approx 2.5\cdot10^{7}$ |

# %%
d_model = 32
depths = [1, 2, 4, 8, 16, 32]


def first_layer_grad(n_layers, variant, init, seed):
    """|grad W_1| of the first of n_layers FFN blocks, for one wiring (`variant`) and `init`."""
    torch.manual_seed(seed)
    blocks = [FeedForward(d_model, 4 * d_model) for _ in range(n_layers)]
    norms = [LayerNorm(d_model) for _ in range(n_layers + 1)]
    with torch.no_grad():
        for F_l in blocks:
            if init == "he":
                F_l.W_1.normal_(0.0, (2 / d_model) ** 0.5)
                F_l.W_2.normal_(0.0, (2 / (4 * d_model)) ** 0.5)
            if variant == "residual, branch / sqrt(2 n_layers)":
                F_l.W_2.mul_((2 * n_layers) ** -0.5)
    x, r = torch.randn(64, d_model), torch.randn(64, d_model)
    h = x
    for F_l, norm in zip(blocks, norms):
        if variant == "plain":
            h = F_l(h)
        elif variant == "pre-LN":
            h = h + F_l(norm(h))
        elif variant == "post-LN":
            h = norm(h + F_l(h))
        else:                                   # "residual", with or without the scaled branch
            h = h + F_l(h)
    if variant == "pre-LN":
        h = norms[-1](h)                        # pre-LN stacks end with a LayerNorm
    (h * r).sum().backward()
    return blocks[0].W_1.grad.norm().item()


def grads_vs_depth(variant, init):
    return np.array([np.mean([first_layer_grad(n, variant, init, s) for s in (0, 1)]) for n in depths])


grads = {(init, v): grads_vs_depth(v, init) for init in ("default", "he") for v in ("plain", "residual")}
predicted = {("default", "plain"): (1 / 18) ** 15.5, ("default", "residual"): (19 / 18) ** 15.5,
             ("he", "plain"): 2 ** 15.5, ("he", "residual"): 3 ** 15.5}
for (init, v), g in grads.items():
    print(f"{init:7s} {v:8s}: " + "  ".join(f"n_layers={n}: {x:.1e}" for n, x in zip(depths, g))
          + f"   32 vs 1: {g[-1] / g[0]:.1e} (predicted {predicted[init, v]:.1e})")
for key, g in grads.items():     # the variance argument predicts each ratio to within a factor 3
    assert abs(np.log10(g[-1] / g[0] / predicted[key])) < 0.5, key
assert grads["default", "plain"][-1] / grads["default", "plain"][0] < 1e-6   # vanishes
assert 0.5 < grads["default", "residual"][-1] / grads["default", "residual"][0] < 10
assert grads["he", "residual"][-1] / grads["he", "residual"][0] > 1e6       # explodes

# %% [raw] concept="depth-gradients"
# question: 'Gradient norm at the first block as the stack deepens: which of these stays within a factor
#   of 10 of the one-block value?'
# kind: choice
# options:
#   a: Residual blocks with PyTorch's default initialisation
#   b: Plain blocks (no residuals), default initialisation
#   c: Residual blocks with He initialisation
# answer: a
# section: '1.'
# right: 'With residuals each block adds to an identity path, and default-initialised blocks add little:
#   the gradient stays between 0.5 and 10 times the one-block value. Plain blocks vanish (below $10^{-6}$),
#   residual He blocks explode (above $10^6$).'
# wrong:
#   b:
#     misconception: Depth is harmless without residuals if the initialisation is standard
#     explain: 'Without the identity path the gradient is a product of one Jacobian per block, each
#       shrinking it: measured, below $10^{-6}$ of the one-block value.'
#   c:
#     misconception: Residuals fix depth whatever the initialisation
#     explain: 'Residuals keep the identity path, but He-initialised blocks each multiply the stream''s
#       size: the gradient exploded past $10^6$ (measured).'

# %% [markdown]
# So "residuals keep the gradient alive" held above only because the default initialisation makes
# each branch small ($g = 1/18$). With He's initialisation the same residual stack explodes: the
# residual stream's variance grows like $(1 + g)^{n_{layers}}$, and so does the gradient. The
# identity path helps only when the branch it runs beside is small at initialisation. Three ways
# to make it so, which deep models use:
#
# - **scale the branch**: multiply each block's output weights by $1/\sqrt{2\,n_{layers}}$ at
#   initialisation (GPT-2 does this for the attention and FFN output projections; the 2 counts
#   the two sub-layers per layer), so that $(1 + g)^{n_{layers}}$ stays bounded;
# - **pre-LN**: $x + F(\mathrm{LN}(x))$: each branch sees a normalised input, so it adds a fixed
#   amount and the stream grows only linearly;
# - **post-LN**: $\mathrm{LN}(x + F(x))$: the stream is renormalised after every block.
#
# Expected: with the He initialisation, under which the plain residual exploded by $10^7$, each of
# the three keeps the first block's gradient within an order of magnitude from 1 to 32 blocks.

# %%
fixes = ("residual, branch / sqrt(2 n_layers)", "pre-LN", "post-LN")
grads |= {(init, v): grads_vs_depth(v, init) for init in ("default", "he") for v in fixes}
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
for ax, init in zip(axes, ("default", "he")):
    for v in ("plain", "residual") + fixes:
        ax.loglog(depths, grads[init, v], "o-", ms=3, label=v)
    ax.set_xticks(depths, [str(n) for n in depths])
    ax.set(xlabel="n_layers", title=f"{'He' if init == 'he' else 'default'} initialisation")
axes[0].set_ylabel("|grad W_1| of the first block")
axes[1].legend(fontsize=8)
growth = {key: g[-1] / g[0] for key, g in grads.items()}                 # 32 blocks vs 1
show(fig, alt=f"Two log-log plots of the gradient norm reaching the first block's W_1 against "
     f"n_layers from 1 to 32, for five wirings; left the default initialisation, right He's. "
     f"Default: the plain stack falls by {growth['default', 'plain']:.0e} from 1 to 32 "
     f"blocks, the residual stack stays nearly flat ({growth['default', 'residual']:.1f} times). "
     f"He: the plain stack rises by {growth['he', 'plain']:.0e} and the residual one by "
     f"{growth['he', 'residual']:.0e}, the steepest line. In both panels the three fixes "
     "(branch scaled by 1/sqrt(2 n_layers), pre-LN, post-LN) stay nearly flat, within a "
     "factor of 10.")
for init in ("default", "he"):
    for v in fixes:
        g = grads[init, v]
        print(f"{init:7s} {v:36s}: 32 vs 1 block: {g[-1] / g[0]:.2f}")
        assert 0.1 < g[-1] / g[0] < 10, (init, v)

# %% [markdown]
# All three keep the gradient within an order of magnitude under both initialisations (the scaled
# branch's falls somewhat with depth: the first block's own $W_2$ is scaled down too, and its
# $W_1$'s gradient passes through it). That is why the identity path matters: it gives the
# gradient a route past every block, but only a small branch at initialisation (by scale or by
# normalisation) keeps the sum of many such routes from growing without bound.
#
# ## 2. LayerNorm and RMSNorm on the same activations
#
# $$\mathrm{LN}(x) = \gamma \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta, \qquad
# \mathrm{RMSNorm}(x) = \gamma \frac{x}{\sqrt{\overline{x^2} + \epsilon}}.$$
#
# RMSNorm (Zhang and Sennrich 2019, *Root Mean Square Layer Normalization*) drops the mean and
# $\beta$ and keeps only the rescaling. Both use the *biased* variance / mean square (divide by $d_{model}$) with $\epsilon$ inside the root, as
# `torch.nn.LayerNorm` and `torch.nn.RMSNorm` do. Feed both the outputs of a ReLU FFN, whose tokens
# have non-zero means:

# %%
with torch.no_grad():
    acts = FeedForward(64, 256)(torch.randn(200, 64)).double() + 0.5   # (200 tokens, 64)
ln, rms = LayerNorm(64).double(), RMSNorm(64).double()
rms_same_eps = RMSNorm(64, eps=ln.eps).double()
with torch.no_grad():
    y_ln, y_rms = ln(acts), rms(acts)
    y_rms_centred = rms_same_eps(acts - acts.mean(-1, keepdim=True))

print(f"token means in:  {acts.mean(-1).abs().mean():.2f} (average |mean|)")
print(f"LayerNorm out:   |mean| {y_ln.mean(-1).abs().max():.1e}, std {y_ln.std(-1, unbiased=False).mean():.4f}")
print(f"RMSNorm out:     |mean| {y_rms.mean(-1).abs().mean():.2f}, rms {y_rms.pow(2).mean(-1).sqrt().mean():.4f}")
gap = (y_ln - y_rms).abs().max().item()
gap_centred = (y_ln - y_rms_centred).abs().max().item()
print(f"max |LN(x) - RMSNorm(x)| = {gap:.2f};  max |LN(x) - RMSNorm(x - mean)| = {gap_centred:.1e}")
assert y_ln.mean(-1).abs().max() < 1e-12 and abs(y_ln.std(-1, unbiased=False).mean() - 1) < 1e-3
assert abs(y_rms.pow(2).mean(-1).sqrt().mean() - 1) < 1e-3
assert gap > 0.5              # on un-centred tokens they differ...
assert gap_centred < 1e-12    # ...LayerNorm is RMSNorm of the centred token (same eps)
np.testing.assert_allclose(y_ln.numpy(), layer_norm_np(acts.numpy()), atol=1e-12)
np.testing.assert_allclose(y_rms.numpy(), rms_norm_np(acts.numpy()), atol=1e-12)

fig, ax = plt.subplots(figsize=(4.5, 4))
ax.scatter(y_ln[:20].flatten(), y_rms[:20].flatten(), s=3)
ax.plot([-3, 3], [-3, 3], color="grey", lw=0.8)
ax.set(xlabel="LayerNorm(x)", ylabel="RMSNorm(x)", title="same activations, 20 tokens")
show(fig, alt="Scatter plot of RMSNorm(x) against LayerNorm(x) for the 64 features of 20 tokens "
     "whose means are not zero, with the grey diagonal y = x. The points do not lie on the "
     "diagonal but in a narrow band about half as steep: above it for negative LayerNorm "
     "values, where RMSNorm stays near 0 or above, and below it for the largest ones. "
     "RMSNorm keeps the tokens' positive mean that LayerNorm removes.")

# %% [raw] concept="layernorm-rmsnorm"
# question: On the same activations, how do LayerNorm and RMSNorm (same $\epsilon$, $\gamma = 1$, $\beta
#   = 0$) relate?
# kind: choice
# options:
#   a: LayerNorm of $x$ equals RMSNorm of $x - \mathrm{mean}(x)$
#   b: They are always equal
#   c: RMSNorm of $x$ equals LayerNorm of $x / \mathrm{rms}(x)$
# answer: a
# section: '2.'
# right: 'LayerNorm centres, then divides by the root mean square of the centred token: RMSNorm of the
#   centred token, to 1e-12 (measured). On un-centred tokens they differ (by more than 0.5 here).'
# wrong:
#   b:
#     misconception: RMSNorm is LayerNorm under another name
#     explain: 'RMSNorm skips the centring: on tokens whose mean is not 0 the two differ, by more than
#       0.5 on these activations.'
#   c:
#     misconception: Rescaling first makes them agree
#     explain: 'Dividing by the RMS changes no mean: LayerNorm still centres and RMSNorm does not. Only
#       centring makes them agree.'

# %% [markdown]
# RMSNorm keeps each token's mean direction (it only rescales), LayerNorm removes it; on centred
# tokens the two coincide. RMSNorm saves the mean and $\beta$, and LLaMA-family models use it.
#
# ### LayerNorm vs BatchNorm
#
# Before LayerNorm (Ba et al. 2016), the usual normaliser was BatchNorm (Ioffe and Szegedy 2015):
# it normalises each **feature** over the tokens of the whole batch, where LayerNorm normalises
# each **token** over its own features. The transformer uses LayerNorm because it does not depend
# on the batch. Expected: feeding the same sequence in two batches with different companions, or
# with padding added to the batch, changes its BatchNorm output (in training mode, where the
# batch's own statistics are used) and leaves its LayerNorm output as it was (to rounding); BatchNorm
# in eval mode (running averages) also gives another output than in training mode. The oracle
# for BatchNorm is PyTorch's `nn.BatchNorm1d` (features in the middle: `(B, d_model, T)`).

# %%
torch.manual_seed(0)
seq, other_a, other_b = (torch.randn(1, 10, 16, dtype=torch.float64) for _ in range(3))
padded = torch.cat([seq, torch.zeros(1, 6, 16, dtype=torch.float64)], dim=1)   # 6 padding tokens
bn = torch.nn.BatchNorm1d(16, dtype=torch.float64)        # training mode: the batch's statistics
ln16 = LayerNorm(16).double()


def batch_norm(x):                                        # (B, T, d_model) -> (B, T, d_model)
    return bn(x.transpose(1, 2)).transpose(1, 2)


with torch.no_grad():
    cases = {
        "other companion": (torch.cat([seq, other_a]), torch.cat([seq, other_b]), slice(None)),
        "padding added": (seq, padded, slice(0, 10)),
    }
    moved = {}
    for name, (batch_1, batch_2, real) in cases.items():
        bn_gap = (batch_norm(batch_1)[0, real] - batch_norm(batch_2)[0, real]).abs().max().item()
        ln_gap = (ln16(batch_1)[0, real] - ln16(batch_2)[0, real]).abs().max().item()
        moved[name] = (bn_gap, ln_gap)
        print(f"{name:16s}: the same sequence's output moves by {bn_gap:.2f} (BatchNorm), "
              f"{ln_gap:.1e} (LayerNorm)")
    train_out = batch_norm(seq)
    bn.eval()                                             # now the running averages
    eval_gap = (batch_norm(seq) - train_out).abs().max().item()
print(f"BatchNorm, train vs eval mode on the same batch: max |diff| = {eval_gap:.2f}")
for bn_gap, ln_gap in moved.values():
    assert bn_gap > 0.1          # BatchNorm: a token's output depends on the rest of the batch
    assert ln_gap < 1e-12        # LayerNorm: not at all (it never looks outside the token)
assert eval_gap > 0.1

fig, ax = plt.subplots(figsize=(7, 3))
with torch.no_grad():
    bn.train()
    for label, batch in [("with companion a", torch.cat([seq, other_a])),
                         ("with companion b", torch.cat([seq, other_b])), ("padded", padded)]:
        ax.plot(batch_norm(batch)[0, 0].numpy(), "o-", ms=3, label=f"BatchNorm, {label}")
    ax.plot(ln16(seq)[0, 0].numpy(), "k--", lw=1, label="LayerNorm (any batch)")
ax.set(xlabel="feature", ylabel="normalised value", title="token 0 of the same sequence")
ax.legend(fontsize=7)
show(fig, alt="Line plot of the normalised features of token 0 of one sequence, feature index "
     "on the x axis. Three BatchNorm curves, for the sequence batched with companion a, with "
     "companion b, and with padding added, visibly differ from each other; the dashed "
     "LayerNorm curve is the same in every batch.")

# %% [markdown]
# With variable-length sequences padded into one batch, BatchNorm's statistics would mix in the
# padding and the other sequences; LayerNorm's output for a token is a function of that token
# alone, the same in training and in inference, at any batch size (even 1).
#
# ## 3. Post-LN vs pre-LN: gradients at initialisation
#
# `txlearn.norms.residual` implements both orders; `TransformerLayer(norm_first=...)` uses them.

# %%
x = torch.randn(2, 5, 8)
F_demo, norm_demo = FeedForward(8), LayerNorm(8)
with torch.no_grad():
    post, pre = residual(x, F_demo, norm_demo, "post"), residual(x, F_demo, norm_demo, "pre")
print(f"post-LN output token std {post.std(-1, unbiased=False).mean():.3f} (normalised); "
      f"pre-LN {pre.std(-1, unbiased=False).mean():.3f} (the residual stream is left as it is)")
assert abs(post.std(-1, unbiased=False).mean() - 1) < 1e-3

# %% [markdown]
# Now a 12-layer stack ($d_{model} = 64$, 4 heads, cross-entropy on random targets through a fixed
# readout; pre-LN gets the final LayerNorm it needs). We measure $\|\nabla W_2\|$ of each layer's FFN,
# averaged over 3 seeds.

# %%
n_layers, d_model = 12, 64


def ffn_grad_norms(norm_first, seed):
    torch.manual_seed(seed)
    stack = TransformerStack(n_layers, d_model, 4, 4 * d_model, norm_first=norm_first,
                             final_norm=norm_first)
    readout = torch.randn(d_model, 100) / d_model ** 0.5
    logits = stack(torch.randn(8, 16, d_model)) @ readout                # (B, T, 100)
    F.cross_entropy(logits.reshape(-1, 100), torch.randint(100, (8 * 16,))).backward()
    return np.array([layer.ffn.W_2.grad.norm().item() for layer in stack.layers])


g_post = np.mean([ffn_grad_norms(False, s) for s in range(3)], axis=0)
g_pre = np.mean([ffn_grad_norms(True, s) for s in range(3)], axis=0)
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(range(1, n_layers + 1), g_post, "o-", label="post-LN")
ax.plot(range(1, n_layers + 1), g_pre, "s-", label="pre-LN")
ax.set(xlabel="layer", ylabel="|grad W_2| at init", ylim=(0, None))
ax.legend()
show(fig, alt=f"Line plot of the gradient norm of each layer's FFN W_2 at initialisation against "
     f"the layer, 1 to {n_layers}, averaged over 3 seeds. Post-LN's falls over the first few "
     f"layers and is then flat (its largest and smallest differ by a factor of "
     f"{g_post.max() / g_post.min():.1f}); pre-LN's lies below it at every layer and falls "
     f"{g_pre[0] / g_pre[-1]:.1f} times from the first to the last layer, ending "
     f"{g_post[-1] / g_pre[-1]:.1f} times below post-LN's.")
print(f"post-LN: first/last layer {g_post[0] / g_post[-1]:.2f}, max/min {g_post.max() / g_post.min():.2f}")
print(f"pre-LN:  first/last layer {g_pre[0] / g_pre[-1]:.2f}")
print(f"last layer, post-LN / pre-LN: {g_post[-1] / g_pre[-1]:.2f}  (sqrt(n_layers) = {n_layers ** 0.5:.2f})")
assert g_post.max() / g_post.min() < 2.5          # post-LN: within a factor of about 2...
assert g_pre[0] / g_pre[-1] > 1.5 * g_post.max() / g_post.min()  # pre-LN: a much steeper fall
assert 3 < g_pre[0] / g_pre[-1] < 5.5                # about 4 times from the first layer to the last
ratio_out = g_post[-1] / g_pre[-1]
print(f"post-LN / pre-LN at the last layer: {ratio_out:.2f}, {ratio_out / n_layers ** 0.5 - 1:+.0%} "
      f"from Xiong et al.'s sqrt(n_layers) = {n_layers ** 0.5:.2f}")
assert abs(ratio_out / n_layers ** 0.5 - 1) < 0.25   # the predicted sqrt(12) = 3.46, within 25%

# %% [raw] concept="pre-ln-gradients"
# question: 'At initialisation, 12 layers: how does the gradient norm of the **first** layer''s weights
#   compare with the last layer''s?'
# kind: choice
# options:
#   a: 'Pre-LN: the first layer''s is about 4 times the last''s; post-LN: within a factor of about 2'
#   b: About equal in both orders
#   c: 'Pre-LN: the last layer''s is about 4 times the first''s'
# answer: a
# section: '3.'
# right: 'Measured: pre-LN falls about 4 times from the first layer to the last (between 3 and 5.5),
#   post-LN stays within a factor of 2.5, and at the last layer post-LN''s gradient is about $\sqrt{12}$
#   times pre-LN''s.'
# wrong:
#   b:
#     misconception: Normalisation equalises gradients across layers
#     explain: 'Post-LN comes close (within about 2); pre-LN does not: its residual stream grows with
#       depth, so later layers'' updates matter less and receive smaller gradients (about 4 times).'
#   c:
#     misconception: Gradients shrink towards the input
#     explain: That is the vanishing gradient of plain stacks (section 1); in pre-LN the identity path
#       carries the gradient to the first layers, which receive the *largest* gradients.

# %% [markdown]
# What we measure here: near the output, post-LN's gradients are larger than pre-LN's, by about
# the $\sqrt{n_{layers}} = 3.46$ that Xiong et al. 2020 derive (measured a little below it,
# asserted within 25%), which is their argument for why post-LN needs a
# learning-rate warm-up. But their figure also shows post-LN gradients *growing* with the layer
# index and pre-LN's staying flat; at this small size we see neither: post-LN is roughly flat and
# pre-LN's gradients *fall* with depth (the pattern NormFormer, Shleifer et al. 2021, reports for
# pre-LN).
#
# ## 4. A small training ablation: post-LN vs pre-LN, with and without warm-up
#
# Task: reverse a sequence of 8 tokens (vocabulary 10), with a 4-layer encoder ($d_{model} = 32$,
# sinusoidal positions), Adam at a high learning rate $10^{-2}$ for 150 steps; warm-up ramps the
# rate linearly over the first 50 steps. Same seed, same data order for all four runs.

# %%
n_vocab, T, B, steps, lr, warmup_steps = 10, 8, 16, 150, 1e-2, 50


class Reverser(torch.nn.Module):
    def __init__(self, norm_first):
        super().__init__()
        self.embed = torch.nn.Embedding(n_vocab, 32)
        self.stack = TransformerStack(4, 32, 4, 128, norm_first=norm_first, final_norm=norm_first)
        self.head = torch.nn.Linear(32, n_vocab)
        self.register_buffer("pe", sinusoidal_encoding(T, 32))

    def forward(self, ids):                                        # (B, T) -> (B, T, n_vocab)
        return self.head(self.stack(self.embed(ids) + self.pe))


def train(norm_first, warmup, seed=0):
    torch.manual_seed(seed)                       # the model's initialisation
    data = torch.Generator().manual_seed(seed + 1)  # the order of the training batches
    model = Reverser(norm_first)
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98))
    ramp = (lambda s: min(1.0, (s + 1) / warmup_steps)) if warmup else (lambda s: 1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, ramp)
    losses = []
    for _ in range(steps):
        ids = torch.randint(1, n_vocab, (B, T), generator=data)
        loss = F.cross_entropy(model(ids).reshape(-1, n_vocab), ids.flip(1).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return np.array(losses)


runs = {(nf, wu): train(nf, wu) for nf in (False, True) for wu in (False, True)}
fig, ax = plt.subplots(figsize=(7, 3.8))
for (nf, wu), losses in runs.items():
    smooth = np.convolve(losses, np.ones(10) / 10, mode="valid")
    ax.plot(smooth, label=f"{'pre' if nf else 'post'}-LN, {'warm-up' if wu else 'no warm-up'}")
ax.axhline(np.log(n_vocab - 1), color="grey", ls=":", lw=0.8, label="chance, ln 9")
ax.set(xlabel="step", ylabel="loss (10-step mean)")
ax.legend(fontsize=8)
ends = {k: v[-15:].mean() for k, v in runs.items()}
show(fig, alt=f"Training curves, loss against step 0 to {steps}, of four 4-layer reversers at a "
     f"learning rate of {lr}, with a dotted line at chance, ln 9. Post-LN without warm-up stays "
     f"near chance (ending at {ends[False, False]:.2f}); post-LN with warm-up ends at "
     f"{ends[False, True]:.2f}; pre-LN, with and without warm-up, falls towards 0 (ending at "
     f"{ends[True, True]:.2f} and {ends[True, False]:.2f}).")

final = {k: v[-15:].mean() for k, v in runs.items()}
for (nf, wu), f in final.items():
    print(f"{'pre' if nf else 'post'}-LN {'with' if wu else 'without'} warm-up: final loss {f:.3f}")
assert np.isfinite(list(final.values())).all()
assert final[(False, False)] > 1.8                           # post-LN, no warm-up: stuck near chance
assert final[(False, True)] < final[(False, False)] - 0.3   # warm-up rescues post-LN
assert final[(True, False)] < 0.6                            # pre-LN trains without warm-up

# %% [raw] concept="warm-up"
# question: 'The training ablation: post-LN trained **without** learning-rate warm-up. What happened?'
# kind: choice
# options:
#   a: It stayed near chance (final loss above 1.8)
#   b: It trained about as well as pre-LN
#   c: It diverged to NaN
# answer: a
# section: '4.'
# right: Post-LN without warm-up stayed stuck near chance; warm-up rescued it (0.3 nats or more lower),
#   and pre-LN trained without warm-up (below 0.6).
# wrong:
#   b:
#     misconception: Warm-up only speeds training up
#     explain: 'For post-LN it decided whether training happened at all: above 1.8 without it, in every
#       seed (section 4''s table).'
#   c:
#     misconception: A failed run diverges
#     explain: 'Every loss stayed finite (asserted): post-LN without warm-up does not blow up here,
#       it stalls near chance.'

# %% [markdown]
# At this learning rate and seed, post-LN without warm-up stays near chance, warm-up lets it learn,
# and pre-LN learns with or without it: the small-scale version of Xiong et al.'s result that
# pre-LN removes the need for warm-up.
#
# ### Two more seeds
#
# One seed is a small sample: another initialisation and batch order can move a 150-step run a
# lot. We repeat the three runs that carry the claims with seeds 1 and 2. Expected, if the claims
# hold beyond seed 0: pre-LN without warm-up learns every time and post-LN without warm-up never
# does; how much warm-up helps post-LN may vary.

# %%
seeds = (0, 1, 2)
finals = {0: final}
for seed in seeds[1:]:
    finals[seed] = {(nf, wu): train(nf, wu, seed)[-15:].mean()
                    for nf, wu in ((False, False), (False, True), (True, False))}
print("seed   post-LN   post-LN + warm-up   pre-LN   (final loss; chance ln 9 = 2.20)")
for seed in seeds:
    f = finals[seed]
    print(f"{seed:4d}   {f[False, False]:7.3f}   {f[False, True]:17.3f}   {f[True, False]:6.3f}")
rescue = np.array([finals[s][False, False] - finals[s][False, True] for s in seeds])
print(f"warm-up lowers post-LN's final loss by {np.round(rescue, 2)} nats in seeds {seeds}")
for seed in seeds:
    assert finals[seed][True, False] < 0.6        # pre-LN, no warm-up: learns, every seed
    assert finals[seed][False, False] > 1.5       # post-LN, no warm-up: never gets far from chance
assert (rescue > -0.05).all()                     # warm-up never made post-LN clearly worse...
assert rescue.max() > 0.3 and rescue.min() < 0.3  # ...but how much it helps varies with the seed

# %% [markdown]
# Over three seeds, "pre-LN trains without warm-up and post-LN does not" holds every time. "Warm-up
# rescues post-LN" holds only in part: it always helps a little, but in 150 steps the rescue
# ranges from a large one to almost nothing (printed above). A claim about training dynamics
# needs more than one seed before it is believed.

# %% [markdown]
# ## 5. Norms in float16: the statistics must be float32
#
# Models are often run in float16, whose largest number is 65,504. RMSNorm of the token
# $x = [300, 400]$ needs the mean square $(300^2 + 400^2)/2 = 125{,}000$: the sum of squares
# (250,000), and here each square already, is past float16's range. Computed in float16
# arithmetic, the squares become $\infty$, the root $\infty$, and $x / \infty = 0$: the token is
# wiped out. LayerNorm of $[1000, -1000, 1000, -1000]$ fails the same way (its variance is
# $10^6$). `txlearn.norms`, like `F.rms_norm` and `F.layer_norm`, computes the statistics in
# float32 and rounds only the result to float16:

# %%
from txlearn.norms import layer_norm, rms_norm

fp16_max = torch.finfo(torch.float16).max
x16 = torch.tensor([300.0, 400.0], dtype=torch.float16)
naive = x16 / torch.sqrt((x16 ** 2).mean(-1, keepdim=True) + 1e-6)    # all in float16
right = rms_norm_np([300.0, 400.0])                                 # float64: [0.8485, 1.1314]
print(f"float16 max {fp16_max:.0f}; 300^2 + 400^2 = {300 ** 2 + 400 ** 2}; "
      f"squares in float16: {(x16 ** 2).tolist()}")
print(f"RMSNorm [300, 400]: float16 arithmetic {naive.tolist()}, txlearn {rms_norm(x16).tolist()}, "
      f"right {np.round(right, 6).tolist()}")
assert naive.tolist() == [0.0, 0.0]
assert np.abs(rms_norm(x16).double().numpy() - right).max() <= 2 ** -10   # one float16 rounding
assert torch.equal(rms_norm(x16), F.rms_norm(x16, (2,), eps=1e-6))        # PyTorch's own: the same

z16 = torch.tensor([1000.0, -1000.0, 1000.0, -1000.0], dtype=torch.float16)
mu = z16.mean()
naive_ln = (z16 - mu) / torch.sqrt(((z16 - mu) ** 2).mean() + 1e-5)      # all in float16
print(f"LayerNorm [1000, -1000, 1000, -1000]: float16 arithmetic {naive_ln.tolist()}, "
      f"txlearn {layer_norm(z16).tolist()}")
assert naive_ln.abs().max() == 0 and layer_norm(z16).tolist() == [1.0, -1.0, 1.0, -1.0]

# %% [raw] concept="float16-rmsnorm"
# question: 'RMSNorm of the token $[300, 400]$ computed entirely in float16 arithmetic (largest float16:
#   65,504). What comes out?'
# kind: choice
# options:
#   a: $[0, 0]$
#   b: NaN
#   c: 'The right $[0.85, 1.13]$: the inputs are small'
#   d: $[\infty, \infty]$
# answer: a
# section: '5.'
# right: 'The squares (90,000 and 160,000) overflow to $\infty$, so the root is $\infty$ and $x/\infty
#   = 0$: the token is wiped out. Computing the statistics in float32 gives the right answer.'
# wrong:
#   b:
#     misconception: Overflow always gives NaN
#     explain: NaN needs $\infty/\infty$ or $0/0$; here a finite $x$ is divided by $\infty$, which is
#       exactly 0 (printed `[0.0, 0.0]`).
#   c:
#     misconception: Small inputs are safe in float16
#     explain: 'The inputs fit, but their squares do not: $300^2 = 90{,}000 > 65{,}504$.'
#   d:
#     misconception: The overflow lands in the output
#     explain: 'The $\infty$ is in the denominator: $x / \infty = 0$.'

# %% [markdown]
# How large may a token's entries be? That depends on how the mean is summed, and the answer
# surprised us: PyTorch's `mean` of a float16 tensor adds in float32 and rounds only the mean, so
# the float16 formula above breaks only once a single square overflows, at $|x| \geq 256$; a
# float16 sum (`.sum()` before dividing by $d_{model}$) breaks as soon as
# $d_{model}\,x^2 > 65{,}504$, at $|x| \approx 32$ for $d_{model} = 64$. Small entries fail too:
# float16 squares below $6 \times 10^{-8}$ are 0. Measured on 64 tokens of $d_{model} = 64$ normal
# entries of scale $s$ (the largest of them is about $4s$):

# %%
def rms_norm_float16_arithmetic(x, eps=1e-6, sum_first=False):
    """The faulty versions, for comparison only: every operation in float16."""
    ms = (x ** 2).sum(-1, keepdim=True) / x.shape[-1] if sum_first else (x ** 2).mean(-1, keepdim=True)
    return x / torch.sqrt(ms + eps)


scales = np.logspace(-4, 3, 29)
errs = {"float16 mean": [], "float16 sum": [], "txlearn rms_norm": []}
for s in scales:
    x = (s * torch.randn(64, 64, dtype=torch.float64)).to(torch.float16)
    ref = torch.tensor(rms_norm_np(x.double().numpy()))              # float64, same inputs
    for name, y in (("float16 mean", rms_norm_float16_arithmetic(x)),
                    ("float16 sum", rms_norm_float16_arithmetic(x, sum_first=True)),
                    ("txlearn rms_norm", rms_norm(x))):
        errs[name].append(((y.double() - ref).abs().max() / ref.abs().max()).item())
errs = {k: np.array(v) for k, v in errs.items()}

fig, ax = plt.subplots(figsize=(6, 3))
for name, e in errs.items():
    ax.loglog(scales, np.maximum(e, 1e-6), "o-", ms=3, label=name)
ax.axhline(2 ** -10, color="grey", ls=":", lw=0.8, label="float16 eps, $2^{-10}$")
ax.set(xlabel="scale s of the entries", ylabel="max error / max |RMSNorm|", title="RMSNorm in float16")
ax.legend(fontsize=8)
show(fig, alt=f"Log-log plot of RMSNorm's relative error in float16 against the scale s of the "
     f"entries, 1e-4 to 1e3, with a dotted line at float16's eps. txlearn's rms_norm (statistics "
     f"in float32) stays below the line at every scale. The all-float16 version with a mean "
     f"jumps to an error of 1 (zeros) from s = {scales[errs['float16 mean'] >= 0.99].min():.0f}, "
     f"the one with a float16 sum already from s = "
     f"{scales[errs['float16 sum'] >= 0.99].min():.0f}; both are above the line for s below "
     f"about 1e-2, where squares underflow.")

for name, e in errs.items():
    ok = scales[e <= 2 ** -10]
    print(f"{name:>16}: within one float16 eps for s in [{ok.min():.0e}, {ok.max():.0e}]")
assert errs["txlearn rms_norm"].max() <= 2 ** -10           # float32 statistics: every scale
assert errs["float16 mean"][scales >= 300].min() >= 0.99    # a square overflows: zeros
assert errs["float16 sum"][scales >= 100].min() >= 0.99     # the sum overflows much earlier
assert errs["float16 mean"][scales <= 1e-3].min() > 2 ** -10  # squares underflow

# %% [markdown]
# With its statistics in float32, RMSNorm in float16 stays within one float16 rounding of the
# float64 answer at every scale measured, from $10^{-4}$ to $10^{3}$; the result is still float16.

# %% [markdown]
# ## 6. The backward passes of LayerNorm and RMSNorm
#
# LayerNorm of one token $x \in \mathbb{R}^d$ is $y = \gamma \odot \hat x + \beta$ with
# $\hat x = (x - \mu)\,r$, $\mu = \bar x$, $r = 1/\sqrt{\sigma^2 + \epsilon}$ and
# $\sigma^2 = \overline{(x - \mu)^2}$. Given $dy = \partial \mathcal{L}/\partial y$, the parameters
# are the easy part: $d\gamma = \sum_{\text{tokens}} dy \odot \hat x$ and
# $d\beta = \sum_{\text{tokens}} dy$, and the gradient at $\hat x$ is $d\hat x = \gamma \odot dy$.
# For $x$: $\partial \mu / \partial x_j = 1/d$, and $\partial \sigma^2 / \partial x_j =
# 2 (x_j - \mu)/d$ (the term through $\mu$ vanishes because the deviations sum to 0), so
# $\partial r / \partial x_j = -\tfrac12 r^3 \cdot 2 (x_j - \mu)/d = -r^2 \hat x_j / d$ and
#
# $$\frac{\partial \hat x_i}{\partial x_j} = r\Big(\delta_{ij} - \frac1d - \frac{\hat x_i \hat x_j}{d}\Big),
#   \qquad dx = r\Big(d\hat x - \overline{d\hat x} - \hat x\,\overline{d\hat x \odot \hat x}\Big).$$
#
# RMSNorm ($\hat x = x\,r$, $r = 1/\sqrt{\overline{x^2} + \epsilon}$, no $\mu$, no $\beta$) loses
# the $1/d$ term: $dx = r\,(d\hat x - \hat x\,\overline{d\hat x \odot \hat x})$.
# `txlearn.norms.layer_norm_backward` and `rms_norm_backward` compute these; first, against
# autograd through `nn.LayerNorm` and `nn.RMSNorm` (PyTorch's own kernels), in float64:

# %%
torch.manual_seed(6)
x_n = torch.randn(4, 10, 32, dtype=torch.float64) * 2 + 0.7          # (B, T, d_model), un-centred
dy_n = torch.randn(4, 10, 32, dtype=torch.float64)
ln_t = torch.nn.LayerNorm(32, dtype=torch.float64)
rms_t = torch.nn.RMSNorm(32, eps=1e-6, dtype=torch.float64)
with torch.no_grad():
    ln_t.weight.normal_(1, 0.2), ln_t.bias.normal_(0, 0.2), rms_t.weight.normal_(1, 0.2)
x_req = x_n.clone().requires_grad_(True)
auto_ln = torch.autograd.grad(ln_t(x_req), (x_req, ln_t.weight, ln_t.bias), dy_n)
hand_ln = layer_norm_backward(x_n, ln_t.weight.detach(), dy_n, eps=ln_t.eps)
auto_rms = torch.autograd.grad(rms_t(x_req), (x_req, rms_t.weight), dy_n)
hand_rms = rms_norm_backward(x_n, rms_t.weight.detach(), dy_n, eps=1e-6)
gap_ln = max((h - a).abs().max().item() for h, a in zip(hand_ln, auto_ln))
gap_rms = max((h - a).abs().max().item() for h, a in zip(hand_rms, auto_rms))
print(f"max |by hand - autograd|: LayerNorm (dx, dgamma, dbeta) {gap_ln:.1e}; "
      f"RMSNorm (dx, dgamma) {gap_rms:.1e}")
assert gap_ln < 1e-12 and gap_rms < 1e-12

# %% [markdown]
# **A projection.** With $\gamma = 1$, LayerNorm's Jacobian is $r\,M$ with
# $M = I - \tfrac1d \mathbf{1}\mathbf{1}^\top - \tfrac1d \hat x \hat x^\top$. Since $\hat x$ has mean 0
# it is orthogonal to $\mathbf{1}$, and $\lVert \hat x \rVert^2 = d\,\sigma^2/(\sigma^2 + \epsilon)$,
# almost $d$. So $M$ is (up to $\epsilon$) the orthogonal projection that **removes the components
# along $\mathbf{1}$ and along $\hat x$**: its eigenvalues should be $0$ (along $\mathbf{1}$, exactly),
# $\epsilon/(\sigma^2 + \epsilon)$ (along $\hat x$) and $1$ ($d - 2$ times). In words: no gradient
# step on $x$ can change the token's mean, and almost none its scale, because the forward pass
# removes both. RMSNorm's $M = I - \tfrac1d \hat x \hat x^\top$ removes only $\hat x$, and keeps the
# mean. Measured on the Jacobian autograd computes for one token ($d = 16$, $\epsilon$ raised to
# $10^{-2}$ so that its eigenvalue shows):

# %%
d_j, eps_j = 16, 1e-2
x_tok = torch.randn(d_j, dtype=torch.float64) * 0.5 + 2.0
J_ln = torch.autograd.functional.jacobian(lambda v: F.layer_norm(v, (d_j,), eps=eps_j), x_tok)
J_rms = torch.autograd.functional.jacobian(lambda v: F.rms_norm(v, (d_j,), eps=eps_j), x_tok)
var_tok = x_tok.var(unbiased=False)
r_ln, r_rms = (var_tok + eps_j) ** -0.5, ((x_tok ** 2).mean() + eps_j) ** -0.5
ones = torch.ones(d_j, dtype=torch.float64) / d_j ** 0.5                    # unit vector along 1
xhat_ln = (x_tok - x_tok.mean()) * r_ln
xhat_rms = x_tok * r_rms
eig_ln = torch.linalg.eigvalsh(J_ln / r_ln)                                 # M is symmetric
eig_rms = torch.linalg.eigvalsh(J_rms / r_rms)
print(f"LayerNorm M: eigenvalues {eig_ln[0]:.1e}, {eig_ln[1]:.5f} (eps / (var + eps) = "
      f"{eps_j / (var_tok + eps_j):.5f}), then {eig_ln[2]:.6f} ... {eig_ln[-1]:.6f}")
print(f"|M 1| = {(J_ln / r_ln @ ones).norm():.1e}, |M xhat| / |xhat| = "
      f"{(J_ln / r_ln @ xhat_ln).norm() / xhat_ln.norm():.5f}")
print(f"RMSNorm M: smallest eigenvalue {eig_rms[0]:.5f}, then {eig_rms[1]:.6f} ...; "
      f"|M 1| = {(J_rms / r_rms @ ones).norm():.3f} (the mean direction survives)")
assert eig_ln[0].abs() < 1e-12                                              # along 1: removed
assert abs(eig_ln[1] - eps_j / (var_tok + eps_j)) < 1e-12                   # along xhat: ~removed
assert torch.allclose(eig_ln[2:], torch.ones(d_j - 2, dtype=torch.float64), atol=1e-12)
assert abs(eig_rms[0] - eps_j / ((x_tok ** 2).mean() + eps_j)) < 1e-12     # RMSNorm: only xhat
assert (J_rms / r_rms @ ones).norm() > 0.1

# %% [markdown]
# **What "normalisation stabilises" means, measured.** Two consequences of $dx = r M d\hat x$ that
# hold whatever the layers around it do. (1) The gradient of $x$ is orthogonal to $\mathbf{1}$ (sums
# to 0 over the features, to rounding) and, for LayerNorm, nearly orthogonal to $\hat x$, so an
# update cannot grow or shift the token. (2) It is scale-invariant in reverse: multiply $x$ by $c$
# and the output does not change, but $r$ becomes $r/c$, so the gradient shrinks by $c$. A layer
# whose activations have grown large gets proportionally smaller gradients, a brake that a plain
# linear layer does not have.

# %%
dx_by_scale = {}
for c in (1.0, 10.0, 100.0):
    dx_c, _, _ = layer_norm_backward(c * x_n, None, dy_n, eps=1e-5)
    dx_by_scale[c] = dx_c
dx_1 = dx_by_scale[1.0]
xhat_n = (x_n - x_n.mean(-1, keepdim=True)) / (x_n.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
cos_xhat = ((dx_1 * xhat_n).sum(-1) / (dx_1.norm(dim=-1) * xhat_n.norm(dim=-1))).abs().max()
print(f"|sum over features of dx|: at most {dx_1.sum(-1).abs().max():.1e}; largest |cos(dx, xhat)| "
      f"{cos_xhat:.1e}")
print("|dx| with x scaled by c, relative to c = 1: " + ", ".join(
      f"c = {c:g}: {dx_by_scale[c].norm() / dx_1.norm():.5f}" for c in dx_by_scale))
assert dx_1.sum(-1).abs().max() < 1e-13
assert cos_xhat < 1e-5                                                      # eps / var ~ 1e-6
for c in (10.0, 100.0):                                                     # 1/c, up to eps
    assert abs(dx_by_scale[c].norm() / dx_1.norm() * c - 1) < 1e-5

# %% [markdown]
# ## Summary
#
# - How the first block's gradient changes with depth is set by how big each block's branch is at
#   initialisation, as the variance argument predicts (measured within a factor 3 of it): with
#   the default init, plain stacks vanish ($10^{-20}$) and residual ones stay within a factor 3;
#   with He's init the residual stack explodes ($10^7$). Scaling each branch by
#   $1/\sqrt{2 n_{layers}}$, pre-LN and post-LN each keep it within an order of magnitude up to
#   32 blocks under both inits.
# - LayerNorm = RMSNorm of the centred token; RMSNorm keeps the mean. BatchNorm's output for a
#   token changes with the rest of the batch (and with padding); LayerNorm's does not.
# - At initialisation post-LN's last-layer gradients are larger than pre-LN's; pre-LN's fall with depth.
# - At a high learning rate, pre-LN trains without warm-up and post-LN does not (3 seeds of 3);
#   warm-up's rescue of post-LN varies with the seed.
# - The backward passes (section 6) equal autograd through `nn.LayerNorm` and `nn.RMSNorm`;
#   LayerNorm's input gradient is a projection that removes the components along 1 and (up to
#   eps) along x-hat, RMSNorm's removes x-hat only; scaling x by c scales the gradient by 1/c.
#
# Exercises: [`work/06_norms.ipynb`](../work/06_norms.ipynb) (LayerNorm, RMSNorm, the residual sub-layer).
# LayerNorm's backward pass is exercise 3 of [`work/11_backward.ipynb`](../work/11_backward.ipynb).
