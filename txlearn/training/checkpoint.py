"""Lesson 09: training checkpoints, one safetensors file that a run can resume from exactly.

The weights under ``model.``, AdamW's moments under ``optimizer.``, the RNG states (global and the
data sampler's, which is the data position) under ``rng.``, and, in its JSON metadata, the
configuration, the vocabulary, the step, the schedule, the history and a fingerprint of the text.
It is written to a temporary file and renamed, so a crash or an error never leaves a half-written
checkpoint. Source: lesson 09.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import torch

from txlearn.models.char_lm import CharTransformer
from txlearn.training.config import TrainConfig
from txlearn.training.data import CharVocab, UserError

__all__ = ["save_checkpoint", "load_checkpoint", "restore_optimizer", "check_resumable",
           "fingerprint"]


def fingerprint(text: str) -> str:
    """The first 16 hex digits of the text's SHA-256 (a resumed run must train on the same text)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def save_checkpoint(path, *, model, optimizer, config: TrainConfig, vocab: CharVocab, step: int,
                    data_generator: torch.Generator, history: list, text_fingerprint: str,
                    baseline_nats: dict, planned_steps: int | None = None,
                    rank_rng: list[dict] | None = None, progress: float | None = None) -> Path:
    """Write everything a run needs to continue into one safetensors file, atomically.

    Everything after ``path`` is keyword-only (twelve values: a call cannot swap two of them
    silently).

    Tensors: ``model.<name>`` (weights), ``optimizer.<i>.<key>`` (AdamW state of parameter i),
    ``rng.torch``, ``rng.data`` (and ``rng.cuda`` when the model is on a GPU). Metadata (JSON
    strings): config, vocab, step, param_groups, history, text fingerprint, baselines, and the
    schedule's planned length (``planned_steps``; None until the run has planned it) and the
    decay's ``progress`` at this step (:class:`txlearn.training.schedule.Schedule`). Tensors
    are stored from the CPU. Written to ``<path>.tmp-<pid>`` then renamed.

    ``rank_rng``: in a run of several processes, every rank's generator states
    (``[{"torch": ..., "cuda": ...}, ...]``, rank 0 first; each rank draws its own dropout
    masks), stored as ``rng.torch`` / ``rng.cuda`` for rank 0 and ``rng.torch.rank<r>`` /
    ``rng.cuda.rank<r>`` for the others.
    """
    from safetensors.torch import save_file

    path = Path(path)
    tensors = {f"model.{k}": v.detach().cpu().contiguous()
               for k, v in model.state_dict().items()}
    state = optimizer.state_dict()
    for i, s in state["state"].items():
        for k, v in s.items():
            tensors[f"optimizer.{i}.{k}"] = torch.as_tensor(v).detach().cpu().contiguous()
    tensors["rng.data"] = data_generator.get_state()
    device = next(model.parameters()).device
    if rank_rng is None:
        rank_rng = [{"torch": torch.get_rng_state()}]
        if device.type == "cuda":
            rank_rng[0]["cuda"] = torch.cuda.get_rng_state(device)
    for rank, generators in enumerate(rank_rng):
        for kind, rng_state in generators.items():
            tensors[f"rng.{kind}" + (f".rank{rank}" if rank else "")] = rng_state.cpu()
    meta = {"format": "txlearn-capstone-1", "config": json.dumps(dataclasses.asdict(config)),
            "vocab": json.dumps(vocab.chars), "step": str(step),
            "param_groups": json.dumps(state["param_groups"]), "history": json.dumps(history),
            "text_sha256": text_fingerprint, "baselines": json.dumps(baseline_nats),
            "planned_steps": json.dumps(planned_steps), "progress": json.dumps(progress)}
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
    """Read a checkpoint: ``{"model", "vocab", "config", "step", "history", "planned_steps",
    "progress", "tensors", "meta"}``.

    ``model`` is a :class:`CharTransformer` with the saved weights (eval mode, on the CPU; a
    checkpoint written on a GPU or by several processes loads the same way). Raises
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
    # checkpoints from before the recipe rule had no "init": their models used the layers' own
    config = TrainConfig(**{"init": "layers", **json.loads(meta["config"])})
    vocab = CharVocab(json.loads(meta["vocab"]))
    model = CharTransformer(len(vocab), **config.model_sizes())
    weights = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as err:
        first = str(err).strip().splitlines()[-1].strip()
        raise UserError(f"{path}: weights do not match its configuration: {first}") from None
    return {"model": model.eval(), "vocab": vocab, "config": config, "step": int(meta["step"]),
            "history": json.loads(meta["history"]),
            "planned_steps": json.loads(meta.get("planned_steps", "null")),
            "progress": json.loads(meta.get("progress", "null")),
            "tensors": tensors, "meta": meta}


def restore_optimizer(optimizer, ckpt: dict) -> None:
    """Load the AdamW state saved in `ckpt` (as :func:`load_checkpoint` returns it) into
    `optimizer`: its per-parameter tensors and its parameter groups."""
    state: dict = {}
    for key, v in ckpt["tensors"].items():
        if key.startswith("optimizer."):
            _, i, name = key.split(".", 2)
            state.setdefault(int(i), {})[name] = v
    groups = json.loads(ckpt["meta"]["param_groups"])
    for g in groups:
        g["betas"] = tuple(g["betas"])
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def check_resumable(ckpt: dict, config: TrainConfig, vocab: CharVocab, fingerprint: str,
                     path) -> None:
    """Raise UserError (naming `path`) unless a run of `config` on the text with `fingerprint`
    and `vocab` may resume from `ckpt`: every setting of the run's trajectory is the saved one
    and the checkpoint was trained on the same text."""
    saved = ckpt["config"].trajectory()
    diff = [f"{k}={saved[k]} (this run: {v})" for k, v in config.trajectory().items()
            if saved.get(k) != v]
    if diff:
        raise UserError(f"{path}: configuration does not match the checkpoint: {', '.join(diff)}")
    if ckpt["vocab"] != vocab or ckpt["meta"]["text_sha256"] != fingerprint:
        raise UserError(f"{path}: the checkpoint was trained on a different text")
