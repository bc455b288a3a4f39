"""Lesson 09: a causal character-level language model built from the course's layers.

``logits = LayerNorm(layers(E[ids] + P[t])) @ E^T``: a token table ``E (n_vocab, d_model)``, learned
positions, ``n_layers`` pre-LN :class:`txlearn.layer.TransformerLayer` (exact GELU) under a causal
mask, a final LayerNorm, and the output head tied to the token table (Press & Wolf 2017). Pre-LN
keeps training stable without a long warm-up (Xiong et al. 2020). The sizes are plain arguments
(a training run's come from ``TrainConfig.model_sizes()``, :mod:`txlearn.training.config`), so
the model knows nothing of training. Source: lesson 09.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from txlearn.heads import KVCache
from txlearn.layer import TransformerLayer
from txlearn.masks import causal_mask, positions_from_padding
from txlearn.norms import LayerNorm
from txlearn.positional import LearnedPositionalEmbedding

__all__ = ["CharTransformer"]


class CharTransformer(nn.Module):
    """A causal character-level language model from the course's layers.

    ``logits = LayerNorm(layers(E[ids] + P[t])) @ E^T``: ids ``(B, T)`` int64 -> logits
    ``(B, T, n_vocab)`` float32. ``E (n_vocab, d_model)`` is the token table, shared with the output head.
    Each layer is pre-LN with exact GELU; the causal mask is bottom-right aligned, so the same
    code runs a whole window (no cache) or a few new positions after cached ones. ``dropout``:
    probability on each sub-layer's output while training (0 = none).

    ``fused=True`` (default) runs every layer on its fast path (``TransformerLayer(fused=True)``:
    PyTorch's fused attention, LayerNorm and GELU kernels), which training uses; asking for the
    attention weights (``return_weights=True``) takes the teaching attention automatically.
    ``fused=False`` is the teaching path throughout; the two are tested equal
    (``tests/test_training.py``). The positions and the mask are built on the device of ``ids``.

    ``init``: ``"layers"`` keeps each layer's own initialisation; ``"gpt2"`` re-draws the
    matrices GPT-2's way (Radford et al. 2019, section 2.3): ``W_Q, W_K, W_V, W_1`` from
    ``N(0, 0.02^2)``, and the two matrices that write into the residual stream, ``W_O`` and
    ``W_2``, from ``N(0, (0.02 / sqrt(2 n_layers))^2)``, so the residual sum of the
    ``2 n_layers`` sub-layers starts with the variance of one. Raises ``ValueError`` for another
    name.
    """

    def __init__(self, n_vocab: int, d_model: int, n_heads: int, n_layers: int, d_ff: int,
                 block_size: int, dropout: float = 0.0, fused: bool = True,
                 init: str = "layers"):
        super().__init__()
        if init not in ("layers", "gpt2"):
            raise ValueError(f"init must be 'layers' or 'gpt2', got {init!r}")
        self.E = nn.Parameter(torch.randn(n_vocab, d_model) * 0.02)
        self.position = LearnedPositionalEmbedding(block_size, d_model)
        self.layers = nn.ModuleList(
            TransformerLayer(d_model, n_heads, d_ff, activation="gelu", norm_first=True,
                             dropout=dropout, fused=fused)
            for _ in range(n_layers))
        self.norm = LayerNorm(d_model, fused=fused)
        self.block_size = block_size
        if init == "gpt2":
            self._init_gpt2()

    @torch.no_grad()
    def _init_gpt2(self) -> None:
        residual_std = 0.02 / math.sqrt(2 * len(self.layers))   # 2 residual writes per layer
        for layer in self.layers:
            for W in (layer.attn.W_Q, layer.attn.W_K, layer.attn.W_V, layer.ffn.W_1):
                W.normal_(0.0, 0.02)
            for W in (layer.attn.W_O, layer.ffn.W_2):
                W.normal_(0.0, residual_std)

    def new_caches(self) -> list[KVCache]:
        """One empty :class:`txlearn.heads.KVCache` per layer."""
        return [KVCache() for _ in self.layers]

    def forward(self, ids: torch.Tensor, caches: list[KVCache] | None = None,
                return_weights: bool = False, key_padding_mask: torch.Tensor | None = None):
        """Logits ``(B, T, n_vocab)`` for ids ``(B, T)``, after the ``S_past`` positions in ``caches``.

        ``key_padding_mask``: bool ``(B, S_past + T)``, True = real token, for a left-padded batch
        of prompts (:func:`txlearn.masks.left_padding_mask`): padding is never attended to, and
        each row's positions count from its first real token
        (:func:`txlearn.masks.positions_from_padding`), so a row gives the logits it gives alone.
        With ``return_weights=True`` also returns each layer's attention weights, a list of
        ``n_layers`` tensors ``(B, n_heads, T, S_past + T)``. Raises ``ValueError`` when a
        position reaches ``block_size`` (there is no learned position for it) or the mask is
        not ``(B, S_past + T)`` (both shapes named).
        """
        B, T = ids.shape
        past = len(caches[0]) if caches else 0
        S = past + T
        if key_padding_mask is None:
            positions = range(past, S)                             # T positions, a table slice
        else:
            if tuple(key_padding_mask.shape) != (B, S):
                raise ValueError(f"key_padding_mask must be (B, S_past + T) = ({B}, {S}), got "
                                 f"{tuple(key_padding_mask.shape)}")
            positions = positions_from_padding(key_padding_mask)[:, past:]  # (B, T) per row
        # without padding the last position is S - 1, known without reading the tensor (no
        # device sync, and no graph break under torch.compile)
        last = S - 1 if key_padding_mask is None else (int(positions.max()) if T else -1)
        if T and last >= self.block_size:
            raise ValueError(f"{last + 1} positions exceed block_size {self.block_size}")
        x = self.E[ids] + self.position(positions)                # (B, T, d_model)
        mask = causal_mask(T, S, device=ids.device)               # (T, S) bottom-right
        weights = []
        for l, layer in enumerate(self.layers):
            cache = caches[l] if caches else None
            if return_weights:
                x, w = layer(x, mask=mask, key_padding_mask=key_padding_mask, cache=cache,
                             return_weights=True)
                weights.append(w)                                 # (B, n_heads, T, S)
            else:
                x = layer(x, mask=mask, key_padding_mask=key_padding_mask, cache=cache)
        logits = self.norm(x) @ self.E.T                          # (B, T, n_vocab)
        return (logits, weights) if return_weights else logits
