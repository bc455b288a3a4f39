"""Lesson 09, part 1: train a small character-level causal transformer on real text, and sample it.

The model (:class:`CharTransformer`) is the course's own: a token table ``E (V, d_model)``,
learned positions, ``n_layers`` pre-LN :class:`txlearn.layer.TransformerLayer` (exact GELU) under a
causal mask, a final LayerNorm, and the output head tied to the token table (logits = h @ E^T,
Press & Wolf 2017). Pre-LN keeps training stable without a long warm-up (Xiong et al. 2020).

Training (:func:`train`) minimises the mean next-character cross-entropy with AdamW, a linear
warm-up then cosine decay of the learning rate, gradient-norm clipping, and a fixed seed. A
checkpoint is one safetensors file: the weights under ``model.``, AdamW's moments under
``optimizer.``, the RNG states (global and the data sampler's, which is the data position) under
``rng.``, and, in its JSON metadata, the configuration, the vocabulary, the step, the schedule, the
history and a fingerprint of the text. It is written to a temporary file and renamed, so a crash or
an error never leaves a half-written checkpoint, and ``resume=True`` continues the same trajectory.

The wall-time budget is ``TrainConfig.max_seconds``, capped by the environment variable
``TXLEARN_TRAIN_SECONDS`` when it is set (``make test`` sets a few seconds). It caps the training
loop: no step starts that would end past it (judging by the measured step time). The final
validation pass and the setup come on top (a few seconds each).

The ``txlearn train`` and ``txlearn sample`` subcommands are added to the lead's parser by
:func:`add_train_parser` and :func:`add_sample_parser`. Source: lesson 09.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from txlearn.data import (CharVocab, UserError, baselines, load_corpus, min_chars, nats_to_bits,
                          random_windows, split_by_position, val_windows)
from txlearn.heads import KVCache
from txlearn.layer import TransformerLayer
from txlearn.masks import causal_mask
from txlearn.norms import LayerNorm
from txlearn.positional import LearnedPositionalEmbedding

__all__ = [
    "UserError",
    "TrainConfig",
    "CharTransformer",
    "learning_rate",
    "time_budget",
    "evaluate",
    "TrainResult",
    "train",
    "save_checkpoint",
    "load_checkpoint",
    "generate",
    "sample_text",
    "add_train_parser",
    "add_sample_parser",
]

ENV_SECONDS = "TXLEARN_TRAIN_SECONDS"
DEFAULT_CHECKPOINT = "checkpoints/capstone.safetensors"


@dataclass
class TrainConfig:
    """Every number that shapes a training run (all of them are saved in the checkpoint).

    Model: ``d_model, n_heads, n_layers, d_ff`` and ``block_size`` (T, the context length in
    characters). Optimisation: ``batch_size`` (B windows of T characters), ``max_steps``, peak
    ``lr`` after ``warmup_steps`` linear steps, cosine decay to ``min_lr`` at ``max_steps``,
    AdamW ``weight_decay`` (on matrices only), ``grad_clip`` (max global L2 norm), ``seed``.
    Validation every ``eval_interval`` steps on ``eval_windows`` evenly spread windows; the full
    validation split at the end. ``max_seconds``: wall-time budget (capped by
    ``TXLEARN_TRAIN_SECONDS``); it is the one field that may change when resuming.
    """

    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int = 512
    block_size: int = 128
    batch_size: int = 24
    max_steps: int = 500
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 30
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    val_fraction: float = 0.1
    eval_interval: int = 50
    eval_windows: int = 32
    max_seconds: float = 140.0

    def trajectory(self) -> dict:
        """The fields a resumed run must share with its checkpoint (all but ``max_seconds``)."""
        d = dataclasses.asdict(self)
        d.pop("max_seconds")
        return d


class CharTransformer(nn.Module):
    """A causal character-level language model from the course's layers.

    ``logits = LayerNorm(layers(E[ids] + P[t])) @ E^T``: ids ``(B, T)`` int64 -> logits
    ``(B, T, V)`` float32. ``E (V, d_model)`` is the token table, shared with the output head.
    Each layer is pre-LN with exact GELU; the causal mask is bottom-right aligned, so the same
    code runs a whole window (no cache) or a few new positions after cached ones.
    """

    def __init__(self, vocab_size: int, d_model: int, n_heads: int, n_layers: int, d_ff: int,
                 block_size: int):
        super().__init__()
        self.E = nn.Parameter(torch.randn(vocab_size, d_model) * 0.02)
        self.position = LearnedPositionalEmbedding(block_size, d_model)
        self.layers = nn.ModuleList(
            TransformerLayer(d_model, n_heads, d_ff, activation="gelu", norm_first=True)
            for _ in range(n_layers))
        self.norm = LayerNorm(d_model)
        self.block_size = block_size

    @classmethod
    def from_config(cls, config: TrainConfig, vocab_size: int) -> "CharTransformer":
        return cls(vocab_size, config.d_model, config.n_heads, config.n_layers, config.d_ff,
                   config.block_size)

    def new_caches(self) -> list[KVCache]:
        """One empty :class:`txlearn.heads.KVCache` per layer."""
        return [KVCache() for _ in self.layers]

    def forward(self, ids: torch.Tensor, caches: list[KVCache] | None = None,
                return_weights: bool = False):
        """Logits ``(B, T, V)`` for ids ``(B, T)``, after the ``S_past`` positions in ``caches``.

        With ``return_weights=True`` also returns each layer's attention weights, a list of
        ``n_layers`` tensors ``(B, n_heads, T, S_past + T)``. Raises ``ValueError`` when
        ``S_past + T`` exceeds ``block_size`` (there is no learned position for it).
        """
        B, T = ids.shape
        past = len(caches[0]) if caches else 0
        S = past + T
        if S > self.block_size:
            raise ValueError(f"{S} positions exceed block_size {self.block_size}")
        x = self.E[ids] + self.position(torch.arange(past, S))   # (B, T, d_model)
        mask = causal_mask(T, S)                                  # (T, S) bottom-right
        weights = []
        for l, layer in enumerate(self.layers):
            cache = caches[l] if caches else None
            if return_weights:
                x, w = layer(x, mask=mask, cache=cache, return_weights=True)
                weights.append(w)                                 # (B, n_heads, T, S)
            else:
                x = layer(x, mask=mask, cache=cache)
        logits = self.norm(x) @ self.E.T                          # (B, T, V)
        return (logits, weights) if return_weights else logits


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
        logits = model(x[i:i + batch_size])                  # (b, T, V)
        total += F.cross_entropy(logits.flatten(0, 1), y[i:i + batch_size].flatten(),
                                 reduction="sum").item()
    model.train(was_training)
    return total / y.numel()


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices (dim >= 2: weights, the token and position tables); not biases or gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def _fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# ---- checkpoint --------------------------------------------------------------------------------

def save_checkpoint(path, model, optimizer, config: TrainConfig, vocab: CharVocab, step: int,
                    data_generator: torch.Generator, history: list, text_fingerprint: str,
                    baseline_nats: dict) -> Path:
    """Write everything a run needs to continue into one safetensors file, atomically.

    Tensors: ``model.<name>`` (weights), ``optimizer.<i>.<key>`` (AdamW state of parameter i),
    ``rng.torch``, ``rng.data``. Metadata (JSON strings): config, vocab, step, param_groups,
    history, text fingerprint, baselines. Written to ``<path>.tmp-<pid>`` then renamed.
    """
    from safetensors.torch import save_file

    path = Path(path)
    tensors = {f"model.{k}": v.detach().contiguous() for k, v in model.state_dict().items()}
    state = optimizer.state_dict()
    for i, s in state["state"].items():
        for k, v in s.items():
            tensors[f"optimizer.{i}.{k}"] = torch.as_tensor(v).contiguous()
    tensors["rng.torch"] = torch.get_rng_state()
    tensors["rng.data"] = data_generator.get_state()
    meta = {"format": "txlearn-capstone-1", "config": json.dumps(dataclasses.asdict(config)),
            "vocab": json.dumps(vocab.chars), "step": str(step),
            "param_groups": json.dumps(state["param_groups"]), "history": json.dumps(history),
            "text_sha256": text_fingerprint, "baselines": json.dumps(baseline_nats)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        save_file(tensors, str(tmp), metadata=meta)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def load_checkpoint(path) -> dict:
    """Read a checkpoint: ``{"model", "vocab", "config", "step", "history", "tensors", "meta"}``.

    ``model`` is a :class:`CharTransformer` with the saved weights (eval mode). Raises
    ``UserError`` when the file is missing, is not a txlearn capstone checkpoint, or its weights
    do not fit its own configuration.
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such checkpoint")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as err:  # safetensors raises its own error types for a bad header
        raise UserError(f"{path}: not a safetensors checkpoint ({type(err).__name__})") from None
    if meta.get("format") != "txlearn-capstone-1":
        raise UserError(f"{path}: not a txlearn capstone checkpoint")
    config = TrainConfig(**json.loads(meta["config"]))
    vocab = CharVocab(json.loads(meta["vocab"]))
    model = CharTransformer.from_config(config, len(vocab))
    weights = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as err:
        first = str(err).strip().splitlines()[-1].strip()
        raise UserError(f"{path}: weights do not match its configuration: {first}") from None
    return {"model": model.eval(), "vocab": vocab, "config": config, "step": int(meta["step"]),
            "history": json.loads(meta["history"]), "tensors": tensors, "meta": meta}


def _restore_optimizer(optimizer, ckpt: dict) -> None:
    state: dict = {}
    for key, v in ckpt["tensors"].items():
        if key.startswith("optimizer."):
            _, i, name = key.split(".", 2)
            state.setdefault(int(i), {})[name] = v
    groups = json.loads(ckpt["meta"]["param_groups"])
    for g in groups:
        g["betas"] = tuple(g["betas"])
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def _check_resumable(ckpt: dict, config: TrainConfig, vocab: CharVocab, fingerprint: str,
                     path) -> None:
    saved = ckpt["config"].trajectory()
    diff = [f"{k}={saved[k]} (this run: {v})" for k, v in config.trajectory().items()
            if saved.get(k) != v]
    if diff:
        raise UserError(f"{path}: configuration does not match the checkpoint: {', '.join(diff)}")
    if ckpt["vocab"] != vocab or ckpt["meta"]["text_sha256"] != fingerprint:
        raise UserError(f"{path}: the checkpoint was trained on a different text")


# ---- training ----------------------------------------------------------------------------------

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


def _validate(config: TrainConfig) -> None:
    """Raise ``UserError`` for a configuration no run can use (naming the numbers)."""
    sizes = ("d_model", "n_heads", "n_layers", "d_ff", "block_size", "batch_size",
             "eval_interval", "eval_windows")
    bad = [f"{k}={getattr(config, k)}" for k in sizes if getattr(config, k) < 1]
    bad += [f"{k}={getattr(config, k)}" for k in ("max_steps", "warmup_steps")
            if getattr(config, k) < 0]
    bad += [f"{k}={getattr(config, k)}" for k in ("lr", "max_seconds")
            if not getattr(config, k) > 0]
    if bad:
        raise UserError(f"invalid configuration: {', '.join(bad)}")
    if config.d_model % config.n_heads:
        raise UserError(f"d_model {config.d_model} is not divisible by n_heads {config.n_heads}")
    if not 0 < config.val_fraction < 1:
        raise UserError(f"val_fraction {config.val_fraction} must lie strictly between 0 and 1")


def _prepare(config: TrainConfig, text: str):
    _validate(config)
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
    fingerprint, budget = _fingerprint(text), time_budget(config)
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
        _check_resumable(ckpt, config, vocab, fingerprint, checkpoint)
        model.load_state_dict(ckpt["model"].state_dict())
        _restore_optimizer(optimizer, ckpt)
        torch.set_rng_state(ckpt["tensors"]["rng.torch"])
        data_generator.set_state(ckpt["tensors"]["rng.data"])
        step, history = ckpt["step"], ckpt["history"]
    def save(at_step: int):
        if checkpoint is not None:
            return save_checkpoint(checkpoint, model, optimizer, config, vocab, at_step,
                                   data_generator, history, fingerprint, base)

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
    logits = model(x)                                                  # (B, T, V)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())          # (B*T, V) vs (B*T,)
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
    log(f"text: {len(text):,} characters, vocabulary V = {len(vocab)}; "
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


# ---- sampling ----------------------------------------------------------------------------------

def _next_id(logits: torch.Tensor, temperature: float, top_k: int | None,
             generator: torch.Generator | None) -> int:
    """Pick the next id from ``logits (V,)``: argmax at temperature 0, else a top-k sample."""
    if temperature == 0:
        return int(logits.argmax())
    logits = logits / temperature
    if top_k is not None and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.no_grad()
def generate(model: CharTransformer, prompt_ids, n_new: int, temperature: float = 1.0,
             top_k: int | None = None, seed: int | None = 0,
             use_cache: bool = True) -> torch.Tensor:
    """Extend ``prompt_ids (T0,)`` by ``n_new`` ids; returns int64 ``(T0 + n_new,)``.

    Temperature 0 is greedy; otherwise ids are sampled from ``softmax(logits / temperature)``
    restricted to the ``top_k`` largest logits. The context is the last ``block_size`` ids; when
    it is full, generation restarts from its last ``block_size // 2`` ids (a fresh prefill of the
    key/value cache), so the cached path (one position per step) and the uncached one (the whole
    context every step) compute the same thing. Raises ``ValueError`` for an empty prompt, a
    negative temperature, or ``top_k < 1``.
    """
    ids = [int(i) for i in prompt_ids]
    if not ids:
        raise ValueError("the prompt must hold at least one character")
    if temperature < 0 or (top_k is not None and top_k < 1):
        raise ValueError(f"temperature {temperature} must be >= 0 and top_k {top_k} >= 1")
    model.eval()
    T = model.block_size
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    start, caches = max(0, len(ids) - T), None
    for _ in range(n_new):
        if use_cache and caches is not None:
            logits = model(torch.tensor([ids[-1:]]), caches)[0, -1]              # (V,)
        else:
            caches = model.new_caches() if use_cache else None
            logits = model(torch.tensor([ids[start:]]), caches)[0, -1]           # (V,)
        ids.append(_next_id(logits, temperature, top_k, generator))
        if len(ids) - start > T:               # the context is full: restart from its last half
            start, caches = len(ids) - T // 2, None
    return torch.tensor(ids, dtype=torch.long)


def sample_text(checkpoint, prompt: str, n_new: int = 300, temperature: float = 0.8,
                top_k: int | None = 10, seed: int = 0, use_cache: bool = True) -> str:
    """Load ``checkpoint`` and return ``prompt`` followed by ``n_new`` generated characters.

    Raises ``UserError`` for a bad checkpoint, an empty prompt, or prompt characters outside the
    checkpoint's vocabulary (naming them).
    """
    ckpt = load_checkpoint(checkpoint)
    if not prompt:
        raise UserError("the prompt is empty; give at least one character")
    ids = ckpt["vocab"].encode(prompt)
    out = generate(ckpt["model"], ids, n_new, temperature, top_k, seed, use_cache)
    return ckpt["vocab"].decode(out)


# ---- command line ------------------------------------------------------------------------------

_CLI_FIELDS = ("d_model", "n_heads", "n_layers", "d_ff", "block_size", "batch_size", "max_steps",
               "lr", "seed", "max_seconds")


def add_train_parser(subparsers) -> None:
    """Add ``txlearn train``: train the capstone model, print baselines and validation loss."""
    p = subparsers.add_parser(
        "train", help="train the capstone character model (lesson 09)",
        description="Train a small causal transformer on the Python language reference "
                    "(pydoc_data) or on --text FILE, print its validation loss beside the "
                    f"uniform/unigram/bigram baselines, save a checkpoint. {ENV_SECONDS} caps "
                    "the wall time.")
    p.add_argument("--text", metavar="FILE", help="a UTF-8 text file (default: pydoc_data topics)")
    p.add_argument("--out", metavar="CKPT", default=DEFAULT_CHECKPOINT,
                   help=f"checkpoint path (default: {DEFAULT_CHECKPOINT})")
    p.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    defaults = TrainConfig()
    for name in _CLI_FIELDS:
        kind = type(getattr(defaults, name))
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None,
                       help=f"default {getattr(defaults, name)}")
    p.set_defaults(func=_run_train)


def _run_train(args) -> int:
    out = Path(args.out)
    if out.exists() and not (args.resume or args.force):
        raise UserError(f"{out} exists; pass --resume to continue it or --force to overwrite it")
    config = load_checkpoint(out)["config"] if args.resume else TrainConfig()
    overrides = {k: getattr(args, k) for k in _CLI_FIELDS if getattr(args, k) is not None}
    config = dataclasses.replace(config, **overrides)
    text = load_corpus(args.text)
    train(config, text, checkpoint=out, resume=args.resume, progress=not args.no_progress)
    return 0


def add_sample_parser(subparsers) -> None:
    """Add ``txlearn sample CKPT --prompt TEXT``: generate with temperature and top-k (KV cache)."""
    p = subparsers.add_parser("sample", help="generate text from a capstone checkpoint",
                              description="Generate characters from a checkpoint of "
                                          "`txlearn train`, using the key/value cache.")
    p.add_argument("checkpoint", metavar="CKPT")
    p.add_argument("--prompt", default="def ", help="text to continue (default: 'def ')")
    p.add_argument("--length", type=int, default=300, help="characters to generate (300)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=10, help="sample among the k likeliest (10)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-cache", action="store_true", help="recompute the context every step")
    p.set_defaults(func=_run_sample)


def _run_sample(args) -> int:
    for option, value, least in (("--length", args.length, 0),
                                 ("--temperature", args.temperature, 0), ("--top-k", args.top_k, 1)):
        if value < least:
            raise UserError(f"{option} must be >= {least}, got {value}")
    print(sample_text(args.checkpoint, args.prompt, args.length, args.temperature, args.top_k,
                      args.seed, not args.no_cache))
    return 0
