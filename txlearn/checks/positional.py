"""Checks of set 04 (lesson 04): sinusoidal_table, rope and rotary_attention.

References: :func:`txlearn.positional.sinusoidal_encoding_np` and :func:`apply_rope_np` (float64
NumPy), and for rotary attention the float64 multi-head attention of ``txlearn.checks.heads``
(on ``F.scaled_dot_product_attention``) with queries and keys rotated by
:func:`txlearn.positional.apply_rope`. When an answer is wrong, the outputs of the catalogued
mistakes (``tests/catalogue/positional.py``) on the same inputs choose the hint.
Source: ``exercises/source/04_positional.py``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from txlearn.checks import exercise
from txlearn.checks.learner import method
from txlearn.checks.modules import (F32, expect_dtype, expect_match, expect_pair, expect_shape_of,
                                    expect_tensor, f64, load, make_module, mask_ref, mha_state,
                                    np64, run)
from txlearn.checks.heads import MHA_NAMES, MHA_W_K_SHAPE
from txlearn.positional import apply_rope, apply_rope_np, sinusoidal_encoding_np

# ----------------------------------------------------------------------------- sinusoidal_table

PE_HALVES = (
    "the paper interleaves sin and cos",
    "sin at the even feature indices 0, 2, 4, ... and cos at the odd ones, pair by pair",
    "your table puts all the sines first and all the cosines after them")
PE_SWAPPED = (
    "which function sits at the even indices",
    "row 0 is [0, 1, 0, 1, ...]: sin 0 = 0 at even indices, cos 0 = 1 at odd ones",
    "your sin and cos are swapped")
PE_EXPONENT_HALF = (
    "the frequencies fall off over the pairs",
    "omega_i = 10000^(-2i / d_model): the exponent is the even index 2i, not the pair index i",
    "your exponent is i / d_model")
PE_EXPONENT_PER_FEATURE = (
    "both features of a pair share one frequency",
    "features 2i and 2i+1 both use omega_i = 10000^(-2i / d_model)",
    "your cos features use their own (odd) index in the exponent")
PE_POSITIVE = (
    "the frequencies fall as i grows",
    "omega_i = 10000^(-2i / d_model) is 1 for i = 0 and small for the last pair",
    "your exponent has the wrong sign (the frequencies grow)")
PE_FROM_ONE = (
    "positions are counted from 0",
    "row 0 is position 0: all sines 0 and all cosines 1",
    "your first row is position 1")
PE_TRANSPOSED = (
    "one row per position",
    "the table is (T, d_model)",
    "yours is transposed")
PE_DTYPE = (
    "the table is float32, like the embeddings it is added to",
    "a float64 table would turn every sum with it into float64",
    "compute in float64 if you like, then return .float()")
PE_DEFAULT = ("compare row 1 with the formula: [sin(omega_0), cos(omega_0), sin(omega_1), ...]",)


def _pe(T, d, *, layout="interleaved", exponent=lambda j, d: 2 * (j // 2) / d, start=0):
    """A sinusoidal table with a chosen mistake (float64)."""
    pos = np.arange(start, start + T)[:, None]
    j = np.arange(d)
    angle = pos / 10000.0 ** exponent(j, d)                                   # (T, d)
    if layout == "halves":
        half = angle[:, 0::2]
        return np.concatenate([np.sin(half), np.cos(half)], axis=-1)
    pe = np.where(j % 2 == 0, np.sin(angle), np.cos(angle))
    return pe[:, np.arange(d) ^ 1] if layout == "swapped" else pe


def _pe_mistakes(T, d):
    return [(_pe(T, d, layout="halves"), PE_HALVES), (_pe(T, d, layout="swapped"), PE_SWAPPED),
            (_pe(T, d, exponent=lambda j, d: (j // 2) / d), PE_EXPONENT_HALF),
            (_pe(T, d, exponent=lambda j, d: j / d), PE_EXPONENT_PER_FEATURE),
            (_pe(T, d, exponent=lambda j, d: -2 * (j // 2) / d), PE_POSITIVE),
            (_pe(T, d, start=1), PE_FROM_ONE), (_pe(T, d).T, PE_TRANSPOSED)]


@exercise("sinusoidal_table")
def sinusoidal_table(sinusoidal_encoding):
    for T, d in ((4, 4), (50, 8), (7, 16)):
        case = f"T={T}, d_model={d}"
        got = run(sinusoidal_encoding, T, d, case=case)
        expect_tensor(got, case=case, hint=("return a torch tensor",))
        expect_shape_of(got, (T, d), case=case, wrong=[((d, T), PE_TRANSPOSED)],
                        hint=("the table is (T, d_model)",))
        expect_dtype(got, torch.float32, case=case, hint=PE_DTYPE)
        expect_match(got, sinusoidal_encoding_np(T, d), case=case, rtol=1e-5, atol=1e-5,
                     mistakes=_pe_mistakes(T, d), default=PE_DEFAULT)


# ----------------------------------------------------------------------------- rope

ROPE_HALF = (
    "which channels form a pair",
    "the course pairs neighbours: (x[2i], x[2i+1]), the interleaved pairing of RoFormer",
    "you paired channel i with channel i + d/2 (the half-split pairing of GPT-NeoX)")
ROPE_DIRECTION = (
    "the direction of the rotation",
    "(a, b) -> (a cos - b sin, a sin + b cos) turns by +m theta_i",
    "your rotation goes the other way: the signs of the sin terms are swapped")
ROPE_EXPONENT = (
    "the frequencies fall off over the pairs",
    "theta_i = 10000^(-2i / d): the exponent is 2i / d",
    "your exponent is i / d")
ROPE_POSITIONS = (
    "each row has its own position",
    "use the positions you are given: with a KV cache they do not start at 0",
    "you rotated row t by t, not by positions[t]")
ROPE_NOT_INTERLEAVED_BACK = (
    "the rotated pair goes back where it came from",
    "a'_i and b'_i are channels 2i and 2i+1 of the result",
    "you put all the a' first and all the b' after them")
ROPE_DTYPE = (
    "keep the input's dtype",
    "angles in float64 turn a float32 input into a float64 result",
    "cast cos and sin (or the result) to x.dtype")
ROPE_FLOAT32_ANGLES = (
    "in which dtype are the angles?",
    "compute theta and the angles m theta_i in float64 and cast cos and sin to x.dtype only at "
    "the end: float32 angles lose about 7 digits, and a float64 input shows it",
    "your result matches angles computed in float32")
ROPE_DEFAULT = ("(a, b) -> (a cos m theta_i - b sin m theta_i, a sin m theta_i + b cos m theta_i)",)


def _rope_variant(x, positions, *, pairing="interleaved", sign=1.0, exponent=2.0, back="interleave"):
    x = np64(x)
    d = x.shape[-1]
    theta = 10000.0 ** (-exponent * np.arange(d // 2) / d)
    angle = sign * np.asarray(positions, dtype=np.float64)[:, None] * theta       # (T, d/2)
    if pairing == "half":
        a, b = x[..., : d // 2], x[..., d // 2:]
    else:
        a, b = x[..., 0::2], x[..., 1::2]
    a2, b2 = a * np.cos(angle) - b * np.sin(angle), a * np.sin(angle) + b * np.cos(angle)
    if pairing == "half" or back == "concat":
        return np.concatenate([a2, b2], axis=-1)
    return np.stack([a2, b2], axis=-1).reshape(x.shape)


def _rope_float32_angles(x, positions):
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    angle = torch.as_tensor(positions).float()[:, None] * theta                 # float32
    a, b = torch.as_tensor(np64(x))[..., 0::2], torch.as_tensor(np64(x))[..., 1::2]
    cos, sin = torch.cos(angle).double(), torch.sin(angle).double()
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def _rope_mistakes(x, positions):
    T = x.shape[-2]
    return [(_rope_variant(x, positions, pairing="half"), ROPE_HALF),
            (lambda: _rope_float32_angles(x, positions), ROPE_FLOAT32_ANGLES),
            (_rope_variant(x, positions, sign=-1.0), ROPE_DIRECTION),
            (_rope_variant(x, positions, exponent=1.0), ROPE_EXPONENT),
            (_rope_variant(x, np.arange(T)), ROPE_POSITIONS),
            (_rope_variant(x, positions, back="concat"), ROPE_NOT_INTERLEAVED_BACK)]


@exercise("rope")
def rope(apply_rope):
    g = torch.Generator().manual_seed(3)
    cases = [
        ("x (1, 1, 3, 4) float64, positions [5, 0, 2]", torch.randn(1, 1, 3, 4, generator=g).double(),
         torch.tensor([5, 0, 2])),
        ("x (2, 3, 4, 8) float32 (B, n_heads, T, d_k), positions [7, 8, 9, 10]",
         torch.randn(2, 3, 4, 8, generator=g), torch.arange(7, 11)),
        ("x (2, 6) float64 (T=2, d=6), positions [0, 1000]", torch.randn(2, 6, generator=g).double(),
         torch.tensor([0, 1000])),
    ]
    for case, x, positions in cases:
        got = run(apply_rope, x.clone(), positions.clone(), case=case)
        expect_tensor(got, case=case, hint=("return a torch tensor",))
        expect_shape_of(got, tuple(x.shape), case=case, hint=("the result has the shape of x",))
        expect_dtype(got, x.dtype, case=case, hint=ROPE_DTYPE)
        tol = F32 if x.dtype == torch.float32 else {"rtol": 1e-7, "atol": 1e-9}
        dtol = (1e-6, 1e-6) if x.dtype == torch.float64 else None   # float32 angles: ~1e-7
        expect_match(got, apply_rope_np(x.numpy(), positions.numpy()), case=case, **tol,
                     mistakes=_rope_mistakes(x, positions), default=ROPE_DEFAULT, dtol=dtol)


# ----------------------------------------------------------------------------- rotary_attention

ROT_Q_ONLY = (
    "RoPE rotates the queries and the keys",
    "a score q_m . k_n depends on m - n only when both sides are rotated",
    "you rotated Q but returned K unrotated")
ROT_K_ONLY = (
    "RoPE rotates the queries and the keys",
    "a score q_m . k_n depends on m - n only when both sides are rotated",
    "you rotated K but returned Q unrotated")
ROT_NONE = (
    "each position has its own angle",
    "this call's positions are start, start + 1, ..., start + L - 1, one per row of Q and K",
    "rotating every row by the same position changes no score at all")
ROT_K_BACKWARDS = (
    "queries and keys turn the same way",
    "rotate Q and K with the same positions and the same apply_rope",
    "you rotated K by minus its positions")
ROT_SWAPPED = (
    "apply_positions returns the pair in the order it received it",
    "the first element is the rotated Q, the second the rotated K",
    "you returned (K, Q)")
ROT_START = (
    "positions continue after the cache",
    "a cached step's queries and keys sit at positions start .. start + L - 1, where start is "
    "the number of cached positions (step 2 of your forward in set 03 computes it)",
    "your rotation ignores start, or your MultiHeadAttention passes a wrong start")
ROT_OFFSET = (
    "positions are counted from 0",
    "the first position of a sequence is 0: this call's rows sit at start, start + 1, ..., "
    "start + L - 1",
    "your rows are rotated one position too far (attention outputs hide it, since only "
    "differences of positions reach a score, but the cached keys carry the wrong angles)")
ROT_DEFAULT = ("rotate Q and K (not V) with apply_rope by the positions start .. start + L - 1",)


def _rotary(state, x, n_heads, mask, q_rows, q_pos, k_pos, *, rot_q=True, rot_k=True, k_sign=1,
            swap=False):
    """Rotary attention output (float64) for the queries of rows ``q_rows`` of ``x`` over every
    row as keys; ``q_pos`` and ``k_pos`` are the positions each side is rotated by."""
    t = {k: f64(v) for k, v in state.items()}
    x = f64(x)
    B, S, d_model = x.shape
    d_k = d_model // n_heads
    n_kv = t["W_K"].shape[1] // d_k

    def heads(name, h, rows):
        y = x[:, rows] @ t[f"W_{name}"] + t.get(f"b_{name}", 0.0)
        return y.reshape(B, y.shape[1], h, d_k).transpose(1, 2)

    Q, K, V = heads("Q", n_heads, q_rows), heads("K", n_kv, slice(None)), heads("V", n_kv, slice(None))
    Qr = apply_rope(Q, torch.as_tensor(q_pos)) if rot_q else Q
    Kr = apply_rope(K, k_sign * torch.as_tensor(k_pos)) if rot_k else K
    if swap:
        Qr, Kr = Kr, Qr
    m = torch.as_tensor(mask).bool()
    out = F.scaled_dot_product_attention(Qr, Kr, V, attn_mask=m, enable_gqa=True)
    return out.transpose(1, 2).reshape(B, -1, d_model) @ t["W_O"] + t.get("b_O", 0.0)


def _rotary_mistakes(state, x, n_heads, mask, q_rows, q_pos, k_pos, k_pos_restarted=None):
    def v(**kw):
        return lambda: _rotary(state, x, n_heads, mask, q_rows, kw.pop("q", q_pos),
                               kw.pop("k", k_pos), **kw)
    out = [(v(rot_k=False), ROT_Q_ONLY), (v(rot_q=False), ROT_K_ONLY),
           (v(rot_q=False, rot_k=False), ROT_NONE), (v(k_sign=-1), ROT_K_BACKWARDS),
           (v(swap=True), ROT_SWAPPED)]
    if k_pos_restarted is not None:
        out.insert(0, (v(q=np.arange(len(q_pos)), k=k_pos_restarted), ROT_START))
    return out


def _rotary_module(RotaryAttention, d_model, n_heads, n_kv_heads, seed, case):
    kwargs = {} if n_kv_heads is None else {"n_kv_heads": n_kv_heads}
    m = make_module(RotaryAttention, d_model, n_heads, case=case, **kwargs)
    state = mha_state(d_model, n_heads, n_kv_heads or n_heads, True, seed)
    load(m, state, case=case, names=MHA_NAMES, shapes={"W_K": MHA_W_K_SHAPE, "W_V": MHA_W_K_SHAPE})
    return m, state


@exercise("rotary_attention", needs=("multi_head_attention", "rope"))
def rotary_attention(RotaryAttention):
    g = torch.Generator().manual_seed(4)
    case = "B=2, T=5, d_model=8, n_heads=2 (d_k=4), causal mask, no cache"
    m, state = _rotary_module(RotaryAttention, 8, 2, None, 20, case)
    x, mask = torch.randn(2, 5, 8, generator=g), mask_ref(5, 5)
    got = run(m, x.clone(), mask=mask, case=case)
    expect_shape_of(got, (2, 5, 8), case=case, hint=("out has the shape of x",))
    rows, pos = slice(None), np.arange(5)
    expect_match(got, _rotary(state, x, 2, mask, rows, pos, pos), case=case, **F32,
                 mistakes=_rotary_mistakes(state, x, 2, mask, rows, pos, pos), default=ROT_DEFAULT)

    # the KV cache: 4 positions, then 2 more; GQA with n_kv_heads = 2
    x = torch.randn(1, 6, 16, generator=g)
    pos = np.arange(6)
    for step, (lo, hi) in enumerate(((0, 4), (4, 6)), start=1):
        case = (f"KV cache, step {step}: positions {lo}-{hi - 1}, n_heads=4, n_kv_heads=2, "
                f"d_model=16, mask causal_mask({hi - lo}, {hi})")
        if step == 1:
            m, state = _rotary_module(RotaryAttention, 16, 4, 2, 21, case)
        got = run(m, x[:, lo:hi].clone(), mask=mask_ref(hi - lo, hi), use_cache=True, case=case,
                  hint=ROT_DEFAULT)
        expect_shape_of(got, (1, hi - lo, 16), case=case, hint=("out has the shape of x",))
        mask = mask_ref(hi - lo, hi)
        keys, rows = x[:, :hi], slice(lo, hi)
        restarted = np.concatenate([np.arange(4), np.arange(hi - 4)]) if step == 2 else None
        want = _rotary(state, keys, 4, mask, rows, pos[lo:hi], pos[:hi])
        expect_match(got, want, case=case, **F32, default=ROT_DEFAULT,
                     mistakes=_rotary_mistakes(state, keys, 4, mask, rows, pos[lo:hi], pos[:hi],
                                               restarted))

    # apply_positions itself: a constant shift of every position changes no attention output
    case = ("apply_positions(Q, K, start=3) of your module: Q (1, 4, 2, 4), K (1, 2, 2, 4) "
            "float64, rows at positions 3 and 4")
    Q = torch.randn(1, 4, 2, 4, generator=g, dtype=torch.float64)
    K = torch.randn(1, 2, 2, 4, generator=g, dtype=torch.float64)
    got = expect_pair(run(method(m, "apply_positions"), Q.clone(), K.clone(), 3, case=case,
                          hint=ROT_DEFAULT), case=case, hint=ROT_SWAPPED)
    right = torch.arange(3, 5)
    for name, have, x_in in (("Q", got[0], Q), ("K", got[1], K)):
        expect_match(have, apply_rope(x_in, right), case=f"{case}, the rotated {name}",
                     rtol=1e-7, atol=1e-9, default=ROT_DEFAULT,
                     mistakes=[(lambda x_in=x_in: apply_rope(x_in, right + 1), ROT_OFFSET),
                               (lambda x_in=x_in: apply_rope(x_in, right - 3), ROT_START),
                               (lambda x_in=x_in: x_in, ROT_Q_ONLY if name == "K" else ROT_K_ONLY)])
