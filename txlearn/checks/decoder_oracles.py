"""What set 10's last check (``smollm2_decoder`` in :mod:`txlearn.checks.decoder`) compares with,
computed once per process: the token ids of its text and chat prompt, and the logits and greedy
continuations of SmolLM2-135M-Instruct and of its catalogued mistakes.

The oracle is the course's :class:`txlearn.models.llama.LlamaDecoder` loaded from the same GGUF
file with the half pairing (:func:`txlearn.models.gguf.load_decoder`), itself tested equal to
``transformers``' ``LlamaForCausalLM`` on that file (``tests/test_pretrained.py``): loading
``transformers`` in the grader would cost seconds and memory a second time for the same numbers.
Check modules are read afresh from disk on every call, so the model and everything computed from
it live here, in an ordinary module that stays imported; the right answer's logits and greedy
ids are also kept in a file of the user's cache keyed by the GGUF file's digest
(:func:`cache_file`), so that grading a correct notebook loads no second model. The catalogued
mistakes' logits are computed only when an answer is wrong. One thread, float32, as in the
grader's sandbox. Every function returns new arrays or tensors.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

__all__ = ["TEXT", "CHAT", "TEXT_IDS", "CHAT_IDS", "N_NEW", "N_SHORT", "VARIANTS", "CACHE_VERSION",
           "text_ids", "chat_prompt", "cache_file", "logits", "greedy", "greedy_without_reset",
           "greedy_refeeding"]

TEXT = ("The transformer is a neural network that reads a whole sequence at once. Each layer "
        "lets every position look at every earlier one through attention, then passes the result "
        "through a small feed-forward network. Residual connections and normalisation keep the "
        "signal stable through many layers. Large language models stack dozens of such layers "
        "and learn, from a great deal of text, to predict the next token. Rotary position "
        "embeddings rotate queries and keys by an angle that grows with the position, so a score "
        "depends only on how far apart two tokens are. Grouped-query attention shares each key "
        "and value head among several query heads, which shrinks the cache that decoding keeps.")
CHAT = "Name three colours of the rainbow."
N_NEW = 20     # greedy tokens compared with the oracle
N_SHORT = 6    # the second call (a new sequence?) and the uncached one (equal to the cached?)

# the catalogued loading mistakes the oracle can reproduce (decoder.py holds their hints)
VARIANTS = ("unpermuted", "gate and up swapped", "eps default", "base 10000",
            "square not transposed", "W_O not transposed", "norms swapped")


# the tokenizer's ids of TEXT and of CHAT in the file's chat template, written out so that the
# grader never builds the tokenizer (tens of seconds); tests/test_pretrained.py checks them
TEXT_IDS = (
    504, 26832, 314, 253, 8844, 3082, 338, 12927, 253, 2444, 5972, 418, 2268, 30, 3768, 4070,
    13144, 897, 2548, 1492, 418, 897, 3685, 582, 738, 2674, 28, 965, 10466, 260, 966, 738, 253,
    1165, 2645, 29, 10403, 3082, 30, 1505, 311, 531, 3962, 284, 2955, 5014, 1446, 260, 4973, 7094,
    738, 800, 5466, 30, 13934, 1789, 2859, 10028, 16097, 282, 715, 5466, 284, 835, 28, 429, 253,
    1109, 3795, 282, 1694, 28, 288, 3142, 260, 1867, 9624, 30, 16744, 529, 2548, 47383, 19087,
    18795, 284, 8889, 411, 354, 7256, 338, 8759, 351, 260, 2548, 28, 588, 253, 6581, 5552, 805,
    335, 638, 1869, 5215, 827, 17837, 359, 30, 6404, 277, 29, 8433, 2674, 9478, 971, 1646, 284,
    1685, 1680, 1486, 1545, 8520, 8648, 28, 527, 16934, 3220, 260, 13842, 338, 30081, 8211, 30,
)
CHAT_IDS = (
    1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407,
    19712, 8182, 2, 198, 1, 4093, 198, 5820, 1296, 14797, 282, 260, 24594, 30, 2, 198, 1, 520,
    9531, 198,
)
CACHE_VERSION = 1      # bump when TEXT, CHAT, N_NEW or the oracle's computation changes
# the one oracle model is shared by the grader's threads (one per submission) and changed in
# place for a catalogued mistake: held for every use, so that one student's wrong answer never
# becomes the right answer another student is compared with (and the cache file keeps)
_MODEL_LOCK = threading.RLock()


def text_ids() -> torch.Tensor:
    """int64 ``(1, T)``: :data:`TEXT`'s tokens (T = 133)."""
    return torch.tensor([list(TEXT_IDS)])


def chat_prompt() -> torch.Tensor:
    """int64 ``(T0,)``: :data:`CHAT` in the file's chat template, the assistant's turn opened."""
    return torch.tensor(list(CHAT_IDS))


@lru_cache(maxsize=1)
def _model():
    from txlearn.models.gguf import load_decoder
    with _one_thread():
        return load_decoder(rope="half")


@lru_cache(maxsize=1)
def _raw_qk():
    """The file's W_Q and W_K of every layer, transposed but not permuted (interleaved)."""
    from txlearn.models.gguf_files import read_tensor
    n = len(_model().layers)
    return [(torch.from_numpy(read_tensor(f"blk.{i}.attn_q.weight").T.copy()),
             torch.from_numpy(read_tensor(f"blk.{i}.attn_k.weight").T.copy())) for i in range(n)]


@contextmanager
def _one_thread():
    from txlearn.learner_calls import one_thread
    with one_thread():
        yield


@contextmanager
def _changed(variant: str | None):
    """The oracle with one catalogued mistake, undone on exit (the model is held meanwhile)."""
    with _MODEL_LOCK:
        with _changed_held(variant) as model:
            yield model


@contextmanager
def _changed_held(variant: str | None):
    from txlearn.models.gguf import interleaved_to_half_heads
    model, undo = _model(), []

    def set_attr(obj, name, value):
        undo.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def set_param(param, value):
        undo.append((param, None, param.detach().clone()))
        param.copy_(value)

    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            attn, ffn = layer.attn, layer.ffn
            if variant == "unpermuted":
                set_param(attn.W_Q, _raw_qk()[i][0])
                set_param(attn.W_K, _raw_qk()[i][1])
            elif variant == "gate and up swapped":
                W_1, W_3 = ffn.W_1.detach().clone(), ffn.W_3.detach().clone()
                set_param(ffn.W_1, W_3)
                set_param(ffn.W_3, W_1)
            elif variant == "eps default":
                for norm in (layer.norm1, layer.norm2):
                    set_attr(norm, "eps", 1e-6)
            elif variant == "base 10000":
                set_attr(attn, "rope_base", 10000.0)
            elif variant == "square not transposed":     # the file's rows permuted as columns
                set_param(attn.W_Q, interleaved_to_half_heads(_raw_qk()[i][0].T, attn.n_heads))
                set_param(attn.W_O, attn.W_O.detach().T.clone())
            elif variant == "W_O not transposed":        # only the square W_O left as stored
                set_param(attn.W_O, attn.W_O.detach().T.clone())
            elif variant == "norms swapped":
                g1, g2 = layer.norm1.gamma.detach().clone(), layer.norm2.gamma.detach().clone()
                set_param(layer.norm1.gamma, g2)
                set_param(layer.norm2.gamma, g1)
        if variant == "eps default":
            set_attr(model.norm, "eps", 1e-6)
    try:
        yield model
    finally:
        with torch.no_grad():
            for obj, name, value in reversed(undo):
                if name is None:
                    obj.copy_(value)
                else:
                    setattr(obj, name, value)


def cache_file() -> Path:
    """Where the right answer's logits and greedy ids are kept between processes: the user's
    cache (``$XDG_CACHE_HOME`` or ``~/.cache``), ``txlearn/smollm2-<digest>-v<version>.npz``,
    keyed by the GGUF file's SHA-256 (another file, another cache)."""
    from txlearn.models.gguf_files import cache_folder
    folder = cache_folder()            # .../txlearn/smollm2-<digest>: the file sits beside it
    return folder.with_name(f"{folder.name}-v{CACHE_VERSION}.npz")


def _compute_right() -> dict:
    with _MODEL_LOCK, _one_thread(), torch.no_grad():
        model = _model()
        out = model(text_ids())[0].numpy()                                   # (T, n_vocab)
        ids = _generate(model, chat_prompt(), N_NEW, model.new_caches())
    return {"logits": out, "greedy": np.array(ids, dtype=np.int64)}


@lru_cache(maxsize=1)
def _right() -> dict:
    """The right model's logits and greedy ids: from the cache file when it holds them (the
    grader then loads no model for a correct answer), else computed and written there."""
    path = None
    try:
        path = cache_file()
        with np.load(path) as f:
            found = {k: f[k] for k in ("logits", "greedy")}
        if found["logits"].shape == (len(TEXT_IDS), 49152) and \
                found["greedy"].shape == (len(CHAT_IDS) + N_NEW,):
            return found
    except (OSError, ValueError, KeyError, ImportError):
        pass
    found = _compute_right()
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp.npz")
            np.savez(partial, **found)
            os.replace(partial, path)                  # whole or not at all
        except OSError:
            pass                                       # a read-only home: compute each process
    return found


@lru_cache(maxsize=len(VARIANTS))
def _logits(variant: str) -> np.ndarray:
    with _one_thread(), _changed(variant) as model, torch.no_grad():
        return model(text_ids())[0].numpy()                        # (T, n_vocab) float32


def logits(variant: str | None = None) -> np.ndarray:
    """float32 ``(T, n_vocab)``: the logits of :func:`text_ids`, of the right model or of one of
    :data:`VARIANTS` (a new array each call)."""
    return (_right()["logits"] if variant is None else _logits(variant)).copy()


@torch.no_grad()
def _generate(model, prompt, n_new, caches, refeed=False):
    ids = [int(i) for i in prompt]
    for step in range(n_new):
        x = ids if (step == 0 or refeed) else ids[-1:]
        logits = model(torch.tensor([x]), caches=caches)[0, -1]
        ids.append(int(logits.argmax()))
    return ids


def greedy() -> np.ndarray:
    """int64 ``(T0 + N_NEW,)``: the chat prompt and the oracle's greedy continuation."""
    return _right()["greedy"].copy()


def greedy_without_reset(n_new: int) -> np.ndarray:
    """The ids of a second greedy call of ``n_new`` tokens whose cache still holds the first
    call's sequence of :data:`N_NEW` (a ``generate`` that never calls ``reset_cache``)."""
    with _MODEL_LOCK, _one_thread():
        model = _model()
        caches = model.new_caches()
        _generate(model, chat_prompt(), N_NEW, caches)
        return np.array(_generate(model, chat_prompt(), n_new, caches))


def greedy_refeeding(n_new: int) -> np.ndarray:
    """The ids when every step runs the whole sequence again with the cache on (the cache then
    holds every position several times)."""
    with _MODEL_LOCK, _one_thread():
        model = _model()
        return np.array(_generate(model, chat_prompt(), n_new, model.new_caches(), refeed=True))
