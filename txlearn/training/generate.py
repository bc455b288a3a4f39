"""Lesson 09: generate text from a language model, with or without the key/value cache.

Each step's next character comes from :func:`txlearn.sampling.sample_next` (greedy, temperature,
top-k, top-p). Source: lesson 09.
"""

from __future__ import annotations

import torch

from txlearn.models.char_lm import CharTransformer
from txlearn.sampling import check_settings, sample_next
from txlearn.training.checkpoint import load_checkpoint
from txlearn.training.data import UserError

__all__ = ["generate", "sample_text"]


@torch.no_grad()
def generate(model: CharTransformer, prompt_ids, n_new: int, temperature: float = 1.0,
             top_k: int | None = None, seed: int | None = 0, use_cache: bool = True,
             top_p: float | None = None, stop_ids=()) -> torch.Tensor:
    """Extend ``prompt_ids (T0,)`` by ``n_new`` ids; returns int64 ``(T0 + n_new,)``, or shorter
    when one of ``stop_ids`` was generated (it is kept; e.g. lesson 10's end-of-turn token).

    Each id comes from :func:`txlearn.sampling.sample_next` (temperature 0 is greedy; otherwise
    ``softmax(logits / temperature)`` restricted by ``top_k``, then ``top_p``; a ``seed`` fixes
    the draws). The context is the last ``block_size`` ids; when it is full, generation restarts
    from its last ``block_size // 2`` ids (a fresh prefill of the key/value cache), so the cached
    path (one position per step) and the uncached one (the whole context every step) compute the
    same thing. Any model with ``block_size``, ``new_caches()`` and ``forward(ids, caches)`` works
    (lesson 09's :class:`CharTransformer`, lesson 10's ``LlamaDecoder``). Raises ``ValueError``
    for an empty prompt or sampler settings that :func:`txlearn.sampling.check_settings` rejects.
    """
    ids = [int(i) for i in prompt_ids]
    if not ids:
        raise ValueError("the prompt must hold at least one character")
    check_settings(temperature, top_k, top_p)
    model.eval()
    device = next(model.parameters()).device
    T = model.block_size
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    start, caches = max(0, len(ids) - T), None
    for _ in range(n_new):
        if use_cache and caches is not None:
            logits = model(torch.tensor([ids[-1:]], device=device), caches)[0, -1]  # (n_vocab,)
        else:
            caches = model.new_caches() if use_cache else None
            logits = model(torch.tensor([ids[start:]], device=device), caches)[0, -1]
        logits = logits.float().cpu()     # the sampler draws on the CPU: the same ids anywhere
        ids.append(int(sample_next(logits, temperature, top_k, top_p, generator)))
        if ids[-1] in stop_ids:
            break
        if len(ids) - start > T:               # the context is full: restart from its last half
            start, caches = len(ids) - T // 2, None
    return torch.tensor(ids, dtype=torch.long)


def sample_text(checkpoint, prompt: str, n_new: int = 300, temperature: float = 0.8,
                top_k: int | None = 10, seed: int = 0, use_cache: bool = True,
                top_p: float | None = None, device: str = "auto") -> str:
    """Load ``checkpoint`` and return ``prompt`` followed by ``n_new`` generated characters.

    ``device``: where the model runs (``"auto"``: the GPU when PyTorch sees one, else the CPU;
    :func:`txlearn.training.runtime.resolve_device`). Raises ``UserError`` for a bad
    checkpoint, an empty prompt, prompt characters outside the checkpoint's vocabulary (naming
    them), or an unknown device.
    """
    from txlearn.training.runtime import resolve_device

    ckpt = load_checkpoint(checkpoint)
    if not prompt:
        raise UserError("the prompt is empty; give at least one character")
    ids = ckpt["vocab"].encode(prompt)
    model = ckpt["model"].to(resolve_device(device))
    out = generate(model, ids, n_new, temperature, top_k, seed, use_cache, top_p)
    return ckpt["vocab"].decode(out)
