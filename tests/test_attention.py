"""Scaled dot-product attention against F.scaled_dot_product_attention, float64 NumPy,
gradcheck, and the invariants (causality, permutation equivariance, padding invariance)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from txlearn.attention import (
    attention_np,
    masked_softmax,
    masked_softmax_np,
    scaled_dot_product_attention,
)
from txlearn.masks import causal_mask, key_padding_to_attn_mask, padding_mask


def _qkv(seed, batch=(2, 3), L=5, S=7, d_k=8, d_v=6, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    Q = torch.randn(*batch, L, d_k, generator=g, dtype=dtype)
    K = torch.randn(*batch, S, d_k, generator=g, dtype=dtype)
    V = torch.randn(*batch, S, d_v, generator=g, dtype=dtype)
    return Q, K, V


def test_scale_is_sqrt_d_k_golden():
    # raw scores [4, 0] with d_k = 4 -> softmax([2, 0]) = [0.880797, 0.119203]
    Q = torch.ones(1, 4)
    K = torch.tensor([[1.0, 1, 1, 1], [0, 0, 0, 0]])
    V = torch.eye(2)
    out, w = scaled_dot_product_attention(Q, K, V, return_weights=True)
    torch.testing.assert_close(w, torch.tensor([[0.880797, 0.119203]]), rtol=0, atol=1e-6)
    torch.testing.assert_close(out, w, rtol=0, atol=0)  # V = I reads the weights out


def test_masked_key_gets_zero_weight_golden():
    # scores [0, 0, 0], key 2 masked -> [0.5, 0.5, 0] (adding a 0/1 keep-mask would give
    # [0.422319, 0.422319, 0.155362])
    w = masked_softmax(torch.zeros(1, 3), torch.tensor([[True, True, False]]))
    torch.testing.assert_close(w, torch.tensor([[0.5, 0.5, 0.0]]), rtol=0, atol=1e-7)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("L,S", [(5, 7), (4, 4), (1, 9)])
def test_matches_torch_sdpa_with_bool_mask(seed, L, S):
    Q, K, V = _qkv(seed, L=L, S=S)
    g = torch.Generator().manual_seed(100 + seed)
    mask = torch.rand(2, 1, L, S, generator=g) > 0.3
    mask[..., 0] = True  # every row keeps one key: SDPA itself gives NaN on fully masked rows
    ours = scaled_dot_product_attention(Q, K, V, mask)
    ref = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("T", [1, 4, 9])
def test_causal_matches_sdpa_is_causal_when_square(T):
    Q, K, V = _qkv(7, L=T, S=T, dtype=torch.float32)
    ours = scaled_dot_product_attention(Q, K, V, causal_mask(T))
    ref = F.scaled_dot_product_attention(Q, K, V, is_causal=True)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_float64_numpy_reference(seed):
    Q, K, V = _qkv(seed, dtype=torch.float32)
    mask = causal_mask(5, 7)
    out, w = scaled_dot_product_attention(Q, K, V, mask, return_weights=True)
    out_np, w_np = attention_np(Q.numpy(), K.numpy(), V.numpy(), mask.numpy(),
                                return_weights=True)
    assert out_np.dtype == np.float64
    np.testing.assert_allclose(out.numpy(), out_np, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w.numpy(), w_np, rtol=1e-5, atol=1e-6)


def test_weights_rows_sum_to_one():
    Q, K, V = _qkv(3)
    _, w = scaled_dot_product_attention(Q, K, V, causal_mask(5, 7), return_weights=True)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5, dtype=torch.float64),
                               rtol=0, atol=1e-12)
    assert (w >= 0).all()


def test_fully_masked_row_gives_zero_and_finite_gradients():
    Q, K, V = _qkv(4, batch=(1,), L=3, S=4)
    Q, K, V = (t.requires_grad_() for t in (Q, K, V))
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1] = False  # query 1 sees nothing
    out, w = scaled_dot_product_attention(Q, K, V, mask, return_weights=True)
    torch.testing.assert_close(out[0, 1], torch.zeros(6, dtype=torch.float64), rtol=0, atol=0)
    torch.testing.assert_close(w[0, 1], torch.zeros(4, dtype=torch.float64), rtol=0, atol=0)
    (out ** 2).sum().backward()
    for t in (Q, K, V):
        assert torch.isfinite(t.grad).all()
    torch.testing.assert_close(Q.grad[0, 1], torch.zeros(8, dtype=torch.float64), rtol=0, atol=0)
    # the NumPy reference agrees, and the other rows are untouched by the empty one
    np.testing.assert_allclose(out.detach().numpy(),
                               attention_np(Q.detach().numpy(), K.detach().numpy(),
                                            V.detach().numpy(), mask.numpy()), atol=1e-12)


def test_gradcheck_float64_with_mask():
    Q, K, V = _qkv(5, batch=(2,), L=3, S=4, d_k=3, d_v=2)
    Q, K, V = (t.requires_grad_() for t in (Q, K, V))
    mask = causal_mask(3, 4).clone()
    mask[0] = False  # include a fully masked row
    assert torch.autograd.gradcheck(
        lambda q, k, v: scaled_dot_product_attention(q, k, v, mask), (Q, K, V),
        eps=1e-6, atol=1e-7)


def test_causality_future_tokens_change_nothing_bit_for_bit():
    Q, K, V = _qkv(6, batch=(1,), L=6, S=6, dtype=torch.float32)
    t = 2
    Q2, K2, V2 = Q.clone(), K.clone(), V.clone()
    for x in (Q2, K2, V2):
        x[:, t + 1:] = torch.randn_like(x[:, t + 1:]) * 10
    mask = causal_mask(6)
    a = scaled_dot_product_attention(Q, K, V, mask)
    b = scaled_dot_product_attention(Q2, K2, V2, mask)
    assert torch.equal(a[:, : t + 1], b[:, : t + 1])
    assert not torch.allclose(a[:, t + 1:], b[:, t + 1:])


def test_permutation_equivariance_without_mask():
    Q, K, V = _qkv(8, batch=(1,), L=6, S=6)
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(0))
    out = scaled_dot_product_attention(Q, K, V)
    # permuting the queries permutes the outputs ...
    torch.testing.assert_close(scaled_dot_product_attention(Q[:, perm], K, V), out[:, perm],
                               rtol=1e-12, atol=1e-12)
    # ... and permuting keys with their values changes nothing
    torch.testing.assert_close(scaled_dot_product_attention(Q, K[:, perm], V[:, perm]), out,
                               rtol=1e-12, atol=1e-12)


def test_padding_invariance_extra_masked_keys_change_nothing():
    Q, K, V = _qkv(9, batch=(1,), L=4, S=5)
    short = scaled_dot_product_attention(Q, K, V)
    K_pad = torch.cat([K, 1e3 * torch.randn(1, 3, 8, dtype=torch.float64)], dim=1)  # (1, 8, 8)
    V_pad = torch.cat([V, 1e3 * torch.randn(1, 3, 6, dtype=torch.float64)], dim=1)
    mask = key_padding_to_attn_mask(padding_mask([5], 8))[:, 0]  # (1, 1, 8)
    padded = scaled_dot_product_attention(Q, K_pad, V_pad, mask)
    torch.testing.assert_close(padded, short, rtol=1e-12, atol=1e-12)


def test_masked_softmax_numpy_matches_torch():
    rng = np.random.default_rng(0)
    s = rng.normal(size=(3, 4, 5)) * 5
    m = rng.random((3, 4, 5)) > 0.4
    m[0, 0] = False
    np.testing.assert_allclose(masked_softmax(torch.from_numpy(s), torch.from_numpy(m)).numpy(),
                               masked_softmax_np(s, m), rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(masked_softmax_np(s, m)[0, 0], np.zeros(5))


def test_large_scores_do_not_overflow():
    w = masked_softmax(torch.tensor([[1000.0, 1001.0, 1002.0]]))
    torch.testing.assert_close(w, torch.tensor([[0.090031, 0.244728, 0.665241]]),
                               rtol=0, atol=1e-6)


def test_errors_name_the_shapes():
    Q, K, V = _qkv(0, batch=(2,), L=3, S=4, d_k=8)
    with pytest.raises(ValueError, match=r"\(2, 3, 8\).*\(2, 4, 5\)"):
        scaled_dot_product_attention(Q, K[..., :5], V)
    with pytest.raises(ValueError, match=r"K \(2, 4, 8\), V \(2, 3, 6\)"):
        scaled_dot_product_attention(Q, K, V[:, :3])
    with pytest.raises(ValueError, match=r"\(3, 5\).*\(2, 3, 4\)"):
        scaled_dot_product_attention(Q, K, V, torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="boolean"):
        scaled_dot_product_attention(Q, K, V, torch.zeros(3, 4))
    with pytest.raises(ValueError, match=r"d_k of Q and K differ"):
        attention_np(Q.numpy(), K[..., :5].numpy(), V.numpy())
    with pytest.raises(ValueError, match="boolean"):
        attention_np(Q.numpy(), K.numpy(), V.numpy(), np.zeros((3, 4)))


def test_additive_float_mask_of_torch_equals_our_boolean_mask():
    from txlearn.masks import to_additive
    Q, K, V = _qkv(10, L=4, S=6)
    mask = causal_mask(4, 6)
    ref = F.scaled_dot_product_attention(Q, K, V, attn_mask=to_additive(mask, torch.float64))
    torch.testing.assert_close(scaled_dot_product_attention(Q, K, V, mask), ref,
                               rtol=1e-10, atol=1e-12)


def test_masked_softmax_in_bfloat16_stays_finite():
    s = torch.randn(3, 5).to(torch.bfloat16) * 50
    m = torch.ones(3, 5, dtype=torch.bool)
    m[2] = False
    w = masked_softmax(s, m)
    assert w.dtype == torch.bfloat16 and torch.isfinite(w).all()
    torch.testing.assert_close(w[:2].float().sum(-1), torch.ones(2), rtol=0, atol=1e-2)
    assert (w[2] == 0).all()
