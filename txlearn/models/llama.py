"""Lesson 10: a modern decoder-only language model (Llama architecture) from the course's modules.

    x_0 = W_E[ids]                                                 token embedding, (B, T, d_model)
    h   = x_{l-1} + MultiHead_GQA,RoPE(RMSNorm(x_{l-1}), causal)   attention sub-layer
    x_l = h + FFN_SwiGLU(RMSNorm(h))                               for l = 1 .. n_layers
    logits = RMSNorm(x_N) W_E^T                                    tied head, (B, T, n_vocab)

Every block is the course's ``txlearn.layer.TransformerLayer`` with ``norm_first=True``
(pre-norm, lesson 06), ``norm="rms"`` (RMSNorm, lesson 06), ``activation="swiglu"`` (lesson 05),
``n_kv_heads`` < ``n_heads`` (grouped-query attention, lesson 03), ``rope=`` (rotary positions
inside the attention, lesson 04) and ``bias=False``. There is no positional table: RoPE rotates
queries and keys, and positions continue after the cached ones when decoding with a
:class:`txlearn.heads.KVCache`. The causal mask is lesson 02's ``causal_mask(T, S)``,
bottom-right aligned. The embedding is ``txlearn.layer.TokenEmbedding(positional=None)`` and the
head ``txlearn.layer.OutputHead(tie_to=...)`` (weight tying).

The sizes come from :class:`LlamaConfig`; ``txlearn.models.gguf`` reads them, and the weights,
from a GGUF file (SmolLM2-135M-Instruct). Source: Touvron et al. 2023 (LLaMA, section 2.2:
pre-normalisation with RMSNorm, SwiGLU, rotary embeddings); Ainslie et al. 2023 (GQA); lesson 10.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from txlearn.heads import KVCache
from txlearn.layer import OutputHead, TokenEmbedding, TransformerLayer
from txlearn.masks import causal_mask, positions_from_padding
from txlearn.norms import RMSNorm

__all__ = ["LlamaConfig", "LlamaDecoder"]


@dataclass(frozen=True)
class LlamaConfig:
    """The sizes of a Llama-style decoder.

    n_vocab: vocabulary; d_model: residual width; n_layers: blocks; n_heads, n_kv_heads: query and
    key/value heads (d_k = d_model / n_heads); d_ff: SwiGLU inner width; eps: RMSNorm's epsilon;
    rope_base: RoPE's base (theta_k = rope_base^(-2k/d_k)); context: the longest sequence the
    model was trained on (tokens); rope: the pairing the Q/K weights expect ("interleaved" for
    weights in GGUF's order, "half" for Hugging Face's); rope_scaling_factor: linear position
    interpolation (Chen et al. 2023, eq. 4; GGUF's ``rope.scaling.type = linear``): RoPE rotates
    position m by the angles of ``m / rope_scaling_factor`` (1 = none; a factor s is
    :func:`txlearn.positional.interpolate_positions` with ``context = s * trained_len``).
    Raises ValueError for a factor that is not a finite number > 0.
    """

    n_vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    eps: float = 1e-5
    rope_base: float = 10000.0
    context: int = 2048
    rope: str = "interleaved"
    rope_scaling_factor: float = 1.0

    def __post_init__(self) -> None:
        f = self.rope_scaling_factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f < float("inf"):
            raise ValueError(f"rope_scaling_factor must be a finite number > 0 (1 = no scaling), "
                             f"got {f!r}")

    @property
    def d_k(self) -> int:
        """Per-head width d_model / n_heads."""
        return self.d_model // self.n_heads


class LlamaDecoder(nn.Module):
    """A Llama-architecture decoder built from ``TransformerLayer``, ``RMSNorm``, ``TokenEmbedding``
    and a tied ``OutputHead``.

    Submodules: ``embed`` (``W_E (n_vocab, d_model)``), ``layers[l]`` (each a
    :class:`txlearn.layer.TransformerLayer`: ``norm1``, ``attn``, ``norm2``, ``ffn``), ``norm``
    (the final RMSNorm), ``head`` (tied to ``embed.W_E``). ``block_size`` is the config's context,
    so :func:`txlearn.training.generate.generate` drives this model as it drives lesson 09's.

    Raises ValueError as :class:`TransformerLayer` does for inconsistent sizes.
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        c = self.config = config
        self.embed = TokenEmbedding(c.n_vocab, c.d_model, positional=None)
        self.layers = nn.ModuleList(
            TransformerLayer(c.d_model, c.n_heads, c.d_ff, n_kv_heads=c.n_kv_heads,
                             activation="swiglu", norm_first=True, norm="rms", eps=c.eps,
                             bias=False, rope=c.rope, rope_base=c.rope_base)
            for _ in range(c.n_layers))
        self.norm = RMSNorm(c.d_model, eps=c.eps)
        self.head = OutputHead(c.d_model, c.n_vocab, tie_to=self.embed)
        self.block_size = c.context

    def new_caches(self) -> list[KVCache]:
        """One empty :class:`KVCache` per layer."""
        return [KVCache() for _ in self.layers]

    def forward(self, ids: torch.Tensor, caches: list[KVCache] | None = None,
                return_weights: bool = False, key_padding_mask: torch.Tensor | None = None):
        """Next-token logits for every position.

        Args:
            ids: int64 ``(B, T)``, token ids in ``[0, n_vocab)``.
            caches: one :class:`KVCache` per layer (:meth:`new_caches`); this call's keys and
                values are appended, its positions start after the cached ones, and the
                queries attend to every cached key (``causal_mask(T, S)``, bottom-right).
            return_weights: also return each layer's attention weights ``(B, n_heads, T, S)``.
            key_padding_mask: bool ``(B, S)`` (S = cached + T), True = real token, for a
                left-padded batch of prompts (:func:`txlearn.masks.left_padding_mask`): padding
                is never attended to and each row's RoPE positions count from its first real
                token (:func:`txlearn.masks.positions_from_padding`), so every row gives the
                logits it gives alone. None = no padding.

        Returns:
            logits float ``(B, T, n_vocab)``, or ``(logits, [weights of layer 0, 1, ...])``.

        Raises:
            ValueError: `ids` not ``(B, T)``, ids outside the vocabulary, `caches` not one per
                layer, a mask not ``(B, S)`` (numbers named).
        """
        x, weights, _ = self._blocks(ids, caches, return_weights, key_padding_mask)
        logits = self.head(self.norm(x))                                # (B, T, n_vocab)
        return (logits, weights) if return_weights else logits

    @torch.no_grad()
    def residual_stream(self, ids: torch.Tensor) -> list[torch.Tensor]:
        """The residual stream ``x_0`` (embedding) ``.. x_N`` (after the last block, before the
        final norm): ``n_layers + 1`` tensors ``(B, T, d_model)``, for comparisons layer by layer."""
        return self._blocks(ids, None, False, None, keep_hidden=True)[2]

    def positions(self, T: int, past: int = 0,
                  key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """RoPE's positions of the next T tokens after `past` cached ones, divided by
        ``config.rope_scaling_factor`` (linear position interpolation): float64 ``(T,)``, or
        ``(B, T)`` counted per row from its first real token when a ``key_padding_mask (B, past
        + T)`` is given. Source: Chen et al. 2023, eq. 4; lesson 04."""
        if key_padding_mask is None:
            m = torch.arange(past, past + T)                                # (T,)
        else:
            m = positions_from_padding(key_padding_mask)[:, past:]          # (B, T)
        return m.to(torch.float64) / self.config.rope_scaling_factor

    def _blocks(self, ids, caches, return_weights, key_padding_mask, keep_hidden=False):
        if ids.dim() != 2:
            raise ValueError(f"ids must be (B, T), got shape {tuple(ids.shape)}")
        if caches is not None and len(caches) != len(self.layers):
            raise ValueError(f"caches has {len(caches)} entries for {len(self.layers)} layers")
        B, T = ids.shape
        past = 0 if caches is None else len(caches[0])
        S = T + past
        if key_padding_mask is not None and tuple(key_padding_mask.shape) != (B, S):
            raise ValueError(f"key_padding_mask must be (B, S) = ({B}, {S}), got "
                             f"{tuple(key_padding_mask.shape)}")
        positions = self.positions(T, past, key_padding_mask)              # (T,) or (B, T)
        mask = causal_mask(T, S, device=ids.device)                     # (T, S) bottom-right
        x = self.embed(ids)                                             # (B, T, d_model)
        hidden, weights = [x], []
        for l, layer in enumerate(self.layers):
            x, w = layer(x, mask=mask, key_padding_mask=key_padding_mask,
                         cache=None if caches is None else caches[l], return_weights=True,
                         positions=positions)                           # (B, T, d_model)
            if keep_hidden:
                hidden.append(x)
            if return_weights:
                weights.append(w)                                       # (B, n_heads, T, S)
        return x, weights, hidden
