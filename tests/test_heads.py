"""Multi-head and grouped-query attention against nn.MultiheadAttention (copied weights) and
F.scaled_dot_product_attention(enable_gqa=True); split/merge; the KV cache; kv_cache_bytes."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from txlearn.heads import (
    KVCache,
    MultiHeadAttention,
    kv_cache_bytes,
    merge_heads,
    repeat_kv,
    split_heads,
)
from txlearn.masks import causal_mask, padding_mask


def _torch_mha(d_model, n_heads, seed, dtype=torch.float64):
    torch.manual_seed(seed)
    mha = nn.MultiheadAttention(d_model, n_heads, batch_first=True, dtype=dtype)
    with torch.no_grad():  # non-zero biases, so that a dropped or misplaced bias shows
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    return mha.eval()


def test_split_heads_layout_golden():
    x = torch.arange(12.0).reshape(1, 2, 6)  # B=1, T=2, d_model=6
    h = split_heads(x, 3)  # (1, 3, 2, 2)
    assert h.shape == (1, 3, 2, 2)
    # head 1 holds features 2..3 of every position
    torch.testing.assert_close(h[0, 1], torch.tensor([[2.0, 3.0], [8.0, 9.0]]), rtol=0, atol=0)
    assert torch.equal(merge_heads(h), x)


@pytest.mark.parametrize("B,T,d_model,n_heads", [(2, 5, 12, 3), (1, 1, 8, 8), (3, 4, 16, 1)])
def test_split_merge_round_trip(B, T, d_model, n_heads):
    x = torch.randn(B, T, d_model, generator=torch.Generator().manual_seed(0))
    h = split_heads(x, n_heads)
    assert h.shape == (B, n_heads, T, d_model // n_heads)
    assert torch.equal(merge_heads(h), x)


def test_split_merge_errors():
    with pytest.raises(ValueError, match="d_model=10 is not divisible by n_heads=4"):
        split_heads(torch.zeros(1, 2, 10), 4)
    with pytest.raises(ValueError, match=r"\(2, 10\)"):
        split_heads(torch.zeros(2, 10), 2)
    with pytest.raises(ValueError, match=r"\(1, 2, 10\)"):
        merge_heads(torch.zeros(1, 2, 10))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("d_model,n_heads", [(16, 4), (12, 3), (8, 1)])
def test_self_attention_matches_nn_multihead_attention(seed, d_model, n_heads):
    mha = _torch_mha(d_model, n_heads, seed)
    ours = MultiHeadAttention.from_torch(mha)
    x = torch.randn(2, 5, d_model, dtype=torch.float64)
    ref_out, ref_w = mha(x, x, x, need_weights=True, average_attn_weights=False)
    out, w = ours(x, return_weights=True)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w, ref_w, rtol=1e-10, atol=1e-12)


def test_masks_match_nn_multihead_attention_with_opposite_polarity():
    mha = _torch_mha(16, 4, 3)
    ours = MultiHeadAttention.from_torch(mha)
    x = torch.randn(3, 6, 16, dtype=torch.float64)
    keep = padding_mask([6, 4, 2], 6)  # ours: True = real token
    causal = causal_mask(6)
    # nn.MultiheadAttention: True = ignore, for both attn_mask and key_padding_mask
    ref, ref_w = mha(x, x, x, attn_mask=~causal, key_padding_mask=~keep,
                     need_weights=True, average_attn_weights=False)
    out, w = ours(x, mask=causal, key_padding_mask=keep, return_weights=True)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w, ref_w, rtol=1e-10, atol=1e-12)
    assert (w[2, :, :, 2:] == 0).all()  # padded keys get no weight


def test_cross_attention_matches_nn_multihead_attention():
    mha = _torch_mha(12, 3, 4)
    ours = MultiHeadAttention.from_torch(mha)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 12, generator=g, dtype=torch.float64)  # queries: L = 4
    memory = torch.randn(2, 7, 12, generator=g, dtype=torch.float64)  # keys/values: S = 7
    ref, ref_w = mha(x, memory, memory, average_attn_weights=False)
    out, w = ours(x, memory, return_weights=True)
    assert out.shape == (2, 4, 12) and w.shape == (2, 3, 4, 7)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w, ref_w, rtol=1e-10, atol=1e-12)


def _gqa_oracle(m, x, mask):
    """The same projections, heads grouped by F.scaled_dot_product_attention(enable_gqa=True)."""
    Q = split_heads(x @ m.W_Q + m.b_Q, m.n_heads)
    K = split_heads(x @ m.W_K + m.b_K, m.n_kv_heads)
    V = split_heads(x @ m.W_V + m.b_V, m.n_kv_heads)
    heads = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask, enable_gqa=True)
    return merge_heads(heads) @ m.W_O + m.b_O


@pytest.mark.parametrize("n_heads,n_kv_heads", [(8, 8), (8, 4), (8, 2), (8, 1), (6, 3)])
def test_gqa_matches_sdpa_enable_gqa(n_heads, n_kv_heads):
    torch.manual_seed(n_kv_heads)
    m = MultiHeadAttention(24, n_heads, n_kv_heads).double()
    with torch.no_grad():
        for b in (m.b_Q, m.b_K, m.b_V, m.b_O):
            b.normal_()
    assert m.W_K.shape == (24, n_kv_heads * 24 // n_heads)
    x = torch.randn(2, 5, 24, dtype=torch.float64)
    mask = causal_mask(5)
    torch.testing.assert_close(m(x, mask=mask), _gqa_oracle(m, x, mask), rtol=1e-10, atol=1e-12)


def test_repeat_kv_grouping_is_interleaved():
    K = torch.arange(2.0).reshape(1, 2, 1, 1)  # kv heads 0 and 1
    got = repeat_kv(K, 3).flatten().tolist()
    assert got == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]  # query heads 0-2 read kv head 0, 3-5 head 1


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_cached_decoding_equals_full_forward(n_kv_heads):
    torch.manual_seed(0)
    m = MultiHeadAttention(16, 4, n_kv_heads).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    full = m(x, mask=causal_mask(7))
    cache = KVCache()
    steps = [m(x[:, :3], mask=causal_mask(3, 3), cache=cache)]  # prefill 3 tokens
    for t in range(3, 7):  # then one token at a time
        steps.append(m(x[:, t:t + 1], mask=causal_mask(1, t + 1), cache=cache))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-12, atol=1e-12)
    assert len(cache) == 7
    assert cache.K.shape == (2, n_kv_heads, 7, 4)
    assert cache.nbytes() == 2 * 2 * n_kv_heads * 7 * 4 * 8
    cache.reset()
    assert len(cache) == 0 and cache.nbytes() == 0


def test_cache_rejects_mismatched_heads():
    cache = KVCache()
    cache.append(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"\(1, 1, 1, 4\).*\(1, 2, 3, 4\)"):
        cache.append(torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4))


def test_causality_of_module_bit_for_bit():
    torch.manual_seed(2)
    m = MultiHeadAttention(16, 4, 2)
    x = torch.randn(1, 6, 16)
    y = x.clone()
    y[:, 4:] = torch.randn(1, 2, 16) * 5
    mask = causal_mask(6)
    assert torch.equal(m(x, mask=mask)[:, :4], m(y, mask=mask)[:, :4])


def test_gradcheck_module_float64():
    torch.manual_seed(3)
    m = MultiHeadAttention(6, 2, 1).double()
    x = torch.randn(1, 3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: m(x, mask=causal_mask(3)), (x,), eps=1e-6, atol=1e-7)


def test_parameter_names_shapes_and_bias_flag():
    m = MultiHeadAttention(32, 8, 2)
    shapes = {n: tuple(p.shape) for n, p in m.named_parameters()}
    assert shapes == {"W_Q": (32, 32), "W_K": (32, 8), "W_V": (32, 8), "W_O": (32, 32),
                      "b_Q": (32,), "b_K": (8,), "b_V": (8,), "b_O": (32,)}
    no_bias = MultiHeadAttention(32, 8, bias=False)
    assert sorted(n for n, _ in no_bias.named_parameters()) == ["W_K", "W_O", "W_Q", "W_V"]
    assert no_bias.b_Q is None
    # heads split d_model, they do not add parameters: 8 heads = 1 head of width d_model
    count = lambda mod: sum(p.numel() for p in mod.parameters())
    assert count(MultiHeadAttention(32, 8)) == count(MultiHeadAttention(32, 1)) == 4 * 32 * 33
    assert count(MultiHeadAttention(32, 8)) == count(_torch_mha(32, 8, 0))


def test_load_torch_weights_transposes_the_linear_layout():
    m = MultiHeadAttention(4, 2, bias=True)
    w = torch.arange(16.0).reshape(4, 4)  # (d_out, d_in)
    b = torch.arange(4.0)
    m.load_torch_weights(w, w + 1, w + 2, w + 3, b, b + 1, b + 2, b + 3)
    assert torch.equal(m.W_Q.data, w.T) and torch.equal(m.W_O.data, (w + 3).T)
    assert torch.equal(m.b_V.data, b + 2)
    with pytest.raises(ValueError, match=r"\(3, 4\).*\(4, 4\)"):
        m.load_torch_weights(w[:3], w, w, w)
    with pytest.raises(ValueError, match="bias=False"):
        MultiHeadAttention(4, 2, bias=False).load_torch_weights(w, w, w, w, q_bias=b)


def test_module_errors_name_the_numbers():
    with pytest.raises(ValueError, match="d_model=10 is not divisible by n_heads=4"):
        MultiHeadAttention(10, 4)
    with pytest.raises(ValueError, match="n_heads=6 is not divisible by n_kv_heads=4"):
        MultiHeadAttention(12, 6, 4)
    m = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"d_model=8.*\(1, 3, 6\)"):
        m(torch.zeros(1, 3, 6))
    with pytest.raises(ValueError, match=r"\(4, 5\).*\(1, 2, 3, 3\)"):
        m(torch.zeros(1, 3, 8), mask=torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="boolean"):
        m(torch.zeros(1, 3, 8), mask=torch.zeros(3, 3))


def test_kv_cache_bytes_published_configurations():
    # 7B-class (Llama-2-7B): 32 layers, 32 KV heads of d_k 128, 4096 tokens, bf16 -> 2 GiB
    assert kv_cache_bytes(n_layers=32, n_kv_heads=32, d_k=128, context=4096, dtype="bf16") == 2 * 2**30
    # 70B-class (Llama-2-70B): 80 layers, 8 KV heads (64 query heads) -> 1.25 GiB
    assert kv_cache_bytes(n_layers=80, n_kv_heads=8, d_k=128, context=4096,
                          dtype=torch.bfloat16) == 1_342_177_280
    # the same 70B as plain multi-head would need 8x more, multi-query 8x less
    gqa = kv_cache_bytes(n_layers=80, n_kv_heads=8, d_k=128, context=4096)
    assert kv_cache_bytes(n_layers=80, n_kv_heads=64, d_k=128, context=4096) == 8 * gqa
    assert kv_cache_bytes(n_layers=80, n_kv_heads=1, d_k=128, context=4096) * 8 == gqa
    assert (kv_cache_bytes(n_layers=2, n_kv_heads=2, d_k=4, context=10, batch=3, dtype=4)
            == 2 * 2 * 2 * 4 * 10 * 3 * 4)


def test_kv_cache_bytes_matches_a_real_cache():
    torch.manual_seed(0)
    m = MultiHeadAttention(16, 4, 2)
    cache = KVCache()
    m(torch.randn(3, 5, 16), cache=cache, mask=causal_mask(5))
    assert cache.nbytes() == kv_cache_bytes(n_layers=1, n_kv_heads=2, d_k=4, context=5, batch=3,
                                           dtype=torch.float32)


def test_kv_cache_bytes_errors():
    with pytest.raises(ValueError, match="context"):
        kv_cache_bytes(n_layers=32, n_kv_heads=32, d_k=128, context=0)
    with pytest.raises(ValueError, match="unknown dtype"):
        kv_cache_bytes(n_layers=32, n_kv_heads=32, d_k=128, context=4096, dtype="float12")


def test_padding_invariance_of_module_with_gqa():
    torch.manual_seed(5)
    m = MultiHeadAttention(16, 4, 2).double()
    x = torch.randn(1, 3, 16, dtype=torch.float64)
    memory = torch.randn(1, 4, 16, dtype=torch.float64)
    padded = torch.cat([memory, 100 * torch.randn(1, 3, 16, dtype=torch.float64)], dim=1)
    out, w = m(x, padded, key_padding_mask=padding_mask([4], 7), return_weights=True)
    torch.testing.assert_close(out, m(x, memory), rtol=1e-12, atol=1e-12)
    assert (w[..., 4:] == 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 4, 3, dtype=torch.float64),
                               rtol=0, atol=1e-12)


# --- the fast path (use_sdpa=True) equals the teaching path -----------------------------------

@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_sdpa_path_equals_teaching_path_with_masks_and_gradients(n_kv_heads):
    from txlearn.masks import causal_mask
    torch.manual_seed(0)
    teach = MultiHeadAttention(16, 4, n_kv_heads=n_kv_heads).double()
    fast = MultiHeadAttention(16, 4, n_kv_heads=n_kv_heads, use_sdpa=True).double()
    fast.load_state_dict(teach.state_dict())
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    mask = causal_mask(5, 5).clone()
    mask[1] = False  # a query with no allowed key: output 0, finite gradients on both paths
    kpm = torch.tensor([[True] * 5, [True, True, True, False, False]])
    outs, grads = [], []
    for module in (teach, fast):
        xi = x.clone().requires_grad_(True)
        out = module(xi, mask=mask, key_padding_mask=kpm)
        out.square().sum().backward()
        outs.append(out.detach())
        grads.append(xi.grad)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-10, atol=1e-12)
    assert torch.isfinite(grads[1]).all()


def test_sdpa_path_rejects_a_mask_that_does_not_broadcast():
    fast = MultiHeadAttention(8, 2, use_sdpa=True)
    with pytest.raises(ValueError, match=r"does not broadcast"):
        fast(torch.randn(1, 3, 8), mask=torch.ones(4, 4, dtype=torch.bool))
