"""Tests of txlearn.complexity: counters against PyTorch modules and closed forms, FLOPs against
torch's FLOP counter, the RNN against nn.RNN, tiled attention against ordinary attention (float64
NumPy and F.scaled_dot_product_attention), and tiled attention's memory growing linearly."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from txlearn import complexity as cx


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


# ---- parameter counts ------------------------------------------------------------------------

@pytest.mark.parametrize("d_model,n_heads,d_ff", [(8, 2, 32), (64, 4, 256), (96, 8, 100)])
def test_layer_params_match_torch_encoder_layer(d_model, n_heads, d_ff):
    layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, batch_first=True)
    expected = sum(p.numel() for p in layer.parameters())
    assert cx.layer_param_count(d_model=d_model, n_heads=n_heads, d_ff=d_ff) == expected
    assert cx.layer_param_closed_form(d_model=d_model, d_ff=d_ff) == expected


def test_closed_form_12_d_squared():
    d = 512
    assert cx.layer_param_closed_form(d_model=d) == 12 * d * d + 13 * d == 3_152_384
    table = cx.layer_param_counts(d_model=d, n_heads=8, d_ff=4 * d)
    weights = sum(v for k, v in table.items() if " W_" in k)
    assert weights == 12 * d * d


def test_sizes_are_keyword_only():
    # a call with positional sizes cannot pass silently with another argument order
    for fn, args in [(cx.layer_param_counts, (64, 8, 256)), (cx.layer_param_count, (64, 8, 256)),
                     (cx.layer_flops, (16, 64, 8, 256)), (cx.attention_flops, (16, 64, 8)),
                     (cx.stack_param_counts, (2, 64, 8, 256, 100)),
                     (cx.paper_transformer_param_counts, (512, 8, 2048)),
                     (cx.layer_param_closed_form, (512,)),
                     (cx.activation_bytes, (1, 16, 64, 8, 256)),
                     (cx.attention_matrix_bytes, (1, 8, 16)),
                     (cx.ffn_flop_share, (64, 256, 16)), (cx.ffn_param_share, (64, 256))]:
        with pytest.raises(TypeError):
            fn(*args)


def test_the_one_counter_is_the_only_one():
    # lesson 05's FFN module no longer keeps its own twin counters
    from txlearn import ffn
    for twin in ("layer_flops", "layer_params", "ffn_params", "ffn_share"):
        assert not hasattr(ffn, twin), twin


def test_stack_params_match_torch_encoder_with_embeddings():
    d, h, f, n, V = 32, 4, 64, 3, 50
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, h, f, batch_first=True), n,
                                norm=nn.LayerNorm(d), enable_nested_tensor=False)
    emb = nn.Embedding(V, d)
    expected = sum(p.numel() for p in enc.parameters()) + emb.weight.numel()
    sizes = dict(n_layers=n, d_model=d, n_heads=h, d_ff=f, n_vocab=V)
    assert sum(cx.stack_param_counts(**sizes, tied=True, final_norm=True).values()) == expected
    untied = cx.stack_param_counts(**sizes, tied=False, final_norm=True)
    assert untied["output head"] == d * V


@pytest.mark.parametrize("d_model,n_heads,d_ff", [(16, 2, 64), (48, 4, 96)])
def test_paper_count_matches_nn_transformer(d_model, n_heads, d_ff):
    model = nn.Transformer(d_model, n_heads, 2, 2, d_ff, batch_first=True)
    counts = cx.paper_transformer_param_counts(d_model=d_model, n_heads=n_heads, d_ff=d_ff,
                                               n_layers=2, n_vocab=1, final_norms=True)
    expected = sum(p.numel() for p in model.parameters()) + d_model  # + a 1-token embedding
    assert sum(counts.values()) == expected


def test_paper_base_and_big_golden():
    base = sum(cx.paper_transformer_param_counts(d_model=512, n_heads=8, d_ff=2048).values())
    big = sum(cx.paper_transformer_param_counts(d_model=1024, n_heads=16, d_ff=4096).values())
    assert base == 63_082_496  # paper: 65M
    assert big == 214_245_376  # paper: 213M
    assert abs(base / 65e6 - 1) < 0.04 and abs(big / 213e6 - 1) < 0.01


def test_gqa_param_counts():
    table = cx.layer_param_counts(d_model=64, n_heads=8, d_ff=128, n_kv_heads=2)
    assert table["attention W_K"] == 64 * 16 and table["attention W_V"] == 64 * 16


def test_counter_errors_name_numbers():
    with pytest.raises(ValueError, match="d_model \\(10\\).*n_heads \\(3\\)"):
        cx.layer_param_counts(d_model=10, n_heads=3, d_ff=40)
    with pytest.raises(ValueError, match="n_heads \\(8\\).*n_kv_heads \\(3\\)"):
        cx.layer_flops(T=16, d_model=64, n_heads=8, d_ff=128, n_kv_heads=3)
    with pytest.raises(ValueError, match="unknown activation"):
        cx.layer_param_counts(d_model=8, n_heads=2, d_ff=8, activation="tanh")
    with pytest.raises(ValueError, match="unknown activation"):
        cx.layer_flops(T=4, d_model=8, n_heads=2, d_ff=8, activation="tanh")


# ---- FLOPs -----------------------------------------------------------------------------------

def explicit_layer_matmuls(x, n_heads, W_Q, W_K, W_V, W_O, W_1, W_2):
    """The layer's matrix products written out (teaching path), to be counted by torch."""
    B, T, d = x.shape
    d_k = d // n_heads
    Q = (x @ W_Q).view(B, T, n_heads, d_k).transpose(1, 2)  # (B, h, T, d_k)
    K = (x @ W_K).view(B, T, n_heads, d_k).transpose(1, 2)  # (B, h, T, d_k)
    V = (x @ W_V).view(B, T, n_heads, d_k).transpose(1, 2)  # (B, h, T, d_k)
    A = torch.softmax(Q @ K.transpose(-1, -2) / math.sqrt(d_k), dim=-1)  # (B, h, T, T)
    H = (A @ V).transpose(1, 2).reshape(B, T, d)  # (B, T, d)
    y = H @ W_O
    return torch.relu(y @ W_1) @ W_2


@pytest.mark.parametrize("T,d_model,n_heads,d_ff", [(7, 16, 2, 48), (33, 32, 4, 128)])
def test_layer_flops_match_torch_flop_counter(T, d_model, n_heads, d_ff):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, T, d_model, generator=g)
    Ws = [torch.randn(d_model, d_model, generator=g) for _ in range(4)]
    W_1, W_2 = torch.randn(d_model, d_ff, generator=g), torch.randn(d_ff, d_model, generator=g)
    with FlopCounterMode(display=False) as counter:
        explicit_layer_matmuls(x, n_heads, *Ws, W_1, W_2)
    total = sum(cx.layer_flops(T=T, d_model=d_model, n_heads=n_heads, d_ff=d_ff).values())
    assert total == counter.get_total_flops()


def test_attention_flops_closed_form_and_heads_cancel():
    T, d = 128, 64
    for h in (1, 4, 16):
        assert cx.attention_flops(T=T, d_model=d, n_heads=h) == 8 * T * d * d + 4 * T * T * d == 8_388_608
    table = cx.layer_flops(T=T, d_model=d, n_heads=4, d_ff=256)
    assert table["scores Q K^T"] == table["weighted sum A V"] == 2 * T * T * d


@pytest.mark.parametrize("L,S", [(1, 1), (5, 5), (3, 8), (8, 3), (1, 100)])
def test_visible_pairs_count_the_causal_mask(L, S):
    from txlearn.masks import causal_mask
    assert cx.visible_pairs(L, S, causal=True) == int(causal_mask(L, S).sum())
    assert cx.visible_pairs(L, S, causal=False) == L * S


def test_causal_and_cached_flops():
    sizes = dict(d_model=64, n_heads=8, d_ff=256)
    full = cx.layer_flops(T=10, **sizes)
    causal = cx.layer_flops(T=10, causal=True, **sizes)
    assert causal["scores Q K^T"] == 2 * 55 * 64 and full["scores Q K^T"] == 2 * 100 * 64
    # one new token after 99 cached ones: 100 keys, all visible; projections of 1 query
    step = cx.layer_flops(T=1, S=100, causal=True, **sizes)
    assert step["scores Q K^T"] == 2 * 100 * 64 and step["Q projection"] == 2 * 64 * 64
    assert step["FFN W_1"] == 2 * 64 * 256


def test_memory_formulas():
    assert cx.attention_matrix_bytes(B=2, n_heads=8, L=1024) == 2 * 8 * 1024 * 1024 * 4 == 67_108_864
    rows = cx.activation_bytes(B=1, T=100, d_model=64, n_heads=4, d_ff=256)
    assert rows["scores"] == rows["softmax weights"] == 4 * 100 * 100 * 4
    assert rows["FFN hidden (2)"] == 2 * 100 * 256 * 4
    with pytest.raises(ValueError, match="T=0"):
        cx.activation_bytes(B=1, T=0, d_model=64, n_heads=4, d_ff=256)


def test_format_table_has_total():
    text = cx.format_table({"a": 1000, "b": 234}, unit="FLOPs")
    assert text.splitlines()[-1].split()[:2] == ["total", "1,234"]


# ---- measuring -------------------------------------------------------------------------------

def test_peak_memory_sees_torch_allocations():
    n = 1 << 20  # 4 MiB of float32
    peak = cx.peak_memory_bytes(lambda: torch.ones(n) + 1.0)
    assert 2 * 4 * n <= peak <= 2 * 4 * n + 65536  # the ones, and the sum alive at once


def test_peak_memory_of_attention_matrix_grows_quadratically():
    def make(T):
        Q = torch.randn(T, 16)
        return lambda: torch.softmax(Q @ Q.T, dim=-1) @ Q
    peaks = cx.measure(make, [256, 512, 1024], what="memory")
    assert 1.9 < cx.fit_loglog_slope([256, 512, 1024], peaks) < 2.05


def test_fit_loglog_slope_exact_power_law_and_errors():
    x = np.array([1.0, 2.0, 4.0, 8.0])
    assert cx.fit_loglog_slope(x, 3 * x**1.5) == pytest.approx(1.5, abs=1e-12)
    with pytest.raises(ValueError, match="positive"):
        cx.fit_loglog_slope([1, 2], [0, 1])
    with pytest.raises(ValueError, match=r"\(3,\) and \(2,\)"):
        cx.fit_loglog_slope([1, 2, 3], [1, 2])


def test_time_callable_counts_calls_and_returns_seconds():
    calls = []
    t = cx.time_callable(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and 0.0 <= t < 1.0
    with pytest.raises(ValueError, match="repeats"):
        cx.time_callable(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="reduce must be 'min' or 'median', got 'mean'"):
        cx.time_callable(lambda: None, reduce="mean")


def test_time_callable_cpu_clock_counts_work_not_waiting():
    """clock="cpu" reads the thread's CPU time: a call that sleeps costs almost nothing on it,
    while the wall clock sees the whole sleep."""
    import time
    wall = cx.time_callable(lambda: time.sleep(0.05), repeats=2, warmup=0)
    cpu = cx.time_callable(lambda: time.sleep(0.05), repeats=2, warmup=0, clock="cpu")
    assert wall >= 0.05 and cpu < 0.01
    busy = cx.time_callable(lambda: sum(range(200_000)), repeats=2, warmup=0, clock="cpu")
    assert busy > 0                                         # and it does count work
    with pytest.raises(ValueError, match="clock must be 'wall' or 'cpu', got 'process'"):
        cx.time_callable(lambda: None, clock="process")


def test_time_callable_min_and_median_with_a_fake_clock(monkeypatch):
    # a fake clock: the warmup reads it once; the three timed calls take 3, 1, 2 "seconds"
    ticks = iter([0, 10, 13, 20, 21, 30, 32] * 2)
    monkeypatch.setattr(cx.time, "perf_counter", lambda: next(ticks))
    assert cx.time_callable(lambda: None, repeats=3, warmup=1) == 1
    assert cx.time_callable(lambda: None, repeats=3, warmup=1, reduce="median") == 2


# ---- recurrent layer -------------------------------------------------------------------------

def test_recurrent_layer_equals_nn_rnn():
    torch.manual_seed(0)
    rnn = nn.RNN(6, 10, batch_first=True).double()
    x = torch.randn(3, 9, 6, dtype=torch.float64)
    expected, _ = rnn(x)
    got = cx.recurrent_layer(x, rnn.weight_ih_l0.T, rnn.weight_hh_l0.T, rnn.bias_ih_l0 + rnn.bias_hh_l0)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_recurrent_layer_shape_error():
    with pytest.raises(ValueError, match=r"\(2, 5, 4\).*\(3, 8\)"):
        cx.recurrent_layer(torch.randn(2, 5, 4), torch.randn(3, 8), torch.randn(8, 8), torch.zeros(8))


# ---- online softmax and tiled attention --------------------------------------------------------

def test_online_update_two_blocks_equals_softmax_over_both():
    rng = np.random.default_rng(0)
    s1, s2 = rng.normal(size=(4, 3)) * 5, rng.normal(size=(4, 5)) * 5 + 3
    V1, V2 = rng.normal(size=(3, 2)), rng.normal(size=(5, 2))
    m, l, acc = np.full(4, -np.inf), np.zeros(4), np.zeros((4, 2))
    m, l, acc = cx.online_softmax_update_np(m, l, acc, s1, V1)
    m, l, acc = cx.online_softmax_update_np(m, l, acc, s2, V2)
    s = np.concatenate([s1, s2], axis=1)
    w = np.exp(s - s.max(axis=1, keepdims=True))
    np.testing.assert_allclose(m, s.max(axis=1), rtol=0, atol=0)
    np.testing.assert_allclose(l, w.sum(axis=1), rtol=1e-13)
    np.testing.assert_allclose(acc / l[:, None], (w / w.sum(1, keepdims=True)) @ np.vstack([V1, V2]),
                               rtol=1e-12, atol=1e-13)
    mt, lt, acct = cx.online_softmax_update(torch.tensor(m), torch.tensor(l), torch.tensor(acc),
                                            torch.tensor(s1), torch.tensor(V1))
    m2, l2, acc2 = cx.online_softmax_update_np(m, l, acc, s1, V1)
    np.testing.assert_allclose(acct.numpy(), acc2, rtol=1e-13)
    np.testing.assert_allclose(lt.numpy(), l2, rtol=1e-13)


def test_online_update_golden_values():
    m, l, acc = cx.online_softmax_update_np(np.array([1.0]), np.array([2.0]), np.array([[4.0]]),
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
    np.testing.assert_allclose(cx.tiled_attention_np(Q, K, V, mask, block_size), expected,
                               rtol=1e-10, atol=1e-12)
    t = [torch.tensor(a) for a in (Q, K, V)]
    tmask = None if mask is None else torch.tensor(mask)
    got = cx.tiled_attention(*t, tmask, block_size)
    torch.testing.assert_close(got, torch.tensor(expected), rtol=1e-10, atol=1e-12)
    sdpa = F.scaled_dot_product_attention(*t, attn_mask=tmask)
    torch.testing.assert_close(got, sdpa, rtol=1e-10, atol=1e-12)


def test_tiled_attention_float32_and_rectangular():
    torch.manual_seed(0)
    Q, K, V = torch.randn(2, 5, 8), torch.randn(2, 37, 8), torch.randn(2, 37, 4)
    mask = torch.rand(5, 37) > 0.3
    torch.testing.assert_close(cx.tiled_attention(Q, K, V, mask, block_size=10),
                               F.scaled_dot_product_attention(Q, K, V, attn_mask=mask),
                               rtol=1e-5, atol=1e-6)


def test_tiled_attention_fully_masked_row_is_zero():
    rng = np.random.default_rng(1)
    Q, K, V = rng.normal(size=(4, 4)), rng.normal(size=(6, 4)), rng.normal(size=(6, 3)) + 5
    mask = np.ones((4, 6), dtype=bool)
    mask[2] = False
    out = cx.tiled_attention_np(Q, K, V, mask, block_size=4)
    assert np.all(out[2] == 0.0) and np.all(np.isfinite(out))
    out_t = cx.tiled_attention(*(torch.tensor(a) for a in (Q, K, V)), torch.tensor(mask), 4)
    assert torch.all(out_t[2] == 0.0) and torch.isfinite(out_t).all()
    np.testing.assert_allclose(out, attention_ref_np(Q, K, V, mask), rtol=1e-12, atol=1e-12)


def test_tiled_attention_errors():
    with pytest.raises(ValueError, match=r"Q \(3, 4\), K \(5, 2\)"):
        cx.tiled_attention_np(np.zeros((3, 4)), np.zeros((5, 2)), np.zeros((5, 2)))
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        cx.tiled_attention(torch.zeros(3, 4), torch.zeros(5, 4), torch.zeros(5, 2), block_size=0)


def test_tiled_attention_memory_linear_in_T():
    def make(T, tiled):
        Q = torch.randn(T, 32)
        if tiled:
            return lambda: cx.tiled_attention(Q, Q, Q, block_size=128)
        return lambda: torch.softmax(Q @ Q.T / math.sqrt(32), dim=-1) @ Q
    Ts = [512, 1024, 2048]
    tiled = cx.measure(lambda T: make(T, True), Ts, what="memory")
    full = cx.measure(lambda T: make(T, False), Ts, what="memory")
    assert 0.9 < cx.fit_loglog_slope(Ts, tiled) < 1.1
    assert 1.8 < cx.fit_loglog_slope(Ts, full) < 2.05
    assert tiled[-1] < full[-1] / 5


# ---- path length ------------------------------------------------------------------------------

@pytest.mark.parametrize("T", [2, 5, 40])
def test_matmul_path_length_rnn_grows_attention_constant(T):
    torch.manual_seed(0)
    d = 4
    x = torch.randn(1, T, d, requires_grad=True)
    W_x, W_h, b = torch.randn(d, d), torch.randn(d, d), torch.zeros(d)
    h = cx.recurrent_layer(x, W_x, W_h, b)
    assert cx.matmul_path_length(h[:, -1], x) == T  # x W_x, then T - 1 steps of h W_h
    Q, K, V = x @ W_x, x @ W_h, x @ W_x  # (1, T, d)
    out = torch.softmax(Q @ K.transpose(-1, -2), dim=-1) @ V
    assert cx.matmul_path_length(out[:, -1], x) == 3  # projection, scores, weighted sum


def test_matmul_path_length_errors():
    x = torch.randn(3, requires_grad=True)
    y = torch.randn(3, requires_grad=True)
    with pytest.raises(ValueError, match="does not depend"):
        cx.matmul_path_length((y * 2).sum(), x)
    with pytest.raises(ValueError, match="leaf"):
        cx.matmul_path_length((x * 2).sum(), x * 2)
