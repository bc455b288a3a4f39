"""What the set-09 checks (``txlearn/checks/capstone.py``) compare with, computed once per process.

Check modules are read afresh from disk on every check call, so anything expensive they need
lives here, in an ordinary module that stays imported: the course's corpus split and its bigram
baseline, the course's own all-MiniLM-L6-v2 (:func:`txlearn.models.minilm.load_encoder`, itself
tested equal to ``sentence-transformers``), the token states of that encoder and of its
catalogued mistakes, and ``sentence-transformers``' own sentence embeddings (the oracle the
learner's encoder must match to 1e-5). Every function returns new tensors or read-only arrays,
so nothing a caller does changes the cache.
"""

from __future__ import annotations

import os
import threading
import warnings
from contextlib import contextmanager
from functools import lru_cache

import numpy as np
import torch

__all__ = ["corpus", "tokens", "minilm_sizes", "minilm_state", "encoder_states",
           "reference_embeddings", "ENCODER_VARIANTS"]


@lru_cache(maxsize=2)
def _corpus(block_size: int):
    from txlearn.training.data import CharVocab, bigram_nats, load_corpus, split_by_position

    text = load_corpus()
    vocab = CharVocab.from_text(text)
    train_ids, val_ids = split_by_position(vocab.encode(text), block_size)
    return train_ids, val_ids, len(vocab), bigram_nats(train_ids, val_ids, len(vocab))


def corpus(block_size: int):
    """``(train_ids, val_ids, n_vocab, bigram_nats)`` of the default corpus (lesson 09's split)."""
    train_ids, val_ids, n_vocab, bigram = _corpus(block_size)
    return train_ids.clone(), val_ids.clone(), n_vocab, bigram


@lru_cache(maxsize=1)
def _tokenizer():
    from txlearn.models.minilm_files import load_tokenizer
    return load_tokenizer()


@lru_cache(maxsize=8)
def _tokens(sentences: tuple):
    from txlearn.models.minilm_files import tokenize
    return tokenize(list(sentences), _tokenizer())


def tokens(sentences: tuple) -> dict:
    """``input_ids``, ``attention_mask``, ``token_type_ids`` (int64 ``(B, T)``) of ``sentences``."""
    return {k: v.clone() for k, v in _tokens(tuple(sentences)).items()}


# the one encoder is shared by the grader's threads (one per submission) and changed in place for
# a catalogued mistake: held for every use, so that one student's wrong answer never becomes the
# right states another student is compared with
_ENCODER_LOCK = threading.RLock()


@lru_cache(maxsize=1)
def _encoder():
    from txlearn.models.minilm import load_encoder
    return load_encoder()


@contextmanager
def _changed(model, variant: str):
    """The course's encoder with one catalogued mistake (none for ``""``), undone on exit; the
    encoder is held meanwhile (another thread's right states wait for it)."""
    with _ENCODER_LOCK:
        with _changed_held(model, variant) as changed:
            yield changed


@contextmanager
def _changed_held(model, variant: str):
    undo = []

    def set_attr(obj, name, value):
        undo.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    with torch.no_grad():
        for layer in model.layers:
            if variant == "pre-LN":
                set_attr(layer, "norm_first", True)
            elif variant == "tanh GELU":
                set_attr(layer.ffn, "activation", "gelu_tanh")
            elif variant == "eps 1e-5":
                for norm in (layer.norm1, layer.norm2):
                    set_attr(norm, "eps", 1e-5)
            elif variant == "attention weights not transposed":
                for name in ("W_Q", "W_K", "W_V", "W_O"):
                    W = getattr(layer.attn, name)
                    W.copy_(W.T.clone())
                    undo.append((W, None, None))
        if variant == "eps 1e-5":
            set_attr(model.norm, "eps", 1e-5)
    try:
        yield model
    finally:
        with torch.no_grad():
            for obj, name, value in reversed(undo):
                if name is None:
                    obj.copy_(obj.T.clone())
                else:
                    setattr(obj, name, value)


def _embed(model, batch, variant):
    ids, types = batch["input_ids"], batch["token_type_ids"]
    T = ids.shape[1]
    x = model.E_word[ids]
    if variant != "no positions":
        x = x + model.position(T)
    if variant != "no token types":
        x = x + model.E_type[types]
    return x if variant == "no embedding LayerNorm" else model.norm(x)


def minilm_sizes() -> dict:
    """The MiniLM constructor's arguments from the shipped ``config.json``, in the statement's
    order: n_vocab, max_len, n_types, d_model, n_heads, d_ff, n_layers, eps."""
    import json

    from txlearn.models.minilm_files import model_dir
    cfg = json.loads((model_dir() / "config.json").read_text())
    keys = ("vocab_size", "max_position_embeddings", "type_vocab_size", "hidden_size",
            "num_attention_heads", "intermediate_size", "num_hidden_layers", "layer_norm_eps")
    names = ("n_vocab", "max_len", "n_types", "d_model", "n_heads", "d_ff", "n_layers", "eps")
    return {n: cfg[k] for n, k in zip(names, keys)}


def minilm_state() -> dict:
    """The checkpoint's weights in the statement's names (``E_word``, ``P``, ``layers.0.attn.W_Q``,
    ...), linear weights transposed to ``(d_in, d_out)``: the course's encoder's own state, with
    its position table named ``P``."""
    with _ENCODER_LOCK:   # never read while another thread's mistake is in place
        return {("P" if k == "position.W_pos" else k): v.detach().clone()
                for k, v in _encoder().state_dict().items()}


ENCODER_VARIANTS = ("pre-LN", "tanh GELU", "eps 1e-5", "attention weights not transposed",
                    "no embedding LayerNorm", "no token types", "no positions",
                    "padding keys attended", "mask inverted")


@lru_cache(maxsize=32)
def _states(sentences: tuple, variant: str | None):
    model, batch = _encoder(), _tokens(sentences)
    real = batch["attention_mask"].bool()
    keys = {"padding keys attended": torch.ones_like(real), "mask inverted": ~real}.get(variant, real)
    with torch.no_grad(), _changed(model, variant or ""):
        x = _embed(model, batch, variant)
        for layer in model.layers:
            x = layer(x, key_padding_mask=keys)
    out = x.numpy().astype(np.float64)
    out.setflags(write=False)
    return out


def encoder_states(sentences: tuple, variant: str | None = None) -> np.ndarray:
    """Last-layer token states ``(B, T, 384)`` float64 of the course's encoder on ``sentences``,
    or of the catalogued mistake ``variant`` (one of :data:`ENCODER_VARIANTS`)."""
    return _states(tuple(sentences), variant)


@lru_cache(maxsize=4)
def _reference_embeddings(sentences: tuple):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from txlearn.models.minilm import reference_encode
    with warnings.catch_warnings():   # tqdm.auto warns in a kernel without ipywidgets: not the
        warnings.simplefilter("ignore")   # learner's business, and a check prints nothing else
        out = np.asarray(reference_encode(list(sentences)), dtype=np.float64)
    out.setflags(write=False)
    return out


def reference_embeddings(sentences: tuple) -> np.ndarray:
    """``sentence-transformers``' own embeddings ``(B, 384)`` of ``sentences`` (float64 copy of its
    float32 output)."""
    return _reference_embeddings(tuple(sentences))
