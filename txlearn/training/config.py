"""Lesson 09: every number that shapes a training run of the character model, in one dataclass.

The configuration is saved in each checkpoint; :func:`validate` rejects values no run can use with
a one-line :class:`txlearn.training.data.UserError`. Source: lesson 09 (``lessons/09_capstone.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from txlearn.training.data import UserError

__all__ = ["RULE_FIELDS", "TrainConfig", "validate"]


# The fields a run's recipe rule chooses when they are None (txlearn.training.recipe): an explicit
# value always wins over the rule.
RULE_FIELDS = ("d_model", "d_ff", "block_size", "batch_size", "lr", "min_lr", "dropout", "init")


@dataclass
class TrainConfig:
    """Every number that shapes a training run (all of them are saved in the checkpoint).

    Model: ``d_model, n_heads, n_layers, d_ff`` and ``block_size`` (T, the context length in
    characters), ``dropout`` on each sub-layer's output, ``init`` (``"gpt2"`` or ``"layers"``:
    :class:`txlearn.models.char_lm.CharTransformer`). Optimisation: ``batch_size`` (B windows
    of T characters, the global batch when several processes share it), ``max_steps``, peak
    ``lr`` after ``warmup_steps`` linear steps, cosine decay to ``min_lr`` at the last step,
    AdamW ``weight_decay`` (on matrices only), ``grad_clip`` (max global L2 norm), ``seed``,
    ``precision`` (``"auto"``, ``"fp32"``, ``"bf16"``: :mod:`txlearn.training.runtime`),
    ``grad_accum`` (gradient accumulation: each process's share of the batch runs as that many
    micro-batches of ``batch_size / (processes * grad_accum)`` windows, their gradients summed
    before the one optimiser step, the loss averaged per token over the whole batch: the same
    update as the whole batch at once, in the memory of one micro-batch).
    Validation every ``eval_interval`` steps on ``eval_windows`` evenly spread windows; the full
    validation split at the end. ``max_seconds``: wall-time budget of the whole run, final
    evaluation included (capped by ``TXLEARN_TRAIN_SECONDS``); when ``max_steps`` would not
    fit in it, the run shortens its schedule at the end of the warm-up
    (:mod:`txlearn.training.schedule`).
    It is the one field that may change when resuming.

    The recipe (:data:`RULE_FIELDS`: width, context, batch, learning rates, dropout, init)
    defaults to None: the run then measures its step time at its start and fills each None
    from the rule of :mod:`txlearn.training.recipe` (derived in lesson 09 from
    ``benchmarks/recipe_sweep.py``); a value given here always wins. The filled-in
    configuration is what the run returns and saves (:meth:`with_recipe`), so a resumed run
    continues the same recipe. ``max_steps`` is an upper bound: the budget plans the steps.
    """

    d_model: int | None = None
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int | None = None
    block_size: int | None = None
    batch_size: int | None = None
    max_steps: int = 100_000
    lr: float | None = None
    min_lr: float | None = None
    warmup_steps: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    dropout: float | None = None
    init: str | None = None
    precision: str = "auto"
    val_fraction: float = 0.1
    eval_interval: int = 200
    eval_windows: int = 32
    max_seconds: float = 170.0
    grad_accum: int = 1

    def unresolved(self) -> list[str]:
        """The recipe fields still None (for the rule to choose)."""
        return [k for k in RULE_FIELDS if getattr(self, k) is None]

    def with_recipe(self, recipe: dict) -> "TrainConfig":
        """A copy with each None field of :data:`RULE_FIELDS` taken from ``recipe`` (explicit
        values kept)."""
        return dataclasses.replace(self, **{k: recipe[k] for k in self.unresolved()})

    def model_sizes(self) -> dict:
        """The keyword arguments of :class:`txlearn.models.char_lm.CharTransformer` after
        ``n_vocab``: ``CharTransformer(n_vocab, **config.model_sizes())``. Raises ``UserError``
        while a recipe field is None (fill it first: :meth:`with_recipe`)."""
        _require_resolved(self)
        return {k: getattr(self, k) for k in ("d_model", "n_heads", "n_layers", "d_ff",
                                              "block_size", "dropout", "init")}

    def trajectory(self) -> dict:
        """The fields a resumed run must share with its checkpoint (all but ``max_seconds``)."""
        d = dataclasses.asdict(self)
        d.pop("max_seconds")
        return d


def _require_resolved(config: TrainConfig) -> None:
    if config.unresolved():
        raise UserError(f"the recipe is not chosen yet ({', '.join(config.unresolved())} are "
                        "None): train() fills them from its measured speed, or pass them")


def validate(config: TrainConfig) -> None:
    """Raise ``UserError`` for a configuration no run can use (naming the numbers), or one whose
    recipe is not chosen yet."""
    _require_resolved(config)
    sizes = ("d_model", "n_heads", "n_layers", "d_ff", "block_size", "batch_size",
             "eval_interval", "eval_windows", "grad_accum")
    bad = [f"{k}={getattr(config, k)}" for k in sizes if getattr(config, k) < 1]
    bad += [f"{k}={getattr(config, k)}" for k in ("max_steps", "warmup_steps")
            if getattr(config, k) < 0]
    bad += [f"{k}={getattr(config, k)}" for k in ("lr", "max_seconds")
            if not getattr(config, k) > 0]
    if bad:
        raise UserError(f"invalid configuration: {', '.join(bad)}")
    if config.d_model % config.n_heads:
        raise UserError(f"d_model {config.d_model} is not divisible by n_heads {config.n_heads}")
    if config.batch_size % config.grad_accum:
        raise UserError(f"batch_size {config.batch_size} does not split into grad_accum "
                        f"{config.grad_accum} equal micro-batches")
    if not 0 <= config.dropout < 1:
        raise UserError(f"dropout {config.dropout} must lie in [0, 1)")
    if config.init not in ("layers", "gpt2"):
        raise UserError(f"init {config.init!r} must be gpt2 or layers")
    if config.precision not in ("auto", "fp32", "bf16"):
        raise UserError(f"precision {config.precision!r} must be auto, fp32 or bf16")
    if not 0 < config.val_fraction < 1:
        raise UserError(f"val_fraction {config.val_fraction} must lie strictly between 0 and 1")
