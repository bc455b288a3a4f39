"""Lesson 09: train the capstone model on real text.

:func:`train` minimises the mean next-character cross-entropy with AdamW, a linear warm-up then
cosine decay of the learning rate, gradient-norm clipping, and a fixed seed; it checkpoints at every
validation interval (:mod:`txlearn.capstone.checkpoint`) and ``resume=True`` continues the same
trajectory.

The wall-time budget is ``TrainConfig.max_seconds``, capped by the environment variable
``TXLEARN_TRAIN_SECONDS`` when it is set (``make test`` sets a few seconds). It caps the training
loop: no step starts that would end past it (judging by the measured step time). The final
validation pass and the setup come on top (a few seconds each). Source: lesson 09.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from txlearn.capstone.checkpoint import (check_resumable, fingerprint, load_checkpoint,
                                         restore_optimizer, save_checkpoint)
from txlearn.capstone.config import TrainConfig, validate
from txlearn.capstone.data import (CharVocab, UserError, baselines, load_corpus, min_chars,
                                   nats_to_bits, random_windows, split_by_position, val_windows)
from txlearn.capstone.model import CharTransformer

__all__ = ["ENV_SECONDS", "learning_rate", "time_budget", "evaluate", "TrainResult", "train"]

ENV_SECONDS = "TXLEARN_TRAIN_SECONDS"


def learning_rate(step: int, config: TrainConfig) -> float:
    """Linear warm-up to ``lr`` over ``warmup_steps``, then cosine decay to ``min_lr``.

    ``lr_t = lr (t + 1) / warmup`` for ``t < warmup``; then with ``p = (t - warmup) / (max_steps
    - warmup)`` clipped to [0, 1], ``lr_t = min_lr + (lr - min_lr) (1 + cos(pi p)) / 2``.
    """
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    p = (step - config.warmup_steps) / max(1, config.max_steps - config.warmup_steps)
    p = min(max(p, 0.0), 1.0)
    return config.min_lr + (config.lr - config.min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))


def time_budget(config: TrainConfig) -> float:
    """Seconds of wall time this run may take: ``max_seconds``, capped by TXLEARN_TRAIN_SECONDS.

    Raises ``UserError`` when the variable is set but is not a positive number.
    """
    raw = os.environ.get(ENV_SECONDS)
    if raw is None or raw == "":
        return config.max_seconds
    try:
        cap = float(raw)
    except ValueError:
        cap = -1.0
    if not cap > 0:
        raise UserError(f"{ENV_SECONDS}={raw!r} is not a positive number of seconds")
    return min(config.max_seconds, cap)


@torch.no_grad()
def evaluate(model: CharTransformer, val_ids: torch.Tensor, block_size: int,
             max_windows: int | None = None, batch_size: int = 64) -> float:
    """Mean next-character cross-entropy (nats) over non-overlapping validation windows."""
    was_training = model.training
    model.eval()
    x, y = val_windows(val_ids, block_size, max_windows)   # (W, T) each
    total = 0.0
    for i in range(0, len(x), batch_size):
        logits = model(x[i:i + batch_size])                  # (b, T, n_vocab)
        total += F.cross_entropy(logits.flatten(0, 1), y[i:i + batch_size].flatten(),
                                 reduction="sum").item()
    model.train(was_training)
    return total / y.numel()


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices (dim >= 2: weights, the token and position tables); not biases or gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


@dataclass
class TrainResult:
    """What :func:`train` returns; losses are mean cross-entropy in nats per character."""

    model: CharTransformer
    vocab: CharVocab
    config: TrainConfig
    baselines: dict
    val_nats: float
    step: int
    seconds: float
    stopped_by: str                       # "steps" or "time"
    history: list = field(default_factory=list)   # {"step", "train", "val", "lr"} at intervals
    train_losses: list = field(default_factory=list)  # every step of this call
    checkpoint: Path | None = None

    @property
    def val_bits(self) -> float:
        return nats_to_bits(self.val_nats)


def _prepare(config: TrainConfig, text: str):
    validate(config)
    if len(text) < min_chars(config.block_size, config.val_fraction):
        raise UserError(f"the text has {len(text)} characters; block_size {config.block_size} "
                        f"needs at least {min_chars(config.block_size, config.val_fraction)}")
    vocab = CharVocab.from_text(text)
    train_ids, val_ids = split_by_position(vocab.encode(text), config.block_size,
                                           config.val_fraction)
    return vocab, train_ids, val_ids


def train(config: TrainConfig | None = None, text: str | None = None, checkpoint=None,
          resume: bool = False, stop_after: int | None = None, progress: bool = True,
          log=print) -> TrainResult:
    """Train :class:`CharTransformer` on ``text`` (default: the pydoc_data language reference).

    Runs until ``config.max_steps``, the time budget (:func:`time_budget`) or, in this call,
    ``stop_after`` steps, whichever comes first; then measures the full validation split and, if
    ``checkpoint`` is a path, saves there. ``resume=True`` loads ``checkpoint`` first and
    continues its trajectory exactly. ``log`` receives the summary lines (None: silent).
    Raises ``UserError`` for a too-short text, a missing or mismatched checkpoint (nothing is
    written in that case).
    """
    config = config or TrainConfig()
    text = load_corpus() if text is None else text
    log = log or (lambda *a: None)
    vocab, train_ids, val_ids = _prepare(config, text)
    text_sha, budget = fingerprint(text), time_budget(config)
    base = baselines(train_ids, val_ids, len(vocab))
    torch.manual_seed(config.seed)
    model = CharTransformer.from_config(config, len(vocab))
    optimizer = torch.optim.AdamW(_param_groups(model, config.weight_decay), lr=config.lr,
                                  betas=(0.9, 0.99))
    data_generator = torch.Generator().manual_seed(config.seed)
    step, history = 0, []
    if resume:
        if checkpoint is None:
            raise UserError("resume needs a checkpoint path")
        ckpt = load_checkpoint(checkpoint)
        check_resumable(ckpt, config, vocab, text_sha, checkpoint)
        model.load_state_dict(ckpt["model"].state_dict())
        restore_optimizer(optimizer, ckpt)
        torch.set_rng_state(ckpt["tensors"]["rng.torch"])
        data_generator.set_state(ckpt["tensors"]["rng.data"])
        step, history = ckpt["step"], ckpt["history"]
    def save(at_step: int):
        if checkpoint is not None:
            return save_checkpoint(checkpoint, model, optimizer, config, vocab, at_step,
                                   data_generator, history, text_sha, base)

    _log_start(log, text, vocab, train_ids, val_ids, base, config, budget, step)
    losses, stopped_by, seconds = _loop(model, optimizer, config, train_ids, val_ids,
                                        data_generator, step, history, budget,
                                        stop_after, progress, save)
    step += len(losses)
    val = evaluate(model, val_ids, config.block_size)
    history.append({"step": step, "train": losses[-1] if losses else None, "val": val,
                    "lr": learning_rate(max(step - 1, 0), config)})
    path = save(step)
    result = TrainResult(model.eval(), vocab, config, base, val, step, seconds, stopped_by,
                         history, losses, path)
    _log_end(log, result)
    return result


def _train_step(model, optimizer, config, x, y, lr) -> float:
    for group in optimizer.param_groups:
        group["lr"] = lr
    logits = model(x)                                                  # (B, T, n_vocab)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())          # (B*T, n_vocab) vs (B*T,)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    return loss.item()


def _loop(model, optimizer, config, train_ids, val_ids, data_generator, step, history, budget,
          stop_after, progress, save):
    """Train until the last step, or until the next step would end past ``budget`` seconds.

    Every ``eval_interval`` steps: a validation estimate, appended to ``history``, and
    ``save(step)`` (a checkpoint to resume from if the run is interrupted).
    Returns (losses of this call, "steps" or "time", seconds)."""
    from tqdm import tqdm  # the text bar: tqdm.auto warns in kernels without ipywidgets

    model.train()
    losses, start = [], time.perf_counter()
    last = config.max_steps if stop_after is None else min(config.max_steps, step + stop_after)
    tokens = config.batch_size * config.block_size
    bar = tqdm(total=config.max_steps, initial=step, disable=not progress, desc="train",
               unit="step", dynamic_ncols=True)
    stopped_by, step_time = "steps", 0.0
    while step < last:
        if time.perf_counter() + step_time - start >= budget:
            stopped_by = "time"
            break
        t = time.perf_counter()
        x, y = random_windows(train_ids, config.batch_size, config.block_size, data_generator)
        losses.append(_train_step(model, optimizer, config, x, y, learning_rate(step, config)))
        step += 1
        now = time.perf_counter()
        step_time = max(now - t, (now - start) / len(losses))
        bar.update(1)
        rate = tokens * len(losses) / (now - start)
        bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{rate:,.0f}")
        if step % config.eval_interval == 0 and step < last:
            val = evaluate(model, val_ids, config.block_size, config.eval_windows)
            history.append({"step": step, "train": losses[-1], "val": val,
                            "lr": learning_rate(step - 1, config)})
            bar.set_postfix(loss=f"{losses[-1]:.3f}", val=f"{val:.3f}", tok_s=f"{rate:,.0f}")
            save(step)
            model.train()
    bar.close()
    return losses, stopped_by, time.perf_counter() - start


def _log_start(log, text, vocab, train_ids, val_ids, base, config, budget, step) -> None:
    log(f"text: {len(text):,} characters, vocabulary n_vocab = {len(vocab)}; "
        f"train {len(train_ids):,}, validation {len(val_ids):,} "
        f"(the last {config.val_fraction:.0%})")
    log("baselines on the validation split (nats/char | bits/char): " + ", ".join(
        f"{k} {v:.3f} | {nats_to_bits(v):.3f}" for k, v in base.items()))
    start = f"resuming at step {step}, " if step else ""
    log(f"{start}up to {config.max_steps} steps of {config.batch_size} x {config.block_size} "
        f"characters, budget {budget:.0f} s")


def _log_end(log, r: TrainResult) -> None:
    bigram = r.baselines["bigram"]
    verdict = (f"{bigram - r.val_nats:.3f} nats/char below the bigram's {bigram:.3f}"
               if r.val_nats < bigram else f"not yet below the bigram's {bigram:.3f}")
    log(f"model: validation {r.val_nats:.3f} nats/char = {r.val_bits:.3f} bits/char after "
        f"{r.step} steps ({r.seconds:.1f} s of training in this run, stopped by "
        f"{r.stopped_by}); {verdict}")
    if r.checkpoint is not None:
        log(f"checkpoint: {r.checkpoint}")
