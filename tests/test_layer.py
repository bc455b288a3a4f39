"""Tests of txlearn.layer: equality with nn.TransformerEncoderLayer / nn.TransformerEncoder /
nn.TransformerDecoderLayer with copied weights, a float64 NumPy reference of the layer, the KV cache, weights returned, embeddings
and the output head, and parameter counts against the counters of txlearn.counting."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from txlearn import counting
from txlearn.layer import (OutputHead, TokenEmbedding, TransformerDecoderLayer, TransformerLayer,
                           TransformerStack)
from txlearn.masks import causal_mask
from txlearn.positional import sinusoidal_encoding_np

D, H, F_ = 16, 4, 40


def torch_layer(norm_first, activation, seed=0):
    torch.manual_seed(seed)
    ref = nn.TransformerEncoderLayer(D, H, F_, dropout=0.0, activation=activation,
                                     batch_first=True, norm_first=norm_first).double().eval()
    with torch.no_grad():  # non-trivial norm parameters, so a swapped norm would show
        for norm in (ref.norm1, ref.norm2):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    return ref


def inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 6, D, generator=g, dtype=torch.float64)
    real = torch.tensor([[True] * 6, [True] * 4 + [False] * 2, [True] * 2 + [False] * 4])
    return x, real


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("padded", [False, True])
def test_layer_equals_torch_encoder_layer(norm_first, activation, padded):
    ref = torch_layer(norm_first, activation)
    ours = TransformerLayer.from_torch(ref).eval()
    assert ours.norm_first is norm_first
    x, real = inputs()
    with torch.no_grad():
        if padded:
            expected = ref(x, src_key_padding_mask=~real)  # PyTorch: True = ignore
            got = ours(x, key_padding_mask=real)  # txlearn: True = real token
        else:
            expected, got = ref(x), ours(x)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_layer_equals_torch_with_causal_mask():
    ref = torch_layer(False, "relu")
    ours = TransformerLayer.from_torch(ref).eval()
    x, _ = inputs()
    T = x.shape[1]
    with torch.no_grad():
        expected = ref(x, src_mask=~causal_mask(T))  # PyTorch's boolean mask: True = blocked
        got = ours(x, mask=causal_mask(T))
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("norm_first", [False, True])
def test_stack_equals_torch_encoder(norm_first):
    torch.manual_seed(3)
    base = nn.TransformerEncoderLayer(D, H, F_, dropout=0.0, batch_first=True, norm_first=norm_first)
    ref = nn.TransformerEncoder(base, 3, norm=nn.LayerNorm(D) if norm_first else None,
                                enable_nested_tensor=False).double().eval()
    ours = TransformerStack(3, D, H, F_, final_norm=norm_first, norm_first=norm_first).double().eval()
    for mine, theirs in zip(ours.layers, ref.layers):
        mine.load_state_dict(TransformerLayer.from_torch(theirs).state_dict())
    if norm_first:
        ours.final_norm.gamma.data.copy_(ref.norm.weight)
        ours.final_norm.beta.data.copy_(ref.norm.bias)
    x, real = inputs(5)
    with torch.no_grad():
        torch.testing.assert_close(ours(x, key_padding_mask=real),
                                   ref(x, src_key_padding_mask=~real), rtol=1e-12, atol=1e-12)


def layer_np(x, p, n_heads, eps=1e-5, norm_first=False):
    """Independent float64 NumPy reference of one layer (ReLU FFN, biases, no mask)."""
    def ln(v, g, b):
        mu = v.mean(-1, keepdims=True)
        return g * (v - mu) / np.sqrt(((v - mu) ** 2).mean(-1, keepdims=True) + eps) + b

    def attn(v):
        T, d = v.shape
        d_k = d // n_heads
        Q = (v @ p["W_Q"] + p["b_Q"]).reshape(T, n_heads, d_k).transpose(1, 0, 2)
        K = (v @ p["W_K"] + p["b_K"]).reshape(T, n_heads, d_k).transpose(1, 0, 2)
        V = (v @ p["W_V"] + p["b_V"]).reshape(T, n_heads, d_k).transpose(1, 0, 2)
        s = Q @ K.transpose(0, 2, 1) / math.sqrt(d_k)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        return (w @ V).transpose(1, 0, 2).reshape(T, d) @ p["W_O"] + p["b_O"]

    def ffn(v):
        return np.maximum(v @ p["W_1"] + p["b_1"], 0) @ p["W_2"] + p["b_2"]

    if norm_first:
        x = x + attn(ln(x, p["gamma1"], p["beta1"]))
        return x + ffn(ln(x, p["gamma2"], p["beta2"]))
    x = ln(x + attn(x), p["gamma1"], p["beta1"])
    return ln(x + ffn(x), p["gamma2"], p["beta2"])


@pytest.mark.parametrize("norm_first", [False, True])
def test_layer_equals_numpy_reference(norm_first):
    torch.manual_seed(7)
    layer = TransformerLayer(D, H, F_, norm_first=norm_first).double().eval()
    with torch.no_grad():
        for prm in layer.parameters():
            prm.normal_(0, 0.3)
    sd = {k.split(".")[-1] + ("1" if k.startswith("norm1") else "2" if k.startswith("norm2") else ""):
          v.numpy() for k, v in layer.state_dict().items()}
    x = np.random.default_rng(0).normal(size=(5, D))
    with torch.no_grad():
        got = layer(torch.tensor(x)[None])[0].numpy()
    np.testing.assert_allclose(got, layer_np(x, sd, H, norm_first=norm_first), rtol=1e-10, atol=1e-12)


def test_output_shape_equals_input_shape_and_weights_returned():
    layer = TransformerLayer(D, H, F_, n_kv_heads=2, activation="swiglu").eval()
    x = torch.randn(2, 9, D)
    out, weights = layer(x, mask=causal_mask(9), return_weights=True)
    assert out.shape == x.shape
    assert weights.shape == (2, H, 9, 9)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, H, 9), rtol=0, atol=1e-6)
    assert torch.all(weights[..., 0, 1:] == 0)  # causal: first query sees only key 0


def test_stack_returns_weights_per_layer():
    stack = TransformerStack(2, D, H, F_).eval()
    out, weights = stack(torch.randn(1, 5, D), return_weights=True)
    assert out.shape == (1, 5, D) and len(weights) == 2 and weights[1].shape == (1, H, 5, 5)


def test_kv_cache_decoding_equals_full_causal_pass():
    torch.manual_seed(0)
    stack = TransformerStack(2, D, H, F_, norm_first=True, final_norm=True, n_kv_heads=2).double().eval()
    x = torch.randn(2, 7, D, dtype=torch.float64)
    with torch.no_grad():
        full = stack(x, mask=causal_mask(7))
        cache = stack.new_cache()
        first = stack(x[:, :4], mask=causal_mask(4), cache=cache)  # prompt of 4 positions
        steps = [stack(x[:, t:t + 1], mask=causal_mask(1, t + 1), cache=cache) for t in range(4, 7)]
    torch.testing.assert_close(torch.cat([first] + steps, dim=1), full, rtol=1e-12, atol=1e-12)
    assert len(cache[0]) == 7


def test_dropout_only_in_train_mode():
    layer = TransformerLayer(D, H, F_, dropout=0.5)
    x = torch.randn(2, 4, D)
    layer.eval()
    torch.testing.assert_close(layer(x), layer(x), rtol=0, atol=0)
    layer.train()
    torch.manual_seed(0)
    a = layer(x)
    assert (a - layer(x)).abs().max() > 1e-3


def test_layer_errors():
    with pytest.raises(ValueError, match="d_model=16.*got \\(2, 3, 8\\)"):
        TransformerLayer(D, H, F_)(torch.randn(2, 3, 8))
    with pytest.raises(ValueError, match="dropout must be in \\[0, 1\\), got 1.5"):
        TransformerLayer(D, H, F_, dropout=1.5)
    with pytest.raises(ValueError, match="cache has 1 entries for 2 layers"):
        TransformerStack(2, D, H, F_)(torch.randn(1, 3, D), cache=[None])
    with pytest.raises(ValueError, match="n_layers must be >= 1, got 0"):
        TransformerStack(0, D, H, F_)


@pytest.mark.parametrize("kw", [dict(), dict(n_kv_heads=2), dict(activation="swiglu"),
                                dict(bias=False), dict(activation="gelu", n_kv_heads=1)])
def test_param_count_matches_counter(kw):
    layer = TransformerLayer(32, 8, 72, **kw)
    expected = counting.layer_param_count(d_model=32, n_heads=8, d_ff=72, **kw)
    assert sum(p.numel() for p in layer.parameters()) == expected


def test_model_param_count_tied_and_untied():
    V, T = 30, 12
    emb = TokenEmbedding(V, D, positional="learned", max_len=T)
    stack = TransformerStack(2, D, H, F_, norm_first=True, final_norm=True)
    for tied in (True, False):
        head = OutputHead(D, V, tie_to=emb if tied else None)
        model = nn.ModuleList([emb, stack, head])
        expected = sum(counting.stack_param_counts(n_layers=2, d_model=D, n_heads=H, d_ff=F_,
                                                   n_vocab=V, tied=tied, final_norm=True,
                                                   max_len=T).values())
        assert sum(p.numel() for p in model.parameters()) == expected


def test_token_embedding_scale_and_sinusoidal_positions():
    torch.manual_seed(0)
    emb = TokenEmbedding(11, 8, positional="sinusoidal", scale=True).double()
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    expected = emb.W_E.detach().numpy()[ids[0]] * math.sqrt(8) + sinusoidal_encoding_np(5, 8)
    np.testing.assert_allclose(emb(ids)[0].detach().numpy(), expected, rtol=1e-12, atol=1e-12)
    later = emb(ids[:, 3:], start=3)[0].detach().numpy()  # positions 3 and 4, as with a cache
    np.testing.assert_allclose(later, expected[3:], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"\[0, 11\).*\[1, 12\]"):
        emb(torch.tensor([[1, 12]]))


def test_output_head_tied_uses_embedding_transpose():
    emb = TokenEmbedding(9, 6, positional=None)
    head = OutputHead(6, 9, bias=True, tie_to=emb)
    assert head.W_E is emb.W_E
    x = torch.randn(2, 3, 6)
    torch.testing.assert_close(head(x), x @ emb.W_E.T + head.b_U, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"\(9, 6\).*\(10, 6\)"):
        OutputHead(6, 10, tie_to=emb)


def torch_decoder_layer(norm_first, activation, seed=0):
    torch.manual_seed(seed)
    ref = nn.TransformerDecoderLayer(D, H, F_, dropout=0.0, activation=activation,
                                     batch_first=True, norm_first=norm_first).double().eval()
    with torch.no_grad():  # non-trivial norms and biases, so a swapped one would show
        for norm in (ref.norm1, ref.norm2, ref.norm3):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
        for mha in (ref.self_attn, ref.multihead_attn):
            mha.in_proj_bias.uniform_(-0.5, 0.5)
    return ref


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("padded", [False, True])
def test_decoder_layer_equals_torch_decoder_layer(norm_first, activation, padded):
    ref = torch_decoder_layer(norm_first, activation)
    ours = TransformerDecoderLayer.from_torch(ref).eval()
    assert ours.norm_first is norm_first
    memory, real = inputs()                                  # encoder output (3, 6, D), S = 6
    x = torch.randn(3, 4, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        expected = ref(x, memory, tgt_mask=~causal_mask(4),   # PyTorch: True = blocked
                       memory_key_padding_mask=~real if padded else None)
        got, w_self, w_cross = ours(x, memory, mask=causal_mask(4),
                                    memory_key_padding_mask=real if padded else None,
                                    return_weights=True)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert w_self.shape == (3, H, 4, 4) and w_cross.shape == (3, H, 4, 6)
    torch.testing.assert_close(w_cross.sum(-1), torch.ones(3, H, 4, dtype=torch.float64))
    assert (w_self[..., torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)] == 0).all()
    if padded:  # no weight on the encoder's padding
        assert (w_cross.masked_select(~real[:, None, None, :]) == 0).all()


def test_decoder_cross_attention_reads_the_memory():
    """Cross-attention's keys and values come from the memory: changing one memory position
    changes every decoder output, and the decoder's own positions change only through x."""
    torch.manual_seed(0)
    layer = TransformerDecoderLayer(D, H, F_).double().eval()
    x = torch.randn(2, 3, D, dtype=torch.float64)
    memory = torch.randn(2, 5, D, dtype=torch.float64)
    edited = memory.clone()
    edited[:, 4] += 1.0
    with torch.no_grad():
        moved = (layer(x, edited) - layer(x, memory)).abs().amax(dim=(0, 2))  # (L,)
    assert (moved > 1e-6).all()
    with pytest.raises(ValueError, match=r"x must be \(B, L, d_model=16\), got \(2, 3, 8\)"):
        layer(torch.randn(2, 3, 8, dtype=torch.float64), memory)
    with pytest.raises(ValueError, match=r"x_kv must be \(B=2, S, d_model=16\)"):
        layer(x, torch.randn(2, 5, 8, dtype=torch.float64))


# --- the fast path (fused=True) equals the teaching path -----------------------------------------

def _fused_pair(norm_first, activation, n_kv_heads=None):
    torch.manual_seed(0)
    teach = TransformerLayer(D, H, F_, n_kv_heads=n_kv_heads, activation=activation,
                             norm_first=norm_first).double()
    with torch.no_grad():
        for p in teach.parameters():
            p.add_(0.1 * torch.randn_like(p))   # non-trivial norms and biases
    fast = TransformerLayer(D, H, F_, n_kv_heads=n_kv_heads, activation=activation,
                            norm_first=norm_first, fused=True).double()
    fast.load_state_dict(teach.state_dict())
    return teach, fast


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "swiglu"])
def test_fused_layer_equals_teaching_layer_with_gradients(norm_first, activation):
    teach, fast = _fused_pair(norm_first, activation, n_kv_heads=2)
    x, real = inputs()
    mask = causal_mask(6)
    results = []
    for layer in (teach, fast):
        xi = x.clone().requires_grad_(True)
        out = layer(xi, mask=mask, key_padding_mask=real)
        out.square().sum().backward()
        results.append([out.detach(), xi.grad] + [p.grad for p in layer.parameters()])
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_fused_layer_with_weights_or_cache_equals_teaching_layer():
    teach, fast = _fused_pair(True, "gelu")
    x, _ = inputs()
    out_t, w_t = teach(x, mask=causal_mask(6), return_weights=True)
    out_f, w_f = fast(x, mask=causal_mask(6), return_weights=True)   # weights: teaching attention
    torch.testing.assert_close(out_f, out_t, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w_f, w_t, rtol=1e-10, atol=1e-14)
    from txlearn.heads import KVCache
    cache, steps = KVCache(), []
    for t in range(6):   # one position at a time through the fused path's cache
        steps.append(fast(x[:, t:t + 1], mask=causal_mask(1, t + 1), cache=cache))
    torch.testing.assert_close(torch.cat(steps, dim=1), out_t, rtol=1e-10, atol=1e-12)
