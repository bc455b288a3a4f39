"""The float64 references of set 10's small-model checks (:mod:`txlearn.checks.decoder`):
rotary attention with the half pairing and grouped KV heads, the pre-norm Llama layer and the
decoder with a tied head, each with the knobs that reproduce a catalogued mistake
(tests/catalogue/decoder.py), and the random states they are checked on. Written from the
equations of lesson 10 and set 10's statements, in float64 PyTorch;
``F.scaled_dot_product_attention`` with ``enable_gqa`` is the one built-in they lean on.
"""

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["rope_half_ref", "llama_attention_ref", "rms", "swiglu", "layer_ref", "decoder_ref",
           "layer_state", "decoder_state", "f32", "decoder_args"]


def rope_half_ref(x, positions, base, *, pairing="half", sign=1.0, exponent=2.0,
                  angles=torch.float64):
    """float64 rotation of ``x (..., T, d)`` by ``positions`` with the catalogued knobs
    (``angles=torch.float32``: theta, the angles and their cos and sin in float32)."""
    x = torch.as_tensor(np.asarray(x, dtype=np.float64))
    d = x.shape[-1]
    h = d // 2
    theta = base ** (-exponent * torch.arange(0, d, 2, dtype=angles) / (2 * d))
    angle = torch.as_tensor(np.asarray(positions)).to(angles)[:, None] * theta
    cos, sin = torch.cos(angle).double(), sign * torch.sin(angle).double()
    if pairing == "half":
        a, b = x[..., :h], x[..., h:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1).numpy()
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2).numpy()


def llama_attention_ref(state, x, n_heads, mask, q_rows, q_pos, k_pos, base, *, pairing="half",
                         rot_k=True, rot_q=True):
    """Rotary GQA attention output (float64) of the queries ``x[:, q_rows]`` over every row of
    ``x`` as keys, without biases."""
    t = {k: torch.as_tensor(np.asarray(v, dtype=np.float64)) for k, v in state.items()}
    x = torch.as_tensor(np.asarray(x, dtype=np.float64))
    B, S, d_model = x.shape
    d_k = d_model // n_heads
    n_kv = t["W_K"].shape[1] // d_k

    def heads(name, h, rows):
        y = x[:, rows] @ t[f"W_{name}"]
        return y.reshape(B, y.shape[1], h, d_k).transpose(1, 2)

    Q = heads("Q", n_heads, q_rows)
    K, V = heads("K", n_kv, slice(None)), heads("V", n_kv, slice(None))
    if rot_q:
        Q = torch.as_tensor(rope_half_ref(Q.numpy(), q_pos, base, pairing=pairing))
    if rot_k:
        K = torch.as_tensor(rope_half_ref(K.numpy(), k_pos, base, pairing=pairing))
    m = torch.as_tensor(mask).bool()
    out = F.scaled_dot_product_attention(Q, K, V, attn_mask=m, enable_gqa=True)
    return (out.transpose(1, 2).reshape(B, -1, d_model) @ t["W_O"]).numpy()


def rms(x, gamma, eps):
    return gamma * x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps)


def swiglu(x, t, p):
    gate = x @ t[p + "W_3"]
    return (gate * torch.sigmoid(gate) * (x @ t[p + "W_1"])) @ t[p + "W_2"]


def layer_ref(t, p, x, n_heads, mask, q_rows, q_pos, k_pos, eps, base, *, post=False,
               residual=True, one_norm=False, ffn_on_x=False):
    """One pre-norm Llama layer (float64) on the rows ``q_rows`` of ``x``, with ``x`` all the
    rows the keys come from (the layer's input at every position seen)."""
    g1 = t[p + "norm1.gamma"]
    g2 = g1 if one_norm else t[p + "norm2.gamma"]
    attn_state = {k: t[p + "attn." + k].numpy() for k in ("W_Q", "W_K", "W_V", "W_O")}
    x_rows = x[:, q_rows]
    if post:
        a = torch.as_tensor(llama_attention_ref(attn_state, x.numpy(), n_heads, mask, q_rows,
                                                 q_pos, k_pos, base))
        h = rms(x_rows + a, g1, eps)
        return rms(h + swiglu(h, t, p + "ffn."), g2, eps)
    a = torch.as_tensor(llama_attention_ref(attn_state, rms(x, g1, eps).numpy(), n_heads, mask,
                                             q_rows, q_pos, k_pos, base))
    h = x_rows + a if residual else a
    f = swiglu(rms(x_rows if ffn_on_x else h, g2, eps), t, p + "ffn.")
    return h + f if residual else f


def decoder_ref(state, ids, cfg, *, scaled=False, final_norm=True, head_t=False, causal=True,
                **layer_kw):
    """The decoder's logits (float64 NumPy) for ``ids (B, T)`` at positions 0 .. T-1."""
    t = {k: torch.as_tensor(np.asarray(v, dtype=np.float64)) for k, v in state.items()}
    ids = torch.as_tensor(ids)
    T = ids.shape[1]
    x = t["W_E"][ids] * (cfg["d_model"] ** 0.5 if scaled else 1.0)
    mask = torch.ones(T, T, dtype=torch.bool)
    mask = mask.tril() if causal else mask
    pos = np.arange(T)
    for i in range(cfg["n_layers"]):
        x = layer_ref(t, f"layers.{i}.", x, cfg["n_heads"], mask, slice(None), pos, pos,
                       cfg["eps"], cfg["rope_base"], **layer_kw)
    h = rms(x, t["norm.gamma"], cfg["eps"]) if final_norm else x
    return (h @ (t["W_E"] if head_t else t["W_E"].T)).numpy()


def layer_state(rng, d_model, n_heads, n_kv_heads, d_ff, prefix=""):
    d_kv = n_kv_heads * (d_model // n_heads)
    shapes = {"norm1.gamma": (d_model,), "attn.W_Q": (d_model, d_model),
              "attn.W_K": (d_model, d_kv), "attn.W_V": (d_model, d_kv),
              "attn.W_O": (d_model, d_model), "norm2.gamma": (d_model,),
              "ffn.W_1": (d_model, d_ff), "ffn.W_2": (d_ff, d_model), "ffn.W_3": (d_model, d_ff)}
    out = {}
    for k, shape in shapes.items():
        out[prefix + k] = (1.0 + rng.normal(0, 0.3, shape) if k.endswith("gamma")
                           else rng.normal(0, 0.5 / np.sqrt(shape[0]) * 2, shape))
    return out


def decoder_state(cfg, seed):
    rng = np.random.default_rng(seed)
    state = {"W_E": rng.normal(0, 1.0, (cfg["n_vocab"], cfg["d_model"]))}
    for i in range(cfg["n_layers"]):
        state.update(layer_state(rng, cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"],
                                  cfg["d_ff"], f"layers.{i}."))
    state["norm.gamma"] = 1.0 + rng.normal(0, 0.3, cfg["d_model"])
    return state


def f32(state):
    return {k: torch.tensor(v, dtype=torch.float32) for k, v in state.items()}


def decoder_args(cfg):
    return (cfg["n_vocab"], cfg["d_model"], cfg["n_layers"], cfg["n_heads"], cfg["n_kv_heads"],
            cfg["d_ff"], cfg["eps"], cfg["rope_base"])
