"""`txlearn train` with its defaults, timed as a user would time it, beside the issue's baselines.

    .venv/bin/python benchmarks/train_budget.py             # 3 runs, about 9 minutes
    .venv/bin/python benchmarks/train_budget.py --runs 1

Each run is the whole command, ``python -m txlearn train --out <tmp> --force --no-progress``,
in a fresh process (interpreter start, ``import torch``, the text, training, the final
evaluation over the whole validation split and the checkpoint all inside the wall time), with
``TXLEARN_TRAIN_SECONDS`` removed from its environment. The goal (issue 17): every run at most
180 s of wall time and at most 1.24 nats/char on the whole validation split, on a quiet 2-core
CPU. Run it when nothing else runs: another program on the cores slows every step.

Prints one row per run (wall time, steps, how training stopped, the thread choice and the
validation loss), the baselines measured on the same corpus and split (the issue's table), and
the default run's loss against wall time from the checkpoint's history (validation estimates on
``eval_windows`` windows at each interval; the last row is the whole split).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_SECONDS, GOAL_NATS = 180.0, 1.24
BASELINES = [  # issue 17: same corpus and split, quiet 2-core machine
    ("old `txlearn train` defaults (d 128, 4 layers, T 128, B 24; 446 steps)", 150, 1.729),
    ("minimal GPT recipe for CPUs (d 128, 4 layers, T 64, B 12, lr 1e-3, 2300 iters)", 136, 1.378),
    ("the same recipe, 3600 iters", 236, 1.267),
]


def run_once(out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TXLEARN_TRAIN_SECONDS"}
    cmd = [sys.executable, "-m", "txlearn", "train", "--out", str(out), "--force", "--no-progress"]
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode:
        sys.exit(f"txlearn train failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    m = re.search(r"model: validation ([\d.]+) nats/char .* after (\d+) steps \(([\d.]+) s of "
                  r"training in this run, stopped by (\w+)\)", proc.stdout)
    threads = re.search(r"^threads: (.*)$", proc.stdout, re.M)
    plan = re.search(r"^schedule: (.*)$", proc.stdout, re.M)
    return {"wall": wall, "nats": float(m.group(1)), "steps": int(m.group(2)),
            "loop": float(m.group(3)), "stopped_by": m.group(4),
            "threads": threads.group(1) if threads else "-",
            "plan": plan.group(1) if plan else "", "stdout": proc.stdout}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    from txlearn.training.config import TrainConfig

    c = TrainConfig()   # the recipe is the run's choice (its log's "recipe:" line)
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"defaults: recipe chosen by the run, {c.n_layers} layers, up to {c.max_steps} "
          f"steps, budget {c.max_seconds:.0f} s; "
          f"load average before: {os.getloadavg()[0]:.2f}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            r = run_once(Path(tmp) / f"run{i}.safetensors")
            rows.append(r)
            print(f"run {i + 1}: {r['wall']:.1f} s, validation {r['nats']:.3f} nats/char, "
                  f"{r['steps']} steps ({r['stopped_by']}), threads {r['threads']} {r['plan']}",
                  flush=True)
        from txlearn.training.checkpoint import load_checkpoint
        history = load_checkpoint(Path(tmp) / "run0.safetensors")["history"]
    print()
    print("| run | wall (s) | steps | stopped by | threads | whole-validation loss (nats/char) |")
    print("|---|---|---|---|---|---|")
    for name, wall, nats in BASELINES:
        print(f"| {name} | {wall} | | | | {nats:.3f} |")
    for i, r in enumerate(rows, 1):
        print(f"| `txlearn train` defaults, run {i} | {r['wall']:.1f} | {r['steps']} | "
              f"{r['stopped_by']} | {r['threads']} | {r['nats']:.3f} |")
    ok = all(r["wall"] <= GOAL_SECONDS and r["nats"] <= GOAL_NATS for r in rows)
    print(f"\ngoal (<= {GOAL_SECONDS:.0f} s and <= {GOAL_NATS} nats/char in every run): "
          f"{'met' if ok else 'NOT met'}")
    print("\nloss against wall time, run 1 (seconds since train() started; validation estimate "
          f"on {c.eval_windows} windows, the last row on the whole split):")
    print("| seconds | step | validation (nats/char) |")
    print("|---|---|---|")
    for h in history:
        print(f"| {h.get('seconds', float('nan')):.0f} | {h['step']} | {h['val']:.3f} |")
    print("\nrun 1's output:\n" + rows[0]["stdout"])


if __name__ == "__main__":
    main()
