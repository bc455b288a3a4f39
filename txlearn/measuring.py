"""Lesson 08: what a callable costs, measured: wall or CPU time, peak memory, log-log slopes.

Wall time is the fastest of repeats (``time.perf_counter``; or the calling thread's CPU time);
peak memory comes from the PyTorch profiler's memory events, which see PyTorch's own CPU
allocations (the standard library's ``tracemalloc`` does not); :func:`measure` runs either over a
range of T or d, and :func:`fit_loglog_slope` turns the result into the exponent of a power law.
Timings are never asserted in tests (they depend on the machine's load); lesson 08 asserts slopes
with wide tolerances. Source: lesson 08.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from typing import Callable, Iterable

import numpy as np
import torch

__all__ = ["time_callable", "peak_memory_bytes", "measure", "fit_loglog_slope"]


_CLOCKS = {"wall": "perf_counter", "cpu": "thread_time"}


def time_callable(fn: Callable[[], object], repeats: int = 5, warmup: int = 1,
                  reduce: str = "min", clock: str = "wall") -> float:
    """Time of ``fn()`` in seconds over `repeats` calls, after `warmup` calls.

    ``clock="wall"`` (default) is elapsed time (``time.perf_counter``); ``clock="cpu"`` is the CPU
    time of the calling thread (``time.thread_time``, user + system, page faults included). With
    PyTorch on one thread (``torch.set_num_threads(1)``) every operation runs on the calling
    thread, so the CPU clock counts the call's own work and not the time it spends waiting while
    other programs use the CPU: on a busy machine a long call waits more often than a short
    one, which inflates wall-time slopes. (With several threads the CPU clock misses the other
    threads' work: use it with one thread only.)

    ``reduce="min"`` (default) returns the fastest call: other processes on a shared machine only
    ever add time, so the minimum is the steadiest estimate of the call's own cost;
    ``reduce="median"`` returns the median. Runs under ``torch.inference_mode()`` (no autograd
    bookkeeping). Raises ValueError when ``repeats < 1``, ``warmup < 0``, or `reduce` or `clock`
    is unknown. Source: lesson 08.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats ({repeats}) must be >= 1 and warmup ({warmup}) >= 0")
    if reduce not in ("min", "median"):
        raise ValueError(f"reduce must be 'min' or 'median', got {reduce!r}")
    if clock not in _CLOCKS:
        raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    now = getattr(time, _CLOCKS[clock])
    times = []
    with torch.inference_mode():
        for i in range(warmup + repeats):
            start = now()
            fn()
            if i >= warmup:
                times.append(now() - start)
    return min(times) if reduce == "min" else statistics.median(times)


@contextlib.contextmanager
def _silent_c_stderr():
    """Send file descriptor 2 to /dev/null for a while: the profiler's C++ side logs a line on
    every start and stop there, which would fill a notebook. Python's ``sys.stderr`` (warnings,
    tracebacks) is flushed first and restored after."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no usable descriptor 2: nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def peak_memory_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes that PyTorch allocated on the CPU during one call of ``fn()``, above the start.

    Method: the PyTorch profiler with ``profile_memory=True`` records every allocation and free
    of PyTorch's CPU allocator (tensors created by ``fn``, including temporaries); replaying those
    events in time order gives the running total and its maximum. ``tracemalloc`` would miss
    these allocations (they are not made by the Python allocator), and NumPy arrays are not seen
    by this profiler either: measure PyTorch code only. The result of ``fn`` counts as allocated
    (it is alive at the end). Output that C code writes to file descriptor 2 during the call is
    discarded (the profiler's own log lines); Python-level warnings are not affected. Runs under ``torch.inference_mode()``. Returns an int (bytes).
    Source: lesson 08.
    """
    from torch.profiler import ProfilerActivity, profile

    with _silent_c_stderr(), torch.inference_mode(), profile(activities=[ProfilerActivity.CPU],
                                                             profile_memory=True) as prof:
        result = fn()
    del result
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    current = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        current += event.nbytes()  # negative for a free
        peak = max(peak, current)
    return int(peak)


def measure(make_fn: Callable[[int], Callable[[], object]], values: Iterable[int],
            what: str = "time", repeats: int = 3, clock: str = "wall",
            rounds: int = 1) -> np.ndarray:
    """Measure ``make_fn(v)()`` for each v in `values`: seconds (``what="time"``, with `clock` as in
    :func:`time_callable`) or peak bytes (``what="memory"``). `make_fn` builds the inputs outside
    the measured call (once per value).

    ``rounds > 1`` (time only): every value is timed once per round, the values in turn, and each
    keeps its fastest round, so that a busy stretch of a shared machine hits every value alike
    instead of the few that happen to be timed during it (lesson 08 measured the difference: an
    RNN's slope against T read 0.79 to 1.25 value by value under load, 1.00 to 1.07 in rounds).

    Returns a float64 array, one value per entry of `values`. Raises ValueError for an unknown
    `what` or ``rounds < 1``. Source: lesson 08.
    """
    if what not in ("time", "memory"):
        raise ValueError(f"what must be 'time' or 'memory', got {what!r}")
    if rounds < 1:
        raise ValueError(f"rounds ({rounds}) must be >= 1")
    if rounds == 1 or what == "memory":   # one value's inputs alive at a time
        out = []
        for v in values:
            fn = make_fn(v)
            out.append(time_callable(fn, repeats, clock=clock) if what == "time"
                       else peak_memory_bytes(fn))
        return np.asarray(out, dtype=np.float64)
    fns = [make_fn(v) for v in values]
    best = np.full(len(fns), np.inf)
    for _ in range(rounds):
        best = np.minimum(best, [time_callable(fn, repeats, clock=clock) for fn in fns])
    return best


def fit_loglog_slope(x: Iterable[float], y: Iterable[float]) -> float:
    """Least-squares slope of ``log y`` against ``log x``: the exponent p of ``y ~ c x^p``.

    Raises ValueError unless x and y have the same length (>= 2) and are all positive.
    Source: lesson 08.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or len(x) < 2:
        raise ValueError(f"x and y must be 1-D of the same length >= 2, got {x.shape} and {y.shape}")
    if (x <= 0).any() or (y <= 0).any():
        raise ValueError("x and y must be positive to take logarithms")
    slope, _ = np.polyfit(np.log(x), np.log(y), 1)
    return float(slope)
