"""Tests of txlearn.flash_attention: the online-softmax update against softmax over all blocks,
tiled attention against ordinary attention (float64 NumPy and F.scaled_dot_product_attention),
and its peak memory growing linearly in T."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from txlearn import flash_attention, measuring


def attention_ref_np(Q, K, V, mask=None):
    """Independent float64 reference: softmax(Q K^T / sqrt(d_k)) V, masked rows -> 0."""
    s = Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    total = e.sum(axis=-1, keepdims=True)
    w = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)
    return w @ V


# ---- online softmax and tiled attention --------------------------------------------------------

def test_online_update_two_blocks_equals_softmax_over_both():
    rng = np.random.default_rng(0)
    s1, s2 = rng.normal(size=(4, 3)) * 5, rng.normal(size=(4, 5)) * 5 + 3
    V1, V2 = rng.normal(size=(3, 2)), rng.normal(size=(5, 2))
    m, l, acc = np.full(4, -np.inf), np.zeros(4), np.zeros((4, 2))
    m, l, acc = flash_attention.online_softmax_update_np(m, l, acc, s1, V1)
    m, l, acc = flash_attention.online_softmax_update_np(m, l, acc, s2, V2)
    s = np.concatenate([s1, s2], axis=1)
    w = np.exp(s - s.max(axis=1, keepdims=True))
    np.testing.assert_allclose(m, s.max(axis=1), rtol=0, atol=0)
    np.testing.assert_allclose(l, w.sum(axis=1), rtol=1e-13)
    np.testing.assert_allclose(acc / l[:, None], (w / w.sum(1, keepdims=True)) @ np.vstack([V1, V2]),
                               rtol=1e-12, atol=1e-13)
    mt, lt, acct = flash_attention.online_softmax_update(torch.tensor(m), torch.tensor(l), torch.tensor(acc),
                                            torch.tensor(s1), torch.tensor(V1))
    m2, l2, acc2 = flash_attention.online_softmax_update_np(m, l, acc, s1, V1)
    np.testing.assert_allclose(acct.numpy(), acc2, rtol=1e-13)
    np.testing.assert_allclose(lt.numpy(), l2, rtol=1e-13)


def test_online_update_golden_values():
    m, l, acc = flash_attention.online_softmax_update_np(np.array([1.0]), np.array([2.0]), np.array([[4.0]]),
                                            np.array([[3.0, -np.inf]]), np.array([[10.0], [99.0]]))
    a = math.exp(-2.0)
    assert m[0] == 3.0
    assert l[0] == pytest.approx(2 * a + 1, rel=1e-15)
    assert acc[0, 0] == pytest.approx(4 * a + 10, rel=1e-15)


@pytest.mark.parametrize("block_size", [1, 4, 7, 16, 64])
@pytest.mark.parametrize("masking", ["none", "causal", "padding"])
def test_tiled_attention_equals_ordinary(block_size, masking):
    rng = np.random.default_rng(block_size)
    B, h, T, d_k = 2, 3, 16, 8
    Q, K, V = (rng.normal(size=(B, h, T, d_k)) for _ in range(3))
    mask = None
    if masking == "causal":
        mask = np.tril(np.ones((T, T), dtype=bool))
    elif masking == "padding":
        mask = (np.arange(T) < np.array([T, 11])[:, None])[:, None, None, :]  # (B, 1, 1, T)
    expected = attention_ref_np(Q, K, V, mask)
    np.testing.assert_allclose(flash_attention.tiled_attention_np(Q, K, V, mask, block_size), expected,
                               rtol=1e-10, atol=1e-12)
    t = [torch.tensor(a) for a in (Q, K, V)]
    tmask = None if mask is None else torch.tensor(mask)
    got = flash_attention.tiled_attention(*t, tmask, block_size)
    torch.testing.assert_close(got, torch.tensor(expected), rtol=1e-10, atol=1e-12)
    sdpa = F.scaled_dot_product_attention(*t, attn_mask=tmask)
    torch.testing.assert_close(got, sdpa, rtol=1e-10, atol=1e-12)


def test_tiled_attention_float32_and_rectangular():
    torch.manual_seed(0)
    Q, K, V = torch.randn(2, 5, 8), torch.randn(2, 37, 8), torch.randn(2, 37, 4)
    mask = torch.rand(5, 37) > 0.3
    torch.testing.assert_close(flash_attention.tiled_attention(Q, K, V, mask, block_size=10),
                               F.scaled_dot_product_attention(Q, K, V, attn_mask=mask),
                               rtol=1e-5, atol=1e-6)


def test_tiled_attention_fully_masked_row_is_zero():
    rng = np.random.default_rng(1)
    Q, K, V = rng.normal(size=(4, 4)), rng.normal(size=(6, 4)), rng.normal(size=(6, 3)) + 5
    mask = np.ones((4, 6), dtype=bool)
    mask[2] = False
    out = flash_attention.tiled_attention_np(Q, K, V, mask, block_size=4)
    assert np.all(out[2] == 0.0) and np.all(np.isfinite(out))
    out_t = flash_attention.tiled_attention(*(torch.tensor(a) for a in (Q, K, V)), torch.tensor(mask), 4)
    assert torch.all(out_t[2] == 0.0) and torch.isfinite(out_t).all()
    np.testing.assert_allclose(out, attention_ref_np(Q, K, V, mask), rtol=1e-12, atol=1e-12)


def test_tiled_attention_errors():
    with pytest.raises(ValueError, match=r"Q \(3, 4\), K \(5, 2\)"):
        flash_attention.tiled_attention_np(np.zeros((3, 4)), np.zeros((5, 2)), np.zeros((5, 2)))
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        flash_attention.tiled_attention(torch.zeros(3, 4), torch.zeros(5, 4), torch.zeros(5, 2), block_size=0)


def test_tiled_attention_memory_linear_in_T():
    def make(T, tiled):
        Q = torch.randn(T, 32)
        if tiled:
            return lambda: flash_attention.tiled_attention(Q, Q, Q, block_size=128)
        return lambda: torch.softmax(Q @ Q.T / math.sqrt(32), dim=-1) @ Q
    Ts = [512, 1024, 2048]
    tiled = measuring.measure(lambda T: make(T, True), Ts, what="memory")
    full = measuring.measure(lambda T: make(T, False), Ts, what="memory")
    assert 0.9 < measuring.fit_loglog_slope(Ts, tiled) < 1.1
    assert 1.8 < measuring.fit_loglog_slope(Ts, full) < 2.05
    assert tiled[-1] < full[-1] / 5
