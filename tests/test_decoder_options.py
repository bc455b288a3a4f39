"""The options lesson 10's decoder adds to the course's layers: RoPE inside MultiHeadAttention
(both pairings, positions offset by the cache) and RMSNorm in TransformerLayer/TransformerStack.

Oracles: a float64 NumPy reference written from the equations (apply_rope_np, attention_np,
rms_norm_np), torch.nn.RMSNorm, and the module's own uncached pass. The transformers oracle
(LlamaDecoderLayer) is in tests/test_decoder.py, which imports transformers anyway.
"""

import numpy as np
import pytest
import torch
from torch import nn

from txlearn.attention import attention_np
from txlearn.heads import KVCache, MultiHeadAttention
from txlearn.layer import TransformerLayer, TransformerStack
from txlearn.masks import causal_mask, causal_mask_np
from txlearn.models.gguf import interleaved_to_half_heads
from txlearn.norms import LayerNorm, RMSNorm
from txlearn.positional import apply_rope_np, half_to_interleaved


def _rope_mha(n_heads=4, n_kv_heads=2, d_model=16, rope="interleaved", base=10000.0, seed=0):
    torch.manual_seed(seed)
    return MultiHeadAttention(d_model, n_heads, n_kv_heads, bias=False, rope=rope,
                              rope_base=base).double().eval()


def _reference(mha, x, positions):
    """NumPy float64: project, rotate every head at `positions`, causal attention, merge, W_O."""
    W = {k: getattr(mha, k).detach().numpy() for k in ("W_Q", "W_K", "W_V", "W_O")}
    x = x.numpy()
    B, T, _ = x.shape
    h, g, d_k = mha.n_heads, mha.n_kv_heads, mha.d_k
    Q = (x @ W["W_Q"]).reshape(B, T, h, d_k).transpose(0, 2, 1, 3)      # (B, h, T, d_k)
    K = (x @ W["W_K"]).reshape(B, T, g, d_k).transpose(0, 2, 1, 3)      # (B, g, T, d_k)
    V = (x @ W["W_V"]).reshape(B, T, g, d_k).transpose(0, 2, 1, 3)
    Q = apply_rope_np(Q, positions, mha.rope, mha.rope_base)
    K = apply_rope_np(K, positions, mha.rope, mha.rope_base)
    K, V = np.repeat(K, h // g, axis=1), np.repeat(V, h // g, axis=1)   # head j reads j // (h/g)
    out = attention_np(Q, K, V, causal_mask_np(T))                      # (B, h, T, d_k)
    return out.transpose(0, 2, 1, 3).reshape(B, T, h * d_k) @ W["W_O"]


@pytest.mark.parametrize("rope", ["interleaved", "half"])
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_rope_attention_equals_numpy_reference(rope, n_kv_heads):
    mha = _rope_mha(n_kv_heads=n_kv_heads, rope=rope, base=100000.0)
    x = torch.randn(2, 7, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got = mha(x, mask=causal_mask(7))
    np.testing.assert_allclose(got.detach().numpy(), _reference(mha, x, np.arange(7)),
                               rtol=0, atol=1e-12)


def test_rope_changes_the_output_and_position_zero_is_not_rotated():
    plain = _rope_mha(rope=None)
    rotary = _rope_mha(rope="interleaved")
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    a, b = plain(x, mask=causal_mask(5)), rotary(x, mask=causal_mask(5))
    torch.testing.assert_close(a[:, 0], b[:, 0], rtol=0, atol=1e-14)   # one key, its own value
    assert (a[:, 1:] - b[:, 1:]).abs().max() > 1e-3


@pytest.mark.parametrize("rope", ["interleaved", "half"])
def test_cached_positions_continue_after_the_cache(rope):
    mha = _rope_mha(rope=rope)
    x = torch.randn(1, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    full = mha(x, mask=causal_mask(9))
    cache = KVCache()
    steps = [mha(x[:, :4], mask=causal_mask(4), cache=cache)]            # a prefill of 4
    for t in range(4, 9):                                               # then one at a time
        steps.append(mha(x[:, t:t + 1], mask=causal_mask(1, t + 1), cache=cache))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-12)
    assert len(cache) == 9


def test_cache_holds_rotated_keys():
    mha = _rope_mha(rope="half")
    x = torch.randn(1, 3, 16, dtype=torch.float64)
    cache = KVCache()
    mha(x, mask=causal_mask(3), cache=cache)
    K = (x @ mha.W_K).detach().numpy().reshape(1, 3, 2, 4).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(cache.K.detach().numpy(), apply_rope_np(K, np.arange(3), "half"),
                               rtol=0, atol=1e-13)


def test_permuted_weights_with_half_pairing_equal_interleaved():
    inter = _rope_mha(rope="interleaved")
    half = _rope_mha(rope="half")
    with torch.no_grad():
        half.W_Q.copy_(interleaved_to_half_heads(inter.W_Q, 4))
        half.W_K.copy_(interleaved_to_half_heads(inter.W_K, 2))
        half.W_V.copy_(inter.W_V)
        half.W_O.copy_(inter.W_O)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    torch.testing.assert_close(half(x, mask=causal_mask(6)), inter(x, mask=causal_mask(6)),
                               rtol=0, atol=1e-12)
    with torch.no_grad():                        # without the permutation: a different model
        half.W_Q.copy_(inter.W_Q)
        half.W_K.copy_(inter.W_K)
    assert (half(x, mask=causal_mask(6)) - inter(x, mask=causal_mask(6))).abs().max() > 1e-3


def test_interleaved_to_half_heads_golden_and_inverse():
    W = torch.arange(16.0).reshape(1, 16)                      # 2 heads of d_k = 8
    expected = [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15]
    assert interleaved_to_half_heads(W, 2)[0].tolist() == expected
    back = half_to_interleaved(interleaved_to_half_heads(W, 2).reshape(1, 2, 8)).reshape(1, 16)
    assert torch.equal(back, W)
    np.testing.assert_array_equal(interleaved_to_half_heads(W.numpy(), 2)[0], expected)
    with pytest.raises(ValueError, match="n_heads=3"):
        interleaved_to_half_heads(W, 3)


def test_rope_argument_errors():
    with pytest.raises(ValueError, match="rope must be None or one of"):
        MultiHeadAttention(16, 4, rope="pairs")
    with pytest.raises(ValueError, match="d_k=3"):
        MultiHeadAttention(12, 4, rope="half")
    mha = _rope_mha()
    x = torch.randn(1, 3, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="self-attention only"):
        mha(x, x_kv=x)


def test_rms_layer_uses_rmsnorm_and_equals_its_composition():
    torch.manual_seed(3)
    layer = TransformerLayer(16, 4, 24, n_kv_heads=2, activation="swiglu", norm_first=True,
                             norm="rms", eps=1e-5, bias=False, rope="half").double().eval()
    assert isinstance(layer.norm1, RMSNorm) and isinstance(layer.norm2, RMSNorm)
    with torch.no_grad():
        layer.norm1.gamma.normal_()
        layer.norm2.gamma.normal_()
    ref1, ref2 = nn.RMSNorm(16, eps=1e-5).double(), nn.RMSNorm(16, eps=1e-5).double()
    with torch.no_grad():
        ref1.weight.copy_(layer.norm1.gamma)
        ref2.weight.copy_(layer.norm2.gamma)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    mask = causal_mask(5)
    h = x + layer.attn(ref1(x), mask=mask)
    expected = h + layer.ffn(ref2(h))
    torch.testing.assert_close(layer(x, mask=mask), expected, rtol=0, atol=1e-12)
    assert sum(p.numel() for p in layer.parameters()) == (
        2 * 16 * 16 + 2 * 16 * 8 + 3 * 16 * 24 + 2 * 16)       # no biases, no beta


def test_stack_final_norm_follows_the_layers_norm_and_bad_names_raise():
    assert isinstance(TransformerStack(2, 16, 4, 32, final_norm=True, norm="rms").final_norm, RMSNorm)
    assert isinstance(TransformerStack(2, 16, 4, 32, final_norm=True).final_norm, LayerNorm)
    with pytest.raises(ValueError, match="norm must be 'layer' or 'rms'"):
        TransformerLayer(16, 4, 32, norm="batch")
