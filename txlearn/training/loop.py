"""Lesson 09: the training loop of the character model, and its evaluation.

:func:`train` minimises the mean next-character cross-entropy with AdamW, a linear warm-up then
cosine decay of the learning rate, gradient-norm clipping, and a fixed seed; it checkpoints at every
validation interval (:mod:`txlearn.training.checkpoint`) and ``resume=True`` continues the same
trajectory; the recipe left open in the configuration is chosen at the start from the measured
speed (:mod:`txlearn.training.recipe`). The schedule and how it is planned against the wall-time budget are
:mod:`txlearn.training.schedule`'s; where the loop computes (device, bfloat16 autocast, CPU
threads, several processes under ``torchrun``) is :mod:`txlearn.training.runtime`'s.

Source: lesson 09.
"""

from __future__ import annotations

import contextlib
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

from txlearn.models.char_lm import CharTransformer
from txlearn.training.checkpoint import (check_resumable, fingerprint, load_checkpoint,
                                         restore_optimizer, save_checkpoint)
from txlearn.training.config import TrainConfig, validate
from txlearn.training.data import (CharVocab, UserError, baselines, load_corpus, min_chars,
                                   nats_to_bits, random_windows, split_by_position, val_windows)
from txlearn.training.recipe import CANDIDATES, MIN_PROBE_SECONDS, choose, flops_per_step
from txlearn.training.runtime import (Distributed, ThreadProbe, autocast, matmul_gflops,
                                      resolve_device, resolve_precision)
from txlearn.training.schedule import PLAN_MIN_WARMUP, BudgetPlanner, Schedule, time_budget

__all__ = ["evaluate", "TrainResult", "train"]


@torch.no_grad()
def evaluate(model: CharTransformer, val_ids: torch.Tensor, block_size: int,
             max_windows: int | None = None, batch_size: int = 64,
             dist: Distributed | None = None) -> float:
    """Mean next-character cross-entropy (nats) over non-overlapping validation windows.

    The one evaluation protocol of lesson 09: ``val_windows(val_ids, block_size)`` (every
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
    ran; ``recipe`` the line saying how the recipe was chosen (None when the config fixed it),
    ``speed`` the achieved GFLOP/s against the matmul peak measured at the start. ``history`` rows: step, train loss (of that step's global batch), validation estimate,
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
    recipe: str | None = None     # how the run chose its recipe (None: the config fixed it)
    speed: str | None = None      # achieved GFLOP/s against the matmul peak measured at start

    @property
    def val_bits(self) -> float:
        return nats_to_bits(self.val_nats)


@dataclass
class _Corpus:
    """The text of a run as the loop uses it (built once per call, the same on every rank)."""

    n_chars: int
    vocab: CharVocab
    train_ids: torch.Tensor   # (N_train,) int64
    val_ids: torch.Tensor     # (N_val,) int64
    baselines: dict           # {"uniform", "unigram", "bigram"}: nats per character
    fingerprint: str          # of the text, saved in the checkpoint


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

    The recipe fields of ``config`` left None (``TrainConfig.unresolved``: width, context,
    batch, learning rates, dropout, init) are chosen first, from the step times measured then
    (:func:`txlearn.training.recipe.choose`; when resuming, from the checkpoint); explicit
    values win. The log's first lines say what was chosen and why; its last line the achieved
    GFLOP/s against a matmul peak measured at the start.

    Runs until the planned number of steps (``config.max_steps``, or fewer when they would not
    fit in the time budget, :func:`txlearn.training.schedule.time_budget`), until the budget
    itself ends, or, in this call, until ``stop_after`` steps; a call makes at least one step
    (unless ``stop_after=0`` or the checkpoint's run is complete), past the budget if the
    budget ended before the first step, so ``train_losses`` is never empty on a fresh run. Then
    it measures the full validation
    split and, if ``checkpoint`` is a path, saves there. ``resume=True`` loads ``checkpoint``
    first and continues its trajectory exactly. ``log`` receives the summary lines (None:
    silent). ``device``: ``"auto"``, ``"cpu"``, ``"cuda"``... ; ``threads``: ``"auto"`` or a
    count of CPU threads (:mod:`txlearn.training.runtime`). Under ``torchrun`` every process
    calls this function; they split each global batch and only rank 0 logs and writes
    checkpoints. Raises ``UserError`` for a too-short text, a missing or mismatched checkpoint
    (nothing is written in that case), a batch that the processes cannot split evenly, or an
    unknown device.
    """
    started = time.perf_counter()
    config = config or TrainConfig()
    text = load_corpus() if text is None else text
    dist = Distributed.start(resolve_device(device))
    try:
        return _train(config, text, dist, started, checkpoint=checkpoint, resume=resume,
                      stop_after=stop_after, progress=progress, log=log, threads=threads)
    finally:
        dist.close()


def _train(config, text, dist, started, *, checkpoint, resume, stop_after, progress, log,
           threads):
    dev = dist.device
    log = (log or (lambda *a: None)) if dist.is_main else (lambda *a: None)
    for settings in CANDIDATES.values():   # a bad explicit field fails before any timing
        validate(config.with_recipe(settings))
    config = dataclasses.replace(config, precision=resolve_precision(config.precision, dev))
    text_sha, budget = fingerprint(text), time_budget(config)
    # short runs (tests, make test's 8 s) time no matmul: the line then gives GFLOP/s alone
    peak = _matmul_peak(config.precision, dev, threads) if budget >= MIN_PROBE_SECONDS else {}
    config, recipe_line = _recipe(config, text, dist, started + budget, checkpoint, resume)
    vocab, train_ids, val_ids = _prepare(config, text)
    if config.batch_size % dist.world:
        raise UserError(f"batch_size {config.batch_size} does not split evenly over "
                        f"{dist.world} processes")
    if (config.batch_size // dist.world) % config.grad_accum:
        raise UserError(f"each of the {dist.world} processes' {config.batch_size // dist.world} "
                        f"windows do not split into grad_accum {config.grad_accum} micro-batches")
    corpus = _Corpus(n_chars=len(text), vocab=vocab, train_ids=train_ids, val_ids=val_ids,
                     baselines=baselines(train_ids, val_ids, len(vocab)), fingerprint=text_sha)
    torch.manual_seed(config.seed)
    model = CharTransformer(len(vocab), **config.model_sizes()).to(dev)   # the same on every rank
    if dist.rank:
        torch.manual_seed(config.seed + dist.rank)    # each rank its own dropout masks
    # foreach: each of AdamW's element-wise passes over all of a group's tensors at once, not one
    # parameter at a time (the optimizer was about 8% of a step on the CPU in torch.profiler;
    # benchmarks/README.md). fused=True measured no faster here (benchmarks/README.md, issue 27)
    optimizer = torch.optim.AdamW(_param_groups(model, config.weight_decay), lr=config.lr,
                                  betas=(0.9, 0.99), foreach=True)
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
            save_checkpoint(checkpoint, model=model, optimizer=optimizer, config=config,
                            vocab=vocab, step=at_step, data_generator=data_generator,
                            history=history, text_fingerprint=text_sha,
                            baseline_nats=corpus.baselines, planned_steps=schedule.total,
                            rank_rng=rank_rng, progress=schedule.progress)
        dist.barrier()   # every rank may read the file once this returns
        return Path(checkpoint)

    _log_start(log, corpus, config=config, budget=budget, step=step, dist=dist)
    if recipe_line:
        log(recipe_line)
    net = model
    if dist.world > 1:
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    run = _Run(model=model, net=net, optimizer=optimizer, config=config, corpus=corpus,
               data_generator=data_generator, dist=dist, started=started, budget=budget,
               save=save, history=history, schedule=schedule, threads=threads, start_step=step)
    losses, stopped_by = run.loop(step, stop_after, progress)
    step += len(losses)
    final = evaluate(model, val_ids, config.block_size, dist=dist)
    history.append({"step": step, "train": losses[-1] if losses else None, "val": final,
                    "lr": run.last_lr, "seconds": round(time.perf_counter() - started, 2)})
    path = save(step)
    result = TrainResult(model=model.eval(), vocab=vocab, config=config,
                         baselines=corpus.baselines, val_nats=final, step=step,
                         seconds=run.seconds, stopped_by=stopped_by, history=history,
                         train_losses=losses, checkpoint=path, planned_steps=schedule.total,
                         threads=run.threads, device=str(dev), world_size=dist.world,
                         notes=run.notes, recipe=recipe_line,
                         speed=_speed_line(run, config, len(vocab), peak))
    _log_end(log, result)
    log(result.speed)
    return result


def _recipe(config: TrainConfig, text: str, dist, deadline: float, checkpoint, resume):
    """Fill the recipe fields left None (``TrainConfig.unresolved``): from the checkpoint when
    resuming, else by :func:`txlearn.training.recipe.choose` from the speed measured now.
    Returns (config, the log line saying what was chosen and why, or None)."""
    if not config.unresolved():
        return config, None
    if resume:
        if checkpoint is None:
            raise UserError("resume needs a checkpoint path")
        saved = load_checkpoint(checkpoint)["config"]
        return config.with_recipe(dataclasses.asdict(saved)), None
    vocab = CharVocab.from_text(text)
    longest = max(config.with_recipe(r).block_size for r in CANDIDATES.values())
    timed = deadline - time.perf_counter() >= MIN_PROBE_SECONDS and \
        len(text) >= min_chars(longest, config.val_fraction)   # else nothing is timed
    choice = choose(config, deadline, vocab.encode(text) if timed else None, len(vocab),
                    dist.device, all_reduce=dist.all_reduce)
    return config.with_recipe(choice.settings), choice.summary()


def _matmul_peak(precision: str, dev, threads) -> dict:
    """{CPU threads: matmul GFLOP/s} a step is compared with, float32's (or bfloat16's when the
    run computes in bfloat16 and that is faster), at the thread counts the run may keep."""
    counts = {torch.get_num_threads()}
    if dev.type == "cpu" and threads == "auto" and not os.environ.get("OMP_NUM_THREADS"):
        counts.add(1)                       # the thread probe may keep one thread
    if dev.type == "cpu" and isinstance(threads, int):
        counts = {threads}
    before, peak = torch.get_num_threads(), {}
    for n in sorted(counts):
        torch.set_num_threads(n)
        peak[n] = matmul_gflops(dev, torch.float32)
        if precision == "bf16":
            peak[n] = max(peak[n], matmul_gflops(dev, torch.bfloat16))
    torch.set_num_threads(before)
    return peak


def _speed_line(run, config: TrainConfig, n_vocab: int, peaks: dict) -> str:
    """The achieved GFLOP/s of the training steps against the matmul peak measured at start
    with the thread count the run kept."""
    peak = peaks.get(run.threads, max(peaks.values())) if peaks else None
    times = [dt for k, dt in run.planner.step_log if k == (run.threads or 0)] or \
        [dt for _, dt in run.planner.step_log]
    if not times:
        return "speed: too few steps to time"
    step_s = statistics.median(times)
    flops = flops_per_step(config, n_vocab) / run.dist.world
    achieved = flops / step_s / 1e9
    line = (f"speed: {achieved:.1f} GFLOP/s in the training steps ({flops / 1e9:.2f} GFLOP a "
            f"step by the 6N + attention count, median {1e3 * step_s:.0f} ms on "
            f"{run.threads or 'its'} thread(s))")
    if peak is None:
        return line + "; no matmul peak timed in a budget this short"
    return line + (f", {achieved / peak:.0%} of the {peak:.0f} GFLOP/s of a "
                   f"{config.precision} matmul measured at the start")


class _Run:
    """The training loop of one :func:`train` call, with its thread choice; its clock and plan
    are the :class:`txlearn.training.schedule.BudgetPlanner`'s."""

    def __init__(self, *, model, net, optimizer, config, corpus: _Corpus, data_generator, dist,
                 started, budget, save, history, schedule, threads, start_step):
        self.model, self.net, self.optimizer, self.config = model, net, optimizer, config
        self.train_ids, self.val_ids = corpus.train_ids, corpus.val_ids
        self.data_generator, self.dist, self.dev = data_generator, dist, dist.device
        self.save = save
        self.started = started
        self.history, self.schedule, self.notes = history, schedule, []
        self.planner = BudgetPlanner(config=config, schedule=schedule, deadline=started + budget,
                                     dist=dist, n_val=len(corpus.val_ids),
                                     time_eval=self._time_eval)
        self.last_lr = schedule.lr(max(start_step - 1, 0))
        planned = schedule.total
        self.seconds = 0.0
        self.probe = None
        cpu = self.dev.type == "cpu"
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

    def _time_eval(self) -> float:
        """Seconds of one periodic evaluation (``eval_windows`` windows)."""
        c, t = self.config, time.perf_counter()
        evaluate(self.model, self.val_ids, c.block_size, c.eval_windows, dist=self.dist)
        return time.perf_counter() - t

    def loop(self, step: int, stop_after: int | None, progress: bool):
        """Train until the planned last step, ``stop_after`` steps, or the budget.

        Every ``eval_interval`` steps: a validation estimate, appended to ``history``, and
        ``save(step)`` (a checkpoint to resume from if the run is interrupted).
        Returns (losses of this call, "steps" or "time")."""
        from tqdm import tqdm  # the text bar: tqdm.auto warns in kernels without ipywidgets

        c, dist = self.config, self.dist
        self.model.train()
        losses, start = [], time.perf_counter()
        schedule, planner = self.schedule, self.planner
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
        # A call makes at least one step even when reading the text and building the model used
        # up the budget (a loaded machine under a few seconds' budget): a run that returned an
        # untrained model and no loss would tell the learner nothing. All ranks agree.
        (late,) = dist.all_reduce([float(time.perf_counter() >= planner.deadline)], "max")
        if late and step < last() and (end is None or step < end):
            self.notes.append(f"budget: its {planner.deadline - self.started:.1f} s were spent "
                              "before the first step (reading the text, building the model); "
                              "the run makes one step past it")
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
                planner.step_log.append((torch.get_num_threads() if self.threads else 0, dt))
            if self.probe is not None and not self.probe.final:
                self.probe.record(i, torch.get_num_threads(), dt)
                if self.probe.choice is not None:
                    self.threads = self.probe.choice
                if self.probe.final:
                    self.notes.append(f"threads: {self.probe.summary()}")
            if can_plan and step >= c.warmup_steps and step < last() and (
                    schedule.total is None or (step - c.warmup_steps) % replan_every == 0):
                planner.plan(step, self.threads)
                bar.total = last()
                bar.refresh()
            nearly = False
            if step % c.eval_interval == 0 and step < last() and step != end:  # else: final
                t_eval = time.perf_counter()
                val = evaluate(self.model, self.val_ids, c.block_size, c.eval_windows, dist=dist)
                planner.eval_seconds = time.perf_counter() - t_eval
                self.history.append({"step": step, "train": None, "val": val,
                                     "lr": self.last_lr,
                                     "seconds": round(time.perf_counter() - self.started, 2)})
                t_save = time.perf_counter()
                self.save(step)
                planner.save_seconds = time.perf_counter() - t_save
                self.model.train()
                nearly = True
            # would the next step (and the final evaluation) end past the budget? All ranks agree.
            loss, stop = dist.all_reduce([loss, float(planner.past_deadline())])
            loss /= dist.world
            losses.append(loss)
            if nearly:
                self.history[-1]["train"] = loss
            planner.marks.append((step, time.perf_counter()))
            bar.update(1)
            rate = tokens * len(losses) / (time.perf_counter() - start)
            bar.set_postfix(loss=f"{loss:.3f}", chars_s=f"{rate:,.0f}")
            if stop and step < last() and (end is None or step < end):
                stopped_by = "time"
                break
        bar.close()
        self.seconds = time.perf_counter() - start
        note = planner.note()
        if note:
            self.notes.append(note)
        return losses, stopped_by

    def _step(self, x, y, lr) -> float:
        """One optimiser step on this process's windows ``x, y (b, T)``, as ``grad_accum``
        micro-batches: each adds its mean token loss times its share of the tokens
        (``micro * T / (b * T)``) to the gradients, so their sum is the gradient of the mean
        over the whole batch, per token. DDP averages the gradients over the
        processes once, on the last micro-batch. Returns that mean loss."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        n_tokens, total = y.numel(), 0.0
        micro = x.shape[0] // self.config.grad_accum
        for i in range(0, x.shape[0], micro):
            last = i + micro >= x.shape[0]
            sync = contextlib.nullcontext() if last or not hasattr(self.net, "no_sync") \
                else self.net.no_sync()     # DDP: all-reduce the gradients once per step
            with sync:
                with autocast(self.config.precision, self.dev):
                    logits = self.net(x[i:i + micro])                  # (micro, T, n_vocab)
                target = y[i:i + micro].flatten()                      # (micro * T,)
                loss = F.cross_entropy(logits.flatten(0, 1).float(), target) * (
                    target.numel() / n_tokens)   # its share of the mean (exactly 1.0 unsplit)
                loss.backward()
            total += loss.item()
        nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        return total


def _log_start(log, corpus: _Corpus, *, config, budget, step, dist) -> None:
    log(f"text: {corpus.n_chars:,} characters, vocabulary n_vocab = {len(corpus.vocab)}; "
        f"train {len(corpus.train_ids):,}, validation {len(corpus.val_ids):,} "
        f"(the last {config.val_fraction:.0%})")
    log("baselines on the validation split (nats/char | bits/char): " + ", ".join(
        f"{k} {v:.3f} | {nats_to_bits(v):.3f}" for k, v in corpus.baselines.items()))
    start = f"resuming at step {step}, " if step else ""
    where = f"{dist.device.type}, {config.precision}"
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
