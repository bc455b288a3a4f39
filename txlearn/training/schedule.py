"""Lesson 09: the learning-rate schedule of a training run, and its plan against the time budget.

A linear warm-up, then cosine decay to ``min_lr`` (:func:`learning_rate`, :class:`Schedule`).

The wall-time budget is ``TrainConfig.max_seconds``, capped by the environment variable
``TXLEARN_TRAIN_SECONDS`` when it is set (:func:`time_budget`; ``make test`` sets a few seconds).
It covers the whole :func:`txlearn.training.loop.train` call, from reading the text to the final
evaluation and checkpoint; Python's start and ``import torch`` come on top (2 to 4 s). Two rules
keep a run inside it (:class:`BudgetPlanner` holds the clock for both):

1. **The schedule is planned against the budget.** At the end of the warm-up (whose learning
   rates do not depend on the run's length), the run has measured its step time; if
   ``max_steps`` would not fit in what is left of the budget, the cosine decay is laid over the
   steps that do fit (:class:`Schedule`). It checks again every ``eval_interval / 4`` steps,
   timing the last 200 steps with their evaluations and checkpoints, and re-plans when the steps
   that fit differ by more than 10% (another program took or freed the cores), up to
   ``max_steps``, keeping the learning rate continuous. A slower machine then
   makes fewer steps but still decays the learning rate to ``min_lr``, instead of being cut off
   at a high learning rate. The plan is saved in the checkpoint, so a resumed run continues it.
2. **No step starts that would end past the budget**, judging by the recent step time and the
   time the final evaluation will take (for a machine that slows down after the plan).

Source: Loshchilov & Hutter 2017 (SGDR, cosine decay); lesson 09.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Callable

from txlearn.training.config import TrainConfig
from txlearn.training.data import UserError

__all__ = ["ENV_SECONDS", "learning_rate", "Schedule", "time_budget", "BudgetPlanner"]

ENV_SECONDS = "TXLEARN_TRAIN_SECONDS"
PLAN_MIN_WARMUP = 16   # the warm-up must be this long for the run to plan its schedule
REPLAN_WINDOW = 200    # steps whose wall time predicts the next ones when re-planning
REPLAN_CHANGE = 0.1    # re-plan when the steps that fit differ from the plan by more than this


def learning_rate(step: int, config: TrainConfig, total_steps: int | None = None) -> float:
    """Linear warm-up to ``lr`` over ``warmup_steps``, then cosine decay to ``min_lr``.

    ``lr_t = lr (t + 1) / warmup`` for ``t < warmup``; then with ``p = (t - warmup) / (N -
    warmup)`` clipped to [0, 1], ``lr_t = min_lr + (lr - min_lr) (1 + cos(pi p)) / 2``, where
    ``N = total_steps`` (the planned length of the run), by default ``config.max_steps``.
    """
    total = config.max_steps if total_steps is None else total_steps
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    return _cosine(config, (step - config.warmup_steps) / max(1, total - config.warmup_steps))


def _cosine(config: TrainConfig, progress: float) -> float:
    p = min(max(progress, 0.0), 1.0)
    return config.min_lr + (config.lr - config.min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))


class Schedule:
    """The learning rate of a run whose length is planned, and re-planned, against its budget.

    The decay follows its *progress* ``p`` in [0, 1]: ``lr = min_lr + (lr - min_lr)(1 + cos(pi
    p)) / 2`` after the warm-up. Each step after the warm-up advances ``p`` by ``(1 - p) / (N -
    t)``, the share that brings it to 1 at the planned last step ``N``. For a fixed ``N`` this is
    :func:`learning_rate` exactly; when the run re-plans ``N`` (the machine got slower or
    faster), the learning rate stays continuous and still reaches ``min_lr`` at the new end.
    ``total`` is None until the first plan (then ``config.max_steps`` applies).
    """

    def __init__(self, config: TrainConfig, total: int | None = None, progress: float = 0.0):
        self.config, self.total, self.progress = config, total, progress

    @property
    def length(self) -> int:
        return self.config.max_steps if self.total is None else self.total

    def lr(self, step: int) -> float:
        if step < self.config.warmup_steps:
            return self.config.lr * (step + 1) / self.config.warmup_steps
        return _cosine(self.config, self.progress)

    def advance(self, step: int) -> None:
        """After step ``step`` (counted from 0) was taken."""
        if step >= self.config.warmup_steps:
            self.progress += (1.0 - self.progress) / max(1, self.length - step)


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


class BudgetPlanner:
    """The clock of one training call: what its steps, evaluations and checkpoints cost, and the
    schedule's length laid over what fits before ``deadline`` (``time.perf_counter`` seconds).

    ``dist`` is the run's :class:`txlearn.training.runtime.Distributed` (its ``world`` and
    ``all_reduce``: every rank plans the same length); ``n_val`` the validation split's length in
    characters; ``time_eval()`` runs one periodic evaluation and returns its seconds (the first
    plan needs one). The loop feeds it ``step_log`` (threads, seconds) after each step but the
    first of a call, ``marks`` (step, clock) after each step's chores, and the measured
    ``eval_seconds`` and ``save_seconds``.
    """

    def __init__(self, *, config: TrainConfig, schedule: Schedule, deadline: float, dist,
                 n_val: int, time_eval: Callable[[], float]):
        self.config, self.schedule, self.deadline, self.dist = config, schedule, deadline, dist
        self.n_val, self.time_eval = n_val, time_eval
        self.plans: list[tuple[int, int]] = []   # (at step, planned length) of this call
        self.per_step = None
        self.step_log: list[tuple[int, float]] = []   # (threads, seconds) of steps 1, 2, ...
        self.marks: list[tuple[int, float]] = []      # (step, clock) after each step's chores
        self.eval_seconds = None      # one periodic evaluation of eval_windows windows
        self.save_seconds = 0.5       # until a save has been timed

    def final_reserve(self) -> float:
        """Seconds the final evaluation and checkpoint will take (an upper estimate)."""
        c = self.config
        n_windows = (self.n_val - 1) // c.block_size / self.dist.world
        if self.eval_seconds is not None:
            per_window = self.eval_seconds / min(c.eval_windows, n_windows * self.dist.world)
        else:  # forward only is about a third of a training step; take half to be safe
            per_window = self.recent_step() / 2 / (c.batch_size / self.dist.world)
        return 1.2 * per_window * n_windows + self.save_seconds

    def recent_step(self) -> float:
        recent = [dt for _, dt in self.step_log[-10:]]
        return max(statistics.median(recent), recent[-1]) if recent else 0.0

    def past_deadline(self, now: float | None = None) -> bool:
        """Would the next step and the final evaluation end past the budget?"""
        now = time.perf_counter() if now is None else now
        return now + self.recent_step() + self.final_reserve() >= self.deadline

    def plan(self, step: int, threads: int | None) -> None:
        """Lay the cosine decay over the steps that fit in the budget (:class:`Schedule`): at the
        warm-up's end, then again whenever that number moves by more than 10%. ``threads``: the
        CPU threads the run keeps (the first plan times the steps made with them)."""
        c, schedule = self.config, self.schedule
        first = schedule.total is None
        if not first and len(self.marks) <= 20:   # too few steps of this call timed yet
            return
        if self.eval_seconds is None:
            self.eval_seconds = self.time_eval()
        if first:   # the steps at the thread count the run keeps (the probe ran both)
            measured = [dt for k, dt in self.step_log if k == threads] or \
                [dt for _, dt in self.step_log]
            per_step = 1.03 * statistics.median(measured[-20:])
            per_step += (self.eval_seconds + self.save_seconds) / c.eval_interval
        else:       # the clock over the last 200 steps, evaluations and checkpoints included
            k = min(REPLAN_WINDOW, len(self.marks) - 1)
            (s0, t0), (s1, t1) = self.marks[-1 - k], self.marks[-1]
            per_step = 1.03 * (t1 - t0) / max(1, s1 - s0)
        left = self.deadline - time.perf_counter() - self.final_reserve()
        fit = step + max(1, int(left / per_step))
        (fit,) = self.dist.all_reduce([float(fit)], "min")   # every rank plans the same length
        fit = min(c.max_steps, int(fit))
        if first or abs(fit - schedule.total) > REPLAN_CHANGE * schedule.total:
            schedule.total = fit
            self.plans.append((step, fit))
            self.per_step = per_step

    def note(self) -> str | None:
        """One line on how the schedule was planned, or None when it kept ``max_steps``."""
        c = self.config
        if not self.plans or (len(self.plans) == 1 and self.plans[0][1] == c.max_steps):
            return None
        (step0, n0), n = self.plans[0], self.schedule.total
        note = (f"schedule: {c.max_steps} steps would not fit in the budget at "
                f"{1e3 * self.per_step:.0f} ms per step" if n0 < c.max_steps else
                "schedule: the speed changed")
        note += f"; planned at step {step0} over {n0} steps"
        if len(self.plans) > 1:
            note += (f", re-planned {len(self.plans) - 1} times as the speed changed "
                     f"({', '.join(f'{n} at step {t}' for t, n in self.plans[1:])})")
        return note
