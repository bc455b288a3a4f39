"""Lesson 09: generate text from a language model, with or without the key/value cache.

Each step's next character comes from :func:`txlearn.sampling.sample_next` (greedy, temperature,
top-k, top-p). Source: lesson 09.
"""

from __future__ import annotations

import torch

from txlearn.models.char_lm import CharTransformer
from txlearn.masks import left_padding_mask
from txlearn.sampling import apply_repetition_penalty, check_settings, sample_next
from txlearn.training.checkpoint import load_checkpoint
from txlearn.training.data import UserError

__all__ = ["generate", "sample_text"]


def _is_batch(prompt_ids) -> bool:
    """Several prompts (a list or tuple of 1-D id sequences, or a 2-D tensor) rather than one."""
    if isinstance(prompt_ids, torch.Tensor):
        return prompt_ids.dim() == 2
    if not isinstance(prompt_ids, (list, tuple)) or not prompt_ids:
        return False
    return all(isinstance(p, (list, tuple)) or getattr(p, "ndim", 0) == 1 for p in prompt_ids)


def _forward(model, ids, caches, mask):
    """The model's logits; the padding mask only when there is padding (a model without the
    keyword still generates one prompt)."""
    if mask is None:
        return model(ids, caches)
    return model(ids, caches, key_padding_mask=mask)


def _left_padded(windows: list[list[int]], device):
    """``(ids (B, S), key_padding_mask (B, S) or None)``: each window right-aligned, padded on the
    left with id 0; the mask is None when every window has the same length (no padding)."""
    S = max(len(w) for w in windows)
    ids = torch.tensor([[0] * (S - len(w)) + w for w in windows], device=device)   # (B, S)
    if all(len(w) == S for w in windows):
        return ids, None
    return ids, left_padding_mask([len(w) for w in windows], S, device=device)   # (B, S)


@torch.no_grad()
def generate(model: CharTransformer, prompt_ids, n_new: int, temperature: float = 1.0,
             top_k: int | None = None, seed: int | None = 0, use_cache: bool = True,
             top_p: float | None = None, stop_ids=(), repetition_penalty: float = 1.0):
    """Extend ``prompt_ids (T0,)`` by ``n_new`` ids; returns int64 ``(T0 + n_new,)``, or shorter
    when one of ``stop_ids`` was generated (it is kept; e.g. lesson 10's end-of-turn token).

    Several prompts at once: ``prompt_ids`` a list of id sequences (lengths may differ) returns
    a list of int64 tensors, one per prompt, each equal to generating that prompt alone (tested).
    They run as one batch, left-padded (:func:`txlearn.masks.left_padding_mask`): the model gets
    the padding mask, never attends to padding, and counts each row's positions from its first
    real token; each row draws from its own generator seeded with ``seed``, so a prompt's text
    does not depend on the others. A row that generated a stop id stops there (the batch goes on
    until every row has stopped or ``n_new`` steps are made).

    Each id comes from :func:`txlearn.sampling.sample_next` (temperature 0 is greedy; otherwise
    ``softmax(logits / temperature)`` restricted by ``top_k``, then ``top_p``; a ``seed`` fixes
    the draws), after :func:`txlearn.sampling.apply_repetition_penalty` with
    ``repetition_penalty`` on the ids of the row so far (prompt and generated; 1 = off). The
    context is the last ``block_size`` ids; when a row's is full, it restarts from its last
    ``block_size // 2`` ids (a fresh prefill of the key/value cache of the whole batch), so the
    cached path (one position per step) and the uncached one (the whole context every step)
    compute the same thing. Any model with ``block_size``, ``new_caches()`` and
    ``forward(ids, caches, key_padding_mask=...)`` works (lesson 09's :class:`CharTransformer`,
    lesson 10's ``LlamaDecoder``). Raises ``ValueError`` for no prompt, an empty prompt (its
    index named) or sampler settings that :func:`txlearn.sampling.check_settings` rejects.
    """
    batched = _is_batch(prompt_ids)
    rows = [[int(i) for i in p] for p in (prompt_ids if batched else [prompt_ids])]
    if not rows:
        raise ValueError("no prompts: give at least one")
    for r, ids in enumerate(rows):
        if not ids:
            raise ValueError("the prompt must hold at least one character" if not batched
                             else f"prompt {r} is empty: each must hold at least one id")
    check_settings(temperature, top_k, top_p, repetition_penalty)
    model.eval()
    device = next(model.parameters()).device
    T = model.block_size
    generators = [None if seed is None else torch.Generator().manual_seed(seed) for _ in rows]
    starts = [max(0, len(ids) - T) for ids in rows]
    ends = [None] * len(rows)             # where a row stopped (after its stop id)
    caches, mask = None, None
    for _ in range(n_new):
        if use_cache and caches is not None:
            step = torch.tensor([ids[-1:] for ids in rows], device=device)         # (B, 1)
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)     # (B, S + 1)
            logits = _forward(model, step, caches, mask)[:, -1]                 # (B, n_vocab)
        else:
            caches = model.new_caches() if use_cache else None
            batch, mask = _left_padded([ids[s:] for ids, s in zip(rows, starts)], device)
            logits = _forward(model, batch, caches, mask)[:, -1]                # (B, n_vocab)
        logits = logits.float().cpu()     # the sampler draws on the CPU: the same ids anywhere
        for r, ids in enumerate(rows):
            z = logits[r]
            if repetition_penalty != 1:
                z = apply_repetition_penalty(z, ids, repetition_penalty)
            ids.append(int(sample_next(z, temperature, top_k, top_p, generators[r])))
            if ends[r] is None and ids[-1] in stop_ids:
                ends[r] = len(ids)
            if len(ids) - starts[r] > T:   # the context is full: restart from its last half
                starts[r], caches = len(ids) - T // 2, None
        if all(e is not None for e in ends):
            break
    out = [torch.tensor(ids[:e], dtype=torch.long) for ids, e in zip(rows, ends)]
    return out if batched else out[0]


def sample_text(checkpoint, prompt, n_new: int = 300, temperature: float = 0.8,
                top_k: int | None = 10, seed: int = 0, use_cache: bool = True,
                top_p: float | None = None, device: str = "auto",
                repetition_penalty: float = 1.0):
    """Load ``checkpoint`` and return ``prompt`` followed by ``n_new`` generated characters.

    ``prompt``: one string, or a list of strings generated together as one left-padded batch
    (:func:`generate`), which returns a list of texts, each the one that prompt gives alone.
    ``repetition_penalty``: :func:`txlearn.sampling.apply_repetition_penalty` (1 = off).
    ``device``: where the model runs (``"auto"``: the GPU when PyTorch sees one, else the CPU;
    :func:`txlearn.training.runtime.resolve_device`). Raises ``UserError`` for a bad
    checkpoint, an empty prompt, prompt characters outside the checkpoint's vocabulary (naming
    them), or an unknown device.
    """
    from txlearn.training.runtime import resolve_device

    ckpt = load_checkpoint(checkpoint)
    several = not isinstance(prompt, str)
    prompts = list(prompt) if several else [prompt]
    if not prompts or not all(prompts):
        raise UserError("the prompt is empty; give at least one character")
    ids = [ckpt["vocab"].encode(p) for p in prompts]
    model = ckpt["model"].to(resolve_device(device))
    out = generate(model, ids if several else ids[0], n_new, temperature, top_k, seed,
                   use_cache, top_p, repetition_penalty=repetition_penalty)
    return [ckpt["vocab"].decode(o) for o in out] if several else ckpt["vocab"].decode(out)
