"""positional: sinusoidal layout and its relative-offset rotation, the learned table's range,
RoPE's relative property, norm preservation, pairings and their conversion; position
interpolation against transformers' linear RoPE scaling; ALiBi's slopes against the paper's and
its bias against BLOOM's."""

import numpy as np
import pytest
import torch

from txlearn.attention import masked_softmax_np
from txlearn.masks import causal_mask_np
from txlearn.positional import (LearnedPositionalEmbedding, alibi_bias, alibi_bias_np,
                                alibi_slopes_np, apply_rope, apply_rope_np, half_to_interleaved,
                                interleaved_to_half, interpolate_positions,
                                interpolate_positions_np, sinusoidal_encoding,
                                sinusoidal_encoding_np, sinusoidal_offset_matrix_np)


def test_sinusoidal_golden_layout():
    # d = 4, position 1: [sin 1, cos 1, sin 0.01, cos 0.01], sin at even and cos at odd indices
    np.testing.assert_allclose(sinusoidal_encoding_np(2, 4)[1],
                               [0.841471, 0.540302, 0.010000, 0.999950], atol=1e-6)
    np.testing.assert_allclose(sinusoidal_encoding_np(1, 6)[0], [0, 1, 0, 1, 0, 1], atol=0)


def test_sinusoidal_against_the_formula():
    T, d = 30, 10
    pe = sinusoidal_encoding_np(T, d)
    for pos in (0, 7, 29):
        for i in range(d // 2):
            w = 1.0 / 10000 ** (2 * i / d)
            assert pe[pos, 2 * i] == pytest.approx(np.sin(pos * w), abs=1e-15)
            assert pe[pos, 2 * i + 1] == pytest.approx(np.cos(pos * w), abs=1e-15)


def test_sinusoidal_torch_equals_numpy():
    pe = sinusoidal_encoding(64, 32, dtype=torch.float64)
    np.testing.assert_allclose(pe.numpy(), sinusoidal_encoding_np(64, 32), rtol=0, atol=0)
    assert sinusoidal_encoding(5, 8).dtype == torch.float32


@pytest.mark.parametrize("k", [1, 5, 40])
def test_sinusoidal_offset_is_a_fixed_rotation(k):
    T, d = 100, 16
    pe = sinusoidal_encoding_np(T + k, d)
    M = sinusoidal_offset_matrix_np(k, d)
    np.testing.assert_allclose(pe[:T] @ M, pe[k:], atol=1e-12)     # same M for every pos
    np.testing.assert_allclose(M @ M.T, np.eye(d), atol=1e-12)     # a rotation


def test_sinusoidal_dot_product_depends_on_offset_only():
    pe = sinusoidal_encoding_np(200, 64)
    d1 = pe[10] @ pe[17]
    d2 = pe[150] @ pe[157]
    assert d1 == pytest.approx(d2, abs=1e-10)


@pytest.mark.parametrize("d", [0, 3, 7])
def test_odd_d_model_raises(d):
    with pytest.raises(ValueError, match=f"d={d}"):
        sinusoidal_encoding_np(4, d)
    with pytest.raises(ValueError, match=f"d={d}"):
        apply_rope(torch.randn(4, d) if d else torch.randn(4, 0))


def test_learned_table_lookup_and_range_error():
    torch.manual_seed(0)
    emb = LearnedPositionalEmbedding(max_len=16, d_model=8)
    torch.testing.assert_close(emb(5), emb.W_pos[:5], rtol=0, atol=0)
    torch.testing.assert_close(emb(torch.tensor([[3, 15]])), emb.W_pos[[3, 15]][None], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"position 16 .*max_len=16"):
        emb(17)
    with pytest.raises(ValueError, match=r"position -1"):
        emb(torch.tensor([-1, 2]))
    assert sum(p.numel() for p in emb.parameters()) == 16 * 8
    # a range of positions is a slice of the table, checked in Python (no tensor read)
    torch.testing.assert_close(emb(range(4, 9)), emb.W_pos[4:9], rtol=0, atol=0)
    torch.testing.assert_close(emb(range(3, 0, -1)), emb.W_pos[[3, 2, 1]], rtol=0, atol=0)
    assert emb(range(16, 16)).shape == (0, 8)
    with pytest.raises(ValueError, match=r"position 16 .*max_len=16"):
        emb(range(10, 17))
    with pytest.raises(ValueError, match=r"position -2"):
        emb(range(-2, 3))


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_rope_relative_property(pairing):
    torch.manual_seed(0)
    d = 16
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)

    def score(m, n):
        qm = apply_rope(q[None], torch.tensor([m]), pairing)[0]
        kn = apply_rope(k[None], torch.tensor([n]), pairing)[0]
        return (qm @ kn).item()

    for offset in (0, 3, 11):
        ref = score(offset, 0)
        for m in (offset, offset + 7, offset + 100):
            assert score(m, m - offset) == pytest.approx(ref, abs=1e-10)
    assert abs(score(5, 0) - score(0, 0)) > 1e-3  # and it does depend on the offset


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_rope_preserves_pair_norms_and_position_zero(pairing):
    torch.manual_seed(1)
    x = torch.randn(2, 3, 12, 8, dtype=torch.float64)
    y = apply_rope(x, pairing=pairing)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y[..., 0, :], x[..., 0, :], rtol=0, atol=0)  # angle 0 at pos 0


def test_rope_interleaved_golden():
    # one pair (1, 0) at position 1, d = 2: rotated by 1 radian
    np.testing.assert_allclose(apply_rope_np(np.array([[0.0, 0.0], [1.0, 0.0]])),
                               [[0, 0], [np.cos(1), np.sin(1)]], atol=1e-15)
    # d = 4, half pairing: pairs are (0, 2) and (1, 3)
    x = np.array([[0.0] * 4, [1.0, 0.0, 0.0, 0.0]])
    np.testing.assert_allclose(apply_rope_np(x, pairing="half")[1], [np.cos(1), 0, np.sin(1), 0],
                               atol=1e-15)


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_rope_torch_equals_numpy(pairing):
    torch.manual_seed(2)
    x = torch.randn(2, 9, 10, dtype=torch.float64)
    pos = torch.arange(5, 14)
    np.testing.assert_allclose(apply_rope(x, pos, pairing).numpy(),
                               apply_rope_np(x.numpy(), pos.numpy(), pairing), rtol=1e-12, atol=1e-12)


def test_pairing_conversion():
    x = torch.arange(8.0)
    torch.testing.assert_close(interleaved_to_half(x), torch.tensor([0., 2, 4, 6, 1, 3, 5, 7]))
    torch.testing.assert_close(half_to_interleaved(interleaved_to_half(x)), x)
    np.testing.assert_array_equal(half_to_interleaved(np.array([0, 1, 2, 3])), [0, 2, 1, 3])
    torch.manual_seed(3)
    xi = torch.randn(2, 7, 12, dtype=torch.float64)
    # rotating then converting = converting then rotating with the other pairing
    torch.testing.assert_close(interleaved_to_half(apply_rope(xi, pairing="interleaved")),
                               apply_rope(interleaved_to_half(xi), pairing="half"), rtol=0, atol=1e-14)


def test_converted_weights_give_the_same_attention_scores():
    # a checkpoint trained with one pairing works with the other once W_Q, W_K columns are permuted
    torch.manual_seed(4)
    d_model, d_k, T = 16, 8, 6
    x = torch.randn(T, d_model, dtype=torch.float64)
    W_Q, W_K = torch.randn(d_model, d_k, dtype=torch.float64), torch.randn(d_model, d_k, dtype=torch.float64)
    Q, K = apply_rope(x @ W_Q), apply_rope(x @ W_K)
    W_Qh, W_Kh = interleaved_to_half(W_Q), interleaved_to_half(W_K)   # permute output columns
    Qh, Kh = apply_rope(x @ W_Qh, pairing="half"), apply_rope(x @ W_Kh, pairing="half")
    torch.testing.assert_close(Qh @ Kh.T, Q @ K.T, rtol=1e-12, atol=1e-12)


def test_rope_gradcheck_and_bad_arguments():
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: apply_rope(x, pairing="half"), (x,))
    with pytest.raises(ValueError, match="'pairs'"):
        apply_rope(x, pairing="pairs")
    with pytest.raises(ValueError, match=r"3 positions.*\(5, 4\)"):
        apply_rope(x, torch.arange(3))
    with pytest.raises(ValueError, match=r"\(..., T, d\), got shape \(4,\)"):
        apply_rope(torch.randn(4))
    with pytest.raises(ValueError, match=r"\(4,\)"):
        apply_rope_np(np.ones(4))


def test_position_interpolation_equals_transformers_linear_rope_scaling():
    """Chen et al.'s interpolation is what transformers calls rope_type "linear" (positions
    divided by the factor context / trained_len); its cos/sin tables are computed from float32
    frequencies, hence 1e-6 rather than float64 rounding."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=128,
                         rope_parameters={"rope_type": "linear", "factor": 4.0,
                                          "rope_theta": 10000.0})
    torch.manual_seed(5)
    x = torch.randn(1, 4, 100, 16, dtype=torch.float64)                # (B, n_heads, T, d_k)
    cos, sin = LlamaRotaryEmbedding(config)(x, torch.arange(100)[None])
    expected, _ = apply_rotary_pos_emb(x, x, cos, sin)
    got = apply_rope(x, interpolate_positions(100, trained_len=32, context=128), pairing="half")
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert (got - apply_rope(x, pairing="half")).abs().max() > 1.0     # not plain RoPE


def test_position_interpolation_keeps_every_angle_inside_the_trained_range():
    positions = interpolate_positions_np(np.arange(128), trained_len=32, context=128)
    assert positions.dtype == np.float64 and positions.max() < 32
    np.testing.assert_array_equal(positions[::4], np.arange(32))       # every 4th: a trained one
    torch.testing.assert_close(interpolate_positions(torch.arange(10, 20), 32, 64),
                               torch.arange(10, 20, dtype=torch.float64) / 2, rtol=0, atol=0)
    np.testing.assert_array_equal(interpolate_positions_np([0, 5], 32, 32), [0.0, 5.0])
    with pytest.raises(ValueError, match="trained_len=64, context=32"):
        interpolate_positions(10, 64, 32)
    with pytest.raises(ValueError, match="trained_len=0"):
        interpolate_positions_np([1], 0, 32)


def test_alibi_slopes_are_the_papers():
    # Press et al. 2022, section 3: "for 8 heads ... 1/2^1, 1/2^2, ..., 1/2^8"; for 16 heads the
    # geometric sequence starting at 1/2^0.5 with ratio 1/2^0.5
    np.testing.assert_allclose(alibi_slopes_np(8), [2.0 ** -k for k in range(1, 9)],
                               rtol=1e-15, atol=0)
    np.testing.assert_allclose(alibi_slopes_np(16), [2.0 ** (-k / 2) for k in range(1, 17)],
                               rtol=1e-15, atol=0)
    np.testing.assert_array_equal(alibi_slopes_np(1), [2.0 ** -8])
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ValueError, match="n_heads must be a positive integer"):
            alibi_slopes_np(bad)


@pytest.mark.parametrize("n_heads", [4, 6, 8, 12])
def test_alibi_gives_blooms_attention_weights(n_heads):
    """BLOOM adds slope * key position (a per-row constant away from -slope * (i - j)): under a
    causal mask the softmax, which ignores a constant per row, must give the same weights, and
    its slopes (also for head counts that are not powers of two) must be ours. BLOOM computes
    its slopes in float32: hence 1e-7."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    T = 9
    bloom = build_alibi_tensor(torch.ones(1, T), n_heads, torch.float64)[:, 0]   # (n_heads, S)
    np.testing.assert_allclose(bloom[:, 1].numpy(), alibi_slopes_np(n_heads), rtol=2e-7, atol=0)
    scores = np.random.default_rng(n_heads).normal(size=(n_heads, T, T))
    causal = causal_mask_np(T)
    ours = masked_softmax_np(scores + alibi_bias_np(n_heads, T), causal)
    theirs = masked_softmax_np(scores + bloom.numpy()[:, None, :], causal)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-7)
    assert np.abs(ours - masked_softmax_np(scores, causal)).max() > 0.05    # the bias matters


def test_alibi_bias_values_alignment_and_errors():
    bias = alibi_bias_np(2, 3)                                   # slopes 1/16, 1/256
    np.testing.assert_array_equal(bias[0], -np.array([[0, 1, 2], [1, 0, 1], [2, 1, 0]]) / 16)
    # the last L = 2 of S = 5 positions (a cache): query 0 is position 3
    np.testing.assert_array_equal(alibi_bias_np(2, 2, 5)[0], -np.array([[3, 2, 1, 0, 1],
                                                                        [4, 3, 2, 1, 0]]) / 16)
    np.testing.assert_array_equal(alibi_bias_np(4, 2, 5), alibi_bias_np(4, 5)[:, 3:])
    t = alibi_bias(4, 6, dtype=torch.float64)
    assert t.dtype == torch.float64 and not t.requires_grad
    np.testing.assert_array_equal(t.numpy(), alibi_bias_np(4, 6))
    assert alibi_bias(4, 6, dtype=torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="L=6, S=5"):
        alibi_bias_np(4, 6, 5)
    with pytest.raises(ValueError, match="L=0"):
        alibi_bias(4, 0)
