"""Tests of txlearn.softmax (lesson 01) against torch built-ins, float64 NumPy and invariants,
and of the layer diagram of txlearn.plotting (lesson 00)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from txlearn.softmax import (
    entropy, entropy_np, log_softmax, log_softmax_np, naive_softmax_np, sample_scores_np,
    scaled_scores, scaled_scores_np, softmax, softmax_jacobian, softmax_jacobian_np, softmax_np,
)

# Golden values of issue 2 (also held by the stable_softmax check).
GOLDEN = [
    ([1000.0, 1001.0, 1002.0], [0.090031, 0.244728, 0.665241]),
    ([-1e4, -1e4], [0.5, 0.5]),
    ([[0.0, 1.0], [1000.0, 1001.0]], [[0.268941, 0.731059], [0.268941, 0.731059]]),
]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float64: dict(rtol=1e-12, atol=1e-14)}


def _randn(shape, dtype, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=dtype) * scale


# ----------------------------------------------------------------------------- golden values

@pytest.mark.parametrize("x, expected", GOLDEN)
def test_softmax_np_golden(x, expected):
    np.testing.assert_allclose(softmax_np(x), expected, rtol=0, atol=5e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("x, expected", GOLDEN)
def test_softmax_torch_golden(x, expected, dtype):
    got = softmax(torch.tensor(x, dtype=dtype))
    np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=1e-6)


def test_naive_softmax_fails_where_golden_values_need_the_shift():
    assert np.isnan(naive_softmax_np(np.array([1000.0, 1001.0, 1002.0]))).all()
    assert np.isnan(naive_softmax_np(np.array([-1e4, -1e4]))).all()
    # ...and agrees with the stable one where exp() is representable.
    x = np.array([[0.5, -1.0, 2.0], [3.0, 0.0, -2.0]])
    np.testing.assert_allclose(naive_softmax_np(x), softmax_np(x), rtol=1e-14, atol=0)


def test_naive_float32_overflow_threshold_is_ln_float32_max():
    # exp(x) overflows float32 for x > ln(3.4028e38) = 88.72: 88 is fine, 89 gives NaN.
    assert math.isclose(math.log(np.finfo(np.float32).max), 88.7228, abs_tol=1e-4)
    ok = naive_softmax_np(np.array([88.0, 87.0], dtype=np.float32))
    np.testing.assert_allclose(ok, softmax_np([88.0, 87.0]), rtol=1e-6)
    assert np.isnan(naive_softmax_np(np.array([89.0, 88.0], dtype=np.float32))).any()
    assert naive_softmax_np(np.array([89.0], dtype=np.float32)).dtype == np.float32


# ----------------------------------------------------------------------------- torch oracles

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (2, 1, 3, 6)])
@pytest.mark.parametrize("temperature", [0.25, 1.0, 3.0])
def test_softmax_and_log_softmax_match_torch_on_every_dim(shape, dtype, temperature):
    x = _randn(shape, dtype, seed=len(shape))
    for dim in range(-len(shape), len(shape)):
        torch.testing.assert_close(softmax(x, dim, temperature),
                                   torch.softmax(x / temperature, dim), **TOL[dtype])
        torch.testing.assert_close(log_softmax(x, dim, temperature),
                                   torch.log_softmax(x / temperature, dim), **TOL[dtype])


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4)])
@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_numpy_reference_equals_torch_float64(shape, temperature):
    x = _randn(shape, torch.float64, seed=3)
    for axis in range(-len(shape), len(shape)):
        np.testing.assert_allclose(softmax_np(x.numpy(), axis, temperature),
                                   softmax(x, axis, temperature).numpy(), rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(log_softmax_np(x.numpy(), axis, temperature),
                                   log_softmax(x, axis, temperature).numpy(), rtol=1e-13, atol=1e-13)


def test_softmax_keeps_dtype_and_shape():
    for dtype in (torch.float16, torch.float32, torch.float64):
        x = _randn((2, 3), dtype)
        assert softmax(x).dtype == dtype and softmax(x).shape == (2, 3)
        assert log_softmax(x).dtype == dtype
    assert softmax_np(np.arange(6, dtype=np.float32).reshape(2, 3)).dtype == np.float64


def test_gradients_match_gradcheck_and_torch():
    x = _randn((3, 5), torch.float64, seed=1).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: softmax(t, dim=-1, temperature=0.7), (x,))
    assert torch.autograd.gradcheck(lambda t: log_softmax(t, dim=0, temperature=1.3), (x,))
    w = _randn((3, 5), torch.float64, seed=2)
    (g_ours,) = torch.autograd.grad((softmax(x, 0) * w).sum(), x)
    (g_torch,) = torch.autograd.grad((torch.softmax(x, 0) * w).sum(), x)
    torch.testing.assert_close(g_ours, g_torch, rtol=1e-12, atol=1e-14)


# ----------------------------------------------------------------------------- invariants

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_sum_to_one_and_no_nan_on_extreme_logits(dtype):
    big = torch.finfo(dtype).max / 4
    x = torch.tensor([[0.0, 1.0, 2.0], [-1e4, -1e4, -1e4], [1e4, -1e4, 0.0],
                      [big, -big, 0.0], [-big, -big, -big]], dtype=dtype)
    for fn in (softmax, lambda t: torch.exp(log_softmax(t))):
        p = fn(x)
        assert torch.isfinite(p).all()
        torch.testing.assert_close(p.sum(-1), torch.ones(5, dtype=dtype), rtol=0, atol=1e-6)
    assert torch.isfinite(log_softmax(x)).all()
    p = softmax_np(x.numpy())
    assert np.isfinite(p).all()
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shift", [-1e4, 0.0, 1e4])
def test_shift_invariance(shift, dtype):
    x = _randn((4, 6), torch.float64, seed=5)
    # float32 stores x + 1e4 to its spacing there (2^-10 ~ 1e-3), so the logits themselves
    # move by up to 5e-4: the tolerance follows that rounding, not the softmax.
    tol = dict(rtol=0, atol=2e-3) if dtype == torch.float32 and shift else TOL[dtype]
    if dtype == torch.float64 and shift:
        tol = dict(rtol=0, atol=1e-11)  # float64 spacing at 1e4 is 1.8e-12
    expected = torch.softmax(x, -1).to(dtype)
    torch.testing.assert_close(softmax((x + shift).to(dtype)), expected, **tol)
    torch.testing.assert_close(log_softmax((x + shift).to(dtype)),
                               torch.log_softmax(x, -1).to(dtype), **tol)
    np.testing.assert_allclose(softmax_np(x.numpy() + shift), softmax_np(x.numpy()),
                               rtol=0, atol=1e-11)


def test_masked_entries_get_zero_weight():
    x = torch.tensor([0.0, -math.inf, 1.0], dtype=torch.float64)
    p = softmax(x)
    assert p[1].item() == 0.0
    torch.testing.assert_close(p[[0, 2]], torch.softmax(torch.tensor([0.0, 1.0],
                                                                      dtype=torch.float64), 0))
    np.testing.assert_allclose(softmax_np(x.numpy()), p.numpy(), rtol=1e-15, atol=0)


def test_log_softmax_stays_finite_where_log_of_softmax_does_not():
    np.testing.assert_allclose(log_softmax_np([0.0, -1000.0]), [0.0, -1000.0], rtol=0, atol=1e-12)
    with np.errstate(divide="ignore"):
        assert np.isneginf(np.log(softmax_np([0.0, -1000.0])))[1]


def test_temperature_is_a_division_of_the_logits():
    x = _randn((3, 4), torch.float64, seed=7)
    torch.testing.assert_close(softmax(x, temperature=4.0), softmax(x / 4.0), rtol=1e-14, atol=0)
    # tau -> large: uniform; tau -> small: one-hot at the argmax.
    torch.testing.assert_close(softmax(x, temperature=1e6), torch.full((3, 4), 0.25,
                               dtype=torch.float64), rtol=0, atol=1e-5)
    one_hot = F.one_hot(x.argmax(-1), 4).to(torch.float64)
    torch.testing.assert_close(softmax(x, temperature=1e-4), one_hot, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("temperature", [0.0, -1.0, math.inf, math.nan])
def test_bad_temperature_raises(temperature):
    x = torch.zeros(3)
    for fn in (softmax, log_softmax):
        with pytest.raises(ValueError, match="temperature"):
            fn(x, temperature=temperature)
    for fn in (softmax_np, log_softmax_np):
        with pytest.raises(ValueError, match="temperature"):
            fn(np.zeros(3), temperature=temperature)


def test_bad_axis_dtype_and_shapes_raise():
    with pytest.raises(ValueError, match=r"dim=2 .* 2 dimensions"):
        softmax(torch.zeros(2, 3), dim=2)
    with pytest.raises(ValueError, match=r"axis=-3 .* 2 dimensions"):
        softmax_np(np.zeros((2, 3)), axis=-3)
    with pytest.raises(ValueError, match="int64"):
        softmax(torch.arange(3))
    with pytest.raises(ValueError, match="torch.Tensor"):
        softmax(np.zeros(3))
    with pytest.raises(ValueError, match=r"\(2, 3, 4\).*\(2, 5, 3\).*4 != 3"):
        scaled_scores(torch.zeros(2, 3, 4), torch.zeros(2, 5, 3))
    with pytest.raises(ValueError, match=r"\(4,\).*\(5, 4\)"):
        scaled_scores_np(np.zeros(4), np.zeros((5, 4)))
    with pytest.raises(ValueError, match="scalar"):
        softmax_jacobian_np(1.0)
    with pytest.raises(ValueError, match="probabilities"):
        entropy_np([0.5, -0.5, 1.0])
    with pytest.raises(ValueError, match="temperature"):
        softmax(torch.zeros(3), temperature=True)
    np.testing.assert_allclose(softmax_np([0.0, 1.0], temperature=np.float32(2.0)),
                               softmax_np([0.0, 0.5]), rtol=1e-15)
    with pytest.raises(ValueError, match="d_k=0"):
        sample_scores_np(0, 10, scaled=True)


# ----------------------------------------------------------------------------- Jacobian

@pytest.mark.parametrize("scale", [0.1, 1.0, 10.0])
def test_softmax_jacobian_matches_autograd(scale):
    x = _randn((6,), torch.float64, seed=11, scale=scale)
    expected = torch.autograd.functional.jacobian(lambda t: torch.softmax(t, -1), x)
    torch.testing.assert_close(softmax_jacobian(x), expected, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(softmax_jacobian_np(x.numpy()), expected.numpy(),
                               rtol=1e-12, atol=1e-15)


def test_batched_jacobian_and_its_invariants():
    x = _randn((2, 3, 5), torch.float64, seed=12)
    J = softmax_jacobian(x)
    assert J.shape == (2, 3, 5, 5)
    for b in range(2):
        for t in range(3):
            expected = torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1), x[b, t])
            torch.testing.assert_close(J[b, t], expected, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(J, J.transpose(-1, -2), rtol=0, atol=0)          # symmetric
    torch.testing.assert_close(J.sum(-1), torch.zeros(2, 3, 5, dtype=torch.float64),
                               rtol=0, atol=1e-15)                                # rows sum to 0
    np.testing.assert_allclose(softmax_jacobian_np(x.numpy()), J.numpy(), rtol=1e-12, atol=1e-15)


def test_jacobian_norm_bound_and_decay_with_logit_scale():
    z = _randn((16,), torch.float64, seed=13, scale=1.0)
    norms, bounds = [], []
    for c in (1.0, 10.0, 100.0):
        J = softmax_jacobian(c * z)
        norms.append(torch.linalg.matrix_norm(J, ord=2).item())
        bounds.append(2 * (1 - softmax(c * z).max().item()))
    assert all(n <= b + 1e-15 for n, b in zip(norms, bounds))  # Gershgorin: ||J||_2 <= 2(1-p_max)
    assert norms[2] < 1e-3 * norms[1]
    # Uniform softmax over n: J = I/n - 1 1^T/n^2, spectral norm exactly 1/n.
    torch.testing.assert_close(torch.linalg.matrix_norm(softmax_jacobian(torch.zeros(16,
                               dtype=torch.float64)), ord=2), torch.tensor(1 / 16,
                               dtype=torch.float64), rtol=1e-12, atol=0)


# ----------------------------------------------------------------------------- entropy

def test_entropy_matches_categorical_and_closed_forms():
    p = softmax(_randn((4, 7), torch.float64, seed=14), -1)
    expected = torch.distributions.Categorical(probs=p).entropy()
    torch.testing.assert_close(entropy(p), expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(entropy_np(p.numpy()), expected.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(entropy_np(np.full(8, 1 / 8)), math.log(8), rtol=1e-14)
    assert entropy_np([0.0, 1.0, 0.0]) == 0.0
    assert entropy(torch.tensor([0.0, 1.0])).item() == 0.0
    np.testing.assert_allclose(entropy_np(p.numpy().T, axis=0), expected.numpy(), rtol=1e-12)


# ----------------------------------------------------------------------------- scores

@pytest.mark.parametrize("shapes", [((3, 8), (5, 8)), ((2, 3, 8), (2, 5, 8)),
                                    ((2, 4, 3, 16), (1, 4, 6, 16))])
def test_scaled_scores_against_sdpa_and_numpy(shapes):
    q_shape, k_shape = shapes
    Q = _randn(q_shape, torch.float64, seed=15, scale=1.0)
    K = _randn(k_shape, torch.float64, seed=16, scale=1.0)
    d_k, S = q_shape[-1], k_shape[-2]
    scores = scaled_scores(Q, K)
    np.testing.assert_allclose(scaled_scores_np(Q.numpy(), K.numpy()), scores.numpy(),
                               rtol=1e-13, atol=1e-14)
    # Oracle: SDPA with V = identity returns the attention weights softmax(scores) themselves.
    V = torch.eye(S, dtype=torch.float64).expand(*k_shape[:-2], S, S)
    expected = F.scaled_dot_product_attention(Q, K, V)
    torch.testing.assert_close(softmax(scores, -1), expected, rtol=1e-10, atol=1e-12)
    # Independent formula: q . k summed by hand.
    manual = (Q.unsqueeze(-2) * K.unsqueeze(-3)).sum(-1) / math.sqrt(d_k)
    torch.testing.assert_close(scores, manual, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("d_k", [1, 16, 256])
def test_sampled_score_variance_is_d_k_then_one(d_k):
    n = 20000
    # Var of a sample variance: (2 + excess kurtosis) sigma^4 / n; q.k has excess kurtosis 6/d_k.
    rel_tol = 5 * math.sqrt((2 + 6 / d_k) / n)
    unscaled = sample_scores_np(d_k, n, scaled=False, seed=d_k)
    scaled = sample_scores_np(d_k, n, scaled=True, seed=d_k)
    assert unscaled.shape == (n,)
    assert abs(unscaled.var() / d_k - 1) < rel_tol
    assert abs(scaled.var() - 1) < rel_tol
    np.testing.assert_allclose(scaled * math.sqrt(d_k), unscaled, rtol=1e-12)


# ----------------------------------------------------------------------------- lesson 00 figure

def test_layer_diagram_shows_every_component_in_order():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from txlearn.plotting import layer_boxes, layer_diagram

    for norm_first in (False, True):
        fig = layer_diagram(norm_first)
        texts = [t.get_text() for t in fig.axes[0].texts]
        labels = [t for t in texts if not t.startswith("lesson") and t not in ("+", "x n_layers")]
        assert labels == [b[0] for b in layer_boxes(norm_first)]
        assert texts.count("+") == 2  # two residual additions
        plt.close(fig)
    post = [b[0].split()[0] for b in layer_boxes(False)]
    pre = [b[0].split()[0] for b in layer_boxes(True)]
    assert post[2:6] == ["multi-head", "LayerNorm", "feed-forward", "LayerNorm"]
    assert pre[2:6] == ["LayerNorm", "multi-head", "LayerNorm", "feed-forward"]
    assert pre[6:] == ["final", "output"] and post[6:] == ["output"]
