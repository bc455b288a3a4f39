"""Lesson 09: where a training run computes: device, precision, CPU threads, several processes.

- **device**: ``"auto"`` is the first CUDA GPU when PyTorch sees one, else the CPU; ``"cpu"``,
  ``"cuda"`` or ``"cuda:N"`` ask for one. Nothing needs a GPU.
- **precision**: ``"auto"`` trains under bfloat16 autocast (``torch.autocast``: matrix products in
  bfloat16, weights, optimizer state, softmax, LayerNorm and the loss in float32) where the
  hardware computes bfloat16 natively (a CUDA GPU with bfloat16, a CPU with AVX512-BF16 or AMX),
  and in float32 elsewhere; ``"fp32"`` and ``"bf16"`` force one. Evaluation is always float32.
- **threads** (CPU): ``"auto"`` keeps ``OMP_NUM_THREADS`` when it is set; otherwise the training
  loop times steps with all cores and with one, at its start and again before it plans its
  schedule (:class:`ThreadProbe`), and keeps the faster, because on a busy machine several
  threads can run slower than one (each waits for the slowest at every operation). An integer
  fixes the count.
- **data parallelism**: launched by ``torchrun --nproc_per_node=N -m txlearn train ...``
  (which sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``),
  :class:`Distributed` joins the process group: gloo on the CPU, NCCL on GPUs, one GPU per
  process. Every rank draws the same global batch and keeps its own contiguous slice of it
  (:meth:`Distributed.shard`); ``DistributedDataParallel`` averages the gradients, so the
  ranks take the step one process takes on the whole batch. Each rank draws its own dropout
  masks (global generator seeded ``seed + rank`` after the identical initialisation), and a
  checkpoint holds every rank's generator state (:meth:`Distributed.rng_states`), so a resumed
  run continues each rank exactly. With dropout the ranks cannot draw the masks one process
  would draw, so only a run without dropout follows the one-process trajectory.

Source: lesson 09; PyTorch's ``torch.distributed`` and ``torch.autocast`` documentation.
"""

from __future__ import annotations

import contextlib
import os

import torch

from txlearn.training.data import UserError

__all__ = ["PRECISIONS", "resolve_device", "native_bf16", "resolve_precision", "autocast",
           "available_cores", "ThreadProbe", "Distributed", "matmul_gflops"]

PRECISIONS = ("auto", "fp32", "bf16")


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> ``cuda`` when available, else ``cpu``; other names are checked.

    Raises ``UserError`` for an unknown name or a CUDA device PyTorch cannot see.
    """
    if isinstance(device, torch.device):
        name = str(device)
    else:
        name = str(device).strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {name!r} asked for, but PyTorch sees no CUDA GPU "
                        "(use --device cpu or auto)")
    if dev.type not in ("cpu", "cuda"):
        raise UserError(f"device {name!r} is not supported: use auto, cpu, cuda or cuda:N")
    return dev


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bfloat16 matrix products in hardware.

    CUDA: ``torch.cuda.is_bf16_supported()``. CPU: AVX512-BF16 or AMX, as PyTorch reports them
    (``torch.cpu._is_avx512_bf16_supported``, ``_is_amx_tile_supported``; False when this
    PyTorch lacks the query).
    """
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def resolve_precision(precision: str, device: torch.device) -> str:
    """``"auto"`` -> ``"bf16"`` where :func:`native_bf16`, else ``"fp32"``; raises ``UserError``
    for a name outside :data:`PRECISIONS`."""
    if precision not in PRECISIONS:
        raise UserError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    return precision


def autocast(precision: str, device: torch.device):
    """The context a training forward runs in: bfloat16 autocast for ``"bf16"``, else nothing."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class ThreadProbe:
    """Choose 1 or ``n`` CPU threads by timing real training steps with each.

    In each probe window the steps alternate ``n`` threads and 1 thread: the first window is
    steps ``1 .. 2 * rounds`` of the call (step 0 pays one-time costs and is not timed); a second
    window, the ``2 * rounds`` steps before step ``second_at`` (where the run plans its
    schedule), times them again a few seconds later, so that another program's burst during one
    window cannot decide alone. After each window :meth:`decide` keeps the count whose fastest
    step was faster (the fastest, because other programs only ever slow a step down; a machine
    busy throughout slows every step with ``n`` threads, and one thread wins). Between and after
    the windows :meth:`threads_for` returns the choice. ``n`` defaults to
    ``torch.get_num_threads()`` at construction.
    """

    def __init__(self, rounds: int = 4, n: int | None = None, second_at: int | None = None):
        self.n, self.rounds = (torch.get_num_threads() if n is None else n), rounds
        width = 2 * rounds
        self.windows = [range(1, width + 1)]
        if second_at is not None and second_at - width > width + 4:
            self.windows.append(range(second_at - width, second_at))
        self.times: dict[int, list[float]] = {self.n: [], 1: []}
        self.choice: int | None = None
        self.final = False

    @property
    def last_step(self) -> int:
        """The last step that is part of a probe window."""
        return self.windows[-1][-1]

    def threads_for(self, step: int) -> int:
        for window in self.windows:
            if step in window:
                return self.n if (step - window.start) % 2 == 0 else 1
        return self.n if self.choice is None else self.choice

    def record(self, step: int, threads: int, seconds: float) -> None:
        """Note a timed step; at the end of a window, decide (final after the last one)."""
        if not any(step in window for window in self.windows):
            return
        self.times.setdefault(threads, []).append(seconds)
        if any(step == window[-1] for window in self.windows):
            self.decide()
            self.final = step == self.last_step

    def decide(self) -> int:
        """The count with the faster fastest step (ties go to ``n``)."""
        fastest = {k: min(v) for k, v in self.times.items() if v}
        self.choice = min(fastest, key=lambda k: (fastest[k], -k)) if fastest else self.n
        return self.choice

    def summary(self) -> str:
        parts = [f"{k} thread{'s' if k > 1 else ''} {1e3 * min(v):.0f} ms"
                 for k, v in sorted(self.times.items(), reverse=True) if v]
        steps = sum(len(v) for v in self.times.values())
        return f"{self.choice} (fastest of {steps} alternating steps: {', '.join(parts)})"


class Distributed:
    """This process's place in a data-parallel run (one process: rank 0 of 1, no group).

    :meth:`start` joins the process group when ``torchrun`` launched the process (``WORLD_SIZE``
    > 1 in the environment) or uses the group already initialised by the caller. Collectives
    run on :attr:`device` tensors (gloo: CPU, NCCL: the process's GPU).
    """

    def __init__(self, rank: int = 0, world: int = 1, local_rank: int = 0,
                 device: torch.device = torch.device("cpu"), owns_group: bool = False):
        self.rank, self.world, self.local_rank = rank, world, local_rank
        self.device, self.owns_group = device, owns_group

    @classmethod
    def start(cls, device: torch.device) -> "Distributed":
        """Join (or reuse) the process group; on CUDA pick the GPU ``LOCAL_RANK``.

        Returns a one-process :class:`Distributed` when no group is wanted. Raises
        ``UserError`` when several processes share fewer GPUs than they need.
        """
        import torch.distributed as dist

        world = int(os.environ.get("WORLD_SIZE", "1"))
        initialised = dist.is_available() and dist.is_initialized()
        if world <= 1 and not initialised:
            return cls(device=device)
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if device.type == "cuda":
            if local_rank >= torch.cuda.device_count():
                raise UserError(f"process {local_rank} needs GPU {local_rank}, but PyTorch sees "
                                f"{torch.cuda.device_count()}: start at most that many processes "
                                "per node")
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        owns = False
        if not initialised:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
            owns = True
        return cls(dist.get_rank(), dist.get_world_size(), local_rank, device, owns)

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that prints and writes checkpoints."""
        return self.rank == 0

    def shard(self, batch: torch.Tensor) -> torch.Tensor:
        """Rows ``[rank * B / world, (rank + 1) * B / world)`` of a global batch ``(B, ...)``."""
        if self.world == 1:
            return batch
        per = batch.shape[0] // self.world
        return batch[self.rank * per:(self.rank + 1) * per]

    def all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """Sum (``op="sum"``), minimum or maximum of ``values`` over the ranks, float64."""
        if self.world == 1:
            return list(values)
        import torch.distributed as dist

        ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=ops[op])
        return t.tolist()

    def rng_states(self) -> list[dict]:
        """Every rank's generator states, rank 0 first: ``[{"torch": ByteTensor, "cuda": ...}]``
        (``"cuda"`` on a GPU). A collective: every rank must call it."""
        mine = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            mine["cuda"] = torch.cuda.get_rng_state(self.device)
        if self.world == 1:
            return [mine]
        import torch.distributed as dist

        states: list = [None] * self.world
        dist.all_gather_object(states, mine)
        return states

    def restore_rng(self, tensors: dict, seed: int) -> None:
        """Set this rank's generators from a checkpoint's ``rng.*`` tensors; a rank the
        checkpoint has no state for (it was written by fewer processes) is seeded afresh with
        ``seed + rank``."""
        suffix = f".rank{self.rank}" if self.rank else ""
        if f"rng.torch{suffix}" in tensors:
            torch.set_rng_state(tensors[f"rng.torch{suffix}"])
        else:
            torch.manual_seed(seed + self.rank)
        if self.device.type == "cuda" and f"rng.cuda{suffix}" in tensors:
            torch.cuda.set_rng_state(tensors[f"rng.cuda{suffix}"], self.device)

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist
            dist.barrier()

    def close(self) -> None:
        """Leave the process group if :meth:`start` created it."""
        if self.owns_group:
            import torch.distributed as dist
            dist.destroy_process_group()
            self.owns_group = False


def matmul_gflops(device: torch.device, dtype: torch.dtype = torch.float32, n: int = 512,
                  repeats: int = 10) -> float:
    """GFLOP/s of the fastest of ``repeats`` products of two ``(n, n)`` matrices of ``dtype`` on
    ``device`` (``2 n^3`` FLOPs each, after three untimed products that pay the kernels' first
    call), at the current thread count: the peak a training step is measured against. Random
    inputs from a generator of its own. (With one untimed product and three timed, the same
    bfloat16 peak read 359 and 631 GFLOP/s in two runs an hour apart on one quiet machine.)"""
    import time

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device, dtype)
    b = torch.randn(n, n, generator=gen).to(device, dtype)
    best, warmup = float("inf"), 3
    for i in range(warmup + repeats):
        t = time.perf_counter()
        (a @ b)[0, 0].item()                      # .item() waits for the device
        if i >= warmup:
            best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best / 1e9
