"""Tests of txlearn.measuring: peak memory sees PyTorch's allocations, log-log slopes, and the
timer's repeats, clocks and reductions (no test asserts how long anything takes)."""

import numpy as np
import pytest
import torch

from txlearn import measuring


# ---- measuring -------------------------------------------------------------------------------

def test_peak_memory_sees_torch_allocations():
    n = 1 << 20  # 4 MiB of float32
    peak = measuring.peak_memory_bytes(lambda: torch.ones(n) + 1.0)
    assert 2 * 4 * n <= peak <= 2 * 4 * n + 65536  # the ones, and the sum alive at once


def test_peak_memory_of_attention_matrix_grows_quadratically():
    def make(T):
        Q = torch.randn(T, 16)
        return lambda: torch.softmax(Q @ Q.T, dim=-1) @ Q
    peaks = measuring.measure(make, [256, 512, 1024], what="memory")
    assert 1.9 < measuring.fit_loglog_slope([256, 512, 1024], peaks) < 2.05


def test_fit_loglog_slope_exact_power_law_and_errors():
    x = np.array([1.0, 2.0, 4.0, 8.0])
    assert measuring.fit_loglog_slope(x, 3 * x**1.5) == pytest.approx(1.5, abs=1e-12)
    with pytest.raises(ValueError, match="positive"):
        measuring.fit_loglog_slope([1, 2], [0, 1])
    with pytest.raises(ValueError, match=r"\(3,\) and \(2,\)"):
        measuring.fit_loglog_slope([1, 2, 3], [1, 2])


def test_time_callable_counts_calls_and_returns_seconds():
    calls = []
    t = measuring.time_callable(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and 0.0 <= t < 1.0
    with pytest.raises(ValueError, match="repeats"):
        measuring.time_callable(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="reduce must be 'min' or 'median', got 'mean'"):
        measuring.time_callable(lambda: None, reduce="mean")


def test_time_callable_cpu_clock_counts_work_not_waiting():
    """clock="cpu" reads the thread's CPU time: a call that sleeps costs almost nothing on it,
    while the wall clock sees the whole sleep."""
    import time
    wall = measuring.time_callable(lambda: time.sleep(0.05), repeats=2, warmup=0)
    cpu = measuring.time_callable(lambda: time.sleep(0.05), repeats=2, warmup=0, clock="cpu")
    assert wall >= 0.05 and cpu < 0.01
    busy = measuring.time_callable(lambda: sum(range(200_000)), repeats=2, warmup=0, clock="cpu")
    assert busy > 0                                         # and it does count work
    with pytest.raises(ValueError, match="clock must be 'wall' or 'cpu', got 'process'"):
        measuring.time_callable(lambda: None, clock="process")


def test_time_callable_min_and_median_with_a_fake_clock(monkeypatch):
    # a fake clock: the warmup reads it once; the three timed calls take 3, 1, 2 "seconds"
    ticks = iter([0, 10, 13, 20, 21, 30, 32] * 2)
    monkeypatch.setattr(measuring.time, "perf_counter", lambda: next(ticks))
    assert measuring.time_callable(lambda: None, repeats=3, warmup=1) == 1
    assert measuring.time_callable(lambda: None, repeats=3, warmup=1, reduce="median") == 2


def test_measure_in_rounds_times_the_values_in_turn_and_keeps_each_ones_fastest():
    order, times = [], iter([5.0, 1.0, 9.0, 2.0, 3.0, 7.0] * 2)
    def make(v):
        return lambda: order.append(v)
    real = measuring.time_callable
    try:   # a fake timer: each call of time_callable runs fn once and "takes" the next time
        measuring.time_callable = lambda fn, repeats, clock="wall": (fn(), next(times))[1]
        got = measuring.measure(make, [10, 20, 30], "time", repeats=1, rounds=2)
    finally:
        measuring.time_callable = real
    assert order == [10, 20, 30, 10, 20, 30]                  # in turn, round after round
    assert got.tolist() == [2.0, 1.0, 7.0]                    # min(5, 2), min(1, 3), min(9, 7)
    with pytest.raises(ValueError, match="rounds"):
        measuring.measure(make, [10], rounds=0)
