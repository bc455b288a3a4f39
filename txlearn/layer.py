"""Lesson 07: one full transformer layer, a stack of them, the encoder-decoder's decoder layer,
token embeddings and an output head.

    post-LN (the paper, default):  x = LayerNorm(x + Dropout(MultiHead(x)))
                                   x = LayerNorm(x + Dropout(FFN(x)))
    pre-LN (norm_first=True):      x = x + Dropout(MultiHead(LayerNorm(x)))
                                   x = x + Dropout(FFN(LayerNorm(x)))

The decoder layer of an encoder-decoder (:class:`TransformerDecoderLayer`) adds a third sub-layer
between the two, cross-attention: queries from the decoder, keys and values from the encoder's
output.

``norm="rms"`` puts RMSNorm where LayerNorm stands; with ``norm_first=True, norm="rms",
activation="swiglu", rope=..., bias=False`` and ``n_kv_heads`` the layer is a Llama-style decoder
block (lesson 10).

Source: Vaswani et al. 2017, section 3.1 (sub-layers with residual and LayerNorm), 3.2.3
(encoder-decoder attention), 3.4
(embeddings scaled by sqrt(d_model), shared with the pre-softmax projection), 5.4 (dropout on each
sub-layer's output, before the residual add); Xiong et al. 2020 (pre-LN).

Built from the course's own parts: ``txlearn.heads.MultiHeadAttention`` (lesson 03),
``txlearn.ffn.FeedForward`` (lesson 05), ``txlearn.norms.LayerNorm`` (lesson 06), and the
positional encodings of lesson 04. ``TransformerLayer`` equals ``torch.nn.TransformerEncoderLayer``
with copied weights (``from_torch``; tests/test_layer.py), in eval mode. Departures from PyTorch's
layer, stated: dropout is applied only to each sub-layer's output (the paper's places), not also
inside the FFN or to the attention weights; masks are True = may attend (docs/conventions.md).

Precision: every module here runs in the dtype of its parameters (``model.to(torch.bfloat16)``):
the residual stream and the matrix products in that dtype, and in float32 for float16 and
bfloat16 the parts whose numerics need it: attention scores and softmax, LayerNorm's statistics,
the activations, the embedding's sum with the positional encoding (:mod:`txlearn.precision`).
``tests/test_precision.py`` bounds each module's error against float64 in eps of its dtype.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from txlearn.ffn import FeedForward
from txlearn.heads import KVCache, MultiHeadAttention
from txlearn.norms import LayerNorm, RMSNorm
from txlearn.positional import LearnedPositionalEmbedding, sinusoidal_encoding
from txlearn.precision import upcast

__all__ = ["TransformerLayer", "TransformerStack", "TransformerDecoderLayer", "TokenEmbedding",
           "OutputHead"]


def _torch_activation_name(act) -> str:
    """The FFN activation of a PyTorch encoder/decoder layer: F.relu / F.gelu (given as a string)
    or an nn.Module. Raises ValueError for anything but ReLU and exact GELU."""
    name = getattr(act, "__name__", None) if not isinstance(act, nn.Module) else None
    if isinstance(act, nn.ReLU):
        name = "relu"
    elif isinstance(act, nn.GELU) and act.approximate == "none":
        name = "gelu"
    if name not in ("relu", "gelu"):
        raise ValueError(f"unsupported activation {act!r}: use ReLU or exact GELU")
    return name


def _make_norm(norm: str, d_model: int, eps: float, fused: bool = False) -> nn.Module:
    """``LayerNorm(d_model, eps, fused=fused)`` for ``norm="layer"``, ``RMSNorm(d_model, eps)``
    for ``"rms"`` (one path: its equation); raises ValueError for another name."""
    if norm not in ("layer", "rms"):
        raise ValueError(f"norm must be 'layer' or 'rms', got {norm!r}")
    return LayerNorm(d_model, eps, fused=fused) if norm == "layer" else RMSNorm(d_model, eps)


@torch.no_grad()
def _copy_ffn_and_norms(new: nn.Module, layer: nn.Module, norms: tuple[str, ...]) -> None:
    """Copy a PyTorch layer's ``linear1``/``linear2`` (``nn.Linear``'s ``(d_out, d_in)``) into
    ``new.ffn``'s ``W_1 (d_model, d_ff)``/``W_2 (d_ff, d_model)`` and its named LayerNorms'
    ``weight``/``bias`` into ``gamma``/``beta``."""
    new.ffn.W_1.copy_(layer.linear1.weight.T)  # (d_ff, d_model) -> (d_model, d_ff)
    new.ffn.W_2.copy_(layer.linear2.weight.T)  # (d_model, d_ff) -> (d_ff, d_model)
    if new.ffn.b_1 is not None:
        new.ffn.b_1.copy_(layer.linear1.bias)
        new.ffn.b_2.copy_(layer.linear2.bias)
    for name in norms:
        ours, theirs = getattr(new, name), getattr(layer, name)
        ours.gamma.copy_(theirs.weight)
        ours.beta.copy_(theirs.bias)


class TransformerLayer(nn.Module):
    """One transformer (encoder) layer: attention and FFN, each with a residual and a LayerNorm.

    Args:
        d_model, n_heads, d_ff: widths; d_k = d_model / n_heads.
        n_kv_heads: key/value heads (grouped-query attention); None = n_heads.
        activation: the FFN's, ``"relu"`` (paper), ``"gelu"`` (exact erf), ``"gelu_tanh"``,
            ``"swiglu"``.
        norm_first: False = post-LN (the paper's order), True = pre-LN.
        dropout: probability on each sub-layer's output (active only in ``train()`` mode).
        eps: the norms' epsilon (inside the square root; 1e-12 for BERT-style checkpoints).
        bias: biases in the attention and FFN linear maps.
        norm: ``"layer"`` (LayerNorm, the paper) or ``"rms"`` (RMSNorm, lesson 06).
        rope, rope_base: rotary positions inside the attention (see
            :class:`txlearn.heads.MultiHeadAttention`); None = none.
        fused: False (default): every sub-layer computes its equations with the course's own
            code (the teaching path). True: the fast path for training, tested equal to the
            teaching path: attention through ``F.scaled_dot_product_attention`` whenever the
            weights are not requested (``MultiHeadAttention(use_sdpa=True)``; asking for them
            still takes the teaching path), LayerNorm and the activation through PyTorch's
            one-kernel ``F.layer_norm`` and ``F.gelu``/``F.relu``/``F.silu``.

    Submodules: ``attn`` (MultiHeadAttention), ``norm1``, ``ffn`` (FeedForward), ``norm2``.

    Precision: runs in the dtype of its parameters (``.to(torch.bfloat16)``); see the module's
    docstring for the parts computed in float32.

    Raises:
        ValueError: d_model not divisible by n_heads, n_heads not by n_kv_heads, an unknown
            activation, norm or RoPE pairing, or dropout outside [0, 1) (all named).

    Source: Vaswani et al. 2017, section 3.1; lesson 07.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, n_kv_heads: int | None = None,
                 activation: str = "relu", norm_first: bool = False, dropout: float = 0.0,
                 eps: float = 1e-5, bias: bool = True, norm: str = "layer",
                 rope: str | None = None, rope_base: float = 10000.0,
                 fused: bool = False) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model, self.norm_first, self.fused = d_model, norm_first, fused
        self.attn = MultiHeadAttention(d_model, n_heads, n_kv_heads, bias=bias, rope=rope,
                                       rope_base=rope_base, use_sdpa=fused)
        self.norm1 = _make_norm(norm, d_model, eps, fused)
        self.ffn = FeedForward(d_model, d_ff, activation, bias=bias, fused=fused)
        self.norm2 = _make_norm(norm, d_model, eps, fused)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                key_padding_mask: torch.Tensor | None = None, cache: KVCache | None = None,
                return_weights: bool = False, positions: torch.Tensor | None = None):
        """Apply the layer.

        Args:
            x: ``(B, T, d_model)`` float.
            mask: bool, True = may attend, broadcastable to ``(B, n_heads, T, S)`` (for example
                ``causal_mask(T, S)``; S counts cached positions too).
            key_padding_mask: bool ``(B, S)``, True = real token.
            cache: a ``KVCache`` passed to ``attn`` (this step's K, V are appended to it).
            return_weights: also return the attention weights ``(B, n_heads, T, S)``.
            positions: RoPE's positions ``(T,)`` or ``(B, T)``, passed to ``attn`` (see
                :class:`txlearn.heads.MultiHeadAttention`); None = after the cached ones.

        Returns:
            ``(B, T, d_model)``, the shape of x, so layers stack; or ``(out, weights)``.

        Raises:
            ValueError: x is not ``(B, T, d_model)``, its dtype is not the parameters', or a
                mask does not broadcast (from ``attn``).
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (B, T, d_model={self.d_model}), got {tuple(x.shape)}")
        if self.norm_first:  # pre-LN: x + Sublayer(LayerNorm(x))
            a, weights = self._attention(self.norm1(x), mask, key_padding_mask, cache,
                                         return_weights, positions)
            x = x + a
            x = x + self.dropout2(self.ffn(self.norm2(x)))
        else:  # post-LN: LayerNorm(x + Sublayer(x))
            a, weights = self._attention(x, mask, key_padding_mask, cache, return_weights,
                                         positions)
            x = self.norm1(x + a)
            x = self.norm2(x + self.dropout2(self.ffn(x)))
        return (x, weights) if return_weights else x

    def _attention(self, h, mask, key_padding_mask, cache, return_weights, positions=None):
        if not return_weights:  # lets the fast path (fused=True) skip the weights
            out = self.attn(h, mask=mask, key_padding_mask=key_padding_mask, cache=cache,
                            positions=positions)
            return self.dropout1(out), None  # (B, T, d_model)
        out, weights = self.attn(h, mask=mask, key_padding_mask=key_padding_mask, cache=cache,
                                 return_weights=True, positions=positions)
        # (B, T, d_model), (B, n_heads, T, S)
        return self.dropout1(out), weights

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> "TransformerLayer":
        """A copy of a ``torch.nn.TransformerEncoderLayer`` with its weights.

        Reads ``norm_first``, the activation (ReLU or exact GELU), eps and the widths; converts
        ``(d_out, d_in)`` weights to ``(d_in, d_out)``. The dropout probability is not copied
        (the copy is for equality tests in eval mode). Raises ValueError for another activation.
        """
        name = _torch_activation_name(layer.activation)
        mha = layer.self_attn
        d_model, d_ff = mha.embed_dim, layer.linear1.out_features
        new = cls(d_model, mha.num_heads, d_ff, activation=name, norm_first=layer.norm_first,
                  eps=layer.norm1.eps, bias=mha.in_proj_bias is not None)
        new = new.to(layer.linear1.weight.dtype)  # before copying, so float64 stays exact
        W_q, W_k, W_v = mha.in_proj_weight.detach().chunk(3, dim=0)  # 3 x (d_model, d_model)
        b = mha.in_proj_bias.detach().chunk(3) if mha.in_proj_bias is not None else (None,) * 3
        o_bias = None if mha.out_proj.bias is None else mha.out_proj.bias.detach()
        new.attn.load_torch_weights(W_q, W_k, W_v, mha.out_proj.weight.detach(), *b, o_bias)
        _copy_ffn_and_norms(new, layer, ("norm1", "norm2"))
        return new


class TransformerStack(nn.Module):
    """N identical-shape layers applied in turn, with an optional final LayerNorm.

    ``TransformerStack(n_layers, d_model, n_heads, d_ff, ..., final_norm=False)``: every keyword
    after ``n_layers`` is passed to :class:`TransformerLayer`. ``final_norm=True`` adds a
    LayerNorm (RMSNorm with ``norm="rms"``) after the last layer (what pre-LN models need, since their residual stream is never
    normalised otherwise; ``nn.TransformerEncoder(norm=...)``).

    Raises ValueError when ``n_layers < 1`` (and as :class:`TransformerLayer`).
    Source: Vaswani et al. 2017, section 3.1 (N = 6); lesson 07.
    """

    def __init__(self, n_layers: int, d_model: int, n_heads: int, d_ff: int,
                 final_norm: bool = False, **layer_options) -> None:
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"n_layers must be >= 1, got {n_layers}")
        self.layers = nn.ModuleList(
            TransformerLayer(d_model, n_heads, d_ff, **layer_options) for _ in range(n_layers))
        eps, norm = layer_options.get("eps", 1e-5), layer_options.get("norm", "layer")
        self.final_norm = _make_norm(norm, d_model, eps) if final_norm else None

    def new_cache(self) -> list[KVCache]:
        """One empty ``KVCache`` per layer, to pass as ``cache``."""
        return [KVCache() for _ in self.layers]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                key_padding_mask: torch.Tensor | None = None,
                cache: Sequence[KVCache] | None = None, return_weights: bool = False):
        """Apply every layer to ``x (B, T, d_model)``; masks as in :meth:`TransformerLayer.forward`.

        Args:
            cache: one ``KVCache`` per layer (see :meth:`new_cache`), or None.
            return_weights: also return a list with each layer's weights ``(B, n_heads, T, S)``.
        Returns:
            ``(B, T, d_model)``, or ``(out, [weights of layer 0, 1, ...])``.
        Raises:
            ValueError: `cache` does not hold one entry per layer (both numbers named).
        """
        if cache is not None and len(cache) != len(self.layers):
            raise ValueError(f"cache has {len(cache)} entries for {len(self.layers)} layers")
        all_weights = []
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else cache[i]
            if not return_weights:
                x = layer(x, mask, key_padding_mask, layer_cache)
                continue
            x, weights = layer(x, mask, key_padding_mask, layer_cache, return_weights=True)
            all_weights.append(weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return (x, all_weights) if return_weights else x


class TransformerDecoderLayer(nn.Module):
    """The decoder layer of an encoder-decoder: self-attention, cross-attention, FFN.

        post-LN (the paper):        x = LayerNorm_1(x + SelfAttn(x))
                                    x = LayerNorm_2(x + CrossAttn(x, memory))
                                    x = LayerNorm_3(x + FFN(x))
        pre-LN (norm_first=True):   x = x + SelfAttn(LayerNorm_1(x))
                                    x = x + CrossAttn(LayerNorm_2(x), memory)
                                    x = x + FFN(LayerNorm_3(x))

    ``CrossAttn(x, memory)`` is ``MultiHeadAttention(x, x_kv=memory)``: the decoder's L positions
    ask the queries, the encoder's S output positions (``memory``) give the keys and values, so its
    weights are ``(B, n_heads, L, S)``. ``memory`` is used as given (pre-LN encoders end with their
    own final LayerNorm). Each sub-layer's output gets dropout before the residual add.

    Args: as :class:`TransformerLayer` (d_model, n_heads, d_ff, n_kv_heads, activation,
        norm_first, dropout, eps, bias). Submodules: ``self_attn``, ``norm1``, ``cross_attn``,
        ``norm2``, ``ffn``, ``norm3``.
    Raises: ValueError as :class:`TransformerLayer`; in forward, for shapes that do not fit.
    Source: Vaswani et al. 2017, sections 3.1 and 3.2.3; equal to
        ``torch.nn.TransformerDecoderLayer`` with copied weights (tests/test_layer.py); lesson 07.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, n_kv_heads: int | None = None,
                 activation: str = "relu", norm_first: bool = False, dropout: float = 0.0,
                 eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model, self.norm_first = d_model, norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, n_kv_heads, bias=bias)
        self.norm1 = LayerNorm(d_model, eps)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, n_kv_heads, bias=bias)
        self.norm2 = LayerNorm(d_model, eps)
        self.ffn = FeedForward(d_model, d_ff, activation, bias=bias)
        self.norm3 = LayerNorm(d_model, eps)
        self.dropouts = nn.ModuleList(nn.Dropout(dropout) for _ in range(3))

    def forward(self, x: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor | None = None,
                key_padding_mask: torch.Tensor | None = None,
                memory_key_padding_mask: torch.Tensor | None = None, return_weights: bool = False):
        """Apply the layer.

        Args:
            x: the decoder's input ``(B, L, d_model)``.
            memory: the encoder's output ``(B, S, d_model)``.
            mask: self-attention mask, bool True = may attend, broadcastable to
                ``(B, n_heads, L, L)`` (``causal_mask(L)`` for a decoder that must not see ahead).
            key_padding_mask: ``(B, L)`` True = real decoder token (self-attention).
            memory_key_padding_mask: ``(B, S)`` True = real encoder token (cross-attention).
            return_weights: also return both attentions' weights.
        Returns:
            ``(B, L, d_model)``; or ``(out, self_weights (B, n_heads, L, L),
            cross_weights (B, n_heads, L, S))``.
        Raises:
            ValueError: x or memory not ``(B, ., d_model)`` with one B, or a mask that does not
                broadcast (from the attention sub-layers).
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (B, L, d_model={self.d_model}), got {tuple(x.shape)}")
        drop1, drop2, drop3 = self.dropouts
        if self.norm_first:  # pre-LN: x + Sublayer(LayerNorm(x))
            a, w_self = self.self_attn(self.norm1(x), mask=mask, key_padding_mask=key_padding_mask,
                                       return_weights=True)
            x = x + drop1(a)
            c, w_cross = self.cross_attn(self.norm2(x), memory,
                                         key_padding_mask=memory_key_padding_mask,
                                         return_weights=True)
            x = x + drop2(c)
            x = x + drop3(self.ffn(self.norm3(x)))
        else:  # post-LN: LayerNorm(x + Sublayer(x))
            a, w_self = self.self_attn(x, mask=mask, key_padding_mask=key_padding_mask,
                                       return_weights=True)
            x = self.norm1(x + drop1(a))
            c, w_cross = self.cross_attn(x, memory, key_padding_mask=memory_key_padding_mask,
                                         return_weights=True)  # (B, L, d_model), (B, n_heads, L, S)
            x = self.norm2(x + drop2(c))
            x = self.norm3(x + drop3(self.ffn(x)))
        return (x, w_self, w_cross) if return_weights else x

    @classmethod
    def from_torch(cls, layer: nn.TransformerDecoderLayer) -> "TransformerDecoderLayer":
        """A copy of a ``torch.nn.TransformerDecoderLayer`` with its weights (ReLU or exact GELU),
        ``(d_out, d_in)`` weights transposed to ``(d_in, d_out)``; dropout is not copied.
        Raises ValueError for another activation."""
        name = _torch_activation_name(layer.activation)
        d_model, n_heads = layer.self_attn.embed_dim, layer.self_attn.num_heads
        new = cls(d_model, n_heads, layer.linear1.out_features, activation=name,
                  norm_first=layer.norm_first, eps=layer.norm1.eps,
                  bias=layer.self_attn.in_proj_bias is not None).to(layer.linear1.weight.dtype)
        new.self_attn = MultiHeadAttention.from_torch(layer.self_attn)
        new.cross_attn = MultiHeadAttention.from_torch(layer.multihead_attn)
        _copy_ffn_and_norms(new, layer, ("norm1", "norm2", "norm3"))
        return new


class TokenEmbedding(nn.Module):
    """Token embedding plus positional encoding: ``x = W_E[ids] * s + P[start : start + T]``.

    Args:
        n_vocab, d_model: table size ``W_E (n_vocab, d_model)``, initialised
            ``N(0, 1/d_model)`` (so that the scaled embedding has unit variance).
        positional: ``"sinusoidal"`` (fixed, sin even / cos odd, lesson 04), ``"learned"``
            (``LearnedPositionalEmbedding(max_len, d_model)``) or None.
        max_len: rows of the learned table (required for ``"learned"``).
        scale: multiply the embedding by ``s = sqrt(d_model)`` (paper section 3.4); False
            means s = 1 (GPT-2, BERT).
        dropout: probability on the sum (paper section 5.4).

    forward(ids, start=0): ids integer ``(B, T)`` -> float ``(B, T, d_model)`` in the dtype of
    ``W_E``; `start` is the position of the first token (the number of cached positions when
    decoding with a KV cache). The scaling and the positional sum are computed in float32 for
    float16 and bfloat16 tables and rounded once (the sinusoidal table itself comes from float64,
    so long positions keep their accuracy).

    Raises:
        ValueError: an unknown `positional`, ``"learned"`` without `max_len`, ids outside
            ``[0, n_vocab)``, or positions past `max_len` (numbers named).
    Source: Vaswani et al. 2017, sections 3.4 and 3.5; lesson 07.
    """

    def __init__(self, n_vocab: int, d_model: int, positional: str | None = "sinusoidal",
                 max_len: int | None = None, scale: bool = False, dropout: float = 0.0) -> None:
        super().__init__()
        if positional not in ("sinusoidal", "learned", None):
            raise ValueError(f"positional must be 'sinusoidal', 'learned' or None, got {positional!r}")
        if positional == "learned" and max_len is None:
            raise ValueError("positional='learned' needs max_len")
        self.n_vocab, self.d_model, self.positional = n_vocab, d_model, positional
        self.scale = math.sqrt(d_model) if scale else 1.0
        self.W_E = nn.Parameter(torch.randn(n_vocab, d_model) / math.sqrt(d_model))
        self.pos = LearnedPositionalEmbedding(max_len, d_model) if positional == "learned" else None
        self.dropout = nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.n_vocab):
            raise ValueError(f"token ids must be in [0, {self.n_vocab}), got range "
                             f"[{int(ids.min())}, {int(ids.max())}]")
        dtype = self.W_E.dtype
        x = upcast(self.W_E[ids]) * self.scale  # (B, T, d_model), float32 for 16-bit tables
        T = ids.shape[-1]
        if self.positional == "sinusoidal":
            P = sinusoidal_encoding(start + T, self.d_model, dtype=x.dtype, device=x.device)
            x = x + P[start:]  # (T, d_model) broadcast over B
        elif self.positional == "learned":
            P = self.pos(torch.arange(start, start + T, device=ids.device))  # (T, d_model)
            x = x + P.to(x.dtype)
        return self.dropout(x.to(dtype))


class OutputHead(nn.Module):
    """Logits over the vocabulary: ``logits = x W_U + b_U``, or ``x W_E^T`` when tied.

    Args:
        d_model, n_vocab: ``W_U (d_model, n_vocab)`` (absent when tied).
        bias: a bias ``b_U (n_vocab,)``.
        tie_to: a :class:`TokenEmbedding` whose ``W_E (n_vocab, d_model)`` is reused,
            transposed (weight tying, paper section 3.4; Press & Wolf 2017).

    forward(x): ``(..., d_model) -> (..., n_vocab)`` logits (float, not probabilities), in
    the dtype of the weights (a matrix product, accumulated in float32 by PyTorch).
    Raises ValueError when `tie_to` has another width or vocabulary than the head (both named),
    or when x's dtype is not the weights'.
    Source: Vaswani et al. 2017, section 3.4; lesson 07.
    """

    def __init__(self, d_model: int, n_vocab: int, bias: bool = False,
                 tie_to: TokenEmbedding | None = None) -> None:
        super().__init__()
        if tie_to is not None and (tie_to.n_vocab, tie_to.d_model) != (n_vocab, d_model):
            raise ValueError(f"tie_to has (n_vocab, d_model) = ({tie_to.n_vocab}, "
                             f"{tie_to.d_model}), the head ({n_vocab}, {d_model})")
        self.tied = tie_to is not None
        if self.tied:
            self.W_E = tie_to.W_E  # the same Parameter object, shared (n_vocab, d_model)
        else:
            self.W_U = nn.Parameter(torch.randn(d_model, n_vocab) / math.sqrt(d_model))
        self.b_U = nn.Parameter(torch.zeros(n_vocab)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        W = self.W_E.T if self.tied else self.W_U  # (d_model, n_vocab)
        if x.dtype != W.dtype:
            raise ValueError(f"OutputHead: x has dtype {x.dtype} but the weights are {W.dtype}: "
                             "cast one to the other (module.to(dtype))")
        logits = x @ W  # (..., n_vocab)
        return logits if self.b_U is None else logits + self.b_U
