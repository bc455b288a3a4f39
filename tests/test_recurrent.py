"""Tests of txlearn.recurrent: the Elman RNN against nn.RNN, and the measured path length (an
RNN's grows with the distance, attention's is constant)."""

import numpy as np
import pytest
import torch
from torch import nn

from txlearn import recurrent


# ---- recurrent layer -------------------------------------------------------------------------

def test_recurrent_layer_equals_nn_rnn():
    torch.manual_seed(0)
    rnn = nn.RNN(6, 10, batch_first=True).double()
    x = torch.randn(3, 9, 6, dtype=torch.float64)
    expected, _ = rnn(x)
    got = recurrent.recurrent_layer(x, rnn.weight_ih_l0.T, rnn.weight_hh_l0.T, rnn.bias_ih_l0 + rnn.bias_hh_l0)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_recurrent_layer_shape_error():
    with pytest.raises(ValueError, match=r"\(2, 5, 4\).*\(3, 8\)"):
        recurrent.recurrent_layer(torch.randn(2, 5, 4), torch.randn(3, 8), torch.randn(8, 8), torch.zeros(8))


# ---- path length ------------------------------------------------------------------------------

@pytest.mark.parametrize("T", [2, 5, 40])
def test_matmul_path_length_rnn_grows_attention_constant(T):
    torch.manual_seed(0)
    d = 4
    x = torch.randn(1, T, d, requires_grad=True)
    W_x, W_h, b = torch.randn(d, d), torch.randn(d, d), torch.zeros(d)
    h = recurrent.recurrent_layer(x, W_x, W_h, b)
    assert recurrent.matmul_path_length(h[:, -1], x) == T  # x W_x, then T - 1 steps of h W_h
    Q, K, V = x @ W_x, x @ W_h, x @ W_x  # (1, T, d)
    out = torch.softmax(Q @ K.transpose(-1, -2), dim=-1) @ V
    assert recurrent.matmul_path_length(out[:, -1], x) == 3  # projection, scores, weighted sum


def test_matmul_path_length_errors():
    x = torch.randn(3, requires_grad=True)
    y = torch.randn(3, requires_grad=True)
    with pytest.raises(ValueError, match="does not depend"):
        recurrent.matmul_path_length((y * 2).sum(), x)
    with pytest.raises(ValueError, match="leaf"):
        recurrent.matmul_path_length((x * 2).sum(), x * 2)


def test_sequential_depth_of_a_chain_counts_each_operation_once():
    from txlearn.recurrent import sequential_depth
    x = torch.randn(3, requires_grad=True)
    y = x
    for _ in range(5):
        y = torch.tanh(y)                       # 5 operations, one after the other
    assert sequential_depth(y, x) == 5
    wide = (x * 2) + (x * 3) + (x * 4)          # three products side by side, then two adds
    assert sequential_depth(wide, x) == 3       # mul, add, add
    with pytest.raises(ValueError, match="leaf"):
        sequential_depth(y, y)


def test_rnn_depth_grows_linearly_in_T_and_attention_depth_is_constant():
    from txlearn.attention import scaled_dot_product_attention
    from txlearn.recurrent import sequential_depth
    rnn, attn = [], []
    for T in (2, 4, 8, 16):
        x = torch.randn(1, T, 4, requires_grad=True)
        W = torch.randn(4, 4)
        rnn.append(sequential_depth(recurrent.recurrent_layer(x, W, W, torch.zeros(4))[:, -1], x))
        attn.append(sequential_depth(scaled_dot_product_attention(x @ W, x @ W, x @ W)[:, -1], x))
    steps = np.diff(rnn) / np.diff([2, 4, 8, 16])
    assert len(set(attn)) == 1                      # independent of T
    assert np.all(steps == steps[0]) and steps[0] >= 2   # the same few operations per step
