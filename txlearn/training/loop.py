"""Lesson 09: train the capstone model on real text.

:func:`train` minimises the mean next-character cross-entropy with AdamW, a linear warm-up then
cosine decay of the learning rate, gradient-norm clipping, and a fixed seed; it checkpoints at every
validation interval (:mod:`txlearn.capstone.checkpoint`) and ``resume=True`` continues the same
trajectory. Where it computes (device, bfloat16 autocast, CPU threads, several processes under
``torchrun``) is :mod:`txlearn.capstone.runtime`'s job.

The wall-time budget is ``TrainConfig.max_seconds``, capped by the environment variable
``TXLEARN_TRAIN_SECONDS`` when it is set (``make test`` sets a few seconds). It covers the whole
call, from reading the text to the final evaluation and checkpoint; Python's start and
``import torch`` come on top (2 to 4 s). Two rules keep a run inside it:

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

Source: lesson 09.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
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
from txlearn.capstone.runtime import (Distributed, ThreadProbe, autocast, resolve_device,
                                      resolve_precision)

__all__ = ["ENV_SECONDS", "learning_rate", "Schedule", "time_budget", "evaluate", "TrainResult",
           "train"]

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


@torch.no_grad()
def evaluate(model: CharTransformer, val_ids: torch.Tensor, block_size: int,
             max_windows: int | None = None, batch_size: int = 64,
             dist: Distributed | None = None) -> float:
    """Mean next-character cross-entropy (nats) over non-overlapping validation windows.

    The one evaluation protocol of the capstone: ``val_windows(val_ids, block_size)`` (every
    window, or ``max_windows`` evenly spread), float32, on the model's device. With ``dist``
    (several processes), each rank takes a contiguous share of the windows and the sums are
    added over the ranks: the same number as one process gets.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    x, y = val_windows(val_ids, block_size, max_windows)   # (W, T) each
    lo, hi = 0, len(x)
    if dist is not None and dist.world > 1:
        per = math.ceil(len(x) / dist.world)
        lo, hi = min(dist.rank * per, len(x)), min((dist.rank + 1) * per, len(x))
    total = 0.0
    for i in range(lo, hi, batch_size):
        j = min(i + batch_size, hi)
        logits = model(x[i:j].to(device))                    # (b, T, n_vocab)
        total += F.cross_entropy(logits.flatten(0, 1).float(), y[i:j].flatten().to(device),
                                 reduction="sum").item()
    if dist is not None and dist.world > 1:
        (total,) = dist.all_reduce([total])
    model.train(was_training)
    return total / y.numel()


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices (dim >= 2: weights, the token and position tables); not biases or gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


@dataclass
class TrainResult:
    """What :func:`train` returns; losses are mean cross-entropy in nats per character.

    ``config`` holds the precision the run used (``"auto"`` resolved); ``planned_steps`` is the
    length of the learning-rate schedule (``config.max_steps`` unless the budget shortened it;
    None when the run stopped before the end of the warm-up, where it is planned);
    ``threads`` the CPU threads of the training steps, ``device`` and ``world_size`` where they
    ran. ``history`` rows: step, train loss (of that step's global batch), validation estimate,
    learning rate, seconds since the call started.
    """

    model: CharTransformer
    vocab: CharVocab
    config: TrainConfig
    baselines: dict
    val_nats: float
    step: int
    seconds: float
    stopped_by: str                       # "steps" or "time"
    history: list = field(default_factory=list)   # {"step", "train", "val", "lr", "seconds"}
    train_losses: list = field(default_factory=list)  # every step of this call
    checkpoint: Path | None = None
    planned_steps: int | None = None
    threads: int | None = None
    device: str = "cpu"
    world_size: int = 1
    notes: list = field(default_factory=list)     # how the run chose threads and its schedule

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
          log=print, device: str = "auto", threads: int | str = "auto") -> TrainResult:
    """Train :class:`CharTransformer` on ``text`` (default: the pydoc_data language reference).

    Runs until the planned number of steps (``config.max_steps``, or fewer when they would not
    fit in the time budget, :func:`time_budget`), until the budget itself ends, or, in this
    call, until ``stop_after`` steps; then measures the full validation split and, if
    ``checkpoint`` is a path, saves there. ``resume=True`` loads ``checkpoint`` first and
    continues its trajectory exactly. ``log`` receives the summary lines (None: silent).
    ``device``: ``"auto"``, ``"cpu"``, ``"cuda"``... ; ``threads``: ``"auto"`` or a count of CPU
    threads (:mod:`txlearn.capstone.runtime`). Under ``torchrun`` every process calls this
    function; they split each global batch and only rank 0 logs and writes checkpoints.
    Raises ``UserError`` for a too-short text, a missing or mismatched checkpoint (nothing is
    written in that case), a batch that the processes cannot split evenly, or an unknown device.
    """
    started = time.perf_counter()
    config = config or TrainConfig()
    text = load_corpus() if text is None else text
    dist = Distributed.start(resolve_device(device))
    try:
        return _train(config, text, checkpoint, resume, stop_after, progress, log, threads,
                      dist, started)
    finally:
        dist.close()


def _train(config, text, checkpoint, resume, stop_after, progress, log, threads, dist, started):
    dev = dist.device
    log = (log or (lambda *a: None)) if dist.is_main else (lambda *a: None)
    vocab, train_ids, val_ids = _prepare(config, text)
    if config.batch_size % dist.world:
        raise UserError(f"batch_size {config.batch_size} does not split evenly over "
                        f"{dist.world} processes")
    config = dataclasses.replace(config, precision=resolve_precision(config.precision, dev))
    text_sha, budget = fingerprint(text), time_budget(config)
    base = baselines(train_ids, val_ids, len(vocab))
    torch.manual_seed(config.seed)
    model = CharTransformer.from_config(config, len(vocab)).to(dev)   # the same on every rank
    if dist.rank:
        torch.manual_seed(config.seed + dist.rank)    # each rank its own dropout masks
    optimizer = torch.optim.AdamW(_param_groups(model, config.weight_decay), lr=config.lr,
                                  betas=(0.9, 0.99))
    data_generator = torch.Generator().manual_seed(config.seed)
    step, history, planned = 0, [], None
    if resume:
        if checkpoint is None:
            raise UserError("resume needs a checkpoint path")
        ckpt = load_checkpoint(checkpoint)
        check_resumable(ckpt, config, vocab, text_sha, checkpoint)
        model.load_state_dict(ckpt["model"].state_dict())
        restore_optimizer(optimizer, ckpt)
        dist.restore_rng(ckpt["tensors"], config.seed)
        data_generator.set_state(ckpt["tensors"]["rng.data"])
        step, history, planned = ckpt["step"], ckpt["history"], ckpt["planned_steps"]
    schedule = Schedule(config, planned)
    if resume:   # the decay's progress at the saved step (older checkpoints: the fixed plan)
        w, n = config.warmup_steps, schedule.length
        schedule.progress = ckpt["progress"] if ckpt["progress"] is not None else \
            min(max((step - w) / max(1, n - w), 0.0), 1.0)

    def save(at_step: int):
        if checkpoint is None:
            return None
        rank_rng = dist.rng_states()     # a collective: every rank takes part
        if dist.is_main:
            save_checkpoint(checkpoint, model, optimizer, config, vocab, at_step,
                            data_generator, history, text_sha, base, schedule.total, rank_rng,
                            schedule.progress)
        dist.barrier()   # every rank may read the file once this returns
        return Path(checkpoint)

    _log_start(log, text, vocab, train_ids, val_ids, base, config, budget, step, dev, dist)
    net = model
    if dist.world > 1:
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    run = _Run(model, net, optimizer, config, train_ids, val_ids, data_generator, dist, dev,
               started, budget, save, history, schedule, threads, step)
    losses, stopped_by = run.loop(step, stop_after, progress)
    step += len(losses)
    final = evaluate(model, val_ids, config.block_size, dist=dist)
    history.append({"step": step, "train": losses[-1] if losses else None, "val": final,
                    "lr": run.last_lr, "seconds": round(time.perf_counter() - started, 2)})
    path = save(step)
    result = TrainResult(model.eval(), vocab, config, base, final, step, run.seconds, stopped_by,
                         history, losses, path, schedule.total, run.threads, str(dev),
                         dist.world, run.notes)
    _log_end(log, result)
    return result


class _Run:
    """The training loop of one :func:`train` call, with its clock, plan and thread choice."""

    def __init__(self, model, net, optimizer, config, train_ids, val_ids, data_generator, dist,
                 dev, started, budget, save, history, schedule, threads, start_step):
        self.model, self.net, self.optimizer, self.config = model, net, optimizer, config
        self.train_ids, self.val_ids, self.data_generator = train_ids, val_ids, data_generator
        self.dist, self.dev, self.save = dist, dev, save
        self.started, self.deadline = started, started + budget
        self.history, self.schedule, self.notes = history, schedule, []
        self.plans: list[tuple[int, int]] = []   # (at step, planned length) of this call
        self.per_step = None
        self.last_lr = schedule.lr(max(start_step - 1, 0))
        planned = schedule.total
        self.seconds = 0.0
        self.probe = None
        cpu = dev.type == "cpu"
        if threads != "auto":
            if not isinstance(threads, int) or threads < 1:
                raise UserError(f"threads must be a positive integer or 'auto', got {threads!r}")
            if cpu:
                torch.set_num_threads(threads)
        elif cpu and dist.world == 1 and not os.environ.get("OMP_NUM_THREADS") \
                and torch.get_num_threads() > 1:
            plan_at = None if planned is not None else config.warmup_steps - start_step
            self.probe = ThreadProbe(second_at=plan_at)
        self.threads = torch.get_num_threads() if cpu else None
        self.step_log: list[tuple[int, float]] = []   # (threads, seconds) of steps 1, 2, ...
        self.marks: list[tuple[int, float]] = []      # (step, clock) after each step's chores
        self.eval_seconds = None      # one periodic evaluation of eval_windows windows
        self.save_seconds = 0.5       # until a save has been timed

    def final_reserve(self) -> float:
        """Seconds the final evaluation and checkpoint will take (an upper estimate)."""
        c = self.config
        n_windows = (len(self.val_ids) - 1) // c.block_size / self.dist.world
        if self.eval_seconds is not None:
            per_window = self.eval_seconds / min(c.eval_windows, n_windows * self.dist.world)
        else:  # forward only is about a third of a training step; take half to be safe
            per_window = self.recent_step() / 2 / (c.batch_size / self.dist.world)
        return 1.2 * per_window * n_windows + self.save_seconds

    def recent_step(self) -> float:
        recent = [dt for _, dt in self.step_log[-10:]]
        return max(statistics.median(recent), recent[-1]) if recent else 0.0

    def plan(self, step: int) -> None:
        """Lay the cosine decay over the steps that fit in the budget (:class:`Schedule`): at the
        warm-up's end, then again whenever that number moves by more than 10%."""
        c, schedule = self.config, self.schedule
        first = schedule.total is None
        if not first and len(self.marks) <= 20:   # too few steps of this call timed yet
            return
        if self.eval_seconds is None:
            t = time.perf_counter()
            evaluate(self.model, self.val_ids, c.block_size, c.eval_windows, dist=self.dist)
            self.eval_seconds = time.perf_counter() - t
        if first:   # the steps at the thread count the run keeps (the probe ran both)
            measured = [dt for k, dt in self.step_log if k == self.threads] or \
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

    def plan_note(self) -> str | None:
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

    def loop(self, step: int, stop_after: int | None, progress: bool):
        """Train until the planned last step, ``stop_after`` steps, or the budget.

        Every ``eval_interval`` steps: a validation estimate, appended to ``history``, and
        ``save(step)`` (a checkpoint to resume from if the run is interrupted).
        Returns (losses of this call, "steps" or "time")."""
        from tqdm import tqdm  # the text bar: tqdm.auto warns in kernels without ipywidgets

        c, dist = self.config, self.dist
        self.model.train()
        losses, start = [], time.perf_counter()
        schedule = self.schedule
        can_plan = c.warmup_steps >= PLAN_MIN_WARMUP
        if not can_plan and schedule.total is None:
            schedule.total = c.max_steps
        replan_every = max(10, c.eval_interval // 4)
        last = lambda: schedule.length  # noqa: E731
        end = None if stop_after is None else step + stop_after
        tokens = c.batch_size * c.block_size
        bar = tqdm(total=last(), initial=step, disable=not (progress and dist.is_main),
                   desc="train", unit="step", dynamic_ncols=True)
        stopped_by = "steps"
        (late,) = dist.all_reduce([float(time.perf_counter() >= self.deadline)], "max")
        if late and step < last():   # the budget ended before the first step
            stopped_by, end = "time", step
        while step < last() and (end is None or step < end):
            i = len(losses)                  # steps made in this call
            if self.probe is not None:
                torch.set_num_threads(self.probe.threads_for(i))
            t = time.perf_counter()
            x, y = random_windows(self.train_ids, c.batch_size, c.block_size, self.data_generator)
            x, y = dist.shard(x).to(self.dev), dist.shard(y).to(self.dev)   # (B / world, T)
            self.last_lr = schedule.lr(step)
            loss = self._step(x, y, self.last_lr)
            schedule.advance(step)
            step += 1
            dt = time.perf_counter() - t
            if i > 0:                        # the first step of a call pays one-time costs
                self.step_log.append((torch.get_num_threads() if self.threads else 0, dt))
            if self.probe is not None and not self.probe.final:
                self.probe.record(i, torch.get_num_threads(), dt)
                if self.probe.choice is not None:
                    self.threads = self.probe.choice
                if self.probe.final:
                    self.notes.append(f"threads: {self.probe.summary()}")
            if can_plan and step >= c.warmup_steps and step < last() and (
                    schedule.total is None or (step - c.warmup_steps) % replan_every == 0):
                self.plan(step)
                bar.total = last()
                bar.refresh()
            nearly = False
            if step % c.eval_interval == 0 and step < last() and step != end:  # else: final
                t_eval = time.perf_counter()
                val = evaluate(self.model, self.val_ids, c.block_size, c.eval_windows, dist=dist)
                self.eval_seconds = time.perf_counter() - t_eval
                self.history.append({"step": step, "train": None, "val": val,
                                     "lr": self.last_lr,
                                     "seconds": round(time.perf_counter() - self.started, 2)})
                t_save = time.perf_counter()
                self.save(step)
                self.save_seconds = time.perf_counter() - t_save
                self.model.train()
                nearly = True
            # would the next step (and the final evaluation) end past the budget? All ranks agree.
            ahead = time.perf_counter() + self.recent_step() + self.final_reserve()
            loss, stop = dist.all_reduce([loss, float(ahead >= self.deadline)])
            loss /= dist.world
            losses.append(loss)
            if nearly:
                self.history[-1]["train"] = loss
            self.marks.append((step, time.perf_counter()))
            bar.update(1)
            rate = tokens * len(losses) / (time.perf_counter() - start)
            bar.set_postfix(loss=f"{loss:.3f}", chars_s=f"{rate:,.0f}")
            if stop and step < last() and (end is None or step < end):
                stopped_by = "time"
                break
        bar.close()
        self.seconds = time.perf_counter() - start
        note = self.plan_note()
        if note:
            self.notes.append(note)
        return losses, stopped_by

    def _step(self, x, y, lr) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with autocast(self.config.precision, self.dev):
            logits = self.net(x)                                       # (B, T, n_vocab)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())  # (B*T, n_vocab) vs (B*T,)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        return loss.item()


def _log_start(log, text, vocab, train_ids, val_ids, base, config, budget, step, dev, dist):
    log(f"text: {len(text):,} characters, vocabulary n_vocab = {len(vocab)}; "
        f"train {len(train_ids):,}, validation {len(val_ids):,} "
        f"(the last {config.val_fraction:.0%})")
    log("baselines on the validation split (nats/char | bits/char): " + ", ".join(
        f"{k} {v:.3f} | {nats_to_bits(v):.3f}" for k, v in base.items()))
    start = f"resuming at step {step}, " if step else ""
    where = f"{dev.type}, {config.precision}"
    if dist.world > 1:
        where += f", {dist.world} processes of {config.batch_size // dist.world} windows"
    log(f"{start}up to {config.max_steps} steps of {config.batch_size} x {config.block_size} "
        f"characters, budget {budget:.0f} s ({where})")


def _log_end(log, r: TrainResult) -> None:
    for note in r.notes:
        log(note)
    bigram = r.baselines["bigram"]
    verdict = (f"{bigram - r.val_nats:.3f} nats/char below the bigram's {bigram:.3f}"
               if r.val_nats < bigram else f"not yet below the bigram's {bigram:.3f}")
    log(f"model: validation {r.val_nats:.3f} nats/char = {r.val_bits:.3f} bits/char after "
        f"{r.step} steps ({r.seconds:.1f} s of training in this run, stopped by "
        f"{r.stopped_by}); {verdict}")
    if r.checkpoint is not None:
        log(f"checkpoint: {r.checkpoint}")
