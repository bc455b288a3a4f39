"""FlashAttention with its own backward: outputs and gradients equal ordinary attention's
(autograd of scaled_dot_product_attention) to 1e-10 in float64, with bottom-right causal masks
for L != S, fully masked rows and grouped-query heads; gradcheck and gradgradcheck; the float64
NumPy twins; a golden case; and what the forward keeps for the backward (saved-tensors hooks)."""

import math

import numpy as np
import pytest
import torch

from txlearn.attention import attention_backward_np, attention_np, scaled_dot_product_attention
from txlearn.flash_attention import (FlashAttentionFunction, flash_attention,
                                     flash_attention_backward_np, flash_attention_forward_np)
from txlearn.heads import repeat_kv
from txlearn.masks import causal_mask

F64 = torch.float64
TOL = dict(rtol=0, atol=1e-10)


def _randn(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64) * scale


def _cases():
    blind = causal_mask(5, 9).clone()
    blind[2] = False  # query 2 sees no key
    return {
        "no mask, L != S, blocks of 4 (S = 11)": dict(Q=(2, 3, 6, 8), K=(2, 3, 11, 8),
                                                       V=(2, 3, 11, 5), mask=None, causal=False, b=4),
        "causal=True, L = 5 < S = 9, blocks of 2": dict(Q=(2, 5, 8), K=(2, 9, 8), V=(2, 9, 4),
                                                        mask=None, causal=True, b=2),
        "mask=causal_mask(5, 9), blocks of 3": dict(Q=(2, 5, 8), K=(2, 9, 8), V=(2, 9, 4),
                                                    mask=causal_mask(5, 9), causal=False, b=3),
        "a fully masked row, blocks of 4": dict(Q=(2, 5, 8), K=(2, 9, 8), V=(2, 9, 4),
                                                mask=blind, causal=False, b=4),
        "GQA: 4 query heads on 2 kv heads, causal": dict(Q=(2, 4, 7, 8), K=(2, 2, 7, 8),
                                                          V=(2, 2, 7, 6), mask=None, causal=True, b=3),
        "one block holding every key": dict(Q=(1, 4, 8), K=(1, 6, 8), V=(1, 6, 2), mask=None,
                                            causal=False, b=64),
    }


def _reference(Q, K, V, mask, causal):
    n_rep = Q.shape[-3] // K.shape[-3] if Q.ndim >= 3 and Q.shape[-3] != K.shape[-3] else 1
    if n_rep > 1:
        K, V = repeat_kv(K, n_rep), repeat_kv(V, n_rep)
    if causal:
        rule = causal_mask(Q.shape[-2], K.shape[-2])
        mask = rule if mask is None else mask & rule
    return scaled_dot_product_attention(Q, K, V, mask)


@pytest.mark.parametrize("name", list(_cases()))
def test_flash_attention_output_and_gradients_equal_ordinary_attention(name):
    c = _cases()[name]
    Q, K, V = (_randn(*c[k], seed=i, scale=2.0).requires_grad_(True) for i, k in enumerate("QKV"))
    dO = _randn(*c["Q"][:-1], c["V"][-1], seed=7)
    out = flash_attention(Q, K, V, c["mask"], block_size=c["b"], causal=c["causal"])
    got = torch.autograd.grad(out, (Q, K, V), dO)
    ref = _reference(Q, K, V, c["mask"], c["causal"])
    expected = torch.autograd.grad(ref, (Q, K, V), dO)
    torch.testing.assert_close(out, ref, **TOL)
    for g, e, what in zip(got, expected, ("dQ", "dK", "dV")):
        assert g.shape == e.shape, what
        torch.testing.assert_close(g, e, **TOL, msg=f"{name}: {what}")
    # the float64 NumPy twins
    m = None if c["mask"] is None else c["mask"].numpy()
    args = [t.detach().numpy() for t in (Q, K, V)]
    O_np, lse_np = flash_attention_forward_np(*args, m, block_size=c["b"], causal=c["causal"])
    np.testing.assert_allclose(O_np, ref.detach().numpy(), **TOL)
    grads_np = flash_attention_backward_np(*args, O_np, lse_np, dO.numpy(), m, block_size=c["b"],
                                           causal=c["causal"])
    for g, e in zip(grads_np, expected):
        np.testing.assert_allclose(g, e.numpy(), **TOL)


def test_flash_attention_golden_and_its_log_sum_exp():
    # one query, keys [0], [ln 3], [5] with the third hidden, d_k = 1: scores [0, ln 3] ->
    # P = [1/4, 3/4], lse = log(1 + 3) = ln 4; V = [1, 0] -> O = 1/4; dO = 1 gives lesson 02's
    # golden gradients: dQ = -3 ln 3 / 16, dK = [3/16, -3/16, 0], dV = [1/4, 3/4, 0]
    Q = torch.tensor([[1.0]], dtype=F64, requires_grad=True)
    K = torch.tensor([[0.0], [math.log(3.0)], [5.0]], dtype=F64, requires_grad=True)
    V = torch.tensor([[1.0], [0.0], [7.0]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[True, True, False]])
    O, lse = FlashAttentionFunction.apply(Q, K, V, mask, 2, False)
    torch.testing.assert_close(O, torch.tensor([[0.25]], dtype=F64), **TOL)
    torch.testing.assert_close(lse, torch.tensor([math.log(4.0)], dtype=F64), **TOL)
    dQ, dK, dV = torch.autograd.grad(O, (Q, K, V), torch.ones(1, 1, dtype=F64))
    torch.testing.assert_close(dQ, torch.tensor([[-3 * math.log(3.0) / 16]], dtype=F64), **TOL)
    torch.testing.assert_close(dK, torch.tensor([[3 / 16], [-3 / 16], [0.0]], dtype=F64), **TOL)
    torch.testing.assert_close(dV, torch.tensor([[0.25], [0.75], [0.0]], dtype=F64), **TOL)


def test_empty_rows_give_zero_output_minus_inf_lse_and_zero_gradients():
    Q, K, V = (_randn(3, 4, seed=1).requires_grad_(True), _randn(6, 4, seed=2).requires_grad_(True),
               _randn(6, 2, seed=3).requires_grad_(True))
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1] = False
    O, lse = FlashAttentionFunction.apply(Q, K, V, mask, 4, False)
    assert torch.equal(O[1], torch.zeros(2, dtype=F64)) and torch.isneginf(lse[1])
    (O.sum() + lse[[0, 2]].sum()).backward()
    assert torch.isfinite(Q.grad).all() and torch.equal(Q.grad[1], torch.zeros(4, dtype=F64))
    assert torch.isfinite(K.grad).all() and torch.isfinite(V.grad).all()


def test_the_log_sum_exp_output_has_its_own_gradient():
    # d lse_i / d s_ij = P_ij: a loss on lse alone equals autograd through logsumexp
    Q, K, V = (_randn(2, 5, 4, seed=s).requires_grad_(True) for s in (1, 2, 3))
    _, lse = FlashAttentionFunction.apply(Q, K, V, None, 2, True)
    w = _randn(2, 5, seed=4)
    got = torch.autograd.grad((lse * w).sum(), (Q, K))
    scores = (Q @ K.transpose(-1, -2) / 2.0).masked_fill(~causal_mask(5), -math.inf)
    expected = torch.autograd.grad((torch.logsumexp(scores, -1) * w).sum(), (Q, K))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, **TOL)


def test_flash_attention_passes_gradcheck_and_gradgradcheck():
    Q = _randn(1, 4, 3, 4, seed=1).requires_grad_(True)
    K, V = (_randn(1, 2, 5, 4, seed=s).requires_grad_(True) for s in (2, 3))

    def fn(q, k, v):
        return FlashAttentionFunction.apply(q, k, v, None, 2, True)

    assert torch.autograd.gradcheck(fn, (Q, K, V))
    assert torch.autograd.gradgradcheck(fn, (Q, K, V))


def test_the_forward_keeps_only_inputs_output_and_one_number_per_row():
    # what autograd holds between the passes: Q, K, V, O and lse, never an (L, S) block
    T, d = 256, 16
    Q, K, V = (torch.randn(1, T, d, requires_grad=True) for _ in range(3))
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        flash_attention(Q, K, V, block_size=32, causal=True)
    assert sum(storages.values()) == 4 * (4 * T * d + T)  # Q, K, V, O (T d each) and lse (T)


def test_float32_and_bfloat16_compute_in_float32():
    Q, K, V = (_randn(2, 6, 8, seed=s).float().requires_grad_(True) for s in (1, 2, 3))
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        q, k, v = (t.detach().to(dtype).requires_grad_(True) for t in (Q, K, V))
        out = flash_attention(q, k, v, block_size=4, causal=True)
        assert out.dtype == dtype
        out.float().sum().backward()
        assert q.grad.dtype == dtype
        ref = _reference(*(t.detach().double() for t in (q, k, v)), None, True)
        torch.testing.assert_close(out.double(), ref, rtol=0, atol=tol)


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match=r"Q \(2, 3, 5, 8\) and K \(2, 2, 5, 8\)"):
        flash_attention(torch.zeros(2, 3, 5, 8), torch.zeros(2, 2, 5, 8), torch.zeros(2, 2, 5, 8))
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        flash_attention(torch.zeros(5, 8), torch.zeros(5, 8), torch.zeros(5, 8), block_size=0)
    with pytest.raises(ValueError, match="boolean"):
        flash_attention(torch.zeros(5, 8), torch.zeros(5, 8), torch.zeros(5, 8),
                        mask=torch.zeros(5, 5))
