"""Backward passes written by hand (softmax, attention, LayerNorm, RMSNorm) against autograd in
float64 to 1e-10, against finite differences (gradcheck/gradgradcheck of an autograd Function
whose backward is the hand-written one), their NumPy twins, and golden cases derived by hand."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from txlearn.attention import (attention_backward, attention_backward_np,
                               scaled_dot_product_attention)
from txlearn.masks import causal_mask
from txlearn.norms import (layer_norm, layer_norm_backward, layer_norm_backward_np, rms_norm,
                           rms_norm_backward, rms_norm_backward_np)
from txlearn.softmax import softmax, softmax_vjp, softmax_vjp_np

F64 = torch.float64
TOL = dict(rtol=0, atol=1e-10)


def _randn(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64) * scale


def _autograd(fn, inputs, grad_out):
    inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*inputs)
    return torch.autograd.grad(out, inputs, grad_out, allow_unused=True)


# --------------------------------------------------------------------------- softmax

def test_softmax_vjp_golden():
    # x = [ln 2, 0, 0] -> s = [1/2, 1/4, 1/4]; g = [1, 0, 0] -> <s, g> = 1/2,
    # dx = s * (g - 1/2) = [1/4, -1/8, -1/8] (sums to 0: softmax ignores a shift)
    s = softmax(torch.tensor([math.log(2.0), 0.0, 0.0], dtype=F64))
    dx = softmax_vjp(s, torch.tensor([1.0, 0.0, 0.0], dtype=F64))
    torch.testing.assert_close(dx, torch.tensor([0.25, -0.125, -0.125], dtype=F64), **TOL)
    np.testing.assert_allclose(softmax_vjp_np(s.numpy(), [1.0, 0.0, 0.0]), dx.numpy(), **TOL)


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_softmax_vjp_equals_autograd_on_every_axis(dim):
    x, g = _randn(3, 5, 4, seed=1, scale=3.0), _randn(3, 5, 4, seed=2)
    (expected,) = _autograd(lambda v: torch.softmax(v, dim), [x], g)
    got = softmax_vjp(torch.softmax(x, dim), g, dim=dim)
    torch.testing.assert_close(got, expected, **TOL)
    np.testing.assert_allclose(softmax_vjp_np(torch.softmax(x, dim).numpy(), g.numpy(), axis=dim),
                               expected.numpy(), **TOL)


def test_softmax_vjp_of_an_empty_row_is_zero_and_shapes_are_named():
    dx = softmax_vjp(torch.zeros(2, 3, dtype=F64), _randn(2, 3))
    assert torch.equal(dx, torch.zeros(2, 3, dtype=F64))
    with pytest.raises(ValueError, match=r"s \(2, 3\) and g \(3, 2\)"):
        softmax_vjp(torch.zeros(2, 3), torch.zeros(3, 2))
    with pytest.raises(ValueError, match=r"s \(2,\) and g \(3,\)"):
        softmax_vjp_np([0.5, 0.5], [1.0, 0.0, 0.0])


class _SoftmaxByHand(torch.autograd.Function):
    """softmax whose backward is softmax_vjp: gradcheck compares it with finite differences."""

    @staticmethod
    def forward(ctx, x):
        s = torch.softmax(x, -1)
        ctx.save_for_backward(s)
        return s

    @staticmethod
    def backward(ctx, g):
        (s,) = ctx.saved_tensors
        return softmax_vjp(s, g)


def test_softmax_vjp_passes_gradcheck_and_gradgradcheck():
    x = _randn(2, 5, seed=3).requires_grad_(True)
    assert torch.autograd.gradcheck(_SoftmaxByHand.apply, (x,))
    assert torch.autograd.gradgradcheck(_SoftmaxByHand.apply, (x,))


# --------------------------------------------------------------------------- attention

def test_attention_backward_golden():
    # d_k = 1 (scale 1): q = 1, keys 0 and ln 3 -> scores [0, ln 3], P = [1/4, 3/4];
    # V = [1, 0] -> O = 1/4; dO = 1: dV = P^T dO = [1/4, 3/4]; dP = dO V^T = [1, 0];
    # rowsum(dP * P) = 1/4 -> dZ = P * (dP - 1/4) = [3/16, -3/16];
    # dQ = dZ K = -3 ln 3 / 16; dK = dZ^T Q = [3/16, -3/16]. A third key, masked: no gradient.
    Q = torch.tensor([[1.0]], dtype=F64)
    K = torch.tensor([[0.0], [math.log(3.0)], [5.0]], dtype=F64)
    V = torch.tensor([[1.0], [0.0], [7.0]], dtype=F64)
    mask = torch.tensor([[True, True, False]])
    dQ, dK, dV = attention_backward(Q, K, V, torch.ones(1, 1, dtype=F64), mask)
    torch.testing.assert_close(dQ, torch.tensor([[-3 * math.log(3.0) / 16]], dtype=F64), **TOL)
    torch.testing.assert_close(dK, torch.tensor([[3 / 16], [-3 / 16], [0.0]], dtype=F64), **TOL)
    torch.testing.assert_close(dV, torch.tensor([[0.25], [0.75], [0.0]], dtype=F64), **TOL)


def _attention_cases():
    rect = causal_mask(3, 7)  # bottom-right: query 0 sees keys 0..4
    empty = torch.ones(5, 7, dtype=torch.bool)
    empty[1] = False  # query 1 sees nothing
    empty[3, 2:] = False
    return {
        "no mask, L != S": dict(Qs=(2, 3, 5, 8), Ks=(2, 3, 7, 8), Vs=(2, 3, 7, 6), mask=None),
        "causal, L = S": dict(Qs=(2, 6, 8), Ks=(2, 6, 8), Vs=(2, 6, 4), mask=causal_mask(6)),
        "causal bottom-right, L < S": dict(Qs=(2, 3, 8), Ks=(2, 7, 8), Vs=(2, 7, 4), mask=rect),
        "a fully masked row": dict(Qs=(2, 5, 8), Ks=(2, 7, 8), Vs=(2, 7, 4), mask=empty),
        "GQA: 2 kv heads shared by 3 query heads each": dict(
            Qs=(2, 2, 3, 5, 8), Ks=(2, 2, 1, 7, 8), Vs=(2, 2, 1, 7, 6), mask=causal_mask(5, 7)),
        "MQA: one K, V for 4 heads": dict(Qs=(1, 4, 5, 8), Ks=(1, 1, 5, 8), Vs=(1, 1, 5, 3),
                                          mask=causal_mask(5)),
    }


@pytest.mark.parametrize("name", list(_attention_cases()))
def test_attention_backward_equals_autograd(name):
    case = _attention_cases()[name]
    Q, K, V = (_randn(*case[k], seed=i, scale=2.0) for i, k in enumerate(("Qs", "Ks", "Vs")))
    mask = case["mask"]
    out_shape = scaled_dot_product_attention(Q, K, V, mask).shape
    dO = _randn(*out_shape, seed=9)
    expected = _autograd(lambda q, k, v: scaled_dot_product_attention(q, k, v, mask), [Q, K, V], dO)
    got = attention_backward(Q, K, V, dO, mask)
    for g, e, what in zip(got, expected, ("dQ", "dK", "dV")):
        assert g.shape == e.shape, what
        torch.testing.assert_close(g, e, **TOL, msg=f"{name}: {what}")
    m = None if mask is None else mask.numpy()
    for g, e in zip(attention_backward_np(Q.numpy(), K.numpy(), V.numpy(), dO.numpy(), m), expected):
        np.testing.assert_allclose(g, e.numpy(), **TOL)
    _, P = scaled_dot_product_attention(Q, K, V, mask, return_weights=True)
    for g, e in zip(attention_backward(Q, K, V, dO, mask, weights=P), expected):  # P saved
        torch.testing.assert_close(g, e, **TOL)


def test_attention_backward_masked_keys_and_empty_rows_get_no_gradient():
    Q, K, V = _randn(4, 8, seed=1), _randn(6, 8, seed=2), _randn(6, 3, seed=3)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[:, 4:] = False  # keys 4, 5 hidden from every query
    mask[2] = False  # query 2 sees nothing
    dQ, dK, dV = attention_backward(Q, K, V, _randn(4, 3, seed=4), mask)
    assert torch.isfinite(dQ).all() and torch.isfinite(dK).all() and torch.isfinite(dV).all()
    assert torch.equal(dK[4:], torch.zeros(2, 8, dtype=F64))
    assert torch.equal(dV[4:], torch.zeros(2, 3, dtype=F64))
    assert torch.equal(dQ[2], torch.zeros(8, dtype=F64))
    assert dK[:4].abs().min() > 0 and dQ[[0, 1, 3]].abs().min() > 0


class _AttentionByHand(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Q, K, V):
        ctx.save_for_backward(Q, K, V)
        return scaled_dot_product_attention(Q, K, V, causal_mask(Q.shape[-2], K.shape[-2]))

    @staticmethod
    def backward(ctx, dO):
        Q, K, V = ctx.saved_tensors
        return attention_backward(Q, K, V, dO, causal_mask(Q.shape[-2], K.shape[-2]))


def test_attention_backward_passes_gradcheck_and_gradgradcheck():
    Q, K, V = (_randn(2, n, 4, seed=s).requires_grad_(True) for s, n in ((0, 3), (1, 5), (2, 5)))
    assert torch.autograd.gradcheck(_AttentionByHand.apply, (Q, K, V))
    assert torch.autograd.gradgradcheck(_AttentionByHand.apply, (Q, K, V))


def test_attention_backward_names_bad_shapes():
    Q, K, V = torch.zeros(2, 5, 8), torch.zeros(2, 7, 8), torch.zeros(2, 7, 4)
    with pytest.raises(ValueError, match=r"dO has shape \(2, 5, 3\).*\(2, 5, 4\)"):
        attention_backward(Q, K, V, torch.zeros(2, 5, 3))
    with pytest.raises(ValueError, match=r"weights of shape \(2, 7, 5\).*\(2, 5, 7\)"):
        attention_backward(Q, K, V, torch.zeros(2, 5, 4), weights=torch.zeros(2, 7, 5))


def test_attention_backward_float32_inputs_float32_gradients():
    Q, K, V = (t.float() for t in (_randn(3, 4, seed=1), _randn(5, 4, seed=2), _randn(5, 2, seed=3)))
    dO = torch.ones(3, 2)
    got = attention_backward(Q, K, V, dO)
    expected = _autograd(lambda q, k, v: scaled_dot_product_attention(q, k, v), [Q, K, V], dO)
    for g, e in zip(got, expected):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- norms

def test_layer_norm_backward_golden():
    # x = [1, 0, -1], eps = 0: mu = 0, var = 2/3, r = sqrt(3/2), xhat = r [1, 0, -1];
    # dy = [1, 0, 0]: mean(dxhat) = 1/3, mean(dxhat * xhat) = r/3, so
    # dx = r ([1, 0, 0] - 1/3 - xhat r/3) = r [1 - 1/3 - 1/2, -1/3, -1/3 + 1/2] = r [1/6, -1/3, 1/6]
    r = math.sqrt(1.5)
    dx, dgamma, dbeta = layer_norm_backward_np([1.0, 0.0, -1.0], None, [1.0, 0.0, 0.0], eps=0.0)
    np.testing.assert_allclose(dx, [r / 6, -r / 3, r / 6], **TOL)
    np.testing.assert_allclose(dgamma, [r, 0.0, 0.0], **TOL)  # dy * xhat
    np.testing.assert_allclose(dbeta, [1.0, 0.0, 0.0], **TOL)


def test_rms_norm_backward_golden():
    # x = [3, 4], eps = 0: mean(x^2) = 12.5, r = 1/sqrt(12.5), xhat = [0.6, 0.8] sqrt(2);
    # dy = [1, 0]: mean(dxhat * xhat) = 0.3 sqrt(2), dx = r ([1, 0] - xhat 0.3 sqrt(2))
    # = r [1 - 0.36, -0.48] = r [0.64, -0.48], orthogonal to x (3 * 0.64 = 4 * 0.48)
    r = 1 / math.sqrt(12.5)
    dx, dgamma = rms_norm_backward_np([3.0, 4.0], None, [1.0, 0.0], eps=0.0)
    np.testing.assert_allclose(dx, [0.64 * r, -0.48 * r], **TOL)
    np.testing.assert_allclose(dgamma, [0.6 * math.sqrt(2), 0.0], **TOL)


@pytest.mark.parametrize("shape", [(7,), (3, 16), (2, 4, 9)])
def test_layer_norm_backward_equals_autograd(shape):
    x, dy = _randn(*shape, seed=1, scale=3.0) + 1.5, _randn(*shape, seed=2)
    gamma, beta = _randn(shape[-1], seed=3) + 1, _randn(shape[-1], seed=4)
    expected = _autograd(lambda x_, g_, b_: layer_norm(x_, g_, b_, 1e-5), [x, gamma, beta], dy)
    by_torch = _autograd(lambda x_, g_, b_: F.layer_norm(x_, shape[-1:], g_, b_, 1e-5),
                         [x, gamma, beta], dy)
    got = layer_norm_backward(x, gamma, dy, eps=1e-5)
    got_np = layer_norm_backward_np(x.numpy(), gamma.numpy(), dy.numpy(), eps=1e-5)
    for g, g_np, e, t in zip(got, got_np, expected, by_torch):
        torch.testing.assert_close(g, e, **TOL)
        torch.testing.assert_close(g, t, **TOL)
        np.testing.assert_allclose(g_np, e.numpy(), **TOL)


@pytest.mark.parametrize("shape", [(7,), (3, 16), (2, 4, 9)])
def test_rms_norm_backward_equals_autograd(shape):
    x, dy = _randn(*shape, seed=1, scale=3.0) + 1.5, _randn(*shape, seed=2)
    gamma = _randn(shape[-1], seed=3) + 1
    expected = _autograd(lambda x_, g_: rms_norm(x_, g_, 1e-6), [x, gamma], dy)
    by_torch = _autograd(lambda x_, g_: F.rms_norm(x_, shape[-1:], g_, 1e-6), [x, gamma], dy)
    got = rms_norm_backward(x, gamma, dy, eps=1e-6)
    got_np = rms_norm_backward_np(x.numpy(), gamma.numpy(), dy.numpy(), eps=1e-6)
    for g, g_np, e, t in zip(got, got_np, expected, by_torch):
        torch.testing.assert_close(g, e, **TOL)
        torch.testing.assert_close(g, t, **TOL)
        np.testing.assert_allclose(g_np, e.numpy(), **TOL)


def test_layer_norm_input_gradient_has_no_component_along_one_or_xhat():
    # dx = r (I - 1 1^T/d - xhat xhat^T/d) dxhat: <dx, 1> = 0 exactly, and
    # <dx, xhat> = r <dxhat, xhat> (1 - |xhat|^2/d) = r <dxhat, xhat> eps / (var + eps)
    x, dy, eps = _randn(32, seed=5, scale=0.1).numpy() + 3, _randn(32, seed=6).numpy(), 1e-2
    dx, _, _ = layer_norm_backward_np(x, None, dy, eps=eps)
    var = x.var()
    xhat = (x - x.mean()) / math.sqrt(var + eps)
    assert abs(dx.sum()) < 1e-12
    predicted = (dy @ xhat) / math.sqrt(var + eps) * eps / (var + eps)
    assert abs(dx @ xhat - predicted) < 1e-12 and abs(predicted) > 1e-3


class _LayerNormByHand(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gamma, beta):
        ctx.save_for_backward(x, gamma)
        return layer_norm(x, gamma, beta, 1e-5)

    @staticmethod
    def backward(ctx, dy):
        x, gamma = ctx.saved_tensors
        return layer_norm_backward(x, gamma, dy, 1e-5)


class _RMSNormByHand(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gamma):
        ctx.save_for_backward(x, gamma)
        return rms_norm(x, gamma, 1e-6)

    @staticmethod
    def backward(ctx, dy):
        x, gamma = ctx.saved_tensors
        return rms_norm_backward(x, gamma, dy, 1e-6)


def test_norm_backwards_pass_gradcheck_and_gradgradcheck():
    x = (_randn(3, 6, seed=7) * 2 + 1).requires_grad_(True)
    gamma, beta = (_randn(6, seed=s).requires_grad_(True) for s in (8, 9))
    for fn, args in ((_LayerNormByHand.apply, (x, gamma, beta)), (_RMSNormByHand.apply, (x, gamma))):
        assert torch.autograd.gradcheck(fn, args)
        assert torch.autograd.gradgradcheck(fn, args)


def test_norm_backwards_name_bad_shapes():
    with pytest.raises(ValueError, match=r"x \(2, 4\) and dy \(2, 3\)"):
        layer_norm_backward(torch.zeros(2, 4), None, torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"gamma has shape \(3,\).*expected \(4,\)"):
        rms_norm_backward_np(np.zeros((2, 4)), np.ones(3), np.zeros((2, 4)))
