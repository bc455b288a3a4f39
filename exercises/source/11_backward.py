# ---
# jupyter:
#   txlearn:
#     title: "Exercises 11: backpropagation by hand"
#     minutes: 120
#     objectives:
#     - compute the softmax's backward pass as a vector-Jacobian product, without its Jacobian
#     - write attention's backward pass (dQ, dK, dV) with masks, empty rows included
#     - write LayerNorm's backward pass, the paths through the mean and the variance included
#     - assemble a whole transformer layer's backward pass from your own pieces
#     - compute attention block by block keeping one number per query (FlashAttention's forward)
#     - recompute each block's probabilities in FlashAttention's backward pass
#     imports: [numpy]
#     lessons: [01_softmax, 02_attention, 06_norms, 07_layer, 08_complexity]
# ---

# %% [markdown]
# Every function of this set receives NumPy `float64` arrays and returns the gradients of a loss
# $\mathcal{L}$ with respect to its inputs, given the gradient at its output (`g`, `dO`, `dy`,
# `dout`). Write them with array operations, without autograd: the checks compare your gradients
# with PyTorch's autograd to about $10^{-9}$. The derivations are in the lessons: the softmax in
# lesson 01 (section 6), attention in lesson 02 (section 9), LayerNorm in lesson 06 (section 6),
# the whole layer in lesson 07 ("The backward pass of the whole layer"), FlashAttention in lesson
# 08 (its FlashAttention section).
#
# Conventions of the course: a boolean mask is `True` where a query may attend; a query whose
# keys are all hidden gets output 0 and gradients 0, never NaN. Never change an input in place:
# an accumulation such as `dK += ...`, `l *= alpha` or `acc += ...` on an array you were given
# fails the check ("changed its input ... in place"); start new arrays (`np.zeros_like(K)`) and
# update those.

# %%
import numpy as np

# %% [markdown]
# ## Exercise 1: the softmax's vector-Jacobian product
#
# Write `softmax_vjp(s, g, axis=-1)`: given the softmax's output `s` (each slice along `axis`
# sums to 1, or is all 0 for a row that saw nothing) and `g` $= \partial \mathcal{L}/\partial s$
# of the same shape, return $\partial \mathcal{L} / \partial x$ where $s = \mathrm{softmax}(x)$:
#
# $$\frac{\partial \mathcal{L}}{\partial x} = s \odot \big(g - \langle s, g \rangle\big),
#   \qquad \langle s, g \rangle = \sum_i s_i g_i \text{ along } \texttt{axis}.$$
#
# Do not form the Jacobian. Example: $s = [1/2, 1/4, 1/4]$ and $g = [1, 0, 0]$ give
# $[1/4, -1/8, -1/8]$.

# %% tags=["answer"] exercise="softmax_vjp"
def softmax_vjp(s, g, axis=-1):
    ### BEGIN SOLUTION
    inner = (s * g).sum(axis=axis, keepdims=True)  # <s, g>, broadcast back along `axis`
    return s * (g - inner)
    ### END SOLUTION

# %% tags=["check"] exercise="softmax_vjp"
from txlearn.checks import check
check("softmax_vjp", softmax_vjp)

# %% [markdown]
# ## Exercise 2: attention's backward pass
#
# Write `attention_backward(Q, K, V, dO, mask=None)` for `Q (..., L, d_k)`, `K (..., S, d_k)`,
# `V (..., S, d_v)` (the same leading axes) and `dO (..., L, d_v)`, returning `(dQ, dK, dV)` of
# the shapes of Q, K and V. First recompute the forward pass's weights $P$ from Q and K
# ($Z = Q K^\top / \sqrt{d_k}$, hidden entries get weight exactly 0, a row with no visible key
# gets $P = 0$), then
#
# $$dV = P^\top dO, \quad dP = dO\,V^\top, \quad dZ = P \odot \big(dP - \mathrm{rowsum}(dP \odot P)\big),
#   \quad dQ = \frac{dZ\,K}{\sqrt{d_k}}, \quad dK = \frac{dZ^\top Q}{\sqrt{d_k}}.$$
#
# The middle step is your `softmax_vjp`, row by row. `np.swapaxes(K, -1, -2)` transposes the last
# two axes of a batched array.

# %% tags=["answer"] exercise="attention_backward"
def attention_backward(Q, K, V, dO, mask=None):
    ### BEGIN SOLUTION
    d_k = Q.shape[-1]
    scores = Q @ np.swapaxes(K, -1, -2) / np.sqrt(d_k)            # (..., L, S)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)     # shift an empty row by 0: its P stays 0
    e = np.exp(scores - top)
    total = e.sum(axis=-1, keepdims=True)
    P = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    dV = np.swapaxes(P, -1, -2) @ dO                              # (..., S, d_v)
    dP = dO @ np.swapaxes(V, -1, -2)                              # (..., L, S)
    dZ = softmax_vjp(P, dP)
    dQ = dZ @ K / np.sqrt(d_k)                                    # (..., L, d_k)
    dK = np.swapaxes(dZ, -1, -2) @ Q / np.sqrt(d_k)               # (..., S, d_k)
    return dQ, dK, dV
    ### END SOLUTION

# %% tags=["check"] exercise="attention_backward"
from txlearn.checks import check
check("attention_backward", attention_backward)

# %% [markdown]
# ## Exercise 3: LayerNorm's backward pass
#
# LayerNorm over the last axis: $y = \gamma \odot \hat x + \beta$, $\hat x = (x - \mu)\,r$,
# $r = 1/\sqrt{\sigma^2 + \epsilon}$, with $\mu$ and $\sigma^2$ the mean and the *biased* variance
# of each token's $d$ features. Write `layer_norm_backward(x, gamma, dy, eps=1e-5)` for
# `x (..., d_model)`, `gamma (d_model,)` and `dy` of the shape of x, returning
# `(dx, dgamma, dbeta)`:
#
# $$d\hat x = \gamma \odot dy, \qquad
#   dx = r\,\big(d\hat x - \overline{d\hat x} - \hat x\,\overline{d\hat x \odot \hat x}\big),$$
#
# the bars being means over the features, and $d\gamma = \sum dy \odot \hat x$,
# $d\beta = \sum dy$ summed over every axis but the last (shape `(d_model,)`). Example:
# $x = [1, 0, -1]$, $\gamma = 1$, $dy = [1, 0, 0]$, $\epsilon = 0$ gives
# $dx = \sqrt{3/2}\,[1/6, -1/3, 1/6]$.

# %% tags=["answer"] exercise="layer_norm_backward"
def layer_norm_backward(x, gamma, dy, eps=1e-5):
    ### BEGIN SOLUTION
    mu = x.mean(axis=-1, keepdims=True)                              # (..., 1)
    r = 1.0 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps)
    xhat = (x - mu) * r
    dxhat = dy * gamma
    dx = r * (dxhat - dxhat.mean(axis=-1, keepdims=True)
              - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    tokens = tuple(range(x.ndim - 1))                                 # every axis but the last
    return dx, (dy * xhat).sum(axis=tokens), dy.sum(axis=tokens)
    ### END SOLUTION

# %% tags=["check"] exercise="layer_norm_backward"
from txlearn.checks import check
check("layer_norm_backward", layer_norm_backward)

# %% [markdown]
# ## Exercise 4: a whole layer's backward pass, from your own pieces
#
# The cell below is the course's forward pass of one post-LN layer (lesson 07) in NumPy:
# multi-head attention with a residual and LayerNorm, then a ReLU FFN with a residual and
# LayerNorm. It returns the output and a `cache` of what the backward pass needs:
# `Q, K, V (B, n_heads, T, d_k)`, `merged` (the heads' outputs merged, `(B, T, d_model)`),
# `a_in` (the input of the first LayerNorm), `h` (its output), `u` and `r` (the FFN's hidden
# layer before and after the ReLU, `(B, T, d_ff)`) and `o` (the input of the second LayerNorm).
# Weights are `(d_in, d_out)`, applied as `x @ W + b`. Run it; do not change it.

# %%
def layer_norm(x, gamma, beta, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return gamma * (x - mu) / np.sqrt(var + eps) + beta


def layer_forward(x, params, n_heads, mask=None):
    """The post-LN layer: x (B, T, d_model) -> (out (B, T, d_model), cache)."""
    B, T, d_model = x.shape
    d_k = d_model // n_heads

    def heads(M):                                     # (B, T, d_model) -> (B, n_heads, T, d_k)
        return M.reshape(B, T, n_heads, d_k).transpose(0, 2, 1, 3)

    Q, K, V = (heads(x @ params[f"W_{n}"] + params[f"b_{n}"]) for n in "QKV")
    scores = Q @ K.transpose(0, 1, 3, 2) / np.sqrt(d_k)           # (B, n_heads, T, T)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)                    # a row that sees no key
    e = np.exp(scores - top)
    total = e.sum(axis=-1, keepdims=True)
    P = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    merged = (P @ V).transpose(0, 2, 1, 3).reshape(B, T, d_model)
    a_in = x + merged @ params["W_O"] + params["b_O"]
    h = layer_norm(a_in, params["gamma1"], params["beta1"])
    u = h @ params["W_1"] + params["b_1"]                         # (B, T, d_ff)
    r = np.maximum(u, 0.0)
    o = h + r @ params["W_2"] + params["b_2"]
    out = layer_norm(o, params["gamma2"], params["beta2"])
    return out, dict(Q=Q, K=K, V=V, merged=merged, a_in=a_in, h=h, u=u, r=r, o=o)

# %% [markdown]
# Write `layer_backward(x, params, dout, n_heads, mask=None)` returning a dict with the gradient
# of `"x"` and of every key of `params` (`W_Q, b_Q, W_K, b_K, W_V, b_V, W_O, b_O, gamma1, beta1,
# W_1, b_1, W_2, b_2, gamma2, beta2`), each of the shape of what it is the gradient of. Use your
# `attention_backward` and `layer_norm_backward`; lesson 07's table runs the forward lines
# backwards. Two things to watch: $x$ and $h$ each reach the output by two routes (a residual and
# a sub-layer), and their gradients add; a weight or a bias is shared by every token, so its
# gradient sums over the batch and the positions (`np.einsum("bti,btj->ij", inputs, grads)` is
# $\sum_{b,t}$ of the outer products).

# %% tags=["answer"] exercise="layer_backward"
def layer_backward(x, params, dout, n_heads, mask=None):
    out, cache = layer_forward(x, params, n_heads, mask)
    ### BEGIN SOLUTION
    B, T, d_model = x.shape

    def weight_grad(inputs, grads):                  # sum over b, t of outer products
        return np.einsum("bti,btj->ij", inputs, grads)

    def split(M):                                    # (B, T, d_model) -> (B, n_heads, T, d_k)
        return M.reshape(B, T, n_heads, -1).transpose(0, 2, 1, 3)

    def merge(M):                                    # (B, n_heads, T, d_k) -> (B, T, d_model)
        return M.transpose(0, 2, 1, 3).reshape(B, T, d_model)

    grads = {}
    do, grads["gamma2"], grads["beta2"] = layer_norm_backward(cache["o"], params["gamma2"], dout)
    grads["W_2"], grads["b_2"] = weight_grad(cache["r"], do), do.sum(axis=(0, 1))
    du = (do @ params["W_2"].T) * (cache["u"] > 0)   # the ReLU passes where it was on
    grads["W_1"], grads["b_1"] = weight_grad(cache["h"], du), du.sum(axis=(0, 1))
    dh = do + du @ params["W_1"].T                   # the residual and the FFN
    da, grads["gamma1"], grads["beta1"] = layer_norm_backward(cache["a_in"], params["gamma1"], dh)
    grads["W_O"], grads["b_O"] = weight_grad(cache["merged"], da), da.sum(axis=(0, 1))
    dQ, dK, dV = attention_backward(cache["Q"], cache["K"], cache["V"],
                                    split(da @ params["W_O"].T), mask)
    grads["x"] = da                                  # the residual route
    for name, d_proj in zip("QKV", (dQ, dK, dV)):
        d_proj = merge(d_proj)
        grads[f"W_{name}"] = weight_grad(x, d_proj)
        grads[f"b_{name}"] = d_proj.sum(axis=(0, 1))
        grads["x"] = grads["x"] + d_proj @ params[f"W_{name}"].T
    return grads
    ### END SOLUTION

# %% tags=["check"] exercise="layer_backward"
from txlearn.checks import check
check("layer_backward", layer_backward)

# %% [markdown]
# ## Exercise 5: FlashAttention's forward pass, keeping the log-sum-exp
#
# Ordinary attention keeps its $L \times S$ weights $P$ for the backward pass. FlashAttention
# keeps one number per query instead, the log-sum-exp of its scores,
# $\mathrm{lse}_i = \log \sum_j e^{s_{ij}}$, from which any weight can be recomputed:
# $P_{ij} = e^{s_{ij} - \mathrm{lse}_i}$.
#
# Write `flash_forward(Q, K, V, mask=None, block_size=4)` for `Q (..., L, d_k)`,
# `K (..., S, d_k)`, `V (..., S, d_v)` and a boolean `mask (..., L, S)` (or None), returning
# `(O, lse)` with `O (..., L, d_v)` the attention output and `lse (..., L)`. Go over the keys
# `block_size` at a time (the last block may be shorter), keeping per query a running maximum
# $m$ (start at $-\infty$), a running sum $l$ (start at 0) and an unnormalised output $acc$
# (start at 0). For a block with scores $s = Q K_j^\top / \sqrt{d_k}$ (hidden keys at
# $-\infty$):
#
# $$m' = \max(m, \max_j s_j), \quad \alpha = e^{m - m'}, \quad l' = \alpha\,l + \sum_j e^{s_j - m'},
#   \quad acc' = \alpha\,acc + e^{s - m'} V_j .$$
#
# At the end, $O = acc / l$ and $\mathrm{lse} = m + \log l$. A query that has seen no visible key
# yet has $m = m' = -\infty$: shift by 0 instead, so that it keeps $l = 0$; at the end it gets
# $O = 0$ and $\mathrm{lse} = -\infty$.

# %% tags=["answer"] exercise="flash_forward"
def flash_forward(Q, K, V, mask=None, block_size=4):
    ### BEGIN SOLUTION
    S, d_k = K.shape[-2], Q.shape[-1]
    m = np.full(Q.shape[:-1], -np.inf)                         # (..., L)
    l = np.zeros(Q.shape[:-1])
    acc = np.zeros(Q.shape[:-1] + V.shape[-1:])                # (..., L, d_v)
    for start in range(0, S, block_size):
        stop = min(start + block_size, S)
        s = Q @ np.swapaxes(K[..., start:stop, :], -1, -2) / np.sqrt(d_k)   # (..., L, b)
        if mask is not None:
            s = np.where(mask[..., start:stop], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1))
        shift = np.where(np.isfinite(m_new), m_new, 0.0)       # nothing visible so far
        alpha = np.exp(m - shift)
        p = np.exp(s - shift[..., None])
        l = alpha * l + p.sum(axis=-1)
        acc = alpha[..., None] * acc + p @ V[..., start:stop, :]
        m = m_new
    seen = l > 0
    l_safe = np.where(seen, l, 1.0)
    O = np.where(seen[..., None], acc / l_safe[..., None], 0.0)
    lse = np.where(seen, m + np.log(l_safe), -np.inf)
    return O, lse
    ### END SOLUTION

# %% tags=["check"] exercise="flash_forward"
from txlearn.checks import check
check("flash_forward", flash_forward)

# %% [markdown]
# ## Exercise 6: FlashAttention's backward pass, recomputing each block
#
# Write `flash_backward(Q, K, V, O, lse, dO, mask=None, block_size=4)` returning
# `(dQ, dK, dV)`, given the forward's output `O` and log-sum-exp `lse` (as your `flash_forward`
# returns them) and `dO` of the shape of O. Go over the key blocks again, and for each block $j$
# recompute its *final* weights from the saved lse (no running maximum, nothing to rescale):
#
# $$P_j = e^{Z_j - \mathrm{lse}}, \quad dV_j = P_j^\top dO, \quad dP_j = dO\,V_j^\top, \quad
#   dZ_j = P_j \odot (dP_j - D), \quad dQ \mathrel{+}= \frac{dZ_j K_j}{\sqrt{d_k}}, \quad
#   dK_j = \frac{dZ_j^\top Q}{\sqrt{d_k}},$$
#
# with $D = \mathrm{rowsum}(dO \odot O)$, computed once: it equals lesson 02's
# $\mathrm{rowsum}(dP \odot P)$ over *all* keys, because
# $\sum_j P_{ij} (dO_i \cdot v_j) = dO_i \cdot O_i$. Hidden keys have $S = -\infty$, so $P = 0$;
# a row with $\mathrm{lse} = -\infty$ (no visible key) must get $P = 0$ too, not
# $e^{-\infty + \infty}$.

# %% tags=["answer"] exercise="flash_backward"
def flash_backward(Q, K, V, O, lse, dO, mask=None, block_size=4):
    ### BEGIN SOLUTION
    S, d_k = K.shape[-2], Q.shape[-1]
    lse_safe = np.where(np.isfinite(lse), lse, 0.0)[..., None]  # a row that sees no key: P = 0
    D = (dO * O).sum(axis=-1, keepdims=True)                    # (..., L, 1)
    dQ, dK, dV = np.zeros(Q.shape), np.zeros(K.shape), np.zeros(V.shape)
    for start in range(0, S, block_size):
        stop = min(start + block_size, S)
        K_j, V_j = K[..., start:stop, :], V[..., start:stop, :]
        s = Q @ np.swapaxes(K_j, -1, -2) / np.sqrt(d_k)           # (..., L, b)
        if mask is not None:
            s = np.where(mask[..., start:stop], s, -np.inf)
        P = np.exp(s - lse_safe)                                  # the block's final weights
        dV[..., start:stop, :] = np.swapaxes(P, -1, -2) @ dO
        dZ = P * (dO @ np.swapaxes(V_j, -1, -2) - D)
        dQ += dZ @ K_j / np.sqrt(d_k)
        dK[..., start:stop, :] = np.swapaxes(dZ, -1, -2) @ Q / np.sqrt(d_k)
    return dQ, dK, dV
    ### END SOLUTION

# %% tags=["check"] exercise="flash_backward"
from txlearn.checks import check
check("flash_backward", flash_backward)
