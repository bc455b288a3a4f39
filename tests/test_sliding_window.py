"""Sliding-window attention (lesson 08): the mask, and the banded computation equal to the
masked full matrix, against a NumPy float64 reference and PyTorch's SDPA."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from txlearn.attention import attention_np, scaled_dot_product_attention
from txlearn.masks import causal_mask, sliding_window_mask, sliding_window_mask_np
from txlearn.sliding_window import sliding_window_attention


def test_sliding_window_mask_golden_5_by_5_window_2():
    # every position sees itself and the one before: a band of width 2 on and under the diagonal
    expected = torch.tensor([[1, 0, 0, 0, 0],
                             [1, 1, 0, 0, 0],
                             [0, 1, 1, 0, 0],
                             [0, 0, 1, 1, 0],
                             [0, 0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(sliding_window_mask(5, window=2), expected)


def test_sliding_window_mask_of_the_last_queries_is_bottom_right_aligned():
    # the last 2 of 6 positions (4 and 5) with window 3 see keys 2-4 and 3-5
    expected = torch.tensor([[0, 0, 1, 1, 1, 0],
                             [0, 0, 0, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(sliding_window_mask(2, 6, window=3), expected)


@pytest.mark.parametrize("L,S,w", [(1, 1, 1), (4, 4, 1), (7, 7, 3), (3, 8, 2), (6, 4, 2),
                                   (5, 9, 20)])
def test_sliding_window_mask_equals_a_loop_and_the_numpy_reference(L, S, w):
    loop = torch.tensor([[0 <= (S - L + i) - j < w for j in range(S)] for i in range(L)])
    assert torch.equal(sliding_window_mask(L, S, window=w), loop)
    assert np.array_equal(sliding_window_mask_np(L, S, window=w), loop.numpy())


def test_a_window_as_long_as_the_sequence_is_the_causal_mask():
    assert torch.equal(sliding_window_mask(6, 9, window=9), causal_mask(6, 9))
    assert int(sliding_window_mask(100, window=8).sum(-1).max()) == 8   # at most w keys a row


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_sliding_window_mask_rejects_a_bad_window(bad):
    with pytest.raises(ValueError, match="window"):
        sliding_window_mask(4, window=bad)


@pytest.mark.parametrize("L,S,w,block", [(16, 16, 4, None), (37, 37, 5, 8), (10, 10, 1, 3),
                                         (12, 12, 40, None), (5, 13, 3, 2), (9, 4, 2, 4)])
def test_banded_attention_equals_the_masked_full_matrix_in_float64(L, S, w, block):
    g = torch.Generator().manual_seed(L * 100 + S)
    Q = torch.randn(2, 3, L, 8, dtype=torch.float64, generator=g)
    K = torch.randn(2, 3, S, 8, dtype=torch.float64, generator=g)
    V = torch.randn(2, 3, S, 5, dtype=torch.float64, generator=g)
    got = sliding_window_attention(Q, K, V, window=w, block=block)
    mask = sliding_window_mask(L, S, window=w)
    full = scaled_dot_product_attention(Q, K, V, mask)
    torch.testing.assert_close(got, full, atol=1e-12, rtol=0)
    # independent oracle: the NumPy float64 reference, row by row of heads
    ref = np.stack([[attention_np(Q[b, h].numpy(), K[b, h].numpy(), V[b, h].numpy(),
                                  sliding_window_mask_np(L, S, window=w))
                     for h in range(3)] for b in range(2)])
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-12, rtol=0)


def test_banded_attention_equals_pytorch_sdpa_with_the_mask():
    Q, K, V = (torch.randn(1, 2, 50, 16) for _ in range(3))
    oracle = F.scaled_dot_product_attention(Q, K, V, attn_mask=sliding_window_mask(50, window=7))
    torch.testing.assert_close(sliding_window_attention(Q, K, V, window=7), oracle,
                               atol=1e-5, rtol=1e-5)


def test_banded_attention_has_gradients_equal_to_the_masked_ones():
    Q, K, V = (torch.randn(1, 20, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    dO = torch.randn(1, 20, 4, dtype=torch.float64)
    banded = torch.autograd.grad(sliding_window_attention(Q, K, V, window=3, block=6), (Q, K, V), dO)
    full = torch.autograd.grad(scaled_dot_product_attention(Q, K, V, sliding_window_mask(20, window=3)),
                               (Q, K, V), dO)
    for a, b in zip(banded, full):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_banded_attention_names_both_shapes_on_a_mismatch():
    with pytest.raises(ValueError, match=r"Q \(1, 4, 8\), K \(1, 4, 6\)"):
        sliding_window_attention(torch.zeros(1, 4, 8), torch.zeros(1, 4, 6), torch.zeros(1, 4, 6), 2)
    with pytest.raises(ValueError, match="block"):
        sliding_window_attention(torch.zeros(1, 4, 8), torch.zeros(1, 4, 8), torch.zeros(1, 4, 8), 2,
                                 block=0)
