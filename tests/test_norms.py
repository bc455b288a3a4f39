"""norms: LayerNorm and RMSNorm against torch.nn built-ins and float64 NumPy; residual orders."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from txlearn.ffn import FeedForward
from txlearn.norms import (LayerNorm, RMSNorm, layer_norm, layer_norm_np, residual, residual_np,
                           rms_norm, rms_norm_np)


def test_layer_norm_golden_values():
    # biased variance, eps = 1e-5 inside the root (values from the lesson-06 exercise)
    np.testing.assert_allclose(layer_norm_np([1.0, 0, 0, 0]),
                               [1.732005, -0.577335, -0.577335, -0.577335], atol=1e-6)
    np.testing.assert_allclose(layer_norm_np([1e-3, -1e-3]), [0.301511, -0.301511], atol=1e-6)


def test_rms_norm_golden_values():
    np.testing.assert_allclose(rms_norm_np([3.0, 4.0]), [0.848528, 1.131371], atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("shape", [(5,), (3, 7), (2, 4, 16)])
def test_layer_norm_matches_torch_and_numpy(seed, shape):
    torch.manual_seed(seed)
    d = shape[-1]
    x = torch.randn(shape, dtype=torch.float64) * 3 + 1
    ours = LayerNorm(d, eps=1e-5).double()
    ref = nn.LayerNorm(d, eps=1e-5).double()
    with torch.no_grad():
        ours.gamma.copy_(torch.randn(d))
        ours.beta.copy_(torch.randn(d))
        ref.weight.copy_(ours.gamma)
        ref.bias.copy_(ours.beta)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ours(x).detach().numpy(),
                               layer_norm_np(x.numpy(), ours.gamma.detach().numpy(),
                                             ours.beta.detach().numpy()), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", [(6,), (2, 5, 8)])
def test_rms_norm_matches_torch_and_numpy(seed, shape):
    torch.manual_seed(seed)
    d = shape[-1]
    x = torch.randn(shape, dtype=torch.float64) * 2 + 0.5
    ours = RMSNorm(d, eps=1e-6).double()
    ref = nn.RMSNorm(d, eps=1e-6).double()
    with torch.no_grad():
        ours.gamma.copy_(torch.randn(d))
        ref.weight.copy_(ours.gamma)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ours(x).detach().numpy(),
                               rms_norm_np(x.numpy(), ours.gamma.detach().numpy()),
                               rtol=1e-12, atol=1e-12)


def test_float32_layer_norm_close_to_torch():
    torch.manual_seed(0)
    x = torch.randn(4, 10, 32)
    torch.testing.assert_close(LayerNorm(32)(x), F.layer_norm(x, (32,), eps=1e-5),
                               rtol=1e-5, atol=1e-5)


def test_layer_norm_output_statistics():
    x = np.random.default_rng(0).normal(5.0, 3.0, size=(100, 64))
    y = layer_norm_np(x)
    np.testing.assert_allclose(y.mean(-1), 0.0, atol=1e-12)
    np.testing.assert_allclose(y.var(-1), 1.0, atol=1e-5)   # 1 - eps/var, var about 9


def test_rms_norm_keeps_the_mean_direction():
    # RMSNorm does not subtract the mean: a constant vector stays constant and non-zero
    np.testing.assert_allclose(rms_norm_np(np.full(4, 2.0)), np.ones(4), atol=1e-6)
    np.testing.assert_allclose(layer_norm_np(np.full(4, 2.0)), np.zeros(4), atol=1e-12)


def test_gradcheck_float64():
    torch.manual_seed(0)
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    g = torch.randn(5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, g, b: layer_norm(x, g, b), (x, g, b))
    assert torch.autograd.gradcheck(lambda x, g: rms_norm(x, g), (x, g))


def test_gradients_match_torch():
    torch.manual_seed(0)
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    (LayerNorm(8).double()(x) ** 3).sum().backward()
    (nn.LayerNorm(8).double()(x2) ** 3).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("Norm", [LayerNorm, RMSNorm])
def test_wrong_feature_size_raises_naming_both(Norm):
    with pytest.raises(ValueError, match=r"d_model=8.*\(2, 7\)"):
        Norm(8)(torch.randn(2, 7))


def test_numpy_gamma_shape_raises():
    with pytest.raises(ValueError, match=r"\(3,\).*\(2, 4\)"):
        layer_norm_np(np.ones((2, 4)), gamma=np.ones(3))
    with pytest.raises(ValueError, match=r"\(5,\)"):
        rms_norm_np(np.ones((2, 4)), gamma=np.ones(5))


def test_residual_post_and_pre_orders():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    f = FeedForward(8, 16).double()
    norm = LayerNorm(8).double()
    torch.testing.assert_close(residual(x, f, norm), norm(x + f(x)), rtol=0, atol=0)
    torch.testing.assert_close(residual(x, f, norm, "pre"), x + f(norm(x)), rtol=0, atol=0)
    assert (residual(x, f, norm, "pre") - residual(x, f, norm, "post")).abs().max() > 0.1
    # post-LN output is normalised; pre-LN output is not
    torch.testing.assert_close(residual(x, f, norm).mean(-1), torch.zeros(2, 3, dtype=torch.float64),
                               rtol=0, atol=1e-12)


def test_residual_np_and_identity_sublayer():
    x = np.random.default_rng(1).normal(size=(4, 6))
    np.testing.assert_allclose(residual_np(x, lambda h: 0 * h, order="pre"), x, atol=0)
    np.testing.assert_allclose(residual_np(x, lambda h: h), layer_norm_np(2 * x), atol=1e-12)


def test_residual_errors():
    x = torch.randn(2, 4)
    with pytest.raises(ValueError, match="'middle'"):
        residual(x, lambda h: h, lambda h: h, order="middle")
    with pytest.raises(ValueError, match=r"\(2, 4\).*\(2, 3\)"):
        residual(x, lambda h: h[:, :3], lambda h: h)


def test_fused_layer_norm_equals_teaching_path_with_gradients():
    """LayerNorm(fused=True) (F.layer_norm, the training path) = the equation, float64."""
    torch.manual_seed(0)
    teach, fast = LayerNorm(8).double(), LayerNorm(8, fused=True).double()
    with torch.no_grad():
        teach.gamma.uniform_(0.5, 1.5)
        teach.beta.uniform_(-0.5, 0.5)
    fast.load_state_dict(teach.state_dict())
    x = torch.randn(3, 5, 8, dtype=torch.float64) * 3 + 1
    outs, grads = [], []
    for norm in (teach, fast):
        xi = x.clone().requires_grad_(True)
        out = norm(xi)
        (out ** 3).sum().backward()
        outs.append(out.detach())
        grads.append([xi.grad, norm.gamma.grad, norm.beta.grad])
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-12, atol=1e-12)
    for g_fast, g_teach in zip(grads[1], grads[0]):
        torch.testing.assert_close(g_fast, g_teach, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="d_model"):
        fast(torch.randn(2, 7))
