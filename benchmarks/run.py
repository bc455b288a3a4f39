"""Speed and memory of the course's attention against PyTorch's built-ins, on this machine.

    .venv/bin/python benchmarks/run.py            # T = 256 ... 4096 (8192 for tiled), ~3-5 min
    .venv/bin/python benchmarks/run.py --quick    # T = 256 ... 1024, under a minute

Prints three markdown tables (copy them into benchmarks/README.md):

1. attention, one call on (B=1, n_heads=4, T, d_k=64) float32: the course's teaching attention
   (``txlearn.attention.scaled_dot_product_attention``) against the same operations written
   inline (max-shift, exp, sum, divide), against inline code with the fused ``torch.softmax``, and
   against ``F.scaled_dot_product_attention`` (a fused kernel: a different algorithm on CPU);
2. multi-head attention, d_model=512, 8 heads: ``txlearn.heads.MultiHeadAttention`` against
   ``nn.MultiheadAttention`` with copied weights: the teaching path returning its weights against
   ``need_weights=True`` on its explicit path (the same algorithm: bmm, softmax, bmm; its fast
   path switched off) and on its native fused kernel (what inference mode picks), and the
   ``use_sdpa=True`` path against ``need_weights=False`` (both fused); outputs checked equal;
3. tiled attention with an online softmax (``txlearn.flash_attention.tiled_attention``, block 256)
   against ordinary attention: time and peak memory (PyTorch profiler allocation events) up to
   T = 8192.

Runs on one thread by default (``--threads``), so that other programs on a shared machine
disturb the ratios less. Times are the fastest of the repeats (``txlearn.measuring.time_callable``); ratio = ours /
PyTorch's (above 1 means ours is slower). Not part of the tests: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import math
import os
import platform

import torch
import torch.nn.functional as F
from torch import nn

from txlearn.attention import scaled_dot_product_attention
from txlearn.flash_attention import tiled_attention
from txlearn.heads import MultiHeadAttention
from txlearn.measuring import peak_memory_bytes, time_callable


def attention_same_ops_inline(Q, K, V):
    """The course's algorithm written inline: scores, max-shift, exp, sum, divide, weighted sum."""
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])  # (B, h, T, T)
    e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    return (e / e.sum(dim=-1, keepdim=True)) @ V  # (B, h, T, d_k)


def attention_fused_softmax_inline(Q, K, V):
    """Inline, with PyTorch's fused softmax kernel."""
    return torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1) @ V


def interleaved_times(fns: dict, repeats: int) -> dict:
    """Fastest time (s) of each callable, timing them in turn, round after round, so that a change
    in the machine's load touches every variant alike (one warmup call each first)."""
    best = {name: math.inf for name in fns}
    with torch.inference_mode():
        for name, fn in fns.items():
            fn()
        for _ in range(repeats):
            for name, fn in fns.items():
                best[name] = min(best[name], time_callable(fn, repeats=1, warmup=0))
    return best


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def ms(seconds):
    return f"{seconds * 1e3:.1f}"


def bench_attention(Ts, repeats):
    rows = []
    for T in Ts:
        Q, K, V = (torch.randn(1, 4, T, 64) for _ in range(3))
        ours = scaled_dot_product_attention(Q, K, V)
        for fn in (attention_same_ops_inline, attention_fused_softmax_inline,
                   F.scaled_dot_product_attention):
            torch.testing.assert_close(fn(Q, K, V), ours, rtol=1e-4, atol=1e-5)
        t = interleaved_times({name: (lambda f=f: f(Q, K, V)) for name, f in (
            ("ours", scaled_dot_product_attention), ("inline", attention_same_ops_inline),
            ("fused", attention_fused_softmax_inline), ("sdpa", F.scaled_dot_product_attention))},
            repeats)
        rows.append((T, ms(t["ours"]), ms(t["inline"]), f"{t['ours'] / t['inline']:.2f}",
                     ms(t["fused"]), f"{t['ours'] / t['fused']:.2f}", ms(t["sdpa"]),
                     f"{t['ours'] / t['sdpa']:.2f}"))
        print(f"  attention T={T} done", flush=True)
    return table(("T", "ours (ms)", "same ops inline (ms)", "ratio", "inline + torch.softmax (ms)",
                  "ratio", "F.sdpa (ms)", "ratio"), rows)


def _explicit_mha(ref, x):
    """nn.MultiheadAttention's explicit (non-fused) path: the same algorithm as ours."""
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        return ref(x, x, x, need_weights=True, average_attn_weights=False)
    finally:
        torch.backends.mha.set_fastpath_enabled(True)


def bench_multihead(Ts, repeats):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(512, 8, batch_first=True).eval()
    ours = MultiHeadAttention.from_torch(ref).eval()
    fast = MultiHeadAttention.from_torch(ref).eval()
    fast.use_sdpa = True
    rows = []
    for T in Ts:
        x = torch.randn(1, T, 512)
        with torch.inference_mode():
            expected, _ = ref(x, x, x, need_weights=False)
            torch.testing.assert_close(ours(x), expected, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(fast(x), expected, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(_explicit_mha(ref, x)[0], expected, rtol=1e-4, atol=1e-5)
        t = interleaved_times({
            "ours": lambda: ours(x, return_weights=True),
            "explicit": lambda: _explicit_mha(ref, x),
            "weights": lambda: ref(x, x, x, need_weights=True, average_attn_weights=False),
            "fast": lambda: fast(x),
            "fused": lambda: ref(x, x, x, need_weights=False)}, repeats)
        rows.append((T, ms(t["ours"]), ms(t["explicit"]), f"{t['ours'] / t['explicit']:.2f}",
                     ms(t["weights"]), f"{t['ours'] / t['weights']:.2f}",
                     ms(t["fast"]), ms(t["fused"]), f"{t['fast'] / t['fused']:.2f}"))
        print(f"  multi-head T={T} done", flush=True)
    return table(("T", "ours, teaching path, with weights (ms)",
                  "nn.MHA explicit path, with weights (ms)", "ratio",
                  "nn.MHA native fused, with weights (ms)", "ratio",
                  "ours, use_sdpa=True (ms)", "nn.MHA need_weights=False (ms)", "ratio"), rows)


def bench_tiled(Ts, repeats):
    rows = []
    for T in Ts:
        Q, K, V = (torch.randn(1, T, 64) for _ in range(3))
        if T <= 4096:
            torch.testing.assert_close(tiled_attention(Q, K, V, block_size=256),
                                       scaled_dot_product_attention(Q, K, V), rtol=1e-4, atol=1e-5)
        plain = lambda: scaled_dot_product_attention(Q, K, V)  # noqa: E731
        tiled = lambda: tiled_attention(Q, K, V, block_size=256)  # noqa: E731
        sdpa = lambda: F.scaled_dot_product_attention(Q, K, V)  # noqa: E731
        m_plain, m_tiled, m_sdpa = (peak_memory_bytes(f) for f in (plain, tiled, sdpa))
        t = interleaved_times({"plain": plain, "tiled": tiled, "sdpa": sdpa}, repeats)
        t_plain, t_tiled, t_sdpa = t["plain"], t["tiled"], t["sdpa"]
        rows.append((T, f"{m_plain / 2**20:.1f}", f"{m_tiled / 2**20:.1f}",
                     f"{m_tiled / m_plain:.3f}", f"{m_sdpa / 2**20:.1f}", ms(t_plain), ms(t_tiled),
                     f"{t_tiled / t_plain:.2f}", ms(t_sdpa)))
        print(f"  tiled T={T} done", flush=True)
    return table(("T", "ordinary peak (MiB)", "tiled peak (MiB)", "tiled / ordinary",
                  "F.sdpa peak (MiB)", "ordinary (ms)", "tiled (ms)", "tiled / ordinary",
                  "F.sdpa (ms)"), rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="T up to 1024 only")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: steadier on a shared machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    Ts = [256, 512, 1024] if args.quick else [256, 512, 1024, 2048, 4096]
    Ts_tiled = [1024, 2048] if args.quick else [1024, 2048, 4096, 8192]
    print(f"# machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads\n", flush=True)
    results = [
        "## attention (B=1, n_heads=4, d_k=64, float32)\n\n" + bench_attention(Ts, args.repeats),
        "## multi-head attention (d_model=512, 8 heads, B=1)\n\n" + bench_multihead(Ts, args.repeats),
        "## tiled attention (block 256, d_k=64, one head)\n\n" + bench_tiled(Ts_tiled, args.repeats),
    ]
    print("\n\n".join(results))


if __name__ == "__main__":
    main()
