"""ffn: activations against torch.nn.functional, FeedForward against float64 NumPy and nn.Linear,
position-wise behaviour, parameter/FLOP counts (golden numbers for GPT-3 175B)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from txlearn.counting import (MODEL_SIZES, ffn_flop_share, ffn_param_share, layer_flops,
                              layer_param_counts)
from txlearn.ffn import (ACTIVATIONS, FeedForward, feed_forward_np, gelu, gelu_np, relu,
                         silu, silu_np, swiglu_d_ff)

X = torch.linspace(-6, 6, 241, dtype=torch.float64)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_torch(approximate):
    torch.testing.assert_close(gelu(X, approximate), F.gelu(X, approximate=approximate),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gelu_np(X.numpy(), approximate),
                               F.gelu(X, approximate=approximate).numpy(), rtol=1e-12, atol=1e-12)


def test_gelu_default_is_exact_and_differs_from_tanh():
    torch.testing.assert_close(gelu(X), F.gelu(X, approximate="none"), rtol=1e-12, atol=1e-12)
    gap = (gelu(X) - gelu(X, "tanh")).abs().max().item()
    assert 1e-4 < gap < 1e-3  # the tanh form is off by at most about 5e-4 on [-6, 6]
    assert gelu(torch.tensor(1.0, dtype=torch.float64)).item() == pytest.approx(0.841344746, abs=1e-9)


def test_silu_and_relu_match_torch():
    torch.testing.assert_close(silu(X), F.silu(X), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(silu_np(X.numpy()), F.silu(X).numpy(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(relu(X), F.relu(X), rtol=0, atol=0)


def test_gelu_bad_approximate_raises():
    with pytest.raises(ValueError, match="'fast'"):
        gelu(X, "fast")


def _numpy_weights(ffn):
    return {k: v.detach().numpy() for k, v in ffn.named_parameters()}


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("seed", [0, 1])
def test_feed_forward_matches_numpy(activation, seed):
    torch.manual_seed(seed)
    ffn = FeedForward(8, 24, activation).double()
    with torch.no_grad():
        for name, p in ffn.named_parameters():
            if name.startswith("b_"):
                p.normal_()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    np.testing.assert_allclose(ffn(x).detach().numpy(),
                               feed_forward_np(x.numpy(), activation=activation, **_numpy_weights(ffn)),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("activation,torch_act", [("relu", nn.ReLU()), ("gelu", nn.GELU()),
                                                  ("gelu_tanh", nn.GELU(approximate="tanh"))])
def test_feed_forward_matches_nn_linear(activation, torch_act):
    torch.manual_seed(3)
    ffn = FeedForward(16, 40, activation).double()
    lin1, lin2 = nn.Linear(16, 40).double(), nn.Linear(40, 16).double()
    with torch.no_grad():  # nn.Linear stores (d_out, d_in): transpose at the boundary
        lin1.weight.copy_(ffn.W_1.T)
        lin1.bias.normal_()
        ffn.b_1.copy_(lin1.bias)
        lin2.weight.copy_(ffn.W_2.T)
        lin2.bias.normal_()
        ffn.b_2.copy_(lin2.bias)
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    torch.testing.assert_close(ffn(x), lin2(torch_act(lin1(x))), rtol=1e-12, atol=1e-12)


def test_swiglu_gate_is_W_3():
    torch.manual_seed(0)
    ffn = FeedForward(6, 10, "swiglu", bias=False).double()
    x = torch.randn(4, 6, dtype=torch.float64)
    expected = (F.silu(x @ ffn.W_3) * (x @ ffn.W_1)) @ ffn.W_2
    torch.testing.assert_close(ffn(x), expected, rtol=1e-12, atol=1e-12)
    assert ffn.b_1 is None and ffn.b_3 is None


@pytest.mark.parametrize("d_model,d_ff", [(8, 24), (12, 32)])
def test_swiglu_equals_transformers_llama_mlp(d_model, d_ff):
    """An independent oracle: Hugging Face's LlamaMLP, down_proj(silu(gate_proj(x)) * up_proj(x)).
    Course W_3 = gate_proj (Meta w1), W_1 = up_proj (Meta w3), W_2 = down_proj (Meta w2); HF's
    nn.Linear stores (d_out, d_in), the course (d_in, d_out)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    torch.manual_seed(d_model)
    config = LlamaConfig(hidden_size=d_model, intermediate_size=d_ff, hidden_act="silu",
                         mlp_bias=False, num_attention_heads=1, num_key_value_heads=1)
    mlp = LlamaMLP(config).double()
    ours = FeedForward(d_model, d_ff, "swiglu", bias=False).double()
    with torch.no_grad():
        ours.W_3.copy_(mlp.gate_proj.weight.T)    # (d_ff, d_model) -> (d_model, d_ff)
        ours.W_1.copy_(mlp.up_proj.weight.T)
        ours.W_2.copy_(mlp.down_proj.weight.T)    # (d_model, d_ff) -> (d_ff, d_model)
        x = torch.randn(3, 5, d_model, dtype=torch.float64)
        torch.testing.assert_close(ours(x), mlp(x), rtol=1e-12, atol=1e-12)
        # the other numbering (gate and up swapped) is a different function: the test can fail
        ours.W_3.copy_(mlp.up_proj.weight.T)
        ours.W_1.copy_(mlp.gate_proj.weight.T)
        assert (ours(x) - mlp(x)).abs().max() > 1e-3
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in mlp.parameters())


def test_position_wise_permutation_commutes():
    torch.manual_seed(0)
    ffn = FeedForward(8, activation="gelu").double()
    x = torch.randn(2, 9, 8, dtype=torch.float64)
    perm = torch.randperm(9)
    torch.testing.assert_close(ffn(x[:, perm]), ffn(x)[:, perm], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ffn(x[:, 3:4]), ffn(x)[:, 3:4], rtol=1e-12, atol=1e-12)


def test_gradcheck_float64():
    torch.manual_seed(0)
    for activation in ("gelu", "swiglu"):
        ffn = FeedForward(4, 6, activation).double()
        x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(ffn, (x,))


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("bias", [True, False])
def test_parameter_count_matches_module(activation, bias):
    ffn = FeedForward(12, 20, activation, bias)
    assert sum(p.numel() for p in ffn.parameters()) == ffn_params(12, 20, activation, bias)


def ffn_params(d_model, d_ff, activation="relu", bias=True):
    """The FFN rows of the course's one parameter counter."""
    counts = layer_param_counts(d_model=d_model, n_heads=1, d_ff=d_ff, activation=activation,
                                bias=bias)
    return sum(v for k, v in counts.items() if k.startswith("FFN"))


def ffn_flops(**sizes):
    return sum(v for k, v in layer_flops(**sizes).items() if k.startswith("FFN"))


def test_default_sizes_and_two_thirds_rule():
    assert FeedForward(512).d_ff == 2048
    assert tuple(FeedForward(8).W_1.shape) == (8, 32) and tuple(FeedForward(8).W_2.shape) == (32, 8)
    assert swiglu_d_ff(4096, multiple_of=256) == 11008          # LLaMA 7B
    assert swiglu_d_ff(768) == 2048
    # the 2/3 rule keeps the parameter count within 1% of the 4 d_model FFN
    assert ffn_params(768, swiglu_d_ff(768), "swiglu", False) == pytest.approx(
        ffn_params(768, 3072, "relu", False), rel=0.01)


def test_bad_input_raises():
    with pytest.raises(ValueError, match=r"\(2, 7\).*d_model=8"):
        FeedForward(8)(torch.randn(2, 7))
    with pytest.raises(ValueError, match="'tanh'"):
        FeedForward(8, activation="tanh")
    with pytest.raises(ValueError, match=r"W_1 \(5, 3\)"):
        feed_forward_np(np.ones((2, 4)), np.ones((5, 3)), None, np.ones((3, 4)), None)


def test_gpt3_flop_share_golden():
    # GPT-3 175B: d_model 12288, d_ff 49152, T 2048, 96 heads. share = 8d / (12d + 2T) = 24/37.
    g = MODEL_SIZES["GPT-3 175B"]
    sizes = dict(d_model=g["d_model"], n_heads=g["n_heads"], d_ff=g["d_ff"], T=g["T"])
    share = ffn_flop_share(**sizes)
    assert share == pytest.approx(24 / 37, abs=1e-12)
    assert share == pytest.approx(0.648649, abs=1e-6)
    # causal: only the T (T + 1) / 2 visible query-key pairs: 8d / (12d + (T + 1))
    d, T = g["d_model"], g["T"]
    causal = ffn_flop_share(**sizes, causal=True)
    assert causal == pytest.approx(8 * d / (12 * d + (T + 1)), abs=1e-12)
    assert causal == pytest.approx(0.657530, abs=1e-6)
    flops = layer_flops(**sizes)
    assert ffn_flops(**sizes) == 2 * 2048 * 12288 * 49152 * 2
    assert sum(flops.values()) == pytest.approx(2 * 2048 * (12 * 12288 ** 2 + 2 * 2048 * 12288), rel=1e-12)


def test_flop_share_limits_and_param_share():
    assert ffn_flop_share(d_model=1000, n_heads=1, d_ff=4000, T=1) == pytest.approx(8000 / (12000 + 2), rel=1e-12)
    assert ffn_flop_share(d_model=64, n_heads=1, d_ff=256, T=10 ** 6) < 0.001  # attention dominates
    assert ffn_param_share(d_model=12288, n_heads=96, d_ff=49152, bias=False) == pytest.approx(2 / 3, abs=1e-4)
    p = layer_param_counts(d_model=8192, n_heads=64, n_kv_heads=8, d_ff=28672, activation="swiglu",
                           bias=False, norm="rms")  # LLaMA-2 70B, GQA
    attn = sum(v for k, v in p.items() if k.startswith("attention"))
    assert attn == 2 * 8192 ** 2 + 2 * 8192 * 1024
    assert sum(v for k, v in p.items() if k.startswith("FFN")) == 3 * 8192 * 28672


def test_flop_count_matches_a_counted_forward():
    # FLOPs of the FFN matmuls, counted by torch's FLOP counter on a real forward pass
    from torch.utils.flop_counter import FlopCounterMode
    ffn = FeedForward(32, 96, "swiglu", bias=False)
    x = torch.randn(1, 10, 32)
    with FlopCounterMode(display=False) as counter:
        ffn(x)
    assert counter.get_total_flops() == ffn_flops(T=10, d_model=32, n_heads=1, d_ff=96,
                                                  activation="swiglu")


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_fused_feed_forward_equals_teaching_path_with_gradients(activation):
    """FeedForward(fused=True) (F.linear, F.gelu...: the training path) = the equations, float64."""
    torch.manual_seed(0)
    teach = FeedForward(6, 10, activation).double()
    fast = FeedForward(6, 10, activation, fused=True).double()
    with torch.no_grad():
        for p in teach.parameters():
            p.uniform_(-1, 1)   # non-zero biases, so a dropped bias would show
    fast.load_state_dict(teach.state_dict())
    x = torch.randn(2, 5, 6, dtype=torch.float64) * 2
    results = []
    for ffn in (teach, fast):
        xi = x.clone().requires_grad_(True)
        out = ffn(xi)
        out.square().sum().backward()
        results.append([out.detach(), xi.grad] + [p.grad for p in ffn.parameters()])
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
