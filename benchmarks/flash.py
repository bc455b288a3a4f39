"""FlashAttention against ordinary attention in training: peak memory and time of one forward and
backward pass, one head, d_k 64, float32, one torch thread.

    .venv/bin/python benchmarks/flash.py            # T = 256 ... 8192, about 2 minutes here
    .venv/bin/python benchmarks/flash.py --quick    # T up to 2048

For each T: ``ordinary`` is ``txlearn.attention.scaled_dot_product_attention`` under autograd (it
keeps the T x T weights for its backward pass); ``tiled`` is ``tiled_attention`` under autograd
(linear memory in inference, not in training: every block's intermediate results are kept);
``flash`` is ``txlearn.flash_attention.flash_attention`` (its Function keeps Q, K, V, O and one
log-sum-exp per row and recomputes each block in its backward pass), blocks of 128 keys. Peak
memory: ``peak_memory_bytes`` (the PyTorch profiler's allocation events during the step, above
what was allocated before it: inputs excluded, the gradients included) of a step that turns
autograd back on inside itself (``peak_memory_bytes`` runs its call under inference mode). Time: this thread's CPU time of the step, the fastest of 3, the variants
timed in turn round after round. Before timing, each variant's gradients are checked against
ordinary attention's (to 1e-4 in float32). Not part of the tests (timings depend on the machine
and its load); the targets of issue 21 are printed with the table.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from txlearn.attention import scaled_dot_product_attention
from txlearn.flash_attention import flash_attention, tiled_attention
from txlearn.measuring import fit_loglog_slope, peak_memory_bytes

D_K, BLOCK = 64, 128


def step(attention, T, seed=0):
    """One forward and backward pass of `attention` on fresh (1, T, d_k) inputs."""
    g = torch.Generator().manual_seed(seed)
    Q, K, V = (torch.randn(1, T, D_K, generator=g, requires_grad=True) for _ in range(3))
    dO = torch.randn(1, T, D_K, generator=g)

    def run():
        with torch.inference_mode(False):  # autograd on, also inside peak_memory_bytes
            return torch.autograd.grad(attention(Q, K, V), (Q, K, V), dO)
    return run


VARIANTS = {
    "ordinary": scaled_dot_product_attention,
    "tiled": lambda Q, K, V: tiled_attention(Q, K, V, block_size=BLOCK),
    "flash": lambda Q, K, V: flash_attention(Q, K, V, block_size=BLOCK),
}


def cpu_time(fn):
    """This thread's CPU time of one call of fn (one torch thread: the call's own work)."""
    start = time.thread_time()
    fn()
    return time.thread_time() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="T up to 2048")
    parser.add_argument("--tiled-up-to", type=int, default=4096,
                        help="largest T for tiled attention under autograd (slow, quadratic memory)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    Ts = [256, 512, 1024, 2048] + ([] if args.quick else [4096, 8192])
    rows = []
    for T in Ts:
        names = [n for n in VARIANTS if n != "tiled" or T <= args.tiled_up_to]
        steps = {n: step(VARIANTS[n], T) for n in names}
        ref = steps["ordinary"]()
        for n in names:
            for a, b in zip(steps[n](), ref):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        peak = {n: peak_memory_bytes(steps[n]) for n in names}
        best = {n: float("inf") for n in names}
        for _ in range(3):          # in turn: a change of load hits every variant alike
            for n in names:
                best[n] = min(best[n], cpu_time(steps[n]))
        rows.append((T, peak, best))
        print(f"T = {T}: " + ", ".join(f"{n} {peak[n] / 2**20:.1f} MiB {best[n] * 1e3:.1f} ms"
                                     for n in names), flush=True)
    print()
    print(f"FlashAttention vs ordinary attention, one forward + backward pass (d_k = {D_K}, one "
          f"head, float32, block {BLOCK}, 1 thread; {platform.machine()}, torch {torch.__version__})")
    print()
    print("| T | ordinary peak (MiB) | tiled peak (MiB) | flash peak (MiB) | flash / ordinary | "
          "ordinary (ms) | tiled (ms) | flash (ms) | flash / ordinary |")
    print("|---|---|---|---|---|---|---|---|---|")
    for T, peak, best in rows:
        tiled_peak = f"{peak['tiled'] / 2**20:.1f}" if "tiled" in peak else "-"
        tiled_ms = f"{best['tiled'] * 1e3:.1f}" if "tiled" in best else "-"
        print(f"| {T} | {peak['ordinary'] / 2**20:.1f} | {tiled_peak} | {peak['flash'] / 2**20:.1f} | "
              f"{peak['flash'] / peak['ordinary']:.3f} | {best['ordinary'] * 1e3:.1f} | {tiled_ms} | "
              f"{best['flash'] * 1e3:.1f} | {best['flash'] / best['ordinary']:.2f} |")
    fit = [(T, p["flash"], p["ordinary"]) for T, p, _ in rows if T >= 512]
    slope = fit_loglog_slope([r[0] for r in fit], [r[1] for r in fit])
    slope_ordinary = fit_loglog_slope([r[0] for r in fit], [r[2] for r in fit])
    tiled = [(T, p["tiled"]) for T, p, _ in rows if T >= 512 and "tiled" in p]
    print()
    print(f"peak-memory log-log slope, T = {fit[0][0]} to {fit[-1][0]}: flash {slope:.3f} "
          f"(target <= 1.15), ordinary {slope_ordinary:.3f}"
          + (f", tiled under autograd {fit_loglog_slope(*zip(*tiled)):.3f}" if len(tiled) > 1 else ""))
    last_T, last_peak, _ = rows[-1]
    print(f"at T = {last_T}: flash peak / ordinary peak = {last_peak['flash'] / last_peak['ordinary']:.3f}"
          " (target <= 0.10 at T = 8192)")
    at_2048 = next(best for T, _, best in rows if T == 2048)
    print(f"at T = 2048: flash time / ordinary time = {at_2048['flash'] / at_2048['ordinary']:.2f} "
          "(target <= 2.5)")


if __name__ == "__main__":
    main()
