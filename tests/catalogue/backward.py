"""Reference answers and catalogued wrong answers for set 11's checks (txlearn/checks/backward.py),
written the way a learner writes them (NumPy float64, no autograd)."""

import numpy as np

# ------------------------------------------------------------------ softmax_vjp


def vjp_ref(s, g, axis=-1):
    return s * (g - (s * g).sum(axis=axis, keepdims=True))


def vjp_no_inner(s, g, axis=-1):
    return s * g


def vjp_sign(s, g, axis=-1):
    return s * ((s * g).sum(axis=axis, keepdims=True) - g)


def vjp_sum_g(s, g, axis=-1):
    return s * (g - g.sum(axis=axis, keepdims=True))


def vjp_no_s(s, g, axis=-1):
    return g - (s * g).sum(axis=axis, keepdims=True)


def vjp_diagonal(s, g, axis=-1):
    return s * (1 - s) * g


def vjp_global_inner(s, g, axis=-1):  # one <s, g> for the whole array
    return s * (g - (s * g).sum())


def vjp_no_keepdims(s, g, axis=-1):
    return s * (g - (s * g).sum(axis=axis))


def vjp_last_axis(s, g, axis=-1):
    return s * (g - (s * g).sum(axis=0 if s.ndim > 1 and axis % s.ndim != 0 else -1,
                                keepdims=True))


# ------------------------------------------------------------------ attention_backward


def _weights(Q, K, mask, additive=False, use_mask=True, guard=True):
    scores = Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])
    if mask is not None and additive:
        scores = scores + np.where(mask, 0.0, -1e9)
    elif mask is not None and use_mask:
        scores = np.where(mask, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    if guard:
        top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(scores - top)
    total = e.sum(axis=-1, keepdims=True)
    if not guard:
        return e / total
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def att(*, scale=1.0, p_t=True, inner=True, dk_t=True, dq_t=False, **weights):
    def attention_backward(Q, K, V, dO, mask=None):
        d_k = Q.shape[-1]
        with np.errstate(invalid="ignore", divide="ignore"):
            P = _weights(Q, K, mask, **weights)
        dV = (np.swapaxes(P, -1, -2) if p_t else P) @ dO
        dP = dO @ np.swapaxes(V, -1, -2)
        dZ = vjp_ref(P, dP) if inner else P * dP
        dQ = (np.swapaxes(dZ, -1, -2) if dq_t else dZ) @ K * scale / np.sqrt(d_k)
        dK = (np.swapaxes(dZ, -1, -2) if dk_t else dZ) @ Q * scale / np.sqrt(d_k)
        return dQ, dK, dV
    return attention_backward


def att_with_vjp(vjp):
    """The right attention backward, built on the given softmax_vjp (for DEPENDENT)."""
    def attention_backward(Q, K, V, dO, mask=None):
        d_k = Q.shape[-1]
        P = _weights(Q, K, mask)
        dZ = vjp(P, dO @ np.swapaxes(V, -1, -2))
        return (dZ @ K / np.sqrt(d_k), np.swapaxes(dZ, -1, -2) @ Q / np.sqrt(d_k),
                np.swapaxes(P, -1, -2) @ dO)
    return attention_backward


att_ref = att()


def att_full_transpose(Q, K, V, dO, mask=None):  # K.T, V.T: every axis of a batch reversed
    d_k = Q.shape[-1]
    scores = Q @ K.T / np.sqrt(d_k)   # (2, 4, 3) @ (3, 4, 2): raises on a batch
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    P = e / e.sum(axis=-1, keepdims=True)
    dZ = vjp_ref(P, dO @ V.T)
    return dZ @ K / np.sqrt(d_k), dZ.T @ Q / np.sqrt(d_k), P.T @ dO


def att_d_k_from_V(Q, K, V, dO, mask=None):  # the scale of V's width d_v, forward and backward
    d = V.shape[-1]
    scores = Q @ np.swapaxes(K, -1, -2) / np.sqrt(d)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    P = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    dZ = vjp_ref(P, dO @ np.swapaxes(V, -1, -2))
    return (dZ @ K / np.sqrt(d), np.swapaxes(dZ, -1, -2) @ Q / np.sqrt(d),
            np.swapaxes(P, -1, -2) @ dO)


def att_one_key_empty(Q, K, V, dO, mask=None):  # a row with one visible key treated as empty
    d_k = Q.shape[-1]
    P = _weights(Q, K, mask)
    if mask is not None:
        P = np.where(np.broadcast_to(mask, P.shape).sum(axis=-1, keepdims=True) <= 1, 0.0, P)
    dZ = vjp_ref(P, dO @ np.swapaxes(V, -1, -2))
    return (dZ @ K / np.sqrt(d_k), np.swapaxes(dZ, -1, -2) @ Q / np.sqrt(d_k),
            np.swapaxes(P, -1, -2) @ dO)

# ------------------------------------------------------------------ layer_norm_backward


def ln(*, mean=True, xhat_term=True, ddof=0, use_gamma=True, eps_inside=True, sum_params=True):
    def layer_norm_backward(x, gamma, dy, eps=1e-5):
        d = x.shape[-1]
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).sum(axis=-1, keepdims=True) / (d - ddof)
        r = 1 / np.sqrt(var + eps) if eps_inside else 1 / (np.sqrt(var) + eps)
        xhat = (x - mu) * r
        dxhat = dy * gamma if use_gamma else dy
        dx = dxhat
        if mean:
            dx = dx - dxhat.mean(axis=-1, keepdims=True)
        if xhat_term:
            dx = dx - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)
        tokens = tuple(range(x.ndim - 1)) if sum_params else ()
        return r * dx, (dy * xhat).sum(axis=tokens), dy.sum(axis=tokens)
    return layer_norm_backward


ln_ref = ln()


def ln_dgamma(kind):
    """The right dx and dbeta, and dgamma as sum(dy) ("no xhat") or sum(dy * x) ("x")."""
    def layer_norm_backward(x, gamma, dy, eps=1e-5):
        dx, _, dbeta = ln_ref(x, gamma, dy, eps)
        tokens = tuple(range(x.ndim - 1))
        return dx, (dy if kind == "no xhat" else dy * x).sum(axis=tokens), dbeta
    return layer_norm_backward

# ------------------------------------------------------------------ layer_backward


def _layer_norm(x, gamma, beta, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return gamma * (x - mu) / np.sqrt(var + eps) + beta


def layer_forward(x, params, n_heads, mask=None):
    """The set's own forward pass (the course's setup cell), as a learner's notebook holds it."""
    B, T, d_model = x.shape
    d_k = d_model // n_heads
    Q, K, V = (((x @ params[f"W_{n}"]) + params[f"b_{n}"]).reshape(B, T, n_heads, d_k)
               .transpose(0, 2, 1, 3) for n in "QKV")
    P = _weights(Q, K, mask)
    merged = (P @ V).transpose(0, 2, 1, 3).reshape(B, T, d_model)
    a_in = x + merged @ params["W_O"] + params["b_O"]
    h = _layer_norm(a_in, params["gamma1"], params["beta1"])
    u = h @ params["W_1"] + params["b_1"]
    r = np.maximum(u, 0.0)
    o = h + r @ params["W_2"] + params["b_2"]
    out = _layer_norm(o, params["gamma2"], params["beta2"])
    return out, dict(Q=Q, K=K, V=V, merged=merged, a_in=a_in, h=h, u=u, r=r, o=o)


def layer(*, x_res=True, h_res=True, gate=True, ln_input=True, bias_sum=(0, 1),
          transpose=False, split=True, attention_backward=None, layer_norm_backward=None):
    def layer_backward(x, params, dout, n_heads, mask=None):
        att_bw = attention_backward or att_ref
        ln_bw = layer_norm_backward or ln_ref
        out, c = layer_forward(x, params, n_heads, mask)
        B, T, d = x.shape

        def W(inputs, grads):
            w = np.einsum("bti,btj->ij", inputs, grads)
            return w.T if transpose else w

        g = {}
        do, g["gamma2"], g["beta2"] = ln_bw(c["o"] if ln_input else out, params["gamma2"], dout)
        g["W_2"], g["b_2"] = W(c["r"], do), do.sum(axis=bias_sum)
        du = (do @ params["W_2"].T) * ((c["u"] > 0) if gate else 1.0)
        g["W_1"], g["b_1"] = W(c["h"], du), du.sum(axis=bias_sum)
        dh = (do if h_res else 0.0) + du @ params["W_1"].T
        da, g["gamma1"], g["beta1"] = ln_bw(c["a_in"] if ln_input else c["h"], params["gamma1"], dh)
        g["W_O"], g["b_O"] = W(c["merged"], da), da.sum(axis=bias_sum)
        dm = da @ params["W_O"].T
        if split:
            dm = dm.reshape(B, T, n_heads, -1).transpose(0, 2, 1, 3)
        dQ, dK, dV = att_bw(c["Q"], c["K"], c["V"], dm, mask)
        g["x"] = da if x_res else 0.0
        for n, dP in zip("QKV", (dQ, dK, dV)):
            dP = dP.transpose(0, 2, 1, 3).reshape(B, T, d)
            g[f"W_{n}"], g[f"b_{n}"] = W(x, dP), dP.sum(axis=bias_sum)
            g["x"] = g["x"] + dP @ params[f"W_{n}"].T
        return g
    return layer_backward


layer_ref = layer()


# ------------------------------------------------------------------ flash_forward


def flash_fwd(*, rescale="both", own_max=False, lse="right", scale=True, guard=True,
              use_mask=True, global_max=False):
    def flash_forward(Q, K, V, mask=None, block_size=4):
        S, d_k = K.shape[-2], Q.shape[-1]
        m, l = np.full(Q.shape[:-1], -np.inf), np.zeros(Q.shape[:-1])
        acc = np.zeros(Q.shape[:-1] + V.shape[-1:])
        with np.errstate(invalid="ignore", divide="ignore"):
            for start in range(0, S, block_size):
                stop = min(start + block_size, S)
                s = Q @ np.swapaxes(K[..., start:stop, :], -1, -2)
                s = s / np.sqrt(d_k) if scale else s
                if mask is not None and use_mask:
                    s = np.where(mask[..., start:stop], s, -np.inf)
                m_new = np.maximum(m, s.max() if global_max else s.max(axis=-1))
                shift = np.where(np.isfinite(m_new), m_new, 0.0) if guard else m_new
                alpha = np.exp(m - shift)
                own = s.max(axis=-1)
                base = np.where(np.isfinite(own), own, 0.0) if own_max else shift
                p = np.exp(s - base[..., None])
                l = (alpha * l if rescale in ("both", "l") else l) + p.sum(axis=-1)
                acc = (alpha[..., None] * acc if rescale == "both" else acc) + p @ V[..., start:stop, :]
                m = m_new
            if not guard:
                return acc / l[..., None], m + np.log(l)
            seen = l > 0
            l_safe = np.where(seen, l, 1.0)
            O = np.where(seen[..., None], acc / l_safe[..., None], 0.0)
            value = {"right": m + np.log(l_safe), "m": m, "log_l": np.log(l_safe)}[lse]
            return O, np.where(seen, value, -np.inf)
    return flash_forward


flash_fwd_ref = flash_fwd()

# ------------------------------------------------------------------ flash_backward


def flash_bwd(*, block_softmax=False, D_block=False, p_t=True, scale=1.0, s_scaled=True,
              use_mask=True, guard=True):
    def flash_backward(Q, K, V, O, lse, dO, mask=None, block_size=4):
        S, d_k = K.shape[-2], Q.shape[-1]
        lse_safe = (np.where(np.isfinite(lse), lse, 0.0) if guard else lse)[..., None]
        D = (dO * O).sum(axis=-1, keepdims=True)
        dQ, dK, dV = np.zeros(Q.shape), np.zeros(K.shape), np.zeros(V.shape)
        with np.errstate(invalid="ignore"):
            for start in range(0, S, block_size):
                stop = min(start + block_size, S)
                K_j, V_j = K[..., start:stop, :], V[..., start:stop, :]
                s = Q @ np.swapaxes(K_j, -1, -2)
                s = s / np.sqrt(d_k) if s_scaled else s
                if mask is not None and use_mask:
                    s = np.where(mask[..., start:stop], s, -np.inf)
                if block_softmax:   # each block as if it held every key
                    top = s.max(axis=-1, keepdims=True)
                    e = np.exp(s - np.where(np.isfinite(top), top, 0.0))
                    total = e.sum(axis=-1, keepdims=True)
                    P = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
                else:
                    P = np.exp(s - lse_safe)
                dP = dO @ np.swapaxes(V_j, -1, -2)
                dZ = P * (dP - ((dP * P).sum(axis=-1, keepdims=True) if D_block else D))
                dV[..., start:stop, :] = (np.swapaxes(P, -1, -2) if p_t else P) @ dO
                dQ += dZ @ K_j * scale / np.sqrt(d_k)
                dK[..., start:stop, :] = np.swapaxes(dZ, -1, -2) @ Q * scale / np.sqrt(d_k)
        return dQ, dK, dV
    return flash_backward


flash_bwd_ref = flash_bwd()


REFERENCE = {
    "softmax_vjp": (vjp_ref,),
    "attention_backward": (att_ref,),
    "layer_norm_backward": (ln_ref,),
    "layer_backward": (layer_ref,),
    "flash_forward": (flash_fwd_ref,),
    "flash_backward": (flash_bwd_ref,),
}

WRONG = {
    "softmax_vjp": [
        ("<s, g> summed over the whole array", (vjp_global_inner,), "over the whole array"),
        ("the <s, g> term dropped: s * g", (vjp_no_inner,), "subtract <s, g>"),
        ("the sign flipped", (vjp_sign,), "s * (<s, g> - g)"),
        ("<s, g> taken as the sum of g", (vjp_sum_g,), "you summed g alone"),
        ("no factor s", (vjp_no_s,), "multiply by s after subtracting"),
        ("only the Jacobian's diagonal", (vjp_diagonal,), "off-diagonal"),
        ("the sum without keepdims", (vjp_no_keepdims,), "keepdims=true"),
        ("the inner product along another axis", (vjp_last_axis,), "the axis the softmax summed over"),
    ],
    "attention_backward": [
        ("no 1/sqrt(d_k) in dQ and dK", (att(scale=np.sqrt(3.0)),), "you left out the 1/sqrt(d_k)"),
        ("1/sqrt(d_k) applied twice", (att(scale=1 / np.sqrt(3.0)),), "twice"),
        ("P instead of P^T in dV", (att(p_t=False),), "dv = p^t do, not p do"),
        ("the softmax's rowsum term dropped", (att(inner=False),), "you dropped the rowsum term"),
        ("dZ Q instead of dZ^T Q for dK", (att(dk_t=False),), "transpose dz"),
        ("the mask ignored when P is recomputed", (att(use_mask=False),), "recompute p with the mask"),
        ("-1e9 added instead of hiding keys", (att(additive=True),), "adding -1e9"),
        ("NaN on a row that sees no key", (att(guard=False),), "never divide by its empty sum"),
        ("K.T and V.T on batched arrays", (att_full_transpose,), "a full transpose k.t reverses"),
        ("a row with one visible key treated as empty", (att_one_key_empty,),
         "only a row with no visible key"),
        ("d_k taken from V", (att_d_k_from_V,), "v's width d_v"),
        ("dZ^T K for dQ", (att(dq_t=True),), "you transposed dz (dz^t k)"),
    ],
    "layer_norm_backward": [
        ("dgamma as the sum of dy", (ln_dgamma("no xhat"),), "you summed dy alone"),
        ("dgamma with x, not xhat", (ln_dgamma("x"),), "you used x itself"),
        ("the mean term missing", (ln(mean=False),), "the path through mu"),
        ("the x-hat term missing", (ln(xhat_term=False),), "the path through sigma^2"),
        ("mu and sigma treated as constants", (ln(mean=False, xhat_term=False),), "as constants"),
        ("the unbiased variance", (ln(ddof=1),), "you divided by d - 1"),
        ("gamma left out of dxhat", (ln(use_gamma=False),), "dxhat = gamma * dy"),
        ("eps outside the square root", (ln(eps_inside=False),), "eps inside the square root"),
        ("dgamma and dbeta not summed over the tokens", (ln(sum_params=False),),
         "sum over every axis but the last"),
    ],
    "layer_backward": [
        ("no residual route into x", (layer(x_res=False),), "add the residual route"),
        ("no residual route into h", (layer(h_res=False),), "dh = do + du w_1^t"),
        ("the ReLU's gate left out", (layer(gate=False),), "(u > 0)"),
        ("LayerNorm's backward given its output", (layer(ln_input=False),), "not with its output"),
        ("biases summed over the positions only", (layer(bias_sum=1),), "over the batch and the positions"),
        ("weight gradients transposed", (layer(transpose=True),), "has w's shape"),
    ],
    "flash_forward": [
        ("the accumulated output and sum not rescaled", (flash_fwd(rescale="none"),),
         "you forgot to rescale them"),
        ("the sum rescaled but not the output", (flash_fwd(rescale="l"),), "rescale acc by alpha"),
        ("a block's exponentials taken against its own maximum", (flash_fwd(own_max=True),),
         "you shifted the block by its own maximum"),
        ("lse = m", (flash_fwd(lse="m"),), "the running maximum m alone"),
        ("lse = log l", (flash_fwd(lse="log_l"),), "log l alone"),
        ("no 1/sqrt(d_k)", (flash_fwd(scale=False),), "divide each block's scores by sqrt(d_k)"),
        ("the mask ignored", (flash_fwd(use_mask=False),), "scores of hidden keys to -inf"),
        ("NaN on a row that sees no key", (flash_fwd(guard=False),), "shift by 0"),
        ("one max for the whole block", (flash_fwd(global_max=True),),
         "not the max of the whole block"),
    ],
    "flash_backward": [
        ("each block normalised by its own maximum and sum", (flash_bwd(block_softmax=True),),
         "from the whole row's saved log-sum-exp"),
        ("D summed over one block", (flash_bwd(D_block=True),), "computed once before the loop"),
        ("P instead of P^T in dV", (flash_bwd(p_t=False),), "not p_j do"),
        ("no 1/sqrt(d_k) in dQ and dK", (flash_bwd(scale=np.sqrt(4.0)),),
         "what does that do to dq and dk"),
        ("the scores recomputed without 1/sqrt(d_k)", (flash_bwd(s_scaled=False),),
         "are not the forward's weights"),
        ("the mask ignored when recomputing", (flash_bwd(use_mask=False),), "recompute z_j with the mask"),
        ("NaN on a row that sees no key", (flash_bwd(guard=False),), "use lse = 0 for such rows"),
    ],
}

# right answers that use a wrong earlier answer of the same notebook: "fix <exercise> first"
_VJP_NO_INNER_ATT = att_with_vjp(vjp_no_inner)
_LN_NO_MEAN = ln(mean=False)
DEPENDENT = {
    "attention_backward": [
        ("built on a softmax_vjp without <s, g>", (_VJP_NO_INNER_ATT,),
         {"softmax_vjp": vjp_no_inner}, "fix softmax_vjp first"),
    ],
    "layer_backward": [
        ("built on a layer_norm_backward without the mean term",
         (layer(layer_norm_backward=_LN_NO_MEAN),),
         {"layer_norm_backward": _LN_NO_MEAN, "attention_backward": att_ref},
         "fix layer_norm_backward first"),
    ],
}
