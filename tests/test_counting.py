"""Tests of txlearn.counting: parameter counts against PyTorch modules and closed forms, FLOPs
against torch's FLOP counter (explicit products and a whole TransformerLayer), memory formulas."""

import math

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from txlearn import counting


# ---- parameter counts ------------------------------------------------------------------------

@pytest.mark.parametrize("d_model,n_heads,d_ff", [(8, 2, 32), (64, 4, 256), (96, 8, 100)])
def test_layer_params_match_torch_encoder_layer(d_model, n_heads, d_ff):
    layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, batch_first=True)
    expected = sum(p.numel() for p in layer.parameters())
    assert counting.layer_param_count(d_model=d_model, n_heads=n_heads, d_ff=d_ff) == expected
    assert counting.layer_param_closed_form(d_model=d_model, d_ff=d_ff) == expected


def test_closed_form_12_d_squared():
    d = 512
    assert counting.layer_param_closed_form(d_model=d) == 12 * d * d + 13 * d == 3_152_384
    table = counting.layer_param_counts(d_model=d, n_heads=8, d_ff=4 * d)
    weights = sum(v for k, v in table.items() if " W_" in k)
    assert weights == 12 * d * d


def test_sizes_are_keyword_only():
    # a call with positional sizes cannot pass silently with another argument order
    for fn, args in [(counting.layer_param_counts, (64, 8, 256)), (counting.layer_param_count, (64, 8, 256)),
                     (counting.layer_flops, (16, 64, 8, 256)), (counting.attention_flops, (16, 64, 8)),
                     (counting.stack_param_counts, (2, 64, 8, 256, 100)),
                     (counting.paper_transformer_param_counts, (512, 8, 2048)),
                     (counting.layer_param_closed_form, (512,)),
                     (counting.activation_bytes, (1, 16, 64, 8, 256)),
                     (counting.attention_matrix_bytes, (1, 8, 16)),
                     (counting.ffn_flop_share, (64, 256, 16)), (counting.ffn_param_share, (64, 256))]:
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
    assert sum(counting.stack_param_counts(**sizes, tied=True, final_norm=True).values()) == expected
    untied = counting.stack_param_counts(**sizes, tied=False, final_norm=True)
    assert untied["output head"] == d * V


@pytest.mark.parametrize("d_model,n_heads,d_ff", [(16, 2, 64), (48, 4, 96)])
def test_paper_count_matches_nn_transformer(d_model, n_heads, d_ff):
    model = nn.Transformer(d_model, n_heads, 2, 2, d_ff, batch_first=True)
    counts = counting.paper_transformer_param_counts(d_model=d_model, n_heads=n_heads, d_ff=d_ff,
                                               n_layers=2, n_vocab=1, final_norms=True)
    expected = sum(p.numel() for p in model.parameters()) + d_model  # + a 1-token embedding
    assert sum(counts.values()) == expected


def test_paper_base_and_big_golden():
    base = sum(counting.paper_transformer_param_counts(d_model=512, n_heads=8, d_ff=2048).values())
    big = sum(counting.paper_transformer_param_counts(d_model=1024, n_heads=16, d_ff=4096).values())
    assert base == 63_082_496  # paper: 65M
    assert big == 214_245_376  # paper: 213M
    assert abs(base / 65e6 - 1) < 0.04 and abs(big / 213e6 - 1) < 0.01


def test_gqa_param_counts():
    table = counting.layer_param_counts(d_model=64, n_heads=8, d_ff=128, n_kv_heads=2)
    assert table["attention W_K"] == 64 * 16 and table["attention W_V"] == 64 * 16


def test_counter_errors_name_numbers():
    with pytest.raises(ValueError, match="d_model \\(10\\).*n_heads \\(3\\)"):
        counting.layer_param_counts(d_model=10, n_heads=3, d_ff=40)
    with pytest.raises(ValueError, match="n_heads \\(8\\).*n_kv_heads \\(3\\)"):
        counting.layer_flops(T=16, d_model=64, n_heads=8, d_ff=128, n_kv_heads=3)
    with pytest.raises(ValueError, match="unknown activation"):
        counting.layer_param_counts(d_model=8, n_heads=2, d_ff=8, activation="tanh")
    with pytest.raises(ValueError, match="unknown activation"):
        counting.layer_flops(T=4, d_model=8, n_heads=2, d_ff=8, activation="tanh")


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
    total = sum(counting.layer_flops(T=T, d_model=d_model, n_heads=n_heads, d_ff=d_ff).values())
    assert total == counter.get_total_flops()


# FlopCounterMode (torch.utils.flop_counter) is the independent oracle for a whole layer. What it
# counts: the matrix products aten.mm, addmm, bmm and baddbmm at 2 m k n FLOPs each (2 x MACs, the
# course's convention; addmm's bias add is not counted), convolutions, and SDPA's CUDA kernels.
# What it does not count: everything element-wise (softmax, the 1/sqrt(d_k) scale, masking,
# LayerNorm, the activations, bias and residual adds, dropout), which layer_flops leaves out too,
# and SDPA's CPU kernel (_scaled_dot_product_flash_attention_for_cpu has no formula), so the fused
# path (fused=True) on a CPU would hide the scores and A V: the teaching path is counted here.
# The teaching path computes every one of the L S scores and masks afterwards, so a causal mask
# is counted as causal=False (causal=True counts what a kernel that skips masked blocks does).
@pytest.mark.parametrize("T,d_model,n_heads,d_ff,extra", [
    (7, 16, 2, 48, {}),
    (33, 32, 4, 128, {"activation": "gelu"}),
    (12, 32, 8, 64, {"n_kv_heads": 2, "activation": "swiglu"}),
    (20, 24, 3, 40, {"n_kv_heads": 1, "bias": False}),
])
def test_layer_flops_match_flop_counter_on_a_whole_transformer_layer(T, d_model, n_heads, d_ff,
                                                                     extra):
    from txlearn.layer import TransformerLayer
    from txlearn.masks import causal_mask
    torch.manual_seed(0)
    B = 2
    layer = TransformerLayer(d_model, n_heads, d_ff, **extra).eval()   # fused=False: counted
    x = torch.randn(B, T, d_model)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        layer(x, mask=causal_mask(T))
    sizes = {k: v for k, v in extra.items() if k != "bias"}
    rows = counting.layer_flops(T=T, d_model=d_model, n_heads=n_heads, d_ff=d_ff, **sizes)
    assert counter.get_total_flops() == B * sum(rows.values())      # layer_flops is per sequence
    by_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    attention_products = rows["scores Q K^T"] + rows["weighted sum A V"]
    assert by_op.pop("aten.bmm") == B * attention_products          # per head, batched
    assert sum(by_op.values()) == B * (sum(rows.values()) - attention_products)  # x @ W


def test_attention_flops_closed_form_and_heads_cancel():
    T, d = 128, 64
    for h in (1, 4, 16):
        assert counting.attention_flops(T=T, d_model=d, n_heads=h) == 8 * T * d * d + 4 * T * T * d == 8_388_608
    table = counting.layer_flops(T=T, d_model=d, n_heads=4, d_ff=256)
    assert table["scores Q K^T"] == table["weighted sum A V"] == 2 * T * T * d


@pytest.mark.parametrize("L,S", [(1, 1), (5, 5), (3, 8), (8, 3), (1, 100)])
def test_visible_pairs_count_the_causal_mask(L, S):
    from txlearn.masks import causal_mask
    assert counting.visible_pairs(L, S, causal=True) == int(causal_mask(L, S).sum())
    assert counting.visible_pairs(L, S, causal=False) == L * S


def test_causal_and_cached_flops():
    sizes = dict(d_model=64, n_heads=8, d_ff=256)
    full = counting.layer_flops(T=10, **sizes)
    causal = counting.layer_flops(T=10, causal=True, **sizes)
    assert causal["scores Q K^T"] == 2 * 55 * 64 and full["scores Q K^T"] == 2 * 100 * 64
    # one new token after 99 cached ones: 100 keys, all visible; projections of 1 query
    step = counting.layer_flops(T=1, S=100, causal=True, **sizes)
    assert step["scores Q K^T"] == 2 * 100 * 64 and step["Q projection"] == 2 * 64 * 64
    assert step["FFN W_1"] == 2 * 64 * 256


def test_memory_formulas():
    assert counting.attention_matrix_bytes(B=2, n_heads=8, L=1024) == 2 * 8 * 1024 * 1024 * 4 == 67_108_864
    rows = counting.activation_bytes(B=1, T=100, d_model=64, n_heads=4, d_ff=256)
    assert rows["scores"] == rows["softmax weights"] == 4 * 100 * 100 * 4
    assert rows["FFN hidden (2)"] == 2 * 100 * 256 * 4
    with pytest.raises(ValueError, match="T=0"):
        counting.activation_bytes(B=1, T=0, d_model=64, n_heads=4, d_ff=256)


def test_format_table_has_total():
    text = counting.format_table({"a": 1000, "b": 234}, unit="FLOPs")
    assert text.splitlines()[-1].split()[:2] == ["total", "1,234"]


# ---- training FLOPs and decode bytes (lesson 08) ----------------------------------------------

@pytest.mark.parametrize("extra", [{}, {"n_kv_heads": 2, "activation": "swiglu", "bias": False}])
def test_training_flops_match_flop_counter_with_a_backward_pass(extra):
    # Oracle: FlopCounterMode around the forward *and* backward pass of two teaching-path layers
    # whose input needs its gradient (as it does after an embedding). Each product's backward is
    # two products of its size, so the step is 3 x the forward.
    from txlearn.layer import TransformerLayer
    from txlearn.masks import causal_mask
    torch.manual_seed(0)
    B, T, d_model, n_heads, d_ff = 2, 9, 16, 4, 40
    layers = nn.Sequential(*(TransformerLayer(d_model, n_heads, d_ff, dropout=0.0, **extra)
                             for _ in range(2)))
    x = torch.randn(B, T, d_model, requires_grad=True)
    with FlopCounterMode(display=False) as forward_only:
        out = x
        for layer in layers:
            out = layer(out, mask=causal_mask(T))
    with FlopCounterMode(display=False) as backward_only:
        out.backward(torch.randn_like(out))
    sizes = {k: v for k, v in extra.items() if k != "bias"}
    step = counting.training_flops(n_layers=2, T=T, d_model=d_model, n_heads=n_heads, d_ff=d_ff,
                                   **sizes)
    assert forward_only.get_total_flops() == B * step["forward"]
    assert backward_only.get_total_flops() == B * step["backward"] == 2 * B * step["forward"]


def test_six_n_per_token_plus_attention_is_exact_for_the_matrix_weights():
    # N = the weights of the products of a bias-free layer: 4 d_model^2 + 2 d_model d_ff
    T, d_model, n_heads, d_ff, n_layers = 64, 32, 4, 128, 3
    N = n_layers * (4 * d_model ** 2 + 2 * d_model * d_ff)
    for causal in (False, True):
        exact = counting.training_flops(n_layers=n_layers, T=T, d_model=d_model, n_heads=n_heads,
                                        d_ff=d_ff, causal=causal)
        per_token = counting.training_flops_per_token(n_params=N, n_layers=n_layers, T=T,
                                                      d_model=d_model, causal=causal)
        assert sum(exact.values()) == pytest.approx(T * per_token, rel=1e-12)
    # the attention term is 12 n_layers T d_model: at T = 6 d_model per layer it equals 6 N
    # for d_ff = 4 d_model (N = 12 d_model^2 per layer)
    assert counting.training_flops_per_token(n_params=0, n_layers=1, T=6 * 64, d_model=64) == \
        6 * 12 * 64 ** 2


def test_decode_bytes_golden_for_smollm2_and_gqa_divides_only_the_cache():
    # SmolLM2-135M: 134,515,008 weights in bf16 (2 bytes), 30 layers, 3 kv heads of 64, 8192 tokens
    rows = counting.decode_bytes_per_token(n_params=134_515_008, n_layers=30, n_kv_heads=3, d_k=64,
                                           context=8192)
    assert rows == {"weights": 2 * 134_515_008, "KV cache": 2 * 30 * 3 * 64 * 8192 * 2}
    mha = counting.decode_bytes_per_token(n_params=134_515_008, n_layers=30, n_kv_heads=9, d_k=64,
                                          context=8192)
    assert mha["KV cache"] == 3 * rows["KV cache"] and mha["weights"] == rows["weights"]
    batched = counting.decode_bytes_per_token(n_params=1000, n_layers=1, n_kv_heads=1, d_k=4,
                                              context=10, batch=4, weight_dtype="float32")
    assert batched == {"weights": 1000.0, "KV cache": 2 * 4 * 10 * 2}   # weights shared by 4
    with pytest.raises(ValueError, match="n_params"):
        counting.decode_bytes_per_token(n_params=-1, n_layers=1, n_kv_heads=1, d_k=1, context=1)
