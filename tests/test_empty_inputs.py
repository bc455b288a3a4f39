"""Every float64 NumPy reference and its PyTorch twin agree on empty inputs (issue 26).

A public report: with no keys (S = 0) the PyTorch attention returned zeros, as
``F.scaled_dot_product_attention`` does, while the NumPy reference, whose docstring promises the
same behaviour and errors, raised numpy's "zero-size array to reduction operation maximum";
``softmax_np`` over an empty axis raised ``IndexError`` where ``torch.softmax`` returns an empty
tensor. The rule tested here, for every reference of the components (softmax ... flash
attention, the sampler's penalty): on an input with a zero-length axis (no keys, no queries, no
tokens, an empty batch, an empty softmax axis) the two give arrays of the same shape and values,
or both raise a ``ValueError`` (a clear message, never a raw numpy error). Where PyTorch has a
built-in for the same equation, it is the oracle for what "empty" gives (zeros for attention
with S = 0, like ``F.scaled_dot_product_attention``; an empty array for softmax over an empty
axis, like ``torch.softmax``).
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from txlearn import attention as att
from txlearn import ffn, flash_attention as fa, masks, norms, positional as pos
from txlearn import sampling, softmax as sm


def _t(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def _n(shape, seed=0):
    return _t(shape, seed).numpy()


# (label, numpy call, torch call): each a function of no arguments.
def _cases():
    c = []
    for shape, axis in (((3, 0), -1), ((0, 4), -1), ((0,), -1), ((2, 0, 3), 1)):
        c += [(f"softmax {shape} axis {axis}", lambda s=shape, a=axis: sm.softmax_np(_n(s), a),
               lambda s=shape, a=axis: sm.softmax(_t(s), a)),
              (f"log_softmax {shape} axis {axis}",
               lambda s=shape, a=axis: sm.log_softmax_np(_n(s), a),
               lambda s=shape, a=axis: sm.log_softmax(_t(s), a)),
              (f"softmax_vjp {shape} axis {axis}",
               lambda s=shape, a=axis: sm.softmax_vjp_np(_n(s), _n(s, 1), a),
               lambda s=shape, a=axis: sm.softmax_vjp(_t(s), _t(s, 1), a)),
              (f"entropy {shape}", lambda s=shape: sm.entropy_np(np.abs(_n(s))),
               lambda s=shape: sm.entropy(_t(s).abs()))]
    c += [("naive_softmax (0,)", lambda: sm.naive_softmax_np(_n((0,))),
           lambda: torch.softmax(_t((0,)), -1)),
          ("softmax_jacobian (0,)", lambda: sm.softmax_jacobian_np(_n((0,))),
           lambda: sm.softmax_jacobian(_t((0,)))),
          ("scaled_scores L=0", lambda: sm.scaled_scores_np(_n((2, 0, 4)), _n((2, 3, 4))),
           lambda: sm.scaled_scores(_t((2, 0, 4)), _t((2, 3, 4)))),
          ("scaled_scores S=0", lambda: sm.scaled_scores_np(_n((2, 3, 4)), _n((2, 0, 4))),
           lambda: sm.scaled_scores(_t((2, 3, 4)), _t((2, 0, 4)))),
          ("causal_mask L=0", lambda: masks.causal_mask_np(0, 3),
           lambda: masks.causal_mask(0, 3)),
          ("padding_mask B=0", lambda: masks.padding_mask_np([], 4),
           lambda: masks.padding_mask([], 4)),
          ("left_padding_mask B=0", lambda: masks.left_padding_mask_np([], 4),
           lambda: masks.left_padding_mask([], 4))]
    for label, (L, S) in (("S=0", (3, 0)), ("L=0", (0, 3)), ("L=S=0", (0, 0))):
        Q, K, V, dO = (2, L, 4), (2, S, 4), (2, S, 5), (2, L, 5)
        c += [(f"masked_softmax {label}",
               lambda L=L, S=S: att.masked_softmax_np(_n((2, L, S)), np.ones((L, S), bool)),
               lambda L=L, S=S: att.masked_softmax(_t((2, L, S)), torch.ones(L, S, dtype=bool))),
              (f"attention {label}", lambda Q=Q, K=K, V=V: att.attention_np(_n(Q), _n(K), _n(V)),
               lambda Q=Q, K=K, V=V: att.scaled_dot_product_attention(_t(Q), _t(K), _t(V))),
              (f"attention {label} with weights",
               lambda Q=Q, K=K, V=V: att.attention_np(_n(Q), _n(K), _n(V), return_weights=True),
               lambda Q=Q, K=K, V=V: att.scaled_dot_product_attention(_t(Q), _t(K), _t(V),
                                                                      return_weights=True)),
              (f"attention_backward {label}",
               lambda Q=Q, K=K, V=V, dO=dO: att.attention_backward_np(_n(Q), _n(K), _n(V),
                                                                      _n(dO, 1)),
               lambda Q=Q, K=K, V=V, dO=dO: att.attention_backward(_t(Q), _t(K), _t(V),
                                                                   _t(dO, 1))),
              (f"tiled_attention {label}",
               lambda Q=Q, K=K, V=V: fa.tiled_attention_np(_n(Q), _n(K), _n(V), block_size=2),
               lambda Q=Q, K=K, V=V: fa.tiled_attention(_t(Q), _t(K), _t(V), block_size=2)),
              (f"flash_attention {label}",
               lambda Q=Q, K=K, V=V: fa.flash_attention_forward_np(
                   _n(Q)[:, None], _n(K)[:, None], _n(V)[:, None], block_size=2)[0],
               lambda Q=Q, K=K, V=V: fa.flash_attention(
                   _t(Q)[:, None], _t(K)[:, None], _t(V)[:, None], block_size=2))]
    c += [("online_softmax_update S=0",
           lambda: fa.online_softmax_update_np(np.full((3,), -np.inf), np.zeros(3),
                                               np.zeros((3, 5)), _n((3, 0)), _n((0, 5))),
           lambda: fa.online_softmax_update(torch.full((3,), -torch.inf, dtype=torch.float64),
                                            torch.zeros(3, dtype=torch.float64),
                                            torch.zeros(3, 5, dtype=torch.float64),
                                            _t((3, 0)), _t((0, 5)))),
          ("sinusoidal_encoding T=0", lambda: pos.sinusoidal_encoding_np(0, 8),
           lambda: pos.sinusoidal_encoding(0, 8)),
          ("apply_rope T=0", lambda: pos.apply_rope_np(_n((2, 0, 8))),
           lambda: pos.apply_rope(_t((2, 0, 8)))),
          ("apply_rope half T=0", lambda: pos.apply_rope_np(_n((2, 0, 8)), pairing="half"),
           lambda: pos.apply_rope(_t((2, 0, 8)), pairing="half")),
          ("interpolate_positions T=0", lambda: pos.interpolate_positions_np(np.arange(0), 4, 8),
           lambda: pos.interpolate_positions(torch.arange(0), 4, 8)),
          ("alibi_bias L=0", lambda: pos.alibi_bias_np(4, 0, 3), lambda: pos.alibi_bias(4, 0, 3))]
    for name in ("relu", "gelu", "silu"):
        c.append((f"{name} (0, 4)", lambda n=name: getattr(ffn, n + "_np")(_n((0, 4))),
                  lambda n=name: getattr(ffn, n)(_t((0, 4)))))
    for act in ("relu", "gelu", "swiglu"):
        c.append((f"feed_forward {act} T=0", lambda a=act: _ffn(a, np_side=True),
                  lambda a=act: _ffn(a, np_side=False)))
    g, b = np.linspace(0.5, 1.5, 6), np.linspace(-1, 1, 6)
    tg, tb = torch.from_numpy(g), torch.from_numpy(b)
    c += [("layer_norm T=0", lambda: norms.layer_norm_np(_n((2, 0, 6)), g, b),
           lambda: norms.layer_norm(_t((2, 0, 6)), tg, tb)),
          ("rms_norm T=0", lambda: norms.rms_norm_np(_n((2, 0, 6)), g),
           lambda: norms.rms_norm(_t((2, 0, 6)), tg)),
          ("layer_norm_backward T=0",
           lambda: norms.layer_norm_backward_np(_n((2, 0, 6)), g, _n((2, 0, 6), 1)),
           lambda: norms.layer_norm_backward(_t((2, 0, 6)), tg, _t((2, 0, 6), 1))),
          ("rms_norm_backward T=0",
           lambda: norms.rms_norm_backward_np(_n((2, 0, 6)), g, _n((2, 0, 6), 1)),
           lambda: norms.rms_norm_backward(_t((2, 0, 6)), tg, _t((2, 0, 6), 1))),
          ("repetition penalty, no previous ids",
           lambda: sampling.apply_repetition_penalty_np(_n((5,)), [], 1.3),
           lambda: sampling.apply_repetition_penalty(_t((5,)), [], 1.3)),
          ("next_token_distribution n_vocab=0",
           lambda: sampling.next_token_distribution_np(_n((0,))),
           lambda: sampling.next_token_distribution(_t((0,))))]
    return c


def _ffn(activation, np_side):
    torch.manual_seed(0)
    module = ffn.FeedForward(6, 10, activation).double()
    x = _t((2, 0, 6))
    if not np_side:
        with torch.no_grad():
            return module(x)
    p = {k: v.detach().numpy() for k, v in module.named_parameters()}
    return ffn.feed_forward_np(x.numpy(), p["W_1"], p.get("b_1"), p["W_2"], p.get("b_2"),
                               activation=activation, W_3=p.get("W_3"))


CASES = _cases()


def _run(fn):
    try:
        return "ok", fn()
    except Exception as err:  # noqa: BLE001 - the kind is what the test compares
        return type(err).__name__, str(err)


def _arrays(value):
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in _arrays(v)]
    return [np.asarray(value.detach() if isinstance(value, torch.Tensor) else value)]


@pytest.mark.parametrize("label, np_fn, torch_fn", CASES, ids=[c[0] for c in CASES])
def test_numpy_reference_and_torch_twin_agree_on_empty_inputs(label, np_fn, torch_fn):
    """Same shapes and values, or a ValueError from both (never numpy's raw IndexError or
    "zero-size array to reduction operation")."""
    (kind_np, got_np), (kind_t, got_t) = _run(np_fn), _run(torch_fn)
    assert kind_np == kind_t and kind_np in ("ok", "ValueError"), \
        f"{label}: NumPy {kind_np} {got_np!r}, torch {kind_t} {got_t!r}"
    if kind_np != "ok":
        return
    a, b = _arrays(got_np), _arrays(got_t)
    assert len(a) == len(b), label
    for x, y in zip(a, b):
        assert x.shape == y.shape, f"{label}: NumPy {x.shape}, torch {y.shape}"
        np.testing.assert_allclose(x.astype(np.float64), y.astype(np.float64), atol=1e-12,
                                   err_msg=label)


def test_attention_without_keys_gives_zeros_like_torch():
    """S = 0 keys: every query's output is 0, as F.scaled_dot_product_attention returns (the
    report's oracle), in the NumPy reference, the teaching attention and the tiled ones."""
    Q, K, V = _t((2, 3, 4)), _t((2, 0, 4)), _t((2, 0, 5))
    expected = F.scaled_dot_product_attention(Q, K, V)                         # (2, 3, 5) zeros
    assert expected.shape == (2, 3, 5) and not expected.abs().any()
    np.testing.assert_array_equal(att.attention_np(Q.numpy(), K.numpy(), V.numpy()), expected)
    np.testing.assert_array_equal(fa.tiled_attention_np(Q.numpy(), K.numpy(), V.numpy()),
                                  expected)
    torch.testing.assert_close(att.scaled_dot_product_attention(Q, K, V), expected)


def test_softmax_over_an_empty_axis_is_empty_like_torch():
    """torch.softmax over an axis of length 0 returns an empty tensor of the input's shape;
    so do softmax_np, log_softmax_np and naive_softmax_np (the report: IndexError)."""
    x = _t((3, 0))
    assert torch.softmax(x, -1).shape == (3, 0)
    for fn in (sm.softmax_np, sm.log_softmax_np):
        assert fn(x.numpy(), -1).shape == (3, 0)
    assert sm.naive_softmax_np(np.zeros(0)).shape == (0,)
