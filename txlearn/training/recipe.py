"""Lesson 09: the recipe a training run chooses from the speed it measures (compute-optimal at toy scale).

A run's budget is seconds; what a recipe learns depends on the floating-point operations it gets
to spend. The sweep ``benchmarks/recipe_sweep.py`` trained each candidate recipe for fixed
numbers of FLOPs (fractions of :data:`C_FULL`, one thread, float32, a held-out part of the
training split) and recorded its loss: :data:`CURVES` holds those losses (``tests/
test_recipe.py`` checks them against ``benchmarks/results/recipe_runs.jsonl``). Smaller models
learn more per FLOP at these budgets (more characters for the same compute, as in Hoffmann et
al. 2022), but on a CPU a narrow model computes fewer FLOPs per second, so the choice depends
on the machine. The rule (:func:`choose`):

1. time a few training steps of each candidate (:func:`measure_step_seconds`, throwaway models:
   the run's own model, data order and generator are untouched);
2. turn the seconds left (95% of them) into each candidate's FLOP budget at its measured speed;
3. keep the candidate whose loss curve is lowest at its own budget (:func:`predicted_loss`:
   linear in log FLOPs between recorded budgets, flat above the largest).

A budget too short to measure (under :data:`MIN_PROBE_SECONDS`) takes the candidate best at the
smallest recorded budget without timing anything. FLOPs per step are the count of
:mod:`txlearn.counting` (forward matrix products, attention over the full T x T square, times 3
for the backward pass): ``(6 N + 12 n_layers T d_model) B T``.

Source: lesson 09; Kaplan et al. 2020 (FLOPs per token), Hoffmann et al. 2022 (compute-optimal
allocation).
"""

from __future__ import annotations

import math
import statistics
import time

import torch
import torch.nn.functional as F

from txlearn.counting import layer_flops
from txlearn.models.char_lm import CharTransformer
from txlearn.training.config import TrainConfig
from txlearn.training.runtime import autocast

__all__ = ["CANDIDATES", "CURVES", "C_FULL", "MIN_PROBE_SECONDS", "flops_per_step",
           "predicted_loss", "measure_step_seconds", "Choice", "choose"]

# What every candidate shares (the sweep's finding at 0.125-0.5 of C_FULL: no dropout, GPT-2's
# initialisation, T 64, B 12 and lr 3e-3 beat the old defaults at equal FLOPs).
_SHARED = dict(block_size=64, batch_size=12, lr=3e-3, min_lr=3e-4, dropout=0.0, init="gpt2")

# name (as in benchmarks/recipe_sweep.py) -> the recipe's settings, widest first
CANDIDATES = {
    "T 64, B 12, gpt2 init, no dropout, lr 3e-3": dict(d_model=128, d_ff=512, **_SHARED),
    "d 96, T 64, B 12, gpt2 init, no dropout, lr 3e-3": dict(d_model=96, d_ff=384, **_SHARED),
    "d 64, T 64, B 12, gpt2 init, no dropout, lr 3e-3": dict(d_model=64, d_ff=256, **_SHARED),
}

# name -> {budget (fraction of C_FULL): held-out loss in nats/char}, recorded by the sweep (0.125
# and 0.25 in float32 on one thread; 0.5 and 1.0 in bfloat16 on two, where a run at 0.25 both
# ways differed by 0.010 nats). A narrow model reads more text per FLOP: d 64 at 0.5 and d 96 at
# 1.0 have read the training text about 21 times, and with no dropout d 96 over-fits (worse at
# 1.0 than at 0.5) and d 64 stops gaining.
CURVES = {
    "T 64, B 12, gpt2 init, no dropout, lr 3e-3": {0.125: 1.6801, 0.25: 1.3995, 0.5: 1.2778,
                                                   1.0: 1.2638},
    "d 96, T 64, B 12, gpt2 init, no dropout, lr 3e-3": {0.125: 1.5138, 0.25: 1.3381,
                                                         0.5: 1.2826, 1.0: 1.3432},
    "d 64, T 64, B 12, gpt2 init, no dropout, lr 3e-3": {0.125: 1.3818, 0.25: 1.2966,
                                                         0.5: 1.2969},
}

N_VOCAB = 103          # the pydoc_data text's alphabet (the sweep's FLOP count uses it)
MIN_PROBE_SECONDS = 30.0
PROBE_STEPS = 3        # timed steps of each candidate, after one untimed


def flops_per_step(config: TrainConfig, n_vocab: int = N_VOCAB) -> int:
    """Training FLOPs of one step of ``config``: 3 x the forward's matrix products (the backward
    computes two products per forward product), :func:`txlearn.counting.layer_flops` per layer
    (attention over the whole T x T square) plus the tied head ``2 T d_model n_vocab``, times
    B sequences. Norms, softmax and the optimizer are not counted. An int."""
    c, T = config, config.block_size
    layer = sum(layer_flops(T=T, d_model=c.d_model, n_heads=c.n_heads, d_ff=c.d_ff,
                            activation="gelu").values())
    return 3 * (c.n_layers * layer + 2 * T * c.d_model * n_vocab) * c.batch_size


# The old default run (2,700 steps of d_model 128, T 128, B 12): the unit of the sweep's budgets.
C_FULL = 2700 * flops_per_step(TrainConfig(d_model=128, d_ff=512, block_size=128, batch_size=12))


def predicted_loss(name: str, budget: float) -> float:
    """Held-out loss (nats/char) of candidate ``name`` after ``budget`` x :data:`C_FULL` FLOPs:
    piecewise linear in ``log budget`` through :data:`CURVES`; below the smallest recorded
    budget the first slope continues; above the largest the curve is held flat (nothing was
    measured there, and a steep early slope continued would promise too much). Raises
    ``KeyError`` for an unknown name."""
    points = sorted(CURVES[name].items())
    if len(points) == 1 or budget >= points[-1][0]:
        return points[-1][1]
    x = math.log(max(budget, 1e-9))
    xs = [math.log(b) for b, _ in points]
    i = min(max(1, sum(xi <= x for xi in xs)), len(points) - 1)   # the segment [i - 1, i]
    (x0, y0), (x1, y1) = (xs[i - 1], points[i - 1][1]), (xs[i], points[i][1])
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def measure_step_seconds(config: TrainConfig, train_ids: torch.Tensor, n_vocab: int,
                         device: torch.device, steps: int = PROBE_STEPS) -> float:
    """Median seconds of one AdamW training step of a throwaway model of ``config`` (after one
    untimed step that pays one-time costs), on random windows of ``train_ids`` drawn from a
    generator of its own. The global random state is saved and restored."""
    state = torch.random.get_rng_state()
    gen = torch.Generator().manual_seed(0)
    model = CharTransformer(n_vocab, **config.model_sizes()).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, foreach=True)
    T, B = config.block_size, config.batch_size
    times = []
    for i in range(steps + 1):
        t = time.perf_counter()
        start = torch.randint(len(train_ids) - T - 1, (B,), generator=gen)
        idx = start[:, None] + torch.arange(T + 1)                   # (B, T + 1)
        x, y = train_ids[idx[:, :-1]].to(device), train_ids[idx[:, 1:]].to(device)
        with autocast(config.precision, device):
            logits = model(x)                                         # (B, T, n_vocab)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()                                                   # waits for the device
        if i:
            times.append(time.perf_counter() - t)
    torch.random.set_rng_state(state)
    return statistics.median(times)


class Choice:
    """What :func:`choose` decided: ``name`` and ``settings`` of the recipe, and per candidate
    (``rows``) its measured step seconds (None when not timed), FLOP budget (fraction of
    :data:`C_FULL`) and predicted loss; ``seconds`` the training time the choice was made for."""

    def __init__(self, name: str, settings: dict, rows: list[dict], seconds: float):
        self.name, self.settings, self.rows, self.seconds = name, settings, rows, seconds

    def summary(self) -> str:
        """One line for the run's log: the choice and why."""
        if all(r["step_s"] is None for r in self.rows):
            return (f"recipe: {self.name} (a budget of {self.seconds:.0f} s is too short to time "
                    "the candidates: the best at the smallest recorded budget)")
        why = "; ".join(f"d {CANDIDATES[r['name']]['d_model']} {1e3 * r['step_s']:.0f} ms/step"
                        f" -> {r['budget']:.2f} x C_FULL -> {r['predicted']:.3f} nats"
                        for r in self.rows)
        return (f"recipe: {self.name} (the lowest predicted loss in the {self.seconds:.0f} s "
                f"left, at the step times measured now: {why})")


def choose(config: TrainConfig, deadline: float, train_ids: torch.Tensor | None, n_vocab: int,
           device: torch.device, all_reduce=None) -> Choice:
    """The candidate with the lowest :func:`predicted_loss` for the training time left before
    ``deadline`` (``time.perf_counter`` seconds; 95% of it, the rest for evaluations), at the
    step times measured now (see the module docstring). ``config`` supplies what the
    candidates do not set (layers, heads, precision); its explicit recipe fields hold for the
    timing too. ``all_reduce(values, op)`` (several processes): every rank takes the slowest
    rank's times, so all choose alike. ``train_ids=None``, or a budget under
    :data:`MIN_PROBE_SECONDS`: nothing is timed (the best candidate at the smallest recorded
    budget)."""
    if train_ids is None or deadline - time.perf_counter() < MIN_PROBE_SECONDS:
        smallest = min(min(CURVES[n]) for n in CANDIDATES)
        rows = [{"name": n, "step_s": None, "budget": None,
                 "predicted": predicted_loss(n, smallest)} for n in CANDIDATES]
        name = min(rows, key=lambda r: r["predicted"])["name"]
        return Choice(name, CANDIDATES[name], rows, deadline - time.perf_counter())
    names = list(CANDIDATES)
    times = [measure_step_seconds(config.with_recipe(CANDIDATES[n]), train_ids, n_vocab,
                                  device) for n in names]
    if all_reduce is not None:
        times = all_reduce(times, "max")
    left = 0.95 * max(deadline - time.perf_counter(), 0.0)
    rows = []
    for name, step_s in zip(names, times):
        c = config.with_recipe(CANDIDATES[name])
        budget = left / step_s * flops_per_step(c, n_vocab) / C_FULL
        rows.append({"name": name, "step_s": step_s, "budget": budget,
                     "predicted": predicted_loss(name, budget)})
    best = min(rows, key=lambda r: r["predicted"])["name"]
    return Choice(best, CANDIDATES[best], rows, left)
